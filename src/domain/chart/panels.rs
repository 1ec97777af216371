//! The chart's parts: a report's header, a metric panel, the replicas panel with its
//! restriction strip, and their legends. Where they go is the layout's (`super`); how they
//! look is here.

use std::fmt::Write as _;

use super::draw::{
    escape, format_value, frame, grid, legend, legend_from, legend_left, level_line, nice_ticks, side_labels,
    step_path, title_width, Mark, Stroke, TimeAxis, TimeTick, ValueAxis,
};
use super::palette::{
    ACTUAL_COLOR, AGAINST_COLOR, AGAINST_DASH, BAND_COLOR, BOUND_COLOR, EFFECTIVE_COLOR, EVENT_COLOR, GRID, HIGH_COLOR,
    LOW_COLOR, MANUAL_COLOR, MUTED, PROPOSAL_COLOR, READY_COLOR, STRIP_BACKGROUND, USAGE_COLOR,
};
use super::shade::{shade_spans, Span, SpanKind};
use super::{
    Chart, EventKind, Header, Layout, LineKind, MetricPanel, ReplicaLine, Watermarks, FIGURE_ROW_HEIGHT,
    LEGEND_ROW_HEIGHT, REPORT_MARGIN_LEFT, REPORT_MARGIN_RIGHT, REPORT_WIDTH,
};
use watermarkd_engine::Timestamp;

/// Where a comparison's figures name their rule, left of the figures.
const RULE_NAME_WIDTH: f64 = 150.0;
/// The least space between a panel's title and the legend on its line.
const TITLE_LEGEND_GAP: f64 = 16.0;

/// Where a panel's title, legend and plot go.
#[derive(Clone, Copy, Debug)]
pub(super) struct Geometry {
    /// The title's baseline.
    pub(super) title_y: f64,
    pub(super) legend: LegendPlace,
    /// The plot (its `max` is set by the panel).
    pub(super) axis: ValueAxis,
}

#[derive(Clone, Copy, Debug)]
pub(super) enum LegendPlace {
    /// Right-aligned on the title's line, centred on this y; the title shortened to fit.
    Beside(f64),
    /// On rows of their own from the left, the first centred on this y.
    Rows(f64),
}

impl LegendPlace {
    fn draw(self, svg: &mut String, layout: &Layout, time: TimeAxis, entries: &[(Mark, String)]) {
        match self {
            LegendPlace::Beside(y) => legend(svg, time.left + time.width, y, entries),
            LegendPlace::Rows(y) => {
                for (i, row) in super::draw::legend_rows(entries, layout.plot_width()).iter().enumerate() {
                    legend_from(svg, time.left, y + i as f64 * LEGEND_ROW_HEIGHT, row);
                }
            }
        }
    }

    /// The room a title has before the legend.
    fn title_room(self, time: TimeAxis, entries: &[(Mark, String)]) -> f64 {
        match self {
            LegendPlace::Beside(_) => legend_left(time.left + time.width, entries) - time.left - TITLE_LEGEND_GAP,
            LegendPlace::Rows(_) => time.width,
        }
    }
}

/// A report's header: what was replayed, the figures a reviewer asks for first, and the
/// restriction colours.
pub(super) fn header(svg: &mut String, layout: &Layout, head: &Header, spans: &[Span]) {
    let left_margin = layout.margin_left;
    let _ = writeln!(
        svg,
        r#"<text x="{left_margin}" y="30" font-size="20" font-weight="600">{}</text>"#,
        escape(&head.headline)
    );
    let _ = writeln!(svg, r#"<text x="{left_margin}" y="50" fill="{MUTED}">{}</text>"#, escape(&head.context));

    // The figures, labelled; a comparison names each rule's row in the colour of its replicas
    // line.
    let left = REPORT_MARGIN_LEFT + if head.compared.is_some() { RULE_NAME_WIDTH } else { 0.0 };
    let column = (REPORT_WIDTH - left - REPORT_MARGIN_RIGHT) / head.figures.len().max(1) as f64;
    for (i, (label, value)) in head.figures.iter().enumerate() {
        let x = left + i as f64 * column;
        let _ = writeln!(
            svg,
            r#"<text x="{x:.1}" y="70" font-size="11" fill="{MUTED}">{}</text><text x="{x:.1}" y="87" font-size="14" font-weight="600">{}</text>"#,
            escape(label),
            escape(value)
        );
    }
    let mut y = 106.0;
    if let Some((name, values)) = &head.compared {
        let second = 87.0 + FIGURE_ROW_HEIGHT;
        for (row_y, name, color) in [(87.0, "this rule", EFFECTIVE_COLOR), (second, name.as_str(), AGAINST_COLOR)] {
            let _ = write!(
                svg,
                r#"<text x="{REPORT_MARGIN_LEFT}" y="{row_y:.1}" font-size="13" font-weight="600" fill="{color}">{}</text>"#,
                escape(name)
            );
        }
        for (i, value) in values.iter().enumerate() {
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

    // Legend: the restriction colours (all of them, so charts compare), then the guard colour
    // only when it occurs.
    let mut x = left_margin;
    let _ = write!(svg, r#"<text x="{x}" y="{:.1}" font-size="11" fill="{MUTED}">restricted:</text>"#, y + 4.0);
    x += 66.0;
    for kind in SpanKind::REPORT {
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

/// One metric's panel: its title, grid, the restriction shading, the hold band, the
/// watermarks, its legend and the value's line.
pub(super) fn metric_panel(
    svg: &mut String,
    chart: &Chart,
    metric: &MetricPanel,
    geometry: Geometry,
    time: TimeAxis,
    ticks: &[TimeTick],
) {
    let layout = &chart.layout;
    let Some(latest) = metric.watermarks.last() else { return };
    let mut panel = geometry.axis;
    let peak = metric.values.iter().filter_map(|(_, v)| *v).fold(0.0, f64::max);
    let band_high = metric.watermarks.iter().map(|w| w.band_high).fold(f64::NEG_INFINITY, f64::max);
    let highest = metric.theirs.map_or(band_high, |(_, their_high)| band_high.max(their_high));
    // A figure leaves room over the highest value, so that its line never runs along the frame.
    let peak = if layout.figure { peak * 1.1 } else { peak };
    let value_ticks = nice_ticks(peak.max(highest * 1.15));
    panel.max = value_ticks.last().copied().unwrap_or(1.0);

    // The title ends where the legend on its line begins, shortened to fit: the full
    // explanation is its tooltip.
    let legend_entries = metric_legend(metric);
    let (full, shown) = fitted_title(&metric.titles, geometry.legend.title_room(time, &legend_entries));
    let _ = writeln!(
        svg,
        r#"<text{} x="{}" y="{:.1}" font-size="13" font-weight="600"><title>{}</title>{}</text>"#,
        layout.class("panel-title"),
        time.left,
        geometry.title_y,
        escape(&full),
        escape(&shown)
    );
    grid(svg, panel, time, (ticks, &value_ticks), &layout.class("value-axis"));
    shade_spans(svg, &chart.spans, time, (panel.top, panel.height), 0.13, layout.figure);

    // The band where the metric holds: below band_low scales down, above band_high scales up.
    let band_class = layout.class("band");
    for (x0, x1, w) in segments(&metric.watermarks, chart, time) {
        let (band_top, band_bottom) = (panel.y(w.band_high), panel.y(w.band_low));
        let height = band_bottom - band_top;
        match (x0, x1) {
            (None, _) => {
                let _ = writeln!(
                    svg,
                    r#"<rect{band_class} x="{}" y="{band_top:.1}" width="{:.1}" height="{height:.1}" fill="{BAND_COLOR}" fill-opacity="0.22"/>"#,
                    time.left, time.width,
                );
            }
            (Some(x0), x1) => {
                let _ = writeln!(
                    svg,
                    r#"<rect{band_class} x="{x0:.1}" y="{band_top:.1}" width="{:.1}" height="{height:.1}" fill="{BAND_COLOR}" fill-opacity="0.22"/>"#,
                    (x1 - x0).max(0.0),
                );
            }
        }
    }
    watermark_lines(svg, chart, metric, panel, time, *latest);
    geometry.legend.draw(svg, layout, time, &legend_entries);
    // A figure rounds the line's caps, so that a value alone between two gaps shows as a dot.
    let _ = writeln!(
        svg,
        r#"<path{} d="{}" fill="none" stroke="{USAGE_COLOR}" stroke-width="1.4" stroke-linejoin="round"{}/>"#,
        layout.class("value"),
        value_path(&metric.values, panel, time, layout.figure),
        if layout.figure { r#" stroke-linecap="round""# } else { "" }
    );
    frame(svg, panel, time);
}

/// Each watermark change's stretch: `(None, right)` for one that holds across the whole chart
/// (drawn as it always was), else its x from and to.
fn segments(watermarks: &[Watermarks], chart: &Chart, time: TimeAxis) -> Vec<(Option<f64>, f64, Watermarks)> {
    let right = time.left + time.width;
    if let [only] = watermarks {
        return vec![(None, right, *only)];
    }
    let start = |at: Timestamp| if at < chart.start { chart.start } else { at };
    watermarks
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let until = watermarks.get(i + 1).map_or(chart.end, |next| start(next.from));
            (Some(time.x(start(w.from))), time.x(until).min(right), *w)
        })
        .collect()
}

/// The first title that fits in `room` px, else the last cut with an ellipsis; and the
/// first, the fullest, for the tooltip.
fn fitted_title(titles: &[String], room: f64) -> (String, String) {
    let full = titles.first().cloned().unwrap_or_default();
    let shortest = titles.last().cloned().unwrap_or_default();
    let shown = titles.iter().find(|title| title_width(title) <= room).cloned().unwrap_or_else(|| {
        let fits = (room / title_width("m")).floor().max(2.0) as usize;
        let cut: String = shortest.chars().take(fits - 1).collect();
        format!("{cut}…")
    });
    (full, shown)
}

/// The rule's watermarks (and the other rule's, dotted) across the panel, named in the right
/// margin with the latest value on a figure.
fn watermark_lines(
    svg: &mut String,
    chart: &Chart,
    metric: &MetricPanel,
    panel: ValueAxis,
    time: TimeAxis,
    latest: Watermarks,
) {
    let layout = &chart.layout;
    let dashed = |color| Stroke { color, width: 1.4, dash: "7 4" };
    let classes = [layout.class("high"), layout.class("low")];
    for (x0, x1, w) in segments(&metric.watermarks, chart, time) {
        for ((value, color), class) in [(w.high, HIGH_COLOR), (w.low, LOW_COLOR)].into_iter().zip(&classes) {
            match x0 {
                None => level_line(svg, time, panel.y(value), dashed(color), class),
                Some(x0) => {
                    let y = panel.y(value);
                    let _ = writeln!(
                        svg,
                        r#"<line{class} x1="{x0:.1}" y1="{y:.1}" x2="{x1:.1}" y2="{y:.1}" stroke="{color}" stroke-width="1.4" stroke-dasharray="7 4"/>"#
                    );
                }
            }
        }
    }
    let mut labels = vec![
        (panel.y(latest.high), format!("high {}", format_value(latest.high)), HIGH_COLOR),
        (panel.y(latest.low), format!("low {}", format_value(latest.low)), LOW_COLOR),
    ];
    if let Some((their_low, their_high)) = metric.theirs {
        for (value, color, name) in [(their_high, HIGH_COLOR, "against high"), (their_low, LOW_COLOR, "against low")] {
            level_line(svg, time, panel.y(value), Stroke { color, width: 1.4, dash: AGAINST_DASH }, "");
            labels.push((panel.y(value), format!("{name} {}", format_value(value)), color));
        }
    }
    if layout.figure {
        if let Some((_, Some(now))) = metric.values.last() {
            labels.push((panel.y(*now), format!("now {}", format_value(*now)), USAGE_COLOR));
        }
    }
    side_labels(svg, time.left + time.width, &mut labels);
}

/// A metric panel's legend, with the hold band's tolerance and bounds (the latest).
pub(super) fn metric_legend(metric: &MetricPanel) -> Vec<(Mark, String)> {
    let band = metric.watermarks.last().map_or((0.0, 0.0), |w| (w.band_low, w.band_high));
    let tolerance = metric.tolerance.map(|(up, down)| {
        let (up, down) = (up * 100.0, down * 100.0);
        if up == down {
            format!("±{}%: ", format_value(up))
        } else {
            format!("+{}/−{}%: ", format_value(up), format_value(down))
        }
    });
    // The other rule's watermarks are named by their side labels: one more legend entry would
    // leave the panel's title no room.
    vec![
        (Mark::Line { color: USAGE_COLOR, width: 2.0, dash: "" }, metric.value_label.clone()),
        (Mark::Line { color: HIGH_COLOR, width: 1.4, dash: "7 4" }, "high watermark".to_string()),
        (Mark::Line { color: LOW_COLOR, width: 1.4, dash: "7 4" }, "low watermark".to_string()),
        (
            Mark::Box { color: BAND_COLOR, opacity: 0.35 },
            format!("hold band ({}{} – {})", tolerance.unwrap_or_default(), format_value(band.0), format_value(band.1)),
        ),
    ]
}

/// The value's line, broken where there was no usable value. `dots`: a value alone between
/// two gaps is a point (`h0`, drawn as a dot with round caps) rather than nothing.
fn value_path(values: &[(Timestamp, Option<f64>)], panel: ValueAxis, time: TimeAxis, dots: bool) -> String {
    let mut path = String::new();
    let mut pen_down = false;
    let mut points_in_run = 0;
    let lone_point = |path: &mut String, points: usize| {
        if dots && points == 1 {
            path.push_str(" h0");
        }
    };
    for (at, value) in values {
        match value {
            Some(value) => {
                let _ = write!(path, "{}{:.1},{:.1}", if pen_down { " L" } else { " M" }, time.x(*at), panel.y(*value));
                pen_down = true;
                points_in_run += 1;
            }
            None => {
                lone_point(&mut path, points_in_run);
                pen_down = false;
                points_in_run = 0;
            }
        }
    }
    lone_point(&mut path, points_in_run);
    path.trim_start().to_string()
}

/// The replicas panel: its title, the restriction strip, the grid, the bounds, the lines, the
/// scale events and its legend.
pub(super) fn replicas_panel(
    svg: &mut String,
    chart: &Chart,
    geometry: Geometry,
    strip_top: f64,
    time: TimeAxis,
    ticks: &[TimeTick],
) {
    let layout = &chart.layout;
    let replicas = &chart.replicas;
    let left = time.left;
    let (min, max) = (f64::from(replicas.min), f64::from(replicas.max));
    let peak_proposal = peak(&replicas.lines, |kind| kind == LineKind::Proposed);
    let value_ticks = nice_ticks(shown_max(max, peak_proposal, &replicas.lines));
    let mut panel = geometry.axis;
    panel.max = value_ticks.last().copied().unwrap_or(1.0);

    let _ = writeln!(
        svg,
        r#"<text{} x="{left}" y="{:.1}" font-size="13" font-weight="600">Replicas</text>"#,
        layout.class("panel-title"),
        geometry.title_y
    );
    // The restriction strip: the same spans as the shading, at full strength, so that short
    // spans stay visible. A figure's legend names it.
    let strip_height = layout.strip_height;
    if !layout.figure {
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" font-size="10" fill="{MUTED}" text-anchor="end">restricted</text>"#,
            left - 6.0,
            strip_top + strip_height - 3.0
        );
    }
    let _ = writeln!(
        svg,
        r#"<rect{} x="{left}" y="{strip_top:.1}" width="{:.1}" height="{strip_height}" fill="{STRIP_BACKGROUND}" stroke="{GRID}"/>"#,
        layout.class("strip"),
        time.width
    );
    shade_spans(svg, &chart.spans, time, (strip_top, strip_height), 0.85, layout.figure);

    grid(svg, panel, time, (ticks, &value_ticks), &layout.class("value-axis"));
    shade_spans(svg, &chart.spans, time, (panel.top, panel.height), 0.13, layout.figure);

    let bounds = Stroke { color: BOUND_COLOR, width: 1.2, dash: "3 3" };
    for value in [max, min] {
        level_line(svg, time, panel.y(value), bounds, "");
    }
    side_labels(
        svg,
        left + time.width,
        &mut [(panel.y(max), format!("max {max}"), MUTED), (panel.y(min), format!("min {min}"), MUTED)],
    );

    let mut lines: Vec<&ReplicaLine> = replicas.lines.iter().collect();
    lines.sort_by_key(|line| line.kind);
    let compared = replicas.lines.iter().any(|line| line.kind == LineKind::Against);
    for line in lines {
        let stroke = match line.kind {
            LineKind::Proposed => format!(
                r#"{}stroke="{PROPOSAL_COLOR}" stroke-width="1.3" stroke-opacity="0.9""#,
                if layout.figure { r#"class="replicas-proposed" "# } else { "" }
            ),
            LineKind::Ready => format!(r#"stroke="{READY_COLOR}" stroke-width="1.2" stroke-dasharray="4 2""#),
            LineKind::Actual => format!(r#"class="replicas-actual" stroke="{ACTUAL_COLOR}" stroke-width="1.6""#),
            LineKind::Against => format!(
                r#"class="replicas-against" stroke="{AGAINST_COLOR}" stroke-width="1.8" stroke-linejoin="round""#
            ),
            LineKind::Effective => format!(
                r#"{}stroke="{EFFECTIVE_COLOR}" stroke-width="2.2" stroke-linejoin="round""#,
                if compared || layout.figure { r#"class="replicas-rule" "# } else { "" }
            ),
        };
        let _ =
            writeln!(svg, r#"<path d="{}" fill="none" {stroke}/>"#, step_path(&line.points, chart.end, time, panel));
    }

    replicas_notes(svg, chart, panel, time, peak_proposal);
    frame(svg, panel, time);
    geometry.legend.draw(svg, layout, time, &replicas_legend(chart));
}

/// The highest count of the lines of these kinds (0 for none).
fn peak(lines: &[ReplicaLine], kinds: impl Fn(LineKind) -> bool) -> u32 {
    lines.iter().filter(|l| kinds(l.kind)).flat_map(|l| l.points.iter().filter_map(|(_, r)| *r)).max().unwrap_or(0)
}

/// The top of the replicas axis: every replica count drawn fits, and a proposal far beyond
/// `max_replicas` (which would flatten the lines that matter) is cut off at 1.6x it.
fn shown_max(max: f64, peak_proposal: u32, lines: &[ReplicaLine]) -> f64 {
    let peak_spec = peak(lines, |kind| matches!(kind, LineKind::Effective | LineKind::Against | LineKind::Actual));
    (f64::from(peak_proposal).min(max * 1.6)).max(f64::from(peak_spec)).max(max * 1.1)
}

/// The replicas panel's notes: where a person set the count, where the autoscaler scaled (a
/// figure's), and that proposals were cut off.
fn replicas_notes(svg: &mut String, chart: &Chart, panel: ValueAxis, time: TimeAxis, peak_proposal: u32) {
    for event in &chart.replicas.events {
        let x = time.x(event.at);
        match event.kind {
            EventKind::Manual => {
                let _ = writeln!(
                    svg,
                    r#"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="{MANUAL_COLOR}" stroke-width="1.2" stroke-dasharray="2 2"/><text x="{:.1}" y="{:.1}" font-size="11" fill="{MANUAL_COLOR}" paint-order="stroke" stroke="white" stroke-width="3">set by a person: {} → {}</text>"#,
                    panel.top,
                    panel.bottom(),
                    x + 4.0,
                    panel.top + 12.0,
                    event.from,
                    event.to
                );
            }
            EventKind::Scaled { written } => {
                let (arrow, what) = if event.to > event.from { ("▲", "scaled up") } else { ("▼", "scaled down") };
                let only = if written { "" } else { ", decided only (a dry run or a pause)" };
                let _ = writeln!(
                    svg,
                    r#"<g class="event"><title>{what} from {} to {} at {} (UTC){only}</title><line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="{EVENT_COLOR}" stroke-width="1" stroke-dasharray="1 3"/><text x="{x:.1}" y="{:.1}" font-size="9" fill="{EVENT_COLOR}" text-anchor="middle">{arrow}</text></g>"#,
                    event.from,
                    event.to,
                    super::draw::short_time(event.at),
                    panel.top,
                    panel.bottom(),
                    panel.top - 2.0,
                );
            }
        }
    }
    if f64::from(peak_proposal) > panel.max {
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" font-size="11" fill="{PROPOSAL_COLOR}" paint-order="stroke" stroke="white" stroke-width="3">proposals reach {peak_proposal}: cut off at the top</text>"#,
            time.left + 6.0,
            panel.top + 13.0
        );
    }
}

/// The replicas panel's legend: this rule's line (and, in a comparison, the other rule's and
/// what actually ran), the proposals, readiness, the bounds, the scale events on a figure.
pub(super) fn replicas_legend(chart: &Chart) -> Vec<(Mark, String)> {
    let lines = &chart.replicas.lines;
    let mut entries = Vec::new();
    for kind in [LineKind::Effective, LineKind::Against, LineKind::Actual, LineKind::Proposed, LineKind::Ready] {
        let mark = match kind {
            LineKind::Effective => Mark::Line { color: EFFECTIVE_COLOR, width: 2.2, dash: "" },
            LineKind::Against => Mark::Line { color: AGAINST_COLOR, width: 1.8, dash: "" },
            LineKind::Actual => Mark::Line { color: ACTUAL_COLOR, width: 1.6, dash: "" },
            LineKind::Proposed => Mark::Line { color: PROPOSAL_COLOR, width: 1.3, dash: "" },
            LineKind::Ready => Mark::Line { color: READY_COLOR, width: 1.2, dash: "4 2" },
        };
        entries.extend(lines.iter().filter(|l| l.kind == kind).map(|l| (mark, l.label.clone())));
    }
    entries.push((Mark::Line { color: BOUND_COLOR, width: 1.2, dash: "3 3" }, "min/max replicas".to_string()));
    if chart.replicas.events.iter().any(|e| matches!(e.kind, EventKind::Scaled { .. })) {
        entries.push((Mark::Line { color: EVENT_COLOR, width: 1.0, dash: "1 3" }, "scale event".to_string()));
    }
    entries
}
