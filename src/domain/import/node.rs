//! Typed reads over a manifest's JSON tree that keep the path of every field
//! (`spec.metrics[1].external.target.averageValue`), so that each problem names it.

use std::collections::BTreeMap;

use serde_json::Value;
use watermarkd_engine::Decimal;

use crate::domain::rules::parse_quantity;

/// What is wrong with a field: the path to it and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldProblem {
    pub field: String,
    pub message: String,
}

/// One node of a document and where it is.
#[derive(Clone, Debug)]
pub struct Node<'a> {
    pub value: &'a Value,
    pub path: String,
}

/// A node under another.
pub type Child<'a> = Node<'a>;

impl<'a> Node<'a> {
    /// This node (a child is one).
    pub fn node(&self) -> Node<'a> {
        self.clone()
    }
}

impl<'a> Node<'a> {
    pub fn root(value: &'a Value) -> Node<'a> {
        Node { value, path: String::new() }
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    /// The path of `key` under this node.
    pub fn at(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    /// `key`, when present and not null.
    pub fn get(&self, key: &str) -> Option<Child<'a>> {
        let value = self.value.get(key).filter(|v| !v.is_null())?;
        Some(Child { value, path: self.at(key) })
    }

    /// `key`, which must be present.
    pub fn required(&self, key: &str, problems: &mut Vec<FieldProblem>) -> Option<Child<'a>> {
        let child = self.get(key);
        if child.is_none() {
            problems.push(FieldProblem { field: self.at(key), message: "is required".into() });
        }
        child
    }

    /// A text field, when present; a problem when it is not text.
    pub fn text(&self, key: &str, problems: &mut Vec<FieldProblem>) -> Option<&'a str> {
        let child = self.get(key)?;
        match child.value {
            Value::String(text) => Some(text),
            other => {
                problems
                    .push(FieldProblem { field: child.path, message: format!("must be text, not {}", kind(other)) });
                None
            }
        }
    }

    /// A text field that must be present and not empty.
    pub fn required_text(&self, key: &str, problems: &mut Vec<FieldProblem>) -> Option<&'a str> {
        match self.get(key) {
            None => {
                problems.push(FieldProblem { field: self.at(key), message: "is required".into() });
                None
            }
            Some(_) => {
                let text = self.text(key, problems)?;
                if text.is_empty() {
                    problems.push(FieldProblem { field: self.at(key), message: "must not be empty".into() });
                    return None;
                }
                Some(text)
            }
        }
    }

    /// A whole number, when present (also written as text, as KEDA's metadata is).
    pub fn integer(&self, key: &str, problems: &mut Vec<FieldProblem>) -> Option<i64> {
        let child = self.get(key)?;
        let number = match child.value {
            Value::Number(n) => n.as_i64(),
            Value::String(text) => text.trim().parse::<i64>().ok(),
            _ => None,
        };
        if number.is_none() {
            problems.push(FieldProblem {
                field: child.path,
                message: format!("must be a whole number, not {}", shown(child.value)),
            });
        }
        number
    }

    /// A whole number from 0 to `max`, when present.
    pub fn count(&self, key: &str, max: i64, problems: &mut Vec<FieldProblem>) -> Option<u32> {
        let number = self.integer(key, problems)?;
        match u32::try_from(number).ok().filter(|n| i64::from(*n) <= max) {
            Some(n) => Some(n),
            None => {
                problems.push(FieldProblem {
                    field: self.at(key),
                    message: format!("must be from 0 to {max}, not {number}"),
                });
                None
            }
        }
    }

    /// A flag, when present (KEDA writes `"true"` as text too).
    pub fn flag(&self, key: &str, problems: &mut Vec<FieldProblem>) -> Option<bool> {
        let child = self.get(key)?;
        match child.value {
            Value::Bool(flag) => Some(*flag),
            Value::String(text) if text.eq_ignore_ascii_case("true") => Some(true),
            Value::String(text) if text.eq_ignore_ascii_case("false") => Some(false),
            other => {
                problems.push(FieldProblem {
                    field: child.path,
                    message: format!("must be true or false, not {}", shown(other)),
                });
                None
            }
        }
    }

    /// A Kubernetes quantity (`"500m"`, `10`, `"1.5k"`), when present: its text as written and
    /// its value.
    pub fn quantity(&self, key: &str, problems: &mut Vec<FieldProblem>) -> Option<(String, Decimal)> {
        let child = self.get(key)?;
        let text = match child.value {
            Value::String(text) => text.trim().to_string(),
            Value::Number(n) => n.to_string(),
            other => {
                problems.push(FieldProblem {
                    field: child.path,
                    message: format!("must be a quantity, not {}", kind(other)),
                });
                return None;
            }
        };
        match parse_quantity(&text) {
            Ok(value) => Some((text, value)),
            Err(err) => {
                problems.push(FieldProblem { field: child.path, message: format!("is not a quantity: {err}") });
                None
            }
        }
    }

    /// The entries of a list, when present; a problem when it is not a list.
    pub fn list(&self, key: &str, problems: &mut Vec<FieldProblem>) -> Vec<Child<'a>> {
        let Some(child) = self.get(key) else { return Vec::new() };
        match child.value {
            Value::Array(items) => items
                .iter()
                .enumerate()
                .map(|(i, value)| Child { value, path: format!("{}[{i}]", child.path) })
                .collect(),
            other => {
                problems
                    .push(FieldProblem { field: child.path, message: format!("must be a list, not {}", kind(other)) });
                Vec::new()
            }
        }
    }

    /// A map of text to text (labels, annotations, KEDA's metadata), when present. Numbers and
    /// flags are taken as their text, as KEDA's metadata often has them unquoted in YAML.
    pub fn text_map(&self, key: &str, problems: &mut Vec<FieldProblem>) -> BTreeMap<String, String> {
        let Some(child) = self.get(key) else { return BTreeMap::new() };
        let Value::Object(entries) = child.value else {
            problems
                .push(FieldProblem { field: child.path, message: format!("must be a map, not {}", kind(child.value)) });
            return BTreeMap::new();
        };
        let mut map = BTreeMap::new();
        for (name, value) in entries {
            let text = match value {
                Value::String(text) => text.clone(),
                Value::Number(n) => n.to_string(),
                Value::Bool(b) => b.to_string(),
                Value::Null => continue,
                other => {
                    problems.push(FieldProblem {
                        field: format!("{}.{name}", child.path),
                        message: format!("must be text, not {}", kind(other)),
                    });
                    continue;
                }
            };
            map.insert(name.clone(), text);
        }
        map
    }

    /// Whether this node is a map (an object).
    pub fn is_map(&self) -> bool {
        self.value.is_object()
    }

    /// A map under `key`, which must be one when present.
    pub fn map(&self, key: &str, problems: &mut Vec<FieldProblem>) -> Option<Child<'a>> {
        let child = self.get(key)?;
        if !child.value.is_object() {
            problems
                .push(FieldProblem { field: child.path, message: format!("must be a map, not {}", kind(child.value)) });
            return None;
        }
        Some(child)
    }

    /// The keys present under this node.
    pub fn keys(&self) -> Vec<&'a str> {
        match self.value {
            Value::Object(entries) => entries.keys().map(String::as_str).collect(),
            _ => Vec::new(),
        }
    }
}

/// What kind of JSON value this is, for messages.
pub fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a flag",
        Value::Number(_) => "a number",
        Value::String(_) => "text",
        Value::Array(_) => "a list",
        Value::Object(_) => "a map",
    }
}

/// A short rendering of a value for messages.
fn shown(value: &Value) -> String {
    match value {
        Value::String(text) => format!("{text:?}"),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => kind(other).to_string(),
    }
}
