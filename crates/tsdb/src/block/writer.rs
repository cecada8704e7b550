//! Writes one block: into `<ulid>.tmp`, every file fsynced, then renamed into place, so a crash
//! at any point leaves either no block or the whole block.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use strata_model::{Labels, METRIC_NAME};
use ulid::Ulid;

use super::chunks::ChunkWriter;
use super::index::{ChunkMetaRef, IndexWriter, INDEX_FILE};
use super::meta::{BlockMeta, BlockStats, Compaction, RollupMeta, META_VERSION};
use super::tombstones;
use crate::chunkenc;
use crate::error::{io_err, Error, Result};
use crate::fsutil::{create_dir_all, fsync_dir};
use crate::index::name_dict::{NameDelta, NameDict};
use crate::vfs::Vfs;

/// Suffix of a block directory being written; removed on open if a crash left one behind.
pub const TMP_SUFFIX: &str = ".tmp";

/// A chunk to write: its time range (inclusive) and its bytes (encoding byte first).
#[derive(Clone, Copy, Debug)]
pub struct ChunkInput<'a> {
    pub mint: i64,
    pub maxt: i64,
    pub data: &'a [u8],
    /// For compaction, where a series' input chunks overlap: the sample of the higher rank is
    /// kept at a timestamp (`querier::QueryChunk::rank`). Not written.
    pub rank: u64,
}

#[derive(Debug)]
pub struct BlockWriter {
    fs: Arc<dyn Vfs>,
    parent: PathBuf,
    ulid: Ulid,
    tmp: PathBuf,
    chunks: ChunkWriter,
    index: IndexWriter,
    stats: BlockStats,
    metas: Vec<ChunkMetaRef>,
    /// Distinct `__name__` values, for the `names` file (series come in label order, so a
    /// name's series mostly follow each other; the rest is deduplicated at the end).
    names: NameDelta,
    /// Set for a rollup tier's block (`BlockMeta::rollup`).
    rollup: Option<RollupMeta>,
    /// Keep the block even with no series (a rollup tier's record that a raw block was rolled up).
    keep_empty: bool,
}

/// A rollup tier's chunk groups are compressed only when zstd takes a quarter off them. Tier
/// blocks are what long-range dashboards read again and again, and their columns are dense
/// already: zstd took 11% off the hourly tier of `graphite_rollup_compare`'s data and 15% off
/// the 10-minute one, while decompressing cost 18% of a 30-day render's CPU (the tier being
/// larger than the group cache, every render decompressed all of it).
pub const ROLLUP_GROUP_MIN_SAVING_PERCENT: usize = 25;

impl BlockWriter {
    /// Starts a block in `parent/<new ulid>.tmp`. `symbols`: sorted, unique, every label string
    /// of the series to come.
    pub fn create(fs: &Arc<dyn Vfs>, parent: &Path, symbols: &[Arc<str>]) -> Result<Self> {
        let ulid = Ulid::new();
        let tmp = parent.join(format!("{ulid}{TMP_SUFFIX}"));
        create_dir_all(&**fs, &tmp)?;
        let remove_tmp = |e| {
            let _ = fs.remove_dir_all(&tmp);
            e
        };
        let chunks = ChunkWriter::create(fs, &tmp).map_err(remove_tmp)?;
        let index = IndexWriter::create(&**fs, &tmp.join(INDEX_FILE), symbols).map_err(remove_tmp)?;
        Ok(BlockWriter {
            fs: fs.clone(),
            parent: parent.to_owned(),
            ulid,
            tmp,
            chunks,
            index,
            stats: BlockStats::default(),
            metas: Vec::new(),
            names: NameDelta::default(),
            rollup: None,
            keep_empty: false,
        })
    }

    /// Marks the block as one of a rollup tier: its chunks hold buckets.
    pub fn set_rollup(&mut self, rollup: RollupMeta) {
        assert!(rollup.interval_ms > 0);
        self.rollup = Some(rollup);
        self.chunks.compress_only_saving(ROLLUP_GROUP_MIN_SAVING_PERCENT);
    }

    /// Keeps the block even if no series is added: a rollup tier's block records that a raw
    /// block was rolled up, whether or not any of its series had a float sample.
    pub fn keep_if_empty(&mut self) {
        self.keep_empty = true;
    }

    /// Adds a series (in label order) with its chunks (in time order, not empty).
    pub fn add_series(&mut self, labels: &Labels, chunks: &[ChunkInput<'_>]) -> Result<()> {
        debug_assert!(!chunks.is_empty());
        self.metas.clear();
        for c in chunks {
            let r = self.chunks.write(c.data)?;
            self.metas.push(ChunkMetaRef { mint: c.mint, maxt: c.maxt, chunk: r });
            self.stats.num_samples += chunkenc::num_samples(c.data).unwrap_or(0) as u64;
        }
        self.stats.num_chunks += chunks.len() as u64;
        self.stats.num_series += 1;
        if let Some(name) = labels.get(METRIC_NAME) {
            if self.names.last() != Some(name.as_bytes()) {
                self.names.add(name);
            }
        }
        self.index.add_series(labels, &self.metas)
    }

    pub fn num_series(&self) -> u64 {
        self.stats.num_series
    }

    /// Finishes the block covering `[min_time, max_time)` and renames it into place. A block with
    /// no series is not kept (unless `keep_if_empty`): returns `None`. On error nothing is left under the block's name
    /// nor, as far as the disk lets us remove it, in its temporary directory: the caller keeps
    /// the data (in the head, in the input blocks) and tries again later.
    /// `seq` is the block's place in write order (`BlockMeta::seq`).
    pub fn finish(
        self,
        min_time: i64,
        max_time: i64,
        mut compaction: Compaction,
        seq: u64,
    ) -> Result<Option<BlockMeta>> {
        if compaction.sources.is_empty() {
            compaction.sources.push(self.ulid.to_string());
        }
        let (fs, tmp, parent, ulid) = (self.fs, self.tmp, self.parent, self.ulid);
        if self.stats.num_series == 0 && !self.keep_empty {
            drop((self.chunks, self.index));
            fs.remove_dir_all(&tmp).map_err(io_err("remove", &tmp))?;
            return Ok(None);
        }
        let meta = BlockMeta {
            ulid: ulid.to_string(),
            min_time,
            max_time,
            stats: self.stats,
            compaction,
            version: META_VERSION,
            seq,
            rollup: self.rollup,
        };
        let (chunks, index, names) = (self.chunks, self.index, self.names);
        let written = (|| {
            chunks.finish()?;
            index.finish()?;
            let dict = NameDict::union(&[], &names);
            drop(names);
            super::names::write(&*fs, &tmp, &dict)?;
            tombstones::write(&*fs, &tmp, &tombstones::Tombstones::new())?;
            meta.write(&*fs, &tmp)?;
            fsync_dir(&*fs, &tmp)
        })();
        if let Err(e) = written {
            let _ = fs.remove_dir_all(&tmp);
            return Err(e);
        }
        let to = parent.join(ulid.to_string());
        fs.rename(&tmp, &to).map_err(|e| {
            let _ = fs.remove_dir_all(&tmp);
            io_err("rename to", &to)(e)
        })?;
        if let Err(e) = fsync_dir(&*fs, &parent) {
            // The rename may or may not survive a crash. The caller will write this data again,
            // so take the name back (rename back, then remove: never a half-removed block under
            // its name) rather than leave an unlisted block behind. If a crash keeps it anyway,
            // it is a whole block (every file was fsynced) whose samples queries and compaction
            // deduplicate. If even the rename back fails, the caller must list it.
            if fs.rename(&to, &tmp).is_ok() {
                let _ = fs.remove_dir_all(&tmp);
                return Err(e);
            }
            tracing::error!(block = %to.display(), error = %e, "a block whose rename could not be made durable could not be taken back either; it stays listed");
            return Err(Error::BlockNotDurable { meta: Box::new(meta), source: Box::new(e) });
        }
        Ok(Some(meta))
    }

    /// Abandons the block, removing its temporary directory.
    pub fn abort(self) {
        let (fs, tmp) = (self.fs.clone(), self.tmp.clone());
        drop(self);
        let _ = fs.remove_dir_all(&tmp);
    }
}
