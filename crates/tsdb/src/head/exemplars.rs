//! Exemplars: a bounded circular buffer shared by all series, as Prometheus'
//! `CircularExemplarStorage` keeps them. The newest `capacity` exemplars are held; a new one
//! overwrites the oldest, whichever series it belongs to. Each series' exemplars are linked
//! oldest to newest through the buffer, so a query walks only the series it matched.
//!
//! Rules (Prometheus'): an exemplar's labels hold at most `MAX_LABELS_RUNES` characters, names
//! and values together; one at its series' newest timestamp with the same labels and value is a
//! duplicate (a retry: accepted, not stored twice); one older than the series' newest is out of
//! order (refused). Exemplars are logged in the WAL (`record::RefExemplar`) and replayed, so they
//! survive a restart as the head's samples do.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use strata_model::{Labels, SeriesRef};

/// Most characters of an exemplar's label names and values together (OpenMetrics' limit).
pub const MAX_LABELS_RUNES: usize = 128;

/// Prometheus' default `max_exemplars`.
pub const MAX_EXEMPLARS_DEFAULT: usize = 100_000;

#[derive(Clone, Debug, PartialEq)]
pub struct Exemplar {
    pub labels: Labels,
    pub t: i64,
    pub v: f64,
}

impl Exemplar {
    fn same(&self, o: &Exemplar) -> bool {
        self.t == o.t && self.v.to_bits() == o.v.to_bits() && self.labels == o.labels
    }
}

/// Why an exemplar was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExemplarError {
    #[error("exemplar labels have {runes} characters, more than the {MAX_LABELS_RUNES} allowed")]
    LabelsTooLong { runes: usize },
    #[error("out of order exemplar: timestamp {t} is not after the series' newest exemplar at {newest}")]
    OutOfOrder { t: i64, newest: i64 },
}

/// Checks an exemplar on its own (the label length rule).
pub fn validate(e: &Exemplar) -> Result<(), ExemplarError> {
    let runes: usize = e.labels.iter().map(|l| l.name.chars().count() + l.value.chars().count()).sum();
    if runes > MAX_LABELS_RUNES {
        return Err(ExemplarError::LabelsTooLong { runes });
    }
    Ok(())
}

#[derive(Debug)]
struct Slot {
    series: SeriesRef,
    exemplar: Exemplar,
    /// The series' next newer exemplar.
    newer: Option<usize>,
}

#[derive(Debug)]
struct SeriesIndex {
    labels: Labels,
    oldest: usize,
    newest: usize,
}

#[derive(Debug, Default)]
struct Ring {
    slots: Vec<Option<Slot>>,
    /// The slot the next exemplar goes to (the oldest once the ring is full).
    next: usize,
    index: HashMap<SeriesRef, SeriesIndex>,
}

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct ExemplarStats {
    pub appended: AtomicU64,
    pub out_of_order: AtomicU64,
}

/// The exemplars of one head.
#[derive(Debug)]
pub struct ExemplarStorage {
    capacity: usize,
    ring: Mutex<Ring>,
    pub stats: ExemplarStats,
}

/// What `add` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Added {
    Stored,
    /// The series' newest exemplar already: nothing stored.
    Duplicate,
}

impl ExemplarStorage {
    /// Holds the newest `capacity` exemplars; 0 keeps none (every add is a no-op).
    pub fn new(capacity: usize) -> Self {
        ExemplarStorage { capacity, ring: Mutex::new(Ring::default()), stats: ExemplarStats::default() }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Exemplars held now.
    pub fn len(&self) -> usize {
        self.ring.lock().slots.iter().filter(|s| s.is_some()).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checks `e` against what `series` holds, without storing it.
    pub fn check(&self, series: SeriesRef, e: &Exemplar) -> Result<Added, ExemplarError> {
        validate(e)?;
        let ring = self.ring.lock();
        ring.check(series, e)
    }

    /// Stores `e` for `series` (whose labels are `labels`, called only for a series new to the
    /// storage).
    pub fn add(&self, series: SeriesRef, labels: impl FnOnce() -> Labels, e: Exemplar) -> Result<Added, ExemplarError> {
        validate(&e)?;
        if self.capacity == 0 {
            return Ok(Added::Stored);
        }
        let mut ring = self.ring.lock();
        match ring.check(series, &e) {
            Ok(Added::Duplicate) => return Ok(Added::Duplicate),
            Err(err) => {
                self.stats.out_of_order.fetch_add(1, Ordering::Relaxed);
                return Err(err);
            }
            Ok(Added::Stored) => {}
        }
        if ring.slots.len() < self.capacity {
            ring.slots.push(None);
        }
        let at = ring.next;
        // The slot's old exemplar goes; its series now starts at the next newer one.
        if let Some(old) = ring.slots[at].take() {
            let remove = match ring.index.get_mut(&old.series) {
                Some(ix) => match old.newer {
                    Some(n) => {
                        ix.oldest = n;
                        false
                    }
                    None => true,
                },
                None => false,
            };
            if remove {
                ring.index.remove(&old.series);
            }
        }
        match ring.index.get(&series).map(|ix| ix.newest) {
            Some(prev) => {
                ring.slots[prev].as_mut().expect("an indexed slot is filled").newer = Some(at);
                ring.index.get_mut(&series).expect("just found").newest = at;
            }
            None => {
                ring.index.insert(series, SeriesIndex { labels: labels(), oldest: at, newest: at });
            }
        }
        ring.slots[at] = Some(Slot { series, exemplar: e, newer: None });
        ring.next = (at + 1) % self.capacity;
        self.stats.appended.fetch_add(1, Ordering::Relaxed);
        Ok(Added::Stored)
    }

    /// The exemplars in `[mint, maxt]` of every series whose labels `select` accepts, oldest
    /// first, series in label order.
    pub fn select(&self, mint: i64, maxt: i64, select: impl Fn(&Labels) -> bool) -> Vec<(Labels, Vec<Exemplar>)> {
        let ring = self.ring.lock();
        let mut out = Vec::new();
        for ix in ring.index.values() {
            if !select(&ix.labels) {
                continue;
            }
            let mut found = Vec::new();
            let mut at = Some(ix.oldest);
            while let Some(i) = at {
                let slot = ring.slots[i].as_ref().expect("a linked slot is filled");
                if slot.exemplar.t > maxt {
                    break;
                }
                if slot.exemplar.t >= mint {
                    found.push(slot.exemplar.clone());
                }
                at = slot.newer;
            }
            if !found.is_empty() {
                out.push((ix.labels.clone(), found));
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

impl Ring {
    fn check(&self, series: SeriesRef, e: &Exemplar) -> Result<Added, ExemplarError> {
        let Some(ix) = self.index.get(&series) else { return Ok(Added::Stored) };
        against_newest(&self.slots[ix.newest].as_ref().expect("an indexed slot is filled").exemplar, e)
    }
}

/// `e` against its series' newest exemplar: a duplicate (a retry), out of order, or new.
pub fn against_newest(newest: &Exemplar, e: &Exemplar) -> Result<Added, ExemplarError> {
    if newest.same(e) {
        return Ok(Added::Duplicate);
    }
    if e.t <= newest.t {
        return Err(ExemplarError::OutOfOrder { t: e.t, newest: newest.t });
    }
    Ok(Added::Stored)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ex(t: i64, trace: &str) -> Exemplar {
        Exemplar { labels: Labels::from_pairs([("trace_id", trace)]), t, v: t as f64 }
    }

    fn series_labels(i: u64) -> Labels {
        Labels::from_pairs([("__name__", "m"), ("i", i.to_string().as_str())])
    }

    #[test]
    fn duplicates_out_of_order_and_long_labels() {
        let s = ExemplarStorage::new(10);
        let r = SeriesRef(1);
        assert_eq!(s.add(r, || series_labels(1), ex(10, "a")), Ok(Added::Stored));
        assert_eq!(s.add(r, || series_labels(1), ex(10, "a")), Ok(Added::Duplicate));
        assert_eq!(s.add(r, || series_labels(1), ex(10, "b")), Err(ExemplarError::OutOfOrder { t: 10, newest: 10 }));
        assert_eq!(s.add(r, || series_labels(1), ex(9, "c")), Err(ExemplarError::OutOfOrder { t: 9, newest: 10 }));
        let long = Exemplar { labels: Labels::from_pairs([("trace_id", "x".repeat(121).as_str())]), t: 11, v: 1.0 };
        assert_eq!(s.add(r, || series_labels(1), long), Err(ExemplarError::LabelsTooLong { runes: 129 }));
        assert_eq!(s.len(), 1);
        assert_eq!(s.stats.out_of_order.load(Ordering::Relaxed), 2);
    }

    proptest! {
        /// Against a model: the newest `capacity` stored exemplars, whatever the series mix.
        #[test]
        fn holds_the_newest_capacity_exemplars(
            capacity in 1usize..20,
            adds in proptest::collection::vec((0u64..5, 0i64..3), 0..200),
        ) {
            let s = ExemplarStorage::new(capacity);
            let mut model: Vec<(u64, Exemplar)> = Vec::new();
            let mut clock = 0i64;
            for (series, step) in adds {
                clock += step;
                let e = ex(clock, &format!("t{clock}"));
                let got = s.add(SeriesRef(series), || series_labels(series), e.clone());
                // The series' newest among the exemplars still held (an evicted series starts
                // afresh, as in Prometheus).
                let held = &model[model.len().saturating_sub(capacity)..];
                let newest = held.iter().rev().find(|(r, _)| *r == series).map(|(_, e)| e.t);
                match newest {
                    Some(n) if clock <= n => prop_assert!(got.is_err() || got == Ok(Added::Duplicate)),
                    _ => {
                        prop_assert_eq!(got, Ok(Added::Stored));
                        model.push((series, e));
                    }
                }
            }
            let kept = &model[model.len().saturating_sub(capacity)..];
            let got = s.select(i64::MIN, i64::MAX, |_| true);
            let mut want: Vec<(Labels, Vec<Exemplar>)> = Vec::new();
            for series in 0..5u64 {
                let es: Vec<Exemplar> = kept.iter().filter(|(r, _)| *r == series).map(|(_, e)| e.clone()).collect();
                if !es.is_empty() {
                    want.push((series_labels(series), es));
                }
            }
            want.sort_by(|a, b| a.0.cmp(&b.0));
            prop_assert_eq!(got, want);
            // A time range and a series filter.
            let some = s.select(2, 4, |l| l.get("i") == Some("1"));
            for (l, es) in &some {
                prop_assert_eq!(l.get("i"), Some("1"));
                prop_assert!(es.iter().all(|e| (2..=4).contains(&e.t)));
            }
        }
    }
}
