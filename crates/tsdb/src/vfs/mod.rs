//! The file-system calls of the write-ahead log, behind a trait, so that a test can put a
//! simulated disk under the real code: one that fails writes half-way, runs out of space,
//! fails fsyncs and reads, and forgets everything not yet fsynced when it "crashes"
//! (`sim::SimFs`). The server uses `OsFs`, plain `std::fs`.
//!
//! Only what the log needs is here: append-only files, whole-directory listings, renames and
//! directory fsyncs. Blocks (written once, read through mmap) still call `std::fs` directly.

pub mod sim;

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::Arc;

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
}
