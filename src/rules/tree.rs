//! One small document tree for both the TOML rules file and JSON rules (`decide`), so that the
//! extraction and validation are written once. TOML nodes carry the line they start on; JSON
//! nodes carry none (serde_json keeps no positions).

use std::ops::Range;

use toml::de::{DeTable, DeValue};

#[derive(Debug)]
pub(crate) struct Node {
    pub kind: Kind,
    /// 1-based line where the value starts, when the source has lines.
    pub line: Option<usize>,
}

#[derive(Debug)]
pub(crate) enum Kind {
    /// JSON `null`: read as if the key were absent.
    Null,
    Bool(bool),
    Integer(i128),
    Float(f64),
    String(String),
    Array(Vec<Node>),
    Table(Vec<Entry>),
    /// A value the rules never use (a TOML date-time), kept only to name it in an error.
    Other(&'static str),
}

#[derive(Debug)]
pub(crate) struct Entry {
    pub key: String,
    /// 1-based line of the key itself.
    pub line: Option<usize>,
    pub value: Node,
}

impl Node {
    pub fn entries(&self) -> Option<&[Entry]> {
        match &self.kind {
            Kind::Table(entries) => Some(entries),
            _ => None,
        }
    }

    pub fn entry(&self, key: &str) -> Option<&Entry> {
        self.entries()?.iter().find(|e| e.key == key)
    }
}

impl Kind {
    /// What a person would call this value, with the value when it is short: for type errors.
    pub fn describe(&self) -> String {
        match self {
            Kind::Null => "null".into(),
            Kind::Bool(b) => format!("a boolean ({b})"),
            Kind::Integer(i) => format!("an integer ({i})"),
            Kind::Float(f) => format!("a number ({f})"),
            Kind::String(s) if s.chars().count() <= 40 => format!("a string ({s:?})"),
            Kind::String(_) => "a string".into(),
            Kind::Array(_) => "a list".into(),
            Kind::Table(_) => "a table".into(),
            Kind::Other(what) => (*what).into(),
        }
    }
}

/// Maps byte offsets to 1-based line numbers.
struct Lines {
    starts: Vec<usize>,
}

impl Lines {
    fn new(text: &str) -> Self {
        let starts = std::iter::once(0).chain(text.match_indices('\n').map(|(i, _)| i + 1)).collect();
        Lines { starts }
    }

    fn line(&self, offset: usize) -> usize {
        // The number of line starts at or before the offset is the line number.
        self.starts.partition_point(|&start| start <= offset).max(1)
    }
}

/// A TOML syntax error: its message and line.
#[derive(Debug)]
pub(crate) struct SyntaxError {
    pub line: Option<usize>,
    pub message: String,
}

/// Parses a TOML document into a tree whose nodes know their lines.
pub(crate) fn from_toml(text: &str) -> Result<Node, SyntaxError> {
    let lines = Lines::new(text);
    match DeTable::parse(text) {
        Ok(root) => {
            let span = root.span();
            Ok(convert_toml(&DeValue::Table(root.into_inner()), span, &lines))
        }
        Err(err) => Err(SyntaxError {
            line: err.span().map(|span| lines.line(span.start)),
            message: err.message().lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("; "),
        }),
    }
}

fn convert_toml(value: &DeValue<'_>, span: Range<usize>, lines: &Lines) -> Node {
    let kind = match value {
        DeValue::String(s) => Kind::String(s.to_string()),
        DeValue::Integer(i) => {
            i128::from_str_radix(i.as_str(), i.radix()).map_or(Kind::Other("an integer out of range"), Kind::Integer)
        }
        // A float that Rust cannot read (TOML's `nan` spellings) is not finite either.
        DeValue::Float(f) => Kind::Float(f.as_str().parse().unwrap_or(f64::NAN)),
        DeValue::Boolean(b) => Kind::Bool(*b),
        DeValue::Datetime(_) => Kind::Other("a date-time"),
        DeValue::Array(items) => {
            Kind::Array(items.iter().map(|item| convert_toml(item.get_ref(), item.span(), lines)).collect())
        }
        DeValue::Table(table) => Kind::Table(
            table
                .iter()
                .map(|(key, value)| Entry {
                    key: key.get_ref().to_string(),
                    line: Some(lines.line(key.span().start)),
                    value: convert_toml(value.get_ref(), value.span(), lines),
                })
                .collect(),
        ),
    };
    Node { kind, line: Some(lines.line(span.start)) }
}

/// Converts a JSON value; JSON carries no line numbers.
pub(crate) fn from_json(value: &serde_json::Value) -> Node {
    use serde_json::Value;
    let kind = match value {
        Value::Null => Kind::Null,
        Value::Bool(b) => Kind::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Kind::Integer(i128::from(i)),
            (None, Some(u)) => Kind::Integer(i128::from(u)),
            (None, None) => Kind::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => Kind::String(s.clone()),
        Value::Array(items) => Kind::Array(items.iter().map(from_json).collect()),
        Value::Object(map) => Kind::Table(
            map.iter().map(|(key, value)| Entry { key: key.clone(), line: None, value: from_json(value) }).collect(),
        ),
    };
    Node { kind, line: None }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_nodes_know_their_lines() {
        let text = "a = 1\n\n[[autoscaler]]\nname = \"x\"\n[[autoscaler.metric]]\nq = 1.5\n";
        let root = from_toml(text).unwrap();
        assert_eq!(root.entry("a").unwrap().line, Some(1));
        let Kind::Array(autoscalers) = &root.entry("autoscaler").unwrap().value.kind else { panic!() };
        assert_eq!(autoscalers[0].line, Some(3));
        assert_eq!(autoscalers[0].entry("name").unwrap().line, Some(4));
        let Kind::Array(metrics) = &autoscalers[0].entry("metric").unwrap().value.kind else { panic!() };
        assert_eq!(metrics[0].line, Some(5));
        assert!(matches!(metrics[0].entry("q").unwrap().value.kind, Kind::Float(f) if f == 1.5));
    }

    #[test]
    fn syntax_errors_have_a_line() {
        let err = from_toml("a = 1\nb = \n").unwrap_err();
        assert_eq!(err.line, Some(2));
        assert!(!err.message.is_empty());
    }

    #[test]
    fn json_numbers_keep_integers_apart_from_floats() {
        let node = from_json(&serde_json::json!({"a": 4, "b": 0.5, "c": null}));
        assert!(matches!(node.entry("a").unwrap().value.kind, Kind::Integer(4)));
        assert!(matches!(node.entry("b").unwrap().value.kind, Kind::Float(f) if f == 0.5));
        assert!(matches!(node.entry("c").unwrap().value.kind, Kind::Null));
        assert_eq!(node.line, None);
    }
}
