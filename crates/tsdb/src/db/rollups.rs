//! Rollup tiers in the data directory: which raw blocks are rolled up and when, the tiers' own
//! compaction and retention.
//!
//! ```text
//! data/rollups/
//! ├── 5m/01J…/     a tier's block: the buckets of one raw block's range (or, merged, several)
//! └── 1h/01J…/
//! ```
//!
//! Rules, each keeping "every sample is in raw data or in every tier, exactly once":
//! - A raw block is rolled up once it overlaps no other raw block (late data is merged first),
//!   as soon as it is cut from the head; or when retention is about to delete it. One read of
//!   the raw block writes a block for every tier that lacks it, with the raw block's range and
//!   lineage (level, sources, write sequence). Tiers so trail the head only.
//! - When compaction merges raw blocks side by side (no overlap, no deletions), each tier's
//!   blocks of them are merged the same way (`merge_tiers_in_step`, exact: their samples do
//!   not interleave), so a tier's blocks keep the raw blocks' partition.
//! - A tier **holds** a raw block when every source of the raw block is among its blocks'
//!   sources. A tier block whose sources a newer rolled-up raw block includes (late data merged
//!   into a range already rolled up) is replaced by the new one, as compaction replaces inputs.
//! - Tier blocks of settled raw blocks (at the largest raw range, overlapping nothing, without
//!   deletions) are merged into **coarse** blocks of 3× that range while the raw blocks remain,
//!   except in the window of the oldest raw block (`coarse_candidates`). A coarse block is
//!   never rewritten in part: when late data merges into one of its raw blocks, or retention is
//!   about to delete one, it is dropped and its raw blocks (all still there) rolled up again
//!   one by one (`roll_up`); readers read raw whatever a left-out tier block held.
//! - Likewise, tier blocks of settled raw blocks of any range are merged in the windows of one
//!   raw range (`Tier::filling_window`) once a window holds three (`filling_group`), ahead of
//!   raw compaction, which leaves a window's blocks apart until it closes. Settled blocks here
//!   and above also end before late writes can reach (`RawView::settled`). A tier that holds every
//!   source of a raw block holds its samples however its blocks cut them: nothing is dropped
//!   or rolled up again when raw compaction merges them later.
//! - Otherwise tier blocks are merged only once none of their sources is a raw block any more
//!   (raw data deleted by retention): until then each is one raw block's rollup (or the merge
//!   of raw blocks merged since, or a coarse block), so late data replaces it exactly. Merged
//!   blocks span the tier's compaction ranges (×3 from the largest raw range, up to 31 days or
//!   a tenth of the tier's retention).
//! - Raw retention deletes a block only once every tier holds it, and not while it overlaps
//!   another raw block (their samples may be the same ones: merged first, then rolled up); a
//!   tier's retention deletes its blocks older than the tier's retention behind the newest
//!   sample.
//! - Buckets cannot be deduplicated as samples are, so nothing is counted twice: a tier block
//!   whose sources another listed tier block holds (`replaced_by`: left listed by a refused
//!   deletion) is never read, and readers read raw any held block the head's time range
//!   overlaps (a crash may have replayed its samples into the head).
//!
//! A crash at any point leaves whole blocks: a tier block not yet listed is found at open (a
//! replaced one, by lineage, removed), and raw data is deleted only after the tiers' blocks
//! are durable.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::RwLock;

use strata_model::{Labels, Matcher};

use super::{open_blocks, swap_in, Db, Inner};
use crate::block::{Block, BlockMeta, RollupMeta};
use crate::chunkenc::rollup::{bucket_count, decode_columns, ColumnSet};
use crate::compact::{self, BLOCK_RANGE_MAX_MS};
use crate::error::{Error, Result};
use crate::fsutil::{create_dir_all, fsync_dir};
use crate::prefetch::prefetch;
use crate::querier::{BlockList, Querier, ReadLimits};
use crate::rollup::write::{deleted_touches, merge_tier_blocks, roll_up_block, Target};
use crate::rollup::{buffers, coalesce, Aggregator, ArchiveValue, Bucket, BucketColumns, RollupTier};
use crate::vfs::Vfs;

/// The directory of the rollup tiers, inside the data directory.
pub const ROLLUPS_DIR: &str = "rollups";

/// Below this many series a tier's buckets are decoded on the reading thread (tests take the
/// parallel path with a handful).
const PARALLEL_SERIES_MIN: usize = if cfg!(test) { 2 } else { 256 };
/// Series a decoding worker handles at once, and the most workers.
const PARALLEL_BATCH: usize = if cfg!(test) { 1 } else { 32 };
const PARALLEL_THREADS_MAX: usize = 8;

/// A tier merges its blocks of a raw window still filling (`Tier::filling_window`) once this
/// many are there: raw compaction leaves up to two blocks per level in such a window (a 54 h
/// window holds 18 h, 18 h, 6 h, 6 h, 2 h, 2 h before it closes), and an hourly tier's block
/// of a 2-hour raw block holds 2 buckets per series, so per-block work (series lookup, chunk
/// and column headers) was most of what reading the newest days cost. Three, not two: each
/// merge rewrites the window's buckets so far.
const FILLING_WINDOW_BLOCKS: usize = 3;
/// The longest filling window, in tier intervals: what one merge rewrites per series at most.
const FILLING_WINDOW_INTERVALS_MAX: i64 = 64;

/// One configured tier and its blocks.
#[derive(Debug)]
pub(crate) struct Tier {
    pub(crate) spec: RollupTier,
    pub(crate) dir: PathBuf,
    pub(crate) blocks: BlockList,
}

/// What `strata status` and `/metrics` show of a tier.
#[derive(Debug, Clone)]
pub struct TierStatus {
    pub tier: RollupTier,
    pub blocks: Vec<BlockMeta>,
    pub bytes: u64,
    /// Each block's bytes, in the order of `blocks`.
    pub block_bytes: Vec<u64>,
}

/// Whether tier block `b` holds nothing `other` does not: its sources are among `other`'s (a
/// rollup replaced by a later one, or merged, whose deletion the disk refused, so that it was
/// listed again). Of two with the same sources the one of the higher level (then ULID) stays.
fn replaced_by(b: &Block, other: &Block) -> bool {
    let (mine, theirs) = (&b.meta().compaction.sources, &other.meta().compaction.sources);
    if std::ptr::eq(b, other) || !mine.iter().all(|s| has_source(theirs, s)) {
        return false;
    }
    theirs.len() > mine.len() || (other.meta().compaction.level, other.ulid()) > (b.meta().compaction.level, b.ulid())
}

/// A tier's blocks without the replaced ones: counted once, a bucket's samples must be read
/// from one block only (buckets cannot be deduplicated as samples are).
fn live(blocks: &[Arc<Block>]) -> Vec<Arc<Block>> {
    blocks.iter().filter(|b| !blocks.iter().any(|o| replaced_by(b, o))).cloned().collect()
}

fn tier_sources(blocks: &[Arc<Block>]) -> HashSet<String> {
    blocks.iter().flat_map(|b| b.meta().compaction.sources.iter().cloned()).collect()
}

fn corrupt_tier(tier: &Tier, labels: &Labels, e: crate::chunkenc::ChunkError) -> Error {
    Error::BlockCorrupt { block: tier.dir.clone(), reason: format!("series {labels}: {e}") }
}

impl Tier {
    /// Every raw source this tier's blocks hold.
    fn sources(&self) -> HashSet<String> {
        tier_sources(&self.blocks.read())
    }

    /// The tier's compaction ranges: ×3 from the largest raw range, up to 31 days or a tenth
    /// of its retention.
    fn ranges(&self, raw_ranges: &[i64]) -> Vec<i64> {
        let base = *raw_ranges.last().expect("at least one range");
        let mut max = BLOCK_RANGE_MAX_MS;
        if self.spec.retention_ms > 0 {
            max = max.min(self.spec.retention_ms / 10);
        }
        compact::ranges(base, max.max(base))
    }

    /// The raw compaction range whose windows this tier merges its blocks in ahead of raw
    /// compaction (`FILLING_WINDOW_BLOCKS`): the longest raw range of at most
    /// `FILLING_WINDOW_INTERVALS_MAX` intervals, above the block range (`filling_group`).
    /// Aligned to raw windows, a merged block never holds raw blocks of two windows, which raw
    /// compaction never merges. `None`: the tier's blocks are long enough.
    fn filling_window(&self, raw_ranges: &[i64]) -> Option<i64> {
        let longest = self.spec.interval_ms.saturating_mul(FILLING_WINDOW_INTERVALS_MAX);
        raw_ranges.iter().skip(1).copied().filter(|&r| r <= longest).max()
    }
}

/// What `Db::rollup_select` found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RollupSelection {
    pub series: Vec<RollupSeries>,
    /// Matching series with native histogram samples in the raw data read: rollups do not
    /// hold histograms, so a reader that needs them must read raw data instead. When not 0,
    /// `series` is empty.
    pub histogram_series: usize,
}

/// One series' buckets as a tier serves them.
#[derive(Debug, Clone, PartialEq)]
pub struct RollupSeries {
    pub labels: Labels,
    /// Sorted by end, each end once; the aggregates the read asked for.
    pub buckets: BucketColumns,
}

impl Db {
    /// The configured rollup tiers, finest first.
    pub fn rollup_tiers(&self) -> Vec<RollupTier> {
        self.inner.tiers.iter().map(|t| t.spec).collect()
    }

    /// Each tier's blocks and bytes, finest first.
    pub fn tier_status(&self) -> Vec<TierStatus> {
        self.inner.tier_status()
    }

    /// The buckets of the tier `tier` (its interval and closed side) whose ends fall in
    /// `[bucket_end(mint), bucket_end(maxt)]`, for the series matching `matchers`, each series
    /// lent to `map` (on the decoding workers, in parallel, as soon as its buckets are decoded;
    /// its buffers are reused afterwards) and the results handed to `sink` in label order on
    /// this thread. Each bucket aggregates all its samples: those the tier holds are read from
    /// its blocks, the rest (raw blocks not rolled up yet, the head) are aggregated from raw
    /// samples as they are read, so the answer does not depend on how far rollup has got.
    /// Deleted buckets (any a deletion touches) are left out. Of the stored buckets only the
    /// aggregates in `columns` are read (the others are zero; buckets aggregated from raw
    /// samples have them all). `limits` bound each of the selections (tier blocks, raw data)
    /// and the decoding threads.
    ///
    /// Tiers hold no native histograms: if a matching series has histogram samples in the raw
    /// data read, nothing is handed over and the number of such series is returned (else 0).
    /// `Error::NoSuchTier` if no tier has that interval; an error from `sink` stops the read.
    #[allow(clippy::too_many_arguments, reason = "a selection's range, limits and its consumer")]
    pub fn rollup_map<T: Send>(
        &self,
        tier: RollupMeta,
        matchers: &[Matcher],
        mint: i64,
        maxt: i64,
        columns: ColumnSet,
        limits: &ReadLimits<'_>,
        map: &(dyn Fn(&RollupSeries) -> T + Sync),
        sink: &mut dyn FnMut(T) -> Result<()>,
    ) -> Result<usize> {
        let tier = self.tier_of(tier)?;
        self.inner.map_buckets(tier, matchers, mint, maxt, columns, limits, map, sink)
    }

    fn tier_of(&self, tier: RollupMeta) -> Result<&Tier> {
        self.inner.tiers.iter().find(|t| t.spec.meta() == tier).ok_or(Error::NoSuchTier { tier })
    }

    /// `rollup_map`'s series, collected.
    pub fn rollup_select(
        &self,
        tier: RollupMeta,
        matchers: &[Matcher],
        mint: i64,
        maxt: i64,
        columns: ColumnSet,
        limits: &ReadLimits<'_>,
    ) -> Result<RollupSelection> {
        let mut series = Vec::new();
        let histogram_series =
            self.rollup_map(tier, matchers, mint, maxt, columns, limits, &RollupSeries::clone, &mut |s| {
                series.push(s);
                Ok(())
            })?;
        Ok(RollupSelection { series, histogram_series })
    }
}

impl Inner {
    /// Replaces `remove` by `add` among tier `t`'s blocks, and notes the change of their time
    /// range in the change log (after the swap), for readers that keep answers from tiers.
    fn swap_tier(&self, t: &Tier, remove: &[Arc<Block>], add: Option<Arc<Block>>) {
        let range = remove
            .iter()
            .chain(add.iter())
            .map(|b| (b.meta().min_time, b.meta().max_time))
            .reduce(|a, b| (a.0.min(b.0), a.1.max(b.1)));
        swap_in(&t.blocks, remove, add);
        if let Some((min, max)) = range {
            // Block ranges are `[min, max)`.
            self.head.changes.note_tiers(min, (max - 1).max(min));
        }
    }
}

/// The raw blocks (by their first ULIDs) block `b` holds the samples of.
fn block_sources(b: &Block) -> impl Iterator<Item = &str> {
    b.meta().compaction.sources.iter().map(String::as_str)
}

/// Whether the sorted sources `mine` hold `source`.
fn has_source(mine: &[String], source: &str) -> bool {
    mine.binary_search_by(|m| m.as_str().cmp(source)).is_ok()
}

/// Whether two blocks' time ranges (`[min, max)`) overlap.
fn overlap(a: &Block, b: &Block) -> bool {
    a.meta().min_time < b.meta().max_time && b.meta().min_time < a.meta().max_time
}

/// Whether another block of `blocks` overlaps `b` in time (their samples may be the same
/// ones, or interleave: such raw blocks are merged before they are rolled up).
fn overlaps_another(blocks: &[Arc<Block>], b: &Arc<Block>) -> bool {
    blocks.iter().any(|o| !Arc::ptr_eq(o, b) && overlap(o, b))
}

/// Whether the head's samples (its inclusive range `head`) reach into block `b`'s `[min, max)`.
fn overlaps_head(head: Option<(i64, i64)>, b: &Block) -> bool {
    head.is_some_and(|(lo, hi)| b.meta().min_time <= hi && lo < b.meta().max_time)
}

fn holds(sources: &HashSet<String>, b: &Block) -> bool {
    b.meta().compaction.sources.iter().all(|s| sources.contains(s))
}

/// Whether tier block `c` holds some of the raw `sources` together with other raw blocks'
/// data: it holds a part of them only (late data merged into one of its raw blocks), or, with
/// `whole_too`, all of them and more (a coarse block, one of whose raw blocks retention
/// deletes).
fn holds_part_with_others(c: &Block, sources: &[String], whole_too: bool) -> bool {
    let theirs = &c.meta().compaction.sources;
    let shared = theirs.iter().filter(|s| has_source(sources, s)).count();
    shared > 0 && shared < theirs.len() && (whole_too || shared < sources.len())
}

/// The raw blocks as the merges of tier blocks over them (coarse and filling-window blocks)
/// see them.
struct RawView {
    raw: Arc<Vec<Arc<Block>>>,
    /// The head's time range.
    head: Option<(i64, i64)>,
    /// The newest time late writes cannot reach any more (`Inner::raw_view`): a raw block
    /// ending at or before it gets no late samples but a backfill's.
    horizon: i64,
}

impl RawView {
    /// Where the window (of `window`) of the oldest raw block ends: merging before it would be
    /// undone, as it is the window retention reaches first, and a tier block holding several
    /// raw blocks is dropped when retention deletes one of them (`roll_up`). `None`: no raw
    /// block.
    fn first_window_end(&self, window: i64) -> Option<i64> {
        let oldest = self.raw.iter().map(|b| b.meta().min_time).min()?;
        Some((oldest.div_euclid(window) + 1).saturating_mul(window))
    }

    /// Whether late data can no longer merge into raw block `x`: it ends by the horizon,
    /// overlaps no other raw block nor the head, and has no deletions.
    fn settled(&self, x: &Arc<Block>) -> bool {
        x.meta().max_time <= self.horizon
            && x.tombstones().is_empty()
            && !overlaps_another(&self.raw, x)
            && !overlaps_head(self.head, x)
    }

    /// The raw blocks holding some of the sources `mine` (sorted).
    fn sharing<'a>(&'a self, mine: &'a [String]) -> impl Iterator<Item = &'a Arc<Block>> + 'a {
        self.raw.iter().filter(|x| block_sources(x).any(|s| has_source(mine, s)))
    }

    /// Tier `t`'s blocks that may be merged into coarse blocks (windows of `coarse`) while
    /// their raw blocks remain, sorted by start, past the oldest raw block's window. Each holds
    /// exactly the sources of the raw blocks its sources are in, and those are settled and at
    /// the largest raw range `base` (never merged side by side again).
    fn coarse_candidates(&self, t: &Tier, base: i64, coarse: i64) -> Vec<Arc<Block>> {
        let Some(first_window_end) = self.first_window_end(coarse) else { return Vec::new() };
        let mut out: Vec<Arc<Block>> = live(&t.blocks.read())
            .into_iter()
            .filter(|b| {
                let mine = &b.meta().compaction.sources;
                if b.meta().min_time < first_window_end || !b.tombstones().is_empty() {
                    return false;
                }
                let theirs: Vec<&Arc<Block>> = self.sharing(mine).collect();
                let covered: usize = theirs.iter().map(|x| x.meta().compaction.sources.len()).sum();
                !theirs.is_empty()
                    && covered == mine.len()
                    && theirs.iter().all(|x| {
                        x.meta().max_time - x.meta().min_time >= base
                            && self.settled(x)
                            && block_sources(x).all(|s| has_source(mine, s))
                    })
            })
            .collect();
        out.sort_by(|a, b| (a.meta().min_time, a.ulid()).cmp(&(b.meta().min_time, b.ulid())));
        out
    }

    /// Tier `t`'s blocks of the first window (of `window`, aligned as raw compaction aligns its
    /// own; past the oldest raw block's) where at least `FILLING_WINDOW_BLOCKS` may be merged,
    /// whether or not the window is closed. A block may be merged when it lies within the
    /// window, without deletions, and each raw block sharing a source with it is settled and
    /// has all its sources among the window's tier blocks: raw compaction merging raw blocks
    /// of the window after the tier merged some of their tier blocks (the tier holds the merged
    /// block's sources, cut otherwise) does not keep those from being merged again. Merging
    /// only blocks each of one raw block (`coarse_candidates`' rule) left more blocks in the
    /// newest windows than following raw compaction (the steady-state test: 4.99 blocks over
    /// the newest 50 raw block ranges on average, raw 4.60; this rule: 3.01).
    fn filling_group(&self, t: &Tier, window: i64) -> Option<Vec<Arc<Block>>> {
        let first_window_end = self.first_window_end(window)?;
        let window_of = |b: &Arc<Block>| {
            let start = b.meta().min_time.div_euclid(window).saturating_mul(window);
            (b.meta().max_time <= start.saturating_add(window)).then_some(start)
        };
        let mut blocks: Vec<(i64, Arc<Block>)> = live(&t.blocks.read())
            .into_iter()
            .filter(|b| b.meta().min_time >= first_window_end && b.tombstones().is_empty())
            .filter_map(|b| window_of(&b).map(|w| (w, b)))
            .collect();
        blocks.sort_by(|(_, a), (_, b)| (a.meta().min_time, a.ulid()).cmp(&(b.meta().min_time, b.ulid())));
        for same in blocks.chunk_by(|a, b| a.0 == b.0) {
            let held: HashSet<&str> = same.iter().flat_map(|(_, b)| block_sources(b)).collect();
            let group: Vec<Arc<Block>> = same
                .iter()
                .map(|(_, b)| b)
                .filter(|b| {
                    let mut theirs = self.sharing(&b.meta().compaction.sources).peekable();
                    theirs.peek().is_some()
                        && theirs.all(|x| self.settled(x) && block_sources(x).all(|s| held.contains(s)))
                })
                .cloned()
                .collect();
            if group.len() >= FILLING_WINDOW_BLOCKS {
                return Some(group);
            }
        }
        None
    }
}

/// The tiers whose directories `dir` holds, each kept forever: what a tool opening a data
/// directory without the server's configuration uses, so that it reads and keeps them.
pub fn discover_tiers(fs: &dyn Vfs, dir: &Path) -> Vec<RollupTier> {
    let Ok(entries) = fs.list(&dir.join(ROLLUPS_DIR)) else { return Vec::new() };
    let mut tiers: Vec<RollupTier> =
        entries.iter().filter(|e| e.is_dir).filter_map(|e| RollupTier::from_dir_name(&e.name)).collect();
    tiers.sort_by_key(|t| (t.closed, t.interval_ms));
    tiers
}

/// Opens the configured tiers' directories (created if missing). Tier directories on disk that
/// are not configured are left alone, with a warning: a configuration change never deletes data.
pub(super) fn open_tiers(fs: &Arc<dyn Vfs>, dir: &Path, tiers: &[RollupTier]) -> Result<Vec<Tier>> {
    let root = dir.join(ROLLUPS_DIR);
    if let Ok(entries) = fs.list(&root) {
        for e in entries.iter().filter(|e| e.is_dir) {
            if !tiers.iter().any(|t| t.dir_name() == e.name) {
                tracing::warn!(dir = %root.join(&e.name).display(), "a rollup tier directory that is not configured; left alone and not read");
            }
        }
    }
    let mut out = Vec::with_capacity(tiers.len());
    for t in tiers {
        let tier_dir = root.join(t.dir_name());
        create_dir_all(&**fs, &tier_dir)?;
        let blocks = open_blocks(fs, &tier_dir, Some(t.meta()))?;
        out.push(Tier { spec: *t, dir: tier_dir, blocks: RwLock::new(Arc::new(blocks)) });
    }
    Ok(out)
}

impl Inner {
    /// Rolls up every raw block some tier lacks that overlaps no other raw block. Returns how
    /// many raw blocks were.
    pub(super) fn roll_up_settled(&self) -> Result<usize> {
        if self.tiers.is_empty() {
            return Ok(0);
        }
        let raw = self.blocks.read().clone();
        let mut n = 0;
        for b in raw.iter().filter(|b| !overlaps_another(&raw, b)) {
            n += self.roll_up(b, false)? as usize;
        }
        Ok(n)
    }

    /// After compaction merged the raw blocks `group` into `out`: merges each tier's blocks of
    /// them the same way, when the group's blocks were side by side (no overlap) without
    /// deletions and the tier's blocks hold exactly `out`'s sources; the result is the rollup
    /// of `out`, exactly (the blocks' samples do not interleave). Otherwise nothing is done:
    /// `out` is rolled up from raw data if the tier does not hold it. A failure is logged and
    /// harmless: the tier's blocks still hold the data.
    pub(super) fn merge_tiers_in_step(&self, group: &[Arc<Block>], out: &BlockMeta) {
        if self.tiers.is_empty() || group.iter().any(|b| !b.tombstones().is_empty()) {
            return;
        }
        let overlap = group.iter().enumerate().any(|(i, a)| {
            group[i + 1..]
                .iter()
                .any(|b| a.meta().min_time < b.meta().max_time && b.meta().min_time < a.meta().max_time)
        });
        if overlap {
            return;
        }
        let mine = &out.compaction.sources;
        for t in &self.tiers {
            let inputs: Vec<Arc<Block>> = live(&t.blocks.read())
                .into_iter()
                .filter(|r| r.meta().compaction.sources.iter().all(|s| has_source(mine, s)))
                .collect();
            let held: HashSet<&str> =
                inputs.iter().flat_map(|r| r.meta().compaction.sources.iter().map(String::as_str)).collect();
            if inputs.len() < 2 || held.len() != mine.len() || inputs.iter().any(|r| !r.tombstones().is_empty()) {
                continue;
            }
            match merge_tier_blocks(&t.dir, t.spec.meta(), &inputs) {
                Ok(meta) => {
                    let block = meta.map(|m| Arc::new(Block::written(&self.fs, &t.dir.join(&m.ulid), m)));
                    self.swap_tier(t, &inputs, block);
                    self.stats.rollup_compactions.fetch_add(1, Ordering::Relaxed);
                    for r in &inputs {
                        if let Err(e) = self.delete_unlisted_from(&t.blocks, r) {
                            tracing::warn!(tier = %t.spec, error = %e, "could not delete a merged rollup block; retrying later");
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(tier = %t.spec, error = %e, "merging rollup blocks along with their raw blocks failed; they stay as they are");
                }
            }
        }
    }

    /// Writes `raw`'s rollup for every tier that lacks it; true if any did. In a tier that
    /// lacks it, a coarse tier block that holds part of `raw`'s data beside other raw blocks'
    /// (late data merged into one of its raw blocks), or with `for_deletion` in any tier any
    /// coarse block holding `raw` with others, is dropped first (`drop_coarse`), and the other
    /// raw blocks it held are rolled up again one by one after `raw`. A tier that holds every
    /// source of `raw` holds its samples (a source is rolled up only while it overlaps no
    /// other raw block, so `raw` is a side-by-side merge of them), however its blocks cut them.
    fn roll_up(&self, raw: &Arc<Block>, for_deletion: bool) -> Result<bool> {
        let mine = &raw.meta().compaction.sources;
        let mut dropped: HashSet<String> = HashSet::new();
        for t in &self.tiers {
            let listed = live(&t.blocks.read());
            if !for_deletion && holds(&tier_sources(&listed), raw) {
                continue;
            }
            for c in listed.iter().filter(|c| holds_part_with_others(c, mine, for_deletion)) {
                self.drop_coarse(t, c, raw)?;
                dropped.extend(c.meta().compaction.sources.iter().cloned());
            }
        }
        let rolled = self.roll_up_one(raw)?;
        if dropped.is_empty() {
            return Ok(rolled);
        }
        let blocks = self.blocks.read().clone();
        for x in blocks.iter().filter(|x| !Arc::ptr_eq(x, raw)) {
            if !overlaps_another(&blocks, x) && block_sources(x).any(|s| dropped.contains(s)) {
                self.roll_up_one(x)?;
            }
        }
        Ok(true)
    }

    /// Unlists and deletes coarse tier block `c` of tier `t`, whose raw blocks all remain: read
    /// raw until they are rolled up again, they answer exactly as `c` did. Rewriting `c`
    /// without one raw block's part cannot be exact (a bucket at a block boundary holds samples
    /// of both sides, combined), and dropping it first keeps a crash from leaving both `c` and
    /// a newer rollup of the same samples.
    fn drop_coarse(&self, t: &Tier, c: &Arc<Block>, because: &Block) -> Result<()> {
        self.swap_tier(t, std::slice::from_ref(c), None);
        self.stats.rollup_coarse_blocks_dropped.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            tier = %t.spec, ulid = c.ulid(), raw = because.ulid(),
            "dropped a coarse rollup block to roll its raw blocks up again one by one"
        );
        self.delete_unlisted_from(&t.blocks, c)
    }

    /// `roll_up` without the coarse blocks.
    fn roll_up_one(&self, raw: &Arc<Block>) -> Result<bool> {
        let needing: Vec<&Tier> = self.tiers.iter().filter(|t| !holds(&t.sources(), raw)).collect();
        if needing.is_empty() {
            return Ok(false);
        }
        let started = std::time::Instant::now();
        let filter = self.opts.rollup_filter.as_ref();
        let targets: Vec<Target<'_>> = needing.iter().map(|t| Target { tier: t.spec, dir: &t.dir, filter }).collect();
        let rolled = roll_up_block(raw, &targets).inspect_err(|e| raw.mark_corrupt_if(e))?;
        self.stats.rollup_histogram_series_skipped.fetch_add(rolled.histogram_series, Ordering::Relaxed);
        for (t, meta) in needing.iter().zip(rolled.blocks) {
            // Rollups of raw blocks this one has absorbed (late data merged in) are replaced.
            let mine = &raw.meta().compaction.sources;
            let replaced: Vec<Arc<Block>> = t
                .blocks
                .read()
                .iter()
                .filter(|r| r.meta().compaction.sources.iter().all(|s| has_source(mine, s)))
                .cloned()
                .collect();
            let block = Arc::new(Block::written(&self.fs, &t.dir.join(&meta.ulid), meta));
            self.swap_tier(t, &replaced, Some(block));
            self.stats.rollup_blocks_written.fetch_add(1, Ordering::Relaxed);
            for r in &replaced {
                self.delete_unlisted_from(&t.blocks, r)?;
            }
        }
        tracing::info!(
            raw = raw.ulid(),
            tiers = needing.len(),
            histogram_series_skipped = rolled.histogram_series,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "rolled up a raw block"
        );
        Ok(true)
    }

    /// Whether retention may delete raw block `b`: every tier holds it, rolling it up first
    /// if one does not. A failed rollup keeps the block (and is logged), and so does one that
    /// overlaps another raw block: their samples may be the same ones (a head range cut again
    /// after a crash), which only compaction's merge counts once; it is rolled up merged.
    pub(super) fn rolled_up_for_deletion(&self, b: &Arc<Block>) -> bool {
        if self.tiers.is_empty() {
            return true;
        }
        let overlapped = overlaps_another(&self.blocks.read(), b);
        if overlapped && !self.tiers.iter().all(|t| holds(&t.sources(), b)) {
            tracing::warn!(
                block = b.ulid(),
                "retention waits for a block that overlaps another to be merged before it is rolled up"
            );
            return false;
        }
        match self.roll_up(b, true) {
            Ok(_) => true,
            Err(e) => {
                tracing::error!(block = b.ulid(), error = %e, "could not roll up a block retention would delete; it is kept");
                false
            }
        }
    }

    /// Merges each tier's blocks whose raw blocks are all gone, as compaction merges raw ones.
    pub(super) fn compact_tiers(&self, raw_ranges: &[i64]) -> Result<usize> {
        if self.tiers.is_empty() {
            return Ok(0);
        }
        let raw_sources: HashSet<String> =
            self.blocks.read().iter().flat_map(|b| b.meta().compaction.sources.iter().cloned()).collect();
        let mut n = 0;
        for t in &self.tiers {
            let ranges = t.ranges(raw_ranges);
            // Replaced blocks left listed by a refused deletion: deleted now, if the disk lets.
            let listed = t.blocks.read().clone();
            let kept = live(&listed);
            let replaced: Vec<Arc<Block>> =
                listed.iter().filter(|b| !kept.iter().any(|k| Arc::ptr_eq(k, b))).cloned().collect();
            if !replaced.is_empty() {
                self.swap_tier(t, &replaced, None);
                for b in &replaced {
                    self.delete_unlisted_from(&t.blocks, b)?;
                }
            }
            loop {
                let blocks = live(&t.blocks.read());
                let settled: Vec<Arc<Block>> = blocks
                    .iter()
                    .filter(|b| !b.meta().compaction.sources.iter().any(|s| raw_sources.contains(s)))
                    .cloned()
                    .collect();
                let Some(group) = compact::plan(&settled, &ranges) else { break };
                self.merge_tier_group(t, &group, "compacted rollup blocks")?;
                n += 1;
            }
            // Blocks of settled raw blocks, merged while those remain: coarse blocks of raw
            // blocks at the largest range (`coarse_candidates`), and blocks of a raw window
            // still filling (`filling_group`).
            let raw = self.raw_view();
            if let [base, coarse, ..] = ranges[..] {
                loop {
                    let candidates = raw.coarse_candidates(t, base, coarse);
                    let Some(group) = compact::plan(&candidates, &[base, coarse]) else { break };
                    self.merge_tier_group(t, &group, "merged rollup blocks of settled raw blocks")?;
                    n += 1;
                }
            }
            if let Some(window) = t.filling_window(raw_ranges) {
                while let Some(group) = raw.filling_group(t, window) {
                    self.merge_tier_group(t, &group, "merged rollup blocks of a filling raw window")?;
                    n += 1;
                }
            }
        }
        Ok(n)
    }

    /// The raw blocks as merges of tier blocks over them see them now. The horizon is the
    /// newest sample less the widest late-write window (`DbOptions::late_window_ms`, the
    /// head's out-of-order window).
    fn raw_view(&self) -> RawView {
        let late = self.opts.late_window_ms.max(self.opts.head.out_of_order.window_ms);
        RawView {
            raw: self.blocks.read().clone(),
            head: self.head.time_range(),
            horizon: self.newest_sample().map_or(i64::MIN, |n| n.saturating_sub(late)),
        }
    }

    /// The newest sample's timestamp, in the head, raw blocks or tiers.
    fn newest_sample(&self) -> Option<i64> {
        let mut newest = self.head.time_range().map(|r| r.1);
        for list in std::iter::once(&self.blocks).chain(self.tiers.iter().map(|t| &t.blocks)) {
            let last = list.read().iter().map(|b| b.meta().max_time - 1).max();
            newest = newest.max(last);
        }
        newest
    }

    /// Merges tier `t`'s blocks `group` into one, listed in their place.
    fn merge_tier_group(&self, t: &Tier, group: &[Arc<Block>], what: &'static str) -> Result<()> {
        let started = std::time::Instant::now();
        let meta = merge_tier_blocks(&t.dir, t.spec.meta(), group).inspect_err(|e| {
            for b in group {
                b.mark_corrupt_if(e);
            }
        })?;
        let out = meta.as_ref().map(|m| Arc::new(Block::written(&self.fs, &t.dir.join(&m.ulid), m.clone())));
        self.swap_tier(t, group, out);
        for b in group {
            self.delete_unlisted_from(&t.blocks, b)?;
        }
        self.stats.rollup_compactions.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            tier = %t.spec, inputs = group.len(), output = ?meta.as_ref().map(|m| &m.ulid),
            elapsed_ms = started.elapsed().as_millis() as u64, "{what}"
        );
        Ok(())
    }

    /// Deletes tier blocks entirely older than their tier's retention behind the newest sample.
    pub(super) fn apply_tier_retention(&self) -> Result<usize> {
        let Some(newest) = self.newest_sample() else { return Ok(0) };
        let mut gone = 0;
        for t in self.tiers.iter().filter(|t| t.spec.retention_ms > 0) {
            let cutoff = newest.saturating_sub(t.spec.retention_ms);
            let doomed: Vec<Arc<Block>> =
                t.blocks.read().iter().filter(|b| b.meta().max_time <= cutoff).cloned().collect();
            if doomed.is_empty() {
                continue;
            }
            self.swap_tier(t, &doomed, None);
            for b in &doomed {
                tracing::info!(tier = %t.spec, ulid = b.ulid(), min_time = b.meta().min_time, max_time = b.meta().max_time, "rollup retention deletes block");
                self.delete_unlisted_from(&t.blocks, b)?;
                gone += 1;
            }
        }
        self.stats.rollup_blocks_deleted_by_retention.fetch_add(gone as u64, Ordering::Relaxed);
        Ok(gone)
    }

    #[allow(clippy::too_many_arguments, reason = "Db::rollup_map's arguments, passed through")]
    fn map_buckets<T: Send>(
        &self,
        tier: &Tier,
        matchers: &[Matcher],
        mint: i64,
        maxt: i64,
        columns: ColumnSet,
        limits: &ReadLimits<'_>,
        map: &(dyn Fn(&RollupSeries) -> T + Sync),
        sink: &mut dyn FnMut(T) -> Result<()>,
    ) -> Result<usize> {
        // Each series lent to `map`, its buffer kept for the next.
        let map = |s: RollupSeries| {
            let mapped = map(&s);
            buffers::give_columns(s.buckets);
            mapped
        };
        let (interval, closed) = (tier.spec.interval_ms, tier.spec.closed);
        let (first_end, last_end) = (closed.bucket_end(mint, interval), closed.bucket_end(maxt, interval));
        // Every sample of those buckets.
        let (lo, hi) = (closed.span(first_end, interval).0, closed.span(last_end, interval).1);
        let raw = self.blocks.read().clone();
        let stored = live(&tier.blocks.read());
        let held = tier_sources(&stored);
        // Raw blocks the tier does not hold are read raw, and so are held ones whose time they
        // or the head overlap (late data not merged yet; samples a crash left both in a block
        // and in the log, replayed into the head): their samples interleave or repeat, and
        // only the raw read, which merges them by timestamp, aggregates them exactly.
        // Only the head's samples of the series this read selects can interleave with a held
        // block's: the head's whole range (other series, such as the server's own metrics
        // scraped since a backfill, or one late series) would send every series of the block
        // through the raw path. Narrowed only when the whole range reaches a held block.
        let mut head = self.head.time_range();
        if raw.iter().any(|b| holds(&held, b) && overlaps_head(head, b)) {
            head = self.head.time_range_of(matchers);
        }
        let mut read_raw: Vec<bool> = raw.iter().map(|b| !holds(&held, b) || overlaps_head(head, b)).collect();
        // A tier block some of whose raw data is read raw (merged with late samples since, or
        // overlapped by them) is left out: that raw data is read instead, and so is the rest of
        // what it holds (a coarse block holds several raw blocks, which all remain).
        let mut unheld_sources: HashSet<&str> = HashSet::new();
        let mut grew = true;
        while grew {
            grew = false;
            for i in 0..raw.len() {
                if !read_raw[i] && (0..raw.len()).any(|j| read_raw[j] && overlap(&raw[i], &raw[j])) {
                    read_raw[i] = true;
                    grew = true;
                }
            }
            unheld_sources =
                raw.iter().zip(&read_raw).filter(|(_, r)| **r).flat_map(|(b, _)| block_sources(b)).collect();
            let left_out: HashSet<&str> = stored
                .iter()
                .filter(|r| block_sources(r).any(|s| unheld_sources.contains(s)))
                .flat_map(|r| block_sources(r))
                .collect();
            for (b, r) in raw.iter().zip(read_raw.iter_mut()) {
                if !*r && block_sources(b).any(|s| left_out.contains(s)) {
                    *r = true;
                    grew = true;
                }
            }
        }
        let unheld_raw: Vec<Arc<Block>> =
            raw.iter().zip(&read_raw).filter(|(_, r)| **r).map(|(b, _)| b.clone()).collect();
        let fresh: Vec<Arc<Block>> =
            stored.iter().filter(|r| !block_sources(r).any(|s| unheld_sources.contains(s))).cloned().collect();

        // The raw part first (it is the newest data, usually small): it decides whether a
        // native histogram matches.
        self.stats.rollup_raw_blocks_read.fetch_add(unheld_raw.len() as u64, Ordering::Relaxed);
        let unheld: BlockList = RwLock::new(Arc::new(unheld_raw));
        let mut from_raw = Vec::new();
        let mut histogram_series = 0;
        // Archive values are kept for buckets the raw part holds whole: none of a tier block's
        // range in their span (those are combined with the block's part, or lost a deleted part).
        let mut fresh_ranges: Vec<(i64, i64)> = fresh.iter().map(|b| (b.meta().min_time, b.meta().max_time)).collect();
        fresh_ranges.sort_unstable();
        // The latest end among the ranges starting at or before each one (ranges are `[min, max)`).
        let reach: Vec<i64> = fresh_ranges
            .iter()
            .scan(i64::MIN, |m, r| {
                *m = (*m).max(r.1);
                Some(*m)
            })
            .collect();
        let whole = |b: &Bucket| {
            let (first, last) = closed.span(b.end, interval);
            let starting_before = fresh_ranges.partition_point(|r| r.0 <= last);
            starting_before == 0 || reach[starting_before - 1] <= first
        };
        let filter = self.opts.rollup_filter.as_ref();
        // Selection (index reads of every block in range) is spread over the query's threads
        // too: over a month of tier blocks it was a sixth to a quarter of a query, on one thread.
        let cores = || std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = if limits.threads > 0 { limits.threads } else { cores() }.min(PARALLEL_THREADS_MAX);
        let raw_part = Querier::with_blocks(&self.head, &unheld, lo, hi).with_limits(limits).parallelism(threads);
        for s in raw_part.select(matchers)? {
            let rule = filter.and_then(|f| f.archive_rule(&tier.spec, &s.labels));
            let archived = rule.is_some();
            let mut agg = Aggregator::closed(interval, closed).with_archive(rule);
            let mut buckets = Vec::new();
            let mut one = [strata_model::Sample { t: 0, v: 0.0 }];
            let mut histograms = false;
            s.visit(|x| match x.value {
                crate::chunkenc::TypedValue::Float(v) => {
                    one[0] = strata_model::Sample { t: x.t, v };
                    agg.add(&one, &mut buckets);
                }
                crate::chunkenc::TypedValue::Histogram(_) => histograms = true,
            })
            .map_err(|e| Error::BlockCorrupt {
                block: Default::default(),
                reason: format!("series {}: {e}", s.labels),
            })?;
            agg.finish(&mut buckets);
            if archived {
                for b in buckets.iter_mut().filter(|b| !whole(b)) {
                    b.archive = ArchiveValue::NotKept;
                }
            }
            histogram_series += histograms as usize;
            if !buckets.is_empty() {
                let mut held = buffers::take_columns(columns, buckets.len());
                held.extend_from_buckets(&buckets);
                from_raw.push(RollupSeries { labels: s.labels, buckets: held });
            }
        }
        if histogram_series > 0 {
            return Ok(histogram_series);
        }

        // Then the tier's blocks, a series at a time, each merged with its raw part. Series
        // are decoded on all cores in batches, handed over in label order.
        let fresh: BlockList = RwLock::new(Arc::new(fresh));
        let selected = Querier::with_blocks(&self.head, &fresh, lo, hi)
            .with_limits(limits)
            .without_head()
            .parallelism(threads)
            .select(matchers)?;
        // Each tier series' raw part (both sides are in label order), and the series only the
        // raw part has, each with the position among the tier's series it is handed over at.
        let mut raw_parts: Vec<Option<RollupSeries>> = Vec::with_capacity(selected.len());
        let mut raw_only: Vec<(usize, RollupSeries)> = Vec::new();
        let mut from_raw = from_raw.into_iter().peekable();
        for (i, s) in selected.iter().enumerate() {
            while let Some(r) = from_raw.next_if(|r| r.labels < s.labels) {
                raw_only.push((i, r));
            }
            raw_parts.push(from_raw.next_if(|r| r.labels == s.labels));
        }
        raw_only.extend(from_raw.map(|r| (selected.len(), r)));
        // A tier series' buckets, merged with its raw part, mapped (on a decoding worker).
        let decode_one = |i: usize, s: &crate::querier::Series| -> Result<Option<T>> {
            let chunks = s.chunks.iter().map(|c| c.data.bytes()).collect::<Result<Vec<_>, _>>();
            let chunks = chunks.map_err(|e| corrupt_tier(tier, &s.labels, e))?;
            // The column lengths are read one after the other, each a jump over the column
            // before it: fetched from memory one at a time, they were a twelfth of a month-long
            // tier query's CPU, stalled. Asked for all at once first, the misses overlap.
            for bytes in &chunks {
                prefetch(bytes);
            }
            // Room for every bucket at once (the count is in each chunk's header), in buffers
            // an earlier series or read used (`rollup::buffers`).
            let mut buckets = buffers::take_columns(columns, chunks.iter().map(|c| bucket_count(c)).sum());
            // Whether the buckets' ends increase across the chunks' seams too (a chunk's own
            // ends increase, as `decode` checks): then there is nothing to coalesce, found
            // without walking every bucket again.
            let mut ends_increase = true;
            for (k, bytes) in chunks.iter().enumerate() {
                let seam = buckets.ends().last().copied();
                let at = buckets.len();
                decode_columns(bytes, &mut buckets).map_err(|e| corrupt_tier(tier, &s.labels, e))?;
                ends_increase &= seam.zip(buckets.ends().get(at)).is_none_or(|(before, &end)| before < end);
                if k == 0 {
                    // Buckets before the range are dropped while they are all there is (the
                    // first chunk, in time order): dropped at the end, the rest of a long read
                    // would move over them. Those of later chunks are dropped below.
                    buckets.drop_front(buckets.partition_point(|&end| end < first_end));
                }
            }
            if !ends_increase {
                buckets.edit(coalesce);
            }
            debug_assert!(buckets.ends().windows(2).all(|p| p[0] < p[1]), "coalesced buckets");
            // The buckets of the range (ends in order now), without those a deletion touches.
            buckets.truncate(buckets.partition_point(|&end| end <= last_end));
            buckets.drop_front(buckets.partition_point(|&end| end < first_end));
            if !s.deleted_intervals().is_empty() {
                let meta = tier.spec.meta();
                buckets.edit(|b| b.retain(|b| !deleted_touches(s.deleted_intervals(), b, meta)));
            }
            if let Some(raw_part) = &raw_parts[i] {
                buckets.append_runs(&raw_part.buckets);
            }
            debug_assert!(buckets.is_consistent());
            if buckets.is_empty() {
                buffers::give_columns(buckets);
                return Ok(None);
            }
            Ok(Some(map(RollupSeries { labels: s.labels.clone(), buckets })))
        };
        // Hands over, in label order, the raw-only series due before tier series `i`, then
        // that series' result.
        let mut raw_only = raw_only.into_iter().peekable();
        let mut emit = |i: usize, mapped: Option<T>| -> Result<()> {
            while let Some((_, r)) = raw_only.next_if(|(at, _)| *at <= i) {
                sink(map(r))?;
            }
            mapped.map_or(Ok(()), &mut *sink)
        };
        if threads <= 1 || selected.len() < PARALLEL_SERIES_MIN {
            for (i, s) in selected.iter().enumerate() {
                let mapped = decode_one(i, s)?;
                emit(i, mapped)?;
            }
        } else {
            // Worker w decodes and maps batches w, w+T, …; this thread takes them in turn, so
            // results arrive in label order while a few batches are decoded ahead.
            let batches: Vec<&[crate::querier::Series]> = selected.chunks(PARALLEL_BATCH).collect();
            // On the kept workers: threads started for each query cost their start, their
            // stacks' page faults and their exit (a twentieth of a month-long tier query).
            crate::workers::scope(|scope| -> Result<()> {
                let mut rxs = Vec::with_capacity(threads);
                for w in 0..threads {
                    let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Vec<Option<T>>>>(2);
                    rxs.push(rx);
                    let (batches, decode_one) = (&batches, &decode_one);
                    scope.spawn(move || {
                        for b in (w..batches.len()).step_by(threads) {
                            let first = b * PARALLEL_BATCH;
                            let r: Result<Vec<Option<T>>> =
                                batches[b].iter().enumerate().map(|(j, s)| decode_one(first + j, s)).collect();
                            let failed = r.is_err();
                            if tx.send(r).is_err() || failed {
                                return;
                            }
                        }
                    });
                }
                for b in 0..batches.len() {
                    let mapped = rxs[b % threads].recv().map_err(|_| Error::BlockCorrupt {
                        block: tier.dir.clone(),
                        reason: "a rollup decoding worker stopped".into(),
                    })??;
                    for (j, m) in mapped.into_iter().enumerate() {
                        emit(b * PARALLEL_BATCH + j, m)?;
                    }
                }
                Ok(())
            })?;
        }
        emit(selected.len(), None)?;
        Ok(0)
    }

    pub(super) fn tier_status(&self) -> Vec<TierStatus> {
        self.tiers
            .iter()
            .map(|t| {
                let blocks = t.blocks.read().clone();
                TierStatus {
                    tier: t.spec,
                    bytes: blocks.iter().map(|b| b.bytes()).sum(),
                    block_bytes: blocks.iter().map(|b| b.bytes()).collect(),
                    blocks: blocks.iter().map(|b| b.meta().clone()).collect(),
                }
            })
            .collect()
    }

    /// Applies a deletion to every tier's blocks too (a bucket any deleted interval touches is
    /// dropped by readers and tier merges).
    pub(super) fn delete_in_tiers(&self, matchers: &[strata_model::Matcher], mint: i64, maxt: i64) -> Result<usize> {
        let mut n = 0;
        for t in &self.tiers {
            for b in t.blocks.read().clone().iter() {
                n += b.delete(matchers, mint, maxt).inspect_err(|e| b.mark_corrupt_if(e))?;
            }
        }
        Ok(n)
    }

    /// Hard-links every tier's blocks into `to/rollups/<tier>/` (a snapshot).
    pub(super) fn link_tiers(&self, to: &Path) -> Result<()> {
        for t in &self.tiers {
            let dir = to.join(ROLLUPS_DIR).join(t.spec.dir_name());
            create_dir_all(&*self.fs, &dir)?;
            for b in t.blocks.read().iter() {
                super::link_tree(&*self.fs, b.dir(), &dir.join(b.ulid()))?;
            }
            fsync_dir(&*self.fs, &dir)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
