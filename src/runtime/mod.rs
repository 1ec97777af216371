//! `watermarkd run`: one scheduler runs every autoscaler on its own interval. Autoscalers that
//! fall due together are queried together (one `evaluate` call per backend, so Datadog batches
//! are shared), then each is decided and written in its own task, at most `max_concurrency` at
//! once. An autoscaler still running when it falls due again skips that turn, so a slow one
//! never holds back the others; a slow backend holds back only the autoscalers that use it.
//!
//! Sources: the rules file (`file`, reloaded on change and SIGHUP) and the cluster's WPA objects
//! (`crd`). Each sends the full set of autoscalers it wants; the scheduler starts, stops and
//! replaces by key, and one whose definition is unchanged keeps its state and its schedule.

mod evaluate;
pub mod memory;
pub mod schedule;
mod sources;
pub mod systemd;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use prometheus::Registry;
use tokio::sync::{mpsc, watch, OwnedMutexGuard, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use watermarkd_engine::{State, Timestamp};

use crate::backend::recommender::{RecommenderClients, WorkloadState};
use crate::backend::{BackendError, MetricBackend, MetricQuery, Observation, QueryBackend, QueryError};
use crate::crd::{WatermarkPodAutoscaler, WatermarkPodAutoscalerStatus};
use crate::events::EventPublisher;
use crate::lease::{Authority, LeaderElector, Role};
use crate::resource::{ResourceMetrics, ResourceQuery};
use crate::rules::{self, Autoscaler, RulesError, RulesFile};
use crate::settings::Settings;
use crate::target::{TargetError, Targets};
use crate::telemetry::{AutoscalerMetrics, BackendMetrics, DaemonMetrics, HttpClientMetrics, Readiness, SeriesLabels};

pub use evaluate::Outcome;

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    // Transparent: a wrapper that also printed its source would say everything twice in the
    // `{:#}` chain `main` prints.
    #[error(transparent)]
    Rules(#[from] RulesError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Kubernetes(#[from] TargetError),
    #[error(transparent)]
    Registry(#[from] prometheus::Error),
    #[error("cannot listen on {address}: {error}")]
    Listen { address: String, error: std::io::Error },
    #[error("signal handler: {0}")]
    Signal(std::io::Error),
}

/// Wall time that advances with tokio's clock: monotonic (a clock step does not open or close a
/// window) and paused with it in tests.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    wall: Timestamp,
    start: Instant,
}

impl Clock {
    pub fn start() -> Clock {
        Clock { wall: Timestamp::from_system_time(SystemTime::now()), start: Instant::now() }
    }

    pub fn now(&self) -> Timestamp {
        self.wall.plus(self.start.elapsed())
    }
}

/// Where an autoscaler comes from. Keys are prefixed with it, so each source replaces only its
/// own autoscalers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SourceKind {
    File,
    Crd,
}

impl SourceKind {
    fn label(self) -> &'static str {
        match self {
            SourceKind::File => "file",
            SourceKind::Crd => "crd",
        }
    }
}

/// An autoscaler a source wants running.
#[derive(Clone, Debug)]
pub struct Desired {
    pub key: String,
    pub autoscaler: Autoscaler,
    pub labels: SeriesLabels,
    /// CRD mode: the object, for its status and events.
    pub wpa: Option<Arc<WatermarkPodAutoscaler>>,
}

/// What one autoscaler remembers between evaluations.
#[derive(Debug, Default)]
pub struct Memory {
    /// `None` until restored from the cluster.
    state: Option<State>,
    /// The leadership epoch the state was restored in; a new leadership restores again.
    epoch: u64,
    /// The state last persisted (rules-file mode).
    written: Option<State>,
    /// The WPA status last written or read (CRD mode).
    status: Option<WatermarkPodAutoscalerStatus>,
    status_written_at: Option<Instant>,
    last_reason: Option<String>,
    /// The target error last reported, so a stuck target logs once.
    failing: Option<String>,
    /// The resourceVersion a scale write was based on whose outcome is unknown (timed out,
    /// or the API server failed): it may have landed, or may yet.
    unconfirmed_write: Option<String>,
    /// What makes a change of the target's replica count this process did not confirm look
    /// like a scale that landed late.
    suspicion: crate::state::Suspicion,
}

/// What every evaluation shares.
pub struct Shared {
    pub(crate) client: kube::Client,
    pub(crate) targets: Targets,
    pub(crate) events: Option<EventPublisher>,
    pub(crate) autoscaler_metrics: Arc<AutoscalerMetrics>,
    pub(crate) daemon: DaemonMetrics,
    pub(crate) backend_metrics: Arc<BackendMetrics>,
    /// HTTP clients of the replica recommenders.
    pub(crate) recommenders: RecommenderClients,
    /// Reads resource metrics (cpu, memory) through the API server.
    pub(crate) resources: ResourceMetrics,
    pub(crate) clock: Clock,
    pub(crate) dry_run: bool,
    pub(crate) default_interval: Duration,
    /// Incremented on every gain of leadership.
    pub(crate) epoch: AtomicU64,
    leader: AtomicBool,
    /// Whether and how long a write may take now (see `crate::lease`).
    authority: Authority,
    stopping: AtomicBool,
}

impl Shared {
    pub(crate) fn is_leader(&self) -> bool {
        self.leader.load(Ordering::Acquire)
    }

    /// How long a write to the cluster started now may take; `None`: this daemon may not write
    /// (it follows, or it cannot prove its lease any more).
    pub(crate) fn write_budget(&self) -> Option<Duration> {
        if !self.is_leader() {
            return None;
        }
        self.authority.write_budget()
    }

    fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }
}

enum Command {
    Replace {
        source: SourceKind,
        desired: Vec<Desired>,
    },
    Backends(Arc<RulesFile>),
    /// A newer version of a running WPA whose spec did not change (its status did).
    Refresh {
        key: String,
        wpa: Arc<WatermarkPodAutoscaler>,
    },
}

struct Entry {
    desired: Arc<Desired>,
    interval: Duration,
    due: Instant,
    memory: Arc<tokio::sync::Mutex<Memory>>,
}

struct Scheduler {
    shared: Arc<Shared>,
    entries: HashMap<String, Entry>,
    backends: BTreeMap<String, (rules::Backend, Arc<MetricBackend>)>,
    permits: Arc<Semaphore>,
    epoch: Instant,
    cycles: JoinSet<()>,
}

impl Scheduler {
    fn apply(&mut self, command: Command) {
        match command {
            Command::Backends(rules) => self.set_backends(&rules),
            Command::Replace { source, desired } => self.replace(source, desired),
            Command::Refresh { key, wpa } => {
                if let Some(entry) = self.entries.get_mut(&key) {
                    let mut desired = (*entry.desired).clone();
                    desired.wpa = Some(wpa);
                    entry.desired = Arc::new(desired);
                }
            }
        }
    }

    /// Keeps the client (and its pacing and connection pool) of every backend whose settings
    /// did not change.
    fn set_backends(&mut self, rules: &RulesFile) {
        let mut next = BTreeMap::new();
        for (name, config) in &rules.backends {
            if let Some((old_config, client)) = self.backends.get(name) {
                if old_config == config {
                    next.insert(name.clone(), (old_config.clone(), Arc::clone(client)));
                    continue;
                }
            }
            match MetricBackend::new(name, config, Arc::clone(&self.shared.backend_metrics)) {
                Ok(client) => {
                    next.insert(name.clone(), (config.clone(), Arc::new(client)));
                }
                Err(err) => tracing::error!(backend = %name, error = %err, "cannot set up the backend"),
            }
        }
        self.backends = next;
    }

    fn replace(&mut self, source: SourceKind, desired: Vec<Desired>) {
        let prefix = format!("{}/", source.label());
        let mut wanted: HashMap<String, Desired> = desired.into_iter().map(|d| (d.key.clone(), d)).collect();
        let now = Instant::now();
        let mut stopped = Vec::new();
        for (key, entry) in self.entries.iter_mut().filter(|(k, _)| k.starts_with(&prefix)) {
            match wanted.remove(key) {
                None => stopped.push(key.clone()),
                Some(next) if next.autoscaler == entry.desired.autoscaler => {
                    // Unchanged: same state and schedule; the object may carry a newer status,
                    // or new labels (labels-as-tags), whose series start over under them.
                    self.shared.autoscaler_metrics.relabel(&entry.desired.labels, &next.labels);
                    entry.desired = Arc::new(next);
                }
                Some(next) => {
                    tracing::info!(autoscaler = %next.autoscaler.name, "autoscaler changed; restarting it");
                    self.shared.targets.watch(&next.autoscaler.target);
                    self.shared.targets.unwatch(&entry.desired.autoscaler.target);
                    // A flip of the rule's dry_run lands here: the `dry_run` label changes with
                    // it, and the series start over under the new label set.
                    self.shared.autoscaler_metrics.relabel(&entry.desired.labels, &next.labels);
                    let interval = next.autoscaler.interval(self.shared.default_interval);
                    entry.due =
                        schedule::first_due(self.epoch, now, key, interval, uses_datadog(&self.backends, &next));
                    entry.interval = interval;
                    entry.desired = Arc::new(next);
                    entry.memory = Arc::new(tokio::sync::Mutex::new(Memory::default()));
                }
            }
        }
        for key in stopped {
            if let Some(entry) = self.entries.remove(&key) {
                tracing::info!(autoscaler = %entry.desired.autoscaler.name, "autoscaler removed");
                self.shared.targets.unwatch(&entry.desired.autoscaler.target);
                self.shared.autoscaler_metrics.remove(&entry.desired.labels);
            }
        }
        for (key, next) in wanted {
            tracing::info!(autoscaler = %next.autoscaler.name, workload = %next.autoscaler.target.name, "autoscaler started");
            self.shared.targets.watch(&next.autoscaler.target);
            self.shared.autoscaler_metrics.admit(&next.labels);
            let interval = next.autoscaler.interval(self.shared.default_interval);
            let due = schedule::first_due(self.epoch, now, &key, interval, uses_datadog(&self.backends, &next));
            self.entries.insert(
                key,
                Entry {
                    desired: Arc::new(next),
                    interval,
                    due,
                    memory: Arc::new(tokio::sync::Mutex::new(Memory::default())),
                },
            );
        }
        let count = self.entries.keys().filter(|k| k.starts_with(&prefix)).count();
        self.shared.daemon.autoscalers.with_label_values(&[source.label(), "running"]).set(count as i64);
    }

    fn next_due(&self) -> Option<Instant> {
        self.entries.values().map(|e| e.due).min()
    }

    /// Starts one cycle with every autoscaler due now.
    fn dispatch_due(&mut self) {
        let now = Instant::now();
        let leader = self.shared.is_leader();
        let mut jobs = Vec::new();
        for entry in self.entries.values_mut().filter(|e| e.due <= now) {
            entry.due = schedule::next_due(entry.due, now, entry.interval);
            if !leader {
                continue;
            }
            match Arc::clone(&entry.memory).try_lock_owned() {
                Ok(memory) => jobs.push(Job { desired: Arc::clone(&entry.desired), memory }),
                Err(_) => {
                    self.shared.daemon.evaluations.with_label_values(&["skipped"]).inc();
                    tracing::warn!(
                        autoscaler = %entry.desired.autoscaler.name,
                        "still evaluating from the previous interval; skipping this one"
                    );
                }
            }
        }
        if jobs.is_empty() {
            return;
        }
        let backends: BTreeMap<String, Arc<MetricBackend>> =
            self.backends.iter().map(|(name, (_, client))| (name.clone(), Arc::clone(client))).collect();
        let shared = Arc::clone(&self.shared);
        let permits = Arc::clone(&self.permits);
        self.cycles.spawn(run_cycle(shared, backends, permits, jobs));
        // Reap finished cycles so the set does not grow.
        while self.cycles.try_join_next().is_some() {}
    }
}

/// Where a metric is read: a `[backend.NAME]`, or the API server's metrics API (a resource
/// metric), whatever a backend may be named.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Via {
    Backend(String),
    Resources,
}

impl Via {
    fn of(metric: &rules::MetricSource) -> Via {
        match metric.resource {
            Some(_) => Via::Resources,
            None => Via::Backend(metric.backend.clone()),
        }
    }
}

/// Whether any of the autoscaler's metrics goes to a Datadog backend (see `schedule`).
fn uses_datadog(backends: &BTreeMap<String, (rules::Backend, Arc<MetricBackend>)>, desired: &Desired) -> bool {
    desired
        .autoscaler
        .metrics
        .iter()
        .filter(|m| m.resource.is_none())
        .any(|m| matches!(backends.get(&m.backend), Some((rules::Backend::Datadog(_), _))))
}

struct Job {
    desired: Arc<Desired>,
    memory: OwnedMutexGuard<Memory>,
}

/// When a cycle's queries must be answered: before the next cycle of its most frequent
/// autoscaler, less a tenth of that interval (at most a second) for the decisions and writes.
fn cycle_deadline(started: Instant, intervals: impl Iterator<Item = Duration>) -> Instant {
    let interval = intervals.min().unwrap_or(Duration::ZERO);
    started + interval.saturating_sub((interval / 10).min(Duration::from_secs(1)))
}

/// Queries every backend the jobs use once, concurrently; each autoscaler is decided as soon as
/// all of its backends answered.
async fn run_cycle(
    shared: Arc<Shared>,
    backends: BTreeMap<String, Arc<MetricBackend>>,
    permits: Arc<Semaphore>,
    jobs: Vec<Job>,
) {
    let now = shared.clock.now();
    // Per source (a backend, or the metrics API): the (job, metric) pairs it answers, in order.
    let mut users: BTreeMap<Via, Vec<(usize, usize)>> = BTreeMap::new();
    let mut answers: Vec<Vec<Option<Observation>>> = Vec::with_capacity(jobs.len());
    let mut waiting: Vec<usize> = Vec::with_capacity(jobs.len());
    // Jobs whose readings come from a recommender (one request each, beside the backends).
    let mut recommended: Vec<usize> = Vec::new();
    for (j, job) in jobs.iter().enumerate() {
        let metrics = &job.desired.autoscaler.metrics;
        answers.push(vec![None; job.desired.autoscaler.rule.metrics().len()]);
        let mut sources_used: Vec<Via> = metrics.iter().map(Via::of).collect();
        sources_used.sort_unstable();
        sources_used.dedup();
        let recommender = usize::from(job.desired.autoscaler.recommender.is_some());
        if recommender > 0 {
            recommended.push(j);
        }
        waiting.push(sources_used.len() + recommender);
        for (i, metric) in metrics.iter().enumerate() {
            users.entry(Via::of(metric)).or_default().push((j, i));
        }
    }
    let deadline =
        cycle_deadline(Instant::now(), jobs.iter().map(|j| j.desired.autoscaler.interval(shared.default_interval)));
    let mut queries = JoinSet::new();
    for (via, pairs) in users {
        let shared = Arc::clone(&shared);
        match via {
            Via::Backend(name) => {
                let batch: Vec<MetricQuery> = pairs
                    .iter()
                    .map(|&(j, i)| {
                        let source = &jobs[j].desired.autoscaler.metrics[i];
                        MetricQuery { query: source.query.clone(), reducer: source.reducer }
                    })
                    .collect();
                let client = backends.get(&name).cloned();
                queries.spawn(async move {
                    let started = Instant::now();
                    let observations = match client {
                        Some(client) => client.evaluate(&batch, now, deadline).await,
                        None => batch
                            .iter()
                            .map(|_| {
                                Observation::unavailable(QueryError::Configuration(format!(
                                    "backend {name:?} is not set up"
                                )))
                            })
                            .collect(),
                    };
                    shared.daemon.cycle_seconds.with_label_values(&[&name]).observe(started.elapsed().as_secs_f64());
                    (pairs, observations)
                });
            }
            Via::Resources => {
                let batch: Vec<ResourceQuery> = pairs
                    .iter()
                    .filter_map(|&(j, i)| {
                        let autoscaler = &jobs[j].desired.autoscaler;
                        let source = autoscaler.metrics[i].resource.clone()?;
                        Some(ResourceQuery { namespace: autoscaler.target.namespace.clone(), source })
                    })
                    .collect();
                queries.spawn(async move {
                    let started = Instant::now();
                    let observations = shared.resources.evaluate(&batch, now, deadline).await;
                    shared
                        .daemon
                        .cycle_seconds
                        .with_label_values(&[crate::resource::BACKEND_LABEL])
                        .observe(started.elapsed().as_secs_f64());
                    (pairs, observations)
                });
            }
        }
    }
    for j in recommended {
        let desired = Arc::clone(&jobs[j].desired);
        let shared = Arc::clone(&shared);
        queries.spawn(async move {
            let observation = ask_recommender(&shared, &desired, deadline).await;
            (vec![(j, 0)], vec![observation])
        });
    }
    let mut jobs: Vec<Option<Job>> = jobs.into_iter().map(Some).collect();
    let mut decisions = JoinSet::new();
    while let Some(done) = queries.join_next().await {
        let Ok((pairs, observations)) = done else { continue };
        let mut touched = Vec::new();
        for ((j, i), observation) in pairs.into_iter().zip(observations) {
            answers[j][i] = Some(observation);
            if touched.last() != Some(&j) {
                touched.push(j);
            }
        }
        touched.dedup();
        for j in touched {
            waiting[j] = waiting[j].saturating_sub(1);
            if waiting[j] > 0 || shared.is_stopping() {
                continue;
            }
            let Some(job) = jobs[j].take() else { continue };
            let observations = std::mem::take(&mut answers[j])
                .into_iter()
                .map(|o| o.unwrap_or_else(|| Observation::unavailable(QueryError::Configuration("no answer".into()))))
                .collect();
            // The permit is taken before the task exists, so at most `max_concurrency`
            // evaluations (each with its kube request futures) are alive at once.
            let Ok(permit) = Arc::clone(&permits).acquire_owned().await else { return };
            if shared.is_stopping() {
                return;
            }
            let shared = Arc::clone(&shared);
            decisions.spawn(async move {
                let _permit = permit;
                let Job { desired, mut memory } = job;
                let started = Instant::now();
                let outcome = Box::pin(evaluate::evaluate(&shared, &desired, &mut memory, observations)).await;
                let source = if desired.wpa.is_some() { "crd" } else { "file" };
                shared.daemon.evaluation_seconds.with_label_values(&[source]).observe(started.elapsed().as_secs_f64());
                shared.daemon.evaluations.with_label_values(&[outcome.label()]).inc();
            });
        }
    }
    while decisions.join_next().await.is_some() {}
    if jobs.len() >= LARGE_CYCLE {
        // A large cycle's answers and decisions were garbage the moment it ended.
        memory::release_free();
    }
}

/// Asks an autoscaler's recommender, telling it the target's replicas as the cache has them
/// now. A target that cannot be read is left to the evaluation to report.
async fn ask_recommender(shared: &Shared, desired: &Desired, deadline: Instant) -> Observation {
    let autoscaler = &desired.autoscaler;
    let Some(recommender) = &autoscaler.recommender else {
        return Observation::unavailable(QueryError::Configuration("no recommender".into()));
    };
    let reading = match shared.targets.read(&autoscaler.target).await {
        Ok(reading) => reading,
        Err(err) => {
            return Observation::unavailable(QueryError::Configuration(format!(
                "the recommender was not asked: cannot read the target: {err}"
            )))
        }
    };
    let state = WorkloadState {
        desired: reading.spec_replicas,
        current: reading.status_replicas,
        ready: reading.ready_replicas,
        min_replicas: autoscaler.rule.min_replicas(),
        max_replicas: autoscaler.rule.max_replicas(),
    };
    let observation = shared.recommenders.ask(recommender, &autoscaler.target, state, deadline).await;
    if let Some(error) = &observation.detail.error {
        tracing::debug!(autoscaler = %autoscaler.name, url = %recommender.display_url(), %error, "no recommendation");
    }
    observation
}

/// Cycles of at least this many autoscalers hand their memory back when they end.
const LARGE_CYCLE: usize = 500;

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

    let client = crate::target::connect(settings.kubeconfig.as_deref(), settings.context.as_deref()).await?;
    let targets = Targets::new(client.clone());
    let events = EventPublisher::new(client.clone(), &settings.lease.identity, Duration::from_secs(300));

    let (shutdown_tx, shutdown) = watch::channel(false);
    let (bound, server) = crate::telemetry::serve(
        settings.listen,
        registry.clone(),
        Arc::clone(&autoscaler_metrics),
        Arc::clone(&readiness),
        shutdown.clone(),
    )
    .await
    .map_err(|error| RunError::Listen { address: settings.listen.to_string(), error })?;
    tracing::info!(listen = %bound, "serving /metrics, /healthz and /readyz");

    // Leadership.
    let (lease_stop_tx, lease_stop) = watch::channel(false);
    // Without a Lease this daemon always leads; the sender lives as long as the loop below.
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
        events: Some(events),
        autoscaler_metrics,
        daemon,
        resources: ResourceMetrics::new(client.clone(), Arc::clone(&backend_metrics)),
        backend_metrics,
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
    let (backends, file_autoscalers) = sources::split(rules, settings.dry_run);
    let (rules_tx, rules_rx) = watch::channel(Some(backends.clone()));
    let (reload_tx, reload_rx) = mpsc::channel::<()>(4);
    let mut source_tasks = JoinSet::new();
    let mut scheduler = Scheduler {
        shared: Arc::clone(&shared),
        entries: HashMap::new(),
        backends: BTreeMap::new(),
        permits: Arc::new(Semaphore::new(settings.max_concurrency)),
        epoch: Instant::now(),
        cycles: JoinSet::new(),
    };
    let max_permits = u32::try_from(settings.max_concurrency).unwrap_or(u32::MAX);
    // Applied before readiness is judged, so "caches synced" covers these targets.
    scheduler.apply(Command::Backends(backends));
    scheduler.apply(Command::Replace { source: SourceKind::File, desired: file_autoscalers });
    source_tasks.spawn(sources::watch_rules_file(sources::RulesWatch {
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
        source_tasks.spawn(sources::watch_wpas(sources::WpaWatch {
            client: client.clone(),
            namespaces: settings.namespaces.clone(),
            default_backend: settings.default_backend.clone(),
            rules: rules_rx,
            commands: commands_tx.clone(),
            shared: Arc::clone(&shared),
            synced: Arc::clone(&crd_synced),
            shutdown: shutdown.clone(),
        }));
    }

    // Readiness and systemd.
    {
        let readiness = Arc::clone(&readiness);
        let targets = targets.clone();
        let crd_synced = Arc::clone(&crd_synced);
        let watch_health = targets.watch_health();
        let mut shutdown = shutdown.clone();
        tokio::spawn(async move {
            let notifier = systemd::Notifier::from_env();
            let mut announced = false;
            let mut ticks: u64 = 0;
            loop {
                ticks += 1;
                if ticks.is_multiple_of(300) {
                    // Once a minute: scrapes and reloads leave freed pages behind.
                    memory::release_free();
                }
                // Not ready while a watch is failing: its cache may be stale (the API server is
                // down or restarting). Writes stay safe meanwhile: each carries the
                // resourceVersion it was decided on.
                let synced = crd_synced.load(Ordering::Acquire) && targets.settled() && !watch_health.failing();
                readiness.caches_synced.store(synced, Ordering::Release);
                if !announced && readiness.is_ready() {
                    notifier.ready();
                    announced = true;
                    tracing::info!("ready");
                    // The initial listings are done with: give their pages back.
                    memory::release_free();
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    _ = shutdown.changed() => return,
                }
            }
        });
    }
    if let Some(period) = systemd::Notifier::watchdog_interval() {
        let mut shutdown = shutdown.clone();
        tokio::spawn(async move {
            let notifier = systemd::Notifier::from_env();
            loop {
                notifier.watchdog();
                tokio::select! {
                    _ = tokio::time::sleep(period) => {}
                    _ = shutdown.changed() => return,
                }
            }
        });
    }

    let mut terminate = signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut interrupt = signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut hangup = signal(tokio::signal::unix::SignalKind::hangup())?;
    observe_role(&shared, &readiness, &role.borrow_and_update());

    loop {
        let sleep_until = scheduler.next_due().unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            Some(command) = commands.recv() => scheduler.apply(command),
            _ = tokio::time::sleep_until(sleep_until) => scheduler.dispatch_due(),
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
    let drained = tokio::time::timeout(Duration::from_secs(20), scheduler.permits.acquire_many(max_permits)).await;
    if drained.is_err() {
        tracing::warn!("evaluations still running after 20s; stopping anyway");
    }
    scheduler.cycles.abort_all();
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
