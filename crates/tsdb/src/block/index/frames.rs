//! Version 7's frames: the series pages (and the symbol table's groups), concatenated, cut into
//! *frames* of whole pages (groups) of about `FRAME_RAW_BYTES` each, every frame
//! zstd-compressed on its own (or stored as it is when zstd would not make it smaller). Byte
//! layout: `docs/format/block.md`.
//!
//! A series entry is a handful of small deltas that repeat from series to series (label ids one
//! apart, chunk refs a chunk's length apart, the same span), which the entry's own varints
//! cannot share: zstd takes 8.1 bytes per series down to 1.2 on a block of 20k Graphite paths,
//! where the whole index was a third of the block. A page is read from its frame, decompressed
//! once into the process-wide `GroupCache` (with the chunk groups, under one budget) and held
//! by the reader's `ReadCache` while it reads series of that frame, which series read in id
//! order do frame after frame.

use std::sync::Arc;

use crate::block::chunks::{decompress_group, Group, GroupCache};
use crate::encoding::{put_uvarint, Decoder};

/// A frame is closed after the page that takes its raw bytes to this many.
pub const FRAME_RAW_BYTES: usize = 16 << 10;
/// The group cache's key spaces of a reader: its series frames and its symbol frames.
pub(super) const SERIES_FRAMES: u32 = 0;
pub(super) const SYMBOL_FRAMES: u32 = 1;
/// A reader refuses a frame whose pages claim more raw bytes than this (a page of 32 series
/// with thousands of chunks each takes a few hundred KiB).
pub const FRAME_RAW_MAX: u64 = 1 << 30;
/// zstd level of frames. Measured with `zstd -N` over 16 KiB pieces of version-6 index sections
/// (series / symbols, bytes after compression): 20k carbon paths, level 2: 24,304 / 10,373,
/// level 3: 33,050 / 10,131, level 19: 24,564 / 8,671; 20k label sets of `20kseries.json`, level
/// 2: 316,484 / 75,542, level 3: 305,863 / 75,542. Level 2 takes a quarter off the paths'
/// entries and adds 3% to the label sets'.
const FRAME_ZSTD_LEVEL: i32 = 2;

/// Gathers units (series pages, symbol groups) into frames and compresses them.
pub(super) struct FrameWriter {
    compressor: zstd::bulk::Compressor<'static>,
    /// The open frame's raw bytes, and how many units it holds.
    raw: Vec<u8>,
    units: u64,
    /// Per frame closed so far: its units, raw length and stored length (0: stored as it is).
    rows: Vec<(u64, u64, u64)>,
}

impl std::fmt::Debug for FrameWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameWriter").field("raw", &self.raw.len()).field("frames", &self.rows.len()).finish()
    }
}

impl FrameWriter {
    pub(super) fn new() -> std::io::Result<Self> {
        Ok(FrameWriter {
            compressor: zstd::bulk::Compressor::new(FRAME_ZSTD_LEVEL)?,
            raw: Vec::with_capacity(FRAME_RAW_BYTES + (FRAME_RAW_BYTES >> 2)),
            units: 0,
            rows: Vec::new(),
        })
    }

    /// The open frame's raw bytes, for the next unit to be appended to.
    pub(super) fn raw(&mut self) -> &mut Vec<u8> {
        &mut self.raw
    }

    /// Ends a unit appended through `raw`; returns the frame's stored bytes when the unit closed
    /// it (to be written next in the file).
    pub(super) fn unit_done(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        self.units += 1;
        if self.raw.len() < FRAME_RAW_BYTES {
            return Ok(None);
        }
        self.close().map(Some)
    }

    /// Closes the open frame, if it holds a unit: its stored bytes.
    pub(super) fn finish(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        if self.units == 0 {
            return Ok(None);
        }
        self.close().map(Some)
    }

    /// The frame rows, `count uvarint` first, then per frame `units uvarint | [raw uvarint] |
    /// stored uvarint` (the raw length only `with_raw`: the page table knows its pages' lengths,
    /// the symbol table does not).
    pub(super) fn rows(&self, with_raw: bool, out: &mut Vec<u8>) {
        put_uvarint(out, self.rows.len() as u64);
        for &(units, raw, stored) in &self.rows {
            put_uvarint(out, units);
            if with_raw {
                put_uvarint(out, raw);
            }
            put_uvarint(out, stored);
        }
    }

    fn close(&mut self) -> std::io::Result<Vec<u8>> {
        debug_assert!(self.units > 0);
        let compressed = self.compressor.compress(&self.raw)?;
        let raw = self.raw.len() as u64;
        // Stored: the compressed length, or 0 for a frame kept as it is.
        let stored = if compressed.len() < self.raw.len() {
            self.rows.push((self.units, raw, compressed.len() as u64));
            compressed
        } else {
            self.rows.push((self.units, raw, 0));
            self.raw.clone()
        };
        self.units = 0;
        self.raw.clear();
        Ok(stored)
    }
}

/// Where a frame is: its stored bytes in the file, compressed or not, and where its raw bytes
/// start among the pages' (the pages' offsets count raw bytes from the first page's start).
#[derive(Clone, Copy, Debug)]
pub(super) struct FrameRow {
    pub file_at: usize,
    pub file_len: usize,
    pub compressed: bool,
    pub raw_at: u64,
    pub raw_len: usize,
}

/// Reads the frame rows from `d` (after the page rows) for pages whose raw bounds are
/// `page_ends` (each page's end, in order), the frames being stored from byte `series_at` of
/// the file to byte `series_end`. Returns the rows and, per page, its frame.
pub(super) fn parse_rows(
    d: &mut Decoder<'_>,
    page_ends: &[u64],
    series_at: u64,
    series_end: u64,
) -> Result<(Vec<FrameRow>, Vec<u32>), String> {
    let count = d.uvarint("frame count").map_err(|e| e.to_string())?;
    if count > page_ends.len() as u64 {
        return Err(format!("{count} frames for {} pages", page_ends.len()));
    }
    let mut rows = Vec::with_capacity(count as usize);
    let mut frame_of = Vec::with_capacity(page_ends.len());
    let (mut file_at, mut raw_at) = (series_at, 0u64);
    for f in 0..count as u32 {
        let pages = d.uvarint("pages in the frame").map_err(|e| e.to_string())?;
        let stored = d.uvarint("frame length").map_err(|e| e.to_string())?;
        let first = frame_of.len();
        let last = (first as u64)
            .checked_add(pages)
            .filter(|&l| pages > 0 && l <= page_ends.len() as u64)
            .ok_or_else(|| format!("frame {f} holds {pages} pages past the last"))? as usize;
        frame_of.resize(last, f);
        let raw_end = page_ends[last - 1];
        let raw_len = Some(raw_end - raw_at)
            .filter(|&l| l <= FRAME_RAW_MAX)
            .ok_or_else(|| format!("frame {f} claims {} bytes", raw_end - raw_at))? as usize;
        let file_len = if stored == 0 { raw_len as u64 } else { stored };
        let file_end =
            file_at.checked_add(file_len).filter(|&e| e <= series_end).ok_or("a frame runs past the series")?;
        rows.push(FrameRow {
            file_at: file_at as usize,
            file_len: file_len as usize,
            compressed: stored != 0,
            raw_at,
            raw_len,
        });
        (file_at, raw_at) = (file_end, raw_end);
    }
    if frame_of.len() != page_ends.len() {
        return Err(format!("frames hold {} of {} pages", frame_of.len(), page_ends.len()));
    }
    if file_at != series_end {
        return Err("frames do not cover the series exactly".into());
    }
    Ok((rows, frame_of))
}

/// Bytes that hold a page: the mapped file (versions 3 to 6, and frames stored as they are)
/// or a decompressed frame, with the raw offset their first byte stands for.
#[derive(Clone, Debug)]
pub(super) enum PageBytes<'a> {
    Mapped {
        bytes: &'a [u8],
        base: u64,
    },
    /// Frame number `index`.
    Decompressed {
        frame: Arc<Group>,
        index: usize,
        base: u64,
    },
}

impl PageBytes<'_> {
    /// The bytes at raw offsets `[start, end)` (within what this holds).
    pub(super) fn range(&self, start: u64, end: u64) -> &[u8] {
        let (bytes, base) = match self {
            PageBytes::Mapped { bytes, base } => (*bytes, *base),
            PageBytes::Decompressed { frame, base, .. } => (frame.bytes(), *base),
        };
        &bytes[(start - base) as usize..(end - base) as usize]
    }
}

/// A compressed frame's raw bytes, from the group cache (`key`: the reader's, 0 for series
/// frames or 1 for symbol frames, the frame) or decompressed from `map` and cached.
pub(super) fn read(map: &[u8], row: &FrameRow, key: (u64, u32, u32)) -> Result<Arc<Group>, String> {
    if let Some(frame) = GroupCache::global().get(key) {
        return Ok(frame);
    }
    let stored = &map[row.file_at..row.file_at + row.file_len];
    let raw = decompress_group(stored, row.raw_len).filter(|r| r.len() == row.raw_len).ok_or_else(|| {
        let what = if key.1 == SYMBOL_FRAMES { "symbol" } else { "series" };
        format!("{what} frame {} does not decompress to its {} bytes", key.2, row.raw_len)
    })?;
    let frame = Arc::new(Group::whole(raw));
    GroupCache::global().insert_missed(key, frame.clone());
    Ok(frame)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::chunks::ChunkRef;
    use crate::block::index::{ChunkMetaRef, IndexFile, IndexWriter, ReadCache};
    use strata_model::{Labels, SeriesRef};

    /// An index of `n` Graphite paths, one chunk each (jittered times, refs a chunk apart), and
    /// what was written.
    fn graphite_index(path: &std::path::Path, n: usize) -> Vec<(Labels, ChunkMetaRef)> {
        let names: Vec<String> =
            (0..n).map(|i| format!("servers.dc{}.host-{:05}.cpu.cpu{}.user", i % 5, i / 40, i % 8)).collect();
        let mut symbols: Vec<Arc<str>> = names.iter().map(|s| Arc::from(s.as_str())).collect();
        symbols.push(Arc::from("__name__"));
        symbols.sort();
        symbols.dedup();
        let mut series: Vec<Labels> = names.iter().map(|n| Labels::from_pairs([("__name__", n.as_str())])).collect();
        series.sort();
        series.dedup();
        let mut w = IndexWriter::create(&crate::vfs::OsFs, path, &symbols).unwrap();
        let mut written = Vec::new();
        for (i, labels) in series.into_iter().enumerate() {
            let mint = 1_700_000_000_000 + (i as i64 % 3) * 1000;
            let meta = ChunkMetaRef {
                mint,
                maxt: mint + 590_000,
                chunk: ChunkRef::in_group(1, 32 * (i as u64 / 200 + 1), i % 200),
            };
            w.add_series(&labels, &[meta]).unwrap();
            written.push((labels, meta));
        }
        w.finish().unwrap();
        written
    }

    /// One reader cache taking series from two indexes in turn, whose symbols have the same
    /// ids but other strings, gives each series its own index's labels (a reader's cache keeps
    /// the last symbol resolved at each label position, and must not take it for the other
    /// file's).
    #[test]
    fn one_reader_cache_across_indexes_keeps_each_ones_symbols() {
        let tmp = tempfile::tempdir().unwrap();
        let write = |name: &str, prefix: &str| {
            let path = tmp.path().join(name);
            let names: Vec<String> = (0..300).map(|i| format!("{prefix}.host-{i:04}.load")).collect();
            let mut symbols: Vec<Arc<str>> = names.iter().map(|s| Arc::from(s.as_str())).collect();
            symbols.push(Arc::from("__name__"));
            symbols.sort();
            let mut w = IndexWriter::create(&crate::vfs::OsFs, &path, &symbols).unwrap();
            let mut written = Vec::new();
            for (i, n) in names.iter().enumerate() {
                let labels = Labels::from_pairs([("__name__", n.as_str())]);
                let meta = ChunkMetaRef {
                    mint: 1000 * i as i64,
                    maxt: 1000 * i as i64 + 500,
                    chunk: ChunkRef::in_group(1, 32 * (i as u64 / 200 + 1), i % 200),
                };
                w.add_series(&labels, &[meta]).unwrap();
                written.push(labels);
            }
            w.finish().unwrap();
            (IndexFile::open(&crate::vfs::OsFs, &path).unwrap(), written)
        };
        let (a, b) = (write("a", "alpha"), write("b", "bravo"));
        let (mut shared, mut chunks) = (ReadCache::default(), Vec::new());
        for i in 0..300 {
            for (ix, written) in [&a, &b] {
                assert_eq!(ix.series(SeriesRef(i as u64), &mut chunks, &mut shared).unwrap(), written[i], "series {i}");
            }
        }
    }

    /// Every series of a many-frame index reads back, in order, backwards and scattered, with
    /// one reader cache or a fresh one each time; the frames are compressed, and a frame that
    /// is damaged fails the reads of its own series, named, and no other.
    #[test]
    fn series_read_back_from_their_frames() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("index");
        let written = graphite_index(&path, 20_000);
        let ix = IndexFile::open(&crate::vfs::OsFs, &path).unwrap();
        assert!(ix.frames.len() > 4 && ix.frames.iter().all(|f| f.compressed), "{:?}", ix.frames.len());
        let sizes = ix.section_sizes().unwrap();
        let raw: usize = ix.frames.iter().map(|f| f.raw_len).sum();
        assert!((sizes.series as usize) * 3 < raw, "series {} bytes stored for {raw} raw", sizes.series);
        let n = written.len();
        let orders: [Vec<usize>; 3] =
            [(0..n).collect(), (0..n).rev().collect(), (0..n).map(|i| (i * 7919) % n).collect()];
        let mut chunks = Vec::new();
        for order in &orders {
            let mut shared = ReadCache::default();
            for &i in order {
                let (labels, meta) = &written[i];
                let got = ix.series(SeriesRef(i as u64), &mut chunks, &mut shared).unwrap();
                assert_eq!((&got, &chunks[..]), (labels, &[*meta][..]), "series {i}");
                if i % 97 == 0 {
                    let alone = ix.series(SeriesRef(i as u64), &mut chunks, &mut ReadCache::default()).unwrap();
                    assert_eq!(&alone, labels);
                }
            }
        }

        // Damage the middle frame's compressed bytes.
        let f = ix.frames.len() / 2;
        let row = ix.frames[f];
        let pages: Vec<usize> = (0..ix.pages.len()).filter(|&p| ix.pages[p].frame as usize == f).collect();
        drop(ix);
        let mut bytes = std::fs::read(&path).unwrap();
        for b in &mut bytes[row.file_at + row.file_len / 2..row.file_at + row.file_len / 2 + 8] {
            *b ^= 0x5a;
        }
        std::fs::write(&path, &bytes).unwrap();
        let ix = IndexFile::open(&crate::vfs::OsFs, &path).unwrap();
        // Pages before the damage may still decompress to their own bytes (their CRCs say so);
        // none reads wrong.
        let in_frame = |i: usize| pages.contains(&(i / crate::block::index::SERIES_PAGE));
        let mut failed = 0;
        for (i, (labels, _)) in written.iter().enumerate() {
            match ix.series(SeriesRef(i as u64), &mut chunks, &mut ReadCache::default()) {
                Ok(got) => assert_eq!(&got, labels, "series {i}"),
                Err(e) => {
                    assert!(in_frame(i), "series {i}: {e}");
                    let named = e.contains(&format!("series {i}:"));
                    assert!(named && (e.contains("series frame") || e.contains("checksum mismatch")), "{e}");
                    failed += 1;
                }
            }
        }
        assert!(failed > 0, "the damaged frame went unnoticed");
    }

    /// Pages of every size go into frames of whole pages; the rows read back to the same
    /// frames, and rows that do not fit the pages are refused.
    #[test]
    fn frames_hold_whole_pages_and_rows_read_back() {
        let mut w = FrameWriter::new().unwrap();
        let mut file = Vec::new();
        let mut ends = Vec::new();
        let mut raw = Vec::new();
        for p in 0..40u64 {
            // Repetitive pages (compressed) and two of noise: the second, a frame alone, is kept as it is.
            let page: Vec<u8> = if p == 17 || p == 18 {
                let mut x = 0x2545_f491_4f6c_dd1d_u64 + p;
                (0..FRAME_RAW_BYTES * 2)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x as u8
                    })
                    .collect()
            } else {
                (0..(p * 97) % 5000).map(|i| (i % 7) as u8).collect()
            };
            w.raw().extend_from_slice(&page);
            raw.extend_from_slice(&page);
            ends.push(raw.len() as u64);
            if let Some(stored) = w.unit_done().unwrap() {
                file.extend_from_slice(&stored);
            }
        }
        if let Some(stored) = w.finish().unwrap() {
            file.extend_from_slice(&stored);
        }
        let mut rows = Vec::new();
        w.rows(false, &mut rows);
        let (frames, frame_of) = parse_rows(&mut Decoder::new(&rows), &ends, 0, file.len() as u64).unwrap();
        assert!(frames.len() > 2 && frames.iter().any(|f| !f.compressed) && frames.iter().any(|f| f.compressed));
        assert!(frame_of.windows(2).all(|w| w[1] == w[0] || w[1] == w[0] + 1));
        for (f, row) in frames.iter().enumerate() {
            let stored = &file[row.file_at..row.file_at + row.file_len];
            let got = if row.compressed { decompress_group(stored, row.raw_len).unwrap() } else { stored.to_vec() };
            assert_eq!(got, raw[row.raw_at as usize..row.raw_at as usize + row.raw_len], "frame {f}");
        }
        // The stored bytes must end where the series do, and the pages must all be held.
        assert!(parse_rows(&mut Decoder::new(&rows), &ends, 0, file.len() as u64 + 1).is_err());
        assert!(parse_rows(&mut Decoder::new(&rows), &ends[..ends.len() - 1], 0, file.len() as u64).is_err());
        let mut extra = ends.clone();
        extra.push(raw.len() as u64 + 10);
        assert!(parse_rows(&mut Decoder::new(&rows), &extra, 0, file.len() as u64)
            .unwrap_err()
            .contains("frames hold 40 of 41 pages"));
    }
}
