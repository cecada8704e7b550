//! The database: one data directory, one process. Today it holds the head and its WAL; blocks,
//! compaction and retention join in the next milestone.
//!
//! ```text
//! data/
//! ├── lock        held (flock) by the process that has the directory open
//! └── wal/        segments and checkpoints of the head
//! ```

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::error::{io_err, Error, Result};
use crate::fsutil::create_dir_all;
use crate::head::{Appender, Cardinality, Head, HeadOptions};
use crate::querier::Querier;
use crate::wal::{self, ReplayOutcome};

pub const LOCK_FILE: &str = "lock";
pub const WAL_DIR: &str = "wal";

#[derive(Clone, Copy, Debug, Default)]
pub struct DbOptions {
    pub head: HeadOptions,
}

/// An open data directory.
#[derive(Debug)]
pub struct Db {
    dir: PathBuf,
    head: Head,
    replay: ReplayOutcome,
    /// Held for the lifetime of the `Db`; the kernel releases it if the process dies.
    _lock: File,
}

/// What `strata status` prints.
#[derive(Debug, Clone)]
pub struct DbStatus {
    pub dir: PathBuf,
    pub series: u64,
    pub time_range: Option<(i64, i64)>,
    pub wal_segments: Vec<u64>,
    pub wal_bytes: u64,
    pub replay: ReplayOutcome,
    pub cardinality: Cardinality,
}

impl Db {
    /// Opens (creating if needed) the data directory: takes the lock, replays the WAL.
    pub fn open(dir: &Path, opts: DbOptions) -> Result<Db> {
        create_dir_all(dir)?;
        let lock = lock_dir(dir)?;
        let started = std::time::Instant::now();
        let (head, replay) = Head::open(&dir.join(WAL_DIR), opts.head)?;
        tracing::info!(
            dir = %dir.display(), series = head.num_series(), records = replay.records,
            segments = replay.segments_read, elapsed_ms = started.elapsed().as_millis() as u64,
            "replayed write-ahead log"
        );
        Ok(Db { dir: dir.to_owned(), head, replay, _lock: lock })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn head(&self) -> &Head {
        &self.head
    }

    pub fn appender(&self) -> Appender<'_> {
        self.head.appender()
    }

    pub fn querier(&self, mint: i64, maxt: i64) -> Querier<'_> {
        Querier::new(&self.head, mint, maxt)
    }

    pub fn replay_outcome(&self) -> &ReplayOutcome {
        &self.replay
    }

    pub fn status(&self, top: usize) -> Result<DbStatus> {
        let wal_dir = self.dir.join(WAL_DIR);
        let wal_segments = wal::list_segments(&wal_dir)?;
        let mut wal_bytes = 0;
        for &s in &wal_segments {
            let p = wal::segment::segment_path(&wal_dir, s);
            wal_bytes += std::fs::metadata(&p).map_err(io_err("stat", &p))?.len();
        }
        Ok(DbStatus {
            dir: self.dir.clone(),
            series: self.head.num_series(),
            time_range: self.head.time_range(),
            wal_segments,
            wal_bytes,
            replay: self.replay.clone(),
            cardinality: self.head.cardinality(top),
        })
    }

    /// Flushes and fsyncs the WAL; the lock is released when the `Db` is dropped.
    pub fn close(self) -> Result<()> {
        self.head.close()
    }
}

/// Takes an exclusive, non-blocking `flock` on `dir/lock`.
fn lock_dir(dir: &Path) -> Result<File> {
    let path = dir.join(LOCK_FILE);
    let f = OpenOptions::new().create(true).truncate(false).write(true).open(&path).map_err(io_err("open", &path))?;
    // SAFETY: flock on a file descriptor we own; no memory is involved.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(Error::Locked { path: dir.to_owned(), lock: path });
        }
        return Err(io_err("lock", path)(e));
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_open_is_refused_while_the_first_holds_the_lock() {
        let tmp = tempfile::tempdir().unwrap();
        let db = Db::open(tmp.path(), DbOptions::default()).unwrap();
        let err = Db::open(tmp.path(), DbOptions::default()).unwrap_err();
        assert!(matches!(err, Error::Locked { .. }), "{err}");
        assert!(err.to_string().contains("in use by another process"));
        db.close().unwrap();
        Db::open(tmp.path(), DbOptions::default()).unwrap();
    }
}
