//! The out-of-order overlay of one series: samples accepted at or before the series' newest
//! timestamp (inside the head's out-of-order window), kept beside its in-order chunks.
//!
//! In-order chunks only grow at their end, so a late sample cannot join them. It goes into a
//! small sorted buffer instead, which is encoded into an XOR chunk once it holds
//! `BUFFER_SAMPLES`. Readers and the block writer merge these chunks with the in-order ones by
//! rank: at one timestamp the overlay's sample replaces the in-order one, and a later overlay
//! chunk's replaces an earlier one's. A rewrite of a timestamp (carbon's last-write-wins) is
//! thus simply a newer overlay sample.
//!
//! Every part carries the cut epoch it was written in (`Head::begin_cut`): a head cut writes
//! the parts of its epoch and older, then drops what of them lies before its end; samples that
//! arrive during the cut carry a newer epoch and stay for the next one.

use strata_model::Sample;

use super::series::ChunkMeta;
use crate::chunkenc::{ChunkIterator, XorAppender, XorIterator};

/// Samples the buffer holds before it is encoded (Prometheus' out-of-order head chunks hold 32).
const BUFFER_SAMPLES: usize = 32;
/// Chunks of one epoch kept before they are merged into non-overlapping ones: readers merge
/// every overlapping chunk they meet, so their number is what a read of a late series costs.
const CHUNKS_BEFORE_MERGE: usize = 16;
/// Samples per chunk when merged chunks are encoded again.
const MERGED_CHUNK_SAMPLES: usize = 240;

/// An encoded part of the overlay.
#[derive(Debug, Clone)]
struct OverlayChunk {
    chunk: ChunkMeta,
    epoch: u64,
}

/// Late samples of one series, in write order (see the module documentation).
#[derive(Debug, Default)]
pub(crate) struct Overlay {
    /// Oldest write first: a later chunk's sample wins over an earlier one's.
    chunks: Vec<OverlayChunk>,
    /// The newest samples, sorted by time, at most one per timestamp.
    buffer: Vec<Sample>,
    buffer_epoch: u64,
}

impl Overlay {
    pub(crate) fn is_empty(&self) -> bool {
        self.chunks.is_empty() && self.buffer.is_empty()
    }

    /// Heap bytes of its chunks and buffer.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.chunks.iter().map(|c| c.chunk.data.len()).sum::<usize>()
            + self.buffer.capacity() * std::mem::size_of::<Sample>()
    }

    /// Stores `(t, v)`, written in cut epoch `epoch`; it replaces any earlier sample at `t`.
    pub(crate) fn insert(&mut self, t: i64, v: f64, epoch: u64) {
        if !self.buffer.is_empty() && self.buffer_epoch != epoch {
            self.seal();
        }
        self.buffer_epoch = epoch;
        match self.buffer.binary_search_by_key(&t, |s| s.t) {
            Ok(i) => self.buffer[i].v = v,
            Err(i) => self.buffer.insert(i, Sample { t, v }),
        }
        if self.buffer.len() >= BUFFER_SAMPLES {
            self.seal();
        }
    }

    /// Encodes the buffer into a chunk, merging the newest epoch's chunks once they are many.
    fn seal(&mut self) {
        if self.buffer.is_empty() {
            return;
        }
        let chunk = encode(&self.buffer);
        self.buffer.clear();
        self.chunks.push(OverlayChunk { chunk, epoch: self.buffer_epoch });
        let epoch = self.buffer_epoch;
        let run = self.chunks.iter().rev().take_while(|c| c.epoch == epoch).count();
        if run > CHUNKS_BEFORE_MERGE {
            let start = self.chunks.len() - run;
            let merged = merge_newest_first(self.chunks[start..].iter().rev().map(|c| &c.chunk));
            self.chunks.truncate(start);
            self.chunks
                .extend(merged.chunks(MERGED_CHUNK_SAMPLES).map(|part| OverlayChunk { chunk: encode(part), epoch }));
        }
    }

    /// The newest value written at `t`, if any.
    pub(crate) fn value_at(&self, t: i64) -> Option<f64> {
        if let Ok(i) = self.buffer.binary_search_by_key(&t, |s| s.t) {
            return Some(self.buffer[i].v);
        }
        self.chunks.iter().rev().filter(|c| c.chunk.mint <= t && t <= c.chunk.maxt).find_map(|c| {
            let mut it = xor_iter(&c.chunk.data);
            it.seek(t).filter(|s| s.t == t).map(|s| s.v)
        })
    }

    pub(crate) fn max_time(&self) -> Option<i64> {
        let chunks = self.chunks.iter().map(|c| c.chunk.maxt);
        chunks.chain(self.buffer.last().map(|s| s.t)).max()
    }

    pub(crate) fn min_time(&self) -> Option<i64> {
        let chunks = self.chunks.iter().map(|c| c.chunk.mint);
        chunks.chain(self.buffer.first().map(|s| s.t)).min()
    }

    /// How many parts (chunks, the buffer) overlap `[mint, maxt]`.
    pub(crate) fn count_parts(&self, mint: i64, maxt: i64) -> usize {
        self.ranks(mint, maxt, u64::MAX).count()
    }

    /// Hands each part overlapping `[mint, maxt]` and written in an epoch up to `max_epoch` to
    /// `f`, with its rank among the overlay's parts (1 for the oldest; higher wins). The buffer
    /// is encoded for the purpose.
    pub(crate) fn each_chunk(&self, mint: i64, maxt: i64, max_epoch: u64, mut f: impl FnMut(ChunkMeta, u64)) {
        for rank in self.ranks(mint, maxt, max_epoch) {
            let chunk = match self.chunks.get(rank as usize - 1) {
                Some(c) => c.chunk.clone(),
                None => encode(&self.buffer),
            };
            f(chunk, rank);
        }
    }

    /// The ranks of the parts overlapping `[mint, maxt]` written in epochs up to `max_epoch`:
    /// chunk `i` has rank `i + 1`, the buffer the rank after the last chunk's.
    fn ranks(&self, mint: i64, maxt: i64, max_epoch: u64) -> impl Iterator<Item = u64> + '_ {
        let overlaps = move |a: i64, b: i64| b >= mint && a <= maxt;
        let chunks = self.chunks.iter().enumerate();
        let chunks = chunks.filter(move |(_, c)| c.epoch <= max_epoch && overlaps(c.chunk.mint, c.chunk.maxt));
        let buffer = match (self.buffer.first(), self.buffer.last()) {
            (Some(first), Some(last)) if self.buffer_epoch <= max_epoch && overlaps(first.t, last.t) => {
                Some(self.chunks.len() as u64 + 1)
            }
            _ => None,
        };
        chunks.map(|(i, _)| i as u64 + 1).chain(buffer)
    }

    /// Drops the samples before `t` of the parts written in epochs up to `max_epoch` (now in a
    /// block); returns how many chunks went.
    pub(crate) fn truncate_before(&mut self, t: i64, max_epoch: u64) -> usize {
        let before = self.chunks.len();
        self.chunks.retain_mut(|c| {
            if c.epoch > max_epoch || c.chunk.mint >= t {
                return true;
            }
            if c.chunk.maxt < t {
                return false;
            }
            let kept: Vec<Sample> = decode(&c.chunk).into_iter().filter(|s| s.t >= t).collect();
            c.chunk = encode(&kept);
            true
        });
        if self.buffer_epoch <= max_epoch {
            self.buffer.retain(|s| s.t >= t);
        }
        before - self.chunks.len()
    }
}

/// An XOR chunk of `samples` (sorted, non-empty).
fn encode(samples: &[Sample]) -> ChunkMeta {
    debug_assert!(samples.windows(2).all(|p| p[0].t < p[1].t), "overlay samples are sorted and unique");
    let mut app = XorAppender::with_capacity(samples.len() * 2 + 16);
    for s in samples {
        app.append(s.t, s.v);
    }
    let (mint, maxt) = (samples[0].t, samples[samples.len() - 1].t);
    ChunkMeta { mint, maxt, data: app.into_bytes().into() }
}

fn xor_iter(data: &[u8]) -> XorIterator<&[u8]> {
    match ChunkIterator::new(data) {
        Ok(ChunkIterator::Xor(it)) => it,
        _ => unreachable!("overlay chunks are XOR chunks encoded here"),
    }
}

fn decode(c: &ChunkMeta) -> Vec<Sample> {
    let mut out = Vec::new();
    xor_iter(&c.data).decode_into(&mut out);
    out
}

/// The samples of `chunks` (newest first), sorted, each timestamp's newest kept.
fn merge_newest_first<'a>(chunks: impl Iterator<Item = &'a ChunkMeta>) -> Vec<Sample> {
    let mut all = Vec::new();
    for c in chunks {
        xor_iter(&c.data).decode_into(&mut all);
    }
    // Stable: of equal timestamps the first decoded, the newest, stays first and is kept.
    all.sort_by_key(|s| s.t);
    all.dedup_by_key(|s| s.t);
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a reader sees: every part merged by rank, the highest kept per timestamp.
    fn read(o: &Overlay, max_epoch: u64) -> Vec<(i64, f64)> {
        let mut parts = Vec::new();
        o.each_chunk(i64::MIN, i64::MAX, max_epoch, |c, rank| parts.push((rank, c)));
        parts.sort_by_key(|(rank, _)| std::cmp::Reverse(*rank));
        merge_newest_first(parts.iter().map(|(_, c)| c)).into_iter().map(|s| (s.t, s.v)).collect()
    }

    #[test]
    fn the_last_write_of_a_timestamp_wins_across_buffer_chunks_and_merges() {
        let mut o = Overlay::default();
        let mut model = std::collections::BTreeMap::new();
        // Enough writes to seal many chunks and merge them; timestamps repeat in every round.
        for round in 0..40 {
            for i in 0..37 {
                let t = ((i * 7 + round * 3) % 50) as i64 * 1000;
                let v = (round * 100 + i) as f64;
                o.insert(t, v, 0);
                model.insert(t, v);
            }
            let want: Vec<(i64, f64)> = model.iter().map(|(&t, &v)| (t, v)).collect();
            assert_eq!(read(&o, u64::MAX), want, "round {round}");
            for (&t, &v) in &model {
                assert_eq!(o.value_at(t), Some(v));
            }
            assert!(o.chunks.len() <= CHUNKS_BEFORE_MERGE + 50 / MERGED_CHUNK_SAMPLES + 1, "{}", o.chunks.len());
        }
        assert_eq!(o.value_at(500), None);
        assert_eq!(o.min_time(), Some(0));
    }

    #[test]
    fn a_cut_drops_only_what_its_epoch_wrote_before_its_end() {
        let mut o = Overlay::default();
        for t in 0..100 {
            o.insert(t, 1.0, 0);
        }
        // Written during the cut: a newer epoch, before the cut's end all the same.
        o.insert(10, 2.0, 1);
        o.insert(60, 2.0, 1);
        assert_eq!(read(&o, 0).len(), 100, "the cut writes epoch 0 only");
        o.truncate_before(50, 0);
        let left = read(&o, u64::MAX);
        assert_eq!(left.first(), Some(&(10, 2.0)));
        assert_eq!(left.len(), 51, "{left:?}");
        assert!(left.contains(&(60, 2.0)) && left.contains(&(99, 1.0)) && !left.contains(&(49, 1.0)));
        o.truncate_before(i64::MAX, 1);
        assert!(o.is_empty());
    }

    #[test]
    fn parts_outside_the_range_are_not_handed_out() {
        let mut o = Overlay::default();
        for t in 0..40 {
            o.insert(t * 10, 0.0, 0);
        }
        o.insert(1000, 0.0, 0);
        assert_eq!(o.count_parts(i64::MIN, i64::MAX), 2);
        assert_eq!(o.count_parts(500, 2000), 1);
        assert_eq!(o.count_parts(2000, 3000), 0);
    }
}
