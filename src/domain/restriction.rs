//! What held an evaluation back or bent it, in one word: the simulator's report and chart
//! count and shade it, and the status board keeps it with each sample of an autoscaler's
//! history so that the page shades the same spans.

use serde::{Deserialize, Serialize};
use watermarkd_engine::{Action, Decision, Guard, Limit, Position};

/// What held back or bent one evaluation, for the summary and the chart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Restriction {
    /// Some metric had no data.
    NoData,
    /// A scale was due but the forbidden window after the last scale was still open.
    UpscaleWindow,
    DownscaleWindow,
    /// A scale was due but the watermark had not been crossed for long enough.
    UpscaleDelay,
    DownscaleDelay,
    /// The rate limit cut the step.
    UpscaleCapping,
    DownscaleCapping,
    /// min_replicas or max_replicas bound the proposal.
    MinReplicas,
    MaxReplicas,
    /// Scaling down was held because replicas were not ready.
    NotReady,
    /// A guard held the decision (paused, min available, no ready replica).
    Guarded,
}

impl Restriction {
    /// The forbidden window or the delay that held a scale back, if one did.
    pub fn timing_block(decision: &Decision) -> Option<Restriction> {
        if decision.action != Action::Hold || decision.guard.is_some() {
            return None;
        }
        let normalized = decision.normalized?;
        let timing = &decision.timing;
        if normalized > decision.spec_replicas {
            if timing.upscale_window_seconds_left > 0.0 {
                Some(Restriction::UpscaleWindow)
            } else {
                Some(Restriction::UpscaleDelay)
            }
        } else if normalized < decision.spec_replicas {
            if timing.downscale_window_seconds_left > 0.0 {
                Some(Restriction::DownscaleWindow)
            } else {
                Some(Restriction::DownscaleDelay)
            }
        } else {
            None
        }
    }

    /// The limit that bound the proposal, if one did.
    pub fn from_limit(limit: Limit) -> Option<Restriction> {
        match limit {
            Limit::WithinRange => None,
            Limit::UpscaleCapping => Some(Restriction::UpscaleCapping),
            Limit::DownscaleCapping => Some(Restriction::DownscaleCapping),
            Limit::TooFew | Limit::BelowMin => Some(Restriction::MinReplicas),
            Limit::TooMany | Limit::AboveMax => Some(Restriction::MaxReplicas),
            Limit::NotReady => Some(Restriction::NotReady),
            Limit::NoData => Some(Restriction::NoData),
            Limit::Paused | Limit::MinAvailable | Limit::NoReadyReplicas => Some(Restriction::Guarded),
            // Scale to zero moving the count is the rule working.
            Limit::ScaledToZero => None,
        }
    }

    /// The one restriction that explains the evaluation best: missing data first (nothing
    /// else was judged on it), then what held a due scale back, then what cut it.
    pub fn dominant(decision: &Decision) -> Option<Restriction> {
        let missing_data = decision.guard == Some(Guard::NoData)
            || decision.metrics.iter().any(|m| m.position == Position::Unavailable);
        if missing_data {
            return Some(Restriction::NoData);
        }
        if let Some(block) = Restriction::timing_block(decision) {
            return Some(block);
        }
        if let Some(guard) = decision.guard {
            return match guard {
                // Moving back inside min/max is the rule working, not a restriction.
                Guard::AboveMax | Guard::BelowMin | Guard::AtZero => None,
                Guard::NoData => Some(Restriction::NoData),
                Guard::Paused | Guard::MinAvailable | Guard::NoReadyReplicas => Some(Restriction::Guarded),
            };
        }
        Restriction::from_limit(decision.limit)
    }
}

impl Restriction {
    /// Every restriction, in the order of [`Restriction::code`].
    pub const ALL: [Restriction; 11] = [
        Restriction::NoData,
        Restriction::UpscaleWindow,
        Restriction::DownscaleWindow,
        Restriction::UpscaleDelay,
        Restriction::DownscaleDelay,
        Restriction::UpscaleCapping,
        Restriction::DownscaleCapping,
        Restriction::MinReplicas,
        Restriction::MaxReplicas,
        Restriction::NotReady,
        Restriction::Guarded,
    ];

    /// A number from 1 to 15 for a compact encoding (0 is none): the history keeps it in four
    /// bits of a sample's header.
    pub fn code(self) -> u8 {
        let index = Restriction::ALL.iter().position(|r| *r == self).unwrap_or(0);
        u8::try_from(index + 1).unwrap_or(0)
    }

    /// The restriction of [`Restriction::code`]; `None` for 0 or an unknown code.
    pub fn from_code(code: u8) -> Option<Restriction> {
        Restriction::ALL.get(usize::from(code).checked_sub(1)?).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_restriction_has_a_code_of_four_bits_that_reads_back() {
        for restriction in Restriction::ALL {
            let code = restriction.code();
            assert!((1..16).contains(&code), "{restriction:?}: {code}");
            assert_eq!(Restriction::from_code(code), Some(restriction));
        }
        assert_eq!(Restriction::from_code(0), None);
        assert_eq!(Restriction::from_code(15), None);
    }
}
