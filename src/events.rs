//! Kubernetes Events on the autoscaled objects (`kubectl describe` shows them): one for each
//! scale, and for each failure.
//!
//! A stuck autoscaler meets the same failure every interval. kube's recorder already folds
//! repeats into an event series, but it still makes one API call per repeat; here an identical
//! event (same object, type, reason and message) is sent at most once per `repeat_after`, so a
//! thousand stuck autoscalers cost the API server nothing between those windows.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::Client;
use tokio::time::Instant;

/// Identical events are sent again after this long (kube's recorder keeps a series for 6 min).
pub const DEFAULT_REPEAT_AFTER: Duration = Duration::from_secs(300);
/// Bounds the memory of sent events; older entries are dropped first.
const MAX_REMEMBERED: usize = 10_000;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct EventKey {
    object: (Option<String>, Option<String>, Option<String>, Option<String>),
    warning: bool,
    reason: String,
    note: String,
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
    /// The same event was sent less than `repeat_after` ago.
    Suppressed,
}

pub struct EventPublisher {
    recorder: Recorder,
    suppressor: Mutex<Suppressor>,
}

impl EventPublisher {
    /// `instance` names this daemon in the events' reporting instance.
    pub fn new(client: Client, instance: &str, repeat_after: Duration) -> Self {
        let reporter = Reporter { controller: "watermarkd".into(), instance: Some(instance.to_string()) };
        EventPublisher {
            recorder: Recorder::new(client, reporter),
            suppressor: Mutex::new(Suppressor::new(repeat_after)),
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
    ) -> Result<Published, kube::Error> {
        let key = EventKey {
            object: (object.api_version.clone(), object.kind.clone(), object.namespace.clone(), object.name.clone()),
            warning: type_ == EventType::Warning,
            reason: reason.to_string(),
            note: note.to_string(),
        };
        let admitted = match self.suppressor.lock() {
            Ok(mut suppressor) => suppressor.admit(key, Instant::now()),
            // A panic elsewhere poisoned the lock: sending a duplicate beats losing the event.
            Err(_) => true,
        };
        if !admitted {
            return Ok(Published::Suppressed);
        }
        let event = Event {
            type_,
            reason: reason.to_string(),
            // The events API limits the message to 1 kB.
            note: Some(truncate(note, 1000)),
            action: action.to_string(),
            secondary: None,
        };
        self.recorder.publish(&event, object).await?;
        Ok(Published::Sent)
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

    fn key(reason: &str, note: &str) -> EventKey {
        EventKey {
            object: (Some("apps/v1".into()), Some("Deployment".into()), Some("prod".into()), Some("billing".into())),
            warning: true,
            reason: reason.into(),
            note: note.into(),
        }
    }

    #[test]
    fn identical_events_are_sent_once_per_window() {
        let start = Instant::now();
        let mut s = Suppressor::new(Duration::from_secs(300));
        assert!(s.admit(key("FailedGetMetrics", "timeout"), start));
        assert!(!s.admit(key("FailedGetMetrics", "timeout"), start + Duration::from_secs(15)));
        assert!(!s.admit(key("FailedGetMetrics", "timeout"), start + Duration::from_secs(299)));
        // A different message or reason is a different event.
        assert!(s.admit(key("FailedGetMetrics", "no data"), start + Duration::from_secs(20)));
        assert!(s.admit(key("FailedScale", "timeout"), start + Duration::from_secs(20)));
        assert!(s.admit(key("FailedGetMetrics", "timeout"), start + Duration::from_secs(300)));
    }

    #[test]
    fn memory_is_bounded() {
        let start = Instant::now();
        let mut s = Suppressor::new(Duration::from_secs(1));
        for i in 0..(MAX_REMEMBERED + 10) {
            s.admit(key("R", &i.to_string()), start + Duration::from_secs(i as u64 * 2));
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
