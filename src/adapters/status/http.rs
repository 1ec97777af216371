//! The status API and page on the daemon's listener, read-only (the listener answers only GET
//! and HEAD). Routing is a function of the path, the query and the board; only the access
//! check waits on anything.
//!
//! - `GET /api/v1/autoscalers?q=&state=&offset=&limit=`: a page of the table (JSON).
//! - `GET /api/v1/autoscalers/{id}`: one autoscaler in full, its history included.
//! - `GET /api/v1/backends`: each backend's requests by outcome and rate budget.
//! - `GET /` and `/ui`: the table page; `/ui/table`: its rows alone (what the script swaps).
//! - `GET /ui/autoscaler/{id}`: one autoscaler's page; `?fragment=1`: its content alone.
//! - `GET /ui/health`: the daemon's health at the top of each page, alone (what the script swaps).
//! - `GET /ui/app.js`, `/ui/style.css`: the page's only other resources.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use hyper::http::request::Parts;
use hyper::{Response, StatusCode};
use serde::{Deserialize, Serialize};
use watermarkd_engine::Timestamp;

use super::access::{Access, Caller, Refusal};
use super::board::{Board, ListQuery, State};
use super::page::{self, PAGE_ROWS};
use super::worker::StatusWorker;
use crate::adapters::listener::{text, Body, Handler, Paths, Reply, Route, Routes};
use crate::domain::status::backends::{BackendFacts, RateLimitSeen};

/// The most rows one API page gives.
pub const MAX_LIMIT: usize = 1_000;
/// The longest search (`q`), in bytes, and the most words in it: a search costs autoscalers ×
/// words, so both are bounded before any work is done for it.
pub const MAX_SEARCH_BYTES: usize = 200;
pub const MAX_SEARCH_WORDS: usize = 8;

const JS: &str = include_str!("app.js");
const CSS: &str = include_str!("style.css");

/// An answer, before the listener puts it on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
    /// Besides the security headers every answer gets.
    pub headers: Vec<(&'static str, String)>,
}

impl Answer {
    fn new(status: u16, content_type: &'static str, body: impl Into<Vec<u8>>) -> Answer {
        Answer { status, content_type, body: body.into(), headers: Vec::new() }
    }

    fn json(status: u16, value: &impl Serialize) -> Answer {
        match serde_json::to_vec(value) {
            Ok(body) => Answer::new(status, "application/json", body),
            Err(err) => Answer::new(500, "text/plain; charset=utf-8", format!("cannot write the answer: {err}\n")),
        }
    }

    fn html(status: u16, body: String) -> Answer {
        Answer::new(status, "text/html; charset=utf-8", body)
    }

    /// What every status answer carries: nothing of it may be framed, sniffed, cached or
    /// loaded from elsewhere.
    pub fn security_headers() -> [(&'static str, &'static str); 5] {
        [
            (
                "content-security-policy",
                "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; \
                 form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
            ),
            ("x-content-type-options", "nosniff"),
            ("referrer-policy", "no-referrer"),
            ("x-frame-options", "DENY"),
            ("cache-control", "no-store"),
        ]
    }

    /// The answer on the wire, with the security headers.
    fn into_response(self) -> Response<Body> {
        let code = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = text(code, self.body, self.content_type);
        let headers = response.headers_mut();
        let fixed = Answer::security_headers().into_iter().map(|(name, value)| (name, value.to_string()));
        for (name, value) in fixed.chain(self.headers) {
            if let Ok(value) = hyper::header::HeaderValue::from_str(&value) {
                headers.insert(name, value);
            }
        }
        response
    }
}

/// What an API path answers when it cannot answer what was asked (not found, a bad question,
/// not allowed): `{"error": "..."}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    pub error: String,
}

/// The status service: the board, what the backends say of themselves, who may read, and the
/// thread that works the answers out.
pub struct StatusApi {
    board: Arc<Board>,
    backends: Arc<BackendFacts>,
    access: Access,
    worker: StatusWorker,
}

/// The status service's paths on the listener: `/`, `/ui` and what is under `/ui/`, `/api/v1`
/// and what is under `/api/v1/`. None is answered from the probe reserve: a status answer may
/// be costly, and the reserve is for the probes and the scrape.
pub fn routes(api: &Arc<StatusApi>) -> Routes {
    let handler: Handler = {
        let api = Arc::clone(api);
        Arc::new(move |request: &Parts, peer: SocketAddr| api.reply(request, peer))
    };
    let route = |paths| Route::new(paths, Arc::clone(&handler));
    Routes::new()
        .with(route(Paths::Exact("/")))
        .with(route(Paths::Exact("/ui")).listed())
        .with(route(Paths::Under("/ui/")))
        .with(route(Paths::Exact("/api/v1")))
        .with(route(Paths::Under("/api/v1/")))
}

impl StatusApi {
    /// The service, with its worker thread started.
    pub fn new(board: Arc<Board>, backends: Arc<BackendFacts>, access: Access) -> std::io::Result<StatusApi> {
        Ok(StatusApi { board, backends, access, worker: StatusWorker::start()? })
    }

    /// Answers a request for one of the status service's paths (`routes`). The access check runs here; the rest
    /// on the status worker (see `worker`), never on the caller's thread.
    pub async fn answer(&self, path: &str, query: Option<&str>, caller: &Caller<'_>) -> Answer {
        if let Err(refusal) = self.access.check(caller).await {
            return refused(path, &refusal);
        }
        let now = Timestamp::from_system_time(std::time::SystemTime::now());
        let (board, backends) = (Arc::clone(&self.board), Arc::clone(&self.backends));
        let (path, query) = (path.to_string(), query.unwrap_or("").to_string());
        let worked = self.worker.run(move || route(&board, &backends, &path, &Query::parse(&query), now)).await;
        worked.unwrap_or_else(|busy| {
            let mut answer = Answer::new(503, "text/plain; charset=utf-8", format!("{busy}\n"));
            answer.headers.push(("retry-after", "1".into()));
            answer
        })
    }

    /// Answers a request from the listener: who asks (the peer, its token, the Host it names)
    /// and what for are copied out of the request, and the answer is worked out after.
    fn reply(self: &Arc<Self>, request: &Parts, peer: SocketAddr) -> Reply {
        let api = Arc::clone(self);
        let headers = &request.headers;
        let authorization = headers.get(hyper::header::AUTHORIZATION).and_then(|v| v.to_str().ok()).map(str::to_string);
        // A Host header that is not text is kept as one, so that it is refused rather than missing.
        let host = headers.get(hyper::header::HOST).map(|v| v.to_str().unwrap_or("").to_string());
        let (path, query) = (request.uri.path().to_string(), request.uri.query().map(str::to_string));
        Box::pin(async move {
            let caller = Caller { peer: peer.ip(), authorization: authorization.as_deref(), host: host.as_deref() };
            api.answer(&path, query.as_deref(), &caller).await.into_response()
        })
    }
}

fn refused(path: &str, refusal: &Refusal) -> Answer {
    let status = refusal.status();
    let mut answer = if path.starts_with("/api/") {
        Answer::json(status, &ApiError { error: refusal.to_string() })
    } else {
        Answer::html(status, page::message_page("watermarkd: not allowed", &refusal.to_string()))
    };
    answer.headers.extend(refusal.headers());
    answer
}

/// A query string's parameters, percent-decoded (`+` is a space).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Query(Vec<(String, String)>);

impl Query {
    pub fn parse(text: &str) -> Query {
        Query(
            text.split('&')
                .filter(|pair| !pair.is_empty())
                .map(|pair| {
                    let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                    (decode(key), decode(value))
                })
                .collect(),
        )
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&byte) = bytes.get(i) {
        let hex = |at: usize| bytes.get(at).and_then(|b| char::from(*b).to_digit(16));
        match byte {
            b'+' => out.push(b' '),
            b'%' => match (hex(i + 1), hex(i + 2)) {
                (Some(high), Some(low)) => {
                    out.push(u8::try_from(high * 16 + low).unwrap_or(b'?'));
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            other => out.push(other),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What the table was asked for, or why the question is wrong.
fn list_query(query: &Query, default_limit: usize) -> Result<ListQuery, String> {
    let state = match query.get("state").filter(|s| !s.is_empty()) {
        None => None,
        Some(text) => Some(State::parse(text).ok_or_else(|| {
            let known: Vec<&str> = State::ALL.iter().map(|s| s.as_str()).collect();
            format!("state: {text:?} is not one of {}", known.join(", "))
        })?),
    };
    let number = |key: &str, default: usize| match query.get(key).filter(|v| !v.is_empty()) {
        None => Ok(default),
        Some(text) => text.parse::<usize>().map_err(|_| format!("{key}: {text:?} is not a whole number")),
    };
    let limit = number("limit", default_limit)?;
    if limit == 0 || limit > MAX_LIMIT {
        return Err(format!("limit: {limit} is not between 1 and {MAX_LIMIT}"));
    }
    let by_id = match query.get("sort").filter(|s| !s.is_empty()) {
        None | Some("urgency") => false,
        Some("id") => true,
        Some(other) => return Err(format!("sort: {other:?} is not urgency or id")),
    };
    let search = query.get("q").unwrap_or("").trim();
    if search.len() > MAX_SEARCH_BYTES {
        return Err(format!("q: the search is {} bytes; at most {MAX_SEARCH_BYTES}", search.len()));
    }
    let words = search.split_whitespace().count();
    if words > MAX_SEARCH_WORDS {
        return Err(format!("q: the search has {words} words; at most {MAX_SEARCH_WORDS}"));
    }
    let search = search.to_string();
    Ok(ListQuery { search, state, by_id, offset: number("offset", 0)?, limit })
}

/// Routes one request. `now` dates the page's "ago"s.
pub fn route(board: &Board, backends: &BackendFacts, path: &str, query: &Query, now: Timestamp) -> Answer {
    let seconds = now.unix_millis().div_euclid(1000);
    let api_error = |status: u16, error: String| Answer::json(status, &ApiError { error });
    match path {
        "/api/v1" | "/api/v1/" => Answer::json(
            200,
            &serde_json::json!({
                "autoscalers": "/api/v1/autoscalers",
                "autoscaler": "/api/v1/autoscalers/{id}",
                "backends": "/api/v1/backends",
            }),
        ),
        "/api/v1/autoscalers" => match list_query(query, PAGE_ROWS) {
            Ok(list) => Answer::json(200, &board.list(&list)),
            Err(message) => api_error(400, message),
        },
        "/api/v1/backends" => Answer::json(200, &backends_view(backends, board)),
        "/" | "/ui" | "/ui/" | "/ui/table" => match list_query(query, PAGE_ROWS) {
            Ok(list) => {
                let page = board.list(&list);
                if path == "/ui/table" {
                    Answer::html(200, page::table_rows(&page, &list, seconds))
                } else {
                    Answer::html(200, page::table_page(&page, &list, seconds, &health(board, backends, seconds)))
                }
            }
            Err(message) => Answer::html(400, page::message_page("watermarkd: bad request", &message)),
        },
        "/ui/health" => Answer::html(200, health(board, backends, seconds)),
        "/ui/app.js" => Answer::new(200, "text/javascript; charset=utf-8", JS),
        "/ui/style.css" => Answer::new(200, "text/css; charset=utf-8", CSS),
        _ => {
            if let Some(id) = path.strip_prefix("/api/v1/autoscalers/") {
                return match board.detail(&decode(id)) {
                    Some(detail) => Answer::json(200, &detail),
                    None => api_error(404, format!("no autoscaler {:?} runs here", decode(id))),
                };
            }
            if let Some(id) = path.strip_prefix("/ui/autoscaler/") {
                return match board.detail(&decode(id)) {
                    Some(detail) if query.get("fragment").is_some() => {
                        Answer::html(200, page::detail_fragment(&detail, seconds))
                    }
                    Some(detail) => {
                        Answer::html(200, page::detail_page(&detail, seconds, &health(board, backends, seconds)))
                    }
                    None => Answer::html(
                        404,
                        page::message_page(
                            "watermarkd: not found",
                            &format!("no autoscaler {:?} runs here", decode(id)),
                        ),
                    ),
                };
            }
            if path.starts_with("/api/") {
                api_error(404, format!("no such path: {path}; try /api/v1"))
            } else {
                Answer::html(404, page::message_page("watermarkd: not found", &format!("no such page: {path}")))
            }
        }
    }
}

/// The daemon's health as the top of each page shows it: its role, the rules file, the
/// backends as `/api/v1/backends` shows them.
fn health(board: &Board, facts: &BackendFacts, now: i64) -> String {
    page::health(&board.leadership(), &board.rules(), &backends_view(facts, board), now)
}

/// One backend as `/api/v1/backends` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendView {
    pub name: String,
    /// Requests since the start, by outcome (`ok`, `timeout`, `rate_limited`, ...).
    pub requests: BTreeMap<String, u64>,
    /// Datadog's rate-limit headers as last seen: `limit`, `remaining`, `reset_seconds`.
    #[serde(default, skip_serializing_if = "RateLimitSeen::is_empty")]
    pub rate_limit: RateLimitSeen,
    /// The cycle spacing the budget imposes (0: every requested cycle runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stretched_interval_seconds: Option<u64>,
    /// Autoscalers reading from it, and of those the ones without any usable value.
    pub autoscalers: usize,
    pub autoscalers_without_data: usize,
}

/// Each backend: what it says of itself, and who reads from it.
fn backends_view(facts: &BackendFacts, board: &Board) -> Vec<BackendView> {
    let mut views: BTreeMap<String, BackendView> = facts
        .snapshot()
        .into_iter()
        .map(|(name, facts)| {
            let view = BackendView {
                name: name.clone(),
                requests: facts.requests.into_iter().map(|(outcome, count)| (outcome.to_string(), count)).collect(),
                rate_limit: facts.rate_limit,
                stretched_interval_seconds: facts.stretched_interval_seconds,
                ..BackendView::default()
            };
            (name, view)
        })
        .collect();
    for (backend, autoscalers, without_data) in board.backend_counts() {
        let view = views
            .entry(backend)
            .or_insert_with_key(|name| BackendView { name: name.clone(), ..BackendView::default() });
        view.autoscalers = autoscalers;
        view.autoscalers_without_data = without_data;
    }
    views.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::outcome::{Identity, Ledger, Outcome, SeriesLabels};
    use serde_json::json;
    use std::sync::Arc;
    use watermarkd_engine::{decide, Reading, State as EngineState, Target};

    fn board_with(name: &str, note: &str) -> Board {
        let ledger = Arc::new(Ledger::new(std::time::Duration::from_secs(3600)));
        let labels = Arc::new(SeriesLabels::deployment(name, "prod", false));
        ledger.admit(Identity::rules_file(Arc::clone(&labels), &["prom"], 15, (1, 20)));
        let rule = crate::domain::rules::rule_from_json(&json!({
            "min_replicas": 1, "max_replicas": 20, "algorithm": "absolute",
            "metric": [{ "name": "load", "query": "q", "high_watermark": 10, "low_watermark": 5 }]
        }))
        .unwrap();
        let target = Target { spec_replicas: 2, status_replicas: Some(2), ready_replicas: Some(2) };
        let now = Timestamp::from_unix_millis(1_700_000_000_000);
        let reading = [Reading::Unavailable { reason: note.into() }];
        let decision = decide(&rule, target, &reading, &EngineState::default(), now);
        ledger.record(&format!("file/{name}"), &labels, Outcome::of_decision(decision, &rule, false));
        Board::new(ledger)
    }

    fn ask(board: &Board, path: &str, query: &str) -> Answer {
        route(board, &BackendFacts::new(), path, &Query::parse(query), Timestamp::from_unix_millis(1_700_000_060_000))
    }

    #[test]
    fn each_backend_is_what_it_said_of_itself_and_who_reads_from_it() {
        let board = board_with("web", "no data");
        let facts = BackendFacts::new();
        facts.request("dd", "ok");
        facts.request("dd", "ok");
        facts.request("dd", "rate_limited");
        facts.rate_limit("dd", RateLimitSeen { limit: Some(1600), remaining: Some(12), reset_seconds: None });
        facts.stretched_interval("dd", 30);
        let answer = route(&board, &facts, "/api/v1/backends", &Query::default(), Timestamp::from_unix_millis(0));
        let body: serde_json::Value = serde_json::from_slice(&answer.body).unwrap();
        assert_eq!(
            body,
            json!([
                { "name": "dd", "requests": { "ok": 2, "rate_limited": 1 },
                  "rate_limit": { "limit": 1600, "remaining": 12 }, "stretched_interval_seconds": 30,
                  "autoscalers": 0, "autoscalers_without_data": 0 },
                { "name": "prom", "requests": {}, "autoscalers": 1, "autoscalers_without_data": 1 }
            ])
        );
        let read: Vec<BackendView> = serde_json::from_slice(&answer.body).unwrap();
        assert_eq!(read[0].rate_limit.remaining, Some(12), "read back through the type it was written from");
        assert_eq!(read[1].stretched_interval_seconds, None);
    }

    #[test]
    fn query_strings_are_decoded_and_bad_ones_named() {
        let query = Query::parse("q=web+api%2Fv1&state=&x=%zz&limit=5");
        assert_eq!(query.get("q"), Some("web api/v1"));
        assert_eq!(query.get("x"), Some("%zz"));
        assert_eq!(list_query(&query, 100).unwrap().limit, 5);
        let bad = |text: &str| list_query(&Query::parse(text), 100).unwrap_err();
        assert_eq!(bad("limit=0"), "limit: 0 is not between 1 and 1000");
        assert_eq!(bad("offset=-1"), "offset: \"-1\" is not a whole number");
        assert!(bad("state=asleep").starts_with("state: \"asleep\" is not one of failing, pending"));
    }

    #[test]
    fn text_from_an_answer_cannot_become_markup() {
        let board = board_with("web", "<script>alert(1)</script> & \"quotes\"");
        for (path, query) in [("/ui", ""), ("/ui/table", ""), ("/ui/autoscaler/file/web", ""), ("/ui", "q=\"><i>x")] {
            let answer = ask(&board, path, query);
            let page = String::from_utf8(answer.body).unwrap();
            assert!(!page.contains("<script>alert") && !page.contains("<i>x"), "{path}: {page}");
        }
        let page = String::from_utf8(ask(&board, "/ui/autoscaler/file/web", "").body).unwrap();
        assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt; &amp; &quot;quotes&quot;"), "{page}");
    }

    #[test]
    fn every_path_answers_what_it_is_or_says_what_is_not_there() {
        let board = board_with("web", "no data");
        let detail = ask(&board, "/api/v1/autoscalers/file%2Fweb", "");
        assert_eq!((detail.status, detail.content_type), (200, "application/json"));
        let missing = ask(&board, "/api/v1/autoscalers/file/nope", "");
        assert_eq!(missing.status, 404);
        assert!(String::from_utf8(missing.body).unwrap().contains("no autoscaler \\\"file/nope\\\" runs here"));
        assert_eq!(ask(&board, "/api/v2/autoscalers", "").status, 404);
        assert_eq!(ask(&board, "/ui/nothing", "").status, 404);
        assert_eq!(ask(&board, "/api/v1/autoscalers", "limit=5000").status, 400);
        let js = ask(&board, "/ui/app.js", "");
        assert_eq!(js.content_type, "text/javascript; charset=utf-8");
        let fragment = String::from_utf8(ask(&board, "/ui/autoscaler/file/web", "fragment=1").body).unwrap();
        assert!(!fragment.contains("<html"), "only the part the script swaps");
    }
}
