//! Watch-backed caches.
//!
//! Workloads: one watch per (resource, namespace), shared by every target in that namespace of
//! that kind, keeping only the referenced names. With a single referenced name the watch uses a
//! `metadata.name` field selector, so nothing else streams in. With several, it covers the
//! namespace rather than opening one watch per object, because kube's client speaks HTTP/1.1:
//! every watch holds a connection of its own, and 10,000 autoscalers must not mean 10,000 TLS
//! connections to the API server. The price is that the namespace's other objects of that kind
//! stream past (decoded, then dropped), and that a newly referenced name makes the watch list
//! again, since the objects seen so far were not kept. Additions are debounced so a start-up or
//! a reload that adds many names lists once.
//!
//! Pods: only for a target without `status.readyReplicas`, one watch with the scale's label
//! selector in the target's namespace, keeping a ready flag per pod name. Never cluster-wide.
//!
//! Errors: before the first good answer, and for 403 and 404 at any time (permission revoked,
//! resource type gone), an error replaces what the cache holds. Other errors (connection loss,
//! API server restarts) leave the last known state in place while kube's watcher retries with
//! backoff: a stale reading cannot cause a wrong write, because every write carries the
//! resourceVersion it was based on and a changed object answers 409.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Client, ResourceExt};
use tokio::sync::watch;

use super::error::{Request, WorkloadError};
use super::object::{pod_is_ready, KindPaths, ObjectInfo};

/// The retry policy of every watch: from 250 ms, doubling, jittered, at most 5 s apart, never
/// giving up. kube's default waits up to 30 s between tries and forgets its backoff only after
/// two quiet minutes, which left watches down for a minute after a 20 s API server restart; at
/// 5 s, every watch is back within a few seconds of the API server answering again. The cost
/// while it is down stays small: one watch per (kind, namespace), not per target.
pub fn backoff() -> watcher::ExponentialBackoff {
    backon::ExponentialBuilder::new()
        .with_min_delay(Duration::from_millis(250))
        // The jitter adds up to as much again.
        .with_max_delay(MAX_RETRY_DELAY / 2)
        .with_jitter()
        .without_max_times()
        .into()
}

/// The longest pause between two tries of a failed watch.
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(5);

/// Whether a watch failed with 410 Gone: the resourceVersion it resumed from is older than the
/// API server keeps (always so after an API server restart, whose watch cache starts at the
/// current revision). The watcher lists again; nothing is wrong with the API server.
pub fn is_gone(err: &watcher::Error) -> bool {
    match err {
        watcher::Error::WatchError(status) => status.code == 410,
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status.code == 410,
        _ => false,
    }
}

/// How long a failed watch waits before its next try: `backoff`, except after a 410 Gone,
/// which lists again at once. The API server that says 410 is answering, and the backoff grown
/// while it was down (up to 5 s) would only delay the re-list: after a restart, the first try
/// finds the API server back and gets the 410, and the re-list came another 2.5 to 5 s later.
/// At most one immediate re-list per `MAX_RETRY_DELAY`, so an API server answering 410 again
/// and again is retried on the backoff, not in a loop.
pub struct RetryPolicy {
    backoff: watcher::ExponentialBackoff,
    last_immediate: Option<tokio::time::Instant>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { backoff: backoff(), last_immediate: None }
    }
}

impl RetryPolicy {
    /// The pause before the next try after `err`, at `now`.
    pub fn delay_after(&mut self, err: &watcher::Error, now: tokio::time::Instant) -> Duration {
        let recently = self.last_immediate.is_some_and(|at| now.saturating_duration_since(at) < MAX_RETRY_DELAY);
        if is_gone(err) && !recently {
            self.last_immediate = Some(now);
            return Duration::ZERO;
        }
        self.backoff.next().unwrap_or(MAX_RETRY_DELAY)
    }

    /// After a good answer the next failure starts from the shortest pause again.
    pub fn reset(&mut self) {
        kube::runtime::utils::Backoff::reset(&mut self.backoff);
    }
}

/// A watcher stream retried with `RetryPolicy`, forever. `next` is cancel-safe: a pause cut
/// short by `select!` goes on at the next call.
pub struct Retrying<S> {
    stream: S,
    policy: RetryPolicy,
    resume_at: Option<tokio::time::Instant>,
}

impl<S, K> Retrying<S>
where
    S: WatchStreamExt<Item = Result<Event<K>, watcher::Error>> + Unpin,
{
    pub fn new(stream: S) -> Self {
        Retrying { stream, policy: RetryPolicy::default(), resume_at: None }
    }

    /// The next event or error; after an error, the next call first waits out the pause.
    pub async fn next(&mut self) -> Option<S::Item> {
        if let Some(at) = self.resume_at {
            tokio::time::sleep_until(at).await;
            self.resume_at = None;
        }
        let item = next(&mut self.stream).await?;
        match &item {
            Ok(_) => self.policy.reset(),
            Err(err) => {
                let now = tokio::time::Instant::now();
                self.resume_at = Some(now + self.policy.delay_after(err, now));
            }
        }
        Some(item)
    }
}

/// Whether any watch of the process is failing for a reason that passes (connection lost, API
/// server restarting, a resourceVersion too old): its cache may be stale, and `/readyz` says
/// so. A failing watch fails again at least every `MAX_RETRY_DELAY`, so a watch with no
/// failure for twice that is back (a watch that resumes needs not send any event to be
/// healthy). Refusals that stay (403, an unknown kind) are each autoscaler's own error, not
/// staleness, and are not counted.
#[derive(Debug)]
pub struct WatchHealth {
    origin: tokio::time::Instant,
    /// Milliseconds after `origin` of the last passing failure, plus one (0: none yet).
    last_failure: std::sync::atomic::AtomicU64,
}

impl Default for WatchHealth {
    fn default() -> Self {
        WatchHealth { origin: tokio::time::Instant::now(), last_failure: std::sync::atomic::AtomicU64::new(0) }
    }
}

impl WatchHealth {
    pub fn failed(&self) {
        let millis = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        self.last_failure.store(millis + 1, std::sync::atomic::Ordering::Release);
    }

    /// True while some watch failed within the last `2 x MAX_RETRY_DELAY`.
    pub fn failing(&self) -> bool {
        match self.last_failure.load(std::sync::atomic::Ordering::Acquire) {
            0 => false,
            at => {
                let since = Duration::from_millis(at - 1);
                self.origin.elapsed().saturating_sub(since) < MAX_RETRY_DELAY * 2
            }
        }
    }
}

/// `StreamExt::next` without a dependency on `futures`: `WatchStreamExt` has `Stream` as its
/// supertrait, so a bound on it makes `poll_next` callable here.
pub async fn next<S: WatchStreamExt + Unpin>(stream: &mut S) -> Option<S::Item> {
    std::future::poll_fn(|cx| Pin::new(&mut *stream).poll_next(cx)).await
}

/// Aborts the task when dropped, so dropping a cache entry stops its watch.
#[derive(Debug)]
pub(crate) struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The cached state of one watched object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ObjState {
    /// No complete list yet.
    Starting,
    Failed(WorkloadError),
    Missing,
    Present(ObjectInfo),
}

/// What names a group watch needs and where their states go.
#[derive(Default)]
struct Slots {
    /// Name -> (number of subscribers, state).
    by_name: HashMap<String, (usize, Arc<watch::Sender<ObjState>>)>,
}

/// The resource a group watches and how to read it.
#[derive(Clone, Debug)]
pub(crate) struct GroupSpec {
    pub resource: ApiResource,
    pub namespaced: bool,
    pub namespace: String,
    pub paths: KindPaths,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct GroupKey {
    group: String,
    version: String,
    plural: String,
    namespace: String,
}

impl GroupKey {
    fn of(spec: &GroupSpec) -> Self {
        GroupKey {
            group: spec.resource.group.clone(),
            version: spec.resource.version.clone(),
            plural: spec.resource.plural.clone(),
            namespace: if spec.namespaced { spec.namespace.clone() } else { String::new() },
        }
    }
}

struct GroupShared {
    slots: Mutex<Slots>,
    /// Bumped when a name is added: the watch lists again to learn its state.
    added: watch::Sender<u64>,
}

struct Group {
    shared: Arc<GroupShared>,
    _task: AbortOnDrop,
}

/// All group watches of one `Workloads`.
pub(crate) struct Groups {
    client: Client,
    health: Arc<WatchHealth>,
    groups: Mutex<HashMap<GroupKey, Group>>,
    /// How long additions must pause before the watch lists again.
    debounce: Duration,
}

/// A subscriber's hold on one name of a group; dropping it unsubscribes, and the last one out
/// stops the group's watch.
pub(crate) struct Subscription {
    groups: Arc<Groups>,
    key: GroupKey,
    name: String,
}

impl Groups {
    pub(crate) fn new(client: Client, health: Arc<WatchHealth>) -> Arc<Self> {
        Arc::new(Groups { client, health, groups: Mutex::new(HashMap::new()), debounce: Duration::from_millis(50) })
    }

    /// Subscribes to `name` in the group watch for `spec`, starting it if needed.
    pub(crate) fn subscribe(
        self: &Arc<Self>,
        spec: &GroupSpec,
        name: &str,
    ) -> (Subscription, watch::Receiver<ObjState>) {
        let key = GroupKey::of(spec);
        let mut groups = self.groups.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(group) = groups.get(&key) {
            let mut slots = group.shared.slots.lock().unwrap_or_else(PoisonError::into_inner);
            let receiver = match slots.by_name.get_mut(name) {
                Some((count, sender)) => {
                    *count += 1;
                    sender.subscribe()
                }
                None => {
                    let sender = Arc::new(watch::Sender::new(ObjState::Starting));
                    let receiver = sender.subscribe();
                    slots.by_name.insert(name.to_string(), (1, sender));
                    // The running watch has not kept this object: make it list again.
                    group.shared.added.send_modify(|n| *n += 1);
                    receiver
                }
            };
            drop(slots);
            return (Subscription { groups: Arc::clone(self), key, name: name.to_string() }, receiver);
        }
        // A new group starts with its first name in place, so its first list is the right one.
        let sender = Arc::new(watch::Sender::new(ObjState::Starting));
        let receiver = sender.subscribe();
        let mut slots = Slots::default();
        slots.by_name.insert(name.to_string(), (1, sender));
        let shared = Arc::new(GroupShared { slots: Mutex::new(slots), added: watch::Sender::new(0) });
        let task = tokio::spawn(run_group(
            self.client.clone(),
            spec.clone(),
            Arc::clone(&shared),
            self.debounce,
            Arc::clone(&self.health),
        ));
        groups.insert(key.clone(), Group { shared, _task: AbortOnDrop(task) });
        (Subscription { groups: Arc::clone(self), key, name: name.to_string() }, receiver)
    }

    /// Number of running group watches (for tests and diagnostics).
    pub(crate) fn len(&self) -> usize {
        self.groups.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut groups = self.groups.groups.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(group) = groups.get(&self.key) else { return };
        let empty = {
            let mut slots = group.shared.slots.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some((count, _)) = slots.by_name.get_mut(&self.name) {
                *count -= 1;
                if *count == 0 {
                    // The watch keeps running for the others; this name's events are dropped
                    // from now on. No relist needed for a removal.
                    slots.by_name.remove(&self.name);
                }
            }
            slots.by_name.is_empty()
        };
        if empty {
            groups.remove(&self.key);
        }
    }
}

impl GroupShared {
    fn sender(&self, name: &str) -> Option<Arc<watch::Sender<ObjState>>> {
        let slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        slots.by_name.get(name).map(|(_, sender)| Arc::clone(sender))
    }

    fn all(&self) -> Vec<(String, Arc<watch::Sender<ObjState>>)> {
        let slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        slots.by_name.iter().map(|(name, (_, sender))| (name.clone(), Arc::clone(sender))).collect()
    }
}

/// Sets a state, waking readers only when it changed.
fn publish<T: PartialEq>(sender: &watch::Sender<T>, state: T) {
    sender.send_if_modified(|current| {
        if *current == state {
            false
        } else {
            *current = state;
            true
        }
    });
}

/// Whether an error replaces a known state (see the module documentation).
fn is_definitive(err: &WorkloadError) -> bool {
    matches!(err, WorkloadError::Forbidden { .. } | WorkloadError::UnknownKind { .. })
}

async fn run_group(
    client: Client,
    spec: GroupSpec,
    shared: Arc<GroupShared>,
    debounce: Duration,
    health: Arc<WatchHealth>,
) {
    let api: Api<DynamicObject> = if spec.namespaced {
        Api::namespaced_with(client, &spec.namespace, &spec.resource)
    } else {
        Api::all_with(client, &spec.resource)
    };
    let api_version = spec.resource.api_version.clone();
    let request = Request {
        verb: "list",
        resource: &spec.resource.plural,
        api_version: &api_version,
        namespace: &spec.namespace,
        kind: &spec.resource.kind,
        name: "",
        collection: true,
    };
    let mut added = shared.added.subscribe();
    loop {
        added.borrow_and_update();
        // A lone name is watched through a field selector, so only its own object streams in;
        // with more names the watch covers the namespace. Only additions restart the watch, so
        // a group that shrinks back to one name stays namespace-wide until the next addition.
        let names = shared.all();
        let config = match names.as_slice() {
            [(only, _)] => watcher::Config::default().fields(&format!("metadata.name={only}")),
            _ => watcher::Config::default(),
        };
        drop(names);
        let mut stream = Retrying::new(Box::pin(watcher::watcher(api.clone(), config)));
        // Objects of the list in progress, by name (referenced names only).
        let mut listing: Option<HashMap<String, ObjectInfo>> = None;
        loop {
            tokio::select! {
                changed = added.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    // Wait for a pause in additions (at most 20 debounce periods) so a burst
                    // of subscriptions costs one list.
                    for _ in 0..20 {
                        match tokio::time::timeout(debounce, added.changed()).await {
                            Ok(Ok(())) => continue,
                            Ok(Err(_)) => return,
                            Err(_) => break,
                        }
                    }
                    break;
                }
                event = stream.next() => match event {
                    // A watcher stream does not end; if one did, start over.
                    None => break,
                    Some(Ok(Event::Init)) => listing = Some(HashMap::new()),
                    Some(Ok(Event::InitApply(object))) => {
                        let name = object.name_any();
                        if let Some(listing) = listing.as_mut() {
                            if shared.sender(&name).is_some() {
                                listing.insert(name, read_object(spec.paths, &object));
                            }
                        }
                    }
                    Some(Ok(Event::InitDone)) => {
                        let mut seen = listing.take().unwrap_or_default();
                        for (name, sender) in shared.all() {
                            let state = match seen.remove(&name) {
                                Some(info) => ObjState::Present(info),
                                None => ObjState::Missing,
                            };
                            publish(&sender, state);
                        }
                    }
                    Some(Ok(Event::Apply(object))) => {
                        if let Some(sender) = shared.sender(&object.name_any()) {
                            publish(&sender, ObjState::Present(read_object(spec.paths, &object)));
                        }
                    }
                    Some(Ok(Event::Delete(object))) => {
                        if let Some(sender) = shared.sender(&object.name_any()) {
                            publish(&sender, ObjState::Missing);
                        }
                    }
                    Some(Err(err)) => {
                        let error = request.watch_error(&err);
                        tracing::warn!(
                            resource = %spec.resource.plural,
                            namespace = %spec.namespace,
                            error = %error,
                            "watch of the targets failed; retrying"
                        );
                        let definitive = is_definitive(&error);
                        if !definitive {
                            health.failed();
                        }
                        for (_, sender) in shared.all() {
                            sender.send_if_modified(|state| {
                                let replace = definitive || matches!(state, ObjState::Starting | ObjState::Failed(_));
                                if replace && *state != ObjState::Failed(error.clone()) {
                                    *state = ObjState::Failed(error.clone());
                                    true
                                } else {
                                    false
                                }
                            });
                        }
                    }
                },
            }
        }
    }
}

fn read_object(paths: KindPaths, object: &DynamicObject) -> ObjectInfo {
    let mut info = ObjectInfo::read(paths, object.resource_version().unwrap_or_default(), &object.data);
    info.marks = super::object::Marks::read(&object.metadata);
    info
}

/// The ready-pod count of one selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PodState {
    Starting,
    Failed(WorkloadError),
    Counted(u32),
}

/// A running pod watch for one target's selector.
pub(crate) struct PodWatch {
    pub selector: String,
    pub state: watch::Receiver<PodState>,
    _task: AbortOnDrop,
}

impl PodWatch {
    pub(crate) fn start(client: Client, namespace: &str, selector: &str, health: Arc<WatchHealth>) -> PodWatch {
        let sender = watch::Sender::new(PodState::Starting);
        let state = sender.subscribe();
        let task = tokio::spawn(run_pods(client, namespace.to_string(), selector.to_string(), sender, health));
        PodWatch { selector: selector.to_string(), state, _task: AbortOnDrop(task) }
    }
}

async fn run_pods(
    client: Client,
    namespace: String,
    selector: String,
    sender: watch::Sender<PodState>,
    health: Arc<WatchHealth>,
) {
    let api: Api<Pod> = Api::namespaced(client, &namespace);
    let request = Request {
        verb: "list",
        resource: "pods",
        api_version: "v1",
        namespace: &namespace,
        kind: "Pod",
        name: "",
        collection: true,
    };
    let config = watcher::Config::default().labels(&selector);
    let mut stream = Retrying::new(Box::pin(watcher::watcher(api, config)));
    // Pod name -> ready. Names and a flag only, never the pods.
    let mut ready: HashMap<String, bool> = HashMap::new();
    let mut listing: Option<HashMap<String, bool>> = None;
    let count = |ready: &HashMap<String, bool>| ready.values().filter(|r| **r).count() as u32;
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::Init) => listing = Some(HashMap::new()),
            Ok(Event::InitApply(pod)) => {
                if let Some(listing) = listing.as_mut() {
                    listing.insert(pod.name_any(), pod_is_ready(&pod));
                }
            }
            Ok(Event::InitDone) => {
                ready = listing.take().unwrap_or_default();
                publish(&sender, PodState::Counted(count(&ready)));
            }
            Ok(Event::Apply(pod)) => {
                ready.insert(pod.name_any(), pod_is_ready(&pod));
                publish(&sender, PodState::Counted(count(&ready)));
            }
            Ok(Event::Delete(pod)) => {
                ready.remove(&pod.name_any());
                publish(&sender, PodState::Counted(count(&ready)));
            }
            Err(err) => {
                let error = request.watch_error(&err);
                tracing::warn!(namespace = %namespace, selector = %selector, error = %error, "pod watch failed; retrying");
                let definitive = is_definitive(&error);
                if !definitive {
                    health.failed();
                }
                sender.send_if_modified(|state| {
                    let replace = definitive || !matches!(state, PodState::Counted(_));
                    if replace && *state != PodState::Failed(error.clone()) {
                        *state = PodState::Failed(error.clone());
                        true
                    } else {
                        false
                    }
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_watch_is_retried_forever_and_never_more_than_five_seconds_apart() {
        let mut delays = backoff();
        let first: Vec<Duration> = delays.by_ref().take(200).collect();
        assert_eq!(first.len(), 200, "the backoff never ends the watch");
        assert!(first.iter().all(|d| *d <= MAX_RETRY_DELAY), "{first:?}");
        assert!(first[0] <= Duration::from_millis(500), "the first retry is quick: {:?}", first[0]);
        assert!(first[50..].iter().any(|d| *d > Duration::from_secs(2)), "it does back off: {first:?}");
    }

    fn gone() -> watcher::Error {
        let status = kube::core::Status::failure("too old resource version: 203 (208)", "Expired").with_code(410);
        watcher::Error::WatchError(status.boxed())
    }

    fn refused() -> watcher::Error {
        watcher::Error::WatchStartFailed(kube::Error::Api(
            kube::core::Status::failure("unavailable", "ServiceUnavailable").with_code(503).boxed(),
        ))
    }

    #[test]
    fn gone_is_410_in_whichever_form_it_comes() {
        assert!(is_gone(&gone()));
        let listed = kube::core::Status::failure("continue expired", "Expired").with_code(410);
        assert!(is_gone(&watcher::Error::InitialListFailed(kube::Error::Api(listed.boxed()))));
        assert!(!is_gone(&refused()));
        assert!(!is_gone(&watcher::Error::NoResourceVersion));
    }

    #[tokio::test(start_paused = true)]
    async fn after_an_outage_a_410_lists_again_at_once_and_other_failures_back_off() {
        let mut policy = RetryPolicy::default();
        let mut now = tokio::time::Instant::now();
        // The API server is down for a while: the pauses grow to their cap.
        let mut last = Duration::ZERO;
        for _ in 0..30 {
            last = policy.delay_after(&refused(), now);
            now += last;
        }
        assert!(last > Duration::from_secs(2) && last <= MAX_RETRY_DELAY, "{last:?}");
        // It is back, and the resumed watch is too old: list again now, not a backoff later.
        assert_eq!(policy.delay_after(&gone(), now), Duration::ZERO);
        // A second 410 right away is not retried at once: no loop against an API server that
        // keeps answering 410.
        let again = policy.delay_after(&gone(), now + Duration::from_millis(10));
        assert!(again > Duration::ZERO && again <= MAX_RETRY_DELAY, "{again:?}");
        assert_eq!(policy.delay_after(&gone(), now + MAX_RETRY_DELAY), Duration::ZERO);
        // A good answer starts the backoff over.
        policy.reset();
        assert!(policy.delay_after(&refused(), now + MAX_RETRY_DELAY) <= Duration::from_millis(500));
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_counts_as_failing_until_it_has_not_failed_for_two_retry_periods() {
        let health = WatchHealth::default();
        assert!(!health.failing());
        health.failed();
        assert!(health.failing());
        tokio::time::advance(MAX_RETRY_DELAY).await;
        health.failed();
        tokio::time::advance(MAX_RETRY_DELAY * 2 - Duration::from_millis(1)).await;
        assert!(health.failing(), "a retry period after its last failure it may still be down");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(!health.failing());
    }
}
