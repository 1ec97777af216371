//! prometheus-adapter's configuration (its `--config` file: `rules:` and `externalRules:`), and
//! the PromQL it runs for one HPA metric, built by the rules its documentation gives
//! (docs/config.md and docs/externalmetrics.md of kubernetes-sigs/prometheus-adapter):
//!
//! - a rule serves the API name its `name.matches` / `name.as` make of a series' name (`as`
//!   defaults to `$0` without a capture group and `$1` with one), among the series its
//!   `seriesQuery` finds and its `seriesFilters` (`is` / `isNot`) keep;
//! - `resources.overrides` map a label to a group-resource, `resources.template`
//!   (`kube_<<.Group>>_<<.Resource>>`) makes the label of any group-resource (the group with
//!   `.` and `-` as `_`, the resource singular);
//! - `metricsQuery` is a Go template with `<<` `>>` delimiters over `.Series` (the series name),
//!   `.LabelMatchers` (the HPA's metric selector, then `namespace`, then the resource label:
//!   `label="value"`, or `=~` for several objects; sorted by label as Kubernetes sorts a
//!   selector), `.GroupBy` (the resource label; empty for external metrics) and the raw
//!   `.LabelValuesByName` and `.GroupBySlice`;
//! - for external metrics the namespace matcher is added unless `resources.namespaced: false`.
//!
//! What the adapter itself refuses (a template that does not parse, a filter with both or
//! neither of `is` and `isNot`, a regex that does not compile, a `name.matches` with several
//! groups and no `as`) is an error here too, naming the rule and field.

use std::collections::BTreeMap;

use regex::Regex;
use serde::Deserialize;
use serde_json::Value;

use super::node::{FieldProblem, Node};
use super::{Finding, Place, Severity};

/// The adapter's configuration, checked.
#[derive(Clone, Debug)]
pub struct AdapterConfig {
    pub file: String,
    rules: Vec<Rule>,
    external_rules: Vec<Rule>,
}

#[derive(Clone, Debug)]
struct Rule {
    /// `rules[2]` or `externalRules[0]`.
    path: String,
    series_query: String,
    filters: Vec<(bool, Regex)>,
    /// label -> (group, resource as written).
    overrides: Vec<(String, String, String)>,
    resource_template: Option<Template>,
    name_matches: Regex,
    name_as: String,
    metrics_query: Template,
    namespaced: bool,
    /// `labelValueReplacements`, applied to `.LabelValuesByName` of external metrics.
    replacements: Vec<(String, String)>,
}

/// One part of an HPA metric's selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    /// `Equals`, `In`, `NotIn`, `Exists`, `DoesNotExist`.
    pub operator: String,
    pub values: Vec<String>,
}

/// How the HPA's object is matched: one name, or the pattern of its pods' names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Objects {
    /// One object, as the adapter matches it: `label="name"`.
    Named(String),
    /// Pods, whose names are only known at run time: a regex standing for them (`=~`).
    Pattern(String),
}

/// The rule that serves a metric, the series behind it, and what that took for granted.
type Serving<'r> = (&'r Rule, String, Vec<String>);

/// The query the adapter would run, and what it took to find it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expansion {
    pub query: String,
    /// `rules[0]`.
    pub rule: String,
    pub series: String,
    /// What it took for granted.
    pub assumptions: Vec<String>,
}

/// A group-resource, as the adapter keys its labels: `("", "pods")`, `("apps", "deployments")`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupResource {
    pub group: String,
    /// Plural, lower case.
    pub resource: String,
}

impl GroupResource {
    pub fn new(group: &str, resource: &str) -> GroupResource {
        GroupResource { group: group.to_string(), resource: resource.to_string() }
    }

    /// The group-resource of a kind (`Service` in `v1`): its lower-case plural.
    pub fn of_kind(api_version: &str, kind: &str) -> GroupResource {
        let group = api_version.rsplit_once('/').map_or("", |(group, _)| group);
        let lower = kind.to_lowercase();
        let plural = if lower.ends_with('s') || lower.ends_with('x') || lower.ends_with("ch") || lower.ends_with("sh") {
            format!("{lower}es")
        } else if let Some(stem) = lower.strip_suffix('y').filter(|s| !s.ends_with(['a', 'e', 'i', 'o', 'u'])) {
            format!("{stem}ies")
        } else {
            format!("{lower}s")
        };
        GroupResource::new(group, &plural)
    }

    fn singular(&self) -> String {
        singular(&self.resource)
    }
}

/// `pods` -> `pod`, `ingresses` -> `ingress`, `policies` -> `policy`; a singular stays as it is.
fn singular(resource: &str) -> String {
    let lower = resource.to_lowercase();
    if let Some(stem) = lower.strip_suffix("ies") {
        return format!("{stem}y");
    }
    for ending in ["sses", "xes", "ches", "shes"] {
        if lower.ends_with(ending) {
            return lower.get(..lower.len() - 2).unwrap_or(&lower).to_string();
        }
    }
    if lower.ends_with("ss") {
        return lower;
    }
    lower.strip_suffix('s').map_or(lower.clone(), str::to_string)
}

impl AdapterConfig {
    /// Reads the adapter's configuration file. Every problem the adapter would refuse the file
    /// for is a finding naming the file, the rule and the field.
    pub fn parse(file: &str, text: &str) -> Result<AdapterConfig, Vec<Finding>> {
        let place = Place::file(file, 1);
        let finding = |field: String, message: String| Finding {
            severity: Severity::Invalid,
            place: place.clone(),
            object: Some("prometheus-adapter configuration".into()),
            field,
            message,
        };
        let value: Value = match serde_yaml_ng::Deserializer::from_str(text).next().map(Value::deserialize) {
            Some(Ok(value)) => value,
            Some(Err(err)) => return Err(vec![finding(String::new(), format!("is not YAML: {err}"))]),
            None => return Err(vec![finding(String::new(), "is empty".into())]),
        };
        // The chart (and many installs) keep it under a ConfigMap's `data.config.yaml`.
        let value = match value.get("data").and_then(|d| d.get("config.yaml")).and_then(Value::as_str) {
            Some(inner) => match serde_yaml_ng::from_str::<Value>(inner) {
                Ok(value) => value,
                Err(err) => return Err(vec![finding("data.config.yaml".into(), format!("is not YAML: {err}"))]),
            },
            None => value,
        };
        let root = Node::root(&value);
        if !root.is_map() {
            return Err(vec![finding(String::new(), "must be a map with rules: and externalRules:".into())]);
        }
        let mut problems = Vec::new();
        let rules = read_rules(&root, "rules", &mut problems);
        let external_rules = read_rules(&root, "externalRules", &mut problems);
        if !problems.is_empty() {
            return Err(problems.into_iter().map(|p| finding(p.field, p.message)).collect());
        }
        Ok(AdapterConfig { file: file.to_string(), rules, external_rules })
    }

    /// The query the adapter runs for the custom metric `metric` of `objects` of `resource` in
    /// `namespace`, with the HPA's `selector`; `Ok(None)` when no rule serves it.
    pub fn custom_query(
        &self,
        metric: &str,
        resource: &GroupResource,
        namespace: &str,
        selector: &[Requirement],
        objects: &Objects,
    ) -> Result<Option<Expansion>, String> {
        let Some((rule, series, mut assumptions)) = self.serving(&self.rules, metric, Some(resource))? else {
            return Ok(None);
        };
        let resource_label = rule.label_for(resource)?;
        let namespace_label = rule.label_for(&GroupResource::new("", "namespaces"))?;
        let mut parts = selector_parts(selector)?;
        parts.push((namespace_label, go_quote_matcher("=", namespace)));
        let (matcher, value) = match objects {
            Objects::Named(name) => ("=", name.clone()),
            Objects::Pattern(pattern) => ("=~", pattern.clone()),
        };
        let mut values_by_name: BTreeMap<String, String> = BTreeMap::new();
        for requirement in selector {
            values_by_name.insert(requirement.key.clone(), requirement.values.join("|"));
        }
        values_by_name.insert(parts.last().map(|p| p.0.clone()).unwrap_or_default(), namespace.to_string());
        values_by_name.insert(resource_label.clone(), value.clone());
        parts.push((resource_label.clone(), go_quote_matcher(matcher, &value)));
        let matchers: Vec<String> = parts.iter().map(|(label, m)| format!("{label}{m}")).collect();
        let args = Args {
            series: series.clone(),
            label_matchers: matchers.join(","),
            values_by_name,
            group_by: resource_label.clone(),
        };
        let query = rule.metrics_query.execute(&args).map_err(|e| format!("{}.metricsQuery: {e}", rule.path))?;
        if let Objects::Pattern(pattern) = objects {
            assumptions.push(format!(
                "the adapter matches the HPA's pods by name ({resource_label}=~\"pod-1|pod-2|...\", the ready and \
                 unready pods of its selector when the HPA asks); the names are only known at run time, so \
                 {resource_label}=~\"{pattern}\" stands for them (the pods of the target, named as its controller names \
                 them)"
            ));
        }
        Ok(Some(Expansion { query, rule: rule.path.clone(), series, assumptions }))
    }

    /// The query the adapter runs for the external metric `metric` asked from `namespace` with
    /// the HPA's `selector`; `Ok(None)` when no external rule serves it.
    pub fn external_query(
        &self,
        metric: &str,
        namespace: &str,
        selector: &[Requirement],
    ) -> Result<Option<Expansion>, String> {
        let Some((rule, series, assumptions)) = self.serving(&self.external_rules, metric, None)? else {
            return Ok(None);
        };
        let mut parts = selector_parts(selector)?;
        let mut values_by_name: BTreeMap<String, String> = BTreeMap::new();
        for requirement in selector {
            values_by_name.insert(requirement.key.clone(), requirement.values.join("|"));
        }
        if rule.namespaced {
            let label = rule.label_for(&GroupResource::new("", "namespaces"))?;
            values_by_name.insert(label.clone(), namespace.to_string());
            parts.push((label, go_quote_matcher("=", namespace)));
        }
        for (find, replace) in &rule.replacements {
            for value in values_by_name.values_mut() {
                *value = value.replace(find.as_str(), replace);
            }
        }
        let matchers: Vec<String> = parts.iter().map(|(label, m)| format!("{label}{m}")).collect();
        let args = Args {
            series: series.clone(),
            label_matchers: matchers.join(","),
            values_by_name,
            group_by: String::new(),
        };
        let query = rule.metrics_query.execute(&args).map_err(|e| format!("{}.metricsQuery: {e}", rule.path))?;
        Ok(Some(Expansion { query, rule: rule.path.clone(), series, assumptions }))
    }

    /// The first rule that serves `metric` (for `resource`, a custom metric), with the series
    /// name it comes from.
    fn serving<'r>(
        &self,
        rules: &'r [Rule],
        metric: &str,
        resource: Option<&GroupResource>,
    ) -> Result<Option<Serving<'r>>, String> {
        let mut found: Option<(&Rule, String)> = None;
        let mut others = Vec::new();
        for rule in rules {
            if let Some(resource) = resource {
                if rule.label_for(resource).is_err() {
                    continue;
                }
            }
            let Some(series) = rule.series_for(metric) else { continue };
            if found.is_none() {
                found = Some((rule, series));
            } else {
                others.push(format!("{} (from a series {series:?})", rule.path));
            }
        }
        let Some((rule, series)) = found else { return Ok(None) };
        let mut assumptions = vec![format!(
            "{} of {} serves {metric:?} from the series {series:?}; the adapter serves it only while Prometheus has such \
             a series with the labels the rule maps (assumed)",
            rule.path, self.file
        )];
        if !others.is_empty() {
            assumptions.push(format!(
                "{} could serve it too, if Prometheus has such a series: the adapter wants its rules to be exclusive, \
                 and the first is used here",
                others.join(", ")
            ));
        }
        Ok(Some((rule, series, assumptions)))
    }
}

fn read_rules(root: &Node<'_>, key: &str, problems: &mut Vec<FieldProblem>) -> Vec<Rule> {
    let mut rules = Vec::new();
    for child in root.list(key, problems) {
        let node = child.node();
        let mut rule_problems = Vec::new();
        if let Some(rule) = read_rule(&node, &mut rule_problems) {
            if rule_problems.is_empty() {
                rules.push(rule);
            }
        }
        problems.append(&mut rule_problems);
    }
    rules
}

fn read_rule(node: &Node<'_>, problems: &mut Vec<FieldProblem>) -> Option<Rule> {
    let path = node.path().to_string();
    let series_query = node.required_text("seriesQuery", problems).unwrap_or_default().to_string();
    let mut filters = Vec::new();
    for filter in node.list("seriesFilters", problems) {
        let f = filter.node();
        let is = f.text("is", problems);
        let is_not = f.text("isNot", problems);
        let (positive, pattern) = match (is.filter(|s| !s.is_empty()), is_not.filter(|s| !s.is_empty())) {
            (Some(_), Some(_)) => {
                problems.push(FieldProblem {
                    field: filter.path.clone(),
                    message: "cannot have both is and isNot (the adapter refuses it)".into(),
                });
                continue;
            }
            (None, None) => {
                problems.push(FieldProblem {
                    field: filter.path.clone(),
                    message: "must have is or isNot (the adapter refuses it)".into(),
                });
                continue;
            }
            (Some(p), None) => (true, p),
            (None, Some(p)) => (false, p),
        };
        match Regex::new(pattern) {
            Ok(regex) => filters.push((positive, regex)),
            Err(err) => problems.push(FieldProblem {
                field: f.at(if positive { "is" } else { "isNot" }),
                message: format!("is not a regex the adapter compiles: {err}"),
            }),
        }
    }
    let resources = node.map("resources", problems);
    let mut overrides = Vec::new();
    let mut resource_template = None;
    let mut namespaced = true;
    if let Some(resources) = &resources {
        let r = resources.node();
        if let Some(over) = r.map("overrides", problems) {
            for label in over.node().keys() {
                let Some(target) = over.node().map(label, problems) else { continue };
                let group = target.node().text("group", problems).unwrap_or_default().to_string();
                let resource = target.node().required_text("resource", problems).unwrap_or_default().to_string();
                overrides.push((label.to_string(), group, resource));
            }
        }
        if let Some(text) = r.text("template", problems).filter(|t| !t.is_empty()) {
            match Template::parse(text) {
                Ok(template) => resource_template = Some(template),
                Err(err) => problems
                    .push(FieldProblem { field: r.at("template"), message: format!("{err} (the adapter refuses it)") }),
            }
        }
        if let Some(flag) = r.flag("namespaced", problems) {
            namespaced = flag;
        }
    }
    if overrides.is_empty() && resource_template.is_none() {
        problems.push(FieldProblem {
            field: node.at("resources"),
            message: "needs overrides or a template: without either no series is associated with any object".into(),
        });
    }
    let name = node.map("name", problems);
    let matches = name.as_ref().and_then(|n| n.node().text("matches", problems)).filter(|m| !m.is_empty());
    let name_matches = match Regex::new(matches.unwrap_or(".*")) {
        Ok(regex) => regex,
        Err(err) => {
            problems.push(FieldProblem {
                field: node.at("name.matches"),
                message: format!("is not a regex the adapter compiles: {err}"),
            });
            return None;
        }
    };
    let name_as = match name.as_ref().and_then(|n| n.node().text("as", problems)).filter(|a| !a.is_empty()) {
        Some(text) => text.to_string(),
        None => match name_matches.captures_len() {
            1 => "$0".into(),
            2 => "$1".into(),
            _ => {
                problems.push(FieldProblem {
                    field: node.at("name.as"),
                    message: "is required: name.matches has several capture groups (the adapter refuses it)".into(),
                });
                return None;
            }
        },
    };
    let metrics_query = match node.required_text("metricsQuery", problems).map(Template::parse) {
        Some(Ok(template)) => template,
        Some(Err(err)) => {
            problems.push(FieldProblem {
                field: node.at("metricsQuery"),
                message: format!("{err} (the adapter refuses it)"),
            });
            return None;
        }
        None => return None,
    };
    if let Err(err) =
        metrics_query.check_fields(&["Series", "LabelMatchers", "GroupBy", "LabelValuesByName", "GroupBySlice"])
    {
        problems.push(FieldProblem { field: node.at("metricsQuery"), message: err });
    }
    if let Some(template) = &resource_template {
        if let Err(err) = template.check_fields(&["Group", "Resource"]) {
            problems.push(FieldProblem { field: node.at("resources.template"), message: err });
        }
    }
    let mut replacements = Vec::new();
    for replacement in node.list("labelValueReplacements", problems) {
        let r = replacement.node();
        let find = r.text("find", problems).unwrap_or_default().to_string();
        let replace = r.text("replace", problems).unwrap_or_default().to_string();
        replacements.push((find, replace));
    }
    Some(Rule {
        path,
        series_query,
        filters,
        overrides,
        resource_template,
        name_matches,
        name_as,
        metrics_query,
        namespaced,
        replacements,
    })
}

impl Rule {
    /// The label of a group-resource: an override's, else the template's.
    fn label_for(&self, resource: &GroupResource) -> Result<String, String> {
        for (label, group, written) in &self.overrides {
            if group == &resource.group && singular(written) == resource.singular() {
                return Ok(label.clone());
            }
        }
        let Some(template) = &self.resource_template else {
            return Err(format!(
                "{} maps no label to {}{}{} (no override, no template)",
                self.path,
                resource.resource,
                if resource.group.is_empty() { "" } else { "." },
                resource.group
            ));
        };
        let mut fields = BTreeMap::new();
        fields.insert("Group", resource.group.replace(['.', '-'], "_"));
        fields.insert("Resource", resource.singular());
        template.execute_fields(&fields).map_err(|e| format!("{}.resources.template: {e}", self.path))
    }

    /// The series name behind the API name `metric`, when this rule serves it.
    fn series_for(&self, metric: &str) -> Option<String> {
        self.candidates(metric).into_iter().find(|candidate| self.serves(candidate, metric))
    }

    /// Series names that could be behind `metric`: the name `seriesQuery` names, the API name
    /// itself, and `as` undone where `matches` is literal text around one capture group.
    fn candidates(&self, metric: &str) -> Vec<String> {
        let mut candidates = Vec::new();
        if let Some(name) = series_query_name(&self.series_query) {
            candidates.push(name);
        }
        candidates.push(metric.to_string());
        if let Some(name) = self.undo_as(metric) {
            candidates.push(name);
        }
        candidates
    }

    fn undo_as(&self, metric: &str) -> Option<String> {
        let (before_ref, after_ref) = split_group_reference(&self.name_as)?;
        let captured = metric.strip_prefix(before_ref.as_str())?.strip_suffix(after_ref.as_str())?;
        let pattern = self.name_matches.as_str();
        let pattern = pattern.strip_prefix('^').unwrap_or(pattern);
        let pattern = pattern.strip_suffix('$').unwrap_or(pattern);
        let open = pattern.find('(')?;
        let close = pattern.get(open..)?.find(')')? + open;
        let before = unescape_literal(pattern.get(..open)?)?;
        let after = unescape_literal(pattern.get(close + 1..)?)?;
        Some(format!("{before}{captured}{after}"))
    }

    /// Whether the adapter would list `series` under this rule and name it `metric`.
    fn serves(&self, series: &str, metric: &str) -> bool {
        if !series_query_admits(&self.series_query, series) {
            return false;
        }
        if !self.filters.iter().all(|(positive, regex)| regex.is_match(series) == *positive) {
            return false;
        }
        let Some(captures) = self.name_matches.captures(series) else { return false };
        let mut named = String::new();
        captures.expand(&self.name_as, &mut named);
        named == metric
    }
}

/// `$1`/`${1}` with literal text around it, as `as` is written: the text before and after.
fn split_group_reference(name_as: &str) -> Option<(String, String)> {
    for reference in ["${1}", "$1"] {
        if let Some(at) = name_as.find(reference) {
            let before = name_as.get(..at)?;
            let after = name_as.get(at + reference.len()..)?;
            // `$1x` is the group named `1x` in Go and in Rust: not a reference to group 1.
            if reference == "$1" && after.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
                return None;
            }
            if before.contains('$') || after.contains('$') {
                return None;
            }
            return Some((before.to_string(), after.to_string()));
        }
    }
    None
}

/// Regex text that is only literal characters (escapes allowed): the text it matches.
fn unescape_literal(pattern: &str) -> Option<String> {
    let mut out = String::new();
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.push(chars.next().filter(|c| !c.is_ascii_alphanumeric())?),
            '.' | '*' | '+' | '?' | '(' | ')' | '[' | ']' | '{' | '}' | '|' | '^' | '$' => return None,
            c => out.push(c),
        }
    }
    Some(out)
}

/// The metric name a series query names: `http_requests_total{...}` or `{__name__="x",...}`.
fn series_query_name(query: &str) -> Option<String> {
    let query = query.trim();
    let name: String = query.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':').collect();
    if !name.is_empty() {
        return Some(name);
    }
    let inner = query.strip_prefix('{')?;
    let at = inner.find("__name__")?;
    let rest = inner.get(at + "__name__".len()..)?.trim_start();
    let rest = rest.strip_prefix('=')?.trim_start();
    let rest = rest.strip_prefix('"')?;
    let end = rest.find('"')?;
    Some(rest.get(..end)?.to_string())
}

/// Whether a series named `series` can be among those `query` finds (its name only).
fn series_query_admits(query: &str, series: &str) -> bool {
    let query = query.trim();
    if let Some(name) = series_query_name(query) {
        return name == series;
    }
    // `{__name__=~"^container_.*",...}`: Prometheus anchors the regex.
    let Some(inner) = query.strip_prefix('{') else { return true };
    let Some(at) = inner.find("__name__") else { return true };
    let rest = inner.get(at + "__name__".len()..).unwrap_or_default().trim_start();
    let (negative, rest) = match (rest.strip_prefix("=~"), rest.strip_prefix("!~")) {
        (Some(rest), _) => (false, rest),
        (_, Some(rest)) => (true, rest),
        _ => return true,
    };
    let Some(rest) = rest.trim_start().strip_prefix('"') else { return true };
    let Some(end) = rest.find('"') else { return true };
    let pattern = rest.get(..end).unwrap_or_default().replace("\\\\", "\\");
    match Regex::new(&format!("^(?:{pattern})$")) {
        Ok(regex) => regex.is_match(series) != negative,
        Err(_) => true,
    }
}

/// The HPA's selector as the adapter's label matchers, sorted by key (Kubernetes sorts a
/// selector's requirements): `label="v"`, `=~"a|b"`, `!=""` for Exists.
fn selector_parts(selector: &[Requirement]) -> Result<Vec<(String, String)>, String> {
    let mut sorted: Vec<&Requirement> = selector.iter().collect();
    sorted.sort_by(|a, b| a.key.cmp(&b.key));
    let mut parts = Vec::new();
    for requirement in sorted {
        let mut values = requirement.values.clone();
        values.sort();
        let matcher = match (requirement.operator.as_str(), values.len()) {
            ("Exists", 0) => "!=",
            ("DoesNotExist", 0) => "=",
            ("Equals", 1) => "=",
            ("NotEquals", 1) => "!=",
            ("In", 1) => "=~",
            ("NotIn", 1) => "!~",
            ("Equals" | "In", _) => "=~",
            ("NotEquals" | "NotIn", _) => "!~",
            (operator, _) => {
                return Err(format!(
                    "the metric selector's {operator} on {:?} cannot become a label matcher (the adapter refuses it)",
                    requirement.key
                ))
            }
        };
        parts.push((requirement.key.clone(), go_quote_matcher(matcher, &values.join("|"))));
    }
    Ok(parts)
}

/// `=` and a value quoted as Go's `%q` quotes it (what the adapter writes).
fn go_quote_matcher(matcher: &str, value: &str) -> String {
    format!("{matcher}{}", go_quote(value))
}

/// Go's `%q` for the text a label value is: `"` and `\` escaped, control characters as escapes.
pub fn go_quote(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The arguments of a `metricsQuery`.
struct Args {
    series: String,
    label_matchers: String,
    values_by_name: BTreeMap<String, String>,
    group_by: String,
}

/// A Go text template with `<<` `>>` delimiters, as far as the adapter's templates go: literal
/// text and actions that print a field (`<<.Series>>`), a map entry (`<<index
/// .LabelValuesByName "pod">>`, `<<.LabelValuesByName.pod>>`) or a slice joined
/// (`<<join .GroupBySlice ",">>`, the one function the adapter's templates commonly use is
/// not Go's, so it is refused as the adapter would).
#[derive(Clone, Debug)]
struct Template {
    parts: Vec<Part>,
}

#[derive(Clone, Debug)]
enum Part {
    Text(String),
    /// A field, with a key for a map.
    Field(String, Option<String>),
}

impl Template {
    fn parse(text: &str) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut rest = text;
        let mut offset = 0;
        while let Some(open) = rest.find("<<") {
            let literal = rest.get(..open).unwrap_or_default();
            let after_open = rest.get(open + 2..).unwrap_or_default();
            let Some(close) = after_open.find(">>") else {
                return Err(format!(
                    "is not a template the adapter parses: the action at character {} is not closed by >>",
                    offset + open + 1
                ));
            };
            let mut action = after_open.get(..close).unwrap_or_default();
            let mut literal = literal.to_string();
            // `<<-` and `->>` trim the white space beside them, as in Go.
            if let Some(trimmed) = action.strip_prefix("- ") {
                action = trimmed;
                literal = literal.trim_end().to_string();
            }
            let mut trim_after = false;
            if let Some(trimmed) = action.strip_suffix(" -") {
                action = trimmed;
                trim_after = true;
            }
            if !literal.is_empty() {
                parts.push(Part::Text(literal));
            }
            parts.push(Self::action(action.trim(), offset + open + 1)?);
            let consumed = open + 2 + close + 2;
            offset += consumed;
            rest = rest.get(consumed..).unwrap_or_default();
            if trim_after {
                let trimmed = rest.trim_start();
                offset += rest.len() - trimmed.len();
                rest = trimmed;
            }
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_string()));
        }
        Ok(Template { parts })
    }

    fn action(action: &str, at: usize) -> Result<Part, String> {
        if action.is_empty() {
            return Err(format!("is not a template the adapter parses: the action at character {at} is empty"));
        }
        if let Some(field) = action.strip_prefix('.') {
            let (name, key) = match field.split_once('.') {
                Some((name, key)) => (name, Some(key.to_string())),
                None => (field, None),
            };
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!("is not a template the adapter parses: {action:?} at character {at}"));
            }
            return Ok(Part::Field(name.to_string(), key));
        }
        let words: Vec<&str> = action.split_whitespace().collect();
        if let ["index", map, key] = words.as_slice() {
            if let (Some(map), Some(key)) =
                (map.strip_prefix('.'), key.strip_prefix('"').and_then(|k| k.strip_suffix('"')))
            {
                return Ok(Part::Field(map.to_string(), Some(key.to_string())));
            }
        }
        Err(format!(
            "has the action <<{action}>> at character {at}, which import does not evaluate (it evaluates fields such as \
             <<.Series>>, <<.LabelMatchers>>, <<.GroupBy>> and <<index .LabelValuesByName \"label\">>)"
        ))
    }

    /// A field the template names that its data does not have fails every query the adapter
    /// runs with it.
    fn check_fields(&self, known: &[&str]) -> Result<(), String> {
        for part in &self.parts {
            if let Part::Field(name, _) = part {
                if !known.contains(&name.as_str()) {
                    return Err(format!(
                        "names the field .{name}, which the adapter's template data has not ({}): the adapter fails every \
                         query with it",
                        known.iter().map(|k| format!(".{k}")).collect::<Vec<_>>().join(", ")
                    ));
                }
            }
        }
        Ok(())
    }

    fn execute(&self, args: &Args) -> Result<String, String> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(text) => out.push_str(text),
                Part::Field(name, None) => match name.as_str() {
                    "Series" => out.push_str(&args.series),
                    "LabelMatchers" => out.push_str(&args.label_matchers),
                    "GroupBy" => out.push_str(&args.group_by),
                    // Go prints a slice as [a b].
                    "GroupBySlice" => {
                        let slice =
                            if args.group_by.is_empty() { String::new() } else { args.group_by.replace(',', " ") };
                        out.push_str(&format!("[{slice}]"));
                    }
                    other => return Err(format!("names .{other}, which the adapter's data has not")),
                },
                Part::Field(name, Some(key)) if name == "LabelValuesByName" => {
                    // A missing key prints Go's "<no value>".
                    out.push_str(args.values_by_name.get(key).map_or("<no value>", String::as_str));
                }
                Part::Field(name, Some(_)) => return Err(format!("cannot index .{name}")),
            }
        }
        if out.is_empty() {
            return Err("is empty once expanded (the adapter refuses the query)".into());
        }
        Ok(out)
    }

    fn execute_fields(&self, fields: &BTreeMap<&str, String>) -> Result<String, String> {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(text) => out.push_str(text),
                Part::Field(name, None) => match fields.get(name.as_str()) {
                    Some(value) => out.push_str(value),
                    None => return Err(format!("names .{name}, which is not .Group or .Resource")),
                },
                Part::Field(name, Some(_)) => return Err(format!("cannot index .{name}")),
            }
        }
        if out.is_empty() {
            return Err("gives an empty label".into());
        }
        Ok(out)
    }
}

/// The HPA metric selector (`matchLabels`, `matchExpressions`) as requirements.
pub fn requirements(node: Option<&Node<'_>>, problems: &mut Vec<FieldProblem>) -> Vec<Requirement> {
    let Some(node) = node else { return Vec::new() };
    let mut requirements: Vec<Requirement> = node
        .text_map("matchLabels", problems)
        .into_iter()
        .map(|(key, value)| Requirement { key, operator: "Equals".into(), values: vec![value] })
        .collect();
    for expression in node.list("matchExpressions", problems) {
        let e = expression.node();
        let key = e.required_text("key", problems).unwrap_or_default().to_string();
        let operator = e.required_text("operator", problems).unwrap_or_default().to_string();
        let values = e.list("values", problems).iter().filter_map(|v| v.value.as_str().map(str::to_string)).collect();
        requirements.push(Requirement { key, operator, values });
    }
    requirements
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = r#"
rules:
- seriesQuery: 'http_requests_total{namespace!="",pod!=""}'
  resources:
    overrides:
      namespace: {resource: "namespace"}
      pod: {resource: "pod"}
  name:
    matches: "^(.*)_total$"
    as: "${1}_per_second"
  metricsQuery: 'sum(rate(<<.Series>>{<<.LabelMatchers>>}[2m])) by (<<.GroupBy>>)'
- seriesQuery: '{__name__=~"^container_.*",container!="POD",namespace!="",pod!=""}'
  seriesFilters:
  - isNot: "^container_.*_seconds_total$"
  resources:
    template: "<<.Resource>>"
  name:
    matches: "^container_(.*)$"
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>,container!="POD"}) by (<<.GroupBy>>)'
externalRules:
- seriesQuery: '{__name__="queue_depth",queue!=""}'
  resources:
    overrides: {namespace: {resource: namespace}}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (queue)'
"#;

    #[test]
    fn the_documented_rate_rule_expands_for_a_pods_metric() {
        let config = AdapterConfig::parse("adapter.yaml", CONFIG).unwrap();
        let expansion = config
            .custom_query(
                "http_requests_per_second",
                &GroupResource::new("", "pods"),
                "shop",
                &[],
                &Objects::Pattern("web-[a-z0-9]+-[a-z0-9]+".into()),
            )
            .unwrap()
            .unwrap();
        assert_eq!(
            expansion.query,
            r#"sum(rate(http_requests_total{namespace="shop",pod=~"web-[a-z0-9]+-[a-z0-9]+"}[2m])) by (pod)"#
        );
        assert_eq!(expansion.series, "http_requests_total");
    }

    #[test]
    fn a_template_rule_with_filters_finds_its_series() {
        let config = AdapterConfig::parse("adapter.yaml", CONFIG).unwrap();
        let expansion = config
            .custom_query(
                "memory_working_set_bytes",
                &GroupResource::new("", "pods"),
                "shop",
                &[Requirement { key: "image".into(), operator: "Exists".into(), values: vec![] }],
                &Objects::Named("web-1".into()),
            )
            .unwrap()
            .unwrap();
        assert_eq!(
            expansion.query,
            r#"sum(container_memory_working_set_bytes{image!="",namespace="shop",pod="web-1",container!="POD"}) by (pod)"#
        );
        // Filtered out by isNot.
        let none = config
            .custom_query(
                "cpu_usage_seconds_total",
                &GroupResource::new("", "pods"),
                "shop",
                &[],
                &Objects::Named("a".into()),
            )
            .unwrap();
        assert!(none.is_none());
    }

    #[test]
    fn an_external_rule_adds_the_namespace_and_selector() {
        let config = AdapterConfig::parse("adapter.yaml", CONFIG).unwrap();
        let selector = [Requirement { key: "queue".into(), operator: "Equals".into(), values: vec!["jobs".into()] }];
        let expansion = config.external_query("queue_depth", "work", &selector).unwrap().unwrap();
        assert_eq!(expansion.query, r#"sum(queue_depth{queue="jobs",namespace="work"}) by (queue)"#);
    }

    #[test]
    fn what_the_adapter_refuses_is_refused_naming_the_rule() {
        let bad = "rules:\n- seriesQuery: x\n  resources: {template: \"<<.Resource>>\"}\n  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}'\n- seriesQuery: y\n  resources: {template: \"<<.Resource>>\"}\n  metricsQuery: 'sum(<<.Series)'\n";
        let findings = AdapterConfig::parse("adapter.yaml", bad).unwrap_err();
        assert_eq!(findings.len(), 1, "{findings:?}");
        assert_eq!(findings[0].field, "rules[1].metricsQuery");
        assert!(findings[0].message.contains("not closed"), "{}", findings[0].message);
        let unknown =
            "rules:\n- seriesQuery: x\n  resources: {template: \"<<.Resource>>\"}\n  metricsQuery: '<<.Seires>>'\n";
        let findings = AdapterConfig::parse("adapter.yaml", unknown).unwrap_err();
        assert!(findings[0].message.contains(".Seires"), "{}", findings[0].message);
    }
}
