//! The status API, `watermarkd status` and the status page, against a running daemon, a real
//! kube-apiserver and a real Prometheus: what they say of an autoscaler that scales up, one
//! inside its band and one without data, and who may read them.
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
#[path = "support/webdriver.rs"]
mod webdriver;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use daemon_process::{write, DaemonProcess};
use kube_cluster::{KubeCluster, ADMIN_TOKEN};
use prometheus_server::{Exporter, PrometheusServer};
use serde_json::Value;
use webdriver::Browser;

const STARTUP: Duration = Duration::from_secs(30);
const TOKEN: &str = "status-test-token";

/// A daemon's autoscalers, their Deployments and the Prometheus they read.
struct Setup {
    exporter: Exporter,
    _prometheus: PrometheusServer,
    dir: tempfile::TempDir,
    config: String,
    kubeconfig: String,
    ns: String,
}

/// One autoscaler of a setup: its name (and its Deployment's, at 2 replicas, 2 ready), its
/// query, the rule's keys besides the common ones, and tables after its metric.
struct Autoscaler {
    name: &'static str,
    query: &'static str,
    keys: &'static str,
    tables: &'static str,
}

/// Forbidden windows that let `busy` scale up every second and nothing scale down.
const ABSOLUTE: &str =
    "algorithm = \"absolute\"\nupscale_forbidden_window = \"1s\"\ndownscale_forbidden_window = \"1h\"\n";

impl Setup {
    /// Three autoscalers: `busy` above its band (scales up), `calm` inside it, `quiet` on a
    /// metric that does not exist.
    async fn start(prefix: &str) -> Setup {
        let autoscalers = [("busy", "load_busy"), ("calm", "load_calm"), ("quiet", "load_absent")]
            .map(|(name, query)| Autoscaler { name, query, keys: ABSOLUTE, tables: "" });
        Setup::start_with(prefix, "load_busy 30\nload_calm 7\n", &autoscalers).await
    }

    /// These autoscalers, each every second between 1 and 6 replicas on one metric `load` with
    /// the band [5, 10], reading the exporter's `series`.
    async fn start_with(prefix: &str, series: &str, autoscalers: &[Autoscaler]) -> Setup {
        let cluster = KubeCluster::shared();
        let ns = cluster.unique_namespace(prefix).await;
        for autoscaler in autoscalers {
            cluster.create_deployment(&ns, autoscaler.name, 2).await;
            cluster.set_workload_status("Deployment", &ns, autoscaler.name, 2, 2).await;
        }
        let exporter = Exporter::start(series).await;
        let prometheus = PrometheusServer::start(&exporter.target()).await;
        let dir = tempfile::tempdir().unwrap();
        let mut rules = format!("[backend.prom]\ntype = \"prometheus\"\nurl = \"{}\"\n", prometheus.url());
        for Autoscaler { name, query, keys, tables } in autoscalers {
            rules.push_str(&format!(
                "\n[[autoscaler]]\nname = \"{name}\"\ntarget = {{ kind = \"Deployment\", namespace = \"{ns}\", name = \"{name}\" }}\n\
                 interval = \"1s\"\nmin_replicas = 1\nmax_replicas = 6\n{keys}\
                 [[autoscaler.metric]]\nname = \"load\"\nbackend = \"prom\"\nquery = '{query}'\nhigh_watermark = 10\nlow_watermark = 5\n{tables}"
            ));
        }
        let config = dir.path().join("rules.toml");
        write(&config, &rules);
        let kubeconfig = dir.path().join("kubeconfig");
        cluster.write_kubeconfig(&kubeconfig, ADMIN_TOKEN);
        Setup {
            exporter,
            _prometheus: prometheus,
            config: config.display().to_string(),
            kubeconfig: kubeconfig.display().to_string(),
            dir,
            ns,
        }
    }

    fn daemon(&self, env: &[(&str, &str)]) -> DaemonProcess {
        self.daemon_as("status-a", env)
    }

    /// A daemon with this Lease identity (every daemon of a setup shares its Lease).
    fn daemon_as(&self, identity: &str, env: &[(&str, &str)]) -> DaemonProcess {
        let args = [
            "--config",
            &self.config,
            "--kubeconfig",
            &self.kubeconfig,
            "--lease-namespace",
            &self.ns,
            "--identity",
            identity,
        ];
        DaemonProcess::start(&args, env)
    }

    fn token_file(&self) -> String {
        let path = self.dir.path().join("token");
        std::fs::write(&path, format!("{TOKEN}\n")).unwrap();
        path.display().to_string()
    }
}

/// GET `path` from the daemon, with the token when given: (status, headers, body).
async fn get(listen: &str, path: &str, token: Option<&str>) -> (u16, reqwest::header::HeaderMap, String) {
    let mut request = reqwest::Client::new().get(format!("http://{listen}{path}"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let answer = request.send().await.unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let status = answer.status().as_u16();
    let headers = answer.headers().clone();
    (status, headers, answer.text().await.unwrap())
}

/// GET `path` as JSON; a daemon not listening yet, or any answer but 200, is an `Err` to wait
/// out.
async fn json(listen: &str, path: &str, token: Option<&str>) -> Result<Value, String> {
    let mut request = reqwest::Client::new().get(format!("http://{listen}{path}"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let answer = request.send().await.map_err(|e| format!("GET {path}: {e}"))?;
    let status = answer.status().as_u16();
    let body = answer.text().await.map_err(|e| format!("GET {path}: {e}"))?;
    if status != 200 {
        return Err(format!("{status}: {body}"));
    }
    serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))
}

fn row<'a>(list: &'a Value, name: &str) -> &'a Value {
    list["autoscalers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("{name} in {list}"))
}

/// Waits until every autoscaler was evaluated and `busy` scaled up at least once.
async fn settled(listen: &str, token: Option<&str>) -> Value {
    eventually!(
        STARTUP,
        "every autoscaler evaluated, busy scaled",
        async {
            let list = json(listen, "/api/v1/autoscalers", token).await?;
            let states: Vec<&str> =
                list["autoscalers"].as_array().unwrap().iter().filter_map(|r| r["state"].as_str()).collect();
            let busy_scaled = list["autoscalers"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["name"] == "busy" && !r["last_scale"].is_null());
            if states.len() == 3 && !states.contains(&"pending") && busy_scaled {
                Ok(list)
            } else {
                Err(list.to_string())
            }
        }
        .await
    )
}

fn status_command(listen: &str, args: &[&str]) -> (i32, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_watermarkd"))
        .arg("status")
        .args(["--url", &format!("http://{listen}")])
        .args(args)
        .env_remove("WATERMARKD_STATUS_TOKEN")
        .output()
        .expect("run watermarkd status");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_the_command_and_the_page_explain_every_autoscaler_to_a_token_holder() {
    let setup = Setup::start("status-api").await;
    let token_file = setup.token_file();
    let daemon = setup.daemon(&[
        ("WATERMARKD__STATUS__TOKEN_FILE", token_file.as_str()),
        ("WATERMARKD__STATUS__OPEN_ON_LOOPBACK", "false"),
    ]);
    let listen = daemon.listen.clone();
    let list = settled(&listen, Some(TOKEN)).await;

    // The table: each autoscaler's state, replicas and metric against its band.
    assert_eq!(list["total"], 3, "{list}");
    let busy = row(&list, "busy");
    assert_eq!(busy["target"]["name"], "busy");
    assert_eq!(busy["metric"]["position"], "above", "{busy}");
    assert_eq!(busy["metric"]["value"], 30.0, "{busy}");
    assert_eq!(busy["last_scale"]["from"], 2, "{busy}");
    let calm = row(&list, "calm");
    assert_eq!(calm["state"], "ok", "{calm}");
    assert_eq!(calm["metric"]["position"], "inside", "{calm}");
    assert_eq!(calm["why"], "held at 2: every metric is inside its band", "{calm}");
    let quiet = row(&list, "quiet");
    assert_eq!(quiet["state"], "no_data", "{quiet}");
    assert!(quiet["metric"]["value"].is_null(), "missing data is no value, never 0: {quiet}");

    // What needs a look first: the autoscaler without data heads the table.
    assert_eq!(list["autoscalers"][0]["name"], "quiet", "{list}");

    // Search, filter and paging.
    let only = json(&listen, "/api/v1/autoscalers?state=no_data", Some(TOKEN)).await.unwrap();
    assert_eq!(only["matched"], 1, "{only}");
    assert_eq!(only["autoscalers"][0]["name"], "quiet");
    let searched = json(&listen, "/api/v1/autoscalers?q=CAL", Some(TOKEN)).await.unwrap();
    assert_eq!(searched["autoscalers"].as_array().unwrap().len(), 1, "{searched}");
    let paged = json(&listen, "/api/v1/autoscalers?limit=2&offset=2&sort=id", Some(TOKEN)).await.unwrap();
    assert_eq!((paged["matched"].as_u64(), paged["autoscalers"][0]["name"].as_str()), (Some(3), Some("quiet")));
    let (status, _, body) = get(&listen, "/api/v1/autoscalers?state=sleepy", Some(TOKEN)).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("state: \\\"sleepy\\\" is not one of"), "{body}");

    // One autoscaler in full: the explanation, the history with its band, the scale events.
    let detail = json(&listen, "/api/v1/autoscalers/file/busy", Some(TOKEN)).await.unwrap();
    let explanation: Vec<&str> =
        detail["last"]["explanation"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(explanation.iter().any(|s| s.starts_with("load 30 is above [5, 10]")), "{explanation:?}");
    let samples = detail["history"]["samples"].as_array().unwrap();
    assert!(samples.len() >= 2, "{detail}");
    assert_eq!(samples[0]["watermarks"][0], serde_json::json!([5.0, 10.0]));
    assert_eq!(samples.last().unwrap()["values"][0], 30.0);
    assert!(!detail["history"]["events"].as_array().unwrap().is_empty(), "{detail}");
    let quiet = json(&listen, "/api/v1/autoscalers/file/quiet", Some(TOKEN)).await.unwrap();
    assert!(quiet["last"]["explanation"][0].as_str().unwrap().contains("missing data is never read as 0"), "{quiet}");
    let (status, _, body) = get(&listen, "/api/v1/autoscalers/file/nosuch", Some(TOKEN)).await;
    assert_eq!(status, 404, "{body}");

    // Backends: the requests by outcome, and who reads from them.
    let backends = json(&listen, "/api/v1/backends", Some(TOKEN)).await.unwrap();
    let prom = backends.as_array().unwrap().iter().find(|b| b["name"] == "prom").expect("prom");
    assert_eq!((prom["autoscalers"].as_u64(), prom["autoscalers_without_data"].as_u64()), (Some(3), Some(1)), "{prom}");
    assert!(prom["requests"]["ok"].as_u64().unwrap() > 0, "{prom}");

    // Without the token nothing is said; /metrics and the probes are as before.
    let (status, headers, body) = get(&listen, "/api/v1/autoscalers", None).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(headers["www-authenticate"], "Bearer realm=\"watermarkd\"");
    assert!(!body.contains("busy"), "{body}");
    assert_eq!(get(&listen, "/api/v1/autoscalers", Some("wrong")).await.0, 401);
    assert_eq!(get(&listen, "/ui", None).await.0, 401);
    assert_eq!(get(&listen, "/metrics", None).await.0, 200);
    assert_eq!(get(&listen, "/readyz", None).await.0, 200);
    let posted = reqwest::Client::new()
        .post(format!("http://{listen}/api/v1/autoscalers"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status().as_u16(), 405, "read-only");

    // The page: a table a browser without JavaScript reads, and the chart, from this daemon only.
    let (status, headers, page) = get(&listen, "/ui?q=busy", Some(TOKEN)).await;
    assert_eq!(status, 200);
    assert!(headers["content-security-policy"].to_str().unwrap().contains("default-src 'none'"));
    assert!(page.contains("<a href=\"/ui/autoscaler/file/busy\">busy</a>"), "{page}");
    assert!(!page.contains(">calm<"), "the search keeps busy only: {page}");
    assert!(!page.contains("http://") && !page.contains("https://"), "no external resource: {page}");
    let (_, _, page) = get(&listen, "/ui/autoscaler/file/busy", Some(TOKEN)).await;
    assert!(page.contains("<svg class=\"chart\""), "{page}");
    assert!(page.contains("<path class=\"value\" d=\"M"), "{page}");
    assert!(page.contains("load 30 is above [5, 10]"), "{page}");

    // The command: the table, one autoscaler's explanation, JSON for scripts.
    let (code, out, err) = status_command(&listen, &["--token-file", &token_file]);
    assert_eq!(code, 1, "quiet has no data: {out}{err}");
    assert!(out.lines().next().unwrap().starts_with("NAME"), "{out}");
    for expected in ["busy", "calm", "quiet", "no_data", "load 7 [5, 10]", "3 of 3 autoscalers"] {
        assert!(out.contains(expected), "{expected:?} in {out}");
    }
    let (code, out, err) = status_command(&listen, &["--token-file", &token_file, "calm"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("held at 2: every metric is inside its band"), "{out}");
    assert!(out.contains("load 7 is inside [5, 10]"), "{out}");
    let (code, out, _) = status_command(&listen, &["--token-file", &token_file, "--output", "json", "busy"]);
    assert_eq!(code, 0);
    let parsed: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(parsed["id"], "file/busy");
    let (code, _, err) = status_command(&listen, &["--token-file", &token_file, "nosuch"]);
    assert_eq!(code, 2);
    assert!(err.contains("no autoscaler \"nosuch\" runs there"), "{err}");
    let (code, _, err) = status_command(&listen, &[]);
    assert_eq!(code, 2);
    assert!(err.contains("answered 401"), "{err}");
    assert!(!daemon.log().contains(TOKEN), "the token is never logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_the_api_server_accepts_lets_a_reader_in() {
    let setup = Setup::start("status-review").await;
    // The admin's token is a static one, for the API server's own audiences (token_audiences
    // empty); tests/status_access.rs has ServiceAccount tokens for the audience watermarkd.
    let daemon = setup.daemon(&[
        ("WATERMARKD__STATUS__TOKEN_REVIEW", "true"),
        ("WATERMARKD__STATUS__TOKEN_AUDIENCES", ""),
        ("WATERMARKD__STATUS__OPEN_ON_LOOPBACK", "false"),
    ]);
    let listen = daemon.listen.clone();
    settled(&listen, Some(ADMIN_TOKEN)).await;
    let (status, _, body) = get(&listen, "/api/v1/autoscalers", Some("not-a-cluster-token")).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(get(&listen, "/api/v1/autoscalers", None).await.0, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_service_can_be_turned_off() {
    let setup = Setup::start("status-off").await;
    let daemon = setup.daemon(&[("WATERMARKD__STATUS__ENABLED", "false")]);
    let listen = daemon.listen.clone();
    eventually!(
        STARTUP,
        "ready",
        async {
            let answer = reqwest::get(format!("http://{listen}/readyz")).await.map_err(|e| e.to_string())?;
            if answer.status() == 200 {
                Ok(())
            } else {
                Err(answer.status().to_string())
            }
        }
        .await
    );
    assert_eq!(get(&listen, "/api/v1/autoscalers", None).await.0, 404);
    assert_eq!(get(&listen, "/ui", None).await.0, 404);
}

/// Only the leader decides: a follower's API and page say who does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_says_which_daemon_leads() {
    let setup = Setup::start("status-follow").await;
    let leader = setup.daemon_as("status-a", &[]);
    settled(&leader.listen, None).await;
    let follower = setup.daemon_as("status-b", &[]);
    let list = eventually!(
        STARTUP,
        "the follower knows the leader",
        async {
            let list = json(&follower.listen, "/api/v1/autoscalers", None).await?;
            if list["daemon"]["leader"] == false {
                Ok(list)
            } else {
                Err(list.to_string())
            }
        }
        .await
    );
    assert_eq!(list["daemon"]["leader_identity"], "status-a", "{list}");
    let leading = json(&leader.listen, "/api/v1/autoscalers", None).await.unwrap();
    assert_eq!(leading["daemon"]["leader"], true, "{leading}");
    let (_, _, page) = get(&follower.listen, "/ui", None).await;
    assert!(page.contains("This daemon follows; status-a leads and decides."), "{page}");
    let (code, _, err) = status_command(&follower.listen, &[]);
    assert!(err.contains("this daemon follows; status-a leads"), "{code}: {err}");
}

/// Where the page's screenshots are kept: the test's artifacts, beside the build.
fn artifact(name: &str) -> std::path::PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// The page in a real browser: the table lists the autoscalers and their values, the search
/// filters it as one types, the values update by themselves, and an autoscaler's chart draws.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_works_in_a_headless_browser() {
    let setup = Setup::start("status-page").await;
    let daemon = setup.daemon(&[]);
    let listen = daemon.listen.clone();
    settled(&listen, None).await;
    let browser = Browser::start().await;
    browser.open(&format!("http://{listen}/ui")).await;

    let rows = browser.find_all("table.autoscalers tbody tr").await;
    assert_eq!(rows.len(), 3);
    let mut texts = Vec::new();
    for row in &rows {
        texts.push(browser.text(row).await);
    }
    let calm = texts.iter().find(|t| t.starts_with("calm")).unwrap_or_else(|| panic!("{texts:?}"));
    assert!(calm.contains("load 7") && calm.contains("held at 2"), "{calm}");
    assert_eq!(browser.run("return document.documentElement.classList.contains('live')").await, true, "app.js ran");

    // The values update without a reload.
    setup.exporter.set("load_busy 30\nload_calm 8\n");
    eventually!(
        Duration::from_secs(30),
        "calm's new value on the page",
        async {
            let text = browser.run("return document.getElementById('rows').innerText").await;
            let text = text.as_str().unwrap_or("").to_string();
            if text.contains("load 8") {
                Ok(())
            } else {
                Err(text)
            }
        }
        .await
    );

    std::fs::write(artifact("status-table.png"), browser.screenshot().await).unwrap();

    // Searching as one types.
    let search = browser.find_all("form#filter input[type=search]").await;
    browser.type_into(&search[0], "cal").await;
    eventually!(
        Duration::from_secs(10),
        "one row left",
        async {
            let rows = browser.find_all("table.autoscalers tbody tr").await;
            if rows.len() == 1 {
                Ok(())
            } else {
                Err(format!("{} rows", rows.len()))
            }
        }
        .await
    );

    // One autoscaler: its explanation and its chart.
    browser.open(&format!("http://{listen}/ui/autoscaler/file/busy")).await;
    let explanation = browser.find_all("ol.explanation li").await;
    assert!(browser.text(&explanation[1]).await.starts_with("load 30 is above [5, 10]"));
    let drawn = browser
        .run("return [...document.querySelectorAll('figure.history .wide path.value')].map(p => p.getBBox().width)")
        .await;
    assert!(drawn[0].as_f64().unwrap() > 100.0, "the value's line spans the chart: {drawn}");
    let screenshot = browser.screenshot().await;
    assert!(screenshot.starts_with(b"\x89PNG") && screenshot.len() > 10_000, "a real screenshot");
    std::fs::write(artifact("status-autoscaler.png"), screenshot).unwrap();
}

/// What the visible chart of an autoscaler's page shows, read in the browser: the panel
/// titles, the time axis's and the value axes' labels, the side labels, the hold bands' heights,
/// the shaded spans' classes, and the chart's width and right edge.
const CHART_FACTS: &str = r#"
const visible = [...document.querySelectorAll('figure.history svg.chart')].find(s => s.getBoundingClientRect().width > 0);
if (!visible) return null;
const texts = (css) => [...visible.querySelectorAll(css)].map(t => t.textContent);
const box = visible.getBoundingClientRect();
return {
  titles: [...visible.querySelectorAll('text.panel-title')].map(t => t.lastChild.textContent),
  times: texts('g.time-axis text'),
  values: texts('g.value-axis text'),
  side: [...visible.querySelectorAll('text')].map(t => t.textContent).filter(t => /^(now|high|low|max|min) /.test(t)),
  bands: [...visible.querySelectorAll('rect.band')].map(r => r.getBBox().height),
  shades: [...new Set([...visible.querySelectorAll('rect.shade')].map(r => r.getAttribute('class')))],
  value_path: [...visible.querySelectorAll('path.value')].map(p => p.getAttribute('d')),
  width: box.width,
  right: box.right,
  narrow: visible.closest('.narrow') !== null,
  health: document.getElementById('health').innerText,
  state: document.querySelector('#detail .facts .state').textContent,
  scroll_width: document.documentElement.scrollWidth,
};
"#;

/// The page's detail for four kinds of autoscaler, in headless Chromium at a desktop's width and
/// a phone's (390 px): an `average` rule (its values per ready replica), one held by its
/// upscale forbidden window, one in fallback, one without data. Each chart has its time axis
/// (wall-clock ticks), its value axes, the hold band and the shaded spans of what held it; the
/// daemon's own health is on top; at 390 px nothing overflows. Screenshots of each in
/// target/test-artifacts/.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_charts_each_kind_of_autoscaler_at_a_desktops_and_a_phones_width() {
    const FALLBACK: &str = "[autoscaler.fallback]\nafter = \"2s\"\naction = \"replicas\"\nreplicas = 4\n";
    let autoscalers = [
        // 14 over 2 ready replicas: 7 per replica, inside [5, 10].
        Autoscaler {
            name: "average",
            query: "load_total",
            keys: "algorithm = \"average\"\ndownscale_forbidden_window = \"1h\"\n",
            tables: "",
        },
        // 30, above: one scale up, then the upscale window holds it for an hour.
        Autoscaler {
            name: "held",
            query: "load_held",
            keys: "algorithm = \"absolute\"\nupscale_forbidden_window = \"1h\"\n",
            tables: "",
        },
        Autoscaler { name: "fallback", query: "load_gone", keys: ABSOLUTE, tables: FALLBACK },
        Autoscaler { name: "quiet", query: "load_absent", keys: ABSOLUTE, tables: "" },
    ];
    let setup = Setup::start_with("status-kinds", "load_total 14\nload_held 30\n", &autoscalers).await;
    let daemon = setup.daemon(&[]);
    let listen = daemon.listen.clone();
    let wanted = [("average", "ok"), ("held", "limited"), ("fallback", "fallback"), ("quiet", "no_data")];
    // Each in its state, `held` held by its window (past its first scale up) for a few samples.
    eventually!(
        STARTUP,
        "each autoscaler in its state, held by the window",
        async {
            let list = json(&listen, "/api/v1/autoscalers", None).await?;
            let rows = list["autoscalers"].as_array().cloned().unwrap_or_default();
            for (name, state) in wanted {
                if !rows.iter().any(|r| r["name"] == name && r["state"] == state) {
                    return Err(format!("{name} not {state}: {list}"));
                }
            }
            let held = json(&listen, "/api/v1/autoscalers/file/held", None).await?;
            let samples = held["history"]["samples"].as_array().cloned().unwrap_or_default();
            let by_window = samples.iter().filter(|s| s["restricted_by"] == "upscale_window").count();
            if by_window < 3 || samples.last().is_none_or(|s| s["restricted_by"] != "upscale_window") {
                return Err(format!("held by the window {by_window} times: {held}"));
            }
            Ok(())
        }
        .await
    );
    // What the page draws for `average` is the quantity compared with the band: per replica.
    let average = json(&listen, "/api/v1/autoscalers/file/average", None).await.unwrap();
    assert_eq!(average["history"]["compared"], "per_replica", "{average}");
    assert_eq!(average["history"]["samples"].as_array().unwrap().last().unwrap()["values"][0], 7.0);

    let browser = Browser::start().await;
    for (width, device) in [(1400, "desktop"), (390, "phone")] {
        browser.set_viewport(width, if width > 1000 { 1000 } else { 844 }, width < 1000).await;
        for (name, state) in wanted {
            browser.open(&format!("http://{listen}/ui/autoscaler/file/{name}")).await;
            let facts = browser.run(CHART_FACTS).await;
            let strings = |key: &str| -> Vec<String> {
                facts[key].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect()
            };
            let at = format!("{name} at {device} width: {facts}");
            assert_eq!(facts["state"], state, "{at}");
            assert_eq!(facts["narrow"], width < 1000, "the drawing for the width shows: {at}");
            assert!(facts["right"].as_f64().unwrap() <= f64::from(width), "the chart fits: {at}");
            assert!(facts["scroll_width"].as_u64().unwrap() <= u64::from(width), "no horizontal overflow: {at}");
            // The health of the daemon, on top.
            let health = facts["health"].as_str().unwrap();
            assert!(health.contains("leader: this daemon decides") && health.contains("rules file loaded"), "{at}");
            assert!(
                health.contains("prom: 1 of 4 autoscalers without data") || health.contains("prom: 2 of 4"),
                "{at}"
            );
            // The axes: wall-clock times under the replicas, values left of each panel.
            let times = strings("times");
            assert!(times.len() >= 2, "{at}");
            assert!(times.iter().all(|t| is_clock_or_day(t)), "{times:?}: {at}");
            assert!(strings("values").len() >= 6, "a value axis per panel: {at}");
            // The band, and the watermarks named beside the panel.
            assert!(facts["bands"][0].as_f64().unwrap() > 5.0, "the hold band is drawn: {at}");
            let side = strings("side");
            for label in ["high 10", "low 5", "max 6", "min 1"] {
                assert!(side.iter().any(|s| s == label), "{label}: {at}");
            }
            let shades = strings("shades");
            let titles = strings("titles");
            match name {
                "average" => {
                    assert!(titles[0].starts_with("load per ready replica"), "{at}");
                    assert!(side.iter().any(|s| s == "now 7"), "the latest value, per replica: {at}");
                }
                "held" => {
                    assert!(titles[0].starts_with("load (absolute"), "{at}");
                    assert!(side.iter().any(|s| s == "now 30"), "{at}");
                    assert!(shades.iter().any(|c| c == "shade window"), "held by the forbidden window: {at}");
                }
                "fallback" => {
                    assert!(shades.iter().any(|c| c == "shade fallback"), "{at}");
                    assert!(facts["value_path"][0] == "", "no value is drawn: {at}");
                }
                _ => {
                    assert_eq!(shades, ["shade no-data"], "{at}");
                    assert!(facts["value_path"][0] == "", "no value is drawn, never 0: {at}");
                    assert!(!side.iter().any(|s| s.starts_with("now")), "{at}");
                }
            }
            let screenshot = browser.screenshot().await;
            assert!(screenshot.starts_with(b"\x89PNG"), "a real screenshot");
            std::fs::write(artifact(&format!("status-{name}-{device}.png")), screenshot).unwrap();
        }
        browser.open(&format!("http://{listen}/ui")).await;
        let scroll_width = browser.run("return document.documentElement.scrollWidth").await;
        assert!(scroll_width.as_u64().unwrap() <= u64::from(width), "the table at {device} width: {scroll_width}");
        std::fs::write(artifact(&format!("status-table-{device}.png")), browser.screenshot().await).unwrap();
    }
    // The README's picture: the held autoscaler at a laptop's width.
    browser.set_viewport(1000, 960, false).await;
    browser.open(&format!("http://{listen}/ui/autoscaler/file/held")).await;
    std::fs::write(artifact("status-page.png"), browser.screenshot().await).unwrap();
}

/// `12:30` or `12:30:15`, or a day under the first tick and at midnight (`Wed 05-01`).
fn is_clock_or_day(text: &str) -> bool {
    let bytes = text.as_bytes();
    let digits = text.chars().filter(char::is_ascii_digit).count();
    let clock = (bytes.len() == 5 && digits == 4 || bytes.len() == 8 && digits == 6) && bytes[2] == b':';
    let day = bytes.len() == 9 && bytes[3] == b' ' && bytes[6] == b'-';
    clock || day
}

// ---------------------------------------------------------------------------------------------
// What an object's author writes, and how `watermarkd status` finds and shows it.

/// A metric name with a clear-screen, a colour and a window title in it, as the review wrote it
/// into a WPA (the CRD puts no pattern on `metricName`).
const HOSTILE_METRIC: &str = "cpu\u{1b}[2J\u{1b}[31mOWNED\u{1b}]0;pwned-title\u{7}";

/// The WPA CRD, once per test binary (its cluster is shared).
async fn wpa_crd(cluster: &KubeCluster) {
    static INSTALLED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    INSTALLED
        .get_or_init(|| async {
            cluster.create_crd(&watermarkd::domain::crd::custom_resource_definition()).await;
        })
        .await;
}

/// A WPA on Deployment `target` of `namespace`, its one metric read from Prometheus (`load`)
/// through the `watermarkd.io/queries` annotation.
async fn create_wpa(cluster: &KubeCluster, namespace: &str, name: &str, target: &str, metric_name: &str) {
    use kube::api::{Api, ApiResource, DynamicObject, PostParams};
    let resource = ApiResource::erase::<watermarkd::domain::crd::WatermarkPodAutoscaler>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(cluster.client(), namespace, &resource);
    let object: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "datadoghq.com/v1alpha1", "kind": "WatermarkPodAutoscaler",
        "metadata": { "name": name, "annotations": {
            "watermarkd.io/queries": r#"[{"metric": 0, "backend": "prom", "query": "load"}]"# } },
        "spec": { "minReplicas": 1, "maxReplicas": 6,
            "scaleTargetRef": { "kind": "Deployment", "apiVersion": "apps/v1", "name": target },
            "metrics": [{ "type": "External", "external": {
                "highWatermark": "10", "lowWatermark": "5", "metricName": metric_name,
                "metricSelector": { "matchLabels": { "app": target } } } }] },
    }))
    .unwrap();
    api.create(&PostParams::default(), &object).await.unwrap_or_else(|e| panic!("create WPA {namespace}/{name}: {e}"));
}

/// CRD mode on a real API server: WPAs named `esc` in two namespaces with the review's metric
/// name, `solo` in one, and a rules-file autoscaler `gone` whose target does not exist. The table
/// and the detail show each control character as an escape, never the character (the JSON keeps
/// it exactly); a WPA is listed as NAMESPACE/NAME and found by its bare name, NAMESPACE/NAME or
/// id, and a bare name two namespaces share is refused naming both; an autoscaler whose every
/// evaluation failed says so instead of "not evaluated yet".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wpas_are_shown_inert_and_found_by_their_own_name() {
    let cluster = KubeCluster::shared();
    wpa_crd(cluster).await;
    let first = cluster.unique_namespace("status-crd-a").await;
    let second = cluster.unique_namespace("status-crd-b").await;
    for (ns, target) in [(&first, "web"), (&second, "web"), (&first, "api")] {
        cluster.create_deployment(ns, target, 2).await;
        cluster.set_workload_status("Deployment", ns, target, 2, 2).await;
    }
    create_wpa(cluster, &first, "esc", "web", HOSTILE_METRIC).await;
    create_wpa(cluster, &second, "esc", "web", HOSTILE_METRIC).await;
    create_wpa(cluster, &first, "solo", "api", "load").await;

    let exporter = Exporter::start("load 7\n").await;
    let prometheus = PrometheusServer::start(&exporter.target()).await;
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.toml");
    write(
        &rules,
        &format!(
            "[backend.prom]\ntype = \"prometheus\"\nurl = \"{}\"\n\n[[autoscaler]]\nname = \"gone\"\n\
             target = {{ kind = \"Deployment\", namespace = \"{first}\", name = \"does-not-exist\" }}\n\
             interval = \"1s\"\nmin_replicas = 1\nmax_replicas = 6\n\
             [[autoscaler.metric]]\nname = \"load\"\nbackend = \"prom\"\nquery = 'load'\nhigh_watermark = 10\nlow_watermark = 5\n",
            prometheus.url()
        ),
    );
    let kubeconfig = dir.path().join("kubeconfig");
    cluster.write_kubeconfig(&kubeconfig, ADMIN_TOKEN);
    let args = [
        "--config",
        rules.to_str().unwrap(),
        "--crd",
        "--namespace",
        &first,
        "--namespace",
        &second,
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--lease-namespace",
        &first,
        "--default-interval",
        "1s",
    ];
    let daemon = DaemonProcess::start(&args, &[]);
    let listen = daemon.listen.clone();
    let list = eventually!(
        STARTUP,
        "the three WPAs decided on data, and gone failing",
        async {
            let list = json(&listen, "/api/v1/autoscalers", None).await?;
            let rows = list["autoscalers"].as_array().unwrap();
            let decided = rows.iter().filter(|r| r["source"] == "crd" && r["state"] == "ok").count();
            let gone_failing = rows.iter().any(|r| r["name"] == "gone" && r["state"] == "failing");
            if decided == 3 && gone_failing {
                Ok(list)
            } else {
                Err(format!("{list}\n{}", daemon.log()))
            }
        }
        .await
    );
    let esc = list["autoscalers"].as_array().unwrap().iter().find(|r| r["id"] == format!("crd/{first}/esc")).unwrap();
    assert_eq!((&esc["name"], &esc["namespace"]), (&Value::from("esc"), &Value::from(first.clone())), "{esc}");

    // The table: no control character reaches the terminal; each is shown as its escape.
    let (_, table, err) = status_command(&listen, &[]);
    assert!(!table.contains(['\u{1b}', '\u{7}']), "a control character in the table: {table:?}");
    assert!(table.contains("cpu\\u{1b}[2J\\u{1b}[31mOWNED\\u{1b}]0;pwned-title\\u{7}"), "{table}{err}");
    assert!(table.lines().any(|l| l.starts_with(&format!("{first}/esc "))), "{table}");
    assert!(!table.contains(&format!("{first}/{first}/")), "the namespace twice: {table}");

    // A bare name two namespaces share: refused, naming both.
    let (code, _, err) = status_command(&listen, &["esc"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("\"esc\" names several autoscalers"), "{err}");
    for ns in [&first, &second] {
        assert!(err.contains(&format!("{ns}/esc (crd/{ns}/esc)")), "{ns} in {err}");
    }

    // NAMESPACE/NAME, the id, and a bare name only one namespace has: the detail, inert too.
    for (asked, id) in [
        (format!("{first}/esc"), format!("crd/{first}/esc")),
        (format!("crd/{second}/esc"), format!("crd/{second}/esc")),
        ("solo".to_string(), format!("crd/{first}/solo")),
    ] {
        let (code, detail, err) = status_command(&listen, &[&asked]);
        assert_eq!(code, 0, "{asked}: {detail}{err}");
        assert!(detail.starts_with(&format!("{} ({id}) -> Deployment", id.rsplit('/').next().unwrap())), "{detail}");
        assert!(!detail.contains(['\u{1b}', '\u{7}']), "a control character in the detail: {detail:?}");
    }
    let (_, detail, _) = status_command(&listen, &[&format!("{first}/esc")]);
    assert!(detail.contains("cpu\\u{1b}[2J"), "{detail}");

    // JSON stays exact JSON: the name as written.
    let (code, out, err) = status_command(&listen, &["-o", "json", &format!("{first}/esc")]);
    assert_eq!(code, 0, "{err}");
    let parsed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(parsed["metric"]["name"], HOSTILE_METRIC, "{parsed}");

    // Failing from the start: why, and that it is tried again, not "not evaluated yet".
    let (code, detail, err) = status_command(&listen, &["gone"]);
    assert_eq!(code, 1, "{detail}{err}");
    assert!(detail.contains("cannot evaluate: "), "{detail}");
    assert!(
        detail.contains("no decision yet: every evaluation so far has failed; the daemon tries again every 1s"),
        "{detail}"
    );
    assert!(!detail.contains("not evaluated yet"), "{detail}");
}

/// The review's `/ui?offset=18446744073709551615`: the pager's text said "0 to
/// 18446744073709551615 shown" (the sum wrapped; a build with overflow checks panics there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_far_past_the_end_says_so_without_wrapping() {
    let setup = Setup::start("status-offset").await;
    let daemon = setup.daemon(&[]);
    let listen = daemon.listen.clone();
    settled(&listen, None).await;
    for path in ["/ui?offset=18446744073709551615", "/ui/table?offset=18446744073709551615", "/ui?offset=3"] {
        let (status, _, page) = get(&listen, path, None).await;
        assert_eq!(status, 200, "{path}: {page}");
        assert!(page.contains("3 of 3 autoscalers, none past the first 3"), "{path}: {page}");
        assert!(!page.contains(" shown"), "{path}: {page}");
        assert!(!page.contains("rel=\"next\""), "{path}: no next page past the end: {page}");
    }
    let (_, _, page) = get(&listen, "/ui?offset=1&limit=1", None).await;
    assert!(page.contains("3 of 3 autoscalers") && !page.contains("none past"), "{page}");
}

/// A daemon that is not there: the address once, the cause, and what to try.
#[test]
fn an_unreachable_daemon_is_named_once_with_the_cause_and_a_hint() {
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (code, out, err) = status_command(&format!("127.0.0.1:{port}"), &[]);
    assert_eq!(code, 2, "{out}{err}");
    let url = format!("http://127.0.0.1:{port}");
    assert_eq!(err.matches(&url).count(), 1, "the address once: {err}");
    assert!(err.contains(&format!("cannot reach the daemon at {url}: ")), "{err}");
    assert!(err.to_lowercase().contains("connection refused"), "the cause: {err}");
    assert!(err.contains("kubectl -n watermarkd port-forward") && err.contains("--url"), "a hint: {err}");
    assert!(!err.contains("/api/v1"), "the request's path is not the daemon's address: {err}");
}
