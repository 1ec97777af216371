//! Query folding: per-workload queries of one shape become one grouped query.
//!
//! Autoscalers of many workloads typically ask the same question about different workloads,
//! `sum(rate(http_requests_total{namespace="prod",deployment="web-17"}[1m]))` for each
//! deployment. Such queries fold into one:
//!
//! ```text
//! sum by (deployment) (rate(http_requests_total{namespace="prod",deployment=~"web-1|web-17|..."}[1m]))
//! ```
//!
//! whose answer has one series per deployment, labelled with it: each member's value is the
//! series whose `deployment` is its own value (never found by position), and a member without
//! one has no data. The aggregation is computed within each group over the same series, in the
//! same order, as the member's own query would, so its value is the same number.
//!
//! What folds: `AGG(EXPR)` with AGG one of `sum`, `avg`, `min`, `max`, `count`, `stddev`,
//! `stdvar`, `quantile(φ, ...)`, or `histogram_quantile(φ, sum [by (le)] (EXPR))`, and no
//! grouping of its own; EXPR one series selector with a metric name, optionally inside
//! per-series functions (`rate`, `increase`, `*_over_time`, `clamp_min`, `abs`, ...) with
//! literal number arguments, with the same range and modifiers everywhere. Members fold when
//! their texts differ only in the value of one plain `K="v"` matcher. Anything else, and every
//! text the recogniser does not fully understand, is sent as written: a mistake here costs
//! requests, never a wrong value.
//!
//! Pure functions over query texts: no I/O, no clock.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use super::sample_time;

/// A folded query, as sent (with its data time asked for, when it is), stays shorter than this
/// many bytes: VictoriaMetrics refuses queries longer than 16 KiB by default, and a longer one
/// is split into several.
pub(super) const MAX_FOLDED_BYTES: usize = 16 * 1024;

/// Passes over one set of alike texts, each folding on the label that gathers the most of what
/// is left. Real rules need one or two; the bound keeps a contrived set from costing quadratic
/// time.
const MAX_PASSES: usize = 4;

/// Nested function calls followed, at most.
const MAX_DEPTH: usize = 16;

/// How large one folded query may grow, besides [`MAX_FOLDED_BYTES`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct FoldLimits {
    /// The longest regex of the folding matcher, in bytes, as the server reads it (after the
    /// string's own escapes): Mimir stops sharding a query past 4,096.
    pub max_regex_bytes: usize,
    /// The most member values one folded query matches.
    pub max_members: usize,
}

impl FoldLimits {
    /// Only the query's own length bounds a fold.
    #[cfg(test)]
    pub const UNBOUNDED: FoldLimits = FoldLimits { max_regex_bytes: usize::MAX, max_members: usize::MAX };
}

/// What one cycle sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Fetch {
    /// The text at this index of the planned texts, as written.
    Alone(usize),
    Folded(FoldedQuery),
}

/// One grouped query standing for several member texts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct FoldedQuery {
    /// What its members share (their text without the value of `label`): the shape a refusal
    /// is remembered by.
    pub shape: String,
    /// The label whose value tells the members apart (K), and groups the answer.
    pub label: String,
    /// The grouped query.
    pub text: String,
    /// `text` as sent: with the data time of each group asked for when the members' own
    /// queries ask for theirs (see `sample_time`).
    pub sent: String,
    /// Each member: its value of `label`, and its index in the planned texts.
    pub members: Vec<(String, usize)>,
}

/// The fetches that answer every one of `texts` (distinct query texts): each index appears in
/// exactly one fetch. `refused(shape)` says a shape's folded query was rejected recently: its
/// members go alone.
pub(super) fn plan(texts: &[&str], refused: impl Fn(&str) -> bool, limits: FoldLimits) -> Vec<Fetch> {
    let recognised: Vec<Option<Recognised<'_>>> = texts.iter().map(|text| recognise(text)).collect();

    // Texts alike but for the values of their plain `L="v"` matchers, in order of appearance.
    let mut alike: Vec<Vec<usize>> = Vec::new();
    let mut bucket_of: HashMap<String, usize> = HashMap::new();
    for (index, found) in recognised.iter().enumerate() {
        let Some(found) = found else { continue };
        let dated = sample_time::dated(found.text).is_some();
        let key = format!("{}{}", u8::from(dated), found.template(|_| true));
        let bucket = *bucket_of.entry(key).or_insert_with(|| {
            alike.push(Vec::new());
            alike.len() - 1
        });
        if let Some(members) = alike.get_mut(bucket) {
            members.push(index);
        }
    }

    let mut folded_at = vec![false; texts.len()];
    let mut fetches: Vec<(usize, Fetch)> = Vec::new();
    for members in alike.into_iter().filter(|m| m.len() > 1) {
        for query in fold_alike(members, &recognised, &refused, limits) {
            let first = query.members.iter().map(|(_, index)| *index).min().unwrap_or(0);
            for (_, index) in &query.members {
                if let Some(done) = folded_at.get_mut(*index) {
                    *done = true;
                }
            }
            fetches.push((first, Fetch::Folded(query)));
        }
    }
    fetches.extend(
        folded_at.iter().enumerate().filter(|(_, done)| !**done).map(|(index, _)| (index, Fetch::Alone(index))),
    );
    fetches.sort_by_key(|(first, _)| *first);
    fetches.into_iter().map(|(_, fetch)| fetch).collect()
}

/// Folds texts that differ only in the values of their plain matchers (same labels in the same
/// places): on the label whose values tell most of them apart while the others agree.
fn fold_alike(
    mut left: Vec<usize>,
    recognised: &[Option<Recognised<'_>>],
    refused: &impl Fn(&str) -> bool,
    limits: FoldLimits,
) -> Vec<FoldedQuery> {
    let found = |index: usize| recognised.get(index).and_then(Option::as_ref);
    let keys = left.first().and_then(|first| found(*first)).map_or(0, |f| f.keys.len());
    let mut out = Vec::new();
    for _ in 0..MAX_PASSES {
        if left.len() < 2 {
            break;
        }
        // For each label position: the members grouped by every other label's value.
        let mut best: Option<(usize, Vec<Vec<usize>>)> = None;
        let mut best_score = (0, usize::MAX);
        for position in 0..keys {
            let mut groups: Vec<Vec<usize>> = Vec::new();
            let mut group_of: HashMap<Vec<&str>, usize> = HashMap::new();
            for &index in &left {
                let Some(member) = found(index) else { continue };
                let others: Vec<&str> = member
                    .keys
                    .iter()
                    .enumerate()
                    .filter(|(p, _)| *p != position)
                    .map(|(_, key)| key.value.as_str())
                    .collect();
                let group = *group_of.entry(others).or_insert_with(|| {
                    groups.push(Vec::new());
                    groups.len() - 1
                });
                if let Some(members) = groups.get_mut(group) {
                    members.push(index);
                }
            }
            groups.retain(|members| distinct_values(members, position, &found) > 1);
            let gathered: usize = groups.iter().map(Vec::len).sum();
            // Most members folded, then fewest requests.
            let score = (gathered, groups.len());
            if gathered > best_score.0 || (gathered == best_score.0 && gathered > 0 && score.1 < best_score.1) {
                best_score = score;
                best = Some((position, groups));
            }
        }
        let Some((position, groups)) = best else { break };
        let mut taken = HashSet::new();
        for members in groups {
            out.extend(fold_group(&members, position, &found, refused, limits));
            taken.extend(members);
        }
        left.retain(|index| !taken.contains(index));
    }
    out
}

fn distinct_values<'r, 'a: 'r>(
    members: &[usize],
    position: usize,
    found: &impl Fn(usize) -> Option<&'r Recognised<'a>>,
) -> usize {
    let mut values: Vec<&str> =
        members.iter().filter_map(|i| found(*i)?.keys.get(position).map(|k| k.value.as_str())).collect();
    values.sort_unstable();
    values.dedup();
    values.len()
}

/// One group of members (alike but for the value at `position`) as folded queries, each under
/// [`MAX_FOLDED_BYTES`] as sent and within `limits`. Nothing when the shape was refused, and no
/// query for a chunk of one: those members go alone.
fn fold_group<'r, 'a: 'r>(
    members: &[usize],
    position: usize,
    found: &impl Fn(usize) -> Option<&'r Recognised<'a>>,
    refused: &impl Fn(&str) -> bool,
    limits: FoldLimits,
) -> Vec<FoldedQuery> {
    let Some(model) = members.first().and_then(|first| found(*first)) else { return Vec::new() };
    let Some(key) = model.keys.get(position) else { return Vec::new() };
    let shape = model.template(|p| p == position);
    if refused(&shape) {
        return Vec::new();
    }
    let dated = sample_time::dated(model.text).is_some();
    // Each copy of the selector carries the regex: the query, and the data time's.
    let copies = if dated { 2 } else { 1 };
    let base = model.folded(key, "\"\"", dated).1.len();

    // Member values in order of appearance; texts differing only in spacing share one.
    let mut values: Vec<(String, Vec<usize>)> = Vec::new();
    let mut value_at: HashMap<&str, usize> = HashMap::new();
    for &index in members {
        let Some(value) = found(index).and_then(|f| f.keys.get(position)).map(|k| k.value.as_str()) else { continue };
        let at = *value_at.entry(value).or_insert_with(|| {
            values.push((value.to_string(), Vec::new()));
            values.len() - 1
        });
        if let Some((_, indexes)) = values.get_mut(at) {
            indexes.push(index);
        }
    }

    // Each chunk's regex as written in the query (quoted: what the text's length counts) and as
    // the server reads it (what a store's regex bound counts).
    let mut chunks: Vec<Vec<(String, Vec<usize>)>> = Vec::new();
    let mut chunk: Vec<(String, Vec<usize>)> = Vec::new();
    let (mut quoted_len, mut regex_len) = (0, 0);
    for (value, indexes) in values {
        let regex = regex_escape(&value);
        let (quoted, plain) = (quote_body(&regex).len(), regex.len());
        let separator = usize::from(!chunk.is_empty());
        let too_long = base + copies * (quoted_len + separator + quoted) >= MAX_FOLDED_BYTES
            || regex_len + separator + plain > limits.max_regex_bytes
            || chunk.len() >= limits.max_members;
        if !chunk.is_empty() && too_long {
            chunks.push(std::mem::take(&mut chunk));
            (quoted_len, regex_len) = (0, 0);
        }
        let separator = usize::from(!chunk.is_empty());
        quoted_len += separator + quoted;
        regex_len += separator + plain;
        chunk.push((value, indexes));
    }
    chunks.push(chunk);

    let mut out = Vec::new();
    for chunk in chunks.into_iter().filter(|c| c.len() > 1) {
        let regex: Vec<String> = chunk.iter().map(|(value, _)| regex_escape(value)).collect();
        let literal = format!("\"{}\"", quote_body(&regex.join("|")));
        let (text, sent) = model.folded(key, &literal, dated);
        // The length was worked out piece by piece; a query that somehow came out longer is
        // not sent folded.
        if sent.len() >= MAX_FOLDED_BYTES {
            continue;
        }
        let members = chunk
            .into_iter()
            .flat_map(|(value, indexes)| indexes.into_iter().map(move |i| (value.clone(), i)))
            .collect();
        out.push(FoldedQuery { shape: shape.clone(), label: key.label.to_string(), text, sent, members });
    }
    out
}

/// `value` as an RE2 pattern matching exactly it: every metacharacter escaped. PromQL anchors
/// regex matchers at both ends.
pub(super) fn regex_escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 8);
    for c in value.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The inside of a double-quoted PromQL string holding `value`.
pub(super) fn quote_body(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 8);
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            c if c.is_control() && u32::from(c) < 0x80 => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The recogniser

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Ident,
    Number,
    Str,
    Punct,
}

#[derive(Clone, Debug)]
struct Token<'a> {
    kind: Kind,
    text: &'a str,
    /// Byte offset in the query.
    start: usize,
}

impl Token<'_> {
    fn end(&self) -> usize {
        self.start + self.text.len()
    }
}

/// Longest first, so that `=~` is not read as `=`.
const PUNCTUATION: &[&str] = &[
    "=~", "!~", "!=", "==", "<=", ">=", "(", ")", "{", "}", "[", "]", ",", "=", "<", ">", "+", "-", "*", "/", "%", "^",
    "@",
];

/// The tokens of `text`, or `None` when it holds anything this recogniser does not know (a
/// comment, an unterminated string, a stray character).
fn tokenize(text: &str) -> Option<Vec<Token<'_>>> {
    let mut tokens = Vec::new();
    let mut at = 0;
    while let Some(tail) = text.get(at..).filter(|t| !t.is_empty()) {
        let c = tail.chars().next()?;
        // PromQL's own spacing; any other space character is an error there.
        if matches!(c, ' ' | '\t' | '\n' | '\r') {
            at += 1;
            continue;
        }
        let starts_number = c.is_ascii_digit() || (c == '.' && tail.as_bytes().get(1).is_some_and(u8::is_ascii_digit));
        let (kind, len) = if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let len = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')).unwrap_or(tail.len());
            (Kind::Ident, len)
        } else if starts_number {
            (Kind::Number, number_len(tail))
        } else if matches!(c, '"' | '\'' | '`') {
            (Kind::Str, string_len(tail)?)
        } else {
            (Kind::Punct, PUNCTUATION.iter().find(|p| tail.starts_with(**p))?.len())
        };
        tokens.push(Token { kind, text: tail.get(..len)?, start: at });
        at += len;
    }
    Some(tokens)
}

/// A number or a duration at the start of `tail` (`1.5`, `1e-3`, `0x1f`, `5m`, `1h30m`).
fn number_len(tail: &str) -> usize {
    let bytes = tail.as_bytes();
    let mut len = 0;
    while let Some(&b) = bytes.get(len) {
        let exponent_sign = matches!(b, b'+' | b'-')
            && len > 1
            && matches!(bytes.get(len - 1), Some(b'e' | b'E'))
            && bytes.get(..len - 1).is_some_and(|m| m.iter().all(|d| d.is_ascii_digit() || *d == b'.'));
        if b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || exponent_sign {
            len += 1;
        } else {
            break;
        }
    }
    len
}

/// The length of the string literal at the start of `tail`, quotes included.
fn string_len(tail: &str) -> Option<usize> {
    let quote = tail.chars().next()?;
    let mut escaped = false;
    for (i, c) in tail.char_indices().skip(1) {
        if escaped {
            escaped = false;
        } else if c == '\\' && quote != '`' {
            escaped = true;
        } else if c == quote {
            return Some(i + 1);
        } else if c == '\n' && quote != '`' {
            return None;
        }
    }
    None
}

/// The value of a string literal (quotes included): Go's escapes in `"..."` and `'...'`, none
/// in `` `...` ``. `None` for what this does not know (non-ASCII byte escapes, and escapes
/// Prometheus rejects).
fn unquote(literal: &str) -> Option<String> {
    let quote = literal.chars().next()?;
    let body = literal.get(1..literal.len().checked_sub(1)?)?;
    if quote == '`' {
        return Some(body.to_string());
    }
    let mut out = String::with_capacity(body.len());
    let mut chars = body.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        let escape = chars.next()?;
        let decoded = match escape {
            'a' => '\u{7}',
            'b' => '\u{8}',
            'f' => '\u{c}',
            'n' => '\n',
            'r' => '\r',
            't' => '\t',
            'v' => '\u{b}',
            '\\' => '\\',
            '"' if quote == '"' => '"',
            '\'' if quote == '\'' => '\'',
            'x' => ascii(code(&mut chars, 2, 16, None)?)?,
            'u' => char::from_u32(code(&mut chars, 4, 16, None)?)?,
            'U' => char::from_u32(code(&mut chars, 8, 16, None)?)?,
            '0'..='7' => ascii(code(&mut chars, 2, 8, escape.to_digit(8))?)?,
            _ => return None,
        };
        out.push(decoded);
    }
    Some(out)
}

/// `digits` more digits in `radix`, after `first` if given.
fn code(chars: &mut std::str::Chars<'_>, digits: usize, radix: u32, first: Option<u32>) -> Option<u32> {
    let mut value = first.unwrap_or(0);
    for _ in 0..digits {
        value = value.checked_mul(radix)?.checked_add(chars.next()?.to_digit(radix)?)?;
    }
    Some(value)
}

/// A byte escape: only ASCII is one character; a byte of a multi-byte character is not taken.
fn ascii(value: u32) -> Option<char> {
    (value < 0x80).then(|| char::from_u32(value)).flatten()
}

/// Aggregations that are exact within each group of `by (K)`: the same series, the same order.
const AGGREGATIONS: &[&str] = &["sum", "avg", "min", "max", "count", "stddev", "stdvar", "quantile"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arg {
    /// An instant vector: a selector or a per-series function of one.
    Instant,
    /// A range selector `sel[d]`.
    Range,
    /// A number literal.
    Number,
    /// A number literal, or nothing.
    OptionalNumber,
}

/// Functions that compute each output series from one input series, keeping its labels (the
/// metric name aside, which is the same for all). Names are case-sensitive in PromQL. These
/// take one range selector.
const RANGE_FUNCTIONS: &[&str] = &[
    "rate",
    "irate",
    "increase",
    "delta",
    "idelta",
    "deriv",
    "resets",
    "changes",
    "avg_over_time",
    "min_over_time",
    "max_over_time",
    "sum_over_time",
    "count_over_time",
    "last_over_time",
    "present_over_time",
    "stddev_over_time",
    "stdvar_over_time",
    "mad_over_time",
];

/// Per-series functions of one instant vector.
const INSTANT_FUNCTIONS: &[&str] = &["abs", "ceil", "floor", "exp", "ln", "log2", "log10", "sqrt", "sgn", "timestamp"];

/// Per-series functions with number arguments too.
const FUNCTIONS_WITH_NUMBERS: &[(&str, &[Arg])] = &[
    ("quantile_over_time", &[Arg::Number, Arg::Range]),
    ("predict_linear", &[Arg::Range, Arg::Number]),
    ("holt_winters", &[Arg::Range, Arg::Number, Arg::Number]),
    ("double_exponential_smoothing", &[Arg::Range, Arg::Number, Arg::Number]),
    ("round", &[Arg::Instant, Arg::OptionalNumber]),
    ("clamp", &[Arg::Instant, Arg::Number, Arg::Number]),
    ("clamp_min", &[Arg::Instant, Arg::Number]),
    ("clamp_max", &[Arg::Instant, Arg::Number]),
];

/// The arguments of a per-series function; `None` for any other function.
fn signature(name: &str) -> Option<&'static [Arg]> {
    if RANGE_FUNCTIONS.contains(&name) {
        return Some(&[Arg::Range]);
    }
    if INSTANT_FUNCTIONS.contains(&name) {
        return Some(&[Arg::Instant]);
    }
    FUNCTIONS_WITH_NUMBERS.iter().find(|(f, _)| *f == name).map(|(_, args)| *args)
}

/// A text of a shape that folds.
#[derive(Debug)]
struct Recognised<'a> {
    text: &'a str,
    tokens: Vec<Token<'a>>,
    /// Where `by (K)` goes.
    grouping: Grouping,
    /// Byte span of the one selector (its name to its closing brace).
    selector: (usize, usize),
    /// The selector's plain `L="v"` matchers on labels with no other matcher, in order: the
    /// labels a fold may group by.
    keys: Vec<Key<'a>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Grouping {
    /// ` by (K)` right after the aggregation's name, which ends at this byte.
    After(usize),
    /// `K, ` before the `le` of `histogram_quantile`'s `sum by (le)`, at this byte.
    BeforeLe(usize),
}

#[derive(Debug)]
struct Key<'a> {
    label: &'a str,
    value: String,
    /// The index of the value's token.
    token: usize,
    /// Byte span of the whole matcher, label to closing quote.
    span: (usize, usize),
}

impl Recognised<'_> {
    /// The text's tokens, spacing aside, with the values of the keys `blank(position)` picks
    /// left out: texts with the same template differ only in those values.
    fn template(&self, blank: impl Fn(usize) -> bool) -> String {
        let blanked: Vec<usize> =
            self.keys.iter().enumerate().filter(|(p, _)| blank(*p)).map(|(_, key)| key.token).collect();
        let mut out = String::with_capacity(self.text.len() + self.tokens.len() * 3);
        for (index, token) in self.tokens.iter().enumerate() {
            if blanked.contains(&index) {
                out.push('*');
            } else {
                // Length-prefixed: no token text can pass for two. Writing to a String
                // cannot fail.
                let _ = write!(out, "{}:{}", token.text.len(), token.text);
            }
        }
        out
    }

    /// The folded query on `key` with `literal` (a quoted regex) for its matcher, and that
    /// query as sent.
    fn folded(&self, key: &Key<'_>, literal: &str, dated: bool) -> (String, String) {
        let matcher = format!("{}=~{literal}", key.label);
        let splice = |from: usize, to: usize| -> String {
            let mut out = String::new();
            out.push_str(self.text.get(from..key.span.0).unwrap_or_default());
            out.push_str(&matcher);
            out.push_str(self.text.get(key.span.1..to).unwrap_or_default());
            out
        };
        let (at, insert) = match self.grouping {
            Grouping::After(at) => (at, format!(" by ({})", key.label)),
            Grouping::BeforeLe(at) => (at, format!("{}, ", key.label)),
        };
        // The grouping goes before the selector (`sum by (K) (...)`) or after it
        // (`sum(...) by (K, le)`).
        let text = if at <= key.span.0 {
            format!("{}{insert}{}", self.text.get(..at).unwrap_or_default(), splice(at, self.text.len()))
        } else {
            format!("{}{insert}{}", splice(0, at), self.text.get(at..).unwrap_or_default())
        };
        let sent = if dated {
            sample_time::dated_by(&text, &splice(self.selector.0, self.selector.1), key.label)
        } else {
            text.clone()
        };
        (text, sent)
    }
}

/// `text` when it has a shape that folds (see the module comment), with what folding needs.
fn recognise(text: &str) -> Option<Recognised<'_>> {
    let tokens = tokenize(text)?;
    let mut cursor = Cursor { tokens: &tokens, at: 0 };
    let first = cursor.ident()?;
    let histogram = first.text == "histogram_quantile";
    let (grouping, selector) = if histogram {
        cursor.punct("(")?;
        cursor.number()?;
        cursor.punct(",")?;
        let sum = cursor.keyword("sum")?;
        let mut le = cursor.by_le()?;
        cursor.punct("(")?;
        let selector = cursor.expression(0)?;
        cursor.punct(")")?;
        if le.is_none() {
            le = cursor.by_le()?;
        }
        cursor.punct(")")?;
        (le.map_or(Grouping::After(sum.end()), Grouping::BeforeLe), selector)
    } else {
        if !AGGREGATIONS.iter().any(|a| a.eq_ignore_ascii_case(first.text)) {
            return None;
        }
        // A `by` or `without` here is not a `(`: already grouped, not folded.
        cursor.punct("(")?;
        if first.text.eq_ignore_ascii_case("quantile") {
            cursor.number()?;
            cursor.punct(",")?;
        }
        let selector = cursor.expression(0)?;
        cursor.punct(")")?;
        (Grouping::After(first.end()), selector)
    };
    // Anything after: a trailing `by (...)`, an operator, another query.
    if cursor.at < tokens.len() {
        return None;
    }

    let (first_token, last_token) = selector;
    let keys = keys(&tokens, first_token, last_token, histogram)?;
    let span = (tokens.get(first_token)?.start, tokens.get(last_token)?.end());
    Some(Recognised { text, tokens, grouping, selector: span, keys })
}

/// The plain `L="v"` matchers between the selector's tokens `first..=last` on labels matched
/// once; `None` when the selector has a `__name__` matcher (its name must be fixed).
fn keys<'a>(tokens: &[Token<'a>], first: usize, last: usize, histogram: bool) -> Option<Vec<Key<'a>>> {
    let matchers: Vec<(usize, &Token<'a>)> = tokens
        .get(first..=last)?
        .iter()
        .enumerate()
        .filter(|(_, t)| t.kind == Kind::Str)
        .map(|(i, t)| (first + i, t))
        .collect();
    let mut keys = Vec::new();
    let mut labels: Vec<&str> = Vec::new();
    for (index, value) in &matchers {
        let label = tokens.get(index.checked_sub(2)?)?;
        let op = tokens.get(index.checked_sub(1)?)?;
        if label.text == "__name__" {
            return None;
        }
        labels.push(label.text);
        // A value-less `L=""` matches series without L: left alone.
        if op.text != "=" || label.text.contains(':') || (histogram && label.text == "le") {
            continue;
        }
        let Some(decoded) = unquote(value.text).filter(|v| !v.is_empty()) else { continue };
        keys.push(Key { label: label.text, value: decoded, token: *index, span: (label.start, value.end()) });
    }
    keys.retain(|key| labels.iter().filter(|l| **l == key.label).count() == 1);
    Some(keys)
}

struct Cursor<'t, 'a> {
    tokens: &'t [Token<'a>],
    at: usize,
}

impl<'t, 'a> Cursor<'t, 'a> {
    fn peek(&self) -> Option<&'t Token<'a>> {
        self.tokens.get(self.at)
    }

    fn take(&mut self, wanted: impl Fn(&Token<'a>) -> bool) -> Option<&'t Token<'a>> {
        let token = self.peek().filter(|t| wanted(t))?;
        self.at += 1;
        Some(token)
    }

    fn punct(&mut self, p: &str) -> Option<&'t Token<'a>> {
        self.take(|t| t.kind == Kind::Punct && t.text == p)
    }

    fn at_punct(&self, p: &str) -> bool {
        self.peek().is_some_and(|t| t.kind == Kind::Punct && t.text == p)
    }

    fn ident(&mut self) -> Option<&'t Token<'a>> {
        self.take(|t| t.kind == Kind::Ident)
    }

    /// A keyword: PromQL's keywords are case-insensitive.
    fn keyword(&mut self, word: &str) -> Option<&'t Token<'a>> {
        self.take(|t| t.kind == Kind::Ident && t.text.eq_ignore_ascii_case(word))
    }

    fn at_keyword(&self, word: &str) -> bool {
        self.peek().is_some_and(|t| t.kind == Kind::Ident && t.text.eq_ignore_ascii_case(word))
    }

    /// A number literal, signed or not.
    fn number(&mut self) -> Option<()> {
        let _ = self.punct("-").or_else(|| self.punct("+"));
        self.take(|t| t.kind == Kind::Number).map(|_| ())
    }

    /// `Some(Some(at))` for `by (le)` (`at`: where `le` starts), `Some(None)` for no grouping,
    /// `None` for any other grouping.
    fn by_le(&mut self) -> Option<Option<usize>> {
        if self.at_keyword("without") {
            return None;
        }
        if self.keyword("by").is_none() {
            return Some(None);
        }
        self.punct("(")?;
        let le = self.take(|t| t.kind == Kind::Ident && t.text == "le")?;
        self.punct(")")?;
        Some(Some(le.start))
    }

    /// A per-series function of the one selector, or the selector: its first and last tokens.
    fn expression(&mut self, depth: usize) -> Option<(usize, usize)> {
        let name = self.peek()?;
        let is_call = self.tokens.get(self.at + 1).is_some_and(|t| t.kind == Kind::Punct && t.text == "(");
        if !is_call {
            let selector = self.selector()?;
            self.modifiers()?;
            return Some(selector);
        }
        if depth >= MAX_DEPTH {
            return None;
        }
        let args = signature(name.text)?;
        self.at += 2;
        let mut selector = None;
        for (position, arg) in args.iter().enumerate() {
            if position > 0 {
                if *arg == Arg::OptionalNumber && !self.at_punct(",") {
                    break;
                }
                self.punct(",")?;
            }
            match arg {
                Arg::Instant => selector = Some(self.expression(depth + 1)?),
                Arg::Range => {
                    let found = self.selector()?;
                    self.punct("[")?;
                    self.take(|t| t.kind == Kind::Number)?;
                    self.punct("]")?;
                    self.modifiers()?;
                    selector = Some(found);
                }
                Arg::Number | Arg::OptionalNumber => self.number()?,
            }
        }
        self.punct(")")?;
        selector
    }

    /// `name` or `name{matchers}` (a metric name is required): its first and last tokens.
    fn selector(&mut self) -> Option<(usize, usize)> {
        let first = self.at;
        let name = self.ident()?;
        if sample_time::NOT_NAMES.iter().any(|w| w.eq_ignore_ascii_case(name.text))
            || AGGREGATIONS.iter().any(|a| a.eq_ignore_ascii_case(name.text))
        {
            return None;
        }
        if self.punct("{").is_none() {
            return Some((first, first));
        }
        loop {
            if self.punct("}").is_some() {
                return Some((first, self.at - 1));
            }
            self.take(|t| t.kind == Kind::Ident)?;
            self.take(|t| t.kind == Kind::Punct && matches!(t.text, "=" | "!=" | "=~" | "!~"))?;
            self.take(|t| t.kind == Kind::Str)?;
            if self.punct(",").is_none() && !self.at_punct("}") {
                return None;
            }
        }
    }

    /// Any of `offset [-]d` and `@ t` / `@ start()` / `@ end()`, each at most once.
    fn modifiers(&mut self) -> Option<()> {
        let (mut offset, mut at) = (false, false);
        loop {
            if !offset && self.keyword("offset").is_some() {
                offset = true;
                let _ = self.punct("-");
                self.take(|t| t.kind == Kind::Number)?;
            } else if !at && self.punct("@").is_some() {
                at = true;
                if self.take(|t| t.kind == Kind::Ident && matches!(t.text, "start" | "end")).is_some() {
                    self.punct("(")?;
                    self.punct(")")?;
                } else {
                    self.number()?;
                }
            } else {
                return Some(());
            }
        }
    }
}

#[cfg(test)]
mod tests;
