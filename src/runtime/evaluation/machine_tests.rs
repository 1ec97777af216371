//! The evaluation's paths driven through a fake cluster: each need answered from a script,
//! the needs recorded, the memory checked between evaluations.

use std::collections::VecDeque;

use watermarkd_engine::Timestamp;

use super::*;
use crate::adapters::backend::ObservationDetail;
use crate::adapters::state_store::Stored;
use crate::domain::state::Marks;
use crate::runtime::source::Source;

/// What the fake cluster answers.
struct FakeCluster {
    /// The cache's resourceVersion of the target, one per read (the last one repeats).
    cache: VecDeque<&'static str>,
    spec_replicas: u32,
    /// The API server's resourceVersion of the target.
    api_version: Result<&'static str, WorkloadError>,
    /// Whether the cache reaches the version a wait asks for.
    cache_catches_up: bool,
    stored: Result<Stored, StateObjectError>,
    /// The results of the scale writes, in order (then `Ok`).
    writes: VecDeque<Result<(), WorkloadError>>,
    /// Whether this daemon may write.
    leading: bool,
    now: Timestamp,
    /// What the claim index knows of the target.
    claims: Claims,
}

impl FakeCluster {
    fn new() -> Self {
        FakeCluster {
            cache: VecDeque::from(["1"]),
            spec_replicas: 2,
            api_version: Ok("1"),
            cache_catches_up: true,
            stored: Ok(Stored::Absent),
            writes: VecDeque::new(),
            leading: true,
            now: Timestamp::from_unix_millis(1_700_000_000_000),
            claims: Claims::Free,
        }
    }

    fn reading(&mut self) -> ScaleReading {
        let version = if self.cache.len() > 1 { self.cache.pop_front() } else { self.cache.front().copied() };
        ScaleReading {
            spec_replicas: self.spec_replicas,
            status_replicas: self.spec_replicas,
            ready_replicas: Some(self.spec_replicas),
            selector: None,
            resource_version: version.unwrap_or("1").to_string(),
            marks: Marks::default(),
            spec_changed_at: None,
        }
    }

    fn answer(&mut self, need: &Need) -> Answer {
        match need {
            Need::Target => Answer::Target(Ok(self.reading()), self.now),
            Need::ApiVersion if !self.leading => Answer::NoWriteBudget,
            Need::ApiVersion => Answer::ApiVersion(self.api_version.clone().map(str::to_string)),
            Need::CacheAt(_) => Answer::CacheReached(self.cache_catches_up),
            Need::PersistedState => Answer::PersistedState(match &self.stored {
                Ok(stored) => Ok(stored.clone()),
                Err(StateObjectError::Forbidden { namespace, name, verb }) => {
                    Err(StateObjectError::Forbidden { namespace: namespace.clone(), name: name.clone(), verb })
                }
                Err(_) => unreachable!("the tests script only Forbidden"),
            }),
            Need::Scale(..) if !self.leading => Answer::NoWriteBudget,
            Need::Scale(..) => Answer::Scaled(self.writes.pop_front().unwrap_or(Ok(())), self.now),
            Need::CacheAfter(_) => Answer::CacheMoved,
            Need::TargetFailed(_) | Need::StateUnreadable(_) | Need::Done(_) | Need::End(_) => {
                unreachable!("an ending is not asked")
            }
        }
    }

    /// Runs one evaluation of `desired` on `value` to its end: the needs in order, and the end.
    fn evaluate(&mut self, desired: &Desired, memory: &mut Memory, value: f64) -> (Vec<String>, Need) {
        let observations = vec![Observation::value(value, self.now, ObservationDetail::default())];
        let mut evaluation = Evaluation::new(desired, observations, 1, false, self.claims.clone());
        let mut needs = Vec::new();
        let mut answer = Answer::Start;
        loop {
            let need = evaluation.resume(memory, answer);
            if matches!(need, Need::TargetFailed(_) | Need::StateUnreadable(_) | Need::Done(_) | Need::End(_)) {
                return (needs, need);
            }
            needs.push(name(&need));
            answer = self.answer(&need);
        }
    }
}

fn name(need: &Need) -> String {
    match need {
        Need::Target => "target".into(),
        Need::ApiVersion => "api-version".into(),
        Need::CacheAt(v) => format!("cache-at {v}"),
        Need::PersistedState => "persisted-state".into(),
        Need::Scale(replicas, from) => format!("scale {replicas} on {}", from.resource_version),
        Need::CacheAfter(v) => format!("cache-after {v}"),
        other => format!("{other:?}"),
    }
}

fn desired(extra: &str) -> Desired {
    desired_up_to(10, extra)
}

fn desired_up_to(max_replicas: u32, extra: &str) -> Desired {
    let text = format!(
        "[backend.p]\ntype = \"prometheus\"\nurl = \"http://prometheus:9090\"\n\n[[autoscaler]]\nname = \"web\"\n\
         target = {{ kind = \"Deployment\", namespace = \"shop\", name = \"web\" }}\nmin_replicas = 1\n\
         max_replicas = {max_replicas}\n{extra}\n[[autoscaler.metric]]\nbackend = \"p\"\nquery = \"q\"\n\
         high_watermark = 10\nlow_watermark = 5\n"
    );
    let rules = crate::domain::rules::parse_rules(&text, "rules.toml").expect("rules");
    let autoscaler = rules.autoscalers.into_iter().next().expect("one autoscaler");
    Desired::from_rules_file(autoscaler, false)
}

fn done(end: Need) -> Done {
    match end {
        Need::Done(done) => *done,
        other => panic!("not done: {other:?}"),
    }
}

fn conflict() -> WorkloadError {
    WorkloadError::Conflict {
        kind: "Deployment".into(),
        namespace: "shop".into(),
        name: "web".into(),
        resource_version: "1".into(),
    }
}

#[test]
fn a_first_decision_restores_the_state_then_writes_the_scale() {
    let desired = desired("");
    let mut memory = Memory::for_source(&Source::RulesFile);
    let mut cluster = FakeCluster::new();
    let (needs, end) = cluster.evaluate(&desired, &mut memory, 30.0);
    assert_eq!(needs, ["target", "persisted-state", "scale 3 on 1"]);
    let done = done(end);
    assert_eq!((done.outcome.write, done.ending, done.outcome.scaled), (ScaleWrite::Succeeded, Ending::Scaled, true));
    assert_eq!(memory.state.as_ref().and_then(|s| s.last_scale_time), Some(cluster.now));
    assert_eq!(memory.suspicion.written, Some(3), "6 asked, at most half again per scale by default");
    // Restored once per leadership: the next evaluation reads the target only.
    let (needs, end) = cluster.evaluate(&desired, &mut memory, 7.0);
    assert_eq!(needs, ["target"]);
    assert_eq!(done_outcome(end), Ending::Held);
}

fn done_outcome(end: Need) -> Ending {
    done(end).ending
}

#[test]
fn a_conflict_reads_the_target_again_and_decides_again_three_times_at_most() {
    let desired = desired("");
    let mut memory = Memory::for_source(&Source::RulesFile);
    let mut cluster = FakeCluster::new();
    cluster.cache = VecDeque::from(["1", "2", "3"]);
    cluster.writes = VecDeque::from([Err(conflict()), Err(conflict())]);
    let (needs, end) = cluster.evaluate(&desired, &mut memory, 30.0);
    assert_eq!(
        needs,
        [
            "target",
            "persisted-state",
            "scale 3 on 1",
            "cache-after 1",
            "target",
            "scale 3 on 2",
            "cache-after 2",
            "target",
            "scale 3 on 3"
        ]
    );
    assert_eq!(done(end).outcome.write, ScaleWrite::Succeeded);

    let mut memory = Memory::for_source(&Source::RulesFile);
    cluster.cache = VecDeque::from(["1", "2", "3"]);
    cluster.writes = VecDeque::from([Err(conflict()), Err(conflict()), Err(conflict())]);
    let (needs, end) = cluster.evaluate(&desired, &mut memory, 30.0);
    assert_eq!(needs.iter().filter(|n| n.starts_with("scale")).count(), CONFLICT_ATTEMPTS);
    let done = done(end);
    assert!(matches!(done.outcome.write, ScaleWrite::Failed(_)), "{:?}", done.outcome.write);
    assert_eq!(done.ending, Ending::Failed);
    // A conflict leaves nothing unknown: the write did not land.
    assert_eq!(memory.unconfirmed_write, None);
    assert_eq!(memory.state.as_ref().and_then(|s| s.last_scale_time), None, "no window from a failed write");
}

#[test]
fn a_write_of_unknown_outcome_is_settled_before_the_next_decision() {
    let desired = desired("");
    let mut memory = Memory::for_source(&Source::RulesFile);
    let mut cluster = FakeCluster::new();
    cluster.writes = VecDeque::from([Err(WorkloadError::timeout(std::time::Duration::from_secs(4), "the test"))]);
    let (_, end) = cluster.evaluate(&desired, &mut memory, 30.0);
    assert_eq!(done(end).ending, Ending::Failed);
    assert_eq!(memory.unconfirmed_write.as_deref(), Some("1"));
    assert_eq!(memory.suspicion.unconfirmed_since, Some(cluster.now));

    // The API server has version 2 (the write landed); the cache still shows 1.
    cluster.api_version = Ok("2");
    cluster.cache_catches_up = false;
    let (needs, end) = cluster.evaluate(&desired, &mut memory, 30.0);
    assert_eq!(needs, ["api-version", "target", "cache-at 2"]);
    assert!(
        matches!(&end, Need::TargetFailed(WorkloadError::Unsettled(why)) if why.contains("resourceVersion 2")),
        "{end:?}"
    );
    assert!(memory.unconfirmed_write.is_some(), "still unsettled");

    // The API server cannot answer: still no decision.
    cluster.api_version = Err(WorkloadError::Connection("refused".into()));
    let (_, end) = cluster.evaluate(&desired, &mut memory, 30.0);
    assert!(matches!(&end, Need::TargetFailed(WorkloadError::Unsettled(why)) if why.contains("refused")), "{end:?}");

    // The cache shows version 2, the write's: settled, and decided on what landed.
    cluster.api_version = Ok("2");
    cluster.cache = VecDeque::from(["2"]);
    cluster.spec_replicas = 6;
    let (needs, end) = cluster.evaluate(&desired, &mut memory, 7.0);
    assert_eq!(needs, ["api-version", "target", "target"]);
    assert_eq!(done(end).ending, Ending::Held);
    assert_eq!((memory.unconfirmed_write.as_deref(), memory.suspicion.unconfirmed_since), (None, None));
}

#[test]
fn without_a_write_budget_the_evaluation_holds() {
    let desired = desired("");
    let mut memory = Memory::for_source(&Source::RulesFile);
    let mut cluster = FakeCluster::new();
    cluster.leading = false;
    let (needs, end) = cluster.evaluate(&desired, &mut memory, 30.0);
    assert_eq!(needs, ["target", "persisted-state", "scale 3 on 1"]);
    assert!(matches!(end, Need::End(Ending::Held)), "{end:?}");
    memory.unconfirmed_write = Some("1".into());
    let (needs, end) = cluster.evaluate(&desired, &mut memory, 30.0);
    assert_eq!(needs, ["api-version"]);
    assert!(matches!(end, Need::End(Ending::Held)), "{end:?}");
}

#[test]
fn an_unreadable_state_stops_the_evaluation_before_any_decision() {
    let desired = desired("");
    let mut memory = Memory::for_source(&Source::RulesFile);
    let mut cluster = FakeCluster::new();
    cluster.stored = Err(StateObjectError::Forbidden {
        namespace: "watermarkd".into(),
        name: "watermarkd-state-x".into(),
        verb: "get",
    });
    let (needs, end) = cluster.evaluate(&desired, &mut memory, 30.0);
    assert_eq!(needs, ["target", "persisted-state"]);
    assert!(matches!(end, Need::StateUnreadable(StateObjectError::Forbidden { .. })), "{end:?}");
    assert_eq!(memory.state, None);
    // The next evaluation asks again.
    cluster.stored = Ok(Stored::Absent);
    let (needs, _) = cluster.evaluate(&desired, &mut memory, 30.0);
    assert_eq!(&needs[..2], ["target", "persisted-state"]);
}

#[test]
fn the_persisted_state_holds_the_windows_after_a_restart() {
    let desired = desired("upscale_forbidden_window = \"5m\"\n");
    let mut cluster = FakeCluster::new();
    let mut first = Memory::for_source(&Source::RulesFile);
    let (_, end) = cluster.evaluate(&desired, &mut first, 30.0);
    let mut done = done(end);
    let Some(Persist::ConfigMap { text, .. }) =
        to_persist(&desired, &mut first.persisted, &done, cluster.now, tokio::time::Instant::now())
    else {
        panic!("a scale leaves its state to persist")
    };
    // A restarted daemon finds it, at 6 replicas, a minute later: the window holds.
    let mut restarted = Memory::for_source(&Source::RulesFile);
    cluster.stored = Ok(Stored::State(text));
    cluster.spec_replicas = 6;
    cluster.now = cluster.now.plus(std::time::Duration::from_secs(60));
    let (_, end) = cluster.evaluate(&desired, &mut restarted, 30.0);
    let held = done_outcome(end);
    assert_eq!(held, Ending::Held);
    // Without it, it would scale again at once.
    let mut forgetful = Memory::for_source(&Source::RulesFile);
    cluster.stored = Ok(Stored::Absent);
    let (_, end) = cluster.evaluate(&desired, &mut forgetful, 30.0);
    assert_eq!(done_outcome(end), Ending::Scaled);

    // Written once: the same state again is not written again; a dry run never is.
    let at = tokio::time::Instant::now();
    let what = to_persist(&desired, &mut first.persisted, &done, cluster.now, at).expect("to persist");
    what.stored(&done.next_state, at);
    assert!(to_persist(&desired, &mut first.persisted, &done, cluster.now, at).is_none());
    let mut dry = Memory::for_source(&Source::RulesFile);
    done.outcome.decision.dry_run = true;
    assert!(to_persist(&desired, &mut dry.persisted, &done, cluster.now, at).is_none());
}

#[test]
fn a_paused_autoscaler_decides_and_writes_nothing_until_its_pause_ends() {
    let mut cluster = FakeCluster::new();
    // FakeCluster's clock is 2023-11-14T22:13:20Z.
    let desired = desired("paused_until = \"2023-11-14T23:00:00Z\"\n");
    let mut memory = Memory::for_source(&Source::RulesFile);
    let (needs, end) = cluster.evaluate(&desired, &mut memory, 30.0);
    assert_eq!(needs, ["target", "persisted-state"], "no scale write while paused");
    let paused = done(end);
    assert_eq!(
        (paused.ending, paused.outcome.decision.replicas),
        (Ending::DryRun, 3),
        "it still says what it would do"
    );
    assert!(
        paused.outcome.decision.reason.starts_with("paused until 2023-11-14T23:00:00Z: "),
        "{}",
        paused.outcome.decision.reason
    );
    // An hour later the pause is over, and the same load scales.
    cluster.now = cluster.now.plus(std::time::Duration::from_secs(3600));
    let (needs, end) = cluster.evaluate(&desired, &mut memory, 30.0);
    assert_eq!(needs, ["target", "scale 3 on 1"]);
    assert_eq!(done_outcome(end), Ending::Scaled);
}

#[test]
fn a_declared_fallback_is_entered_once_the_data_has_been_missing_long_enough() {
    let mut cluster = FakeCluster::new();
    let desired = desired("[autoscaler.fallback]\nafter = \"5m\"\naction = \"replicas\"\nreplicas = 6\n");
    let mut memory = Memory::for_source(&Source::RulesFile);
    // NaN is no usable value: held, as without a fallback, for the first five minutes.
    let (needs, end) = cluster.evaluate(&desired, &mut memory, f64::NAN);
    assert_eq!(needs, ["target", "persisted-state"]);
    let first = done(end);
    assert_eq!((first.ending, first.outcome.fallback), (Ending::Held, None));
    cluster.now = cluster.now.plus(std::time::Duration::from_secs(300));
    let (needs, end) = cluster.evaluate(&desired, &mut memory, f64::NAN);
    assert_eq!(needs, ["target", "scale 6 on 1"]);
    let entered = done(end);
    assert_eq!(entered.ending, Ending::Scaled);
    assert_eq!(
        entered.outcome.fallback,
        Some(fallback::Change::Entered { why: "no usable metric value for 5m: falling back to 6 replicas".into() })
    );
    assert!(
        entered.outcome.decision.reason.contains("falling back to 6 replicas"),
        "{}",
        entered.outcome.decision.reason
    );
}

fn hpa_on_web() -> crate::domain::claims::Claimant {
    use crate::domain::claims::{Claimant, ClaimantKind, HpaReplicas, TargetKey};
    Claimant {
        kind: ClaimantKind::HorizontalPodAutoscaler,
        namespace: "shop".into(),
        name: "web".into(),
        target: TargetKey::new("apps/v1", "Deployment", "shop", "web"),
        scaled_object: None,
        replicas: Some(HpaReplicas::default()),
    }
}

#[test]
fn a_target_another_controller_scales_is_decided_and_never_written() {
    let desired = desired("");
    let mut memory = Memory::for_source(&Source::RulesFile);
    let mut cluster = FakeCluster::new();
    cluster.claims = Claims::Claimed(vec![hpa_on_web()]);
    let (needs, end) = cluster.evaluate(&desired, &mut memory, 30.0);
    assert_eq!(needs, ["target", "persisted-state"], "no scale write beside the HPA");
    let held = done(end);
    assert_eq!((held.outcome.decision.replicas, held.outcome.write.clone()), (3, ScaleWrite::NotAttempted));
    let note = held.outcome.claims.as_deref().expect("the guard's note");
    assert!(note.withheld);
    assert_eq!(note.claimed_by.iter().map(|c| &**c).collect::<Vec<_>>(), ["HorizontalPodAutoscaler/shop/web"]);
    assert!(held.outcome.paused(), "shown as held, like a pause");
    let headline = held.outcome.explanation.first().unwrap_or_default().to_string();
    assert!(
        headline.starts_with("would scale up from 2 to 3, but HorizontalPodAutoscaler shop/web already scales"),
        "{headline}"
    );
    // Not listed yet is no better than claimed. (An hour on: past the forbidden window the
    // decision that was not written opened, as a dry run's does.)
    cluster.now = cluster.now.plus(std::time::Duration::from_secs(3600));
    cluster.claims = Claims::Unknown("not listed yet".into());
    let (needs, end) = cluster.evaluate(&desired, &mut memory, 30.0);
    assert_eq!(needs, ["target"]);
    assert!(done(end).outcome.claims.is_some_and(|c| c.withheld && c.claimed_by.is_empty()));
    // Gone: the same load scales.
    cluster.now = cluster.now.plus(std::time::Duration::from_secs(3600));
    cluster.claims = Claims::Free;
    let (needs, end) = cluster.evaluate(&desired, &mut memory, 30.0);
    assert_eq!(needs, ["target", "scale 3 on 1"]);
    assert!(done(end).outcome.claims.is_none());
}

#[test]
fn an_observer_decides_every_time_writes_nothing_and_is_not_held_by_the_guard() {
    let desired = desired("observe = true\n");
    let mut memory = Memory::for_source(&Source::RulesFile);
    let mut cluster = FakeCluster::new();
    for claims in [Claims::Claimed(vec![hpa_on_web()]), Claims::Free] {
        let beside_the_hpa = claims != Claims::Free;
        cluster.claims = claims;
        let (needs, end) = cluster.evaluate(&desired, &mut memory, 30.0);
        assert!(!needs.iter().any(|n| n.starts_with("scale")), "{needs:?}");
        let observed = done(end);
        assert_eq!((observed.ending, observed.outcome.decision.replicas), (Ending::DryRun, 3));
        assert_eq!(observed.outcome.ahead.as_ref().and_then(|a| a.paused), Some(true));
        let headline = observed.outcome.explanation.first().unwrap_or_default().to_string();
        assert!(headline.starts_with("would scale up from 2 to 3, but observing only (observe = true)"), "{headline}");
        match observed.outcome.claims.as_deref() {
            Some(note) => {
                assert!(beside_the_hpa && !note.withheld);
                assert!(note.sentence.starts_with("observing beside HorizontalPodAutoscaler shop/web"), "{note:?}");
            }
            None => assert!(!beside_the_hpa),
        }
        // Past the forbidden window its decision that was not written opened, as a dry run's.
        cluster.now = cluster.now.plus(std::time::Duration::from_secs(3600));
    }
}

#[test]
fn taking_over_writes_the_rule_s_limited_step_from_the_current_replicas() {
    // 5 replicas now (the HPA's), the load asks for 20; no state of watermarkd's yet.
    let desired = desired_up_to(30, "take_over = true\nscale_up_limit_factor = 20\n");
    let mut memory = Memory::for_source(&Source::RulesFile);
    let mut cluster = FakeCluster::new();
    cluster.spec_replicas = 5;
    cluster.claims = Claims::Claimed(vec![hpa_on_web()]);
    let (needs, end) = cluster.evaluate(&desired, &mut memory, 40.0);
    assert_eq!(needs, ["target", "persisted-state", "scale 6 on 1"], "20% of 5, rounded up, on top of 5");
    let taken = done(end);
    assert_eq!(taken.outcome.decision.proposal, Some(20), "what the metric asked for");
    let note = taken.outcome.claims.as_deref().expect("the guard's note");
    assert!(note.taking_over && !note.withheld, "{note:?}");
}
