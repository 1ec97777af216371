//! `watermarkd run`: the composition root. It builds the parts and wires them together; each
//! part lives in its own file:
//!
//! - `rules_file` and `wpa` (mapping through the synchronous `wpa_index`) are the sources: each
//!   sends the complete set of autoscalers it wants. `source` says what an autoscaler's source
//!   implies (its key, where its state persists, where its status goes).
//! - `scheduler` starts, stops and replaces autoscalers by key and hands out the ones due
//!   (timing rules in `schedule`).
//! - `cycle` queries the autoscalers due together (one `evaluate` call per backend, so Datadog
//!   batches are shared) and decides each in its own task (`evaluate`), at most
//!   `max_concurrency` at once. One still running when it falls due again skips that turn.
//! - `report` writes WPA statuses and events; `health` keeps `/readyz` and systemd's watchdog.

pub mod allocator;
mod cycle;
mod evaluate;
mod evaluation;
mod health;
mod memory;
mod report;
mod rules_file;
mod schedule;
mod scheduler;
mod shared;
mod source;
mod systemd;
mod wpa;
mod wpa_index;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus::Registry;
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::backend::recommender::RecommenderClients;
use crate::backend::BackendError;
use crate::events::EventPublisher;
use crate::lease::{Authority, LeaderElector, Role};
use crate::resource::ResourceMetrics;
use crate::rules::{self, RulesError};
use crate::settings::Settings;
use crate::state::configmap::StateConfigMaps;
use crate::telemetry::{AutoscalerMetrics, BackendMetrics, DaemonMetrics, HttpClientMetrics, Readiness};
use crate::workload::{WorkloadError, Workloads};
use scheduler::{Command, Scheduler, TargetChanges};
use shared::{Clock, Shared};
use source::SourceKind;
use wpa_index::{Scope, WpaIndex};

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    // Transparent: a wrapper that also printed its source would say everything twice in the
    // `{:#}` chain `main` prints.
    #[error(transparent)]
    Rules(#[from] RulesError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Kubernetes(#[from] WorkloadError),
    #[error(transparent)]
    Registry(#[from] prometheus::Error),
    #[error("cannot listen on {address}: {error}")]
    Listen { address: String, error: std::io::Error },
    #[error("signal handler: {0}")]
    Signal(std::io::Error),
}

/// Runs until SIGTERM or SIGINT.
pub async fn run(settings: Settings) -> Result<(), RunError> {
    crate::backend::ensure_crypto_provider();
    let notifier = systemd::Notifier::from_env();
    let registry = Registry::new();
    let backend_metrics = Arc::new(BackendMetrics::new(&registry)?);
    let autoscaler_metrics = Arc::new(AutoscalerMetrics::with_labels_as_tags(settings.labels_as_tags.clone()));
    let daemon = DaemonMetrics::new(&registry)?;
    let recommenders = RecommenderClients::new(settings.cluster_name.clone(), HttpClientMetrics::new(&registry)?);
    let readiness = Arc::new(Readiness::default());

    let rules = rules::load_rules(&settings.rules)?;
    readiness.rules_loaded.store(true, Ordering::Release);
    daemon.last_reload_successful.set(1);

    let client = crate::workload::connect(settings.kubeconfig.as_deref(), settings.context.as_deref()).await?;
    let targets = Workloads::new(client.clone());
    let events = EventPublisher::new(client.clone(), &settings.lease.identity, Duration::from_secs(300));

    let (shutdown_tx, shutdown) = watch::channel(false);
    let (bound, server) = crate::telemetry::serve(
        settings.listen,
        settings.listen_limits,
        registry.clone(),
        Arc::clone(&autoscaler_metrics),
        Arc::clone(&readiness),
        shutdown.clone(),
    )
    .await
    .map_err(|error| RunError::Listen { address: settings.listen.to_string(), error })?;
    tracing::info!(listen = %bound, "serving /metrics, /healthz and /readyz");

    // Leadership. Without a Lease this daemon always leads; the sender lives as long as `run`.
    let (lease_stop_tx, lease_stop) = watch::channel(false);
    let (_fixed_role, fixed_role_rx) = watch::channel(Role::Leader);
    let (mut role, elector) = if settings.lease.enabled {
        let elector = LeaderElector::new(client.clone(), settings.lease.clone());
        (elector.subscribe(), Some(elector))
    } else {
        (fixed_role_rx, None)
    };
    let authority = elector.as_ref().map_or_else(Authority::unleased, LeaderElector::authority);
    let lease_task = elector.map(|elector| tokio::spawn(elector.run(lease_stop)));

    let shared = Arc::new(Shared {
        client: client.clone(),
        targets: targets.clone(),
        states: StateConfigMaps::new(client.clone(), &settings.lease.namespace),
        events: Some(events),
        autoscaler_metrics: Arc::clone(&autoscaler_metrics),
        daemon: daemon.clone(),
        resources: ResourceMetrics::new(client.clone(), Arc::clone(&backend_metrics)),
        recommenders,
        clock: Clock::start(),
        dry_run: settings.dry_run,
        default_interval: settings.default_interval,
        epoch: AtomicU64::new(0),
        leader: AtomicBool::new(false),
        authority,
        stopping: AtomicBool::new(false),
    });

    let (commands_tx, mut commands) = mpsc::channel::<Command>(16);
    let (backends, file_autoscalers) = rules_file::split(rules, settings.dry_run);
    let (rules_tx, rules_rx) = watch::channel(Arc::clone(&backends));
    let (reload_tx, reload_rx) = mpsc::channel::<()>(4);
    let mut scheduler = Scheduler::new(settings.default_interval, backend_metrics, autoscaler_metrics, daemon);
    // Applied before readiness is judged, so "caches synced" covers these targets.
    scheduler.apply(Command::Backends(Arc::clone(&backends)));
    follow(&targets, scheduler.apply(Command::Replace { source: SourceKind::RulesFile, desired: file_autoscalers }));
    shared.recommenders.retain(scheduler.recommenders());
    let mut source_tasks = JoinSet::new();
    source_tasks.spawn(rules_file::watch_rules_file(rules_file::RulesWatch {
        path: settings.rules.clone(),
        poll: settings.reload_poll,
        commands: commands_tx.clone(),
        rules: rules_tx,
        reload: reload_rx,
        shared: Arc::clone(&shared),
        notifier: systemd::Notifier::from_env(),
        shutdown: shutdown.clone(),
    }));
    let crd_synced = Arc::new(AtomicBool::new(!settings.crd));
    if settings.crd {
        let scopes: Vec<Scope> = if settings.namespaces.is_empty() {
            vec![Scope::All]
        } else {
            settings.namespaces.iter().cloned().map(Scope::Namespace).collect()
        };
        if let Some(dir) = settings.recommender_policy.tls_dir().filter(|dir| !dir.is_dir()) {
            tracing::warn!(
                recommender_tls_dir = %dir.display(),
                "recommender_tls_dir is not a directory: WPA recommenders that name TLS files will fail until it is"
            );
        }
        let index = WpaIndex::new(
            scopes.iter().cloned(),
            &backends,
            &settings.default_backend,
            settings.recommender_policy.clone(),
            settings.labels_as_tags.clone(),
            settings.dry_run,
        );
        source_tasks.spawn(wpa::run(wpa::WpaWatch {
            client: client.clone(),
            scopes,
            index,
            rules: rules_rx,
            commands: commands_tx.clone(),
            shared: Arc::clone(&shared),
            synced: Arc::clone(&crd_synced),
            shutdown: shutdown.clone(),
        }));
    }

    let watch_health = targets.watch_health();
    let caches_synced = {
        let targets = targets.clone();
        let crd_synced = Arc::clone(&crd_synced);
        // Not ready while a watch is failing: its cache may be stale (the API server is down
        // or restarting). Writes stay safe meanwhile: each carries the resourceVersion it was
        // decided on.
        move || crd_synced.load(Ordering::Acquire) && targets.settled() && !watch_health.failing()
    };
    tokio::spawn(health::follow_readiness(
        Arc::clone(&readiness),
        caches_synced,
        systemd::Notifier::from_env(),
        shutdown.clone(),
    ));
    if let Some(period) = systemd::Notifier::watchdog_interval() {
        tokio::spawn(health::ping_watchdog(systemd::Notifier::from_env(), period, shutdown.clone()));
    }

    let mut terminate = signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut interrupt = signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut hangup = signal(tokio::signal::unix::SignalKind::hangup())?;
    observe_role(&shared, &readiness, &role.borrow_and_update());

    let permits = Arc::new(Semaphore::new(settings.max_concurrency));
    let mut cycles = JoinSet::new();
    loop {
        let sleep_until = scheduler.next_due().unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            Some(command) = commands.recv() => {
                let replaces = matches!(command, Command::Replace { .. });
                follow(&targets, scheduler.apply(command));
                if replaces {
                    // The recommenders nothing uses any more go, with their clients and series.
                    shared.recommenders.retain(scheduler.recommenders());
                }
            }
            _ = tokio::time::sleep_until(sleep_until) => {
                let due = scheduler.take_due(Instant::now(), shared.is_leader());
                if !due.jobs.is_empty() {
                    cycles.spawn(cycle::run(Arc::clone(&shared), Arc::clone(&permits), due));
                }
                // Reap finished cycles so the set does not grow.
                while cycles.try_join_next().is_some() {}
            }
            changed = role.changed() => {
                if changed.is_ok() {
                    observe_role(&shared, &readiness, &role.borrow_and_update());
                }
            }
            _ = hangup.recv() => {
                tracing::info!("SIGHUP: reloading the rules");
                reload_tx.try_send(()).ok();
            }
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
        }
    }

    // Graceful shutdown: no new decisions, in-flight writes finish, then the Lease goes.
    tracing::info!("stopping: finishing the evaluations in flight");
    notifier.stopping();
    shared.stopping.store(true, Ordering::Release);
    shutdown_tx.send(true).ok();
    let max_permits = u32::try_from(settings.max_concurrency).unwrap_or(u32::MAX);
    let drained = tokio::time::timeout(Duration::from_secs(20), permits.acquire_many(max_permits)).await;
    if drained.is_err() {
        tracing::warn!("evaluations still running after 20s; stopping anyway");
    }
    cycles.abort_all();
    source_tasks.abort_all();
    shared.leader.store(false, Ordering::Release);
    lease_stop_tx.send(true).ok();
    if let Some(task) = lease_task {
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), server).await;
    tracing::info!("stopped");
    Ok(())
}

/// Starts following the targets that autoscalers started using, then stops following the
/// ones they left (in that order, so a cache both use is kept).
fn follow(targets: &Workloads, changes: TargetChanges) {
    for target in &changes.follow {
        targets.watch(target);
    }
    for target in &changes.unfollow {
        targets.unwatch(target);
    }
}

fn signal(kind: tokio::signal::unix::SignalKind) -> Result<tokio::signal::unix::Signal, RunError> {
    tokio::signal::unix::signal(kind).map_err(RunError::Signal)
}

fn observe_role(shared: &Shared, readiness: &Readiness, role: &Role) {
    let leader = *role == Role::Leader;
    let was = shared.leader.swap(leader, Ordering::AcqRel);
    if leader && !was {
        // Continue from what the previous leader persisted, not from this process's memory.
        shared.epoch.fetch_add(1, Ordering::AcqRel);
        tracing::info!("leading: this daemon scales");
    } else if !leader && was {
        tracing::info!(?role, "following: another daemon scales");
    }
    shared.daemon.leader.set(i64::from(leader));
    readiness.leader_known.store(*role != Role::Unknown, Ordering::Release);
}
