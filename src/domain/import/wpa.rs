//! A `WatermarkPodAutoscaler` as a rules-file autoscaler: read by the same mapping CRD mode
//! runs (`crd::map_wpa`, with the Cluster Agent's query for its External metrics and the
//! `DatadogMetric`s read beside it), and the autoscaler it yields written back field by field.

use serde_json::Value;
use watermarkd_engine::{Algorithm, ConvergeTowards, Velocity};

use super::hpa::{datadog_backend, group_of, DATADOG_BACKEND};
use super::out::{Table, Value as Toml};
use super::{entry_head, finish_comments, Context, Converted, Subject};
use crate::domain::crd::{map_wpa, MapError, MappingOptions, WatermarkPodAutoscaler};
use crate::domain::fallback::FallbackAction;
use crate::domain::rules::{Autoscaler, PodAggregation, Reducer};

pub fn convert(value: &Value, subject: &mut Subject, context: &Context<'_>) -> Option<Converted> {
    let wpa: WatermarkPodAutoscaler = match serde_json::from_value(value.clone()) {
        Ok(wpa) => wpa,
        Err(err) => {
            subject.invalid("spec", format!("is not a WatermarkPodAutoscaler: {err}"));
            return None;
        }
    };
    let options = MappingOptions::new(DATADOG_BACKEND);
    let lookup = |namespace: &str, name: &str| {
        context.datadog_metrics.get(&(namespace.to_string(), name.to_string())).map(|found| found.query.clone())
    };
    let mapped = match map_wpa(&wpa, &options, &lookup) {
        Ok(mapped) => mapped,
        Err(MapError::Invalid { problems, unsupported }) => {
            for problem in problems {
                subject.invalid(&problem.field, problem.message);
            }
            for item in unsupported {
                subject.not_carried(&item.field, item.message);
            }
            return None;
        }
        Err(MapError::Unsupported(unsupported)) => {
            for item in unsupported {
                subject.not_carried(&item.field, item.message);
            }
            return None;
        }
        Err(err @ MapError::TargetConflict { .. }) => {
            subject.not_carried("spec.scaleTargetRef", err.to_string());
            return None;
        }
    };
    for note in &mapped.notes {
        subject.chose(note.clone());
    }
    subject.chose("read as CRD mode reads it (docs/crd.md): the same autoscaler, written out field by field");
    let autoscaler = mapped.autoscaler;
    let uses_datadog = autoscaler.metrics.iter().any(|m| m.backend == DATADOG_BACKEND);
    let mut backends = Vec::new();
    if uses_datadog {
        backends.push(datadog_backend(context, subject));
    }
    if let Some(other) = autoscaler.metrics.iter().find(|m| m.resource.is_none() && m.backend != DATADOG_BACKEND) {
        subject.not_carried(
            "metadata.annotations",
            format!(
                "{} names the backend {:?}, which is the daemon's settings' and not known here: write its \
                 [backend.{}] table by hand",
                crate::domain::crd::QUERIES_ANNOTATION,
                other.backend,
                other.backend
            ),
        );
        return None;
    }
    if !autoscaler.schedules.is_empty() {
        subject.not_carried(
            "metadata.annotations",
            "watermarkd.io/schedules is not written by import yet: copy the windows by hand",
        );
        return None;
    }
    if autoscaler.forecast.is_some() {
        subject.not_carried(
            "metadata.annotations",
            "watermarkd.io/forecast is not written by import yet: copy it by hand",
        );
        return None;
    }
    let entry = write(&autoscaler, subject, context);
    let target = &autoscaler.target;
    Some(Converted {
        entry,
        backends,
        target: (
            group_of(&target.api_version),
            target.kind.to_string(),
            target.namespace.to_string(),
            target.name.to_string(),
        ),
    })
}

fn seconds(duration: std::time::Duration) -> Toml {
    Toml::text(format!("{}s", duration.as_secs()))
}

fn write(autoscaler: &Autoscaler, subject: &mut Subject, context: &Context<'_>) -> super::out::Entry {
    let target = &autoscaler.target;
    let target_value = Toml::Inline(vec![
        ("api_version".into(), Toml::text(target.api_version.to_string())),
        ("kind".into(), Toml::text(target.kind.to_string())),
        ("namespace".into(), Toml::text(target.namespace.to_string())),
        ("name".into(), Toml::text(target.name.to_string())),
    ]);
    let mut entry = entry_head(subject, &target_value, context);
    let rule = &autoscaler.rule;
    let main = &mut entry.main;
    main.set("min_replicas", Toml::Integer(i64::from(rule.min_replicas())));
    main.set("max_replicas", Toml::Integer(i64::from(rule.max_replicas())));
    main.set(
        "algorithm",
        Toml::text(match rule.algorithm() {
            Algorithm::Absolute => "absolute",
            Algorithm::Average => "average",
        }),
    );
    let (up, down) = (rule.upscale_tolerance(), rule.downscale_tolerance());
    if up == down {
        main.set("tolerance", Toml::Number(up.to_string()));
    } else {
        main.set("upscale_tolerance", Toml::Number(up.to_string()));
        main.set("downscale_tolerance", Toml::Number(down.to_string()));
    }
    match rule.velocity() {
        Velocity::Watermark(knobs) => {
            main.set("scale_up_limit_factor", Toml::Number(knobs.scale_up_limit_factor.to_string()));
            main.set("scale_down_limit_factor", Toml::Number(knobs.scale_down_limit_factor.to_string()));
            main.set("upscale_forbidden_window", seconds(knobs.upscale_forbidden_window));
            main.set("downscale_forbidden_window", seconds(knobs.downscale_forbidden_window));
        }
        Velocity::Behavior(_) => {
            // A WPA has no behavior block; the mapping never makes one.
        }
    }
    main.set("upscale_delay_above_watermark", seconds(rule.upscale_delay_above_watermark()));
    main.set("downscale_delay_below_watermark", seconds(rule.downscale_delay_below_watermark()));
    main.set("replica_modulo", Toml::Integer(i64::from(rule.replica_modulo())));
    if let Some(towards) = rule.converge_towards_watermark() {
        main.set(
            "converge_towards_watermark",
            Toml::text(match towards {
                ConvergeTowards::High => "high",
                ConvergeTowards::Low => "low",
            }),
        );
    }
    main.set("tolerate_zero", Toml::Flag(rule.tolerate_zero()));
    main.set("min_available_replica_percentage", Toml::Integer(i64::from(rule.min_available_replica_percentage())));
    if rule.dry_run() {
        main.set_with("dry_run", Toml::Flag(true), "spec.dryRun");
    }
    if autoscaler.shadow {
        main.set_with("shadow", Toml::Flag(true), "the watermarkd.io/shadow annotation");
    }
    if let Some(until) = autoscaler.paused_until {
        if let Ok(at) = jiff::Timestamp::from_millisecond(until.unix_millis()) {
            main.set_with("paused_until", Toml::text(at.to_string()), "the watermarkd.io/paused-until annotation");
        }
    }
    if let Some(recommender) = &autoscaler.recommender {
        let mut table = Table::default();
        table.set("url", Toml::text(recommender.url.clone()));
        table.set("target_type", Toml::text(recommender.target_type.clone()));
        if !recommender.settings.is_empty() {
            table.set(
                "settings",
                Toml::Inline(recommender.settings.iter().map(|(k, v)| (k.clone(), Toml::text(v.clone()))).collect()),
            );
        }
        if let Some(metric) = rule.metrics().first() {
            table.set("high_watermark", Toml::Number(metric.high_watermark.to_string()));
            table.set("low_watermark", Toml::Number(metric.low_watermark.to_string()));
        }
        table.set("timeout", seconds(recommender.timeout));
        if let Some(cluster) = &recommender.cluster_name {
            table.set("cluster_name", Toml::text(cluster.clone()));
        }
        for (key, file) in [
            ("ca_file", &recommender.tls.ca_file),
            ("client_cert_file", &recommender.tls.client_cert_file),
            ("client_key_file", &recommender.tls.client_key_file),
        ] {
            if let Some(path) = file {
                table.set(key, Toml::text(path.display().to_string()));
            }
        }
        if recommender.tls.insecure_skip_verify {
            table.set("insecure_skip_verify", Toml::Flag(true));
        }
        if let Some(server) = &recommender.server_name {
            table.set("server_name", Toml::text(server.clone()));
        }
        entry.recommender = Some(table);
    }
    for (metric, source) in rule.metrics().iter().zip(&autoscaler.metrics) {
        let mut table = Table::default();
        table.set("name", Toml::text(metric.name.clone()));
        match &source.resource {
            Some(resource) => {
                table.set("resource", Toml::text(resource.resource.as_str()));
                table.set("selector", Toml::text(resource.selector.clone()));
                table.set(
                    "pod_aggregation",
                    Toml::text(match resource.aggregation {
                        PodAggregation::Sum => "sum",
                        PodAggregation::Average => "average",
                    }),
                );
                table.set("readiness_delay", seconds(resource.readiness_delay));
            }
            None => {
                table.set("backend", Toml::text(source.backend.clone()));
                table.set("query", Toml::text(source.query.clone()));
                if let Some(reducer) = source.reducer {
                    table.set(
                        "reducer",
                        Toml::text(match reducer {
                            Reducer::Max => "max",
                            Reducer::Min => "min",
                            Reducer::Sum => "sum",
                            Reducer::Avg => "avg",
                        }),
                    );
                }
            }
        }
        table.set("high_watermark", Toml::Number(metric.high_watermark.to_string()));
        table.set("low_watermark", Toml::Number(metric.low_watermark.to_string()));
        if let Some(age) = metric.max_age {
            table.set("max_age", seconds(age));
        }
        entry.metrics.push(table);
    }
    if let Some(fallback) = &autoscaler.fallback {
        let mut table = Table::default();
        table.set("after", seconds(fallback.after));
        table.set("recover_after", seconds(fallback.recover_after));
        match fallback.action {
            FallbackAction::Hold => table.set("action", Toml::text("hold")),
            FallbackAction::LastGood => table.set("action", Toml::text("last_good")),
            FallbackAction::Replicas { replicas, scale_down } => {
                table.set("action", Toml::text("replicas"));
                table.set("replicas", Toml::Integer(i64::from(replicas)));
                table.set("scale_down", Toml::Flag(scale_down));
            }
        }
        entry.fallback = Some(table);
    }
    finish_comments(&mut entry, subject);
    entry
}
