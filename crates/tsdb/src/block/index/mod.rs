//! A block's `index` file: the symbol table, one entry per series (labels as symbol ids and
//! chunk metas), sorted postings lists and a table locating them, then a table of contents.
//! Every section carries a CRC32C. Byte layout: `docs/format/block.md`.
//!
//! Series are written in label order and numbered from 0 in that order (versions 3 and 4; earlier
//! versions number them by their entry's offset), so ids ascend in label order too: postings
//! lists are sorted by construction, and merging blocks or answering a query in label order
//! needs no sort.

mod frames;
mod symbols;
mod table;

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use strata_model::{Label, Labels, SeriesRef};

use super::checksum_ok;
use super::chunks::{ChunkRef, Group};
use crate::encoding::{gcd, put_uvarint, put_varint, Decoder};
use crate::error::{io_err, Error, Result};
use crate::index::postings::Postings;
use crate::vfs::{AppendWriter, Vfs};
use frames::PageBytes;

/// "STIX": Strata index.
pub const MAGIC: u32 = 0x5354_4958;
/// Version written: front-coded symbols, series numbered from 0 and stored in pages of
/// `SERIES_PAGE` with one checksum per page, a label pair held by one series pointing at it from
/// the postings table without a list (version 3); series entries' label ids relative to their
/// page's first entry and chunk times in the page's time unit, the next path of a name as a
/// one-byte postings table row, and a front-coded symbol's two lengths in a byte (version 4);
/// every series' time bounds at the page table's end, so a query skips the series that have no
/// chunk in its range without decoding their entries (version 5); those bounds left out of a
/// block where they would pass over next to nothing (`BOUNDS_PARTIAL_SHARE_MIN`): series that
/// all span the block, as a Graphite server's or a steady scrape's do (version 6); the series
/// pages and the symbol table's groups zstd-compressed in frames of about
/// `frames::FRAME_RAW_BYTES` (version 7). Versions 1 to 6 are still read.
pub const VERSION: u8 = 7;
pub const HEADER_BYTES: usize = 8;
/// Version 2's series entries start at multiples of this; an id is the offset divided by it.
pub const SERIES_ALIGN: u64 = 8;
/// Version 1's series alignment.
pub const SERIES_ALIGN_V1: u64 = 16;
/// Series per page (versions 3 and 4): a page is checked once, when first read, and a series is found
/// by skipping the entries before it in its page.
pub const SERIES_PAGE: usize = 32;
/// Table of contents: five u64 (the offsets of symbols, series, all postings (versions 3 and 4: the
/// series page table) and the postings table, then the base time) and a CRC32C.
pub const TOC_BYTES: usize = 5 * 8 + 4;
/// Version 1's table of contents: the four offsets and a CRC32C.
pub const TOC_BYTES_V1: usize = 4 * 8 + 4;
/// Series ids per block of a packed postings list.
pub const POSTINGS_BLOCK: usize = 128;
/// `postings_of_values` walks the rows between the first and the last value asked for when
/// there are at most this many per value: a row decoded in order costs a few tens of ns, a
/// value looked up alone three searches of cache-missing probes (about a microsecond).
const VALUE_WALK_ROWS_PER_VALUE_MAX: usize = 16;
/// Version 5's series time bounds count time in units of the block's span divided into this
/// many steps, so that one series' bounds take two u16.
pub const BOUNDS_STEPS: u64 = 1 << 16;
/// The time bounds are written (version 6) when at least one series in this many spans less
/// than half of the block: a query over part of the block can then pass over a share of the
/// series worth four bytes each. Otherwise (every series spans most of the block: no churn)
/// they would pass over next to nothing, and are left out.
pub const BOUNDS_PARTIAL_SHARE_MIN: usize = 16;
/// Series an `OverlapPostings` scan passes over before it yields one anyway.
pub const OVERLAP_SCAN_MAX: u64 = 256;
pub const INDEX_FILE: &str = "index";

pub use symbols::SYMBOL_GROUP;
use symbols::{EntryFormat, SymbolTable};
pub use table::TABLE_RESTART;
use table::{PostingsTable, RowFormat, TableEntry};

/// A chunk as the index describes it: its time range (inclusive) and where it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkMetaRef {
    pub mint: i64,
    pub maxt: i64,
    pub chunk: ChunkRef,
}

/// What a reader keeps between the series it reads from indexes: one `Arc<str>` per distinct
/// label string, and where the last series read from a version-3 or 4 index ended.
///
/// A query reads the same series from every block it overlaps; without sharing, each copy
/// costs two allocations per label, and putting the copies in label order compares their
/// bytes. With it, a label string is allocated once per reader, and equal labels are the same
/// pointer, which `Labels`' comparison checks first. Readers take series in id order, so the
/// next one is often in the same page as the last: it is found from there, not from the
/// page's start.
#[derive(Debug, Default, Clone)]
pub struct ReadCache {
    strings: HashSet<Arc<str>, foldhash::fast::RandomState>,
    position: Option<PagePosition>,
    /// Symbol cursors (versions 3 and 4) by label position: a name's and a value's for each.
    symbols: Vec<symbols::SymbolCursor>,
    /// Version 4: the label ids of a page's first entry, which the page's other entries are
    /// written relative to, and which page (of which opened file) they are of.
    first_labels: Vec<(u32, u32)>,
    first_of: Option<(u64, usize)>,
    /// The series being decoded's label ids.
    ids: Vec<(u32, u32)>,
    /// Version 7: the frame of series pages read last, and which frame (of which opened file).
    frame: Option<(u64, usize, Arc<Group>)>,
}

/// The entry after the last series read: in page `page` of the index opened as `file`, entry
/// `index` of the page, at byte `offset` of the file (version 7: of its frames' raw bytes).
#[derive(Debug, Clone, Copy)]
struct PagePosition {
    file: u64,
    page: usize,
    index: usize,
    offset: u64,
}

/// Numbers opened indexes, so a `ReadCache` position is never taken for another file's.
static INDEX_FILES_OPENED: AtomicU64 = AtomicU64::new(0);

/// The shared string for `s` in `strings`, added if new.
fn intern(strings: &mut HashSet<Arc<str>, foldhash::fast::RandomState>, s: &str) -> Arc<str> {
    if let Some(a) = strings.get(s) {
        return a.clone();
    }
    let a: Arc<str> = Arc::from(s);
    strings.insert(a.clone());
    a
}

impl ReadCache {
    pub fn intern(&mut self, s: &str) -> Arc<str> {
        intern(&mut self.strings, s)
    }

    /// Makes `a` the shared string for its text, unless one is shared already (so label sets
    /// decoded later reuse strings the caller holds, e.g. the head's).
    pub fn adopt(&mut self, a: &Arc<str>) {
        if !self.strings.contains(&**a) {
            self.strings.insert(a.clone());
        }
    }
}

fn header(version: u8) -> [u8; HEADER_BYTES] {
    super::file_header(MAGIC, version)
}

/// A series of the open page, as the writer holds it until the page is full: label ids (name,
/// value) and chunks.
type PendingSeries = (Vec<(u32, u32)>, Vec<ChunkMetaRef>);

/// Writes an index in one pass: symbols first (the caller knows them all up front), then series
/// in label order a page at a time, then the page table, then postings accumulated meanwhile.
#[derive(Debug)]
pub struct IndexWriter {
    path: PathBuf,
    file: BufWriter<AppendWriter>,
    pos: u64,
    symbols: HashMap<Arc<str>, u32>,
    series_start: u64,
    /// Series added so far: the next one's id.
    series: u32,
    /// The open page's series (label ids and chunks), written when it is full: its time unit and
    /// earliest chunk are known only then.
    page: Vec<PendingSeries>,
    /// The page table's rows for the pages written so far.
    pages: Vec<u8>,
    postings: HashMap<(u32, u32), Vec<u32>>,
    last: Option<Labels>,
    buf: Vec<u8>,
    /// Chunk times of series entries are written relative to this: the first chunk's mint.
    base_time: Option<i64>,
    /// Each series' first chunk's mint and last chunk's maxt (`(i64::MAX, i64::MIN)`: no
    /// chunks), in id order, for the page table's time bounds.
    bounds: Vec<(i64, i64)>,
    /// The pages' bytes go through it into compressed frames.
    frames: frames::FrameWriter,
}

impl IndexWriter {
    /// Creates the file and writes the symbol table. `symbols` must be sorted and unique, and
    /// hold every label name and value of the series to come.
    pub fn create(fs: &dyn Vfs, path: &Path, symbols: &[Arc<str>]) -> Result<Self> {
        assert!(symbols.windows(2).all(|w| w[0] < w[1]), "index symbols must be sorted and unique");
        let f = fs.create(path).map_err(io_err("create", path))?;
        let mut w = IndexWriter {
            path: path.to_owned(),
            file: BufWriter::with_capacity(1 << 20, AppendWriter(f)),
            pos: 0,
            symbols: symbols.iter().enumerate().map(|(i, s)| (s.clone(), i as u32)).collect(),
            series_start: 0,
            series: 0,
            page: Vec::with_capacity(SERIES_PAGE),
            pages: Vec::new(),
            postings: HashMap::new(),
            last: None,
            buf: Vec::new(),
            base_time: None,
            bounds: Vec::new(),
            frames: frames::FrameWriter::new().map_err(io_err("start zstd for", path))?,
        };
        w.write(&header(VERSION))?;
        let mut body = Vec::new();
        symbols::encode_framed(symbols, &mut body).map_err(io_err("compress symbols of", path))?;
        w.section(&body)?;
        w.series_start = w.pos;
        Ok(w)
    }

    fn write(&mut self, b: &[u8]) -> Result<()> {
        self.file.write_all(b).map_err(io_err("write", &self.path))?;
        self.pos += b.len() as u64;
        Ok(())
    }

    /// `len u32 BE | body | crc32c(body) u32 BE`.
    fn section(&mut self, body: &[u8]) -> Result<()> {
        let len = u32::try_from(body.len()).expect("index section over 4 GiB");
        self.write(&len.to_be_bytes())?;
        self.write(body)?;
        self.write(&crc32c::crc32c(body).to_be_bytes())
    }

    fn symbol(&self, s: &str) -> u32 {
        *self.symbols.get(s).unwrap_or_else(|| panic!("label string {s:?} missing from the index symbols"))
    }

    /// Adds a series; calls must come in strictly increasing label order, and `chunks` in time
    /// order.
    pub fn add_series(&mut self, labels: &Labels, chunks: &[ChunkMetaRef]) -> Result<()> {
        if let Some(last) = &self.last {
            assert!(last < labels, "series must be added in label order: {last} then {labels}");
        }
        let id = self.series;
        self.series = id.checked_add(1).expect("over 4 billion series in one block");
        let mut ids = Vec::with_capacity(labels.len());
        for l in labels {
            let (n, v) = (self.symbol(&l.name), self.symbol(&l.value));
            ids.push((n, v));
            self.postings.entry((n, v)).or_default().push(id);
        }
        for w in chunks.windows(2) {
            // A series' chunks neither overlap nor go back in the file: the deltas between them
            // are positive, so they take unsigned varints (a byte less than zigzag, often).
            assert!(w[1].mint > w[0].maxt && w[1].chunk > w[0].chunk, "chunks of {labels} overlap or go backwards");
        }
        debug_assert!(chunks.iter().all(|c| c.mint <= c.maxt));
        self.bounds.push(match (chunks.first(), chunks.last()) {
            (Some(first), Some(last)) => (first.mint, last.maxt),
            _ => (i64::MAX, i64::MIN),
        });
        self.page.push((ids, chunks.to_vec()));
        self.last = Some(labels.clone());
        if self.page.len() == SERIES_PAGE {
            self.write_page()?;
        }
        Ok(())
    }

    /// Writes the open page's entries and its row of the page table.
    fn write_page(&mut self) -> Result<()> {
        let page = std::mem::take(&mut self.page);
        let Some((_, first_chunks)) = page.first() else { return Ok(()) };
        // Relative to the page's first series: neighbouring series are scraped alike (their
        // chunks span about as long) and their chunks follow one another in the files, so a
        // byte or two where the span takes three and the ref five.
        let base = first_chunks.first().map_or(PageBase::default(), |c| PageBase {
            chunk: c.chunk.0,
            span: c.maxt.wrapping_sub(c.mint),
            ..PageBase::default()
        });
        let mint = page.iter().filter_map(|(_, c)| c.first()).map(|c| c.mint).min().unwrap_or(0);
        let base_time = *self.base_time.get_or_insert(mint);
        let unit = page_unit(&page, mint, base.span);
        let base = PageBase { mint, unit, ..base };
        let start = self.frames.raw().len();
        let mut crc = 0;
        let mut body = std::mem::take(&mut self.buf);
        let mut head = Vec::with_capacity(10);
        for (i, (ids, chunks)) in page.iter().enumerate() {
            body.clear();
            put_uvarint(&mut body, ids.len() as u64);
            for (k, &(n, v)) in ids.iter().enumerate() {
                if i == 0 {
                    put_uvarint(&mut body, n as u64);
                    put_uvarint(&mut body, v as u64);
                } else {
                    // The first entry's strings at this position, or others close by in order.
                    let (fn_, fv) = page[0].0.get(k).copied().unwrap_or((0, 0));
                    put_varint(&mut body, n as i64 - fn_ as i64);
                    put_varint(&mut body, v as i64 - fv as i64);
                }
            }
            put_uvarint(&mut body, chunks.len() as u64);
            let mut prev: Option<&ChunkMetaRef> = None;
            for c in chunks {
                let span = c.maxt.wrapping_sub(c.mint);
                match prev {
                    None => {
                        put_uvarint(&mut body, c.mint.wrapping_sub(mint) as u64 / unit);
                        put_varint(&mut body, span.wrapping_sub(base.span) / unit as i64);
                        put_varint(&mut body, c.chunk.0.wrapping_sub(base.chunk) as i64);
                    }
                    Some(p) => {
                        put_uvarint(&mut body, c.mint.wrapping_sub(p.maxt) as u64 / unit);
                        put_uvarint(&mut body, span as u64 / unit);
                        put_uvarint(&mut body, c.chunk.0 - p.chunk.0);
                    }
                }
                prev = Some(c);
            }
            head.clear();
            put_uvarint(&mut head, body.len() as u64);
            crc = crc32c::crc32c_append(crc32c::crc32c_append(crc, &head), &body);
            let raw = self.frames.raw();
            raw.extend_from_slice(&head);
            raw.extend_from_slice(&body);
        }
        self.buf = body;
        put_uvarint(&mut self.pages, (self.frames.raw().len() - start) as u64);
        put_uvarint(&mut self.pages, base.chunk);
        put_varint(&mut self.pages, base.span);
        put_varint(&mut self.pages, mint.wrapping_sub(base_time));
        put_uvarint(&mut self.pages, unit);
        self.pages.extend_from_slice(&crc.to_be_bytes());
        self.page = page;
        self.page.clear();
        if let Some(frame) = self.frames.unit_done().map_err(io_err("compress series of", &self.path))? {
            self.write(&frame)?;
        }
        Ok(())
    }

    fn postings_list(&mut self, ids: &[u32]) -> Result<u64> {
        let at = self.pos;
        let mut body = Vec::with_capacity(ids.len() * 2 + 16);
        encode_postings(ids, &mut body);
        self.section(&body)?;
        Ok(at)
    }

    /// Writes the page table, postings, their table and the TOC, then fsyncs. Returns the
    /// file's size.
    pub fn finish(mut self) -> Result<u64> {
        self.write_page()?;
        if let Some(frame) = self.frames.finish().map_err(io_err("compress series of", &self.path))? {
            self.write(&frame)?;
        }
        let pages_at = self.pos;
        let mut table_body = Vec::with_capacity(self.pages.len() + 10);
        put_uvarint(&mut table_body, self.series as u64);
        table_body.extend_from_slice(&self.pages);
        self.frames.rows(false, &mut table_body);
        let base_time = self.base_time.unwrap_or(0);
        encode_bounds(&self.bounds, base_time, &mut table_body);
        self.section(&table_body)?;

        let mut keys: Vec<(u32, u32)> = self.postings.keys().copied().collect();
        keys.sort_unstable();
        let mut rows = Vec::with_capacity(keys.len());
        for k in keys {
            let ids = self.postings.remove(&k).expect("key from the map");
            // A pair held by one series (a Graphite path, a pod's name) points at it directly.
            let target = if let [id] = ids[..] { (id as u64) << 1 | 1 } else { self.postings_list(&ids)? << 1 };
            rows.push(TableEntry { name: k.0, value: k.1, target });
        }
        let mut table = Vec::new();
        table::encode(&rows, RowFormat::NextRows, &mut table);
        let table_at = self.pos;
        self.section(&table)?;
        let mut toc = Vec::with_capacity(TOC_BYTES);
        for v in [HEADER_BYTES as u64, self.series_start, pages_at, table_at, base_time as u64] {
            toc.extend_from_slice(&v.to_be_bytes());
        }
        let crc = crc32c::crc32c(&toc);
        toc.extend_from_slice(&crc.to_be_bytes());
        self.write(&toc)?;
        let f = self.file.into_inner().map_err(|e| io_err("flush", &self.path)(e.into_error()))?;
        f.0.sync_data().map_err(io_err("fsync", &self.path))?;
        Ok(self.pos)
    }
}

/// Appends version 5's series time bounds to the page table's body: `base` (varint, minus
/// `base_time`), `unit` (uvarint), then per series its first mint and last maxt as steps of
/// `unit` from `base` (u16 each, big-endian; rounded down, so a series' samples lie within
/// `[base + first × unit, base + (last + 1) × unit)`; a series without chunks is `ffff 0000`).
/// The unit is the smallest that puts the block's whole span in `BOUNDS_STEPS` steps.
///
/// Left out (version 6) when fewer than one series in `BOUNDS_PARTIAL_SHARE_MIN` spans less
/// than half of the block (a series without chunks counts as partial): then `base` and `unit`
/// are both written 0 and no series follows.
fn encode_bounds(bounds: &[(i64, i64)], base_time: i64, out: &mut Vec<u8>) {
    let with_chunks = || bounds.iter().filter(|(mint, maxt)| mint <= maxt);
    let base = with_chunks().map(|b| b.0).min().unwrap_or(base_time);
    let top = with_chunks().map(|b| b.1).max().unwrap_or(base_time);
    let half = (top as i128 - base as i128) / 2;
    let partial = bounds.iter().filter(|(mint, maxt)| (*maxt as i128 - *mint as i128) < half).count();
    if partial * BOUNDS_PARTIAL_SHARE_MIN < bounds.len() {
        put_varint(out, 0);
        put_uvarint(out, 0);
        return;
    }
    let unit = bounds_unit(base, top);
    put_varint(out, base.wrapping_sub(base_time));
    put_uvarint(out, unit);
    out.reserve(bounds.len() * 4);
    let step = |t: i64| -> u16 {
        let s = (t as i128 - base as i128) / unit as i128;
        u16::try_from(s).expect("the unit puts every time of the block in a u16 step")
    };
    for &(mint, maxt) in bounds {
        let (first, last) = if mint <= maxt { (step(mint), step(maxt)) } else { (u16::MAX, 0) };
        out.extend_from_slice(&first.to_be_bytes());
        out.extend_from_slice(&last.to_be_bytes());
    }
}

/// The smallest unit that counts `[base, top]` in `BOUNDS_STEPS` steps.
fn bounds_unit(base: i64, top: i64) -> u64 {
    let span = (top as i128 - base as i128).max(0) as u128;
    u64::try_from(span / BOUNDS_STEPS as u128 + 1).expect("an i64 span over 2^16 steps fits a u64")
}

/// Which series of a version-5 index may have chunks in a time range (`IndexFile::time_filter`):
/// the range in the bounds' steps, and the bounds.
#[derive(Clone, Copy, Debug)]
pub struct TimeFilter<'a> {
    bounds: &'a [u8],
    first: i64,
    last: i64,
}

impl TimeFilter<'_> {
    /// False when series `id` surely has no chunk in the range (true for an id past the block's
    /// series: reading it reports the error).
    #[inline]
    pub fn may_overlap(&self, id: SeriesRef) -> bool {
        let Some(b) = usize::try_from(id.0).ok().and_then(|i| self.bounds.get(i * 4..i * 4 + 4)) else { return true };
        bounds_overlap(b, self.first, self.last)
    }
}

/// Whether one series' bounds (`first u16 | last u16`, steps) may overlap the steps
/// `[first, last]`; a series without chunks (`ffff 0000`) never does.
#[inline]
fn bounds_overlap(b: &[u8], first: i64, last: i64) -> bool {
    let from = u16::from_be_bytes([b[0], b[1]]) as i64;
    let to = u16::from_be_bytes([b[2], b[3]]) as i64;
    from <= to && to >= first && from <= last
}

/// The series a `TimeFilter` lets through, as a postings cursor over the bounds (ids in order).
/// Intersected with the matchers' postings, it makes the intersection jump past runs of series
/// with no chunk in the range (after churn, most of what the matchers select in a long block)
/// instead of stepping through their postings one by one. Ids past the block's series are let
/// through, as `TimeFilter::may_overlap` does (reading them reports the damage).
///
/// A superset: a scan that meets `OVERLAP_SCAN_MAX` passed-over series in a row stops at the
/// last one and yields it, so that an intersection never scans far past where the matchers'
/// postings end (a selective matcher's one series, then a million dead ones). Whoever reads
/// the ids it yields checks each series' chunks against the range anyway.
#[derive(Debug)]
pub struct OverlapPostings {
    map: Bytes,
    /// The bounds' bytes in `map`, 4 per series.
    at: usize,
    series: u64,
    first: i64,
    last: i64,
    /// The current id (`None` before the start or past the end).
    cur: Option<u64>,
    done: bool,
}

impl OverlapPostings {
    /// The first id at or after `from` that may overlap, or the last of `OVERLAP_SCAN_MAX`
    /// that do not, made current.
    fn scan_from(&mut self, from: u64) -> Option<SeriesRef> {
        let mut id = from;
        let scan_end = from.saturating_add(OVERLAP_SCAN_MAX - 1).min(self.series);
        while id < scan_end {
            let i = self.at + id as usize * 4;
            if bounds_overlap(&self.map[i..i + 4], self.first, self.last) {
                break;
            }
            id += 1;
        }
        // Ids are u32 in postings: none lies past that.
        if id > u32::MAX as u64 {
            self.done = true;
            self.cur = None;
            return None;
        }
        self.cur = Some(id);
        self.cur.map(SeriesRef)
    }
}

impl Postings for OverlapPostings {
    fn next(&mut self) -> Option<SeriesRef> {
        if self.done {
            return None;
        }
        let from = self.cur.map_or(0, |c| c + 1);
        self.scan_from(from)
    }

    fn seek(&mut self, target: SeriesRef) -> Option<SeriesRef> {
        if self.done {
            return None;
        }
        match self.cur {
            Some(c) if c >= target.0 => Some(SeriesRef(c)),
            _ => self.scan_from(target.0),
        }
    }

    fn at(&self) -> Option<SeriesRef> {
        self.cur.map(SeriesRef)
    }
}

/// Where a version-3 or 4 series entry is: what its page's entries are relative to, the page,
/// and the entry's place in it.
#[derive(Clone, Copy, Debug)]
struct EntryPlace {
    base: PageBase,
    page: usize,
    index: usize,
}

/// A page of series entries (versions 3 and 4): its bytes in the file, the chunk ref its entries' first
/// refs are relative to, and its CRC32C.
#[derive(Clone, Copy, Debug)]
struct SeriesPage {
    start: u64,
    end: u64,
    base: PageBase,
    crc: u32,
    /// Version 7: the frame that holds it (`start` and `end` then count raw bytes of frames).
    frame: u32,
}

/// What a page's series entries write their first chunk relative to: the first chunk of the
/// page's first series (its ref and its span, `maxt − mint`); version 4: the page's earliest
/// first-chunk mint and the unit its entries' times are counted in.
#[derive(Clone, Copy, Debug)]
struct PageBase {
    chunk: u64,
    span: i64,
    mint: i64,
    unit: u64,
}

impl Default for PageBase {
    fn default() -> Self {
        PageBase { chunk: 0, span: 0, mint: 0, unit: 1 }
    }
}

/// The largest unit every time a page's entries write divides: 1000 for carbon's whole seconds,
/// so a second of jitter is a byte, not two. 1 when nothing divides or a difference overflows.
fn page_unit(page: &[PendingSeries], mint: i64, base_span: i64) -> u64 {
    let mut g = 0u64;
    for (_, chunks) in page {
        let mut prev: Option<&ChunkMetaRef> = None;
        for c in chunks {
            let diffs = match prev {
                None => [c.mint.checked_sub(mint), (c.maxt.checked_sub(c.mint)).and_then(|s| s.checked_sub(base_span))],
                Some(p) => [c.mint.checked_sub(p.maxt), c.maxt.checked_sub(c.mint)],
            };
            for d in diffs {
                let Some(d) = d else { return 1 };
                g = gcd(g, d.unsigned_abs());
            }
            prev = Some(c);
        }
    }
    // A unit over i64::MAX (the distance from i64::MIN) would not divide as a signed number.
    if g > i64::MAX as u64 {
        return 1;
    }
    g.max(1)
}

/// The bytes of each part of a version-3 to 5 index file (`IndexFile::section_sizes`), each with its
/// section framing (length and CRC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexSections {
    pub symbols: u64,
    pub series: u64,
    /// The page table, with version 5's series time bounds at its end.
    pub page_table: u64,
    pub postings: u64,
    pub postings_table: u64,
}

/// A memory-mapped index. Opening reads the TOC, the symbol table, the series page table and the
/// postings table (checking their CRCs); series entries (versions 3 and 4: their pages, once each) and
/// postings lists are checked when read.
#[derive(Debug)]
pub struct IndexFile {
    path: PathBuf,
    map: Bytes,
    symbols: SymbolTable,
    table: PostingsTable,
    /// Version 1 and 2: the offset of the list of all series.
    all_postings: u64,
    /// Versions 3 and 4: the series pages, and one bit per page set once its CRC has been checked.
    pages: Vec<SeriesPage>,
    checked: Vec<AtomicU64>,
    num_series: u64,
    /// This opening's number (`INDEX_FILES_OPENED`).
    opened: u64,
    version: u8,
    /// Chunk times of series entries are relative to it (version 2; 0 in version 1).
    base_time: i64,
    /// Version 5: where the series' time bounds are in the file, and their base and unit.
    bounds: Option<TimeBounds>,
    /// Version 7: the frames that hold the series pages, and this reader's key space in the
    /// group cache that keeps them decompressed.
    frames: Vec<frames::FrameRow>,
    cache_id: u64,
}

#[derive(Debug, Clone, Copy)]
struct TimeBounds {
    at: usize,
    len: usize,
    base: i64,
    unit: u64,
}

impl IndexFile {
    /// Maps and checks the index at `path` (in a block directory). A failing disk is an
    /// `Error::Io` (it may read fine later); bytes that fail their checks are
    /// `Error::BlockCorrupt`.
    pub fn open(fs: &dyn Vfs, path: &Path) -> Result<Self> {
        let map = fs.map(path).map_err(io_err("map", path))?;
        IndexFile::from_bytes(path, map)
            .map_err(|reason| Error::BlockCorrupt { block: path.parent().unwrap_or(Path::new(".")).to_owned(), reason })
    }

    /// Reads the index in `map` (the bytes of the file at `path`, named in errors).
    pub fn from_bytes(path: &Path, map: Bytes) -> Result<Self, String> {
        let fail = |what: &str| format!("{}: {what}", path.display());
        let version = match map.get(..HEADER_BYTES) {
            Some(h) if h[..4] == MAGIC.to_be_bytes() && h[5..] == [0, 0, 0] && (1..=VERSION).contains(&h[4]) => h[4],
            Some(h) if h[..4] == MAGIC.to_be_bytes() => return Err(fail(&format!("unknown index version {}", h[4]))),
            _ => return Err(fail("bad header or file too short")),
        };
        let toc_bytes = if version == 1 { TOC_BYTES_V1 } else { TOC_BYTES };
        if map.len() < HEADER_BYTES + toc_bytes {
            return Err(fail("bad header or file too short"));
        }
        let toc = &map[map.len() - toc_bytes..];
        let (fields, crc) = toc.split_at(toc_bytes - 4);
        if crc32c::crc32c(fields).to_be_bytes() != crc {
            return Err(fail("table of contents checksum mismatch"));
        }
        let off = |i: usize| u64::from_be_bytes(toc[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        let (symbols_at, series_at, postings_or_pages, table_at) = (off(0), off(1), off(2), off(3));
        let base_time = if version == 1 { 0 } else { off(4) as i64 };
        let (start, body) = section_at(&map, symbols_at).map_err(|e| fail(&format!("symbol table: {e}")))?;
        let cache_id = super::chunks::next_reader_id();
        let symbols = if version < 3 {
            SymbolTable::parse_plain(start, body)
        } else if version >= 7 {
            SymbolTable::parse_framed(&map, start, body, cache_id)
        } else {
            let format = if version == 3 { EntryFormat::SharedLen } else { EntryFormat::Nibbles };
            SymbolTable::parse_front_coded(start, body, format)
        }
        .map_err(|e| fail(&format!("symbol table: {e}")))?;
        let nsym = symbols.len() as u64;
        let mut ix = IndexFile {
            path: path.to_owned(),
            map,
            symbols,
            table: PostingsTable::Rows(Vec::new()),
            all_postings: postings_or_pages,
            pages: Vec::new(),
            checked: Vec::new(),
            num_series: 0,
            opened: INDEX_FILES_OPENED.fetch_add(1, Ordering::Relaxed),
            version,
            base_time,
            bounds: None,
            frames: Vec::new(),
            cache_id,
        };
        if version >= 3 {
            ix.read_pages(series_at, postings_or_pages).map_err(|e| fail(&format!("series page table: {e}")))?;
        }

        let (start, body) = ix.section(table_at).map_err(|e| fail(&format!("postings table: {e}")))?;
        let table = if version < 3 {
            PostingsTable::parse_whole(body, nsym as usize)
        } else {
            let format = if version == 3 { RowFormat::Deltas } else { RowFormat::NextRows };
            PostingsTable::parse_in_place(start, body, nsym as usize, format)
        }
        .map_err(|e| fail(&format!("postings table: {e}")))?;
        ix.table = table;
        Ok(ix)
    }

    /// Reads the version-3 or 4 page table at `at`; the series section spans `[series_at, at)`.
    fn read_pages(&mut self, series_at: u64, at: u64) -> Result<(), String> {
        let map = self.map.clone();
        let (body_at, body) = section_at(&map, at)?;
        let mut d = Decoder::new(body);
        let count = d.uvarint("series count").map_err(|e| e.to_string())?;
        let n = count.div_ceil(SERIES_PAGE as u64);
        // A page row takes at least six bytes (version 4: eight).
        if n > body.len() as u64 / 6 + 1 {
            return Err(format!("{count} series in a {}-byte page table", body.len()));
        }
        // Version 7's pages are counted in raw bytes of their frames, from the first page's start.
        let framed = self.version >= 7;
        let mut start = if framed { 0 } else { series_at };
        for _ in 0..n {
            let len = d.uvarint("page length").map_err(|e| e.to_string())?;
            let chunk = d.uvarint("page base chunk").map_err(|e| e.to_string())?;
            let span = d.varint("page base span").map_err(|e| e.to_string())?;
            let (mint, unit) = if self.version >= 4 {
                let mint = self.base_time.wrapping_add(d.varint("page base time").map_err(|e| e.to_string())?);
                let unit = d.uvarint("page time unit").map_err(|e| e.to_string())?;
                if unit == 0 || unit > i64::MAX as u64 {
                    return Err(format!("a page's time unit is {unit}"));
                }
                (mint, unit)
            } else {
                (self.base_time, 1)
            };
            let crc = d.bytes(4, "page checksum").map_err(|e| e.to_string())?;
            let end = start.checked_add(len).filter(|&e| framed || e <= at).ok_or("a page runs past the series")?;
            let crc = u32::from_be_bytes(crc.try_into().expect("4 bytes"));
            self.pages.push(SeriesPage { start, end, base: PageBase { chunk, span, mint, unit }, crc, frame: 0 });
            start = end;
        }
        if framed {
            let ends: Vec<u64> = self.pages.iter().map(|p| p.end).collect();
            let (rows, frame_of) = frames::parse_rows(&mut d, &ends, series_at, at)?;
            for (page, f) in self.pages.iter_mut().zip(frame_of) {
                page.frame = f;
            }
            self.frames = rows;
        } else if start != at {
            return Err("pages do not cover the series exactly".into());
        }
        if self.version >= 5 {
            let base = self.base_time.wrapping_add(d.varint("time bounds base").map_err(|e| e.to_string())?);
            let unit = d.uvarint("time bounds unit").map_err(|e| e.to_string())?;
            // Version 6 leaves them out as base 0 and unit 0, with nothing after.
            let left_out = self.version >= 6 && base == self.base_time && d.is_empty();
            if unit == 0 && !left_out {
                return Err("the time bounds' unit is 0".into());
            }
            if unit != 0 {
                let len = count
                    .checked_mul(4)
                    .filter(|&l| l == d.remaining() as u64)
                    .ok_or_else(|| format!("{} bytes of time bounds for {count} series (4 each)", d.remaining()))?;
                let bytes = d.bytes(len as usize, "time bounds").map_err(|e| e.to_string())?;
                debug_assert_eq!(bytes.len() as u64, len);
                self.bounds =
                    Some(TimeBounds { at: body_at + d.offset() - len as usize, len: len as usize, base, unit });
            }
        }
        if !d.is_empty() {
            return Err("bytes after the page rows".into());
        }
        self.num_series = count;
        self.checked = (0..self.pages.len().div_ceil(64)).map(|_| AtomicU64::new(0)).collect();
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Series in the index (versions 3 to 5; 0 for older ones, which number series by offset).
    pub fn num_series(&self) -> u64 {
        self.num_series
    }

    /// Which series may have chunks in `[mint, maxt]`, from their time bounds, without reading
    /// their entries; `None` for indexes before version 5 (every series may).
    pub fn time_filter(&self, mint: i64, maxt: i64) -> Option<TimeFilter<'_>> {
        let b = self.bounds?;
        // In steps from the base, rounded down (a query before the base is step −1 or less);
        // clamped, since the bounds are u16.
        let step =
            |t: i64| ((t as i128 - b.base as i128).div_euclid(b.unit as i128)).clamp(-1, BOUNDS_STEPS as i128) as i64;
        Some(TimeFilter { bounds: &self.map[b.at..b.at + b.len], first: step(mint), last: step(maxt) })
    }

    /// `time_filter` as a postings cursor, to intersect with the matchers' postings.
    pub fn overlap_postings(&self, mint: i64, maxt: i64) -> Option<OverlapPostings> {
        let b = self.bounds?;
        let filter = self.time_filter(mint, maxt)?;
        Some(OverlapPostings {
            map: self.map.clone(),
            at: b.at,
            series: (b.len / 4) as u64,
            first: filter.first,
            last: filter.last,
            cur: None,
            done: false,
        })
    }

    pub fn bytes(&self) -> u64 {
        self.map.len() as u64
    }

    /// How the file's bytes divide between its parts, for `strata tsdb analyze`; `None` for
    /// versions 1 and 2 (their layout differs, and they are only read until compacted away).
    pub fn section_sizes(&self) -> Option<IndexSections> {
        if self.version < 3 {
            return None;
        }
        let toc = &self.map[self.map.len() - TOC_BYTES..];
        let off = |i: usize| u64::from_be_bytes(toc[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        let (symbols_at, series_at, pages_at, table_at) = (off(0), off(1), off(2), off(3));
        // Opening checked each section, so these lengths are in range.
        let section = |at: u64| 8 + section_at(&self.map, at).map_or(0, |(_, body)| body.len() as u64);
        let page_table = section(pages_at);
        Some(IndexSections {
            symbols: series_at - symbols_at,
            series: pages_at - series_at,
            page_table,
            postings: table_at - pages_at - page_table,
            postings_table: section(table_at),
        })
    }

    /// A checked section at `at`: its absolute body offset and body.
    fn section(&self, at: u64) -> Result<(usize, &[u8]), String> {
        section_at(&self.map, at)
    }

    pub fn num_symbols(&self) -> usize {
        self.symbols.len()
    }

    /// The string of symbol `id` (validated as UTF-8 when the file was opened); `id` must be
    /// below `num_symbols()`.
    pub fn symbol(&self, id: u32) -> Cow<'_, str> {
        self.symbols.get(&self.map, id)
    }

    /// Calls `f` with every symbol, in order.
    pub fn for_each_symbol(&self, mut f: impl FnMut(&str)) {
        self.symbols.for_each(&self.map, 0..self.symbols.len() as u32, |_, s| f(s));
    }

    /// Id of symbol `s`, by binary search (symbols are sorted).
    pub fn lookup_symbol(&self, s: &str) -> Option<u32> {
        self.symbols.lookup(&self.map, s)
    }

    /// Reads series `id`: its labels (strings shared through `cache`), and its chunk metas
    /// into `chunks` (cleared first).
    pub fn series(
        &self,
        id: SeriesRef,
        chunks: &mut Vec<ChunkMetaRef>,
        cache: &mut ReadCache,
    ) -> Result<Labels, String> {
        let labels = self.series_entry(id, None, chunks, cache)?;
        Ok(labels.expect("labels are resolved when no range is asked"))
    }

    /// This opening of the file's number: unique in the process, so it keys what caches keep
    /// of it (`block::series_cache`).
    pub fn opened_id(&self) -> u64 {
        self.opened
    }

    /// `series`, but the labels are resolved only when a chunk overlaps `[mint, maxt]`: a
    /// query over a block that holds many short-lived series (pods replaced every few
    /// minutes) pays for the labels of the ones alive in its range, not of every one its
    /// matchers select. `None` (with `chunks` filled) when no chunk overlaps.
    pub fn series_in_range(
        &self,
        id: SeriesRef,
        mint: i64,
        maxt: i64,
        chunks: &mut Vec<ChunkMetaRef>,
        cache: &mut ReadCache,
    ) -> Result<Option<Labels>, String> {
        self.series_entry(id, Some((mint, maxt)), chunks, cache)
    }

    /// Page `p`'s bytes: in the mapped file, or (version 7) in its frame, decompressed once
    /// and held by `cache` while the series read are in that frame (taken out of it meanwhile:
    /// `give_back` returns it, so a series read costs no reference count). The page's CRC is
    /// checked the first time it is read.
    fn page_bytes(&self, p: usize, cache: &mut ReadCache) -> Result<PageBytes<'_>, String> {
        let page = self.pages[p];
        let bytes = match self.frames.get(page.frame as usize) {
            None => PageBytes::Mapped { bytes: &self.map, base: 0 },
            Some(row) if !row.compressed => {
                PageBytes::Mapped { bytes: &self.map[row.file_at..row.file_at + row.file_len], base: row.raw_at }
            }
            Some(row) => {
                let f = page.frame as usize;
                let frame = match cache.frame.take() {
                    Some((file, at, frame)) if file == self.opened && at == f => frame,
                    _ => frames::read(&self.map, row, (self.cache_id, frames::SERIES_FRAMES, f as u32))?,
                };
                PageBytes::Decompressed { frame, index: f, base: row.raw_at }
            }
        };
        let bit = 1u64 << (p % 64);
        if self.checked[p / 64].load(Ordering::Relaxed) & bit == 0 {
            if crc32c::crc32c(bytes.range(page.start, page.end)) != page.crc {
                return Err(format!("checksum mismatch in series page {p}"));
            }
            self.checked[p / 64].fetch_or(bit, Ordering::Relaxed);
        }
        Ok(bytes)
    }

    /// Puts the frame `page_bytes` took (if any) back into `cache`.
    fn give_back(&self, bytes: PageBytes<'_>, cache: &mut ReadCache) {
        if let PageBytes::Decompressed { frame, index, .. } = bytes {
            cache.frame = Some((self.opened, index, frame));
        }
    }

    /// Where series `id`'s entry body is (its bytes, and its range in them), and (versions 3
    /// and up) its page and place in it. The entry is found from the last one `cache` read when
    /// that was before it in its page, else from the page's start.
    fn entry_body(
        &self,
        id: SeriesRef,
        cache: &mut ReadCache,
    ) -> Result<(PageBytes<'_>, std::ops::Range<u64>, Option<EntryPlace>), String> {
        if self.version >= 3 {
            if id.0 >= self.num_series {
                return Err(format!("no such series (the block has {})", self.num_series));
            }
            let p = (id.0 / SERIES_PAGE as u64) as usize;
            let index = (id.0 % SERIES_PAGE as u64) as usize;
            let page = self.pages[p];
            let bytes = self.page_bytes(p, cache)?;
            let (mut at, mut skip) = (page.start, index);
            if let Some(pos) = cache.position {
                if pos.file == self.opened && pos.page == p && pos.index <= index {
                    (at, skip) = (pos.offset, index - pos.index);
                }
            }
            let mut d = Decoder::new(bytes.range(at, page.end));
            let mut entry = || {
                let len = d.uvarint("series length")?;
                let start = d.offset();
                d.bytes(len as usize, "series entry").map(|_| start..d.offset())
            };
            for _ in 0..skip {
                entry().map_err(|e| e.to_string())?;
            }
            let body = entry().map_err(|e| e.to_string())?;
            let end = at + d.offset() as u64;
            cache.position = Some(PagePosition { file: self.opened, page: p, index: index + 1, offset: end });
            let body = at + body.start as u64..at + body.end as u64;
            return Ok((bytes, body, Some(EntryPlace { base: page.base, page: p, index })));
        }
        let align = if self.version == 1 { SERIES_ALIGN_V1 } else { SERIES_ALIGN };
        let Some(at) = id.0.checked_mul(align).and_then(|a| usize::try_from(a).ok()) else {
            return Err("offset outside the file".into());
        };
        if at >= self.map.len() {
            return Err("offset outside the file".into());
        }
        let mut d = Decoder::new(&self.map[at..]);
        let body =
            d.uvarint("series length").and_then(|n| d.bytes(n as usize, "series entry")).map_err(|e| e.to_string())?;
        let crc = d.bytes(4, "series checksum").map_err(|e| e.to_string())?;
        if !checksum_ok(body, crc) {
            return Err("checksum mismatch".into());
        }
        let start = (at + d.offset() - 4 - body.len()) as u64;
        Ok((PageBytes::Mapped { bytes: &self.map, base: 0 }, start..start + body.len() as u64, None))
    }

    /// A series entry's chunks, and its labels unless `range` is given and no chunk overlaps it.
    fn series_entry(
        &self,
        id: SeriesRef,
        range: Option<(i64, i64)>,
        chunks: &mut Vec<ChunkMetaRef>,
        cache: &mut ReadCache,
    ) -> Result<Option<Labels>, String> {
        let fail = |what: String| format!("{}: series {}: {what}", self.path.display(), id.0);
        let (bytes, body, place) = self.entry_body(id, cache).map_err(fail)?;
        if self.version >= 4 {
            let place = place.expect("version 4 entries are in pages");
            if place.index > 0 && cache.first_of != Some((self.opened, place.page)) {
                self.read_first_labels(place.page, &bytes, cache)
                    .map_err(|e| fail(format!("page {}: {e}", place.page)))?;
            }
        }
        let decoded = self.decode_series(bytes.range(body.start, body.end), place, range, chunks, cache);
        self.give_back(bytes, cache);
        decoded.map_err(|e| fail(e.to_string()))
    }

    /// Reads the label ids of page `p`'s first entry (in `bytes`, the page's) into `cache`
    /// (version 4: the page's other entries are written relative to them).
    fn read_first_labels(&self, p: usize, bytes: &PageBytes<'_>, cache: &mut ReadCache) -> Result<(), String> {
        let page = self.pages[p];
        let mut read = || -> Result<(), crate::encoding::DecodeError> {
            let mut d = Decoder::new(bytes.range(page.start, page.end));
            let len = d.uvarint("series length")?;
            let mut d = Decoder::new(d.bytes(len as usize, "series entry")?);
            cache.first_labels.clear();
            cache.first_of = None;
            for _ in 0..d.uvarint("label count")? {
                let name = d.uvarint("label name symbol")?;
                let value = d.uvarint("label value symbol")?;
                cache.first_labels.push((self.symbol_id(name, &d)?, self.symbol_id(value, &d)?));
            }
            cache.first_of = Some((self.opened, p));
            Ok(())
        };
        read().map_err(|e| e.to_string())
    }

    /// `id` as a symbol id, if the symbol exists.
    fn symbol_id(&self, id: u64, d: &Decoder<'_>) -> Result<u32, crate::encoding::DecodeError> {
        if id >= self.symbols.len() as u64 {
            return Err(crate::encoding::DecodeError {
                what: "label",
                offset: d.offset(),
                problem: "symbol does not exist",
            });
        }
        Ok(id as u32)
    }

    fn decode_series(
        &self,
        body: &[u8],
        place: Option<EntryPlace>,
        range: Option<(i64, i64)>,
        chunks: &mut Vec<ChunkMetaRef>,
        cache: &mut ReadCache,
    ) -> Result<Option<Labels>, crate::encoding::DecodeError> {
        let mut d = Decoder::new(body);
        let n = d.uvarint("label count")? as usize;
        // The label ids are read first (checked, not resolved): the chunks after them say
        // whether they are wanted.
        cache.ids.clear();
        let relative = self.version >= 4 && place.is_some_and(|p| p.index > 0);
        for i in 0..n {
            let (name, value) = if relative {
                // Version 4: relative to the page's first entry's ids at this position (0 past them).
                let (first_name, first_value) = cache.first_labels.get(i).copied().unwrap_or((0, 0));
                let name = (first_name as i64).wrapping_add(d.varint("label name symbol")?);
                let value = (first_value as i64).wrapping_add(d.varint("label value symbol")?);
                (name as u64, value as u64)
            } else {
                (d.uvarint("label name symbol")?, d.uvarint("label value symbol")?)
            };
            let ids = (self.symbol_id(name, &d)?, self.symbol_id(value, &d)?);
            cache.ids.push(ids);
        }
        if self.version >= 4 && place.is_some_and(|p| p.index == 0) {
            let place = place.expect("checked");
            cache.first_labels.clone_from(&cache.ids);
            cache.first_of = Some((self.opened, place.page));
        }
        self.decode_chunk_metas(&mut d, place.map(|p| p.base), chunks)?;
        if let Some((mint, maxt)) = range {
            if !chunks.iter().any(|c| c.maxt >= mint && c.mint <= maxt) {
                return Ok(None);
            }
        }
        let mut labels = Vec::with_capacity(n.min(64));
        for i in 0..n {
            let (name, value) = cache.ids[i];
            let (name, value) = if self.version >= 3 {
                // Series in label order repeat or advance each position's strings.
                if cache.symbols.len() < 2 * (i + 1) {
                    cache.symbols.resize_with(2 * (i + 1), Default::default);
                }
                let ReadCache { strings, symbols, .. } = cache;
                let mut resolve = |at: usize, id: u32| -> Arc<str> {
                    let cursor = &mut symbols[at];
                    if let Some(s) = cursor.shared(self.opened, id) {
                        return s.clone();
                    }
                    let s = intern(strings, self.symbols.get_via(&self.map, self.opened, id, cursor));
                    cursor.keep_shared(s.clone());
                    s
                };
                (resolve(2 * i, name), resolve(2 * i + 1, value))
            } else {
                (cache.intern(&self.symbol(name)), cache.intern(&self.symbol(value)))
            };
            labels.push(Label { name, value });
        }
        Ok(Some(Labels::from_sorted_unchecked(labels)))
    }

    /// The chunk references that follow a series' labels, into `chunks`. Version 3 writes the
    /// first chunk's span and ref relative to its `page`'s, version 4 also its mint, and every
    /// time in the page's unit.
    fn decode_chunk_metas(
        &self,
        d: &mut Decoder<'_>,
        page: Option<PageBase>,
        chunks: &mut Vec<ChunkMetaRef>,
    ) -> Result<(), crate::encoding::DecodeError> {
        chunks.clear();
        let n = d.uvarint("chunk count")?;
        let mut prev: Option<ChunkMetaRef> = None;
        // Versions 1 to 3 count in milliseconds.
        let unit = page.map_or(1, |p| p.unit) as i64;
        for _ in 0..n {
            let c = match prev {
                None => {
                    let mint = match page {
                        Some(base) if self.version >= 4 => {
                            base.mint.wrapping_add((d.uvarint("chunk mint")? as i64).wrapping_mul(unit))
                        }
                        _ => self.base_time.wrapping_add(d.varint("chunk mint")?),
                    };
                    let (maxt, chunk) = match page {
                        Some(base) => (
                            mint.wrapping_add(base.span.wrapping_add(d.varint("chunk span delta")?.wrapping_mul(unit))),
                            base.chunk.wrapping_add(d.varint("chunk ref delta")? as u64),
                        ),
                        None => (mint.wrapping_add(d.uvarint("chunk span")? as i64), d.uvarint("chunk ref")?),
                    };
                    if maxt < mint {
                        return Err(crate::encoding::DecodeError {
                            what: "chunk span",
                            offset: d.offset(),
                            problem: "chunk ends before it starts",
                        });
                    }
                    ChunkMetaRef { mint, maxt, chunk: ChunkRef(chunk) }
                }
                Some(p) => {
                    let mint = p.maxt.wrapping_add((d.uvarint("chunk mint delta")? as i64).wrapping_mul(unit));
                    let maxt = mint.wrapping_add((d.uvarint("chunk span")? as i64).wrapping_mul(unit));
                    ChunkMetaRef { mint, maxt, chunk: ChunkRef(p.chunk.0.wrapping_add(d.uvarint("chunk ref delta")?)) }
                }
            };
            chunks.push(c);
            prev = Some(c);
        }
        Ok(())
    }

    /// The postings a table row points at: its list, or its one series.
    fn postings_of(&self, target: u64) -> Result<MmapPostings, String> {
        if target & 1 == 1 {
            let id = target >> 1;
            if self.version < 3 || id >= self.num_series {
                return Err(format!("{}: postings table names series {id}, which does not exist", self.path.display()));
            }
            return Ok(MmapPostings::Range(RangePostings::new(id, id + 1)));
        }
        self.postings_at(target >> 1)
    }

    fn postings_at(&self, at: u64) -> Result<MmapPostings, String> {
        let fail = |e: String| format!("{}: postings list at byte {at}: {e}", self.path.display());
        let (start, body) = self.section(at).map_err(fail)?;
        if self.version == 1 {
            return Ok(MmapPostings::Raw(RawPostings { map: self.map.clone(), start, len: body.len() / 4, pos: 0 }));
        }
        let mut d = Decoder::new(body);
        let len = d.uvarint("postings count").map_err(|e| fail(e.to_string()))?;
        // A block takes at least two bytes (first id and width) for at most 128 ids: a count
        // the body cannot hold is damage.
        if len > 64 * body.len() as u64 {
            return Err(fail(format!("{len} series ids in {} bytes", body.len())));
        }
        Ok(MmapPostings::Packed(PackedPostings::new(
            self.map.clone(),
            start + d.offset(),
            start + body.len(),
            len as usize,
        )))
    }

    /// Every series, in label order.
    pub fn all_postings(&self) -> Result<MmapPostings, String> {
        if self.version >= 3 {
            return Ok(MmapPostings::Range(RangePostings::new(0, self.num_series)));
        }
        self.postings_at(self.all_postings)
    }

    /// Rows of the postings table for label `name`.
    fn name_rows(&self, name: &str) -> std::ops::Range<usize> {
        match self.lookup_symbol(name) {
            Some(id) => self.table.name_rows(id),
            None => 0..0,
        }
    }

    /// Postings of `name=value`; `Ok(None)` when no series has the pair.
    pub fn postings(&self, name: &str, value: &str) -> Result<Option<MmapPostings>, String> {
        let (Some(n), Some(v)) = (self.lookup_symbol(name), self.lookup_symbol(value)) else { return Ok(None) };
        match self.table.find(&self.map, n, v) {
            Some(e) => self.postings_of(e.target).map(Some),
            None => Ok(None),
        }
    }

    /// The first of `rows` (a name's, whose values are sorted as strings: symbol ids follow
    /// string order) whose value `before` does not take; a probe decodes at most a restart's
    /// worth of rows.
    fn bisect_rows(&self, mut rows: std::ops::Range<usize>, before: &dyn Fn(&str) -> bool) -> usize {
        let value = |r: usize| self.symbol(self.table.rows(&self.map, r..r + 1).next().map_or(0, |e| e.value));
        while rows.start < rows.end {
            let mid = (rows.start + rows.end) / 2;
            if before(&value(mid)) {
                rows.start = mid + 1;
            } else {
                rows.end = mid;
            }
        }
        rows.start
    }

    /// Postings of each of `values` of `name` (sorted, no repeats) the index has. Many values
    /// against the rows between the first and the last (a glob's thousand paths) are found in
    /// one walk over those rows, their strings decoded in order; few are looked up one by one
    /// (two symbol searches and a table search each).
    pub fn postings_of_values(&self, name: &str, values: &[&str]) -> Result<Vec<MmapPostings>, String> {
        debug_assert!(values.windows(2).all(|w| w[0] < w[1]), "values sorted, no repeats");
        let (Some(&first), Some(&last)) = (values.first(), values.last()) else { return Ok(Vec::new()) };
        let rows = self.name_rows(name);
        let from = self.bisect_rows(rows.clone(), &|v| v < first);
        let to = self.bisect_rows(from..rows.end, &|v| v <= last);
        if to - from > values.len().saturating_mul(VALUE_WALK_ROWS_PER_VALUE_MAX) {
            let mut out = Vec::with_capacity(values.len());
            for v in values {
                out.extend(self.postings(name, v)?);
            }
            return Ok(out);
        }
        self.postings_of_rows(from..to, &|v| values.binary_search(&v).is_ok())
    }

    /// Postings of every value of `name` that `accept` takes.
    pub fn postings_matching(
        &self,
        name: &str,
        prefix: &str,
        accept: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<MmapPostings>, String> {
        let rows = self.name_rows(name);
        // The prefix's values are together.
        let from = if prefix.is_empty() { rows.start } else { self.bisect_rows(rows.clone(), &|v| v < prefix) };
        let to =
            if prefix.is_empty() { rows.end } else { self.bisect_rows(from..rows.end, &|v| v.starts_with(prefix)) };
        self.postings_of_rows(from..to, accept)
    }

    /// Postings of the table rows `rows` (of one name) whose value `accept` takes.
    fn postings_of_rows(
        &self,
        rows: std::ops::Range<usize>,
        accept: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<MmapPostings>, String> {
        // Decoded once: the values' strings are read in order, then the wanted rows' postings.
        let rows: Vec<TableEntry> = self.table.rows(&self.map, rows).collect();
        let mut taken = Vec::with_capacity(rows.len());
        self.symbols.for_each(&self.map, rows.iter().map(|e| e.value), |_, v| taken.push(accept(v)));
        let mut out = Vec::new();
        for (e, take) in rows.iter().zip(taken) {
            if take {
                out.push(self.postings_of(e.target)?);
            }
        }
        Ok(out)
    }

    /// Label names, sorted.
    pub fn label_names(&self) -> Vec<String> {
        self.table.names().into_iter().map(|n| self.symbol(n).into_owned()).collect()
    }

    /// Values of label `name`, sorted.
    pub fn label_values(&self, name: &str) -> Vec<String> {
        let rows = self.name_rows(name);
        let mut out = Vec::with_capacity(rows.len());
        self.symbols
            .for_each(&self.map, self.table.rows(&self.map, rows).map(|e| e.value), |_, v| out.push(v.to_owned()));
        out
    }

    /// `(name, value, series count)` for every label pair (for `analyze`).
    pub fn pair_counts(&self) -> Vec<(String, String, usize)> {
        self.table
            .rows(&self.map, 0..self.table.len())
            .map(|e| {
                let len = self.postings_of(e.target).map_or(0, |p| p.len());
                (self.symbol(e.name).into_owned(), self.symbol(e.value).into_owned(), len)
            })
            .collect()
    }
}

/// The checked `len | body | crc` section at `at` of `data`: (absolute body offset, body).
fn section_at(data: &[u8], at: u64) -> Result<(usize, &[u8]), String> {
    let at = usize::try_from(at).map_err(|_| "offset does not fit in memory".to_string())?;
    let len_end = at.checked_add(4).filter(|&e| e <= data.len()).ok_or("offset outside the file")?;
    let len = u32::from_be_bytes(data[at..len_end].try_into().expect("4 bytes")) as usize;
    let end =
        len_end.checked_add(len).filter(|&e| e + 4 <= data.len()).ok_or("section runs past the end of the file")?;
    let body = &data[len_end..end];
    if !checksum_ok(body, &data[end..end + 4]) {
        return Err("checksum mismatch".into());
    }
    Ok((len_end, body))
}

/// Writes a packed postings list (`docs/format/block.md`): the count, then blocks of up to
/// `POSTINGS_BLOCK` ids, each its first id (as the distance from the previous block's first)
/// and the gaps to the next ids, less one, bit-packed at the block's width.
pub fn encode_postings(ids: &[u32], out: &mut Vec<u8>) {
    debug_assert!(ids.windows(2).all(|p| p[0] < p[1]), "postings must be strictly increasing");
    put_uvarint(out, ids.len() as u64);
    let mut prev_first = 0u32;
    for block in ids.chunks(POSTINGS_BLOCK) {
        put_uvarint(out, (block[0] - prev_first) as u64);
        prev_first = block[0];
        let width = block.windows(2).map(|p| 32 - (p[1] - p[0] - 1).leading_zeros()).max().unwrap_or(0);
        out.push(width as u8);
        let (mut acc, mut bits) = (0u64, 0u32);
        for p in block.windows(2) {
            acc = (acc << width) | (p[1] - p[0] - 1) as u64;
            bits += width;
            while bits >= 8 {
                bits -= 8;
                out.push((acc >> bits) as u8);
            }
        }
        if bits > 0 {
            out.push((acc << (8 - bits)) as u8);
        }
    }
}

/// A postings list read in place from the mapped index.
#[derive(Debug, Clone)]
pub enum MmapPostings {
    /// Version 1: `u32 BE` series ids.
    Raw(RawPostings),
    /// Version 2 and 3: bit-packed blocks (`encode_postings`).
    Packed(PackedPostings),
    /// Version 3: consecutive ids, all series or the one series of a label pair.
    Range(RangePostings),
}

impl MmapPostings {
    /// A packed list from `file`: one section (`len | body | crc`) at byte 0.
    #[cfg(test)]
    pub(crate) fn packed_for_tests(file: Bytes) -> Self {
        let (start, body) = section_at(&file, 0).expect("a valid section");
        let mut d = Decoder::new(body);
        let len = d.uvarint("count").expect("a count") as usize;
        let end = start + body.len();
        let at = start + d.offset();
        MmapPostings::Packed(PackedPostings::new(file, at, end, len))
    }

    pub fn len(&self) -> usize {
        match self {
            MmapPostings::Raw(p) => p.len,
            MmapPostings::Packed(p) => p.len,
            MmapPostings::Range(p) => (p.end - p.start) as usize,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Postings for MmapPostings {
    fn next(&mut self) -> Option<SeriesRef> {
        match self {
            MmapPostings::Raw(p) => p.next(),
            MmapPostings::Packed(p) => p.next(),
            MmapPostings::Range(p) => p.next(),
        }
    }

    fn seek(&mut self, target: SeriesRef) -> Option<SeriesRef> {
        match self {
            MmapPostings::Raw(p) => p.seek(target),
            MmapPostings::Packed(p) => p.seek(target),
            MmapPostings::Range(p) => p.seek(target),
        }
    }

    fn at(&self) -> Option<SeriesRef> {
        match self {
            MmapPostings::Raw(p) => p.at(),
            MmapPostings::Packed(p) => p.at(),
            MmapPostings::Range(p) => p.at(),
        }
    }
}

/// A packed postings list, decoded a block at a time. Seeking walks block headers (each names
/// its first id) and decodes only the block that holds the target. A list cut short or
/// otherwise malformed ends where the damage starts (its section's CRC has been checked, so
/// that is only a writer bug or the fuzzer).
#[derive(Debug, Clone)]
pub struct PackedPostings {
    map: Bytes,
    end: usize,
    len: usize,
    /// The next block's header, its first id's base (the current block's first id), and how
    /// many ids the blocks from there hold.
    next_block: usize,
    next_base: u32,
    ids_left: usize,
    /// The current block's ids and the position in them (index of the current id plus one).
    ids: Vec<u32>,
    pos: usize,
    done: bool,
}

impl PackedPostings {
    fn new(map: Bytes, start: usize, end: usize, len: usize) -> Self {
        PackedPostings {
            map,
            end,
            len,
            next_block: start,
            next_base: 0,
            ids_left: len,
            ids: Vec::new(),
            pos: 0,
            done: len == 0,
        }
    }

    /// The next block's first id and where its packed gaps start, without entering it.
    fn peek_block(&self) -> Option<(u32, usize, u32)> {
        self.block_header(self.next_block, self.next_base, self.ids_left)
    }

    /// The header of the block at byte `at` whose first id is `base` plus its stored delta,
    /// with `ids_left` ids in the blocks from there: (first id, where its gaps start, width).
    fn block_header(&self, at: usize, base: u32, ids_left: usize) -> Option<(u32, usize, u32)> {
        if ids_left == 0 || at >= self.end {
            return None;
        }
        let mut d = Decoder::new(&self.map[at..self.end]);
        let delta = u32::try_from(d.uvarint("block first").ok()?).ok()?;
        let first = base.checked_add(delta)?;
        let width = *d.bytes(1, "block width").ok()?.first()? as u32;
        (width <= 32).then_some((first, at + d.offset(), width))
    }

    /// Moves to the next block; decodes its ids only when `decode` (else just skips its bytes).
    fn enter_block(&mut self, decode: bool) -> bool {
        let Some((first, data, width)) = self.peek_block() else {
            self.done = true;
            return false;
        };
        let n = self.ids_left.min(POSTINGS_BLOCK);
        let bytes = ((n - 1) * width as usize).div_ceil(8);
        if data + bytes > self.end {
            self.done = true;
            return false;
        }
        self.ids.clear();
        self.ids.push(first);
        if decode {
            let packed = &self.map[data..data + bytes];
            let (mut acc, mut bits, mut at) = (0u64, 0u32, 0usize);
            let mask = if width == 32 { u32::MAX as u64 } else { (1u64 << width) - 1 };
            let mut id = first;
            for _ in 1..n {
                while bits < width {
                    acc = (acc << 8) | packed[at] as u64;
                    at += 1;
                    bits += 8;
                }
                bits -= width;
                let gap = ((acc >> bits) & mask) as u32;
                match id.checked_add(gap).and_then(|v| v.checked_add(1)) {
                    Some(v) => id = v,
                    None => {
                        self.done = true;
                        return false;
                    }
                }
                self.ids.push(id);
            }
        }
        self.next_block = data + bytes;
        self.next_base = first;
        self.ids_left -= n;
        self.pos = 0;
        true
    }

    /// Past the end: no current id.
    fn finish(&mut self) -> Option<SeriesRef> {
        self.done = true;
        self.ids.clear();
        self.pos = 0;
        None
    }

    fn next(&mut self) -> Option<SeriesRef> {
        if self.done {
            return self.finish();
        }
        let prev = self.at();
        if self.pos >= self.ids.len() && !self.enter_block(true) {
            return self.finish();
        }
        self.pos += 1;
        let id = SeriesRef(self.ids[self.pos - 1] as u64);
        // A block whose first id does not pass the previous block's last is damage: end there,
        // so that readers always see increasing ids.
        if prev.is_some_and(|p| id <= p) {
            return self.finish();
        }
        Some(id)
    }

    fn seek(&mut self, target: SeriesRef) -> Option<SeriesRef> {
        if let Some(cur) = self.at() {
            if cur >= target {
                return Some(cur);
            }
        }
        if self.done {
            return self.finish();
        }
        // Most seeks of an intersection land in the current block: no look at the next ones.
        // Otherwise, skip whole blocks while the next one starts at or before the target.
        while !self.rest_reaches(target.0) {
            let Some((first, _, _)) = self.peek_block() else { break };
            if (first as u64) > target.0 {
                break;
            }
            let last_block = self.ids_left <= POSTINGS_BLOCK;
            let after = self.peek_block_after();
            if !last_block && after.is_some_and(|f| f as u64 <= target.0) {
                self.enter_block(false);
            } else {
                break;
            }
        }
        // The target is in the current block's rest or in the next block.
        loop {
            if self.rest_reaches(target.0) {
                return Some(self.seek_in_block(target.0));
            }
            self.pos = self.ids.len();
            if !self.enter_block(true) {
                return self.finish();
            }
        }
    }

    /// The first id of the block after the next one.
    fn peek_block_after(&self) -> Option<u32> {
        let (first, data, width) = self.peek_block()?;
        let n = self.ids_left.min(POSTINGS_BLOCK);
        let after = data + ((n - 1) * width as usize).div_ceil(8);
        self.block_header(after, first, self.ids_left - n).map(|(f, _, _)| f)
    }

    /// Whether the current block's ids after the current one include one at or after `target`.
    fn rest_reaches(&self, target: u64) -> bool {
        self.pos < self.ids.len() && self.ids.last().is_some_and(|&last| last as u64 >= target)
    }

    /// The first id at or after `target` in the current block's rest, which holds one; made
    /// current. An intersection's targets are mostly a few ids ahead: the next ones are
    /// probed before the rest is halved.
    fn seek_in_block(&mut self, target: u64) -> SeriesRef {
        let rest = &self.ids[self.pos..];
        debug_assert!(rest.last().is_some_and(|&id| id as u64 >= target));
        const PROBES: usize = 8;
        let i = match rest.iter().take(PROBES).position(|&id| id as u64 >= target) {
            Some(i) => i,
            None => PROBES + rest[PROBES..].partition_point(|&id| (id as u64) < target),
        };
        self.pos += i + 1;
        SeriesRef(self.ids[self.pos - 1] as u64)
    }

    fn at(&self) -> Option<SeriesRef> {
        self.pos.checked_sub(1).and_then(|i| self.ids.get(i)).map(|&id| SeriesRef(id as u64))
    }
}

/// A version-1 postings list read in place: `u32 BE` series ids.
#[derive(Debug, Clone)]
pub struct RawPostings {
    map: Bytes,
    start: usize,
    len: usize,
    /// Index of the current element plus one (0 = before the start).
    pos: usize,
}

impl RawPostings {
    #[inline]
    fn get(&self, i: usize) -> SeriesRef {
        let at = self.start + i * 4;
        SeriesRef(u32::from_be_bytes(self.map[at..at + 4].try_into().expect("4 bytes")) as u64)
    }
}

impl Postings for RawPostings {
    fn next(&mut self) -> Option<SeriesRef> {
        if self.pos < self.len {
            self.pos += 1;
            Some(self.get(self.pos - 1))
        } else {
            self.pos = self.len + 1;
            None
        }
    }

    fn seek(&mut self, target: SeriesRef) -> Option<SeriesRef> {
        let from = self.pos.saturating_sub(1);
        if from >= self.len {
            self.pos = self.len + 1;
            return None;
        }
        if self.pos > 0 && self.get(from) >= target {
            return Some(self.get(from));
        }
        // Gallop, then binary search in the bracket found.
        let mut bound = 1;
        while from + bound < self.len && self.get(from + bound) < target {
            bound *= 2;
        }
        let (mut lo, mut hi) = (from + bound / 2, (from + bound + 1).min(self.len));
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.get(mid) < target {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        self.pos = lo + 1;
        (lo < self.len).then(|| self.get(lo))
    }

    fn at(&self) -> Option<SeriesRef> {
        self.pos.checked_sub(1).filter(|&i| i < self.len).map(|i| self.get(i))
    }
}

/// The ids `start..end` (version 3's list of all series, and a pair's one series).
#[derive(Debug, Clone)]
pub struct RangePostings {
    start: u64,
    end: u64,
    /// The current id; `None` before the start and past the end.
    at: Option<u64>,
    started: bool,
}

impl RangePostings {
    fn new(start: u64, end: u64) -> Self {
        RangePostings { start, end, at: None, started: false }
    }

    fn to(&mut self, id: u64) -> Option<SeriesRef> {
        self.started = true;
        self.at = (id < self.end).then_some(id);
        self.at.map(SeriesRef)
    }
}

impl Postings for RangePostings {
    fn next(&mut self) -> Option<SeriesRef> {
        match (self.started, self.at) {
            (false, _) => self.to(self.start),
            (true, Some(id)) => self.to(id + 1),
            (true, None) => None,
        }
    }

    fn seek(&mut self, target: SeriesRef) -> Option<SeriesRef> {
        match (self.started, self.at) {
            (true, None) => None,
            (_, cur) => self.to(target.0.max(cur.unwrap_or(self.start))),
        }
    }

    fn at(&self) -> Option<SeriesRef> {
        self.at.map(SeriesRef)
    }
}
