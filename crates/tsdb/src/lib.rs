//! Strata's storage engine.
//!
//! The module layout mirrors the data directory: `chunkenc` is the chunk byte format, `wal` the
//! `wal/` segments and checkpoints, `record` the records inside them, `head` the in-memory
//! newest block, `index::postings` the sorted postings lists and their merge operations,
//! `querier` the read path. See `docs/design.md` for invariants and the crash model.

pub mod block;
pub mod changes;
pub mod chunkenc;
pub mod compact;
pub mod encoding;
pub mod error;
pub mod fsutil;
pub mod index;
pub mod record;
pub mod rollup;
pub mod vfs;
pub mod wal;

pub use error::{Error, Result};
pub mod db;
pub mod hash;
pub mod head;
mod prefetch;
pub mod querier;
pub mod workers;

pub use db::{CompactOutcome, Db, DbOptions, DbStats};
