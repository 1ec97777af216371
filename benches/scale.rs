//! The scale harness: `watermarkd run` (the release binary, as a process) with N autoscalers
//! against a real kube-apiserver holding N Deployments and the local Datadog stand-in, and what
//! it costs: resident memory, CPU per evaluation cycle, Datadog requests per cycle, and the delay
//! from a value crossing a watermark to the scale write.
//!
//!     cargo bench --bench scale                 # 1,000 and 10,000 autoscalers, large budget
//!     cargo bench --bench scale -- 1000 budget  # 1,000 on Datadog's default 1,600 requests/hour
//!     cargo bench --bench scale -- 1000 spread  # 1,000 on 27 requests/minute: a cycle (29
//!                                               # requests) larger than a window
//!     cargo bench --bench scale -- 1000 fold    # 1,000 over 10 query shapes, folded, on the
//!                                               # default 1,600 requests/hour
//!     cargo bench --bench scale -- 10000 fold   # 10,000 over 100 shapes, large budget
//!     cargo bench --bench scale -- 1000 prometheus  # 1,000 over 10 shapes on a real Prometheus
//!     cargo bench --bench scale -- 1000 forecast    # 1,000 over 10 shapes, each with a forecast
//!                                                   # reading its history, on 5,000 requests/hour
//!     cargo bench --bench scale -- 1000 forecast-off  # the same without the forecasts
//!     cargo bench --bench scale -- 10000 listener   # 10,000 folded, the status API and listener
//!                                                   # under the worst requests one can send:
//!                                                   # what they add to the loop and /healthz
//!
//! Without `fold`, every autoscaler's query is a shape of its own (a metric of its own), which
//! no folding can join: the worst case, as every query was sent before folding.
//!
//! A benchmark, not a test: it prints a report (the numbers in BENCHMARKS.md come from it) and
//! fails only when the harness itself cannot run.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark: it prints its measurements and stops at the first failure"
)]

#[path = "../tests/support/fake_datadog.rs"]
mod fake_datadog;
#[path = "../tests/support/kube_cluster.rs"]
mod kube_cluster;
#[path = "../tests/support/prometheus_server.rs"]
mod prometheus_server;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fake_datadog::{Behavior, Budget, FakeDatadog, SeriesSpec};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube_cluster::{KubeCluster, ADMIN_TOKEN};
use serde_json::json;
use tokio::sync::Semaphore;

/// Every autoscaler's interval: the daemon's default.
const INTERVAL: Duration = Duration::from_secs(15);
/// Cycles measured after the warm-up.
const MEASURED_CYCLES: u32 = 4;
/// Autoscalers whose metric crosses the high watermark, one at a time, for the reaction delay.
const CROSSINGS: usize = 5;

/// Autoscaler `i`'s query: with `shapes`, one of that many metrics, per deployment (these
/// fold, one grouped query per shape); without, a metric of its own (nothing folds).
fn query(i: usize, shapes: Option<usize>) -> String {
    match shapes {
        Some(k) => format!("avg:bench.load.s{}{{team:bench,app:web-{i}}}", i % k),
        None => format!("avg:bench.load.q{i}{{app:web-{i}}}"),
    }
}

fn rules(n: usize, namespace: &str, datadog: &str, shapes: Option<usize>, forecast: bool) -> String {
    let mut text = format!(
        "[backend.dd]\ntype = \"datadog\"\nurl = \"{datadog}\"\napi_key_env = \"DD_API_KEY\"\napp_key_env = \"DD_APP_KEY\"\n"
    );
    for i in 0..n {
        text.push_str(&format!(
            "\n[[autoscaler]]\nname = \"web-{i}\"\ntarget = {{ kind = \"Deployment\", namespace = \"{namespace}\", name = \"web-{i}\" }}\n\
             min_replicas = 1\nmax_replicas = 20\nalgorithm = \"absolute\"\n\
             [[autoscaler.metric]]\nbackend = \"dd\"\nquery = \"{}\"\nhigh_watermark = 1000\nlow_watermark = 10\n",
            query(i, shapes)
        ));
        if forecast {
            text.push_str("[autoscaler.forecast]\nlead_time = \"10m\"\n");
        }
    }
    text
}

/// N Deployments with 2 ready replicas each, created 64 at a time over one client.
async fn create_deployments(cluster: &KubeCluster, namespace: &str, n: usize) {
    let client = cluster.client();
    let permits = Arc::new(Semaphore::new(64));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let api: Api<Deployment> = Api::namespaced(client.clone(), namespace);
        let permit = Arc::clone(&permits).acquire_owned().await.expect("semaphore");
        tasks.spawn(async move {
            let _permit = permit;
            let name = format!("web-{i}");
            let object: Deployment = serde_json::from_value(json!({
                "metadata": { "name": name },
                "spec": {
                    "replicas": 2,
                    "selector": { "matchLabels": { "app": name } },
                    "template": {
                        "metadata": { "labels": { "app": name } },
                        "spec": { "containers": [{ "name": "app", "image": "registry.invalid/app:1" }] },
                    },
                },
            }))
            .expect("deployment");
            api.create(&PostParams::default(), &object).await.expect("create deployment");
            let status = json!({ "status": { "replicas": 2, "readyReplicas": 2, "updatedReplicas": 2, "availableReplicas": 2 } });
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(status)).await.expect("status");
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("create task");
    }
}

/// utime + stime of `pid`, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let after = &stat[stat.rfind(')').expect("stat format") + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().expect("utime") + fields[12].parse::<f64>().expect("stime");
    // SAFETY: sysconf takes a constant and touches no memory of ours.
    #[expect(unsafe_code, reason = "std does not expose the clock tick rate /proc/PID/stat counts in")]
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks / hz
}

/// (VmRSS, VmHWM) of `pid`, in MiB.
fn memory_mib(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/PID/status");
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Resident memory by kind of mapping, in MiB, from `/proc/PID/smaps`: the brk heap, other
/// anonymous memory (malloc arenas past the first, thread stacks, large allocations), the
/// daemon's own binary, and everything else (shared libraries, the vDSO).
fn resident_by_mapping(pid: u32) -> String {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let (mut heap, mut anon, mut binary, mut other) = (0.0, 0.0, 0.0, 0.0);
    let mut current = "";
    for line in smaps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.first().is_some_and(|f| f.contains('-') && !f.ends_with(':')) {
            current = match fields.get(5) {
                None => "anon",
                Some(&"[heap]") => "heap",
                Some(path) if path.ends_with("/watermarkd") => "binary",
                Some(path) if path.starts_with("[stack") => "anon",
                Some(_) => "other",
            };
        } else if fields.first() == Some(&"Rss:") {
            let mib = fields.get(1).and_then(|kb| kb.parse::<f64>().ok()).unwrap_or(0.0) / 1024.0;
            match current {
                "heap" => heap += mib,
                "anon" => anon += mib,
                "binary" => binary += mib,
                _ => other += mib,
            }
        }
    }
    format!("heap {heap:.1}, other anonymous {anon:.1}, binary {binary:.1}, libraries {other:.1} MiB")
}

struct Daemon(Child);

impl Drop for Daemon {
    /// SIGTERM first, so that a profiler wrapping the daemon writes its report.
    fn drop(&mut self) {
        // SAFETY: kill takes plain integers and touches no memory of ours; the pid is our child's,
        // not yet reaped, so it cannot have been reused.
        #[expect(unsafe_code, reason = "std's Child can only SIGKILL; a profiler around the daemon needs SIGTERM")]
        unsafe {
            libc::kill(self.0.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The Datadog keys the fake accepts, as the daemon's environment.
fn dd_keys() -> [(&'static str, &'static str); 2] {
    [("DD_API_KEY", fake_datadog::API_KEY), ("DD_APP_KEY", fake_datadog::APP_KEY)]
}

/// Starts the release daemon on `config`, logging to `dir/daemon.log`, its state ConfigMaps in
/// `namespace`. `WATERMARKD_BENCH_WRAPPER="valgrind --tool=massif ..."` runs it under a
/// profiler. Returns its pid and the guard that stops it.
fn start_daemon(
    dir: &std::path::Path,
    config: &std::path::Path,
    kubeconfig: &std::path::Path,
    namespace: &str,
    listen: &str,
    env: &[(&str, &str)],
) -> (u32, Daemon) {
    let log = std::fs::File::create(dir.join("daemon.log")).expect("log");
    let wrapper: Vec<String> = std::env::var("WATERMARKD_BENCH_WRAPPER")
        .map(|w| w.split_whitespace().map(String::from).collect())
        .unwrap_or_default();
    let mut command = match wrapper.split_first() {
        Some((program, args)) => {
            let mut command = Command::new(program);
            command.args(args).arg(env!("CARGO_BIN_EXE_watermarkd"));
            command
        }
        None => Command::new(env!("CARGO_BIN_EXE_watermarkd")),
    };
    let child = command
        .args(["run", "--config", config.to_str().unwrap(), "--kubeconfig", kubeconfig.to_str().unwrap()])
        .args(["--listen", listen, "--settings", "/dev/null", "--no-leader-election", "--log-level", "warn"])
        // The state ConfigMaps go to the daemon's namespace: the benchmark's own.
        .args(["--lease-namespace", namespace])
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("start watermarkd");
    (child.id(), Daemon(child))
}

async fn ready(listen: &str) {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        if let Ok(response) = reqwest::get(format!("http://{listen}/readyz")).await {
            if response.status().is_success() {
                return;
            }
        }
        assert!(Instant::now() < deadline, "the daemon did not become ready");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `watermarkd_evaluations_total` by result.
async fn evaluations(listen: &str) -> std::collections::HashMap<String, f64> {
    let text = reqwest::get(format!("http://{listen}/metrics")).await.expect("metrics").text().await.expect("body");
    text.lines()
        .filter_map(|line| line.strip_prefix("watermarkd_evaluations_total{result=\""))
        .filter_map(|rest| {
            let (result, value) = rest.split_once("\"} ")?;
            Some((result.to_string(), value.parse().ok()?))
        })
        .collect()
}

async fn spec_replicas(api: &Api<Deployment>, name: &str) -> i32 {
    api.get(name).await.ok().and_then(|d| d.spec).and_then(|s| s.replicas).unwrap_or(-1)
}

/// The budget a cycle of 1,000 autoscalers (29 requests) does not fit in: 27 requests a
/// minute, about Datadog's default hourly rate in per-minute windows.
const SPREAD_BUDGET: Budget = Budget { limit: 27, period: Duration::from_secs(60), offset: Duration::ZERO };

/// Over `[from, to]` (the fake's clock): the requests of each calendar window wholly inside it,
/// and the longest any of the `n` autoscalers went without an answer to its query.
fn spread_report(case: &Case, datadog: &FakeDatadog, from: Duration, to: Duration, period: Duration) -> String {
    let n = case.n;
    let log = datadog.log();
    let first = from.as_secs().div_ceil(period.as_secs());
    let last = to.as_secs() / period.as_secs();
    let per_window: Vec<usize> =
        (first..last).map(|w| log.iter().filter(|r| r.window == w && r.status != 429).count()).collect();
    let mut answered: std::collections::HashMap<String, Vec<Duration>> = std::collections::HashMap::new();
    for r in log.iter().filter(|r| r.status == 200 && r.at >= from && r.at <= to) {
        for q in &r.sub_queries {
            for member in fake_datadog::members_answered(q) {
                answered.entry(member).or_default().push(r.at);
            }
        }
    }
    let mut largest = Duration::ZERO;
    for i in 0..n {
        let member = fake_datadog::canonical(&query(i, case.shapes)).expect("a plain query");
        let mut times = answered.get(&member).cloned().unwrap_or_default();
        times.sort();
        let mut previous = from;
        for at in times.into_iter().chain([to]) {
            largest = largest.max(at - previous);
            previous = at;
        }
    }
    format!(
        "requests per whole {}s window: {per_window:?}; largest age of any autoscaler's data: {:.0}s",
        period.as_secs(),
        largest.as_secs_f64()
    )
}

/// One run of the harness.
#[derive(Clone, Copy)]
struct Case {
    n: usize,
    /// The Datadog budget; `None`: one no cycle comes near.
    budget: Option<Budget>,
    /// How many query shapes the autoscalers share (`query`); `None`: each its own.
    shapes: Option<usize>,
    /// Whether every autoscaler has a forecast, which reads 22 days of its metric and of its
    /// past replicas when it starts, from what the live queries leave of the budget.
    forecast: bool,
}

/// In the folding case: autoscalers whose value asks for more replicas (5,000 against a high
/// watermark of 1,000), and those whose member of the grouped query has no data at all.
fn crossing_from_start(i: usize) -> bool {
    i % 10 == 3
}

fn without_data(i: usize) -> bool {
    i % 50 == 7
}

async fn scenario(case: Case) {
    let Case { n, budget, shapes, forecast } = case;
    let label = match budget {
        Some(b) => format!("Datadog budget {} requests per {}s", b.limit, b.period.as_secs()),
        None => "large Datadog budget".to_string(),
    };
    let shaped = match shapes {
        Some(k) => format!("{k} query shapes, folded"),
        None => "every query its own shape".to_string(),
    };
    let forecasts = if forecast { ", each with a forecast" } else { "" };
    println!("\n== {n} autoscalers, interval 15s, {label}, {shaped}{forecasts} ==");
    let cluster = KubeCluster::start().await;
    let namespace = cluster.unique_namespace("bench").await;
    let started = Instant::now();
    create_deployments(&cluster, &namespace, n).await;
    println!("setup: {n} Deployments created in {:.1}s", started.elapsed().as_secs_f64());

    let datadog = match budget {
        Some(budget) => FakeDatadog::with_budget(budget).await,
        None => {
            FakeDatadog::with_budget(Budget {
                limit: 100_000_000,
                period: Duration::from_secs(3600),
                offset: Duration::ZERO,
            })
            .await
        }
    };
    // In the band [10, 1000]: every evaluation holds, so the steady state writes nothing.
    datadog.set_default(Behavior::Series(SeriesSpec::constant(100.0)));
    // Folding: a tenth asks for more replicas from the start, a fiftieth has no data (if that
    // were read as 0, below the low watermark of 10, they would scale down).
    if shapes.is_some() {
        for i in (0..n).filter(|&i| crossing_from_start(i)) {
            datadog.set(&query(i, shapes), Behavior::Series(SeriesSpec::constant(5000.0)));
        }
        for i in (0..n).filter(|&i| without_data(i)) {
            datadog.set(&query(i, shapes), Behavior::NoData);
        }
    }

    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("rules.toml");
    std::fs::write(&config, rules(n, &namespace, &datadog.url, shapes, forecast)).expect("rules");
    let kubeconfig = dir.path().join("kubeconfig");
    cluster.write_kubeconfig(&kubeconfig, ADMIN_TOKEN);
    let listen =
        format!("127.0.0.1:{}", std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port());
    let (pid, _daemon) = start_daemon(dir.path(), &config, &kubeconfig, &namespace, &listen, &dd_keys());
    let start = Instant::now();
    ready(&listen).await;
    let (rss, _) = memory_mib(pid);
    println!("ready after {:.1}s, RSS {rss:.1} MiB", start.elapsed().as_secs_f64());

    // Warm-up: two full cycles.
    tokio::time::sleep(INTERVAL * 2).await;
    let cpu_before = cpu_seconds(pid);
    let requests_before = datadog.requests();
    let evaluations_before = evaluations(&listen).await;
    let measured = Instant::now();
    let measured_from = datadog.started().elapsed();
    // On the default budget a cycle of 29 requests is admitted about every 75 s: measure
    // over several of those.
    let measured_cycles = if budget.is_some() { MEASURED_CYCLES * 4 } else { MEASURED_CYCLES };
    tokio::time::sleep(INTERVAL * measured_cycles).await;
    let wall = measured.elapsed().as_secs_f64();
    let measured_to = datadog.started().elapsed();
    let cpu = cpu_seconds(pid) - cpu_before;
    let requests = datadog.requests() - requests_before;
    let evaluations_after = evaluations(&listen).await;
    let (rss, hwm) = memory_mib(pid);
    let cycles = wall / INTERVAL.as_secs_f64();
    println!("resident memory: {rss:.1} MiB now, {hwm:.1} MiB peak");
    println!("  by mapping: {}", resident_by_mapping(pid));
    println!(
        "CPU: {:.3} core-seconds per 15s cycle ({:.1}% of one core), over {wall:.0}s",
        cpu / cycles,
        100.0 * cpu / wall
    );
    let per_cycle = |result: &str| {
        let after = evaluations_after.get(result).copied().unwrap_or(0.0);
        let before = evaluations_before.get(result).copied().unwrap_or(0.0);
        (after - before) / cycles
    };
    println!(
        "evaluations per cycle: {:.0} held, {:.0} skipped (still running from the previous interval)",
        per_cycle("held"),
        per_cycle("skipped")
    );
    println!(
        "Datadog: {:.1} requests per cycle ({} queries per cycle, at most 35 per request), {} answered 429",
        requests as f64 / cycles,
        n,
        datadog.count_status(429)
    );
    // The large budget's windows are an hour, longer than the measurement: no whole window.
    let period = budget.map_or(Duration::from_secs(3600), |b| b.period);
    println!("{}", spread_report(&case, &datadog, measured_from, measured_to, period));
    if forecast {
        history_report(&datadog, measured_from, measured_to, n);
    }
    if shapes.is_some() {
        folding_report(&cluster, &namespace, n, &listen).await;
        return;
    }

    // Reaction: one autoscaler at a time crosses its high watermark (value 5000 > 1000).
    let api: Api<Deployment> = Api::namespaced(cluster.client(), &namespace);
    let mut delays = Vec::new();
    let crossings = if budget.is_some() { 2 } else { CROSSINGS };
    for k in 0..crossings {
        let i = (k * 7919) % n;
        let name = format!("web-{i}");
        let crossed = Instant::now();
        datadog.set(&query(i, shapes), Behavior::Series(SeriesSpec::constant(5000.0)));
        loop {
            if spec_replicas(&api, &name).await > 2 {
                break;
            }
            assert!(crossed.elapsed() < INTERVAL * 12, "{name} did not scale within 12 intervals");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        delays.push(crossed.elapsed().as_secs_f64());
    }
    delays.sort_by(f64::total_cmp);
    println!(
        "crossing -> scale write: median {:.2}s, max {:.2}s over {crossings} crossings (interval {}s; polled every 20 ms)",
        delays[delays.len() / 2],
        delays[delays.len() - 1],
        INTERVAL.as_secs()
    );
    let log = std::fs::read_to_string(dir.path().join("daemon.log")).unwrap_or_default();
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains(" WARN ") || l.contains(" ERROR ")).collect();
    println!("daemon log: {} warning/error lines", warnings.len());
    for line in warnings.iter().take(3) {
        println!("  {}", line.chars().take(240).collect::<String>());
    }
    if budget.is_some() {
        let metrics =
            reqwest::get(format!("http://{listen}/metrics")).await.expect("metrics").text().await.expect("body");
        let stretched = metrics
            .lines()
            .find(|l| l.starts_with("watermarkd_datadog_stretched_interval_seconds"))
            .unwrap_or("watermarkd_datadog_stretched_interval_seconds (absent)");
        println!("{stretched}; 429 answers in total: {}", datadog.count_status(429));
    }
}

/// 1,000 autoscalers over 10 shapes on the default budget; 10,000 over 100 on a large one.
fn fold_case(n: usize) -> Case {
    let budget = (n <= 1_000).then(Budget::default);
    Case { n, budget, shapes: Some((n / 100).max(1)), forecast: false }
}

/// A budget the folded live queries of 1,000 autoscalers (10 requests per 15 s, 2,400 an
/// hour) use about half of: the rest is what forecasts may read their history from.
const FORECAST_BUDGET: Budget = Budget { limit: 5_000, period: Duration::from_secs(3600), offset: Duration::ZERO };

/// The forecast case: N autoscalers over N/100 folded shapes on `FORECAST_BUDGET`, with or
/// without a forecast each.
fn forecast_case(n: usize, forecast: bool) -> Case {
    Case { n, budget: Some(FORECAST_BUDGET), shapes: Some((n / 100).max(1)), forecast }
}

/// The history requests (a day per request) among the measured ones, their rate, and how long
/// the whole history of `n` forecasts (22 days of the metric and of the past replicas each)
/// takes at that rate.
fn history_report(datadog: &FakeDatadog, from: Duration, to: Duration, n: usize) {
    let log = datadog.log();
    let measured = log.iter().filter(|r| r.at >= from && r.at <= to && r.status != 429);
    let (history, live): (Vec<_>, Vec<_>) =
        measured.partition(|r| matches!((r.from, r.to), (Some(f), Some(t)) if t - f > 3_600));
    let hours = (to - from).as_secs_f64() / 3600.0;
    let per_hour = history.len() as f64 / hours;
    let needed = n as f64 * 2.0 * 23.0;
    println!(
        "forecast history: {} requests ({per_hour:.0} an hour) beside {} live ({:.0} an hour); \
         all {n} histories ({needed:.0} requests) at that rate: {:.1} h",
        history.len(),
        live.len(),
        live.len() as f64 / hours,
        needed / per_hour.max(1e-9)
    );
}

/// After the measured cycles of the folding case: every autoscaler at the replicas its own
/// value asks for, and none without data moved.
async fn folding_report(cluster: &KubeCluster, namespace: &str, n: usize, listen: &str) {
    let api: Api<Deployment> = Api::namespaced(cluster.client(), namespace);
    let (mut up, mut held, mut wrong) = (0, 0, Vec::new());
    for i in 0..n {
        let replicas = spec_replicas(&api, &format!("web-{i}")).await;
        let right = if crossing_from_start(i) { replicas > 2 } else { replicas == 2 };
        match (right, crossing_from_start(i)) {
            (true, true) => up += 1,
            (true, false) => held += 1,
            (false, _) => wrong.push((i, replicas)),
        }
    }
    let no_data = (0..n).filter(|&i| without_data(i)).count();
    println!(
        "replicas: {up} scaled up on their own value (5,000), {held} held at 2 ({no_data} of them without data); \
         wrong: {wrong:?}"
    );
    let metrics = reqwest::get(format!("http://{listen}/metrics")).await.expect("metrics").text().await.expect("body");
    for line in metrics.lines().filter(|l| l.starts_with("watermarkd_query_plan_")) {
        if !line.contains("_bucket") {
            println!("  {line}");
        }
    }
}

/// Autoscaler `i`'s PromQL query: one of `shapes` metrics, per deployment (they fold).
fn promql(i: usize, shapes: usize) -> String {
    format!("sum(bench_load_s{}{{app=\"web-{i}\"}})", i % shapes)
}

/// The exporter's text: each autoscaler's series, 5,000 for the ones crossing from the start,
/// none at all for those without data, 100 for the rest.
fn exposition(n: usize, shapes: usize) -> String {
    let mut text = String::new();
    for i in (0..n).filter(|&i| !without_data(i)) {
        let value = if crossing_from_start(i) { 5000 } else { 100 };
        text.push_str(&format!("bench_load_s{}{{app=\"web-{i}\"}} {value}\n", i % shapes));
    }
    text
}

/// Requests Prometheus has answered on its instant-query endpoint, from its own /metrics.
async fn prometheus_queries(prometheus: &prometheus_server::PrometheusServer) -> f64 {
    let text = reqwest::get(format!("{}/metrics", prometheus.root_url()))
        .await
        .expect("prometheus metrics")
        .text()
        .await
        .expect("body");
    text.lines()
        .filter(|l| l.starts_with("prometheus_http_requests_total{") && l.contains("handler=\"/api/v1/query\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The folding case on a real Prometheus: `n` autoscalers over `shapes` metrics. Prometheus
/// has no shared budget, so each autoscaler keeps its own phase in the interval and only the
/// queries due in the same second fold together.
async fn prometheus_scenario(n: usize, shapes: usize) {
    println!("\n== {n} autoscalers, interval 15s, a real Prometheus, {shapes} query shapes, folded ==");
    let cluster = KubeCluster::start().await;
    let namespace = cluster.unique_namespace("bench").await;
    create_deployments(&cluster, &namespace, n).await;
    let exporter = prometheus_server::Exporter::start(&exposition(n, shapes)).await;
    let prometheus = prometheus_server::PrometheusServer::start(&exporter.target()).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("rules.toml");
    let mut rules = format!("[backend.prom]\ntype = \"prometheus\"\nurl = \"{}\"\n", prometheus.url());
    for i in 0..n {
        rules.push_str(&format!(
            "\n[[autoscaler]]\nname = \"web-{i}\"\ntarget = {{ kind = \"Deployment\", namespace = \"{namespace}\", name = \"web-{i}\" }}\n\
             min_replicas = 1\nmax_replicas = 20\nalgorithm = \"absolute\"\n\
             [[autoscaler.metric]]\nbackend = \"prom\"\nquery = '{}'\nhigh_watermark = 1000\nlow_watermark = 10\n",
            promql(i, shapes)
        ));
    }
    std::fs::write(&config, rules).expect("rules");
    let kubeconfig = dir.path().join("kubeconfig");
    cluster.write_kubeconfig(&kubeconfig, ADMIN_TOKEN);
    let listen =
        format!("127.0.0.1:{}", std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port());
    let (pid, _daemon) = start_daemon(dir.path(), &config, &kubeconfig, &namespace, &listen, &[]);
    ready(&listen).await;
    tokio::time::sleep(INTERVAL * 2).await;
    let cpu_before = cpu_seconds(pid);
    let queries_before = prometheus_queries(&prometheus).await;
    let measured = Instant::now();
    tokio::time::sleep(INTERVAL * MEASURED_CYCLES).await;
    let cycles = measured.elapsed().as_secs_f64() / INTERVAL.as_secs_f64();
    let cpu = cpu_seconds(pid) - cpu_before;
    let queries = prometheus_queries(&prometheus).await - queries_before;
    let (rss, hwm) = memory_mib(pid);
    println!("resident memory: {rss:.1} MiB now, {hwm:.1} MiB peak");
    println!("CPU: {:.3} core-seconds per 15s cycle", cpu / cycles);
    println!(
        "Prometheus: {:.1} instant queries per 15 s ({n} autoscaler queries; one request each without folding)",
        queries / cycles
    );
    folding_report(&cluster, &namespace, n, &listen).await;
}

/// A histogram's buckets as (upper bound, cumulative count), from the exposition text.
fn buckets(metrics: &str, family: &str) -> Vec<(f64, f64)> {
    let prefix = format!("{family}_bucket{{");
    metrics
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let bound = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            Some((bound, l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect()
}

/// Between two readings of a histogram: how many, and the bucket bounds under which 99% and all
/// of them fell.
fn bucket_report(before: &[(f64, f64)], after: &[(f64, f64)]) -> String {
    let counts: Vec<(f64, f64)> = after
        .iter()
        .map(|(bound, count)| (*bound, count - before.iter().find(|(b, _)| b == bound).map_or(0.0, |(_, c)| *c)))
        .collect();
    let total = counts.last().map_or(0.0, |(_, c)| *c);
    let under = |share: f64| {
        counts.iter().find(|(_, c)| *c >= share * total).map_or("-".to_string(), |(b, _)| {
            if b.is_finite() {
                format!("<= {:.0} ms", b * 1000.0)
            } else {
                "above the largest bucket".to_string()
            }
        })
    };
    format!("{total:.0} observed, p99 {}, all {}", under(0.99), under(1.0))
}

/// `/healthz` asked every 100 ms over a fresh connection from `from` until `stop`: each
/// answer's time (a refusal or timeout counts as 2 s, a kubelet's default probe timeout).
async fn probe_healthz(address: std::net::SocketAddr, from: &'static str, stop: Instant) -> Vec<Duration> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut times = Vec::new();
    while Instant::now() < stop {
        let started = Instant::now();
        let asked = tokio::time::timeout(Duration::from_secs(2), async {
            let socket = tokio::net::TcpSocket::new_v4().ok()?;
            socket.bind(format!("{from}:0").parse().ok()?).ok()?;
            let mut stream = socket.connect(address).await.ok()?;
            stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").await.ok()?;
            let mut answer = Vec::new();
            stream.read_to_end(&mut answer).await.ok()?;
            answer.starts_with(b"HTTP/1.1 200").then_some(())
        })
        .await;
        times.push(if matches!(asked, Ok(Some(()))) { started.elapsed() } else { Duration::from_secs(2) });
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    times
}

fn time_report(mut times: Vec<Duration>) -> String {
    times.sort();
    let at = |share: f64| times.get(((times.len() as f64 - 1.0) * share) as usize).copied().unwrap_or_default();
    format!(
        "{} probes, median {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        times.len(),
        at(0.5).as_secs_f64() * 1000.0,
        at(0.99).as_secs_f64() * 1000.0,
        at(1.0).as_secs_f64() * 1000.0
    )
}

/// The worst requests the status API and the listener take, sent without pause from several
/// clients: the largest search allowed over the most rows, the whole table by id, the page of
/// 1,000 rows, one autoscaler in full, the refused 64 KB search; and idle sockets up to the cap.
async fn attack(address: std::net::SocketAddr, stop: Instant) -> usize {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let words = ["webzzzzzzzzzzzzzzzzzzzzz"; 8].join("+");
    let huge = vec!["w"; 32_000].join("+");
    let paths = [
        format!("/api/v1/autoscalers?q={words}&limit=1000"),
        "/api/v1/autoscalers?limit=1000&sort=id".to_string(),
        "/ui?limit=1000".to_string(),
        "/ui/table?limit=1000&q=web".to_string(),
        "/api/v1/autoscalers/file%2Fweb-7".to_string(),
        "/api/v1/backends".to_string(),
        format!("/api/v1/autoscalers?q={huge}"),
    ];
    let mut tasks = tokio::task::JoinSet::new();
    // Idle sockets from one peer, reopened as the daemon closes them.
    tasks.spawn(async move {
        let mut held = Vec::new();
        while Instant::now() < stop {
            held.retain(|s: &tokio::net::TcpStream| s.peer_addr().is_ok());
            while held.len() < 200 {
                let Ok(socket) = tokio::net::TcpSocket::new_v4() else { break };
                if socket.bind("127.0.0.9:0".parse().unwrap()).is_err() {
                    break;
                }
                match socket.connect(address).await {
                    Ok(stream) => held.push(stream),
                    Err(_) => break,
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        0
    });
    for client in 0..4 {
        let paths = paths.clone();
        tasks.spawn(async move {
            let mut answered = 0;
            let from = format!("127.0.1.{}:0", client + 1);
            while Instant::now() < stop {
                for path in &paths {
                    let Ok(socket) = tokio::net::TcpSocket::new_v4() else { continue };
                    if socket.bind(from.parse().unwrap()).is_err() {
                        continue;
                    }
                    let Ok(mut stream) = socket.connect(address).await else { continue };
                    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
                    if stream.write_all(request.as_bytes()).await.is_ok() {
                        let mut sink = Vec::new();
                        let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut sink)).await;
                        answered += usize::from(!sink.is_empty());
                    }
                }
            }
            answered
        });
    }
    let mut answered = 0;
    while let Some(done) = tasks.join_next().await {
        answered += done.unwrap_or(0);
    }
    answered
}

/// N autoscalers over N/100 folded shapes, the status service open: `/healthz` and the loop's
/// lateness for a minute undisturbed, then for a minute under `attack`.
async fn listener_scenario(n: usize) {
    const PHASE: Duration = Duration::from_secs(60);
    println!("\n== {n} autoscalers, interval 15s, folded, the status API and listener under the worst requests ==");
    let cluster = KubeCluster::start().await;
    let namespace = cluster.unique_namespace("bench").await;
    create_deployments(&cluster, &namespace, n).await;
    let datadog = FakeDatadog::with_budget(Budget {
        limit: 100_000_000,
        period: Duration::from_secs(3600),
        offset: Duration::ZERO,
    })
    .await;
    datadog.set_default(Behavior::Series(SeriesSpec::constant(100.0)));
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("rules.toml");
    std::fs::write(&config, rules(n, &namespace, &datadog.url, Some((n / 100).max(1)), false)).expect("rules");
    let kubeconfig = dir.path().join("kubeconfig");
    cluster.write_kubeconfig(&kubeconfig, ADMIN_TOKEN);
    let listen =
        format!("127.0.0.1:{}", std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port());
    let (pid, _daemon) = start_daemon(dir.path(), &config, &kubeconfig, &namespace, &listen, &dd_keys());
    ready(&listen).await;
    tokio::time::sleep(INTERVAL * 2).await;
    let address: std::net::SocketAddr = listen.parse().unwrap();
    let metrics = || async {
        reqwest::get(format!("http://{listen}/metrics")).await.expect("metrics").text().await.expect("body")
    };
    for attacked in [false, true] {
        let before = metrics().await;
        let cpu_before = cpu_seconds(pid);
        let stop = Instant::now() + PHASE;
        let probes = tokio::spawn(probe_healthz(address, "127.0.0.3", stop));
        let answered = if attacked { attack(address, stop).await } else { 0 };
        let times = probes.await.expect("probes");
        let after = metrics().await;
        let cpu = cpu_seconds(pid) - cpu_before;
        println!("{}:", if attacked { "under the worst requests" } else { "undisturbed" });
        if attacked {
            println!("  status requests answered: {answered} in {}s", PHASE.as_secs());
        }
        println!("  /healthz: {}", time_report(times));
        for family in ["watermarkd_loop_lateness_seconds", "watermarkd_evaluation_duration_seconds"] {
            println!("  {family}: {}", bucket_report(&buckets(&before, family), &buckets(&after, family)));
        }
        let (rss, hwm) = memory_mib(pid);
        println!("  daemon CPU {:.2} cores; resident {rss:.1} MiB, peak {hwm:.1} MiB", cpu / PHASE.as_secs_f64());
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    watermarkd::adapters::backend::ensure_crypto_provider();
    runtime.block_on(async {
        match args.first().map(String::as_str) {
            Some(n) => {
                let n: usize = n.parse().expect("the number of autoscalers");
                let case = match args.get(1).map(String::as_str) {
                    Some("budget") => Case { n, budget: Some(Budget::default()), shapes: None, forecast: false },
                    Some("spread") => Case { n, budget: Some(SPREAD_BUDGET), shapes: None, forecast: false },
                    Some("fold") => fold_case(n),
                    Some("forecast") => forecast_case(n, true),
                    Some("forecast-off") => forecast_case(n, false),
                    Some("prometheus") => return prometheus_scenario(n, (n / 100).max(1)).await,
                    Some("listener") => return listener_scenario(n).await,
                    _ => Case { n, budget: None, shapes: None, forecast: false },
                };
                scenario(case).await;
            }
            None => {
                scenario(Case { n: 1_000, budget: None, shapes: None, forecast: false }).await;
                scenario(Case { n: 10_000, budget: None, shapes: None, forecast: false }).await;
                scenario(Case { n: 1_000, budget: Some(Budget::default()), shapes: None, forecast: false }).await;
                scenario(Case { n: 1_000, budget: Some(SPREAD_BUDGET), shapes: None, forecast: false }).await;
                scenario(fold_case(1_000)).await;
                scenario(fold_case(10_000)).await;
                scenario(forecast_case(1_000, true)).await;
                prometheus_scenario(1_000, 10).await;
            }
        }
    });
}
