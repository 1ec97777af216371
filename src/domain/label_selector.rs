//! A Kubernetes label selector in its text form (`watermarkd.io/controller=watermarkd`,
//! `tier in (web,api),!legacy`), as `kubectl -l` and the API's `labelSelector` parameter take
//! it: parsed once, so that a bad `wpa_selector` is refused when the daemon starts, naming what
//! is wrong, and matched against an object's labels where the API server's answer alone does
//! not do (which WPAs are another controller's).
//!
//! The grammar is the API server's (k8s.io/apimachinery `labels.Parse`): requirements joined by
//! `,`, each `key`, `!key`, `key=value`, `key==value`, `key!=value`, `key in (v1,v2)`,
//! `key notin (v1,v2)`, `key>N` or `key<N`; keys are qualified names (an optional DNS-subdomain
//! prefix and `/`), values at most 63 characters of letters, digits, `-`, `_` and `.`.

use std::collections::BTreeMap;
use std::fmt;

/// A parsed selector. Its text is kept, to be sent to the API server as it was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelSelector {
    text: String,
    requirements: Vec<Requirement>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Requirement {
    key: String,
    operator: Operator,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Operator {
    Exists,
    DoesNotExist,
    In(Vec<String>),
    NotIn(Vec<String>),
    GreaterThan(i64),
    LessThan(i64),
}

/// Why a selector's text is not one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("label selector {text:?}: {message}")]
pub struct SelectorError {
    text: String,
    message: String,
}

impl LabelSelector {
    pub fn parse(text: &str) -> Result<LabelSelector, SelectorError> {
        let fail = |message: String| SelectorError { text: text.to_string(), message };
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err(fail("is empty (leave the setting out to select every object)".into()));
        }
        let mut requirements = Vec::new();
        for part in split_requirements(trimmed).map_err(fail)? {
            requirements.push(requirement(part.trim()).map_err(fail)?);
        }
        Ok(LabelSelector { text: trimmed.to_string(), requirements })
    }

    /// The text, as the API server's `labelSelector` takes it.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether an object with these labels is selected.
    pub fn matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        self.requirements.iter().all(|r| {
            let value = labels.and_then(|l| l.get(&r.key));
            match &r.operator {
                Operator::Exists => value.is_some(),
                Operator::DoesNotExist => value.is_none(),
                Operator::In(values) => value.is_some_and(|v| values.contains(v)),
                Operator::NotIn(values) => value.is_none_or(|v| !values.contains(v)),
                Operator::GreaterThan(n) => value.and_then(|v| v.parse::<i64>().ok()).is_some_and(|v| v > *n),
                Operator::LessThan(n) => value.and_then(|v| v.parse::<i64>().ok()).is_some_and(|v| v < *n),
            }
        })
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// The requirements, split at the commas outside parentheses.
fn split_requirements(text: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.checked_sub(1).ok_or_else(|| format!("a ')' at character {} opens nothing", i + 1))?,
            ',' if depth == 0 => {
                parts.push(text.get(start..i).unwrap_or_default());
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("a '(' is never closed".into());
    }
    parts.push(text.get(start..).unwrap_or_default());
    if parts.iter().any(|p| p.trim().is_empty()) {
        return Err("has an empty requirement (two commas, or one at an end)".into());
    }
    Ok(parts)
}

/// Reads the value after an operator into it.
type ReadOperator = fn(String) -> Result<Operator, String>;

fn requirement(text: &str) -> Result<Requirement, String> {
    if let Some(key) = text.strip_prefix('!') {
        let key = key.trim();
        check_key(key)?;
        return Ok(Requirement { key: key.into(), operator: Operator::DoesNotExist });
    }
    let operators: [(&str, ReadOperator); 5] = [
        ("!=", |v| Ok(Operator::NotIn(vec![value(&v)?]))),
        ("==", |v| Ok(Operator::In(vec![value(&v)?]))),
        ("=", |v| Ok(Operator::In(vec![value(&v)?]))),
        (">", |v| number(&v).map(Operator::GreaterThan)),
        ("<", |v| number(&v).map(Operator::LessThan)),
    ];
    for (symbol, operator) in operators {
        if let Some((key, rest)) = text.split_once(symbol) {
            let key = key.trim();
            check_key(key)?;
            return Ok(Requirement { key: key.into(), operator: operator(rest.trim().to_string())? });
        }
    }
    let mut words = text.splitn(2, char::is_whitespace);
    let key = words.next().unwrap_or_default().trim();
    let rest = words.next().unwrap_or_default().trim();
    check_key(key)?;
    if rest.is_empty() {
        return Ok(Requirement { key: key.into(), operator: Operator::Exists });
    }
    let (word, set) = rest.split_once(|c: char| c.is_whitespace() || c == '(').map_or((rest, ""), |(w, _)| (w, rest));
    let set = set.get(word.len()..).unwrap_or_default().trim();
    let values = || -> Result<Vec<String>, String> {
        let inner = set
            .strip_prefix('(')
            .and_then(|s| s.strip_suffix(')'))
            .ok_or_else(|| format!("{key} {word}: the values must be in parentheses, as ({key} {word} (a,b))"))?;
        inner.split(',').map(|v| value(v.trim())).collect()
    };
    match word {
        "in" => Ok(Requirement { key: key.into(), operator: Operator::In(values()?) }),
        "notin" => Ok(Requirement { key: key.into(), operator: Operator::NotIn(values()?) }),
        other => Err(format!(
            "{other:?} after {key} is not an operator (=, ==, !=, in, notin, >, <, or nothing for \"has the label\")"
        )),
    }
}

fn number(text: &str) -> Result<i64, String> {
    text.parse().map_err(|_| format!("{text:?} is not a whole number (> and < compare numbers)"))
}

/// A label value: at most 63 characters, letters and digits at both ends, `-`, `_` and `.`
/// between; or empty.
fn value(text: &str) -> Result<String, String> {
    if !text.is_empty() && !name_part(text) {
        return Err(format!(
            "{text:?} is not a label value (at most 63 letters, digits, '-', '_' or '.', beginning and ending with a \
             letter or digit)"
        ));
    }
    Ok(text.to_string())
}

/// A label key: `name` or `prefix/name`, the prefix a DNS subdomain.
fn check_key(key: &str) -> Result<(), String> {
    let (prefix, name) = key.rsplit_once('/').map_or((None, key), |(p, n)| (Some(p), n));
    let prefix_ok = prefix.is_none_or(|p| {
        p.len() <= 253
            && p.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            })
    });
    if name.is_empty() || !name_part(name) || !prefix_ok {
        return Err(format!(
            "{key:?} is not a label key (a name of at most 63 letters, digits, '-', '_' or '.', optionally after a \
             DNS subdomain and '/', as in watermarkd.io/controller)"
        ));
    }
    Ok(())
}

fn name_part(text: &str) -> bool {
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    text.len() <= 63
        && alnum(text.chars().next())
        && alnum(text.chars().last())
        && text.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn equality_and_set_requirements_match_as_the_api_server_s() {
        let ours = LabelSelector::parse("watermarkd.io/controller=watermarkd").expect("a selector");
        assert_eq!(ours.as_str(), "watermarkd.io/controller=watermarkd");
        assert!(ours.matches(Some(&labels(&[("watermarkd.io/controller", "watermarkd")]))));
        assert!(!ours.matches(Some(&labels(&[("watermarkd.io/controller", "datadog")]))));
        assert!(!ours.matches(None));
        let set = LabelSelector::parse("tier in (web, api), !legacy,env!=dev , team").expect("a selector");
        assert!(set.matches(Some(&labels(&[("tier", "web"), ("team", "a")]))));
        assert!(!set.matches(Some(&labels(&[("tier", "web"), ("team", "a"), ("legacy", "")]))));
        assert!(!set.matches(Some(&labels(&[("tier", "db"), ("team", "a")]))));
        assert!(!set.matches(Some(&labels(&[("tier", "api"), ("team", "a"), ("env", "dev")]))));
        assert!(!set.matches(Some(&labels(&[("tier", "api")]))), "team must exist");
        let notin = LabelSelector::parse("env notin (dev,test),gen>2").expect("a selector");
        assert!(notin.matches(Some(&labels(&[("gen", "3")]))));
        assert!(!notin.matches(Some(&labels(&[("gen", "2")]))));
        assert!(LabelSelector::parse("a==b").expect("==").matches(Some(&labels(&[("a", "b")]))));
    }

    #[test]
    fn a_bad_selector_says_what_is_wrong() {
        let said = |text: &str| LabelSelector::parse(text).expect_err(text).to_string();
        assert!(said("").contains("is empty"));
        assert!(said("a=b,,c").contains("empty requirement"), "{}", said("a=b,,c"));
        assert!(said("Bad Key=x").contains("not an operator") || said("Bad Key=x").contains("not a label key"));
        assert!(said("a=b c").contains("not a label value"), "{}", said("a=b c"));
        assert!(said("a in b").contains("parentheses"), "{}", said("a in b"));
        assert!(said("a in (b").contains("never closed"));
        assert!(said("a maybe (b)").contains("not an operator"), "{}", said("a maybe (b)"));
        assert!(said("a>x").contains("whole number"));
        assert!(said("-a=b").contains("not a label key"));
        assert!(said("UPPER.io/x=y").contains("not a label key"), "a prefix is lower case");
    }
}
