//! `[backend.NAME]` tables: the kinds of backend, what each is set up with, what each can do,
//! and how each is read from the rules file.
//!
//! Each kind answers for itself what the rest of the daemon asks of a backend before any client
//! exists: whether its metrics take a reducer, what is wrong with a query that no server of the
//! kind accepts, whether it is paced by a shared request budget, whether a WPA's `metricName`
//! query runs on it. The answers are `match`es over every kind with no `_` arm, so a kind added
//! to [`Backend`] does not compile until it has answered each. Nothing outside this file and
//! `adapters::backend` asks which kind a backend is.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use reqwest::Url;

use super::problem::Sink;
use super::promql;
use super::reader::Table;
use super::{SecretSource, TlsSettings};

/// Where metrics are queried.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    Datadog(DatadogBackend),
    Prometheus(PrometheusBackend),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DatadogBackend {
    /// The Datadog site, e.g. `datadoghq.eu` (default `datadoghq.com`).
    pub site: String,
    /// A full URL that replaces the one derived from `site` (for proxies and tests).
    pub url: Option<String>,
    pub api_key: SecretSource,
    pub app_key: SecretSource,
    /// How far back each query looks (default 300s, as the Cluster Agent).
    pub window: Duration,
    /// Points older than this are stale. `None`: `max(120s, 3 x the series' rollup)`.
    pub max_age: Option<Duration>,
    /// Per request (default 10s).
    pub timeout: Duration,
    /// Requests in flight at once (default 4).
    pub max_in_flight: u32,
    /// How long a query Datadog rejected (HTTP 400) is not asked again (default 10 minutes).
    pub bad_query_retry: Duration,
    /// Lets `url` be plain `http://` to a host other than loopback (default false: the keys
    /// would cross the network unencrypted).
    pub allow_insecure_http: bool,
    /// The largest share of the rate budget, in percent, that the queries of one namespace's
    /// WPAs may use (default 100: no bound).
    pub namespace_budget_percent: u32,
    /// Whether queries that differ only in one or two tag values are asked as one grouped
    /// query (default true; `backend::datadog` folding).
    pub fold_queries: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrometheusBackend {
    /// The server's base URL with any path prefix, e.g. `http://prometheus.monitoring:9090` or
    /// `https://mimir.example/prometheus`; `/api/v1/query` is appended.
    pub url: String,
    /// Per request (default 10s).
    pub timeout: Duration,
    /// Requests in flight at once (default 8).
    pub max_in_flight: u32,
    /// A value whose data is older is stale (no default: not checked). Only a query whose data
    /// time can be asked for has one; others are dated at the evaluation time.
    pub max_age: Option<Duration>,
    /// Sent as `X-Scope-OrgID` (Mimir, Cortex).
    pub tenant: Option<String>,
    /// Extra request headers (not for secrets: use `basic_auth` or `bearer_token_*`).
    pub headers: BTreeMap<String, String>,
    /// Extra query parameters, e.g. `dedup = "true"` for Thanos.
    pub params: BTreeMap<String, String>,
    pub basic_auth: Option<BasicAuth>,
    /// `Authorization: Bearer`; a file is re-read when it changes (rotated service-account tokens).
    pub bearer_token: Option<SecretSource>,
    pub tls: TlsSettings,
    /// Whether queries of one shape are folded into grouped ones (default true).
    pub fold_queries: bool,
    /// The longest regex of a folded query's matcher, in bytes (default 4,096, where Mimir's
    /// query-frontend stops sharding a query).
    pub fold_max_regex_bytes: u32,
    /// The most members one folded query stands for (`None`: only the regex bounds them).
    pub fold_max_members: Option<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BasicAuth {
    pub username: String,
    pub password: SecretSource,
}

impl Backend {
    /// How old a value may be before it is stale, when the backend says (a metric's own
    /// `max_age` comes first).
    pub fn max_age(&self) -> Option<Duration> {
        match self {
            Backend::Datadog(backend) => backend.max_age,
            Backend::Prometheus(backend) => backend.max_age,
        }
    }

    /// Whether its requests are paced by a request budget shared by everyone who queries it
    /// (Datadog's rate limit for the organisation). The autoscalers that query such a backend
    /// fall due together, so that their queries share requests (`runtime::schedule`); the others
    /// are spread over their interval.
    pub fn paced_by_request_budget(&self) -> bool {
        match self {
            Backend::Datadog(_) => true,
            Backend::Prometheus(_) => false,
        }
    }

    /// Why a metric read from this backend, named `name` in the rules, cannot have a
    /// `reducer`, if it cannot: its queries reduce their series themselves.
    pub fn reducer_problem(&self, name: &str) -> Option<String> {
        match self {
            Backend::Datadog(_) => Some(format!(
                "only applies to prometheus backends; {name:?} is a datadog backend, whose queries aggregate series \
                 themselves (e.g. \"max:metric{{...}}\")"
            )),
            Backend::Prometheus(_) => None,
        }
    }

    /// What is wrong with `query` that no server of this kind accepts, as a sentence that
    /// follows the field's name; found without asking one, by `check` and at every load and
    /// reload, so that such a query is refused rather than read as "no data".
    pub fn query_problem(&self, query: &str) -> Option<String> {
        match self {
            // Datadog's query language is checked by Datadog alone.
            Backend::Datadog(_) => None,
            Backend::Prometheus(_) => {
                promql::syntax_problem(query).map(|problem| format!("is not valid PromQL: {problem}"))
            }
        }
    }

    /// Whether it answers the query the Cluster Agent builds from a WPA's External metric
    /// (`avg:NAME{TAGS}.rollup(...)`, Datadog's query language), so that a WPA metric without a
    /// query of its own may be read from it.
    pub fn answers_metric_name_queries(&self) -> bool {
        match self {
            Backend::Datadog(_) => true,
            Backend::Prometheus(_) => false,
        }
    }
}

const DEFAULT_DATADOG_SITE: &str = "datadoghq.com";
/// Datadog's sites; the API host is `api.<site>`. Anything else (a proxy) goes in `url`.
const DATADOG_SITES: &[&str] = &[
    "datadoghq.com",
    "us3.datadoghq.com",
    "us5.datadoghq.com",
    "ap1.datadoghq.com",
    "ap2.datadoghq.com",
    "datadoghq.eu",
    "ddog-gov.com",
];
const DATADOG_KEYS: &[&str] = &[
    "type",
    "site",
    "url",
    "api_key_env",
    "api_key_file",
    "app_key_env",
    "app_key_file",
    "window",
    "max_age",
    "timeout",
    "max_in_flight",
    "bad_query_retry",
    "allow_insecure_http",
    "namespace_budget_percent",
    "fold_queries",
];
const PROMETHEUS_KEYS: &[&str] = &[
    "type",
    "url",
    "timeout",
    "max_in_flight",
    "max_age",
    "tenant",
    "headers",
    "params",
    "basic_auth",
    "bearer_token_env",
    "bearer_token_file",
    "ca_file",
    "client_cert_file",
    "client_key_file",
    "insecure_skip_verify",
    "fold_queries",
    "fold_max_regex_bytes",
    "fold_max_members",
];
const BASIC_AUTH_KEYS: &[&str] = &["username", "password_env", "password_file"];
const DEFAULT_DATADOG_WINDOW: Duration = Duration::from_secs(300);
pub(super) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// A request that has not answered in five minutes will not: longer would only hold a cycle.
pub(super) const MAX_TIMEOUT: Duration = Duration::from_secs(300);
/// A query's text only changes with the rules file; ten minutes keeps a rejected one from
/// costing a request (or a split batch) every cycle, and a fix on Datadog's side (a metric
/// that starts to exist, a tag that appears) is still picked up soon.
pub const DEFAULT_BAD_QUERY_RETRY: Duration = Duration::from_secs(600);
const DEFAULT_DATADOG_IN_FLIGHT: u32 = 4;
const DEFAULT_PROMETHEUS_IN_FLIGHT: u32 = 8;
/// Mimir's query-frontend does not shard a query whose regex matcher is longer than this
/// (`-query-frontend.query-sharding-max-regexp-size-bytes`, 4,096 since Mimir 2.9), so a longer
/// folded query runs on one querier, slower than its members would alone. The bound applies to
/// every Prometheus backend: nothing in an answer says which store is behind a URL, a fold of
/// 4 KiB still stands for a hundred or more members, and a smaller query also stays under a
/// store's per-query series and sample limits more often.
pub const DEFAULT_FOLD_MAX_REGEX_BYTES: u32 = 4_096;
/// A folded query is at most 16 KiB as sent (VictoriaMetrics' default bound on a query's
/// length), so a longer regex could never be used.
const MAX_FOLD_REGEX_BYTES: u32 = 16_384;

/// Reads every backend under `[backend]`. Backends with a problem are reported and map to `None`,
/// so that metrics naming them are not also told that the backend does not exist.
pub(crate) fn read_backends(root: &mut Table<'_>, sink: &mut Sink) -> BTreeMap<String, Option<Backend>> {
    let mut backends = BTreeMap::new();
    let Some(mut table) = root.table(sink, "backend") else { return backends };
    for entry in table.drain() {
        let scope = table.scope.child(&entry.key);
        let parsed = Table::new(&entry.value, scope, sink).and_then(|mut backend| read_backend(&mut backend, sink));
        backends.insert(entry.key.clone(), parsed);
    }
    backends
}

fn read_backend(table: &mut Table<'_>, sink: &mut Sink) -> Option<Backend> {
    let kind = table.string(sink, "type");
    match table.require(sink, "type", kind)?.as_str() {
        "datadog" => {
            let backend = read_datadog(table, sink);
            table.finish(sink, DATADOG_KEYS);
            Some(Backend::Datadog(backend?))
        }
        "prometheus" => {
            let backend = read_prometheus(table, sink);
            table.finish(sink, PROMETHEUS_KEYS);
            Some(Backend::Prometheus(backend?))
        }
        other => {
            table.report(sink, "type", format!("({other:?}) must be \"datadog\" or \"prometheus\""));
            // Which keys are allowed depends on the type, so there is nothing more to check.
            None
        }
    }
}

fn read_datadog(table: &mut Table<'_>, sink: &mut Sink) -> Option<DatadogBackend> {
    let site = table.text(sink, "site").unwrap_or_else(|| DEFAULT_DATADOG_SITE.to_string());
    let site_ok = DATADOG_SITES.contains(&site.as_str());
    if !site_ok {
        table.report(
            sink,
            "site",
            format!("({site:?}) is not a Datadog site: use one of {} (or `url` for a proxy)", DATADOG_SITES.join(", ")),
        );
    }
    let allow_insecure_http = table.flag(sink, "allow_insecure_http").unwrap_or(false);
    let url = table.text(sink, "url").and_then(|url| checked_url(table, sink, url));
    let url = url.filter(|url| allow_insecure_http || secure_enough(table, sink, url));
    let url_ok = !table.has("url") || url.is_some();
    let api_key = read_secret(table, sink, "api_key");
    let app_key = read_secret(table, sink, "app_key");
    let window = positive_duration(table, sink, "window").unwrap_or(DEFAULT_DATADOG_WINDOW);
    let max_age = positive_duration(table, sink, "max_age");
    let timeout = positive_duration_at_most(table, sink, "timeout", MAX_TIMEOUT).unwrap_or(DEFAULT_TIMEOUT);
    let max_in_flight = in_flight(table, sink).unwrap_or(DEFAULT_DATADOG_IN_FLIGHT);
    let bad_query_retry = positive_duration(table, sink, "bad_query_retry").unwrap_or(DEFAULT_BAD_QUERY_RETRY);
    let namespace_budget_percent = namespace_budget_percent(table, sink);
    let fold_queries = table.flag(sink, "fold_queries").unwrap_or(true);
    if !url_ok || !site_ok {
        return None;
    }
    Some(DatadogBackend {
        site,
        url,
        api_key: api_key?,
        app_key: app_key?,
        window,
        max_age,
        timeout,
        max_in_flight,
        bad_query_retry,
        allow_insecure_http,
        namespace_budget_percent: namespace_budget_percent?,
        fold_queries,
    })
}

/// A Datadog `url` in plain http to another machine is refused unless allowed (see
/// `backend::trust`).
fn secure_enough(table: &Table<'_>, sink: &mut Sink, url: &str) -> bool {
    let Some(host) = plain_http_host(url) else { return true };
    table.report(
        sink,
        "url",
        format!(
            "({url:?}) is plain http to {host}: the API and application keys would cross the network unencrypted; \
             use https://, or set allow_insecure_http = true if that network is trusted"
        ),
    );
    false
}

/// The host of `url` when it is plain `http://` to somewhere other than loopback: where
/// credentials would cross a network unencrypted. `None` for https, loopback and what does not
/// parse (refused elsewhere).
pub(crate) fn plain_http_host(url: &str) -> Option<String> {
    let parsed = Url::parse(url.trim()).ok()?;
    if parsed.scheme() != "http" {
        return None;
    }
    let host = parsed.host_str()?;
    // An IPv6 host comes bracketed: `[::1]`.
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let loopback =
        bare.eq_ignore_ascii_case("localhost") || bare.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    (!loopback).then(|| host.to_string())
}

/// `namespace_budget_percent`: 1 to 100 (the default, no bound).
fn namespace_budget_percent(table: &mut Table<'_>, sink: &mut Sink) -> Option<u32> {
    let key = "namespace_budget_percent";
    match table.count(sink, key) {
        None if table.has(key) => None,
        None => Some(100),
        Some(percent @ 1..=100) => Some(percent),
        Some(other) => {
            table.report(sink, key, format!("({other}) must be a percentage from 1 to 100"));
            None
        }
    }
}

fn read_prometheus(table: &mut Table<'_>, sink: &mut Sink) -> Option<PrometheusBackend> {
    let url = table.text(sink, "url");
    let url = table.require(sink, "url", url).and_then(|url| checked_url(table, sink, url));
    let timeout = positive_duration_at_most(table, sink, "timeout", MAX_TIMEOUT).unwrap_or(DEFAULT_TIMEOUT);
    let max_in_flight = in_flight(table, sink).unwrap_or(DEFAULT_PROMETHEUS_IN_FLIGHT);
    let max_age = positive_duration(table, sink, "max_age");
    let tenant = table.text(sink, "tenant");
    let headers = string_map(table, sink, "headers");
    let params = string_map(table, sink, "params");
    for reserved in ["query", "time"] {
        if params.as_ref().is_some_and(|p| p.contains_key(reserved)) {
            table.report(sink, "params", format!("cannot set {reserved:?}: watermarkd sends it with every query"));
        }
    }
    let basic_auth = table.table(sink, "basic_auth").map(|mut auth| {
        let username = auth.text(sink, "username");
        let username = auth.require(sink, "username", username);
        let password = read_secret(&mut auth, sink, "password");
        auth.finish(sink, BASIC_AUTH_KEYS);
        username.zip(password).map(|(username, password)| BasicAuth { username, password })
    });
    let bearer_env = table.text(sink, "bearer_token_env");
    let bearer_file = table.text(sink, "bearer_token_file");
    let bearer_token = match (bearer_env, bearer_file) {
        (Some(_), Some(_)) => {
            table.report(sink, "bearer_token_file", "cannot be set together with bearer_token_env: choose one");
            None
        }
        (Some(env), None) => Some(SecretSource::Env(env)),
        (None, Some(file)) => Some(SecretSource::File(PathBuf::from(file))),
        (None, None) => None,
    };
    if basic_auth.is_some() && bearer_token.is_some() {
        table.report(sink, "basic_auth", "cannot be combined with a bearer token: choose one way to authenticate");
    }
    let tls = read_tls(table, sink);
    let fold_queries = table.flag(sink, "fold_queries").unwrap_or(true);
    let fold_max_regex_bytes = fold_max_regex_bytes(table, sink);
    let fold_max_members = fold_max_members(table, sink);
    Some(PrometheusBackend {
        url: url?,
        timeout,
        max_in_flight,
        max_age,
        tenant,
        headers: headers?,
        params: params?,
        basic_auth: match basic_auth {
            Some(parsed) => Some(parsed?),
            None => None,
        },
        bearer_token,
        tls,
        fold_queries,
        fold_max_regex_bytes: fold_max_regex_bytes?,
        fold_max_members: fold_max_members?,
    })
}

/// `fold_max_regex_bytes`: 1 to 16,384, [`DEFAULT_FOLD_MAX_REGEX_BYTES`] when not set.
fn fold_max_regex_bytes(table: &mut Table<'_>, sink: &mut Sink) -> Option<u32> {
    let key = "fold_max_regex_bytes";
    match table.count(sink, key) {
        None if table.has(key) => None,
        None => Some(DEFAULT_FOLD_MAX_REGEX_BYTES),
        Some(bytes @ 1..=MAX_FOLD_REGEX_BYTES) => Some(bytes),
        Some(other) => {
            table.report(
                sink,
                key,
                format!("({other}) must be from 1 to {MAX_FOLD_REGEX_BYTES}: a folded query is sent under 16 KiB"),
            );
            None
        }
    }
}

/// `fold_max_members`: at least 2 when set (one member is no fold: `fold_queries = false` turns
/// folding off); `Some(None)` when not set.
fn fold_max_members(table: &mut Table<'_>, sink: &mut Sink) -> Option<Option<u32>> {
    let key = "fold_max_members";
    match table.count(sink, key) {
        None if table.has(key) => None,
        None => Some(None),
        Some(members @ 2..) => Some(Some(members)),
        Some(other) => {
            table.report(
                sink,
                key,
                format!("({other}) must be at least 2; set fold_queries = false to send every query alone"),
            );
            None
        }
    }
}

/// `ca_file`, `client_cert_file`, `client_key_file`, `insecure_skip_verify`.
pub(super) fn read_tls(table: &mut Table<'_>, sink: &mut Sink) -> TlsSettings {
    let tls = TlsSettings {
        ca_file: table.text(sink, "ca_file").map(PathBuf::from),
        client_cert_file: table.text(sink, "client_cert_file").map(PathBuf::from),
        client_key_file: table.text(sink, "client_key_file").map(PathBuf::from),
        insecure_skip_verify: table.flag(sink, "insecure_skip_verify").unwrap_or(false),
    };
    if tls.client_cert_file.is_some() != tls.client_key_file.is_some() {
        let missing = if tls.client_cert_file.is_some() { "client_key_file" } else { "client_cert_file" };
        table.report(sink, missing, HALF_MISSING);
    }
    tls
}

/// What is said of the missing half of a client certificate.
pub(super) const HALF_MISSING: &str = "is required when the other half of the client certificate is set";

/// A duration longer than zero and at most a day ([`super::reader::MAX_DURATION`]).
pub(super) fn positive_duration(table: &mut Table<'_>, sink: &mut Sink, key: &str) -> Option<Duration> {
    positive_duration_at_most(table, sink, key, super::reader::MAX_DURATION)
}

pub(super) fn positive_duration_at_most(
    table: &mut Table<'_>,
    sink: &mut Sink,
    key: &str,
    max: Duration,
) -> Option<Duration> {
    let value = table.duration_at_most(sink, key, max)?;
    if value.is_zero() {
        table.report(sink, key, "must be longer than 0s");
        return None;
    }
    Some(value)
}

fn in_flight(table: &mut Table<'_>, sink: &mut Sink) -> Option<u32> {
    let value = table.count(sink, "max_in_flight")?;
    if value == 0 {
        table.report(sink, "max_in_flight", "must be at least 1");
        return None;
    }
    Some(value)
}

/// A table of strings (`headers`, `params`). `None` when any entry is not a string.
pub(super) fn string_map(table: &mut Table<'_>, sink: &mut Sink, key: &str) -> Option<BTreeMap<String, String>> {
    let Some(mut map) = table.table(sink, key) else {
        return if table.has(key) { None } else { Some(BTreeMap::new()) };
    };
    let mut out = BTreeMap::new();
    let mut ok = true;
    let keys: Vec<String> = map.drain().iter().map(|e| e.key.clone()).collect();
    for name in keys {
        match map.string(sink, &name) {
            Some(value) => {
                out.insert(name, value);
            }
            None => ok = false,
        }
    }
    ok.then_some(out)
}

pub(super) fn checked_url(table: &Table<'_>, sink: &mut Sink, url: String) -> Option<String> {
    match url_scheme_problem(&url) {
        None => Some(url),
        Some(problem) => {
            table.report(sink, "url", problem);
            None
        }
    }
}

/// Why `url` is no URL watermarkd can send a request to, if it is not.
pub(super) fn url_scheme_problem(url: &str) -> Option<String> {
    let web = url.starts_with("http://") || url.starts_with("https://");
    (!web).then(|| format!("({url:?}) must start with http:// or https://"))
}

/// `NAME_env` or `NAME_file`, exactly one. A secret written inline is refused: rules files end up
/// in Git and ConfigMaps, where a key must never be.
fn read_secret(table: &mut Table<'_>, sink: &mut Sink, name: &str) -> Option<SecretSource> {
    let env_key = format!("{name}_env");
    let file_key = format!("{name}_file");
    if table.take(name).is_some() {
        // The value is not echoed: it is a secret.
        table.report(
            sink,
            name,
            format!("cannot be written in the rules file: secrets never go inline; set {env_key} (an environment variable) or {file_key} (a file holding the key)"),
        );
        // Still read the others, for their own problems.
        table.text(sink, &env_key);
        table.text(sink, &file_key);
        return None;
    }
    let env = table.text(sink, &env_key);
    let file = table.text(sink, &file_key);
    match (env, file) {
        (Some(_), Some(_)) => {
            table.report(sink, &file_key, format!("cannot be set together with {env_key}: choose one"));
            None
        }
        (Some(env), None) => Some(SecretSource::Env(env)),
        (None, Some(file)) => Some(SecretSource::File(PathBuf::from(file))),
        (None, None) => {
            if !table.has(&env_key) && !table.has(&file_key) {
                table.report(sink, name, format!("is required: set {env_key} or {file_key}"));
            }
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::rules::{parse_rules, Backend};

    fn prometheus(extra: &str) -> Result<PrometheusBackend, Vec<String>> {
        let text = format!("[backend.prom]\ntype = \"prometheus\"\nurl = \"http://prom:9090\"\n{extra}");
        match parse_rules(&text, "rules.toml") {
            Ok(rules) => match rules.backends.get("prom") {
                Some(Backend::Prometheus(backend)) => Ok(backend.clone()),
                other => panic!("{other:?}"),
            },
            Err(err) => Err(err.problems.iter().map(|p| p.in_file("rules.toml").to_string()).collect()),
        }
    }

    #[test]
    fn a_prometheus_backend_takes_its_folding_settings() {
        let default = prometheus("").unwrap();
        assert!(default.fold_queries);
        assert_eq!((default.fold_max_regex_bytes, default.fold_max_members), (4_096, None));
        let set = prometheus("fold_queries = false\nfold_max_regex_bytes = 16384\nfold_max_members = 2\n").unwrap();
        assert!(!set.fold_queries);
        assert_eq!((set.fold_max_regex_bytes, set.fold_max_members), (16_384, Some(2)));

        for (extra, expected) in [
            ("fold_queries = \"no\"", "rules.toml:4: backend.prom.fold_queries"),
            (
                "fold_max_regex_bytes = 0",
                "rules.toml:4: backend.prom.fold_max_regex_bytes (0) must be from 1 to 16384: a folded query is sent \
                 under 16 KiB",
            ),
            ("fold_max_regex_bytes = 16385", "rules.toml:4: backend.prom.fold_max_regex_bytes (16385) must be from 1"),
            (
                "fold_max_members = 1",
                "rules.toml:4: backend.prom.fold_max_members (1) must be at least 2; set fold_queries = false to send \
                 every query alone",
            ),
            ("fold_max_members = -3", "rules.toml:4: backend.prom.fold_max_members"),
        ] {
            let problems = prometheus(extra).unwrap_err();
            assert!(problems.iter().any(|p| p.starts_with(expected)), "{extra}: {problems:?}");
        }
    }

    #[test]
    fn plain_http_is_named_unless_it_stays_on_the_machine() {
        assert_eq!(plain_http_host("http://dd-proxy.internal:8080/dd"), Some("dd-proxy.internal".into()));
        assert_eq!(plain_http_host("http://10.0.0.7"), Some("10.0.0.7".into()));
        for url in [
            "https://api.datadoghq.com",
            "http://127.0.0.1:9",
            "http://127.1.2.3/",
            "http://[::1]:80",
            "http://LOCALHOST:8126",
        ] {
            assert_eq!(plain_http_host(url), None, "{url}");
        }
    }
}
