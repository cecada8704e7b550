//! Storage settings shared by every command that opens a data directory.

use std::path::PathBuf;
use std::time::Duration;

use strata_tsdb::head::HeadOptions;
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
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            data_dir: PathBuf::from(DATA_DIR_DEFAULT),
            wal_fsync: WalFsync::Interval,
            wal_fsync_interval: FSYNC_INTERVAL_DEFAULT,
            wal_segment_bytes: SEGMENT_BYTES_DEFAULT,
        }
    }
}

impl StorageConfig {
    pub fn db_options(&self) -> DbOptions {
        let fsync = match self.wal_fsync {
            WalFsync::Interval => FsyncPolicy::Interval(self.wal_fsync_interval),
            WalFsync::Always => FsyncPolicy::Always,
        };
        DbOptions {
            head: HeadOptions {
                wal: WalOptions { fsync, segment_bytes: self.wal_segment_bytes },
                ..Default::default()
            },
        }
    }
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
}
