//! Checks a WatermarkPodAutoscaler status written by the daemon against the status schema of
//! the Datadog controller's own CRD (tests/fixtures/wpa/datadoghq.com_watermarkpodautoscalers.yaml):
//! every field is one that schema names, with its type, and every field it requires is there,
//! so whatever reads a status the Datadog controller writes reads ours.
#![allow(dead_code, reason = "every test binary that includes this file uses only part of it")]

use serde_json::Value;

fn datadog_status_schema() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/wpa/datadoghq.com_watermarkpodautoscalers.yaml");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    let crd: Value = serde_yaml_ng::from_str(&text).expect("the Datadog CRD");
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"].clone()
}

fn check(value: &Value, schema: &Value, path: &str, problems: &mut Vec<String>) {
    let int_or_string = schema["x-kubernetes-int-or-string"] == Value::Bool(true);
    let type_ok = match schema["type"].as_str() {
        _ if int_or_string => value.is_string() || value.is_i64() || value.is_u64(),
        Some("string") => value.is_string(),
        Some("integer") => value.is_i64() || value.is_u64(),
        Some("number") => value.is_number(),
        Some("boolean") => value.is_boolean(),
        Some("object") => value.is_object(),
        Some("array") => value.is_array(),
        _ => true,
    };
    if !type_ok {
        problems.push(format!("{path}: {value} is not of type {}", schema["type"]));
        return;
    }
    if let (Some(object), Some(properties)) = (value.as_object(), schema["properties"].as_object()) {
        for (key, field) in object {
            match properties.get(key) {
                Some(field_schema) => check(field, field_schema, &format!("{path}.{key}"), problems),
                None => problems.push(format!("{path}.{key}: not a field of the Datadog controller's status")),
            }
        }
        for required in schema["required"].as_array().into_iter().flatten().filter_map(Value::as_str) {
            if !object.contains_key(required) {
                problems.push(format!("{path}.{required}: required by the Datadog controller's status, missing"));
            }
        }
    }
    if let (Some(items), Some(item_schema)) = (value.as_array(), schema.get("items")) {
        for (i, item) in items.iter().enumerate() {
            check(item, item_schema, &format!("{path}[{i}]"), problems);
        }
    }
}

/// Panics with every difference between `status` and the Datadog controller's status schema.
pub fn assert_datadog_status_shape(status: &Value) {
    let mut problems = Vec::new();
    check(status, &datadog_status_schema(), "status", &mut problems);
    assert!(problems.is_empty(), "{}\n{status:#}", problems.join("\n"));
}

/// The checker itself: it refuses what the schema does not allow.
pub fn self_test() {
    let mut problems = Vec::new();
    let bad = serde_json::json!({"currentReplicas": "3", "made_up": 1, "currentMetrics": [{"external": {}}]});
    check(&bad, &datadog_status_schema(), "status", &mut problems);
    for expected in ["currentReplicas", "made_up", "desiredReplicas", "currentMetrics[0].type", "metricName"] {
        assert!(problems.iter().any(|p| p.contains(expected)), "no problem about {expected}: {problems:?}");
    }
}
