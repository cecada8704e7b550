//! The head's symbol table: every label name and value is stored once and referred to by a
//! 32-bit id, so a series' label set costs 8 bytes per label however long the strings are.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;
use strata_model::{Label, Labels};

pub type SymbolId = u32;

#[derive(Debug, Default)]
struct Inner {
    ids: HashMap<Arc<str>, SymbolId>,
    strings: Vec<Arc<str>>,
}

/// Interned strings. Symbols are never removed while the head lives; the head truncation of the
/// next milestone rebuilds the table when series are garbage-collected.
#[derive(Debug, Default)]
pub struct Symbols {
    inner: RwLock<Inner>,
}

impl Symbols {
    /// The id of `s`, adding it if new.
    pub fn intern(&self, s: &str) -> SymbolId {
        if let Some(&id) = self.inner.read().ids.get(s) {
            return id;
        }
        let mut w = self.inner.write();
        if let Some(&id) = w.ids.get(s) {
            return id;
        }
        let id = SymbolId::try_from(w.strings.len()).expect("more than 4 billion distinct label strings in the head");
        let a: Arc<str> = Arc::from(s);
        w.strings.push(a.clone());
        w.ids.insert(a, id);
        id
    }

    /// The id of `s` if it is known.
    pub fn lookup(&self, s: &str) -> Option<SymbolId> {
        self.inner.read().ids.get(s).copied()
    }

    /// Ids of a whole label set as `[name, value, name, value, …]`, or `None` if any string is
    /// unknown (then no series with these labels can exist).
    pub fn lookup_labels(&self, labels: &Labels) -> Option<Vec<SymbolId>> {
        let r = self.inner.read();
        let mut out = Vec::with_capacity(labels.len() * 2);
        for l in labels {
            out.push(*r.ids.get(&*l.name)?);
            out.push(*r.ids.get(&*l.value)?);
        }
        Some(out)
    }

    pub fn intern_labels(&self, labels: &Labels) -> Box<[SymbolId]> {
        labels.iter().flat_map(|l| [self.intern(&l.name), self.intern(&l.value)]).collect()
    }

    pub fn get(&self, id: SymbolId) -> Arc<str> {
        self.inner.read().strings[id as usize].clone()
    }

    /// Rebuilds a label set from ids.
    pub fn resolve(&self, ids: &[SymbolId]) -> Labels {
        let r = self.inner.read();
        let v = ids
            .chunks_exact(2)
            .map(|p| Label { name: r.strings[p[0] as usize].clone(), value: r.strings[p[1] as usize].clone() })
            .collect();
        Labels::from_sorted_unchecked(v)
    }

    /// Runs `f` with a resolver, taking the lock once for many lookups.
    pub fn with<R>(&self, f: impl FnOnce(&dyn Fn(SymbolId) -> Arc<str>) -> R) -> R {
        let r = self.inner.read();
        f(&|id| r.strings[id as usize].clone())
    }

    pub fn len(&self) -> usize {
        self.inner.read().strings.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Heap bytes held, approximately (for memory accounting).
    pub fn approx_bytes(&self) -> usize {
        let r = self.inner.read();
        let strings: usize = r.strings.iter().map(|s| s.len() + 16).sum();
        strings + r.strings.capacity() * 16 + r.ids.capacity() * 24
    }
}
