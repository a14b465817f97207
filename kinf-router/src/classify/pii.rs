//! The built-in PII detector.
//!
//! One pass over the bytes of each message: a start byte table says which candidate patterns
//! may begin at a position that is not glued to a word character, cheap byte tests (an exact
//! prefix test for most kinds; for e-mail, the next `@` located with `memchr`) rule most of them
//! out, and only then is the per-entity pattern run anchored there. Every candidate is
//! validated in code (checksums, ranges, boundaries and context). Overlapping matches are
//! resolved by entity priority: credential, e-mail, IBAN, card, SSN, IP address, phone. A
//! message holding full-width digits, hyphens, `＋（）．`, ideographic spaces or en dashes is
//! scanned as a copy with their ASCII forms, and its matches moved back to the text as written
//! (`FullWidth`). The rules are documented in
//! `docs/reference/classifiers.md`.

use std::collections::BTreeMap;
use std::net::Ipv6Addr;
use std::sync::Arc;

use kinf_policy::PiiEntity;
use regex::Regex;
use smallvec::SmallVec;

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
    /// Nine digits without separators after a tax-ID label (`Tax ID: 078051120`).
    SsnTax,
    Ipv4,
    Ipv6,
    Phone,
}

impl Kind {
    const ALL: [Kind; 14] = [
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
        Kind::SsnTax,
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
            Kind::Ssn | Kind::SsnContext | Kind::SsnTax => PiiEntity::Ssn,
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
            // A non-ASCII byte: a letter or digit of a spaced script (`émile@`), which the scan
            // tests as a character.
            Kind::Email => b.is_ascii_alphanumeric() || !b.is_ascii(),
            // Either case (`gb82 west ...`): `iban` upper-cases the value.
            Kind::Iban => b.is_ascii_alphabetic(),
            Kind::Card | Kind::Ssn | Kind::SsnTax | Kind::Ipv4 => b.is_ascii_digit(),
            Kind::SsnContext => matches!(b, b's' | b'S'),
            Kind::Ipv6 => b.is_ascii_hexdigit() || b == b':',
            Kind::Phone => b.is_ascii_digit() || b == b'+' || b == b'(',
        }
    }

    /// Whether byte `b` can follow the first byte of a match of this kind (of one that also
    /// passes the gate, for the kinds with one). Every match has at least two bytes.
    fn may_follow(self, b: u8) -> bool {
        match self {
            Kind::Pem => b == b'-',
            Kind::Jwt => b == b'y',
            // `gh`, `github_pat_`, `xox`, `sk`, `rk`, `AIza`, `glpat-`.
            Kind::Token => matches!(b, b'h' | b'i' | b'o' | b'k' | b'I' | b'l'),
            Kind::Aws => matches!(
                b,
                b'K' | b'S' | b'B' | b'C' | b'G' | b'I' | b'N' | b'R' | b'P'
            ),
            Kind::Bearer => matches!(b, b'e' | b'E'),
            Kind::Email => {
                b.is_ascii_alphanumeric()
                    || !b.is_ascii()
                    || matches!(b, b'.' | b'_' | b'%' | b'+' | b'-' | b'@')
            }
            Kind::Iban => b.is_ascii_alphabetic(),
            Kind::Card => b.is_ascii_digit() || matches!(b, b' ' | b'-' | b'.'),
            Kind::Ssn | Kind::SsnTax => b.is_ascii_digit(),
            // The gate's `ssn` or `social`.
            Kind::SsnContext => matches!(b, b's' | b'S' | b'o' | b'O'),
            Kind::Ipv4 => b.is_ascii_digit() || b == b'.',
            Kind::Ipv6 => b.is_ascii_hexdigit() || matches!(b, b':' | b'.'),
            Kind::Phone => is_phone_byte(b),
        }
    }

    /// A cheap necessary condition on the bytes from the candidate start, checked before the
    /// anchored regex runs. The scan uses `email_gate` for e-mail; the kinds matched in code
    /// need none.
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
            Kind::SsnContext => {
                r.get(..3).is_some_and(|b| b.eq_ignore_ascii_case(b"ssn"))
                    || r.get(..6)
                        .is_some_and(|b| b.eq_ignore_ascii_case(b"social"))
            }
            // Matched in code (`card_len`, `ssn_len`, `ssn_tax_len`, `ipv4_len`, `ipv6_len`,
            // `phone_len`).
            Kind::Card | Kind::Ssn | Kind::SsnTax | Kind::Ipv4 | Kind::Ipv6 | Kind::Phone => true,
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
            Kind::Email => EMAIL,
            Kind::Iban => r"[A-Za-z]{2}[0-9]{2}(?: ?[A-Za-z0-9]){10,30}",
            Kind::Card => r"[0-9](?:[ .-]?[0-9]){12,18}",
            Kind::Ssn => r"[0-9]{3}[- –—][0-9]{2}[- –—][0-9]{4}",
            Kind::SsnTax => r"[0-9]{9}(?-u:\b)",
            Kind::SsnContext => {
                concat!(
                    r"(?i:ssn|social security)",
                    r"(?:[^0-9A-Za-z\n]{1,12}(?i:number|num|no|nr|is|was|of)){0,3}",
                    r"[^0-9A-Za-z\n]{0,12}[0-9]{9}"
                )
            }
            Kind::Ipv4 => r"[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}",
            Kind::Ipv6 => r"[0-9A-Fa-f]{0,4}:[0-9A-Fa-f:.]{2,}",
            Kind::Phone => r"[+(]?[0-9][0-9 ()./-]{6,24}[0-9]",
        }
    }
}

/// The ranges of [`unspaced_script`], in regex class syntax.
macro_rules! unspaced_ranges {
    () => {
        concat!(
            r"\x{0E00}-\x{0EFF}\x{1000}-\x{109F}\x{1100}-\x{11FF}\x{1780}-\x{17FF}",
            r"\x{2E80}-\x{2FDF}\x{3005}-\x{3007}\x{3021}-\x{3029}\x{3031}-\x{3035}",
            r"\x{3038}-\x{303C}\x{3040}-\x{31FF}\x{3400}-\x{4DBF}\x{4E00}-\x{9FFF}",
            r"\x{A960}-\x{A97F}\x{AC00}-\x{D7FF}\x{F900}-\x{FAFF}\x{FF66}-\x{FFDC}",
            r"\x{1B000}-\x{1B16F}\x{20000}-\x{3FFFF}"
        )
    };
}

/// The local part of [`EMAIL`]: letters and digits of any script but those written without
/// spaces (the characters of [`is_word`] but `_`), and `._%+-` after the first.
macro_rules! email_local {
    () => {
        concat!(
            r"[\p{Alphabetic}\p{N}&&[^",
            unspaced_ranges!(),
            r"]][._%+\-\p{Alphabetic}\p{N}_&&[^",
            unspaced_ranges!(),
            r"]]*"
        )
    };
}

/// The e-mail pattern: a local part, `@`, and [`EMAIL_DOMAIN`].
const EMAIL: &str = concat!(
    email_local!(),
    r"@",
    r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?",
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*\.[A-Za-z]{2,24}"
);

/// The part of [`EMAIL`] after the `@`.
const EMAIL_DOMAIN: &str = concat!(
    r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?",
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*\.[A-Za-z]{2,24}"
);

/// What one scan of a text remembers between candidates, so that no stretch of it is read
/// once per candidate start.
struct Memo {
    /// The next `@` at or after the scan position (`usize::MAX` when there is none).
    next_at: usize,
    /// The `@` whose domain was matched last, and the end of that match.
    domain: Option<(usize, Option<usize>)>,
    /// Where `-----END` was searched from last, and where it was found (see `next_pem_end`).
    pem_end: Option<(usize, Option<usize>)>,
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
    /// For each byte, bit `i` set when it may follow the first byte of a match of `pats[i]`.
    seconds: [u16; 256],
    /// The bit of the e-mail pattern in `starts` (0 when e-mail is not detected).
    email_bit: u16,
    /// The bit of the IBAN pattern (0 when IBANs are not detected): it may start at any two
    /// letters (of either case), so its gate (two digits next) is tested before
    /// `candidates_at` is called.
    iban_bit: u16,
    /// The bits of card, SSN, IPv4, IPv6 and phone (`digit_start_mask` may clear them).
    digit_bits: u16,
    /// The bit of each kind (by `Kind as usize`) in the masks, 0 when it is not detected.
    kind_bits: [u16; 14],
    pats: Vec<Pat>,
    /// [`EMAIL_DOMAIN`], anchored (`None` when e-mail is not detected).
    email_domain: Option<Regex>,
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
        let mut seconds = [0u16; 256];
        for (b, mask) in (0u8..=255).zip(seconds.iter_mut()) {
            for (i, p) in pats.iter().enumerate() {
                if p.kind.may_follow(b) {
                    *mask |= 1 << i;
                }
            }
        }
        let mut kind_bits = [0u16; 14];
        for (i, p) in pats.iter().enumerate() {
            if let Some(bit) = kind_bits.get_mut(p.kind as usize) {
                *bit = 1 << i;
            }
        }
        let bit = |k: Kind| kind_bits.get(k as usize).copied().unwrap_or(0);
        let email_bit = bit(Kind::Email);
        let iban_bit = bit(Kind::Iban);
        let digit_bits = bit(Kind::Card)
            | bit(Kind::Ssn)
            | bit(Kind::SsnTax)
            | bit(Kind::Ipv4)
            | bit(Kind::Ipv6)
            | bit(Kind::Phone);
        let email_domain = (email_bit != 0)
            .then(|| Regex::new(&format!("^(?:{EMAIL_DOMAIN})")).ok())
            .flatten();
        let tags = PiiEntity::ALL
            .iter()
            .map(|e| (*e, Arc::from(format!("pii-{}", e.as_str()))))
            .collect();
        Pii {
            entities: ents,
            starts,
            seconds,
            email_bit,
            iban_bit,
            digit_bits,
            kind_bits,
            pats,
            email_domain,
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
            self.scan_message(i, m.content, &mut out);
        }
        out
    }

    /// Scans one message. A text holding full-width digits or punctuation (`４１１１`, `－`, as
    /// an IME types them), ideographic spaces or en dashes is scanned as its [`FullWidth`]
    /// normalization, and the matches are moved back to the text as written; any other text is
    /// scanned as it is, without a copy.
    fn scan_message(&self, index: usize, text: &str, out: &mut Vec<Match>) {
        let norm = FullWidth::of(text);
        let from = out.len();
        // One call site, so that `scan_text` is inlined as before normalization existed (two
        // made the scan 4 % slower).
        self.scan_text(index, norm.as_ref().map_or(text, |n| n.text.as_str()), out);
        let Some(norm) = norm else { return };
        for m in out.get_mut(from..).unwrap_or_default() {
            m.start = norm.original(m.start);
            m.end = norm.original(m.end);
            m.redacted = redact(text.get(m.start..m.end).unwrap_or(""));
        }
    }

    fn scan_text(&self, index: usize, text: &str, out: &mut Vec<Match>) {
        let bytes = text.as_bytes();
        let mut cands: Vec<(usize, usize, Kind)> = Vec::new();
        // The e-mail pattern needs an `@` within 80 bytes, before any whitespace.
        let mut memo = Memo {
            next_at: next_at_sign(bytes, 0),
            domain: None,
            pem_end: None,
        };
        let mut i = 0;
        // Whether the character before `i` is a word character: candidates glued to a word
        // are never valid, and the scan resumes after the word.
        let mut prev_word = false;
        while let Some(&b) = bytes.get(i) {
            if !b.is_ascii() {
                // A non-ASCII character: it starts no pattern but an e-mail address whose
                // local part begins with a letter of a spaced script (`émile@example.fr`).
                let c = text.get(i..).and_then(|t| t.chars().next());
                let word = c.is_some_and(is_word);
                if word
                    && !prev_word
                    && self.email_bit != 0
                    && email_gate(bytes, i, &mut memo.next_at)
                {
                    // Not through `candidates_at`: a second call site keeps it from being
                    // inlined into this loop (13 % more instructions on ASCII prompts).
                    let found = self
                        .email_len(text, i, &mut memo)
                        .and_then(|n| validate(Kind::Email, text, i, i + n));
                    if let Some((s, e)) = found {
                        cands.push((s, e, Kind::Email));
                        i = e;
                        prev_word = prev_is(text, i, is_word);
                        continue;
                    }
                }
                prev_word = word;
                i += c.map_or(1, char::len_utf8);
                continue;
            }
            if prev_word {
                // Glued to the word before: nothing starts here or in the rest of the word.
                if is_word_byte(b) {
                    (i, prev_word) = skip_word(bytes, i);
                } else {
                    prev_word = false;
                    i += non_word_len(b, bytes, i);
                }
                continue;
            }
            let next = bytes.get(i + 1).copied().unwrap_or(0);
            let mut mask = self.starts.get(usize::from(b)).copied().unwrap_or(0)
                & self.seconds.get(usize::from(next)).copied().unwrap_or(0);
            // Most words start with two letters: without this, each would call
            // `candidates_at` for the IBAN gate alone.
            if mask & self.iban_bit != 0 && !(digit_at(bytes, i + 2) && digit_at(bytes, i + 3)) {
                mask &= !self.iban_bit;
            }
            if mask & self.email_bit != 0 && !email_gate(bytes, i, &mut memo.next_at) {
                mask &= !self.email_bit;
            }
            if b.is_ascii_digit() && mask & self.digit_bits != 0 {
                mask &= self.digit_start_mask(bytes.get(i..).unwrap_or_default());
            }
            if mask == 0 {
                // Most word starts: skip the word.
                if is_word_byte(b) {
                    (i, prev_word) = skip_word(bytes, i + 1);
                } else {
                    i += non_word_len(b, bytes, i);
                }
                continue;
            }
            let max_end = self.candidates_at(text, i, mask, &mut cands, &mut memo);
            if max_end > i {
                i = max_end;
                prev_word = prev_is(text, i, is_word);
            } else {
                prev_word = is_word_byte(b);
                i += 1;
            }
        }
        self.push_resolved(index, text, cands, out);
    }

    /// Runs the patterns of `mask` anchored at `i` (an ASCII byte not glued to a word), pushes
    /// the validated matches to `cands` and returns the furthest end (`i` when none). The
    /// e-mail bit is only set when `email_gate` passed (so `memo.next_at` is the `@` an
    /// e-mail starting at `i` would have).
    fn candidates_at(
        &self,
        text: &str,
        i: usize,
        mask: u16,
        cands: &mut Vec<(usize, usize, Kind)>,
        memo: &mut Memo,
    ) -> usize {
        let bytes = text.as_bytes();
        let rest = bytes.get(i..).unwrap_or_default();
        let prev = i
            .checked_sub(1)
            .and_then(|p| bytes.get(p))
            .copied()
            .unwrap_or(0);
        let mut max_end = i;
        let mut m = mask;
        while m != 0 {
            let k = m.trailing_zeros() as usize;
            m &= m - 1;
            let Some(pat) = self.pats.get(k) else { break };
            let len = match pat.kind {
                Kind::Card => card_len(rest),
                Kind::Ssn => ssn_len(rest),
                Kind::SsnTax => ssn_tax_len(rest),
                Kind::Ipv4 => ipv4_len(rest),
                Kind::Ipv6 if rejected_after(Kind::Ipv6, prev) => None,
                Kind::Ipv6 => ipv6_len(rest),
                Kind::Phone => phone_len(rest),
                Kind::Email => self.email_len(text, i, memo),
                other => (other.gate(rest) && !rejected_after(other, prev))
                    .then(|| anchored_len(&pat.re, text, i))
                    .flatten(),
            };
            let valid = len.and_then(|n| match pat.kind {
                Kind::Pem => pem(text, i, i + n, &mut memo.pem_end),
                kind => validate(kind, text, i, i + n),
            });
            if let Some((s, e)) = valid {
                cands.push((s, e, pat.kind));
                max_end = max_end.max(e);
            }
        }
        max_end
    }

    /// The length of the [`EMAIL`] match at `i`, whose `@` is `memo.next_at`: the local part is
    /// checked in code and the domain matched once per `@` (every start before the same `@`
    /// shares it; matching it again from each made `a.a.a.a@<long domain>` cost 40 times more).
    fn email_len(&self, text: &str, i: usize, memo: &mut Memo) -> Option<usize> {
        let a = memo.next_at;
        let local = text.get(i..a)?;
        let mut chars = local.chars();
        // The first: an ASCII letter or digit, or a letter or digit of a spaced script.
        if !chars
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || (is_word(c) && c != '_'))
        {
            return None;
        }
        let ascii =
            |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'%' | b'+' | b'-');
        let ok = if chars.as_str().bytes().all(ascii) {
            true
        } else {
            chars.all(|c| {
                if c.is_ascii() {
                    ascii(c as u8)
                } else {
                    is_word(c)
                }
            })
        };
        if !ok {
            return None;
        }
        let end = match memo.domain {
            Some((at, end)) if at == a => end,
            _ => {
                let end = self
                    .email_domain
                    .as_ref()
                    .and_then(|re| anchored_len(re, text, a + 1))
                    .map(|n| a + 1 + n);
                memo.domain = Some((a, end));
                end
            }
        };
        end.map(|e| e - i)
    }

    /// All bits but those of the kinds matched in code that cannot match at the start of `r`
    /// (a digit), as decided by the length of the digit run there and the byte after it:
    /// necessary conditions of `card_len`, `ssn_len`, `ipv4_len`, `ipv6_len` and `phone_len`.
    fn digit_start_mask(&self, r: &[u8]) -> u16 {
        let d = digit_run(r, 0, 13);
        let x = r.get(d).copied().unwrap_or(0);
        let bit = |k: Kind| self.kind_bits.get(k as usize).copied().unwrap_or(0);
        let mut keep = !self.digit_bits;
        // 13 digits, or a separator the walk may take.
        if d >= 13 || matches!(x, b' ' | b'-' | b'.') {
            keep |= bit(Kind::Card);
        }
        // `-`, ` `, or the lead byte of `–` and `—`.
        if d == 3 && matches!(x, b' ' | b'-' | 0xE2) {
            keep |= bit(Kind::Ssn);
        }
        if d == 9 && !is_word_byte(x) {
            keep |= bit(Kind::SsnTax);
        }
        if d <= 3 && x == b'.' {
            keep |= bit(Kind::Ipv4);
        }
        // A hex run of at most 4 then `:`.
        if d <= 4 && (x.is_ascii_hexdigit() || x == b':') {
            keep |= bit(Kind::Ipv6);
        }
        // At least 7 phone bytes after the first digit.
        if d >= 8 || is_phone_byte(x) {
            keep |= bit(Kind::Phone);
        }
        keep
    }

    /// Resolves overlaps (higher-priority kinds first, then leftmost) and pushes the kept
    /// candidates to `out` in order of position.
    fn push_resolved(
        &self,
        index: usize,
        text: &str,
        mut cands: Vec<(usize, usize, Kind)>,
        out: &mut Vec<Match>,
    ) {
        cands.sort_by_key(|&(s, e, k)| (k as u8, s, usize::MAX - e));
        // The kept values, by start. They do not overlap, so of those starting before a
        // candidate's end the last one has the furthest end: the candidate overlaps a kept
        // value exactly when it overlaps that one. (Comparing it with every kept value made
        // a text of many values quadratic: 128 KiB of IP addresses took 0.8 s.)
        let mut kept: BTreeMap<usize, (usize, Kind)> = BTreeMap::new();
        for (s, e, k) in cands {
            let overlaps = kept
                .range(..e)
                .next_back()
                .is_some_and(|(_, &(ke, _))| ke > s);
            if !overlaps {
                kept.insert(s, (e, k));
            }
        }
        for (s, (e, k)) in kept {
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

/// A text with its full-width digits (U+FF10..U+FF19), hyphen-minus (U+FF0D), plus sign
/// (U+FF0B), parentheses (U+FF08, U+FF09) and full stop (U+FF0E), its ideographic spaces
/// (U+3000) and its en dashes (U+2013) replaced by their ASCII forms (an en dash by `-`), and
/// where they were. Each of them is 3 bytes in UTF-8.
struct FullWidth {
    text: String,
    /// The offsets in `text` of the replaced characters, in order (each of their 3 bytes
    /// became 1).
    replaced: Vec<usize>,
}

impl FullWidth {
    /// The normalization of `text`, or `None` when it has nothing to replace (one `memchr3`
    /// pass for the lead bytes `0xEF`, `0xE3` and `0xE2` of the three-byte forms, no
    /// allocation).
    fn of(text: &str) -> Option<Self> {
        let bytes = text.as_bytes();
        let ascii = |j: usize| full_width_ascii(bytes.get(j..).unwrap_or_default());
        let first = memchr::memchr3_iter(0xEF, 0xE3, 0xE2, bytes).find(|j| ascii(*j).is_some())?;
        let mut out = String::with_capacity(text.len());
        let mut replaced = Vec::new();
        let mut copied = 0;
        // These bytes only ever lead a character, so each `j` is a character boundary.
        for j in memchr::memchr3_iter(0xEF, 0xE3, 0xE2, bytes.get(first..)?).map(|j| first + j) {
            let Some(a) = ascii(j) else { continue };
            out.push_str(text.get(copied..j)?);
            replaced.push(out.len());
            out.push(char::from(a));
            copied = j + 3;
        }
        out.push_str(text.get(copied..)?);
        Some(FullWidth {
            text: out,
            replaced,
        })
    }

    /// The offset in the original text of the character boundary `at` of the normalized one.
    fn original(&self, at: usize) -> usize {
        at + 2 * self.replaced.partition_point(|&r| r < at)
    }
}

/// The ASCII form of the character `r` starts with, when [`FullWidth`] replaces it.
fn full_width_ascii(r: &[u8]) -> Option<u8> {
    match r {
        [0xEF, 0xBC, 0x8D, ..] | [0xE2, 0x80, 0x93, ..] => Some(b'-'),
        [0xEF, 0xBC, 0x8B, ..] => Some(b'+'),
        [0xEF, 0xBC, 0x88, ..] => Some(b'('),
        [0xEF, 0xBC, 0x89, ..] => Some(b')'),
        [0xEF, 0xBC, 0x8E, ..] => Some(b'.'),
        [0xE3, 0x80, 0x80, ..] => Some(b' '),
        [0xEF, 0xBC, d @ 0x90..=0x99, ..] => Some(b'0' + (d - 0x90)),
        _ => None,
    }
}

/// Length of the match of an anchored (`^`) pattern at `i`.
fn anchored_len(re: &Regex, text: &str, i: usize) -> Option<usize> {
    text.get(i..).and_then(|t| re.find(t)).map(|m| m.end())
}

/// The e-mail pattern's necessary condition at `i`: an `@` within 80 bytes, with no
/// whitespace before it. `next_at` is the position of the next `@` at or after the previous
/// call's `i` (`usize::MAX` when there is none); it moves on when `i` has passed it.
#[inline]
fn email_gate(bytes: &[u8], i: usize, next_at: &mut usize) -> bool {
    if *next_at < i {
        *next_at = next_at_sign(bytes, i);
    }
    let a = *next_at;
    a - i < 80
        && !bytes
            .get(i..a)
            .is_some_and(|w| w.iter().any(u8::is_ascii_whitespace))
}

/// The position of the first `@` at or after `from` (`usize::MAX` when there is none).
fn next_at_sign(bytes: &[u8], from: usize) -> usize {
    bytes
        .get(from..)
        .and_then(|r| memchr::memchr(b'@', r))
        .map_or(usize::MAX, |j| from + j)
}

/// ASCII letters, digits and `_`.
static WORD_BYTE: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = c.is_ascii_alphanumeric() || c == b'_';
        b += 1;
    }
    t
};

fn is_word_byte(b: u8) -> bool {
    WORD_BYTE[usize::from(b)]
}

/// Skips the rest of an ASCII word from `from`, and the ASCII non-word byte after it (or the
/// escape it starts) as the scan would, glued to the word, without a turn of its loop for it:
/// the position reached, and whether the byte before it is a word character (the word ends
/// at a non-ASCII character or the end of the text).
#[inline(always)]
fn skip_word(bytes: &[u8], from: usize) -> (usize, bool) {
    let end = ascii_word_end(bytes, from);
    match bytes.get(end) {
        Some(&b) if b.is_ascii() => (end + non_word_len(b, bytes, end), false),
        _ => (end, true),
    }
}

/// The first position at or after `from` that does not hold an ASCII word byte.
/// A plain loop: as `position`, LLVM compiled it to twice the instructions per byte once the
/// scan loop around it had grown.
#[inline(always)]
fn ascii_word_end(bytes: &[u8], from: usize) -> usize {
    let mut j = from;
    while bytes.get(j).is_some_and(|b| is_word_byte(*b)) {
        j += 1;
    }
    j.min(bytes.len())
}

fn digit_at(r: &[u8], i: usize) -> bool {
    r.get(i).is_some_and(u8::is_ascii_digit)
}

/// The number of ASCII digits from `from`, counting at most `max`.
fn digit_run(r: &[u8], from: usize, max: usize) -> usize {
    r.get(from..).map_or(0, |t| {
        t.iter()
            .take(max)
            .take_while(|b| b.is_ascii_digit())
            .count()
    })
}

// The matchers below compute, in code, the length of the match that the anchored regex of
// their kind (see `Kind::pattern`) finds at the start of `r`; a test checks them against the
// regexes on random inputs.

/// `[0-9](?:[ .-]?[0-9]){12,18}`: a greedy walk; a separator counts only before a digit.
fn card_len(r: &[u8]) -> Option<usize> {
    if !digit_at(r, 0) {
        return None;
    }
    let mut end = 1;
    let mut reps = 0;
    while reps < 18 {
        if digit_at(r, end) {
            end += 1;
        } else if matches!(r.get(end), Some(b' ' | b'-' | b'.')) && digit_at(r, end + 1) {
            end += 2;
        } else {
            break;
        }
        reps += 1;
    }
    (reps >= 12).then_some(end)
}

/// `[0-9]{3}[- –—][0-9]{2}[- –—][0-9]{4}`.
fn ssn_len(r: &[u8]) -> Option<usize> {
    let digits = |from: usize, n: usize| digit_run(r, from, n) == n;
    if !digits(0, 3) {
        return None;
    }
    let g = 3 + ssn_sep_len(r.get(3..)?)?;
    if !digits(g, 2) {
        return None;
    }
    let k = g + 2 + ssn_sep_len(r.get(g + 2..)?)?;
    digits(k, 4).then_some(k + 4)
}

/// `[0-9]{9}(?-u:\b)`: nine digits, then no ASCII word byte.
fn ssn_tax_len(r: &[u8]) -> Option<usize> {
    (digit_run(r, 0, 9) == 9 && !r.get(9).is_some_and(|b| is_word_byte(*b))).then_some(9)
}

/// The length of the SSN separator `r` starts with: `-`, a space, an en dash or an em dash.
fn ssn_sep_len(r: &[u8]) -> Option<usize> {
    match r {
        [b'-' | b' ', ..] => Some(1),
        [0xE2, 0x80, 0x93 | 0x94, ..] => Some(3),
        _ => None,
    }
}

/// `[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}`: each of the first three groups is a
/// whole digit run of 1 to 3 digits followed by a dot; the last takes up to 3 digits.
fn ipv4_len(r: &[u8]) -> Option<usize> {
    let mut end = 0;
    for _ in 0..3 {
        let d = digit_run(r, end, 4);
        if !(1..=3).contains(&d) || r.get(end + d) != Some(&b'.') {
            return None;
        }
        end += d + 1;
    }
    let d = digit_run(r, end, 3);
    (d >= 1).then_some(end + d)
}

/// `[0-9A-Fa-f]{0,4}:[0-9A-Fa-f:.]{2,}`: a whole hex run of at most 4 digits, a colon, and
/// the whole run of hex digits, colons and dots after it (at least 2).
fn ipv6_len(r: &[u8]) -> Option<usize> {
    let h = r
        .iter()
        .take(5)
        .take_while(|b| b.is_ascii_hexdigit())
        .count();
    if h > 4 || r.get(h) != Some(&b':') {
        return None;
    }
    let body = r
        .get(h + 1..)?
        .iter()
        .take_while(|b| b.is_ascii_hexdigit() || matches!(b, b':' | b'.'))
        .count();
    (body >= 2).then_some(h + 1 + body)
}

/// `[+(]?[0-9][0-9 ()./-]{6,24}[0-9]`: after the optional sign and the first digit, the
/// longest 6 to 24 phone bytes that a digit follows (the regex backtracks to it).
fn phone_len(r: &[u8]) -> Option<usize> {
    let j = usize::from(matches!(r.first(), Some(b'+' | b'(')));
    if !digit_at(r, j) {
        return None;
    }
    let body = j + 1;
    let run = r
        .get(body..)?
        .iter()
        .take(25)
        .take_while(|b| is_phone_byte(**b))
        .count();
    (6..run)
        .rev()
        .find(|&k| digit_at(r, body + k))
        .map(|k| body + k + 1)
}

/// A byte of the phone pattern's body: `[0-9 ()./-]`.
fn is_phone_byte(b: u8) -> bool {
    b.is_ascii_digit() || matches!(b, b' ' | b'(' | b')' | b'.' | b'/' | b'-')
}

/// The character before `at`; the `n`, `r` or `t` of an escaped line break or tab (`\n`, as
/// JSON and string literals write them: tool-call arguments, pasted logs) reads as a space.
fn prev_char(text: &str, at: usize) -> Option<char> {
    let t = text.get(..at)?;
    let c = t.chars().next_back()?;
    if matches!(c, 'n' | 'r' | 't') && t.as_bytes().get(at.wrapping_sub(2)) == Some(&b'\\') {
        return Some(' ');
    }
    Some(c)
}

/// The length of the non-word character `b` at `i` (an ASCII byte that is no word byte), or of the
/// escape it starts: `\n`, `\r` and `\t` are whitespace (see [`prev_char`]), so a value after
/// one is not glued to its letter (`"Card:\n4111 1111 1111 1111"`).
#[inline(always)]
fn non_word_len(b: u8, bytes: &[u8], i: usize) -> usize {
    if b == b'\\' && matches!(bytes.get(i + 1), Some(b'n' | b'r' | b't')) {
        2
    } else {
        1
    }
}

fn next_char(text: &str, at: usize) -> Option<char> {
    text.get(at..).and_then(|t| t.chars().next())
}

/// A character that glues a value to the word next to it: letters, digits and `_`, except the
/// letters of scripts written without spaces between words, where a value written directly
/// against the text (`电话+86 138 0013 8000`, `taro@example.jpです`) is still a value.
fn is_word(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_alphanumeric() || c == '_';
    }
    c.is_alphanumeric() && !unspaced_script(c)
}

/// Letters of scripts written without spaces between words, or whose particles attach to the
/// word before them: Thai, Lao, Myanmar, Khmer, Hangul, kana, CJK ideographs (with their
/// radicals, strokes, extensions and compatibility forms, and the halfwidth forms).
fn unspaced_script(c: char) -> bool {
    matches!(
        u32::from(c),
        0x0E00..=0x0EFF // Thai, Lao
            | 0x1000..=0x109F // Myanmar
            | 0x1100..=0x11FF // Hangul Jamo
            | 0x1780..=0x17FF // Khmer
            | 0x2E80..=0x2FDF // CJK radicals, Kangxi radicals
            | 0x3005..=0x3007 // 々 〆 〇
            | 0x3021..=0x3029 // Hangzhou numerals
            | 0x3031..=0x3035 // kana repeat marks
            | 0x3038..=0x303C // 〸 〹 〺 〻 〼
            | 0x3040..=0x31FF // Hiragana, Katakana, Bopomofo, Hangul compatibility Jamo, ...
            | 0x3400..=0x4DBF // CJK extension A
            | 0x4E00..=0x9FFF // CJK unified ideographs
            | 0xA960..=0xA97F // Hangul Jamo extended A
            | 0xAC00..=0xD7FF // Hangul syllables, Jamo extended B
            | 0xF900..=0xFAFF // CJK compatibility ideographs
            | 0xFF66..=0xFFDC // halfwidth Katakana and Hangul
            | 0x1B000..=0x1B16F // kana supplement and extensions
            | 0x20000..=0x3FFFF // CJK extensions B and later
    )
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
    context_words(text, at).map(|(w, _)| w)
}

/// [`context_word`], and the word before it when it is within the same 40 bytes and line.
fn context_words(text: &str, at: usize) -> Option<(String, Option<String>)> {
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
                return Some(("#".into(), None));
            }
            if c == '\n' {
                break;
            }
        }
        // The closest non-filler word is one of the first 4; one more is the word before it.
        if words.len() >= 5 {
            break;
        }
    }
    if !word.is_empty() && from == 0 {
        words.push(word.chars().rev().collect());
    }
    let i = words
        .iter()
        .take(4)
        .position(|w| !FILLERS.contains(&w.as_str()))?;
    let mut rest = words.into_iter().skip(i);
    let w = rest.next()?;
    Some((w, rest.next()))
}

fn negative_context(text: &str, at: usize) -> bool {
    // `Tax ID: 078-05-1120`, `taxpayer id`: a US tax identification number is an SSN (or an
    // ITIN) whenever it has an SSN's shape.
    let Some((w, before)) = context_words(text, at) else {
        return false;
    };
    if tax_id(&w, before.as_deref()) {
        return false;
    }
    w == "#" || NEGATIVE_CONTEXT.contains(&w.as_str())
}

/// Whether the closest non-filler word before `at` is `id` after `tax` or `taxpayer` (`Tax
/// ID: `, `taxpayer id number`, `tax_id=`).
fn after_tax_id(text: &str, at: usize) -> bool {
    context_words(text, at).is_some_and(|(w, before)| tax_id(&w, before.as_deref()))
}

/// Whether a context word `w`, after the word `before`, is a tax-ID label.
fn tax_id(w: &str, before: Option<&str>) -> bool {
    w == "id" && matches!(before, Some("tax" | "taxpayer"))
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

/// Whether `validate` rejects a token, JWT or IPv6 match for the byte `prev` before it (the
/// scan never starts one after a word character, so that part of its test is left out). Their
/// matches have no length bound and every start inside one is such a start: testing this
/// before matching keeps each run from being read again from each of its positions, which made
/// the scan quadratic (`sk-sk-sk-...`, `eyJ-eyJ-...`, `::::...`).
fn rejected_after(kind: Kind, prev: u8) -> bool {
    match kind {
        Kind::Token => prev == b'-',
        Kind::Jwt => matches!(prev, b'-' | b'.'),
        Kind::Ipv6 => matches!(prev, b':' | b'.'),
        _ => false,
    }
}

fn validate(kind: Kind, text: &str, s: usize, e: usize) -> Option<(usize, usize)> {
    if matches!(kind, Kind::Phone | Kind::Card | Kind::Ssn) && after_digit_group(text, s) {
        return None;
    }
    let cand = text.get(s..e)?;
    match kind {
        Kind::Pem => pem(text, s, e, &mut None),
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
            // The same separator twice.
            let mut seps = cand
                .split(|c: char| c.is_ascii_digit())
                .filter(|x| !x.is_empty());
            if seps.next() != seps.next() {
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
        Kind::SsnTax => {
            if next_is(text, e, |c| is_word(c) || c == '-')
                || prev_is(text, s, |c| is_word(c) || c == '-' || c == '.')
            {
                return None;
            }
            (ssn_valid(cand) && after_tax_id(text, s)).then_some((s, e))
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

/// The first `-----END` at or after `from`, remembered in `memo` as `(from, found)` between the
/// calls of one scan: a text with many headers is searched once, not once per header.
fn next_pem_end(
    text: &str,
    from: usize,
    memo: &mut Option<(usize, Option<usize>)>,
) -> Option<usize> {
    if let Some((f, found)) = *memo
        && f <= from
        && found.is_none_or(|a| a >= from)
    {
        return found;
    }
    let found = text
        .get(from..)
        .and_then(|r| r.find("-----END"))
        .map(|j| from + j);
    *memo = Some((from, found));
    found
}

/// A private-key block from its header `s..e`: through the next `-----END ...-----` (or the
/// next blank line when there is none), with at least 40 base64 characters in the body.
fn pem(
    text: &str,
    s: usize,
    e: usize,
    memo: &mut Option<(usize, Option<usize>)>,
) -> Option<(usize, usize)> {
    let rest = text.get(e..)?;
    let (body, end) = match next_pem_end(text, e, memo).and_then(|a| a.checked_sub(e)) {
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
    // `git@github.com:org/repo.git`, `deploy@host:/srv`: an SSH or scp remote, not an address.
    let after = text.as_bytes().get(e..).unwrap_or_default();
    if after.first() == Some(&b':') && after.get(1).is_some_and(|b| !b.is_ascii_whitespace()) {
        return None;
    }
    let cand = text.get(s..e)?;
    let tld = cand.rsplit('.').next()?.to_ascii_lowercase();
    if FILE_EXTENSIONS.contains(&tld.as_str()) {
        return None;
    }
    Some((s, e))
}

/// IBAN length by country: the 89 countries of the SWIFT IBAN registry (ISO 13616), 2025.
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
    ("BI", 27),
    ("BR", 29),
    ("BY", 28),
    ("CH", 21),
    ("CR", 22),
    ("CY", 28),
    ("CZ", 24),
    ("DE", 22),
    ("DJ", 27),
    ("DK", 18),
    ("DO", 28),
    ("EE", 20),
    ("EG", 29),
    ("ES", 24),
    ("FI", 18),
    ("FK", 18),
    ("FO", 18),
    ("FR", 27),
    ("GB", 22),
    ("GE", 22),
    ("GI", 23),
    ("GL", 18),
    ("GR", 27),
    ("GT", 28),
    ("HN", 28),
    ("HR", 21),
    ("HU", 28),
    ("IE", 22),
    ("IL", 23),
    ("IQ", 23),
    ("IS", 26),
    ("IT", 27),
    ("JO", 30),
    ("KW", 30),
    ("KZ", 20),
    ("LB", 28),
    ("LC", 32),
    ("LI", 21),
    ("LT", 20),
    ("LU", 20),
    ("LV", 21),
    ("LY", 25),
    ("MC", 27),
    ("MD", 24),
    ("ME", 22),
    ("MK", 19),
    ("MN", 20),
    ("MR", 27),
    ("MT", 31),
    ("MU", 30),
    ("NI", 28),
    ("NL", 18),
    ("NO", 15),
    ("OM", 23),
    ("PK", 24),
    ("PL", 28),
    ("PS", 29),
    ("PT", 25),
    ("QA", 29),
    ("RO", 24),
    ("RS", 22),
    ("RU", 33),
    ("SA", 24),
    ("SC", 31),
    ("SD", 18),
    ("SE", 24),
    ("SI", 19),
    ("SK", 24),
    ("SM", 27),
    ("SO", 23),
    ("ST", 25),
    ("SV", 28),
    ("TL", 23),
    ("TN", 24),
    ("TR", 26),
    ("UA", 29),
    ("VA", 22),
    ("VG", 24),
    ("XK", 20),
    ("YE", 30),
];

fn iban(text: &str, s: usize, e: usize) -> Option<(usize, usize)> {
    if prev_is(text, s, is_word) {
        return None;
    }
    let cand = text.get(s..e)?;
    let country = cand.as_bytes().get(..2)?;
    let len = IBAN_LENGTHS
        .iter()
        .find(|(c, _)| country.eq_ignore_ascii_case(c.as_bytes()))
        .map(|(_, l)| *l)?;
    let mut chars = String::with_capacity(len);
    let mut end = s;
    for (i, c) in cand.char_indices() {
        if c == ' ' {
            continue;
        }
        chars.push(c.to_ascii_uppercase());
        if chars.len() == len {
            end = s + i + c.len_utf8();
            break;
        }
    }
    if chars.len() != len || next_is(text, end, is_word) {
        return None;
    }
    // Lower case: only as an IBAN is written (unspaced or in groups of 4), not any run of
    // lower-case words that spaces between single characters would join.
    let value = text.get(s..end)?;
    if value.bytes().any(|b| b.is_ascii_lowercase()) && !grouped_by_four(value) {
        return None;
    }
    iban_checksum(&chars).then_some((s, end))
}

/// Whether `value` has no space, or groups of 4 characters between single spaces (the last of
/// 1 to 4).
fn grouped_by_four(value: &str) -> bool {
    let mut groups = value.split(' ');
    let last = groups.next_back().map_or(0, str::len);
    !value.contains(' ') || ((1..=4).contains(&last) && groups.all(|g| g.len() == 4))
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
    let mut e = e;
    let whole = text.get(s..e)?;
    if let Some(dot) = whole.find('.') {
        if dot != 4 || whole.contains([' ', '-']) {
            // Not grouped by dots: the number ends at the dot, as before dots were read
            // (`4111 1111 1111 1111.5`, `4111111111111111.5`).
            e = s + dot;
        } else if !dotted_card(whole) || dot_and_digit(text.as_bytes(), e) {
            return None;
        }
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

/// Whether a card candidate grouped by dots has a card's groups: at least three, the first of 4
/// digits, the others of 3 to 6 (`4111.1111.1111.1111`, `3782.822463.10005`). Decimal numbers
/// (`3.14159265358979`), thousands separators (`4.111.111.111.111`) and OIDs do not.
fn dotted_card(cand: &str) -> bool {
    let mut groups = cand.split('.');
    groups.next().is_some_and(|g| g.len() == 4)
        && groups.clone().count() >= 2
        && groups.all(|g| (3..=6).contains(&g.len()))
}

/// Whether `at` holds a `.` and a digit: the value before it is part of a longer dotted run.
fn dot_and_digit(bytes: &[u8], at: usize) -> bool {
    bytes.get(at) == Some(&b'.') && digit_at(bytes, at + 1)
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
    // A product token's version (`Chrome/120.0.0.0` in a user agent), not an address in a
    // URL or a path (`http://10.0.0.5`, `/nodes/10.0.0.5`, `10.1.2.3/10.1.2.4`).
    if product_version(text.as_bytes(), s) {
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

/// Whether the value at `s` follows `/` and a product name (`Chrome/`, `AppleWebKit/`): a run
/// of at most 64 of `A-Za-z0-9_.-` that starts with a letter after neither `/` nor another
/// such byte within reach.
fn product_version(bytes: &[u8], s: usize) -> bool {
    let Some(slash) = s.checked_sub(1) else {
        return false;
    };
    if bytes.get(slash) != Some(&b'/') {
        return false;
    }
    let name = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-');
    let before = bytes.get(..slash).unwrap_or_default();
    let run = before.iter().rev().take(65).take_while(|b| name(b)).count();
    if run == 0 || run > 64 {
        return false;
    }
    let start = slash - run;
    bytes.get(start).is_some_and(u8::is_ascii_alphabetic)
        && start
            .checked_sub(1)
            .and_then(|p| bytes.get(p))
            .is_none_or(|b| *b != b'/')
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
    // Required of the address below; the same with or without a final `:`, and checked
    // first because it is cheaper than the parse (clock times such as `10:30:45` fail it).
    let has_digit = cand.bytes().any(|b| b.is_ascii_digit());
    let long_group = cand.split(':').any(|g| g.len() >= 3);
    if !(has_digit && long_group) {
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
    (colons >= 2).then_some((s, end))
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
    let bad_prev = match prev_char(text, s) {
        // `tel:`, `phone:`: a colon after a letter labels the number; after anything else
        // (`10:30`, `1:2`) it is part of a time, a ratio or an address.
        Some(':') => !labelled_colon(text, s - 1),
        Some(c) => is_word(c) || matches!(c, '.' | '-' | '/' | '+' | '$' | '€' | '£' | '=' | '\''),
        None => false,
    };
    if bad_prev {
        return None;
    }
    let mut end = e;
    // A prefix holding two `(` or two `)` never has a phone shape: start from the longest
    // one without, which dropping groups one by one below would reach (`(1(1(1...` costs a
    // few steps instead of one per group).
    if let Some(q) = second_paren(text.get(s..e)?) {
        let trimmed = text
            .get(s..s + q)?
            .trim_end_matches([' ', '-', '.', '/', '(']);
        if trimmed.len() < 7 {
            return None;
        }
        end = s + trimmed.len();
    }
    loop {
        let cand = text.get(s..end)?;
        let next_bad = (next_is(text, end, is_word) && !glued_extension(text, end))
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

/// Whether `at` holds an extension written against the number (`x42`, `ext42`, `ext.42`,
/// `EXT:42`): `x`, `ext` or `extn` (ASCII case-insensitive), an optional `.` or `:`, and 1 to 6
/// digits that end the word, after at most one space (`ext 42`, `ext. 42`). One after a space
/// or `;` (` ext. 42`, `;ext=42`) leaves the number unglued already.
fn glued_extension(text: &str, at: usize) -> bool {
    let r = text.as_bytes().get(at..).unwrap_or_default();
    let word = r
        .iter()
        .take(5)
        .take_while(|b| b.is_ascii_alphabetic())
        .count();
    let label = r.get(..word).unwrap_or_default();
    if !["x", "ext", "extn"]
        .iter()
        .any(|l| label.eq_ignore_ascii_case(l.as_bytes()))
    {
        return false;
    }
    let mut from = word + usize::from(matches!(r.get(word), Some(b'.' | b':')));
    from += usize::from(r.get(from) == Some(&b' '));
    let d = digit_run(r, from, 7);
    (1..=6).contains(&d) && !next_is(text, at + from + d, is_word)
}

/// Whether the `:` at `colon` ends a label (`tel:`, `Телефон:`, `Tel.:`): a letter of any
/// script, or a letter and a `.`, comes before it.
fn labelled_colon(text: &str, colon: usize) -> bool {
    match prev_char(text, colon) {
        Some('.') => prev_is(text, colon - 1, char::is_alphabetic),
        Some(c) => c.is_alphabetic(),
        None => false,
    }
}

/// The position of the second `(` or the second `)` of `cand`, whichever comes first.
fn second_paren(cand: &str) -> Option<usize> {
    let (mut open, mut close) = (0, 0);
    for (i, b) in cand.bytes().enumerate() {
        match b {
            b'(' => open += 1,
            b')' => close += 1,
            _ => continue,
        }
        if open == 2 || close == 2 {
            return Some(i);
        }
    }
    None
}

/// The accepted phone shapes (see the reference).
fn phone_shape(cand: &str) -> bool {
    let groups: SmallVec<[&str; 16]> = cand
        .split(|c: char| !c.is_ascii_digit())
        .filter(|g| !g.is_empty())
        .collect();
    let d: usize = groups.iter().map(|g| g.len()).sum();
    let Some(first) = groups.first() else {
        return false;
    };
    // One group without `+` fails below whatever the parentheses; decided first, it is the
    // common case (an unseparated number).
    if groups.len() < 2 && !cand.starts_with('+') {
        return false;
    }
    let count = |p: u8| cand.bytes().filter(|b| *b == p).count();
    let parens = count(b'(');
    if parens != count(b')') || parens > 1 {
        return false;
    }
    if cand.starts_with('+') {
        if groups.len() == 1 {
            return (10..=15).contains(&d);
        }
        // Groups of at most 8 digits, or the country code and the whole national number
        // (`+91-9876543210`).
        return first.len() <= 3
            && (8..=15).contains(&d)
            && (groups.len() == 2 || groups.iter().all(|g| g.len() <= 8));
    }
    if groups.len() < 2 {
        return false;
    }
    let lens: SmallVec<[usize; 16]> = groups.iter().map(|g| g.len()).collect();
    // North American: (NXX) NXX-XXXX, NXX-NXX-XXXX, NXX.NXX.XXXX, 1-NXX-NXX-XXXX.
    let nanp = |area: &str| {
        area.as_bytes()
            .first()
            .is_some_and(|b| (b'2'..=b'9').contains(b))
    };
    if lens[..] == [3, 3, 4] && nanp(first) {
        let separated = cand
            .chars()
            .any(|c| !c.is_ascii_digit() && c != '(' && c != ')');
        return separated || cand.starts_with('(');
    }
    if lens[..] == [1, 3, 3, 4] && *first == "1" {
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
    /// patterns; the kinds matched in code have none).
    fn reference_gate(k: Kind, r: &[u8]) -> bool {
        let at = |i: usize| r.get(i).copied().unwrap_or(0);
        let within = |n: usize, b: u8| r.iter().take(n).any(|x| *x == b);
        match k {
            Kind::Ssn => matches!(at(3), b'-' | b' ' | 0xE2),
            Kind::SsnTax => r.len() >= 9,
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
        "电话",
        "です",
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
        "tel:",
        "sk-",
        "-----BEGIN RSA PRIVATE KEY-----\n\n",
        "#",
        "078–05–1120",
        "078—05—1120",
        "–",
        "4111.1111.1111.1111",
        "3782.822463.10005",
        "gb82 west 1234 5698 7654 32",
        "de89370400440532013000",
        "x42",
        "ext.42",
        "Tax ID: ",
    ];

    /// A matcher in code: the length of its kind's match at the start of the bytes.
    type Matcher = fn(&[u8]) -> Option<usize>;

    /// The kinds matched in code, with their matchers.
    const CODE_MATCHERS: &[(Kind, Matcher)] = &[
        (Kind::Card, card_len),
        (Kind::Ssn, ssn_len),
        (Kind::SsnTax, ssn_tax_len),
        (Kind::Ipv4, ipv4_len),
        (Kind::Ipv6, ipv6_len),
        (Kind::Phone, phone_len),
    ];

    /// Each matcher gives the length of the match its kind's anchored regex finds, at every
    /// character boundary of `text`.
    fn assert_matchers_agree_with_regexes(text: &str) -> Result<(), TestCaseError> {
        for (kind, matcher) in CODE_MATCHERS {
            let pat = PII.pats.iter().find(|p| p.kind == *kind).unwrap();
            for i in (0..=text.len()).filter(|i| text.is_char_boundary(*i)) {
                let expected = pat.re.find(&text[i..]).map(|m| m.end());
                let r = &text.as_bytes()[i..];
                if expected.is_some() && r.first().is_some_and(u8::is_ascii_digit) {
                    let bit = PII.kind_bits[*kind as usize];
                    prop_assert!(
                        PII.digit_start_mask(r) & bit != 0,
                        "{:?} at {} of {:?}",
                        kind,
                        i,
                        text
                    );
                }
                prop_assert_eq!(
                    matcher(&text.as_bytes()[i..]),
                    expected,
                    "{:?} at {} of {:?}",
                    kind,
                    i,
                    text
                );
            }
        }
        Ok(())
    }

    const NUMBER_PIECES: &[&str] = &[
        "1", "23", "456", "7890", "4111", "0", " ", "  ", "-", ".", ":", "::", "(", ")", "+", "/",
        "a", "F", "x", "\n", "é", "–", "—", "€",
    ];

    /// Wherever a kind matches (its gate passes and its regex matches), the second byte passes
    /// `may_follow`.
    fn assert_second_bytes_may_follow(text: &str) -> Result<(), TestCaseError> {
        for pat in &PII.pats {
            for i in (0..text.len()).filter(|i| text.is_char_boundary(*i)) {
                let rest = &text[i..];
                if pat.kind.gate(rest.as_bytes()) && pat.re.is_match(rest) {
                    let second = rest.as_bytes().get(1).copied().unwrap_or(0);
                    prop_assert!(
                        pat.kind.may_follow(second),
                        "{:?} at {} of {:?}",
                        pat.kind,
                        i,
                        text
                    );
                }
            }
        }
        Ok(())
    }

    /// `email_len` matches the local part in code and then `EMAIL_DOMAIN`: the full pattern must
    /// be exactly that.
    #[test]
    fn email_pattern_is_local_part_then_domain() {
        assert_eq!(EMAIL, format!("{}@{EMAIL_DOMAIN}", email_local!()));
    }

    #[test]
    fn full_width_normalization_maps_offsets_back() {
        assert!(FullWidth::of("plain text 4111 — ＡＢＣ ｶﾅ ’“ 〜、").is_none());
        let n = FullWidth::of("＋（０）．–　x").unwrap();
        assert_eq!(n.text, "+(0).- x");
        let text = "a４１－b";
        let n = FullWidth::of(text).unwrap();
        assert_eq!(n.text, "a41-b");
        assert_eq!(
            (0..=n.text.len())
                .map(|i| n.original(i))
                .collect::<Vec<_>>(),
            [0, 1, 4, 7, 10, 11]
        );
    }

    #[test]
    fn code_matchers_on_examples() {
        assert_eq!(card_len(b"4111 1111 1111 1111 x"), Some(19));
        assert_eq!(card_len(b"4111-1111-1111-111"), Some(18));
        assert_eq!(card_len(b"4111 1111 111"), None);
        assert_eq!(card_len(b"12345678901234567890123"), Some(19));
        assert_eq!(ssn_len(b"078-05-1120"), Some(11));
        assert_eq!(ssn_len(b"078-05-112"), None);
        assert_eq!(ssn_len("078–05–1120".as_bytes()), Some(15));
        assert_eq!(ssn_len("078 05—1120".as_bytes()), Some(13));
        assert_eq!(ssn_len("078€05€1120".as_bytes()), None);
        assert_eq!(card_len(b"4111.1111.1111.1111."), Some(19));
        assert_eq!(ipv4_len(b"192.168.1.2000"), Some(13));
        assert_eq!(ipv4_len(b"1234.1.1.1"), None);
        assert_eq!(ipv4_len(b"1.2.3"), None);
        assert_eq!(ipv6_len(b"10:30:45."), Some(9));
        assert_eq!(ipv6_len(b"::1"), Some(3));
        assert_eq!(ipv6_len(b"abcde:1:2"), None);
        assert_eq!(phone_len(b"+44 20 7946 0958. "), Some(16));
        assert_eq!(phone_len(b"(555) 123-4567"), Some(14));
        assert_eq!(phone_len(b"+ 555 123 4567"), None);
        assert_eq!(phone_len(b"2024-01-15T10"), Some(10));
        assert_eq!(phone_len(b"1234567"), None);
    }

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
        fn byte_scan_matches_the_reference_on_any_text(text in "[ -~\n é€@电]{0,120}") {
            let p = &*PII;
            prop_assert_eq!(current(p, &text), resolved(reference(p, &text)), "{:?}", text);
        }

        #[test]
        fn second_bytes_of_matches_may_follow(
            parts in proptest::collection::vec(0..PIECES.len(), 0..12)
        ) {
            let text: String = parts.iter().map(|i| PIECES[*i]).collect();
            assert_second_bytes_may_follow(&text)?;
        }

        #[test]
        fn code_matchers_agree_with_their_regexes(
            parts in proptest::collection::vec(0..NUMBER_PIECES.len(), 0..32)
        ) {
            let text: String = parts.iter().map(|i| NUMBER_PIECES[*i]).collect();
            assert_matchers_agree_with_regexes(&text)?;
        }

        #[test]
        fn code_matchers_agree_with_their_regexes_on_any_text(
            text in "[0-9a-fA-Z .:()+/\n-]{0,48}"
        ) {
            assert_matchers_agree_with_regexes(&text)?;
        }
    }
}
