//! Checkpoints: the part of old segments the head still needs, rewritten compactly.
//!
//! When the head drops its oldest data (it was persisted as a block), the segments holding it are
//! mostly dead weight, but they also hold series records of series that are still alive. A
//! checkpoint `checkpoint.N` rewrites segments `..=N` (and the previous checkpoint) keeping only
//! the series the head still has, their samples at or after the new head start, and their
//! tombstones; then the originals are removed. Protocol (crash-safe at every step):
//! write `checkpoint.N.tmp/`, fsync it, rename to `checkpoint.N`, fsync `wal/`, then delete
//! segments `<= N` and older checkpoints. Replay removes `*.tmp` and any segment `<= N` left.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::list_segments;
use super::segment::{frame_record, segment_header, segment_path, Frame, SegmentReader};
use crate::error::{io_err, Error, Result};
use crate::fsutil::{create_dir_all, fsync_dir, rename_durable};
use crate::record::{self, Record, RefSample, RefSeries};
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
pub(super) fn checkpoint_dir_entries(dir: &Path) -> Result<Vec<CheckpointEntry>> {
    let mut done = Vec::new();
    let mut out = Vec::new();
    for e in fs::read_dir(dir).map_err(io_err("list", dir))? {
        let e = e.map_err(io_err("list", dir))?;
        let Some(name) = e.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if !name.starts_with(CHECKPOINT_PREFIX) {
            continue;
        }
        if name.ends_with(TMP_SUFFIX) {
            out.push(CheckpointEntry::Temporary(e.path()));
        } else if let Some(i) = parse_checkpoint_name(&name) {
            done.push((i, e.path()));
        }
    }
    done.sort();
    out.extend(done.into_iter().map(|(i, p)| CheckpointEntry::Done(i, p)));
    Ok(out)
}

/// Every record of `path` (a segment that must be intact), in order.
fn for_each_record(path: &Path, mut f: impl FnMut(Record)) -> Result<()> {
    let mut r = SegmentReader::open(path).map_err(io_err("open", path))?;
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
    dir: &Path,
    last: u64,
    keep: impl Fn(SeriesRef) -> bool,
    mint: i64,
) -> Result<CheckpointStats> {
    let mut inputs: Vec<PathBuf> = Vec::new();
    for e in checkpoint_dir_entries(dir)? {
        if let CheckpointEntry::Done(i, p) = e {
            if i <= last {
                inputs = list_segments(&p)?.into_iter().map(|s| segment_path(&p, s)).collect();
            }
        }
    }
    inputs.extend(list_segments(dir)?.into_iter().filter(|&s| s <= last).map(|s| segment_path(dir, s)));

    let final_dir = dir.join(checkpoint_name(last));
    let tmp_dir = dir.join(format!("{}{TMP_SUFFIX}", checkpoint_name(last)));
    if tmp_dir.exists() {
        fs::remove_dir_all(&tmp_dir).map_err(io_err("remove", &tmp_dir))?;
    }
    create_dir_all(&tmp_dir)?;
    let out_path = segment_path(&tmp_dir, 0);
    let mut out = File::create(&out_path).map_err(io_err("create", &out_path))?;
    let mut buf = segment_header().to_vec();
    let mut stats = CheckpointStats { path: final_dir.clone(), ..Default::default() };
    let mut series: Vec<RefSeries> = Vec::new();
    let mut samples: Vec<RefSample> = Vec::new();
    let mut body = Vec::new();

    let flush = |buf: &mut Vec<u8>, out: &mut File, force: bool| -> Result<()> {
        if force || buf.len() >= 1 << 20 {
            out.write_all(buf).map_err(io_err("write", &out_path))?;
            buf.clear();
        }
        Ok(())
    };

    for input in &inputs {
        let mut err = None;
        for_each_record(input, |rec| {
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
                        if keep(s.series) && s.t >= mint {
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
                    if !series.is_empty() {
                        body.clear();
                        record::encode_series(series.iter().map(|s| (s.series, &s.labels)), &mut body);
                        frame_record(&body, &mut buf);
                        series.clear();
                    }
                    let total = v.len() as u64;
                    let kept: Vec<_> = v.into_iter().filter(|s| keep(s.series) && s.t >= mint).collect();
                    stats.samples_kept += kept.len() as u64;
                    stats.samples_dropped += total - kept.len() as u64;
                    if !kept.is_empty() {
                        body.clear();
                        record::encode_histograms(&kept, &mut body);
                        frame_record(&body, &mut buf);
                    }
                }
                Record::Tombstones(v) => {
                    // Tombstones must follow the series they refer to.
                    if !series.is_empty() {
                        body.clear();
                        record::encode_series(series.iter().map(|s| (s.series, &s.labels)), &mut body);
                        frame_record(&body, &mut buf);
                        series.clear();
                    }
                    let kept: Vec<_> = v.into_iter().filter(|t| keep(t.series) && t.maxt >= mint).collect();
                    stats.tombstones_kept += kept.len() as u64;
                    if !kept.is_empty() {
                        body.clear();
                        record::encode_tombstones(&kept, &mut body);
                        frame_record(&body, &mut buf);
                    }
                }
            }
            // Series before samples: a series record always precedes samples that use it.
            if series.len() >= SERIES_PER_RECORD || (!samples.is_empty() && !series.is_empty()) {
                body.clear();
                record::encode_series(series.iter().map(|s| (s.series, &s.labels)), &mut body);
                frame_record(&body, &mut buf);
                series.clear();
            }
            if samples.len() >= SAMPLES_PER_RECORD {
                body.clear();
                record::encode_samples(&samples, &mut body);
                frame_record(&body, &mut buf);
                samples.clear();
            }
            if let Err(e) = flush(&mut buf, &mut out, false) {
                err.get_or_insert(e);
            }
        })?;
        if let Some(e) = err {
            return Err(e);
        }
    }
    if !series.is_empty() {
        body.clear();
        record::encode_series(series.iter().map(|s| (s.series, &s.labels)), &mut body);
        frame_record(&body, &mut buf);
    }
    if !samples.is_empty() {
        body.clear();
        record::encode_samples(&samples, &mut body);
        frame_record(&body, &mut buf);
    }
    flush(&mut buf, &mut out, true)?;
    out.sync_all().map_err(io_err("fsync", &out_path))?;
    drop(out);
    fsync_dir(&tmp_dir)?;
    rename_durable(&tmp_dir, &final_dir)?;
    Ok(stats)
}

/// Deletes segments `<= last` and checkpoints older than `last`, now that `checkpoint.{last}` is
/// durable.
pub(super) fn remove_replaced(dir: &Path, last: u64) -> Result<()> {
    for s in list_segments(dir)?.into_iter().filter(|&s| s <= last) {
        let p = segment_path(dir, s);
        fs::remove_file(&p).map_err(io_err("remove", &p))?;
    }
    for e in checkpoint_dir_entries(dir)? {
        if let CheckpointEntry::Done(i, p) = e {
            if i < last {
                fs::remove_dir_all(&p).map_err(io_err("remove", &p))?;
            }
        }
    }
    fsync_dir(dir)
}
