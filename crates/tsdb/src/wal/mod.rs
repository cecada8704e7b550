//! The write-ahead log of the head: numbered segment files of CRC-framed records.
//!
//! Why segments: the head only needs the log since its oldest in-memory sample, so the log is
//! cut into files that can be dropped whole once a checkpoint has kept what is still needed
//! (`checkpoint`). Why a frame per record with its own CRC: a crash tears at most the tail, and
//! replay must find the last intact record exactly, keep everything before it and cut the rest
//! (`replay`).
//!
//! Durability: every commit is written to the segment file (one `write` call per commit) before
//! it returns, so a killed process loses nothing it acknowledged. Against power loss the policy
//! decides: `Interval` fsyncs on a timer and at every segment roll; `Always` fsyncs before a
//! commit returns, with group commit so that concurrent committers share one fsync.

mod checkpoint;
mod replay;
pub mod segment;

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

pub use checkpoint::{checkpoint_name, parse_checkpoint_name, CheckpointStats};
pub use replay::{replay, ReplayOutcome};
use segment::{frame_record, segment_header, segment_path, SEGMENT_HEADER_BYTES};

use crate::error::{io_err, Error, Result};
use crate::fsutil::fsync_dir;
use crate::record::RecordError;
use strata_model::SeriesRef;

/// Default segment size. Big enough that rolls (each one an fsync and a new file) are rare, small
/// enough that truncation frees space in useful steps. A segment exceeds it by at most one batch,
/// because a commit's records are written to a single segment.
pub const SEGMENT_BYTES_DEFAULT: u64 = 128 << 20;
/// Default fsync interval of the `Interval` policy: the most a power loss can take.
pub const FSYNC_INTERVAL_DEFAULT: Duration = Duration::from_secs(1);

/// Buffered records are written out once they reach this size even without a commit.
const PENDING_BYTES_MAX: usize = 1 << 20;

/// When the log is fsynced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsyncPolicy {
    /// On a timer and at every segment roll; commits return after `write`.
    Interval(Duration),
    /// Before every commit returns (group commit).
    Always,
}

impl Default for FsyncPolicy {
    fn default() -> Self {
        FsyncPolicy::Interval(FSYNC_INTERVAL_DEFAULT)
    }
}

#[derive(Clone, Copy, Debug)]
pub struct WalOptions {
    pub segment_bytes: u64,
    pub fsync: FsyncPolicy,
}

impl Default for WalOptions {
    fn default() -> Self {
        WalOptions { segment_bytes: SEGMENT_BYTES_DEFAULT, fsync: FsyncPolicy::default() }
    }
}

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct WalStats {
    pub bytes_written: AtomicU64,
    pub records_written: AtomicU64,
    pub fsyncs: AtomicU64,
    pub fsync_nanos_total: AtomicU64,
    pub segments_created: AtomicU64,
}

#[derive(Debug)]
struct Writer {
    file: File,
    /// Index of the segment being written.
    index: u64,
    /// Bytes in the current segment.
    segment_bytes: u64,
    /// Log sequence number: total bytes ever written through this handle. Commits wait for
    /// `synced >= their lsn`.
    lsn: u64,
    /// Set after a failed write: the segment may end in a torn frame, so nothing may follow it.
    failed: Option<String>,
    /// Framed records waiting to go out with the next write (see `Wal::buffer`).
    pending: Vec<u8>,
}

#[derive(Debug, Default)]
struct SyncState {
    synced: u64,
    in_progress: bool,
    failed: Option<String>,
}

/// An open write-ahead log, appending to its newest segment.
#[derive(Debug)]
pub struct Wal {
    dir: PathBuf,
    opts: WalOptions,
    writer: Mutex<Writer>,
    sync: Mutex<SyncState>,
    sync_done: Condvar,
    stop: Arc<(Mutex<bool>, Condvar)>,
    syncer: Mutex<Option<JoinHandle<()>>>,
    pub stats: WalStats,
}

impl Wal {
    /// Replays `dir` (checkpoint, then segments, cutting a torn tail) through `apply`, then starts
    /// a fresh segment for appending. `apply` gets each record body and may fail the open.
    pub fn open(
        dir: &Path,
        opts: WalOptions,
        apply: impl FnMut(&[u8]) -> Result<(), RecordError>,
    ) -> Result<(Arc<Wal>, ReplayOutcome)> {
        assert!(opts.segment_bytes > SEGMENT_HEADER_BYTES, "segment size must exceed the header");
        let outcome = replay(dir, apply)?;
        let index = outcome.next_segment;
        let file = create_segment(dir, index)?;
        let wal = Arc::new(Wal {
            dir: dir.to_owned(),
            opts,
            writer: Mutex::new(Writer {
                file,
                index,
                segment_bytes: SEGMENT_HEADER_BYTES,
                lsn: 0,
                failed: None,
                pending: Vec::new(),
            }),
            sync: Mutex::new(SyncState::default()),
            sync_done: Condvar::new(),
            stop: Arc::new((Mutex::new(false), Condvar::new())),
            syncer: Mutex::new(None),
            stats: WalStats::default(),
        });
        wal.stats.segments_created.fetch_add(1, Ordering::Relaxed);
        if let FsyncPolicy::Interval(every) = opts.fsync {
            let handle = spawn_syncer(Arc::downgrade(&wal), wal.stop.clone(), every);
            *wal.syncer.lock() = Some(handle);
        }
        Ok((wal, outcome))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn options(&self) -> WalOptions {
        self.opts
    }

    /// Index of the segment being written.
    pub fn current_segment(&self) -> u64 {
        self.writer.lock().index
    }

    /// Writes one commit's records and, under `Always`, waits until they are on stable storage.
    pub fn commit(&self, records: &[&[u8]]) -> Result<()> {
        let lsn = self.write(records)?;
        if self.opts.fsync == FsyncPolicy::Always {
            self.sync_to(lsn)?;
        }
        Ok(())
    }

    /// Queues a record to be written ahead of the next commit's records, without a system call.
    /// The head logs each new series this way the moment it creates it: any commit that can use
    /// the series is written after it, so replay always meets a series before its samples.
    pub fn buffer(&self, record: &[u8]) -> Result<()> {
        check_record_size(record)?;
        let mut w = self.writer.lock();
        frame_record(record, &mut w.pending);
        if w.pending.len() >= PENDING_BYTES_MAX {
            self.write_locked(&mut w, Vec::new(), 0)?;
        }
        Ok(())
    }

    /// Frames `records` and writes them, after any buffered records, with one `write` call;
    /// returns the LSN to wait for.
    pub fn write(&self, records: &[&[u8]]) -> Result<u64> {
        for r in records {
            check_record_size(r)?;
        }
        // Frame and checksum outside the lock.
        let mut buf = Vec::with_capacity(records.iter().map(|r| r.len() + 8).sum());
        for r in records {
            frame_record(r, &mut buf);
        }
        let mut w = self.writer.lock();
        self.write_locked(&mut w, buf, records.len())
    }

    fn write_locked(&self, w: &mut Writer, buf: Vec<u8>, records: usize) -> Result<u64> {
        if let Some(f) = &w.failed {
            return Err(Error::WalFailed(f.clone()));
        }
        let buf = if w.pending.is_empty() {
            buf
        } else {
            let mut all = std::mem::take(&mut w.pending);
            all.extend_from_slice(&buf);
            all
        };
        if w.segment_bytes > SEGMENT_HEADER_BYTES && w.segment_bytes + buf.len() as u64 > self.opts.segment_bytes {
            self.roll_locked(w)?;
        }
        if let Err(e) = w.file.write_all(&buf) {
            let path = segment_path(&self.dir, w.index);
            w.failed = Some(format!("write {}: {e}", path.display()));
            return Err(io_err("write", path)(e));
        }
        w.segment_bytes += buf.len() as u64;
        w.lsn += buf.len() as u64;
        self.stats.bytes_written.fetch_add(buf.len() as u64, Ordering::Relaxed);
        self.stats.records_written.fetch_add(records as u64, Ordering::Relaxed);
        Ok(w.lsn)
    }

    /// Starts a new segment (fsyncing the old one) and returns its index.
    pub fn roll(&self) -> Result<u64> {
        let mut w = self.writer.lock();
        if let Some(f) = &w.failed {
            return Err(Error::WalFailed(f.clone()));
        }
        self.roll_locked(&mut w)?;
        Ok(w.index)
    }

    fn roll_locked(&self, w: &mut Writer) -> Result<()> {
        let old = segment_path(&self.dir, w.index);
        let t0 = Instant::now();
        if let Err(e) = w.file.sync_data() {
            w.failed = Some(format!("fsync {}: {e}", old.display()));
            return Err(io_err("fsync", old)(e));
        }
        self.note_fsync(t0);
        let next = w.index + 1;
        w.file = create_segment(&self.dir, next)?;
        w.index = next;
        w.segment_bytes = SEGMENT_HEADER_BYTES;
        self.stats.segments_created.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn note_fsync(&self, started: Instant) {
        self.stats.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.stats.fsync_nanos_total.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// Blocks until everything up to `lsn` is fsynced. One caller becomes the leader and fsyncs
    /// for everyone waiting; the others sleep until it is done (group commit).
    pub fn sync_to(&self, lsn: u64) -> Result<()> {
        let mut st = self.sync.lock();
        loop {
            if let Some(f) = &st.failed {
                return Err(Error::WalFailed(f.clone()));
            }
            if st.synced >= lsn {
                return Ok(());
            }
            if !st.in_progress {
                break;
            }
            self.sync_done.wait(&mut st);
        }
        st.in_progress = true;
        drop(st);

        // Earlier segments were fsynced when rolled; only the current one can hold unsynced data.
        let snapshot = {
            let w = self.writer.lock();
            w.file.try_clone().map(|f| (f, w.lsn, w.index))
        };
        let result =
            snapshot.map_err(io_err("duplicate handle of", self.dir.clone())).and_then(|(f, target, index)| {
                let t0 = Instant::now();
                f.sync_data().map_err(io_err("fsync", segment_path(&self.dir, index)))?;
                self.note_fsync(t0);
                Ok(target)
            });

        let mut st = self.sync.lock();
        st.in_progress = false;
        let out = match result {
            Ok(target) => {
                st.synced = st.synced.max(target);
                Ok(())
            }
            Err(e) => {
                st.failed = Some(e.to_string());
                Err(e)
            }
        };
        self.sync_done.notify_all();
        out
    }

    /// Writes buffered records and fsyncs everything written so far.
    pub fn sync_all(&self) -> Result<()> {
        let lsn = {
            let mut w = self.writer.lock();
            if w.pending.is_empty() {
                w.lsn
            } else {
                self.write_locked(&mut w, Vec::new(), 0)?
            }
        };
        self.sync_to(lsn)
    }

    /// Stops the interval syncer and fsyncs. The log stays usable (appends after `close` are
    /// still written), but callers are expected to stop appending first.
    pub fn close(&self) -> Result<()> {
        {
            let (lock, cv) = &*self.stop;
            *lock.lock() = true;
            cv.notify_all();
        }
        if let Some(h) = self.syncer.lock().take() {
            let _ = h.join();
        }
        self.sync_all()
    }

    /// Writes a checkpoint of all segments up to and including `last_segment` (which must be older
    /// than the one being written: call `roll` first), keeping the series for which `keep` is
    /// true and only samples at or after `mint`, then deletes the segments and older checkpoints
    /// it replaces. Crash-safe at every step: see `docs/design.md`.
    pub fn checkpoint(
        &self,
        last_segment: u64,
        keep: impl Fn(SeriesRef) -> bool,
        mint: i64,
    ) -> Result<CheckpointStats> {
        assert!(last_segment < self.current_segment(), "cannot checkpoint the segment being written");
        let stats = checkpoint::write_checkpoint(&self.dir, last_segment, keep, mint)?;
        checkpoint::remove_replaced(&self.dir, last_segment)?;
        Ok(stats)
    }
}

impl Drop for Wal {
    fn drop(&mut self) {
        let (lock, cv) = &*self.stop;
        *lock.lock() = true;
        cv.notify_all();
    }
}

fn spawn_syncer(wal: Weak<Wal>, stop: Arc<(Mutex<bool>, Condvar)>, every: Duration) -> JoinHandle<()> {
    std::thread::Builder::new()
        .name("wal-fsync".into())
        .spawn(move || loop {
            {
                let (lock, cv) = &*stop;
                let mut stopped = lock.lock();
                if !*stopped {
                    cv.wait_for(&mut stopped, every);
                }
                if *stopped {
                    return;
                }
            }
            let Some(wal) = wal.upgrade() else { return };
            if let Err(e) = wal.sync_all() {
                tracing::error!(error = %e, "periodic fsync of the write-ahead log failed");
            }
        })
        .expect("spawn the WAL fsync thread")
}

/// Refuses records the reader would take for corruption (a label set of tens of MiB).
fn check_record_size(record: &[u8]) -> Result<()> {
    if record.len() > segment::RECORD_BYTES_MAX as usize {
        return Err(Error::RecordTooLarge { bytes: record.len(), limit: segment::RECORD_BYTES_MAX });
    }
    Ok(())
}

/// Creates segment `index` with its header and makes its directory entry durable.
fn create_segment(dir: &Path, index: u64) -> Result<File> {
    let path = segment_path(dir, index);
    let mut f = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(&path)
        .map_err(io_err("create segment", &path))?;
    f.write_all(&segment_header()).map_err(io_err("write header of", &path))?;
    f.sync_data().map_err(io_err("fsync", &path))?;
    fsync_dir(dir)?;
    Ok(f)
}

/// Segment indexes present in `dir`, ascending.
pub fn list_segments(dir: &Path) -> Result<Vec<u64>> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).map_err(io_err("list", dir))? {
        let e = e.map_err(io_err("list", dir))?;
        if let Some(i) = e.file_name().to_str().and_then(segment::parse_segment_name) {
            out.push(i);
        }
    }
    out.sort_unstable();
    Ok(out)
}

#[cfg(test)]
mod tests;
