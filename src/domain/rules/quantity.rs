//! Kubernetes quantities (`400m`, `1.5k`, `2Gi`, `1e3`) read exactly into an engine `Decimal`.
//!
//! Watermarks are written the way Kubernetes writes resource amounts, so that a value copied from
//! a `WatermarkPodAutoscaler` object means the same here. The value is exact: `400m` is 0.4 as a
//! decimal, never the nearest binary float, because the engine's replica formulas depend on it.
//! CRD mode reuses this parser for the same fields.

use watermarkd_engine::Decimal;

/// Largest decimal exponent a quantity may carry. Far beyond any watermark, and small enough that
/// printing the value in an error message stays short.
const MAX_EXPONENT: i32 = 50;

/// Why a text is not a Kubernetes quantity.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a Kubernetes quantity: {reason} (examples: \"400m\", \"1.5k\", \"2Gi\", \"1e3\", \"0.25\")")]
pub struct QuantityError {
    pub text: String,
    pub reason: String,
}

/// Reads `<sign?><digits with an optional point><suffix?>`, where the suffix is a decimal SI
/// prefix (`n u m k M G T P E`), a binary one (`Ki Mi Gi Ti Pi Ei`) or a decimal exponent
/// (`e3`, `E-2`). A lone `E` is exa, as in Kubernetes; `E` followed by digits is an exponent.
pub fn parse_quantity(text: &str) -> Result<Decimal, QuantityError> {
    let fail = |reason: &str| QuantityError { text: text.to_string(), reason: reason.to_string() };
    if text.is_empty() {
        return Err(fail("it is empty"));
    }
    let number_len = text.find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '+' | '-'))).unwrap_or(text.len());
    let (number, suffix) = text.split_at(number_len);
    if !number.bytes().any(|b| b.is_ascii_digit()) {
        return Err(fail("it does not start with a number"));
    }
    // Decimal::parse also accepts an exponent, but `number` cannot contain one here: the split
    // stopped at the first letter.
    let mantissa = Decimal::parse(number).map_err(|_| fail("the number part is malformed"))?;
    let multiplier = suffix_multiplier(suffix).map_err(|reason| fail(&reason))?;
    Ok(normalized(mantissa.mul(&multiplier)))
}

/// The same value without trailing zeros, so that it prints as `0.15`, not `0.150`, in messages
/// and summaries. `Decimal::parse` normalizes, and a decimal always reads back from its display.
fn normalized(value: Decimal) -> Decimal {
    Decimal::parse(&value.to_string()).unwrap_or(value)
}

/// The factor a suffix stands for.
fn suffix_multiplier(suffix: &str) -> Result<Decimal, String> {
    let power_of_ten = |exponent: i32| Decimal::from_parts(1, exponent);
    let power_of_two = |bits: u32| Decimal::from_int(1_i64 << bits);
    Ok(match suffix {
        "" => Decimal::from_int(1),
        "n" => power_of_ten(-9),
        "u" => power_of_ten(-6),
        "m" => power_of_ten(-3),
        "k" => power_of_ten(3),
        "M" => power_of_ten(6),
        "G" => power_of_ten(9),
        "T" => power_of_ten(12),
        "P" => power_of_ten(15),
        "E" => power_of_ten(18),
        "Ki" => power_of_two(10),
        "Mi" => power_of_two(20),
        "Gi" => power_of_two(30),
        "Ti" => power_of_two(40),
        "Pi" => power_of_two(50),
        "Ei" => power_of_two(60),
        _ => {
            let exponent = suffix
                .strip_prefix(['e', 'E'])
                .and_then(|digits| digits.parse::<i32>().ok())
                .ok_or_else(|| format!("unknown suffix {suffix:?}"))?;
            if !(-MAX_EXPONENT..=MAX_EXPONENT).contains(&exponent) {
                return Err(format!("the exponent {exponent} is outside -{MAX_EXPONENT}..={MAX_EXPONENT}"));
            }
            power_of_ten(exponent)
        }
    })
}

/// A short human form of a value for summaries: fractions below one in milli units (`150m`),
/// everything else as a plain decimal (`120`, `1.5`).
pub fn format_quantity(value: &Decimal) -> String {
    let is_whole = |d: &Decimal| d.div_floor(&Decimal::from_int(1)) == d.div_ceil(&Decimal::from_int(1));
    let milli = normalized(value.mul_int(1000));
    let below_one = *value < Decimal::from_int(1) && *value > Decimal::from_int(-1);
    if !is_whole(value) && below_one && is_whole(&milli) {
        format!("{milli}m")
    } else {
        value.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(text: &str) -> Decimal {
        parse_quantity(text).unwrap_or_else(|e| panic!("{e}"))
    }

    fn d(text: &str) -> Decimal {
        Decimal::parse(text).unwrap()
    }

    #[test]
    fn decimal_suffixes_are_exact() {
        assert_eq!(q("400m"), d("0.4"));
        assert_eq!(q("150m"), d("0.15"));
        assert_eq!(q("1.5k"), d("1500"));
        assert_eq!(q("5n"), d("0.000000005"));
        assert_eq!(q("3u"), d("0.000003"));
        assert_eq!(q("2M"), d("2000000"));
        assert_eq!(q("1G"), d("1e9"));
        assert_eq!(q("1T"), d("1e12"));
        assert_eq!(q("1P"), d("1e15"));
        assert_eq!(q("1E"), d("1e18"));
        assert_eq!(q("120"), d("120"));
        assert_eq!(q("0.25"), d("0.25"));
    }

    #[test]
    fn binary_suffixes_are_powers_of_two() {
        assert_eq!(q("1Ki"), d("1024"));
        assert_eq!(q("1.5Mi"), d("1572864"));
        assert_eq!(q("2Gi"), d("2147483648"));
        assert_eq!(q("1Ti"), d("1099511627776"));
        assert_eq!(q("1Pi"), d("1125899906842624"));
        assert_eq!(q("1Ei"), d("1152921504606846976"));
    }

    #[test]
    fn exponents_and_signs() {
        assert_eq!(q("1e3"), d("1000"));
        assert_eq!(q("1.5E-2"), d("0.015"));
        assert_eq!(q("2e+2"), d("200"));
        assert_eq!(q("-1.5k"), d("-1500"));
        assert_eq!(q("+400m"), d("0.4"));
        assert_eq!(q(".5"), d("0.5"));
        assert_eq!(q("5."), d("5"));
    }

    #[test]
    fn garbage_is_rejected_with_a_reason() {
        for bad in
            ["", "m", "abc", "4OOm", "1.2.3", "1 k", " 1", "1K", "1ki", "1e", "1e3m", "1mm", "--1", "1Gi2", ".", "1e99"]
        {
            assert!(parse_quantity(bad).is_err(), "{bad:?} should be rejected");
        }
        let err = parse_quantity("40x").unwrap_err().to_string();
        assert!(err.contains(r#""40x" is not a Kubernetes quantity: unknown suffix "x""#), "{err}");
        let err = parse_quantity("e3").unwrap_err().to_string();
        assert!(err.contains("does not start with a number"), "{err}");
    }

    #[test]
    fn values_print_without_trailing_zeros() {
        assert_eq!(q("150m").to_string(), "0.15");
        assert_eq!(q("1.5Ki").to_string(), "1536");
        assert_eq!(q("2.50").to_string(), "2.5");
    }

    #[test]
    fn summaries_print_fractions_in_milli_units() {
        assert_eq!(format_quantity(&q("400m")), "400m");
        assert_eq!(format_quantity(&q("0.05")), "50m");
        assert_eq!(format_quantity(&q("120")), "120");
        assert_eq!(format_quantity(&q("1.5")), "1.5");
        assert_eq!(format_quantity(&q("0.0001")), "0.0001");
        assert_eq!(format_quantity(&q("2Gi")), "2147483648");
    }
}
