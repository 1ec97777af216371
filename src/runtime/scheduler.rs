//! Which autoscalers run, and when each falls due (see `schedule` for the timing rules).
//!
//! The sources send the complete set of autoscalers they want; the scheduler starts, stops
//! and replaces by key, and one whose definition is unchanged keeps its state and its
//! schedule. It does no I/O: it hands out the jobs that are due and says which targets to
//! start and stop following, and the caller acts on both.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Mutex, OwnedMutexGuard};
use tokio::time::Instant;

use super::fanout;
use super::memory::Memory;
use super::schedule;
use super::source::{AutoscalerKey, Desired, Source, SourceKind};
use crate::adapters::backend::MetricBackend;
use crate::adapters::telemetry::{BackendMetrics, DaemonMetrics};
use crate::domain::crd::WatermarkPodAutoscaler;
use crate::domain::outcome::Ledger;
use crate::domain::rules::{self, Recommender, RulesFile, TargetRef};

/// What the sources tell the scheduler.
pub enum Command {
    /// Everything this source wants running now.
    Replace { source: SourceKind, desired: Vec<Desired> },
    /// The rules file's backends.
    Backends(Arc<RulesFile>),
    /// A newer version of a running WPA whose spec did not change (its status did).
    Refresh { key: AutoscalerKey, wpa: Arc<WatermarkPodAutoscaler> },
}

/// The targets whose caches a change of the running set needs, and the ones it no longer
/// needs. Counted: a target appears once per autoscaler that starts or stops using it.
#[derive(Debug, Default, PartialEq)]
pub struct TargetChanges {
    pub follow: Vec<TargetRef>,
    pub unfollow: Vec<TargetRef>,
}

/// An evaluation to run now, holding its autoscaler's memory for as long as it runs.
pub struct Job {
    pub desired: Arc<Desired>,
    pub memory: OwnedMutexGuard<Memory>,
}

/// The jobs due at one instant, and the backends they query.
pub struct Due {
    pub jobs: Vec<Job>,
    pub backends: BTreeMap<String, Arc<MetricBackend>>,
}

struct Entry {
    desired: Arc<Desired>,
    interval: Duration,
    due: Instant,
    memory: Arc<Mutex<Memory>>,
}

pub struct Scheduler {
    entries: HashMap<AutoscalerKey, Entry>,
    backends: BTreeMap<String, (rules::Backend, Arc<MetricBackend>)>,
    /// The daemon's start: every phase counts from it.
    epoch: Instant,
    default_interval: Duration,
    backend_metrics: Arc<BackendMetrics>,
    /// Who runs, for the series and the status board: an autoscaler is in it while it runs.
    ledger: Arc<Ledger>,
    daemon: DaemonMetrics,
}

impl Scheduler {
    pub fn new(
        default_interval: Duration,
        backend_metrics: Arc<BackendMetrics>,
        ledger: Arc<Ledger>,
        daemon: DaemonMetrics,
    ) -> Scheduler {
        Scheduler {
            entries: HashMap::new(),
            backends: BTreeMap::new(),
            epoch: Instant::now(),
            default_interval,
            backend_metrics,
            ledger,
            daemon,
        }
    }

    pub fn apply(&mut self, command: Command) -> TargetChanges {
        match command {
            Command::Backends(rules) => {
                self.set_backends(&rules);
                TargetChanges::default()
            }
            Command::Replace { source, desired } => self.replace(source, desired),
            Command::Refresh { key, wpa } => {
                if let Some(entry) = self.entries.get_mut(&key) {
                    let mut desired = (*entry.desired).clone();
                    desired.source = Source::Wpa(wpa);
                    entry.desired = Arc::new(desired);
                }
                TargetChanges::default()
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
            match MetricBackend::new(name, config, Arc::clone(&self.backend_metrics)) {
                Ok(client) => {
                    next.insert(name.clone(), (config.clone(), Arc::new(client)));
                }
                // The reload checked it could be built; should that change in between (a secret
                // file removed), the working client of the previous settings carries on.
                Err(err) => match self.backends.get(name) {
                    Some((old_config, client)) => {
                        tracing::error!(backend = %name, error = %err, "cannot set up the backend's new settings: keeping the previous ones");
                        next.insert(name.clone(), (old_config.clone(), Arc::clone(client)));
                    }
                    None => tracing::error!(backend = %name, error = %err, "cannot set up the backend"),
                },
            }
        }
        self.backends = next;
    }

    fn replace(&mut self, source: SourceKind, desired: Vec<Desired>) -> TargetChanges {
        let mut changes = TargetChanges::default();
        let mut wanted: HashMap<AutoscalerKey, Desired> = desired.into_iter().map(|d| (d.key.clone(), d)).collect();
        let now = Instant::now();
        let mut stopped = Vec::new();
        for (key, entry) in self.entries.iter_mut().filter(|(k, _)| k.source() == source) {
            match wanted.remove(key) {
                None => stopped.push(key.clone()),
                Some(next) if next.autoscaler == entry.desired.autoscaler => {
                    // Unchanged: same state and schedule; the object may carry a newer status,
                    // or new labels (labels-as-tags), whose series start over under them, or
                    // new shadows.
                    if next.labels != entry.desired.labels || next.shadows != entry.desired.shadows {
                        fanout::admit(&self.ledger, &next, self.default_interval);
                    }
                    entry.desired = Arc::new(next);
                }
                Some(next) => {
                    tracing::info!(autoscaler = %next.autoscaler.name, "autoscaler changed; restarting it");
                    // Follow the new target before leaving the old one, so a cache both use
                    // is kept.
                    changes.follow.push(next.autoscaler.target.clone());
                    changes.unfollow.push(entry.desired.autoscaler.target.clone());
                    // A flip of the rule's dry_run lands here: the `dry_run` label changes with
                    // it, and the series start over under the new label set.
                    fanout::admit(&self.ledger, &next, self.default_interval);
                    let interval = next.autoscaler.interval(self.default_interval);
                    entry.due = first_due(self.epoch, now, key, interval, uses_datadog(&self.backends, &next));
                    entry.interval = interval;
                    entry.memory = Arc::new(Mutex::new(Memory::for_source(&next.source)));
                    entry.desired = Arc::new(next);
                }
            }
        }
        for key in stopped {
            if let Some(entry) = self.entries.remove(&key) {
                tracing::info!(autoscaler = %entry.desired.autoscaler.name, "autoscaler removed");
                changes.unfollow.push(entry.desired.autoscaler.target.clone());
                fanout::remove(&self.ledger, &entry.desired);
            }
        }
        for (key, next) in wanted {
            tracing::info!(autoscaler = %next.autoscaler.name, workload = %next.autoscaler.target.name, "autoscaler started");
            changes.follow.push(next.autoscaler.target.clone());
            fanout::admit(&self.ledger, &next, self.default_interval);
            let interval = next.autoscaler.interval(self.default_interval);
            let due = first_due(self.epoch, now, &key, interval, uses_datadog(&self.backends, &next));
            let memory = Arc::new(Mutex::new(Memory::for_source(&next.source)));
            self.entries.insert(key, Entry { desired: Arc::new(next), interval, due, memory });
        }
        let count = self.entries.keys().filter(|k| k.source() == source).count();
        self.daemon.autoscalers.with_label_values(&[source.label(), "running"]).set(count as i64);
        changes
    }

    /// The recommenders of the running autoscalers and their shadow rules.
    pub fn recommenders(&self) -> impl Iterator<Item = &Recommender> {
        self.entries.values().flat_map(|entry| entry.desired.rules()).filter_map(|a| a.recommender.as_deref())
    }

    /// When the next autoscaler falls due; `None` when none runs.
    pub fn next_due(&self) -> Option<Instant> {
        self.entries.values().map(|e| e.due).min()
    }

    /// The autoscalers due at `now`, each moved on to its next turn. A follower only moves
    /// them on (the leader evaluates). One still evaluating from its previous turn skips this
    /// one, so a slow autoscaler never runs twice at once nor holds back the others.
    pub fn take_due(&mut self, now: Instant, leader: bool) -> Due {
        let mut jobs = Vec::new();
        if let Some(earliest) = self.entries.values().map(|e| e.due).filter(|due| *due <= now).min() {
            self.daemon.loop_lateness_seconds.observe(now.saturating_duration_since(earliest).as_secs_f64());
        }
        for entry in self.entries.values_mut().filter(|e| e.due <= now) {
            entry.due = schedule::next_due(entry.due, now, entry.interval);
            if !leader {
                continue;
            }
            match Arc::clone(&entry.memory).try_lock_owned() {
                Ok(memory) => jobs.push(Job { desired: Arc::clone(&entry.desired), memory }),
                Err(_) => {
                    self.daemon.evaluations.with_label_values(&["skipped"]).inc();
                    tracing::warn!(
                        autoscaler = %entry.desired.autoscaler.name,
                        "still evaluating from the previous interval; skipping this one"
                    );
                }
            }
        }
        let backends = if jobs.is_empty() {
            BTreeMap::new()
        } else {
            self.backends.iter().map(|(name, (_, client))| (name.clone(), Arc::clone(client))).collect()
        };
        Due { jobs, backends }
    }
}

fn first_due(epoch: Instant, now: Instant, key: &AutoscalerKey, interval: Duration, aligned: bool) -> Instant {
    schedule::first_due(epoch, now, &key.to_string(), interval, aligned)
}

/// Whether any of the autoscaler's metrics goes to a Datadog backend (see `schedule`).
fn uses_datadog(backends: &BTreeMap<String, (rules::Backend, Arc<MetricBackend>)>, desired: &Desired) -> bool {
    desired
        .autoscaler
        .metrics
        .iter()
        .filter(|m| m.resource.is_none())
        .any(|m| backends.get(&m.backend).is_some_and(|(config, _)| config.paced_by_request_budget()))
}

#[cfg(test)]
mod tests {
    use prometheus::Registry;

    use super::*;

    const RULES: &str = r#"
[backend.prom]
type = "prometheus"
url = "http://127.0.0.1:1"

[backend.dd]
type = "datadog"
url = "http://127.0.0.1:1"
# Any variables that are set: the keys are only read, never sent, here.
api_key_env = "PATH"
app_key_env = "HOME"
"#;

    fn autoscaler(name: &str, backend: &str, high: u32, interval: &str) -> String {
        format!(
            "\n[[autoscaler]]\nname = \"{name}\"\ntarget = {{ kind = \"Deployment\", namespace = \"shop\", name = \"{name}\" }}\n\
             min_replicas = 1\nmax_replicas = 10\ninterval = \"{interval}\"\n\
             [[autoscaler.metric]]\nbackend = \"{backend}\"\nquery = \"q\"\nhigh_watermark = {high}\nlow_watermark = 1\n"
        )
    }

    fn scheduler(text: &str) -> (Scheduler, Vec<Desired>, DaemonMetrics) {
        let rules = crate::domain::rules::parse_rules(text, "rules.toml").expect("rules");
        let registry = Registry::new();
        let daemon = DaemonMetrics::new(&registry).expect("metrics");
        let mut scheduler = Scheduler::new(
            Duration::from_secs(15),
            Arc::new(BackendMetrics::new(&registry).expect("metrics")),
            Arc::new(Ledger::new(Duration::from_secs(3600))),
            daemon.clone(),
        );
        let desired = rules.autoscalers.into_iter().map(|a| Desired::from_rules_file(a, false)).collect();
        scheduler.apply(Command::Backends(Arc::new(RulesFile {
            backends: rules.backends,
            autoscalers: Vec::new(),
            scaled: Vec::new(),
        })));
        (scheduler, desired, daemon)
    }

    fn names(due: &Due) -> Vec<String> {
        let mut names: Vec<String> = due.jobs.iter().map(|j| j.desired.autoscaler.name.to_string()).collect();
        names.sort();
        names
    }

    #[tokio::test(start_paused = true)]
    async fn each_autoscaler_runs_once_per_interval_at_its_phase() {
        let text = format!("{RULES}{}{}", autoscaler("a", "prom", 10, "10s"), autoscaler("b", "prom", 10, "4s"));
        let (mut scheduler, desired, _) = scheduler(&text);
        let changes = scheduler.apply(Command::Replace { source: SourceKind::RulesFile, desired });
        assert_eq!(changes.follow.len(), 2);
        let start = Instant::now();
        let mut runs: BTreeMap<String, Vec<Duration>> = BTreeMap::new();
        loop {
            let due = scheduler.next_due().expect("something runs");
            if due >= start + Duration::from_secs(40) {
                break;
            }
            tokio::time::sleep_until(due).await;
            let taken = scheduler.take_due(Instant::now(), true);
            for job in &taken.jobs {
                runs.entry(job.desired.autoscaler.name.to_string()).or_default().push(Instant::now() - start);
            }
        }
        let gaps = |times: &[Duration]| times.windows(2).map(|w| w[1] - w[0]).collect::<Vec<_>>();
        assert!(gaps(&runs["a"]).iter().all(|g| *g == Duration::from_secs(10)), "{runs:?}");
        assert!(gaps(&runs["b"]).iter().all(|g| *g == Duration::from_secs(4)), "{runs:?}");
        assert_eq!(runs["a"].len(), 4);
        assert_eq!(runs["b"].len(), 10);
        // Phases are whole seconds within the interval, from the daemon's start.
        assert!(runs["a"][0] < Duration::from_secs(10) && runs["a"][0].subsec_nanos() == 0, "{runs:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn datadog_autoscalers_fall_due_together() {
        let text: String = (0..20).map(|i| autoscaler(&format!("dd-{i}"), "dd", 10, "15s")).collect();
        let (mut scheduler, desired, _) = scheduler(&format!("{RULES}{text}"));
        scheduler.apply(Command::Replace { source: SourceKind::RulesFile, desired });
        let due = scheduler.next_due().expect("due");
        assert_eq!(due, scheduler.epoch, "no phase: they run at the epoch");
        assert_eq!(scheduler.take_due(due, true).jobs.len(), 20);
    }

    #[tokio::test(start_paused = true)]
    async fn one_still_running_skips_its_turn_and_the_others_run() {
        let text = format!("{RULES}{}{}", autoscaler("a", "dd", 10, "5s"), autoscaler("b", "dd", 10, "5s"));
        let (mut scheduler, desired, daemon) = scheduler(&text);
        scheduler.apply(Command::Replace { source: SourceKind::RulesFile, desired });
        let first = scheduler.take_due(Instant::now(), true);
        assert_eq!(names(&first), ["a", "b"]);
        // `a` is still evaluating (its memory is held) when it falls due again.
        let held: Vec<Job> = first.jobs.into_iter().filter(|j| &*j.desired.autoscaler.name == "a").collect();
        tokio::time::advance(Duration::from_secs(5)).await;
        let second = scheduler.take_due(Instant::now(), true);
        assert_eq!(names(&second), ["b"]);
        assert_eq!(daemon.evaluations.with_label_values(&["skipped"]).get(), 1);
        drop(held);
        drop(second);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(names(&scheduler.take_due(Instant::now(), true)), ["a", "b"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_follower_moves_on_without_evaluating() {
        let text = format!("{RULES}{}", autoscaler("a", "dd", 10, "5s"));
        let (mut scheduler, desired, _) = scheduler(&text);
        scheduler.apply(Command::Replace { source: SourceKind::RulesFile, desired });
        let now = Instant::now();
        assert!(scheduler.take_due(now, false).jobs.is_empty());
        assert_eq!(scheduler.next_due(), Some(now + Duration::from_secs(5)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_reload_keeps_unchanged_autoscalers_and_restarts_changed_ones() {
        let text = format!("{RULES}{}{}", autoscaler("a", "dd", 10, "5s"), autoscaler("b", "dd", 10, "5s"));
        let (mut scheduler, desired, daemon) = scheduler(&text);
        scheduler.apply(Command::Replace { source: SourceKind::RulesFile, desired });
        let memory_of = |s: &Scheduler, name: &str| Arc::clone(&s.entries[&AutoscalerKey::rules_file(name)].memory);
        let (a_before, b_before) = (memory_of(&scheduler, "a"), memory_of(&scheduler, "b"));
        tokio::time::advance(Duration::from_secs(2)).await;

        // `a` unchanged, `b` with a new watermark, `c` new; nothing from the file is removed.
        let text = format!(
            "{RULES}{}{}{}",
            autoscaler("a", "dd", 10, "5s"),
            autoscaler("b", "dd", 20, "5s"),
            autoscaler("c", "prom", 10, "5s")
        );
        let (_, desired, _) = self::scheduler(&text);
        let changes = scheduler.apply(Command::Replace { source: SourceKind::RulesFile, desired });
        let names = |targets: &[TargetRef]| targets.iter().map(|t| t.name.to_string()).collect::<Vec<_>>();
        let mut followed = names(&changes.follow);
        followed.sort();
        assert_eq!(followed, ["b", "c"]);
        assert_eq!(names(&changes.unfollow), ["b"]);
        assert!(Arc::ptr_eq(&a_before, &memory_of(&scheduler, "a")), "unchanged: same memory");
        assert!(!Arc::ptr_eq(&b_before, &memory_of(&scheduler, "b")), "changed: starts over");
        assert_eq!(daemon.autoscalers.with_label_values(&["file", "running"]).get(), 3);

        // Another source's replacement leaves these alone.
        let changes = scheduler.apply(Command::Replace { source: SourceKind::Wpa, desired: Vec::new() });
        assert_eq!(changes, TargetChanges::default());
        assert_eq!(scheduler.entries.len(), 3);

        // Removing stops following.
        let changes = scheduler.apply(Command::Replace { source: SourceKind::RulesFile, desired: Vec::new() });
        assert_eq!(changes.unfollow.len(), 3);
        assert!(scheduler.next_due().is_none());
    }
}
