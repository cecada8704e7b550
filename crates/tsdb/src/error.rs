//! Errors of the storage engine. Each carries what a human needs to act: the file, the segment
//! and offset, what was expected.

use std::io;
use std::path::PathBuf;

use crate::record::RecordError;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("data directory {path} is in use by another process (lock file {lock} is held)")]
    Locked { path: PathBuf, lock: PathBuf },
    #[error("write-ahead log {dir}: segments are not contiguous: {before} is followed by {after}")]
    WalSegmentGap { dir: PathBuf, before: u64, after: u64 },
    #[error("write-ahead log checkpoint {path} is corrupt at byte {offset}: {reason}")]
    CheckpointCorrupt { path: PathBuf, offset: u64, reason: String },
    #[error("write-ahead log segment {path}: record at byte {offset}: {source}")]
    WalRecord {
        path: PathBuf,
        offset: u64,
        #[source]
        source: RecordError,
    },
    #[error("write-ahead log segment {path} has a bad header: {reason}")]
    WalHeader { path: PathBuf, reason: String },
    #[error("write-ahead log failed earlier and accepts no more writes: {0}")]
    WalFailed(String),
    #[error("the query selects more than {limit} series")]
    TooManySeries { limit: usize },
    /// Chunk references past the reader's limit: the samples they hold would not fit the
    /// query's budget either (every chunk in range holds at least one sample in range, but
    /// the two at a series' edges).
    #[error("the query selects more than {limit} chunks of samples")]
    TooManyChunks { limit: usize },
    /// The reader's interrupt (a deadline, a client gone) stopped a selection.
    #[error("series selection stopped: {0}")]
    Stopped(Stop),
    #[error("block {block} is corrupt: {reason}")]
    BlockCorrupt { block: PathBuf, reason: String },
    /// A block was written and renamed to its name, but the rename could not be made durable
    /// (the directory's fsync failed) nor undone: it is whole on disk, under its name, and may
    /// or may not be there after a crash. The caller lists it (so deletions reach it) and keeps
    /// the data it was written from.
    #[error("block {} was written but its name could not be made durable: {source}", meta.ulid)]
    BlockNotDurable {
        meta: Box<crate::block::BlockMeta>,
        #[source]
        source: Box<Error>,
    },
    #[error("write-ahead log record of {bytes} bytes exceeds the limit of {limit} bytes")]
    RecordTooLarge { bytes: usize, limit: u32 },
    /// A read asked for a rollup tier that is not configured.
    #[error("no rollup tier of interval {} ms ({:?}-closed) is configured", .tier.interval_ms, .tier.closed)]
    NoSuchTier { tier: crate::block::RollupMeta },
}

/// Why a reader stopped a selection (see `Querier::interrupt`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    Timeout,
    Canceled,
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stop::Timeout => "the query's deadline passed",
            Stop::Canceled => "the query was canceled",
        })
    }
}

/// Builds the `map_err` closure for an I/O operation on `path`.
pub(crate) fn io_err(op: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> Error {
    let path = path.into();
    move |source| Error::Io { op, path, source }
}
