//! Folding: queries that differ only in the value of one tag (or two), asked as one grouped
//! query whose groups answer them each.
//!
//! `avg:nginx.net.request_per_s{kube_namespace:prod,kube_deployment:web-1}` for 300
//! deployments is one question asked 300 times. Datadog answers
//! `avg:nginx.net.request_per_s{kube_namespace:prod AND kube_deployment IN (web-1, web-2, ...)} by {kube_deployment}`
//! with one series per deployment, each space-aggregated over exactly the series the member's
//! own scope selects. So the requests a cycle needs grow with the number of query shapes, not
//! with the number of autoscalers.
//!
//! Only what is exactly equal folds. A query folds when it is one metric (`avg`, `sum`, `min` or
//! `max`) with one scope of plain `key:value` conjuncts (joined by `,` or by `AND`, never
//! mixed), no grouping, and around it only functions that act on each series alone (`abs`,
//! `per_second`, `.rollup()`, `.fill()`, `.as_count()`, arithmetic with a number, ...). Members
//! fold together when everything but the value of the folding key is the same text: metric,
//! aggregator, the whole function chain, the other conjuncts. Never folded (sent as written,
//! still batched): functions across series (`top`, `outliers`, `count_nonzero`, anything not on
//! the list), arithmetic between metrics, an existing `by`, wildcards, `!`/`NOT`/`OR`/`IN` in a
//! scope, quotes, a folding value with upper-case letters (Datadog stores tags in lower case,
//! and the groups are matched by their text), a query text that appears once in its shape.
//! The grouped query is written wholly in Datadog's functional syntax (`AND`, `IN`), since
//! symbolic `,` and functional operators cannot be mixed in one scope.
//!
//! Pure: query texts in, units out. Matching the answer's groups back to members is `parse`'s.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::hash::{Hash, Hasher};

use super::batch::encoded_len;

/// Functions that act on each series on its own: the same on a member's one series as on its
/// group in a grouped answer. Called as `f(...)` or as `.f(...)` on a query.
const PER_SERIES_FUNCTIONS: &[&str] = &[
    "abs",
    "as_count",
    "as_rate",
    "clamp_max",
    "clamp_min",
    "cumsum",
    "cutoff_max",
    "cutoff_min",
    "day_before",
    "default_zero",
    "derivative",
    "diff",
    "dt",
    "ewma_3",
    "ewma_5",
    "ewma_7",
    "ewma_10",
    "ewma_20",
    "fill",
    "hour_before",
    "integral",
    "log10",
    "log2",
    "median_3",
    "median_5",
    "median_7",
    "median_9",
    "monotonic_diff",
    "month_before",
    "per_hour",
    "per_minute",
    "per_second",
    "rollup",
    "timeshift",
    "week_before",
];

/// Bare words allowed as function arguments (`.rollup(avg, 30)`, `.fill(zero)`).
const ARGUMENT_WORDS: &[&str] = &["avg", "sum", "min", "max", "count", "last", "null", "zero", "linear"];

/// Space aggregators whose value over a group equals their value over the member's scope.
const AGGREGATORS: &[&str] = &["avg", "sum", "min", "max"];

/// One grouped query and the members it answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoldedQuery {
    /// The grouped query as sent.
    pub text: String,
    /// The tag keys it groups by (one or two).
    pub keys: Vec<String>,
    /// Each member: its index in the queries given to [`fold`] and its values of `keys`.
    pub members: Vec<(usize, Vec<String>)>,
    /// Identifies the metric and function chain, for remembering that Datadog refused it.
    pub shape: u64,
}

/// What one text of the plan stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unit {
    /// A query sent as written (index into the queries given).
    Alone(usize),
    /// Boxed: at 10,000 queries most units are `Alone`, and inline every one would take the
    /// 80 bytes of a folded query.
    Folded(Box<FoldedQuery>),
}

/// A query taken apart for folding: the text before its scope's `{`, the text after its `}`,
/// and the scope's conjuncts.
#[derive(Debug, PartialEq, Eq)]
struct Parsed<'a> {
    head: &'a str,
    tail: &'a str,
    conjuncts: Vec<(&'a str, &'a str)>,
}

/// Why a query cannot fold (for tests and the plan's explanation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NotFoldable {
    /// Not exactly one `{...}` scope: arithmetic between metrics, or already grouped.
    Scopes,
    /// Quotes, or a character the recogniser does not know, outside the scope.
    Syntax,
    /// A function that is not known to act on each series alone.
    Function,
    /// Not `avg:`, `sum:`, `min:` or `max:` before the metric name.
    Aggregator,
    /// A conjunct that is not a plain `key:value` (wildcard, `!`, `NOT`, `OR`, `IN`, ...).
    Scope,
}

/// Takes `query` apart, or says why it cannot fold.
fn parse(query: &str) -> Result<Parsed<'_>, NotFoldable> {
    if query.matches('{').count() != 1 || query.matches('}').count() != 1 {
        return Err(NotFoldable::Scopes);
    }
    let (Some(open), Some(close)) = (query.find('{'), query.find('}')) else { return Err(NotFoldable::Scopes) };
    if close < open {
        return Err(NotFoldable::Scopes);
    }
    let (head, body, tail) = (&query[..open], &query[open + 1..close], &query[close + 1..]);
    // The metric: after the last `(` of the head (or from its start), `aggregator:name`.
    let metric_start = head.rfind('(').map_or(0, |at| at + 1);
    let (wrapping, metric) = head.split_at(metric_start);
    let Some((aggregator, name)) = metric.trim().split_once(':') else { return Err(NotFoldable::Aggregator) };
    if !AGGREGATORS.contains(&aggregator) {
        return Err(NotFoldable::Aggregator);
    }
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.') {
        return Err(NotFoldable::Syntax);
    }
    check_outside(wrapping)?;
    check_outside(tail)?;
    let conjuncts = conjuncts(body)?;
    Ok(Parsed { head, tail, conjuncts })
}

/// Checks the text around the metric: only per-series functions, argument words, numbers,
/// arithmetic and brackets.
fn check_outside(text: &str) -> Result<(), NotFoldable> {
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b.is_ascii_alphabetic() || b == b'_' {
            let start = i;
            while bytes.get(i).is_some_and(|&c| c.is_ascii_alphanumeric() || c == b'_') {
                i += 1;
            }
            let word = &text[start..i];
            let rest = text[i..].trim_start();
            let called = rest.starts_with('(');
            let allowed = if called { PER_SERIES_FUNCTIONS.contains(&word) } else { ARGUMENT_WORDS.contains(&word) };
            if !allowed {
                return Err(NotFoldable::Function);
            }
            continue;
        }
        if !(b.is_ascii_digit() || b" \t().,+-*/".contains(&b)) {
            return Err(NotFoldable::Syntax);
        }
        i += 1;
    }
    Ok(())
}

/// The scope's conjuncts: `a:b,c:d` or `a:b AND c:d`, each a plain `key:value`.
fn conjuncts(body: &str) -> Result<Vec<(&str, &str)>, NotFoldable> {
    let body = body.trim();
    let parts: Vec<&str> = if body.contains(',') {
        if body.contains(' ') {
            return Err(NotFoldable::Scope);
        }
        body.split(',').collect()
    } else {
        body.split(" AND ").map(str::trim).collect()
    };
    parts
        .into_iter()
        .map(|part| {
            let (key, value) = part.split_once(':').ok_or(NotFoldable::Scope)?;
            let plain = |text: &str, colon: bool| {
                !text.is_empty()
                    && text.bytes().all(|b| {
                        b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'/') || (colon && b == b':')
                    })
            };
            if plain(key, false) && plain(value, true) {
                Ok((key, value))
            } else {
                Err(NotFoldable::Scope)
            }
        })
        .collect()
}

/// Whether `query` could fold with others of its shape (none of them refused).
#[cfg(test)]
fn foldable(query: &str) -> Result<(), NotFoldable> {
    parse(query).map(|_| ())
}

/// A value the grouped query can carry in an `IN` list and the answer's tags give back as is.
fn key_value_ok(value: &str) -> bool {
    !value.contains(':') && !value.bytes().any(|b| b.is_ascii_uppercase())
}

/// The shape of a query for one choice of folding keys: everything but the keys' values.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Shape<'a> {
    head: &'a str,
    tail: &'a str,
    /// The other conjuncts, sorted, as `key:value`.
    rest: Vec<(&'a str, &'a str)>,
    keys: Vec<&'a str>,
}

impl Shape<'_> {
    /// A hash of the whole shape, to count queries sharing it without keeping it.
    fn fingerprint(&self) -> u64 {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        self.hash(&mut hasher);
        hasher.finish()
    }

    /// What a refusal is remembered by: the metric and its whole function chain, whatever the
    /// scope and the keys, so that a text Datadog cannot run is not tried again by other keys.
    fn id(&self) -> u64 {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (self.head, self.tail).hash(&mut hasher);
        hasher.finish()
    }
}

/// A member of a shape: its index in the queries given and its values of the shape's keys.
type Member<'a> = (usize, Vec<&'a str>);

/// Each way `parsed` could fold: by each key that appears once, and by each pair of them.
fn shapes<'a>(parsed: &Parsed<'a>) -> Vec<(Shape<'a>, Vec<&'a str>)> {
    let mut count: HashMap<&str, usize> = HashMap::new();
    for (key, _) in &parsed.conjuncts {
        *count.entry(key).or_default() += 1;
    }
    let candidates: BTreeSet<&str> = parsed
        .conjuncts
        .iter()
        .filter(|(key, value)| count.get(key) == Some(&1) && key_value_ok(value))
        .map(|(key, _)| *key)
        .collect();
    let candidates: Vec<&str> = candidates.into_iter().collect();
    let mut choices: Vec<Vec<&str>> = candidates.iter().map(|k| vec![*k]).collect();
    let mut rest = candidates.as_slice();
    while let Some((a, after)) = rest.split_first() {
        choices.extend(after.iter().map(|b| vec![*a, *b]));
        rest = after;
    }
    choices
        .into_iter()
        .map(|keys| {
            let mut rest: Vec<(&str, &str)> =
                parsed.conjuncts.iter().filter(|(key, _)| !keys.contains(key)).copied().collect();
            rest.sort_unstable();
            let values = keys
                .iter()
                .map(|k| parsed.conjuncts.iter().find(|(key, _)| key == k).map_or("", |(_, v)| *v))
                .collect();
            (Shape { head: parsed.head, tail: parsed.tail, rest, keys }, values)
        })
        .collect()
}

/// Plans `queries` (distinct texts): which fold into grouped queries, which go alone. A grouped
/// query's encoded text stays under `max_encoded` characters (its `IN` lists are split across
/// several grouped queries when needed). `refused(shape)`: Datadog rejected this shape lately.
/// Units come in the order of their first member, so an order of priority in `queries` is kept.
pub fn fold(queries: &[&str], max_encoded: usize, refused: &dyn Fn(u64) -> bool) -> Vec<Unit> {
    let parsed: Vec<Option<Parsed<'_>>> = queries.iter().map(|q| parse(q).ok()).collect();
    // How many queries share each shape, counted by the shape's hash first: most ways a query
    // could fold are its own alone (by a key whose other conjuncts nobody else has), and
    // 10,000 queries should not keep tens of thousands of shapes for that.
    let mut sharing: HashMap<u64, usize> = HashMap::new();
    for p in parsed.iter().flatten() {
        for (shape, _) in shapes(p) {
            *sharing.entry(shape.fingerprint()).or_default() += 1;
        }
    }
    // The shared ones, with their members.
    let mut by_shape: HashMap<Shape<'_>, Vec<Member<'_>>> = HashMap::new();
    for (q, p) in parsed.iter().enumerate() {
        let Some(p) = p else { continue };
        for (shape, values) in shapes(p) {
            if sharing.get(&shape.fingerprint()).is_some_and(|n| *n >= 2) && !refused(shape.id()) {
                by_shape.entry(shape).or_default().push((q, values));
            }
        }
    }
    // Greedy: each query takes the shape shared by the most queries (fewer keys, then the
    // shape's order, on a tie), so the largest groups form first.
    let mut ranked: Vec<(Shape<'_>, Vec<Member<'_>>)> = by_shape.into_iter().filter(|(_, m)| m.len() >= 2).collect();
    ranked.sort_by(|a, b| {
        b.1.len().cmp(&a.1.len()).then(a.0.keys.len().cmp(&b.0.keys.len())).then_with(|| a.0.cmp(&b.0))
    });
    let mut chosen: Vec<Option<usize>> = vec![None; queries.len()];
    let mut groups: Vec<(Shape<'_>, Vec<Member<'_>>)> = Vec::new();
    for (shape, members) in ranked {
        // Two members with the same values would be the same query; keep distinct ones.
        let mut seen: HashSet<Vec<&str>> = HashSet::new();
        let members: Vec<Member<'_>> =
            members.into_iter().filter(|(q, v)| chosen.get(*q) == Some(&None) && seen.insert(v.clone())).collect();
        if members.len() < 2 {
            continue;
        }
        let group = groups.len();
        for (q, _) in &members {
            if let Some(slot) = chosen.get_mut(*q) {
                *slot = Some(group);
            }
        }
        groups.push((shape, members));
    }
    let mut folded: Vec<Vec<FoldedQuery>> =
        groups.iter().map(|(shape, members)| split(shape, members, max_encoded)).collect();
    // Units in the order of their first member; a group split in chunks keeps its chunks together.
    let mut units = Vec::new();
    for (q, group) in chosen.iter().enumerate() {
        match group {
            None => units.push(Unit::Alone(q)),
            Some(g) => {
                if let Some(chunks) = folded.get_mut(*g) {
                    for chunk in chunks.drain(..) {
                        if chunk.members.len() < 2 {
                            units.extend(chunk.members.iter().map(|(m, _)| Unit::Alone(*m)));
                        } else {
                            units.push(Unit::Folded(Box::new(chunk)));
                        }
                    }
                }
            }
        }
    }
    units
}

/// The grouped text for `members` of `shape`: the other conjuncts, then an `IN` list per key,
/// all joined by `AND`, grouped `by` the keys.
fn grouped_text(shape: &Shape<'_>, values: &[BTreeSet<&str>]) -> String {
    let mut scope: Vec<String> = shape.rest.iter().map(|(k, v)| format!("{k}:{v}")).collect();
    for (key, values) in shape.keys.iter().zip(values) {
        scope.push(format!("{key} IN ({})", values.iter().copied().collect::<Vec<_>>().join(", ")));
    }
    format!("{}{{{}}} by {{{}}}{}", shape.head, scope.join(" AND "), shape.keys.join(","), shape.tail)
}

/// Splits `members` of `shape` into grouped queries whose encoded text stays under
/// `max_encoded`, adding members in order while the text fits. The length is kept as members
/// are added (each new value adds its own encoded length and a separator), not re-measured.
fn split(shape: &Shape<'_>, members: &[Member<'_>], max_encoded: usize) -> Vec<FoldedQuery> {
    /// `, ` between two values of an `IN` list, encoded.
    const SEPARATOR: usize = 4;
    let id = shape.id();
    let finish = |chunk: &[Member<'_>], values: &[BTreeSet<&str>]| FoldedQuery {
        text: grouped_text(shape, values),
        keys: shape.keys.iter().map(|k| k.to_string()).collect(),
        members: chunk.iter().map(|(q, v)| (*q, v.iter().map(|s| s.to_string()).collect())).collect(),
        shape: id,
    };
    let empty = || vec![BTreeSet::new(); shape.keys.len()];
    let base = encoded_len(&grouped_text(shape, &empty()));
    let mut out = Vec::new();
    let mut chunk: Vec<Member<'_>> = Vec::new();
    let mut values = empty();
    let mut length = base;
    for member in members {
        let added = |values: &[BTreeSet<&str>]| -> usize {
            values
                .iter()
                .zip(&member.1)
                .filter(|(set, value)| !set.contains(*value))
                .map(|(set, value)| encoded_len(value) + if set.is_empty() { 0 } else { SEPARATOR })
                .sum()
        };
        if !chunk.is_empty() && length + added(&values) >= max_encoded {
            out.push(finish(&chunk, &values));
            chunk.clear();
            values = empty();
            length = base;
        }
        length += added(&values);
        for (set, value) in values.iter_mut().zip(&member.1) {
            set.insert(*value);
        }
        chunk.push(member.clone());
    }
    if !chunk.is_empty() {
        out.push(finish(&chunk, &values));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn never(_: u64) -> bool {
        false
    }

    fn folded(units: &[Unit]) -> Vec<&FoldedQuery> {
        units
            .iter()
            .filter_map(|u| match u {
                Unit::Folded(f) => Some(&**f),
                Unit::Alone(_) => None,
            })
            .collect()
    }

    #[test]
    fn per_deployment_queries_fold_into_one_grouped_query_in_functional_syntax() {
        let queries: Vec<String> = (1..=3)
            .map(|i| format!("avg:nginx.net.request_per_s{{kube_namespace:prod,kube_deployment:web-{i}}}"))
            .collect();
        let refs: Vec<&str> = queries.iter().map(String::as_str).collect();
        let units = fold(&refs, 7_000, &never);
        assert_eq!(units.len(), 1, "{units:?}");
        let f = folded(&units)[0];
        assert_eq!(
            f.text,
            "avg:nginx.net.request_per_s{kube_namespace:prod AND kube_deployment IN (web-1, web-2, web-3)} by {kube_deployment}"
        );
        assert_eq!(f.keys, ["kube_deployment"]);
        assert_eq!(
            f.members,
            vec![(0, vec!["web-1".to_string()]), (1, vec!["web-2".to_string()]), (2, vec!["web-3".to_string()])]
        );
    }

    #[test]
    fn the_function_chain_and_the_other_conjuncts_must_be_the_same() {
        let refs = [
            "per_second(sum:req{app:a,env:prod}.as_count()).rollup(avg, 30)",
            "per_second(sum:req{env:prod,app:b}.as_count()).rollup(avg, 30)",
            // Another chain: its own shape.
            "per_second(sum:req{app:c,env:prod}.as_count()).rollup(max, 30)",
            // Another aggregator.
            "avg:req{app:d,env:prod}.as_count()",
        ];
        let units = fold(&refs, 7_000, &never);
        let f = folded(&units);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].text, "per_second(sum:req{env:prod AND app IN (a, b)} by {app}.as_count()).rollup(avg, 30)");
        assert!(units.contains(&Unit::Alone(2)) && units.contains(&Unit::Alone(3)), "{units:?}");
    }

    #[test]
    fn two_varying_keys_group_by_both() {
        let refs = ["max:lag{ns:a,app:x}", "max:lag{ns:b,app:y}", "max:lag{ns:c,app:z}"];
        let units = fold(&refs, 7_000, &never);
        let f = folded(&units);
        assert_eq!(f.len(), 1, "{units:?}");
        assert_eq!(f[0].text, "max:lag{app IN (x, y, z) AND ns IN (a, b, c)} by {app,ns}");
        assert_eq!(f[0].members[1], (1, vec!["y".to_string(), "b".to_string()]));
    }

    #[test]
    fn what_would_compute_something_else_never_folds() {
        for query in [
            "top(avg:m{app:a}, 10, 'mean', 'desc')",
            "outliers(avg:m{app:a}, 'DBSCAN', 2)",
            "count_nonzero(avg:m{app:a})",
            "avg:m{app:a} / avg:n{app:a}",
            "avg:m{env:prod} by {app}",
            "avg:m{app:web-*}",
            "avg:m{!app:a,env:prod}",
            "avg:m{app:a OR app:b}",
            "avg:m{env:prod AND NOT app:a}",
            "avg:m{env:prod AND app IN (a, b)}",
            "avg:m{app:a,env:prod AND x:y}",
            "count:m{app:a}",
            "avg:m{*}",
            "anomalies(avg:m{app:a}, 'basic', 2)",
        ] {
            assert!(foldable(query).is_err(), "{query} must not fold");
            let other = query.replacen("app:a", "app:b", 1).replacen("app:web", "app:api", 1);
            let units = fold(&[query, &other], 7_000, &never);
            assert_eq!(units, vec![Unit::Alone(0), Unit::Alone(1)], "{query}");
        }
        for query in ["avg:m{app:a}", "abs(avg:m{app:a} * 2 - 1).fill(zero, 60)", "timeshift(sum:m{app:a}, -3600)"] {
            assert_eq!(foldable(query), Ok(()), "{query}");
        }
    }

    #[test]
    fn values_that_the_answer_could_not_give_back_as_written_are_not_folding_keys() {
        // Upper case: Datadog's tags are lower case. A colon: ambiguous in `key:value` tags.
        let units = fold(&["avg:m{app:Web}", "avg:m{app:Api}"], 7_000, &never);
        assert_eq!(units, vec![Unit::Alone(0), Unit::Alone(1)]);
        let units = fold(&["avg:m{app:a,img:r:1}", "avg:m{app:b,img:r:1}"], 7_000, &never);
        assert_eq!(folded(&units)[0].text, "avg:m{img:r:1 AND app IN (a, b)} by {app}");
    }

    #[test]
    fn a_refused_shape_goes_unfolded() {
        let refs = ["avg:m{app:a,env:p}", "avg:m{app:b,env:p}"];
        let shape = folded(&fold(&refs, 7_000, &never))[0].shape;
        let units = fold(&refs, 7_000, &|s| s == shape);
        assert_eq!(units, vec![Unit::Alone(0), Unit::Alone(1)]);
    }

    #[test]
    fn long_in_lists_are_split_under_the_bound_and_every_member_is_kept_once() {
        let queries: Vec<String> = (0..500).map(|i| format!("avg:m{{env:prod,app:service-number-{i:04}}}")).collect();
        let refs: Vec<&str> = queries.iter().map(String::as_str).collect();
        let units = fold(&refs, 2_000, &never);
        let f = folded(&units);
        assert!(f.len() > 1, "500 members do not fit in 2,000 characters");
        assert!(f.iter().all(|g| encoded_len(&g.text) < 2_000));
        let mut members: Vec<usize> = f.iter().flat_map(|g| g.members.iter().map(|(q, _)| *q)).collect();
        members.sort_unstable();
        assert_eq!(members, (0..500).collect::<Vec<_>>());
        for g in &f {
            for (q, values) in &g.members {
                assert!(g.text.contains(&values[0]), "{} lacks member {q}", g.text);
            }
        }
    }

    #[test]
    fn the_kept_length_is_the_encoded_length_of_the_text() {
        let queries: Vec<String> = (0..300).map(|i| format!("avg:m{{env:prod,app:web-{i},ns:n{}}}", i % 7)).collect();
        let refs: Vec<&str> = queries.iter().map(String::as_str).collect();
        for bound in [400, 1_000, 3_000] {
            let units = fold(&refs, bound, &never);
            let f = folded(&units);
            assert!(f.len() > 1, "{bound}");
            for g in &f {
                assert!(encoded_len(&g.text) < bound, "{bound}: {}", g.text);
            }
            // Filled up to the bound: one more member would not have fitted.
            let lengths: Vec<usize> = f.iter().map(|g| encoded_len(&g.text)).collect();
            assert!(lengths.iter().take(lengths.len() - 1).all(|l| *l + 30 >= bound), "{bound}: {lengths:?}");
        }
    }

    #[test]
    fn every_query_is_in_exactly_one_unit() {
        let mut queries = Vec::new();
        for shape in 0..7 {
            for member in 0..(shape * 3 % 5) {
                queries.push(format!("sum:metric.{shape}{{team:t{},app:a{member}}}.rollup(avg, 30)", member % 2));
            }
            queries.push(format!("top(avg:metric.{shape}{{app:x}}, 5, 'mean', 'desc')"));
        }
        let refs: Vec<&str> = queries.iter().map(String::as_str).collect();
        let units = fold(&refs, 7_000, &never);
        let mut seen: Vec<usize> = units
            .iter()
            .flat_map(|u| match u {
                Unit::Alone(q) => vec![*q],
                Unit::Folded(f) => f.members.iter().map(|(q, _)| *q).collect(),
            })
            .collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..queries.len()).collect::<Vec<_>>());
    }
}
