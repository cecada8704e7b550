//! The XOR chunk: delta-of-delta timestamps and Gorilla XOR-compressed values.
//!
//! Scrape data is regular: timestamps advance by a near-constant interval and values often repeat
//! or change in few bits. Delta-of-delta makes a regular timestamp cost one bit; XOR against the
//! previous value makes a repeated value cost one bit and a slowly changing one a few dozen. The
//! exact bit layout is in `docs/format/chunks.md`. All arithmetic wraps, so every strictly
//! increasing i64 timestamp sequence (even one spanning the whole i64 range) round-trips, and
//! values are handled as raw bits, so every f64 bit pattern round-trips.

use super::bstream::{BitReader, BitWriter, PEEK_BITS};
use super::start_time::StartTimeReader;
use super::{ChunkError, Encoding, HEADER_BYTES, SAMPLES_MAX};
use strata_model::Sample;

/// Marks "no previous leading/trailing window yet".
pub(super) const NO_WINDOW: u8 = 0xff;
/// Leading-zero counts are stored in 5 bits.
const LEADING_ZEROS_MAX: u32 = 31;

/// `(prefix bits, prefix length, value bits)` of the delta-of-delta buckets, smallest first;
/// anything wider takes the `1111` prefix and 64 raw bits.
const DOD_BUCKETS: [(u64, u32, u32); 3] = [(0b10, 2, 14), (0b110, 3, 17), (0b1110, 4, 20)];

/// Appends samples to an XOR chunk. The bytes are a valid chunk after every append.
#[derive(Clone, Debug)]
pub struct XorAppender {
    w: BitWriter,
    count: u16,
    t: i64,
    delta: u64,
    v_bits: u64,
    leading: u8,
    trailing: u8,
}

impl Default for XorAppender {
    fn default() -> Self {
        Self::new()
    }
}

impl XorAppender {
    pub fn new() -> Self {
        Self::with_capacity(0)
    }

    /// A new chunk whose buffer is pre-sized to `bytes` (the head sizes it to a typical chunk).
    pub fn with_capacity(bytes: usize) -> Self {
        let mut v = Vec::with_capacity(bytes.max(HEADER_BYTES));
        v.extend_from_slice(&[Encoding::Xor as u8, 0, 0]);
        XorAppender {
            w: BitWriter::with_bytes(v),
            count: 0,
            t: 0,
            delta: 0,
            v_bits: 0,
            leading: NO_WINDOW,
            trailing: 0,
        }
    }

    pub fn num_samples(&self) -> usize {
        self.count as usize
    }

    /// The chunk bytes (header included); a complete chunk at any time.
    pub fn bytes(&self) -> &[u8] {
        self.w.bytes()
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.w.into_bytes()
    }

    pub fn is_full(&self) -> bool {
        self.count as usize >= SAMPLES_MAX
    }

    /// Last appended timestamp (meaningless when empty).
    pub fn last_t(&self) -> i64 {
        self.t
    }

    /// Last appended value (meaningless when empty).
    pub fn last_v(&self) -> f64 {
        f64::from_bits(self.v_bits)
    }

    /// Appends a sample. The caller guarantees `t` is greater than the last timestamp and the
    /// chunk is not full; both are invariants of the head, so they are asserted.
    pub fn append(&mut self, t: i64, v: f64) {
        assert!(!self.is_full(), "XOR chunk is full ({SAMPLES_MAX} samples)");
        debug_assert!(self.count == 0 || t > self.t, "timestamps must increase: {} after {}", t, self.t);
        let v_bits = v.to_bits();
        match self.count {
            0 => {
                self.w.write_varint(t);
                self.w.write_bits(v_bits, 64);
            }
            1 => {
                let delta = (t as u64).wrapping_sub(self.t as u64);
                self.w.write_uvarint(delta);
                write_xor(&mut self.w, self.v_bits, v_bits, &mut self.leading, &mut self.trailing);
                self.delta = delta;
            }
            _ => {
                let delta = (t as u64).wrapping_sub(self.t as u64);
                let dod = delta.wrapping_sub(self.delta) as i64;
                write_dod(&mut self.w, dod);
                write_xor(&mut self.w, self.v_bits, v_bits, &mut self.leading, &mut self.trailing);
                self.delta = delta;
            }
        }
        self.t = t;
        self.v_bits = v_bits;
        self.count += 1;
        let header = &mut self.w.bytes_mut()[1..HEADER_BYTES];
        header.copy_from_slice(&self.count.to_be_bytes());
    }
}

/// Writes a delta-of-delta: `0` for none, else a prefix and the smallest field it fits.
pub(super) fn write_dod(w: &mut BitWriter, dod: i64) {
    if dod == 0 {
        w.write_bit(false);
        return;
    }
    for (prefix, prefix_len, bits) in DOD_BUCKETS {
        let half = 1i64 << (bits - 1);
        if (-half..half).contains(&dod) {
            w.write_bits(prefix, prefix_len);
            w.write_bits(dod as u64, bits);
            return;
        }
    }
    w.write_bits(0b1111, 4);
    w.write_bits(dod as u64, 64);
}

/// Writes `v_bits` XORed with the previous value `prev_bits`: `0` when equal, else `1`, then
/// either `0` and the bits inside the previous leading/trailing-zero window, or `1`, a new
/// window (5 bits leading zeros, 6 bits significant length) and the significant bits.
/// `leading == NO_WINDOW` means no window yet.
pub(super) fn write_xor(w: &mut BitWriter, prev_bits: u64, v_bits: u64, leading: &mut u8, trailing: &mut u8) {
    let xor = v_bits ^ prev_bits;
    if xor == 0 {
        w.write_bit(false);
        return;
    }
    w.write_bit(true);
    let lz = xor.leading_zeros().min(LEADING_ZEROS_MAX);
    let tz = xor.trailing_zeros();
    if *leading != NO_WINDOW && lz >= *leading as u32 && tz >= *trailing as u32 {
        // Fits the previous window: reuse it.
        w.write_bit(false);
        let sig = 64 - *leading as u32 - *trailing as u32;
        w.write_bits(xor >> *trailing, sig);
        return;
    }
    *leading = lz as u8;
    *trailing = tz as u8;
    let sig = 64 - lz - tz;
    w.write_bit(true);
    w.write_bits(lz as u64, 5);
    // 64 significant bits do not fit in 6 bits; 0 stands for 64 (0 itself cannot occur).
    w.write_bits((sig & 63) as u64, 6);
    w.write_bits(xor >> tz, sig);
}

/// Reads a value written by [`write_xor`] into `bits`; false when the window header is
/// impossible (more than 64 bits), which only a corrupt chunk has.
#[inline(always)]
pub(super) fn read_xor(r: &mut BitReader, data: &[u8], bits: &mut u64, leading: &mut u8, trailing: &mut u8) -> bool {
    let word = r.peek(data);
    if word >> 63 == 0 {
        r.consume(1);
        return true;
    }
    if (word >> 62) & 1 == 1 {
        let lz = ((word << 2) >> 59) as u8;
        let mut sig = ((word << 7) >> 58) as u8;
        if sig == 0 {
            sig = 64;
        }
        if lz as u32 + sig as u32 > 64 {
            return false;
        }
        *leading = lz;
        *trailing = 64 - lz - sig;
        r.consume(13);
    } else {
        r.consume(2);
    }
    let sig = 64 - *leading as u32 - *trailing as u32;
    let v = r.read_bits_unchecked(data, sig);
    *bits ^= v << *trailing;
    true
}

/// Reads a delta-of-delta written by [`write_dod`].
#[inline(always)]
pub(super) fn read_dod(r: &mut BitReader, data: &[u8]) -> i64 {
    let word = r.peek(data);
    if word >> 63 == 0 {
        r.consume(1);
        return 0;
    }
    read_dod_prefixed(r, data, word)
}

/// Decodes a delta-of-delta whose prefix starts with `1`; `word` is the peeked register.
#[inline(always)]
fn read_dod_prefixed(r: &mut BitReader, data: &[u8], word: u64) -> i64 {
    let ones = (!word).leading_zeros().min(4) as usize;
    if ones == 4 {
        r.consume(4);
        return r.read_bits_unchecked(data, 64) as i64;
    }
    let bits = DOD_BUCKETS[ones - 1].2;
    let prefix_len = ones as u32 + 1;
    let raw = (word << prefix_len) >> (64 - bits);
    r.consume(prefix_len + bits);
    let shift = 64 - bits;
    ((raw << shift) as i64) >> shift
}

/// Decodes an XOR chunk. `B` owns or borrows the chunk bytes.
#[derive(Clone, Debug)]
pub struct XorIterator<B> {
    data: B,
    st: DecodeState,
    err: Option<ChunkError>,
    /// The start-time column, in a chunk that has one.
    start_times: Option<Box<StartTimeReader>>,
}

/// Decoder state, apart from the bytes so that it can borrow them mutably alongside.
#[derive(Clone, Debug)]
struct DecodeState {
    r: BitReader,
    total: u16,
    read: u16,
    t: i64,
    delta: u64,
    v_bits: u64,
    leading: u8,
    trailing: u8,
    /// A value header announced more than 64 bits: the chunk is corrupt.
    bad_window: bool,
    /// Samples of the current run of `0 0` (same interval, same value) not yet returned.
    run: u16,
}

impl<B: AsRef<[u8]>> XorIterator<B> {
    /// The caller has checked the encoding byte and that the header is present.
    pub(crate) fn new(data: B) -> Self {
        let d = data.as_ref();
        let total = u16::from_be_bytes([d[1], d[2]]);
        let st = DecodeState {
            r: BitReader::new(HEADER_BYTES),
            total,
            read: 0,
            t: 0,
            delta: 0,
            v_bits: 0,
            leading: 0,
            trailing: 0,
            bad_window: false,
            run: 0,
        };
        XorIterator { data, st, err: None, start_times: None }
    }

    /// Reads the chunk's start-time column along with its samples (see `start`).
    pub(super) fn with_start_times(mut self, column: StartTimeReader) -> Self {
        self.start_times = Some(Box::new(column));
        self
    }

    /// The start time of the sample `next` last returned; 0 when it has none.
    pub fn start(&self) -> i64 {
        self.start_times.as_ref().map_or(0, |c| c.last())
    }

    /// Reads the start time of the sample at `t` that `next` is about to return; `false` (and
    /// the error set) when the column is cut short. Callers check for a column first, so a
    /// chunk without one pays a test per sample, not a call.
    fn read_start(&mut self, t: i64) -> bool {
        let Some(col) = &mut self.start_times else { return true };
        match col.next(self.data.as_ref(), t) {
            Some(_) => true,
            None => {
                self.err = Some(ChunkError::Corrupt(format!("start-time column ends at sample {}", self.st.read)));
                false
            }
        }
    }

    pub fn num_samples(&self) -> usize {
        self.st.total as usize
    }

    /// The decoding error that ended iteration early, if any.
    pub fn err(&self) -> Option<&ChunkError> {
        self.err.as_ref()
    }

    #[inline]
    #[allow(clippy::should_implement_trait, reason = "mirrors SampleIterator::next; Iterator would hide seek")]
    pub fn next(&mut self) -> Option<Sample> {
        let st = &mut self.st;
        if st.run > 0 {
            // Inside a run of `0 0` samples (same interval, same value) already consumed.
            st.run -= 1;
            st.read += 1;
            st.t = (st.t as u64).wrapping_add(st.delta) as i64;
            let s = Sample { t: st.t, v: f64::from_bits(st.v_bits) };
            return (self.start_times.is_none() || self.read_start(s.t)).then_some(s);
        }
        if self.st.read >= self.st.total || self.err.is_some() {
            return None;
        }
        match self.st.decode_next(self.data.as_ref()) {
            Some(s) => {
                self.st.read += 1;
                (self.start_times.is_none() || self.read_start(s.t)).then_some(s)
            }
            None => {
                self.err =
                    Some(ChunkError::Truncated { sample: self.st.read as usize, samples: self.st.total as usize });
                None
            }
        }
    }

    /// Decodes every remaining sample into `out`. Faster than calling `next` in a loop: the
    /// decoder state lives in registers for the whole chunk. Start times are not read (a
    /// reader that wants them calls `next` and `start`).
    pub fn decode_into(&mut self, out: &mut Vec<Sample>) {
        out.reserve(self.st.total.saturating_sub(self.st.read) as usize);
        // Unbounded: the range checks fold away once inlined.
        self.decode_range_into(i64::MIN, i64::MAX, out);
    }

    /// Decodes the remaining samples into `out` with the decoder's state in registers (runs of
    /// repeated samples in a tight loop), writing only those with timestamps in `[mint, maxt]`
    /// and stopping at the first past `maxt` (decoded, not written). A range read of a head
    /// chunk wants its samples from some point to some other: calling `next` per sample kept the
    /// decoder's state in memory, not in registers, and was a quarter of a range query over
    /// 1000 head series scraped with jitter.
    #[inline]
    pub fn decode_range_into(&mut self, mint: i64, maxt: i64, out: &mut Vec<Sample>) {
        if self.err.is_some() {
            return;
        }
        let data = self.data.as_ref();
        let mut st = self.st.clone();
        'samples: while st.read < st.total {
            let Some(s) = st.decode_next(data) else {
                self.err = Some(ChunkError::Truncated { sample: st.read as usize, samples: st.total as usize });
                break;
            };
            st.read += 1;
            if s.t > maxt {
                break;
            }
            if s.t >= mint {
                out.push(s);
            }
            // A run of repeated samples, each one interval on.
            while st.run > 0 {
                st.run -= 1;
                st.read += 1;
                st.t = (st.t as u64).wrapping_add(st.delta) as i64;
                if st.t > maxt {
                    break 'samples;
                }
                if st.t >= mint {
                    out.push(Sample { t: st.t, v: s.v });
                }
            }
        }
        self.st = st;
    }

    /// Advances to the first sample with timestamp ≥ `t`.
    pub fn seek(&mut self, t: i64) -> Option<Sample> {
        loop {
            let s = self.next()?;
            if s.t >= t {
                return Some(s);
            }
        }
    }
}

impl DecodeState {
    #[inline(always)]
    fn decode_next(&mut self, data: &[u8]) -> Option<Sample> {
        if self.read >= 2 {
            if self.run > 0 {
                // Inside a run of `0 0` samples whose bits were already consumed (`decode_into`
                // comes here; `next` takes this path itself).
                self.run -= 1;
                self.t = (self.t as u64).wrapping_add(self.delta) as i64;
                return Some(Sample { t: self.t, v: f64::from_bits(self.v_bits) });
            }
            let word = self.r.peek(data);
            if word >> 62 == 0 {
                // The commonest sample of scrape data: regular interval, unchanged value (`0 0`).
                // Take the whole run of them visible in the register at once.
                let visible_pairs = (word.leading_zeros().min(PEEK_BITS) / 2) as u16;
                let run = visible_pairs.min(self.total - self.read).max(1);
                self.r.consume(2 * run as u32);
                self.run = run - 1;
                self.t = (self.t as u64).wrapping_add(self.delta) as i64;
            } else {
                let dod = if word >> 63 == 0 {
                    // Regular interval, changed value.
                    self.r.consume(1);
                    0
                } else {
                    read_dod_prefixed(&mut self.r, data, word)
                };
                self.delta = self.delta.wrapping_add(dod as u64);
                self.t = (self.t as u64).wrapping_add(self.delta) as i64;
                self.bad_window |=
                    !read_xor(&mut self.r, data, &mut self.v_bits, &mut self.leading, &mut self.trailing);
            }
        } else if self.read == 0 {
            self.t = self.r.read_varint(data)?;
            self.v_bits = self.r.read_bits(data, 64)?;
        } else {
            self.delta = self.r.read_uvarint(data)?;
            self.t = (self.t as u64).wrapping_add(self.delta) as i64;
            self.bad_window |= !read_xor(&mut self.r, data, &mut self.v_bits, &mut self.leading, &mut self.trailing);
        }
        if self.r.overran(data) || self.bad_window {
            return None;
        }
        Some(Sample { t: self.t, v: f64::from_bits(self.v_bits) })
    }
}

/// A place in an XOR chunk from which the rest of it can be written out as a chunk of its own
/// ([`write_tail`]): a reader that wants only the last samples of a long open head chunk
/// (an alerting rule's or a refreshing dashboard's window of a few minutes at the end of a
/// chunk of two hours) then copies and decodes those, not the chunk from its start. XOR
/// decodes only forwards, each sample from the one before, so the cut holds what the tail's
/// first two samples need: the first one whole, the second one's time and value and the value
/// window after it, and where the bits after it begin.
///
/// A cut stays valid for as long as the chunk only grows (an open chunk's written bits never
/// change); it must not be used on another chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XorCut {
    /// The index of the tail's first sample in the chunk (at least 1: a cut at 0 is the chunk).
    index: u16,
    t: i64,
    v_bits: u64,
    /// The sample after it, and the value window the decoder holds after that sample.
    next_t: i64,
    next_v_bits: u64,
    leading: u8,
    trailing: u8,
    /// The bit (from the chunk's first byte) where the sample after `next_t`'s begins.
    bit: u32,
}

impl XorCut {
    /// The time of the tail's first sample: the tail holds every sample at or after it.
    pub fn t(&self) -> i64 {
        self.t
    }

    /// The index of the tail's first sample in the chunk.
    pub fn index(&self) -> usize {
        self.index as usize
    }
}

/// The cut at the last sample at or before `t` that has a sample after it, found by decoding
/// the XOR chunk `data` (header included, no start-time column) from `from` (a cut of the same
/// chunk) or from its start. `None` when that sample is the chunk's first (there is nothing to
/// cut off), is not past `from`, or the chunk cannot be decoded that far (a reader of the whole
/// chunk reports that).
pub fn find_cut(data: &[u8], from: Option<&XorCut>, t: i64) -> Option<XorCut> {
    if data.len() < HEADER_BYTES || data[0] != Encoding::Xor as u8 {
        return None;
    }
    let total = u16::from_be_bytes([data[1], data[2]]);
    if total < 2 {
        return None;
    }
    // The decoder's state after the sample it last returned, and that sample.
    let (mut st, mut prev) = match from {
        Some(c) => {
            let mut r = BitReader::new(0);
            r.skip(data, c.bit as usize);
            let st = DecodeState {
                r,
                total,
                read: c.index + 2,
                t: c.next_t,
                delta: (c.next_t as u64).wrapping_sub(c.t as u64),
                v_bits: c.next_v_bits,
                leading: c.leading,
                trailing: c.trailing,
                bad_window: false,
                run: 0,
            };
            (st, Sample { t: c.next_t, v: f64::from_bits(c.next_v_bits) })
        }
        None => {
            let mut st = XorIterator::new(data).st;
            let first = st.decode_next(data)?;
            st.read = 1;
            (st, first)
        }
    };
    let mut found = None;
    while st.read < st.total && prev.t <= t {
        let s = st.decode_next(data)?;
        st.read += 1;
        // `prev` (at index read - 2) is at or before `t` and has `s` after it.
        let index = st.read - 2;
        if index > from.map_or(0, |c| c.index) {
            found = Some(XorCut {
                index,
                t: prev.t,
                v_bits: prev.v.to_bits(),
                next_t: s.t,
                next_v_bits: s.v.to_bits(),
                leading: st.leading,
                trailing: st.trailing,
                // Inside a run of repeated samples the decoder has consumed the whole run's
                // bits (two per sample) already.
                bit: (st.r.pos() - 2 * st.run as usize) as u32,
            });
        }
        prev = s;
    }
    found
}

/// Appends to `out` the chunk of the one sample `(t, v)`, as `XorAppender` writes it.
pub fn write_one(t: i64, v: f64, out: &mut Vec<u8>) {
    let mut w = BitWriter::with_bytes(std::mem::take(out));
    w.write_byte(Encoding::Xor as u8);
    w.write_bits(1, 16);
    w.write_varint(t);
    w.write_bits(v.to_bits(), 64);
    *out = w.into_bytes();
}

/// Appends to `out` the XOR chunk of `data`'s samples from `cut` on (`data` as `find_cut`
/// took it, or grown since): its first sample written whole, the second as a chunk's second
/// (a plain interval) with an explicit value window, and the rest of `data`'s bits as they
/// are, which then decode exactly as in `data`.
pub fn write_tail(data: &[u8], cut: &XorCut, out: &mut Vec<u8>) {
    let total = u16::from_be_bytes([data[1], data[2]]);
    assert!(cut.index >= 1 && cut.index + 1 < total, "a cut of this chunk: {} of {total} samples", cut.index);
    let mut w = BitWriter::with_bytes(std::mem::take(out));
    w.write_byte(Encoding::Xor as u8);
    w.write_bits((total - cut.index) as u64, 16);
    w.write_varint(cut.t);
    w.write_bits(cut.v_bits, 64);
    w.write_uvarint((cut.next_t as u64).wrapping_sub(cut.t as u64));
    let xor = cut.v_bits ^ cut.next_v_bits;
    if xor == 0 && cut.leading == 0 && cut.trailing == 0 {
        // The decoder's window starts at (0, 0): an unchanged value keeps it so.
        w.write_bit(false);
    } else {
        // The window the decoder holds in `data` after this sample, set explicitly even when
        // the value did not change there: the samples after it may reuse it.
        let sig = 64 - cut.leading as u32 - cut.trailing as u32;
        debug_assert!(
            xor == 0 || (xor.leading_zeros() >= cut.leading as u32 && xor.trailing_zeros() >= cut.trailing as u32)
        );
        w.write_bits(0b11, 2);
        w.write_bits(cut.leading as u64, 5);
        w.write_bits((sig & 63) as u64, 6);
        w.write_bits(xor >> cut.trailing, sig);
    }
    w.write_bits_of(data, cut.bit as usize);
    *out = w.into_bytes();
}
