//! `watermarkd status [NAME]`: what a running daemon's autoscalers are doing and why, read from
//! its status API (`/api/v1`, docs/status.md). Without a name, a table of every autoscaler;
//! with one, the full explanation of its last decision and its recent scale events. The
//! sentences are the daemon's own, so the page, the API and this command say the same.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

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

    /// GETs `path` (with its query) and reads the JSON answer. `None` on a 404.
    async fn get(&self, path: &str) -> Result<Option<Value>, StatusCommandError> {
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
        let value: Result<Value, _> = serde_json::from_slice(&body);
        if status != 200 {
            let message = value
                .ok()
                .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_string))
                .unwrap_or_else(|| String::from_utf8_lossy(&body).chars().take(200).collect());
            return Err(StatusCommandError::Refused { url, status, message: printable(&message) });
        }
        value.map(Some).map_err(|e| StatusCommandError::Unreadable { url, error: e.to_string() })
    }

    /// Every autoscaler (in the state asked for, matching the search), page by page.
    async fn list(&self, state: Option<&str>, search: Option<&str>) -> Result<Value, StatusCommandError> {
        let mut rows: Vec<Value> = Vec::new();
        let mut last;
        loop {
            let mut path = format!("/api/v1/autoscalers?limit={PAGE}&offset={}", rows.len());
            if let Some(state) = state {
                path.push_str(&format!("&state={}", crate::adapters::status::page::url_escape(state)));
            }
            if let Some(search) = search {
                path.push_str(&format!("&q={}", crate::adapters::status::page::url_escape(search)));
            }
            let page = self.get(&path).await?.ok_or_else(|| StatusCommandError::Refused {
                url: format!("{}{path}", self.base),
                status: 404,
                message: "no status API there (is it turned off, or is this not watermarkd?)".into(),
            })?;
            let got = page.get("autoscalers").and_then(Value::as_array).cloned().unwrap_or_default();
            let matched = page.get("matched").and_then(Value::as_u64).unwrap_or(0);
            let done = got.is_empty() || rows.len() + got.len() >= usize::try_from(matched).unwrap_or(usize::MAX);
            rows.extend(got);
            last = page;
            if done {
                break;
            }
        }
        if let Some(object) = last.as_object_mut() {
            object.insert("offset".into(), Value::from(0));
            object.insert("autoscalers".into(), Value::Array(rows));
        }
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
            let daemon = list.get("daemon");
            if daemon.and_then(|d| d.get("leader")) == Some(&Value::Bool(false)) {
                let holder = daemon
                    .and_then(|d| d.get("leader_identity"))
                    .and_then(Value::as_str)
                    .map_or_else(|| "another daemon".to_string(), printable);
                let _ = writeln!(
                    std::io::stderr(),
                    "watermarkd status: this daemon follows; {holder} leads and decides (ask it instead)"
                );
            }
            match args.output {
                Output::Json => writeln!(out, "{}", serde_json::to_string_pretty(&list).unwrap_or_default())?,
                Output::Text => write_table(&list, out)?,
            }
            let rows = list.get("autoscalers").and_then(Value::as_array).cloned().unwrap_or_default();
            Ok(rows.iter().all(healthy))
        }
        Some(name) => {
            let id = resolve(&api, name).await?;
            let path = format!("/api/v1/autoscalers/{}", crate::adapters::status::page::url_escape(&id));
            let detail = api
                .get(&path)
                .await?
                .ok_or_else(|| StatusCommandError::NotFound { name: name.clone(), known: String::new() })?;
            match args.output {
                Output::Json => writeln!(out, "{}", serde_json::to_string_pretty(&detail).unwrap_or_default())?,
                Output::Text => write_detail(&detail, out)?,
            }
            Ok(healthy(&detail))
        }
    }
}

fn healthy(row: &Value) -> bool {
    !matches!(row.get("state").and_then(Value::as_str), Some("failing" | "no_data"))
}

/// The id of the autoscaler `name` means: an id as it is, else the one whose name, or
/// `NAMESPACE/NAME`, it is. A bare name two namespaces share is refused, listing both.
async fn resolve(api: &Api, name: &str) -> Result<String, StatusCommandError> {
    if name.starts_with("file/") || name.starts_with("crd/") {
        return Ok(name.to_string());
    }
    // Only the rows whose fields hold its name come back; the exact match is decided here.
    let own_name = name.rsplit('/').next().unwrap_or(name);
    let list = api.list(None, Some(own_name)).await?;
    let rows = list.get("autoscalers").and_then(Value::as_array).cloned().unwrap_or_default();
    let field = |row: &Value, key: &str| row.get(key).and_then(Value::as_str).unwrap_or("").to_string();
    let matching: Vec<&Value> = rows
        .iter()
        .filter(|row| {
            let (own, namespace) = (field(row, "name"), field(row, "namespace"));
            own == name || format!("{namespace}/{own}") == name
        })
        .collect();
    match matching.as_slice() {
        [one] => Ok(field(one, "id")),
        [] => {
            let mut known: Vec<String> = rows.iter().map(|row| printable(&field(row, "id"))).collect();
            known.truncate(20);
            let known = if known.is_empty() { String::new() } else { format!(" (it runs: {})", known.join(", ")) };
            Err(StatusCommandError::NotFound { name: name.to_string(), known })
        }
        several => {
            let candidates: Vec<String> = several
                .iter()
                .map(|row| {
                    printable(&format!("{}/{} ({})", field(row, "namespace"), field(row, "name"), field(row, "id")))
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

fn text(value: Option<&Value>) -> String {
    match value {
        Some(Value::String(s)) => printable(s),
        Some(Value::Number(n)) => number_text(n.as_f64()),
        Some(Value::Null) | None => "-".into(),
        // JSON text: its strings already escape every control character.
        Some(other) => other.to_string(),
    }
}

fn number_text(value: Option<f64>) -> String {
    value.map_or_else(|| "-".into(), crate::domain::status::explain::number)
}

/// The metric cell: `usage 0.81 [0.6, 0.9]`.
fn metric_text(metric: Option<&Value>) -> String {
    let Some(m) = metric.filter(|m| !m.is_null()) else { return "-".into() };
    let band = format!(
        "[{}, {}]",
        number_text(m.get("low_watermark").and_then(Value::as_f64)),
        number_text(m.get("high_watermark").and_then(Value::as_f64))
    );
    let value = m.get("usage").and_then(Value::as_f64).map_or_else(|| "no value".into(), |v| number_text(Some(v)));
    format!("{} {value} {band}", text(m.get("name")))
}

/// The daemon's word that the rules file on disk was refused, and each problem, before the
/// table: what runs is not what is on disk.
fn write_rejected_rules(list: &Value, out: &mut impl Write) -> std::io::Result<()> {
    let Some(rejected) = list.get("rules").and_then(|r| r.get("rejected")).filter(|r| r.is_object()) else {
        return Ok(());
    };
    let at = rejected.get("at").and_then(Value::as_str).map(|at| format!(" at {}", printable(at))).unwrap_or_default();
    writeln!(out, "The rules file on disk was refused{at}: {}", text(rejected.get("reason")))?;
    for problem in rejected.get("problems").and_then(Value::as_array).into_iter().flatten() {
        writeln!(out, "  {}", text(Some(problem)))?;
    }
    writeln!(out)
}

fn write_table(list: &Value, out: &mut impl Write) -> std::io::Result<()> {
    write_rejected_rules(list, out)?;
    let rows = list.get("autoscalers").and_then(Value::as_array).cloned().unwrap_or_default();
    let mut table: Vec<[String; 7]> =
        vec![["NAME", "TARGET", "REPLICAS", "METRIC [LOW, HIGH]", "STATE", "LAST SCALE", "WHY"].map(String::from)];
    for row in &rows {
        let target = row.get("target").cloned().unwrap_or(Value::Null);
        let name = match row.get("source").and_then(Value::as_str) {
            Some("crd") => format!("{}/{}", text(row.get("namespace")), text(row.get("name"))),
            _ => text(row.get("name")),
        };
        let replicas = match (row.get("spec_replicas").and_then(Value::as_u64), row.get("max_replicas")) {
            (Some(spec), max) => format!("{spec} ({}..{})", text(row.get("min_replicas")), text(max)),
            (None, _) => "-".into(),
        };
        let last_scale = row
            .get("last_scale")
            .filter(|e| !e.is_null())
            .map(|e| format!("{} -> {}", text(e.get("from")), text(e.get("to"))))
            .unwrap_or_else(|| "-".into());
        let why = row.get("failing").filter(|f| !f.is_null()).or(row.get("why"));
        table.push([
            name,
            format!("{} {}/{}", text(target.get("kind")), text(target.get("namespace")), text(target.get("name"))),
            replicas,
            metric_text(row.get("metric")),
            text(row.get("state")),
            last_scale,
            text(why),
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
    writeln!(
        out,
        "{} of {} autoscalers",
        rows.len(),
        list.get("total").and_then(Value::as_u64).unwrap_or(rows.len() as u64)
    )
}

fn write_detail(detail: &Value, out: &mut impl Write) -> std::io::Result<()> {
    let target = detail.get("target").cloned().unwrap_or(Value::Null);
    writeln!(
        out,
        "{} ({}) -> {} {}/{}: {}",
        text(detail.get("name")),
        text(detail.get("id")),
        text(target.get("kind")),
        text(target.get("namespace")),
        text(target.get("name")),
        text(detail.get("state"))
    )?;
    let failing = detail.get("failing").filter(|f| !f.is_null());
    if let Some(failing) = failing {
        match failing_since(detail) {
            Some(since) => writeln!(out, "failing since {since}: {}", text(Some(failing)))?,
            None => writeln!(out, "cannot evaluate: {}", text(Some(failing)))?,
        }
    }
    let Some(last) = detail.get("last").filter(|l| !l.is_null()) else {
        return match failing {
            Some(_) => writeln!(
                out,
                "no decision yet: every evaluation so far has failed; the daemon tries again every {}s",
                text(detail.get("interval_seconds"))
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
        text(last.get("replicas")),
        text(last.get("ready_replicas")),
        text(last.get("min_replicas")),
        text(last.get("max_replicas")),
        text(last.get("at"))
    )?;
    writeln!(out, "\nwhy:")?;
    for sentence in last.get("explanation").and_then(Value::as_array).into_iter().flatten() {
        writeln!(out, "  {}", text(Some(sentence)))?;
    }
    for (key, label) in [("forecast", "forecast"), ("fallback_active", "fallback active")] {
        if let Some(value) = last.get(key).filter(|v| !v.is_null()) {
            writeln!(out, "  {label}: {}", text(Some(value)))?;
        }
    }
    if let Some(until) = detail.get("paused_until").filter(|v| !v.is_null()) {
        writeln!(out, "  paused until {}", text(Some(until)))?;
    }
    let events = detail.get("history").and_then(|h| h.get("events")).and_then(Value::as_array);
    let events: Vec<&Value> = events.into_iter().flatten().collect();
    if events.is_empty() {
        return writeln!(out, "\nscale events in the history: none");
    }
    writeln!(out, "\nscale events in the history, newest first:")?;
    for event in events.iter().rev().take(10) {
        writeln!(
            out,
            "  {} {} -> {}{}",
            instant(event.get("at")).unwrap_or_else(|| "-".into()),
            text(event.get("from")),
            text(event.get("to")),
            if event.get("written").and_then(Value::as_bool) == Some(false) { " (decided, not written)" } else { "" }
        )?;
    }
    Ok(())
}

/// Unix seconds, as RFC 3339.
fn instant(seconds: Option<&Value>) -> Option<String> {
    let seconds = seconds.and_then(Value::as_i64)?;
    watermarkd_engine::Timestamp::from_unix_seconds_f64(seconds as f64).map(|t| t.to_string())
}

/// When the evaluations began failing, as far as the history says: the first sample of the
/// run of failed ones it ends with. `None` when no sample says (it failed from the start).
fn failing_since(detail: &Value) -> Option<String> {
    let samples = detail.get("history")?.get("samples")?.as_array()?;
    let failed = |sample: &&Value| {
        sample.get("marks").and_then(Value::as_array).is_some_and(|marks| marks.iter().any(|m| m == "failed"))
    };
    let first = samples.iter().rev().take_while(failed).last()?;
    instant(first.get("at"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn detail_text(detail: &Value) -> String {
        let mut out = Vec::new();
        write_detail(detail, &mut out).expect("written");
        String::from_utf8(out).expect("UTF-8")
    }

    #[test]
    fn control_characters_are_shown_as_escapes() {
        assert_eq!(printable("cpu\u{1b}[2J\u{7}"), "cpu\\u{1b}[2J\\u{7}");
        assert_eq!(printable("plain ü"), "plain ü");
        assert_eq!(text(Some(&json!("a\nb"))), "a\\u{a}b");
    }

    /// It failed after deciding: the decision shown is the last one, and the failure says
    /// since when, from the run of failed samples the history ends with.
    #[test]
    fn a_failing_autoscaler_says_since_when() {
        let detail = json!({
            "name": "web", "id": "file/web", "state": "failing", "interval_seconds": 15,
            "target": { "kind": "Deployment", "namespace": "prod", "name": "web" },
            "failing": "Deployment prod/web does not exist",
            "last": { "replicas": 3, "ready_replicas": 3, "min_replicas": 1, "max_replicas": 6,
                      "at": "2026-11-27T09:00:00Z", "explanation": ["held at 3: every metric is inside its band"] },
            "history": { "samples": [
                { "at": 1_795_770_000, "marks": [] },
                { "at": 1_795_770_015, "marks": ["failed"] },
                { "at": 1_795_770_030, "marks": ["failed"] }
            ], "events": [] }
        });
        let said = detail_text(&detail);
        assert!(said.contains("\nfailing since 2026-11-27T09:00:15Z: Deployment prod/web does not exist\n"), "{said}");
        assert!(said.contains("the last decision, before it began failing:\nreplicas 3"), "{said}");
        assert!(!said.contains("not evaluated yet"), "{said}");
    }
}
