//! The running daemon: `Daemon::start` builds the parts and wires them together, `serve` runs
//! the loop until SIGTERM or SIGINT, and `stop` shuts down gracefully.
//!
//! One token says when things stop. The daemon's `lifetime` ends the Lease; its child,
//! `Shared::stopping`, ends everything else (no new decisions; the server, the sources and the
//! health loops) and is cancelled first, so that the Lease is given up only once the
//! evaluations in flight have drained.
//!
//! The loop owns the scheduler: it applies what the sources send, starts the cycles that fall
//! due, follows this daemon's role, and reports the WPAs that cannot run.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus::Registry;
use tokio::signal::unix::{Signal, SignalKind};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::allocator::Trim;
use super::claims::{self, ClaimBoard};
use super::report::RejectionReports;
use super::scheduler::{Command, Scheduler, TargetChanges};
use super::shared::{Clock, Shared};
use super::source::SourceKind;
use super::systemd::Notifier;
use super::wpa_index::{Rejection, Scope, WpaIndex};
use super::{cycle, health, rules_file, wpa, RunError};
use crate::adapters::backend::recommender::RecommenderClients;
use crate::adapters::backend::MetricBackend;
use crate::adapters::events::EventPublisher;
use crate::adapters::health::Readiness;
use crate::adapters::lease::{Authority, LeaderElector, Role};
use crate::adapters::listener::{self, ListenerTask};
use crate::adapters::resource::ResourceMetrics;
use crate::adapters::secret::RotatingSecret;
use crate::adapters::state_store::StateConfigMaps;
use crate::adapters::status::{self, Access, Board, StatusApi, TokenReviewer};
use crate::adapters::telemetry::{self, AutoscalerMetrics, BackendMetrics, DaemonMetrics, HttpClientMetrics};
use crate::adapters::workload::Workloads;
use crate::domain::claims::ClaimIndex;
use crate::domain::outcome::Ledger;
use crate::domain::rules::{self, RulesFile};
use crate::runtime::settings::{Settings, StatusSettings};

/// How long the evaluations in flight may take to finish once the daemon stops.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);
/// How long the Lease task may take to give the Lease up.
const LEASE_RELEASE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the server's task may take to end.
const SERVER_STOP_TIMEOUT: Duration = Duration::from_secs(1);
/// How long the loop sleeps when no autoscaler is due.
const IDLE_WAKE: Duration = Duration::from_secs(3600);

/// A started daemon: its parts, wired together, and what the loop holds.
pub struct Daemon {
    /// The daemon's lifetime: cancelled last, by `stop`, it ends the Lease; `shared.stopping` is
    /// its child. Cancelled too when dropped, so that a start that fails part way (or a daemon
    /// dropped without `stop`) stops what it started.
    lifetime: DropGuard,
    shared: Arc<Shared>,
    readiness: Arc<Readiness>,
    notifier: Notifier,
    scheduler: Scheduler,
    sources: Sources,
    leadership: Leadership,
    /// The listener's thread (`/metrics`, the probes, the status API and page).
    server: ListenerTask,
    signals: Signals,
    /// One per evaluation in flight: `max_concurrency` of them.
    permits: Arc<Semaphore>,
    max_concurrency: usize,
    cycles: JoinSet<()>,
    rejection_reports: RejectionReports,
    reports: JoinSet<()>,
}

impl Daemon {
    /// Loads the rules, connects to the cluster, starts serving, leading, the sources and the
    /// health loops. Should it fail part way, what it started stops.
    pub async fn start(settings: Settings) -> Result<Daemon, RunError> {
        crate::adapters::backend::ensure_crypto_provider();
        let notifier = Notifier::from_env();
        let lifetime = CancellationToken::new();
        let lifetime_guard = lifetime.clone().drop_guard();
        let telemetry = Telemetry::register(&settings)?;
        let http = HttpClientMetrics::new(&telemetry.registry)?;
        let recommenders = RecommenderClients::new(settings.cluster_name.clone(), http);
        let rules = rules::load_rules(&settings.rules)?;
        // A backend that cannot be set up (a credential's variable unset, its file unreadable)
        // fails the start, naming what is missing: a daemon that started anyway would be Ready
        // and never scale anything that reads from it.
        for (name, config) in &rules.backends {
            MetricBackend::new(name, config, Arc::new(BackendMetrics::detached()))?;
        }
        telemetry.readiness.rules_loaded.store(true, Ordering::Release);
        telemetry.daemon.last_reload_successful.set(1);

        let client =
            crate::adapters::workload::connect(settings.kubeconfig.as_deref(), settings.context.as_deref()).await?;
        // Cancelled first, by `stop`: everything but the Lease ends with it.
        let stopping = lifetime.child_token();
        let server = telemetry.serve(&settings, &client, stopping.clone()).await?;
        let (mut leadership, authority) = Leadership::start(&settings, &client, lifetime.clone());
        let shared = share(&settings, client, &telemetry, recommenders, authority, stopping);
        let mut scheduler = Scheduler::new(
            settings.default_interval,
            Arc::clone(&telemetry.backends),
            Arc::clone(&telemetry.ledger),
            telemetry.daemon.clone(),
        );
        let sources = Sources::start(&settings, rules, &shared, &mut scheduler);
        start_health(&shared, &telemetry.readiness, Arc::clone(&sources.crd_synced));
        let signals = Signals::register()?;
        observe_role(&shared, &telemetry.readiness, &leadership.role.borrow_and_update());
        Ok(Daemon {
            lifetime: lifetime_guard,
            shared,
            readiness: telemetry.readiness,
            notifier,
            scheduler,
            sources,
            leadership,
            server,
            signals,
            permits: Arc::new(Semaphore::new(settings.max_concurrency)),
            max_concurrency: settings.max_concurrency,
            cycles: JoinSet::new(),
            rejection_reports: RejectionReports::default(),
            reports: JoinSet::new(),
        })
    }

    /// The loop, until SIGTERM or SIGINT.
    pub async fn serve(&mut self) -> Result<(), RunError> {
        loop {
            let sleep_until = self.scheduler.next_due().unwrap_or_else(|| Instant::now() + IDLE_WAKE);
            tokio::select! {
                Some(command) = self.sources.commands.recv() => self.apply(command),
                Some(rejected) = self.sources.rejected.recv() => self.report_rejected(rejected),
                () = tokio::time::sleep_until(sleep_until) => self.start_due(),
                changed = self.leadership.role.changed() => {
                    if changed.is_ok() {
                        observe_role(&self.shared, &self.readiness, &self.leadership.role.borrow_and_update());
                    }
                }
                _ = self.signals.hangup.recv() => {
                    tracing::info!("SIGHUP: reloading the rules");
                    self.sources.reload.try_send(()).ok();
                }
                _ = self.signals.terminate.recv() => return Ok(()),
                _ = self.signals.interrupt.recv() => return Ok(()),
            }
        }
    }

    /// Graceful shutdown: no new decisions, in-flight writes finish, then the Lease goes.
    pub async fn stop(mut self) {
        tracing::info!("stopping: finishing the evaluations in flight");
        self.notifier.stopping();
        self.shared.stopping.cancel();
        let max_permits = u32::try_from(self.max_concurrency).unwrap_or(u32::MAX);
        let drained = tokio::time::timeout(DRAIN_TIMEOUT, self.permits.acquire_many(max_permits)).await;
        if drained.is_err() {
            tracing::warn!("evaluations still running after 20s; stopping anyway");
        }
        self.cycles.abort_all();
        self.sources.tasks.abort_all();
        self.reports.abort_all();
        self.shared.leader.store(false, Ordering::Release);
        self.lifetime.disarm().cancel();
        if let Some(task) = self.leadership.lease_task.take() {
            let _ = tokio::time::timeout(LEASE_RELEASE_TIMEOUT, task).await;
        }
        let _ = tokio::time::timeout(SERVER_STOP_TIMEOUT, self.server.stopped()).await;
        tracing::info!("stopped");
    }

    fn apply(&mut self, command: Command) {
        let replaces = matches!(command, Command::Replace { .. });
        follow(&self.shared.targets, self.scheduler.apply(command));
        if replaces {
            // The recommenders nothing uses any more go, with their clients and series.
            self.shared.recommenders.retain(self.scheduler.recommenders());
        }
    }

    fn start_due(&mut self) {
        let due = self.scheduler.take_due(Instant::now(), self.shared.is_leader());
        if !due.jobs.is_empty() {
            self.cycles.spawn(cycle::run(Arc::clone(&self.shared), Arc::clone(&self.permits), due));
        }
        // Reap finished cycles so the set does not grow.
        while self.cycles.try_join_next().is_some() {}
    }

    /// Counts the WPAs that cannot run and reports them (statuses and events, written by the
    /// leader only) in a task of its own, so the loop never waits on the API.
    fn report_rejected(&mut self, rejected: Vec<Rejection>) {
        let invalid = i64::try_from(rejected.len()).unwrap_or(i64::MAX);
        self.shared.daemon.autoscalers.with_label_values(&["crd", "invalid"]).set(invalid);
        self.reports.spawn(self.rejection_reports.report(Arc::clone(&self.shared), rejected));
        while self.reports.try_join_next().is_some() {}
    }
}

/// The daemon's metrics and readiness, on the registry `/metrics` serves.
struct Telemetry {
    registry: Registry,
    backends: Arc<BackendMetrics>,
    autoscalers: Arc<AutoscalerMetrics>,
    /// Every running autoscaler's last outcome and history: the series and the board read it.
    ledger: Arc<Ledger>,
    /// What the status API and page show.
    board: Arc<Board>,
    daemon: DaemonMetrics,
    readiness: Arc<Readiness>,
}

impl Telemetry {
    fn register(settings: &Settings) -> Result<Telemetry, RunError> {
        let registry = Registry::new();
        let backends = Arc::new(BackendMetrics::new(&registry)?);
        // Without the status service, nobody reads a history: none is kept.
        let history = if settings.status.enabled { settings.status.history } else { Duration::ZERO };
        let ledger = Arc::new(Ledger::new(history));
        let autoscalers = Arc::new(AutoscalerMetrics::new(Arc::clone(&ledger), settings.labels_as_tags.clone()));
        let daemon = DaemonMetrics::new(&registry)?;
        let board = Arc::new(Board::new(Arc::clone(&ledger)));
        Ok(Telemetry { registry, backends, autoscalers, ledger, board, daemon, readiness: Arc::default() })
    }

    /// The status API and page, unless the settings turn them off.
    fn status(&self, settings: &StatusSettings, client: &kube::Client) -> Result<Option<Arc<StatusApi>>, RunError> {
        if !settings.enabled {
            return Ok(None);
        }
        let token = settings.token.as_ref().map(RotatingSecret::load).transpose().map_err(RunError::StatusToken)?;
        let reviewer =
            settings.token_review.then(|| TokenReviewer::new(client.clone(), settings.token_audiences.clone()));
        let access = Access::new(token, reviewer, settings.open_on_loopback, settings.allowed_hosts.clone());
        let api = StatusApi::new(Arc::clone(&self.board), self.backends.facts(), access)
            .map_err(|error| RunError::Thread { what: "the status service's worker", error })?;
        Ok(Some(Arc::new(api)))
    }

    /// Binds the listener (so a taken port fails the start) and serves until `stop`.
    async fn serve(
        &self,
        settings: &Settings,
        client: &kube::Client,
        stop: CancellationToken,
    ) -> Result<ListenerTask, RunError> {
        let status = self.status(&settings.status, client)?;
        let serving = if status.is_some() {
            "/metrics, /healthz, /readyz and the status API and page (/api/v1, /ui)"
        } else {
            "/metrics, /healthz and /readyz"
        };
        // Each part hands the listener its own paths.
        let mut routes = telemetry::routes(self.registry.clone(), Arc::clone(&self.autoscalers))
            .merge(crate::adapters::health::routes(Arc::clone(&self.readiness)));
        if let Some(api) = &status {
            routes = routes.merge(status::routes(api));
        }
        let (bound, server) = listener::serve(settings.listen, settings.listen_limits, routes, stop)
            .await
            .map_err(|error| RunError::Listen { address: settings.listen.to_string(), error })?;
        tracing::info!(listen = %bound, "serving {serving}");
        Ok(server)
    }
}

/// What every evaluation shares.
fn share(
    settings: &Settings,
    client: kube::Client,
    telemetry: &Telemetry,
    recommenders: RecommenderClients,
    authority: Authority,
    stopping: CancellationToken,
) -> Arc<Shared> {
    let events = EventPublisher::new(client.clone(), &settings.lease.identity, Duration::from_secs(300));
    let own = claims::OwnWpas::of(settings.crd, settings.wpa_selector.as_ref());
    let claims = ClaimIndex::new(&claims::kinds(&own), &claim_scopes(settings));
    Arc::new(Shared {
        targets: Workloads::new(client.clone()),
        claims: Arc::new(ClaimBoard::new(claims)),
        states: StateConfigMaps::new(client.clone(), &settings.lease.namespace),
        events: Some(events),
        ledger: Arc::clone(&telemetry.ledger),
        board: Arc::clone(&telemetry.board),
        daemon: telemetry.daemon.clone(),
        resources: ResourceMetrics::new(client.clone(), Arc::clone(&telemetry.backends)),
        recommenders,
        clock: Clock::start(),
        dry_run: settings.dry_run,
        default_interval: settings.default_interval,
        epoch: AtomicU64::new(0),
        leader: AtomicBool::new(false),
        authority,
        stopping,
        trim: Trim::default(),
        history_reads: Arc::new(Semaphore::new(super::shared::HISTORY_READS)),
        client,
    })
}

/// This daemon's role, and the task that keeps its Lease.
struct Leadership {
    role: watch::Receiver<Role>,
    /// Without a Lease this daemon always leads; the sender lives as long as the daemon.
    _always_leader: Option<watch::Sender<Role>>,
    /// Renews the Lease until the daemon's lifetime ends, then gives it up.
    lease_task: Option<JoinHandle<()>>,
}

impl Leadership {
    fn start(settings: &Settings, client: &kube::Client, lifetime: CancellationToken) -> (Leadership, Authority) {
        if !settings.lease.enabled {
            let (always_leader, role) = watch::channel(Role::Leader);
            let leadership = Leadership { role, _always_leader: Some(always_leader), lease_task: None };
            return (leadership, Authority::unleased());
        }
        let elector = LeaderElector::new(client.clone(), settings.lease.clone());
        let role = elector.subscribe();
        let authority = elector.authority();
        let lease_task = tokio::spawn(elector.run(lifetime));
        (Leadership { role, _always_leader: None, lease_task: Some(lease_task) }, authority)
    }
}

/// The sources (the rules file, and the WPAs in CRD mode): their tasks, and what they send the
/// loop.
struct Sources {
    commands: mpsc::Receiver<Command>,
    rejected: mpsc::Receiver<Vec<Rejection>>,
    /// Asks the rules file's watcher to reload (SIGHUP).
    reload: mpsc::Sender<()>,
    tasks: JoinSet<()>,
    /// Set once every WPA scope has been listed; set from the start without CRD mode.
    crd_synced: Arc<AtomicBool>,
}

impl Sources {
    /// Runs the rules file's autoscalers at once, then starts the sources' watchers.
    fn start(settings: &Settings, rules: RulesFile, shared: &Arc<Shared>, scheduler: &mut Scheduler) -> Sources {
        let (commands_tx, commands) = mpsc::channel::<Command>(16);
        let (rejected_tx, rejected) = mpsc::channel::<Vec<Rejection>>(4);
        let (backends, file_autoscalers) = rules_file::split(rules, settings.dry_run);
        let (rules_tx, rules_rx) = watch::channel(Arc::clone(&backends));
        let (reload, reload_rx) = mpsc::channel::<()>(4);
        // Applied before readiness is judged, so "caches synced" covers these targets.
        scheduler.apply(Command::Backends(Arc::clone(&backends)));
        let desired = file_autoscalers;
        follow(&shared.targets, scheduler.apply(Command::Replace { source: SourceKind::RulesFile, desired }));
        shared.recommenders.retain(scheduler.recommenders());
        let mut tasks = JoinSet::new();
        tasks.spawn(rules_file::watch_rules_file(rules_file::RulesWatch {
            path: settings.rules.clone(),
            poll: settings.reload_poll,
            commands: commands_tx.clone(),
            rules: rules_tx,
            reload: reload_rx,
            shared: Arc::clone(shared),
            notifier: Notifier::from_env(),
            stopping: shared.stopping.clone(),
        }));
        tasks.spawn(claims::run(claims::ClaimWatch {
            client: shared.client.clone(),
            scopes: claim_scopes(settings),
            own_wpas: claims::OwnWpas::of(settings.crd, settings.wpa_selector.as_ref()),
            board: Arc::clone(&shared.claims),
            stopping: shared.stopping.clone(),
        }));
        let crd_synced = Arc::new(AtomicBool::new(!settings.crd));
        if settings.crd {
            let (scopes, index) = wpa_index(settings, &backends);
            tasks.spawn(wpa::run(wpa::WpaWatch {
                client: shared.client.clone(),
                scopes,
                index,
                selector: settings.wpa_selector.clone(),
                rules: rules_rx,
                commands: commands_tx,
                rejected: rejected_tx,
                shared: Arc::clone(shared),
                synced: Arc::clone(&crd_synced),
                stopping: shared.stopping.clone(),
            }));
        }
        Sources { commands, rejected, reload, tasks, crd_synced }
    }
}

/// Where the other controllers' objects are watched: the listed namespaces, or all of them.
/// A target elsewhere is never known to be free, and is not written (`domain::claims`).
fn claim_scopes(settings: &Settings) -> Vec<crate::domain::claims::Scope> {
    if settings.namespaces.is_empty() {
        vec![None]
    } else {
        settings.namespaces.iter().cloned().map(Some).collect()
    }
}

/// The scopes CRD mode watches (the listed namespaces, or all of them) and the WPA index over
/// them.
fn wpa_index(settings: &Settings, backends: &RulesFile) -> (Vec<Scope>, WpaIndex) {
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
        backends,
        &settings.default_backend,
        settings.recommender_policy.clone(),
        settings.labels_as_tags.clone(),
        settings.dry_run,
    );
    (scopes, index)
}

/// Starts the health loops: readiness (and systemd's READY=1), systemd's watchdog, and the
/// allocator trim. They end with `shared.stopping`.
fn start_health(shared: &Shared, readiness: &Arc<Readiness>, crd_synced: Arc<AtomicBool>) {
    let watch_health = shared.targets.watch_health();
    let caches_synced = {
        let targets = shared.targets.clone();
        // Not ready while a watch is failing: its cache may be stale (the API server is down
        // or restarting). Writes stay safe meanwhile: each carries the resourceVersion it was
        // decided on.
        move || crd_synced.load(Ordering::Acquire) && targets.settled() && !watch_health.failing()
    };
    let states = shared.states.clone();
    tokio::spawn(health::follow_readiness(
        Arc::clone(readiness),
        caches_synced,
        move || states.problem(),
        Notifier::from_env(),
        shared.trim.clone(),
        shared.stopping.clone(),
    ));
    if let Some(period) = Notifier::watchdog_interval() {
        tokio::spawn(health::ping_watchdog(Notifier::from_env(), period, shared.stopping.clone()));
    }
    tokio::spawn(health::trim_allocator(shared.trim.clone(), shared.stopping.clone()));
    tokio::spawn(health::probe_state_store(shared.states.clone(), shared.stopping.clone()));
}

/// The signals the loop answers: SIGTERM and SIGINT stop the daemon, SIGHUP reloads the rules.
struct Signals {
    terminate: Signal,
    interrupt: Signal,
    hangup: Signal,
}

impl Signals {
    fn register() -> Result<Signals, RunError> {
        let listen = |kind| tokio::signal::unix::signal(kind).map_err(RunError::Signal);
        Ok(Signals {
            terminate: listen(SignalKind::terminate())?,
            interrupt: listen(SignalKind::interrupt())?,
            hangup: listen(SignalKind::hangup())?,
        })
    }
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
    shared.board.set_leadership(match role {
        Role::Unknown => status::Leadership::default(),
        Role::Leader => status::Leadership { leader: Some(true), leader_identity: None },
        Role::Follower { holder } => status::Leadership { leader: Some(false), leader_identity: holder.clone() },
    });
    readiness.leader_known.store(*role != Role::Unknown, Ordering::Release);
}
