//! A map of cached values within a byte budget whose oldest insertion goes first: what the
//! chunk group cache (`chunks::GroupCache`) and the series entry cache (`series_cache`) hold
//! behind their locks. Readers mostly meet entries in the order they were inserted (a query
//! reads a block in label order), so first in, first out costs no bookkeeping on a hit where a
//! least-recently-used order would.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

#[derive(Debug)]
pub(crate) struct Fifo<K, V> {
    entries: HashMap<K, V, foldhash::fast::RandomState>,
    order: VecDeque<K>,
    bytes: usize,
}

impl<K, V> Default for Fifo<K, V> {
    fn default() -> Self {
        Fifo { entries: HashMap::default(), order: VecDeque::new(), bytes: 0 }
    }
}

impl<K: Hash + Eq + Copy, V> Fifo<K, V> {
    pub fn get(&self, key: &K) -> Option<&V> {
        self.entries.get(key)
    }

    /// Bytes held, as `size` counted them at insertion.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Keeps `value` (of `size(&value)` bytes) unless it is larger than `budget` or `key` is
    /// held already, dropping the oldest entries until it fits. `size` must give a value the
    /// same count each time.
    pub fn insert(&mut self, key: K, value: V, budget: usize, size: impl Fn(&V) -> usize) {
        let bytes = size(&value);
        if bytes > budget || self.entries.contains_key(&key) {
            return;
        }
        while self.bytes + bytes > budget {
            let Some(old) = self.order.pop_front() else { break };
            if let Some(v) = self.entries.remove(&old) {
                self.bytes -= size(&v);
            }
        }
        self.bytes += bytes;
        self.order.push_back(key);
        self.entries.insert(key, value);
        debug_assert_eq!(self.order.len(), self.entries.len(), "every entry is in the order once");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_go_first_and_the_budget_holds() {
        let mut fifo: Fifo<u32, Vec<u8>> = Fifo::default();
        let size = |v: &Vec<u8>| v.len();
        for k in 0..10 {
            fifo.insert(k, vec![0; 100], 350, size);
            assert!(fifo.bytes() <= 350);
        }
        let kept: Vec<u32> = (0..10).filter(|k| fifo.get(k).is_some()).collect();
        assert_eq!(kept, [7, 8, 9]);
        assert_eq!((fifo.len(), fifo.bytes()), (3, 300));
        // A held key is not replaced; a value over the budget is not kept.
        fifo.insert(9, vec![1; 10], 350, size);
        assert_eq!(fifo.get(&9).map(Vec::len), Some(100));
        fifo.insert(20, vec![0; 351], 350, size);
        assert!(fifo.get(&20).is_none());
        assert_eq!(fifo.len(), 3);
        // A large one pushes out as many as it needs.
        fifo.insert(21, vec![0; 250], 350, size);
        let kept: Vec<u32> = [7, 8, 9, 21].into_iter().filter(|k| fifo.get(k).is_some()).collect();
        assert_eq!(kept, [9, 21]);
        assert_eq!(fifo.bytes(), 350);
    }
}
