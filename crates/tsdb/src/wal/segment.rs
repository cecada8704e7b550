//! One WAL segment file: an 8-byte header, then framed records back to back.
//!
//! Frame: `[body length u32 LE][CRC32C u32 LE][body]`, where the CRC covers the four length bytes
//! and the body, so a flipped bit in either is caught. Records never span segments. Byte layout
//! in `docs/format/wal.md`.

use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};

use crate::vfs::Vfs;

/// `"STWL"`: Strata write-ahead log.
pub const SEGMENT_MAGIC: [u8; 4] = *b"STWL";
pub const SEGMENT_VERSION: u8 = 1;
/// Magic (4) + version (1) + reserved (3).
pub const SEGMENT_HEADER_BYTES: u64 = 8;
/// Length (4) + CRC (4).
pub const FRAME_HEADER_BYTES: u64 = 8;
/// A record body longer than this is taken for corruption (the head splits batches well below).
pub const RECORD_BYTES_MAX: u32 = 64 << 20;
/// Digits of a segment's file name.
const SEGMENT_NAME_DIGITS: usize = 8;

pub fn segment_header() -> [u8; SEGMENT_HEADER_BYTES as usize] {
    let mut h = [0u8; SEGMENT_HEADER_BYTES as usize];
    h[..4].copy_from_slice(&SEGMENT_MAGIC);
    h[4] = SEGMENT_VERSION;
    h
}

pub fn segment_name(index: u64) -> String {
    format!("{index:0width$}", width = SEGMENT_NAME_DIGITS)
}

pub fn segment_path(dir: &Path, index: u64) -> PathBuf {
    dir.join(segment_name(index))
}

/// Parses a segment file name (all digits).
pub fn parse_segment_name(name: &str) -> Option<u64> {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    name.parse().ok()
}

/// Appends a framed record to `buf`.
pub fn frame_record(body: &[u8], buf: &mut Vec<u8>) {
    assert!(body.len() <= RECORD_BYTES_MAX as usize, "record of {} bytes exceeds RECORD_BYTES_MAX", body.len());
    let len = (body.len() as u32).to_le_bytes();
    let crc = crc32c::crc32c_append(crc32c::crc32c(&len), body);
    buf.extend_from_slice(&len);
    buf.extend_from_slice(&crc.to_le_bytes());
    buf.extend_from_slice(body);
}

/// Where and why reading a segment stopped early.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corruption {
    /// Byte offset of the first frame that is not valid; everything before it is good.
    pub offset: u64,
    pub reason: String,
}

/// What reading a segment's next frame gave.
#[derive(Debug)]
pub enum Frame {
    Record,
    End,
    Corrupt(Corruption),
}

/// Streams the records of one segment, checking each frame.
pub struct SegmentReader {
    r: BufReader<Box<dyn Read + Send>>,
    path: PathBuf,
    file_len: u64,
    offset: u64,
    /// Start of the record last returned.
    pub record_offset: u64,
    pub body: Vec<u8>,
}

impl std::fmt::Debug for SegmentReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentReader").field("path", &self.path).field("offset", &self.offset).finish()
    }
}

impl SegmentReader {
    /// Opens a segment. A missing or bad header is reported as corruption at offset 0 through the
    /// first `next` call, so the caller handles it like any torn segment.
    pub fn open(fs: &dyn Vfs, path: &Path) -> io::Result<Self> {
        let (f, file_len) = fs.open_read(path)?;
        Ok(SegmentReader {
            r: BufReader::with_capacity(1 << 20, f),
            path: path.to_owned(),
            file_len,
            offset: 0,
            record_offset: 0,
            body: Vec::new(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn corrupt(&self, reason: impl Into<String>) -> Frame {
        Frame::Corrupt(Corruption { offset: self.offset, reason: reason.into() })
    }

    /// Reads the next frame into `self.body`.
    pub fn next_frame(&mut self) -> io::Result<Frame> {
        if self.offset == 0 {
            if self.file_len < SEGMENT_HEADER_BYTES {
                return Ok(self.corrupt(format!("segment is {} bytes, shorter than its header", self.file_len)));
            }
            let mut h = [0u8; SEGMENT_HEADER_BYTES as usize];
            self.r.read_exact(&mut h)?;
            if h[..4] != SEGMENT_MAGIC {
                return Ok(self.corrupt("bad magic"));
            }
            if h[4] != SEGMENT_VERSION {
                return Ok(self.corrupt(format!("unknown segment version {}", h[4])));
            }
            self.offset = SEGMENT_HEADER_BYTES;
        }
        let left = self.file_len - self.offset;
        if left == 0 {
            return Ok(Frame::End);
        }
        if left < FRAME_HEADER_BYTES {
            return Ok(self.corrupt(format!("torn frame header ({left} bytes at end of segment)")));
        }
        let mut fh = [0u8; FRAME_HEADER_BYTES as usize];
        self.r.read_exact(&mut fh)?;
        let len = u32::from_le_bytes(fh[..4].try_into().expect("4 bytes"));
        let crc = u32::from_le_bytes(fh[4..].try_into().expect("4 bytes"));
        if len > RECORD_BYTES_MAX {
            return Ok(self.corrupt(format!("record length {len} exceeds the maximum {RECORD_BYTES_MAX}")));
        }
        if len as u64 > left - FRAME_HEADER_BYTES {
            return Ok(self.corrupt(format!("torn record: length {len} but {} bytes left", left - FRAME_HEADER_BYTES)));
        }
        self.body.clear();
        self.body.resize(len as usize, 0);
        self.r.read_exact(&mut self.body)?;
        let got = crc32c::crc32c_append(crc32c::crc32c(&fh[..4]), &self.body);
        if got != crc {
            return Ok(self.corrupt(format!("checksum mismatch: stored {crc:#010x}, computed {got:#010x}")));
        }
        if len == 0 {
            return Ok(self.corrupt("empty record"));
        }
        self.record_offset = self.offset;
        self.offset += FRAME_HEADER_BYTES + len as u64;
        Ok(Frame::Record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header and frame layout of docs/format/wal.md.
    #[test]
    fn doc_layout_bytes() {
        assert_eq!(segment_header(), [b'S', b'T', b'W', b'L', 1, 0, 0, 0]);
        let mut buf = Vec::new();
        frame_record(&[2], &mut buf);
        assert_eq!(buf.len() as u64, FRAME_HEADER_BYTES + 1);
        assert_eq!(&buf[..4], &1u32.to_le_bytes());
        let crc = crc32c::crc32c(&[1, 0, 0, 0, 2]);
        assert_eq!(&buf[4..8], &crc.to_le_bytes());
        assert_eq!(buf[8], 2);
        assert_eq!(segment_name(42), "00000042");
        assert_eq!(parse_segment_name("00000042"), Some(42));
        assert_eq!(parse_segment_name("checkpoint.00000042"), None);
    }
}
