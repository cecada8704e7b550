//! Checkpoints: the part of old segments the head still needs, rewritten compactly.
//!
//! When the head drops its oldest data (it was persisted as a block), the segments holding it are
//! mostly dead weight, but they also hold series records of series that are still alive. A
//! checkpoint `checkpoint.N` rewrites segments `..=N` (and the previous checkpoint) keeping only
//! the series the head still has, their samples at or after the new head start that are not in
//! the head's chunk files (`head::chunk_files`), and their tombstones; then the originals are
//! removed. Checkpoints are thus also how the log stays short between head cuts. Protocol
//! (crash-safe at every step):
//! write `checkpoint.N.tmp/`, fsync it, rename to `checkpoint.N`, fsync `wal/`, then delete
//! segments `<= N` and older checkpoints. Replay removes `*.tmp` and any segment `<= N` left.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::list_segments;
use super::segment::{frame_record, segment_header, segment_path, Frame, SegmentReader};
use crate::error::{io_err, Error, Result};
use crate::record::{self, Record, RefSample, RefSeries};
use crate::vfs::{AppendFile, Vfs};
use strata_model::SeriesRef;

const CHECKPOINT_PREFIX: &str = "checkpoint.";
const TMP_SUFFIX: &str = ".tmp";
/// Samples per rewritten samples record.
const SAMPLES_PER_RECORD: usize = 10_000;
/// Series per rewritten series record.
const SERIES_PER_RECORD: usize = 1_000;

pub fn checkpoint_name(index: u64) -> String {
    format!("{CHECKPOINT_PREFIX}{index:08}")
}

pub fn parse_checkpoint_name(name: &str) -> Option<u64> {
    super::segment::parse_segment_name(name.strip_prefix(CHECKPOINT_PREFIX)?)
}

/// What a checkpoint kept and dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckpointStats {
    pub path: PathBuf,
    pub series_kept: u64,
    pub series_dropped: u64,
    pub samples_kept: u64,
    pub samples_dropped: u64,
    pub tombstones_kept: u64,
    pub tombstones_dropped: u64,
}

pub(super) enum CheckpointEntry {
    Temporary(PathBuf),
    Done(u64, PathBuf),
}

/// Checkpoint directories in `dir`, finished ones ascending.
pub(super) fn checkpoint_dir_entries(fs: &dyn Vfs, dir: &Path) -> Result<Vec<CheckpointEntry>> {
    let mut done = Vec::new();
    let mut out = Vec::new();
    for e in fs.list(dir).map_err(io_err("list", dir))? {
        let name = e.name;
        if !name.starts_with(CHECKPOINT_PREFIX) {
            continue;
        }
        if name.ends_with(TMP_SUFFIX) {
            out.push(CheckpointEntry::Temporary(dir.join(&name)));
        } else if let Some(i) = parse_checkpoint_name(&name) {
            done.push((i, dir.join(&name)));
        }
    }
    done.sort();
    out.extend(done.into_iter().map(|(i, p)| CheckpointEntry::Done(i, p)));
    Ok(out)
}

/// Every record of `path` (a segment that must be intact), in order.
fn for_each_record(fs: &dyn Vfs, path: &Path, mut f: impl FnMut(Record)) -> Result<()> {
    let mut r = SegmentReader::open(fs, path).map_err(io_err("open", path))?;
    loop {
        match r.next_frame().map_err(io_err("read", path))? {
            Frame::End => return Ok(()),
            Frame::Record => {
                let rec = record::decode(&r.body).map_err(|source| Error::WalRecord {
                    path: path.to_owned(),
                    offset: r.record_offset,
                    source,
                })?;
                f(rec);
            }
            Frame::Corrupt(c) => {
                return Err(Error::CheckpointCorrupt { path: path.to_owned(), offset: c.offset, reason: c.reason })
            }
        }
    }
}

/// Writes `checkpoint.{last}` from the previous checkpoint and segments `..=last`.
pub(super) fn write_checkpoint(
    fs: &dyn Vfs,
    dir: &Path,
    last: u64,
    keep_series: impl Fn(SeriesRef) -> Option<i64>,
    mint: i64,
    compression: bool,
) -> Result<CheckpointStats> {
    let keep = |r: SeriesRef| keep_series(r).is_some();
    // In-order samples the series' head chunk files hold are dropped too.
    let keep_in_order = |r: SeriesRef, t: i64| t >= mint && keep_series(r).is_some_and(|written| t > written);
    // The newest checkpoint at or before `last` replaces every segment up to its index; those
    // segments may still be there (their removal failed or was interrupted) and must not be
    // read a second time.
    let mut inputs: Vec<PathBuf> = Vec::new();
    let mut replaced = None;
    for e in checkpoint_dir_entries(fs, dir)? {
        if let CheckpointEntry::Done(i, p) = e {
            if i <= last {
                inputs = list_segments(fs, &p)?.into_iter().map(|s| segment_path(&p, s)).collect();
                replaced = Some(i);
            }
        }
    }
    if replaced == Some(last) {
        // Already written (by an attempt whose later steps failed): only removal is left.
        return Ok(CheckpointStats { path: dir.join(checkpoint_name(last)), ..Default::default() });
    }
    inputs.extend(
        list_segments(fs, dir)?
            .into_iter()
            .filter(|&s| s <= last && replaced.is_none_or(|r| s > r))
            .map(|s| segment_path(dir, s)),
    );

    let final_dir = dir.join(checkpoint_name(last));
    let tmp_dir = dir.join(format!("{}{TMP_SUFFIX}", checkpoint_name(last)));
    if fs.exists(&tmp_dir) {
        fs.remove_dir_all(&tmp_dir).map_err(io_err("remove", &tmp_dir))?;
    }
    fs.create_dir_all(&tmp_dir).map_err(io_err("create directory", &tmp_dir))?;
    let out_path = segment_path(&tmp_dir, 0);
    let out = fs.create(&out_path).map_err(io_err("create", &out_path))?;
    let mut buf = segment_header(compression).to_vec();
    let mut stats = CheckpointStats { path: final_dir.clone(), ..Default::default() };
    let mut series: Vec<RefSeries> = Vec::new();
    let mut samples: Vec<RefSample> = Vec::new();
    let mut body = Vec::new();

    let flush = |buf: &mut Vec<u8>, out: &Arc<dyn AppendFile>, force: bool| -> Result<()> {
        if force || buf.len() >= 1 << 20 {
            out.write_all(buf).map_err(io_err("write", &out_path))?;
            buf.clear();
        }
        Ok(())
    };

    for input in &inputs {
        let mut err = None;
        for_each_record(fs, input, |rec| {
            match rec {
                Record::Series(v) => {
                    for s in v {
                        if keep(s.series) {
                            stats.series_kept += 1;
                            series.push(s);
                        } else {
                            stats.series_dropped += 1;
                        }
                    }
                }
                Record::Samples(v) => {
                    for s in v {
                        if keep_in_order(s.series, s.t) {
                            stats.samples_kept += 1;
                            samples.push(s);
                        } else {
                            stats.samples_dropped += 1;
                        }
                    }
                }
                Record::Histograms(v) => {
                    // Written through, after the series they refer to. Their order against the
                    // float samples still buffered does not matter: replay merges late samples.
                    write_series(&mut series, &mut body, &mut buf, compression);
                    let kept = kept_of(v, |s| keep_in_order(s.series, s.t), &mut stats);
                    write_items(&kept, record::encode_histograms, &mut body, &mut buf, compression);
                }
                Record::OutOfOrderSamples(v) => {
                    // Written through in log order (a later write of a timestamp must replay
                    // after an earlier one); their order against buffered in-order samples does
                    // not matter, the overlay wins over in-order samples whatever the order.
                    write_series(&mut series, &mut body, &mut buf, compression);
                    let kept = kept_of(v, |s| keep(s.series) && s.t >= mint, &mut stats);
                    write_items(&kept, record::encode_out_of_order_samples, &mut body, &mut buf, compression);
                }
                Record::Exemplars(v) => {
                    // Written through after their series, as Prometheus' checkpoint keeps
                    // the exemplars of kept series at or after `mint`.
                    write_series(&mut series, &mut body, &mut buf, compression);
                    let kept: Vec<_> = v.into_iter().filter(|e| keep(e.series) && e.t >= mint).collect();
                    if !kept.is_empty() {
                        body.clear();
                        record::encode_exemplars(&kept, &mut body);
                        frame_record(&body, compression, &mut buf);
                    }
                }
                Record::Tombstones(v) => {
                    // Tombstones must follow the series they refer to.
                    write_series(&mut series, &mut body, &mut buf, compression);
                    let kept: Vec<_> = v.into_iter().filter(|t| keep(t.series) && t.maxt >= mint).collect();
                    stats.tombstones_kept += kept.len() as u64;
                    if !kept.is_empty() {
                        body.clear();
                        record::encode_tombstones(&kept, &mut body);
                        frame_record(&body, compression, &mut buf);
                    }
                }
            }
            // Series before samples: a series record always precedes samples that use it.
            if series.len() >= SERIES_PER_RECORD || !samples.is_empty() {
                write_series(&mut series, &mut body, &mut buf, compression);
            }
            if samples.len() >= SAMPLES_PER_RECORD {
                body.clear();
                record::encode_samples(&samples, &mut body);
                frame_record(&body, compression, &mut buf);
                samples.clear();
            }
            if let Err(e) = flush(&mut buf, &out, false) {
                err.get_or_insert(e);
            }
        })?;
        if let Some(e) = err {
            return Err(e);
        }
    }
    write_series(&mut series, &mut body, &mut buf, compression);
    if !samples.is_empty() {
        body.clear();
        record::encode_samples(&samples, &mut body);
        frame_record(&body, compression, &mut buf);
    }
    flush(&mut buf, &out, true)?;
    out.sync_data().map_err(io_err("fsync", &out_path))?;
    drop(out);
    fs.fsync_dir(&tmp_dir).map_err(io_err("fsync directory", &tmp_dir))?;
    fs.rename(&tmp_dir, &final_dir).map_err(io_err("rename to", &final_dir))?;
    fs.fsync_dir(dir).map_err(io_err("fsync directory", dir))?;
    Ok(stats)
}

/// The samples of `items` that `keep` keeps, counted in `stats`.
fn kept_of<T>(items: Vec<T>, keep: impl Fn(&T) -> bool, stats: &mut CheckpointStats) -> Vec<T> {
    let total = items.len() as u64;
    let kept: Vec<T> = items.into_iter().filter(|s| keep(s)).collect();
    stats.samples_kept += kept.len() as u64;
    stats.samples_dropped += total - kept.len() as u64;
    kept
}

/// Frames a record of `items` (if any), encoded by `encode`, into `buf`.
fn write_items<T>(
    items: &[T],
    encode: fn(&[T], &mut Vec<u8>),
    body: &mut Vec<u8>,
    buf: &mut Vec<u8>,
    compression: bool,
) {
    if items.is_empty() {
        return;
    }
    body.clear();
    encode(items, body);
    frame_record(body, compression, buf);
}

/// Frames a series record of `series` (if any) into `buf` and empties `series`: series records
/// go out before the first record that refers to them.
fn write_series(series: &mut Vec<RefSeries>, body: &mut Vec<u8>, buf: &mut Vec<u8>, compression: bool) {
    if series.is_empty() {
        return;
    }
    body.clear();
    record::encode_series(series.iter().map(|s| (s.series, &s.labels)), body);
    frame_record(body, compression, buf);
    series.clear();
}

/// Deletes segments `<= last` and checkpoints older than `last`, now that `checkpoint.{last}` is
/// durable.
pub(super) fn remove_replaced(fs: &dyn Vfs, dir: &Path, last: u64) -> Result<()> {
    for s in list_segments(fs, dir)?.into_iter().filter(|&s| s <= last) {
        let p = segment_path(dir, s);
        fs.remove_file(&p).map_err(io_err("remove", &p))?;
    }
    for e in checkpoint_dir_entries(fs, dir)? {
        if let CheckpointEntry::Done(i, p) = e {
            if i < last {
                fs.remove_dir_all(&p).map_err(io_err("remove", &p))?;
            }
        }
    }
    fs.fsync_dir(dir).map_err(io_err("fsync directory", dir))
}
