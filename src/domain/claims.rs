//! Who else scales a target: the other controllers that claim the objects watermarkd's
//! autoscalers scale, as a plain, synchronous index, and the guard's decision from it.
//!
//! The watch drivers (`runtime/claims.rs`) feed the index claimants (each applied, deleted, or
//! a scope's complete listing) already turned into [`Claimant`]s, so nothing here knows
//! Kubernetes, the network or a clock: every rule of the guard is a unit test.
//!
//! A claimant is an HPA (autoscaling/v2) whose `scaleTargetRef` names the target (KEDA's
//! generated HPAs included, named with their ScaledObject), a KEDA ScaledObject, or a
//! WatermarkPodAutoscaler that watermarkd does not own (one the `wpa_selector` leaves to
//! another controller). Targets are compared by [`TargetRef::identity`]: API group, kind,
//! namespace, name, so `apps/v1` and `apps/v1beta2` reach the same Deployment.
//!
//! Until every watch that covers a target's namespace has listed, the index cannot say that no
//! one else scales it: [`Claims::Unknown`], which the guard treats as a claim. Nothing surprising
//! happens to production because a watch was slow.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;

use watermarkd_engine::Timestamp;

use super::rules::TargetRef;

/// The kind of controller that claims a target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ClaimantKind {
    HorizontalPodAutoscaler,
    ScaledObject,
    WatermarkPodAutoscaler,
}

impl ClaimantKind {
    /// Its kind as Kubernetes names it.
    pub fn kind(self) -> &'static str {
        match self {
            ClaimantKind::HorizontalPodAutoscaler => "HorizontalPodAutoscaler",
            ClaimantKind::ScaledObject => "ScaledObject",
            ClaimantKind::WatermarkPodAutoscaler => "WatermarkPodAutoscaler",
        }
    }

    /// Its resource, as a watch that has not listed yet is named.
    fn plural(self) -> &'static str {
        match self {
            ClaimantKind::HorizontalPodAutoscaler => "HorizontalPodAutoscalers",
            ClaimantKind::ScaledObject => "KEDA ScaledObjects",
            ClaimantKind::WatermarkPodAutoscaler => "WatermarkPodAutoscalers of another controller",
        }
    }
}

/// The object a target reference names, whatever version reaches it: API group, kind,
/// namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TargetKey {
    group: String,
    kind: String,
    namespace: String,
    name: String,
}

impl TargetKey {
    /// `api_version` as in a `scaleTargetRef` (`apps/v1`; `v1` is the core group).
    pub fn new(api_version: &str, kind: &str, namespace: &str, name: &str) -> TargetKey {
        let group = api_version.rsplit_once('/').map_or("", |(group, _)| group);
        TargetKey { group: group.into(), kind: kind.into(), namespace: namespace.into(), name: name.into() }
    }

    pub fn of(target: &TargetRef) -> TargetKey {
        let (group, kind, namespace, name) = target.identity();
        TargetKey { group: group.into(), kind: kind.into(), namespace: namespace.into(), name: name.into() }
    }
}

/// What an HPA last said it did (its `status`), for comparing with what watermarkd decides
/// beside it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HpaReplicas {
    /// `status.desiredReplicas`.
    pub desired: Option<u32>,
    /// `status.currentReplicas`.
    pub current: Option<u32>,
    /// `status.lastScaleTime`.
    pub last_scale_time: Option<Timestamp>,
}

/// One other controller's object that scales a target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claimant {
    pub kind: ClaimantKind,
    pub namespace: String,
    pub name: String,
    /// What it scales.
    pub target: TargetKey,
    /// The KEDA ScaledObject an HPA was generated for (its name, in the HPA's namespace).
    pub scaled_object: Option<String>,
    /// An HPA's status; `None` for the other kinds.
    pub replicas: Option<HpaReplicas>,
}

impl Claimant {
    /// `HorizontalPodAutoscaler/shop/web`: the `claimed_by` label of its series.
    pub fn label(&self) -> String {
        format!("{}/{}/{}", self.kind.kind(), self.namespace, self.name)
    }

    fn object(&self) -> ObjectKey {
        (self.kind, self.namespace.clone(), self.name.clone())
    }
}

/// `HorizontalPodAutoscaler shop/keda-hpa-web (KEDA's, for ScaledObject shop/web)`.
impl fmt::Display for Claimant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}/{}", self.kind.kind(), self.namespace, self.name)?;
        if let Some(scaled_object) = &self.scaled_object {
            write!(f, " (KEDA's, for ScaledObject {}/{scaled_object})", self.namespace)?;
        }
        Ok(())
    }
}

/// Where one watch looks: one namespace (`Some`), or all of them (`None`).
pub type Scope = Option<String>;

type ObjectKey = (ClaimantKind, String, String);

/// What the index knows of one target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claims {
    /// Every watch that covers it has listed, and no other controller names it.
    Free,
    /// These other controllers scale it (ordered by kind, namespace and name).
    Claimed(Vec<Claimant>),
    /// These watches that cover it have not listed yet (or none covers its namespace): no one
    /// can say yet whether another controller scales it.
    Unknown(String),
}

/// The claimants of the cluster's targets. See the module comment.
#[derive(Debug, Default)]
pub struct ClaimIndex {
    claimants: HashMap<ObjectKey, Claimant>,
    by_target: HashMap<TargetKey, BTreeSet<ObjectKey>>,
    /// Per watched kind, the scopes it watches and whether each has listed (or is known to
    /// hold none: a ScaledObject resource the cluster does not serve).
    listed: BTreeMap<ClaimantKind, BTreeMap<Scope, bool>>,
}

impl ClaimIndex {
    /// An index fed by a watch of each of `kinds` in each of `scopes`; each must list before
    /// the targets in its scope are known to be free.
    pub fn new(kinds: &[ClaimantKind], scopes: &[Scope]) -> ClaimIndex {
        let listed = kinds.iter().map(|kind| (*kind, scopes.iter().map(|s| (s.clone(), false)).collect())).collect();
        ClaimIndex { listed, ..ClaimIndex::default() }
    }

    /// A claimant was created or changed (its target may have changed too).
    pub fn apply(&mut self, claimant: Claimant) {
        let key = claimant.object();
        self.forget(&key);
        self.by_target.entry(claimant.target.clone()).or_default().insert(key.clone());
        self.claimants.insert(key, claimant);
    }

    /// An object no longer claims anything: deleted, or (a WPA) now watermarkd's own.
    pub fn delete(&mut self, kind: ClaimantKind, namespace: &str, name: &str) {
        self.forget(&(kind, namespace.to_string(), name.to_string()));
    }

    /// The complete set of `kind` in `scope`, first or after the watch restarted: replaces what
    /// was known there, and the scope counts as listed.
    pub fn reset(&mut self, kind: ClaimantKind, scope: &Scope, claimants: Vec<Claimant>) {
        let stale: Vec<ObjectKey> =
            self.claimants.keys().filter(|(k, namespace, _)| *k == kind && covers(scope, namespace)).cloned().collect();
        for key in &stale {
            self.forget(key);
        }
        for claimant in claimants.into_iter().filter(|c| c.kind == kind && covers(scope, &c.namespace)) {
            self.apply(claimant);
        }
        if let Some(scopes) = self.listed.get_mut(&kind) {
            scopes.insert(scope.clone(), true);
        }
    }

    fn forget(&mut self, key: &ObjectKey) {
        let Some(old) = self.claimants.remove(key) else { return };
        if let Some(keys) = self.by_target.get_mut(&old.target) {
            keys.remove(key);
            if keys.is_empty() {
                self.by_target.remove(&old.target);
            }
        }
    }

    /// Whether every watch has listed (for readiness).
    pub fn is_synced(&self) -> bool {
        self.listed.values().all(|scopes| scopes.values().all(|listed| *listed))
    }

    /// What is known of `target`: free, claimed, or not known yet.
    pub fn claims(&self, target: &TargetRef) -> Claims {
        let mut waiting = Vec::new();
        for (kind, scopes) in &self.listed {
            let covering: Vec<bool> =
                scopes.iter().filter(|(scope, _)| covers(scope, &target.namespace)).map(|(_, l)| *l).collect();
            if covering.is_empty() {
                return Claims::Unknown(format!(
                    "watermarkd does not watch namespace {} for {} (the namespaces setting), so it cannot tell \
                     whether another controller scales this target",
                    target.namespace,
                    kind.plural()
                ));
            }
            if !covering.iter().any(|listed| *listed) {
                waiting.push(kind.plural());
            }
        }
        if !waiting.is_empty() {
            return Claims::Unknown(format!(
                "watermarkd has not listed the {} yet, so it cannot tell whether another controller scales this \
                 target",
                waiting.join(" and ")
            ));
        }
        let claimants = self.claimants_of(target);
        if claimants.is_empty() {
            Claims::Free
        } else {
            Claims::Claimed(claimants.into_iter().cloned().collect())
        }
    }

    fn claimants_of(&self, target: &TargetRef) -> Vec<&Claimant> {
        self.by_target
            .get(&TargetKey::of(target))
            .into_iter()
            .flatten()
            .filter_map(|key| self.claimants.get(key))
            .collect()
    }

    /// What each HPA on `target` last said it did, by its `claimed_by` label: the live
    /// controller's replicas, to record beside watermarkd's own decisions.
    pub fn hpa_replicas(&self, target: &TargetRef) -> Vec<(String, HpaReplicas)> {
        self.claimants_of(target).into_iter().filter_map(|c| Some((c.label(), c.replicas?))).collect()
    }
}

fn covers(scope: &Scope, namespace: &str) -> bool {
    scope.as_deref().is_none_or(|scope| scope == namespace)
}

/// What the guard lets one evaluation do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No other controller scales the target: write as decided.
    Write,
    /// Others claim it, and this autoscaler takes over (`take_over = true`): it writes, from
    /// the target's current replicas, within its own limits.
    TakeOver(Vec<Claimant>),
    /// Others claim it and this autoscaler only observes: nothing to withhold.
    Observe(Vec<Claimant>),
    /// It writes nothing: another controller scales the target (the claimants), or no one can
    /// say yet whether one does (none, and why in `why`).
    Withhold { claimants: Vec<Claimant>, why: String },
}

/// The guard's decision for an autoscaler that would write, or that `observe`s, given what
/// the index knows of its target.
pub fn guard(claims: Claims, take_over: bool, observe: bool) -> Verdict {
    match claims {
        Claims::Free => Verdict::Write,
        Claims::Claimed(claimants) if observe => Verdict::Observe(claimants),
        Claims::Unknown(_) if observe => Verdict::Observe(Vec::new()),
        Claims::Claimed(claimants) if take_over => Verdict::TakeOver(claimants),
        Claims::Claimed(claimants) => {
            let names: Vec<String> = claimants.iter().map(ToString::to_string).collect();
            let why = format!(
                "{} already scales this target; watermarkd writes nothing while it does (to cut over, see \
                 docs/cutover.md: take_over = true)",
                names.join(" and ")
            );
            Verdict::Withhold { claimants, why }
        }
        // Not known yet: take_over is a cut-over from a controller someone named, not leave to
        // write over one no one has seen.
        Claims::Unknown(why) => Verdict::Withhold { claimants: Vec::new(), why },
    }
}

/// What the guard said of one evaluation, as the outcome carries it to the status, the page,
/// the series, the WPA condition and the Events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimNote {
    /// `Kind/namespace/name` of each other controller that claims the target.
    pub claimed_by: Vec<Arc<str>>,
    /// Whether this evaluation's write was withheld for it.
    pub withheld: bool,
    /// Whether this autoscaler writes over the claim (`take_over`).
    pub taking_over: bool,
    /// The guard's word, in one sentence.
    pub sentence: String,
}

impl ClaimNote {
    /// What to say of a verdict; `None` for a free target.
    pub fn of(verdict: &Verdict, target: &str) -> Option<ClaimNote> {
        let labels = |claimants: &[Claimant]| claimants.iter().map(|c| Arc::from(c.label())).collect();
        let names =
            |claimants: &[Claimant]| claimants.iter().map(ToString::to_string).collect::<Vec<_>>().join(" and ");
        Some(match verdict {
            Verdict::Write => return None,
            Verdict::TakeOver(claimants) => ClaimNote {
                claimed_by: labels(claimants),
                withheld: false,
                taking_over: true,
                sentence: format!(
                    "taking over {target} from {} (take_over = true): starting from its current replicas",
                    names(claimants)
                ),
            },
            Verdict::Observe(claimants) if claimants.is_empty() => return None,
            Verdict::Observe(claimants) => ClaimNote {
                claimed_by: labels(claimants),
                withheld: false,
                taking_over: false,
                sentence: format!("observing beside {}, which scales {target}", names(claimants)),
            },
            Verdict::Withhold { claimants, why } => {
                ClaimNote { claimed_by: labels(claimants), withheld: true, taking_over: false, sentence: why.clone() }
            }
        })
    }

    /// What the decision's headline says instead of a write: "... but HorizontalPodAutoscaler
    /// shop/web already scales this target".
    pub fn held(&self) -> Option<&str> {
        self.withheld.then_some(self.sentence.as_str())
    }
}

#[cfg(test)]
mod tests;
