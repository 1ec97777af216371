//! The chart of an autoscaler over time, as SVG written by hand: one panel per metric (the
//! quantity compared with the watermarks, against the watermarks and the hold band), a replicas
//! panel (decided vs proposed, min/max, scale events), and shaded spans where scaling was held
//! back or bent, all on one time axis with wall-clock ticks. `watermarkd simulate` and
//! `backtest` draw a replay with it (a report, with a header of figures); the status page draws
//! an autoscaler's recent history with it (a figure, at the page's width).
//!
//! Pure: a [`Chart`] in, SVG text out. The output is self-contained (no scripts, no external
//! fonts or styles) so that it renders the same in a browser, an image converter or a code
//! review tool. Every text is escaped.

use std::fmt::Write as _;

use watermarkd_engine::Timestamp;

mod draw;
mod panels;
mod shade;

pub use draw::{format_value, short_time};
pub use shade::{spans, Span, SpanKind};

use draw::{escape, legend_from, legend_rows, time_labels, time_ticks, Mark};
use panels::{header, metric_legend, metric_panel, replicas_legend, replicas_panel, Geometry, LegendPlace};

/// An autoscaler over a stretch of time, as the chart draws it.
#[derive(Clone, Debug, PartialEq)]
pub struct Chart {
    pub layout: Layout,
    /// The SVG's `<title>` and `<desc>`.
    pub title: String,
    pub description: String,
    /// A report's header (what was replayed, and its figures); a figure has none.
    pub header: Option<Header>,
    pub start: Timestamp,
    pub end: Timestamp,
    /// One per metric of the rule, in its order; one without watermarks is left blank.
    pub metrics: Vec<MetricPanel>,
    pub replicas: ReplicasPanel,
    /// Where scaling was restricted, in time order.
    pub spans: Vec<Span>,
}

/// A report's header: a headline, a line of context, the labelled figures, and in a comparison
/// the other rule's figures under them.
#[derive(Clone, Debug, PartialEq)]
pub struct Header {
    pub headline: String,
    pub context: String,
    /// (label, value), in columns.
    pub figures: Vec<(String, String)>,
    /// The other rule's name (short) and its values in the same columns.
    pub compared: Option<(String, Vec<String>)>,
}

/// One metric's panel.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricPanel {
    /// The panel's title, fullest first: the first that fits is drawn (the last, cut, if none
    /// does), and the first is its tooltip.
    pub titles: Vec<String>,
    /// What the line is, in the legend (`usage`, `value per ready replica`).
    pub value_label: String,
    /// The quantity compared with the watermarks at each evaluation; `None` where there was no
    /// usable value (the line breaks, nothing is drawn as 0).
    pub values: Vec<(Timestamp, Option<f64>)>,
    /// The watermarks, from each change on, in time order: one for a rule that kept them.
    pub watermarks: Vec<Watermarks>,
    /// The tolerance above the high and below the low watermark, as fractions (`0.1`).
    pub tolerance: Option<(f64, f64)>,
    /// Another rule's (low, high), drawn dotted beside these.
    pub theirs: Option<(f64, f64)>,
}

/// The watermarks in force from `from` on, and the band they hold in after tolerance.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Watermarks {
    pub from: Timestamp,
    pub low: f64,
    pub high: f64,
    pub band_low: f64,
    pub band_high: f64,
}

/// The replicas panel.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplicasPanel {
    pub min: u32,
    pub max: u32,
    /// Drawn in the order of their kinds (see [`LineKind`]), whatever their order here.
    pub lines: Vec<ReplicaLine>,
    pub events: Vec<EventMark>,
}

/// A step line of replica counts: each holds until the next point; `None` lifts the pen.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplicaLine {
    pub kind: LineKind,
    /// Its legend entry.
    pub label: String,
    pub points: Vec<(Timestamp, Option<u32>)>,
}

/// What a replicas line is; the order is the drawing order (the last on top).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LineKind {
    /// What the metrics asked for, before limits, windows and delays.
    Proposed,
    /// The replicas ready.
    Ready,
    /// What the target actually ran (a backtest's history).
    Actual,
    /// What another rule would have run.
    Against,
    /// What this rule decided: the spec.
    Effective,
}

/// A change of the replicas marked on the replicas panel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EventMark {
    pub at: Timestamp,
    pub from: u32,
    pub to: u32,
    pub kind: EventKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A person set the count (a trace's `replicas` column): a line and a note.
    Manual,
    /// The autoscaler scaled (a page's history): a line with its tooltip. `written: false`
    /// only decided (a dry run, a pause).
    Scaled { written: bool },
}

/// How the chart is laid out: a report (the simulator's and backtest's file) or a figure at a
/// page's width.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Layout {
    pub(crate) width: f64,
    pub(crate) margin_left: f64,
    pub(crate) margin_right: f64,
    pub(crate) metric_height: f64,
    pub(crate) replicas_height: f64,
    pub(crate) strip_height: f64,
    pub(crate) gap: f64,
    pub(crate) max_time_ticks: i64,
    /// A figure: legends on rows of their own, classes and tooltips for the page, the latest
    /// value named.
    pub(crate) figure: bool,
}

/// A report's sizes.
const REPORT_WIDTH: f64 = 1280.0;
const REPORT_MARGIN_LEFT: f64 = 76.0;
const REPORT_MARGIN_RIGHT: f64 = 96.0;
/// Room for the other rule's watermark labels (`against high 0.75`) beside this rule's.
const AGAINST_MARGIN_RIGHT: f64 = 120.0;
const HEADER_HEIGHT: f64 = 118.0;
/// The header's figures take a row per rule.
const FIGURE_ROW_HEIGHT: f64 = 17.0;
const PANEL_TITLE_HEIGHT: f64 = 30.0;
const AXIS_HEIGHT: f64 = 44.0;
/// A figure's rows of legend, and its title line.
const LEGEND_ROW_HEIGHT: f64 = 16.0;
const FIGURE_TITLE_HEIGHT: f64 = 22.0;
const FONT: &str = "system-ui, -apple-system, 'Segoe UI', 'DejaVu Sans', Helvetica, Arial, sans-serif";

impl Layout {
    /// The simulator's and backtest's chart: 1280 wide, with room on the right for the other
    /// rule's watermark labels in a comparison.
    pub fn report(comparison: bool) -> Layout {
        Layout {
            width: REPORT_WIDTH,
            margin_left: REPORT_MARGIN_LEFT,
            margin_right: if comparison { AGAINST_MARGIN_RIGHT } else { REPORT_MARGIN_RIGHT },
            metric_height: 190.0,
            replicas_height: 230.0,
            strip_height: 14.0,
            gap: 18.0,
            max_time_ticks: 16,
            figure: false,
        }
    }

    /// A page's figure, `width` px wide (at least 320): narrower margins and panels, and as
    /// many time ticks as fit.
    pub fn figure(width: f64) -> Layout {
        let width = if width.is_finite() { width.max(320.0) } else { 320.0 };
        let narrow = width < 560.0;
        let (margin_left, margin_right) = if narrow { (40.0, 66.0) } else { (52.0, 84.0) };
        let plot = width - margin_left - margin_right;
        Layout {
            width,
            margin_left,
            margin_right,
            metric_height: if narrow { 120.0 } else { 150.0 },
            replicas_height: if narrow { 110.0 } else { 140.0 },
            strip_height: 10.0,
            gap: 14.0,
            // A clock label needs about 70 px.
            max_time_ticks: ((plot / 70.0).floor() as i64).clamp(3, 16),
            figure: true,
        }
    }

    fn plot_width(&self) -> f64 {
        self.width - self.margin_left - self.margin_right
    }

    /// ` class="…"` on a figure, nothing on a report (whose bytes stay as they were).
    fn class(&self, class: &str) -> String {
        if self.figure {
            format!(r#" class="{class}""#)
        } else {
            String::new()
        }
    }
}

/// The chart as SVG.
pub fn render(chart: &Chart) -> String {
    if chart.layout.figure {
        render_figure(chart)
    } else {
        render_report(chart)
    }
}

/// The SVG's opening, its title and description, and its white background.
fn open(svg: &mut String, chart: &Chart, height: f64) {
    let width = chart.layout.width;
    let class = chart.layout.class("chart");
    let _ = write!(
        svg,
        r#"<svg{class} xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height:.0}" viewBox="0 0 {width} {height:.0}" font-family="{FONT}" font-size="12" fill="{}">"#,
        palette::INK
    );
    if chart.layout.figure {
        // The page sizes it; its aspect is kept.
        svg.truncate(svg.len() - 1);
        svg.push_str(r#" role="img" preserveAspectRatio="xMinYMin meet">"#);
    }
    svg.push('\n');
    let _ = writeln!(svg, "<title>{}</title>\n<desc>{}</desc>", escape(&chart.title), escape(&chart.description));
    svg.push_str(r#"<rect x="0" y="0" width="100%" height="100%" fill="white"/>"#);
    svg.push('\n');
}

fn time_axis(chart: &Chart) -> draw::TimeAxis {
    let layout = &chart.layout;
    let span_ms = (chart.end.unix_millis() - chart.start.unix_millis()).max(1) as f64;
    draw::TimeAxis {
        start_ms: chart.start.unix_millis() as f64,
        span_ms,
        left: layout.margin_left,
        width: layout.plot_width(),
    }
}

/// A report: the header, the metric panels, the restriction strip and the replicas panel, at
/// the sizes the simulator has always drawn.
fn render_report(chart: &Chart) -> String {
    let layout = chart.layout;
    let comparison = chart.header.as_ref().is_some_and(|h| h.compared.is_some());
    let header_height = HEADER_HEIGHT + if comparison { FIGURE_ROW_HEIGHT } else { 0.0 };
    let time = time_axis(chart);
    let metrics_height = chart.metrics.len() as f64 * (PANEL_TITLE_HEIGHT + layout.metric_height + layout.gap);
    let replicas_top = header_height + metrics_height + PANEL_TITLE_HEIGHT + layout.strip_height + 6.0;
    let height = replicas_top + layout.replicas_height + AXIS_HEIGHT;

    let mut svg = String::with_capacity(256 * 1024);
    open(&mut svg, chart, height);
    if let Some(head) = &chart.header {
        header(&mut svg, &layout, head, &chart.spans);
    }
    let ticks = time_ticks(chart.start, chart.end, layout.max_time_ticks, layout.figure);
    let mut top = header_height;
    for metric in &chart.metrics {
        let axis = draw::ValueAxis { max: 0.0, top: top + PANEL_TITLE_HEIGHT, height: layout.metric_height };
        let geometry = Geometry { title_y: axis.top - 9.0, legend: LegendPlace::Beside(axis.top - 13.0), axis };
        metric_panel(&mut svg, chart, metric, geometry, time, &ticks);
        top += PANEL_TITLE_HEIGHT + layout.metric_height + layout.gap;
    }
    let strip_top = top + PANEL_TITLE_HEIGHT;
    let axis = draw::ValueAxis { max: 0.0, top: replicas_top, height: layout.replicas_height };
    let title_line = top + PANEL_TITLE_HEIGHT - 9.0 - layout.strip_height;
    let geometry = Geometry { title_y: title_line + 8.0, legend: LegendPlace::Beside(title_line + 4.0), axis };
    replicas_panel(&mut svg, chart, geometry, strip_top, time, &ticks);
    time_labels(&mut svg, &ticks, time, replicas_top + layout.replicas_height, "");
    svg.push_str("</svg>\n");
    svg
}

/// A figure: each panel's title on its own line, its legend on rows under it, the restriction
/// strip's legend (the kinds that occur) over the strip; no header.
fn render_figure(chart: &Chart) -> String {
    let layout = chart.layout;
    let time = time_axis(chart);
    let rows = |entries: &[(Mark, String)]| legend_rows(entries, layout.plot_width());
    let metric_rows: Vec<Vec<Vec<(Mark, String)>>> = chart.metrics.iter().map(|m| rows(&metric_legend(m))).collect();
    let replicas_rows = rows(&replicas_legend(chart));
    let kinds = shade_kinds(&chart.spans);
    let shade_rows = if kinds.is_empty() { Vec::new() } else { rows(&shade_legend(&kinds)) };
    let rows_height = |rows: &[Vec<(Mark, String)>]| rows.len() as f64 * LEGEND_ROW_HEIGHT;

    // First the geometry, top to bottom, then the drawing.
    let mut top = 4.0;
    let mut metric_geometry = Vec::with_capacity(chart.metrics.len());
    for legend in &metric_rows {
        let axis_top = top + FIGURE_TITLE_HEIGHT + rows_height(legend) + 4.0;
        let axis = draw::ValueAxis { max: 0.0, top: axis_top, height: layout.metric_height };
        let title_y = top + 15.0;
        metric_geometry.push(Geometry { title_y, legend: LegendPlace::Rows(title_y + LEGEND_ROW_HEIGHT), axis });
        top = axis_top + layout.metric_height + layout.gap;
    }
    let replicas_title = top + 15.0;
    let shade_top = replicas_title + LEGEND_ROW_HEIGHT * (replicas_rows.len() as f64 + 1.0);
    let strip_top = top + FIGURE_TITLE_HEIGHT + rows_height(&replicas_rows) + rows_height(&shade_rows) + 4.0;
    let axis = draw::ValueAxis { max: 0.0, top: strip_top + layout.strip_height + 6.0, height: layout.replicas_height };
    let replicas_geometry =
        Geometry { title_y: replicas_title, legend: LegendPlace::Rows(replicas_title + LEGEND_ROW_HEIGHT), axis };
    let height = axis.bottom() + AXIS_HEIGHT - 4.0;

    let mut svg = String::with_capacity(64 * 1024);
    open(&mut svg, chart, height);
    let ticks = time_ticks(chart.start, chart.end, layout.max_time_ticks, layout.figure);
    for (metric, geometry) in chart.metrics.iter().zip(metric_geometry) {
        metric_panel(&mut svg, chart, metric, geometry, time, &ticks);
    }
    replicas_panel(&mut svg, chart, replicas_geometry, strip_top, time, &ticks);
    for (i, row) in shade_rows.iter().enumerate() {
        legend_from(&mut svg, layout.margin_left, shade_top + i as f64 * LEGEND_ROW_HEIGHT, row);
    }
    time_labels(&mut svg, &ticks, time, axis.bottom(), &layout.class("time-axis"));
    svg.push_str("</svg>\n");
    svg
}

/// The kinds of the spans, each once, in the legend's order.
fn shade_kinds(spans: &[Span]) -> Vec<SpanKind> {
    let mut kinds: Vec<SpanKind> = spans.iter().map(|s| s.kind).collect();
    kinds.sort();
    kinds.dedup();
    kinds
}

/// A figure's legend of the restriction strip: the kinds that occur.
fn shade_legend(kinds: &[SpanKind]) -> Vec<(Mark, String)> {
    let mut entries = vec![(Mark::Text, "restricted:".to_string())];
    entries.extend(kinds.iter().map(|k| (Mark::Box { color: k.color(), opacity: 0.55 }, k.label().to_string())));
    entries
}

/// The colours, one place.
mod palette {
    pub(crate) const INK: &str = "#1f2933";
    pub(crate) const MUTED: &str = "#616e7c";
    pub(crate) const GRID: &str = "#e4e7eb";
    pub(crate) const USAGE_COLOR: &str = "#1c64b4";
    pub(crate) const HIGH_COLOR: &str = "#c62828";
    pub(crate) const LOW_COLOR: &str = "#2e7d32";
    pub(crate) const BAND_COLOR: &str = "#8fbf8f";
    pub(crate) const EFFECTIVE_COLOR: &str = "#1f2933";
    pub(crate) const PROPOSAL_COLOR: &str = "#e07b00";
    pub(crate) const READY_COLOR: &str = "#7b8794";
    pub(crate) const BOUND_COLOR: &str = "#9aa5b1";
    pub(crate) const MANUAL_COLOR: &str = "#6a1b9a";
    pub(crate) const EVENT_COLOR: &str = "#3e4c59";
    pub(crate) const AGAINST_COLOR: &str = "#0f8b8d";
    pub(crate) const ACTUAL_COLOR: &str = "#c2185b";
    /// The other rule's watermarks: dotted, where this rule's are dashed.
    pub(crate) const AGAINST_DASH: &str = "2 3";
    pub(crate) const STRIP_BACKGROUND: &str = "#f5f7fa";
    pub(crate) const FRAME_COLOR: &str = "#9aa5b1";
    pub(crate) const DAY_GRID: &str = "#cbd2d9";
    pub(crate) const AXIS_TEXT: &str = "#3e4c59";
}
