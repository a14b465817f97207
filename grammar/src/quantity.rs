//! Ratios (`70%`, `0.7`) and Kubernetes-style quantities (`16Ki`, `2M`,
//! `1024`).

use pest::Parser;
use pest::iterators::{Pair, Pairs};
use pest_derive::Parser;

use crate::decimal::{self, Exact};
use crate::error::{Failure, Span, SyntaxError, render_failure};

#[derive(Parser)]
#[grammar = "quantity.pest"]
struct QuantityParser;

/// Suffixes and their multipliers.
const SUFFIXES: [(&str, u128); 12] = [
    ("k", 1_000),
    ("M", 1_000_000),
    ("G", 1_000_000_000),
    ("T", 1_000_000_000_000),
    ("P", 1_000_000_000_000_000),
    ("E", 1_000_000_000_000_000_000),
    ("Ki", 1 << 10),
    ("Mi", 1 << 20),
    ("Gi", 1 << 30),
    ("Ti", 1 << 40),
    ("Pi", 1 << 50),
    ("Ei", 1 << 60),
];

const SUFFIX_HELP: &str = "valid suffixes are `k`, `M`, `G`, `T`, `P`, `E` (powers of 1000) \
                           and `Ki`, `Mi`, `Gi`, `Ti`, `Pi`, `Ei` (powers of 1024)";

/// Parses a ratio: a percentage (`70%` is 0.7) or a plain number (`0.7`).
///
/// Negative numbers are rejected; any other range check (such as at most 1)
/// is left to the caller. The result is the `f64` nearest to the exact
/// decimal value, so `70%` and `0.7` give the same number.
pub fn parse_ratio(input: &str) -> Result<f64, SyntaxError> {
    // The common, well-formed case without the grammar: digits, a fraction, a `%`.
    if let Some((number, rest)) = split_decimal(input)
        && (rest.is_empty() || rest == "%")
        && let Some(r) = decimal::to_f64(number, if rest.is_empty() { 0 } else { -2 })
        && r.is_finite()
    {
        return Ok(r);
    }
    ratio_with_grammar(input)
}

fn ratio_with_grammar(input: &str) -> Result<f64, SyntaxError> {
    let pairs = parse(Rule::ratio, input, "ratio", "`70%` or `0.7`")?;
    let mut number = None;
    let mut percent = false;
    for pair in pairs.flatten() {
        match pair.as_rule() {
            Rule::sign => return Err(sign_error(&pair, "ratios")),
            Rule::decimal => number = Some(pair.as_str()),
            Rule::percent => percent = true,
            _ => {}
        }
    }
    let shift = if percent { -2 } else { 0 };
    number
        .and_then(|n| decimal::to_f64(n, shift))
        .filter(|r| r.is_finite())
        .ok_or_else(|| {
            SyntaxError::new(
                Span::new(0, input.len()),
                format!("invalid ratio `{input}`"),
            )
        })
}

/// Parses a quantity: a whole number with an optional suffix, as in
/// Kubernetes: `16Ki` (16 × 1024), `2Mi`, `1Gi`, `16k` (16 000), `2M`, `1G`,
/// `1024`.
///
/// A fraction is allowed when the result is whole (`1.5Ki` is 1536). Negative
/// numbers, unknown suffixes and values above `u64::MAX` are errors.
pub fn parse_quantity(input: &str) -> Result<u64, SyntaxError> {
    // The common, well-formed case without the grammar: a whole result with a known suffix.
    if let Some((number, suffix)) = split_decimal(input)
        && let Some(multiplier) = match suffix {
            "" => Some(1),
            _ => SUFFIXES.iter().find(|(n, _)| *n == suffix).map(|(_, m)| *m),
        }
        && let Exact::Whole(value) = decimal::scaled_exact(number, multiplier)
        && let Ok(v) = u64::try_from(value)
    {
        return Ok(v);
    }
    quantity_with_grammar(input)
}

fn quantity_with_grammar(input: &str) -> Result<u64, SyntaxError> {
    let pairs = parse(Rule::quantity, input, "quantity", "`16Ki`, `2M` or `1024`")?;
    let mut number: Option<Pair<'_, Rule>> = None;
    let mut multiplier = 1;
    for pair in pairs.flatten() {
        match pair.as_rule() {
            Rule::sign => return Err(sign_error(&pair, "quantities")),
            Rule::decimal => number = Some(pair),
            Rule::suffix => multiplier = suffix_multiplier(&pair)?,
            _ => {}
        }
    }
    let whole_span = Span::new(0, input.len());
    let too_large = || {
        SyntaxError::new(whole_span, format!("quantity `{input}` is too large"))
            .with_help(format!("the largest quantity is {}", u64::MAX))
    };
    let Some(number) = number else {
        return Err(SyntaxError::new(
            whole_span,
            format!("invalid quantity `{input}`"),
        ));
    };
    match decimal::scaled_exact(number.as_str(), multiplier) {
        Exact::Whole(value) => u64::try_from(value).map_err(|_| too_large()),
        Exact::Overflow => Err(too_large()),
        Exact::Fractional => Err(SyntaxError::new(
            whole_span,
            format!("quantity `{input}` is not a whole number"),
        )
        .with_help("quantities count whole units; use a larger suffix or fewer decimals")),
    }
}

/// `input` split after its leading `digits(.digits)?` (the grammar's `decimal`), when it has one.
fn split_decimal(input: &str) -> Option<(&str, &str)> {
    let b = input.as_bytes();
    let digits = |from: usize| from + b[from..].iter().take_while(|c| c.is_ascii_digit()).count();
    let int_end = digits(0);
    if int_end == 0 {
        return None;
    }
    let mut end = int_end;
    if b.get(end) == Some(&b'.') {
        let frac_end = digits(end + 1);
        if frac_end > end + 1 {
            end = frac_end;
        }
    }
    Some(input.split_at(end))
}

fn parse<'i>(
    rule: Rule,
    input: &'i str,
    what: &str,
    example: &str,
) -> Result<Pairs<'i, Rule>, SyntaxError> {
    if input.trim().is_empty() {
        return Err(
            SyntaxError::new(Span::new(0, input.len()), format!("empty {what}"))
                .with_help(format!("write a number such as {example}")),
        );
    }
    QuantityParser::parse(rule, input).map_err(|err| {
        let failure = Failure::from_pest(&err);
        let error = render_failure(&failure, input, describe);
        if failure.expected.contains(&Rule::percent) {
            error.with_help("a ratio is a number such as `0.7`, or a percentage such as `70%`")
        } else {
            error.with_help(format!("write a number such as {example}"))
        }
    })
}

fn suffix_multiplier(pair: &Pair<'_, Rule>) -> Result<u128, SyntaxError> {
    let text = pair.as_str();
    if let Some((_, m)) = SUFFIXES.iter().find(|(name, _)| *name == text) {
        return Ok(*m);
    }
    let error = SyntaxError::new(
        Span::of(pair.as_span()),
        format!("unknown quantity suffix `{text}`"),
    );
    let hint = match text {
        "K" => "did you mean `k` (1000) or `Ki` (1024)? ".to_owned(),
        "m" => "fractional quantities such as `500m` are not supported; ".to_owned(),
        _ => {
            let mut chars = text.chars();
            let fixed: String = chars.next().map_or(String::new(), |first| {
                first
                    .to_uppercase()
                    .chain(chars.flat_map(char::to_lowercase))
                    .collect()
            });
            if SUFFIXES.iter().any(|(name, _)| *name == fixed) {
                format!("did you mean `{fixed}`? ")
            } else {
                String::new()
            }
        }
    };
    Err(error.with_help(format!("{hint}{SUFFIX_HELP}")))
}

fn sign_error(pair: &Pair<'_, Rule>, what: &str) -> SyntaxError {
    let span = Span::of(pair.as_span());
    if pair.as_str() == "-" {
        SyntaxError::new(span, format!("{what} cannot be negative")).with_help("remove the `-`")
    } else {
        SyntaxError::new(span, "unexpected `+`").with_help("remove the `+`")
    }
}

fn describe(rule: Rule) -> &'static str {
    match rule {
        Rule::percent => "`%`",
        Rule::suffix => "a suffix",
        Rule::EOI => "end of input",
        Rule::ratio | Rule::quantity | Rule::sign | Rule::decimal => "a number",
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    proptest::proptest! {
        /// The fast paths agree with the grammar, errors included.
        #[test]
        fn fast_paths_match_the_grammar(s in "[0-9.%kKMGTPEim+ -]{0,8}") {
            proptest::prop_assert_eq!(
                format!("{:?}", parse_ratio(&s)),
                format!("{:?}", ratio_with_grammar(&s))
            );
            proptest::prop_assert_eq!(
                format!("{:?}", parse_quantity(&s)),
                format!("{:?}", quantity_with_grammar(&s))
            );
        }
    }

    #[test]
    fn ratios() {
        assert_eq!(parse_ratio("70%").unwrap(), 0.7);
        assert_eq!(parse_ratio("0.7").unwrap(), 0.7);
        assert_eq!(parse_ratio("70.5%").unwrap(), 0.705);
        assert_eq!(parse_ratio("100%").unwrap(), 1.0);
        assert_eq!(parse_ratio("1").unwrap(), 1.0);
        // Range is the caller's business.
        assert_eq!(parse_ratio("150%").unwrap(), 1.5);
        assert_eq!(parse_ratio("0%").unwrap(), 0.0);
    }

    #[test]
    fn bad_ratios() {
        let err = parse_ratio("-5%").unwrap_err();
        assert_eq!(err.message, "ratios cannot be negative");
        assert_eq!(err.span, Span::new(0, 1));
        let err = parse_ratio("70 %").unwrap_err();
        assert_eq!(
            err.message,
            "expected `%` or end of input, found whitespace"
        );
        assert_eq!(err.span, Span::new(2, 3));
        let err = parse_ratio("high").unwrap_err();
        assert_eq!(err.message, "expected a number, found `high`");
        assert_eq!(err.span, Span::new(0, 4));
        assert_eq!(parse_ratio("").unwrap_err().message, "empty ratio");
        let err = parse_ratio(".5").unwrap_err();
        assert_eq!(err.message, "expected a number, found `.`");
    }

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity("1024").unwrap(), 1024);
        assert_eq!(parse_quantity("16Ki").unwrap(), 16 * 1024);
        assert_eq!(parse_quantity("2Mi").unwrap(), 2 << 20);
        assert_eq!(parse_quantity("1Gi").unwrap(), 1 << 30);
        assert_eq!(parse_quantity("16k").unwrap(), 16_000);
        assert_eq!(parse_quantity("2M").unwrap(), 2_000_000);
        assert_eq!(parse_quantity("1G").unwrap(), 1_000_000_000);
        assert_eq!(parse_quantity("1.5Ki").unwrap(), 1536);
        assert_eq!(parse_quantity("0.5k").unwrap(), 500);
        assert_eq!(parse_quantity("15Ei").unwrap(), 15 << 60);
        assert_eq!(parse_quantity("18446744073709551615").unwrap(), u64::MAX);
        assert_eq!(parse_quantity("0").unwrap(), 0);
    }

    #[test]
    fn bad_quantities() {
        let err = parse_quantity("16K").unwrap_err();
        assert_eq!(err.message, "unknown quantity suffix `K`");
        assert_eq!(err.span, Span::new(2, 3));
        assert!(
            err.help
                .unwrap()
                .starts_with("did you mean `k` (1000) or `Ki` (1024)?")
        );
        let err = parse_quantity("16ki").unwrap_err();
        assert!(err.help.unwrap().starts_with("did you mean `Ki`?"));
        let err = parse_quantity("500m").unwrap_err();
        assert!(err.help.unwrap().starts_with("fractional quantities"));
        let err = parse_quantity("1.0001k").unwrap_err();
        assert_eq!(err.message, "quantity `1.0001k` is not a whole number");
        let err = parse_quantity("1.5").unwrap_err();
        assert_eq!(err.message, "quantity `1.5` is not a whole number");
        let err = parse_quantity("16Ei").unwrap_err();
        assert_eq!(err.message, "quantity `16Ei` is too large");
        let err = parse_quantity("18446744073709551616").unwrap_err();
        assert_eq!(err.message, "quantity `18446744073709551616` is too large");
        let err = parse_quantity("-1").unwrap_err();
        assert_eq!(err.message, "quantities cannot be negative");
        let err = parse_quantity("1 Gi").unwrap_err();
        assert_eq!(
            err.message,
            "expected a suffix or end of input, found whitespace"
        );
        assert_eq!(parse_quantity(" ").unwrap_err().message, "empty quantity");
    }
}
