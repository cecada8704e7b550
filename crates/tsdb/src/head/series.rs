//! One series in the head: its label symbols, its closed chunks and the chunk being appended to.
//!
//! Kept compact on purpose (the head holds millions): labels are symbol ids, closed chunks are
//! exact-size shared byte slices with their time range, and the open chunk's appender doubles as
//! the record of the last sample (no separate copy).

use std::sync::Arc;

use parking_lot::Mutex;
use strata_model::{Sample, SeriesRef};

use super::symbols::PackedLabels;
use crate::chunkenc::{ChunkIterator, XorAppender, CHUNK_BYTES_TARGET, SAMPLES_PER_CHUNK};

/// Initial buffer of a new open chunk: enough for a few dozen regular samples; it doubles from
/// there. Closed chunks are then copied to their exact size.
const OPEN_CHUNK_INITIAL_BYTES: usize = 32;

/// An immutable chunk and the time range it covers (inclusive).
#[derive(Clone, Debug)]
pub struct ChunkMeta {
    pub mint: i64,
    pub maxt: i64,
    pub data: Arc<[u8]>,
}

#[derive(Debug, Default)]
pub struct SeriesState {
    closed: Vec<ChunkMeta>,
    open: Option<XorAppender>,
    open_mint: i64,
    /// The open chunk is cut at the first sample at or after this time: the end of its block
    /// range at first, then (once the chunk is a quarter full) an estimate that spreads the
    /// range's remaining samples evenly over chunks of about `SAMPLES_PER_CHUNK`.
    next_at: i64,
    /// Set when head truncation removed the series from the head's indexes: a handle kept
    /// elsewhere (a scrape cache) must not append to it any more.
    pub(crate) removed: bool,
}

/// Why the head refused a sample. Each maps to a clear message for the client.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SampleError {
    #[error("out of order sample: timestamp {t} is before the series' latest {latest}")]
    OutOfOrder { t: i64, latest: i64 },
    #[error("duplicate sample for timestamp {t} with a different value")]
    Duplicate { t: i64 },
    #[error("sample timestamp {t} is too old: the head accepts samples from {min_t}")]
    TooOld { t: i64, min_t: i64 },
}

/// What appending a valid sample did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    /// Stored.
    Sample { chunk_created: bool },
    /// The series already holds this exact sample; nothing stored.
    Same,
}

#[derive(Debug)]
pub struct MemSeries {
    pub series_ref: SeriesRef,
    /// Label symbol ids, packed; sorted by name.
    pub labels: PackedLabels,
    pub state: Mutex<SeriesState>,
}

impl MemSeries {
    pub fn new(series_ref: SeriesRef, labels: PackedLabels) -> Self {
        MemSeries { series_ref, labels, state: Mutex::new(SeriesState::default()) }
    }
}

impl SeriesState {
    /// Timestamp of the newest sample, if any.
    pub fn max_time(&self) -> Option<i64> {
        match &self.open {
            Some(a) if a.num_samples() > 0 => Some(a.last_t()),
            _ => self.closed.last().map(|c| c.maxt),
        }
    }

    pub fn min_time(&self) -> Option<i64> {
        self.closed
            .first()
            .map(|c| c.mint)
            .or_else(|| self.open.as_ref().filter(|a| a.num_samples() > 0).map(|_| self.open_mint))
    }

    fn last_value_bits(&self) -> Option<u64> {
        match &self.open {
            Some(a) if a.num_samples() > 0 => Some(a.last_v().to_bits()),
            _ => None,
        }
    }

    /// Whether `(t, v)` may be appended now.
    pub fn appendable(&self, t: i64, v: f64) -> Result<Appended, SampleError> {
        let Some(latest) = self.max_time() else { return Ok(Appended::Sample { chunk_created: true }) };
        if t > latest {
            return Ok(Appended::Sample { chunk_created: false });
        }
        if t < latest {
            return Err(SampleError::OutOfOrder { t, latest });
        }
        // Same timestamp: fine if it is the very same value (a retried write), else an error.
        match self.last_value_bits() {
            Some(bits) if bits == v.to_bits() => Ok(Appended::Same),
            _ => Err(SampleError::Duplicate { t }),
        }
    }

    /// Validates and appends. `chunk_range` aligns chunk boundaries with block boundaries so
    /// that no chunk ever spans two blocks.
    pub fn append(&mut self, t: i64, v: f64, chunk_range: i64) -> Result<Appended, SampleError> {
        if self.appendable(t, v)? == Appended::Same {
            return Ok(Appended::Same);
        }
        let cut = match &self.open {
            None => true,
            Some(a) => {
                let n = a.num_samples();
                if n == SAMPLES_PER_CHUNK / 4 {
                    self.next_at = chunk_end_estimate(self.open_mint, a.last_t(), self.next_at);
                }
                // Twice the target: the rate rose since the estimate; cut, the next chunk
                // estimates again.
                n >= 2 * SAMPLES_PER_CHUNK || a.bytes().len() >= CHUNK_BYTES_TARGET || t >= self.next_at
            }
        };
        if cut {
            self.close_open_chunk();
            // Size the new chunk like the last one: regular series produce similar chunks.
            let bytes = self.closed.last().map_or(OPEN_CHUNK_INITIAL_BYTES, |c| c.data.len() + 8);
            self.open = Some(XorAppender::with_capacity(bytes));
            self.open_mint = t;
            self.next_at = chunk_range_end(t, chunk_range);
        }
        self.open.as_mut().expect("an open chunk was just ensured").append(t, v);
        Ok(Appended::Sample { chunk_created: cut })
    }

    fn close_open_chunk(&mut self) {
        if let Some(a) = self.open.take() {
            if a.num_samples() > 0 {
                let maxt = a.last_t();
                self.closed.push(ChunkMeta { mint: self.open_mint, maxt, data: Arc::from(a.bytes()) });
            }
        }
    }

    /// Whether any sample may lie in `[mint, maxt]` (a chunk overlaps it).
    pub fn overlaps(&self, mint: i64, maxt: i64) -> bool {
        self.closed.iter().any(|c| c.maxt >= mint && c.mint <= maxt)
            || self.open.as_ref().is_some_and(|a| a.num_samples() > 0 && a.last_t() >= mint && self.open_mint <= maxt)
    }

    /// Chunks overlapping `[mint, maxt]`, oldest first; the open chunk is copied.
    pub fn chunks(&self, mint: i64, maxt: i64) -> Vec<ChunkMeta> {
        let mut out: Vec<ChunkMeta> =
            self.closed.iter().filter(|c| c.maxt >= mint && c.mint <= maxt).cloned().collect();
        if let Some(a) = &self.open {
            if a.num_samples() > 0 && a.last_t() >= mint && self.open_mint <= maxt {
                out.push(ChunkMeta { mint: self.open_mint, maxt: a.last_t(), data: Arc::from(a.bytes()) });
            }
        }
        out
    }

    /// Drops chunks that end before `mint`; returns how many.
    pub fn truncate_before(&mut self, mint: i64) -> usize {
        let before = self.num_chunks();
        self.closed.retain(|c| c.maxt >= mint);
        if self.open.as_ref().is_some_and(|a| a.num_samples() > 0 && a.last_t() < mint) {
            self.open = None;
        }
        before - self.num_chunks()
    }

    pub fn num_chunks(&self) -> usize {
        self.closed.len() + usize::from(self.open.as_ref().is_some_and(|a| a.num_samples() > 0))
    }

    /// Merges samples that arrived out of order during WAL replay. They were all accepted live
    /// (concurrent commits to one series may reach the log in another order than they reached
    /// memory), so the series is rebuilt from the union, sorted, with exact duplicates dropped.
    pub fn merge_late(&mut self, late: &mut Vec<Sample>, chunk_range: i64) {
        let mut all: Vec<Sample> = Vec::new();
        for c in self.chunks(i64::MIN, i64::MAX) {
            let mut it = ChunkIterator::new(&c.data[..]).expect("head chunks are valid");
            while let Some(s) = it.next() {
                all.push(s);
            }
        }
        all.append(late);
        all.sort_by_key(|s| s.t);
        all.dedup_by(|b, a| a.t == b.t);
        *self = SeriesState::default();
        for s in all {
            self.append(s.t, s.v, chunk_range).expect("sorted, deduplicated samples always append");
        }
    }
}

/// When a chunk that started at `start` and reached `cur` with a quarter of its target samples
/// should end so that the rest of its range, up to `range_end`, fills chunks of equal size (the
/// rule Prometheus uses). A range's last, partial chunk thus never ends up tiny: fewer chunk
/// headers and first samples to store.
fn chunk_end_estimate(start: i64, cur: i64, range_end: i64) -> i64 {
    let span = cur.saturating_sub(start).saturating_add(1).saturating_mul(4).max(1);
    let n = range_end.saturating_sub(start) / span;
    if n <= 1 {
        range_end
    } else {
        start + range_end.saturating_sub(start) / n
    }
}

/// End (exclusive) of the chunk range that contains `t`.
fn chunk_range_end(t: i64, range: i64) -> i64 {
    t.div_euclid(range).saturating_add(1).saturating_mul(range)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RANGE: i64 = 2 * 3600 * 1000;

    #[test]
    fn typed_errors_for_bad_samples() {
        let mut s = SeriesState::default();
        s.append(100, 1.0, RANGE).unwrap();
        assert_eq!(s.append(50, 1.0, RANGE), Err(SampleError::OutOfOrder { t: 50, latest: 100 }));
        assert_eq!(s.append(100, 2.0, RANGE), Err(SampleError::Duplicate { t: 100 }));
        assert_eq!(s.append(100, 1.0, RANGE), Ok(Appended::Same));
        // NaN compares by bits: the same NaN is a retry, not a conflict.
        s.append(200, f64::NAN, RANGE).unwrap();
        assert_eq!(s.append(200, f64::NAN, RANGE), Ok(Appended::Same));
    }

    #[test]
    fn chunks_are_cut_by_count_and_range() {
        let mut s = SeriesState::default();
        for i in 0..250 {
            s.append(i * 1000, i as f64, RANGE).unwrap();
        }
        assert_eq!(s.num_chunks(), 3);
        let mut s = SeriesState::default();
        s.append(RANGE - 1, 0.0, RANGE).unwrap();
        s.append(RANGE, 0.0, RANGE).unwrap();
        let c = s.chunks(i64::MIN, i64::MAX);
        assert_eq!(
            c.iter().map(|c| (c.mint, c.maxt)).collect::<Vec<_>>(),
            vec![(RANGE - 1, RANGE - 1), (RANGE, RANGE)]
        );
    }

    #[test]
    fn late_samples_are_merged_in_order() {
        let mut s = SeriesState::default();
        for t in [10, 30, 40] {
            s.append(t, t as f64, RANGE).unwrap();
        }
        s.merge_late(&mut vec![Sample::new(20, 20.0), Sample::new(5, 5.0), Sample::new(30, 30.0)], RANGE);
        let c = s.chunks(i64::MIN, i64::MAX);
        let mut it = ChunkIterator::new(&c[0].data[..]).unwrap();
        let got: Vec<i64> = std::iter::from_fn(|| it.next().map(|s| s.t)).collect();
        assert_eq!(got, vec![5, 10, 20, 30, 40]);
    }
}
