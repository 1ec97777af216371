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
///
/// The TOML parser holds about 30 times the text while it works (its events, then a spanned
/// table), so a file of 10,000 autoscalers (3 MB) would take 100 MB at its peak. A file whose
/// `[[autoscaler]]` sections come last and hold only their own tables is therefore parsed one
/// section at a time (see [`split_autoscalers`]); the tree is the same. Any other shape is
/// parsed whole.
pub(crate) fn from_toml(text: &str) -> Result<Node, SyntaxError> {
    let lines = Lines::new(text);
    let Some(sections) = split_autoscalers(text) else { return parse_at(text, 0, &lines) };
    let (prelude, autoscalers) = sections;
    let mut root = parse_at(&text[..prelude], 0, &lines)?;
    let Kind::Table(entries) = &mut root.kind else { return parse_at(text, 0, &lines) };
    if entries.iter().any(|e| e.key == "autoscaler") {
        return parse_at(text, 0, &lines);
    }
    let mut items = Vec::with_capacity(autoscalers.len());
    let mut key_line = None;
    for range in autoscalers {
        let mut section = parse_at(&text[range.clone()], range.start, &lines)?;
        let Kind::Table(section_entries) = &mut section.kind else { return parse_at(text, 0, &lines) };
        let Some(position) = section_entries.iter().position(|e| e.key == "autoscaler") else {
            return parse_at(text, 0, &lines);
        };
        if section_entries.len() != 1 {
            return parse_at(text, 0, &lines);
        }
        let entry = section_entries.swap_remove(position);
        key_line = key_line.or(entry.line);
        match entry.value.kind {
            Kind::Array(mut one) if one.len() == 1 => items.append(&mut one),
            _ => return parse_at(text, 0, &lines),
        }
    }
    let value = Node { kind: Kind::Array(items), line: key_line };
    let at = entries.partition_point(|e| e.key.as_str() < "autoscaler");
    entries.insert(at, Entry { key: "autoscaler".into(), line: key_line, value });
    Ok(root)
}

/// Parses `text`, which starts at byte `base` of the file whose lines are `lines`.
fn parse_at(text: &str, base: usize, lines: &Lines) -> Result<Node, SyntaxError> {
    match DeTable::parse(text) {
        Ok(root) => {
            let span = root.span();
            Ok(convert_toml(&DeValue::Table(root.into_inner()), span, base, lines))
        }
        Err(err) => Err(SyntaxError {
            line: err.span().map(|span| lines.line(base + span.start)),
            message: err.message().lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("; "),
        }),
    }
}

/// Where a rules file can be cut into sections parsed one at a time: the byte length of what
/// precedes the first `[[autoscaler]]` header, and the range of each `[[autoscaler]]` section
/// (its header up to the next one). Only for a file where every header from the first
/// `[[autoscaler]]` on is `[[autoscaler]]` or one of an autoscaler's own tables
/// (`[autoscaler.…]`, `[[autoscaler.…]]`), and with no multi-line string that could hide a
/// header-like line; `None` otherwise (and for small files, where it would gain nothing).
fn split_autoscalers(text: &str) -> Option<(usize, Vec<Range<usize>>)> {
    const WORTH_IT: usize = 64 * 1024;
    if text.len() < WORTH_IT || text.contains("\"\"\"") || text.contains("'''") {
        return None;
    }
    let mut prelude = None;
    let mut starts = Vec::new();
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let at = offset;
        offset += line.len();
        let trimmed = line.trim_start();
        if !trimmed.starts_with('[') {
            continue;
        }
        // The header's name: brackets, then up to the closing ones; only plain names here.
        let header = trimmed.split('#').next().unwrap_or_default().trim_end();
        let (array, name) = match header.strip_prefix("[[").and_then(|h| h.strip_suffix("]]")) {
            Some(name) => (true, name),
            None => (false, header.strip_prefix('[')?.strip_suffix(']')?),
        };
        if !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')) {
            return None;
        }
        if array && name == "autoscaler" {
            prelude.get_or_insert(at);
            starts.push(at);
        } else if prelude.is_some() && !name.starts_with("autoscaler.") {
            return None;
        }
    }
    let prelude = prelude?;
    let ends = starts.iter().skip(1).copied().chain(std::iter::once(text.len()));
    Some((prelude, starts.iter().copied().zip(ends).map(|(start, end)| start..end).collect()))
}

fn convert_toml(value: &DeValue<'_>, span: Range<usize>, base: usize, lines: &Lines) -> Node {
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
            Kind::Array(items.iter().map(|item| convert_toml(item.get_ref(), item.span(), base, lines)).collect())
        }
        DeValue::Table(table) => Kind::Table(
            table
                .iter()
                .map(|(key, value)| Entry {
                    key: key.get_ref().to_string(),
                    line: Some(lines.line(base + key.span().start)),
                    value: convert_toml(value.get_ref(), value.span(), base, lines),
                })
                .collect(),
        ),
    };
    Node { kind, line: Some(lines.line(base + span.start)) }
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

    fn entry<'a>(node: &'a Node, key: &str) -> Option<&'a Entry> {
        node.entries()?.iter().find(|e| e.key == key)
    }

    #[test]
    fn toml_nodes_know_their_lines() {
        let text = "a = 1\n\n[[autoscaler]]\nname = \"x\"\n[[autoscaler.metric]]\nq = 1.5\n";
        let root = from_toml(text).unwrap();
        assert_eq!(entry(&root, "a").unwrap().line, Some(1));
        let Kind::Array(autoscalers) = &entry(&root, "autoscaler").unwrap().value.kind else { panic!() };
        assert_eq!(autoscalers[0].line, Some(3));
        assert_eq!(entry(&autoscalers[0], "name").unwrap().line, Some(4));
        let Kind::Array(metrics) = &entry(&autoscalers[0], "metric").unwrap().value.kind else { panic!() };
        assert_eq!(metrics[0].line, Some(5));
        assert!(matches!(entry(&metrics[0], "q").unwrap().value.kind, Kind::Float(f) if f == 1.5));
    }

    /// A tree as text, lines included, to compare two parses.
    fn dump(node: &Node) -> String {
        match &node.kind {
            Kind::Table(entries) => {
                let inner: Vec<String> =
                    entries.iter().map(|e| format!("{}@{:?}={}", e.key, e.line, dump(&e.value))).collect();
                format!("{{{}}}@{:?}", inner.join(","), node.line)
            }
            Kind::Array(items) => format!("[{}]@{:?}", items.iter().map(dump).collect::<Vec<_>>().join(","), node.line),
            other => format!("{}@{:?}", other.describe(), node.line),
        }
    }

    fn big_file(tail: &str) -> String {
        let mut text = String::from("# rules\nversion = 1\n[backend.dd]\ntype = \"datadog\"\n\n");
        for i in 0..600 {
            text.push_str(&format!(
                "[[autoscaler]]  # number {i}\nname = \"web-{i}\"\ntarget = {{ kind = \"Deployment\", name = \"web-{i}\" }}\n\
                 [autoscaler.behavior.scale_up]\nstabilization_window = \"1m\"\n\
                 [[autoscaler.metric]]\nquery = \"avg:load{{app:web-{i}}}\"\nhigh_watermark = {i}.5\n\n"
            ));
        }
        text.push_str(tail);
        text
    }

    #[test]
    fn a_large_file_parsed_by_sections_is_the_same_tree_with_the_same_lines() {
        let text = big_file("");
        assert!(split_autoscalers(&text).is_some(), "this shape is split");
        let lines = Lines::new(&text);
        let whole = parse_at(&text, 0, &lines).unwrap();
        let sections = from_toml(&text).unwrap();
        assert_eq!(dump(&sections), dump(&whole));
    }

    #[test]
    fn other_shapes_are_parsed_whole_and_errors_keep_their_lines() {
        // A table of another kind after the autoscalers: parsed whole.
        let text = big_file("[backend.prom]\ntype = \"prometheus\"\n");
        assert!(split_autoscalers(&text).is_none());
        let lines = Lines::new(&text);
        assert_eq!(dump(&from_toml(&text).unwrap()), dump(&parse_at(&text, 0, &lines).unwrap()));
        // A syntax error deep in a section names its line in the file.
        let mut broken = big_file("");
        let line = broken.lines().count() + 2;
        broken.push_str("[[autoscaler]]\nname = \n");
        let err = from_toml(&broken).unwrap_err();
        assert_eq!(err.line, Some(line));
        // A TOML error only the whole file shows (a table defined twice) is still found.
        let twice = big_file("[[autoscaler]]\nname = \"x\"\n[autoscaler.behavior]\n[autoscaler.behavior]\n");
        assert!(from_toml(&twice).is_err());
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
        assert!(matches!(entry(&node, "a").unwrap().value.kind, Kind::Integer(4)));
        assert!(matches!(entry(&node, "b").unwrap().value.kind, Kind::Float(f) if f == 0.5));
        assert!(matches!(entry(&node, "c").unwrap().value.kind, Kind::Null));
        assert_eq!(node.line, None);
    }
}
