//! The head's dictionary of metric names (`index::name_dict`): a main dictionary, sorted lists
//! of names folded in since (levels), and the names created since the last fold (a
//! `NameDelta`), all searched by one pattern.
//!
//! Building the main dictionary (two fsts) costs over a microsecond per node, so it is not
//! done per new name: a new name is appended to the delta (a copy into a buffer, on the thread
//! creating the series), which is searched name by name and so kept small: once it holds
//! `DELTA_NAMES_MAX` names, maintenance (once a second) sorts it into a `NameList` of its own,
//! a new level. Levels are merged as a binary counter merges carries, whenever the newest is
//! at least half the one before it, so there are at most a logarithm of them and each name is
//! merged a logarithm of times; a merge of sorted lists costs a comparison per node. The
//! levels hold the names' text, where the main dictionary shares repeated subtrees and is a
//! few bytes per path: once they hold a share of the main dictionary (or series were removed)
//! and new names have stopped coming for a moment, everything is merged into a new main
//! dictionary, at most a tenth of the time. While a burst of new names goes on, that waits
//! (up to `LEVELS_BYTES_MAX` of levels): rebuilding after each step of a burst of a million
//! new carbon paths was a third of the server's CPU while it lasted.
//! While the WAL is replayed nothing is collected; the dictionary is built once at the end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use crate::index::name_dict::{NameDelta, NameDict, NameList, NamePattern};

/// The delta is folded into a level of its own once it holds this many names (a search reads
/// each of them: up to about a tenth of a millisecond).
const DELTA_NAMES_MAX: usize = 4096;
/// Below this many names and nodes in levels and delta, no rebuild is asked for.
const SMALL_NODES_MIN: usize = 4096;
/// Past `SMALL_NODES_MIN`, a rebuild is wanted once the levels and the delta hold this share of
/// the main dictionary's node count.
const SMALL_SHARE_DIVISOR: usize = 16;
/// After a rebuild, the next one waits this many times as long as it took: rebuilds take at
/// most a tenth of the time.
const REBUILD_PAUSE_FACTOR: u32 = 9;
/// A rebuild waits until no delta has been folded for this long (a burst of new names is
/// over), unless the levels hold more than `LEVELS_BYTES_MAX`.
const FOLDS_QUIET_FOR: Duration = Duration::from_secs(2);
/// The levels' size past which a rebuild no longer waits for a burst to end (a million
/// host-shaped paths take about 56 MiB of levels: 36.6 MiB of text, 16 bytes per node).
const LEVELS_BYTES_MAX: usize = 256 << 20;

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
    /// Names folded out of the delta since `dict` was built, oldest first; each less than
    /// half the size of the one before it once a fold is over.
    levels: Vec<Arc<NameList>>,
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
    /// When the last fold ended.
    last_fold: Option<Instant>,
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
    /// (`REBUILD_PAUSE_FACTOR`) and for new names to have stopped (no fold for
    /// `FOLDS_QUIET_FOR`, and fewer than a fold's worth in the delta) unless the levels
    /// outgrew `LEVELS_BYTES_MAX`; meanwhile a delta of `DELTA_NAMES_MAX` names is folded into
    /// a level.
    pub fn wanted(&self, now: Instant) -> Option<NamesMaintenance> {
        let g = self.inner.read();
        if !g.collecting {
            return None;
        }
        if g.stale || g.small() > SMALL_NODES_MIN.max(g.dict.len() / SMALL_SHARE_DIVISOR) {
            let paused = g.last_build.is_some_and(|(ended, took)| now < ended + took * REBUILD_PAUSE_FACTOR);
            // New names are coming: a fold's worth since the last tick, or a fold a moment ago.
            let folding =
                g.delta.len() >= DELTA_NAMES_MAX || g.last_fold.is_some_and(|ended| now < ended + FOLDS_QUIET_FOR);
            let levels_bytes: usize = g.levels.iter().map(|l| l.bytes()).sum();
            if !paused && (!folding || levels_bytes > LEVELS_BYTES_MAX) {
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
        let mut level = Arc::new(NameList::from_delta(&frozen));
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
            level = Arc::new(NameList::merge(&older, &level));
            merged += 1;
        }
        let mut g = self.inner.write();
        let keep = g.levels.len() - merged;
        let replaced: Vec<_> = g.levels.drain(keep..).collect();
        g.levels.push(level);
        g.last_fold = Some(Instant::now());
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
        let (from_head, dict, levels, frozen) = {
            let mut g = self.inner.write();
            let from_head = std::mem::take(&mut g.stale) || !g.collecting;
            let frozen = Arc::new(std::mem::take(&mut g.delta));
            g.frozen = Some(frozen.clone());
            (from_head, g.dict.clone(), g.levels.clone(), frozen)
        };
        let dict = if from_head {
            drop((dict, levels));
            let mut names = NameDelta::default();
            head_names(&mut names);
            NameDict::union(&[], &names)
        } else {
            // Merged with only the delta to sort: sorting the head's every name again was a
            // third of the server's CPU while a million new carbon paths arrived.
            let levels: Vec<&NameList> = levels.iter().map(|l| &**l).collect();
            NameDict::union_lists(&[&dict], &levels, &frozen)
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
        if !g.dict.is_empty() {
            g.dict.search(pattern, |k, f| {
                go_on = visit(k, f);
                go_on
            });
        }
        for level in &g.levels {
            if go_on {
                level.search(pattern, |k, f| {
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
        let deltas = || g.frozen.as_deref().into_iter().chain([&g.delta]);
        NamesStats {
            dictionary_nodes: g.dict.len() + g.levels.iter().map(|l| l.len()).sum::<usize>(),
            dictionaries: 1 + g.levels.len(),
            delta_names: deltas().map(NameDelta::len).sum(),
            bytes: g.dict.bytes()
                + g.levels.iter().map(|l| l.bytes()).sum::<usize>()
                + deltas().map(NameDelta::heap_bytes).sum::<usize>(),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn add_hosts(names: &HeadNames, hosts: std::ops::Range<usize>) {
        for h in hosts {
            for m in ["cpu.user", "net.eth0.rx_bytes"] {
                names.add(&format!("servers.dc1.host-{h:05}.{m}"));
            }
        }
    }

    /// Past the pause after the last rebuild, a rebuild still waits while deltas are being
    /// folded (a burst of new names may go on), then takes everything into one dictionary.
    #[test]
    fn a_rebuild_waits_for_a_burst_of_new_names_to_end() {
        let names = HeadNames::new(true);
        add_hosts(&names, 0..2_000);
        names.rebuild(|_| unreachable!("nothing was removed"));
        add_hosts(&names, 2_000..5_000);
        let after_pause = Instant::now() + Duration::from_secs(1);
        assert_eq!(names.wanted(after_pause), Some(NamesMaintenance::Fold), "a fold's worth of new names");
        names.fold_delta();
        let folded = Instant::now();
        assert_eq!(names.stats().dictionaries, 2);
        assert_eq!(names.wanted(folded + Duration::from_millis(1500)), None, "a fold a moment ago");
        assert_eq!(names.wanted(folded + FOLDS_QUIET_FOR), Some(NamesMaintenance::Rebuild));
        names.rebuild(|_| unreachable!("nothing was removed"));
        let stats = names.stats();
        assert_eq!((stats.dictionaries, stats.delta_names), (1, 0));
        let mut leaves = 0;
        names.search(&NamePattern::new(r"servers\.dc1\.[^.]*\.cpu\.user").unwrap(), |_, _| {
            leaves += 1;
            true
        });
        assert_eq!(leaves, 5_000);
    }
}
