//! Which series each path a connection sends resolved to, so that the next point of a path is
//! appended without checking the path again or looking its label set up in the head (the
//! scrape cache does the same for scraped series). Senders repeat the same paths every
//! interval, so nearly every line after the first interval hits.
//!
//! A cache belongs to one connection (no locks); all of them together hold at most the
//! configured number of entries (`--carbon.path-cache-entries`): a connection that would pass
//! the shared budget empties its own cache and starts over. An entry is the 128-bit hash of
//! the path as sent and the series, a 24-byte slot (two to four slots an entry with the table's
//! slack). A 128-bit hash makes two paths meeting in one entry about as likely as a cosmic ray
//! flipping the bit that tells them apart, and saves keeping every path a second time.
//!
//! The table is our own (open addressing, linear probing), not a general map: a relay's
//! connection sends hundreds of thousands of paths, so nearly every lookup misses the CPU's
//! caches, and a lookup into a general map missed twice (its control bytes, then its entry). A
//! slot here holds key and series together, and `prefetch` lets the reader ask for a
//! line's slot while it parses the lines before it (profile of 1M paths × 10 points over 4
//! connections: the two misses were a fifth of the server's CPU).

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
pub fn path_key(path: &[u8]) -> u128 {
    xxhash_rust::xxh3::xxh3_128(path)
}

/// One connection's cache.
#[derive(Debug)]
pub struct SeriesCache {
    map: SlotTable,
    budget: Arc<CacheBudget>,
}

impl SeriesCache {
    pub fn new(budget: Arc<CacheBudget>) -> SeriesCache {
        SeriesCache { map: SlotTable::default(), budget }
    }

    pub fn get(&self, key: u128) -> Option<&Arc<MemSeries>> {
        self.map.get(key)
    }

    /// Asks the CPU to load `key`'s slot: a `get` of it a few lines later finds it in cache.
    pub fn prefetch(&self, key: u128) {
        self.map.prefetch(key);
    }

    /// Forgets a series the head no longer has.
    pub fn remove(&mut self, key: u128) {
        if self.map.remove(key).is_some() {
            self.budget.entries.fetch_sub(1, Ordering::Relaxed);
        }
    }

    pub fn insert(&mut self, key: u128, series: Arc<MemSeries>) {
        if self.budget.limit == 0 {
            return;
        }
        if let Some(slot) = self.map.get_mut(key) {
            *slot = series;
            return;
        }
        if self.budget.entries.fetch_add(1, Ordering::Relaxed) >= self.budget.limit {
            // Over budget: start over (a cache that thrashes costs a lookup and an insert per
            // point; one that is emptied now and then is as good as full most of the time).
            self.budget.entries.fetch_sub(1 + self.map.len(), Ordering::Relaxed);
            self.map = SlotTable::default();
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

/// A slot: a key and its series (`None`: empty), 24 bytes: the key as two words, so that it
/// is not aligned to 16 bytes (which made a slot 32 bytes, a third more). Some slots straddle
/// two cache lines; that costs little, as a probe reads on into the next slots anyway.
#[derive(Debug, Default)]
struct Slot {
    key: [u64; 2],
    series: Option<Arc<MemSeries>>,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 24);

/// A key as a slot holds it.
fn words(key: u128) -> [u64; 2] {
    [key as u64, (key >> 64) as u64]
}

/// A slot's key as a key.
fn unwords([low, high]: [u64; 2]) -> u128 {
    u128::from(low) | (u128::from(high) << 64)
}

/// Keys (hashes already: their low bits are the home slot) to series, by linear probing in a
/// power-of-two table at most half full; removal shifts the entries after it back, so there are
/// no tombstones.
#[derive(Debug, Default)]
struct SlotTable {
    slots: Vec<Slot>,
    len: usize,
}

impl SlotTable {
    const MIN_SLOTS: usize = 64;

    fn mask(&self) -> usize {
        self.slots.len().wrapping_sub(1)
    }

    fn home(&self, key: u128) -> usize {
        key as usize & self.mask()
    }

    /// The slot holding `key`, or the empty slot where it would go; `None` in an empty table.
    fn find(&self, key: u128) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let mut i = self.home(key);
        loop {
            let slot = &self.slots[i];
            if slot.series.is_none() || slot.key == words(key) {
                return Some(i);
            }
            i = (i + 1) & self.mask();
        }
    }

    fn get(&self, key: u128) -> Option<&Arc<MemSeries>> {
        let i = self.find(key)?;
        self.slots[i].series.as_ref().filter(|_| self.slots[i].key == words(key))
    }

    fn get_mut(&mut self, key: u128) -> Option<&mut Arc<MemSeries>> {
        let i = self.find(key)?;
        let slot = &mut self.slots[i];
        slot.series.as_mut().filter(|_| slot.key == words(key))
    }

    fn prefetch(&self, key: u128) {
        if self.slots.is_empty() {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        {
            let at = &self.slots[self.home(key)] as *const Slot as *const i8;
            // SAFETY: a prefetch is a hint; it reads nothing and `at` points into the table.
            #[allow(unused_unsafe)]
            unsafe {
                std::arch::x86_64::_mm_prefetch(at, std::arch::x86_64::_MM_HINT_T0)
            };
        }
    }

    fn insert(&mut self, key: u128, series: Arc<MemSeries>) {
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow();
        }
        let i = self.find(key).expect("the table has slots");
        if self.slots[i].series.is_none() {
            self.len += 1;
        }
        self.slots[i] = Slot { key: words(key), series: Some(series) };
    }

    fn grow(&mut self) {
        let n = (self.slots.len() * 2).max(Self::MIN_SLOTS);
        let old = std::mem::replace(&mut self.slots, (0..n).map(|_| Slot::default()).collect());
        for slot in old {
            if slot.series.is_some() {
                let i = self.find(unwords(slot.key)).expect("the table has slots");
                self.slots[i] = slot;
            }
        }
    }

    fn remove(&mut self, key: u128) -> Option<Arc<MemSeries>> {
        let mut hole = self.find(key)?;
        if self.slots[hole].key != words(key) {
            return None;
        }
        let removed = self.slots[hole].series.take()?;
        self.len -= 1;
        // Shift back each entry after the hole whose home does not lie between the hole and it
        // (cyclically), so that every entry stays reachable from its home without gaps.
        let mask = self.mask();
        let mut j = (hole + 1) & mask;
        while self.slots[j].series.is_some() {
            let home = self.home(unwords(self.slots[j].key));
            if j.wrapping_sub(home) & mask >= j.wrapping_sub(hole) & mask {
                self.slots[hole] = std::mem::take(&mut self.slots[j]);
                hole = j;
            }
            j = (j + 1) & mask;
        }
        Some(removed)
    }

    fn len(&self) -> usize {
        self.len
    }

    fn is_empty(&self) -> bool {
        self.len == 0
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
            a.insert(path_key(p.as_bytes()), series(&head, p));
        }
        b.insert(path_key(b"c"), series(&head, "c"));
        assert_eq!((a.len(), b.len(), budget.entries()), (2, 1, 3));
        // Past the budget, the inserting cache empties itself and keeps the new entry.
        b.insert(path_key(b"d"), series(&head, "d"));
        assert_eq!((a.len(), b.len(), budget.entries()), (2, 1, 3));
        assert!(b.get(path_key(b"d")).is_some() && b.get(path_key(b"c")).is_none());
        // Replacing an entry costs nothing; removing and dropping give entries back.
        a.insert(path_key(b"a"), series(&head, "a"));
        assert_eq!(budget.entries(), 3);
        a.remove(path_key(b"a"));
        assert_eq!(budget.entries(), 2);
        drop(a);
        assert_eq!(budget.entries(), 1);
        drop(b);
        assert_eq!(budget.entries(), 0);
    }

    proptest::proptest! {
        /// Inserts, replacements and removals agree with a map; keys that share home slots
        /// (few distinct low bits) make long probe runs that removal must shift back.
        #[test]
        fn the_slot_table_agrees_with_a_map(ops in proptest::collection::vec((0u8..3, 0u128..40, 0u128..4), 0..400)) {
            let head = Head::in_memory(HeadOptions::default());
            let s = series(&head, "a");
            let mut t = SlotTable::default();
            let mut model = std::collections::HashMap::new();
            for (op, low, high) in ops {
                // Low bits pick the home slot; high bits tell keys apart.
                let key = (high << 64) | (low * 64);
                match op {
                    0 => {
                        t.insert(key, s.clone());
                        model.insert(key, ());
                    }
                    1 => proptest::prop_assert_eq!(t.remove(key).is_some(), model.remove(&key).is_some()),
                    _ => proptest::prop_assert_eq!(t.get(key).is_some(), model.contains_key(&key)),
                }
                proptest::prop_assert_eq!(t.len(), model.len());
            }
            for k in model.keys() {
                proptest::prop_assert!(t.get(*k).is_some());
            }
        }
    }

    #[test]
    fn a_zero_budget_caches_nothing() {
        let head = Head::in_memory(HeadOptions::default());
        let mut c = SeriesCache::new(CacheBudget::new(0));
        c.insert(path_key(b"a"), series(&head, "a"));
        assert!(c.is_empty());
    }
}
