//! A real Kubernetes API server for integration tests: etcd and kube-apiserver on free loopback
//! ports, with a temporary data directory, started by the tests themselves.
//!
//! ```ignore
//! #[path = "support/kube_cluster.rs"]
//! mod kube_cluster;
//! use kube_cluster::KubeCluster;
//!
//! #[tokio::test]
//! async fn something() {
//!     let cluster = KubeCluster::shared();          // one per test binary, started on first use
//!     let ns = cluster.unique_namespace("scale").await;
//!     cluster.create_deployment(&ns, "web", 2).await;
//!     cluster.set_workload_status("Deployment", &ns, "web", 2, 1).await;
//!     let client = cluster.client();               // admin (system:masters)
//!     // ...
//! }
//! ```
//!
//! # Starting
//! - `KubeCluster::shared() -> &'static KubeCluster`: one cluster per test binary, started by
//!   the first test that asks (about 3 s) and shared by the others. Isolate tests with
//!   `unique_namespace`; cluster-scoped objects (CRDs, ClusterRoles) are visible to every test
//!   of the binary, so give them names of their own.
//! - `KubeCluster::start().await`: a cluster of one's own, stopped on drop.
//!
//! Both are killed on drop and, through a watchdog wrapper, when the test process exits in any
//! way (the shared one is never dropped; Ctrl-C never runs destructors): no stray etcd or
//! apiserver survives a test run, and a keeper process removes the temporary directories once
//! both are gone.
//!
//! # Faults (a cluster of one's own only; they panic on the shared one)
//! - `kill_apiserver()` (SIGKILL) and `start_apiserver()`: the same binary and flags on the same
//!   etcd, port, certificates and tokens, so clients reconnect to it as to a restarted API
//!   server; `start_apiserver` returns when `/readyz` answers 200 again. `restart_apiserver(down)`
//!   does both with `down` in between.
//! - `pause_etcd()` / `resume_etcd()` (SIGSTOP / SIGCONT): the API server stays up and its
//!   requests hang. `kill_etcd()` / `start_etcd()`: the same data directory and ports.
//!
//! There is no controller-manager and no scheduler: nothing creates ReplicaSets or pods and
//! nothing updates status. Tests set status themselves (`set_workload_status`, `patch_status`,
//! `set_pod_ready`). The ServiceAccount admission plugin is off, so pods need no service account.
//!
//! # Binaries
//! kube-apiserver: `$WATERMARKD_KUBE_APISERVER`, else `~/.cache/watermarkd/bin/kube-apiserver`
//! (built by `scripts/install-kube-apiserver`). etcd: `$WATERMARKD_ETCD`, else `etcd` on PATH,
//! else `/usr/bin/etcd`. A missing binary fails the test with "run scripts/install-test-deps":
//! a test that silently skips proves nothing.
//!
//! # Users and clients (all `client*` calls must run inside a Tokio runtime)
//! - `ADMIN_TOKEN` (user `admin`, group `system:masters`): `client()`.
//! - Restricted users with no groups and no RBAC bindings: `SCALER_TOKEN` (user `scaler`) and
//!   the others in `RESTRICTED_USERS`: `client_for(token)`. Give them rights with `grant`.
//! - Any user name, through impersonation by the admin: `client_as(user)`. RBAC then checks the
//!   impersonated user, so each test can use a user nobody else has granted anything.
//! - `write_kubeconfig(path, token)`: a kubeconfig for `watermarkd --kubeconfig`.
//!
//! # Objects
//! `create_namespace`, `unique_namespace`, `create_deployment`, `create_statefulset`,
//! `create_replicaset`, `set_workload_status`, `spec_replicas`, `patch_status`, `create_pod`, `set_pod_ready`,
//! `create_crd` (waits until established and served), `grant` (a Role and RoleBinding).
//!
//! # API aggregation
//! The API server runs with the front-proxy flags a real cluster has
//! (`--requestheader-client-ca-file`, `--requestheader-allowed-names=front-proxy-client`, the
//! `X-Remote-User`/`X-Remote-Group`/`X-Remote-Extra-` header names, `--proxy-client-cert-file`
//! and `--proxy-client-key-file`, certificates made by `openssl` in the cluster's directory), so
//! an extension API server registered with an APIService is reached through the aggregator as
//! in production: `metrics_server.rs` serves `metrics.k8s.io` that way. `front_proxy_ca_path()`
//! is the CA such a server trusts for the aggregator's client certificate. Nothing changes for
//! tests that do not register one.
//!
//! # Counting requests
//! The apiserver writes an audit log (metadata only) of every request: `requests_by(user)`
//! returns what a user (token or impersonated) asked for, with when the API server received it
//! and when it answered, e.g. to assert that reads are served from a watch cache without a GET,
//! or when a write landed.
#![allow(dead_code, reason = "every test binary that includes this file uses only part of it")]

// Each support file is compiled into every test binary that names it, so a test using two of
// them has two copies of this small module.
#[allow(clippy::duplicate_mod, reason = "a test binary that names two support files has two copies of this one")]
#[path = "test_pki.rs"]
mod test_pki;

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::net::TcpListener as StdListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::{json, Value};

/// Token of `admin`, a member of `system:masters`.
pub const ADMIN_TOKEN: &str = "admin-token";
/// Token of `scaler`, a user with no groups and, until a test grants some, no rights.
pub const SCALER_TOKEN: &str = "scaler-token";
pub const SCALER_USER: &str = "scaler";
/// `(token, user)` of every restricted user in the token file (no groups, no bindings).
pub const RESTRICTED_USERS: &[(&str, &str)] =
    &[(SCALER_TOKEN, SCALER_USER), ("reader-token", "reader"), ("writer-token", "writer")];

const INSTALL_HINT: &str = "run scripts/install-test-deps (as root) to install it";
/// How long the API server may take to answer `/readyz` after a start, a restart or etcd's
/// return. Alone it takes seconds; with the whole suite on two cores, an API server
/// reconnecting to a restarted etcd once needed more than a minute.
const READY_WITHIN: Duration = Duration::from_secs(120);

/// Runs `"$@"`, writes its pid to `$WATCHDOG_PIDFILE` (so a test can signal the process
/// itself) and kills it when our end of the shell's standard input closes, which happens on
/// drop and also when the test process dies without running destructors. The child gets
/// /dev/null as its own standard input; fd 3 keeps the pipe for the watchdog.
const WATCHDOG: &str = r#"exec 3<&0
"$@" </dev/null 3<&- &
child=$!
echo "$child" > "$WATCHDOG_PIDFILE"
(
  cat <&3 >/dev/null
  kill -CONT "$child" 2>/dev/null
  kill -KILL "$child" 2>/dev/null
) &
exec 3<&-
wait "$child""#;

/// Waits until our end of its standard input closes, then until no process named in the pid
/// files `$KEEPER_PIDS/*.pid` is alive, then removes the directories `"$@"` (the shared cluster
/// is never dropped, so its temporary directories would otherwise stay, one of them in
/// /dev/shm). One keeper per cluster, so a process can be killed and started again without its
/// files going with it.
const KEEPER: &str = r#"cat >/dev/null
for pidfile in "$KEEPER_PIDS"/*.pid; do
  pid=$(cat "$pidfile" 2>/dev/null) || continue
  while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
done
rm -rf -- "$@""#;

/// How to start one of the cluster's processes, again after a fault.
#[derive(Clone, Debug)]
struct Launch {
    name: &'static str,
    program: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    pidfile: PathBuf,
}

impl Launch {
    fn spawn(&self, append: bool) -> Watched {
        Watched::spawn(self, append)
    }
}

/// One process under the watchdog, with its output in a log file.
struct Watched {
    name: &'static str,
    shell: Child,
    stdin: Option<ChildStdin>,
    log: PathBuf,
    pidfile: PathBuf,
}

impl Watched {
    /// Starts the process under the watchdog, its output going to the log (appended to, or
    /// replacing it).
    fn spawn(launch: &Launch, append: bool) -> Self {
        let name = launch.name;
        let _ = std::fs::remove_file(&launch.pidfile);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(&launch.log)
            .expect("create a log file");
        let mut shell = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .arg("sh")
            .arg(&launch.program)
            .args(&launch.args)
            .env("WATCHDOG_PIDFILE", &launch.pidfile)
            .stdin(Stdio::piped())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run sh to start {name}: {e}"));
        let stdin = shell.stdin.take();
        Watched { name, shell, stdin, log: launch.log.clone(), pidfile: launch.pidfile.clone() }
    }

    /// The exit status when the process has ended.
    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.shell.try_wait().ok().flatten()
    }

    /// The process's own pid (not the watchdog shell's), once the shell has written it.
    fn pid(&self) -> i32 {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let text = std::fs::read_to_string(&self.pidfile).unwrap_or_default();
            if let Ok(pid) = text.trim().parse::<i32>() {
                return pid;
            }
            assert!(Instant::now() < deadline, "{} wrote no pid to {}", self.name, self.pidfile.display());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends `signal` to the process itself.
    fn signal(&self, signal: i32) {
        let pid = self.pid();
        // SAFETY: kill takes plain integers and touches no memory of ours; the pid is one this
        // test started.
        #[expect(unsafe_code, reason = "std's Child can only SIGKILL; the tests also stop and continue processes")]
        let sent = unsafe { libc::kill(pid, signal) };
        assert_eq!(sent, 0, "cannot signal {} (pid {pid}): {}", self.name, std::io::Error::last_os_error());
    }

    fn stop(&mut self) {
        // Closing the pipe makes the watchdog kill the process; the shell then exits.
        self.stdin.take();
        let _ = self.shell.wait();
    }

    /// The last `max` bytes of the log.
    fn log_tail(&self, max: u64) -> String {
        let Ok(mut file) = std::fs::File::open(&self.log) else { return String::new() };
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = file.seek(SeekFrom::Start(len.saturating_sub(max)));
        let mut text = String::new();
        let _ = file.read_to_string(&mut text);
        text
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Removes the cluster's directories once its processes are gone, also when the test process
/// dies without running destructors (see `KEEPER`).
struct Keeper {
    shell: Child,
    stdin: Option<ChildStdin>,
}

impl Keeper {
    fn spawn(pids: &Path, dirs: &[&Path]) -> Keeper {
        let mut shell = Command::new("sh")
            .arg("-c")
            .arg(KEEPER)
            .arg("sh")
            .args(dirs)
            .env("KEEPER_PIDS", pids)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run sh to keep the cluster's directories: {e}"));
        let stdin = shell.stdin.take();
        Keeper { shell, stdin }
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.stdin.take();
        let _ = self.shell.wait();
    }
}

/// A running etcd + kube-apiserver. See the module documentation.
pub struct KubeCluster {
    // Field order is drop order: the apiserver goes before etcd, then the directories.
    apiserver: Mutex<Watched>,
    etcd: Mutex<Watched>,
    apiserver_launch: Launch,
    etcd_launch: Launch,
    url: String,
    ca_path: PathBuf,
    /// The admin configuration; every client is built from a copy.
    config: Config,
    started_in: Duration,
    /// The CA of the client certificate the aggregator presents to extension API servers.
    front_proxy_ca: PathBuf,
    _keeper: Keeper,
    dir: tempfile::TempDir,
    etcd_dir: tempfile::TempDir,
}

/// Where the install scripts cache what the tests need: `$WATERMARKD_CACHE`, else
/// ~/.cache/watermarkd.
pub fn cache_dir() -> PathBuf {
    match std::env::var_os("WATERMARKD_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/watermarkd"),
    }
}

/// `$WATERMARKD_KUBE_APISERVER`, else the cache `scripts/install-kube-apiserver` fills.
pub fn kube_apiserver_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("WATERMARKD_KUBE_APISERVER") {
        let path = PathBuf::from(path);
        assert!(path.is_file(), "WATERMARKD_KUBE_APISERVER={} is not a file: {INSTALL_HINT}", path.display());
        return path;
    }
    let path = cache_dir().join("bin/kube-apiserver");
    assert!(path.is_file(), "kube-apiserver is not at {}: {INSTALL_HINT}", path.display());
    path
}

/// `$WATERMARKD_ETCD`, else `etcd` on PATH, else /usr/bin/etcd.
pub fn etcd_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("WATERMARKD_ETCD") {
        return PathBuf::from(path);
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("etcd"))
        .find(|candidate| candidate.is_file());
    match on_path {
        Some(path) => path,
        None if Path::new("/usr/bin/etcd").is_file() => PathBuf::from("/usr/bin/etcd"),
        None => panic!("etcd is not on PATH nor at /usr/bin/etcd: {INSTALL_HINT}"),
    }
}

fn free_port() -> u16 {
    // Free when this returns; a process binding it a moment later can still race with another,
    // which `start` handles by trying again with new ports.
    StdListener::bind("127.0.0.1:0").expect("bind a free port").local_addr().expect("local address").port()
}

/// A temporary directory on tmpfs when there is one: etcd fsyncs every write, and on a disk
/// that makes every API write slow.
fn fast_tempdir(prefix: &str) -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(dir) = tempfile::Builder::new().prefix(prefix).tempdir_in(shm) {
            return dir;
        }
    }
    tempfile::Builder::new().prefix(prefix).tempdir().expect("temp dir")
}

/// The front proxy of API aggregation: a CA and the client certificate (CN
/// `front-proxy-client`) the API server presents to extension API servers such as a metrics
/// server, made by `openssl` (EC keys: quick to generate) in the cluster's directory, so a
/// restarted API server finds them again.
struct FrontProxy {
    ca: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
}

/// The name the API server accepts in front-proxy client certificates.
pub const FRONT_PROXY_CLIENT: &str = "front-proxy-client";

impl FrontProxy {
    fn generate(dir: &Path) -> FrontProxy {
        test_pki::make_ca(dir, "front-proxy-ca.key", "front-proxy-ca.crt", "watermarkd test front-proxy CA");
        test_pki::sign(
            dir,
            ("front-proxy-ca.key", "front-proxy-ca.crt"),
            ("front-proxy-client.key", "front-proxy-client.crt"),
            FRONT_PROXY_CLIENT,
            "clientAuth",
            "",
        );
        FrontProxy {
            ca: dir.join("front-proxy-ca.crt"),
            client_cert: dir.join("front-proxy-client.crt"),
            client_key: dir.join("front-proxy-client.key"),
        }
    }

    /// What the API server needs to proxy aggregated APIs the way a real cluster does: the
    /// certificate it presents, and the request-header authentication settings (which name the
    /// headers it sets, and which CA and name an extension server should trust them from).
    fn apiserver_flags(&self) -> Vec<String> {
        vec![
            format!("--requestheader-client-ca-file={}", self.ca.display()),
            format!("--requestheader-allowed-names={FRONT_PROXY_CLIENT}"),
            "--requestheader-extra-headers-prefix=X-Remote-Extra-".to_string(),
            "--requestheader-group-headers=X-Remote-Group".to_string(),
            "--requestheader-username-headers=X-Remote-User".to_string(),
            format!("--proxy-client-cert-file={}", self.client_cert.display()),
            format!("--proxy-client-key-file={}", self.client_key.display()),
        ]
    }
}

static SHARED: OnceLock<KubeCluster> = OnceLock::new();
static UNIQUE: AtomicU64 = AtomicU64::new(0);

impl KubeCluster {
    /// One cluster per test binary, started on first use. Safe to call from any test and any
    /// runtime: the start runs on a thread of its own.
    pub fn shared() -> &'static KubeCluster {
        SHARED.get_or_init(|| {
            std::thread::spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime to start the cluster");
                runtime.block_on(KubeCluster::start())
            })
            .join()
            .unwrap_or_else(|_| panic!("the shared Kubernetes cluster did not start (see the panic above)"))
        })
    }

    /// Starts etcd and kube-apiserver and waits until `/readyz` answers ok. Panics with both
    /// logs when they do not come up.
    pub async fn start() -> KubeCluster {
        watermarkd::adapters::backend::ensure_crypto_provider();
        let apiserver_bin = kube_apiserver_binary();
        let etcd_bin = etcd_binary();
        let started = Instant::now();
        let mut last_failure = String::new();
        for _attempt in 0..3 {
            match Self::try_start(&apiserver_bin, &etcd_bin, started).await {
                Ok(cluster) => return cluster,
                Err(failure) => {
                    let retry = failure.contains("address already in use");
                    last_failure = failure;
                    if !retry {
                        break;
                    }
                }
            }
        }
        panic!("the Kubernetes test cluster did not start:\n{last_failure}");
    }

    async fn try_start(apiserver_bin: &Path, etcd_bin: &Path, started: Instant) -> Result<KubeCluster, String> {
        let dir = tempfile::Builder::new().prefix("watermarkd-kube-").tempdir().expect("temp dir");
        let etcd_dir = fast_tempdir("watermarkd-etcd-");
        let (client_port, peer_port, api_port) = (free_port(), free_port(), free_port());

        let mut tokens = format!("{ADMIN_TOKEN},admin,admin,\"system:masters\"\n");
        for (token, user) in RESTRICTED_USERS {
            tokens.push_str(&format!("{token},{user},{user}\n"));
        }
        std::fs::write(dir.path().join("tokens.csv"), tokens).expect("write tokens.csv");

        let key = dir.path().join("service-account.key");
        let openssl = Command::new("openssl")
            .args(["genrsa", "-out"])
            .arg(&key)
            .arg("2048")
            .stderr(Stdio::null())
            .status()
            .unwrap_or_else(|e| panic!("cannot run openssl: {e}; {INSTALL_HINT}"));
        assert!(openssl.success(), "openssl genrsa failed ({openssl})");

        let front_proxy = FrontProxy::generate(dir.path());

        let etcd_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let etcd_args = vec![
            "--name=test".to_string(),
            format!("--data-dir={}", etcd_dir.path().join("data").display()),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=test={peer_url}"),
            "--log-level=warn".to_string(),
        ];
        let keeper = Keeper::spawn(dir.path(), &[dir.path(), etcd_dir.path()]);
        let etcd_launch = Launch {
            name: "etcd",
            program: etcd_bin.to_path_buf(),
            args: etcd_args,
            log: dir.path().join("etcd.log"),
            pidfile: dir.path().join("etcd.pid"),
        };
        let etcd = etcd_launch.spawn(false);

        // Every request is logged (metadata only) so tests can count what a client asked for.
        let audit_policy = dir.path().join("audit-policy.yaml");
        std::fs::write(
            &audit_policy,
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [\"RequestReceived\"]\nrules:\n  - level: Metadata\n",
        )
        .expect("write the audit policy");
        let cert_dir = dir.path().join("certs");
        let apiserver_args = vec![
            format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1".to_string(),
            format!("--secure-port={api_port}"),
            "--insecure-port=0".to_string(),
            format!("--cert-dir={}", cert_dir.display()),
            format!("--token-auth-file={}", dir.path().join("tokens.csv").display()),
            "--authorization-mode=RBAC".to_string(),
            "--service-account-issuer=https://kubernetes.default.svc".to_string(),
            format!("--service-account-key-file={}", key.display()),
            format!("--service-account-signing-key-file={}", key.display()),
            "--service-cluster-ip-range=10.0.0.0/24".to_string(),
            "--endpoint-reconciler-type=none".to_string(),
            "--disable-admission-plugins=ServiceAccount".to_string(),
            "--advertise-address=127.0.0.1".to_string(),
            format!("--audit-policy-file={}", audit_policy.display()),
            format!("--audit-log-path={}", dir.path().join("audit.log").display()),
            "--audit-log-format=json".to_string(),
            "--audit-log-mode=blocking".to_string(),
        ];
        let mut apiserver_args = apiserver_args;
        apiserver_args.extend(front_proxy.apiserver_flags());
        let apiserver_launch = Launch {
            name: "kube-apiserver",
            program: apiserver_bin.to_path_buf(),
            args: apiserver_args,
            log: dir.path().join("kube-apiserver.log"),
            pidfile: dir.path().join("kube-apiserver.pid"),
        };
        let apiserver = apiserver_launch.spawn(false);

        let url = format!("https://127.0.0.1:{api_port}");
        // The apiserver writes its self-signed serving certificate (and the CA that signed it)
        // here at start-up; clients trust that file.
        let ca_path = cert_dir.join("apiserver.crt");
        let (mut etcd, mut apiserver) = (etcd, apiserver);
        let ready = wait_ready(&url, &ca_path, &mut [&mut etcd, &mut apiserver]).await;
        if let Err(why) = ready {
            let failure = format!(
                "{why}\n--- kube-apiserver log (tail) ---\n{}\n--- etcd log (tail) ---\n{}",
                apiserver.log_tail(8000),
                etcd.log_tail(4000)
            );
            return Err(failure);
        }
        let config = config_from_kubeconfig(&kubeconfig_yaml(&url, &ca_path, ADMIN_TOKEN))
            .await
            .map_err(|e| format!("the test kubeconfig does not load: {e}"))?;
        Ok(KubeCluster {
            apiserver: Mutex::new(apiserver),
            etcd: Mutex::new(etcd),
            apiserver_launch,
            etcd_launch,
            url,
            ca_path,
            config,
            started_in: started.elapsed(),
            front_proxy_ca: front_proxy.ca,
            _keeper: keeper,
            dir,
            etcd_dir,
        })
    }

    // -----------------------------------------------------------------------------------------
    // Faults

    fn assert_own(&self, fault: &str) {
        let shared = SHARED.get().is_some_and(|shared| std::ptr::eq(shared, self));
        assert!(!shared, "{fault} on the shared cluster would break every other test: use KubeCluster::start()");
    }

    /// Kills the API server (SIGKILL) and waits until it is gone. Its clients see their
    /// connections closed, then refused.
    pub fn kill_apiserver(&self) {
        self.assert_own("kill_apiserver");
        self.apiserver.lock().unwrap_or_else(|e| e.into_inner()).stop();
    }

    /// Starts the API server again with the same flags (same etcd, port, certificates, tokens
    /// and audit log) and waits until `/readyz` answers 200. Returns when it did. Panics with
    /// the logs when it does not come up within `READY_WITHIN`.
    pub async fn start_apiserver(&self) -> Instant {
        self.assert_own("start_apiserver");
        let mut apiserver = self.apiserver_launch.spawn(true);
        let ready = wait_ready(&self.url, &self.ca_path, &mut [&mut apiserver]).await;
        *self.apiserver.lock().unwrap_or_else(|e| e.into_inner()) = apiserver;
        if let Err(why) = ready {
            panic!("the restarted kube-apiserver did not come up: {why}\n{}", self.logs());
        }
        Instant::now()
    }

    /// `kill_apiserver`, `down` of nothing, `start_apiserver`.
    pub async fn restart_apiserver(&self, down: Duration) -> Instant {
        self.kill_apiserver();
        tokio::time::sleep(down).await;
        self.start_apiserver().await
    }

    /// Stops etcd (SIGSTOP): its sockets stay open and nothing answers, so the API server's
    /// requests hang, as with a stalled disk or a partition.
    pub fn pause_etcd(&self) {
        self.assert_own("pause_etcd");
        self.etcd.lock().unwrap_or_else(|e| e.into_inner()).signal(libc::SIGSTOP);
    }

    /// Lets a paused etcd go on (SIGCONT).
    pub fn resume_etcd(&self) {
        self.assert_own("resume_etcd");
        self.etcd.lock().unwrap_or_else(|e| e.into_inner()).signal(libc::SIGCONT);
    }

    /// Kills etcd (SIGKILL) and waits until it is gone; its data directory stays.
    pub fn kill_etcd(&self) {
        self.assert_own("kill_etcd");
        self.etcd.lock().unwrap_or_else(|e| e.into_inner()).stop();
    }

    /// Starts etcd again on the same data directory and ports, then waits until the API server
    /// is ready again (it reconnects by itself).
    pub async fn start_etcd(&self) -> Instant {
        self.assert_own("start_etcd");
        let etcd = self.etcd_launch.spawn(true);
        *self.etcd.lock().unwrap_or_else(|e| e.into_inner()) = etcd;
        self.wait_apiserver_ready().await
    }

    /// Waits until `/readyz` answers 200 (at most `READY_WITHIN`) and returns when it did.
    pub async fn wait_apiserver_ready(&self) -> Instant {
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            // The processes are checked between polls, without holding their locks across one.
            let exited = [&self.etcd, &self.apiserver].iter().find_map(|process| {
                let mut process = process.lock().unwrap_or_else(|e| e.into_inner());
                process.exited().map(|status| format!("{} exited ({status})", process.name))
            });
            if let Some(exited) = exited {
                panic!("{exited}\n{}", self.logs());
            }
            if readyz_ok(&self.url, &self.ca_path).await {
                return Instant::now();
            }
            assert!(Instant::now() < deadline, "the API server is not ready after {READY_WITHIN:?}\n{}", self.logs());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The PEM file of the apiserver's self-signed serving certificate and its CA.
    pub fn ca_path(&self) -> &Path {
        &self.ca_path
    }

    /// The CA that signed the client certificate (CN `front-proxy-client`) the API server's
    /// aggregator presents when it proxies a request to an extension API server; such a server
    /// trusts the `X-Remote-User`/`X-Remote-Group` headers of connections with that certificate.
    pub fn front_proxy_ca_path(&self) -> &Path {
        &self.front_proxy_ca
    }

    /// How long `start` took, for reports.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// The tails of the apiserver and etcd logs, for failure messages.
    pub fn logs(&self) -> String {
        let tail = |w: &Mutex<Watched>| w.lock().map(|w| w.log_tail(8000)).unwrap_or_default();
        format!(
            "--- kube-apiserver log (tail) ---\n{}\n--- etcd log (tail) ---\n{}",
            tail(&self.apiserver),
            tail(&self.etcd)
        )
    }

    /// Every request the API server has logged so far made by `user`, directly (token) or
    /// through impersonation (`client_as`), in the order they were answered (a watch: started).
    /// The audit log is written before the answer is sent, so a request whose answer arrived is
    /// in it; one still waiting for etcd is not, yet.
    pub fn requests_by(&self, user: &str) -> Vec<AuditedRequest> {
        let text = std::fs::read_to_string(self.dir.path().join("audit.log")).unwrap_or_default();
        let mut seen = std::collections::HashSet::new();
        let mut requests = Vec::new();
        for line in text.lines() {
            let Ok(event) = serde_json::from_str::<Value>(line) else { continue };
            let s = |pointer: &str| event.pointer(pointer).and_then(Value::as_str).unwrap_or_default().to_string();
            let who = match event.pointer("/impersonatedUser/username") {
                Some(name) => name.as_str().unwrap_or_default().to_string(),
                None => s("/user/username"),
            };
            // A watch logs ResponseStarted and later ResponseComplete under one audit ID.
            if who != user || !seen.insert(s("/auditID")) {
                continue;
            }
            let time = |pointer: &str| {
                s(pointer).parse::<k8s_openapi::jiff::Timestamp>().map(SystemTime::from).unwrap_or(UNIX_EPOCH)
            };
            requests.push(AuditedRequest {
                received: time("/requestReceivedTimestamp"),
                answered: time("/stageTimestamp"),
                verb: s("/verb"),
                resource: s("/objectRef/resource"),
                subresource: s("/objectRef/subresource"),
                namespace: s("/objectRef/namespace"),
                name: s("/objectRef/name"),
                uri: s("/requestURI"),
                code: event.pointer("/responseStatus/code").and_then(Value::as_u64).unwrap_or(0) as u16,
            });
        }
        requests
    }

    /// The admin's client configuration.
    pub fn config(&self) -> Config {
        self.config.clone()
    }

    /// A configuration that authenticates with `token` instead of the admin's.
    pub fn config_for(&self, token: &str) -> Config {
        let mut config = self.config.clone();
        config.auth_info = serde_json::from_value(json!({ "token": token })).expect("an AuthInfo with a token");
        config
    }

    /// A client for `admin` (`system:masters`).
    pub fn client(&self) -> Client {
        Client::try_from(self.config()).expect("a client for the test cluster")
    }

    /// A client that authenticates with `token` (see `RESTRICTED_USERS`).
    pub fn client_for(&self, token: &str) -> Client {
        Client::try_from(self.config_for(token)).expect("a client for the test cluster")
    }

    /// A client acting as `user` (no groups): the admin impersonates it, and RBAC decides as for
    /// `user`. Any name works, so a test can use one no other test grants anything to.
    pub fn client_as(&self, user: &str) -> Client {
        let mut config = self.config();
        config.auth_info.impersonate = Some(user.to_string());
        Client::try_from(config).expect("a client for the test cluster")
    }

    /// Writes a kubeconfig (one cluster, one user with `token`, one current context named
    /// `test`) that `watermarkd --kubeconfig PATH` and `KUBECONFIG=PATH` can use.
    pub fn write_kubeconfig(&self, path: &Path, token: &str) {
        std::fs::write(path, kubeconfig_yaml(&self.url, &self.ca_path, token))
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    }

    /// The same kubeconfig as text.
    pub fn kubeconfig(&self, token: &str) -> String {
        kubeconfig_yaml(&self.url, &self.ca_path, token)
    }

    // -----------------------------------------------------------------------------------------
    // Objects

    pub async fn create_namespace(&self, name: &str) {
        let namespaces: Api<Namespace> = Api::all(self.client());
        let ns: Namespace = serde_json::from_value(json!({ "metadata": { "name": name } })).expect("namespace");
        namespaces.create(&PostParams::default(), &ns).await.unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
    }

    /// Creates a namespace named `PREFIX-N-XXXX`, unique within the cluster, and returns the name.
    pub async fn unique_namespace(&self, prefix: &str) -> String {
        let n = UNIQUE.fetch_add(1, Ordering::Relaxed);
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
        let name = format!("{prefix}-{n}-{:04x}", (nanos ^ std::process::id()) & 0xffff);
        self.create_namespace(&name).await;
        name
    }

    /// A Deployment with `spec.replicas` = `replicas`, selector and pod labels `app: NAME`.
    pub async fn create_deployment(&self, namespace: &str, name: &str, replicas: i32) -> Deployment {
        let api: Api<Deployment> = Api::namespaced(self.client(), namespace);
        let object: Deployment = serde_json::from_value(json!({
            "metadata": { "name": name },
            "spec": workload_spec(name, replicas),
        }))
        .expect("deployment");
        api.create(&PostParams::default(), &object).await.unwrap_or_else(|e| panic!("create deployment {name}: {e}"))
    }

    /// A StatefulSet like `create_deployment`'s, with `serviceName` = NAME.
    pub async fn create_statefulset(&self, namespace: &str, name: &str, replicas: i32) -> StatefulSet {
        let api: Api<StatefulSet> = Api::namespaced(self.client(), namespace);
        let mut spec = workload_spec(name, replicas);
        spec["serviceName"] = json!(name);
        let object: StatefulSet =
            serde_json::from_value(json!({ "metadata": { "name": name }, "spec": spec })).expect("statefulset");
        api.create(&PostParams::default(), &object).await.unwrap_or_else(|e| panic!("create statefulset {name}: {e}"))
    }

    /// A ReplicaSet like `create_deployment`'s.
    pub async fn create_replicaset(&self, namespace: &str, name: &str, replicas: i32) -> ReplicaSet {
        let api: Api<ReplicaSet> = Api::namespaced(self.client(), namespace);
        let object: ReplicaSet =
            serde_json::from_value(json!({ "metadata": { "name": name }, "spec": workload_spec(name, replicas) }))
                .expect("replicaset");
        api.create(&PostParams::default(), &object).await.unwrap_or_else(|e| panic!("create replicaset {name}: {e}"))
    }

    /// Sets `status.replicas` and `status.readyReplicas` of an apps/v1 `Deployment`,
    /// `StatefulSet` or `ReplicaSet` through its status subresource, as its controller would.
    pub async fn set_workload_status(&self, kind: &str, namespace: &str, name: &str, replicas: i32, ready: i32) {
        let resource = apps_v1(kind);
        let mut status = json!({ "replicas": replicas, "readyReplicas": ready });
        if kind == "Deployment" {
            status["updatedReplicas"] = json!(replicas);
            status["availableReplicas"] = json!(ready);
        }
        if kind == "StatefulSet" {
            status["currentReplicas"] = json!(replicas);
            status["updatedReplicas"] = json!(replicas);
        }
        self.patch_status(&resource, namespace, name, status).await;
    }

    /// `spec.replicas` of an apps/v1 workload (-1 when it has none).
    pub async fn spec_replicas(&self, kind: &str, namespace: &str, name: &str) -> i64 {
        let api: Api<DynamicObject> = Api::namespaced_with(self.client(), namespace, &apps_v1(kind));
        let object = api.get(name).await.unwrap_or_else(|e| panic!("get {kind} {namespace}/{name}: {e}"));
        object.data["spec"]["replicas"].as_i64().unwrap_or(-1)
    }

    /// Merge-patches the status subresource of any namespaced object with `status`.
    pub async fn patch_status(&self, resource: &ApiResource, namespace: &str, name: &str, status: Value) -> Value {
        let api: Api<DynamicObject> = Api::namespaced_with(self.client(), namespace, resource);
        let patched = api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(json!({ "status": status })))
            .await
            .unwrap_or_else(|e| panic!("patch status of {} {namespace}/{name}: {e}", resource.kind));
        serde_json::to_value(patched).expect("object as JSON")
    }

    /// A pod with `labels`, Ready or not (set through its status subresource; nothing runs it).
    pub async fn create_pod(&self, namespace: &str, name: &str, labels: &BTreeMap<String, String>, ready: bool) -> Pod {
        let api: Api<Pod> = Api::namespaced(self.client(), namespace);
        let pod: Pod = serde_json::from_value(json!({
            "metadata": { "name": name, "labels": labels },
            "spec": { "containers": [{ "name": "app", "image": "registry.invalid/app:1" }] },
        }))
        .expect("pod");
        api.create(&PostParams::default(), &pod).await.unwrap_or_else(|e| panic!("create pod {name}: {e}"));
        self.set_pod_ready(namespace, name, ready).await
    }

    /// Sets the pod's phase to Running and its Ready condition to `ready`.
    pub async fn set_pod_ready(&self, namespace: &str, name: &str, ready: bool) -> Pod {
        let api: Api<Pod> = Api::namespaced(self.client(), namespace);
        let status = if ready { "True" } else { "False" };
        let patch = json!({ "status": {
            "phase": "Running",
            "conditions": [{ "type": "Ready", "status": status }],
        }});
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .unwrap_or_else(|e| panic!("set pod {name} ready={ready}: {e}"))
    }

    /// Creates a CRD and waits until it is established and its kinds are served (discovery
    /// lists them), so objects can be created right away.
    pub async fn create_crd(&self, crd: &CustomResourceDefinition) -> CustomResourceDefinition {
        let api: Api<CustomResourceDefinition> = Api::all(self.client());
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.create(&PostParams::default(), crd).await.unwrap_or_else(|e| panic!("create CRD {name}: {e}"));
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let current = api.get(&name).await.unwrap_or_else(|e| panic!("get CRD {name}: {e}"));
            let established = current
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Established" && c.status == "True"));
            if established && self.crd_served(&current).await {
                return current;
            }
            assert!(Instant::now() < deadline, "CRD {name} not established and served after 30 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn crd_served(&self, crd: &CustomResourceDefinition) -> bool {
        let client = self.client();
        for version in crd.spec.versions.iter().filter(|v| v.served) {
            let gv = format!("{}/{}", crd.spec.group, version.name);
            match client.list_api_group_resources(&gv).await {
                Ok(list) if list.resources.iter().any(|r| r.kind == crd.spec.names.kind) => {}
                _ => return false,
            }
        }
        true
    }

    /// Grants `user` the `rules` in `namespace` with a Role and a RoleBinding named
    /// `NAME` (replacing nothing: use a new name per grant). Each rule is
    /// `(api_groups, resources, verbs)`, e.g. `(&["apps"], &["deployments/scale"], &["patch"])`.
    pub async fn grant(&self, namespace: &str, name: &str, user: &str, rules: &[(&[&str], &[&str], &[&str])]) {
        let rules: Vec<PolicyRule> = rules
            .iter()
            .map(|(groups, resources, verbs)| PolicyRule {
                api_groups: Some(groups.iter().map(|s| s.to_string()).collect()),
                resources: Some(resources.iter().map(|s| s.to_string()).collect()),
                verbs: verbs.iter().map(|s| s.to_string()).collect(),
                ..PolicyRule::default()
            })
            .collect();
        let roles: Api<Role> = Api::namespaced(self.client(), namespace);
        let role: Role = serde_json::from_value(json!({ "metadata": { "name": name }, "rules": rules })).expect("role");
        roles.create(&PostParams::default(), &role).await.unwrap_or_else(|e| panic!("create role {name}: {e}"));
        let bindings: Api<RoleBinding> = Api::namespaced(self.client(), namespace);
        let binding: RoleBinding = serde_json::from_value(json!({
            "metadata": { "name": name },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name },
            "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user }],
        }))
        .expect("role binding");
        bindings
            .create(&PostParams::default(), &binding)
            .await
            .unwrap_or_else(|e| panic!("create role binding {name}: {e}"));
    }
}

/// One request from the API server's audit log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditedRequest {
    /// When the API server received it (wall clock; the API server runs on this host).
    pub received: SystemTime,
    /// When the API server answered it, after the change (if any) was stored in etcd; for a
    /// watch, when it started streaming.
    pub answered: SystemTime,
    /// `get`, `list`, `watch`, `create`, `patch`, `update`, ...
    pub verb: String,
    /// `deployments`, `pods`, ... (empty for non-resource URLs such as discovery).
    pub resource: String,
    /// `scale`, `status` or empty.
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    pub uri: String,
    pub code: u16,
}

/// The `ApiResource` of an apps/v1 workload kind.
pub fn apps_v1(kind: &str) -> ApiResource {
    match kind {
        "Deployment" => ApiResource::erase::<Deployment>(&()),
        "StatefulSet" => ApiResource::erase::<StatefulSet>(&()),
        "ReplicaSet" => ApiResource::erase::<ReplicaSet>(&()),
        other => panic!("not an apps/v1 workload kind: {other}"),
    }
}

fn workload_spec(name: &str, replicas: i32) -> Value {
    json!({
        "replicas": replicas,
        "selector": { "matchLabels": { "app": name } },
        "template": {
            "metadata": { "labels": { "app": name } },
            "spec": { "containers": [{ "name": "app", "image": "registry.invalid/app:1" }] },
        },
    })
}

fn kubeconfig_yaml(url: &str, ca_path: &Path, token: &str) -> String {
    // JSON is YAML, and serde_json quotes every string correctly.
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": "test", "cluster": {
            "server": url,
            "certificate-authority": ca_path.display().to_string(),
        }}],
        "users": [{ "name": "test", "user": { "token": token } }],
        "contexts": [{ "name": "test", "context": { "cluster": "test", "user": "test", "namespace": "default" } }],
        "current-context": "test",
    });
    serde_json::to_string_pretty(&config).expect("kubeconfig as JSON")
}

async fn config_from_kubeconfig(yaml: &str) -> Result<Config, String> {
    let kubeconfig = Kubeconfig::from_yaml(yaml).map_err(|e| e.to_string())?;
    Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await.map_err(|e| e.to_string())
}

/// Whether `/readyz` answers 200 right now.
async fn readyz_ok(url: &str, ca_path: &Path) -> bool {
    let Ok(pem) = std::fs::read(ca_path) else { return false };
    let Ok(certs) = reqwest::Certificate::from_pem_bundle(&pem) else { return false };
    let Ok(client) = reqwest::Client::builder().tls_certs_only(certs).timeout(Duration::from_secs(2)).build() else {
        return false;
    };
    matches!(
        client.get(format!("{url}/readyz")).bearer_auth(ADMIN_TOKEN).send().await,
        Ok(resp) if resp.status().is_success()
    )
}

/// Polls `/readyz` every 50 ms until it answers 200, up to `READY_WITHIN`. Fails early when a process
/// exits.
async fn wait_ready(url: &str, ca_path: &Path, processes: &mut [&mut Watched]) -> Result<(), String> {
    let deadline = Instant::now() + READY_WITHIN;
    let mut last = String::from("no answer yet");
    let mut client: Option<reqwest::Client> = None;
    loop {
        for process in processes.iter_mut() {
            if let Some(status) = process.exited() {
                return Err(format!("{} exited ({status}) before the apiserver was ready", process.name));
            }
        }
        // The certificate appears a moment after the apiserver starts.
        if client.is_none() {
            if let Ok(pem) = std::fs::read(ca_path) {
                let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| format!("apiserver.crt: {e}"))?;
                client = Some(
                    reqwest::Client::builder()
                        .tls_certs_only(certs)
                        .timeout(Duration::from_secs(2))
                        .build()
                        .map_err(|e| format!("readiness client: {e}"))?,
                );
            }
        }
        if let Some(client) = &client {
            match client.get(format!("{url}/readyz")).bearer_auth(ADMIN_TOKEN).send().await {
                Ok(resp) if resp.status().is_success() => return Ok(()),
                Ok(resp) => {
                    last = format!("/readyz answered {}: {}", resp.status(), resp.text().await.unwrap_or_default())
                }
                Err(e) => last = format!("/readyz: {e}"),
            }
        }
        if Instant::now() > deadline {
            return Err(format!("not ready after {READY_WITHIN:?}; last: {last}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A namespaced custom resource `Widget` in `group` (version v1) with a `/scale` subresource:
/// `spec.size` is its desired count, `status.count` the current one, `status.podSelector` its
/// pods' selector (and `status.readyReplicas`, when set, the ready count).
pub fn widget_crd(group: &str) -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "metadata": { "name": format!("widgets.{group}") },
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": { "plural": "widgets", "singular": "widget", "kind": "Widget" },
            "versions": [{
                "name": "v1",
                "served": true,
                "storage": true,
                "schema": { "openAPIV3Schema": { "type": "object", "x-kubernetes-preserve-unknown-fields": true } },
                "subresources": {
                    "status": {},
                    "scale": {
                        "specReplicasPath": ".spec.size",
                        "statusReplicasPath": ".status.count",
                        "labelSelectorPath": ".status.podSelector",
                    },
                },
            }],
        },
    }))
    .expect("CRD")
}
