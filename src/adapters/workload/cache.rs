//! What a followed target's entry caches for reads: a custom kind's `/scale` per object
//! version (with the failure and its retry time), and our own scale write, served over the
//! store until its watch event arrives. The registry keeps them with the target; the reads fill
//! and use them.

use tokio::time::Instant;
use watermarkd_engine::Timestamp;

use super::compact::StoredWorkload;
use super::{ScaleReading, WorkloadError};

/// The last `/scale` read of a custom kind.
pub(super) struct ScaleCache {
    /// The stored object's resourceVersion it was read for.
    pub(super) version: Box<str>,
    pub(super) outcome: Result<ScaleOf, Failure>,
    /// The replica count of the last good reading and when it was first seen, kept across
    /// versions and failures (see `ScaleReading::spec_changed_at`).
    pub(super) last_spec: Option<(u32, Option<Timestamp>)>,
    /// Failed reads in a row.
    pub(super) attempt: u32,
}

#[derive(Clone)]
pub(super) struct ScaleOf {
    pub(super) spec_replicas: u32,
    pub(super) status_replicas: u32,
    pub(super) selector: Option<String>,
    pub(super) resource_version: String,
    pub(super) spec_changed_at: Option<Timestamp>,
}

pub(super) struct Failure {
    pub(super) error: WorkloadError,
    pub(super) retry_at: Instant,
}

/// A scale write served to reads before its watch event arrives, but only while the store
/// still holds the version the write was based on (never over something newer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Overlay {
    pub(super) based_on: Box<str>,
    pub(super) written: String,
    pub(super) replicas: u32,
    pub(super) at: Timestamp,
}

impl Overlay {
    /// Applies the write to a reading of `object`; `false` when the object moved on, and the
    /// overlay is done with.
    pub(super) fn apply(&self, object: &StoredWorkload, reading: &mut ScaleReading) -> bool {
        if object.resource_version != self.based_on {
            return false;
        }
        reading.spec_replicas = self.replicas;
        reading.resource_version = self.written.clone();
        reading.spec_changed_at = Some(self.at);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::workload::reads::builtin_reading;
    use crate::domain::state::Marks;

    fn t(ms: i64) -> Timestamp {
        Timestamp::from_unix_millis(ms)
    }

    fn stored(version: &str, spec: u32, seen: Option<Timestamp>) -> StoredWorkload {
        StoredWorkload {
            name: "web".into(),
            resource_version: version.into(),
            spec_replicas: spec,
            status_replicas: spec,
            ready_replicas: Some(spec),
            selector: Some("app=web".into()),
            marks: Marks::default(),
            seen,
        }
    }

    #[test]
    fn our_write_is_served_only_while_the_store_holds_the_version_it_was_based_on() {
        let overlay = Overlay { based_on: "10".into(), written: "11".into(), replicas: 6, at: t(500) };
        let before = stored("10", 4, Some(t(100)));
        let mut reading = builtin_reading(&before);
        assert!(overlay.apply(&before, &mut reading));
        assert_eq!(
            (reading.spec_replicas, reading.resource_version.as_str(), reading.spec_changed_at),
            (6, "11", Some(t(500)))
        );
        assert_eq!(reading.status_replicas, 4, "only what the write changed");
        // The watch event of the write, or anything newer: the store's version wins.
        let after = stored("11", 6, Some(t(510)));
        let mut reading = builtin_reading(&after);
        assert!(!overlay.apply(&after, &mut reading));
        assert_eq!(reading, builtin_reading(&after));
        let other = stored("12", 9, Some(t(520)));
        let mut reading = builtin_reading(&other);
        assert!(!overlay.apply(&other, &mut reading));
        assert_eq!(reading.spec_replicas, 9);
    }
}
