//! The head's inverted index: label name → label value → sorted series references.
//!
//! Series references are handed out in increasing order, so appending a new series to a list
//! keeps it sorted; two series created concurrently may arrive swapped, which the insertion fixes
//! (in O(1) for the usual swap of the last two, by rebuilding the list otherwise).
//!
//! Lists are delta-varint packed: consecutive references in a list are usually close, so an entry
//! costs one or two bytes instead of eight. The head holds one entry per label of every series,
//! which makes this the biggest lever on memory per series.
//!
//! A label pair held by one series (a Graphite path, a pod's name: a million of them at a million
//! paths) keeps its reference in a map of its own, 16 bytes an entry, without a list: in the map
//! of lists it took a 48-byte entry and a list allocation (99 bytes per path in all, measured at
//! 1M paths). It moves to the lists when a second series takes it.

use std::collections::hash_map::Entry;
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
    by_name: U64Map<SymbolId, Values>,
    all: PackedPostings,
}

/// The series of each value of one label name.
#[derive(Debug, Default)]
struct Values {
    /// Values held by two series or more.
    lists: U64Map<SymbolId, PackedPostings>,
    /// Values held by one series: its reference.
    singles: U64Map<SymbolId, u64>,
}

impl Values {
    /// Adds `r` to the list of `v`; returns how many series that list holds now.
    fn insert(&mut self, v: SymbolId, r: SeriesRef) -> usize {
        if let Some(list) = self.lists.get_mut(&v) {
            list.insert(r);
            return list.len();
        }
        match self.singles.entry(v) {
            Entry::Vacant(e) => {
                e.insert(r.0);
                1
            }
            Entry::Occupied(e) if *e.get() == r.0 => 1,
            Entry::Occupied(e) => {
                let mut both = [SeriesRef(e.remove()), r];
                both.sort_unstable();
                self.lists.insert(v, PackedPostings::from_sorted(&both));
                2
            }
        }
    }

    fn to_vec(&self, v: SymbolId) -> Option<Vec<SeriesRef>> {
        match self.lists.get(&v) {
            Some(list) => Some(list.to_vec()),
            None => self.singles.get(&v).map(|&r| vec![SeriesRef(r)]),
        }
    }

    /// Every value with its number of series.
    fn lens(&self) -> impl Iterator<Item = (SymbolId, usize)> + '_ {
        self.lists.iter().map(|(v, l)| (*v, l.len())).chain(self.singles.keys().map(|v| (*v, 1)))
    }

    /// Removes the `dead` series; a list left with one series becomes a single.
    fn delete(&mut self, dead: &std::collections::HashSet<SeriesRef>) {
        self.singles.retain(|_, r| !dead.contains(&SeriesRef(*r)));
        let mut singled = Vec::new();
        self.lists.retain(|v, list| {
            list.retain(|r| !dead.contains(&r));
            if list.len() == 1 {
                singled.push((*v, list.last));
            }
            list.len() > 1
        });
        self.singles.extend(singled);
    }

    fn is_empty(&self) -> bool {
        self.lists.is_empty() && self.singles.is_empty()
    }

    fn heap_bytes(&self) -> usize {
        let list_entry = std::mem::size_of::<(SymbolId, PackedPostings)>() + 1;
        let single_entry = std::mem::size_of::<(SymbolId, u64)>() + 1;
        self.lists.capacity() * list_entry
            + self.lists.values().map(|p| p.data.capacity()).sum::<usize>()
            + self.singles.capacity() * single_entry
    }
}

/// The postings, locked for writing.
#[derive(Debug)]
pub struct PostingsWriter<'a>(parking_lot::RwLockWriteGuard<'a, Inner>);

impl PostingsWriter<'_> {
    pub fn add(&mut self, r: SeriesRef, labels: impl Iterator<Item = (SymbolId, SymbolId)>) {
        self.add_counting(r, labels, None);
    }

    /// `add`, returning how many series the list of the label at position `count_at` of
    /// `labels` holds with `r` in it (0 without one): whether a series is its name's first
    /// is known without looking the list up again.
    pub fn add_counting(
        &mut self,
        r: SeriesRef,
        labels: impl Iterator<Item = (SymbolId, SymbolId)>,
        count_at: Option<usize>,
    ) -> usize {
        let w = &mut *self.0;
        let mut counted = 0;
        for (i, (n, v)) in labels.enumerate() {
            let len = w.by_name.entry(n).or_default().insert(v, r);
            if count_at == Some(i) {
                counted = len;
            }
        }
        w.all.insert(r);
        counted
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
        let entry = std::mem::size_of::<(SymbolId, Values)>() + 1;
        r.all.data.capacity() + r.by_name.capacity() * entry + r.by_name.values().map(Values::heap_bytes).sum::<usize>()
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
            values.delete(dead);
        }
        w.by_name.retain(|_, v| !v.is_empty());
        w.all.retain(|r| !dead.contains(&r));
    }

    /// Copies of the lists of `name` for each of `values`.
    pub fn get_many(&self, name: SymbolId, values: impl Iterator<Item = SymbolId>) -> Vec<Vec<SeriesRef>> {
        let r = self.inner.read();
        let Some(m) = r.by_name.get(&name) else { return Vec::new() };
        values.filter_map(|v| m.to_vec(v)).collect()
    }

    /// Every series in the head.
    pub fn all(&self) -> Vec<SeriesRef> {
        self.inner.read().all.to_vec()
    }

    pub fn label_names(&self) -> Vec<SymbolId> {
        self.inner.read().by_name.keys().copied().collect()
    }

    pub fn label_values(&self, name: SymbolId) -> Vec<SymbolId> {
        self.inner.read().by_name.get(&name).map(|m| m.lens().map(|(v, _)| v).collect()).unwrap_or_default()
    }

    /// How many values label `name` has.
    pub fn label_value_count(&self, name: SymbolId) -> usize {
        self.inner.read().by_name.get(&name).map_or(0, |m| m.lens().count())
    }

    /// Series count per label name and per label pair (for cardinality statistics).
    pub fn stats(&self) -> PostingsStats {
        let r = self.inner.read();
        let mut per_name = HashMap::new();
        let mut pairs = Vec::new();
        for (n, values) in &r.by_name {
            per_name.insert(*n, values.lens().map(|(_, len)| len).sum());
            pairs.extend(values.lens().map(|(v, len)| ((*n, v), len)));
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

    /// The count is the list of the label at the position asked for, not another's.
    #[test]
    fn add_counts_the_list_at_the_position_asked() {
        let p = MemPostings::default();
        let mut w = p.writer();
        assert_eq!(w.add_counting(SeriesRef(1), [(0, 5), (1, 7)].into_iter(), Some(1)), 1);
        assert_eq!(w.add_counting(SeriesRef(2), [(0, 5), (1, 8)].into_iter(), Some(1)), 1);
        assert_eq!(w.add_counting(SeriesRef(3), [(0, 5), (1, 8)].into_iter(), Some(0)), 3);
        assert_eq!(w.add_counting(SeriesRef(4), [(0, 5), (1, 8)].into_iter(), Some(1)), 3);
        assert_eq!(w.add_counting(SeriesRef(5), [(0, 6)].into_iter(), Some(1)), 0);
        assert_eq!(w.add_counting(SeriesRef(6), [(0, 6)].into_iter(), None), 0);
    }

    proptest! {
        /// Adds and deletes agree with a model of sorted sets, whether a pair is held by one
        /// series (a single) or more (a list), and as pairs move between the two.
        #[test]
        fn singles_and_lists_agree_with_a_model(
            adds in prop::collection::vec((0u64..60, 0u32..6), 0..120),
            dead in prop::collection::hash_set(0u64..60, 0..20),
        ) {
            let p = MemPostings::default();
            let mut model: std::collections::BTreeMap<u32, std::collections::BTreeSet<u64>> = Default::default();
            for &(r, v) in &adds {
                let counted = p.writer().add_counting(SeriesRef(r), [(1, v)].into_iter(), Some(0));
                model.entry(v).or_default().insert(r);
                prop_assert_eq!(counted, model[&v].len(), "the list's length with the series in it");
            }
            let check = |model: &std::collections::BTreeMap<u32, std::collections::BTreeSet<u64>>| -> Result<(), TestCaseError> {
                let mut values = p.label_values(1);
                values.sort_unstable();
                prop_assert_eq!(values, model.keys().copied().collect::<Vec<_>>());
                for (v, refs) in model {
                    let want: Vec<SeriesRef> = refs.iter().map(|&r| SeriesRef(r)).collect();
                    prop_assert_eq!(p.get_many(1, [*v].into_iter()), vec![want]);
                }
                let (per_name, mut pairs) = p.stats();
                pairs.sort_unstable();
                prop_assert_eq!(pairs, model.iter().map(|(v, refs)| ((1, *v), refs.len())).collect::<Vec<_>>());
                prop_assert_eq!(per_name.get(&1).copied().unwrap_or(0), model.values().map(|r| r.len()).sum::<usize>());
                Ok(())
            };
            check(&model)?;
            p.delete(&dead.iter().map(|&r| SeriesRef(r)).collect());
            for refs in model.values_mut() {
                refs.retain(|r| !dead.contains(r));
            }
            model.retain(|_, refs| !refs.is_empty());
            check(&model)?;
            // Pairs left with one series take more again.
            for (r, v) in [(100u64, 0u32), (101, 0), (102, 5)] {
                p.add(SeriesRef(r), [(1, v)].into_iter());
                model.entry(v).or_default().insert(r);
            }
            check(&model)?;
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
