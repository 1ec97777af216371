//! Tests of the rules file as a whole: what a valid file yields, and each validation rule;
//! backends and metrics have their own files.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;
use watermarkd_engine::{Algorithm, ConvergeTowards, Decimal, PolicyKind, SelectPolicy, Velocity};

use std::collections::BTreeMap;
use std::sync::Arc;

use super::*;

/// 2026-11-23T00:00:00Z, a Monday: the instant the summaries are written at.
const NOW: watermarkd_engine::Timestamp = watermarkd_engine::Timestamp::from_unix_millis(1_795_392_000_000);

/// The summary at `NOW`.
fn summary(autoscaler: &Autoscaler) -> String {
    super::check::summary(autoscaler, NOW)
}

mod backends;
mod metrics;
mod schedules;

const BACKENDS: &str = r#"
[backend.dd]
type = "datadog"
api_key_env = "DD_API_KEY"
app_key_file = "/etc/dd/app-key"

[backend.prom]
type = "prometheus"
url = "http://127.0.0.1:9090"
"#;

const BILLING: &str = r#"
[[autoscaler]]
name = "billing"
target = { kind = "Deployment", namespace = "prod", name = "billing" }
max_replicas = 9
min_replicas = 4

[[autoscaler.metric]]
name = "latency"
backend = "dd"
query = "max:custom.request_duration.max{service:billing}"
high_watermark = "400m"
low_watermark = "150m"
"#;

fn d(text: &str) -> Decimal {
    Decimal::parse(text).unwrap()
}

fn parse(text: &str) -> RulesFile {
    parse_rules(text, "rules.toml").unwrap_or_else(|e| panic!("{e}"))
}

/// The problems of an invalid file, each displayed as `check` prints it.
fn problems(text: &str) -> Vec<String> {
    match parse_rules(text, "rules.toml") {
        Ok(_) => panic!("expected problems in:\n{text}"),
        Err(err) => err.problems.iter().map(|p| p.in_file("rules.toml").to_string()).collect(),
    }
}

/// The line number (1-based) of the first line of `text` containing `needle`.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines().position(|l| l.contains(needle)).unwrap() + 1
}

fn assert_has(problems: &[String], expected: &str) {
    assert!(problems.iter().any(|p| p == expected), "missing:\n  {expected}\nin:\n  {}", problems.join("\n  "));
}

#[test]
fn a_valid_file_yields_backends_targets_and_rules() {
    let rules = parse(&format!("{BACKENDS}{BILLING}"));
    assert_eq!(
        rules.backends["dd"],
        Backend::Datadog(DatadogBackend {
            site: "datadoghq.com".into(),
            url: None,
            api_key: SecretSource::Env("DD_API_KEY".into()),
            app_key: SecretSource::File(PathBuf::from("/etc/dd/app-key")),
            window: Duration::from_secs(300),
            max_age: None,
            timeout: Duration::from_secs(10),
            max_in_flight: 4,
            bad_query_retry: Duration::from_secs(600),
            allow_insecure_http: false,
            namespace_budget_percent: 100,
            fold_queries: true,
        })
    );
    assert_eq!(
        rules.backends["prom"],
        Backend::Prometheus(PrometheusBackend {
            url: "http://127.0.0.1:9090".into(),
            timeout: Duration::from_secs(10),
            max_in_flight: 8,
            max_age: None,
            tenant: None,
            headers: BTreeMap::new(),
            params: BTreeMap::new(),
            basic_auth: None,
            bearer_token: None,
            tls: TlsSettings::default(),
            fold_queries: true,
            fold_max_regex_bytes: 4096,
            fold_max_members: None,
        })
    );
    let billing = rules.autoscaler("billing").unwrap();
    assert!(rules.autoscaler("nope").is_none());
    assert_eq!(
        billing.target,
        TargetRef {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            namespace: "prod".into(),
            name: "billing".into()
        }
    );
    assert_eq!(billing.interval(crate::domain::rules::DEFAULT_INTERVAL), Duration::from_secs(15));
    assert_eq!(billing.rule.min_replicas(), 4);
    assert_eq!(billing.rule.max_replicas(), 9);
    assert_eq!(billing.rule.algorithm(), Algorithm::Absolute);
    let metric = &billing.rule.metrics()[0];
    assert_eq!(
        (metric.name.as_str(), &metric.low_watermark, &metric.high_watermark),
        ("latency", &d("0.15"), &d("0.4"))
    );
    assert_eq!(
        billing.metrics,
        [MetricSource {
            resource: None,
            name: "latency".into(),
            backend: "dd".into(),
            query: "max:custom.request_duration.max{service:billing}".into(),
            reducer: None,
        }]
    );
}

#[test]
fn every_knob_reaches_the_engine_rule() {
    let text = format!(
        r#"{BACKENDS}
[[autoscaler]]
name = "all"
target = {{ api_version = "argoproj.io/v1alpha1", kind = "Rollout", namespace = "ns", name = "r" }}
interval = "1m30s"
min_replicas = 2
max_replicas = 20
algorithm = "average"
tolerance = "50m"
scale_up_limit_factor = 29
scale_down_limit_factor = 30.5
upscale_forbidden_window = 30
downscale_forbidden_window = "2m"
upscale_delay_above_watermark = "10s"
downscale_delay_below_watermark = "1h"
replica_modulo = 2
converge_towards_watermark = "low"
tolerate_zero = true
min_available_replica_percentage = 50
dry_run = true

[[autoscaler.metric]]
backend = "prom"
query = "sum(rate(requests_total[1m]))"
high_watermark = 1.5e2
low_watermark = "6e1"
max_age = "5m"
reducer = "sum"
"#
    );
    let rules = parse(&text);
    let a = rules.autoscaler("all").unwrap();
    assert_eq!(&*a.target.api_version, "argoproj.io/v1alpha1");
    assert_eq!(a.interval_set, Some(Duration::from_secs(90)));
    let rule = &a.rule;
    assert_eq!(rule.algorithm(), Algorithm::Average);
    assert_eq!(rule.upscale_tolerance(), &d("0.05"));
    let Velocity::Watermark(v) = rule.velocity() else { panic!("expected watermark velocity") };
    assert_eq!(v.scale_up_limit_factor, d("29"));
    assert_eq!(v.scale_down_limit_factor, d("30.5"));
    assert_eq!(v.upscale_forbidden_window, Duration::from_secs(30));
    assert_eq!(v.downscale_forbidden_window, Duration::from_secs(120));
    assert_eq!(rule.upscale_delay_above_watermark(), Duration::from_secs(10));
    assert_eq!(rule.downscale_delay_below_watermark(), Duration::from_secs(3600));
    assert_eq!(rule.replica_modulo(), 2);
    assert_eq!(rule.converge_towards_watermark(), Some(ConvergeTowards::Low));
    assert!(rule.tolerate_zero());
    assert_eq!(rule.min_available_replica_percentage(), 50);
    assert!(rule.dry_run());
    // Without a name, the query names the metric.
    assert_eq!(rule.metrics()[0].name, "sum(rate(requests_total[1m]))");
    assert_eq!(rule.metrics()[0].high_watermark, d("150"));
    assert_eq!(rule.metrics()[0].low_watermark, d("60"));
    assert_eq!(rule.metrics()[0].max_age, Some(Duration::from_secs(300)));
    assert_eq!(a.metrics[0].reducer, Some(Reducer::Sum));
}

#[test]
fn a_behavior_block_reaches_the_engine_rule() {
    let text = format!(
        r#"{BACKENDS}{BILLING}
[autoscaler.behavior.scale_down]
stabilization_window = "10m"
select_policy = "min"
policies = [{{ type = "percent", value = 10, period = "1m" }}, {{ type = "pods", value = 2, period = 60 }}]
"#
    );
    let rules = parse(&text);
    let Velocity::Behavior(b) = rules.autoscalers[0].rule.velocity() else { panic!("expected behavior") };
    assert_eq!(b.scale_down.stabilization_window, Duration::from_secs(600));
    assert_eq!(b.scale_down.select_policy, SelectPolicy::Min);
    assert_eq!(b.scale_down.policies[1].kind, PolicyKind::Pods);
    assert_eq!(b.scale_down.policies[1].period, Duration::from_secs(60));
    // The direction left out keeps the HPA defaults.
    assert_eq!(b.scale_up.policies.len(), 2);
}

#[test]
fn an_empty_file_has_no_autoscalers() {
    let rules = parse("");
    assert!(rules.autoscalers.is_empty() && rules.backends.is_empty());
}

#[test]
fn syntax_errors_are_one_problem_with_a_line() {
    let p = problems("[[autoscaler]]\nname = \"a\"\nmax_replicas = = 3\n");
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(p[0].starts_with("rules.toml:3: invalid TOML: "), "{p:?}");
}

#[test]
fn unknown_keys_are_named_with_their_line_everywhere() {
    let text = format!(
        r#"colour = "blue"
{BACKENDS}{BILLING}
hihg_watermark = 3
[autoscaler.behavior.scale_up]
select = "max"
policies = [{{ type = "pods", value = 1, period = "15s", burst = 2 }}]
"#
    )
    .replace("app_key_file", "app_key_file = \"/x\"\nsite_url = \"x\"\n#");
    let p = problems(&text);
    assert_has(
        &p,
        &format!(
            "rules.toml:{}: colour is not a known key (known keys: backend, autoscaler)",
            line_of(&text, "colour")
        ),
    );
    assert_has(
        &p,
        &format!(
            "rules.toml:{}: autoscaler \"billing\": metric \"latency\": hihg_watermark is not a known key (did you mean high_watermark?)",
            line_of(&text, "hihg")
        ),
    );
    assert_has(
        &p,
        &format!(
            "rules.toml:{}: autoscaler \"billing\": behavior.scale_up.select is not a known key (did you mean select_policy?)",
            line_of(&text, "select =")
        ),
    );
    assert!(p.iter().any(|l| l.contains("behavior.scale_up.policies[0].burst is not a known key")), "{p:?}");
    assert!(p.iter().any(|l| l.contains("backend.dd.site_url is not a known key")), "{p:?}");
}

#[test]
fn missing_required_keys_are_reported_at_their_table() {
    let text = "[backend.p]\ntype = \"prometheus\"\n\n[[autoscaler]]\ntarget = { kind = \"Deployment\" }\n\n[[autoscaler.metric]]\nname = \"m\"\nhigh_watermark = 1\n";
    let p = problems(text);
    assert_has(&p, "rules.toml:1: backend.p.url is required");
    assert_has(&p, "rules.toml:4: autoscaler[0].name is required");
    assert_has(&p, "rules.toml:4: autoscaler[0].max_replicas is required");
    assert_has(&p, "rules.toml:5: autoscaler[0].target.namespace is required");
    assert_has(&p, "rules.toml:5: autoscaler[0].target.name is required");
    assert_has(&p, "rules.toml:7: autoscaler[0].metric \"m\": query is required");
    assert_has(&p, "rules.toml:7: autoscaler[0].metric \"m\": backend is required");
    assert_eq!(p.len(), 7, "{p:?}");
}

#[test]
fn duplicate_names_are_reported_with_the_first_line() {
    let text = format!("{BACKENDS}{BILLING}{BILLING}");
    let p = problems(&text);
    let first = line_of(&text, "name = \"billing\"");
    let second = first + BILLING.matches('\n').count();
    assert_eq!(
        p,
        [format!(
            "rules.toml:{second}: autoscaler \"billing\": name is already used by the autoscaler on line {first}; autoscaler names must be unique"
        )]
    );

    let text = format!("{BACKENDS}{BILLING}\n[[autoscaler.metric]]\nname = \"latency\"\nbackend = \"prom\"\nquery = \"q\"\nhigh_watermark = 1\n");
    let p = problems(&text);
    let first = line_of(&text, "name = \"latency\"");
    let second = text.lines().enumerate().filter(|(_, l)| l.contains("name = \"latency\"")).nth(1).unwrap().0 + 1;
    assert_eq!(
        p,
        [format!(
            "rules.toml:{second}: autoscaler \"billing\": metric \"latency\": name is already used by another metric of this autoscaler on line {first}; metric names must be unique"
        )]
    );
}

#[test]
fn a_shadow_rule_needs_one_active_autoscaler_on_its_target() {
    let shadow = BILLING.replacen("name = \"billing\"\n", "name = \"billing-next\"\nshadow = true\n", 1);
    let rules = parse(&format!("{BACKENDS}{BILLING}{shadow}"));
    let flags: Vec<(&str, bool)> = rules.autoscalers.iter().map(|a| (&*a.name, a.shadow)).collect();
    assert_eq!(flags, [("billing", false), ("billing-next", true)]);
    assert!(summary(&rules.autoscalers[1])
        .ends_with(", shadow: compared with the active rule on its target, never written"));

    let text = format!("{BACKENDS}{shadow}");
    let line = line_of(&text, "shadow = true");
    assert_eq!(
        problems(&text),
        [format!(
            "rules.toml:{line}: autoscaler \"billing-next\": shadow is true, but no active autoscaler in this file \
             targets Deployment prod/billing: a shadow rule runs beside the active rule on its target and is compared \
             with it"
        )]
    );
    // Another target, even in the same namespace, is not a partner.
    let elsewhere = BILLING.replace("name = \"billing\" }", "name = \"checkout\" }");
    assert_eq!(problems(&format!("{BACKENDS}{elsewhere}{shadow}")).len(), 1);

    let twin = BILLING.replace("name = \"billing\"\n", "name = \"billing-2\"\n");
    let text = format!("{BACKENDS}{BILLING}{twin}{shadow}");
    let p = problems(&text);
    assert_eq!(p.len(), 2, "the twin itself, and the shadow's pairing: {p:?}");
    assert!(p[0].contains("autoscaler \"billing-2\": target names the same Deployment prod/billing"), "{p:?}");
    assert!(p[1].contains("several active autoscalers target Deployment prod/billing (billing, billing-2)"), "{p:?}");

    let text = format!("{BACKENDS}{BILLING}{}", shadow.replace("shadow = true", "shadow = true\ninterval = \"30s\""));
    let p = problems(&text);
    assert!(
        p[0].contains("autoscaler \"billing-next\": interval cannot differ from the active autoscaler \"billing\"'s"),
        "{p:?}"
    );

    let text = format!("{BACKENDS}{BILLING}{}", shadow.replace("shadow = true", "shadow = \"yes\""));
    assert!(problems(&text)[0].contains("shadow must be true or false"), "{:?}", problems(&text));
}

#[test]
fn two_active_autoscalers_on_one_object_are_refused_naming_both() {
    let twin = BILLING.replace("name = \"billing\"\n", "name = \"billing-2\"\n");
    let text = format!("{BACKENDS}{BILLING}{twin}");
    let first = line_of(&text, "target = ");
    let second = first + BILLING.matches('\n').count();
    assert_eq!(
        problems(&text),
        [format!(
            "rules.toml:{second}: autoscaler \"billing-2\": target names the same Deployment prod/billing as the \
             autoscaler \"billing\" on line {first}: two active autoscalers on one target fight over its replicas and \
             overwrite each other's saved state (remove one, or make one a shadow rule with shadow = true)"
        )]
    );
    // Another version of the same API group reaches the same object.
    let beta = twin.replace("target = { kind", "target = { api_version = \"apps/v1beta2\", kind");
    assert_eq!(problems(&format!("{BACKENDS}{BILLING}{beta}")).len(), 1);
    // Another kind, namespace or name is another object; a shadow rule may share the target.
    for other in [
        twin.replace("kind = \"Deployment\"", "kind = \"StatefulSet\""),
        twin.replace("namespace = \"prod\"", "namespace = \"stage\""),
        twin.replace("name = \"billing\" }", "name = \"checkout\" }"),
        twin.replace("name = \"billing-2\"\n", "name = \"billing-2\"\nshadow = true\n"),
    ] {
        let rules = parse(&format!("{BACKENDS}{BILLING}{other}"));
        assert_eq!(rules.autoscalers.len(), 2);
    }
    // What CRD mode keeps of the file: the active autoscalers' targets.
    let shadow = twin.replace("name = \"billing-2\"\n", "name = \"billing-2\"\nshadow = true\n");
    let rules = parse(&format!("{BACKENDS}{BILLING}{shadow}"));
    let scaled: Vec<(&str, &str)> = rules.scaled.iter().map(|(t, name)| (&*t.name, &**name)).collect();
    assert_eq!(scaled, [("billing", "billing")]);
}

/// A value far beyond any bound: it passed `check` once, and then overflowed the scheduler.
const HUGE: &str = "9223372036854775807";

#[test]
fn every_duration_of_an_autoscaler_is_bounded() {
    let with =
        |knob: &str| format!("{BACKENDS}{BILLING}").replace("min_replicas = 4", &format!("min_replicas = 4\n{knob}"));
    for (knob, expected) in [
        (format!("interval = {HUGE}"), format!("interval ({HUGE}) must be at most 1day (86400s)")),
        ("interval = \"25h\"".to_string(), "interval (\"25h\") must be at most 1day (86400s)".to_string()),
        (format!("upscale_forbidden_window = {HUGE}"), "upscale_forbidden_window".into()),
        (format!("downscale_forbidden_window = {HUGE}"), "downscale_forbidden_window".into()),
        (format!("upscale_delay_above_watermark = {HUGE}"), "upscale_delay_above_watermark".into()),
        (format!("downscale_delay_below_watermark = {HUGE}"), "downscale_delay_below_watermark".into()),
        (
            "behavior = { scale_down = { stabilization_window = \"2h\" } }".into(),
            "behavior.scale_down.stabilization_window (\"2h\") must be at most 1h (3600s)".into(),
        ),
        (
            format!("behavior = {{ scale_up = {{ policies = [{{ type = \"pods\", value = 1, period = {HUGE} }}] }} }}"),
            format!("behavior.scale_up.policies[0].period ({HUGE}) must be at most 30m (1800s)"),
        ),
    ] {
        let text = with(&knob);
        let line = line_of(&text, knob.split(' ').next().unwrap_or_default());
        let p = problems(&text);
        // A policy that cannot be read leaves none, which the engine reports too.
        assert!(p.len() == 1 || knob.contains("policies"), "{knob}: {p:?}");
        assert!(p[0].starts_with(&format!("rules.toml:{line}: autoscaler \"billing\": ")), "{knob}: {p:?}");
        assert!(p[0].contains(&expected) && p[0].contains("must be at most"), "{knob}: {p:?}");
    }
    // Exactly the bound is fine.
    assert_eq!(parse(&with("interval = 86400")).autoscalers[0].interval_set, Some(Duration::from_secs(86_400)));

    let text = format!("{BACKENDS}{BILLING}")
        .replace("low_watermark = \"150m\"", &format!("low_watermark = \"150m\"\nmax_age = {HUGE}"));
    assert_has(
        &problems(&text),
        &format!(
            "rules.toml:{}: autoscaler \"billing\": metric \"latency\": max_age ({HUGE}) must be at most 1day (86400s)",
            line_of(&text, "max_age")
        ),
    );
}

#[test]
fn replica_counts_fit_the_int32_of_the_scale_subresource() {
    for (knob, value) in
        [("max_replicas", "2147483648"), ("min_replicas", "4294967295"), ("replica_modulo", "2147483648")]
    {
        let text = format!("{BACKENDS}{BILLING}").replace("max_replicas = 9\n", "").replace(
            "min_replicas = 4",
            &if knob == "max_replicas" {
                format!("{knob} = {value}")
            } else {
                format!("max_replicas = 9\n{knob} = {value}")
            },
        );
        let p = problems(&text);
        assert_has(
            &p,
            &format!(
                "rules.toml:{}: autoscaler \"billing\": {knob} ({value}) must be a whole number from 0 to 2147483647 \
                 (the largest replica count Kubernetes takes)",
                line_of(&text, knob)
            ),
        );
    }
    let text = format!("{BACKENDS}{BILLING}").replace("max_replicas = 9", "max_replicas = 2147483647");
    assert_eq!(parse(&text).autoscalers[0].rule.max_replicas(), 2_147_483_647);
}

#[test]
fn interval_must_be_at_least_one_second() {
    let text = format!("{BACKENDS}{BILLING}").replace("max_replicas = 9", "max_replicas = 9\ninterval = \"500ms\"");
    let p = problems(&text);
    assert_eq!(
        p,
        [format!(
            "rules.toml:{}: autoscaler \"billing\": interval (500ms) must be at least 1s",
            line_of(&text, "interval")
        )]
    );
    let text = format!("{BACKENDS}{BILLING}").replace("max_replicas = 9", "max_replicas = 9\ninterval = \"soon\"");
    assert!(problems(&text)[0].contains("interval (\"soon\") must be a duration such as \"30s\""));
}

#[test]
fn behavior_problems_keep_the_engine_path_and_find_the_line() {
    let text = format!(
        r#"{BACKENDS}{BILLING}
[autoscaler.behavior.scale_up]
select_policy = "fastest"
policies = [
    {{ type = "pods", value = 4, period = "15s" }},
    {{ type = "percent", value = 100, period = "1h" }},
    {{ type = "replicas", value = 1, period = "1m" }},
]
"#
    )
    .replace("max_replicas = 9", "max_replicas = 9\nupscale_forbidden_window = \"30s\"");
    let p = problems(&text);
    assert_eq!(
        p,
        [
            format!(
                "rules.toml:{}: autoscaler \"billing\": upscale_forbidden_window cannot be combined with a behavior block: use the behavior policies, or remove behavior",
                line_of(&text, "upscale_forbidden_window")
            ),
            format!(
                "rules.toml:{}: autoscaler \"billing\": behavior.scale_up.select_policy (\"fastest\") must be \"max\", \"min\" or \"disabled\"",
                line_of(&text, "fastest")
            ),
            format!(
                "rules.toml:{}: autoscaler \"billing\": behavior.scale_up.policies[1].period (\"1h\") must be at most 30m (1800s)",
                line_of(&text, "\"1h\"")
            ),
            format!(
                "rules.toml:{}: autoscaler \"billing\": behavior.scale_up.policies[2].type (\"replicas\") must be \"pods\" or \"percent\"",
                line_of(&text, "replicas\"")
            ),
        ]
    );
}

#[test]
fn type_errors_say_what_was_found() {
    let text = format!("{BACKENDS}{BILLING}").replace(
        "max_replicas = 9",
        "max_replicas = \"9\"\ntolerate_zero = \"yes\"\nalgorithm = \"avg\"\ntolerance = [1]",
    );
    let p = problems(&text);
    assert_has(
        &p,
        &format!(
            "rules.toml:{}: autoscaler \"billing\": max_replicas must be a whole number, not a string (\"9\")",
            line_of(&text, "max_replicas")
        ),
    );
    assert_has(
        &p,
        &format!(
            "rules.toml:{}: autoscaler \"billing\": tolerate_zero must be true or false, not a string (\"yes\")",
            line_of(&text, "tolerate_zero")
        ),
    );
    assert_has(
        &p,
        &format!(
            "rules.toml:{}: autoscaler \"billing\": algorithm (\"avg\") must be \"absolute\" or \"average\"",
            line_of(&text, "algorithm")
        ),
    );
    assert!(
        p.iter()
            .any(|l| l.contains("tolerance must be a number or a Kubernetes quantity such as \"400m\", not a list")),
        "{p:?}"
    );
    // max_replicas could not be read: the engine's "max_replicas is required" would only confuse.
    assert_eq!(p.len(), 4, "{p:?}");
}

#[test]
fn sections_written_with_single_brackets_are_explained() {
    let p = problems("[autoscaler]\nname = \"a\"\n");
    assert_eq!(p, ["rules.toml:1: autoscaler must be a list ([[autoscaler]] sections), not a table"]);
    let text = format!("{BACKENDS}{BILLING}").replace("[[autoscaler.metric]]", "[autoscaler.metric]");
    let p = problems(&text);
    assert!(p[0].contains("metric must be a list ([[autoscaler.metric]] sections in TOML), not a table"), "{p:?}");
}

#[test]
fn many_problems_are_reported_at_once_in_file_order() {
    let text = format!("{BACKENDS}{BILLING}")
        .replace("min_replicas = 4", "min_replicas = 0\nbogus = 1")
        .replace("backend = \"dd\"", "backend = \"nope\"")
        .replace("\"150m\"", "\"1.5.0\"");
    let p = problems(&text);
    assert_eq!(p.len(), 4, "{p:?}");
    let lines: Vec<usize> =
        p.iter().map(|l| l.trim_start_matches("rules.toml:").split(':').next().unwrap().parse().unwrap()).collect();
    assert!(lines.windows(2).all(|w| w[0] <= w[1]), "{p:?}");
}

#[test]
fn unreadable_files_are_a_rules_error() {
    let err = load_rules(Path::new("/nonexistent/rules.toml")).unwrap_err();
    assert_eq!(err.origin, "/nonexistent/rules.toml");
    assert!(err.to_string().starts_with("/nonexistent/rules.toml: cannot read the rules file: "), "{err}");
}

#[test]
fn json_rules_need_only_what_the_engine_needs() {
    let rule = rule_from_json(&json!({
        "max_replicas": 20,
        "tolerance": 0.01,
        "upscale_forbidden_window": "60s",
        "metric": [{ "name": "latency", "high_watermark": "400m", "low_watermark": 0.15 }]
    }))
    .unwrap();
    assert_eq!(rule.max_replicas(), 20);
    assert_eq!(rule.metrics()[0].low_watermark, d("0.15"));
    // A query alone names the metric; null reads as absent; the file-only keys are allowed.
    let rule = rule_from_json(&json!({
        "name": "x", "interval": "30s", "target": { "kind": "Deployment", "namespace": "a", "name": "b" },
        "max_replicas": 3, "dry_run": null,
        "metric": [{ "query": "avg:cpu{*}", "backend": "anything", "high_watermark": 1 }]
    }))
    .unwrap();
    assert_eq!(rule.metrics()[0].name, "avg:cpu{*}");
}

#[test]
fn json_rule_problems_have_no_lines_and_no_position_prefix() {
    let problems = rule_from_json(&json!({
        "min_replicas": 5, "max_replicas": 4, "interval": "0s", "algorithm": "Average",
        "metric": [{ "high_watermark": 1 }, { "name": "cpu", "high_watermark": 0.5, "low_watermark": 0.8, "extra": 1 }]
    }))
    .unwrap_err();
    let shown: Vec<String> = problems.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        [
            "interval (0s) must be at least 1s",
            "metric[0] needs a name (or a query, which then serves as its name)",
            "metric \"cpu\": extra is not a known key (known keys: name, backend, query, resource, selector, pod_aggregation, readiness_delay, high_watermark, low_watermark, max_age, reducer, activation)",
            "algorithm (\"Average\") must be \"absolute\" or \"average\"",
            "min_replicas (5) must not exceed max_replicas (4)",
            "metric \"cpu\": low_watermark (0.8) must not exceed high_watermark (0.5)",
        ]
    );
    let named = rule_from_json(&json!({ "name": "billing", "metric": [] })).unwrap_err();
    assert_eq!(named[0].to_string(), "autoscaler \"billing\": max_replicas is required");
    let not_an_object = rule_from_json(&json!([1])).unwrap_err();
    assert_eq!(not_an_object[0].to_string(), "the rule must be a JSON object, not a list");
}

#[test]
fn summaries_say_what_was_understood() {
    let text = format!("{BACKENDS}{BILLING}").replace(
        "min_replicas = 4",
        "min_replicas = 4\nscale_down_limit_factor = 30\nupscale_forbidden_window = \"60s\"\nconverge_towards_watermark = \"high\"",
    );
    let rules = parse(&text);
    assert_eq!(
        summary(&rules.autoscalers[0]),
        "billing: Deployment prod/billing, 4..9 replicas, every 15s, 1 metric (latency via dd: 150m..400m), \
         watermark velocity up 50%/60s down 30%/300s, converging towards high"
    );
    let text = format!("{BACKENDS}{BILLING}\n[autoscaler.behavior.scale_down]\nselect_policy = \"disabled\"\n")
        .replace("min_replicas = 4", "min_replicas = 4\nalgorithm = \"average\"\nreplica_modulo = 2\ndry_run = true");
    let rules = parse(&text);
    assert_eq!(
        summary(&rules.autoscalers[0]),
        "billing: Deployment prod/billing, 4..9 replicas, every 15s, 1 metric (latency via dd: 150m..400m per replica), \
         behavior up max(4 pods/15s, 100%/15s), stabilization 0s; down disabled, modulo 2, dry run"
    );
}

#[test]
fn the_demo_rules_are_what_the_simulator_expects() {
    let rules = load_rules(&Path::new(env!("CARGO_MANIFEST_DIR")).join("config/demo.toml")).unwrap();
    let Backend::Prometheus(prom) = &rules.backends["prom"] else { panic!("prom is not a prometheus backend") };
    assert_eq!(prom.url, "http://127.0.0.1:9090");
    let names: Vec<&str> = rules.autoscalers.iter().map(|a| &*a.name).collect();
    assert_eq!(names, ["daily", "spike", "flapping"]);
    let watermark = |a: &Autoscaler| match a.rule.velocity() {
        Velocity::Watermark(v) => v.clone(),
        Velocity::Behavior(_) => panic!("demo rules use the watermark knobs"),
    };
    let check =
        |name: &str, metric: &str, algorithm: Algorithm, low: &str, high: &str, replicas: (u32, u32), interval: u64| {
            let a = rules.autoscaler(name).unwrap();
            assert_eq!(a.metrics.len(), 1);
            assert_eq!((a.metrics[0].name.as_str(), a.metrics[0].backend.as_str()), (metric, "prom"));
            assert_eq!(a.rule.algorithm(), algorithm, "{name}");
            assert_eq!(a.rule.metrics()[0].low_watermark, d(low), "{name}");
            assert_eq!(a.rule.metrics()[0].high_watermark, d(high), "{name}");
            assert_eq!((a.rule.min_replicas(), a.rule.max_replicas()), replicas, "{name}");
            assert_eq!(a.interval(crate::domain::rules::DEFAULT_INTERVAL), Duration::from_secs(interval), "{name}");
            a
        };
    let daily = check("daily", "rps", Algorithm::Average, "60", "120", (2, 20), 30);
    assert_eq!(daily.rule.upscale_tolerance(), &d("0.05"));
    let v = watermark(daily);
    assert_eq!((v.scale_up_limit_factor, v.scale_down_limit_factor), (d("50"), d("20")));
    assert_eq!((v.upscale_forbidden_window.as_secs(), v.downscale_forbidden_window.as_secs()), (60, 300));

    let spike = check("spike", "latency_seconds", Algorithm::Absolute, "0.15", "0.4", (3, 30), 15);
    assert_eq!(spike.rule.upscale_tolerance(), &d("0.01"));
    let v = watermark(spike);
    assert_eq!((v.scale_up_limit_factor, v.scale_down_limit_factor), (d("100"), d("20")));
    assert_eq!((v.upscale_forbidden_window.as_secs(), v.downscale_forbidden_window.as_secs()), (30, 300));

    let flapping = check("flapping", "cpu", Algorithm::Absolute, "0.5", "0.75", (2, 12), 15);
    assert_eq!(flapping.rule.upscale_delay_above_watermark(), Duration::from_secs(60));
    assert_eq!(flapping.rule.downscale_delay_below_watermark(), Duration::from_secs(120));
    let v = watermark(flapping);
    assert_eq!((v.upscale_forbidden_window.as_secs(), v.downscale_forbidden_window.as_secs()), (60, 300));
}

#[test]
fn no_prefix_of_an_example_makes_the_parser_panic() {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("config/multi-metric.toml")).unwrap();
    for (end, _) in text.char_indices() {
        // Any outcome is fine; a panic fails the test.
        let _ = parse_rules(&text[..end], "prefix.toml");
    }
}

#[test]
fn tolerances_may_differ_per_direction_and_default_to_tolerance() {
    let rule = |extra: serde_json::Value| {
        let mut doc = json!({ "max_replicas": 20, "tolerance": 0.05, "metric": [{ "name": "m", "high_watermark": 10, "low_watermark": 5 }] });
        if let (Some(doc), Some(extra)) = (doc.as_object_mut(), extra.as_object()) {
            doc.extend(extra.clone());
        }
        rule_from_json(&doc)
    };
    let both = rule(json!({})).unwrap();
    assert_eq!((both.upscale_tolerance(), both.downscale_tolerance()), (&d("0.05"), &d("0.05")));
    let knobs = rule(json!({ "upscale_tolerance": 0, "downscale_tolerance": "0.2" })).unwrap();
    assert_eq!((knobs.upscale_tolerance(), knobs.downscale_tolerance()), (&d("0"), &d("0.2")));
    let behavior = rule(json!({ "behavior": { "scale_up": { "tolerance": 0.01 } } })).unwrap();
    assert_eq!((behavior.upscale_tolerance(), behavior.downscale_tolerance()), (&d("0.01"), &d("0.05")));

    let problems = |extra| -> Vec<String> { rule(extra).unwrap_err().iter().map(ToString::to_string).collect() };
    let found = problems(json!({ "upscale_tolerance": 0.1, "behavior": { "scale_up": { "tolerance": 0.2 } } }));
    assert!(
        found.iter().any(|p| p.contains("upscale_tolerance") && p.contains("behavior.scale_up.tolerance")),
        "{found:?}"
    );
    let found = problems(json!({ "behavior": { "scale_down": { "tolerance": 1.5 } } }));
    assert!(found.iter().any(|p| p.contains("behavior.scale_down.tolerance (1.5) must be a fraction")), "{found:?}");
    let found = problems(json!({ "downscale_tolerance": -0.1 }));
    assert!(found.iter().any(|p| p.contains("downscale_tolerance")), "{found:?}");
}

#[test]
fn targets_share_their_kind_namespace_and_api_version() {
    let second = BILLING.replace("name = \"billing\"", "name = \"billing-2\"");
    let rules = parse(&format!("{BACKENDS}{BILLING}{second}"));
    let (a, b) = (&rules.autoscalers[0].target, &rules.autoscalers[1].target);
    assert!(Arc::ptr_eq(&a.namespace, &b.namespace));
    assert!(Arc::ptr_eq(&a.kind, &b.kind));
    assert!(Arc::ptr_eq(&a.api_version, &b.api_version));
    assert!(!Arc::ptr_eq(&a.name, &b.name));
}

#[test]
fn interned_texts_nobody_holds_are_let_go() {
    let held = intern("namespace-held-by-this-test");
    let dropped = Arc::downgrade(&intern("namespace-nobody-holds"));
    for i in 0..10_000 {
        intern(&format!("namespace-{i}"));
    }
    assert!(dropped.upgrade().is_none(), "an unused text stays in the set");
    assert!(Arc::ptr_eq(&held, &intern("namespace-held-by-this-test")));
}

#[test]
fn observe_and_take_over_are_read_and_refused_together_or_with_shadow() {
    let observing = BILLING.replacen("name = \"billing\"\n", "name = \"billing\"\nobserve = true\n", 1);
    let rules = parse(&format!("{BACKENDS}{observing}"));
    assert!(rules.autoscalers[0].observe && !rules.autoscalers[0].take_over);
    assert!(rules.autoscalers[0].paused_at(NOW), "observing is a pause without an end");
    let taking = BILLING.replacen("name = \"billing\"\n", "name = \"billing\"\ntake_over = true\n", 1);
    let rules = parse(&format!("{BACKENDS}{taking}"));
    assert!(rules.autoscalers[0].take_over && !rules.autoscalers[0].paused_at(NOW));

    let both = BILLING.replacen("name = \"billing\"\n", "name = \"billing\"\nobserve = true\ntake_over = true\n", 1);
    let text = format!("{BACKENDS}{both}");
    let line = line_of(&text, "take_over = true");
    assert_begins(
        &problems(&text),
        &format!("rules.toml:{line}: autoscaler \"billing\": take_over cannot be combined with observe"),
    );
    let shadow =
        BILLING.replacen("name = \"billing\"\n", "name = \"billing-next\"\nshadow = true\nobserve = true\n", 1);
    let text = format!("{BACKENDS}{BILLING}{shadow}");
    let line = line_of(&text, "observe = true");
    assert_begins(
        &problems(&text),
        &format!("rules.toml:{line}: autoscaler \"billing-next\": observe cannot be combined with shadow"),
    );
    let wrong = BILLING.replacen("name = \"billing\"\n", "name = \"billing\"\ntake_over = \"yes\"\n", 1);
    let text = format!("{BACKENDS}{wrong}");
    assert_begins(
        &problems(&text),
        &format!("rules.toml:{}: autoscaler \"billing\": take_over", line_of(&text, "take_over")),
    );
}

fn assert_begins(problems: &[String], expected: &str) {
    assert!(
        problems.iter().any(|p| p.starts_with(expected)),
        "missing:\n  {expected}\nin:\n  {}",
        problems.join("\n  ")
    );
}
