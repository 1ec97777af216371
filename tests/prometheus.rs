//! The Prometheus backend against a real Prometheus (Debian's package, started by the tests on a
//! free loopback port, scraping an exporter the test controls), and against a fake server for
//! what a real one cannot show: credentials, headers, 503s, partial answers, TLS. One test runs
//! the daemon against a real kube-apiserver with a fake server as its Prometheus.
//!
//! Needs `prometheus`, `openssl`, and for that test kube-apiserver and etcd:
//! scripts/install-test-deps installs them. Missing binaries fail the tests rather than skip them.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "test code: clippy.toml lets #[test] functions unwrap, index and print, and the helpers beside them do the same"
)]

#[macro_use]
#[path = "support/eventually.rs"]
mod eventually;
#[path = "support/daemon_process.rs"]
mod daemon_process;
#[path = "support/kube_cluster.rs"]
mod kube_cluster;
#[path = "support/prometheus_server.rs"]
mod prometheus_server;
#[path = "support/redirect_servers.rs"]
mod redirect_servers;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use daemon_process::{write, DaemonProcess};
use kube_cluster::{KubeCluster, ADMIN_TOKEN};

use prometheus_server::{
    written_query, Exporter, FakeServer, Injected, PrometheusProxy, PrometheusServer, Reply, TestCerts, TlsServer,
};
use redirect_servers::Redirector;
use watermarkd::adapters::backend::prometheus::PrometheusClient;
use watermarkd::adapters::backend::{BackendError, MetricQuery, Observation, QueryError};
use watermarkd::adapters::telemetry::BackendMetrics;
use watermarkd::domain::rules::{BasicAuth, PrometheusBackend, Reducer, SecretSource, TlsSettings};
use watermarkd::testing::SECRET_CHECK_EVERY;
use watermarkd_engine::{Reading, Timestamp};

const NAME: &str = "prom";

fn config(url: &str) -> PrometheusBackend {
    PrometheusBackend {
        url: url.to_string(),
        timeout: Duration::from_secs(2),
        max_in_flight: 4,
        max_age: None,
        tenant: None,
        headers: BTreeMap::new(),
        params: BTreeMap::new(),
        basic_auth: None,
        bearer_token: None,
        tls: TlsSettings::default(),
        fold_queries: true,
        fold_max_regex_bytes: 4096,
        fold_max_members: None,
    }
}

fn build(config: &PrometheusBackend) -> (PrometheusClient, Arc<BackendMetrics>) {
    let metrics = Arc::new(BackendMetrics::detached());
    let client = PrometheusClient::new(NAME, config, Arc::clone(&metrics)).expect("client builds");
    (client, metrics)
}

/// The deadline a cycle starting now gets in these tests: twice the client's timeout.
fn by(client: &PrometheusClient) -> tokio::time::Instant {
    tokio::time::Instant::now() + client.timeout() * 2
}

fn now() -> Timestamp {
    Timestamp::from_system_time(SystemTime::now())
}

fn q(query: &str) -> MetricQuery {
    MetricQuery { query: query.to_string(), reducer: None }
}

fn reduced(query: &str, reducer: Reducer) -> MetricQuery {
    MetricQuery { query: query.to_string(), reducer: Some(reducer) }
}

async fn one(client: &PrometheusClient, query: MetricQuery) -> Observation {
    client.evaluate(&[query], now(), by(client)).await.pop().expect("one observation per query")
}

fn value(obs: &Observation) -> f64 {
    match obs.reading {
        Reading::Value { value, .. } => value,
        _ => panic!("expected a value, got {obs:?}"),
    }
}

fn error(obs: &Observation) -> QueryError {
    assert!(matches!(obs.reading, Reading::Unavailable { .. }), "expected unavailable, got {obs:?}");
    obs.detail.error.clone().expect("an unavailable observation says why")
}

fn requests(metrics: &BackendMetrics, outcome: &str) -> u64 {
    metrics.requests.with_label_values(&[NAME, outcome]).get()
}

/// Polls until `done` holds for the query's observation (scrapes happen every second).
async fn eventually(client: &PrometheusClient, query: MetricQuery, done: impl Fn(&Observation) -> bool) -> Observation {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let obs = one(client, query.clone()).await;
        if done(&obs) {
            return obs;
        }
        assert!(Instant::now() < deadline, "{:?} never got there; last: {obs:?}", query.query);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn is_value(expected: f64) -> impl Fn(&Observation) -> bool {
    move |obs| matches!(obs.reading, Reading::Value { value, .. } if value == expected)
}

// ---------------------------------------------------------------------------------------------
// Against a real Prometheus

#[tokio::test]
async fn reads_a_gauge_and_follows_its_changes() {
    let exporter = Exporter::start("# TYPE wm_test_gauge gauge\nwm_test_gauge 5\n").await;
    let server = PrometheusServer::start(&exporter.target()).await;
    let (client, metrics) = build(&config(&server.url()));

    let obs = eventually(&client, q("wm_test_gauge"), is_value(5.0)).await;
    assert_eq!(obs.detail.series, Some(1));
    assert!(obs.detail.warnings.is_empty());

    // A series selector's value is dated by its sample, the scrape, not by the evaluation time
    // we asked for; a function's value is dated at the evaluation time.
    let at = now();
    let obs = client.evaluate(&[q("wm_test_gauge"), q("wm_test_gauge * 1")], at, by(&client)).await;
    let Reading::Value { value: 5.0, at: scraped } = obs[0].reading else { panic!("{obs:?}") };
    assert!(scraped < at && at.since(scraped) < Duration::from_secs(30), "scraped {:?} before", at.since(scraped));
    assert_eq!(obs[1].reading, Reading::Value { value: 5.0, at });
    // The same time `timestamp()` gives.
    let stamp = value(&one(&client, q("timestamp(wm_test_gauge)")).await);
    assert!((stamp - scraped.unix_millis() as f64 / 1000.0).abs() <= 2.0, "{stamp} vs {scraped}");

    exporter.set("# TYPE wm_test_gauge gauge\nwm_test_gauge 7.25\n");
    eventually(&client, q("wm_test_gauge"), is_value(7.25)).await;
    assert!(requests(&metrics, "ok") >= 3);
    assert_eq!(metrics.request_seconds.with_label_values(&[NAME]).get_sample_count(), requests(&metrics, "ok"));
}

#[tokio::test]
async fn no_data_several_series_reducers_and_nan() {
    let exporter = Exporter::start(
        "# TYPE wm_test_load gauge\nwm_test_load{pod=\"a\"} 1\nwm_test_load{pod=\"b\"} 4\nwm_test_load{pod=\"c\"} 7\n\
         # TYPE wm_test_nan gauge\nwm_test_nan NaN\n",
    )
    .await;
    let server = PrometheusServer::start(&exporter.target()).await;
    let (client, metrics) = build(&config(&server.url()));
    eventually(&client, q("count(wm_test_load)"), is_value(3.0)).await;

    // One query text, five metrics: one request, answers in order.
    let before = requests(&metrics, "ok");
    let queries = [
        q("wm_test_load"),
        reduced("wm_test_load", Reducer::Max),
        reduced("wm_test_load", Reducer::Min),
        reduced("wm_test_load", Reducer::Sum),
        reduced("wm_test_load", Reducer::Avg),
    ];
    let at = now();
    let obs = client.evaluate(&queries, at, by(&client)).await;
    assert_eq!(requests(&metrics, "ok") - before, 1);
    assert_eq!(error(&obs[0]), QueryError::SeveralSeries { count: 3 });
    let values: Vec<f64> = obs[1..].iter().map(value).collect();
    assert_eq!(values, [7.0, 1.0, 12.0, 4.0]);
    assert!(obs[1..].iter().all(|o| o.detail.series == Some(3)));
    // Dated by the oldest of the three samples.
    let Reading::Value { value: 12.0, at: oldest } = obs[3].reading else { panic!("{obs:?}") };
    assert!(oldest < at && at.since(oldest) < Duration::from_secs(30), "{oldest} at {at}");

    // Never 0: a series that does not exist is no data.
    let obs = one(&client, q("wm_test_no_such_metric")).await;
    assert!(matches!(error(&obs), QueryError::NoData(_)), "{obs:?}");
    let obs = one(&client, reduced("wm_test_load{pod=\"zzz\"}", Reducer::Sum)).await;
    assert!(matches!(error(&obs), QueryError::NoData(_)), "{obs:?}");

    // NaN from a gauge and from arithmetic.
    let obs = eventually(&client, q("wm_test_nan"), |o| o.detail.error.is_some()).await;
    assert_eq!(error(&obs), QueryError::NotANumber("NaN".into()));
    assert_eq!(error(&one(&client, q("0/0")).await), QueryError::NotANumber("NaN".into()));
    assert_eq!(error(&one(&client, q("vector(1)/0")).await), QueryError::NotANumber("+Inf".into()));
}

#[tokio::test]
async fn scalars_query_errors_and_long_queries() {
    let exporter =
        Exporter::start("# TYPE wm_test_load gauge\nwm_test_load{pod=\"a\"} 1\nwm_test_load{pod=\"b\"} 4\n").await;
    let server = PrometheusServer::start(&exporter.target()).await;
    let (client, _metrics) = build(&config(&server.url()));
    eventually(&client, q("count(wm_test_load)"), is_value(2.0)).await;

    let at = now();
    let obs = client.evaluate(&[q("1+1"), q("scalar(sum(wm_test_load))")], at, by(&client)).await;
    assert_eq!(obs[0].reading, Reading::Value { value: 2.0, at });
    assert_eq!(value(&obs[1]), 5.0);

    // Prometheus' own message comes through.
    let QueryError::BadQuery(message) = error(&one(&client, q("sum(wm_test_load")).await) else { panic!() };
    assert!(message.contains("parse error"), "{message}");
    // 422 execution errors are query problems too.
    let obs = one(&client, q("wm_test_load * on() wm_test_load")).await;
    let QueryError::BadQuery(message) = error(&obs) else { panic!("{obs:?}") };
    assert!(message.contains("many-to-many") || message.contains("matching"), "{message}");
    // Range vectors and strings are not one value.
    let QueryError::BadQuery(message) = error(&one(&client, q("wm_test_load[1m]")).await) else { panic!() };
    assert!(message.contains("instant vector or a scalar"), "{message}");
    assert!(matches!(error(&one(&client, q("\"text\"")).await), QueryError::BadQuery(_)));

    // Past 2,000 characters the query goes as a form POST, and still works.
    let mut long = String::from("sum(wm_test_load) + 0 * (vector(1)");
    while long.len() < 3_000 {
        long.push_str(" + vector(1)");
    }
    long.push(')');
    assert_eq!(value(&one(&client, q(&long)).await), 5.0);
}

#[tokio::test]
async fn path_prefix() {
    let exporter = Exporter::start("wm_test_gauge 3\n").await;
    let server = PrometheusServer::start_with_prefix(&exporter.target(), "/prometheus").await;
    for url in [server.url(), format!("{}/", server.url())] {
        let (client, _) = build(&config(&url));
        eventually(&client, q("wm_test_gauge"), is_value(3.0)).await;
    }
    // Without the prefix: a configuration problem that says where to look.
    let (client, _) = build(&config(&server.root_url()));
    let QueryError::Configuration(message) = error(&one(&client, q("wm_test_gauge")).await) else { panic!() };
    assert!(message.contains("path prefix"), "{message}");
}

#[tokio::test]
async fn a_stopped_server_is_a_transport_error_after_retries() {
    let exporter = Exporter::start("wm_test_gauge 1\n").await;
    let mut server = PrometheusServer::start(&exporter.target()).await;
    let mut settings = config(&server.url());
    settings.timeout = Duration::from_millis(500);
    let (client, metrics) = build(&settings);
    eventually(&client, q("wm_test_gauge"), is_value(1.0)).await;

    server.stop();
    let started = Instant::now();
    let obs = one(&client, q("wm_test_gauge")).await;
    let elapsed = started.elapsed();
    let QueryError::Transport(message) = error(&obs) else { panic!("{obs:?}") };
    assert!(message.contains("127.0.0.1") && !message.contains("wm_test_gauge"), "{message}");
    assert!(requests(&metrics, "transport") >= 2, "retried: {}", requests(&metrics, "transport"));
    // Within twice the timeout (plus scheduling slack).
    assert!(elapsed <= Duration::from_millis(1_300), "{elapsed:?}");
}

// ---------------------------------------------------------------------------------------------
// Against a fake server

#[tokio::test]
async fn credentials_tenant_headers_and_params_reach_the_server() {
    let fake = FakeServer::start(|_, _| Reply::vector(1700000000.0, &["1"])).await;
    let dir = tempfile::tempdir().unwrap();
    let password = dir.path().join("password");
    std::fs::write(&password, "s3cret\n").unwrap();
    let mut settings = config(&format!("{}/select/0/prometheus/", fake.url()));
    settings.tenant = Some("team-a".into());
    settings.headers.insert("X-Custom".into(), "yes".into());
    settings.params.insert("dedup".into(), "true".into());
    settings.params.insert("timeout".into(), "5s".into());
    settings.basic_auth = Some(BasicAuth { username: "alice".into(), password: SecretSource::File(password) });
    let (client, _) = build(&settings);

    let at = Timestamp::from_unix_millis(1_700_000_000_123);
    let obs = client.evaluate(&[q("up")], at, by(&client)).await;
    assert_eq!(value(&obs[0]), 1.0);
    let requests = fake.requests();
    assert_eq!(requests.len(), 1);
    let r = &requests[0];
    assert_eq!(r.method, "GET");
    assert_eq!(r.path, "/select/0/prometheus/api/v1/query");
    // A series selector goes with the time of its data asked for, in the same query.
    assert_eq!(
        r.query,
        [
            ("query", r#"(up) or label_replace(min(timestamp(up)), "watermarkd_sample", "time", "", "")"#),
            ("time", "1700000000.123"),
            ("dedup", "true"),
            ("timeout", "5s")
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
    );
    // base64("alice:s3cret")
    assert_eq!(r.header("authorization"), Some("Basic YWxpY2U6czNjcmV0"));
    assert_eq!(r.header("x-scope-orgid"), Some("team-a"));
    assert_eq!(r.header("x-custom"), Some("yes"));
}

/// Replaces a secret file the way a Secret volume or a deployment tool does: a new file renamed
/// over the old one.
fn replace_file(path: &std::path::Path, content: &str) {
    let staged = path.with_extension("new");
    std::fs::write(&staged, content).unwrap();
    std::fs::rename(&staged, path).unwrap();
}

#[tokio::test]
async fn a_bearer_token_file_is_reread_after_it_changes() {
    let fake = FakeServer::start(|_, _| Reply::vector(1.0, &["1"])).await;
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "first-token\n").unwrap();
    let mut settings = config(&fake.url());
    settings.bearer_token = Some(SecretSource::File(token.clone()));
    let (client, _) = build(&settings);

    one(&client, q("up")).await;
    // A rotation in place: new content and a new modification time.
    std::fs::write(&token, "second-token-longer\n").unwrap();
    let file = std::fs::File::options().write(true).open(&token).unwrap();
    file.set_modified(SystemTime::now() + Duration::from_secs(60)).unwrap();
    // Files are looked at again at most this often.
    tokio::time::sleep(SECRET_CHECK_EVERY).await;
    one(&client, q("up")).await;
    let seen: Vec<_> = fake.requests().iter().map(|r| r.header("authorization").unwrap_or("").to_string()).collect();
    assert_eq!(seen, ["Bearer first-token", "Bearer second-token-longer"]);
}

#[tokio::test]
async fn a_basic_auth_password_file_is_reread_after_it_changes() {
    let fake = FakeServer::start(|_, _| Reply::vector(1.0, &["1"])).await;
    let dir = tempfile::tempdir().unwrap();
    let password = dir.path().join("password");
    std::fs::write(&password, "s3cret\n").unwrap();
    let mut settings = config(&fake.url());
    settings.basic_auth = Some(BasicAuth { username: "alice".into(), password: SecretSource::File(password.clone()) });
    let (client, _) = build(&settings);

    one(&client, q("up")).await;
    replace_file(&password, "n3w-s3cret\n");
    tokio::time::sleep(SECRET_CHECK_EVERY).await;
    one(&client, q("up")).await;
    let seen: Vec<_> = fake.requests().iter().map(|r| r.header("authorization").unwrap_or("").to_string()).collect();
    // base64("alice:s3cret"), then base64("alice:n3w-s3cret")
    assert_eq!(seen, ["Basic YWxpY2U6czNjcmV0", "Basic YWxpY2U6bjN3LXMzY3JldA=="]);
}

/// A server that answers 307 to another origin (another port on 127.0.0.1): the client does
/// not follow it, so neither the tenant, the custom headers nor the password reach the other
/// server, and the query fails with an error naming the redirect.
#[tokio::test]
async fn a_redirect_to_another_origin_is_not_followed_with_the_credentials() {
    let elsewhere = FakeServer::start(|_, _| Reply::vector(1.0, &["1"])).await;
    let redirector = Redirector::start(307, &elsewhere.url()).await;
    let dir = tempfile::tempdir().unwrap();
    let password = dir.path().join("password");
    std::fs::write(&password, "s3cret\n").unwrap();
    let mut settings = config(&redirector.url);
    settings.tenant = Some("team-a".into());
    settings.headers.insert("X-Api-Token".into(), "custom-header-secret".into());
    settings.basic_auth = Some(BasicAuth { username: "alice".into(), password: SecretSource::File(password) });
    let (client, metrics) = build(&settings);

    let obs = one(&client, q("up")).await;
    let QueryError::Configuration(text) = error(&obs) else { panic!("{obs:?}") };
    assert!(text.contains("HTTP 307") && text.contains(&elsewhere.url()), "{text}");
    for r in elsewhere.requests() {
        for name in ["x-scope-orgid", "x-api-token", "authorization"] {
            assert_eq!(r.header(name), None, "{name} reached the other origin");
        }
    }
    assert!(elsewhere.requests().is_empty(), "the other origin is not asked at all");
    assert_eq!(requests(&metrics, "transport"), 1, "not retried: the answer would be the same");
}

#[tokio::test]
async fn a_long_query_goes_as_a_form_post() {
    let fake = FakeServer::start(|_, _| Reply::vector(1.0, &["2"])).await;
    let (client, _) = build(&config(&fake.url()));
    let long = format!("sum(up{{job=~\"{}\"}})", "a|".repeat(1_200));
    let short = "sum(up)";
    let obs = client.evaluate(&[q(short), q(&long)], Timestamp::from_unix_millis(5_000), by(&client)).await;
    assert_eq!(obs.iter().map(value).collect::<Vec<_>>(), [2.0, 2.0]);
    let mut requests = fake.requests();
    requests.sort_by_key(|r| r.method.clone());
    assert_eq!(requests[0].method, "GET");
    assert_eq!(requests[0].written_query().as_deref(), Some(short));
    let post = &requests[1];
    assert_eq!(post.method, "POST");
    assert_eq!(post.path, "/api/v1/query");
    assert!(post.query.is_empty(), "{:?}", post.query);
    assert_eq!(post.header("content-type"), Some("application/x-www-form-urlencoded"));
    assert_eq!(post.written_query().as_deref(), Some(long.as_str()));
    assert_eq!(post.param("time").as_deref(), Some("5.000"));
}

#[tokio::test]
async fn a_plain_text_503_is_retried() {
    let fake =
        FakeServer::start(
            |i, _| {
                if i == 0 {
                    Reply::text(503, "Service Unavailable")
                } else {
                    Reply::vector(1.0, &["42"])
                }
            },
        )
        .await;
    let (client, metrics) = build(&config(&fake.url()));
    let obs = one(&client, q("up")).await;
    assert_eq!(value(&obs), 42.0);
    assert_eq!(fake.requests().len(), 2);
    assert_eq!(requests(&metrics, "server_error"), 1);
    assert_eq!(requests(&metrics, "ok"), 1);
    assert_eq!(metrics.request_seconds.with_label_values(&[NAME]).get_sample_count(), 2);
}

#[tokio::test]
async fn server_errors_are_retried_within_twice_the_timeout() {
    let fake = FakeServer::start(|_, _| {
        Reply::json(503, r#"{"status":"error","errorType":"timeout","error":"query timed out in query execution"}"#)
    })
    .await;
    let mut settings = config(&fake.url());
    settings.timeout = Duration::from_millis(400);
    let (client, metrics) = build(&settings);
    let started = Instant::now();
    let obs = one(&client, q("up")).await;
    let elapsed = started.elapsed();
    let QueryError::Server(message) = error(&obs) else { panic!("{obs:?}") };
    assert!(message.starts_with("timeout"), "{message}");
    let attempts = fake.requests().len();
    assert!(attempts >= 2, "retried: {attempts} attempts");
    assert_eq!(requests(&metrics, "timeout"), attempts as u64);
    assert!(elapsed <= Duration::from_millis(1_100), "{elapsed:?}");
}

#[tokio::test]
async fn a_slow_server_times_out_within_twice_the_timeout() {
    let fake = FakeServer::start(|_, _| Reply::vector(1.0, &["1"]).after(Duration::from_secs(5))).await;
    let mut settings = config(&fake.url());
    settings.timeout = Duration::from_millis(300);
    let (client, metrics) = build(&settings);
    let started = Instant::now();
    let obs = one(&client, q("up")).await;
    let elapsed = started.elapsed();
    assert!(matches!(error(&obs), QueryError::Timeout(_)), "{obs:?}");
    assert!(requests(&metrics, "timeout") >= 1);
    assert!(elapsed <= Duration::from_millis(1_000), "{elapsed:?}");
}

#[tokio::test]
async fn unauthorized_is_a_configuration_error_not_retried() {
    let fake = FakeServer::start(|_, _| Reply::text(401, "Unauthorized")).await;
    let (client, metrics) = build(&config(&fake.url()));
    let QueryError::Configuration(message) = error(&one(&client, q("up")).await) else { panic!() };
    assert!(message.contains("credentials"), "{message}");
    assert_eq!(fake.requests().len(), 1);
    assert_eq!(requests(&metrics, "forbidden"), 1);

    let fake = FakeServer::start(|_, _| Reply::text(403, "no org id")).await;
    let (client, _) = build(&config(&fake.url()));
    let QueryError::Configuration(message) = error(&one(&client, q("up")).await) else { panic!() };
    assert!(message.contains("tenant") && message.contains("no org id"), "{message}");
}

/// A one-series `vector` answer of `value` at `time`; with `partial`, `warnings` as a Thanos
/// whose store did not answer sends them (and an info that is not about missing data).
fn vector_answer(time: f64, value: &str, partial: bool) -> String {
    let warnings = if partial {
        r#","warnings":["receive series from Addr: 10.0.3.4:10901: rpc error: code = Unavailable desc = connection refused; partial response"],
            "infos":["PromQL info: metric might not be a counter, name does not end in _total/_sum/_count/_bucket: \"up\""]"#
    } else {
        ""
    };
    format!(
        r#"{{"status":"success","data":{{"resultType":"vector","result":[{{"metric":{{}},"value":[{time},"{value}"]}}]}}{warnings}}}"#
    )
}

#[tokio::test]
async fn a_partial_answer_is_a_partial_reading_and_annotations_are_not() {
    let fake = FakeServer::start(|_, r| match r.written_query().as_deref() {
        Some("thanos") => Reply::json(200, &vector_answer(1.5, "3", true)),
        // VictoriaMetrics' cluster flag.
        Some("victoria") => Reply::json(
            200,
            r#"{"status":"success","isPartial":true,"data":{"resultType":"vector","result":[{"metric":{},"value":[1.5,"4"]}]}}"#,
        ),
        // PromQL's own annotations: about the query, not about missing data.
        _ => Reply::json(
            200,
            r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1.5,"5"]}]},
                "warnings":["PromQL warning: encountered a mix of histograms and floats for metric name \"up\""]}"#,
        ),
    })
    .await;
    let (client, metrics) = build(&config(&fake.url()));
    let obs = client.evaluate(&[q("thanos"), q("victoria"), q("annotated")], now(), by(&client)).await;

    // Still a value (it may show load above the band), but partial, with the server's words.
    let at = Timestamp::from_unix_millis(1_500);
    assert_eq!(obs[0].reading, Reading::Value { value: 3.0, at });
    let why = obs[0].detail.partial.as_deref().expect("a partial reading");
    assert!(why.contains("receive series from Addr") && why.contains("partial response"), "{why}");
    assert_eq!(obs[0].detail.warnings.len(), 2);
    assert_eq!(obs[1].reading, Reading::Value { value: 4.0, at });
    assert!(obs[1].detail.partial.as_deref().is_some_and(|w| w.contains("isPartial")), "{:?}", obs[1]);
    assert_eq!(obs[2].reading, Reading::Value { value: 5.0, at });
    assert_eq!(obs[2].detail.partial, None, "an annotation is not a partial answer");
    assert_eq!(obs[2].detail.warnings.len(), 1, "but it is shown");
    // Every warning and info is counted.
    assert_eq!(metrics.warnings.with_label_values(&[NAME]).get(), 3);
}

#[tokio::test]
async fn an_old_data_time_is_stale_past_the_backends_max_age() {
    // The value at the evaluation time, its data ten minutes older: a series that stopped.
    let fake = FakeServer::start(|_, r| {
        let time: f64 = r.param("time").and_then(|t| t.parse().ok()).unwrap_or(0.0);
        if r.dated() {
            Reply::dated(time, "4", time - 600.0)
        } else {
            Reply::vector(time, &["4"])
        }
    })
    .await;
    let mut settings = config(&fake.url());
    settings.max_age = Some(Duration::from_secs(120));
    let (client, _) = build(&settings);
    let at = Timestamp::from_unix_millis(1_700_000_000_000);
    let obs = client.evaluate(&[q("sum(queue_depth)"), q("sum(rate(jobs_total[1m]))")], at, by(&client)).await;
    assert_eq!(error(&obs[0]), QueryError::Stale { age_seconds: 600, max_age_seconds: 120 });
    // What is not a selector (or one aggregation of one) is sent as written and dated at the
    // evaluation time: its age cannot be told.
    assert_eq!(obs[1].reading, Reading::Value { value: 4.0, at });
    let mut sent: Vec<String> = fake.requests().iter().filter_map(|r| r.param("query")).collect();
    sent.sort();
    assert_eq!(
        sent,
        [
            r#"(sum(queue_depth)) or label_replace(min(timestamp(queue_depth)), "watermarkd_sample", "time", "", "")"#,
            "sum(rate(jobs_total[1m]))",
        ]
    );

    // Without a max_age on the backend the value stands, dated by its data: a metric's own
    // max_age then judges it.
    let (client, _) = build(&config(&fake.url()));
    let obs = one(&client, q("queue_depth")).await;
    let Reading::Value { value: 4.0, at: data } = obs.reading else { panic!("{obs:?}") };
    assert!(now().since(data) >= Duration::from_secs(600), "{data}");
}

#[tokio::test]
async fn concurrency_is_bounded_and_identical_queries_go_once() {
    let fake = FakeServer::start(|_, r| {
        let n = r.written_query().unwrap_or_default().trim_start_matches('q').to_string();
        Reply::vector(1.0, &[n.as_str()]).after(Duration::from_millis(100))
    })
    .await;
    let mut settings = config(&fake.url());
    settings.max_in_flight = 2;
    let (client, _) = build(&settings);
    let queries: Vec<_> = [1, 2, 3, 1, 4, 5, 6, 2].iter().map(|n| q(&format!("q{n}"))).collect();
    let obs = client.evaluate(&queries, now(), by(&client)).await;
    assert_eq!(obs.iter().map(value).collect::<Vec<_>>(), [1.0, 2.0, 3.0, 1.0, 4.0, 5.0, 6.0, 2.0]);
    assert_eq!(fake.requests().len(), 6);
    assert_eq!(fake.max_in_flight(), 2);
    assert!(client.evaluate(&[], now(), by(&client)).await.is_empty());
}

#[tokio::test]
async fn a_refused_connection_is_a_transport_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut settings = config(&format!("http://127.0.0.1:{port}"));
    settings.timeout = Duration::from_millis(300);
    let (client, metrics) = build(&settings);
    let obs = one(&client, q("up")).await;
    assert!(matches!(error(&obs), QueryError::Transport(ref m) if m.contains("refused")), "{obs:?}");
    assert!(requests(&metrics, "transport") >= 2);
}

// ---------------------------------------------------------------------------------------------
// TLS

fn tls_settings(certs: &TestCerts, ca: bool, client_cert: bool, insecure: bool) -> TlsSettings {
    TlsSettings {
        ca_file: ca.then(|| certs.path("ca.pem")),
        client_cert_file: client_cert.then(|| certs.path("client.pem")),
        client_key_file: client_cert.then(|| certs.path("client.key")),
        insecure_skip_verify: insecure,
    }
}

#[tokio::test]
async fn mutual_tls_with_a_custom_ca() {
    let certs = TestCerts::generate();
    let server = TlsServer::start(&certs, r#"{"status":"success","data":{"resultType":"scalar","result":[2,"8"]}}"#);
    let with = |ca, client_cert, insecure| {
        let mut settings = config(&server.url());
        settings.timeout = Duration::from_millis(500);
        settings.tls = tls_settings(&certs, ca, client_cert, insecure);
        build(&settings).0
    };

    assert_eq!(value(&one(&with(true, true, false), q("up")).await), 8.0);
    // The server's certificate is not trusted without the CA...
    let obs = one(&with(false, true, false), q("up")).await;
    assert!(matches!(error(&obs), QueryError::Transport(ref m) if m.to_lowercase().contains("certificate")), "{obs:?}");
    // ...unless verification is explicitly skipped.
    assert_eq!(value(&one(&with(false, true, true), q("up")).await), 8.0);
    // The server requires a client certificate.
    let obs = one(&with(true, false, false), q("up")).await;
    assert!(matches!(error(&obs), QueryError::Transport(_)), "{obs:?}");
}

#[tokio::test]
async fn bad_tls_files_fail_the_build_naming_the_file() {
    let certs = TestCerts::generate();
    let mut settings = config("https://127.0.0.1:1");
    settings.tls.ca_file = Some(certs.path("client.key"));
    let Err(BackendError::Invalid { message, .. }) =
        PrometheusClient::new(NAME, &settings, Arc::new(BackendMetrics::detached()))
    else {
        panic!("a key is not a CA certificate");
    };
    assert!(message.contains("client.key") && !message.contains("PRIVATE"), "{message}");

    // A key that does not go with the certificate.
    let mut settings = config("https://127.0.0.1:1");
    settings.tls.client_cert_file = Some(certs.path("client.pem"));
    settings.tls.client_key_file = Some(certs.path("ca.pem"));
    assert!(matches!(
        PrometheusClient::new(NAME, &settings, Arc::new(BackendMetrics::detached())),
        Err(BackendError::Invalid { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn a_cycle_ends_by_its_deadline_whatever_the_retries() {
    use tokio::time::Instant as Clock;
    // A 10 s timeout and a cycle deadline of 14 s (an autoscaler every 15 s); the server answers
    // after 12 s: the first attempt times out, the retry gets what is left, and the cycle is over
    // by its deadline with a timeout.
    let slow = FakeServer::start(|_, _| Reply::vector(1.0, &["1"]).after(Duration::from_secs(12))).await;
    let mut settings = config(&slow.url());
    settings.timeout = Duration::from_secs(10);
    let (client, _) = build(&settings);
    let deadline = Clock::now() + Duration::from_secs(14);
    let obs = client.evaluate(&[q("up")], now(), deadline).await;
    assert!(Clock::now() <= deadline, "the cycle ran {:?} past its deadline", Clock::now() - deadline);
    assert!(matches!(error(&obs[0]), QueryError::Timeout(_)), "{obs:?}");
    assert_eq!(slow.requests().len(), 2, "a retry with the time that was left");

    // Instant 503s and a short interval: retried while time is left, over by the deadline.
    let down = FakeServer::start(|_, _| Reply::text(503, "Service Unavailable")).await;
    let (client, _) = build(&config(&down.url()));
    let deadline = Clock::now() + Duration::from_millis(1_800);
    let obs = client.evaluate(&[q("up")], now(), deadline).await;
    assert!(Clock::now() <= deadline);
    assert!(matches!(error(&obs[0]), QueryError::Server(_)), "{obs:?}");
    assert!(down.requests().len() >= 2, "retried");

    // Deadline-based, not count-based: eight failures in a row, then an answer, all in time.
    let flaky =
        FakeServer::start(
            |i, _| {
                if i < 8 {
                    Reply::text(503, "Service Unavailable")
                } else {
                    Reply::vector(1.0, &["7"])
                }
            },
        )
        .await;
    let (client, _) = build(&config(&flaky.url()));
    let obs = client.evaluate(&[q("up")], now(), Clock::now() + Duration::from_secs(60)).await;
    assert_eq!(value(&obs[0]), 7.0);
    assert_eq!(flaky.requests().len(), 9);

    // A short interval with the default 10 s timeout: a cycle 900 ms long still asks.
    let quick = FakeServer::start(|_, _| Reply::vector(1.0, &["3"])).await;
    let mut settings = config(&quick.url());
    settings.timeout = Duration::from_secs(10);
    let (client, _) = build(&settings);
    let obs = client.evaluate(&[q("up")], now(), Clock::now() + Duration::from_millis(900)).await;
    assert_eq!(value(&obs[0]), 3.0);

    // A cycle whose deadline has passed sends nothing.
    let (client, _) = build(&config(&flaky.url()));
    let obs = client.evaluate(&[q("up")], now(), Clock::now()).await;
    assert!(matches!(error(&obs[0]), QueryError::Timeout(_)), "{obs:?}");
    assert_eq!(flaky.requests().len(), 9);
}

#[tokio::test]
async fn an_error_status_in_a_200_is_the_servers_unless_it_is_bad_data() {
    let fake = FakeServer::start(|_, r| match r.written_query().as_deref() {
        Some("bad") => Reply::json(200, r#"{"status":"error","errorType":"bad_data","error":"parse error"}"#),
        _ => Reply::json(200, r#"{"status":"error","errorType":"execution","error":"out of memory"}"#),
    })
    .await;
    let (client, metrics) = build(&config(&fake.url()));
    let obs = client.evaluate(&[q("bad"), q("heavy")], now(), by(&client)).await;
    assert_eq!(error(&obs[0]), QueryError::BadQuery("parse error".into()));
    assert!(matches!(error(&obs[1]), QueryError::Server(m) if m.contains("out of memory")), "{obs:?}");
    assert_eq!(requests(&metrics, "server_error"), 1, "not retried: nothing says it would pass");
}

// ---------------------------------------------------------------------------------------------
// The age of the data, against a real Prometheus

/// A series whose samples carry their own timestamp gets no staleness marker (as with remote
/// write or federation), so a real Prometheus answers its last sample for its lookback (5
/// minutes): the backend's `max_age` tells it from a live one by the time of its data.
#[tokio::test]
async fn a_series_frozen_in_the_lookback_is_stale_past_max_age() {
    let frozen_ms = now().unix_millis() - 90_000;
    let exporter = Exporter::start(&format!(
        "# TYPE wm_test_frozen gauge\nwm_test_frozen 5 {frozen_ms}\n# TYPE wm_test_live gauge\nwm_test_live 3\n\
         # TYPE wm_test_mixed gauge\nwm_test_mixed{{pod=\"a\"}} 1 {frozen_ms}\nwm_test_mixed{{pod=\"b\"}} 2\n"
    ))
    .await;
    let server = PrometheusServer::start(&exporter.target()).await;
    let mut settings = config(&server.url());
    settings.max_age = Some(Duration::from_secs(30));
    let (client, _) = build(&settings);
    eventually(&client, q("wm_test_live"), is_value(3.0)).await;
    // Not a selector, so not dated: there once it is scraped, whatever its age.
    eventually(&client, q("wm_test_frozen * 1"), is_value(5.0)).await;

    let queries = [
        q("wm_test_frozen"),
        q("max(wm_test_frozen)"),
        // With a live series: the value is no fresher than its stalest part.
        reduced("wm_test_mixed", Reducer::Max),
        q("wm_test_live"),
        q("sum by (job) (wm_test_live)"),
    ];
    let obs = client.evaluate(&queries, now(), by(&client)).await;
    for stale in &obs[..3] {
        match error(stale) {
            QueryError::Stale { age_seconds, max_age_seconds: 30 } => {
                assert!((90..300).contains(&age_seconds), "{age_seconds}s old")
            }
            other => panic!("expected stale, got {other:?}"),
        }
    }
    assert_eq!(value(&obs[3]), 3.0);
    assert_eq!(value(&obs[4]), 3.0);
    // What max_age cannot see: a function of the frozen series is dated at the evaluation time,
    // and so is a selector whose name may vary.
    assert_eq!(value(&one(&client, q("wm_test_frozen * 1")).await), 5.0);
    let obs = one(&client, reduced(r#"{__name__=~"wm_test_frozen|wm_test_live"}"#, Reducer::Max)).await;
    assert_eq!(value(&obs), 5.0);

    // A max_age above its age lets it through, dated by its sample.
    settings.max_age = Some(Duration::from_secs(290));
    let (client, _) = build(&settings);
    let obs = one(&client, q("wm_test_frozen")).await;
    assert_eq!(obs.reading, Reading::Value { value: 5.0, at: Timestamp::from_unix_millis(frozen_ms) });
}

// ---------------------------------------------------------------------------------------------
// Through the daemon

/// `watermarkd run` against a real kube-apiserver, with a fake server as its Prometheus that
/// answers with the warnings of a partial answer: a low value holds the replicas (a full answer
/// of the same value scales down), a high one scales up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_never_scales_down_on_a_partial_answer_and_may_scale_up() {
    let cluster = KubeCluster::shared();
    let ns = cluster.unique_namespace("prom-partial").await;
    cluster.create_deployment(&ns, "web", 4).await;
    cluster.set_workload_status("Deployment", &ns, "web", 4, 4).await;
    // (value, partial), answered at each request's evaluation time.
    let answer = Arc::new(Mutex::new(("1", true)));
    let shared = Arc::clone(&answer);
    let fake = FakeServer::start(move |_, r| {
        let time: f64 = r.param("time").and_then(|t| t.parse().ok()).unwrap_or(0.0);
        let (value, partial) = *shared.lock().unwrap();
        Reply::json(200, &vector_answer(time, value, partial))
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rules.toml");
    write(
        &config,
        &format!(
            "[backend.prom]\ntype = \"prometheus\"\nurl = \"{}\"\n\n\
             [[autoscaler]]\nname = \"web\"\ntarget = {{ kind = \"Deployment\", namespace = \"{ns}\", name = \"web\" }}\n\
             interval = \"1s\"\nmin_replicas = 1\nmax_replicas = 10\n\
             upscale_forbidden_window = \"1s\"\ndownscale_forbidden_window = \"1s\"\n\n\
             [[autoscaler.metric]]\nname = \"load\"\nbackend = \"prom\"\nquery = \"load\"\n\
             high_watermark = 10\nlow_watermark = 5\n",
            fake.url()
        ),
    );
    let kubeconfig = dir.path().join("kubeconfig");
    cluster.write_kubeconfig(&kubeconfig, ADMIN_TOKEN);
    let mut daemon = DaemonProcess::start(
        &[
            "--config",
            config.to_str().unwrap(),
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--no-leader-election",
            "--lease-namespace",
            &ns,
        ],
        &[],
    );
    daemon.wait_ready(Duration::from_secs(30)).await;

    // 1, under the band (a full answer would take 4 down to 3), but partial: five evaluations
    // on it, and the replicas stay.
    eventually!(Duration::from_secs(30), "five partial answers read", {
        let warnings = daemon.sample("watermarkd_prometheus_warnings_total", &[("backend", "prom")]).await;
        // Two per answer: the warning and the info.
        if warnings.unwrap_or(0.0) >= 10.0 {
            Ok(())
        } else {
            Err(format!("{warnings:?} warnings"))
        }
    });
    assert_eq!(cluster.spec_replicas("Deployment", &ns, "web").await, 4, "no scale-down on a partial answer");

    // 30, over the band, partial: usage is at least that, so it scales up, 4 + 50%.
    *answer.lock().unwrap() = ("30", true);
    eventually!(Duration::from_secs(20), "a scale-up on a partial answer", {
        match cluster.spec_replicas("Deployment", &ns, "web").await {
            6 => Ok(()),
            other => Err(format!("{other} replicas")),
        }
    });
    cluster.set_workload_status("Deployment", &ns, "web", 6, 6).await;

    // The same low value as a full answer scales down: the partial answer was what held it.
    *answer.lock().unwrap() = ("1", false);
    eventually!(Duration::from_secs(20), "a scale-down on a full answer", {
        match cluster.spec_replicas("Deployment", &ns, "web").await {
            replicas if replicas < 6 => Ok(()),
            other => Err(format!("{other} replicas")),
        }
    });
    assert!(daemon.terminate(Duration::from_secs(15)), "a clean exit on SIGTERM");
}

// ---------------------------------------------------------------------------------------------
// Folding

/// Deployments web-0 to web-19 of one namespace, two pods each, with a load gauge and a latency
/// histogram; web-7 has no series at all.
fn fleet() -> String {
    let mut text = String::from("# TYPE wm_fold_load gauge\n# TYPE wm_fold_latency histogram\n");
    for d in (0..20).filter(|d| *d != 7) {
        for pod in 0..2 {
            let load = f64::from(d * 10 + pod) + 0.5;
            text.push_str(&format!(
                "wm_fold_load{{namespace=\"prod\",deployment=\"web-{d}\",pod=\"p{pod}\"}} {load}\n"
            ));
        }
        let (fast, slow, all) = (d, 2 * d + 1, 3 * d + 2);
        for (le, count) in [("0.1", fast), ("1", slow), ("+Inf", all)] {
            text.push_str(&format!("wm_fold_latency_bucket{{deployment=\"web-{d}\",le=\"{le}\"}} {count}\n"));
        }
        text.push_str(&format!("wm_fold_latency_sum{{deployment=\"web-{d}\"}} {d}\n"));
        text.push_str(&format!("wm_fold_latency_count{{deployment=\"web-{d}\"}} {all}\n"));
    }
    text
}

/// Twenty autoscalers' queries of each of four shapes: a dated sum, a function over a range,
/// a histogram quantile, a quantile.
fn fleet_queries() -> Vec<MetricQuery> {
    let shapes = [
        "sum(wm_fold_load{namespace=\"prod\",deployment=\"web-N\"})",
        "max(max_over_time(wm_fold_load{deployment=\"web-N\"}[1m]))",
        "histogram_quantile(0.9, sum by (le) (wm_fold_latency_bucket{deployment=\"web-N\"}))",
        "quantile(0.5, wm_fold_load{deployment=\"web-N\"})",
    ];
    shapes.iter().flat_map(|shape| (0..20).map(move |d| q(&shape.replace("web-N", &format!("web-{d}"))))).collect()
}

#[tokio::test]
async fn queries_of_one_shape_fold_into_one_request_and_each_gets_what_it_gets_alone() {
    let exporter = Exporter::start(&fleet()).await;
    let server = PrometheusServer::start(&exporter.target()).await;
    let (client, metrics) = build(&config(&server.url()));
    eventually(&client, q("count(wm_fold_load)"), is_value(38.0)).await;
    eventually(&client, q("count(wm_fold_latency_bucket)"), is_value(57.0)).await;

    let queries = fleet_queries();
    let plan = client.plan(&queries);
    assert_eq!(plan.request_count(), 4, "{plan:?}");
    assert!(plan.requests.iter().all(|r| r.parts.len() == 1 && r.parts[0].folded && r.parts[0].members.len() == 20));

    // A time two seconds back, when every series was there already: every scrape before it is
    // in the storage, so alone or folded, the queries read the same samples.
    let give_up = Instant::now() + Duration::from_secs(20);
    let at = loop {
        let at = Timestamp::from_unix_millis(now().unix_millis() - 2_000);
        let counts = [q("count(wm_fold_load)"), q("count(wm_fold_latency_bucket)")];
        let seen: Vec<Reading> =
            client.evaluate(&counts, at, by(&client)).await.into_iter().map(|o| o.reading).collect();
        if matches!(seen[..], [Reading::Value { value: 38.0, .. }, Reading::Value { value: 57.0, .. }]) {
            break at;
        }
        assert!(Instant::now() < give_up, "the fleet never showed up: {seen:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let before = requests(&metrics, "ok");
    let per_request = metrics.plan_members_per_request.with_label_values(&[NAME]);
    let (counted, summed) = (per_request.get_sample_count(), per_request.get_sample_sum());
    let folded = client.evaluate(&queries, at, by(&client)).await;
    assert_eq!(requests(&metrics, "ok") - before, 4, "one request per shape");
    assert_eq!(per_request.get_sample_count() - counted, 4);
    assert_eq!(per_request.get_sample_sum() - summed, 80.0);
    assert_eq!(metrics.plan_requests.with_label_values(&[NAME]).get(), 4);
    assert_eq!(metrics.plan_queries.with_label_values(&[NAME, "true"]).get(), 80);
    assert_eq!(metrics.plan_queries.with_label_values(&[NAME, "false"]).get(), 0);

    for (query, folded) in queries.iter().zip(&folded) {
        let alone = client.evaluate(std::slice::from_ref(query), at, by(&client)).await;
        assert_eq!(Some(folded), alone.first(), "{}", query.query);
        if query.query.contains("\"web-7\"") {
            assert!(matches!(error(folded), QueryError::NoData(_)), "{}: {folded:?}", query.query);
        } else {
            assert!(matches!(folded.reading, Reading::Value { .. }), "{}: {folded:?}", query.query);
        }
    }
    assert_eq!(metrics.plan_queries.with_label_values(&[NAME, "false"]).get(), 1, "a query alone is not folded");
    // web-3: 30.5 + 31.5, dated by its scrape, not by the evaluation time.
    let Reading::Value { value: 62.0, at: scraped } = folded[3].reading else { panic!("{:?}", folded[3]) };
    assert!(scraped < at, "{scraped} vs {at}");
    assert_eq!(value(&folded[20 + 3]), 31.5);
    assert_eq!(value(&folded[60 + 3]), 31.0);

    // 3,000 deployments (all but 19 without series): several folded queries, each under
    // 16 KiB, each taken by the real server; every member its own answer.
    let many: Vec<MetricQuery> = (0..3_000)
        .map(|d| q(&format!("max(max_over_time(wm_fold_load{{deployment=\"web-{d}\",namespace=\"prod\"}}[1m]))")))
        .collect();
    let plan = client.plan(&many);
    assert!(plan.request_count() > 1, "{}", plan.request_count());
    assert!(plan.requests.iter().all(|r| r.parts[0].folded && r.parts[0].text.len() < 16 * 1024));
    assert_eq!(plan.folded_members(), 3_000);
    let before = requests(&metrics, "ok");
    let obs = client.evaluate(&many, at, by(&client)).await;
    assert_eq!(requests(&metrics, "ok") - before, plan.request_count() as u64);
    for (d, o) in obs.iter().enumerate() {
        match d {
            7 | 20.. => assert!(matches!(error(o), QueryError::NoData(_)), "web-{d}: {o:?}"),
            _ => assert_eq!(value(o), (d * 10 + 1) as f64 + 0.5, "web-{d}"),
        }
    }
}

#[tokio::test]
async fn a_folded_query_is_one_post_and_its_members_are_judged_alone() {
    // Answers by label, in an order of its own: web-b is missing; web-a's data is ten minutes
    // old, web-c's fresh.
    let fake = FakeServer::start(|_, r| {
        let time: f64 = r.param("time").and_then(|t| t.parse().ok()).unwrap_or(0.0);
        Reply::json(
            200,
            &format!(
                r#"{{"status":"success","data":{{"resultType":"vector","result":[
                {{"metric":{{"d":"web-c"}},"value":[{time},"3"]}},
                {{"metric":{{"d":"web-c","watermarkd_sample":"time"}},"value":[{time},"{}"]}},
                {{"metric":{{"d":"web-a","watermarkd_sample":"time"}},"value":[{time},"{}"]}},
                {{"metric":{{"d":"web-a"}},"value":[{time},"1"]}}]}}}}"#,
                time - 5.0,
                time - 600.0
            ),
        )
    })
    .await;
    let mut settings = config(&fake.url());
    settings.max_age = Some(Duration::from_secs(120));
    let (client, _) = build(&settings);
    let queries: Vec<MetricQuery> =
        ["web-a", "web-b", "web-c"].iter().map(|d| q(&format!("sum(q{{d=\"{d}\"}})"))).collect();
    let at = now();
    let obs = client.evaluate(&queries, at, by(&client)).await;
    assert_eq!(error(&obs[0]), QueryError::Stale { age_seconds: 600, max_age_seconds: 120 });
    assert!(matches!(error(&obs[1]), QueryError::NoData(_)), "{:?}", obs[1]);
    assert_eq!(
        obs[2].reading,
        Reading::Value { value: 3.0, at: Timestamp::from_unix_millis(at.unix_millis() - 5_000) }
    );

    let sent = fake.requests();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].method, "POST", "short, but folded");
    assert_eq!(sent[0].written_query().as_deref(), Some(r#"sum by (d)(q{d=~"web-a|web-b|web-c"})"#));
    assert!(sent[0].dated(), "each member's data time asked for");
}

/// The fleet in a real Prometheus, behind a proxy that can answer for it, once it is scraped.
struct ProxiedFleet {
    /// Kept for as long as the fleet is used: dropping either stops it.
    _exporter: Exporter,
    _server: PrometheusServer,
    proxy: PrometheusProxy,
    client: PrometheusClient,
    metrics: Arc<BackendMetrics>,
}

async fn proxied_fleet() -> ProxiedFleet {
    let exporter = Exporter::start(&fleet()).await;
    let server = PrometheusServer::start(&exporter.target()).await;
    let proxy = PrometheusProxy::start(&server.url()).await;
    let (client, metrics) = build(&config(&proxy.url()));
    eventually(&client, q("count(wm_fold_load)"), is_value(38.0)).await;
    ProxiedFleet { _exporter: exporter, _server: server, proxy, client, metrics }
}

#[tokio::test]
async fn a_folded_query_the_server_rejects_is_asked_unfolded_and_its_shape_not_folded_again() {
    let fleet = proxied_fleet().await;
    let (proxy, client, metrics) = (&fleet.proxy, &fleet.client, &fleet.metrics);

    let queries: Vec<MetricQuery> = fleet_queries().into_iter().take(5).collect();
    let plan = client.plan(&queries);
    let folded_text = written_query(&plan.requests[0].parts[0].text);
    proxy.inject(
        &folded_text,
        Some(Injected::Reply(Reply::json(
            400,
            r#"{"status":"error","errorType":"bad_data","error":"query too complex"}"#,
        ))),
    );
    let obs = client.evaluate(&queries, now(), by(client)).await;
    let values: Vec<f64> = obs.iter().map(value).collect();
    assert_eq!(values, [2.0, 22.0, 42.0, 62.0, 82.0]);
    assert_eq!(proxy.injected(&folded_text), 1);
    assert_eq!(requests(metrics, "bad_query"), 1);
    for query in &queries {
        assert_eq!(proxy.seen(&query.query), 1, "{}", query.query);
    }

    // Remembered: the next cycles ask the members alone, without trying the folded query.
    assert!(client.plan(&queries).requests.iter().all(|r| !r.parts[0].folded));
    let obs = client.evaluate(&queries, now(), by(client)).await;
    assert_eq!(obs.iter().map(value).collect::<Vec<_>>(), values);
    assert_eq!(proxy.seen(&folded_text), 1);
    // Other shapes still fold.
    let others: Vec<MetricQuery> = fleet_queries().into_iter().skip(20).take(3).collect();
    assert!(client.plan(&others).requests[0].parts[0].folded);
}

#[tokio::test]
async fn a_folded_query_failing_as_it_runs_is_asked_unfolded_and_its_shape_not_folded_again() {
    let fleet = proxied_fleet().await;
    let (proxy, client, metrics) = (&fleet.proxy, &fleet.client, &fleet.metrics);

    // Mimir's answer to a query past its per-query series limit: the folded query selects every
    // member's series, each member alone only its own.
    let queries: Vec<MetricQuery> = fleet_queries().into_iter().take(3).collect();
    let folded_text = written_query(&client.plan(&queries).requests[0].parts[0].text);
    let refusal = r#"{"status":"error","errorType":"execution","error":"the query exceeded the maximum number of series (limit: 1000) (err-mimir-max-series-per-query)"}"#;
    proxy.inject(&folded_text, Some(Injected::Reply(Reply::json(422, refusal))));
    let obs = client.evaluate(&queries, now(), by(client)).await;
    assert_eq!(obs.iter().map(value).collect::<Vec<_>>(), [2.0, 22.0, 42.0]);
    assert_eq!(proxy.injected(&folded_text), 1);
    assert_eq!(requests(metrics, "bad_query"), 1);
    for query in &queries {
        assert_eq!(proxy.seen(&query.query), 1, "{}", query.query);
    }

    // Remembered: the next cycles ask the members alone, without trying the folded query.
    assert!(client.plan(&queries).requests.iter().all(|r| !r.parts[0].folded));
    let obs = client.evaluate(&queries, now(), by(client)).await;
    assert_eq!(obs.iter().map(value).collect::<Vec<_>>(), [2.0, 22.0, 42.0]);
    assert_eq!(proxy.injected(&folded_text), 1);
    assert_eq!(metrics.plan_queries.with_label_values(&[NAME, "false"]).get(), 3);
}

/// A store that answers each member's own query `sum(q{d="N"})` with N and the folded query as
/// `folded` says.
async fn store_refusing_folds(folded: impl Fn() -> Reply + Send + Sync + 'static) -> FakeServer {
    FakeServer::start(move |_, r| {
        let query = r.written_query().unwrap_or_default();
        if query.contains("=~") {
            return folded();
        }
        let time: f64 = r.param("time").and_then(|t| t.parse().ok()).unwrap_or(0.0);
        let n = query.split("d=\"").nth(1).and_then(|rest| rest.split('"').next()).unwrap_or("x").to_string();
        Reply::vector(time, &[n.as_str()])
    })
    .await
}

/// A folded query is N times heavier than one member's: a 5xx or a timeout on it is not retried
/// until the deadline, its members are asked alone in the same cycle, within it.
#[tokio::test]
async fn a_folded_query_that_fails_or_times_out_leaves_its_members_time_to_be_asked_alone() {
    let queries: Vec<MetricQuery> = (1..=4).map(|d| q(&format!("sum(q{{d=\"{d}\"}})"))).collect();
    for (what, folded) in [
        ("a 503", Reply::text(503, "Service Unavailable")),
        ("a timeout", Reply::vector(0.0, &["1"]).after(Duration::from_secs(30))),
        (
            "the server's own timeout",
            Reply::json(
                503,
                r#"{"status":"error","errorType":"timeout","error":"query timed out in expression evaluation"}"#,
            ),
        ),
    ] {
        let store = store_refusing_folds(move || folded.clone()).await;
        let (client, metrics) = build(&config(&store.url()));
        let started = Instant::now();
        let obs = client.evaluate(&queries, now(), by(&client)).await;
        assert_eq!(obs.iter().map(value).collect::<Vec<_>>(), [1.0, 2.0, 3.0, 4.0], "{what}");
        // The folded query once, not retried; each member once.
        let sent: Vec<String> = store.requests().iter().filter_map(|r| r.written_query()).collect();
        assert_eq!(sent.iter().filter(|q| q.contains("=~")).count(), 1, "{what}: {sent:?}");
        assert_eq!(sent.len(), 5, "{what}: {sent:?}");
        assert!(started.elapsed() < client.timeout() * 2, "{what}: {:?}", started.elapsed());
        assert_eq!(requests(&metrics, "ok"), 4, "{what}");
        assert!(client.plan(&queries).requests.iter().all(|r| !r.parts[0].folded), "{what}");
    }

    // What every member would meet alone too is every member's, and the shape still folds.
    let store = store_refusing_folds(|| Reply::text(401, "unauthorized")).await;
    let (client, _) = build(&config(&store.url()));
    let obs = client.evaluate(&queries, now(), by(&client)).await;
    assert!(obs.iter().all(|o| matches!(error(o), QueryError::Configuration(_))), "{obs:?}");
    assert_eq!(store.requests().len(), 1);
    assert!(client.plan(&queries).requests[0].parts[0].folded);
}

#[tokio::test]
async fn fold_queries_false_sends_every_query_as_written() {
    let store = store_refusing_folds(|| Reply::text(500, "a folded query was sent")).await;
    let mut settings = config(&store.url());
    settings.fold_queries = false;
    let (client, _) = build(&settings);
    let queries: Vec<MetricQuery> = (1..=4).map(|d| q(&format!("sum(q{{d=\"{d}\"}})"))).collect();
    assert!(client.plan(&queries).requests.iter().all(|r| !r.parts[0].folded));
    let obs = client.evaluate(&queries, now(), by(&client)).await;
    assert_eq!(obs.iter().map(value).collect::<Vec<_>>(), [1.0, 2.0, 3.0, 4.0]);
    let sent: Vec<String> = store.requests().iter().filter_map(|r| r.written_query()).collect();
    assert_eq!(sent.len(), 4);
    assert!(sent.iter().all(|q| !q.contains("=~")), "{sent:?}");
}
