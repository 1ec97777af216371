//! The WatermarkPodAutoscaler objects of the cluster as a plain, synchronous index: the watch
//! feeds it objects (applied, deleted, or a scope's complete listing), then asks what changed
//! for the scheduler. No I/O and no clock here, so every rule of CRD mode is a unit test:
//! when a change re-maps everything, when it only refreshes a running autoscaler's object,
//! when nothing runs yet (a scope not listed), and which objects are rejected.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::source::{AutoscalerKey, Desired};
use crate::adapters::telemetry::LabelsAsTags;
use crate::domain::crd::{
    self, DatadogMetric, DatadogMetricIndex, MapError, MappingOptions, RecommenderPolicy, WatermarkPodAutoscaler,
};
use crate::domain::rules::{ObjectIdentity, Problem, RulesFile, TargetRef};

/// Where one watch looks: one namespace, or every namespace.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    All,
    Namespace(String),
}

impl Scope {
    fn covers(&self, namespace: &str) -> bool {
        match self {
            Scope::All => true,
            Scope::Namespace(ns) => ns == namespace,
        }
    }
}

/// An object's namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn of(metadata: &kube::api::ObjectMeta) -> ObjectKey {
        ObjectKey {
            namespace: metadata.namespace.clone().unwrap_or_default(),
            name: metadata.name.clone().unwrap_or_default(),
        }
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A WPA that does not run, and why.
#[derive(Debug)]
pub struct Rejection {
    pub wpa: Arc<WatermarkPodAutoscaler>,
    pub error: MapError,
}

/// What the scheduler must hear after a batch of changes.
#[derive(Debug, Default)]
pub enum Update {
    /// Nothing: no change, or not every scope has been listed yet.
    #[default]
    Nothing,
    /// Every WPA was mapped again: the complete set to run, and the ones that cannot run.
    Replace { desired: Vec<Desired>, rejected: Vec<Rejection> },
    /// Running autoscalers whose object changed only in its status: the newer object.
    Refresh(Vec<(AutoscalerKey, Arc<WatermarkPodAutoscaler>)>),
}

/// How a scope's watches stand.
#[derive(Clone, Copy, Debug, Default)]
struct Listed {
    wpas: bool,
    metrics: bool,
}

pub struct WpaIndex {
    wpas: BTreeMap<ObjectKey, Arc<WatermarkPodAutoscaler>>,
    metrics: BTreeMap<ObjectKey, Arc<DatadogMetric>>,
    listed: BTreeMap<Scope, Listed>,
    options: MappingOptions,
    default_backend: String,
    /// The recommenders WPAs may use (the daemon's settings).
    recommender_policy: RecommenderPolicy,
    labels_as_tags: LabelsAsTags,
    daemon_dry_run: bool,
    /// Something that maps changed since the last update.
    remap: bool,
    /// Objects whose status alone changed since the last update.
    refreshed: BTreeSet<ObjectKey>,
    /// The WPAs that did not map last time, with the error said about them (said once).
    rejected: BTreeMap<ObjectKey, String>,
    /// The last problem of the mapping options that was logged (said once, not per re-map).
    options_problem: Option<String>,
    /// Whether the cluster was found not to serve DatadogMetric (said once).
    metrics_absent: bool,
    /// The objects the rules file's active autoscalers scale, and their names: no WPA runs on
    /// one of them.
    file_targets: Vec<(TargetRef, Arc<str>)>,
}

impl WpaIndex {
    /// An index over these scopes (each must be listed, WPAs and DatadogMetrics both, before
    /// anything runs), mapping WPAs with the rules file's backends and allowing their
    /// recommenders by `recommender_policy`.
    pub fn new(
        scopes: impl IntoIterator<Item = Scope>,
        backends: &RulesFile,
        default_backend: &str,
        recommender_policy: RecommenderPolicy,
        labels_as_tags: LabelsAsTags,
        daemon_dry_run: bool,
    ) -> WpaIndex {
        let mut index = WpaIndex {
            wpas: BTreeMap::new(),
            metrics: BTreeMap::new(),
            listed: scopes.into_iter().map(|s| (s, Listed::default())).collect(),
            options: MappingOptions::new(default_backend),
            default_backend: default_backend.to_string(),
            recommender_policy,
            labels_as_tags,
            daemon_dry_run,
            remap: false,
            refreshed: BTreeSet::new(),
            rejected: BTreeMap::new(),
            options_problem: None,
            metrics_absent: false,
            file_targets: Vec::new(),
        };
        index.set_backends(backends);
        index
    }

    /// The rules file changed (its backends, and the targets it scales): every WPA maps again.
    pub fn set_backends(&mut self, backends: &RulesFile) {
        self.file_targets.clone_from(&backends.scaled);
        self.options = MappingOptions::new(self.default_backend.clone())
            .with_backends(&backends.backends)
            .with_recommender_policy(self.recommender_policy.clone());
        let invalid = self.options.check().err();
        let fatal = invalid.is_some();
        let problem = invalid.or_else(|| self.options.default_backend_problem());
        if problem != self.options_problem {
            match (&problem, fatal) {
                (Some(problem), true) => {
                    tracing::error!(problem = %problem, "WatermarkPodAutoscaler objects cannot run")
                }
                (Some(problem), false) => tracing::info!(
                    problem = %problem,
                    "WatermarkPodAutoscaler metrics without a query in the watermarkd.io/queries annotation cannot \
                     run; the others do"
                ),
                (None, _) => {}
            }
            self.options_problem = problem;
        }
        self.remap = true;
    }

    pub fn apply_wpa(&mut self, wpa: Arc<WatermarkPodAutoscaler>) {
        let key = ObjectKey::of(&wpa.metadata);
        let status_only = self.wpas.get(&key).is_some_and(|old| same_but_status(old, &wpa));
        if status_only {
            self.refreshed.insert(key.clone());
        } else {
            self.remap = true;
        }
        self.wpas.insert(key, wpa);
    }

    pub fn delete_wpa(&mut self, key: &ObjectKey) {
        self.wpas.remove(key);
        self.rejected.remove(key);
        self.refreshed.remove(key);
        self.remap = true;
    }

    /// A scope's complete listing (first, or again after its watch restarted).
    pub fn reset_wpas(&mut self, scope: &Scope, wpas: impl IntoIterator<Item = Arc<WatermarkPodAutoscaler>>) {
        self.wpas.retain(|key, _| !scope.covers(&key.namespace));
        self.rejected.retain(|key, _| !scope.covers(&key.namespace));
        for wpa in wpas {
            self.wpas.insert(ObjectKey::of(&wpa.metadata), wpa);
        }
        self.listed.entry(scope.clone()).or_default().wpas = true;
        self.remap = true;
    }

    pub fn apply_metric(&mut self, metric: Arc<DatadogMetric>) {
        self.metrics.insert(ObjectKey::of(&metric.metadata), metric);
        self.remap = true;
    }

    pub fn delete_metric(&mut self, key: &ObjectKey) {
        self.metrics.remove(key);
        self.remap = true;
    }

    pub fn reset_metrics(&mut self, scope: &Scope, metrics: impl IntoIterator<Item = Arc<DatadogMetric>>) {
        if self.metrics_absent {
            tracing::info!("the DatadogMetric resource is served now; datadogmetric@ references resolve");
            self.metrics_absent = false;
        }
        self.metrics.retain(|key, _| !scope.covers(&key.namespace));
        for metric in metrics {
            self.metrics.insert(ObjectKey::of(&metric.metadata), metric);
        }
        self.listed.entry(scope.clone()).or_default().metrics = true;
        self.remap = true;
    }

    /// DatadogMetric comes with the Datadog Cluster Agent's CRDs, which a cluster that never
    /// ran it lacks: then there are none, and only the WPAs that reference one fail (each says
    /// so in its status).
    pub fn metrics_absent(&mut self, scope: &Scope, recheck: std::time::Duration) {
        if !self.metrics_absent {
            tracing::info!(
                "the DatadogMetric resource is not served by this cluster; datadogmetric@ references cannot resolve \
                 until it is (checked again every {}s)",
                recheck.as_secs()
            );
            self.metrics_absent = true;
        }
        let before = self.metrics.len();
        self.metrics.retain(|key, _| !scope.covers(&key.namespace));
        let listed = self.listed.entry(scope.clone()).or_default();
        if self.metrics.len() != before || !listed.metrics {
            self.remap = true;
        }
        listed.metrics = true;
    }

    /// Whether every scope has been listed, WPAs and DatadogMetrics: until then nothing runs,
    /// so that a WPA referencing a DatadogMetric not yet listed is not rejected for it.
    pub fn is_synced(&self) -> bool {
        self.listed.values().all(|l| l.wpas && l.metrics)
    }

    /// What changed since the last call, for the scheduler.
    pub fn update(&mut self) -> Update {
        if !self.is_synced() {
            return Update::Nothing;
        }
        let refreshed = std::mem::take(&mut self.refreshed);
        if std::mem::take(&mut self.remap) {
            return self.map_all();
        }
        let refreshed: Vec<_> = refreshed
            .into_iter()
            .filter(|key| !self.rejected.contains_key(key))
            .filter_map(|key| {
                let wpa = self.wpas.get(&key)?;
                Some((AutoscalerKey::wpa(&key.namespace, &key.name), Arc::clone(wpa)))
            })
            .collect();
        if refreshed.is_empty() {
            Update::Nothing
        } else {
            Update::Refresh(refreshed)
        }
    }

    fn map_all(&mut self) -> Update {
        let index = DatadogMetricIndex::from_objects(self.metrics.values().map(|m| &**m));
        let mut desired = Vec::with_capacity(self.wpas.len());
        let mut rejected = Vec::new();
        let mut said = BTreeMap::new();
        for (key, wpa) in &self.wpas {
            match crd::map_wpa(wpa, &self.options, &index) {
                Ok(mapped) => {
                    for note in &mapped.notes {
                        tracing::debug!(wpa = %mapped.autoscaler.name, note = %note, "WPA mapped");
                    }
                    let tags = self.labels_as_tags.tags(wpa.metadata.labels.as_ref());
                    desired.push(Desired::from_wpa(Arc::clone(wpa), mapped.autoscaler, tags, self.daemon_dry_run));
                }
                Err(error) => {
                    let message = error.to_string();
                    if self.rejected.get(key) != Some(&message) {
                        tracing::warn!(wpa = %key, error = %message, "WPA not run");
                    }
                    said.insert(key.clone(), message);
                    rejected.push(Rejection { wpa: Arc::clone(wpa), error });
                }
            }
        }
        let (desired, conflicts) = settle_conflicts(desired, &self.file_targets);
        for (loser, error) in conflicts {
            let Some(wpa) = loser.source.wpa() else { continue };
            let key = ObjectKey::of(&wpa.metadata);
            let message = error.to_string();
            if self.rejected.get(&key) != Some(&message) {
                tracing::warn!(wpa = %key, error = %message, "WPA not run");
            }
            said.insert(key, message);
            rejected.push(Rejection { wpa: Arc::clone(wpa), error });
        }
        let (desired, lone) = super::source::attach_shadows(desired);
        for (shadow, why) in lone {
            let Some(wpa) = shadow.source.wpa() else { continue };
            let key = ObjectKey::of(&wpa.metadata);
            let error = MapError::Invalid {
                problems: vec![Problem {
                    line: None,
                    autoscaler: Some(shadow.autoscaler.name.to_string()),
                    field: format!("metadata.annotations[{:?}]", crd::SHADOW_ANNOTATION),
                    message: format!("is \"true\", but {why}"),
                }],
                unsupported: Vec::new(),
            };
            let message = error.to_string();
            if self.rejected.get(&key) != Some(&message) {
                tracing::warn!(wpa = %key, error = %message, "WPA not run");
            }
            said.insert(key, message);
            rejected.push(Rejection { wpa: Arc::clone(wpa), error });
        }
        self.rejected = said;
        Update::Replace { desired, rejected }
    }
}

/// One active autoscaler per object: when several active WPAs (shadow rules aside, which never
/// write) scale the same object, or one scales an object the rules file scales, only one runs,
/// so that they do not fight over its replicas. The rules file's autoscaler wins (it is the
/// operator's own), then the oldest WPA by `creationTimestamp`, then by name; the others are
/// returned with why they wait. Deleting the one that runs lets the next one run.
fn settle_conflicts(
    desired: Vec<Desired>,
    file_targets: &[(TargetRef, Arc<str>)],
) -> (Vec<Desired>, Vec<(Desired, MapError)>) {
    let by_file: HashMap<ObjectIdentity<'_>, &str> =
        file_targets.iter().map(|(target, name)| (target.identity(), &**name)).collect();
    let mut order: Vec<usize> =
        (0..desired.len()).filter(|&i| desired.get(i).is_some_and(|d| !d.autoscaler.shadow)).collect();
    order.sort_by_key(|&i| {
        let metadata = desired.get(i).and_then(|d| d.source.wpa()).map(|wpa| &wpa.metadata);
        let created = metadata.and_then(|m| m.creation_timestamp.clone());
        // An object from the API always has a creation time; one without sorts last.
        (created.is_none(), created, metadata.and_then(|m| m.name.clone()))
    });
    let mut running: HashMap<ObjectIdentity<'_>, &Desired> = HashMap::new();
    let mut waiting: HashMap<usize, MapError> = HashMap::new();
    for i in order {
        let Some(candidate) = desired.get(i) else { continue };
        let target = &candidate.autoscaler.target;
        let holder = match (by_file.get(&target.identity()), running.get(&target.identity())) {
            (Some(name), _) => format!("the rules file's autoscaler {name:?}"),
            (None, Some(older)) => format!("WatermarkPodAutoscaler {} (the older one)", older.autoscaler.name),
            (None, None) => {
                running.insert(target.identity(), candidate);
                continue;
            }
        };
        let error = MapError::TargetConflict {
            wpa: candidate.autoscaler.name.to_string(),
            target: format!("{} {}/{}", target.kind, target.namespace, target.name),
            holder,
        };
        waiting.insert(i, error);
    }
    let mut run = Vec::with_capacity(desired.len().saturating_sub(waiting.len()));
    let mut wait = Vec::with_capacity(waiting.len());
    for (i, candidate) in desired.into_iter().enumerate() {
        match waiting.remove(&i) {
            Some(error) => wait.push((candidate, error)),
            None => run.push(candidate),
        }
    }
    (run, wait)
}

/// Whether two versions of a WPA differ at most in status and bookkeeping metadata, so that
/// the autoscaler it maps to, and its series' labels, are the same. Its Kubernetes labels
/// count: labels-as-tags export them, and a change must re-map the WPA to reach its series.
fn same_but_status(old: &WatermarkPodAutoscaler, new: &WatermarkPodAutoscaler) -> bool {
    old.spec == new.spec
        && old.metadata.annotations == new.metadata.annotations
        && old.metadata.labels == new.metadata.labels
        && old.metadata.generation == new.metadata.generation
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::domain::crd::WatermarkPodAutoscalerStatus;

    fn rules() -> RulesFile {
        crate::domain::rules::parse_rules(
            "[backend.datadog]\ntype = \"datadog\"\nurl = \"http://127.0.0.1:1\"\napi_key_env = \"K\"\napp_key_env = \"A\"\n",
            "rules.toml",
        )
        .expect("rules")
    }

    fn index(scopes: &[Scope]) -> WpaIndex {
        WpaIndex::new(
            scopes.iter().cloned(),
            &rules(),
            "datadog",
            RecommenderPolicy::default(),
            LabelsAsTags::default(),
            false,
        )
    }

    fn wpa(namespace: &str, name: &str, high: &str) -> Arc<WatermarkPodAutoscaler> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "datadoghq.com/v1alpha1",
                "kind": "WatermarkPodAutoscaler",
                "metadata": { "name": name, "namespace": namespace, "generation": 1 },
                "spec": {
                    "minReplicas": 1, "maxReplicas": 5,
                    "scaleTargetRef": { "apiVersion": "apps/v1", "kind": "Deployment", "name": name },
                    "metrics": [{ "type": "External", "external": {
                        "metricName": "load", "metricSelector": { "matchLabels": { "app": name } },
                        "highWatermark": high, "lowWatermark": "1"
                    } }]
                }
            }))
            .expect("a WPA"),
        )
    }

    fn with_status(wpa: &WatermarkPodAutoscaler) -> Arc<WatermarkPodAutoscaler> {
        let mut next = wpa.clone();
        next.status = Some(WatermarkPodAutoscalerStatus { current_replicas: 3, ..Default::default() });
        next.metadata.resource_version = Some("2".into());
        Arc::new(next)
    }

    fn names(update: &Update) -> (Vec<String>, Vec<String>) {
        match update {
            Update::Replace { desired, rejected } => (
                desired.iter().map(|d| d.key.to_string()).collect(),
                rejected.iter().map(|r| ObjectKey::of(&r.wpa.metadata).to_string()).collect(),
            ),
            other => panic!("expected a replacement, got {other:?}"),
        }
    }

    #[test]
    fn nothing_runs_until_every_scope_has_listed_both_kinds() {
        let a = Scope::Namespace("a".into());
        let b = Scope::Namespace("b".into());
        let mut index = index(&[a.clone(), b.clone()]);
        index.reset_wpas(&a, [wpa("a", "web", "10")]);
        index.reset_metrics(&a, []);
        assert!(matches!(index.update(), Update::Nothing));
        index.reset_wpas(&b, []);
        assert!(!index.is_synced());
        index.metrics_absent(&b, Duration::from_secs(300));
        assert!(index.is_synced());
        assert_eq!(names(&index.update()), (vec!["crd/a/web".to_string()], vec![]));
        assert!(matches!(index.update(), Update::Nothing), "no change since");
    }

    #[test]
    fn a_spec_change_maps_again_and_a_status_change_only_refreshes() {
        let mut index = index(&[Scope::All]);
        let web = wpa("shop", "web", "10");
        index.reset_wpas(&Scope::All, [Arc::clone(&web)]);
        index.reset_metrics(&Scope::All, []);
        assert_eq!(names(&index.update()).0, ["crd/shop/web"]);

        // Our own status write comes back: only the object is new.
        index.apply_wpa(with_status(&web));
        match index.update() {
            Update::Refresh(objects) => {
                assert_eq!(objects.len(), 1);
                assert_eq!(objects[0].0, AutoscalerKey::wpa("shop", "web"));
                assert_eq!(objects[0].1.status.as_ref().map(|s| s.current_replicas), Some(3));
            }
            other => panic!("expected a refresh, got {other:?}"),
        }
        // A new watermark is a new autoscaler.
        index.apply_wpa(wpa("shop", "web", "20"));
        match index.update() {
            Update::Replace { desired, .. } => {
                assert_eq!(desired[0].autoscaler.rule.metrics()[0].high_watermark.to_string(), "20");
            }
            other => panic!("expected a replacement, got {other:?}"),
        }
        // A label counts too (labels-as-tags export them).
        let mut labelled = (*wpa("shop", "web", "20")).clone();
        labelled.metadata.labels = Some([("team".to_string(), "a".to_string())].into());
        index.apply_wpa(Arc::new(labelled));
        assert!(matches!(index.update(), Update::Replace { .. }));
    }

    /// A WPA named `name` on `wpa`'s target, marked a shadow rule with `value`.
    fn shadow(of: &WatermarkPodAutoscaler, name: &str, value: &str) -> Arc<WatermarkPodAutoscaler> {
        let mut shadow = of.clone();
        shadow.metadata.name = Some(name.into());
        shadow.metadata.annotations = Some([(crd::SHADOW_ANNOTATION.to_string(), value.to_string())].into());
        Arc::new(shadow)
    }

    #[test]
    fn a_shadow_wpa_runs_with_the_active_one_on_its_target_or_is_rejected() {
        let mut index = index(&[Scope::All]);
        let web = wpa("shop", "web", "10");
        let other_namespace = wpa("stage", "web", "10");
        index.reset_wpas(
            &Scope::All,
            [
                Arc::clone(&web),
                shadow(&web, "web-next", "true"),
                // Same target name, other namespace: no active WPA on its target.
                shadow(&other_namespace, "web-next", "true"),
                shadow(&web, "web-typo", "yes"),
            ],
        );
        index.reset_metrics(&Scope::All, []);
        let update = index.update();
        assert_eq!(
            names(&update),
            (vec!["crd/shop/web".to_string()], vec!["shop/web-typo".to_string(), "stage/web-next".to_string()])
        );
        let Update::Replace { desired, rejected } = update else { unreachable!() };
        let shadows: Vec<&str> = desired[0].shadows.iter().map(|s| &*s.name).collect();
        assert_eq!(shadows, ["web-next"]);
        assert!(desired[0].shadows[0].autoscaler.shadow);
        let errors: Vec<String> = rejected.iter().map(|r| r.error.to_string()).collect();
        assert!(
            errors[0].contains(r#"metadata.annotations["watermarkd.io/shadow"] must be "true" or "false", not "yes""#),
            "{errors:?}"
        );
        assert!(
            errors[1].contains(
                r#"metadata.annotations["watermarkd.io/shadow"] is "true", but no active autoscaler targets Deployment stage/web"#
            ),
            "{errors:?}"
        );
    }

    /// `wpa` created at `created` (RFC 3339), scaling `target` (a Deployment) through `api_version`.
    fn created(
        namespace: &str,
        name: &str,
        created: &str,
        target: &str,
        api_version: &str,
    ) -> Arc<WatermarkPodAutoscaler> {
        let mut object = (*wpa(namespace, name, "10")).clone();
        object.metadata.creation_timestamp = Some(serde_json::from_value(json!(created)).expect("a time"));
        if let Some(reference) = object.spec.scale_target_ref.as_mut() {
            reference.name = Some(target.into());
            reference.api_version = Some(api_version.into());
        }
        Arc::new(object)
    }

    fn conflicts(update: &Update) -> Vec<String> {
        let Update::Replace { rejected, .. } = update else { panic!("expected a replacement, got {update:?}") };
        rejected
            .iter()
            .filter(|r| matches!(r.error, MapError::TargetConflict { .. }))
            .map(|r| r.error.to_string())
            .collect()
    }

    #[test]
    fn of_two_active_wpas_on_one_target_the_older_runs_until_it_is_deleted() {
        let mut index = index(&[Scope::All]);
        index.reset_wpas(
            &Scope::All,
            [
                // Named first, created last: age decides, not the name.
                created("shop", "a-new", "2026-03-01T00:00:00Z", "web", "apps/v1"),
                created("shop", "old", "2026-01-01T00:00:00Z", "web", "apps/v1"),
                // Another version of the same group reaches the same Deployment.
                created("shop", "beta", "2026-02-01T00:00:00Z", "web", "apps/v1beta2"),
                // Same creation time as `old`: the name breaks the tie.
                created("shop", "tie", "2026-01-01T00:00:00Z", "web", "apps/v1"),
                // Another object, and the same name in another namespace: no conflict.
                created("shop", "api", "2026-03-01T00:00:00Z", "api", "apps/v1"),
                created("stage", "web", "2026-03-01T00:00:00Z", "web", "apps/v1"),
                // A shadow rule may share the target.
                shadow(&created("shop", "x", "2026-04-01T00:00:00Z", "web", "apps/v1"), "web-next", "true"),
            ],
        );
        index.reset_metrics(&Scope::All, []);
        let update = index.update();
        let (running, rejected) = names(&update);
        assert_eq!(running, ["crd/shop/api", "crd/shop/old", "crd/stage/web"]);
        assert_eq!(rejected, ["shop/a-new", "shop/beta", "shop/tie"]);
        let Update::Replace { desired, .. } = &update else { unreachable!() };
        let old = desired.iter().find(|d| d.key == AutoscalerKey::wpa("shop", "old")).expect("old runs");
        assert_eq!(old.shadows.iter().map(|s| &*s.name).collect::<Vec<_>>(), ["web-next"], "the shadow rides on it");
        let errors = conflicts(&update);
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(
            errors[0].starts_with(
                "WatermarkPodAutoscaler shop/a-new: not run: Deployment shop/web is already scaled by \
                 WatermarkPodAutoscaler shop/old (the older one)"
            ),
            "{errors:?}"
        );

        // The one that runs is deleted: the next oldest runs, and only the newest still waits.
        index.delete_wpa(&ObjectKey { namespace: "shop".into(), name: "old".into() });
        let update = index.update();
        assert_eq!(names(&update).0, ["crd/shop/api", "crd/shop/tie", "crd/stage/web"]);
        assert!(conflicts(&update).iter().all(|e| e.contains("scaled by WatermarkPodAutoscaler shop/tie")));
    }

    #[test]
    fn a_wpa_on_an_object_the_rules_file_scales_waits_for_the_file_to_let_go() {
        let file_rules = |target: &str| {
            crate::domain::rules::parse_rules(
                &format!(
                    "[backend.datadog]\ntype = \"datadog\"\nurl = \"http://127.0.0.1:1\"\napi_key_env = \"K\"\n\
                     app_key_env = \"A\"\n[[autoscaler]]\nname = \"file-web\"\n\
                     target = {{ kind = \"Deployment\", namespace = \"shop\", name = \"{target}\" }}\n\
                     max_replicas = 5\n[[autoscaler.metric]]\nbackend = \"datadog\"\nquery = \"q\"\nhigh_watermark = 1\n"
                ),
                "rules.toml",
            )
            .expect("rules")
        };
        let mut index = WpaIndex::new(
            [Scope::All],
            &file_rules("web"),
            "datadog",
            RecommenderPolicy::default(),
            LabelsAsTags::default(),
            false,
        );
        index.reset_wpas(&Scope::All, [created("shop", "web", "2026-01-01T00:00:00Z", "web", "apps/v1")]);
        index.reset_metrics(&Scope::All, []);
        let update = index.update();
        assert_eq!(names(&update), (vec![], vec!["shop/web".to_string()]));
        assert_eq!(
            conflicts(&update)[0],
            "WatermarkPodAutoscaler shop/web: not run: Deployment shop/web is already scaled by the rules file's \
             autoscaler \"file-web\"; two autoscalers on one target would fight over its replicas. This one runs \
             once that one is gone (or delete this one, or mark it a shadow rule with the watermarkd.io/shadow: \
             \"true\" annotation)"
        );
        // The file moves to another target: the WPA runs.
        index.set_backends(&file_rules("api"));
        assert_eq!(names(&index.update()), (vec!["crd/shop/web".to_string()], vec![]));
    }

    #[test]
    fn an_invalid_wpa_is_rejected_alone_and_deleting_it_forgets_it() {
        let mut index = index(&[Scope::All]);
        index.reset_wpas(&Scope::All, [wpa("shop", "web", "10"), wpa("shop", "broken", "0.5")]);
        index.reset_metrics(&Scope::All, []);
        let (running, rejected) = names(&index.update());
        assert_eq!(running, ["crd/shop/web"]);
        assert_eq!(rejected, ["shop/broken"]);
        // A status-only change of a rejected WPA is no refresh: it does not run.
        let broken = index.wpas.get(&ObjectKey { namespace: "shop".into(), name: "broken".into() }).cloned();
        index.apply_wpa(with_status(&broken.expect("kept")));
        assert!(matches!(index.update(), Update::Nothing));
        index.delete_wpa(&ObjectKey { namespace: "shop".into(), name: "broken".into() });
        assert_eq!(names(&index.update()), (vec!["crd/shop/web".to_string()], vec![]));
    }

    #[test]
    fn a_listing_replaces_only_its_own_scope() {
        let a = Scope::Namespace("a".into());
        let b = Scope::Namespace("b".into());
        let mut index = index(&[a.clone(), b.clone()]);
        for scope in [&a, &b] {
            index.reset_metrics(scope, []);
        }
        index.reset_wpas(&a, [wpa("a", "one", "10"), wpa("a", "two", "10")]);
        index.reset_wpas(&b, [wpa("b", "three", "10")]);
        assert_eq!(names(&index.update()).0, ["crd/a/one", "crd/a/two", "crd/b/three"]);
        // a's watch restarted and lists again: `two` was deleted meanwhile.
        index.reset_wpas(&a, [wpa("a", "one", "10")]);
        assert_eq!(names(&index.update()).0, ["crd/a/one", "crd/b/three"]);
    }

    #[test]
    fn a_datadog_metric_reference_resolves_once_the_metric_is_there() {
        let mut index = index(&[Scope::All]);
        let mut referencing = (*wpa("shop", "web", "10")).clone();
        if let Some(metric) = referencing.spec.metrics.first_mut() {
            if let Some(external) = metric.external.as_mut() {
                external.metric_name = "datadogmetric@shop:load".into();
            }
        }
        index.reset_wpas(&Scope::All, [Arc::new(referencing)]);
        index.metrics_absent(&Scope::All, Duration::from_secs(300));
        assert_eq!(names(&index.update()).1, ["shop/web"], "no DatadogMetric resource: rejected");
        index.reset_metrics(&Scope::All, [Arc::new(DatadogMetric::new("shop", "load", "avg:load{app:web}"))]);
        assert_eq!(names(&index.update()).0, ["crd/shop/web"]);
        index.delete_metric(&ObjectKey { namespace: "shop".into(), name: "load".into() });
        assert_eq!(names(&index.update()).1, ["shop/web"]);
    }

    #[test]
    fn new_backends_map_everything_again() {
        let mut index = index(&[Scope::All]);
        index.reset_wpas(&Scope::All, [wpa("shop", "web", "10")]);
        index.reset_metrics(&Scope::All, []);
        assert_eq!(names(&index.update()).0, ["crd/shop/web"]);
        let prometheus_only = crate::domain::rules::parse_rules(
            "[backend.prom]\ntype = \"prometheus\"\nurl = \"http://127.0.0.1:1\"\n",
            "rules.toml",
        )
        .expect("rules");
        index.set_backends(&prometheus_only);
        let (running, rejected) = names(&index.update());
        assert!(running.is_empty(), "the default backend is gone: {running:?}");
        assert_eq!(rejected, ["shop/web"]);
    }
}
