//! The status board at 10,000 autoscalers, each with a full hour of history at the default
//! 15 s interval (241 samples, and up to a block more): the memory it holds, and what the API
//! and the page cost to answer from it. Decisions come from the engine, as in the daemon; the
//! board is filled through its public interface.
//!
//!     cargo bench --bench status              # 10,000 autoscalers, steady and moving values
//!     cargo bench --bench status -- 1000      # another count
//!     cargo bench --bench status -- 10000 moving  # one case
//!
//! A benchmark, not a test: it prints a report (BENCHMARKS.md quotes it).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout, reason = "a benchmark's report")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use watermarkd::adapters::status::board::ListQuery;
use watermarkd::adapters::status::Board;
use watermarkd::domain::outcome::{Identity, Ledger, Outcome, SeriesLabels};
use watermarkd_engine::{decide, Action, Reading, State, Target, Timestamp};

const INTERVAL: i64 = 15;
/// An hour at the interval, and a block more: what a full ring holds at most.
const EVALUATIONS: i64 = 241 + 31;

/// Resident memory of this process, in MiB.
fn resident_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse().ok())
        .unwrap();
    kb / 1024.0
}

/// Bytes the allocator has handed out and not had back (glibc's `mallinfo2`): the live heap,
/// without what fragmentation keeps resident.
fn live_heap_mib() -> f64 {
    // SAFETY: mallinfo2 only reads the allocator's counters and returns them by value.
    #[expect(unsafe_code, reason = "glibc's mallinfo2 has no safe binding")]
    let info = unsafe { libc::mallinfo2() };
    (info.uordblks + info.hblkhd) as f64 / 1_048_576.0
}

fn identity(i: usize) -> Identity {
    let labels = SeriesLabels::deployment(&format!("web-{i}"), "prod", false);
    Identity::rules_file(Arc::new(labels), &["dd"], INTERVAL as u64, (1, 20))
}

/// Fills a board: every autoscaler evaluated `EVALUATIONS` times. `moving`: the value changes
/// at every evaluation (the worst case of the encoding); else it holds.
fn fill(n: usize, moving: bool) -> (Arc<Ledger>, Duration) {
    let rule = watermarkd::domain::rules::rule_from_json(&json!({
        "min_replicas": 1, "max_replicas": 20, "algorithm": "average",
        "metric": [{ "name": "p99_latency", "query": "q", "high_watermark": 0.5, "low_watermark": 0.2 }]
    }))
    .unwrap();
    let ledger = Arc::new(Ledger::new(Duration::from_secs(3600)));
    let identities: Vec<Identity> = (0..n).map(identity).collect();
    for identity in &identities {
        ledger.admit(identity.clone());
    }
    let mut recording = Duration::ZERO;
    for step in 0..EVALUATIONS {
        let now = Timestamp::from_unix_millis((1_800_000_000 + step * INTERVAL) * 1000);
        for (i, identity) in identities.iter().enumerate() {
            let value = if moving { 1.2 + ((step as usize * 7 + i) % 13) as f64 * 0.01 } else { 1.3 };
            let reading = [Reading::Value { value, at: now }];
            let target = Target { spec_replicas: 4, status_replicas: Some(4), ready_replicas: Some(4) };
            let decision = decide(&rule, target, &reading, &State::default(), now);
            let scaled = decision.action != Action::Hold;
            let started = Instant::now();
            ledger.record(&identity.id, &identity.labels, Outcome::of_decision(decision, &rule, scaled));
            recording += started.elapsed();
        }
    }
    (ledger, recording)
}

fn timed<T>(runs: u32, mut f: impl FnMut() -> T) -> (T, Duration) {
    let started = Instant::now();
    let mut out = f();
    for _ in 1..runs {
        out = f();
    }
    (out, started.elapsed() / runs)
}

fn report(n: usize, moving: bool) {
    let (before, heap_before) = (resident_mib(), live_heap_mib());
    let (ledger, recording) = fill(n, moving);
    let (after, heap_after) = (resident_mib(), live_heap_mib());
    let board = Board::new(Arc::clone(&ledger));
    let records = n as u32 * EVALUATIONS as u32;
    println!(
        "\n== {n} autoscalers, {} values, {EVALUATIONS} evaluations each ==",
        if moving { "moving" } else { "steady" }
    );
    println!(
        "history: {:.1} MiB in all, {:.0} bytes per autoscaler; board and history resident: {:.1} MiB ({:.1} KiB per autoscaler)",
        ledger.history_bytes() as f64 / 1_048_576.0,
        ledger.history_bytes() as f64 / n as f64,
        after - before,
        (after - before) * 1024.0 / n as f64
    );
    println!(
        "live heap of the board: {:.1} MiB ({:.2} KiB per autoscaler)",
        heap_after - heap_before,
        (heap_after - heap_before) * 1024.0 / n as f64
    );
    println!(
        "record (explanation, history, last decision): {:.2} us each",
        recording.as_secs_f64() * 1e6 / f64::from(records)
    );
    let first = ListQuery { limit: 100, ..ListQuery::default() };
    let (page, list_time) = timed(20, || board.list(&first));
    let (_, search_time) =
        timed(20, || board.list(&ListQuery { search: "web-99".into(), limit: 100, ..ListQuery::default() }));
    let (_, last_page) =
        timed(20, || board.list(&ListQuery { offset: n.saturating_sub(100), limit: 100, ..ListQuery::default() }));
    let (detail, detail_time) = timed(20, || board.detail("file/web-7").unwrap());
    let json = serde_json::to_vec(&detail).unwrap();
    let page_json = serde_json::to_vec(&page).unwrap();
    println!(
        "list, first 100 rows: {:.2} ms ({} kB of JSON); searched: {:.2} ms; last page: {:.2} ms",
        list_time.as_secs_f64() * 1e3,
        page_json.len() / 1000,
        search_time.as_secs_f64() * 1e3,
        last_page.as_secs_f64() * 1e3
    );
    println!(
        "one autoscaler in full: {:.3} ms, {} samples, {} kB of JSON",
        detail_time.as_secs_f64() * 1e3,
        detail.history.samples.len(),
        json.len() / 1000
    );
}

/// Each case in a process of its own, so that one case's freed memory is not the next one's.
fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let n = args.first().map_or(10_000, |a| a.parse().expect("a count"));
    match args.get(1).map(String::as_str) {
        Some("steady") => report(n, false),
        Some("moving") => report(n, true),
        _ => {
            for case in ["steady", "moving"] {
                let me = std::env::current_exe().expect("this benchmark's path");
                let status = std::process::Command::new(me).args([n.to_string().as_str(), case]).status().expect("run");
                assert!(status.success(), "the {case} case failed");
            }
        }
    }
}
