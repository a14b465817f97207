//! Durations: `30s`, `500ms`, `1.5s`, `2m`, `1h`, `100us`, `1m30s`.

use std::time::Duration;

use pest::Parser;
use pest::iterators::Pair;
use pest_derive::Parser;

use crate::decimal;
use crate::error::{Failure, Span, SyntaxError, render_failure};

#[derive(Parser)]
#[grammar = "duration.pest"]
struct DurationParser;

/// The units, largest first, with their length in nanoseconds.
const UNITS: [(&str, u128); 6] = [
    ("h", 3_600_000_000_000),
    ("m", 60_000_000_000),
    ("s", 1_000_000_000),
    ("ms", 1_000_000),
    ("us", 1_000),
    ("ns", 1),
];

const UNITS_HELP: &str =
    "valid units are `h`, `m`, `s`, `ms`, `us` and `ns`, e.g. `30s` or `1m30s`";

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// Parses a duration such as `30s`, `1.5s` or `1m30s`.
///
/// A duration is one or more parts `<number><unit>`, with no spaces, units
/// strictly from largest to smallest. Numbers may have a fraction (`1.5s`);
/// precision below a nanosecond is truncated. Negative durations, a missing
/// unit and unknown units are errors whose help lists the units.
pub fn parse_duration(input: &str) -> Result<Duration, SyntaxError> {
    if input.trim().is_empty() {
        return Err(
            SyntaxError::new(Span::new(0, input.len()), "empty duration")
                .with_help("write a number followed by a unit, e.g. `30s`"),
        );
    }
    let mut pairs =
        DurationParser::parse(Rule::duration, input).map_err(|e| pest_error(&e, input))?;
    let mut total: u128 = 0;
    // Index into UNITS of the previous part, to enforce the order.
    let mut previous: Option<usize> = None;
    for pair in pairs.next().into_iter().flat_map(Pair::into_inner) {
        match pair.as_rule() {
            Rule::sign => return Err(sign_error(&pair)),
            Rule::part => {
                let span = Span::of(pair.as_span());
                let mut inner = pair.into_inner();
                let (Some(number), Some(unit)) = (inner.next(), inner.next()) else {
                    continue;
                };
                let index = unit_index(unit.as_str(), Span::of(unit.as_span()))?;
                if let Some(prev) = previous {
                    check_order(prev, index, span)?;
                }
                previous = Some(index);
                let nanos = UNITS.get(index).map_or(1, |(_, n)| *n);
                total = decimal::scaled_floor(number.as_str(), nanos)
                    .and_then(|part| total.checked_add(part))
                    .ok_or_else(|| too_large(input))?;
            }
            _ => {}
        }
    }
    let secs = u64::try_from(total / NANOS_PER_SEC).map_err(|_| too_large(input))?;
    let nanos = u32::try_from(total % NANOS_PER_SEC).map_err(|_| too_large(input))?;
    Ok(Duration::new(secs, nanos))
}

/// Formats a duration in the normal form accepted by [`parse_duration`]:
/// whole units from largest to smallest, zero parts left out (`1m30s`,
/// `1s500ms`, `0s`).
pub fn format_duration(duration: Duration) -> String {
    let mut rest = duration.as_nanos();
    if rest == 0 {
        return "0s".to_owned();
    }
    let mut out = String::new();
    for (name, nanos) in UNITS {
        let count = rest / nanos;
        rest %= nanos;
        if count > 0 {
            out.push_str(&count.to_string());
            out.push_str(name);
        }
    }
    out
}

fn unit_index(unit: &str, span: Span) -> Result<usize, SyntaxError> {
    if let Some(index) = UNITS.iter().position(|(name, _)| *name == unit) {
        return Ok(index);
    }
    let suggestion = match unit {
        "sec" | "secs" | "second" | "seconds" | "S" => Some("s"),
        "min" | "mins" | "minute" | "minutes" | "M" => Some("m"),
        "hr" | "hrs" | "hour" | "hours" | "H" => Some("h"),
        "msec" | "msecs" | "millis" | "MS" | "Ms" => Some("ms"),
        "µs" | "μs" | "usec" | "usecs" | "micros" => Some("us"),
        "nsec" | "nsecs" | "nanos" => Some("ns"),
        _ => None,
    };
    let error = SyntaxError::new(span, format!("unknown duration unit `{unit}`"));
    Err(match (suggestion, unit) {
        (Some(s), _) => error.with_help(format!("did you mean `{s}`? {UNITS_HELP}")),
        (None, "d" | "day" | "days" | "w" | "week" | "weeks") => {
            error.with_help(format!("write days in hours, e.g. `24h`; {UNITS_HELP}"))
        }
        (None, _) => error.with_help(UNITS_HELP),
    })
}

fn check_order(previous: usize, index: usize, span: Span) -> Result<(), SyntaxError> {
    let name = UNITS.get(index).map_or("", |(n, _)| *n);
    if index == previous {
        Err(
            SyntaxError::new(span, format!("duration unit `{name}` is repeated"))
                .with_help("give each unit once, e.g. `1m30s`"),
        )
    } else if index < previous {
        Err(
            SyntaxError::new(span, "duration units must go from largest to smallest")
                .with_help("write e.g. `1m30s`, not `30s1m`"),
        )
    } else {
        Ok(())
    }
}

fn sign_error(pair: &Pair<'_, Rule>) -> SyntaxError {
    let span = Span::of(pair.as_span());
    if pair.as_str() == "-" {
        SyntaxError::new(span, "durations cannot be negative").with_help("remove the `-`")
    } else {
        SyntaxError::new(span, "unexpected `+`").with_help("remove the `+`")
    }
}

fn too_large(input: &str) -> SyntaxError {
    SyntaxError::new(
        Span::new(0, input.len()),
        format!("duration `{input}` is too large"),
    )
}

fn pest_error(err: &pest::error::Error<Rule>, input: &str) -> SyntaxError {
    let failure = Failure::from_pest(err);
    let error = render_failure(&failure, input, describe);
    if failure.expected.contains(&Rule::unit) {
        let number_start = input
            .get(..failure.pos)
            .and_then(|before| before.rfind(|c: char| !(c.is_ascii_digit() || c == '.')))
            .map_or(0, |i| i + 1);
        let number = input.get(number_start..failure.pos).unwrap_or("");
        let message = match input.get(failure.pos..).and_then(|r| r.chars().next()) {
            None => format!("missing unit after `{number}`"),
            Some(_) => format!("{}; a unit must follow `{number}`", error.message),
        };
        return SyntaxError {
            message,
            help: Some(UNITS_HELP.to_owned()),
            ..error
        };
    }
    error.with_help(UNITS_HELP)
}

fn describe(rule: Rule) -> &'static str {
    match rule {
        Rule::unit => "a unit",
        Rule::EOI => "end of input",
        Rule::duration | Rule::sign | Rule::part | Rule::decimal => "a number",
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn accepts_every_unit() {
        assert_eq!(parse_duration("30s").unwrap(), ms(30_000));
        assert_eq!(parse_duration("500ms").unwrap(), ms(500));
        assert_eq!(parse_duration("1.5s").unwrap(), ms(1500));
        assert_eq!(parse_duration("2m").unwrap(), ms(120_000));
        assert_eq!(parse_duration("1h").unwrap(), ms(3_600_000));
        assert_eq!(parse_duration("100us").unwrap(), Duration::from_micros(100));
        assert_eq!(parse_duration("7ns").unwrap(), Duration::from_nanos(7));
        assert_eq!(parse_duration("0s").unwrap(), Duration::ZERO);
    }

    #[test]
    fn accepts_combinations_and_fractions() {
        assert_eq!(parse_duration("1m30s").unwrap(), ms(90_000));
        assert_eq!(parse_duration("1h1m1s1ms").unwrap(), ms(3_661_001));
        assert_eq!(parse_duration("1.5h30m").unwrap(), ms(7_200_000));
        assert_eq!(parse_duration("0.1s").unwrap(), ms(100));
        // Below a nanosecond is truncated.
        assert_eq!(parse_duration("1.0000000009s").unwrap(), ms(1000));
    }

    #[test]
    fn rejects_bad_input() {
        let err = parse_duration("-5s").unwrap_err();
        assert_eq!(err.message, "durations cannot be negative");
        assert_eq!(err.span, Span::new(0, 1));

        let err = parse_duration("").unwrap_err();
        assert_eq!(err.message, "empty duration");

        let err = parse_duration("30").unwrap_err();
        assert_eq!(err.message, "missing unit after `30`");
        assert_eq!(err.span, Span::new(2, 2));
        assert!(err.help.unwrap().contains("`ms`"));

        let err = parse_duration("5sec").unwrap_err();
        assert_eq!(err.message, "unknown duration unit `sec`");
        assert_eq!(err.span, Span::new(1, 4));
        assert!(err.help.unwrap().starts_with("did you mean `s`?"));

        let err = parse_duration("2d").unwrap_err();
        assert!(err.help.unwrap().contains("`24h`"));

        let err = parse_duration("30s1m").unwrap_err();
        assert_eq!(
            err.message,
            "duration units must go from largest to smallest"
        );
        assert_eq!(err.span, Span::new(3, 5));

        let err = parse_duration("1s1s").unwrap_err();
        assert_eq!(err.message, "duration unit `s` is repeated");

        let err = parse_duration("1 s").unwrap_err();
        assert_eq!(
            err.message,
            "expected a unit, found whitespace; a unit must follow `1`"
        );

        let err = parse_duration("s").unwrap_err();
        assert_eq!(err.message, "expected a number, found `s`");

        let err = parse_duration("99999999999999999999999h").unwrap_err();
        assert!(err.message.ends_with("is too large"), "{}", err.message);
    }

    #[test]
    fn format_round_trips() {
        for text in [
            "0s",
            "1m30s",
            "1s500ms",
            "1h",
            "100us",
            "7ns",
            "2h3m4s5ms6us7ns",
        ] {
            let d = parse_duration(text).unwrap();
            assert_eq!(format_duration(d), text);
        }
        let max = Duration::new(u64::MAX, 999_999_999);
        assert_eq!(parse_duration(&format_duration(max)).unwrap(), max);
    }
}
