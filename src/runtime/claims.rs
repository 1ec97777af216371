//! Feeds the claim index (`domain::claims`) from watches of the other controllers that may scale
//! a target: HorizontalPodAutoscalers (autoscaling/v2, or the newest version the cluster serves of
//! v2beta2 and v1: every HPA is seen through each, with the same `scaleTargetRef` and replica
//! counts), KEDA ScaledObjects (keda.sh/v1alpha1, while the cluster serves them: a cluster without
//! KEDA is normal, and asked again every [`RECHECK`]) and the WatermarkPodAutoscalers that are
//! another controller's: with a `wpa_selector`, those it leaves out; without CRD mode, all of them
//! (watched while the cluster serves them, as ScaledObjects are: a daemon that runs only a rules
//! file must not write beside the Datadog controller either). One watch per kind and scope (a listed namespace, or all of them).
//!
//! Each object is turned into a [`Claimant`] as it arrives (the conversions are plain functions,
//! tested below) and the index is behind a lock that each evaluation reads once, through
//! [`ClaimBoard`].

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::adapters::workload::RetryingWatch;
use crate::domain::claims::{ClaimIndex, Claimant, ClaimantKind, Claims, HpaReplicas, Scope, TargetKey};
use crate::domain::crd::WatermarkPodAutoscaler;
use crate::domain::label_selector::LabelSelector;
use crate::domain::rules::TargetRef;

/// How often a cluster without a resource watched here is asked again whether it has it.
const RECHECK: Duration = Duration::from_secs(300);

/// The claim index, shared: the watches write it, each evaluation reads its target's claims.
#[derive(Debug, Default)]
pub struct ClaimBoard {
    index: RwLock<ClaimIndex>,
}

impl ClaimBoard {
    pub fn new(index: ClaimIndex) -> ClaimBoard {
        ClaimBoard { index: RwLock::new(index) }
    }

    /// What is known of `target` now.
    pub fn claims(&self, target: &TargetRef) -> Claims {
        // A panic while the lock was held left the index as the last complete change made it.
        self.index.read().unwrap_or_else(PoisonError::into_inner).claims(target)
    }

    /// What each HPA on `target` last said it did (see `ClaimIndex::hpa_replicas`): the live
    /// controller's replicas, for recording beside an observing autoscaler's decisions.
    pub fn hpa_replicas(&self, target: &TargetRef) -> Vec<(String, HpaReplicas)> {
        self.index.read().unwrap_or_else(PoisonError::into_inner).hpa_replicas(target)
    }

    fn change(&self, change: impl FnOnce(&mut ClaimIndex)) {
        change(&mut self.index.write().unwrap_or_else(PoisonError::into_inner));
    }
}

/// Which WatermarkPodAutoscalers are watermarkd's own; the rest are another controller's.
#[derive(Clone, Debug)]
pub enum OwnWpas {
    /// All of them (CRD mode without a selector): no WPA claims a target.
    All,
    /// Those the selector matches (CRD mode with `wpa_selector`).
    Selected(LabelSelector),
    /// None (no CRD mode): every WPA is another controller's.
    None,
}

impl OwnWpas {
    /// As the settings say: CRD mode, and its selector.
    pub fn of(crd: bool, wpa_selector: Option<&LabelSelector>) -> OwnWpas {
        match (crd, wpa_selector) {
            (false, _) => OwnWpas::None,
            (true, None) => OwnWpas::All,
            (true, Some(selector)) => OwnWpas::Selected(selector.clone()),
        }
    }
}

/// The kinds the daemon watches: HPAs and ScaledObjects always, WPAs unless all are its own.
pub fn kinds(own: &OwnWpas) -> Vec<ClaimantKind> {
    let mut kinds = vec![ClaimantKind::HorizontalPodAutoscaler, ClaimantKind::ScaledObject];
    if !matches!(own, OwnWpas::All) {
        kinds.push(ClaimantKind::WatermarkPodAutoscaler);
    }
    kinds
}

pub struct ClaimWatch {
    pub client: Client,
    pub scopes: Vec<Scope>,
    /// The WPAs watermarkd owns; the others are claimants.
    pub own_wpas: OwnWpas,
    pub board: Arc<ClaimBoard>,
    pub stopping: CancellationToken,
}

/// What one watch tells the index.
enum Change {
    /// An object as it is now: what it claims, or `None` when it claims nothing (no target, or
    /// a WPA watermarkd owns).
    Applied {
        kind: ClaimantKind,
        namespace: String,
        name: String,
        claimant: Option<Box<Claimant>>,
    },
    Deleted {
        kind: ClaimantKind,
        namespace: String,
        name: String,
    },
    /// The complete set in a scope (also: none, where the resource is not served).
    Listed(ClaimantKind, Scope, Vec<Claimant>),
    Failed(ClaimantKind, String),
}

/// Runs until `stopping` is cancelled.
pub async fn run(watch: ClaimWatch) {
    let (sender, mut changes) = mpsc::channel::<Change>(256);
    let mut tasks = tokio::task::JoinSet::new();
    for scope in &watch.scopes {
        tasks.spawn(follow_served(watch.client.clone(), Kind::Hpa, scope.clone(), sender.clone()));
        tasks.spawn(follow_served(watch.client.clone(), Kind::ScaledObject, scope.clone(), sender.clone()));
        match &watch.own_wpas {
            OwnWpas::All => {}
            OwnWpas::Selected(selector) => {
                // CRD mode: the resource is served (the daemon needs it), so a 404 is a failure.
                let wpas: Api<WatermarkPodAutoscaler> = api_in(&watch.client, scope);
                let kind = Kind::Wpa(Some(selector.clone()));
                tasks.spawn(follow(wpas, watcher::Config::default(), kind, scope.clone(), sender.clone(), false));
            }
            OwnWpas::None => {
                tasks.spawn(follow_served(watch.client.clone(), Kind::Wpa(None), scope.clone(), sender.clone()));
            }
        }
    }
    drop(sender);
    loop {
        tokio::select! {
            change = changes.recv() => {
                let Some(change) = change else { return };
                apply(&watch.board, change);
            }
            () = watch.stopping.cancelled() => return,
        }
    }
}

fn apply(board: &ClaimBoard, change: Change) {
    match change {
        Change::Applied { claimant: Some(claimant), .. } => board.change(|index| index.apply(*claimant)),
        Change::Applied { kind, namespace, name, claimant: None } | Change::Deleted { kind, namespace, name } => {
            board.change(|index| index.delete(kind, &namespace, &name));
        }
        Change::Listed(kind, scope, claimants) => board.change(|index| index.reset(kind, &scope, claimants)),
        Change::Failed(kind, error) => {
            // The index keeps what it had; a watch that never listed keeps its targets held.
            tracing::warn!(kind = kind.kind(), error = %error, "watch of another controller's objects failed; retrying");
        }
    }
}

fn api_in<K>(client: &Client, scope: &Scope) -> Api<K>
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>,
{
    match scope {
        None => Api::all(client.clone()),
        Some(namespace) => Api::namespaced(client.clone(), namespace),
    }
}

/// What a watch follows, and how its objects become claimants.
#[derive(Clone)]
enum Kind {
    Hpa,
    ScaledObject,
    /// WPAs, of which those the selector matches are watermarkd's own; `None`: none are.
    Wpa(Option<LabelSelector>),
}

/// How the objects of one watch are turned into claimants.
trait Claiming: Resource + Sized {
    fn claimant(&self, kind: &Kind) -> Option<Claimant>;
}

impl Claiming for DynamicObject {
    fn claimant(&self, kind: &Kind) -> Option<Claimant> {
        match kind {
            Kind::Hpa => hpa_claimant(self),
            Kind::ScaledObject => scaled_object_claimant(self),
            // Watched as served (no CRD mode): every one is another controller's.
            Kind::Wpa(_) => serde_json::to_value(self)
                .ok()
                .and_then(|value| serde_json::from_value::<WatermarkPodAutoscaler>(value).ok())
                .and_then(|wpa| foreign_wpa_claimant(&wpa, None)),
        }
    }
}

impl Claiming for WatermarkPodAutoscaler {
    fn claimant(&self, kind: &Kind) -> Option<Claimant> {
        match kind {
            Kind::Wpa(selector) => foreign_wpa_claimant(self, selector.as_ref()),
            Kind::Hpa | Kind::ScaledObject => None,
        }
    }
}

impl Kind {
    fn claimant_kind(&self) -> ClaimantKind {
        match self {
            Kind::Hpa => ClaimantKind::HorizontalPodAutoscaler,
            Kind::ScaledObject => ClaimantKind::ScaledObject,
            Kind::Wpa(_) => ClaimantKind::WatermarkPodAutoscaler,
        }
    }
}

/// How a watch ended.
enum Ended {
    /// Nobody listens any more: shutting down.
    Closed,
    /// The resource is not served (404 on the first list).
    NotServed,
}

/// Follows one kind in one scope and sends each change. With `absent_ends`, a 404 on the first
/// list ends it (the resource is not served); otherwise it is a failure like any other, retried.
async fn follow<K>(
    api: Api<K>,
    config: watcher::Config,
    kind: Kind,
    scope: Scope,
    to: mpsc::Sender<Change>,
    absent_ends: bool,
) -> Ended
where
    K: Claiming + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let claimant_kind = kind.claimant_kind();
    let mut stream = RetryingWatch::new(Box::pin(watcher::watcher(api, config)));
    let mut listing: Vec<Claimant> = Vec::new();
    while let Some(event) = stream.next().await {
        let change = match event {
            Ok(Event::Apply(object)) => Some(Change::Applied {
                kind: claimant_kind,
                namespace: object.namespace().unwrap_or_default(),
                name: object.name_any(),
                claimant: object.claimant(&kind).map(Box::new),
            }),
            Ok(Event::Delete(object)) => Some(Change::Deleted {
                kind: claimant_kind,
                namespace: object.namespace().unwrap_or_default(),
                name: object.name_any(),
            }),
            Ok(Event::Init) => {
                listing.clear();
                None
            }
            Ok(Event::InitApply(object)) => {
                listing.extend(object.claimant(&kind));
                None
            }
            Ok(Event::InitDone) => Some(Change::Listed(claimant_kind, scope.clone(), std::mem::take(&mut listing))),
            Err(watcher::Error::InitialListFailed(kube::Error::Api(status))) if absent_ends && status.code == 404 => {
                return Ended::NotServed
            }
            Err(err) => Some(Change::Failed(claimant_kind, err.to_string())),
        };
        if let Some(change) = change {
            if to.send(change).await.is_err() {
                return Ended::Closed;
            }
        }
    }
    Ended::Closed
}

impl Kind {
    /// The versions to watch it through, the first the cluster serves; its kind and plural.
    fn served_as(&self) -> (&'static [&'static str], &'static str, &'static str) {
        match self {
            Kind::Hpa => (
                &["autoscaling/v2", "autoscaling/v2beta2", "autoscaling/v1"],
                "HorizontalPodAutoscaler",
                "horizontalpodautoscalers",
            ),
            Kind::ScaledObject => (&["keda.sh/v1alpha1"], "ScaledObject", "scaledobjects"),
            Kind::Wpa(_) => (&["datadoghq.com/v1alpha1"], "WatermarkPodAutoscaler", "watermarkpodautoscalers"),
        }
    }
}

/// The first of `versions` in which the API server serves `plural`; `None`: none does.
async fn served_version(
    client: &Client,
    versions: &[&'static str],
    plural: &str,
) -> Result<Option<&'static str>, kube::Error> {
    for version in versions {
        match client.list_api_group_resources(version).await {
            Ok(list) if list.resources.iter().any(|r| r.name == plural) => return Ok(Some(version)),
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(err) => return Err(err),
        }
    }
    Ok(None)
}

/// Follows `kind` in one scope while the cluster serves it. While it does not, the scope holds
/// none (a listing of nothing), and the cluster is asked again every `RECHECK`: KEDA installed
/// later is found.
async fn follow_served(client: Client, kind: Kind, scope: Scope, to: mpsc::Sender<Change>) -> Ended {
    let (versions, kind_name, plural) = kind.served_as();
    loop {
        match served_version(&client, versions, plural).await {
            Ok(Some(version)) => {
                let (group, version) = version.split_once('/').unwrap_or(("", version));
                let resource =
                    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind_name), plural);
                let api: Api<DynamicObject> = match &scope {
                    None => Api::all_with(client.clone(), &resource),
                    Some(namespace) => Api::namespaced_with(client.clone(), namespace, &resource),
                };
                let ended =
                    follow(api, watcher::Config::default(), kind.clone(), scope.clone(), to.clone(), true).await;
                if let Ended::Closed = ended {
                    return Ended::Closed;
                }
            }
            Ok(None) => {}
            Err(err) => {
                // The API server is not answering: ask again soon, as a watch would.
                tracing::debug!(error = %err, kind = kind_name, "cannot tell whether the cluster serves it; asking again");
                tokio::time::sleep(Duration::from_secs(2)).await;
                continue;
            }
        }
        if to.send(Change::Listed(kind.claimant_kind(), scope.clone(), Vec::new())).await.is_err() {
            return Ended::Closed;
        }
        tokio::time::sleep(RECHECK).await;
    }
}

/// The group of a `scaleTargetRef` without an `apiVersion`: the built-in workloads' own, as
/// the controllers that read it resolve the kind.
fn api_version_or_default(api_version: Option<&str>, kind: &str) -> String {
    match api_version.filter(|v| !v.is_empty()) {
        Some(version) => version.to_string(),
        None if kind == "ReplicationController" => "v1".into(),
        None => "apps/v1".into(),
    }
}

/// The ScaledObject a KEDA-generated HPA belongs to: its owner of kind ScaledObject, else
/// KEDA's `scaledobject.keda.sh/name` label.
fn keda_scaled_object(meta: &kube::api::ObjectMeta) -> Option<String> {
    let owner = meta
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "ScaledObject" && o.api_version.starts_with("keda.sh/"));
    owner.map(|o| o.name.clone()).or_else(|| {
        meta.labels.as_ref().and_then(|l: &BTreeMap<String, String>| l.get("scaledobject.keda.sh/name").cloned())
    })
}

/// An HPA claims the target of its `spec.scaleTargetRef`, with its status's replicas (the same
/// fields in autoscaling/v1, v2beta2 and v2).
fn hpa_claimant(hpa: &DynamicObject) -> Option<Claimant> {
    let namespace = hpa.metadata.namespace.clone()?;
    let reference = hpa.data.get("spec")?.get("scaleTargetRef")?;
    let text = |key: &str| reference.get(key).and_then(serde_json::Value::as_str).filter(|s| !s.is_empty());
    let kind = text("kind")?;
    let api_version = api_version_or_default(text("apiVersion"), kind);
    let status = hpa.data.get("status");
    let count = |key: &str| status?.get(key)?.as_u64().and_then(|n| u32::try_from(n).ok());
    let last_scale_time = status
        .and_then(|s| s.get("lastScaleTime")?.as_str())
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        .map(|t| watermarkd_engine::Timestamp::from_unix_millis(t.as_millisecond()));
    Some(Claimant {
        kind: ClaimantKind::HorizontalPodAutoscaler,
        target: TargetKey::new(&api_version, kind, &namespace, text("name")?),
        scaled_object: keda_scaled_object(&hpa.metadata),
        name: hpa.metadata.name.clone()?,
        namespace,
        replicas: Some(HpaReplicas {
            desired: count("desiredReplicas"),
            current: count("currentReplicas"),
            last_scale_time,
        }),
    })
}

/// A ScaledObject claims the target of its `spec.scaleTargetRef` (KEDA's defaults: `apps/v1`,
/// `Deployment`).
fn scaled_object_claimant(object: &DynamicObject) -> Option<Claimant> {
    let namespace = object.metadata.namespace.clone()?;
    let reference = object.data.get("spec")?.get("scaleTargetRef")?;
    let text = |key: &str| reference.get(key).and_then(serde_json::Value::as_str).filter(|s| !s.is_empty());
    let kind = text("kind").unwrap_or("Deployment");
    let api_version = api_version_or_default(text("apiVersion"), kind);
    Some(Claimant {
        kind: ClaimantKind::ScaledObject,
        target: TargetKey::new(&api_version, kind, &namespace, text("name")?),
        scaled_object: None,
        name: object.metadata.name.clone()?,
        namespace,
        replicas: None,
    })
}

/// A WPA the selector does not match is another controller's, and claims its target.
fn foreign_wpa_claimant(wpa: &WatermarkPodAutoscaler, own: Option<&LabelSelector>) -> Option<Claimant> {
    if own.is_some_and(|selector| selector.matches(wpa.metadata.labels.as_ref())) {
        return None;
    }
    let namespace = wpa.metadata.namespace.clone()?;
    let reference = wpa.spec.scale_target_ref.as_ref()?;
    let kind = reference.kind.as_deref()?;
    let api_version = api_version_or_default(reference.api_version.as_deref(), kind);
    Some(Claimant {
        kind: ClaimantKind::WatermarkPodAutoscaler,
        target: TargetKey::new(&api_version, kind, &namespace, reference.name.as_deref()?),
        scaled_object: None,
        name: wpa.metadata.name.clone()?,
        namespace,
        replicas: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(kind: &str, name: &str) -> TargetKey {
        TargetKey::new("apps/v1", kind, "shop", name)
    }

    #[test]
    fn the_board_reads_what_the_watches_applied() {
        let board = ClaimBoard::new(ClaimIndex::new(&kinds(&OwnWpas::All), &[None]));
        let web = TargetRef {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            namespace: "shop".into(),
            name: "web".into(),
        };
        assert!(matches!(board.claims(&web), Claims::Unknown(_)));
        let hpa: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": { "name": "web", "namespace": "shop" },
            "spec": { "scaleTargetRef": { "apiVersion": "apps/v1", "kind": "Deployment", "name": "web" }, "maxReplicas": 10 },
            "status": { "desiredReplicas": 4 }
        }))
        .expect("an HPA");
        apply(
            &board,
            Change::Listed(ClaimantKind::HorizontalPodAutoscaler, None, hpa_claimant(&hpa).into_iter().collect()),
        );
        apply(&board, Change::Listed(ClaimantKind::ScaledObject, None, Vec::new()));
        assert!(matches!(board.claims(&web), Claims::Claimed(ref c) if c.len() == 1));
        assert_eq!(board.hpa_replicas(&web)[0].1.desired, Some(4));
        let gone = Change::Deleted {
            kind: ClaimantKind::HorizontalPodAutoscaler,
            namespace: "shop".into(),
            name: "web".into(),
        };
        apply(&board, gone);
        assert_eq!(board.claims(&web), Claims::Free);
    }

    #[test]
    fn an_hpa_claims_its_scale_target_with_its_status() {
        let hpa: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": { "name": "web", "namespace": "shop" },
            "spec": { "scaleTargetRef": { "apiVersion": "apps/v1", "kind": "Deployment", "name": "web" }, "maxReplicas": 10 },
            "status": { "desiredReplicas": 7, "currentReplicas": 5, "lastScaleTime": "2026-01-02T03:04:05Z" }
        }))
        .expect("an HPA");
        let claimant = hpa_claimant(&hpa).expect("a claimant");
        assert_eq!(
            (claimant.label(), &claimant.target),
            ("HorizontalPodAutoscaler/shop/web".into(), &target("Deployment", "web"))
        );
        let replicas = claimant.replicas.expect("replicas");
        assert_eq!((replicas.desired, replicas.current), (Some(7), Some(5)));
        assert_eq!(replicas.last_scale_time.map(|t| t.unix_millis()), Some(1_767_323_045_000));
        assert_eq!(claimant.scaled_object, None);
    }

    #[test]
    fn keda_s_hpa_names_its_scaled_object_by_owner_or_label() {
        let owned: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": { "name": "keda-hpa-web", "namespace": "shop", "ownerReferences": [
                { "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "name": "web", "uid": "u" }
            ] },
            "spec": { "scaleTargetRef": { "kind": "Deployment", "name": "web" }, "maxReplicas": 10 }
        }))
        .expect("an HPA");
        let claimant = hpa_claimant(&owned).expect("a claimant");
        assert_eq!(claimant.scaled_object.as_deref(), Some("web"));
        assert_eq!(claimant.target, target("Deployment", "web"), "no apiVersion: apps/v1");
        assert_eq!(
            claimant.to_string(),
            "HorizontalPodAutoscaler shop/keda-hpa-web (KEDA's, for ScaledObject shop/web)"
        );
        let labelled: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler",
            "metadata": { "name": "keda-hpa-api", "namespace": "shop", "labels": { "scaledobject.keda.sh/name": "api" } },
            "spec": { "scaleTargetRef": { "apiVersion": "apps/v1", "kind": "Deployment", "name": "api" }, "maxReplicas": 10 }
        }))
        .expect("an HPA");
        assert_eq!(hpa_claimant(&labelled).and_then(|c| c.scaled_object).as_deref(), Some("api"));
    }

    #[test]
    fn a_scaled_object_claims_its_target_with_keda_s_defaults() {
        let object: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
            "metadata": { "name": "worker", "namespace": "shop" },
            "spec": { "scaleTargetRef": { "name": "worker" }, "triggers": [] }
        }))
        .expect("a ScaledObject");
        let claimant = scaled_object_claimant(&object).expect("a claimant");
        assert_eq!(
            (claimant.label(), claimant.target),
            ("ScaledObject/shop/worker".into(), target("Deployment", "worker"))
        );
        let rollout: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
            "metadata": { "name": "r", "namespace": "shop" },
            "spec": { "scaleTargetRef": { "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "name": "r" } }
        }))
        .expect("a ScaledObject");
        assert_eq!(
            scaled_object_claimant(&rollout).map(|c| c.target),
            Some(TargetKey::new("argoproj.io/v1", "Rollout", "shop", "r"))
        );
    }

    #[test]
    fn only_the_wpas_the_selector_leaves_out_are_claimants() {
        let wpa = |labels: serde_json::Value| -> WatermarkPodAutoscaler {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "datadoghq.com/v1alpha1", "kind": "WatermarkPodAutoscaler",
                "metadata": { "name": "web", "namespace": "shop", "labels": labels },
                "spec": { "scaleTargetRef": { "apiVersion": "apps/v1", "kind": "Deployment", "name": "web" } }
            }))
            .expect("a WPA")
        };
        let selector = LabelSelector::parse("watermarkd.io/controller=watermarkd").expect("selector");
        assert_eq!(
            foreign_wpa_claimant(
                &wpa(serde_json::json!({ "watermarkd.io/controller": "watermarkd" })),
                Some(&selector)
            ),
            None
        );
        let theirs = foreign_wpa_claimant(&wpa(serde_json::json!({})), Some(&selector)).expect("another controller's");
        assert_eq!(theirs.label(), "WatermarkPodAutoscaler/shop/web");
        assert_eq!(theirs.target, target("Deployment", "web"));
    }

    #[test]
    fn without_crd_mode_every_wpa_is_another_controllers() {
        let labelled: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "datadoghq.com/v1alpha1", "kind": "WatermarkPodAutoscaler",
            "metadata": { "name": "web", "namespace": "shop", "labels": { "watermarkd.io/controller": "watermarkd" } },
            "spec": { "scaleTargetRef": { "apiVersion": "apps/v1", "kind": "Deployment", "name": "web" }, "maxReplicas": 5 }
        }))
        .expect("a WPA");
        let theirs = labelled.claimant(&Kind::Wpa(None)).expect("another controller's");
        assert_eq!(
            (theirs.label(), theirs.target),
            ("WatermarkPodAutoscaler/shop/web".into(), target("Deployment", "web"))
        );
        assert_eq!(kinds(&OwnWpas::of(false, None)).len(), 3, "WPAs are watched");
        assert_eq!(kinds(&OwnWpas::of(true, None)).len(), 2, "all are its own");
    }
}
