//! Kubernetes label selectors as text (`app=web,tier in (a,b),!canary`), the form the API
//! server takes in `labelSelector`: checked when rules are read, so that a typo is a problem
//! naming the autoscaler rather than an API error every cycle, and built from a WPA's
//! `metricSelector` (matchLabels and matchExpressions).

use std::collections::BTreeMap;

/// One `matchExpressions` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expression {
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    pub operator: String,
    pub values: Vec<String>,
}

/// Checks a selector written as text and returns it with spaces around its requirements
/// removed. Empty selectors are refused: they select every pod of the namespace.
pub fn parse_selector(text: &str) -> Result<String, String> {
    let mut requirements = Vec::new();
    for requirement in split_requirements(text)? {
        requirements.push(check_requirement(requirement.trim())?);
    }
    if requirements.is_empty() {
        return Err("selects every pod of the namespace: give at least one label, such as \"app=web\"".into());
    }
    Ok(requirements.join(","))
}

/// A `LabelSelector` as text, each part checked. `matchLabels` come first, sorted by key, then
/// the expressions in their order.
pub fn selector_text(labels: &BTreeMap<String, String>, expressions: &[Expression]) -> Result<String, String> {
    let mut parts = Vec::new();
    for (key, value) in labels {
        check_key(key)?;
        check_value(value)?;
        parts.push(format!("{key}={value}"));
    }
    for (i, e) in expressions.iter().enumerate() {
        let at = format!("matchExpressions[{i}]");
        check_key(&e.key).map_err(|m| format!("{at}: {m}"))?;
        let part = match e.operator.as_str() {
            "In" | "NotIn" => {
                if e.values.is_empty() {
                    return Err(format!("{at}: operator {} needs values", e.operator));
                }
                for value in &e.values {
                    check_value(value).map_err(|m| format!("{at}: {m}"))?;
                }
                let word = if e.operator == "In" { "in" } else { "notin" };
                format!("{} {word} ({})", e.key, e.values.join(","))
            }
            "Exists" | "DoesNotExist" => {
                if !e.values.is_empty() {
                    return Err(format!("{at}: operator {} takes no values", e.operator));
                }
                if e.operator == "Exists" {
                    e.key.clone()
                } else {
                    format!("!{}", e.key)
                }
            }
            other => {
                return Err(format!("{at}: operator {other:?} must be In, NotIn, Exists or DoesNotExist"));
            }
        };
        parts.push(part);
    }
    if parts.is_empty() {
        return Err("is empty and would select every pod of the namespace: give matchLabels".into());
    }
    Ok(parts.join(","))
}

/// Splits on the commas that are not inside `( )`.
fn split_requirements(text: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err(format!("({text:?}) has a ')' without its '('"));
                }
            }
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("({text:?}) has a '(' without its ')'"));
    }
    parts.push(&text[start..]);
    Ok(parts.into_iter().filter(|p| !p.trim().is_empty()).collect())
}

fn check_requirement(requirement: &str) -> Result<String, String> {
    for word in [" notin ", " in "] {
        if let Some((key, values)) = requirement.split_once(word) {
            let key = key.trim();
            check_key(key)?;
            let values = values.trim();
            let inner = values
                .strip_prefix('(')
                .and_then(|v| v.strip_suffix(')'))
                .ok_or_else(|| format!("{requirement:?}: the values of {} must be in parentheses", word.trim()))?;
            let values: Vec<&str> = inner.split(',').map(str::trim).collect();
            for value in &values {
                check_value(value)?;
            }
            return Ok(format!("{key} {} ({})", word.trim(), values.join(",")));
        }
    }
    for operator in ["!=", "==", "="] {
        if let Some((key, value)) = requirement.split_once(operator) {
            let (key, value) = (key.trim(), value.trim());
            check_key(key)?;
            check_value(value)?;
            return Ok(format!("{key}{operator}{value}"));
        }
    }
    match requirement.strip_prefix('!') {
        Some(key) => check_key(key.trim()).map(|()| format!("!{}", key.trim())),
        None => check_key(requirement).map(|()| requirement.to_string()),
    }
}

/// `[prefix/]name`: a DNS subdomain prefix, and a name of at most 63 alphanumerics, `-`, `_`,
/// `.`, starting and ending with an alphanumeric.
fn check_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        let ok = !prefix.is_empty()
            && prefix.len() <= 253
            && prefix.split('.').all(|part| {
                !part.is_empty()
                    && part.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            });
        if !ok {
            return Err(format!("label key {key:?}: the prefix must be a DNS subdomain such as example.com"));
        }
    }
    if name.is_empty() {
        return Err(format!("label key {key:?} is empty"));
    }
    check_name(name).map_err(|why| format!("label key {key:?} {why}"))
}

fn check_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    check_name(value).map_err(|why| format!("label value {value:?} {why}"))
}

fn check_name(name: &str) -> Result<(), String> {
    if name.len() > 63 {
        return Err("is longer than 63 characters".into());
    }
    let inner = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    let ends = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !name.chars().all(inner) || !ends(name.chars().next()) || !ends(name.chars().last()) {
        return Err("must be letters, digits, '-', '_' or '.', starting and ending with a letter or digit".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_in_the_api_server_syntax_are_accepted_and_tidied() {
        assert_eq!(parse_selector("app=web").unwrap(), "app=web");
        assert_eq!(
            parse_selector(" app == web , tier in (a, b),!canary, env notin (dev) ,example.com/team").unwrap(),
            "app==web,tier in (a,b),!canary,env notin (dev),example.com/team"
        );
        assert_eq!(parse_selector("version!=v2").unwrap(), "version!=v2");
    }

    #[test]
    fn bad_selectors_say_what_is_wrong() {
        assert!(parse_selector("").unwrap_err().contains("selects every pod"));
        assert!(parse_selector(" , ").unwrap_err().contains("selects every pod"));
        assert!(parse_selector("app=web!").unwrap_err().contains("label value \"web!\""));
        assert!(parse_selector("tier in a,b").unwrap_err().contains("must be in parentheses"));
        assert!(parse_selector("tier in (a").unwrap_err().contains("'(' without its ')'"));
        assert!(parse_selector("a)").unwrap_err().contains("')' without its '('"));
        assert!(parse_selector("Bad_Prefix/x=1").unwrap_err().contains("DNS subdomain"));
    }

    #[test]
    fn a_label_selector_becomes_text() {
        let labels: BTreeMap<String, String> =
            [("tier", "web"), ("app", "shop")].iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let expression = |key: &str, operator: &str, values: &[&str]| Expression {
            key: key.into(),
            operator: operator.into(),
            values: values.iter().map(|v| v.to_string()).collect(),
        };
        let text = selector_text(
            &labels,
            &[
                expression("env", "In", &["prod", "staging"]),
                expression("canary", "DoesNotExist", &[]),
                expression("zone", "NotIn", &["a"]),
                expression("team", "Exists", &[]),
            ],
        )
        .unwrap();
        assert_eq!(text, "app=shop,tier=web,env in (prod,staging),!canary,zone notin (a),team");
        assert_eq!(parse_selector(&text).unwrap(), text, "what it builds, it reads");
        assert!(selector_text(&BTreeMap::new(), &[]).unwrap_err().contains("select every pod"));
        assert_eq!(
            selector_text(&BTreeMap::new(), &[expression("a", "In", &[])]).unwrap_err(),
            "matchExpressions[0]: operator In needs values"
        );
        assert!(selector_text(&BTreeMap::new(), &[expression("a", "Gt", &["1"])]).unwrap_err().contains("\"Gt\""));
    }
}
