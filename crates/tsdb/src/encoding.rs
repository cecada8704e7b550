//! Byte-level helpers shared by the on-disk formats: varints and a bounds-checked decoder whose
//! errors say what was being read and where.

/// Unsigned LEB128.
pub fn put_uvarint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

/// Zig-zag LEB128.
pub fn put_varint(buf: &mut Vec<u8>, v: i64) {
    put_uvarint(buf, zigzag(v));
}

/// Zig-zag: small magnitudes of either sign to small unsigned numbers (0, -1, 1, -2 → 0, 1, 2, 3).
#[inline]
pub fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

/// The inverse of `zigzag`.
#[inline]
pub fn unzigzag(u: u64) -> i64 {
    ((u >> 1) as i64) ^ -((u & 1) as i64)
}

/// Greatest common divisor (`gcd(0, b) = b`): the unit a column of differences is written in.
pub fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Length-prefixed (uvarint) bytes.
pub fn put_bytes(buf: &mut Vec<u8>, b: &[u8]) {
    put_uvarint(buf, b.len() as u64);
    buf.extend_from_slice(b);
}

/// Reads a uvarint at `*pos` from bytes this process wrote itself (in-memory postings and
/// label ids), so they are known to be well formed; advances `pos`.
#[inline]
pub fn read_uvarint_trusted(data: &[u8], pos: &mut usize) -> u64 {
    let mut v = 0u64;
    let mut shift = 0;
    loop {
        let b = data[*pos];
        *pos += 1;
        v |= ((b & 0x7f) as u64) << shift;
        if b < 0x80 {
            return v;
        }
        shift += 7;
    }
}

/// A decoding failure: what was being read, at which byte offset of the buffer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} at byte {offset}: {problem}")]
pub struct DecodeError {
    pub what: &'static str,
    pub offset: usize,
    pub problem: &'static str,
}

/// Reads from a byte slice, never past its end.
#[derive(Debug)]
pub struct Decoder<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Decoder<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Decoder { data, pos: 0 }
    }

    pub fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }

    pub fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }

    pub fn offset(&self) -> usize {
        self.pos
    }

    fn err(&self, what: &'static str, problem: &'static str) -> DecodeError {
        DecodeError { what, offset: self.pos, problem }
    }

    pub fn bytes(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        if self.remaining() < n {
            return Err(self.err(what, "unexpected end of data"));
        }
        let b = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(b)
    }

    pub fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.bytes(1, what)?[0])
    }

    pub fn u64_le(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.bytes(8, what)?.try_into().expect("8 bytes")))
    }

    pub fn uvarint(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8(what)?;
            if shift == 63 && b > 1 {
                return Err(self.err(what, "varint overflows 64 bits"));
            }
            v |= ((b & 0x7f) as u64) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(self.err(what, "varint longer than 10 bytes"))
    }

    pub fn varint(&mut self, what: &'static str) -> Result<i64, DecodeError> {
        Ok(unzigzag(self.uvarint(what)?))
    }

    /// Length-prefixed UTF-8 text.
    pub fn str(&mut self, what: &'static str) -> Result<&'a str, DecodeError> {
        let n = self.uvarint(what)?;
        let n = usize::try_from(n).map_err(|_| self.err(what, "length does not fit in memory"))?;
        let b = self.bytes(n, what)?;
        std::str::from_utf8(b).map_err(|_| self.err(what, "invalid UTF-8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn varints_round_trip(v in any::<i64>(), u in any::<u64>()) {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            put_uvarint(&mut b, u);
            let mut d = Decoder::new(&b);
            prop_assert_eq!(d.varint("v").unwrap(), v);
            prop_assert_eq!(d.uvarint("u").unwrap(), u);
            prop_assert!(d.is_empty());
        }
    }

    #[test]
    fn errors_name_what_and_where() {
        let mut d = Decoder::new(&[0x80, 0x80]);
        let e = d.uvarint("series ref").unwrap_err();
        assert_eq!(e.to_string(), "series ref at byte 2: unexpected end of data");
        let mut d = Decoder::new(&[1, 0xff]);
        assert_eq!(d.str("label name").unwrap_err().problem, "invalid UTF-8");
    }
}
