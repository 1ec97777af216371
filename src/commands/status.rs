//! `watermarkd status [NAME]`: what a running daemon's autoscalers are doing and why, read from
//! its status API (`/api/v1`, docs/status.md). Without a name, a table of every autoscaler;
//! with one, the full explanation of its last decision and its recent scale events. The
//! sentences are the daemon's own, so the page, the API and this command say the same.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::adapters::status::board::{Detail, ListPage, MetricNow, RulesView, SampleView, State, Summary};
use crate::adapters::status::http::ApiError;
use crate::adapters::status::page::url_escape;

/// The local listener, as the host install configures it.
pub const DEFAULT_URL: &str = "http://127.0.0.1:8080";
/// The environment variable a token may come from instead of `--token-file`.
pub const TOKEN_ENV: &str = "WATERMARKD_STATUS_TOKEN";
/// Rows asked for per request when listing every autoscaler.
const PAGE: usize = 1_000;
const TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
}

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// One autoscaler: its name, `NAMESPACE/NAME`, or its id (`file/NAME`, `crd/NAMESPACE/NAME`).
    #[arg(value_name = "NAME")]
    pub name: Option<String>,
    /// The daemon's listener.
    #[arg(long, value_name = "URL", default_value = DEFAULT_URL)]
    pub url: String,
    /// Only autoscalers in this state (failing, pending, no_data, fallback, paused, limited,
    /// scaling, ok).
    #[arg(long, value_name = "STATE")]
    pub state: Option<String>,
    /// A file holding the bearer token the daemon asks for (else WATERMARKD_STATUS_TOKEN).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// `text` for a person, `json` for a script (the API's answer, as it is).
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    pub output: Output,
}

#[derive(Debug, thiserror::Error)]
pub enum StatusCommandError {
    #[error(
        "cannot reach the daemon at {url}: {cause}. Is it running and listening there? For a daemon in a \
         cluster, forward its port first (`kubectl -n watermarkd port-forward deploy/watermarkd 8080:8080`), or \
         give another address with --url"
    )]
    Unreachable { url: String, cause: String },
    #[error("the daemon answered {status} to {url}: {message}")]
    Refused { url: String, status: u16, message: String },
    #[error("the daemon's answer to {url} is not the status API's JSON: {error}")]
    Unreadable { url: String, error: String },
    #[error("cannot read the token file {path}: {error}")]
    Token { path: String, error: String },
    #[error("no autoscaler {name:?} runs there{known}")]
    NotFound { name: String, known: String },
    #[error("{name:?} names several autoscalers: {candidates}; give one of them as NAMESPACE/NAME or as its id")]
    Ambiguous { name: String, candidates: String },
    #[error(transparent)]
    Output(#[from] std::io::Error),
}

/// The API, as this command asks it.
struct Api {
    client: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Api {
    fn new(args: &StatusArgs) -> Result<Api, StatusCommandError> {
        crate::adapters::backend::ensure_crypto_provider();
        let token = match &args.token_file {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .map_err(|e| StatusCommandError::Token { path: path.display().to_string(), error: e.to_string() })?
                    .trim()
                    .to_string(),
            ),
            None => std::env::var(TOKEN_ENV).ok().map(|t| t.trim().to_string()).filter(|t| !t.is_empty()),
        };
        let base = args.url.trim_end_matches('/').to_string();
        let client = reqwest::Client::builder()
            .timeout(TIMEOUT)
            // A token is never carried to wherever a redirect points.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| StatusCommandError::Unreachable { url: base.clone(), cause: e.to_string() })?;
        Ok(Api { client, base, token })
    }

    /// GETs `path` (with its query) and reads the JSON answer into the type the daemon wrote it
    /// from. `None` on a 404.
    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<Option<T>, StatusCommandError> {
        let url = format!("{}{path}", self.base);
        let mut request = self.client.get(&url);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let unreachable =
            |e: reqwest::Error| StatusCommandError::Unreachable { url: self.base.clone(), cause: cause(e) };
        let answer = request.send().await.map_err(unreachable)?;
        let status = answer.status().as_u16();
        let body = answer.bytes().await.map_err(unreachable)?;
        if status == 404 {
            return Ok(None);
        }
        if status != 200 {
            let message = serde_json::from_slice::<ApiError>(&body)
                .map(|refused| refused.error)
                .unwrap_or_else(|_| String::from_utf8_lossy(&body).chars().take(200).collect());
            return Err(StatusCommandError::Refused { url, status, message: printable(&message) });
        }
        serde_json::from_slice(&body)
            .map(Some)
            .map_err(|e| StatusCommandError::Unreadable { url, error: e.to_string() })
    }

    /// Every autoscaler (in the state asked for, matching the search), page by page.
    async fn list(&self, state: Option<&str>, search: Option<&str>) -> Result<ListPage, StatusCommandError> {
        let mut rows: Vec<Summary> = Vec::new();
        let mut last = loop {
            let mut path = format!("/api/v1/autoscalers?limit={PAGE}&offset={}", rows.len());
            if let Some(state) = state {
                path.push_str(&format!("&state={}", url_escape(state)));
            }
            if let Some(search) = search {
                path.push_str(&format!("&q={}", url_escape(search)));
            }
            let mut page: ListPage = self.get(&path).await?.ok_or_else(|| StatusCommandError::Refused {
                url: format!("{}{path}", self.base),
                status: 404,
                message: "no status API there (is it turned off, or is this not watermarkd?)".into(),
            })?;
            let got = std::mem::take(&mut page.autoscalers);
            let done = got.is_empty() || rows.len() + got.len() >= page.matched;
            rows.extend(got);
            if done {
                break page;
            }
        };
        last.offset = 0;
        last.autoscalers = rows;
        Ok(last)
    }
}

/// What went wrong, once: the innermost cause (`Connection refused (os error 111)`), without
/// the URL that reqwest repeats at each level of its chain.
fn cause(error: reqwest::Error) -> String {
    if error.is_timeout() {
        return format!("no answer within {}s", TIMEOUT.as_secs());
    }
    let error = error.without_url();
    let mut innermost: &dyn std::error::Error = &error;
    while let Some(source) = innermost.source() {
        innermost = source;
    }
    innermost.to_string()
}

/// Runs the command. Returns false when an autoscaler shown is failing or has no data.
pub async fn run(args: &StatusArgs, out: &mut impl Write) -> Result<bool, StatusCommandError> {
    let api = Api::new(args)?;
    match &args.name {
        None => {
            let list = api.list(args.state.as_deref(), None).await?;
            if list.daemon.leader == Some(false) {
                let holder =
                    list.daemon.leader_identity.as_deref().map_or_else(|| "another daemon".to_string(), printable);
                let _ = writeln!(
                    std::io::stderr(),
                    "watermarkd status: this daemon follows; {holder} leads and decides (ask it instead)"
                );
            }
            match args.output {
                Output::Json => writeln!(out, "{}", serde_json::to_string_pretty(&list).unwrap_or_default())?,
                Output::Text => write_table(&list, out)?,
            }
            Ok(list.autoscalers.iter().all(|row| healthy(row.state)))
        }
        Some(name) => {
            let id = resolve(&api, name).await?;
            let path = format!("/api/v1/autoscalers/{}", url_escape(&id));
            let detail: Detail = api
                .get(&path)
                .await?
                .ok_or_else(|| StatusCommandError::NotFound { name: name.clone(), known: String::new() })?;
            match args.output {
                Output::Json => writeln!(out, "{}", serde_json::to_string_pretty(&detail).unwrap_or_default())?,
                Output::Text => write_detail(&detail, out)?,
            }
            Ok(healthy(detail.summary.state))
        }
    }
}

fn healthy(state: State) -> bool {
    !matches!(state, State::Failing | State::NoData)
}

/// The id of the autoscaler `name` means: an id as it is, else the one whose name, or
/// `NAMESPACE/NAME`, it is. A bare name two namespaces share is refused, listing both.
async fn resolve(api: &Api, name: &str) -> Result<String, StatusCommandError> {
    if name.starts_with("file/") || name.starts_with("crd/") {
        return Ok(name.to_string());
    }
    // Only the rows whose fields hold its name come back; the exact match is decided here.
    let own_name = name.rsplit('/').next().unwrap_or(name);
    let rows = api.list(None, Some(own_name)).await?.autoscalers;
    let matching: Vec<&Summary> = rows
        .iter()
        .filter(|row| {
            let identity = &row.identity;
            *identity.name == *name || format!("{}/{}", identity.namespace, identity.name) == name
        })
        .collect();
    match matching.as_slice() {
        [one] => Ok(one.identity.id.to_string()),
        [] => {
            let mut known: Vec<String> = rows.iter().map(|row| printable(&row.identity.id)).collect();
            known.truncate(20);
            let known = if known.is_empty() { String::new() } else { format!(" (it runs: {})", known.join(", ")) };
            Err(StatusCommandError::NotFound { name: name.to_string(), known })
        }
        several => {
            let candidates: Vec<String> = several
                .iter()
                .map(|row| {
                    let identity = &row.identity;
                    printable(&format!("{}/{} ({})", identity.namespace, identity.name, identity.id))
                })
                .collect();
            Err(StatusCommandError::Ambiguous { name: name.to_string(), candidates: candidates.join(", ") })
        }
    }
}

/// `text` with each control character written as its escape (`\u{1b}`): a name or metric an
/// object's author chose is shown, never obeyed by the terminal (a colour, a cleared screen, a
/// window title).
fn printable(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_string();
    }
    text.chars().map(|c| if c.is_control() { c.escape_unicode().to_string() } else { c.to_string() }).collect()
}

/// A count, or `-` when there is none.
fn count(value: Option<u32>) -> String {
    value.map_or_else(|| "-".into(), |n| n.to_string())
}

fn number_text(value: f64) -> String {
    crate::domain::status::explain::number(value)
}

/// The metric cell: `usage 0.81 [0.6, 0.9]`.
fn metric_text(metric: Option<&MetricNow>) -> String {
    let Some(m) = metric else { return "-".into() };
    let band = format!("[{}, {}]", number_text(m.low_watermark), number_text(m.high_watermark));
    let value = m.usage.map_or_else(|| "no value".into(), number_text);
    format!("{} {value} {band}", printable(&m.name))
}

/// The daemon's word that the rules file on disk was refused, and each problem, before the
/// table: what runs is not what is on disk.
fn write_rejected_rules(rules: &RulesView, out: &mut impl Write) -> std::io::Result<()> {
    let Some(rejected) = &rules.rejected else {
        return Ok(());
    };
    writeln!(out, "The rules file on disk was refused at {}: {}", rejected.at, printable(&rejected.reason))?;
    for problem in &rejected.problems {
        writeln!(out, "  {}", printable(problem))?;
    }
    writeln!(out)
}

fn write_table(list: &ListPage, out: &mut impl Write) -> std::io::Result<()> {
    write_rejected_rules(&list.rules, out)?;
    let rows = &list.autoscalers;
    let mut table: Vec<[String; 7]> =
        vec![["NAME", "TARGET", "REPLICAS", "METRIC [LOW, HIGH]", "STATE", "LAST SCALE", "WHY"].map(String::from)];
    for row in rows {
        let identity = &row.identity;
        let target = &identity.target;
        let name = match identity.source {
            "crd" => format!("{}/{}", printable(&identity.namespace), printable(&identity.name)),
            _ => printable(&identity.name),
        };
        let replicas = match row.spec_replicas {
            Some(spec) => format!("{spec} ({}..{})", count(row.min_replicas), count(row.max_replicas)),
            None => "-".into(),
        };
        let last_scale = row.last_scale.map_or_else(|| "-".into(), |e| format!("{} -> {}", e.from, e.to));
        let why = row.failing.as_deref().or(row.why.as_deref()).map_or_else(|| "-".into(), printable);
        table.push([
            name,
            format!("{} {}/{}", printable(&target.kind), printable(&target.namespace), printable(&target.name)),
            replicas,
            metric_text(row.metric.as_ref()),
            row.state.as_str().to_string(),
            last_scale,
            why,
        ]);
    }
    let widths: Vec<usize> =
        (0..6).map(|i| table.iter().filter_map(|r| r.get(i)).map(|c| c.chars().count()).max().unwrap_or(0)).collect();
    for row in &table {
        let mut line = String::new();
        for (cell, width) in row.iter().zip(&widths) {
            line.push_str(&format!("{cell:<width$}  "));
        }
        if let Some(why) = row.last() {
            line.push_str(why);
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    writeln!(out, "{} of {} autoscalers", rows.len(), list.total)
}

fn write_detail(detail: &Detail, out: &mut impl Write) -> std::io::Result<()> {
    let summary = &detail.summary;
    let identity = &summary.identity;
    let target = &identity.target;
    writeln!(
        out,
        "{} ({}) -> {} {}/{}: {}",
        printable(&identity.name),
        printable(&identity.id),
        printable(&target.kind),
        printable(&target.namespace),
        printable(&target.name),
        summary.state.as_str()
    )?;
    let failing = summary.failing.as_deref();
    if let Some(failing) = failing {
        match failing_since(&detail.history.samples) {
            Some(since) => writeln!(out, "failing since {since}: {}", printable(failing))?,
            None => writeln!(out, "cannot evaluate: {}", printable(failing))?,
        }
    }
    let Some(last) = &detail.last else {
        return match failing {
            Some(_) => writeln!(
                out,
                "no decision yet: every evaluation so far has failed; the daemon tries again every {}s",
                identity.interval_seconds
            ),
            None => writeln!(out, "not evaluated yet"),
        };
    };
    if failing.is_some() {
        writeln!(out, "\nthe last decision, before it began failing:")?;
    }
    writeln!(
        out,
        "replicas {} ({} ready), bounds {}..{}, evaluated at {}",
        last.replicas, last.ready_replicas, last.min_replicas, last.max_replicas, last.at
    )?;
    writeln!(out, "\nwhy:")?;
    for sentence in last.explanation.iter() {
        writeln!(out, "  {}", printable(sentence))?;
    }
    if let Some(forecast) = &last.forecast {
        writeln!(out, "  forecast: {}", printable(forecast))?;
    }
    if let Some(active) = last.fallback_active {
        writeln!(out, "  fallback active: {active}")?;
    }
    if let Some(until) = &identity.paused_until {
        writeln!(out, "  paused until {}", printable(until))?;
    }
    if let Some(observed) = &detail.observed {
        writeln!(out, "\nobserving, beside the live controller:")?;
        for sentence in crate::domain::observed::describe(&observed.comparison, observed.live.as_ref()) {
            writeln!(out, "  {}", printable(&sentence))?;
        }
    }
    let events = &detail.history.events;
    if events.is_empty() {
        return writeln!(out, "\nscale events in the history: none");
    }
    writeln!(out, "\nscale events in the history, newest first:")?;
    for event in events.iter().rev().take(10) {
        writeln!(
            out,
            "  {} {} -> {}{}",
            instant(event.at).unwrap_or_else(|| "-".into()),
            event.from,
            event.to,
            if event.written { "" } else { " (decided, not written)" }
        )?;
    }
    Ok(())
}

/// Unix seconds, as RFC 3339.
fn instant(seconds: i64) -> Option<String> {
    watermarkd_engine::Timestamp::from_unix_seconds_f64(seconds as f64).map(|t| t.to_string())
}

/// When the evaluations began failing, as far as the history says: the first sample of the
/// run of failed ones it ends with. `None` when no sample says (it failed from the start).
fn failing_since(samples: &[SampleView]) -> Option<String> {
    let failed = |sample: &&SampleView| sample.marks.contains(&"failed");
    let first = samples.iter().rev().take_while(failed).last()?;
    instant(first.at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    /// One autoscaler as the daemon writes it (docs/status.md): it decided at 09:00, then its
    /// target went away.
    fn failing_detail() -> Value {
        let metric = json!({ "name": "load", "value": 7.0, "usage": 7.0, "low_watermark": 5.0, "high_watermark": 10.0,
                             "position": "inside", "proposal": null, "age_seconds": 31.0 });
        let last = json!({
            "at": "2026-11-27T09:00:00Z", "spec_replicas": 3, "ready_replicas": 3, "replicas": 3,
            "action": "hold", "scaled": false, "proposal": null, "limit": "within_range",
            "min_replicas": 1, "max_replicas": 6, "compared": "value", "metrics": [metric],
            "upscale_blocked_seconds": 0.0, "downscale_blocked_seconds": 0.0, "upscale_tolerance": 0.1, "downscale_tolerance": 0.1,
            "explanation": ["held at 3: every metric is inside its band", "load 7 is inside [5, 10]"],
            "paused": false, "fallback_active": false
        });
        let sample = |at: i64, marks: &[&str]| {
            let mut sample = json!({ "at": at, "values": [null], "watermarks": [[5.0, 10.0]], "proposed": null,
                                     "replicas": 3 });
            if !marks.is_empty() {
                sample["marks"] = json!(marks);
            }
            sample
        };
        let history = json!({
            "metrics": ["load"], "compared": "value",
            "samples": [sample(1_795_770_000, &[]), sample(1_795_770_015, &["failed"]),
                        sample(1_795_770_030, &["failed", "no_data"])],
            "events": [{ "at": 1_795_769_000, "from": 2, "to": 3, "written": false }]
        });
        json!({
            "id": "crd/prod/web", "name": "web", "namespace": "prod", "source": "crd",
            "target": { "kind": "Deployment", "namespace": "prod", "name": "web" },
            "interval_seconds": 15, "dry_run": false, "backends": ["datadog"],
            "state": "failing",
            "spec_replicas": 3, "ready_replicas": 3, "min_replicas": 1, "max_replicas": 6,
            "metric": metric, "evaluated_at": "2026-11-27T09:00:00Z",
            "why": "held at 3: every metric is inside its band",
            "last_scale": { "at": 1_795_769_000, "from": 2, "to": 3, "written": false },
            "failing": "Deployment prod/web does not exist", "failing_since": "2026-11-27T09:00:15Z",
            "last": last, "history": history
        })
    }

    fn detail_text(detail: &Value) -> String {
        let detail: Detail = serde_json::from_value(detail.clone()).expect("the API's detail");
        let mut out = Vec::new();
        write_detail(&detail, &mut out).expect("written");
        String::from_utf8(out).expect("UTF-8")
    }

    #[test]
    fn control_characters_are_shown_as_escapes() {
        assert_eq!(printable("cpu\u{1b}[2J\u{7}"), "cpu\\u{1b}[2J\\u{7}");
        assert_eq!(printable("plain ü"), "plain ü");
        assert_eq!(printable("a\nb"), "a\\u{a}b");
    }

    /// It failed after deciding: the decision shown is the last one, and the failure says
    /// since when, from the run of failed samples the history ends with.
    #[test]
    fn a_failing_autoscaler_says_since_when() {
        let said = detail_text(&failing_detail());
        assert!(said.starts_with("web (crd/prod/web) -> Deployment prod/web: failing\n"), "{said}");
        assert!(said.contains("\nfailing since 2026-11-27T09:00:15Z: Deployment prod/web does not exist\n"), "{said}");
        assert!(said.contains("the last decision, before it began failing:\nreplicas 3"), "{said}");
        assert!(said.contains("\n  load 7 is inside [5, 10]\n  fallback active: false\n"), "{said}");
        assert!(said.contains("2 -> 3 (decided, not written)"), "{said}");
        assert!(!said.contains("not evaluated yet"), "{said}");
    }

    /// What the command reads is what the daemon wrote, field for field: read into the types
    /// and written again, the answer is the same JSON.
    #[test]
    fn the_api_reads_back_into_the_types_that_wrote_it() {
        let detail = failing_detail();
        let read: Detail = serde_json::from_value(detail.clone()).expect("the API's detail");
        assert_eq!(serde_json::to_value(&read).unwrap(), detail);
        let row = detail.as_object().unwrap().iter().filter(|(key, _)| !["last", "history"].contains(&key.as_str()));
        let list = json!({
            "daemon": { "leader": false, "leader_identity": "watermarkd-0" },
            "rules": { "rejected": { "at": "2026-11-27T09:00:00Z", "reason": "rules.toml: 1 problem",
                                     "problems": ["rules.toml:3: autoscaler \"web\": max_replicas: not a number"] } },
            "total": 1, "matched": 1, "offset": 0,
            "states": [["failing", 1], ["ok", 0]],
            "autoscalers": [Value::Object(row.map(|(k, v)| (k.clone(), v.clone())).collect())]
        });
        let read: ListPage = serde_json::from_value(list.clone()).expect("the API's list");
        assert_eq!(serde_json::to_value(&read).unwrap(), list);
        let mut out = Vec::new();
        write_table(&read, &mut out).unwrap();
        let table = String::from_utf8(out).unwrap();
        assert_eq!(
            table,
            "The rules file on disk was refused at 2026-11-27T09:00:00Z: rules.toml: 1 problem\n\
             \x20 rules.toml:3: autoscaler \"web\": max_replicas: not a number\n\
             \n\
             NAME      TARGET               REPLICAS  METRIC [LOW, HIGH]  STATE    LAST SCALE  WHY\n\
             prod/web  Deployment prod/web  3 (1..6)  load 7 [5, 10]      failing  2 -> 3      \
             Deployment prod/web does not exist\n\
             1 of 1 autoscalers\n"
        );
    }

    /// A field the daemon never writes that way is refused, naming it, not read as something else.
    #[test]
    fn an_answer_that_is_not_the_api_s_is_refused_naming_what_is_wrong() {
        let mut detail = failing_detail();
        detail["source"] = json!("helm");
        let error = serde_json::from_value::<Detail>(detail).unwrap_err().to_string();
        assert!(error.contains("source \"helm\" is not one of file, crd"), "{error}");
        let mut detail = failing_detail();
        detail["history"]["samples"][1]["marks"] = json!(["sleepy"]);
        let error = serde_json::from_value::<Detail>(detail).unwrap_err().to_string();
        assert!(error.contains("\"sleepy\" is not a history mark"), "{error}");
    }
}
