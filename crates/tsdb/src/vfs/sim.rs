//! A simulated disk for tests: files in memory, each with what a crash would leave of it (its
//! durable contents) beside what a reader sees now, and faults drawn from a seeded generator so
//! that a failing run can be replayed from its seed.
//!
//! What it models:
//! - a write may fail part-way (a short write: a random prefix reached the file) with ENOSPC or
//!   EIO; with `set_disk_full` every write and create fails with ENOSPC until cleared;
//! - an fsync (of a file or a directory) may fail with EIO, and then makes nothing durable;
//! - a read may fail with EIO part-way through a file;
//! - `crash` forgets what was not fsynced: the namespace goes back to what directory fsyncs made
//!   durable, and each file to its durable contents plus a random prefix of the bytes written
//!   after them (pages a real disk may or may not have written back).
//!
//! Simplification, documented so no test leans on it unknowingly: an fsync of a directory makes
//! the entries of its whole subtree durable, not only its direct children.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

use super::{AppendFile, DirEntry, Vfs};

/// Probability, per call, of each kind of fault (0 turns it off).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FaultRates {
    pub write: f64,
    pub fsync: f64,
    pub read: f64,
    /// Creating, renaming and removing files and directories.
    pub namespace: f64,
}

/// How many faults were injected, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    pub write: u64,
    pub fsync: u64,
    pub read: u64,
    pub namespace: u64,
    pub crashes: u64,
}

#[derive(Clone, Copy)]
enum Kind {
    Write,
    Fsync,
    Read,
    Namespace,
}

#[derive(Debug, Default)]
struct Contents {
    /// What a reader sees.
    live: Vec<u8>,
    /// What survives a crash.
    durable: Vec<u8>,
}

#[derive(Debug, Default)]
struct State {
    files: BTreeMap<u64, Contents>,
    next_inode: u64,
    /// Path to inode, as seen now and as a crash would leave it.
    live: BTreeMap<PathBuf, u64>,
    durable: BTreeMap<PathBuf, u64>,
    live_dirs: BTreeSet<PathBuf>,
    durable_dirs: BTreeSet<PathBuf>,
    rates: FaultRates,
    disk_full: bool,
    rng: u64,
    counts: FaultCounts,
    /// Paths locked by a live `Vfs::lock` guard; a crash releases them, as the kernel would.
    /// Path to the token of its holder (a guard from before a crash must not free its
    /// successor's lock).
    locks: BTreeMap<PathBuf, u64>,
    next_lock_token: u64,
}

impl State {
    /// SplitMix64: small, fast, and the same sequence for the same seed everywhere.
    fn next_u64(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }

    /// Draws whether a fault of `kind` happens now, and counts it if so.
    fn fault(&mut self, kind: Kind) -> bool {
        let p = match kind {
            Kind::Write => self.rates.write,
            Kind::Fsync => self.rates.fsync,
            Kind::Read => self.rates.read,
            Kind::Namespace => self.rates.namespace,
        };
        if !self.chance(p) {
            return false;
        }
        let count = match kind {
            Kind::Write => &mut self.counts.write,
            Kind::Fsync => &mut self.counts.fsync,
            Kind::Read => &mut self.counts.read,
            Kind::Namespace => &mut self.counts.namespace,
        };
        *count += 1;
        true
    }

    fn namespace_fault(&mut self, what: &str, path: &Path) -> io::Result<()> {
        if self.fault(Kind::Namespace) {
            return Err(io::Error::other(format!("simulated EIO on {what} {}", path.display())));
        }
        Ok(())
    }

    fn parent_exists(&self, path: &Path) -> io::Result<()> {
        match path.parent() {
            Some(p) if !p.as_os_str().is_empty() && !self.live_dirs.contains(p) => {
                Err(io::Error::new(io::ErrorKind::NotFound, format!("no directory {}", p.display())))
            }
            _ => Ok(()),
        }
    }

    fn inode(&self, path: &Path) -> io::Result<u64> {
        self.live
            .get(path)
            .copied()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no file {}", path.display())))
    }
}

fn enospc(path: &Path) -> io::Error {
    io::Error::new(io::ErrorKind::StorageFull, format!("simulated ENOSPC writing {}", path.display()))
}

/// The simulated disk; clones share it.
#[derive(Clone, Debug, Default)]
pub struct SimFs {
    state: Arc<Mutex<State>>,
}

impl SimFs {
    pub fn new(seed: u64) -> SimFs {
        let fs = SimFs::default();
        fs.state.lock().rng = seed;
        fs
    }

    pub fn set_rates(&self, rates: FaultRates) {
        self.state.lock().rates = rates;
    }

    /// While set, every write and create fails with ENOSPC (after a random short write).
    pub fn set_disk_full(&self, full: bool) {
        self.state.lock().disk_full = full;
    }

    pub fn counts(&self) -> FaultCounts {
        self.state.lock().counts
    }

    /// A number from the disk's generator (so a test driving it needs no second seed).
    pub fn random(&self, n: usize) -> usize {
        self.state.lock().below(n)
    }

    /// Power loss: everything not fsynced is forgotten, but for a random prefix of each
    /// file's unsynced tail. Handles opened before keep pointing at the forgotten files.
    pub fn crash(&self) {
        let mut st = self.state.lock();
        st.counts.crashes += 1;
        st.locks.clear();
        st.live = st.durable.clone();
        st.live_dirs = st.durable_dirs.clone();
        let kept: BTreeSet<u64> = st.durable.values().copied().collect();
        let ids: Vec<u64> = st.files.keys().copied().collect();
        for id in ids {
            if !kept.contains(&id) {
                st.files.remove(&id);
                continue;
            }
            let c = &st.files[&id];
            let extra = if c.live.starts_with(&c.durable) { c.live.len() - c.durable.len() } else { 0 };
            let keep = st.below(extra + 1);
            let c = st.files.get_mut(&id).expect("file listed above");
            let len = c.durable.len();
            let survivor = c.live[..len + keep].to_vec();
            if keep == 0 {
                c.live = c.durable.clone();
            } else {
                c.durable = survivor.clone();
                c.live = survivor;
            }
        }
        // Open handles now refer to inodes that may be gone: give the survivors fresh inodes,
        // so that a write through a handle from before the crash cannot reach them.
        let paths: Vec<(PathBuf, u64)> = st.live.iter().map(|(p, &id)| (p.clone(), id)).collect();
        for (path, old) in paths {
            let new = st.next_inode;
            st.next_inode += 1;
            let c = st.files.remove(&old).unwrap_or_default();
            st.files.insert(new, c);
            st.live.insert(path.clone(), new);
            st.durable.insert(path, new);
        }
    }

    /// The bytes a reader sees in `path` now (for assertions).
    pub fn read_all(&self, path: &Path) -> io::Result<Vec<u8>> {
        let st = self.state.lock();
        let id = st.inode(path)?;
        Ok(st.files[&id].live.clone())
    }

    /// Flips one bit of `path` at `offset`, live and durable (a disk that lies).
    pub fn corrupt(&self, path: &Path, offset: usize) -> io::Result<()> {
        let mut st = self.state.lock();
        let id = st.inode(path)?;
        let c = st.files.get_mut(&id).expect("inode exists");
        if let Some(b) = c.live.get_mut(offset) {
            *b ^= 0x10;
        }
        if let Some(b) = c.durable.get_mut(offset) {
            *b ^= 0x10;
        }
        Ok(())
    }
}

#[derive(Debug)]
struct SimFile {
    fs: SimFs,
    inode: u64,
    path: PathBuf,
}

impl AppendFile for SimFile {
    fn write_all(&self, buf: &[u8]) -> io::Result<()> {
        let mut st = self.fs.state.lock();
        if !st.files.contains_key(&self.inode) {
            // Written after a crash through a handle from before it: the bytes go nowhere.
            return Ok(());
        }
        let fail = if st.disk_full {
            Some(enospc(&self.path))
        } else if st.fault(Kind::Write) {
            Some(if st.next_u64().is_multiple_of(2) {
                enospc(&self.path)
            } else {
                io::Error::other(format!("simulated EIO writing {}", self.path.display()))
            })
        } else {
            None
        };
        let n = if fail.is_some() { st.below(buf.len()) } else { buf.len() };
        st.files.get_mut(&self.inode).expect("checked above").live.extend_from_slice(&buf[..n]);
        match fail {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut st = self.fs.state.lock();
        if st.fault(Kind::Fsync) {
            return Err(io::Error::other(format!("simulated EIO on fsync of {}", self.path.display())));
        }
        if let Some(c) = st.files.get_mut(&self.inode) {
            c.durable = c.live.clone();
        }
        Ok(())
    }

    fn truncate(&self, len: u64) -> io::Result<()> {
        let mut st = self.fs.state.lock();
        if st.fault(Kind::Fsync) {
            return Err(io::Error::other(format!("simulated EIO truncating {}", self.path.display())));
        }
        if let Some(c) = st.files.get_mut(&self.inode) {
            c.live.truncate(len as usize);
            c.durable = c.live.clone();
        }
        Ok(())
    }
}

/// Reads a snapshot of a file, failing part-way when the disk says so.
struct SimReader {
    data: Vec<u8>,
    pos: usize,
    fail_at: Option<usize>,
    path: PathBuf,
}

impl Read for SimReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let end = self.fail_at.unwrap_or(self.data.len()).min(self.data.len());
        if self.pos >= end && self.fail_at.is_some() {
            return Err(io::Error::other(format!("simulated EIO reading {}", self.path.display())));
        }
        let n = buf.len().min(end - self.pos);
        buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Held while a simulated `Vfs::lock` is.
#[derive(Debug)]
struct SimLock {
    fs: SimFs,
    path: PathBuf,
    token: u64,
}

impl Drop for SimLock {
    fn drop(&mut self) {
        let mut st = self.fs.state.lock();
        if st.locks.get(&self.path) == Some(&self.token) {
            st.locks.remove(&self.path);
        }
    }
}

fn under(path: &Path, dir: &Path) -> bool {
    path.starts_with(dir) && path != dir
}

impl Vfs for SimFs {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        st.namespace_fault("mkdir", dir)?;
        for a in dir.ancestors() {
            if a.as_os_str().is_empty() {
                break;
            }
            st.live_dirs.insert(a.to_owned());
        }
        Ok(())
    }

    fn create(&self, path: &Path) -> io::Result<Arc<dyn AppendFile>> {
        let mut st = self.state.lock();
        st.parent_exists(path)?;
        if st.disk_full {
            return Err(enospc(path));
        }
        st.namespace_fault("create", path)?;
        let inode = st.next_inode;
        st.next_inode += 1;
        st.files.insert(inode, Contents::default());
        st.live.insert(path.to_owned(), inode);
        Ok(Arc::new(SimFile { fs: self.clone(), inode, path: path.to_owned() }))
    }

    fn open_read(&self, path: &Path) -> io::Result<(Box<dyn Read + Send>, u64)> {
        let mut st = self.state.lock();
        let id = st.inode(path)?;
        let data = st.files[&id].live.clone();
        let fail_at = if st.fault(Kind::Read) { Some(st.below(data.len() + 1)) } else { None };
        let len = data.len() as u64;
        Ok((Box::new(SimReader { data, pos: 0, fail_at, path: path.to_owned() }), len))
    }

    fn truncate(&self, path: &Path, len: u64) -> io::Result<()> {
        let inode = self.state.lock().inode(path)?;
        SimFile { fs: self.clone(), inode, path: path.to_owned() }.truncate(len)
    }

    fn sync_file(&self, path: &Path) -> io::Result<()> {
        let inode = self.state.lock().inode(path)?;
        SimFile { fs: self.clone(), inode, path: path.to_owned() }.sync_data()
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<DirEntry>> {
        let st = self.state.lock();
        if !st.live_dirs.contains(dir) {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("no directory {}", dir.display())));
        }
        let name = |p: &Path| p.file_name().and_then(|n| n.to_str()).map(str::to_owned);
        let mut out = Vec::new();
        for p in st.live.keys().filter(|p| p.parent() == Some(dir)) {
            out.extend(name(p).map(|name| DirEntry { name, is_dir: false }));
        }
        for p in st.live_dirs.iter().filter(|p| p.parent() == Some(dir)) {
            out.extend(name(p).map(|name| DirEntry { name, is_dir: true }));
        }
        Ok(out)
    }

    fn exists(&self, path: &Path) -> bool {
        let st = self.state.lock();
        st.live.contains_key(path) || st.live_dirs.contains(path)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        st.inode(path)?;
        st.namespace_fault("remove", path)?;
        st.live.remove(path);
        Ok(())
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        if !st.live_dirs.contains(path) {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("no directory {}", path.display())));
        }
        st.namespace_fault("remove", path)?;
        st.live.retain(|p, _| !under(p, path));
        st.live_dirs.retain(|p| !p.starts_with(path));
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        st.namespace_fault("rename", from)?;
        if let Some(id) = st.live.remove(from) {
            st.live.insert(to.to_owned(), id);
            return Ok(());
        }
        if !st.live_dirs.contains(from) {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("no file {}", from.display())));
        }
        if st.live.keys().any(|p| under(p, to)) || st.live_dirs.iter().any(|p| under(p, to)) {
            return Err(io::Error::new(
                io::ErrorKind::DirectoryNotEmpty,
                format!("rename onto {}: directory not empty", to.display()),
            ));
        }
        // A directory: move its subtree (files and directories).
        let moved: Vec<(PathBuf, u64)> =
            st.live.iter().filter(|(p, _)| under(p, from)).map(|(p, &i)| (p.clone(), i)).collect();
        for (p, id) in moved {
            st.live.remove(&p);
            st.live.insert(to.join(p.strip_prefix(from).expect("under from")), id);
        }
        let dirs: Vec<PathBuf> = st.live_dirs.iter().filter(|p| p.starts_with(from)).cloned().collect();
        for d in dirs {
            st.live_dirs.remove(&d);
            st.live_dirs.insert(to.join(d.strip_prefix(from).expect("under from")));
        }
        Ok(())
    }

    fn fsync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        if st.fault(Kind::Fsync) {
            return Err(io::Error::other(format!("simulated EIO on fsync of directory {}", dir.display())));
        }
        let live: Vec<(PathBuf, u64)> =
            st.live.iter().filter(|(p, _)| under(p, dir)).map(|(p, &i)| (p.clone(), i)).collect();
        st.durable.retain(|p, _| !under(p, dir));
        st.durable.extend(live);
        let dirs: Vec<PathBuf> = st.live_dirs.iter().filter(|p| under(p, dir)).cloned().collect();
        st.durable_dirs.retain(|p| !under(p, dir));
        st.durable_dirs.extend(dirs);
        st.durable_dirs.insert(dir.to_owned());
        Ok(())
    }

    fn map(&self, path: &Path) -> io::Result<Bytes> {
        let mut st = self.state.lock();
        let id = st.inode(path)?;
        if st.fault(Kind::Read) {
            return Err(io::Error::other(format!("simulated EIO mapping {}", path.display())));
        }
        Ok(Bytes::from(st.files[&id].live.clone()))
    }

    fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        let id = st.inode(from)?;
        st.parent_exists(to)?;
        if st.live.contains_key(to) {
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, format!("{} exists", to.display())));
        }
        st.namespace_fault("link", to)?;
        st.live.insert(to.to_owned(), id);
        Ok(())
    }

    fn file_len(&self, path: &Path) -> io::Result<u64> {
        let st = self.state.lock();
        let id = st.inode(path)?;
        Ok(st.files[&id].live.len() as u64)
    }

    fn lock(&self, path: &Path) -> io::Result<Box<dyn std::fmt::Debug + Send + Sync>> {
        let mut st = self.state.lock();
        st.parent_exists(path)?;
        if st.locks.contains_key(path) {
            return Err(io::Error::new(io::ErrorKind::WouldBlock, format!("{} is locked", path.display())));
        }
        st.next_lock_token += 1;
        let token = st.next_lock_token;
        st.locks.insert(path.to_owned(), token);
        Ok(Box::new(SimLock { fs: self.clone(), path: path.to_owned(), token }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crash_keeps_what_was_fsynced_and_forgets_unsynced_entries() {
        let fs = SimFs::new(7);
        let dir = Path::new("/d");
        fs.create_dir_all(dir).unwrap();
        fs.fsync_dir(Path::new("/")).unwrap();
        let f = fs.create(&dir.join("a")).unwrap();
        f.write_all(b"hello").unwrap();
        f.sync_data().unwrap();
        fs.fsync_dir(dir).unwrap();
        f.write_all(b" world").unwrap();
        let g = fs.create(&dir.join("b")).unwrap();
        g.write_all(b"never synced").unwrap();
        fs.crash();
        let a = fs.read_all(&dir.join("a")).unwrap();
        assert!(a.starts_with(b"hello") && b"hello world".starts_with(&a[..]), "{a:?}");
        assert!(!fs.exists(&dir.join("b")), "an entry whose directory was never fsynced is gone");
        // The handle from before the crash writes into nothing.
        f.write_all(b"!").unwrap();
        assert_eq!(fs.read_all(&dir.join("a")).unwrap(), a);
    }

    #[test]
    fn a_disk_full_write_is_short_and_fails_until_space_returns() {
        let fs = SimFs::new(1);
        fs.create_dir_all(Path::new("/d")).unwrap();
        let f = fs.create(Path::new("/d/a")).unwrap();
        fs.set_disk_full(true);
        let e = f.write_all(&[1; 100]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::StorageFull);
        assert!(fs.read_all(Path::new("/d/a")).unwrap().len() < 100);
        assert!(fs.create(Path::new("/d/b")).is_err());
        fs.set_disk_full(false);
        f.truncate(0).unwrap();
        f.write_all(&[1; 100]).unwrap();
        assert_eq!(fs.read_all(Path::new("/d/a")).unwrap().len(), 100);
    }

    #[test]
    fn renaming_a_directory_moves_its_files_and_a_parent_fsync_makes_it_durable() {
        let fs = SimFs::new(3);
        fs.create_dir_all(Path::new("/w/c.tmp")).unwrap();
        let f = fs.create(Path::new("/w/c.tmp/0")).unwrap();
        f.write_all(b"x").unwrap();
        f.sync_data().unwrap();
        fs.fsync_dir(Path::new("/w/c.tmp")).unwrap();
        fs.rename(Path::new("/w/c.tmp"), Path::new("/w/c")).unwrap();
        fs.fsync_dir(Path::new("/w")).unwrap();
        fs.crash();
        assert_eq!(fs.read_all(Path::new("/w/c/0")).unwrap(), b"x");
        assert!(!fs.exists(Path::new("/w/c.tmp")));
        let names: Vec<String> = fs.list(Path::new("/w")).unwrap().into_iter().map(|e| e.name).collect();
        assert_eq!(names, ["c"]);
    }
}
