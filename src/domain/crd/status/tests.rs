//! Unit tests of status building: real engine decisions on a mapped WPA, evaluation after
//! evaluation, checking what the Datadog controller would show and when it changes.

use watermarkd_engine::{decide, Reading, Rule, State, Target};

use super::super::mapping::{map_wpa, MappingOptions};
use super::super::query::NoDatadogMetrics;
use super::super::types::WatermarkPodAutoscaler;
use super::*;

const WPA: &str = r#"
metadata: {name: billing, namespace: prod}
spec:
  scaleTargetRef: {kind: Deployment, name: billing}
  minReplicas: 2
  maxReplicas: 9
  metrics:
  - type: External
    external:
      metricName: latency
      metricSelector: {matchLabels: {service: billing}}
      highWatermark: 400m
      lowWatermark: 150m
"#;

fn wpa(extra: &str) -> WatermarkPodAutoscaler {
    serde_yaml_ng::from_str(&format!("{WPA}{extra}")).unwrap()
}

/// The rule a WPA maps to, its recommender (at `http://reco`) allowed.
fn rule(wpa: &WatermarkPodAutoscaler) -> Rule {
    let allowed = crate::domain::crd::AllowedUrl::parse("http://reco").unwrap();
    let options = MappingOptions::new("dd")
        .with_recommender_policy(crate::domain::crd::RecommenderPolicy::new(vec![allowed], None));
    map_wpa(wpa, &options, &NoDatadogMetrics).unwrap().autoscaler.rule
}

fn t(seconds: i64) -> Timestamp {
    // 2024-05-01T12:00:00Z plus `seconds`.
    Timestamp::from_unix_millis((1_714_564_800 + seconds) * 1000)
}

fn target(replicas: u32) -> Target {
    Target { spec_replicas: replicas, status_replicas: Some(replicas), ready_replicas: Some(replicas) }
}

fn value(v: f64, at: Timestamp) -> Reading {
    Reading::Value { value: v, at }
}

/// `type=status/reason` for each condition, in the order they are stored.
fn conditions(status: &WatermarkPodAutoscalerStatus) -> Vec<String> {
    status
        .conditions
        .iter()
        .map(|c| format!("{}={}/{}", c.type_, c.status, c.reason.as_deref().unwrap_or_default()))
        .collect()
}

fn since(status: &WatermarkPodAutoscalerStatus, type_: &str) -> Option<Timestamp> {
    status.condition(type_).and_then(|c| c.last_transition_time)
}

fn value_column(status: &WatermarkPodAutoscalerStatus) -> Vec<String> {
    status
        .current_metrics
        .iter()
        .filter_map(|m| m.external.as_ref()?.current_value.as_ref().map(ToString::to_string))
        .collect()
}

#[test]
fn a_scale_up_and_the_forbidden_windows_after_it() {
    let wpa = wpa("");
    let rule = rule(&wpa);

    // 4 replicas at 0.6 against a high watermark of 0.4: scale to 6.
    let now = t(0);
    let first = decide(&rule, target(4), &[value(0.6, now)], &State::default(), now);
    assert_eq!((first.action, first.replicas), (Action::ScaleUp, 6));
    let status = next_status(None, &wpa.spec, &first, &ScaleWrite::Succeeded, t(0));
    assert_eq!(
        conditions(&status),
        [
            "DryRun=False/DryRun mode disabled",
            "AbleToScale=True/SuccessfulScale",
            "AboveHighWatermark=True/Value above High Watermark",
            "BelowLowWatermark=False/Value below Low Watermark",
            "ScalingActive=True/ValidMetricFound",
            "ScalingLimited=False/DesiredWithinRange",
        ]
    );
    assert!(status.conditions.iter().all(|c| c.last_transition_time == Some(t(0))));
    assert_eq!((status.current_replicas, status.desired_replicas), (4, 6));
    assert_eq!((status.last_scale_time, status.scaling_events_count), (Some(t(0)), Some(1)));
    assert_eq!(
        (status.last_condition_type.as_deref(), status.last_condition_state.as_deref()),
        (Some("AbleToScale"), Some("True"))
    );
    assert_eq!(value_column(&status), ["600m"]);
    let external = status.current_metrics[0].external.as_ref().unwrap();
    assert_eq!(external.metric_name, "latency");
    assert_eq!(external.metric_selector, wpa.spec.metrics[0].external.as_ref().unwrap().metric_selector);
    assert_eq!(
        status.condition(SCALING_ACTIVE).unwrap().message.as_deref(),
        Some("the WPA was able to successfully calculate a replica count from latency")
    );

    // 10s later, inside the band: hold, both windows still closed.
    let now = t(10);
    let second = decide(&rule, target(6), &[value(0.41, now)], &first.state, now);
    assert_eq!(second.action, Action::Hold);
    let status2 = next_status(Some(&status), &wpa.spec, &second, &ScaleWrite::NotAttempted, now);
    assert_eq!(
        status2.condition(ABLE_TO_SCALE).map(|c| (c.status.as_str(), c.reason.as_deref())),
        Some(("False", Some("BackoffBoth")))
    );
    // Only the conditions that flipped moved, and they sort first.
    assert_eq!(since(&status2, ABLE_TO_SCALE), Some(t(10)));
    assert_eq!(since(&status2, ABOVE_HIGH_WATERMARK), Some(t(10)));
    assert_eq!(since(&status2, DRY_RUN), Some(t(0)));
    assert_eq!(since(&status2, SCALING_ACTIVE), Some(t(0)));
    assert_eq!(since(&status2, SCALING_LIMITED), Some(t(0)));
    assert_eq!(
        &conditions(&status2)[..2],
        ["AbleToScale=False/BackoffBoth", "AboveHighWatermark=False/Value above High Watermark"]
    );
    assert_eq!((status2.current_replicas, status2.desired_replicas), (6, 6));
    assert_eq!((status2.last_scale_time, status2.scaling_events_count), (Some(t(0)), Some(1)));
    assert_eq!(status2.last_condition_type.as_deref(), Some("AbleToScale"));
    assert_eq!(status2.last_condition_state.as_deref(), Some("False"));
    assert_eq!(value_column(&status2), ["410m"]);
    assert!(status_changed(Some(&status), &status2));

    // The same reading 5s later changes nothing: no write.
    let now = t(15);
    let third = decide(&rule, target(6), &[value(0.41, t(10))], &second.state, now);
    let status3 = next_status(Some(&status2), &wpa.spec, &third, &ScaleWrite::NotAttempted, now);
    assert!(!status_changed(Some(&status2), &status3), "{status2:#?}\n{status3:#?}");

    // After the upscale window (60s) only the downscale one remains.
    let now = t(70);
    let fourth = decide(&rule, target(6), &[value(0.41, now)], &third.state, now);
    let status4 = next_status(Some(&status3), &wpa.spec, &fourth, &ScaleWrite::NotAttempted, now);
    assert_eq!(status4.condition(ABLE_TO_SCALE).unwrap().reason.as_deref(), Some("BackoffDownscale"));
    // Still False: the transition time stays where the flip was.
    assert_eq!(since(&status4, ABLE_TO_SCALE), Some(t(10)));
}

#[test]
fn a_failed_write_keeps_the_previous_desired_count() {
    let wpa = wpa("");
    let rule = rule(&wpa);
    let previous = WatermarkPodAutoscalerStatus { current_replicas: 4, desired_replicas: 4, ..Default::default() };
    let decision = decide(&rule, target(4), &[value(0.6, t(0))], &State::default(), t(0));
    let status = next_status(Some(&previous), &wpa.spec, &decision, &ScaleWrite::Failed("forbidden".into()), t(0));
    let able = status.condition(ABLE_TO_SCALE).unwrap();
    assert_eq!((able.status.as_str(), able.reason.as_deref()), ("False", Some("FailedScale")));
    assert_eq!(able.message.as_deref(), Some("watermarkd was unable to update the target scale: forbidden"));
    assert_eq!(status.desired_replicas, 4);
    assert_eq!((status.last_scale_time, status.scaling_events_count), (None, None));
}

#[test]
fn a_dry_run_reports_the_scale_it_would_make() {
    let wpa = wpa("  dryRun: true\n");
    let rule = rule(&wpa);
    let decision = decide(&rule, target(4), &[value(0.6, t(0))], &State::default(), t(0));
    assert!(decision.dry_run && !decision.write);
    let status = next_status(None, &wpa.spec, &decision, &ScaleWrite::NotAttempted, t(0));
    assert_eq!(status.condition(DRY_RUN).unwrap().status, "True");
    assert_eq!(status.condition(ABLE_TO_SCALE).unwrap().reason.as_deref(), Some("ReadyForScale"));
    // As the Datadog controller: the scale counts, so the windows apply as if it had happened.
    assert_eq!(
        (status.desired_replicas, status.last_scale_time, status.scaling_events_count),
        (6, Some(t(0)), Some(1))
    );
}

#[test]
fn limits_are_reported_as_scaling_limited() {
    let wpa = wpa("  scaleUpLimitFactor: 25\n");
    let rule = rule(&wpa);
    // 4 at 0.9 asks for 9; the up limit is 4 + 1.
    let decision = decide(&rule, target(4), &[value(0.9, t(0))], &State::default(), t(0));
    assert_eq!(decision.replicas, 5);
    let status = next_status(None, &wpa.spec, &decision, &ScaleWrite::Succeeded, t(0));
    let limited = status.condition(SCALING_LIMITED).unwrap();
    assert_eq!((limited.status.as_str(), limited.reason.as_deref()), ("True", Some("ScaleUpLimit")));

    let above_max = decide(&rule, target(12), &[value(0.3, t(0))], &State::default(), t(0));
    let status = next_status(None, &wpa.spec, &above_max, &ScaleWrite::Succeeded, t(0));
    assert_eq!(status.condition(SCALING_LIMITED).unwrap().reason.as_deref(), Some("TooManyReplicas"));
    assert_eq!(status.desired_replicas, 9);
}

#[test]
fn missing_data_keeps_the_last_values_and_says_why() {
    let wpa = wpa("");
    let rule = rule(&wpa);
    let first = decide(&rule, target(4), &[value(0.3, t(0))], &State::default(), t(0));
    let status = next_status(None, &wpa.spec, &first, &ScaleWrite::NotAttempted, t(0));
    assert_eq!(value_column(&status), ["300m"]);
    let unavailable = Reading::Unavailable { reason: "no data in the last 300s".into() };
    let second = decide(&rule, target(4), &[unavailable], &first.state, t(15));
    let status2 = next_status(Some(&status), &wpa.spec, &second, &ScaleWrite::NotAttempted, t(15));
    let active = status2.condition(SCALING_ACTIVE).unwrap();
    assert_eq!((active.status.as_str(), active.reason.as_deref()), ("False", Some("FailedGetExternalMetric")));
    assert_eq!(
        active.message.as_deref(),
        Some("the WPA was unable to compute the replica count: latency: no data in the last 300s")
    );
    assert_eq!(value_column(&status2), ["300m"]);
    // Normalization did not run: ScalingLimited is as it was.
    assert_eq!(status2.condition(SCALING_LIMITED), status.condition(SCALING_LIMITED));
    assert_eq!(status2.last_condition_type.as_deref(), Some("ScalingActive"));
}

#[test]
fn a_paused_target_disables_scaling() {
    let wpa = wpa("");
    let decision = decide(&rule(&wpa), target(0), &[value(0.9, t(0))], &State::default(), t(0));
    let status = next_status(None, &wpa.spec, &decision, &ScaleWrite::NotAttempted, t(0));
    let active = status.condition(SCALING_ACTIVE).unwrap();
    assert_eq!((active.status.as_str(), active.reason.as_deref()), ("False", Some("ScalingDisabled")));
    assert_eq!((status.current_replicas, status.desired_replicas), (0, 0));
}

#[test]
fn rejected_wpas_say_why_and_keep_their_counts() {
    let invalid = serde_yaml_ng::from_str::<WatermarkPodAutoscaler>(&WPA.replace("  maxReplicas: 9\n", "")).unwrap();
    let error = map_wpa(&invalid, &MappingOptions::new("dd"), &NoDatadogMetrics).unwrap_err();
    let previous = WatermarkPodAutoscalerStatus { current_replicas: 3, desired_replicas: 3, ..Default::default() };
    let status = rejected_status(Some(&previous), &error, t(5));
    assert_eq!(conditions(&status), ["ScalingActive=False/FailedProcessWPA", "AbleToScale=False/FailedSpecCheck"]);
    assert_eq!(
        status.condition(ABLE_TO_SCALE).unwrap().message.as_deref(),
        Some("Invalid WPA specification: spec.maxReplicas is required")
    );
    assert_eq!((status.current_replicas, status.desired_replicas), (3, 3));
    assert_eq!(status.last_condition_type.as_deref(), Some("AbleToScale"));
    // Unchanged when it is rejected again for the same reason.
    assert!(!status_changed(Some(&status), &rejected_status(Some(&status), &error, t(20))));

    let unsupported = MapError::Unsupported(vec![super::super::mapping::Unsupported {
        wpa: "prod/billing".into(),
        field: "spec.recommender".into(),
        message: "is not supported yet".into(),
    }]);
    let status = rejected_status(None, &unsupported, t(5));
    assert_eq!(conditions(&status), ["ScalingActive=False/NotSupported"]);
    assert_eq!(
        status.condition(SCALING_ACTIVE).unwrap().message.as_deref(),
        Some("watermarkd does not run this WPA: spec.recommender is not supported yet")
    );
    let json = serde_json::to_value(&status).unwrap();
    assert_eq!(json["currentReplicas"], 0, "required by the CRD, so always written");
    assert_eq!(json["conditions"][0]["lastTransitionTime"], "2024-05-01T12:00:05Z");
}

#[test]
fn status_changes_compare_quantities_by_value_and_keep_times_to_the_millisecond() {
    let mut a = WatermarkPodAutoscalerStatus {
        current_metrics: vec![MetricStatus {
            type_: "External".into(),
            external: Some(ExternalMetricStatus {
                metric_name: "latency".into(),
                current_value: Some(Quantity::from("0.6")),
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    };
    set_condition(&mut a, ABLE_TO_SCALE, true, "SucceededGetScale", "ok", t(0));
    let mut b = a.clone();
    b.current_metrics[0].external.as_mut().unwrap().current_value = Some(Quantity::from("600m"));
    assert!(!status_changed(Some(&a), &b));
    set_condition(
        &mut b,
        ABLE_TO_SCALE,
        true,
        "SucceededGetScale",
        "ok",
        Timestamp::from_unix_millis(t(30).unix_millis() + 400),
    );
    assert!(!status_changed(Some(&a), &b), "no flip, no move");
    set_condition(
        &mut b,
        ABLE_TO_SCALE,
        false,
        "BackoffUpscale",
        "wait",
        Timestamp::from_unix_millis(t(30).unix_millis() + 400),
    );
    assert!(status_changed(Some(&a), &b));
    // Milliseconds are kept: the AboveHighWatermark / BelowLowWatermark transition times are
    // what a restarted daemon restores its delays from, exactly.
    assert_eq!(since(&b, ABLE_TO_SCALE), Some(Timestamp::from_unix_millis(t(30).unix_millis() + 400)));
    assert!(status_changed(None, &a));
}

#[test]
fn a_recommender_is_one_metric_entry_as_the_datadog_controller_writes_it() {
    let recommender: WatermarkPodAutoscaler = serde_yaml_ng::from_str(
        "metadata: {name: web, namespace: prod}\nspec:\n  scaleTargetRef: {kind: Deployment, name: web}\n  \
         maxReplicas: 9\n  recommender: {url: http://reco, targetType: load, lowWatermark: 150m, highWatermark: 400m}\n",
    )
    .unwrap();
    let rule = rule(&recommender);
    let reply = Reading::Replicas { replicas: 6, lower_bound: Some(5), upper_bound: Some(8), observed: Some(0.7314) };
    let first = decide(&rule, target(4), &[reply], &State::default(), t(0));
    let status = next_status(None, &recommender.spec, &first, &ScaleWrite::Succeeded, t(0));
    assert_eq!(status.current_metrics.len(), 1);
    assert_eq!(status.current_metrics[0].type_, "Resource");
    let entry = status.current_metrics[0].external.as_ref().unwrap();
    assert_eq!(entry.metric_name, "recommender{targetType:load}");
    assert_eq!(value_column(&status), ["731m"], "in thousandths, truncated as there");

    // A failed request keeps the last entry.
    let failed = Reading::Unavailable { reason: "timed out after 10s".into() };
    let second = decide(&rule, target(6), &[failed], &first.state, t(15));
    let status = next_status(Some(&status), &recommender.spec, &second, &ScaleWrite::NotAttempted, t(15));
    assert_eq!(value_column(&status), ["731m"]);
}

#[test]
fn a_resource_metric_reports_its_current_average_value_as_the_datadog_controller_does() {
    let wpa: WatermarkPodAutoscaler = serde_yaml_ng::from_str(
        r#"
metadata: {name: web, namespace: prod}
spec:
  scaleTargetRef: {kind: Deployment, name: web}
  maxReplicas: 9
  metrics:
  - type: Resource
    resource: {name: cpu, highWatermark: 500m, lowWatermark: 200m, metricSelector: {matchLabels: {app: web}}}
"#,
    )
    .unwrap();
    let rule = rule(&wpa);
    // The sum over 3 pods, 1.25 cores, as the Datadog controller's default compares it.
    let decision = decide(&rule, target(3), &[value(1.25, t(0))], &State::default(), t(0));
    let status = next_status(None, &wpa.spec, &decision, &ScaleWrite::Succeeded, t(0));
    let metric = &status.current_metrics[0];
    assert_eq!(metric.type_, "Resource");
    let resource = metric.resource.as_ref().unwrap();
    assert_eq!(resource.name, "cpu");
    assert_eq!(resource.current_average_value.as_ref().map(ToString::to_string).as_deref(), Some("1250m"));
    assert!(metric.external.is_none());
    // No value this time: the last one stays.
    let held = decide(&rule, target(8), &[Reading::Unavailable { reason: "no data".into() }], &State::default(), t(9));
    let next = next_status(Some(&status), &wpa.spec, &held, &ScaleWrite::NotAttempted, t(9));
    assert_eq!(next.current_metrics, status.current_metrics);
}

#[test]
fn the_conditions_are_those_a_fresh_status_shows() {
    let wpa = wpa("");
    let rule = rule(&wpa);
    let up = decide(&rule, target(4), &[value(0.6, t(0))], &State::default(), t(0));
    let windows = decide(&rule, target(6), &[value(0.6, t(30))], &up.state, t(30));
    let no_data = decide(&rule, target(4), &[Reading::Unavailable { reason: "down".into() }], &State::default(), t(0));
    let failed = ScaleWrite::Failed("forbidden".into());
    for (decision, write) in
        [(&up, &ScaleWrite::Succeeded), (&up, &failed), (&windows, &ScaleWrite::NotAttempted), (&no_data, &failed)]
    {
        let shown = next_status(None, &wpa.spec, decision, write, t(0));
        let mut expected: Vec<(&str, bool)> =
            shown.conditions.iter().map(|c| (c.type_.as_str(), c.status == "True")).collect();
        let mut set = super::conditions(decision, write);
        expected.sort_unstable();
        set.sort_unstable();
        assert_eq!(set, expected, "{}", decision.reason);
    }
    // AbleToScale is set three times on a failed write; the last setting is the one left.
    assert!(super::conditions(&up, &failed).contains(&(ABLE_TO_SCALE, false)));
}

#[test]
fn a_floor_raised_by_a_schedule_and_a_fallback_say_so_in_the_status() {
    let wpa = wpa("");
    let rule = rule(&wpa);
    let now = t(0);
    let office = watermarkd_engine::Bounds {
        min: 8,
        max: rule.max_replicas(),
        min_by: Some("schedule \"office\" (open)".into()),
        max_by: None,
    };
    let raised = decide(&rule.within(office), target(4), &[value(0.3, now)], &State::default(), now);
    let status = next_status(None, &wpa.spec, &raised, &ScaleWrite::Succeeded, now);
    assert_eq!(
        status.condition(SCALING_LIMITED).and_then(|c| c.message.as_deref()),
        Some("the current replica count is below the minimum replica count, raised by schedule \"office\" (open)")
    );
    let fallback = watermarkd_engine::Fallback {
        replicas: 6,
        scale_down: false,
        because: "no usable metric value for 5m: falling back to 6 replicas".into(),
    };
    let missing = Reading::Unavailable { reason: "timeout".into() };
    let fell = decide(&rule.falling_back(fallback), target(4), &[missing], &State::default(), now);
    assert_eq!(fell.replicas, 6);
    let status = next_status(None, &wpa.spec, &fell, &ScaleWrite::Succeeded, now);
    let message = status.condition(SCALING_ACTIVE).and_then(|c| c.message.clone()).unwrap_or_default();
    assert!(message.ends_with("; in fallback: no usable metric value for 5m: falling back to 6 replicas"), "{message}");
}

#[test]
fn a_forecast_and_a_fallback_have_conditions_of_their_own_that_leave_the_last_condition_alone() {
    let wpa = wpa("");
    let rule = rule(&wpa);
    let now = t(0);
    let decision = decide(&rule, target(4), &[value(0.3, now)], &State::default(), now);
    let mut status = next_status(None, &wpa.spec, &decision, &ScaleWrite::NotAttempted, now);
    let last = (status.last_condition_type.clone(), status.last_condition_state.clone());
    with_ahead(
        &mut status,
        Some(Ok("expects latency 0.5 in 10m: a floor of 6 replicas (observed only)")),
        Some(false),
        now,
    );
    assert_eq!(
        status.condition(FORECAST).map(|c| (c.status.as_str(), c.message.as_deref())),
        Some(("True", Some("expects latency 0.5 in 10m: a floor of 6 replicas (observed only)")))
    );
    assert_eq!(status.condition(FALLBACK).map(|c| c.status.as_str()), Some("False"));
    assert_eq!((status.last_condition_type.clone(), status.last_condition_state.clone()), last);
    with_ahead(&mut status, Some(Err("latency: too little history")), Some(true), t(60));
    assert_eq!(status.condition(FORECAST).map(|c| c.reason.as_deref()), Some(Some("NotForecasting")));
    assert_eq!(status.condition(FALLBACK).and_then(|c| c.last_transition_time), Some(t(60)));
}

#[test]
fn a_held_write_says_who_scales_the_target_in_able_to_scale_as_the_last_condition() {
    let wpa = wpa("");
    let rule = rule(&wpa);
    let now = t(0);
    let decision = decide(&rule, target(4), &[value(0.6, now)], &State::default(), now);
    let mut status = next_status(None, &wpa.spec, &decision, &ScaleWrite::NotAttempted, now);
    let note = crate::domain::claims::ClaimNote {
        claimed_by: vec!["HorizontalPodAutoscaler/prod/web".into()],
        withheld: true,
        taking_over: false,
        sentence: "HorizontalPodAutoscaler prod/web already scales this target".into(),
    };
    with_claims(&mut status, &note, now);
    let able = status.condition(ABLE_TO_SCALE).expect("AbleToScale");
    assert_eq!((able.status.as_str(), able.reason.as_deref()), ("False", Some(TARGET_CLAIMED)));
    assert_eq!(able.message.as_deref(), Some(note.sentence.as_str()));
    assert_eq!(status.last_condition_type.as_deref(), Some(ABLE_TO_SCALE));
    // Taking over, or only observing beside it, holds nothing: the decision's own conditions stand.
    let mut taken = next_status(None, &wpa.spec, &decision, &ScaleWrite::Succeeded, now);
    let before = taken.clone();
    with_claims(&mut taken, &crate::domain::claims::ClaimNote { withheld: false, taking_over: true, ..note }, now);
    assert_eq!(taken, before);
}
