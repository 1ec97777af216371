//! What an import writes: backends and autoscalers as ordered TOML tables with their comments,
//! and the text of the rules file. The text is written here rather than through a TOML
//! serializer so that every table can carry the comments that say where it came from; every
//! string goes through one escaping function and every key through one quoting function, and
//! the tests read each emitted file back with the daemon's own reader.

use std::fmt::Write as _;

/// A TOML value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Text(String),
    Integer(i64),
    /// A decimal number, written as it is (`0.1`, `350`).
    Number(String),
    Flag(bool),
    List(Vec<Value>),
    /// An inline table: `{ kind = "Deployment", name = "web" }`.
    Inline(Vec<(String, Value)>),
}

impl Value {
    pub fn text(text: impl Into<String>) -> Value {
        Value::Text(text.into())
    }
}

/// One `key = value` line, with a comment after it.
#[derive(Clone, Debug, PartialEq)]
pub struct Line {
    pub key: String,
    pub value: Value,
    pub comment: Option<String>,
}

/// A table: comment lines above it, then its lines.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Table {
    pub comments: Vec<String>,
    pub lines: Vec<Line>,
}

impl Table {
    pub fn set(&mut self, key: &str, value: Value) {
        self.lines.push(Line { key: key.into(), value, comment: None });
    }

    pub fn set_with(&mut self, key: &str, value: Value, comment: impl Into<String>) {
        self.lines.push(Line { key: key.into(), value, comment: Some(comment.into()) });
    }

    pub fn comment(&mut self, text: impl Into<String>) {
        self.comments.push(text.into());
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.lines.iter().find(|line| line.key == key).map(|line| &line.value)
    }
}

/// One `[[autoscaler]]` and its sub-tables.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Entry {
    pub main: Table,
    /// `[autoscaler.behavior.scale_up]` and `scale_down`.
    pub behavior: Option<(Table, Table)>,
    pub metrics: Vec<Table>,
    pub recommender: Option<Table>,
    pub schedules: Vec<Table>,
    pub fallback: Option<Table>,
}

/// A `[backend.NAME]` table.
#[derive(Clone, Debug, PartialEq)]
pub struct BackendTable {
    pub name: String,
    pub table: Table,
}

/// The whole file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RulesText {
    pub header: Vec<String>,
    pub backends: Vec<BackendTable>,
    pub entries: Vec<Entry>,
}

impl RulesText {
    /// The rules file's text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        write_comments(&mut out, &self.header);
        for backend in &self.backends {
            out.push('\n');
            write_comments(&mut out, &backend.table.comments);
            let _ = writeln!(out, "[backend.{}]", key(&backend.name));
            write_lines(&mut out, &backend.table.lines);
        }
        for entry in &self.entries {
            out.push('\n');
            write_comments(&mut out, &entry.main.comments);
            out.push_str("[[autoscaler]]\n");
            write_lines(&mut out, &entry.main.lines);
            if let Some((up, down)) = &entry.behavior {
                write_table(&mut out, "[autoscaler.behavior.scale_up]", up);
                write_table(&mut out, "[autoscaler.behavior.scale_down]", down);
            }
            if let Some(recommender) = &entry.recommender {
                write_table(&mut out, "[autoscaler.recommender]", recommender);
            }
            for metric in &entry.metrics {
                write_table(&mut out, "[[autoscaler.metric]]", metric);
            }
            for schedule in &entry.schedules {
                write_table(&mut out, "[[autoscaler.schedule]]", schedule);
            }
            if let Some(fallback) = &entry.fallback {
                write_table(&mut out, "[autoscaler.fallback]", fallback);
            }
        }
        out
    }
}

fn write_table(out: &mut String, header: &str, table: &Table) {
    out.push('\n');
    write_comments(out, &table.comments);
    out.push_str(header);
    out.push('\n');
    write_lines(out, &table.lines);
}

fn write_comments(out: &mut String, comments: &[String]) {
    for comment in comments {
        if comment.is_empty() {
            out.push_str("#\n");
        }
        // A comment runs to the end of its line: text with a line break becomes several, and a
        // long one is wrapped at the spaces.
        for line in comment.lines() {
            for wrapped in wrap(line, WIDTH) {
                if wrapped.is_empty() {
                    out.push_str("#\n");
                } else {
                    let _ = writeln!(out, "# {wrapped}");
                }
            }
        }
    }
}

/// How wide comment lines are wrapped.
const WIDTH: usize = 98;

/// `line` in pieces of at most `width` characters, broken at spaces (a word longer than that
/// stays whole); the pieces after the first are indented by two spaces.
fn wrap(line: &str, width: usize) -> Vec<String> {
    let text = line.trim_start_matches(' ');
    let lead = line.get(..line.len() - text.len()).unwrap_or_default();
    let line = text;
    let mut pieces: Vec<String> = Vec::new();
    let mut current = String::new();
    for word in line.split(' ') {
        let indent = if pieces.is_empty() { 0 } else { 2 };
        if !current.is_empty() && indent + current.chars().count() + 1 + word.chars().count() > width {
            pieces.push(std::mem::take(&mut current));
        }
        if !current.is_empty() {
            current.push(' ');
        }
        current.push_str(word);
    }
    pieces.push(current);
    pieces.iter().enumerate().map(|(i, p)| if i == 0 { format!("{lead}{p}") } else { format!("{lead}  {p}") }).collect()
}

fn write_lines(out: &mut String, lines: &[Line]) {
    for line in lines {
        if let Some(comment) = &line.comment {
            // A long explanation goes above its line, a short one after it.
            if comment.len() > 60 || comment.contains('\n') {
                write_comments(out, std::slice::from_ref(comment));
                let _ = writeln!(out, "{} = {}", key(&line.key), value(&line.value));
                continue;
            }
            let _ = writeln!(out, "{} = {}  # {}", key(&line.key), value(&line.value), comment);
            continue;
        }
        let _ = writeln!(out, "{} = {}", key(&line.key), value(&line.value));
    }
}

/// A key: bare when TOML allows it, else quoted.
pub fn key(text: &str) -> String {
    if !text.is_empty() && text.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        text.to_string()
    } else {
        quoted(text)
    }
}

/// A TOML basic string: `"` and `\` escaped, and every control character as `\uXXXX` (or its
/// short escape), so that any text round-trips.
pub fn quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A string the way a person would write it: in single quotes (a literal string, nothing
/// escaped) when that is possible, which PromQL with its double quotes usually is.
fn literal_or_quoted(text: &str) -> String {
    if !text.contains('\'') && !text.chars().any(char::is_control) {
        format!("'{text}'")
    } else {
        quoted(text)
    }
}

fn value(value: &Value) -> String {
    match value {
        Value::Text(text) => literal_or_quoted(text),
        Value::Integer(n) => n.to_string(),
        Value::Number(n) => n.clone(),
        Value::Flag(b) => b.to_string(),
        Value::List(items) => {
            let items: Vec<String> = items.iter().map(self::value).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Inline(entries) => {
            let entries: Vec<String> =
                entries.iter().map(|(k, v)| format!("{} = {}", key(k), self::value(v))).collect();
            format!("{{ {} }}", entries.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_escape_what_toml_needs() {
        assert_eq!(quoted("a\"b\\c\nd\u{1}"), "\"a\\\"b\\\\c\\nd\\u0001\"");
        assert_eq!(value(&Value::text("sum(x{a=\"b\"})")), "'sum(x{a=\"b\"})'");
        assert_eq!(value(&Value::text("it's")), "\"it's\"");
        assert_eq!(key("a.b"), "\"a.b\"");
        assert_eq!(key("prom-1"), "prom-1");
    }
}
