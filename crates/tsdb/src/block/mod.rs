//! Persisted blocks: immutable directories, each covering a time range, read through mmap.
//!
//! ```text
//! <ulid>/
//! ├── chunks/000001   chunks back to back (block::chunks)
//! ├── index           symbols, series, postings (block::index)
//! ├── tombstones      deleted ranges (block::tombstones)
//! ├── names           metric names and their path nodes as tries (block::names)
//! └── meta.json       range, stats, compaction lineage (block::meta)
//! ```
//!
//! A block is opened lazily: `Block::open` reads only `meta.json` and `tombstones`; the index
//! and chunk files are mapped the first time a query reaches the block's time range, so opening
//! a data directory with hundreds of blocks reads a few KiB per block.

pub mod chunks;
mod fifo;
pub mod index;
pub mod meta;
pub mod names;
pub mod series_cache;
pub mod tombstones;
pub mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::RwLock;
use strata_model::{Matcher, SeriesRef};

pub use chunks::{ChunkBytes, ChunkReader, ChunkRef, GroupCache};
pub use index::{ChunkMetaRef, IndexFile, IndexSections, MmapPostings, ReadCache};
pub use meta::{BlockMeta, BlockStats, Compaction, RollupMeta};
pub use series_cache::SeriesCache;
pub use tombstones::Tombstones;
pub use writer::{BlockWriter, ChunkInput};

use crate::error::{Error, Result};
use crate::index::matchers::{postings_for_matchers, IndexReader};
use crate::index::name_dict::{NameDict, NamePattern};
use crate::index::postings::{self, merge, BoxPostings, EmptyPostings};
use crate::vfs::{OsFs, Vfs};

/// The 8-byte header of every block file: magic, version, three zero bytes.
/// Whether `crc` is the CRC32C of `body`, for the index's sections and the chunk files' entries
/// and groups. Under the fuzzer (`cfg(fuzzing)`, set by cargo-fuzz) everything passes: a mutated
/// byte would otherwise fail its checksum and never reach the decoding behind it, which is what
/// the `block_index` and `chunk_segment` targets are there to explore.
pub(crate) fn checksum_ok(body: &[u8], crc: &[u8]) -> bool {
    cfg!(fuzzing) || crc32c::crc32c(body).to_be_bytes() == crc
}

pub(crate) fn file_header(magic: u32, version: u8) -> [u8; 8] {
    let mut h = [0u8; 8];
    h[..4].copy_from_slice(&magic.to_be_bytes());
    h[4] = version;
    h
}

/// The mapped files of an open block.
#[derive(Debug)]
pub struct BlockData {
    pub index: IndexFile,
    pub chunks: Arc<ChunkReader>,
    /// The `names` file; `None` for blocks written before it existed.
    pub names: Option<NameDict>,
}

#[derive(Debug)]
pub struct Block {
    fs: Arc<dyn Vfs>,
    dir: PathBuf,
    meta: BlockMeta,
    /// Set by the first load that did not fail on I/O: the mapped files, or why their bytes
    /// are wrong. An I/O error leaves it unset, so a later read tries again.
    data: OnceLock<Result<BlockData, String>>,
    tombstones: RwLock<Arc<Tombstones>>,
    bytes: u64,
    /// Set when a read found corruption: the database then sets the block aside.
    corrupt: AtomicBool,
}

impl Block {
    /// `open_on` the real disk, with any error as text (for tools).
    pub fn open(dir: &Path) -> Result<Block, String> {
        Block::open_on(&OsFs::shared(), dir).map_err(|e| e.to_string())
    }

    /// Reads `meta.json` and `tombstones`; the rest waits for the first query. A failing disk
    /// is an `Error::Io` (try again later); files that are missing or fail their checks are
    /// `Error::BlockCorrupt` (set the block aside).
    pub fn open_on(fs: &Arc<dyn Vfs>, dir: &Path) -> Result<Block> {
        let meta = BlockMeta::read(&**fs, dir)?;
        let stones = tombstones::read(&**fs, dir)?;
        Ok(Block::from_parts(fs, dir, meta, stones))
    }

    /// A block just written by this process, from its writer's `meta` (and no tombstones):
    /// nothing is read.
    pub fn written(fs: &Arc<dyn Vfs>, dir: &Path, meta: BlockMeta) -> Block {
        Block::from_parts(fs, dir, meta, Tombstones::new())
    }

    fn from_parts(fs: &Arc<dyn Vfs>, dir: &Path, meta: BlockMeta, stones: Tombstones) -> Block {
        Block {
            fs: fs.clone(),
            dir: dir.to_owned(),
            meta,
            data: OnceLock::new(),
            tombstones: RwLock::new(Arc::new(stones)),
            bytes: dir_bytes_on(&**fs, dir),
            corrupt: AtomicBool::new(false),
        }
    }

    pub fn fs(&self) -> &Arc<dyn Vfs> {
        &self.fs
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn meta(&self) -> &BlockMeta {
        &self.meta
    }

    pub fn ulid(&self) -> &str {
        &self.meta.ulid
    }

    /// Bytes on disk (all files), measured at open.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether the block holds any time in `[mint, maxt]` (inclusive).
    pub fn overlaps(&self, mint: i64, maxt: i64) -> bool {
        self.meta.min_time <= maxt && mint < self.meta.max_time
    }

    /// Maps the index and chunks (once). Bytes that fail their checks are a corruption
    /// (`Error::BlockCorrupt`, remembered); a failing disk is an `Error::Io`, and the next call
    /// tries again.
    pub fn data(&self) -> Result<&BlockData> {
        if self.data.get().is_none() {
            let loaded = IndexFile::open(&*self.fs, &self.dir.join(index::INDEX_FILE)).and_then(|index| {
                let chunks = Arc::new(ChunkReader::open(&*self.fs, &self.dir)?);
                let names = names::read(&*self.fs, &self.dir)?;
                Ok(BlockData { index, chunks, names })
            });
            match loaded {
                Ok(d) => {
                    let _ = self.data.set(Ok(d));
                }
                Err(Error::BlockCorrupt { reason, .. }) => {
                    let _ = self.data.set(Err(reason));
                }
                Err(e) => return Err(e),
            }
        }
        let d = self.data.get().expect("set above");
        d.as_ref().map_err(|reason| self.corrupt(reason.clone()))
    }

    pub fn corrupt(&self, reason: String) -> Error {
        Error::BlockCorrupt { block: self.dir.clone(), reason }
    }

    /// Whether the index and chunks have been mapped (by a query or compaction reaching the block).
    pub fn is_loaded(&self) -> bool {
        self.data.get().is_some()
    }

    /// Whether any read of this block failed its checks.
    pub fn is_corrupt(&self) -> bool {
        self.corrupt.load(Ordering::Relaxed)
            || matches!(self.data.get(), Some(Err(_)))
            || matches!(self.data.get(), Some(Ok(d)) if d.chunks.failed())
    }

    /// Marks the block corrupt if `e` says a read of it failed its checks; any other error (a
    /// query's series limit, its deadline) says nothing about the block.
    pub fn mark_corrupt_if(&self, e: &Error) {
        if matches!(e, Error::BlockCorrupt { .. }) {
            self.mark_corrupt();
        }
    }

    pub fn mark_corrupt(&self) {
        if !self.corrupt.swap(true, Ordering::Relaxed) {
            tracing::error!(block = %self.dir.display(), "block failed a checksum or bounds check; it will be set aside");
        }
    }

    pub fn tombstones(&self) -> Arc<Tombstones> {
        self.tombstones.read().clone()
    }

    /// Series ids matching `matchers`, ascending (= label order).
    pub fn select_ids(&self, matchers: &[Matcher]) -> Result<Vec<SeriesRef>> {
        self.select_ids_in(matchers, None)
    }

    /// `select_ids`, and with `range` (`[mint, maxt]`) only series that may have chunks in
    /// it, by their time bounds (where the index keeps them: versions 5 and 6; otherwise
    /// every matching series): the bounds are intersected with the matchers' postings, so
    /// that the series of a churned block that stopped long before the range (most of what
    /// the matchers select) are jumped over in runs rather than read one by one.
    pub fn select_ids_in(&self, matchers: &[Matcher], range: Option<(i64, i64)>) -> Result<Vec<SeriesRef>> {
        let data = self.data()?;
        let q = BlockIndexQuery { ix: &data.index, names: data.names.as_ref(), err: Default::default() };
        let mut selected = postings_for_matchers(&q, matchers);
        if let Some(overlapping) = range.and_then(|(mint, maxt)| data.index.overlap_postings(mint, maxt)) {
            // Last: the matchers' postings lead, the bounds are only sought in.
            selected = postings::intersect(vec![selected, Box::new(overlapping)]);
        }
        let ids = postings::expand(selected);
        match q.err.into_inner() {
            Some(e) => Err(self.corrupt(e)),
            None => Ok(ids),
        }
    }

    /// Records deleted ranges of the series matching `matchers`; returns how many series.
    pub fn delete(&self, matchers: &[Matcher], mint: i64, maxt: i64) -> Result<usize> {
        if !self.overlaps(mint, maxt) {
            return Ok(0);
        }
        let ids = self.select_ids(matchers)?;
        if ids.is_empty() {
            return Ok(0);
        }
        let mut guard = self.tombstones.write();
        let mut stones = (**guard).clone();
        for id in &ids {
            stones.entry(id.0).or_default().push((mint.max(self.meta.min_time), maxt.min(self.meta.max_time - 1)));
        }
        tombstones::write(&*self.fs, &self.dir, &stones)?;
        *guard = Arc::new(stones);
        Ok(ids.len())
    }
}

/// Total size of the files under `dir` (0 for what cannot be listed).
pub fn dir_bytes(dir: &Path) -> u64 {
    dir_bytes_on(&OsFs, dir)
}

fn dir_bytes_on(fs: &dyn Vfs, dir: &Path) -> u64 {
    let Ok(entries) = fs.list(dir) else { return 0 };
    entries
        .iter()
        .map(|e| {
            let path = dir.join(&e.name);
            if e.is_dir {
                dir_bytes_on(fs, &path)
            } else {
                fs.file_len(&path).unwrap_or(0)
            }
        })
        .sum()
}

/// Adapts a block's index to `postings_for_matchers`, remembering the first corruption seen
/// (the trait's methods cannot fail; the caller checks afterwards).
struct BlockIndexQuery<'a> {
    ix: &'a IndexFile,
    names: Option<&'a NameDict>,
    err: std::cell::RefCell<Option<String>>,
}

impl BlockIndexQuery<'_> {
    fn note(&self, e: String) -> BoxPostings {
        self.err.borrow_mut().get_or_insert(e);
        Box::new(EmptyPostings)
    }
}

impl IndexReader for BlockIndexQuery<'_> {
    fn postings(&self, name: &str, values: &[&str]) -> BoxPostings {
        let mut sorted = values.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        match self.ix.postings_of_values(name, &sorted) {
            Ok(lists) => merge(lists.into_iter().map(|p| Box::new(p) as BoxPostings).collect()),
            Err(e) => self.note(e),
        }
    }

    fn postings_matching(&self, name: &str, prefix: &str, accept: &dyn Fn(&str) -> bool) -> BoxPostings {
        match self.ix.postings_matching(name, prefix, accept) {
            Ok(v) => merge(v.into_iter().map(|p| Box::new(p) as BoxPostings).collect()),
            Err(e) => self.note(e),
        }
    }

    fn all_postings(&self) -> BoxPostings {
        match self.ix.all_postings() {
            Ok(p) => Box::new(p),
            Err(e) => self.note(e),
        }
    }

    fn search_names(&self, pattern: &NamePattern, visit: &mut dyn FnMut(&[u8], u8) -> bool) -> bool {
        match self.names {
            Some(d) => {
                d.search(pattern, visit);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
