//! The head's dictionary of metric names (`index::name_dict`): a built dictionary plus the
//! nodes of names created since (a `NameDelta`), both searched by one pattern.
//!
//! Building costs about a second per million names, so it is not done per new name: the delta
//! takes them (a sorted map, searched with the same skip-ahead walk), and maintenance rebuilds
//! the dictionary once the delta has grown past a share of it or series have been removed
//! (`wants_rebuild`). While the WAL is replayed nothing is collected; the dictionary is built
//! once at the end.

use std::sync::Arc;

use parking_lot::RwLock;

use crate::index::name_dict::{NameDelta, NameDict, NamePattern};

/// A delta smaller than this never asks for a rebuild.
const DELTA_NODES_MIN: usize = 4096;
/// Past `DELTA_NODES_MIN`, a rebuild is wanted once the delta holds this share of the
/// dictionary's node count: rebuilds then cost amortized O(1) per node added.
const DELTA_SHARE_DIVISOR: usize = 16;

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
    frozen: Option<NameDelta>,
    /// False while the WAL is replayed: names are not collected one by one then.
    collecting: bool,
    /// Series were removed: the dictionary may hold names no series has any more.
    stale: bool,
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
            let Inner { dict, delta, frozen, .. } = &mut *g;
            delta.add(dict, frozen.as_ref(), name);
        }
    }

    /// Series were removed; their names stay searchable until the next rebuild.
    pub fn mark_stale(&self) {
        self.inner.write().stale = true;
    }

    /// Whether maintenance should rebuild the dictionary (never while not collecting: replay
    /// ends with a rebuild of its own, and backfill heads are not searched by name).
    pub fn wants_rebuild(&self) -> bool {
        let g = self.inner.read();
        g.collecting && (g.stale || g.delta.len() > DELTA_NODES_MIN.max(g.dict.len() / DELTA_SHARE_DIVISOR))
    }

    /// A build is about to read the head's names: removals until now are covered by it (one
    /// during the build marks the dictionary stale again, for the next).
    pub fn begin_rebuild(&self) {
        let mut g = self.inner.write();
        g.stale = false;
        if g.frozen.is_none() {
            g.frozen = Some(std::mem::take(&mut g.delta));
        }
    }

    /// Installs a dictionary built from every name the head had when the build started; the
    /// delta keeps the names created during the build (some of which the build saw too: a node
    /// in both is only visited twice).
    pub fn replace(&self, dict: NameDict) {
        let mut g = self.inner.write();
        let frozen = g.frozen.take();
        g.dict = Arc::new(dict);
        g.collecting = true;
        drop(g);
        // Freed outside the lock.
        drop(frozen);
    }

    /// `NameDict::search` over the dictionary and the delta; a node in both is visited twice
    /// (with the flags each has). False, visiting nothing, while names are not collected (the
    /// caller scans the postings' values instead).
    pub fn search(&self, pattern: &NamePattern, mut visit: impl FnMut(&[u8], u8) -> bool) -> bool {
        let g = self.inner.read();
        if !g.collecting {
            return false;
        }
        let mut go_on = true;
        g.dict.search(pattern, |k, f| {
            go_on = visit(k, f);
            go_on
        });
        for delta in g.frozen.iter().chain([&g.delta]) {
            if go_on {
                delta.search(pattern, |k, f| {
                    go_on = visit(k, f);
                    go_on
                });
            }
        }
        true
    }

    /// Nodes in the dictionary and the delta, and the dictionary's bytes.
    pub fn stats(&self) -> (usize, usize, usize) {
        let g = self.inner.read();
        (g.dict.len(), g.delta.len() + g.frozen.as_ref().map_or(0, NameDelta::len), g.dict.bytes())
    }
}
