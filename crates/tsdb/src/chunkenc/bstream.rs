//! Bit streams, most significant bit first, as the XOR chunk needs them.
//!
//! The writer appends into a byte vector that is always a valid prefix of the stream (the head
//! hands out copies of an open chunk at any moment). The reader keeps a 64-bit register so that
//! the common one-bit reads of the XOR decoder are a shift and a compare.

/// Appends bits to a byte vector.
#[derive(Clone, Debug, Default)]
pub struct BitWriter {
    bytes: Vec<u8>,
    /// Free bits in the last byte (0 when the last byte is full or there is none).
    free_bits: u8,
}

impl BitWriter {
    pub fn with_bytes(bytes: Vec<u8>) -> Self {
        BitWriter { bytes, free_bits: 0 }
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    pub fn bytes_mut(&mut self) -> &mut Vec<u8> {
        &mut self.bytes
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }

    /// Appends a zero byte, growing by half (not doubling): the head keeps millions of open
    /// chunks, and their spare capacity is pure overhead.
    #[inline]
    fn push_zero(&mut self) {
        if self.bytes.len() == self.bytes.capacity() {
            self.bytes.reserve_exact((self.bytes.capacity() / 2).max(16));
        }
        self.bytes.push(0);
    }

    pub fn write_bit(&mut self, bit: bool) {
        if self.free_bits == 0 {
            self.push_zero();
            self.free_bits = 8;
        }
        self.free_bits -= 1;
        if bit {
            *self.bytes.last_mut().expect("a byte was just ensured") |= 1 << self.free_bits;
        }
    }

    /// Writes the low `n` bits of `v`, most significant first. `n` is at most 64.
    pub fn write_bits(&mut self, v: u64, n: u32) {
        debug_assert!(n <= 64);
        let mut n = n;
        while n > 0 {
            if self.free_bits == 0 {
                self.push_zero();
                self.free_bits = 8;
            }
            let take = n.min(self.free_bits as u32);
            let chunk = ((v >> (n - take)) & ((1u64 << take) - 1)) as u8;
            self.free_bits -= take as u8;
            *self.bytes.last_mut().expect("a byte was just ensured") |= chunk << self.free_bits;
            n -= take;
        }
    }

    /// Writes the bits of `data` from bit `from` (most significant first) to its end: a byte
    /// at a time, each put together from the two source bytes it straddles, once the last
    /// byte written is full.
    pub fn write_bits_of(&mut self, data: &[u8], from: usize) {
        let end = data.len() * 8;
        if from >= end {
            return;
        }
        let mut bit = from;
        if self.free_bits > 0 {
            let n = (self.free_bits as usize).min(end - bit) as u32;
            let mut r = BitReader::new(0);
            r.skip(data, bit);
            self.write_bits(r.read_bits_unchecked(data, n), n);
            bit += n as usize;
        }
        // Byte-aligned now (or done).
        let (first, shift) = (bit / 8, (bit % 8) as u32);
        if shift == 0 {
            self.bytes.extend_from_slice(&data[first.min(data.len())..]);
            return;
        }
        // The bits left end with data's last byte: every output byte but the last takes the
        // low bits of one byte and the high bits of the next.
        let rest = &data[first..];
        self.bytes.reserve(rest.len());
        self.bytes.extend(rest.windows(2).map(|w| (w[0] << shift) | (w[1] >> (8 - shift))));
        let last = rest[rest.len() - 1] << shift;
        self.bytes.push(last);
        self.free_bits = shift as u8;
    }

    /// Writes a whole byte; the fast path when the stream is byte-aligned.
    pub fn write_byte(&mut self, b: u8) {
        if self.free_bits == 0 {
            self.push_zero();
            *self.bytes.last_mut().expect("a byte was just pushed") = b;
        } else {
            self.write_bits(b as u64, 8);
        }
    }

    /// Unsigned LEB128.
    pub fn write_uvarint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.write_byte((v as u8) | 0x80);
            v >>= 7;
        }
        self.write_byte(v as u8);
    }

    /// Zig-zag signed LEB128.
    pub fn write_varint(&mut self, v: i64) {
        self.write_uvarint(crate::encoding::zigzag(v));
    }
}

/// Reads bits from a byte slice through a 64-bit register.
///
/// The register is refilled with one unaligned 8-byte load whenever fewer than 57 bits are left,
/// so decoding a typical sample (a few bits) is register arithmetic with no dependent memory
/// load. Bits past the end of the data read as zero; callers detect that with `overran`.
#[derive(Clone, Copy, Debug)]
pub struct BitReader {
    /// Unread bits, left-aligned; only the top `valid` are meaningful, the rest are zero.
    buf: u64,
    valid: u32,
    /// Next byte of the data to load into the register.
    next_byte: usize,
}

/// Bits guaranteed in the register after a `peek`.
pub const PEEK_BITS: u32 = 57;

impl BitReader {
    /// Starts reading at byte `start`.
    pub fn new(start: usize) -> Self {
        BitReader { buf: 0, valid: 0, next_byte: start }
    }

    /// Bit position of the next unread bit.
    #[inline(always)]
    pub fn pos(&self) -> usize {
        self.next_byte * 8 - self.valid as usize
    }

    /// The 8 bytes from `byte` as a big-endian word, zero past the end of `data`.
    #[inline(always)]
    fn load(data: &[u8], byte: usize) -> u64 {
        match data.get(byte..byte + 8) {
            Some(w) => u64::from_be_bytes(w.try_into().expect("8 bytes")),
            None => Self::load_tail(data, byte),
        }
    }

    /// `load` within 8 bytes of the end. The last 8 bytes of `data` shifted past those before
    /// `byte`, rather than a copy into a zeroed word: a small column (a rollup chunk of a few
    /// buckets) is read near its end most of the time, and the copy was a `memcpy` call each.
    #[inline(never)]
    fn load_tail(data: &[u8], byte: usize) -> u64 {
        let len = data.len();
        if byte >= len {
            return 0;
        }
        if len >= 8 {
            // `byte` lies in the last 8 bytes (`load` found no 8 from it): shift out the 1 to 7
            // before it.
            let last = u64::from_be_bytes(data[len - 8..].try_into().expect("8 bytes"));
            last << (8 * (byte + 8 - len))
        } else {
            data[byte..].iter().enumerate().fold(0, |w, (i, &b)| w | (b as u64) << (56 - 8 * i))
        }
    }

    #[inline(always)]
    fn refill(&mut self, data: &[u8]) {
        let word = Self::load(data, self.next_byte);
        if self.valid == 0 {
            self.buf = word;
            self.valid = 64;
            self.next_byte += 8;
        } else {
            let take_bits = (64 - self.valid) / 8 * 8;
            // `take_bits` is at least 8 here because callers refill only below PEEK_BITS.
            self.buf |= (word >> (64 - take_bits)) << (64 - take_bits - self.valid);
            self.valid += take_bits;
            self.next_byte += (take_bits / 8) as usize;
        }
    }

    /// The register, holding at least `PEEK_BITS` valid bits (zeros past the end of the data).
    #[inline(always)]
    pub fn peek(&mut self, data: &[u8]) -> u64 {
        if self.valid < PEEK_BITS {
            self.refill(data);
        }
        self.buf
    }

    /// Drops `n` bits (at most `PEEK_BITS`) that a `peek` made available.
    #[inline(always)]
    pub fn consume(&mut self, n: u32) {
        debug_assert!(n <= self.valid);
        self.buf = if n >= 64 { 0 } else { self.buf << n };
        self.valid -= n;
    }

    /// Moves past the next `n` bits without reading them.
    pub fn skip(&mut self, data: &[u8], n: usize) {
        let target = self.pos() + n;
        *self = BitReader::new(target / 8);
        let rest = (target % 8) as u32;
        if rest > 0 {
            self.peek(data);
            self.consume(rest);
        }
    }

    /// Whether reading went past the end of `data`.
    #[inline(always)]
    pub fn overran(&self, data: &[u8]) -> bool {
        self.pos() > data.len() * 8
    }

    /// Reads `n` bits (at most 64) as the low bits of the result; `None` past the end.
    #[inline]
    pub fn read_bits(&mut self, data: &[u8], n: u32) -> Option<u64> {
        let v = self.read_bits_unchecked(data, n);
        if self.overran(data) {
            return None;
        }
        Some(v)
    }

    /// Like `read_bits` without the end check (callers check `overran` once per sample).
    #[inline(always)]
    pub fn read_bits_unchecked(&mut self, data: &[u8], n: u32) -> u64 {
        debug_assert!(n <= 64);
        if n == 0 {
            return 0;
        }
        if n <= PEEK_BITS {
            let v = self.peek(data) >> (64 - n);
            self.consume(n);
            v
        } else {
            let hi = self.peek(data) >> 32;
            self.consume(32);
            let lo = self.peek(data) >> (64 - (n - 32));
            self.consume(n - 32);
            (hi << (n - 32)) | lo
        }
    }

    #[inline]
    pub fn read_bit(&mut self, data: &[u8]) -> Option<bool> {
        self.read_bits(data, 1).map(|b| b == 1)
    }

    #[inline]
    pub fn read_byte(&mut self, data: &[u8]) -> Option<u8> {
        self.read_bits(data, 8).map(|b| b as u8)
    }

    /// An unsigned LEB128 varint (at most 10 bytes). A one-byte varint (most chunk header
    /// fields: orders, factors, exception counts) is read inline; a longer one by
    /// `read_long_uvarint`.
    #[inline(always)]
    pub fn read_uvarint(&mut self, data: &[u8]) -> Option<u64> {
        let reg = self.peek(data);
        if reg >> 63 == 0 {
            self.consume(8);
            return (!self.overran(data)).then_some(reg >> 56);
        }
        self.read_long_uvarint(data, reg)
    }

    /// `read_uvarint` of a varint of two bytes or more, `reg` the register peeked at it: up to
    /// 7 bytes are decoded from that one look.
    #[inline(never)]
    fn read_long_uvarint(&mut self, data: &[u8], reg: u64) -> Option<u64> {
        let mut v = 0u64;
        for i in 0..7u32 {
            let b = (reg >> (56 - 8 * i)) as u8;
            v |= ((b & 0x7f) as u64) << (7 * i);
            if b < 0x80 {
                self.consume(8 * (i + 1));
                return (!self.overran(data)).then_some(v);
            }
        }
        self.consume(56);
        for shift in (49..64).step_by(7) {
            let b = self.read_byte(data)?;
            v |= ((b & 0x7f) as u64) << shift;
            if b < 0x80 {
                return Some(v);
            }
        }
        None
    }

    #[inline]
    pub fn read_varint(&mut self, data: &[u8]) -> Option<i64> {
        let u = self.read_uvarint(data)?;
        Some(crate::encoding::unzigzag(u))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn bits_round_trip(ops in prop::collection::vec((any::<u64>(), 0u32..=64), 0..200)) {
            let mut w = BitWriter::default();
            for &(v, n) in &ops {
                w.write_bits(v, n);
            }
            let data = w.into_bytes();
            let mut r = BitReader::new(0);
            for &(v, n) in &ops {
                let mask = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
                prop_assert_eq!(r.read_bits(&data, n), Some(v & mask));
            }
        }

        /// Copied bits are the source's, after any number of bits already written, from any
        /// bit on: the same as writing them one by one.
        #[test]
        fn bits_of_are_copied(prefix in (any::<u64>(), 0u32..=64), data in prop::collection::vec(any::<u8>(), 0..40), from in 0usize..330) {
            let mut fast = BitWriter::default();
            fast.write_bits(prefix.0, prefix.1);
            let mut slow = fast.clone();
            fast.write_bits_of(&data, from);
            let mut r = BitReader::new(0);
            for i in 0..data.len() * 8 {
                let bit = r.read_bits(&data, 1) == Some(1);
                if i >= from {
                    slow.write_bit(bit);
                }
            }
            prop_assert_eq!(fast.bytes(), slow.bytes());
            prop_assert_eq!(fast.free_bits, slow.free_bits);
        }

        /// Varints of every length: any bits (mostly ten bytes), small values and single bits.
        #[test]
        fn varints_round_trip(
            vs in prop::collection::vec(prop_oneof![any::<i64>(), -100_000i64..100_000, (0u32..64).prop_map(|s| 1i64 << s)], 0..50),
            pad in 0u32..8,
        ) {
            let mut w = BitWriter::default();
            w.write_bits(0, pad);
            for &v in &vs { w.write_varint(v); w.write_uvarint(v as u64); }
            let data = w.into_bytes();
            let mut r = BitReader::new(0);
            r.read_bits(&data, pad).unwrap();
            for &v in &vs {
                prop_assert_eq!(r.read_varint(&data), Some(v));
                prop_assert_eq!(r.read_uvarint(&data), Some(v as u64));
            }
        }
    }

    #[test]
    fn reading_past_the_end_is_none() {
        let data = [0b1010_0000u8];
        let mut r = BitReader::new(0);
        assert_eq!(r.read_bits(&data, 3), Some(0b101));
        assert_eq!(r.read_bits(&data, 5), Some(0));
        assert_eq!(r.read_bit(&data), None);
        assert_eq!(BitReader::new(0).read_bits(&data, 9), None);
    }

    /// Words loaded near and past the end are the bytes there followed by zeros, for data
    /// shorter and longer than a word.
    #[test]
    fn words_near_the_end_are_zero_padded() {
        let bytes: Vec<u8> = (1..=20u8).map(|b| b.wrapping_mul(37) | 1).collect();
        for len in 0..=bytes.len() {
            let data = &bytes[..len];
            for byte in 0..len + 10 {
                let mut padded = [0u8; 8];
                for (i, b) in data.iter().skip(byte).take(8).enumerate() {
                    padded[i] = *b;
                }
                assert_eq!(BitReader::load(data, byte), u64::from_be_bytes(padded), "len {len}, byte {byte}");
            }
        }
    }
}
