//! A block's `index` file: the symbol table, one entry per series (labels as symbol ids and
//! chunk metas), sorted postings lists and a table locating them, then a table of contents.
//! Every section carries a CRC32C. Byte layout: `docs/format/block.md`.
//!
//! Series are written in label order, and a series' id is its entry's offset / 16, so ids
//! ascend in label order too: postings lists are sorted by construction, and merging blocks or
//! answering a query in label order needs no sort.

use std::collections::{HashMap, HashSet};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use strata_model::{Label, Labels, SeriesRef};

use super::chunks::ChunkRef;
use crate::encoding::{put_uvarint, put_varint, Decoder};
use crate::error::{io_err, Error, Result};
use crate::index::postings::Postings;
use crate::vfs::{AppendWriter, Vfs};

/// "STIX": Strata index.
pub const MAGIC: u32 = 0x5354_4958;
pub const VERSION: u8 = 1;
pub const HEADER_BYTES: usize = 8;
/// Series entries start at multiples of this; an id is the offset divided by it.
pub const SERIES_ALIGN: u64 = 16;
/// Table of contents: four u64 offsets and a CRC32C.
pub const TOC_BYTES: usize = 4 * 8 + 4;
pub const INDEX_FILE: &str = "index";

/// A chunk as the index describes it: its time range (inclusive) and where it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkMetaRef {
    pub mint: i64,
    pub maxt: i64,
    pub chunk: ChunkRef,
}

/// Shares one `Arc<str>` per distinct label string among the label sets a reader decodes.
///
/// A query reads the same series from every block it overlaps; without sharing, each copy
/// costs two allocations per label, and putting the copies in label order compares their
/// bytes. With it, a label string is allocated once per reader, and equal labels are the same
/// pointer, which `Labels`' comparison checks first.
#[derive(Debug, Default, Clone)]
pub struct SymbolInterner {
    strings: HashSet<Arc<str>, foldhash::fast::RandomState>,
}

impl SymbolInterner {
    pub fn intern(&mut self, s: &str) -> Arc<str> {
        if let Some(a) = self.strings.get(s) {
            return a.clone();
        }
        let a: Arc<str> = Arc::from(s);
        self.strings.insert(a.clone());
        a
    }

    /// Makes `a` the shared string for its text, unless one is shared already (so label sets
    /// decoded later reuse strings the caller holds, e.g. the head's).
    pub fn adopt(&mut self, a: &Arc<str>) {
        if !self.strings.contains(&**a) {
            self.strings.insert(a.clone());
        }
    }
}

fn header() -> [u8; HEADER_BYTES] {
    super::file_header(MAGIC, VERSION)
}

/// Writes an index in one pass: symbols first (the caller knows them all up front), then series
/// in label order, then postings accumulated meanwhile.
#[derive(Debug)]
pub struct IndexWriter {
    path: PathBuf,
    file: BufWriter<AppendWriter>,
    pos: u64,
    symbols: HashMap<Arc<str>, u32>,
    series_start: u64,
    postings: HashMap<(u32, u32), Vec<u32>>,
    all: Vec<u32>,
    last: Option<Labels>,
    buf: Vec<u8>,
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
            symbols: HashMap::with_capacity(symbols.len()),
            series_start: 0,
            postings: HashMap::new(),
            all: Vec::new(),
            last: None,
            buf: Vec::new(),
        };
        w.write(&header())?;
        let mut body = Vec::new();
        put_uvarint(&mut body, symbols.len() as u64);
        for (i, s) in symbols.iter().enumerate() {
            put_uvarint(&mut body, s.len() as u64);
            body.extend_from_slice(s.as_bytes());
            w.symbols.insert(s.clone(), i as u32);
        }
        w.section(&body)?;
        w.align()?;
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

    fn align(&mut self) -> Result<()> {
        let pad = (SERIES_ALIGN - self.pos % SERIES_ALIGN) % SERIES_ALIGN;
        self.write(&[0u8; SERIES_ALIGN as usize][..pad as usize])
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
        self.align()?;
        let id = u32::try_from(self.pos / SERIES_ALIGN).expect("index series section over 64 GiB");
        let mut body = std::mem::take(&mut self.buf);
        body.clear();
        put_uvarint(&mut body, labels.len() as u64);
        for l in labels {
            let (n, v) = (self.symbol(&l.name), self.symbol(&l.value));
            put_uvarint(&mut body, n as u64);
            put_uvarint(&mut body, v as u64);
            self.postings.entry((n, v)).or_default().push(id);
        }
        put_uvarint(&mut body, chunks.len() as u64);
        let mut prev: Option<&ChunkMetaRef> = None;
        for c in chunks {
            debug_assert!(c.mint <= c.maxt);
            match prev {
                None => {
                    put_varint(&mut body, c.mint);
                    put_uvarint(&mut body, c.maxt.wrapping_sub(c.mint) as u64);
                    put_uvarint(&mut body, c.chunk.0);
                }
                Some(p) => {
                    // A series' chunks neither overlap nor go back in the file: both deltas are
                    // positive, so they take unsigned varints (a byte less than zigzag, often).
                    assert!(c.mint > p.maxt && c.chunk > p.chunk, "chunks of {labels} overlap or go backwards");
                    put_uvarint(&mut body, c.mint.wrapping_sub(p.maxt) as u64);
                    put_uvarint(&mut body, c.maxt.wrapping_sub(c.mint) as u64);
                    put_uvarint(&mut body, c.chunk.0 - p.chunk.0);
                }
            }
            prev = Some(c);
        }
        let mut head = Vec::with_capacity(10);
        put_uvarint(&mut head, body.len() as u64);
        self.write(&head)?;
        self.write(&body)?;
        self.write(&crc32c::crc32c(&body).to_be_bytes())?;
        self.buf = body;
        self.all.push(id);
        self.last = Some(labels.clone());
        Ok(())
    }

    fn postings_list(&mut self, ids: &[u32]) -> Result<u64> {
        let at = self.pos;
        let mut body = Vec::with_capacity(ids.len() * 4);
        for id in ids {
            body.extend_from_slice(&id.to_be_bytes());
        }
        self.section(&body)?;
        Ok(at)
    }

    /// Writes postings, their table and the TOC, then fsyncs. Returns the file's size.
    pub fn finish(mut self) -> Result<u64> {
        let all = std::mem::take(&mut self.all);
        let series = self.series_start;
        let all_at = self.postings_list(&all)?;
        let mut keys: Vec<(u32, u32)> = self.postings.keys().copied().collect();
        keys.sort_unstable();
        let mut table = Vec::new();
        put_uvarint(&mut table, keys.len() as u64);
        for k in keys {
            let ids = self.postings.remove(&k).expect("key from the map");
            let at = self.postings_list(&ids)?;
            put_uvarint(&mut table, k.0 as u64);
            put_uvarint(&mut table, k.1 as u64);
            put_uvarint(&mut table, at);
        }
        let table_at = self.pos;
        self.section(&table)?;
        let mut toc = Vec::with_capacity(TOC_BYTES);
        for v in [HEADER_BYTES as u64, series, all_at, table_at] {
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

/// One row of the postings table: label pair as symbol ids and its list's offset.
#[derive(Clone, Copy, Debug)]
struct TableEntry {
    name: u32,
    value: u32,
    offset: u64,
}

/// A memory-mapped index. Opening reads the TOC, the symbol table and the postings table
/// (checking their CRCs); series entries and postings lists are checked when read.
#[derive(Debug)]
pub struct IndexFile {
    path: PathBuf,
    map: Bytes,
    /// Byte offset of each symbol's string (after its length).
    symbols: Vec<(u32, u32)>,
    table: Vec<TableEntry>,
    all_postings: u64,
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
        if map.len() < HEADER_BYTES + TOC_BYTES || map[..HEADER_BYTES] != header() {
            return Err(fail("bad header or file too short"));
        }
        let toc = &map[map.len() - TOC_BYTES..];
        if crc32c::crc32c(&toc[..32]).to_be_bytes() != toc[32..] {
            return Err(fail("table of contents checksum mismatch"));
        }
        let off = |i: usize| u64::from_be_bytes(toc[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        let (symbols_at, _series_at, all_postings, table_at) = (off(0), off(1), off(2), off(3));
        let mut ix = IndexFile { path: path.to_owned(), map, symbols: Vec::new(), table: Vec::new(), all_postings };

        let (start, body) = ix.section(symbols_at).map_err(|e| fail(&format!("symbol table: {e}")))?;
        let mut d = Decoder::new(body);
        let n = d.uvarint("symbol count").map_err(|e| fail(&e.to_string()))?;
        let mut symbols = Vec::with_capacity(n.min(body.len() as u64) as usize);
        for _ in 0..n {
            let s = d.str("symbol").map_err(|e| fail(&format!("symbol table: {e}")))?;
            let at = start + d.offset() - s.len();
            symbols.push((at as u32, s.len() as u32));
        }
        ix.symbols = symbols;
        let nsym = ix.symbols.len() as u64;

        let (_, body) = ix.section(table_at).map_err(|e| fail(&format!("postings table: {e}")))?;
        let mut d = Decoder::new(body);
        let mut table = Vec::new();
        let mut read = || -> Result<(), crate::encoding::DecodeError> {
            let n = d.uvarint("postings table count")?;
            for _ in 0..n {
                let name = d.uvarint("label name symbol")?;
                let value = d.uvarint("label value symbol")?;
                let offset = d.uvarint("postings offset")?;
                table.push(TableEntry { name: name as u32, value: value as u32, offset });
            }
            Ok(())
        };
        read().map_err(|e| fail(&format!("postings table: {e}")))?;
        if table.iter().any(|e| e.name as u64 >= nsym || e.value as u64 >= nsym) {
            return Err(fail("postings table refers to a symbol that does not exist"));
        }
        if !table.windows(2).all(|w| (w[0].name, w[0].value) < (w[1].name, w[1].value)) {
            return Err(fail("postings table is not sorted"));
        }
        ix.table = table;
        Ok(ix)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn bytes(&self) -> u64 {
        self.map.len() as u64
    }

    /// A checked section at `at`: its absolute body offset and body.
    fn section(&self, at: u64) -> Result<(usize, &[u8]), String> {
        section_at(&self.map, at)
    }

    pub fn num_symbols(&self) -> usize {
        self.symbols.len()
    }

    /// The string of symbol `id` (validated as UTF-8 when the file was opened).
    pub fn symbol(&self, id: u32) -> &str {
        let (at, len) = self.symbols[id as usize];
        std::str::from_utf8(&self.map[at as usize..(at + len) as usize]).unwrap_or("\u{fffd}")
    }

    /// Id of symbol `s`, by binary search (symbols are sorted).
    pub fn lookup_symbol(&self, s: &str) -> Option<u32> {
        let (mut lo, mut hi) = (0usize, self.symbols.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            match self.symbol(mid as u32).cmp(s) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(mid as u32),
            }
        }
        None
    }

    /// Reads series `id`: its labels (strings shared through `interner`), and its chunk metas
    /// into `chunks` (cleared first).
    pub fn series(
        &self,
        id: SeriesRef,
        chunks: &mut Vec<ChunkMetaRef>,
        interner: &mut SymbolInterner,
    ) -> Result<Labels, String> {
        let fail = |what: String| format!("{}: series {}: {what}", self.path.display(), id.0);
        let at = (id.0 * SERIES_ALIGN) as usize;
        if at >= self.map.len() {
            return Err(fail("offset outside the file".into()));
        }
        let mut d = Decoder::new(&self.map[at..]);
        let body = d
            .uvarint("series length")
            .and_then(|n| d.bytes(n as usize, "series entry"))
            .map_err(|e| fail(e.to_string()))?;
        let crc = d.bytes(4, "series checksum").map_err(|e| fail(e.to_string()))?;
        if !checksum_ok(body, crc) {
            return Err(fail("checksum mismatch".into()));
        }
        self.decode_series(body, chunks, interner).map_err(|e| fail(e.to_string()))
    }

    fn decode_series(
        &self,
        body: &[u8],
        chunks: &mut Vec<ChunkMetaRef>,
        interner: &mut SymbolInterner,
    ) -> Result<Labels, crate::encoding::DecodeError> {
        let mut d = Decoder::new(body);
        let n = d.uvarint("label count")? as usize;
        let mut labels = Vec::with_capacity(n.min(64));
        for _ in 0..n {
            let name = d.uvarint("label name symbol")?;
            let value = d.uvarint("label value symbol")?;
            if name >= self.symbols.len() as u64 || value >= self.symbols.len() as u64 {
                return Err(crate::encoding::DecodeError {
                    what: "label",
                    offset: d.offset(),
                    problem: "symbol does not exist",
                });
            }
            labels.push(Label {
                name: interner.intern(self.symbol(name as u32)),
                value: interner.intern(self.symbol(value as u32)),
            });
        }
        chunks.clear();
        let n = d.uvarint("chunk count")?;
        let mut prev: Option<ChunkMetaRef> = None;
        for _ in 0..n {
            let c = match prev {
                None => {
                    let mint = d.varint("chunk mint")?;
                    let maxt = mint.wrapping_add(d.uvarint("chunk span")? as i64);
                    ChunkMetaRef { mint, maxt, chunk: ChunkRef(d.uvarint("chunk ref")?) }
                }
                Some(p) => {
                    let mint = p.maxt.wrapping_add(d.uvarint("chunk mint delta")? as i64);
                    let maxt = mint.wrapping_add(d.uvarint("chunk span")? as i64);
                    ChunkMetaRef { mint, maxt, chunk: ChunkRef(p.chunk.0.wrapping_add(d.uvarint("chunk ref delta")?)) }
                }
            };
            chunks.push(c);
            prev = Some(c);
        }
        Ok(Labels::from_sorted_unchecked(labels))
    }

    fn postings_at(&self, at: u64) -> Result<MmapPostings, String> {
        let (start, body) =
            self.section(at).map_err(|e| format!("{}: postings list at byte {at}: {e}", self.path.display()))?;
        Ok(MmapPostings { map: self.map.clone(), start, len: body.len() / 4, pos: 0 })
    }

    /// Every series, in label order.
    pub fn all_postings(&self) -> Result<MmapPostings, String> {
        self.postings_at(self.all_postings)
    }

    /// Rows of the postings table for label `name`.
    fn name_range(&self, name: &str) -> &[TableEntry] {
        let Some(id) = self.lookup_symbol(name) else { return &[] };
        let lo = self.table.partition_point(|e| e.name < id);
        let hi = self.table.partition_point(|e| e.name <= id);
        &self.table[lo..hi]
    }

    /// Postings of `name=value`; `Ok(None)` when no series has the pair.
    pub fn postings(&self, name: &str, value: &str) -> Result<Option<MmapPostings>, String> {
        let Some(v) = self.lookup_symbol(value) else { return Ok(None) };
        let range = self.name_range(name);
        match range.binary_search_by_key(&v, |e| e.value) {
            Ok(i) => self.postings_at(range[i].offset).map(Some),
            Err(_) => Ok(None),
        }
    }

    /// Postings of every value of `name` that `accept` takes.
    pub fn postings_matching(
        &self,
        name: &str,
        prefix: &str,
        accept: &dyn Fn(&str) -> bool,
    ) -> Result<Vec<MmapPostings>, String> {
        let range = self.name_range(name);
        // Values are sorted as strings (symbol ids follow string order): skip to the prefix.
        let from = if prefix.is_empty() { 0 } else { range.partition_point(|e| self.symbol(e.value) < prefix) };
        let mut out = Vec::new();
        for e in &range[from..] {
            let v = self.symbol(e.value);
            if !v.starts_with(prefix) {
                break;
            }
            if accept(v) {
                out.push(self.postings_at(e.offset)?);
            }
        }
        Ok(out)
    }

    /// Label names, sorted.
    pub fn label_names(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for e in &self.table {
            let n = self.symbol(e.name);
            if out.last() != Some(&n) {
                out.push(n);
            }
        }
        out
    }

    /// Values of label `name`, sorted.
    pub fn label_values(&self, name: &str) -> Vec<&str> {
        self.name_range(name).iter().map(|e| self.symbol(e.value)).collect()
    }

    /// `(name, value, series count)` for every label pair (for `analyze`).
    pub fn pair_counts(&self) -> Vec<(&str, &str, usize)> {
        self.table
            .iter()
            .map(|e| {
                let len = self.section(e.offset).map_or(0, |(_, b)| b.len() / 4);
                (self.symbol(e.name), self.symbol(e.value), len)
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

/// Whether `crc` is the CRC32C of `body`. Under the fuzzer (`cfg(fuzzing)`, set by cargo-fuzz)
/// every section passes: a mutated byte would otherwise fail its section's checksum and never
/// reach the decoding behind it, which is what the `block_index` target is there to explore.
fn checksum_ok(body: &[u8], crc: &[u8]) -> bool {
    cfg!(fuzzing) || crc32c::crc32c(body).to_be_bytes() == crc
}

/// A postings list read in place from the mapped index: `u32 BE` series ids.
#[derive(Debug, Clone)]
pub struct MmapPostings {
    map: Bytes,
    start: usize,
    len: usize,
    /// Index of the current element plus one (0 = before the start).
    pos: usize,
}

impl MmapPostings {
    #[inline]
    fn get(&self, i: usize) -> SeriesRef {
        let at = self.start + i * 4;
        SeriesRef(u32::from_be_bytes(self.map[at..at + 4].try_into().expect("4 bytes")) as u64)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Postings for MmapPostings {
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
