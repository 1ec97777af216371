//! Schedules: windows of time in which an autoscaler keeps more replicas (and optionally
//! fewer at most) than its rule does, so that a known peak is met before its metric crosses.
//!
//! A window is weekly (days and wall-clock times) or a cron expression with a duration, both
//! in an IANA time zone: 08:00 in Paris is 08:00 on either side of a change of summer time. A
//! window may ramp: its floor rises in a straight line from the rule's `min_replicas` over
//! `ramp_in` before it starts, and falls the same way over `ramp_out` after it ends.
//! Overlapping windows take the highest floor, and the lowest `max_replicas` of those open.
//!
//! Everything here is a pure function of the schedules and an instant. Leaving a window only
//! lowers the floor: the replicas above it come down by the rule's own watermarks, delays and
//! limits, never in one drop.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use jiff::civil::{Date, DateTime, Time, Weekday};
use jiff::tz::{AmbiguousOffset, TimeZone};
use watermarkd_engine::{Bounds, Rule, Timestamp};

/// The longest window, and the longest ramp: what a weekly schedule can mean.
pub const MAX_WINDOW: Duration = Duration::from_secs(7 * 86_400);
pub const MAX_RAMP: Duration = Duration::from_secs(86_400);

const DAY_MS: i64 = 86_400_000;

/// One window of an autoscaler's schedule.
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    /// How it is named in decisions and status (`weekday-mornings`, or `schedule[0]`).
    pub name: String,
    pub when: When,
    pub time_zone: Zone,
    /// The floor while the window is open.
    pub min_replicas: u32,
    /// The most replicas while the window is open, when lower than the rule's.
    pub max_replicas: Option<u32>,
    pub ramp_in: Duration,
    pub ramp_out: Duration,
}

/// When a window opens, and when it closes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum When {
    /// On each of `days`, from `start` to `end` (wall clock; an `end` not after `start` is on
    /// the next day).
    Weekly { days: [bool; 7], start: Time, end: Time },
    /// At each time `cron` matches, for `duration`.
    Cron { cron: Cron, duration: Duration },
}

/// A time zone by its IANA name.
#[derive(Clone, Debug)]
pub struct Zone {
    pub name: String,
    pub zone: TimeZone,
}

impl PartialEq for Zone {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Zone {
    /// The zone `name` names, or why none.
    pub fn named(name: &str) -> Result<Zone, String> {
        TimeZone::get(name)
            .map(|zone| Zone { name: name.to_string(), zone })
            .map_err(|_| format!("({name:?}) is not an IANA time zone such as \"Europe/Paris\" or \"UTC\""))
    }
}

/// What the schedules make of an autoscaler's bounds at one instant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduledBounds {
    /// The floor: at least the rule's `min_replicas`.
    pub min: u32,
    /// The most replicas: at most the rule's `max_replicas`, never below `min`.
    pub max: u32,
    /// Which window set the floor, and how (`schedule "mornings" (open until 18:00)`), when
    /// one raised it.
    pub floor_by: Option<String>,
    /// Which window lowered the most, when one did.
    pub ceiling_by: Option<String>,
}

/// The bounds at `now` under `schedules`, from the rule's own `min` and `max`.
pub fn bounds_at(schedules: &[Schedule], min: u32, max: u32, now: Timestamp) -> ScheduledBounds {
    let mut bounds = ScheduledBounds { min, max, floor_by: None, ceiling_by: None };
    for schedule in schedules {
        let Some(at) = schedule.at(now) else { continue };
        let floor = at.floor(min, schedule.min_replicas).min(max);
        if floor > bounds.min {
            bounds.min = floor;
            bounds.floor_by = Some(format!("schedule {:?} ({at})", schedule.name));
        }
        if let (Phase::Open, Some(ceiling)) = (at.phase, schedule.max_replicas) {
            if ceiling < bounds.max {
                bounds.max = ceiling;
                bounds.ceiling_by = Some(format!("schedule {:?}", schedule.name));
            }
        }
    }
    // Overlapping windows take the highest floor, over any lower ceiling.
    if bounds.max < bounds.min {
        bounds.max = bounds.min;
        bounds.ceiling_by = None;
    }
    bounds
}

/// `rule` as it holds at `now` under `schedules`: itself, or a copy within the bounds they set
/// (`Rule::within`), which decisions then name.
pub fn rule_at<'r>(rule: &'r Rule, schedules: &[Schedule], now: Timestamp) -> Cow<'r, Rule> {
    if schedules.is_empty() {
        return Cow::Borrowed(rule);
    }
    let bounds = bounds_at(schedules, rule.min_replicas(), rule.max_replicas(), now);
    if bounds.floor_by.is_none() && bounds.ceiling_by.is_none() {
        return Cow::Borrowed(rule);
    }
    Cow::Owned(rule.within(Bounds {
        min: bounds.min,
        max: bounds.max,
        min_by: bounds.floor_by,
        max_by: bounds.ceiling_by,
    }))
}

/// Where an instant stands in a schedule's windows.
#[derive(Clone, Copy, Debug, PartialEq)]
struct At {
    phase: Phase,
    /// How far through the ramp, from 0 to 1 (1 while open).
    progress: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    RampIn,
    Open,
    RampOut,
}

impl At {
    /// How much of the window's raise applies, from 0 to 1.
    fn share(self) -> f64 {
        let share = match self.phase {
            Phase::Open => 1.0,
            Phase::RampIn => self.progress,
            Phase::RampOut => 1.0 - self.progress,
        };
        share.clamp(0.0, 1.0)
    }

    /// The floor this puts between the rule's `min` and the window's `full` one, rounded up.
    fn floor(self, min: u32, full: u32) -> u32 {
        if full <= min {
            return min;
        }
        // From 0 to full - min, so the cast cannot leave u32.
        let raised = (f64::from(full - min) * self.share()).ceil() as u32;
        min.saturating_add(raised).min(full)
    }
}

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let percent = (self.progress * 100.0).round();
        match self.phase {
            Phase::Open => f.write_str("open"),
            Phase::RampIn => write!(f, "ramping in, {percent}%"),
            Phase::RampOut => write!(f, "ramping out, {percent}%"),
        }
    }
}

/// How far ahead the next opening of a window is looked for: a cron on 29 February alone may
/// wait eight years (from 2096 to 2104).
const LONGEST_WAIT_MS: i64 = 9 * 366 * DAY_MS;

impl Schedule {
    /// When its next window opens after `now`; `None` when none does within nine years (or
    /// within the clock's range).
    pub fn next_opening(&self, now: Timestamp) -> Option<Timestamp> {
        let (start, _) = self.next_start(now.unix_millis(), LONGEST_WAIT_MS)?;
        Some(Timestamp::from_unix_millis(start))
    }

    /// Whether one of its windows is open at `now` (its ramps aside).
    pub fn is_open(&self, now: Timestamp) -> bool {
        self.at(now).is_some_and(|at| at.phase == Phase::Open)
    }

    /// `at` on the wall clock of its time zone, as a person reads it: `Mon 2026-11-23 08:00
    /// Europe/Paris`.
    pub fn local_time(&self, at: Timestamp) -> String {
        match jiff::Timestamp::from_millisecond(at.unix_millis()) {
            Ok(instant) => {
                let local = instant.to_zoned(self.time_zone.zone.clone());
                format!("{} {}", local.strftime("%a %Y-%m-%d %H:%M"), self.time_zone.name)
            }
            Err(_) => "?".into(),
        }
    }

    /// Where `now` stands in this schedule's windows; `None` outside them and their ramps.
    /// Between a window's ramp out and the next one's ramp in, the higher floor counts.
    fn at(&self, now: Timestamp) -> Option<At> {
        let now_ms = now.unix_millis();
        let (ramp_in, ramp_out) = (millis(self.ramp_in), millis(self.ramp_out));
        let latest = self.latest_start(now_ms)?;
        if latest.is_some_and(|(_, end)| now_ms < end) {
            return Some(At { phase: Phase::Open, progress: 1.0 });
        }
        let leaving = latest
            .filter(|&(_, end)| ramp_out > 0 && now_ms < end.saturating_add(ramp_out))
            .map(|(_, end)| At { phase: Phase::RampOut, progress: (now_ms - end) as f64 / ramp_out as f64 });
        let coming = self.next_start(now_ms, ramp_in).map(|(next, _)| At {
            phase: Phase::RampIn,
            progress: (now_ms - (next - ramp_in)) as f64 / ramp_in as f64,
        });
        match (leaving, coming) {
            (Some(leaving), Some(coming)) => Some(if leaving.share() >= coming.share() { leaving } else { coming }),
            (one, other) => one.or(other),
        }
    }

    /// The latest window that opened at or before `now_ms` (its start and end), looking back as
    /// far as a window and its ramp out can reach. `None` when the clock is out of range.
    fn latest_start(&self, now_ms: i64) -> Option<Option<(i64, i64)>> {
        let today = self.date_of(now_ms)?;
        let reach = self.longest() + self.ramp_out;
        let days = reach.as_secs().div_ceil(86_400) + 1;
        let mut date = today;
        for _ in 0..=days {
            let mut windows = self.windows_on(date);
            windows.retain(|(start, _)| *start <= now_ms);
            if let Some(latest) = windows.into_iter().max_by_key(|(start, _)| *start) {
                return Some(Some(latest));
            }
            date = date.yesterday().ok()?;
        }
        Some(None)
    }

    /// The first window that opens after `now_ms`, within `within_ms`.
    fn next_start(&self, now_ms: i64, within_ms: i64) -> Option<(i64, i64)> {
        if within_ms <= 0 {
            return None;
        }
        let mut date = self.date_of(now_ms)?;
        let days = within_ms / DAY_MS + 1;
        for _ in 0..=days {
            let mut windows = self.windows_on(date);
            windows.retain(|(start, _)| *start > now_ms && *start - now_ms <= within_ms);
            if let Some(first) = windows.into_iter().min_by_key(|(start, _)| *start) {
                return Some(first);
            }
            date = date.tomorrow().ok()?;
        }
        None
    }

    /// The longest a window lasts.
    fn longest(&self) -> Duration {
        match &self.when {
            // A weekly window ends within a day of its start (two at a change of time).
            When::Weekly { .. } => Duration::from_secs(86_400 + 7_200),
            When::Cron { duration, .. } => *duration,
        }
    }

    fn date_of(&self, ms: i64) -> Option<Date> {
        let instant = jiff::Timestamp::from_millisecond(ms).ok()?;
        Some(instant.to_zoned(self.time_zone.zone.clone()).date())
    }

    /// The windows that open on `date` (local), as instants in milliseconds.
    fn windows_on(&self, date: Date) -> Vec<(i64, i64)> {
        let zone = &self.time_zone.zone;
        match &self.when {
            When::Weekly { days, start, end } => {
                let open = days.get(weekday_index(date.weekday())).copied().unwrap_or(false);
                if !open {
                    return Vec::new();
                }
                let end_date = if end <= start { date.tomorrow().ok() } else { Some(date) };
                let Some(opens) = reached(zone, date.to_datetime(*start)) else { return Vec::new() };
                let Some(closes) = end_date.and_then(|d| reached(zone, d.to_datetime(*end))) else { return Vec::new() };
                // A window whose start and end the clock both skipped would be empty: it lasts
                // its wall-clock length from the jump instead.
                let closes =
                    if closes > opens { closes } else { opens.saturating_add(wall_clock_length(*start, *end)) };
                vec![(opens, closes)]
            }
            When::Cron { cron, duration } => {
                if !cron.matches_date(date) {
                    return Vec::new();
                }
                let mut windows = Vec::new();
                for hour in cron.hours.iter() {
                    for minute in cron.minutes.iter() {
                        let Ok(time) = Time::new(hour as i8, minute as i8, 0, 0) else { continue };
                        if let Some(start) = reached(zone, date.to_datetime(time)) {
                            windows.push((start, start.saturating_add(millis(*duration))));
                        }
                    }
                }
                windows
            }
        }
    }
}

/// The first instant the clock of `zone` reaches the local time `at`: that time, or, when the
/// clock skips it (02:30 on the night summer time begins in Paris, when 02:00 becomes 03:00),
/// the instant it jumps past it. So a window that starts in the gap still opens that day, as
/// the clock jumps, and one that ends in it closes then. A time the clock shows twice (when
/// summer time ends) is reached the first time.
fn reached(zone: &TimeZone, at: DateTime) -> Option<i64> {
    let ambiguous = zone.to_ambiguous_timestamp(at);
    match ambiguous.offset() {
        AmbiguousOffset::Gap { after, .. } => {
            // Read with the offset of after the jump, `at` falls before the jump.
            let before_the_jump = after.to_timestamp(at).ok()?;
            let jump = zone.following(before_the_jump).next()?;
            Some(jump.timestamp().as_millisecond())
        }
        AmbiguousOffset::Unambiguous { .. } | AmbiguousOffset::Fold { .. } => {
            ambiguous.compatible().ok().map(|t| t.as_millisecond())
        }
    }
}

/// How long a weekly window lasts on the wall clock: from `start` to `end`, the next day when
/// `end` is not after `start`.
fn wall_clock_length(start: Time, end: Time) -> i64 {
    let seconds = |t: Time| i64::from(t.hour()) * 3_600 + i64::from(t.minute()) * 60 + i64::from(t.second());
    let length = (seconds(end) - seconds(start)).rem_euclid(86_400);
    let length = if length == 0 { 86_400 } else { length };
    length * 1_000
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// Monday is 0.
fn weekday_index(day: Weekday) -> usize {
    usize::try_from(day.to_monday_zero_offset()).unwrap_or(0)
}

/// The days of a weekly schedule, by their names (`mon` ... `sun`, or `weekdays`,
/// `weekends`, `daily`).
pub fn parse_days(names: &[String]) -> Result<[bool; 7], String> {
    let mut days = [false; 7];
    for name in names {
        let set: &[usize] = match name.to_ascii_lowercase().as_str() {
            "mon" | "monday" => &[0],
            "tue" | "tuesday" => &[1],
            "wed" | "wednesday" => &[2],
            "thu" | "thursday" => &[3],
            "fri" | "friday" => &[4],
            "sat" | "saturday" => &[5],
            "sun" | "sunday" => &[6],
            "weekdays" => &[0, 1, 2, 3, 4],
            "weekends" => &[5, 6],
            "daily" => &[0, 1, 2, 3, 4, 5, 6],
            _ => {
                return Err(format!(
                    "({name:?}) is not a day: use mon, tue, wed, thu, fri, sat, sun, weekdays, weekends or daily"
                ))
            }
        };
        for &day in set {
            if let Some(slot) = days.get_mut(day) {
                *slot = true;
            }
        }
    }
    if days.iter().any(|&d| d) {
        Ok(days)
    } else {
        Err("must name at least one day".into())
    }
}

/// A wall-clock time, `HH:MM`.
pub fn parse_time(text: &str) -> Result<Time, String> {
    let wrong = || format!("({text:?}) must be a time of day such as \"08:00\" or \"18:30\"");
    let (hour, minute) = text.trim().split_once(':').ok_or_else(wrong)?;
    let hour: i8 = hour.parse().map_err(|_| wrong())?;
    let minute: i8 = minute.parse().map_err(|_| wrong())?;
    Time::new(hour, minute, 0, 0).map_err(|_| wrong())
}

/// A cron expression of five fields: minute, hour, day of month, month, day of week.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cron {
    text: String,
    minutes: Set,
    hours: Set,
    days_of_month: Set,
    months: Set,
    /// 0 is Sunday, as cron counts.
    days_of_week: Set,
    /// Whether day of month and day of week were both restricted: then a day matches when
    /// either does, as in every cron since Vixie's.
    either_day: bool,
}

impl fmt::Display for Cron {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A set of small numbers, as a bit mask.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Set(u64);

impl Set {
    fn has(self, n: u32) -> bool {
        n < 64 && self.0 & (1 << n) != 0
    }

    fn iter(self) -> impl Iterator<Item = u32> {
        (0..64).filter(move |&n| self.has(n))
    }
}

const MONTHS: [&str; 12] = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"];
const MONTH_NAMES: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

/// The descriptors Kubernetes CronJob takes for a whole expression, and what each stands for.
const DESCRIPTORS: [(&str, &str); 7] = [
    ("@yearly", "0 0 1 1 *"),
    ("@annually", "0 0 1 1 *"),
    ("@monthly", "0 0 1 * *"),
    ("@weekly", "0 0 * * 0"),
    ("@daily", "0 0 * * *"),
    ("@midnight", "0 0 * * *"),
    ("@hourly", "0 * * * *"),
];

impl Cron {
    /// Five fields (minute hour day-of-month month day-of-week), or one of the descriptors
    /// Kubernetes CronJob takes (`@daily`, ...), kept as written for display.
    pub fn parse(text: &str) -> Result<Cron, String> {
        let expanded = DESCRIPTORS.iter().find(|(name, _)| *name == text.trim()).map_or(text, |(_, fields)| fields);
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        let [minute, hour, dom, month, dow] = fields.as_slice() else {
            let names: Vec<&str> = DESCRIPTORS.iter().map(|(name, _)| *name).collect();
            let (last, rest) = names.split_last().unwrap_or((&"", &[]));
            return Err(format!(
                "({text:?}) must have five fields (minute hour day-of-month month day-of-week), such as \"0 8 * * 1-5\", \
                 or be one of {} and {last}",
                rest.join(", ")
            ));
        };
        let within = |what: &str, result: Result<Set, String>| result.map_err(|e| format!("({text:?}) {what}: {e}"));
        let mut days_of_week = within("day of week", field(dow, 0, 7, &DAYS, 0))?;
        // 7 is Sunday too.
        if days_of_week.has(7) {
            days_of_week = Set((days_of_week.0 | 1) & !(1 << 7));
        }
        let cron = Cron {
            text: text.trim().to_string(),
            minutes: within("minute", field(minute, 0, 59, &[], 0))?,
            hours: within("hour", field(hour, 0, 23, &[], 0))?,
            days_of_month: within("day of month", field(dom, 1, 31, &[], 1))?,
            months: within("month", field(month, 1, 12, &MONTHS, 1))?,
            days_of_week,
            either_day: !dom.starts_with('*') && !dow.starts_with('*'),
        };
        match cron.missing_days() {
            Some(why) => Err(format!("({text:?}) never fires: {why}")),
            None => Ok(cron),
        }
    }

    /// Why no date ever matches, when none does: the days of month it names exist in none of
    /// its months (`0 0 31 2 *`). A day of week always comes round, so a cron that also names
    /// one (either matches, as cron reads it) fires; and February has a 29th in leap years.
    fn missing_days(&self) -> Option<String> {
        if self.either_day {
            return None;
        }
        let longest = |month: u32| match month {
            2 => 29,
            4 | 6 | 9 | 11 => 30,
            _ => 31,
        };
        if self.months.iter().any(|month| self.days_of_month.iter().any(|day| day <= longest(month))) {
            return None;
        }
        let months: Vec<&str> = self
            .months
            .iter()
            .filter_map(|m| MONTH_NAMES.get(usize::try_from(m).ok()?.checked_sub(1)?))
            .copied()
            .collect();
        let days: Vec<String> = self.days_of_month.iter().map(|d| d.to_string()).collect();
        let has = if months.len() == 1 { "has" } else { "have" };
        Some(format!("{} {has} no day {}", months.join(" and "), days.join(" or ")))
    }

    fn matches_date(&self, date: Date) -> bool {
        let (Ok(month), Ok(day)) = (u32::try_from(date.month()), u32::try_from(date.day())) else { return false };
        if !self.months.has(month) {
            return false;
        }
        let dow = u32::try_from(date.weekday().to_sunday_zero_offset()).unwrap_or(0);
        let (by_month_day, by_week_day) = (self.days_of_month.has(day), self.days_of_week.has(dow));
        if self.either_day {
            by_month_day || by_week_day
        } else {
            by_month_day && by_week_day
        }
    }
}

/// One cron field: `*`, `N`, `A-B`, each optionally `/STEP`, separated by commas; `names`
/// spell the values from `name_base` on.
fn field(text: &str, low: u32, high: u32, names: &[&str], name_base: u32) -> Result<Set, String> {
    let value = |word: &str| -> Result<u32, String> {
        let lower = word.to_ascii_lowercase();
        if let Some(index) = names.iter().position(|n| *n == lower) {
            return Ok(name_base + u32::try_from(index).unwrap_or(0));
        }
        let n: u32 = word.parse().map_err(|_| format!("{word:?} is not a number"))?;
        if n < low || n > high {
            return Err(format!("{n} is not from {low} to {high}"));
        }
        Ok(n)
    };
    let mut set = 0u64;
    for part in text.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((range, step)) => {
                let step: u32 = step.parse().map_err(|_| format!("the step {step:?} is not a number"))?;
                if step == 0 {
                    return Err("a step must be at least 1".into());
                }
                (range, step)
            }
            None => (part, 1),
        };
        let (from, to) = match range {
            "*" => (low, high),
            _ => match range.split_once('-') {
                Some((a, b)) => (value(a)?, value(b)?),
                None if part.contains('/') => (value(range)?, high),
                None => {
                    let n = value(range)?;
                    (n, n)
                }
            },
        };
        if from > to {
            return Err(format!("the range {range:?} runs backwards"));
        }
        for n in (from..=to).step_by(usize::try_from(step).unwrap_or(1)) {
            set |= 1 << n;
        }
    }
    Ok(Set(set))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paris() -> Zone {
        Zone::named("Europe/Paris").unwrap()
    }

    /// The instant of a wall-clock time in Paris.
    fn at(text: &str) -> Timestamp {
        let civil: DateTime = text.parse().unwrap();
        Timestamp::from_unix_millis(paris().zone.to_zoned(civil).unwrap().timestamp().as_millisecond())
    }

    fn weekdays(start: &str, end: &str) -> Schedule {
        Schedule {
            name: "office".into(),
            when: When::Weekly {
                days: parse_days(&["weekdays".into()]).unwrap(),
                start: parse_time(start).unwrap(),
                end: parse_time(end).unwrap(),
            },
            time_zone: paris(),
            min_replicas: 10,
            max_replicas: None,
            ramp_in: Duration::ZERO,
            ramp_out: Duration::ZERO,
        }
    }

    fn floor(schedules: &[Schedule], when: &str) -> u32 {
        bounds_at(schedules, 2, 50, at(when)).min
    }

    #[test]
    fn a_weekly_window_raises_the_floor_on_its_days_and_hours_only() {
        let office = [weekdays("08:00", "18:00")];
        // 2026-11-23 is a Monday.
        assert_eq!(floor(&office, "2026-11-23T07:59"), 2);
        assert_eq!(floor(&office, "2026-11-23T08:00"), 10);
        assert_eq!(floor(&office, "2026-11-23T17:59"), 10);
        assert_eq!(floor(&office, "2026-11-23T18:00"), 2);
        assert_eq!(floor(&office, "2026-11-28T09:00"), 2, "Saturday");
        let bounds = bounds_at(&office, 2, 50, at("2026-11-23T09:00"));
        assert_eq!(bounds.floor_by.as_deref(), Some("schedule \"office\" (open)"));
    }

    #[test]
    fn wall_clock_times_hold_across_a_change_of_summer_time() {
        let office = [weekdays("08:00", "18:00")];
        // Paris went from UTC+1 to UTC+2 on Sunday 2026-03-29: 08:00 is 06:00 UTC after it.
        assert_eq!(floor(&office, "2026-03-27T08:00"), 10);
        assert_eq!(floor(&office, "2026-03-30T08:00"), 10);
        assert_eq!(floor(&office, "2026-03-30T07:59"), 2);
        let utc_hour = |text: &str| at(text).unix_millis() / 3_600_000 % 24;
        assert_eq!((utc_hour("2026-03-27T08:00"), utc_hour("2026-03-30T08:00")), (7, 6));
    }

    /// A daily window from `start` to `end` in Paris.
    fn daily(start: &str, end: &str) -> Schedule {
        Schedule {
            when: When::Weekly { days: [true; 7], start: parse_time(start).unwrap(), end: parse_time(end).unwrap() },
            ..weekdays(start, end)
        }
    }

    /// The instant `text` (RFC 3339, with its offset).
    fn instant(text: &str) -> Timestamp {
        let t: jiff::Timestamp = text.parse().unwrap();
        Timestamp::from_unix_millis(t.as_millisecond())
    }

    #[test]
    fn a_window_that_starts_in_the_spring_forward_gap_opens_when_the_clock_jumps_and_keeps_its_end() {
        // Paris, 2027-03-28: at 02:00 (01:00Z) the clock shows 03:00; 02:30 never happens.
        let window = [daily("02:30", "03:15")];
        let floor_at = |text: &str| bounds_at(&window, 2, 50, instant(text)).min;
        assert_eq!(floor_at("2027-03-28T00:59:59Z"), 2, "01:59:59 in winter time");
        assert_eq!(floor_at("2027-03-28T01:00:00Z"), 10, "03:00 in summer time: the jump opens it");
        assert_eq!(floor_at("2027-03-28T01:14:59Z"), 10);
        assert_eq!(floor_at("2027-03-28T01:15:00Z"), 2, "closes at 03:15 as every day");
        // The days around it are as usual.
        assert_eq!((floor_at("2027-03-27T01:29:59Z"), floor_at("2027-03-27T01:30:00Z")), (2, 10));
        assert_eq!((floor_at("2027-03-29T00:30:00Z"), floor_at("2027-03-29T01:15:00Z")), (10, 2));
        // A window the gap swallows whole lasts its wall-clock length from the jump.
        let inside = [daily("02:10", "02:40")];
        let floor_at = |text: &str| bounds_at(&inside, 2, 50, instant(text)).min;
        assert_eq!(floor_at("2027-03-28T01:00:00Z"), 10);
        assert_eq!(floor_at("2027-03-28T01:29:59Z"), 10);
        assert_eq!(floor_at("2027-03-28T01:30:00Z"), 2, "30 minutes, as on the wall clock");
        // One that ends in the gap closes as the clock jumps past its end.
        let ending = [daily("01:30", "02:30")];
        let floor_at = |text: &str| bounds_at(&ending, 2, 50, instant(text)).min;
        assert_eq!((floor_at("2027-03-28T00:30:00Z"), floor_at("2027-03-28T00:59:59Z")), (10, 10));
        assert_eq!(floor_at("2027-03-28T01:00:00Z"), 2);
        // A cron time in the gap opens at the jump, for its duration.
        let cron = [Schedule {
            when: When::Cron { cron: Cron::parse("30 2 * * *").unwrap(), duration: Duration::from_secs(45 * 60) },
            ..daily("00:00", "00:00")
        }];
        let floor_at = |text: &str| bounds_at(&cron, 2, 50, instant(text)).min;
        assert_eq!((floor_at("2027-03-28T00:59:59Z"), floor_at("2027-03-28T01:00:00Z")), (2, 10));
        assert_eq!((floor_at("2027-03-28T01:44:59Z"), floor_at("2027-03-28T01:45:00Z")), (10, 2));
    }

    #[test]
    fn a_window_past_midnight_ends_the_next_day() {
        let night = [weekdays("22:00", "02:00")];
        assert_eq!(floor(&night, "2026-11-23T23:00"), 10);
        assert_eq!(floor(&night, "2026-11-24T01:59"), 10);
        assert_eq!(floor(&night, "2026-11-24T02:00"), 2);
        // Friday night runs into Saturday; nothing opens on Saturday night.
        assert_eq!(floor(&night, "2026-11-28T01:00"), 10);
        assert_eq!(floor(&night, "2026-11-28T23:00"), 2);
    }

    #[test]
    fn ramps_raise_and_lower_the_floor_in_a_straight_line() {
        let mut office = weekdays("08:00", "18:00");
        office.ramp_in = Duration::from_secs(3600);
        office.ramp_out = Duration::from_secs(2 * 3600);
        let office = [office];
        assert_eq!(floor(&office, "2026-11-23T06:59"), 2);
        assert_eq!(floor(&office, "2026-11-23T07:00"), 2);
        assert_eq!(floor(&office, "2026-11-23T07:30"), 6, "half of the way from 2 to 10");
        assert_eq!(floor(&office, "2026-11-23T08:00"), 10);
        assert_eq!(floor(&office, "2026-11-23T19:00"), 6);
        assert_eq!(floor(&office, "2026-11-23T19:59"), 3);
        assert_eq!(floor(&office, "2026-11-23T20:00"), 2);
        let bounds = bounds_at(&office, 2, 50, at("2026-11-23T07:30"));
        assert_eq!(bounds.floor_by.as_deref(), Some("schedule \"office\" (ramping in, 50%)"));
    }

    #[test]
    fn overlapping_windows_take_the_highest_floor_over_any_ceiling() {
        let mut capped = weekdays("08:00", "18:00");
        capped.name = "capped".into();
        capped.min_replicas = 5;
        capped.max_replicas = Some(8);
        let mut peak = weekdays("12:00", "14:00");
        peak.name = "lunch".into();
        peak.min_replicas = 12;
        let both = [capped, peak];
        let morning = bounds_at(&both, 2, 50, at("2026-11-23T09:00"));
        assert_eq!((morning.min, morning.max), (5, 8));
        assert_eq!(morning.ceiling_by.as_deref(), Some("schedule \"capped\""));
        let lunch = bounds_at(&both, 2, 50, at("2026-11-23T12:30"));
        assert_eq!((lunch.min, lunch.max), (12, 12), "the higher floor wins over the lower ceiling");
        assert_eq!(lunch.floor_by.as_deref(), Some("schedule \"lunch\" (open)"));
        // Never above the rule's own max.
        assert_eq!(bounds_at(&both, 2, 10, at("2026-11-23T12:30")).min, 10);
    }

    #[test]
    fn a_cron_window_lasts_its_duration() {
        let cron = Schedule {
            name: "monday".into(),
            when: When::Cron { cron: Cron::parse("30 7 * * mon").unwrap(), duration: Duration::from_secs(3 * 3600) },
            ..weekdays("00:00", "00:00")
        };
        let cron = [cron];
        assert_eq!(floor(&cron, "2026-11-23T07:29"), 2);
        assert_eq!(floor(&cron, "2026-11-23T07:30"), 10);
        assert_eq!(floor(&cron, "2026-11-23T10:29"), 10);
        assert_eq!(floor(&cron, "2026-11-23T10:30"), 2);
        assert_eq!(floor(&cron, "2026-11-24T08:00"), 2);
    }

    #[test]
    fn cron_fields_read_as_cron_reads_them() {
        let c = Cron::parse("*/15 8-18/2 1,15 jan-mar 1-5").unwrap();
        assert_eq!(c.minutes.iter().collect::<Vec<_>>(), [0, 15, 30, 45]);
        assert_eq!(c.hours.iter().collect::<Vec<_>>(), [8, 10, 12, 14, 16, 18]);
        assert_eq!(c.days_of_month.iter().collect::<Vec<_>>(), [1, 15]);
        assert_eq!(c.months.iter().collect::<Vec<_>>(), [1, 2, 3]);
        assert!(c.either_day);
        // 7 and 0 are both Sunday.
        assert_eq!(Cron::parse("0 0 * * 7").unwrap().days_of_week, Cron::parse("0 0 * * sun").unwrap().days_of_week);
        for (text, why) in [
            ("0 8 * *", "five fields"),
            ("60 8 * * *", "minute: 60 is not from 0 to 59"),
            ("0 8 * * 1-9", "day of week: 9 is not from 0 to 7"),
            ("0 18-8 * * *", "runs backwards"),
            ("*/0 8 * * *", "at least 1"),
        ] {
            let err = Cron::parse(text).unwrap_err();
            assert!(err.contains(why), "{text}: {err}");
        }
    }

    #[test]
    fn cron_descriptors_read_as_kubernetes_cronjob_reads_them() {
        for (descriptor, fields) in [
            ("@yearly", "0 0 1 1 *"),
            ("@annually", "0 0 1 1 *"),
            ("@monthly", "0 0 1 * *"),
            ("@weekly", "0 0 * * 0"),
            ("@daily", "0 0 * * *"),
            ("@midnight", "0 0 * * *"),
            ("@hourly", "0 * * * *"),
        ] {
            let (read, expected) = (Cron::parse(descriptor).unwrap(), Cron::parse(fields).unwrap());
            assert_eq!(read.to_string(), descriptor, "shown as written");
            assert_eq!(Cron { text: fields.into(), ..read }, expected, "{descriptor}");
        }
        for unknown in ["@every 1h", "@Daily", "@reboot", "@"] {
            let err = Cron::parse(unknown).unwrap_err();
            assert!(
                err.ends_with("or be one of @yearly, @annually, @monthly, @weekly, @daily, @midnight and @hourly"),
                "{err}"
            );
        }
    }

    #[test]
    fn the_next_opening_is_found_on_the_windows_own_clock() {
        let office = weekdays("08:00", "18:00");
        // Friday 2026-11-27, 19:00 in Paris: the next opening is Monday 08:00.
        let friday = at("2026-11-27T19:00");
        assert_eq!(office.next_opening(friday), Some(at("2026-11-30T08:00")));
        assert_eq!(office.local_time(at("2026-11-30T08:00")), "Mon 2026-11-30 08:00 Europe/Paris");
        assert!(!office.is_open(friday));
        // While open, the next is the next day's.
        assert!(office.is_open(at("2026-11-30T09:00")));
        assert_eq!(office.next_opening(at("2026-11-30T09:00")), Some(at("2026-12-01T08:00")));
        // A 29 February years away is found.
        let leap = Schedule {
            when: When::Cron { cron: Cron::parse("0 0 29 2 *").unwrap(), duration: Duration::from_secs(3600) },
            ..weekdays("00:00", "00:00")
        };
        assert_eq!(leap.next_opening(friday), Some(at("2028-02-29T00:00")));
    }

    #[test]
    fn a_cron_that_never_fires_is_refused_with_the_reason() {
        for (text, why) in [
            ("0 0 31 2 *", "(\"0 0 31 2 *\") never fires: February has no day 31"),
            ("0 0 30 feb *", "(\"0 0 30 feb *\") never fires: February has no day 30"),
            ("0 0 31 apr,jun *", "(\"0 0 31 apr,jun *\") never fires: April and June have no day 31"),
            ("0 0 30-31 2 */2", "(\"0 0 30-31 2 */2\") never fires: February has no day 30 or 31"),
        ] {
            assert_eq!(Cron::parse(text).unwrap_err(), why);
        }
        // February 29 comes in leap years; a day of week always comes round (either matches).
        for fires in ["0 0 29 2 *", "0 0 31 2 mon", "0 0 31 * *", "0 0 31 1-2 *"] {
            assert!(Cron::parse(fires).is_ok(), "{fires}");
        }
    }

    #[test]
    fn days_times_and_zones_say_what_is_wrong() {
        assert!(parse_days(&["mon".into(), "Friday".into()]).is_ok());
        assert!(parse_days(&["funday".into()]).unwrap_err().contains("is not a day"));
        assert!(parse_days(&[]).unwrap_err().contains("at least one day"));
        assert!(parse_time("25:00").unwrap_err().contains("time of day"));
        assert!(parse_time("8h").unwrap_err().contains("time of day"));
        assert!(Zone::named("Mars/Olympus").unwrap_err().contains("IANA time zone"));
        assert!(Zone::named("UTC").is_ok());
    }
}
