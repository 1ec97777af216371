//! One cycle: the autoscalers due at one instant. Every backend they use is queried once,
//! concurrently (so Datadog batches are shared); each autoscaler is decided as soon as all of
//! its sources answered, in its own task, at most `max_concurrency` at once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedMutexGuard, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::evaluate;
use super::scheduler::{Due, Job};
use super::source::Desired;
use super::Shared;
use crate::adapters::backend::recommender::WorkloadState;
use crate::adapters::backend::{demand_history, MetricBackend, MetricQuery, Observation, QueryError};
use crate::adapters::resource::ResourceQuery;

use crate::domain::rules::{Autoscaler, MetricSource};

/// Cycles of at least this many autoscalers ask for their memory to be handed back when they
/// end.
const LARGE_CYCLE: usize = 500;

/// Where a metric is read: a `[backend.NAME]`, or the API server's metrics API (a resource
/// metric), whatever a backend may be named.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Via {
    Backend(String),
    Resources,
}

impl Via {
    fn of(metric: &MetricSource) -> Via {
        match metric.resource {
            Some(_) => Via::Resources,
            None => Via::Backend(metric.backend.clone()),
        }
    }
}

/// A job of the cycle, by its position.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct JobId(usize);

/// Where one answer goes: a metric of a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Slot {
    job: JobId,
    metric: usize,
}

/// A recommender to ask: which rule of the job (the autoscaler, or a shadow) and its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Asked {
    rule: usize,
    slot: Slot,
}

/// Which source answers which slots, and which jobs ask a recommender.
#[derive(Debug, Default)]
struct Plan {
    by_via: BTreeMap<Via, Vec<Slot>>,
    recommended: Vec<Asked>,
}

impl Plan {
    /// A job's slots are its autoscaler's metrics, then each shadow rule's (see
    /// `Desired::rules`): one query of a backend serves them all.
    fn new<'a>(jobs: impl Iterator<Item = &'a Desired>) -> (Plan, Answers) {
        let mut plan = Plan::default();
        let mut answers = Answers::default();
        for (j, desired) in jobs.enumerate() {
            let job = JobId(j);
            let mut sources: Vec<Via> = Vec::new();
            let mut offset = 0;
            let mut asked = 0;
            for (rule, autoscaler) in desired.rules().enumerate() {
                for (metric, source) in autoscaler.metrics.iter().enumerate() {
                    sources.push(Via::of(source));
                    plan.by_via.entry(Via::of(source)).or_default().push(Slot { job, metric: offset + metric });
                }
                if autoscaler.recommender.is_some() {
                    // A recommender is its rule's one reading.
                    plan.recommended.push(Asked { rule, slot: Slot { job, metric: offset } });
                    asked += 1;
                }
                offset += autoscaler.rule.metrics().len();
            }
            sources.sort_unstable();
            sources.dedup();
            answers.jobs.push(Pending { observations: vec![None; offset], waiting: sources.len() + asked });
        }
        (plan, answers)
    }
}

#[derive(Debug)]
struct Pending {
    observations: Vec<Option<Observation>>,
    /// Sources that have not answered yet.
    waiting: usize,
}

/// The answers of a cycle as they come in, by job.
#[derive(Debug, Default)]
struct Answers {
    jobs: Vec<Pending>,
}

impl Answers {
    /// Files one source's answers (in the order of its slots) and returns the jobs this
    /// completed: every source of theirs has answered now.
    fn record(&mut self, slots: &[Slot], observations: Vec<Observation>) -> Vec<JobId> {
        let mut touched: Vec<JobId> = Vec::new();
        for (slot, observation) in slots.iter().zip(observations) {
            if let Some(place) = self.jobs.get_mut(slot.job.0).and_then(|p| p.observations.get_mut(slot.metric)) {
                *place = Some(observation);
            }
            if touched.last() != Some(&slot.job) {
                touched.push(slot.job);
            }
        }
        touched.sort_unstable();
        touched.dedup();
        touched
            .into_iter()
            .filter(|job| match self.jobs.get_mut(job.0) {
                Some(pending) => {
                    pending.waiting = pending.waiting.saturating_sub(1);
                    pending.waiting == 0
                }
                None => false,
            })
            .collect()
    }

    /// A completed job's observations; a slot no source filled is unavailable data.
    fn take(&mut self, job: JobId) -> Vec<Observation> {
        let Some(pending) = self.jobs.get_mut(job.0) else { return Vec::new() };
        std::mem::take(&mut pending.observations)
            .into_iter()
            .map(|o| o.unwrap_or_else(|| Observation::unavailable(QueryError::Configuration("no answer".into()))))
            .collect()
    }
}

/// A source's answers, in the order of the slots it was asked for.
type Answered = (Vec<Slot>, Vec<Observation>);

/// When a cycle's queries must be answered: before the next cycle of its most frequent
/// autoscaler, less a tenth of that interval (at most a second) for the decisions and writes.
fn deadline(started: Instant, intervals: impl Iterator<Item = Duration>) -> Instant {
    let interval = intervals.min().unwrap_or(Duration::ZERO);
    crate::domain::instant::saturating_add(
        started,
        interval.saturating_sub((interval / 10).min(Duration::from_secs(1))),
    )
}

/// Runs one cycle to its end: queries, then every decision.
pub async fn run(shared: Arc<Shared>, permits: Arc<Semaphore>, due: Due) {
    let Due { mut jobs, backends } = due;
    let now = shared.clock.now();
    for job in &mut jobs {
        backfill_forecast(job, &backends, &shared.history_reads, now);
    }
    let (plan, answers) = Plan::new(jobs.iter().map(|j| &*j.desired));
    let deadline =
        deadline(Instant::now(), jobs.iter().map(|j| j.desired.autoscaler.interval(shared.default_interval)));
    let mut queries: JoinSet<Answered> = JoinSet::new();
    let asking = Asking { shared: &shared, jobs: &jobs, now, deadline };
    for (via, slots) in plan.by_via {
        match via {
            Via::Backend(name) => {
                let client = backends.get(&name).cloned();
                queries.spawn(asking.backend(name, client, slots));
            }
            Via::Resources => {
                queries.spawn(asking.resources(slots));
            }
        }
    }
    for asked in plan.recommended {
        // Asked for a job of this cycle, as every slot is.
        let Some(job) = jobs.get(asked.slot.job.0) else { continue };
        let desired = Arc::clone(&job.desired);
        let shared = Arc::clone(&shared);
        queries.spawn(async move {
            let observation = match desired.rules().nth(asked.rule) {
                Some(autoscaler) => ask_recommender(&shared, autoscaler, deadline).await,
                None => Observation::unavailable(QueryError::Configuration("no recommender".into())),
            };
            (vec![asked.slot], vec![observation])
        });
    }
    decide_as_answered(shared, permits, jobs, answers, queries).await;
}

/// Reads the history a forecast learns from, from the autoscaler's backends, in the
/// background: all of it when the autoscaler starts, then each day what came since (see
/// `Forecaster::wants_backfill`). Its evaluations go on meanwhile, and the forecast takes the
/// history into its holes when it comes (what it saw itself is kept). Under `absolute` the
/// metric is per replica, so the replicas watermarkd set are read too, from the first metric's
/// backend.
fn backfill_forecast(
    job: &mut Job,
    backends: &BTreeMap<String, Arc<MetricBackend>>,
    history_reads: &Arc<Semaphore>,
    now: watermarkd_engine::Timestamp,
) {
    let autoscaler = &job.desired.autoscaler;
    if autoscaler.forecast.is_none() {
        return;
    }
    let Some(span) = job.memory.forecaster.get_or_insert_with(Box::default).wants_backfill(now) else { return };
    let backends = backends.clone();
    let memory = Arc::clone(OwnedMutexGuard::mutex(&job.memory));
    let autoscaler = autoscaler.clone();
    let history_reads = Arc::clone(history_reads);
    tokio::spawn(async move {
        // Only a closed semaphore fails, and this one is never closed.
        let Ok(_reading) = history_reads.acquire_owned().await else { return };
        let read = demand_history(&autoscaler, |name| backends.get(name).cloned(), span).await;
        for (index, demand) in read.into_iter().enumerate() {
            match demand {
                Ok(demand) => {
                    let count = demand.len();
                    if let Some(forecaster) = memory.lock().await.forecaster.as_mut() {
                        forecaster.backfill(index, demand);
                    }
                    tracing::info!(autoscaler = %autoscaler.name, metric = index, points = count, "the forecast read its history");
                }
                Err(err) => tracing::warn!(
                    autoscaler = %autoscaler.name,
                    error = %err,
                    "the forecast could not read its history; it learns from the evaluations instead"
                ),
            }
        }
    });
}

/// What every query of one cycle is asked with.
struct Asking<'c> {
    shared: &'c Arc<Shared>,
    jobs: &'c [Job],
    now: watermarkd_engine::Timestamp,
    deadline: Instant,
}

impl Asking<'_> {
    fn metric_of(&self, slot: &Slot) -> Option<&MetricSource> {
        self.jobs.get(slot.job.0).and_then(|j| j.desired.metric_source(slot.metric))
    }

    /// The queries of `slots` on the backend `name`, as one call to its client.
    fn backend(
        &self,
        name: String,
        client: Option<Arc<MetricBackend>>,
        slots: Vec<Slot>,
    ) -> impl std::future::Future<Output = Answered> + Send + 'static {
        // Every slot was planned from a metric of its job, so none is left out here.
        let (slots, batch): (Vec<Slot>, Vec<MetricQuery>) = slots
            .into_iter()
            .filter_map(|slot| {
                let source = self.metric_of(&slot)?;
                Some((slot, MetricQuery { query: source.query.clone(), reducer: source.reducer }))
            })
            .unzip();
        // Whose query each is: a WPA's namespace is held to its share of a Datadog budget.
        let owners: Vec<Option<String>> = slots
            .iter()
            .map(|slot| self.jobs.get(slot.job.0).and_then(|j| j.desired.key.namespace()).map(str::to_string))
            .collect();
        let (shared, now, deadline) = (Arc::clone(self.shared), self.now, self.deadline);
        async move {
            let started = Instant::now();
            let owners: Vec<Option<&str>> = owners.iter().map(Option::as_deref).collect();
            let observations = match client {
                Some(client) => client.evaluate_for(&batch, &owners, now, deadline).await,
                None => batch
                    .iter()
                    .map(|_| {
                        Observation::unavailable(QueryError::Configuration(format!("backend {name:?} is not set up")))
                    })
                    .collect(),
            };
            shared.daemon.cycle_seconds.with_label_values(&[&name]).observe(started.elapsed().as_secs_f64());
            (slots, observations)
        }
    }

    /// The resource metrics of `slots`, from the metrics API.
    fn resources(&self, slots: Vec<Slot>) -> impl std::future::Future<Output = Answered> + Send + 'static {
        let (slots, batch): (Vec<Slot>, Vec<ResourceQuery>) = slots
            .into_iter()
            .filter_map(|slot| {
                let autoscaler = &self.jobs.get(slot.job.0)?.desired.autoscaler;
                let source = self.metric_of(&slot)?.resource.clone()?;
                Some((slot, ResourceQuery { namespace: autoscaler.target.namespace.clone(), source }))
            })
            .unzip();
        let (shared, now, deadline) = (Arc::clone(self.shared), self.now, self.deadline);
        async move {
            let started = Instant::now();
            let observations = shared.resources.evaluate(&batch, now, deadline).await;
            shared
                .daemon
                .cycle_seconds
                .with_label_values(&[crate::adapters::resource::BACKEND_LABEL])
                .observe(started.elapsed().as_secs_f64());
            (slots, observations)
        }
    }
}

/// Decides each job as soon as every source of its has answered, then waits for every
/// decision.
async fn decide_as_answered(
    shared: Arc<Shared>,
    permits: Arc<Semaphore>,
    jobs: Vec<Job>,
    mut answers: Answers,
    mut queries: JoinSet<Answered>,
) {
    let count = jobs.len();
    let mut jobs: Vec<Option<Job>> = jobs.into_iter().map(Some).collect();
    let mut decisions = JoinSet::new();
    while let Some(done) = queries.join_next().await {
        let Ok((slots, observations)) = done else { continue };
        for id in answers.record(&slots, observations) {
            if shared.is_stopping() {
                continue;
            }
            let Some(job) = jobs.get_mut(id.0).and_then(Option::take) else { continue };
            let observations = answers.take(id);
            // The permit is taken before the task exists, so at most `max_concurrency`
            // evaluations (each with its kube request futures) are alive at once.
            let Ok(permit) = Arc::clone(&permits).acquire_owned().await else { return };
            if shared.is_stopping() {
                return;
            }
            // A finished evaluation's task stays allocated until joined: joined as we go, a
            // large cycle holds `max_concurrency` tasks, not one per autoscaler.
            while decisions.try_join_next().is_some() {}
            let shared = Arc::clone(&shared);
            decisions.spawn(async move {
                let _permit = permit;
                let Job { desired, mut memory } = job;
                let started = Instant::now();
                let outcome = Box::pin(evaluate::evaluate(&shared, &desired, &mut memory, observations)).await;
                let source = desired.key.source().label();
                shared.daemon.evaluation_seconds.with_label_values(&[source]).observe(started.elapsed().as_secs_f64());
                shared.daemon.evaluations.with_label_values(&[outcome.label()]).inc();
            });
        }
    }
    while decisions.join_next().await.is_some() {}
    if count >= LARGE_CYCLE {
        // A large cycle's answers and decisions were garbage the moment it ended.
        shared.trim.request();
    }
}

/// Asks an autoscaler's recommender, telling it the target's replicas as the cache has them
/// now. A target that cannot be read is left to the evaluation to report.
async fn ask_recommender(shared: &Shared, autoscaler: &Autoscaler, deadline: Instant) -> Observation {
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

#[cfg(test)]
mod tests {
    use super::*;
    use watermarkd_engine::Reading;

    fn autoscalers(text: &str) -> Vec<Desired> {
        let rules = crate::domain::rules::parse_rules(text, "rules.toml").expect("rules");
        super::super::rules_file::split(rules, false).1
    }

    const RULES: &str = r#"
[backend.a]
type = "prometheus"
url = "http://127.0.0.1:1"

[backend.b]
type = "prometheus"
url = "http://127.0.0.1:2"

[[autoscaler]]
name = "two-sources"
target = { kind = "Deployment", namespace = "shop", name = "web" }
min_replicas = 1
max_replicas = 10
[[autoscaler.metric]]
backend = "a"
query = "first"
high_watermark = 10
low_watermark = 1
[[autoscaler.metric]]
backend = "b"
query = "second"
high_watermark = 10
low_watermark = 1
[[autoscaler.metric]]
backend = "a"
query = "third"
high_watermark = 10
low_watermark = 1

[[autoscaler]]
name = "one-source"
target = { kind = "Deployment", namespace = "shop", name = "api" }
min_replicas = 1
max_replicas = 10
[[autoscaler.metric]]
backend = "b"
query = "only"
high_watermark = 10
low_watermark = 1
"#;

    fn value(v: f64) -> Observation {
        let mut observation = Observation::unavailable(QueryError::Configuration("placeholder".into()));
        observation.reading = Reading::Value { value: v, at: watermarkd_engine::Timestamp::from_unix_millis(0) };
        observation
    }

    #[test]
    fn each_source_answers_its_slots_and_a_job_completes_when_all_its_sources_did() {
        let autoscalers = autoscalers(RULES);
        let (plan, mut answers) = Plan::new(autoscalers.iter());
        let a = &plan.by_via[&Via::Backend("a".into())];
        let b = &plan.by_via[&Via::Backend("b".into())];
        assert_eq!(a, &[Slot { job: JobId(0), metric: 0 }, Slot { job: JobId(0), metric: 2 }]);
        assert_eq!(b, &[Slot { job: JobId(0), metric: 1 }, Slot { job: JobId(1), metric: 0 }]);
        assert!(plan.recommended.is_empty());

        // `a` answers: the first job still waits for `b`.
        assert!(answers.record(a, vec![value(1.0), value(3.0)]).is_empty());
        // `b` answers both jobs at once.
        assert_eq!(answers.record(b, vec![value(2.0), value(4.0)]), [JobId(0), JobId(1)]);
        let values = |observations: Vec<Observation>| -> Vec<Option<f64>> {
            observations
                .into_iter()
                .map(|o| match o.reading {
                    Reading::Value { value, .. } => Some(value),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(values(answers.take(JobId(0))), [Some(1.0), Some(2.0), Some(3.0)], "in the metrics' order");
        assert_eq!(values(answers.take(JobId(1))), [Some(4.0)]);
    }

    #[test]
    fn a_source_that_answers_short_leaves_unavailable_data_never_a_value() {
        let autoscalers = autoscalers(RULES);
        let (plan, mut answers) = Plan::new(autoscalers.iter());
        let b = &plan.by_via[&Via::Backend("b".into())];
        assert!(answers.record(&plan.by_via[&Via::Backend("a".into())], vec![value(1.0)]).is_empty());
        assert_eq!(answers.record(b, vec![value(2.0), value(4.0)]), [JobId(0), JobId(1)]);
        let first = answers.take(JobId(0));
        assert!(matches!(first[2].reading, Reading::Unavailable { .. }), "{first:?}");
    }

    #[test]
    fn the_deadline_leaves_a_tenth_of_the_shortest_interval_at_most_a_second() {
        let start = Instant::now();
        let intervals = [Duration::from_secs(30), Duration::from_secs(5)];
        assert_eq!(deadline(start, intervals.into_iter()), start + Duration::from_millis(4500));
        assert_eq!(deadline(start, [Duration::from_secs(60)].into_iter()), start + Duration::from_secs(59));
    }
}
