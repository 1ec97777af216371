//! Metric traces: a CSV file with one row per observation time.
//!
//! ```text
//! timestamp,latency_seconds,replicas
//! 2024-05-01T00:00:00Z,0.21,3
//! 2024-05-01T00:00:15Z,0.19,
//! 2024-05-01T00:00:30Z,,
//! ```
//!
//! The first column is the time (RFC 3339, or Unix seconds), then one column per metric of the
//! rule, named as the rule names it, in any order. An optional `replicas` column records a
//! replica count a person set at that time. An empty metric cell means the backend had no data
//! at that time. The format is deliberately plain (no quoting, no embedded commas) because every
//! cell is a number or a time; parsing it by hand keeps the dependency list short.

use watermarkd_engine::{Reading, Timestamp};

/// The column holding a replica count a person set; every other column is a metric.
pub const REPLICAS_COLUMN: &str = "replicas";
/// The first column.
pub const TIMESTAMP_COLUMN: &str = "timestamp";
/// Why a metric is unavailable when its cell is empty.
pub const NO_DATA_REASON: &str = "no data in trace";

/// A parsed trace, rows in time order.
#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    /// Metric names in the order of the rule's metrics (not of the CSV columns).
    pub metric_names: Vec<String>,
    pub rows: Vec<TraceRow>,
}

/// One CSV row.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceRow {
    /// 1-based line number in the file, for messages.
    pub line: usize,
    pub at: Timestamp,
    /// One cell per metric, in rule order; `None` is an empty cell.
    pub values: Vec<Option<f64>>,
    /// A replica count a person set at this time.
    pub replicas: Option<u32>,
}

impl TraceRow {
    /// A row that only records a manual replica change says nothing about the metrics, so it
    /// must not turn them unavailable.
    fn carries_metric_data(&self) -> bool {
        self.values.iter().any(Option::is_some) || self.replicas.is_none()
    }
}

/// A problem with a trace file, with the line it is on when there is one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TraceError {
    #[error("the file is empty: expected a header row starting with `timestamp`")]
    Empty,
    #[error("no data rows after the header")]
    NoRows,
    #[error("line {line}: {message}")]
    Line { line: usize, message: String },
}

impl TraceError {
    fn at(line: usize, message: impl Into<String>) -> Self {
        TraceError::Line { line, message: message.into() }
    }
}

/// Where each CSV column goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Column {
    Timestamp,
    /// Index into the rule's metrics.
    Metric(usize),
    Replicas,
}

/// Parses a trace for a rule whose metrics are `metric_names` (in rule order).
pub fn parse_trace(text: &str, metric_names: &[String]) -> Result<Trace, TraceError> {
    // Blank lines (a trailing newline, a spreadsheet's empty last row) are not data.
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l)).filter(|(_, l)| !l.trim().is_empty());
    let (header_line, header) = lines.next().ok_or(TraceError::Empty)?;
    let columns = parse_header(header_line, header, metric_names)?;

    let mut rows: Vec<TraceRow> = Vec::new();
    for (line, text) in lines {
        let row = parse_row(line, text, &columns, metric_names)?;
        if let Some(previous) = rows.last() {
            if row.at <= previous.at {
                return Err(TraceError::at(
                    line,
                    format!(
                        "timestamp {} is not after {} on line {}: rows must be in increasing time order",
                        row.at, previous.at, previous.line
                    ),
                ));
            }
        }
        rows.push(row);
    }
    if rows.is_empty() {
        return Err(TraceError::NoRows);
    }
    Ok(Trace { metric_names: metric_names.to_vec(), rows })
}

fn split_cells(text: &str) -> impl Iterator<Item = &str> {
    text.split(',').map(|cell| {
        let cell = cell.trim();
        // Spreadsheets quote cells they consider text; the content is still a plain value.
        cell.strip_prefix('"').and_then(|c| c.strip_suffix('"')).unwrap_or(cell).trim()
    })
}

fn parse_header(line: usize, text: &str, metric_names: &[String]) -> Result<Vec<Column>, TraceError> {
    // A UTF-8 byte order mark is what spreadsheet exports put before the first header.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let expected = || {
        let mut names = vec![TIMESTAMP_COLUMN.to_string()];
        names.extend(metric_names.iter().cloned());
        format!("{} (and optionally {REPLICAS_COLUMN})", names.join(","))
    };
    let names: Vec<&str> = split_cells(text).collect();
    let first = names.first().copied().unwrap_or_default();
    if first != TIMESTAMP_COLUMN {
        return Err(TraceError::at(
            line,
            format!("the first column must be `{TIMESTAMP_COLUMN}`, found `{first}`; expected columns: {}", expected()),
        ));
    }
    let mut columns = Vec::with_capacity(names.len());
    for (index, name) in names.iter().enumerate() {
        let column = if index == 0 {
            Column::Timestamp
        } else if *name == REPLICAS_COLUMN {
            Column::Replicas
        } else if let Some(metric) = metric_names.iter().position(|m| m == name) {
            Column::Metric(metric)
        } else if name.is_empty() {
            return Err(TraceError::at(
                line,
                format!("column {} has no name; expected columns: {}", index + 1, expected()),
            ));
        } else {
            return Err(TraceError::at(
                line,
                format!("unknown column `{name}`: the rule has no such metric; expected columns: {}", expected()),
            ));
        };
        if columns.contains(&column) {
            return Err(TraceError::at(line, format!("column `{name}` appears twice")));
        }
        columns.push(column);
    }
    let missing: Vec<&str> = metric_names
        .iter()
        .enumerate()
        .filter(|(i, _)| !columns.contains(&Column::Metric(*i)))
        .map(|(_, name)| name.as_str())
        .collect();
    if !missing.is_empty() {
        let plural = if missing.len() == 1 { "" } else { "s" };
        return Err(TraceError::at(
            line,
            format!(
                "missing column{plural} `{}` for the rule's metric{plural}; expected columns: {}",
                missing.join("`, `"),
                expected()
            ),
        ));
    }
    Ok(columns)
}

fn parse_row(line: usize, text: &str, columns: &[Column], metric_names: &[String]) -> Result<TraceRow, TraceError> {
    let cells: Vec<&str> = split_cells(text).collect();
    if cells.len() != columns.len() {
        return Err(TraceError::at(
            line,
            format!("expected {} cells like the header, found {}", columns.len(), cells.len()),
        ));
    }
    let mut row =
        TraceRow { line, at: Timestamp::from_unix_millis(0), values: vec![None; metric_names.len()], replicas: None };
    for (column, cell) in columns.iter().zip(&cells) {
        match *column {
            Column::Timestamp => row.at = parse_timestamp(cell).map_err(|message| TraceError::at(line, message))?,
            Column::Metric(index) => {
                // The header names a metric per column, and the row has a value per metric.
                let (Some(name), Some(slot)) = (metric_names.get(index), row.values.get_mut(index)) else { continue };
                if cell.is_empty() {
                    continue;
                }
                let value: f64 =
                    cell.parse().map_err(|_| TraceError::at(line, format!("{name}: {cell:?} is not a number")))?;
                if !value.is_finite() {
                    return Err(TraceError::at(
                        line,
                        format!("{name}: {cell:?} is not a finite number (leave the cell empty for no data)"),
                    ));
                }
                *slot = Some(value);
            }
            Column::Replicas => {
                if cell.is_empty() {
                    continue;
                }
                let replicas = cell.parse().map_err(|_| {
                    TraceError::at(
                        line,
                        format!("{REPLICAS_COLUMN}: {cell:?} is not a replica count (a whole number >= 0)"),
                    )
                })?;
                row.replicas = Some(replicas);
            }
        }
    }
    Ok(row)
}

/// Reads `2024-05-01T12:00:00Z`, `2024-05-01T14:00:00+02:00`, `2024-05-01 12:00:00` (UTC) or
/// Unix seconds (`1714564800`, `1714564800.5`).
pub fn parse_timestamp(text: &str) -> Result<Timestamp, String> {
    let invalid = || format!("timestamp {text:?} is neither RFC 3339 (2024-05-01T12:00:00Z) nor Unix seconds");
    if text.is_empty() {
        return Err("the timestamp is empty".into());
    }
    if let Ok(seconds) = text.parse::<f64>() {
        return Timestamp::from_unix_seconds_f64(seconds).ok_or_else(invalid);
    }
    // humantime reads `Z` (and no zone, as UTC) but not numeric offsets, which exports from
    // local-time tools carry; apply the offset here.
    let (local, offset_seconds) = split_utc_offset(text).ok_or_else(invalid)?;
    let utc = Timestamp::parse_rfc3339(local).ok_or_else(invalid)?;
    Ok(Timestamp::from_unix_millis(utc.unix_millis() - offset_seconds * 1000))
}

/// Splits `...+HH:MM` / `...-HH:MM` into the local time and the offset in seconds; other texts
/// come back whole with offset 0.
fn split_utc_offset(text: &str) -> Option<(&str, i64)> {
    let bytes = text.as_bytes();
    // An offset only follows the time part: `T12:00:00+02:00` is 6 characters of offset after
    // at least a date and a time.
    if bytes.len() > 6 && matches!(bytes, [.., b'+' | b'-', _, _, b':', _, _]) {
        let (local, offset) = text.split_at(text.len() - 6);
        let sign = if offset.starts_with('-') { -1 } else { 1 };
        let hours: i64 = offset[1..3].parse().ok()?;
        let minutes: i64 = offset[4..6].parse().ok()?;
        if hours > 23 || minutes > 59 || !local.contains(['T', 't', ' ']) {
            return None;
        }
        return Some((local, sign * (hours * 3600 + minutes * 60)));
    }
    Some((text, 0))
}

/// Hands out each metric's reading at a series of increasing times, walking the trace once.
pub struct ReadingCursor<'a> {
    trace: &'a Trace,
    /// Rows before this index are at or before the last time asked for.
    next_row: usize,
    /// The newest row at or before the last time asked for that carries metric data.
    current: Option<&'a TraceRow>,
}

impl<'a> ReadingCursor<'a> {
    pub fn new(trace: &'a Trace) -> Self {
        ReadingCursor { trace, next_row: 0, current: None }
    }

    /// The readings at `now`, one per metric in rule order: the value in the newest row at or
    /// before `now`, stamped with that row's time. An empty cell in that row means the backend
    /// had no data then, so the metric is unavailable; it does not fall back to an older row,
    /// because a real query would not have returned one either. Times must not go backwards.
    pub fn readings_at(&mut self, now: Timestamp) -> Vec<Reading> {
        while let Some(row) = self.trace.rows.get(self.next_row).filter(|row| row.at <= now) {
            if row.carries_metric_data() {
                self.current = Some(row);
            }
            self.next_row += 1;
        }
        (0..self.trace.metric_names.len())
            .map(|metric| {
                match self
                    .current
                    .and_then(|row| row.values.get(metric).copied().flatten().map(|value| (value, row.at)))
                {
                    Some((value, at)) => Reading::Value { value, at },
                    None => Reading::Unavailable { reason: NO_DATA_REASON.into() },
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn line_error(result: Result<Trace, TraceError>) -> (usize, String) {
        match result {
            Err(TraceError::Line { line, message }) => (line, message),
            other => panic!("expected an error on a line, got {other:?}"),
        }
    }

    #[test]
    fn parses_rfc3339_and_unix_seconds_and_empty_cells() {
        let text = "timestamp,cpu,replicas\n\
                    2024-05-01T00:00:00Z,0.5,3\n\
                    1714521615,,\n\
                    1714521630.5,0.75,\n\
                    2024-05-01T02:00:45+02:00,0.25,4\n";
        let trace = parse_trace(text, &names(&["cpu"])).unwrap();
        let seconds: Vec<i64> = trace.rows.iter().map(|r| r.at.unix_millis()).collect();
        assert_eq!(seconds, vec![1_714_521_600_000, 1_714_521_615_000, 1_714_521_630_500, 1_714_521_645_000]);
        let values: Vec<Option<f64>> = trace.rows.iter().map(|r| r.values[0]).collect();
        assert_eq!(values, vec![Some(0.5), None, Some(0.75), Some(0.25)]);
        let replicas: Vec<Option<u32>> = trace.rows.iter().map(|r| r.replicas).collect();
        assert_eq!(replicas, vec![Some(3), None, None, Some(4)]);
        assert_eq!(trace.rows[3].line, 5);
    }

    #[test]
    fn columns_follow_the_rule_order_whatever_the_file_order() {
        let text = "timestamp,b,a\n0,2,1\n";
        let trace = parse_trace(text, &names(&["a", "b"])).unwrap();
        assert_eq!(trace.rows[0].values, vec![Some(1.0), Some(2.0)]);
    }

    #[test]
    fn tolerates_quotes_spaces_crlf_a_bom_and_blank_lines() {
        let text = "\u{feff}timestamp, \"cpu\"\r\n\r\n\"2024-05-01T00:00:00Z\", 0.5 \r\n\n";
        let trace = parse_trace(text, &names(&["cpu"])).unwrap();
        assert_eq!(trace.rows.len(), 1);
        assert_eq!(trace.rows[0].values, vec![Some(0.5)]);
        assert_eq!(trace.rows[0].line, 3);
    }

    #[test]
    fn a_bad_header_names_the_problem() {
        let (line, message) = line_error(parse_trace("time,cpu\n0,1\n", &names(&["cpu"])));
        assert_eq!(line, 1);
        assert!(message.contains("first column must be `timestamp`, found `time`"), "{message}");

        let (_, message) = line_error(parse_trace("timestamp,cpu,memory\n0,1,2\n", &names(&["cpu"])));
        assert!(message.contains("unknown column `memory`"), "{message}");
        assert!(message.contains("timestamp,cpu"), "{message}");

        let (_, message) = line_error(parse_trace("timestamp,cpu\n0,1\n", &names(&["cpu", "latency"])));
        assert!(message.contains("missing column `latency`"), "{message}");

        let (_, message) = line_error(parse_trace("timestamp,cpu,cpu\n0,1,1\n", &names(&["cpu"])));
        assert!(message.contains("`cpu` appears twice"), "{message}");

        assert_eq!(parse_trace("\n\n", &names(&["cpu"])), Err(TraceError::Empty));
        assert_eq!(parse_trace("timestamp,cpu\n", &names(&["cpu"])), Err(TraceError::NoRows));
    }

    #[test]
    fn bad_cells_are_reported_with_their_line_number() {
        let header = "timestamp,cpu,replicas\n0,0.5,\n\n";
        let cases = [
            ("60,abc,", "cpu: \"abc\" is not a number"),
            ("60,NaN,", "not a finite number"),
            ("60,inf,", "not a finite number"),
            ("60,0.5,2.5", "replicas: \"2.5\" is not a replica count"),
            ("60,0.5,-1", "replicas: \"-1\" is not a replica count"),
            ("yesterday,0.5,", "timestamp \"yesterday\" is neither RFC 3339"),
            ("2024-05-01,0.5,", "timestamp \"2024-05-01\" is neither RFC 3339"),
            (",0.5,", "the timestamp is empty"),
            ("60,0.5", "expected 3 cells like the header, found 2"),
            ("60,0.5,,7", "expected 3 cells like the header, found 4"),
            ("0,0.5,", "is not after 1970-01-01T00:00:00Z on line 2"),
        ];
        for (row, expected) in cases {
            let text = format!("{header}{row}\n");
            let (line, message) = line_error(parse_trace(&text, &names(&["cpu"])));
            // Line 3 is blank, so the bad row is line 4.
            assert_eq!(line, 4, "{row}: {message}");
            assert!(message.contains(expected), "{row}: {message:?} does not contain {expected:?}");
        }
    }

    #[test]
    fn error_messages_read_as_a_sentence_with_the_line() {
        let err = parse_trace("timestamp,cpu\n0,x\n", &names(&["cpu"])).unwrap_err();
        assert_eq!(err.to_string(), "line 2: cpu: \"x\" is not a number");
    }

    #[test]
    fn timestamps_in_every_accepted_form() {
        let utc = 1_714_564_800_000; // 2024-05-01T12:00:00Z
        for text in [
            "2024-05-01T12:00:00Z",
            "2024-05-01T12:00:00.000Z",
            "2024-05-01 12:00:00",
            "2024-05-01T14:00:00+02:00",
            "2024-05-01T09:30:00-02:30",
            "1714564800",
            "1714564800.0",
        ] {
            assert_eq!(parse_timestamp(text).map(|t| t.unix_millis()), Ok(utc), "{text}");
        }
        assert!(parse_timestamp("2024-05-01T12:00:00+25:00").is_err());
        assert!(parse_timestamp("12:00").is_err());
    }

    fn cursor_trace() -> Trace {
        let text = "timestamp,a,b,replicas\n0,1,10,\n30,2,,\n60,,,5\n90,,30,\n";
        parse_trace(text, &names(&["a", "b"])).unwrap()
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_unix_millis(seconds * 1000)
    }

    fn value(v: f64, seconds: i64) -> Reading {
        Reading::Value { value: v, at: at(seconds) }
    }

    fn no_data() -> Reading {
        Reading::Unavailable { reason: NO_DATA_REASON.into() }
    }

    #[test]
    fn readings_come_from_the_newest_row_at_or_before_the_time() {
        let trace = cursor_trace();
        let mut cursor = ReadingCursor::new(&trace);
        assert_eq!(cursor.readings_at(at(0)), vec![value(1.0, 0), value(10.0, 0)]);
        assert_eq!(cursor.readings_at(at(29)), vec![value(1.0, 0), value(10.0, 0)]);
        // Row 30 has no `b`: the backend returned nothing for it then.
        assert_eq!(cursor.readings_at(at(30)), vec![value(2.0, 30), no_data()]);
        // Row 60 only records a manual replica change: the metrics stay as they were.
        assert_eq!(cursor.readings_at(at(75)), vec![value(2.0, 30), no_data()]);
        assert_eq!(cursor.readings_at(at(1000)), vec![no_data(), value(30.0, 90)]);
    }

    #[test]
    fn before_the_first_row_every_metric_is_unavailable() {
        let trace = cursor_trace();
        let mut cursor = ReadingCursor::new(&trace);
        assert_eq!(cursor.readings_at(at(-5)), vec![no_data(), no_data()]);
    }
}
