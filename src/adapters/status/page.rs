//! The status page, rendered on the server: the daemon's own health at the top, the table of
//! autoscalers (searchable, filtered by state, paged) and one autoscaler's explanation and
//! chart (drawn by `chart`, with the simulator's drawer). Everything is HTML and SVG from this
//! binary, readable without JavaScript; `app.js` only refreshes the parts in place and searches
//! as one types. Every text from an autoscaler is escaped. The style keeps it usable at a
//! phone's width: the table's rows become cards, the chart is drawn at a narrow width.

use std::fmt::Write;

use super::board::{Detail, Leadership, ListPage, ListQuery, MetricNow, RulesRejected, RulesView, State, Summary};
use super::chart;
use super::http::BackendView;
use crate::domain::status::explain::{number, span};

/// Rows per page of the table.
pub const PAGE_ROWS: usize = 100;

pub use crate::domain::markup::escape;

/// Text for a URL's query value or path segment.
pub fn url_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~/".contains(&byte) {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

fn document(title: &str, body: &str) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{}</title><link rel=\"stylesheet\" href=\"/ui/style.css\">\
         <script src=\"/ui/app.js\" defer></script></head>\n<body>{body}</body></html>\n",
        escape(title)
    )
}

/// How long ago `at` (unix seconds) was, from `now`.
fn ago(now: i64, at: i64) -> String {
    format!("{} ago", span((now - at).max(0) as f64))
}

/// The section at the top of every page: the daemon's health (see [`health`]), refreshed by
/// `app.js` from `/ui/health`.
fn health_section(health: &str) -> String {
    format!("<section id=\"health\" data-fragment=\"/ui/health\">{health}</section>")
}

/// The daemon's own health: whether it decides (leader or follower), whether the rules file
/// on disk runs or was refused (and why), and each backend's state and budget.
pub(super) fn health(daemon: &Leadership, rules: &RulesView, backends: &[BackendView], now: i64) -> String {
    let mut out = String::from("<ul class=\"health\">");
    let (class, text) = match (daemon.leader, following(daemon)) {
        (Some(true), _) => ("ok", "leader: this daemon decides".to_string()),
        (_, Some(note)) => ("warn following", note),
        (_, None) => {
            ("warn", "leadership not known yet: this daemon decides nothing until it holds the Lease".to_string())
        }
    };
    let _ = write!(out, "<li class=\"{class}\">{}</li>", escape(&text));
    match &rules.rejected {
        None => out.push_str("<li class=\"ok\">rules file loaded: what is on disk runs</li>"),
        Some(rejected) => {
            let _ = write!(out, "<li class=\"bad rejected\">{}</li>", rejected_rules(rejected, now));
        }
    }
    for backend in backends {
        out.push_str(&backend_health(backend));
    }
    out.push_str("</ul>");
    out
}

/// One backend: its state (the autoscalers reading from it, and how many have no usable value),
/// its requests since the start by outcome, and its rate budget.
fn backend_health(backend: &BackendView) -> String {
    let (readers, without) = (backend.autoscalers, backend.autoscalers_without_data);
    let (class, state) = match (readers, without) {
        (0, _) => ("muted", "no autoscaler reads from it".to_string()),
        (_, 0) => ("ok", format!("ok: {readers} autoscaler{} with data", plural(readers))),
        (_, w) if w == readers => ("bad", format!("no data for any of its {readers} autoscaler{}", plural(readers))),
        (_, w) => ("warn", format!("{w} of {readers} autoscalers without data")),
    };
    let requests: Vec<String> = backend.requests.iter().map(|(outcome, count)| format!("{count} {outcome}")).collect();
    let mut facts = vec![state];
    if !requests.is_empty() {
        facts.push(format!("requests since the start: {}", requests.join(", ")));
    }
    let seen = &backend.rate_limit;
    match (seen.remaining, seen.limit) {
        (Some(remaining), Some(limit)) => {
            facts.push(format!("budget {remaining} of {limit} requests left{}", limit_reset(seen.reset_seconds)))
        }
        _ => facts.push("no rate budget (it does not send one)".to_string()),
    }
    if let Some(seconds) = backend.stretched_interval_seconds.filter(|s| *s > 0) {
        facts.push(format!("cycles spaced to every {} by the budget", span(seconds as f64)));
    }
    format!("<li class=\"{class} backend\"><b>{}</b>: {}</li>", escape(&backend.name), escape(&facts.join(" · ")))
}

fn limit_reset(seconds: Option<u64>) -> String {
    seconds.map_or(String::new(), |s| format!(", renewed in {}", span(s as f64)))
}

fn plural(count: usize) -> &'static str {
    if count == 1 {
        ""
    } else {
        "s"
    }
}

/// The table page: the daemon's health, the filter form and the rows.
pub fn table_page(page: &ListPage, query: &ListQuery, now: i64, health: &str) -> String {
    let mut body = String::from("<header><h1><a href=\"/ui\">watermarkd</a></h1></header><main>");
    body.push_str(&health_section(health));
    let _ = write!(
        body,
        "<form id=\"filter\" method=\"get\" action=\"/ui\"><input type=\"search\" name=\"q\" value=\"{}\" \
         placeholder=\"search name, namespace, target\" aria-label=\"search\" autofocus>\
         <select name=\"state\" aria-label=\"state\"><option value=\"\">every state</option>",
        escape(&query.search)
    );
    for state in State::ALL {
        let selected = if query.state == Some(state) { " selected" } else { "" };
        let _ = write!(body, "<option value=\"{0}\"{selected}>{0}</option>", state.as_str());
    }
    body.push_str("</select><button type=\"submit\">filter</button></form>");
    let _ = write!(body, "<div id=\"rows\" data-fragment=\"{}\">", escape(&table_link("/ui/table", query, 0)));
    body.push_str(&table_rows(page, query, now));
    body.push_str("</div></main>");
    document("watermarkd", &body)
}

/// A refused rules file: what runs is not what is on disk.
fn rejected_rules(rejected: &RulesRejected, now: i64) -> String {
    let mut out = format!(
        "<p><b>The rules file on disk was refused</b> {}: {}</p>",
        ago(now, rejected.at.unix_millis().div_euclid(1000)),
        escape(&rejected.reason)
    );
    if !rejected.problems.is_empty() {
        out.push_str("<ul>");
        for problem in &rejected.problems {
            let _ = write!(out, "<li>{}</li>", escape(problem));
        }
        out.push_str("</ul>");
    }
    out
}

/// What a follower's page says first: its autoscalers are evaluated by the leader.
pub fn following(daemon: &Leadership) -> Option<String> {
    match (daemon.leader, &daemon.leader_identity) {
        (Some(false), Some(holder)) => Some(format!(
            "This daemon follows; {holder} leads and decides. Its autoscalers show here as pending: \
             port-forward to {holder} to see their decisions."
        )),
        (Some(false), None) => {
            Some("This daemon follows and decides nothing; port-forward to the one holding the Lease.".into())
        }
        _ => None,
    }
}

/// The link to the table with this search and filter, at `offset`.
fn table_link(path: &str, query: &ListQuery, offset: usize) -> String {
    let mut link = format!("{path}?q={}", url_escape(&query.search));
    if let Some(state) = query.state {
        let _ = write!(link, "&state={}", state.as_str());
    }
    if offset > 0 {
        let _ = write!(link, "&offset={offset}");
    }
    link
}

/// The rows, the count and the pager: what `app.js` swaps in place.
pub fn table_rows(page: &ListPage, query: &ListQuery, now: i64) -> String {
    // The counts by state, refreshed with the rows: each a link to its filter.
    let mut out = String::from("<nav class=\"states\">");
    for (state, count) in page.states.iter().filter(|(_, c)| *c > 0) {
        let _ = write!(out, "<a class=\"state {0}\" href=\"/ui?state={0}\">{0} <b>{count}</b></a>", state.as_str());
    }
    out.push_str("</nav>");
    let shown = page.autoscalers.len();
    // The offset is the reader's, up to usize::MAX: nothing here may wrap.
    let past_shown = page.offset.saturating_add(shown);
    let _ = write!(
        out,
        "<p class=\"matched\">{} of {} autoscalers{}</p>",
        page.matched,
        page.total,
        if shown == 0 && page.matched > 0 {
            format!(", none past the first {}", page.offset.min(page.matched))
        } else if shown < page.matched {
            format!(", {} to {past_shown} shown", page.offset.saturating_add(1))
        } else {
            String::new()
        }
    );
    out.push_str(
        "<table class=\"autoscalers\"><thead><tr><th>autoscaler</th><th>target</th><th>replicas</th>\
         <th>metric against its band</th><th>state</th><th>last scale</th><th>why</th></tr></thead><tbody>",
    );
    for row in &page.autoscalers {
        out.push_str(&table_row(row, now));
    }
    out.push_str("</tbody></table><nav class=\"pager\">");
    if page.offset > 0 {
        let previous = page.offset.min(page.matched).saturating_sub(query.limit);
        let _ = write!(out, "<a rel=\"prev\" href=\"{}\">previous</a>", escape(&table_link("/ui", query, previous)));
    }
    if past_shown < page.matched {
        let _ = write!(out, "<a rel=\"next\" href=\"{}\">next</a>", escape(&table_link("/ui", query, past_shown)));
    }
    out.push_str("</nav>");
    out
}

fn table_row(row: &Summary, now: i64) -> String {
    let id = &row.identity;
    let replicas = match (row.spec_replicas, row.ready_replicas, row.min_replicas, row.max_replicas) {
        (Some(spec), Some(ready), Some(min), Some(max)) => {
            format!("{spec} <small>{ready} ready, {min}..{max}</small>")
        }
        _ => match row.failing_since {
            Some(since) => format!("<small>failing since {}</small>", ago(now, since.unix_millis().div_euclid(1000))),
            None => "<small>not evaluated yet</small>".into(),
        },
    };
    let metric = row.metric.as_ref().map(metric_cell).unwrap_or_default();
    let last_scale = row
        .last_scale
        .as_ref()
        .map(|e| format!("{} → {} <small>{}</small>", e.from, e.to, ago(now, e.at)))
        .unwrap_or_else(|| "<small>none in the history</small>".into());
    let why = row.failing.as_deref().or(row.why.as_deref()).unwrap_or("");
    let flags = if id.dry_run { " <small class=\"flag\">dry run</small>" } else { "" };
    // The labels are the header's, for a phone's cards (style.css shows them there).
    format!(
        "<tr class=\"{state}\"><td class=\"name\"><a href=\"/ui/autoscaler/{link}\">{name}</a>{flags}<br><small>{namespace} · {source}</small></td>\
         <td data-label=\"target\">{kind} {tns}/{tname}</td><td data-label=\"replicas\">{replicas}</td>\
         <td data-label=\"metric\">{metric}</td><td data-label=\"state\"><span class=\"state {state}\">{state}</span></td>\
         <td data-label=\"last scale\">{last_scale}</td><td class=\"why\">{why}</td></tr>",
        state = row.state.as_str(),
        link = escape(&url_escape(&id.id)),
        name = escape(&id.name),
        namespace = escape(&id.namespace),
        source = id.source,
        kind = escape(&id.target.kind),
        tns = escape(&id.target.namespace),
        tname = escape(&id.target.name),
        why = escape(why),
    )
}

/// A metric's value against its band, as text and a small gauge.
fn metric_cell(m: &MetricNow) -> String {
    let band = format!("[{}, {}]", number(m.low_watermark), number(m.high_watermark));
    match m.usage {
        None => format!("{} <small>no value {band}</small>", escape(&m.name)),
        Some(usage) => format!("{} {} <small>{band}</small> {}", escape(&m.name), number(usage), gauge(m, usage)),
    }
}

/// An 80 x 10 SVG: the band, and where the value is.
fn gauge(m: &MetricNow, usage: f64) -> String {
    let top = (m.high_watermark * 1.5).max(usage * 1.1).max(f64::MIN_POSITIVE);
    let x = |v: f64| (v / top * 80.0).clamp(0.0, 80.0);
    format!(
        "<svg class=\"gauge\" width=\"80\" height=\"10\" viewBox=\"0 0 80 10\" role=\"img\" aria-label=\"{}\">\
         <rect class=\"band\" x=\"{:.1}\" y=\"2\" width=\"{:.1}\" height=\"6\"/><circle class=\"value {}\" cx=\"{:.1}\" cy=\"5\" r=\"3\"/></svg>",
        escape(&format!("{} against [{}, {}]", number(usage), number(m.low_watermark), number(m.high_watermark))),
        x(m.low_watermark),
        (x(m.high_watermark) - x(m.low_watermark)).max(1.0),
        serde_json::to_value(m.position).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default(),
        x(usage)
    )
}

/// One autoscaler's page, under the daemon's health.
pub fn detail_page(detail: &Detail, now: i64, health: &str) -> String {
    let id = &detail.summary.identity;
    let body = format!(
        "<header><h1><a href=\"/ui\">watermarkd</a> / {}</h1></header><main>{}<div id=\"detail\" data-fragment=\"/ui/autoscaler/{}?fragment=1\" data-every=\"{}\">{}</div></main>",
        escape(&id.name),
        health_section(health),
        escape(&url_escape(&id.id)),
        id.interval_seconds.max(1),
        detail_fragment(detail, now)
    );
    document(&format!("{} · watermarkd", id.name), &body)
}

/// What `app.js` refreshes in place on the autoscaler's page.
pub fn detail_fragment(detail: &Detail, now: i64) -> String {
    let summary = &detail.summary;
    let id = &summary.identity;
    let mut out = String::new();
    let _ = write!(
        out,
        "<section class=\"facts\"><p><span class=\"state {0}\">{0}</span> {1} {2}/{3} · {4} from the {5}{6}</p>",
        summary.state.as_str(),
        escape(&id.target.kind),
        escape(&id.target.namespace),
        escape(&id.target.name),
        escape(&id.namespace),
        if id.source == "crd" { "WatermarkPodAutoscaler" } else { "rules file" },
        if id.dry_run { " · dry run" } else { "" },
    );
    if let Some(failing) = &summary.failing {
        let _ = write!(out, "<p class=\"failing\">cannot evaluate: {}</p>", escape(failing));
    }
    match &detail.last {
        None => out.push_str("<p>not evaluated yet</p></section>"),
        Some(last) => {
            let _ = write!(
                out,
                "<p>{} replicas ({} ready), bounds {}..{}, evaluated {} · every {}</p>",
                last.replicas,
                last.ready_replicas,
                last.min_replicas,
                last.max_replicas,
                ago(now, last.at.unix_millis().div_euclid(1000)),
                span(id.interval_seconds as f64),
            );
            out.push_str("</section><section><h2>Why</h2><ol class=\"explanation\">");
            for sentence in last.explanation.iter() {
                let _ = write!(out, "<li>{}</li>", escape(sentence));
            }
            out.push_str("</ol>");
            let extras = [
                last.forecast.as_ref().map(|f| format!("forecast: {f}")),
                last.fallback_active.map(|a| format!("fallback: {}", if a { "active" } else { "ready, not active" })),
                id.paused_until.as_ref().map(|u| format!("paused until {u}")),
            ];
            for extra in extras.into_iter().flatten() {
                let _ = write!(out, "<p>{}</p>", escape(&extra));
            }
            for shadow in &last.shadows {
                let _ = write!(
                    out,
                    "<p>shadow {}: would run {}{}</p>",
                    escape(&shadow.name),
                    shadow.replicas,
                    if shadow.diverged { " (differs)" } else { "" }
                );
            }
            out.push_str("</section>");
        }
    }
    if let Some(observed) = &detail.observed {
        out.push_str("<section id=\"observed\"><h2>Beside the live controller</h2><ul>");
        for sentence in crate::domain::observed::describe(&observed.comparison, observed.live.as_ref()) {
            let _ = write!(out, "<li>{}</li>", escape(&sentence));
        }
        out.push_str("</ul></section>");
    }
    out.push_str("<section><h2>Recent evaluations</h2>");
    match chart::figure(detail, now) {
        Some(figure) => out.push_str(&figure),
        None => out.push_str("<p>no history yet</p>"),
    }
    out.push_str("</section><section><h2>Scale events</h2>");
    if detail.history.events.is_empty() {
        out.push_str("<p>none in the history</p>");
    } else {
        out.push_str("<ul class=\"events\">");
        for event in detail.history.events.iter().rev() {
            let _ = write!(
                out,
                "<li>{} → {} <small>{}{}</small></li>",
                event.from,
                event.to,
                ago(now, event.at),
                if event.written { "" } else { ", decided only (dry run or paused)" }
            );
        }
        out.push_str("</ul>");
    }
    out.push_str("</section>");
    out
}

/// The page of a refused request or an unknown autoscaler.
pub fn message_page(title: &str, text: &str) -> String {
    document(
        title,
        &format!("<header><h1><a href=\"/ui\">watermarkd</a></h1></header><main><p>{}</p></main>", escape(text)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::status::backends::RateLimitSeen;
    use watermarkd_engine::Timestamp;

    fn backend(name: &str, readers: usize, without: usize) -> BackendView {
        BackendView {
            name: name.into(),
            autoscalers: readers,
            autoscalers_without_data: without,
            ..BackendView::default()
        }
    }

    #[test]
    fn the_health_says_who_decides_whether_the_rules_run_and_each_backends_state_and_budget() {
        let leader = Leadership { leader: Some(true), leader_identity: None };
        let mut datadog = backend("datadog", 3, 1);
        datadog.requests = [("ok".to_string(), 120), ("timeout".to_string(), 2)].into_iter().collect();
        datadog.rate_limit = RateLimitSeen { limit: Some(300), remaining: Some(240), reset_seconds: Some(40) };
        datadog.stretched_interval_seconds = Some(60);
        let backends = [datadog, backend("prom", 2, 0), backend("<quiet>", 1, 1), backend("spare", 0, 0)];
        let page = health(&leader, &RulesView::default(), &backends, 0);
        for expected in [
            "<li class=\"ok\">leader: this daemon decides</li>",
            "<li class=\"ok\">rules file loaded: what is on disk runs</li>",
            "<li class=\"warn backend\"><b>datadog</b>: 1 of 3 autoscalers without data · requests since the start: 120 ok, \
             2 timeout · budget 240 of 300 requests left, renewed in 40s · cycles spaced to every 1m by the budget</li>",
            "<li class=\"ok backend\"><b>prom</b>: ok: 2 autoscalers with data · no rate budget (it does not send one)</li>",
            "<li class=\"bad backend\"><b>&lt;quiet&gt;</b>: no data for any of its 1 autoscaler",
            "<li class=\"muted backend\"><b>spare</b>: no autoscaler reads from it",
        ] {
            assert!(page.contains(expected), "{expected} in {page}");
        }

        let follower = Leadership { leader: Some(false), leader_identity: Some("watermarkd-0".into()) };
        let rejected = RulesView {
            rejected: Some(RulesRejected {
                at: Timestamp::from_unix_millis(0),
                reason: "1 problem(s) in rules.toml".into(),
                problems: vec!["line 3: autoscaler \"web\": max_replicas: <not a number>".into()],
            }),
        };
        let page = health(&follower, &rejected, &[], 90);
        assert!(page.contains("This daemon follows; watermarkd-0 leads and decides."), "{page}");
        assert!(
            page.contains("<li class=\"bad rejected\"><p><b>The rules file on disk was refused</b> 1m 30s ago"),
            "{page}"
        );
        assert!(page.contains("max_replicas: &lt;not a number&gt;"), "{page}");
        let unknown = health(&Leadership::default(), &RulesView::default(), &[], 0);
        assert!(unknown.contains("leadership not known yet"), "{unknown}");
    }
}
