//! The head's inverted index: label name → label value → sorted series references.
//!
//! Series references are handed out in increasing order, so appending a new series to a list
//! keeps it sorted; two series created concurrently may arrive swapped, which the insertion fixes
//! (in O(1) for the usual swap of the last two, by rebuilding the list otherwise).
//!
//! Lists are delta-varint packed: consecutive references in a list are usually close, so an entry
//! costs one or two bytes instead of eight. The head holds one entry per label of every series,
//! which makes this the biggest lever on memory per series.

use std::collections::HashMap;

use parking_lot::RwLock;
use strata_model::SeriesRef;

use super::symbols::SymbolId;
use crate::encoding::{put_uvarint, read_uvarint_trusted};
use crate::hash::U64Map;

/// Series per label name, and series per label pair.
pub type PostingsStats = (HashMap<SymbolId, usize>, Vec<((SymbolId, SymbolId), usize)>);

#[derive(Debug, Default)]
struct Inner {
    by_name: U64Map<SymbolId, U64Map<SymbolId, PackedPostings>>,
    all: PackedPostings,
}

/// The postings, locked for writing.
#[derive(Debug)]
pub struct PostingsWriter<'a>(parking_lot::RwLockWriteGuard<'a, Inner>);

impl PostingsWriter<'_> {
    pub fn add(&mut self, r: SeriesRef, labels: impl Iterator<Item = (SymbolId, SymbolId)>) {
        let w = &mut *self.0;
        for (n, v) in labels {
            w.by_name.entry(n).or_default().entry(v).or_default().insert(r);
        }
        w.all.insert(r);
    }

    /// How many series `n=v` has.
    pub fn list_len(&self, n: SymbolId, v: SymbolId) -> usize {
        self.0.by_name.get(&n).and_then(|values| values.get(&v)).map_or(0, PackedPostings::len)
    }
}

#[derive(Debug, Default)]
pub struct MemPostings {
    inner: RwLock<Inner>,
}

impl MemPostings {
    /// Approximate heap bytes: the packed lists and the maps holding them.
    pub fn heap_bytes(&self) -> usize {
        let r = self.inner.read();
        let entry = std::mem::size_of::<(SymbolId, PackedPostings)>() + 1;
        let mut total = r.all.data.capacity() + r.by_name.capacity() * (entry + 48);
        for values in r.by_name.values() {
            total += values.capacity() * entry + values.values().map(|p| p.data.capacity()).sum::<usize>();
        }
        total
    }
}

/// A sorted, duplicate-free list of series references, delta-varint packed.
#[derive(Debug, Default, Clone)]
pub struct PackedPostings {
    data: Vec<u8>,
    /// The largest (last) reference.
    last: u64,
    /// Byte offset where the last delta starts.
    last_off: u32,
    len: u32,
}

impl PackedPostings {
    pub fn from_sorted(refs: &[SeriesRef]) -> Self {
        let mut p = PackedPostings::default();
        for &r in refs {
            p.push_greater(r);
        }
        p
    }

    fn push_greater(&mut self, r: SeriesRef) {
        debug_assert!(self.len == 0 || r.0 > self.last);
        let prev = if self.len == 0 { 0 } else { self.last };
        self.last_off = self.data.len() as u32;
        put_uvarint(&mut self.data, r.0 - prev);
        self.last = r.0;
        self.len += 1;
    }

    /// Inserts `r`, keeping the list sorted; a reference already present is ignored.
    pub fn insert(&mut self, r: SeriesRef) {
        if self.len == 0 || r.0 > self.last {
            return self.push_greater(r);
        }
        if r.0 == self.last {
            return;
        }
        // The usual race: `r` belongs just before the last entry.
        let mut pos = self.last_off as usize;
        let last_delta = read_uvarint_trusted(&self.data, &mut pos);
        let before_last = self.last - last_delta;
        if self.len >= 2 && r.0 > before_last || self.len == 1 {
            let last = self.last;
            self.data.truncate(self.last_off as usize);
            self.len -= 1;
            self.last = before_last;
            self.push_greater(r);
            self.push_greater(SeriesRef(last));
            return;
        }
        let mut v = self.to_vec();
        let i = v.partition_point(|x| *x < r);
        if v.get(i) != Some(&r) {
            v.insert(i, r);
        }
        *self = Self::from_sorted(&v);
    }

    pub fn iter(&self) -> impl Iterator<Item = SeriesRef> + '_ {
        let mut pos = 0;
        let mut acc = 0u64;
        std::iter::from_fn(move || {
            if pos >= self.data.len() {
                return None;
            }
            acc += read_uvarint_trusted(&self.data, &mut pos);
            Some(SeriesRef(acc))
        })
    }

    pub fn to_vec(&self) -> Vec<SeriesRef> {
        let mut v = Vec::with_capacity(self.len as usize);
        v.extend(self.iter());
        v
    }

    pub fn len(&self) -> usize {
        self.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn retain(&mut self, keep: impl Fn(SeriesRef) -> bool) {
        let v: Vec<SeriesRef> = self.iter().filter(|&r| keep(r)).collect();
        *self = Self::from_sorted(&v);
    }
}

impl MemPostings {
    /// Adds series `r` with label symbol pairs `labels`.
    pub fn add(&self, r: SeriesRef, labels: impl Iterator<Item = (SymbolId, SymbolId)>) {
        self.writer().add(r, labels);
    }

    /// Holds the write lock across several steps (see `Head::insert_series`).
    pub fn writer(&self) -> PostingsWriter<'_> {
        PostingsWriter(self.inner.write())
    }

    /// Removes the given series from every list (head garbage collection).
    pub fn delete(&self, dead: &std::collections::HashSet<SeriesRef>) {
        let mut w = self.inner.write();
        for values in w.by_name.values_mut() {
            for list in values.values_mut() {
                list.retain(|r| !dead.contains(&r));
            }
            values.retain(|_, l| !l.is_empty());
        }
        w.by_name.retain(|_, v| !v.is_empty());
        w.all.retain(|r| !dead.contains(&r));
    }

    /// Copies of the lists of `name` for each of `values`.
    pub fn get_many(&self, name: SymbolId, values: impl Iterator<Item = SymbolId>) -> Vec<Vec<SeriesRef>> {
        let r = self.inner.read();
        let Some(m) = r.by_name.get(&name) else { return Vec::new() };
        values.filter_map(|v| m.get(&v).map(PackedPostings::to_vec)).collect()
    }

    /// Every series in the head.
    pub fn all(&self) -> Vec<SeriesRef> {
        self.inner.read().all.to_vec()
    }

    pub fn label_names(&self) -> Vec<SymbolId> {
        self.inner.read().by_name.keys().copied().collect()
    }

    pub fn label_values(&self, name: SymbolId) -> Vec<SymbolId> {
        self.inner.read().by_name.get(&name).map(|m| m.keys().copied().collect()).unwrap_or_default()
    }

    /// Series count per label name and per label pair (for cardinality statistics).
    pub fn stats(&self) -> PostingsStats {
        let r = self.inner.read();
        let mut per_name = HashMap::new();
        let mut pairs = Vec::new();
        for (n, values) in &r.by_name {
            per_name.insert(*n, values.values().map(PackedPostings::len).sum());
            pairs.extend(values.iter().map(|(v, l)| ((*n, *v), l.len())));
        }
        (per_name, pairs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Packed lists behave as a sorted set under any insertion order.
        #[test]
        fn packed_postings_are_a_sorted_set(refs in prop::collection::vec(0u64..5000, 0..200)) {
            let mut p = PackedPostings::default();
            let mut model = std::collections::BTreeSet::new();
            for &r in &refs {
                p.insert(SeriesRef(r));
                model.insert(r);
            }
            prop_assert_eq!(p.to_vec(), model.iter().map(|&r| SeriesRef(r)).collect::<Vec<_>>());
            prop_assert_eq!(p.len(), model.len());
            p.retain(|r| r.0 % 2 == 0);
            prop_assert_eq!(p.to_vec(), model.iter().filter(|&&r| r % 2 == 0).map(|&r| SeriesRef(r)).collect::<Vec<_>>());
        }
    }

    #[test]
    fn concurrent_out_of_order_adds_stay_sorted() {
        let p = MemPostings::default();
        for r in [1u64, 3, 2, 5, 4, 0] {
            p.add(SeriesRef(r), [(7, 8)].into_iter());
        }
        assert_eq!(p.get_many(7, [8].into_iter()), vec![(0..6).map(SeriesRef).collect::<Vec<_>>()]);
        assert_eq!(p.all(), (0..6).map(SeriesRef).collect::<Vec<_>>());
        p.delete(&[SeriesRef(2)].into_iter().collect());
        assert_eq!(p.get_many(7, [8].into_iter()), vec![[0, 1, 3, 4, 5].map(SeriesRef).to_vec()]);
    }
}
