//! Parsers never panic. Every reader of outside input is fed arbitrary bytes and mutated valid
//! documents (bits flipped, bytes inserted or deleted, truncated, lines duplicated, which
//! duplicates keys, number tokens swapped for NaN, 1e999, -0 or huge integers, values swapped
//! for other types) and must answer Ok or an error. Where an answer carries values, the property
//! also checks an invariant that the rest of the daemon relies on.
//!
//! One `proptest!` block per parser, 256 cases per property unless `PROPTEST_CASES` says
//! otherwise; BENCHMARKS.md ("Parser fuzzing") has the long run.
//!
//! The Prometheus response parser is private to its module, so it is driven through
//! `PrometheusClient::evaluate` against a loopback server that answers what the case says.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "test code: clippy.toml lets #[test] functions unwrap, index and print, and the helpers beside them do the same"
)]

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use http_body_util::Full;
use hyper::{body::Bytes, server::conn::http1, service::service_fn, Response, StatusCode};
use hyper_util::rt::TokioIo;
use proptest::prelude::*;
use proptest::{collection::vec, option, sample::select, sample::Index};
use serde_json::Value;
use watermarkd::adapters::backend::prometheus::PrometheusClient;
use watermarkd::adapters::backend::{MetricQuery, Observation};
use watermarkd::adapters::telemetry::BackendMetrics;
use watermarkd::commands::decide;
use watermarkd::domain::crd::{
    map_wpa, MapError, MappingOptions, NoDatadogMetrics, WatermarkPodAutoscaler, QUERIES_ANNOTATION,
};
use watermarkd::domain::import::{import, read_documents, AdapterConfig, ImportOptions, Severity};
use watermarkd::domain::rules::{parse_rules, Backend, Reducer};
use watermarkd::domain::state;
use watermarkd::testing::datadog::{
    error_text, rate_limit_wait, read_v1_answer, RateLimitHeaders, V1Answer, V1Context,
};
use watermarkd_engine::{Reading, Timestamp};

// Seeds and mutations, shared by every property.

/// The contents of every file in `dir` (relative to the repository) whose name ends in `suffix`.
fn files(dir: &str, suffix: &str) -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut found: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.to_string_lossy().ends_with(suffix))
        .map(|path| (path.display().to_string(), std::fs::read_to_string(&path).expect("read a seed")))
        .collect();
    found.sort();
    assert!(!found.is_empty(), "no seeds in {}", dir.display());
    found
}

/// A list written as one string, split at whitespace.
fn words(list: &'static str) -> Vec<&'static str> {
    list.split_whitespace().collect()
}

/// Numbers a parser must survive wherever a number is expected.
const HOSTILE_NUMBERS: &str = "\
    NaN nan inf -inf +Inf 1e999 -1e999 1e-999 -0 -0.0 0 -1 4294967296 9223372036854775807 \
    9223372036854775808 -9223372036854775809 18446744073709551616 123456789012345678901234567890 0x10 \
    1_000 1. .5 1e --1";
/// Values of another type than the field may expect.
const OTHER_TYPES: &str = r#""" "x" "NaN" true null [] {} [1,"a"] {"a":1} 0 -0 1.5"#;
/// Bytes that mean something in TOML, JSON or YAML: inserted as often as all others together.
const SYNTAX: &[u8] = b"{}[]\"',:=#\\\n -.0e";

#[derive(Clone, Debug)]
enum Edit {
    FlipBit(Index, u8),
    Insert(Index, u8),
    Delete(Index, usize),
    Truncate(Index),
    /// Copies one line before another: a duplicate key in TOML, YAML and pretty-printed JSON.
    DuplicateLine(Index, Index),
    SwapNumber(Index, &'static str),
    /// Replaces a scalar (number, quoted string or bare word) with a value of another type.
    SwapValue(Index, &'static str),
}

/// Edits that keep the syntax come more often: they get past the syntax to the fields.
fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        1 => (any::<Index>(), 0..8u8).prop_map(|(at, bit)| Edit::FlipBit(at, 1 << bit)),
        1 => (any::<Index>(), prop_oneof![any::<u8>(), select(SYNTAX)]).prop_map(|(at, byte)| Edit::Insert(at, byte)),
        1 => (any::<Index>(), 1..16usize).prop_map(|(at, n)| Edit::Delete(at, n)),
        1 => any::<Index>().prop_map(Edit::Truncate),
        2 => (any::<Index>(), any::<Index>()).prop_map(|(line, before)| Edit::DuplicateLine(line, before)),
        3 => (any::<Index>(), select(words(HOSTILE_NUMBERS))).prop_map(|(at, n)| Edit::SwapNumber(at, n)),
        3 => (any::<Index>(), select(words(OTHER_TYPES))).prop_map(|(at, v)| Edit::SwapValue(at, v)),
    ]
}

/// Byte ranges of the scalars in `doc`, each with whether it looks like a number. Rough on
/// purpose (keys count as bare words): it only chooses where an edit lands.
fn scalars(doc: &[u8]) -> Vec<(usize, usize, bool)> {
    let mut found = Vec::new();
    let mut i = 0;
    while i < doc.len() {
        let (start, first) = (i, doc[i]);
        if first == b'"' || first == b'\'' {
            i += 1;
            while i < doc.len() && doc[i] != first && doc[i] != b'\n' {
                i += if doc[i] == b'\\' { 2 } else { 1 };
            }
            i = (i + 1).min(doc.len());
            found.push((start, i, false));
        } else if first.is_ascii_alphanumeric() || first == b'-' || first == b'+' {
            while i < doc.len() && (doc[i].is_ascii_alphanumeric() || b"-+._".contains(&doc[i])) {
                i += 1;
            }
            let digit_at = if first == b'-' || first == b'+' { start + 1 } else { start };
            found.push((start, i, doc.get(digit_at).is_some_and(u8::is_ascii_digit)));
        } else {
            i += 1;
        }
    }
    found
}

fn apply(mut doc: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    for edit in edits {
        let len = doc.len();
        match *edit {
            Edit::FlipBit(at, bit) if len > 0 => doc[at.index(len)] ^= bit,
            Edit::Insert(at, byte) => doc.insert(at.index(len + 1), byte),
            Edit::Delete(at, n) if len > 0 => {
                let start = at.index(len);
                doc.drain(start..(start + n).min(len));
            }
            Edit::Truncate(at) => doc.truncate(at.index(len + 1)),
            Edit::DuplicateLine(line, before) => {
                let starts: Vec<usize> = std::iter::once(0)
                    .chain(doc.iter().enumerate().filter(|(_, b)| **b == b'\n').map(|(i, _)| i + 1))
                    .collect();
                let first = line.index(starts.len());
                let mut copy = doc[starts[first]..starts.get(first + 1).copied().unwrap_or(len)].to_vec();
                if copy.last() != Some(&b'\n') {
                    copy.push(b'\n');
                }
                let at = starts[before.index(starts.len())];
                doc.splice(at..at, copy);
            }
            Edit::SwapNumber(at, with) | Edit::SwapValue(at, with) => {
                let numbers_only = matches!(edit, Edit::SwapNumber(..));
                let found: Vec<_> = scalars(&doc).into_iter().filter(|s| s.2 || !numbers_only).collect();
                if !found.is_empty() {
                    let (start, end, _) = found[at.index(found.len())];
                    doc.splice(start..end, with.bytes());
                }
            }
            _ => {}
        }
    }
    doc
}

/// What every parser is fed: mostly mutated seeds, and arbitrary bytes and text.
fn input(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        1 => vec(any::<u8>(), 0..256),
        1 => any::<String>().prop_map(String::into_bytes),
        6 => (select(seeds), vec(edit(), 1..4)).prop_map(|(seed, edits)| apply(seed, &edits)),
    ]
}

/// For a JSON format: `input` over each text as it came and pretty-printed (one key a line, so
/// that duplicating a line duplicates a key), or a text with one node replaced by arbitrary JSON.
fn json_input<T: AsRef<str>>(texts: &[T]) -> impl Strategy<Value = Vec<u8>> {
    let values: Vec<Value> = texts.iter().map(|t| serde_json::from_str(t.as_ref()).expect("a JSON seed")).collect();
    let pretty = values.iter().map(|value| serde_json::to_vec_pretty(value).expect("pretty JSON"));
    let seeds = texts.iter().map(|t| t.as_ref().as_bytes().to_vec()).chain(pretty).collect();
    prop_oneof![3 => input(seeds), 1 => grafted(values).prop_map(|value| value.to_string().into_bytes())]
}

/// Every object key in `values`: the vocabulary of a format, taken from its seeds.
fn keys_in(values: &[Value]) -> Vec<String> {
    let mut pointers_found = Vec::new();
    values.iter().for_each(|value| pointers(value, String::new(), &mut pointers_found));
    let keys: BTreeSet<String> = pointers_found
        .iter()
        .filter_map(|p| Some(p.rsplit_once('/')?.1.replace("~1", "/").replace("~0", "~")))
        .collect();
    keys.into_iter().filter(|key| !key.chars().all(|c| c.is_ascii_digit())).collect()
}

/// Arbitrary JSON whose object keys are mostly `keys`, so that it gets past field matching.
fn json(keys: Vec<String>) -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        select(words(HOSTILE_NUMBERS)).prop_map(Value::from),
        "[a-zA-Z0-9 ./:{}*_-]{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(Value::Array),
            vec((prop_oneof![4 => select(keys.clone()), 1 => "[a-z]{0,6}"], inner), 0..6)
                .prop_map(|fields| Value::Object(fields.into_iter().collect())),
        ]
    })
}

/// The JSON pointer of every node in `value`, in document order.
fn pointers(value: &Value, at: String, out: &mut Vec<String>) {
    let children: Vec<(String, &Value)> = match value {
        Value::Array(items) => items.iter().enumerate().map(|(i, item)| (i.to_string(), item)).collect(),
        Value::Object(fields) => fields.iter().map(|(k, v)| (k.replace('~', "~0").replace('/', "~1"), v)).collect(),
        _ => Vec::new(),
    };
    out.push(at.clone());
    children.into_iter().for_each(|(key, child)| pointers(child, format!("{at}/{key}"), out));
}

/// A valid document with one node replaced by arbitrary JSON.
fn grafted(seeds: Vec<Value>) -> impl Strategy<Value = Value> {
    let keys = keys_in(&seeds);
    (select(seeds), any::<Index>(), json(keys)).prop_map(|(mut doc, at, with)| {
        let mut all = Vec::new();
        pointers(&doc, String::new(), &mut all);
        if let Some(node) = doc.pointer_mut(&all[at.index(all.len())]) {
            *node = with;
        }
        doc
    })
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The times a `Timestamp` can be written as (RFC 3339, 1970 to 9999); `watermarkd query`
/// prints a value's time.
const WRITABLE_MILLIS: std::ops::RangeInclusive<i64> = 0..=253_402_300_799_999;

/// A backend's observation: a value is finite, dated in writable time (when `dated` says to
/// check that) and carries no error; no value says why.
fn check_observation(observation: &Observation, dated: bool) -> Result<(), TestCaseError> {
    match &observation.reading {
        Reading::Value { value, at } => {
            prop_assert!(value.is_finite(), "{observation:?}");
            prop_assert!(!dated || WRITABLE_MILLIS.contains(&at.unix_millis()), "{observation:?}");
            prop_assert!(observation.detail.error.is_none(), "{observation:?}");
        }
        Reading::Unavailable { .. } => prop_assert!(observation.detail.error.is_some(), "{observation:?}"),
        Reading::Replicas { .. } => prop_assert!(false, "a metrics backend answered replicas: {observation:?}"),
    }
    Ok(())
}

// The rules file (`watermarkd check`, the daemon's --config).

fn rules_seeds() -> Vec<Vec<u8>> {
    files("config", ".toml").into_iter().map(|(_, text)| text.into_bytes()).collect()
}

proptest! {
    #[test]
    fn rules_files_parse_or_list_problems(doc in input(rules_seeds())) {
        match parse_rules(&lossy(&doc), "fuzz.toml") {
            Ok(file) => {
                let mut names = BTreeSet::new();
                for autoscaler in &file.autoscalers {
                    prop_assert!(names.insert(&autoscaler.name), "duplicate autoscaler {}", autoscaler.name);
                    let rule = &autoscaler.rule;
                    prop_assert!(rule.min_replicas() <= rule.max_replicas());
                    prop_assert_eq!(autoscaler.metrics.len(), rule.metrics().len());
                    for metric in rule.metrics() {
                        prop_assert!(metric.low_watermark <= metric.high_watermark);
                    }
                    for source in &autoscaler.metrics {
                        prop_assert!(file.backends.contains_key(&source.backend), "{}", source.backend);
                    }
                }
            }
            Err(err) => prop_assert!(!err.problems.is_empty()),
        }
    }
}

// `watermarkd import`: other autoscalers' manifests, and prometheus-adapter's configuration.

fn import_seeds(except: &str) -> Vec<Vec<u8>> {
    files("tests/fixtures/import", ".yaml")
        .into_iter()
        .filter(|(path, _)| !path.ends_with(except))
        .map(|(_, text)| text.into_bytes())
        .collect()
}

fn adapter_config() -> Option<AdapterConfig> {
    let (path, text) = files("tests/fixtures/import", "prometheus-adapter.yaml").remove(0);
    AdapterConfig::parse(&path, &text).ok()
}

proptest! {
    #[test]
    fn manifests_import_or_say_why(doc in input(import_seeds("prometheus-adapter.yaml"))) {
        let documents = match read_documents("fuzz.yaml", &lossy(&doc)) {
            Ok(documents) => documents,
            Err(finding) => {
                prop_assert!(finding.severity == Severity::Invalid && !finding.message.is_empty(), "{finding:?}");
                return Ok(());
            }
        };
        let options = ImportOptions { adapter: adapter_config(), ..ImportOptions::default() };
        let imported = import(&documents, &options);
        for finding in &imported.findings {
            prop_assert!(!finding.message.is_empty(), "{finding:?}");
        }
        // What is written is a rules file the daemon reads.
        if imported.autoscalers > 0 && !imported.has(Severity::Invalid) {
            let read = parse_rules(&imported.text, "imported.toml");
            prop_assert!(read.is_ok(), "{}\n{:?}", imported.text, read.err());
        }
    }

    #[test]
    fn adapter_configs_parse_or_say_why(doc in input(import_seeds("shop-web.yaml"))) {
        if let Err(findings) = AdapterConfig::parse("fuzz.yaml", &lossy(&doc)) {
            prop_assert!(!findings.is_empty());
        }
    }
}

// `watermarkd decide`: JSON documents (JSON Lines) on standard input.

fn decide_lines() -> Vec<String> {
    let (_, text) = files("docs/examples", "decide-input.jsonl").remove(0);
    text.lines().map(str::to_string).collect()
}

/// Each document alone, and all of them as JSON Lines.
fn decide_input() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![json_input(&decide_lines()), input(vec![decide_lines().join("\n").into_bytes()])]
}

proptest! {
    #[test]
    fn decide_writes_one_json_line_per_answer(input in decide_input()) {
        let mut out = Vec::new();
        // Not UTF-8 is an I/O error, which the command reports.
        if let Ok(all_ok) = decide::run(input.as_slice(), &mut out) {
            for line in lossy(&out).lines() {
                let answer: Value = serde_json::from_str(line).map_err(|e| TestCaseError::fail(format!("{line}: {e}")))?;
                prop_assert!(!all_ok || answer.get("error").is_none(), "{line}");
            }
        }
    }

    #[test]
    fn decide_documents_decide_or_say_why(
        doc in grafted(decide_lines().iter().map(|l| serde_json::from_str(l).expect("JSON")).collect()),
    ) {
        if let Ok(decision) = decide::decide_one(0, doc) {
            // `run` writes every decision as a line.
            prop_assert!(serde_json::to_string(&decision).is_ok());
        }
    }
}

// Datadog answers, as recorded in tests/fixtures/datadog.

/// The recorded bodies of the fixtures whose names start with `prefix`.
fn datadog_bodies(prefix: &str) -> impl Strategy<Value = Vec<u8>> {
    let fixtures = files("tests/fixtures/datadog", ".json");
    let bodies: Vec<String> = fixtures
        .iter()
        .filter(|(path, _)| Path::new(path).file_name().is_some_and(|n| n.to_string_lossy().starts_with(prefix)))
        .map(|(_, text)| {
            let fixture: Value = serde_json::from_str(text).expect("a fixture");
            fixture["response"]["body"].to_string()
        })
        .collect();
    json_input(&bodies)
}

/// Datadog point times are not checked yet: see `datadog_point_times_outside_1970_to_9999_are_no_values`.
const DATADOG_DATES: bool = false;

const RATE_LIMIT_HEADERS: &str = "\
    X-RateLimit-Limit x-ratelimit-period X-RATELIMIT-REMAINING x-ratelimit-reset x-ratelimit-name \
    content-type";

fn rate_limit_headers() -> impl Strategy<Value = Vec<(String, String)>> {
    let name = prop_oneof![4 => select(words(RATE_LIMIT_HEADERS)).prop_map(String::from), 1 => "[ -~]{0,20}"];
    let value = prop_oneof![select(words(HOSTILE_NUMBERS)).prop_map(String::from), "[0-9. e+-]{0,12}", any::<String>()];
    vec((name, value), 0..6)
}

fn read_headers(pairs: &[(String, String)]) -> RateLimitHeaders {
    watermarkd::testing::rate_limit_headers(pairs.iter().map(|(name, value)| (name.as_str(), value.as_str())))
}

fn http_status() -> impl Strategy<Value = u16> {
    prop_oneof![
        2 => Just(200),
        2 => select(vec![201, 204, 400, 401, 403, 404, 408, 422, 429, 500, 502, 503]),
        1 => any::<u16>(),
    ]
}

/// The cycle's time (a clock reading, so a writable time): near the recordings (2021-2022), or
/// anywhere.
fn now() -> impl Strategy<Value = Timestamp> {
    prop_oneof![1_600_000_000_000i64..1_700_000_000_000, WRITABLE_MILLIS].prop_map(Timestamp::from_unix_millis)
}

/// A staleness bound; long ones let old recorded points through to the value checks.
fn max_age() -> impl Strategy<Value = Duration> {
    any::<u64>().prop_map(Duration::from_secs)
}

proptest! {
    #[test]
    fn datadog_v1_answers_observe_or_fail(
        status in http_status(),
        headers in rate_limit_headers(),
        body in datadog_bodies("v1_"),
        queries in 1..4usize,
        now in now(),
        max_age in option::of(max_age()),
    ) {
        let cx = V1Context { queries, layout: &[], now, max_age, site: "datadoghq.com" };
        match read_v1_answer(status, &read_headers(&headers), &body, &cx) {
            V1Answer::Answered(observations) => {
                prop_assert_eq!(observations.len(), queries);
                for observation in &observations {
                    check_observation(observation, DATADOG_DATES)?;
                }
            }
            // "Worth another attempt in this cycle (5xx); never for 4xx", except 408.
            V1Answer::Failed { retryable, .. } => prop_assert!(!retryable || status == 408 || status >= 500),
        }
    }

    #[test]
    fn datadog_errors_and_rate_limits_read_leniently(
        status in http_status(),
        headers in rate_limit_headers(),
        body in datadog_bodies(""),
    ) {
        let rate = read_headers(&headers);
        // A 429 is waited out, never for longer than its reset or a minute, whichever is longer.
        let wait = rate_limit_wait(&rate);
        let bound = Duration::from_secs(rate.reset.unwrap_or(0)).max(Duration::from_secs(60));
        prop_assert!(!wait.is_zero() && wait <= bound, "{rate:?}: {wait:?}");
        let text = error_text(status, &body);
        // At most 300 bytes of what the server said, after the status.
        prop_assert!(text.len() <= 320, "{} bytes: {text}", text.len());
    }
}

// Prometheus answers, through a loopback server.

/// Answers shaped as Prometheus, Thanos and proxies send them (no errorType that is retried:
/// each retry waits, and retries do not change how a body is read).
const PROMETHEUS_SEEDS: &[&str] = &[
    r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"pod":"a"},"value":[1700000000.5,"1.5"]}]}}"#,
    r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[100,"1"]},{"metric":{},"value":[99.5,"4"]},{"metric":{},"value":[100,"7"]}]},"warnings":["partial answer"],"infos":["not a counter"]}"#,
    r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"histogram":[1,{"count":"3","sum":"4","buckets":[]}]}]}}"#,
    r#"{"status":"success","data":{"resultType":"scalar","result":[1700000000.5,"2"]}}"#,
    // A dated query's answer (the added series carries the data time) that a store marked partial.
    r#"{"status":"success","isPartial":true,"data":{"resultType":"vector","result":[{"metric":{"pod":"a"},"value":[1700000000.5,"3"]},{"metric":{"watermarkd_sample":"time"},"value":[1700000000.5,"1699999990.25"]}]}}"#,
    r#"{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[1,"1"]]}]}}"#,
    r#"{"status":"error","errorType":"bad_data","error":"1:5: parse error: unexpected end of input"}"#,
];
/// Not 5xx: those are retried with waits, and read as a 4xx is.
fn prometheus_status() -> impl Strategy<Value = u16> {
    prop_oneof![3 => Just(200), 1 => select(vec![204, 400, 401, 403, 404, 409, 422, 429])]
}

/// One client and a server that answers every request with `reply`: one per test binary, as
/// the server outlives the cases.
struct FakePrometheus {
    runtime: tokio::runtime::Runtime,
    client: PrometheusClient,
    reply: Arc<Mutex<(u16, Vec<u8>)>>,
}

fn fake_prometheus() -> &'static FakePrometheus {
    static FAKE: OnceLock<FakePrometheus> = OnceLock::new();
    FAKE.get_or_init(|| {
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
        let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let reply = Arc::new(Mutex::new((200, Vec::new())));
        let shared = Arc::clone(&reply);
        runtime.spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let shared = Arc::clone(&shared);
                let service = service_fn(move |_| {
                    let (status, body) = shared.lock().expect("reply").clone();
                    let mut response = Response::new(Full::new(Bytes::from(body)));
                    *response.status_mut() = StatusCode::from_u16(status).expect("status");
                    async move { Ok::<_, Infallible>(response) }
                });
                tokio::spawn(http1::Builder::new().serve_connection(TokioIo::new(stream), service));
            }
        });
        let rules =
            format!("[backend.prom]\ntype = \"prometheus\"\nurl = \"{url}\"\ntimeout = \"1s\"\nmax_in_flight = 1");
        let Some(Backend::Prometheus(config)) = parse_rules(&rules, "rules").expect("rules").backends.remove("prom")
        else {
            panic!("not a Prometheus backend")
        };
        let client = PrometheusClient::new("fuzz", &config, Arc::new(BackendMetrics::detached())).expect("client");
        FakePrometheus { runtime, client, reply }
    })
}

proptest! {
    #[test]
    fn prometheus_answers_observe_or_fail(status in prometheus_status(), body in json_input(PROMETHEUS_SEEDS)) {
        let fake = fake_prometheus();
        *fake.reply.lock().expect("reply") = (status, body);
        // The same query text is sent once and read with each reducer.
        let queries: Vec<MetricQuery> = [None, Some(Reducer::Max), Some(Reducer::Min), Some(Reducer::Sum), Some(Reducer::Avg)]
            .into_iter()
            .map(|reducer| MetricQuery { query: "up".into(), reducer })
            .collect();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let observations = fake.runtime.block_on(fake.client.evaluate(&queries, Timestamp::from_unix_millis(1_700_000_000_000), deadline));
        prop_assert_eq!(observations.len(), queries.len());
        for observation in &observations {
            check_observation(observation, true)?;
        }
    }
}

// The `watermarkd.io/state` annotation on a target.

const STATE_SEEDS: &[&str] = &[
    r#"{"v":1,"autoscaler":"billing","state":{"last_scale_time":"2023-11-14T22:13:20.500Z","above_since":"2023-11-14T22:13:30Z","below_since":null,"recommendations":[{"replicas":4,"at":"2023-11-14T22:13:31Z"}],"scale_events":[{"from":3,"to":4,"at":"2023-11-14T22:13:20.500Z"}]}}"#,
    r#"{"v":1,"autoscaler":"billing","state":{"last_scale_time":1700000000,"below_since":1700000000.25}}"#,
    r#"{"v":1,"autoscaler":"search","state":{}}"#,
    r#"{"v":2,"autoscaler":"billing","state":{"last_scale":1700000000500,"recommendations":[[6,1700000031000],[4,1700000031000]],"scale_events":[[3,4,1700000000500],[4,9,1700000010000,1700000001000]],"idle_since":1700000012000}}"#,
];

proptest! {
    #[test]
    fn state_annotations_read_back_what_they_write(text in json_input(STATE_SEEDS)) {
        if let Ok(Some(decoded)) = state::decode_annotation("billing", &lossy(&text)) {
            // The daemon writes back what it read (in the current format): that must read
            // again, unchanged.
            let written = state::encode_annotation("billing", &decoded.state);
            let again = state::decode_annotation("billing", &written);
            prop_assert_eq!(again, Ok(Some(state::Decoded { state: decoded.state, legacy: false })));
        }
    }
}

// WatermarkPodAutoscaler objects (CRD mode), and their `watermarkd.io/queries` annotation.

/// The WPA objects among the fixtures (the CRD itself is not one).
fn wpa_texts() -> Vec<String> {
    files("tests/fixtures/wpa", ".yaml")
        .into_iter()
        .filter(|(path, _)| !path.ends_with("watermarkpodautoscalers.yaml"))
        .map(|(_, text)| text)
        .collect()
}

fn wpa_values() -> Vec<Value> {
    wpa_texts().iter().map(|text| serde_yaml_ng::from_str(text).expect("a WPA fixture")).collect()
}

/// The daemon's backends in CRD mode: `dd` (the default) and `prom`.
const MAPPING_RULES: &str = "[backend.dd]\ntype = \"datadog\"\napi_key_env = \"DD_API_KEY\"\napp_key_env = \"DD_APP_KEY\"\n[backend.prom]\ntype = \"prometheus\"\nurl = \"http://prom:9090\"\n";

fn mapping_options() -> &'static MappingOptions {
    static OPTIONS: OnceLock<MappingOptions> = OnceLock::new();
    OPTIONS.get_or_init(|| {
        MappingOptions::new("dd").with_backends(&parse_rules(MAPPING_RULES, "rules").expect("rules").backends)
    })
}

/// The mapping the daemon would do.
fn check_mapping(wpa: &WatermarkPodAutoscaler) -> Result<(), TestCaseError> {
    match map_wpa(wpa, mapping_options(), &NoDatadogMetrics) {
        Ok(mapped) => {
            let rule = &mapped.autoscaler.rule;
            prop_assert!(rule.min_replicas() <= rule.max_replicas());
            // Metric i of the rule is spec.metrics[i], so that problems map back; with a
            // recommender, spec.metrics is not read and the recommender is the one metric.
            let expected = if wpa.spec.recommender.is_some() { 1 } else { wpa.spec.metrics.len() };
            prop_assert_eq!(rule.metrics().len(), expected);
        }
        Err(MapError::Invalid { problems, .. }) => prop_assert!(!problems.is_empty()),
        Err(MapError::Unsupported(unsupported)) => prop_assert!(!unsupported.is_empty()),
        // Decided by the WPA index among all the objects, never by the mapping of one.
        Err(error @ MapError::TargetConflict { .. }) => prop_assert!(false, "one WPA alone cannot conflict: {error}"),
    }
    Ok(())
}

const QUERIES_SEEDS: &[&str] = &[
    r#"[{"metricName": "custom.request_duration.max", "backend": "prom", "query": "sum(rate(http_requests_total{service=\"billing\"}[1m]))", "reducer": "max", "maxAge": "2m"}]"#,
    r#"[{"metric": 0, "query": "max:trace.http.request.duration{service:billing}", "maxAge": 120}]"#,
];

proptest! {
    #[test]
    fn wpa_objects_map_or_say_why(object in prop_oneof![
        // Arbitrary objects, and valid ones with a part replaced by arbitrary JSON.
        (json(keys_in(&wpa_values())), json(keys_in(&wpa_values()))).prop_map(|(metadata, spec)| serde_json::json!({
            "apiVersion": "datadoghq.com/v1alpha1", "kind": "WatermarkPodAutoscaler", "metadata": metadata, "spec": spec,
        })),
        grafted(wpa_values()),
    ]) {
        if let Ok(wpa) = serde_json::from_value::<WatermarkPodAutoscaler>(object) {
            check_mapping(&wpa)?;
        }
    }

    #[test]
    fn mutated_wpa_yaml_maps_or_says_why(text in input(wpa_texts().into_iter().map(String::into_bytes).collect())) {
        if let Ok(wpa) = serde_yaml_ng::from_str::<WatermarkPodAutoscaler>(&lossy(&text)) {
            check_mapping(&wpa)?;
        }
    }

    #[test]
    fn queries_annotations_map_or_say_why(
        object in select(wpa_values()),
        annotation in json_input(QUERIES_SEEDS),
    ) {
        let mut wpa: WatermarkPodAutoscaler = serde_json::from_value(object).expect("a WPA fixture");
        wpa.metadata.annotations.get_or_insert_default().insert(QUERIES_ANNOTATION.into(), lossy(&annotation));
        check_mapping(&wpa)?;
    }
}

/// The seeds are valid, so that their mutations start from documents that get deep.
#[test]
fn seeds_are_valid() {
    files("config", ".toml").iter().for_each(|(path, text)| assert!(parse_rules(text, path).is_ok(), "{path}"));
    for line in decide_lines() {
        assert!(decide::decide_one(0, serde_json::from_str(&line).expect("JSON")).is_ok(), "{line}");
    }
    STATE_SEEDS.iter().for_each(|text| assert!(state::decode_annotation("billing", text).is_ok(), "{text}"));
    for text in QUERIES_SEEDS {
        let mut wpa: WatermarkPodAutoscaler = serde_json::from_value(wpa_values().remove(0)).expect("a WPA");
        wpa.metadata.annotations.get_or_insert_default().insert(QUERIES_ANNOTATION.into(), text.to_string());
        assert!(map_wpa(&wpa, mapping_options(), &NoDatadogMetrics).is_ok(), "{text}");
    }
}

/// Found by `decide_documents_decide_or_say_why` and `state_annotations_read_back_what_they_write`:
/// a time before 1970 was read, then panicked in humantime when the decision or the state was
/// written. Such times are now refused where they are read.
#[test]
fn times_before_1970_are_refused_where_they_are_read() {
    let mut doc: Value = serde_json::from_str(&decide_lines()[0]).expect("JSON");
    doc["now"] = serde_json::json!(-1);
    assert!(matches!(decide::decide_one(0, doc.clone()), Err(decide::DecideError::Input { .. })));
    let mut out = Vec::new();
    assert!(!decide::run(doc.to_string().as_bytes(), &mut out).expect("no I/O error"));
    assert!(lossy(&out).contains("time out of range"), "{}", lossy(&out));
    let annotation = r#"{"v":1,"autoscaler":"billing","state":{"last_scale_time":-1}}"#;
    assert!(state::decode_annotation("billing", annotation).is_err());
}

/// Found by `datadog_answers_observe_or_fail`: a Datadog point dated before 1970 (or after 9999)
/// was read as a value, and `watermarkd query` then panicked printing its time.
#[test]
fn datadog_point_times_outside_1970_to_9999_are_no_values() {
    let cx = V1Context {
        queries: 1,
        layout: &[],
        now: Timestamp::from_unix_millis(1_000),
        max_age: None,
        site: "datadoghq.com",
    };
    for time in ["-5000", "2.6e14"] {
        let body = format!(r#"{{"status":"ok","series":[{{"pointlist":[[{time},1.5],[{time},2.5]]}}]}}"#);
        let V1Answer::Answered(observations) = read_v1_answer(200, &RateLimitHeaders::default(), body.as_bytes(), &cx)
        else {
            panic!("{body}: not answered")
        };
        assert!(matches!(observations[0].reading, Reading::Unavailable { .. }), "{body}: {observations:?}");
        assert!(check_observation(&observations[0], true).is_ok(), "{body}: {observations:?}");
    }
}
