//! Native histograms: the sparse, exponential-bucket histograms of Prometheus (and their
//! custom-bucket variant, NHCB), in the float form PromQL computes with.
//!
//! Buckets are addressed by an integer index. With an exponential schema `s` (−4..=8), bucket
//! `i` covers `(base^(i-1), base^i]` with `base = 2^(2^-s)`, mirrored for negative
//! observations, plus a zero bucket `[-zero_threshold, zero_threshold]`. With the custom-bucket
//! schema (−53), bucket `i` covers `(custom_values[i-1], custom_values[i]]`, from −Inf to +Inf.
//! Populated indexes are stored as spans (`offset` from the end of the previous span, `length`)
//! and one absolute count per bucket.
//!
//! The arithmetic here merges bucket lists by index instead of editing spans in place: both
//! operands are brought to a common schema and zero bucket, their `(index, count)` lists are
//! merged, and spans are rebuilt. The layout that results is canonical (adjacent buckets in
//! one span), which is what comparisons and encoders want anyway.

use std::cmp::Ordering;

/// The schema of custom-bucket histograms (NHCB).
pub const CUSTOM_BUCKETS_SCHEMA: i32 = -53;
/// Lowest and highest exponential schema.
pub const EXPONENTIAL_SCHEMA_MIN: i32 = -4;
pub const EXPONENTIAL_SCHEMA_MAX: i32 = 8;

/// What is known about a counter reset at this sample; kept per chunk by storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub enum CounterResetHint {
    /// Nothing known: a reader compares with the previous sample.
    #[default]
    Unknown,
    /// This sample follows a counter reset.
    Reset,
    /// This sample does not follow a counter reset.
    NotReset,
    /// A gauge histogram: counts may go up and down.
    Gauge,
}

impl CounterResetHint {
    /// The names of the test language and of Prometheus' `String()`.
    pub fn name(self) -> &'static str {
        match self {
            CounterResetHint::Unknown => "unknown",
            CounterResetHint::Reset => "reset",
            CounterResetHint::NotReset => "not_reset",
            CounterResetHint::Gauge => "gauge",
        }
    }

    pub fn from_u8(b: u8) -> Option<CounterResetHint> {
        Some(match b {
            0 => CounterResetHint::Unknown,
            1 => CounterResetHint::Reset,
            2 => CounterResetHint::NotReset,
            3 => CounterResetHint::Gauge,
            _ => return None,
        })
    }

    pub fn to_u8(self) -> u8 {
        match self {
            CounterResetHint::Unknown => 0,
            CounterResetHint::Reset => 1,
            CounterResetHint::NotReset => 2,
            CounterResetHint::Gauge => 3,
        }
    }
}

/// A run of consecutive bucket indexes: `offset` from the end of the previous span (from 0 for
/// the first one), `length` buckets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub struct Span {
    pub offset: i32,
    pub length: u32,
}

/// Why two histograms cannot be combined, or a histogram is malformed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HistogramError {
    #[error("cannot apply this operation on histograms with a mix of exponential and custom bucket schemas")]
    IncompatibleSchema,
    #[error("invalid histogram schema {0}")]
    InvalidSchema(i32),
    #[error("{side} side: spans need {need} buckets, have {have} buckets")]
    SpansBucketsMismatch { side: &'static str, need: usize, have: usize },
    #[error("{side} side: span number {span} with offset {offset}")]
    NegativeSpanOffset { side: &'static str, span: usize, offset: i32 },
    #[error("{side} side: bucket number {bucket} has observation count of {count}")]
    NegativeBucketCount { side: &'static str, bucket: usize, count: String },
    #[error("observation count is {0}, must not be negative")]
    NegativeCount(String),
    #[error("custom buckets: {0}")]
    CustomBuckets(String),
}

/// A native histogram with float counts (absolute per bucket, not deltas).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FloatHistogram {
    pub hint: CounterResetHint,
    pub schema: i32,
    pub zero_threshold: f64,
    pub zero_count: f64,
    pub count: f64,
    /// Sum of observations; the stale-marker NaN here marks a stale histogram sample.
    pub sum: f64,
    pub positive_spans: Vec<Span>,
    pub negative_spans: Vec<Span>,
    pub positive_buckets: Vec<f64>,
    pub negative_buckets: Vec<f64>,
    /// Upper bounds of the custom buckets (schema −53), strictly increasing, without +Inf.
    pub custom_values: Vec<f64>,
}

/// One bucket with its bounds, as iterated for quantiles and fractions.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bucket {
    pub lower: f64,
    pub upper: f64,
    pub lower_inclusive: bool,
    pub upper_inclusive: bool,
    pub count: f64,
    pub index: i32,
}

pub fn is_custom_buckets_schema(schema: i32) -> bool {
    schema == CUSTOM_BUCKETS_SCHEMA
}

pub fn is_exponential_schema(schema: i32) -> bool {
    (EXPONENTIAL_SCHEMA_MIN..=EXPONENTIAL_SCHEMA_MAX).contains(&schema)
}

/// `2^e` for any integer `e`, saturating to 0 and +Inf.
fn pow2(e: i64) -> f64 {
    if e > 1023 {
        f64::INFINITY
    } else if e >= -1022 {
        f64::from_bits(((e + 1023) as u64) << 52)
    } else if e >= -1074 {
        f64::from_bits(1u64 << (e + 1074))
    } else {
        0.0
    }
}

/// `x · 2^e` without overflowing in between.
fn ldexp(mut x: f64, mut e: i64) -> f64 {
    while e > 1023 {
        x *= pow2(1023);
        e -= 1023;
        if x.is_infinite() {
            return x;
        }
    }
    while e < -1022 {
        x *= pow2(-1022);
        e += 1022;
        if x == 0.0 {
            return x;
        }
    }
    x * pow2(e)
}

/// Upper bound of exponential bucket `idx` in `schema` (its absolute value for a negative
/// bucket). The largest finite bucket ends at `f64::MAX`, as in Prometheus.
pub fn exponential_bound(idx: i32, schema: i32) -> f64 {
    if schema < 0 {
        let exp = (idx as i64) << (-schema);
        if exp == 1024 {
            return f64::MAX;
        }
        return ldexp(1.0, exp);
    }
    let per_power = 1i32 << schema;
    let frac_idx = idx & (per_power - 1);
    // The fraction in [0.5, 1): bucket boundaries within one power of two.
    let frac = 0.5 * (frac_idx as f64 / per_power as f64).exp2();
    let exp = (idx >> schema) as i64 + 1;
    if frac_idx == 0 && exp == 1025 {
        return f64::MAX;
    }
    ldexp(frac, exp)
}

/// The index in `to` (≤ `from`) of the bucket that contains bucket `idx` of schema `from`.
pub fn target_index(idx: i32, from: i32, to: i32) -> i32 {
    ((idx - 1) >> (from - to)) + 1
}

/// `(index, count)` of every bucket a span list describes.
fn indexed<'a>(spans: &'a [Span], buckets: &'a [f64]) -> impl Iterator<Item = (i32, f64)> + 'a {
    let mut idx = 0i32;
    let mut first = true;
    spans
        .iter()
        .flat_map(move |s| {
            // The first span's offset is absolute; later ones are relative to the previous end.
            idx = if first { s.offset } else { idx + s.offset };
            first = false;
            let start = idx;
            idx += s.length as i32;
            (0..s.length as i32).map(move |k| start + k)
        })
        .zip(buckets.iter().copied())
}

/// Spans and counts from `(index, count)` pairs in ascending index order; adjacent indexes share
/// a span. Zero counts are kept (call [`FloatHistogram::compact`] to drop them).
fn from_indexed(pairs: impl IntoIterator<Item = (i32, f64)>) -> (Vec<Span>, Vec<f64>) {
    let mut spans: Vec<Span> = Vec::new();
    let mut buckets = Vec::new();
    let mut end = 0i32; // one past the last index placed
    for (idx, c) in pairs {
        match spans.last_mut() {
            Some(s) if idx == end => s.length += 1,
            Some(_) => spans.push(Span { offset: idx - end, length: 1 }),
            None => spans.push(Span { offset: idx, length: 1 }),
        }
        debug_assert!(spans.len() == 1 || idx >= end, "indexes must ascend");
        end = idx + 1;
        buckets.push(c);
    }
    (spans, buckets)
}

/// The canonical spans (maximal runs of adjacent indexes) of the union of the bucket indexes
/// two span lists describe; with an empty `b`, the canonical form of `a`.
pub fn layout_union(a: &[Span], b: &[Span]) -> Vec<Span> {
    let indexes = |s: &[Span]| {
        let n: usize = s.iter().map(|x| x.length as usize).sum();
        indexed(s, &vec![0.0; n]).map(|p| p.0).collect::<Vec<i32>>()
    };
    let (x, y) = (indexes(a), indexes(b));
    let mut all = Vec::with_capacity(x.len() + y.len());
    let (mut i, mut j) = (0, 0);
    while i < x.len() || j < y.len() {
        let next = match (x.get(i), y.get(j)) {
            (Some(&p), Some(&q)) => p.min(q),
            (Some(&p), None) => p,
            (None, Some(&q)) => q,
            (None, None) => unreachable!(),
        };
        i += usize::from(x.get(i) == Some(&next));
        j += usize::from(y.get(j) == Some(&next));
        all.push((next, 0.0));
    }
    from_indexed(all).0
}

/// Brings ascending `(index, count)` pairs from schema `from` to the lower-resolution `to`,
/// adding the counts that land in one bucket.
fn reduce_pairs(pairs: impl Iterator<Item = (i32, f64)>, from: i32, to: i32) -> Vec<(i32, f64)> {
    let mut out: Vec<(i32, f64)> = Vec::new();
    for (idx, c) in pairs {
        let t = if from == to { idx } else { target_index(idx, from, to) };
        match out.last_mut() {
            Some((last, sum)) if *last == t => *sum += c,
            _ => out.push((t, c)),
        }
    }
    out
}

/// Merges two ascending bucket lists, adding (or subtracting) counts of equal indexes.
fn merge_pairs(a: &[(i32, f64)], b: &[(i32, f64)], subtract: bool) -> Vec<(i32, f64)> {
    let sign = if subtract { -1.0 } else { 1.0 };
    let mut out = Vec::with_capacity(a.len().max(b.len()));
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        let ord = match (a.get(i), b.get(j)) {
            (Some(x), Some(y)) => x.0.cmp(&y.0),
            (Some(_), None) => Ordering::Less,
            _ => Ordering::Greater,
        };
        match ord {
            Ordering::Less => {
                out.push(a[i]);
                i += 1;
            }
            Ordering::Greater => {
                out.push((b[j].0, sign * b[j].1));
                j += 1;
            }
            Ordering::Equal => {
                out.push((a[i].0, a[i].1 + sign * b[j].1));
                i += 1;
                j += 1;
            }
        }
    }
    out
}

impl FloatHistogram {
    pub fn uses_custom_buckets(&self) -> bool {
        is_custom_buckets_schema(self.schema)
    }

    /// A stale marker: a histogram sample whose sum is the stale NaN.
    pub fn stale_marker() -> FloatHistogram {
        FloatHistogram { sum: f64::from_bits(crate::STALE_NAN_BITS), ..FloatHistogram::default() }
    }

    pub fn is_stale(&self) -> bool {
        crate::is_stale_nan(self.sum)
    }

    /// `(index, count)` of the positive (or negative) buckets.
    pub fn bucket_pairs(&self, positive: bool) -> impl Iterator<Item = (i32, f64)> + '_ {
        if positive {
            indexed(&self.positive_spans, &self.positive_buckets)
        } else {
            indexed(&self.negative_spans, &self.negative_buckets)
        }
    }

    /// Buckets of one side at the lower-or-equal `schema`, merged accordingly; for exponential
    /// schemas the leading buckets whose absolute upper bound is ≤ `start_abs` are skipped (they
    /// belong to a zero bucket that wide).
    fn pairs_at(&self, positive: bool, start_abs: f64, schema: i32) -> Vec<(i32, f64)> {
        debug_assert!(schema <= self.schema || self.uses_custom_buckets());
        let mut v = reduce_pairs(self.bucket_pairs(positive), self.schema, schema);
        if start_abs > 0.0 && is_exponential_schema(schema) {
            let skip = v.iter().take_while(|(i, _)| exponential_bound(*i, schema) <= start_abs).count();
            v.drain(..skip);
        }
        v
    }

    fn set_side(&mut self, positive: bool, pairs: Vec<(i32, f64)>) {
        let (spans, buckets) = from_indexed(pairs);
        if positive {
            self.positive_spans = spans;
            self.positive_buckets = buckets;
        } else {
            self.negative_spans = spans;
            self.negative_buckets = buckets;
        }
    }

    /// Upper bound of bucket `idx` of this histogram's schema.
    pub fn bucket_upper(&self, idx: i32) -> f64 {
        if self.uses_custom_buckets() {
            self.custom_values.get(idx as usize).copied().unwrap_or(f64::INFINITY)
        } else {
            exponential_bound(idx, self.schema)
        }
    }

    /// Lower bound of bucket `idx` of this histogram's schema (absolute, for negative buckets).
    fn bucket_lower(&self, idx: i32) -> f64 {
        if self.uses_custom_buckets() {
            if idx == 0 {
                f64::NEG_INFINITY
            } else {
                self.custom_values.get(idx as usize - 1).copied().unwrap_or(f64::INFINITY)
            }
        } else {
            exponential_bound(idx - 1, self.schema)
        }
    }

    /// Positive buckets with their bounds, ascending.
    pub fn positive_buckets(&self) -> impl Iterator<Item = Bucket> + '_ {
        self.bucket_pairs(true).map(|(index, count)| Bucket {
            lower: self.bucket_lower(index),
            upper: self.bucket_upper(index),
            lower_inclusive: false,
            upper_inclusive: true,
            count,
            index,
        })
    }

    /// Negative buckets with their bounds, from the one nearest zero downwards.
    pub fn negative_buckets(&self) -> impl Iterator<Item = Bucket> + '_ {
        self.bucket_pairs(false).map(|(index, count)| Bucket {
            lower: -self.bucket_upper(index),
            upper: -self.bucket_lower(index),
            lower_inclusive: true,
            upper_inclusive: false,
            count,
            index,
        })
    }

    /// The zero bucket, `[-zero_threshold, zero_threshold]`.
    pub fn zero_bucket(&self) -> Bucket {
        Bucket {
            lower: -self.zero_threshold,
            upper: self.zero_threshold,
            lower_inclusive: true,
            upper_inclusive: true,
            count: self.zero_count,
            index: 0,
        }
    }

    /// Every bucket in ascending order of value: negative ones, the zero bucket (if populated),
    /// positive ones. Buckets overlapping the zero bucket are clipped at its threshold.
    pub fn all_buckets(&self) -> Vec<Bucket> {
        let mut neg: Vec<Bucket> = self.negative_buckets().collect();
        neg.reverse();
        let zt = self.zero_threshold;
        let mut out = Vec::with_capacity(neg.len() + 1 + self.positive_buckets.len());
        for mut b in neg {
            if b.upper < 0.0 && b.upper > -zt {
                b.upper = -zt;
            }
            out.push(b);
        }
        if self.zero_count > 0.0 {
            out.push(self.zero_bucket());
        }
        for mut b in self.positive_buckets() {
            if b.lower > 0.0 && b.lower < zt {
                b.lower = zt;
            }
            out.push(b);
        }
        out
    }

    /// Scales every count and the sum; a negative factor makes the result a gauge.
    pub fn mul(&mut self, factor: f64) -> &mut Self {
        self.zero_count *= factor;
        self.count *= factor;
        self.sum *= factor;
        self.positive_buckets.iter_mut().for_each(|b| *b *= factor);
        self.negative_buckets.iter_mut().for_each(|b| *b *= factor);
        if factor < 0.0 {
            self.hint = CounterResetHint::Gauge;
        }
        self
    }

    /// Divides every count and the sum. Division by zero leaves infinite (or NaN) count, zero
    /// count and sum, and removes all buckets (Prometheus' definition).
    pub fn div(&mut self, divisor: f64) -> &mut Self {
        self.zero_count /= divisor;
        self.count /= divisor;
        self.sum /= divisor;
        if divisor == 0.0 {
            self.positive_spans.clear();
            self.negative_spans.clear();
            self.positive_buckets.clear();
            self.negative_buckets.clear();
            return self;
        }
        self.positive_buckets.iter_mut().for_each(|b| *b /= divisor);
        self.negative_buckets.iter_mut().for_each(|b| *b /= divisor);
        if divisor < 0.0 {
            self.hint = CounterResetHint::Gauge;
        }
        self
    }

    /// Removes buckets with a count of exactly zero; spans become maximal runs.
    pub fn compact(&mut self) -> &mut Self {
        for positive in [true, false] {
            let pairs: Vec<(i32, f64)> = self.bucket_pairs(positive).filter(|(_, c)| *c != 0.0).collect();
            self.set_side(positive, pairs);
        }
        self
    }

    /// Lowers the resolution to `schema` (< the current one), merging buckets.
    pub fn reduce_resolution(&mut self, schema: i32) -> &mut Self {
        debug_assert!(!self.uses_custom_buckets() && schema <= self.schema);
        if schema < self.schema {
            for positive in [true, false] {
                let pairs = self.pairs_at(positive, 0.0, schema);
                self.set_side(positive, pairs);
            }
            self.schema = schema;
        }
        self
    }

    /// What the zero count would be with the (larger or equal) threshold `larger`: buckets below
    /// it join the zero bucket. If `larger` falls inside a populated bucket, the threshold moves
    /// up to that bucket's upper bound. Returns the count and the threshold used.
    fn zero_count_for_larger_threshold(&self, mut larger: f64) -> (f64, f64) {
        if larger == self.zero_threshold {
            return (self.zero_count, larger);
        }
        debug_assert!(larger > self.zero_threshold);
        'again: loop {
            let mut count = self.zero_count;
            for positive in [true, false] {
                // Buckets (by absolute value) below the threshold join the zero bucket.
                for (idx, c) in self.bucket_pairs(positive) {
                    let (lower, upper) = (self.bucket_lower(idx), self.bucket_upper(idx));
                    if lower >= larger {
                        break;
                    }
                    count += c;
                    if upper > larger {
                        if c != 0.0 {
                            larger = upper;
                            if !positive {
                                // The positive side was summed for a smaller threshold.
                                continue 'again;
                            }
                        }
                        break;
                    }
                }
            }
            return (count, larger);
        }
    }

    /// Widens the zero bucket to `threshold` (as adjusted by
    /// [`Self::zero_count_for_larger_threshold`]), moving the buckets inside it into the zero
    /// count; all empty buckets are dropped on the way, as Prometheus does.
    fn widen_zero_bucket(&mut self, threshold: f64) {
        let (count, threshold) = self.zero_count_for_larger_threshold(threshold);
        self.zero_count = count;
        self.zero_threshold = threshold;
        for positive in [true, false] {
            let pairs: Vec<(i32, f64)> = self
                .bucket_pairs(positive)
                .filter(|&(idx, c)| c != 0.0 && self.bucket_lower(idx) >= threshold)
                .collect();
            self.set_side(positive, pairs);
        }
    }

    /// Makes both zero buckets equally wide (the wider, moved up out of populated buckets);
    /// changes `self` and returns the zero count `other` would have.
    fn reconcile_zero_buckets(&mut self, other: &FloatHistogram) -> f64 {
        let mut other_count = other.zero_count;
        let mut other_threshold = other.zero_threshold;
        while other_threshold != self.zero_threshold {
            if self.zero_threshold > other_threshold {
                (other_count, other_threshold) = other.zero_count_for_larger_threshold(self.zero_threshold);
            }
            if other_threshold > self.zero_threshold {
                self.widen_zero_bucket(other_threshold);
            }
        }
        other_count
    }

    /// Combines the counter reset hints of two operands of `+` or `-`; true when one says reset
    /// and the other not-reset (a collision the caller may report).
    fn adjust_hint(&mut self, other: &FloatHistogram) -> bool {
        use CounterResetHint::*;
        match (self.hint, other.hint) {
            (a, b) if a == b => false,
            (Gauge, _) => false,
            (_, Gauge) => {
                self.hint = Gauge;
                false
            }
            (Unknown, _) => false,
            (_, Unknown) => {
                self.hint = Unknown;
                false
            }
            _ => {
                self.hint = Unknown;
                true
            }
        }
    }

    /// `self += other` (or `-=`): see [`Self::add`].
    fn add_or_sub(&mut self, other: &FloatHistogram, subtract: bool) -> Result<Combined, HistogramError> {
        if self.uses_custom_buckets() != other.uses_custom_buckets() {
            return Err(HistogramError::IncompatibleSchema);
        }
        let sign = if subtract { -1.0 } else { 1.0 };
        let mut combined = Combined { counter_reset_collision: self.adjust_hint(other), ..Combined::default() };
        self.count += sign * other.count;
        self.sum += sign * other.sum;
        if self.uses_custom_buckets() {
            if self.custom_values == other.custom_values {
                let mine: Vec<(i32, f64)> = self.bucket_pairs(true).collect();
                let theirs: Vec<(i32, f64)> = other.bucket_pairs(true).collect();
                self.set_side(true, merge_pairs(&mine, &theirs, subtract));
            } else {
                combined.custom_bounds_reconciled = true;
                let bounds = intersect_bounds(&self.custom_values, &other.custom_values);
                let mut target = vec![0.0; bounds.len() + 1];
                map_custom_buckets(self, &bounds, 1.0, &mut target);
                map_custom_buckets(other, &bounds, sign, &mut target);
                self.custom_values = bounds;
                let pairs = target.into_iter().enumerate().filter(|(_, c)| *c != 0.0).map(|(i, c)| (i as i32, c));
                self.set_side(true, pairs.collect());
            }
            return Ok(combined);
        }
        let other_zero = self.reconcile_zero_buckets(other);
        self.zero_count += sign * other_zero;
        let schema = self.schema.min(other.schema);
        let zt = self.zero_threshold;
        for positive in [true, false] {
            let mine = self.pairs_at(positive, 0.0, schema);
            let theirs = other.pairs_at(positive, zt, schema);
            self.set_side(positive, merge_pairs(&mine, &theirs, subtract));
        }
        self.schema = schema;
        Ok(combined)
    }

    /// `self += other`. Zero buckets and schemas are reconciled (the wider zero bucket, the
    /// lower resolution). Custom-bucket histograms with different bounds are added over the
    /// bounds both have. Mixing exponential and custom buckets is an error. The result may hold
    /// empty buckets; [`Self::compact`] removes them.
    pub fn add(&mut self, other: &FloatHistogram) -> Result<Combined, HistogramError> {
        self.add_or_sub(other, false)
    }

    /// `self -= other`, like [`Self::add`]. The hint is combined as for addition (useful for
    /// incremental means); the `-` operator makes its result a gauge itself.
    pub fn sub(&mut self, other: &FloatHistogram) -> Result<Combined, HistogramError> {
        self.add_or_sub(other, true)
    }

    /// Whether `self`, the sample after `previous`, starts after a counter reset: a hint says so
    /// (`Reset` / `NotReset`), or any count (total, zero bucket, any bucket) went down, or a
    /// populated bucket vanished, or the resolution rose, or the zero bucket narrowed.
    pub fn detect_reset(&self, previous: &FloatHistogram) -> bool {
        match self.hint {
            CounterResetHint::Reset => true,
            CounterResetHint::NotReset => false,
            // A gauge given to a counter function is treated as a counter (PromQL warns).
            CounterResetHint::Unknown | CounterResetHint::Gauge => self.counts_decreased(previous),
        }
    }

    /// [`Self::detect_reset`] by the counts alone, whatever the hint says (what storage uses
    /// to decide where a counter chunk must end).
    pub fn counts_decreased(&self, previous: &FloatHistogram) -> bool {
        if self.count < previous.count {
            return true;
        }
        if self.uses_custom_buckets() {
            if !previous.uses_custom_buckets() {
                return true;
            }
            if self.custom_values != previous.custom_values {
                return detect_reset_mismatched_custom(self, previous);
            }
        } else if previous.uses_custom_buckets() {
            return true;
        }
        if self.schema > previous.schema {
            return true;
        }
        if self.zero_threshold < previous.zero_threshold {
            return true;
        }
        let (prev_zero, threshold) = previous.zero_count_for_larger_threshold(self.zero_threshold);
        if threshold != self.zero_threshold {
            // The zero bucket now ends inside a populated bucket of the previous histogram.
            return true;
        }
        if self.zero_count < prev_zero {
            return true;
        }
        for positive in [true, false] {
            let cur = self.pairs_at(positive, self.zero_threshold, self.schema);
            let prev = previous.pairs_at(positive, self.zero_threshold, self.schema);
            let mut j = 0;
            for (idx, c) in prev {
                while j < cur.len() && cur[j].0 < idx {
                    j += 1;
                }
                let reset = match cur.get(j) {
                    Some(&(i, now)) if i == idx => now < c,
                    // A bucket that vanished is a reset unless it was empty.
                    _ => c != 0.0,
                };
                if reset {
                    return true;
                }
            }
        }
        false
    }

    /// Data equality: same schema, bounds and layout, and bit-identical counts and sum. The hint
    /// is not compared.
    pub fn bit_eq(&self, other: &FloatHistogram) -> bool {
        let bits =
            |a: &[f64], b: &[f64]| a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        self.schema == other.schema
            && self.count.to_bits() == other.count.to_bits()
            && self.sum.to_bits() == other.sum.to_bits()
            && self.zero_threshold == other.zero_threshold
            && self.zero_count.to_bits() == other.zero_count.to_bits()
            && bits(&self.custom_values, &other.custom_values)
            && spans_match(&self.positive_spans, &other.positive_spans)
            && spans_match(&self.negative_spans, &other.negative_spans)
            && bits(&self.positive_buckets, &other.positive_buckets)
            && bits(&self.negative_buckets, &other.negative_buckets)
    }

    /// Checks the invariants storage relies on; the error names what is wrong.
    pub fn validate(&self) -> Result<(), HistogramError> {
        if self.uses_custom_buckets() {
            if self.zero_count != 0.0 || self.zero_threshold != 0.0 {
                return Err(HistogramError::CustomBuckets(
                    "histograms with custom buckets must not have a zero bucket".into(),
                ));
            }
            if !self.negative_spans.is_empty() || !self.negative_buckets.is_empty() {
                return Err(HistogramError::CustomBuckets(
                    "histograms with custom buckets must not have negative buckets".into(),
                ));
            }
            if let Some(w) = self.custom_values.windows(2).find(|w| w[0].partial_cmp(&w[1]) != Some(Ordering::Less)) {
                return Err(HistogramError::CustomBuckets(format!(
                    "previous bound is {} and current is {}: custom bounds must be strictly increasing",
                    w[0], w[1]
                )));
            }
            if self.custom_values.last().is_some_and(|v| v.is_infinite() && *v > 0.0) {
                return Err(HistogramError::CustomBuckets("last +Inf bound must not be explicitly defined".into()));
            }
            if let Some((idx, _)) = self.bucket_pairs(true).last() {
                if idx < 0 || idx as usize > self.custom_values.len() {
                    return Err(HistogramError::CustomBuckets(format!(
                        "bucket index {idx} is outside the {} custom bounds",
                        self.custom_values.len()
                    )));
                }
            }
        } else if is_exponential_schema(self.schema) {
            if !self.custom_values.is_empty() {
                return Err(HistogramError::CustomBuckets(
                    "histograms with exponential schemas must not have custom bounds".into(),
                ));
            }
            check_side("negative", &self.negative_spans, &self.negative_buckets)?;
            if self.zero_count < 0.0 {
                return Err(HistogramError::NegativeBucketCount {
                    side: "zero",
                    bucket: 0,
                    count: self.zero_count.to_string(),
                });
            }
        } else {
            return Err(HistogramError::InvalidSchema(self.schema));
        }
        check_side("positive", &self.positive_spans, &self.positive_buckets)?;
        if self.count < 0.0 {
            return Err(HistogramError::NegativeCount(self.count.to_string()));
        }
        Ok(())
    }
}

impl std::fmt::Display for FloatHistogram {
    /// Prometheus' `String()`: count, sum, then every populated bucket in ascending order, as
    /// `{count:20, sum:10, [-2,-1):2, [-0.001,0.001]:2, (0.5,1]:1}` (numbers as Go's `%g`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{{count:{}, sum:{}", go_g(self.count), go_g(self.sum))?;
        let mut neg: Vec<Bucket> = self.negative_buckets().filter(|b| b.count != 0.0).collect();
        neg.reverse();
        let zero = (self.zero_count != 0.0 && !self.uses_custom_buckets()).then(|| self.zero_bucket());
        for b in neg
            .iter()
            .chain(zero.iter())
            .chain(self.positive_buckets().filter(|b| b.count != 0.0).collect::<Vec<_>>().iter())
        {
            write!(
                f,
                ", {}{},{}{}:{}",
                if b.lower_inclusive { '[' } else { '(' },
                go_g(b.lower),
                go_g(b.upper),
                if b.upper_inclusive { ']' } else { ')' },
                go_g(b.count)
            )?;
        }
        write!(f, "}}")
    }
}

/// Go's `%g` for a float64 (`strconv.FormatFloat(v, 'g', -1, 64)`): the shortest digits that
/// round-trip, in exponent form (`1.5e+06`) when the decimal exponent is below −4 or at least 6.
pub fn go_g(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf".into() } else { "-Inf".into() };
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0".into() } else { "0".into() };
    }
    // Rust's `{:e}` gives the shortest round-trip digits: d.ddddde±x.
    let e = format!("{v:e}");
    let (mantissa, exp) = e.split_once('e').expect("exponent form");
    let exp: i32 = exp.parse().expect("integer exponent");
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exp.abs());
    }
    format!("{v}")
}

/// Neumaier's compensated addition: the new sum and compensation of `sum + inc`.
/// Written with selects rather than branches, so that loops of it over many steps vectorize.
#[inline]
pub fn kahan_inc(inc: f64, sum: f64, c: f64) -> (f64, f64) {
    let t = sum + inc;
    let (big, small) = if sum.abs() >= inc.abs() { (sum, inc) } else { (inc, sum) };
    let c = if t.is_infinite() { 0.0 } else { c + ((big - t) + small) };
    (t, c)
}

/// A compensated (Kahan–Neumaier) sum of histograms, as PromQL's `sum`, `avg`,
/// `sum_over_time` and `avg_over_time` use: every field and bucket carries its compensation,
/// so small counts survive next to huge ones that cancel out. The compensation has the sum's
/// layout at all times.
#[derive(Clone, Debug)]
pub struct KahanSum {
    sum: FloatHistogram,
    comp: FloatHistogram,
}

impl KahanSum {
    pub fn new(first: &FloatHistogram) -> KahanSum {
        let mut comp = first.clone();
        comp.mul(0.0);
        comp.sum = 0.0;
        comp.count = 0.0;
        comp.zero_count = 0.0;
        KahanSum { sum: first.clone(), comp }
    }

    /// Multiplies the running sum (and its compensation) by `f`.
    pub fn scale(&mut self, f: f64) {
        let hint = self.sum.hint;
        self.sum.mul(f);
        self.comp.mul(f);
        self.sum.hint = hint;
    }

    /// Adds `other`. Where layouts cannot line up field by field (zero buckets or custom bounds
    /// differ), the compensation is folded in first and the addition is a plain one.
    pub fn add(&mut self, other: &FloatHistogram) -> Result<Combined, HistogramError> {
        if self.sum.uses_custom_buckets() != other.uses_custom_buckets() {
            return Err(HistogramError::IncompatibleSchema);
        }
        let aligned = if self.sum.uses_custom_buckets() {
            self.sum.custom_values == other.custom_values
        } else {
            self.sum.zero_threshold == other.zero_threshold
        };
        if !aligned {
            let hint = self.sum.hint;
            let comp = std::mem::take(&mut self.comp);
            self.sum.add(&FloatHistogram { hint, ..comp })?;
            let r = self.sum.add(other);
            self.comp = KahanSum::new(&self.sum).comp;
            return r;
        }
        let combined = Combined { counter_reset_collision: self.sum.adjust_hint(other), ..Combined::default() };
        if !self.sum.uses_custom_buckets() && other.schema < self.sum.schema {
            self.sum.reduce_resolution(other.schema);
            self.comp.reduce_resolution(other.schema);
        }
        let schema = self.sum.schema;
        (self.sum.count, self.comp.count) = kahan_inc(other.count, self.sum.count, self.comp.count);
        (self.sum.sum, self.comp.sum) = kahan_inc(other.sum, self.sum.sum, self.comp.sum);
        (self.sum.zero_count, self.comp.zero_count) =
            kahan_inc(other.zero_count, self.sum.zero_count, self.comp.zero_count);
        for positive in [true, false] {
            let mine: Vec<(i32, f64)> = self.sum.bucket_pairs(positive).collect();
            let comps: Vec<(i32, f64)> = self.comp.bucket_pairs(positive).collect();
            debug_assert_eq!(mine.len(), comps.len(), "the compensation has the sum's layout");
            let theirs = other.pairs_at(positive, 0.0, schema);
            let (mut sums, mut cs) = (Vec::with_capacity(mine.len()), Vec::with_capacity(mine.len()));
            let (mut i, mut j) = (0, 0);
            while i < mine.len() || j < theirs.len() {
                let (idx, s, c, o) = match (mine.get(i), theirs.get(j)) {
                    (Some(&(a, s)), Some(&(b, o))) if a == b => {
                        i += 1;
                        j += 1;
                        (a, s, comps[i - 1].1, o)
                    }
                    (Some(&(a, s)), Some(&(b, _))) if a < b => {
                        i += 1;
                        (a, s, comps[i - 1].1, 0.0)
                    }
                    (Some(&(a, s)), None) => {
                        i += 1;
                        (a, s, comps[i - 1].1, 0.0)
                    }
                    (_, Some(&(b, o))) => {
                        j += 1;
                        (b, 0.0, 0.0, o)
                    }
                    (None, None) => unreachable!("the loop condition"),
                };
                let (s, c) = kahan_inc(o, s, c);
                sums.push((idx, s));
                cs.push((idx, c));
            }
            self.sum.set_side(positive, sums);
            self.comp.set_side(positive, cs);
        }
        Ok(combined)
    }

    /// The sum, its compensation added in.
    pub fn result(&self) -> FloatHistogram {
        let mut h = self.sum.clone();
        h.count += self.comp.count;
        h.sum += self.comp.sum;
        h.zero_count += self.comp.zero_count;
        for (b, c) in h.positive_buckets.iter_mut().zip(&self.comp.positive_buckets) {
            *b += c;
        }
        for (b, c) in h.negative_buckets.iter_mut().zip(&self.comp.negative_buckets) {
            *b += c;
        }
        h
    }

    /// Whether any field of the running sum has overflowed to an infinity.
    pub fn overflowed(&self) -> bool {
        let h = &self.sum;
        [h.count, h.sum, h.zero_count]
            .iter()
            .chain(&h.positive_buckets)
            .chain(&h.negative_buckets)
            .any(|v| v.is_infinite())
    }
}

/// The mean of histograms as PromQL's `avg` and `avg_over_time` compute it: a compensated
/// sum divided at the end, unless the sum overflows; from then on an incremental mean
/// (`mean · (n−1)/n + x/n`, compensated), which stays finite.
#[derive(Clone, Debug)]
pub struct HistogramMean {
    acc: KahanSum,
    n: f64,
    incremental: bool,
}

impl HistogramMean {
    pub fn new(first: &FloatHistogram) -> HistogramMean {
        HistogramMean { acc: KahanSum::new(first), n: 1.0, incremental: false }
    }

    pub fn add(&mut self, x: &FloatHistogram) -> Result<Combined, HistogramError> {
        self.n += 1.0;
        if !self.incremental {
            let mut tentative = self.acc.clone();
            let r = tentative.add(x)?;
            if !tentative.overflowed() {
                self.acc = tentative;
                return Ok(r);
            }
            // The sum of the first n−1 overflows with this one: their mean instead.
            self.incremental = true;
            self.acc.scale(1.0 / (self.n - 1.0));
        }
        self.acc.scale((self.n - 1.0) / self.n);
        let mut share = x.clone();
        let hint = share.hint;
        share.div(self.n);
        share.hint = hint;
        self.acc.add(&share)
    }

    pub fn result(&self) -> FloatHistogram {
        let mut h = self.acc.result();
        if !self.incremental {
            let hint = h.hint;
            h.div(self.n);
            h.hint = hint;
        }
        h
    }
}

/// What [`FloatHistogram::add`] noticed on the way (PromQL reports both as annotations).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Combined {
    /// One operand said counter reset, the other not.
    pub counter_reset_collision: bool,
    /// Custom bounds differed; the result has only the bounds both had.
    pub custom_bounds_reconciled: bool,
}

fn spans_match(a: &[Span], b: &[Span]) -> bool {
    // Zero-length spans carry nothing; compare the indexes they describe.
    let idx =
        |s: &[Span]| indexed(s, &vec![0.0; s.iter().map(|x| x.length as usize).sum()]).map(|p| p.0).collect::<Vec<_>>();
    a == b || idx(a) == idx(b)
}

fn check_side(side: &'static str, spans: &[Span], buckets: &[f64]) -> Result<(), HistogramError> {
    let need: usize = spans.iter().map(|s| s.length as usize).sum();
    if need != buckets.len() {
        return Err(HistogramError::SpansBucketsMismatch { side, need, have: buckets.len() });
    }
    if let Some((span, s)) = spans.iter().enumerate().skip(1).find(|(_, s)| s.offset < 0) {
        return Err(HistogramError::NegativeSpanOffset { side, span, offset: s.offset });
    }
    if let Some((bucket, c)) = buckets.iter().enumerate().find(|(_, c)| **c < 0.0) {
        return Err(HistogramError::NegativeBucketCount { side, bucket, count: c.to_string() });
    }
    Ok(())
}

/// The bounds two custom-bucket layouts share.
fn intersect_bounds(a: &[f64], b: &[f64]) -> Vec<f64> {
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::new();
    while i < a.len() && j < b.len() {
        match a[i].partial_cmp(&b[j]) {
            Some(Ordering::Equal) => {
                out.push(a[i]);
                i += 1;
                j += 1;
            }
            Some(Ordering::Less) => i += 1,
            _ => j += 1,
        }
    }
    out
}

/// Adds `sign ·` each custom bucket of `h` into the bucket of the coarser layout `bounds` that
/// contains it (the first shared bound at or above its own upper bound, else +Inf).
fn map_custom_buckets(h: &FloatHistogram, bounds: &[f64], sign: f64, target: &mut [f64]) {
    let mut k = 0;
    for (idx, c) in h.bucket_pairs(true) {
        let upper = h.bucket_upper(idx);
        while k < bounds.len() && bounds[k] < upper {
            k += 1;
        }
        target[k.min(bounds.len())] += sign * c;
    }
}

/// Counter-reset detection between custom-bucket histograms with different bounds: compare the
/// cumulative counts at every bound both share.
fn detect_reset_mismatched_custom(cur: &FloatHistogram, prev: &FloatHistogram) -> bool {
    let bounds = intersect_bounds(&cur.custom_values, &prev.custom_values);
    let mut a = vec![0.0; bounds.len() + 1];
    let mut b = vec![0.0; bounds.len() + 1];
    map_custom_buckets(cur, &bounds, 1.0, &mut a);
    map_custom_buckets(prev, &bounds, 1.0, &mut b);
    a.iter().zip(&b).any(|(x, y)| x < y)
}

#[cfg(test)]
mod tests;

/// The `{{schema:0 sum:5 count:4 buckets:[1 2 1]}}` notation of Prometheus' PromQL test files
/// and rule unit tests (`testdata/promql/README.md`, section 5), for tests and messages.
pub mod notation {
    use super::{from_indexed, CounterResetHint, FloatHistogram, Span};

    /// Parses the inside of `{{…}}` (or the whole, braces included).
    pub fn parse(text: &str) -> Result<FloatHistogram, String> {
        let inner = text.trim();
        let inner = inner.strip_prefix("{{").and_then(|s| s.strip_suffix("}}")).unwrap_or(inner);
        let mut h = FloatHistogram::default();
        let (mut pos, mut neg) = (None::<Vec<f64>>, None::<Vec<f64>>);
        let (mut pos_offset, mut neg_offset) = (0i32, 0i32);
        let mut seen: Vec<String> = Vec::new();
        let mut rest = inner.trim_start();
        while !rest.is_empty() {
            let colon = rest.find(':').ok_or_else(|| format!("expected key:value in {{{{{inner}}}}} at {rest:?}"))?;
            let key = rest[..colon].trim().to_string();
            rest = rest[colon + 1..].trim_start();
            if seen.contains(&key) {
                return Err(format!("duplicate key {key:?} in histogram {{{{{inner}}}}}"));
            }
            seen.push(key.clone());
            let value: &str;
            if rest.starts_with('[') {
                let end = rest.find(']').ok_or_else(|| format!("unclosed [ after {key}:"))?;
                value = &rest[1..end];
                rest = rest[end + 1..].trim_start();
            } else {
                let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
                value = &rest[..end];
                rest = rest[end..].trim_start();
            }
            let list = || value.split_whitespace().map(parse_float).collect::<Result<Vec<f64>, String>>();
            let int = || value.parse::<i32>().map_err(|_| format!("{key}: {value:?} is not an integer"));
            match key.as_str() {
                "schema" => h.schema = int()?,
                "sum" => h.sum = parse_float(value)?,
                "count" => h.count = parse_float(value)?,
                "z_bucket" => h.zero_count = parse_float(value)?,
                "z_bucket_w" => h.zero_threshold = parse_float(value)?,
                "buckets" => pos = Some(list()?),
                "n_buckets" => neg = Some(list()?),
                "offset" => pos_offset = int()?,
                "n_offset" => neg_offset = int()?,
                "custom_values" => h.custom_values = list()?,
                "counter_reset_hint" => {
                    h.hint = match value {
                        "unknown" => CounterResetHint::Unknown,
                        "reset" => CounterResetHint::Reset,
                        "not_reset" => CounterResetHint::NotReset,
                        "gauge" => CounterResetHint::Gauge,
                        other => return Err(format!("unknown counter_reset_hint {other:?}")),
                    }
                }
                other => return Err(format!("unknown histogram key {other:?}")),
            }
        }
        let side = |b: Option<Vec<f64>>, offset: i32| match b {
            Some(b) if !b.is_empty() => (vec![Span { offset, length: b.len() as u32 }], b),
            _ => (Vec::new(), Vec::new()),
        };
        (h.positive_spans, h.positive_buckets) = side(pos, pos_offset);
        (h.negative_spans, h.negative_buckets) = side(neg, neg_offset);
        Ok(h)
    }

    fn parse_float(s: &str) -> Result<f64, String> {
        let l = s.to_ascii_lowercase();
        let body = l.trim_start_matches(['+', '-']);
        if body == "inf" || body == "nan" {
            let v = if body == "inf" { f64::INFINITY } else { f64::NAN };
            return Ok(if l.starts_with('-') { -v } else { v });
        }
        s.parse::<f64>().map_err(|_| format!("{s:?} is not a number"))
    }

    /// The notation of `h`, each side as one span (gaps filled with zeros), keys omitted when
    /// zero, as Prometheus' `TestExpression` prints it.
    pub fn format(h: &FloatHistogram) -> String {
        let mut parts: Vec<String> = Vec::new();
        let g = |v: f64| format_g(v);
        if h.schema != 0 {
            parts.push(format!("schema:{}", h.schema));
        }
        if h.count != 0.0 {
            parts.push(format!("count:{}", g(h.count)));
        }
        if h.sum != 0.0 {
            parts.push(format!("sum:{}", g(h.sum)));
        }
        if h.zero_count != 0.0 {
            parts.push(format!("z_bucket:{}", g(h.zero_count)));
        }
        if h.zero_threshold != 0.0 {
            parts.push(format!("z_bucket_w:{}", g(h.zero_threshold)));
        }
        if h.uses_custom_buckets() {
            parts.push(format!(
                "custom_values:[{}]",
                h.custom_values.iter().map(|v| g(*v)).collect::<Vec<_>>().join(" ")
            ));
        }
        if h.hint != CounterResetHint::Unknown {
            parts.push(format!("counter_reset_hint:{}", h.hint.name()));
        }
        for (positive, key, offset_key) in [(true, "buckets", "offset"), (false, "n_buckets", "n_offset")] {
            let pairs: Vec<(i32, f64)> = h.bucket_pairs(positive).collect();
            let Some(&(first, _)) = pairs.first() else { continue };
            let last = pairs.last().map_or(first, |p| p.0);
            let mut dense = vec![0.0; (last - first + 1) as usize];
            for (i, c) in pairs {
                dense[(i - first) as usize] = c;
            }
            if first != 0 {
                parts.push(format!("{offset_key}:{first}"));
            }
            parts.push(format!("{key}:[{}]", dense.iter().map(|v| g(*v)).collect::<Vec<_>>().join(" ")));
        }
        format!("{{{{{}}}}}", parts.join(" "))
    }

    /// Go's `%g`-like shortest form: integers without a fraction, `Inf`, `NaN`.
    fn format_g(v: f64) -> String {
        if v.is_nan() {
            "NaN".into()
        } else if v.is_infinite() {
            if v > 0.0 {
                "+Inf".into()
            } else {
                "-Inf".into()
            }
        } else {
            format!("{v}")
        }
    }

    /// Spans/buckets of one contiguous run (used by tests elsewhere).
    pub fn dense(offset: i32, counts: &[f64]) -> (Vec<Span>, Vec<f64>) {
        from_indexed(counts.iter().enumerate().map(|(i, c)| (offset + i as i32, *c)))
    }
}
