//! One series in the head: its label symbols, its closed chunks and the chunk being appended to.
//!
//! Kept compact on purpose (the head holds millions): labels are symbol ids, closed chunks are
//! exact-size shared byte slices with their time range, and the open chunk's appender doubles as
//! the record of the last sample (no separate copy).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use strata_model::{CounterResetHint, FloatHistogram, SeriesRef};

use super::overlay::Overlay;
use super::symbols::PackedLabels;
use crate::chunkenc::xor::{self, XorCut};
use crate::chunkenc::{
    start_time, ChunkIterator, HistogramAppender, Layout, StartTimeWriter, TypedSample, TypedValue, XorAppender,
    CHUNK_BYTES_TARGET, SAMPLES_PER_CHUNK,
};

/// A histogram chunk is cut at `CHUNK_BYTES_TARGET` only once it holds this many samples:
/// histograms are large, and a chunk of one or two would repeat the layout for nothing.
const HISTOGRAM_CHUNK_MIN_SAMPLES: usize = 10;

/// The chunk being appended to: floats or histograms (a series may switch; each switch cuts).
/// The histogram appender is boxed: it is several times larger than the XOR one, and every
/// series of the head holds one of these inline.
#[derive(Debug, Clone)]
pub(crate) enum OpenChunk {
    Xor(XorAppender),
    Histogram(Box<HistogramAppender>),
}

impl OpenChunk {
    fn num_samples(&self) -> usize {
        match self {
            OpenChunk::Xor(a) => a.num_samples(),
            OpenChunk::Histogram(a) => a.num_samples(),
        }
    }

    fn last_t(&self) -> i64 {
        match self {
            OpenChunk::Xor(a) => a.last_t(),
            OpenChunk::Histogram(a) => a.last_t(),
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            OpenChunk::Xor(a) => a.bytes(),
            OpenChunk::Histogram(a) => a.bytes(),
        }
    }

    fn is_full(&self) -> bool {
        match self {
            OpenChunk::Xor(a) => a.is_full(),
            OpenChunk::Histogram(a) => a.is_full(),
        }
    }
}

/// How a histogram sample joins the open chunk.
enum HistogramFit {
    /// As it is (expanded to the layout if it has fewer buckets).
    Append,
    /// After re-encoding the chunk with a wider layout.
    Recode(Layout),
    /// In a new chunk whose first sample has this counter-reset knowledge.
    Cut(CounterResetHint),
}

/// Initial buffer of a new open chunk: enough for a few dozen regular samples; it doubles from
/// there. Closed chunks are then copied to their exact size.
const OPEN_CHUNK_INITIAL_BYTES: usize = 32;

/// An immutable chunk and the time range it covers (inclusive).
#[derive(Clone, Debug)]
pub struct ChunkMeta {
    pub mint: i64,
    pub maxt: i64,
    pub data: HeadChunkBytes,
}

/// A chunk as `SeriesState::each_chunk_into` hands it out.
#[derive(Debug)]
pub enum HeadChunk {
    /// An immutable chunk, shared by reference count.
    Shared(ChunkMeta),
    /// A copy of the open chunk: `bytes` of the caller's arena.
    InArena { mint: i64, maxt: i64, bytes: std::ops::Range<usize> },
}

/// A head chunk's bytes: on the heap, or in a mapped head chunk file (`chunk_files`) once
/// written out. Either way a clone is a reference count, and the bytes never change.
#[derive(Clone, Debug)]
pub enum HeadChunkBytes {
    Heap(Arc<[u8]>),
    /// `len` bytes at `start` of a mapped file (offsets fit u32: files are far below 4 GiB),
    /// or, in a query's chunks only, of the buffer holding the copies of the open chunks it
    /// read (`SeriesState::each_chunk_into`).
    Mapped {
        file: Arc<bytes::Bytes>,
        start: u32,
        len: u32,
    },
}

impl HeadChunkBytes {
    /// `len` bytes at `start` of `file`.
    pub fn mapped(file: &Arc<bytes::Bytes>, start: usize, len: usize) -> Self {
        assert!(start + len <= file.len(), "chunk {start}+{len} outside a file of {} bytes", file.len());
        let start = u32::try_from(start).expect("head chunk files stay below 4 GiB");
        HeadChunkBytes::Mapped { file: file.clone(), start, len: len as u32 }
    }

    /// Whether a series' own chunk was written to a chunk file.
    pub fn is_mapped(&self) -> bool {
        matches!(self, HeadChunkBytes::Mapped { .. })
    }
}

impl From<Vec<u8>> for HeadChunkBytes {
    fn from(v: Vec<u8>) -> Self {
        HeadChunkBytes::Heap(Arc::from(v))
    }
}

impl From<&[u8]> for HeadChunkBytes {
    fn from(v: &[u8]) -> Self {
        HeadChunkBytes::Heap(Arc::from(v))
    }
}

impl std::ops::Deref for HeadChunkBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            HeadChunkBytes::Heap(b) => b,
            HeadChunkBytes::Mapped { file, start, len } => &file[*start as usize..(*start + *len) as usize],
        }
    }
}

impl AsRef<[u8]> for HeadChunkBytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

/// The chunk being appended to and what goes with it. Boxed in `SeriesState`: a series that
/// stopped (its open chunk closed when idle, `close_if_idle`) then keeps one pointer instead of
/// the appender; after churn such series outnumber the live ones in the head.
#[derive(Debug)]
struct Open {
    chunk: OpenChunk,
    /// What the chunk has beside its samples, if anything (a chunk with nothing pays one
    /// pointer).
    beside: Option<Box<Beside>>,
    mint: i64,
    /// The chunk is cut at the first sample at or after this time: the end of its block range
    /// at first, then (once the chunk is a quarter full) an estimate that spreads the range's
    /// remaining samples evenly over chunks of about `SAMPLES_PER_CHUNK`.
    next_at: i64,
}

// Every series with samples keeps an `Open`: what a few readers use (a cut) shares the box of
// what a few writers use (start times) rather than growing all of them.
const _: () = assert!(std::mem::size_of::<Open>() <= 88);

/// What an open chunk may have beside its samples. One box for either: they never go
/// together (a cut is of a plain XOR chunk), and an open chunk is kept for every series.
#[derive(Debug)]
enum Beside {
    /// The chunk's start-time column: present once a sample with a start time opened the
    /// chunk.
    Starts(StartTimeWriter),
    /// Where a reader of the chunk's recent samples starts (`XorCut`): placed by reads, moved
    /// forward by later ones (`SeriesState::move_cut`), gone with the chunk. Only the series
    /// that queries read recent windows of (rules, dashboards) have one.
    Cut(XorCut),
}

impl Open {
    fn starts(&self) -> Option<&StartTimeWriter> {
        match self.beside.as_deref() {
            Some(Beside::Starts(col)) => Some(col),
            _ => None,
        }
    }

    fn cut(&self) -> Option<&XorCut> {
        match self.beside.as_deref() {
            Some(Beside::Cut(c)) => Some(c),
            _ => None,
        }
    }

    /// The chunk's bytes, with its start-time column if it has one.
    fn bytes(&self) -> HeadChunkBytes {
        match self.starts() {
            Some(col) => start_time::join(self.chunk.bytes(), col).into(),
            None => self.chunk.bytes().into(),
        }
    }

    /// `bytes`, appended to `out`.
    fn write_bytes(&self, out: &mut Vec<u8>) {
        match self.starts() {
            Some(col) => out.extend_from_slice(&start_time::join(self.chunk.bytes(), col)),
            None => out.extend_from_slice(self.chunk.bytes()),
        }
    }

    /// Whether it holds a sample in `[mint, maxt]`'s span.
    fn overlaps(&self, mint: i64, maxt: i64) -> bool {
        self.chunk.num_samples() > 0 && self.chunk.last_t() >= mint && self.mint <= maxt
    }

    /// The XOR appender, if the chunk is a plain XOR chunk (no start-time column): the chunks
    /// a cut applies to.
    fn plain_xor(&self) -> Option<&XorAppender> {
        match (&self.chunk, self.starts()) {
            (OpenChunk::Xor(a), None) => Some(a),
            _ => None,
        }
    }

    /// Whether a read from `mint` would decode about `CUT_MIN_SKIP` samples or more before it
    /// (from the cut, or the chunk's start), estimated from the chunk's mean interval.
    fn wants_cut(&self, mint: i64) -> bool {
        let Some(a) = self.plain_xor() else { return false };
        let (n, from) = (a.num_samples(), self.cut().map_or(self.mint, |c| c.t()));
        if n < CUT_MIN_SKIP + 2 || mint <= from {
            return false;
        }
        let span = i128::from(a.last_t()) - i128::from(self.mint);
        let skipped = (i128::from(mint.min(a.last_t())) - i128::from(from)) * (n as i128 - 1);
        skipped >= CUT_MIN_SKIP as i128 * span
    }

    /// Writes the chunk's samples that a read from `mint` needs to `out` (from the cut when it
    /// is at or before `mint`, else all of them), and returns the first one's time.
    fn write_from(&self, mint: i64, out: &mut Vec<u8>) -> i64 {
        match (self.plain_xor(), self.cut()) {
            (Some(a), Some(c)) if c.t() <= mint => {
                xor::write_tail(a.bytes(), c, out);
                c.t()
            }
            _ => {
                self.write_bytes(out);
                self.mint
            }
        }
    }
}

/// Samples a read of the open chunk must be able to skip before it moves the chunk's cut: each
/// move decodes the samples it passes (under the series' lock), and a tail is written out
/// rather than copied, so a cut a few samples on would not pay for itself.
const CUT_MIN_SKIP: usize = 16;

#[derive(Debug, Default)]
pub struct SeriesState {
    /// A boxed slice, not a vector: a series cuts a chunk every couple of hours at most, and
    /// the 8 bytes a capacity takes pay for `MemSeries::newest_s`.
    closed: Box<[ChunkMeta]>,
    open: Option<Box<Open>>,
    /// Set when head truncation removed the series from the head's indexes: a handle kept
    /// elsewhere (a scrape cache) must not append to it any more.
    pub(crate) removed: bool,
    /// Samples taken out of order (`overlay`); boxed, and absent for nearly every series.
    overlay: Option<Box<Overlay>>,
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
    /// At or after the newest sample the series has ever held (in order or late), in whole
    /// seconds rounded up (`NEWEST_UNBOUNDED` past what 32 bits hold), read without the lock:
    /// after churn most series a selection's postings name have ended before its range (pods
    /// replaced since), and locking each of them to walk its chunks was up to a fifth of what an
    /// instant query over churned pods cost. Only raised, by `SeriesGuard` as the lock is
    /// released, so it is never below a sample any reader could see.
    newest_s: AtomicU32,
    /// Locked through `lock`, which keeps `newest_s`.
    state: Mutex<SeriesState>,
}

/// `MemSeries::newest_s` that bounds nothing (a timestamp past 2106).
const NEWEST_UNBOUNDED: u32 = u32::MAX;

/// Whole seconds at or after `t` milliseconds, as `MemSeries::newest_s` keeps them.
fn seconds_at_or_after(t: i64) -> u32 {
    let s = t.div_euclid(1000) + i64::from(t.rem_euclid(1000) != 0);
    u32::try_from(s.max(0)).unwrap_or(NEWEST_UNBOUNDED)
}

impl MemSeries {
    pub fn new(series_ref: SeriesRef, labels: PackedLabels) -> Self {
        MemSeries { series_ref, labels, newest_s: AtomicU32::new(0), state: Mutex::new(SeriesState::default()) }
    }

    /// The series' state, locked. Every change goes through this guard, which raises
    /// `newest_s` to the state's newest sample before it unlocks (if it was changed: reads,
    /// such as every query's, leave the bound alone).
    pub fn lock(&self) -> SeriesGuard<'_> {
        SeriesGuard { series: self, state: self.state.lock(), changed: false }
    }

    /// False only if the series holds no sample at or after `t` (without taking its lock):
    /// its newest sample, in order or late, is older. A sample being appended concurrently
    /// may or may not be counted, as with the lock.
    pub fn may_hold_samples_since(&self, t: i64) -> bool {
        let newest = self.newest_s.load(Ordering::Acquire);
        newest == NEWEST_UNBOUNDED || i64::from(newest) * 1000 >= t
    }
}

/// `MemSeries::lock`'s guard.
#[derive(Debug)]
pub struct SeriesGuard<'a> {
    series: &'a MemSeries,
    state: MutexGuard<'a, SeriesState>,
    /// Whether the state was borrowed mutably: only then can its newest sample have moved.
    changed: bool,
}

impl std::ops::Deref for SeriesGuard<'_> {
    type Target = SeriesState;

    fn deref(&self) -> &SeriesState {
        &self.state
    }
}

impl std::ops::DerefMut for SeriesGuard<'_> {
    fn deref_mut(&mut self) -> &mut SeriesState {
        self.changed = true;
        &mut self.state
    }
}

impl Drop for SeriesGuard<'_> {
    /// Raises `newest_s` while the lock is still held (the fields drop after this), so that
    /// whoever sees a sample through the lock, or after it, sees a bound that covers it.
    fn drop(&mut self) {
        if !self.changed {
            return;
        }
        if let Some(t) = self.state.newest_time() {
            let s = seconds_at_or_after(t);
            if s > self.series.newest_s.load(Ordering::Relaxed) {
                self.series.newest_s.store(s, Ordering::Release);
            }
        }
    }
}

impl SeriesState {
    fn open_chunk(&self) -> Option<&OpenChunk> {
        self.open.as_ref().map(|o| &o.chunk)
    }

    fn open_chunk_mut(&mut self) -> Option<&mut OpenChunk> {
        self.open.as_mut().map(|o| &mut o.chunk)
    }

    /// Timestamp of the newest sample, if any.
    pub fn max_time(&self) -> Option<i64> {
        match self.open_chunk() {
            Some(a) if a.num_samples() > 0 => Some(a.last_t()),
            _ => self.closed.last().map(|c| c.maxt),
        }
    }

    /// Timestamp of the newest sample, in order or late, if any.
    pub fn newest_time(&self) -> Option<i64> {
        let late = self.overlay.as_ref().and_then(|o| o.max_time());
        match (self.max_time(), late) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    /// Timestamp of the oldest sample, in order or late, if any.
    pub fn min_time(&self) -> Option<i64> {
        let in_order = self
            .closed
            .first()
            .map(|c| c.mint)
            .or_else(|| self.open.as_ref().filter(|o| o.chunk.num_samples() > 0).map(|o| o.mint));
        let late = self.overlay.as_ref().and_then(|o| o.min_time());
        match (in_order, late) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Stores a sample that arrived out of order (written in the head's cut epoch `epoch`): it
    /// replaces any sample at `t`, in order or late.
    pub fn insert_late(&mut self, t: i64, v: f64, epoch: u64) {
        self.overlay.get_or_insert_default().insert(t, v, epoch);
    }

    /// The value stored at `t` (the newest write of it), if any; `None` for a histogram.
    pub fn value_at(&self, t: i64) -> Option<f64> {
        if let Some(v) = self.overlay.as_ref().and_then(|o| o.value_at(t)) {
            return Some(v);
        }
        let chunk = self.closed.iter().find(|c| c.mint <= t && t <= c.maxt).map(|c| c.data.clone()).or_else(|| {
            let o = self.open.as_ref().filter(|o| o.overlaps(t, t))?;
            Some(o.bytes())
        })?;
        match ChunkIterator::new(&chunk[..]).ok()? {
            ChunkIterator::Xor(mut it) => it.seek(t).filter(|s| s.t == t).map(|s| s.v),
            ChunkIterator::Dense(mut it) => it.seek(t).filter(|s| s.t == t).map(|s| s.v),
            ChunkIterator::Histogram(_) => None,
        }
    }

    /// The newest sample is at `latest` (if any): whether a sample at `t` is new, a retry of
    /// the newest one (`same` tells), or refused.
    fn check_time(&self, t: i64, same: impl FnOnce(&OpenChunk) -> bool) -> Result<Appended, SampleError> {
        let Some(latest) = self.max_time() else { return Ok(Appended::Sample { chunk_created: true }) };
        if t > latest {
            return Ok(Appended::Sample { chunk_created: false });
        }
        if t < latest {
            return Err(SampleError::OutOfOrder { t, latest });
        }
        // Same timestamp: fine if it is the very same value (a retried write), else an error.
        match self.open_chunk() {
            Some(a) if a.num_samples() > 0 && same(a) => Ok(Appended::Same),
            _ => Err(SampleError::Duplicate { t }),
        }
    }

    /// Whether `(t, v)` may be appended now.
    pub fn appendable(&self, t: i64, v: f64) -> Result<Appended, SampleError> {
        self.check_time(t, |a| match a {
            OpenChunk::Xor(a) => a.last_v().to_bits() == v.to_bits(),
            // A stale NaN on a histogram series is stored as a histogram stale marker.
            OpenChunk::Histogram(a) => strata_model::is_stale_nan(v) && a.last().is_stale(),
        })
    }

    /// Whether the histogram `h` may be appended at `t` now.
    pub fn appendable_histogram(&self, t: i64, h: &FloatHistogram) -> Result<Appended, SampleError> {
        self.check_time(t, |a| matches!(a, OpenChunk::Histogram(a) if a.last().bit_eq(h)))
    }

    /// Whether the open chunk must be cut before a sample at `t`, by size or time; also keeps
    /// the chunk-end estimate.
    fn cut_by_size_or_time(&mut self, t: i64) -> bool {
        let Some(o) = &mut self.open else { return true };
        let a = &o.chunk;
        let n = a.num_samples();
        if a.is_full() {
            return true;
        }
        match a {
            OpenChunk::Xor(_) => {
                if n == SAMPLES_PER_CHUNK / 4 {
                    o.next_at = chunk_end_estimate(o.mint, a.last_t(), o.next_at);
                }
                // Twice the target: the rate rose since the estimate; cut, the next chunk
                // estimates again.
                n >= 2 * SAMPLES_PER_CHUNK || a.bytes().len() >= CHUNK_BYTES_TARGET || t >= o.next_at
            }
            OpenChunk::Histogram(_) => {
                (n >= HISTOGRAM_CHUNK_MIN_SAMPLES && a.bytes().len() >= CHUNK_BYTES_TARGET) || t >= o.next_at
            }
        }
    }

    /// Closes the open chunk and opens `chunk` for samples from `t`; it gets a start-time
    /// column when its first sample has a start time (`st` ≠ 0).
    fn start_chunk(&mut self, t: i64, st: i64, chunk: OpenChunk, chunk_range: i64) {
        self.close_open_chunk();
        self.open = Some(Box::new(Open {
            chunk,
            beside: (st != 0).then(|| Box::new(Beside::Starts(StartTimeWriter::default()))),
            mint: t,
            next_at: chunk_range_end(t, chunk_range),
        }));
    }

    /// Whether a sample with start time `st` needs a new chunk for it: the open chunk has no
    /// start-time column.
    fn cut_for_start_time(&self, st: i64) -> bool {
        st != 0 && self.open.as_ref().is_none_or(|o| o.starts().is_none())
    }

    /// Records the start time of the sample just appended to the open chunk.
    fn push_start(&mut self, t: i64, st: i64) {
        if let Some(Beside::Starts(col)) = self.open.as_mut().and_then(|o| o.beside.as_deref_mut()) {
            col.push(t, st);
        }
    }

    /// Validates and appends. `chunk_range` aligns chunk boundaries with block boundaries so
    /// that no chunk ever spans two blocks.
    pub fn append(&mut self, t: i64, v: f64, chunk_range: i64) -> Result<Appended, SampleError> {
        self.append_with_start(t, 0, v, chunk_range)
    }

    /// `append` of a sample with the start time `st` (0: none).
    pub fn append_with_start(&mut self, t: i64, st: i64, v: f64, chunk_range: i64) -> Result<Appended, SampleError> {
        if self.appendable(t, v)? == Appended::Same {
            return Ok(Appended::Same);
        }
        if strata_model::is_stale_nan(v) && matches!(self.open_chunk(), Some(OpenChunk::Histogram(_))) {
            // Staleness of a histogram series (a scrape target vanished): keep the chunk's kind.
            return self.append_histogram_with_start(t, st, &FloatHistogram::stale_marker(), chunk_range);
        }
        let cut = self.cut_by_size_or_time(t)
            || !matches!(self.open_chunk(), Some(OpenChunk::Xor(_)))
            || self.cut_for_start_time(st);
        if cut {
            // Size the new chunk like the last one: regular series produce similar chunks.
            let bytes = self.closed.last().map_or(OPEN_CHUNK_INITIAL_BYTES, |c| c.data.len() + 8);
            self.start_chunk(t, st, OpenChunk::Xor(XorAppender::with_capacity(bytes)), chunk_range);
        }
        match self.open_chunk_mut() {
            Some(OpenChunk::Xor(a)) => a.append(t, v),
            _ => unreachable!("an XOR chunk was just ensured"),
        }
        self.push_start(t, st);
        Ok(Appended::Sample { chunk_created: cut })
    }

    /// Validates and appends a native histogram (see `append`). A new chunk starts when the
    /// schema, zero threshold or custom bounds change, on a counter reset, and when a gauge
    /// follows a counter or the reverse; new buckets re-encode the open chunk.
    pub fn append_histogram(&mut self, t: i64, h: &FloatHistogram, chunk_range: i64) -> Result<Appended, SampleError> {
        self.append_histogram_with_start(t, 0, h, chunk_range)
    }

    /// `append_histogram` of a sample with the start time `st` (0: none).
    pub fn append_histogram_with_start(
        &mut self,
        t: i64,
        st: i64,
        h: &FloatHistogram,
        chunk_range: i64,
    ) -> Result<Appended, SampleError> {
        if self.appendable_histogram(t, h)? == Appended::Same {
            return Ok(Appended::Same);
        }
        let fit = if self.cut_by_size_or_time(t) || self.cut_for_start_time(st) { None } else { self.histogram_fit(h) };
        let fit = fit.unwrap_or(HistogramFit::Cut(match h.hint {
            CounterResetHint::Gauge => CounterResetHint::Gauge,
            CounterResetHint::Reset => CounterResetHint::Reset,
            _ => CounterResetHint::Unknown,
        }));
        let cut = matches!(fit, HistogramFit::Cut(_));
        match fit {
            HistogramFit::Append => {}
            HistogramFit::Recode(layout) => {
                if let Some(OpenChunk::Histogram(a)) = self.open_chunk_mut() {
                    **a = a.recode(layout);
                }
            }
            HistogramFit::Cut(header) => {
                let layout = if h.is_stale() { Layout::default() } else { Layout::of(h) };
                self.start_chunk(
                    t,
                    st,
                    OpenChunk::Histogram(Box::new(HistogramAppender::new(layout, header))),
                    chunk_range,
                );
            }
        }
        match self.open_chunk_mut() {
            Some(OpenChunk::Histogram(a)) => a.append(t, h),
            _ => unreachable!("a histogram chunk was just ensured"),
        }
        self.push_start(t, st);
        Ok(Appended::Sample { chunk_created: cut })
    }

    /// How `h` joins the open histogram chunk; `None` when there is none.
    fn histogram_fit(&self, h: &FloatHistogram) -> Option<HistogramFit> {
        let Some(OpenChunk::Histogram(a)) = self.open_chunk() else { return None };
        if h.is_stale() {
            return Some(HistogramFit::Append);
        }
        let gauge_chunk = a.header() == CounterResetHint::Gauge;
        let gauge = h.hint == CounterResetHint::Gauge;
        if gauge != gauge_chunk {
            return Some(HistogramFit::Cut(h.hint));
        }
        let last = a.last();
        // After a stale marker the layout is open again: the chunk may restart any way.
        if last.is_stale() || !a.layout().compatible(h) {
            let reset =
                !gauge && (h.hint == CounterResetHint::Reset || (!last.is_stale() && h.counts_decreased(&last)));
            return Some(HistogramFit::Cut(if gauge {
                CounterResetHint::Gauge
            } else if reset {
                CounterResetHint::Reset
            } else {
                CounterResetHint::Unknown
            }));
        }
        if !gauge && (h.hint == CounterResetHint::Reset || h.counts_decreased(&last)) {
            return Some(HistogramFit::Cut(CounterResetHint::Reset));
        }
        if a.layout().covers(h) {
            Some(HistogramFit::Append)
        } else {
            Some(HistogramFit::Recode(a.layout().widened(h)))
        }
    }

    fn close_open_chunk(&mut self) {
        if let Some(o) = self.open.take() {
            if o.chunk.num_samples() > 0 {
                let maxt = o.chunk.last_t();
                let data = o.bytes();
                // Exactly one more: the slice's length is its capacity.
                let mut closed = std::mem::take(&mut self.closed).into_vec();
                closed.reserve_exact(1);
                closed.push(ChunkMeta { mint: o.mint, maxt, data });
                self.closed = closed.into_boxed_slice();
            }
        }
    }

    /// Appends a sample of either kind.
    pub fn append_typed(&mut self, s: &TypedSample, chunk_range: i64) -> Result<Appended, SampleError> {
        match &s.value {
            TypedValue::Float(v) => self.append_with_start(s.t, s.st, *v, chunk_range),
            TypedValue::Histogram(h) => self.append_histogram_with_start(s.t, s.st, h, chunk_range),
        }
    }

    /// Whether any sample may lie in `[mint, maxt]` (a chunk overlaps it).
    pub fn overlaps(&self, mint: i64, maxt: i64) -> bool {
        self.closed_overlapping(mint, maxt).next().is_some()
            || self.open_overlaps(mint, maxt)
            || self.overlay.as_ref().is_some_and(|o| o.count_parts(mint, maxt) > 0)
    }

    /// The in-order chunks overlapping `[mint, maxt]`, oldest first; the open chunk is copied.
    pub fn chunks(&self, mint: i64, maxt: i64) -> Vec<ChunkMeta> {
        let mut out = Vec::new();
        self.each_in_order_chunk(mint, maxt, |c| out.push(c));
        out
    }

    /// The closed in-order chunks overlapping `[mint, maxt]`, oldest first.
    fn closed_overlapping(&self, mint: i64, maxt: i64) -> impl Iterator<Item = &ChunkMeta> {
        self.closed.iter().filter(move |c| c.maxt >= mint && c.mint <= maxt)
    }

    /// Hands each in-order chunk overlapping `[mint, maxt]` to `f`, oldest first (the open
    /// chunk copied).
    fn each_in_order_chunk(&self, mint: i64, maxt: i64, mut f: impl FnMut(ChunkMeta)) {
        self.closed_overlapping(mint, maxt).for_each(|c| f(c.clone()));
        if let Some(o) = self.open.as_ref().filter(|o| o.overlaps(mint, maxt)) {
            f(ChunkMeta { mint: o.mint, maxt: o.chunk.last_t(), data: o.bytes() });
        }
    }

    /// `each_chunk`, but the open chunk's bytes are appended to `arena` and handed over as
    /// their place there (`HeadChunk::InArena`): a reader copying the open chunks of many
    /// series then allocates one buffer for all of them instead of one per series (and frees
    /// one).
    ///
    /// A read from after the open chunk's start gets the chunk from its cut on, when there is
    /// one at or before `mint` (`wants_cut`, `move_cut`).
    pub fn each_chunk_into(
        &self,
        mint: i64,
        maxt: i64,
        max_epoch: u64,
        arena: &mut Vec<u8>,
        mut f: impl FnMut(HeadChunk, u64),
    ) {
        self.closed_overlapping(mint, maxt).for_each(|c| f(HeadChunk::Shared(c.clone()), 0));
        if let Some(o) = self.open.as_ref().filter(|o| o.overlaps(mint, maxt)) {
            let start = arena.len();
            let first = o.write_from(mint, arena);
            f(HeadChunk::InArena { mint: first, maxt: o.chunk.last_t(), bytes: start..arena.len() }, 0);
        }
        if let Some(o) = &self.overlay {
            o.each_chunk(mint, maxt, max_epoch, |c, rank| f(HeadChunk::Shared(c), rank));
        }
    }

    /// For a reader of the newest sample at or before `maxt` only (an instant selector): when
    /// that is the open chunk's last sample, a plain float, and the series has no late
    /// samples (which may rewrite it), writes it to `arena` as a chunk of its own and hands it
    /// to `f` if it is at or after `mint` (else the series has nothing in range), and returns
    /// true; otherwise does nothing and returns false (the caller reads the chunks). The
    /// older samples it leaves out are never the newest at or before `maxt`, so a reader
    /// that merges this with other sources (blocks) finds the same newest sample.
    pub fn newest_float_into(&self, mint: i64, maxt: i64, arena: &mut Vec<u8>, f: impl FnOnce(HeadChunk)) -> bool {
        if self.overlay.is_some() {
            return false;
        }
        let Some(a) = self.open.as_ref().and_then(|o| o.plain_xor()) else { return false };
        if a.num_samples() == 0 || a.last_t() > maxt {
            return false;
        }
        let t = a.last_t();
        if t >= mint {
            let start = arena.len();
            xor::write_one(t, a.last_v(), arena);
            f(HeadChunk::InArena { mint: t, maxt: t, bytes: start..arena.len() });
        }
        true
    }

    /// Whether a read from `mint` should move the open chunk's cut first (`move_cut`): it
    /// would skip enough of the chunk's samples before `mint` to pay for finding the place.
    pub fn wants_cut(&self, mint: i64) -> bool {
        self.open.as_ref().is_some_and(|o| o.wants_cut(mint))
    }

    /// The time the open chunk's cut is at, if it has one.
    #[cfg(test)]
    pub(crate) fn open_cut_t(&self) -> Option<i64> {
        self.open.as_ref().and_then(|o| o.cut()).map(|c| c.t())
    }

    /// Moves the open chunk's cut to its last sample at or before `mint` (one with a sample
    /// after it), decoding from the cut it had. Readers from `mint` or later then copy and
    /// decode the chunk from there (`each_chunk_into`): a rule or a refreshing dashboard reading
    /// the last minutes of a long open chunk again and again decodes those, not the whole
    /// chunk each time.
    pub fn move_cut(&mut self, mint: i64) {
        let Some(o) = self.open.as_deref_mut() else { return };
        let Some(a) = o.plain_xor() else { return };
        if let Some(c) = xor::find_cut(a.bytes(), o.cut(), mint) {
            match o.beside.as_deref_mut() {
                Some(kept) => *kept = Beside::Cut(c),
                None => o.beside = Some(Box::new(Beside::Cut(c))),
            }
        }
    }

    /// Hands each chunk overlapping `[mint, maxt]` to `f` with its rank: the in-order chunks
    /// first, oldest first, rank 0 (the open chunk copied), then the overlay's chunks of cut
    /// epochs up to `max_epoch`, ranked from 1 in write order. Where chunks overlap, the sample
    /// of the higher rank is the one kept at a timestamp. A reader builds its own list without
    /// an intermediate one.
    pub fn each_chunk(&self, mint: i64, maxt: i64, max_epoch: u64, mut f: impl FnMut(ChunkMeta, u64)) {
        self.each_in_order_chunk(mint, maxt, |c| f(c, 0));
        if let Some(o) = &self.overlay {
            o.each_chunk(mint, maxt, max_epoch, f);
        }
    }

    fn open_overlaps(&self, mint: i64, maxt: i64) -> bool {
        self.open.as_ref().is_some_and(|o| o.overlaps(mint, maxt))
    }

    /// Whether the open chunk holds samples, all before `t`.
    fn open_ends_before(&self, t: i64) -> bool {
        self.open_chunk().is_some_and(|a| a.num_samples() > 0 && a.last_t() < t)
    }

    /// Drops in-order chunks that end before `mint`, and late samples before it written in cut
    /// epochs up to `max_epoch`; returns how many chunks went.
    pub fn truncate_before(&mut self, mint: i64, max_epoch: u64) -> usize {
        let before = self.num_chunks();
        if self.closed.iter().any(|c| c.maxt < mint) {
            let mut closed = std::mem::take(&mut self.closed).into_vec();
            closed.retain(|c| c.maxt >= mint);
            self.closed = closed.into_boxed_slice();
        }
        if self.open_ends_before(mint) {
            self.open = None;
        }
        let mut dropped = before - self.num_chunks();
        if let Some(o) = &mut self.overlay {
            dropped += o.truncate_before(mint, max_epoch);
            if o.is_empty() {
                self.overlay = None;
            }
        }
        dropped
    }

    /// The newest timestamp of the chunks written to chunk files: every in-order sample up to
    /// it is in those files (chunks are written oldest first, and in-order samples only grow).
    pub fn written_until(&self) -> Option<i64> {
        self.closed.iter().rev().find(|c| c.data.is_mapped()).map(|c| c.maxt)
    }

    /// Closes the open chunk if its newest sample is older than `before` (a series that stopped:
    /// a replaced pod, a removed path), so that it is written out of the heap with the closed
    /// ones; a later sample starts a new chunk. Returns whether it did.
    pub(crate) fn close_if_idle(&mut self, before: i64) -> bool {
        let idle = self.open_ends_before(before);
        if idle {
            self.close_open_chunk();
        }
        idle
    }

    /// Closed chunks not yet written to a chunk file, oldest first.
    pub(crate) fn unwritten_closed(&self) -> impl Iterator<Item = &ChunkMeta> {
        self.closed.iter().filter(|c| !c.data.is_mapped())
    }

    /// Points the closed chunk that starts at `mint` to its written copy; false if it is gone.
    pub(crate) fn set_written(&mut self, mint: i64, data: HeadChunkBytes) -> bool {
        match self.closed.iter_mut().find(|c| c.mint == mint && !c.data.is_mapped()) {
            Some(c) => {
                c.data = data;
                true
            }
            None => false,
        }
    }

    /// Gives a series replay just created the chunks its chunk files hold (oldest first).
    pub(crate) fn attach_written(&mut self, chunks: Vec<ChunkMeta>) {
        debug_assert!(self.closed.is_empty() && self.open.is_none(), "attached to a series with samples");
        debug_assert!(chunks.iter().all(|c| c.data.is_mapped()));
        self.closed = chunks.into_boxed_slice();
    }

    /// Heap bytes held by chunks (closed and open, late ones included), for the memory breakdown.
    pub fn heap_chunk_bytes(&self) -> usize {
        let closed: usize = self.closed.iter().filter(|c| !c.data.is_mapped()).map(|c| c.data.len()).sum();
        closed + self.open_chunk().map_or(0, |a| a.bytes().len()) + self.overlay.as_ref().map_or(0, |o| o.heap_bytes())
    }

    /// Heap bytes of the closed chunks' handles and the open chunk's appender state.
    pub fn chunk_index_bytes(&self) -> usize {
        self.closed.len() * std::mem::size_of::<ChunkMeta>()
            + self.open.as_ref().map_or(0, |o| {
                std::mem::size_of::<Open>() + o.beside.as_ref().map_or(0, |_| std::mem::size_of::<Beside>())
            })
    }

    pub fn num_chunks(&self) -> usize {
        self.closed.len() + usize::from(self.open_chunk().is_some_and(|a| a.num_samples() > 0))
    }

    /// Merges samples that arrived out of order during WAL replay. They were all accepted live
    /// (concurrent commits to one series may reach the log in another order than they reached
    /// memory), so the series is rebuilt from the union, sorted, with exact duplicates dropped.
    ///
    /// Chunks already written to a chunk file stay as they are: replay only hands samples after
    /// them here (`written_until`), so only the chunks after them are rebuilt.
    pub fn merge_late(&mut self, late: &mut Vec<TypedSample>, chunk_range: i64) {
        let written = self.closed.iter().rposition(|c| c.data.is_mapped()).map_or(0, |i| i + 1);
        let mut all: Vec<TypedSample> = Vec::new();
        for c in self.chunks(i64::MIN, i64::MAX).iter().skip(written) {
            ChunkIterator::new(&c.data[..]).expect("head chunks are valid").decode_typed_into(&mut all);
        }
        all.append(late);
        all.sort_by_key(|s| s.t);
        all.dedup_by(|b, a| a.t == b.t);
        let overlay = self.overlay.take();
        let mut closed = std::mem::take(&mut self.closed).into_vec();
        closed.truncate(written);
        if let Some(last) = closed.last() {
            let after = last.maxt;
            all.retain(|s| s.t > after);
        }
        *self = SeriesState { overlay, closed: closed.into_boxed_slice(), ..SeriesState::default() };
        for s in &all {
            self.append_typed(s, chunk_range).expect("sorted, deduplicated samples always append");
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

    /// The head holds millions of these: the lock-free time bound took the 8 bytes a closed
    /// chunks' capacity did, and a series stays 80 bytes (an allocator size class).
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn a_series_stays_eighty_bytes() {
        assert_eq!(std::mem::size_of::<MemSeries>(), 80);
    }

    #[test]
    fn the_newest_bound_is_whole_seconds_at_or_after() {
        for (t, s) in [
            (0, 0),
            (1, 1),
            (999, 1),
            (1000, 1),
            (1001, 2),
            (-1, 0),
            (-5000, 0),
            (i64::MIN, 0),
            (u32::MAX as i64 * 1000 - 1, u32::MAX),
            (i64::MAX, NEWEST_UNBOUNDED),
        ] {
            assert_eq!(seconds_at_or_after(t), s, "{t}");
        }
    }

    fn series() -> MemSeries {
        let symbols = super::super::symbols::Symbols::default();
        MemSeries::new(SeriesRef(1), symbols.intern_labels(&strata_model::Labels::from_pairs([("x", "a")])))
    }

    proptest::proptest! {
        /// Whatever reaches a series (in-order samples, late ones, a replay's merge, head
        /// truncation, idle closing), a lock-free look never passes over it while it holds a
        /// sample at or after the time asked, and does pass over it from the second after its
        /// newest sample (what lets a churned selection skip ended series).
        #[test]
        fn the_newest_bound_covers_every_sample_and_no_more(
            ops in proptest::collection::vec((0u8..5, 0i64..200_000), 1..60),
        ) {
            let m = series();
            let mut newest = i64::MIN;
            for (op, t) in ops {
                let mut st = m.lock();
                match op {
                    0 | 1 => {
                        if st.append(t, 1.0, RANGE).is_ok() {
                            newest = newest.max(t);
                        }
                    }
                    2 => {
                        if st.max_time().is_some_and(|max| t < max) {
                            st.insert_late(t, 2.0, 0);
                            newest = newest.max(t);
                        }
                    }
                    3 => {
                        let mut late = vec![TypedSample { t, st: 0, value: TypedValue::Float(3.0) }];
                        st.merge_late(&mut late, RANGE);
                        newest = newest.max(t);
                    }
                    _ => {
                        st.truncate_before(t, u64::MAX);
                        st.close_if_idle(t);
                    }
                }
                drop(st);
                if newest > i64::MIN {
                    proptest::prop_assert!(m.may_hold_samples_since(newest), "newest {}", newest);
                    let held = m.lock().newest_time();
                    if let Some(h) = held {
                        proptest::prop_assert!(h <= newest);
                        proptest::prop_assert!(m.may_hold_samples_since(h));
                    }
                    let past = (newest.div_euclid(1000) + 1) * 1000 + 1;
                    proptest::prop_assert!(!m.may_hold_samples_since(past), "newest {}, asked {}", newest, past);
                }
            }
        }
    }

    /// Float-only series must not pay for histograms: the open chunk is no larger than an XOR
    /// appender plus the enum's tag.
    #[test]
    fn the_open_chunk_costs_float_series_nothing_extra() {
        assert!(
            std::mem::size_of::<Option<OpenChunk>>() <= std::mem::size_of::<XorAppender>() + 8,
            "{} vs {}",
            std::mem::size_of::<Option<OpenChunk>>(),
            std::mem::size_of::<XorAppender>()
        );
    }

    #[test]
    fn histogram_chunks_are_cut_at_resets_kind_and_schema_changes_only() {
        use strata_model::histogram::notation::parse;
        let h = |s: &str| parse(s).unwrap();
        let mut s = SeriesState::default();
        s.append_histogram(1, &h("{{count:2 buckets:[1 1]}}"), RANGE).unwrap();
        // New buckets on both sides: the chunk is re-encoded, not cut.
        s.append_histogram(2, &h("{{count:4 offset:-1 buckets:[0 1 2] n_buckets:[1]}}"), RANGE).unwrap();
        // Fewer buckets (the missing ones were empty): expanded, same chunk.
        s.append_histogram(3, &h("{{count:5 buckets:[1 3] n_buckets:[1]}}"), RANGE).unwrap();
        assert_eq!(s.num_chunks(), 1);
        // A populated bucket vanished: a counter reset, so a new chunk.
        assert_eq!(
            s.append_histogram(4, &h("{{count:6 buckets:[6]}}"), RANGE),
            Ok(Appended::Sample { chunk_created: true })
        );
        // A gauge after a counter, a schema change, then floats: each starts a chunk.
        s.append_histogram(5, &h("{{count:1 buckets:[1] counter_reset_hint:gauge}}"), RANGE).unwrap();
        s.append_histogram(6, &h("{{count:0 counter_reset_hint:gauge}}"), RANGE).unwrap();
        s.append_histogram(7, &h("{{schema:1 count:1 buckets:[1] counter_reset_hint:gauge}}"), RANGE).unwrap();
        s.append(8, 1.0, RANGE).unwrap();
        assert_eq!(s.num_chunks(), 5);
        // Retries of the newest sample are no-ops; a different histogram at that time is refused.
        let last = h("{{schema:1 count:1 buckets:[1] counter_reset_hint:gauge}}");
        assert_eq!(s.append_histogram(8, &last, RANGE), Err(SampleError::Duplicate { t: 8 }));
        s.append_histogram(9, &last, RANGE).unwrap();
        assert_eq!(s.append_histogram(9, &last, RANGE), Ok(Appended::Same));
        assert_eq!(s.append_histogram(7, &last, RANGE), Err(SampleError::OutOfOrder { t: 7, latest: 9 }));
    }

    #[test]
    fn late_samples_are_merged_in_order() {
        let mut s = SeriesState::default();
        for t in [10, 30, 40] {
            s.append(t, t as f64, RANGE).unwrap();
        }
        let late = [(20, 20.0), (5, 5.0), (30, 30.0)];
        s.merge_late(&mut late.iter().map(|&(t, v)| TypedSample::float(t, v)).collect(), RANGE);
        let c = s.chunks(i64::MIN, i64::MAX);
        let mut it = ChunkIterator::new(&c[0].data[..]).unwrap();
        let got: Vec<i64> = std::iter::from_fn(|| it.next().map(|s| s.t)).collect();
        assert_eq!(got, vec![5, 10, 20, 30, 40]);
    }
}
