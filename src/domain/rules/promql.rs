//! An offline look at a Prometheus query's syntax, so that `watermarkd check` and every load of
//! the rules find a broken query (`sum(rate(x{service="a"[1m])`) instead of the daemon reading
//! it as "no data" at run time.
//!
//! A Prometheus backend may be Prometheus, Thanos, Mimir or Cortex (PromQL) or VictoriaMetrics
//! (MetricsQL, which accepts more: `rate(x)` without a range, `WITH` templates, `or` inside
//! braces, dots in names). A query valid on any of them must pass, so this is no full PromQL
//! parser: it refuses only what every one of them refuses, and says where.
//!
//! - a string that is not closed;
//! - brackets that do not pair up: `(` with `)`, `{` with `}`, `[` with `]`, properly nested,
//!   and no bracket opened inside a selector's label matchers;
//! - a binary operator with no operand after it (`x /`, `(x +)`), or, for those that cannot be
//!   a sign, none before it (`* x`, `(/ x)`, `x + * y`).
//!
//! Comments (`#` to the end of the line) are skipped, as in PromQL. Positions are counted in
//! characters from 1, and given as line and column when the query spans several lines.

/// What is wrong with `query` as PromQL, as a sentence that follows "is not valid PromQL: ";
/// `None` when nothing this looks at is.
pub(crate) fn syntax_problem(query: &str) -> Option<String> {
    let tokens = match tokens(query) {
        Ok(tokens) => tokens,
        Err(at) => return Some(format!("the string that starts {} is not closed", Place::of(query, at))),
    };
    Checker { query, open: Vec::new(), last: Last::Start }.run(&tokens).err()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Token {
    /// A name, a keyword, a number or a duration: something an operator can apply to.
    Word,
    Str,
    /// `(`, `[` or `{`.
    Open(char),
    /// `)`, `]` or `}`.
    Close(char),
    Comma,
    /// A binary operator that cannot be a sign: `*`, `/`, `%`, `^`, a comparison, `and`, `or`,
    /// `unless`.
    Binary,
    /// `+` or `-`: binary after an operand, a sign before one.
    Sign,
    /// Anything else (`=`, `=~`, `!~`, `@`, `:`, a character no dialect here knows): nothing is
    /// said of it.
    Other,
}

/// The tokens of `query` with the byte offset where each starts; `Err` with the offset of a
/// string that is not closed.
fn tokens(query: &str) -> Result<Vec<(Token, usize)>, usize> {
    let mut out = Vec::new();
    let mut chars = query.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        let token = match c {
            '#' => {
                // A comment, to the end of the line.
                while chars.next_if(|&(_, c)| c != '\n').is_some() {}
                continue;
            }
            c if c.is_whitespace() => continue,
            '"' | '\'' | '`' => {
                let mut escaped = false;
                let mut closed = false;
                for (_, next) in chars.by_ref() {
                    if escaped {
                        escaped = false;
                    } else if next == '\\' && c != '`' {
                        escaped = true;
                    } else if next == c {
                        closed = true;
                        break;
                    }
                }
                if !closed {
                    return Err(at);
                }
                Token::Str
            }
            '(' | '[' | '{' => Token::Open(c),
            ')' | ']' | '}' => Token::Close(c),
            ',' => Token::Comma,
            '+' | '-' => Token::Sign,
            '*' | '/' | '%' | '^' => Token::Binary,
            '<' | '>' => {
                chars.next_if(|&(_, next)| next == '=');
                Token::Binary
            }
            '=' | '!' => match chars.next_if(|&(_, next)| next == '=' || next == '~') {
                // `==` and `!=` compare; `=~`, `!~` and a lone `=` match labels (or, in
                // MetricsQL, define a template).
                Some((_, '=')) => Token::Binary,
                _ => Token::Other,
            },
            c if is_word(c) => {
                let start = at;
                let mut end = at + c.len_utf8();
                while let Some((next_at, next)) = chars.next_if(|&(_, next)| is_word(next) || next == '\\') {
                    end = next_at + next.len_utf8();
                    // MetricsQL escapes a character of a name with a backslash.
                    if next == '\\' {
                        if let Some((escaped_at, escaped)) = chars.next() {
                            end = escaped_at + escaped.len_utf8();
                        }
                    }
                }
                let word = query.get(start..end).unwrap_or_default();
                if ["and", "or", "unless"].iter().any(|k| k.eq_ignore_ascii_case(word)) {
                    Token::Binary
                } else {
                    Token::Word
                }
            }
            _ => Token::Other,
        };
        out.push((token, at));
    }
    Ok(out)
}

/// What a name, keyword, number or duration is made of (`5m`, `1.5e3`, `0x1f`, `job:rate5m`,
/// and the dots MetricsQL allows in names).
fn is_word(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | ':' | '.')
}

/// What stood before the current token, where operators are checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Last {
    /// The start of an expression: of the query, after `(` or `,`.
    Start,
    /// An operator, at `usize`: an operand must follow.
    Operator(usize),
    Operand,
}

/// What a bracket opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Inside {
    /// An expression: the query, a call's arguments, parentheses.
    Expression,
    /// The label names of `by`, `without`, `on`, `ignoring`, `group_left` or `group_right`,
    /// which may be keywords (`by (and)`).
    Labels,
    /// A selector's label matchers.
    Matchers,
    /// A range or a subquery's range and step.
    Range,
}

struct Checker<'q> {
    query: &'q str,
    /// The brackets open: the character, its offset, and what it opened.
    open: Vec<(char, usize, Inside)>,
    last: Last,
}

impl Checker<'_> {
    fn run(mut self, tokens: &[(Token, usize)]) -> Result<(), String> {
        let mut previous_word: Option<&str> = None;
        for &(token, at) in tokens {
            let inside = self.open.last().map_or(Inside::Expression, |&(_, _, inside)| inside);
            match token {
                Token::Open(bracket) => {
                    if let Some(&(matchers, opened_at, Inside::Matchers)) = self.open.last() {
                        return Err(format!(
                            "the '{bracket}' {} is inside the label matchers that '{matchers}' opened {}: is a '}}' \
                             missing?",
                            self.place(at),
                            self.place(opened_at)
                        ));
                    }
                    let opened = match bracket {
                        '{' => Inside::Matchers,
                        '[' => Inside::Range,
                        _ if previous_word.is_some_and(is_grouping) => Inside::Labels,
                        _ => Inside::Expression,
                    };
                    self.open.push((bracket, at, opened));
                    self.last = if opened == Inside::Expression { Last::Start } else { self.last };
                }
                Token::Close(bracket) => {
                    if inside == Inside::Expression {
                        self.operand_after_operator(&format!("'{bracket}' {}", self.place(at)))?;
                    }
                    let Some((opening, opened_at, _)) = self.open.pop() else {
                        return Err(format!("the '{bracket}' {} closes nothing", self.place(at)));
                    };
                    if closing(opening) != bracket {
                        return Err(format!(
                            "the '{opening}' {} is closed by '{bracket}' {}",
                            self.place(opened_at),
                            self.place(at)
                        ));
                    }
                    self.last = Last::Operand;
                }
                Token::Comma if inside == Inside::Expression => {
                    self.operand_after_operator(&format!("',' {}", self.place(at)))?;
                    self.last = Last::Start;
                }
                Token::Binary if inside == Inside::Expression => {
                    if self.last != Last::Operand {
                        let operator = self.text_at(at);
                        return Err(format!("the '{operator}' {} has no operand before it", self.place(at)));
                    }
                    self.last = Last::Operator(at);
                }
                Token::Sign if inside == Inside::Expression => self.last = Last::Operator(at),
                Token::Word | Token::Str | Token::Other if inside == Inside::Expression => self.last = Last::Operand,
                _ => {}
            }
            previous_word = match token {
                Token::Word => self.query.get(at..).map(|rest| rest.split(|c: char| !is_word(c)).next().unwrap_or("")),
                _ => None,
            };
        }
        self.operand_after_operator("the end of the query")?;
        match self.open.last() {
            Some(&(bracket, at, _)) => Err(format!("the '{bracket}' {} is never closed", self.place(at))),
            None => Ok(()),
        }
    }

    /// An error when the last token was an operator, since `what` (a closing bracket, a comma,
    /// the end) cannot be its operand.
    fn operand_after_operator(&self, what: &str) -> Result<(), String> {
        match self.last {
            Last::Operator(at) => {
                let operator = self.text_at(at);
                if what == "the end of the query" {
                    Err(format!("the '{operator}' {} has nothing after it", self.place(at)))
                } else {
                    Err(format!("the '{operator}' {} is followed by {what} instead of an operand", self.place(at)))
                }
            }
            Last::Start | Last::Operand => Ok(()),
        }
    }

    /// The operator at `at`, as written (`*`, `>=`, `unless`).
    fn text_at(&self, at: usize) -> &str {
        let rest = self.query.get(at..).unwrap_or_default();
        let len = if rest.starts_with(|c: char| c.is_alphabetic()) {
            rest.find(|c: char| !c.is_alphanumeric()).unwrap_or(rest.len())
        } else if ["==", "!=", "<=", ">="].iter().any(|op| rest.starts_with(op)) {
            2
        } else {
            rest.chars().next().map_or(0, char::len_utf8)
        };
        rest.get(..len).unwrap_or_default()
    }

    fn place(&self, at: usize) -> Place {
        Place::of(self.query, at)
    }
}

fn closing(opening: char) -> char {
    match opening {
        '(' => ')',
        '[' => ']',
        _ => '}',
    }
}

/// Words whose parentheses hold label names.
fn is_grouping(word: &str) -> bool {
    ["by", "without", "on", "ignoring", "group_left", "group_right"].iter().any(|k| k.eq_ignore_ascii_case(word))
}

/// Where a byte offset of the query is, as a person counts: characters from 1, and the line
/// when the query has several.
struct Place {
    line: Option<usize>,
    column: usize,
}

impl Place {
    fn of(query: &str, at: usize) -> Place {
        let before = query.get(..at).unwrap_or(query);
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = before.get(line_start..).map_or(0, |line| line.chars().count()) + 1;
        let line = query.contains('\n').then(|| before.matches('\n').count() + 1);
        Place { line, column }
    }
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(line) => write!(f, "on line {line} at column {}", self.column),
            None => write!(f, "at character {}", self.column),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_every_dialect_accepts_passes() {
        for query in [
            "up",
            "sum(rate(http_requests_total{service=\"web\"}[1m]))",
            "sum by (le) (rate(http_request_duration_seconds_bucket{job=~\"api|web\"}[5m]))",
            "histogram_quantile(0.99, sum by (le) (rate(x_bucket[5m])))",
            "sum without (instance) (x) / on (job) group_left (team) y",
            "sum by (and, or, unless) (x)",
            "x > bool 0.5",
            "x * -1 + +2 - -3",
            "-x",
            "(x + y) / 2 ^ 3 % 4",
            "x == 1 or y != 2 and z unless w",
            "x >= 1 <= 2 < 3 > 4",
            "rate(x[5m:1m]) offset 1h @ 1700000000",
            "max_over_time(x[1h:])",
            "time()",
            "vector(1)",
            "label_replace(up, \"a\", \"$1\", \"b\", \"(.*)\")",
            "x{a=\"}\", b='{', c=`]`}",
            "x{a=\"\\\"(\"}",
            "{__name__=~\"job:.*\"}",
            "{\"metric.with.dots\", a=\"b\"}",
            "1e3 + 0x1f + .5 + Inf - NaN",
            "sum(x) # a comment with an unbalanced ( and a \"",
            "sum(\n  rate(x[1m])\n)",
            "x atan2 y",
            "count_values(\"v\", x)",
            "topk(3, x)",
            // MetricsQL (VictoriaMetrics) accepts these.
            "rate(x)",
            "with (f(a) = a + 1) f(x)",
            "x{a=\"b\" or c=\"d\"}",
            "sum(rate(foo.bar[1m])) keep_metric_names",
            "x default 0",
            "foo\\-bar",
            "sum(x) limit 10",
            // What the daemon sends: a query with its data time asked for, and a folded one.
            "(sum(m{job=\"x\"})) or label_replace(min(timestamp(m{job=\"x\"})), \"watermarkd_sample\", \"time\", \"\", \"\")",
            "(sum by (dep) (m{job=\"x\",dep=~\"a|b\\\\.c\"})) or label_replace(min by (dep) (timestamp(m{job=\"x\",dep=~\"a|b\"})), \"watermarkd_sample\", \"time\", \"\", \"\")",
        ] {
            assert_eq!(syntax_problem(query), None, "{query}");
        }
    }

    #[test]
    fn what_every_dialect_refuses_is_said_with_its_place() {
        for (query, problem) in [
            (
                "sum(rate(http_requests_total{service=\"a\"[1m])",
                "the '[' at character 41 is inside the label matchers that '{' opened at character 29: is a '}' missing?",
            ),
            ("sum(rate(x[1m])", "the '(' at character 4 is never closed"),
            ("sum(x))", "the ')' at character 7 closes nothing"),
            ("sum(x]", "the '(' at character 4 is closed by ']' at character 6"),
            ("x{a=\"b\"", "the '{' at character 2 is never closed"),
            ("x{a=\"b}", "the string that starts at character 5 is not closed"),
            ("x{a='b}", "the string that starts at character 5 is not closed"),
            ("sum(x) /", "the '/' at character 8 has nothing after it"),
            ("sum(x) -", "the '-' at character 8 has nothing after it"),
            ("sum(x) and", "the 'and' at character 8 has nothing after it"),
            ("sum(x +)", "the '+' at character 7 is followed by ')' at character 8 instead of an operand"),
            ("topk(3 *, x)", "the '*' at character 8 is followed by ',' at character 9 instead of an operand"),
            ("* x", "the '*' at character 1 has no operand before it"),
            ("x + * y", "the '*' at character 5 has no operand before it"),
            ("(>= x)", "the '>=' at character 2 has no operand before it"),
            ("x or or y", "the 'or' at character 6 has no operand before it"),
            ("sum(\n  rate(x[1m]\n)", "the '(' on line 1 at column 4 is never closed"),
            ("rate(x[1m)", "the '[' at character 7 is closed by ')' at character 10"),
        ] {
            assert_eq!(syntax_problem(query).as_deref(), Some(problem), "{query}");
        }
    }

    proptest::proptest! {
        /// Any text, from PromQL's own characters and a few others, gets an answer and never a
        /// panic; a valid query with text appended after a comment stays valid.
        #[test]
        fn any_text_is_answered(text in "[a-z(){}\\[\\]\"'`,=!~<>+*/%^#@:. \n\\\\é$-]{0,40}") {
            let _ = syntax_problem(&text);
            let commented = format!("sum(rate(x[1m])) # {}", text.replace('\n', " "));
            proptest::prop_assert_eq!(syntax_problem(&commented), None);
        }
    }
}
