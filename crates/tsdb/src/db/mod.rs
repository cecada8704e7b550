//! The database: one data directory, one process. The head (with its WAL) takes writes; blocks
//! hold everything older; a background thread cuts the head into blocks, compacts them and
//! applies retention.
//!
//! ```text
//! data/
//! ├── lock                 held (flock) by the process that has the directory open
//! ├── wal/                 segments and checkpoints of the head
//! ├── 01J…/                a block (see `block`)
//! ├── 01J….tmp/            a block being written; removed on open if a crash left it
//! ├── 01J….corrupt/        a block that failed its checks, set aside for an operator
//! └── rollups/5m/01J…/     a rollup tier's blocks, one directory per tier (see `rollups`)
//! ```
//!
//! Consistency: the block list is swapped as a whole (`Arc<Vec>`), a new block is added before
//! the head is truncated, and compaction removes its inputs from the list only after its output
//! is durable and listed, then deletes them. A crash between those steps (or a deletion the
//! disk refused) leaves both output and inputs on disk; `open` removes every block whose
//! sources a higher-level block holds (`is_replaced`), however many compactions ago.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};
use strata_model::Matcher;

use crate::block::{writer::TMP_SUFFIX, Block, RollupMeta};
use crate::compact::{self, BLOCK_RANGE_MAX_MS};
use crate::error::{io_err, Error, Result};
use crate::fsutil::{create_dir_all, fsync_dir, rename_durable};
use crate::head::{Appender, Cardinality, Head, HeadOptions, OutOfOrder};
use crate::querier::{BlockList, Querier};
use crate::rollup::{RollupTier, SeriesFilter};
use crate::vfs::{OsFs, Vfs};
use crate::wal::{self, ReplayOutcome};

pub const LOCK_FILE: &str = "lock";
pub const WAL_DIR: &str = "wal";
pub use crate::head::chunk_files::CHUNKS_HEAD_DIR;
/// Suffix of a block directory set aside after failing its checks.
pub const CORRUPT_SUFFIX: &str = ".corrupt";
/// Suffix of a block directory being deleted (renamed first, so a crash never leaves half a
/// block under its real name).
pub const DELETING_SUFFIX: &str = ".tmp-for-deletion";
pub const RETENTION_DEFAULT_MS: i64 = 15 * 24 * 3600 * 1000;
/// Where `Db::snapshot` writes, inside the data directory.
pub const SNAPSHOTS_DIR: &str = "snapshots";

#[derive(Clone, Debug)]
pub struct DbOptions {
    pub head: HeadOptions,
    /// Blocks entirely older than this (behind the newest sample) are deleted; 0 keeps all.
    pub retention_ms: i64,
    /// The oldest blocks are deleted while blocks and WAL together exceed this; 0 = no limit.
    pub retention_bytes: u64,
    /// How often the background thread cuts, compacts and applies retention; `None` runs no
    /// thread (tests and tools call `compact` themselves).
    pub compact_interval: Option<Duration>,
    /// Rollup tiers, finest first (`rollup::check_tiers`); empty: none.
    pub rollups: Vec<RollupTier>,
    /// Which series each tier keeps; `None`: every one.
    pub rollup_filter: Option<SeriesFilter>,
    /// How far behind the newest sample writers other than the head's default appender may
    /// still write (carbon's out-of-order window), in milliseconds; the head's own window
    /// (`HeadOptions::out_of_order`) counts too. Rollup tiers merge their blocks of raw blocks
    /// only once late data cannot reach those any more: late data would undo the merge.
    pub late_window_ms: i64,
}

impl Default for DbOptions {
    fn default() -> Self {
        DbOptions {
            head: HeadOptions::default(),
            retention_ms: RETENTION_DEFAULT_MS,
            retention_bytes: 0,
            compact_interval: Some(Duration::from_secs(60)),
            rollups: Vec::new(),
            rollup_filter: None,
            late_window_ms: 0,
        }
    }
}

impl DbOptions {
    /// Compaction ranges: the block range ×3 up to 31 days or a tenth of the retention.
    pub fn compaction_ranges(&self) -> Vec<i64> {
        let base = self.head.chunk_range_ms;
        let mut max = BLOCK_RANGE_MAX_MS;
        if self.retention_ms > 0 {
            max = max.min(self.retention_ms / 10);
        }
        compact::ranges(base, max.max(base))
    }
}

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct DbStats {
    pub head_blocks_written: AtomicU64,
    pub compactions: AtomicU64,
    pub compaction_failures: AtomicU64,
    pub compaction_nanos_total: AtomicU64,
    pub blocks_deleted_by_retention: AtomicU64,
    pub blocks_set_aside: AtomicU64,
    /// Rounds of `shorten_wal`.
    pub wal_shortenings: AtomicU64,
    /// Passes over the head writing closed chunks out for `shorten_wal`, checkpoint or not.
    pub chunk_write_passes: AtomicU64,
    /// Rollup tier blocks written from raw blocks, tier merges, tier blocks deleted by their
    /// tier's retention, and series left out of rollups for holding native histograms.
    pub rollup_blocks_written: AtomicU64,
    pub rollup_compactions: AtomicU64,
    pub rollup_blocks_deleted_by_retention: AtomicU64,
    pub rollup_histogram_series_skipped: AtomicU64,
    /// Coarse tier blocks (merged while their raw blocks remain) dropped so that their raw
    /// blocks are rolled up again one by one: late data reached one, or retention deletes one.
    pub rollup_coarse_blocks_dropped: AtomicU64,
    /// Raw blocks that tier reads aggregated sample by sample: not rolled up yet, or
    /// overlapped by late samples of the series read (a block read so by every query that
    /// reaches it is a tier read's slow path).
    pub rollup_raw_blocks_read: AtomicU64,
}

/// What one `compact` call did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CompactOutcome {
    pub head_blocks: usize,
    pub compactions: usize,
    pub retention_deleted: usize,
    pub set_aside: usize,
    /// Raw blocks rolled up (into every tier that lacked them), and tier merges.
    pub rolled_up: usize,
    pub rollup_compactions: usize,
}

/// Counters at the last WAL checkpoint: the samples it kept, and the head's appended and
/// written-out sample counts then. Samples since are estimated to be in the log.
#[derive(Debug, Default, Clone, Copy)]
struct CheckpointMark {
    kept: u64,
    appended: u64,
    written: u64,
}

#[derive(Debug)]
struct Inner {
    fs: Arc<dyn Vfs>,
    dir: PathBuf,
    opts: DbOptions,
    head: Head,
    blocks: BlockList,
    /// The rollup tiers, finest first, as configured.
    tiers: Vec<rollups::Tier>,
    /// One compaction, head cut or retention pass at a time.
    compaction: Mutex<()>,
    /// `.tmp-for-deletion` directories whose removal failed (the block they held is gone from
    /// the list and, durably, from its name); each maintenance round tries again.
    leftovers: Mutex<Vec<PathBuf>>,
    replay: ReplayOutcome,
    stats: DbStats,
    /// What the WAL held at its last checkpoint, to judge whether the next one pays.
    at_checkpoint: Mutex<CheckpointMark>,
    /// The last finished WAL segment when `shorten_wal` last wrote chunks out but found too
    /// little written to checkpoint: it waits for the next segment before looking again (a
    /// pass reads every series; series of few samples each, as carbon paths are at first,
    /// kept it rescanning a million of them every second).
    persisted_without_checkpoint: Mutex<Option<u64>>,
    /// Held for the lifetime of the `Db`; the kernel releases it if the process dies.
    _lock: Box<dyn std::fmt::Debug + Send + Sync>,
}

#[derive(Debug)]
struct Background {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: JoinHandle<()>,
}

/// An open data directory.
#[derive(Debug)]
pub struct Db {
    inner: Arc<Inner>,
    background: Mutex<Option<Background>>,
}

/// What `strata status` prints.
#[derive(Debug, Clone)]
pub struct DbStatus {
    pub dir: PathBuf,
    pub series: u64,
    pub time_range: Option<(i64, i64)>,
    pub wal_segments: Vec<u64>,
    pub wal_bytes: u64,
    pub replay: ReplayOutcome,
    pub cardinality: Cardinality,
    pub blocks: Vec<crate::block::BlockMeta>,
    pub blocks_bytes: u64,
    /// Each block's bytes, in the order of `blocks`.
    pub block_bytes: Vec<u64>,
    /// The head's heap by part, and its chunk files (`memory.chunk_files`).
    pub memory: crate::head::HeadMemory,
    pub chunk_files: usize,
    /// The rollup tiers, finest first.
    pub tiers: Vec<TierStatus>,
}

impl Db {
    /// Opens (creating if needed) the data directory: takes the lock, cleans up what a crash
    /// left, opens the blocks, replays the WAL, starts the background thread.
    pub fn open(dir: &Path, opts: DbOptions) -> Result<Db> {
        Db::open_on(OsFs::shared(), dir, opts)
    }

    /// `open` on `fs` (a simulated disk in tests).
    pub fn open_on(fs: Arc<dyn Vfs>, dir: &Path, opts: DbOptions) -> Result<Db> {
        create_dir_all(&*fs, dir)?;
        let lock = lock_dir(&*fs, dir)?;
        remove_interrupted_snapshots(&*fs, dir)?;
        let blocks = open_blocks(&fs, dir, None)?;
        let tiers = rollups::open_tiers(&fs, dir, &opts.rollups)?;
        let started = Instant::now();
        let chunks_dir = dir.join(CHUNKS_HEAD_DIR);
        let (head, replay) = Head::open_with_chunk_files(fs.clone(), &dir.join(WAL_DIR), Some(&chunks_dir), opts.head)?;
        tracing::info!(
            dir = %dir.display(), blocks = blocks.len(), series = head.num_series(), records = replay.records,
            segments = replay.segments_read, elapsed_ms = started.elapsed().as_millis() as u64,
            "opened blocks and replayed write-ahead log"
        );
        let inner = Arc::new(Inner {
            fs,
            dir: dir.to_owned(),
            opts,
            head,
            blocks: RwLock::new(Arc::new(blocks)),
            tiers,
            compaction: Mutex::new(()),
            leftovers: Mutex::new(Vec::new()),
            replay,
            stats: DbStats::default(),
            at_checkpoint: Mutex::new(CheckpointMark::default()),
            persisted_without_checkpoint: Mutex::new(None),
            _lock: lock,
        });
        let background = inner.opts.compact_interval.map(|every| spawn_background(&inner, every));
        Ok(Db { inner, background: Mutex::new(background) })
    }

    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    pub fn options(&self) -> &DbOptions {
        &self.inner.opts
    }

    pub fn head(&self) -> &Head {
        &self.inner.head
    }

    pub fn stats(&self) -> &DbStats {
        &self.inner.stats
    }

    /// An appender under the head's out-of-order rules (`HeadOptions::out_of_order`).
    pub fn appender(&self) -> Appender<'_> {
        self.inner.head.appender()
    }

    /// An appender under other out-of-order rules (carbon's).
    pub fn appender_with(&self, out_of_order: OutOfOrder) -> Appender<'_> {
        self.inner.head.appender_with(out_of_order)
    }

    /// A reader over the head and every block, for `[mint, maxt]` (inclusive).
    pub fn querier(&self, mint: i64, maxt: i64) -> Querier<'_> {
        Querier::with_blocks(&self.inner.head, &self.inner.blocks, mint, maxt)
    }

    /// The current blocks, sorted by start time.
    pub fn blocks(&self) -> Arc<Vec<Arc<Block>>> {
        self.inner.blocks.read().clone()
    }

    /// Changes to data already written (late writes once watched, deletions, imports,
    /// retention), for caches of query results.
    pub fn changes(&self) -> &crate::changes::ChangeLog {
        &self.inner.head.changes
    }

    pub fn replay_outcome(&self) -> &ReplayOutcome {
        &self.inner.replay
    }

    /// Cuts the head into blocks while it spans more than 1.5 block ranges, compacts blocks while
    /// the planner finds work, applies retention, and sets aside blocks found corrupt.
    pub fn compact(&self) -> Result<CompactOutcome> {
        self.inner.compact()
    }

    /// Writes closed head chunks out and checkpoints the WAL if the log has grown enough since
    /// the last checkpoint (the background thread calls it every second); returns whether it did.
    pub fn shorten_wal(&self) -> Result<bool> {
        self.inner.shorten_wal()
    }

    /// Deletes samples in `[mint, maxt]` of the series matching `matchers`, in the head and in
    /// every block: hidden from queries at once, removed from disk by compaction or
    /// `clean_tombstones`. Returns the number of series affected (counted once per place).
    pub fn delete(&self, matchers: &[Matcher], mint: i64, maxt: i64) -> Result<usize> {
        // Not while a compaction runs: it read its inputs' tombstones when it started, and its
        // output would bring back what is deleted now.
        let _guard = self.inner.compaction.lock();
        // Noted first: a deletion that fails halfway has changed some of the data already.
        self.inner.head.changes.note(mint, maxt);
        let mut n = self.inner.head.delete(matchers, mint, maxt)?;
        for b in self.blocks().iter() {
            n += b.delete(matchers, mint, maxt).inspect_err(|e| b.mark_corrupt_if(e))?;
        }
        n += self.inner.delete_in_tiers(matchers, mint, maxt)?;
        Ok(n)
    }

    /// Backfill: writes the samples of `source` (a head of its own, usually `backfill`) as
    /// blocks, one per aligned block range, and lists them. Blocks overlapping existing data are
    /// merged by the next compaction; until then queries merge them.
    pub fn import_head(&self, source: &Head) -> Result<Vec<crate::block::BlockMeta>> {
        let inner = &self.inner;
        let _guard = inner.compaction.lock();
        let Some((min, max)) = source.time_range() else { return Ok(Vec::new()) };
        inner.head.changes.note(min, max);
        let range = inner.opts.head.chunk_range_ms;
        let mut out = Vec::new();
        let mut start = min.div_euclid(range) * range;
        while start <= max {
            let cut = compact::HeadCut { seq: inner.next_seq(), ..compact::HeadCut::ALL };
            if let Some(meta) = compact::write_head_block(&inner.fs, source, &inner.dir, start, start + range, cut)
                .map_err(|e| inner.list_stranded(e))?
            {
                let block = inner.written(&meta);
                inner.swap_blocks(&[], Some(Arc::new(block)));
                out.push(meta);
            }
            start += range;
        }
        Ok(out)
    }

    /// Writes a consistent copy of the database into `dir/snapshots/<name>/` (created): every
    /// block hard-linked (blocks are immutable, so this costs no space), and, unless
    /// `skip_head`, the head's samples written as one more block. Returns the snapshot's path.
    /// A snapshot is a data directory: `strata serve --data-dir` opens it.
    pub fn snapshot(&self, skip_head: bool) -> Result<PathBuf> {
        let inner = &self.inner;
        // No compaction may delete a block while it is being linked.
        let _guard = inner.compaction.lock();
        let name = format!("{}-{}", chrono_like_now(), ulid::Ulid::new());
        let snaps = inner.dir.join(SNAPSHOTS_DIR);
        let tmp = snaps.join(format!("{name}{TMP_SUFFIX}"));
        let fs = &*inner.fs;
        create_dir_all(fs, &tmp)?;
        for b in self.blocks().iter() {
            link_tree(fs, b.dir(), &tmp.join(b.ulid()))?;
        }
        inner.link_tiers(&tmp)?;
        if !skip_head {
            if let Some((min, max)) = inner.head.time_range() {
                let cut = compact::HeadCut { seq: inner.next_seq(), ..compact::HeadCut::ALL };
                compact::write_head_block(&inner.fs, &inner.head, &tmp, min, max.saturating_add(1), cut)?;
            }
        }
        fsync_dir(fs, &tmp)?;
        let out = snaps.join(&name);
        rename_durable(fs, &tmp, &out)?;
        Ok(out)
    }

    /// Rewrites every block that has tombstones, dropping the deleted samples.
    pub fn clean_tombstones(&self) -> Result<usize> {
        let inner = &self.inner;
        let _guard = inner.compaction.lock();
        let mut n = 0;
        for b in self.blocks().iter().filter(|b| !b.tombstones().is_empty()) {
            inner.replace(std::slice::from_ref(b))?;
            n += 1;
        }
        Ok(n)
    }

    pub fn status(&self, top: usize) -> Result<DbStatus> {
        let wal_dir = self.inner.dir.join(WAL_DIR);
        let wal_segments = wal::list_segments(&*self.inner.fs, &wal_dir)?;
        let wal_bytes = wal_dir_bytes(&*self.inner.fs, &wal_dir)?;
        let blocks = self.blocks();
        let head = &self.inner.head;
        Ok(DbStatus {
            dir: self.inner.dir.clone(),
            series: head.num_series(),
            time_range: head.time_range(),
            wal_segments,
            wal_bytes,
            replay: self.inner.replay.clone(),
            cardinality: head.cardinality(top),
            blocks_bytes: blocks.iter().map(|b| b.bytes()).sum(),
            block_bytes: blocks.iter().map(|b| b.bytes()).collect(),
            blocks: blocks.iter().map(|b| b.meta().clone()).collect(),
            memory: head.memory(),
            chunk_files: head.chunk_files_usage().0,
            tiers: self.inner.tier_status(),
        })
    }

    /// Stops the background thread (letting a running compaction finish), then flushes and
    /// fsyncs the WAL; the lock is released when the `Db` is dropped.
    pub fn close(self) -> Result<()> {
        self.shutdown()
    }

    /// `close` for a shared `Db` (a server whose handlers may still hold it): after this,
    /// appends fail and nothing runs in the background.
    pub fn shutdown(&self) -> Result<()> {
        self.stop_background();
        self.inner.head.close()
    }

    fn stop_background(&self) {
        if let Some(bg) = self.background.lock().take() {
            *bg.stop.0.lock() = true;
            bg.stop.1.notify_all();
            let _ = bg.thread.join();
        }
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        self.stop_background();
    }
}

impl Inner {
    fn compact(&self) -> Result<CompactOutcome> {
        let _guard = self.compaction.lock();
        self.remove_leftovers();
        let mut out = CompactOutcome { set_aside: self.set_aside_corrupt(), ..Default::default() };
        out.head_blocks = self.cut_head()?;
        // Before compaction merges them: the tiers' blocks are then merged along with the raw
        // ones (`merge_tiers_in_step`) instead of rolled up again from the merged block.
        out.rolled_up = self.roll_up_settled()?;
        let ranges = self.opts.compaction_ranges();
        loop {
            let blocks = self.blocks.read().clone();
            let Some(group) = compact::plan(&blocks, &ranges) else { break };
            let started = Instant::now();
            match self.replace(&group) {
                Ok(()) => {
                    self.stats.compactions.fetch_add(1, Ordering::Relaxed);
                    self.stats.compaction_nanos_total.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    out.compactions += 1;
                }
                Err(e) => {
                    self.stats.compaction_failures.fetch_add(1, Ordering::Relaxed);
                    out.set_aside += self.set_aside_corrupt();
                    if out.set_aside == 0 {
                        return Err(e);
                    }
                    tracing::error!(error = %e, "compaction found a corrupt block; it was set aside");
                }
            }
        }
        // Merged blocks the tiers do not hold (late data merged in).
        out.rolled_up += self.roll_up_settled()?;
        out.rollup_compactions = self.compact_tiers(&ranges)?;
        out.retention_deleted = self.apply_retention()? + self.apply_tier_retention()?;
        Ok(out)
    }

    /// The write sequence for a new block: above every listed block's (`BlockMeta::seq`).
    fn next_seq(&self) -> u64 {
        self.blocks.read().iter().map(|b| b.meta().seq).max().unwrap_or(0) + 1
    }

    /// Writes the head's oldest block range while the head spans more than 1.5 ranges, then
    /// truncates the head and checkpoints the WAL.
    ///
    /// Late samples make the head's oldest range one that blocks already cover: it is written
    /// again as a block of the late samples alone, with a higher write sequence than the blocks
    /// it overlaps, which compaction then merges (the late values winning). Each range is cut
    /// under its own cut epoch (`Head::begin_cut`): late samples written meanwhile, whatever
    /// their time, stay in the head and the WAL for the next cut.
    fn cut_head(&self) -> Result<usize> {
        let head = &self.head;
        let range = self.opts.head.chunk_range_ms;
        let mut written = 0;
        let mut cut_up_to = i64::MIN;
        while let Some((min, max)) = head.time_range() {
            if max.saturating_sub(min) <= range / 2 * 3 {
                break;
            }
            let start = min.div_euclid(range) * range;
            if start < cut_up_to {
                // Late samples written into a range this round already cut: the next round's.
                break;
            }
            let end = start + range;
            cut_up_to = end;
            let started = Instant::now();
            let (epoch, segment) = head.begin_cut()?;
            let cut = compact::HeadCut { seq: self.next_seq(), max_epoch: epoch };
            if let Some(meta) = compact::write_head_block(&self.fs, head, &self.dir, start, end, cut)
                .map_err(|e| self.list_stranded(e))?
            {
                let block = self.written(&meta);
                self.swap_blocks(&[], Some(Arc::new(block)));
                tracing::info!(
                    ulid = %meta.ulid, min_time = start, max_time = end, series = meta.stats.num_series,
                    samples = meta.stats.num_samples, elapsed_ms = started.elapsed().as_millis() as u64,
                    "wrote head block"
                );
                written += 1;
                self.stats.head_blocks_written.fetch_add(1, Ordering::Relaxed);
            }
            let (chunks, series) = head.truncate(end, epoch);
            head.set_chunk_files_start(end)?;
            if let (Some(wal), Some(segment)) = (head.wal(), segment) {
                // Written out first, so the checkpoint also drops what the chunk files hold.
                head.persist_chunks()?;
                let written = head.written_until();
                let cp = wal.checkpoint(segment - 1, |r| written.get(&r).copied(), end)?;
                self.mark_checkpoint(&cp);
                tracing::info!(chunks, series, checkpoint = ?cp, "truncated head and write-ahead log");
            }
            let files = head.remove_chunk_files_before(end)?;
            if files > 0 {
                tracing::debug!(files, "removed head chunk files the cut made obsolete");
            }
        }
        Ok(written)
    }

    /// Notes what a checkpoint kept and where the head's counters stood (`shorten_wal`).
    fn mark_checkpoint(&self, cp: &wal::CheckpointStats) {
        let st = &self.head.stats;
        *self.at_checkpoint.lock() = CheckpointMark {
            kept: cp.samples_kept,
            appended: st.samples_appended.load(Ordering::Relaxed),
            written: st.samples_written.load(Ordering::Relaxed),
        };
    }

    /// Writes closed head chunks out and checkpoints the WAL once the finished segments since the
    /// last checkpoint are at least twice its size: the log then holds about what the head has
    /// not written out yet (samples of open chunks, late samples), not the head's whole span,
    /// and each checkpoint rewrites at most half as much as the log grew since the last one.
    /// A checkpoint is skipped unless the chunks written out since the last one hold at least
    /// half the samples the log holds (series of few samples each, all in open chunks, would
    /// otherwise be rewritten for nothing). Returns whether it checkpointed.
    fn shorten_wal(&self) -> Result<bool> {
        let head = &self.head;
        let Some(wal) = head.wal() else { return Ok(false) };
        let usage = wal.usage()?;
        if usage.finished_segments == 0 || usage.finished_segment_bytes < 2 * usage.checkpoint_bytes {
            return Ok(false);
        }
        let _guard = self.compaction.lock();
        let started = Instant::now();
        let last = wal.current_segment() - 1;
        if self.persisted_without_checkpoint.lock().is_some_and(|at| at >= last) {
            return Ok(false);
        }
        let persisted = head.persist_chunks()?;
        self.stats.chunk_write_passes.fetch_add(1, Ordering::Relaxed);
        let persist_ms = started.elapsed().as_millis() as u64;
        let mark = *self.at_checkpoint.lock();
        let appended = head.stats.samples_appended.load(Ordering::Relaxed);
        let written = head.stats.samples_written.load(Ordering::Relaxed);
        let in_log = mark.kept + appended.saturating_sub(mark.appended);
        if written.saturating_sub(mark.written) * 2 < in_log {
            *self.persisted_without_checkpoint.lock() = Some(last);
            return Ok(false);
        }
        let written = head.written_until();
        // No sample before the head's start is logged after the last cut's checkpoint (in
        // order they are refused; late ones stay until a cut drops them): nothing to drop by time.
        let cp = wal.checkpoint(last, |r| written.get(&r).copied(), i64::MIN)?;
        self.mark_checkpoint(&cp);
        self.stats.wal_shortenings.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            chunks = persisted.chunks,
            chunk_file_bytes = persisted.file_bytes,
            heap_bytes = persisted.heap_bytes,
            idle_closed = persisted.idle_closed,
            samples_kept = cp.samples_kept,
            samples_dropped = cp.samples_dropped,
            persist_ms,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "wrote closed head chunks out and checkpointed the write-ahead log"
        );
        Ok(true)
    }

    /// Merges `group` into one block, lists it in place of the inputs, deletes the inputs.
    fn replace(&self, group: &[Arc<Block>]) -> Result<()> {
        let started = Instant::now();
        let meta = compact::merge_blocks(&self.dir, group).map_err(|e| self.list_stranded(e))?;
        let out = meta.as_ref().map(|m| Arc::new(self.written(m)));
        self.swap_blocks(group, out);
        // Every input, even after one fails: each left on disk must go back in the list.
        let deleted: Vec<Result<()>> = group.iter().map(|b| self.delete_unlisted(b)).collect();
        deleted.into_iter().collect::<Result<()>>()?;
        if let Some(m) = &meta {
            self.merge_tiers_in_step(group, m);
        }
        tracing::info!(
            inputs = group.len(), output = ?meta.as_ref().map(|m| &m.ulid),
            level = meta.as_ref().map_or(0, |m| m.compaction.level),
            elapsed_ms = started.elapsed().as_millis() as u64, "compacted blocks"
        );
        Ok(())
    }

    /// The block this process just wrote, from what the writer knows (its `meta.json`, no
    /// tombstones): nothing to read, so nothing can fail between writing a block and listing
    /// it. (A block on disk but not listed would miss the deletions made meanwhile and bring
    /// their samples back at the next open.)
    fn written(&self, meta: &crate::block::BlockMeta) -> Block {
        Block::written(&self.fs, &self.dir.join(&meta.ulid), meta.clone())
    }

    /// Lists the block a writer left under its name when it could neither make that name
    /// durable nor take it back (`Error::BlockNotDurable`): it holds data also held elsewhere
    /// (the head, the inputs), which queries and compaction deduplicate, and listing it is what
    /// keeps deletions reaching it should a crash keep it. Returns the error, for the caller.
    fn list_stranded(&self, e: Error) -> Error {
        if let Error::BlockNotDurable { meta, .. } = &e {
            self.swap_blocks(&[], Some(Arc::new(self.written(meta))));
        }
        e
    }

    /// Deletes an unlisted block's directory. If the block is still under its name afterwards
    /// (the disk refused the rename, or could not make it durable and it was undone), it goes
    /// back in the list, so deletions keep reaching it and the next round tries again; the
    /// error still reaches the caller.
    fn delete_unlisted(&self, b: &Arc<Block>) -> Result<()> {
        self.delete_unlisted_from(&self.blocks, b)
    }

    /// `delete_unlisted` for a block of `list` (the raw blocks or a rollup tier's).
    fn delete_unlisted_from(&self, list: &BlockList, b: &Arc<Block>) -> Result<()> {
        match delete_block_dir(&*self.fs, b.dir()) {
            Ok(None) => Ok(()),
            Ok(Some(leftover)) => {
                self.leftovers.lock().push(leftover);
                Ok(())
            }
            Err(e) => {
                tracing::warn!(block = %b.dir().display(), error = %e, "could not delete a block; it stays listed until a later round can");
                swap_in(list, &[], Some(b.clone()));
                Err(e)
            }
        }
    }

    /// Retries the removals of deleted blocks' directories that failed before.
    fn remove_leftovers(&self) {
        let leftovers = std::mem::take(&mut *self.leftovers.lock());
        for dir in leftovers {
            if self.fs.exists(&dir) && self.fs.remove_dir_all(&dir).is_err() {
                self.leftovers.lock().push(dir);
            }
        }
    }

    /// Replaces `remove` by `add` in the raw block list, atomically for readers.
    fn swap_blocks(&self, remove: &[Arc<Block>], add: Option<Arc<Block>>) {
        swap_in(&self.blocks, remove, add);
    }

    /// Deletes whole blocks outside the retention window (by time, then by size), oldest first,
    /// each once every rollup tier holds its data (rolled up here if a tier lacks it).
    fn apply_retention(&self) -> Result<usize> {
        let blocks = self.blocks.read().clone();
        if blocks.is_empty() {
            return Ok(0);
        }
        let mut doomed: Vec<Arc<Block>> = Vec::new();
        let mut cutoff = i64::MIN;
        if self.opts.retention_ms > 0 {
            let newest = blocks
                .iter()
                .map(|b| b.meta().max_time - 1)
                .chain(self.head.time_range().map(|r| r.1))
                .max()
                .expect("not empty");
            cutoff = newest.saturating_sub(self.opts.retention_ms);
            doomed.extend(blocks.iter().filter(|b| b.meta().max_time <= cutoff).cloned());
        }
        if self.opts.retention_bytes > 0 {
            // The head's disk counts too: its WAL and its chunk files.
            let mut total: u64 = blocks.iter().map(|b| b.bytes()).sum::<u64>()
                + wal_dir_bytes(&*self.fs, &self.dir.join(WAL_DIR)).unwrap_or(0)
                + self.head.chunk_files_usage().1;
            total -= doomed.iter().map(|b| b.bytes()).sum::<u64>();
            for b in blocks.iter() {
                if total <= self.opts.retention_bytes {
                    break;
                }
                if doomed.iter().any(|d| Arc::ptr_eq(d, b)) {
                    continue;
                }
                total -= b.bytes();
                doomed.push(b.clone());
            }
        }
        // Not before every rollup tier holds the block's data.
        doomed.retain(|b| self.rolled_up_for_deletion(b));
        if doomed.is_empty() {
            return Ok(0);
        }
        {
            let mut w = self.blocks.write();
            let next: Vec<Arc<Block>> =
                w.iter().filter(|b| !doomed.iter().any(|d| Arc::ptr_eq(d, b))).cloned().collect();
            *w = Arc::new(next);
        }
        let mint = doomed.iter().map(|b| b.meta().min_time).min().expect("not empty");
        let maxt = doomed.iter().map(|b| b.meta().max_time).max().expect("not empty");
        self.head.changes.note(mint, maxt);
        for b in &doomed {
            let why = if b.meta().max_time <= cutoff {
                format!(
                    "all its samples are older than the retention ({} ms) behind the newest sample",
                    self.opts.retention_ms
                )
            } else {
                format!("blocks and WAL exceed the retention size of {} bytes; oldest first", self.opts.retention_bytes)
            };
            tracing::info!(
                ulid = b.ulid(),
                min_time = b.meta().min_time,
                max_time = b.meta().max_time,
                reason = why,
                "retention deletes block"
            );
        }
        // Every doomed block, even after one fails: each left on disk goes back in the list.
        let deleted: Vec<Result<()>> = doomed.iter().map(|b| self.delete_unlisted(b)).collect();
        let gone = deleted.iter().filter(|r| r.is_ok()).count();
        self.stats.blocks_deleted_by_retention.fetch_add(gone as u64, Ordering::Relaxed);
        deleted.into_iter().collect::<Result<()>>()?;
        Ok(gone)
    }

    /// Moves blocks flagged corrupt out of the list and renames their directories.
    fn set_aside_corrupt(&self) -> usize {
        // Tier blocks too: a raw block still on disk is then rolled up again.
        let mut n = 0;
        for list in std::iter::once(&self.blocks).chain(self.tiers.iter().map(|t| &t.blocks)) {
            let bad: Vec<Arc<Block>> = list.read().iter().filter(|b| b.is_corrupt()).cloned().collect();
            if bad.is_empty() {
                continue;
            }
            swap_in(list, &bad, None);
            for b in &bad {
                set_aside(&*self.fs, b.dir(), "failed a checksum or bounds check on read");
                self.head.changes.note(b.meta().min_time, b.meta().max_time);
            }
            n += bad.len();
        }
        self.stats.blocks_set_aside.fetch_add(n as u64, Ordering::Relaxed);
        n
    }
}

/// Replaces `remove` by `add` in `list`, atomically for readers; the list stays sorted by start.
fn swap_in(list: &BlockList, remove: &[Arc<Block>], add: impl IntoIterator<Item = Arc<Block>>) {
    let mut w = list.write();
    let mut next: Vec<Arc<Block>> = w.iter().filter(|b| !remove.iter().any(|r| Arc::ptr_eq(r, b))).cloned().collect();
    next.extend(add);
    next.sort_by(|a, b| (a.meta().min_time, a.ulid()).cmp(&(b.meta().min_time, b.ulid())));
    *w = Arc::new(next);
}

fn spawn_background(inner: &Arc<Inner>, every: Duration) -> Background {
    let stop = Arc::new((Mutex::new(false), Condvar::new()));
    let weak = Arc::downgrade(inner);
    let stop2 = stop.clone();
    let thread = std::thread::Builder::new()
        .name("compactor".into())
        .spawn(move || {
            let mut next_compaction = Instant::now() + every;
            loop {
                {
                    let mut stopped = stop2.0.lock();
                    if !*stopped {
                        stop2.1.wait_for(&mut stopped, every.min(MAINTENANCE_CHECK_INTERVAL));
                    }
                    if *stopped {
                        return;
                    }
                }
                let Some(inner) = weak.upgrade() else { return };
                if let Err(e) = inner.shorten_wal() {
                    tracing::error!(error = %e, "writing head chunks out or checkpointing the write-ahead log failed; retrying");
                }
                if Instant::now() >= next_compaction {
                    if let Err(e) = inner.compact() {
                        inner.stats.compaction_failures.fetch_add(1, Ordering::Relaxed);
                        tracing::error!(error = %e, "background compaction failed; retrying next round");
                    }
                    next_compaction = Instant::now() + every;
                }
                maintain_names(&inner);
            }
        })
        .expect("spawn the compactor thread");
    Background { stop, thread }
}

/// How often the background thread looks, between compactions, whether the WAL is due for a
/// checkpoint (`shorten_wal`: a listing of the WAL directory) and the head's names dictionary
/// for a rebuild (a burst of new paths, a Graphite installation starting to send, sits in the
/// slower delta until then).
const MAINTENANCE_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Rebuilds the head's names dictionary, or folds new names into it, if due (after a
/// compaction, a head truncation has just removed series, if any).
fn maintain_names(inner: &Inner) {
    let started = Instant::now();
    if inner.head.maintain_names() {
        let st = inner.head.names_stats();
        tracing::debug!(nodes = st.dictionary_nodes, dictionaries = st.dictionaries, bytes = st.bytes, took = ?started.elapsed(), "rebuilt the head's names dictionary or folded new names in");
    }
}

/// Removes `snapshots/*.tmp`: snapshots a crash interrupted (a finished one is renamed).
fn remove_interrupted_snapshots(fs: &dyn Vfs, dir: &Path) -> Result<()> {
    let snaps = dir.join(SNAPSHOTS_DIR);
    let Ok(entries) = fs.list(&snaps) else { return Ok(()) };
    for e in entries.iter().filter(|e| e.name.ends_with(TMP_SUFFIX)) {
        let path = snaps.join(&e.name);
        tracing::warn!(dir = %path.display(), "removing a snapshot a crash interrupted");
        fs.remove_dir_all(&path).map_err(io_err("remove", &path))?;
    }
    Ok(())
}

/// Opens every block in `dir`: removes leftovers of interrupted writes and deletions, sets
/// aside blocks whose files are missing or fail their checks, removes blocks a compaction
/// already replaced. A failing disk fails the open (the blocks are fine; the disk may be too,
/// later): it never sets a block aside.
///
/// `rollup`: the kind of the tier whose directory this is (`None`: raw blocks). A block of
/// another kind is left alone, loudly: it was put there by hand or by another version.
fn open_blocks(fs: &Arc<dyn Vfs>, dir: &Path, rollup: Option<RollupMeta>) -> Result<Vec<Arc<Block>>> {
    let mut blocks = Vec::new();
    let mut entries = fs.list(dir).map_err(io_err("list", dir))?;
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    for e in entries {
        let path = dir.join(&e.name);
        if e.name.ends_with(TMP_SUFFIX) || e.name.ends_with(DELETING_SUFFIX) {
            tracing::warn!(dir = %path.display(), "removing a block directory left by an interrupted write or delete");
            fs.remove_dir_all(&path).map_err(io_err("remove", &path))?;
            continue;
        }
        if ulid::Ulid::from_string(&e.name).is_err() || !e.is_dir {
            continue;
        }
        match Block::open_on(fs, &path) {
            Ok(b) if b.meta().rollup != rollup => {
                tracing::error!(
                    block = %path.display(), rollup = ?b.meta().rollup, expected = ?rollup,
                    "a block of another kind (raw or another rollup interval) is in this directory; it is not read"
                );
            }
            Ok(b) => blocks.push(Arc::new(b)),
            Err(Error::BlockCorrupt { reason, .. }) => set_aside(&**fs, &path, &reason),
            Err(e) => return Err(e),
        }
    }
    fsync_dir(&**fs, dir)?;
    let (gone, mut kept): (Vec<_>, Vec<_>) = blocks.iter().cloned().partition(|b| is_replaced(b, &blocks));
    for b in gone {
        tracing::warn!(ulid = b.ulid(), "removing a block that a finished compaction replaced");
        delete_block_dir(&**fs, b.dir())?;
    }
    kept.sort_by(|a, b| (a.meta().min_time, a.ulid()).cmp(&(b.meta().min_time, b.ulid())));
    Ok(kept)
}

/// Whether a finished compaction already holds all of `b`'s data: a block of a higher level
/// whose sources (the level-1 blocks it descends from) include all of `b`'s. Such a block is
/// left behind by a crash between a compaction's end and its inputs' deletion, or after that
/// deletion failed; the compaction's output may itself have been compacted again since, so
/// the test is on sources, not on the direct parents alone. (Deletions made after it was
/// unlisted are not in its tombstones: serving it would bring deleted samples back.)
fn is_replaced(b: &Block, blocks: &[Arc<Block>]) -> bool {
    let mine = &b.meta().compaction;
    if mine.sources.is_empty() {
        return false;
    }
    blocks.iter().any(|other| {
        let theirs = &other.meta().compaction;
        theirs.level > mine.level
            && !std::ptr::eq(b, &**other)
            && mine.sources.iter().all(|s| theirs.sources.binary_search(s).is_ok())
    }) || blocks.iter().any(|other| other.meta().compaction.parents.iter().any(|p| p == b.ulid()))
}

/// Renames a bad block directory to `<name>.corrupt`, loudly; it is no longer read.
fn set_aside(fs: &dyn Vfs, path: &Path, reason: &str) {
    let mut to = path.as_os_str().to_owned();
    to.push(CORRUPT_SUFFIX);
    let to = PathBuf::from(to);
    tracing::error!(block = %path.display(), moved_to = %to.display(), reason, "setting aside a corrupt block");
    if let Err(e) = rename_durable(fs, path, &to) {
        tracing::error!(block = %path.display(), error = %e, "could not set the block aside");
    }
}

/// Deletes a block directory: renamed first (durably), so a crash leaves only a
/// `.tmp-for-deletion` directory that the next open removes, never a half-deleted block. An
/// error means the block is still whole under its name: the rename failed, or could not be
/// made durable and was undone. Once renamed, a failed removal is not an error: the directory
/// is returned for a later try (and `open` removes it anyway).
fn delete_block_dir(fs: &dyn Vfs, path: &Path) -> Result<Option<PathBuf>> {
    let mut to = path.as_os_str().to_owned();
    to.push(DELETING_SUFFIX);
    let to = PathBuf::from(to);
    fs.rename(path, &to).map_err(io_err("rename to", &to))?;
    if let Err(e) = fsync_dir(fs, path.parent().unwrap_or(Path::new("."))) {
        // A crash could bring the old name back, with the block whole under it, while this
        // process thinks it gone. Undo, so both agree it is there.
        if fs.rename(&to, path).is_ok() {
            return Err(e);
        }
        tracing::error!(block = %path.display(), error = %e, "a block's deletion could not be made durable nor undone");
    }
    match fs.remove_dir_all(&to) {
        Ok(()) => Ok(None),
        Err(e) => {
            tracing::warn!(dir = %to.display(), error = %e, "could not remove a deleted block's directory; will retry");
            Ok(Some(to))
        }
    }
}

/// Hard-links every file under `from` into the same layout under `to`.
fn link_tree(fs: &dyn Vfs, from: &Path, to: &Path) -> Result<()> {
    create_dir_all(fs, to)?;
    for e in fs.list(from).map_err(io_err("list", from))? {
        let (source, target) = (from.join(&e.name), to.join(&e.name));
        if e.is_dir {
            link_tree(fs, &source, &target)?;
        } else {
            fs.hard_link(&source, &target).map_err(io_err("hard-link into", &target))?;
        }
    }
    fsync_dir(fs, to)
}

/// `20261122T130501Z`: snapshot names sort by time, as Prometheus' do.
fn chrono_like_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = strata_model::civil::civil_from_days(days);
    format!("{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

fn wal_dir_bytes(fs: &dyn Vfs, wal_dir: &Path) -> Result<u64> {
    Ok(wal::segments_bytes(fs, wal_dir, |_| true)?.1)
}

/// Takes an exclusive, non-blocking lock on `dir/lock`.
fn lock_dir(fs: &dyn Vfs, dir: &Path) -> Result<Box<dyn std::fmt::Debug + Send + Sync>> {
    let path = dir.join(LOCK_FILE);
    fs.lock(&path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::WouldBlock {
            Error::Locked { path: dir.to_owned(), lock: path }
        } else {
            io_err("lock", path)(e)
        }
    })
}

mod rollups;
pub use rollups::{discover_tiers, RollupSelection, RollupSeries, TierStatus, ROLLUPS_DIR};

#[cfg(test)]
mod faults;

#[cfg(test)]
mod tests {
    use super::*;

    /// The model test's seed 14 found it: a compaction input whose deletion failed came back
    /// at the next open once the compaction's output had itself been compacted again (its
    /// ULID is then in no block's parents), serving samples deleted since.
    #[test]
    fn a_block_a_compaction_two_levels_up_holds_is_removed_at_open() {
        let tmp = tempfile::tempdir().unwrap();
        let fs = OsFs::shared();
        let head = Head::in_memory(HeadOptions { chunk_range_ms: 1000, ..Default::default() });
        let l = strata_model::Labels::from_pairs([("__name__", "x")]);
        let mut app = head.appender();
        for t in (0..3000).step_by(100) {
            app.append(&l, t, t as f64).unwrap();
        }
        app.commit().unwrap();
        let write = |mint: i64| {
            compact::write_head_block(&fs, &head, tmp.path(), mint, mint + 1000, crate::compact::HeadCut::ALL)
                .unwrap()
                .unwrap()
        };
        let (a, b, d) = (write(0), write(1000), write(2000));
        let open = |m: &crate::block::BlockMeta| Arc::new(Block::open_on(&fs, &tmp.path().join(&m.ulid)).unwrap());
        let c = compact::merge_blocks(tmp.path(), &[open(&a), open(&b)]).unwrap().unwrap();
        let e = compact::merge_blocks(tmp.path(), &[open(&c), open(&d)]).unwrap().unwrap();
        // The deletions of b, c and d went through; a's failed, and a crash came before the retry.
        for m in [&b, &c, &d] {
            std::fs::remove_dir_all(tmp.path().join(&m.ulid)).unwrap();
        }
        let opts = DbOptions { compact_interval: None, retention_ms: 0, ..Default::default() };
        let db = Db::open(tmp.path(), opts).unwrap();
        let listed: Vec<String> = db.blocks().iter().map(|b| b.ulid().to_owned()).collect();
        assert_eq!(listed, std::slice::from_ref(&e.ulid));
        assert!(!tmp.path().join(&a.ulid).exists());
    }

    /// Closed chunks leave the heap for chunk files and their samples leave the WAL; a reopen
    /// serves every sample once, with late ones, histograms and a head cut in between.
    #[test]
    fn head_chunks_written_out_shorten_the_wal_and_survive_reopens() {
        use crate::chunkenc::TypedValue;
        use std::collections::BTreeMap;
        use strata_model::{FloatHistogram, Labels, MatchOp};
        let tmp = tempfile::tempdir().unwrap();
        const RANGE: i64 = 3_600_000;
        let opts = DbOptions {
            head: HeadOptions {
                chunk_range_ms: RANGE,
                wal: crate::wal::WalOptions { segment_bytes: 16 << 10, ..Default::default() },
                out_of_order: OutOfOrder { window_ms: 600_000, replace: false },
                ..HeadOptions::default()
            },
            retention_ms: 0,
            compact_interval: None,
            ..Default::default()
        };
        let series = |i: usize| Labels::from_pairs([("__name__", "m".to_string()), ("i", i.to_string())]);
        let hist = |t: i64| {
            let mut h = FloatHistogram { count: t as f64, sum: 1.0, ..Default::default() };
            h.hint = strata_model::CounterResetHint::Gauge;
            h
        };
        let value = |i: usize, t: i64| (t / 1000) as f64 * 0.5 + i as f64;
        let mut model: BTreeMap<(usize, i64), f64> = BTreeMap::new();
        let append = |db: &Db, model: &mut BTreeMap<(usize, i64), f64>, from: i64, to: i64| {
            for t in (from..to).step_by(15_000) {
                let mut app = db.appender();
                for i in 0..40 {
                    app.append(&series(i), t, value(i, t)).unwrap();
                    model.insert((i, t), value(i, t));
                }
                app.append_histogram(&series(99), t, hist(t)).unwrap();
                app.commit().unwrap();
            }
        };
        let check = |db: &Db, model: &BTreeMap<(usize, i64), f64>| {
            let q = db.querier(i64::MIN, i64::MAX);
            let got = q.select(&[Matcher::new(MatchOp::Equal, "__name__", "m").unwrap()]).unwrap();
            let mut served: BTreeMap<(usize, i64), f64> = BTreeMap::new();
            let mut histograms = 0;
            for s in got {
                let i: usize = s.labels.get("i").unwrap().parse().unwrap();
                for x in s.typed_samples().unwrap() {
                    match x.value {
                        TypedValue::Float(v) => assert!(served.insert((i, x.t), v).is_none(), "{i}@{} twice", x.t),
                        TypedValue::Histogram(h) => {
                            assert_eq!(h.count, x.t as f64);
                            histograms += 1;
                        }
                    }
                }
            }
            assert_eq!(&served, model);
            assert_eq!(histograms, model.keys().filter(|(i, _)| *i == 1).count());
        };
        let db = Db::open(tmp.path(), opts.clone()).unwrap();
        append(&db, &mut model, 0, 4_000_000);
        // Late samples of one series, between the in-order ones.
        let mut app = db.appender();
        for t in (3_600_000..3_900_000).step_by(15_000) {
            app.append(&series(0), t + 7, -1.0).unwrap();
            model.insert((0, t + 7), -1.0);
        }
        app.commit().unwrap();
        let before = db.head().heap_chunk_bytes();
        assert!(db.shorten_wal().unwrap());
        let (files, file_bytes) = db.head().chunk_files_usage();
        assert_eq!(files, 1);
        assert!(
            db.head().heap_chunk_bytes() < before / 2,
            "{} of {before} heap bytes left",
            db.head().heap_chunk_bytes()
        );
        let usage = db.head().wal().unwrap().usage().unwrap();
        // What is left of the log is about the open chunks: far less than the chunk files.
        assert!(usage.checkpoint_bytes < file_bytes, "{usage:?}, chunk files {file_bytes}");
        check(&db, &model);
        db.close().unwrap();

        let db = Db::open(tmp.path(), opts.clone()).unwrap();
        check(&db, &model);
        append(&db, &mut model, 4_000_000, 8_000_000);
        db.shorten_wal().unwrap();
        // A cut writes the first range into a block and drops the chunk files it made obsolete.
        let out = db.compact().unwrap();
        assert!(out.head_blocks >= 1, "{out:?}");
        check(&db, &model);
        db.close().unwrap();
        let db = Db::open(tmp.path(), opts).unwrap();
        check(&db, &model);
        assert!(db.head().stats.chunks_written.load(Ordering::Relaxed) == 0);
        db.close().unwrap();
    }

    /// Series of few samples each (carbon paths at first) leave nothing closed to write out:
    /// the pass that found so is not repeated until the log has finished another segment.
    #[test]
    fn a_pass_that_could_not_checkpoint_waits_for_the_next_segment() {
        use strata_model::Labels;
        let tmp = tempfile::tempdir().unwrap();
        let wal = crate::wal::WalOptions { segment_bytes: 64 << 10, ..Default::default() };
        let head = HeadOptions { wal, ..Default::default() };
        let opts = DbOptions { compact_interval: None, retention_ms: 0, head, ..Default::default() };
        let db = Db::open(tmp.path(), opts).unwrap();
        let passes = || db.stats().chunk_write_passes.load(Ordering::Relaxed);
        let mut next_series = 0;
        let mut fill_segments = |db: &Db, segments: u64| {
            let wal = db.head().wal().unwrap();
            let until = wal.current_segment() + segments;
            while wal.current_segment() < until {
                let mut app = db.appender();
                for _ in 0..500 {
                    let l = Labels::from_pairs([("__name__", format!("servers.host-{next_series}.load").as_str())]);
                    app.append(&l, 1000, 1.0).unwrap();
                    next_series += 1;
                }
                app.commit().unwrap();
            }
        };
        fill_segments(&db, 3);
        assert!(!db.shorten_wal().unwrap(), "nothing closed: no checkpoint");
        assert_eq!(passes(), 1);
        for _ in 0..3 {
            assert!(!db.shorten_wal().unwrap());
        }
        assert_eq!(passes(), 1, "no new segment, no new pass");
        fill_segments(&db, 1);
        assert!(!db.shorten_wal().unwrap());
        assert_eq!(passes(), 2, "a segment later, one more pass");
        db.close().unwrap();
    }

    /// A series that stopped (a replaced pod) has its open chunk closed and written out with
    /// the closed ones; if it comes back, it simply starts a new chunk.
    #[test]
    fn the_open_chunk_of_a_series_that_stopped_is_written_out_too() {
        use strata_model::{Labels, MatchOp};
        let tmp = tempfile::tempdir().unwrap();
        let opts = DbOptions { compact_interval: None, retention_ms: 0, ..Default::default() };
        let l = |name: &str| Labels::from_pairs([("__name__", name)]);
        let db = Db::open(tmp.path(), opts.clone()).unwrap();
        let mut app = db.appender();
        for t in (0..3_000_000).step_by(15_000) {
            if t < 600_000 {
                app.append(&l("stopped"), t, 1.0).unwrap();
            }
            app.append(&l("live"), t, 2.0).unwrap();
        }
        app.commit().unwrap();
        let out = db.head().persist_chunks().unwrap();
        assert_eq!(out.idle_closed, 1, "{out:?}");
        let stopped =
            db.head().series(db.head().postings_for(&[Matcher::equal("__name__", "stopped")]).next().unwrap());
        let st = stopped.unwrap();
        assert_eq!(st.lock().heap_chunk_bytes(), 0);
        let mut app = db.appender();
        app.append(&l("stopped"), 3_000_000, 3.0).unwrap();
        app.commit().unwrap();
        db.close().unwrap();
        let db = Db::open(tmp.path(), opts).unwrap();
        let q = db.querier(i64::MIN, i64::MAX);
        let got = q.select(&[Matcher::new(MatchOp::RegexMatch, "__name__", ".+").unwrap()]).unwrap();
        let counts: Vec<(String, usize)> =
            got.iter().map(|s| (s.labels.get("__name__").unwrap().to_owned(), s.samples().len())).collect();
        assert_eq!(counts, [("live".to_owned(), 200), ("stopped".to_owned(), 41)]);
    }

    #[test]
    fn a_second_open_is_refused_while_the_first_holds_the_lock() {
        let tmp = tempfile::tempdir().unwrap();
        let db = Db::open(tmp.path(), DbOptions::default()).unwrap();
        let err = Db::open(tmp.path(), DbOptions::default()).unwrap_err();
        assert!(matches!(err, Error::Locked { .. }), "{err}");
        assert!(err.to_string().contains("in use by another process"));
        db.close().unwrap();
        Db::open(tmp.path(), DbOptions::default()).unwrap();
    }
}
