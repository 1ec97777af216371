use std::time::Duration;

use serde_json::json;
use watermarkd_engine::{decide, Reading, Rule, State as EngineState, Target};

use super::*;
use crate::domain::outcome::{Identity, SeriesLabels};
use crate::domain::status::history::BLOCK;

/// A ledger keeping `history`, and the board that shows it.
fn board_of(history: Duration) -> (Arc<Ledger>, Board) {
    let ledger = Arc::new(Ledger::new(history));
    (Arc::clone(&ledger), Board::new(ledger))
}

fn labels(name: &str) -> Arc<SeriesLabels> {
    Arc::new(SeriesLabels::deployment(name, "prod", false))
}

fn identity(name: &str, interval_seconds: u64) -> Identity {
    Identity::rules_file(labels(name), &["prom"], interval_seconds, (1, 20))
}

fn rule() -> Rule {
    crate::domain::rules::rule_from_json(&json!({
        "min_replicas": 1, "max_replicas": 20, "algorithm": "absolute",
        "upscale_forbidden_window": "0s", "downscale_forbidden_window": "0s",
        "metric": [{ "name": "load", "query": "q", "high_watermark": 10, "low_watermark": 5 }]
    }))
    .unwrap()
}

/// One evaluation of `name` at second `at` with `spec` replicas and this reading.
fn evaluate(ledger: &Ledger, name: &str, at: i64, spec: u32, reading: Option<f64>) {
    let now = Timestamp::from_unix_millis(at * 1000);
    let reading = match reading {
        Some(value) => Reading::Value { value, at: now },
        None => Reading::Unavailable { reason: "no data".into() },
    };
    let target = Target { spec_replicas: spec, status_replicas: Some(spec), ready_replicas: Some(spec) };
    let decision = decide(&rule(), target, &[reading], &EngineState::default(), now);
    let scaled = decision.action != Action::Hold;
    ledger.record(&format!("file/{name}"), &labels(name), Outcome::of_decision(decision, &rule(), scaled));
}

#[test]
fn the_table_says_each_autoscalers_state_and_filters_and_pages() {
    let (ledger, board) = board_of(Duration::from_secs(3600));
    for name in ["a-busy", "b-calm", "c-quiet", "d-new", "e-up"] {
        ledger.admit(identity(name, 15));
    }
    // 30 asks for 6 and the default 50% limit allows 3; 12 asks for 3.
    evaluate(&ledger, "a-busy", 1_000, 2, Some(30.0));
    evaluate(&ledger, "b-calm", 1_000, 2, Some(7.0));
    evaluate(&ledger, "c-quiet", 1_000, 2, None);
    evaluate(&ledger, "e-up", 1_000, 2, Some(12.0));
    let all = board.list(&ListQuery { limit: 10, ..ListQuery::default() });
    let states: Vec<(&str, State)> = all.autoscalers.iter().map(|s| (s.identity.name.as_ref(), s.state)).collect();
    assert_eq!(
        states,
        [
            ("c-quiet", State::NoData),
            ("a-busy", State::Limited),
            ("e-up", State::Scaling),
            ("d-new", State::Pending),
            ("b-calm", State::Ok)
        ],
        "what needs a look first"
    );
    let by_id = board.list(&ListQuery { by_id: true, limit: 10, ..ListQuery::default() });
    let names: Vec<&str> = by_id.autoscalers.iter().map(|s| s.identity.name.as_ref()).collect();
    assert_eq!(names, ["a-busy", "b-calm", "c-quiet", "d-new", "e-up"]);
    assert!(all.autoscalers[0].metric.as_ref().is_some_and(|m| m.value.is_none()), "no value, never 0");
    let quiet = board.list(&ListQuery { state: Some(State::NoData), limit: 10, ..ListQuery::default() });
    assert_eq!((quiet.matched, quiet.total), (1, 5));
    let searched = board.list(&ListQuery { search: "CALM prod".into(), limit: 10, ..ListQuery::default() });
    assert_eq!(searched.autoscalers.len(), 1);
    let page = board.list(&ListQuery { offset: 4, limit: 2, ..ListQuery::default() });
    assert_eq!((page.matched, page.autoscalers.len()), (5, 1));
    ledger.remove("file/d-new");
    assert_eq!(board.list(&ListQuery { limit: 10, ..ListQuery::default() }).total, 4);
}

#[test]
fn the_history_keeps_an_hour_at_the_interval_and_the_scale_events() {
    let (ledger, board) = board_of(Duration::from_secs(3600));
    ledger.admit(identity("web", 15));
    let mut spec = 2;
    for i in 0..400 {
        let value = if (100..110).contains(&i) { 30.0 } else { 7.0 };
        evaluate(&ledger, "web", 1_000 + i * 15, spec, Some(value));
        if value > 10.0 {
            spec = 6.min(spec + 1);
        }
    }
    let detail = board.detail("file/web").unwrap();
    let samples = &detail.history.samples;
    assert!(samples.len() >= 241 && samples.len() < 241 + usize::from(BLOCK), "{}", samples.len());
    assert_eq!(samples.last().unwrap().at, 1_000 + 399 * 15);
    assert_eq!(samples[0].watermarks, vec![[5.0, 10.0]]);
    // The scale-up happened before the hour kept: not an event any more.
    assert!(detail.history.events.is_empty(), "{:?}", detail.history.events);
    assert_eq!(detail.summary.last_scale, None);
    assert!(ledger.history_bytes() < 241 * 6, "{} bytes", ledger.history_bytes());

    ledger.admit(identity("fresh", 15));
    evaluate(&ledger, "fresh", 1_000, 2, Some(7.0));
    evaluate(&ledger, "fresh", 1_015, 2, Some(30.0));
    evaluate(&ledger, "fresh", 1_030, 3, Some(30.0));
    let events = board.detail("file/fresh").unwrap().history.events;
    assert_eq!(
        events,
        [
            ScaleEvent { at: 1_015, from: 2, to: 3, written: true },
            ScaleEvent { at: 1_030, from: 3, to: 4, written: true }
        ]
    );
}

#[test]
fn a_failed_evaluation_is_failing_until_the_next_decision() {
    let (ledger, board) = board_of(Duration::from_secs(3600));
    ledger.admit(identity("web", 15));
    evaluate(&ledger, "web", 1_000, 2, Some(7.0));
    ledger.failed(
        "file/web",
        &labels("web"),
        Timestamp::from_unix_millis(1_015_000),
        "cannot read the target: forbidden",
    );
    let row = board.list(&ListQuery { limit: 1, ..ListQuery::default() }).autoscalers.remove(0);
    assert_eq!((row.state, row.failing.as_deref()), (State::Failing, Some("cannot read the target: forbidden")));
    // Since the first failure, not the latest.
    ledger.failed(
        "file/web",
        &labels("web"),
        Timestamp::from_unix_millis(1_030_000),
        "cannot read the target: forbidden",
    );
    let row = board.list(&ListQuery { limit: 1, ..ListQuery::default() }).autoscalers.remove(0);
    assert_eq!(row.failing_since, Some(Timestamp::from_unix_millis(1_015_000)));
    let detail = board.detail("file/web").unwrap();
    assert_eq!(detail.history.samples.last().unwrap().marks, vec!["failed"]);
    evaluate(&ledger, "web", 1_045, 2, Some(7.0));
    let detail = board.detail("file/web").unwrap();
    assert_eq!((detail.summary.state, detail.summary.failing_since), (State::Ok, None));
    // Reports for an autoscaler that is not on the board are dropped.
    ledger.failed("file/gone", &labels("gone"), Timestamp::from_unix_millis(0), "x");
    evaluate(&ledger, "gone", 1_000, 2, Some(7.0));
    assert!(board.detail("file/gone").is_none());
}

#[test]
fn without_history_only_the_last_decision_is_kept() {
    let (ledger, board) = board_of(Duration::ZERO);
    ledger.admit(identity("web", 15));
    evaluate(&ledger, "web", 1_000, 2, Some(7.0));
    let detail = board.detail("file/web").unwrap();
    assert!(detail.history.samples.is_empty());
    assert!(detail.last.is_some());
    assert_eq!(ledger.history_bytes(), 0);
}
