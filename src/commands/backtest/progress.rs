//! A progress bar on standard error while the history is read: a backtest over a week of
//! Datadog data paces its requests and can take minutes.

use std::cell::RefCell;
use std::io::Write;

/// Redrawn in place on a terminal; elsewhere (a CI log, a pipe) one line per tenth.
pub struct ProgressBar<'a, W: Write> {
    state: RefCell<State<'a, W>>,
}

struct State<'a, W: Write> {
    out: &'a mut W,
    terminal: bool,
    /// The label and tenth last written, so that a log gets each line once.
    last: Option<(String, usize)>,
    drawn: bool,
}

const WIDTH: usize = 30;

impl<'a, W: Write> ProgressBar<'a, W> {
    pub fn new(out: &'a mut W, terminal: bool) -> Self {
        ProgressBar { state: RefCell::new(State { out, terminal, last: None, drawn: false }) }
    }

    /// `done` of `total` steps of `label` are read.
    pub fn show(&self, label: &str, done: usize, total: usize) {
        let Ok(mut state) = self.state.try_borrow_mut() else { return };
        let total = total.max(1);
        let done = done.min(total);
        let tenth = done * 10 / total;
        if !state.terminal && state.last.as_ref().is_some_and(|(l, t)| l == label && *t == tenth) {
            return;
        }
        state.last = Some((label.to_string(), tenth));
        let filled = done * WIDTH / total;
        let bar = format!("{}{}", "#".repeat(filled), ".".repeat(WIDTH - filled));
        let line = format!("reading {label} [{bar}] {:>3}% ({done}/{total} steps)", done * 100 / total);
        // A progress line that cannot be written is no reason to stop the backtest.
        let _ = if state.terminal { write!(state.out, "\r\x1b[2K{line}") } else { writeln!(state.out, "{line}") };
        let _ = state.out.flush();
        state.drawn = true;
    }

    /// Ends the bar's line on a terminal.
    pub fn finish(&self) {
        let Ok(mut state) = self.state.try_borrow_mut() else { return };
        if state.terminal && state.drawn {
            let _ = writeln!(state.out);
        }
        state.drawn = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_gets_one_line_per_tenth() {
        let mut out = Vec::new();
        let bar = ProgressBar::new(&mut out, false);
        for done in 0..=100 {
            bar.show("web / latency", done, 100);
        }
        bar.finish();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.lines().count(), 11, "{text}");
        assert!(text.lines().last().unwrap().contains("100% (100/100 steps)"), "{text}");
    }
}
