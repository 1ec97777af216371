//! Where autoscalers come from: the rules file (reloaded when it changes or on SIGHUP) and the
//! cluster's WatermarkPodAutoscaler objects (watched).

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::{mpsc, watch};

use super::{evaluate, Command, Desired, Shared, SourceKind};
use crate::crd::{self, DatadogMetric, DatadogMetricIndex, MapError, MappingOptions, WatermarkPodAutoscaler};
use crate::events::{EventType, Repeats};
use crate::rules::{self, RulesFile};
use crate::telemetry::SeriesLabels;

/// Splits a rules file into its autoscalers, keyed `file/NAME`, and the rest (the backends,
/// which CRD mode also needs). The autoscalers move: the daemon keeps one copy of each.
/// `daemon_dry_run` is the daemon's --dry-run, which the series' `dry_run` label includes.
pub fn split(rules: RulesFile, daemon_dry_run: bool) -> (Arc<RulesFile>, Vec<Desired>) {
    let desired = rules
        .autoscalers
        .into_iter()
        .map(|autoscaler| Desired {
            key: format!("file/{}", autoscaler.name),
            labels: SeriesLabels {
                wpa_name: autoscaler.name.clone(),
                wpa_namespace: autoscaler.target.namespace.clone(),
                resource_name: autoscaler.target.name.clone(),
                resource_namespace: autoscaler.target.namespace.clone(),
                resource_kind: autoscaler.target.kind.clone(),
                // A rules-file autoscaler has no object of its own whose labels could be tags.
                tags: Vec::new(),
                dry_run: daemon_dry_run || autoscaler.rule.dry_run(),
            },
            autoscaler,
            wpa: None,
        })
        .collect();
    (Arc::new(RulesFile { backends: rules.backends, autoscalers: Vec::new() }), desired)
}

pub struct RulesWatch {
    pub path: PathBuf,
    pub poll: Duration,
    pub commands: mpsc::Sender<Command>,
    pub rules: watch::Sender<Option<Arc<RulesFile>>>,
    pub reload: mpsc::Receiver<()>,
    pub shared: Arc<Shared>,
    pub notifier: super::systemd::Notifier,
    pub shutdown: watch::Receiver<bool>,
}

/// What identifies the file's content without reading it: the resolved file (symlinks
/// followed, so a ConfigMap's `..data` swap is a new inode), its size and its mtime.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Fingerprint {
    device: u64,
    inode: u64,
    size: u64,
    modified_nanos: i128,
}

fn fingerprint(path: &std::path::Path) -> Option<Fingerprint> {
    let metadata = std::fs::metadata(path).ok()?;
    Some(Fingerprint {
        device: metadata.dev(),
        inode: metadata.ino(),
        size: metadata.size(),
        modified_nanos: i128::from(metadata.mtime()) * 1_000_000_000 + i128::from(metadata.mtime_nsec()),
    })
}

fn content_hash(text: &str) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut hasher);
    hasher.finish()
}

/// Checks the file every `poll` (by its resolved identity, size and mtime, so editors' renames
/// and ConfigMap symlink swaps are seen) and reloads on a change of content or on SIGHUP.
pub async fn watch_rules_file(mut watch: RulesWatch) {
    let mut seen = fingerprint(&watch.path);
    let mut applied_hash = std::fs::read_to_string(&watch.path).ok().map(|t| content_hash(&t));
    // The last content that failed, so a broken file is reported once, not every poll.
    let mut failed_hash: Option<u64> = None;
    loop {
        let forced = tokio::select! {
            _ = tokio::time::sleep(watch.poll) => false,
            Some(()) = watch.reload.recv() => true,
            _ = watch.shutdown.changed() => return,
        };
        let now_seen = fingerprint(&watch.path);
        if !forced && now_seen == seen {
            continue;
        }
        seen = now_seen;
        let text = match std::fs::read_to_string(&watch.path) {
            Ok(text) => text,
            Err(err) => {
                // Mid-swap, or deleted: keep the rules that run.
                if forced {
                    reload_failed(&watch.shared, &format!("cannot read {}: {err}", watch.path.display()));
                }
                continue;
            }
        };
        let hash = content_hash(&text);
        if !forced && (Some(hash) == applied_hash || Some(hash) == failed_hash) {
            continue;
        }
        if forced {
            watch.notifier.reloading();
        }
        match rules::parse_rules(&text, &watch.path.display().to_string()) {
            Ok(next) => {
                failed_hash = None;
                applied_hash = Some(hash);
                watch.shared.daemon.reloads.with_label_values(&["success"]).inc();
                watch.shared.daemon.last_reload_successful.set(1);
                tracing::info!(file = %watch.path.display(), autoscalers = next.autoscalers.len(), "rules reloaded");
                let (backends, desired) = split(next, watch.shared.dry_run);
                if watch.commands.send(Command::Backends(Arc::clone(&backends))).await.is_err() {
                    return;
                }
                if watch.commands.send(Command::Replace { source: SourceKind::File, desired }).await.is_err() {
                    return;
                }
                watch.rules.send_replace(Some(backends));
                // The parse's garbage: give it back.
                super::memory::release_free();
            }
            Err(err) => {
                failed_hash = Some(hash);
                for problem in &err.problems {
                    tracing::error!(file = %err.origin, problem = %problem, "invalid rules");
                }
                reload_failed(
                    &watch.shared,
                    &format!("{} problem(s) in {}; the previous rules keep running", err.problems.len(), err.origin),
                );
            }
        }
        if forced {
            watch.notifier.ready();
        }
    }
}

fn reload_failed(shared: &Shared, message: &str) {
    shared.daemon.reloads.with_label_values(&["failure"]).inc();
    shared.daemon.last_reload_successful.set(0);
    tracing::error!("rules reload failed: {message}");
}

pub struct WpaWatch {
    pub client: Client,
    pub namespaces: Vec<String>,
    pub default_backend: String,
    pub rules: watch::Receiver<Option<Arc<RulesFile>>>,
    pub commands: mpsc::Sender<Command>,
    pub shared: Arc<Shared>,
    pub synced: Arc<AtomicBool>,
    pub shutdown: watch::Receiver<bool>,
}

/// One watch event, with the index of the scope (namespace, or all) whose watch sent it.
enum Change {
    Wpa(usize, Box<Result<Event<WatermarkPodAutoscaler>, watcher::Error>>),
    Metric(usize, Box<Result<Event<DatadogMetric>, watcher::Error>>),
    /// The cluster does not serve the DatadogMetric resource (checked by discovery).
    MetricsAbsent(usize),
}

type Key = (String, String);

fn key_of(metadata: &kube::api::ObjectMeta) -> Key {
    (metadata.namespace.clone().unwrap_or_default(), metadata.name.clone().unwrap_or_default())
}

/// Watches WPAs and DatadogMetrics (all namespaces, or each listed one) and sends the mapped
/// autoscalers after every change. An invalid WPA gets a status condition and a Warning event
/// and does not run; the others are unaffected.
pub async fn watch_wpas(mut watch: WpaWatch) {
    let (sender, mut changes) = mpsc::channel::<Change>(256);
    let scopes: Vec<Option<String>> =
        if watch.namespaces.is_empty() { vec![None] } else { watch.namespaces.iter().cloned().map(Some).collect() };
    let mut tasks = tokio::task::JoinSet::new();
    for (scope_index, scope) in scopes.iter().enumerate() {
        let wpas: Api<WatermarkPodAutoscaler> = match scope {
            Some(ns) => Api::namespaced(watch.client.clone(), ns),
            None => Api::all(watch.client.clone()),
        };
        let metrics: Api<DatadogMetric> = match scope {
            Some(ns) => Api::namespaced(watch.client.clone(), ns),
            None => Api::all(watch.client.clone()),
        };
        let to = sender.clone();
        tasks.spawn(async move {
            let config = watcher::Config::default();
            let mut stream = crate::workload::RetryingWatch::new(Box::pin(watcher::watcher(wpas, config)));
            while let Some(event) = stream.next().await {
                if to.send(Change::Wpa(scope_index, Box::new(event))).await.is_err() {
                    return;
                }
            }
        });
        tasks.spawn(watch_datadog_metrics(watch.client.clone(), metrics, scope_index, sender.clone()));
    }
    drop(sender);

    // Per scope: its objects, and the listing in progress after a (re)start of its watch.
    let mut wpas: Vec<HashMap<Key, Arc<WatermarkPodAutoscaler>>> = vec![HashMap::new(); scopes.len()];
    let mut wpa_listings: Vec<Option<HashMap<Key, Arc<WatermarkPodAutoscaler>>>> = vec![None; scopes.len()];
    let mut metrics: Vec<HashMap<Key, DatadogMetric>> = vec![HashMap::new(); scopes.len()];
    let mut metric_listings: Vec<Option<HashMap<Key, DatadogMetric>>> = vec![None; scopes.len()];
    let mut initialized = vec![[false; 2]; scopes.len()];
    let mut rejected: BTreeMap<Key, String> = BTreeMap::new();
    let mut statuses: HashMap<Key, crd::WatermarkPodAutoscalerStatus> = HashMap::new();
    let mut rules_changed = false;
    let health = watch.shared.targets.watch_health();
    // Whether the DatadogMetric resource was found missing (logged once, not per re-check).
    let mut metrics_absent = false;
    // The last problem of the mapping options that was logged: said once, not per re-map.
    let mut options_problem: Option<String> = None;
    loop {
        let first = tokio::select! {
            change = changes.recv() => match change { Some(c) => Some(c), None => return },
            changed = watch.rules.changed() => {
                if changed.is_err() { return; }
                rules_changed = true;
                None
            }
            _ = watch.shutdown.changed() => return,
        };
        // Take everything already queued, so a burst is mapped once.
        let mut batch: Vec<Change> = first.into_iter().collect();
        while let Ok(change) = changes.try_recv() {
            batch.push(change);
        }
        let mut dirty = rules_changed;
        rules_changed = false;
        // WPAs whose only change is their status (mostly our own writes): nothing to map again.
        let mut refreshed: Vec<Arc<WatermarkPodAutoscaler>> = Vec::new();
        for change in batch {
            if let Change::Wpa(s, event) = &change {
                if let Ok(Event::Apply(object)) = &**event {
                    if wpas[*s].get(&key_of(&object.metadata)).is_some_and(|old| same_but_status(old, object)) {
                        let object = Arc::new(object.clone());
                        wpas[*s].insert(key_of(&object.metadata), Arc::clone(&object));
                        refreshed.push(object);
                        continue;
                    }
                }
            }
            // Only a change to what is live makes a re-map: a listing in progress, or a failed
            // watch that is retrying, changes nothing yet.
            dirty |= match change {
                Change::Wpa(s, event) => match *event {
                    Ok(Event::Init) => {
                        wpa_listings[s] = Some(HashMap::new());
                        false
                    }
                    Ok(Event::InitApply(object)) => {
                        let key = key_of(&object.metadata);
                        wpa_listings[s].get_or_insert_with(HashMap::new).insert(key, Arc::new(object));
                        false
                    }
                    Ok(Event::InitDone) => {
                        wpas[s] = wpa_listings[s].take().unwrap_or_default();
                        initialized[s][0] = true;
                        true
                    }
                    Ok(Event::Apply(object)) => {
                        wpas[s].insert(key_of(&object.metadata), Arc::new(object));
                        true
                    }
                    Ok(Event::Delete(object)) => {
                        let key = key_of(&object.metadata);
                        wpas[s].remove(&key);
                        rejected.remove(&key);
                        statuses.remove(&key);
                        true
                    }
                    Err(err) => watch_failed(&err, &health),
                },
                Change::Metric(s, event) => match *event {
                    Ok(Event::Init) => {
                        metric_listings[s] = Some(HashMap::new());
                        false
                    }
                    Ok(Event::InitApply(object)) => {
                        metric_listings[s].get_or_insert_with(HashMap::new).insert(key_of(&object.metadata), object);
                        false
                    }
                    Ok(Event::InitDone) => {
                        metrics[s] = metric_listings[s].take().unwrap_or_default();
                        initialized[s][1] = true;
                        if metrics_absent {
                            tracing::info!(
                                "the DatadogMetric resource is served now; datadogmetric@ references resolve"
                            );
                            metrics_absent = false;
                        }
                        true
                    }
                    Ok(Event::Apply(object)) => {
                        metrics[s].insert(key_of(&object.metadata), object);
                        true
                    }
                    Ok(Event::Delete(object)) => {
                        metrics[s].remove(&key_of(&object.metadata));
                        true
                    }
                    Err(watcher::Error::InitialListFailed(kube::Error::Api(status))) if status.code == 404 => {
                        datadog_metrics_absent(s, &mut metrics, &mut initialized, &mut metrics_absent)
                    }
                    Err(err) => watch_failed(&err, &health),
                },
                Change::MetricsAbsent(s) => {
                    datadog_metrics_absent(s, &mut metrics, &mut initialized, &mut metrics_absent)
                }
            };
        }
        if initialized.iter().all(|both| both[0] && both[1]) {
            watch.synced.store(true, Ordering::Release);
        } else {
            continue;
        }
        if !dirty {
            for wpa in refreshed {
                let key = key_of(&wpa.metadata);
                if !rejected.contains_key(&key) {
                    let command = Command::Refresh { key: format!("crd/{}/{}", key.0, key.1), wpa };
                    if watch.commands.send(command).await.is_err() {
                        return;
                    }
                }
            }
            continue;
        }
        let Some(rules) = watch.rules.borrow().clone() else { continue };
        let options = MappingOptions::new(watch.default_backend.clone()).with_backends(&rules.backends);
        let problem = options.check().err().or_else(|| options.default_backend_problem());
        if problem != options_problem {
            match (&problem, options.check()) {
                (Some(problem), Err(_)) => {
                    tracing::error!(problem = %problem, "WatermarkPodAutoscaler objects cannot run")
                }
                (Some(problem), Ok(())) => tracing::info!(
                    problem = %problem,
                    "WatermarkPodAutoscaler metrics without a query in the watermarkd.io/queries annotation cannot \
                     run; the others do"
                ),
                (None, _) => {}
            }
            options_problem = problem;
        }
        let index = DatadogMetricIndex::from_objects(metrics.iter().flat_map(HashMap::values));
        let mut desired = Vec::new();
        let mut still_rejected = BTreeMap::new();
        for (key, wpa) in wpas.iter().flat_map(HashMap::iter) {
            match crd::map_wpa(wpa, &options, &index) {
                Ok(mapped) => {
                    for note in &mapped.notes {
                        tracing::debug!(wpa = %mapped.autoscaler.name, note = %note, "WPA mapped");
                    }
                    let target = &mapped.autoscaler.target;
                    desired.push(Desired {
                        key: format!("crd/{}/{}", key.0, key.1),
                        labels: SeriesLabels {
                            wpa_name: key.1.clone(),
                            wpa_namespace: key.0.clone(),
                            resource_name: target.name.clone(),
                            resource_namespace: target.namespace.clone(),
                            resource_kind: target.kind.clone(),
                            tags: watch.shared.autoscaler_metrics.tags(wpa.metadata.labels.as_ref()),
                            dry_run: watch.shared.dry_run || mapped.autoscaler.rule.dry_run(),
                        },
                        autoscaler: mapped.autoscaler,
                        wpa: Some(Arc::clone(wpa)),
                    });
                }
                Err(error) => {
                    let message = error.to_string();
                    if rejected.get(key) != Some(&message) {
                        tracing::warn!(wpa = %format!("{}/{}", key.0, key.1), error = %message, "WPA not run");
                    }
                    reject(&watch.shared, wpa, &error, &mut statuses).await;
                    still_rejected.insert(key.clone(), message);
                }
            }
        }
        rejected = still_rejected;
        let invalid = i64::try_from(rejected.len()).unwrap_or(i64::MAX);
        watch.shared.daemon.autoscalers.with_label_values(&["crd", "invalid"]).set(invalid);
        if watch.commands.send(Command::Replace { source: SourceKind::Crd, desired }).await.is_err() {
            return;
        }
    }
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

/// A failed watch keeps what it had; it changes nothing to re-map, but its cache may be stale.
fn watch_failed(err: &watcher::Error, health: &crate::workload::WatchHealth) -> bool {
    tracing::warn!(error = %err, "watch of WatermarkPodAutoscaler/DatadogMetric objects failed; retrying");
    health.failed();
    false
}

/// DatadogMetric comes with the Datadog Cluster Agent's CRDs, which a cluster that never ran it
/// lacks: then there are none, and only WPAs that reference one fail (each says so in its
/// status). Said once; whether there is anything to re-map is returned.
fn datadog_metrics_absent(
    scope: usize,
    metrics: &mut [HashMap<Key, DatadogMetric>],
    initialized: &mut [[bool; 2]],
    absent: &mut bool,
) -> bool {
    if !*absent {
        tracing::info!(
            "the DatadogMetric resource is not served by this cluster; datadogmetric@ references cannot resolve \
             until it is (checked again every {}s)",
            DATADOG_METRIC_RECHECK.as_secs()
        );
        *absent = true;
    }
    let had_objects = !metrics[scope].is_empty();
    metrics[scope].clear();
    let first_answer = !initialized[scope][1];
    initialized[scope][1] = true;
    had_objects || first_answer
}

/// How often a cluster without the DatadogMetric resource is asked again whether it has it.
const DATADOG_METRIC_RECHECK: Duration = Duration::from_secs(300);

/// Whether the API server serves `datadogmetrics.datadoghq.com/v1alpha1`.
async fn datadog_metrics_served(client: &Client) -> Result<bool, kube::Error> {
    match client.list_api_group_resources("datadoghq.com/v1alpha1").await {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == "datadogmetrics")),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(err) => Err(err),
    }
}

/// Watches DatadogMetrics in one scope while the resource is served. While it is not, asks
/// again every `DATADOG_METRIC_RECHECK` instead of retrying a watch that can only answer 404.
async fn watch_datadog_metrics(client: Client, api: Api<DatadogMetric>, scope: usize, to: mpsc::Sender<Change>) {
    loop {
        match datadog_metrics_served(&client).await {
            Ok(true) => {
                let config = watcher::Config::default();
                let mut stream = crate::workload::RetryingWatch::new(Box::pin(watcher::watcher(api.clone(), config)));
                while let Some(event) = stream.next().await {
                    let gone = matches!(
                        &event,
                        Err(watcher::Error::InitialListFailed(kube::Error::Api(status))) if status.code == 404
                    );
                    if to.send(Change::Metric(scope, Box::new(event))).await.is_err() {
                        return;
                    }
                    if gone {
                        break;
                    }
                }
            }
            Ok(false) => {
                if to.send(Change::MetricsAbsent(scope)).await.is_err() {
                    return;
                }
            }
            Err(err) => {
                // The API server is not answering: ask again soon, as a watch would.
                tracing::debug!(error = %err, "cannot tell whether DatadogMetric is served; asking again");
                tokio::time::sleep(Duration::from_secs(2)).await;
                continue;
            }
        }
        tokio::time::sleep(DATADOG_METRIC_RECHECK).await;
    }
}

/// Reports a WPA that does not run: its status (when it changed) and a Warning event.
async fn reject(
    shared: &Shared,
    wpa: &WatermarkPodAutoscaler,
    error: &MapError,
    statuses: &mut HashMap<Key, crd::WatermarkPodAutoscalerStatus>,
) {
    if !shared.is_leader() {
        return;
    }
    let key = key_of(&wpa.metadata);
    let previous = statuses.get(&key).cloned().or_else(|| wpa.status.clone());
    let next = crd::rejected_status(previous.as_ref(), error, shared.clock.now());
    if crd::status_changed(previous.as_ref(), &next) && evaluate::write_status(shared, wpa, &next).await {
        statuses.insert(key, next);
    }
    let (reason, note) = match error {
        MapError::Invalid { .. } => ("FailedSpecCheck", error.to_string()),
        MapError::Unsupported(_) => ("NotSupported", error.to_string()),
    };
    evaluate::publish(
        shared,
        &evaluate::wpa_reference(wpa),
        EventType::Warning,
        reason,
        &note,
        "Validate",
        Repeats::Suppress,
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rename_or_a_symlink_swap_changes_the_fingerprint() {
        let dir = tempfile::tempdir().expect("temp dir");
        let rules = dir.path().join("rules.toml");
        std::fs::write(&rules, "a = 1\n").expect("write");
        let first = fingerprint(&rules).expect("fingerprint");
        assert_eq!(fingerprint(&rules), Some(first.clone()), "stable while nothing changes");

        // An editor's save: a new file renamed over the old one, same size.
        let staged = dir.path().join("rules.toml.tmp");
        std::fs::write(&staged, "a = 2\n").expect("write");
        std::fs::rename(&staged, &rules).expect("rename");
        let renamed = fingerprint(&rules).expect("fingerprint");
        assert_ne!(renamed, first);

        // A ConfigMap volume: rules.toml -> ..data/rules.toml, and ..data is swapped.
        let mounted = dir.path().join("mounted");
        std::fs::create_dir(&mounted).expect("dir");
        for (version, text) in [("v1", "b = 1\n"), ("v2", "b = 2\n")] {
            std::fs::create_dir(mounted.join(version)).expect("dir");
            std::fs::write(mounted.join(version).join("rules.toml"), text).expect("write");
        }
        std::os::unix::fs::symlink("v1", mounted.join("..data")).expect("symlink");
        std::os::unix::fs::symlink("..data/rules.toml", mounted.join("rules.toml")).expect("symlink");
        let before = fingerprint(&mounted.join("rules.toml")).expect("fingerprint");
        std::os::unix::fs::symlink("v2", mounted.join("..data_tmp")).expect("symlink");
        std::fs::rename(mounted.join("..data_tmp"), mounted.join("..data")).expect("swap");
        let after = fingerprint(&mounted.join("rules.toml")).expect("fingerprint");
        assert_ne!(before, after);
        assert_eq!(std::fs::read_to_string(mounted.join("rules.toml")).expect("read"), "b = 2\n");
    }
}
