//! A block's `chunks/` directory: numbered segment files holding chunks back to back, each
//! checked by its own CRC32C. A chunk is addressed by a [`ChunkRef`]: segment number and byte
//! offset. Byte layout: `docs/format/block.md`.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use crate::chunkenc::ChunkError;
use crate::encoding::{put_uvarint, Decoder};
use crate::error::{io_err, Error, Result};
use crate::fsutil::{create_dir_all, fsync_dir};
use crate::vfs::{AppendWriter, Vfs};

/// "STCH": Strata chunks.
pub const MAGIC: u32 = 0x5354_4348;
pub const VERSION: u8 = 1;
/// Magic (4), version (1), three zero bytes.
pub const HEADER_BYTES: usize = 8;
/// A segment is closed once it reaches this size, so offsets fit in 32 bits with room to spare.
pub const SEGMENT_BYTES_MAX: u64 = 512 << 20;
pub const CHUNKS_DIR: &str = "chunks";

/// Where a chunk lives: `segment << 32 | offset`. Segment numbers start at 1, so a zero ref
/// is never valid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChunkRef(pub u64);

impl ChunkRef {
    pub fn new(segment: u32, offset: u32) -> Self {
        ChunkRef((segment as u64) << 32 | offset as u64)
    }
    pub fn segment(self) -> u32 {
        (self.0 >> 32) as u32
    }
    pub fn offset(self) -> u32 {
        self.0 as u32
    }
}

pub fn segment_name(segment: u32) -> String {
    format!("{segment:06}")
}

fn header() -> [u8; HEADER_BYTES] {
    super::file_header(MAGIC, VERSION)
}

/// Appends chunks to `dir/chunks/NNNNNN`, cutting a new segment past `SEGMENT_BYTES_MAX`.
#[derive(Debug)]
pub struct ChunkWriter {
    fs: Arc<dyn Vfs>,
    dir: PathBuf,
    segment: u32,
    file: Option<BufWriter<AppendWriter>>,
    offset: u64,
    bytes_total: u64,
    scratch: Vec<u8>,
}

impl ChunkWriter {
    /// Creates `block_dir/chunks/`.
    pub fn create(fs: &Arc<dyn Vfs>, block_dir: &Path) -> Result<Self> {
        let dir = block_dir.join(CHUNKS_DIR);
        create_dir_all(&**fs, &dir)?;
        Ok(ChunkWriter { fs: fs.clone(), dir, segment: 0, file: None, offset: 0, bytes_total: 0, scratch: Vec::new() })
    }

    /// Writes one chunk (its encoding byte first) and returns where it went.
    pub fn write(&mut self, chunk: &[u8]) -> Result<ChunkRef> {
        self.scratch.clear();
        put_uvarint(&mut self.scratch, chunk.len() as u64);
        let entry = self.scratch.len() as u64 + chunk.len() as u64 + 4;
        if self.file.is_none() || self.offset + entry > SEGMENT_BYTES_MAX {
            self.cut()?;
        }
        let r = ChunkRef::new(self.segment, self.offset as u32);
        let path = self.path();
        let f = self.file.as_mut().expect("a segment is open");
        f.write_all(&self.scratch)
            .and_then(|_| f.write_all(chunk))
            .and_then(|_| f.write_all(&crc32c::crc32c(chunk).to_be_bytes()))
            .map_err(io_err("write chunk to", path))?;
        self.offset += entry;
        self.bytes_total += entry;
        Ok(r)
    }

    fn path(&self) -> PathBuf {
        self.dir.join(segment_name(self.segment))
    }

    fn close_segment(&mut self) -> Result<()> {
        if let Some(f) = self.file.take() {
            let path = self.path();
            let f = f.into_inner().map_err(|e| io_err("flush", &path)(e.into_error()))?;
            f.0.sync_data().map_err(io_err("fsync", &path))?;
        }
        Ok(())
    }

    fn cut(&mut self) -> Result<()> {
        self.close_segment()?;
        self.segment += 1;
        let path = self.path();
        let f = self.fs.create(&path).map_err(io_err("create", &path))?;
        let mut f = BufWriter::with_capacity(1 << 20, AppendWriter(f));
        f.write_all(&header()).map_err(io_err("write header of", &path))?;
        self.file = Some(f);
        self.offset = HEADER_BYTES as u64;
        self.bytes_total += HEADER_BYTES as u64;
        Ok(())
    }

    /// Flushes and fsyncs every segment and the directory; returns the bytes written.
    pub fn finish(mut self) -> Result<u64> {
        self.close_segment()?;
        fsync_dir(&*self.fs, &self.dir)?;
        Ok(self.bytes_total)
    }
}

/// Reads chunks from the memory-mapped segments of one block.
#[derive(Debug)]
pub struct ChunkReader {
    dir: PathBuf,
    /// Segment `n` is at index `n - 1`.
    segments: Vec<Bytes>,
    /// Set by the first failed read, so the owning block is set aside.
    failed: AtomicBool,
}

impl ChunkReader {
    /// Maps every segment and checks its header. Pages are read only when a chunk is. A
    /// failing disk is an `Error::Io` (the block may read fine later); a missing segment or a
    /// bad header is `Error::BlockCorrupt`.
    pub fn open(fs: &dyn Vfs, block_dir: &Path) -> Result<Self> {
        let dir = block_dir.join(CHUNKS_DIR);
        let corrupt = |reason: String| Error::BlockCorrupt { block: block_dir.to_owned(), reason };
        let mut names: Vec<u32> = Vec::new();
        match fs.list(&dir) {
            Ok(entries) => {
                names.extend(entries.iter().filter(|e| !e.is_dir).filter_map(|e| e.name.parse::<u32>().ok()))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(corrupt(format!("{} is missing", dir.display())))
            }
            Err(e) => return Err(io_err("list", &dir)(e)),
        }
        names.sort_unstable();
        let mut segments = Vec::with_capacity(names.len());
        for (i, n) in names.into_iter().enumerate() {
            if n as usize != i + 1 {
                return Err(corrupt(format!(
                    "{}: chunk segment {} is missing",
                    dir.display(),
                    segment_name(i as u32 + 1)
                )));
            }
            let path = dir.join(segment_name(n));
            let map = fs.map(&path).map_err(io_err("map", &path))?;
            if map.len() < HEADER_BYTES || map[..HEADER_BYTES] != header() {
                return Err(corrupt(format!("{}: bad chunk segment header", path.display())));
            }
            segments.push(map);
        }
        Ok(ChunkReader { dir, segments, failed: AtomicBool::new(false) })
    }

    /// The chunk at `r`, checked against its CRC32C.
    pub fn chunk(&self, r: ChunkRef) -> Result<&[u8], ChunkError> {
        let corrupt = |problem: &str| {
            self.failed.store(true, Ordering::Relaxed);
            ChunkError::Corrupt(format!(
                "{}/{} at byte {}: {problem}",
                self.dir.display(),
                segment_name(r.segment()),
                r.offset()
            ))
        };
        let seg = (r.segment() as usize).checked_sub(1).and_then(|i| self.segments.get(i));
        let Some(seg) = seg else { return Err(corrupt("no such segment")) };
        let start = r.offset() as usize;
        if start < HEADER_BYTES || start >= seg.len() {
            return Err(corrupt("offset outside the segment"));
        }
        let mut d = Decoder::new(&seg[start..]);
        let len = d.uvarint("chunk length").map_err(|e| corrupt(&e.to_string()))? as usize;
        let data = d.bytes(len, "chunk").map_err(|e| corrupt(&e.to_string()))?;
        let crc = d.bytes(4, "chunk checksum").map_err(|e| corrupt(&e.to_string()))?;
        if crc32c::crc32c(data).to_be_bytes() != crc {
            return Err(corrupt("checksum mismatch"));
        }
        Ok(data)
    }

    /// Whether a read failed its checks.
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    /// Bytes of all segments (for `analyze` and size-based retention).
    pub fn bytes(&self) -> u64 {
        self.segments.iter().map(|m| m.len() as u64).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_round_trip_and_corruption_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let fs = crate::vfs::OsFs::shared();
        let mut w = ChunkWriter::create(&fs, tmp.path()).unwrap();
        let a = w.write(&[1, 0, 1, 0xaa]).unwrap();
        let b = w.write(&[1, 0, 2, 0xbb, 0xcc]).unwrap();
        assert_eq!(a, ChunkRef::new(1, 8));
        assert_eq!(b, ChunkRef::new(1, 8 + 1 + 4 + 4));
        let bytes = w.finish().unwrap();
        assert_eq!(bytes, 8 + 9 + 10);
        let r = ChunkReader::open(&*fs, tmp.path()).unwrap();
        assert_eq!(r.chunk(a).unwrap(), &[1, 0, 1, 0xaa]);
        assert_eq!(r.chunk(b).unwrap(), &[1, 0, 2, 0xbb, 0xcc]);
        assert!(r.chunk(ChunkRef::new(2, 8)).is_err());
        assert!(r.chunk(ChunkRef::new(1, 1000)).is_err());
        drop(r);

        let path = tmp.path().join("chunks/000001");
        let mut data = std::fs::read(&path).unwrap();
        data[8 + 1 + 3] ^= 0x10;
        std::fs::write(&path, data).unwrap();
        let r = ChunkReader::open(&*fs, tmp.path()).unwrap();
        let err = r.chunk(a).unwrap_err().to_string();
        assert!(err.contains("chunks/000001 at byte 8: checksum mismatch"), "{err}");
        assert!(r.chunk(b).is_ok());
    }
}
