//! Feeds the cluster's WatermarkPodAutoscaler and DatadogMetric objects into the WPA index,
//! and passes on what the index says: the scheduler's commands, and the WPAs that cannot run
//! (which the loop reports, with their statuses and events).
//!
//! Each scope (a listed namespace, or all of them) has one kube reflector store per kind. The
//! stores hold the objects; the index is handed the same `Arc`s, so each object is kept once.

use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::scheduler::Command;
use super::source::SourceKind;
use super::wpa_index::{ObjectKey, Rejection, Scope, Update, WpaIndex};
use super::Shared;
use crate::adapters::workload::RetryingWatch;
use crate::domain::crd::{DatadogMetric, WatermarkPodAutoscaler};
use crate::domain::label_selector::LabelSelector;
use crate::domain::rules::RulesFile;

/// How often a cluster without the DatadogMetric resource is asked again whether it has it.
const DATADOG_METRIC_RECHECK: Duration = Duration::from_secs(300);

pub struct WpaWatch {
    pub client: Client,
    pub scopes: Vec<Scope>,
    pub index: WpaIndex,
    /// The WPAs watermarkd owns (`wpa_selector`), selected by the API server; `None`: all.
    /// The others are another controller's, and claimants of their targets (`runtime/claims`).
    pub selector: Option<LabelSelector>,
    /// The rules file's backends, which WPA metrics are sent to.
    pub rules: watch::Receiver<Arc<RulesFile>>,
    pub commands: mpsc::Sender<Command>,
    /// Every complete set of the WPAs that cannot run, for the loop to report.
    pub rejected: mpsc::Sender<Vec<Rejection>>,
    pub shared: Arc<Shared>,
    /// Set once every scope has been listed.
    pub synced: Arc<AtomicBool>,
    pub stopping: CancellationToken,
}

/// What a store's watch tells the index.
enum Change {
    Wpa(Stored<WatermarkPodAutoscaler>),
    Metric(Stored<DatadogMetric>),
    /// The cluster does not serve the DatadogMetric resource (checked by discovery).
    MetricsAbsent(Scope),
    /// A watch failed; it retries by itself, and its store keeps what it had meanwhile.
    Failed(String),
}

enum Stored<K> {
    Applied(Arc<K>),
    Deleted(ObjectKey),
    /// The scope's complete listing, first or after the watch restarted.
    Listed(Scope, Vec<Arc<K>>),
}

/// Runs until `stopping` is cancelled.
pub async fn run(mut watch: WpaWatch) {
    let (sender, mut changes) = mpsc::channel::<Change>(256);
    let mut tasks = tokio::task::JoinSet::new();
    let owned = match &watch.selector {
        Some(selector) => watcher::Config::default().labels(selector.as_str()),
        None => watcher::Config::default(),
    };
    for scope in &watch.scopes {
        let wpas = api_in(&watch.client, scope);
        tasks.spawn(reflect(wpas, owned.clone(), scope.clone(), sender.clone(), Change::Wpa, false));
        tasks.spawn(follow_datadog_metrics(watch.client.clone(), scope.clone(), sender.clone()));
    }
    drop(sender);
    let health = watch.shared.targets.watch_health();
    loop {
        tokio::select! {
            change = changes.recv() => {
                let Some(change) = change else { return };
                // Take everything already queued, so a burst is mapped once.
                let mut batch = vec![change];
                while let Ok(change) = changes.try_recv() {
                    batch.push(change);
                }
                for change in batch {
                    apply(&mut watch.index, change, &health);
                }
            }
            changed = watch.rules.changed() => {
                if changed.is_err() {
                    return;
                }
                let rules = Arc::clone(&watch.rules.borrow_and_update());
                watch.index.set_backends(&rules);
            }
            () = watch.stopping.cancelled() => return,
        }
        if watch.index.is_synced() {
            watch.synced.store(true, Ordering::Release);
        }
        let command = match watch.index.update() {
            Update::Nothing => continue,
            Update::Refresh(objects) => {
                for (key, wpa) in objects {
                    if watch.commands.send(Command::Refresh { key, wpa }).await.is_err() {
                        return;
                    }
                }
                continue;
            }
            Update::Replace { desired, rejected } => {
                if watch.rejected.send(rejected).await.is_err() {
                    return;
                }
                Command::Replace { source: SourceKind::Wpa, desired }
            }
        };
        if watch.commands.send(command).await.is_err() {
            return;
        }
    }
}

fn apply(index: &mut WpaIndex, change: Change, health: &crate::adapters::workload::WatchHealth) {
    match change {
        Change::Wpa(Stored::Applied(wpa)) => index.apply_wpa(wpa),
        Change::Wpa(Stored::Deleted(key)) => index.delete_wpa(&key),
        Change::Wpa(Stored::Listed(scope, wpas)) => index.reset_wpas(&scope, wpas),
        Change::Metric(Stored::Applied(metric)) => index.apply_metric(metric),
        Change::Metric(Stored::Deleted(key)) => index.delete_metric(&key),
        Change::Metric(Stored::Listed(scope, metrics)) => index.reset_metrics(&scope, metrics),
        Change::MetricsAbsent(scope) => index.metrics_absent(&scope, DATADOG_METRIC_RECHECK),
        Change::Failed(error) => {
            // Nothing to map again, but the cache may be stale: /readyz says so.
            tracing::warn!(error = %error, "watch of WatermarkPodAutoscaler/DatadogMetric objects failed; retrying");
            health.failed();
        }
    }
}

fn api_in<K>(client: &Client, scope: &Scope) -> Api<K>
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>,
{
    match scope {
        Scope::All => Api::all(client.clone()),
        Scope::Namespace(ns) => Api::namespaced(client.clone(), ns),
    }
}

/// How a reflector's watch ended.
enum Ended {
    /// Nobody listens any more: shutting down.
    Closed,
    /// The resource is not served (404 on the first list).
    NotServed,
}

/// Runs one reflector store and sends what changed in it: each applied object as the store's
/// own `Arc`, each deletion, each complete listing.
/// With `absent_ends`, a 404 on the first list ends it (the resource is not served); otherwise
/// it is a failure like any other, retried.
async fn reflect<K>(
    api: Api<K>,
    config: watcher::Config,
    scope: Scope,
    to: mpsc::Sender<Change>,
    wrap: fn(Stored<K>) -> Change,
    absent_ends: bool,
) -> Ended
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher::watcher(api, config));
    let mut stream = RetryingWatch::new(Box::pin(stream));
    while let Some(event) = stream.next().await {
        let change = match event {
            // The reflector has applied the event by the time it is passed on.
            Ok(Event::Apply(object)) => store.get(&ObjectRef::from_obj(&object)).map(|o| wrap(Stored::Applied(o))),
            Ok(Event::Delete(object)) => Some(wrap(Stored::Deleted(ObjectKey::of(object.meta())))),
            Ok(Event::InitDone) => Some(wrap(Stored::Listed(scope.clone(), store.state()))),
            Ok(Event::Init | Event::InitApply(_)) => None,
            Err(watcher::Error::InitialListFailed(kube::Error::Api(status))) if absent_ends && status.code == 404 => {
                return Ended::NotServed
            }
            Err(err) => Some(Change::Failed(err.to_string())),
        };
        if let Some(change) = change {
            if to.send(change).await.is_err() {
                return Ended::Closed;
            }
        }
    }
    Ended::Closed
}

/// Whether the API server serves `datadogmetrics.datadoghq.com/v1alpha1`.
async fn datadog_metrics_served(client: &Client) -> Result<bool, kube::Error> {
    match client.list_api_group_resources("datadoghq.com/v1alpha1").await {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == "datadogmetrics")),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(err) => Err(err),
    }
}

/// Follows DatadogMetrics in one scope while the resource is served. While it is not, asks
/// again every `DATADOG_METRIC_RECHECK` instead of retrying a watch that can only answer 404.
async fn follow_datadog_metrics(client: Client, scope: Scope, to: mpsc::Sender<Change>) -> Ended {
    loop {
        match datadog_metrics_served(&client).await {
            Ok(true) => {
                if let Ended::Closed = reflect(
                    api_in(&client, &scope),
                    watcher::Config::default(),
                    scope.clone(),
                    to.clone(),
                    Change::Metric,
                    true,
                )
                .await
                {
                    return Ended::Closed;
                }
                if to.send(Change::MetricsAbsent(scope.clone())).await.is_err() {
                    return Ended::Closed;
                }
            }
            Ok(false) => {
                if to.send(Change::MetricsAbsent(scope.clone())).await.is_err() {
                    return Ended::Closed;
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
