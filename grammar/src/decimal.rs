//! Exact arithmetic on unsigned decimal literals (`12`, `1.5`), shared by
//! durations, ratios and quantities, so that `1.1s` is exactly 1 100 ms.

/// Splits `12.50` into `("12", "50")`; the fraction is empty when absent.
fn split(decimal: &str) -> (&str, &str) {
    decimal.split_once('.').unwrap_or((decimal, ""))
}

/// `decimal × multiplier`, rounded down; `None` on overflow of `u128`.
///
/// Digits of the fraction past the 20th are ignored: with multipliers below
/// 10^18 they cannot change the result.
pub(crate) fn scaled_floor(decimal: &str, multiplier: u128) -> Option<u128> {
    let (int, frac) = split(decimal);
    let frac = frac.get(..frac.len().min(20)).unwrap_or(frac);
    let whole = int.parse::<u128>().ok()?.checked_mul(multiplier)?;
    if frac.is_empty() {
        return Some(whole);
    }
    let denominator = 10u128.checked_pow(u32::try_from(frac.len()).ok()?)?;
    let part = frac.parse::<u128>().ok()?.checked_mul(multiplier)? / denominator;
    whole.checked_add(part)
}

/// The result of [`scaled_exact`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Exact {
    /// `decimal × multiplier` is this whole number.
    Whole(u128),
    /// The product has a fractional part.
    Fractional,
    /// The product, or an intermediate step, does not fit.
    Overflow,
}

/// `decimal × multiplier` when it is a whole number.
pub(crate) fn scaled_exact(decimal: &str, multiplier: u128) -> Exact {
    let (int, frac) = split(decimal);
    let frac = frac.trim_end_matches('0');
    let Some(whole) = int
        .parse::<u128>()
        .ok()
        .and_then(|i| i.checked_mul(multiplier))
    else {
        return Exact::Overflow;
    };
    if frac.is_empty() {
        return Exact::Whole(whole);
    }
    let Some(denominator) = u32::try_from(frac.len())
        .ok()
        .and_then(|len| 10u128.checked_pow(len))
    else {
        return Exact::Overflow;
    };
    let Some(numerator) = frac
        .parse::<u128>()
        .ok()
        .and_then(|f| f.checked_mul(multiplier))
    else {
        return Exact::Overflow;
    };
    if numerator % denominator != 0 {
        return Exact::Fractional;
    }
    whole
        .checked_add(numerator / denominator)
        .map_or(Exact::Overflow, Exact::Whole)
}

/// The `f64` nearest to `decimal × 10^shift`, correctly rounded (no double
/// rounding through an intermediate division).
pub(crate) fn to_f64(decimal: &str, shift: i32) -> Option<f64> {
    let (int, frac) = split(decimal);
    let exponent = i64::from(shift) - i64::try_from(frac.len()).ok()?;
    format!("{int}{frac}e{exponent}").parse::<f64>().ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn floor_and_exact() {
        assert_eq!(scaled_floor("1.5", 1000), Some(1500));
        assert_eq!(scaled_floor("0.0015", 1000), Some(1));
        assert_eq!(scaled_floor("7", 3), Some(21));
        assert_eq!(scaled_exact("1.5", 1024), Exact::Whole(1536));
        assert_eq!(scaled_exact("1.50000", 2), Exact::Whole(3));
        assert_eq!(scaled_exact("1.3", 2), Exact::Fractional);
        assert_eq!(
            scaled_exact("999999999999999999999999999999999999999", 10),
            Exact::Overflow
        );
    }

    #[test]
    fn f64_is_correctly_rounded() {
        assert_eq!(to_f64("70", -2), Some(0.7));
        assert_eq!(to_f64("70.5", -2), Some(0.705));
        assert_eq!(to_f64("0.7", 0), Some(0.7));
        assert_eq!(to_f64("12", 0), Some(12.0));
    }
}
