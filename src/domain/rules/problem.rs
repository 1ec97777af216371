//! Problems found in rules: each names the line, the autoscaler and the field, so that a person
//! can fix every one of them after a single `watermarkd check`.

use std::fmt;

/// One problem in a rules file or a JSON rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// 1-based line in the rules file; `None` for JSON rules and whole-file problems.
    pub line: Option<usize>,
    /// The autoscaler's name, when the problem is inside a named autoscaler.
    pub autoscaler: Option<String>,
    /// The field as a person reads it: `min_replicas`, `target.kind`, `metric "latency": low_watermark`,
    /// `behavior.scale_up.policies[0].period`, `backend.dd.url`. Empty for whole-file problems.
    pub field: String,
    pub message: String,
}

impl Problem {
    /// Formats the problem as `ORIGIN:LINE: ...`, the form compilers use, so editors can jump to it.
    pub fn in_file<'a>(&'a self, origin: &'a str) -> impl fmt::Display + 'a {
        InFile { origin, problem: self }
    }

    fn write_body(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(name) = &self.autoscaler {
            write!(f, "autoscaler {name:?}: ")?;
        }
        match self.field.as_str() {
            "" => f.write_str(&self.message),
            field if reads_as_predicate(&self.message) => write!(f, "{field} {}", self.message),
            field => write!(f, "{field}: {}", self.message),
        }
    }
}

/// Messages are written to follow the field name ("min_replicas must be at least 1"); a message
/// that does not (some engine messages) gets a colon instead.
fn reads_as_predicate(message: &str) -> bool {
    const STARTS: [&str; 10] = ["(", "is ", "must ", "cannot ", "needs ", "names ", "has ", "only ", "was ", "does "];
    STARTS.iter().any(|start| message.starts_with(start))
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(line) = self.line {
            write!(f, "line {line}: ")?;
        }
        self.write_body(f)
    }
}

struct InFile<'a> {
    origin: &'a str,
    problem: &'a Problem,
}

impl fmt::Display for InFile<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.problem.line {
            Some(line) => write!(f, "{}:{line}: ", self.origin)?,
            None => write!(f, "{}: ", self.origin)?,
        }
        self.problem.write_body(f)
    }
}

/// Every problem of one rules file.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct RulesError {
    /// The file (or other source) the rules came from, as given.
    pub origin: String,
    pub problems: Vec<Problem>,
}

impl fmt::Display for RulesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{}", problem.in_file(&self.origin))?;
        }
        Ok(())
    }
}

/// Where a reader is in the document: which autoscaler, and how to name a field for a person.
#[derive(Clone, Debug, Default)]
pub(crate) struct TableScope {
    pub autoscaler: Option<String>,
    /// How a person names this table: `target`, `metric "latency"`, `autoscaler[2]`; empty at the top.
    pub label: String,
    /// Between the label and a key: `.` in general, `: ` after a quoted metric name.
    pub separator: &'static str,
}

impl TableScope {
    pub fn field(&self, key: &str) -> String {
        if self.label.is_empty() {
            key.to_string()
        } else {
            format!("{}{}{key}", self.label, self.separator)
        }
    }

    /// The scope of a table under `key`.
    pub fn child(&self, key: &str) -> TableScope {
        TableScope { autoscaler: self.autoscaler.clone(), label: self.field(key), separator: "." }
    }

    /// The scope of element `index` of the list under `key`.
    pub fn element(&self, key: &str, index: usize) -> TableScope {
        self.child(&format!("{key}[{index}]"))
    }
}

/// Collects problems.
#[derive(Debug, Default)]
pub(crate) struct Sink {
    pub problems: Vec<Problem>,
}

impl Sink {
    pub fn report(&mut self, scope: &TableScope, key: &str, line: Option<usize>, message: impl Into<String>) {
        self.problems.push(Problem {
            line,
            autoscaler: scope.autoscaler.clone(),
            field: scope.field(key),
            message: message.into(),
        });
    }

    /// A problem about a whole table (`metric[1] must be a table`).
    pub fn report_table(&mut self, scope: &TableScope, line: Option<usize>, message: impl Into<String>) {
        self.problems.push(Problem {
            line,
            autoscaler: scope.autoscaler.clone(),
            field: scope.label.clone(),
            message: message.into(),
        });
    }

    pub fn has_problems(&self) -> bool {
        !self.problems.is_empty()
    }

    /// The problems in file order (problems without a line keep their order, at the end).
    pub fn into_sorted(mut self) -> Vec<Problem> {
        self.problems.sort_by_key(|p| p.line.unwrap_or(usize::MAX));
        self.problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(line: Option<usize>, autoscaler: Option<&str>, field: &str, message: &str) -> Problem {
        Problem { line, autoscaler: autoscaler.map(Into::into), field: field.into(), message: message.into() }
    }

    #[test]
    fn displays_every_known_part() {
        let p = problem(
            Some(12),
            Some("billing"),
            "metric \"latency\": low_watermark",
            "(0.5) must not exceed high_watermark (0.4)",
        );
        assert_eq!(
            p.in_file("rules.toml").to_string(),
            r#"rules.toml:12: autoscaler "billing": metric "latency": low_watermark (0.5) must not exceed high_watermark (0.4)"#
        );
        assert_eq!(
            p.to_string(),
            r#"line 12: autoscaler "billing": metric "latency": low_watermark (0.5) must not exceed high_watermark (0.4)"#
        );
    }

    #[test]
    fn omits_unknown_parts() {
        assert_eq!(problem(None, None, "max_replicas", "is required").to_string(), "max_replicas is required");
        assert_eq!(
            problem(None, None, "", "cannot read the file").in_file("a.toml").to_string(),
            "a.toml: cannot read the file"
        );
        assert_eq!(
            problem(None, None, "metric", "at least one metric is required").to_string(),
            "metric: at least one metric is required"
        );
    }

    #[test]
    fn rules_error_lists_one_problem_per_line() {
        let err = RulesError {
            origin: "r.toml".into(),
            problems: vec![problem(Some(1), None, "a", "is required"), problem(Some(2), None, "b", "is required")],
        };
        assert_eq!(err.to_string(), "r.toml:1: a is required\nr.toml:2: b is required");
    }
}
