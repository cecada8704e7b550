//! The head: the newest block, in memory, protected by the write-ahead log.
//!
//! Appends take no global lock: series are found through lock stripes (by label hash for
//! get-or-create, by reference for appends by reference), each series has its own mutex, and
//! only creating a series touches the shared symbol table and postings. Series references come
//! from one atomic counter, so they only grow and postings lists stay sorted by construction.
//!
//! Commit protocol (see `docs/design.md`): samples are validated and applied to their series in
//! memory, then the accepted ones are written to the WAL in one write, which under the `Always`
//! policy is fsynced (group commit) before `commit` returns. New series are logged the moment
//! they are created, ahead of any sample that can use them. A commit acknowledges only samples
//! that are in the WAL; replay re-applies them, merging any that two concurrent commits to the
//! same series logged in the opposite order from the one they reached memory in.

mod appender;
pub mod chunk_files;
pub mod exemplars;
pub mod mem_postings;
mod names;
mod overlay;
mod refs;
pub mod series;
pub mod symbols;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use strata_model::{Labels, Matcher, SeriesRef, METRIC_NAME};

pub use appender::{AppendError, Appender, CommitOutcome, OutOfOrder};
use chunk_files::ChunkFiles;
use mem_postings::MemPostings;
use names::HeadNames;
pub use names::NamesStats;
pub use series::{Appended, ChunkMeta, HeadChunkBytes, MemSeries, SampleError};
use symbols::{SymbolId, Symbols};

use crate::chunkenc::TypedSample;
use crate::error::Result;
use crate::hash::U64Map;
use crate::index::matchers::{postings_for_matchers, IndexReader};
use crate::index::name_dict::NamePattern;
use crate::index::postings::{self, BoxPostings, ListPostings};
use crate::record::{self, Record, RecordError, RecordType, RefHistogram, RefSample, Tombstone};
use crate::wal::{ReplayOutcome, Wal, WalOptions};

/// Default block range: the span of one persisted block and the alignment of head chunks.
pub const BLOCK_RANGE_MS_DEFAULT: i64 = 2 * 3600 * 1000;
/// Most threads replaying the WAL in parallel.
const REPLAY_WORKERS_MAX: usize = 8;
/// Lock stripes: enough that 2–64 appending threads rarely meet on one lock.
const STRIPES: usize = 1 << 12;
const _: () = assert!(STRIPES.is_power_of_two());

#[derive(Clone, Copy, Debug)]
pub struct HeadOptions {
    /// Block range in milliseconds; chunks never span a multiple of it.
    pub chunk_range_ms: i64,
    /// No append window: any timestamp is accepted as long as each series stays in order. For
    /// imports that build blocks from a head of their own, never for the live head.
    pub backfill: bool,
    pub wal: WalOptions,
    /// What `appender` does with late samples (Prometheus' `out_of_order_time_window`; off by
    /// default, as there). A writer with other rules asks for `appender_with`.
    pub out_of_order: OutOfOrder,
    /// How many exemplars the head keeps (Prometheus' `storage.exemplars.max_exemplars`); 0
    /// keeps none.
    pub max_exemplars: usize,
}

impl Default for HeadOptions {
    fn default() -> Self {
        HeadOptions {
            chunk_range_ms: BLOCK_RANGE_MS_DEFAULT,
            backfill: false,
            wal: WalOptions::default(),
            out_of_order: OutOfOrder::OFF,
            max_exemplars: exemplars::MAX_EXEMPLARS_DEFAULT,
        }
    }
}

/// Counters for `/metrics` and tests.
#[derive(Debug, Default)]
pub struct HeadStats {
    pub samples_appended: AtomicU64,
    pub series_created: AtomicU64,
    pub rejected_out_of_order: AtomicU64,
    pub rejected_duplicate: AtomicU64,
    pub rejected_too_old: AtomicU64,
    pub chunks_created: AtomicU64,
    /// Closed chunks written to head chunk files, and the samples they hold.
    pub chunks_written: AtomicU64,
    pub samples_written: AtomicU64,
    /// Samples stored out of order (also counted in `samples_appended`).
    pub samples_appended_late: AtomicU64,
}

/// Series by label-set hash (collisions are rare, so the first sits inline). The series itself
/// is held (a pointer, the size of a reference), so a lookup by labels takes no second lock.
#[derive(Debug, Default)]
struct HashStripe {
    first: U64Map<u64, Arc<MemSeries>>,
    more: U64Map<u64, Vec<Arc<MemSeries>>>,
}

impl HashStripe {
    /// The series with `hash` for which `same` holds.
    fn find(&self, hash: u64, same: impl Fn(&MemSeries) -> bool) -> Option<Arc<MemSeries>> {
        let first = self.first.get(&hash)?;
        std::iter::once(first).chain(self.more.get(&hash).into_iter().flatten()).find(|s| same(s)).cloned()
    }
}

/// The in-memory head block.
#[derive(Debug)]
pub struct Head {
    opts: HeadOptions,
    pub(crate) symbols: Symbols,
    pub(crate) postings: MemPostings,
    by_ref: Box<[RwLock<refs::RefTable>]>,
    by_hash: Box<[RwLock<HashStripe>]>,
    next_ref: AtomicU64,
    num_series: AtomicU64,
    min_time: AtomicI64,
    max_time: AtomicI64,
    /// No sample older than this is accepted in order (raised when the head is truncated).
    min_valid_time: AtomicI64,
    /// Raised by each head cut (`begin_cut`): late samples carry the epoch they were written in,
    /// so that a cut writes and drops only those that were there when it began.
    cut_epoch: AtomicU64,
    /// Held (shared) by every open appender and by readers resolving symbol ids; truncation
    /// takes it exclusively to raise `min_valid_time`, remove empty series and free their
    /// symbols, so no appender holds a series being removed or a sample older than the new
    /// limit, and no reader resolves a freed id. A thread must not take it twice (an appender
    /// and a query at once): a waiting truncation would deadlock it.
    gc_gate: RwLock<()>,
    wal: Option<Arc<Wal>>,
    /// Where closed chunks are written out of the heap (`persist_chunks`); `None` keeps them
    /// on the heap (heads without a data directory, tests of the WAL alone).
    chunk_files: Option<ChunkFiles>,
    tombstones: RwLock<U64Map<SeriesRef, Vec<(i64, i64)>>>,
    /// Metric names and their path nodes, for searches by pattern.
    names: HeadNames,
    pub stats: HeadStats,
    /// Writes into the past, for caches of query results (`Db::delete` and friends note theirs).
    pub changes: crate::changes::ChangeLog,
    /// The newest exemplars (`HeadOptions::max_exemplars`).
    pub exemplars: exemplars::ExemplarStorage,
    /// The last walk of `memory`, and when it was taken, for `memory_recent`.
    memory_walked: Mutex<Option<(Instant, HeadMemory)>>,
}

impl Head {
    /// A head without a WAL (tests, benchmarks, the block builder of the next milestone).
    pub fn in_memory(opts: HeadOptions) -> Head {
        Head {
            opts,
            symbols: Symbols::default(),
            postings: MemPostings::default(),
            by_ref: (0..STRIPES).map(|_| RwLock::default()).collect(),
            by_hash: (0..STRIPES).map(|_| RwLock::default()).collect(),
            next_ref: AtomicU64::new(1),
            num_series: AtomicU64::new(0),
            min_time: AtomicI64::new(i64::MAX),
            max_time: AtomicI64::new(i64::MIN),
            min_valid_time: AtomicI64::new(i64::MIN),
            cut_epoch: AtomicU64::new(0),
            gc_gate: RwLock::new(()),
            wal: None,
            chunk_files: None,
            tombstones: RwLock::default(),
            names: HeadNames::new(!opts.backfill),
            stats: HeadStats::default(),
            changes: crate::changes::ChangeLog::default(),
            exemplars: exemplars::ExemplarStorage::new(opts.max_exemplars),
            memory_walked: Mutex::new(None),
        }
    }

    /// Opens the head persisted in `wal_dir`: replays the WAL, then appends to a new segment.
    ///
    /// Replay keeps every logged sample, even one older than the newest block: a crash between
    /// writing a block and checkpointing the WAL leaves such samples, and they are then in the
    /// head and in the block at once, which queries and compaction deduplicate. Dropping them by
    /// the blocks' time range instead would lose data whenever an imported block reaches past
    /// the head's oldest sample.
    pub fn open(wal_dir: &Path, opts: HeadOptions) -> Result<(Head, ReplayOutcome)> {
        Head::open_on(crate::vfs::OsFs::shared(), wal_dir, opts)
    }

    /// `open` with the WAL on `fs`.
    pub fn open_on(fs: Arc<dyn crate::vfs::Vfs>, wal_dir: &Path, opts: HeadOptions) -> Result<(Head, ReplayOutcome)> {
        Head::open_with_chunk_files(fs, wal_dir, None, opts)
    }

    /// `open_on` with closed chunks written to (and first read back from) head chunk files in
    /// `chunks_dir` (`chunk_files`), as the data directory's head does.
    pub fn open_with_chunk_files(
        fs: Arc<dyn crate::vfs::Vfs>,
        wal_dir: &Path,
        chunks_dir: Option<&Path>,
        opts: HeadOptions,
    ) -> Result<(Head, ReplayOutcome)> {
        let mut head = Head::in_memory(opts);
        let mut written = chunk_files::Loaded::new();
        if let Some(dir) = chunks_dir {
            let (files, loaded) = ChunkFiles::open(fs.clone(), dir)?;
            head.chunk_files = Some(files);
            written = loaded;
        }
        // Names are collected once, after replay (`finish_replay`), not series by series.
        head.names = HeadNames::new(false);
        let workers = std::thread::available_parallelism().map_or(2, |n| n.get()).clamp(1, REPLAY_WORKERS_MAX);
        let (wal, outcome) = std::thread::scope(|scope| {
            let head = &head;
            let (senders, handles): (Vec<_>, Vec<_>) = (0..workers)
                .map(|_| {
                    let (tx, rx) = std::sync::mpsc::sync_channel(REPLAY_QUEUE_BATCHES);
                    (tx, scope.spawn(move || replay_worker(head, rx)))
                })
                .unzip();
            let mut replay = Replay::new(head, senders, written);
            let opened = Wal::open_on(fs, wal_dir, opts.wal, |rec| replay.apply(rec));
            replay.finish();
            let shards: Vec<ReplayShard> = handles.into_iter().map(|h| h.join().expect("replay worker")).collect();
            if opened.is_ok() {
                finish_replay(head, shards);
            }
            opened
        })?;
        head.wal = Some(wal);
        Ok((head, outcome))
    }

    pub fn options(&self) -> &HeadOptions {
        &self.opts
    }

    pub fn wal(&self) -> Option<&Arc<Wal>> {
        self.wal.as_ref()
    }

    /// An appender under the head's out-of-order rules (`HeadOptions::out_of_order`).
    pub fn appender(&self) -> Appender<'_> {
        Appender::new(self, self.opts.out_of_order)
    }

    /// An appender under other out-of-order rules (carbon's last-write-wins window).
    pub fn appender_with(&self, out_of_order: OutOfOrder) -> Appender<'_> {
        Appender::new(self, out_of_order)
    }

    /// Timestamp of the newest sample, `i64::MIN` when empty.
    pub(crate) fn max_time(&self) -> i64 {
        self.max_time.load(Ordering::Relaxed)
    }

    pub(crate) fn cut_epoch(&self) -> u64 {
        self.cut_epoch.load(Ordering::Relaxed)
    }

    /// Starts a head cut: raises the cut epoch and rolls the WAL to a new segment while no
    /// appender is open. Returns the epoch the cut writes (every late sample stored so far) and
    /// the first segment written after it: the cut may checkpoint the segments before it and no
    /// more, for late samples written during the cut, whatever their time, are in later ones.
    pub fn begin_cut(&self) -> Result<(u64, Option<u64>)> {
        let _gate = self.gc_gate.write();
        let epoch = self.cut_epoch.fetch_add(1, Ordering::Relaxed);
        let segment = match &self.wal {
            Some(wal) => Some(wal.roll()?),
            None => None,
        };
        Ok((epoch, segment))
    }

    /// Writes every closed chunk not yet in a chunk file into a new one (floats re-encoded as
    /// dense chunks where that is smaller) and points the series to the mapped copies, so their
    /// bytes leave the heap and a WAL checkpoint may drop their samples. Not to be run
    /// concurrently with itself or `truncate` (the database's maintenance lock orders them).
    pub fn persist_chunks(&self) -> Result<PersistOutcome> {
        let Some(files) = &self.chunk_files else { return Ok(PersistOutcome::default()) };
        let mut w = files.writer()?;
        let mut placed: Vec<(Arc<MemSeries>, i64, chunk_files::Placed, u32)> = Vec::new();
        let mut pending: Vec<ChunkMeta> = Vec::new();
        let mut decoded: Vec<strata_model::Sample> = Vec::new();
        let mut out = PersistOutcome::default();
        let idle_before = self.max_time().saturating_sub(IDLE_CHUNK_MS);
        for stripe in self.by_ref.iter() {
            let series: Vec<Arc<MemSeries>> = stripe.read().values().cloned().collect();
            for s in series {
                pending.clear();
                let mut st = s.lock();
                out.idle_closed += usize::from(st.close_if_idle(idle_before));
                pending.extend(st.unwritten_closed().cloned());
                drop(st);
                for c in &pending {
                    out.heap_bytes += c.data.len() as u64;
                    let dense = denser(&c.data, &mut decoded);
                    let data = dense.as_deref().unwrap_or(&c.data);
                    out.file_bytes += data.len() as u64;
                    let samples = crate::chunkenc::num_samples(data).unwrap_or(0) as u32;
                    placed.push((s.clone(), c.mint, w.add(s.series_ref, c.mint, c.maxt, data)?, samples));
                }
            }
        }
        let Some(mapped) = w.finish()? else { return Ok(out) };
        for (s, mint, p, samples) in placed {
            if s.lock().set_written(mint, HeadChunkBytes::mapped(&mapped, p.start, p.len)) {
                out.chunks += 1;
                out.samples += u64::from(samples);
            }
        }
        self.stats.chunks_written.fetch_add(out.chunks as u64, Ordering::Relaxed);
        self.stats.samples_written.fetch_add(out.samples, Ordering::Relaxed);
        Ok(out)
    }

    /// For a WAL checkpoint: each series in the head and the newest timestamp its chunk files
    /// hold (`i64::MIN` for none).
    pub fn written_until(&self) -> U64Map<SeriesRef, i64> {
        let mut out = U64Map::default();
        for stripe in self.by_ref.iter() {
            for s in stripe.read().values() {
                out.insert(s.series_ref, s.lock().written_until().unwrap_or(i64::MIN));
            }
        }
        out
    }

    /// After `truncate(mint)`: records in the chunk files that chunks ending before `mint` are
    /// obsolete (call it before the WAL checkpoint that drops their deletions).
    pub fn set_chunk_files_start(&self, mint: i64) -> Result<()> {
        match &self.chunk_files {
            Some(f) => f.set_start(mint),
            None => Ok(()),
        }
    }

    /// Deletes the chunk files whose every chunk ends before `mint` (after `truncate(mint)`).
    pub fn remove_chunk_files_before(&self, mint: i64) -> Result<usize> {
        match &self.chunk_files {
            Some(f) => f.remove_before(mint),
            None => Ok(0),
        }
    }

    /// Bytes of chunk data on the heap (closed chunks not written out, open chunks, late
    /// samples).
    pub fn heap_chunk_bytes(&self) -> u64 {
        self.memory().chunks
    }

    /// `memory`, walked again only when the last walk is older than `max_age`: `/metrics` is
    /// read often (a scraper every few seconds, a load test polling its counters), and each walk
    /// locks every series' state (~0.1 s of CPU per million series, contending with appenders).
    pub fn memory_recent(&self, max_age: Duration) -> HeadMemory {
        let mut walked = self.memory_walked.lock();
        let now = Instant::now();
        match *walked {
            Some((at, m)) if now.duration_since(at) < max_age => m,
            _ => {
                let m = self.memory();
                *walked = Some((now, m));
                m
            }
        }
    }

    /// Where the head's memory goes, approximately (heap bytes by part; a walk over every series:
    /// for `/metrics` and `strata status`, not for hot paths).
    pub fn memory(&self) -> HeadMemory {
        let mut m = HeadMemory::default();
        let series_fixed = std::mem::size_of::<MemSeries>() + 16;
        for stripe in self.by_ref.iter() {
            let stripe = stripe.read();
            // The by-reference table, and the by-hash map's entries of the same series.
            m.series += (stripe.heap_bytes() + stripe.len() * (8 + 8 + 1) * 8 / 7) as u64;
            for s in stripe.values() {
                m.series += (series_fixed + s.labels.as_bytes().len()) as u64;
                let st = s.lock();
                m.chunks += st.heap_chunk_bytes() as u64;
                m.chunk_index += st.chunk_index_bytes() as u64;
            }
        }
        m.symbols = self.symbols.heap_bytes() as u64;
        m.postings = self.postings.heap_bytes() as u64;
        m.names = self.names.stats().bytes as u64;
        m.chunk_files = self.chunk_files_usage().1;
        m
    }

    /// Chunk files and their bytes.
    pub fn chunk_files_usage(&self) -> (usize, u64) {
        self.chunk_files.as_ref().map_or((0, 0), ChunkFiles::usage)
    }

    pub fn num_series(&self) -> u64 {
        self.num_series.load(Ordering::Relaxed)
    }

    /// Time range of the samples in the head; `None` when empty.
    pub fn time_range(&self) -> Option<(i64, i64)> {
        let (min, max) = (self.min_time.load(Ordering::Relaxed), self.max_time.load(Ordering::Relaxed));
        (min <= max).then_some((min, max))
    }

    /// Time range of the samples (in order or late) of the series matching `matchers`; `None`
    /// when they hold none. Narrower than `time_range` when other series reach further: a read
    /// of these series alone finds nothing of the head outside it. Samples committed while it
    /// looks may be passed over, as a read beside the commit may miss them anyway.
    pub fn time_range_of(&self, matchers: &[Matcher]) -> Option<(i64, i64)> {
        let mut range: Option<(i64, i64)> = None;
        let mut refs = self.postings_for(matchers);
        while let Some(r) = refs.next() {
            let Some(series) = self.series(r) else { continue };
            let state = series.lock();
            if let (Some(min), Some(max)) = (state.min_time(), state.newest_time()) {
                range = Some(range.map_or((min, max), |(lo, hi)| (lo.min(min), hi.max(max))));
            }
        }
        range
    }

    /// Whether the head may hold samples in `[mint, maxt]`; false only when it holds none there
    /// that a reader must see. A commit raises `max_time` and lowers `min_time` before it
    /// returns (samples of a commit still under way may be passed over, as a read beside it
    /// may miss them anyway). Below, `min_time` only ever falls until a truncation stores the
    /// recomputed one, which a late append racing it may lie under; from then on appends under
    /// `min_valid_time` are refused unless backfilling (truncation raises it before dropping
    /// the samples under it), so the lower of the two is the bound.
    pub fn may_hold_samples_in(&self, mint: i64, maxt: i64) -> bool {
        if self.max_time.load(Ordering::Relaxed) < mint {
            return false;
        }
        let min_time = self.min_time.load(Ordering::Relaxed);
        let low = match self.min_valid_time.load(Ordering::Relaxed) {
            i64::MIN => min_time,
            _ if self.opts.backfill => return true,
            valid => min_time.min(valid),
        };
        low <= maxt
    }

    /// Oldest timestamp an append may carry: half a block range behind the newest sample, so that
    /// a block cut from the head's oldest range is never written to again.
    pub fn min_append_time(&self) -> i64 {
        if self.opts.backfill {
            return i64::MIN;
        }
        let max = self.max_time.load(Ordering::Relaxed);
        let by_max = if max == i64::MIN { i64::MIN } else { max.saturating_sub(self.opts.chunk_range_ms / 2) };
        by_max.max(self.min_valid_time.load(Ordering::Relaxed))
    }

    fn stripe(r: u64) -> usize {
        (r as usize) & (STRIPES - 1)
    }

    /// Where reference `r` sits in its stripe's `by_ref` table.
    fn stripe_index(r: u64) -> u64 {
        r / STRIPES as u64
    }

    pub fn series(&self, r: SeriesRef) -> Option<Arc<MemSeries>> {
        self.series_if(r, |_| true)
    }

    /// The series at `r` if `keep` says so: a selection that passes over most of the series
    /// it looks up (ended ones, after churn) does not take a handle on each.
    pub fn series_if(&self, r: SeriesRef, keep: impl FnOnce(&MemSeries) -> bool) -> Option<Arc<MemSeries>> {
        self.by_ref[Self::stripe(r.0)].read().get(Self::stripe_index(r.0)).filter(|s| keep(s)).cloned()
    }

    /// Asks the CPU to bring series `r`'s entry closer (a hint: a selection about to look it
    /// up a few series later does not wait for it then).
    pub fn prefetch_series(&self, r: SeriesRef) {
        if let Some(s) = self.by_ref[Self::stripe(r.0)].read().get(Self::stripe_index(r.0)) {
            crate::prefetch::prefetch_line(Arc::as_ptr(s));
        }
    }

    /// The existing series with exactly `labels`, if the head has it.
    pub fn find_series(&self, labels: &Labels) -> Option<Arc<MemSeries>> {
        self.find(labels, labels.stable_hash())
    }

    /// Finds the series with exactly `labels`.
    fn find(&self, labels: &Labels, hash: u64) -> Option<Arc<MemSeries>> {
        let stripe = self.by_hash[Self::stripe(hash)].read();
        self.find_locked(&stripe, labels, hash)
    }

    /// The series with `labels`, created (and logged) if new. Returns whether it was created.
    pub fn get_or_create(&self, labels: &Labels) -> Result<(Arc<MemSeries>, bool), AppendError> {
        labels.validate().map_err(AppendError::InvalidLabels)?;
        let hash = labels.stable_hash();
        if let Some(s) = self.find(labels, hash) {
            return Ok((s, false));
        }
        self.create_missing(labels, hash)
    }

    /// `get_or_create` of valid `labels` whose `stable_hash` is `hash`, which a lookup has just
    /// missed: straight to the stripe's write lock (a new series costs one lookup less).
    pub(crate) fn create_missing(&self, labels: &Labels, hash: u64) -> Result<(Arc<MemSeries>, bool), AppendError> {
        debug_assert_eq!(labels.stable_hash(), hash, "the hash is the labels'");
        let mut stripe = self.by_hash[Self::stripe(hash)].write();
        // Re-check under the write lock: another appender may have created it meanwhile.
        if let Some(s) = self.find_locked(&stripe, labels, hash) {
            return Ok((s, false));
        }
        let series = self.create_locked(&mut stripe, hash, labels, None)?;
        Ok((series, true))
    }

    /// The existing series whose label set is `pairs` (canonical order, see
    /// `strata_model::pairs_are_canonical`) with `stable_hash` `hash`; no allocation.
    pub(crate) fn find_pairs<N: AsRef<str>, V: AsRef<str>>(
        &self,
        pairs: &[(N, V)],
        hash: u64,
    ) -> Option<Arc<MemSeries>> {
        self.by_hash[Self::stripe(hash)].read().find(hash, |s| self.symbols.equals_pairs(&s.labels, pairs))
    }

    fn find_locked(&self, stripe: &HashStripe, labels: &Labels, hash: u64) -> Option<Arc<MemSeries>> {
        stripe.find(hash, |s| self.symbols.equals(&s.labels, labels))
    }

    /// Creates a series: interns labels, takes a reference (the next one, or during replay the
    /// logged `fixed` one), logs it if the head has a WAL, indexes it. The caller holds the hash
    /// stripe. The reference is taken under the postings lock, so series reach the postings lists
    /// (and the WAL) in reference order and lists stay sorted by appending.
    fn create_locked(
        &self,
        stripe: &mut HashStripe,
        hash: u64,
        labels: &Labels,
        fixed: Option<SeriesRef>,
    ) -> Result<Arc<MemSeries>, AppendError> {
        let ids = self.symbols.intern_labels(labels);
        // Where the name is among the labels, so among their ids (in the same order).
        let name_at = labels.iter().position(|l| &*l.name == METRIC_NAME);
        // The series and its log entry are made before the postings lock, which every
        // appender creating a series waits on (a million new carbon paths over four
        // connections: spinning and yielding on it were 3% of the server's CPU); under it they
        // only get their reference, written over the placeholder.
        let mut series = Arc::new(MemSeries::new(SeriesRef(0), ids));
        let mut entry = Vec::new();
        if self.wal.is_some() {
            entry.reserve(64);
            record::encode_series_entry(SeriesRef(0), labels, &mut entry);
        }
        let mut postings = self.postings.writer();
        let r = match fixed {
            Some(r) => {
                self.next_ref.fetch_max(r.0 + 1, Ordering::Relaxed);
                r
            }
            None => SeriesRef(self.next_ref.fetch_add(1, Ordering::Relaxed)),
        };
        Arc::get_mut(&mut series).expect("no other reference to a series being made").series_ref = r;
        if let Some(wal) = &self.wal {
            record::set_series_entry_ref(&mut entry, r);
            wal.buffer_entry(RecordType::Series as u8, &entry).map_err(|e| AppendError::Wal(e.to_string()))?;
        }
        let replaced = self.by_ref[Self::stripe(r.0)].write().insert(Self::stripe_index(r.0), series.clone());
        debug_assert!(replaced.is_none(), "reference {r:?} handed out twice");
        let new_name = postings.add_counting(r, series.labels.pairs(), name_at) == 1;
        drop(postings);
        if new_name {
            if let Some(name) = name_at.and_then(|k| labels.iter().nth(k)) {
                self.names.add(&name.value);
            }
        }
        match stripe.first.entry(hash) {
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(series.clone());
            }
            std::collections::hash_map::Entry::Occupied(_) => stripe.more.entry(hash).or_default().push(series.clone()),
        }
        self.num_series.fetch_add(1, Ordering::Relaxed);
        self.stats.series_created.fetch_add(1, Ordering::Relaxed);
        Ok(series)
    }

    /// Series creation during replay, keeping the logged reference. Returns the existing
    /// reference if the label set was already logged under another one.
    fn replay_series(&self, r: SeriesRef, labels: &Labels) -> Option<SeriesRef> {
        let hash = labels.stable_hash();
        let mut stripe = self.by_hash[Self::stripe(hash)].write();
        if let Some(existing) = self.find_locked(&stripe, labels, hash) {
            return Some(existing.series_ref);
        }
        // The WAL is attached only after replay, so nothing is logged and creation cannot fail.
        debug_assert!(self.wal.is_none());
        self.create_locked(&mut stripe, hash, labels, Some(r)).expect("replay logs nothing");
        None
    }

    fn note_time(&self, t: i64) {
        self.min_time.fetch_min(t, Ordering::Relaxed);
        self.max_time.fetch_max(t, Ordering::Relaxed);
    }

    /// References of the series matching all `matchers`, ascending.
    pub fn postings_for(&self, matchers: &[Matcher]) -> BoxPostings {
        postings_for_matchers(&HeadIndex(self), matchers)
    }

    /// Deletes samples in `[mint, maxt]` of every series matching `matchers`: logged as tombstones
    /// and hidden from queries at once. Returns the number of series affected.
    pub fn delete(&self, matchers: &[Matcher], mint: i64, maxt: i64) -> Result<usize> {
        let refs = postings::expand(self.postings_for(matchers));
        let stones: Vec<Tombstone> = refs.iter().map(|&series| Tombstone { series, mint, maxt }).collect();
        if stones.is_empty() {
            return Ok(0);
        }
        // Memory first, as for samples: if the log refuses the record, it still goes out ahead
        // of the next commit, so the deletion holds now as it will after a restart.
        self.add_tombstones(&stones);
        if let Some(wal) = &self.wal {
            let mut rec = Vec::new();
            record::encode_tombstones(&stones, &mut rec);
            wal.commit(&[&rec])?;
        }
        Ok(stones.len())
    }

    fn add_tombstones(&self, stones: &[Tombstone]) {
        let mut w = self.tombstones.write();
        for t in stones {
            w.entry(t.series).or_default().push((t.mint, t.maxt));
        }
    }

    /// All deleted intervals, or `None` when nothing is deleted (the common case, which then
    /// costs a query one lock instead of one per series).
    pub(crate) fn tombstones_snapshot(&self) -> Option<U64Map<SeriesRef, Vec<(i64, i64)>>> {
        let t = self.tombstones.read();
        (!t.is_empty()).then(|| t.clone())
    }

    /// Label names of series matching `matchers` (all names if none), sorted.
    pub fn label_names(&self, matchers: &[Matcher]) -> Vec<String> {
        let _gate = self.read_gate();
        let ids: Vec<SymbolId> = if matchers.is_empty() {
            self.postings.label_names()
        } else {
            let mut set = std::collections::HashSet::new();
            for r in postings::expand(self.postings_for(matchers)) {
                if let Some(s) = self.series(r) {
                    set.extend(s.labels.pairs().map(|p| p.0));
                }
            }
            set.into_iter().collect()
        };
        self.sorted_strings(ids)
    }

    /// How many values label `name` has among the head's series.
    pub fn label_value_count(&self, name: &str) -> usize {
        self.symbols.lookup(name).map_or(0, |id| self.postings.label_value_count(id))
    }

    /// Values of label `name` among series matching `matchers` (all series if none), sorted.
    pub fn label_values(&self, name: &str, matchers: &[Matcher]) -> Vec<String> {
        let _gate = self.read_gate();
        let Some(name_id) = self.symbols.lookup(name) else { return Vec::new() };
        let ids: Vec<SymbolId> = if matchers.is_empty() {
            self.postings.label_values(name_id)
        } else {
            let mut set = std::collections::HashSet::new();
            for r in postings::expand(self.postings_for(matchers)) {
                if let Some(s) = self.series(r) {
                    set.extend(s.labels.pairs().filter(|p| p.0 == name_id).map(|p| p.1));
                }
            }
            set.into_iter().collect()
        };
        self.sorted_strings(ids)
    }

    fn sorted_strings(&self, ids: Vec<SymbolId>) -> Vec<String> {
        let mut v: Vec<String> = self.symbols.with(|get| ids.into_iter().map(|id| get(id).to_string()).collect());
        v.sort();
        v
    }

    /// Cardinality statistics: series per metric name and per label pair, top `limit` each.
    pub fn cardinality(&self, limit: usize) -> Cardinality {
        let _gate = self.read_gate();
        let (per_name, pairs) = self.postings.stats();
        let name_id = self.symbols.lookup(strata_model::METRIC_NAME);
        self.symbols.with(|get| {
            let mut by_metric: Vec<(String, usize)> = pairs
                .iter()
                .filter(|((n, _), _)| Some(*n) == name_id)
                .map(|((_, v), c)| (get(*v).to_string(), *c))
                .collect();
            let mut by_pair: Vec<(String, usize)> =
                pairs.iter().map(|((n, v), c)| (format!("{}={}", get(*n), get(*v)), *c)).collect();
            let mut by_label: Vec<(String, usize)> = per_name.iter().map(|(n, c)| (get(*n).to_string(), *c)).collect();
            for v in [&mut by_metric, &mut by_pair, &mut by_label] {
                v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
                v.truncate(limit);
            }
            Cardinality { series: self.num_series(), by_metric, by_pair, by_label }
        })
    }

    /// Held by readers that turn symbol ids into strings: truncation frees (and may reuse) the
    /// symbols of the series it removes only when no reader holds this.
    pub(crate) fn read_gate(&self) -> parking_lot::RwLockReadGuard<'_, ()> {
        self.gc_gate.read()
    }

    /// Whether opening an appender now would wait: truncation holds or waits for the gate
    /// (the lock is task-fair, so a waiting truncation holds off new appenders). A caller
    /// that must not block, such as an async task, can hand its work to a blocking thread
    /// instead. A hint only: truncation may begin right after.
    pub fn appender_would_wait(&self) -> bool {
        self.gc_gate.try_read().is_none()
    }

    /// Oldest timestamp the head may hold: everything older is in blocks.
    pub fn min_valid_time(&self) -> i64 {
        self.min_valid_time.load(Ordering::Relaxed)
    }

    /// Drops everything before `mint` (now persisted in a block): chunks that end before it,
    /// late samples before it written in cut epochs up to `max_epoch` (`begin_cut`; `u64::MAX`:
    /// all), then series left without samples (from the indexes), then symbols no series uses.
    /// In-order appends before `mint` are refused from now on. Returns (chunks dropped, series
    /// removed).
    pub fn truncate(&self, mint: i64, max_epoch: u64) -> (usize, usize) {
        {
            let _gate = self.gc_gate.write();
            self.min_valid_time.fetch_max(mint, Ordering::Relaxed);
        }
        let mut dropped_chunks = 0;
        let mut empty: Vec<Arc<MemSeries>> = Vec::new();
        let mut new_min = i64::MAX;
        for stripe in self.by_ref.iter() {
            let stripe = stripe.read();
            for s in stripe.values() {
                let mut st = s.lock();
                dropped_chunks += st.truncate_before(mint, max_epoch);
                match st.min_time() {
                    Some(t) => new_min = new_min.min(t),
                    None => empty.push(s.clone()),
                }
            }
        }
        self.min_time.store(new_min, Ordering::Relaxed);
        if empty.is_empty() {
            return (dropped_chunks, 0);
        }
        let _gate = self.gc_gate.write();
        let mut dead = std::collections::HashSet::new();
        for s in empty {
            // Re-check under the gate: an appender may have added samples since the scan.
            {
                let mut st = s.lock();
                if st.min_time().is_some() {
                    continue;
                }
                st.removed = true;
            }
            let labels = self.symbols.resolve(&s.labels);
            let hash = labels.stable_hash();
            let mut stripe = self.by_hash[Self::stripe(hash)].write();
            let r = s.series_ref;
            if stripe.first.get(&hash).is_some_and(|f| f.series_ref == r) {
                match stripe.more.get_mut(&hash).and_then(|v| (!v.is_empty()).then(|| v.remove(0))) {
                    Some(next) => {
                        stripe.first.insert(hash, next);
                    }
                    None => {
                        stripe.first.remove(&hash);
                    }
                }
            } else if let Some(v) = stripe.more.get_mut(&hash) {
                v.retain(|x| x.series_ref != r);
            }
            if stripe.more.get(&hash).is_some_and(Vec::is_empty) {
                stripe.more.remove(&hash);
            }
            self.by_ref[Self::stripe(r.0)].write().remove(Self::stripe_index(r.0));
            dead.insert(r);
        }
        self.postings.delete(&dead);
        {
            let mut t = self.tombstones.write();
            t.retain(|r, ivs| {
                ivs.retain(|&(_, maxt)| maxt >= mint);
                !dead.contains(r) && !ivs.is_empty()
            });
        }
        self.num_series.fetch_sub(dead.len() as u64, Ordering::Relaxed);
        self.names.mark_stale();
        // Sweep symbols no live series uses (churned pod names and the like), still under the
        // gate: no series is being created, so no unmarked symbol can gain a user meanwhile.
        let mut used = vec![false; self.symbols.capacity()];
        for stripe in self.by_ref.iter() {
            for s in stripe.read().values() {
                for (n, v) in s.labels.pairs() {
                    used[n as usize] = true;
                    used[v as usize] = true;
                }
            }
        }
        let freed = self.symbols.sweep(&used);
        tracing::debug!(series = dead.len(), symbols = freed, "head garbage-collected series and symbols");
        (dropped_chunks, dead.len())
    }

    /// Rebuilds the dictionary of metric names if it has fallen behind (many names created
    /// since the last build, or series removed) and the pause after the last rebuild is over,
    /// or meanwhile folds the names created since into a smaller dictionary of recent ones;
    /// returns whether it did either. A rebuild takes about a second per million names: for a
    /// background thread.
    pub fn maintain_names(&self) -> bool {
        self.maintain_names_at(std::time::Instant::now())
    }

    /// `maintain_names` as of `now` (tests step past the pause after a rebuild).
    pub(crate) fn maintain_names_at(&self, now: std::time::Instant) -> bool {
        match self.names.wanted(now) {
            None => false,
            Some(names::NamesMaintenance::Rebuild) => {
                self.rebuild_names();
                true
            }
            Some(names::NamesMaintenance::Fold) => {
                self.names.fold_delta();
                true
            }
        }
    }

    /// Rebuilds the dictionary of metric names from the head's names now (`maintain_names`
    /// does when it is due).
    pub fn rebuild_names(&self) {
        self.names.rebuild(|names| {
            let _gate = self.read_gate();
            let Some(name_id) = self.symbols.lookup(METRIC_NAME) else { return };
            let ids = self.postings.label_values(name_id);
            self.symbols.with(|get| ids.into_iter().for_each(|id| names.add(&get(id))));
        });
    }

    /// Calls `visit(node, flags)` for the metric names and path nodes (`index::name_dict`)
    /// `pattern` matches; false, visiting nothing, if the head keeps no dictionary (a
    /// backfill's head).
    pub fn search_names(&self, pattern: &NamePattern, visit: impl FnMut(&[u8], u8) -> bool) -> bool {
        self.names.search(pattern, visit)
    }

    /// The size of the names dictionaries and of the names created since they were built.
    pub fn names_stats(&self) -> NamesStats {
        self.names.stats()
    }

    /// Writes buffered WAL records and fsyncs; then stops the WAL's background fsync.
    pub fn close(&self) -> Result<()> {
        match &self.wal {
            Some(w) => w.close(),
            None => Ok(()),
        }
    }
}

/// The head's heap by part, in bytes (`Head::memory`); `chunk_files` is mapped, not heap: the
/// kernel pages it in for reads and drops it under memory pressure.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct HeadMemory {
    /// Series structures, their packed labels and the two maps finding them.
    pub series: u64,
    /// Chunk bytes on the heap: open chunks, closed ones not yet written out, late samples.
    pub chunks: u64,
    /// The per-series lists of chunk handles (time range and pointer of each chunk).
    pub chunk_index: u64,
    pub symbols: u64,
    pub postings: u64,
    /// The dictionary of metric names and path nodes.
    pub names: u64,
    pub chunk_files: u64,
}

/// An open chunk whose newest sample is this far behind the head's newest is closed when
/// chunks are written out (`persist_chunks`): its series most likely stopped (churn), and its
/// samples would otherwise stay on the heap and in the WAL until the head is cut. Longer than
/// any usual scrape or carbon interval (a series reporting every 10 minutes keeps its chunk).
pub const IDLE_CHUNK_MS: i64 = 15 * 60 * 1000;

/// What one `Head::persist_chunks` wrote.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PersistOutcome {
    pub chunks: usize,
    /// Open chunks closed because their series was idle (`IDLE_CHUNK_MS`).
    pub idle_closed: usize,
    /// Samples in the chunks written.
    pub samples: u64,
    /// Heap bytes the chunks held, and bytes they take in the file.
    pub heap_bytes: u64,
    pub file_bytes: u64,
}

/// A float chunk (XOR) re-encoded dense (`chunkenc::dense`) when that is smaller; `None` keeps
/// the chunk as it is (other encodings, or no gain).
fn denser(data: &[u8], scratch: &mut Vec<strata_model::Sample>) -> Option<Vec<u8>> {
    use crate::chunkenc::{ChunkIterator, Encoding};
    if data.first() != Some(&(Encoding::Xor as u8)) {
        return None;
    }
    scratch.clear();
    ChunkIterator::new(data).ok()?.decode_into(scratch);
    if scratch.is_empty() {
        return None;
    }
    let dense = crate::chunkenc::dense::encode(scratch);
    (dense.len() < data.len()).then_some(dense)
}

/// Series counts for `strata` status output and `/api/v1/status/tsdb`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cardinality {
    pub series: u64,
    pub by_metric: Vec<(String, usize)>,
    pub by_pair: Vec<(String, usize)>,
    pub by_label: Vec<(String, usize)>,
}

/// The head seen through the index interface.
struct HeadIndex<'a>(&'a Head);

impl IndexReader for HeadIndex<'_> {
    fn postings(&self, name: &str, values: &[&str]) -> BoxPostings {
        let h = self.0;
        let Some(n) = h.symbols.lookup(name) else { return Box::new(postings::EmptyPostings) };
        let lists = h.postings.get_many(n, values.iter().filter_map(|v| h.symbols.lookup(v)));
        postings::merge(lists.into_iter().map(|l| Box::new(ListPostings::new(l)) as BoxPostings).collect())
    }

    fn postings_matching(&self, name: &str, prefix: &str, accept: &dyn Fn(&str) -> bool) -> BoxPostings {
        let h = self.0;
        let Some(n) = h.symbols.lookup(name) else { return Box::new(postings::EmptyPostings) };
        let values = h.postings.label_values(n);
        let matching: Vec<SymbolId> = h.symbols.with(|get| {
            values
                .into_iter()
                .filter(|&v| {
                    let s = get(v);
                    s.starts_with(prefix) && accept(&s)
                })
                .collect()
        });
        let lists = h.postings.get_many(n, matching.into_iter());
        postings::merge(lists.into_iter().map(|l| Box::new(ListPostings::new(l)) as BoxPostings).collect())
    }

    fn all_postings(&self) -> BoxPostings {
        Box::new(ListPostings::new(self.0.postings.all()))
    }

    fn search_names(&self, pattern: &NamePattern, visit: &mut dyn FnMut(&[u8], u8) -> bool) -> bool {
        self.0.search_names(pattern, visit)
    }
}

/// Samples handed to one replay worker at a time.
const REPLAY_BATCH_SAMPLES: usize = 8192;
/// Batches queued per replay worker before the reader waits.
const REPLAY_QUEUE_BATCHES: usize = 16;

/// What the replay reader hands a worker: float samples in bulk, or a histograms record's share.
enum ReplayBatch {
    Floats(Vec<RefSample>),
    Histograms(Vec<RefHistogram>),
    /// Samples logged as taken out of order: back into their series' overlays.
    Late(Vec<RefSample>),
}

/// What a replay worker found.
#[derive(Default)]
struct ReplayShard {
    late: HashMap<SeriesRef, Vec<TypedSample>>,
    unknown_refs: u64,
    min_t: i64,
    max_t: i64,
}

/// Replay state: the reading thread decodes records, creates series and routes samples to
/// workers by series reference, so each series is appended to by one worker, in log order.
struct Replay<'a> {
    head: &'a Head,
    /// Chunks of the head chunk files, handed to their series when the series is logged.
    written: chunk_files::Loaded,
    /// A series logged twice under different references maps to the first.
    aliases: HashMap<SeriesRef, SeriesRef>,
    decoded: Vec<RefSample>,
    queues: Vec<Vec<RefSample>>,
    senders: Vec<std::sync::mpsc::SyncSender<ReplayBatch>>,
}

impl<'a> Replay<'a> {
    fn new(
        head: &'a Head,
        senders: Vec<std::sync::mpsc::SyncSender<ReplayBatch>>,
        written: chunk_files::Loaded,
    ) -> Self {
        let queues = senders.iter().map(|_| Vec::with_capacity(REPLAY_BATCH_SAMPLES)).collect();
        Replay { head, written, aliases: HashMap::new(), decoded: Vec::new(), queues, senders }
    }

    /// Gives the series just created under `r` its chunks from the chunk files.
    fn attach_written(&mut self, r: SeriesRef) {
        let Some(chunks) = self.written.remove(&r) else { return };
        let Some(series) = self.head.series(r) else { return };
        if let (Some(first), Some(last)) = (chunks.first(), chunks.last()) {
            self.head.note_time(first.mint);
            self.head.note_time(last.maxt);
        }
        series.lock().attach_written(chunks);
    }

    fn resolve(&self, r: SeriesRef) -> SeriesRef {
        if self.aliases.is_empty() {
            r
        } else {
            self.aliases.get(&r).copied().unwrap_or(r)
        }
    }

    fn apply(&mut self, rec: &[u8]) -> Result<(), RecordError> {
        match record::record_type(rec)? {
            kind @ (RecordType::Samples | RecordType::SamplesWithStart | RecordType::PackedSamples) => {
                self.decoded.clear();
                record::decode_samples_into(kind, &rec[1..], &mut self.decoded)?;
                let n = self.senders.len();
                for i in 0..self.decoded.len() {
                    let mut s = self.decoded[i];
                    s.series = self.resolve(s.series);
                    let w = (s.series.0 % n as u64) as usize;
                    self.queues[w].push(s);
                    if self.queues[w].len() >= REPLAY_BATCH_SAMPLES {
                        self.flush(w);
                    }
                }
                Ok(())
            }
            _ => match record::decode(rec)? {
                Record::Series(v) => {
                    for s in v {
                        match self.head.replay_series(s.series, &s.labels) {
                            Some(existing) => {
                                self.aliases.insert(s.series, existing);
                            }
                            None => self.attach_written(s.series),
                        }
                    }
                    Ok(())
                }
                Record::Tombstones(v) => {
                    let v: Vec<Tombstone> =
                        v.into_iter().map(|t| Tombstone { series: self.resolve(t.series), ..t }).collect();
                    self.head.add_tombstones(&v);
                    Ok(())
                }
                Record::Histograms(v) => {
                    self.route(v, |s| &mut s.series, ReplayBatch::Histograms);
                    Ok(())
                }
                Record::OutOfOrderSamples(v) => {
                    self.route(v, |s| &mut s.series, ReplayBatch::Late);
                    Ok(())
                }
                Record::Exemplars(v) => {
                    for e in v {
                        let r = self.resolve(e.series);
                        let Some(series) = self.head.series(r) else { continue };
                        let head = self.head;
                        // Logged exemplars were accepted once; one refused now (a capacity
                        // made smaller) is dropped quietly.
                        let _ = head.exemplars.add(
                            r,
                            || head.symbols.resolve(&series.labels),
                            exemplars::Exemplar { labels: e.labels, t: e.t, v: e.v },
                        );
                    }
                    Ok(())
                }
                Record::Samples(_) => unreachable!("handled above"),
            },
        }
    }

    /// Sends the items of one record to their series' workers, one batch per worker, each after
    /// the floats queued for it: each series stays in log order.
    fn route<T>(&mut self, items: Vec<T>, series: impl Fn(&mut T) -> &mut SeriesRef, batch: fn(Vec<T>) -> ReplayBatch) {
        let n = self.senders.len();
        let mut per_worker: Vec<Vec<T>> = (0..n).map(|_| Vec::new()).collect();
        for mut item in items {
            let r = series(&mut item);
            *r = self.resolve(*r);
            per_worker[(r.0 % n as u64) as usize].push(item);
        }
        for (w, items) in per_worker.into_iter().enumerate() {
            if !items.is_empty() {
                self.flush(w);
                let _ = self.senders[w].send(batch(items));
            }
        }
    }

    fn flush(&mut self, w: usize) {
        if self.queues[w].is_empty() {
            return;
        }
        let batch = std::mem::replace(&mut self.queues[w], Vec::with_capacity(REPLAY_BATCH_SAMPLES));
        // A worker only stops early by panicking, which the scope re-raises.
        let _ = self.senders[w].send(ReplayBatch::Floats(batch));
    }

    /// Sends what is queued and closes the queues, so the workers finish.
    fn finish(mut self) {
        for w in 0..self.queues.len() {
            self.flush(w);
        }
        if !self.written.is_empty() {
            let chunks: usize = self.written.values().map(Vec::len).sum();
            tracing::warn!(
                series = self.written.len(),
                chunks,
                "head chunk files hold chunks of series the write-ahead log no longer has; they are dropped"
            );
        }
    }
}

/// Appends routed samples; samples that arrive out of order are kept for `merge_late`.
fn replay_worker(head: &Head, rx: std::sync::mpsc::Receiver<ReplayBatch>) -> ReplayShard {
    let mut shard = ReplayShard { min_t: i64::MAX, max_t: i64::MIN, ..Default::default() };
    let range = head.opts.chunk_range_ms;
    for batch in rx {
        match batch {
            ReplayBatch::Floats(batch) => {
                for s in batch {
                    shard.apply(
                        head,
                        s.series,
                        s.t,
                        true,
                        |state| state.append_with_start(s.t, s.st, s.v, range),
                        || TypedSample::float(s.t, s.v).with_start(s.st),
                    );
                }
            }
            ReplayBatch::Late(batch) => {
                let epoch = head.cut_epoch();
                for s in batch {
                    shard.apply(
                        head,
                        s.series,
                        s.t,
                        false,
                        |state| {
                            state.insert_late(s.t, s.v, epoch);
                            Ok(series::Appended::Sample { chunk_created: false })
                        },
                        || unreachable!("a late sample always stores"),
                    );
                }
            }
            ReplayBatch::Histograms(batch) => {
                for s in batch {
                    let RefHistogram { series, t, st, h } = s;
                    shard.apply(
                        head,
                        series,
                        t,
                        true,
                        |state| state.append_histogram_with_start(t, st, &h, range),
                        || TypedSample::histogram(t, h.clone()).with_start(st),
                    );
                }
            }
        }
    }
    shard
}

impl ReplayShard {
    /// Appends one logged sample to its series; a sample that does not append in log order is
    /// kept (`late`) for `merge_late`.
    fn apply(
        &mut self,
        head: &Head,
        r: SeriesRef,
        t: i64,
        in_order: bool,
        append: impl FnOnce(&mut series::SeriesState) -> Result<series::Appended, SampleError>,
        late: impl FnOnce() -> TypedSample,
    ) {
        let stripe = head.by_ref[Head::stripe(r.0)].read();
        let Some(series) = stripe.get(Head::stripe_index(r.0)) else {
            self.unknown_refs += 1;
            return;
        };
        let mut state = series.lock();
        if in_order && head.chunk_files.is_some() && state.written_until().is_some_and(|w| t <= w) {
            // Logged before its chunk was written out: the chunk file has it.
            return;
        }
        let res = append(&mut state);
        drop(state);
        drop(stripe);
        match res {
            Ok(_) => {
                self.min_t = self.min_t.min(t);
                self.max_t = self.max_t.max(t);
            }
            Err(_) => self.late.entry(r).or_default().push(late()),
        }
    }
}

/// Merges what the replay workers found into the head.
fn finish_replay(head: &Head, shards: Vec<ReplayShard>) {
    if !head.opts.backfill {
        head.rebuild_names();
    }
    let unknown: u64 = shards.iter().map(|s| s.unknown_refs).sum();
    if unknown > 0 {
        tracing::warn!(samples = unknown, "WAL replay skipped samples of series that were never logged");
    }

    for shard in shards {
        if shard.min_t <= shard.max_t {
            head.note_time(shard.min_t);
            head.note_time(shard.max_t);
        }
        let late: usize = shard.late.values().map(Vec::len).sum();
        if late > 0 {
            tracing::info!(samples = late, series = shard.late.len(), "WAL replay merged samples logged out of order");
        }
        for (r, mut samples) in shard.late {
            if let Some(series) = head.series(r) {
                for s in &samples {
                    head.note_time(s.t);
                }
                series.lock().merge_late(&mut samples, head.opts.chunk_range_ms);
            }
        }
    }
}

#[cfg(test)]
mod tests;
