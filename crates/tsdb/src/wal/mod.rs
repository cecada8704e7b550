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

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

pub use checkpoint::{checkpoint_name, parse_checkpoint_name, CheckpointStats};
pub use replay::{replay, ReplayOutcome, ReplayProgress};
use segment::{frame_record, segment_header, segment_path, SEGMENT_HEADER_BYTES};

use crate::error::{io_err, Error, Result};
use crate::record::RecordError;
use crate::vfs::{AppendFile, OsFs, Vfs};
use strata_model::SeriesRef;

/// Default segment size. Big enough that rolls (each one an fsync and a new file) are rare, small
/// enough that checkpoints free space in useful steps: closed segments are what a checkpoint
/// rewrites once the head has written its closed chunks out, so this is about how far the WAL
/// runs ahead of the chunk files (a quarter of Prometheus' 128 MiB: the remote write of 100
/// node exporters for 100 minutes left 4.7 bytes a sample on disk with 128 MiB, 1.5 with 32).
/// A segment exceeds it by at most one batch, because a commit's records are written to a
/// single segment.
pub const SEGMENT_BYTES_DEFAULT: u64 = 32 << 20;
/// Default fsync interval of the `Interval` policy: the most a power loss can take.
pub const FSYNC_INTERVAL_DEFAULT: Duration = Duration::from_secs(1);

/// Buffered records are written out once they reach this size even without a commit.
const PENDING_BYTES_MAX: usize = 1 << 20;
/// A batch of buffered entries (`Wal::buffer_entry`) is framed as one record once it reaches
/// this size: a million new Graphite paths are then about a thousand compressed records, where
/// a record per series could not be compressed (too short) and cost a frame header each.
const BATCH_RECORD_BYTES: usize = 64 << 10;
/// Records of failed writes kept to go out with the next write (see `write_locked`); a disk
/// that stays broken while ingestion goes on must not grow this without end.
const FAILED_BYTES_MAX: usize = 256 << 20;

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
    /// Records compressed with zstd where it pays (`docs/format/wal.md`); on by default.
    pub compression: bool,
    /// Where replay reports which segment it reads, for a server to show while it opens
    /// (`/api/v1/status/walreplay`). A process holds one for its database, for its lifetime.
    pub progress: Option<&'static ReplayProgress>,
}

impl Default for WalOptions {
    fn default() -> Self {
        WalOptions {
            segment_bytes: SEGMENT_BYTES_DEFAULT,
            fsync: FsyncPolicy::default(),
            compression: true,
            progress: None,
        }
    }
}

/// What `Wal::usage` found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WalUsage {
    pub checkpoint_bytes: u64,
    pub finished_segments: usize,
    pub finished_segment_bytes: u64,
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
    file: Arc<dyn AppendFile>,
    /// Index of the segment being written.
    index: u64,
    /// Bytes in the current segment that hold whole frames (a failed write may have left part
    /// of one after them, cut before the next write: see `recover_locked`).
    segment_bytes: u64,
    /// Bytes of the current segment known to be fsynced.
    synced_bytes: u64,
    /// Log sequence number: total bytes ever written through this handle. Commits wait for
    /// `synced >= their lsn`.
    lsn: u64,
    /// Set after a failed write or fsync: the segment may end in a torn frame, or hold bytes
    /// that never reached the disk, so nothing may follow them until `recover_locked` cut them.
    failed: Option<String>,
    /// Framed records waiting to go out with the next write (see `Wal::buffer`).
    pending: Vec<u8>,
    /// A record being built from buffered entries (its type byte first), not framed yet; framed
    /// onto `pending` before anything else is (see `Wal::buffer_entry`).
    batch: Vec<u8>,
    /// A copy of the current segment's bytes after `synced_bytes`, to write again if a failure
    /// makes them suspect (`recover_locked`). At most what one fsync interval writes.
    unsynced: Vec<u8>,
    /// Times `recover_locked` cut and rewrote the segment.
    recoveries: u64,
}

#[derive(Debug, Default)]
struct SyncState {
    synced: u64,
    in_progress: bool,
    /// Fsyncs that failed so far, and the last one's error (for the callers that waited on it).
    failures: u64,
    last_failure: String,
}

/// An open write-ahead log, appending to its newest segment.
#[derive(Debug)]
pub struct Wal {
    fs: Arc<dyn Vfs>,
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
        Wal::open_on(OsFs::shared(), dir, opts, apply)
    }

    /// `open` on a given file system (tests put a simulated, failing disk here).
    pub fn open_on(
        fs: Arc<dyn Vfs>,
        dir: &Path,
        opts: WalOptions,
        apply: impl FnMut(&[u8]) -> Result<(), RecordError>,
    ) -> Result<(Arc<Wal>, ReplayOutcome)> {
        assert!(opts.segment_bytes > SEGMENT_HEADER_BYTES, "segment size must exceed the header");
        let outcome = replay(&*fs, dir, apply, opts.progress)?;
        let index = outcome.next_segment;
        let file = create_segment(&*fs, dir, index, opts.compression)?;
        let wal = Arc::new(Wal {
            fs,
            dir: dir.to_owned(),
            opts,
            writer: Mutex::new(Writer {
                file,
                index,
                segment_bytes: SEGMENT_HEADER_BYTES,
                synced_bytes: SEGMENT_HEADER_BYTES,
                lsn: 0,
                failed: None,
                pending: Vec::new(),
                batch: Vec::new(),
                unsynced: Vec::new(),
                recoveries: 0,
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

    /// Bytes of the newest checkpoint and of the finished segments after it (the one being
    /// written not counted): what a checkpoint now would rewrite.
    pub fn usage(&self) -> Result<WalUsage> {
        let current = self.current_segment();
        let mut out = WalUsage::default();
        let mut after = None;
        let newest =
            checkpoint::checkpoint_dir_entries(&*self.fs, &self.dir)?.into_iter().rev().find_map(|e| match e {
                checkpoint::CheckpointEntry::Done(i, p) => Some((i, p)),
                checkpoint::CheckpointEntry::Temporary(_) => None,
            });
        if let Some((i, p)) = newest {
            out.checkpoint_bytes = segments_bytes(&*self.fs, &p, |_| true)?.1;
            after = Some(i);
        }
        (out.finished_segments, out.finished_segment_bytes) =
            segments_bytes(&*self.fs, &self.dir, |s| s < current && after.is_none_or(|a| s > a))?;
        Ok(out)
    }

    /// Writes one commit's records and, under `Always`, waits until they are on stable storage.
    /// If it fails, the records stay queued and go out ahead of the next commit's (the head
    /// has applied them to memory already); only that later commit's success says they are
    /// logged.
    pub fn commit(&self, records: &[&[u8]]) -> Result<()> {
        let lsn = self.write(records)?;
        if self.opts.fsync == FsyncPolicy::Always {
            self.sync_to(lsn)?;
        }
        Ok(())
    }

    /// Queues a record to be written ahead of the next commit's records, without a system call:
    /// any commit after it is written after it. (The head logs each new series so, through
    /// `buffer_entry`, the moment it creates it: replay always meets a series before its
    /// samples.)
    pub fn buffer(&self, record: &[u8]) -> Result<()> {
        check_record_size(record)?;
        let mut w = self.writer.lock();
        self.seal_batch_locked(&mut w);
        frame_record(record, self.opts.compression, &mut w.pending);
        if w.pending.len() >= PENDING_BYTES_MAX {
            self.write_locked(&mut w, Vec::new(), 0)?;
        }
        Ok(())
    }

    /// As `buffer` for a record of type `record_type` holding `entry` alone, but entries
    /// buffered one after another go into one record (up to `BATCH_RECORD_BYTES`), for record
    /// types whose body is a sequence of entries (series, tombstones). The head logs each new
    /// series this way: when many are created at once (a new rollout, a million new Graphite
    /// paths) they are a few large compressed records instead of one small record each.
    pub fn buffer_entry(&self, record_type: u8, entry: &[u8]) -> Result<()> {
        check_record_size(entry)?;
        let mut w = self.writer.lock();
        if w.batch.first().is_some_and(|&t| t != record_type)
            || w.batch.len() + entry.len() >= segment::RECORD_BYTES_MAX as usize
        {
            self.seal_batch_locked(&mut w);
        }
        if w.batch.is_empty() {
            w.batch.push(record_type);
        }
        w.batch.extend_from_slice(entry);
        if w.batch.len() >= BATCH_RECORD_BYTES {
            self.seal_batch_locked(&mut w);
            if w.pending.len() >= PENDING_BYTES_MAX {
                self.write_locked(&mut w, Vec::new(), 0)?;
            }
        }
        Ok(())
    }

    /// Frames the batch being built, if any, onto the buffered records.
    fn seal_batch_locked(&self, w: &mut Writer) {
        if !w.batch.is_empty() {
            frame_record(&w.batch, self.opts.compression, &mut w.pending);
            // The buffer is kept for the next batch.
            w.batch.clear();
        }
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
            frame_record(r, self.opts.compression, &mut buf);
        }
        let mut w = self.writer.lock();
        self.write_locked(&mut w, buf, records.len())
    }

    fn write_locked(&self, w: &mut Writer, buf: Vec<u8>, records: usize) -> Result<u64> {
        self.seal_batch_locked(w);
        let pending_len = w.pending.len();
        let buf = if w.pending.is_empty() {
            buf
        } else {
            let mut all = std::mem::take(&mut w.pending);
            all.extend_from_slice(&buf);
            all
        };
        let size = buf.len() as u64;
        let mut written = self.recover_locked(w);
        if written.is_ok() && w.segment_bytes > SEGMENT_HEADER_BYTES && w.segment_bytes + size > self.opts.segment_bytes
        {
            written = self.roll_locked(w);
        }
        if written.is_ok() {
            written = w.file.write_all(&buf).map_err(|e| {
                let path = segment_path(&self.dir, w.index);
                w.failed = Some(format!("write {}: {e}", path.display()));
                io_err("write", path)(e)
            });
        }
        if let Err(e) = written {
            self.requeue_locked(w, buf, pending_len);
            return Err(e);
        }
        w.segment_bytes += size;
        w.unsynced.extend_from_slice(&buf);
        w.lsn += size;
        debug_assert_eq!(w.segment_bytes, w.synced_bytes + w.unsynced.len() as u64);
        self.stats.bytes_written.fetch_add(size, Ordering::Relaxed);
        self.stats.records_written.fetch_add(records as u64, Ordering::Relaxed);
        Ok(w.lsn)
    }

    /// Keeps records that could not be written to go out first with the next write: the
    /// caller (the head) applied them to memory already, so they must still reach the log, and
    /// ahead of anything applied after them. Past a bound the newest commit's are dropped, loudly.
    fn requeue_locked(&self, w: &mut Writer, mut buf: Vec<u8>, pending_len: usize) {
        if buf.len() > FAILED_BYTES_MAX {
            // The queued part stays whole (it holds series records that later samples need,
            // and it ends on a frame boundary).
            let keep = pending_len;
            tracing::error!(
                dropped_bytes = buf.len() - keep, dir = %self.dir.display(),
                "write-ahead log: records that failed to write exceed the retry bound and are dropped; \
                 the head holds their samples, a crash before the next block cut loses them"
            );
            buf.truncate(keep);
        }
        w.pending = buf;
    }

    /// After a failed write or fsync, puts the current segment back in a known state before
    /// anything else is written: cut to its last fsynced byte (a failed write may have left a
    /// torn frame; after a failed fsync the kernel may have dropped the dirty pages, so what
    /// the file seems to hold cannot be trusted), then the bytes written since, kept in memory
    /// for this, written again. Until that succeeds every write fails with the first error; once
    /// the disk works again (space freed, a transient error gone) the log goes on by itself.
    fn recover_locked(&self, w: &mut Writer) -> Result<()> {
        let Some(reason) = w.failed.clone() else { return Ok(()) };
        let path = segment_path(&self.dir, w.index);
        let again = |e: std::io::Error| Error::WalFailed(format!("{reason}; recovering: {e}"));
        w.file.truncate(w.synced_bytes).map_err(again)?;
        w.file.write_all(&w.unsynced).map_err(again)?;
        w.failed = None;
        w.recoveries += 1;
        tracing::warn!(
            segment = %path.display(), after = %reason, rewritten_bytes = w.unsynced.len(),
            "write-ahead log writable again: cut to its last fsynced byte and rewrote the unsynced bytes"
        );
        Ok(())
    }

    /// Starts a new segment (fsyncing the old one) and returns its index.
    pub fn roll(&self) -> Result<u64> {
        let mut w = self.writer.lock();
        self.recover_locked(&mut w)?;
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
        w.synced_bytes = w.segment_bytes;
        w.unsynced.clear();
        // A failure here leaves the old segment, whole and fsynced, as the one to append to.
        let next = w.index + 1;
        w.file = create_segment(&*self.fs, &self.dir, next, self.opts.compression)?;
        w.index = next;
        w.segment_bytes = SEGMENT_HEADER_BYTES;
        w.synced_bytes = SEGMENT_HEADER_BYTES;
        self.stats.segments_created.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn note_fsync(&self, started: Instant) {
        self.stats.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.stats.fsync_nanos_total.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// Blocks until everything up to `lsn` is fsynced. One caller becomes the leader and fsyncs
    /// for everyone waiting; the others sleep until it is done (group commit). If that fsync
    /// fails, every caller waiting on it gets the error: their records may not be durable.
    pub fn sync_to(&self, lsn: u64) -> Result<()> {
        let mut st = self.sync.lock();
        let failures_seen = st.failures;
        loop {
            if st.synced >= lsn {
                return Ok(());
            }
            if st.failures != failures_seen {
                return Err(Error::WalFailed(st.last_failure.clone()));
            }
            if !st.in_progress {
                break;
            }
            self.sync_done.wait(&mut st);
        }
        st.in_progress = true;
        drop(st);

        let result = self.sync_current();
        let mut st = self.sync.lock();
        st.in_progress = false;
        let out = match result {
            Ok(target) => {
                st.synced = st.synced.max(target);
                Ok(())
            }
            Err(e) => {
                st.failures += 1;
                st.last_failure = e.to_string();
                Err(e)
            }
        };
        self.sync_done.notify_all();
        out
    }

    /// Fsyncs the segment being written (earlier ones were fsynced when rolled) without
    /// holding the writer's lock through the fsync; returns the LSN it covers.
    fn sync_current(&self) -> Result<u64> {
        loop {
            let (file, target, index, bytes, recoveries) = {
                let mut w = self.writer.lock();
                self.recover_locked(&mut w)?;
                (w.file.clone(), w.lsn, w.index, w.segment_bytes, w.recoveries)
            };
            let t0 = Instant::now();
            let synced = file.sync_data();
            let mut w = self.writer.lock();
            if let Err(e) = synced {
                let path = segment_path(&self.dir, index);
                if w.index == index && w.failed.is_none() {
                    w.failed = Some(format!("fsync {}: {e}", path.display()));
                }
                return Err(io_err("fsync", path)(e));
            }
            self.note_fsync(t0);
            if w.recoveries != recoveries {
                // The segment was cut and rewritten meanwhile: this fsync may predate the
                // rewrite. Sync again.
                continue;
            }
            if w.index == index && bytes > w.synced_bytes {
                let newly = (bytes - w.synced_bytes) as usize;
                w.unsynced.drain(..newly);
                w.synced_bytes = bytes;
            }
            return Ok(target);
        }
    }

    /// Writes buffered records and fsyncs everything written so far.
    pub fn sync_all(&self) -> Result<()> {
        let lsn = {
            let mut w = self.writer.lock();
            if w.pending.is_empty() && w.batch.is_empty() {
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
    /// `Some` and only samples at or after `mint`, then deletes the segments and older checkpoints
    /// it replaces. `keep` gives the newest timestamp of the series' samples that are durable
    /// elsewhere (head chunk files; `i64::MIN` for none): its in-order samples up to it go too.
    /// Crash-safe at every step: see `docs/design.md`.
    pub fn checkpoint(
        &self,
        last_segment: u64,
        keep: impl Fn(SeriesRef) -> Option<i64>,
        mint: i64,
    ) -> Result<CheckpointStats> {
        assert!(last_segment < self.current_segment(), "cannot checkpoint the segment being written");
        let stats =
            checkpoint::write_checkpoint(&*self.fs, &self.dir, last_segment, keep, mint, self.opts.compression)?;
        checkpoint::remove_replaced(&*self.fs, &self.dir, last_segment)?;
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
    // The frame adds its encoding byte to the record.
    if record.len() >= segment::RECORD_BYTES_MAX as usize {
        return Err(Error::RecordTooLarge { bytes: record.len(), limit: segment::RECORD_BYTES_MAX });
    }
    Ok(())
}

/// Creates segment `index` with its header and makes its directory entry durable.
fn create_segment(fs: &dyn Vfs, dir: &Path, index: u64, compression: bool) -> Result<Arc<dyn AppendFile>> {
    let path = segment_path(dir, index);
    let f = fs.create(&path).map_err(io_err("create segment", &path))?;
    let made = f
        .write_all(&segment_header(compression))
        .map_err(io_err("write header of", &path))
        .and_then(|()| f.sync_data().map_err(io_err("fsync", &path)))
        .and_then(|()| fs.fsync_dir(dir).map_err(io_err("fsync directory", dir)));
    if let Err(e) = made {
        // Leave no half-made segment behind (replay would take it for a torn one); if even
        // that fails, replay cuts it, and it is the newest segment, so nothing follows it.
        let _ = fs.remove_file(&path);
        return Err(e);
    }
    Ok(f)
}

/// How many of the segments in `dir` `which` selects (by index), and their bytes.
pub fn segments_bytes(fs: &dyn Vfs, dir: &Path, which: impl Fn(u64) -> bool) -> Result<(usize, u64)> {
    let (mut n, mut total) = (0, 0);
    for s in list_segments(fs, dir)?.into_iter().filter(|&s| which(s)) {
        let p = segment_path(dir, s);
        total += fs.file_len(&p).map_err(io_err("stat", &p))?;
        n += 1;
    }
    Ok((n, total))
}

/// Segment indexes present in `dir`, ascending.
pub fn list_segments(fs: &dyn Vfs, dir: &Path) -> Result<Vec<u64>> {
    let mut out: Vec<u64> = fs
        .list(dir)
        .map_err(io_err("list", dir))?
        .iter()
        .filter(|e| !e.is_dir)
        .filter_map(|e| segment::parse_segment_name(&e.name))
        .collect();
    out.sort_unstable();
    Ok(out)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod faults;
