//! The shaded spans: where scaling was held back or bent, and why, as the chart colours it.

use std::fmt::Write as _;

use watermarkd_engine::Timestamp;

use super::draw::{escape, short_time, TimeAxis};
use crate::domain::restriction::Restriction;

/// Why scaling was restricted, as the chart colours it. The first seven are the simulator's;
/// the page adds what only a running daemon knows: a fallback deciding, an evaluation failing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SpanKind {
    UpscaleCapping,
    DownscaleCapping,
    Window,
    Delay,
    Bounds,
    NoData,
    Guard,
    /// The declared fallback decided.
    Fallback,
    /// The evaluation could not decide (the target or its state unreadable).
    Failed,
}

impl SpanKind {
    /// The kinds a report's legend lists, whether they occur or not (so that charts compare),
    /// the guard's only when it occurs.
    pub(super) const REPORT: [SpanKind; 7] = [
        SpanKind::UpscaleCapping,
        SpanKind::DownscaleCapping,
        SpanKind::Window,
        SpanKind::Delay,
        SpanKind::Bounds,
        SpanKind::NoData,
        SpanKind::Guard,
    ];

    pub fn of(restriction: Restriction) -> SpanKind {
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

    pub(super) fn color(self) -> &'static str {
        match self {
            SpanKind::UpscaleCapping => "#f28e2b",
            SpanKind::DownscaleCapping => "#4e79a7",
            SpanKind::Window => "#b07aa1",
            SpanKind::Delay => "#e9c46a",
            SpanKind::Bounds => "#9c755f",
            SpanKind::NoData => "#e15759",
            SpanKind::Guard => "#76b7b2",
            SpanKind::Fallback => "#ff9da7",
            SpanKind::Failed => "#7b8794",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            SpanKind::UpscaleCapping => "upscale capped",
            SpanKind::DownscaleCapping => "downscale capped",
            SpanKind::Window => "forbidden window",
            SpanKind::Delay => "watermark delay",
            SpanKind::Bounds => "min/max replicas",
            SpanKind::NoData => "no data",
            SpanKind::Guard => "not ready / guard",
            SpanKind::Fallback => "fallback decides",
            SpanKind::Failed => "evaluation failed",
        }
    }

    /// The class a page's span carries (`shade window`), for its style and its tests.
    pub(super) fn class(self) -> &'static str {
        match self {
            SpanKind::UpscaleCapping => "upscale-capped",
            SpanKind::DownscaleCapping => "downscale-capped",
            SpanKind::Window => "window",
            SpanKind::Delay => "delay",
            SpanKind::Bounds => "bounds",
            SpanKind::NoData => "no-data",
            SpanKind::Guard => "guard",
            SpanKind::Fallback => "fallback",
            SpanKind::Failed => "failed",
        }
    }
}

/// A run of evaluations restricted for the same reason: `[from, to)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Span {
    pub kind: SpanKind,
    pub from: Timestamp,
    pub to: Timestamp,
}

/// Merges consecutive evaluations with the same kind into spans: each evaluation's holds until
/// the next evaluation, the last one's until `end`.
pub fn spans(evaluations: &[(Timestamp, Option<SpanKind>)], end: Timestamp) -> Vec<Span> {
    let mut spans: Vec<Span> = Vec::new();
    for (i, (from, kind)) in evaluations.iter().enumerate() {
        let Some(kind) = *kind else { continue };
        let to = evaluations.get(i + 1).map_or(end, |(next, _)| *next);
        match spans.last_mut() {
            Some(last) if last.kind == kind && last.to == *from => last.to = to,
            _ => spans.push(Span { kind, from: *from, to }),
        }
    }
    spans
}

/// The spans as rectangles from `top`, `height` high. `tagged`: each with its class and a
/// tooltip naming it and its times (the page's).
pub(super) fn shade_spans(
    svg: &mut String,
    spans: &[Span],
    time: TimeAxis,
    (top, height): (f64, f64),
    opacity: f64,
    tagged: bool,
) {
    for span in spans {
        let (x0, x1) = (time.x(span.from), time.x(span.to));
        // Keep one-evaluation spans visible on long traces.
        let width = (x1 - x0).max(1.0);
        let color = span.kind.color();
        if tagged {
            let _ = write!(
                svg,
                r#"<rect class="shade {}" x="{x0:.1}" y="{top:.1}" width="{width:.1}" height="{height:.1}" fill="{color}" fill-opacity="{opacity}"><title>{}: {} to {} (UTC)</title></rect>"#,
                span.kind.class(),
                escape(span.kind.label()),
                short_time(span.from),
                short_time(span.to),
            );
        } else {
            let _ = write!(
                svg,
                r#"<rect x="{x0:.1}" y="{top:.1}" width="{width:.1}" height="{height:.1}" fill="{color}" fill-opacity="{opacity}"/>"#,
            );
        }
    }
    svg.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_evaluations_of_one_kind_make_one_span_until_the_next_evaluation() {
        let at = |s: i64| Timestamp::from_unix_millis(s * 1000);
        let evaluations = [
            (at(0), Some(SpanKind::Window)),
            (at(10), Some(SpanKind::Window)),
            (at(20), None),
            (at(30), Some(SpanKind::NoData)),
            (at(40), Some(SpanKind::Window)),
        ];
        assert_eq!(
            spans(&evaluations, at(45)),
            [
                Span { kind: SpanKind::Window, from: at(0), to: at(20) },
                Span { kind: SpanKind::NoData, from: at(30), to: at(40) },
                Span { kind: SpanKind::Window, from: at(40), to: at(45) },
            ]
        );
    }
}
