//! What the status surfaces say must be true, and asking them must cost the daemon nothing it
//! needs: against a running daemon, a real kube-apiserver and a real Prometheus.
//!
//! - An `average` rule's history and chart are the quantity its band is compared with (per
//!   ready replica), not the total; the first scale after the start is a scale event.
//! - A search that would cost autoscalers × words is refused before any work is done for it.
//! - With every connection slot held, the probes and the scrape still answer (from the
//!   reserve), the status pages say the listener is full, and one peer cannot hold more than
//!   its share.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "test code: clippy.toml lets #[test] functions unwrap, index and print, and the helpers beside them do the same"
)]

#[macro_use]
#[path = "support/eventually.rs"]
mod eventually;
#[path = "support/daemon_process.rs"]
mod daemon_process;
#[path = "support/kube_cluster.rs"]
mod kube_cluster;
#[path = "support/prometheus_server.rs"]
mod prometheus_server;

#[path = "support/raw_http.rs"]
mod raw_http;

use std::net::SocketAddr;
use std::time::Duration;

use daemon_process::{write, DaemonProcess};
use kube_cluster::{KubeCluster, ADMIN_TOKEN};
use prometheus_server::{Exporter, PrometheusServer};
use raw_http::{ask, connect_from};
use serde_json::Value;
use tokio::net::TcpStream;

const STARTUP: Duration = Duration::from_secs(30);

/// A Deployment `queue` with 2 ready replicas (that stay 2: no controller here) and an
/// `average` rule on a queue depth of 120: 60 per ready replica against [20, 50].
struct Setup {
    _exporter: Exporter,
    _prometheus: PrometheusServer,
    dir: tempfile::TempDir,
    ns: String,
}

impl Setup {
    async fn start(prefix: &str) -> Setup {
        let cluster = KubeCluster::shared();
        let ns = cluster.unique_namespace(prefix).await;
        cluster.create_deployment(&ns, "queue", 2).await;
        cluster.set_workload_status("Deployment", &ns, "queue", 2, 2).await;
        let exporter = Exporter::start("queue_depth 120\n").await;
        let prometheus = PrometheusServer::start(&exporter.target()).await;
        // Scraped before the daemon starts, so that its first evaluation has the value.
        let query = format!("{}/api/v1/query?query=queue_depth", prometheus.url());
        eventually!(
            STARTUP,
            "Prometheus has scraped queue_depth",
            async {
                let body =
                    reqwest::get(&query).await.map_err(|e| e.to_string())?.text().await.map_err(|e| e.to_string())?;
                if body.contains("\"120\"") {
                    Ok(())
                } else {
                    Err(body)
                }
            }
            .await
        );
        let dir = tempfile::tempdir().unwrap();
        let rules = format!(
            "[backend.prom]\ntype = \"prometheus\"\nurl = \"{}\"\n\n[[autoscaler]]\nname = \"queue\"\n\
             target = {{ kind = \"Deployment\", namespace = \"{ns}\", name = \"queue\" }}\n\
             interval = \"1s\"\nmin_replicas = 1\nmax_replicas = 6\nalgorithm = \"average\"\n\
             upscale_forbidden_window = \"1s\"\ndownscale_forbidden_window = \"1h\"\n\
             [[autoscaler.metric]]\nname = \"queue_depth\"\nbackend = \"prom\"\nquery = 'queue_depth'\n\
             high_watermark = 50\nlow_watermark = 20\n",
            prometheus.url()
        );
        write(&dir.path().join("rules.toml"), &rules);
        cluster.write_kubeconfig(&dir.path().join("kubeconfig"), ADMIN_TOKEN);
        Setup { _exporter: exporter, _prometheus: prometheus, dir, ns }
    }

    fn daemon(&self, env: &[(&str, &str)]) -> DaemonProcess {
        let path = |name: &str| self.dir.path().join(name).display().to_string();
        let (rules, kubeconfig) = (path("rules.toml"), path("kubeconfig"));
        let args = ["--config", &rules, "--kubeconfig", &kubeconfig, "--lease-namespace", &self.ns];
        DaemonProcess::start(&args, env)
    }
}

async fn json(listen: &str, path: &str) -> Result<Value, String> {
    let answer = reqwest::get(format!("http://{listen}{path}")).await.map_err(|e| format!("GET {path}: {e}"))?;
    let status = answer.status().as_u16();
    let body = answer.text().await.map_err(|e| format!("GET {path}: {e}"))?;
    if status != 200 {
        return Err(format!("{status}: {body}"));
    }
    serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))
}

async fn get(listen: &str, path: &str) -> (u16, String) {
    let answer = reqwest::get(format!("http://{listen}{path}")).await.unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let status = answer.status().as_u16();
    (status, answer.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_average_rule_is_shown_per_replica_and_the_first_scale_is_an_event() {
    let setup = Setup::start("status-average").await;
    let daemon = setup.daemon(&[]);
    let listen = daemon.listen.clone();
    let detail = eventually!(
        STARTUP,
        "queue evaluated twice and scaled",
        async {
            let detail = json(&listen, "/api/v1/autoscalers/file/queue").await?;
            let scaled = detail["history"]["events"].as_array().is_some_and(|e| !e.is_empty());
            if detail["history"]["samples"].as_array().is_some_and(|s| s.len() >= 2) && scaled {
                Ok(detail)
            } else {
                Err(detail.to_string())
            }
        }
        .await
    );
    // The band is per replica, so what is drawn against it is too: 120 over 2 ready is 60.
    assert_eq!(detail["history"]["compared"], "per_replica", "{detail}");
    let samples = detail["history"]["samples"].as_array().unwrap();
    assert_eq!(samples[0]["values"][0], 60.0, "{detail}");
    assert!(samples.iter().all(|s| s["values"][0] != 120.0), "a total drawn against a per-replica band: {detail}");
    assert_eq!(detail["last"]["compared"], "per_replica", "{detail}");
    // The first evaluation scaled 2 up: that is the first scale event, not lost for want of
    // a sample before it.
    let events = detail["history"]["events"].as_array().unwrap();
    assert_eq!(events.first().map(|e| e["from"].clone()), Some(2.into()), "{detail}");
    let page = get(&listen, "/ui/autoscaler/file/queue").await.1;
    // The page's chart says what it draws: the value per ready replica, against the band.
    assert!(page.contains("Each metric per ready replica against its watermarks and hold band"), "{page}");
    assert!(page.contains("per ready replica (average: the total ÷ the ready replicas)"), "{page}");
    // The log line says the same quantity, and which it is.
    let log = daemon.log();
    assert!(log.contains("queue_depth per replica=60 (120 over 2 ready) band [20, 50]"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_that_would_cost_the_daemon_is_refused_before_any_work() {
    let setup = Setup::start("status-search").await;
    let daemon = setup.daemon(&[]);
    let listen = daemon.listen.clone();
    eventually!(STARTUP, "the status API answers", json(&listen, "/api/v1/autoscalers").await);
    // The review's request: 32,000 words in a 64 KB query, which used to hold the board's lock
    // for seconds on the daemon's only thread.
    let words = vec!["w"; 32_000].join("+");
    for path in ["/api/v1/autoscalers", "/ui/table", "/ui"] {
        let (status, body) = get(&listen, &format!("{path}?q={words}")).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert!(body.contains("at most 200"), "{path}: {body}");
    }
    let nine = get(&listen, "/api/v1/autoscalers?q=a+b+c+d+e+f+g+h+i").await;
    assert_eq!(nine.0, 400, "{}", nine.1);
    assert!(nine.1.contains("9 words; at most 8"), "{}", nine.1);
    let eight = json(&listen, "/api/v1/autoscalers?q=q+u+e+u+e+QUEUE+file+deployment").await.unwrap();
    assert_eq!(eight["matched"], 1, "eight words, in any case, still search: {eight}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_slot_held_the_probes_still_answer_and_the_pages_say_the_listener_is_full() {
    let setup = Setup::start("status-full").await;
    let daemon = setup
        .daemon(&[("WATERMARKD__LISTEN_MAX_CONNECTIONS", "2"), ("WATERMARKD__LISTEN_MAX_CONNECTIONS_PER_PEER", "2")]);
    let address: SocketAddr = daemon.listen.parse().unwrap();
    // Waited for with requests the daemon closes itself, so that none of the test's own
    // connections still holds a slot when the client below takes them.
    eventually!(
        STARTUP,
        "the status API answers",
        async {
            // Not listening yet is waited out too.
            let stream = TcpStream::connect(address).await.map_err(|e| e.to_string())?;
            let answer = ask(stream, "/api/v1/autoscalers").await;
            if answer.starts_with("HTTP/1.1 200") {
                Ok(())
            } else {
                Err(answer)
            }
        }
        .await
    );
    // One client takes both general slots and sends nothing.
    let _held = [connect_from("127.0.0.2", address).await, connect_from("127.0.0.2", address).await];
    let third = ask(connect_from("127.0.0.2", address).await, "/healthz").await;
    assert_eq!(third, "", "a peer past its share is closed unanswered");
    // A kubelet and a scraper still get in.
    let health = ask(connect_from("127.0.0.3", address).await, "/healthz").await;
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let metrics = ask(connect_from("127.0.0.4", address).await, "/metrics").await;
    assert!(
        metrics.starts_with("HTTP/1.1 200") && metrics.contains("watermarkd_config_last_reload_successful"),
        "{metrics}"
    );
    // The status pages are not for the reserve: they say why, and when to come back.
    // (Once the test's own earlier connections are closed: until the daemon sees them close, a
    // general slot may still be free.)
    let page = eventually!(
        STARTUP,
        "the status page says the listener is full",
        async {
            let page = ask(connect_from("127.0.0.5", address).await, "/ui").await;
            if page.starts_with("HTTP/1.1 503") {
                Ok(page)
            } else {
                Err(page)
            }
        }
        .await
    );
    assert!(page.contains("the listener is full") && page.to_lowercase().contains("retry-after: 1"), "{page}");
}
