//! The cost of one decision: the daemon makes 10,000 of these per cycle at scale.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark: it prints its measurements and stops at the first failure"
)]

use std::time::Duration;

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use watermarkd_engine::{
    decide, BehaviorSpec, Decimal, MetricSpec, Reading, Recommendation, Rule, RuleSpec, State, Target, Timestamp,
};

fn metric(name: &str, low: &str, high: &str) -> MetricSpec {
    MetricSpec {
        name: name.into(),
        low_watermark: Decimal::parse(low).ok(),
        high_watermark: Decimal::parse(high).ok(),
        max_age: Some(Duration::from_secs(300)),
        activation: None,
    }
}

fn bench(c: &mut Criterion) {
    let now = Timestamp::from_unix_millis(1_714_564_800_000);
    let knobs = Rule::new(RuleSpec {
        min_replicas: Some(4),
        max_replicas: Some(90),
        tolerance: Decimal::parse("0.01").ok(),
        metrics: vec![metric("latency", "0.15", "0.4")],
        ..Default::default()
    })
    .expect("valid rule");
    let target = Target { spec_replicas: 10, status_replicas: Some(10), ready_replicas: Some(10) };
    let reading = [Reading::Value { value: 0.52, at: now }];
    let state = State::default();
    c.bench_function("decide/watermark_knobs/1_metric_scale_up", |b| {
        b.iter(|| decide(black_box(&knobs), black_box(target), black_box(&reading), black_box(&state), now))
    });

    let behavior = Rule::new(RuleSpec {
        min_replicas: Some(4),
        max_replicas: Some(90),
        metrics: vec![metric("cpu", "0.5", "0.8"), metric("latency", "0.15", "0.4"), metric("queue", "100", "400")],
        behavior: Some(BehaviorSpec::default()),
        ..Default::default()
    })
    .expect("valid rule");
    let readings = [
        Reading::Value { value: 0.61, at: now },
        Reading::Value { value: 0.12, at: now },
        Reading::Value { value: 1234.5, at: now },
    ];
    // A full 300 s history at a 15 s interval.
    let history = State {
        recommendations: (0..20)
            .map(|i| Recommendation {
                replicas: 10 + i % 3,
                at: Timestamp::from_unix_millis(now.unix_millis() - i64::from(i) * 15_000),
            })
            .collect(),
        ..Default::default()
    };
    c.bench_function("decide/behavior/3_metrics_full_history", |b| {
        b.iter(|| decide(black_box(&behavior), black_box(target), black_box(&readings), black_box(&history), now))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
