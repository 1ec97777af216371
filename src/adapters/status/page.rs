//! The status page, rendered on the server: the table of autoscalers (searchable, filtered by
//! state, paged) and one autoscaler's explanation and chart. Everything is HTML and SVG from
//! this binary, readable without JavaScript; `app.js` only refreshes the parts in place and
//! searches as one types. Every text from an autoscaler is escaped.

use std::fmt::Write;

use super::board::{
    Compared, Detail, HistoryView, Leadership, ListPage, ListQuery, MetricNow, RulesRejected, SampleView, ScaleEvent,
    State, Summary,
};
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

/// The table page: the filter form and the rows.
pub fn table_page(page: &ListPage, query: &ListQuery, now: i64) -> String {
    let mut body = String::from("<header><h1><a href=\"/ui\">watermarkd</a></h1></header><main>");
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
    if let Some(note) = following(&page.daemon) {
        let _ = write!(body, "<p class=\"following\">{}</p>", escape(&note));
    }
    if let Some(rejected) = &page.rules.rejected {
        body.push_str(&rejected_rules(rejected, now));
    }
    let _ = write!(body, "<div id=\"rows\" data-fragment=\"{}\">", escape(&table_link("/ui/table", query, 0)));
    body.push_str(&table_rows(page, query, now));
    body.push_str("</div></main>");
    document("watermarkd", &body)
}

/// The banner of a refused rules file: what runs is not what is on disk.
fn rejected_rules(rejected: &RulesRejected, now: i64) -> String {
    let mut out = format!(
        "<section class=\"rejected\"><p><b>The rules file on disk was refused</b> {}: {}</p>",
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
    out.push_str("</section>");
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
    format!(
        "<tr class=\"{state}\"><td><a href=\"/ui/autoscaler/{link}\">{name}</a>{flags}<br><small>{namespace} · {source}</small></td>\
         <td>{kind} {tns}/{tname}</td><td>{replicas}</td><td>{metric}</td><td><span class=\"state {state}\">{state}</span></td>\
         <td>{last_scale}</td><td class=\"why\">{why}</td></tr>",
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

/// One autoscaler's page.
pub fn detail_page(detail: &Detail, now: i64) -> String {
    let id = &detail.summary.identity;
    let body = format!(
        "<header><h1><a href=\"/ui\">watermarkd</a> / {}</h1></header><main><div id=\"detail\" data-fragment=\"/ui/autoscaler/{}?fragment=1\" data-every=\"{}\">{}</div></main>",
        escape(&id.name),
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
    let metrics = &detail.history.metrics;
    out.push_str("<section><h2>Recent evaluations</h2>");
    if detail.history.samples.is_empty() {
        out.push_str("<p>no history yet</p>");
    }
    for (index, name) in metrics.iter().enumerate() {
        out.push_str(&metric_chart(name, index, &detail.history, &detail.history.events));
    }
    out.push_str(&replicas_chart(&detail.history.samples, &detail.history.events));
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

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 160.0;
const MARGIN: f64 = 40.0;

/// Maps the samples' times and a value range onto the chart.
struct Frame {
    first: i64,
    last: i64,
    low: f64,
    high: f64,
}

impl Frame {
    fn x(&self, at: i64) -> f64 {
        let width = (self.last - self.first).max(1) as f64;
        MARGIN + (at - self.first) as f64 / width * (WIDTH - MARGIN - 8.0)
    }

    fn y(&self, value: f64) -> f64 {
        let range = (self.high - self.low).max(f64::MIN_POSITIVE);
        8.0 + (1.0 - (value - self.low) / range) * (HEIGHT - 24.0)
    }

    /// The frame's axis labels and the scale events' marks.
    fn axes(&self, events: &[ScaleEvent]) -> String {
        let mut out = String::new();
        let _ = write!(
            out,
            "<text class=\"axis\" x=\"2\" y=\"{:.1}\">{}</text><text class=\"axis\" x=\"2\" y=\"{:.1}\">{}</text>",
            self.y(self.high) + 4.0,
            number(self.high),
            self.y(self.low),
            number(self.low)
        );
        // The time axis: the oldest sample, counted back from the newest.
        let _ = write!(
            out,
            "<text class=\"axis\" x=\"{MARGIN}\" y=\"{:.1}\">{} earlier</text><text class=\"axis end\" x=\"{:.1}\" y=\"{:.1}\">latest</text>",
            HEIGHT - 2.0,
            span((self.last - self.first) as f64),
            WIDTH - 8.0,
            HEIGHT - 2.0
        );
        for event in events.iter().filter(|e| e.at >= self.first && e.at <= self.last) {
            let x = self.x(event.at);
            let _ = write!(
                out,
                "<line class=\"event\" x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"4\" y2=\"{:.1}\"><title>{} → {}</title></line>",
                HEIGHT - 14.0,
                event.from,
                event.to
            );
        }
        out
    }
}

/// A polyline's points; a missing value breaks the line into the next path. `steps`: the
/// value holds until the next sample (replicas), instead of a straight line to it.
fn paths(frame: &Frame, points: impl Iterator<Item = (i64, Option<f64>)>, class: &str, steps: bool) -> String {
    let mut out = String::new();
    let mut current = String::new();
    let mut previous: Option<f64> = None;
    for (at, value) in points {
        match value.filter(|v| v.is_finite()) {
            Some(v) => {
                if let (true, Some(before)) = (steps && !current.is_empty(), previous) {
                    let _ = write!(current, "{:.1},{:.1} ", frame.x(at), frame.y(before));
                }
                let _ = write!(current, "{:.1},{:.1} ", frame.x(at), frame.y(v));
                previous = Some(v);
            }
            None if !current.is_empty() => {
                let _ = write!(out, "<polyline class=\"{class}\" points=\"{}\"/>", current.trim_end());
                current.clear();
                previous = None;
            }
            None => {}
        }
    }
    if !current.is_empty() {
        let _ = write!(out, "<polyline class=\"{class}\" points=\"{}\"/>", current.trim_end());
    }
    out
}

fn svg(label: &str, content: &str) -> String {
    format!(
        "<figure><svg class=\"chart\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" role=\"img\" aria-label=\"{}\">{content}</svg><figcaption>{}</figcaption></figure>",
        escape(label),
        escape(label)
    )
}

/// One metric's values against its watermarks: the quantity compared with them, per replica
/// for an `average` rule.
fn metric_chart(name: &str, index: usize, history: &HistoryView, events: &[ScaleEvent]) -> String {
    let samples = &history.samples;
    let (Some(first), Some(last)) = (samples.first(), samples.last()) else { return String::new() };
    let value = |s: &SampleView| s.values.get(index).copied().flatten().map(f64::from);
    let band = |s: &SampleView| s.watermarks.get(index).map(|[l, h]| (f64::from(*l), f64::from(*h)));
    let numbers =
        samples.iter().flat_map(|s| value(s).into_iter().chain(band(s).into_iter().flat_map(|(l, h)| [l, h])));
    let (low, high) = numbers.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if !low.is_finite() || !high.is_finite() {
        return String::new();
    }
    let pad = ((high - low) * 0.1).max(high.abs() * 0.05).max(1e-9);
    let floor = if low >= 0.0 { (low - pad).max(0.0) } else { low - pad };
    let frame = Frame { first: first.at, last: last.at, low: floor, high: high + pad };
    let mut content = frame.axes(events);
    content.push_str(&paths(&frame, samples.iter().map(|s| (s.at, band(s).map(|b| b.1))), "high", false));
    content.push_str(&paths(&frame, samples.iter().map(|s| (s.at, band(s).map(|b| b.0))), "low", false));
    content.push_str(&paths(&frame, samples.iter().map(|s| (s.at, value(s))), "value", false));
    let label = match history.compared {
        Compared::Value => format!("{name} against its low and high watermarks"),
        Compared::PerReplica => format!("{name} per ready replica against its low and high watermarks"),
    };
    svg(&label, &content)
}

/// The proposed and decided replicas.
fn replicas_chart(samples: &[SampleView], events: &[ScaleEvent]) -> String {
    let (Some(first), Some(last)) = (samples.first(), samples.last()) else { return String::new() };
    let high = samples.iter().flat_map(|s| [Some(s.replicas), s.proposed]).flatten().max().unwrap_or(1);
    let frame = Frame { first: first.at, last: last.at, low: 0.0, high: f64::from(high) * 1.15 + 1.0 };
    let mut content = frame.axes(events);
    content.push_str(&paths(&frame, samples.iter().map(|s| (s.at, s.proposed.map(f64::from))), "proposed", true));
    content.push_str(&paths(&frame, samples.iter().map(|s| (s.at, Some(f64::from(s.replicas)))), "replicas", true));
    svg("replicas decided (solid) and proposed by the metrics (dashed)", &content)
}

/// The page of a refused request or an unknown autoscaler.
pub fn message_page(title: &str, text: &str) -> String {
    document(
        title,
        &format!("<header><h1><a href=\"/ui\">watermarkd</a></h1></header><main><p>{}</p></main>", escape(text)),
    )
}
