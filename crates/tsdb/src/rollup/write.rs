//! Writing rollup blocks: from a raw block (one read, every tier that needs it written), and
//! merging a tier's blocks into larger ones.
//!
//! A tier block covers the same range as the raw block it was rolled up from and carries its
//! lineage (level, sources, write sequence), so that "does this tier hold that raw block's
//! data" is a test on sources, as for compaction. Buckets cut by the block's range are partial;
//! readers and tier merges finish them (`Bucket::append`).

use std::path::Path;
use std::sync::Arc;

use strata_model::{Labels, Sample};

use super::bucket::{coalesce, Aggregator, ArchiveValue, Bucket};
use super::tier::{RollupTier, SeriesFilter};
use crate::block::{Block, BlockMeta, BlockWriter, ChunkInput, Compaction, RollupMeta};
use crate::chunkenc::{self, decode_merged, rollup::ColumnSet, Encoding};
use crate::compact::{all_symbols, merge_series, Cursor, COMPACTED_SAMPLES_PER_CHUNK};
use crate::error::{Error, Result};

/// Buckets per rollup chunk, as samples per compacted chunk: 240 buckets are 20 h at 5 min.
pub const BUCKETS_PER_CHUNK: usize = COMPACTED_SAMPLES_PER_CHUNK;

/// A tier to write a raw block's rollup for, into `dir` (the tier's directory).
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    pub tier: RollupTier,
    pub dir: &'a Path,
    /// Which series the tier keeps (`None`: all).
    pub filter: Option<&'a SeriesFilter>,
}

/// What rolling up one raw block wrote.
#[derive(Debug, Default)]
pub struct RolledUp {
    /// Per target, in order: the block written (with no series if none had a float sample).
    pub blocks: Vec<BlockMeta>,
    /// Series left out because they hold native histograms (not rolled up yet).
    pub histogram_series: u64,
}

fn chunk_err(labels: &Labels, e: chunkenc::ChunkError) -> Error {
    Error::BlockCorrupt { block: Default::default(), reason: format!("series {labels}: {e}") }
}

/// Writes `buckets` (sorted by end, not empty) as rollup chunks.
fn add_buckets(
    w: &mut BlockWriter,
    labels: &Labels,
    buckets: &[Bucket],
    encoded: &mut Vec<(i64, i64, Vec<u8>)>,
) -> Result<()> {
    encoded.clear();
    for part in buckets.chunks(BUCKETS_PER_CHUNK) {
        encoded.push((part[0].first.t, part[part.len() - 1].last.t, chunkenc::rollup::encode(part)));
    }
    let inputs: Vec<ChunkInput<'_>> =
        encoded.iter().map(|(a, b, d)| ChunkInput { mint: *a, maxt: *b, data: d, rank: 0 }).collect();
    w.add_series(labels, &inputs)
}

/// Rolls `raw` up into one new block per target, reading the raw block once. Deleted samples
/// are left out; series of native histograms are skipped (counted). On error nothing is left
/// under any new block's name.
pub fn roll_up_block(raw: &Block, targets: &[Target<'_>]) -> Result<RolledUp> {
    let symbols = all_symbols([raw])?;
    let mut writers = Vec::with_capacity(targets.len());
    for t in targets {
        let mut w = match BlockWriter::create(raw.fs(), t.dir, &symbols) {
            Ok(w) => w,
            Err(e) => {
                writers.into_iter().for_each(BlockWriter::abort);
                return Err(e);
            }
        };
        w.set_rollup(t.tier.meta());
        w.keep_if_empty();
        writers.push(w);
    }
    let mut out = RolledUp::default();
    let stones = raw.tombstones();
    let result = (|| -> Result<()> {
        let Some(mut cursor) = Cursor::open(raw)? else { return Ok(()) };
        let data = raw.data()?;
        let mut samples: Vec<Sample> = Vec::new();
        let mut encoded = Vec::new();
        loop {
            let mut chunks = Vec::with_capacity(cursor.metas.len());
            for m in &cursor.metas {
                chunks.push(data.chunks.chunk(m.chunk).map_err(|e| raw.corrupt(e.to_string()))?);
            }
            let histogram = chunks.iter().any(|c| {
                matches!(
                    c.first().and_then(|&b| Encoding::from_byte(b).ok()),
                    Some(Encoding::Histogram | Encoding::HistogramWithStartTimes)
                )
            });
            if histogram {
                out.histogram_series += 1;
            } else {
                samples.clear();
                decode_merged(chunks.iter().map(|c| Ok(&**c)), &mut samples)
                    .map_err(|e| raw.corrupt(chunk_err(&cursor.labels, e).to_string()))?;
                let deleted = stones.get(&cursor.id).map(Vec::as_slice).unwrap_or(&[]);
                let (mint, maxt) = (raw.meta().min_time, raw.meta().max_time);
                samples.retain(|s| s.t >= mint && s.t < maxt && !deleted.iter().any(|&(a, b)| a <= s.t && s.t <= b));
                for (w, t) in writers.iter_mut().zip(targets) {
                    if t.filter.is_some_and(|f| !f.keeps(&t.tier, &cursor.labels)) {
                        continue;
                    }
                    let rule = t.filter.and_then(|f| f.archive_rule(&t.tier, &cursor.labels));
                    let mut buckets = Vec::new();
                    let mut agg = Aggregator::closed(t.tier.interval_ms, t.tier.closed).with_archive(rule);
                    agg.add(&samples, &mut buckets);
                    agg.finish(&mut buckets);
                    // A bucket the block's range cuts saw part of its interval: no archive value.
                    for b in buckets.iter_mut().filter(|b| !whole_in(b, t.tier, (mint, maxt))) {
                        b.archive = ArchiveValue::NotKept;
                    }
                    if !buckets.is_empty() {
                        add_buckets(w, &cursor.labels, &buckets, &mut encoded)?;
                    }
                }
            }
            if !cursor.advance()? {
                return Ok(());
            }
        }
    })();
    if let Err(e) = result {
        writers.into_iter().for_each(BlockWriter::abort);
        return Err(e);
    }
    let meta = raw.meta();
    let mut writers = writers.into_iter();
    while let Some(w) = writers.next() {
        let lineage =
            Compaction { level: meta.compaction.level, sources: meta.compaction.sources.clone(), parents: Vec::new() };
        match w.finish(meta.min_time, meta.max_time, lineage, meta.seq) {
            Ok(m) => out.blocks.push(m.expect("a rollup block is kept even when empty")),
            Err(e) => {
                writers.for_each(BlockWriter::abort);
                return Err(e);
            }
        }
    }
    Ok(out)
}

/// Whether the span of a bucket of `tier` lies in `[mint, maxt)` (a block's range).
fn whole_in(b: &Bucket, tier: RollupTier, (mint, maxt): (i64, i64)) -> bool {
    let (first, last) = tier.closed.span(b.end, tier.interval_ms);
    mint <= first && last < maxt
}

/// Merges tier blocks of one interval (sorted by start time) into one block in `parent`:
/// each series' buckets from every block, buckets of the same end combined (exactly where
/// their samples do not interleave: blocks side by side; see `Bucket::absorb` for backfill),
/// deleted buckets (any a tombstone touches) dropped.
pub fn merge_tier_blocks(parent: &Path, tier: RollupMeta, blocks: &[Arc<Block>]) -> Result<Option<BlockMeta>> {
    assert!(blocks.iter().all(|b| b.meta().rollup == Some(tier)));
    let mut all: Vec<Bucket> = Vec::new();
    let mut encoded = Vec::new();
    merge_series(parent, blocks, Some(tier), |w, labels, inputs, deleted, _, _| {
        all.clear();
        for c in inputs {
            chunkenc::rollup::decode(c.data, ColumnSet::ALL, &mut all).map_err(|e| chunk_err(labels, e))?;
        }
        all.retain(|b| !deleted_touches(deleted, b, tier));
        coalesce(&mut all);
        if all.is_empty() {
            return Ok(());
        }
        add_buckets(w, labels, &all, &mut encoded)
    })
}

/// Whether a deleted interval (inclusive) touches the bucket's span `(end - interval, end]`:
/// a deletion removes every bucket it touches, since a bucket cannot lose some of its samples.
pub fn deleted_touches(deleted: &[(i64, i64)], b: &Bucket, tier: RollupMeta) -> bool {
    let (first, last) = tier.closed.span(b.end, tier.interval_ms);
    deleted.iter().any(|&(lo, hi)| lo <= last && hi >= first)
}
