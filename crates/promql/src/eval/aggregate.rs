//! Aggregation operators. Each input series is assigned to its group once; the group then
//! accumulates per step. Sums and means use Kahan–Neumaier compensation as Prometheus does, so
//! results agree to the last bits.

use std::collections::HashMap;

use std::sync::Arc;

use strata_model::histogram::{HistogramMean, KahanSum};
use strata_model::{CounterResetHint, FloatHistogram, HistogramError, Label, Labels, METRIC_NAME};

use super::labels::{go_quote_bytes, keep, without};
use super::{point_buffers, Ctx, Evaluator, GroupSink, Val};
use crate::ast::{Aggregate, AggregateOp, ExprKind};
use crate::error::{exec, EvalError};
use crate::value::{HPoint, Point, Series};

pub(crate) use strata_model::kahan_inc;

/// Running state of one group at one step, for the operators that keep a mean (`avg`,
/// `stddev`, `stdvar`; the others fold into `StepAccs::Compact`).
#[derive(Debug, Clone, Copy, Default)]
struct Acc {
    seen: bool,
    value: f64,
    comp: f64,
    mean: f64,
    count: f64,
    incremental: bool,
}

impl Acc {
    #[inline(always)]
    fn add(&mut self, op: AggregateOp, f: f64) {
        if !self.seen {
            self.seen = true;
            self.count = 1.0;
            match op {
                AggregateOp::Stddev | AggregateOp::Stdvar => {
                    self.mean = f;
                    self.value = if f.is_finite() { 0.0 } else { f64::NAN };
                }
                _ => self.value = f,
            }
            return;
        }
        self.count += 1.0;
        match op {
            AggregateOp::Avg => self.add_mean(f),
            AggregateOp::Stddev | AggregateOp::Stdvar => {
                let delta = f - self.mean;
                self.mean += delta / self.count;
                self.value += delta * (f - self.mean);
            }
            _ => unreachable!("not a mean-based aggregation"),
        }
    }

    /// Prometheus' mean: a compensated sum while it stays finite, then an incremental mean.
    /// The sum is inlined into the fold's loop; the rest is the rare case, kept out of it.
    #[inline(always)]
    fn add_mean(&mut self, f: f64) {
        if !self.incremental {
            let (v, c) = kahan_inc(f, self.value, self.comp);
            if !v.is_infinite() {
                self.value = v;
                self.comp = c;
                return;
            }
        }
        self.add_mean_past_the_sum(f);
    }

    /// `add_mean` once the compensated sum would overflow (switching to the incremental mean
    /// when it first does).
    #[cold]
    #[inline(never)]
    fn add_mean_past_the_sum(&mut self, f: f64) {
        let n = self.count;
        if !self.incremental {
            self.incremental = true;
            self.mean = self.value / (n - 1.0);
            self.comp /= n - 1.0;
        }
        if self.mean.is_infinite() {
            if f.is_infinite() && (self.mean > 0.0) == (f > 0.0) {
                return;
            }
            if !f.is_infinite() && !f.is_nan() {
                return;
            }
        }
        let q = (n - 1.0) / n;
        (self.mean, self.comp) = kahan_inc(f / n, q * self.mean, q * self.comp);
    }

    fn result(&self, op: AggregateOp) -> f64 {
        match op {
            AggregateOp::Avg => {
                if self.incremental {
                    self.mean + self.comp
                } else {
                    self.value / self.count + self.comp / self.count
                }
            }
            AggregateOp::Stdvar => self.value / self.count,
            AggregateOp::Stddev => (self.value / self.count).sqrt(),
            _ => unreachable!("not a mean-based aggregation"),
        }
    }
}

/// A group's histogram sum or mean at one step (sum and avg of native histograms).
#[derive(Debug, Clone, Default)]
struct HistAcc {
    sum: Option<KahanSum>,
    mean: Option<HistogramMean>,
    count: f64,
    /// Histograms that cannot be added (exponential with custom buckets): no result.
    failed: bool,
    /// Hints seen: a reset and a non-reset summed together conflict.
    saw_reset: bool,
    saw_not_reset: bool,
}

/// What adding histograms noticed, reported once per aggregation.
#[derive(Debug, Default)]
struct HistNotes {
    collision: bool,
    reconciled: bool,
    incompatible: bool,
}

impl HistAcc {
    fn add(&mut self, op: AggregateOp, h: &FloatHistogram, notes: &mut HistNotes) {
        self.count += 1.0;
        self.saw_reset |= h.hint == CounterResetHint::Reset;
        self.saw_not_reset |= h.hint == CounterResetHint::NotReset;
        notes.collision |= self.saw_reset && self.saw_not_reset;
        if self.failed {
            return;
        }
        let r = match (op, &mut self.sum, &mut self.mean) {
            (AggregateOp::Avg, _, None) => {
                self.mean = Some(HistogramMean::new(h));
                return;
            }
            (AggregateOp::Avg, _, Some(m)) => m.add(h),
            (_, None, _) => {
                self.sum = Some(KahanSum::new(h));
                return;
            }
            (_, Some(s), _) => s.add(h),
        };
        match r {
            Ok(c) => notes.reconciled |= c.custom_bounds_reconciled,
            Err(HistogramError::IncompatibleSchema) | Err(_) => {
                notes.incompatible = true;
                self.failed = true;
            }
        }
    }

    fn result(&self) -> Option<FloatHistogram> {
        if self.failed {
            return None;
        }
        let mut h = match (&self.sum, &self.mean) {
            (Some(s), _) => s.result(),
            (None, Some(m)) => m.result(),
            (None, None) => return None,
        };
        h.compact();
        Some(h)
    }
}

/// The labels of a series' group.
fn group_labels(labels: &Labels, grouping: &[String], without_: bool) -> Labels {
    let names: Vec<&str> = grouping.iter().map(String::as_str).collect();
    if without_ {
        let mut names = names;
        names.push(METRIC_NAME);
        without(labels, &names)
    } else {
        keep(labels, &names)
    }
}

/// One group's accumulators at the steps from `base` on that its members' points span so far,
/// laid out by what the operator needs. `sum`, `count`, `group`, `min` and `max` keep a value
/// and a compensation (16 bytes a step, and a flag); `avg` a compensated sum and a count
/// until a sum would overflow, then, as `stddev` and `stdvar` always, the whole `Acc`. Every
/// input point is added into its group's step, and with thousands of groups the
/// accumulators do not fit in the cache, so their size is most of what folding costs. Only
/// the span is kept: under churn (pods replaced every few minutes, a day's range) each group
/// lives for a few dozen of the range's thousands of steps, and accumulators for every step
/// were most of such a query's memory and time (zeroed pages, then read back step by step).
struct StepAccs {
    base: usize,
    steps: Steps,
}

/// The accumulators of consecutive steps, `StepAccs::base` first.
enum Steps {
    /// A value and a compensation per step, apart (so that a fold runs down both a vector of
    /// steps at a time).
    Compact {
        seen: Vec<bool>,
        values: Vec<f64>,
        comps: Vec<f64>,
    },
    /// `avg` while every step's compensated sum is finite (Prometheus' mean before it turns
    /// incremental): the sum, its compensation and the count, apart, so that a fold runs down
    /// vectors of steps as `Compact`'s does (the `Acc` of each step, 48 bytes with its
    /// branches, made `avg` three times the CPU of `sum` on the thread that folds).
    Mean {
        seen: Vec<bool>,
        values: Vec<f64>,
        comps: Vec<f64>,
        counts: Vec<f64>,
    },
    Full(Vec<Acc>),
}

/// A group's accumulation: its first member's points as they came, until a second member
/// arrives (`sum by (instance)` over one series per instance is a common dashboard shape,
/// and its thousands of groups then cost no accumulators at all), then `StepAccs`.
enum GroupAcc {
    Single(Vec<Point>),
    Folded(StepAccs),
}

impl GroupAcc {
    /// The accumulators, made from the single member's points if not yet.
    fn folded(&mut self, op: AggregateOp, ctx: &Ctx) -> &mut StepAccs {
        if let GroupAcc::Single(points) = self {
            let mut accs = StepAccs::new(op);
            fold(op, &mut accs, points, ctx);
            point_buffers::POOL.give(std::mem::take(points));
            *self = GroupAcc::Folded(accs);
        }
        match self {
            GroupAcc::Folded(accs) => accs,
            GroupAcc::Single(_) => unreachable!("folded above"),
        }
    }

    /// The group's points: a single member's values as one value alone gives them.
    fn into_points(self, op: AggregateOp, ctx: &Ctx) -> Vec<Point> {
        match self {
            GroupAcc::Single(mut points) => {
                for p in &mut points {
                    p.f = alone(op, p.f);
                }
                points
            }
            GroupAcc::Folded(acc) => {
                acc.span().filter_map(|i| Some(Point { t: ctx.ts(i), f: acc.result(op, i)? })).collect()
            }
        }
    }
}

/// What an accumulating aggregation gives for one value alone, as folding it into fresh
/// accumulators and taking their result would (`alone_is_one_value_folded` checks it).
fn alone(op: AggregateOp, f: f64) -> f64 {
    match op {
        // The value and a zero compensation, added.
        AggregateOp::Sum => f + 0.0,
        AggregateOp::Count | AggregateOp::Group => 1.0,
        AggregateOp::Min | AggregateOp::Max => f,
        _ => {
            let mut acc = Acc::default();
            acc.add(op, f);
            acc.result(op)
        }
    }
}

impl StepAccs {
    /// Accumulators for no step yet: `fold` makes room for the steps its points fall on.
    fn new(op: AggregateOp) -> StepAccs {
        let steps = match op {
            AggregateOp::Avg => {
                Steps::Mean { seen: Vec::new(), values: Vec::new(), comps: Vec::new(), counts: Vec::new() }
            }
            AggregateOp::Stddev | AggregateOp::Stdvar => Steps::Full(Vec::new()),
            _ => Steps::Compact { seen: Vec::new(), values: Vec::new(), comps: Vec::new() },
        };
        StepAccs { base: 0, steps }
    }

    /// How many steps from `base` are kept.
    fn len(&self) -> usize {
        match &self.steps {
            Steps::Compact { seen, .. } | Steps::Mean { seen, .. } => seen.len(),
            Steps::Full(acc) => acc.len(),
        }
    }

    /// Makes the kept steps span `from..=to` too (fresh accumulators for the steps added).
    fn cover(&mut self, from: usize, to: usize) {
        debug_assert!(from <= to);
        let (base, len) = (self.base, self.len());
        if len > 0 && from >= base && to < base + len {
            return;
        }
        let (lo, hi) = if len == 0 { (from, to + 1) } else { (from.min(base), (to + 1).max(base + len)) };
        // Fresh steps before the kept ones (which land at `base - lo`) and after them.
        fn widen<T: Clone>(v: &mut Vec<T>, fresh: T, before: usize, after: usize) {
            let mut w = Vec::with_capacity(before + v.len() + after);
            w.resize(before, fresh.clone());
            w.append(v);
            w.resize(w.len() + after, fresh);
            *v = w;
        }
        let (before, after) = if len == 0 { (0, hi - lo) } else { (base - lo, hi - (base + len)) };
        match &mut self.steps {
            Steps::Compact { seen, values, comps } => {
                widen(seen, false, before, after);
                widen(values, 0.0, before, after);
                widen(comps, 0.0, before, after);
            }
            Steps::Mean { seen, values, comps, counts } => {
                widen(seen, false, before, after);
                widen(values, 0.0, before, after);
                widen(comps, 0.0, before, after);
                widen(counts, 0.0, before, after);
            }
            Steps::Full(acc) => widen(acc, Acc::default(), before, after),
        }
        self.base = lo;
        debug_assert_eq!(self.len(), hi - lo);
    }

    /// The result at step `i`, if any sample came.
    fn result(&self, op: AggregateOp, i: usize) -> Option<f64> {
        let k = i.checked_sub(self.base).filter(|&k| k < self.len())?;
        match &self.steps {
            Steps::Compact { seen, values, comps } => seen[k].then(|| match op {
                AggregateOp::Sum => values[k] + comps[k],
                _ => values[k],
            }),
            // As `Acc::result` of a mean that is still a sum.
            Steps::Mean { seen, values, comps, counts } => {
                seen[k].then(|| values[k] / counts[k] + comps[k] / counts[k])
            }
            Steps::Full(acc) => acc[k].seen.then(|| acc[k].result(op)),
        }
    }

    /// `Steps::Mean` turned into the `Acc`s it stands for (a sum about to overflow: the steps
    /// go on as Prometheus' incremental mean from there).
    fn mean_to_full(&mut self) {
        if let Steps::Mean { seen, values, comps, counts } = &self.steps {
            let acc = (0..seen.len())
                .map(|k| Acc {
                    seen: seen[k],
                    value: values[k],
                    comp: comps[k],
                    mean: 0.0,
                    count: counts[k],
                    incremental: false,
                })
                .collect();
            self.steps = Steps::Full(acc);
        }
    }

    /// The steps kept, as indexes of the range.
    fn span(&self) -> std::ops::Range<usize> {
        self.base..self.base + self.len()
    }
}

/// Adds a series' points into its group's accumulators, with the operator fixed per loop so the
/// per-point work has no dispatch.
fn fold(op: AggregateOp, accs: &mut StepAccs, points: &[Point], ctx: &Ctx) {
    let (Some(first), Some(last)) = (points.first(), points.last()) else { return };
    let (first, last) = (ctx.index(first.t), ctx.index(last.t));
    accs.cover(first, last);
    let base = accs.base;
    // The points' first and last steps among the kept ones.
    let span = (first - base, last - base);
    if let Steps::Mean { seen, values, comps, counts } = &mut accs.steps {
        let mean = Mean { seen, values, comps, counts };
        if mean.fold(span, points, ctx, base) {
            return;
        }
        // A sum would overflow: the `Acc`s from here on (below).
        accs.mean_to_full();
    }
    let (seen, values, comps) = match &mut accs.steps {
        Steps::Full(acc) => {
            // A series on consecutive steps (the common case) walks its steps' accumulators
            // alongside its points; others find their steps.
            let consecutive = span.1 - span.0 + 1 == points.len();
            macro_rules! each {
                ($op:expr) => {{
                    if consecutive {
                        for (a, p) in acc[span.0..=span.1].iter_mut().zip(points) {
                            a.add($op, p.f);
                        }
                    } else {
                        let mut steps = ctx.walker_from(first);
                        for p in points {
                            acc[steps.index(p.t) - base].add($op, p.f);
                        }
                    }
                }};
            }
            match op {
                AggregateOp::Avg => each!(AggregateOp::Avg),
                AggregateOp::Stddev => each!(AggregateOp::Stddev),
                AggregateOp::Stdvar => each!(AggregateOp::Stdvar),
                _ => unreachable!("a compact aggregation"),
            }
            return;
        }
        Steps::Compact { seen, values, comps } => (seen, values, comps),
        Steps::Mean { .. } => unreachable!("folded or turned into accumulators above"),
    };
    // A step's new (value, compensation) from its old one, the point's value and whether the
    // step was set: the first sample sets it, the others combine.
    let accs = Compact { seen, values, comps, base };
    match op {
        AggregateOp::Sum => accs.fold(span, points, ctx, |v, c, f, set| {
            let next = kahan_inc(f, v, c);
            if set {
                next
            } else {
                (f, 0.0)
            }
        }),
        AggregateOp::Count => accs.fold(span, points, ctx, |v, c, _, set| (if set { v + 1.0 } else { 1.0 }, c)),
        AggregateOp::Group => accs.fold(span, points, ctx, |_, c, _, _| (1.0, c)),
        AggregateOp::Min => {
            accs.fold(span, points, ctx, |v, c, f, set| (if !set || v > f || v.is_nan() { f } else { v }, c))
        }
        AggregateOp::Max => {
            accs.fold(span, points, ctx, |v, c, f, set| (if !set || v < f || v.is_nan() { f } else { v }, c))
        }
        _ => unreachable!("not an accumulating aggregation"),
    }
}

/// A group's compact accumulators, borrowed for one series' fold.
struct Compact<'a> {
    seen: &'a mut [bool],
    values: &'a mut [f64],
    comps: &'a mut [f64],
    base: usize,
}

impl Compact<'_> {
    /// Folds points into the accumulators by `update` (old value, old compensation, the
    /// point's value, whether the step was set). A series on consecutive steps (present
    /// throughout the range: the common case) is a straight walk over its steps' slices, which
    /// the compiler vectorizes (`update` choosing on `set` by a select, not a branch), with
    /// AVX2 where the CPU has it; other series find their steps by walking (points are in step
    /// order) rather than by dividing. `from` and `to` are the points' first and last steps
    /// among the kept ones (from `base`), as `fold` made the accumulators span them.
    #[inline(always)]
    fn fold(
        self,
        (from, to): (usize, usize),
        points: &[Point],
        ctx: &Ctx,
        update: impl Fn(f64, f64, f64, bool) -> (f64, f64),
    ) {
        if to - from + 1 == points.len() {
            let (seen, values, comps) =
                (&mut self.seen[from..=to], &mut self.values[from..=to], &mut self.comps[from..=to]);
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2, as just checked.
                unsafe { fold_steps_avx2(seen, values, comps, points, update) };
                return;
            }
            fold_steps(seen, values, comps, points, update);
        } else {
            let mut steps = ctx.walker_from(from + self.base);
            for p in points {
                let i = steps.index(p.t) - self.base;
                (self.values[i], self.comps[i]) = update(self.values[i], self.comps[i], p.f, self.seen[i]);
                self.seen[i] = true;
            }
        }
    }
}

/// A group's `Steps::Mean`, borrowed for one series' fold.
struct Mean<'a> {
    seen: &'a mut [bool],
    values: &'a mut [f64],
    comps: &'a mut [f64],
    counts: &'a mut [f64],
}

impl Mean<'_> {
    /// Adds the points into the steps' compensated sums and counts, as `Acc::add` does while
    /// the sums stay finite; false, with nothing added, if one would overflow (the caller then
    /// folds the series into `Acc`s). A series on consecutive steps is a straight walk (two:
    /// the check, then the sums), vectorized as `Compact::fold` is.
    #[inline(always)]
    fn fold(self, (from, to): (usize, usize), points: &[Point], ctx: &Ctx, base: usize) -> bool {
        // `kahan_inc`'s sum, as it will compute it, for a step already set.
        let overflows = |seen: bool, value: f64, f: f64| seen & (value + f).is_infinite();
        if to - from + 1 == points.len() {
            let (seen, values, comps, counts) = (
                &mut self.seen[from..=to],
                &mut self.values[from..=to],
                &mut self.comps[from..=to],
                &mut self.counts[from..=to],
            );
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2, as just checked.
                return unsafe { mean_steps_avx2(seen, values, comps, counts, points) };
            }
            return mean_steps(seen, values, comps, counts, points);
        }
        // Walked twice (points are in step order): the check, then the sums.
        let mut steps = ctx.walker_from(from + base);
        if points.iter().any(|p| {
            let i = steps.index(p.t) - base;
            overflows(self.seen[i], self.values[i], p.f)
        }) {
            return false;
        }
        let mut steps = ctx.walker_from(from + base);
        for p in points {
            let i = steps.index(p.t) - base;
            (self.values[i], self.comps[i], self.counts[i]) =
                mean_add(self.seen[i], self.values[i], self.comps[i], self.counts[i], p.f);
            self.seen[i] = true;
        }
        true
    }
}

/// A step's (sum, compensation, count) after adding `f`, as `Acc::add` leaves a mean that stays
/// a sum: the first value sets the sum (no compensation), the others add to it.
#[inline(always)]
fn mean_add(seen: bool, value: f64, comp: f64, count: f64, f: f64) -> (f64, f64, f64) {
    let (v, c) = kahan_inc(f, value, comp);
    if seen {
        (v, c, count + 1.0)
    } else {
        (f, 0.0, 1.0)
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn mean_steps_avx2(
    seen: &mut [bool],
    values: &mut [f64],
    comps: &mut [f64],
    counts: &mut [f64],
    points: &[Point],
) -> bool {
    mean_steps(seen, values, comps, counts, points)
}

/// `Mean::fold` of one point per step into steps' accumulators of the same length.
#[inline(always)]
fn mean_steps(seen: &mut [bool], values: &mut [f64], comps: &mut [f64], counts: &mut [f64], points: &[Point]) -> bool {
    let n = points.len();
    let (seen, values, comps, counts) = (&mut seen[..n], &mut values[..n], &mut comps[..n], &mut counts[..n]);
    // Checked without stopping at the first (a loop that may stop does not vectorize).
    let overflow = (0..n).fold(false, |o, k| o | (seen[k] & (values[k] + points[k].f).is_infinite()));
    if overflow {
        return false;
    }
    for k in 0..n {
        (values[k], comps[k], counts[k]) = mean_add(seen[k], values[k], comps[k], counts[k], points[k].f);
        seen[k] = true;
    }
    true
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn fold_steps_avx2(
    seen: &mut [bool],
    values: &mut [f64],
    comps: &mut [f64],
    points: &[Point],
    update: impl Fn(f64, f64, f64, bool) -> (f64, f64),
) {
    fold_steps(seen, values, comps, points, update)
}

/// Folds one point per step into steps' accumulators of the same length.
#[inline(always)]
fn fold_steps(
    seen: &mut [bool],
    values: &mut [f64],
    comps: &mut [f64],
    points: &[Point],
    update: impl Fn(f64, f64, f64, bool) -> (f64, f64),
) {
    let n = points.len();
    let (seen, values, comps) = (&mut seen[..n], &mut values[..n], &mut comps[..n]);
    for k in 0..n {
        (values[k], comps[k]) = update(values[k], comps[k], points[k].f, seen[k]);
        seen[k] = true;
    }
}

/// Assigns series to groups by their grouping labels, as they arrive. A member's group is found
/// by hashing the labels it keeps where they are and comparing them with the groups' under
/// that hash: a group's label set is built once, for its first member (building one for every
/// member and hashing it whole took a third of an instant aggregation's consumer thread).
pub(crate) struct Grouper {
    /// The labels kept (`by`), or dropped with the metric name (`without`).
    names: Vec<String>,
    without: bool,
    groups: Vec<Labels>,
    /// The first group with each hash, and the next group with the same hash after each group
    /// (`NO_GROUP`: none).
    first_with_hash: strata_tsdb::hash::U64Map<u64, usize>,
    next_with_hash: Vec<usize>,
    /// A group keeps `__name__` only when grouping by it; then the name is dropped at the end
    /// if any member's was to be (delayed name removal).
    drops_name: Vec<bool>,
}

const NO_GROUP: usize = usize::MAX;

impl Grouper {
    pub(crate) fn new(grouping: &[String], without_: bool) -> Grouper {
        let mut names = grouping.to_vec();
        if without_ {
            names.push(METRIC_NAME.to_string());
        }
        Grouper {
            names,
            without: without_,
            groups: Vec::new(),
            first_with_hash: Default::default(),
            next_with_hash: Vec::new(),
            drops_name: Vec::new(),
        }
    }

    /// The labels of `labels` its group keeps (`group_labels`), borrowed.
    fn kept<'l>(&'l self, labels: &'l Labels) -> impl Iterator<Item = &'l Label> + Clone + 'l {
        labels.iter().filter(move |l| self.names.iter().any(|n| **n == *l.name) != self.without)
    }

    /// The group whose labels `labels` keeps, if there is one yet, and the kept labels' hash.
    fn find(&self, labels: &Labels) -> (Option<usize>, u64) {
        let kept = self.kept(labels);
        let hash = strata_model::labels::stable_hash_pairs(kept.clone().map(|l| (&*l.name, &*l.value)));
        let mut g = self.first_with_hash.get(&hash).copied().unwrap_or(NO_GROUP);
        while g != NO_GROUP {
            if self.groups[g].iter().eq(kept.clone()) {
                return (Some(g), hash);
            }
            g = self.next_with_hash[g];
        }
        (None, hash)
    }

    /// The group of `labels` (a label set of the aggregation's input), made if new; whether
    /// it was new.
    pub(crate) fn assign_labels(&mut self, labels: &Labels) -> (usize, bool) {
        let (found, hash) = self.find(labels);
        if let Some(g) = found {
            return (g, false);
        }
        let g = self.groups.len();
        self.groups.push(Labels::from_sorted_unchecked(self.kept(labels).cloned().collect()));
        self.drops_name.push(false);
        let before = self.first_with_hash.insert(hash, g).unwrap_or(NO_GROUP);
        self.next_with_hash.push(before);
        debug_assert_eq!(self.groups[g], group_labels(labels, &self.grouping(), self.without));
        (g, true)
    }

    fn assign(&mut self, s: &Series) -> usize {
        let (g, _) = self.assign_labels(&s.labels);
        self.drops_name[g] |= s.drop_name;
        g
    }

    /// The group with exactly these labels (a group's own label set keeps all of them).
    fn group_with(&self, group: &Labels) -> Option<usize> {
        self.find(group).0
    }

    /// The grouping names as written (without the metric name `without` adds).
    fn grouping(&self) -> Vec<String> {
        let n = self.names.len() - self.without as usize;
        self.names[..n].to_vec()
    }

    pub(crate) fn into_groups(self) -> Vec<Labels> {
        self.groups
    }
}

pub(super) fn is_accumulating(op: AggregateOp) -> bool {
    matches!(
        op,
        AggregateOp::Sum
            | AggregateOp::Avg
            | AggregateOp::Count
            | AggregateOp::Min
            | AggregateOp::Max
            | AggregateOp::Group
            | AggregateOp::Stddev
            | AggregateOp::Stdvar
    )
}

/// The accumulators of an accumulating aggregation's groups, or of those dealt to one of its
/// parts (`GroupSink`), by group number.
#[derive(Default)]
struct Part {
    /// A group's accumulation, once a member came.
    accs: Vec<Option<GroupAcc>>,
    /// Histogram sums of each group, made only for groups that meet a histogram.
    haccs: Vec<Option<Vec<HistAcc>>>,
    /// Whether a member's name was to be dropped (delayed name removal).
    drops: Vec<bool>,
    /// The input position of each group's first member: groups are output in that order.
    first: Vec<usize>,
    notes: HistNotes,
}

impl Part {
    /// Folds series `s`, the `index`-th of the input, into group `g`'s accumulators.
    fn add(
        &mut self,
        ev: &Evaluator,
        a: &Aggregate,
        ctx: &Ctx,
        g: usize,
        index: usize,
        s: Series,
    ) -> Result<(), EvalError> {
        if g >= self.accs.len() {
            self.accs.resize_with(g + 1, || None);
            self.haccs.resize_with(g + 1, || None);
            self.drops.resize(g + 1, false);
            self.first.resize(g + 1, usize::MAX);
        }
        self.drops[g] |= s.drop_name;
        let Series { points, hists, .. } = s;
        let acc = match &mut self.accs[g] {
            Some(acc) => acc,
            empty => {
                ev.take(ctx.n, "aggregation")?;
                self.first[g] = index;
                if hists.is_empty() {
                    *empty = Some(GroupAcc::Single(points));
                    return Ok(());
                }
                empty.insert(GroupAcc::Folded(StepAccs::new(a.op)))
            }
        };
        fold(a.op, acc.folded(a.op, ctx), &points, ctx);
        point_buffers::POOL.give(points);
        if !hists.is_empty() {
            match a.op {
                AggregateOp::Sum | AggregateOp::Avg => {
                    let h = self.haccs[g].get_or_insert_with(|| vec![HistAcc::default(); ctx.n]);
                    let mut steps = ctx.walker();
                    for p in &hists {
                        h[steps.index(p.t)].add(a.op, &p.h, &mut self.notes);
                    }
                }
                // A histogram is a sample like any other to count.
                AggregateOp::Count | AggregateOp::Group => {
                    let pts: Vec<Point> = hists.iter().map(|p| Point { t: p.t, f: 0.0 }).collect();
                    fold(a.op, acc.folded(a.op, ctx), &pts, ctx);
                }
                op => ev.info(a.expr.start, format!("ignored histogram in {} aggregation", op.name())),
            }
        }
        Ok(())
    }
}

/// An accumulating aggregation fed on the selection's workers, a part per worker.
struct Parts<'e, 'a> {
    ev: &'e Evaluator<'a>,
    a: &'e Aggregate,
    ctx: &'e Ctx,
    groups: std::sync::OnceLock<Vec<Labels>>,
    parts: std::sync::OnceLock<Vec<parking_lot::Mutex<Part>>>,
}

impl GroupSink for Parts<'_, '_> {
    fn grouper(&self) -> Grouper {
        Grouper::new(&self.a.grouping, self.a.without)
    }

    fn start(&self, groups: Vec<Labels>, parts: usize) {
        let fresh = self.groups.set(groups).is_ok();
        let fresh = fresh && self.parts.set((0..parts).map(|_| Default::default()).collect()).is_ok();
        assert!(fresh, "a grouped stream started twice");
    }

    fn put(&self, part: usize, group: usize, index: usize, s: Series) -> Result<(), EvalError> {
        let parts = self.parts.get().expect("started before the first series");
        // Each part is fed from one thread at a time: the lock is never waited for.
        parts[part].lock().add(self.ev, self.a, self.ctx, group, index, s)
    }
}

pub(super) fn eval(ev: &Evaluator, a: &Aggregate, ctx: &Ctx) -> Result<Val, EvalError> {
    let mut grouper = Grouper::new(&a.grouping, a.without);
    if is_accumulating(a.op) {
        // Streams: each input series is folded into its group's per-step accumulators and
        // dropped, so memory is groups × steps, not input series × steps. A selection whose
        // results keep its labels is folded on its workers, each group by one of them.
        let on_workers = Parts { ev, a, ctx, groups: Default::default(), parts: Default::default() };
        let (groups, parts) = if ev.stream_grouped(&a.expr, ctx, &on_workers)? {
            let parts = on_workers.parts.into_inner().unwrap_or_default();
            (on_workers.groups.into_inner().unwrap_or_default(), parts.into_iter().map(|p| p.into_inner()).collect())
        } else {
            let mut part = Part::default();
            let mut index = 0;
            ev.stream(&a.expr, ctx, &mut |s: Series| {
                let g = grouper.assign(&s);
                index += 1;
                part.add(ev, a, ctx, g, index, s)
            })?;
            (std::mem::take(&mut grouper.groups), vec![part])
        };
        return accumulated(ev, a, ctx, groups, parts);
    }

    let mut input = ev.eval_vector(&a.expr, ctx)?;
    let input_held: usize = input.iter().map(Series::len).sum();
    let selects_histograms = matches!(a.op, AggregateOp::LimitK | AggregateOp::LimitRatio | AggregateOp::CountValues);
    if !selects_histograms && input.iter().any(|s| !s.hists.is_empty()) {
        // Only the limits select histograms; the others order or count float values.
        ev.info(a.expr.start, format!("ignored histogram in {} aggregation", a.op.name()));
        input.iter_mut().for_each(|s| s.hists.clear());
    }
    let group_of: Vec<usize> = input.iter().map(|s| grouper.assign(s)).collect();
    let groups = grouper.groups.clone();
    let param = a.param.as_ref().expect("the parser requires a parameter");
    let mut out = match a.op {
        AggregateOp::TopK | AggregateOp::BottomK | AggregateOp::LimitK => {
            let k = ev.eval_scalar(param, ctx)?;
            if k.iter().any(|k| k.is_nan()) {
                return Err(exec("Parameter value is NaN"));
            }
            select_k(a.op, input, &group_of, &k, ctx)?
        }
        AggregateOp::LimitRatio => {
            let r = ev.eval_scalar(param, ctx)?;
            if r.iter().any(|r| r.is_nan()) {
                return Err(exec("Ratio value is NaN"));
            }
            limit_ratio(ev, input, &r, param.start, ctx)?
        }
        AggregateOp::Quantile => {
            let q = ev.eval_scalar(param, ctx)?;
            let out = quantiles(ev, &input, &group_of, groups, &q, param.start, ctx);
            // The members' points, for the next query's series (as accumulating groups give
            // theirs back member by member).
            for s in input.drain(..) {
                point_buffers::POOL.give(s.points);
            }
            out
        }
        AggregateOp::CountValues => {
            if let ExprKind::String(Err(bytes)) = &param.unparen().kind {
                return Err(exec(format!("invalid label name {}", go_quote_bytes(bytes))));
            }
            let label = ev.eval_string(param, ctx)?;
            if label.is_empty() {
                return Err(exec("invalid label name \"\""));
            }
            count_values(&input, &group_of, groups, &label, ctx)
        }
        _ => unreachable!("accumulating aggregations stream above"),
    };
    if a.op == AggregateOp::Quantile {
        for s in &mut out {
            if let Some(g) = grouper.group_with(&s.labels) {
                s.drop_name = grouper.drops_name[g] && s.labels.get(METRIC_NAME).is_some();
            }
        }
    }
    ev.release(input_held);
    ev.take(out.iter().map(Series::len).sum(), "aggregation")?;
    Ok(Val::Vector(out))
}

/// The result of an accumulating aggregation from the accumulators of its parts (each group
/// in one part), groups in the order their first members came.
fn accumulated(
    ev: &Evaluator,
    a: &Aggregate,
    ctx: &Ctx,
    groups: Vec<Labels>,
    parts: Vec<Part>,
) -> Result<Val, EvalError> {
    let sums_histograms = matches!(a.op, AggregateOp::Sum | AggregateOp::Avg);
    let mut notes = HistNotes::default();
    // (first member, labels, accumulation, histogram sums, drops the name)
    let mut found = Vec::with_capacity(groups.len());
    let mut groups: Vec<Option<Labels>> = groups.into_iter().map(Some).collect();
    for part in parts {
        notes.collision |= part.notes.collision;
        notes.reconciled |= part.notes.reconciled;
        notes.incompatible |= part.notes.incompatible;
        let members = part.accs.into_iter().zip(part.haccs).zip(part.drops).zip(part.first).enumerate();
        for (g, (((acc, hacc), drops), first)) in members {
            if let Some(acc) = acc {
                let labels = groups[g].take().expect("a group is dealt to one part");
                found.push((first, labels, acc, hacc, drops));
            }
        }
    }
    found.sort_unstable_by_key(|f| f.0);
    if notes.collision {
        ev.warn(a.expr.start, "conflicting counter resets during histogram aggregation");
    }
    if notes.reconciled {
        ev.info(a.expr.start, "mismatched custom buckets were reconciled during aggregation");
    }
    if notes.incompatible {
        ev.warn(
            a.expr.start,
            "vector contains a mix of histograms with exponential and custom buckets schemas for metric name \"\"",
        );
    }
    let mut out = Vec::with_capacity(found.len());
    let mut mixed = false;
    for (_, labels, mut acc, hacc, drops) in found {
        let mut points: Vec<Point> = Vec::new();
        let mut hists: Vec<HPoint> = Vec::new();
        match hacc.as_ref().filter(|_| sums_histograms) {
            // Floats only (a group that met a histogram was folded).
            None => points = acc.into_points(a.op, ctx),
            Some(hacc) => {
                let acc = acc.folded(a.op, ctx);
                for (i, h) in hacc.iter().enumerate() {
                    match (acc.result(a.op, i), Some(h).filter(|h| h.count > 0.0)) {
                        (Some(f), None) => points.push(Point { t: ctx.ts(i), f }),
                        (None, Some(h)) => {
                            if let Some(r) = h.result() {
                                hists.push(HPoint { t: ctx.ts(i), h: Arc::new(r) });
                            }
                        }
                        (Some(_), Some(_)) => mixed = true,
                        (None, None) => {}
                    }
                }
            }
        }
        ev.release(ctx.n);
        if !points.is_empty() || !hists.is_empty() {
            ev.take(points.len() + hists.len(), "aggregation")?;
            let drop_name = drops && labels.get(METRIC_NAME).is_some();
            out.push(Series { labels, points, hists, drop_name });
        }
    }
    if mixed {
        ev.warn(a.expr.start, "encountered a mix of histograms and floats for aggregation");
    }
    Ok(Val::Vector(out))
}

/// Up to this k, topk/bottomk keep the best k in a sorted list while reading the candidates;
/// above it they partially sort them all.
const SMALL_K: usize = 8;

/// NaN sorts below every number for topk and above for bottomk, as in Prometheus.
fn better(op: AggregateOp, a: f64, b: f64) -> bool {
    match op {
        AggregateOp::TopK => (a > b) || (b.is_nan() && !a.is_nan()),
        _ => (a < b) || (b.is_nan() && !a.is_nan()),
    }
}

/// topk, bottomk, limitk: per step and group, the k series chosen; the series keep their
/// labels, holding only the points at which they were chosen. An instant result lists each
/// group's choice in order (best first).
fn select_k(
    op: AggregateOp,
    input: Vec<Series>,
    group_of: &[usize],
    k: &[f64],
    ctx: &Ctx,
) -> Result<Vec<Series>, EvalError> {
    assert!(input.len() <= u32::MAX as usize && ctx.n <= u32::MAX as usize);
    let ks: Vec<usize> = k.iter().take(ctx.n).map(|&kf| k_at(kf)).collect();
    if ks.iter().all(|&kk| kk <= SMALL_K) && input.iter().all(|s| s.hists.is_empty()) {
        return Ok(select_small_k(op, input, group_of, &ks, ctx));
    }
    let n_groups = group_of.iter().copied().max().map_or(0, |m| m + 1);
    // topk and bottomk rank by value, ties in series order (a total order, so choosing the
    // best k without sorting everyone gives what a stable sort would); limitk keeps series
    // order. A candidate is (value, series, point); points are numbered floats first, then
    // histograms (only limitk sees histograms, valued 0 here as it does not rank).
    let rank = |a: &(f64, u32, u32), b: &(f64, u32, u32)| rank_of(op, *a, *b);
    let choose = |members: &mut Vec<(f64, u32, u32)>, best: &mut Vec<(f64, u32, u32)>, kk: usize| {
        if op == AggregateOp::LimitK {
            // The first k in series order (candidates arrive in no particular order).
            if members.len() > kk {
                members.select_nth_unstable_by_key(kk - 1, |c| c.1);
                members.truncate(kk);
            }
            members.sort_unstable_by_key(|c| c.1);
        } else if kk <= SMALL_K && members.len() > kk {
            // A few of many: one comparison with the k-th best so far for most candidates.
            best.clear();
            for &c in members.iter() {
                if best.len() == kk {
                    if rank(&c, &best[kk - 1]) != std::cmp::Ordering::Less {
                        continue;
                    }
                    best.pop();
                }
                let at = best.partition_point(|b| rank(b, &c) == std::cmp::Ordering::Less);
                best.insert(at, c);
            }
            std::mem::swap(members, best);
        } else if members.len() > kk {
            members.select_nth_unstable_by(kk - 1, rank);
            members.truncate(kk);
            members.sort_unstable_by(rank);
        } else {
            members.sort_unstable_by(rank);
        }
    };
    let mut keep_at: Vec<Vec<bool>> = input.iter().map(|s| vec![false; s.len()]).collect();
    // (group, rank, series) for instant output.
    let mut order: Vec<(usize, usize, usize)> = Vec::new();
    // Reused across steps: each group's members at the step, and the groups that have any.
    let mut by_group: Vec<Vec<(f64, u32, u32)>> = vec![Vec::new(); n_groups];
    let mut present: Vec<usize> = Vec::new();
    let mut best = Vec::new();
    // Each series' next float and histogram: steps are visited in order and every series'
    // points are in step order, so the step's candidates are read off these cursors, and the
    // few points each series has near its cursor stay in cache from step to step. Only series
    // between their first and last point are visited (`active`, joined at their first step),
    // so many short-lived series cost their points, not the whole range each.
    let mut cursors = vec![(0u32, 0u32); input.len()];
    let first_step = |s: &Series| {
        let t = match (s.points.first(), s.hists.first()) {
            (Some(p), Some(h)) => p.t.min(h.t),
            (Some(p), None) => p.t,
            (None, Some(h)) => h.t,
            (None, None) => return None,
        };
        Some(ctx.index(t))
    };
    let mut joining: Vec<Vec<u32>> = vec![Vec::new(); ctx.n];
    for (si, s) in input.iter().enumerate() {
        if let Some(step) = first_step(s) {
            joining[step].push(si as u32);
        }
    }
    let mut active: Vec<u32> = Vec::new();
    for (step, &kf) in k.iter().enumerate().take(ctx.n) {
        let t = ctx.ts(step);
        if kf.is_nan() {
            return Err(exec("Parameter value is NaN"));
        }
        active.append(&mut joining[step]);
        active.retain(|&si| {
            let (s, (fc, hc)) = (&input[si as usize], &mut cursors[si as usize]);
            let g = group_of[si as usize];
            let mut candidate = |c: (f64, u32, u32)| {
                if by_group[g].is_empty() {
                    present.push(g);
                }
                by_group[g].push(c);
            };
            if let Some(p) = s.points.get(*fc as usize).filter(|p| p.t == t) {
                candidate((p.f, si, *fc));
                *fc += 1;
            } else if s.hists.get(*hc as usize).is_some_and(|p| p.t == t) {
                candidate((0.0, si, (s.points.len() + *hc as usize) as u32));
                *hc += 1;
            }
            // Still has points to come.
            (*fc as usize) < s.points.len() || (*hc as usize) < s.hists.len()
        });
        let kk = k_at(kf);
        if kk == 0 {
            present.drain(..).for_each(|g| by_group[g].clear());
            continue;
        }
        for &g in &present {
            let members = &mut by_group[g];
            choose(members, &mut best, kk);
            for (rank, &(_, si, pi)) in members.iter().enumerate() {
                keep_at[si as usize][pi as usize] = true;
                if ctx.n == 1 {
                    order.push((g, rank, si as usize));
                }
            }
            members.clear();
        }
        present.clear();
    }
    let mut out: Vec<Option<Series>> = input
        .into_iter()
        .zip(keep_at)
        .map(|(mut s, keep)| {
            let mut it = keep.into_iter();
            s.points.retain(|_| it.next().unwrap_or(false));
            s.hists.retain(|_| it.next().unwrap_or(false));
            (!s.is_empty()).then_some(s)
        })
        .collect();
    if ctx.n == 1 {
        // Instant: group by group, best first.
        order.sort_by_key(|&(g, rank, _)| (g, rank));
        return Ok(order.into_iter().filter_map(|(_, _, si)| out[si].take()).collect());
    }
    Ok(out.into_iter().flatten().collect())
}

/// The k a step's parameter asks for (below 1: none; truncated towards zero).
fn k_at(kf: f64) -> usize {
    if kf < 1.0 {
        0
    } else if kf >= usize::MAX as f64 {
        usize::MAX
    } else {
        kf as usize
    }
}

/// The order of two candidates (value, series, point) for topk and bottomk: by value (NaN
/// last), ties by series order.
fn rank_of(op: AggregateOp, (x, a, _): (f64, u32, u32), (y, b, _): (f64, u32, u32)) -> std::cmp::Ordering {
    if better(op, x, y) {
        std::cmp::Ordering::Less
    } else if better(op, y, x) {
        std::cmp::Ordering::Greater
    } else {
        a.cmp(&b)
    }
}

/// `select_k` when k is at most `SMALL_K` at every step and no series holds histograms (the
/// common `topk(5, …)` panel): series by series, each point offered to its step's best k
/// in a table of k slots per step for one group at a time. The table stays in cache and
/// each series is read front to back, where a walk step by step across all series touched
/// a cache line of every series at every step and rebuilt the list of those still active:
/// that walk was a third of `topk(5, rate(…))` over 900 series and 1,440 steps. Chooses
/// what `select_k` does: every step's candidates are ranked by the same total order.
fn select_small_k(op: AggregateOp, input: Vec<Series>, group_of: &[usize], ks: &[usize], ctx: &Ctx) -> Vec<Series> {
    debug_assert!(ks.len() == ctx.n && ks.iter().all(|&k| k <= SMALL_K));
    let width = ks.iter().copied().max().unwrap_or(0);
    if width == 0 {
        return Vec::new();
    }
    // The series group by group (groups in order), in series order within each.
    let mut by_group: Vec<u32> = (0..input.len() as u32).collect();
    by_group.sort_by_key(|&si| group_of[si as usize]);
    // Step i's choice so far: best[i * width..][..lens[i]], best first.
    let mut best = vec![(0.0f64, 0u32, 0u32); ctx.n * width];
    let mut lens = vec![0u8; ctx.n];
    // The steps the group has a choice at: only they are read out and reset after it, so
    // many small groups cost their points, not the steps each.
    let mut touched: Vec<u32> = Vec::new();
    // (series, point) of every choice, group by group, best first at each step.
    let mut chosen: Vec<(u32, u32)> = Vec::new();
    for members in by_group.chunk_by(|&a, &b| group_of[a as usize] == group_of[b as usize]) {
        for &si in members {
            let mut steps = ctx.walker();
            for (pi, p) in input[si as usize].points.iter().enumerate() {
                let i = steps.index(p.t);
                let (kk, len) = (ks[i], lens[i] as usize);
                let slots = &mut best[i * width..i * width + kk];
                let c = (p.f, si, pi as u32);
                if len == 0 && kk > 0 {
                    touched.push(i as u32);
                }
                if op == AggregateOp::LimitK {
                    // The first k in series order, which is the order series come in.
                    if len < kk {
                        slots[len] = c;
                        lens[i] += 1;
                    }
                    continue;
                }
                if len == kk && (kk == 0 || rank_of(op, c, slots[kk - 1]) != std::cmp::Ordering::Less) {
                    continue;
                }
                let kept = len.min(kk - 1);
                let at = slots[..kept].partition_point(|&b| rank_of(op, b, c) == std::cmp::Ordering::Less);
                slots.copy_within(at..kept, at + 1);
                slots[at] = c;
                lens[i] = (kept + 1) as u8;
            }
        }
        for i in touched.drain(..) {
            let i = i as usize;
            chosen.extend(best[i * width..][..lens[i] as usize].iter().map(|&(_, si, pi)| (si, pi)));
            lens[i] = 0;
        }
    }
    let mut input: Vec<Option<Series>> = input.into_iter().map(Some).collect();
    if ctx.n == 1 {
        // Instant: group by group, best first, which is the order chosen in.
        return chosen.iter().filter_map(|&(si, _)| input[si as usize].take()).collect();
    }
    // A range: the series in their order, each with the points it was chosen at.
    chosen.sort_unstable();
    let mut out = Vec::new();
    for run in chosen.chunk_by(|a, b| a.0 == b.0) {
        let mut s = input[run[0].0 as usize].take().expect("each series is taken once");
        s.points = run.iter().map(|&(_, pi)| s.points[pi as usize]).collect();
        out.push(s);
    }
    out
}

/// xxHash64 of `name 0xff value 0xff …`: Prometheus' `labels.Hash()`, which limit_ratio
/// uses to pick series consistently across queries and servers.
fn prometheus_hash(labels: &Labels) -> u64 {
    let mut b = Vec::new();
    for Label { name, value } in labels {
        b.extend_from_slice(name.as_bytes());
        b.push(0xff);
        b.extend_from_slice(value.as_bytes());
        b.push(0xff);
    }
    xxhash_rust::xxh64::xxh64(&b, 0)
}

fn limit_ratio(ev: &Evaluator, input: Vec<Series>, r: &[f64], pos: usize, ctx: &Ctx) -> Result<Vec<Series>, EvalError> {
    let mut out = Vec::new();
    for mut s in input {
        let ratio_of = prometheus_hash(&s.labels) as f64 / u64::MAX as f64;
        let mut err = None;
        let mut chosen = |t: i64| {
            let mut ratio = r[ctx.index(t)];
            if ratio.is_nan() {
                err = Some(exec("Ratio value is NaN"));
                return false;
            }
            if !(-1.0..=1.0).contains(&ratio) {
                let capped = ratio.clamp(-1.0, 1.0);
                ev.warn(
                    pos,
                    format!(
                        "ratio value should be between -1 and 1, got {}, capping to {}",
                        fmt_float(ratio),
                        fmt_float(capped)
                    ),
                );
                ratio = capped;
            }
            (ratio >= 0.0 && ratio_of < ratio) || (ratio < 0.0 && ratio_of >= 1.0 + ratio)
        };
        s.points.retain(|p| chosen(p.t));
        s.hists.retain(|p| chosen(p.t));
        if let Some(e) = err {
            return Err(e);
        }
        if !s.is_empty() {
            out.push(s);
        }
    }
    Ok(out)
}

/// Prometheus' quantile: linear interpolation between the closest ranks.
pub(crate) fn quantile(q: f64, values: &mut [f64]) -> f64 {
    if values.is_empty() || q.is_nan() {
        return f64::NAN;
    }
    if q < 0.0 {
        return f64::NEG_INFINITY;
    }
    if q > 1.0 {
        return f64::INFINITY;
    }
    let n = values.len() as f64;
    let rank = q * (n - 1.0);
    let lower = rank.floor().max(0.0) as usize;
    let upper = (lower + 1).min(values.len() - 1);
    let weight = rank - rank.floor();
    // Only the two ranks are needed, not a whole sort (a 30-day dashboard takes a quantile
    // over every series at each of 720 steps): the lower by selection, the upper as the least
    // of what selection left above it. Both compare integer keys (`order_key`), held in the
    // values' own slots meanwhile (moved, never computed with, so their bits stay as written),
    // and the values are put back after: with a comparator that checks for NaN at each
    // comparison, 720 steps of 1000 values took 3.7 times as long.
    for v in values.iter_mut() {
        *v = f64::from_bits(order_key(*v));
    }
    let (_, low, above) = values.select_nth_unstable_by_key(lower, |v| v.to_bits());
    let low = low.to_bits();
    let high = if upper == lower { low } else { above.iter().map(|v| v.to_bits()).min().expect("upper is in range") };
    // The values again (in the order selection left them): `mad_over_time` reads them after.
    for v in values.iter_mut() {
        *v = from_order_key(v.to_bits());
    }
    let (low, high) = (from_order_key(low), from_order_key(high));
    low * (1.0 - weight) + high * weight
}

/// `v`'s place in the order Prometheus sorts values in before taking a quantile, as an
/// integer: NaN lowest (every NaN alike: Prometheus' sort puts them first), then the numbers
/// ascending, with -0 just below +0 (the float order counts them equal, so either order is one
/// it allows). For numbers, the bits of a negative one inverted (larger magnitudes lower) and
/// those of a positive one with the top bit set: an order-preserving bijection onto 1..2^64.
#[inline(always)]
fn order_key(v: f64) -> u64 {
    if v.is_nan() {
        return 0;
    }
    let bits = v.to_bits();
    if bits >> 63 == 1 {
        !bits
    } else {
        bits | 1 << 63
    }
}

/// The value `order_key` gave `key` for (a NaN for 0).
#[inline(always)]
fn from_order_key(key: u64) -> f64 {
    match key {
        0 => f64::NAN,
        k if k >> 63 == 1 => f64::from_bits(k & !(1 << 63)),
        k => f64::from_bits(!k),
    }
}

fn quantiles(
    ev: &Evaluator,
    input: &[Series],
    group_of: &[usize],
    groups: Vec<Labels>,
    q: &[f64],
    pos: usize,
    ctx: &Ctx,
) -> Vec<Series> {
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); groups.len()];
    for (i, &g) in group_of.iter().enumerate() {
        members[g].push(i);
    }
    let threads = ev.threads();
    let mut warned = false;
    let mut out = Vec::new();
    for (labels, members) in groups.into_iter().zip(members) {
        if members.is_empty() {
            continue;
        }
        let f = group_quantiles(q, input, &members, ctx, threads);
        if !warned {
            if let Some(i) = (0..ctx.n).find(|&i| f[i].is_some() && !(0.0..=1.0).contains(&q[i])) {
                ev.warn(pos, format!("quantile value should be between 0 and 1, got {}", fmt_float(q[i])));
                warned = true;
            }
        }
        let points: Vec<Point> = (0..ctx.n).filter_map(|i| Some(Point { t: ctx.ts(i), f: f[i]? })).collect();
        if !points.is_empty() {
            out.push(Series::new(labels, points));
        }
    }
    out
}

thread_local! {
    /// `group_quantiles`' buffer of laid-out values, kept between runs on this thread.
    static QUANTILE_VALUES: std::cell::Cell<Vec<f64>> = const { std::cell::Cell::new(Vec::new()) };
}

/// The largest values buffer a thread keeps between quantiles (8 MiB: a million values, a
/// thousand series over a thousand steps on one thread).
const QUANTILE_VALUES_KEPT_MAX: usize = 1 << 20;

/// Lets go of this thread's kept quantile buffer (`crate::release_idle_memory`).
pub(crate) fn release_thread_buffers() {
    QUANTILE_VALUES.with(|v| drop(v.take()));
}

/// Values of one group at or above which its steps' quantiles are taken by several threads.
const PARALLEL_QUANTILE_VALUES: usize = 64 * 1024;

/// Each step's quantile `q[i]` of the values the `members` of a group hold there (`None` where
/// none does). The steps are cut into runs of about equal length, one per thread (one run for
/// few values); a run lays its steps' values out step after step in one buffer (counted, then
/// placed, each step's in member order), from each member's points in the run (found by a
/// binary search), and takes their quantiles while they are in the cache. Laid out for the
/// whole range on one thread before the quantiles, a month-long dashboard's quantile over a
/// thousand series spent a fifth of its CPU there, after the read and before any quantile.
///
/// The values' buffer is kept on the thread for the next run: freshly allocated, its pages were
/// new to the process each time (the allocator returns freed pages to the system after 10 ms),
/// and faulting them in took a quarter of such a quantile's CPU.
fn group_quantiles(q: &[f64], input: &[Series], members: &[usize], ctx: &Ctx, threads: usize) -> Vec<Option<f64>> {
    let total: usize = members.iter().map(|&m| input[m].points.len()).sum();
    let runs = if threads <= 1 || total < PARALLEL_QUANTILE_VALUES { 1 } else { threads.min(ctx.n) };
    let mut f = vec![None; ctx.n];
    let run = |first: usize, f: &mut [Option<f64>]| {
        let n = f.len();
        if n == 0 {
            return;
        }
        let (from, to) = (ctx.ts(first), ctx.ts(first + n - 1));
        let parts: Vec<&[Point]> = members
            .iter()
            .map(|&m| {
                let points = &input[m].points[..];
                let (a, b) = (points.partition_point(|p| p.t < from), points.partition_point(|p| p.t <= to));
                &points[a..b]
            })
            .collect();
        let mut starts = vec![0usize; n + 1];
        for points in &parts {
            ctx.each_step(points, |i, _| starts[i - first + 1] += 1);
        }
        for k in 0..n {
            starts[k + 1] += starts[k];
        }
        let mut next = starts[..n].to_vec();
        let mut values = QUANTILE_VALUES.with(|v| v.take());
        values.clear();
        values.resize(starts[n], 0.0);
        for points in &parts {
            ctx.each_step(points, |i, p| {
                values[next[i - first]] = p.f;
                next[i - first] += 1;
            });
        }
        for (k, f) in f.iter_mut().enumerate() {
            let (a, b) = (starts[k], starts[k + 1]);
            if b > a {
                *f = Some(quantile(q[first + k], &mut values[a..b]));
            }
        }
        if values.capacity() <= QUANTILE_VALUES_KEPT_MAX {
            QUANTILE_VALUES.with(|v| v.set(values));
        }
    };
    if runs <= 1 {
        run(0, &mut f);
        return f;
    }
    let per_run = ctx.n.div_ceil(runs);
    strata_tsdb::workers::scope(|scope| {
        for (r, part) in f.chunks_mut(per_run).enumerate() {
            let run = &run;
            scope.spawn(move || run(r * per_run, part));
        }
    });
    f
}

fn count_values(input: &[Series], group_of: &[usize], groups: Vec<Labels>, label: &str, ctx: &Ctx) -> Vec<Series> {
    let mut index: HashMap<Labels, usize> = HashMap::new();
    let mut out: Vec<Series> = Vec::new();
    let mut counts: Vec<Vec<f64>> = Vec::new();
    for (s, &g) in input.iter().zip(group_of) {
        // Histograms count by their text form, as Prometheus prints them.
        let values =
            s.points.iter().map(|p| (p.t, fmt_float(p.f))).chain(s.hists.iter().map(|p| (p.t, p.h.to_string())));
        for (t, value) in values {
            let mut pairs: Vec<(String, String)> = groups[g]
                .iter()
                .filter(|l| &*l.name != label)
                .map(|l| (l.name.to_string(), l.value.to_string()))
                .collect();
            pairs.push((label.to_string(), value));
            let labels = Labels::from_pairs(pairs);
            let i = *index.entry(labels.clone()).or_insert_with(|| {
                out.push(Series::new(labels, Vec::new()));
                counts.push(vec![0.0; ctx.n]);
                out.len() - 1
            });
            counts[i][ctx.index(t)] += 1.0;
        }
    }
    for (s, c) in out.iter_mut().zip(counts) {
        s.points = c.iter().enumerate().filter(|(_, &v)| v > 0.0).map(|(i, &v)| Point { t: ctx.ts(i), f: v }).collect();
    }
    out
}

/// Go's `strconv.FormatFloat(f, 'f', -1, 64)`, how Prometheus prints values into labels.
pub(crate) fn fmt_float(f: f64) -> String {
    if f.is_nan() {
        "NaN".into()
    } else if f == f64::INFINITY {
        "+Inf".into()
    } else if f == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        format!("{f}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The grouper numbers groups as building each member's group label set and looking it up
    /// would, for `by` and `without` (with and without the metric name), and finds a group by
    /// its own labels.
    #[test]
    fn grouper_numbers_groups_as_their_label_sets_would() {
        let mut sets = Vec::new();
        for i in 0..200usize {
            let name = ["a_total", "b_total", "c"][i % 3];
            let mut pairs = vec![("__name__", name.to_string()), ("job", format!("j{}", i % 2))];
            if i % 5 != 0 {
                pairs.push(("instance", format!("h{}", i % 7)));
            }
            if i % 4 == 0 {
                pairs.push(("le", format!("{}", i % 3)));
            }
            sets.push(Labels::from_pairs(pairs));
        }
        let groupings: [(&[&str], bool); 6] = [
            (&[], false),
            (&["instance"], false),
            (&["job", "instance", "missing"], false),
            (&["__name__", "le"], false),
            (&["instance"], true),
            (&[], true),
        ];
        for (names, without_) in groupings {
            let grouping: Vec<String> = names.iter().map(|n| n.to_string()).collect();
            let mut grouper = Grouper::new(&grouping, without_);
            let mut numbers: HashMap<Labels, usize> = HashMap::new();
            for l in &sets {
                let want = group_labels(l, &grouping, without_);
                let fresh = !numbers.contains_key(&want);
                let n = numbers.len();
                let want_number = *numbers.entry(want.clone()).or_insert(n);
                assert_eq!(grouper.assign_labels(l), (want_number, fresh), "{l} by {names:?} without {without_}");
                assert_eq!(grouper.group_with(&want), Some(want_number));
            }
            let groups = grouper.into_groups();
            assert_eq!(groups.len(), numbers.len());
            for (g, n) in numbers {
                assert_eq!(groups[n], g);
            }
        }
    }

    #[test]
    fn quantile_interpolates() {
        assert_eq!(quantile(0.5, &mut [1.0, 2.0, 3.0, 4.0]), 2.5);
        assert_eq!(quantile(0.0, &mut [3.0, 1.0]), 1.0);
        assert!(quantile(0.5, &mut []).is_nan());
        assert_eq!(quantile(-1.0, &mut [1.0]), f64::NEG_INFINITY);
    }

    #[test]
    fn order_keys_rank_as_prometheus_sorts_and_give_each_number_back() {
        let ascending = [
            f64::NAN,
            f64::NEG_INFINITY,
            -f64::MAX,
            -1.5,
            -f64::MIN_POSITIVE,
            -0.0,
            0.0,
            f64::MIN_POSITIVE,
            2.0,
            f64::MAX,
            f64::INFINITY,
        ];
        for pair in ascending.windows(2) {
            assert!(order_key(pair[0]) < order_key(pair[1]), "{} before {}", pair[0], pair[1]);
        }
        for v in &ascending[1..] {
            assert_eq!(from_order_key(order_key(*v)).to_bits(), v.to_bits(), "{v}");
        }
        assert_eq!(order_key(-f64::NAN), 0);
        assert!(from_order_key(0).is_nan());
    }

    /// A group's steps' quantiles, by one thread or several (runs of steps cut anywhere, steps
    /// and members without values among them), are each step's quantile of its members'
    /// values.
    #[test]
    fn group_quantiles_are_each_steps_quantile() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for (steps, members) in [(1, 5), (720, 1000), (50, 4000), (3000, 40)] {
            let ctx = Ctx { start: 10_000, step: 60_000, n: steps };
            let q: Vec<f64> = (0..steps).map(|i| [0.0, 0.5, 0.9, 1.0, 0.33, 1.5, -0.5][i % 7]).collect();
            let input: Vec<Series> = (0..members)
                .map(|m| {
                    let mut points = Vec::new();
                    for i in 0..steps {
                        // Steps 3, 10, … hold no value; members hold gaps of their own.
                        let r = next();
                        if i % 7 == 3 || (m % 5 == 0 && r % 3 == 0) {
                            continue;
                        }
                        let f = match (r >> 8) % 50 {
                            0 => f64::NAN,
                            1 => -0.0,
                            r => (r as f64 - 20.0) / 3.0,
                        };
                        points.push(Point { t: ctx.ts(i), f });
                    }
                    Series::new(Labels::from_pairs([("m", m.to_string())]), points)
                })
                .collect();
            let all: Vec<usize> = (0..members).collect();
            let want: Vec<Option<u64>> = (0..steps)
                .map(|i| {
                    let mut values: Vec<f64> =
                        input.iter().filter_map(|s| s.points.iter().find(|p| p.t == ctx.ts(i)).map(|p| p.f)).collect();
                    (!values.is_empty()).then(|| quantile(q[i], &mut values).to_bits())
                })
                .collect();
            for threads in [1, 2, 3, 8] {
                let got: Vec<Option<u64>> =
                    group_quantiles(&q, &input, &all, &ctx, threads).iter().map(|f| f.map(f64::to_bits)).collect();
                assert_eq!(got, want, "{steps} steps, {threads} threads");
            }
        }
    }

    #[test]
    fn compensated_sum_keeps_small_terms() {
        let (mut s, mut c) = (0.0, 0.0);
        for v in [1e100, 1.0, -1e100] {
            (s, c) = kahan_inc(v, s, c);
        }
        assert_eq!(s + c, 1.0);
    }

    /// The plain way: per step and group, a stable sort of the candidates in series order.
    fn select_k_by_sorting(
        op: AggregateOp,
        input: &[Series],
        group_of: &[usize],
        ks: &[usize],
        ctx: &Ctx,
    ) -> Vec<Series> {
        let mut keep: Vec<Vec<bool>> = input.iter().map(|s| vec![false; s.points.len()]).collect();
        for (step, &k) in ks.iter().enumerate().take(ctx.n) {
            let t = ctx.ts(step);
            for g in 0..=group_of.iter().copied().max().unwrap_or(0) {
                let mut members: Vec<(usize, usize)> = (0..input.len())
                    .filter(|&si| group_of[si] == g)
                    .filter_map(|si| input[si].points.iter().position(|p| p.t == t).map(|pi| (si, pi)))
                    .collect();
                if op != AggregateOp::LimitK {
                    members.sort_by(|&(a, ap), &(b, bp)| {
                        let (x, y) = (input[a].points[ap].f, input[b].points[bp].f);
                        if better(op, x, y) {
                            std::cmp::Ordering::Less
                        } else if better(op, y, x) {
                            std::cmp::Ordering::Greater
                        } else {
                            std::cmp::Ordering::Equal
                        }
                    });
                }
                members.iter().take(k).for_each(|&(si, pi)| keep[si][pi] = true);
            }
        }
        input
            .iter()
            .zip(keep)
            .filter_map(|(s, keep)| {
                let points: Vec<Point> = s.points.iter().zip(keep).filter(|(_, k)| *k).map(|(p, _)| *p).collect();
                (!points.is_empty()).then(|| Series {
                    labels: s.labels.clone(),
                    points,
                    hists: Vec::new(),
                    drop_name: false,
                })
            })
            .collect()
    }

    proptest::proptest! {
        /// `quantile` by selection of its two ranks answers as interpolating over a full sort
        /// (NaN first) does, bit for bit (zeros of either sign count as equal).
        #[test]
        fn quantile_by_selection_matches_sorting(
            values in proptest::collection::vec(
                proptest::prop_oneof![
                    8 => proptest::strategy::Strategy::prop_map(-20i8..20, |v| f64::from(v) / 4.0),
                    1 => proptest::strategy::Just(f64::NAN),
                    1 => proptest::sample::select(vec![-0.0, f64::INFINITY, f64::NEG_INFINITY, f64::MIN_POSITIVE, -f64::MAX]),
                ],
                1..40,
            ),
            q in 0.0f64..=1.0,
        ) {
            let mut sorted = values.clone();
            sorted.sort_by(|a, b| match (a.is_nan(), b.is_nan()) {
                (true, true) => std::cmp::Ordering::Equal,
                (true, false) => std::cmp::Ordering::Less,
                (false, true) => std::cmp::Ordering::Greater,
                _ => a.partial_cmp(b).unwrap(),
            });
            let rank = q * (sorted.len() as f64 - 1.0);
            let lower = rank.floor() as usize;
            let upper = (lower + 1).min(sorted.len() - 1);
            let weight = rank - rank.floor();
            let want = sorted[lower] * (1.0 - weight) + sorted[upper] * weight;
            let mut after = values.clone();
            let got = quantile(q, &mut after);
            proptest::prop_assert!(got == want || (got.is_nan() && want.is_nan()), "{got} != {want}");
            // The same values are left, bit for bit (NaN as NaN), in some order.
            let bits = |vs: &[f64]| {
                let mut b: Vec<u64> = vs.iter().map(|v| if v.is_nan() { u64::MAX } else { v.to_bits() }).collect();
                b.sort_unstable();
                b
            };
            proptest::prop_assert_eq!(bits(&after), bits(&values));
        }
    }

    proptest::proptest! {
        /// Choosing the best k by partial selection (k of 8 or less at every step: series by
        /// series, else step by step) picks what a stable sort would, ties (equal values,
        /// NaNs) broken by series order; k may differ by step (below 1: none).
        #[test]
        fn select_k_matches_stable_sort(
            values in proptest::collection::vec(proptest::collection::vec(proptest::option::of(0u8..5), 6), 1..12),
            groups in proptest::collection::vec(0usize..3, 12),
            ks in proptest::collection::vec(0usize..12, 6),
            small in proptest::bool::ANY,
            op in proptest::sample::select(vec![AggregateOp::TopK, AggregateOp::BottomK, AggregateOp::LimitK]),
        ) {
            let ks: Vec<usize> = ks.iter().map(|&k| if small { k.min(SMALL_K) } else { k }).collect();
            let ctx = Ctx { start: 0, step: 10, n: 6 };
            let input: Vec<Series> = values
                .iter()
                .enumerate()
                .map(|(i, vs)| Series {
                    labels: Labels::from_pairs([("i", format!("{i:02}").as_str())]),
                    points: vs
                        .iter()
                        .enumerate()
                        .filter_map(|(step, v)| v.map(|v| Point { t: ctx.ts(step), f: if v == 4 { f64::NAN } else { v as f64 } }))
                        .collect(),
                    hists: Vec::new(),
                    drop_name: false,
                })
                .collect();
            let group_of: Vec<usize> = (0..input.len()).map(|i| groups[i]).collect();
            let want = select_k_by_sorting(op, &input, &group_of, &ks, &ctx);
            let k: Vec<f64> = ks.iter().map(|&k| k as f64 + 0.5).collect();
            let got = select_k(op, input, &group_of, &k, &ctx).unwrap();
            let show = |v: &[Series]| v.iter().map(|s| (s.labels.to_string(), s.points.iter().map(|p| p.t).collect::<Vec<_>>())).collect::<Vec<_>>();
            proptest::prop_assert_eq!(show(&got), show(&want));
        }
    }

    /// A group of one member is answered from its points without accumulators: each value as
    /// folding it alone into fresh ones gives it, bit for bit (NaN, -0 and infinities too).
    #[test]
    fn alone_is_one_value_folded() {
        let ctx = Ctx { start: 1000, step: 10, n: 1 };
        let ops = [
            AggregateOp::Sum,
            AggregateOp::Count,
            AggregateOp::Group,
            AggregateOp::Min,
            AggregateOp::Max,
            AggregateOp::Avg,
            AggregateOp::Stddev,
            AggregateOp::Stdvar,
        ];
        for op in ops {
            for f in [0.0, -0.0, 1.5, -3.25, 1e308, -1e-308, f64::INFINITY, f64::NEG_INFINITY, f64::NAN] {
                let mut accs = StepAccs::new(op);
                fold(op, &mut accs, &[Point { t: 1000, f }], &ctx);
                let folded = accs.result(op, 0).expect("one value folded");
                assert_eq!(alone(op, f).to_bits(), folded.to_bits(), "{op:?} of {f}");
                let single = GroupAcc::Single(vec![Point { t: 1000, f }]).into_points(op, &ctx);
                assert_eq!(single.len(), 1);
                assert_eq!(single[0].f.to_bits(), folded.to_bits(), "{op:?} of {f}");
            }
        }
    }

    proptest::proptest! {
        /// Folding series into one group's accumulators, whether a series covers consecutive
        /// steps (the vectorized path) or has gaps, gives at every step the bits of adding the
        /// step's values in series order the plain way (Prometheus' compensated sum, its
        /// count, min and max, NaN and infinities included).
        #[test]
        fn folding_matches_adding_step_by_step(
            values in proptest::collection::vec(proptest::collection::vec(proptest::option::weighted(0.85, 0usize..8), 8), 1..6),
            op in proptest::sample::select(vec![AggregateOp::Sum, AggregateOp::Count, AggregateOp::Group, AggregateOp::Min, AggregateOp::Max]),
        ) {
            let pick = [0.0, -0.0, 1.5, -3.25, 1e100, -1e100, f64::INFINITY, f64::NAN];
            let ctx = Ctx { start: 1000, step: 10, n: 8 };
            let mut accs = StepAccs::new(op);
            let mut want: Vec<Option<(f64, f64)>> = vec![None; ctx.n];
            for vs in &values {
                let points: Vec<Point> =
                    vs.iter().enumerate().filter_map(|(i, v)| v.map(|v| Point { t: ctx.ts(i), f: pick[v] })).collect();
                fold(op, &mut accs, &points, &ctx);
                for (i, v) in vs.iter().enumerate() {
                    let Some(v) = v else { continue };
                    let f = pick[*v];
                    want[i] = Some(match (want[i], op) {
                        (None, AggregateOp::Count | AggregateOp::Group) => (1.0, 0.0),
                        (None, _) => (f, 0.0),
                        (Some((n, _)), AggregateOp::Count) => (n + 1.0, 0.0),
                        (Some(g), AggregateOp::Group) => g,
                        (Some((m, _)), AggregateOp::Min) => (if m > f || m.is_nan() { f } else { m }, 0.0),
                        (Some((m, _)), AggregateOp::Max) => (if m < f || m.is_nan() { f } else { m }, 0.0),
                        (Some((s, c)), _) => {
                            let t = s + f;
                            let c = if t.is_infinite() {
                                0.0
                            } else if s.abs() >= f.abs() {
                                c + ((s - t) + f)
                            } else {
                                c + ((f - t) + s)
                            };
                            (t, c)
                        }
                    });
                }
            }
            for (i, w) in want.iter().enumerate() {
                let want = w.map(|(v, c)| if op == AggregateOp::Sum { v + c } else { v }).map(f64::to_bits);
                proptest::prop_assert_eq!(accs.result(op, i).map(f64::to_bits), want, "step {}", i);
            }
        }
    }

    proptest::proptest! {
        /// `avg` folded as sums and counts (`Steps::Mean`), consecutive or with gaps, and
        /// turned into `Acc`s where a sum would overflow, gives at every step the bits of
        /// `Acc::add` of the step's values in series order (Prometheus' mean, which turns
        /// incremental at the first overflow).
        #[test]
        fn mean_folding_matches_adding_step_by_step(
            values in proptest::collection::vec(proptest::collection::vec(proptest::option::weighted(0.85, 0usize..10), 8), 1..8),
        ) {
            let pick = [0.0, -0.0, 1.5, -3.25, 0.1, 1e100, f64::MAX, -f64::MAX, f64::INFINITY, f64::NAN];
            let ctx = Ctx { start: 1000, step: 10, n: 8 };
            let mut accs = StepAccs::new(AggregateOp::Avg);
            let mut want = vec![Acc::default(); ctx.n];
            for vs in &values {
                let points: Vec<Point> =
                    vs.iter().enumerate().filter_map(|(i, v)| v.map(|v| Point { t: ctx.ts(i), f: pick[v] })).collect();
                fold(AggregateOp::Avg, &mut accs, &points, &ctx);
                for (i, v) in vs.iter().enumerate() {
                    if let Some(v) = v {
                        want[i].add(AggregateOp::Avg, pick[*v]);
                    }
                }
            }
            for (i, w) in want.iter().enumerate() {
                let want = w.seen.then(|| w.result(AggregateOp::Avg)).map(f64::to_bits);
                proptest::prop_assert_eq!(accs.result(AggregateOp::Avg, i).map(f64::to_bits), want, "step {}", i);
            }
        }
    }

    /// Sums and counts of ordinary values stay `Steps::Mean`; a sum that would overflow turns
    /// the group into `Acc`s.
    #[test]
    fn means_turn_into_accumulators_only_when_a_sum_overflows() {
        let ctx = Ctx { start: 0, step: 10, n: 4 };
        let at = |vs: [f64; 4]| vs.iter().enumerate().map(|(i, &f)| Point { t: ctx.ts(i), f }).collect::<Vec<_>>();
        let mut accs = StepAccs::new(AggregateOp::Avg);
        fold(AggregateOp::Avg, &mut accs, &at([1.0, 2.0, 3.0, f64::MAX]), &ctx);
        fold(AggregateOp::Avg, &mut accs, &at([3.0, 4.0, 5.0, 1.0]), &ctx);
        assert!(matches!(accs.steps, Steps::Mean { .. }));
        assert_eq!(accs.result(AggregateOp::Avg, 1), Some(3.0));
        fold(AggregateOp::Avg, &mut accs, &at([0.0, 0.0, 0.0, f64::MAX]), &ctx);
        assert!(matches!(accs.steps, Steps::Full(_)));
        assert_eq!(accs.result(AggregateOp::Avg, 0), Some(4.0 / 3.0));
        assert!(accs.result(AggregateOp::Avg, 3).is_some_and(f64::is_finite), "the incremental mean");
    }

    /// A folded group whose members live on steps 3..=5 and 4..=7 of ten gives points at those
    /// steps only, each at its own step's timestamp with that step's sum; the steps before and
    /// after the span are "no sample", not zeros.
    #[test]
    fn folded_group_gives_points_of_its_span_only() {
        let ctx = Ctx { start: 1000, step: 10, n: 10 };
        let member = |steps: std::ops::RangeInclusive<usize>, f: f64| -> Vec<Point> {
            steps.map(|i| Point { t: ctx.ts(i), f: f * i as f64 }).collect()
        };
        for op in [AggregateOp::Sum, AggregateOp::Avg] {
            let mut group = GroupAcc::Single(member(3..=5, 1.0));
            fold(op, group.folded(op, &ctx), &member(4..=7, 10.0), &ctx);
            let want: Vec<(i64, f64)> = (3..=7)
                .map(|i| {
                    let (a, b) = (i as f64, 10.0 * i as f64);
                    let both = (4..=5).contains(&i);
                    let v = match (op, i) {
                        (_, 3) => a,
                        (AggregateOp::Sum, _) if both => a + b,
                        (AggregateOp::Avg, _) if both => (a + b) / 2.0,
                        _ => b,
                    };
                    (ctx.ts(i), v)
                })
                .collect();
            let got: Vec<(i64, f64)> = group.into_points(op, &ctx).iter().map(|p| (p.t, p.f)).collect();
            assert_eq!(got, want, "{op:?}");
        }
    }

    #[test]
    fn go_float_format() {
        assert_eq!(fmt_float(1.0), "1");
        assert_eq!(fmt_float(0.1), "0.1");
        assert_eq!(fmt_float(f64::INFINITY), "+Inf");
        assert_eq!(fmt_float(1e21), "1000000000000000000000");
    }
}
