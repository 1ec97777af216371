//! The Datadog client against recorded answers and against a fake API over real HTTP on
//! 127.0.0.1: parsing, point selection, every fault mode, batching and pacing.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "test code: clippy.toml lets #[test] functions unwrap, index and print, and the helpers beside them do the same"
)]

#[path = "support/fake_datadog.rs"]
mod fake_datadog;
#[path = "support/redirect_servers.rs"]
mod redirect_servers;

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tempfile::TempDir;
use tokio::time::Instant;
use watermarkd::adapters::backend::datadog::DatadogClient;
use watermarkd::adapters::backend::{MetricQuery, Observation, ObservationDetail, QueryError};
use watermarkd::adapters::telemetry::BackendMetrics;
use watermarkd::domain::rules::{DatadogBackend, SecretSource};
use watermarkd::testing::datadog::{read_v1_answer, RateLimitHeaders, RequestOutcome, V1Answer, V1Context};
use watermarkd::testing::rate_limit_headers;
use watermarkd_engine::{Reading, Timestamp};

use fake_datadog::{Behavior, Budget, FakeDatadog, SeriesSpec, API_KEY, APP_KEY};
use redirect_servers::{Recorder, Redirector};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/datadog");
/// The cycles' wall-clock time at the start of each test: a multiple of 30 s, so buckets align.
const T0_MS: i64 = 1_700_000_010_000;

// ---------------------------------------------------------------------------------------------
// Helpers

struct Setup {
    client: DatadogClient,
    metrics: Arc<BackendMetrics>,
    keys: TempDir,
}

fn config_for(url: &str, keys: &TempDir) -> DatadogBackend {
    DatadogBackend {
        site: "datadoghq.com".into(),
        url: Some(url.to_string()),
        api_key: SecretSource::File(keys.path().join("api")),
        app_key: SecretSource::File(keys.path().join("app")),
        window: Duration::from_secs(300),
        max_age: None,
        timeout: Duration::from_secs(10),
        max_in_flight: 4,
        bad_query_retry: Duration::from_secs(600),
        allow_insecure_http: false,
        namespace_budget_percent: 100,
        // The batching and pacing tests ask per-deployment queries, which would fold; folding
        // has its own tests (`setup_folding`).
        fold_queries: false,
    }
}

fn setup_with(url: &str, api: &str, app: &str, tweak: impl FnOnce(&mut DatadogBackend)) -> Setup {
    let keys = tempfile::tempdir().unwrap();
    std::fs::write(keys.path().join("api"), format!("{api}\n")).unwrap();
    std::fs::write(keys.path().join("app"), format!("{app}\n")).unwrap();
    let mut config = config_for(url, &keys);
    tweak(&mut config);
    let metrics = Arc::new(BackendMetrics::detached());
    let client = DatadogClient::new("dd", &config, metrics.clone()).unwrap();
    Setup { client, metrics, keys }
}

fn setup(fake: &FakeDatadog) -> Setup {
    setup_with(&fake.url, API_KEY, APP_KEY, |_| {})
}

fn setup_folding(fake: &FakeDatadog) -> Setup {
    setup_with(&fake.url, API_KEY, APP_KEY, |c| c.fold_queries = true)
}

fn q(text: &str) -> MetricQuery {
    MetricQuery { query: text.to_string(), reducer: None }
}

fn qs(texts: &[String]) -> Vec<MetricQuery> {
    texts.iter().map(|t| q(t)).collect()
}

/// The deadline a cycle starting now gets in these tests: twice the client's timeout.
fn by(client: &DatadogClient) -> Instant {
    Instant::now() + client.timeout() * 2
}

fn t0() -> Timestamp {
    Timestamp::from_unix_millis(T0_MS)
}

/// The cycle time `elapsed` after `start` on the (possibly paused) tokio clock.
fn now_since(start: Instant) -> Timestamp {
    Timestamp::from_unix_millis(T0_MS + i64::try_from(start.elapsed().as_millis()).unwrap())
}

fn ms_ago(seconds: i64) -> Timestamp {
    Timestamp::from_unix_millis(T0_MS - seconds * 1000)
}

fn error(o: &Observation) -> QueryError {
    o.detail.error.clone().unwrap_or_else(|| panic!("expected an error, got {o:?}"))
}

fn value(o: &Observation) -> (f64, Timestamp) {
    match o.reading {
        Reading::Value { value, at } => (value, at),
        _ => panic!("expected a value, got {o:?}"),
    }
}

fn requests(metrics: &BackendMetrics, outcome: &str) -> u64 {
    metrics.requests.with_label_values(&["dd", outcome]).get()
}

/// A realistic ~60-character autoscaler query.
fn realistic_query(i: usize) -> String {
    format!("avg:kubernetes.cpu.usage.total{{kube_deployment:web-{i:04},env:prod}}")
}

// ---------------------------------------------------------------------------------------------
// Recorded answers

struct Fixture {
    status: u16,
    headers: RateLimitHeaders,
    body: String,
}

fn fixture(name: &str) -> Fixture {
    let text = std::fs::read_to_string(format!("{FIXTURES}/{name}")).unwrap();
    let json: Value = serde_json::from_str(&text).unwrap();
    let response = &json["response"];
    let headers = response["headers"].as_object().unwrap();
    let headers = rate_limit_headers(headers.iter().map(|(k, v)| (k.as_str(), v.as_str().unwrap())));
    // The recorded body text: a string when it is not JSON, else the JSON text itself, taken
    // from the file as written (re-serializing would round the floats twice).
    let body = match &response["body"] {
        Value::String(s) => s.clone(),
        _ => raw_response_body(&text).to_string(),
    };
    Fixture { status: u16::try_from(response["status"].as_u64().unwrap()).unwrap(), headers, body }
}

/// The text of the response's `body` value: the last `"body":` key of the file, up to the end of
/// its balanced JSON value.
fn raw_response_body(text: &str) -> &str {
    let start = text.rfind("\"body\":").unwrap() + "\"body\":".len();
    let rest = text[start..].trim_start();
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for (i, c) in rest.char_indices() {
        match (in_string, c) {
            (true, _) if escaped => escaped = false,
            (true, '\\') => escaped = true,
            (true, '"') => in_string = false,
            (true, _) => {}
            (false, '"') => in_string = true,
            (false, '{' | '[') => depth += 1,
            (false, '}' | ']') => {
                depth -= 1;
                if depth == 0 {
                    return &rest[..=i];
                }
            }
            _ => {}
        }
    }
    panic!("unterminated body")
}

/// Exactly the recorded number: serde_json's `float_roundtrip` parses the decimal text to the
/// nearest float, which is what the engine's exact decimal arithmetic starts from.
fn assert_reading(actual: &Reading, value: f64, at_ms: i64) {
    let Reading::Value { value: got, at } = actual else { panic!("expected a value, got {actual:?}") };
    assert_eq!(got.to_bits(), value.to_bits(), "{got} != {value}");
    assert_eq!(*at, Timestamp::from_unix_millis(at_ms));
}

fn read_v1_fixture(name: &str, now_ms: i64) -> (Fixture, V1Answer) {
    let f = fixture(name);
    let cx = V1Context {
        queries: 1,
        layout: &[],
        now: Timestamp::from_unix_millis(now_ms),
        max_age: None,
        site: "datadoghq.com",
    };
    let answer = read_v1_answer(f.status, &f.headers, f.body.as_bytes(), &cx);
    (f, answer)
}

fn one(answer: V1Answer) -> Observation {
    match answer {
        V1Answer::Answered(mut observations) => {
            assert_eq!(observations.len(), 1);
            observations.remove(0)
        }
        V1Answer::Failed { error, .. } => panic!("failed: {error}"),
    }
}

fn detail(points: usize, chosen: usize, interval: u64) -> ObservationDetail {
    ObservationDetail {
        series: Some(1),
        points: Some(points),
        chosen_point: Some(chosen),
        interval_seconds: Some(interval),
        ..ObservationDetail::default()
    }
}

#[test]
fn every_recorded_answer_parses_to_the_expected_reading_or_error() {
    let covered = RefCell::new(BTreeSet::new());
    let cover = |name: &'static str| {
        covered.borrow_mut().insert(name.to_string());
        name
    };

    // v1, one series of 288 five-minute points; judged at the query's `to`.
    let (f, answer) = read_v1_fixture(cover("v1_query_ok.json"), 1_641_430_252_000);
    let o = one(answer);
    assert_reading(&o.reading, 92.05671568477855, 1_641_429_900_000);
    assert_eq!(o.detail, detail(288, 286, 300));
    assert!(f.headers.is_empty(), "recordings from 2022 on kept no rate-limit headers");
    // An hour later the same answer is stale (max(120 s, 3 x 300 s) = 900 s).
    let (_, answer) = read_v1_fixture("v1_query_ok.json", 1_641_430_252_000 + 3_600_000);
    assert_eq!(error(&one(answer)), QueryError::Stale { age_seconds: 3_952, max_age_seconds: 900 });

    // Float millisecond timestamps, and the rate-limit headers.
    let (f, answer) = read_v1_fixture(cover("v1_query_ok_ratelimit_headers.json"), 1_623_932_501_000);
    assert_reading(&one(answer).reading, 94.34899172465006, 1_623_932_100_000);
    assert_eq!(
        f.headers,
        RateLimitHeaders {
            limit: Some(1600),
            period: Some(3600),
            remaining: Some(1597),
            reset: Some(2299),
            name: None
        }
    );

    // A 4-hour rollup: 3 x 14,400 s allows the 7-hour-old penultimate point.
    let (f, answer) = read_v1_fixture(cover("v1_query_ok_interval_14400.json"), 1_614_553_200_000);
    let o = one(answer);
    assert_reading(&o.reading, 94.17609790127209, 1_614_528_000_000);
    assert_eq!(o.detail, detail(168, 166, 14_400));
    assert_eq!(f.headers.remaining, Some(1599));

    // Two points at a 1 s rollup: the first is the penultimate. At the query's `to` it is 160 s
    // old, beyond max(120 s, 3 x 1 s); at the series' end it is fresh.
    for (name, first_ms, end_ms, to_ms, limit) in [
        ("v1_query_ok_group_by_host.json", 1_618_221_135_000, 1_618_221_195_000, 1_618_221_295_000, 1600),
        ("v1_query_ok_no_tag_set.json", 1_582_121_428_000, 1_582_121_488_000, 1_582_121_588_000, 600),
    ] {
        cover(name);
        let (f, answer) = read_v1_fixture(name, to_ms);
        let o = one(answer);
        assert_eq!(error(&o), QueryError::Stale { age_seconds: 160, max_age_seconds: 120 }, "{name}");
        assert_eq!(o.detail.interval_seconds, Some(1));
        let (_, answer) = read_v1_fixture(name, end_ms);
        let o = one(answer);
        assert_eq!(o.reading, Reading::Value { value: 10.5, at: Timestamp::from_unix_millis(first_ms) }, "{name}");
        assert_eq!(o.detail, detail(2, 0, 1));
        assert_eq!(f.headers.limit, Some(limit));
    }

    // 403: a configuration error that says what to check; never retried.
    let (_, answer) = read_v1_fixture(cover("v1_query_403.json"), 0);
    let V1Answer::Failed { error: QueryError::Configuration(message), outcome, retryable } = answer else {
        panic!("403 must be a configuration error")
    };
    assert_eq!((outcome, retryable), (RequestOutcome::Forbidden, false));
    for needle in ["Forbidden", "API key", "application key", "timeseries_query", "datadoghq.com"] {
        assert!(message.contains(needle), "{needle:?} missing from {message:?}");
    }

    // Every fixture in the directory was checked above.
    let present: BTreeSet<String> = std::fs::read_dir(FIXTURES)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".json"))
        .collect();
    assert_eq!(present, covered.into_inner(), "a fixture without expectations");
}

// ---------------------------------------------------------------------------------------------
// Reading values over HTTP

#[tokio::test]
async fn the_penultimate_non_null_point_is_used_with_its_own_time() {
    let fake = FakeDatadog::start().await;
    let s = setup(&fake);
    // Dense 30 s buckets over the 300 s window, newest bucket still empty (the fake's default):
    // bucket k holds 100 + k, k = 0..=10; the last non-null is k = 9, the penultimate k = 8.
    fake.set("avg:dense{*}", Behavior::Series(SeriesSpec::default()));
    // Explicit points with a null gap between them.
    fake.set(
        "avg:gappy{*}",
        Behavior::Points {
            interval: 30,
            points: vec![(150, Some(1.0)), (120, Some(2.0)), (90, None), (60, Some(3.0)), (30, Some(4.0)), (0, None)],
        },
    );
    // Every third bucket null as well.
    fake.set(
        "avg:holes{*}",
        Behavior::Series(SeriesSpec { gap_every: Some(3), trailing_nulls: 2, ..SeriesSpec::default() }),
    );
    let out = s.client.evaluate(&[q("avg:dense{*}"), q("avg:gappy{*}"), q("avg:holes{*}")], t0(), by(&s.client)).await;
    assert_eq!(fake.requests(), 1, "three queries, one request");

    assert_eq!(value(&out[0]), (108.0, ms_ago(60)));
    assert_eq!(out[0].detail, detail(10, 8, 30));
    assert_eq!(value(&out[1]), (3.0, ms_ago(60)));
    assert_eq!(out[1].detail, detail(4, 2, 30));
    // Buckets k = 0..=8 (k = 9, 10 null); k = 2, 5, 8 are gaps: non-null 0,1,3,4,6,7 -> 6.
    assert_eq!(value(&out[2]), (106.0, ms_ago(120)));
    assert_eq!(out[2].detail, detail(6, 4, 30));
}

#[tokio::test]
async fn old_points_are_stale_by_rollup_or_by_the_configured_bound() {
    let fake = FakeDatadog::start().await;
    fake.set("avg:old{*}", Behavior::Points { interval: 30, points: vec![(270, Some(1.0)), (240, Some(2.0))] });
    fake.set("avg:slow{*}", Behavior::Points { interval: 60, points: vec![(150, Some(5.0)), (30, Some(6.0))] });
    let s = setup(&fake);
    let out = s.client.evaluate(&[q("avg:old{*}"), q("avg:slow{*}")], t0(), by(&s.client)).await;
    assert_eq!(error(&out[0]), QueryError::Stale { age_seconds: 270, max_age_seconds: 120 });
    assert_eq!(out[0].detail.chosen_point, Some(0), "the detail says which point was judged");
    // A 60 s rollup allows 180 s.
    assert_eq!(value(&out[1]), (5.0, ms_ago(150)));
    assert!(matches!(out[0].reading, Reading::Unavailable { ref reason } if reason.starts_with("stale")));

    let lenient = setup_with(&fake.url, API_KEY, APP_KEY, |c| c.max_age = Some(Duration::from_secs(600)));
    let out = lenient.client.evaluate(&[q("avg:old{*}")], t0(), by(&lenient.client)).await;
    assert_eq!(value(&out[0]), (1.0, ms_ago(270)));
    let strict = setup_with(&fake.url, API_KEY, APP_KEY, |c| c.max_age = Some(Duration::from_secs(100)));
    let out = strict.client.evaluate(&[q("avg:slow{*}")], t0(), by(&strict.client)).await;
    assert_eq!(error(&out[0]), QueryError::Stale { age_seconds: 150, max_age_seconds: 100 });
}

#[tokio::test]
async fn identical_queries_are_asked_once_and_answered_everywhere() {
    let fake = FakeDatadog::start().await;
    let s = setup(&fake);
    let queries = [q("avg:a{*}"), q("avg:b{x:1,y:2}"), q("avg:a{*}"), q("avg:a{*}")];
    let out = s.client.evaluate(&queries, t0(), by(&s.client)).await;
    assert_eq!(out.len(), 4);
    assert!(out.iter().all(|o| matches!(o.reading, Reading::Value { .. })), "{out:?}");
    let log = fake.log();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].sub_queries, vec!["avg:a{*}".to_string(), "avg:b{x:1,y:2}".to_string()]);
    assert_eq!(out[0], out[2]);
    assert_eq!(out[0], out[3]);
}

#[tokio::test]
async fn rate_limit_headers_are_exported_and_readable() {
    let fake = FakeDatadog::with_budget(Budget { limit: 500, ..Budget::default() }).await;
    let s = setup(&fake);
    assert!(s.client.rate_limit().is_none());
    s.client.evaluate(&[q("avg:a{*}")], t0(), by(&s.client)).await;
    let snapshot = s.client.rate_limit().unwrap();
    assert_eq!((snapshot.limit, snapshot.remaining, snapshot.period_seconds), (500, 499, 3600));
    assert!(snapshot.reset_seconds > 3590 && snapshot.reset_seconds <= 3601, "{snapshot:?}");
    assert_eq!(snapshot.name.as_deref(), Some("query"));
    let gauge = |field: &str| s.metrics.rate_limit.with_label_values(&["dd", field]).get();
    assert_eq!((gauge("limit"), gauge("remaining")), (500, 499));
    assert!(gauge("reset_seconds") > 3590);
    assert_eq!(requests(&s.metrics, "ok"), 1);
    assert_eq!(s.metrics.request_seconds.with_label_values(&["dd"]).get_sample_count(), 1);
}

// ---------------------------------------------------------------------------------------------
// Fault modes

/// What a fault mode's error must look like.
type Expect = fn(&QueryError) -> bool;

#[tokio::test(start_paused = true)]
async fn every_fault_mode_is_classified() {
    let fake = FakeDatadog::start().await;
    let s = setup_with(&fake.url, API_KEY, APP_KEY, |c| c.timeout = Duration::from_secs(2));
    fake.set("avg:none{*}", Behavior::NoData);
    fake.set("avg:many{*} by {host}", Behavior::Several(3));
    fake.set("avg:nulls{*}", Behavior::Series(SeriesSpec { trailing_nulls: 100, ..SeriesSpec::default() }));

    // Per-query faults share a request with good queries and do not spoil them.
    let out = s
        .client
        .evaluate(
            &[q("avg:none{*}"), q("avg:many{*} by {host}"), q("avg:nulls{*}"), q("avg:ok{*}")],
            t0(),
            by(&s.client),
        )
        .await;
    assert!(matches!(error(&out[0]), QueryError::NoData(_)));
    assert_eq!(error(&out[1]), QueryError::SeveralSeries { count: 3 });
    assert_eq!(out[1].detail.series, Some(3));
    assert!(matches!(error(&out[2]), QueryError::NoData(m) if m.contains("null")));
    assert_eq!(value(&out[3]).0, 108.0);
    assert_eq!(fake.requests(), 1);

    // Request-level faults, each in a request with a good query.
    let mut cases: Vec<(&str, Behavior, Expect, &str)> = vec![
        (
            "avg:unprocessable{*}",
            Behavior::Unprocessable,
            |e| matches!(e, QueryError::NoData(m) if m.contains("422")),
            "no_data",
        ),
        ("avg:garbage{*}", Behavior::Garbage, |e| matches!(e, QueryError::Protocol(_)), "protocol"),
        (
            "avg:failing{*}",
            Behavior::StatusError("Internal error while running the query".into()),
            // Server-side, not a bad query: the query is not suppressed, the next cycle asks again.
            |e| matches!(e, QueryError::Server(m) if m.ends_with("Internal error while running the query")),
            "server_error",
        ),
        (
            "avg:down{*}",
            Behavior::ServerError { status: 502, times: 1000 },
            |e| matches!(e, QueryError::Server(m) if m == "HTTP 502"),
            "server_error",
        ),
        ("avg:slow{*}", Behavior::Delay(Duration::from_secs(60)), |e| matches!(e, QueryError::Timeout(2)), "timeout"),
    ];
    for (query, behavior, expected, outcome) in cases.drain(..) {
        // Let the pacing allow the next cycle.
        tokio::time::sleep(Duration::from_secs(15)).await;
        fake.set(query, behavior);
        let before = fake.arrivals();
        let counted_before = requests(&s.metrics, outcome);
        let started = Instant::now();
        let out = s.client.evaluate(&[q(query), q("avg:good{*}")], now_since(started), by(&s.client)).await;
        // `status: error` (like every request-level fault) fails every query of its request.
        for o in &out {
            assert!(expected(&error(o)), "{query}: {:?}", o.detail.error);
        }
        let sent = fake.arrivals() - before;
        let counted = requests(&s.metrics, outcome) - counted_before;
        println!("{query}: {sent} request(s), {:?} of cycle time", started.elapsed());
        match (query, outcome) {
            // Retried with backoff until the cycle deadline of 2 x timeout (4 s here): at least
            // three retries fit whatever the jitter, a fourth when it is small.
            ("avg:down{*}", _) => assert!((4..=5).contains(&sent), "retried until the deadline: {sent}"),
            // 2 s, a backoff, then what is left of the 4 s.
            (_, "timeout") => assert_eq!(sent, 2, "the second attempt is cut at the deadline"),
            _ => assert_eq!(sent, 1, "{query}: not retried"),
        }
        assert_eq!(counted as usize, sent);
        assert!(started.elapsed() <= Duration::from_secs(4), "{query}: the cycle overran its deadline");
    }

    // Nothing listening: a transport error after retries.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    let unreachable = setup_with(&closed, API_KEY, APP_KEY, |c| c.timeout = Duration::from_secs(2));
    let out = unreachable.client.evaluate(&[q("avg:a{*}")], t0(), by(&unreachable.client)).await;
    assert!(matches!(error(&out[0]), QueryError::Transport(m) if m.contains("onnect")), "{out:?}");
    assert!(requests(&unreachable.metrics, "transport") >= 2, "connection failures are retried");

    // A 429 (the organisation's budget spent by someone else).
    tokio::time::sleep(Duration::from_secs(15)).await;
    fake.exhaust();
    let out = s.client.evaluate(&[q("avg:a{*}")], now_since(Instant::now()), by(&s.client)).await;
    assert!(
        matches!(error(&out[0]), QueryError::RateLimited { reset_in_seconds } if reset_in_seconds > 3000),
        "{out:?}"
    );
    assert_eq!(requests(&s.metrics, "rate_limited"), 1);
    assert_eq!(fake.count_status(429), 1);
}

#[tokio::test]
async fn a_403_says_what_to_check_and_is_not_retried() {
    let fake = FakeDatadog::start().await;
    let s = setup_with(&fake.url, "wrong-api-key-value", APP_KEY, |c| c.site = "datadoghq.eu".into());
    let out = s.client.evaluate(&[q("avg:a{*}"), q("avg:b{*}")], t0(), by(&s.client)).await;
    for o in &out {
        let QueryError::Configuration(message) = error(o) else { panic!("{o:?}") };
        assert!(message.contains("API key is valid"), "{message}");
        assert!(message.contains("`timeseries_query` scope"), "{message}");
        assert!(message.contains(&fake.url), "names where the request went: {message}");
        let Reading::Unavailable { reason } = &o.reading else { panic!() };
        assert!(
            reason.starts_with("configuration error: Datadog refused the credentials (HTTP 403: Forbidden)"),
            "{reason}"
        );
    }
    assert_eq!(fake.requests(), 1, "a 403 is not worth a hot retry");
    assert_eq!(requests(&s.metrics, "forbidden"), 1);
    // The wrong application key is refused the same way.
    let s = setup_with(&fake.url, API_KEY, "wrong-app-key", |_| {});
    let out = s.client.evaluate(&[q("avg:a{*}")], t0(), by(&s.client)).await;
    assert!(matches!(error(&out[0]), QueryError::Configuration(_)));
}

#[tokio::test(start_paused = true)]
async fn a_bad_query_in_a_batch_fails_only_that_query() {
    let fake = FakeDatadog::start().await;
    let s = setup(&fake);
    fake.set("avgg:typo{*}", Behavior::BadQuery);
    let queries = [q("avg:one{*}"), q("avgg:typo{*}"), q("avg:two{*}"), q("avg:three{*}")];
    let out = s.client.evaluate(&queries, t0(), by(&s.client)).await;
    assert!(matches!(error(&out[1]), QueryError::BadQuery(m) if m.contains("Error parsing query")), "{out:?}");
    for i in [0, 2, 3] {
        assert_eq!(value(&out[i]).0, 108.0, "query {i}");
    }
    // The batch, then each of its four queries alone, once.
    assert_eq!(fake.requests(), 5);
    assert_eq!(fake.count_status(400), 2);
    assert_eq!(requests(&s.metrics, "bad_query"), 2);
    assert_eq!(requests(&s.metrics, "ok"), 3);

    // Next cycle: the known bad query is kept out of the batch, the others cost one request.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let before = fake.requests();
    let out = s.client.evaluate(&queries, t0(), by(&s.client)).await;
    assert!(matches!(error(&out[1]), QueryError::BadQuery(_)));
    assert_eq!(value(&out[2]).0, 108.0);
    assert_eq!(fake.requests() - before, 1);
    assert_eq!(fake.log().last().unwrap().sub_queries.len(), 3);
}

fn suppressed(metrics: &BackendMetrics) -> i64 {
    metrics.suppressed_queries.with_label_values(&["dd"]).get()
}

#[tokio::test(start_paused = true)]
async fn a_suppressed_query_is_counted_and_asked_again_after_bad_query_retry() {
    let fake = FakeDatadog::start().await;
    let s = setup_with(&fake.url, API_KEY, APP_KEY, |c| c.bad_query_retry = Duration::from_secs(60));
    fake.set("avgg:typo{*}", Behavior::BadQuery);
    let queries = [q("avg:one{*}"), q("avgg:typo{*}")];
    assert_eq!(suppressed(&s.metrics), 0);
    let out = s.client.evaluate(&queries, t0(), by(&s.client)).await;
    assert!(matches!(error(&out[1]), QueryError::BadQuery(_)), "{out:?}");
    assert_eq!(suppressed(&s.metrics), 1, "the rejected query is exported as suppressed");

    // Within bad_query_retry it is answered without being asked.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let out = s.client.evaluate(&queries, t0(), by(&s.client)).await;
    assert!(matches!(error(&out[1]), QueryError::BadQuery(_)));
    assert!(!fake.log().last().unwrap().sub_queries.contains(&"avgg:typo{*}".to_string()));
    assert_eq!(suppressed(&s.metrics), 1);

    // Fixed on Datadog's side (say, the metric now exists): after bad_query_retry it is asked
    // again, gets its value, and is no longer counted.
    fake.set("avgg:typo{*}", Behavior::Series(SeriesSpec::constant(5.0)));
    tokio::time::sleep(Duration::from_secs(31)).await;
    let out = s.client.evaluate(&queries, t0(), by(&s.client)).await;
    assert_eq!(value(&out[1]).0, 5.0, "{out:?}");
    assert!(fake.log().last().unwrap().sub_queries.contains(&"avgg:typo{*}".to_string()));
    assert_eq!(suppressed(&s.metrics), 0);
}

#[tokio::test(start_paused = true)]
async fn a_cycle_ends_by_its_deadline_whatever_the_retries() {
    // The defaults: a 10 s timeout, and an autoscaler every 15 s, whose cycle gets a deadline
    // of 14 s. A backend answering after 12 s: the first attempt times out at 10 s, the retry
    // gets what is left, and the cycle is over by its deadline with a timeout.
    let fake = FakeDatadog::start().await;
    let s = setup(&fake);
    fake.set("avg:slow{*}", Behavior::Delay(Duration::from_secs(12)));
    let deadline = Instant::now() + Duration::from_secs(14);
    let out = s.client.evaluate(&[q("avg:slow{*}"), q("avg:ok{*}")], t0(), deadline).await;
    assert!(Instant::now() <= deadline, "the cycle ran {:?} past its deadline", Instant::now() - deadline);
    assert!(out.iter().all(|o| matches!(error(o), QueryError::Timeout(_))), "{out:?}");
    assert_eq!(fake.arrivals(), 2, "a retry with the time that was left");

    // Instant 5xx answers with a 2 s interval: retried while time is left, over by the deadline.
    tokio::time::sleep(Duration::from_secs(15)).await;
    fake.set("avg:down{*}", Behavior::ServerError { status: 503, times: 1_000 });
    let deadline = Instant::now() + Duration::from_millis(1_800);
    let out = s.client.evaluate(&[q("avg:down{*}")], t0(), deadline).await;
    assert!(Instant::now() <= deadline);
    assert!(matches!(error(&out[0]), QueryError::Server(_)), "{out:?}");

    // Deadline-based, not count-based: six failures in a row, then an answer, all in time.
    tokio::time::sleep(Duration::from_secs(15)).await;
    fake.set("avg:flaky{*}", Behavior::ServerError { status: 503, times: 6 });
    let deadline = Instant::now() + Duration::from_secs(60);
    let out = s.client.evaluate(&[q("avg:flaky{*}")], t0(), deadline).await;
    assert_eq!(value(&out[0]).0, 108.0, "{out:?}");

    // A cycle whose deadline has already passed sends nothing.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let before = fake.arrivals();
    let out = s.client.evaluate(&[q("avg:ok{*}")], t0(), Instant::now()).await;
    assert!(matches!(error(&out[0]), QueryError::Timeout(_)), "{out:?}");
    assert_eq!(fake.arrivals(), before);
}

#[tokio::test]
async fn queries_that_would_spoil_a_batch_are_refused_before_sending() {
    let fake = FakeDatadog::start().await;
    let s = setup(&fake);
    let queries =
        [q("avg:a{*},avg:b{*}"), q("avg:broken{*"), q("top(avg:c{*} by {host}, 10, 'mean', 'desc')"), q("avg:d{*}")];
    let out = s.client.evaluate(&queries, t0(), by(&s.client)).await;
    assert!(matches!(error(&out[0]), QueryError::BadQuery(m) if m.contains("comma")));
    // Unclosed, its brace would make the next queries' commas look nested to Datadog.
    assert!(matches!(error(&out[1]), QueryError::BadQuery(m) if m.contains("unbalanced")));
    // Commas inside functions are not top-level: that query is sent, and the fake splits it
    // the same way.
    assert!(matches!(out[2].reading, Reading::Value { .. }), "{out:?}");
    assert!(matches!(out[3].reading, Reading::Value { .. }), "{out:?}");
    assert_eq!(fake.log()[0].sub_queries.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn server_errors_are_retried_with_backoff_then_succeed() {
    let fake = FakeDatadog::start().await;
    let s = setup(&fake);
    fake.set("avg:flaky{*}", Behavior::ServerError { status: 503, times: 2 });
    let started = Instant::now();
    let out = s.client.evaluate(&[q("avg:flaky{*}")], t0(), by(&s.client)).await;
    assert_eq!(value(&out[0]).0, 108.0);
    let log = fake.log();
    assert_eq!(log.iter().map(|r| r.status).collect::<Vec<_>>(), vec![503, 503, 200]);
    // Backoff: 250 ms then 500 ms, each plus up to 100 % jitter.
    let gaps: Vec<Duration> = log.windows(2).map(|w| w[1].at - w[0].at).collect();
    assert!(gaps[0] >= Duration::from_millis(250) && gaps[0] <= Duration::from_millis(500), "{gaps:?}");
    assert!(gaps[1] >= Duration::from_millis(500) && gaps[1] <= Duration::from_millis(1000), "{gaps:?}");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!((requests(&s.metrics, "server_error"), requests(&s.metrics, "ok")), (2, 1));
}

#[tokio::test(start_paused = true)]
async fn requests_in_flight_are_bounded() {
    let fake = FakeDatadog::start().await;
    fake.set_default(Behavior::Delay(Duration::from_secs(1)));
    let s = setup_with(&fake.url, API_KEY, APP_KEY, |c| c.max_in_flight = 2);
    let texts: Vec<String> = (0..200).map(realistic_query).collect();
    let out = s.client.evaluate(&qs(&texts), t0(), by(&s.client)).await;
    assert!(
        out.iter().all(|o| matches!(o.reading, Reading::Value { .. })),
        "{:?}",
        out.iter().find(|o| o.detail.error.is_some())
    );
    assert_eq!(fake.requests(), 6);
    assert_eq!(fake.max_concurrency(), 2);
}

#[tokio::test(start_paused = true)]
async fn secrets_never_appear_in_errors_or_observations() {
    let fake = FakeDatadog::start().await;
    let s = setup_with(&fake.url, API_KEY, APP_KEY, |c| c.timeout = Duration::from_secs(1));
    fake.set("avg:echo{*}", Behavior::EchoKeys);
    fake.set("avg:garbage{*}", Behavior::Garbage);
    fake.set("avg:down{*}", Behavior::ServerError { status: 500, times: 100 });
    fake.set("avg:slow{*}", Behavior::Delay(Duration::from_secs(5)));
    let mut texts = Vec::new();
    for query in ["avg:echo{*}", "avg:garbage{*}", "avg:down{*}", "avg:slow{*}", "avg:fine{*}"] {
        let out = s.client.evaluate(&[q(query)], now_since(Instant::now()), by(&s.client)).await;
        texts.push(format!(
            "{out:?} {}",
            out.iter().map(|o| o.detail.error.as_ref().map(|e| e.to_string()).unwrap_or_default()).collect::<String>()
        ));
        tokio::time::sleep(Duration::from_secs(30)).await;
    }
    // The fake really echoed them: the client scrubbed its text.
    assert!(texts[0].contains("[redacted]"), "{}", texts[0]);
    let wrong = setup_with(&fake.url, "not-the-key-abcdef", APP_KEY, |_| {});
    let out = wrong.client.evaluate(&[q("avg:a{*}")], t0(), by(&wrong.client)).await;
    texts.push(format!("{out:?} {}", error(&out[0])));
    for text in &texts {
        for key in [API_KEY, APP_KEY, "not-the-key-abcdef"] {
            assert!(!text.contains(key), "a key leaked: {text}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Batching and pacing proofs

#[tokio::test]
async fn a_thousand_autoscalers_cost_at_most_29_requests() {
    let fake = FakeDatadog::start().await;
    let s = setup(&fake);
    let texts: Vec<String> = (0..1000).map(realistic_query).collect();
    for (i, text) in texts.iter().enumerate() {
        fake.set(text, Behavior::Series(SeriesSpec::constant(i as f64)));
    }
    let lengths: Vec<usize> = texts.iter().map(String::len).collect();
    let out = s.client.evaluate(&qs(&texts), t0(), by(&s.client)).await;
    // Each answer is its own query's value: series were mapped back by query_index.
    for (i, o) in out.iter().enumerate() {
        assert_eq!(value(o).0, i as f64, "autoscaler {i}");
    }
    let log = fake.log();
    let per_request: Vec<usize> = log.iter().map(|r| r.sub_queries.len()).collect();
    let max_query_string = log.iter().map(|r| r.query_string_len).max().unwrap();
    println!(
        "1,000 distinct queries of {}-{} characters: {} requests, {:?} queries each, longest URL {} characters \
         (query string {max_query_string})",
        lengths.iter().min().unwrap(),
        lengths.iter().max().unwrap(),
        log.len(),
        per_request,
        fake.max_url_len(),
    );
    assert!(log.len() <= 29, "{} requests", log.len());
    assert!(fake.max_url_len() < 7_000);
    assert!(per_request.iter().all(|n| *n <= 35));
    assert_eq!(per_request.iter().sum::<usize>(), 1000);

    // With 1,000 autoscalers sharing 400 distinct queries, only those 400 are sent.
    let before = fake.requests();
    let shared: Vec<String> = (0..1000).map(|i| realistic_query(i % 400)).collect();
    tokio::time::sleep(Duration::from_millis(1)).await;
    let fresh = setup(&fake);
    let out = fresh.client.evaluate(&qs(&shared), t0(), by(&fresh.client)).await;
    assert!(out.iter().enumerate().all(|(i, o)| value(o).0 == (i % 400) as f64));
    let sent = fake.requests() - before;
    println!("1,000 autoscalers over 400 distinct queries: {sent} requests");
    assert_eq!(sent, 12, "ceil(400 / 35)");

    // Long queries (~200 characters): the URL bound, not the count, limits the batch.
    let before = fake.requests();
    let long: Vec<String> = (0..200)
        .map(|i| {
            format!(
                "sum:trace.http.request.hits{{service:checkout-api-{i:04},env:production,region:eu-west-1,\
                 team:payments,version:2024-11-05,kube_cluster_name:prod-eu-1,kube_namespace:shop}} by \
                 {{resource_name}}.as_rate().rollup(avg, 30)"
            )
        })
        .collect();
    let fresh = setup(&fake);
    let out = fresh.client.evaluate(&qs(&long), t0(), by(&fresh.client)).await;
    assert!(out.iter().all(|o| matches!(o.reading, Reading::Value { .. })));
    let log = &fake.log()[before..];
    let longest = log.iter().map(|r| r.url_len).max().unwrap();
    println!(
        "200 queries of {} characters: {} requests, {:?} queries each, longest URL {longest} characters",
        long[0].len(),
        log.len(),
        log.iter().map(|r| r.sub_queries.len()).collect::<Vec<_>>()
    );
    assert!(longest < 7_000);
    assert!(log.iter().all(|r| r.sub_queries.len() < 35), "the URL bound is what splits");
    assert!(log.iter().filter(|r| r.url_len > 6_500).count() >= log.len() - 1, "requests are filled");
}

/// Runs `autoscalers` distinct queries every `interval` for `duration` of paused time against
/// `fake`; `between` runs before each ask. Returns (cycles run, cycles deferred) and prints the
/// longest time without a cycle.
async fn simulate(
    fake: &FakeDatadog,
    s: &Setup,
    autoscalers: usize,
    interval: Duration,
    duration: Duration,
    mut between: impl FnMut(&FakeDatadog),
) -> (usize, usize) {
    let mut last_run = Duration::ZERO;
    let mut longest_gap = Duration::ZERO;
    let texts: Vec<String> = (0..autoscalers).map(realistic_query).collect();
    let queries = qs(&texts);
    let start = Instant::now();
    let (mut ran, mut deferred) = (0, 0);
    let mut ask = 0u32;
    while interval * ask < duration {
        tokio::time::sleep_until(start + interval * ask).await;
        between(fake);
        let out = s.client.evaluate(&queries, now_since(start), by(&s.client)).await;
        let values = out.iter().filter(|o| matches!(o.reading, Reading::Value { .. })).count();
        let held = out.iter().filter(|o| matches!(o.detail.error, Some(QueryError::Deferred { .. }))).count();
        match (values, held) {
            (v, 0) if v == autoscalers => {
                ran += 1;
                longest_gap = longest_gap.max(start.elapsed() - last_run);
                last_run = start.elapsed();
            }
            (0, h) if h == autoscalers => deferred += 1,
            _ => panic!(
                "ask {ask} at {:?}: a mixed answer: {:?}",
                start.elapsed(),
                out.iter().find(|o| o.detail.error.is_some())
            ),
        }
        ask += 1;
    }
    longest_gap = longest_gap.max(duration - last_run);
    println!("  (longest time without a cycle: {longest_gap:?})");
    (ran, deferred)
}

#[tokio::test(start_paused = true)]
async fn a_thousand_autoscalers_every_15s_stay_within_1600_requests_an_hour() {
    let fake = FakeDatadog::start().await;
    let s = setup(&fake);
    let hour = Duration::from_secs(3_600);
    let (ran, deferred) = simulate(&fake, &s, 1000, Duration::from_secs(15), hour, |_| {}).await;
    let requests = fake.requests();
    let effective = hour.as_secs_f64() / ran as f64;
    let stretched = s.metrics.stretched_interval_seconds.with_label_values(&["dd"]).get();
    println!(
        "1,000 autoscalers every 15 s for one hour, budget 1,600/h: {requests} requests, {} answered 429, \
         {ran} cycles run, {deferred} deferred, effective interval {effective:.1} s, stretched gauge {stretched} s",
        fake.count_status(429)
    );
    assert_eq!(fake.count_status(429), 0);
    assert!(requests <= 1_600, "{requests} requests");
    assert_eq!(requests, ran * 29, "every cycle run cost exactly 29 requests");
    // The budget is used, not hoarded: at least 85 % of what is planned for (95 % of 1,600).
    assert!(requests as f64 >= 0.85 * 1_520.0, "{requests} requests: pacing too timid");
    assert_eq!(ran + deferred, 240);
    assert!(stretched > 15, "the gauge reports the stretched interval ({stretched})");
    assert_eq!(s.metrics.deferred_queries.with_label_values(&["dd"]).get(), deferred as u64 * 1000);
}

#[tokio::test(start_paused = true)]
async fn pacing_holds_across_a_calendar_window_and_with_other_spenders() {
    // The hour starts in the middle of a window: each window is respected on its own.
    let fake = FakeDatadog::with_budget(Budget { offset: Duration::from_secs(1_800), ..Budget::default() }).await;
    let s = setup(&fake);
    let (ran, deferred) = simulate(&fake, &s, 1000, Duration::from_secs(15), Duration::from_secs(3_600), |_| {}).await;
    let per_window = fake.used_per_window();
    println!(
        "half-way into a window: {} requests, {ran} cycles run, {deferred} deferred, per window {per_window:?}",
        fake.requests()
    );
    assert_eq!(fake.count_status(429), 0);
    assert!(per_window.iter().all(|(_, used)| *used <= 1_600), "{per_window:?}");
    // The first, half-hour window is spent almost entirely; the second, of which half an hour is
    // simulated, about half.
    assert!(per_window[0].1 >= 1_300, "{per_window:?}");
    assert!(per_window[1].1 >= 600, "{per_window:?}");

    // Other users of the organisation spend 4 requests every 15 s (960 an hour).
    let fake = FakeDatadog::start().await;
    let s = setup(&fake);
    let (ran, deferred) =
        simulate(&fake, &s, 1000, Duration::from_secs(15), Duration::from_secs(3_600), |f| f.consume(4)).await;
    let per_window = fake.used_per_window();
    println!(
        "with other spenders (960/h): {} requests of ours, {ran} cycles run, {deferred} deferred, window total \
         (ours and theirs) {per_window:?}",
        fake.requests()
    );
    assert_eq!(fake.count_status(429), 0, "we never hit the limit");
    assert!(per_window[0].1 <= 1_600, "we leave the others their share: they would have met a 429");
    assert!(ran >= 15, "{ran} cycles: still running");

    // Someone spends half the budget in a burst right after the reset, then nothing: we slow
    // down, but are never blind for long.
    let fake = FakeDatadog::start().await;
    let s = setup(&fake);
    let mut asks = 0;
    let (ran, deferred) = simulate(&fake, &s, 1000, Duration::from_secs(15), Duration::from_secs(3_600), |f| {
        if asks == 0 {
            f.consume(800);
        }
        asks += 1;
    })
    .await;
    let per_window = fake.used_per_window();
    println!(
        "after a burst of 800 by someone else: {} requests of ours, {ran} cycles run, {deferred} deferred, window \
         total {per_window:?}",
        fake.requests()
    );
    assert_eq!(fake.count_status(429), 0);
    assert!(per_window[0].1 <= 1_600);
    assert!(ran >= 20, "{ran} cycles after the burst");
}

#[tokio::test(start_paused = true)]
async fn two_daemons_sharing_an_organisation_share_its_budget() {
    let fake = FakeDatadog::start().await;
    let a = setup(&fake);
    let b = setup(&fake);
    let texts: Vec<String> = (0..500).map(realistic_query).collect();
    let queries = qs(&texts);
    let start = Instant::now();
    let mut ran = [0usize; 2];
    let mut last_run = [Duration::ZERO; 2];
    let mut longest_gap = [Duration::ZERO; 2];
    for ask in 0..240u32 {
        for (i, s) in [&a, &b].into_iter().enumerate() {
            // The second daemon asks 7 s after the first.
            tokio::time::sleep_until(start + Duration::from_secs(15) * ask + Duration::from_secs(7 * i as u64)).await;
            let out = s.client.evaluate(&queries, now_since(start), by(&s.client)).await;
            if out.iter().all(|o| matches!(o.reading, Reading::Value { .. })) {
                ran[i] += 1;
                longest_gap[i] = longest_gap[i].max(start.elapsed() - last_run[i]);
                last_run[i] = start.elapsed();
            } else {
                assert!(
                    out.iter().all(|o| matches!(o.detail.error, Some(QueryError::Deferred { .. }))),
                    "{:?}",
                    out[0]
                );
            }
        }
    }
    let per_window = fake.used_per_window();
    println!(
        "two daemons, 500 autoscalers each (15 requests a cycle): cycles run {ran:?}, longest gaps {longest_gap:?}, \
         {} requests, per window {per_window:?}",
        fake.requests()
    );
    assert_eq!(fake.count_status(429), 0);
    assert!(per_window.iter().all(|(_, used)| *used <= 1_600));
    assert!(ran.iter().all(|r| *r >= 30), "both keep running: {ran:?}");
    assert!(longest_gap.iter().all(|g| *g <= Duration::from_secs(600)), "nobody is blind for long: {longest_gap:?}");
}

#[tokio::test(start_paused = true)]
async fn after_a_429_nothing_is_sent_until_the_reset() {
    let fake = FakeDatadog::start().await;
    let s = setup_with(&fake.url, API_KEY, APP_KEY, |c| c.max_in_flight = 1);
    let texts: Vec<String> = (0..100).map(realistic_query).collect();
    let queries = qs(&texts);
    let start = Instant::now();
    let out = s.client.evaluate(&queries, now_since(start), by(&s.client)).await;
    assert!(out.iter().all(|o| matches!(o.reading, Reading::Value { .. })));
    assert_eq!(fake.requests(), 3);

    // Someone else spends the whole budget; our next cycle meets a 429.
    tokio::time::sleep(Duration::from_secs(15)).await;
    fake.exhaust();
    let out = s.client.evaluate(&queries, now_since(start), by(&s.client)).await;
    assert_eq!(fake.count_status(429), 1, "the other two requests of the cycle were not sent");
    assert_eq!(fake.requests(), 4);
    let reset = match error(&out[0]) {
        QueryError::RateLimited { reset_in_seconds } => reset_in_seconds,
        other => panic!("{other:?}"),
    };
    assert_eq!(reset, 3_585, "X-RateLimit-Reset of the 429");
    assert!(out.iter().all(|o| matches!(error(o), QueryError::RateLimited { .. })));

    // Every 15 s until the reset: nothing reaches the server.
    let mut last_reset = reset;
    while start.elapsed() + Duration::from_secs(15) < Duration::from_secs(3_600) {
        tokio::time::sleep(Duration::from_secs(15)).await;
        let out = s.client.evaluate(&queries, now_since(start), by(&s.client)).await;
        let QueryError::RateLimited { reset_in_seconds } = error(&out[0]) else { panic!("{out:?}") };
        assert!(reset_in_seconds < last_reset);
        last_reset = reset_in_seconds;
    }
    assert_eq!(fake.requests(), 4, "no request at all before the reset");
    println!("after the 429: {} asks answered RateLimited, none sent; last said {last_reset} s", (3_585 / 15) - 1);

    // At the reset, requests resume.
    tokio::time::sleep_until(start + Duration::from_secs(3_600)).await;
    let out = s.client.evaluate(&queries, now_since(start), by(&s.client)).await;
    assert!(out.iter().all(|o| matches!(o.reading, Reading::Value { .. })), "{:?}", out[0]);
    assert_eq!(fake.requests(), 7);
    assert_eq!(fake.count_status(429), 1);
}

// ---------------------------------------------------------------------------------------------
// Credentials: rotation and redirects

/// Replaces a key file the way a Secret volume or a deployment tool does: a new file renamed over
/// the old one.
fn replace_file(path: &std::path::Path, content: &str) {
    let staged = path.with_extension("new");
    std::fs::write(&staged, content).unwrap();
    std::fs::rename(&staged, path).unwrap();
}

/// Datadog revokes the keys and the new ones land in the key files: the next cycle sends them,
/// without a restart and without a 403 in between.
#[tokio::test(start_paused = true)]
async fn rotated_key_files_are_sent_from_the_next_cycle() {
    const NEW_API_KEY: &str = "rotated-api-key-77aa0c3e19f24b6d8e5a";
    const NEW_APP_KEY: &str = "rotated-app-key-2b9f6e1d0c4a3b5e7f8091a2b3c4d5e6f7";
    let fake = FakeDatadog::start().await;
    let s = setup(&fake);
    let start = Instant::now();
    let queries = [q("avg:system.cpu.user{*}")];
    let out = s.client.evaluate(&queries, now_since(start), by(&s.client)).await;
    value(&out[0]);

    fake.rotate_keys(NEW_API_KEY, NEW_APP_KEY);
    replace_file(&s.keys.path().join("api"), &format!("{NEW_API_KEY}\n"));
    replace_file(&s.keys.path().join("app"), &format!("{NEW_APP_KEY}\n"));
    tokio::time::sleep(Duration::from_secs(15)).await;
    let out = s.client.evaluate(&queries, now_since(start), by(&s.client)).await;
    value(&out[0]);
    assert_eq!(fake.count_status(403), 0, "no request went out with the revoked keys");
    assert_eq!(fake.requests(), 2);

    // A key file that disappears mid-rotation keeps the last good key.
    std::fs::remove_file(s.keys.path().join("api")).unwrap();
    tokio::time::sleep(Duration::from_secs(15)).await;
    let out = s.client.evaluate(&queries, now_since(start), by(&s.client)).await;
    value(&out[0]);
}

/// A Datadog URL that answers 307 to another origin (another port on 127.0.0.1): the client
/// does not follow it, so the other server never sees a key, and the queries fail with an
/// error naming the redirect.
#[tokio::test]
async fn a_redirect_to_another_origin_is_not_followed_with_the_keys() {
    let elsewhere = Recorder::start(r#"{"status":"ok","series":[]}"#).await;
    let redirector = Redirector::start(307, &elsewhere.url).await;
    let s = setup_with(&redirector.url, API_KEY, APP_KEY, |_| {});
    let out = s.client.evaluate(&[q("avg:system.cpu.user{*}")], t0(), by(&s.client)).await;
    let error = error(&out[0]);
    let QueryError::Configuration(text) = &error else { panic!("{error:?}") };
    assert!(text.contains("HTTP 307") && text.contains(&elsewhere.url), "{text}");
    assert!(!text.contains(API_KEY) && !text.contains(APP_KEY), "{text}");
    for headers in elsewhere.requests() {
        assert!(headers.get("dd-api-key").is_none() && headers.get("dd-application-key").is_none(), "{headers:?}");
    }
    assert!(elsewhere.requests().is_empty(), "the other origin is not asked at all");
}

/// What a run of `spread_run` saw.
struct SpreadRun {
    /// Requests counted in each calendar window (the last one may be partial).
    per_window: Vec<(u64, u64)>,
    /// Per autoscaler: the longest time its data went unrefreshed (from the start, and between
    /// two values).
    oldest: Vec<Duration>,
    /// Autoscalers that never got a value.
    never: usize,
    /// The `stretched_interval_seconds` gauge at the end.
    stretched: i64,
    asks_with_values: usize,
}

/// `autoscalers` distinct queries asked every 15 s for `duration` of paused time against a
/// fake whose budget is `limit` requests per `period`, by one client that knows nothing of the
/// budget at first.
async fn spread_run(limit: u64, period: u64, autoscalers: usize, duration: Duration) -> SpreadRun {
    spread_run_by_namespace(limit, period, autoscalers, duration, 100, |_| None).await
}

/// `spread_run` where autoscaler `i` belongs to namespace `owner(i)` and each namespace may use
/// `percent` of the budget.
async fn spread_run_by_namespace(
    limit: u64,
    period: u64,
    autoscalers: usize,
    duration: Duration,
    percent: u32,
    owner: fn(usize) -> Option<&'static str>,
) -> SpreadRun {
    let fake =
        FakeDatadog::with_budget(Budget { limit, period: Duration::from_secs(period), offset: Duration::ZERO }).await;
    let s = setup_with(&fake.url, API_KEY, APP_KEY, |c| c.namespace_budget_percent = percent);
    let texts: Vec<String> = (0..autoscalers).map(realistic_query).collect();
    let queries = qs(&texts);
    let owners: Vec<Option<&str>> = (0..autoscalers).map(owner).collect();
    let start = Instant::now();
    let mut last_value = vec![None::<Duration>; autoscalers];
    let mut oldest = vec![Duration::ZERO; autoscalers];
    let mut asks_with_values = 0;
    let interval = Duration::from_secs(15);
    let mut ask = 0u32;
    while interval * ask < duration {
        tokio::time::sleep_until(start + interval * ask).await;
        let out = s.client.evaluate_for(&queries, &owners, now_since(start), by(&s.client)).await;
        let at = start.elapsed();
        let mut any = false;
        for (i, o) in out.iter().enumerate() {
            match (&o.reading, &o.detail.error) {
                (Reading::Value { .. }, _) => {
                    last_value[i] = Some(at);
                    any = true;
                }
                (_, Some(QueryError::Deferred { .. })) => {}
                _ => panic!("ask {ask}, autoscaler {i}: {o:?}"),
            }
            oldest[i] = oldest[i].max(at - last_value[i].unwrap_or(Duration::ZERO));
        }
        asks_with_values += usize::from(any);
        ask += 1;
    }
    assert_eq!(fake.count_status(429), 0, "the budget was never overrun: {:?}", fake.used_per_window());
    SpreadRun {
        per_window: fake.used_per_window(),
        never: last_value.iter().filter(|v| v.is_none()).count(),
        oldest,
        stretched: s.metrics.stretched_interval_seconds.with_label_values(&["dd"]).get(),
        asks_with_values,
    }
}

#[tokio::test(start_paused = true)]
async fn a_cycle_larger_than_a_window_refreshes_every_autoscaler_at_one_stretched_interval() {
    // 1,000 autoscalers need 29 requests a cycle; the budget is 27 a minute (2 of them the
    // reserve), so no window holds a cycle: the requests are spread over the windows, oldest
    // data first.
    let run = spread_run(27, 60, 1000, Duration::from_secs(420)).await;
    let oldest = run.oldest.iter().max().unwrap();
    println!(
        "1,000 autoscalers on 27 requests/60 s, asked every 15 s for 7 minutes: per window {:?}, largest data age \
         {oldest:?}, stretched gauge {} s, {} never answered",
        run.per_window, run.stretched, run.never
    );
    assert_eq!(run.never, 0, "every autoscaler got data");
    // Every whole window is spent up to the reserve (give or take the rounding of one ask).
    for (window, used) in &run.per_window[..run.per_window.len() - 1] {
        assert!((23..=25).contains(used), "window {window}: {used} requests of 25 usable");
    }
    // 29 requests at 25 a minute is a refresh every ~70 s; every autoscaler is refreshed at
    // that pace, none is left behind (the asks are 15 s apart, hence the slack).
    assert!(*oldest <= Duration::from_secs(105), "largest data age {oldest:?}");
    assert!((65..=80).contains(&run.stretched), "stretched gauge {}", run.stretched);
    // Only an ask on a window's boundary, which still sees the spent window, sends nothing.
    assert!(run.asks_with_values >= 21, "asks sending a share: {} of 28", run.asks_with_values);
}

#[tokio::test(start_paused = true)]
async fn a_cycle_larger_than_a_short_window_is_spread_too() {
    // The same rate in windows of 18 s: 8 requests a window, one of them the reserve.
    let run = spread_run(8, 18, 1000, Duration::from_secs(420)).await;
    let oldest = run.oldest.iter().max().unwrap();
    let used: u64 = run.per_window.iter().map(|(_, u)| u).sum();
    println!(
        "1,000 autoscalers on 8 requests/18 s, asked every 15 s for 7 minutes: {used} requests, per window {:?}, \
         largest data age {oldest:?}, {} never answered",
        run.per_window, run.never
    );
    assert_eq!(run.never, 0, "every autoscaler got data");
    // 7 usable every 18 s is 163 in 420 s; asks 15 s apart cannot follow 18 s windows exactly.
    assert!(used >= 130, "{used} requests: the budget is used");
    assert!(*oldest <= Duration::from_secs(120), "largest data age {oldest:?}");
}

#[tokio::test(start_paused = true)]
async fn a_cycle_that_fits_a_window_still_goes_whole() {
    // 300 autoscalers, 9 requests a cycle, on 27 a minute: whole cycles every 30 s, no 429.
    let fake =
        FakeDatadog::with_budget(Budget { limit: 27, period: Duration::from_secs(60), offset: Duration::ZERO }).await;
    let s = setup(&fake);
    let (ran, deferred) = simulate(&fake, &s, 300, Duration::from_secs(15), Duration::from_secs(420), |_| {}).await;
    println!(
        "300 autoscalers on 27 requests/60 s: {ran} cycles run, {deferred} deferred, {:?}",
        fake.used_per_window()
    );
    assert_eq!(fake.count_status(429), 0);
    assert_eq!(ran, 14, "one cycle every 30 s");
    assert_eq!(deferred, 14);
}

#[tokio::test]
async fn an_answer_beyond_16_mib_is_not_read_and_its_queries_have_no_data() {
    let fake = FakeDatadog::start().await;
    let s = setup(&fake);
    fake.set("avg:fleet{*} by {host}", Behavior::Padded(17 * 1024 * 1024));
    let out = s.client.evaluate(&[q("avg:fleet{*} by {host}"), q("avg:a{*}")], t0(), by(&s.client)).await;
    for o in &out {
        match error(o) {
            QueryError::Protocol(text) => assert!(text.contains("larger than 16 MiB"), "{text}"),
            other => panic!("{other:?}"),
        }
        assert!(!matches!(o.reading, Reading::Value { .. }));
    }
    assert_eq!(fake.requests(), 1, "not retried");
    // The same request a little under the cap is read.
    fake.set("avg:fleet{*} by {host}", Behavior::Padded(15 * 1024 * 1024));
    let out = s.client.evaluate(&[q("avg:b{*}"), q("avg:fleet{*} by {host}")], t0(), by(&s.client)).await;
    assert!(out.iter().all(|o| matches!(o.reading, Reading::Value { .. })), "{out:?}");
}

#[tokio::test(start_paused = true)]
async fn one_namespace_cannot_stretch_every_namespace_interval() {
    // team-a has 2,000 autoscalers, team-b 70 (two requests); 27 requests a minute.
    let owner = |i: usize| Some(if i < 2_000 { "team-a" } else { "team-b" });
    let team_b = 2_000..2_070;
    let largest_b = |run: &SpreadRun| *run.oldest[team_b.clone()].iter().max().unwrap();
    // Unbounded, team-a's queries stretch everyone's refresh to minutes.
    let shared = spread_run_by_namespace(27, 60, 2_070, Duration::from_secs(420), 100, owner).await;
    // At most half the budget each: team-b keeps its 15 s; team-a's own queries wait.
    let bounded = spread_run_by_namespace(27, 60, 2_070, Duration::from_secs(420), 50, owner).await;
    let largest_a = *bounded.oldest[..2_000].iter().max().unwrap();
    println!(
        "team-b's largest data age: {:?} unbounded, {:?} at 50 % each (team-a's {largest_a:?}); per window {:?}",
        largest_b(&shared),
        largest_b(&bounded),
        bounded.per_window
    );
    assert!(largest_b(&shared) >= Duration::from_secs(90), "{:?}", largest_b(&shared));
    assert!(largest_b(&bounded) <= Duration::from_secs(45), "{:?}", largest_b(&bounded));
    assert_eq!(bounded.never, 0, "team-a's autoscalers are refreshed too, at its share's pace");
}

// ---------------------------------------------------------------------------------------------
// Folding

/// `avg:...{kube_deployment:web-NNNN,env:prod}` for each `i`, each answering `i`.
fn folding_fleet(fake: &FakeDatadog, n: usize) -> Vec<String> {
    let texts: Vec<String> = (0..n).map(realistic_query).collect();
    for (i, text) in texts.iter().enumerate() {
        fake.set(text, Behavior::Series(SeriesSpec::constant(i as f64)));
    }
    texts
}

#[tokio::test]
async fn per_deployment_queries_fold_into_one_grouped_request_and_each_gets_its_own_group() {
    let fake = FakeDatadog::start().await;
    let s = setup_folding(&fake);
    let mut texts = folding_fleet(&fake, 100);
    fake.set(&texts[7], Behavior::NoData);
    // Not foldable: sent as written, in the same request.
    texts.push("top(avg:kubernetes.cpu.usage.total{env:prod} by {kube_deployment}, 5, 'mean', 'desc')".into());
    fake.set(&texts[100], Behavior::Series(SeriesSpec::constant(-1.0)));

    let out = s.client.evaluate(&qs(&texts), t0(), by(&s.client)).await;
    let log = fake.log();
    assert_eq!(log.len(), 1, "one request: {log:#?}");
    assert_eq!(log[0].status, 200);
    let grouped: Vec<&String> = log[0].sub_queries.iter().filter(|q| q.contains(" IN (")).collect();
    assert_eq!(grouped.len(), 1, "{:?}", log[0].sub_queries);
    assert!(
        grouped[0].starts_with("avg:kubernetes.cpu.usage.total{env:prod AND kube_deployment IN (web-0000, web-0001")
    );
    assert!(grouped[0].ends_with(")} by {kube_deployment}"), "{}", grouped[0]);
    for (i, o) in out.iter().enumerate().take(100) {
        if i == 7 {
            // Absent from the answer: no data for it alone, never 0.
            assert!(matches!(error(o), QueryError::NoData(_)), "{o:?}");
        } else {
            assert_eq!(value(o).0, i as f64, "member {i} matched by its tag, not its position");
        }
    }
    assert_eq!(value(&out[100]).0, -1.0);

    let plan = s.client.plan(&qs(&texts), t0());
    assert_eq!(plan.request_count(), 1);
    assert_eq!(plan.folded_members(), 100);
    assert_eq!(plan.unfolded_members(), 1);
    let gauge = |folded: &str| s.metrics.plan_queries.with_label_values(&["dd", folded]).get();
    assert_eq!((gauge("true"), gauge("false")), (100, 1));
    assert_eq!(s.metrics.plan_requests.with_label_values(&["dd"]).get(), 1);
}

#[tokio::test]
async fn a_grouped_query_datadog_rejects_is_asked_member_by_member_and_then_left_unfolded() {
    let fake = FakeDatadog::start().await;
    let s = setup_folding(&fake);
    let texts = folding_fleet(&fake, 10);
    fake.set(&texts[3], Behavior::BadQuery);

    let out = s.client.evaluate(&qs(&texts), t0(), by(&s.client)).await;
    for (i, o) in out.iter().enumerate() {
        if i == 3 {
            assert!(matches!(error(o), QueryError::BadQuery(_)), "{o:?}");
        } else {
            assert_eq!(value(o).0, i as f64, "a bad member never blinds member {i}");
        }
    }
    let log = fake.log();
    // The grouped query (400), its members batched (400), then each alone.
    assert_eq!(log[0].status, 400);
    assert!(log[0].sub_queries[0].contains(" IN ("));
    assert_eq!(log[1].sub_queries.len(), 10);
    assert_eq!(log.len(), 2 + 10, "{log:#?}");

    // The next cycle asks the members unfolded (the bad one not at all, for its retry time).
    let before = log.len();
    let out = s.client.evaluate(&qs(&texts), t0(), by(&s.client)).await;
    let log = fake.log();
    assert_eq!(log.len(), before + 1);
    assert!(log[before].sub_queries.iter().all(|q| !q.contains(" IN (")), "{:?}", log[before].sub_queries);
    assert_eq!(log[before].sub_queries.len(), 9);
    assert_eq!(value(&out[9]).0, 9.0);
}

#[tokio::test]
async fn long_in_lists_are_split_under_the_url_bound_and_every_member_is_answered() {
    let fake = FakeDatadog::start().await;
    let s = setup_folding(&fake);
    let texts = folding_fleet(&fake, 2_000);
    let out = s.client.evaluate(&qs(&texts), t0(), by(&s.client)).await;
    for (i, o) in out.iter().enumerate() {
        assert_eq!(value(o).0, i as f64, "member {i}");
    }
    let log = fake.log();
    assert!(log.iter().all(|r| r.status == 200), "{:?}", log.iter().map(|r| r.status).collect::<Vec<_>>());
    assert!(fake.max_url_len() < 7_000, "{}", fake.max_url_len());
    // 2,000 members of about 18 encoded characters each: a handful of requests, not 58.
    println!("2,000 folded members: {} requests, longest URL {}", log.len(), fake.max_url_len());
    assert!(log.len() <= 8, "{} requests", log.len());
}

#[tokio::test]
async fn two_varying_tags_fold_grouped_by_both() {
    let fake = FakeDatadog::start().await;
    let s = setup_folding(&fake);
    let texts: Vec<String> =
        (0..6).map(|i| format!("sum:queue.depth{{kube_namespace:team-{i},app:worker-{i}}}")).collect();
    for (i, text) in texts.iter().enumerate() {
        fake.set(text, Behavior::Series(SeriesSpec::constant(10.0 * i as f64)));
    }
    let out = s.client.evaluate(&qs(&texts), t0(), by(&s.client)).await;
    for (i, o) in out.iter().enumerate() {
        assert_eq!(value(o).0, 10.0 * i as f64, "member {i}");
    }
    let log = fake.log();
    assert_eq!(log.len(), 1);
    assert!(log[0].sub_queries[0].ends_with("} by {app,kube_namespace}"), "{:?}", log[0].sub_queries);
}

// ---------------------------------------------------------------------------------------------
// Budget-aware refresh

#[tokio::test]
async fn a_value_that_cannot_have_changed_is_not_asked_again_until_its_next_bucket() {
    // A budget no pacing comes near: the cycles here follow each other at once.
    let fake = FakeDatadog::with_budget(Budget {
        limit: 1_000_000,
        period: Duration::from_secs(3600),
        offset: Duration::ZERO,
    })
    .await;
    let s = setup(&fake);
    let text = "avg:kubernetes.cpu.usage.total{kube_deployment:web,env:prod}".to_string();
    // Every bucket filled, the newest one (still filling) included, as a live series is.
    fake.set(&text, Behavior::Series(SeriesSpec { trailing_nulls: 0, ..SeriesSpec::constant(5.0) }));
    let first = s.client.evaluate(&[q(&text)], t0(), by(&s.client)).await;
    let (value_read, at) = value(&first[0]);
    assert_eq!(fake.requests(), 1);
    // The penultimate point at `at` (rollup 30 s) stays the penultimate point until a point
    // can exist for the bucket after next: at + 60 s.
    let until = at.plus(Duration::from_secs(60));
    assert!(until > t0(), "the newest bucket is at {at:?}, the cycle at {:?}", t0());
    let just_before = Timestamp::from_unix_millis(until.unix_millis() - 1);
    let again = s.client.evaluate(&[q(&text)], just_before, by(&s.client)).await;
    assert_eq!(fake.requests(), 1, "asked again for a value that cannot have changed");
    assert_eq!(value(&again[0]), (value_read, at), "the same value, with its own (older) time");
    tokio::time::sleep(Duration::from_millis(50)).await;
    s.client.evaluate(&[q(&text)], until, by(&s.client)).await;
    assert_eq!(fake.requests(), 2, "asked again once the value can have changed");

    // Anything but a value is asked again at the next cycle.
    fake.set(&text, Behavior::NoData);
    let later = until.plus(Duration::from_secs(120));
    for _ in 0..2 {
        // Past the pacer's spacing of one request (3.6 ms on this budget).
        tokio::time::sleep(Duration::from_millis(50)).await;
        s.client.evaluate(&[q(&text)], later, by(&s.client)).await;
    }
    assert_eq!(fake.requests(), 4);
}
