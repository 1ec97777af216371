//! The Kubernetes API permissions the daemon needs: every (API group, resource, verb) it uses,
//! and nothing else. Data only.
//!
//! The Helm chart (`charts/watermarkd/templates/rbac.yaml`) and `deploy/rbac.yaml`, rendered
//! from it, grant exactly this list (the entries with [`Permission::namespaced_to_daemon`] in a
//! Role in the daemon's namespace, the others in a ClusterRole; the entries with
//! [`Permission::crd_mode_only`] only when the chart enables CRD mode) and the README (Install)
//! shows it as a table; `tests/packaging.rs` and `tests/chart.rs` fail when any of them differs
//! from [`PERMISSIONS`]. When code starts making a new kind of API call, add it
//! here first.
//!
//! Targets of other kinds (custom resources with a `/scale` subresource) need the verbs of the
//! `apps` entries for their own group and resource; they are granted per installation, not
//! here (see the README (Install)).

use crate::adapters::status::access;

/// One RBAC rule: these verbs on these resources of one API group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Permission {
    /// Granted only in the daemon's own namespace (a Role), not cluster-wide (a ClusterRole).
    pub namespaced_to_daemon: bool,
    /// Used only in CRD mode (the `crd` setting): the daemon makes this call only when it runs
    /// WatermarkPodAutoscaler objects. An installation that runs the rules file alone need not
    /// grant it, so the chart leaves it out with `crd.enabled: false`: access to another
    /// controller's custom resources should not be granted where it is never used.
    pub crd_mode_only: bool,
    /// The API group; `""` is the core group.
    pub api_group: &'static str,
    /// Plural resource names; `name/subresource` for a subresource.
    pub resources: &'static [&'static str],
    pub verbs: &'static [&'static str],
}

/// Everything the daemon asks the API server, grouped as `deploy/rbac.yaml` grants it.
pub const PERMISSIONS: &[Permission] = &[
    WPA_READ,
    WPA_STATUS_WRITE,
    DATADOG_METRIC_READ,
    WORKLOAD_READ,
    WORKLOAD_SCALE,
    POD_READ,
    POD_METRICS_READ,
    EVENT_WRITE,
    HPA_READ,
    SCALED_OBJECT_READ,
    LEASE,
    STATE_CONFIGMAPS,
];

/// The watcher of WatermarkPodAutoscaler objects (the initial list, then watch): in CRD mode
/// those [`crate::domain::crd::map_wpa`] maps onto autoscalers (`runtime` sources); in every
/// mode, for the guard (`runtime/claims.rs`), those another controller scales with.
pub const WPA_READ: Permission = Permission {
    namespaced_to_daemon: false,
    crd_mode_only: false,
    api_group: "datadoghq.com",
    resources: &["watermarkpodautoscalers"],
    verbs: &["list", "watch"],
};

/// CRD mode: writing each WPA's status (conditions, current and desired replicas, last scale
/// time) as computed by [`crate::domain::crd::next_status`], only when it changed.
pub const WPA_STATUS_WRITE: Permission = Permission {
    namespaced_to_daemon: false,
    crd_mode_only: true,
    api_group: "datadoghq.com",
    resources: &["watermarkpodautoscalers/status"],
    verbs: &["patch"],
};

/// CRD mode: the watcher behind [`crate::domain::crd::DatadogMetricIndex`], which resolves WPA metric
/// references of the form `datadogmetric@namespace:name` to the `DatadogMetric`'s query.
pub const DATADOG_METRIC_READ: Permission = Permission {
    namespaced_to_daemon: false,
    crd_mode_only: true,
    api_group: "datadoghq.com",
    resources: &["datadogmetrics"],
    verbs: &["list", "watch"],
};

/// The scale targets: [`crate::adapters::workload`] watches them for replicas, readiness and the time of
/// the last scale. Read only: the state of a rules-file autoscaler is kept in a ConfigMap of
/// the daemon's own ([`STATE_CONFIGMAPS`]), not on the target.
pub const WORKLOAD_READ: Permission = Permission {
    namespaced_to_daemon: false,
    crd_mode_only: false,
    api_group: "apps",
    resources: &["deployments", "statefulsets", "replicasets"],
    verbs: &["list", "watch"],
};

/// [`crate::adapters::workload`]: changing a target's replicas with a merge patch of `/scale` that carries
/// the resourceVersion decided on. (The apps kinds are read from the watched object itself;
/// only custom kinds also need `get` on their `/scale`.)
pub const WORKLOAD_SCALE: Permission = Permission {
    namespaced_to_daemon: false,
    crd_mode_only: false,
    api_group: "apps",
    resources: &["deployments/scale", "statefulsets/scale", "replicasets/scale"],
    verbs: &["patch"],
};

/// [`crate::adapters::workload`]: a pod watch scoped to a label selector (one per selector and namespace,
/// shared by the targets with that selector) that counts ready pods, only for targets whose
/// status has no `readyReplicas`. [`crate::adapters::resource`]: a list of the pods a
/// resource metric selects, each cycle, to tell which count.
pub const POD_READ: Permission = Permission {
    namespaced_to_daemon: false,
    crd_mode_only: false,
    api_group: "",
    resources: &["pods"],
    verbs: &["list", "watch"],
};

/// [`crate::adapters::resource`]: resource metrics (cpu, memory) read as a list of the `PodMetrics` a
/// metric's selector selects, each cycle (metrics-server serves them through the API server).
pub const POD_METRICS_READ: Permission = Permission {
    namespaced_to_daemon: false,
    crd_mode_only: false,
    api_group: "metrics.k8s.io",
    resources: &["pods"],
    verbs: &["list"],
};

/// [`crate::adapters::events`]: an Event on the target for each scale and each failure, each its own
/// object (never patched into a series).
pub const EVENT_WRITE: Permission = Permission {
    namespaced_to_daemon: false,
    crd_mode_only: false,
    api_group: "events.k8s.io",
    resources: &["events"],
    verbs: &["create"],
};

/// The guard (`runtime/claims.rs`): a watch of the HorizontalPodAutoscalers, so that no
/// autoscaler writes to a target an HPA (KEDA's included) scales, and the HPAs' replicas.
pub const HPA_READ: Permission = Permission {
    namespaced_to_daemon: false,
    crd_mode_only: false,
    api_group: "autoscaling",
    resources: &["horizontalpodautoscalers"],
    verbs: &["list", "watch"],
};

/// The guard (`runtime/claims.rs`): a watch of KEDA's ScaledObjects, while the cluster serves
/// them, so that no autoscaler writes to a target a ScaledObject scales.
pub const SCALED_OBJECT_READ: Permission = Permission {
    namespaced_to_daemon: false,
    crd_mode_only: false,
    api_group: "keda.sh",
    resources: &["scaledobjects"],
    verbs: &["list", "watch"],
};

/// [`crate::adapters::lease`]: leader election with one Lease in the daemon's own namespace: read it,
/// create it when it is missing, renew it or take it over with an update.
pub const LEASE: Permission = Permission {
    namespaced_to_daemon: true,
    crd_mode_only: false,
    api_group: "coordination.k8s.io",
    resources: &["leases"],
    verbs: &["get", "create", "update"],
};

/// [`crate::adapters::state_store`]: a rules-file autoscaler's persisted state, one ConfigMap per
/// target in the daemon's own namespace: read when an autoscaler starts or this daemon becomes
/// the leader, written with a server-side apply (which the API server authorizes as `create`
/// too when the ConfigMap does not exist yet).
pub const STATE_CONFIGMAPS: Permission = Permission {
    namespaced_to_daemon: true,
    crd_mode_only: false,
    api_group: "",
    resources: &["configmaps"],
    verbs: &["get", "create", "patch"],
};

/// `[status] token_review` (off by default, so not in [`PERMISSIONS`]): the status service
/// asks the API server whether a reader's bearer token is authenticated and as whom (a
/// TokenReview), then whether that user may read the status ([`STATUS_READER`], a
/// SubjectAccessReview). Both are cluster-scoped and only ever created: the answer comes back in
/// the response and nothing is stored; they let the daemon learn who a token belongs to and
/// what RBAC allows them, not act as them. The chart grants them in a ClusterRole of their own
/// (`<fullname>-tokenreview`), only while `status.tokenReview` is on; the README
/// (Permissions) lists them under the table.
pub const STATUS_TOKEN_REVIEW: &[Permission] = &[TOKEN_REVIEWS, SUBJECT_ACCESS_REVIEWS];

/// [`crate::adapters::status::access`]: is a reader's token authenticated, for the
/// `token_audiences`, and as whom.
pub const TOKEN_REVIEWS: Permission = Permission {
    namespaced_to_daemon: false,
    crd_mode_only: false,
    api_group: "authentication.k8s.io",
    resources: &["tokenreviews"],
    verbs: &["create"],
};

/// [`crate::adapters::status::access`]: may the user of an authenticated token read the status
/// ([`STATUS_READER`]).
pub const SUBJECT_ACCESS_REVIEWS: Permission = Permission {
    namespaced_to_daemon: false,
    crd_mode_only: false,
    api_group: "authorization.k8s.io",
    resources: &["subjectaccessreviews"],
    verbs: &["create"],
};

/// Not the daemon's: what a reader's token must be allowed for the status service to let it in
/// with `token_review` on: `get` on `status` in the API group `watermarkd.io`, asked
/// cluster-wide (no namespace), so only a ClusterRole bound with a ClusterRoleBinding grants it
/// (a RoleBinding in one namespace does not: the status shows every namespace's autoscalers).
/// No such resource is served; RBAC rules may name any group and resource, and `kubectl auth
/// can-i get status.watermarkd.io --as USER` answers for it. The chart's `<fullname>-status-reader`
/// ClusterRole grants exactly this.
pub const STATUS_READER: Permission = Permission {
    namespaced_to_daemon: false,
    crd_mode_only: false,
    api_group: access::READER_API_GROUP,
    resources: &[access::READER_RESOURCE],
    verbs: &[access::READER_VERB],
};
