//! What the daemon says about itself must be true from the first minute: a credential that is
//! missing fails the start (and `check` warns of it), a rules file that was refused and then
//! put back is seen as put back, and a state namespace that does not exist is said in one
//! line and by `/readyz`. Against a real kube-apiserver.
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

use std::process::Command;
use std::time::Duration;

use daemon_process::{write, DaemonProcess};
use kube_cluster::{KubeCluster, ADMIN_TOKEN};
use serde_json::Value;

const STARTUP: Duration = Duration::from_secs(30);

fn rules(namespace: &str, max_replicas: u32) -> String {
    format!(
        "[backend.prom]\ntype = \"prometheus\"\nurl = \"http://127.0.0.1:9\"\n\n[[autoscaler]]\nname = \"web\"\n\
         target = {{ kind = \"Deployment\", namespace = \"{namespace}\", name = \"web\" }}\n\
         interval = \"1s\"\nmin_replicas = 2\nmax_replicas = {max_replicas}\n\
         [[autoscaler.metric]]\nname = \"load\"\nbackend = \"prom\"\nquery = 'load'\nhigh_watermark = 10\nlow_watermark = 5\n"
    )
}

const DATADOG_RULES: &str = "[backend.dd]\ntype = \"datadog\"\napi_key_env = \"WATERMARKD_TEST_UNSET_API_KEY\"\n\
     app_key_env = \"WATERMARKD_TEST_UNSET_APP_KEY\"\n\n[[autoscaler]]\nname = \"web\"\n\
     target = { kind = \"Deployment\", namespace = \"prod\", name = \"web\" }\nmin_replicas = 1\nmax_replicas = 5\n\
     [[autoscaler.metric]]\nbackend = \"dd\"\nquery = \"avg:load{app:web}\"\nhigh_watermark = 10\nlow_watermark = 5\n";

#[test]
fn a_missing_credential_fails_the_start_and_check_warns_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.toml");
    write(&file, DATADOG_RULES);
    let check = Command::new(env!("CARGO_BIN_EXE_watermarkd"))
        .args(["check", file.to_str().unwrap()])
        .env_remove("WATERMARKD_TEST_UNSET_API_KEY")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "a warning, not a problem: {said}");
    assert!(
        said.contains(
            "warning: backend \"dd\": environment variable WATERMARKD_TEST_UNSET_API_KEY is not set; \
             `watermarkd run` does not start without it"
        ),
        "{said}"
    );
    // The daemon stops at once, naming the variable once, before it is ever Ready.
    let run = Command::new(env!("CARGO_BIN_EXE_watermarkd"))
        .args(["run", "--rules", file.to_str().unwrap(), "--settings", "/dev/null", "--no-leader-election"])
        .args(["--kubeconfig", "/nonexistent/kubeconfig", "--listen", "127.0.0.1:0"])
        .env_remove("WATERMARKD_TEST_UNSET_API_KEY")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success(), "{err}");
    assert!(err.contains("backend \"dd\": environment variable WATERMARKD_TEST_UNSET_API_KEY is not set"), "{err}");
    assert_eq!(err.matches("is not set").count(), 1, "said once: {err}");
}

/// `watermarkd run` on `rules` without a Lease, its state kept in `state_namespace`.
fn run_args<'a>(rules: &'a std::path::Path, kubeconfig: &'a std::path::Path, state_namespace: &'a str) -> Vec<&'a str> {
    let path = |p: &'a std::path::Path| p.to_str().unwrap();
    vec![
        "--rules",
        path(rules),
        "--kubeconfig",
        path(kubeconfig),
        "--lease-namespace",
        state_namespace,
        "--no-leader-election",
    ]
}

async fn autoscalers(daemon: &DaemonProcess) -> Result<Value, String> {
    let (status, body) = daemon.get("/api/v1/autoscalers").await?;
    if status != 200 {
        return Err(format!("{status}: {body}"));
    }
    serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_rules_file_put_back_is_seen_as_put_back() {
    let cluster = KubeCluster::shared();
    let ns = cluster.unique_namespace("rules-revert").await;
    cluster.create_deployment(&ns, "web", 2).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.toml");
    let good = rules(&ns, 6);
    write(&file, &good);
    let kubeconfig = dir.path().join("kubeconfig");
    cluster.write_kubeconfig(&kubeconfig, ADMIN_TOKEN);
    let mut daemon = DaemonProcess::start(&run_args(&file, &kubeconfig, &ns), &[("WATERMARKD__RELOAD_POLL", "200ms")]);
    daemon.wait_ready(STARTUP).await;
    eventually!(STARTUP, "the rules as loaded", autoscalers(&daemon).await);

    // A bad edit: max below min. Refused, and said where a person looks.
    write(&file, &rules(&ns, 1));
    let refused = eventually!(
        STARTUP,
        "the refusal on the status API",
        async {
            let list = autoscalers(&daemon).await?;
            if list["rules"]["rejected"].is_object() {
                Ok(list)
            } else {
                Err(list.to_string())
            }
        }
        .await
    );
    let problems = refused["rules"]["rejected"]["problems"].to_string();
    assert!(problems.contains("max_replicas"), "each problem, naming its field: {refused}");
    assert_eq!(daemon.sample("watermarkd_config_last_reload_successful", &[]).await, Some(0.0));
    let page = daemon.get("/ui").await.unwrap().1;
    assert!(page.contains("The rules file on disk was refused"), "{page}");
    let status = Command::new(env!("CARGO_BIN_EXE_watermarkd"))
        .args(["status", "--url", &format!("http://{}", daemon.listen)])
        .env_remove("WATERMARKD_STATUS_TOKEN")
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&status.stdout);
    assert!(table.starts_with("The rules file on disk was refused at "), "{table}");
    assert!(table.contains("max_replicas"), "{table}");

    // Put back as it was (`git checkout`, `helm rollback`): the same content as what runs.
    write(&file, &good);
    eventually!(
        STARTUP,
        "the gauge back at 1",
        async {
            match daemon.sample("watermarkd_config_last_reload_successful", &[]).await {
                Some(1.0) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
        .await
    );
    let list = autoscalers(&daemon).await.unwrap();
    assert!(list["rules"]["rejected"].is_null(), "{list}");
    assert!(!daemon.get("/ui").await.unwrap().1.contains("was refused"));
    assert!(daemon.log().contains("the rules file is back to the rules that run"), "{}", daemon.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_state_namespace_is_said_once_and_by_readyz() {
    let cluster = KubeCluster::shared();
    let ns = cluster.unique_namespace("state-ns").await;
    cluster.create_deployment(&ns, "web", 2).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.toml");
    write(&file, &rules(&ns, 6));
    let kubeconfig = dir.path().join("kubeconfig");
    cluster.write_kubeconfig(&kubeconfig, ADMIN_TOKEN);
    let missing = format!("{ns}-state");
    let daemon = DaemonProcess::start(&run_args(&file, &kubeconfig, &missing), &[]);
    let said = eventually!(
        STARTUP,
        "/readyz naming the missing namespace",
        async {
            let (status, body) = daemon.get("/readyz").await?;
            if status == 503 && body.contains("does not exist") {
                Ok(body)
            } else {
                Err(format!("{status}: {body}"))
            }
        }
        .await
    );
    assert!(said.contains(&format!("kubectl create namespace {missing}")), "{said}");
    assert!(said.contains("--lease-namespace"), "{said}");
    // Several evaluations (every second) later: said once in the log, in one line.
    let evaluated = || async {
        let count = daemon.sample("watermarkd_evaluations_total", &[("result", "held")]).await.unwrap_or(0.0);
        if count >= 4.0 {
            Ok(())
        } else {
            Err(format!("{count} evaluations"))
        }
    };
    eventually!(STARTUP, "four evaluations", evaluated().await);
    let log = daemon.log();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("does not exist")).collect();
    assert_eq!(lines.len(), 1, "{log}");
    assert!(!log.contains("Status {"), "no Debug dump of the API's answer: {log}");

    cluster.create_namespace(&missing).await;
    eventually!(
        STARTUP,
        "ready once the namespace exists",
        async {
            match daemon.get("/readyz").await? {
                (200, _) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
        .await
    );
}
