//! The start-time column: a sample's start timestamp (ST), when its source knows one.
//!
//! A counter's start time is when it began counting (OpenMetrics `_created`, OTLP
//! `StartTimeUnixNano`): a cumulative counter keeps one start time until it resets, a delta
//! series starts each sample at the previous sample's time. PromQL reads them to find resets
//! that values alone hide and to rate delta series (see `docs/promql.md`).
//!
//! Most series have no start times and their chunks carry no column. A chunk whose series has
//! them is the base chunk (XOR or histogram, unchanged) with the column after it, and its
//! encoding byte says so (`Encoding::XorWithStartTimes`, `Encoding::HistogramWithStartTimes`).
//! Layout: `[base chunk bytes, encoding byte replaced][column bits][base length u32 BE]`.
//!
//! The column holds one code per sample, in sample order (0 means "no start time", as in
//! Prometheus):
//! - `0`: the previous sample's start time (a cumulative counter; also "still none");
//! - `10`: the previous sample's timestamp (a delta series);
//! - `11` and a zig-zag varint of `t - st`: anything else.

use super::bstream::{BitReader, BitWriter};
use super::{ChunkError, Encoding, HEADER_BYTES};

/// Bytes of the trailer that gives the base chunk's length.
const TRAILER_BYTES: usize = 4;

/// Appends start times, one per sample of the chunk they belong to.
#[derive(Clone, Debug, Default)]
pub struct StartTimeWriter {
    w: BitWriter,
    prev_st: i64,
    prev_t: i64,
    n: u32,
}

impl StartTimeWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records the start time `st` (0 for none) of the sample at `t`.
    pub fn push(&mut self, t: i64, st: i64) {
        if st == self.prev_st {
            self.w.write_bit(false);
        } else if self.n > 0 && st == self.prev_t {
            self.w.write_bits(0b10, 2);
        } else {
            self.w.write_bits(0b11, 2);
            self.w.write_varint(t.wrapping_sub(st));
        }
        self.prev_st = st;
        self.prev_t = t;
        self.n += 1;
    }

    pub fn num_samples(&self) -> usize {
        self.n as usize
    }

    /// The column's bytes so far.
    pub fn bytes(&self) -> &[u8] {
        self.w.bytes()
    }
}

/// A chunk with start times: `base` (an XOR or histogram chunk) followed by `column`, which
/// holds one start time per sample of `base`.
pub fn join(base: &[u8], column: &StartTimeWriter) -> Vec<u8> {
    assert!(base.len() >= HEADER_BYTES, "a base chunk has a header");
    let samples = u16::from_be_bytes([base[1], base[2]]) as usize;
    assert_eq!(samples, column.num_samples(), "one start time per sample");
    let encoding = match Encoding::from_byte(base[0]) {
        Ok(Encoding::Xor) => Encoding::XorWithStartTimes,
        Ok(Encoding::Histogram) => Encoding::HistogramWithStartTimes,
        other => panic!("start times join an XOR or histogram chunk, not {other:?}"),
    };
    let col = column.bytes();
    let mut out = Vec::with_capacity(base.len() + col.len() + TRAILER_BYTES);
    out.push(encoding as u8);
    out.extend_from_slice(&base[1..]);
    out.extend_from_slice(col);
    out.extend_from_slice(&u32::try_from(base.len()).expect("chunks are small").to_be_bytes());
    out
}

/// Reads the start-time column of a chunk, one start time per sample as the samples are read.
#[derive(Clone, Copy, Debug)]
pub struct StartTimeReader {
    r: BitReader,
    /// Where the column ends (the trailer starts).
    end: usize,
    prev_st: i64,
    prev_t: i64,
    n: u32,
}

impl StartTimeReader {
    /// The column of `data`, a chunk with start times; checks the trailer.
    pub(super) fn new(data: &[u8]) -> Result<Self, ChunkError> {
        let bad = |why: &str| ChunkError::Corrupt(format!("start-time column: {why}"));
        let end = data.len().checked_sub(TRAILER_BYTES).ok_or_else(|| bad("no trailer"))?;
        let base = u32::from_be_bytes(data[end..].try_into().expect("4 bytes")) as usize;
        if base < HEADER_BYTES || base > end {
            return Err(bad(&format!("base chunk length {base} outside the chunk's {} bytes", data.len())));
        }
        Ok(StartTimeReader { r: BitReader::new(base), end, prev_st: 0, prev_t: 0, n: 0 })
    }

    /// The start time of the sample last read (0 before the first).
    pub(super) fn last(&self) -> i64 {
        self.prev_st
    }

    /// The start time of the next sample, which is at `t`; `None` when the column is cut short.
    #[inline]
    pub(super) fn next(&mut self, data: &[u8], t: i64) -> Option<i64> {
        let d = &data[..self.end];
        let word = self.r.peek(d);
        let st = if word >> 63 == 0 {
            self.r.consume(1);
            self.prev_st
        } else if (word >> 62) & 1 == 0 {
            self.r.consume(2);
            if self.n == 0 {
                return None;
            }
            self.prev_t
        } else {
            self.r.consume(2);
            t.wrapping_sub(self.r.read_varint(d)?)
        };
        if self.r.overran(d) {
            return None;
        }
        self.prev_st = st;
        self.prev_t = t;
        self.n += 1;
        Some(st)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunkenc::{ChunkIterator, XorAppender};
    use proptest::prelude::*;

    fn chunk_with(samples: &[(i64, i64, f64)]) -> Vec<u8> {
        let mut a = XorAppender::new();
        let mut col = StartTimeWriter::new();
        for &(t, st, v) in samples {
            a.append(t, v);
            col.push(t, st);
        }
        join(a.bytes(), &col)
    }

    fn read_back(data: &[u8]) -> Vec<(i64, i64, f64)> {
        let mut it = ChunkIterator::new(data).unwrap();
        let mut out = Vec::new();
        while let Some(s) = it.next_typed() {
            let crate::chunkenc::TypedValue::Float(v) = s.value else { panic!("float chunk") };
            out.push((s.t, s.st, v));
        }
        assert_eq!(it.err(), None);
        out
    }

    #[test]
    fn cumulative_delta_and_none_cost_few_bits() {
        // Cumulative: one start time; then delta: each starts at the previous sample.
        let mut samples: Vec<(i64, i64, f64)> = (1..=60).map(|i| (i * 15_000, 7, i as f64)).collect();
        samples.extend((61..=120).map(|i| (i * 15_000, (i - 1) * 15_000, 1.0)));
        let data = chunk_with(&samples);
        assert_eq!(read_back(&data), samples);
        let mut plain = XorAppender::new();
        samples.iter().for_each(|&(t, _, v)| plain.append(t, v));
        // Two varints, then about one bit or two per sample.
        let extra = data.len() - plain.bytes().len();
        assert!(extra <= 4 + 16 + 120 * 2 / 8 + 1, "column took {extra} bytes");
    }

    #[test]
    fn a_cut_column_is_an_error_not_a_guess() {
        let samples: Vec<(i64, i64, f64)> = (1..=20).map(|i| (i * 1000, i * 1000 - 3, 1.0)).collect();
        let data = chunk_with(&samples);
        // Drop the column's bytes but keep a trailer that points past them.
        let base = u32::from_be_bytes(data[data.len() - 4..].try_into().unwrap()) as usize;
        let mut cut = data[..base].to_vec();
        cut.extend_from_slice(&(base as u32).to_be_bytes());
        let mut it = ChunkIterator::new(&cut[..]).unwrap();
        while it.next_typed().is_some() {}
        assert!(it.err().is_some());
        // A trailer pointing outside the chunk is refused up front.
        let mut bad = data.clone();
        let n = bad.len();
        bad[n - 4..].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(ChunkIterator::new(&bad[..]), Err(ChunkError::Corrupt(_))));
    }

    proptest! {
        #[test]
        fn start_times_round_trip(
            steps in proptest::collection::vec((1i64..100_000, -3i64..4, any::<i64>()), 1..200),
        ) {
            let mut t = 1_000_000i64;
            let mut samples = Vec::new();
            let mut prev_t = 0;
            let mut prev_st = 0;
            for (dt, kind, raw) in steps {
                t += dt;
                let st = match kind {
                    -3 => 0,
                    -2 => prev_st,
                    -1 => prev_t,
                    0 => t,
                    _ => raw,
                };
                samples.push((t, st, dt as f64));
                prev_t = t;
                prev_st = st;
            }
            prop_assert_eq!(read_back(&chunk_with(&samples)), samples);
        }
    }
}
