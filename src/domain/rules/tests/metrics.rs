//! Metrics, recommenders and resource metrics: what each reads, and how its problems are named.

use super::*;

#[test]
fn a_metric_needs_a_query_and_watermarks() {
    let text = format!("{BACKENDS}{BILLING}\n[[autoscaler.metric]]\nbackend = \"prom\"\nquery = \" \"\n");
    let p = problems(&text);
    let line = line_of(&text, "query = \" \"");
    assert_has(&p, &format!("rules.toml:{line}: autoscaler \"billing\": metric[1].query must not be empty"));
    assert!(
        p.iter()
            .any(|l| l
                .contains("metric[1].high_watermark: at least one of low_watermark and high_watermark is required")),
        "{p:?}"
    );
    let p = problems(&format!("{BACKENDS}{BILLING}\n[[autoscaler.metric]]\nbackend = \"prom\"\nhigh_watermark = 1\n"));
    assert!(
        p.iter().any(|l| l.ends_with(
            "metric[1] needs a query, or a resource (\"cpu\" or \"memory\") with a selector (and optionally a name, \
             which defaults to the query or the resource)"
        )),
        "{p:?}"
    );
    assert_eq!(p.len(), 1, "{p:?}");
}

#[test]
fn scale_to_zero_reads_its_keys_and_names_what_is_missing() {
    let queue = r#"
[[autoscaler]]
name = "worker"
target = { kind = "Deployment", namespace = "prod", name = "worker" }
min_replicas = 0
max_replicas = 20
scale_to_zero_delay = "10m"
tolerate_zero = true

[[autoscaler.metric]]
name = "queue"
backend = "prom"
query = "sum(queue_depth)"
high_watermark = 100
low_watermark = 10
activation = 0
"#;
    let rules = parse(&format!("{BACKENDS}{queue}"));
    let worker = &rules.autoscalers[0];
    let zero = worker.rule.scale_to_zero().expect("scales to zero");
    assert_eq!((zero.delay, zero.activations.clone()), (Duration::from_secs(600), vec![d("0")]));
    assert!(summary(worker).contains("0..20 replicas"), "{}", summary(worker));
    assert!(summary(worker).ends_with("scales to zero after 600s idle, wakes on queue > 0"), "{}", summary(worker));
    assert!(warnings(worker).is_empty(), "{:?}", warnings(worker));

    let text = format!("{BACKENDS}{}", queue.replace("activation = 0\n", ""));
    // Missing, so named at its table.
    let line = line_of(&text, "[[autoscaler.metric]]");
    assert_eq!(
        problems(&text),
        [format!(
            "rules.toml:{line}: autoscaler \"worker\": metric \"queue\": activation is required with min_replicas = 0: \
             the value above which the workload wakes from zero"
        )]
    );

    // Valid, but a per-replica average and an unforgiving zero are said.
    let text = format!("{BACKENDS}{}", queue.replace("tolerate_zero = true\n", "algorithm = \"average\"\n"));
    let said = warnings(&parse(&text).autoscalers[0]);
    assert_eq!(said.len(), 2, "{said:?}");
    assert!(said[0].starts_with("min_replicas = 0 with algorithm = \"average\""), "{said:?}");
    assert!(said[1].contains("activation 0 and tolerate_zero is off"), "{said:?}");
}

#[test]
fn engine_problems_name_the_metric_and_the_line() {
    let text =
        format!("{BACKENDS}{BILLING}").replace("\"150m\"", "\"500m\"").replace("min_replicas = 4", "min_replicas = 10");
    let p = problems(&text);
    assert_eq!(
        p,
        [
            format!(
                "rules.toml:{}: autoscaler \"billing\": min_replicas (10) must not exceed max_replicas (9)",
                line_of(&text, "min_replicas")
            ),
            format!(
                "rules.toml:{}: autoscaler \"billing\": metric \"latency\": low_watermark (0.5) must not exceed high_watermark (0.4)",
                line_of(&text, "low_watermark")
            ),
        ]
    );
}

#[test]
fn a_lone_bad_watermark_is_reported_once() {
    let text = format!("{BACKENDS}{BILLING}").replace("low_watermark = \"150m\"\n", "").replace("\"400m\"", "-1");
    let p = problems(&text);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(p[0].ends_with("metric \"latency\": high_watermark (-1) must be greater than 0"), "{p:?}");
}

const RECOMMENDED: &str = r#"
[[autoscaler]]
name = "web"
target = { kind = "Deployment", namespace = "prod", name = "web" }
max_replicas = 20

[autoscaler.recommender]
url = "https://reco.example/recommend"
target_type = "cpu"
settings = { window = "1h" }
high_watermark = "800m"
low_watermark = "600m"
timeout = "3s"
cluster_name = "eu-1"
ca_file = "/etc/reco/ca.pem"
client_cert_file = "/etc/reco/client.pem"
client_key_file = "/etc/reco/client.key"
server_name = "reco.internal"
"#;

#[test]
fn a_recommender_replaces_the_metrics() {
    let rules = parse(RECOMMENDED);
    let web = &rules.autoscalers[0];
    assert!(web.metrics.is_empty());
    let recommender = web.recommender.as_deref().expect("a recommender");
    assert_eq!(
        recommender,
        &Recommender {
            url: "https://reco.example/recommend".into(),
            target_type: "cpu".into(),
            settings: BTreeMap::from([("window".to_string(), "1h".to_string())]),
            lower_bound: 0.6,
            upper_bound: 0.8,
            timeout: Duration::from_secs(3),
            cluster_name: Some("eu-1".into()),
            tls: TlsSettings {
                ca_file: Some(PathBuf::from("/etc/reco/ca.pem")),
                client_cert_file: Some(PathBuf::from("/etc/reco/client.pem")),
                client_key_file: Some(PathBuf::from("/etc/reco/client.key")),
                insecure_skip_verify: false,
            },
            server_name: Some("reco.internal".into()),
            tls_dir: None,
        }
    );
    let metric = &web.rule.metrics()[0];
    assert_eq!(metric.name, "recommender{targetType:cpu,window:1h}");
    assert_eq!((metric.low_watermark.clone(), metric.high_watermark.clone()), (d("0.6"), d("0.8")));
    assert!(summary(web).contains("recommender https://reco.example/recommend"), "{}", summary(web));
    // The timeout defaults to the Datadog controller's 10s.
    let minimal = "[[autoscaler]]\nname = \"w\"\ntarget = { kind = \"Deployment\", namespace = \"p\", name = \"w\" }\n\
                   max_replicas = 3\nrecommender = { url = \"http://reco\", high_watermark = 1 }\n";
    let recommender = parse(minimal).autoscalers[0].recommender.clone().expect("a recommender");
    assert_eq!(
        (recommender.timeout, recommender.lower_bound, recommender.upper_bound),
        (Duration::from_secs(10), 0.0, 1.0)
    );
}

#[test]
fn recommender_problems_name_their_field() {
    let text = format!("{BACKENDS}{}", RECOMMENDED.replace("https://reco.example/recommend", "reco:80"));
    let found = problems(&text);
    assert_has(
        &found,
        &format!(
            "rules.toml:{}: autoscaler \"web\": recommender.url (\"reco:80\") must start with http:// or https://",
            line_of(&text, "reco:80")
        ),
    );
    let text = RECOMMENDED.replace("client_key_file = \"/etc/reco/client.key\"\n", "colour = 1\n");
    let found = problems(&text);
    assert_has(
        &found,
        &format!(
            "rules.toml:{}: autoscaler \"web\": recommender.client_key_file is required when the other half of the \
             client certificate is set",
            line_of(&text, "[autoscaler.recommender]")
        ),
    );
    assert!(found.iter().any(|p| p.contains("recommender.colour is not a known key")), "{found:?}");
    let text = RECOMMENDED.replace("low_watermark = \"600m\"", "low_watermark = \"900m\"");
    assert_has(
        &problems(&text),
        &format!(
            "rules.toml:{}: autoscaler \"web\": recommender.low_watermark (0.9) must not exceed high_watermark (0.8)",
            line_of(&text, "low_watermark = \"900m\"")
        ),
    );
    let both = format!(
        "{BACKENDS}{RECOMMENDED}\n[[autoscaler.metric]]\nbackend = \"prom\"\nquery = \"up\"\nhigh_watermark = 1\n"
    );
    assert!(
        problems(&both).iter().any(|p| p.contains("recommender cannot be combined with metrics")),
        "{:?}",
        problems(&both)
    );
    for (server_name, url, problem) in [
        ("10.0.0.7", "https://reco.example/recommend", "(\"10.0.0.7\") must be a DNS name"),
        ("not a name", "https://reco.example/recommend", "(\"not a name\") is not a DNS name"),
        ("reco.internal", "http://reco.example/recommend", "applies to https:// urls only"),
    ] {
        let text = RECOMMENDED
            .replace("server_name = \"reco.internal\"", &format!("server_name = \"{server_name}\""))
            .replace("https://reco.example/recommend", url);
        let expected =
            format!("rules.toml:{}: autoscaler \"web\": recommender.server_name ", line_of(&text, "server_name = "));
        let found = problems(&text);
        assert!(found.iter().any(|p| p.starts_with(&expected) && p.contains(problem)), "{problem}: {found:?}");
    }
    let no_url = "[[autoscaler]]\nname = \"w\"\ntarget = { kind = \"Deployment\", namespace = \"p\", name = \"w\" }\n\
                  max_replicas = 3\nrecommender = { high_watermark = 1 }\n";
    assert!(problems(no_url).iter().any(|p| p.ends_with("recommender.url is required")), "{:?}", problems(no_url));
}

#[test]
fn a_recommender_url_is_checked_and_shown_without_its_secrets() {
    let text =
        RECOMMENDED.replace("https://reco.example/recommend", "https://ops:hunter2@reco.example:8443/r?key=abc#x");
    let web = parse(&text).autoscalers.into_iter().next().expect("web");
    let recommender = web.recommender.as_ref().expect("a recommender");
    // Sent as written (reqwest turns the credentials into basic auth)...
    assert_eq!(recommender.url, "https://ops:hunter2@reco.example:8443/r?key=abc#x");
    // ...shown without them wherever a person or a scraper sees it.
    assert_eq!(recommender.display_url(), "https://reco.example:8443/r");
    assert!(!summary(&web).contains("hunter2") && !summary(&web).contains("key=abc"), "{}", summary(&web));

    let text = RECOMMENDED.replace("https://reco.example/recommend", "http://reco.example:99999/");
    let found = problems(&text);
    assert!(
        found.iter().any(|p| p.contains("recommender.url (http://(unparsable URL)) is not a URL: invalid port number")),
        "{found:?}"
    );
    let text = RECOMMENDED.replace("https://reco.example/recommend", "https://");
    assert!(
        problems(&text).iter().any(|p| p.contains("recommender.url") && p.contains("host")),
        "{:?}",
        problems(&text)
    );
}

const RESOURCE: &str = r#"
[[autoscaler]]
name = "web"
target = { kind = "Deployment", namespace = "prod", name = "web" }
max_replicas = 9

[[autoscaler.metric]]
resource = "cpu"
selector = "app=web,tier in (front, edge)"
high_watermark = "500m"
low_watermark = "200m"

[[autoscaler.metric]]
name = "rss"
resource = "memory"
selector = { app = "web" }
pod_aggregation = "average"
readiness_delay = "30s"
max_age = "1m"
high_watermark = "1Gi"
"#;

#[test]
fn a_resource_metric_reads_pods_instead_of_a_query() {
    let rules = parse(RESOURCE);
    let web = rules.autoscaler("web").unwrap();
    let cpu = &web.metrics[0];
    assert_eq!(cpu.name, "cpu", "the name defaults to the resource");
    assert_eq!(cpu.backend, RESOURCE_BACKEND);
    assert_eq!(
        cpu.resource,
        Some(ResourceSource {
            resource: ResourceName::Cpu,
            selector: "app=web,tier in (front,edge)".into(),
            aggregation: PodAggregation::Sum,
            readiness_delay: Duration::ZERO,
            max_age: RESOURCE_MAX_AGE,
        })
    );
    assert_eq!(web.rule.metrics()[0].high_watermark, d("0.5"));
    let memory = web.metrics[1].resource.as_ref().unwrap();
    assert_eq!(
        (memory.resource, memory.selector.as_str(), memory.aggregation),
        (ResourceName::Memory, "app=web", PodAggregation::Average)
    );
    assert_eq!((memory.readiness_delay, memory.max_age), (Duration::from_secs(30), Duration::from_secs(60)));
    assert_eq!(web.rule.metrics()[1].high_watermark, d("1073741824"));
    assert_eq!(
        summary(web).split(", ").nth(3).unwrap(),
        "2 metrics (cpu (cpu summed over pods app=web,tier in (front,edge)): 200m..500m"
    );
}

#[test]
fn a_resource_metric_says_what_is_wrong_with_it() {
    let text = r#"
[backend.prom]
type = "prometheus"
url = "http://127.0.0.1:9090"

[[autoscaler]]
name = "web"
target = { kind = "Deployment", namespace = "prod", name = "web" }
max_replicas = 9
algorithm = "average"

[[autoscaler.metric]]
resource = "gpu"
selector = "app=web"
high_watermark = 1

[[autoscaler.metric]]
name = "mem"
resource = "memory"
backend = "prom"
query = "x"
high_watermark = 1

[[autoscaler.metric]]
name = "cpu2"
resource = "cpu"
selector = "app=web!"
pod_aggregation = "median"
high_watermark = 1

[[autoscaler.metric]]
name = "cpu3"
resource = "cpu"
selector = ""
high_watermark = 1

[[autoscaler.metric]]
name = "cpu4"
resource = "cpu"
selector = { app = 3 }
pod_aggregation = "average"
high_watermark = 1

[[autoscaler.metric]]
name = "q"
backend = "prom"
query = "up"
selector = "app=web"
readiness_delay = "10s"
high_watermark = 1
"#;
    let found = problems(text);
    let at = |needle: &str| line_of(text, needle);
    assert_has(
        &found,
        &format!(
            "rules.toml:{}: autoscaler \"web\": metric[0].resource (\"gpu\") must be \"cpu\" or \"memory\"",
            at("\"gpu\"")
        ),
    );
    let not_applicable = "does not apply to a resource metric, which is read from the Kubernetes metrics API \
                          (metrics.k8s.io) through the API server";
    assert_has(
        &found,
        &format!(
            "rules.toml:{}: autoscaler \"web\": metric \"mem\": backend {not_applicable}",
            at("backend = \"prom\"")
        ),
    );
    assert_has(
        &found,
        &format!("rules.toml:{}: autoscaler \"web\": metric \"mem\": query {not_applicable}", at("query = \"x\"")),
    );
    assert_has(
        &found,
        &format!("rules.toml:{}: autoscaler \"web\": metric \"mem\": selector is required", at("name = \"mem\"") - 1),
    );
    assert_has(
        &found,
        &format!(
            "rules.toml:{}: autoscaler \"web\": metric \"cpu2\": selector: label value \"web!\" must be letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
            at("\"app=web!\"")
        ),
    );
    assert_has(&found, &format!("rules.toml:{}: autoscaler \"web\": metric \"cpu2\": pod_aggregation (\"median\") must be \"sum\" or \"average\"", at("\"median\"")));
    assert!(
        found.iter().any(|p| p.contains("metric \"cpu3\": selector: selects every pod of the namespace")),
        "{found:?}"
    );
    assert!(
        found.iter().any(
            |p| p.contains("metric \"cpu4\": selector: label \"app\" must have a string value, not an integer (3)")
        ),
        "{found:?}"
    );
    assert!(
        found.iter().any(|p| p.starts_with(&format!("rules.toml:{}: autoscaler \"web\": metric \"cpu4\": pod_aggregation (\"average\") cannot go with algorithm = \"average\"", at("pod_aggregation = \"average\"")))),
        "{found:?}"
    );
    let only = "only applies to a resource metric (resource = \"cpu\" or \"memory\")";
    assert_has(
        &found,
        &format!(
            "rules.toml:{}: autoscaler \"web\": metric \"q\": selector {only}",
            text.lines().collect::<Vec<_>>().iter().rposition(|l| *l == "selector = \"app=web\"").unwrap() + 1
        ),
    );
    assert_has(
        &found,
        &format!("rules.toml:{}: autoscaler \"web\": metric \"q\": readiness_delay {only}", at("readiness_delay")),
    );
}
