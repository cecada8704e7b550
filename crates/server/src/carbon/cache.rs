//! Which series each path a connection sends resolved to, so that the next point of a path is
//! appended without checking the path again or looking its label set up in the head (the
//! scrape cache does the same for scraped series). Senders repeat the same paths every
//! interval, so nearly every line after the first interval hits.
//!
//! A cache belongs to one connection (no locks); all of them together hold at most the
//! configured number of entries (`--carbon.path-cache-entries`): a connection that would pass
//! the shared budget empties its own cache and starts over. An entry is the 128-bit hash of
//! the path as sent and the series, about 40 bytes with the map's slack. A 128-bit hash makes
//! two paths meeting in one entry about as likely as a cosmic ray flipping the bit that tells
//! them apart, and saves keeping every path a second time.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use strata_tsdb::head::MemSeries;

/// The budget every connection's cache draws on.
#[derive(Debug)]
pub struct CacheBudget {
    entries: AtomicUsize,
    limit: usize,
}

impl CacheBudget {
    /// `limit` entries in all; 0 turns caching off.
    pub fn new(limit: usize) -> Arc<CacheBudget> {
        Arc::new(CacheBudget { entries: AtomicUsize::new(0), limit })
    }

    /// Entries held by every cache together.
    pub fn entries(&self) -> usize {
        self.entries.load(Ordering::Relaxed)
    }
}

/// The key of a path: the 128-bit hash of its bytes as sent (a tagged path's tags in the
/// sender's order: another order is another entry for the same series).
pub fn path_key(path: &str) -> u128 {
    xxhash_rust::xxh3::xxh3_128(path.as_bytes())
}

/// One connection's cache.
#[derive(Debug)]
pub struct SeriesCache {
    map: HashMap<u128, Arc<MemSeries>, BuildHasherDefault<KeyHasher>>,
    budget: Arc<CacheBudget>,
}

impl SeriesCache {
    pub fn new(budget: Arc<CacheBudget>) -> SeriesCache {
        SeriesCache { map: HashMap::default(), budget }
    }

    pub fn get(&self, key: u128) -> Option<&Arc<MemSeries>> {
        self.map.get(&key)
    }

    /// Forgets a series the head no longer has.
    pub fn remove(&mut self, key: u128) {
        if self.map.remove(&key).is_some() {
            self.budget.entries.fetch_sub(1, Ordering::Relaxed);
        }
    }

    pub fn insert(&mut self, key: u128, series: Arc<MemSeries>) {
        if self.budget.limit == 0 {
            return;
        }
        if let Some(slot) = self.map.get_mut(&key) {
            *slot = series;
            return;
        }
        if self.budget.entries.fetch_add(1, Ordering::Relaxed) >= self.budget.limit {
            // Over budget: start over (a cache that thrashes costs a lookup and an insert per
            // point; one that is emptied now and then is as good as full most of the time).
            self.budget.entries.fetch_sub(1 + self.map.len(), Ordering::Relaxed);
            self.map = HashMap::default();
            if self.budget.entries.fetch_add(1, Ordering::Relaxed) >= self.budget.limit {
                // Other connections hold the whole budget.
                self.budget.entries.fetch_sub(1, Ordering::Relaxed);
                return;
            }
        }
        self.map.insert(key, series);
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

impl Drop for SeriesCache {
    fn drop(&mut self) {
        self.budget.entries.fetch_sub(self.map.len(), Ordering::Relaxed);
    }
}

/// The map's hasher: the key is a hash already, so its low 64 bits are the bucket hash.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only u128 keys are hashed here; this is for completeness.
        for &b in bytes {
            self.0 = (self.0.rotate_left(8)) ^ u64::from(b);
        }
    }

    fn write_u128(&mut self, n: u128) {
        self.0 = n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_model::Labels;
    use strata_tsdb::head::{Head, HeadOptions};

    fn series(head: &Head, name: &str) -> Arc<MemSeries> {
        let mut app = head.appender();
        let s = app.append_handle(&Labels::from_pairs([("__name__", name)]), 1, 1.0).unwrap();
        app.commit().unwrap();
        s
    }

    #[test]
    fn all_caches_together_stay_within_the_budget() {
        let head = Head::in_memory(HeadOptions::default());
        let budget = CacheBudget::new(3);
        let (mut a, mut b) = (SeriesCache::new(budget.clone()), SeriesCache::new(budget.clone()));
        for p in ["a", "b"] {
            a.insert(path_key(p), series(&head, p));
        }
        b.insert(path_key("c"), series(&head, "c"));
        assert_eq!((a.len(), b.len(), budget.entries()), (2, 1, 3));
        // Past the budget, the inserting cache empties itself and keeps the new entry.
        b.insert(path_key("d"), series(&head, "d"));
        assert_eq!((a.len(), b.len(), budget.entries()), (2, 1, 3));
        assert!(b.get(path_key("d")).is_some() && b.get(path_key("c")).is_none());
        // Replacing an entry costs nothing; removing and dropping give entries back.
        a.insert(path_key("a"), series(&head, "a"));
        assert_eq!(budget.entries(), 3);
        a.remove(path_key("a"));
        assert_eq!(budget.entries(), 2);
        drop(a);
        assert_eq!(budget.entries(), 1);
        drop(b);
        assert_eq!(budget.entries(), 0);
    }

    #[test]
    fn a_zero_budget_caches_nothing() {
        let head = Head::in_memory(HeadOptions::default());
        let mut c = SeriesCache::new(CacheBudget::new(0));
        c.insert(path_key("a"), series(&head, "a"));
        assert!(c.is_empty());
    }
}
