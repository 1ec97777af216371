//! The replica recommender client against real HTTP(S) servers started here: the request it
//! sends, each way a reply can fail (all of them hold, with a reason, never 0), the deadline,
//! and TLS (custom CA, client certificates, a wrong CA). Each reply is then decided by the
//! engine with the rule of a rules file, as the daemon does.
//!
//! Needs `openssl` for the throwaway certificates (scripts/install-test-deps installs it).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "test code: clippy.toml lets #[test] functions unwrap, index and print, and the helpers beside them do the same"
)]

#[path = "support/fake_recommender.rs"]
mod fake_recommender;
#[path = "support/prometheus_server.rs"]
mod prometheus_server;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use fake_recommender::{reply, FakeRecommender};
use prometheus_server::{TestCerts, TlsServer};
use serde_json::json;
use tokio::time::Instant;
use watermarkd::adapters::backend::recommender::{RecommenderClients, WorkloadState};
use watermarkd::adapters::backend::Observation;
use watermarkd::adapters::telemetry::HttpClientMetrics;
use watermarkd::domain::rules::{parse_rules, Autoscaler, Recommender};
use watermarkd::testing::recommender_clients;
use watermarkd_engine::{decide, Action, Decision, Guard, Position, Reading, State, Target, Timestamp};

/// The autoscaler of a rules file whose recommender is at `url`, with `extra` recommender keys.
fn autoscaler(url: &str, extra: &str) -> Autoscaler {
    let text = format!(
        r#"
[[autoscaler]]
name = "web"
target = {{ kind = "Deployment", namespace = "prod", name = "web" }}
min_replicas = 2
max_replicas = 20
scale_up_limit_factor = 100

[autoscaler.recommender]
url = "{url}"
target_type = "cpu"
settings = {{ window = "1h" }}
high_watermark = "800m"
low_watermark = "600m"
cluster_name = "eu-1"
{extra}
"#
    );
    let rules = parse_rules(&text, "rules.toml").unwrap_or_else(|e| panic!("{e}"));
    rules.autoscalers.into_iter().next().expect("one autoscaler")
}

fn recommender(autoscaler: &Autoscaler) -> &Recommender {
    autoscaler.recommender.as_ref().expect("a recommender")
}

fn state(spec: u32) -> WorkloadState {
    WorkloadState { desired: spec, current: spec, ready: Some(spec), min_replicas: 2, max_replicas: 20 }
}

fn now() -> Timestamp {
    Timestamp::from_unix_millis(1_714_564_800_000)
}

/// Asks the autoscaler's recommender about a workload at `spec` replicas, then decides as the
/// daemon would.
async fn ask_and_decide(clients: &RecommenderClients, autoscaler: &Autoscaler, spec: u32) -> (Observation, Decision) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let observation = clients.ask(recommender(autoscaler), &autoscaler.target, state(spec), deadline).await;
    let target = Target { spec_replicas: spec, status_replicas: Some(spec), ready_replicas: Some(spec) };
    let decision =
        decide(&autoscaler.rule, target, std::slice::from_ref(&observation.reading), &State::default(), now());
    (observation, decision)
}

fn assert_holds(decision: &Decision, spec: u32, reason: &str) {
    assert_eq!((decision.action, decision.replicas, decision.guard), (Action::Hold, spec, Some(Guard::NoData)));
    assert_eq!(decision.metrics[0].position, Position::Unavailable);
    assert!(decision.reason.contains(reason), "{:?} does not say {reason:?}", decision.reason);
}

#[tokio::test]
async fn a_good_reply_scales_and_the_request_is_the_datadog_controllers() {
    let server = FakeRecommender::start().await;
    let web = autoscaler(&server.url, "");
    let clients = recommender_clients(None, None);
    let (observation, decision) = ask_and_decide(&clients, &web, 4).await;
    assert_eq!(
        observation.reading,
        Reading::Replicas { replicas: 7, lower_bound: Some(6), upper_bound: Some(9), observed: Some(0.73) }
    );
    // spec 4 is under the lower bound 6: above the band, and the recommendation is taken.
    assert_eq!(
        (decision.metrics[0].position, decision.action, decision.replicas),
        (Position::Above, Action::ScaleUp, 7)
    );
    assert_eq!(decision.metrics[0].value, Some(0.73));

    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let (method, content_type, body) = &requests[0];
    assert_eq!((method.as_str(), content_type.as_str()), ("POST", "application/json"));
    assert_eq!(
        body,
        &json!({
            "targetRef": {"cluster": "eu-1", "namespace": "prod", "kind": "Deployment", "name": "web",
                          "apiVersion": "apps/v1"},
            "constraints": {"minReplicas": 2, "maxReplicas": 20},
            "state": {"desiredReplicas": 4, "currentReplicas": 4, "readyReplicas": 4},
            "targets": [{"type": "cpu", "lowerBound": 0.6, "upperBound": 0.8}],
            "settings": {"window": "1h"}
        })
    );

    // Without cluster_name, the daemon's K8S_CLUSTER_NAME names the cluster.
    let web = autoscaler(&server.url, "").with_cluster(None);
    let clients = recommender_clients(Some("from-env".into()), None);
    ask_and_decide(&clients, &web, 4).await;
    assert_eq!(server.requests()[1].2["targetRef"]["cluster"], "from-env");
}

trait WithCluster {
    fn with_cluster(self, name: Option<&str>) -> Self;
}

impl WithCluster for Autoscaler {
    fn with_cluster(mut self, name: Option<&str>) -> Self {
        if let Some(recommender) = self.recommender.as_mut() {
            recommender.cluster_name = name.map(Into::into);
        }
        self
    }
}

#[tokio::test]
async fn bounds_decide_where_the_workload_stands() {
    let server = FakeRecommender::start().await;
    let web = autoscaler(&server.url, "");
    let clients = recommender_clients(None, None);
    // spec 10 over the upper bound 8: below the band.
    server.answer(200, reply(7, Some((5, 8))), Duration::ZERO);
    let (_, decision) = ask_and_decide(&clients, &web, 10).await;
    assert_eq!(
        (decision.metrics[0].position, decision.action, decision.replicas),
        (Position::Below, Action::ScaleDown, 8)
    );
    // spec 6 between the bounds: inside, a convergence step to the recommendation.
    let (_, decision) = ask_and_decide(&clients, &web, 6).await;
    assert_eq!((decision.metrics[0].position, decision.converging, decision.replicas), (Position::Inside, true, 7));
}

#[tokio::test]
async fn failures_hold_with_their_reason_and_never_read_as_zero() {
    let server = FakeRecommender::start().await;
    let web = autoscaler(&server.url, "");
    let clients = recommender_clients(None, None);
    let cases = [
        (
            200,
            json!({"error": {"code": 5, "message": "unknown workload"}}).to_string(),
            "the recommender answered an error with code 5 (its message is in the daemon's debug log)",
        ),
        // What the server says goes to the debug log, never into the reason (status, Events).
        (503, "overloaded, come back later".to_string(), "the recommender answered HTTP 503 (Service Unavailable)"),
        (404, String::new(), "the recommender answered HTTP 404 (Not Found)"),
        (200, "<html>not json</html>".to_string(), "the recommender's reply is not a recommendation"),
        (200, "{}".to_string(), "the recommender's reply has no targetReplicas"),
        (
            200,
            reply(0, Some((0, 1))),
            "the source recommends 0 replicas, which is read as no data: tolerate_zero is off",
        ),
    ];
    for (status, body, reason) in cases {
        server.answer(status, body.clone(), Duration::ZERO);
        let (_, decision) = ask_and_decide(&clients, &web, 5).await;
        assert_holds(&decision, 5, reason);
        for word in ["overloaded", "unknown workload", "html"] {
            assert!(!decision.reason.contains(word), "{body:?} is quoted: {}", decision.reason);
        }
    }
    // With tolerate_zero, 0 is a recommendation (clamped to min_replicas).
    let zero = parse_rules(
        &format!(
            "[[autoscaler]]\nname = \"w\"\ntarget = {{ kind = \"Deployment\", namespace = \"p\", name = \"w\" }}\n\
             min_replicas = 2\nmax_replicas = 20\ntolerate_zero = true\nscale_down_limit_factor = 90\n\
             recommender = {{ url = \"{}\", high_watermark = 1 }}\n",
            server.url
        ),
        "rules.toml",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let (_, decision) = ask_and_decide(&clients, &zero.autoscalers[0], 5).await;
    assert_eq!((decision.action, decision.replicas), (Action::ScaleDown, 2));
}

#[tokio::test]
async fn a_slow_recommender_times_out_and_the_cycle_deadline_bounds_the_wait() {
    let server = FakeRecommender::start().await;
    server.answer(200, reply(7, None), Duration::from_secs(5));
    let clients = recommender_clients(None, None);
    let web = autoscaler(&server.url, "timeout = \"1s\"");
    let started = Instant::now();
    let (_, decision) = ask_and_decide(&clients, &web, 5).await;
    let took = started.elapsed();
    assert!(took >= Duration::from_secs(1) && took < Duration::from_secs(3), "took {took:?}");
    assert_holds(&decision, 5, "timed out after 1s");

    // The default 10s timeout, cut short by a cycle deadline 300ms away.
    let web = autoscaler(&server.url, "");
    assert_eq!(recommender(&web).timeout, Duration::from_secs(10));
    let started = Instant::now();
    let deadline = Instant::now() + Duration::from_millis(300);
    let observation = clients.ask(recommender(&web), &web.target, state(5), deadline).await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "took {took:?}");
    assert!(matches!(observation.reading, Reading::Unavailable { ref reason } if reason.starts_with("timed out")));
}

#[tokio::test]
async fn an_unreachable_recommender_holds() {
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let web = autoscaler(&format!("http://127.0.0.1:{port}/"), "");
    let (_, decision) = ask_and_decide(&recommender_clients(None, None), &web, 5).await;
    assert_holds(&decision, 5, "cannot reach the backend");
}

#[tokio::test]
async fn tls_verifies_the_server_and_presents_the_client_certificate() {
    let certs = TestCerts::generate();
    let server = TlsServer::start(&certs, &reply(7, Some((6, 9))));
    let path = |file: &str| certs.path(file).display().to_string();
    let clients = recommender_clients(None, None);

    // Custom CA and client certificate: the reply is read.
    let trusted = format!(
        "ca_file = \"{}\"\nclient_cert_file = \"{}\"\nclient_key_file = \"{}\"",
        path("ca.pem"),
        path("client.pem"),
        path("client.key")
    );
    let web = autoscaler(&server.url(), &trusted);
    let (_, decision) = ask_and_decide(&clients, &web, 4).await;
    assert_eq!((decision.action, decision.replicas), (Action::ScaleUp, 7));

    // The server requires a client certificate.
    let web = autoscaler(&server.url(), &format!("ca_file = \"{}\"", path("ca.pem")));
    let (_, decision) = ask_and_decide(&clients, &web, 4).await;
    assert_holds(&decision, 4, "cannot reach the backend");

    // Verified by default: without the CA, and with another CA, the server is not trusted.
    let other = TestCerts::generate();
    for ca in [None, Some(other.path("ca.pem").display().to_string())] {
        let ca = ca.map(|ca| format!("ca_file = \"{ca}\"\n")).unwrap_or_default();
        let keys =
            format!("{ca}client_cert_file = \"{}\"\nclient_key_file = \"{}\"", path("client.pem"), path("client.key"));
        let web = autoscaler(&server.url(), &keys);
        let (_, decision) = ask_and_decide(&clients, &web, 4).await;
        assert_holds(&decision, 4, "certificate");
    }

    // A CA file that is not one is a configuration error, not a crash.
    let web = autoscaler(&server.url(), &format!("ca_file = \"{}\"", path("client.key")));
    let (_, decision) = ask_and_decide(&clients, &web, 4).await;
    assert_holds(&decision, 4, "configuration error: tls.ca_file");
}

/// The exposition of `registry`, one line per sample, for comparing with what is expected.
fn exposition(registry: &prometheus::Registry) -> String {
    let mut out = Vec::new();
    prometheus::Encoder::encode(&prometheus::TextEncoder::new(), &registry.gather(), &mut out).expect("encode");
    String::from_utf8(out).expect("utf-8")
}

/// The samples of `name` (with any suffix, such as `_bucket`), without HELP and TYPE. A set:
/// series are ordered by label values, which here include random ports.
fn samples(text: &str, name: &str) -> BTreeSet<String> {
    text.lines().filter(|l| l.starts_with(name)).map(String::from).collect()
}

#[tokio::test]
async fn requests_are_counted_in_the_datadog_controllers_client_series() {
    let server = FakeRecommender::start().await;
    let registry = prometheus::Registry::new();
    let clients = Arc::new(RecommenderClients::new(None, HttpClientMetrics::new(&registry).expect("register")));
    // Credentials and a query string in the URL are sent (the credentials as basic auth) but
    // never shown: `client` is the URL without them.
    let url = server.url.replace("http://", "http://reco:s3cret@") + "?token=t0ken";
    let client = server.url.clone();
    let web = autoscaler(&url, "timeout = \"1s\"");

    ask_and_decide(&clients, &web, 4).await;
    server.answer(503, "overloaded", Duration::ZERO);
    ask_and_decide(&clients, &web, 4).await;
    ask_and_decide(&clients, &web, 4).await;
    assert_eq!(server.requests().len(), 3);
    // reco:s3cret, as basic authentication.
    assert_eq!(server.authorizations()[0].as_deref(), Some("Basic cmVjbzpzM2NyZXQ="));

    // A request waiting for its answer is in flight; one that times out is an error.
    server.answer(200, reply(7, None), Duration::from_secs(3));
    let slow = {
        let (clients, web) = (Arc::clone(&clients), web.clone());
        tokio::spawn(async move { ask_and_decide(&clients, &web, 4).await })
    };
    let inflight = format!("http_client_requests_inflight{{client=\"{client}\"}}");
    let deadline = Instant::now() + Duration::from_secs(2);
    while !exposition(&registry).contains(&format!("{inflight} 1")) {
        assert!(Instant::now() < deadline, "no request in flight:\n{}", exposition(&registry));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (observation, _) = slow.await.expect("the slow request");
    assert!(matches!(observation.reading, Reading::Unavailable { ref reason } if reason.starts_with("timed out")));

    // A recommender nothing listens on: an error, and no request.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let closed = format!("http://127.0.0.1:{port}/");
    ask_and_decide(&clients, &autoscaler(&closed, ""), 4).await;

    let text = exposition(&registry);
    assert!(!text.contains("s3cret") && !text.contains("t0ken"), "credentials in the series:\n{text}");
    for (name, kind) in [
        ("http_client_request_duration_seconds", "histogram"),
        ("http_client_requests_total", "counter"),
        ("http_client_requests_errors_total", "counter"),
        ("http_client_requests_inflight", "gauge"),
    ] {
        assert!(text.contains(&format!("# TYPE {name} {kind}\n")), "{name} is not a {kind}:\n{text}");
    }
    assert_eq!(
        samples(&text, "http_client_requests_total"),
        BTreeSet::from([
            format!("http_client_requests_total{{client=\"{client}\",code=\"200\",method=\"post\"}} 1"),
            format!("http_client_requests_total{{client=\"{client}\",code=\"503\",method=\"post\"}} 2"),
        ])
    );
    assert_eq!(
        samples(&text, "http_client_requests_errors_total"),
        BTreeSet::from([
            format!("http_client_requests_errors_total{{client=\"{closed}\"}} 1"),
            format!("http_client_requests_errors_total{{client=\"{client}\"}} 1"),
        ])
    );
    assert_eq!(
        samples(&text, "http_client_requests_inflight"),
        BTreeSet::from([format!("http_client_requests_inflight{{client=\"{closed}\"}} 0"), format!("{inflight} 0")])
    );
    // The Datadog controller's buckets, and one observation per response.
    let buckets: Vec<String> = text
        .lines()
        .filter(|l| l.starts_with("http_client_request_duration_seconds_bucket") && l.contains("code=\"503\""))
        .map(|l| l.split("le=\"").nth(1).and_then(|rest| rest.split('"').next()).unwrap_or_default().to_string())
        .collect();
    assert_eq!(buckets, ["0.1", "0.3", "0.6", "1", "3", "6", "9", "20", "+Inf"]);
    assert_eq!(
        samples(&text, "http_client_request_duration_seconds_count"),
        BTreeSet::from([
            format!("http_client_request_duration_seconds_count{{client=\"{client}\",code=\"200\",method=\"post\"}} 1"),
            format!("http_client_request_duration_seconds_count{{client=\"{client}\",code=\"503\",method=\"post\"}} 2"),
        ])
    );
}

/// A recommender whose certificate is for `reco.internal` only, listening on 127.0.0.1.
fn renamed_server() -> (TestCerts, TlsServer) {
    let certs = TestCerts::for_server("DNS:reco.internal");
    let server = TlsServer::start(&certs, &reply(7, Some((6, 9))));
    (certs, server)
}

fn tls_keys(certs: &TestCerts) -> String {
    let path = |file: &str| certs.path(file).display().to_string();
    format!(
        "ca_file = \"{}\"\nclient_cert_file = \"{}\"\nclient_key_file = \"{}\"\n",
        path("ca.pem"),
        path("client.pem"),
        path("client.key")
    )
}

#[tokio::test]
async fn a_server_name_is_the_name_the_certificate_is_verified_against() {
    let (certs, server) = renamed_server();
    let clients = recommender_clients(None, None);
    let url = format!("{}/recommend", server.url());

    // The certificate does not name 127.0.0.1: refused.
    let web = autoscaler(&url, &tls_keys(&certs));
    let (_, decision) = ask_and_decide(&clients, &web, 4).await;
    assert_holds(&decision, 4, "certificate");

    // Verified against the server name instead, on the url's address.
    let web = autoscaler(&url, &format!("{}server_name = \"reco.internal\"", tls_keys(&certs)));
    let (_, decision) = ask_and_decide(&clients, &web, 4).await;
    assert_eq!((decision.action, decision.replicas), (Action::ScaleUp, 7), "{}", decision.reason);
    // The name went in the handshake; the Host header is still the url's, as Go's client sends it.
    let port = server.addr.port();
    assert_eq!(server.seen(), [(Some("reco.internal".to_string()), Some(format!("127.0.0.1:{port}")))]);

    // Another name is still checked.
    let web = autoscaler(&url, &format!("{}server_name = \"other.internal\"", tls_keys(&certs)));
    let (_, decision) = ask_and_decide(&clients, &web, 4).await;
    assert_holds(&decision, 4, "certificate");
}

#[tokio::test]
async fn a_server_name_resolves_to_the_url_host_when_it_is_a_dns_name() {
    let (certs, server) = renamed_server();
    let clients = recommender_clients(None, None);
    // `localhost` is looked up (to 127.0.0.1), then verified as reco.internal.
    let url = format!("https://localhost:{}/recommend", server.addr.port());
    let web = autoscaler(&url, &format!("{}server_name = \"reco.internal\"", tls_keys(&certs)));
    let (_, decision) = ask_and_decide(&clients, &web, 4).await;
    assert_eq!((decision.action, decision.replicas), (Action::ScaleUp, 7), "{}", decision.reason);
    assert_eq!(server.seen()[0].1, Some(format!("localhost:{}", server.addr.port())));
}

#[tokio::test]
async fn wpa_tls_files_are_read_only_inside_the_tls_directory() {
    let certs = TestCerts::generate();
    let server = TlsServer::start(&certs, &reply(7, Some((6, 9))));
    let clients = recommender_clients(None, None);
    let tls_dir = tempfile::tempdir().unwrap();
    for file in ["ca.pem", "client.pem", "client.key"] {
        std::fs::copy(certs.path(file), tls_dir.path().join(file)).unwrap();
    }
    // A symlink in the directory to a file outside it.
    std::os::unix::fs::symlink(certs.path("ca.pem"), tls_dir.path().join("outside.pem")).unwrap();
    let in_dir = |ca: &str| {
        let path = |file: &str| tls_dir.path().join(file).display().to_string();
        let keys = format!(
            "ca_file = \"{}\"\nclient_cert_file = \"{}\"\nclient_key_file = \"{}\"",
            path(ca),
            path("client.pem"),
            path("client.key")
        );
        let mut web = autoscaler(&server.url(), &keys);
        web.recommender.as_mut().unwrap().tls_dir = Some(tls_dir.path().to_path_buf());
        web
    };
    let (_, decision) = ask_and_decide(&clients, &in_dir("ca.pem"), 4).await;
    assert_eq!((decision.action, decision.replicas), (Action::ScaleUp, 7), "{}", decision.reason);
    let (_, decision) = ask_and_decide(&clients, &in_dir("outside.pem"), 4).await;
    assert_holds(&decision, 4, "leads outside recommender_tls_dir");
}

#[tokio::test]
async fn a_redirect_is_not_followed() {
    let server = FakeRecommender::start().await;
    let elsewhere = FakeRecommender::start().await;
    server.redirect(307, &elsewhere.url);
    let clients = recommender_clients(None, None);
    let (_, decision) = ask_and_decide(&clients, &autoscaler(&server.url, ""), 4).await;
    assert_holds(&decision, 4, "the recommender answered HTTP 307 (Temporary Redirect)");
    assert_eq!(server.requests().len(), 1);
    assert!(elsewhere.requests().is_empty(), "the redirect was followed");
}

#[tokio::test]
async fn rotated_tls_files_are_read_again() {
    let (certs, server) = renamed_server();
    let clients = recommender_clients(None, Some(Duration::ZERO));
    let ca = tempfile::tempdir().unwrap();
    let ca_file = ca.path().join("ca.pem");
    let other = TestCerts::generate();
    std::fs::copy(other.path("ca.pem"), &ca_file).unwrap();
    let path = |file: &str| certs.path(file).display().to_string();
    let keys = format!(
        "ca_file = \"{}\"\nclient_cert_file = \"{}\"\nclient_key_file = \"{}\"\nserver_name = \"reco.internal\"",
        ca_file.display(),
        path("client.pem"),
        path("client.key")
    );
    let web = autoscaler(&server.url(), &keys);
    let (_, decision) = ask_and_decide(&clients, &web, 4).await;
    assert_holds(&decision, 4, "certificate");
    // The right CA, written in place (another size, so the change is seen whatever the clock).
    let mut right = std::fs::read(certs.path("ca.pem")).unwrap();
    right.extend_from_slice(b"\n\n");
    std::fs::write(&ca_file, right).unwrap();
    let (_, decision) = ask_and_decide(&clients, &web, 4).await;
    assert_eq!((decision.action, decision.replicas), (Action::ScaleUp, 7), "{}", decision.reason);
}

#[tokio::test]
async fn recommenders_no_longer_in_use_leave_no_series_behind() {
    let server = FakeRecommender::start().await;
    let registry = prometheus::Registry::new();
    let clients = RecommenderClients::new(None, HttpClientMetrics::new(&registry).expect("register"));
    // Autoscalers come and go, each with a recommender of its own (a path each).
    let churned: Vec<Autoscaler> = (0..40).map(|i| autoscaler(&format!("{}/{i}", server.url), "")).collect();
    let kept = autoscaler(&format!("{}/kept", server.url), "");
    clients.retain(churned.iter().chain([&kept]).map(recommender));
    server.answer(503, "busy", Duration::ZERO);
    for web in churned.iter().chain([&kept]) {
        ask_and_decide(&clients, web, 4).await;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let closed = autoscaler(&format!("http://127.0.0.1:{port}/"), "");
    clients.retain(churned.iter().chain([&kept, &closed]).map(recommender));
    ask_and_decide(&clients, &closed, 4).await;
    let series = |text: &str| text.lines().filter(|l| l.starts_with("http_client_")).count();
    // Per recommender: 12 duration lines (9 buckets, sum, count; and the counter), errors, in flight.
    assert!(series(&exposition(&registry)) > 40 * 12, "{}", exposition(&registry));

    // Only `kept` runs now: the others' series go.
    clients.retain([recommender(&kept)]);
    let text = exposition(&registry);
    let remaining: BTreeSet<&str> = text
        .lines()
        .filter(|l| l.starts_with("http_client_"))
        .filter_map(|l| l.split("client=\"").nth(1)?.split('"').next())
        .collect();
    assert_eq!(remaining, BTreeSet::from([format!("{}/kept", server.url).as_str()]), "{text}");

    // A request still in flight for a recommender that went does not bring its series back.
    ask_and_decide(&clients, &churned[0], 4).await;
    ask_and_decide(&clients, &closed, 4).await;
    assert!(!exposition(&registry).contains(&format!("{}/0\"", server.url)), "{}", exposition(&registry));
    assert!(!exposition(&registry).contains(&format!("127.0.0.1:{port}/")), "{}", exposition(&registry));
    clients.retain([]);
    assert_eq!(series(&exposition(&registry)), 0, "{}", exposition(&registry));
}
