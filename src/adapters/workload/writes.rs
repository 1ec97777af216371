//! Writes: [`Workloads::scale`] patches a target's `/scale` with the resourceVersion the
//! decision was based on, so a concurrent change is a [`WorkloadError::Conflict`] rather than
//! an overwrite; [`Workloads::current_version`] asks the API server (not the store) what the
//! version is now. Kept apart from the reads: these are the only requests that change the
//! cluster, and `current_version` the only read that passes the stores by on purpose.

use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::json;

use super::cache::Overlay;
use super::discovery::{api_for, Resolved};
use super::error::Request;
use super::registry::resolved_kind;
use super::{describe, not_found, now, ScaleReading, WorkloadError, Workloads, FIELD_MANAGER};
use crate::domain::rules::TargetRef;

impl Workloads {
    /// Sets the target's replicas to `replicas` with one merge patch of `/scale` carrying
    /// `from.resource_version`: if the object changed since `from` was read, the API server
    /// answers 409 and this returns [`WorkloadError::Conflict`] without writing anything. The
    /// caller then reads again and decides again. Any change counts, a status update by the
    /// workload's controller included (`/scale` shares the object's resourceVersion), so a
    /// caller should expect the odd conflict during rollouts and simply retry with a fresh
    /// reading. No request when `replicas` equals `from.spec_replicas`.
    pub async fn scale(&self, target: &TargetRef, from: &ScaleReading, replicas: u32) -> Result<(), WorkloadError> {
        let store = self.store_of(target)?;
        if replicas == from.spec_replicas {
            return Ok(());
        }
        if from.resource_version.is_empty() {
            // Without a version the patch would overwrite whatever is there.
            return Err(WorkloadError::Api {
                code: 0,
                message: "refusing to scale from a reading without a resourceVersion".to_string(),
            });
        }
        let resolved = resolved_kind(&store, target)?;
        let api: Api<DynamicObject> = api_for(&self.inner.context.client, &resolved, &target.namespace);
        let resource = format!("{}/scale", resolved.resource.plural);
        let request = Request::for_target("patch", &resource, target);
        let patch = json!({
            "metadata": { "resourceVersion": from.resource_version },
            "spec": { "replicas": replicas },
        });
        let params = PatchParams { field_manager: Some(FIELD_MANAGER.to_string()), ..PatchParams::default() };
        match api.patch_scale(&target.name, &params, &Patch::Merge(&patch)).await {
            Ok(scale) => {
                let written = scale.metadata.resource_version.unwrap_or_default();
                let based_on_current =
                    store.get(&target.name).is_some_and(|object| *object.resource_version == *from.resource_version);
                if based_on_current && !written.is_empty() {
                    if let Some(watched) = self.registry().target_mut(target) {
                        watched.overlay = Some(Box::new(Overlay {
                            based_on: from.resource_version.clone().into_boxed_str(),
                            written,
                            replicas,
                            at: now(),
                        }));
                    }
                }
                tracing::info!(workload = %describe(target), from = from.spec_replicas, to = replicas, "scaled");
                Ok(())
            }
            Err(err) => Err(match request.error(&err) {
                WorkloadError::Conflict { kind, namespace, name, .. } => {
                    WorkloadError::Conflict { kind, namespace, name, resource_version: from.resource_version.clone() }
                }
                other => other,
            }),
        }
    }

    /// The object's resourceVersion as the API server has it now (a quorum read, not the
    /// store): after a write whose outcome is unknown, it tells whether anything changed.
    /// A list of the one name, so that it needs no verb beyond the watch's.
    pub async fn current_version(&self, target: &TargetRef) -> Result<String, WorkloadError> {
        let resolved = resolved_kind(&*self.store_of(target)?, target)?;
        self.list_version(&resolved, target).await?.ok_or_else(|| not_found(target))
    }

    pub(super) async fn list_version(
        &self,
        resolved: &Resolved,
        target: &TargetRef,
    ) -> Result<Option<String>, WorkloadError> {
        let api: Api<DynamicObject> = api_for(&self.inner.context.client, resolved, &target.namespace);
        let request = Request::for_target("list", &resolved.resource.plural, target);
        let params = ListParams::default().fields(&format!("metadata.name={}", target.name));
        let list = api.list_metadata(&params).await.map_err(|err| request.error(&err))?;
        Ok(list.items.into_iter().next().map(|object| object.metadata.resource_version.unwrap_or_default()))
    }
}
