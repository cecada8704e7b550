//! The head's dictionary of metric names (`index::name_dict`): a main dictionary, smaller ones
//! of names folded in since (levels), and the names created since the last fold (a
//! `NameDelta`), all searched by one pattern.
//!
//! Building the main dictionary costs about its size, so it is not done per new name: a new
//! name is appended to the delta (a copy into a buffer, on the thread creating the series),
//! which is searched name by name and so kept small: once it holds `DELTA_NAMES_MAX` names,
//! maintenance (once a second) sorts it into a dictionary of its own, a new level. Levels are
//! merged as a binary counter merges carries, whenever the newest is at least half the one
//! before it, so there are at most a logarithm of them and each name is merged a logarithm of
//! times. Once the levels outgrow a share of the main dictionary (or series were removed),
//! everything is merged into a new main dictionary, at most a tenth of the time.
//! While the WAL is replayed nothing is collected; the dictionary is built once at the end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use crate::index::name_dict::{NameDelta, NameDict, NamePattern};

/// The delta is folded into a level of its own once it holds this many names (a search reads
/// each of them: up to about a tenth of a millisecond).
const DELTA_NAMES_MAX: usize = 4096;
/// Below this many names and nodes in levels and delta, no rebuild is asked for.
const SMALL_NODES_MIN: usize = 4096;
/// Past `SMALL_NODES_MIN`, a rebuild is wanted once the levels and the delta hold this share of
/// the main dictionary's node count.
const SMALL_SHARE_DIVISOR: usize = 16;
/// After a rebuild, the next one waits this many times as long as it took (unless the levels
/// outgrew the main dictionary): while a burst of new paths arrives (a Graphite installation
/// starting to send a million), rebuilds take at most a tenth of a core instead of rebuilding
/// the whole dictionary every time the new names reached a sixteenth of it. Meanwhile new
/// names go into levels, which cost a logarithm of merges per name.
const REBUILD_PAUSE_FACTOR: u32 = 9;

#[derive(Debug)]
pub(crate) struct HeadNames {
    inner: RwLock<Inner>,
    /// Held through a fold or a rebuild: one at a time, so that each installs its result
    /// over the dictionaries it read.
    maintaining: Mutex<()>,
}

#[derive(Debug, Default)]
struct Inner {
    dict: Arc<NameDict>,
    /// Dictionaries of names folded out of the delta since `dict` was built, oldest first;
    /// each less than half the size of the one before it once a fold is over.
    levels: Vec<Arc<NameDict>>,
    delta: NameDelta,
    /// The delta being folded or read by a rebuild, searched until its names are installed
    /// in a dictionary.
    frozen: Option<Arc<NameDelta>>,
    /// False while the WAL is replayed: names are not collected one by one then.
    collecting: bool,
    /// Series were removed: the dictionaries may hold names no series has any more.
    stale: bool,
    /// When the last rebuild ended, and how long it took.
    last_build: Option<(Instant, Duration)>,
}

impl Inner {
    /// Nodes in the levels plus names in the deltas.
    fn small(&self) -> usize {
        let levels: usize = self.levels.iter().map(|l| l.len()).sum();
        levels + self.delta.len() + self.frozen.as_ref().map_or(0, |f| f.len())
    }
}

impl HeadNames {
    /// Collecting names from the start (`true`: a head without a WAL to replay) or only from
    /// the first rebuild (`false`: the WAL is about to be replayed, or the head is a
    /// backfill's, never searched by name).
    pub fn new(collecting: bool) -> HeadNames {
        HeadNames { inner: RwLock::new(Inner { collecting, ..Inner::default() }), maintaining: Mutex::new(()) }
    }

    /// A series with a new metric name was created.
    pub fn add(&self, name: &str) {
        let mut g = self.inner.write();
        if g.collecting {
            g.delta.add(name);
        }
    }

    /// Series were removed; their names stay searchable until the next rebuild.
    pub fn mark_stale(&self) {
        self.inner.write().stale = true;
    }

    /// What maintenance should do now, if anything (never while not collecting: replay ends
    /// with a rebuild of its own, and backfill heads are not searched by name). A rebuild is
    /// due once the levels and the delta hold a sixteenth of the main dictionary's nodes or
    /// series were removed, and waits for the pause after the last one
    /// (`REBUILD_PAUSE_FACTOR`) unless they outgrew the main dictionary; meanwhile a delta of
    /// `DELTA_NAMES_MAX` names is folded into a level.
    pub fn wanted(&self, now: Instant) -> Option<NamesMaintenance> {
        let g = self.inner.read();
        if !g.collecting {
            return None;
        }
        let small = g.small();
        if g.stale || small > SMALL_NODES_MIN.max(g.dict.len() / SMALL_SHARE_DIVISOR) {
            // Past the main dictionary, a rebuild at least doubles it: rebuilds cost about
            // twice the final build in all.
            let outgrown = small > g.dict.len();
            if outgrown || g.last_build.is_none_or(|(ended, took)| now >= ended + took * REBUILD_PAUSE_FACTOR) {
                return Some(NamesMaintenance::Rebuild);
            }
        }
        (g.delta.len() >= DELTA_NAMES_MAX).then_some(NamesMaintenance::Fold)
    }

    /// Folds the delta into a new level, then merges the newest levels while the newest is at
    /// least half the one before it. The dictionaries are built outside the lock (the delta
    /// frozen meanwhile, still searched), then installed.
    pub fn fold_delta(&self) {
        let _one = self.maintaining.lock();
        let frozen = {
            let mut g = self.inner.write();
            if g.delta.is_empty() {
                return;
            }
            let frozen = Arc::new(std::mem::take(&mut g.delta));
            g.frozen = Some(frozen.clone());
            frozen
        };
        let mut level = Arc::new(NameDict::union(&[], &frozen));
        let mut merged = 0;
        loop {
            let older = {
                let g = self.inner.read();
                let n = g.levels.len() - merged;
                match n.checked_sub(1).map(|i| &g.levels[i]) {
                    Some(older) if level.len() * 2 >= older.len() => older.clone(),
                    _ => break,
                }
            };
            level = Arc::new(NameDict::union(&[&older, &level], &NameDelta::default()));
            merged += 1;
        }
        let mut g = self.inner.write();
        let keep = g.levels.len() - merged;
        let replaced: Vec<_> = g.levels.drain(keep..).collect();
        g.levels.push(level);
        let frozen = g.frozen.take();
        drop(g);
        // Freed outside the lock.
        drop((replaced, frozen));
    }

    /// Rebuilds the main dictionary: from the dictionaries and the delta, which together
    /// hold every name the head has, unless series were removed since the last build or names
    /// were not collected (the WAL was being replayed): then from the head's every name, which
    /// `head_names` adds to the delta it is given. Names created meanwhile stay in the delta.
    pub fn rebuild(&self, head_names: impl FnOnce(&mut NameDelta)) {
        let _one = self.maintaining.lock();
        let started = Instant::now();
        let (from_head, dicts, frozen) = {
            let mut g = self.inner.write();
            let from_head = std::mem::take(&mut g.stale) || !g.collecting;
            let frozen = Arc::new(std::mem::take(&mut g.delta));
            g.frozen = Some(frozen.clone());
            let dicts: Vec<Arc<NameDict>> = std::iter::once(&g.dict).chain(&g.levels).cloned().collect();
            (from_head, dicts, frozen)
        };
        let dict = if from_head {
            drop(dicts);
            let mut names = NameDelta::default();
            head_names(&mut names);
            NameDict::union(&[], &names)
        } else {
            // Merged with only the delta to sort: sorting the head's every name again was a
            // third of the server's CPU while a million new carbon paths arrived.
            let dicts: Vec<&NameDict> = dicts.iter().map(|d| &**d).collect();
            NameDict::union(&dicts, &frozen)
        };
        let mut g = self.inner.write();
        let now = Instant::now();
        g.last_build = Some((now, now.saturating_duration_since(started)));
        g.dict = Arc::new(dict);
        let levels = std::mem::take(&mut g.levels);
        let frozen = g.frozen.take();
        g.collecting = true;
        drop(g);
        drop((levels, frozen));
    }

    /// `NameDict::search` over the dictionaries and the delta; a node in several is visited
    /// once in each (with the flags each has). False, visiting nothing, while names are not
    /// collected (the caller scans the postings' values instead).
    pub fn search(&self, pattern: &NamePattern, mut visit: impl FnMut(&[u8], u8) -> bool) -> bool {
        let g = self.inner.read();
        if !g.collecting {
            return false;
        }
        let mut go_on = true;
        for dict in std::iter::once(&g.dict).chain(&g.levels) {
            if go_on && !dict.is_empty() {
                dict.search(pattern, |k, f| {
                    go_on = visit(k, f);
                    go_on
                });
            }
        }
        for delta in g.frozen.as_deref().into_iter().chain([&g.delta]) {
            if go_on {
                delta.search(pattern, |k, f| {
                    go_on = visit(k, f);
                    go_on
                });
            }
        }
        true
    }

    /// Nodes in the dictionaries (main and levels), names in the delta (and in one being
    /// folded), and the bytes they hold.
    pub fn stats(&self) -> NamesStats {
        let g = self.inner.read();
        let dicts = || std::iter::once(&g.dict).chain(&g.levels);
        let deltas = || g.frozen.as_deref().into_iter().chain([&g.delta]);
        NamesStats {
            dictionary_nodes: dicts().map(|d| d.len()).sum(),
            dictionaries: 1 + g.levels.len(),
            delta_names: deltas().map(NameDelta::len).sum(),
            bytes: dicts().map(|d| d.bytes()).sum::<usize>() + deltas().map(NameDelta::heap_bytes).sum::<usize>(),
        }
    }
}

/// The size of the head's names dictionaries (`Head::names_stats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamesStats {
    /// Nodes in the main dictionary and the levels.
    pub dictionary_nodes: usize,
    /// The main dictionary and the levels.
    pub dictionaries: usize,
    /// Names created since the last fold, searched name by name.
    pub delta_names: usize,
    pub bytes: usize,
}

/// What `HeadNames::wanted` asks maintenance for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NamesMaintenance {
    /// A new main dictionary (`HeadNames::rebuild`).
    Rebuild,
    /// The delta folded into a level (`HeadNames::fold_delta`).
    Fold,
}
