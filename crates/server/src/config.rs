//! Storage settings shared by every command that opens a data directory.

use std::path::PathBuf;
use std::time::Duration;

use strata_tsdb::db::RETENTION_DEFAULT_MS;
use strata_tsdb::head::{HeadOptions, OutOfOrder};
use strata_tsdb::wal::{FsyncPolicy, WalOptions, FSYNC_INTERVAL_DEFAULT, SEGMENT_BYTES_DEFAULT};
use strata_tsdb::DbOptions;

/// Where the data lives unless told otherwise: `./data`, like Prometheus.
pub const DATA_DIR_DEFAULT: &str = "./data";

/// How the WAL is fsynced, as named on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WalFsync {
    /// Every `FSYNC_INTERVAL_DEFAULT` and at every segment roll.
    Interval,
    /// Before each commit is acknowledged (group commit).
    Always,
}

impl std::str::FromStr for WalFsync {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "interval" => Ok(WalFsync::Interval),
            "always" => Ok(WalFsync::Always),
            other => Err(format!("unknown WAL fsync policy {other:?}: expected \"interval\" or \"always\"")),
        }
    }
}

#[derive(Clone, Debug)]
pub struct StorageConfig {
    pub data_dir: PathBuf,
    pub wal_fsync: WalFsync,
    pub wal_fsync_interval: Duration,
    pub wal_segment_bytes: u64,
    /// WAL records compressed with zstd where it pays.
    pub wal_compression: bool,
    /// Bytes of decompressed block chunk groups kept for queries (`GroupCache`).
    pub chunk_cache_bytes: u64,
    /// Bytes of block series entries kept for queries (`SeriesCache`).
    pub series_cache_bytes: u64,
    /// Blocks entirely older than this behind the newest sample are deleted (0: never).
    pub retention_ms: i64,
    /// Oldest blocks are deleted while blocks and WAL exceed this (0: no limit).
    pub retention_bytes: u64,
    /// How far behind the newest sample a late sample may be for remote write, scrapes and
    /// imports (Prometheus' `out_of_order_time_window`); 0, the default as in Prometheus,
    /// refuses late samples. Carbon has its own (`CarbonConfig::window`).
    pub out_of_order_window_ms: i64,
    /// How far behind the newest sample other writers may write (carbon's out-of-order
    /// window, when carbon listens): rollup tiers merge blocks only of raw data late writes
    /// cannot reach (`DbOptions::late_window_ms`).
    pub late_window_ms: i64,
    /// Rollup tiers, finest first (`--storage.rollup-tiers`); none by default.
    pub rollup_tiers: Vec<strata_tsdb::rollup::RollupTier>,
    /// Which series each tier keeps (`http::graphite_rollup_filter`); `None`: every one.
    pub rollup_filter: Option<strata_tsdb::rollup::SeriesFilter>,
    /// Exemplars kept in memory (and the WAL), Prometheus' `storage.exemplars.max_exemplars`;
    /// 0 keeps none.
    pub max_exemplars: usize,
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            data_dir: PathBuf::from(DATA_DIR_DEFAULT),
            wal_fsync: WalFsync::Interval,
            wal_fsync_interval: FSYNC_INTERVAL_DEFAULT,
            wal_segment_bytes: SEGMENT_BYTES_DEFAULT,
            wal_compression: true,
            chunk_cache_bytes: strata_tsdb::block::chunks::GROUP_CACHE_BYTES_DEFAULT as u64,
            series_cache_bytes: strata_tsdb::block::series_cache::SERIES_CACHE_BYTES_DEFAULT as u64,
            retention_ms: RETENTION_DEFAULT_MS,
            retention_bytes: 0,
            out_of_order_window_ms: 0,
            late_window_ms: 0,
            rollup_tiers: Vec::new(),
            rollup_filter: None,
            max_exemplars: strata_tsdb::head::exemplars::MAX_EXEMPLARS_DEFAULT,
        }
    }
}

impl StorageConfig {
    /// Opens the database with these options, and sizes the process' chunk group and series
    /// caches.
    pub fn open_db(&self) -> strata_tsdb::Result<strata_tsdb::Db> {
        strata_tsdb::block::GroupCache::global()
            .set_budget(usize::try_from(self.chunk_cache_bytes).unwrap_or(usize::MAX));
        strata_tsdb::block::SeriesCache::global()
            .set_budget(usize::try_from(self.series_cache_bytes).unwrap_or(usize::MAX));
        strata_tsdb::Db::open(&self.data_dir, self.db_options())
    }

    pub fn db_options(&self) -> DbOptions {
        let fsync = match self.wal_fsync {
            WalFsync::Interval => FsyncPolicy::Interval(self.wal_fsync_interval),
            WalFsync::Always => FsyncPolicy::Always,
        };
        DbOptions {
            head: HeadOptions {
                wal: WalOptions {
                    fsync,
                    segment_bytes: self.wal_segment_bytes,
                    compression: self.wal_compression,
                    progress: Some(crate::status::wal_replay_progress()),
                },
                out_of_order: OutOfOrder { window_ms: self.out_of_order_window_ms, replace: false },
                max_exemplars: self.max_exemplars,
                ..Default::default()
            },
            retention_ms: self.retention_ms,
            retention_bytes: self.retention_bytes,
            rollups: self.rollup_tiers.clone(),
            rollup_filter: self.rollup_filter.clone(),
            late_window_ms: self.late_window_ms,
            ..Default::default()
        }
    }
}

/// The left-closed rollup tiers Graphite's retention schemas need, for `/render` to read their
/// coarse archives (`Schemas::coarse_archives`) from tiers rather than raw samples; with notes
/// for the log on what had to give. Tiers follow the rules of `rollup::check_tiers` beside
/// raw data kept `raw_retention_ms` (0: forever): an archive whose step is not a multiple of
/// the previous tier's gets no tier (its values come from raw samples while they last, or
/// approximately from a coarser tier), and a tier is kept at least a step longer than the raw
/// data and the finer tier, so it may outlive its archives a little (reads stop at a path's
/// own retention). Tiers beyond `rollup::TIERS_MAX - others` are left out, with a note.
pub fn graphite_rollup_tiers(
    schemas: &strata_graphite::schema::Schemas,
    raw_retention_ms: i64,
    others: usize,
) -> (Vec<strata_tsdb::rollup::RollupTier>, Vec<String>) {
    use strata_tsdb::rollup::{RollupTier, INTERVAL_MIN_MS, TIERS_MAX};
    let (mut tiers, mut notes): (Vec<RollupTier>, Vec<String>) = (Vec::new(), Vec::new());
    // The finest archive is the raw data: it ends where raw retention does.
    for (section, finest) in schemas.finest_archives() {
        let keep_ms = finest.retention_s().saturating_mul(1000);
        if raw_retention_ms > 0 && keep_ms > raw_retention_ms {
            notes.push(format!(
                "[{section}] keeps its finest archive ({}s) {} but raw data is kept {} (--retention): \
                 its points older than that are gone; raise --retention to keep them",
                finest.step_s,
                strata_model::format_duration_ms(keep_ms),
                strata_model::format_duration_ms(raw_retention_ms)
            ));
        }
    }
    for archive in schemas.coarse_archives() {
        let interval_ms = archive.step_s.saturating_mul(1000);
        let name = format!("{}s", archive.step_s);
        if interval_ms < INTERVAL_MIN_MS {
            continue;
        }
        if let Some(finer) = tiers.last() {
            if interval_ms % finer.interval_ms != 0 {
                notes.push(format!(
                    "archives of {name} get no rollup tier: not a multiple of the {}s tier's interval",
                    finer.interval_ms / 1000
                ));
                continue;
            }
        }
        if tiers.len() + others >= TIERS_MAX {
            notes.push(format!("archives of {name} get no rollup tier: at most {TIERS_MAX} tiers"));
            continue;
        }
        let retention_ms = if raw_retention_ms == 0 {
            0
        } else {
            let floor = tiers.last().map_or(raw_retention_ms, |t| t.retention_ms).saturating_add(interval_ms);
            archive.retention_s().saturating_mul(1000).max(floor)
        };
        tiers.push(RollupTier::left(interval_ms, retention_ms));
    }
    (tiers, notes)
}

/// Parses a size like Prometheus' `--storage.tsdb.retention.size`: a number and a unit among
/// B, KB, MB, GB, TB, PB, EB (powers of 1024), e.g. `512MB`.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let bad = || format!("invalid size {s:?}: expected a number and a unit (B, KB, MB, GB, TB, PB, EB), e.g. 512MB");
    let split = s.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().map_err(|_| bad())?;
    let shift = match unit {
        "B" => 0,
        "KB" => 10,
        "MB" => 20,
        "GB" => 30,
        "TB" => 40,
        "PB" => 50,
        "EB" => 60,
        _ => return Err(bad()),
    };
    n.checked_mul(1u64 << shift).ok_or_else(|| format!("size {s:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fsync_policy_parses_and_names_bad_input() {
        assert_eq!("always".parse::<WalFsync>(), Ok(WalFsync::Always));
        let e = "sometimes".parse::<WalFsync>().unwrap_err();
        assert!(e.contains("sometimes") && e.contains("interval"), "{e}");
        let c = StorageConfig { wal_fsync: WalFsync::Always, ..Default::default() };
        assert_eq!(c.db_options().head.wal.fsync, FsyncPolicy::Always);
    }

    #[test]
    fn sizes_parse_like_prometheus() {
        assert_eq!(parse_bytes("512MB"), Ok(512 << 20));
        assert_eq!(parse_bytes("1GB"), Ok(1 << 30));
        assert_eq!(parse_bytes("10B"), Ok(10));
        for bad in ["", "MB", "10", "10mb", "1.5GB", "-1GB"] {
            assert!(parse_bytes(bad).is_err(), "{bad:?}");
        }
        assert!(parse_bytes("99999999999EB").is_err());
    }

    #[test]
    fn retention_schemas_get_left_closed_tiers_that_follow_the_tier_rules() {
        use strata_graphite::schema::Schemas;
        use strata_tsdb::rollup::{check_tiers, RollupTier};
        const DAY_MS: i64 = 86_400_000;
        let schemas = Schemas::parse(
            "[collectd]\npattern = ^collectd\\.\nretentions = 10s:1d,1m:7d,10m:5y\n\
             [odd]\npattern = ^odd\\.\nretentions = 10s:1d,90s:30d\n\
             [default]\npattern = .*\nretentions = 60s:14d,1h:2y\n",
            None,
        )
        .unwrap();
        let (tiers, notes) = graphite_rollup_tiers(&schemas, 15 * DAY_MS, 0);
        // 1m kept past the raw data's 15 days; 90s is no multiple of 1m: no tier, said so.
        assert_eq!(
            tiers,
            [
                RollupTier::left(60_000, 15 * DAY_MS + 60_000),
                RollupTier::left(600_000, 5 * 365 * DAY_MS),
                RollupTier::left(3_600_000, 5 * 365 * DAY_MS + 3_600_000),
            ]
        );
        assert!(notes.iter().any(|n| n.contains("90s") && n.contains("multiple")), "{notes:?}");
        assert!(!notes.iter().any(|n| n.contains("finest archive")), "{notes:?}");
        // A finest archive kept longer than raw data is said to end with it.
        let (_, notes) = graphite_rollup_tiers(&schemas, DAY_MS / 2, 0);
        assert!(notes.iter().any(|n| n.contains("[collectd]") && n.contains("finest archive")), "{notes:?}");
        check_tiers(&tiers, 15 * DAY_MS).unwrap();
        // Raw data kept forever: so are the tiers.
        let (forever, _) = graphite_rollup_tiers(&schemas, 0, 0);
        assert!(forever.iter().all(|t| t.retention_ms == 0));
        check_tiers(&forever, 0).unwrap();
        // No more tiers than allowed beside the configured ones.
        let (few, notes) = graphite_rollup_tiers(&schemas, 15 * DAY_MS, strata_tsdb::rollup::TIERS_MAX - 1);
        assert_eq!(few.len(), 1);
        assert!(notes.iter().any(|n| n.contains("at most")), "{notes:?}");
        assert_eq!(graphite_rollup_tiers(&Schemas::default(), 15 * DAY_MS, 0).0, []);
    }
}
