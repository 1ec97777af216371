//! How the daemon is, as its probes say it: `Readiness`, set by the parts that know (the rules
//! loaded, the caches synced, the leader known, the state store usable, the loop's heartbeat),
//! and the listener's `/healthz` and `/readyz`, answered from it. The loops that keep it up to
//! date are the daemon's (`runtime::health`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hyper::{Response, StatusCode};

use crate::adapters::listener::{ready, text, Body, Route, Routes};

/// What `/readyz` waits for, and what `/healthz` checks. Each is set by the part that knows.
#[derive(Debug, Default)]
pub struct Readiness {
    pub rules_loaded: AtomicBool,
    pub caches_synced: AtomicBool,
    pub leader_known: AtomicBool,
    /// Why no autoscaler's state can be kept, while that is so (the state namespace is
    /// missing): not ready, since every restart would forget the forbidden windows.
    pub state_problem: Mutex<Option<String>>,
    /// The daemon's loop beats here (milliseconds on the listener's clock, `Readiness::beat`);
    /// 0 until the first beat.
    heartbeat_millis: AtomicU64,
}

/// How long the daemon's loop may go without a beat before `/healthz` says it is stuck. The
/// listener runs on a thread of its own, so answering is no proof that the daemon's loop runs.
pub const HEARTBEAT_STALE: Duration = Duration::from_secs(10);

/// The listener's clock for the heartbeat: milliseconds since the first call.
fn monotonic_millis() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let start = START.get_or_init(std::time::Instant::now);
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX).max(1)
}

impl Readiness {
    /// What is still missing; empty when ready.
    pub fn missing(&self) -> Vec<String> {
        let mut missing = Vec::new();
        if !self.rules_loaded.load(Ordering::Relaxed) {
            missing.push("rules not loaded".to_string());
        }
        if !self.caches_synced.load(Ordering::Relaxed) {
            missing.push("caches not synced".to_string());
        }
        if !self.leader_known.load(Ordering::Relaxed) {
            missing.push("leader not known".to_string());
        }
        if let Some(problem) = self.state_problem.lock().unwrap_or_else(PoisonError::into_inner).clone() {
            missing.push(problem);
        }
        missing
    }

    pub fn is_ready(&self) -> bool {
        self.missing().is_empty()
    }

    /// The daemon's loop is alive.
    pub fn beat(&self) {
        self.heartbeat_millis.store(monotonic_millis(), Ordering::Release);
    }

    /// How long since the last beat, once there was one.
    pub fn since_beat(&self) -> Option<Duration> {
        let last = self.heartbeat_millis.load(Ordering::Acquire);
        (last > 0).then(|| Duration::from_millis(monotonic_millis().saturating_sub(last)))
    }
}

/// `/healthz` (is the daemon's loop running?) and `/readyz` (is the daemon ready?). Both are
/// answered from the probe reserve: the kubelet must get in when the listener is full.
pub fn routes(readiness: Arc<Readiness>) -> Routes {
    let live = Arc::clone(&readiness);
    Routes::new()
        .with(Route::exact("/healthz", move |_, _| ready(healthz(&live))).from_reserve().listed())
        .with(Route::exact("/readyz", move |_, _| ready(readyz(&readiness))).from_reserve().listed())
}

fn healthz(readiness: &Readiness) -> Response<Body> {
    match readiness.since_beat() {
        Some(since) if since > HEARTBEAT_STALE => text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the daemon's loop has not run for {}s\n", since.as_secs()),
            "text/plain",
        ),
        _ => text(StatusCode::OK, "ok\n", "text/plain"),
    }
}

fn readyz(readiness: &Readiness) -> Response<Body> {
    let missing = readiness.missing();
    if missing.is_empty() {
        text(StatusCode::OK, "ok\n", "text/plain")
    } else {
        text(StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {}\n", missing.join(", ")), "text/plain")
    }
}
