//! One series' rollup buckets as a tier read serves them: a vector per aggregate (the
//! chunk's own columns, `chunkenc::rollup`), holding only the aggregates the reader asked for.
//!
//! Why columns and not `Bucket`s: a bucket is 112 bytes, and a reader wants one to four of its
//! eleven aggregates (a maximum: the ends and maxima, 16 bytes). Decoded into
//! `Bucket`s, a month of hourly buckets of a thousand series was 80 MB written and read again
//! per query, and the writes of the blank buckets and the walk over them were a quarter of a
//! tier query's CPU. A window of several buckets is still combined as `Bucket`s
//! (`BucketColumns::bucket`, `Bucket::append`), and so are the rare merges of a tier's
//! buckets with each other or with late raw data (`BucketColumns::edit`).
//!
//! Invariant: every column in `columns` holds one value per end; every other column is empty.
//! The ends are always held (they are the count column's timestamps); the counts only where
//! asked for, like any other aggregate.

use strata_model::Sample;

use super::{ArchiveValue, Bucket};
use crate::chunkenc::rollup::{Column, ColumnSet};

/// A series' buckets, ends strictly increasing once a read has put them in order.
#[derive(Clone, Debug, PartialEq)]
pub struct BucketColumns {
    /// The aggregates held (and the ends, always).
    pub(crate) columns: ColumnSet,
    pub(crate) ends: Vec<i64>,
    pub(crate) counts: Vec<u64>,
    pub(crate) sums: Vec<f64>,
    pub(crate) mins: Vec<f64>,
    pub(crate) maxs: Vec<f64>,
    pub(crate) firsts: Vec<Sample>,
    pub(crate) lasts: Vec<Sample>,
    pub(crate) reset_corrections: Vec<f64>,
    pub(crate) changes: Vec<u64>,
    pub(crate) resets: Vec<u64>,
    /// The Graphite archive values (with their states: `ArchiveState` and `Archive` together).
    pub(crate) archives: Vec<ArchiveValue>,
}

impl Default for BucketColumns {
    fn default() -> BucketColumns {
        BucketColumns::new(ColumnSet::of(&[]))
    }
}

/// Applies `$f` to every column vector of `$s` but the ends (a macro: the vectors are of
/// several types).
macro_rules! each_column {
    ($s:expr, $f:ident $(, $arg:expr)*) => {{
        let s = $s;
        s.counts.$f($($arg),*);
        s.sums.$f($($arg),*);
        s.mins.$f($($arg),*);
        s.maxs.$f($($arg),*);
        s.firsts.$f($($arg),*);
        s.lasts.$f($($arg),*);
        s.reset_corrections.$f($($arg),*);
        s.changes.$f($($arg),*);
        s.resets.$f($($arg),*);
        s.archives.$f($($arg),*);
    }};
}

/// Calls `$m!(vector, Column, Bucket field)` for every column held only when asked for (all
/// but the ends): the one list of them, for the methods that treat each alike.
macro_rules! optional_columns {
    ($m:ident) => {
        $m!(counts, Count, count);
        $m!(sums, Sum, sum);
        $m!(mins, Min, min);
        $m!(maxs, Max, max);
        $m!(firsts, First, first);
        $m!(lasts, Last, last);
        $m!(reset_corrections, ResetCorrection, reset_correction);
        $m!(changes, Changes, changes);
        $m!(resets, Resets, resets);
        $m!(archives, ArchiveState, archive);
    };
}

impl BucketColumns {
    /// No buckets, holding `columns` (and the ends).
    pub fn new(columns: ColumnSet) -> BucketColumns {
        BucketColumns {
            columns,
            ends: Vec::new(),
            counts: Vec::new(),
            sums: Vec::new(),
            mins: Vec::new(),
            maxs: Vec::new(),
            firsts: Vec::new(),
            lasts: Vec::new(),
            reset_corrections: Vec::new(),
            changes: Vec::new(),
            resets: Vec::new(),
            archives: Vec::new(),
        }
    }

    /// Emptied (capacity kept), to hold `columns` from now on.
    pub fn reset(&mut self, columns: ColumnSet) {
        self.ends.clear();
        each_column!(&mut *self, clear);
        self.columns = columns;
    }

    /// `buckets`' aggregates in `columns`.
    pub fn from_buckets(buckets: &[Bucket], columns: ColumnSet) -> BucketColumns {
        let mut out = BucketColumns::new(columns);
        out.extend_from_buckets(buckets);
        out
    }

    /// Room for `n` more buckets in each column held.
    pub fn reserve(&mut self, n: usize) {
        self.ends.reserve(n);
        let c = self.columns;
        macro_rules! reserve {
            ($field:ident, $column:ident, $aggregate:ident) => {
                if c.has(Column::$column) {
                    self.$field.reserve(n);
                }
            };
        }
        optional_columns!(reserve);
    }

    pub fn columns(&self) -> ColumnSet {
        self.columns
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The first and last bucket's ends.
    pub fn span(&self) -> Option<(i64, i64)> {
        self.ends.first().copied().zip(self.ends.last().copied())
    }

    pub fn ends(&self) -> &[i64] {
        &self.ends
    }

    // Each aggregate's column: empty where not held.

    pub fn counts(&self) -> &[u64] {
        &self.counts
    }

    pub fn sums(&self) -> &[f64] {
        &self.sums
    }

    pub fn mins(&self) -> &[f64] {
        &self.mins
    }

    pub fn maxs(&self) -> &[f64] {
        &self.maxs
    }

    pub fn lasts(&self) -> &[Sample] {
        &self.lasts
    }

    pub fn reset_corrections(&self) -> &[f64] {
        &self.reset_corrections
    }

    pub fn changes(&self) -> &[u64] {
        &self.changes
    }

    pub fn resets(&self) -> &[u64] {
        &self.resets
    }

    pub fn archives(&self) -> &[ArchiveValue] {
        &self.archives
    }

    /// The first samples where `First` is held, else the last ones (a reader of the last samples
    /// only takes each bucket's last sample as its first: see `chunkenc::rollup::decode`).
    pub fn firsts(&self) -> &[Sample] {
        if self.columns.has(Column::First) {
            &self.firsts
        } else {
            &self.lasts
        }
    }

    /// Bucket `k` whole: the aggregates not held are zero, and the first sample is the last
    /// one where only that is held.
    #[inline]
    pub fn bucket(&self, k: usize) -> Bucket {
        let c = self.columns;
        let f = |v: &[f64]| v.get(k).copied().unwrap_or(0.0);
        let n = |v: &[u64]| v.get(k).copied().unwrap_or(0);
        let last = self.lasts.get(k).copied().unwrap_or(Sample { t: 0, v: 0.0 });
        Bucket {
            end: self.ends[k],
            count: n(&self.counts),
            sum: f(&self.sums),
            min: f(&self.mins),
            max: f(&self.maxs),
            first: if c.has(Column::First) { self.firsts[k] } else { last },
            last,
            reset_correction: f(&self.reset_corrections),
            changes: n(&self.changes),
            resets: n(&self.resets),
            archive: self.archives.get(k).copied().unwrap_or_default(),
        }
    }

    /// Every bucket whole (`bucket`), in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = Bucket> + '_ {
        (0..self.len()).map(|k| self.bucket(k))
    }

    /// Appends a bucket's held aggregates.
    pub fn push(&mut self, b: &Bucket) {
        let c = self.columns;
        self.ends.push(b.end);
        macro_rules! push {
            ($field:ident, $column:ident, $aggregate:ident) => {
                if c.has(Column::$column) {
                    self.$field.push(b.$aggregate);
                }
            };
        }
        optional_columns!(push);
    }

    pub fn extend_from_buckets(&mut self, buckets: &[Bucket]) {
        self.reserve(buckets.len());
        for b in buckets {
            self.push(b);
        }
    }

    /// Keeps the first `n` buckets.
    pub fn truncate(&mut self, n: usize) {
        self.ends.truncate(n);
        each_column!(&mut *self, truncate, n);
    }

    /// Drops the first `n` buckets.
    pub fn drop_front(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        self.ends.drain(..n);
        macro_rules! drop_front {
            ($($field:ident),*) => {$(
                // Empty where not held.
                if !self.$field.is_empty() {
                    self.$field.drain(..n);
                }
            )*};
        }
        drop_front!(counts, sums, mins, maxs, firsts, lasts, reset_corrections, changes, resets, archives);
    }

    /// The number of leading buckets whose end satisfies `pred` (ends in order).
    pub fn partition_point(&self, pred: impl FnMut(&i64) -> bool) -> usize {
        self.ends.partition_point(pred)
    }

    /// Edits the buckets as `Bucket`s (sorting, combining, removing), for the rare reads that
    /// need it: buckets of tier blocks side by side, deletions, late raw data.
    pub fn edit(&mut self, f: impl FnOnce(&mut Vec<Bucket>)) {
        let mut buckets = super::buffers::take(self.len());
        buckets.extend(self.iter());
        f(&mut buckets);
        let columns = self.columns;
        self.reset(columns);
        self.extend_from_buckets(&buckets);
        super::buffers::give(buckets);
    }

    /// Appends the buckets of `next`, a run of the same series' buckets (in order) from
    /// elsewhere: as `bucket::append_runs` does (a bucket both hold combined in time order,
    /// runs that interleave merged).
    pub fn append_runs(&mut self, next: &BucketColumns) {
        debug_assert_eq!(self.columns, next.columns, "runs of one read hold the same columns");
        match (self.ends.last(), next.ends.first()) {
            (Some(&last), Some(&first)) if first <= last => {
                if first == last {
                    // The bucket a block boundary cut, finished by the next run.
                    let k = self.len() - 1;
                    let mut b = self.bucket(k);
                    b.absorb(&next.bucket(0));
                    self.truncate(k);
                    self.push(&b);
                    self.extend_from(next, 1);
                } else {
                    let next: Vec<Bucket> = next.iter().collect();
                    self.edit(|a| super::append_runs(a, &next));
                }
            }
            _ => self.extend_from(next, 0),
        }
    }

    /// Appends `other`'s buckets from `from` on.
    fn extend_from(&mut self, other: &BucketColumns, from: usize) {
        self.ends.extend_from_slice(&other.ends[from..]);
        macro_rules! extend {
            ($($field:ident),*) => {$(
                if let Some(rest) = other.$field.get(from..) {
                    self.$field.extend_from_slice(rest);
                }
            )*};
        }
        extend!(counts, sums, mins, maxs, firsts, lasts, reset_corrections, changes, resets, archives);
    }

    /// Whether the invariant holds: every held column as long as the ends, the others empty.
    pub fn is_consistent(&self) -> bool {
        let n = self.len();
        let c = self.columns;
        let mut ok = true;
        macro_rules! check {
            ($field:ident, $column:ident, $aggregate:ident) => {
                ok &= self.$field.len() == if c.has(Column::$column) { n } else { 0 };
            };
        }
        optional_columns!(check);
        ok
    }
}

impl<'a> IntoIterator for &'a BucketColumns {
    type Item = Bucket;
    type IntoIter = Box<dyn Iterator<Item = Bucket> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollup::aggregate;

    fn samples(n: i64, from: i64) -> Vec<Sample> {
        (0..n).map(|i| Sample { t: from + i * 15_000, v: ((i * 37) % 11) as f64 }).collect()
    }

    #[test]
    fn buckets_come_back_as_they_went_in_for_the_columns_held() {
        let buckets = aggregate(&samples(200, 1), 60_000);
        let all = BucketColumns::from_buckets(&buckets, ColumnSet::ALL);
        assert!(all.is_consistent());
        assert_eq!(all.iter().collect::<Vec<_>>(), buckets);
        let maxima = BucketColumns::from_buckets(&buckets, ColumnSet::of(&[Column::Max]));
        assert!(maxima.is_consistent());
        for (k, b) in maxima.iter().enumerate() {
            assert_eq!((b.end, b.count, b.max, b.sum), (buckets[k].end, 0, buckets[k].max, 0.0));
        }
        let averages = BucketColumns::from_buckets(&buckets, ColumnSet::of(&[Column::Count, Column::Sum]));
        assert!(averages.is_consistent() && averages.maxs().is_empty());
        for (k, b) in averages.iter().enumerate() {
            assert_eq!((b.end, b.count, b.sum, b.max), (buckets[k].end, buckets[k].count, buckets[k].sum, 0.0));
        }
        // A column not held that holds something, or a held one out of step, breaks the
        // invariant.
        let mut stray = maxima.clone();
        stray.sums.push(1.0);
        assert!(!stray.is_consistent());
        let mut short = maxima.clone();
        short.maxs.pop();
        assert!(!short.is_consistent());
        let lasts = BucketColumns::from_buckets(&buckets, ColumnSet::of(&[Column::Last]));
        assert!(lasts.iter().zip(&buckets).all(|(b, w)| b.first == w.last && b.last == w.last));
        assert_eq!(lasts.firsts(), lasts.lasts());
    }

    #[test]
    fn truncating_and_dropping_keep_the_columns_in_step() {
        let buckets = aggregate(&samples(200, 1), 60_000);
        let mut c = BucketColumns::from_buckets(&buckets, ColumnSet::of(&[Column::Sum, Column::First]));
        c.drop_front(3);
        c.truncate(c.len() - 2);
        assert!(c.is_consistent());
        let want = BucketColumns::from_buckets(&buckets[3..buckets.len() - 2], c.columns());
        assert_eq!(c, want);
    }

    #[test]
    fn runs_append_as_bucket_runs_do() {
        let s = samples(400, 1);
        let whole = aggregate(&s, 60_000);
        // Cut mid-bucket (a block boundary), at a bucket boundary, and overlapping.
        for (a, b) in [(&s[..101], &s[101..]), (&s[..100], &s[100..]), (&s[..300], &s[100..250])] {
            let (ra, rb) = (aggregate(a, 60_000), aggregate(b, 60_000));
            let mut want = ra.clone();
            crate::rollup::append_runs(&mut want, &rb);
            for columns in [ColumnSet::ALL, ColumnSet::of(&[Column::Sum]), ColumnSet::of(&[Column::Last])] {
                let mut got = BucketColumns::from_buckets(&ra, columns);
                got.append_runs(&BucketColumns::from_buckets(&rb, columns));
                assert!(got.is_consistent());
                assert_eq!(got, BucketColumns::from_buckets(&want, columns));
            }
        }
        let mut got = BucketColumns::from_buckets(&aggregate(&s[..101], 60_000), ColumnSet::ALL);
        got.append_runs(&BucketColumns::from_buckets(&aggregate(&s[101..], 60_000), ColumnSet::ALL));
        assert_eq!(got.iter().collect::<Vec<_>>().len(), whole.len());
    }

    #[test]
    fn edits_go_through_whole_buckets() {
        let buckets = aggregate(&samples(100, 1), 60_000);
        let mut c = BucketColumns::from_buckets(&buckets, ColumnSet::of(&[Column::Min, Column::Changes]));
        c.edit(|b| b.retain(|b| b.end % 120_000 == 0));
        assert!(c.is_consistent());
        assert!(c.ends().iter().all(|e| e % 120_000 == 0));
        assert_eq!(c.len(), buckets.iter().filter(|b| b.end % 120_000 == 0).count());
    }
}
