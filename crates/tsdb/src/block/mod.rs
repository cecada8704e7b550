//! Persisted blocks: immutable directories, each covering a time range, read through mmap.
//!
//! ```text
//! <ulid>/
//! ├── chunks/000001   chunks back to back (block::chunks)
//! ├── index           symbols, series, postings (block::index)
//! ├── tombstones      deleted ranges (block::tombstones)
//! └── meta.json       range, stats, compaction lineage (block::meta)
//! ```
//!
//! A block is opened lazily: `Block::open` reads only `meta.json` and `tombstones`; the index
//! and chunk files are mapped the first time a query reaches the block's time range, so opening
//! a data directory with hundreds of blocks reads a few KiB per block.

pub mod chunks;
pub mod index;
pub mod meta;
pub mod tombstones;
pub mod writer;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::RwLock;
use strata_model::{Matcher, SeriesRef};

pub use chunks::{ChunkReader, ChunkRef};
pub use index::{ChunkMetaRef, IndexFile, MmapPostings, SymbolInterner};
pub use meta::{BlockMeta, BlockStats, Compaction};
pub use tombstones::Tombstones;
pub use writer::{BlockWriter, ChunkInput};

use crate::error::{Error, Result};
use crate::index::matchers::{postings_for_matchers, IndexReader};
use crate::index::postings::{self, merge, BoxPostings, EmptyPostings};

/// The 8-byte header of every block file: magic, version, three zero bytes.
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
}

#[derive(Debug)]
pub struct Block {
    dir: PathBuf,
    meta: BlockMeta,
    data: OnceLock<Result<BlockData, String>>,
    tombstones: RwLock<Arc<Tombstones>>,
    bytes: u64,
    /// Set when a read found corruption: the database then sets the block aside.
    corrupt: AtomicBool,
}

impl Block {
    /// Reads `meta.json` and `tombstones`; the rest waits for the first query.
    pub fn open(dir: &Path) -> Result<Block, String> {
        let meta = BlockMeta::read(dir)?;
        let stones = tombstones::read(dir)?;
        Ok(Block {
            dir: dir.to_owned(),
            meta,
            data: OnceLock::new(),
            tombstones: RwLock::new(Arc::new(stones)),
            bytes: dir_bytes(dir),
            corrupt: AtomicBool::new(false),
        })
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

    /// Maps the index and chunks (once); an error names the file and is a corruption.
    pub fn data(&self) -> Result<&BlockData> {
        let d = self.data.get_or_init(|| {
            let index = IndexFile::open(&self.dir.join(index::INDEX_FILE))?;
            let chunks = Arc::new(ChunkReader::open(&self.dir)?);
            Ok(BlockData { index, chunks })
        });
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
        let data = self.data()?;
        let q = BlockIndexQuery { ix: &data.index, err: Default::default() };
        let ids = postings::expand(postings_for_matchers(&q, matchers));
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
        tombstones::write(&self.dir, &stones)?;
        *guard = Arc::new(stones);
        Ok(ids.len())
    }
}

/// Total size of the files under `dir`.
pub fn dir_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    for e in entries.flatten() {
        match e.metadata() {
            Ok(m) if m.is_dir() => total += dir_bytes(&e.path()),
            Ok(m) => total += m.len(),
            Err(_) => {}
        }
    }
    total
}

/// Adapts a block's index to `postings_for_matchers`, remembering the first corruption seen
/// (the trait's methods cannot fail; the caller checks afterwards).
struct BlockIndexQuery<'a> {
    ix: &'a IndexFile,
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
        let mut lists: Vec<BoxPostings> = Vec::new();
        for v in values {
            match self.ix.postings(name, v) {
                Ok(Some(p)) => lists.push(Box::new(p)),
                Ok(None) => {}
                Err(e) => return self.note(e),
            }
        }
        merge(lists)
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
}

#[cfg(test)]
mod tests;
