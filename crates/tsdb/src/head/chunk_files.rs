//! Head chunk files: closed head chunks written out of the heap, into `<data>/chunks_head/`.
//!
//! Why: a closed chunk never changes again, so keeping it on the heap costs memory for nothing,
//! and keeping its samples in the write-ahead log costs disk for nothing (about 4 bytes a sample
//! there, about 1 in a dense chunk). Each flush (`Head::persist_chunks`) writes the chunks
//! closed since the last one into one new file, whole: as `NNNNNNNN.tmp`, fsynced, renamed,
//! the directory fsynced; only then is the file mapped and do the series point into the
//! mapping, and only then may a WAL checkpoint drop the samples it holds. A file is deleted
//! once head truncation has dropped every chunk in it. Format: `docs/format/chunks_head.md`.
//!
//! Files are deleted whole, so one may still hold chunks a head cut has since persisted in a
//! block (and whose deletions the WAL no longer has): the cut records its time in the file
//! `start` first, and chunks ending before it are never read back.
//!
//! A file whose checksums fail at open is set aside (renamed `.corrupt`), loudly; the entries
//! before the damage are copied into a new file first, so no intact chunk is lost.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use strata_model::SeriesRef;

use super::series::{ChunkMeta, HeadChunkBytes};
use crate::error::{io_err, Result};
use crate::vfs::{AppendFile, Vfs};

/// Name of the directory, inside the data directory.
pub const CHUNKS_HEAD_DIR: &str = "chunks_head";
pub const MAGIC: [u8; 4] = *b"STHC";
pub const VERSION: u8 = 1;
pub const HEADER_BYTES: usize = 8;
/// Series reference, first and last timestamp, data length.
const ENTRY_HEAD_BYTES: usize = 8 + 8 + 8 + 4;
const CRC_BYTES: usize = 4;
const TMP_SUFFIX: &str = ".tmp";
/// The file holding the head's start: chunks ending before it are obsolete.
const START_FILE: &str = "start";
const CORRUPT_SUFFIX: &str = ".corrupt";
/// Bytes gathered before each write to the file.
const WRITE_BUFFER_BYTES: usize = 1 << 20;
/// A chunk longer than this is not a head chunk (they are cut near 1 KiB; a histogram chunk
/// may hold a few large samples): the reader takes it for damage.
pub const CHUNK_BYTES_MAX: usize = 1 << 24;

pub fn file_name(index: u64) -> String {
    format!("{index:08}")
}

fn parse_file_name(name: &str) -> Option<u64> {
    (name.len() == 8 && name.bytes().all(|b| b.is_ascii_digit())).then(|| name.parse().ok()).flatten()
}

/// One intact entry of a file: where its data lies in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub series: SeriesRef,
    pub mint: i64,
    pub maxt: i64,
    pub start: usize,
    pub len: usize,
}

/// Why a file's bytes stop being entries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FileError {
    #[error("bad header: {0}")]
    Header(String),
    #[error("entry at byte {offset}: {reason}")]
    Entry { offset: usize, reason: String },
}

/// The entries of a file's bytes, in order, up to the first damaged one (and its error).
pub fn parse(bytes: &[u8]) -> (Vec<Entry>, Option<FileError>) {
    if bytes.len() < HEADER_BYTES {
        return (Vec::new(), Some(FileError::Header(format!("{} bytes, shorter than the header", bytes.len()))));
    }
    if bytes[..4] != MAGIC {
        return (Vec::new(), Some(FileError::Header(format!("magic {:02x?}", &bytes[..4]))));
    }
    if bytes[4] != VERSION {
        return (Vec::new(), Some(FileError::Header(format!("unknown version {}", bytes[4]))));
    }
    let mut out = Vec::new();
    let mut pos = HEADER_BYTES;
    while pos < bytes.len() {
        let bad = |reason: String| Some(FileError::Entry { offset: pos, reason });
        let Some(head) = bytes.get(pos..pos + ENTRY_HEAD_BYTES) else {
            return (out, bad(format!("{} bytes left, less than an entry header", bytes.len() - pos)));
        };
        let u64_at = |i: usize| u64::from_le_bytes(head[i..i + 8].try_into().expect("8 bytes"));
        let len = u32::from_le_bytes(head[24..28].try_into().expect("4 bytes")) as usize;
        if len == 0 || len > CHUNK_BYTES_MAX {
            return (out, bad(format!("chunk length {len}")));
        }
        let start = pos + ENTRY_HEAD_BYTES;
        let Some(crc_bytes) = bytes.get(start + len..start + len + CRC_BYTES) else {
            return (out, bad(format!("chunk of {len} bytes runs past the end of the file")));
        };
        let want = u32::from_le_bytes(crc_bytes.try_into().expect("4 bytes"));
        // Under the fuzzer every checksum passes, so mutations reach the checks behind it.
        if !cfg!(fuzzing) && crc32c::crc32c(&bytes[pos..start + len]) != want {
            return (out, bad("checksum mismatch".into()));
        }
        let (mint, maxt) = (u64_at(8) as i64, u64_at(16) as i64);
        if mint > maxt {
            return (out, bad(format!("time range {mint}..{maxt} is reversed")));
        }
        out.push(Entry { series: SeriesRef(u64_at(0)), mint, maxt, start, len });
        pos = start + len + CRC_BYTES;
    }
    (out, None)
}

#[derive(Debug, Clone, Copy)]
struct FileInfo {
    /// Newest timestamp of any chunk in the file: the file goes once the head is cut past it.
    maxt: i64,
    bytes: u64,
}

/// The chunks found at open, by series, oldest first.
pub type Loaded = HashMap<SeriesRef, Vec<ChunkMeta>>;

/// The head's chunk files.
#[derive(Debug)]
pub struct ChunkFiles {
    fs: Arc<dyn Vfs>,
    dir: PathBuf,
    state: Mutex<FilesState>,
}

#[derive(Debug, Default)]
struct FilesState {
    next: u64,
    files: BTreeMap<u64, FileInfo>,
}

impl ChunkFiles {
    /// Opens `dir` (creating it): removes unfinished files, maps the others and returns their
    /// chunks; a damaged file is set aside after its intact entries were copied.
    pub fn open(fs: Arc<dyn Vfs>, dir: &Path) -> Result<(ChunkFiles, Loaded)> {
        fs.create_dir_all(dir).map_err(io_err("create directory", dir))?;
        let mut indexes = Vec::new();
        for e in fs.list(dir).map_err(io_err("list", dir))? {
            if e.is_dir {
                continue;
            }
            let path = dir.join(&e.name);
            if e.name.ends_with(TMP_SUFFIX) {
                fs.remove_file(&path).map_err(io_err("remove", &path))?;
            } else if let Some(i) = parse_file_name(&e.name) {
                indexes.push(i);
            }
        }
        indexes.sort_unstable();
        let start = read_start(&*fs, &dir.join(START_FILE))?;
        let files = ChunkFiles {
            fs,
            dir: dir.to_owned(),
            state: Mutex::new(FilesState { next: indexes.last().map_or(0, |i| i + 1), files: BTreeMap::new() }),
        };
        let mut loaded: Loaded = HashMap::new();
        for i in indexes {
            let path = dir.join(file_name(i));
            let bytes = files.fs.map(&path).map_err(io_err("map", &path))?;
            let (entries, err) = parse(&bytes);
            match err {
                None => {
                    let mapped = Arc::new(bytes);
                    files.add_file(i, &entries, mapped.len() as u64);
                    for e in &entries {
                        loaded.entry(e.series).or_default().push(ChunkMeta {
                            mint: e.mint,
                            maxt: e.maxt,
                            data: HeadChunkBytes::mapped(&mapped, e.start, e.len),
                        });
                    }
                }
                Some(err) => {
                    tracing::error!(
                        file = %path.display(), error = %err, intact_chunks = entries.len(),
                        "head chunk file is damaged: its intact chunks are copied to a new file and it is set aside; \
                         chunks after the damage are lost unless the write-ahead log still holds their samples"
                    );
                    let mut w = files.writer()?;
                    for e in &entries {
                        w.add(e.series, e.mint, e.maxt, &bytes[e.start..e.start + e.len])?;
                    }
                    let placed = w.placed.clone();
                    if let Some(mapped) = w.finish()? {
                        for (p, e) in placed.iter().zip(&entries) {
                            loaded.entry(e.series).or_default().push(ChunkMeta {
                                mint: e.mint,
                                maxt: e.maxt,
                                data: HeadChunkBytes::mapped(&mapped, p.start, p.len),
                            });
                        }
                    }
                    let aside = dir.join(format!("{}{CORRUPT_SUFFIX}", file_name(i)));
                    files.fs.rename(&path, &aside).map_err(io_err("rename to", &aside))?;
                    files.fs.fsync_dir(dir).map_err(io_err("fsync directory", dir))?;
                }
            }
        }
        for chunks in loaded.values_mut() {
            chunks.retain(|c| c.maxt >= start);
            chunks.sort_by_key(|c| c.mint);
            // A series rebuilt after a replay merge may have had its chunks written twice; the
            // first of overlapping chunks is the older, the one kept.
            let mut last = i64::MIN;
            chunks.retain(|c| {
                let keep = last == i64::MIN || c.mint > last;
                if keep {
                    last = c.maxt;
                }
                keep
            });
        }
        loaded.retain(|_, chunks| !chunks.is_empty());
        Ok((files, loaded))
    }

    /// Records durably that chunks ending before `mint` are obsolete (a head cut wrote them into
    /// a block): they are not read back even while their file remains.
    pub fn set_start(&self, mint: i64) -> Result<()> {
        let mut body = mint.to_le_bytes().to_vec();
        body.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        let (tmp, path) = (self.dir.join(format!("{START_FILE}{TMP_SUFFIX}")), self.dir.join(START_FILE));
        self.fs.write_synced(&tmp, &body).map_err(io_err("write", &tmp))?;
        crate::fsutil::rename_durable(&*self.fs, &tmp, &path)
    }

    fn add_file(&self, index: u64, entries: &[Entry], bytes: u64) {
        let maxt = entries.iter().map(|e| e.maxt).max().unwrap_or(i64::MIN);
        self.state.lock().files.insert(index, FileInfo { maxt, bytes });
    }

    /// Starts a new file.
    pub fn writer(&self) -> Result<FileWriter<'_>> {
        let index = {
            let mut st = self.state.lock();
            st.next += 1;
            st.next - 1
        };
        let tmp = self.dir.join(format!("{}{TMP_SUFFIX}", file_name(index)));
        let file = self.fs.create(&tmp).map_err(io_err("create", &tmp))?;
        let mut buf = Vec::with_capacity(WRITE_BUFFER_BYTES + CHUNK_BYTES_MAX.min(1 << 16));
        buf.extend_from_slice(&MAGIC);
        buf.extend_from_slice(&[VERSION, 0, 0, 0]);
        Ok(FileWriter {
            files: self,
            index,
            tmp,
            file,
            buf,
            written: 0,
            placed: Vec::new(),
            maxt: i64::MIN,
            finished: false,
        })
    }

    /// Deletes the files whose every chunk ends before `mint`; returns how many went.
    pub fn remove_before(&self, mint: i64) -> Result<usize> {
        let gone: Vec<u64> = {
            let st = self.state.lock();
            st.files.iter().filter(|(_, f)| f.maxt < mint).map(|(&i, _)| i).collect()
        };
        for &i in &gone {
            let path = self.dir.join(file_name(i));
            // Chunks still held by a query keep reading the mapping; Unix frees it after.
            self.fs.remove_file(&path).map_err(io_err("remove", &path))?;
            self.state.lock().files.remove(&i);
        }
        if !gone.is_empty() {
            self.fs.fsync_dir(&self.dir).map_err(io_err("fsync directory", &self.dir))?;
        }
        Ok(gone.len())
    }

    /// Files and their bytes.
    pub fn usage(&self) -> (usize, u64) {
        let st = self.state.lock();
        (st.files.len(), st.files.values().map(|f| f.bytes).sum())
    }
}

/// The head's start recorded by `set_start`; `i64::MIN` when none was. A damaged record is
/// reported and read as none: old chunks are then read back (and deduplicated against the
/// blocks by queries), which loses nothing.
fn read_start(fs: &dyn Vfs, path: &Path) -> Result<i64> {
    if !fs.exists(path) {
        return Ok(i64::MIN);
    }
    let body = fs.read(path).map_err(io_err("read", path))?;
    if body.len() == 12 && crc32c::crc32c(&body[..8]).to_le_bytes() == body[8..] {
        return Ok(i64::from_le_bytes(body[..8].try_into().expect("8 bytes")));
    }
    tracing::error!(file = %path.display(), bytes = body.len(), "head chunk files' start record is damaged; ignored");
    Ok(i64::MIN)
}

/// Where the writer put one chunk's data.
#[derive(Debug, Clone, Copy)]
pub struct Placed {
    pub start: usize,
    pub len: usize,
}

/// Writes one new file.
#[derive(Debug)]
pub struct FileWriter<'a> {
    files: &'a ChunkFiles,
    index: u64,
    tmp: PathBuf,
    file: Arc<dyn AppendFile>,
    buf: Vec<u8>,
    /// Bytes written to the file before `buf`.
    written: usize,
    placed: Vec<Placed>,
    maxt: i64,
    /// Set once the file is named (or was removed because it was empty).
    finished: bool,
}

impl Drop for FileWriter<'_> {
    /// A writer given up on (a write failed) removes its temporary file, so that failing
    /// rounds do not pile them up until the next open.
    fn drop(&mut self) {
        if !self.finished {
            let _ = self.files.fs.remove_file(&self.tmp);
        }
    }
}

impl FileWriter<'_> {
    /// Appends one chunk; returns where its data will be in the file.
    pub fn add(&mut self, series: SeriesRef, mint: i64, maxt: i64, data: &[u8]) -> Result<Placed> {
        assert!(!data.is_empty() && data.len() <= CHUNK_BYTES_MAX, "head chunk of {} bytes", data.len());
        assert!(mint <= maxt, "chunk time range {mint}..{maxt} is reversed");
        let entry_at = self.buf.len();
        self.buf.extend_from_slice(&series.0.to_le_bytes());
        self.buf.extend_from_slice(&mint.to_le_bytes());
        self.buf.extend_from_slice(&maxt.to_le_bytes());
        self.buf.extend_from_slice(&(data.len() as u32).to_le_bytes());
        self.buf.extend_from_slice(data);
        let crc = crc32c::crc32c(&self.buf[entry_at..]);
        self.buf.extend_from_slice(&crc.to_le_bytes());
        let placed = Placed { start: self.written + entry_at + ENTRY_HEAD_BYTES, len: data.len() };
        self.placed.push(placed);
        self.maxt = self.maxt.max(maxt);
        if self.buf.len() >= WRITE_BUFFER_BYTES {
            self.flush()?;
        }
        Ok(placed)
    }

    fn flush(&mut self) -> Result<()> {
        self.file.write_all(&self.buf).map_err(io_err("write", &self.tmp))?;
        self.written += self.buf.len();
        self.buf.clear();
        Ok(())
    }

    /// Chunks added so far.
    pub fn len(&self) -> usize {
        self.placed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.placed.is_empty()
    }

    /// Makes the file durable under its name and maps it; `None` (and no file) when nothing was
    /// added. The mapping holds every added chunk where `add` said.
    pub fn finish(mut self) -> Result<Option<Arc<Bytes>>> {
        let fs = &self.files.fs;
        if self.placed.is_empty() {
            self.finished = true;
            fs.remove_file(&self.tmp).map_err(io_err("remove", &self.tmp))?;
            return Ok(None);
        }
        self.flush()?;
        self.file.sync_data().map_err(io_err("fsync", &self.tmp))?;
        let path = self.files.dir.join(file_name(self.index));
        fs.rename(&self.tmp, &path).map_err(io_err("rename to", &path))?;
        self.finished = true;
        // Listed from here on, so that a cut deletes it even if a later step fails (its chunks
        // are then written again into another file; the copies are deduplicated at open).
        let bytes = self.written as u64;
        self.files.state.lock().files.insert(self.index, FileInfo { maxt: self.maxt, bytes });
        fs.fsync_dir(&self.files.dir).map_err(io_err("fsync directory", &self.files.dir))?;
        let mapped = fs.map(&path).map_err(io_err("map", &path))?;
        if mapped.len() != self.written {
            let e = std::io::Error::other(format!("{} bytes mapped, {} written", mapped.len(), self.written));
            return Err(io_err("map", &path)(e));
        }
        Ok(Some(Arc::new(mapped)))
    }
}

#[cfg(test)]
mod tests;
