//! What every panel is drawn with: the time and value axes (mapping, round ticks, their
//! labels and grid), and the SVG primitives (level lines, step paths, frames, legends, side
//! labels, escaping). The panels themselves are in `panels`.

use std::fmt::Write as _;

use watermarkd_engine::Timestamp;

use super::palette::{AXIS_TEXT, DAY_GRID, FRAME_COLOR, GRID, MUTED};

/// Maps time to x.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TimeAxis {
    pub(crate) start_ms: f64,
    pub(crate) span_ms: f64,
    pub(crate) left: f64,
    pub(crate) width: f64,
}

impl TimeAxis {
    pub(crate) fn x(&self, at: Timestamp) -> f64 {
        self.left + (at.unix_millis() as f64 - self.start_ms) / self.span_ms * self.width
    }
}

/// Maps a value to y inside one panel.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ValueAxis {
    pub(crate) max: f64,
    pub(crate) top: f64,
    pub(crate) height: f64,
}

impl ValueAxis {
    pub(crate) fn y(&self, value: f64) -> f64 {
        // Values off the top run along the frame instead of across the panel above.
        let clamped = value.clamp(0.0, self.max);
        self.top + self.height - clamped / self.max * self.height
    }
    pub(crate) fn bottom(&self) -> f64 {
        self.top + self.height
    }
}

/// What a legend entry shows before its label.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Mark {
    Line {
        color: &'static str,
        width: f64,
        dash: &'static str,
    },
    Box {
        color: &'static str,
        opacity: f64,
    },
    /// No mark: the label alone, in the muted colour (a legend's heading).
    Text,
}

/// Each legend entry's width: its mark, its label, the gap after it. SVG has no text
/// measurement: 6.4 px per character at 11 px.
fn legend_widths(entries: &[(Mark, String)]) -> Vec<f64> {
    entries
        .iter()
        .map(|(mark, label)| {
            let mark = if matches!(mark, Mark::Text) { 0.0 } else { 26.0 };
            mark + 6.4 * label.chars().count() as f64 + 18.0
        })
        .collect()
}

/// Where a legend right-aligned at `right` begins.
pub(crate) fn legend_left(right: f64, entries: &[(Mark, String)]) -> f64 {
    right - legend_widths(entries).iter().sum::<f64>() + 18.0
}

/// How wide a panel title (13 px, semibold) is drawn at most: 0.66 em per character, wider
/// than the average of the fonts named (DejaVu Sans Bold, the widest, is about 0.63 em).
pub(crate) fn title_width(text: &str) -> f64 {
    0.66 * 13.0 * text.chars().count() as f64
}

/// A legend on one line, right-aligned at `right`, vertically centred on `y`.
pub(crate) fn legend(svg: &mut String, right: f64, y: f64, entries: &[(Mark, String)]) {
    legend_from(svg, legend_left(right, entries), y, entries);
}

/// The legend's entries in rows that each fit in `width`, in their order.
pub(crate) fn legend_rows(entries: &[(Mark, String)], width: f64) -> Vec<Vec<(Mark, String)>> {
    let mut rows: Vec<Vec<(Mark, String)>> = Vec::new();
    let mut used = 0.0;
    for (entry, entry_width) in entries.iter().zip(legend_widths(entries)) {
        match rows.last_mut() {
            // The gap after the last entry of a row takes no room.
            Some(row) if used + entry_width - 18.0 <= width => {
                row.push(entry.clone());
                used += entry_width;
            }
            _ => {
                rows.push(vec![entry.clone()]);
                used = entry_width;
            }
        }
    }
    rows
}

/// A legend on one line from `x`, vertically centred on `y`.
pub(crate) fn legend_from(svg: &mut String, x: f64, y: f64, entries: &[(Mark, String)]) {
    let widths = legend_widths(entries);
    let mut x = x;
    svg.push_str(r#"<g font-size="11">"#);
    for ((mark, label), width) in entries.iter().zip(&widths) {
        match *mark {
            Mark::Line { color, width: stroke, dash } => {
                let _ = write!(
                    svg,
                    r#"<line x1="{x:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{color}" stroke-width="{stroke}" stroke-dasharray="{dash}"/>"#,
                    x + 22.0
                );
            }
            Mark::Box { color, opacity } => {
                let _ = write!(
                    svg,
                    r#"<rect x="{x:.1}" y="{:.1}" width="22" height="10" fill="{color}" fill-opacity="{opacity}"/>"#,
                    y - 5.0
                );
            }
            Mark::Text => {
                let _ = write!(svg, r#"<text x="{x:.1}" y="{:.1}" fill="{MUTED}">{}</text>"#, y + 4.0, escape(label));
                x += width;
                continue;
            }
        }
        let _ = write!(svg, r#"<text x="{:.1}" y="{:.1}">{}</text>"#, x + 26.0, y + 4.0, escape(label));
        x += width;
    }
    svg.push_str("</g>\n");
}

/// Labels in the right margin at the height of the line they name, pushed apart when two
/// would overlap.
pub(crate) fn side_labels(svg: &mut String, right: f64, labels: &mut [(f64, String, &str)]) {
    const LINE_HEIGHT: f64 = 13.0;
    labels.sort_by(|a, b| a.0.total_cmp(&b.0));
    // Each label with the next, in order: a label pushed down by the one before can push the next.
    let mut rest = &mut *labels;
    while let [before, after @ ..] = std::mem::take(&mut rest) {
        if let Some(next) = after.first_mut() {
            let gap = next.0 - before.0;
            if gap < LINE_HEIGHT {
                let push = (LINE_HEIGHT - gap) / 2.0;
                before.0 -= push;
                next.0 += push;
            }
        }
        rest = after;
    }
    for (y, text, color) in labels.iter() {
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" font-size="11" fill="{color}">{}</text>"#,
            right + 6.0,
            y + 4.0,
            escape(text)
        );
    }
}

/// A horizontal line across the plot at `y`: a watermark or a replica bound. `class` is
/// empty or ` class="…"`.
pub(crate) fn level_line(svg: &mut String, time: TimeAxis, y: f64, stroke: Stroke<'_>, class: &str) {
    let (left, right) = (time.left, time.left + time.width);
    let Stroke { color, width, dash } = stroke;
    let _ = writeln!(
        svg,
        r#"<line{class} x1="{left}" y1="{y:.1}" x2="{right:.1}" y2="{y:.1}" stroke="{color}" stroke-width="{width}" stroke-dasharray="{dash}"/>"#
    );
}

/// A line's colour, width and dashes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Stroke<'a> {
    pub(crate) color: &'a str,
    pub(crate) width: f64,
    pub(crate) dash: &'a str,
}

/// A step line through `(time, value)` points: each value holds until the next point (or
/// `end`). `None` lifts the pen.
pub(crate) fn step_path(
    points: &[(Timestamp, Option<u32>)],
    end: Timestamp,
    time: TimeAxis,
    panel: ValueAxis,
) -> String {
    let mut path = String::new();
    let mut previous: Option<f64> = None;
    for (i, (at, value)) in points.iter().enumerate() {
        let until = points.get(i + 1).map_or(end, |(next, _)| *next);
        let Some(value) = value else {
            previous = None;
            continue;
        };
        let (x0, x1, y) = (time.x(*at), time.x(until), panel.y(f64::from(*value)));
        match previous {
            // Same height as before: extend the segment instead of adding points.
            Some(prev_y) if (prev_y - y).abs() < 0.05 => {}
            Some(_) => {
                let _ = write!(path, " L{x0:.1},{y:.1}");
            }
            None => {
                let _ = write!(path, " M{x0:.1},{y:.1}");
            }
        }
        let next_differs = points.get(i + 1).is_none_or(|(_, next)| next.map(|n| panel.y(f64::from(n))) != Some(y));
        if next_differs {
            let _ = write!(path, " L{x1:.1},{y:.1}");
        }
        previous = Some(y);
    }
    path.trim_start().to_string()
}

/// The value ticks (lines and labels) and the time ticks' lines. `class` is empty or
/// ` class="…"`.
pub(crate) fn grid(
    svg: &mut String,
    panel: ValueAxis,
    time: TimeAxis,
    (ticks, value_ticks): (&[TimeTick], &[f64]),
    class: &str,
) {
    let (left, right) = (time.left, time.left + time.width);
    let _ = write!(svg, r#"<g{class} stroke-width="1">"#);
    for value in value_ticks {
        let y = panel.y(*value);
        let _ = write!(
            svg,
            r#"<line x1="{left}" y1="{y:.1}" x2="{right:.1}" y2="{y:.1}" stroke="{GRID}"/><text x="{:.1}" y="{:.1}" font-size="11" fill="{MUTED}" text-anchor="end" stroke="none">{}</text>"#,
            left - 6.0,
            y + 4.0,
            format_value(*value)
        );
    }
    for tick in ticks {
        let x = time.x(tick.at);
        let color = if tick.day_label.is_some() { DAY_GRID } else { GRID };
        let _ = write!(
            svg,
            r#"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="{color}"/>"#,
            panel.top,
            panel.bottom()
        );
    }
    svg.push_str("</g>\n");
}

pub(crate) fn frame(svg: &mut String, panel: ValueAxis, time: TimeAxis) {
    let left = time.left;
    let _ = writeln!(
        svg,
        r#"<rect x="{left}" y="{:.1}" width="{:.1}" height="{:.1}" fill="none" stroke="{FRAME_COLOR}"/>"#,
        panel.top, time.width, panel.height
    );
}

/// The time axis under the last panel: a tick and the clock time at each tick, the day under
/// the first and at each midnight. `class` is empty or ` class="…"`.
pub(crate) fn time_labels(svg: &mut String, ticks: &[TimeTick], time: TimeAxis, top: f64, class: &str) {
    let _ = write!(svg, r#"<g{class} font-size="11" fill="{AXIS_TEXT}" text-anchor="middle">"#);
    for tick in ticks {
        let x = time.x(tick.at);
        let _ = write!(
            svg,
            r##"<line x1="{x:.1}" y1="{top:.1}" x2="{x:.1}" y2="{:.1}" stroke="{FRAME_COLOR}"/><text x="{x:.1}" y="{:.1}">{}</text>"##,
            top + 5.0,
            top + 18.0,
            tick.time_label
        );
        if let Some(day) = &tick.day_label {
            let _ = write!(svg, r#"<text x="{x:.1}" y="{:.1}" font-weight="600">{day}</text>"#, top + 32.0);
        }
    }
    svg.push_str("</g>\n");
}

/// A labelled point on the time axis.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TimeTick {
    pub(crate) at: Timestamp,
    /// `HH:MM`.
    pub(crate) time_label: String,
    /// `Wed 05-01` on the first tick and at each midnight.
    pub(crate) day_label: Option<String>,
}

/// Round times between `start` and `end`, at most `most` of them (and about half as many at
/// least). `to_the_second`: steps under a minute are allowed too (a page's short history),
/// labelled `12:30:15`.
pub(crate) fn time_ticks(start: Timestamp, end: Timestamp, most: i64, to_the_second: bool) -> Vec<TimeTick> {
    const STEPS_SECONDS: [i64; 6] = [1, 2, 5, 10, 15, 30];
    const STEPS_MINUTES: [i64; 13] = [1, 2, 5, 10, 15, 20, 30, 60, 120, 180, 240, 360, 720];
    let span_ms = (end.unix_millis() - start.unix_millis()).max(1);
    let seconds = STEPS_SECONDS.iter().filter(|_| to_the_second).map(|s| s * 1000);
    let step_ms = seconds
        .chain(STEPS_MINUTES.iter().map(|m| m * 60_000))
        .find(|step| span_ms / step <= most)
        .unwrap_or(24 * 3_600_000);
    let first = start.unix_millis().div_euclid(step_ms) * step_ms;
    let first = if first < start.unix_millis() { first + step_ms } else { first };
    let mut ticks = Vec::new();
    let mut at = first;
    while at <= end.unix_millis() {
        let timestamp = Timestamp::from_unix_millis(at);
        let is_midnight = at.rem_euclid(86_400_000) == 0;
        ticks.push(TimeTick {
            at: timestamp,
            time_label: clock_time(timestamp, step_ms < 60_000),
            day_label: (ticks.is_empty() || is_midnight).then(|| day(timestamp)),
        });
        at += step_ms;
    }
    ticks
}

/// `12:30`, or `12:30:15` with `seconds` (UTC).
fn clock_time(at: Timestamp, seconds: bool) -> String {
    let end = if seconds { 19 } else { 16 };
    at.to_string().get(11..end).unwrap_or_default().to_string()
}

/// `Wed 05-01` (UTC).
fn day(at: Timestamp) -> String {
    const WEEKDAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    // 1970-01-01 was a Thursday.
    let days = at.unix_millis().div_euclid(86_400_000);
    let weekday = usize::try_from(days.rem_euclid(7)).ok().and_then(|d| WEEKDAYS.get(d)).copied().unwrap_or_default();
    format!("{weekday} {}", at.to_string().get(5..10).unwrap_or_default())
}

/// `2024-05-01 12:30`.
pub fn short_time(at: Timestamp) -> String {
    let text = at.to_string();
    format!("{} {}", text.get(..10).unwrap_or_default(), text.get(11..16).unwrap_or_default())
}

/// Value ticks from 0 to at least `max`, with a 1/2/5 step, about 5 of them.
pub(crate) fn nice_ticks(max: f64) -> Vec<f64> {
    let max = if max.is_finite() && max > 0.0 { max } else { 1.0 };
    let raw_step = max / 5.0;
    let magnitude = 10f64.powf(raw_step.log10().floor());
    let step =
        [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * magnitude).find(|s| *s >= raw_step).unwrap_or(magnitude * 10.0);
    let count = (max / step).ceil() as usize;
    // Rebuild each tick from its index so that 0.1 + 0.2 noise never reaches a label.
    (0..=count).map(|i| (i as f64 * step * 1e9).round() / 1e9).collect()
}

/// A value label: at most 4 significant digits, no trailing zeros.
pub fn format_value(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return "0".into();
    }
    let decimals = usize::try_from((3 - v.abs().log10().floor() as i32).clamp(0, 6)).unwrap_or(0);
    let text = format!("{v:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

pub(crate) use crate::domain::markup::escape;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_ticks_are_round_and_cover_the_maximum() {
        assert_eq!(nice_ticks(0.99), vec![0.0, 0.2, 0.4, 0.6, 0.8, 1.0]);
        assert_eq!(nice_ticks(23.0), vec![0.0, 5.0, 10.0, 15.0, 20.0, 25.0]);
        assert_eq!(nice_ticks(0.0), vec![0.0, 0.2, 0.4, 0.6, 0.8, 1.0]);
        assert_eq!(format_value(0.15), "0.15");
        assert_eq!(format_value(132.0), "132");
        assert_eq!(format_value(0.4400000001), "0.44");
    }

    #[test]
    fn time_ticks_fall_on_round_times_with_the_day_at_midnight() {
        let start = Timestamp::parse_rfc3339("2024-05-01T22:07:00Z").unwrap();
        let end = Timestamp::parse_rfc3339("2024-05-02T02:00:00Z").unwrap();
        let ticks = time_ticks(start, end, 16, false);
        let labels: Vec<&str> = ticks.iter().map(|t| t.time_label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "22:15", "22:30", "22:45", "23:00", "23:15", "23:30", "23:45", "00:00", "00:15", "00:30", "00:45",
                "01:00", "01:15", "01:30", "01:45", "02:00"
            ]
        );
        assert_eq!(ticks[0].day_label.as_deref(), Some("Wed 05-01"));
        assert_eq!(ticks[7].day_label.as_deref(), Some("Thu 05-02"));
        assert_eq!(ticks[8].day_label, None);
        // Without steps under a minute, half a minute has no tick; with them, every 5 seconds.
        let (start, end) =
            (start.plus(std::time::Duration::from_secs(10)), start.plus(std::time::Duration::from_secs(40)));
        assert!(time_ticks(start, end, 8, false).is_empty());
        let labels: Vec<String> = time_ticks(start, end, 8, true).into_iter().map(|t| t.time_label).collect();
        assert_eq!(labels, ["22:07:10", "22:07:15", "22:07:20", "22:07:25", "22:07:30", "22:07:35", "22:07:40"]);
    }

    #[test]
    fn names_are_escaped() {
        assert_eq!(escape(r#"a<b & "c""#), "a&lt;b &amp; &quot;c&quot;");
    }
}
