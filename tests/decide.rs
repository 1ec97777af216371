//! `watermarkd decide` through the real binary: the documented JSON contract.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "test code: clippy.toml lets #[test] functions unwrap, index and print, and the helpers beside them do the same"
)]

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::Value;

fn decide(input: &str) -> (bool, Vec<Value>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_watermarkd"))
        .arg("decide")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let lines = String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    (out.status.success(), lines)
}

#[test]
fn the_documented_examples_decide_as_described() {
    let input =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/examples/decide-input.jsonl")).unwrap();
    let (ok, out) = decide(&input);
    assert!(ok);
    assert_eq!(out.len(), 4);

    // 1: above the band, window open: 10 -> 13.
    assert_eq!(out[0]["action"], "scale_up");
    assert_eq!(out[0]["replicas"], 13);
    assert_eq!(out[0]["write"], true);
    assert_eq!(out[0]["metrics"][0]["position"], "above");
    assert_eq!(out[0]["metrics"][0]["age_seconds"], 30.0);
    assert_eq!(out[0]["new_state"]["last_scale_time"], "2024-05-01T12:00:00Z");
    assert_eq!(
        out[0]["reason"],
        "latency above high watermark: 0.52 > 0.4 (tolerance 1%); proposing 13: scaling 10 -> 13"
    );
    // 2: 14 proposed, capped by the 30% up limit to 13.
    assert_eq!(out[1]["proposal"], 14);
    assert_eq!(out[1]["replicas"], 13);
    assert_eq!(out[1]["limit"], "upscale_capping");
    // 3: inside the forbidden window: hold, 40 s left.
    assert_eq!(out[2]["action"], "hold");
    assert_eq!(out[2]["timing"]["upscale_window_seconds_left"], 40.0);
    assert_eq!(out[2]["new_state"]["last_scale_time"], "2024-05-01T11:59:40Z");
    // 4: no data: hold, never 0.
    assert_eq!(out[3]["guard"], "no_data");
    assert_eq!(out[3]["replicas"], 10);
    assert_eq!(out[3]["proposal"], Value::Null);
}

#[test]
fn new_state_chains_into_the_next_evaluation() {
    let first = r#"{"rule":{"max_replicas":20,"upscale_forbidden_window":"60s","metric":[{"name":"cpu","high_watermark":0.8,"low_watermark":0.5}]},
        "now":"2024-05-01T12:00:00Z","target":{"spec_replicas":4},"readings":{"cpu":{"value":0.95,"at":"2024-05-01T12:00:00Z"}}}"#;
    let (_, out) = decide(first);
    assert_eq!(out[0]["replicas"], 5);
    let mut second: Value = serde_json::from_str(first).unwrap();
    second["now"] = "2024-05-01T12:00:30Z".into();
    second["target"]["spec_replicas"] = 5.into();
    second["state"] = out[0]["new_state"].clone();
    let (_, out) = decide(&second.to_string());
    assert_eq!(out[0]["action"], "hold");
    assert_eq!(out[0]["timing"]["upscale_window_seconds_left"], 30.0);
}

#[test]
fn bad_documents_get_an_error_line_and_the_others_still_run() {
    let good = r#"{"rule":{"max_replicas":5,"metric":[{"name":"m","high_watermark":1}]},"now":0,"target":{"spec_replicas":2},"readings":{"m":{"value":3,"at":0}}}"#;
    let bad_rule = r#"{"rule":{"max_replicas":5,"min_replicas":9,"metric":[{"name":"m","high_watermark":1,"low_watermark":2}]},"now":0,"target":{"spec_replicas":2},"readings":{"m":{"value":3,"at":0}}}"#;
    let missing_reading = r#"{"rule":{"max_replicas":5,"metric":[{"name":"m","high_watermark":1}]},"now":0,"target":{"spec_replicas":2},"readings":{}}"#;
    let value_without_time = r#"{"rule":{"max_replicas":5,"metric":[{"name":"m","high_watermark":1}]},"now":0,"target":{"spec_replicas":2},"readings":{"m":{"value":3}}}"#;
    let (ok, out) = decide(&[good, bad_rule, missing_reading, value_without_time, good].join("\n"));
    assert!(!ok);
    assert_eq!(out.len(), 5);
    assert_eq!(out[0]["replicas"], 3);
    let err = out[1]["error"].as_str().unwrap();
    assert!(err.contains("min_replicas") && err.contains("low_watermark"), "{err}");
    assert!(out[2]["error"].as_str().unwrap().contains("no reading for metric \"m\""));
    assert!(out[3]["error"].as_str().unwrap().contains("\"at\""));
    assert_eq!(out[4]["replicas"], 3);
}

#[test]
fn a_syntax_error_stops_the_stream_with_exit_1() {
    let (ok, out) = decide("{\"rule\": ");
    assert!(!ok);
    assert!(out[0]["error"].as_str().unwrap().contains("not valid JSON"));
}

#[test]
fn a_recommenders_reply_is_decided_against_its_bounds() {
    // The rule's one reading is named as the Datadog controller names a recommender.
    let rule = r#"{"max_replicas":20,"recommender":{"target_type":"cpu","high_watermark":0.8,"low_watermark":0.6}}"#;
    let input = |reading: &str| {
        format!(
            r#"{{"rule":{rule},"now":0,"target":{{"spec_replicas":6}},"readings":{{"recommender{{targetType:cpu}}":{reading}}}}}"#
        )
    };
    // spec 6 is under the lower bound 7: above the band.
    let (ok, out) = decide(&input(r#"{"replicas":8,"lower_bound":7,"upper_bound":9,"observed":0.93}"#));
    assert!(ok, "{out:?}");
    assert_eq!((out[0]["replicas"].as_u64(), out[0]["metrics"][0]["position"].as_str()), (Some(8), Some("above")));
    assert_eq!(out[0]["metrics"][0]["value"], 0.93);
    // spec 6 between the bounds 5..9: inside, and the move is a convergence step.
    let (_, out) = decide(&input(r#"{"replicas":8,"lower_bound":5,"upper_bound":9}"#));
    assert_eq!(
        (out[0]["metrics"][0]["position"].as_str(), out[0]["converging"].as_bool()),
        (Some("inside"), Some(true))
    );
    // Bounds belong to a recommendation only.
    let (ok, out) = decide(&input(r#"{"value":0.9,"at":0,"lower_bound":7}"#));
    assert!(!ok);
    assert!(out[0]["error"].as_str().unwrap().contains("go with \"replicas\" only"), "{out:?}");
}
