//! Evaluation from rollup tiers: a query whose steps, windows and offsets all fall on a tier's
//! bucket boundaries is answered from the tier's buckets (count, sum, min, max, first, last,
//! counter reset correction, changes, resets per interval) instead of every raw sample.
//!
//! What a tier answers, and how exactly (`docs/rollups.md`):
//! - a plain selector at step time `t`: the last sample at or before `t` is the last sample of
//!   the newest bucket ending at or before `t`, with its own timestamp, so the lookback applies
//!   as on raw data. Exact, except that stale markers are not kept: a series that ended shows
//!   its last value until the lookback passes, not until its stale marker.
//! - over windows `(t - r, t]` with `r` a multiple of the interval, the window is a run of
//!   whole buckets, combined in time order (`Bucket::append`): `count_over_time`,
//!   `min_over_time`, `max_over_time`, `last_over_time`, `first_over_time`,
//!   `present_over_time`, `changes`, `resets`, `ts_of_first_over_time`, `ts_of_last_over_time`
//!   exactly; `rate`, `increase` and `delta` from the first and last sample, the sample count
//!   and the reset correction, with Prometheus' extrapolation, exact but for the order in
//!   which reset corrections are added; `sum_over_time` and `avg_over_time` up to the order
//!   of the float additions.
//!
//! Anything else (other range functions, subqueries, extended range modes, native
//! histograms, windows or offsets off the bucket grid) is read raw: the planner picks no tier,
//! or evaluation stops with `EvalError::RollupUnsuitable` and the engine starts again raw.

use std::sync::atomic::Ordering;

use strata_model::{Labels, METRIC_NAME};
use strata_tsdb::chunkenc::rollup::{Column, ColumnSet};
use strata_tsdb::db::RollupSeries;
use strata_tsdb::rollup::{Bucket, BucketColumns, RollupTier};

use super::range_functions::{count_as_f64, give_batch, per_second_divisor, take_batch};
use super::{point_buffers, Ctx, Evaluator, RangeSpec, SelectorValue};
use crate::ast::{Call, Expr, ExprKind, RangeMode, VectorSelector};
use crate::error::EvalError;
use crate::value::{Point, Series};

/// Which tiers a query may read (`max_source_resolution`, as Thanos calls it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SourceResolution {
    /// The coarsest tier that answers the query exactly.
    #[default]
    Auto,
    /// Raw samples only.
    Raw,
    /// Tiers of at most this interval (milliseconds).
    AtMost(i64),
}

impl SourceResolution {
    /// Parses `max_source_resolution`: `auto`, `raw` or `0s`, or a duration.
    pub fn parse(s: &str) -> Result<SourceResolution, String> {
        match s {
            "" | "auto" => Ok(SourceResolution::Auto),
            "raw" | "0" | "0s" => Ok(SourceResolution::Raw),
            d => match strata_model::parse_duration_ms(d) {
                Ok(0) => Ok(SourceResolution::Raw),
                Ok(ms) => Ok(SourceResolution::AtMost(ms)),
                Err(e) => Err(format!("expected auto, raw or a duration: {e}")),
            },
        }
    }

    fn allows(self, interval_ms: i64) -> bool {
        match self {
            SourceResolution::Auto => true,
            SourceResolution::Raw => false,
            SourceResolution::AtMost(ms) => interval_ms <= ms,
        }
    }
}

impl Evaluator<'_> {
    /// The coarsest tier among `tiers` (finest first) that answers `expr` evaluated at
    /// `start + i*step` exactly as raw data would, if any.
    pub(super) fn plan_tier(&self, expr: &Expr, start: i64, step: i64, tiers: &[RollupTier]) -> Option<RollupTier> {
        let allowed = self.engine.opts.max_source_resolution;
        tiers.iter().rev().copied().find(|t| {
            let i = t.interval_ms;
            allowed.allows(i) && start.rem_euclid(i) == 0 && (step == 0 || step % i == 0) && self.fits(expr, i)
        })
    }

    /// Whether every selector of `e` reads whole buckets of `interval`.
    fn fits(&self, e: &Expr, interval: i64) -> bool {
        let aligned = |ms: i64| ms.rem_euclid(interval) == 0;
        let selector_fits = |sel: &VectorSelector| {
            sel.mode == RangeMode::Plain
                && aligned(sel.offset.as_ref().map_or(0, |d| self.duration_ms(d)))
                && self.at_ms(sel.at).is_none_or(aligned)
        };
        match &e.kind {
            ExprKind::Number(_) | ExprKind::String(_) => true,
            ExprKind::Vector(sel) => selector_fits(sel),
            // A range vector only as a supported function's argument (below).
            ExprKind::Matrix(_) | ExprKind::Subquery(_) => false,
            ExprKind::Paren(x) | ExprKind::Neg(x) | ExprKind::Pos(x) => self.fits(x, interval),
            ExprKind::Binary(b) => self.fits(&b.lhs, interval) && self.fits(&b.rhs, interval),
            ExprKind::Aggregate(a) => {
                a.param.as_ref().is_none_or(|p| self.fits(p, interval)) && self.fits(&a.expr, interval)
            }
            ExprKind::Call(c) => {
                let name = c.func.name;
                if matches!(name, "info" | "start_timestamp")
                    || name.starts_with("histogram_") && name != "histogram_quantile"
                {
                    return false;
                }
                c.args.iter().all(|a| match &a.unparen().kind {
                    ExprKind::Matrix(m) => {
                        (WindowFn::of(name).is_some() || name == "absent_over_time")
                            && aligned(self.duration_ms(&m.range))
                            && self.duration_ms(&m.range) > 0
                            && selector_fits(&m.vector)
                    }
                    _ => self.fits(a, interval),
                })
            }
        }
    }

    /// The tier's buckets for `sel` over `[mint, maxt]`, each series turned into a result by
    /// `map` (on the decoding workers, in parallel), the results handed to `sink` in label
    /// order; `RollupUnsuitable` if native histograms match (tiers do not hold them).
    fn map_buckets(
        &self,
        tier: RollupTier,
        sel: &VectorSelector,
        (mint, maxt): (i64, i64),
        columns: &[Column],
        map: &(dyn Fn(&RollupSeries) -> Option<Series> + Sync),
        sink: &mut dyn FnMut(Series) -> Result<(), EvalError>,
    ) -> Result<(), EvalError> {
        let columns = ColumnSet::of(columns);
        let read = &self.buckets_read;
        let map = |s: &RollupSeries| {
            read.fetch_add(s.buckets.len(), Ordering::Relaxed);
            self.check("series selection")?;
            Ok(map(s))
        };
        let histograms = self.st.map_rollup(tier.interval_ms, &sel.matchers, mint, maxt, columns, &map, sink)?;
        if histograms > 0 {
            return Err(EvalError::RollupUnsuitable("native histograms match the selector"));
        }
        Ok(())
    }

    /// `stream_selector` from a tier: at each step the newest bucket ending at or before the
    /// step's time holds the last sample before it.
    pub(super) fn stream_selector_from_tier(
        &self,
        tier: RollupTier,
        sel: &VectorSelector,
        ctx: &Ctx,
        value: SelectorValue,
        sink: &mut dyn FnMut(Series) -> Result<(), EvalError>,
    ) -> Result<(), EvalError> {
        let offset = sel.offset.as_ref().map_or(0, |d| self.duration_ms(d));
        let at = self.at_ms(sel.at);
        let lookback = self.lookback();
        let end_at = |t: i64| at.unwrap_or(t) - offset;
        let (first, last) = (end_at(ctx.start), end_at(ctx.end()));
        let map = |s: &RollupSeries| {
            let mut points = point_buffers::POOL.take(points_capacity(ctx, &s.buckets, lookback, at.is_some()));
            let (ends, lasts) = (s.buckets.ends(), s.buckets.lasts());
            let mut j = 0;
            for i in 0..ctx.n {
                let te = end_at(ctx.ts(i));
                while j < ends.len() && ends[j] <= te {
                    j += 1;
                }
                let Some(last) = j.checked_sub(1).map(|j| lasts[j]) else { continue };
                if last.t <= te - lookback {
                    continue;
                }
                let f = match value {
                    SelectorValue::Value => last.v,
                    SelectorValue::SampleTime => last.t as f64 / 1000.0,
                    SelectorValue::StartTime => unreachable!("the planner refuses start_timestamp"),
                };
                points.push(Point { t: ctx.ts(i), f });
            }
            if points.is_empty() {
                point_buffers::POOL.give(points);
                return None;
            }
            Some(Series::new(s.labels.clone(), points))
        };
        // The last samples only (the decoder gives each bucket its last as its first too).
        self.map_buckets(tier, sel, (first - lookback + 1, last), &[Column::Last], &map, sink)
    }

    /// A range function over a plain range selector, from a tier: each step's window is a run
    /// of whole buckets.
    pub(super) fn stream_range_function_from_tier(
        &self,
        tier: RollupTier,
        call: &Call,
        ctx: &Ctx,
        sink: &mut dyn FnMut(Series) -> Result<(), EvalError>,
    ) -> Result<(), EvalError> {
        let name = call.func.name;
        let matrix = &call.args[0];
        let ExprKind::Matrix(m) = &matrix.unparen().kind else {
            return Err(EvalError::RollupUnsuitable("range function without a range selector"));
        };
        let spec: RangeSpec = self.range_spec(matrix)?;
        let (first, last) = (spec.end_at(ctx.start), spec.end_at(ctx.end()));
        let keeps_name = matches!(name, "last_over_time" | "first_over_time");
        let Some(func) = WindowFn::of(name) else {
            return Err(EvalError::RollupUnsuitable("a range function tiers do not answer"));
        };
        // Whether a window of several buckets combines them in time order, or only adds up
        // their totals (decided once, not per bucket).
        let reads_ends = func.reads_ends();
        let map = |s: &RollupSeries| {
            if matches!(name, "rate" | "increase") {
                note_not_counter(self, &s.labels, matrix.start);
            }
            let mut points = point_buffers::POOL.take(points_capacity(ctx, &s.buckets, spec.range, spec.at.is_some()));
            // `rate`, `increase` and `delta` extrapolate as on raw data, and by the same
            // arithmetic: a batch of windows at a time (`Batch`), so every bit is the same.
            let batch = func
                .extrapolates()
                .then(|| take_batch(func != WindowFn::Delta, per_second_divisor(spec.range, func == WindowFn::Rate)));
            match batch {
                Some(mut batch) => {
                    let b = &s.buckets;
                    let (counts, firsts, lasts, corrections) =
                        (b.counts(), b.firsts(), b.lasts(), b.reset_corrections());
                    if let Some((run, first_step)) = step_per_bucket(b, ctx, &spec) {
                        // A dashboard over the tier of its step: bucket `run.start + j` is
                        // step `first_step + j`'s window, and its end is that window's end.
                        // Read straight from the columns, without the walk of windows and
                        // its index checks: a month's `sum(rate(...[1h]))` of a thousand
                        // series at a 1 h step spent a fifth of its CPU in the walk, and
                        // 5-12% less CPU in all without it.
                        let ends = &b.ends()[run.clone()];
                        let columns = counts[run.clone()].iter().zip(&firsts[run.clone()]).zip(&lasts[run.clone()]);
                        let corrections = if func == WindowFn::Delta { &[][..] } else { &corrections[run.clone()] };
                        for (j, ((&count, first), last)) in columns.enumerate() {
                            if count < 2 {
                                continue;
                            }
                            let change = match corrections.get(j) {
                                Some(c) => last.v - first.v + c,
                                None => last.v - first.v,
                            };
                            let (i, end) = (first_step + j, ends[j]);
                            debug_assert_eq!(end, spec.end_at(ctx.ts(i)));
                            let first = Point { t: first.t, f: first.v };
                            batch.push_parts(first, last.t, count as usize, change, end, spec.range);
                            points.push(Point { t: ctx.ts(i), f: 0.0 });
                            if batch.is_full() {
                                batch.finish(&mut points);
                            }
                        }
                    } else {
                        for_windows(b, ctx, &spec, reads_ends, |i, end, w| {
                            let (count, first, last, change) = match w {
                                Window::One(k) => {
                                    let (first, last) = (firsts[k], lasts[k]);
                                    let change = if func == WindowFn::Delta {
                                        last.v - first.v
                                    } else {
                                        last.v - first.v + corrections[k]
                                    };
                                    (counts[k], first, last, change)
                                }
                                Window::Many(w) => (w.count, w.first, w.last, func.change(w)),
                            };
                            if count < 2 {
                                return;
                            }
                            let first = Point { t: first.t, f: first.v };
                            batch.push_parts(first, last.t, count as usize, change, end, spec.range);
                            points.push(Point { t: ctx.ts(i), f: 0.0 });
                            if batch.is_full() {
                                batch.finish(&mut points);
                            }
                        });
                    }
                    batch.finish(&mut points);
                    give_batch(batch);
                }
                None => func.values_over_windows(&s.buckets, ctx, &spec, reads_ends, &mut points),
            }
            if points.is_empty() {
                point_buffers::POOL.give(points);
                return None;
            }
            Some(Series { labels: s.labels.clone(), points, hists: Vec::new(), drop_name: !keeps_name })
        };
        self.map_buckets(tier, &m.vector, (first - spec.range + 1, last), func.columns(), &map, sink)
    }
}

/// A step's window: one bucket (by its index in the columns), or several combined.
#[derive(Clone, Copy)]
enum Window<'a> {
    One(usize),
    Many(&'a Bucket),
}

/// Calls `f` with each step's index, its window's end and its window, for the steps whose
/// window holds a bucket. A window of one bucket (the step and range of the tier's interval, a
/// dashboard's usual shape) is passed as its index, to be read from the columns; a window of
/// several is combined as whole buckets (`Bucket::append`, or `append_totals` without
/// `reads_ends`). Inlined into each caller, so that what `f` computes is not chosen per step
/// (and so called from this one place: with a second call site, the rate's closure was no
/// longer inlined but called per bucket).
#[inline(always)]
fn for_windows(
    buckets: &BucketColumns,
    ctx: &Ctx,
    spec: &RangeSpec,
    reads_ends: bool,
    mut f: impl FnMut(usize, i64, Window<'_>),
) {
    let ends = buckets.ends();
    let (mut lo, mut hi) = (0usize, 0usize);
    let mut combined;
    for i in 0..ctx.n {
        let end = spec.end_at(ctx.ts(i));
        while hi < ends.len() && ends[hi] <= end {
            hi += 1;
        }
        while lo < hi && ends[lo] <= end - spec.range {
            lo += 1;
        }
        let w = match hi - lo {
            0 => continue,
            1 => Window::One(lo),
            _ => {
                combined = buckets.bucket(lo);
                for k in lo + 1..hi {
                    let b = buckets.bucket(k);
                    if reads_ends {
                        combined.append(&b);
                    } else {
                        combined.append_totals(&b);
                    }
                }
                Window::Many(&combined)
            }
        };
        f(i, end, w);
    }
}

/// When each step's window is one bucket of the series and each bucket one step's window (the
/// range is the step, and the buckets, one step apart without gaps, end where the windows
/// end: a dashboard's panel over the tier of its step), the buckets that fall in the query's
/// steps and the step of the first of them: bucket `k` answers step `first_step + (k -
/// run.start)`, and the steps before and after the run have no bucket. `None` for any other
/// shape (gaps, `@`, ranges over several buckets), which `for_windows` walks.
fn step_per_bucket(buckets: &BucketColumns, ctx: &Ctx, spec: &RangeSpec) -> Option<(std::ops::Range<usize>, usize)> {
    let ends = buckets.ends();
    let (&first, &last) = (ends.first()?, ends.last()?);
    let step = ctx.step;
    if spec.at.is_some() || ctx.n < 2 || step <= 0 || spec.range != step {
        return None;
    }
    let len = ends.len() as i64;
    // A pass of subtractions (the span alone would not do: with the step a multiple of the
    // interval, ends one and three intervals apart span two steps).
    if last - first != (len - 1) * step || ends.windows(2).any(|w| w[1] - w[0] != step) {
        return None;
    }
    let from = first - spec.end_at(ctx.start);
    if from.rem_euclid(step) != 0 {
        return None;
    }
    // The step whose window is the first bucket: before the first step or past the last for
    // buckets outside the query's range.
    let step_of_first = from.div_euclid(step);
    let run = (-step_of_first).clamp(0, len)..(ctx.n as i64 - step_of_first).clamp(0, len);
    if run.is_empty() {
        return Some((0..0, 0));
    }
    Some((run.start as usize..run.end as usize, (step_of_first + run.start) as usize))
}

/// Room for the points a series' buckets can give (`Ctx::points_capacity` for buckets): sized
/// once, the buffer never grows (a 30-day range of a thousand series is megabytes of points).
fn points_capacity(ctx: &Ctx, buckets: &BucketColumns, window: i64, pinned: bool) -> usize {
    ctx.capacity_for_span(buckets.span(), window, pinned)
}

/// Prometheus' note on `rate`/`increase` of a metric whose name does not say counter.
fn note_not_counter(ev: &Evaluator, labels: &Labels, pos: usize) {
    if let Some(n) = labels.get(METRIC_NAME) {
        if !["_total", "_sum", "_count", "_bucket"].iter().any(|suf| n.ends_with(suf)) {
            ev.info(
                pos,
                format!("metric might not be a counter, name does not end in _total/_sum/_count/_bucket: {n:?}"),
            );
        }
    }
}

/// A range function a tier answers, named once per query rather than matched by name at every
/// step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WindowFn {
    Rate,
    Increase,
    Delta,
    SumOverTime,
    AvgOverTime,
    CountOverTime,
    MinOverTime,
    MaxOverTime,
    LastOverTime,
    FirstOverTime,
    PresentOverTime,
    Changes,
    Resets,
    TsOfFirstOverTime,
    TsOfLastOverTime,
}

impl WindowFn {
    fn of(name: &str) -> Option<WindowFn> {
        Some(match name {
            "rate" => WindowFn::Rate,
            "increase" => WindowFn::Increase,
            "delta" => WindowFn::Delta,
            "sum_over_time" => WindowFn::SumOverTime,
            "avg_over_time" => WindowFn::AvgOverTime,
            "count_over_time" => WindowFn::CountOverTime,
            "min_over_time" => WindowFn::MinOverTime,
            "max_over_time" => WindowFn::MaxOverTime,
            "last_over_time" => WindowFn::LastOverTime,
            "first_over_time" => WindowFn::FirstOverTime,
            "present_over_time" => WindowFn::PresentOverTime,
            "changes" => WindowFn::Changes,
            "resets" => WindowFn::Resets,
            "ts_of_first_over_time" => WindowFn::TsOfFirstOverTime,
            "ts_of_last_over_time" => WindowFn::TsOfLastOverTime,
            _ => return None,
        })
    }

    /// Whether the function reads a window's first or last sample, or what combining buckets
    /// in time order computes from them (`changes`, `resets` and the reset correction count the
    /// step from one bucket's last sample to the next one's first): whether it reads those
    /// columns.
    fn reads_ends(self) -> bool {
        self.columns().contains(&Column::First)
    }

    /// The aggregates `value` reads (the bucket ends come with every read): the count only
    /// where the function reads it (an extreme or a sum does not: its column was a sixth of a
    /// maximum's CPU), the first and last samples only where the function reads them or what
    /// combining buckets in time order computes from them (`reads_ends`), since they are four
    /// of a bucket's columns (two timestamps, two values) and most of the cost of decoding one
    /// for an average or an extreme.
    fn columns(self) -> &'static [Column] {
        match self {
            // The count says whether a window holds the two samples a change needs.
            WindowFn::Rate | WindowFn::Increase => {
                &[Column::Count, Column::First, Column::Last, Column::ResetCorrection]
            }
            WindowFn::Delta => &[Column::Count, Column::First, Column::Last],
            WindowFn::SumOverTime => &[Column::Sum],
            WindowFn::AvgOverTime => &[Column::Count, Column::Sum],
            WindowFn::MinOverTime => &[Column::Min],
            WindowFn::MaxOverTime => &[Column::Max],
            WindowFn::Changes => &[Column::First, Column::Last, Column::Changes],
            WindowFn::Resets => &[Column::First, Column::Last, Column::Resets],
            WindowFn::CountOverTime => &[Column::Count],
            WindowFn::PresentOverTime => &[],
            WindowFn::LastOverTime
            | WindowFn::FirstOverTime
            | WindowFn::TsOfFirstOverTime
            | WindowFn::TsOfLastOverTime => &[Column::First, Column::Last],
        }
    }

    /// Whether the function extrapolates a change over the window (`rate`, `increase`,
    /// `delta`): computed in batches (`Batch`), not by `value`.
    fn extrapolates(self) -> bool {
        matches!(self, WindowFn::Rate | WindowFn::Increase | WindowFn::Delta)
    }

    /// The change an extrapolating function extrapolates over the window whose buckets combine
    /// to `w`: a counter's increase (resets accounted), or a gauge's last less first value.
    fn change(self, w: &Bucket) -> f64 {
        debug_assert!(self.extrapolates());
        if self == WindowFn::Delta {
            w.last.v - w.first.v
        } else {
            w.increase()
        }
    }

    /// The points of a function that does not extrapolate over `buckets`' windows, appended to
    /// `points`: a loop per function, so that the function is not chosen again at every step
    /// (a jump through a table per step was the loop's hottest instruction: over a month of
    /// 1 h buckets of a thousand series, the loop fell from 17.3% to 12.7% of an average's
    /// profile, and from 19.6% to 15.2% of a maximum's).
    fn values_over_windows(
        self,
        buckets: &BucketColumns,
        ctx: &Ctx,
        spec: &RangeSpec,
        reads_ends: bool,
        points: &mut Vec<Point>,
    ) {
        #[inline(always)]
        fn each(
            (buckets, ctx, spec, reads_ends): (&BucketColumns, &Ctx, &RangeSpec, bool),
            points: &mut Vec<Point>,
            value: impl Fn(&BucketColumns, Window<'_>) -> f64,
        ) {
            if let Some((run, first_step)) = step_per_bucket(buckets, ctx, spec) {
                // One extend of a known length: no window walk, and the vector's length kept
                // in a register rather than stored back at every push.
                let skipped = run.start;
                points.extend(
                    run.map(|k| Point { t: ctx.ts(first_step + (k - skipped)), f: value(buckets, Window::One(k)) }),
                );
                return;
            }
            for_windows(buckets, ctx, spec, reads_ends, |i, _, w| {
                points.push(Point { t: ctx.ts(i), f: value(buckets, w) })
            })
        }
        let on = (buckets, ctx, spec, reads_ends);
        match self {
            WindowFn::SumOverTime => each(on, points, |b, w| WindowFn::SumOverTime.value(b, w)),
            WindowFn::AvgOverTime => each(on, points, |b, w| WindowFn::AvgOverTime.value(b, w)),
            WindowFn::CountOverTime => each(on, points, |b, w| WindowFn::CountOverTime.value(b, w)),
            WindowFn::MinOverTime => each(on, points, |b, w| WindowFn::MinOverTime.value(b, w)),
            WindowFn::MaxOverTime => each(on, points, |b, w| WindowFn::MaxOverTime.value(b, w)),
            WindowFn::LastOverTime => each(on, points, |b, w| WindowFn::LastOverTime.value(b, w)),
            WindowFn::FirstOverTime => each(on, points, |b, w| WindowFn::FirstOverTime.value(b, w)),
            WindowFn::PresentOverTime => each(on, points, |b, w| WindowFn::PresentOverTime.value(b, w)),
            WindowFn::Changes => each(on, points, |b, w| WindowFn::Changes.value(b, w)),
            WindowFn::Resets => each(on, points, |b, w| WindowFn::Resets.value(b, w)),
            WindowFn::TsOfFirstOverTime => each(on, points, |b, w| WindowFn::TsOfFirstOverTime.value(b, w)),
            WindowFn::TsOfLastOverTime => each(on, points, |b, w| WindowFn::TsOfLastOverTime.value(b, w)),
            WindowFn::Rate | WindowFn::Increase | WindowFn::Delta => {
                unreachable!("extrapolating functions are computed in batches")
            }
        }
    }

    /// The value over window `w` of `buckets`, of a function that does not extrapolate.
    #[inline(always)]
    fn value(self, buckets: &BucketColumns, w: Window<'_>) -> f64 {
        let k = match w {
            Window::One(k) => k,
            Window::Many(w) => return self.value_of_combined(w),
        };
        let b = buckets;
        match self {
            WindowFn::Rate | WindowFn::Increase | WindowFn::Delta => {
                unreachable!("extrapolating functions are computed in batches")
            }
            WindowFn::SumOverTime => b.sums()[k],
            WindowFn::AvgOverTime => b.sums()[k] / count_as_f64(b.counts()[k]),
            WindowFn::CountOverTime => count_as_f64(b.counts()[k]),
            WindowFn::MinOverTime => b.mins()[k],
            WindowFn::MaxOverTime => b.maxs()[k],
            WindowFn::LastOverTime => b.lasts()[k].v,
            WindowFn::FirstOverTime => b.firsts()[k].v,
            WindowFn::PresentOverTime => 1.0,
            WindowFn::Changes => count_as_f64(b.changes()[k]),
            WindowFn::Resets => count_as_f64(b.resets()[k]),
            WindowFn::TsOfFirstOverTime => b.firsts()[k].t as f64 / 1000.0,
            WindowFn::TsOfLastOverTime => b.lasts()[k].t as f64 / 1000.0,
        }
    }

    /// The value over a window whose buckets combine to `w`, of a function that does not
    /// extrapolate.
    #[inline(always)]
    fn value_of_combined(self, w: &Bucket) -> f64 {
        match self {
            WindowFn::Rate | WindowFn::Increase | WindowFn::Delta => {
                unreachable!("extrapolating functions are computed in batches")
            }
            WindowFn::SumOverTime => w.sum,
            WindowFn::AvgOverTime => w.sum / count_as_f64(w.count),
            WindowFn::CountOverTime => count_as_f64(w.count),
            WindowFn::MinOverTime => w.min,
            WindowFn::MaxOverTime => w.max,
            WindowFn::LastOverTime => w.last.v,
            WindowFn::FirstOverTime => w.first.v,
            WindowFn::PresentOverTime => 1.0,
            WindowFn::Changes => count_as_f64(w.changes),
            WindowFn::Resets => count_as_f64(w.resets),
            WindowFn::TsOfFirstOverTime => w.first.t as f64 / 1000.0,
            WindowFn::TsOfLastOverTime => w.last.t as f64 / 1000.0,
        }
    }
}

#[cfg(test)]
mod tests;
