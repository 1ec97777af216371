//! What a WPA's `spec.recommender` maps to (`mapping/recommender.rs`), and each of its problems,
//! named by the WPA's path.

use std::collections::BTreeMap;

use super::*;

const RECOMMENDER: &str = r#"{url: "https://reco.example/recommend", targetType: cpu, settings: {window: 1h, b: "2"},
  highWatermark: 800m, lowWatermark: 600m,
  tlsConfig: {caFile: /etc/ca.pem, certFile: /etc/client.pem, keyFile: /etc/client.key}}"#;

#[test]
fn a_recommender_becomes_the_autoscalers_replica_source() {
    let MappedWpa { autoscaler, notes } = mapped(&with(&[("recommender", Some(RECOMMENDER)), ("metrics", None)]));
    assert!(notes.is_empty(), "{notes:?}");
    assert!(autoscaler.metrics.is_empty());
    let recommender = autoscaler.recommender.expect("a recommender");
    assert_eq!(recommender.url, "https://reco.example/recommend");
    assert_eq!(recommender.target_type, "cpu");
    assert_eq!(
        recommender.settings,
        BTreeMap::from([("b".to_string(), "2".to_string()), ("window".to_string(), "1h".to_string())])
    );
    assert_eq!((recommender.lower_bound, recommender.upper_bound), (0.6, 0.8));
    assert_eq!(recommender.timeout, Duration::from_secs(10));
    assert_eq!(recommender.cluster_name, None);
    assert_eq!(recommender.tls.ca_file.as_deref(), Some(std::path::Path::new("/etc/ca.pem")));
    assert_eq!(recommender.tls.client_cert_file.as_deref(), Some(std::path::Path::new("/etc/client.pem")));
    assert_eq!(recommender.tls.client_key_file.as_deref(), Some(std::path::Path::new("/etc/client.key")));
    assert!(!recommender.tls.insecure_skip_verify);
    // One engine metric named as the Datadog controller names it, with the watermarks.
    let metric = &autoscaler.rule.metrics()[0];
    assert_eq!(metric.name, "recommender{targetType:cpu,b:2,window:1h}");
    assert_eq!((metric.low_watermark.clone(), metric.high_watermark.clone()), (d("0.6"), d("0.8")));
}

#[test]
fn with_a_recommender_the_metrics_are_not_read() {
    // As in the Datadog controller: even broken metrics do not matter then.
    let yaml = with(&[("recommender", Some(RECOMMENDER)), ("metrics", Some("[{type: Pods}]"))]);
    let MappedWpa { autoscaler, notes } = mapped(&yaml);
    assert!(autoscaler.recommender.is_some());
    assert_eq!(notes.len(), 1);
    assert!(notes[0].starts_with("spec.metrics has no effect"), "{notes:?}");
}

#[test]
fn with_a_recommender_resource_metrics_are_not_read_either() {
    let metrics =
        "[{type: Resource, resource: {name: cpu, highWatermark: 500m, metricSelector: {matchLabels: {app: x}}}}]";
    let yaml =
        with(&[("recommender", Some(RECOMMENDER)), ("metrics", Some(metrics)), ("readinessDelaySeconds", Some("20"))]);
    let MappedWpa { autoscaler, notes } = mapped(&yaml);
    assert!(autoscaler.recommender.is_some() && autoscaler.metrics.is_empty());
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(notes[0].starts_with("spec.readinessDelaySeconds (20) has no effect"), "{notes:?}");
    assert!(notes[1].starts_with("spec.metrics has no effect"), "{notes:?}");
    // The pod aggregation annotation has nothing to apply to.
    let mut doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&yaml).unwrap();
    let metadata = doc.get_mut("metadata").unwrap().as_mapping_mut().unwrap();
    let annotations: serde_yaml_ng::Mapping =
        [(POD_AGGREGATION_ANNOTATION.into(), "average".into())].into_iter().collect();
    metadata.insert("annotations".into(), annotations.into());
    assert_eq!(
        problems(&serde_yaml_ng::to_string(&doc).unwrap()),
        ["metadata.annotations[\"watermarkd.io/pod-aggregation\"]: applies to Resource metrics, and with \
          spec.recommender this WPA's metrics are not read"]
    );
}

#[test]
fn recommender_problems_name_the_wpa_fields() {
    let no_watermark = with(&[("recommender", Some("{url: http://reco}")), ("metrics", None)]);
    assert_eq!(
        problems(&no_watermark),
        ["spec.recommender.highWatermark: at least one of lowWatermark and highWatermark is required"]
    );
    let inverted =
        with(&[("recommender", Some("{url: http://reco, lowWatermark: 2, highWatermark: 1}")), ("metrics", None)]);
    assert_eq!(problems(&inverted), ["spec.recommender.lowWatermark (2) must not exceed highWatermark (1)"]);
    let bad_url = with(&[("recommender", Some("{url: reco:80, highWatermark: 1}")), ("metrics", None)]);
    assert_eq!(problems(&bad_url), ["spec.recommender.url (\"reco:80\") must start with http:// or https://"]);
    let half_cert = with(&[
        ("recommender", Some("{url: http://reco, highWatermark: 1, tlsConfig: {certFile: /etc/c.pem}}")),
        ("metrics", None),
    ]);
    assert_eq!(
        problems(&half_cert),
        ["spec.recommender.tlsConfig.keyFile is required when the other half of the client certificate is set"]
    );
}

#[test]
fn a_recommender_is_refused_unless_the_daemon_allows_its_url_and_tls_files() {
    let yaml = with(&[("recommender", Some(RECOMMENDER)), ("metrics", None)]);
    // The default: no recommender, no TLS file.
    let refused = problems_with(&yaml, &MappingOptions::new("dd"), &NoDatadogMetrics);
    assert_eq!(refused.len(), 4, "{refused:?}");
    assert!(
        refused[0].starts_with(
            "spec.recommender.tlsConfig.caFile (/etc/ca.pem) is refused: this daemon reads no TLS file a \
             WatermarkPodAutoscaler names (its recommender_tls_dir setting is not set)"
        ),
        "{refused:?}"
    );
    assert!(refused[1].starts_with("spec.recommender.tlsConfig.certFile (/etc/client.pem) is refused"), "{refused:?}");
    assert!(refused[2].starts_with("spec.recommender.tlsConfig.keyFile (/etc/client.key) is refused"), "{refused:?}");
    assert_eq!(
        refused[3],
        "spec.recommender.url (https://reco.example/recommend) is refused: this daemon lets no \
         WatermarkPodAutoscaler use a recommender (its recommender_allowed_urls setting is empty); an operator who \
         trusts this recommender adds its URL there"
    );
    // Another origin, and files elsewhere.
    let policy = RecommenderPolicy::new(
        vec![AllowedUrl::parse("https://reco.example:8443").unwrap()],
        Some("/var/run/reco-tls".into()),
    );
    let refused = problems_with(&yaml, &MappingOptions::new("dd").with_recommender_policy(policy), &NoDatadogMetrics);
    assert!(
        refused[0].contains("not a file inside /var/run/reco-tls, the daemon's recommender_tls_dir"),
        "{refused:?}"
    );
    assert!(refused[3].contains("is not under any URL of the daemon's recommender_allowed_urls"), "{refused:?}");

    // Allowed: the files as resolved in the directory (a relative one inside it), and the
    // directory they must still be in once symlinks are followed.
    let relative = RECOMMENDER.replace("caFile: /etc/ca.pem", "caFile: reco/ca.pem");
    let mapped = mapped(&with(&[("recommender", Some(&relative)), ("metrics", None)]));
    let recommender = mapped.autoscaler.recommender.expect("a recommender");
    assert_eq!(recommender.tls.ca_file.as_deref(), Some(std::path::Path::new("/etc/reco/ca.pem")));
    assert_eq!(recommender.tls_dir.as_deref(), Some(std::path::Path::new("/etc")));
}

#[test]
fn a_recommender_server_name_is_the_name_verified() {
    let with_server_name = |url: &str, name: &str| {
        with(&[
            (
                "recommender",
                Some(&format!("{{url: \"{url}\", highWatermark: 1, tlsConfig: {{serverName: \"{name}\"}}}}")),
            ),
            ("metrics", None),
        ])
    };
    let server_name = |yaml: &str| mapped(yaml).autoscaler.recommender.expect("a recommender").server_name;
    assert_eq!(server_name(&with_server_name("https://reco", "reco.internal")), Some("reco.internal".into()));
    // The url's own address: what is verified anyway.
    let allowed = [AllowedUrl::parse("https://10.0.0.7").unwrap(), AllowedUrl::parse("http://reco").unwrap()];
    let options = MappingOptions::new("dd").with_recommender_policy(RecommenderPolicy::new(allowed.to_vec(), None));
    let map_with = |yaml: &str| map_wpa(&wpa(yaml), &options, &NoDatadogMetrics);
    let same = map_with(&with_server_name("https://10.0.0.7/r", "10.0.0.7")).expect("runs");
    assert_eq!(same.autoscaler.recommender.expect("a recommender").server_name, None);
    // Without TLS it has no effect, as in the Datadog controller.
    let plain = map_with(&with_server_name("http://reco/r", "reco.internal")).expect("runs");
    assert_eq!(
        plain.notes,
        ["spec.recommender.tlsConfig.serverName (reco.internal) has no effect: the url is http://, without TLS, as \
          in the Datadog controller"]
    );
    // Another address cannot be verified in its place.
    match map_with(&with_server_name("https://10.0.0.7/r", "10.0.0.8")) {
        Err(MapError::Unsupported(unsupported)) => {
            assert_eq!(unsupported.len(), 1);
            assert_eq!(unsupported[0].field, "spec.recommender.tlsConfig.serverName");
        }
        other => panic!("{other:?}"),
    }
    // Not a name at all: invalid, with the field.
    assert_eq!(
        problems(&with_server_name("https://reco", "not a name")),
        ["spec.recommender.tlsConfig.serverName (\"not a name\") is not a DNS name"]
    );
}

#[test]
fn recommender_tls_options_watermarkd_cannot_honour_are_said() {
    let yaml = with(&[
        ("recommender", Some("{url: https://reco, highWatermark: 1, tlsConfig: {minVersion: TLS12}}")),
        ("metrics", None),
    ]);
    let MappedWpa { notes, .. } = mapped(&yaml);
    assert_eq!(
        notes,
        ["spec.recommender.tlsConfig.minVersion (TLS12) has no effect: watermarkd always negotiates TLS 1.2 or 1.3"]
    );
}
