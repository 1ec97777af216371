//! Unit tests of the client: building it from its settings, keys kept out of every text, and
//! the bookkeeping of a cycle (what is planned, what is kept for the next).

use super::compile::Askers;
use super::*;
use crate::domain::rules::SecretSource;

fn config(dir: &std::path::Path, url: Option<&str>) -> DatadogBackend {
    std::fs::write(dir.join("api"), "api-secret-123\n").unwrap();
    std::fs::write(dir.join("app"), "app-secret-456\n").unwrap();
    DatadogBackend {
        site: "datadoghq.eu".into(),
        url: url.map(str::to_string),
        api_key: SecretSource::File(dir.join("api")),
        app_key: SecretSource::File(dir.join("app")),
        window: Duration::from_secs(300),
        max_age: None,
        timeout: Duration::from_secs(10),
        max_in_flight: 4,
        bad_query_retry: Duration::from_secs(600),
        allow_insecure_http: false,
        namespace_budget_percent: 100,
        fold_queries: true,
    }
}

#[test]
fn texts_that_folded_nothing_are_not_planned_again_until_they_change() {
    let dir = tempfile::tempdir().unwrap();
    let client = DatadogClient::new("dd", &config(dir.path(), None), Arc::new(BackendMetrics::detached())).unwrap();
    let inner = &client.inner;
    let (from, to) = inner.range(Timestamp::from_unix_millis(1_700_000_000_000));
    let folded = |texts: &[&str]| {
        let Compiled { units, .. } = inner.compile(texts, from, to, Instant::now());
        units.iter().filter(|u| matches!(u, fold::Unit::Folded(_))).count()
    };
    assert_eq!(folded(&["avg:a{app:web-1}", "avg:b{app:web-2}"]), 0);
    let remembered = *lock(&inner.unfoldable);
    assert!(remembered.is_some());
    assert_eq!(folded(&["avg:b{app:web-2}", "avg:a{app:web-1}"]), 0);
    assert_eq!(*lock(&inner.unfoldable), remembered, "the same texts in another order");
    // A text that shares a shape changes the set: planned again, and it folds.
    assert_eq!(folded(&["avg:b{app:web-2}", "avg:a{app:web-1}", "avg:a{app:web-3}"]), 1);
    assert_eq!(*lock(&inner.unfoldable), None);
}

#[test]
fn each_text_knows_the_queries_that_ask_it() {
    let askers = Askers::of(&[0, 1, 0, 2, 1], 3);
    assert_eq!(askers.iter().collect::<Vec<_>>(), [&[0, 2][..], &[1, 4], &[3]]);
    assert_eq!(askers.of_text(3), &[] as &[usize]);
    assert_eq!(Askers::of(&[], 0).iter().count(), 0);
}

#[test]
fn a_value_is_kept_only_if_the_next_cycle_can_use_it() {
    let dir = tempfile::tempdir().unwrap();
    let client = DatadogClient::new("dd", &config(dir.path(), None), Arc::new(BackendMetrics::detached())).unwrap();
    let inner = &client.inner;
    let t = |s: i64| Timestamp::from_unix_millis(1_700_000_000_000 + s * 1000);
    // A point at t(-30) with a 30 s rollup cannot change before t(30).
    let detail = ObservationDetail { interval_seconds: Some(30), ..ObservationDetail::default() };
    let read = Observation::value(1.0, t(-30), detail);
    assert_eq!(inner.cycle_gap(t(0)), None, "no cycle before the first");
    inner.note_current(std::iter::once(("q", Some(&read))), t(0));
    assert_eq!(lock(&inner.current).len(), 1, "the first cycle keeps what it may use");
    // Cycles 40 s apart: the next one comes after t(30), so nothing is worth keeping.
    assert_eq!(inner.cycle_gap(t(40)), Some(Duration::from_secs(40)));
    inner.note_current(std::iter::once(("q", Some(&read))), t(80));
    assert!(lock(&inner.current).is_empty());
    // 15 s apart: kept for the next.
    assert_eq!(inner.cycle_gap(t(55)), Some(Duration::from_secs(15)));
    inner.note_current(std::iter::once(("q", Some(&read))), t(20));
    assert_eq!(lock(&inner.current).len(), 1);
    assert_eq!(inner.cycle_gap(t(50)), None, "the clock went back");
}

#[test]
fn the_counted_plan_is_the_plan_counted() {
    let dir = tempfile::tempdir().unwrap();
    let client = DatadogClient::new("dd", &config(dir.path(), None), Arc::new(BackendMetrics::detached())).unwrap();
    let texts = [
        "avg:x{team:a,app:web-1}",
        "avg:x{team:a,app:web-2}",
        "avg:x{team:a,app:web-1}",
        "avg:y{team:a,app:web-1}",
        "sum:z{*}",
    ];
    let queries: Vec<MetricQuery> = texts.iter().map(|t| MetricQuery { query: t.to_string(), reducer: None }).collect();
    let now = Timestamp::from_unix_millis(1_700_000_000_000);
    let plan = client.plan(&queries, now);
    let Distinct { texts: distinct, askers, .. } = Distinct::of(&queries);
    let (from, to) = client.inner.range(now);
    let Compiled { units, planned, .. } = client.inner.compile(&distinct, from, to, Instant::now());
    let counted = plan_counts(&planned, &units, |q| askers.of_text(q).len());
    assert_eq!(counted, plan.counts());
    assert_eq!((counted.folded, counted.unfolded), (3, 2));
}

#[test]
fn the_base_url_comes_from_the_site_unless_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(BackendMetrics::detached());
    let client = DatadogClient::new("dd", &config(dir.path(), None), metrics.clone()).unwrap();
    assert_eq!(client.inner.v1_endpoint(), "https://api.datadoghq.eu/api/v1/query");
    let err =
        DatadogClient::new("dd", &config(dir.path(), Some("http://proxy:8080/dd/")), metrics.clone()).err().unwrap();
    assert!(err.to_string().contains("allow_insecure_http"), "{err}");
    let mut insecure = config(dir.path(), Some("http://proxy:8080/dd/"));
    insecure.allow_insecure_http = true;
    let client = DatadogClient::new("dd", &insecure, metrics).unwrap();
    assert_eq!(client.inner.v1_endpoint(), "http://proxy:8080/dd/api/v1/query");
    assert!(client.rate_limit().is_none());
}

#[test]
fn a_missing_key_is_a_secret_error_naming_only_where_it_was_looked_for() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), None);
    c.app_key = SecretSource::Env("WATERMARKD_TEST_NO_SUCH_DATADOG_APP_KEY".into());
    let err = DatadogClient::new("dd", &c, Arc::new(BackendMetrics::detached())).err().unwrap();
    assert!(matches!(err, BackendError::Secret { .. }));
    assert!(err.to_string().contains("WATERMARKD_TEST_NO_SUCH_DATADOG_APP_KEY"));
    c.url = Some("ftp://x".into());
    c.app_key = SecretSource::File(dir.path().join("app"));
    assert!(matches!(
        DatadogClient::new("dd", &c, Arc::new(BackendMetrics::detached())),
        Err(BackendError::Invalid { .. })
    ));
}

#[test]
fn texts_are_scrubbed_of_both_keys() {
    let dir = tempfile::tempdir().unwrap();
    let client = DatadogClient::new("dd", &config(dir.path(), None), Arc::new(BackendMetrics::detached())).unwrap();
    let observation = client
        .inner
        .scrub(Observation::unavailable(QueryError::BadQuery("key api-secret-123 / app-secret-456".into())));
    assert_eq!(observation.detail.error, Some(QueryError::BadQuery("key [redacted] / [redacted]".into())));
    assert!(!format!("{observation:?}").contains("secret-"));
}

#[tokio::test]
async fn queries_that_cannot_be_sent_are_answered_without_a_request() {
    let dir = tempfile::tempdir().unwrap();
    // Port 9 (discard) on loopback: any request would fail as Transport, not BadQuery.
    let client =
        DatadogClient::new("dd", &config(dir.path(), Some("http://127.0.0.1:9")), Arc::new(BackendMetrics::detached()))
            .unwrap();
    let q = |s: &str| MetricQuery { query: s.into(), reducer: None };
    let out = client
        .evaluate(
            &[q(""), q("a{*},b{*}"), q(&"x".repeat(MAX_URL_CHARS))],
            Timestamp::from_unix_millis(0),
            Instant::now() + Duration::from_secs(20),
        )
        .await;
    assert!(out.iter().all(|o| matches!(o.detail.error, Some(QueryError::BadQuery(_)))), "{out:?}");
}
