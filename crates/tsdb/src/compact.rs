//! Writing blocks: cutting the head's oldest range into a block, and compaction, which merges
//! blocks into fewer, larger ones.
//!
//! Compaction is leveled: blocks cut from the head span one block range (2 h by default);
//! adjacent blocks are merged once they fill the next range (×3: 6 h, 18 h, 54 h, …, capped);
//! blocks whose time ranges overlap (backfill) are merged first, whatever their size, with
//! duplicate samples dropped; a block with many deleted series is rewritten alone, which
//! removes the deleted samples for good.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};
use std::path::Path;
use std::sync::Arc;

use strata_model::{Labels, Sample};

use crate::block::{
    Block, BlockMeta, BlockWriter, ChunkInput, ChunkMetaRef, Compaction, MmapPostings, ReadCache, RollupMeta,
};
use crate::chunkenc::{by_rank, decode_merged, dense, Encoding, TypedSample};
use crate::error::{Error, Result};
use crate::head::series::SeriesState;
use crate::head::symbols::PackedLabels;
use crate::head::Head;
use crate::index::postings::{self, Postings};
use crate::vfs::Vfs;

/// Longest block compaction produces, whatever the retention: 31 days.
pub const BLOCK_RANGE_MAX_MS: i64 = 31 * 24 * 3600 * 1000;
/// Samples per chunk of the float chunks blocks store (dense chunks; head chunks hold 120):
/// bigger chunks store fewer headers and first samples. 240 → 480 saves another 5% on the
/// node-exporter recording (`cargo bench -p strata-tsdb --bench tsdb_bench -- chunks`) but
/// doubles what a point lookup decodes.
pub const COMPACTED_SAMPLES_PER_CHUNK: usize = 240;

/// A block whose tombstones cover at least this share of its series is rewritten.
const TOMBSTONE_REWRITE_RATIO: f64 = 0.05;

/// Compaction ranges: `base`, then ×3 while at most `max` (at least `base` itself).
pub fn ranges(base: i64, max: i64) -> Vec<i64> {
    let mut out = vec![base];
    while let Some(next) = out.last().and_then(|r| r.checked_mul(3)) {
        if next > max {
            break;
        }
        out.push(next);
    }
    out
}

/// Which late samples a head block takes, and its place in write order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadCut {
    /// The block's write sequence (`BlockMeta::seq`).
    pub seq: u64,
    /// Late samples written in cut epochs up to this one are taken (`Head::begin_cut`).
    pub max_epoch: u64,
}

impl HeadCut {
    /// Every sample in range, in a block of sequence 0 (tests, tools, snapshots).
    pub const ALL: HeadCut = HeadCut { seq: 0, max_epoch: u64::MAX };
}

/// Writes the head's samples in `[mint, maxt)` as a level-1 block in `parent`: in-order and
/// late ones, a late one replacing an in-order one at its timestamp. Head tombstones are
/// applied (deleted samples are not written). Returns `None` if the range holds no sample.
///
/// Memory stays small whatever the head's size: series are sorted by label set through a
/// snapshot of the symbol table (one pointer per symbol), and each series' labels and chunks are
/// materialized only while it is written.
pub fn write_head_block(
    fs: &Arc<dyn Vfs>,
    head: &Head,
    parent: &Path,
    mint: i64,
    maxt: i64,
    cut: HeadCut,
) -> Result<Option<BlockMeta>> {
    let stones = head.tombstones_snapshot();
    // Keeps truncation from freeing the symbols of the series collected here.
    let _gate = head.read_gate();
    let mut series: Vec<Arc<crate::head::MemSeries>> = postings::expand(head.postings_for(&[]))
        .into_iter()
        .filter_map(|r| head.series(r))
        .filter(|s| s.lock().overlaps(mint, maxt - 1))
        .collect();
    let strings = head.symbols.snapshot();
    let mut used = vec![false; strings.len()];
    for s in &series {
        for (n, v) in s.labels.pairs() {
            used[n as usize] = true;
            used[v as usize] = true;
        }
    }
    series.sort_unstable_by(|a, b| compare_packed(&a.labels, &b.labels, &strings));
    let mut symbols: Vec<Arc<str>> = used.iter().zip(&strings).filter(|(u, _)| **u).map(|(_, s)| s.clone()).collect();
    symbols.sort_unstable();
    drop(strings);
    let mut w = BlockWriter::create(fs, parent, &symbols)?;
    let mut scratch = Scratch::default();
    for s in &series {
        let mut chunks = Vec::new();
        s.lock().each_chunk(mint, maxt - 1, cut.max_epoch, |c, rank| chunks.push((c, rank)));
        let labels = head.symbols.resolve(&s.labels);
        let deleted = stones.as_ref().and_then(|t| t.get(&s.series_ref).map(Vec::as_slice)).unwrap_or(&[]);
        let mut inputs: Vec<ChunkInput<'_>> = chunks
            .iter()
            .map(|(c, rank)| ChunkInput { mint: c.mint, maxt: c.maxt, data: &c.data, rank: *rank })
            .collect();
        // Late chunks come after the in-order ones.
        inputs.sort_by_key(|c| c.mint);
        if let Err(e) = write_series(&mut w, &labels, &inputs, deleted, mint, maxt, &mut scratch) {
            w.abort();
            return Err(e);
        }
    }
    w.finish(mint, maxt, Compaction { level: 1, sources: Vec::new(), parents: Vec::new() }, cut.seq)
}

/// Orders two packed label sets as their label sets order (name, then value, label by label).
fn compare_packed(a: &PackedLabels, b: &PackedLabels, strings: &[Arc<str>]) -> std::cmp::Ordering {
    let (mut x, mut y) = (a.pairs(), b.pairs());
    loop {
        match (x.next(), y.next()) {
            (None, None) => return std::cmp::Ordering::Equal,
            (None, Some(_)) => return std::cmp::Ordering::Less,
            (Some(_), None) => return std::cmp::Ordering::Greater,
            (Some((an, av)), Some((bn, bv))) => {
                let o = strings[an as usize]
                    .cmp(&strings[bn as usize])
                    .then_with(|| strings[av as usize].cmp(&strings[bv as usize]));
                if o.is_ne() {
                    return o;
                }
            }
        }
    }
}

/// Buffers reused across series while rewriting chunks.
#[derive(Default)]
struct Scratch {
    samples: Vec<Sample>,
    encoded: Vec<(i64, i64, Vec<u8>)>,
}

/// Writes one series. Float samples are stored as dense chunks of
/// `COMPACTED_SAMPLES_PER_CHUNK`: dense chunks are copied as they are when they neither overlap
/// each other, nor stick out of `[mint, maxt)`, nor hold deleted samples, nor are small; any
/// other float chunks (the head's XOR chunks, older blocks' ones) are decoded, merged (of each
/// timestamp the sample of the highest-ranked chunk kept), filtered and re-encoded. Histograms
/// and samples with start times keep their own encodings (`rewrite_typed`).
/// A series left with no sample is skipped.
fn write_series(
    w: &mut BlockWriter,
    labels: &Labels,
    chunks: &[ChunkInput<'_>],
    deleted: &[(i64, i64)],
    mint: i64,
    maxt: i64,
    scratch: &mut Scratch,
) -> Result<()> {
    let overlapping = chunks.windows(2).any(|p| p[1].mint <= p[0].maxt);
    let clipped = chunks.iter().any(|c| c.mint < mint || c.maxt >= maxt);
    let hit = chunks.iter().any(|c| deleted.iter().any(|&(a, b)| a <= c.maxt && c.mint <= b));
    let encoding = |c: &ChunkInput<'_>| c.data.first().and_then(|&b| Encoding::from_byte(b).ok());
    let all_dense = chunks.iter().all(|c| encoding(c) == Some(Encoding::Dense));
    let small = chunks.len() > 1 && {
        let total: usize = chunks.iter().map(|c| crate::chunkenc::num_samples(c.data).unwrap_or(0)).sum();
        total * 4 < chunks.len() * COMPACTED_SAMPLES_PER_CHUNK * 3
    };
    if all_dense && !overlapping && !clipped && !hit && !small {
        return if chunks.is_empty() { Ok(()) } else { w.add_series(labels, chunks) };
    }
    if !chunks.iter().all(|c| matches!(encoding(c), Some(Encoding::Xor | Encoding::Dense))) {
        return rewrite_typed(w, labels, chunks, deleted, mint, maxt);
    }
    let samples = &mut scratch.samples;
    samples.clear();
    decode_merged(by_rank(chunks, |c| c.rank).map(|c| Ok(c.data)), samples).map_err(|e| chunk_err(labels, e))?;
    samples.retain(|s| s.t >= mint && s.t < maxt && !deleted.iter().any(|&(a, b)| a <= s.t && s.t <= b));
    if samples.is_empty() {
        return Ok(());
    }
    scratch.encoded.clear();
    for part in samples.chunks(COMPACTED_SAMPLES_PER_CHUNK) {
        scratch.encoded.push((part[0].t, part[part.len() - 1].t, dense::encode(part)));
    }
    let inputs: Vec<ChunkInput<'_>> =
        scratch.encoded.iter().map(|(a, b, d)| ChunkInput { mint: *a, maxt: *b, data: d, rank: 0 }).collect();
    w.add_series(labels, &inputs)
}

/// `write_series`' rewrite for a series with histogram chunks or start times: samples of both
/// kinds (with their start times) are merged, filtered and appended again under the head's
/// chunking rules (which cut histogram chunks where layouts change or counters reset).
fn rewrite_typed(
    w: &mut BlockWriter,
    labels: &Labels,
    chunks: &[ChunkInput<'_>],
    deleted: &[(i64, i64)],
    mint: i64,
    maxt: i64,
) -> Result<()> {
    let mut samples: Vec<TypedSample> = Vec::new();
    decode_merged(by_rank(chunks, |c| c.rank).map(|c| Ok(c.data)), &mut samples).map_err(|e| chunk_err(labels, e))?;
    samples.retain(|s| s.t >= mint && s.t < maxt && !deleted.iter().any(|&(a, b)| a <= s.t && s.t <= b));
    let mut state = SeriesState::default();
    // One range for the whole block: only size, kind and layout cut chunks here.
    let range = maxt.saturating_sub(mint).max(1);
    for s in &samples {
        state
            .append_typed(s, range)
            .map_err(|e| chunk_err(labels, crate::chunkenc::ChunkError::Corrupt(e.to_string())))?;
    }
    let encoded = state.chunks(i64::MIN, i64::MAX);
    if encoded.is_empty() {
        return Ok(());
    }
    let inputs: Vec<ChunkInput<'_>> =
        encoded.iter().map(|c| ChunkInput { mint: c.mint, maxt: c.maxt, data: &c.data, rank: 0 }).collect();
    w.add_series(labels, &inputs)
}

fn chunk_err(labels: &Labels, e: crate::chunkenc::ChunkError) -> Error {
    Error::BlockCorrupt { block: Default::default(), reason: format!("series {labels}: {e}") }
}

/// One input block's series, read in label order.
pub(crate) struct Cursor<'a> {
    block: &'a Block,
    postings: MmapPostings,
    pub(crate) labels: Labels,
    pub(crate) metas: Vec<ChunkMetaRef>,
    /// The series' reference in the block (its tombstones' key).
    pub(crate) id: u64,
    interner: ReadCache,
}

impl<'a> Cursor<'a> {
    pub(crate) fn open(block: &'a Block) -> Result<Option<Cursor<'a>>> {
        let postings = block.data()?.index.all_postings().map_err(|e| block.corrupt(e))?;
        let mut c = Cursor {
            block,
            postings,
            labels: Labels::empty(),
            metas: Vec::new(),
            id: 0,
            interner: ReadCache::default(),
        };
        Ok(c.advance()?.then_some(c))
    }

    /// Reads the next series; false at the end.
    pub(crate) fn advance(&mut self) -> Result<bool> {
        let Some(id) = self.postings.next() else { return Ok(false) };
        let data = self.block.data()?;
        self.labels = data.index.series(id, &mut self.metas, &mut self.interner).map_err(|e| self.block.corrupt(e))?;
        self.id = id.0;
        Ok(true)
    }
}

/// Merges `blocks` (sorted by start time) into one block in `parent`, dropping deleted and
/// duplicate samples. The inputs are not touched; the caller swaps and deletes them once the
/// output is durable. Returns `None` if nothing survives (every sample deleted). The output
/// goes to the disk the first input is on.
pub fn merge_blocks(parent: &Path, blocks: &[Arc<Block>]) -> Result<Option<BlockMeta>> {
    let mut scratch = Scratch::default();
    merge_series(parent, blocks, None, |w, labels, inputs, deleted, mint, maxt| {
        write_series(w, labels, inputs, deleted, mint, maxt, &mut scratch)
    })
}

/// Walks the series of `blocks` in label order, each series once with its chunks from every
/// block that has it (by start time), and lets `write` write it into one new block in `parent`
/// (a rollup tier's when `rollup_interval` is set), given the series' deleted intervals and the
/// output's range. Lineage, level and write sequence as compaction's.
pub(crate) fn merge_series(
    parent: &Path,
    blocks: &[Arc<Block>],
    rollup: Option<RollupMeta>,
    mut write: impl FnMut(&mut BlockWriter, &Labels, &[ChunkInput<'_>], &[(i64, i64)], i64, i64) -> Result<()>,
) -> Result<Option<BlockMeta>> {
    assert!(!blocks.is_empty());
    let mint = blocks.iter().map(|b| b.meta().min_time).min().expect("not empty");
    let maxt = blocks.iter().map(|b| b.meta().max_time).max().expect("not empty");
    let symbols = all_symbols(blocks.iter().map(|b| &**b))?;
    let stones: Vec<_> = blocks.iter().map(|b| b.tombstones()).collect();

    let mut cursors: Vec<Option<Cursor<'_>>> = Vec::with_capacity(blocks.len());
    let mut heap = BinaryHeap::new();
    for (i, b) in blocks.iter().enumerate() {
        let c = Cursor::open(b)?;
        if let Some(c) = &c {
            heap.push(Reverse((c.labels.clone(), i)));
        }
        cursors.push(c);
    }

    let mut w = BlockWriter::create(blocks[0].fs(), parent, &symbols)?;
    if let Some(rollup) = rollup {
        w.set_rollup(rollup);
        // A tier block records which raw blocks the tier holds, series or not.
        w.keep_if_empty();
    }
    let result = (|| -> Result<()> {
        let mut chunk_refs: Vec<(usize, ChunkMetaRef)> = Vec::new();
        let mut deleted: Vec<(i64, i64)> = Vec::new();
        while let Some(Reverse((labels, first))) = heap.pop() {
            let mut from = vec![first];
            while heap.peek().is_some_and(|Reverse((l, _))| *l == labels) {
                from.push(heap.pop().expect("peeked").0 .1);
            }
            from.sort_unstable();
            chunk_refs.clear();
            deleted.clear();
            for &i in &from {
                let c = cursors[i].as_mut().expect("a cursor in the heap is open");
                chunk_refs.extend(c.metas.iter().map(|m| (i, *m)));
                if let Some(ivs) = stones[i].get(&c.id) {
                    deleted.extend_from_slice(ivs);
                }
            }
            chunk_refs.sort_by_key(|(_, m)| m.mint);
            let mut bytes = Vec::with_capacity(chunk_refs.len());
            for (i, m) in &chunk_refs {
                let data = blocks[*i].data()?;
                bytes.push(data.chunks.chunk(m.chunk).map_err(|e| blocks[*i].corrupt(e.to_string()))?);
            }
            let inputs: Vec<ChunkInput<'_>> = chunk_refs
                .iter()
                .zip(&bytes)
                .map(|((i, m), b)| ChunkInput { mint: m.mint, maxt: m.maxt, data: b, rank: blocks[*i].meta().seq })
                .collect();
            write(&mut w, &labels, &inputs, &deleted, mint, maxt)?;
            for &i in &from {
                let c = cursors[i].as_mut().expect("open");
                if c.advance()? {
                    heap.push(Reverse((c.labels.clone(), i)));
                } else {
                    cursors[i] = None;
                }
            }
        }
        Ok(())
    })();
    if let Err(e) = result {
        w.abort();
        return Err(e);
    }
    let level = blocks.iter().map(|b| b.meta().compaction.level).max().unwrap_or(0) + 1;
    let mut sources: Vec<String> = blocks.iter().flat_map(|b| b.meta().compaction.sources.iter().cloned()).collect();
    sources.sort();
    sources.dedup();
    let parents = blocks.iter().map(|b| b.ulid().to_owned()).collect();
    let seq = blocks.iter().map(|b| b.meta().seq).max().unwrap_or(0);
    w.finish(mint, maxt, Compaction { level, sources, parents }, seq)
}

/// Every label string of `blocks`, sorted and unique: the symbol table of their merge.
pub(crate) fn all_symbols<'a>(blocks: impl IntoIterator<Item = &'a Block>) -> Result<Vec<Arc<str>>> {
    let mut symbols: BTreeSet<Arc<str>> = BTreeSet::new();
    for b in blocks {
        b.data()?.index.for_each_symbol(|s| {
            if !symbols.contains(s) {
                symbols.insert(Arc::from(s));
            }
        });
    }
    Ok(symbols.into_iter().collect())
}

/// The next set of blocks to compact, if any. `blocks` is sorted by start time.
///
/// In order: blocks whose ranges overlap (merged whatever their size); then, for each range
/// from the smallest, two or more blocks inside one aligned window of that range that either
/// fill it or will get no more data (a newer block starts after the window); then a single
/// block with enough deletions to be worth rewriting.
pub fn plan(blocks: &[Arc<Block>], ranges: &[i64]) -> Option<Vec<Arc<Block>>> {
    // Overlapping blocks.
    let mut i = 0;
    while i < blocks.len() {
        let mut end = blocks[i].meta().max_time;
        let mut j = i + 1;
        while j < blocks.len() && blocks[j].meta().min_time < end {
            end = end.max(blocks[j].meta().max_time);
            j += 1;
        }
        if j - i > 1 {
            return Some(blocks[i..j].to_vec());
        }
        i = j;
    }
    let newest_start = blocks.iter().map(|b| b.meta().min_time).max()?;
    for &r in ranges.iter().skip(1) {
        let mut i = 0;
        while i < blocks.len() {
            let start = blocks[i].meta().min_time.div_euclid(r) * r;
            let end = start.saturating_add(r);
            let mut j = i;
            while j < blocks.len() && blocks[j].meta().min_time >= start && blocks[j].meta().max_time <= end {
                j += 1;
            }
            if j == i {
                // This block is already larger than the window.
                i += 1;
                continue;
            }
            let group = &blocks[i..j];
            let covers = group[0].meta().min_time == start && group[group.len() - 1].meta().max_time == end;
            let closed = newest_start >= end;
            if group.len() > 1 && (covers || closed) {
                return Some(group.to_vec());
            }
            i = j;
        }
    }
    blocks
        .iter()
        .find(|b| {
            let deleted = b.tombstones().len() as f64;
            deleted > 0.0 && deleted >= TOMBSTONE_REWRITE_RATIO * b.meta().stats.num_series.max(1) as f64
        })
        .map(|b| vec![b.clone()])
}

#[cfg(test)]
mod tests;
