//! A fake Datadog metrics API on 127.0.0.1, close enough to the real one to test a client
//! against: it checks both auth headers (403 with the recorded body otherwise; the keys it
//! accepts can be rotated), answers
//! `GET /api/v1/query` with comma-joined sub-queries (split at top-level commas only), produces
//! dense buckets aligned to each series' interval with null gaps, tags series with `query_index`,
//! and enforces a calendar-aligned rate budget on tokio time (so paused-clock tests work), with
//! the `X-RateLimit-*` headers on every authenticated answer and an HTML 429 when exhausted.
//! It records every request (URL length, sub-queries, `from`/`to`, status) for the tests to
//! inspect.
//!
//! Grouped queries, as the real API answers them: `{a:b AND k IN (x, y)} by {k}` (functional
//! syntax, `AND` and `IN`) returns one series per group, tagged `k:x` in `tag_set` and `scope`.
//! Each group is answered as the plain query of that group would be (`set` with the plain
//! text, `key:value` conjuncts in any order, gives a group its behaviour); a group whose plain
//! query is set to `NoData` has no series. A scope mixing `,` with `AND`/`OR`/`IN` is a 400, as
//! on the real API, and a URL of more than 7,600 characters is a 414.
//!
//! Faults for the daemon's fault matrix (tests/faults.rs), switchable while it runs: a
//! request-level `Fault` answering every query request (a 5xx, a 429 with any headers, a 403, a
//! slow, HTML, truncated, empty or `status: error` 200), per-query `Behavior`s (no data, all-null,
//! non-finite tokens, several series, stale points, a 400, a timeline in absolute time for
//! histories read window by window), and refusing connections
//! (`refuse_connections`: nothing listens on the port until `accept_connections`).
//!
//! Include it with `#[path = "support/fake_datadog.rs"] mod fake_datadog;`.

#![allow(dead_code, reason = "every test binary that includes this file uses only part of it")]

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpSocket};
use tokio::task::{AbortHandle, JoinHandle};
use tokio::time::Instant;

pub const API_KEY: &str = "fake-api-key-5f1e2d3c4b5a69788796a5b4";
pub const APP_KEY: &str = "fake-app-key-0a1b2c3d4e5f60718293a4b5c6d7e8f9";

/// The recorded 403 answer (`v1_query_403.json`), body byte for byte.
const FORBIDDEN_FIXTURE: &str =
    include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/datadog/v1_query_403.json"));

/// Starts a raw point token in the JSON built for `Behavior::RawPoints`, before it is written
/// out raw; a NUL-led string never occurs in a real answer.
const RAW_MARK: &str = "\u{0}raw:";
/// `RAW_MARK` as serde_json writes it.
const RAW_MARK_JSON: &str = "\\u0000raw:";

const RATE_LIMITED_HTML: &str = "<html><head><title>429 Too Many Requests</title></head>\
<body><h1>429 Too Many Requests</h1>You have sent too many requests in a given amount of time.</body></html>";

/// How the fake answers one sub-query. Request-level behaviours (a 400, a 5xx, a garbage body,
/// `status: error`, a 422, a delay) apply to the whole request carrying the sub-query, as on the
/// real API.
#[derive(Clone, Debug)]
pub enum Behavior {
    /// One series of dense buckets (see `SeriesSpec`).
    Series(SeriesSpec),
    /// One series with explicit points: (seconds before `to`, aligned down to `interval`; value).
    Points { interval: u64, points: Vec<(i64, Option<f64>)> },
    /// No series for this query index (no data in the window).
    NoData,
    /// This many series for the one query index (a `by {tag}` query).
    Several(usize),
    /// 400 for the whole request, with a JSON `errors` body.
    BadQuery,
    /// `status` (with an HTML body) for the first `times` requests carrying the query, then the
    /// default series.
    ServerError { status: u16, times: usize },
    /// 200 with an HTML body.
    Garbage,
    /// 200 with `{"status":"error","error":...}`.
    StatusError(String),
    /// 422, as Datadog answers in practice for "no data points".
    Unprocessable,
    /// Waits this long (tokio time), then answers the default series.
    Delay(Duration),
    /// 400 whose body quotes the keys it received: a client must never pass them on.
    EchoKeys,
    /// The default series, in an answer padded with this many bytes (as a grouped query over
    /// a whole fleet would make it): a client must not hold an answer of any size.
    Padded(usize),
    /// One series whose points are written as these raw JSON tokens (`"12.5"`, `"null"`, and
    /// what JSON cannot hold: `"NaN"`, `"Infinity"`, `"1e999"`): (seconds before `to`, aligned
    /// down to `interval`; token).
    RawPoints { interval: u64, points: Vec<(i64, String)> },
    /// One series whose values belong to absolute time, not to the request's window, so that
    /// a history read window by window sees one timeline: buckets aligned to `interval`, each
    /// taking the value of the last segment (unix seconds it starts at, value) begun by then;
    /// `None` is a null bucket. No buckets before the first segment, and none of them is
    /// left empty as still filling: the timeline is the past.
    Timeline { interval: u64, segments: Vec<(i64, Option<f64>)> },
}

/// What every request to `/api/v1/query` gets while it is set (`FakeDatadog::set_fault`),
/// whatever its sub-queries: the faults of a server, an edge or a proxy rather than of a query.
#[derive(Clone, Debug)]
pub enum Fault {
    /// This status with an HTML body (a 5xx from Datadog's edge or a proxy).
    Status(u16),
    /// 429 with exactly these headers (none of the budget's own) and an HTML or a JSON body.
    /// Not counted against the budget.
    RateLimited { headers: Vec<(String, String)>, html: bool },
    /// The recorded 403 answer, as after the keys were revoked.
    Forbidden,
    /// Waits this long (tokio time), then answers normally.
    Delay(Duration),
    /// 200 with an HTML page.
    Html,
    /// 200 with the normal JSON answer cut in the middle.
    Truncated,
    /// 200 with an empty body.
    EmptyBody,
    /// 200 with `{"status":"error","error":...}`.
    StatusError(String),
}

/// Dense buckets over `[from, to]` aligned to `interval`; bucket `k` (oldest first) has value
/// `base + step * k`; the last `trailing_nulls` buckets are null (the newest one is usually
/// still empty on the real API), and so is every bucket whose `k % gap_every == gap_every - 1`.
#[derive(Clone, Copy, Debug)]
pub struct SeriesSpec {
    pub interval: u64,
    pub base: f64,
    pub step: f64,
    pub trailing_nulls: usize,
    pub gap_every: Option<usize>,
}

impl Default for SeriesSpec {
    fn default() -> Self {
        SeriesSpec { interval: 30, base: 100.0, step: 1.0, trailing_nulls: 1, gap_every: None }
    }
}

impl SeriesSpec {
    pub fn constant(value: f64) -> Self {
        SeriesSpec { base: value, step: 0.0, ..SeriesSpec::default() }
    }

    /// A series whose every bucket is null.
    pub fn all_null() -> Self {
        SeriesSpec { trailing_nulls: 1_000_000, ..SeriesSpec::default() }
    }
}

/// The budget: `limit` requests per `period`, windows aligned to multiples of the period on a
/// virtual calendar that starts `offset` into a window when the server starts.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    pub limit: u64,
    pub period: Duration,
    pub offset: Duration,
}

impl Default for Budget {
    fn default() -> Self {
        Budget { limit: 1_600, period: Duration::from_secs(3_600), offset: Duration::ZERO }
    }
}

/// One request as the fake saw it.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// Since the server started (tokio time).
    pub at: Duration,
    pub path: String,
    /// Length of the full URL the client built (scheme, host, path and query).
    pub url_len: usize,
    /// Length of the encoded query string (after `?`).
    pub query_string_len: usize,
    pub sub_queries: Vec<String>,
    /// The `from` and `to` parameters (unix seconds), when they were numbers.
    pub from: Option<i64>,
    pub to: Option<i64>,
    pub status: u16,
    /// The calendar window it fell in.
    pub window: u64,
    pub body: String,
}

struct State {
    started: Instant,
    budget: Budget,
    default: Behavior,
    table: HashMap<String, Behavior>,
    /// The table by `canonical` form, for the groups of grouped queries.
    by_canonical: HashMap<String, Behavior>,
    /// Failures still to give, per query (`ServerError`).
    failures_left: HashMap<String, usize>,
    /// Requests counted in each window (ours and `consume`d ones).
    used: HashMap<u64, u64>,
    log: Vec<Recorded>,
    /// Requests received, answered or not (a client may give up on a slow one).
    arrivals: usize,
    in_flight: usize,
    max_in_flight: usize,
    fault: Option<Fault>,
    /// The (API, application) keys accepted: `API_KEY` and `APP_KEY` until `rotate_keys`.
    keys: (String, String),
}

impl State {
    fn calendar(&self) -> (u64, Duration) {
        let period = self.budget.period.as_nanos().max(1);
        let virtual_now = (self.budget.offset + self.started.elapsed()).as_nanos();
        let window = u64::try_from(virtual_now / period).unwrap();
        let into = virtual_now % period;
        (window, Duration::from_nanos(u64::try_from(period - into).unwrap()))
    }
}

pub struct FakeDatadog {
    /// Base URL, e.g. `http://127.0.0.1:41234`.
    pub url: String,
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    /// The accept loop, while connections are accepted.
    server: Mutex<Option<JoinHandle<()>>>,
    /// Every connection's task, so that refusing connections also closes the open ones.
    connections: Arc<Mutex<Vec<AbortHandle>>>,
    /// While connections are refused: the port, bound but not listening.
    held: Mutex<Option<TcpSocket>>,
}

/// Binds `addr` without listening: a connection attempt is refused, and the port stays ours.
fn hold_port(addr: SocketAddr) -> TcpSocket {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_reuseaddr(true).unwrap();
    socket.bind(addr).unwrap_or_else(|e| panic!("hold {addr}: {e}"));
    socket
}

/// Listens on `addr` again (after `hold_port`).
fn listen_on(addr: SocketAddr) -> TcpListener {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_reuseaddr(true).unwrap();
    socket.bind(addr).unwrap_or_else(|e| panic!("bind {addr} again: {e}"));
    socket.listen(1024).unwrap()
}

impl Drop for FakeDatadog {
    fn drop(&mut self) {
        self.close();
    }
}

/// Accepts connections on `listener` and serves each in a task recorded in `connections`.
fn spawn_server(
    listener: TcpListener,
    state: Arc<Mutex<State>>,
    base: String,
    connections: Arc<Mutex<Vec<AbortHandle>>>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let state = state.clone();
            let base = base.clone();
            let task = tokio::spawn(async move {
                let service = service_fn(move |req| {
                    let state = state.clone();
                    let base = base.clone();
                    async move { Ok::<_, Infallible>(handle(state, &base, req).await) }
                });
                let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
            let mut open = connections.lock().unwrap();
            open.retain(|t| !t.is_finished());
            open.push(task.abort_handle());
        }
    })
}

impl FakeDatadog {
    pub async fn start() -> Self {
        Self::with_budget(Budget::default()).await
    }

    pub async fn with_budget(budget: Budget) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let url = format!("http://{addr}");
        let state = Arc::new(Mutex::new(State {
            started: Instant::now(),
            budget,
            default: Behavior::Series(SeriesSpec::default()),
            table: HashMap::new(),
            by_canonical: HashMap::new(),
            failures_left: HashMap::new(),
            used: HashMap::new(),
            log: Vec::new(),
            arrivals: 0,
            in_flight: 0,
            max_in_flight: 0,
            fault: None,
            keys: (API_KEY.to_string(), APP_KEY.to_string()),
        }));
        let connections = Arc::new(Mutex::new(Vec::new()));
        let server = spawn_server(listener, state.clone(), url.clone(), connections.clone());
        FakeDatadog { url, addr, state, server: Mutex::new(Some(server)), connections, held: Mutex::new(None) }
    }

    /// Stops accepting and closes every open connection.
    fn close(&self) {
        if let Some(server) = self.server.lock().unwrap().take() {
            server.abort();
        }
        for connection in self.connections.lock().unwrap().drain(..) {
            connection.abort();
        }
    }

    /// Closes the port: open connections are closed and new ones refused, until
    /// `accept_connections`. The port stays bound (not listening, so a connection attempt is
    /// refused) and no other socket can take it meanwhile.
    pub async fn refuse_connections(&self) {
        let server = self.server.lock().unwrap().take();
        if let Some(server) = server {
            server.abort();
            // Cancelled once dropped, and the listener with it.
            let _ = server.await;
        }
        self.close();
        *self.held.lock().unwrap() = Some(hold_port(self.addr));
    }

    /// Listens again on the same port.
    pub async fn accept_connections(&self) {
        let Some(held) = self.held.lock().unwrap().take() else { return };
        drop(held);
        let listener = listen_on(self.addr);
        let server = spawn_server(listener, self.state.clone(), self.url.clone(), self.connections.clone());
        *self.server.lock().unwrap() = Some(server);
    }

    /// What every query request gets from now on (`None`: the normal answers again).
    /// Accepts these keys from now on, and no longer the previous ones (a key rotated in
    /// Datadog).
    pub fn rotate_keys(&self, api_key: &str, app_key: &str) {
        self.state.lock().unwrap().keys = (api_key.to_string(), app_key.to_string());
    }

    pub fn set_fault(&self, fault: Option<Fault>) {
        self.state.lock().unwrap().fault = fault;
    }

    /// When the server started (`Recorded::at` counts from here).
    pub fn started(&self) -> Instant {
        self.state.lock().unwrap().started
    }

    /// How a sub-query with this exact text is answered.
    pub fn set(&self, query: &str, behavior: Behavior) {
        let mut state = self.state.lock().unwrap();
        if let Behavior::ServerError { times, .. } = behavior {
            state.failures_left.insert(query.to_string(), times);
        }
        if let Some(canonical) = canonical(query) {
            state.by_canonical.insert(canonical, behavior.clone());
        }
        state.table.insert(query.to_string(), behavior);
    }

    /// How sub-queries not in the table are answered (default: `SeriesSpec::default()`).
    pub fn set_default(&self, behavior: Behavior) {
        self.state.lock().unwrap().default = behavior;
    }

    /// Another user of the organisation spends `n` requests of the current window.
    pub fn consume(&self, n: u64) {
        let mut state = self.state.lock().unwrap();
        let (window, _) = state.calendar();
        *state.used.entry(window).or_default() += n;
    }

    /// Another user spends everything left in the current window.
    pub fn exhaust(&self) {
        let mut state = self.state.lock().unwrap();
        let (window, _) = state.calendar();
        let limit = state.budget.limit;
        state.used.insert(window, limit);
    }

    pub fn log(&self) -> Vec<Recorded> {
        self.state.lock().unwrap().log.clone()
    }

    /// Requests received, including those the client gave up on before the answer.
    pub fn arrivals(&self) -> usize {
        self.state.lock().unwrap().arrivals
    }

    /// Requests answered (any status).
    pub fn requests(&self) -> usize {
        self.state.lock().unwrap().log.len()
    }

    pub fn count_status(&self, status: u16) -> usize {
        self.state.lock().unwrap().log.iter().filter(|r| r.status == status).count()
    }

    pub fn max_url_len(&self) -> usize {
        self.state.lock().unwrap().log.iter().map(|r| r.url_len).max().unwrap_or(0)
    }

    /// The most requests that were being answered at the same moment.
    pub fn max_concurrency(&self) -> usize {
        self.state.lock().unwrap().max_in_flight
    }

    /// Requests counted per calendar window (including `consume`d ones), by window number.
    pub fn used_per_window(&self) -> Vec<(u64, u64)> {
        let mut used: Vec<(u64, u64)> = self.state.lock().unwrap().used.iter().map(|(w, n)| (*w, *n)).collect();
        used.sort();
        used
    }
}

fn respond(status: u16, content_type: &str, headers: &[(String, String)], body: String) -> Response<Full<Bytes>> {
    let mut builder =
        Response::builder().status(StatusCode::from_u16(status).unwrap()).header("content-type", content_type);
    for (name, value) in headers {
        builder = builder.header(name.as_str(), value.as_str());
    }
    builder.body(Full::new(Bytes::from(body))).unwrap()
}

fn json_response(status: u16, headers: &[(String, String)], body: Value) -> Response<Full<Bytes>> {
    respond(status, "application/json", headers, body.to_string())
}

/// `application/x-www-form-urlencoded` decoding (`+` is a space).
fn form_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap();
                out.push(u8::from_str_radix(hex, 16).unwrap());
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).unwrap()
}

/// Splits Datadog's comma-joined query list at commas outside `{}`, `()`, `[]` and quotes.
/// (Written independently of the client's splitter, so one does not prove the other.)
fn split_queries(joined: &str) -> Vec<String> {
    let mut parts = vec![String::new()];
    let mut nesting: Vec<char> = Vec::new();
    let mut in_quote: Option<char> = None;
    for c in joined.chars() {
        match (in_quote, c) {
            (Some(q), c) if c == q => in_quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => in_quote = Some(c),
            (None, '{' | '(' | '[') => nesting.push(c),
            (None, '}' | ')' | ']') => {
                nesting.pop();
            }
            (None, ',') if nesting.is_empty() => {
                parts.push(String::new());
                continue;
            }
            _ => {}
        }
        parts.last_mut().unwrap().push(c);
    }
    parts
}

/// A group of a grouped query as answered: its tags and its behaviour.
type AnsweredGroup = (Vec<String>, Behavior);

/// The longest URL the fake serves; longer is a 414, as the real API answers somewhere past
/// 7,600 characters.
pub const MAX_URL_LEN: usize = 7_600;

/// `head{a:b,c:d}tail` (or `a:b AND c:d`) with its conjuncts sorted: the same text for the same
/// question, however its scope is written. `None` for a query without one plain scope.
pub fn canonical(query: &str) -> Option<String> {
    let open = query.find('{')?;
    let close = open + query[open..].find('}')?;
    if query[close + 1..].contains('{') {
        return None;
    }
    let body = &query[open + 1..close];
    let mut conjuncts: Vec<&str> =
        if body.contains(',') { body.split(',').collect() } else { body.split(" AND ").collect() };
    conjuncts.iter_mut().for_each(|c| *c = c.trim());
    if conjuncts.iter().any(|c| !c.contains(':') || c.contains(' ')) {
        return None;
    }
    conjuncts.sort_unstable();
    Some(format!("{}{{{}}}{}", &query[..open], conjuncts.join(","), &query[close + 1..]))
}

/// The plain queries a sub-query answered, as `canonical` texts: itself, or each group of a
/// grouped query.
pub fn members_answered(sub_query: &str) -> Vec<String> {
    match groups_of(sub_query) {
        Ok(Some(groups)) => groups.into_iter().map(|(_, canonical)| canonical).collect(),
        _ => canonical(sub_query).into_iter().collect(),
    }
}

/// One group of a grouped query: its tags (`key:value`) and the canonical text of its plain
/// query.
type Group = (Vec<String>, String);

/// The groups a grouped query (`head{scope} by {keys}tail`) asks for: each group's tags and the
/// canonical text of its plain query. `Ok(None)` for a query that is not grouped; `Err` with
/// the API's message for a scope it would refuse.
fn groups_of(query: &str) -> Result<Option<Vec<Group>>, String> {
    let Some(by) = query.find("} by {") else { return Ok(None) };
    let open = query[..by].find('{').ok_or("no scope")?;
    let keys_end = by + 6 + query[by + 6..].find('}').ok_or("unclosed by")?;
    let (head, body, keys, tail) =
        (&query[..open], &query[open + 1..by], &query[by + 6..keys_end], &query[keys_end + 1..]);
    let functional = [" AND ", " OR ", " IN ", "NOT "].iter().any(|op| body.contains(op));
    let outside_lists: String = {
        let mut depth = 0;
        body.chars()
            .filter(|c| {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => {}
                }
                depth == 0
            })
            .collect()
    };
    if functional && outside_lists.contains(',') {
        return Err(format!(
            "Error parsing query: \n unable to parse {query}: 'AND' and 'OR' cannot be mixed with ','"
        ));
    }
    let mut fixed: Vec<String> = Vec::new();
    let mut lists: Vec<(String, Vec<String>)> = Vec::new();
    for conjunct in body.split(" AND ") {
        let conjunct = conjunct.trim();
        if let Some((key, list)) = conjunct.split_once(" IN ") {
            let values = list.trim().strip_prefix('(').and_then(|l| l.strip_suffix(')')).ok_or("bad IN list")?;
            lists.push((key.trim().to_string(), values.split(',').map(|v| v.trim().to_string()).collect()));
        } else if conjunct.contains(':') && !conjunct.contains(' ') {
            fixed.push(conjunct.to_string());
        } else if conjunct != "*" {
            return Err(format!("Error parsing query: \n unable to parse {query}: Rule 'scope_expr' didn't match"));
        }
    }
    let keys: Vec<&str> = keys.split(',').map(str::trim).collect();
    // A key without an IN list groups over whatever exists: the fake answers such a query as a
    // plain one, from its own behaviour (`Several` for a `by {host}`).
    if keys.iter().any(|key| !lists.iter().any(|(k, _)| k == key)) {
        return Ok(None);
    }
    // Every combination of the keys' values.
    let mut combos: Vec<Vec<String>> = vec![Vec::new()];
    for key in &keys {
        let values = lists.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone()).ok_or("group key without IN list")?;
        combos = combos
            .into_iter()
            .flat_map(|combo| values.iter().map(move |v| [combo.clone(), vec![format!("{key}:{v}")]].concat()))
            .collect();
    }
    let listed_elsewhere: Vec<String> = lists
        .iter()
        .filter(|(k, _)| !keys.contains(&k.as_str()))
        .map(|(k, v)| format!("{k} IN ({})", v.join(", ")))
        .collect();
    if !listed_elsewhere.is_empty() {
        return Err(format!("an IN list on a key not grouped by: {listed_elsewhere:?}"));
    }
    Ok(Some(
        combos
            .into_iter()
            .map(|tags| {
                let mut all: Vec<String> = fixed.iter().cloned().chain(tags.iter().cloned()).collect();
                all.sort_unstable();
                (tags, format!("{head}{{{}}}{tail}", all.join(",")))
            })
            .collect(),
    ))
}

fn series_json(index: usize, query: &str, scope: &str, interval: u64, points: Vec<(i64, Option<f64>)>) -> Value {
    let pointlist: Vec<Value> = points.iter().map(|(ms, v)| json!([*ms as f64, v])).collect();
    let start = points.first().map(|p| p.0).unwrap_or(0);
    let end = points.last().map(|p| p.0 + interval as i64 * 1000 - 1).unwrap_or(0);
    json!({
        "metric": query.split(['{', '(']).next().unwrap_or(query),
        "display_name": query,
        "expression": query,
        "scope": scope,
        "tag_set": if scope == "*" { vec![] } else { scope.split(',').map(str::to_string).collect::<Vec<_>>() },
        "query_index": index,
        "interval": interval,
        "aggr": "avg",
        "unit": null,
        "attributes": {},
        "length": points.len(),
        "start": start,
        "end": end,
        "pointlist": pointlist,
    })
}

/// The series of one sub-query (or one group of a grouped one, tagged `scope`).
fn series_for(index: usize, q: &str, scope: &str, behavior: &Behavior, from: i64, to: i64) -> Vec<Value> {
    let mut series = Vec::new();
    match behavior {
        Behavior::Points { interval, points } => {
            series.push(series_json(index, q, scope, *interval, explicit(*interval, points, to)))
        }
        Behavior::NoData => {}
        Behavior::Several(n) => {
            for host in 0..*n {
                let points = dense(&SeriesSpec::default(), from, to);
                series.push(series_json(index, q, &format!("host:h{host}"), 30, points));
            }
        }
        Behavior::Series(spec) => series.push(series_json(index, q, scope, spec.interval, dense(spec, from, to))),
        Behavior::Timeline { interval, segments } => {
            let points = timeline(*interval, segments, from, to);
            // Before the timeline begins there is no series at all, as for a metric not yet
            // reported.
            if !points.is_empty() {
                series.push(series_json(index, q, scope, *interval, points));
            }
        }
        Behavior::RawPoints { interval, points } => {
            let step = (*interval).max(1) as i64;
            let mut tokens: Vec<(i64, &String)> =
                points.iter().map(|(ago, token)| ((to - ago).div_euclid(step) * step * 1000, token)).collect();
            tokens.sort_by_key(|p| p.0);
            let mut one = series_json(index, q, scope, *interval, tokens.iter().map(|(ms, _)| (*ms, None)).collect());
            // Each token goes in as a marked string, written out raw below.
            one["pointlist"] =
                tokens.iter().map(|(ms, token)| json!([*ms as f64, format!("{RAW_MARK}{token}")])).collect();
            series.push(one);
        }
        _ => series.push(series_json(index, q, scope, 30, dense(&SeriesSpec::default(), from, to))),
    }
    series
}

/// Bucket times (ms) aligned to `interval` within `[from, to]`, oldest first.
fn buckets(from: i64, to: i64, interval: u64) -> Vec<i64> {
    let step = interval.max(1) as i64;
    let first = (from + step - 1).div_euclid(step) * step;
    (0..).map(|k| first + k * step).take_while(|t| *t <= to).map(|t| t * 1000).collect()
}

fn dense(spec: &SeriesSpec, from: i64, to: i64) -> Vec<(i64, Option<f64>)> {
    let times = buckets(from, to, spec.interval);
    let n = times.len();
    times
        .into_iter()
        .enumerate()
        .map(|(k, t)| {
            let gap = spec.gap_every.is_some_and(|g| g > 0 && k % g == g - 1);
            let value = (k + spec.trailing_nulls < n && !gap).then_some(spec.base + spec.step * k as f64);
            (t, value)
        })
        .collect()
}

fn explicit(interval: u64, points: &[(i64, Option<f64>)], to: i64) -> Vec<(i64, Option<f64>)> {
    let step = interval.max(1) as i64;
    let mut out: Vec<(i64, Option<f64>)> =
        points.iter().map(|(ago, v)| ((to - ago).div_euclid(step) * step * 1000, *v)).collect();
    out.sort_by_key(|p| p.0);
    out
}

/// The buckets of a `Behavior::Timeline` within `[from, to]`.
fn timeline(interval: u64, segments: &[(i64, Option<f64>)], from: i64, to: i64) -> Vec<(i64, Option<f64>)> {
    buckets(from, to, interval)
        .into_iter()
        .filter_map(|ms| {
            let (_, value) = segments.iter().take_while(|(start, _)| *start * 1000 <= ms).last()?;
            Some((ms, *value))
        })
        .collect()
}

async fn handle(state: Arc<Mutex<State>>, base: &str, req: Request<Incoming>) -> Response<Full<Bytes>> {
    {
        let mut s = state.lock().unwrap();
        s.arrivals += 1;
        s.in_flight += 1;
        s.max_in_flight = s.max_in_flight.max(s.in_flight);
    }
    let response = answer(&state, base, req).await;
    state.lock().unwrap().in_flight -= 1;
    response
}

async fn answer(state: &Arc<Mutex<State>>, base: &str, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    let raw_query = req.uri().query().unwrap_or("").to_string();
    let url_len = base.len() + req.uri().path_and_query().map(|pq| pq.as_str().len()).unwrap_or(0);
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let (api_key, app_key) = (header("dd-api-key"), header("dd-application-key"));
    let method = req.method().clone();
    let body = String::from_utf8(req.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    let params: HashMap<String, String> = raw_query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (form_decode(k), form_decode(v))
        })
        .collect();
    let sub_queries = params.get("query").map(|q| split_queries(q)).unwrap_or_default();
    let second = |name: &str| params.get(name).and_then(|v| v.parse::<i64>().ok());
    let (from_param, to_param) = (second("from"), second("to"));

    let record = |status: u16, window: u64| {
        let mut s = state.lock().unwrap();
        let at = Instant::now() - s.started;
        s.log.push(Recorded {
            at,
            path: path.clone(),
            url_len,
            query_string_len: raw_query.len(),
            sub_queries: sub_queries.clone(),
            from: from_param,
            to: to_param,
            status,
            window,
            body: body.clone(),
        });
    };

    // Authentication comes first: an unknown caller has no organisation, hence no budget.
    let keys = state.lock().unwrap().keys.clone();
    if api_key != keys.0 || app_key != keys.1 {
        let window = state.lock().unwrap().calendar().0;
        record(403, window);
        let fixture: Value = serde_json::from_str(FORBIDDEN_FIXTURE).unwrap();
        return json_response(403, &[], fixture["response"]["body"].clone());
    }

    let fault = if path == "/api/v1/query" { state.lock().unwrap().fault.clone() } else { None };
    // Faults answered before the budget counts the request.
    match &fault {
        Some(Fault::Forbidden) => {
            let window = state.lock().unwrap().calendar().0;
            record(403, window);
            let fixture: Value = serde_json::from_str(FORBIDDEN_FIXTURE).unwrap();
            return json_response(403, &[], fixture["response"]["body"].clone());
        }
        Some(Fault::RateLimited { headers, html }) => {
            let window = state.lock().unwrap().calendar().0;
            record(429, window);
            return if *html {
                respond(429, "text/html", headers, RATE_LIMITED_HTML.to_string())
            } else {
                json_response(429, headers, json!({"errors": ["Rate limit of 1600 requests in 3600 seconds reached."]}))
            };
        }
        _ => {}
    }

    if url_len > MAX_URL_LEN {
        let window = state.lock().unwrap().calendar().0;
        record(414, window);
        return respond(414, "text/html", &[], "<html><body><h1>414 Request-URI Too Large</h1></body></html>".into());
    }

    // The budget: calendar-aligned windows, counted per organisation.
    let (window, headers, exhausted) = {
        let mut s = state.lock().unwrap();
        let (window, until_reset) = s.calendar();
        let limit = s.budget.limit;
        let used = s.used.entry(window).or_default();
        let exhausted = *used >= limit;
        if !exhausted {
            *used += 1;
        }
        let remaining = limit - (*used).min(limit);
        let reset = until_reset.as_secs() + u64::from(until_reset.subsec_nanos() > 0);
        let headers = vec![
            ("x-ratelimit-limit".to_string(), limit.to_string()),
            ("x-ratelimit-period".to_string(), s.budget.period.as_secs().to_string()),
            ("x-ratelimit-remaining".to_string(), remaining.to_string()),
            ("x-ratelimit-reset".to_string(), reset.to_string()),
            ("x-ratelimit-name".to_string(), "query".to_string()),
        ];
        (window, headers, exhausted)
    };
    if exhausted {
        record(429, window);
        return respond(429, "text/html", &headers, RATE_LIMITED_HTML.to_string());
    }

    match (method.as_str(), path.as_str()) {
        ("GET", "/api/v1/query") => {}
        _ => {
            record(404, window);
            return json_response(404, &headers, json!({"errors": ["Not found"]}));
        }
    }

    let (Some(from), Some(to), false) = (from_param, to_param, sub_queries.is_empty()) else {
        record(400, window);
        return json_response(
            400,
            &headers,
            json!({"errors": ["The parameters 'from', 'to' and 'query' are required"]}),
        );
    };

    let behaviors: Vec<Behavior> = {
        let s = state.lock().unwrap();
        sub_queries.iter().map(|q| s.table.get(q).cloned().unwrap_or_else(|| s.default.clone())).collect()
    };
    // Per sub-query: its groups (tags, behaviour) when it is grouped.
    let mut grouped: Vec<Option<Vec<AnsweredGroup>>> = Vec::new();
    for q in &sub_queries {
        match groups_of(q) {
            Ok(None) => grouped.push(None),
            Ok(Some(groups)) => {
                let s = state.lock().unwrap();
                grouped.push(Some(
                    groups
                        .into_iter()
                        .map(|(tags, canonical)| {
                            let behavior = s.by_canonical.get(&canonical).cloned().unwrap_or_else(|| s.default.clone());
                            (tags, behavior)
                        })
                        .collect(),
                ));
            }
            Err(message) => {
                record(400, window);
                return json_response(400, &headers, json!({ "errors": [message] }));
            }
        }
    }
    // What decides the request's fate: each plain sub-query's behaviour, each group's.
    let deciding: Vec<(&String, &Behavior)> = sub_queries
        .iter()
        .zip(&behaviors)
        .zip(&grouped)
        .flat_map(|((q, b), g)| match g {
            None => vec![(q, b)],
            Some(groups) => groups.iter().map(|(_, b)| (q, b)).collect(),
        })
        .collect();

    // Request-level behaviours, in sub-query order; a delay (the longest asked for) comes first.
    let delay = behaviors.iter().filter_map(|b| if let Behavior::Delay(d) = b { Some(*d) } else { None }).max();
    let fault_delay = if let Some(Fault::Delay(d)) = &fault { Some(*d) } else { None };
    if let Some(delay) = delay.max(fault_delay) {
        tokio::time::sleep(delay).await;
    }
    let fault_failure = match &fault {
        Some(Fault::Status(status)) => {
            Some((*status, format!("<html><body><h1>{status} Server Error</h1></body></html>"), "text/html"))
        }
        Some(Fault::Html) => Some((200, "<html><body>Maintenance</body></html>".to_string(), "text/html")),
        Some(Fault::StatusError(message)) => {
            Some((200, json!({"status": "error", "error": message}).to_string(), "application/json"))
        }
        _ => None,
    };
    if let Some((status, text, content_type)) = fault_failure {
        record(status, window);
        return respond(status, content_type, &headers, text);
    }
    for (q, behavior) in deciding {
        let failure = match behavior {
            Behavior::BadQuery => Some((
                400,
                json!({"errors": [format!("Error parsing query: \n unable to parse {q}: Rule 'scope_expr' didn't match")]})
                    .to_string(),
                "application/json",
            )),
            Behavior::EchoKeys => Some((
                400,
                json!({"errors": [format!("Error parsing query (keys {api_key} / {app_key})")]}).to_string(),
                "application/json",
            )),
            Behavior::ServerError { status, .. } => {
                let mut s = state.lock().unwrap();
                let left = s.failures_left.entry(q.clone()).or_default();
                if *left > 0 {
                    *left -= 1;
                    Some((*status, format!("<html><body><h1>{status} Server Error</h1></body></html>"), "text/html"))
                } else {
                    None
                }
            }
            Behavior::Garbage => Some((200, "<html><body>Maintenance</body></html>".to_string(), "text/html")),
            Behavior::StatusError(message) => {
                Some((200, json!({"status": "error", "error": message}).to_string(), "application/json"))
            }
            Behavior::Unprocessable => {
                Some((422, json!({"errors": ["No data points found"]}).to_string(), "application/json"))
            }
            _ => None,
        };
        if let Some((status, text, content_type)) = failure {
            record(status, window);
            return respond(status, content_type, &headers, text);
        }
    }

    let mut series = Vec::new();
    for (index, q) in sub_queries.iter().enumerate() {
        let groups = grouped[index].clone().unwrap_or_else(|| vec![(Vec::new(), behaviors[index].clone())]);
        for (tags, behavior) in &groups {
            let scope = if tags.is_empty() { "*".to_string() } else { tags.join(",") };
            series.extend(series_for(index, q, &scope, behavior, from, to));
        }
    }
    let padding: usize = behaviors.iter().map(|b| if let Behavior::Padded(n) = b { *n } else { 0 }).sum();
    let answer = json!({
            "status": "ok",
            "res_type": "time_series",
            "resp_version": 1,
            "query": params.get("query"),
            "from_date": from * 1000,
            "to_date": to * 1000,
            "series": series,
            "message": "x".repeat(padding),
            "group_by": [],
            "values": [],
            "times": [],
    });
    // Raw tokens: `"<mark>NaN"` becomes `NaN`.
    let mut text = answer.to_string();
    while let Some(start) = text.find(&format!("\"{RAW_MARK_JSON}")) {
        let token_start = start + 1 + RAW_MARK_JSON.len();
        let end = token_start + text[token_start..].find('"').unwrap();
        let token = text[token_start..end].to_string();
        text.replace_range(start..=end, &token);
    }
    let text = match fault {
        Some(Fault::Truncated) => {
            let mut cut = text.len() / 2;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text[..cut].to_string()
        }
        Some(Fault::EmptyBody) => String::new(),
        _ => text,
    };
    record(200, window);
    respond(200, "application/json", &headers, text)
}
