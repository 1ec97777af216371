//! One autoscaler entry of a document tree (a rules file's `[[autoscaler]]`, or a JSON rule for
//! `decide`) -> an [`AutoscalerDraft`]. Only what the document's shape decides is checked
//! here: each value's type, keys that do not belong in their table, the keys a resource metric
//! cannot have. Whether the autoscaler makes sense is `compile`'s to say.

use std::path::PathBuf;

// The HPA's bounds (and the engine's) are read here too, so that the problem names them
// whatever the value.
use watermarkd_engine::{
    Algorithm, ConvergeTowards, PolicyKind, SelectPolicy, MAX_POLICY_PERIOD, MAX_STABILIZATION_WINDOW,
};

use super::backend::{positive_duration_at_most, string_map, MAX_TIMEOUT};
use super::draft::{
    AutoscalerDraft, BehaviorDraft, FallbackDraft, Field, ForecastDraft, Given, KnobsDraft, MetricDraft, Origin,
    PolicyDraft, RecommenderDraft, ScalingRulesDraft, ScheduleDraft, TargetDraft,
};
use super::problem::{Sink, TableScope};
use super::reader::Table;
use super::selector::{parse_selector, selector_text};
use super::tree::{Kind, Node};
use super::{PodAggregation, Reducer, ResourceName};
use crate::domain::schedule::{parse_days, parse_time, Cron, Zone, MAX_RAMP, MAX_WINDOW};

const MIN_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

pub(crate) const ALGORITHMS: &str = "\"absolute\" or \"average\"";
pub(crate) const REDUCERS: &str = "\"max\", \"min\", \"sum\" or \"avg\"";
pub(crate) const RESOURCES: &str = "\"cpu\" or \"memory\"";
pub(crate) const POD_AGGREGATIONS: &str = "\"sum\" or \"average\"";

const AUTOSCALER_KEYS: &[&str] = &[
    "name",
    "target",
    "interval",
    "min_replicas",
    "max_replicas",
    "algorithm",
    "tolerance",
    "upscale_tolerance",
    "downscale_tolerance",
    "scale_up_limit_factor",
    "scale_down_limit_factor",
    "upscale_forbidden_window",
    "downscale_forbidden_window",
    "upscale_delay_above_watermark",
    "downscale_delay_below_watermark",
    "behavior",
    "replica_modulo",
    "converge_towards_watermark",
    "tolerate_zero",
    "min_available_replica_percentage",
    "dry_run",
    "scale_to_zero_delay",
    "shadow",
    "observe",
    "take_over",
    "metric",
    "recommender",
    "schedule",
    "paused_until",
    "fallback",
    "forecast",
];
const TARGET_KEYS: &[&str] = &["api_version", "kind", "namespace", "name"];
const METRIC_KEYS: &[&str] = &[
    "name",
    "backend",
    "query",
    "resource",
    "selector",
    "pod_aggregation",
    "readiness_delay",
    "high_watermark",
    "low_watermark",
    "max_age",
    "reducer",
    "activation",
];
/// The keys of a resource metric only.
const RESOURCE_KEYS: &[&str] = &["selector", "pod_aggregation", "readiness_delay"];
const RECOMMENDER_KEYS: &[&str] = &[
    "url",
    "target_type",
    "settings",
    "high_watermark",
    "low_watermark",
    "timeout",
    "cluster_name",
    "ca_file",
    "client_cert_file",
    "client_key_file",
    "insecure_skip_verify",
    "server_name",
];
const SCHEDULE_KEYS: &[&str] = &[
    "name",
    "time_zone",
    "days",
    "start",
    "end",
    "cron",
    "duration",
    "min_replicas",
    "max_replicas",
    "ramp_in",
    "ramp_out",
];
const FORECAST_KEYS: &[&str] = &["lead_time", "mode", "max_error", "max_factor"];
const FALLBACK_KEYS: &[&str] = &["after", "recover_after", "action", "replicas", "scale_down"];
const BEHAVIOR_KEYS: &[&str] = &["scale_up", "scale_down"];
const SCALING_RULES_KEYS: &[&str] = &["tolerance", "stabilization_window", "select_policy", "policies"];
const POLICY_KEYS: &[&str] = &["type", "value", "period"];

/// Which document the entry is in, which decides how it is named while it has no name.
#[derive(Clone, Copy)]
pub(crate) enum Source {
    /// Entry `index` of a rules file's `[[autoscaler]]` list.
    File { index: usize },
    /// A JSON rule (`decide`).
    Json,
}

/// Reads one entry, reporting what its shape gets wrong; `None` when it is not a table at all.
pub(crate) fn read_autoscaler(node: &Node, source: Source, sink: &mut Sink) -> Option<AutoscalerDraft> {
    let unnamed = match source {
        Source::File { index } => {
            TableScope { label: format!("autoscaler[{index}]"), separator: ".", ..TableScope::default() }
        }
        Source::Json => TableScope::default(),
    };
    if node.entries().is_none() {
        let message = match source {
            Source::File { .. } => format!("must be a table ([[autoscaler]]), not {}", node.kind.describe()),
            Source::Json => format!("the rule must be a JSON object, not {}", node.kind.describe()),
        };
        sink.report_table(&unnamed, node.line, message);
        return None;
    }
    let mut table = Table::new(node, unnamed, sink)?;
    let origin = Origin::new(table.scope.label.clone(), node.line);
    let name = read(&mut table, sink, "name", Table::text);
    let label = name.value().cloned();
    if let Some(label) = &label {
        // From here on every problem names the autoscaler instead of its position.
        table.set_scope(TableScope { autoscaler: Some(label.clone()), ..TableScope::default() });
    }
    let target = read_target(&mut table, sink);
    let interval = read(&mut table, sink, "interval", |table, sink, key| {
        let interval = table.duration(sink, key)?;
        if interval < MIN_INTERVAL {
            let shown = humantime::format_duration(interval);
            table.report(sink, key, format!("({shown}) must be at least 1s"));
            return None;
        }
        Some(interval)
    });
    let shadow = read(&mut table, sink, "shadow", Table::flag);
    let observe = read(&mut table, sink, "observe", Table::flag);
    let take_over = read(&mut table, sink, "take_over", Table::flag);
    let metrics = read_metrics(&mut table, source, sink);
    let recommender = read_recommender(&mut table, sink);
    let (knobs, behavior) = read_knobs(&mut table, sink);
    let schedules = read_schedules(&mut table, sink, "schedule");
    let paused_until = read(&mut table, sink, "paused_until", |t, s, k| parsed(t, s, k, parse_instant));
    let fallback = match table.table(sink, "fallback") {
        Some(mut fallback) => {
            let draft = read_fallback(&mut fallback, sink);
            table.field("fallback", Some(draft))
        }
        None => table.field("fallback", None),
    };
    let forecast = match table.table(sink, "forecast") {
        Some(mut forecast) => {
            let draft = read_forecast(&mut forecast, sink);
            table.field("forecast", Some(draft))
        }
        None => table.field("forecast", None),
    };
    table.finish(sink, AUTOSCALER_KEYS);
    Some(AutoscalerDraft {
        label,
        origin,
        name,
        target,
        interval,
        shadow,
        observe,
        take_over,
        knobs,
        behavior,
        metrics,
        recommender,
        schedules,
        paused_until,
        fallback,
        forecast,
    })
}

/// Reads `key` with `read` into a draft's field.
fn read<'a, T>(
    table: &mut Table<'a>,
    sink: &mut Sink,
    key: &'static str,
    read: impl FnOnce(&mut Table<'a>, &mut Sink, &str) -> Option<T>,
) -> Field<T> {
    let value = read(table, sink, key);
    table.field(key, value)
}

fn read_target(table: &mut Table<'_>, sink: &mut Sink) -> Field<TargetDraft> {
    let Some(mut target) = table.table(sink, "target") else { return table.field("target", None) };
    let draft = TargetDraft {
        api_version: read(&mut target, sink, "api_version", Table::text),
        kind: read(&mut target, sink, "kind", Table::text),
        namespace: read(&mut target, sink, "namespace", Table::text),
        name: read(&mut target, sink, "name", Table::text),
    };
    target.finish(sink, TARGET_KEYS);
    table.field("target", Some(draft))
}

/// Every scalar knob of the rule, and `behavior`, in the order the rules file documents them.
fn read_knobs(table: &mut Table<'_>, sink: &mut Sink) -> (KnobsDraft, Field<BehaviorDraft>) {
    let number = |table: &mut Table<'_>, sink: &mut Sink, key: &'static str| read(table, sink, key, Table::number);
    let duration = |table: &mut Table<'_>, sink: &mut Sink, key: &'static str| read(table, sink, key, Table::duration);
    let replicas = |table: &mut Table<'_>, sink: &mut Sink, key: &'static str| read(table, sink, key, Table::replicas);
    let flag = |table: &mut Table<'_>, sink: &mut Sink, key: &'static str| read(table, sink, key, Table::flag);
    let min_replicas = replicas(table, sink, "min_replicas");
    let max_replicas = replicas(table, sink, "max_replicas");
    let algorithm = read(table, sink, "algorithm", |t, s, k| t.choice(s, k, Algorithm::parse, ALGORITHMS));
    let tolerance = number(table, sink, "tolerance");
    let upscale_tolerance = number(table, sink, "upscale_tolerance");
    let downscale_tolerance = number(table, sink, "downscale_tolerance");
    let scale_up_limit_factor = number(table, sink, "scale_up_limit_factor");
    let scale_down_limit_factor = number(table, sink, "scale_down_limit_factor");
    let upscale_forbidden_window = duration(table, sink, "upscale_forbidden_window");
    let downscale_forbidden_window = duration(table, sink, "downscale_forbidden_window");
    let upscale_delay_above_watermark = duration(table, sink, "upscale_delay_above_watermark");
    let downscale_delay_below_watermark = duration(table, sink, "downscale_delay_below_watermark");
    let behavior = read_behavior(table, sink);
    let knobs = KnobsDraft {
        min_replicas,
        max_replicas,
        algorithm,
        tolerance,
        upscale_tolerance,
        downscale_tolerance,
        scale_up_limit_factor,
        scale_down_limit_factor,
        upscale_forbidden_window,
        downscale_forbidden_window,
        upscale_delay_above_watermark,
        downscale_delay_below_watermark,
        replica_modulo: replicas(table, sink, "replica_modulo"),
        converge_towards_watermark: read(table, sink, "converge_towards_watermark", |t, s, k| {
            t.choice(s, k, ConvergeTowards::parse, "\"high\" or \"low\"")
        }),
        tolerate_zero: flag(table, sink, "tolerate_zero"),
        min_available_replica_percentage: read(table, sink, "min_available_replica_percentage", Table::count),
        dry_run: flag(table, sink, "dry_run"),
        scale_to_zero_delay: duration(table, sink, "scale_to_zero_delay"),
    };
    (knobs, behavior)
}

/// `[autoscaler.recommender]`.
fn read_recommender(table: &mut Table<'_>, sink: &mut Sink) -> Field<RecommenderDraft> {
    let Some(mut rec) = table.table(sink, "recommender") else { return table.field("recommender", None) };
    let text = |rec: &mut Table<'_>, sink: &mut Sink, key: &'static str| read(rec, sink, key, Table::text);
    let path = |rec: &mut Table<'_>, sink: &mut Sink, key: &'static str| {
        read(rec, sink, key, |rec, sink, key| rec.text(sink, key).map(PathBuf::from))
    };
    let draft = RecommenderDraft {
        origin: table.origin("recommender"),
        url: text(&mut rec, sink, "url"),
        target_type: text(&mut rec, sink, "target_type"),
        settings: read(&mut rec, sink, "settings", |rec, sink, key| {
            string_map(rec, sink, key).filter(|_| rec.has(key))
        }),
        low_watermark: read(&mut rec, sink, "low_watermark", Table::number),
        high_watermark: read(&mut rec, sink, "high_watermark", Table::number),
        timeout: read(&mut rec, sink, "timeout", |rec, sink, key| {
            positive_duration_at_most(rec, sink, key, MAX_TIMEOUT)
        }),
        cluster_name: text(&mut rec, sink, "cluster_name"),
        ca_file: path(&mut rec, sink, "ca_file"),
        client_cert_file: path(&mut rec, sink, "client_cert_file"),
        client_key_file: path(&mut rec, sink, "client_key_file"),
        insecure_skip_verify: read(&mut rec, sink, "insecure_skip_verify", Table::flag),
        server_name: text(&mut rec, sink, "server_name"),
        tls_dir: None,
    };
    rec.finish(sink, RECOMMENDER_KEYS);
    table.field("recommender", Some(draft))
}

fn read_metrics(table: &mut Table<'_>, source: Source, sink: &mut Sink) -> Field<Vec<Field<MetricDraft>>> {
    let Some(nodes) = table.list(sink, "metric", "[[autoscaler.metric]] sections in TOML") else {
        return table.field("metric", None);
    };
    let metrics =
        nodes.iter().enumerate().map(|(index, node)| read_metric(node, index, &table.scope, source, sink)).collect();
    table.field("metric", Some(metrics))
}

fn read_metric(node: &Node, index: usize, parent: &TableScope, source: Source, sink: &mut Sink) -> Field<MetricDraft> {
    let positional = parent.element("metric", index);
    let origin = Origin::new(positional.label.clone(), node.line);
    let Some(mut metric) = Table::new(node, positional.clone(), sink) else {
        return Field { given: Given::Unreadable, origin };
    };
    // The name is read first so that problems with the other keys can name the metric.
    let name = metric.text(sink, "name");
    if let Some(name) = &name {
        metric.set_scope(named_metric_scope(parent, &positional, name));
    }
    let query = metric.text(sink, "query");
    let resource = metric.choice(sink, "resource", ResourceName::parse, RESOURCES);
    // A metric without a name is named by its query, or else its resource.
    let named_by = [("name", name.clone()), ("query", query.clone()), ("resource", resource.map(|r| r.to_string()))]
        .into_iter()
        .find_map(|(key, label)| Some((key, label?)));
    let mut name_line = node.line;
    if let Some((key, label)) = &named_by {
        name_line = metric.line_of(key);
        metric.set_scope(named_metric_scope(parent, &positional, label));
    }
    let unnamed = !(metric.has("name") || metric.has("query") || metric.has("resource"));
    if unnamed {
        // Nothing names it: said here, as the metric's problem; its other keys are still read
        // for their own problems, and nothing more is said of it.
        let message = match source {
            Source::File { .. } => {
                "needs a query, or a resource (\"cpu\" or \"memory\") with a selector (and optionally a name, \
                 which defaults to the query or the resource)"
            }
            Source::Json => "needs a name (or a query, which then serves as its name)",
        };
        sink.report_table(&positional, node.line, message);
    }
    let mut name = metric.field("name", name);
    // Named where its name comes from: `name`, else the query or the resource.
    name.origin.line = name_line;
    let query = metric.field("query", query);
    let resource = metric.field("resource", resource);
    let backend = read(&mut metric, sink, "backend", Table::text);
    let reducer = read(&mut metric, sink, "reducer", |t, s, k| t.choice(s, k, parse_reducer, REDUCERS));
    let max_age = read(&mut metric, sink, "max_age", Table::duration);
    let (selector, pod_aggregation, readiness_delay);
    if resource.is_written() {
        for key in ["query", "backend", "reducer"] {
            if metric.has(key) {
                metric.report(
                    sink,
                    key,
                    "does not apply to a resource metric, which is read from the Kubernetes metrics API \
                     (metrics.k8s.io) through the API server",
                );
            }
        }
        selector = read(&mut metric, sink, "selector", read_selector);
        pod_aggregation = read(&mut metric, sink, "pod_aggregation", |t, s, k| {
            t.choice(s, k, PodAggregation::parse, POD_AGGREGATIONS)
        });
        readiness_delay = read(&mut metric, sink, "readiness_delay", Table::duration);
    } else {
        for key in RESOURCE_KEYS {
            if metric.take(key).is_some() {
                metric.report(sink, key, "only applies to a resource metric (resource = \"cpu\" or \"memory\")");
            }
        }
        (selector, pod_aggregation, readiness_delay) = (
            Field::absent(metric.origin("selector")),
            Field::absent(metric.origin("pod_aggregation")),
            Field::absent(metric.origin("readiness_delay")),
        );
    }
    let draft = MetricDraft {
        origin: origin.clone(),
        name,
        query,
        backend,
        reducer,
        resource,
        selector,
        pod_aggregation,
        readiness_delay,
        max_age,
        low_watermark: read(&mut metric, sink, "low_watermark", Table::number),
        high_watermark: read(&mut metric, sink, "high_watermark", Table::number),
        activation: read(&mut metric, sink, "activation", Table::number),
    };
    metric.finish(sink, METRIC_KEYS);
    let given = if unnamed { Given::Unreadable } else { Given::Value(draft) };
    Field { given, origin }
}

/// `selector`: the API server's text form (`"app=web,tier in (a,b)"`), or a table of labels
/// that must all match (`{ app = "web" }`).
fn read_selector(metric: &mut Table<'_>, sink: &mut Sink, key: &str) -> Option<String> {
    let entry = metric.take(key)?;
    let result = match &entry.value.kind {
        Kind::String(text) => parse_selector(text),
        Kind::Table(labels) => {
            let mut map = std::collections::BTreeMap::new();
            let mut wrong = None;
            for label in labels {
                match &label.value.kind {
                    Kind::String(value) => {
                        map.insert(label.key.clone(), value.clone());
                    }
                    other => {
                        wrong.get_or_insert(format!(
                            "label {:?} must have a string value, not {}",
                            label.key,
                            other.describe()
                        ));
                    }
                }
            }
            match wrong {
                Some(why) => Err(why),
                None => selector_text(&map, &[]),
            }
        }
        other => Err(format!(
            "must be a label selector such as \"app=web\" or a table of labels such as {{ app = \"web\" }}, not {}",
            other.describe()
        )),
    };
    result.map_err(|message| metric.report(sink, key, message)).ok()
}

/// Problems about a named metric name it (`metric "latency": low_watermark`), not its position.
fn named_metric_scope(parent: &TableScope, positional: &TableScope, name: &str) -> TableScope {
    TableScope { label: parent.field(&format!("metric {name:?}")), separator: ": ", ..positional.clone() }
}

pub(crate) fn parse_reducer(name: &str) -> Option<Reducer> {
    match name {
        "max" => Some(Reducer::Max),
        "min" => Some(Reducer::Min),
        "sum" => Some(Reducer::Sum),
        "avg" => Some(Reducer::Avg),
        _ => None,
    }
}

fn read_behavior(table: &mut Table<'_>, sink: &mut Sink) -> Field<BehaviorDraft> {
    let Some(mut behavior) = table.table(sink, "behavior") else { return table.field("behavior", None) };
    let draft = BehaviorDraft {
        scale_up: read_scaling_rules(&mut behavior, sink, "scale_up"),
        scale_down: read_scaling_rules(&mut behavior, sink, "scale_down"),
    };
    behavior.finish(sink, BEHAVIOR_KEYS);
    table.field("behavior", Some(draft))
}

fn read_scaling_rules(behavior: &mut Table<'_>, sink: &mut Sink, key: &'static str) -> Field<ScalingRulesDraft> {
    let Some(mut rules) = behavior.table(sink, key) else { return behavior.field(key, None) };
    let draft = ScalingRulesDraft {
        tolerance: read(&mut rules, sink, "tolerance", Table::number),
        stabilization_window: read(&mut rules, sink, "stabilization_window", |t, s, k| {
            t.duration_at_most(s, k, MAX_STABILIZATION_WINDOW)
        }),
        select_policy: read(&mut rules, sink, "select_policy", |t, s, k| {
            t.choice(s, k, SelectPolicy::parse, "\"max\", \"min\" or \"disabled\"")
        }),
        policies: read_policies(&mut rules, sink),
    };
    rules.finish(sink, SCALING_RULES_KEYS);
    behavior.field(key, Some(draft))
}

fn read_policies(rules: &mut Table<'_>, sink: &mut Sink) -> Field<Vec<Field<PolicyDraft>>> {
    let hint = "e.g. [{ type = \"pods\", value = 4, period = \"15s\" }]";
    let Some(nodes) = rules.list(sink, "policies", hint) else { return rules.field("policies", None) };
    let policies = nodes
        .iter()
        .enumerate()
        .map(|(index, node)| {
            let scope = rules.scope.element("policies", index);
            let origin = Origin::new(scope.label.clone(), node.line);
            let Some(mut policy) = Table::new(node, scope, sink) else {
                return Field { given: Given::Unreadable, origin };
            };
            let draft = PolicyDraft {
                kind: read(&mut policy, sink, "type", |t, s, k| {
                    t.choice(s, k, PolicyKind::parse, "\"pods\" or \"percent\"")
                }),
                // A number of pods, or a percentage of them: an int32 in the HPA either way.
                value: read(&mut policy, sink, "value", Table::replicas),
                period: read(&mut policy, sink, "period", |t, s, k| t.duration_at_most(s, k, MAX_POLICY_PERIOD)),
            };
            policy.finish(sink, POLICY_KEYS);
            Field { given: Given::Value(draft), origin }
        })
        .collect();
    rules.field("policies", Some(policies))
}

/// The windows of a schedule under `key` (`[[autoscaler.schedule]]`, or a WPA annotation's
/// list): each read for its shape, its values checked by the schedule's own parsers.
pub(crate) fn read_schedules(
    table: &mut Table<'_>,
    sink: &mut Sink,
    key: &'static str,
) -> Field<Vec<Field<ScheduleDraft>>> {
    let hint = "[[autoscaler.schedule]] sections in TOML";
    let Some(nodes) = table.list(sink, key, hint) else { return table.field(key, None) };
    let schedules = read_schedule_list(nodes, &table.scope, key, sink);
    table.field(key, Some(schedules))
}

/// Each window of a list, named as element `i` of `key` under `parent`.
pub(crate) fn read_schedule_list(
    nodes: &[Node],
    parent: &TableScope,
    key: &str,
    sink: &mut Sink,
) -> Vec<Field<ScheduleDraft>> {
    nodes
        .iter()
        .enumerate()
        .map(|(index, node)| {
            let scope = parent.element(key, index);
            let origin = Origin::new(scope.label.clone(), node.line);
            let Some(mut window) = Table::new(node, scope, sink) else {
                return Field { given: Given::Unreadable, origin };
            };
            let draft = read_schedule(&mut window, sink, origin.clone());
            window.finish(sink, SCHEDULE_KEYS);
            Field { given: Given::Value(draft), origin }
        })
        .collect()
}

fn read_schedule(window: &mut Table<'_>, sink: &mut Sink, origin: Origin) -> ScheduleDraft {
    let name = read(window, sink, "name", Table::text);
    let time_zone = read(window, sink, "time_zone", |w, s, k| parsed(w, s, k, Zone::named));
    let days = read(window, sink, "days", |w, s, k| {
        let nodes = w.list(s, k, "e.g. [\"mon\", \"fri\"] or [\"weekdays\"]")?;
        let mut names = Vec::with_capacity(nodes.len());
        for node in nodes {
            match &node.kind {
                Kind::String(name) => names.push(name.clone()),
                other => {
                    w.report(s, k, format!("must list days as strings, not {}", other.describe()));
                    return None;
                }
            }
        }
        parse_days(&names).map_err(|message| w.report(s, k, message)).ok()
    });
    ScheduleDraft {
        origin,
        name,
        time_zone,
        days,
        start: read(window, sink, "start", |w, s, k| parsed(w, s, k, parse_time)),
        end: read(window, sink, "end", |w, s, k| parsed(w, s, k, parse_time)),
        cron: read(window, sink, "cron", |w, s, k| parsed(w, s, k, Cron::parse)),
        duration: read(window, sink, "duration", |w, s, k| w.duration_at_most(s, k, MAX_WINDOW)),
        min_replicas: read(window, sink, "min_replicas", Table::replicas),
        max_replicas: read(window, sink, "max_replicas", Table::replicas),
        ramp_in: read(window, sink, "ramp_in", |w, s, k| w.duration_at_most(s, k, MAX_RAMP)),
        ramp_out: read(window, sink, "ramp_out", |w, s, k| w.duration_at_most(s, k, MAX_RAMP)),
    }
}

/// A text that `parse` reads, reporting its refusal at `key`.
fn parsed<T>(
    table: &mut Table<'_>,
    sink: &mut Sink,
    key: &str,
    parse: impl Fn(&str) -> Result<T, String>,
) -> Option<T> {
    let text = table.text(sink, key)?;
    parse(&text).map_err(|message| table.report(sink, key, message)).ok()
}

/// An instant written in RFC 3339, with its offset (`2026-12-01T18:00:00Z`,
/// `2026-12-01T19:00:00+01:00`): the only form that names one instant wherever it is read.
pub(crate) fn parse_instant(text: &str) -> Result<watermarkd_engine::Timestamp, String> {
    let wrong =
        || format!("({text:?}) must be an instant such as \"2026-12-01T18:00:00Z\" (RFC 3339, with its offset)");
    let instant: jiff::Timestamp = text.trim().parse().map_err(|_| out_of_range(text).unwrap_or_else(wrong))?;
    Ok(watermarkd_engine::Timestamp::from_unix_millis(instant.as_millisecond()))
}

/// Why `text`, written as an instant should be, is still none: it lies past the last instant
/// (or before the first) that the clock library represents, such as `9999-12-31T23:59:59Z`.
/// `None` when it is not written as an instant at all.
fn out_of_range(text: &str) -> Option<String> {
    use jiff::fmt::temporal::{Pieces, PiecesOffset};
    let pieces = Pieces::parse(text.trim()).ok()?;
    let offset = match pieces.offset()? {
        PiecesOffset::Zulu => jiff::tz::Offset::UTC,
        PiecesOffset::Numeric(numeric) => numeric.offset(),
        _ => return None,
    };
    let civil = pieces.date().to_datetime(pieces.time()?);
    if offset.to_timestamp(civil).is_ok() {
        return None;
    }
    let (which, edge) = if civil.year() > 0 {
        ("is past the latest", jiff::Timestamp::MAX)
    } else {
        ("is before the earliest", jiff::Timestamp::MIN)
    };
    Some(format!("({text:?}) {which} instant watermarkd supports ({})", edge.strftime("%Y-%m-%dT%H:%M:%SZ")))
}

/// `[autoscaler.fallback]` (or a WPA's `watermarkd.io/fallback` object).
pub(crate) fn read_fallback(table: &mut Table<'_>, sink: &mut Sink) -> FallbackDraft {
    let draft = FallbackDraft {
        after: read(table, sink, "after", |t, s, k| t.duration_at_most(s, k, MAX_WINDOW)),
        recover_after: read(table, sink, "recover_after", |t, s, k| t.duration_at_most(s, k, MAX_WINDOW)),
        action: read(table, sink, "action", |t, s, k| {
            t.choice(s, k, |a| ["hold", "replicas", "last_good"].contains(&a).then(|| a.to_string()), FALLBACK_ACTIONS)
        }),
        replicas: read(table, sink, "replicas", Table::replicas),
        scale_down: read(table, sink, "scale_down", Table::flag),
    };
    table.finish(sink, FALLBACK_KEYS);
    draft
}

pub(crate) const FALLBACK_ACTIONS: &str = "\"hold\", \"replicas\" or \"last_good\"";

/// `[autoscaler.forecast]` (or a WPA's `watermarkd.io/forecast` object).
pub(crate) fn read_forecast(table: &mut Table<'_>, sink: &mut Sink) -> ForecastDraft {
    let draft = ForecastDraft {
        lead_time: read(table, sink, "lead_time", |t, s, k| t.duration_at_most(s, k, MAX_RAMP)),
        mode: read(table, sink, "mode", |t, s, k| {
            t.choice(s, k, |m| ["observe", "scale"].contains(&m).then(|| m.to_string()), "\"observe\" or \"scale\"")
        }),
        max_error: read(table, sink, "max_error", Table::number),
        max_factor: read(table, sink, "max_factor", Table::number),
    };
    table.finish(sink, FORECAST_KEYS);
    draft
}
