//! The head's symbol table: every label name and value is stored once and referred to by an id,
//! and a series keeps its label set as those ids, varint-packed: typically 2–4 bytes per label
//! however long the strings are.

use std::hash::BuildHasher;
use std::sync::Arc;

use parking_lot::RwLock;
use strata_model::{Label, Labels};

use crate::encoding::{put_uvarint, read_uvarint_trusted};

pub type SymbolId = u32;

/// A label set as varint-packed symbol ids `name value name value …`, in label order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PackedLabels(Box<[u8]>);

impl PackedLabels {
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// `(name, value)` id pairs in label order.
    pub fn pairs(&self) -> impl Iterator<Item = (SymbolId, SymbolId)> + '_ {
        let mut pos = 0;
        let data = &self.0;
        std::iter::from_fn(move || {
            (pos < data.len()).then(|| {
                let n = read_uvarint_trusted(data, &mut pos) as SymbolId;
                (n, read_uvarint_trusted(data, &mut pos) as SymbolId)
            })
        })
    }

    pub fn resolve_with(&self, get: &dyn Fn(SymbolId) -> Arc<str>) -> Labels {
        Labels::from_sorted_unchecked(self.pairs().map(|(n, v)| Label { name: get(n), value: get(v) }).collect())
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// The ids, found by their strings' hashes (`strings` holds the strings), each with the
    /// hash's 32 bits (`Slot`): 8 bytes a slot where a map from string to id took 24 (a fat
    /// pointer and an id, padded). Keeping the hash costs 4 bytes a slot and saves, at every
    /// doubling of the table, hashing every string again (a cache miss each, under the write
    /// lock: at a million new Graphite paths 5% of the ingest's CPU).
    ids: hashbrown::HashTable<Slot>,
    /// foldhash: fast on short strings and seeded per process, so label values chosen by a
    /// client cannot be crafted to collide.
    hasher: foldhash::fast::RandomState,
    strings: Vec<Arc<str>>,
    /// Ids freed by `sweep`, reused by `intern` (so churned label values do not grow the table).
    free: Vec<SymbolId>,
}

/// A symbol's id and its string's hash, as the table uses it (`Inner::hash`).
#[derive(Clone, Copy, Debug)]
struct Slot {
    id: SymbolId,
    hash: u32,
}

impl Slot {
    /// The table's hash of the slot: its 32 bits in both halves, so that the bits hashbrown
    /// takes for the bucket (low) and for the control byte (top 7) are both there.
    fn hash(&self) -> u64 {
        widen(self.hash)
    }
}

fn widen(h: u32) -> u64 {
    (u64::from(h) << 32) | u64::from(h)
}

impl Inner {
    /// The 32-bit hash of `s` the table keeps.
    fn hash(&self, s: &str) -> u32 {
        let h = self.hasher.hash_one(s);
        (h ^ (h >> 32)) as u32
    }

    fn get(&self, s: &str) -> Option<SymbolId> {
        self.get_hashed(s, self.hash(s))
    }

    /// `get` of a string whose `hash` the caller has.
    fn get_hashed(&self, s: &str, hash: u32) -> Option<SymbolId> {
        let strings = &self.strings;
        self.ids.find(widen(hash), |slot| slot.hash == hash && *strings[slot.id as usize] == *s).map(|slot| slot.id)
    }

    /// The id of `s`, added if new as the string `shared` makes (a caller holding `s` in an
    /// `Arc` shares it instead of copying it); `s` is hashed once.
    fn intern_with(&mut self, s: &str, shared: impl FnOnce() -> Arc<str>) -> SymbolId {
        self.intern_hashed(s, self.hash(s), shared)
    }

    /// `intern_with` of a string whose `hash` the caller has.
    fn intern_hashed(&mut self, s: &str, hash: u32, shared: impl FnOnce() -> Arc<str>) -> SymbolId {
        let strings = &self.strings;
        if let Some(slot) = self.ids.find(widen(hash), |slot| slot.hash == hash && *strings[slot.id as usize] == *s) {
            return slot.id;
        }
        let a = shared();
        debug_assert_eq!(&*a, s, "the shared string is the one interned");
        let id = match self.free.pop() {
            Some(id) => {
                self.strings[id as usize] = a;
                id
            }
            None => {
                let id = SymbolId::try_from(self.strings.len())
                    .expect("more than 4 billion distinct label strings in the head");
                self.strings.push(a);
                id
            }
        };
        self.ids.insert_unique(widen(hash), Slot { id, hash }, Slot::hash);
        id
    }
}

/// Interned strings. Head truncation sweeps the ones no live series uses any more (`sweep`).
#[derive(Debug, Default)]
pub struct Symbols {
    inner: RwLock<Inner>,
}

impl Symbols {
    /// The id of `s`, adding it if new.
    pub fn intern(&self, s: &str) -> SymbolId {
        if let Some(id) = self.inner.read().get(s) {
            return id;
        }
        self.inner.write().intern_with(s, || Arc::from(s))
    }

    /// The id of `s` if it is known.
    pub fn lookup(&self, s: &str) -> Option<SymbolId> {
        self.inner.read().get(s)
    }

    /// Whether `packed` is exactly `labels`: compares strings through the table, no hashing.
    pub fn equals(&self, packed: &PackedLabels, labels: &Labels) -> bool {
        let r = self.inner.read();
        let mut want = labels.iter();
        for (n, v) in packed.pairs() {
            match want.next() {
                Some(l) if *r.strings[n as usize] == *l.name && *r.strings[v as usize] == *l.value => {}
                _ => return false,
            }
        }
        want.next().is_none()
    }

    /// Whether `packed` is exactly the label set of `pairs` (canonical order).
    pub fn equals_pairs<N: AsRef<str>, V: AsRef<str>>(&self, packed: &PackedLabels, pairs: &[(N, V)]) -> bool {
        let r = self.inner.read();
        let mut want = pairs.iter();
        for (n, v) in packed.pairs() {
            match want.next() {
                Some((wn, wv)) if *r.strings[n as usize] == *wn.as_ref() && *r.strings[v as usize] == *wv.as_ref() => {}
                _ => return false,
            }
        }
        want.next().is_none()
    }

    pub fn intern_labels(&self, labels: &Labels) -> PackedLabels {
        let strings = || labels.iter().flat_map(|l| [&l.name, &l.value]);
        // Usually every string is known already: one read lock for the whole set.
        // Each string hashed once (the hasher is fixed for the table's life).
        let mut ids: Vec<(Option<SymbolId>, u32)> = {
            let r = self.inner.read();
            strings()
                .map(|s| {
                    let hash = r.hash(s);
                    (r.get_hashed(s, hash), hash)
                })
                .collect()
        };
        if ids.iter().any(|(id, _)| id.is_none()) {
            // The write lock only for the new strings (readers and other appenders wait on
            // it), each shares the label's `Arc` instead of being copied.
            let mut w = self.inner.write();
            for ((id, hash), s) in ids.iter_mut().zip(strings()).filter(|((id, _), _)| id.is_none()) {
                *id = Some(w.intern_hashed(s, *hash, || s.clone()));
            }
        }
        let mut out = Vec::with_capacity(labels.len() * 4);
        for (id, _) in ids {
            put_uvarint(&mut out, u64::from(id.expect("every string interned")));
        }
        PackedLabels(out.into_boxed_slice())
    }

    /// Rebuilds a label set from ids.
    pub fn resolve(&self, packed: &PackedLabels) -> Labels {
        self.with(|get| packed.resolve_with(get))
    }

    /// Runs `f` with a resolver, taking the lock once for many lookups.
    pub fn with<R>(&self, f: impl FnOnce(&dyn Fn(SymbolId) -> Arc<str>) -> R) -> R {
        let r = self.inner.read();
        f(&|id| r.strings[id as usize].clone())
    }

    /// A copy of the table, indexed by id (freed ids map to ""): lets a long job such as a
    /// block write resolve ids without holding the lock.
    pub fn snapshot(&self) -> Vec<Arc<str>> {
        self.inner.read().strings.clone()
    }

    /// Strings in the table.
    pub fn len(&self) -> usize {
        let r = self.inner.read();
        r.strings.len() - r.free.len()
    }

    /// Slots (live and free): the bound for ids, and the size of a `sweep` mark vector.
    /// Approximate heap bytes: the strings, their map entries and the id table.
    pub fn heap_bytes(&self) -> usize {
        let r = self.inner.read();
        // An Arc<str> allocation carries two counters; a table slot is an id and a control
        // byte, at the table's capacity.
        let strings: usize = r.strings.iter().map(|s| s.len() + 16).sum();
        strings
            + r.ids.capacity() * (std::mem::size_of::<Slot>() + 1)
            + r.strings.capacity() * 16
            + r.free.capacity() * 4
    }

    pub fn capacity(&self) -> usize {
        self.inner.read().strings.len()
    }

    /// Frees every symbol whose id is not marked in `used` (indexed by id; ids past its end are
    /// kept, as they were added after the marking). The caller guarantees no series holds an
    /// unmarked id and none is being created. Returns how many were freed.
    pub fn sweep(&self, used: &[bool]) -> usize {
        let mut w = self.inner.write();
        let w = &mut *w;
        let empty: Arc<str> = Arc::from("");
        let mut freed = 0;
        let already: std::collections::HashSet<SymbolId> = w.free.iter().copied().collect();
        for (id, &keep) in used.iter().enumerate() {
            let id = id as SymbolId;
            if keep || already.contains(&id) {
                continue;
            }
            let hash = w.hash(&w.strings[id as usize]);
            if let Ok(slot) = w.ids.find_entry(widen(hash), |held| held.id == id) {
                slot.remove();
            }
            w.strings[id as usize] = empty.clone();
            w.free.push(id);
            freed += 1;
        }
        w.ids.shrink_to_fit(Slot::hash);
        freed
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_labels_round_trip_and_compare_like_label_sets() {
        let s = Symbols::default();
        // Enough distinct strings that ids need two varint bytes.
        for i in 0..300 {
            s.intern(&format!("filler{i}"));
        }
        let a = Labels::from_pairs([("__name__", "up"), ("job", "node"), ("zone", "filler299")]);
        let b = Labels::from_pairs([("__name__", "up"), ("job", "node2")]);
        let pa = s.intern_labels(&a);
        // Known strings (`__name__`, `up`, `job`) keep their ids beside a new one (`node2`).
        let pb = s.intern_labels(&b);
        assert_eq!(s.resolve(&pa), a);
        assert_eq!(s.resolve(&pb), b);
        assert_eq!(s.intern_labels(&a), pa, "interning again gives the same ids");
        assert_eq!(pa.pairs().take(1).collect::<Vec<_>>(), pb.pairs().take(1).collect::<Vec<_>>());
        assert_eq!(s.len(), 300 + 6, "filler, then __name__ up job node zone, then node2 alone");
        assert_ne!(pa.as_bytes(), pb.as_bytes());
        assert_eq!(pa.pairs().count(), 3);
        assert!(s.equals(&pa, &a) && s.equals(&pb, &b));
        assert!(!s.equals(&pa, &b) && !s.equals(&pb, &a));
        let prefix = Labels::from_pairs([("__name__", "up"), ("job", "node")]);
        assert!(!s.equals(&pa, &prefix), "a prefix is not equal");
    }

    proptest::proptest! {
        /// Interning and sweeping in any order: every string the model holds is found under
        /// its id, and only those.
        #[test]
        fn interned_and_swept_strings_match_a_map(
            steps in proptest::collection::vec((0u8..40, proptest::bool::ANY, 0u64..u64::MAX), 1..200),
        ) {
            let s = Symbols::default();
            let mut model: std::collections::HashMap<String, SymbolId> = Default::default();
            for (k, sweep, mask) in steps {
                let text = format!("value-{k}");
                if sweep {
                    // Keep the strings whose id's bit is set in the mask.
                    let used: Vec<bool> = (0..s.capacity()).map(|id| mask >> (id % 64) & 1 == 1).collect();
                    let freed = s.sweep(&used);
                    let before = model.len();
                    model.retain(|_, id| used[*id as usize]);
                    proptest::prop_assert_eq!(freed, before - model.len());
                } else {
                    let id = s.intern(&text);
                    proptest::prop_assert_eq!(*model.entry(text).or_insert(id), id);
                }
                proptest::prop_assert_eq!(s.len(), model.len());
                for k in 0..40u8 {
                    let text = format!("value-{k}");
                    proptest::prop_assert_eq!(s.lookup(&text), model.get(&text).copied());
                }
                for (text, &id) in &model {
                    proptest::prop_assert_eq!(&*s.snapshot()[id as usize], text.as_str());
                }
            }
        }
    }

    #[test]
    fn swept_symbols_are_forgotten_and_their_ids_reused() {
        let s = Symbols::default();
        let keep = s.intern_labels(&Labels::from_pairs([("pod", "a")]));
        let gone = s.intern_labels(&Labels::from_pairs([("pod", "b")]));
        let mut used = vec![false; s.capacity()];
        for (n, v) in keep.pairs() {
            used[n as usize] = true;
            used[v as usize] = true;
        }
        assert_eq!(s.sweep(&used), 1, "only \"b\" is unused");
        assert_eq!(s.len(), 2);
        assert_eq!(s.lookup("b"), None);
        assert_eq!(s.resolve(&keep), Labels::from_pairs([("pod", "a")]));
        let c = s.intern("c");
        assert_eq!(Some(c), gone.pairs().map(|p| p.1).next(), "the freed id is reused");
        assert_eq!(s.capacity(), 3);
        assert_eq!(s.sweep(&vec![true; s.capacity()]), 0, "nothing unmarked, nothing freed");
    }
}
