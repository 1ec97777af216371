//! The time of the data behind a value.
//!
//! An instant query's answer is dated at the evaluation time, however old the samples it was
//! computed from. Prometheus answers a series' last sample for its lookback (`--query.lookback-delta`,
//! 5 minutes by default) after the series stopped getting new ones, whenever no staleness marker
//! ends it: samples that came by remote write (Mimir, Cortex, Thanos Receive), federation, or
//! with their own timestamps, and a Prometheus that restarted. From the answer alone a frozen
//! value looks as fresh as a live one.
//!
//! `timestamp()` of a series selector is the time of each selected sample, not the evaluation
//! time. So, for a query that is a series selector with a metric name, or one aggregation
//! (`sum`, `min`, `max`, `avg`, `count`, with or without `by`/`without`) of one, the same
//! request also asks for the oldest of those times, as one more series of the answer:
//!
//! ```text
//! (QUERY) or label_replace(min(timestamp(SELECTOR)), "watermarkd_sample", "time", "", "")
//! ```
//!
//! The added series differs from every series of `QUERY` by its label, so `or` keeps both. The
//! metric name must be fixed: `timestamp()` drops it, and series of two names with the same
//! other labels would then collide ("vector cannot contain metrics with the same labelset"),
//! failing the whole query. Any other query (functions such as `rate()`, range selectors,
//! arithmetic, `offset` and `@`, more than one selector, `__name__` matchers) is sent as
//! written, and its value stays dated at the evaluation time: what it computed from old samples
//! cannot be told from the answer.
//!
//! A folded query (see `fold`) of such a shape asks the same per group,
//! `min by (K) (timestamp(SELECTOR'))`, so that each member gets the time of its own samples;
//! a folded query of any other shape is sent undated, as its members would be.
//!
//! Pure text functions: no PromQL parser, only a recogniser for these shapes. What it does not
//! recognise is sent unchanged, so a mistake costs the data time, never the query.

/// The label that marks the added series, and its value.
pub(super) const LABEL: &str = "watermarkd_sample";
pub(super) const TIME: &str = "time";

/// Aggregations whose value comes from the samples of the one selector they aggregate.
const AGGREGATIONS: &[&str] = &["sum", "min", "max", "avg", "count"];

/// Words that cannot be a metric name standing alone: operators, keywords, and the number
/// literals `Inf` and `NaN` (a scalar, which `label_replace` would refuse).
pub(super) const NOT_NAMES: &[&str] = &[
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "offset",
    "bool",
    "atan2",
    "inf",
    "nan",
];

/// The query to send for `query`: with its data time asked for when its shape allows it (see
/// the module comment), `None` when it goes as written.
pub(super) fn dated(query: &str) -> Option<String> {
    let selector = selector_of(query)?;
    Some(format!("({query}) or label_replace(min(timestamp({selector})), \"{LABEL}\", \"{TIME}\", \"\", \"\")"))
}

/// `dated` for a folded query (see `fold`): `query` groups by `label`, and `selector` is its
/// one selector. The data time is asked for per group, labelled with the group's value of
/// `label` as the query's own series are, so that each member gets the time of its own samples:
/// what `min(timestamp(...))` of its own selector would have said.
pub(super) fn dated_by(query: &str, selector: &str, label: &str) -> String {
    format!("({query}) or label_replace(min by ({label}) (timestamp({selector})), \"{LABEL}\", \"{TIME}\", \"\", \"\")")
}

/// The series selector whose samples `query`'s value comes from: the query itself, or what its
/// one aggregation aggregates.
fn selector_of(query: &str) -> Option<&str> {
    if selector(query).is_some_and(|rest| rest.trim().is_empty()) {
        return Some(query.trim());
    }
    let (op, rest) = identifier(query.trim_start())?;
    if !AGGREGATIONS.iter().any(|a| a.eq_ignore_ascii_case(op)) {
        return None;
    }
    let rest = grouping(rest)?;
    let inner = rest.trim_start().strip_prefix('(')?;
    let after = selector(inner)?;
    let chosen = inner.get(..inner.len() - after.len())?.trim();
    let rest = grouping(after.trim_start().strip_prefix(')')?)?;
    rest.trim().is_empty().then_some(chosen)
}

/// A series selector with a metric name at the start of `text` (`name` or `name{...}`, with no
/// `__name__` matcher and no modifiers): what follows it.
fn selector(text: &str) -> Option<&str> {
    let (name, rest) = identifier(text.trim_start())?;
    if NOT_NAMES.iter().any(|w| w.eq_ignore_ascii_case(name)) {
        return None;
    }
    let after_space = rest.trim_start();
    if !after_space.starts_with('{') {
        return Some(rest);
    }
    let after = matchers(after_space)?;
    // Anywhere in the braces, quoted or not: a name that could vary is not dated.
    let braces = after_space.get(..after_space.len() - after.len())?;
    (!braces.contains("__name__")).then_some(after)
}

/// `[A-Za-z_:][A-Za-z0-9_:]*` at the start of `text`, and what follows it.
fn identifier(text: &str) -> Option<(&str, &str)> {
    let first = text.chars().next()?;
    if !(first.is_ascii_alphabetic() || first == '_' || first == ':') {
        return None;
    }
    let end = text.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')).unwrap_or(text.len());
    Some((text.get(..end)?, text.get(end..)?))
}

/// `{...}` at the start of `text`: label matchers, with quoted values that may hold anything.
/// Outside quotes only what matchers are made of; what follows the closing brace.
fn matchers(text: &str) -> Option<&str> {
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in text.char_indices().skip(1) {
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if c == '\\' && q != '`' {
                    escaped = true;
                } else if c == q {
                    quote = None;
                }
            }
            None => match c {
                '}' => return text.get(i + 1..),
                '"' | '\'' | '`' => quote = Some(c),
                c if c.is_ascii_alphanumeric() || c.is_whitespace() || "_:,=!~".contains(c) => {}
                _ => return None,
            },
        }
    }
    None
}

/// An optional `by (...)` or `without (...)` at the start of `text`: what follows it.
fn grouping(text: &str) -> Option<&str> {
    let trimmed = text.trim_start();
    let Some((word, rest)) = identifier(trimmed) else { return Some(text) };
    if !(word.eq_ignore_ascii_case("by") || word.eq_ignore_ascii_case("without")) {
        return Some(text);
    }
    let labels = rest.trim_start().strip_prefix('(')?;
    let end = labels.find(')')?;
    let list = labels.get(..end)?;
    if !list.chars().all(|c| c.is_ascii_alphanumeric() || c.is_whitespace() || c == '_' || c == ',') {
        return None;
    }
    labels.get(end + 1..)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_selectors_and_one_aggregation_of_one_are_dated() {
        for (query, selector) in [
            ("up", "up"),
            ("  queue_depth{app=\"web\"} ", "queue_depth{app=\"web\"}"),
            ("m{job!='x', b=~\"a|b\"}", "m{job!='x', b=~\"a|b\"}"),
            ("name:recorded:rule { a = \"}) or vector(1)\" , }", "name:recorded:rule { a = \"}) or vector(1)\" , }"),
            ("m{a=\"say \\\"hi\\\"\"}", "m{a=\"say \\\"hi\\\"\"}"),
            ("sum(queue_depth{app=\"web\"})", "queue_depth{app=\"web\"}"),
            ("max by (pod) (load)", "load"),
            ("AVG( load{a=`)`} ) without (instance, job)", "load{a=`)`}"),
            ("count(up)", "up"),
        ] {
            assert_eq!(selector_of(query), Some(selector), "{query}");
        }
        assert_eq!(
            dated("sum(x)").as_deref(),
            Some("(sum(x)) or label_replace(min(timestamp(x)), \"watermarkd_sample\", \"time\", \"\", \"\")")
        );
    }

    #[test]
    fn everything_else_goes_as_written() {
        for query in [
            "",
            "rate(x[5m])",
            "sum(rate(x[5m]))",
            "x[5m]",
            "x offset 5m",
            "x @ 1700000000",
            "sum(x) / sum(y)",
            "x + 1",
            "1",
            "NaN",
            "inf",
            "vector(1)",
            "topk(3, x)",
            "quantile(0.9, x)",
            "sum(sum(x))",
            "x # a comment",
            "x{a=\"unclosed}",
            "x{a=~\"b\"} or y",
            "sum by (a) (x) by (b",
            "sum(x{a=\"b\"}",
            "\"text\"",
            "{}extra",
            "and",
            // The name may vary: timestamp() drops it, and two names' series could collide.
            "{job=\"a\"}",
            "{__name__=~\"a|b\"}",
            "m{__name__=~\"a|b\"}",
            "sum({__name__=~\"a|b\"})",
        ] {
            assert_eq!(dated(query), None, "{query}");
        }
    }
}
