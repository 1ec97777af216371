//! A v1 answer's series read as the body is parsed, one at a time, keeping of each only what the
//! caller gathers of its points (`PointSink`): for a live query the few points the rule looks at
//! (`PointSummary`), for a backtest every point. The answer is never held as a JSON tree, which
//! cost about ten times the body (a 15 MiB answer took 150 MB).
//!
//! Each series is read leniently: a field of the wrong type makes that series unreadable (its
//! query's observation says why), never the whole answer; only a body that is not JSON, or whose
//! top-level fields have the wrong type, fails as a whole.

use std::fmt;
use std::io::{BufReader, Read};
use std::marker::PhantomData;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// Starts every mark, as read back: a value position never holds a string in a real answer,
/// let alone one starting with a NUL, so a mark cannot be mistaken for data.
pub(super) const MARK: &str = "\u{0}watermarkd-not-a-number:";
/// `MARK` as written into the body (JSON escapes the NUL).
const MARK_JSON: &str = "\\u0000watermarkd-not-a-number:";

/// What an answer says besides its series.
#[derive(Debug, Default)]
pub(super) struct Envelope {
    pub status: Option<String>,
    pub error: Option<String>,
    /// Whether it has a `series` list (even an empty one).
    pub has_series: bool,
}

/// A series' `query_index` as written.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum QueryIndex {
    /// Absent or null.
    Absent,
    Index(u64),
    /// Anything else, as JSON would write it.
    Invalid(String),
}

/// One series as read: how it maps to its query, and its points as `P` gathers them (or why
/// they cannot be read).
#[derive(Debug)]
pub(super) struct Series<P> {
    pub query_index: QueryIndex,
    /// `tag_set` when it is a list (its strings), else `scope` split at commas; empty when the
    /// series has neither.
    pub tags: Vec<String>,
    pub read: Result<Readout<P>, String>,
}

#[derive(Clone, Debug, PartialEq)]
pub(super) struct Readout<P> {
    /// The rollup in seconds, as written.
    pub interval: Option<f64>,
    pub points: P,
}

/// One point's value as written.
#[derive(Debug, PartialEq)]
pub(super) enum PointValue {
    Number(f64),
    Null,
    /// A string: in a real answer, only the mark of a token that is not a number
    /// ([`mark_non_numbers`]); the text without the mark.
    NotANumber(String),
}

/// Gathers a series' points as they are read.
pub(super) trait PointSink: Default {
    fn point(&mut self, ms: f64, value: PointValue);
}

/// Every point of a series, `(ms, value)`, `None` where the value is null or not a number: a
/// backtest reads them all.
pub(super) type AllPoints = Vec<(f64, Option<f64>)>;

impl PointSink for AllPoints {
    fn point(&mut self, ms: f64, value: PointValue) {
        let value = match value {
            PointValue::Number(v) => Some(v).filter(|v| v.is_finite()),
            PointValue::Null | PointValue::NotANumber(_) => None,
        };
        self.push((ms, value));
    }
}

/// What the live rule needs of a series' points: how many are not null, the last two of those,
/// the time of the last point (null or not), and the first value that is not a number. Nothing
/// else of a pointlist is kept, however long.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct PointSummary {
    pub non_null: usize,
    /// The non-null point before `last`.
    pub previous: Option<(f64, f64)>,
    /// The last non-null point.
    pub last: Option<(f64, f64)>,
    /// The time of the last point, null or not.
    pub last_ms: Option<f64>,
    pub not_a_number: Option<String>,
}

impl PointSink for PointSummary {
    fn point(&mut self, ms: f64, value: PointValue) {
        self.last_ms = Some(ms);
        match value {
            PointValue::Number(v) => {
                self.non_null += 1;
                self.previous = self.last.replace((ms, v));
            }
            PointValue::Null => {}
            PointValue::NotANumber(token) => {
                self.not_a_number.get_or_insert(token);
            }
        }
    }
}

/// Reads `body` as a v1 answer, handing each series to `each` as soon as it is read.
pub(super) fn read<P: PointSink>(body: &[u8], each: impl FnMut(Series<P>)) -> Result<Envelope, serde_json::Error> {
    let seed = AnswerSeed { each, points: PhantomData };
    if needs_marking(body) {
        let mut deserializer = serde_json::Deserializer::from_reader(BufReader::new(Marking::new(body)));
        let envelope = seed.deserialize(&mut deserializer)?;
        deserializer.end()?;
        Ok(envelope)
    } else {
        let mut deserializer = serde_json::Deserializer::from_slice(body);
        let envelope = seed.deserialize(&mut deserializer)?;
        deserializer.end()?;
        Ok(envelope)
    }
}

// ---------------------------------------------------------------------------------------------
// Tokens that are not JSON numbers

/// Python's `json` (and so some proxies and Datadog's own stack now and then) writes `NaN`,
/// `Infinity` and `-Infinity` as bare tokens, and a number beyond f64 (`1e999`) is valid JSON
/// that serde_json refuses. Either would make the whole body unreadable, failing every query of
/// the request for one bad value. So, outside strings, each such token is read as a JSON string
/// holding `MARK` and the token as written, which a point's value then reads as "not a number"
/// for that point only. Everything else, numbers included, is read byte for byte. The token is
/// taken as the longest run of characters that may continue a JSON number or literal
/// (`[A-Za-z0-9+-.]`) after a `-` or a letter or digit.
///
/// Whether `body` holds such a token: only then is it read through [`Marking`], which is slower
/// than reading the bytes in place.
fn needs_marking(body: &[u8]) -> bool {
    let mut scan = Scan::default();
    while let Some(step) = scan.next(body) {
        if let Step::Token { start, end } = step {
            if is_non_number(body.get(start..end).unwrap_or_default()) {
                return true;
            }
        }
    }
    false
}

/// `NaN`, `Infinity` and their signed forms, or a number too large for f64.
fn is_non_number(token: &[u8]) -> bool {
    let unsigned = token.strip_prefix(b"-").or_else(|| token.strip_prefix(b"+")).unwrap_or(token);
    if matches!(unsigned, b"NaN" | b"nan" | b"Infinity" | b"inf" | b"Inf") {
        return true;
    }
    let looks_numeric = unsigned.first().is_some_and(u8::is_ascii_digit)
        && unsigned.iter().all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'));
    looks_numeric
        && std::str::from_utf8(token).ok().and_then(|t| t.parse::<f64>().ok()).is_some_and(|f| f.is_infinite())
}

/// A walk over a body's bytes that tells strings (with their escapes) from tokens.
#[derive(Default)]
struct Scan {
    at: usize,
    in_string: bool,
}

/// What the next bytes of the body are.
enum Step {
    /// `body[start..end]`: bytes to keep as they are (in a string, or punctuation).
    Verbatim { start: usize, end: usize },
    /// `body[start..end]`: a token outside strings (a number, a literal, or what is not JSON).
    Token { start: usize, end: usize },
}

impl Scan {
    fn next(&mut self, body: &[u8]) -> Option<Step> {
        let start = self.at;
        let &byte = body.get(start)?;
        if self.in_string {
            match byte {
                // The escaped byte goes with its backslash (the end may pass the body's).
                b'\\' => self.at += 2,
                b'"' => {
                    self.in_string = false;
                    self.at += 1;
                }
                _ => self.at += 1,
            }
            return Some(Step::Verbatim { start, end: self.at.min(body.len()) });
        }
        if byte == b'"' {
            self.in_string = true;
            self.at += 1;
            return Some(Step::Verbatim { start, end: self.at });
        }
        if !(byte == b'-' || byte.is_ascii_alphanumeric()) {
            self.at += 1;
            return Some(Step::Verbatim { start, end: self.at });
        }
        while body.get(self.at).is_some_and(|&b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.')) {
            self.at += 1;
        }
        Some(Step::Token { start, end: self.at })
    }
}

/// The body as read, each token that is not a number (see [`needs_marking`]) replaced by a
/// string holding `MARK` and the token.
struct Marking<'a> {
    body: &'a [u8],
    scan: Scan,
    /// What is to be read next, before the rest of the body, and how much of it was read.
    pending: Vec<u8>,
    pending_at: usize,
}

impl<'a> Marking<'a> {
    fn new(body: &'a [u8]) -> Self {
        Marking { body, scan: Scan::default(), pending: Vec::new(), pending_at: 0 }
    }
}

impl Read for Marking<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let mut written = 0;
        loop {
            let pending = self.pending.get(self.pending_at..).unwrap_or_default();
            let room = buf.get_mut(written..).unwrap_or_default();
            let n = pending.len().min(room.len());
            if let (Some(to), Some(from)) = (room.get_mut(..n), pending.get(..n)) {
                to.copy_from_slice(from);
            }
            written += n;
            self.pending_at += n;
            if written == buf.len() {
                return Ok(written);
            }
            self.pending.clear();
            self.pending_at = 0;
            let (start, end, mark) = match self.scan.next(self.body) {
                None => return Ok(written),
                Some(Step::Verbatim { start, end }) => (start, end, false),
                Some(Step::Token { start, end }) => {
                    (start, end, is_non_number(self.body.get(start..end).unwrap_or_default()))
                }
            };
            let bytes = self.body.get(start..end).unwrap_or_default();
            if mark {
                self.pending.push(b'"');
                self.pending.extend_from_slice(MARK_JSON.as_bytes());
                // Only ASCII letters, digits, `+`, `-` and `.`: nothing to escape.
                self.pending.extend_from_slice(bytes);
                self.pending.push(b'"');
            } else {
                self.pending.extend_from_slice(bytes);
            }
        }
    }
}

/// `body` with every token that is not a number marked, or `None` when none is: what
/// [`Marking`] reads, whole.
#[cfg(test)]
pub(super) fn mark_non_numbers(body: &[u8]) -> Option<Vec<u8>> {
    if !needs_marking(body) {
        return None;
    }
    let mut out = Vec::new();
    Marking::new(body).read_to_end(&mut out).ok()?;
    Some(out)
}

// ---------------------------------------------------------------------------------------------
// The answer

struct AnswerSeed<P, F> {
    each: F,
    points: PhantomData<P>,
}

impl<'de, P: PointSink, F: FnMut(Series<P>)> DeserializeSeed<'de> for AnswerSeed<P, F> {
    type Value = Envelope;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Envelope, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de, P: PointSink, F: FnMut(Series<P>)> Visitor<'de> for AnswerSeed<P, F> {
    type Value = Envelope;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a v1 query answer (an object with `status` and `series`)")
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<Envelope, A::Error> {
        let mut envelope = Envelope::default();
        let (mut status, mut error, mut series) = (false, false, false);
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            let seen = match key.as_ref() {
                "status" => {
                    envelope.status = map.next_value()?;
                    std::mem::replace(&mut status, true)
                }
                "error" => {
                    envelope.error = map.next_value()?;
                    std::mem::replace(&mut error, true)
                }
                "series" => {
                    envelope.has_series =
                        map.next_value_seed(SeriesListSeed { each: &mut self.each, points: PhantomData })?;
                    std::mem::replace(&mut series, true)
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                    false
                }
            };
            if seen {
                return Err(de::Error::custom(format_args!("duplicate field `{key}`")));
            }
        }
        Ok(envelope)
    }
}

/// `series`: `null` (false) or a list whose series go to `each` (true).
struct SeriesListSeed<'f, P, F> {
    each: &'f mut F,
    points: PhantomData<P>,
}

impl<'de, P: PointSink, F: FnMut(Series<P>)> DeserializeSeed<'de> for SeriesListSeed<'_, P, F> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de, P: PointSink, F: FnMut(Series<P>)> Visitor<'de> for SeriesListSeed<'_, P, F> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of series")
    }

    fn visit_none<E: de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_unit<E: de::Error>(self) -> Result<bool, E> {
        Ok(false)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_seq(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        while let Some(series) = seq.next_element_seed(SeriesSeed::<P>(PhantomData))? {
            (self.each)(series);
        }
        Ok(true)
    }
}

/// One series, whatever its shape.
struct SeriesSeed<P>(PhantomData<P>);

impl<'de, P: PointSink> DeserializeSeed<'de> for SeriesSeed<P> {
    type Value = Series<P>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Series<P>, D::Error> {
        match deserializer.deserialize_any(LenientSeries::<P>(PhantomData))? {
            Ok(series) => Ok(series),
            Err(shape) => Ok(Series {
                query_index: QueryIndex::Absent,
                tags: Vec::new(),
                read: Err(format!("{shape}, not a series object")),
            }),
        }
    }
}

/// A series object, or what else stood in its place (drained).
struct LenientSeries<P>(PhantomData<P>);

impl<'de, P: PointSink> Visitor<'de> for LenientSeries<P> {
    type Value = Result<Series<P>, String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a series")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut query_index = QueryIndex::Absent;
        let (mut tag_set, mut scope) = (None, None);
        let mut interval: Result<Option<f64>, String> = Ok(None);
        let mut pointlist: Option<Result<P, String>> = None;
        // A key written twice counts as the last one, as a JSON object read into a map does.
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match key.as_ref() {
                "query_index" => {
                    query_index = match map.next_value_seed(AnyScalar)? {
                        Scalar::Null => QueryIndex::Absent,
                        Scalar::U64(i) => QueryIndex::Index(i),
                        other => QueryIndex::Invalid(other.as_json()),
                    }
                }
                "tag_set" => tag_set = map.next_value_seed(TagSetSeed)?,
                "scope" => {
                    scope = match map.next_value_seed(AnyScalar)? {
                        Scalar::Str(scope) => Some(scope),
                        _ => None,
                    }
                }
                "interval" => {
                    interval = match map.next_value_seed(AnyScalar)? {
                        Scalar::Null => Ok(None),
                        other => other.number().map(Some).ok_or_else(|| other.invalid("interval", "a number")),
                    }
                }
                "pointlist" => pointlist = Some(map.next_value_seed(PointListSeed::<P>(PhantomData))?),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let tags = match (tag_set, scope) {
            (Some(tags), _) => tags,
            (None, Some(scope)) => scope.split(',').map(|t| t.trim().to_string()).collect(),
            (None, None) => Vec::new(),
        };
        let points = pointlist.unwrap_or_else(|| Err("missing field `pointlist`".to_string()));
        let read = interval.and_then(|interval| Ok(Readout { interval, points: points? }));
        Ok(Ok(Series { query_index, tags, read }))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        drain_seq(seq)?;
        Ok(Err("a list".to_string()))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
        Ok(Err(Scalar::Bool(v).as_json()))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Err(Scalar::I64(v).as_json()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Err(Scalar::U64(v).as_json()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        Ok(Err(Scalar::F64(v).as_json()))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Err(Scalar::Str(v.to_string()).as_json()))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Err("null".to_string()))
    }
}

/// `tag_set`: its strings when it is a list (anything else in it skipped), `None` otherwise.
struct TagSetSeed;

impl<'de> DeserializeSeed<'de> for TagSetSeed {
    type Value = Option<Vec<String>>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TagSetSeed {
    type Value = Option<Vec<String>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of tags")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut tags = Vec::new();
        while let Some(tag) = seq.next_element_seed(AnyScalar)? {
            if let Scalar::Str(tag) = tag {
                tags.push(tag);
            }
        }
        Ok(Some(tags))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        drain_map(map)?;
        Ok(None)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

/// `pointlist`: `[[ms, value], ...]` into a `P`, or why it is not one.
struct PointListSeed<P>(PhantomData<P>);

impl<'de, P: PointSink> DeserializeSeed<'de> for PointListSeed<P> {
    type Value = Result<P, String>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        match deserializer.deserialize_any(AnyShape { seq: self })? {
            Shape::Seq(points) => Ok(points),
            Shape::Other(other) => Ok(Err(other.invalid("pointlist", "a list of [time, value] points"))),
        }
    }
}

impl<'de, P: PointSink> SeqVisitor<'de> for PointListSeed<P> {
    type Output = Result<P, String>;

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Output, A::Error> {
        let mut points = P::default();
        let mut bad: Option<String> = None;
        while let Some(point) = seq.next_element_seed(PointSeed)? {
            match point {
                // After one point that cannot be read, the rest are only checked to be JSON.
                Ok((ms, value)) if bad.is_none() => points.point(ms, value),
                Ok(_) => {}
                Err(why) => {
                    bad.get_or_insert(why);
                }
            }
        }
        match bad {
            Some(why) => Ok(Err(why)),
            None => Ok(Ok(points)),
        }
    }
}

/// One point, `[ms, value]`: ms a number, value a number, null or a string (a mark).
struct PointSeed;

impl<'de> DeserializeSeed<'de> for PointSeed {
    type Value = Result<(f64, PointValue), String>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        match deserializer.deserialize_any(AnyShape { seq: self })? {
            Shape::Seq(point) => Ok(point),
            Shape::Other(other) => Ok(Err(other.invalid("point", "a [time, value] pair"))),
        }
    }
}

impl<'de> SeqVisitor<'de> for PointSeed {
    type Output = Result<(f64, PointValue), String>;

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Output, A::Error> {
        let time = seq.next_element_seed(AnyScalar)?;
        let value = match time {
            Some(_) => seq.next_element_seed(AnyScalar)?,
            None => None,
        };
        let extra = match value {
            Some(_) => drain_seq(seq)?,
            None => 0,
        };
        let (Some(time), Some(value), 0) = (time, value, extra) else {
            return Ok(Err("a point that is not a [time, value] pair".to_string()));
        };
        let Some(ms) = time.number() else { return Ok(Err(time.invalid("point time", "a number"))) };
        let value = match value {
            Scalar::Null => PointValue::Null,
            Scalar::Str(text) => PointValue::NotANumber(text.strip_prefix(MARK).unwrap_or(&text).to_string()),
            other => match other.number() {
                Some(v) => PointValue::Number(v),
                None => return Ok(Err(other.invalid("point value", "a number or null"))),
            },
        };
        Ok(Ok((ms, value)))
    }
}

// ---------------------------------------------------------------------------------------------
// Reading anything without failing on its type

/// A JSON value reduced to what a lenient reader needs: scalars as they are, containers only by
/// kind (their contents are read through and dropped).
#[derive(Clone, Debug, PartialEq)]
enum Scalar {
    Null,
    Bool(bool),
    U64(u64),
    I64(i64),
    F64(f64),
    Str(String),
    List,
    Object,
}

impl Scalar {
    fn number(&self) -> Option<f64> {
        match *self {
            // As serde reads an integer into an f64.
            Scalar::U64(v) => Some(v as f64),
            Scalar::I64(v) => Some(v as f64),
            Scalar::F64(v) => Some(v),
            _ => None,
        }
    }

    /// As JSON writes it, containers by kind.
    fn as_json(&self) -> String {
        match self {
            Scalar::Null => "null".to_string(),
            Scalar::Bool(v) => v.to_string(),
            Scalar::U64(v) => v.to_string(),
            Scalar::I64(v) => v.to_string(),
            Scalar::F64(v) => serde_json::Number::from_f64(*v).map_or_else(|| v.to_string(), |n| n.to_string()),
            Scalar::Str(v) => serde_json::to_string(v).unwrap_or_default(),
            Scalar::List => "a list".to_string(),
            Scalar::Object => "an object".to_string(),
        }
    }

    /// Why `what` cannot be this, for the series' error.
    fn invalid(&self, what: &str, expected: &str) -> String {
        let mut shown = self.as_json();
        if shown.len() > 40 {
            shown = format!("{}...", shown.chars().take(40).collect::<String>());
        }
        format!("{what} {shown} is not {expected}")
    }
}

struct AnyScalar;

impl<'de> DeserializeSeed<'de> for AnyScalar {
    type Value = Scalar;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Scalar, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for AnyScalar {
    type Value = Scalar;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Scalar, E> {
        Ok(Scalar::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar, E> {
        Ok(Scalar::I64(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
        Ok(Scalar::U64(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Scalar, E> {
        Ok(Scalar::F64(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar, E> {
        Ok(Scalar::Str(v.to_string()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Scalar, E> {
        Ok(Scalar::Str(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Scalar, E> {
        Ok(Scalar::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Scalar, A::Error> {
        drain_seq(seq)?;
        Ok(Scalar::List)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Scalar, A::Error> {
        drain_map(map)?;
        Ok(Scalar::Object)
    }
}

/// What reads a list its own way; anything else stands as a [`Scalar`].
trait SeqVisitor<'de> {
    type Output;
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Output, A::Error>;
}

enum Shape<T> {
    Seq(T),
    Other(Scalar),
}

/// A list read by `seq`, or any other value as a [`Scalar`].
struct AnyShape<S> {
    seq: S,
}

impl<'de, S: SeqVisitor<'de>> Visitor<'de> for AnyShape<S> {
    type Value = Shape<S::Output>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        Ok(Shape::Seq(self.seq.visit_seq(seq)?))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        AnyScalar.visit_map(map).map(Shape::Other)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
        Ok(Shape::Other(Scalar::Bool(v)))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Shape::Other(Scalar::I64(v)))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Shape::Other(Scalar::U64(v)))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        Ok(Shape::Other(Scalar::F64(v)))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Shape::Other(Scalar::Str(v.to_string())))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Shape::Other(Scalar::Null))
    }
}

/// Reads a list through, keeping nothing; how many elements it had.
fn drain_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<usize, A::Error> {
    let mut count = 0;
    while seq.next_element::<IgnoredAny>()?.is_some() {
        count += 1;
    }
    Ok(count)
}

fn drain_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary_of(body: &str) -> (Envelope, Vec<Series<PointSummary>>) {
        let mut all = Vec::new();
        let envelope = read(body.as_bytes(), |s| all.push(s)).unwrap();
        (envelope, all)
    }

    #[test]
    fn a_summary_keeps_the_last_two_non_null_points_and_the_first_non_number() {
        let (envelope, series) = summary_of(
            r#"{"series":[{"query_index":1,"interval":30,"tag_set":["a:b",3,"c:d"],"scope":"x:y",
                "pointlist":[[1,1.5],[2,null],[3,NaN],[4,2.5],[5,Infinity],[6,3],[7,null]]}],"status":"ok"}"#,
        );
        assert_eq!(envelope.status.as_deref(), Some("ok"));
        assert!(envelope.has_series);
        let [one] = series.as_slice() else { panic!("{series:?}") };
        assert_eq!(one.query_index, QueryIndex::Index(1));
        assert_eq!(one.tags, ["a:b", "c:d"]);
        let readout = one.read.as_ref().unwrap();
        assert_eq!(readout.interval, Some(30.0));
        assert_eq!(
            readout.points,
            PointSummary {
                non_null: 3,
                previous: Some((4.0, 2.5)),
                last: Some((6.0, 3.0)),
                last_ms: Some(7.0),
                not_a_number: Some("NaN".into()),
            }
        );
    }

    #[test]
    fn a_series_of_the_wrong_shape_is_unreadable_alone() {
        let (_, series) = summary_of(
            r#"{"status":"ok","series":[
                {"query_index":0,"pointlist":"oops"},
                {"query_index":1,"pointlist":[[1,true]]},
                {"query_index":2,"pointlist":[[1,2,3]]},
                {"query_index":3,"pointlist":[["1",2]]},
                {"query_index":4,"interval":"30","pointlist":[]},
                {"query_index":5},
                {"query_index":6.5,"scope":"a:b, c:d","pointlist":[]},
                7,
                {"query_index":null,"tag_set":{"a":1},"scope":["x"],"pointlist":[[1,{"v":[1]}],[2,2]]}]}"#,
        );
        let reads: Vec<Option<&str>> = series.iter().map(|s| s.read.as_ref().err().map(String::as_str)).collect();
        assert_eq!(
            reads,
            [
                Some("pointlist \"oops\" is not a list of [time, value] points"),
                Some("point value true is not a number or null"),
                Some("a point that is not a [time, value] pair"),
                Some("point time \"1\" is not a number"),
                Some("interval \"30\" is not a number"),
                Some("missing field `pointlist`"),
                None,
                Some("7, not a series object"),
                Some("point value an object is not a number or null"),
            ]
        );
        assert_eq!(series[6].query_index, QueryIndex::Invalid("6.5".into()));
        assert_eq!(series[6].tags, ["a:b", "c:d"]);
        assert_eq!(series[8].query_index, QueryIndex::Absent);
        assert!(series[8].tags.is_empty());
    }

    #[test]
    fn the_envelope_is_read_strictly() {
        let fails = |body: &str| read::<PointSummary>(body.as_bytes(), |_| {}).is_err();
        assert!(fails(r#"{"status":5,"series":[]}"#));
        assert!(fails(r#"{"status":"ok","status":"ok","series":[]}"#));
        assert!(fails(r#"{"status":"ok","series":{}}"#));
        assert!(fails(r#"{"status":"ok","series":[]} trailing"#));
        assert!(fails(r#"{"status":"ok","series":[{"pointlist":[[1,2]}]}"#), "not JSON");
        assert!(fails("[]"));
        let (envelope, series) = summary_of(r#"{"status":"ok","series":null,"error":null,"other":{"x":[1]}}"#);
        assert!(!envelope.has_series && envelope.error.is_none() && series.is_empty());
    }

    #[test]
    fn every_point_for_a_backtest() {
        let mut all: Vec<Series<AllPoints>> = Vec::new();
        read(br#"{"series":[{"pointlist":[[1,1.5],[2,null],[3,-Infinity],[4,1e999],[5,2]]}]}"#, |s| all.push(s))
            .unwrap();
        let points = &all[0].read.as_ref().unwrap().points;
        assert_eq!(points, &[(1.0, Some(1.5)), (2.0, None), (3.0, None), (4.0, None), (5.0, Some(2.0))]);
    }

    #[test]
    fn marking_reads_the_same_through_any_buffer_size() {
        let body = br#"{"a":[NaN,-Infinity,1e999,"1e999 \" NaN",2,nan],"b":"\\"}"#;
        let whole = mark_non_numbers(body).unwrap();
        for size in 1..8 {
            let mut reader = Marking::new(body);
            let mut out = Vec::new();
            let mut buf = vec![0u8; size];
            loop {
                let n = reader.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                out.extend_from_slice(&buf[..n]);
            }
            assert_eq!(out, whole, "{size}");
        }
    }
}
