//! Kubernetes Events on the autoscaled objects (`kubectl describe` shows them): one for each
//! scale, and for each failure.
//!
//! Every scale is its own Event, with its sizes and reason, as the Datadog controller emits
//! them: the scale history of a workload stays readable. kube's `Recorder` is not used because it
//! folds every event with the same object, reason and action into one series and keeps the
//! first note, so 27 scales would read as one "New size: 6".
//!
//! A stuck autoscaler meets the same failure every interval. A failure is sent at most once per
//! `repeat_after` for the same object, type and reason, whatever its message says: messages carry
//! values that change from one attempt to the next (durations, resourceVersions, what a server
//! answered), so keyed on the text an outage would give an Event per autoscaler per cycle. The
//! Event that does go out carries the latest message. Only a caller whose message names a cause
//! and nothing that changes by itself ([`Repeats::SuppressSameText`], a rejected spec) has a new
//! text count as a new failure. A thousand stuck autoscalers cost the API server nothing between
//! those windows. Scales are never suppressed.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp as JiffTimestamp;
use kube::api::{Api, PostParams};
use kube::Client;
use tokio::time::Instant;

/// A failure event with the same object and reason is sent again after this long.
pub const DEFAULT_REPEAT_AFTER: Duration = Duration::from_secs(300);
/// Bounds the memory of sent events; older entries are dropped first.
const MAX_REMEMBERED: usize = 10_000;
const CONTROLLER: &str = "watermarkd";

/// Normal or Warning, as `kubectl describe` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

/// Whether repeats of an event are worth sending.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Repeats {
    /// Each one is history (a scale): always sent.
    Keep,
    /// A condition that persists (a failure): once per `repeat_after` for the object and
    /// reason, whatever the message says.
    Suppress,
    /// As `Suppress`, for a message that changes only when its cause does (the errors of a
    /// rejected spec): a different message is sent at once.
    SuppressSameText,
}

/// What makes two failures the same for suppression: the object, the type and the reason, and
/// for [`Repeats::SuppressSameText`] the message. Kept as a keyed hash of those: only whether
/// two are the same matters, and at 10,000 failing autoscalers the texts would cost megabytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct EventKey(u64);

impl EventKey {
    fn of(object: &ObjectReference, type_: EventType, reason: &str, note: &str, repeats: Repeats) -> EventKey {
        // Keyed randomly per process, so that no object name can be chosen to collide with
        // another's failures.
        static KEYS: OnceLock<RandomState> = OnceLock::new();
        let identity = (
            (&object.api_version, &object.kind, &object.namespace, &object.name),
            type_ == EventType::Warning,
            reason,
            (repeats == Repeats::SuppressSameText).then_some(note),
        );
        EventKey(KEYS.get_or_init(RandomState::new).hash_one(identity))
    }
}

/// Decides which events go out: the first of a kind, then again only after `repeat_after`.
#[derive(Debug)]
pub struct Suppressor {
    repeat_after: Duration,
    sent: HashMap<EventKey, Instant>,
}

impl Suppressor {
    pub fn new(repeat_after: Duration) -> Self {
        Suppressor { repeat_after, sent: HashMap::new() }
    }

    /// True when this event should be sent now (and remembers that it was).
    fn admit(&mut self, key: EventKey, now: Instant) -> bool {
        if let Some(at) = self.sent.get(&key) {
            if now.duration_since(*at) < self.repeat_after {
                return false;
            }
        }
        if self.sent.len() >= MAX_REMEMBERED {
            let repeat_after = self.repeat_after;
            self.sent.retain(|_, at| now.duration_since(*at) < repeat_after);
        }
        self.sent.insert(key, now);
        true
    }
}

/// Whether an event reached the API server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Published {
    Sent,
    /// The same failure (object and reason) was sent less than `repeat_after` ago.
    Suppressed,
}

pub struct EventPublisher {
    client: Client,
    instance: String,
    suppressor: Mutex<Suppressor>,
    /// Makes names unique within this process even for two events in one nanosecond.
    sequence: AtomicU64,
}

impl EventPublisher {
    /// `instance` names this daemon in the events' reporting instance.
    pub fn new(client: Client, instance: &str, repeat_after: Duration) -> Self {
        EventPublisher {
            client,
            instance: instance.to_string(),
            suppressor: Mutex::new(Suppressor::new(repeat_after)),
            sequence: AtomicU64::new(0),
        }
    }

    /// Records `reason` (PascalCase, e.g. `ScaledUp`, `FailedGetMetrics`) with a human message
    /// on `object`.
    pub async fn publish(
        &self,
        object: &ObjectReference,
        type_: EventType,
        reason: &str,
        note: &str,
        action: &str,
        repeats: Repeats,
    ) -> Result<Published, kube::Error> {
        if repeats != Repeats::Keep {
            let key = EventKey::of(object, type_, reason, note, repeats);
            let admitted = match self.suppressor.lock() {
                Ok(mut suppressor) => suppressor.admit(key, Instant::now()),
                // A panic elsewhere poisoned the lock: sending a duplicate beats losing the event.
                Err(_) => true,
            };
            if !admitted {
                return Ok(Published::Suppressed);
            }
        }
        let sequence = self.sequence.fetch_add(1, Ordering::Relaxed);
        let event = self.event(object, type_, reason, note, action, SystemTime::now(), sequence);
        let namespace = event.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        Api::<Event>::namespaced(self.client.clone(), &namespace).create(&PostParams::default(), &event).await?;
        Ok(Published::Sent)
    }

    #[expect(clippy::too_many_arguments, reason = "the fields of one Event, from its one caller")]
    fn event(
        &self,
        object: &ObjectReference,
        type_: EventType,
        reason: &str,
        note: &str,
        action: &str,
        at: SystemTime,
        sequence: u64,
    ) -> Event {
        let nanos = at.duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or_default();
        // The name client-go gives an event: the object's name and a unique suffix.
        let name = format!("{}.{nanos:x}{sequence:x}", object.name.as_deref().unwrap_or("object"));
        Event {
            metadata: ObjectMeta {
                name: Some(name),
                // Cluster-scoped objects' events go to "default", as client-go does.
                namespace: Some(object.namespace.clone().unwrap_or_else(|| "default".into())),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(JiffTimestamp::try_from(at).unwrap_or(JiffTimestamp::UNIX_EPOCH))),
            type_: Some(match type_ {
                EventType::Normal => "Normal".into(),
                EventType::Warning => "Warning".into(),
            }),
            reason: Some(reason.to_string()),
            action: Some(action.to_string()),
            // The events API limits the message to 1 kB.
            note: Some(truncate(note, 1000)),
            regarding: Some(object.clone()),
            reporting_controller: Some(CONTROLLER.into()),
            reporting_instance: Some(truncate(&self.instance, 128)),
            ..Event::default()
        }
    }
}

fn truncate(text: &str, max_bytes: usize) -> String {
    if text.len() <= max_bytes {
        return text.to_string();
    }
    let mut end = max_bytes.saturating_sub(3);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn billing() -> ObjectReference {
        ObjectReference {
            api_version: Some("apps/v1".into()),
            kind: Some("Deployment".into()),
            namespace: Some("prod".into()),
            name: Some("billing".into()),
            ..ObjectReference::default()
        }
    }

    fn key(reason: &str, note: &str) -> EventKey {
        EventKey::of(&billing(), EventType::Warning, reason, note, Repeats::Suppress)
    }

    #[test]
    fn failures_of_one_reason_are_sent_once_per_window_whatever_their_text() {
        let start = Instant::now();
        let mut s = Suppressor::new(Duration::from_secs(300));
        assert!(s.admit(key("FailedGetScale", "cannot scale: no answer within 4.2s"), start));
        // An outage: every cycle's message carries its own duration, resourceVersion or body.
        for cycle in 1..=299u64 {
            let note =
                format!("cannot scale: no answer within {}.{}s (resourceVersion {})", cycle % 7, cycle, 1000 + cycle);
            assert!(!s.admit(key("FailedGetScale", &note), start + Duration::from_secs(cycle)), "cycle {cycle}");
        }
        // Another reason, another object or the other type is another failure.
        assert!(s.admit(key("FailedRescale", "timeout"), start + Duration::from_secs(20)));
        let other = ObjectReference { name: Some("search".into()), ..billing() };
        let other = EventKey::of(&other, EventType::Warning, "FailedGetScale", "timeout", Repeats::Suppress);
        assert!(s.admit(other, start + Duration::from_secs(20)));
        let normal = EventKey::of(&billing(), EventType::Normal, "FailedGetScale", "timeout", Repeats::Suppress);
        assert!(s.admit(normal, start + Duration::from_secs(20)));
        // After the window, the failure (with its latest text) goes out again.
        assert!(s.admit(key("FailedGetScale", "cannot scale: connection refused"), start + Duration::from_secs(300)));
    }

    #[test]
    fn a_stable_text_that_changes_is_a_new_failure() {
        let start = Instant::now();
        let mut s = Suppressor::new(Duration::from_secs(300));
        let rejected = |note: &str| {
            EventKey::of(&billing(), EventType::Warning, "FailedSpecCheck", note, Repeats::SuppressSameText)
        };
        assert!(s.admit(rejected("spec.maxReplicas: missing"), start));
        assert!(!s.admit(rejected("spec.maxReplicas: missing"), start + Duration::from_secs(15)));
        assert!(s.admit(rejected("spec.metrics[0].type: unknown"), start + Duration::from_secs(30)));
    }

    #[test]
    fn memory_is_bounded() {
        let start = Instant::now();
        let mut s = Suppressor::new(Duration::from_secs(1));
        for i in 0..(MAX_REMEMBERED + 10) {
            s.admit(key(&format!("R{i}"), "text"), start + Duration::from_secs(i as u64 * 2));
        }
        assert!(s.sent.len() <= MAX_REMEMBERED);
    }

    #[test]
    fn long_messages_are_cut_on_a_character_boundary() {
        let text = "é".repeat(600);
        let cut = truncate(&text, 1000);
        assert!(cut.len() <= 1000 && cut.ends_with("..."));
        assert_eq!(truncate("short", 1000), "short");
    }
}
