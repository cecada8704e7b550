//! The storage engine's file-system calls, behind a trait, so that a test can put a simulated
//! disk under the real code: one that fails writes half-way, runs out of space, fails fsyncs
//! and reads, and forgets everything not yet fsynced when it "crashes" (`sim::SimFs`). The
//! server uses `OsFs`, plain `std::fs` and mmap.
//!
//! Only what the engine needs is here: append-only files (WAL segments, block files written
//! once), whole files read or mapped, directory listings, renames, hard links and directory
//! fsyncs.

pub mod sim;

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

/// A file open for appending. Methods take `&self` so that one handle can be fsynced by one
/// thread while another appends (group commit).
pub trait AppendFile: Send + Sync + fmt::Debug {
    /// Writes all of `buf` at the end. On error, any prefix of `buf` may have been written.
    fn write_all(&self, buf: &[u8]) -> io::Result<()>;
    /// Makes everything written so far durable.
    fn sync_data(&self) -> io::Result<()>;
    /// Cuts the file to `len` bytes (and makes the new length durable); later writes go after.
    fn truncate(&self, len: u64) -> io::Result<()>;
}

/// One entry of a directory listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub name: String,
    pub is_dir: bool,
}

/// The file-system operations of the write-ahead log.
pub trait Vfs: Send + Sync + fmt::Debug {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Creates `path` empty (truncating what was there) for appending.
    fn create(&self, path: &Path) -> io::Result<Arc<dyn AppendFile>>;
    /// Opens an existing file for reading from its start; returns it and its length.
    fn open_read(&self, path: &Path) -> io::Result<(Box<dyn Read + Send>, u64)>;
    /// Cuts an existing file to `len` bytes, durably.
    fn truncate(&self, path: &Path, len: u64) -> io::Result<()>;
    /// Makes an existing file's contents durable.
    fn sync_file(&self, path: &Path) -> io::Result<()>;
    /// The entries of `dir` (names that are not UTF-8 are skipped: the log never makes them).
    fn list(&self, dir: &Path) -> io::Result<Vec<DirEntry>>;
    fn exists(&self, path: &Path) -> bool;
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    fn remove_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Renames a file or directory within its parent.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes the entries created, renamed or removed in `dir` durable.
    fn fsync_dir(&self, dir: &Path) -> io::Result<()>;
    /// A whole file's bytes for reading in place. The file must not change while they are held
    /// (block files never do once renamed into place).
    fn map(&self, path: &Path) -> io::Result<Bytes>;
    /// A second name for an existing file (snapshots share block files).
    fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()>;
    fn file_len(&self, path: &Path) -> io::Result<u64>;
    /// Takes an exclusive lock on `path` (created if missing) for as long as the returned guard
    /// lives; `WouldBlock` if another holder has it.
    fn lock(&self, path: &Path) -> io::Result<Box<dyn fmt::Debug + Send + Sync>>;

    /// A whole file read into memory.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let (mut r, len) = self.open_read(path)?;
        let mut out = Vec::with_capacity(len as usize);
        r.read_to_end(&mut out)?;
        Ok(out)
    }

    /// Creates `path` with `data` and fsyncs it (not its directory).
    fn write_synced(&self, path: &Path, data: &[u8]) -> io::Result<()> {
        let f = self.create(path)?;
        f.write_all(data)?;
        f.sync_data()
    }
}

/// `io::Write` over an `AppendFile`, to put a `BufWriter` in front of it.
#[derive(Debug)]
pub struct AppendWriter(pub Arc<dyn AppendFile>);

impl Write for AppendWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write_all(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The real file system.
#[derive(Clone, Copy, Debug, Default)]
pub struct OsFs;

impl OsFs {
    pub fn shared() -> Arc<dyn Vfs> {
        Arc::new(OsFs)
    }
}

#[derive(Debug)]
struct OsFile(File);

impl AppendFile for OsFile {
    fn write_all(&self, buf: &[u8]) -> io::Result<()> {
        (&self.0).write_all(buf)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn truncate(&self, len: u64) -> io::Result<()> {
        // The file was opened in append mode: writes go to the new end by themselves.
        self.0.set_len(len)?;
        self.0.sync_all()
    }
}

impl Vfs for OsFs {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        fs::create_dir_all(dir)
    }

    fn create(&self, path: &Path) -> io::Result<Arc<dyn AppendFile>> {
        // Truncate first, then reopen in append mode: O_APPEND keeps every write at the end
        // even after `truncate` cut the file under the handle.
        File::create(path)?;
        let f = OpenOptions::new().append(true).open(path)?;
        Ok(Arc::new(OsFile(f)))
    }

    fn open_read(&self, path: &Path) -> io::Result<(Box<dyn Read + Send>, u64)> {
        let f = File::open(path)?;
        let len = f.metadata()?.len();
        Ok((Box::new(f), len))
    }

    fn truncate(&self, path: &Path, len: u64) -> io::Result<()> {
        let f = OpenOptions::new().write(true).open(path)?;
        f.set_len(len)?;
        f.sync_all()
    }

    fn sync_file(&self, path: &Path) -> io::Result<()> {
        File::open(path)?.sync_all()
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<DirEntry>> {
        let mut out = Vec::new();
        for e in fs::read_dir(dir)? {
            let e = e?;
            let Some(name) = e.file_name().to_str().map(str::to_owned) else { continue };
            out.push(DirEntry { name, is_dir: e.file_type()?.is_dir() });
        }
        Ok(out)
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::remove_dir_all(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn fsync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn map(&self, path: &Path) -> io::Result<Bytes> {
        let f = File::open(path)?;
        if f.metadata()?.len() == 0 {
            // mmap of an empty file fails on some systems; nothing to map anyway.
            return Ok(Bytes::new());
        }
        // SAFETY: callers map only files that nothing writes to any more (block files, written
        // into a temporary directory and renamed into place; see `Vfs::map`).
        let map = unsafe { memmap2::Mmap::map(&f) }?;
        Ok(Bytes::from_owner(map))
    }

    fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::hard_link(from, to)
    }

    fn file_len(&self, path: &Path) -> io::Result<u64> {
        Ok(fs::metadata(path)?.len())
    }

    fn lock(&self, path: &Path) -> io::Result<Box<dyn fmt::Debug + Send + Sync>> {
        let f = OpenOptions::new().create(true).truncate(false).write(true).open(path)?;
        // SAFETY: flock on a file descriptor we own; no memory is involved. The kernel releases
        // the lock when the file is closed or the process dies.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Box::new(f))
    }
}
