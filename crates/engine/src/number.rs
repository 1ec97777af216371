//! Exact decimal arithmetic for the replica formulas.
//!
//! Metric values arrive as `f64`, but people write watermarks as decimals and expect
//! `10 x 0.44 / 0.40` to be exactly 11. Binary floating point gives 11.000000000000002 and a
//! ceiling of 12, so every comparison and ceil/floor in the engine runs on the *decimal* a float
//! prints as (its shortest round-trip representation), held as a big integer times a power of ten.

use std::cmp::Ordering;
use std::fmt;

use num_bigint::BigInt;
use num_integer::Integer;
use num_traits::{Signed, ToPrimitive, Zero};

/// An exact decimal number: `mantissa x 10^exponent`.
#[derive(Clone, Debug)]
pub struct Decimal {
    mantissa: BigInt,
    exponent: i32,
}

/// Why a text could not be read as a decimal number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a decimal number")]
pub struct ParseDecimalError(pub String);

impl Decimal {
    pub fn zero() -> Self {
        Self::from_int(0)
    }

    pub fn from_int(value: i64) -> Self {
        Decimal { mantissa: BigInt::from(value), exponent: 0 }
    }

    /// `mantissa x 10^exponent`.
    pub fn from_parts(mantissa: i128, exponent: i32) -> Self {
        Decimal { mantissa: BigInt::from(mantissa), exponent }
    }

    /// The decimal that `value` prints as. `None` for NaN and infinities.
    pub fn from_f64(value: f64) -> Option<Self> {
        if !value.is_finite() {
            return None;
        }
        // `{:e}` prints the shortest representation that reads back to the same float, which
        // is the decimal a person or an API meant when it produced this float.
        Self::parse(&format!("{value:e}")).ok()
    }

    /// Reads `12`, `-0.5`, `1.5e3`, `2E-4`. No suffixes: quantities are parsed by the caller.
    pub fn parse(text: &str) -> Result<Self, ParseDecimalError> {
        let err = || ParseDecimalError(text.to_string());
        let (number, exp_part) = match text.find(['e', 'E']) {
            Some(i) => (&text[..i], Some(&text[i + 1..])),
            None => (text, None),
        };
        let mut exponent: i32 = match exp_part {
            Some(e) => e.parse().map_err(|_| err())?,
            None => 0,
        };
        let (negative, digits) = match number.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, number.strip_prefix('+').unwrap_or(number)),
        };
        let (int_part, frac_part) = match digits.split_once('.') {
            Some((i, f)) => (i, f),
            None => (digits, ""),
        };
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(err());
        }
        if !int_part.bytes().chain(frac_part.bytes()).all(|b| b.is_ascii_digit()) {
            return Err(err());
        }
        let frac_len = i32::try_from(frac_part.len()).map_err(|_| err())?;
        exponent = exponent.checked_sub(frac_len).ok_or_else(err)?;
        let all_digits = format!("{int_part}{frac_part}");
        let mut mantissa: BigInt = all_digits.parse().map_err(|_| err())?;
        if negative {
            mantissa = -mantissa;
        }
        Ok(Decimal { mantissa, exponent }.normalized())
    }

    fn normalized(mut self) -> Self {
        if self.mantissa.is_zero() {
            self.exponent = 0;
            return self;
        }
        let ten = BigInt::from(10);
        loop {
            let (q, r) = self.mantissa.div_rem(&ten);
            if !r.is_zero() {
                return self;
            }
            self.mantissa = q;
            self.exponent += 1;
        }
    }

    pub fn is_zero(&self) -> bool {
        self.mantissa.is_zero()
    }

    pub fn is_negative(&self) -> bool {
        self.mantissa.is_negative()
    }

    pub fn to_f64(&self) -> f64 {
        format!("{}e{}", self.mantissa, self.exponent).parse().unwrap_or(f64::NAN)
    }

    pub fn mul(&self, other: &Decimal) -> Decimal {
        Decimal { mantissa: &self.mantissa * &other.mantissa, exponent: self.exponent + other.exponent }
    }

    pub fn mul_int(&self, factor: u64) -> Decimal {
        Decimal { mantissa: &self.mantissa * BigInt::from(factor), exponent: self.exponent }
    }

    pub fn add(&self, other: &Decimal) -> Decimal {
        let (a, b, exponent) = aligned(self, other);
        Decimal { mantissa: a + b, exponent }
    }

    pub fn sub(&self, other: &Decimal) -> Decimal {
        let (a, b, exponent) = aligned(self, other);
        Decimal { mantissa: a - b, exponent }
    }

    /// `ceil(self / divisor)`, saturated to the `i64` range. `None` when `divisor` is zero.
    pub fn div_ceil(&self, divisor: &Decimal) -> Option<i64> {
        let (n, d) = quotient_parts(self, divisor)?;
        Some(saturate(Integer::div_ceil(&n, &d)))
    }

    /// `floor(self / divisor)`, saturated to the `i64` range. `None` when `divisor` is zero.
    pub fn div_floor(&self, divisor: &Decimal) -> Option<i64> {
        let (n, d) = quotient_parts(self, divisor)?;
        Some(saturate(n.div_floor(&d)))
    }
}

fn pow10(exp: u32) -> BigInt {
    num_traits::pow(BigInt::from(10), exp as usize)
}

/// Both mantissas brought to the smaller exponent.
fn aligned(a: &Decimal, b: &Decimal) -> (BigInt, BigInt, i32) {
    match a.exponent.cmp(&b.exponent) {
        Ordering::Equal => (a.mantissa.clone(), b.mantissa.clone(), a.exponent),
        Ordering::Greater => {
            let shift = a.exponent.abs_diff(b.exponent);
            (&a.mantissa * pow10(shift), b.mantissa.clone(), b.exponent)
        }
        Ordering::Less => {
            let shift = b.exponent.abs_diff(a.exponent);
            (a.mantissa.clone(), &b.mantissa * pow10(shift), a.exponent)
        }
    }
}

/// Integers `n`, `d` with `n / d == a / b`.
fn quotient_parts(a: &Decimal, b: &Decimal) -> Option<(BigInt, BigInt)> {
    if b.is_zero() {
        return None;
    }
    let (n, d, _) = aligned(a, b);
    Some((n, d))
}

fn saturate(v: BigInt) -> i64 {
    v.to_i64().unwrap_or(if v.is_negative() { i64::MIN } else { i64::MAX })
}

impl PartialEq for Decimal {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Decimal {}

impl PartialOrd for Decimal {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Decimal {
    fn cmp(&self, other: &Self) -> Ordering {
        let (a, b, _) = aligned(self, other);
        a.cmp(&b)
    }
}

impl fmt::Display for Decimal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let digits = self.mantissa.abs().to_string();
        let sign = if self.mantissa.is_negative() { "-" } else { "" };
        if self.exponent >= 0 {
            let zeros = "0".repeat(self.exponent.unsigned_abs() as usize);
            return write!(f, "{sign}{digits}{zeros}");
        }
        let frac = self.exponent.unsigned_abs() as usize;
        if digits.len() > frac {
            let (i, d) = digits.split_at(digits.len() - frac);
            write!(f, "{sign}{i}.{d}")
        } else {
            write!(f, "{sign}0.{}{digits}", "0".repeat(frac - digits.len()))
        }
    }
}

impl serde::Serialize for Decimal {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_f64(self.to_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> Decimal {
        Decimal::parse(s).unwrap()
    }

    #[test]
    fn float_reads_as_the_decimal_it_prints() {
        assert_eq!(Decimal::from_f64(0.44).unwrap(), d("0.44"));
        assert_eq!(Decimal::from_f64(1e300).unwrap(), d("1e300"));
        assert_eq!(Decimal::from_f64(-2.5e-7).unwrap(), d("-0.00000025"));
        assert!(Decimal::from_f64(f64::NAN).is_none());
        assert!(Decimal::from_f64(f64::INFINITY).is_none());
    }

    #[test]
    fn ceil_and_floor_are_exact() {
        let usage = d("0.44").mul_int(10);
        assert_eq!(usage.div_ceil(&d("0.4")), Some(11));
        assert_eq!(usage.div_floor(&d("0.4")), Some(11));
        assert_eq!(d("5.08").div_floor(&d("1")), Some(5));
        assert_eq!(d("-1.5").div_floor(&d("1")), Some(-2));
        assert_eq!(d("1").div_ceil(&Decimal::zero()), None);
        assert_eq!(d("1e40").div_ceil(&d("1")), Some(i64::MAX));
    }

    #[test]
    fn parse_rejects_garbage_and_displays_plainly() {
        for bad in ["", ".", "1.2.3", "abc", "1e", "--1", "1 "] {
            assert!(Decimal::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(d("0.150").to_string(), "0.15");
        assert_eq!(d("1.5e3").to_string(), "1500");
        assert_eq!(d("-0.001").to_string(), "-0.001");
        assert_eq!(d("+.5").to_string(), "0.5");
        assert_eq!(d("0.44").add(&d("0.06")), d("0.5"));
        assert_eq!(d("1").sub(&d("0.01")), d("0.99"));
    }
}
