//! Typed reads from one table of the document tree. Every read reports its own problem (with
//! the key's line) and returns `None`, so that extraction goes on and finds the other problems
//! too. Keys that nobody read are reported as unknown by `finish`.

use std::sync::Arc;
use std::time::Duration;

use watermarkd_engine::Decimal;

use super::draft::{Field, Given, Origin};
use super::problem::{Sink, TableScope};
use super::quantity::parse_quantity;
use super::tree::{Entry, Kind, Node};

pub(crate) struct Table<'a> {
    entries: &'a [Entry],
    used: Vec<bool>,
    pub line: Option<usize>,
    pub scope: TableScope,
    /// `scope`'s label and separator, shared by the origins of this table's fields; made at
    /// the first one (a scope that changes, as a metric's when its name is read, is set
    /// before any).
    prefix: std::cell::OnceCell<Arc<str>>,
}

impl<'a> Table<'a> {
    /// Reads `node` as a table, or reports that it is not one.
    pub fn new(node: &'a Node, scope: TableScope, sink: &mut Sink) -> Option<Self> {
        match node.entries() {
            Some(entries) => Some(Table {
                entries,
                used: vec![false; entries.len()],
                line: node.line,
                scope,
                prefix: std::cell::OnceCell::new(),
            }),
            None => {
                sink.report_table(&scope, node.line, format!("must be a table, not {}", node.kind.describe()));
                None
            }
        }
    }

    fn position(&self, key: &str) -> Option<usize> {
        self.entries.iter().position(|e| e.key == key && !matches!(e.value.kind, Kind::Null))
    }

    pub fn has(&self, key: &str) -> bool {
        self.position(key).is_some()
    }

    /// The line of `key`, or of the table when the key is absent.
    pub fn line_of(&self, key: &str) -> Option<usize> {
        self.position(key).and_then(|i| self.entries.get(i)).and_then(|e| e.line).or(self.line)
    }

    /// Takes the entry for `key`, marking it as known. JSON `null` reads as absent.
    pub fn take(&mut self, key: &str) -> Option<&'a Entry> {
        // Null entries are marked too: a null under a known key is fine, under an unknown key
        // `finish` still reports it.
        for (i, entry) in self.entries.iter().enumerate() {
            if entry.key == key {
                if let Some(used) = self.used.get_mut(i) {
                    *used = true;
                }
            }
        }
        let entries: &'a [Entry] = self.entries;
        self.position(key).and_then(|i| entries.get(i))
    }

    /// Names this table's fields from now on as `scope` does.
    pub fn set_scope(&mut self, scope: TableScope) {
        self.scope = scope;
        self.prefix = std::cell::OnceCell::new();
    }

    /// Where `key` is written, or would be: its line, else the table's.
    pub fn origin(&self, key: &'static str) -> Origin {
        Origin::within(self.prefix(), key, self.line_of(key))
    }

    /// What precedes a key in the names of this table's fields, made once per table.
    fn prefix(&self) -> Option<Arc<str>> {
        if self.scope.label.is_empty() {
            return None;
        }
        let prefix = self.prefix.get_or_init(|| Arc::from(format!("{}{}", self.scope.label, self.scope.separator)));
        Some(Arc::clone(prefix))
    }

    /// What a read of `key` returned, as a draft's field: unreadable when the key is written
    /// but the read failed (and reported why).
    pub fn field<T>(&self, key: &'static str, value: Option<T>) -> Field<T> {
        let given = match value {
            Some(value) => Given::Value(value),
            None if self.has(key) => Given::Unreadable,
            None => Given::Absent,
        };
        Field { given, origin: self.origin(key) }
    }

    pub fn report(&self, sink: &mut Sink, key: &str, message: impl Into<String>) {
        sink.report(&self.scope, key, self.line_of(key), message);
    }

    fn type_error(&self, sink: &mut Sink, entry: &Entry, expected: &str) {
        let message = format!("must be {expected}, not {}", entry.value.kind.describe());
        sink.report(&self.scope, &entry.key, entry.line, message);
    }

    /// Reports `key` as missing when it is absent. `value` is what a read of it returned.
    pub fn require<T>(&self, sink: &mut Sink, key: &str, value: Option<T>) -> Option<T> {
        if value.is_none() && !self.has(key) {
            self.report(sink, key, "is required");
        }
        value
    }

    pub fn string(&mut self, sink: &mut Sink, key: &str) -> Option<String> {
        let entry = self.take(key)?;
        match &entry.value.kind {
            Kind::String(s) => Some(s.clone()),
            _ => {
                self.type_error(sink, entry, "a string");
                None
            }
        }
    }

    /// A string that must contain something other than spaces.
    pub fn text(&mut self, sink: &mut Sink, key: &str) -> Option<String> {
        let value = self.string(sink, key)?;
        nonempty(value).map_err(|message| self.report(sink, key, message)).ok()
    }

    pub fn flag(&mut self, sink: &mut Sink, key: &str) -> Option<bool> {
        let entry = self.take(key)?;
        match entry.value.kind {
            Kind::Bool(b) => Some(b),
            _ => {
                self.type_error(sink, entry, "true or false");
                None
            }
        }
    }

    /// A whole number from 0 to 4294967295 (percentages, request limits).
    pub fn count(&mut self, sink: &mut Sink, key: &str) -> Option<u32> {
        self.whole_number(sink, key, |value| whole_number_at_most(value, u32::MAX, ""))
    }

    /// A replica count: see [`replica_count`].
    pub fn replicas(&mut self, sink: &mut Sink, key: &str) -> Option<u32> {
        self.whole_number(sink, key, replica_count)
    }

    /// An integer, checked by `check`.
    fn whole_number(&mut self, sink: &mut Sink, key: &str, check: fn(i128) -> Result<u32, String>) -> Option<u32> {
        let entry = self.take(key)?;
        match entry.value.kind {
            Kind::Integer(i) => check(i).map_err(|message| sink.report(&self.scope, key, entry.line, message)).ok(),
            _ => {
                self.type_error(sink, entry, "a whole number");
                None
            }
        }
    }

    /// A plain number or a Kubernetes quantity string (`"400m"`), read exactly.
    pub fn number(&mut self, sink: &mut Sink, key: &str) -> Option<Decimal> {
        let entry = self.take(key)?;
        let result = match &entry.value.kind {
            Kind::Integer(i) => Ok(Decimal::from_parts(*i, 0)),
            Kind::Float(f) => Decimal::from_f64(*f).ok_or_else(|| format!("({f}) must be a finite number")),
            Kind::String(s) => parse_quantity(s).map_err(|e| format!("must be a number or a quantity: {e}")),
            _ => Err(format!(
                "must be a number or a Kubernetes quantity such as \"400m\", not {}",
                entry.value.kind.describe()
            )),
        };
        result.map_err(|message| sink.report(&self.scope, key, entry.line, message)).ok()
    }

    /// A duration string (`"30s"`, `"1m30s"`) or a whole number of seconds, at most
    /// [`MAX_DURATION`].
    pub fn duration(&mut self, sink: &mut Sink, key: &str) -> Option<Duration> {
        self.duration_at_most(sink, key, MAX_DURATION)
    }

    /// A duration as [`Table::duration`] reads it, at most `max`: every duration a file can
    /// give is bounded, so that no time computed from one can overflow.
    pub fn duration_at_most(&mut self, sink: &mut Sink, key: &str, max: Duration) -> Option<Duration> {
        let entry = self.take(key)?;
        let (result, written) = match &entry.value.kind {
            Kind::String(s) => (parse_duration(s), format!("{s:?}")),
            Kind::Integer(i) => (whole_seconds(*i), i.to_string()),
            _ => (
                Err(format!(
                    "must be a duration such as \"30s\", \"5m\", \"1m30s\" or a whole number of seconds, not {}",
                    entry.value.kind.describe()
                )),
                String::new(),
            ),
        };
        let result = result.and_then(|value| at_most(value, &written, max));
        result.map_err(|message| sink.report(&self.scope, key, entry.line, message)).ok()
    }

    /// One of a fixed set of words, read with the engine's own parser for that set.
    pub fn choice<T>(&mut self, sink: &mut Sink, key: &str, parse: fn(&str) -> Option<T>, allowed: &str) -> Option<T> {
        let value = self.string(sink, key)?;
        choose(&value, parse, allowed).map_err(|message| self.report(sink, key, message)).ok()
    }

    /// The table under `key`, read in a child scope.
    pub fn table(&mut self, sink: &mut Sink, key: &str) -> Option<Table<'a>> {
        let entry = self.take(key)?;
        let scope = self.scope.child(key);
        match entry.value.entries() {
            Some(entries) => Some(Table {
                entries,
                used: vec![false; entries.len()],
                line: entry.value.line,
                scope,
                prefix: std::cell::OnceCell::new(),
            }),
            None => {
                self.type_error(sink, entry, "a table");
                None
            }
        }
    }

    /// The list under `key`; `hint` says how to write it when it is something else.
    pub fn list(&mut self, sink: &mut Sink, key: &str, hint: &str) -> Option<&'a [Node]> {
        let entry = self.take(key)?;
        match &entry.value.kind {
            Kind::Array(items) => Some(items),
            _ => {
                self.type_error(sink, entry, &format!("a list ({hint})"));
                None
            }
        }
    }

    /// The entries under this table, for tables keyed by user-chosen names (`[backend.NAME]`).
    pub fn drain(&mut self) -> &'a [Entry] {
        self.used.iter_mut().for_each(|used| *used = true);
        self.entries
    }

    /// Reports every key that no read asked for, suggesting the closest known key.
    pub fn finish(&self, sink: &mut Sink, known: &[&str]) {
        for (entry, used) in self.entries.iter().zip(&self.used) {
            if *used {
                continue;
            }
            let message = match closest(&entry.key, known) {
                Some(guess) => format!("is not a known key (did you mean {guess}?)"),
                None => format!("is not a known key (known keys: {})", known.join(", ")),
            };
            sink.report(&self.scope, &entry.key, entry.line, message);
        }
    }
}

/// The longest duration any field of a rules file or a WPA takes (intervals, windows, delays,
/// retries, ages): one day. Fields with a tighter meaning (timeouts, the HPA's windows) have
/// their own, shorter bound.
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(86_400);

/// The largest replica count: `/scale` and the HPA take an int32.
pub(crate) const MAX_REPLICAS: u32 = i32::MAX.unsigned_abs();

// The values both readers take: a rules file's (through `Table`) and a WPA's (its typed
// fields, in `crate::domain::crd`), so that a value means the same and is refused with the same words
// whichever source gives it.

/// A text that must contain something other than spaces.
pub(crate) fn nonempty(value: String) -> Result<String, &'static str> {
    if value.trim().is_empty() {
        Err("must not be empty")
    } else {
        Ok(value)
    }
}

/// A whole number from 0 to `max`; `why` follows the bound in the problem.
pub(crate) fn whole_number_at_most(value: i128, max: u32, why: &str) -> Result<u32, String> {
    match u32::try_from(value) {
        Ok(count) if count <= max => Ok(count),
        _ => Err(format!("({value}) must be a whole number from 0 to {max}{why}")),
    }
}

/// A replica count (or a number of pods): from 0 to 2147483647, since `/scale` and the HPA
/// take an int32 and a larger count could never be written.
pub(crate) fn replica_count(value: i128) -> Result<u32, String> {
    whole_number_at_most(value, MAX_REPLICAS, " (the largest replica count Kubernetes takes)")
}

/// A duration written as a whole number of seconds.
fn whole_seconds(value: i128) -> Result<Duration, String> {
    u64::try_from(value)
        .map(Duration::from_secs)
        .map_err(|_| format!("({value}) must be a duration such as \"30s\" or a positive number of seconds"))
}

/// A duration of whole seconds, at most `max`.
pub(crate) fn seconds_at_most(value: i128, max: Duration) -> Result<Duration, String> {
    whole_seconds(value).and_then(|duration| at_most(duration, &value.to_string(), max))
}

/// `value`, written as `written`, when it is at most `max`.
fn at_most(value: Duration, written: &str, max: Duration) -> Result<Duration, String> {
    if value <= max {
        Ok(value)
    } else {
        Err(format!("({written}) must be at most {}", describe_bound(max)))
    }
}

/// One of a fixed set of words, read with the engine's own parser for that set; `allowed`
/// names the set in the problem.
pub(crate) fn choose<T>(value: &str, parse: fn(&str) -> Option<T>, allowed: &str) -> Result<T, String> {
    parse(value).ok_or_else(|| format!("({value:?}) must be {allowed}"))
}

/// `1h (3600s)`: a bound as a person reads it, with the seconds a WPA field would give.
pub(crate) fn describe_bound(max: Duration) -> String {
    format!("{} ({}s)", humantime::format_duration(max), max.as_secs())
}

pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|e| {
        format!("({text:?}) must be a duration such as \"30s\", \"5m\", \"1m30s\" or a whole number of seconds: {e}")
    })
}

/// The known key `key` is probably a typo of: within two edits (but not a rewrite of a short
/// key), or a known key that starts with it (`select` for `select_policy`).
fn closest<'k>(key: &str, known: &[&'k str]) -> Option<&'k str> {
    let typo = known
        .iter()
        .map(|k| (edit_distance(key, k), *k))
        .filter(|(d, _)| *d <= 2 && d * 2 < key.chars().count())
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k);
    typo.or_else(|| known.iter().copied().find(|k| key.len() >= 4 && k.starts_with(key)))
}

/// Levenshtein distance over characters, one row of the table at a time.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = Vec::with_capacity(previous.len());
        current.push(i + 1);
        // Each cell from its left neighbour (insert), the one above (delete) and the one
        // above-left (substitute): `previous` pairs the above-left with the above.
        for (cb, above) in b.iter().zip(previous.windows(2)) {
            let (&diagonal, &up) = (above.first().unwrap_or(&0), above.last().unwrap_or(&0));
            let left = current.last().copied().unwrap_or(0);
            current.push((diagonal + usize::from(ca != *cb)).min(left + 1).min(up + 1));
        }
        previous = current;
    }
    previous.last().copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::super::tree::from_toml;
    use super::*;

    fn read<T>(text: &str, f: impl FnOnce(&mut Table<'_>, &mut Sink) -> T) -> (T, Vec<String>) {
        let root = from_toml(text).unwrap();
        let mut sink = Sink::default();
        let mut table = Table::new(&root, TableScope::default(), &mut sink).unwrap();
        let value = f(&mut table, &mut sink);
        table.finish(&mut sink, &["a"]);
        (value, sink.into_sorted().iter().map(ToString::to_string).collect())
    }

    #[test]
    fn durations_are_strings_or_whole_seconds() {
        assert_eq!(read("a = \"1m30s\"", |t, s| t.duration(s, "a")).0, Some(Duration::from_secs(90)));
        assert_eq!(read("a = \"500ms\"", |t, s| t.duration(s, "a")).0, Some(Duration::from_millis(500)));
        assert_eq!(read("a = \"1h\"", |t, s| t.duration(s, "a")).0, Some(Duration::from_secs(3600)));
        assert_eq!(read("a = 45", |t, s| t.duration(s, "a")).0, Some(Duration::from_secs(45)));
        let (value, problems) = read("a = \"30 parsecs\"", |t, s| t.duration(s, "a"));
        assert_eq!(value, None);
        assert!(problems[0].starts_with("line 1: a (\"30 parsecs\") must be a duration"), "{problems:?}");
        let (_, problems) = read("a = -5", |t, s| t.duration(s, "a"));
        assert!(problems[0].contains("(-5) must be a duration"), "{problems:?}");
        let (_, problems) = read("a = 1.5", |t, s| t.duration(s, "a"));
        assert!(problems[0].contains("not a number (1.5)"), "{problems:?}");
    }

    #[test]
    fn numbers_accept_quantities_integers_and_floats() {
        let d = |s: &str| Decimal::parse(s).unwrap();
        assert_eq!(read("a = \"400m\"", |t, s| t.number(s, "a")).0, Some(d("0.4")));
        assert_eq!(read("a = 0.44", |t, s| t.number(s, "a")).0, Some(d("0.44")));
        assert_eq!(read("a = 50", |t, s| t.number(s, "a")).0, Some(d("50")));
        let (_, problems) = read("a = nan", |t, s| t.number(s, "a"));
        assert!(problems[0].contains("must be a finite number"), "{problems:?}");
        let (_, problems) = read("a = \"lots\"", |t, s| t.number(s, "a"));
        assert!(problems[0].contains("\"lots\" is not a Kubernetes quantity"), "{problems:?}");
        let (_, problems) = read("a = true", |t, s| t.number(s, "a"));
        assert!(problems[0].contains("not a boolean (true)"), "{problems:?}");
    }

    #[test]
    fn counts_reject_negatives_and_strings() {
        assert_eq!(read("a = 4", |t, s| t.count(s, "a")).0, Some(4));
        let (_, problems) = read("a = -1", |t, s| t.count(s, "a"));
        assert_eq!(problems, ["line 1: a (-1) must be a whole number from 0 to 4294967295"]);
        let (_, problems) = read("a = \"4\"", |t, s| t.count(s, "a"));
        assert_eq!(problems, ["line 1: a must be a whole number, not a string (\"4\")"]);
    }

    #[test]
    fn unknown_keys_are_named_with_a_suggestion() {
        let (_, problems) = read("\n\nb = 1\naaa = 2", |_, _| ());
        assert_eq!(
            problems,
            ["line 3: b is not a known key (known keys: a)", "line 4: aaa is not a known key (known keys: a)"]
        );
    }

    #[test]
    fn required_keys_are_reported_on_the_table_line() {
        let (_, problems) = read("", |t, s| {
            let v = t.string(s, "a");
            t.require(s, "a", v)
        });
        assert_eq!(problems, ["line 1: a is required"]);
    }

    #[test]
    fn edit_distance_counts_single_edits() {
        assert_eq!(edit_distance("hihg_watermark", "high_watermark"), 2);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(closest("tolerence", &["tolerance", "target"]), Some("tolerance"));
        assert_eq!(closest("zzz", &["tolerance"]), None);
        assert_eq!(closest("b", &["a"]), None);
        assert_eq!(closest("select", &["stabilization_window", "select_policy"]), Some("select_policy"));
        assert_eq!(closest("ab", &["abc"]), None);
    }
}
