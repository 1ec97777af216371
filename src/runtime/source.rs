//! Where an autoscaler comes from, and what follows from it: its key, where its state is
//! persisted between restarts, and where its status goes.
//!
//! - The rules file: the state is an annotation on the target (`watermarkd.io/state`); there is
//!   no object of the autoscaler's own, so events go on the target.
//! - A WatermarkPodAutoscaler object: the state is the object's status, written as the Datadog
//!   controller writes it, and events go on the object.

use std::fmt;
use std::sync::Arc;

use crate::crd::{WatermarkPodAutoscaler, WatermarkPodAutoscalerStatus};
use crate::rules::{intern, Autoscaler};
use crate::telemetry::SeriesLabels;
use watermarkd_engine::State;

/// Which source an autoscaler comes from. Each source replaces only its own autoscalers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SourceKind {
    RulesFile,
    Wpa,
}

impl SourceKind {
    /// The `source` label of the daemon's series.
    pub fn label(self) -> &'static str {
        match self {
            SourceKind::RulesFile => "file",
            SourceKind::Wpa => "crd",
        }
    }
}

/// What identifies an autoscaler across reloads and re-maps: its source and its name there.
/// Rules-file names are unique within the file; WPA names within their namespace.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AutoscalerKey {
    source: SourceKind,
    /// The WPA's namespace; `None` for the rules file.
    namespace: Option<String>,
    name: String,
}

impl AutoscalerKey {
    pub fn rules_file(name: &str) -> AutoscalerKey {
        AutoscalerKey { source: SourceKind::RulesFile, namespace: None, name: name.to_string() }
    }

    pub fn wpa(namespace: &str, name: &str) -> AutoscalerKey {
        AutoscalerKey { source: SourceKind::Wpa, namespace: Some(namespace.to_string()), name: name.to_string() }
    }

    pub fn source(&self) -> SourceKind {
        self.source
    }
}

/// `file/NAME` or `crd/NAMESPACE/NAME`. The schedule's phase is a hash of this text, so it must
/// not change between versions: a restart keeps every autoscaler's phase.
impl fmt::Display for AutoscalerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            None => write!(f, "{}/{}", self.source.label(), self.name),
            Some(namespace) => write!(f, "{}/{namespace}/{}", self.source.label(), self.name),
        }
    }
}

/// The source of one autoscaler, with what it needs to persist state and report status.
#[derive(Clone, Debug)]
pub enum Source {
    RulesFile,
    /// The object as last seen (its status is where the state was persisted).
    Wpa(Arc<WatermarkPodAutoscaler>),
}

impl Source {
    pub fn wpa(&self) -> Option<&Arc<WatermarkPodAutoscaler>> {
        match self {
            Source::RulesFile => None,
            Source::Wpa(wpa) => Some(wpa),
        }
    }
}

/// An autoscaler a source wants running.
#[derive(Clone, Debug)]
pub struct Desired {
    pub key: AutoscalerKey,
    pub autoscaler: Autoscaler,
    /// Shared with the autoscaler's series (see `AutoscalerMetrics::admit`).
    pub labels: Arc<SeriesLabels>,
    pub source: Source,
}

impl Desired {
    /// An autoscaler of the rules file. `daemon_dry_run` is the daemon's `--dry-run`, which the
    /// series' `dry_run` label includes.
    pub fn from_rules_file(autoscaler: Autoscaler, daemon_dry_run: bool) -> Desired {
        Desired {
            key: AutoscalerKey::rules_file(&autoscaler.name),
            labels: Arc::new(SeriesLabels {
                wpa_name: autoscaler.name.clone(),
                wpa_namespace: autoscaler.target.namespace.clone(),
                resource_name: autoscaler.target.name.clone(),
                resource_namespace: autoscaler.target.namespace.clone(),
                resource_kind: autoscaler.target.kind.clone(),
                // A rules-file autoscaler has no object of its own whose labels could be tags.
                tags: Vec::new(),
                dry_run: daemon_dry_run || autoscaler.rule.dry_run(),
            }),
            autoscaler,
            source: Source::RulesFile,
        }
    }

    /// The autoscaler a WPA maps to; `tags` are its labels exported as tags.
    pub fn from_wpa(
        wpa: Arc<WatermarkPodAutoscaler>,
        autoscaler: Autoscaler,
        tags: Vec<(String, String)>,
        daemon_dry_run: bool,
    ) -> Desired {
        let namespace = wpa.metadata.namespace.clone().unwrap_or_default();
        let name = wpa.metadata.name.clone().unwrap_or_default();
        let target = &autoscaler.target;
        Desired {
            key: AutoscalerKey::wpa(&namespace, &name),
            labels: Arc::new(SeriesLabels {
                wpa_name: name.into(),
                wpa_namespace: intern(&namespace),
                resource_name: target.name.clone(),
                resource_namespace: target.namespace.clone(),
                resource_kind: target.kind.clone(),
                tags,
                dry_run: daemon_dry_run || autoscaler.rule.dry_run(),
            }),
            autoscaler,
            source: Source::Wpa(wpa),
        }
    }
}

/// What an autoscaler remembers of what it persisted, by source.
#[derive(Debug)]
pub enum Persisted {
    /// The state annotation last written on the target, or read from it.
    Annotation { written: Option<State> },
    /// The WPA status last written, or read from the object.
    /// Boxed: most autoscalers at scale come from a rules file, and inline the status would
    /// make every one's memory 70 bytes larger.
    Status { status: Option<Box<WatermarkPodAutoscalerStatus>>, written_at: Option<tokio::time::Instant> },
}

impl Persisted {
    pub fn for_source(source: SourceKind) -> Persisted {
        match source {
            SourceKind::RulesFile => Persisted::Annotation { written: None },
            SourceKind::Wpa => Persisted::Status { status: None, written_at: None },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_print_as_they_always_did_so_phases_survive_an_upgrade() {
        assert_eq!(AutoscalerKey::rules_file("web").to_string(), "file/web");
        assert_eq!(AutoscalerKey::wpa("shop", "web").to_string(), "crd/shop/web");
        assert_ne!(AutoscalerKey::rules_file("web"), AutoscalerKey::wpa("", "web"));
        assert_eq!(AutoscalerKey::wpa("a", "b").source(), SourceKind::Wpa);
    }
}
