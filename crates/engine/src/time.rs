//! Points in time as plain values: the engine never reads a clock.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch. Serialized as RFC 3339 (UTC); deserialized from RFC 3339
/// or from a number of Unix seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(i64);

/// The last millisecond of 9999. Read times stay within 1970 and this: RFC 3339 as `Display`
/// writes it (humantime) has no other years, and a time read that cannot be written back would
/// fail, or panic before 1970, when the decision or the state is written.
const MAX_READ_MILLIS: i64 = 253_402_300_799_999;

impl Timestamp {
    pub const fn from_unix_millis(ms: i64) -> Self {
        Timestamp(ms)
    }

    /// `None` outside 1970 to 9999 (see `MAX_READ_MILLIS`).
    pub fn from_unix_seconds_f64(s: f64) -> Option<Self> {
        let ms = (s * 1000.0).round();
        (0.0..=MAX_READ_MILLIS as f64).contains(&ms).then_some(Timestamp(ms as i64))
    }

    /// A time given as (fractional) Unix milliseconds, as backends send them; `None` outside
    /// 1970 to 9999 or when not a number.
    pub fn from_unix_millis_f64(ms: f64) -> Option<Self> {
        let ms = ms.round();
        (0.0..=MAX_READ_MILLIS as f64).contains(&ms).then_some(Timestamp(ms as i64))
    }

    fn from_unix_seconds(s: i64) -> Option<Self> {
        s.checked_mul(1000).filter(|ms| (0..=MAX_READ_MILLIS).contains(ms)).map(Timestamp)
    }

    pub const fn unix_millis(self) -> i64 {
        self.0
    }

    pub fn parse_rfc3339(text: &str) -> Option<Self> {
        let t = humantime::parse_rfc3339_weak(text).ok()?;
        Some(Self::from_system_time(t))
    }

    pub fn from_system_time(t: SystemTime) -> Self {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Timestamp(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
            Err(e) => Timestamp(-i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX)),
        }
    }

    /// Time elapsed from `earlier` to `self`; zero when `earlier` is in the future.
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(u64::try_from(self.0.saturating_sub(earlier.0)).unwrap_or(0))
    }

    pub fn plus(self, d: Duration) -> Timestamp {
        Timestamp(self.0.saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = if self.0 >= 0 {
            UNIX_EPOCH + Duration::from_millis(self.0.unsigned_abs())
        } else {
            UNIX_EPOCH - Duration::from_millis(self.0.unsigned_abs())
        };
        if self.0 % 1000 == 0 {
            write!(f, "{}", humantime::format_rfc3339_seconds(t))
        } else {
            write!(f, "{}", humantime::format_rfc3339_millis(t))
        }
    }
}

impl serde::Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

const OUT_OF_RANGE: &str = "time out of range: Unix seconds from 0 to the end of 9999";

impl<'de> serde::Deserialize<'de> for Timestamp {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Timestamp;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an RFC 3339 time such as \"2024-05-01T12:00:00Z\" or Unix seconds")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Timestamp, E> {
                Timestamp::parse_rfc3339(v).ok_or_else(|| E::custom(format!("{v:?} is not an RFC 3339 time")))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Timestamp, E> {
                Timestamp::from_unix_seconds(v).ok_or_else(|| E::custom(OUT_OF_RANGE))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Timestamp, E> {
                i64::try_from(v).ok().and_then(Timestamp::from_unix_seconds).ok_or_else(|| E::custom(OUT_OF_RANGE))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Timestamp, E> {
                Timestamp::from_unix_seconds_f64(v).ok_or_else(|| E::custom(OUT_OF_RANGE))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_rfc3339() {
        let t = Timestamp::parse_rfc3339("2024-05-01T12:00:30Z").unwrap();
        assert_eq!(t.unix_millis(), 1_714_564_830_000);
        assert_eq!(t.to_string(), "2024-05-01T12:00:30Z");
        assert_eq!(Timestamp(1_714_564_830_250).to_string(), "2024-05-01T12:00:30.250Z");
        assert_eq!(t.since(Timestamp(t.0 + 5)), Duration::ZERO);
        assert_eq!(t.plus(Duration::from_secs(30)).since(t), Duration::from_secs(30));
    }

    #[test]
    fn reads_only_times_it_can_write() {
        let read = |json: &str| serde_json::from_str::<Timestamp>(json);
        for json in ["-1", "-0.001", "253402300800", "9223372036854775807", "18446744073709551615", "1e300"] {
            assert!(read(json).is_err(), "{json}");
        }
        for (json, written) in [
            ("0", "\"1970-01-01T00:00:00Z\""),
            ("253402300799.999", "\"9999-12-31T23:59:59.999Z\""),
            ("\"9999-12-31T23:59:59Z\"", "\"9999-12-31T23:59:59Z\""),
        ] {
            let t = read(json).unwrap();
            assert_eq!(serde_json::to_string(&t).unwrap(), written, "{json}");
        }
    }
}
