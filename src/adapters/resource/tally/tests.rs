use serde_json::json;

use super::*;

const NOW: i64 = 1_700_000_000_000;

fn now() -> Timestamp {
    Timestamp::from_unix_millis(NOW)
}

fn ago(seconds: u64) -> Timestamp {
    Timestamp::from_unix_millis(NOW - i64::try_from(seconds).unwrap() * 1000)
}

fn running(name: &str) -> PodView {
    PodView {
        name: name.into(),
        phase: "Running".into(),
        deleting: false,
        ready: Some(true),
        ready_since: Some(ago(600)),
        started: Some(ago(700)),
    }
}

fn sample(name: &str, cpu: &[&str], age: u64) -> PodSample {
    PodSample {
        name: name.into(),
        at: Some(ago(age)),
        containers: cpu
            .iter()
            .enumerate()
            .map(|(i, q)| ContainerSample {
                name: format!("c{i}"),
                cpu: parse_quantity(q).ok(),
                memory: parse_quantity("64Mi").ok(),
            })
            .collect(),
    }
}

fn rule(resource: ResourceName, aggregation: PodAggregation) -> TallyRule {
    TallyRule { resource, aggregation, readiness_delay: Duration::ZERO, max_age: Duration::from_secs(120) }
}

fn cpu_sum() -> TallyRule {
    rule(ResourceName::Cpu, PodAggregation::Sum)
}

fn value(t: &Tally) -> f64 {
    match t.outcome {
        TallyOutcome::Complete { value, .. } => value,
        ref other => panic!("not complete: {other:?}"),
    }
}

#[test]
fn usage_is_summed_over_containers_and_pods_as_the_datadog_controller_does() {
    let pods = [running("a"), running("b")];
    let samples = [sample("a", &["250m", "50m"], 10), sample("b", &["100m"], 20)];
    let t = tally(&cpu_sum(), &pods, &samples, now());
    assert!((value(&t) - 0.4).abs() < 1e-12, "{t:?}");
    assert_eq!(t.measured, ["a", "b"]);
    // The oldest sample dates the value.
    assert!(matches!(t.outcome, TallyOutcome::Complete { at, .. } if at == ago(20)));
}

#[test]
fn the_average_option_divides_by_the_pods_that_count() {
    let pods = [running("a"), running("b")];
    let samples = [sample("a", &["300m"], 10), sample("b", &["100m"], 10)];
    let t = tally(&rule(ResourceName::Cpu, PodAggregation::Average), &pods, &samples, now());
    assert!((value(&t) - 0.2).abs() < 1e-12, "{t:?}");
}

#[test]
fn memory_is_in_bytes() {
    let pods = [running("a")];
    let t = tally(&rule(ResourceName::Memory, PodAggregation::Sum), &pods, &[sample("a", &["1"], 5)], now());
    assert_eq!(value(&t), 64.0 * 1024.0 * 1024.0);
}

#[test]
fn pending_failed_succeeded_deleting_and_unready_pods_do_not_count() {
    let mut pending = running("pending");
    pending.phase = "Pending".into();
    let mut evicted = running("evicted");
    evicted.phase = "Failed".into();
    let mut done = running("done");
    done.phase = "Succeeded".into();
    let mut deleting = running("deleting");
    deleting.deleting = true;
    let mut unready = running("unready");
    unready.ready = Some(false);
    let mut no_condition = running("no-condition");
    no_condition.ready = None;
    let pods = [running("ok"), pending, evicted, done, deleting, unready, no_condition];
    // Every pod has metrics, even those that do not count (metrics-server may still have some).
    let samples: Vec<PodSample> = pods.iter().map(|p| sample(&p.name, &["1"], 5)).collect();
    let t = tally(&cpu_sum(), &pods, &samples, now());
    assert_eq!(value(&t), 1.0, "only the ready, running pod: {t:?}");
    let ignored: Vec<(&str, &str)> = t.ignored.iter().map(|e| (e.pod.as_str(), e.why.as_str())).collect();
    assert_eq!(
        ignored,
        [
            ("pending", "pending"),
            ("evicted", "failed (evicted or crashed)"),
            ("done", "succeeded"),
            ("deleting", "being deleted"),
            ("unready", "not ready"),
            ("no-condition", "not ready"),
        ]
    );
    assert!(t.missing.is_empty());
}

#[test]
fn memory_counts_running_pods_whether_ready_or_not_but_never_deleting_ones() {
    let mut unready = running("unready");
    unready.ready = Some(false);
    let mut deleting = running("deleting");
    deleting.deleting = true;
    let pods = [running("ok"), unready, deleting];
    let samples: Vec<PodSample> = pods.iter().map(|p| sample(&p.name, &["1"], 5)).collect();
    let t = tally(&rule(ResourceName::Memory, PodAggregation::Sum), &pods, &samples, now());
    assert_eq!(t.measured, ["ok", "unready"]);
}

#[test]
fn cpu_waits_out_the_readiness_delay_from_the_ready_transition() {
    let mut fresh = running("fresh");
    fresh.ready_since = Some(ago(20));
    // Became ready 5 s after it started, long ago: the delay is past (the Datadog controller
    // would leave this pod out for good).
    let mut quick = running("quick");
    quick.started = Some(ago(605));
    quick.ready_since = Some(ago(600));
    let mut unknown_times = running("no-times");
    unknown_times.ready_since = None;
    unknown_times.started = None;
    let pods = [fresh, quick, unknown_times];
    let samples: Vec<PodSample> = pods.iter().map(|p| sample(&p.name, &["1"], 5)).collect();
    let mut delayed = cpu_sum();
    delayed.readiness_delay = Duration::from_secs(30);
    let t = tally(&delayed, &pods, &samples, now());
    assert_eq!(t.measured, ["quick", "no-times"]);
    assert_eq!(t.ignored[0].why, "ready for 20s, under the readiness delay of 30s");
    // Without a delay it counts.
    assert_eq!(tally(&cpu_sum(), &pods, &samples, now()).measured.len(), 3);
}

#[test]
fn a_pod_without_usable_metrics_makes_the_value_partial_never_lower() {
    let pods = [running("a"), running("b"), running("c"), running("d"), running("e")];
    let mut no_containers = sample("d", &[], 5);
    no_containers.containers.clear();
    let mut unstamped = sample("e", &["1"], 5);
    unstamped.at = None;
    let samples = [
        sample("a", &["1"], 5),
        // b: none at all; c: one container without cpu; d: no containers; e: no timestamp.
        PodSample {
            name: "c".into(),
            at: Some(ago(5)),
            containers: vec![
                ContainerSample { name: "x".into(), cpu: parse_quantity("1").ok(), memory: None },
                ContainerSample { name: "y".into(), cpu: None, memory: None },
            ],
        },
        no_containers,
        unstamped,
    ];
    let t = tally(&cpu_sum(), &pods, &samples, now());
    assert_eq!(t.outcome, TallyOutcome::Partial { value: 1.0, at: ago(5) });
    let missing: Vec<(&str, &str)> = t.missing.iter().map(|e| (e.pod.as_str(), e.why.as_str())).collect();
    assert_eq!(
        missing,
        [
            ("b", "no metrics"),
            ("c", "no cpu usage for every container"),
            ("d", "no cpu usage for every container"),
            ("e", "metrics without a timestamp"),
        ]
    );
    // The average of a partial reading counts the missing pods at 0: a lower bound too.
    let average = tally(&rule(ResourceName::Cpu, PodAggregation::Average), &pods, &samples, now());
    assert_eq!(average.outcome, TallyOutcome::Partial { value: 0.2, at: ago(5) });
}

#[test]
fn stale_samples_are_missing_not_zero() {
    let pods = [running("a"), running("b")];
    let samples = [sample("a", &["1"], 5), sample("b", &["1"], 121)];
    let t = tally(&cpu_sum(), &pods, &samples, now());
    assert_eq!(t.outcome, TallyOutcome::Partial { value: 1.0, at: ago(5) });
    assert_eq!(t.missing[0].why, "metrics 121s old, over the max age of 120s");
    // All stale: no value at all.
    let t = tally(&cpu_sum(), &pods, &[sample("a", &["1"], 300), sample("b", &["1"], 300)], now());
    match t.outcome {
        TallyOutcome::Unavailable(why) => {
            assert!(why.starts_with("no usable metrics for any of the 2 pods that count (a: metrics 300s old"), "{why}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn no_pods_or_no_counted_pods_is_unavailable() {
    assert_eq!(
        tally(&cpu_sum(), &[], &[], now()).outcome,
        TallyOutcome::Unavailable("no pod matches the selector".into())
    );
    let mut pending = running("p");
    pending.phase = "Pending".into();
    assert_eq!(
        tally(&cpu_sum(), &[pending], &[sample("p", &["1"], 1)], now()).outcome,
        TallyOutcome::Unavailable("none of the 1 selected pods counts (p: pending)".into())
    );
}

#[test]
fn samples_of_pods_that_do_not_count_or_were_not_listed_are_ignored() {
    let pods = [running("a")];
    let samples = [sample("a", &["1"], 5), sample("stranger", &["100"], 5)];
    assert_eq!(value(&tally(&cpu_sum(), &pods, &samples, now())), 1.0);
}

#[test]
fn pod_metrics_json_is_read_defensively() {
    let object = json!({
        "metadata": { "name": "web-1", "namespace": "prod" },
        "timestamp": "2023-11-14T22:13:20Z",
        "window": "30s",
        "containers": [
            { "name": "app", "usage": { "cpu": "250m", "memory": "100Mi" } },
            { "name": "sidecar", "usage": { "cpu": "1234567n", "memory": "bogus" } },
            { "name": "negative", "usage": { "cpu": "-1" } },
        ],
    });
    let s = PodSample::from_json(&object);
    assert_eq!(s.name, "web-1");
    assert_eq!(s.at, Some(Timestamp::from_unix_millis(NOW)));
    assert_eq!(s.containers[0].cpu, Decimal::parse("0.25").ok());
    assert_eq!(s.containers[1].cpu, Decimal::parse("0.001234567").ok());
    assert_eq!(s.containers[1].memory, None, "not a quantity: missing, not 0");
    assert_eq!(s.containers[2].cpu, None, "negative usage is not usage");
    assert_eq!(PodSample::from_json(&json!({})).at, None);
}

#[test]
fn a_pod_object_gives_its_view() {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": "web-1", "deletionTimestamp": "2023-11-14T22:13:20Z" },
        "status": {
            "phase": "Running",
            "startTime": "2023-11-14T22:00:00Z",
            "conditions": [{ "type": "Ready", "status": "True", "lastTransitionTime": "2023-11-14T22:10:00Z" }],
        },
    }))
    .unwrap();
    let view = PodView::from_pod(&pod);
    assert_eq!(view.name, "web-1");
    assert!(view.deleting);
    assert_eq!(view.ready, Some(true));
    assert_eq!(view.ready_since, Some(ago(200)));
    assert_eq!(view.started, Some(ago(800)));
    let bare: Pod = serde_json::from_value(json!({ "metadata": { "name": "p" } })).unwrap();
    assert_eq!(PodView::from_pod(&bare).phase, "");
    assert_eq!(PodView::from_pod(&bare).ready, None);
}
