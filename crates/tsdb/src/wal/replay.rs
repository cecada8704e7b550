//! Reading the log back at open: the newest checkpoint, then every later segment, in order.
//!
//! A frame that fails its checks (torn header, impossible length, CRC mismatch) marks the end of
//! the valid log: the segment is cut there, later segments are removed, and both are logged
//! loudly with segment and offset. Everything before that frame is applied.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::checkpoint::{checkpoint_dir_entries, CheckpointEntry};
use super::list_segments;
use super::segment::{segment_path, Corruption, Frame, SegmentReader, SEGMENT_HEADER_BYTES};
use crate::error::{io_err, Error, Result};
use crate::record::RecordError;
use crate::vfs::Vfs;

/// What replay found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayOutcome {
    /// The segment the writer should create next.
    pub next_segment: u64,
    /// The checkpoint replayed first, if any.
    pub checkpoint: Option<u64>,
    pub segments_read: usize,
    pub records: u64,
    /// Where the log was cut, if it was: (segment, byte offset, reason).
    pub cut: Option<(u64, u64, String)>,
}

/// Which segments a replay reads and which it is on, as Prometheus' `walreplay` status shows
/// them: `first` and `last` are known once the segments are listed, `current` advances as each
/// begins, `done` is set at the end.
#[derive(Debug, Default)]
pub struct ReplayProgress {
    pub first: AtomicU64,
    pub last: AtomicU64,
    pub current: AtomicU64,
    pub done: AtomicBool,
}

impl ReplayProgress {
    /// `(first, last, current, done)`.
    pub fn snapshot(&self) -> (u64, u64, u64, bool) {
        (
            self.first.load(Ordering::Relaxed),
            self.last.load(Ordering::Relaxed),
            self.current.load(Ordering::Relaxed),
            self.done.load(Ordering::Acquire),
        )
    }
}

/// Replays `dir` through `apply`, repairing a torn tail. Creates `dir` if missing. `progress`
/// follows the segments as they are read.
pub fn replay(
    fs: &dyn Vfs,
    dir: &Path,
    mut apply: impl FnMut(&[u8]) -> Result<(), RecordError>,
    progress: Option<&ReplayProgress>,
) -> Result<ReplayOutcome> {
    let out = replay_inner(fs, dir, &mut apply, progress);
    if let Some(p) = progress {
        p.done.store(true, Ordering::Release);
    }
    out
}

fn replay_inner(
    fs: &dyn Vfs,
    dir: &Path,
    mut apply: impl FnMut(&[u8]) -> Result<(), RecordError>,
    progress: Option<&ReplayProgress>,
) -> Result<ReplayOutcome> {
    fs.create_dir_all(dir).map_err(io_err("create directory", dir))?;
    let mut out = ReplayOutcome::default();
    let mut last_checkpoint = None;
    for entry in checkpoint_dir_entries(fs, dir)? {
        match entry {
            CheckpointEntry::Temporary(p) => {
                tracing::warn!(path = %p.display(), "removing unfinished write-ahead log checkpoint");
                fs.remove_dir_all(&p).map_err(io_err("remove", &p))?;
            }
            CheckpointEntry::Done(i, p) => last_checkpoint = Some((i, p)),
        }
    }
    if let Some((index, path)) = &last_checkpoint {
        replay_checkpoint(fs, path, &mut apply, &mut out)?;
        out.checkpoint = Some(*index);
        out.next_segment = index + 1;
    }

    let mut segments = list_segments(fs, dir)?;
    if let Some(c) = out.checkpoint {
        // Segments the checkpoint replaced, left behind by an interrupted truncation.
        for &s in segments.iter().filter(|&&s| s <= c) {
            let p = segment_path(dir, s);
            fs.remove_file(&p).map_err(io_err("remove", &p))?;
        }
        segments.retain(|&s| s > c);
        if let Some(&first) = segments.first() {
            if first != c + 1 {
                return Err(Error::WalSegmentGap { dir: dir.to_owned(), before: c, after: first });
            }
        }
    }
    if let Some(w) = segments.windows(2).find(|w| w[1] != w[0] + 1) {
        return Err(Error::WalSegmentGap { dir: dir.to_owned(), before: w[0], after: w[1] });
    }
    if let (Some(p), Some(&first), Some(&last)) = (progress, segments.first(), segments.last()) {
        p.first.store(first, Ordering::Relaxed);
        p.last.store(last, Ordering::Relaxed);
        p.current.store(first, Ordering::Relaxed);
    }

    for (i, &seg) in segments.iter().enumerate() {
        let path = segment_path(dir, seg);
        if let Some(p) = progress {
            p.current.store(seg, Ordering::Relaxed);
        }
        out.segments_read += 1;
        out.next_segment = seg + 1;
        let Some(c) = apply_segment(fs, &path, &mut apply, &mut out)? else {
            // What replay applied must survive the next crash even if the process that wrote
            // it never fsynced it (a segment created just before a failed open, say): the
            // writer is about to start a new segment after it.
            fs.sync_file(&path).map_err(io_err("fsync", &path))?;
            continue;
        };
        tracing::warn!(
            segment = %path.display(), offset = c.offset, reason = %c.reason,
            "write-ahead log is torn or corrupt; cutting it at the last valid record"
        );
        cut_segment(fs, &path, c.offset)?;
        if c.offset < SEGMENT_HEADER_BYTES {
            out.next_segment = seg;
        }
        for &later in &segments[i + 1..] {
            let p = segment_path(dir, later);
            tracing::warn!(segment = %p.display(), "removing write-ahead log segment after the cut");
            fs.remove_file(&p).map_err(io_err("remove", &p))?;
        }
        fs.fsync_dir(dir).map_err(io_err("fsync directory", dir))?;
        out.cut = Some((seg, c.offset, c.reason));
        return Ok(out);
    }
    Ok(out)
}

/// Applies every intact record of the segment at `path`, in order; returns where and why it
/// stopped early, if it did.
fn apply_segment(
    fs: &dyn Vfs,
    path: &Path,
    apply: &mut impl FnMut(&[u8]) -> Result<(), RecordError>,
    out: &mut ReplayOutcome,
) -> Result<Option<Corruption>> {
    let mut r = SegmentReader::open(fs, path).map_err(io_err("open", path))?;
    loop {
        match r.next_frame().map_err(io_err("read", path))? {
            Frame::End => return Ok(None),
            Frame::Record => {
                apply(&r.body).map_err(|source| Error::WalRecord {
                    path: path.to_owned(),
                    offset: r.record_offset,
                    source,
                })?;
                out.records += 1;
            }
            Frame::Corrupt(c) => return Ok(Some(c)),
        }
    }
}

/// Truncates a segment at `offset`, or removes it when not even its header is intact.
fn cut_segment(fs: &dyn Vfs, path: &Path, offset: u64) -> Result<()> {
    if offset < SEGMENT_HEADER_BYTES {
        return fs.remove_file(path).map_err(io_err("remove", path));
    }
    fs.truncate(path, offset).map_err(io_err("truncate", path))
}

fn replay_checkpoint(
    fs: &dyn Vfs,
    dir: &Path,
    apply: &mut impl FnMut(&[u8]) -> Result<(), RecordError>,
    out: &mut ReplayOutcome,
) -> Result<()> {
    for seg in list_segments(fs, dir)? {
        let path = segment_path(dir, seg);
        // A checkpoint is fsynced before it is renamed into place: damage is not a torn write
        // but real corruption, and cutting it would silently drop series.
        if let Some(c) = apply_segment(fs, &path, apply, out)? {
            return Err(Error::CheckpointCorrupt { path, offset: c.offset, reason: c.reason });
        }
    }
    Ok(())
}
