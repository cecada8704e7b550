//! The one place that knows how to make file-system changes durable.

use std::path::Path;

use crate::error::{io_err, Result};
use crate::vfs::Vfs;

/// Fsyncs a directory so that entries created, renamed or removed in it survive a crash.
pub fn fsync_dir(fs: &dyn Vfs, dir: &Path) -> Result<()> {
    fs.fsync_dir(dir).map_err(io_err("fsync directory", dir))
}

/// Renames `from` to `to` (same directory) and makes the rename durable.
pub fn rename_durable(fs: &dyn Vfs, from: &Path, to: &Path) -> Result<()> {
    fs.rename(from, to).map_err(io_err("rename to", to))?;
    fsync_dir(fs, to.parent().unwrap_or(Path::new(".")))
}

/// Creates `dir` (and parents) if missing.
pub fn create_dir_all(fs: &dyn Vfs, dir: &Path) -> Result<()> {
    fs.create_dir_all(dir).map_err(io_err("create directory", dir))
}
