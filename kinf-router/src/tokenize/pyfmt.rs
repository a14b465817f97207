//! Python-compatible output for chat templates: `repr()` of floats and containers, HF's
//! `tojson` (`json.dumps(ensure_ascii=False, ...)`) and `strftime_now`.
//!
//! HF transformers renders chat templates with Python's Jinja2, so every value a template prints
//! is formatted the Python way (`True`, `None`, `1e+20`, `['a', 1]`); minijinja's defaults differ.

use std::fmt::Write as _;

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};

/// `repr(float)` of CPython: shortest round-trip digits, scientific notation when the decimal
/// exponent is < -4 or >= 16, always a `.0` on integral values.
pub(crate) fn float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".to_owned();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.to_owned();
    }
    // `{:e}` gives the shortest round-trip digits: "-1.2345e3", "1e20", "5e-7".
    let sci = format!("{x:e}");
    let (mantissa, exp) = match sci.split_once('e') {
        Some((m, e)) => (m, e.parse::<i32>().unwrap_or(0)),
        None => (sci.as_str(), 0),
    };
    let (neg, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mantissa),
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let mut out = String::with_capacity(digits.len() + 8);
    if neg {
        out.push('-');
    }
    if (-4..16).contains(&exp) {
        let n = digits.len() as i32;
        if exp < 0 {
            out.push_str("0.");
            for _ in 0..(-exp - 1) {
                out.push('0');
            }
            out.push_str(&digits);
        } else if exp + 1 >= n {
            out.push_str(&digits);
            for _ in 0..(exp + 1 - n) {
                out.push('0');
            }
            out.push_str(".0");
        } else {
            let (int, frac) = digits.split_at((exp + 1) as usize);
            out.push_str(int);
            out.push('.');
            out.push_str(frac);
        }
    } else {
        let (first, rest) = digits.split_at(1.min(digits.len()));
        out.push_str(first);
        if !rest.is_empty() {
            out.push('.');
            out.push_str(rest);
        }
        let _ = write!(out, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
    out
}

/// A number the way Python prints it (`str()` and `repr()` agree for numbers).
fn number_repr(v: &Value) -> String {
    if v.is_integer() {
        v.to_string()
    } else {
        match f64::try_from(v.clone()) {
            Ok(x) => float_repr(x),
            Err(_) => v.to_string(),
        }
    }
}

/// `repr(str)` of CPython: single quotes unless the text contains `'` and no `"`.
fn str_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// `repr()` of a value nested in a container.
fn repr_into(v: &Value, out: &mut String) -> Result<(), Error> {
    match v.kind() {
        ValueKind::String => str_repr(v.as_str().unwrap_or_default(), out),
        _ => str_into(v, out)?,
    }
    Ok(())
}

/// `str()` of a value, as `{{ value }}` prints it in Jinja2.
pub(crate) fn str_into(v: &Value, out: &mut String) -> Result<(), Error> {
    match v.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if v.is_true() { "True" } else { "False" }),
        ValueKind::Number => out.push_str(&number_repr(v)),
        ValueKind::String => out.push_str(v.as_str().unwrap_or_default()),
        ValueKind::Seq => {
            out.push('[');
            for (i, item) in v.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                repr_into(&item, out)?;
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in v.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                repr_into(&key, out)?;
                out.push_str(": ");
                repr_into(&v.get_item(&key)?, out)?;
            }
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{v}");
        }
    }
    Ok(())
}

/// Options of HF's `tojson` filter (`json.dumps` keyword arguments).
pub(crate) struct JsonOptions {
    /// Escape every non-ASCII character as `\uXXXX`.
    pub ensure_ascii: bool,
    /// `None`: one line; `Some(s)`: one item per line, indented by `s` per level.
    pub indent: Option<String>,
    /// Between items (default `", "`, or `","` when indenting).
    pub item_sep: String,
    /// Between a key and its value (default `": "`).
    pub key_sep: String,
    /// Sort object keys.
    pub sort_keys: bool,
}

/// `json.dumps(value, ...)` as Python writes it.
pub(crate) fn to_json(v: &Value, opts: &JsonOptions) -> Result<String, Error> {
    let mut out = String::new();
    json_into(v, opts, 0, &mut out)?;
    Ok(out)
}

fn json_str(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && !c.is_ascii() => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn newline_indent(opts: &JsonOptions, level: usize, out: &mut String) {
    if let Some(ind) = &opts.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(ind);
        }
    }
}

fn json_key(k: &Value) -> Result<String, Error> {
    Ok(match k.kind() {
        ValueKind::String => k.as_str().unwrap_or_default().to_owned(),
        ValueKind::None => "null".to_owned(),
        ValueKind::Bool => if k.is_true() { "true" } else { "false" }.to_owned(),
        ValueKind::Number => number_repr(k),
        kind => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("keys must be str, int, float, bool or None, not {kind}"),
            ));
        }
    })
}

fn json_into(v: &Value, opts: &JsonOptions, level: usize, out: &mut String) -> Result<(), Error> {
    match v.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if v.is_integer() {
                out.push_str(&v.to_string());
            } else {
                let x = f64::try_from(v.clone())?;
                if x.is_nan() {
                    out.push_str("NaN");
                } else if x.is_infinite() {
                    out.push_str(if x > 0.0 { "Infinity" } else { "-Infinity" });
                } else {
                    out.push_str(&float_repr(x));
                }
            }
        }
        ValueKind::String => json_str(v.as_str().unwrap_or_default(), opts.ensure_ascii, out),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_sep);
                }
                newline_indent(opts, level + 1, out);
                json_into(item, opts, level + 1, out)?;
            }
            newline_indent(opts, level, out);
            out.push(']');
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            for k in v.try_iter()? {
                let val = v.get_item(&k)?;
                entries.push((json_key(&k)?, val));
            }
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if opts.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            out.push('{');
            for (i, (k, val)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_sep);
                }
                newline_indent(opts, level + 1, out);
                json_str(k, opts.ensure_ascii, out);
                out.push_str(&opts.key_sep);
                json_into(val, opts, level + 1, out)?;
            }
            newline_indent(opts, level, out);
            out.push('}');
        }
        kind => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("object of type {kind} is not JSON serializable"),
            ));
        }
    }
    Ok(())
}

const MONTHS: [&str; 12] = [
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
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Proleptic Gregorian date of a day count since 1970-01-01 (H. Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

/// C `strftime` of a UTC time for the directives chat templates use (`%d %b %Y` and friends);
/// unknown directives are copied as they are, like glibc does.
pub(crate) fn strftime_utc(fmt: &str, unix_secs: i64) -> String {
    let days = unix_secs.div_euclid(86_400);
    let secs = unix_secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (secs / 3600, (secs / 60) % 60, secs % 60);
    let wd = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday (index 3)
    const CUM: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = CUM[(m - 1) as usize] + d + u32::from(m > 2 && is_leap(y));
    let month = MONTHS[(m - 1) as usize];
    let weekday = WEEKDAYS[wd];
    let h12 = if hh % 12 == 0 { 12 } else { hh % 12 };

    let mut out = String::with_capacity(fmt.len() + 16);
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(spec) = chars.next() else {
            out.push('%');
            break;
        };
        let _ = match spec {
            'Y' => write!(out, "{y}"),
            'y' => write!(out, "{:02}", y.rem_euclid(100)),
            'm' => write!(out, "{m:02}"),
            'd' => write!(out, "{d:02}"),
            'e' => write!(out, "{d:2}"),
            'H' => write!(out, "{hh:02}"),
            'I' => write!(out, "{h12:02}"),
            'M' => write!(out, "{mm:02}"),
            'S' => write!(out, "{ss:02}"),
            'p' => write!(out, "{}", if hh < 12 { "AM" } else { "PM" }),
            'j' => write!(out, "{yday:03}"),
            'B' => write!(out, "{month}"),
            'b' | 'h' => write!(out, "{}", &month[..3]),
            'A' => write!(out, "{weekday}"),
            'a' => write!(out, "{}", &weekday[..3]),
            'u' => write!(out, "{}", wd + 1),
            'w' => write!(out, "{}", (wd + 1) % 7),
            'F' => write!(out, "{y}-{m:02}-{d:02}"),
            'T' => write!(out, "{hh:02}:{mm:02}:{ss:02}"),
            'D' => write!(out, "{m:02}/{d:02}/{:02}", y.rem_euclid(100)),
            'Z' => write!(out, "UTC"),
            'z' => write!(out, "+0000"),
            's' => write!(out, "{unix_secs}"),
            'n' => out.write_char('\n'),
            't' => out.write_char('\t'),
            '%' => out.write_char('%'),
            other => write!(out, "%{other}"),
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_like_python() {
        for (x, want) in [
            (1.0, "1.0"),
            (1.5, "1.5"),
            (-0.25, "-0.25"),
            (1e20, "1e+20"),
            (1e16, "1e+16"),
            (1234567890123456.0, "1234567890123456.0"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (0.1 + 0.2, "0.30000000000000004"),
            (100.0, "100.0"),
            (0.0, "0.0"),
            (123.456, "123.456"),
        ] {
            assert_eq!(float_repr(x), want, "{x}");
        }
    }

    #[test]
    fn strftime_known_dates() {
        // 2024-07-26 13:25:09 UTC, a Friday (values checked with Python's datetime.strftime).
        let t = 1_722_000_309;
        assert_eq!(strftime_utc("%d %b %Y", t), "26 Jul 2024");
        assert_eq!(
            strftime_utc("%A %B %e %H:%M:%S %p %j %y %%", t),
            "Friday July 26 13:25:09 PM 208 24 %"
        );
        assert_eq!(strftime_utc("%F %T %Q", 0), "1970-01-01 00:00:00 %Q");
        assert_eq!(strftime_utc("%a %d %b", 951_782_400), "Tue 29 Feb"); // 2000-02-29
    }
}
