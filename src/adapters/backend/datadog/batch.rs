//! Batching: several queries in one `GET /api/v1/query`, as the Cluster Agent does.
//!
//! Datadog answers a comma-joined list of queries with series tagged by `query_index`, so one
//! request can serve up to 35 autoscaler queries. The Cluster Agent also keeps the URL-encoded
//! query under 7,000 characters; here the whole URL (scheme, host, path, `from`, `to` and the
//! query) is kept under that bound, which is stricter and leaves room for proxies that cap the
//! request line.

use std::fmt::Write as _;

/// Queries joined into one request, at most.
pub const MAX_QUERIES_PER_REQUEST: usize = 35;
/// Characters in one request URL, fully encoded, strictly fewer than this.
pub const MAX_URL_CHARS: usize = 7_000;

/// The encoded form of the `,` that joins queries.
const ENCODED_COMMA: &str = "%2C";

/// Appends `text` encoded as `application/x-www-form-urlencoded` (what `url`'s query
/// serializer writes): alphanumerics and `*-._` stay, space becomes `+`, every other byte is
/// `%XX`. Encoding here rather than through `Url::query_pairs_mut` lets the batcher know each
/// URL's exact length before building it.
pub fn form_encode(text: &str, out: &mut String) {
    for byte in text.bytes() {
        match byte {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'*' | b'-' | b'.' | b'_' => out.push(char::from(byte)),
            b' ' => out.push('+'),
            _ => {
                // Writing to a String cannot fail.
                let _ = write!(out, "%{byte:02X}");
            }
        }
    }
}

/// Length of `form_encode(text)`, without building it.
pub fn encoded_len(text: &str) -> usize {
    text.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'*' | b'-' | b'.' | b'_' | b' ' => 1,
            _ => 3,
        })
        .sum()
}

/// Byte offsets of the commas of `query` that are outside any `()`, `{}`, `[]` and quotes: the
/// commas Datadog would read as separating queries. Tag sets (`{a:b,c:d}`) and function
/// arguments (`top(q, 10, 'mean', 'desc')`) keep their commas.
pub fn top_level_commas(query: &str) -> Vec<usize> {
    let mut depth: usize = 0;
    let mut commas = Vec::new();
    for_each_unquoted(query, |at, c| match c {
        '(' | '{' | '[' => depth += 1,
        // Unbalanced closers are Datadog's to reject; never underflow on them.
        ')' | '}' | ']' => depth = depth.saturating_sub(1),
        ',' if depth == 0 => commas.push(at),
        _ => {}
    });
    commas
}

/// Whether every `(`, `{`, `[` is closed by its own kind and every quote ends. A query that is
/// not would swallow the queries joined after it (its unclosed brace makes their commas look
/// nested), so it is never batched.
pub fn is_balanced(query: &str) -> bool {
    let mut open: Vec<char> = Vec::new();
    let mut mismatched = false;
    let quotes_closed = for_each_unquoted(query, |_, c| {
        let expected = match c {
            '(' | '{' | '[' => return open.push(c),
            ')' => '(',
            '}' => '{',
            ']' => '[',
            _ => return,
        };
        mismatched |= open.pop() != Some(expected);
    });
    quotes_closed && !mismatched && open.is_empty()
}

/// Calls `visit` with every character outside quoted strings (with its byte offset), the way
/// Datadog's parser sees structure. Returns false when a quote is left open.
fn for_each_unquoted(query: &str, mut visit: impl FnMut(usize, char)) -> bool {
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (at, c) in query.char_indices() {
        match quote {
            Some(_) if escaped => escaped = false,
            Some(_) if c == '\\' => escaped = true,
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '\'' || c == '"' => quote = Some(c),
            None => visit(at, c),
        }
    }
    quote.is_none()
}

/// One planned request: which queries (indexes into the list given to `plan`) and its URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedRequest {
    pub queries: Vec<usize>,
    pub url: String,
}

/// A query that cannot be sent at all: alone, its URL would already be too long.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TooLong {
    pub query: usize,
    pub url_chars: usize,
}

/// The characters of a request URL before its first query.
pub fn url_prefix_len(endpoint: &str, from: i64, to: i64) -> usize {
    format!("{endpoint}?from={from}&to={to}&query=").len()
}

/// Packs `queries` (already de-duplicated, in order) into as few requests as the two bounds
/// allow, filling each request before starting the next. Order is kept, so a batch's
/// `query_index` `i` is `PlannedRequest::queries[i]`.
pub fn plan(endpoint: &str, from: i64, to: i64, queries: &[&str]) -> (Vec<PlannedRequest>, Vec<TooLong>) {
    let prefix = format!("{endpoint}?from={from}&to={to}&query=");
    let mut planned = Vec::new();
    let mut too_long = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut current_len = prefix.len();
    for (index, query) in queries.iter().enumerate() {
        let alone = prefix.len() + encoded_len(query);
        if alone >= MAX_URL_CHARS {
            too_long.push(TooLong { query: index, url_chars: alone });
            continue;
        }
        let added = ENCODED_COMMA.len() + encoded_len(query);
        if !current.is_empty() && (current.len() >= MAX_QUERIES_PER_REQUEST || current_len + added >= MAX_URL_CHARS) {
            planned.push(build(&prefix, queries, std::mem::take(&mut current)));
            current_len = prefix.len();
        }
        current_len += if current.is_empty() { encoded_len(query) } else { added };
        current.push(index);
    }
    if !current.is_empty() {
        planned.push(build(&prefix, queries, current));
    }
    (planned, too_long)
}

fn build(prefix: &str, queries: &[&str], members: Vec<usize>) -> PlannedRequest {
    let mut url = String::with_capacity(MAX_URL_CHARS);
    url.push_str(prefix);
    for (position, query) in members.iter().filter_map(|&index| queries.get(index)).enumerate() {
        if position > 0 {
            url.push_str(ENCODED_COMMA);
        }
        form_encode(query, &mut url);
    }
    PlannedRequest { queries: members, url }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Splits a comma-joined query list at its top-level commas.
    fn split_top_level(joined: &str) -> Vec<&str> {
        let mut parts = Vec::new();
        let mut start = 0;
        for at in top_level_commas(joined) {
            parts.push(&joined[start..at]);
            start = at + 1;
        }
        parts.push(&joined[start..]);
        parts
    }

    #[test]
    fn encoding_matches_the_form_serializer() {
        let mut out = String::new();
        form_encode("avg:a.b{x:y,z:w} by {host}*2-1", &mut out);
        assert_eq!(out, "avg%3Aa.b%7Bx%3Ay%2Cz%3Aw%7D+by+%7Bhost%7D*2-1");
        assert_eq!(encoded_len("avg:a.b{x:y,z:w} by {host}*2-1"), out.len());
        let mut utf8 = String::new();
        form_encode("é", &mut utf8);
        assert_eq!(utf8, "%C3%A9");
    }

    #[test]
    fn only_top_level_commas_separate_queries() {
        let joined = "avg:a{x:1,y:2},top(avg:b{*} by {host}, 10, 'mean', 'desc'),sum:c{k:'a,b'}.as_count()";
        assert_eq!(
            split_top_level(joined),
            vec!["avg:a{x:1,y:2}", "top(avg:b{*} by {host}, 10, 'mean', 'desc')", "sum:c{k:'a,b'}.as_count()"]
        );
        assert!(top_level_commas("avg:a{x:1,y:2}").is_empty());
        assert_eq!(top_level_commas("a{*},b{*}"), vec![4]);
        // Stray closers do not make later commas look nested.
        assert_eq!(top_level_commas("a}},b"), vec![3]);
    }

    #[test]
    fn unbalanced_queries_are_recognised() {
        assert!(is_balanced("top(avg:b{x:'a,}'} by {host}, 10, 'mean', 'desc')"));
        assert!(is_balanced("avg:a{*}.rollup(avg, 30) * 2"));
        for bad in ["avg:a{*", "avg:a{*})", "avg:a{*)", "sum:a{k:'x}", "(]"] {
            assert!(!is_balanced(bad), "{bad}");
        }
    }

    #[test]
    fn batches_respect_both_bounds_and_keep_order() {
        let queries: Vec<String> = (0..100).map(|i| format!("avg:m{{svc:s{i}}}")).collect();
        let refs: Vec<&str> = queries.iter().map(String::as_str).collect();
        let (planned, too_long) = plan("http://h/api/v1/query", 1, 2, &refs);
        assert!(too_long.is_empty());
        assert_eq!(planned.iter().map(|p| p.queries.len()).collect::<Vec<_>>(), vec![35, 35, 30]);
        let flat: Vec<usize> = planned.iter().flat_map(|p| p.queries.clone()).collect();
        assert_eq!(flat, (0..100).collect::<Vec<_>>());

        let long: Vec<String> = (0..10).map(|i| format!("avg:m{{{}{i}}}", "x".repeat(2_000))).collect();
        let refs: Vec<&str> = long.iter().map(String::as_str).collect();
        let (planned, _) = plan("http://h/api/v1/query", 1, 2, &refs);
        assert!(planned.iter().all(|p| p.url.len() < MAX_URL_CHARS));
        assert_eq!(planned.len(), 4, "three ~2,000-char queries fit under 7,000 characters, four do not");

        let huge = "x".repeat(MAX_URL_CHARS);
        let (planned, too_long) = plan("http://h/api/v1/query", 1, 2, &["a{*}", &huge]);
        assert_eq!(planned.len(), 1);
        assert_eq!(too_long.len(), 1);
        assert_eq!(too_long[0].query, 1);
    }
}
