//! An HPA's `spec.behavior` (KEDA's `advanced.horizontalPodAutoscalerConfig.behavior` is the
//! same object) as the rules' `behavior`, every field written out with the HPA's defaults
//! filled in as the API server fills them, so that the file says what the HPA did.

use super::node::Node;
use super::out::{Table, Value};
use super::Subject;

/// The HPA's policy types and select policies, as the rules spell them.
fn policy_type(text: &str) -> Option<&'static str> {
    match text {
        "Pods" => Some("pods"),
        "Percent" => Some("percent"),
        _ => None,
    }
}

fn select_policy(text: &str) -> Option<&'static str> {
    match text {
        "Max" => Some("max"),
        "Min" => Some("min"),
        "Disabled" => Some("disabled"),
        _ => None,
    }
}

/// The rules' `[autoscaler.behavior.scale_up]` and `scale_down` for `behavior` (absent: the
/// HPA's defaults). `path` is where the behavior object is (`spec.behavior`).
pub fn convert(behavior: Option<&Node<'_>>, path: &str, subject: &mut Subject) -> (Table, Table) {
    let up = direction(behavior, path, "scaleUp", subject);
    let down = direction(behavior, path, "scaleDown", subject);
    if behavior.is_none() {
        subject.chose(format!("{path} is not set: the HPA's default behavior is written out"));
    }
    (up, down)
}

fn direction(behavior: Option<&Node<'_>>, path: &str, key: &str, subject: &mut Subject) -> Table {
    let up = key == "scaleUp";
    let mut problems = Vec::new();
    let rules = behavior.and_then(|b| b.map(key, &mut problems));
    let at = |field: &str| format!("{path}.{key}.{field}");
    let mut table = Table::default();
    let rules_node = rules.as_ref();

    if let Some(tolerance) = rules_node.and_then(|r| r.quantity("tolerance", &mut problems)) {
        table.set_with("tolerance", Value::Number(tolerance.1.to_string()), format!("from {}", at("tolerance")));
    }
    let window = rules_node.and_then(|r| r.integer("stabilizationWindowSeconds", &mut problems));
    let default_window = if up { 0 } else { 300 };
    match window {
        Some(seconds) if (0..=3600).contains(&seconds) => {
            table.set("stabilization_window", Value::text(format!("{seconds}s")));
        }
        Some(seconds) => {
            subject.invalid(&at("stabilizationWindowSeconds"), format!("must be from 0 to 3600, not {seconds}"));
        }
        None => table.set_with("stabilization_window", Value::text(format!("{default_window}s")), "the HPA's default"),
    }
    match rules_node.and_then(|r| r.text("selectPolicy", &mut problems)) {
        Some(text) => match select_policy(text) {
            Some(policy) => table.set("select_policy", Value::text(policy)),
            None => subject.invalid(&at("selectPolicy"), format!("must be Max, Min or Disabled, not {text:?}")),
        },
        None => table.set_with("select_policy", Value::text("max"), "the HPA's default"),
    }
    let given = rules_node.filter(|r| r.get("policies").is_some());
    let given_any = given.is_some();
    let policies = match given {
        Some(r) => {
            let mut list = Vec::new();
            for policy in r.list("policies", &mut problems) {
                let p = policy.node();
                let kind = p.required_text("type", &mut problems);
                let value = p.integer("value", &mut problems);
                let period = p.integer("periodSeconds", &mut problems);
                if value.is_none() && p.get("value").is_none() {
                    problems.push(super::node::FieldProblem { field: p.at("value"), message: "is required".into() });
                }
                if period.is_none() && p.get("periodSeconds").is_none() {
                    problems.push(super::node::FieldProblem {
                        field: p.at("periodSeconds"),
                        message: "is required".into(),
                    });
                }
                let Some(kind) = kind else { continue };
                let Some(kind) = policy_type(kind) else {
                    subject.invalid(&p.at("type"), format!("must be Pods or Percent, not {kind:?}"));
                    continue;
                };
                if let (Some(value), Some(period)) = (value, period) {
                    list.push(policy_value(kind, value, period));
                }
            }
            list
        }
        None if up => vec![policy_value("pods", 4, 15), policy_value("percent", 100, 15)],
        None => vec![policy_value("percent", 100, 15)],
    };
    if given_any {
        table.set("policies", Value::List(policies));
    } else {
        table.set_with("policies", Value::List(policies), "the HPA's default");
    }
    subject.field_problems(problems);
    table
}

fn policy_value(kind: &str, value: i64, period: i64) -> Value {
    Value::Inline(vec![
        ("type".into(), Value::text(kind)),
        ("value".into(), Value::Integer(value)),
        ("period".into(), Value::text(format!("{period}s"))),
    ])
}
