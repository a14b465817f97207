//! The built-in PII detector.
//!
//! One pass over the bytes of each message: a start byte table says which candidate patterns
//! may begin at a position that is not glued to a word character, cheap byte tests (an exact
//! prefix test for most kinds; for e-mail, the next `@` located with `memchr`) rule most of them
//! out, and only then is the per-entity pattern run anchored there. Every candidate is
//! validated in code (checksums, ranges, boundaries and context). Overlapping matches are
//! resolved by entity priority: credential, e-mail, IBAN, card, SSN, IP address, phone. The
//! rules are documented in `docs/reference/classifiers.md`.

use std::net::Ipv6Addr;
use std::sync::Arc;

use kinf_policy::PiiEntity;
use regex::Regex;

use super::{Match, Message, redact};

/// Candidate patterns, in priority order (lower index wins on overlap).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Pem,
    Jwt,
    Token,
    Aws,
    Bearer,
    Email,
    Iban,
    Card,
    Ssn,
    SsnContext,
    Ipv4,
    Ipv6,
    Phone,
}

impl Kind {
    const ALL: [Kind; 13] = [
        Kind::Pem,
        Kind::Jwt,
        Kind::Token,
        Kind::Aws,
        Kind::Bearer,
        Kind::Email,
        Kind::Iban,
        Kind::Card,
        Kind::Ssn,
        Kind::SsnContext,
        Kind::Ipv4,
        Kind::Ipv6,
        Kind::Phone,
    ];

    fn entity(self) -> PiiEntity {
        match self {
            Kind::Pem | Kind::Jwt | Kind::Token | Kind::Aws | Kind::Bearer => PiiEntity::Credential,
            Kind::Email => PiiEntity::Email,
            Kind::Iban => PiiEntity::Iban,
            Kind::Card => PiiEntity::CreditCard,
            Kind::Ssn | Kind::SsnContext => PiiEntity::Ssn,
            Kind::Ipv4 | Kind::Ipv6 => PiiEntity::IpAddress,
            Kind::Phone => PiiEntity::Phone,
        }
    }

    /// Whether a match of this kind can start with byte `b`.
    fn may_start(self, b: u8) -> bool {
        match self {
            Kind::Pem => b == b'-',
            Kind::Jwt => b == b'e',
            Kind::Token => matches!(b, b'g' | b'x' | b's' | b'r' | b'A'),
            Kind::Aws => b == b'A',
            Kind::Bearer => matches!(b, b'B' | b'b'),
            Kind::Email => b.is_ascii_alphanumeric(),
            Kind::Iban => b.is_ascii_uppercase(),
            Kind::Card | Kind::Ssn | Kind::Ipv4 => b.is_ascii_digit(),
            Kind::SsnContext => matches!(b, b's' | b'S'),
            Kind::Ipv6 => b.is_ascii_hexdigit() || b == b':',
            Kind::Phone => b.is_ascii_digit() || b == b'+' || b == b'(',
        }
    }

    /// A cheap necessary condition on the bytes from the candidate start, checked before the
    /// anchored pattern runs.
    fn gate(self, r: &[u8]) -> bool {
        let at = |i: usize| r.get(i).copied().unwrap_or(0);
        match self {
            Kind::Pem => r.starts_with(b"-----BEGIN "),
            Kind::Jwt => r.starts_with(b"eyJ"),
            Kind::Token => [
                &b"gh"[..],
                b"github_pat_",
                b"xox",
                b"sk",
                b"rk",
                b"AIza",
                b"glpat-",
            ]
            .iter()
            .any(|p| r.starts_with(p)),
            Kind::Aws => r.len() >= 20 && (1..4).all(|i| at(i).is_ascii_uppercase()),
            Kind::Bearer => {
                r.len() > 7
                    && r.get(..6)
                        .is_some_and(|b| b.eq_ignore_ascii_case(b"bearer"))
            }
            Kind::Email => r
                .iter()
                .take(80)
                .take_while(|b| !b.is_ascii_whitespace())
                .any(|b| *b == b'@'),
            Kind::Iban => at(2).is_ascii_digit() && at(3).is_ascii_digit(),
            Kind::Card => r.iter().take(24).filter(|b| b.is_ascii_digit()).count() >= 13,
            // The whole pattern: `[0-9]{3}[- ][0-9]{2}[- ][0-9]{4}`.
            Kind::Ssn => {
                r.len() >= 11
                    && r.iter().enumerate().take(11).all(|(i, b)| match i {
                        3 | 6 => matches!(b, b'-' | b' '),
                        _ => b.is_ascii_digit(),
                    })
            }
            Kind::SsnContext => {
                r.get(..3).is_some_and(|b| b.eq_ignore_ascii_case(b"ssn"))
                    || r.get(..6)
                        .is_some_and(|b| b.eq_ignore_ascii_case(b"social"))
            }
            // `[0-9]{1,3}\.[0-9]`: a first group of 1 to 3 digits, a dot, a digit.
            Kind::Ipv4 => {
                let d = r.iter().take(4).take_while(|b| b.is_ascii_digit()).count();
                (1..=3).contains(&d) && at(d) == b'.' && at(d + 1).is_ascii_digit()
            }
            // `[0-9A-Fa-f]{0,4}:` and two more of `[0-9A-Fa-f:.]`.
            Kind::Ipv6 => {
                let h = r
                    .iter()
                    .take(5)
                    .take_while(|b| b.is_ascii_hexdigit())
                    .count();
                let v6 = |b: u8| b.is_ascii_hexdigit() || b == b':' || b == b'.';
                h <= 4 && at(h) == b':' && v6(at(h + 1)) && v6(at(h + 2))
            }
            // `[+(]?[0-9]` and at least 7 more of `[0-9 ()./-]`.
            Kind::Phone => {
                let j = usize::from(matches!(at(0), b'+' | b'('));
                at(j).is_ascii_digit()
                    && r.len() >= j + 8
                    && r.iter().skip(j + 1).take(7).all(|b| is_phone_byte(*b))
            }
        }
    }

    fn pattern(self) -> &'static str {
        match self {
            Kind::Pem => r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----",
            Kind::Jwt => r"eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{2,}\.[A-Za-z0-9_-]*",
            Kind::Token => concat!(
                r"gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,}",
                r"|xox[abposr]-[A-Za-z0-9-]{10,}|(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}",
                r"|sk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,}|AIza[0-9A-Za-z_-]{35}",
                r"|glpat-[A-Za-z0-9_-]{20,}"
            ),
            Kind::Aws => r"(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AIPA|ANPA|ANVA|AROA|APKA)[A-Z0-9]{16}",
            Kind::Bearer => r"[Bb](?:earer|EARER)[ \t]+[A-Za-z0-9._~+/=-]{16,}",
            Kind::Email => concat!(
                r"[A-Za-z0-9][A-Za-z0-9._%+-]*@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?",
                r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*\.[A-Za-z]{2,24}"
            ),
            Kind::Iban => r"[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]){10,30}",
            Kind::Card => r"[0-9](?:[ -]?[0-9]){12,18}",
            Kind::Ssn => r"[0-9]{3}[- ][0-9]{2}[- ][0-9]{4}",
            Kind::SsnContext => {
                r"(?i:ssn|social security(?: number| no\.?)?)[^0-9A-Za-z\n]{0,12}[0-9]{9}"
            }
            Kind::Ipv4 => r"[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}",
            Kind::Ipv6 => r"[0-9A-Fa-f]{0,4}:[0-9A-Fa-f:.]{2,}",
            Kind::Phone => r"[+(]?[0-9][0-9 ()./-]{6,24}[0-9]",
        }
    }
}

#[derive(Clone, Debug)]
struct Pat {
    kind: Kind,
    re: Regex,
}

/// The PII classifier for a set of entities.
#[derive(Clone, Debug)]
pub struct Pii {
    entities: Vec<PiiEntity>,
    /// For each ASCII byte, bit `i` set when `pats[i]` may start with it.
    starts: [u16; 128],
    /// Index of the e-mail pattern in `pats`, when e-mail is detected.
    email: Option<usize>,
    pats: Vec<Pat>,
    tags: Vec<(PiiEntity, Arc<str>)>,
    pub(crate) detected_tag: Arc<str>,
}

impl Pii {
    /// A detector of `entities` (an empty slice detects nothing).
    pub fn new(entities: &[PiiEntity]) -> Self {
        let mut ents: Vec<PiiEntity> = Vec::new();
        for e in entities {
            if !ents.contains(e) {
                ents.push(*e);
            }
        }
        let pats: Vec<Pat> = Kind::ALL
            .iter()
            .filter(|k| ents.contains(&k.entity()))
            .filter_map(|k| {
                Regex::new(&format!("^(?:{})", k.pattern()))
                    .ok()
                    .map(|re| Pat { kind: *k, re })
            })
            .collect();
        let mut starts = [0u16; 128];
        for (b, mask) in (0u8..).zip(starts.iter_mut()) {
            for (i, p) in pats.iter().enumerate() {
                if p.kind.may_start(b) {
                    *mask |= 1 << i;
                }
            }
        }
        let email = pats.iter().position(|p| p.kind == Kind::Email);
        let tags = PiiEntity::ALL
            .iter()
            .map(|e| (*e, Arc::from(format!("pii-{}", e.as_str()))))
            .collect();
        Pii {
            entities: ents,
            starts,
            email,
            pats,
            tags,
            detected_tag: Arc::from("pii-detected"),
        }
    }

    /// The entities detected.
    pub fn entities(&self) -> &[PiiEntity] {
        &self.entities
    }

    /// Number of compiled candidate patterns (all of them compile; tests check it).
    pub fn pattern_count(&self) -> usize {
        self.pats.len()
    }

    fn tag(&self, e: PiiEntity) -> Arc<str> {
        self.tags
            .iter()
            .find(|(x, _)| *x == e)
            .map(|(_, t)| Arc::clone(t))
            .unwrap_or_else(|| Arc::from(format!("pii-{}", e.as_str())))
    }

    /// Every PII value in `messages`, ordered by message and position.
    pub fn scan(&self, messages: &[Message<'_>]) -> Vec<Match> {
        let mut out = Vec::new();
        for (i, m) in messages.iter().enumerate() {
            self.scan_text(i, m.content, &mut out);
        }
        out
    }

    fn scan_text(&self, index: usize, text: &str, out: &mut Vec<Match>) {
        let bytes = text.as_bytes();
        let mut cands: Vec<(usize, usize, Kind)> = Vec::new();
        // Position of the next `@` at or after the scan position (`usize::MAX` when there is
        // none): the e-mail pattern needs one within 80 bytes, before any whitespace.
        let mut next_at: Option<usize> = None;
        let mut i = 0;
        // Whether the character before `i` is a word character: candidates glued to a word
        // are never valid, and the scan resumes after the word.
        let mut prev_word = false;
        while let Some(&b) = bytes.get(i) {
            let mask = match self.starts.get(usize::from(b)) {
                Some(m) if !prev_word => *m,
                Some(_) => 0,
                None => {
                    // A non-ASCII character: it starts no pattern.
                    let c = text.get(i..).and_then(|t| t.chars().next());
                    prev_word = c.is_some_and(is_word);
                    i += c.map_or(1, char::len_utf8);
                    continue;
                }
            };
            if mask == 0 {
                prev_word = is_word_byte(b);
                i += 1;
                continue;
            }
            let rest = bytes.get(i..).unwrap_or_default();
            let mut max_end = i;
            let mut m = mask;
            while m != 0 {
                let k = m.trailing_zeros() as usize;
                m &= m - 1;
                let Some(pat) = self.pats.get(k) else { break };
                let pass = if Some(k) == self.email {
                    if next_at.is_none_or(|a| a < i) {
                        next_at = Some(memchr::memchr(b'@', rest).map_or(usize::MAX, |j| i + j));
                    }
                    let a = next_at.unwrap_or(usize::MAX);
                    a - i < 80
                        && !bytes
                            .get(i..a)
                            .is_some_and(|w| w.iter().any(u8::is_ascii_whitespace))
                } else {
                    pat.kind.gate(rest)
                };
                if !pass {
                    continue;
                }
                if let Some((s, e)) = text
                    .get(i..)
                    .and_then(|t| pat.re.find(t))
                    .and_then(|mm| validate(pat.kind, text, i, i + mm.end()))
                {
                    cands.push((s, e, pat.kind));
                    max_end = max_end.max(e);
                }
            }
            if max_end > i {
                i = max_end;
                prev_word = prev_is(text, i, is_word);
            } else {
                prev_word = is_word_byte(b);
                i += 1;
            }
        }
        // Resolve overlaps: higher-priority kinds first, then leftmost.
        cands.sort_by_key(|&(s, e, k)| (k as u8, s, usize::MAX - e));
        let mut kept: Vec<(usize, usize, Kind)> = Vec::new();
        for c in cands {
            if kept.iter().all(|&(s, e, _)| c.1 <= s || c.0 >= e) {
                kept.push(c);
            }
        }
        kept.sort_by_key(|&(s, _, _)| s);
        for (s, e, k) in kept {
            let value = text.get(s..e).unwrap_or("");
            let entity = k.entity();
            out.push(Match {
                entity,
                tag: self.tag(entity),
                message_index: index,
                start: s,
                end: e,
                redacted: redact(value),
            });
        }
    }
}

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// A byte of the phone pattern's body: `[0-9 ()./-]`.
fn is_phone_byte(b: u8) -> bool {
    b.is_ascii_digit() || matches!(b, b' ' | b'(' | b')' | b'.' | b'/' | b'-')
}

fn prev_char(text: &str, at: usize) -> Option<char> {
    text.get(..at).and_then(|t| t.chars().next_back())
}

fn next_char(text: &str, at: usize) -> Option<char> {
    text.get(at..).and_then(|t| t.chars().next())
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn prev_is(text: &str, at: usize, f: impl Fn(char) -> bool) -> bool {
    prev_char(text, at).is_some_and(f)
}

fn next_is(text: &str, at: usize, f: impl Fn(char) -> bool) -> bool {
    next_char(text, at).is_some_and(f)
}

/// Words that, as the closest word before a number (skipping `no`, `nr`, `num`, `number`,
/// `is`, `was`, `#`, `:`), say the number is an identifier rather than PII.
const NEGATIVE_CONTEXT: &[&str] = &[
    "order",
    "orders",
    "invoice",
    "ticket",
    "tracking",
    "ref",
    "reference",
    "sku",
    "serial",
    "isbn",
    "po",
    "id",
    "uid",
    "txn",
    "transaction",
    "case",
    "confirmation",
    "booking",
    "part",
    "model",
    "item",
    "shipment",
    "parcel",
    "claim",
    "build",
    "version",
    "ver",
    "release",
    "firmware",
    "ticketid",
    "orderid",
];

const FILLERS: &[&str] = &["no", "nr", "num", "number", "is", "was", "the", "n"];

/// The closest non-filler word before `at` (lower-cased), within 40 bytes; `Some("#")` when a
/// `#` sign comes first.
fn context_word(text: &str, at: usize) -> Option<String> {
    let mut from = at.saturating_sub(40);
    while !text.is_char_boundary(from) {
        from += 1;
    }
    let window = text.get(from..at)?;
    let mut word = String::new();
    let mut words: Vec<String> = Vec::new();
    for c in window.chars().rev() {
        if c.is_alphanumeric() {
            word.push(c.to_ascii_lowercase());
        } else {
            if !word.is_empty() {
                words.push(word.chars().rev().collect());
                word.clear();
            }
            if c == '#' && words.is_empty() {
                return Some("#".into());
            }
            if c == '\n' {
                break;
            }
        }
        if words.len() >= 4 {
            break;
        }
    }
    if !word.is_empty() && from == 0 {
        words.push(word.chars().rev().collect());
    }
    words.into_iter().find(|w| !FILLERS.contains(&w.as_str()))
}

fn negative_context(text: &str, at: usize) -> bool {
    context_word(text, at).is_some_and(|w| w == "#" || NEGATIVE_CONTEXT.contains(&w.as_str()))
}

/// Whether `at` follows a digit group and a separator (`12 |`, `12-|`, `12.|`): a number
/// there is the tail of a longer digit run (an IBAN, a card, a table), not a value of its own.
fn after_digit_group(text: &str, at: usize) -> bool {
    let Some(before) = text.get(..at) else {
        return false;
    };
    let mut it = before.chars().rev();
    matches!(it.next(), Some(' ' | '-' | '.')) && it.next().is_some_and(|c| c.is_ascii_digit())
}

fn validate(kind: Kind, text: &str, s: usize, e: usize) -> Option<(usize, usize)> {
    if matches!(kind, Kind::Phone | Kind::Card | Kind::Ssn) && after_digit_group(text, s) {
        return None;
    }
    let cand = text.get(s..e)?;
    match kind {
        Kind::Pem => pem(text, s, e),
        Kind::Jwt => {
            if prev_is(text, s, |c| is_word(c) || c == '-' || c == '.') {
                return None;
            }
            let header = cand.split('.').next()?;
            let bytes = base64url_decode(header)?;
            let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
            v.as_object()?.get("alg")?;
            Some((s, e))
        }
        Kind::Token => {
            if prev_is(text, s, |c| is_word(c) || c == '-') || next_is(text, e, is_word) {
                return None;
            }
            let body = cand.split_once(['_', '-']).map(|(_, b)| b).unwrap_or(cand);
            token_like(body).then_some((s, e))
        }
        Kind::Aws => {
            if prev_is(text, s, is_word) || next_is(text, e, is_word) || cand.contains("EXAMPLE") {
                return None;
            }
            Some((s, e))
        }
        Kind::Bearer => {
            if prev_is(text, s, is_word) {
                return None;
            }
            let off = cand.find([' ', '\t'])?;
            let tok_start = s + off + cand.get(off..)?.len() - cand.get(off..)?.trim_start().len();
            let tok = text.get(tok_start..e)?;
            token_like(tok).then_some((tok_start, e))
        }
        Kind::Email => email(text, s, e),
        Kind::Iban => iban(text, s, e),
        Kind::Card => card(text, s, e),
        Kind::Ssn => {
            if prev_is(text, s, |c| is_word(c) || c == '-' || c == '.')
                || next_is(text, e, |c| is_word(c) || c == '-')
            {
                return None;
            }
            let b = cand.as_bytes();
            if b.get(3) != b.get(6) {
                return None;
            }
            let digits: String = cand.chars().filter(char::is_ascii_digit).collect();
            (ssn_valid(&digits) && !negative_context(text, s)).then_some((s, e))
        }
        Kind::SsnContext => {
            if prev_is(text, s, is_word) || next_is(text, e, |c| is_word(c) || c == '-') {
                return None;
            }
            let ds = e.checked_sub(9)?;
            ssn_valid(text.get(ds..e)?).then_some((ds, e))
        }
        Kind::Ipv4 => ipv4(text, s, e),
        Kind::Ipv6 => ipv6(text, s, e),
        Kind::Phone => phone(text, s, e),
    }
}

/// At least one ASCII digit and one letter, and at least 6 distinct characters: placeholders
/// such as `YOUR_API_KEY_HERE` or `xxxxxxxx` are not credentials.
fn token_like(t: &str) -> bool {
    let has_digit = t.bytes().any(|b| b.is_ascii_digit());
    let has_alpha = t.bytes().any(|b| b.is_ascii_alphabetic());
    let mut seen = [false; 128];
    let mut distinct = 0;
    for b in t.bytes() {
        if let Some(s) = seen.get_mut(usize::from(b & 0x7f))
            && !*s
        {
            *s = true;
            distinct += 1;
        }
    }
    has_digit && has_alpha && distinct >= 6
}

fn base64url_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for b in s.bytes() {
        let v = match b {
            b'A'..=b'Z' => b - b'A',
            b'a'..=b'z' => b - b'a' + 26,
            b'0'..=b'9' => b - b'0' + 52,
            b'-' | b'+' => 62,
            b'_' | b'/' => 63,
            b'=' => break,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push(((acc >> bits) & 0xff) as u8);
        }
    }
    Some(out)
}

fn pem(text: &str, s: usize, e: usize) -> Option<(usize, usize)> {
    let rest = text.get(e..)?;
    let (body, end) = match rest.find("-----END") {
        Some(i) => {
            let after = rest.get(i + 8..)?;
            let close = after.find("-----").map(|j| i + 8 + j + 5).unwrap_or(i + 8);
            (rest.get(..i)?, e + close)
        }
        None => {
            let stop = rest.find("\n\n").unwrap_or(rest.len());
            (rest.get(..stop)?, e + stop)
        }
    };
    let b64 = body
        .bytes()
        .filter(|b| b.is_ascii_alphanumeric() || *b == b'+' || *b == b'/')
        .count();
    (b64 >= 40).then_some((s, end))
}

const FILE_EXTENSIONS: &[&str] = &[
    "png", "jpg", "jpeg", "gif", "svg", "webp", "ico", "js", "ts", "css", "py", "rs", "go", "json",
    "yaml", "yml", "md", "txt", "html", "lock",
];

fn email(text: &str, s: usize, e: usize) -> Option<(usize, usize)> {
    if next_is(text, e, |c| is_word(c) || c == '@') || prev_is(text, s, |c| c == '@') {
        return None;
    }
    let cand = text.get(s..e)?;
    let tld = cand.rsplit('.').next()?.to_ascii_lowercase();
    if FILE_EXTENSIONS.contains(&tld.as_str()) {
        return None;
    }
    Some((s, e))
}

/// IBAN length by country (ISO 13616 registry).
const IBAN_LENGTHS: &[(&str, usize)] = &[
    ("AD", 24),
    ("AE", 23),
    ("AL", 28),
    ("AT", 20),
    ("AZ", 28),
    ("BA", 20),
    ("BE", 16),
    ("BG", 22),
    ("BH", 22),
    ("BR", 29),
    ("CH", 21),
    ("CR", 22),
    ("CY", 28),
    ("CZ", 24),
    ("DE", 22),
    ("DK", 18),
    ("DO", 28),
    ("EE", 20),
    ("EG", 29),
    ("ES", 24),
    ("FI", 18),
    ("FO", 18),
    ("FR", 27),
    ("GB", 22),
    ("GE", 22),
    ("GI", 23),
    ("GL", 18),
    ("GR", 27),
    ("GT", 28),
    ("HR", 21),
    ("HU", 28),
    ("IE", 22),
    ("IL", 23),
    ("IS", 26),
    ("IT", 27),
    ("JO", 30),
    ("KW", 30),
    ("KZ", 20),
    ("LB", 28),
    ("LI", 21),
    ("LT", 20),
    ("LU", 20),
    ("LV", 21),
    ("MC", 27),
    ("MD", 24),
    ("ME", 22),
    ("MK", 19),
    ("MR", 27),
    ("MT", 31),
    ("MU", 30),
    ("NL", 18),
    ("NO", 15),
    ("PK", 24),
    ("PL", 28),
    ("PS", 29),
    ("PT", 25),
    ("QA", 29),
    ("RO", 24),
    ("RS", 22),
    ("SA", 24),
    ("SE", 24),
    ("SI", 19),
    ("SK", 24),
    ("SM", 27),
    ("TN", 24),
    ("TR", 26),
    ("UA", 29),
    ("VG", 24),
    ("XK", 20),
];

fn iban(text: &str, s: usize, e: usize) -> Option<(usize, usize)> {
    if prev_is(text, s, is_word) {
        return None;
    }
    let cand = text.get(s..e)?;
    let len = IBAN_LENGTHS
        .iter()
        .find(|(c, _)| cand.starts_with(c))
        .map(|(_, l)| *l)?;
    let mut chars = String::with_capacity(len);
    let mut end = s;
    for (i, c) in cand.char_indices() {
        if c == ' ' {
            continue;
        }
        chars.push(c);
        if chars.len() == len {
            end = s + i + c.len_utf8();
            break;
        }
    }
    if chars.len() != len || next_is(text, end, is_word) {
        return None;
    }
    iban_checksum(&chars).then_some((s, end))
}

/// ISO 7064 mod 97-10 over the rearranged IBAN.
pub fn iban_checksum(iban: &str) -> bool {
    let b = iban.as_bytes();
    if b.len() < 5 {
        return false;
    }
    let mut rem: u32 = 0;
    for &c in b.iter().skip(4).chain(b.iter().take(4)) {
        let v = match c {
            b'0'..=b'9' => u32::from(c - b'0'),
            b'A'..=b'Z' => u32::from(c - b'A') + 10,
            _ => return false,
        };
        rem = if v >= 10 {
            (rem * 100 + v) % 97
        } else {
            (rem * 10 + v) % 97
        };
    }
    rem == 1
}

/// The Luhn check.
pub fn luhn(digits: &[u8]) -> bool {
    let mut sum = 0u32;
    for (i, d) in digits.iter().rev().enumerate() {
        let mut v = u32::from(*d);
        if i % 2 == 1 {
            v *= 2;
            if v > 9 {
                v -= 9;
            }
        }
        sum += v;
    }
    sum.is_multiple_of(10)
}

/// Whether a card number of this length may start with these digits (a known IIN range).
fn card_iin(d: &[u8]) -> bool {
    let n = d.len();
    let p = |k: usize| d.iter().take(k).fold(0u32, |a, x| a * 10 + u32::from(*x));
    let (p1, p2, p3, p4) = (p(1), p(2), p(3), p(4));
    match p1 {
        4 => matches!(n, 13 | 16 | 19),
        5 => match p2 {
            51..=55 => n == 16,
            50 | 56..=58 => (13..=19).contains(&n),
            _ => false,
        },
        2 => ((2221..=2720).contains(&p4) && n == 16) || ((2200..=2204).contains(&p4) && n >= 16),
        3 => {
            (matches!(p2, 34 | 37) && n == 15)
                || (((300..=305).contains(&p3) || matches!(p2, 36 | 38 | 39)) && n >= 14)
                || ((3528..=3589).contains(&p4) && n >= 16)
        }
        6 => {
            (p4 == 6011 || (644..=649).contains(&p3) || p2 == 65 || p2 == 62) && n >= 16
                || (p2 == 67 && n >= 13)
        }
        _ => false,
    }
}

fn card(text: &str, s: usize, e: usize) -> Option<(usize, usize)> {
    if prev_is(text, s, |c| is_word(c) || c == '-' || c == '.' || c == ',') {
        return None;
    }
    let cand = text.get(s..e)?;
    let mut digits: Vec<u8> = Vec::with_capacity(19);
    let mut ends: Vec<usize> = Vec::with_capacity(19);
    for (i, c) in cand.char_indices() {
        if let Some(d) = c.to_digit(10) {
            digits.push(d as u8);
            ends.push(i + 1);
        }
    }
    let separated = digits.len() != cand.len();
    for n in (13..=digits.len()).rev() {
        let end = *ends.get(n - 1)?;
        // Only whole groups: the prefix must end where the candidate does or at a separator.
        if end == cand.len() {
            if next_is(text, e, is_word) {
                continue;
            }
        } else if !matches!(cand.as_bytes().get(end), Some(b' ' | b'-')) {
            continue;
        }
        let d = digits.get(..n)?;
        if card_iin(d) && luhn(d) {
            return (separated || !negative_context(text, s)).then_some((s, s + end));
        }
    }
    None
}

/// SSN ranges: area not 000, 666 or 9xx; group not 00; serial not 0000.
fn ssn_valid(d: &str) -> bool {
    let b = d.as_bytes();
    if b.len() != 9 || !b.iter().all(u8::is_ascii_digit) {
        return false;
    }
    let area = d.get(0..3).unwrap_or("000");
    let group = d.get(3..5).unwrap_or("00");
    let serial = d.get(5..9).unwrap_or("0000");
    area != "000" && area != "666" && !area.starts_with('9') && group != "00" && serial != "0000"
}

fn ipv4(text: &str, s: usize, e: usize) -> Option<(usize, usize)> {
    if prev_is(text, s, |c| is_word(c) || c == '.' || c == '-')
        || next_is(text, e, |c| is_word(c) || c == '-')
    {
        return None;
    }
    // `1.2.3.4.5` and `1.2.3.4.` followed by a digit are not addresses.
    if text.get(e..).is_some_and(|r| {
        let b = r.as_bytes();
        b.first() == Some(&b'.') && b.get(1).is_some_and(u8::is_ascii_digit)
    }) {
        return None;
    }
    let cand = text.get(s..e)?;
    let mut octets = [0u32; 4];
    for (i, part) in cand.split('.').enumerate() {
        if part.len() > 1 && part.starts_with('0') {
            return None;
        }
        let v: u32 = part.parse().ok()?;
        if v > 255 {
            return None;
        }
        *octets.get_mut(i)? = v;
    }
    if octets[0] == 0 || octets[0] == 127 || octets[0] == 255 {
        return None;
    }
    let versioned = context_word(text, s).is_some_and(|w| {
        matches!(
            w.as_str(),
            "v" | "version" | "ver" | "release" | "build" | "firmware" | "fw" | "oid"
        )
    });
    (!versioned).then_some((s, e))
}

fn ipv6(text: &str, s: usize, e: usize) -> Option<(usize, usize)> {
    if prev_is(text, s, |c| is_word(c) || c == ':' || c == '.') {
        return None;
    }
    let mut end = e;
    let mut cand = text.get(s..end)?;
    while cand.ends_with('.') {
        end -= 1;
        cand = text.get(s..end)?;
    }
    if next_is(text, end, is_word) {
        return None;
    }
    let addr: Ipv6Addr = match cand.parse() {
        Ok(a) => a,
        Err(_) => {
            let trimmed = cand.strip_suffix(':')?;
            end -= 1;
            cand = trimmed;
            trimmed.parse().ok()?
        }
    };
    if addr.is_loopback() || addr.is_unspecified() {
        return None;
    }
    let colons = cand.bytes().filter(|b| *b == b':').count();
    let has_digit = cand.bytes().any(|b| b.is_ascii_digit());
    let long_group = cand.split(':').any(|g| g.len() >= 3);
    (colons >= 2 && has_digit && long_group).then_some((s, end))
}

fn phone(text: &str, s: usize, e: usize) -> Option<(usize, usize)> {
    let mut s = s;
    // `(` alone before a number that does not close it is punctuation, not part of it.
    if text.as_bytes().get(s) == Some(&b'(') {
        let cand = text.get(s..e)?;
        if !cand.get(1..)?.contains(')') {
            s += 1;
        }
    }
    if prev_is(text, s, |c| {
        is_word(c)
            || matches!(
                c,
                '.' | '-' | '/' | '+' | ':' | '$' | '€' | '£' | '=' | '\''
            )
    }) {
        return None;
    }
    let mut end = e;
    loop {
        let cand = text.get(s..end)?;
        let next_bad = next_is(text, end, is_word)
            || text.get(end..).is_some_and(|r| {
                let b = r.as_bytes();
                matches!(b.first(), Some(b'.' | b',' | b'-' | b'/' | b':'))
                    && b.get(1).is_some_and(u8::is_ascii_digit)
            });
        if !next_bad && phone_shape(cand) {
            return (!negative_context(text, s)).then_some((s, end));
        }
        // Drop the last group and retry.
        let cut = cand.rfind(|c: char| !c.is_ascii_digit())?;
        let trimmed = cand.get(..cut)?.trim_end_matches([' ', '-', '.', '/', '(']);
        if trimmed.len() < 7 || !trimmed.ends_with(|c: char| c.is_ascii_digit() || c == ')') {
            return None;
        }
        end = s + trimmed.len();
    }
}

/// The accepted phone shapes (see the reference).
fn phone_shape(cand: &str) -> bool {
    let groups: Vec<&str> = cand
        .split(|c: char| !c.is_ascii_digit())
        .filter(|g| !g.is_empty())
        .collect();
    let d: usize = groups.iter().map(|g| g.len()).sum();
    let Some(first) = groups.first() else {
        return false;
    };
    let parens = cand.matches('(').count();
    if parens != cand.matches(')').count() || parens > 1 {
        return false;
    }
    if cand.starts_with('+') {
        if groups.len() == 1 {
            return (10..=15).contains(&d);
        }
        return first.len() <= 3 && (8..=15).contains(&d) && groups.iter().all(|g| g.len() <= 8);
    }
    if groups.len() < 2 {
        return false;
    }
    let lens: Vec<usize> = groups.iter().map(|g| g.len()).collect();
    // North American: (NXX) NXX-XXXX, NXX-NXX-XXXX, NXX.NXX.XXXX, 1-NXX-NXX-XXXX.
    let nanp = |area: &str| {
        area.as_bytes()
            .first()
            .is_some_and(|b| (b'2'..=b'9').contains(b))
    };
    if lens == [3, 3, 4] && nanp(first) {
        let seps: Vec<char> = cand
            .chars()
            .filter(|c| !c.is_ascii_digit() && *c != '(' && *c != ')')
            .collect();
        return !seps.is_empty() || cand.starts_with('(');
    }
    if lens == [1, 3, 3, 4] && *first == "1" {
        return groups.get(1).is_some_and(|a| nanp(a));
    }
    // European national formats with a trunk `0`: UK, DE, FR and similar.
    if first.starts_with('0') && !first.starts_with("00") {
        let date_like = lens.len() >= 3 && lens[0] == 2 && lens[1] == 2 && lens[2] == 4;
        return !date_like
            && first.len() >= 2
            && lens.iter().all(|l| (2..=8).contains(l))
            && (10..=12).contains(&d);
    }
    false
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use proptest::prelude::*;

    use super::*;

    /// The previous scan (a combined regex of every pattern finds candidate starts; the scan
    /// resumes after the word of a rejected start): the byte scan must find the same matches.
    fn reference(p: &Pii, text: &str) -> Vec<(usize, usize, Kind)> {
        let any = &*ANY;
        let skip_word = |p: usize| {
            let rest = &text[p..];
            for (i, c) in rest.char_indices() {
                if !is_word(c) {
                    return p + i + c.len_utf8();
                }
            }
            text.len()
        };
        let bytes = text.as_bytes();
        let mut cands = Vec::new();
        let mut cursor = 0;
        while let Some(m) = any.find_at(text, cursor) {
            let s = m.start();
            let mut max_end = s;
            if !prev_is(text, s, is_word) {
                let first = bytes[s];
                let rest = &text[s..];
                for pat in &p.pats {
                    if !pat.kind.may_start(first) || !reference_gate(pat.kind, rest.as_bytes()) {
                        continue;
                    }
                    if let Some((a, e)) = pat
                        .re
                        .find(rest)
                        .and_then(|mm| validate(pat.kind, text, s, s + mm.end()))
                    {
                        cands.push((a, e, pat.kind));
                        max_end = max_end.max(e);
                    }
                }
            }
            cursor = if max_end > s { max_end } else { skip_word(s) };
            if cursor >= text.len() {
                break;
            }
        }
        cands
    }

    /// The previous gates (looser than the current ones, which are exact prefixes of the
    /// patterns).
    fn reference_gate(k: Kind, r: &[u8]) -> bool {
        let at = |i: usize| r.get(i).copied().unwrap_or(0);
        let within = |n: usize, b: u8| r.iter().take(n).any(|x| *x == b);
        match k {
            Kind::Ssn => matches!(at(3), b'-' | b' '),
            Kind::Ipv4 => within(4, b'.'),
            Kind::Ipv6 => within(5, b':'),
            Kind::Phone => true,
            other => other.gate(r),
        }
    }

    fn resolved(mut cands: Vec<(usize, usize, Kind)>) -> Vec<(usize, usize, PiiEntity)> {
        cands.sort_by_key(|&(s, e, k)| (k as u8, s, usize::MAX - e));
        let mut kept: Vec<(usize, usize, Kind)> = Vec::new();
        for c in cands {
            if kept.iter().all(|&(s, e, _)| c.1 <= s || c.0 >= e) {
                kept.push(c);
            }
        }
        kept.sort_by_key(|&(s, _, _)| s);
        kept.into_iter()
            .map(|(s, e, k)| (s, e, k.entity()))
            .collect()
    }

    fn current(p: &Pii, text: &str) -> Vec<(usize, usize, PiiEntity)> {
        let mut out = Vec::new();
        p.scan_text(0, text, &mut out);
        out.iter().map(|m| (m.start, m.end, m.entity)).collect()
    }

    /// Every entity, built once (regex compilation dominates the test otherwise).
    static PII: std::sync::LazyLock<Pii> = std::sync::LazyLock::new(|| Pii::new(&PiiEntity::ALL));
    static ANY: std::sync::LazyLock<Regex> = std::sync::LazyLock::new(|| {
        let alts: Vec<String> = PII
            .pats
            .iter()
            .map(|x| format!("(?:{})", x.kind.pattern()))
            .collect();
        Regex::new(&alts.join("|")).unwrap()
    });

    const PIECES: &[&str] = &[
        "jane.doe@example.com",
        "a@b.co",
        "@",
        "x@y",
        "icon@2x.png",
        "+44 20 7946 0958",
        "(555) 123-4567",
        "555-123-4567",
        "020 7946 0958",
        "4111 1111 1111 1111",
        "4111111111111111",
        "078-05-1120",
        "SSN: 078051120",
        "DE89370400440532013000",
        "GB82 WEST 1234 5698 7654 32",
        "192.168.1.20",
        "10.0.0.1",
        "1.2.3.4.5",
        "2001:db8::8a2e:370:7334",
        "10:30:45",
        "::1",
        "AKIAIOSFODNN7ABCDEFG",
        "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
        "Bearer abcdef0123456789xyz",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig",
        "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7\n-----END PRIVATE KEY-----",
        "order #1029384756",
        "v1.27.3",
        "2024-01-15T10:30:00Z",
        "1532 ms",
        " ",
        "\n",
        ", ",
        ".",
        "-",
        "_",
        "x",
        "é",
        "ü@",
        "12",
        "(",
        ")",
        "+",
        ":",
        "/",
        "Order no ",
        "version ",
        "id ",
        "sk-proj-abcdefghij0123456789",
        "tel ",
        "#",
    ];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn byte_scan_finds_what_the_regex_scan_found(
            parts in proptest::collection::vec(0..PIECES.len(), 0..24)
        ) {
            let text: String = parts.iter().map(|i| PIECES[*i]).collect();
            let p = &*PII;
            prop_assert_eq!(current(p, &text), resolved(reference(p, &text)), "{:?}", text);
        }

        #[test]
        fn byte_scan_matches_the_reference_on_any_text(text in "[ -~\n é€@]{0,120}") {
            let p = &*PII;
            prop_assert_eq!(current(p, &text), resolved(reference(p, &text)), "{:?}", text);
        }
    }
}
