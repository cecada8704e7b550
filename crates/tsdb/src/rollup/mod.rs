//! Rollup tiers: each series' samples aggregated per interval (count, sum, min, max, first,
//! last, counter increase, changes, resets), so that long ranges are read from a few buckets
//! instead of every sample. See `docs/rollups.md` for the design and `docs/format/rollup.md`
//! for the bytes.

pub mod bucket;
pub mod buffers;
pub mod columns;
pub mod tier;
pub mod write;

pub use bucket::{
    aggregate, aggregate_closed, append_runs, bucket_end, coalesce, merge_runs, Aggregator, ArchiveRule, ArchiveValue,
    Bucket, Closed,
};
pub use columns::BucketColumns;
pub use tier::{check_tiers, parse_tiers, RollupTier, SeriesFilter, INTERVAL_MIN_MS, TIERS_MAX};
