//! The loops that say how the daemon is: `/readyz` (and systemd's READY=1 the first time it is
//! ready), systemd's watchdog, and giving freed memory back to the kernel.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::allocator::{self, Trim};
use super::systemd::Notifier;
use crate::adapters::health::Readiness;

/// How often readiness is judged again.
const READINESS_PERIOD: Duration = Duration::from_millis(200);
/// How often freed heap pages are handed back while nothing else does it: scrapes and reloads
/// leave them behind.
const TRIM_PERIOD: Duration = Duration::from_secs(60);

/// Keeps `readiness.caches_synced` up to date with `caches_synced()` (every cache listed, and
/// no watch failing: a failing watch's cache may be stale), and tells systemd once, the first
/// time the daemon is ready. Runs until `stopping` is cancelled.
pub async fn follow_readiness(
    readiness: Arc<Readiness>,
    caches_synced: impl Fn() -> bool,
    state_problem: impl Fn() -> Option<String>,
    notifier: Notifier,
    trim: Trim,
    stopping: CancellationToken,
) {
    let mut announced = false;
    loop {
        // On the daemon's own runtime: a beat is proof that its loop runs (`/healthz`).
        readiness.beat();
        readiness.caches_synced.store(caches_synced(), Ordering::Release);
        *readiness.state_problem.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = state_problem();
        if !announced && readiness.is_ready() {
            notifier.ready();
            announced = true;
            tracing::info!("ready");
            // The initial listings are done with: give their pages back.
            trim.request();
        }
        tokio::select! {
            () = tokio::time::sleep(READINESS_PERIOD) => {}
            () = stopping.cancelled() => return,
        }
    }
}

/// Pings systemd's watchdog every `period` until `stopping` is cancelled. It runs on the same
/// runtime as the evaluations, so a wedged runtime stops the pings and systemd restarts the
/// daemon.
pub async fn ping_watchdog(notifier: Notifier, period: Duration, stopping: CancellationToken) {
    loop {
        notifier.watchdog();
        tokio::select! {
            () = tokio::time::sleep(period) => {}
            () = stopping.cancelled() => return,
        }
    }
}

/// How often the state namespace is looked for again while it is missing.
const STATE_PROBE_PERIOD: Duration = Duration::from_secs(10);

/// Asks at the start whether autoscalers' state can be kept (a dry-run write), and while the
/// answer is that the namespace is missing, again every `STATE_PROBE_PERIOD`, so that
/// `/readyz` turns ready once someone creates it. Said once in the log; other failures (the API
/// server slow, a permission) are left to the evaluations' own writes, which say them.
pub async fn probe_state_store(states: crate::adapters::state_store::StateConfigMaps, stopping: CancellationToken) {
    loop {
        match states.probe().await {
            Ok(()) => return,
            Err(err @ crate::adapters::state_store::StateObjectError::NamespaceMissing { .. }) => {
                if !states.known(&err) {
                    tracing::warn!("{err}");
                }
            }
            Err(err) => {
                tracing::debug!(error = %err, "cannot check where the state is kept");
                return;
            }
        }
        tokio::select! {
            () = tokio::time::sleep(STATE_PROBE_PERIOD) => {}
            () = stopping.cancelled() => return,
        }
    }
}

/// Gives freed heap pages back to the kernel when `trim` asks (after a burst of garbage) and
/// every `TRIM_PERIOD` besides, until `stopping` is cancelled: the one caller of
/// `allocator::release_free`.
pub async fn trim_allocator(trim: Trim, stopping: CancellationToken) {
    let mut period = tokio::time::interval_at(Instant::now() + TRIM_PERIOD, TRIM_PERIOD);
    period.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = trim.requested() => {}
            _ = period.tick() => {}
            () = stopping.cancelled() => return,
        }
        allocator::release_free();
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixDatagram;
    use std::sync::atomic::AtomicBool;

    use super::*;

    fn socket() -> (tempfile::TempDir, UnixDatagram, Notifier) {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("notify.sock");
        let listener = UnixDatagram::bind(&path).expect("bind");
        listener.set_nonblocking(true).expect("non-blocking");
        let notifier = Notifier::to_socket(&path.display().to_string()).expect("notifier");
        (dir, listener, notifier)
    }

    fn received(listener: &UnixDatagram) -> Vec<String> {
        let mut buffer = [0u8; 256];
        let mut out = Vec::new();
        while let Ok(n) = listener.recv(&mut buffer) {
            out.push(String::from_utf8_lossy(&buffer[..n]).into_owned());
        }
        out
    }

    #[tokio::test(start_paused = true)]
    async fn ready_follows_the_caches_and_systemd_hears_it_once() {
        let (_dir, listener, notifier) = socket();
        let readiness = Arc::new(Readiness::default());
        readiness.rules_loaded.store(true, Ordering::Release);
        readiness.leader_known.store(true, Ordering::Release);
        let synced = Arc::new(AtomicBool::new(false));
        let stop = CancellationToken::new();
        let flag = Arc::clone(&synced);
        let state_missing = Arc::new(AtomicBool::new(false));
        let missing = Arc::clone(&state_missing);
        let task = tokio::spawn(follow_readiness(
            Arc::clone(&readiness),
            move || flag.load(Ordering::Acquire),
            move || missing.load(Ordering::Acquire).then(|| "namespace \"watermarkd\" does not exist".to_string()),
            notifier,
            Trim::default(),
            stop.clone(),
        ));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!readiness.is_ready());
        assert!(received(&listener).is_empty());

        synced.store(true, Ordering::Release);
        tokio::time::sleep(READINESS_PERIOD * 2).await;
        assert!(readiness.is_ready());
        // A watch fails and recovers: readiness follows, systemd was told once.
        synced.store(false, Ordering::Release);
        tokio::time::sleep(READINESS_PERIOD * 2).await;
        assert!(!readiness.is_ready());
        synced.store(true, Ordering::Release);
        tokio::time::sleep(READINESS_PERIOD * 2).await;
        assert!(readiness.is_ready());
        assert_eq!(received(&listener), ["READY=1\nSTATUS=running"]);
        // No state can be kept: not ready, and /readyz says why.
        state_missing.store(true, Ordering::Release);
        tokio::time::sleep(READINESS_PERIOD * 2).await;
        assert_eq!(readiness.missing(), ["namespace \"watermarkd\" does not exist"]);
        state_missing.store(false, Ordering::Release);
        tokio::time::sleep(READINESS_PERIOD * 2).await;
        assert!(readiness.is_ready());

        stop.cancel();
        task.await.expect("the loop ends at shutdown");
    }

    #[tokio::test(start_paused = true)]
    async fn the_watchdog_is_pinged_every_period_until_shutdown() {
        let (_dir, listener, notifier) = socket();
        let stop = CancellationToken::new();
        let task = tokio::spawn(ping_watchdog(notifier, Duration::from_secs(10), stop.clone()));
        tokio::time::sleep(Duration::from_secs(35)).await;
        assert_eq!(received(&listener), ["WATCHDOG=1"; 4], "at 0, 10, 20 and 30 s");
        stop.cancel();
        task.await.expect("ends");
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(received(&listener).is_empty(), "no ping after shutdown");
    }
}
