//! One WAL segment file: an 8-byte header, then framed records back to back.
//!
//! Frame: `[body length u32 LE][CRC32C u32 LE][body]`, where the CRC covers the four length bytes
//! and the body, so a flipped bit in either is caught. In a version-2 segment the body is an
//! encoding byte and the record, as it is or zstd-compressed; in a version-1 segment (written
//! before compression) the body is the record. Records never span segments. Byte layout in
//! `docs/format/wal.md`.

use std::cell::RefCell;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};

use crate::vfs::Vfs;

/// `"STWL"`: Strata write-ahead log.
pub const SEGMENT_MAGIC: [u8; 4] = *b"STWL";
/// The version written: frames with an encoding byte.
pub const SEGMENT_VERSION: u8 = 2;
/// The first version (records as they are), still read.
pub const SEGMENT_VERSION_1: u8 = 1;
/// Header flag: the writer compressed its frames' records (when it paid).
pub const FLAG_ZSTD: u8 = 0x01;
/// Magic (4) + version (1) + flags (1) + reserved (2).
pub const SEGMENT_HEADER_BYTES: u64 = 8;
/// Length (4) + CRC (4).
pub const FRAME_HEADER_BYTES: u64 = 8;
/// A record body longer than this is taken for corruption (the head splits batches well below).
pub const RECORD_BYTES_MAX: u32 = 64 << 20;
/// Digits of a segment's file name.
const SEGMENT_NAME_DIGITS: usize = 8;

/// A version-2 frame's first body byte: how the record follows.
const ENCODING_PLAIN: u8 = 0;
const ENCODING_ZSTD: u8 = 1;
/// Records shorter than this are framed as they are: a series record or a small commit saves
/// a few bytes at most, for a compressor call.
const COMPRESS_MIN_BYTES: usize = 256;
/// zstd's level for frames. Measured on the node-exporter recording × 100 by remote write
/// (35.7M samples, 11.5 bytes per sample as records): level 1 gives 4.07 bytes per sample in
/// 36 ms of CPU per million samples, level 3 4.10, level 6 3.66 at three times the CPU, snappy
/// 6.1.
const ZSTD_LEVEL: i32 = 1;

pub fn segment_header(compression: bool) -> [u8; SEGMENT_HEADER_BYTES as usize] {
    let mut h = [0u8; SEGMENT_HEADER_BYTES as usize];
    h[..4].copy_from_slice(&SEGMENT_MAGIC);
    h[4] = SEGMENT_VERSION;
    h[5] = if compression { FLAG_ZSTD } else { 0 };
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

thread_local! {
    /// One compressor per writing thread, kept: creating one costs more than a frame.
    static COMPRESSOR: RefCell<Option<zstd::bulk::Compressor<'static>>> = const { RefCell::new(None) };
}

/// `record` compressed, when compression is on, the record is long enough and it pays.
fn compressed(record: &[u8], compression: bool) -> Option<Vec<u8>> {
    if !compression || record.len() < COMPRESS_MIN_BYTES {
        return None;
    }
    COMPRESSOR.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.is_none() {
            *cell = zstd::bulk::Compressor::new(ZSTD_LEVEL).ok();
        }
        let packed = cell.as_mut()?.compress(record).ok()?;
        (packed.len() < record.len()).then_some(packed)
    })
}

/// Appends `record` framed for a version-2 segment to `buf`: compressed when `compression` is
/// on and it pays, as it is otherwise.
pub fn frame_record(record: &[u8], compression: bool, buf: &mut Vec<u8>) {
    assert!(record.len() < RECORD_BYTES_MAX as usize, "record of {} bytes exceeds RECORD_BYTES_MAX", record.len());
    let packed = compressed(record, compression);
    let (encoding, payload) = match &packed {
        Some(p) => (ENCODING_ZSTD, p.as_slice()),
        None => (ENCODING_PLAIN, record),
    };
    let len = ((payload.len() + 1) as u32).to_le_bytes();
    let crc = crc32c::crc32c_append(crc32c::crc32c_append(crc32c::crc32c(&len), &[encoding]), payload);
    buf.reserve(FRAME_HEADER_BYTES as usize + 1 + payload.len());
    buf.extend_from_slice(&len);
    buf.extend_from_slice(&crc.to_le_bytes());
    buf.push(encoding);
    buf.extend_from_slice(payload);
}

/// Appends `record` framed for a version-1 segment (tests of reading old logs).
#[cfg(test)]
pub fn frame_record_v1(record: &[u8], buf: &mut Vec<u8>) {
    let len = (record.len() as u32).to_le_bytes();
    let crc = crc32c::crc32c_append(crc32c::crc32c(&len), record);
    buf.extend_from_slice(&len);
    buf.extend_from_slice(&crc.to_le_bytes());
    buf.extend_from_slice(record);
}

/// A version-1 segment header (tests of reading old logs).
#[cfg(test)]
pub fn segment_header_v1() -> [u8; SEGMENT_HEADER_BYTES as usize] {
    let mut h = [0u8; SEGMENT_HEADER_BYTES as usize];
    h[..4].copy_from_slice(&SEGMENT_MAGIC);
    h[4] = SEGMENT_VERSION_1;
    h
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
    /// The segment's version, once its header is read.
    version: u8,
    /// Start of the record last returned.
    pub record_offset: u64,
    /// The record last returned (decompressed).
    pub body: Vec<u8>,
    /// The frame body last read, before decoding.
    frame: Vec<u8>,
    decompressor: Option<zstd::bulk::Decompressor<'static>>,
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
        Ok(SegmentReader::over(path, BufReader::with_capacity(1 << 20, f), file_len))
    }

    /// A reader over a segment's bytes in memory (the fuzz target; `path` only names it in
    /// messages).
    pub fn from_bytes(path: &Path, bytes: Vec<u8>) -> Self {
        let file_len = bytes.len() as u64;
        SegmentReader::over(path, BufReader::new(Box::new(io::Cursor::new(bytes))), file_len)
    }

    fn over(path: &Path, r: BufReader<Box<dyn Read + Send>>, file_len: u64) -> Self {
        SegmentReader {
            r,
            path: path.to_owned(),
            file_len,
            offset: 0,
            version: 0,
            record_offset: 0,
            body: Vec::new(),
            frame: Vec::new(),
            decompressor: None,
        }
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
            if h[4] != SEGMENT_VERSION && h[4] != SEGMENT_VERSION_1 {
                return Ok(self.corrupt(format!("unknown segment version {}", h[4])));
            }
            self.version = h[4];
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
        self.frame.clear();
        self.frame.resize(len as usize, 0);
        self.r.read_exact(&mut self.frame)?;
        let got = crc32c::crc32c_append(crc32c::crc32c(&fh[..4]), &self.frame);
        if got != crc {
            return Ok(self.corrupt(format!("checksum mismatch: stored {crc:#010x}, computed {got:#010x}")));
        }
        if len == 0 {
            return Ok(self.corrupt("empty record"));
        }
        if let Err(why) = self.decode_frame() {
            return Ok(self.corrupt(why));
        }
        self.record_offset = self.offset;
        self.offset += FRAME_HEADER_BYTES + len as u64;
        Ok(Frame::Record)
    }

    /// The record of the frame just read, into `body`.
    fn decode_frame(&mut self) -> Result<(), String> {
        if self.version == SEGMENT_VERSION_1 {
            std::mem::swap(&mut self.body, &mut self.frame);
            return Ok(());
        }
        let (encoding, payload) = (self.frame[0], &self.frame[1..]);
        self.body.clear();
        match encoding {
            ENCODING_PLAIN if payload.is_empty() => Err("empty record".to_owned()),
            ENCODING_PLAIN => {
                self.body.extend_from_slice(payload);
                Ok(())
            }
            ENCODING_ZSTD => {
                // The frame says how long the record is; never more than a record may be.
                let size = match zstd::zstd_safe::get_frame_content_size(payload) {
                    Ok(Some(n)) if n > 0 && n <= u64::from(RECORD_BYTES_MAX) => n as usize,
                    Ok(Some(n)) => return Err(format!("compressed record of {n} bytes")),
                    _ => return Err("compressed record without a readable size".to_owned()),
                };
                if self.decompressor.is_none() {
                    self.decompressor = Some(zstd::bulk::Decompressor::new().map_err(|e| format!("zstd: {e}"))?);
                }
                let d = self.decompressor.as_mut().expect("set above");
                self.body.reserve(size);
                let n = d.decompress_to_buffer(payload, &mut self.body).map_err(|e| format!("zstd: {e}"))?;
                if n != size {
                    return Err(format!("compressed record gave {n} bytes where its frame says {size}"));
                }
                Ok(())
            }
            other => Err(format!("unknown record encoding {other}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header and frame layout of docs/format/wal.md.
    #[test]
    fn doc_layout_bytes() {
        assert_eq!(segment_header(true), [b'S', b'T', b'W', b'L', 2, 1, 0, 0]);
        assert_eq!(segment_header(false), [b'S', b'T', b'W', b'L', 2, 0, 0, 0]);
        // A short record is framed as it is, even with compression on.
        let mut buf = Vec::new();
        frame_record(&[2], true, &mut buf);
        assert_eq!(buf, [2, 0, 0, 0, 0xbe, 0xac, 0x9d, 0x6d, 0, 2]);
        assert_eq!(&buf[4..8], &crc32c::crc32c(&[2, 0, 0, 0, 0, 2]).to_le_bytes());
        // A long one is compressed: encoding byte 1, then a zstd frame.
        let record: Vec<u8> = std::iter::once(2).chain(std::iter::repeat_n(0, 999)).collect();
        let mut buf = Vec::new();
        frame_record(&record, true, &mut buf);
        assert!(buf.len() < 40, "{}", buf.len());
        assert_eq!(buf[8], 1);
        assert_eq!(&buf[9..13], &[0x28, 0xb5, 0x2f, 0xfd], "zstd's magic number");
        assert_eq!(segment_name(42), "00000042");
        assert_eq!(parse_segment_name("00000042"), Some(42));
        assert_eq!(parse_segment_name("checkpoint.00000042"), None);
    }
}
