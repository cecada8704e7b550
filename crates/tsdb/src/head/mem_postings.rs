//! The head's inverted index: label name → label value → sorted series references.
//!
//! Series references are handed out in increasing order, so appending a new series to a list
//! keeps it sorted; two series created concurrently may arrive out of order by a few places,
//! which the insertion fixes by moving the new reference back (in practice zero or one step).

use std::collections::HashMap;

use parking_lot::RwLock;
use strata_model::SeriesRef;

use super::symbols::SymbolId;
use crate::hash::U64Map;

/// Series per label name, and series per label pair.
pub type PostingsStats = (HashMap<SymbolId, usize>, Vec<((SymbolId, SymbolId), usize)>);

#[derive(Debug, Default)]
struct Inner {
    by_name: U64Map<SymbolId, U64Map<SymbolId, Vec<SeriesRef>>>,
    all: Vec<SeriesRef>,
}

#[derive(Debug, Default)]
pub struct MemPostings {
    inner: RwLock<Inner>,
}

fn insert_sorted(list: &mut Vec<SeriesRef>, r: SeriesRef) {
    list.push(r);
    let mut i = list.len() - 1;
    while i > 0 && list[i - 1] > r {
        list.swap(i - 1, i);
        i -= 1;
    }
}

impl MemPostings {
    /// Adds series `r` with label symbol pairs `labels` (`[name, value, …]`).
    pub fn add(&self, r: SeriesRef, labels: &[SymbolId]) {
        let mut w = self.inner.write();
        for p in labels.chunks_exact(2) {
            insert_sorted(w.by_name.entry(p[0]).or_default().entry(p[1]).or_default(), r);
        }
        insert_sorted(&mut w.all, r);
    }

    /// Removes the given series from every list (head garbage collection).
    pub fn delete(&self, dead: &std::collections::HashSet<SeriesRef>) {
        let mut w = self.inner.write();
        for values in w.by_name.values_mut() {
            for list in values.values_mut() {
                list.retain(|r| !dead.contains(r));
            }
            values.retain(|_, l| !l.is_empty());
        }
        w.by_name.retain(|_, v| !v.is_empty());
        w.all.retain(|r| !dead.contains(r));
    }

    /// A copy of the list for `name=value`.
    pub fn get(&self, name: SymbolId, value: SymbolId) -> Vec<SeriesRef> {
        self.inner.read().by_name.get(&name).and_then(|v| v.get(&value)).cloned().unwrap_or_default()
    }

    /// Copies of the lists of `name` for each of `values`.
    pub fn get_many(&self, name: SymbolId, values: impl Iterator<Item = SymbolId>) -> Vec<Vec<SeriesRef>> {
        let r = self.inner.read();
        let Some(m) = r.by_name.get(&name) else { return Vec::new() };
        values.filter_map(|v| m.get(&v).cloned()).collect()
    }

    /// Copies of the lists of every value of `name` that satisfies `keep`.
    pub fn get_matching(&self, name: SymbolId, mut keep: impl FnMut(SymbolId) -> bool) -> Vec<Vec<SeriesRef>> {
        let r = self.inner.read();
        let Some(m) = r.by_name.get(&name) else { return Vec::new() };
        m.iter().filter(|(v, _)| keep(**v)).map(|(_, l)| l.clone()).collect()
    }

    /// Every series in the head.
    pub fn all(&self) -> Vec<SeriesRef> {
        self.inner.read().all.clone()
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
            per_name.insert(*n, values.values().map(Vec::len).sum());
            pairs.extend(values.iter().map(|(v, l)| ((*n, *v), l.len())));
        }
        (per_name, pairs)
    }

    /// Heap bytes held, approximately.
    pub fn approx_bytes(&self) -> usize {
        let r = self.inner.read();
        let mut b = r.all.capacity() * 8 + r.by_name.capacity() * 48;
        for v in r.by_name.values() {
            b += v.capacity() * 32;
            b += v.values().map(|l| l.capacity() * 8).sum::<usize>();
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrent_out_of_order_adds_stay_sorted() {
        let p = MemPostings::default();
        for r in [1u64, 3, 2, 5, 4, 0] {
            p.add(SeriesRef(r), &[7, 8]);
        }
        assert_eq!(p.get(7, 8), (0..6).map(SeriesRef).collect::<Vec<_>>());
        assert_eq!(p.all(), (0..6).map(SeriesRef).collect::<Vec<_>>());
        p.delete(&[SeriesRef(2)].into_iter().collect());
        assert_eq!(p.get(7, 8), [0, 1, 3, 4, 5].map(SeriesRef).to_vec());
    }
}
