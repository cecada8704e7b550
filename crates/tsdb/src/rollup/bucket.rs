//! One rollup interval's aggregates of one series, and how samples become them.
//!
//! A bucket of interval `I` ending at `end` (a multiple of `I`) holds the samples with
//! `end - I < t <= end`: left-open and right-closed like PromQL's range windows `(t - r, t]`, so
//! a window whose ends and length are multiples of `I` is exactly a run of whole buckets.
//!
//! The aggregates form a monoid over time: two buckets of the same interval whose samples do
//! not interleave (every sample of the first before every sample of the second) combine into the
//! bucket their samples together would make (`Bucket::append`), bit for bit for count, min, max,
//! first, last, changes and resets, and up to float rounding for the sum and the counter reset
//! correction (added in a different order). That is what lets a bucket cut by a block boundary be finished when the next
//! block is rolled up or read, and a coarse window be answered from its buckets.
//!
//! A bucket made from samples that are all short decimals keeps their exact sum and reset
//! correction, rounded once (`ExactSums`): nearer the true sums than float additions, and a
//! decimal the tier's chunk stores in a byte or two rather than 64 XOR-coded bits.

use strata_model::{is_stale_nan, Sample};

/// Aggregates of the samples of one series in `(end - interval, end]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bucket {
    /// The bucket's end (inclusive), a multiple of the interval.
    pub end: i64,
    /// Samples in the bucket (at least 1).
    pub count: u64,
    pub sum: f64,
    /// Smallest and largest value as PromQL's `min_over_time`/`max_over_time` pick them: a NaN
    /// is replaced by any number that follows it.
    pub min: f64,
    pub max: f64,
    /// The first and last sample, with their own timestamps (rates extrapolate from them).
    pub first: Sample,
    pub last: Sample,
    /// The sum of the values just before each drop: what PromQL adds to `last - first` to
    /// account for counter resets, so `increase()` gives the bucket's counter increase exactly
    /// as `increase`/`rate` compute it before extrapolating (NaN samples included).
    pub reset_correction: f64,
    /// Samples whose value differs from the previous one (`changes`), and drops (`resets`).
    pub changes: u64,
    pub resets: u64,
    /// Whisper's value for the bucket's interval where the tier stands for a coarse archive of
    /// a Graphite path's retention schema (`SeriesFilter::archive_rule`), computed from the
    /// interval's samples when the bucket was made whole; `NotKept` otherwise.
    pub archive: ArchiveValue,
}

/// A Graphite archive's value for one interval, as whisper's cascade from the finer archives
/// gives it (each archive's value from the known values of the one below, by the path's
/// aggregation method and `xFilesFactor`). It is not an aggregate that combines: a bucket made
/// from parts (cut by a block boundary, merged with backfill) does not keep it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum ArchiveValue {
    /// Not computed: no rule for the series and tier, or the bucket was combined from parts.
    #[default]
    NotKept,
    /// Computed, and the archive has no value for the interval (too few of its slots known).
    Unknown,
    Value(f64),
}

/// Whisper's value for an interval of a coarse archive from the interval's samples (time
/// order, stale markers left out) and the bucket's end; `None` where the archive has none.
pub type ArchiveRule = std::sync::Arc<dyn Fn(i64, &[Sample]) -> Option<f64> + Send + Sync>;

/// What a step from `prev` to `next` adds to the reset correction: `prev` if the value drops.
fn correction(prev: f64, next: f64) -> f64 {
    if next < prev {
        prev
    } else {
        0.0
    }
}

/// Whether two consecutive values count as a change for `changes` (NaN to NaN is none).
fn changed(prev: f64, next: f64) -> bool {
    prev != next && !(prev.is_nan() && next.is_nan())
}

fn min_of(a: f64, b: f64) -> f64 {
    if b < a || a.is_nan() {
        b
    } else {
        a
    }
}

fn max_of(a: f64, b: f64) -> f64 {
    if b > a || a.is_nan() {
        b
    } else {
        a
    }
}

/// The end of the bucket of `interval` that holds timestamp `t`: the smallest multiple of
/// `interval` at or after `t`.
pub fn bucket_end(t: i64, interval: i64) -> i64 {
    debug_assert!(interval > 0);
    let q = t.div_euclid(interval);
    if t.rem_euclid(interval) == 0 {
        t
    } else {
        (q + 1).saturating_mul(interval)
    }
}

/// Which end of its interval a bucket's span includes. PromQL's windows `(t - r, t]` are
/// right-closed; Graphite's (whisper's) intervals `[start, start + step)` are left-closed, so a
/// tier read by `/render` as whisper would answer keeps left-closed buckets: a point stamped
/// exactly on a boundary (carbon senders often stamp whole minutes) belongs to the interval it
/// opens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Closed {
    /// `(end - interval, end]`.
    #[default]
    Right,
    /// `[end - interval, end)`.
    Left,
}

impl Closed {
    /// The end of the bucket of `interval` that holds timestamp `t`.
    pub fn bucket_end(self, t: i64, interval: i64) -> i64 {
        match self {
            Closed::Right => bucket_end(t, interval),
            Closed::Left => bucket_end(t.saturating_add(1), interval),
        }
    }

    /// The first and last timestamp (inclusive) a bucket ending at `end` may hold.
    pub fn span(self, end: i64, interval: i64) -> (i64, i64) {
        match self {
            Closed::Right => (end - interval + 1, end),
            Closed::Left => (end - interval, end - 1),
        }
    }

    pub fn is_right(&self) -> bool {
        *self == Closed::Right
    }
}

impl Bucket {
    /// A bucket of one sample, right-closed.
    pub fn of(s: Sample, interval: i64) -> Bucket {
        Bucket::ending(s, bucket_end(s.t, interval))
    }

    /// A bucket of one sample, ending at `end`.
    pub fn ending(s: Sample, end: i64) -> Bucket {
        Bucket {
            end,
            count: 1,
            sum: s.v,
            min: s.v,
            max: s.v,
            first: s,
            last: s,
            reset_correction: 0.0,
            changes: 0,
            resets: 0,
            archive: ArchiveValue::NotKept,
        }
    }

    /// The counter increase from the first sample to the last, resets accounted, not
    /// extrapolated: `last - first + reset_correction`, as PromQL's `increase` starts.
    pub fn increase(&self) -> f64 {
        self.last.v - self.first.v + self.reset_correction
    }

    /// Adds a sample later than every sample in the bucket (and inside it).
    pub fn push(&mut self, s: Sample) {
        debug_assert!(s.t > self.last.t);
        let prev = self.last.v;
        self.count += 1;
        self.sum += s.v;
        self.min = min_of(self.min, s.v);
        self.max = max_of(self.max, s.v);
        self.reset_correction += correction(prev, s.v);
        self.changes += changed(prev, s.v) as u64;
        self.resets += (s.v < prev) as u64;
        self.last = s;
    }

    /// Combines `next`, whose samples all follow this bucket's, into this one (same `end`, or
    /// `end` taken from `next` when a coarser bucket is built from finer ones).
    pub fn append(&mut self, next: &Bucket) {
        debug_assert!(next.first.t > self.last.t, "appended bucket must follow");
        let prev = self.last.v;
        self.end = self.end.max(next.end);
        self.count += next.count;
        self.sum += next.sum;
        self.min = min_of(self.min, next.min);
        self.max = max_of(self.max, next.max);
        self.reset_correction += correction(prev, next.first.v) + next.reset_correction;
        self.changes += changed(prev, next.first.v) as u64 + next.changes;
        self.resets += (next.first.v < prev) as u64 + next.resets;
        self.last = next.last;
        self.archive = ArchiveValue::NotKept;
    }

    /// Combines `next`, whose samples all follow this bucket's, into this one as `append` does,
    /// for a reader of the count, sum, min and max only: those combine in any order and with the
    /// same arithmetic as in `append` (bit for bit the same), and the first and last samples are
    /// not read, so they may be absent (buckets decoded without their columns). The other
    /// aggregates are left as they were: not this bucket's.
    pub fn append_totals(&mut self, next: &Bucket) {
        self.end = self.end.max(next.end);
        self.count += next.count;
        self.sum += next.sum;
        self.min = min_of(self.min, next.min);
        self.max = max_of(self.max, next.max);
        self.archive = ArchiveValue::NotKept;
    }

    /// Combines two buckets of the same `end` whose samples may interleave (data backfilled
    /// into a range whose raw samples are gone): count, sum, min and max as if the samples were
    /// one set (a sample present in both counts twice), first and last by time (`self` winning
    /// a tie), and the reset corrections, changes and resets of both added: an approximation,
    /// since the order of samples across the two is not known.
    pub fn absorb(&mut self, other: &Bucket) {
        debug_assert_eq!(self.end, other.end);
        if other.first.t > self.last.t {
            self.append(other);
            return;
        }
        if other.last.t < self.first.t {
            let mut b = *other;
            b.append(self);
            *self = b;
            return;
        }
        self.count += other.count;
        self.sum += other.sum;
        self.min = min_of(self.min, other.min);
        self.max = max_of(self.max, other.max);
        if other.first.t < self.first.t {
            self.first = other.first;
        }
        if other.last.t > self.last.t {
            self.last = other.last;
        }
        self.reset_correction += other.reset_correction;
        self.changes += other.changes;
        self.resets += other.resets;
        self.archive = ArchiveValue::NotKept;
    }
}

/// Turns one series' samples (in time order) into buckets of `interval`, appending to `out`;
/// a bucket whose samples continue in the next call is finished by `finish` or by more samples.
/// Stale markers are skipped: they end a series for PromQL's lookback, they are not values.
/// With an archive rule (`with_archive`), each bucket also gets the rule's value from its
/// samples, which are kept while it is open.
pub struct Aggregator {
    interval: i64,
    closed: Closed,
    open: Option<Bucket>,
    /// The open bucket's sum and reset correction kept exactly while its samples are short
    /// decimals (`ExactSums`).
    exact: Option<ExactSums>,
    archive: Option<(ArchiveRule, Vec<Sample>)>,
}

impl std::fmt::Debug for Aggregator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Aggregator")
            .field("interval", &self.interval)
            .field("closed", &self.closed)
            .field("open", &self.open)
            .field("archive", &self.archive.is_some())
            .finish()
    }
}

impl Aggregator {
    /// Right-closed buckets, as PromQL reads them.
    pub fn new(interval: i64) -> Aggregator {
        Aggregator::closed(interval, Closed::Right)
    }

    pub fn closed(interval: i64, closed: Closed) -> Aggregator {
        assert!(interval > 0, "rollup interval must be positive");
        Aggregator { interval, closed, open: None, exact: None, archive: None }
    }

    /// Each bucket's `archive` computed by `rule` (none: left `NotKept`). The caller marks
    /// buckets it knows to be cut (`ArchiveValue::NotKept`): the rule sees the samples given.
    pub fn with_archive(mut self, rule: Option<ArchiveRule>) -> Aggregator {
        self.archive = rule.map(|r| (r, Vec::new()));
        self
    }

    pub fn interval(&self) -> i64 {
        self.interval
    }

    /// Adds samples later than every sample added before, pushing each bucket they close.
    pub fn add(&mut self, samples: &[Sample], out: &mut Vec<Bucket>) {
        for &s in samples {
            if is_stale_nan(s.v) {
                continue;
            }
            match &mut self.open {
                Some(b) if s.t <= self.closed.span(b.end, self.interval).1 => {
                    // A drop as `Bucket::push` finds it, between the doubles.
                    let dropped = s.v < b.last.v;
                    b.push(s);
                    self.exact = self.exact.and_then(|x| x.push(s.v, dropped));
                }
                open => {
                    if let Some(mut done) = open.take() {
                        if let Some((rule, kept)) = &mut self.archive {
                            done.archive = archive_of(rule, done.end, kept);
                        }
                        exact_sums(&mut done, self.exact);
                        out.push(done);
                    }
                    *open = Some(Bucket::ending(s, self.closed.bucket_end(s.t, self.interval)));
                    // The last bucket's exponent first: a series' values usually keep theirs.
                    let hint = self.exact.map_or(0, |x| x.exponent);
                    self.exact = ExactSums::of(s.v, hint);
                }
            }
            if let Some((_, kept)) = &mut self.archive {
                kept.push(s);
            }
        }
    }

    /// Pushes the open bucket, if any.
    pub fn finish(&mut self, out: &mut Vec<Bucket>) {
        if let Some(mut done) = self.open.take() {
            if let Some((rule, kept)) = &mut self.archive {
                done.archive = archive_of(rule, done.end, kept);
            }
            exact_sums(&mut done, self.exact.take());
            out.push(done);
        }
    }
}

/// Most decimal exponent a sample may have for its bucket's sums to be kept exactly (a
/// Prometheus exporter's or a Graphite sender's values rarely have more than 6 decimals).
const EXACT_EXPONENT_MAX: usize = 15;

/// The sum and the reset correction of a bucket's samples, exactly, while every sample is a
/// short decimal `i / 10^e` (`dense::as_decimal`): as integers scaled by the largest `e` met.
///
/// Why: added as floats, decimals give sums that are themselves no short decimal (`0.1 + 0.2`
/// is `0.30000000000000004`), and a tier's chunk then stores them as 64-bit XOR values: the sum
/// and reset correction columns of a decimal gauge were 13 of its 22 bytes per 5-minute
/// bucket. The exact sum, rounded once to a double, is the decimal it should be, so the
/// chunk's decimal coding takes it (and it is nearer the true sum than the float one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ExactSums {
    sum: i64,
    correction: i64,
    /// The last sample, scaled: a drop below it adds it to the correction.
    last: i64,
    exponent: usize,
}

impl ExactSums {
    /// `v` as a decimal `i / 10^e`, at `exponent` if it is one there (any exponent that
    /// gives `v` back will do: scaled further, the sums stay exact), else at the smallest
    /// exponent that does; `None` when `v` is no short decimal. Trying the exponent already
    /// in use first is one multiplication and one division for most samples, where finding
    /// the smallest tries every exponent up to it.
    fn decimal(v: f64, exponent: usize) -> Option<(i64, usize)> {
        use crate::chunkenc::dense::{as_decimal, scaled};
        match scaled(v, exponent) {
            Some(i) => Some((i, exponent)),
            None => as_decimal(v, EXACT_EXPONENT_MAX),
        }
    }

    /// The sums of a bucket of one sample `v` (tried at exponent `hint` first); `None` when
    /// `v` is no short decimal.
    fn of(v: f64, hint: usize) -> Option<ExactSums> {
        let (i, exponent) = ExactSums::decimal(v, hint)?;
        Some(ExactSums { sum: i, correction: 0, last: i, exponent })
    }

    /// The sums with a later sample `v` added, `dropped` if it is below the one before (as the
    /// doubles compare: a double of 16 or 17 digits may stand for two neighbouring decimals
    /// at one exponent, so the scaled integers are not compared); `None` when `v` is no short
    /// decimal or a sum leaves i64 (the bucket then keeps its float sums).
    fn push(self, v: f64, dropped: bool) -> Option<ExactSums> {
        let (mut i, e) = ExactSums::decimal(v, self.exponent)?;
        let mut x = self;
        if e > x.exponent {
            let scale = 10i64.checked_pow((e - x.exponent) as u32)?;
            x.sum = x.sum.checked_mul(scale)?;
            x.correction = x.correction.checked_mul(scale)?;
            x.last = x.last.checked_mul(scale)?;
            x.exponent = e;
        } else {
            i = i.checked_mul(10i64.checked_pow((x.exponent - e) as u32)?)?;
        }
        if dropped {
            x.correction = x.correction.checked_add(x.last)?;
        }
        x.sum = x.sum.checked_add(i)?;
        x.last = i;
        Some(x)
    }

    /// A scaled integer as the double nearest its decimal: exact below 2^53, where the one
    /// division rounds once; `None` above.
    fn value(scaled: i64, exponent: usize) -> Option<f64> {
        (scaled.unsigned_abs() < 1 << 53).then(|| crate::chunkenc::dense::decimal_value(scaled, exponent))
    }
}

/// Gives a closed bucket the exact sums of its samples, where they were kept.
fn exact_sums(b: &mut Bucket, exact: Option<ExactSums>) {
    let Some(x) = exact else { return };
    if let Some(sum) = ExactSums::value(x.sum, x.exponent) {
        b.sum = sum;
    }
    if let Some(correction) = ExactSums::value(x.correction, x.exponent) {
        b.reset_correction = correction;
    }
}

/// The rule's value for the closed bucket ending at `end` from its samples (`kept`, emptied
/// for the next bucket).
fn archive_of(rule: &ArchiveRule, end: i64, kept: &mut Vec<Sample>) -> ArchiveValue {
    let value = match rule(end, kept) {
        Some(v) => ArchiveValue::Value(v),
        None => ArchiveValue::Unknown,
    };
    kept.clear();
    value
}

/// The right-closed buckets of `samples` (in time order) at `interval`.
pub fn aggregate(samples: &[Sample], interval: i64) -> Vec<Bucket> {
    aggregate_closed(samples, interval, Closed::Right)
}

/// The buckets of `samples` (in time order) at `interval`, closed on the side `closed` says.
pub fn aggregate_closed(samples: &[Sample], interval: i64, closed: Closed) -> Vec<Bucket> {
    let mut out = Vec::new();
    let mut agg = Aggregator::closed(interval, closed);
    agg.add(samples, &mut out);
    agg.finish(&mut out);
    out
}

/// Merges two runs of buckets (each sorted by `end`) into one: buckets of the same `end`
/// combined by `Bucket::absorb`, which is exact when their samples do not interleave.
pub fn merge_runs(a: &[Bucket], b: &[Bucket], out: &mut Vec<Bucket>) {
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        match a[i].end.cmp(&b[j].end) {
            std::cmp::Ordering::Less => {
                out.push(a[i]);
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                out.push(b[j]);
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                let mut m = a[i];
                m.absorb(&b[j]);
                out.push(m);
                i += 1;
                j += 1;
            }
        }
    }
    out.extend_from_slice(&a[i..]);
    out.extend_from_slice(&b[j..]);
}

/// `merge_runs` of `a` and `b` into `a`. When `b` starts at or after `a`'s last bucket (a tier
/// series and its newest data, read raw from the head: the usual case) it is appended in place;
/// otherwise the runs are merged through a buffer (`buffers`).
pub fn append_runs(a: &mut Vec<Bucket>, b: &[Bucket]) {
    let (Some(last), Some(next)) = (a.last_mut(), b.first()) else {
        a.extend_from_slice(b);
        return;
    };
    match next.end.cmp(&last.end) {
        std::cmp::Ordering::Greater => a.extend_from_slice(b),
        std::cmp::Ordering::Equal => {
            last.absorb(next);
            a.extend_from_slice(&b[1..]);
        }
        std::cmp::Ordering::Less => {
            let mut merged = super::buffers::take(a.len() + b.len());
            merge_runs(a, b, &mut merged);
            super::buffers::give(std::mem::replace(a, merged));
        }
    }
}

/// Sorts buckets of one series gathered from several places (tier blocks side by side, each
/// with partial buckets at its edges) by end, and combines those of the same end in time order
/// (`Bucket::absorb`: exact where their samples do not interleave).
pub fn coalesce(buckets: &mut Vec<Bucket>) {
    // The usual case, one tier block or blocks that do not share a bucket: nothing to do
    // (checked first: the compaction below copies every bucket).
    if buckets.windows(2).all(|p| p[0].end < p[1].end) {
        return;
    }
    buckets.sort_by_key(|b| (b.end, b.first.t));
    let mut kept = 0;
    for i in 0..buckets.len() {
        if kept > 0 && buckets[kept - 1].end == buckets[i].end {
            let b = buckets[i];
            buckets[kept - 1].absorb(&b);
        } else {
            buckets[kept] = buckets[i];
            kept += 1;
        }
    }
    buckets.truncate(kept);
}

#[cfg(test)]
mod tests;
