//! The head's series by reference, one table per lock stripe.
//!
//! References are handed out in order (`Head::next_ref`) and each stripe holds every
//! `STRIPES`-th, so within a stripe `r / STRIPES` is a dense index: a table of pages indexed by
//! it replaces a hash map. A lookup (once per appended sample) is two indexings instead of a hash
//! and a probe, a new series never rehashes a stripe, and a series costs one pointer (8 bytes)
//! instead of a map entry (16 bytes, at a load of 50–87%).
//!
//! Series die roughly in the order they were born (churned pods, then head truncation), so a
//! page whose every slot is empty is freed and empty pages at the table's front or back are
//! dropped: the table spans the live references, not every reference ever handed out. A page
//! with one long-lived series among dead ones stays (`PAGE_SLOTS` pointers for one series).
//!
//! Long-lived series among churned ones (a node exporter's series born before a year of pods)
//! would keep the span, and its page pointers, growing with every reference handed out since:
//! once the span is mostly holes, the series of its oldest pages move to a small map (`far`),
//! where they cost what a hash map entry costs. A reference far outside the span (a replayed
//! log's references are dense too, but nothing in a log bounds them) goes there as well, so
//! one stray reference never allocates pages for the gap.

use std::collections::VecDeque;
use std::sync::Arc;

use super::series::MemSeries;
use crate::hash::U64Map;

/// Slots in a page: small enough that a page kept by one live series wastes little, large
/// enough that the page pointers cost little.
const PAGE_SLOTS: usize = 32;
/// A reference whose page lies farther than this from the table's span goes to `far`.
const MAX_GAP_PAGES: u64 = 1 << 16;
/// The span is thinned (`thin`) once it is longer than this many pages and this many times
/// the pages in use.
const THIN_MIN_PAGES: usize = 64;
const THIN_FACTOR: usize = 4;

/// One stripe's series, by `index = r / STRIPES`.
#[derive(Debug, Default)]
pub(super) struct RefTable {
    /// The page number (`index / PAGE_SLOTS`) of `pages[0]`.
    first_page: u64,
    pages: VecDeque<Option<Box<Page>>>,
    /// Series whose reference lies outside `pages`' span (never one inside it).
    far: U64Map<u64, Arc<MemSeries>>,
    len: usize,
    /// Pages allocated (`Some`) in `pages`.
    live_pages: usize,
}

#[derive(Debug, Default)]
struct Page {
    slots: [Option<Arc<MemSeries>>; PAGE_SLOTS],
    live: u32,
}

impl RefTable {
    /// The series at `index` (the stripe's `r / STRIPES`).
    pub fn get(&self, index: u64) -> Option<&Arc<MemSeries>> {
        let (page, slot) = split(index);
        match page.checked_sub(self.first_page).and_then(|p| self.pages.get(p as usize)) {
            Some(p) => p.as_ref()?.slots[slot].as_ref(),
            None if self.far.is_empty() => None,
            None => self.far.get(&index),
        }
    }

    /// Puts `series` at `index`; returns the series it replaced there, as a map's insert does
    /// (none: the head never hands out a reference twice).
    pub fn insert(&mut self, index: u64, series: Arc<MemSeries>) -> Option<Arc<MemSeries>> {
        let (page, slot) = split(index);
        let old = match self.page_position(page) {
            Some(at) => self.place(at, slot, series),
            None => self.far.insert(index, series),
        };
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    fn place(&mut self, at: usize, slot: usize, series: Arc<MemSeries>) -> Option<Arc<MemSeries>> {
        let page = &mut self.pages[at];
        if page.is_none() {
            self.live_pages += 1;
        }
        let p = page.get_or_insert_with(Box::default);
        let old = p.slots[slot].replace(series);
        if old.is_none() {
            p.live += 1;
        }
        old
    }

    /// Moves the series of `far` that the grown span now covers into their pages.
    fn adopt_far(&mut self) {
        if self.far.is_empty() {
            return;
        }
        let (first, end) = (self.first_page, self.first_page + self.pages.len() as u64);
        let covered: Vec<u64> = self.far.keys().copied().filter(|&i| (first..end).contains(&split(i).0)).collect();
        for index in covered {
            let series = self.far.remove(&index).expect("listed");
            let (page, slot) = split(index);
            let old = self.place((page - first) as usize, slot, series);
            debug_assert!(old.is_none(), "far holds no index inside the span");
        }
    }

    /// Removes and returns the series at `index`.
    pub fn remove(&mut self, index: u64) -> Option<Arc<MemSeries>> {
        let (page, slot) = split(index);
        let at = page.checked_sub(self.first_page).filter(|&p| p < self.pages.len() as u64);
        let Some(at) = at.map(|p| p as usize) else {
            let s = self.far.remove(&index)?;
            self.len -= 1;
            return Some(s);
        };
        let p = self.pages[at].as_mut()?;
        let s = p.slots[slot].take()?;
        p.live -= 1;
        if p.live == 0 {
            self.pages[at] = None;
            self.live_pages -= 1;
            self.trim();
            self.thin();
        }
        self.len -= 1;
        Some(s)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Every series, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &Arc<MemSeries>> {
        let paged = self.pages.iter().flatten().flat_map(|p| p.slots.iter().flatten());
        paged.chain(self.far.values())
    }

    /// Heap bytes of the table itself (not of the series).
    pub fn heap_bytes(&self) -> usize {
        self.pages.capacity() * 8 + self.live_pages * std::mem::size_of::<Page>() + self.far.capacity() * (8 + 8 + 1)
    }

    /// Where `page` sits in `pages`, growing the span to reach it; `None` if it lies too far.
    fn page_position(&mut self, page: u64) -> Option<usize> {
        if self.pages.is_empty() {
            self.first_page = page;
            self.pages.push_back(None);
            self.adopt_far();
            return Some(0);
        }
        if page < self.first_page {
            if self.first_page - page > MAX_GAP_PAGES {
                return None;
            }
            for _ in page..self.first_page {
                self.pages.push_front(None);
            }
            self.first_page = page;
            self.adopt_far();
            return Some(0);
        }
        let at = page - self.first_page;
        let len = self.pages.len() as u64;
        if at >= len {
            if at - len >= MAX_GAP_PAGES {
                return None;
            }
            self.pages.resize_with(at as usize + 1, || None);
            self.adopt_far();
        }
        Some(at as usize)
    }

    /// While the span is mostly holes, moves the series of its oldest page to `far` and drops it.
    fn thin(&mut self) {
        while self.pages.len() > THIN_MIN_PAGES && self.pages.len() > THIN_FACTOR * self.live_pages {
            let page = self.pages.pop_front().flatten().expect("trimmed: the first page is in use");
            self.live_pages -= 1;
            let first = self.first_page * PAGE_SLOTS as u64;
            self.first_page += 1;
            for (slot, series) in page.slots.into_iter().enumerate() {
                if let Some(series) = series {
                    self.far.insert(first + slot as u64, series);
                }
            }
            self.trim();
        }
    }

    /// Drops empty pages at both ends.
    fn trim(&mut self) {
        while self.pages.front().is_some_and(Option::is_none) {
            self.pages.pop_front();
            self.first_page += 1;
        }
        while self.pages.back().is_some_and(Option::is_none) {
            self.pages.pop_back();
        }
        if self.pages.capacity() > 4 * self.pages.len().max(4) {
            self.pages.shrink_to_fit();
        }
    }
}

fn split(index: u64) -> (u64, usize) {
    (index / PAGE_SLOTS as u64, (index % PAGE_SLOTS as u64) as usize)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;
    use strata_model::SeriesRef;

    use super::*;
    use crate::head::symbols::PackedLabels;

    fn series(i: u64) -> Arc<MemSeries> {
        Arc::new(MemSeries::new(SeriesRef(i), PackedLabels::default()))
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64),
        Remove(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        // Mostly dense indexes near each other, some far off (past MAX_GAP_PAGES pages).
        let index = prop_oneof![8 => 0u64..5000, 1 => 0u64..(PAGE_SLOTS as u64 * MAX_GAP_PAGES * 3)];
        prop_oneof![index.clone().prop_map(Op::Insert), index.prop_map(Op::Remove)]
    }

    proptest! {
        /// The table answers as a map does, whatever the order of inserts and removals.
        #[test]
        fn behaves_as_a_map(ops in proptest::collection::vec(op(), 0..1500)) {
            let mut table = RefTable::default();
            let mut model: BTreeMap<u64, Arc<MemSeries>> = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Insert(i) => {
                        if let std::collections::btree_map::Entry::Vacant(e) = model.entry(i) {
                            let s = series(i);
                            e.insert(s.clone());
                            prop_assert!(table.insert(i, s).is_none());
                        }
                    }
                    Op::Remove(i) => {
                        let got = table.remove(i).map(|s| s.series_ref);
                        prop_assert_eq!(got, model.remove(&i).map(|s| s.series_ref));
                    }
                }
                prop_assert_eq!(table.len(), model.len());
            }
            for (i, s) in &model {
                prop_assert_eq!(table.get(*i).map(|s| s.series_ref), Some(s.series_ref));
            }
            let mut all: Vec<u64> = table.values().map(|s| s.series_ref.0).collect();
            all.sort_unstable();
            prop_assert_eq!(all, model.keys().copied().collect::<Vec<_>>());
        }
    }

    #[test]
    fn dead_pages_are_freed_and_the_span_follows_the_live_references() {
        let mut table = RefTable::default();
        let n = PAGE_SLOTS as u64 * 100;
        for i in 0..n {
            table.insert(i, series(i));
        }
        assert_eq!(table.pages.len(), 100);
        // The oldest 90 pages die, as churned series do.
        for i in 0..PAGE_SLOTS as u64 * 90 {
            assert!(table.remove(i).is_some());
        }
        assert_eq!(table.pages.len(), 10);
        assert_eq!(table.first_page, 90);
        assert!(table.get(5).is_none());
        assert_eq!(table.get(n - 1).map(|s| s.series_ref), Some(SeriesRef(n - 1)));
        // One far reference does not allocate the gap.
        table.insert(u64::MAX, series(7));
        assert_eq!(table.pages.len(), 10);
        assert_eq!(table.get(u64::MAX).map(|s| s.series_ref), Some(SeriesRef(7)));
        assert_eq!(table.len(), PAGE_SLOTS * 10 + 1);
        // A taken index is replaced, as in a map.
        assert_eq!(table.insert(n - 1, series(8)).map(|s| s.series_ref), Some(SeriesRef(n - 1)));
        assert_eq!(table.insert(u64::MAX, series(9)).map(|s| s.series_ref), Some(SeriesRef(7)));
        assert_eq!(table.len(), PAGE_SLOTS * 10 + 1);
    }

    #[test]
    fn long_lived_series_among_churned_ones_do_not_stretch_the_span() {
        let mut table = RefTable::default();
        // One series that lives on (index 0), then a million churned through 1000 at a time.
        table.insert(0, series(0));
        let (mut next, batch) = (1u64, 1000u64);
        let mut alive: std::collections::VecDeque<u64> = std::collections::VecDeque::new();
        while next < 1_000_000 {
            for _ in 0..batch {
                table.insert(next, series(next));
                alive.push_back(next);
                next += 1;
            }
            while alive.len() > 2 * batch as usize {
                table.remove(alive.pop_front().unwrap()).unwrap();
            }
        }
        assert_eq!(table.len(), alive.len() + 1);
        assert!(table.pages.len() <= THIN_MIN_PAGES.max(THIN_FACTOR * table.live_pages), "{} pages", table.pages.len());
        assert_eq!(table.get(0).map(|s| s.series_ref), Some(SeriesRef(0)));
        assert!(table.far.contains_key(&0), "the long-lived series moved out of the pages");
        for &i in alive.iter().step_by(97) {
            assert_eq!(table.get(i).map(|s| s.series_ref), Some(SeriesRef(i)));
        }
        assert_eq!(table.values().count(), table.len());
    }
}
