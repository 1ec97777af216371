//! What every evaluation shares, and the daemon's clock.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use watermarkd_engine::Timestamp;

use super::allocator::Trim;
use super::claims::ClaimBoard;
use crate::adapters::backend::recommender::RecommenderClients;
use crate::adapters::events::EventPublisher;
use crate::adapters::lease::Authority;
use crate::adapters::resource::ResourceMetrics;
use crate::adapters::state_store::StateConfigMaps;
use crate::adapters::status::Board;
use crate::adapters::telemetry::DaemonMetrics;
use crate::adapters::workload::Workloads;
use crate::domain::outcome::Ledger;

/// Wall time that advances with tokio's clock: monotonic (a clock step does not open or close a
/// window) and paused with it in tests.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    wall: Timestamp,
    start: Instant,
}

impl Clock {
    pub fn start() -> Clock {
        Clock { wall: Timestamp::from_system_time(SystemTime::now()), start: Instant::now() }
    }

    pub fn now(&self) -> Timestamp {
        self.wall.plus(self.start.elapsed())
    }
}

pub struct Shared {
    pub client: kube::Client,
    pub targets: Workloads,
    /// The other controllers that claim targets (HPAs, ScaledObjects, WPAs of another
    /// controller), which the guard reads before each write.
    pub claims: Arc<ClaimBoard>,
    /// Where the rules file's autoscalers keep their state.
    pub states: StateConfigMaps,
    pub events: Option<EventPublisher>,
    /// Every running autoscaler's last outcome and history: what the series and the status
    /// board show (see `fanout`).
    pub ledger: Arc<Ledger>,
    /// What the status API and page say of the daemon itself: whether it leads, whether the
    /// rules file on disk was refused.
    pub board: Arc<Board>,
    pub daemon: DaemonMetrics,
    /// HTTP clients of the replica recommenders.
    pub recommenders: RecommenderClients,
    /// Reads resource metrics (cpu, memory) through the API server.
    pub resources: ResourceMetrics,
    pub clock: Clock,
    pub dry_run: bool,
    pub default_interval: Duration,
    /// Incremented on every gain of leadership.
    pub epoch: AtomicU64,
    pub leader: AtomicBool,
    /// Whether and how long a write may take now (see `crate::adapters::lease`).
    pub authority: Authority,
    /// Cancelled when the daemon starts stopping: no new decisions, and the server, the sources
    /// and the health loops end. A child of the daemon's lifetime, which ends the Lease later.
    pub stopping: CancellationToken,
    /// Asks the health loop that trims the allocator to do it now.
    pub trim: Trim,
    /// Forecasts reading their history now, at most `HISTORY_READS` at a time: thousands
    /// starting together read one after another instead of all at once.
    pub history_reads: Arc<Semaphore>,
}

/// Forecast histories read at the same time (see `Shared::history_reads`).
pub const HISTORY_READS: usize = 2;

impl Shared {
    pub fn is_leader(&self) -> bool {
        self.leader.load(Ordering::Acquire)
    }

    /// How long a write to the cluster started now may take; `None`: this daemon may not write
    /// (it follows, or it cannot prove its lease any more).
    pub fn write_budget(&self) -> Option<Duration> {
        if !self.is_leader() {
            return None;
        }
        self.authority.write_budget()
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.is_cancelled()
    }
}
