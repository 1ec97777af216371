//! `[backend.NAME]` tables: what each type takes, and what is refused.

use super::*;

#[test]
fn backends_must_exist_and_reducers_only_apply_to_prometheus() {
    let text = format!("{BACKENDS}{BILLING}reducer = \"max\"\n").replace("backend = \"dd\"", "backend = \"datadog\"");
    let p = problems(&text);
    assert_has(
        &p,
        &format!(
            "rules.toml:{}: autoscaler \"billing\": metric \"latency\": backend (\"datadog\") names no [backend.datadog] table (defined: dd, prom)",
            line_of(&text, "backend = \"datadog\"")
        ),
    );
    let p = problems(&format!("{BACKENDS}{BILLING}reducer = \"max\"\n"));
    assert!(p[0].contains("metric \"latency\": reducer only applies to prometheus backends"), "{p:?}");
    let p = problems(&format!("{BACKENDS}{BILLING}reducer = \"median\"\n"));
    assert!(p[0].ends_with("reducer (\"median\") must be \"max\", \"min\", \"sum\" or \"avg\""), "{p:?}");
}

#[test]
fn a_broken_backend_is_not_also_reported_as_missing() {
    let text = format!("{BACKENDS}{BILLING}").replace("api_key_env = \"DD_API_KEY\"", "");
    let p = problems(&text);
    assert_eq!(p, ["rules.toml:2: backend.dd.api_key is required: set api_key_env or api_key_file"]);
}

#[test]
fn secrets_never_go_inline() {
    let text = format!("{BACKENDS}{BILLING}").replace("api_key_env = \"DD_API_KEY\"", "api_key = \"0123456789abcdef\"");
    let p = problems(&text);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(p[0]
        .starts_with("rules.toml:4: backend.dd.api_key cannot be written in the rules file: secrets never go inline"));
    assert!(!p[0].contains("0123456789abcdef"), "the secret must not be echoed: {p:?}");
    let text = format!("{BACKENDS}{BILLING}").replace("app_key_file = ", "app_key_env = \"K\"\napp_key_file = ");
    let p = problems(&text);
    assert_eq!(p, ["rules.toml:6: backend.dd.app_key_file cannot be set together with app_key_env: choose one"]);
}

#[test]
fn backend_types_and_urls_are_checked() {
    let p = problems(
        "[backend.g]\ntype = \"graphite\"\nurl = 1\n\n[backend.p]\ntype = \"prometheus\"\nurl = \"localhost:9090\"\n",
    );
    assert_eq!(
        p,
        [
            "rules.toml:2: backend.g.type (\"graphite\") must be \"datadog\" or \"prometheus\"",
            "rules.toml:7: backend.p.url (\"localhost:9090\") must start with http:// or https://",
        ]
    );
}

#[test]
fn every_duration_of_a_backend_is_bounded() {
    let datadog = "[backend.dd]\ntype = \"datadog\"\napi_key_env = \"A\"\napp_key_env = \"B\"\n";
    let prometheus = "[backend.p]\ntype = \"prometheus\"\nurl = \"http://p:9090\"\n";
    for (base, key, expected) in [
        (datadog, "bad_query_retry", "backend.dd.bad_query_retry (9223372036854775807) must be at most 1day (86400s)"),
        (datadog, "window", "backend.dd.window (9223372036854775807) must be at most 1day (86400s)"),
        (datadog, "max_age", "backend.dd.max_age (9223372036854775807) must be at most 1day (86400s)"),
        (datadog, "timeout", "backend.dd.timeout (9223372036854775807) must be at most 5m (300s)"),
        (prometheus, "timeout", "backend.p.timeout (9223372036854775807) must be at most 5m (300s)"),
    ] {
        let text = format!("{base}{key} = {HUGE}\n");
        let line = text.lines().count();
        assert_eq!(problems(&text), [format!("rules.toml:{line}: {expected}")], "{key}");
    }
    let text = format!("{datadog}bad_query_retry = \"1day\"\n");
    let Some(Backend::Datadog(dd)) = parse(&text).backends.get("dd").cloned() else { panic!("a datadog backend") };
    assert_eq!(dd.bad_query_retry, Duration::from_secs(86_400), "the bound itself is allowed");
}

#[test]
fn backend_connection_settings_are_read_and_checked() {
    let rules = parse(
        r#"
[backend.mimir]
type = "prometheus"
url = "https://mimir.example/prometheus"
timeout = "5s"
max_in_flight = 2
max_age = "90s"
tenant = "team-a"
headers = { "X-Team" = "payments" }
params = { dedup = "true" }
basic_auth = { username = "scaler", password_file = "/etc/watermarkd/mimir-password" }
ca_file = "/etc/watermarkd/ca.pem"
client_cert_file = "/etc/watermarkd/client.pem"
client_key_file = "/etc/watermarkd/client.key"

[backend.dd]
type = "datadog"
site = "datadoghq.eu"
api_key_env = "DD_API_KEY"
app_key_env = "DD_APP_KEY"
window = "10m"
max_age = "3m"
timeout = "20s"
max_in_flight = 6
bad_query_retry = "2m"
"#,
    );
    let Backend::Prometheus(mimir) = &rules.backends["mimir"] else { panic!("not prometheus") };
    assert_eq!(mimir.timeout, Duration::from_secs(5));
    assert_eq!(mimir.max_age, Some(Duration::from_secs(90)));
    assert_eq!(mimir.tenant.as_deref(), Some("team-a"));
    assert_eq!(mimir.headers["X-Team"], "payments");
    assert_eq!(mimir.params["dedup"], "true");
    assert_eq!(
        mimir.basic_auth,
        Some(BasicAuth {
            username: "scaler".into(),
            password: SecretSource::File(PathBuf::from("/etc/watermarkd/mimir-password"))
        })
    );
    assert_eq!(mimir.tls.client_key_file, Some(PathBuf::from("/etc/watermarkd/client.key")));
    let Backend::Datadog(dd) = &rules.backends["dd"] else { panic!("not datadog") };
    assert_eq!(
        (dd.window, dd.max_age, dd.max_in_flight, dd.bad_query_retry),
        (Duration::from_secs(600), Some(Duration::from_secs(180)), 6, Duration::from_secs(120))
    );

    let problems = problems(
        r#"
[backend.p]
type = "prometheus"
url = "http://p:9090"
timeout = "0s"
max_in_flight = 0
max_age = "0s"
headers = { "X-A" = 1 }
params = { time = "0" }
basic_auth = { username = "u", password = "inline!" }
bearer_token_file = "/t"
client_cert_file = "/c.pem"
"#,
    );
    let text = problems.join("\n");
    for expected in [
        "backend.p.timeout must be longer than 0s",
        "backend.p.max_in_flight must be at least 1",
        "backend.p.max_age must be longer than 0s",
        "backend.p.headers.X-A must be a string",
        "backend.p.params cannot set \"time\": watermarkd sends it with every query",
        "backend.p.basic_auth.password cannot be written in the rules file",
        "backend.p.basic_auth cannot be combined with a bearer token",
        "backend.p.client_key_file is required",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    assert!(!text.contains("inline!"), "a secret was echoed: {text}");
}

#[test]
fn bad_query_retry_is_a_positive_duration_of_datadog_backends_only() {
    let base = "[backend.dd]\ntype = \"datadog\"\napi_key_env = \"A\"\napp_key_env = \"B\"\n";
    for (value, expected) in [
        ("\"0s\"", "backend.dd.bad_query_retry must be longer than 0s"),
        ("\"soon\"", "backend.dd.bad_query_retry"),
        ("-600", "backend.dd.bad_query_retry (-600) must be a duration"),
    ] {
        let problems = problems(&format!("{base}bad_query_retry = {value}\n"));
        assert!(problems.iter().any(|p| p.contains(expected)), "{value}: {problems:?}");
    }
    let problems = problems("[backend.p]\ntype = \"prometheus\"\nurl = \"http://p:9090\"\nbad_query_retry = \"1m\"\n");
    assert!(problems.iter().any(|p| p.contains("backend.p.bad_query_retry")), "{problems:?}");
}

#[test]
fn namespace_budget_percent_is_a_percentage_of_datadog_backends_only() {
    let base = "[backend.dd]\ntype = \"datadog\"\napi_key_env = \"A\"\napp_key_env = \"B\"\n";
    for (value, expected) in [
        ("0", "rules.toml:5: backend.dd.namespace_budget_percent (0) must be a percentage from 1 to 100"),
        ("101", "rules.toml:5: backend.dd.namespace_budget_percent (101) must be a percentage from 1 to 100"),
        ("\"25%\"", "rules.toml:5: backend.dd.namespace_budget_percent must be a whole number"),
    ] {
        let problems = problems(&format!("{base}namespace_budget_percent = {value}\n"));
        assert!(problems.iter().any(|p| p.starts_with(expected)), "{value}: {problems:?}");
    }
    let rules = parse(&format!("{base}namespace_budget_percent = 25\n"));
    assert!(matches!(&rules.backends["dd"], Backend::Datadog(dd) if dd.namespace_budget_percent == 25));
    let problems =
        problems("[backend.p]\ntype = \"prometheus\"\nurl = \"http://p:9090\"\nnamespace_budget_percent = 50\n");
    assert!(problems.iter().any(|p| p.contains("backend.p.namespace_budget_percent")), "{problems:?}");
}

#[test]
fn datadog_sites_are_the_known_ones() {
    let problems = problems(
        r#"
[backend.dd]
type = "datadoghq"
"#,
    );
    assert!(problems.iter().any(|p| p.contains("must be \"datadog\" or \"prometheus\"")), "{problems:?}");
    let problems = problems_of_site("datadoghq.con");
    assert!(
        problems.iter().any(|p| p.contains(
            "backend.dd.site (\"datadoghq.con\") is not a Datadog site: use one of datadoghq.com, us3.datadoghq.com"
        )),
        "{problems:?}"
    );
    for site in [
        "datadoghq.com",
        "us3.datadoghq.com",
        "us5.datadoghq.com",
        "ap1.datadoghq.com",
        "ap2.datadoghq.com",
        "datadoghq.eu",
        "ddog-gov.com",
    ] {
        let text =
            format!("[backend.dd]\ntype = \"datadog\"\nsite = \"{site}\"\napi_key_env = \"A\"\napp_key_env = \"B\"\n");
        assert!(parse_rules(&text, "rules.toml").is_ok(), "{site}");
    }
}

fn problems_of_site(site: &str) -> Vec<String> {
    problems(&format!(
        "[backend.dd]\ntype = \"datadog\"\nsite = \"{site}\"\napi_key_env = \"A\"\napp_key_env = \"B\"\n"
    ))
}
