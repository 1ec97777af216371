//! The SVG chart of a replay, written by hand: one panel per metric (usage against the
//! watermarks and the tolerance band), a replicas panel (proposed vs effective, min/max), and
//! shaded spans where scaling was restricted, all on one time axis. A backtest with `--against`
//! draws the other rule's watermarks and effective replicas, and the target's actual replicas,
//! on the same panels.
//!
//! The output is self-contained (no scripts, no external fonts or styles) so that it renders
//! the same in a browser, an image converter or a code review tool.

use std::fmt::Write as _;

use watermarkd_engine::{Algorithm, Rule, Timestamp};

use super::replay::{Cause, LoadModel, Replay, Restriction};
use super::report::{human_duration, Summary};

mod draw;

use draw::{
    escape, format_value, frame, grid, legend, legend_left, level_line, nice_ticks, short_time, side_labels, step_path,
    time_labels, time_ticks, title_width, Mark, TimeAxis, TimeTick, ValueAxis,
};

const WIDTH: f64 = 1280.0;
const MARGIN_LEFT: f64 = 76.0;
const MARGIN_RIGHT: f64 = 96.0;
/// Room for the other rule's watermark labels (`against high 0.75`) beside this rule's.
const AGAINST_MARGIN_RIGHT: f64 = 120.0;
const HEADER_HEIGHT: f64 = 118.0;
/// The header's figures take a row per rule.
const FIGURE_ROW_HEIGHT: f64 = 17.0;
/// Where a comparison's figures name their rule, left of the figures.
const RULE_NAME_WIDTH: f64 = 150.0;
const PANEL_TITLE_HEIGHT: f64 = 30.0;
const METRIC_PANEL_HEIGHT: f64 = 190.0;
const STRIP_HEIGHT: f64 = 14.0;
const REPLICAS_PANEL_HEIGHT: f64 = 230.0;
const PANEL_GAP: f64 = 18.0;
/// The least space between a panel's title and the legend on its line.
const TITLE_LEGEND_GAP: f64 = 16.0;
const AXIS_HEIGHT: f64 = 44.0;
const FONT: &str = "system-ui, -apple-system, 'Segoe UI', 'DejaVu Sans', Helvetica, Arial, sans-serif";

const INK: &str = "#1f2933";
const MUTED: &str = "#616e7c";
const GRID: &str = "#e4e7eb";
const USAGE_COLOR: &str = "#1c64b4";
const HIGH_COLOR: &str = "#c62828";
const LOW_COLOR: &str = "#2e7d32";
const BAND_COLOR: &str = "#8fbf8f";
const EFFECTIVE_COLOR: &str = "#1f2933";
const PROPOSAL_COLOR: &str = "#e07b00";
const READY_COLOR: &str = "#7b8794";
const BOUND_COLOR: &str = "#9aa5b1";
const MANUAL_COLOR: &str = "#6a1b9a";
const AGAINST_COLOR: &str = "#0f8b8d";
const ACTUAL_COLOR: &str = "#c2185b";
/// The other rule's watermarks: dotted, where this rule's are dashed.
const AGAINST_DASH: &str = "2 3";
const STRIP_BACKGROUND: &str = "#f5f7fa";
const FRAME_COLOR: &str = "#9aa5b1";
const DAY_GRID: &str = "#cbd2d9";
const AXIS_TEXT: &str = "#3e4c59";

/// Why scaling was restricted, as the chart colors it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SpanKind {
    UpscaleCapping,
    DownscaleCapping,
    Window,
    Delay,
    Bounds,
    NoData,
    Guard,
}

impl SpanKind {
    const ALL: [SpanKind; 7] = [
        SpanKind::UpscaleCapping,
        SpanKind::DownscaleCapping,
        SpanKind::Window,
        SpanKind::Delay,
        SpanKind::Bounds,
        SpanKind::NoData,
        SpanKind::Guard,
    ];

    fn of(restriction: Restriction) -> SpanKind {
        match restriction {
            Restriction::NoData => SpanKind::NoData,
            Restriction::UpscaleWindow | Restriction::DownscaleWindow => SpanKind::Window,
            Restriction::UpscaleDelay | Restriction::DownscaleDelay => SpanKind::Delay,
            Restriction::UpscaleCapping => SpanKind::UpscaleCapping,
            Restriction::DownscaleCapping => SpanKind::DownscaleCapping,
            Restriction::MinReplicas | Restriction::MaxReplicas => SpanKind::Bounds,
            Restriction::NotReady | Restriction::Guarded => SpanKind::Guard,
        }
    }

    fn color(self) -> &'static str {
        match self {
            SpanKind::UpscaleCapping => "#f28e2b",
            SpanKind::DownscaleCapping => "#4e79a7",
            SpanKind::Window => "#b07aa1",
            SpanKind::Delay => "#e9c46a",
            SpanKind::Bounds => "#9c755f",
            SpanKind::NoData => "#e15759",
            SpanKind::Guard => "#76b7b2",
        }
    }

    fn label(self) -> &'static str {
        match self {
            SpanKind::UpscaleCapping => "upscale capped",
            SpanKind::DownscaleCapping => "downscale capped",
            SpanKind::Window => "forbidden window",
            SpanKind::Delay => "watermark delay",
            SpanKind::Bounds => "min/max replicas",
            SpanKind::NoData => "no data",
            SpanKind::Guard => "not ready / guard",
        }
    }
}

/// A run of evaluations restricted for the same reason: `[from, to)`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Span {
    kind: SpanKind,
    from: Timestamp,
    to: Timestamp,
}

/// The rest of a `backtest --against` chart: the other rule's replay over the same history, and
/// what the target actually ran.
pub struct Against<'a> {
    /// How the legend and the header name the other rule (`--against FILE`).
    pub label: String,
    pub rule: &'a Rule,
    pub replay: &'a Replay,
    pub summary: &'a Summary,
    /// The target's actual replicas at each step, where the history had them.
    pub actual: &'a [(Timestamp, Option<u32>)],
}

impl Against<'_> {
    /// The other rule's watermarks (low, high) for the metric of this name, as its replay
    /// first evaluated them.
    fn watermarks(&self, metric: &str) -> Option<(f64, f64)> {
        let index = self.rule.metrics().iter().position(|m| m.name == metric)?;
        let first = self.replay.ticks.iter().find_map(|t| t.decision.metrics.get(index))?;
        Some((first.low_watermark, first.high_watermark))
    }

    /// The label shortened for the header's name column and the legend, keeping the end of a
    /// long path (the file name).
    fn short_label(&self) -> String {
        const MAX_CHARS: usize = 22;
        let count = self.label.chars().count();
        if count <= MAX_CHARS {
            return self.label.clone();
        }
        let tail: String = self.label.chars().skip(count - (MAX_CHARS - 1)).collect();
        format!("…{tail}")
    }
}

/// Renders the whole chart.
pub fn render_svg(rule: &Rule, replay: &Replay, summary: &Summary) -> String {
    render(rule, replay, summary, None)
}

/// Renders the chart of a backtest with `--against`: this rule's replay as `render_svg` draws
/// it, with the other rule's watermarks and effective replicas and the actual replicas beside.
pub fn render_comparison_svg(rule: &Rule, replay: &Replay, summary: &Summary, against: &Against<'_>) -> String {
    render(rule, replay, summary, Some(against))
}

fn render(rule: &Rule, replay: &Replay, summary: &Summary, against: Option<&Against<'_>>) -> String {
    let header_height = HEADER_HEIGHT + if against.is_some() { FIGURE_ROW_HEIGHT } else { 0.0 };
    let metric_count = rule.metrics().len();
    let margin_right = if against.is_some() { AGAINST_MARGIN_RIGHT } else { MARGIN_RIGHT };
    let plot_width = WIDTH - MARGIN_LEFT - margin_right;
    let span_ms = (replay.end.unix_millis() - replay.start.unix_millis()).max(1) as f64;
    let time = TimeAxis { start_ms: replay.start.unix_millis() as f64, span_ms, left: MARGIN_LEFT, width: plot_width };

    let metrics_height = metric_count as f64 * (PANEL_TITLE_HEIGHT + METRIC_PANEL_HEIGHT + PANEL_GAP);
    let replicas_top = header_height + metrics_height + PANEL_TITLE_HEIGHT + STRIP_HEIGHT + 6.0;
    let height = replicas_top + REPLICAS_PANEL_HEIGHT + AXIS_HEIGHT;
    let spans = restriction_spans(replay);

    let mut svg = String::with_capacity(256 * 1024);
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0}" viewBox="0 0 {WIDTH} {height:.0}" font-family="{FONT}" font-size="12" fill="{INK}">"#
    );
    svg.push('\n');
    let (command, desc) = match against {
        None => ("simulate", summary_line(summary)),
        Some(a) => {
            ("backtest", format!("this rule: {}. {}: {}", summary_line(summary), a.label, summary_line(a.summary)))
        }
    };
    let _ = writeln!(
        svg,
        "<title>watermarkd {command}: {}</title>\n<desc>{}</desc>",
        escape(&summary.autoscaler),
        escape(&desc)
    );
    svg.push_str(r#"<rect x="0" y="0" width="100%" height="100%" fill="white"/>"#);
    svg.push('\n');
    header(&mut svg, rule, summary, &spans, against);

    let ticks = time_ticks(replay.start, replay.end);
    let mut top = header_height;
    for index in 0..metric_count {
        let panel = ValueAxis { max: 0.0, top: top + PANEL_TITLE_HEIGHT, height: METRIC_PANEL_HEIGHT };
        metric_panel(&mut svg, rule, replay, index, panel, time, &ticks, &spans, against);
        top += PANEL_TITLE_HEIGHT + METRIC_PANEL_HEIGHT + PANEL_GAP;
    }
    let strip_top = top + PANEL_TITLE_HEIGHT;
    let replicas = ValueAxis { max: 0.0, top: replicas_top, height: REPLICAS_PANEL_HEIGHT };
    replicas_panel(&mut svg, rule, replay, top, strip_top, replicas, time, &ticks, &spans, against);
    time_labels(&mut svg, &ticks, time, replicas_top + REPLICAS_PANEL_HEIGHT);
    svg.push_str("</svg>\n");
    svg
}

fn summary_line(s: &Summary) -> String {
    format!(
        "{} evaluations every {}; {} scale events ({} up, {} down{}); {:.1} replica-hours (average {:.1}); \
         replicas start {}, peak {}, final {}; above high watermark {}, below low watermark {}",
        s.evaluations,
        human_duration(s.interval_seconds),
        s.scale_ups + s.scale_downs,
        s.scale_ups,
        s.scale_downs,
        if s.manual_changes > 0 { format!(", {} manual", s.manual_changes) } else { String::new() },
        s.replica_hours,
        s.average_replicas,
        s.initial_replicas,
        s.peak_replicas,
        s.final_replicas,
        human_duration(s.seconds_above_high_watermark),
        human_duration(s.seconds_below_low_watermark),
    )
}

fn header(svg: &mut String, rule: &Rule, s: &Summary, spans: &[Span], against: Option<&Against<'_>>) {
    let compared = against.map_or(String::new(), |a| format!(": this rule and {}", a.label));
    let _ = writeln!(
        svg,
        r#"<text x="{MARGIN_LEFT}" y="30" font-size="20" font-weight="600">Autoscaler “{}” replayed over {}{}</text>"#,
        escape(&s.autoscaler),
        human_duration(s.duration_seconds),
        escape(&compared)
    );
    let lag = if s.readiness_lag_seconds > 0.0 {
        format!(" · readiness lag {}", human_duration(s.readiness_lag_seconds))
    } else {
        String::new()
    };
    let _ = writeln!(
        svg,
        r#"<text x="{MARGIN_LEFT}" y="50" fill="{MUTED}">{} → {} (UTC) · evaluated every {}{lag} · {} algorithm · load model: {} · replicas {}–{}</text>"#,
        short_time(s.start),
        short_time(s.end),
        human_duration(s.interval_seconds),
        rule.algorithm(),
        escape(s.load_model.describe()),
        rule.min_replicas(),
        rule.max_replicas(),
    );

    // The numbers a reviewer asks for first, as labelled figures; a comparison names each
    // rule's row in the colour of its replicas line.
    let left = MARGIN_LEFT + if against.is_some() { RULE_NAME_WIDTH } else { 0.0 };
    let ours = figures(s);
    let column = (WIDTH - left - MARGIN_RIGHT) / ours.len() as f64;
    for (i, (label, value)) in ours.iter().enumerate() {
        let x = left + i as f64 * column;
        let _ = writeln!(
            svg,
            r#"<text x="{x:.1}" y="70" font-size="11" fill="{MUTED}">{}</text><text x="{x:.1}" y="87" font-size="14" font-weight="600">{}</text>"#,
            escape(label),
            escape(value)
        );
    }
    let mut y = 106.0;
    if let Some(a) = against {
        let second = 87.0 + FIGURE_ROW_HEIGHT;
        for (row_y, name, color) in
            [(87.0, "this rule".to_string(), EFFECTIVE_COLOR), (second, a.short_label(), AGAINST_COLOR)]
        {
            let _ = write!(
                svg,
                r#"<text x="{MARGIN_LEFT}" y="{row_y:.1}" font-size="13" font-weight="600" fill="{color}">{}</text>"#,
                escape(&name)
            );
        }
        for (i, (_, value)) in figures(a.summary).iter().enumerate() {
            let x = left + i as f64 * column;
            let _ = write!(
                svg,
                r#"<text x="{x:.1}" y="{second:.1}" font-size="14" font-weight="600" fill="{AGAINST_COLOR}">{}</text>"#,
                escape(value)
            );
        }
        svg.push('\n');
        y += FIGURE_ROW_HEIGHT;
    }

    // Legend: the restriction colors (all of them, so charts compare), then the guard colour
    // only when it occurs.
    let mut x = MARGIN_LEFT;
    let _ = write!(svg, r#"<text x="{x}" y="{:.1}" font-size="11" fill="{MUTED}">restricted:</text>"#, y + 4.0);
    x += 66.0;
    for kind in SpanKind::ALL {
        if kind == SpanKind::Guard && !spans.iter().any(|s| s.kind == kind) {
            continue;
        }
        let _ = write!(
            svg,
            r#"<rect x="{x:.1}" y="{:.1}" width="12" height="10" fill="{}" fill-opacity="0.55"/><text x="{:.1}" y="{:.1}" font-size="11">{}</text>"#,
            y - 5.0,
            kind.color(),
            x + 16.0,
            y + 4.0,
            kind.label()
        );
        x += 16.0 + 7.0 * kind.label().len() as f64 + 14.0;
    }
    svg.push('\n');
}

/// A replay's headline numbers, labelled.
fn figures(s: &Summary) -> [(&'static str, String); 6] {
    let manual = if s.manual_changes > 0 { format!(" +{} manual", s.manual_changes) } else { String::new() };
    [
        ("scale events", format!("{} ({}↑ {}↓{manual})", s.scale_ups + s.scale_downs, s.scale_ups, s.scale_downs)),
        ("replica-hours", format!("{:.1} (avg {:.1})", s.replica_hours, s.average_replicas)),
        ("replicas", format!("{} → peak {} → {}", s.initial_replicas, s.peak_replicas, s.final_replicas)),
        ("above high", percent_of(s.seconds_above_high_watermark, s.duration_seconds)),
        ("below low", percent_of(s.seconds_below_low_watermark, s.duration_seconds)),
        ("evaluations", s.evaluations.to_string()),
    ]
}

fn percent_of(part: f64, whole: f64) -> String {
    let percent = if whole > 0.0 { 100.0 * part / whole } else { 0.0 };
    format!("{} ({percent:.0}%)", human_duration(part))
}

/// Merges consecutive evaluations with the same restriction into spans.
fn restriction_spans(replay: &Replay) -> Vec<Span> {
    let mut spans: Vec<Span> = Vec::new();
    for (i, tick) in replay.ticks.iter().enumerate() {
        let Some(kind) = Restriction::dominant(&tick.decision).map(SpanKind::of) else { continue };
        let from = tick.at();
        let to = replay.ticks.get(i + 1).map_or(replay.end, |next| next.at());
        match spans.last_mut() {
            Some(last) if last.kind == kind && last.to == from => last.to = to,
            _ => spans.push(Span { kind, from, to }),
        }
    }
    spans
}

fn shade_spans(svg: &mut String, spans: &[Span], time: TimeAxis, top: f64, height: f64, opacity: f64) {
    for span in spans {
        let (x0, x1) = (time.x(span.from), time.x(span.to));
        // Keep one-evaluation spans visible on long traces.
        let width = (x1 - x0).max(1.0);
        let _ = write!(
            svg,
            r#"<rect x="{x0:.1}" y="{top:.1}" width="{width:.1}" height="{height:.1}" fill="{}" fill-opacity="{opacity}"/>"#,
            span.kind.color()
        );
    }
    svg.push('\n');
}

#[expect(clippy::too_many_arguments, reason = "the panel's geometry and data, from its one caller")]
fn metric_panel(
    svg: &mut String,
    rule: &Rule,
    replay: &Replay,
    index: usize,
    mut panel: ValueAxis,
    time: TimeAxis,
    ticks: &[TimeTick],
    spans: &[Span],
    against: Option<&Against<'_>>,
) {
    let Some(metric) = rule.metrics().get(index) else { return };
    let outcomes = || replay.ticks.iter().filter_map(|t| t.decision.metrics.get(index).map(|m| (t.at(), m)));
    let Some((_, first)) = outcomes().next() else { return };
    let (low, high, band_low, band_high) = (first.low_watermark, first.high_watermark, first.band_low, first.band_high);
    let peak_usage = outcomes().filter_map(|(_, m)| m.usage).fold(0.0, f64::max);
    let theirs = against.and_then(|a| a.watermarks(&metric.name));
    let highest = theirs.map_or(band_high, |(_, their_high)| band_high.max(their_high));
    let value_ticks = nice_ticks(peak_usage.max(highest * 1.15));
    panel.max = value_ticks.last().copied().unwrap_or(1.0);

    // The title ends where the legend on its line begins, shortened to fit: the full
    // explanation is its tooltip.
    let legend_entries = metric_legend_entries(rule, (band_low, band_high));
    let room = legend_left(time.left + time.width, &legend_entries) - MARGIN_LEFT - TITLE_LEGEND_GAP;
    let (full, shown) = metric_title(rule, replay, &metric.name, room);
    let _ = writeln!(
        svg,
        r#"<text x="{MARGIN_LEFT}" y="{:.1}" font-size="13" font-weight="600"><title>{}</title>{}</text>"#,
        panel.top - 9.0,
        escape(&full),
        escape(&shown)
    );
    grid(svg, panel, time, ticks, &value_ticks);
    shade_spans(svg, spans, time, panel.top, panel.height, 0.13);

    // The band where the metric holds: below band_low scales down, above band_high scales up.
    let (band_top, band_bottom) = (panel.y(band_high), panel.y(band_low));
    let _ = writeln!(
        svg,
        r#"<rect x="{MARGIN_LEFT}" y="{band_top:.1}" width="{:.1}" height="{:.1}" fill="{BAND_COLOR}" fill-opacity="0.22"/>"#,
        time.width,
        band_bottom - band_top
    );
    watermark_lines(svg, panel, time, (low, high), theirs);
    legend(svg, time.left + time.width, panel.top - 13.0, &legend_entries);
    let _ = writeln!(
        svg,
        r#"<path d="{}" fill="none" stroke="{USAGE_COLOR}" stroke-width="1.4" stroke-linejoin="round"/>"#,
        usage_path(outcomes().map(|(at, outcome)| (at, outcome.usage)), panel, time)
    );
    frame(svg, panel, time);
}

/// A metric panel's title: the metric, and what its value is per the algorithm and load model.
/// Returns the full title and the one that fits in `room` px: the full one, else a shorter
/// explanation, else the name alone, cut with an ellipsis if even that is too long.
fn metric_title(rule: &Rule, replay: &Replay, name: &str, room: f64) -> (String, String) {
    let (full, short) = match rule.algorithm() {
        Algorithm::Absolute if replay.options.load_model == LoadModel::PerReplica => (
            "per ready replica (per-replica load model: trace demand ÷ simulated ready replicas)",
            "per ready replica (demand ÷ ready)",
        ),
        Algorithm::Absolute => {
            ("(absolute: the value is the per-replica load, replayed as recorded)", "(absolute, as recorded)")
        }
        Algorithm::Average => {
            ("per ready replica (average: trace total ÷ ready replicas)", "per ready replica (total ÷ ready)")
        }
    };
    let full = format!("{name} {full}");
    let shown = [full.clone(), format!("{name} {short}"), name.to_string()]
        .into_iter()
        .find(|title| title_width(title) <= room)
        .unwrap_or_else(|| {
            let fits = (room / title_width("m")).floor().max(2.0) as usize;
            let cut: String = name.chars().take(fits - 1).collect();
            format!("{cut}…")
        });
    (full, shown)
}

/// The rule's watermarks (and the other rule's, dotted) across the panel, named in the right
/// margin.
fn watermark_lines(
    svg: &mut String,
    panel: ValueAxis,
    time: TimeAxis,
    (low, high): (f64, f64),
    theirs: Option<(f64, f64)>,
) {
    let mut levels = vec![(high, HIGH_COLOR, "7 4", "high"), (low, LOW_COLOR, "7 4", "low")];
    if let Some((their_low, their_high)) = theirs {
        levels.extend([
            (their_high, HIGH_COLOR, AGAINST_DASH, "against high"),
            (their_low, LOW_COLOR, AGAINST_DASH, "against low"),
        ]);
    }
    for (value, color, dash, _) in &levels {
        level_line(svg, time, panel.y(*value), color, 1.4, dash);
    }
    let mut labels: Vec<(f64, String, &str)> = levels
        .iter()
        .map(|(value, color, _, name)| (panel.y(*value), format!("{name} {}", format_value(*value)), *color))
        .collect();
    side_labels(svg, time.left + time.width, &mut labels);
}

/// A metric panel's legend, with the hold band's tolerance and bounds.
fn metric_legend_entries(rule: &Rule, (band_low, band_high): (f64, f64)) -> Vec<(Mark, String)> {
    let (up, down) = (rule.upscale_tolerance().to_f64() * 100.0, rule.downscale_tolerance().to_f64() * 100.0);
    let tolerance = if up == down {
        format!("±{}", format_value(up))
    } else {
        format!("+{}/−{}", format_value(up), format_value(down))
    };
    // The other rule's watermarks are named by their side labels: one more legend entry would
    // leave the panel's title no room.
    vec![
        (Mark::Line { color: USAGE_COLOR, width: 2.0, dash: "" }, "usage".to_string()),
        (Mark::Line { color: HIGH_COLOR, width: 1.4, dash: "7 4" }, "high watermark".to_string()),
        (Mark::Line { color: LOW_COLOR, width: 1.4, dash: "7 4" }, "low watermark".to_string()),
        (
            Mark::Box { color: BAND_COLOR, opacity: 0.35 },
            format!("hold band ({tolerance}%: {} – {})", format_value(band_low), format_value(band_high)),
        ),
    ]
}

/// The usage line's path, broken where the metric had no data.
fn usage_path(usage: impl Iterator<Item = (Timestamp, Option<f64>)>, panel: ValueAxis, time: TimeAxis) -> String {
    let mut path = String::new();
    let mut pen_down = false;
    for (at, usage) in usage {
        match usage {
            Some(usage) => {
                let _ = write!(path, "{}{:.1},{:.1}", if pen_down { " L" } else { " M" }, time.x(at), panel.y(usage));
                pen_down = true;
            }
            None => pen_down = false,
        }
    }
    path.trim_start().to_string()
}

#[expect(clippy::too_many_arguments, reason = "the panel's geometry and data, from its one caller")]
fn replicas_panel(
    svg: &mut String,
    rule: &Rule,
    replay: &Replay,
    title_top: f64,
    strip_top: f64,
    mut panel: ValueAxis,
    time: TimeAxis,
    ticks: &[TimeTick],
    spans: &[Span],
    against: Option<&Against<'_>>,
) {
    let (min, max) = (f64::from(rule.min_replicas()), f64::from(rule.max_replicas()));
    let peak_proposal = replay.ticks.iter().filter_map(|t| t.decision.proposal).max().unwrap_or(0);
    let actual_known = against.is_some_and(|a| a.actual.iter().any(|(_, r)| r.is_some()));
    let value_ticks = nice_ticks(replicas_shown_max(max, peak_proposal, replay, against));
    panel.max = value_ticks.last().copied().unwrap_or(1.0);

    let _ = writeln!(
        svg,
        r#"<text x="{MARGIN_LEFT}" y="{:.1}" font-size="13" font-weight="600">Replicas</text>"#,
        title_top + PANEL_TITLE_HEIGHT - 9.0 - STRIP_HEIGHT + 8.0
    );
    // The restriction strip: the same spans as the shading, at full strength, so that short
    // spans stay visible.
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" font-size="10" fill="{MUTED}" text-anchor="end">restricted</text>"#,
        MARGIN_LEFT - 6.0,
        strip_top + STRIP_HEIGHT - 3.0
    );
    let _ = writeln!(
        svg,
        r#"<rect x="{MARGIN_LEFT}" y="{strip_top:.1}" width="{:.1}" height="{STRIP_HEIGHT}" fill="{STRIP_BACKGROUND}" stroke="{GRID}"/>"#,
        time.width
    );
    shade_spans(svg, spans, time, strip_top, STRIP_HEIGHT, 0.85);

    grid(svg, panel, time, ticks, &value_ticks);
    shade_spans(svg, spans, time, panel.top, panel.height, 0.13);

    let right = time.left + time.width;
    for value in [max, min] {
        level_line(svg, time, panel.y(value), BOUND_COLOR, 1.2, "3 3");
    }
    side_labels(
        svg,
        right,
        &mut [(panel.y(max), format!("max {max}"), MUTED), (panel.y(min), format!("min {min}"), MUTED)],
    );

    let step_line = |svg: &mut String, points: &[(Timestamp, Option<u32>)], stroke: &str| {
        let _ = writeln!(svg, r#"<path d="{}" fill="none" {stroke}/>"#, step_path(points, replay.end, time, panel));
    };
    // Proposed replicas: what the metrics asked for before limits, windows and delays.
    let proposal_points: Vec<(Timestamp, Option<u32>)> =
        replay.ticks.iter().map(|t| (t.at(), t.decision.proposal)).collect();
    step_line(svg, &proposal_points, &format!(r#"stroke="{PROPOSAL_COLOR}" stroke-width="1.3" stroke-opacity="0.9""#));

    if replay.options.readiness_lag > std::time::Duration::ZERO {
        let ready_points: Vec<(Timestamp, Option<u32>)> =
            replay.ticks.iter().map(|t| (t.at(), Some(t.decision.ready_replicas))).collect();
        step_line(svg, &ready_points, &format!(r#"stroke="{READY_COLOR}" stroke-width="1.2" stroke-dasharray="4 2""#));
    }

    // Beneath this rule's line, so that where they agree this rule's stays in view: what the
    // target actually ran, then what the other rule would have run.
    let mut class = "";
    if let Some(a) = against {
        if actual_known {
            step_line(svg, a.actual, &format!(r#"class="replicas-actual" stroke="{ACTUAL_COLOR}" stroke-width="1.6""#));
        }
        let theirs = effective_points(a.replay);
        step_line(
            svg,
            &theirs,
            &format!(r#"class="replicas-against" stroke="{AGAINST_COLOR}" stroke-width="1.8" stroke-linejoin="round""#),
        );
        class = r#"class="replicas-rule" "#;
    }
    step_line(
        svg,
        &effective_points(replay),
        &format!(r#"{class}stroke="{EFFECTIVE_COLOR}" stroke-width="2.2" stroke-linejoin="round""#),
    );

    replicas_notes(svg, replay, panel, time, peak_proposal);
    frame(svg, panel, time);
    legend(
        svg,
        right,
        title_top + PANEL_TITLE_HEIGHT - 9.0 - STRIP_HEIGHT + 4.0,
        &replicas_legend(replay, against, actual_known),
    );
}

/// The top of the replicas axis: every replica count drawn fits, and a proposal far beyond
/// `max_replicas` (which would flatten the lines that matter) is cut off at 1.6x it.
fn replicas_shown_max(max: f64, peak_proposal: u32, replay: &Replay, against: Option<&Against<'_>>) -> f64 {
    let peak_others = against.map_or(0, |a| {
        let peak_actual = a.actual.iter().filter_map(|(_, r)| *r).max().unwrap_or(0);
        a.summary.peak_replicas.max(peak_actual)
    });
    let peak_spec =
        replay.changes.iter().map(|c| c.to).chain([replay.initial_replicas, peak_others]).max().unwrap_or(0);
    (f64::from(peak_proposal).min(max * 1.6)).max(f64::from(peak_spec)).max(max * 1.1)
}

/// The replicas panel's notes: where a person set the count, and that proposals were cut off.
fn replicas_notes(svg: &mut String, replay: &Replay, panel: ValueAxis, time: TimeAxis, peak_proposal: u32) {
    for change in replay.changes.iter().filter(|c| c.cause == Cause::Manual) {
        let x = time.x(change.at);
        let _ = writeln!(
            svg,
            r#"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="{MANUAL_COLOR}" stroke-width="1.2" stroke-dasharray="2 2"/><text x="{:.1}" y="{:.1}" font-size="11" fill="{MANUAL_COLOR}" paint-order="stroke" stroke="white" stroke-width="3">set by a person: {} → {}</text>"#,
            panel.top,
            panel.bottom(),
            x + 4.0,
            panel.top + 12.0,
            change.from,
            change.to
        );
    }
    if f64::from(peak_proposal) > panel.max {
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" font-size="11" fill="{PROPOSAL_COLOR}" paint-order="stroke" stroke="white" stroke-width="3">proposals reach {peak_proposal}: cut off at the top</text>"#,
            MARGIN_LEFT + 6.0,
            panel.top + 13.0
        );
    }
}

/// The replicas panel's legend: this rule's line (and, in a comparison, the other rule's and
/// what actually ran), the proposals, readiness when it lags, the bounds.
fn replicas_legend(replay: &Replay, against: Option<&Against<'_>>, actual_known: bool) -> Vec<(Mark, String)> {
    let mut entries = match against {
        None => vec![(Mark::Line { color: EFFECTIVE_COLOR, width: 2.2, dash: "" }, "effective (spec)".to_string())],
        Some(a) => {
            let mut named = vec![
                (Mark::Line { color: EFFECTIVE_COLOR, width: 2.2, dash: "" }, "this rule".to_string()),
                (Mark::Line { color: AGAINST_COLOR, width: 1.8, dash: "" }, a.short_label()),
            ];
            if actual_known {
                named.push((Mark::Line { color: ACTUAL_COLOR, width: 1.6, dash: "" }, "actual".to_string()));
            }
            named
        }
    };
    entries.push((Mark::Line { color: PROPOSAL_COLOR, width: 1.3, dash: "" }, "proposed by the metrics".to_string()));
    if replay.options.readiness_lag > std::time::Duration::ZERO {
        entries.push((Mark::Line { color: READY_COLOR, width: 1.2, dash: "4 2" }, "ready".to_string()));
    }
    entries.push((Mark::Line { color: BOUND_COLOR, width: 1.2, dash: "3 3" }, "min/max replicas".to_string()));
    entries
}

/// The spec the workload ran, from the exact change times.
fn effective_points(replay: &Replay) -> Vec<(Timestamp, Option<u32>)> {
    let mut points = vec![(replay.start, Some(replay.initial_replicas))];
    points.extend(replay.changes.iter().map(|c| (c.at, Some(c.to))));
    points
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `d` of the one path drawn with this class.
    fn path_of<'s>(svg: &'s str, class: &str) -> &'s str {
        let marker = format!("class=\"{class}\"");
        let line = svg.lines().find(|l| l.contains(&marker)).unwrap_or_else(|| panic!("no {class} in the chart"));
        let d = line.strip_prefix("<path d=\"").unwrap_or_else(|| panic!("{class} is not a path: {line}"));
        &d[..d.find('"').unwrap()]
    }

    #[test]
    fn a_comparison_draws_both_rules_and_the_actual_replicas() {
        use crate::commands::simulate::replay::tests::{options, rule, trace, T0};
        use crate::commands::simulate::simulate;
        use watermarkd_engine::Decimal;

        // 300 is above this rule's high watermark (100), not above the other's (400).
        let this = rule(|_| {});
        let other = rule(|spec| spec.metrics[0].high_watermark = Some(Decimal::from_int(400)));
        let rows = trace(&[
            (0, Some(80.0), Some(2)),
            (60, Some(300.0), None),
            (120, Some(300.0), None),
            (180, Some(80.0), None),
        ]);
        let ours = simulate("web", &this, &rows, options(60)).unwrap();
        let theirs = simulate("web", &other, &rows, options(60)).unwrap();
        assert!(ours.summary.scale_ups > 0 && theirs.summary.scale_ups == 0, "{:?} {:?}", ours.summary, theirs.summary);
        let at = |offset: i64| Timestamp::from_unix_millis((T0 + offset) * 1000);
        let actual = [(at(0), Some(2)), (at(60), Some(3)), (at(120), None), (at(180), Some(3))];
        let against = Against {
            label: "--against <old>.toml".to_string(),
            rule: &other,
            replay: &theirs.replay,
            summary: &theirs.summary,
            actual: &actual,
        };
        let svg = render_comparison_svg(&this, &ours.replay, &ours.summary, &against);

        let (rule_line, against_line, actual_line) =
            (path_of(&svg, "replicas-rule"), path_of(&svg, "replicas-against"), path_of(&svg, "replicas-actual"));
        assert!(rule_line.starts_with('M') && against_line.starts_with('M'), "{rule_line} / {against_line}");
        // This rule steps up; the other holds at 2 (one segment); the actual replicas lift the
        // pen where they are unknown.
        assert!(rule_line.matches(" L").count() > 1, "{rule_line}");
        assert_eq!(against_line.matches(" L").count(), 1, "{against_line}");
        assert_eq!(actual_line.matches('M').count(), 2, "{actual_line}");

        for text in
            [">this rule<", ">--against &lt;old&gt;.toml<", ">actual<", ">against high 400<", ">against low 50<"]
        {
            assert!(svg.contains(text), "no {text} in the chart");
        }
        assert!(!svg.contains("<old>"), "an unescaped label");
        assert!(svg.contains("<title>watermarkd backtest: web</title>"));

        // The single-rule chart is unchanged by all this.
        let single = render_svg(&this, &ours.replay, &ours.summary);
        assert!(!single.contains("against") && !single.contains("class=\"replicas-"), "{single}");
        assert!(single.contains(">effective (spec)<") && !svg.contains(">effective (spec)<"));
    }
}
