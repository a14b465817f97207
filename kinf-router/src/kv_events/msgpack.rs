//! A minimal, zero-copy, total MessagePack reader and writer for the KV-event wire format.
//!
//! Only what the vLLM payload needs is implemented. Every read is bounds-checked and returns a
//! [`DecodeError`] instead of panicking; nesting is limited to [`MAX_DEPTH`] levels.

use super::DecodeError;

/// Deepest nesting accepted when skipping or validating unknown values.
pub(crate) const MAX_DEPTH: usize = 64;

/// A cursor over a MessagePack buffer.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

/// A decoded MessagePack integer, wide enough for every encoding.
#[derive(Clone, Copy)]
pub(crate) enum Int {
    /// Non-negative.
    U(u64),
    /// Negative.
    I(i64),
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Bytes `[start, pos)` of the underlying buffer.
    pub(crate) fn slice_from(&self, start: usize) -> &'a [u8] {
        self.buf.get(start..self.pos).unwrap_or(&[])
    }

    #[inline]
    fn eof(&self) -> DecodeError {
        DecodeError::Eof(self.pos)
    }

    #[inline]
    pub(crate) fn peek(&self) -> Result<u8, DecodeError> {
        self.buf.get(self.pos).copied().ok_or_else(|| self.eof())
    }

    #[inline]
    fn byte(&mut self) -> Result<u8, DecodeError> {
        let b = self.peek()?;
        self.pos += 1;
        Ok(b)
    }

    #[inline]
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(n).ok_or_else(|| self.eof())?;
        let s = self.buf.get(self.pos..end).ok_or_else(|| self.eof())?;
        self.pos = end;
        Ok(s)
    }

    #[inline]
    fn be<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    #[inline]
    fn u8(&mut self) -> Result<u8, DecodeError> {
        self.byte()
    }
    #[inline]
    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.be()?))
    }
    #[inline]
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.be()?))
    }
    #[inline]
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.be()?))
    }

    #[inline]
    pub(crate) fn type_err(&self, at: usize, expected: &'static str) -> DecodeError {
        DecodeError::Type {
            expected,
            offset: at,
        }
    }

    /// Consumes a nil if one is next; returns whether it did.
    #[inline]
    pub(crate) fn nil(&mut self) -> Result<bool, DecodeError> {
        if self.peek()? == 0xc0 {
            self.pos += 1;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// Reads an array header, or `None` (without consuming) if the next value is not an array.
    #[inline]
    pub(crate) fn try_array_len(&mut self) -> Result<Option<usize>, DecodeError> {
        let m = self.peek()?;
        let n = match m {
            0x90..=0x9f => {
                self.pos += 1;
                usize::from(m & 0x0f)
            }
            0xdc => {
                self.pos += 1;
                usize::from(self.u16()?)
            }
            0xdd => {
                self.pos += 1;
                self.u32()? as usize
            }
            _ => return Ok(None),
        };
        Ok(Some(n))
    }

    /// Reads an array header.
    #[inline]
    pub(crate) fn array_len(&mut self) -> Result<usize, DecodeError> {
        let at = self.pos;
        self.try_array_len()?
            .ok_or_else(|| self.type_err(at, "array"))
    }

    /// Reads a map header, or `None` (without consuming) if the next value is not a map.
    #[inline]
    pub(crate) fn try_map_len(&mut self) -> Result<Option<usize>, DecodeError> {
        let m = self.peek()?;
        let n = match m {
            0x80..=0x8f => {
                self.pos += 1;
                usize::from(m & 0x0f)
            }
            0xde => {
                self.pos += 1;
                usize::from(self.u16()?)
            }
            0xdf => {
                self.pos += 1;
                self.u32()? as usize
            }
            _ => return Ok(None),
        };
        Ok(Some(n))
    }

    /// Reads a string and returns its raw bytes (not checked for UTF-8).
    #[inline]
    pub(crate) fn str_bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let at = self.pos;
        let m = self.byte()?;
        let n = match m {
            0xa0..=0xbf => usize::from(m & 0x1f),
            0xd9 => usize::from(self.u8()?),
            0xda => usize::from(self.u16()?),
            0xdb => self.u32()? as usize,
            _ => return Err(self.type_err(at, "string")),
        };
        self.take(n)
    }

    /// Reads a UTF-8 string.
    pub(crate) fn str(&mut self) -> Result<&'a str, DecodeError> {
        let at = self.pos;
        let b = self.str_bytes()?;
        std::str::from_utf8(b).map_err(|_| DecodeError::Utf8(at))
    }

    /// Reads a binary value (`bin 8/16/32`).
    #[inline]
    fn bin_body(&mut self, m: u8) -> Result<Option<&'a [u8]>, DecodeError> {
        let n = match m {
            0xc4 => usize::from(self.u8()?),
            0xc5 => usize::from(self.u16()?),
            0xc6 => self.u32()? as usize,
            _ => return Ok(None),
        };
        self.take(n).map(Some)
    }

    /// Reads an integer of any width.
    #[inline]
    pub(crate) fn int(&mut self) -> Result<Int, DecodeError> {
        let at = self.pos;
        let m = self.byte()?;
        self.int_body(m)
            .and_then(|o| o.ok_or_else(|| self.type_err(at, "integer")))
    }

    #[inline]
    fn int_body(&mut self, m: u8) -> Result<Option<Int>, DecodeError> {
        Ok(Some(match m {
            0x00..=0x7f => Int::U(u64::from(m)),
            0xe0..=0xff => Int::I(i64::from(m as i8)),
            0xcc => Int::U(u64::from(self.u8()?)),
            0xcd => Int::U(u64::from(self.u16()?)),
            0xce => Int::U(u64::from(self.u32()?)),
            0xcf => Int::U(self.u64()?),
            0xd0 => signed(i64::from(self.u8()? as i8)),
            0xd1 => signed(i64::from(self.u16()? as i16)),
            0xd2 => signed(i64::from(self.u32()? as i32)),
            0xd3 => signed(self.u64()? as i64),
            _ => return Ok(None),
        }))
    }

    /// Reads a non-negative integer that fits in `u32` (the token-id hot path).
    #[inline]
    pub(crate) fn u32_value(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        let at = self.pos;
        let m = self.byte()?;
        match m {
            0x00..=0x7f => Ok(u32::from(m)),
            0xcc => Ok(u32::from(self.u8()?)),
            0xcd => Ok(u32::from(self.u16()?)),
            0xce => self.u32(),
            _ => {
                let v = self
                    .int_body(m)?
                    .ok_or_else(|| self.type_err(at, "integer"))?;
                match v {
                    Int::U(u) => {
                        u32::try_from(u).map_err(|_| DecodeError::Range { what, offset: at })
                    }
                    Int::I(_) => Err(DecodeError::Range { what, offset: at }),
                }
            }
        }
    }

    /// Reads `n` non-negative integers that fit in `u32` into `out` (the token-id hot path: a
    /// local cursor keeps the position in a register).
    #[inline]
    pub(crate) fn u32_values(
        &mut self,
        n: usize,
        out: &mut Vec<u32>,
        what: &'static str,
    ) -> Result<(), DecodeError> {
        let buf = self.buf;
        let mut pos = self.pos;
        for _ in 0..n {
            let Some(&m) = buf.get(pos) else {
                return Err(DecodeError::Eof(pos));
            };
            let v = match m {
                0x00..=0x7f => {
                    pos += 1;
                    u32::from(m)
                }
                0xcc => match buf.get(pos + 1) {
                    Some(&b) => {
                        pos += 2;
                        u32::from(b)
                    }
                    None => return Err(DecodeError::Eof(pos + 1)),
                },
                0xcd => match buf
                    .get(pos + 1..pos + 3)
                    .and_then(|s| <[u8; 2]>::try_from(s).ok())
                {
                    Some(b) => {
                        pos += 3;
                        u32::from(u16::from_be_bytes(b))
                    }
                    None => return Err(DecodeError::Eof(pos + 1)),
                },
                _ => {
                    self.pos = pos;
                    let v = self.u32_value(what)?;
                    pos = self.pos;
                    v
                }
            };
            out.push(v);
        }
        self.pos = pos;
        Ok(())
    }

    /// Reads a signed integer that fits in `i64`.
    pub(crate) fn i64_value(&mut self, what: &'static str) -> Result<i64, DecodeError> {
        let at = self.pos;
        match self.int()? {
            Int::U(u) => i64::try_from(u).map_err(|_| DecodeError::Range { what, offset: at }),
            Int::I(i) => Ok(i),
        }
    }

    /// Reads an engine block hash: an integer of any width (negative values are taken as their
    /// two's-complement `u64`), or raw bytes of which the last 8 are read big-endian.
    #[inline]
    pub(crate) fn block_hash(&mut self) -> Result<u64, DecodeError> {
        let at = self.pos;
        let m = self.byte()?;
        if let Some(v) = self.int_body(m)? {
            return Ok(match v {
                Int::U(u) => u,
                Int::I(i) => i as u64,
            });
        }
        if let Some(b) = self.bin_body(m)? {
            return Ok(low64(b));
        }
        Err(self.type_err(at, "block hash (integer or bytes)"))
    }

    /// Reads a float (f32, f64, or an integer).
    pub(crate) fn f64(&mut self) -> Result<f64, DecodeError> {
        let at = self.pos;
        let m = self.byte()?;
        match m {
            0xca => Ok(f64::from(f32::from_bits(self.u32()?))),
            0xcb => Ok(f64::from_bits(self.u64()?)),
            _ => match self.int_body(m)? {
                Some(Int::U(u)) => Ok(u as f64),
                Some(Int::I(i)) => Ok(i as f64),
                None => Err(self.type_err(at, "float")),
            },
        }
    }

    /// Skips one value of any type, validating its structure.
    pub(crate) fn skip(&mut self) -> Result<(), DecodeError> {
        // Iterative with an explicit count of values still to skip, so that deep nesting cannot
        // overflow the stack; `MAX_DEPTH` bounds how many open containers are tracked.
        let mut pending: [usize; MAX_DEPTH] = [0; MAX_DEPTH];
        let mut depth = 0usize;
        pending[0] = 1;
        loop {
            while pending[depth] == 0 {
                if depth == 0 {
                    return Ok(());
                }
                depth -= 1;
            }
            pending[depth] -= 1;
            let at = self.pos;
            let m = self.byte()?;
            let children = match m {
                0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => 0,
                0x80..=0x8f => usize::from(m & 0x0f) * 2,
                0x90..=0x9f => usize::from(m & 0x0f),
                0xa0..=0xbf => {
                    self.take(usize::from(m & 0x1f))?;
                    0
                }
                0xc4 | 0xd9 => {
                    let n = self.u8()?;
                    self.take(usize::from(n))?;
                    0
                }
                0xc5 | 0xda => {
                    let n = self.u16()?;
                    self.take(usize::from(n))?;
                    0
                }
                0xc6 | 0xdb => {
                    let n = self.u32()?;
                    self.take(n as usize)?;
                    0
                }
                0xc7 => {
                    let n = self.u8()?;
                    self.take(usize::from(n) + 1)?;
                    0
                }
                0xc8 => {
                    let n = self.u16()?;
                    self.take(usize::from(n) + 1)?;
                    0
                }
                0xc9 => {
                    let n = self.u32()?;
                    self.take((n as usize).saturating_add(1))?;
                    0
                }
                0xca => {
                    self.take(4)?;
                    0
                }
                0xcb => {
                    self.take(8)?;
                    0
                }
                0xcc | 0xd0 => {
                    self.take(1)?;
                    0
                }
                0xcd | 0xd1 => {
                    self.take(2)?;
                    0
                }
                0xce | 0xd2 => {
                    self.take(4)?;
                    0
                }
                0xcf | 0xd3 => {
                    self.take(8)?;
                    0
                }
                0xd4 => {
                    self.take(2)?;
                    0
                }
                0xd5 => {
                    self.take(3)?;
                    0
                }
                0xd6 => {
                    self.take(5)?;
                    0
                }
                0xd7 => {
                    self.take(9)?;
                    0
                }
                0xd8 => {
                    self.take(17)?;
                    0
                }
                0xdc => usize::from(self.u16()?),
                0xdd => self.u32()? as usize,
                0xde => usize::from(self.u16()?) * 2,
                0xdf => (self.u32()? as usize).saturating_mul(2),
                // 0xc1 is "never used" in the MessagePack spec.
                _ => return Err(self.type_err(at, "a valid msgpack marker")),
            };
            if children > 0 {
                // Each child needs at least one byte: reject impossible counts early.
                if children > self.remaining() {
                    return Err(self.eof());
                }
                depth += 1;
                if depth >= MAX_DEPTH {
                    return Err(DecodeError::TooDeep(MAX_DEPTH));
                }
                pending[depth] = children;
            }
        }
    }
}

#[inline]
fn signed(i: i64) -> Int {
    if i >= 0 { Int::U(i as u64) } else { Int::I(i) }
}

/// The low 64 bits of a big-endian byte string: its last 8 bytes (fewer are zero-extended).
#[inline]
pub(crate) fn low64(b: &[u8]) -> u64 {
    let tail = &b[b.len().saturating_sub(8)..];
    tail.iter().fold(0u64, |acc, &x| (acc << 8) | u64::from(x))
}

/// Appends MessagePack encodings to a `Vec<u8>`, always choosing the smallest encoding (as
/// msgspec does).
pub(crate) struct Writer<'a> {
    pub(crate) out: &'a mut Vec<u8>,
}

impl Writer<'_> {
    #[inline]
    pub(crate) fn nil(&mut self) {
        self.out.push(0xc0);
    }

    #[inline]
    pub(crate) fn bool(&mut self, b: bool) {
        self.out.push(if b { 0xc3 } else { 0xc2 });
    }

    #[inline]
    pub(crate) fn uint(&mut self, v: u64) {
        if v < 0x80 {
            self.out.push(v as u8);
        } else if v <= u64::from(u8::MAX) {
            self.out.extend_from_slice(&[0xcc, v as u8]);
        } else if v <= u64::from(u16::MAX) {
            self.out.push(0xcd);
            self.out.extend_from_slice(&(v as u16).to_be_bytes());
        } else if v <= u64::from(u32::MAX) {
            self.out.push(0xce);
            self.out.extend_from_slice(&(v as u32).to_be_bytes());
        } else {
            self.out.push(0xcf);
            self.out.extend_from_slice(&v.to_be_bytes());
        }
    }

    #[inline]
    pub(crate) fn int(&mut self, v: i64) {
        if v >= 0 {
            self.uint(v as u64);
        } else if v >= -32 {
            self.out.push(v as i8 as u8);
        } else if v >= i64::from(i8::MIN) {
            self.out.extend_from_slice(&[0xd0, v as i8 as u8]);
        } else if v >= i64::from(i16::MIN) {
            self.out.push(0xd1);
            self.out.extend_from_slice(&(v as i16).to_be_bytes());
        } else if v >= i64::from(i32::MIN) {
            self.out.push(0xd2);
            self.out.extend_from_slice(&(v as i32).to_be_bytes());
        } else {
            self.out.push(0xd3);
            self.out.extend_from_slice(&v.to_be_bytes());
        }
    }

    #[inline]
    pub(crate) fn f64(&mut self, v: f64) {
        self.out.push(0xcb);
        self.out.extend_from_slice(&v.to_bits().to_be_bytes());
    }

    #[inline]
    pub(crate) fn f32(&mut self, v: f32) {
        self.out.push(0xca);
        self.out.extend_from_slice(&v.to_bits().to_be_bytes());
    }

    fn len_header(&mut self, n: usize, fix: u8, fix_max: usize, m8: Option<u8>, m16: u8, m32: u8) {
        if n <= fix_max {
            self.out.push(fix | n as u8);
        } else if let (Some(m8), true) = (m8, n <= usize::from(u8::MAX)) {
            self.out.extend_from_slice(&[m8, n as u8]);
        } else if n <= usize::from(u16::MAX) {
            self.out.push(m16);
            self.out.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            self.out.push(m32);
            // Lengths above u32::MAX cannot be represented; they never occur in practice.
            self.out
                .extend_from_slice(&(u32::try_from(n).unwrap_or(u32::MAX)).to_be_bytes());
        }
    }

    #[inline]
    pub(crate) fn array_len(&mut self, n: usize) {
        self.len_header(n, 0x90, 15, None, 0xdc, 0xdd);
    }

    #[inline]
    pub(crate) fn map_len(&mut self, n: usize) {
        self.len_header(n, 0x80, 15, None, 0xde, 0xdf);
    }

    #[inline]
    pub(crate) fn str(&mut self, s: &str) {
        self.str_bytes(s.as_bytes());
    }

    #[inline]
    pub(crate) fn str_bytes(&mut self, s: &[u8]) {
        self.len_header(s.len(), 0xa0, 31, Some(0xd9), 0xda, 0xdb);
        self.out.extend_from_slice(s);
    }

    pub(crate) fn bin(&mut self, b: &[u8]) {
        if b.len() <= usize::from(u8::MAX) {
            self.out.extend_from_slice(&[0xc4, b.len() as u8]);
        } else if b.len() <= usize::from(u16::MAX) {
            self.out.push(0xc5);
            self.out.extend_from_slice(&(b.len() as u16).to_be_bytes());
        } else {
            self.out.push(0xc6);
            self.out
                .extend_from_slice(&(u32::try_from(b.len()).unwrap_or(u32::MAX)).to_be_bytes());
        }
        self.out.extend_from_slice(b);
    }

    /// Writes an arbitrary [`rmpv::Value`] (used for `extra_keys`).
    pub(crate) fn value(&mut self, v: &rmpv::Value) {
        use rmpv::Value;
        match v {
            Value::Nil => self.nil(),
            Value::Boolean(b) => self.bool(*b),
            Value::Integer(i) => {
                if let Some(u) = i.as_u64() {
                    self.uint(u);
                } else if let Some(s) = i.as_i64() {
                    self.int(s);
                } else {
                    self.nil();
                }
            }
            Value::F32(f) => self.f32(*f),
            Value::F64(f) => self.f64(*f),
            Value::String(s) => self.str_bytes(s.as_bytes()),
            Value::Binary(b) => self.bin(b),
            Value::Array(a) => {
                self.array_len(a.len());
                for x in a {
                    self.value(x);
                }
            }
            Value::Map(m) => {
                self.map_len(m.len());
                for (k, x) in m {
                    self.value(k);
                    self.value(x);
                }
            }
            Value::Ext(t, data) => {
                let n = data.len();
                match n {
                    1 => self.out.push(0xd4),
                    2 => self.out.push(0xd5),
                    4 => self.out.push(0xd6),
                    8 => self.out.push(0xd7),
                    16 => self.out.push(0xd8),
                    _ if n <= usize::from(u8::MAX) => self.out.extend_from_slice(&[0xc7, n as u8]),
                    _ if n <= usize::from(u16::MAX) => {
                        self.out.push(0xc8);
                        self.out.extend_from_slice(&(n as u16).to_be_bytes());
                    }
                    _ => {
                        self.out.push(0xc9);
                        self.out.extend_from_slice(
                            &(u32::try_from(n).unwrap_or(u32::MAX)).to_be_bytes(),
                        );
                    }
                }
                self.out.push(*t as u8);
                self.out.extend_from_slice(data);
            }
        }
    }
}
