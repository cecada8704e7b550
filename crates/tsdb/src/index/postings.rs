//! Postings: sorted lists of series references, and lazy set operations over them.
//!
//! Every list is sorted ascending and free of duplicates, so matchers combine by merging:
//! intersection leap-frogs with `seek`, union is a k-way heap merge, subtraction seeks the
//! subtrahend. No operation ever loops over one list per element of another.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use strata_model::SeriesRef;

/// A cursor over a sorted set of series references.
pub trait Postings: Send + std::fmt::Debug {
    /// Advances to the next reference.
    fn next(&mut self) -> Option<SeriesRef>;
    /// Advances to the first reference ≥ `target`. If the current one already is, it is returned
    /// again; a cursor never moves backwards.
    fn seek(&mut self, target: SeriesRef) -> Option<SeriesRef>;
    /// The current reference (after a successful `next` or `seek`).
    fn at(&self) -> Option<SeriesRef>;
}

pub type BoxPostings = Box<dyn Postings>;

/// Postings over an owned, sorted vector.
#[derive(Debug, Clone)]
pub struct ListPostings {
    list: Vec<SeriesRef>,
    /// Index of the current element plus one (0 = before the start).
    pos: usize,
}

impl ListPostings {
    pub fn new(list: Vec<SeriesRef>) -> Self {
        debug_assert!(list.windows(2).all(|w| w[0] < w[1]), "postings must be sorted and unique");
        ListPostings { list, pos: 0 }
    }
}

impl Postings for ListPostings {
    fn next(&mut self) -> Option<SeriesRef> {
        if self.pos < self.list.len() {
            self.pos += 1;
            Some(self.list[self.pos - 1])
        } else {
            self.pos = self.list.len() + 1;
            None
        }
    }

    fn seek(&mut self, target: SeriesRef) -> Option<SeriesRef> {
        let from = self.pos.saturating_sub(1);
        if from >= self.list.len() {
            self.pos = self.list.len() + 1;
            return None;
        }
        if self.pos > 0 && self.list[from] >= target {
            return Some(self.list[from]);
        }
        // Galloping search from the current position: cheap for near targets, log for far ones.
        let rest = &self.list[from..];
        let mut bound = 1;
        while bound < rest.len() && rest[bound] < target {
            bound *= 2;
        }
        let lo = bound / 2;
        let hi = (bound + 1).min(rest.len());
        let i = from + lo + rest[lo..hi].partition_point(|&r| r < target);
        self.pos = i + 1;
        self.list.get(i).copied()
    }

    fn at(&self) -> Option<SeriesRef> {
        self.pos.checked_sub(1).and_then(|i| self.list.get(i).copied())
    }
}

/// An empty cursor.
#[derive(Debug, Default)]
pub struct EmptyPostings;

impl Postings for EmptyPostings {
    fn next(&mut self) -> Option<SeriesRef> {
        None
    }
    fn seek(&mut self, _: SeriesRef) -> Option<SeriesRef> {
        None
    }
    fn at(&self) -> Option<SeriesRef> {
        None
    }
}

/// Intersection of several cursors (leap-frog).
#[derive(Debug)]
pub struct Intersect {
    its: Vec<BoxPostings>,
    cur: Option<SeriesRef>,
    done: bool,
}

/// The references present in every input. No inputs means the empty set.
pub fn intersect(mut its: Vec<BoxPostings>) -> BoxPostings {
    match its.len() {
        0 => Box::new(EmptyPostings),
        1 => its.pop().expect("one element"),
        _ => Box::new(Intersect { its, cur: None, done: false }),
    }
}

impl Intersect {
    /// Finds the first reference ≥ `target` present in all cursors.
    fn align(&mut self, mut target: SeriesRef) -> Option<SeriesRef> {
        'outer: loop {
            for it in self.its.iter_mut() {
                match it.seek(target) {
                    None => {
                        self.done = true;
                        self.cur = None;
                        return None;
                    }
                    Some(r) if r > target => {
                        target = r;
                        continue 'outer;
                    }
                    Some(_) => {}
                }
            }
            self.cur = Some(target);
            return self.cur;
        }
    }
}

impl Postings for Intersect {
    fn next(&mut self) -> Option<SeriesRef> {
        if self.done {
            return None;
        }
        let target = match self.cur {
            None => match self.its[0].next() {
                Some(r) => r,
                None => {
                    self.done = true;
                    return None;
                }
            },
            Some(c) => SeriesRef(c.0.checked_add(1)?),
        };
        self.align(target)
    }

    fn seek(&mut self, target: SeriesRef) -> Option<SeriesRef> {
        if self.done {
            return None;
        }
        match self.cur {
            Some(c) if c >= target => Some(c),
            _ => self.align(target),
        }
    }

    fn at(&self) -> Option<SeriesRef> {
        self.cur
    }
}

/// Union of several cursors (k-way merge with a min-heap).
#[derive(Debug)]
pub struct Merge {
    heap: BinaryHeap<Reverse<(SeriesRef, usize)>>,
    its: Vec<BoxPostings>,
    cur: Option<SeriesRef>,
    started: bool,
}

/// The references present in any input.
pub fn merge(mut its: Vec<BoxPostings>) -> BoxPostings {
    match its.len() {
        0 => Box::new(EmptyPostings),
        1 => its.pop().expect("one element"),
        _ => Box::new(Merge { heap: BinaryHeap::with_capacity(its.len()), its, cur: None, started: false }),
    }
}

impl Merge {
    fn init(&mut self, target: Option<SeriesRef>) {
        self.started = true;
        for (i, it) in self.its.iter_mut().enumerate() {
            let r = match target {
                Some(t) => it.seek(t),
                None => it.next(),
            };
            if let Some(r) = r {
                self.heap.push(Reverse((r, i)));
            }
        }
    }

    /// Pops the minimum and advances every cursor sitting on it.
    fn pop_min(&mut self) -> Option<SeriesRef> {
        let Reverse((min, _)) = *self.heap.peek()?;
        while let Some(&Reverse((r, i))) = self.heap.peek() {
            if r != min {
                break;
            }
            self.heap.pop();
            if let Some(n) = self.its[i].next() {
                self.heap.push(Reverse((n, i)));
            }
        }
        self.cur = Some(min);
        self.cur
    }
}

impl Postings for Merge {
    fn next(&mut self) -> Option<SeriesRef> {
        if !self.started {
            self.init(None);
        }
        let r = self.pop_min();
        if r.is_none() {
            self.cur = None;
        }
        r
    }

    fn seek(&mut self, target: SeriesRef) -> Option<SeriesRef> {
        if !self.started {
            self.init(Some(target));
            return self.next();
        }
        if let Some(c) = self.cur {
            if c >= target {
                return Some(c);
            }
        }
        // Re-seat every cursor whose head is below the target.
        while let Some(&Reverse((r, i))) = self.heap.peek() {
            if r >= target {
                break;
            }
            self.heap.pop();
            if let Some(n) = self.its[i].seek(target) {
                self.heap.push(Reverse((n, i)));
            }
        }
        let r = self.pop_min();
        if r.is_none() {
            self.cur = None;
        }
        r
    }

    fn at(&self) -> Option<SeriesRef> {
        self.cur
    }
}

/// References of `full` absent from `drop`.
#[derive(Debug)]
pub struct Without {
    full: BoxPostings,
    drop: BoxPostings,
    drop_cur: Option<SeriesRef>,
    drop_done: bool,
    cur: Option<SeriesRef>,
}

pub fn without(full: BoxPostings, drop: BoxPostings) -> BoxPostings {
    Box::new(Without { full, drop, drop_cur: None, drop_done: false, cur: None })
}

impl Without {
    /// From the candidate `c` of `full`, finds the first one not in `drop`.
    fn settle(&mut self, mut c: Option<SeriesRef>) -> Option<SeriesRef> {
        while let Some(r) = c {
            if !self.drop_done && self.drop_cur.is_none_or(|d| d < r) {
                self.drop_cur = self.drop.seek(r);
                self.drop_done = self.drop_cur.is_none();
            }
            if self.drop_cur == Some(r) {
                c = self.full.next();
                continue;
            }
            break;
        }
        self.cur = c;
        c
    }
}

impl Postings for Without {
    fn next(&mut self) -> Option<SeriesRef> {
        let c = self.full.next();
        self.settle(c)
    }

    fn seek(&mut self, target: SeriesRef) -> Option<SeriesRef> {
        if let Some(c) = self.cur {
            if c >= target {
                return Some(c);
            }
        }
        let c = self.full.seek(target);
        self.settle(c)
    }

    fn at(&self) -> Option<SeriesRef> {
        self.cur
    }
}

/// Drains a cursor into a vector.
pub fn expand(mut p: BoxPostings) -> Vec<SeriesRef> {
    let mut out = Vec::new();
    while let Some(r) = p.next() {
        out.push(r);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn list(s: &BTreeSet<u64>) -> BoxPostings {
        Box::new(ListPostings::new(s.iter().map(|&r| SeriesRef(r)).collect()))
    }

    fn refs(s: &BTreeSet<u64>) -> Vec<SeriesRef> {
        s.iter().map(|&r| SeriesRef(r)).collect()
    }

    fn set() -> impl Strategy<Value = BTreeSet<u64>> {
        prop::collection::btree_set(0u64..200, 0..60)
    }

    /// A random expression over postings, evaluated both lazily and on a naive set model.
    #[derive(Debug, Clone)]
    enum Expr {
        Leaf(BTreeSet<u64>),
        And(Vec<Expr>),
        Or(Vec<Expr>),
        Without(Box<Expr>, Box<Expr>),
    }

    fn expr() -> impl Strategy<Value = Expr> {
        set().prop_map(Expr::Leaf).prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Expr::And),
                prop::collection::vec(inner.clone(), 0..4).prop_map(Expr::Or),
                (inner.clone(), inner).prop_map(|(a, b)| Expr::Without(Box::new(a), Box::new(b))),
            ]
        })
    }

    fn model(e: &Expr) -> BTreeSet<u64> {
        match e {
            Expr::Leaf(s) => s.clone(),
            Expr::And(v) if v.is_empty() => BTreeSet::new(),
            Expr::And(v) => {
                v.iter().map(model).reduce(|a, b| a.intersection(&b).copied().collect()).expect("non-empty")
            }
            Expr::Or(v) => v.iter().map(model).fold(BTreeSet::new(), |a, b| a.union(&b).copied().collect()),
            Expr::Without(a, b) => model(a).difference(&model(b)).copied().collect(),
        }
    }

    fn build(e: &Expr) -> BoxPostings {
        match e {
            Expr::Leaf(s) => list(s),
            Expr::And(v) => intersect(v.iter().map(build).collect()),
            Expr::Or(v) => merge(v.iter().map(build).collect()),
            Expr::Without(a, b) => without(build(a), build(b)),
        }
    }

    proptest! {
        #[test]
        fn operations_match_set_model(e in expr()) {
            prop_assert_eq!(expand(build(&e)), refs(&model(&e)));
        }

        #[test]
        fn seek_matches_set_model(e in expr(), targets in prop::collection::vec(0u64..220, 1..10)) {
            let want = model(&e);
            let mut p = build(&e);
            let mut targets = targets;
            targets.sort();
            let mut last: Option<u64> = None;
            for t in targets {
                // Seek never moves backwards: the answer is the first element ≥ max(t, current).
                let floor = last.map_or(t, |l| l.max(t));
                let expected = want.range(floor..).next().copied();
                let got = p.seek(SeriesRef(t)).map(|r| r.0);
                prop_assert_eq!(got, expected, "seek({})", t);
                prop_assert_eq!(p.at().map(|r| r.0), expected);
                if got.is_none() { break; }
                last = got;
            }
        }

        #[test]
        fn next_after_seek_continues(s in set(), t in 0u64..220) {
            let mut p = list(&s);
            let first = p.seek(SeriesRef(t)).map(|r| r.0);
            let rest: Vec<u64> = std::iter::from_fn(|| p.next().map(|r| r.0)).collect();
            let want: Vec<u64> = s.range(t..).copied().collect();
            let mut got: Vec<u64> = first.into_iter().collect();
            got.extend(rest);
            prop_assert_eq!(got, want);
        }
    }
}
