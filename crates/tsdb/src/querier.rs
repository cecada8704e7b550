//! The read path: `select(matchers)` over a time range returns series sorted by label set, each
//! with a sample iterator.
//!
//! A series' chunks come from the head and from every block overlapping the range; they are
//! concatenated in time order, and where chunks overlap (backfilled or not-yet-compacted
//! blocks) they are merged with duplicate timestamps removed.

use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use strata_model::{Label, Labels, Matcher, Sample, SeriesRef, METRIC_NAME};

use crate::block::series_cache::{CachedSeries, SeriesCache};
use crate::block::{Block, ChunkBytes, ChunkReader, ChunkRef, ReadCache};
use crate::chunkenc::xor::XorIterator;
use crate::chunkenc::{by_rank, decode_merged, dense, ChunkError, ChunkIterator, Encoding, TypedSample, HEADER_BYTES};
use crate::error::Result;
use crate::head::series::HeadChunk;
use crate::head::{Head, HeadChunkBytes};
use crate::index::name_dict::{for_each_node, NamePattern, NodeSet};
use crate::index::postings;

/// A cursor over samples in time order.
pub trait SampleIterator {
    /// The next sample.
    fn next(&mut self) -> Option<Sample>;
    /// The first sample with timestamp ≥ `t`; never moves backwards (if the last returned sample
    /// already qualifies it is returned again).
    fn seek(&mut self, t: i64) -> Option<Sample>;
    /// The error that ended iteration early, if any.
    fn err(&self) -> Option<&ChunkError>;
}

/// Where a selected chunk's bytes are: the head's (its open chunk copied), or in a block file.
#[derive(Debug, Clone)]
pub enum ChunkData {
    Mem(HeadChunkBytes),
    Block { reader: Arc<ChunkReader>, chunk: ChunkRef },
}

impl ChunkData {
    /// The chunk's bytes; a block chunk is checked against its CRC here, when first touched.
    pub fn bytes(&self) -> Result<ChunkBytes<'_>, ChunkError> {
        match self {
            ChunkData::Mem(d) => Ok(ChunkBytes::Mapped(d)),
            ChunkData::Block { reader, chunk } => reader.chunk(*chunk),
        }
    }
}

/// One chunk of a selected series, with its time range (inclusive) and rank.
#[derive(Debug, Clone)]
pub struct QueryChunk {
    pub mint: i64,
    pub maxt: i64,
    pub data: ChunkData,
    /// Where chunks overlap, the sample of the higher rank is kept at a timestamp: a block's
    /// chunks rank by its write sequence (`BlockMeta::seq`), the head's above every block's
    /// (`HEAD_RANK`), and a series' late samples above its in-order ones (`head::overlay`).
    pub rank: u64,
}

/// Rank of the head's in-order chunks: above any block's write sequence; the head's late
/// chunks rank above it in write order.
pub const HEAD_RANK: u64 = 1 << 62;

/// One selected series: its labels, its chunks overlapping the range from the head and every
/// block (ordered by start time; overlapping chunks are merged while iterating), and deleted
/// intervals.
#[derive(Debug, Clone)]
pub struct Series {
    pub labels: Labels,
    pub chunks: Vec<QueryChunk>,
    deleted: Vec<(i64, i64)>,
    mint: i64,
    maxt: i64,
}

impl Series {
    /// Samples in the selected range, in time order.
    pub fn iter(&self) -> SeriesIterator<'_> {
        SeriesIterator { series: self, next_chunk: 0, cur: None, last: None, err: None }
    }

    /// The float samples in the range, for tests and tools: iteration stops at a decoding
    /// error or at the first histogram sample. Complete reads use `visit` or `typed_samples`.
    pub fn samples(&self) -> Vec<Sample> {
        let mut it = self.iter();
        std::iter::from_fn(|| it.next()).collect()
    }

    /// Every sample in the range, of either kind, in time order.
    pub fn typed_samples(&self) -> Result<Vec<TypedSample>, ChunkError> {
        let mut out = Vec::new();
        self.visit(|s| out.push(s))?;
        Ok(out)
    }

    /// Asks the CPU to bring closer what reading this series touches first: its chunk list
    /// and its labels (hints: nothing is read). A loop over many series calls it some series
    /// ahead and `prefetch_data` a few series later, when the chunk list is there to read:
    /// each is a separate allocation, a cache miss per series otherwise waited for.
    pub fn prefetch(&self) {
        crate::prefetch::prefetch_line(self.chunks.as_ptr());
        // The labels' first lines: a lookup by name (the metric name, a grouping label)
        // searches the middle of the array.
        let labels = self.labels.as_slice();
        crate::prefetch::prefetch(&labels[..labels.len().min(PREFETCH_LABELS)]);
    }

    /// Asks the CPU to bring the first bytes of this series' first chunk closer when they are
    /// in memory already (a head chunk; a block chunk is found through its reader's cache).
    /// Reads the chunk list, so it is best called after `prefetch` had time to bring it.
    pub fn prefetch_data(&self) {
        if let Some(QueryChunk { data: ChunkData::Mem(bytes), .. }) = self.chunks.first() {
            crate::prefetch::prefetch_line(bytes.as_ptr());
        }
    }

    /// The deleted intervals (inclusive) in this series' blocks and head.
    pub fn deleted_intervals(&self) -> &[(i64, i64)] {
        &self.deleted
    }

    /// Whether a deletion covers `t`.
    fn deleted(&self, t: i64) -> bool {
        self.deleted.iter().any(|&(a, b)| a <= t && t <= b)
    }

    /// Appends the float samples in the range to `out` when every chunk in it holds plain
    /// floats (dense, as compacted blocks store them, or XOR, as the head does), no two
    /// chunks overlap and nothing is deleted; else returns false with `out` as it was, and
    /// the caller reads through `visit`. The samples are those `visit` hands over, without
    /// its per-sample call; a dense chunk is decoded straight into `out`, without the
    /// iterator's buffer: together most of a block query's reading.
    pub fn read_floats(&self, out: &mut Vec<Sample>) -> Result<bool, ChunkError> {
        if !self.deleted.is_empty() || self.chunks.windows(2).any(|w| w[1].mint <= w[0].maxt) {
            return Ok(false);
        }
        let (mint, maxt) = (self.mint, self.maxt);
        let before = out.len();
        for c in &self.chunks {
            if c.maxt < mint {
                continue;
            }
            if c.mint > maxt {
                break;
            }
            let data = c.data.bytes()?;
            let start = out.len();
            match data.first().map(|&b| Encoding::from_byte(b)) {
                // A range that starts or ends inside the chunk (the last minutes of a block's
                // chunk of 240 samples) unpacks the samples in range only, where the chunk's
                // columns allow it.
                Some(Ok(Encoding::Dense)) if data.len() >= HEADER_BYTES && (c.mint < mint || c.maxt > maxt) => {
                    dense::decode_range(&data, mint, maxt, out)?
                }
                Some(Ok(Encoding::Dense)) if data.len() >= HEADER_BYTES => dense::decode(&data, out)?,
                Some(Ok(Encoding::Xor)) if data.len() >= HEADER_BYTES => {
                    // Samples before the range are decoded (XOR decodes from the chunk's start)
                    // but not written: an instant query's window is a few samples at the end
                    // of a head chunk of up to 120, which were written and then drained.
                    let mut it = XorIterator::new(&data[..]);
                    it.decode_range_into(mint, maxt, out);
                    if let Some(e) = it.err() {
                        return Err(e.clone());
                    }
                }
                // Histograms, start times, a damaged header: `visit`'s to read or report.
                _ => {
                    out.truncate(before);
                    return Ok(false);
                }
            }
            if c.mint < mint {
                let early = out[start..].partition_point(|s| s.t < mint);
                out.drain(start..start + early);
            }
            if c.maxt > maxt {
                let kept = out[start..].partition_point(|s| s.t <= maxt);
                out.truncate(start + kept);
                break;
            }
        }
        Ok(true)
    }

    /// Reads the whole series once, in time order, handing each sample (with its start time)
    /// to `f`, clipped to the range, without deleted samples. This is the fast way to read a series (floats of a
    /// single chunk are decoded in one loop, with no seeking); it stops at the first decoding
    /// error and returns it.
    pub fn visit(&self, mut f: impl FnMut(TypedSample)) -> Result<(), ChunkError> {
        let (mint, maxt) = (self.mint, self.maxt);
        let no_deletes = self.deleted.is_empty();
        let keep = |t: i64| t >= mint && (no_deletes || !self.deleted(t));
        let chunks = &self.chunks;
        let mut i = 0;
        while i < chunks.len() {
            // Chunks are in time order: one that starts past the range ends the read, not
            // decoded (as `read_floats` does; decoded, its first sample ended it, and bytes
            // it cannot read were an error for a chunk the range does not reach).
            if chunks[i].mint > maxt {
                break;
            }
            let mut end = i + 1;
            let mut group_maxt = chunks[i].maxt;
            while end < chunks.len() && chunks[end].mint <= group_maxt {
                group_maxt = group_maxt.max(chunks[end].maxt);
                end += 1;
            }
            if group_maxt < mint {
                i = end;
                continue;
            }
            if end == i + 1 {
                match ChunkIterator::new(chunks[i].data.bytes()?)? {
                    ChunkIterator::Xor(mut it) => {
                        while let Some(s) = it.next() {
                            if s.t > maxt {
                                return it.err().cloned().map_or(Ok(()), Err);
                            }
                            if keep(s.t) {
                                f(TypedSample::float(s.t, s.v).with_start(it.start()));
                            }
                        }
                        if let Some(e) = it.err() {
                            return Err(e.clone());
                        }
                    }
                    ChunkIterator::Dense(mut it) => {
                        if let Some(e) = it.err() {
                            return Err(e.clone());
                        }
                        while let Some(s) = it.next() {
                            if s.t > maxt {
                                return Ok(());
                            }
                            if keep(s.t) {
                                f(TypedSample::float(s.t, s.v));
                            }
                        }
                    }
                    ChunkIterator::Histogram(mut it) => {
                        while let Some((t, h)) = it.next() {
                            if t > maxt {
                                return Ok(());
                            }
                            if keep(t) {
                                f(TypedSample::histogram(t, h).with_start(it.start()));
                            }
                        }
                        if let Some(e) = it.err() {
                            return Err(e.clone());
                        }
                    }
                }
            } else {
                for s in merge_typed(&chunks[i..end])? {
                    if s.t > maxt {
                        return Ok(());
                    }
                    if keep(s.t) {
                        f(s);
                    }
                }
            }
            i = end;
        }
        Ok(())
    }
}

/// Decodes overlapping chunks of either kind into one run, keeping at each timestamp the
/// sample of the highest-ranked chunk.
fn merge_typed(chunks: &[QueryChunk]) -> Result<Vec<TypedSample>, ChunkError> {
    let mut samples = Vec::new();
    decode_merged(by_rank(chunks, |c| c.rank).map(|c| c.data.bytes()), &mut samples)?;
    Ok(samples)
}

/// The chunk (or merged group of overlapping chunks) being read.
#[derive(Debug)]
#[allow(clippy::large_enum_variant, reason = "one cursor per series being read, never stored in bulk")]
enum Cursor<'a> {
    Chunk(ChunkIterator<ChunkBytes<'a>>),
    /// Samples of chunks that overlap in time (from overlapping blocks, or a block and the
    /// head), merged in time order with duplicate timestamps dropped; `pos` is the seek cursor.
    Merged {
        samples: Vec<Sample>,
        pos: usize,
    },
}

impl Cursor<'_> {
    fn seek(&mut self, t: i64) -> Option<Sample> {
        match self {
            Cursor::Chunk(it) => it.seek(t),
            Cursor::Merged { samples, pos } => {
                *pos += samples[*pos..].partition_point(|s| s.t < t);
                samples.get(*pos).copied()
            }
        }
    }

    fn err(&self) -> Option<&ChunkError> {
        match self {
            Cursor::Chunk(it) => it.err(),
            Cursor::Merged { .. } => None,
        }
    }
}

/// Iterates one series' chunks, clipped to the selected range, skipping deleted intervals.
#[derive(Debug)]
pub struct SeriesIterator<'a> {
    series: &'a Series,
    next_chunk: usize,
    cur: Option<Cursor<'a>>,
    last: Option<Sample>,
    err: Option<ChunkError>,
}

impl SeriesIterator<'_> {
    fn deleted(&self, t: i64) -> bool {
        self.series.deleted(t)
    }

    /// Opens the next chunk whose range reaches `t`, merging it with any chunks it overlaps.
    fn open_chunk_reaching(&mut self, t: i64) -> bool {
        let chunks = &self.series.chunks;
        while self.next_chunk < chunks.len() && chunks[self.next_chunk].maxt < t {
            self.next_chunk += 1;
        }
        let first = self.next_chunk;
        let Some(c) = chunks.get(first) else { return false };
        let mut end = first + 1;
        let mut group_maxt = c.maxt;
        while end < chunks.len() && chunks[end].mint <= group_maxt {
            group_maxt = group_maxt.max(chunks[end].maxt);
            end += 1;
        }
        self.next_chunk = end;
        let opened = if end == first + 1 {
            c.data.bytes().and_then(ChunkIterator::new).map(Cursor::Chunk)
        } else {
            merge_chunks(&chunks[first..end])
        };
        match opened {
            Ok(cur) => {
                self.cur = Some(cur);
                true
            }
            Err(e) => {
                self.err = Some(e);
                false
            }
        }
    }

    fn advance(&mut self, t: i64) -> Option<Sample> {
        let mut t = t.max(self.series.mint);
        loop {
            if self.err.is_some() {
                return None;
            }
            if self.cur.is_none() && !self.open_chunk_reaching(t) {
                self.last = None;
                return None;
            }
            let found = {
                let it = self.cur.as_mut().expect("a chunk is open");
                let found = it.seek(t);
                if found.is_none() {
                    self.err = it.err().cloned();
                }
                found
            };
            match found {
                Some(s) if s.t > self.series.maxt => {
                    self.next_chunk = self.series.chunks.len();
                    self.cur = None;
                    self.last = None;
                    return None;
                }
                Some(s) if self.deleted(s.t) => match s.t.checked_add(1) {
                    Some(n) => t = n,
                    None => return None,
                },
                Some(s) => {
                    self.last = Some(s);
                    return Some(s);
                }
                None => self.cur = None,
            }
        }
    }

    fn advance_past(&mut self, t: i64) -> Option<Sample> {
        match t.checked_add(1) {
            Some(n) => self.advance(n),
            None => None,
        }
    }
}

impl SampleIterator for SeriesIterator<'_> {
    fn next(&mut self) -> Option<Sample> {
        match self.last {
            None if self.next_chunk == 0 && self.cur.is_none() => self.advance(i64::MIN),
            None => None,
            Some(s) => self.advance_past(s.t),
        }
    }

    fn seek(&mut self, t: i64) -> Option<Sample> {
        match self.last {
            Some(s) if s.t >= t => Some(s),
            None if self.next_chunk > 0 || self.cur.is_some() => None,
            _ => self.advance(t),
        }
    }

    fn err(&self) -> Option<&ChunkError> {
        self.err.as_ref()
    }
}

/// Decodes overlapping chunks into one run, keeping at each timestamp the sample of the
/// highest-ranked chunk.
fn merge_chunks<'a>(chunks: &'a [QueryChunk]) -> Result<Cursor<'a>, ChunkError> {
    let mut samples = Vec::new();
    decode_merged(by_rank(chunks, |c| c.rank).map(|c| c.data.bytes()), &mut samples)?;
    Ok(Cursor::Merged { samples, pos: 0 })
}

/// The blocks a querier reads: a shared, swappable list (the database replaces it when blocks
/// are written, compacted or deleted).
pub type BlockList = parking_lot::RwLock<Arc<Vec<Arc<Block>>>>;

/// Reads the head and the blocks over `[mint, maxt]` (inclusive, milliseconds).
pub struct Querier<'a> {
    head: &'a Head,
    blocks: Option<&'a BlockList>,
    mint: i64,
    maxt: i64,
    /// `select` fails once it has found more series than this, before loading more.
    max_series: usize,
    /// Threads `select` reads blocks on.
    threads: usize,
    /// Asked every [`INTERRUPT_EVERY`] series while selecting; `Some` stops the selection.
    interrupt: Option<Interrupt<'a>>,
    /// `select` fails once its sources together have found more chunks than this: chunk
    /// references are what a selection holds per sample, so this bounds its memory before
    /// any sample is read.
    max_chunks: usize,
    /// Chunks found so far by this querier's selections (sources run on several threads).
    chunks_found: AtomicUsize,
    /// False: `select` reads the blocks only (a rollup tier's, which the head has no part of).
    read_head: bool,
    /// `select` lists the series with samples in range without their chunks (`labels_only`).
    labels_only: bool,
    /// Of a head series whose newest sample is at or before `maxt`, `select` reads only that
    /// sample (`newest_only`).
    newest_only: bool,
    /// Block series entries go through the process' `SeriesCache` (always, but in tests that
    /// compare with reads straight from the indexes).
    series_cache: bool,
}

impl std::fmt::Debug for Querier<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Querier")
            .field("mint", &self.mint)
            .field("maxt", &self.maxt)
            .field("max_series", &self.max_series)
            .field("threads", &self.threads)
            .field("interrupt", &self.interrupt.is_some())
            .finish_non_exhaustive()
    }
}

/// The reader's question, asked during a selection: should it stop now, and why?
pub type Interrupt<'a> = &'a (dyn Fn() -> Option<crate::error::Stop> + Sync);

/// The bounds of a read made of several selections (`Db::rollup_select`): each selection
/// gets them (`Querier::limit_series`, `limit_chunks`, `interrupt`).
#[derive(Clone, Copy)]
pub struct ReadLimits<'a> {
    pub max_series: usize,
    pub max_chunks: usize,
    pub interrupt: Option<Interrupt<'a>>,
    /// Threads the read may decode on (a tier's buckets); 0 for the machine's cores.
    pub threads: usize,
}

impl Default for ReadLimits<'_> {
    fn default() -> Self {
        ReadLimits { max_series: usize::MAX, max_chunks: usize::MAX, interrupt: None, threads: 0 }
    }
}

impl std::fmt::Debug for ReadLimits<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadLimits")
            .field("max_series", &self.max_series)
            .field("max_chunks", &self.max_chunks)
            .field("interrupt", &self.interrupt.is_some())
            .field("threads", &self.threads)
            .finish()
    }
}

/// Fewer head series than this per thread are not worth a thread of their own (a few
/// microseconds each: a thread costs tens).
const HEAD_PARALLEL_SERIES_MIN: usize = 256;
/// A selection of this many series or more reads them on background threads
/// (`workers::background`): a query over 100k series then takes the cores a dashboard's small
/// queries leave it, instead of holding them up (a panel over 1000 series took 3.3 times as
/// long beside two such queries). Small in this crate's tests, so that their selections take
/// that path too.
pub const BACKGROUND_SERIES: usize = if cfg!(test) { 8 } else { 32_768 };
/// The most series of a block one thread reads at once when blocks are read in parallel
/// (`Querier::select_in_parallel`; tests, whose blocks hold a handful, take several pieces).
const SELECT_PIECE_IDS: usize = if cfg!(test) { 3 } else { 2048 };

/// The size of the buffers a head selection copies open chunks into.
const ARENA_BLOCK: usize = 256 << 10;

/// A buffer with less room left than this is sealed before the next series: an open chunk
/// rarely holds more, and one that does only makes the buffer grow.
const ARENA_BLOCK_SLACK: usize = 16 << 10;

/// Label sets given as head symbol ids, each as the ranks of its names and values among the
/// distinct symbols of all of them, with those symbols' strings: what orders the sets
/// (`order`) and resolves them (`labels`), each symbol looked up in the head's table once for
/// the whole selection rather than once per label (a ninth of an instant query over 65,000
/// head series went to resolving their labels through the table). The sets are added one at
/// a time (`add`), so that a selection can let go of each series as soon as it has read it.
///
/// Series compare as runs of ranks instead of strings: the distinct symbols of the selection
/// (a few thousand for hundreds of thousands of series) are sorted once by their strings, and
/// a set becomes the ranks of its names and values in label order. Two runs compare as the
/// label sets do: label by label, name then value, a prefix first. The string comparisons of a
/// plain sort were about a tenth of an instant query over 131k head series.
#[derive(Default)]
struct RankedLabels {
    /// Each distinct symbol's index in `ids`, in the order first met.
    local: crate::hash::U64Map<crate::head::symbols::SymbolId, u32>,
    ids: Vec<crate::head::symbols::SymbolId>,
    /// The distinct symbols' strings, by rank (once `rank` has run).
    strings: Vec<Arc<str>>,
    /// Every set's symbols in one buffer (local indexes, ranks once `rank` has run); `ends[i]`
    /// is where set i's run ends.
    runs: Vec<u32>,
    ends: Vec<usize>,
}

impl RankedLabels {
    /// Room for `sets` sets, of as many labels as the first one added (`add`).
    fn with_capacity(sets: usize) -> Self {
        RankedLabels { ends: Vec::with_capacity(sets), ..Default::default() }
    }

    /// Adds a set (before `rank`).
    fn add(&mut self, set: &crate::head::symbols::PackedLabels) {
        debug_assert!(self.strings.is_empty(), "sets are added before ranking");
        let first = self.ends.is_empty();
        for (n, v) in set.pairs() {
            for id in [n, v] {
                let next = self.ids.len() as u32;
                let at = *self.local.entry(id).or_insert(next);
                if at == next {
                    self.ids.push(id);
                }
                self.runs.push(at);
            }
        }
        if first {
            // Series of a selection mostly have the same number of labels: the runs sized
            // once, not grown by doubling through fresh pages.
            self.runs.reserve(self.runs.len() * self.ends.capacity().saturating_sub(1));
        }
        self.ends.push(self.runs.len());
    }

    /// Resolves the distinct symbols, sorts them, and turns every run into ranks.
    fn rank(&mut self, get: &dyn Fn(crate::head::symbols::SymbolId) -> Arc<str>) {
        // Copies of the head's strings, not clones: every label of every selected series
        // clones one of these, and the head's own are shared with every other thread (the
        // other half of a parallel selection, appenders, the evaluation dropping labels), so a
        // clone of theirs is an atomic increment on a cache line other cores keep taking away.
        let mut symbols: Vec<(Arc<str>, u32)> =
            self.ids.iter().enumerate().map(|(i, &id)| (Arc::from(&*get(id)), i as u32)).collect();
        symbols.sort_unstable();
        let mut rank_of = vec![0u32; symbols.len()];
        for (r, (_, local)) in symbols.iter().enumerate() {
            rank_of[*local as usize] = r as u32;
        }
        for x in &mut self.runs {
            *x = rank_of[*x as usize];
        }
        self.strings = symbols.into_iter().map(|(s, _)| s).collect();
    }

    /// Asks the CPU to bring set `i`'s bounds in `ends` closer (a hint), for a `prefetch_run`
    /// a little later.
    fn prefetch_bounds(&self, i: u32) {
        crate::prefetch::prefetch_line(self.ends.as_ptr().wrapping_add((i as usize).saturating_sub(1)));
    }

    /// Asks the CPU to bring the start of set `i`'s run closer (reads its bounds).
    fn prefetch_run(&self, i: u32) {
        let start = if i == 0 { 0 } else { self.ends[i as usize - 1] };
        crate::prefetch::prefetch_line(self.runs.as_ptr().wrapping_add(start));
    }

    fn run(&self, i: u32) -> &[u32] {
        let i = i as usize;
        &self.runs[if i == 0 { 0 } else { self.ends[i - 1] }..self.ends[i]]
    }

    /// Indexes of the sets in label order (after `rank`).
    ///
    /// Each run's first ranks are packed into a `u128`, most significant first, each as rank + 1
    /// in as few bits as the largest needs, 0 past the run's end: the packed words compare as
    /// those ranks do in the slices, a shorter run first. Only runs that agree on all of them
    /// (equal words) are compared further, past them. Sorting the slices themselves walked the
    /// labels every set shares (the name, most of the rest) at each of a sort's comparisons: a
    /// tenth of an instant query over 8000 head series.
    fn order(&self) -> Vec<u32> {
        // Ranks are below `strings.len()`, so rank + 1 fits in the bits of that length.
        let bits = (u32::BITS - (self.strings.len() as u32).leading_zeros()).max(1);
        let per_key = (u128::BITS / bits) as usize;
        let mut keyed: Vec<(u128, u32)> = (0..self.ends.len() as u32)
            .map(|i| {
                let run = self.run(i);
                let key =
                    (0..per_key).fold(0u128, |key, k| (key << bits) | run.get(k).map_or(0, |&r| u128::from(r) + 1));
                (key, i)
            })
            .collect();
        let rest = |i: u32| self.run(i).get(per_key..).unwrap_or(&[]);
        keyed.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| rest(a.1).cmp(rest(b.1))));
        keyed.into_iter().map(|(_, i)| i).collect()
    }

    /// Set `i` as labels.
    fn labels(&self, i: u32) -> Labels {
        let label =
            |p: &[u32]| Label { name: self.strings[p[0] as usize].clone(), value: self.strings[p[1] as usize].clone() };
        Labels::from_sorted_iter_unchecked(self.run(i).chunks_exact(2).map(label))
    }
}

/// Points the open chunks of `found` that were copied into `arena` (their bytes still the
/// `placeholder`) at it, now that it is complete.
fn seal_arena(arena: Vec<u8>, placeholder: &Arc<bytes::Bytes>, found: &mut [(SeriesRef, Vec<QueryChunk>)]) {
    let arena = Arc::new(bytes::Bytes::from(arena));
    for c in found.iter_mut().flat_map(|(_, chunks)| chunks.iter_mut()) {
        if let ChunkData::Mem(HeadChunkBytes::Mapped { file, .. }) = &mut c.data {
            if Arc::ptr_eq(file, placeholder) {
                *file = arena.clone();
            }
        }
    }
}

/// How many of a series' labels `Series::prefetch` asks for: node-exporter series have 3-7
/// (four cache lines of 32-byte labels at most).
const PREFETCH_LABELS: usize = 7;

/// Series selected between two questions to the interrupt: often enough that a deadline is
/// seen within a millisecond or so, rarely enough to cost nothing.
const INTERRUPT_EVERY: usize = 1024;

impl<'a> Querier<'a> {
    /// A querier over the head alone.
    pub fn new(head: &'a Head, mint: i64, maxt: i64) -> Self {
        Querier::with_source(head, None, mint, maxt)
    }

    /// A querier over the head and the blocks in `blocks`.
    pub fn with_blocks(head: &'a Head, blocks: &'a BlockList, mint: i64, maxt: i64) -> Self {
        Querier::with_source(head, Some(blocks), mint, maxt)
    }

    fn with_source(head: &'a Head, blocks: Option<&'a BlockList>, mint: i64, maxt: i64) -> Self {
        Querier {
            head,
            blocks,
            mint,
            maxt,
            max_series: usize::MAX,
            threads: 1,
            interrupt: None,
            max_chunks: usize::MAX,
            chunks_found: AtomicUsize::new(0),
            read_head: true,
            labels_only: false,
            newest_only: false,
            series_cache: true,
        }
    }

    /// Makes `select` list the series that have samples in range with no chunks: what a
    /// reader that answers from elsewhere (a rollup tier) needs to know, without holding, or
    /// counting against `limit_chunks`, a reference per raw chunk of a long range.
    pub fn labels_only(mut self) -> Self {
        self.labels_only = true;
        self
    }

    /// Makes `select` serve a reader that wants, of each series, only the newest sample at or
    /// before `maxt` (an instant selector): a head series whose newest sample that is gets a
    /// chunk of that one sample instead of its chunks in range (`SeriesState::newest_float_into`).
    /// Dashboards and rules ask for the newest value of series still in the head all the
    /// time; their chunks were copied and decoded from the start of the range to find it (an
    /// instant count of 14,000 such series: 23-24 ms before, 13-17 ms with this). Blocks are
    /// read as usual.
    pub fn newest_only(mut self) -> Self {
        self.newest_only = true;
        self
    }

    /// Applies `limits` (series, chunks, interrupt).
    pub fn with_limits(mut self, limits: &ReadLimits<'a>) -> Self {
        self.max_series = limits.max_series;
        self.max_chunks = limits.max_chunks;
        self.interrupt = limits.interrupt;
        self
    }

    /// Makes `select` read the blocks only, not the head (a rollup tier's blocks).
    pub fn without_head(mut self) -> Self {
        self.read_head = false;
        self
    }

    /// Makes `select` fail with `TooManyChunks` rather than hold more than `n` chunk
    /// references (counted across sources as they are found).
    pub fn limit_chunks(mut self, n: usize) -> Self {
        self.max_chunks = n;
        self
    }

    /// Counts `n` more chunks found; an error past the limit.
    fn count_chunks(&self, n: usize) -> Result<()> {
        if self.max_chunks == usize::MAX {
            return Ok(());
        }
        let before = self.chunks_found.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        if before + n > self.max_chunks {
            return Err(crate::Error::TooManyChunks { limit: self.max_chunks });
        }
        Ok(())
    }

    /// Makes `select` read every block series entry from its index, as if the `SeriesCache`
    /// held none (for tests that compare the two).
    #[cfg(test)]
    pub(crate) fn without_series_cache(mut self) -> Self {
        self.series_cache = false;
        self
    }

    /// Lets `select` read blocks on up to `n` threads, the calling one reading the head meanwhile
    /// (1, the default: all on the calling one).
    pub fn parallelism(mut self, n: usize) -> Self {
        self.threads = n.max(1);
        self
    }

    /// Makes `select` fail with `TooManySeries` rather than load more than `n` series (per
    /// source, then after merging), so one query cannot exhaust memory.
    pub fn limit_series(mut self, n: usize) -> Self {
        self.max_series = n;
        self
    }

    /// Makes `select` (and the label lookups) ask `interrupt` as it goes, and stop with
    /// `Error::Stopped` when it answers: a query's deadline and cancellation hold during
    /// selection too, however many series match.
    pub fn interrupt(mut self, interrupt: Interrupt<'a>) -> Self {
        self.interrupt = Some(interrupt);
        self
    }

    fn check_limit(&self, n: usize) -> Result<()> {
        if n > self.max_series {
            return Err(crate::Error::TooManySeries { limit: self.max_series });
        }
        Ok(())
    }

    /// The interrupt's answer, every [`INTERRUPT_EVERY`]th call (`i` counts the calls).
    fn check_interrupt(&self, i: usize) -> Result<()> {
        if !i.is_multiple_of(INTERRUPT_EVERY) {
            return Ok(());
        }
        match self.interrupt.and_then(|f| f()) {
            Some(stop) => Err(crate::Error::Stopped(stop)),
            None => Ok(()),
        }
    }

    /// The blocks overlapping the range. Read *after* the head: the database adds a block before
    /// truncating the head, so a reader sees the data in the head, in the block, or (briefly) in
    /// both, where the merge drops the duplicates; never in neither.
    fn blocks(&self) -> Vec<Arc<Block>> {
        let Some(list) = self.blocks else { return Vec::new() };
        let list = list.read().clone();
        list.iter().filter(|b| b.overlaps(self.mint, self.maxt) && !b.is_corrupt()).cloned().collect()
    }

    /// Series matching every matcher with a chunk overlapping the range (whose samples may still
    /// all fall outside it, or be deleted), sorted by labels. A
    /// block found corrupt is reported (naming block and file) and flagged, so the database sets
    /// it aside.
    pub fn select(&self, matchers: &[Matcher]) -> Result<Vec<Series>> {
        let blocks = self.blocks();
        let threads = crate::workers::threads_here(self.threads).min(blocks.len());
        // Each source's selection is in label order; they are merged, not sorted together.
        let mut sources = Vec::with_capacity(1 + blocks.len());
        if threads <= 1 {
            let head = self.select_head(matchers)?;
            // One string per label text across the head and the blocks, so copies of a series
            // from several of them share their strings and compare by pointer when merged.
            let mut interner = ReadCache::default();
            for s in &head {
                for l in s.labels.iter() {
                    interner.adopt(&l.name);
                    interner.adopt(&l.value);
                }
            }
            sources.push(head);
            for b in &blocks {
                sources.push(self.select_block(b, matchers, &mut interner).inspect_err(|e| b.mark_corrupt_if(e))?);
            }
        } else {
            let (head, per_block) = self.select_in_parallel(&blocks, matchers, threads)?;
            sources.push(head);
            sources.extend(per_block);
        }
        let out = merge_sorted(sources);
        self.check_limit(out.len())?;
        Ok(out)
    }

    /// The head's selection (on this thread) and each block's (on `threads` others), in block
    /// order. Work is taken by whichever thread is free, in pieces of at most
    /// `SELECT_PIECE_IDS` series of a block, so the threads finish together however unequal
    /// the blocks are (given whole blocks in turn, one thread read two of three day-long blocks
    /// while the other waited: 80-100 ms against 33 ms for 65,500 series). First every block's
    /// ids are found (a block at a time), then, past a barrier, the pieces are read. Each
    /// thread shares strings among the pieces it reads.
    fn select_in_parallel(
        &self,
        blocks: &[Arc<Block>],
        matchers: &[Matcher],
        threads: usize,
    ) -> Result<(Vec<Series>, Vec<Vec<Series>>)> {
        use std::sync::atomic::Ordering::Relaxed;
        use std::sync::{Barrier, Mutex, OnceLock};
        let next_block = AtomicUsize::new(0);
        let ids: Vec<OnceLock<Result<Vec<SeriesRef>>>> = blocks.iter().map(|_| OnceLock::new()).collect();
        let found: Vec<AtomicUsize> = blocks.iter().map(|_| AtomicUsize::new(0)).collect();
        let found_ids = Barrier::new(threads);
        // Pieces in block order, then id order: (block, range of its ids).
        let pieces_of = |ids: &[OnceLock<Result<Vec<SeriesRef>>>]| -> Vec<(usize, std::ops::Range<usize>)> {
            let mut pieces = Vec::new();
            for (b, ids) in ids.iter().enumerate() {
                let n = ids.get().and_then(|r| r.as_ref().ok()).map_or(0, Vec::len);
                pieces.extend((0..n).step_by(SELECT_PIECE_IDS).map(|at| (b, at..(at + SELECT_PIECE_IDS).min(n))));
            }
            pieces
        };
        let panicked = Mutex::new(None);
        let next_piece = AtomicUsize::new(0);
        let read: Mutex<Vec<(usize, Result<Vec<Series>>)>> = Mutex::new(Vec::new());
        let head = crate::workers::scope(|scope| -> Result<Vec<Series>> {
            for _ in 0..threads {
                scope.spawn(|| {
                    // Every thread reaches the barrier, even past a panic (raised again once
                    // the threads are done).
                    let finding = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| loop {
                        let b = next_block.fetch_add(1, Relaxed);
                        let Some(block) = blocks.get(b) else { break };
                        let found = self.select_block_ids(block, matchers).inspect_err(|e| block.mark_corrupt_if(e));
                        let _ = ids[b].set(found);
                    }));
                    if let Err(panic) = finding {
                        *panicked.lock().unwrap_or_else(|e| e.into_inner()) = Some(panic);
                    }
                    found_ids.wait();
                    // Every thread lists the same pieces from the same ids.
                    let pieces = pieces_of(&ids);
                    let series: usize = pieces.iter().map(|(_, range)| range.len()).sum();
                    let use_cache = self.series_cache && SeriesCache::global().admits(series);
                    let read_pieces = || {
                        let mut interner = ReadCache::default();
                        loop {
                            let p = next_piece.fetch_add(1, Relaxed);
                            let Some((b, range)) = pieces.get(p) else { break };
                            let (block, block_ids) = (&blocks[*b], ids[*b].get().and_then(|r| r.as_ref().ok()));
                            let piece = &block_ids.expect("pieces are of blocks whose ids were found")[range.clone()];
                            let r = self
                                .select_block_series(block, piece, &mut interner, &found[*b], use_cache)
                                .inspect_err(|e| block.mark_corrupt_if(e));
                            let failed = r.is_err();
                            read.lock().unwrap_or_else(|e| e.into_inner()).push((p, r));
                            if failed {
                                // The others stop before their next piece.
                                next_piece.store(usize::MAX / 2, Relaxed);
                                break;
                            }
                        }
                    };
                    if series >= BACKGROUND_SERIES && !crate::workers::in_background() {
                        // A heavy selection reads in the background (see `BACKGROUND_SERIES`),
                        // this thread waiting for its stand-in.
                        let _background = crate::workers::background(true);
                        crate::workers::scope(|scope| scope.spawn(read_pieces).join())
                            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                    } else {
                        read_pieces();
                    }
                });
            }
            self.select_head(matchers)
        })?;
        if let Some(panic) = panicked.into_inner().unwrap_or_else(|e| e.into_inner()) {
            std::panic::resume_unwind(panic);
        }
        let pieces = pieces_of(&ids);
        for found in ids {
            found.into_inner().expect("every block's ids were looked for")?;
        }
        let mut read = read.into_inner().unwrap_or_else(|e| e.into_inner());
        read.sort_unstable_by_key(|(p, _)| *p);
        let mut per_block: Vec<Vec<Series>> = (0..blocks.len()).map(|_| Vec::new()).collect();
        for (p, series) in read.into_iter() {
            per_block[pieces[p].0].extend(series?);
        }
        Ok((head, per_block))
    }

    fn select_head(&self, matchers: &[Matcher]) -> Result<Vec<Series>> {
        if !self.read_head {
            return Ok(Vec::new());
        }
        // A range the head's samples do not reach (a dashboard's older panels, a refresh of a
        // window kept in blocks) selects nothing there: no walk over the matching series, each
        // looked up and locked to find no chunk (a fifth of such a refresh's time).
        if !self.head.may_hold_samples_in(self.mint, self.maxt) {
            return Ok(Vec::new());
        }
        // Series found here may be removed by a truncation before their labels are resolved;
        // the gate keeps their symbols alive until then.
        let _gate = self.head.read_gate();
        self.check_interrupt(0)?;
        let refs = postings::expand(self.head.postings_for(matchers));
        let threads = crate::workers::threads_here(self.threads).min(refs.len() / HEAD_PARALLEL_SERIES_MIN).max(1);
        if threads == 1 {
            return self.select_head_refs(&refs);
        }
        // Contiguous parts on as many threads (copying chunks, resolving and sorting labels
        // is per-series work), merged by labels after.
        let _background = crate::workers::background(refs.len() >= BACKGROUND_SERIES);
        let parts = crate::workers::scope(|scope| -> Result<Vec<Vec<Series>>> {
            let workers: Vec<_> = refs
                .chunks(refs.len().div_ceil(threads))
                .map(|part| scope.spawn(move || self.select_head_refs(part)))
                .collect();
            workers.into_iter().map(|w| w.join().expect("a head reader panicked")).collect()
        })?;
        Ok(merge_sorted(parts))
    }

    /// The series of `refs` with chunks in range, sorted by labels.
    fn select_head_refs(&self, refs: &[SeriesRef]) -> Result<Vec<Series>> {
        // Each series' entry is a cache miss where it is first touched (its newest-sample
        // bound, then its lock): asked for this many series ahead, it is mostly there in time
        // (a one-step rate over 3,000 head series: 10% of it in `series_if` before).
        const PREFETCH_AHEAD: usize = 8;
        // The open chunks' copies go to buffers of ARENA_BLOCK bytes, each shared by the
        // chunks that point into it once it is full (the `Mapped` below are placeholders until
        // then). Blocks of a fixed size rather than one growing buffer: a selection of many
        // series would otherwise copy its buffer at each doubling and fault in fresh pages for
        // each copy, and the allocator keeps blocks of this size for the next selection. A
        // buffer is taken when a series may need one, so that a selection that copies nothing
        // (labels only, or only closed chunks in range after the first series) takes at most one.
        let mut arena = Vec::new();
        let placeholder = Arc::new(bytes::Bytes::new());
        let mut pending = Vec::new();
        let mut found: Vec<(SeriesRef, Vec<QueryChunk>)> = Vec::with_capacity(refs.len());
        // Each found series' labels, taken while its entry is at hand: the series itself is let
        // go at once (dropping a hundred thousand of them at the end, each a cache miss, was a
        // sixth of a selection's time).
        let mut ranked = RankedLabels::with_capacity(refs.len());
        // found[in_arena..] may point into `arena`.
        let mut in_arena = 0;
        let stones = self.head.tombstones_snapshot();
        for (i, &r) in refs.iter().enumerate() {
            self.check_interrupt(i)?;
            if let Some(&ahead) = refs.get(i + PREFETCH_AHEAD) {
                self.head.prefetch_series(ahead);
            }
            // Series that ended before the range (most of a churned selection's) are passed
            // over without their lock.
            let Some(s) = self.head.series_if(r, |s| s.may_hold_samples_since(self.mint)) else { continue };
            if self.labels_only {
                // Whether it has samples in range, without copying its open chunk.
                if s.lock().overlaps(self.mint, self.maxt) {
                    ranked.add(&s.labels);
                    found.push((s.series_ref, Vec::new()));
                    self.check_limit(found.len())?;
                }
                continue;
            }
            if arena.capacity() == 0 {
                arena.reserve_exact(ARENA_BLOCK);
            }
            let chunks = {
                let mut state = s.lock();
                // A deletion may cover the newest sample: then the chunks are read.
                let newest = self.newest_only
                    && !stones.as_ref().is_some_and(|st| st.contains_key(&r))
                    && state.newest_float_into(self.mint, self.maxt, &mut arena, |c| pending.push((c, 0)));
                if !newest {
                    // Asked first, through a shared borrow: a mutable one marks the state changed
                    // (`SeriesGuard`), which only a read that moves the cut should pay for.
                    if state.wants_cut(self.mint) {
                        state.move_cut(self.mint);
                    }
                    state
                        .each_chunk_into(self.mint, self.maxt, u64::MAX, &mut arena, |c, rank| pending.push((c, rank)));
                }
                drop(state);
                let mut chunks = Vec::with_capacity(pending.len());
                for (c, rank) in pending.drain(..) {
                    let (mint, maxt, data) = match c {
                        HeadChunk::Shared(c) => (c.mint, c.maxt, c.data),
                        HeadChunk::InArena { mint, maxt, bytes } => match u32::try_from(bytes.end) {
                            Ok(_) => {
                                let (start, len) = (bytes.start as u32, bytes.len() as u32);
                                (mint, maxt, HeadChunkBytes::Mapped { file: placeholder.clone(), start, len })
                            }
                            // Past what an offset holds (4 GiB of open chunks): a copy of its own.
                            Err(_) => {
                                let own = HeadChunkBytes::from(&arena[bytes.clone()]);
                                arena.truncate(bytes.start);
                                (mint, maxt, own)
                            }
                        },
                    };
                    chunks.push(QueryChunk { mint, maxt, data: ChunkData::Mem(data), rank: HEAD_RANK + rank });
                }
                // Late chunks come after the in-order ones; readers need time order.
                if !chunks.is_sorted_by_key(|c| c.mint) {
                    chunks.sort_by_key(|c| c.mint);
                }
                chunks
            };
            if !chunks.is_empty() {
                self.count_chunks(chunks.len())?;
                ranked.add(&s.labels);
                found.push((s.series_ref, chunks));
                self.check_limit(found.len())?;
            }
            if arena.capacity() - arena.len() < ARENA_BLOCK_SLACK {
                let full = std::mem::take(&mut arena);
                seal_arena(full, &placeholder, &mut found[in_arena..]);
                in_arena = found.len();
            }
        }
        seal_arena(arena, &placeholder, &mut found[in_arena..]);
        self.head.symbols.with(|get| ranked.rank(get));
        let mut slots: Vec<_> = found.into_iter().map(Some).collect();
        let order = ranked.order();
        let out = (0..order.len())
            .map(|k| {
                // Label order scatters the reads over `slots` and the runs (references follow
                // creation, scrape by scrape): each one asked for a few series ahead.
                if let Some(&ahead) = order.get(k + 2 * PREFETCH_AHEAD) {
                    ranked.prefetch_bounds(ahead);
                }
                if let Some(&ahead) = order.get(k + PREFETCH_AHEAD) {
                    crate::prefetch::prefetch_line(&slots[ahead as usize]);
                    ranked.prefetch_run(ahead);
                }
                let i = order[k];
                let (series_ref, chunks) = slots[i as usize].take().expect("each index once");
                let deleted = stones.as_ref().and_then(|t| t.get(&series_ref).cloned()).unwrap_or_default();
                Series { labels: ranked.labels(i), chunks, deleted, mint: self.mint, maxt: self.maxt }
            })
            .collect();
        Ok(out)
    }

    fn select_block(&self, block: &Block, matchers: &[Matcher], interner: &mut ReadCache) -> Result<Vec<Series>> {
        let ids = self.select_block_ids(block, matchers)?;
        let use_cache = self.series_cache && SeriesCache::global().admits(ids.len());
        self.select_block_series(block, &ids, interner, &AtomicUsize::new(0), use_cache)
    }

    /// The ids of a block's series that `matchers` select and whose time bounds reach the
    /// range. Series without a chunk in range (after churn, most of what matchers select in a
    /// long block) are so passed over without decoding their entries (the churn bench's
    /// matchers select 18,144 ids; 140 are returned).
    fn select_block_ids(&self, block: &Block, matchers: &[Matcher]) -> Result<Vec<SeriesRef>> {
        self.check_interrupt(0)?;
        block.select_ids_in(matchers, Some((self.mint, self.maxt)))
    }

    /// The series `ids` of a block (in order) that have a chunk in range, with those chunks;
    /// the few the time bounds let through without one are left out. `found` counts the
    /// block's series found so far, by every thread reading a piece of it: the series limit
    /// holds for the block's whole selection, as soon as it is passed. With `use_cache`,
    /// entries are looked up in and kept by the `SeriesCache` (for a selection it admits).
    fn select_block_series(
        &self,
        block: &Block,
        ids: &[SeriesRef],
        interner: &mut ReadCache,
        found: &AtomicUsize,
        use_cache: bool,
    ) -> Result<Vec<Series>> {
        let count_one = || self.check_limit(found.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1);
        let data = block.data()?;
        let stones = block.tombstones();
        let (cache, reader) = (SeriesCache::global(), data.index.opened_id());
        let in_range = |c: &&crate::block::ChunkMetaRef| c.maxt >= self.mint && c.mint <= self.maxt;
        let mut metas = Vec::new();
        let mut out = Vec::with_capacity(ids.len());
        for (i, &id) in ids.iter().enumerate() {
            self.check_interrupt(i)?;
            // The entry as a query read it before (`SeriesCache`), or read from the index (and
            // kept when its labels were read, that is when a chunk is in range).
            let entry = if use_cache { cache.get(reader, id) } else { None };
            let (labels, metas): (Labels, &[crate::block::ChunkMetaRef]) = match &entry {
                Some(entry) if entry.chunks.iter().any(|c| in_range(&c)) => (entry.labels.clone(), &entry.chunks),
                Some(_) => continue,
                None => {
                    let Some(labels) = data
                        .index
                        .series_in_range(id, self.mint, self.maxt, &mut metas, interner)
                        .map_err(|e| block.corrupt(e))?
                    else {
                        continue;
                    };
                    if use_cache {
                        let entry = CachedSeries { labels: labels.clone(), chunks: metas.as_slice().into() };
                        cache.insert_missed(reader, id, Arc::new(entry));
                    }
                    (labels, &metas)
                }
            };
            // Sized exactly: most series have one chunk in a block, and collecting from a
            // filter would allocate room for four.
            let count = metas.iter().filter(in_range).count();
            debug_assert!(count > 0, "series_in_range returns labels only with a chunk in range");
            let deleted = stones.get(&id.0).cloned().unwrap_or_default();
            if self.labels_only {
                out.push(Series { labels, chunks: Vec::new(), deleted, mint: self.mint, maxt: self.maxt });
                count_one()?;
                continue;
            }
            self.count_chunks(count)?;
            let mut chunks = Vec::with_capacity(count);
            let rank = block.meta().seq;
            chunks.extend(metas.iter().filter(in_range).map(|c| QueryChunk {
                mint: c.mint,
                maxt: c.maxt,
                data: ChunkData::Block { reader: data.chunks.clone(), chunk: c.chunk },
                rank,
            }));
            out.push(Series { labels, chunks, deleted, mint: self.mint, maxt: self.maxt });
            count_one()?;
        }
        Ok(out)
    }

    /// Label names of series matching `matchers` in range (all names if none), sorted.
    pub fn label_names(&self, matchers: &[Matcher]) -> Result<Vec<String>> {
        let mut names: BTreeSet<String> = self.head.label_names(matchers).into_iter().collect();
        self.strings_from_blocks(
            matchers,
            &mut names,
            |ix| ix.label_names(),
            |l, out| out.extend(l.iter().map(|x| x.name.to_string())),
        )?;
        Ok(names.into_iter().collect())
    }

    /// Values of label `name` among series matching `matchers` (all if none), sorted.
    pub fn label_values(&self, name: &str, matchers: &[Matcher]) -> Result<Vec<String>> {
        let mut values: BTreeSet<String> = self.head.label_values(name, matchers).into_iter().collect();
        self.strings_from_blocks(
            matchers,
            &mut values,
            |ix| ix.label_values(name),
            |l, out| out.extend(l.get(name).map(str::to_owned)),
        )?;
        Ok(values.into_iter().collect())
    }

    /// The metric names and dotted-path nodes (`index::name_dict`) `pattern` matches, in the head
    /// and the blocks in range, each with its flags (`LEAF`, `BRANCH`) merged over the sources,
    /// sorted by node. Each source's names dictionary is walked; a block written before it had one is
    /// scanned. More than `limit` nodes is `TooManySeries`; the interrupt is asked as nodes come.
    pub fn find_names(&self, pattern: &NamePattern, limit: usize) -> Result<NodeSet> {
        let (nodes, bytes) = pattern.found_last();
        // Sized as the pattern's last search found (bounded, the limit may be far larger).
        let out = NodeSet::with_capacity(nodes.min(limit).min(1 << 20), bytes.min(64 << 20));
        let mut found = FoundNames { out, limit };
        self.walk_names(pattern, |node, flags| found.add(node, flags))?;
        found.out.merge_repeats();
        if found.out.len() > limit {
            return Err(crate::Error::TooManySeries { limit });
        }
        pattern.record_found(found.out.len(), found.out.text_bytes());
        Ok(found.out)
    }

    /// `find_names` keeping only the first node (in node order) of each name, a node's last
    /// component: what graphite-web's `treejson` answers, one entry per name. Ten thousand
    /// hosts' `*.*.*.net.eth0.rx_bytes` are one entry, kept as they come instead of ten
    /// thousand nodes gathered, sorted and then collapsed. More than `limit` names is
    /// `TooManySeries`.
    pub fn find_first_of_each_name(&self, pattern: &NamePattern, limit: usize) -> Result<NodeSet> {
        let mut found = FirstOfEachName {
            out: NodeSet::default(),
            index: std::collections::HashMap::default(),
            last_name: Vec::new(),
            last_entry: None,
            limit,
        };
        self.walk_names(pattern, |node, flags| found.add(node, flags))?;
        // One entry per name, so no repeats: this sorts them by node.
        found.out.merge_repeats();
        Ok(found.out)
    }

    /// Calls `visit` for every node `pattern` matches in the head and in each block in range
    /// (a node held by several is visited once in each), asking the interrupt as nodes come;
    /// stops at the first error, `visit`'s or the interrupt's, and returns it.
    fn walk_names(&self, pattern: &NamePattern, mut visit: impl FnMut(&[u8], u8) -> Result<()>) -> Result<()> {
        let mut seen = 0;
        let error = std::cell::RefCell::new(None);
        let mut visit = |node: &[u8], flags| {
            seen += 1;
            match self.check_interrupt(seen).and_then(|()| visit(node, flags)) {
                Ok(()) => true,
                Err(e) => {
                    *error.borrow_mut() = Some(e);
                    false
                }
            }
        };
        if !self.head.search_names(pattern, &mut visit) {
            scan_names(&self.head.label_values(METRIC_NAME, &[]), pattern, &mut visit);
        }
        for b in self.blocks() {
            if error.borrow().is_some() {
                break;
            }
            let data = b.data().inspect_err(|e| b.mark_corrupt_if(e))?;
            match &data.names {
                Some(dict) => dict.search(pattern, &mut visit),
                None => scan_names(&data.index.label_values(METRIC_NAME), pattern, &mut visit),
            }
        }
        error.into_inner().map_or(Ok(()), Err)
    }

    /// Adds to `out`, for every block in range, what `from_index` reads off the block's index
    /// (no matchers: no series is read) or what `from_series` takes from each matching series.
    fn strings_from_blocks(
        &self,
        matchers: &[Matcher],
        out: &mut BTreeSet<String>,
        from_index: impl Fn(&crate::block::IndexFile) -> Vec<String>,
        from_series: impl Fn(&Labels, &mut BTreeSet<String>),
    ) -> Result<()> {
        let mut interner = ReadCache::default();
        for b in self.blocks() {
            if matchers.is_empty() {
                let data = b.data().inspect_err(|e| b.mark_corrupt_if(e))?;
                out.extend(from_index(&data.index));
            } else {
                for s in self.select_block(&b, matchers, &mut interner).inspect_err(|e| b.mark_corrupt_if(e))? {
                    from_series(&s.labels, out);
                }
            }
        }
        Ok(())
    }
}

/// Nodes found by `find_names` so far (unsorted, possibly repeated).
struct FoundNames {
    out: NodeSet,
    limit: usize,
}

impl FoundNames {
    /// Takes one node; `TooManySeries` past the limit.
    fn add(&mut self, node: &[u8], flags: u8) -> Result<()> {
        // A node can come from the head's dictionary and its delta, and from every block:
        // repeats are merged when the set reaches twice the limit, and at the end.
        if self.out.len() >= self.limit.saturating_mul(2) {
            self.out.merge_repeats();
            if self.out.len() >= self.limit {
                return Err(crate::Error::TooManySeries { limit: self.limit });
            }
        }
        self.out.push(node, flags);
        Ok(())
    }
}

/// Nodes found by `find_first_of_each_name` so far: the first (least) node of each name met,
/// with the flags of its repeats merged.
struct FirstOfEachName {
    out: NodeSet,
    /// A name's entry in `out`.
    index: std::collections::HashMap<Vec<u8>, usize, foldhash::fast::RandomState>,
    /// The name met last and its entry (if it had one).
    last_name: Vec<u8>,
    last_entry: Option<usize>,
    limit: usize,
}

impl FirstOfEachName {
    /// Takes one node; `TooManySeries` past the limit of names.
    fn add(&mut self, node: &[u8], flags: u8) -> Result<()> {
        let name = node.iter().rposition(|&b| b == b'.').map_or(node, |dot| &node[dot + 1..]);
        // A walk meets a name's nodes in runs (a reversed walk all of them in one): the name
        // before is checked before hashing.
        let entry = if self.last_entry.is_some() && self.last_name == name {
            self.last_entry
        } else {
            let entry = self.index.get(name).copied();
            self.last_name.clear();
            self.last_name.extend_from_slice(name);
            self.last_entry = entry;
            entry
        };
        match entry {
            Some(i) => match node.cmp(self.out.node(i)) {
                Ordering::Less => self.out.replace(i, node, flags),
                Ordering::Equal => self.out.add_flags(i, flags),
                Ordering::Greater => {}
            },
            None => {
                if self.out.len() >= self.limit {
                    return Err(crate::Error::TooManySeries { limit: self.limit });
                }
                self.index.insert(name.to_vec(), self.out.len());
                self.last_entry = Some(self.out.len());
                self.out.push(node, flags);
            }
        }
        Ok(())
    }
}

/// `find_names` over a plain list of names: every node of every name, tested.
fn scan_names<S: AsRef<str>>(names: &[S], pattern: &NamePattern, mut visit: impl FnMut(&[u8], u8) -> bool) {
    for name in names {
        let mut go_on = true;
        for_each_node(name.as_ref().as_bytes(), |node, flags| {
            if go_on && pattern.is_match(node) {
                go_on = visit(node, flags);
            }
        });
        if !go_on {
            return;
        }
    }
}

/// Merges the selections of several sources (the head, then blocks in time order), each in
/// strictly increasing label order, into one in label order. The copies of a series found in
/// several sources become one series: the first source's labels, every copy's chunks in time
/// order, allocated once at their full size. Merging costs a few comparisons per series, where
/// sorting the concatenation cost a few dozen.
fn merge_sorted(sources: Vec<Vec<Series>>) -> Vec<Series> {
    let mut sources: Vec<std::vec::IntoIter<Series>> =
        sources.into_iter().filter(|s| !s.is_empty()).map(Vec::into_iter).collect();
    if sources.len() <= 1 {
        return sources.pop().map(Iterator::collect).unwrap_or_default();
    }
    // At most every series once: sized for that, so that a large selection's merge (the
    // head's pieces, read on several threads) is not copied at each doubling into fresh pages.
    let mut merged = Vec::with_capacity(sources.iter().map(ExactSizeIterator::len).sum());
    // Sources whose next series has the smallest labels, in source order.
    let mut smallest: Vec<usize> = Vec::with_capacity(sources.len());
    loop {
        smallest.clear();
        for (i, it) in sources.iter().enumerate() {
            let Some(labels) = next_labels(it) else { continue };
            match smallest.first().and_then(|&m| next_labels(&sources[m])).map(|min| labels.cmp(min)) {
                None | Some(Ordering::Less) => {
                    smallest.clear();
                    smallest.push(i);
                }
                Some(Ordering::Equal) => smallest.push(i),
                Some(Ordering::Greater) => {}
            }
        }
        let Some((&first, copies)) = smallest.split_first() else { break };
        let mut series = take_next(&mut sources[first]);
        if !copies.is_empty() {
            let count =
                series.chunks.len() + copies.iter().map(|&i| sources[i].as_slice()[0].chunks.len()).sum::<usize>();
            let mut chunks = Vec::with_capacity(count);
            chunks.append(&mut series.chunks);
            for &i in copies {
                let copy = take_next(&mut sources[i]);
                chunks.extend(copy.chunks);
                series.deleted.extend(copy.deleted);
            }
            if !chunks.is_sorted_by_key(|c| c.mint) {
                chunks.sort_by_key(|c| c.mint);
            }
            series.chunks = chunks;
        }
        merged.push(series);
    }
    merged
}

fn next_labels(source: &std::vec::IntoIter<Series>) -> Option<&Labels> {
    source.as_slice().first().map(|s| &s.labels)
}

/// The next series of a source, checking (in debug builds) that the source is in label order.
fn take_next(source: &mut std::vec::IntoIter<Series>) -> Series {
    let s = source.next().expect("a source with a next series");
    debug_assert!(
        source.as_slice().first().is_none_or(|next| s.labels < next.labels),
        "a source's series are not in strictly increasing label order: {} then {}",
        s.labels,
        source.as_slice()[0].labels
    );
    s
}

#[cfg(test)]
mod tests;
