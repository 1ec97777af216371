//! Cached reads: [`Workloads::read`] serves a target's [`ScaleReading`] from its stores.
//!
//! Built-in kinds are read straight from the stored object; custom kinds through a `/scale`
//! GET cached per object version (`ScaleCache`, retried on a backoff after a failure); our own
//! scale write is served over the store until its watch event arrives (`Overlay`); ready
//! replicas come from the object or from a pod store. Kept apart from the registry so that
//! what a read may cost (a wait, a request) is in one place.

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, DynamicObject};
use kube::Client;
use tokio::sync::watch as channel;
use tokio::time::Instant;

use super::cache::{Failure, ScaleCache, ScaleOf};
use super::compact::{stamp_spec_change, StoredWorkload};
use super::discovery::{api_for, Resolved};
use super::error::Request;
use super::object::KindPaths;
use super::registry::{pod_store, WorkloadStore};
use super::watch::StoreStatus;
use super::{describe, not_found, now, retry_delay, ScaleReading, WorkloadError, Workloads};
use crate::domain::rules::TargetRef;

impl Workloads {
    fn no_answer(&self, target: &TargetRef) -> WorkloadError {
        WorkloadError::Connection(format!(
            "no answer from the API server about {} within {:?}",
            describe(target),
            self.inner.sync_timeout
        ))
    }

    /// The target's scale from the stores. Waits (up to the sync timeout) only while its
    /// store has not listed yet; afterwards it makes no request for built-in kinds, and for
    /// custom kinds only a `/scale` GET when the object changed since the last one.
    pub async fn read(&self, target: &TargetRef) -> Result<ScaleReading, WorkloadError> {
        let deadline = Instant::now() + self.inner.sync_timeout;
        let store = self.store_of(target)?;
        match wait_listed(&store.status, deadline).await {
            Waited::Listed => {}
            Waited::Failed(err) => return Err(err),
            Waited::TimedOut => return Err(self.no_answer(target)),
            Waited::Stopped => return Err(WorkloadError::NotWatched(describe(target))),
        }
        let resolved = store.resolved().ok_or_else(|| self.no_answer(target))?;
        let object = self.lookup(&store, &resolved, target, deadline).await?;
        let mut reading = match resolved.paths {
            KindPaths::Builtin(_) => builtin_reading(&object),
            KindPaths::Custom => self.read_custom(&resolved, target, &object).await?,
        };
        let pods = {
            let mut registry = self.registry();
            let watched = registry.target_mut(target).ok_or_else(|| WorkloadError::NotWatched(describe(target)))?;
            watched.unconfirmed = false;
            if let Some(overlay) = &watched.overlay {
                if !overlay.apply(&object, &mut reading) {
                    watched.overlay = None;
                }
            }
            match (&reading.ready_replicas, &reading.selector) {
                (None, Some(selector)) => Some(pod_store(&mut registry, &self.inner.context, target, selector)),
                _ => {
                    registry.drop_pods_of(target);
                    None
                }
            }
        };
        if let Some(pods) = pods {
            match wait_listed(&pods.status, deadline).await {
                Waited::Listed => {}
                Waited::Failed(err) => return Err(err),
                Waited::TimedOut => return Err(self.no_answer(target)),
                // Its last user went away meanwhile (unwatched, or a new selector).
                Waited::Stopped => {
                    return Err(WorkloadError::Connection(format!(
                        "the pod selector of {} changed while reading; read again",
                        describe(target)
                    )))
                }
            }
            let ready = pods.reader.state().iter().filter(|pod| pod.ready).count();
            reading.ready_replicas = Some(u32::try_from(ready).unwrap_or(u32::MAX));
        }
        Ok(reading)
    }

    /// The target's object from its listed store. A miss is `NotFound`, except the first one
    /// of a target that joined a running store, which asks the API server whether the object
    /// exists and, if it does, waits (until `deadline`) for the store to show it.
    async fn lookup(
        &self,
        store: &WorkloadStore,
        resolved: &Resolved,
        target: &TargetRef,
        deadline: Instant,
    ) -> Result<Arc<StoredWorkload>, WorkloadError> {
        if let Some(object) = store.get(&target.name) {
            return Ok(object);
        }
        let unconfirmed = {
            let mut registry = self.registry();
            let watched = registry.target_mut(target).ok_or_else(|| WorkloadError::NotWatched(describe(target)))?;
            watched.overlay = None;
            let unconfirmed = watched.unconfirmed;
            if !unconfirmed {
                registry.drop_pods_of(target);
            }
            unconfirmed
        };
        if !unconfirmed {
            return Err(not_found(target));
        }
        if Box::pin(self.list_version(resolved, target)).await?.is_none() {
            let mut registry = self.registry();
            if let Some(watched) = registry.target_mut(target) {
                watched.unconfirmed = false;
            }
            registry.drop_pods_of(target);
            return Err(not_found(target));
        }
        loop {
            if let Some(object) = store.get(&target.name) {
                return Ok(object);
            }
            if Instant::now() >= deadline {
                return Err(self.no_answer(target));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A custom kind's reading: `/scale` as last read for this version of the object, or read
    /// now (once per version; after a failure, again when the backoff has passed).
    async fn read_custom(
        &self,
        resolved: &Resolved,
        target: &TargetRef,
        object: &StoredWorkload,
    ) -> Result<ScaleReading, WorkloadError> {
        let reading = |scale: ScaleOf| ScaleReading {
            spec_replicas: scale.spec_replicas,
            status_replicas: scale.status_replicas,
            ready_replicas: object.ready_replicas,
            selector: scale.selector,
            resource_version: scale.resource_version,
            marks: object.marks.clone(),
            spec_changed_at: scale.spec_changed_at,
        };
        let (last_spec, attempt) = {
            let mut registry = self.registry();
            let watched = registry.target_mut(target).ok_or_else(|| WorkloadError::NotWatched(describe(target)))?;
            match watched.scale.as_deref() {
                Some(cache) if cache.version == object.resource_version => match &cache.outcome {
                    Ok(scale) => return Ok(reading(scale.clone())),
                    Err(failure) if Instant::now() < failure.retry_at => return Err(failure.error.clone()),
                    Err(_) => (cache.last_spec, cache.attempt),
                },
                Some(cache) => (cache.last_spec, cache.attempt),
                None => (None, 0),
            }
        };
        // Boxed: a kube request's future is large.
        let fetched = Box::pin(get_scale(&self.inner.context.client, resolved, target)).await;
        let outcome = fetched.map(|mut scale| {
            // The arrival of the version whose /scale showed the change: the closest to when
            // the change became visible that a read-time fetch can tell.
            let at = object.seen.unwrap_or_else(now);
            scale.spec_changed_at = stamp_spec_change(scale.spec_replicas, last_spec, at);
            scale
        });
        let mut registry = self.registry();
        let watched = registry.target_mut(target).ok_or_else(|| WorkloadError::NotWatched(describe(target)))?;
        let version = object.resource_version.clone();
        match outcome {
            Ok(scale) => {
                let last_spec = Some((scale.spec_replicas, scale.spec_changed_at));
                watched.scale =
                    Some(Box::new(ScaleCache { version, outcome: Ok(scale.clone()), last_spec, attempt: 0 }));
                Ok(reading(scale))
            }
            Err(error) => {
                tracing::warn!(workload = %describe(target), error = %error, "cannot read /scale; retrying");
                let failure = Failure { error: error.clone(), retry_at: Instant::now() + retry_delay(attempt) };
                watched.scale =
                    Some(Box::new(ScaleCache { version, outcome: Err(failure), last_spec, attempt: attempt + 1 }));
                Err(error)
            }
        }
    }
}

/// How a wait for a store's first list ended.
enum Waited {
    Listed,
    Failed(WorkloadError),
    TimedOut,
    /// The store was stopped meanwhile.
    Stopped,
}

async fn wait_listed(status: &channel::Receiver<StoreStatus>, deadline: Instant) -> Waited {
    let mut status = status.clone();
    let answered = tokio::time::timeout_at(deadline, status.wait_for(|s| !matches!(s, StoreStatus::Starting)))
        .await
        .map(|answer| answer.map(|current| current.clone()));
    match answered {
        Ok(Ok(StoreStatus::Synced)) => Waited::Listed,
        Ok(Ok(StoreStatus::Failed(err))) => Waited::Failed(err),
        Ok(Ok(StoreStatus::Starting)) | Err(_) => Waited::TimedOut,
        Ok(Err(_)) => Waited::Stopped,
    }
}

/// Reads `/scale` of a custom kind.
async fn get_scale(client: &Client, resolved: &Resolved, target: &TargetRef) -> Result<ScaleOf, WorkloadError> {
    let api: Api<DynamicObject> = api_for(client, resolved, &target.namespace);
    let resource = format!("{}/scale", resolved.resource.plural);
    let request = Request::for_target("get", &resource, target);
    let scale = api.get_scale(&target.name).await.map_err(|e| request.error(&e))?;
    let count = |n: Option<i32>| n.and_then(|n| u32::try_from(n).ok()).unwrap_or(0);
    let status = scale.status.unwrap_or_default();
    Ok(ScaleOf {
        spec_replicas: count(scale.spec.and_then(|s| s.replicas)),
        status_replicas: count(Some(status.replicas)),
        selector: status.selector.filter(|s| !s.is_empty()),
        resource_version: scale.metadata.resource_version.unwrap_or_default(),
        spec_changed_at: None,
    })
}

/// The reading of a built-in workload: its `/scale` maps to fixed fields of the stored object.
pub(super) fn builtin_reading(object: &StoredWorkload) -> ScaleReading {
    ScaleReading {
        spec_replicas: object.spec_replicas,
        status_replicas: object.status_replicas,
        ready_replicas: object.ready_replicas,
        selector: object.selector.as_deref().map(str::to_string),
        resource_version: object.resource_version.to_string(),
        marks: object.marks.clone(),
        spec_changed_at: object.seen,
    }
}
