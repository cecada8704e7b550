//! A block's `chunks/` directory: numbered segment files holding chunks in groups, each group
//! zstd-compressed when that pays and checked by its own CRC32C. A chunk is addressed by a
//! [`ChunkRef`]: segment number, group and place in the group. Byte layout:
//! `docs/format/block.md`.
//!
//! Chunks of neighbouring series (series are written in label order) share timestamps, headers
//! and value patterns that a chunk cannot see by itself: compressing about 16 KiB of them
//! together saves a fifth of their bytes (`cargo bench -p strata-tsdb --bench tsdb_bench --
//! chunks`). A read decompresses the chunk's group once; decompressed groups are kept in a
//! bounded process-wide cache (`GroupCache`), so a query reading the series of a group in order
//! decompresses it once. Version-1 segments (one checksummed chunk per entry) are still read.

use std::io::{BufWriter, Write};
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

use super::checksum_ok;
use super::fifo::Fifo;
use crate::chunkenc::ChunkError;
use crate::encoding::{put_uvarint, Decoder};
use crate::error::{io_err, Error, Result};
use crate::fsutil::{create_dir_all, fsync_dir};
use crate::vfs::{AppendWriter, Vfs};

/// "STCH": Strata chunks.
pub const MAGIC: u32 = 0x5354_4348;
/// Version written: chunks in groups. Version 1 (one entry per chunk) is still read.
pub const VERSION: u8 = 2;
/// Magic (4), version (1), three zero bytes.
pub const HEADER_BYTES: usize = 8;
/// A segment is closed once it reaches this size; a group's offset must stay below it (refs
/// hold it in 24 bits of `GROUP_ALIGN`-byte units).
pub const SEGMENT_BYTES_MAX: u64 = 512 << 20;
pub const CHUNKS_DIR: &str = "chunks";
/// A group is closed once its chunks (with their lengths) reach this many bytes.
pub const GROUP_RAW_BYTES: usize = 16 << 10;
/// Groups start at multiples of this many bytes.
pub const GROUP_ALIGN: u64 = 32;
/// At most this many chunks in a group (the low byte of a ref numbers them).
pub const GROUP_CHUNKS_MAX: usize = 255;
/// A group never decompresses to more than this (a reader refuses a header that claims more).
pub const GROUP_RAW_MAX: usize = 16 << 20;
/// zstd level of groups: level 3 is within 1% of level 9's size on the node-exporter recording
/// and compresses several times faster.
const GROUP_ZSTD_LEVEL: i32 = 3;
/// zstd level of groups of small chunks (`SMALL_CHUNK_BYTES` on average): a series of a few
/// samples (a Graphite path's ten points, a short-lived pod's) is mostly its chunk's header
/// fields (first time, step, bases, widths), which repeat from chunk to chunk of a group at
/// other bit offsets; level 6's match finder takes 7% more off such groups than level 3's
/// (1M Graphite paths × 10 points, 30-byte chunks), at 94 against 250 MB/s, still well over
/// a compaction's pace for so few bytes per series.
const GROUP_ZSTD_LEVEL_SMALL_CHUNKS: i32 = 6;
/// A group whose chunks average at most this many bytes (with their lengths) is compressed at
/// `GROUP_ZSTD_LEVEL_SMALL_CHUNKS`.
const SMALL_CHUNK_BYTES: usize = 64;
/// Group kinds: stored as they are, or zstd-compressed.
const GROUP_RAW: u8 = 0;
const GROUP_ZSTD: u8 = 1;

const _: () = assert!(SEGMENT_BYTES_MAX / GROUP_ALIGN <= 1 << 24);

/// Where a chunk lives: `segment << 32 | offset`. Segment numbers start at 1, so a zero ref
/// is never valid. In a version-1 segment `offset` is the chunk's entry; in a version-2 one it is
/// `group offset / GROUP_ALIGN << 8 | place in the group`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChunkRef(pub u64);

impl ChunkRef {
    pub fn new(segment: u32, offset: u32) -> Self {
        ChunkRef((segment as u64) << 32 | offset as u64)
    }
    /// The ref of the `index`th chunk of the group at byte `group_at` of a version-2 segment.
    pub fn in_group(segment: u32, group_at: u64, index: usize) -> Self {
        debug_assert!(
            group_at.is_multiple_of(GROUP_ALIGN) && group_at < SEGMENT_BYTES_MAX && index <= GROUP_CHUNKS_MAX
        );
        ChunkRef::new(segment, ((group_at / GROUP_ALIGN) << 8 | index as u64) as u32)
    }
    pub fn segment(self) -> u32 {
        (self.0 >> 32) as u32
    }
    pub fn offset(self) -> u32 {
        self.0 as u32
    }
    /// The group's byte offset and the chunk's place in it (version-2 segments).
    fn group(self) -> (usize, usize) {
        ((self.offset() >> 8) as usize * GROUP_ALIGN as usize, (self.offset() & 0xff) as usize)
    }
}

pub fn segment_name(segment: u32) -> String {
    format!("{segment:06}")
}

fn header(version: u8) -> [u8; HEADER_BYTES] {
    super::file_header(MAGIC, version)
}

/// A group read once: where each of its chunks starts and ends (one lookup per chunk), and,
/// for a compressed group, its decompressed bytes. A group stored as it is keeps no bytes: its
/// chunks are read in place from the mapped segment, and caching it only spares the next read
/// the CRC over the whole group and the walk to the chunk.
#[derive(Debug)]
pub struct Group {
    /// Decompressed chunks (`len uvarint | chunk` …); empty for a group read in place.
    bytes: Vec<u8>,
    starts: Vec<u32>,
    in_place: bool,
}

impl Group {
    /// A decompressed group's bytes (`len uvarint | chunk` …), split into its chunks.
    fn decompressed(raw: Vec<u8>) -> Result<Group, String> {
        Ok(Group { starts: Group::starts(&raw)?, bytes: raw, in_place: false })
    }

    /// Decompressed bytes that are not chunks (an index's series pages, `index::frames`): kept
    /// whole, in the same cache and budget as chunk groups.
    pub(crate) fn whole(raw: Vec<u8>) -> Group {
        Group { bytes: raw, starts: Vec::new(), in_place: false }
    }

    /// The bytes of a group made by `whole`.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// A group stored as it is (`raw`: its bytes in the mapped segment), split into its chunks.
    fn in_place(raw: &[u8]) -> Result<Group, String> {
        Ok(Group { starts: Group::starts(raw)?, bytes: Vec::new(), in_place: true })
    }

    /// Each chunk's start and end in group bytes `raw`.
    fn starts(raw: &[u8]) -> Result<Vec<u32>, String> {
        let mut starts = Vec::with_capacity(64);
        let mut d = Decoder::new(raw);
        while d.offset() < raw.len() {
            let i = starts.len() / 2;
            let len = d.uvarint("chunk length").map_err(|e| format!("chunk {i} of the group: {e}"))? as usize;
            let start = d.offset();
            d.bytes(len, "chunk").map_err(|e| format!("chunk {i} of the group: {e}"))?;
            starts.push(start as u32);
            starts.push((start + len) as u32);
        }
        Ok(starts)
    }

    fn len(&self) -> usize {
        self.starts.len() / 2
    }

    /// The `index`th chunk's byte range.
    fn range(&self, index: usize) -> Option<(usize, usize)> {
        let s = self.starts.get(2 * index..2 * index + 2)?;
        Some((s[0] as usize, s[1] as usize))
    }

    fn heap_bytes(&self) -> usize {
        self.bytes.len() + self.starts.len() * 4 + std::mem::size_of::<Group>()
    }
}

/// A chunk's bytes: in the mapped file (version 1, or a group stored uncompressed), or in a
/// decompressed group.
#[derive(Clone, Debug)]
pub enum ChunkBytes<'a> {
    Mapped(&'a [u8]),
    InGroup { group: Arc<Group>, start: usize, end: usize },
}

impl Deref for ChunkBytes<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            ChunkBytes::Mapped(b) => b,
            ChunkBytes::InGroup { group, start, end } => &group.bytes[*start..*end],
        }
    }
}

impl AsRef<[u8]> for ChunkBytes<'_> {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

/// The writer's zstd context, kept across groups, and the level it is set to.
struct GroupCompressor {
    zstd: zstd::bulk::Compressor<'static>,
    level: i32,
}

thread_local! {
    /// One zstd decompression context per reading thread: creating one costs more than
    /// decompressing a small group (it was 7% of a long-range read's time).
    static GROUP_DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// A compressed group's `raw_len` bytes, `None` if they do not decompress.
pub(crate) fn decompress_group(compressed: &[u8], raw_len: usize) -> Option<Vec<u8>> {
    GROUP_DECOMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = zstd::bulk::Decompressor::new().ok();
        }
        slot.as_mut()?.decompress(compressed, raw_len).ok()
    })
}

impl std::fmt::Debug for GroupCompressor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GroupCompressor")
    }
}

/// Appends chunks to `dir/chunks/NNNNNN` in groups, cutting a new segment past
/// `SEGMENT_BYTES_MAX`.
#[derive(Debug)]
pub struct ChunkWriter {
    fs: Arc<dyn Vfs>,
    dir: PathBuf,
    segment: u32,
    file: Option<BufWriter<AppendWriter>>,
    /// Bytes written to the open segment.
    offset: u64,
    bytes_total: u64,
    /// The open group: where it will start, its chunks (each `len uvarint | chunk`), how many.
    group_at: u64,
    group: Vec<u8>,
    group_chunks: usize,
    compressor: Option<GroupCompressor>,
    /// A group is stored compressed only when zstd takes at least this percentage off it (0:
    /// any saving of more than 4 bytes).
    min_saving_percent: usize,
    scratch: Vec<u8>,
}

impl ChunkWriter {
    /// Creates `block_dir/chunks/`.
    pub fn create(fs: &Arc<dyn Vfs>, block_dir: &Path) -> Result<Self> {
        let dir = block_dir.join(CHUNKS_DIR);
        create_dir_all(&**fs, &dir)?;
        Ok(ChunkWriter {
            fs: fs.clone(),
            dir,
            segment: 0,
            file: None,
            offset: 0,
            bytes_total: 0,
            group_at: 0,
            group: Vec::with_capacity(GROUP_RAW_BYTES + 4096),
            group_chunks: 0,
            compressor: None,
            min_saving_percent: 0,
            scratch: Vec::new(),
        })
    }

    /// Stores a group compressed only when zstd takes at least `percent` % off it: for blocks
    /// read far more often than their bytes cost (a rollup tier's), where a group that
    /// compresses little would be decompressed on every read for a few percent of disk.
    pub fn compress_only_saving(&mut self, percent: usize) {
        assert!(percent < 100);
        self.min_saving_percent = percent;
    }

    /// Adds one chunk (its encoding byte first) to the open group and returns where it will be.
    pub fn write(&mut self, chunk: &[u8]) -> Result<ChunkRef> {
        if self.group_chunks == 0 {
            let at = self.offset.next_multiple_of(GROUP_ALIGN);
            if self.file.is_none() || at >= SEGMENT_BYTES_MAX {
                self.cut()?;
            }
            self.group_at = self.offset.next_multiple_of(GROUP_ALIGN);
        }
        let r = ChunkRef::in_group(self.segment, self.group_at, self.group_chunks);
        put_uvarint(&mut self.group, chunk.len() as u64);
        self.group.extend_from_slice(chunk);
        self.group_chunks += 1;
        if self.group.len() >= GROUP_RAW_BYTES || self.group_chunks >= GROUP_CHUNKS_MAX {
            self.flush_group()?;
        }
        Ok(r)
    }

    /// Writes the open group: padding to its offset, `len uvarint | kind u8 | [raw len uvarint]
    /// | payload | crc32c u32`, compressed when that is smaller.
    fn flush_group(&mut self) -> Result<()> {
        if self.group_chunks == 0 {
            return Ok(());
        }
        let level = if self.group.len() <= SMALL_CHUNK_BYTES * self.group_chunks {
            GROUP_ZSTD_LEVEL_SMALL_CHUNKS
        } else {
            GROUP_ZSTD_LEVEL
        };
        let compressor = match &mut self.compressor {
            Some(c) => c,
            None => self.compressor.insert(GroupCompressor {
                zstd: zstd::bulk::Compressor::new(level).map_err(io_err("start zstd for", &self.dir))?,
                level,
            }),
        };
        if compressor.level != level {
            compressor.zstd.set_compression_level(level).map_err(io_err("set the zstd level for", &self.dir))?;
            compressor.level = level;
        }
        let compressed =
            compressor.zstd.compress(&self.group).map_err(io_err("compress a chunk group of", &self.dir))?;
        let mut body = std::mem::take(&mut self.scratch);
        body.clear();
        let saved = self.group.len().saturating_sub(compressed.len());
        if saved > 4 && saved * 100 >= self.group.len() * self.min_saving_percent {
            body.push(GROUP_ZSTD);
            put_uvarint(&mut body, self.group.len() as u64);
            body.extend_from_slice(&compressed);
        } else {
            body.push(GROUP_RAW);
            body.extend_from_slice(&self.group);
        }
        let mut head = [0u8; GROUP_ALIGN as usize + 10];
        let pad = (self.group_at - self.offset) as usize;
        let mut len = Vec::with_capacity(10);
        put_uvarint(&mut len, body.len() as u64);
        head[pad..pad + len.len()].copy_from_slice(&len);
        let path = self.path();
        let f = self.file.as_mut().expect("a segment is open");
        f.write_all(&head[..pad + len.len()])
            .and_then(|_| f.write_all(&body))
            .and_then(|_| f.write_all(&crc32c::crc32c(&body).to_be_bytes()))
            .map_err(io_err("write chunks to", path))?;
        let written = (pad + len.len() + body.len() + 4) as u64;
        self.offset += written;
        self.bytes_total += written;
        self.scratch = body;
        self.group.clear();
        self.group_chunks = 0;
        Ok(())
    }

    fn path(&self) -> PathBuf {
        self.dir.join(segment_name(self.segment))
    }

    fn close_segment(&mut self) -> Result<()> {
        if let Some(f) = self.file.take() {
            let path = self.path();
            let f = f.into_inner().map_err(|e| io_err("flush", &path)(e.into_error()))?;
            f.0.sync_data().map_err(io_err("fsync", &path))?;
        }
        Ok(())
    }

    fn cut(&mut self) -> Result<()> {
        self.close_segment()?;
        self.segment += 1;
        let path = self.path();
        let f = self.fs.create(&path).map_err(io_err("create", &path))?;
        let mut f = BufWriter::with_capacity(1 << 20, AppendWriter(f));
        f.write_all(&header(VERSION)).map_err(io_err("write header of", &path))?;
        self.file = Some(f);
        self.offset = HEADER_BYTES as u64;
        self.bytes_total += HEADER_BYTES as u64;
        Ok(())
    }

    /// Writes the open group, flushes and fsyncs every segment and the directory; returns the
    /// bytes written.
    pub fn finish(mut self) -> Result<u64> {
        self.flush_group()?;
        self.close_segment()?;
        fsync_dir(&*self.fs, &self.dir)?;
        Ok(self.bytes_total)
    }
}

/// Decompressed chunk groups, shared by every block's reader and bounded in bytes: the oldest
/// group inserted goes first (a query reads groups in file order, so recency and insertion
/// order mostly agree, and a FIFO needs no bookkeeping on a hit).
#[derive(Debug)]
pub struct GroupCache {
    groups: Mutex<Fifo<(u64, u32, u32), Arc<Group>>>,
    budget: AtomicUsize,
    hits: AtomicU64,
    misses: AtomicU64,
}

/// Default byte budget of the group cache. Reads go through a block in label order, so within
/// one query each group is decompressed once whatever the budget; across queries, a budget
/// below what a dashboard query reads has it decompress everything again each time (the
/// cache is a FIFO). A day of 500 instances' 24-bucket histograms is 24 MB of groups: at the
/// former 16 MiB, `histogram_quantile(0.99, sum by (le, handler) (rate(…[9m])))` over it spent
/// 9% of its CPU time in zstd. At 64 MiB it took 193 ms of CPU against 224 (111 against
/// 121-137 ms wall), and over four of that bench's queries run 24 times each the cache missed
/// on 1,617 reads against 79,591; the other three queries did not move. (An older measurement on the small churn bench, `CACHE_BYTES=… cargo bench -p
/// strata-tsdb --bench tsdb_bench -- churn`, had block reads 1.65 ms at 16 MiB and 1.87 ms at
/// 64 MiB: a working set that fits either way.)
pub const GROUP_CACHE_BYTES_DEFAULT: usize = 64 << 20;

impl GroupCache {
    /// The process-wide cache.
    pub fn global() -> &'static GroupCache {
        static CACHE: std::sync::OnceLock<GroupCache> = std::sync::OnceLock::new();
        CACHE.get_or_init(|| GroupCache {
            groups: Mutex::new(Fifo::default()),
            budget: AtomicUsize::new(GROUP_CACHE_BYTES_DEFAULT),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        })
    }

    /// Sets the byte budget (0 keeps nothing); groups past it are dropped at the next insert.
    pub fn set_budget(&self, bytes: usize) {
        self.budget.store(bytes, Ordering::Relaxed);
    }

    /// `(bytes held, groups held, hits, misses)`, for `/metrics`.
    pub fn stats(&self) -> (usize, usize, u64, u64) {
        let groups = self.groups.lock();
        (groups.bytes(), groups.len(), self.hits.load(Ordering::Relaxed), self.misses.load(Ordering::Relaxed))
    }

    /// The cached group, counted as a hit when found (a miss is counted where a group is read
    /// from its segment).
    pub(crate) fn get(&self, key: (u64, u32, u32)) -> Option<Arc<Group>> {
        let found = self.groups.lock().get(&key).cloned();
        if found.is_some() {
            self.hits.fetch_add(1, Ordering::Relaxed);
        }
        found
    }

    /// Caches `group` (read from its file: counted as a miss).
    pub(crate) fn insert_missed(&self, key: (u64, u32, u32), group: Arc<Group>) {
        self.misses.fetch_add(1, Ordering::Relaxed);
        self.insert(key, group);
    }

    fn insert(&self, key: (u64, u32, u32), group: Arc<Group>) {
        let budget = self.budget.load(Ordering::Relaxed);
        self.groups.lock().insert(key, group, budget, |g| g.heap_bytes());
    }
}

/// Gives each opened reader its own key space in the group cache.
static NEXT_READER_ID: AtomicU64 = AtomicU64::new(1);

/// A key space of the group cache for a new reader (of chunks or of an index's frames).
pub(crate) fn next_reader_id() -> u64 {
    NEXT_READER_ID.fetch_add(1, Ordering::Relaxed)
}

/// Reads chunks from the memory-mapped segments of one block.
#[derive(Debug)]
pub struct ChunkReader {
    dir: PathBuf,
    /// Segment `n` is at index `n - 1`, with its version.
    segments: Vec<(Bytes, u8)>,
    /// Set by the first failed read, so the owning block is set aside.
    failed: AtomicBool,
    /// This reader's key in the group cache.
    id: u64,
}

impl ChunkReader {
    /// Maps every segment and checks its header. Pages are read only when a chunk is. A
    /// failing disk is an `Error::Io` (the block may read fine later); a missing segment or a
    /// bad header is `Error::BlockCorrupt`.
    pub fn open(fs: &dyn Vfs, block_dir: &Path) -> Result<Self> {
        let dir = block_dir.join(CHUNKS_DIR);
        let corrupt = |reason: String| Error::BlockCorrupt { block: block_dir.to_owned(), reason };
        let mut names: Vec<u32> = Vec::new();
        match fs.list(&dir) {
            Ok(entries) => {
                names.extend(entries.iter().filter(|e| !e.is_dir).filter_map(|e| e.name.parse::<u32>().ok()))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(corrupt(format!("{} is missing", dir.display())))
            }
            Err(e) => return Err(io_err("list", &dir)(e)),
        }
        names.sort_unstable();
        let mut segments = Vec::with_capacity(names.len());
        for (i, n) in names.into_iter().enumerate() {
            if n as usize != i + 1 {
                return Err(corrupt(format!(
                    "{}: chunk segment {} is missing",
                    dir.display(),
                    segment_name(i as u32 + 1)
                )));
            }
            let path = dir.join(segment_name(n));
            segments.push(fs.map(&path).map_err(io_err("map", &path))?);
        }
        ChunkReader::from_segments(&dir, segments).map_err(corrupt)
    }

    /// A reader over segments already in memory (segment `n` at index `n - 1`) of the chunks
    /// directory `dir` (named in errors): checks their headers.
    pub fn from_segments(dir: &Path, maps: Vec<Bytes>) -> Result<Self, String> {
        let mut segments = Vec::with_capacity(maps.len());
        for (i, map) in maps.into_iter().enumerate() {
            let path = dir.join(segment_name(i as u32 + 1));
            let version = match map.get(..HEADER_BYTES) {
                Some(h) if h == header(1) => 1,
                Some(h) if h == header(2) => 2,
                Some(h) if h[..4] == MAGIC.to_be_bytes() => {
                    return Err(format!("{}: unknown chunk segment version {}", path.display(), h[4]))
                }
                _ => return Err(format!("{}: bad chunk segment header", path.display())),
            };
            segments.push((map, version));
        }
        Ok(ChunkReader { dir: dir.to_owned(), segments, failed: AtomicBool::new(false), id: next_reader_id() })
    }

    /// The chunk at `r`, checked against its CRC32C (its own in a version-1 segment, its
    /// group's in a version-2 one).
    pub fn chunk<'a>(&'a self, r: ChunkRef) -> Result<ChunkBytes<'a>, ChunkError> {
        let corrupt = |at: usize, problem: &str| {
            self.failed.store(true, Ordering::Relaxed);
            ChunkError::Corrupt(format!("{}/{} at byte {at}: {problem}", self.dir.display(), segment_name(r.segment())))
        };
        let seg = (r.segment() as usize).checked_sub(1).and_then(|i| self.segments.get(i));
        let Some((seg, version)) = seg else { return Err(corrupt(r.offset() as usize, "no such segment")) };
        if *version == 1 {
            let start = r.offset() as usize;
            let (data, crc) = entry_at(seg, start).map_err(|e| corrupt(start, &e))?;
            if !checksum_ok(data, crc) {
                return Err(corrupt(start, "checksum mismatch"));
            }
            return Ok(ChunkBytes::Mapped(data));
        }
        let (group_at, index) = r.group();
        let key = (self.id, r.segment(), group_at as u32);
        // A cached group stored as it is is read in place: its CRC was checked when it was cached.
        let in_group = |group: Arc<Group>, body: Option<&'a [u8]>| match (group.range(index), body) {
            (Some((start, end)), Some(body)) if group.in_place && end < body.len() => {
                Ok(ChunkBytes::Mapped(&body[1 + start..1 + end]))
            }
            (Some((start, end)), _) if !group.in_place => Ok(ChunkBytes::InGroup { group, start, end }),
            (Some(_), _) => Err(corrupt(group_at, "group shorter than its cached layout")),
            (None, _) => Err(corrupt(group_at, &format!("no chunk {index} in a group of {}", group.len()))),
        };
        if let Some(group) = GroupCache::global().get(key) {
            let body =
                if group.in_place { Some(entry_at(seg, group_at).map_err(|e| corrupt(group_at, &e))?.0) } else { None };
            return in_group(group, body);
        }
        let (body, crc) = entry_at(seg, group_at).map_err(|e| corrupt(group_at, &e))?;
        if !checksum_ok(body, crc) {
            return Err(corrupt(group_at, "checksum mismatch"));
        }
        let group = match body.split_first() {
            Some((&GROUP_RAW, raw)) => Group::in_place(raw).map_err(|e| corrupt(group_at, &e))?,
            Some((&GROUP_ZSTD, rest)) => {
                let mut d = Decoder::new(rest);
                let raw_len = d.uvarint("group length").map_err(|e| corrupt(group_at, &e.to_string()))? as usize;
                if raw_len > GROUP_RAW_MAX {
                    return Err(corrupt(group_at, &format!("group claims {raw_len} bytes, over {GROUP_RAW_MAX}")));
                }
                let raw = decompress_group(&rest[d.offset()..], raw_len)
                    .filter(|g| g.len() == raw_len)
                    .ok_or_else(|| corrupt(group_at, "group does not decompress"))?;
                Group::decompressed(raw).map_err(|e| corrupt(group_at, &e))?
            }
            Some((kind, _)) => return Err(corrupt(group_at, &format!("unknown group kind {kind}"))),
            None => return Err(corrupt(group_at, "empty group")),
        };
        GroupCache::global().misses.fetch_add(1, Ordering::Relaxed);
        let group = Arc::new(group);
        GroupCache::global().insert(key, group.clone());
        in_group(group, Some(body))
    }

    /// Whether a read failed its checks.
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    /// Bytes of all segments (for `analyze` and size-based retention).
    pub fn bytes(&self) -> u64 {
        self.segments.iter().map(|(m, _)| m.len() as u64).sum()
    }
}

/// The `len uvarint | body | crc u32` entry at `start` of a segment: body and CRC bytes.
fn entry_at(seg: &[u8], start: usize) -> Result<(&[u8], &[u8]), String> {
    if start < HEADER_BYTES || start >= seg.len() {
        return Err("offset outside the segment".into());
    }
    let mut d = Decoder::new(&seg[start..]);
    let len = d.uvarint("length").map_err(|e| e.to_string())? as usize;
    let body = d.bytes(len, "entry").map_err(|e| e.to_string())?;
    let crc = d.bytes(4, "checksum").map_err(|e| e.to_string())?;
    Ok((body, crc))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_chunks(dir: &Path, chunks: &[Vec<u8>]) -> (Vec<ChunkRef>, u64) {
        let fs = crate::vfs::OsFs::shared();
        let mut w = ChunkWriter::create(&fs, dir).unwrap();
        let refs = chunks.iter().map(|c| w.write(c).unwrap()).collect();
        (refs, w.finish().unwrap())
    }

    /// Chunks that look like a block's: similar headers and bodies, so groups compress.
    fn sample_chunks(n: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| {
                let mut c = vec![5, 0, 240];
                c.extend((0..(20 + i % 90)).map(|j| ((i * 7 + j * 13) % 251) as u8 & 0x3f));
                c
            })
            .collect()
    }

    #[test]
    fn chunks_round_trip_through_compressed_groups() {
        let tmp = tempfile::tempdir().unwrap();
        let chunks = sample_chunks(3000);
        let (refs, bytes) = write_chunks(tmp.path(), &chunks);
        let raw: usize = chunks.iter().map(Vec::len).sum();
        assert!((bytes as usize) < raw, "groups compress: {bytes} bytes for {raw}");
        assert!(refs.windows(2).all(|p| p[0] < p[1]), "refs go forward");
        assert_eq!(refs[0], ChunkRef::in_group(1, 32, 0));
        let r = ChunkReader::open(&*crate::vfs::OsFs::shared(), tmp.path()).unwrap();
        // Read out of order too: every group decompresses on its own.
        for i in (0..chunks.len()).rev().step_by(7).chain(0..chunks.len()) {
            assert_eq!(&*r.chunk(refs[i]).unwrap(), &chunks[i][..], "chunk {i}");
        }
        assert!(r.chunk(ChunkRef::in_group(1, 32, 254)).is_err(), "no such chunk in the group");
        assert!(r.chunk(ChunkRef::new(2, 8)).is_err());
    }

    /// Groups of small chunks and of large ones, one after the other, so the writer's level
    /// changes back and forth: each group's zstd frame is the one its level writes (level 6
    /// for small chunks, 3 for large ones, whose frames differ here), and every chunk reads
    /// back.
    #[test]
    fn groups_of_small_and_of_large_chunks_round_trip() {
        let tmp = tempfile::tempdir().unwrap();
        let chunk = |i: usize, len: usize| {
            let mut c = vec![5, 0, 10];
            c.extend((0..len).map(|j| ((i * 7 + j * 13) % 251) as u8 & 0x3f));
            c
        };
        let chunks: Vec<Vec<u8>> = (0..2000)
            .map(|i| match i {
                0..600 | 1000..1600 => chunk(i, 20 + i % 9),
                _ => chunk(i, 150 + i % 50),
            })
            .collect();
        let (refs, bytes) = write_chunks(tmp.path(), &chunks);
        let raw: usize = chunks.iter().map(Vec::len).sum();
        assert!((bytes as usize) < raw / 2, "groups compress: {bytes} bytes for {raw}");
        let r = ChunkReader::open(&*crate::vfs::OsFs::shared(), tmp.path()).unwrap();
        for (i, c) in chunks.iter().enumerate() {
            assert_eq!(&*r.chunk(refs[i]).unwrap(), &c[..], "chunk {i}");
        }
        // Each group's frame, against its chunks compressed at the level for their size.
        let file = std::fs::read(tmp.path().join("chunks/000001")).unwrap();
        let mut levels = Vec::new();
        let mut first = 0;
        while first < chunks.len() {
            let group = refs[first].offset() >> 8;
            let members: Vec<&Vec<u8>> =
                (first..chunks.len()).take_while(|&i| refs[i].offset() >> 8 == group).map(|i| &chunks[i]).collect();
            let mut raw_group = Vec::new();
            for c in &members {
                crate::encoding::put_uvarint(&mut raw_group, c.len() as u64);
                raw_group.extend_from_slice(c);
            }
            let small = raw_group.len() <= SMALL_CHUNK_BYTES * members.len();
            let level = if small { GROUP_ZSTD_LEVEL_SMALL_CHUNKS } else { GROUP_ZSTD_LEVEL };
            let want = zstd::bulk::compress(&raw_group, level).unwrap();
            let other = if small { GROUP_ZSTD_LEVEL } else { GROUP_ZSTD_LEVEL_SMALL_CHUNKS };
            assert_ne!(want, zstd::bulk::compress(&raw_group, other).unwrap(), "the levels write other frames");
            // `len uvarint | kind | raw len uvarint | frame | crc`.
            let mut d = crate::encoding::Decoder::new(&file[group as usize * GROUP_ALIGN as usize..]);
            let len = d.uvarint("len").unwrap() as usize;
            let body = d.bytes(len, "body").unwrap();
            let mut b = crate::encoding::Decoder::new(&body[1..]);
            assert_eq!((body[0], b.uvarint("raw len").unwrap() as usize), (GROUP_ZSTD, raw_group.len()));
            assert!(b.bytes(want.len(), "frame").unwrap() == &want[..] && b.is_empty(), "group at {group}");
            levels.push(level);
            first += members.len();
        }
        assert!(levels.windows(2).filter(|w| w[0] != w[1]).count() >= 3, "the level changes: {levels:?}");
    }

    #[test]
    fn incompressible_groups_are_stored_as_they_are() {
        let tmp = tempfile::tempdir().unwrap();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let chunks: Vec<Vec<u8>> = (0..100)
            .map(|_| {
                (0..300)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x as u8
                    })
                    .collect()
            })
            .collect();
        let (refs, _) = write_chunks(tmp.path(), &chunks);
        let data = std::fs::read(tmp.path().join("chunks/000001")).unwrap();
        let (body, _) = entry_at(&data, 32).unwrap();
        assert_eq!(body[0], GROUP_RAW);
        let r = ChunkReader::open(&*crate::vfs::OsFs::shared(), tmp.path()).unwrap();
        for (c, rf) in chunks.iter().zip(&refs) {
            assert!(matches!(r.chunk(*rf).unwrap(), ChunkBytes::Mapped(b) if b == &c[..]));
        }
    }

    #[test]
    fn groups_saving_less_than_asked_are_stored_as_they_are_and_read_in_place_again() {
        let chunks = sample_chunks(3000);
        let write = |percent: usize| {
            let tmp = tempfile::tempdir().unwrap();
            let fs = crate::vfs::OsFs::shared();
            let mut w = ChunkWriter::create(&fs, tmp.path()).unwrap();
            w.compress_only_saving(percent);
            let refs: Vec<ChunkRef> = chunks.iter().map(|c| w.write(c).unwrap()).collect();
            let bytes = w.finish().unwrap();
            (tmp, refs, bytes)
        };
        let (_, _, compressed) = write(0);
        let raw: usize = chunks.iter().map(|c| c.len() + 1).sum();
        let saving = 100 - compressed as usize * 100 / raw;
        assert!(saving > 5, "the sample chunks compress ({compressed} bytes of {raw})");
        // Asking for more than zstd saves leaves every group as it is; asking for less, as
        // compressed as with no minimum.
        let (tmp, refs, bytes) = write(saving + 5);
        assert!(bytes as usize > raw, "{bytes} bytes for {raw} raw");
        assert_eq!(write(saving.saturating_sub(5)).2, compressed);
        let data = std::fs::read(tmp.path().join("chunks/000001")).unwrap();
        assert_eq!(entry_at(&data, 32).unwrap().0[0], GROUP_RAW);
        // The first pass caches each group's layout; the second reads through it, in place.
        let r = ChunkReader::open(&*crate::vfs::OsFs::shared(), tmp.path()).unwrap();
        for _ in 0..2 {
            for i in (0..chunks.len()).rev().step_by(3).chain(0..chunks.len()) {
                let c = r.chunk(refs[i]).unwrap();
                assert!(matches!(c, ChunkBytes::Mapped(b) if b == &chunks[i][..]), "chunk {i}");
            }
        }
        assert!(GroupCache::global().get((r.id, 1, 32)).is_some_and(|g| g.in_place && g.bytes.is_empty()));
    }

    #[test]
    fn a_damaged_group_is_named_and_its_neighbours_still_read() {
        let tmp = tempfile::tempdir().unwrap();
        let chunks = sample_chunks(1000);
        let (refs, _) = write_chunks(tmp.path(), &chunks);
        let path = tmp.path().join("chunks/000001");
        let mut data = std::fs::read(&path).unwrap();
        data[40] ^= 0x10;
        std::fs::write(&path, data).unwrap();
        let r = ChunkReader::open(&*crate::vfs::OsFs::shared(), tmp.path()).unwrap();
        let err = r.chunk(refs[0]).unwrap_err().to_string();
        assert!(err.contains("chunks/000001 at byte 32: checksum mismatch"), "{err}");
        assert!(r.failed());
        let last = chunks.len() - 1;
        assert_eq!(&*r.chunk(refs[last]).unwrap(), &chunks[last][..], "other groups read");
    }

    #[test]
    fn version_1_segments_are_still_read() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("chunks")).unwrap();
        // Two entries as version 1 wrote them: `len | chunk | crc`, refs at their entries.
        let mut data = header(1).to_vec();
        let mut refs = Vec::new();
        for c in [&[1u8, 0, 1, 0xaa][..], &[1, 0, 2, 0xbb, 0xcc]] {
            refs.push(ChunkRef::new(1, data.len() as u32));
            data.push(c.len() as u8);
            data.extend_from_slice(c);
            data.extend_from_slice(&crc32c::crc32c(c).to_be_bytes());
        }
        assert_eq!(refs, [ChunkRef::new(1, 8), ChunkRef::new(1, 8 + 1 + 4 + 4)]);
        let path = tmp.path().join("chunks/000001");
        std::fs::write(&path, &data).unwrap();
        let r = ChunkReader::open(&*crate::vfs::OsFs::shared(), tmp.path()).unwrap();
        assert_eq!(&*r.chunk(refs[0]).unwrap(), &[1, 0, 1, 0xaa]);
        assert_eq!(&*r.chunk(refs[1]).unwrap(), &[1, 0, 2, 0xbb, 0xcc]);
        assert!(r.chunk(ChunkRef::new(1, 1000)).is_err());
        drop(r);

        data[8 + 1 + 3] ^= 0x10;
        std::fs::write(&path, &data).unwrap();
        let r = ChunkReader::open(&*crate::vfs::OsFs::shared(), tmp.path()).unwrap();
        let err = r.chunk(refs[0]).unwrap_err().to_string();
        assert!(err.contains("chunks/000001 at byte 8: checksum mismatch"), "{err}");
        assert!(r.chunk(refs[1]).is_ok());

        data[4] = 9;
        std::fs::write(&path, &data).unwrap();
        let err = ChunkReader::open(&*crate::vfs::OsFs::shared(), tmp.path()).unwrap_err().to_string();
        assert!(err.contains("unknown chunk segment version 9"), "{err}");
    }

    #[test]
    fn the_group_cache_stays_within_its_budget() {
        let cache = GroupCache {
            groups: Mutex::new(Fifo::default()),
            budget: AtomicUsize::new(10_000),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        };
        for i in 0..100u32 {
            cache.insert((1, 1, i), Arc::new(Group { bytes: vec![0u8; 1000], starts: Vec::new(), in_place: false }));
            assert!(cache.stats().0 <= 10_000);
        }
        assert!(cache.get((1, 1, 99)).is_some());
        assert!(cache.get((1, 1, 0)).is_none(), "the oldest went first");
        cache.set_budget(0);
        cache.insert((1, 2, 0), Arc::new(Group { bytes: vec![0u8; 10], starts: Vec::new(), in_place: false }));
        assert!(cache.get((1, 2, 0)).is_none(), "nothing is kept past the budget");
    }
}

#[cfg(test)]
mod doc_example {
    use super::*;

    /// The worked example of `docs/format/block.md`, byte for byte.
    #[test]
    fn segment_bytes_match_the_format_document() {
        let tmp = tempfile::tempdir().unwrap();
        let fs = crate::vfs::OsFs::shared();
        let mut w = ChunkWriter::create(&fs, tmp.path()).unwrap();
        let a = w.write(&[1, 0, 1, 0xaa]).unwrap();
        let b = w.write(&[1, 0, 2, 0xbb, 0xcc]).unwrap();
        w.finish().unwrap();
        assert_eq!((a.0, b.0), (0x1_0000_0100, 0x1_0000_0101));
        let data: Vec<String> =
            std::fs::read(tmp.path().join("chunks/000001")).unwrap().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(data, crate::block::tests::doc_example_hex("block.md", "chunks-example"));
    }
}
