//! A rules file, from its text to a [`RulesFile`]: its backends, each `[[autoscaler]]` read
//! and compiled, and what only the whole file shows (names used twice, two autoscalers on one
//! target, a shadow rule without its active one). Also a JSON rule for `decide`, which takes
//! the same steps.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use watermarkd_engine::Rule;

use super::compile::{compile, Require};
use super::document::{read_autoscaler, Source};
use super::problem::{Problem, RulesError, Sink, TableScope};
use super::reader::Table;
use super::{backend, tree, Autoscaler, Backend, ObjectIdentity, RulesFile, TargetRef};

const TOP_LEVEL_KEYS: &[&str] = &["backend", "autoscaler"];

/// Parses and validates a rules file. `origin` names it in problems (usually its path).
pub fn parse_rules(text: &str, origin: &str) -> Result<RulesFile, RulesError> {
    let fail = |problems| RulesError { origin: origin.to_string(), problems };
    let root = tree::from_toml(text).map_err(|err| {
        fail(vec![Problem {
            line: err.line,
            autoscaler: None,
            field: String::new(),
            message: format!("invalid TOML: {}", err.message),
        }])
    })?;
    let mut sink = Sink::default();
    let Some(mut table) = Table::new(&root, TableScope::default(), &mut sink) else {
        return Err(fail(sink.into_sorted()));
    };
    let declared = backend::read_backends(&mut table, &mut sink);
    let autoscalers = read_autoscalers(&mut table, &declared, &mut sink);
    table.finish(&mut sink, TOP_LEVEL_KEYS);
    if sink.has_problems() {
        return Err(fail(sink.into_sorted()));
    }
    let backends = declared.into_iter().filter_map(|(name, backend)| Some((name, backend?))).collect();
    let scaled = autoscalers.iter().filter(|a| !a.shadow).map(|a| (a.target.clone(), Arc::clone(&a.name))).collect();
    Ok(RulesFile { backends, autoscalers, scaled })
}

fn read_autoscalers(
    root: &mut Table<'_>,
    backends: &BTreeMap<String, Option<Backend>>,
    sink: &mut Sink,
) -> Vec<Autoscaler> {
    let Some(nodes) = root.list(sink, "autoscaler", "[[autoscaler]] sections") else { return Vec::new() };
    let mut first_line_of: HashMap<String, Option<usize>> = HashMap::new();
    let mut autoscalers = Vec::new();
    let mut shadow_lines = Vec::new();
    // Every entry's target, also of entries with other problems, so that one `check` lists
    // every conflict too.
    let mut claims = Vec::new();
    for (index, node) in nodes.iter().enumerate() {
        // Within one autoscaler, its problems are kept apart to know whether it has any.
        let mut own = Sink::default();
        let Some(draft) = read_autoscaler(node, Source::File { index }, &mut own) else {
            sink.problems.append(&mut own.problems);
            continue;
        };
        let compiled = compile(&draft, Require::Everything { backends: Some(backends) }, &mut own);
        sink.problems.append(&mut own.problems);
        let Some(name) = compiled.name.clone() else { continue };
        let name_line = draft.name.origin.line;
        if let Some(first) = first_line_of.get(&name) {
            let on_line = first.map(|l| format!(" on line {l}")).unwrap_or_default();
            sink.problems.push(Problem {
                line: name_line,
                autoscaler: Some(name),
                field: "name".into(),
                message: format!("is already used by the autoscaler{on_line}; autoscaler names must be unique"),
            });
            continue;
        }
        first_line_of.insert(name.clone(), name_line);
        let shadow = draft.shadow.value().copied().unwrap_or(false);
        if let Some(target) = compiled.target.as_ref().filter(|_| !shadow) {
            claims.push(Claim { name: name.clone(), target: target.clone(), line: draft.target.origin.line });
        }
        if let Some(autoscaler) = compiled.into_autoscaler(&draft) {
            autoscalers.push(autoscaler);
            shadow_lines.push(draft.shadow.origin.line);
        }
    }
    check_target_conflicts(&claims, sink);
    check_shadow_pairs(&autoscalers, &shadow_lines, sink);
    autoscalers
}

/// Two active autoscalers on one object would fight over its replicas, and, since each keeps
/// its state on the target, overwrite each other's, so that after a restart neither has its
/// forbidden windows: the second is refused, naming the first. Shadow rules never write and may
/// share a target.
fn check_target_conflicts(claims: &[Claim], sink: &mut Sink) {
    let mut first_on: HashMap<ObjectIdentity<'_>, &Claim> = HashMap::new();
    for claim in claims {
        let Some(first) = first_on.get(&claim.target.identity()) else {
            first_on.insert(claim.target.identity(), claim);
            continue;
        };
        let target = &claim.target;
        let on_line = first.line.map(|l| format!(" on line {l}")).unwrap_or_default();
        sink.problems.push(Problem {
            line: claim.line,
            autoscaler: Some(claim.name.clone()),
            field: "target".into(),
            message: format!(
                "names the same {} {}/{} as the autoscaler {:?}{on_line}: two active autoscalers on one target fight \
                 over its replicas and overwrite each other's saved state (remove one, or make one a shadow rule \
                 with shadow = true)",
                target.kind, target.namespace, target.name, first.name
            ),
        });
    }
}

/// An active autoscaler's target, where the file names it.
struct Claim {
    name: String,
    target: TargetRef,
    line: Option<usize>,
}

/// Every shadow rule needs exactly one active autoscaler on its target, the one it is compared
/// with.
fn check_shadow_pairs(autoscalers: &[Autoscaler], shadow_lines: &[Option<usize>], sink: &mut Sink) {
    let mut active_on: HashMap<&TargetRef, Vec<&Autoscaler>> = HashMap::new();
    for active in autoscalers.iter().filter(|a| !a.shadow) {
        active_on.entry(&active.target).or_default().push(active);
    }
    for (shadow, line) in autoscalers.iter().zip(shadow_lines).filter(|(a, _)| a.shadow) {
        let target = &shadow.target;
        let message = match active_on.get(target).map_or(&[][..], Vec::as_slice) {
            // It is decided with the active rule, so at its pace: another interval would be
            // silently ignored.
            [active] if shadow.interval_set.is_some_and(|i| Some(i) != active.interval_set) => {
                sink.problems.push(Problem {
                    line: *line,
                    autoscaler: Some(shadow.name.to_string()),
                    field: "interval".into(),
                    message: format!(
                        "cannot differ from the active autoscaler {:?}'s: a shadow rule is decided at each of its \
                         evaluations (remove interval, or give both the same)",
                        active.name
                    ),
                });
                continue;
            }
            [_] => continue,
            [] => format!(
                "is true, but no active autoscaler in this file targets {} {}/{}: a shadow rule runs beside the \
                 active rule on its target and is compared with it",
                target.kind, target.namespace, target.name
            ),
            several => format!(
                "is true, and several active autoscalers target {} {}/{} ({}): a shadow rule is compared with the \
                 one active rule on its target",
                target.kind,
                target.namespace,
                target.name,
                several.iter().map(|a| &*a.name).collect::<Vec<_>>().join(", ")
            ),
        };
        sink.problems.push(Problem {
            line: *line,
            autoscaler: Some(shadow.name.to_string()),
            field: "shadow".into(),
            message,
        });
    }
}

/// Reads and parses a rules file; a file that cannot be read is a `RulesError` too.
pub fn load_rules(path: &Path) -> Result<RulesFile, RulesError> {
    let origin = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => parse_rules(&text, &origin),
        Err(err) => Err(RulesError {
            origin,
            problems: vec![Problem {
                line: None,
                autoscaler: None,
                field: String::new(),
                message: format!("cannot read the rules file: {err}"),
            }],
        }),
    }
}

/// For the `decide` command: one autoscaler entry given as JSON (same field names as a
/// `[[autoscaler]]` TOML entry) -> engine Rule. Here `name`, `target`, `interval`, and each
/// metric's `backend`/`query` are optional (checked when given); each metric needs a `name` or
/// a `query`, which names its reading.
pub fn rule_from_json(value: &serde_json::Value) -> Result<Rule, Vec<Problem>> {
    let node = tree::from_json(value);
    let mut sink = Sink::default();
    let compiled =
        read_autoscaler(&node, Source::Json, &mut sink).map(|draft| compile(&draft, Require::Rule, &mut sink));
    match compiled.and_then(|compiled| compiled.rule) {
        Some(rule) if !sink.has_problems() => Ok(rule),
        _ if sink.has_problems() => Err(sink.into_sorted()),
        // Not reachable (no rule means a problem was reported), but never return Err(empty).
        _ => Err(vec![Problem {
            line: None,
            autoscaler: None,
            field: String::new(),
            message: "the rule is invalid".into(),
        }]),
    }
}
