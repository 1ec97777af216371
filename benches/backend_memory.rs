//! What large answers cost in memory: the peak resident memory of `watermarkd query` (the
//! release binary, as a process, measured by `/usr/bin/time -f %M`) against a local server
//! that answers every query with a valid body of a chosen size, under the 16 MiB body cap:
//!
//! - Datadog, one query, one series whose `pointlist` fills 1 KiB, 1 MiB or 15 MiB;
//! - Datadog, four and five queries that do not batch (each URL is over half of the 7,000
//!   characters a request may have) and do not fold (one metric each), 15 MiB each (a client's
//!   first request goes alone, so five put four in flight at once, the default `max_in_flight`);
//! - Prometheus, eight `sum by (pod)` queries with `reducer = "sum"` (which do not fold),
//!   answered with a 15 MiB vector of about 170,000 series each.
//!
//! Run it so:
//!
//!     cargo bench --bench backend_memory                 # every case
//!     cargo bench --bench backend_memory -- prometheus   # the cases whose name holds a word
//!     WATERMARKD_BIN=/path/to/watermarkd cargo bench --bench backend_memory  # another build
//!
//! Each case runs three times; the report gives the median peak, the most requests the server
//! was answering at once, and how many autoscalers got a value (all of them, or the run is
//! not measuring what it says). A benchmark, not a test: it prints a report (BENCHMARKS.md
//! quotes it) and fails only when the harness itself cannot run.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark: it prints its measurements and stops at the first failure"
)]

use std::convert::Infallible;
use std::fmt::Write as _;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;
/// How long the server holds each answer before sending it, so that the requests a client
/// sends together are seen together.
const HOLD: Duration = Duration::from_millis(300);
const RUNS: usize = 3;
/// Each backend's request timeout: long enough that every answer is read and parsed on a
/// loaded machine (a timed-out request drops its answer early, and would measure less).
const TIMEOUT: &str = "60s";

/// Unix milliseconds now.
fn now_ms() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()
}

/// A Datadog v1 answer of about `size` bytes: one series (`query_index` 0) whose points span
/// the last five minutes, one second apart in the answer's own terms but as many as it takes.
fn datadog_body(size: usize) -> Bytes {
    let to = now_ms() - 1_000;
    let head = format!(
        r#"{{"status":"ok","res_type":"time_series","from_date":{},"to_date":{to},"query":"bench","series":[{{"metric":"bench.mem","display_name":"bench.mem","query_index":0,"interval":1,"scope":"service:bench","tag_set":[],"expression":"avg:bench.mem{{service:bench}}","unit":null,"pointlist":["#,
        to - 300_000
    );
    let tail = "]}]}";
    // `[1700000000000.0,123.456],` is 26 bytes.
    let points = (size.saturating_sub(head.len() + tail.len()) / 26).max(2);
    // Evenly over the five minutes, the last one a second before `to`.
    let step = 299_000.0 / points as f64;
    let last = (to - 1_000) as f64;
    let mut body = String::with_capacity(size + 64);
    body.push_str(&head);
    for i in 0..points {
        if i > 0 {
            body.push(',');
        }
        let at = last - (points - 1 - i) as f64 * step;
        let _ = write!(body, "[{at:.1},{:.3}]", 100.0 + (i % 1000) as f64 / 7.0);
    }
    body.push_str(tail);
    Bytes::from(body)
}

/// A Prometheus instant-vector answer of about `size` bytes: one series per pod.
fn prometheus_body(size: usize) -> Bytes {
    let at = now_ms() as f64 / 1000.0 - 1.0;
    let head = r#"{"status":"success","data":{"resultType":"vector","result":["#;
    let tail = "]}}";
    let mut body = String::with_capacity(size + 256);
    body.push_str(head);
    let mut pod = 0usize;
    while body.len() + tail.len() + 100 < size {
        if pod > 0 {
            body.push(',');
        }
        let _ = write!(
            body,
            r#"{{"metric":{{"namespace":"bench","pod":"bench-web-{pod:07}"}},"value":[{at:.3},"{}.25"]}}"#,
            pod % 97
        );
        pod += 1;
    }
    body.push_str(tail);
    Bytes::from(body)
}

/// A server answering every request with `body` after [`HOLD`], counting how many it is
/// answering at once. Dropped with the runtime.
struct BodyServer {
    url: String,
    in_flight: Arc<AtomicUsize>,
    most_in_flight: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
}

impl BodyServer {
    async fn start(body: Bytes) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let in_flight = Arc::new(AtomicUsize::new(0));
        let most_in_flight = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let counters = (Arc::clone(&in_flight), Arc::clone(&most_in_flight), Arc::clone(&requests));
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let (body, counters) = (body.clone(), counters.clone());
                tokio::spawn(async move {
                    let service = service_fn(move |_request: Request<Incoming>| {
                        let (body, (in_flight, most, requests)) = (body.clone(), counters.clone());
                        async move {
                            requests.fetch_add(1, Ordering::SeqCst);
                            let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(now, Ordering::SeqCst);
                            tokio::time::sleep(HOLD).await;
                            in_flight.fetch_sub(1, Ordering::SeqCst);
                            let response = Response::builder()
                                .header("content-type", "application/json")
                                .body(Full::new(body))
                                .unwrap();
                            Ok::<_, Infallible>(response)
                        }
                    });
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                });
            }
        });
        BodyServer { url, in_flight, most_in_flight, requests }
    }

    fn reset(&self) {
        self.in_flight.store(0, Ordering::SeqCst);
        self.most_in_flight.store(0, Ordering::SeqCst);
        self.requests.store(0, Ordering::SeqCst);
    }
}

fn autoscaler(text: &mut String, name: &str, backend: &str, query: &str, reducer: Option<&str>) {
    let _ = write!(
        text,
        "\n[[autoscaler]]\nname = \"{name}\"\ntarget = {{ kind = \"Deployment\", namespace = \"bench\", name = \"{name}\" }}\n\
         max_replicas = 10\n[[autoscaler.metric]]\nname = \"load\"\nbackend = \"{backend}\"\nquery = '{query}'\n\
         high_watermark = 1000000\n"
    );
    if let Some(reducer) = reducer {
        let _ = writeln!(text, "reducer = \"{reducer}\"");
    }
}

/// `queries` Datadog autoscalers, each a metric of its own with a 3,600-character tag value:
/// no two share a request or a shape.
fn datadog_rules(url: &str, queries: usize) -> String {
    let mut text = format!(
        "[backend.dd]\ntype = \"datadog\"\nurl = \"{url}\"\napi_key_env = \"BENCH_DD_API_KEY\"\n\
         app_key_env = \"BENCH_DD_APP_KEY\"\ntimeout = \"{TIMEOUT}\"\n"
    );
    for i in 0..queries {
        let query = format!("avg:bench.mem.q{i}{{service:{}}}", "a".repeat(3_600));
        autoscaler(&mut text, &format!("dd-{i}"), "dd", &query, None);
    }
    text
}

/// `queries` Prometheus autoscalers, each summing the pods of a metric of its own.
fn prometheus_rules(url: &str, queries: usize) -> String {
    let mut text = format!("[backend.prom]\ntype = \"prometheus\"\nurl = \"{url}\"\ntimeout = \"{TIMEOUT}\"\n");
    for i in 0..queries {
        let query = format!("sum by (pod) (bench_mem_q{i}{{namespace=\"bench\"}})");
        autoscaler(&mut text, &format!("prom-{i}"), "prom", &query, Some("sum"));
    }
    text
}

struct Case {
    name: &'static str,
    prometheus: bool,
    queries: usize,
    body_bytes: usize,
}

const CASES: &[Case] = &[
    Case { name: "datadog 1 query, 1 KiB", prometheus: false, queries: 1, body_bytes: KIB },
    Case { name: "datadog 1 query, 1 MiB", prometheus: false, queries: 1, body_bytes: MIB },
    Case { name: "datadog 1 query, 15 MiB", prometheus: false, queries: 1, body_bytes: 15 * MIB },
    Case { name: "datadog 4 queries, 15 MiB each", prometheus: false, queries: 4, body_bytes: 15 * MIB },
    // The first request of a Datadog client goes alone (it learns the rate budget): with five,
    // four (the default `max_in_flight`) are in flight together after it.
    Case { name: "datadog 5 queries, 15 MiB each", prometheus: false, queries: 5, body_bytes: 15 * MIB },
    Case { name: "prometheus 8 queries, 15 MiB each", prometheus: true, queries: 8, body_bytes: 15 * MIB },
];

/// One run: the peak resident memory in KiB, the wall time, and how many autoscalers got a
/// value.
fn run_query(binary: &str, config: &std::path::Path) -> (u64, Duration, usize, String) {
    let started = Instant::now();
    let out = Command::new("/usr/bin/time")
        .args(["-f", "maxrss_kib=%M", binary, "query", "--config", config.to_str().unwrap()])
        .env("BENCH_DD_API_KEY", "bench-api-key")
        .env("BENCH_DD_APP_KEY", "bench-app-key")
        .output()
        .expect("run /usr/bin/time watermarkd query");
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let peak = stderr
        .lines()
        .rev()
        .find_map(|line| line.strip_prefix("maxrss_kib="))
        .and_then(|kib| kib.trim().parse().ok())
        .unwrap_or_else(|| panic!("no peak in:\n{stderr}"));
    let values = stdout.lines().filter(|line| line.trim_start().starts_with("value ")).count();
    (peak, took, values, stdout)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let words: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let binary = std::env::var("WATERMARKD_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_watermarkd").to_string());
    println!("binary: {binary}");
    println!("{:<36} {:>12} {:>10} {:>10} {:>8}", "case", "peak RSS", "in flight", "values", "time");
    let dir = tempfile::tempdir().unwrap();
    for case in CASES.iter().filter(|c| words.is_empty() || words.iter().any(|w| c.name.contains(w.as_str()))) {
        let body = if case.prometheus { prometheus_body(case.body_bytes) } else { datadog_body(case.body_bytes) };
        let body_len = body.len();
        let server = BodyServer::start(body).await;
        let rules = if case.prometheus {
            prometheus_rules(&server.url, case.queries)
        } else {
            datadog_rules(&server.url, case.queries)
        };
        let config = dir.path().join("rules.toml");
        std::fs::write(&config, rules).unwrap();
        let mut runs = Vec::new();
        for _ in 0..RUNS {
            server.reset();
            let (binary, config) = (binary.clone(), config.clone());
            let (peak, took, values, stdout) =
                tokio::task::spawn_blocking(move || run_query(&binary, &config)).await.unwrap();
            assert_eq!(values, case.queries, "not every autoscaler got a value:\n{stdout}");
            runs.push((peak, took, server.most_in_flight.load(Ordering::SeqCst)));
        }
        runs.sort_by_key(|(peak, _, _)| *peak);
        let (peak, took, in_flight) = runs[RUNS / 2];
        println!(
            "{:<36} {:>9.1} MB {:>10} {:>10} {:>7.2}s   (bodies of {} bytes; runs {:?} kB)",
            case.name,
            peak as f64 * 1024.0 / 1e6,
            in_flight,
            format!("{}/{}", case.queries, case.queries),
            took.as_secs_f64(),
            body_len,
            runs.iter().map(|(p, _, _)| *p).collect::<Vec<_>>(),
        );
    }
}
