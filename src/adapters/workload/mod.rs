//! Kubernetes workloads (the autoscalers' targets): read scale and readiness, write replicas.
//!
//! - [`connect`] builds a client from `--kubeconfig` / `KUBECONFIG` / in-cluster settings.
//! - [`Workloads`] keeps watch-backed stores of the referenced kinds and serves
//!   [`Workloads::read`] from them; [`Workloads::scale`] patches `/scale` with the
//!   resourceVersion the decision was based on, so a concurrent change is a
//!   [`WorkloadError::Conflict`] rather than an overwrite.
//!
//! # How a target is read
//! The kind is resolved through discovery from `apiVersion` + `kind` (so custom resources work;
//! once per kind, however many targets) and must have a `/scale` subresource. Every object of
//! that kind in the target's namespace is kept in one store (kube's reflector store, with a
//! compact object: see `compact.rs`), shared by all targets of that kind and namespace; the
//! store runs while at least one of them is watched. Then:
//! - Built-in workloads (apps/v1 Deployment, StatefulSet, ReplicaSet; v1 ReplicationController):
//!   their `/scale` maps to fixed fields, read straight from the stored object. A read is a
//!   lookup; no request.
//! - Other kinds (custom resources): the `/scale` field paths live in the CRD, which discovery
//!   does not return (and reading CRDs would need more RBAC). So `/scale` is fetched when a read
//!   finds the stored object at a version it has not fetched `/scale` for, never again for the
//!   same version. A failed fetch is retried on a backoff (1 s doubling to 60 s; at once when
//!   the object changes); reads in between get its error.
//! - Ready replicas: the object's `status.readyReplicas` when it has one (built-in kinds
//!   always do; the API omits it at 0). Otherwise the pods matching the scale's label selector
//!   in the target's namespace are counted from a pod store for that selector, shared by the
//!   targets with the same selector; without a selector, `ready_replicas` is `None`.
//!
//! No task, channel or watch per target: a target is a few words in its store's entry, plus
//! small caches for custom kinds and right after a write. See `watch.rs` for the watches and
//! what happens on errors.
//!
//! # Where the code is
//! - `mod.rs` (here): [`connect`], the public types ([`Workloads`], [`ScaleReading`]) and
//!   what the other files share (`Context`, `describe`, `retry_delay`).
//! - `registry.rs`: which stores exist and who uses them: the workload and pod stores, their
//!   tasks, the per-target bookkeeping, [`Workloads::watch`] and [`Workloads::unwatch`].
//! - `discovery.rs`: resolving `apiVersion` + `kind` to a resource with a `/scale` (a store's
//!   key names the kind it resolves).
//! - `reads.rs`: [`Workloads::read`] from the stores, filling and using the read caches of
//!   `cache.rs` (the `/scale` of custom kinds per version, our last write until the store shows
//!   it), and ready pods.
//! - `writes.rs`: [`Workloads::scale`] and [`Workloads::current_version`].
//! - `compact.rs`, `object.rs`: what a store keeps of an object, and how its fields are read;
//!   `watch.rs`: the watches; `error.rs`: [`WorkloadError`].
//!
//! # RBAC the daemon needs, per target namespace
//! `list` and `watch` on the target resource; `get` (custom kinds) and `patch` on its `/scale`;
//! `list` and `watch` on pods only for targets without `status.readyReplicas`.

mod cache;
mod compact;
mod discovery;
mod error;
mod object;
mod reads;
mod registry;
pub(crate) mod watch;
mod writes;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use watermarkd_engine::Timestamp;

pub use error::WorkloadError;

use crate::domain::rules::TargetRef;
use crate::domain::state::Marks;
use discovery::{KindKey, Resolved};
use registry::Registry;
pub(crate) use watch::Retrying as RetryingWatch;
pub use watch::WatchHealth;

/// The field manager of scale writes; [`Marks::scaled_at`] reads its `managedFields` entry.
pub(crate) const FIELD_MANAGER: &str = "watermarkd";
/// The annotation where versions before the state ConfigMaps (`crate::adapters::state_store`) kept
/// a rules-file autoscaler's state on its target. Still read (the cache keeps it), never written.
pub const STATE_ANNOTATION: &str = "watermarkd.io/state";

/// Builds a client. Where the settings come from, first match wins:
/// 1. `kubeconfig` (`--kubeconfig`), with `context` (`--context`) or its current context;
/// 2. the `KUBECONFIG` variable, with `context`;
/// 3. in-cluster (the pod's service account) when `KUBERNETES_SERVICE_HOST` is set and no
///    `context` was asked for;
/// 4. `~/.kube/config`, with `context`.
///
/// The client makes each request once. kube's default retry layer answers a 429, 503 or 504
/// by waiting the `Retry-After` the API server asks for (10 s for a custom resource it is not
/// serving yet, as right after a restart) and retries up to 15 times, backing off up to
/// 1000 s: hidden waits that held the WPA watch for 10 s after an API server restart and could
/// hold a lease renewal past its deadline. Every caller retries on its own bounded schedule
/// instead (watches at most 5 s apart, evaluations at their interval, the Lease at its retry
/// period).
pub async fn connect(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<Client, WorkloadError> {
    crate::adapters::backend::ensure_crypto_provider();
    let mut config = client_config(kubeconfig, context).await?;
    config.default_retry = false;
    Client::try_from(config).map_err(|e| WorkloadError::Config(e.to_string()))
}

async fn client_config(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<Config, WorkloadError> {
    let options = KubeConfigOptions { context: context.map(str::to_string), ..KubeConfigOptions::default() };
    let config = if let Some(path) = kubeconfig {
        let file =
            Kubeconfig::read_from(path).map_err(|e| WorkloadError::Config(format!("{}: {e}", path.display())))?;
        Config::from_custom_kubeconfig(file, &options)
            .await
            .map_err(|e| WorkloadError::Config(format!("{}: {e}", path.display())))?
    } else if context.is_none()
        && std::env::var_os("KUBECONFIG").is_none()
        && std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
    {
        Config::incluster().map_err(|e| WorkloadError::Config(format!("in-cluster configuration: {e}")))?
    } else {
        Config::from_kubeconfig(&options).await.map_err(|e| WorkloadError::Config(format!("kubeconfig: {e}")))?
    };
    Ok(config)
}

/// The scale of a target as the cache last saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScaleReading {
    /// Desired replicas (`/scale` `spec.replicas`).
    pub spec_replicas: u32,
    /// Current replicas (`/scale` `status.replicas`).
    pub status_replicas: u32,
    /// Ready replicas: `status.readyReplicas`, or ready pods counted through the selector, or
    /// `None` when neither is available.
    pub ready_replicas: Option<u32>,
    /// The label selector of the target's pods (`/scale` `status.selector`), if it has one.
    pub selector: Option<String>,
    /// The object's resourceVersion this reading is from. [`Workloads::scale`] sends it back.
    pub resource_version: String,
    /// watermarkd's persisted state and last scale write, from the object's metadata.
    pub marks: Marks,
    /// When this process first saw `spec_replicas` at its current value, if it saw another
    /// value before (`None` when the value came with the first reading: its age is unknown).
    /// A write can land long after it was sent (etcd stalled, then resumed), so this, not the
    /// write's own time, is when a change became visible.
    pub spec_changed_at: Option<watermarkd_engine::Timestamp>,
}

/// What the store tasks share. Holds no registry, so dropping `Workloads` stops them.
struct Context {
    client: Client,
    health: Arc<WatchHealth>,
    /// Discovery results by (apiVersion, kind). Only kinds that resolved with a `/scale`.
    kinds: Mutex<HashMap<KindKey, Arc<Resolved>>>,
    /// Held while a kind is being discovered: the stores of one kind in many namespaces make
    /// one discovery request, not one each.
    resolving: tokio::sync::Mutex<()>,
}

struct Inner {
    context: Arc<Context>,
    registry: Mutex<Registry>,
    sync_timeout: Duration,
}

/// The registry of watched targets. Cheap to clone; every clone shares the stores. Dropping
/// the last clone stops every watch.
#[derive(Clone)]
pub struct Workloads {
    inner: Arc<Inner>,
}

impl Workloads {
    /// How long `read` waits for a target's first answer from the API server by default.
    pub const DEFAULT_SYNC_TIMEOUT: Duration = Duration::from_secs(10);

    pub fn new(client: Client) -> Self {
        Self::with_sync_timeout(client, Self::DEFAULT_SYNC_TIMEOUT)
    }

    /// Like `new`, with how long `read` waits for a newly watched target's first state.
    pub fn with_sync_timeout(client: Client, sync_timeout: Duration) -> Self {
        let context = Arc::new(Context {
            client,
            health: Arc::new(WatchHealth::default()),
            kinds: Mutex::default(),
            resolving: tokio::sync::Mutex::new(()),
        });
        Workloads { inner: Arc::new(Inner { context, registry: Mutex::default(), sync_timeout }) }
    }
}

fn now() -> Timestamp {
    Timestamp::from_system_time(std::time::SystemTime::now())
}

fn not_found(target: &TargetRef) -> WorkloadError {
    WorkloadError::NotFound {
        kind: target.kind.to_string(),
        namespace: target.namespace.to_string(),
        name: target.name.to_string(),
    }
}

fn describe(target: &TargetRef) -> String {
    format!("{} {}/{} ({})", target.kind, target.namespace, target.name, target.api_version)
}

/// Retry delays after a request of a store or target failed (discovery, `/scale` of a custom
/// kind): 1 s doubling to 60 s. Watches retry on their own policy (`watch.rs`).
fn retry_delay(attempt: u32) -> Duration {
    Duration::from_secs(1u64 << attempt.min(6)).min(Duration::from_secs(60))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use kube::api::{Api, ApiResource, DynamicObject};
    use kube::runtime::reflector::{self, ObjectRef};
    use kube::runtime::watcher;
    use kube::Resource;
    use serde_json::json;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::compact::{compact, StoredWorkload, WireWorkload};
    use super::object::KindPaths;
    use super::*;

    fn t(ms: i64) -> Timestamp {
        Timestamp::from_unix_millis(ms)
    }

    #[test]
    fn a_failed_request_is_retried_after_one_second_doubling_to_a_minute() {
        let delays: Vec<u64> = (0..9).map(|n| retry_delay(n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
    }

    /// A Deployment as a cluster holds it: managed fields, a pod template, conditions.
    fn deployment(i: usize) -> serde_json::Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {
                "name": format!("web-{i}"), "namespace": "bench", "uid": format!("5c1e0f5e-0000-4000-8000-{i:012}"),
                "resourceVersion": format!("{}", 100_000 + i), "generation": 3,
                "labels": { "app": format!("web-{i}") },
                "annotations": { "deployment.kubernetes.io/revision": "1" },
                "managedFields": [
                    { "manager": "kubectl", "operation": "Update", "time": "2024-01-01T00:00:00Z",
                      "fieldsType": "FieldsV1", "fieldsV1": { "f:spec": { "f:replicas": {}, "f:template": {} } } },
                    { "manager": "watermarkd", "operation": "Update", "subresource": "scale",
                      "time": "2024-01-02T00:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": { "f:spec": { "f:replicas": {} } } },
                ],
            },
            "spec": {
                "replicas": 3,
                "selector": { "matchLabels": { "app": format!("web-{i}") } },
                "template": {
                    "metadata": { "labels": { "app": format!("web-{i}") } },
                    "spec": { "containers": [{ "name": "web", "image": "registry.k8s.io/pause:3.9",
                        "resources": { "requests": { "cpu": "10m", "memory": "16Mi" } } }] },
                },
            },
            "status": { "replicas": 3, "readyReplicas": 3, "updatedReplicas": 3, "availableReplicas": 3,
                "conditions": [{ "type": "Available", "status": "True", "reason": "MinimumReplicasAvailable" }] },
        })
    }

    const OBJECTS: usize = 10_000;

    /// The cost of one stored Deployment, measured as the heap a store of 10,000 keeps (the
    /// map, its keys, the objects), and what `ObjectRef`, the key, costs inline.
    #[test]
    fn a_stored_deployment_costs_a_few_hundred_bytes() {
        let wire: Vec<String> = (0..OBJECTS).map(|i| deployment(i).to_string()).collect();
        let paths = KindPaths::Builtin(object::SelectorShape::LabelSelector);
        let (bytes, allocations, store) = heap::retained(|| {
            let (reader, mut writer) = reflector::store::<StoredWorkload>();
            for text in &wire {
                let object: WireWorkload = serde_json::from_str(text).expect("decodes");
                let name = object.meta().name.clone().expect("named");
                let previous = reader.get(&ObjectRef::new(&name));
                let stored = compact(paths, object, previous.as_deref(), t(1)).expect("named");
                writer.apply_watcher_event(&watcher::Event::Apply(stored));
            }
            (reader, writer)
        });
        assert_eq!(store.0.len(), OBJECTS);
        let per_object = bytes / OBJECTS as isize;
        let whole: DynamicObject = serde_json::from_str(&wire[0]).expect("decodes");
        let (whole_bytes, _, whole) = heap::retained(|| Arc::new(whole.clone()));
        drop(whole);
        println!(
            "per stored Deployment: {per_object} bytes in {:.1} allocations (StoredWorkload {} B inline, \
             ObjectRef key {} B inline; with an ApiResource dynamic type it would be {} B plus five Strings); \
             one DynamicObject of the same Deployment: {whole_bytes} bytes",
            allocations as f64 / OBJECTS as f64,
            std::mem::size_of::<StoredWorkload>(),
            std::mem::size_of::<ObjectRef<StoredWorkload>>(),
            std::mem::size_of::<ObjectRef<DynamicObject>>(),
        );
        assert!(per_object < 400, "{per_object} bytes per stored object");
    }

    /// The cost of one watched target: 10,000 targets of one kind in one namespace, through
    /// the public API (one store, its task, and the targets' entries).
    #[tokio::test(flavor = "current_thread")]
    async fn a_watched_target_costs_well_under_two_hundred_bytes() {
        let config = Config::new("http://127.0.0.1:9".parse().expect("a URL"));
        let client = Client::try_from(config).expect("a client");
        let targets: Vec<TargetRef> = (0..OBJECTS)
            .map(|i| TargetRef {
                api_version: "apps/v1".into(),
                kind: "Deployment".into(),
                namespace: "bench".into(),
                name: format!("web-{i}").into(),
            })
            .collect();
        let workloads = Workloads::new(client);
        let (bytes, allocations, ()) = heap::retained(|| targets.iter().for_each(|target| workloads.watch(target)));
        assert_eq!((workloads.len(), workloads.workload_watches()), (OBJECTS, 1));
        let per_target = bytes / OBJECTS as isize;
        println!(
            "per watched target: {per_target} bytes in {:.2} allocations (one store and its task included)",
            allocations as f64 / OBJECTS as f64
        );
        assert!(per_target < 200, "{per_target} bytes per target");
        let (freed, _, ()) = heap::retained(|| targets.iter().for_each(|target| workloads.unwatch(target)));
        assert!(workloads.is_empty());
        assert!(freed <= -bytes * 9 / 10, "unwatch gives it back: {freed} of {bytes}");
    }

    /// An API server that answers every request as kube-apiserver answers one for a custom
    /// resource it does not serve yet: 503 with `Retry-After: 10`.
    async fn unavailable_server() -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let requests = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&requests);
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let counted = Arc::clone(&counted);
                tokio::spawn(async move {
                    let mut buffer = Vec::new();
                    let mut chunk = [0u8; 4096];
                    while let Ok(n) = socket.read(&mut chunk).await {
                        if n == 0 {
                            return;
                        }
                        buffer.extend_from_slice(&chunk[..n]);
                        while let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                            buffer.drain(..end + 4);
                            counted.fetch_add(1, Ordering::SeqCst);
                            let body = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"the server is currently unable to handle the request","reason":"ServiceUnavailable","code":503}"#;
                            let answer = format!(
                                "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 10\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                                body.len()
                            );
                            if socket.write_all(answer.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (url, requests)
    }

    #[tokio::test]
    async fn a_503_with_retry_after_is_returned_at_once_not_waited_out_inside_the_client() {
        let (url, requests) = unavailable_server().await;
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("kubeconfig");
        let kubeconfig = json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{ "name": "c", "cluster": { "server": url } }],
            "users": [{ "name": "u", "user": { "token": "t" } }],
            "contexts": [{ "name": "c", "context": { "cluster": "c", "user": "u" } }],
            "current-context": "c",
        });
        std::fs::write(&path, kubeconfig.to_string()).expect("write kubeconfig");
        let client = connect(Some(&path), None).await.expect("a client");
        let api: Api<DynamicObject> =
            Api::all_with(client, &ApiResource::erase::<k8s_openapi::api::core::v1::Pod>(&()));
        let answer = tokio::time::timeout(Duration::from_secs(5), api.list(&kube::api::ListParams::default())).await;
        let Ok(result) = answer else { panic!("no answer within 5 s: the client waited out the Retry-After") };
        assert!(matches!(result, Err(kube::Error::Api(ref status)) if status.code == 503), "{result:?}");
        assert_eq!(requests.load(Ordering::SeqCst), 1, "one request, no hidden retries");
    }
}

/// Heap accounting for the memory tests: every allocation of the test binary goes through
/// here, and the bytes requested and freed on the current thread are summed while a thread
/// counts (so tests running beside it on other threads do not disturb its numbers).
#[cfg(test)]
mod heap {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    struct Counting;

    thread_local! {
        static COUNTING: Cell<bool> = const { Cell::new(false) };
        static NET: Cell<isize> = const { Cell::new(0) };
        static ALLOCATIONS: Cell<isize> = const { Cell::new(0) };
    }

    fn add(bytes: isize, allocations: isize) {
        if COUNTING.try_with(Cell::get).unwrap_or(false) {
            let _ = NET.try_with(|net| net.set(net.get() + bytes));
            let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + allocations));
        }
    }

    // SAFETY: every call is passed on to the system allocator unchanged; the counters are
    // const-initialised thread-locals without destructors, which never allocate.
    #[expect(unsafe_code, reason = "a global allocator is an unsafe trait; counting is how the test measures memory")]
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: as the caller promised for `layout`.
            let pointer = unsafe { System.alloc(layout) };
            if !pointer.is_null() {
                add(layout.size() as isize, 1);
            }
            pointer
        }

        unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
            // SAFETY: `pointer` came from `alloc` with this `layout`.
            unsafe { System.dealloc(pointer, layout) };
            add(-(layout.size() as isize), -1);
        }
    }

    #[global_allocator]
    static COUNTING_ALLOCATOR: Counting = Counting;

    /// Bytes and allocations still held from what `f` allocated on this thread, and `f`'s result.
    pub(super) fn retained<T>(f: impl FnOnce() -> T) -> (isize, isize, T) {
        let before = (NET.with(Cell::get), ALLOCATIONS.with(Cell::get));
        COUNTING.with(|c| c.set(true));
        let value = f();
        COUNTING.with(|c| c.set(false));
        (NET.with(Cell::get) - before.0, ALLOCATIONS.with(Cell::get) - before.1, value)
    }
}
