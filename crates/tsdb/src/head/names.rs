//! The head's dictionary of metric names (`index::name_dict`): a built dictionary, a smaller
//! one of names folded in since, and the nodes of names created since (a `NameDelta`), all
//! searched by one pattern.
//!
//! Building costs about a second per million names, so it is not done per new name: the delta
//! takes them (a sorted map, searched with the same skip-ahead walk), and maintenance rebuilds
//! the dictionary once the delta has grown past a share of it or series have been removed
//! (`wanted`), at most a tenth of the time; while a rebuild waits, the delta is folded into the
//! recent dictionary, a build costing only their size. While the WAL is replayed nothing is
//! collected; the dictionary is built once at the end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;

use crate::index::name_dict::{NameDelta, NameDict, NamePattern};

/// A delta smaller than this never asks for a rebuild.
const DELTA_NODES_MIN: usize = 4096;
/// Past `DELTA_NODES_MIN`, a rebuild (or a fold) is wanted once the delta holds this share of
/// the dictionaries' node count.
const DELTA_SHARE_DIVISOR: usize = 16;
/// After a rebuild, the next one waits this many times as long as it took (unless the delta
/// outgrew the dictionary): while a burst of new paths arrives (a Graphite installation
/// starting to send a million), rebuilds take at most a tenth of a core instead of rebuilding
/// the whole dictionary every time the delta reached a sixteenth of it (about 17 times the
/// final build's work, a fifth of the CPU time of carbon ingest at a million new paths).
/// Meanwhile the delta is folded into the recent dictionary (`fold_delta`): a delta searched
/// as a sorted map seeks per prefix the automaton rules out, far slower than a trie.
const REBUILD_PAUSE_FACTOR: u32 = 9;

#[derive(Debug)]
pub(crate) struct HeadNames {
    inner: RwLock<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    dict: Arc<NameDict>,
    delta: NameDelta,
    /// The delta as it was when the running rebuild started: the build reads every name it
    /// holds, so it is dropped whole when the new dictionary is installed (sorting out which
    /// nodes of a million-node delta the new dictionary holds took the lock for a second, and
    /// every series creation waited), and searched until then.
    frozen: Option<Arc<NameDelta>>,
    /// Nodes folded out of the delta while a rebuild had to wait (`fold_delta`): a second,
    /// smaller dictionary, searched as fast as the first, emptied by the next rebuild.
    recent: Arc<NameDict>,
    /// False while the WAL is replayed: names are not collected one by one then.
    collecting: bool,
    /// Series were removed: the dictionary may hold names no series has any more.
    stale: bool,
    /// When the running rebuild started.
    build_started: Option<Instant>,
    /// When the last rebuild ended, and how long it took.
    last_build: Option<(Instant, Duration)>,
}

impl HeadNames {
    /// Collecting names from the start (`true`: a head without a WAL to replay) or only from
    /// the first `replace` (`false`: the WAL is about to be replayed, or the head is a
    /// backfill's, never searched by name).
    pub fn new(collecting: bool) -> HeadNames {
        HeadNames { inner: RwLock::new(Inner { collecting, ..Inner::default() }) }
    }

    /// A series with a new metric name was created.
    pub fn add(&self, name: &str) {
        let mut g = self.inner.write();
        if g.collecting {
            let Inner { dict, recent, delta, frozen, .. } = &mut *g;
            delta.add(&[dict, recent], frozen.as_deref(), name);
        }
    }

    /// Series were removed; their names stay searchable until the next rebuild.
    pub fn mark_stale(&self) {
        self.inner.write().stale = true;
    }

    /// What maintenance should do now, if anything (never while not collecting: replay ends
    /// with a rebuild of its own, and backfill heads are not searched by name). A rebuild is
    /// due once the delta holds a sixteenth of the dictionaries' nodes or series were
    /// removed, and waits for the pause after the last one (`REBUILD_PAUSE_FACTOR`) unless
    /// the delta and the recent dictionary outgrew the main one; while it waits, a delta that
    /// reached half the recent dictionary is folded into it.
    pub fn wanted(&self, now: Instant) -> Option<NamesMaintenance> {
        let g = self.inner.read();
        let indexed = g.dict.len() + g.recent.len();
        let big_delta = g.delta.len() > DELTA_NODES_MIN.max(indexed / DELTA_SHARE_DIVISOR);
        if !g.collecting || !(g.stale || big_delta) {
            return None;
        }
        // Past the main dictionary, a rebuild at least doubles it: rebuilds cost about twice
        // the final build in all.
        let outgrown = g.delta.len() + g.recent.len() > g.dict.len();
        if outgrown || g.last_build.is_none_or(|(ended, took)| now >= ended + took * REBUILD_PAUSE_FACTOR) {
            return Some(NamesMaintenance::Rebuild);
        }
        // Folds each at least add half again to the recent dictionary: they cost about three
        // times its final build in all.
        (big_delta && g.delta.len() >= g.recent.len() / 2).then_some(NamesMaintenance::Fold)
    }

    /// Folds the delta into the recent dictionary: built from the two outside the lock (the
    /// delta frozen meanwhile, searched and consulted as during a rebuild), then installed.
    /// Costs about the recent dictionary's size, where a rebuild costs the head's.
    pub fn fold_delta(&self) {
        let (recent, frozen) = {
            let mut g = self.inner.write();
            if g.frozen.is_some() {
                // A rebuild is running; it covers the delta.
                return;
            }
            let frozen = Arc::new(std::mem::take(&mut g.delta));
            g.frozen = Some(frozen.clone());
            (g.recent.clone(), frozen)
        };
        let folded = Arc::new(recent.union(&frozen));
        let mut g = self.inner.write();
        let frozen = g.frozen.take();
        g.recent = folded;
        drop(g);
        drop(frozen);
    }

    /// A build is about to read the head's names: removals until now are covered by it (one
    /// during the build marks the dictionary stale again, for the next).
    pub fn begin_rebuild(&self) {
        let mut g = self.inner.write();
        g.stale = false;
        g.build_started = Some(Instant::now());
        if g.frozen.is_none() {
            g.frozen = Some(Arc::new(std::mem::take(&mut g.delta)));
        }
    }

    /// Installs a dictionary built from every name the head had when the build started; the
    /// delta keeps the names created during the build (some of which the build saw too: a node
    /// in both is only visited twice).
    pub fn replace(&self, dict: NameDict) {
        let mut g = self.inner.write();
        let frozen = g.frozen.take();
        let now = Instant::now();
        g.last_build = g.build_started.take().map(|started| (now, now.saturating_duration_since(started)));
        g.dict = Arc::new(dict);
        // The build read every name the head had: the recent dictionary's too.
        let recent = std::mem::take(&mut g.recent);
        g.collecting = true;
        drop(g);
        // Freed outside the lock.
        drop((frozen, recent));
    }

    /// `NameDict::search` over the dictionaries and the delta; a node in both is visited twice
    /// (with the flags each has). False, visiting nothing, while names are not collected (the
    /// caller scans the postings' values instead).
    pub fn search(&self, pattern: &NamePattern, mut visit: impl FnMut(&[u8], u8) -> bool) -> bool {
        let g = self.inner.read();
        if !g.collecting {
            return false;
        }
        let mut go_on = true;
        for dict in [&g.dict, &g.recent] {
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

    /// Nodes in the dictionaries (main and recent) and the delta, and the dictionaries' bytes.
    pub fn stats(&self) -> (usize, usize, usize) {
        let g = self.inner.read();
        let delta = g.delta.len() + g.frozen.as_ref().map_or(0, |f| f.len());
        (g.dict.len() + g.recent.len(), delta, g.dict.bytes() + g.recent.bytes())
    }
}

/// What `HeadNames::wanted` asks maintenance for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NamesMaintenance {
    /// A new dictionary from the head's names (`Head::rebuild_names`).
    Rebuild,
    /// The delta folded into the recent dictionary (`HeadNames::fold_delta`).
    Fold,
}
