//! Exact decimal arithmetic for the replica formulas.
//!
//! Metric values arrive as `f64`, but people write watermarks as decimals and expect
//! `10 x 0.44 / 0.40` to be exactly 11. Binary floating point gives 11.000000000000002 and a
//! ceiling of 12, so every comparison and ceil/floor in the engine runs on the *decimal* a float
//! prints as (its shortest round-trip representation), held as an integer times a power of ten.
//!
//! Nearly every mantissa a rule or a reading holds fits in 64 bits, and a rule keeps several
//! decimals for as long as it runs: those are held inline, and only a mantissa that outgrows
//! 64 bits (a value like 1e300, or a product of long decimals) takes a heap-allocated big integer.
//! Arithmetic runs in 128 bits and falls back to big integers only on overflow, so both forms
//! give the same exact results.

use std::cmp::Ordering;
use std::fmt;

use num_bigint::BigInt;
use num_integer::Integer;
use num_traits::{Signed, ToPrimitive, Zero};

/// An exact decimal number: `mantissa x 10^exponent`.
#[derive(Clone, Debug)]
pub struct Decimal {
    mantissa: Mantissa,
    exponent: i32,
}

#[derive(Clone, Debug)]
enum Mantissa {
    Small(i64),
    Big(Box<BigInt>),
}

impl Mantissa {
    fn from_i128(value: i128) -> Self {
        match i64::try_from(value) {
            Ok(small) => Mantissa::Small(small),
            Err(_) => Mantissa::Big(Box::new(BigInt::from(value))),
        }
    }

    fn from_big(value: BigInt) -> Self {
        match value.to_i64() {
            Some(small) => Mantissa::Small(small),
            None => Mantissa::Big(Box::new(value)),
        }
    }

    fn small(&self) -> Option<i128> {
        match self {
            Mantissa::Small(v) => Some(i128::from(*v)),
            Mantissa::Big(_) => None,
        }
    }

    fn big(&self) -> BigInt {
        match self {
            Mantissa::Small(v) => BigInt::from(*v),
            Mantissa::Big(v) => (**v).clone(),
        }
    }

    fn is_zero(&self) -> bool {
        match self {
            Mantissa::Small(v) => *v == 0,
            Mantissa::Big(v) => v.is_zero(),
        }
    }

    fn is_negative(&self) -> bool {
        match self {
            Mantissa::Small(v) => *v < 0,
            Mantissa::Big(v) => v.is_negative(),
        }
    }

    /// The digits of the absolute value.
    fn abs_digits(&self) -> String {
        match self {
            Mantissa::Small(v) => v.unsigned_abs().to_string(),
            Mantissa::Big(v) => v.abs().to_string(),
        }
    }
}

impl fmt::Display for Mantissa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mantissa::Small(v) => write!(f, "{v}"),
            Mantissa::Big(v) => write!(f, "{v}"),
        }
    }
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
        Decimal { mantissa: Mantissa::Small(value), exponent: 0 }
    }

    /// `mantissa x 10^exponent`.
    pub fn from_parts(mantissa: i128, exponent: i32) -> Self {
        Decimal { mantissa: Mantissa::from_i128(mantissa), exponent }
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
        Ok(normalized(mantissa, exponent))
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
        let exponent = self.exponent + other.exponent;
        let product = match (self.mantissa.small(), other.mantissa.small()) {
            (Some(a), Some(b)) => a.checked_mul(b),
            _ => None,
        };
        let mantissa = match product {
            Some(product) => Mantissa::from_i128(product),
            None => Mantissa::from_big(self.mantissa.big() * other.mantissa.big()),
        };
        Decimal { mantissa, exponent }
    }

    pub fn mul_int(&self, factor: u64) -> Decimal {
        let mantissa = match self.mantissa.small().and_then(|a| a.checked_mul(i128::from(factor))) {
            Some(product) => Mantissa::from_i128(product),
            None => Mantissa::from_big(self.mantissa.big() * BigInt::from(factor)),
        };
        Decimal { mantissa, exponent: self.exponent }
    }

    pub fn add(&self, other: &Decimal) -> Decimal {
        if let Some((sum, exponent)) = aligned_small(self, other).and_then(|(a, b, e)| Some((a.checked_add(b)?, e))) {
            return Decimal { mantissa: Mantissa::from_i128(sum), exponent };
        }
        let (a, b, exponent) = aligned_big(self, other);
        Decimal { mantissa: Mantissa::from_big(a + b), exponent }
    }

    pub fn sub(&self, other: &Decimal) -> Decimal {
        if let Some((difference, exponent)) =
            aligned_small(self, other).and_then(|(a, b, e)| Some((a.checked_sub(b)?, e)))
        {
            return Decimal { mantissa: Mantissa::from_i128(difference), exponent };
        }
        let (a, b, exponent) = aligned_big(self, other);
        Decimal { mantissa: Mantissa::from_big(a - b), exponent }
    }

    /// `ceil(self / divisor)`, saturated to the `i64` range. `None` when `divisor` is zero.
    pub fn div_ceil(&self, divisor: &Decimal) -> Option<i64> {
        if divisor.is_zero() {
            return None;
        }
        if let Some((d, q, r)) = small_quotient(self, divisor) {
            // Truncation rounded towards zero; a positive remainder of a positive quotient
            // rounds up.
            let ceil = if r != 0 && ((r > 0) == (d > 0)) { q + 1 } else { q };
            return Some(saturate_i128(ceil));
        }
        let (n, d, _) = aligned_big(self, divisor);
        Some(saturate(Integer::div_ceil(&n, &d)))
    }

    /// `floor(self / divisor)`, saturated to the `i64` range. `None` when `divisor` is zero.
    pub fn div_floor(&self, divisor: &Decimal) -> Option<i64> {
        if divisor.is_zero() {
            return None;
        }
        if let Some((d, q, r)) = small_quotient(self, divisor) {
            let floor = if r != 0 && ((r < 0) != (d < 0)) { q - 1 } else { q };
            return Some(saturate_i128(floor));
        }
        let (n, d, _) = aligned_big(self, divisor);
        Some(saturate(n.div_floor(&d)))
    }
}

/// The decimal with trailing zeros of the mantissa moved into the exponent.
fn normalized(mut mantissa: BigInt, mut exponent: i32) -> Decimal {
    if mantissa.is_zero() {
        return Decimal { mantissa: Mantissa::Small(0), exponent: 0 };
    }
    let ten = BigInt::from(10);
    loop {
        let (q, r) = mantissa.div_rem(&ten);
        if !r.is_zero() {
            return Decimal { mantissa: Mantissa::from_big(mantissa), exponent };
        }
        mantissa = q;
        exponent += 1;
    }
}

fn pow10(exp: u32) -> BigInt {
    num_traits::pow(BigInt::from(10), exp as usize)
}

/// `(d, n / d truncated, n % d)` for `a / b == n / d` in 128 bits, when the operands fit.
fn small_quotient(a: &Decimal, b: &Decimal) -> Option<(i128, i128, i128)> {
    let (n, d, _) = aligned_small(a, b)?;
    Some((d, n.checked_div(d)?, n.checked_rem(d)?))
}

/// Both mantissas brought to the smaller exponent in 128 bits; `None` when either is big or
/// the shift overflows.
fn aligned_small(a: &Decimal, b: &Decimal) -> Option<(i128, i128, i32)> {
    let (x, y) = (a.mantissa.small()?, b.mantissa.small()?);
    let shift = |v: i128, by: u32| 10i128.checked_pow(by).and_then(|p| v.checked_mul(p));
    match a.exponent.cmp(&b.exponent) {
        Ordering::Equal => Some((x, y, a.exponent)),
        Ordering::Greater => Some((shift(x, a.exponent.abs_diff(b.exponent))?, y, b.exponent)),
        Ordering::Less => Some((x, shift(y, b.exponent.abs_diff(a.exponent))?, a.exponent)),
    }
}

/// Both mantissas brought to the smaller exponent.
fn aligned_big(a: &Decimal, b: &Decimal) -> (BigInt, BigInt, i32) {
    match a.exponent.cmp(&b.exponent) {
        Ordering::Equal => (a.mantissa.big(), b.mantissa.big(), a.exponent),
        Ordering::Greater => {
            let shift = a.exponent.abs_diff(b.exponent);
            (a.mantissa.big() * pow10(shift), b.mantissa.big(), b.exponent)
        }
        Ordering::Less => {
            let shift = b.exponent.abs_diff(a.exponent);
            (a.mantissa.big(), b.mantissa.big() * pow10(shift), a.exponent)
        }
    }
}

fn saturate(v: BigInt) -> i64 {
    v.to_i64().unwrap_or(if v.is_negative() { i64::MIN } else { i64::MAX })
}

fn saturate_i128(v: i128) -> i64 {
    i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX })
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
        if let Some((a, b, _)) = aligned_small(self, other) {
            return a.cmp(&b);
        }
        let (a, b, _) = aligned_big(self, other);
        a.cmp(&b)
    }
}

impl fmt::Display for Decimal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let digits = self.mantissa.abs_digits();
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

/// A number as a person would write it: about four significant digits, no trailing zeros.
pub fn human(v: f64) -> String {
    if !v.is_finite() {
        return v.to_string();
    }
    if v == 0.0 {
        return "0".into();
    }
    let magnitude = v.abs().log10().floor() as i32;
    let decimals = usize::try_from((3 - magnitude).clamp(0, 9)).unwrap_or(0);
    let text = format!("{v:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
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

    /// The same value with its mantissa forced onto the heap, as a mantissa past 64 bits is.
    fn boxed(value: &Decimal) -> Decimal {
        Decimal { mantissa: Mantissa::Big(Box::new(value.mantissa.big())), exponent: value.exponent }
    }

    #[test]
    fn mantissas_past_64_bits_stay_exact() {
        let max = Decimal::from_int(i64::MAX);
        assert_eq!(max.add(&d("1")).to_string(), "9223372036854775808");
        assert_eq!(Decimal::from_int(i64::MIN).sub(&d("1")).to_string(), "-9223372036854775809");
        assert_eq!(max.mul(&max).div_floor(&max), Some(i64::MAX));
        assert_eq!(d("1e300").sub(&d("1e300")), Decimal::zero());
        assert_eq!(d("123456789012345678901234567890").div_floor(&d("1e20")), Some(1_234_567_890));
        assert!(d("1e-30").cmp(&d("1e-31")).is_gt());
        assert_eq!(max.mul_int(u64::MAX).div_ceil(&Decimal::from_int(i64::MAX)), Some(i64::MAX));
    }

    proptest::proptest! {
        /// Inline arithmetic and big-integer arithmetic give the same results.
        #[test]
        fn inline_and_heap_mantissas_agree(
            a in proptest::prelude::any::<i64>(),
            ea in -20i32..20,
            b in proptest::prelude::any::<i64>(),
            eb in -20i32..20,
            factor in proptest::prelude::any::<u64>(),
        ) {
            let (x, y) = (Decimal::from_parts(i128::from(a), ea), Decimal::from_parts(i128::from(b), eb));
            let (bx, by) = (boxed(&x), boxed(&y));
            proptest::prop_assert_eq!(x.cmp(&y), bx.cmp(&by));
            proptest::prop_assert_eq!(x.add(&y).to_string(), bx.add(&by).to_string());
            proptest::prop_assert_eq!(x.sub(&y).to_string(), bx.sub(&by).to_string());
            proptest::prop_assert_eq!(x.mul(&y).to_string(), bx.mul(&by).to_string());
            proptest::prop_assert_eq!(x.mul_int(factor).to_string(), bx.mul_int(factor).to_string());
            proptest::prop_assert_eq!(x.div_ceil(&y), bx.div_ceil(&by));
            proptest::prop_assert_eq!(x.div_floor(&y), bx.div_floor(&by));
        }
    }
}
