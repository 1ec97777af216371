//! Builders shared by the engine's test files: a rule with sane defaults changed by a closure,
//! readings, and times relative to a fixed `now`.
#![allow(dead_code, reason = "every test binary that includes this file uses only part of it")]

use std::time::Duration;

use watermarkd_engine::{Decimal, MetricSpec, Reading, Rule, RuleSpec, Target, Timestamp};

pub const NOW_MS: i64 = 1_714_564_800_000;

pub fn now() -> Timestamp {
    Timestamp::from_unix_millis(NOW_MS)
}

pub fn ago(secs: u64) -> Timestamp {
    Timestamp::from_unix_millis(NOW_MS - i64::try_from(secs * 1000).unwrap())
}

pub fn dec(s: &str) -> Decimal {
    Decimal::parse(s).unwrap()
}

pub fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

pub fn metric(name: &str, low: &str, high: &str) -> MetricSpec {
    MetricSpec {
        name: name.into(),
        low_watermark: Some(dec(low)),
        high_watermark: Some(dec(high)),
        max_age: None,
        activation: None,
    }
}

/// A rule with one metric `m` (low 0.5, high 1), bounds 1..100, generous limits, tolerance 0.
pub fn rule(change: impl FnOnce(&mut RuleSpec)) -> Rule {
    let mut spec = RuleSpec {
        min_replicas: Some(1),
        max_replicas: Some(100),
        tolerance: Some(dec("0")),
        scale_up_limit_factor: Some(dec("1000")),
        scale_down_limit_factor: Some(dec("99")),
        metrics: vec![metric("m", "0.5", "1")],
        ..Default::default()
    };
    change(&mut spec);
    Rule::new(spec).unwrap()
}

pub fn value(v: f64) -> Reading {
    Reading::Value { value: v, at: now() }
}

pub fn unavailable(why: &str) -> Reading {
    Reading::Unavailable { reason: why.into() }
}

pub fn target(spec: u32) -> Target {
    Target { spec_replicas: spec, status_replicas: Some(spec), ready_replicas: Some(spec) }
}

pub fn target_ready(spec: u32, ready: u32) -> Target {
    Target { spec_replicas: spec, status_replicas: Some(spec), ready_replicas: Some(ready) }
}
