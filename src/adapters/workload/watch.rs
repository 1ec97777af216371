//! The stores' watches.
//!
//! Workloads: one store per (kind, namespace) in use, holding every object of that kind in
//! that namespace (compacted, see `compact.rs`), shared by every target there. A namespace
//! watch rather than one per object, because kube's client speaks HTTP/1.1: every watch holds
//! a connection of its own, and 10,000 autoscalers must not mean 10,000 TLS connections to the
//! API server. Holding the whole namespace also makes a target added later a lookup, not a
//! re-list. The price is the namespace's other objects of that kind, a couple of hundred bytes
//! each.
//!
//! Pods: only for targets without `status.readyReplicas`, one store per (namespace, label
//! selector), shared by the targets with that selector, holding a ready flag per pod name.
//! Never cluster-wide.
//!
//! Errors: before the first good answer, and for 403 and 404 at any time (permission revoked,
//! resource type gone), an error replaces what the store offers its readers. Other errors
//! (connection loss, API server restarts) leave the last known state in place while the watch
//! retries with backoff, and mark [`WatchHealth`] failing: a stale reading cannot cause a
//! wrong write, because every write carries the resourceVersion it was based on and a changed
//! object answers 409.

use std::pin::Pin;
use std::time::Duration;

use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{Lookup, Store};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use tokio::sync::watch;

use super::error::{Request, WorkloadError};

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

/// Aborts the task when dropped, so dropping a store's entry stops its watch.
#[derive(Debug)]
pub(crate) struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What a store's readers may rely on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum StoreStatus {
    /// No complete list yet.
    Starting,
    /// Listed: the store holds what the watch has seen since.
    Synced,
    /// Reads get this error rather than the store's content (see the module documentation).
    Failed(WorkloadError),
}

/// Sets a status, waking readers only when it changed.
pub(crate) fn publish(sender: &watch::Sender<StoreStatus>, status: StoreStatus) {
    sender.send_if_modified(|current| {
        if *current == status {
            false
        } else {
            *current = status;
            true
        }
    });
}

/// Whether an error replaces a known state (see the module documentation).
fn is_definitive(err: &WorkloadError) -> bool {
    matches!(err, WorkloadError::Forbidden { .. } | WorkloadError::UnknownKind { .. })
}

/// Why [`follow`] returned.
pub(crate) struct Stopped {
    /// The resource type is not served (any more): the caller resolves the kind afresh.
    pub error: WorkloadError,
    /// Whether the store listed at least once before.
    pub listed: bool,
}

/// Drives one store: the watcher's events, each reduced by `compact` (which sees the store
/// as it is before the event: the previous version of the object is still in it, a re-list
/// included, as the writer swaps a new list in only at its end), go into `writer`, and
/// `status` follows the watch. Runs until dropped, or until the watch answers that the
/// resource type is not served.
pub(crate) async fn follow<S, W, K>(
    stream: S,
    writer: &mut Writer<K>,
    mut compact: impl FnMut(W, &Store<K>) -> Option<K>,
    status: &watch::Sender<StoreStatus>,
    health: &WatchHealth,
    request: Request<'_>,
) -> Stopped
where
    S: WatchStreamExt<Item = Result<Event<W>, watcher::Error>> + Unpin,
    K: Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    let reader = writer.as_reader();
    let mut stream = Retrying::new(stream);
    let mut listed = false;
    loop {
        let event = match stream.next().await {
            Some(Ok(event)) => event,
            Some(Err(err)) => {
                let error = request.watch_error(&err);
                tracing::warn!(
                    resource = %request.resource,
                    namespace = %request.namespace,
                    error = %error,
                    "watch failed; retrying"
                );
                let definitive = is_definitive(&error);
                if !definitive {
                    health.failed();
                }
                status.send_if_modified(|current| {
                    let replace = definitive || !matches!(current, StoreStatus::Synced);
                    if replace && *current != StoreStatus::Failed(error.clone()) {
                        *current = StoreStatus::Failed(error.clone());
                        true
                    } else {
                        false
                    }
                });
                if matches!(error, WorkloadError::UnknownKind { .. }) {
                    return Stopped { error, listed };
                }
                continue;
            }
            // A watcher stream does not end; if one did, the caller starts over.
            None => {
                let error = WorkloadError::Connection(format!("the watch of {} ended", request.resource));
                return Stopped { error, listed };
            }
        };
        let event = match event {
            Event::Init => Event::Init,
            Event::InitDone => Event::InitDone,
            Event::InitApply(object) => match compact(object, &reader) {
                Some(object) => Event::InitApply(object),
                None => continue,
            },
            Event::Apply(object) => match compact(object, &reader) {
                Some(object) => Event::Apply(object),
                None => continue,
            },
            Event::Delete(object) => match compact(object, &reader) {
                Some(object) => Event::Delete(object),
                None => continue,
            },
        };
        writer.apply_watcher_event(&event);
        if matches!(event, Event::InitDone) {
            listed = true;
            publish(status, StoreStatus::Synced);
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
