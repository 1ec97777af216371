//! `watermarkd check` through the real binary: every example in config/ passes, and broken
//! files list all of their problems with file, line, autoscaler and field, and exit 1.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "test code: clippy.toml lets #[test] functions unwrap, index and print, and the helpers beside them do the same"
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn check(files: &[&Path]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_watermarkd")).arg("check").args(files).output().unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn config_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "toml"))
        .collect();
    files.sort();
    files
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// `check`'s output is one line starting with each of `expected`, in order, then `summary`.
fn assert_problems(out: &str, expected: &[String], summary: &str) {
    let lines: Vec<&str> = out.lines().collect();
    for (line, expected) in lines.iter().zip(expected) {
        assert!(line.starts_with(expected.as_str()), "expected a line starting with\n  {expected}\nin:\n{out}");
    }
    assert_eq!(lines.len(), expected.len() + 1, "{out}");
    assert_eq!(lines.last(), Some(&summary));
}

#[test]
fn every_example_in_config_passes_with_a_summary_per_autoscaler() {
    let files = config_files();
    let names: Vec<String> = files.iter().map(|f| f.file_name().unwrap().to_string_lossy().into_owned()).collect();
    for expected in ["behavior.toml", "datadog-latency.toml", "demo.toml", "multi-metric.toml", "prometheus-queue.toml"]
    {
        assert!(names.iter().any(|n| n == expected), "config/{expected} is missing");
    }
    for file in &files {
        let output = check(&[file]);
        let out = stdout(&output);
        assert!(
            output.status.success(),
            "{} failed:\n{out}{}",
            file.display(),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(out.starts_with(&format!("{}: ok, ", file.display())), "{out}");
        // Besides the summaries, at most the warning that a credential is not set here.
        let summaries = out.lines().skip(1).filter(|l| !l.starts_with("  warning: backend "));
        assert!(summaries.clone().all(|l| l.starts_with("  ") && l.contains(" replicas, every ")), "{out}");
    }
}

#[test]
fn summaries_show_what_the_daemon_understood() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let output = check(&[&dir.join("datadog-latency.toml"), &dir.join("demo.toml")]);
    assert!(output.status.success());
    let out = stdout(&output);
    assert!(
        out.contains(
            "  billing: Deployment prod/billing, 4..9 replicas, every 15s, 1 metric (latency via dd: 150m..400m), \
             watermark velocity up 50%/30s down 30%/60s\n"
        ),
        "{out}"
    );
    assert!(out.contains("demo.toml: ok, 3 autoscalers\n"), "{out}");
    assert!(
        out.contains(
            "  daily: Deployment demo/web, 2..20 replicas, every 30s, 1 metric (rps via prom: 60..120 per replica)"
        ),
        "{out}"
    );
    assert!(out.contains("  flapping: "), "{out}");
    assert!(out.contains(", delays up 60s down 120s\n"), "{out}");
}

const BROKEN: &str = r#"[backend.dd]
type = "datadog"
api_key = "do-not-print-me"
app_key_env = "DD_APP_KEY"

[[autoscaler]]
name = "billing"
target = { kind = "Deployment", namespace = "prod" }
min_replicas = 4
max_replicas = 9
algorithm = "avg"
interval = "200ms"

[[autoscaler.metric]]
name = "latency"
backend = "dd"
query = "max:custom.request_duration.max{service:billing}"
high_watermark = "400m"
low_watermark = "500m"
treshold = 3

[[autoscaler.metric]]
name = "latency"
backend = "prom"
query = ""
high_watermark = "lots"
"#;

/// A Prometheus `max_age` on a query whose data the backend cannot date would never fire: said.
#[test]
fn a_prometheus_max_age_that_cannot_see_the_data_age_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "rules.toml",
        r#"
[backend.prom]
type = "prometheus"
url = "http://127.0.0.1:9090"
max_age = "2m"

[[autoscaler]]
name = "queue"
target = { kind = "Deployment", namespace = "jobs", name = "worker" }
max_replicas = 10

[[autoscaler.metric]]
name = "depth"
backend = "prom"
query = 'sum(queue_depth{app="worker"})'
high_watermark = 100
low_watermark = 10

[[autoscaler.metric]]
name = "jobs"
backend = "prom"
query = 'sum(rate(jobs_total{app="worker"}[1m]))'
high_watermark = 100
low_watermark = 10
"#,
    );
    let output = check(&[&file]);
    let out = stdout(&output);
    assert!(output.status.success(), "{out}");
    assert!(out.contains("warning: metric \"jobs\": max_age cannot find its data stale"), "{out}");
    assert!(!out.contains("metric \"depth\": max_age"), "{out}");
}

#[test]
fn a_broken_file_lists_every_problem_with_line_autoscaler_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "broken.toml", BROKEN);
    let output = check(&[&path]);
    assert_eq!(output.status.code(), Some(1));
    let out = stdout(&output);
    let file = path.display().to_string();
    let expected = [
        format!("{file}:3: backend.dd.api_key cannot be written in the rules file: secrets never go inline"),
        format!("{file}:8: autoscaler \"billing\": target.name is required"),
        format!("{file}:11: autoscaler \"billing\": algorithm (\"avg\") must be \"absolute\" or \"average\""),
        format!("{file}:12: autoscaler \"billing\": interval (200ms) must be at least 1s"),
        format!(
            "{file}:19: autoscaler \"billing\": metric \"latency\": low_watermark (0.5) must not exceed high_watermark (0.4)"
        ),
        format!("{file}:20: autoscaler \"billing\": metric \"latency\": treshold is not a known key"),
        format!("{file}:23: autoscaler \"billing\": metric \"latency\": name is already used by another metric of this autoscaler on line 15"),
        format!("{file}:24: autoscaler \"billing\": metric \"latency\": backend (\"prom\") names no [backend.prom] table (defined: dd)"),
        format!("{file}:25: autoscaler \"billing\": metric \"latency\": query must not be empty"),
        format!("{file}:26: autoscaler \"billing\": metric \"latency\": high_watermark must be a number or a quantity: \"lots\" is not a Kubernetes quantity"),
    ];
    assert_problems(&out, &expected, &format!("{file}: 10 problems"));
    assert!(!out.contains("do-not-print-me"), "a secret was echoed:\n{out}");
}

#[test]
fn all_files_are_checked_even_after_a_broken_one() {
    let dir = tempfile::tempdir().unwrap();
    let syntax = write(dir.path(), "syntax.toml", "[[autoscaler]]\nname = \"a\"\nmax_replicas = \n");
    let missing = dir.path().join("missing.toml");
    let good = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/behavior.toml");
    let output = check(&[&syntax, &missing, &good]);
    assert_eq!(output.status.code(), Some(1));
    let out = stdout(&output);
    assert!(out.contains(&format!("{}:3: invalid TOML: ", syntax.display())), "{out}");
    assert!(out.contains(&format!("{}: cannot read the rules file: ", missing.display())), "{out}");
    assert!(out.contains(&format!("{}: ok, 1 autoscaler\n", good.display())), "{out}");
}

#[test]
fn duplicate_autoscalers_and_unknown_sections_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let text = r#"[backend.prom]
type = "prometheus"
url = "http://127.0.0.1:9090"

[[autoscaler]]
name = "web"
target = { kind = "Deployment", namespace = "a", name = "web" }
max_replicas = 3
metric = [{ backend = "prom", query = "up", high_watermark = 1 }]

[[autoscaler]]
name = "web"
target = { kind = "Deployment", namespace = "b", name = "web" }
max_replicas = 3
metric = [{ backend = "prom", query = "up", high_watermark = 1 }]

[autoscalers]
"#;
    let path = write(dir.path(), "dup.toml", text);
    let output = check(&[&path]);
    assert_eq!(output.status.code(), Some(1));
    let out = stdout(&output);
    let file = path.display();
    assert!(
        out.contains(&format!(
            "{file}:12: autoscaler \"web\": name is already used by the autoscaler on line 6; autoscaler names must be unique\n"
        )),
        "{out}"
    );
    assert!(out.contains(&format!("{file}:17: autoscalers is not a known key (did you mean autoscaler?)\n")), "{out}");
}

#[test]
fn run_reports_a_startup_validation_error_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "broken.toml", BROKEN);
    // The rules are read before any cluster is contacted, so no kubeconfig is needed to fail.
    let output = Command::new(env!("CARGO_BIN_EXE_watermarkd"))
        .args(["run", "--no-leader-election", "--config"])
        .arg(&path)
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let err = String::from_utf8(output.stderr).unwrap();
    for problem in ["target.name is required", "backend.dd.api_key cannot be written in the rules file"] {
        assert_eq!(err.matches(problem).count(), 1, "each problem is printed once:\n{err}");
    }
}

/// A Datadog `url` in plain http to another machine would send both keys unencrypted: refused
/// at its line unless the backend allows it; loopback (a local proxy) needs no opt-in.
#[test]
fn a_plain_http_datadog_url_is_refused_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let backend = |url: &str, extra: &str| {
        format!(
            "[backend.dd]\ntype = \"datadog\"\nurl = \"{url}\"\napi_key_env = \"DD_API_KEY\"\napp_key_env = \"DD_APP_KEY\"\n{extra}\n\
             [[autoscaler]]\nname = \"web\"\ntarget = {{ kind = \"Deployment\", namespace = \"prod\", name = \"web\" }}\n\
             min_replicas = 1\nmax_replicas = 10\n\
             [[autoscaler.metric]]\nname = \"cpu\"\nbackend = \"dd\"\nquery = \"avg:cpu{{*}}\"\nhigh_watermark = 80\nlow_watermark = 60\n"
        )
    };
    let plain = write(dir.path(), "plain.toml", &backend("http://dd-proxy.internal:8080", ""));
    let output = check(&[&plain]);
    assert_eq!(output.status.code(), Some(1));
    let out = stdout(&output);
    let expected = format!(
        "{}:3: backend.dd.url (\"http://dd-proxy.internal:8080\") is plain http to dd-proxy.internal: the API and \
         application keys would cross the network unencrypted; use https://, or set allow_insecure_http = true",
        plain.display()
    );
    assert!(out.starts_with(&expected), "expected a line starting with\n  {expected}\nin:\n{out}");

    for (name, url, extra) in [
        ("allowed.toml", "http://dd-proxy.internal:8080", "allow_insecure_http = true"),
        ("loopback.toml", "http://127.0.0.1:8126", ""),
        ("https.toml", "https://dd-proxy.internal", ""),
    ] {
        let path = write(dir.path(), name, &backend(url, extra));
        let output = check(&[&path]);
        assert!(output.status.success(), "{name}: {}", stdout(&output));
    }
}

/// Durations and replica counts beyond what the daemon can use: each once passed `check`, and
/// then overflowed a time addition (killing the daemon) or made every `/scale` write fail.
const UNBOUNDED: &str = r#"[backend.dd]
type = "datadog"
api_key_env = "DD_API_KEY"
app_key_env = "DD_APP_KEY"
bad_query_retry = 9223372036854775807

[[autoscaler]]
name = "billing"
target = { kind = "Deployment", namespace = "prod", name = "billing" }
interval = 9223372036854775807
max_replicas = 2147483648
metric = [{ backend = "dd", query = "avg:load{app:billing}", high_watermark = 10 }]

[[autoscaler]]
name = "billing-copy"
target = { kind = "Deployment", namespace = "prod", name = "billing" }
max_replicas = 9
metric = [{ backend = "dd", query = "avg:load{app:billing}", high_watermark = 10 }]
"#;

#[test]
fn unbounded_durations_replica_counts_and_a_shared_target_are_refused_with_their_position() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "unbounded.toml", UNBOUNDED);
    let output = check(&[&path]);
    assert_eq!(output.status.code(), Some(1));
    let out = stdout(&output);
    let file = path.display();
    let expected = [
        format!("{file}:5: backend.dd.bad_query_retry (9223372036854775807) must be at most 1day (86400s)"),
        format!("{file}:10: autoscaler \"billing\": interval (9223372036854775807) must be at most 1day (86400s)"),
        format!(
            "{file}:11: autoscaler \"billing\": max_replicas (2147483648) must be a whole number from 0 to 2147483647 \
             (the largest replica count Kubernetes takes)"
        ),
        format!(
            "{file}:16: autoscaler \"billing-copy\": target names the same Deployment prod/billing as the autoscaler \
             \"billing\" on line 9: two active autoscalers on one target fight over its replicas"
        ),
    ];
    assert_problems(&out, &expected, &format!("{file}: 4 problems"));
}

/// The 1-based line of the first line of `text` containing `needle`.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines().position(|l| l.contains(needle)).unwrap_or_else(|| panic!("{needle:?} is not in the text")) + 1
}

/// One autoscaler of `MISLEADING`, named `name`, on the Deployment `shop/<target>`, with
/// `extra` after its replica bounds and `tables` after its metric.
fn misleading_autoscaler(name: &str, target: &str, extra: &str, tables: &str) -> String {
    format!(
        "\n[[autoscaler]]\nname = \"{name}\"\ntarget = {{ kind = \"Deployment\", namespace = \"shop\", name = \"{target}\" }}\n\
         min_replicas = 2\nmax_replicas = 9\n{extra}\n[[autoscaler.metric]]\nname = \"rps\"\nbackend = \"prom\"\n\
         query = 'sum(rate(http_requests_total[1m]))'\nhigh_watermark = 100\nlow_watermark = 50\n{tables}"
    )
}

/// REVIEW-4 T4-16: settings that `check` passed though they do nothing, or something else than
/// they say. Each is now an error naming its file, line, autoscaler and field.
#[test]
fn settings_that_do_nothing_or_mislead_are_refused_with_their_position() {
    let mut text = "[backend.prom]\ntype = \"prometheus\"\nurl = \"http://127.0.0.1:9090\"\n".to_string();
    let cron =
        |cron: &str| format!("\n[[autoscaler.schedule]]\ncron = \"{cron}\"\nduration = \"1h\"\nmin_replicas = 4\n");
    text += &misleading_autoscaler("never", "a", "", &format!("{}{}", cron("0 0 31 2 *"), cron("0 0 30 feb *")));
    text += &misleading_autoscaler(
        "capped",
        "b",
        "",
        "\n[[autoscaler.schedule]]\ncron = \"0 8 * * *\"\nduration = \"1h\"\nmin_replicas = 1\nmax_replicas = 1\n",
    );
    text += &misleading_autoscaler("zero", "c", "", "\n[autoscaler.fallback]\naction = \"replicas\"\nreplicas = 0\n");
    text += &misleading_autoscaler(
        "sudden",
        "d",
        "",
        "\n[autoscaler.fallback]\nafter = \"0s\"\naction = \"replicas\"\nreplicas = 3\nscale_down = true\n",
    );
    text += &misleading_autoscaler("forever", "e", "paused_until = \"9999-12-31T23:59:59Z\"\n", "");
    text += &misleading_autoscaler("upper", "WEB", "", "");
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "misleading.toml", &text);
    let output = check(&[&path]);
    let out = stdout(&output);
    assert_eq!(output.status.code(), Some(1), "{out}");
    let file = path.display();
    let line = |needle: &str| line_of(&text, needle);
    let expected = [
        format!(
            "{file}:{}: autoscaler \"never\": schedule[0].cron (\"0 0 31 2 *\") never fires: February has no day 31",
            line("0 0 31 2")
        ),
        format!(
            "{file}:{}: autoscaler \"never\": schedule[1].cron (\"0 0 30 feb *\") never fires: February has no day 30",
            line("0 0 30 feb")
        ),
        format!(
            "{file}:{}: autoscaler \"capped\": schedule[0].max_replicas (1) must not be below min_replicas (2): the \
             rule never goes below its own floor, so this cap would do nothing",
            line("max_replicas = 1")
        ),
        format!(
            "{file}:{}: autoscaler \"zero\": fallback.replicas (0) must not be below min_replicas (2): the fallback \
             would run 2",
            line("replicas = 0")
        ),
        format!(
            "{file}:{}: autoscaler \"sudden\": fallback.after (0s) must be at least the default interval (15s) with \
             scale_down = true: shorter, one or two failed reads in a row scale down to the count",
            line("after = \"0s\"")
        ),
        format!(
            "{file}:{}: autoscaler \"forever\": paused_until (\"9999-12-31T23:59:59Z\") is past the latest instant \
             watermarkd supports (9999-12-30T22:00:00Z)",
            line("9999-12-31")
        ),
        format!(
            "{file}:{}: autoscaler \"upper\": target.name (\"WEB\") is not a valid Deployment name: a DNS subdomain \
             (RFC 1123) of lower-case letters, digits, '-' and '.', starting and ending with a letter or digit, at \
             most 253 characters",
            line("name = \"WEB\"")
        ),
    ];
    assert_problems(&out, &expected, &format!("{file}: 7 problems"));
}

/// A pause that has ended is no error (a file that was valid stays valid as time passes, and a
/// reload is not refused for it), but `check` says so instead of "paused until" a past instant.
#[test]
fn a_pause_in_the_past_is_a_warning_not_an_error() {
    let mut text = "[backend.prom]\ntype = \"prometheus\"\nurl = \"http://127.0.0.1:9090\"\n".to_string();
    text += &misleading_autoscaler("resumed", "web", "paused_until = \"2000-01-01T00:00:00Z\"\n", "");
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "paused.toml", &text);
    let output = check(&[&path]);
    let out = stdout(&output);
    assert!(output.status.success(), "{out}");
    assert!(!out.contains("paused until"), "{out}");
    assert!(
        out.contains(
            "    warning: paused_until (2000-01-01T00:00:00Z) has passed: the autoscaler is not paused (remove the \
             line, or set a time to come)\n"
        ),
        "{out}"
    );
}

/// Newcomer #17: cron takes Kubernetes CronJob's descriptors (`@daily`, ...), and the summary
/// of a scheduled autoscaler says when each window next opens, in its own time zone.
#[test]
fn cron_descriptors_are_read_and_the_summary_says_when_each_window_next_opens() {
    let windows = "\n[[autoscaler.schedule]]\nname = \"new-year\"\ncron = \"@yearly\"\nduration = \"1h\"\nmin_replicas = 4\n\
                   \n[[autoscaler.schedule]]\nname = \"month\"\ncron = \"@monthly\"\nduration = \"1h\"\nmin_replicas = 4\n\
                   time_zone = \"Asia/Tokyo\"\n\
                   \n[[autoscaler.schedule]]\nname = \"nightly\"\ncron = \"@midnight\"\nduration = \"1h\"\nmin_replicas = 3\n\
                   \n[[autoscaler.schedule]]\ncron = \"@hourly\"\nduration = \"5m\"\nmin_replicas = 3\n\
                   \n[[autoscaler.schedule]]\ncron = \"@weekly\"\nduration = \"5m\"\nmin_replicas = 3\n\
                   \n[[autoscaler.schedule]]\ncron = \"@annually\"\nduration = \"5m\"\nmin_replicas = 3\n\
                   \n[[autoscaler.schedule]]\ncron = \"@daily\"\nduration = \"5m\"\nmin_replicas = 3\n";
    let text = format!(
        "[backend.prom]\ntype = \"prometheus\"\nurl = \"http://127.0.0.1:9090\"\n{}",
        misleading_autoscaler("web", "web", "", windows)
    );
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "descriptors.toml", &text);
    let output = check(&[&path]);
    let out = stdout(&output);
    assert!(output.status.success(), "{out}");
    // When they next open, computed here from the same clock.
    let now = jiff::Zoned::now();
    let utc = now.with_time_zone(jiff::tz::TimeZone::UTC);
    let new_year = jiff::civil::date(utc.year() + 1, 1, 1).at(0, 0, 0, 0).to_zoned(jiff::tz::TimeZone::UTC).unwrap();
    let tokyo = now.with_time_zone(jiff::tz::TimeZone::get("Asia/Tokyo").unwrap());
    let first = tokyo.date().first_of_month().checked_add(jiff::Span::new().months(1)).unwrap();
    let month = first.at(0, 0, 0, 0).to_zoned(tokyo.time_zone().clone()).unwrap();
    let shown = |z: &jiff::Zoned, zone: &str| format!("{} {zone}", z.strftime("%a %Y-%m-%d %H:%M"));
    // A window open as `check` runs says so first ("open now, "), then when it opens next.
    let said = |window: &str| {
        let at = out.find(&format!(" {window} (")).unwrap_or_else(|| panic!("{window} is not in:\n{out}"));
        let rest = &out[at + 1..];
        rest[..rest.find(')').unwrap() + 1].replace("open now, ", "")
    };
    assert_eq!(said("new-year"), format!("new-year (floor 4, next opens {})", shown(&new_year, "UTC")), "{out}");
    assert_eq!(said("month"), format!("month (floor 4, next opens {})", shown(&month, "Asia/Tokyo")), "{out}");
    for window in ["nightly", "schedule[3]", "schedule[4]", "schedule[5]", "schedule[6]"] {
        assert!(said(window).contains(", next opens "), "{window}: {out}");
    }

    // Anything else after an @ is refused with the descriptors named.
    let text = text.replace("@weekly", "@every 1h");
    let path = write(dir.path(), "every.toml", &text);
    let output = check(&[&path]);
    let out = stdout(&output);
    assert_eq!(output.status.code(), Some(1), "{out}");
    assert!(
        out.contains(&format!(
            "{}:{}: autoscaler \"web\": schedule[4].cron (\"@every 1h\") must have five fields (minute hour \
             day-of-month month day-of-week), such as \"0 8 * * 1-5\", or be one of @yearly, @annually, @monthly, \
             @weekly, @daily, @midnight and @hourly",
            path.display(),
            line_of(&text, "@every")
        )),
        "{out}"
    );
}

/// Newcomer #10: a Prometheus query that is not PromQL is found offline, by `check` and when the
/// daemon loads its rules, instead of at run time as "no data". Each problem names the file,
/// line, autoscaler, metric and field, with what is wrong and where in the query.
#[test]
fn a_query_that_is_not_promql_is_refused_by_check_and_by_the_daemon() {
    let text = format!(
        "[backend.prom]\ntype = \"prometheus\"\nurl = \"http://127.0.0.1:9090\"\n{}{}",
        misleading_autoscaler("unbalanced", "a", "", "")
            .replace("sum(rate(http_requests_total[1m]))", "sum(rate(http_requests_total{service=\"a\"[1m])"),
        misleading_autoscaler("dangling", "b", "", "").replace("[1m]))'", "[1m])) /'"),
    );
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "promql.toml", &text);
    let output = check(&[&path]);
    let out = stdout(&output);
    assert_eq!(output.status.code(), Some(1), "{out}");
    let file = path.display();
    let expected = [
        format!(
            "{file}:{}: autoscaler \"unbalanced\": metric \"rps\": query is not valid PromQL: the '[' at character 41 \
             is inside the label matchers that '{{' opened at character 29: is a '}}' missing?",
            line_of(&text, "service=")
        ),
        format!(
            "{file}:{}: autoscaler \"dangling\": metric \"rps\": query is not valid PromQL: the '/' at character 36 \
             has nothing after it",
            line_of(&text, "/'")
        ),
    ];
    assert_problems(&out, &expected, &format!("{file}: 2 problems"));

    // The daemon refuses the same file when it loads it, before it contacts any cluster.
    let output = Command::new(env!("CARGO_BIN_EXE_watermarkd"))
        .args(["run", "--no-leader-election", "--config"])
        .arg(&path)
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let err = String::from_utf8(output.stderr).unwrap();
    assert!(err.contains("metric \"rps\": query is not valid PromQL: the '[' at character 41"), "{err}");
}
