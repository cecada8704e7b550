//! `meta.json`: what a block holds, readable by people and tools.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::rollup::Closed;

use crate::error::{io_err, Error, Result};
use crate::vfs::Vfs;

pub const META_FILE: &str = "meta.json";
pub const META_VERSION: u32 = 1;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BlockMeta {
    pub ulid: String,
    /// First millisecond the block covers (inclusive).
    pub min_time: i64,
    /// End of the block's range (exclusive), as in Prometheus.
    pub max_time: i64,
    pub stats: BlockStats,
    pub compaction: Compaction,
    pub version: u32,
    /// Write sequence: a block holding later writes has a higher one (a block cut from the
    /// head: one more than any block's at the time; a compacted block: its inputs' highest).
    /// Where blocks overlap, the sample of the higher sequence wins at a timestamp, so a late
    /// rewrite of a point replaces the older value. 0 in blocks written before it existed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub seq: u64,
    /// Set in the blocks of a rollup tier (under `rollups/<interval>/`): their chunks hold
    /// buckets of this interval (`chunkenc::rollup`), not samples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollup: Option<RollupMeta>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RollupMeta {
    /// The buckets' interval in milliseconds.
    pub interval_ms: i64,
    /// Which end of its interval a bucket includes; absent: right (PromQL's windows).
    #[serde(default, skip_serializing_if = "Closed::is_right")]
    pub closed: Closed,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BlockStats {
    pub num_samples: u64,
    pub num_series: u64,
    pub num_chunks: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Compaction {
    /// 1 for a block cut from the head, one more than the highest input's for a compacted block.
    pub level: u32,
    /// ULIDs of the level-1 blocks whose data this block holds.
    pub sources: Vec<String>,
    /// ULIDs of the blocks this one replaced; on open, any of them still present is removed
    /// (a crash happened between writing this block and deleting its inputs).
    #[serde(default)]
    pub parents: Vec<String>,
}

impl BlockMeta {
    /// Reads `dir/meta.json`: `Error::Io` if the disk fails, `Error::BlockCorrupt` if the
    /// file is missing or wrong.
    pub fn read(fs: &dyn Vfs, dir: &Path) -> Result<BlockMeta> {
        let path = dir.join(META_FILE);
        let corrupt = |reason: String| Error::BlockCorrupt { block: dir.to_owned(), reason };
        let data = match fs.read(&path) {
            Ok(data) => data,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(corrupt(format!("{} is missing", path.display())))
            }
            Err(e) => return Err(io_err("read", &path)(e)),
        };
        BlockMeta::parse(&path, &data).map_err(corrupt)
    }

    /// Checks and decodes the bytes of `path`, a `meta.json`.
    pub fn parse(path: &Path, data: &[u8]) -> Result<BlockMeta, String> {
        let mut meta: BlockMeta = serde_json::from_slice(data).map_err(|e| format!("{}: {e}", path.display()))?;
        // Sorted, so that "are these sources all in that block's" is a binary search.
        meta.compaction.sources.sort_unstable();
        meta.compaction.sources.dedup();
        if meta.version != META_VERSION {
            return Err(format!("{}: unsupported block version {}", path.display(), meta.version));
        }
        if meta.rollup.is_some_and(|r| r.interval_ms <= 0) {
            return Err(format!("{}: rollup interval is not positive", path.display()));
        }
        if meta.min_time >= meta.max_time {
            return Err(format!("{}: empty time range {}..{}", path.display(), meta.min_time, meta.max_time));
        }
        Ok(meta)
    }

    /// Writes and fsyncs `dir/meta.json` (inside a block directory not yet renamed into place).
    pub fn write(&self, fs: &dyn Vfs, dir: &Path) -> Result<()> {
        let path = dir.join(META_FILE);
        let mut data = serde_json::to_vec_pretty(self).expect("meta serializes");
        data.push(b'\n');
        fs.write_synced(&path, &data).map_err(io_err("write", &path))
    }
}
