//! Where an autoscaler comes from, and what follows from it: its key, where its state is
//! persisted between restarts, and where its status goes.
//!
//! - The rules file: the state is a ConfigMap per target in the daemon's namespace
//!   (`crate::adapters::state_store`); there is no object of the autoscaler's own, so events go on
//!   the target.
//! - A WatermarkPodAutoscaler object: the state is the object's status, written as the Datadog
//!   controller writes it, and events go on the object.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::adapters::telemetry::SeriesLabels;
use crate::domain::crd::WatermarkPodAutoscaler;
use crate::domain::outcome::Identity;
use crate::domain::rules::{intern, Autoscaler};
use crate::domain::sparse::Sparse;

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

    /// The WPA's namespace; `None` for the rules file.
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
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
    /// Its series' label set, shared with its identity in the ledger.
    pub labels: Arc<SeriesLabels>,
    pub source: Source,
    /// The shadow rules on the same target, evaluated with this autoscaler and compared with it.
    pub shadows: Sparse<Shadow>,
}

/// A shadow rule, as its active autoscaler carries it.
#[derive(Clone, Debug, PartialEq)]
pub struct Shadow {
    /// Its name in the `shadow` label: the rules-file autoscaler's name, or the WPA's name.
    pub name: Arc<str>,
    pub autoscaler: Autoscaler,
}

impl Desired {
    /// Who this autoscaler is, for the ledger: its names are its label set's, shared.
    pub fn identity(&self, default_interval: Duration) -> Identity {
        let autoscaler = &self.autoscaler;
        let mut backends: Vec<Arc<str>> = autoscaler.metrics.iter().map(|m| Arc::from(m.backend.as_str())).collect();
        backends.sort();
        backends.dedup();
        Identity {
            id: self.key.to_string().into(),
            labels: Arc::clone(&self.labels),
            source: self.key.source().label(),
            interval_seconds: autoscaler.interval(default_interval).as_secs(),
            paused_until: autoscaler.paused_until.map(|t| t.to_string()),
            backends,
            shadows: self.shadows.iter().map(|s| Arc::clone(&s.name)).collect(),
            min_replicas: autoscaler.rule.min_replicas(),
            max_replicas: autoscaler.rule.max_replicas(),
        }
    }
}

impl Desired {
    /// The rules of one evaluation, in the order their readings come: this autoscaler's,
    /// then each shadow's.
    pub fn rules(&self) -> impl Iterator<Item = &Autoscaler> {
        std::iter::once(&self.autoscaler).chain(self.shadows.iter().map(|s| &s.autoscaler))
    }

    /// The metric whose reading is the `index`-th of the evaluation (see [`Desired::rules`]).
    pub fn metric_source(&self, index: usize) -> Option<&crate::domain::rules::MetricSource> {
        let mut offset = 0;
        for autoscaler in self.rules() {
            let count = autoscaler.rule.metrics().len();
            if index < offset + count {
                return autoscaler.metrics.get(index - offset);
            }
            offset += count;
        }
        None
    }
}

/// Hands each shadow rule to the one active autoscaler on its target, from the same source
/// (and so, for WPAs, the same namespace). Returns the autoscalers to run and the shadows that
/// have no such partner, or several, with why.
pub fn attach_shadows(desired: Vec<Desired>) -> (Vec<Desired>, Vec<(Desired, String)>) {
    let (shadows, mut active): (Vec<Desired>, Vec<Desired>) = desired.into_iter().partition(|d| d.autoscaler.shadow);
    if shadows.is_empty() {
        return (active, Vec::new());
    }
    let mut on_target: std::collections::HashMap<crate::domain::rules::TargetRef, Vec<usize>> =
        std::collections::HashMap::new();
    for (i, d) in active.iter().enumerate() {
        on_target.entry(d.autoscaler.target.clone()).or_default().push(i);
    }
    let mut lone = Vec::new();
    for shadow in shadows {
        let target = &shadow.autoscaler.target;
        let described = format!("{} {}/{}", target.kind, target.namespace, target.name);
        match on_target.get(target).map_or(&[][..], Vec::as_slice) {
            // `on_target` holds indexes of `active`.
            [one] => {
                let name = Arc::clone(&shadow.labels.wpa_name);
                if let Some(one) = active.get_mut(*one) {
                    one.shadows.push(Shadow { name, autoscaler: shadow.autoscaler });
                }
            }
            [] => lone.push((
                shadow,
                format!("no active autoscaler targets {described}: a shadow rule runs beside the active one"),
            )),
            several => {
                let names: Vec<&str> =
                    several.iter().filter_map(|i| active.get(*i)).map(|d| &*d.labels.wpa_name).collect();
                let why = format!(
                    "several active autoscalers target {described} ({}): a shadow rule is compared with the one \
                     active rule on its target",
                    names.join(", ")
                );
                lone.push((shadow, why));
            }
        }
    }
    (active, lone)
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
            shadows: Sparse::default(),
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
            shadows: Sparse::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desired(text: &str) -> Vec<Desired> {
        let rules = crate::domain::rules::parse_rules(text, "rules.toml").expect("rules");
        rules.autoscalers.into_iter().map(|a| Desired::from_rules_file(a, false)).collect()
    }

    fn autoscaler(name: &str, target: &str, shadow: bool) -> String {
        format!(
            "\n[[autoscaler]]\nname = \"{name}\"\nshadow = {shadow}\n\
             target = {{ kind = \"Deployment\", namespace = \"shop\", name = \"{target}\" }}\n\
             min_replicas = 1\nmax_replicas = 10\n[[autoscaler.metric]]\nbackend = \"p\"\nquery = \"q\"\n\
             high_watermark = 10\nlow_watermark = 1\n"
        )
    }

    #[test]
    fn shadows_ride_with_the_active_autoscaler_on_their_target() {
        let text = format!(
            "[backend.p]\ntype = \"prometheus\"\nurl = \"http://127.0.0.1:1\"\n{}{}{}{}",
            autoscaler("web", "web", false),
            autoscaler("api", "api", false),
            autoscaler("web-next", "web", true),
            autoscaler("web-other", "web", true),
        );
        let (running, lone) = attach_shadows(desired(&text));
        assert!(lone.is_empty());
        let shape: Vec<(String, Vec<String>)> = running
            .iter()
            .map(|d| (d.autoscaler.name.to_string(), d.shadows.iter().map(|s| s.name.to_string()).collect()))
            .collect();
        assert_eq!(
            shape,
            [("web".into(), vec!["web-next".to_string(), "web-other".to_string()]), ("api".into(), Vec::new())]
        );
        let names: Vec<&str> = running[0].rules().map(|a| &*a.name).collect();
        assert_eq!(names, ["web", "web-next", "web-other"]);
        // The readings come in that order: one metric each.
        assert_eq!(running[0].metric_source(2).map(|m| m.query.as_str()), Some("q"));
        assert!(running[0].metric_source(3).is_none());
    }

    #[test]
    fn a_wpa_is_on_the_board_by_its_own_name_beside_its_namespace() {
        let wpa: WatermarkPodAutoscaler = serde_json::from_value(serde_json::json!({
            "apiVersion": "datadoghq.com/v1alpha1", "kind": "WatermarkPodAutoscaler",
            "metadata": { "name": "esc", "namespace": "other" }, "spec": {}
        }))
        .expect("a WPA");
        let text = format!(
            "[backend.p]\ntype = \"prometheus\"\nurl = \"http://127.0.0.1:1\"\n{}",
            autoscaler("x", "web", false)
        );
        let mut autoscaler = desired(&text).remove(0).autoscaler;
        // What the mapping names a WPA's autoscaler (its log lines say it so).
        autoscaler.name = "other/esc".into();
        let identity =
            Desired::from_wpa(Arc::new(wpa), autoscaler, Vec::new(), false).identity(Duration::from_secs(15));
        assert_eq!((&*identity.id, &**identity.name(), &**identity.namespace()), ("crd/other/esc", "esc", "other"));
    }

    #[test]
    fn keys_print_as_they_always_did_so_phases_survive_an_upgrade() {
        assert_eq!(AutoscalerKey::rules_file("web").to_string(), "file/web");
        assert_eq!(AutoscalerKey::wpa("shop", "web").to_string(), "crd/shop/web");
        assert_ne!(AutoscalerKey::rules_file("web"), AutoscalerKey::wpa("", "web"));
        assert_eq!(AutoscalerKey::wpa("a", "b").source(), SourceKind::Wpa);
        assert_eq!((AutoscalerKey::wpa("a", "b").namespace(), &*AutoscalerKey::wpa("a", "b").name), (Some("a"), "b"));
    }
}
