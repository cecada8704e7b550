//! The scrape cache's table: series texts as a target exposes them, each with what the loop
//! knows of it, found by position first and by hash second.
//!
//! Targets expose their series in the same order scrape after scrape, so the slots are kept in
//! exposition order and the next series is expected in the slot after the last one found: a
//! comparison of two strings that sit next to each other in memory, instead of a hash and a
//! probe into a table of hundreds of thousands of entries. When the order changes (a series
//! appears or goes), the hash table finds it, and the slots are put back in exposition order
//! after the scrape.

use hashbrown::HashTable;

#[derive(Debug)]
struct Slot<E> {
    key: Box<str>,
    entry: E,
    /// Where in the last scrape the series was (its sample index), to restore the order.
    position: u32,
}

#[derive(Debug)]
pub struct ScrapeCache<E> {
    slots: Vec<Slot<E>>,
    /// Indexes into `slots`, by the hash of their key.
    table: HashTable<u32>,
    hasher: foldhash::fast::RandomState,
    /// The slot the next series is expected in.
    cursor: usize,
    /// Sample index within the current scrape.
    position: u32,
    /// A series was found away from the cursor this scrape.
    reordered: bool,
}

impl<E> Default for ScrapeCache<E> {
    fn default() -> Self {
        ScrapeCache {
            slots: Vec::new(),
            table: HashTable::new(),
            hasher: Default::default(),
            cursor: 0,
            position: 0,
            reordered: false,
        }
    }
}

impl<E> ScrapeCache<E> {
    fn hash(hasher: &foldhash::fast::RandomState, key: &str) -> u64 {
        std::hash::BuildHasher::hash_one(hasher, key)
    }

    /// Call before each scrape's first lookup.
    pub fn start(&mut self) {
        self.cursor = 0;
        self.position = 0;
        self.reordered = false;
    }

    /// The entry of `key` (and marks where it was seen), or `None`.
    pub fn find(&mut self, key: &str) -> Option<&mut E> {
        let position = self.position;
        self.position += 1;
        let i = match self.slots.get(self.cursor) {
            Some(s) if &*s.key == key => self.cursor,
            _ => {
                let h = Self::hash(&self.hasher, key);
                let slots = &self.slots;
                let i = *self.table.find(h, |&i| &*slots[i as usize].key == key)? as usize;
                self.reordered = true;
                i
            }
        };
        self.cursor = i + 1;
        let slot = &mut self.slots[i];
        slot.position = position;
        Some(&mut slot.entry)
    }

    /// Adds a key `find` did not find (counted at the position of that `find`).
    pub fn insert(&mut self, key: &str, entry: E) {
        let i = self.slots.len();
        let position = self.position.saturating_sub(1);
        self.slots.push(Slot { key: key.into(), entry, position });
        let (slots, hasher) = (&self.slots, &self.hasher);
        let h = Self::hash(hasher, key);
        self.table.insert_unique(h, i as u32, |&j| Self::hash(hasher, &slots[j as usize].key));
        // A new series is never where the cursor expected it.
        self.reordered = true;
        self.cursor = i + 1;
    }

    /// Replaces the entry of a key found in this scrape (the cursor points past it).
    pub fn replace_last_found(&mut self, entry: E) {
        if let Some(slot) = self.cursor.checked_sub(1).and_then(|i| self.slots.get_mut(i)) {
            slot.entry = entry;
        }
    }

    /// After a scrape: keeps the entries `keep` accepts and, if the scrape's order differed,
    /// puts the slots back in exposition order.
    pub fn retain(&mut self, keep: impl Fn(&E) -> bool) {
        let before = self.slots.len();
        self.slots.retain(|s| keep(&s.entry));
        if self.slots.len() == before && !self.reordered {
            return;
        }
        self.slots.sort_by_key(|s| s.position);
        self.table.clear();
        let (slots, hasher) = (&self.slots, &self.hasher);
        for (i, s) in slots.iter().enumerate() {
            self.table
                .insert_unique(Self::hash(hasher, &s.key), i as u32, |&j| Self::hash(hasher, &slots[j as usize].key));
        }
    }

    pub fn values(&self) -> impl Iterator<Item = &E> {
        self.slots.iter().map(|s| &s.entry)
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_by_position_and_by_hash_and_restores_the_order() {
        let mut c: ScrapeCache<u32> = ScrapeCache::default();
        c.start();
        for (i, k) in ["a", "b", "c"].iter().enumerate() {
            assert!(c.find(k).is_none());
            c.insert(k, i as u32);
        }
        c.retain(|_| true);
        // Same order: every lookup is positional, nothing to restore.
        c.start();
        for k in ["a", "b", "c"] {
            assert!(c.find(k).is_some());
        }
        assert!(!c.reordered);
        // A new series in the middle and one gone: found by hash, order restored after.
        c.start();
        assert_eq!(c.find("a").copied(), Some(0));
        assert!(c.find("x").is_none());
        c.insert("x", 9);
        assert_eq!(c.find("c").copied(), Some(2));
        assert!(c.reordered);
        c.retain(|&e| e != 1);
        let keys: Vec<&str> = c.slots.iter().map(|s| &*s.key).collect();
        assert_eq!(keys, ["a", "x", "c"]);
        c.start();
        assert_eq!(c.find("a").copied(), Some(0));
        assert_eq!(c.find("x").copied(), Some(9));
        assert_eq!(c.find("c").copied(), Some(2));
        assert!(!c.reordered);
        assert!(c.find("b").is_none());
        *c.find("x").unwrap() = 10;
        c.replace_last_found(11);
        assert_eq!(c.values().copied().collect::<Vec<_>>(), [0, 11, 2]);
    }
}
