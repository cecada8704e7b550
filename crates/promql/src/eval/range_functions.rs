//! Functions over range vectors (`rate`, `*_over_time`, …). Each series is read once: its
//! samples cover every step's window, and two cursors slide forward as the steps advance.

use std::cell::Cell;
use std::sync::Arc;

use super::aggregate::{kahan_inc, quantile};
use super::range_histograms::{self, Notes, Out};
use super::{point_buffers, Ctx, Evaluator, Feed, RangeSpec, Starts};
use crate::ast::{Call, Expr, RangeMode};
use crate::error::{exec, EvalError};
use crate::value::{HPoint, Point, Series};
use strata_model::{Labels, METRIC_NAME};

/// Per-step inputs of a range function besides the window.
pub(super) struct Window<'a> {
    /// The evaluation step's time (not moved by offset or `@`).
    pub t: i64,
    /// The window's end (inclusive); its start `end - range` is exclusive.
    pub end: i64,
    pub range: i64,
    /// Scalar parameters at this step.
    pub params: &'a [f64],
    /// The last sample at or before the window's start, within the lookback (anchored and
    /// smoothed windows read it).
    pub before: Option<Point>,
    /// The first sample after the window's end, within the lookback (smoothed windows).
    pub after: Option<Point>,
    /// Start times of the window's float samples and of its histograms (0: none); each empty
    /// when none of them has one.
    pub st: &'a [i64],
    pub hst: &'a [i64],
    /// Set when a sample's start time overlaps the sample before it (warned once per series).
    pub overlap: &'a Cell<bool>,
}

impl<'a> Window<'a> {
    /// A plain window `(end - range, end]` at step time `t`, without start times.
    pub fn plain(t: i64, end: i64, range: i64, params: &'a [f64], overlap: &'a Cell<bool>) -> Self {
        Window { t, end, range, params, before: None, after: None, st: &[], hst: &[], overlap }
    }
}

type RangeFn = fn(&[Point], &Window) -> Option<f64>;

fn lookup(name: &str) -> Option<(RangeFn, bool)> {
    // (function, keeps the metric name)
    Some(match name {
        "rate" => (|s, w| extrapolated_rate(s, w, true, true), false),
        "increase" => (|s, w| extrapolated_rate(s, w, true, false), false),
        "delta" => (|s, w| extrapolated_rate(s, w, false, false), false),
        "irate" => (|s, w| instant_value(s, w, true), false),
        "idelta" => (|s, w| instant_value(s, w, false), false),
        "deriv" => (deriv, false),
        "predict_linear" => (predict_linear, false),
        "avg_over_time" => (avg_over_time, false),
        "sum_over_time" => (sum_over_time, false),
        "count_over_time" => (|s, _| (!s.is_empty()).then_some(s.len() as f64), false),
        "min_over_time" => (|s, _| extreme(s, |cur, f| f < cur), false),
        "max_over_time" => (|s, _| extreme(s, |cur, f| f > cur), false),
        "last_over_time" => (|s, _| s.last().map(|p| p.f), true),
        "first_over_time" => (|s, _| s.first().map(|p| p.f), true),
        "present_over_time" => (|s, _| (!s.is_empty()).then_some(1.0), false),
        "stddev_over_time" => (|s, _| variance(s).map(f64::sqrt), false),
        "stdvar_over_time" => (|s, _| variance(s), false),
        "quantile_over_time" => (quantile_over_time, false),
        "mad_over_time" => (mad_over_time, false),
        "changes" => (changes, false),
        "resets" => (resets, false),
        "double_exponential_smoothing" => (double_exponential_smoothing, false),
        "ts_of_first_over_time" => (|s, _| s.first().map(|p| p.t as f64 / 1000.0), false),
        "ts_of_last_over_time" => (|s, _| s.last().map(|p| p.t as f64 / 1000.0), false),
        "ts_of_min_over_time" => (|s, _| ts_of_extreme(s, |cur, f| f < cur), false),
        "ts_of_max_over_time" => (|s, _| ts_of_extreme(s, |cur, f| f > cur), false),
        _ => return None,
    })
}

/// Functions that read the samples just outside the window in `anchored` mode.
const ANCHORED_FUNCTIONS: &str = "changes, delta, increase, rate, resets";
const SMOOTHED_FUNCTIONS: &str = "delta, increase, rate";

pub(super) fn is_range_function(name: &str) -> bool {
    lookup(name).is_some()
}

/// Which argument is the range vector.
fn matrix_arg(name: &str) -> usize {
    if name == "quantile_over_time" {
        1
    } else {
        0
    }
}

/// Evaluates a range function series by series: each series' samples are read once and a
/// window slides across the steps.
pub(super) fn stream(
    ev: &Evaluator,
    call: &Call,
    ctx: &Ctx,
    sink: &mut dyn FnMut(Series) -> Result<(), EvalError>,
) -> Result<(), EvalError> {
    stream_to(ev, call, ctx, Feed::Series(sink))
}

/// `stream`, to either kind of output.
pub(super) fn stream_to(ev: &Evaluator, call: &Call, ctx: &Ctx, out: Feed<'_>) -> Result<(), EvalError> {
    let name = call.func.name;
    if let Some(tier) = ev.tier {
        // The planner picked a tier only if it answers this function.
        let Feed::Series(sink) = out else {
            return Err(exec("a tier's selection cannot be grouped on its workers"));
        };
        return ev.stream_range_function_from_tier(tier, call, ctx, sink);
    }
    let (f, keeps_name) = lookup(name).ok_or_else(|| exec(format!("unknown range function {name}")))?;
    let mi = matrix_arg(name);
    let matrix = &call.args[mi];
    let mut params: Vec<Vec<f64>> = Vec::new();
    for (i, a) in call.args.iter().enumerate() {
        if i != mi {
            params.push(ev.eval_scalar(a, ctx)?);
        }
    }
    check_mode(matrix, name)?;
    if name == "quantile_over_time" {
        if let Some(q) = params[0].iter().find(|q| !(0.0..=1.0).contains(*q)) {
            ev.warn(
                call.args[0].start,
                format!("quantile value should be between 0 and 1, got {}", super::aggregate::fmt_float(*q)),
            );
        }
    }
    if name == "double_exponential_smoothing" {
        for (p, what) in [(&params[0], "smoothing"), (&params[1], "trend")] {
            if let Some(v) = p.iter().find(|v| !(**v > 0.0 && **v < 1.0)) {
                return Err(exec(format!(
                    "invalid {what} factor. Expected: 0 < {} < 1, got: {v:.6}",
                    if what == "smoothing" { "sf" } else { "tf" }
                )));
            }
        }
    }
    let spec = ev.range_spec(matrix)?;
    let lookback = ev.lookback();
    let counter_fn = matches!(name, "rate" | "increase");
    // With `@` every window is the same; it is computed once unless a parameter still varies.
    let pin = params.is_empty();
    let eval_series = |labels: &Labels,
                       samples: &[Point],
                       hists: &[HPoint],
                       starts: Starts<'_>,
                       dropped: bool,
                       overlap: &Cell<bool>| {
        if counter_fn && !samples.is_empty() {
            if let Some(n) = labels.get(METRIC_NAME) {
                if !["_total", "_sum", "_count", "_bucket"].iter().any(|suf| n.ends_with(suf)) {
                    ev.info(
                        matrix.start,
                        format!(
                            "metric might not be a counter, name does not end in _total/_sum/_count/_bucket: {n:?}"
                        ),
                    );
                }
            }
        }
        if hists.is_empty() && spec.mode == RangeMode::Plain && params.is_empty() {
            // The common case, floats in plain windows: a loop of its own per function, so the
            // window's arithmetic is inlined into it.
            let (st, o) = (starts.floats, overlap);
            let points = match name {
                "rate" | "increase" | "delta"
                    if st.is_empty() && spec.at.is_none() && WindowPlan::fits(samples, ctx) =>
                {
                    slide_extrapolated(samples, ctx, &spec, name != "delta", name == "rate")
                }
                "rate" => slide_plain(samples, st, ctx, &spec, o, |s, w| extrapolated_rate(s, w, true, true)),
                "increase" => slide_plain(samples, st, ctx, &spec, o, |s, w| extrapolated_rate(s, w, true, false)),
                "delta" => slide_plain(samples, st, ctx, &spec, o, |s, w| extrapolated_rate(s, w, false, false)),
                "sum_over_time" => slide_plain(samples, st, ctx, &spec, o, sum_over_time),
                "avg_over_time" => slide_plain(samples, st, ctx, &spec, o, avg_over_time),
                _ => slide_plain(samples, st, ctx, &spec, o, f),
            };
            return Some(Series {
                labels: labels.clone(),
                points,
                hists: Vec::new(),
                drop_name: !keeps_name || dropped,
            });
        }
        let notes = Notes { ev, pos: matrix.start, metric: labels.get(METRIC_NAME).unwrap_or("") };
        let mut step_params = [0.0f64; 2];
        let (points, hists) = slide(samples, hists, starts, ctx, &spec, pin, lookback, |window, hwindow, e| {
            for (k, p) in params.iter().enumerate() {
                step_params[k] = p[e.step];
            }
            let w = Window {
                t: ctx.ts(e.step),
                end: e.end,
                range: spec.range,
                params: &step_params[..params.len()],
                before: e.before,
                after: e.after,
                st: e.starts.floats,
                hst: e.starts.hists,
                overlap,
            };
            if spec.mode != RangeMode::Plain && (!hwindow.is_empty() || e.hbefore.is_some() || e.hafter.is_some()) {
                let edges =
                    range_histograms::Edges { before: e.before, after: e.after, hbefore: e.hbefore, hafter: e.hafter };
                return range_histograms::extended(name, spec.mode, window, hwindow, &edges, &w, &notes);
            }
            if !hwindow.is_empty() {
                return range_histograms::eval(name, f, window, hwindow, &w, &notes);
            }
            match spec.mode {
                RangeMode::Plain => f(window, &w),
                mode => extended(name, mode, window, &w),
            }
            .map(Out::Float)
        });
        Some(Series { labels: labels.clone(), points, hists, drop_name: !keeps_name || dropped })
    };
    let per_series = |labels: &Labels, samples: &[Point], hists: &[HPoint], starts: Starts<'_>, dropped: bool| {
        let overlap = Cell::new(false);
        let series = eval_series(labels, samples, hists, starts, dropped, &overlap);
        if overlap.get() {
            ev.warn(
                matrix.start,
                format!(
                    "sample has start time that overlaps with previous sample timestamp for metric {:?}",
                    labels.get(METRIC_NAME).unwrap_or("")
                ),
            );
        }
        series
    };
    ev.stream_range(matrix, ctx, per_series, out)
}

/// `anchored`/`smoothed` are refused for functions that cannot use them.
fn check_mode(matrix: &Expr, name: &str) -> Result<(), EvalError> {
    if let crate::ast::ExprKind::Matrix(m) = &matrix.unparen().kind {
        match m.vector.mode {
            RangeMode::Anchored if !ANCHORED_FUNCTIONS.split(", ").any(|f| f == name) => {
                return Err(exec(format!(
                    "anchored modifier can only be used with: {ANCHORED_FUNCTIONS} - not with {name}"
                )))
            }
            RangeMode::Smoothed if !SMOOTHED_FUNCTIONS.split(", ").any(|f| f == name) => {
                return Err(exec(format!(
                    "smoothed modifier can only be used with: {SMOOTHED_FUNCTIONS} - not with {name}"
                )))
            }
            _ => {}
        }
    }
    Ok(())
}

/// Where a window ends, at which step, and its neighbouring samples of both kinds.
#[derive(Debug, Clone)]
struct Edges<'a> {
    end: i64,
    step: usize,
    before: Option<Point>,
    after: Option<Point>,
    hbefore: Option<&'a HPoint>,
    hafter: Option<&'a HPoint>,
    /// Start times of the window's samples.
    starts: Starts<'a>,
}

/// `slide` for float samples in plain windows without parameters: each step's window
/// `(end - range, end]` through `f`, two cursors advancing; with `@` computed once.
#[inline(always)]
fn slide_plain(
    samples: &[Point],
    starts: &[i64],
    ctx: &Ctx,
    spec: &RangeSpec,
    overlap: &Cell<bool>,
    f: impl Fn(&[Point], &Window) -> Option<f64>,
) -> Vec<Point> {
    let mut points = point_buffers::POOL.take(ctx.points_capacity(samples, spec.range, spec.at.is_some()));
    let (mut lo, mut hi) = (0usize, 0usize);
    let mut pinned: Option<Option<f64>> = None;
    for i in 0..ctx.n {
        let end = spec.end_at(ctx.ts(i));
        let v = match pinned {
            Some(v) => v,
            None => {
                let start = end - spec.range;
                while hi < samples.len() && samples[hi].t <= end {
                    hi += 1;
                }
                while lo < hi && samples[lo].t <= start {
                    lo += 1;
                }
                let mut w = Window::plain(ctx.ts(i), end, spec.range, &[], overlap);
                if !starts.is_empty() {
                    w.st = &starts[lo..hi];
                }
                let v = f(&samples[lo..hi], &w);
                if spec.at.is_some() {
                    pinned = Some(v);
                }
                v
            }
        };
        if let Some(v) = v {
            points.push(Point { t: ctx.ts(i), f: v });
        }
    }
    points
}

/// Calls `f` with each step's window `(end - range, end]` of the float `samples` and of the
/// histograms `hists`, advancing two cursors over each. With `@`, every step has the same
/// window, computed once.
#[allow(clippy::too_many_arguments, reason = "the window's inputs, each needed")]
fn slide<'s>(
    samples: &'s [Point],
    hists: &'s [HPoint],
    starts: Starts<'s>,
    ctx: &Ctx,
    spec: &RangeSpec,
    pin: bool,
    lookback: i64,
    mut f: impl FnMut(&'s [Point], &'s [HPoint], Edges<'s>) -> Option<Out>,
) -> (Vec<Point>, Vec<HPoint>) {
    let mut points = Vec::new();
    let mut hpoints = Vec::new();
    let (mut lo, mut hi) = (0usize, 0usize);
    let (mut hlo, mut hhi) = (0usize, 0usize);
    // With `@`: the pinned float, or the pinned histogram (shared by every step).
    let mut pinned: Option<Option<Result<f64, Arc<strata_model::FloatHistogram>>>> = None;
    for i in 0..ctx.n {
        let end = spec.end_at(ctx.ts(i));
        let v = if let Some(v) = pinned.clone().filter(|_| i > 0) {
            v
        } else {
            let start = end - spec.range;
            while hi < samples.len() && samples[hi].t <= end {
                hi += 1;
            }
            while lo < hi && samples[lo].t <= start {
                lo += 1;
            }
            while hhi < hists.len() && hists[hhi].t <= end {
                hhi += 1;
            }
            while hlo < hhi && hists[hlo].t <= start {
                hlo += 1;
            }
            let before = lo.checked_sub(1).map(|k| samples[k]).filter(|p| p.t > start - lookback);
            let after = samples.get(hi).copied().filter(|p| p.t < end + lookback);
            let hbefore = hlo.checked_sub(1).map(|k| &hists[k]).filter(|p| p.t > start - lookback);
            let hafter = hists.get(hhi).filter(|p| p.t < end + lookback);
            let window_starts = Starts {
                floats: if starts.floats.is_empty() { &[] } else { &starts.floats[lo..hi] },
                hists: if starts.hists.is_empty() { &[] } else { &starts.hists[hlo..hhi] },
            };
            let edges = Edges { end, step: i, before, after, hbefore, hafter, starts: window_starts };
            let v = f(&samples[lo..hi], &hists[hlo..hhi], edges).map(|o| match o {
                Out::Float(f) => Ok(f),
                Out::Hist(h) => Err(h),
            });
            if spec.at.is_some() && pin {
                pinned = Some(v.clone());
            }
            v
        };
        match v {
            Some(Ok(f)) => points.push(Point { t: ctx.ts(i), f }),
            Some(Err(h)) => hpoints.push(HPoint { t: ctx.ts(i), h }),
            None => {}
        }
    }
    (points, hpoints)
}

/// `rate`, `increase` and `delta`: the change over the window, extrapolated towards the
/// window's edges as Prometheus does (up to half an average sample interval when the series
/// seems to start or end inside the window, and never below zero for counters).
#[inline(always)]
fn extrapolated_rate(s: &[Point], w: &Window, is_counter: bool, is_rate: bool) -> Option<f64> {
    if is_counter && !w.st.is_empty() {
        return counter_rate_with_starts(s, w, is_rate);
    }
    let (change, sampled) = change_over(s, is_counter)?;
    Some(change * sampled.factor(w.end, w.range, per_second_divisor(w.range, is_rate)))
}

/// What `rate`, `increase` and `delta` take from a window's samples whatever the window's
/// position: the change (corrected for counter resets) and its extrapolation inputs. None
/// with fewer than two samples.
#[inline(always)]
fn change_over(s: &[Point], is_counter: bool) -> Option<(f64, Sampled)> {
    change_over_with(s, is_counter, is_counter)
}

/// `change_over`, told whether the window may hold a counter reset (`may_reset`: false when
/// the caller knows no sample is below its predecessor, which skips the scan; the result is
/// the same, as the scan would add nothing).
#[inline(always)]
fn change_over_with(s: &[Point], is_counter: bool, may_reset: bool) -> Option<(f64, Sampled)> {
    let result = window_change(s, may_reset)?;
    let (first, last) = (s[0], s[s.len() - 1]);
    // A counter cannot have been below zero: extrapolate at most to where it was zero.
    let zero_at = (is_counter && result > 0.0 && first.f >= 0.0).then(|| first.f / result);
    Some((result, Sampled::new(first.t, last.t, s.len(), zero_at)))
}

/// A count as a double, through `i64`: the same value for any count below 2^63, in one
/// conversion instruction, where baseline x86-64 converts a `u64` by a sequence of five
/// (unpack, subtract, shuffle, add; seen in the annotated window loop of a 30-day average
/// over a rollup tier).
/// No wall-time change was measurable; it is the plainer code for the same value.
#[inline(always)]
pub(super) fn count_as_f64(n: u64) -> f64 {
    debug_assert!(n <= i64::MAX as u64);
    n as i64 as f64
}

/// The divisor that makes a change per second (the range in seconds), or None.
#[inline(always)]
pub(super) fn per_second_divisor(range: i64, per_second: bool) -> Option<f64> {
    per_second.then(|| range as f64 / 1000.0)
}

/// `rate`, `increase` and `delta` over plain windows without `@` or start times: as
/// `slide_plain` with `extrapolated_rate`, every value computed by `extrapolated_rate`'s
/// operations in its order, so every bit is the same.
///
/// The work splits into what depends only on the samples' timestamps and what depends on
/// their values. The first part, a `WindowPlan`, is the walk of windows over the steps
/// (branches that follow the samples' jitter) and the divisions that need only timestamps
/// (Prometheus divides milliseconds by 1000 and the interval by the sample count); it is
/// kept on the thread and reused by the next series whose samples have the same timestamps,
/// as every series of one scrape has (Prometheus stamps a scrape's samples with one time, and
/// a histogram's buckets, a node's CPUs and modes sit next to each other in label order). The
/// second part, per series, is each window's change (its last value less its first when the
/// series has no counter reset; else with the resets its window holds, computed once while
/// consecutive steps' windows hold the same samples) and the two or three divisions
/// that involve it, done over the whole series a vector at a time. Steps whose windows cannot
/// reach two samples are not in the plan.
fn slide_extrapolated(samples: &[Point], ctx: &Ctx, spec: &RangeSpec, is_counter: bool, is_rate: bool) -> Vec<Point> {
    debug_assert!(spec.at.is_none(), "pinned windows go through slide_plain");
    if samples.len() < 2 {
        return Vec::new();
    }
    let mut plan = PLANS.with(|p| p.take()).unwrap_or_default();
    if !plan.is_for(samples, ctx, spec) {
        plan.build(samples, ctx, spec);
    }
    let mut points = point_buffers::POOL.take(plan.steps.len());
    plan.apply(samples, ctx, is_counter, per_second_divisor(spec.range, is_rate), &mut points);
    // A plan grown for a very long series is not kept idle on the thread.
    if plan.times.capacity() <= PLAN_KEPT_SAMPLES_MAX && plan.steps.capacity() <= PLAN_KEPT_SAMPLES_MAX {
        PLANS.with(|p| p.set(Some(plan)));
    }
    points
}

/// The most samples, and planned steps, of a plan kept on a thread between series: 1.1 MiB at
/// most (8 bytes a timestamp, 60 a planned step with its scratch); a day at a 15 s scrape
/// interval is 5,760 samples, a week at 60 s steps 10,080 steps. A longer series makes its
/// plan afresh, as one with other timestamps does.
const PLAN_KEPT_SAMPLES_MAX: usize = 1 << 14;

thread_local! {
    /// The window plan of the last series `slide_extrapolated` evaluated on this thread
    /// (taken out while in use).
    static PLANS: std::cell::Cell<Option<Box<WindowPlan>>> = const { std::cell::Cell::new(None) };
}

/// The windows of two samples or more that a range query's steps make of one series'
/// timestamps, with the part of `extrapolated_rate`'s arithmetic that needs only timestamps
/// done. Valid for any series with the same timestamps, whatever its values. Indexes are
/// `u32` (half the bytes to write and read back per step); `fits` says whether a series and
/// its steps can be planned.
#[derive(Default)]
struct WindowPlan {
    /// What the plan was made for: the steps (`Ctx`), the range and offset, the timestamps.
    key: (i64, i64, usize, i64, i64),
    times: Vec<i64>,
    /// Per planned step (steps whose window holds two samples or more, in order): the step
    /// and its window's samples `lo..hi`.
    steps: Vec<u32>,
    lo: Vec<u32>,
    hi: Vec<u32>,
    /// Seconds from the window's first sample to its last.
    sampled: Vec<f64>,
    /// Seconds the change is extrapolated towards the window's start and towards its end
    /// (each the distance to the edge, or half an average interval past the samples when the
    /// edge is further than 1.1 intervals), before a counter's clamp at zero.
    to_start: Vec<f64>,
    to_end: Vec<f64>,
    /// A series' changes and first values per planned step, and its values: scratch.
    change: Vec<f64>,
    first_f: Vec<f64>,
    values: Vec<f64>,
}

impl WindowPlan {
    fn key(ctx: &Ctx, spec: &RangeSpec) -> (i64, i64, usize, i64, i64) {
        (ctx.start, ctx.step, ctx.n, spec.range, spec.offset)
    }

    /// Whether a series of `samples` over `ctx`'s steps fits a plan's indexes (a window's
    /// sample count less one is converted through `i32`, which vectorizes).
    fn fits(samples: &[Point], ctx: &Ctx) -> bool {
        samples.len() <= i32::MAX as usize && ctx.n <= u32::MAX as usize
    }

    /// Whether the plan holds for `samples` (their timestamps, not their values).
    fn is_for(&self, samples: &[Point], ctx: &Ctx, spec: &RangeSpec) -> bool {
        self.key == Self::key(ctx, spec)
            && self.times.len() == samples.len()
            && samples.iter().zip(&self.times).all(|(p, &t)| p.t == t)
    }

    /// Walks the steps' windows over `samples`' timestamps (two or more, `fits`).
    fn build(&mut self, samples: &[Point], ctx: &Ctx, spec: &RangeSpec) {
        debug_assert!(samples.len() >= 2 && Self::fits(samples, ctx));
        self.key = Self::key(ctx, spec);
        self.times.clear();
        self.times.extend(samples.iter().map(|p| p.t));
        let times = &self.times[..];
        let n = times.len();
        // Windows end at `ts(i) - offset`: the first that can hold the first sample ends at or
        // after it, the last that can hold the last one starts before it.
        let steps_to = |t: i64| (t.saturating_add(spec.offset).saturating_sub(ctx.start)).div_euclid(ctx.step.max(1));
        let from = usize::try_from(steps_to(times[0] - 1) + 1).unwrap_or(0).min(ctx.n);
        let to = usize::try_from(steps_to(times[n - 1].saturating_add(spec.range) - 1) + 1).unwrap_or(0).min(ctx.n);
        // Room for every step, written through slices and cut to the planned ones after (a
        // push stores its vector's length back at every step).
        let room = to.saturating_sub(from);
        for v in [&mut self.steps, &mut self.lo, &mut self.hi] {
            v.resize(room, 0);
        }
        for v in [&mut self.sampled, &mut self.to_start, &mut self.to_end] {
            v.resize(room, 0.0);
        }
        // Each sliced to `room`, so that one comparison of `m` bounds all six stores.
        let (steps, lo_at, hi_at) = (&mut self.steps[..room], &mut self.lo[..room], &mut self.hi[..room]);
        // In milliseconds here; `seconds` below turns them into seconds.
        let (sampled, to_start, to_end) =
            (&mut self.sampled[..room], &mut self.to_start[..room], &mut self.to_end[..room]);
        let (mut lo, mut hi) = (0usize, 0usize);
        let mut m = 0;
        let mut end = spec.end_at(ctx.ts(from));
        for i in from..to {
            let start = end - spec.range;
            while hi < n && times[hi] <= end {
                hi += 1;
            }
            while lo < hi && times[lo] <= start {
                lo += 1;
            }
            // Every step is written at `m`, which moves on only past a window of two samples
            // or more: no branch on the window's size (`m` never passes the step's own slot).
            let (first_t, last_t) = (times[lo.min(n - 1)], times[hi.max(1) - 1]);
            (steps[m], lo_at[m], hi_at[m]) = (i as u32, lo as u32, hi as u32);
            sampled[m] = (last_t - first_t) as f64;
            to_start[m] = (first_t - start) as f64;
            to_end[m] = (end - last_t) as f64;
            m += usize::from(hi - lo >= 2);
            // Wrapping: past the last step the value is not used, and may lie past i64.
            end = end.wrapping_add(ctx.step);
        }
        self.truncate(m);
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2, as just checked.
            unsafe { self.seconds_avx2() };
            return;
        }
        self.seconds();
    }

    /// Keeps the first `m` planned steps.
    fn truncate(&mut self, m: usize) {
        for v in [&mut self.steps, &mut self.lo, &mut self.hi] {
            v.truncate(m);
        }
        for v in [&mut self.sampled, &mut self.to_start, &mut self.to_end] {
            v.truncate(m);
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn seconds_avx2(&mut self) {
        self.seconds()
    }

    /// The timestamp-only arithmetic, from milliseconds to `sampled`, `to_start` and `to_end`.
    #[inline(always)]
    fn seconds(&mut self) {
        let n = self.steps.len();
        let (lo, hi) = (&self.lo[..n], &self.hi[..n]);
        let (sampled, to_start, to_end) = (&mut self.sampled[..n], &mut self.to_start[..n], &mut self.to_end[..n]);
        for k in 0..n {
            // A window's sample count less one (`fits`: below 2^31).
            let gaps = f64::from((hi[k] - lo[k] - 1) as i32);
            (sampled[k], to_start[k], to_end[k]) = edges_in_seconds(sampled[k], gaps, to_start[k], to_end[k]);
        }
    }

    /// The series' points (`samples` must have the plan's timestamps) appended to `points`.
    fn apply(
        &mut self,
        samples: &[Point],
        ctx: &Ctx,
        is_counter: bool,
        per_second: Option<f64>,
        points: &mut Vec<Point>,
    ) {
        debug_assert!(self.times.len() == samples.len());
        let n = self.steps.len();
        // Written through slices zipped with the plan's, not pushed: a push stored each
        // vector's length back at every step (perf: the loop's hottest instructions).
        self.change.resize(n, 0.0);
        self.first_f.resize(n, 0.0);
        let windows = self.lo.iter().zip(&self.hi);
        let outputs = self.change.iter_mut().zip(self.first_f.iter_mut());
        // A counter reset: a sample below the one before it.
        let is_reset = |j: usize| samples[j].f < samples[j - 1].f;
        if !is_counter || !(1..samples.len()).fold(false, |any, j| any | is_reset(j)) {
            // No window holds a reset: each change is its last value less its first.
            for ((&lo, &hi), (change_out, first_out)) in windows.zip(outputs) {
                let (first, last) = (samples[lo as usize].f, samples[hi as usize - 1].f);
                (*change_out, *first_out) = (last - first, first);
            }
        } else {
            // The first reset after `lo`, or the end: a window ending at or before it holds
            // none. It is looked for again only once `lo` has passed it, so all the looking
            // costs one pass; a window's change is computed again only when it differs from
            // the previous planned step's.
            let mut next_reset = 0;
            let (mut change, mut previous) = (0.0, (0, 0));
            for ((&lo, &hi), (change_out, first_out)) in windows.zip(outputs) {
                let (lo, hi) = (lo as usize, hi as usize);
                if (lo, hi) != previous {
                    previous = (lo, hi);
                    if next_reset <= lo {
                        next_reset = lo + 1;
                        while next_reset < samples.len() && !is_reset(next_reset) {
                            next_reset += 1;
                        }
                    }
                    change =
                        window_change(&samples[lo..hi], next_reset < hi).expect("a planned window has two samples");
                }
                *change_out = change;
                *first_out = samples[lo].f;
            }
        }
        self.values.clear();
        self.values.resize(n, 0.0);
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2, as just checked.
            unsafe { self.values_avx2(is_counter, per_second) };
        } else {
            self.values(is_counter, per_second);
        }
        #[cfg(not(target_arch = "x86_64"))]
        self.values(is_counter, per_second);
        points.extend(self.steps.iter().zip(&self.values).map(|(&i, &f)| Point { t: ctx.ts(i as usize), f }));
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn values_avx2(&mut self, is_counter: bool, per_second: Option<f64>) {
        self.values(is_counter, per_second)
    }

    /// `extrapolated_rate`'s arithmetic that involves the values, for every planned step.
    #[inline(always)]
    fn values(&mut self, is_counter: bool, per_second: Option<f64>) {
        let n = self.values.len();
        let (change, first_f) = (&self.change[..n], &self.first_f[..n]);
        let (sampled, to_start, to_end) = (&self.sampled[..n], &self.to_start[..n], &self.to_end[..n]);
        for (i, value) in self.values.iter_mut().enumerate() {
            *value = extrapolated(change[i], first_f[i], (sampled[i], to_start[i], to_end[i]), is_counter, per_second);
        }
    }
}

thread_local! {
    /// A batch kept between calls on a thread (taken out while in use).
    static BATCHES: std::cell::Cell<Option<Box<Batch>>> = const { std::cell::Cell::new(None) };
}

/// This thread's batch, set up for a series (`Batch::reset`); `give_batch` returns it. The
/// batch (3 KiB) is reused from call to call: set up afresh for each series, it cost an
/// instant query (one point per series) more than its point.
pub(super) fn take_batch(is_counter: bool, per_second: Option<f64>) -> Box<Batch> {
    let mut batch = BATCHES.with(|b| b.take()).unwrap_or_else(|| Box::new(Batch::new(false, None)));
    batch.reset(is_counter, per_second);
    batch
}

pub(super) fn give_batch(batch: Box<Batch>) {
    BATCHES.with(|b| b.set(Some(batch)));
}

/// The change of a counter or gauge over a window of samples (a counter's resets added
/// back when `may_reset`), or None for fewer than two samples.
#[inline(always)]
fn window_change(s: &[Point], may_reset: bool) -> Option<f64> {
    if s.len() < 2 {
        return None;
    }
    let mut result = s[s.len() - 1].f - s[0].f;
    if may_reset {
        let mut prev = s[0].f;
        for p in &s[1..] {
            if p.f < prev {
                result += prev;
            }
            prev = p.f;
        }
    }
    Some(result)
}

/// Points a rollup tier's `rate`, `increase` or `delta` gathers before finishing them: enough
/// for whole vectors and overlapping divisions, few enough for the batch to stay in L1.
const BATCH: usize = 64;

/// What `extrapolated_rate` needs of each point of a batch of a tier's buckets, as floats (the
/// millisecond differences are exact in a double), one array per quantity so that `finish`
/// runs down them a vector at a time. (Raw samples go through a `WindowPlan` instead.)
pub(super) struct Batch {
    len: usize,
    is_counter: bool,
    per_second: Option<f64>,
    /// Milliseconds from the first to the last sample of the window.
    sampled_ms: [f64; BATCH],
    /// The window's sample count less one.
    gaps: [f64; BATCH],
    /// The change over the window (resets added back).
    change: [f64; BATCH],
    /// The window's first sample's value.
    first_f: [f64; BATCH],
    /// Milliseconds from the window's start to its first sample, and from its last sample to
    /// its end.
    to_start_ms: [f64; BATCH],
    to_end_ms: [f64; BATCH],
}

impl Batch {
    fn new(is_counter: bool, per_second: Option<f64>) -> Batch {
        Batch {
            len: 0,
            is_counter,
            per_second,
            sampled_ms: [0.0; BATCH],
            gaps: [0.0; BATCH],
            change: [0.0; BATCH],
            first_f: [0.0; BATCH],
            to_start_ms: [0.0; BATCH],
            to_end_ms: [0.0; BATCH],
        }
    }

    /// Adds a point: the window `(end - range, end]` known by its first sample, its last
    /// sample's time and its sample count (`samples`, two or more), whose change is `change`.
    #[inline(always)]
    pub(super) fn push_parts(&mut self, first: Point, last_t: i64, samples: usize, change: f64, end: i64, range: i64) {
        debug_assert!(samples >= 2 && self.len < BATCH);
        let i = self.len;
        self.sampled_ms[i] = (last_t - first.t) as f64;
        self.gaps[i] = count_as_f64((samples - 1) as u64);
        self.change[i] = change;
        self.first_f[i] = first.f;
        self.to_start_ms[i] = (first.t - (end - range)) as f64;
        self.to_end_ms[i] = (end - last_t) as f64;
        self.len += 1;
    }

    /// Whether the batch must be finished before the next push.
    pub(super) fn is_full(&self) -> bool {
        self.len == BATCH
    }

    /// Empties the batch for a series with these parameters.
    pub(super) fn reset(&mut self, is_counter: bool, per_second: Option<f64>) {
        (self.len, self.is_counter, self.per_second) = (0, is_counter, per_second);
    }

    /// Writes the batch's values into the last `len` points and empties it.
    pub(super) fn finish(&mut self, points: &mut [Point]) {
        let n = self.len;
        let mut values = [0.0f64; BATCH];
        let values = &mut values[..n];
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2, as just checked.
            unsafe { self.values_avx2(values) };
        } else {
            self.values(values);
        }
        #[cfg(not(target_arch = "x86_64"))]
        self.values(values);
        let len = points.len();
        let out = &mut points[len - n..];
        for (p, v) in out.iter_mut().zip(values.iter()) {
            p.f = *v;
        }
        self.len = 0;
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn values_avx2(&self, values: &mut [f64]) {
        self.values(values)
    }

    /// `extrapolated_rate`'s arithmetic for the first `values.len()` slots.
    #[inline(always)]
    fn values(&self, values: &mut [f64]) {
        assert!(values.len() <= BATCH);
        for (i, value) in values.iter_mut().enumerate() {
            let edges = edges_in_seconds(self.sampled_ms[i], self.gaps[i], self.to_start_ms[i], self.to_end_ms[i]);
            *value = extrapolated(self.change[i], self.first_f[i], edges, self.is_counter, self.per_second);
        }
    }
}

/// `extrapolated_rate`'s arithmetic that needs only a window's timestamps: from the
/// milliseconds between its first and last sample, its sample count less one (`gaps`) and
/// the milliseconds from its start to the first sample and from the last to its end, the
/// seconds sampled and the seconds to extrapolate towards each edge (the distance, or half an
/// average interval when the edge is further than 1.1 intervals). The same operations in the
/// same order as upstream's, so the same bits.
#[inline(always)]
fn edges_in_seconds(sampled_ms: f64, gaps: f64, to_start_ms: f64, to_end_ms: f64) -> (f64, f64, f64) {
    let sampled = sampled_ms / 1000.0;
    let avg_gap = sampled / gaps;
    let half_gap = avg_gap / 2.0;
    let threshold = avg_gap * 1.1;
    let mut to_start = to_start_ms / 1000.0;
    if to_start >= threshold {
        to_start = half_gap;
    }
    let mut to_end = to_end_ms / 1000.0;
    if to_end >= threshold {
        to_end = half_gap;
    }
    (sampled, to_start, to_end)
}

/// The rest of `extrapolated_rate`: the window's `change` (first value `first_f`) scaled over
/// `edges_in_seconds`' (sampled, to_start, to_end), a counter's extrapolation towards the
/// start stopping where it would reach zero, divided by `per_second` if given.
#[inline(always)]
fn extrapolated(change: f64, first_f: f64, edges: (f64, f64, f64), is_counter: bool, per_second: Option<f64>) -> f64 {
    let (sampled, mut to_start, to_end) = edges;
    // A counter cannot have been below zero: extrapolate at most to where it was.
    let clamps = is_counter & (change > 0.0) & (first_f >= 0.0);
    let to_zero = if clamps { sampled * (first_f / change) } else { f64::INFINITY };
    if to_zero < to_start {
        to_start = to_zero;
    }
    let mut factor = (sampled + to_start + to_end) / sampled;
    if let Some(d) = per_second {
        factor /= d;
    }
    change * factor
}

/// Whether start times say a counter reset between two consecutive samples (`prev_st` and
/// `prev_t`, then `st` and `t`; 0: no start time). Prometheus' rules:
/// - no start time, or one not before its sample (invalid, or OTel's "unknown start"): no;
/// - a start after the previous sample: the counter restarted in between, yes;
/// - a start before the previous sample: the same run, no;
/// - a start exactly at the previous sample: a delta sample (yes) when the previous sample
///   had a valid start time of its own, else a cumulative series of unknown start (no).
pub(super) fn is_start_reset(prev_st: i64, prev_t: i64, st: i64, t: i64) -> bool {
    if st == 0 || st >= t || st < prev_t {
        return false;
    }
    if st > prev_t {
        return true;
    }
    prev_st != 0 && prev_st < prev_t
}

/// Whether a sample's start time `st` lies inside the previous sample's run without being that
/// run's start (`prev_st`): samples that claim overlapping intervals.
pub(super) fn start_overlaps(prev_st: i64, prev_t: i64, st: i64) -> bool {
    st != 0 && st < prev_t && st != prev_st
}

/// `rate`/`increase` of a counter whose samples have start times (`w.st`): resets are also
/// those the start times reveal, and when the first sample's start lies inside the window,
/// the counter is taken to have been zero then, instead of extrapolating towards the window's
/// start. A single sample is then enough.
fn counter_rate_with_starts(s: &[Point], w: &Window, is_rate: bool) -> Option<f64> {
    let (first, last) = (*s.first()?, *s.last()?);
    let st = w.st;
    let mut result = last.f - first.f;
    for i in 1..s.len() {
        let (prev, cur) = (s[i - 1], s[i]);
        if start_overlaps(st[i - 1], prev.t, st[i]) {
            w.overlap.set(true);
        }
        if cur.f < prev.f || is_start_reset(st[i - 1], prev.t, st[i], cur.t) {
            result += prev.f;
        }
    }
    if starts_inside(st[0], first.t, w) {
        result += first.f;
        return Some(result * factor_from_start(st[0], first.t, last.t, s.len(), w, is_rate));
    }
    if s.len() < 2 {
        return None;
    }
    let zero_at = (result > 0.0 && first.f >= 0.0).then(|| first.f / result);
    Some(result * factor_with_zero_clamp(first.t, last.t, s.len(), w, is_rate, zero_at))
}

/// Whether the first sample's start time `st` (of the sample at `first_t`) lies inside the
/// window, before its sample: then the counter counts from zero at `st`.
pub(super) fn starts_inside(st: i64, first_t: i64, w: &Window) -> bool {
    st != 0 && st > w.end - w.range && st < first_t
}

/// The extrapolation factor when the counter started (from zero) at `st`, inside the window:
/// the change is scaled from `[st, last_t]` towards the window's end only (by up to half an
/// average sample interval when the series seems to end inside the window; with one sample,
/// not at all).
pub(super) fn factor_from_start(st: i64, first_t: i64, last_t: i64, n: usize, w: &Window, per_second: bool) -> f64 {
    let avg_gap = if n > 1 { (last_t - first_t) as f64 / 1000.0 / (n - 1) as f64 } else { 0.0 };
    let mut to_end = (w.end - last_t) as f64 / 1000.0;
    if to_end >= avg_gap * 1.1 {
        to_end = avg_gap / 2.0;
    }
    let sampled = (last_t - st) as f64 / 1000.0;
    let mut factor = (sampled + to_end) / sampled;
    if per_second {
        factor /= w.range as f64 / 1000.0;
    }
    factor
}

/// How much the change between the first sample (at `first_t`) and the last (at `last_t`) of
/// `n` samples is scaled to cover the window: towards each edge by up to half an average
/// sample interval when the series seems to start or end inside the window (else to the
/// edge), and per second when `per_second`. With `zero_at`, extrapolation towards the start
/// stops where a counter would reach zero, `zero_at` (a fraction of the sampled interval)
/// before the first sample.
#[inline]
pub(super) fn factor_with_zero_clamp(
    first_t: i64,
    last_t: i64,
    n: usize,
    w: &Window,
    per_second: bool,
    zero_at: Option<f64>,
) -> f64 {
    Sampled::new(first_t, last_t, n, zero_at).factor(w.end, w.range, per_second_divisor(w.range, per_second))
}

/// The part of the extrapolation that depends only on a window's samples (Prometheus'
/// `extrapolatedRate`, split so that it can be reused across steps; each value is computed by
/// the same operations in the same order, so results are bit for bit the same).
#[derive(Debug, Clone, Copy)]
pub(super) struct Sampled {
    first_t: i64,
    last_t: i64,
    /// Seconds between the first and the last sample.
    sampled: f64,
    /// Half the average interval between samples: how far past them the change is
    /// extrapolated when the series seems to start or end inside the window.
    half_gap: f64,
    /// From this distance to an edge on (1.1 average intervals), the series is taken to
    /// start or end inside the window.
    threshold: f64,
    /// Seconds before the first sample where a counter would have been zero.
    to_zero: Option<f64>,
}

impl Sampled {
    #[inline(always)]
    pub(super) fn new(first_t: i64, last_t: i64, n: usize, zero_at: Option<f64>) -> Sampled {
        debug_assert!(n >= 2, "a change needs two samples");
        let sampled = (last_t - first_t) as f64 / 1000.0;
        let avg_gap = sampled / (n - 1) as f64;
        Sampled {
            first_t,
            last_t,
            sampled,
            half_gap: avg_gap / 2.0,
            threshold: avg_gap * 1.1,
            to_zero: zero_at.map(|z| sampled * z),
        }
    }

    /// The factor for the window `(end - range, end]`, divided by `per_second` if given.
    #[inline(always)]
    pub(super) fn factor(&self, end: i64, range: i64, per_second: Option<f64>) -> f64 {
        let mut to_start = (self.first_t - (end - range)) as f64 / 1000.0;
        let mut to_end = (end - self.last_t) as f64 / 1000.0;
        if to_start >= self.threshold {
            to_start = self.half_gap;
        }
        if let Some(to_zero) = self.to_zero {
            if to_zero < to_start {
                to_start = to_zero;
            }
        }
        if to_end >= self.threshold {
            to_end = self.half_gap;
        }
        let mut factor = (self.sampled + to_start + to_end) / self.sampled;
        if let Some(d) = per_second {
            factor /= d;
        }
        factor
    }
}

/// `anchored` and `smoothed` windows (experimental extended range selectors), without
/// extrapolation:
/// - anchored: the window's samples preceded by the last sample at or before its start (the
///   anchor), so `increase` is the change since the value the window started from;
/// - smoothed: the values at the window's start and end are interpolated between the samples
///   either side of them (for counters, across a reset from zero), and stand for the edges.
///
/// `rate` is `increase` over the range; counters are corrected for resets.
fn extended(name: &str, mode: RangeMode, s: &[Point], w: &Window) -> Option<f64> {
    let counter = matches!(name, "rate" | "increase");
    let mut seq: Vec<f64> = Vec::with_capacity(s.len() + 2);
    match mode {
        RangeMode::Anchored => {
            if s.is_empty() {
                return None;
            }
            seq.extend(w.before.map(|p| p.f));
            seq.extend(s.iter().map(|p| p.f));
        }
        _ => {
            let start = w.end - w.range;
            let first_after_start = s.first().copied().or(w.after)?;
            let start_v = match w.before {
                Some(b) => interpolate(b, first_after_start, start, counter),
                None => first_after_start.f,
            };
            let last_before_end = s.last().copied().or(w.before)?;
            let end_v = match w.after {
                Some(a) if last_before_end.t < w.end => interpolate(last_before_end, a, w.end, counter),
                _ => last_before_end.f,
            };
            seq.push(start_v);
            seq.extend(s.iter().map(|p| p.f));
            seq.push(end_v);
        }
    }
    extended_sequence(name, &seq, w)
}

/// `delta`, `increase`, `rate`, `changes` or `resets` over the values of an anchored or
/// smoothed window, edges included (see `extended`).
pub(super) fn extended_sequence(name: &str, seq: &[f64], w: &Window) -> Option<f64> {
    let (first, last) = (*seq.first()?, *seq.last()?);
    Some(match name {
        "delta" => last - first,
        "increase" | "rate" => {
            let mut v = last - first;
            for pair in seq.windows(2) {
                if pair[1] < pair[0] {
                    v += pair[0];
                }
            }
            if name == "rate" {
                v / (w.range as f64 / 1000.0)
            } else {
                v
            }
        }
        "changes" => seq.windows(2).filter(|p| p[1] != p[0] && !(p[0].is_nan() && p[1].is_nan())).count() as f64,
        _ => seq.windows(2).filter(|p| p[1] < p[0]).count() as f64,
    })
}

/// The value at `t` between samples `a` and `b`; a counter that reset in between rose from
/// zero to `b`.
fn interpolate(a: Point, b: Point, t: i64, counter: bool) -> f64 {
    if b.t == a.t {
        return b.f;
    }
    let frac = (t - a.t) as f64 / (b.t - a.t) as f64;
    let from = if counter && b.f < a.f { 0.0 } else { a.f };
    from + (b.f - from) * frac
}

/// `irate` and `idelta`: from the last two samples (for `irate`, a reset by value or by start
/// time leaves the last value as the increase).
fn instant_value(s: &[Point], w: &Window, is_rate: bool) -> Option<f64> {
    if s.len() < 2 {
        return None;
    }
    let n = s.len();
    let (prev, last) = (s[n - 2], s[n - 1]);
    let reset = last.f < prev.f || (!w.st.is_empty() && is_start_reset(w.st[n - 2], prev.t, w.st[n - 1], last.t));
    let mut v = if is_rate && reset { last.f } else { last.f - prev.f };
    if is_rate {
        let dt = (last.t - prev.t) as f64 / 1000.0;
        if dt == 0.0 {
            return None;
        }
        v /= dt;
    }
    Some(v)
}

/// Least-squares slope and intercept at `intercept_t`, with compensated sums.
fn linear_regression(s: &[Point], intercept_t: i64) -> (f64, f64) {
    let (mut n, mut sx, mut cx, mut sy, mut cy, mut sxy, mut cxy, mut sx2, mut cx2) =
        (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    let init = s[0].f;
    let mut constant = true;
    for (i, p) in s.iter().enumerate() {
        if constant && i > 0 && p.f != init {
            constant = false;
        }
        n += 1.0;
        let x = (p.t - intercept_t) as f64 / 1000.0;
        (sx, cx) = kahan_inc(x, sx, cx);
        (sy, cy) = kahan_inc(p.f, sy, cy);
        (sxy, cxy) = kahan_inc(x * p.f, sxy, cxy);
        (sx2, cx2) = kahan_inc(x * x, sx2, cx2);
    }
    if constant {
        if init.is_infinite() {
            return (f64::NAN, f64::NAN);
        }
        return (0.0, init);
    }
    let (sx, sy, sxy, sx2) = (sx + cx, sy + cy, sxy + cxy, sx2 + cx2);
    let cov = sxy - sx * sy / n;
    let var = sx2 - sx * sx / n;
    let slope = cov / var;
    (slope, sy / n - slope * sx / n)
}

fn deriv(s: &[Point], _: &Window) -> Option<f64> {
    if s.len() < 2 {
        return None;
    }
    Some(linear_regression(s, s[0].t).0)
}

fn predict_linear(s: &[Point], w: &Window) -> Option<f64> {
    if s.len() < 2 {
        return None;
    }
    let (slope, intercept) = linear_regression(s, w.t);
    Some(intercept + slope * w.params[0])
}

fn avg_over_time(s: &[Point], _: &Window) -> Option<f64> {
    let first = s.first()?;
    let (mut sum, mut count, mut mean, mut c) = (first.f, 1.0, 0.0, 0.0);
    let mut incremental = false;
    for (i, p) in s[1..].iter().enumerate() {
        count = (i + 2) as f64;
        if !incremental {
            let (ns, nc) = kahan_inc(p.f, sum, c);
            if !ns.is_infinite() {
                sum = ns;
                c = nc;
                continue;
            }
            incremental = true;
            mean = sum / (count - 1.0);
            c /= count - 1.0;
        }
        let q = (count - 1.0) / count;
        (mean, c) = kahan_inc(p.f / count, q * mean, q * c);
    }
    Some(if incremental { mean + c } else { sum / count + c / count })
}

fn sum_over_time(s: &[Point], _: &Window) -> Option<f64> {
    if s.is_empty() {
        return None;
    }
    let (mut sum, mut c) = (0.0, 0.0);
    for p in s {
        (sum, c) = kahan_inc(p.f, sum, c);
    }
    Some(if sum.is_infinite() { sum } else { sum + c })
}

/// The min or max; NaN only when every value is NaN.
fn extreme(s: &[Point], replaces: fn(f64, f64) -> bool) -> Option<f64> {
    let mut cur = s.first()?.f;
    for p in &s[1..] {
        if replaces(cur, p.f) || cur.is_nan() {
            cur = p.f;
        }
    }
    Some(cur)
}

fn ts_of_extreme(s: &[Point], replaces: fn(f64, f64) -> bool) -> Option<f64> {
    let mut cur = *s.first()?;
    for p in &s[1..] {
        if replaces(cur.f, p.f) || cur.f.is_nan() {
            cur = *p;
        }
    }
    Some(cur.t as f64 / 1000.0)
}

fn variance(s: &[Point]) -> Option<f64> {
    if s.is_empty() {
        return None;
    }
    let (mut count, mut mean, mut cmean, mut aux, mut caux) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for p in s {
        count += 1.0;
        let delta = p.f - (mean + cmean);
        (mean, cmean) = kahan_inc(delta / count, mean, cmean);
        (aux, caux) = kahan_inc(delta * (p.f - (mean + cmean)), aux, caux);
    }
    Some((aux + caux) / count)
}

fn quantile_over_time(s: &[Point], w: &Window) -> Option<f64> {
    if s.is_empty() {
        return None;
    }
    let mut v: Vec<f64> = s.iter().map(|p| p.f).collect();
    Some(quantile(w.params[0], &mut v))
}

fn mad_over_time(s: &[Point], _: &Window) -> Option<f64> {
    if s.is_empty() {
        return None;
    }
    if s.iter().any(|p| p.f.is_nan()) {
        return Some(f64::NAN);
    }
    let mut v: Vec<f64> = s.iter().map(|p| p.f).collect();
    let median = quantile(0.5, &mut v);
    let mut dev: Vec<f64> = s.iter().map(|p| (p.f - median).abs()).collect();
    Some(quantile(0.5, &mut dev))
}

fn changes(s: &[Point], _: &Window) -> Option<f64> {
    let first = s.first()?;
    let mut prev = first.f;
    let mut n = 0.0;
    for p in &s[1..] {
        if p.f != prev && !(p.f.is_nan() && prev.is_nan()) {
            n += 1.0;
        }
        prev = p.f;
    }
    Some(n)
}

/// Counter resets in the window: by value, and by start time when the samples have them.
fn resets(s: &[Point], w: &Window) -> Option<f64> {
    s.first()?;
    let by_start = |i: usize| !w.st.is_empty() && is_start_reset(w.st[i - 1], s[i - 1].t, w.st[i], s[i].t);
    Some((1..s.len()).filter(|&i| s[i].f < s[i - 1].f || by_start(i)).count() as f64)
}

fn double_exponential_smoothing(s: &[Point], w: &Window) -> Option<f64> {
    if s.len() < 2 {
        return None;
    }
    let (sf, tf) = (w.params[0], w.params[1]);
    let (mut s0, mut s1) = (0.0, s[0].f);
    let mut b = s[1].f - s[0].f;
    for (i, p) in s.iter().enumerate().skip(1) {
        let x = sf * p.f;
        if i > 1 {
            b = tf * (s1 - s0) + (1.0 - tf) * b;
        }
        let y = (1.0 - sf) * (s1 + b);
        s0 = s1;
        s1 = x + y;
    }
    Some(s1)
}

/// The value of a `smoothed` instant selector at `t`: interpolated between the samples either
/// side of `t` (each within the lookback), or the one that exists. `j` is the number of
/// samples at or before `t`.
pub(super) fn smoothed_value(samples: &[Point], j: usize, t: i64, lookback: i64) -> Option<f64> {
    let before = (j > 0).then(|| samples[j - 1]).filter(|p| p.t > t - lookback && !strata_model::is_stale_nan(p.f));
    let after = samples.get(j).copied().filter(|p| p.t < t + lookback && !strata_model::is_stale_nan(p.f));
    match (before, after) {
        (Some(b), _) if b.t == t => Some(b.f),
        (Some(b), Some(a)) => Some(interpolate(b, a, t, false)),
        (Some(b), None) => Some(b.f),
        (None, Some(a)) => Some(a.f),
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pts(v: &[(i64, f64)]) -> Vec<Point> {
        v.iter().map(|&(t, f)| Point { t, f }).collect()
    }

    #[test]
    fn rate_extrapolates_like_prometheus() {
        // 0, 10, 20 … at 1 m over a 5 m window ending at 5 m: samples at 1..5 m.
        let s = pts(&[(60_000, 10.0), (120_000, 20.0), (180_000, 30.0), (240_000, 40.0), (300_000, 50.0)]);
        let o = Cell::new(false);
        let w = Window::plain(300_000, 300_000, 300_000, &[], &o);
        // The counter would reach zero at 0 m, exactly the window start: increase is 50.
        assert_eq!(extrapolated_rate(&s, &w, true, false), Some(50.0));
        assert!((extrapolated_rate(&s, &w, true, true).unwrap() - 50.0 / 300.0).abs() < 1e-12);
    }

    #[test]
    fn counter_resets_are_added_back() {
        let s = pts(&[(0, 5.0), (1000, 7.0), (2000, 1.0)]);
        let o = Cell::new(false);
        let w = Window::plain(2000, 2000, 2000, &[], &o);
        // 7 - 5 + 1 = 3 over the whole (exactly covered) window.
        assert_eq!(extrapolated_rate(&s, &w, true, false), Some(3.0));
        assert_eq!(resets(&s, &w), Some(1.0));
        assert_eq!(changes(&s, &w), Some(2.0));
    }

    #[test]
    fn start_time_resets_follow_the_otel_rules() {
        // (prev_st, prev_t, st, t) → reset?
        let cases = [
            ((0, 1000, 0, 2000), false),       // no start times
            ((500, 1000, 500, 2000), false),   // cumulative: the same start
            ((500, 1000, 1500, 2000), true),   // restarted after the previous sample
            ((500, 1000, 900, 2000), false),   // a start before the previous sample: same run
            ((500, 1000, 1000, 2000), true),   // delta: starts at the previous sample
            ((0, 1000, 1000, 2000), false),    // cumulative of unknown start (OTel)
            ((1000, 1000, 1000, 2000), false), // the previous start unknown (= its time)
            ((1500, 1000, 1000, 2000), false), // the previous start invalid (after its sample)
            ((500, 1000, 2000, 2000), false),  // a start at its own sample: unknown start
            ((500, 1000, 2500, 2000), false),  // a start after its sample: invalid
        ];
        for ((prev_st, prev_t, st, t), want) in cases {
            assert_eq!(is_start_reset(prev_st, prev_t, st, t), want, "{prev_st} {prev_t} {st} {t}");
        }
        // Overlap: a start inside the previous run that is not the run's own start.
        assert!(start_overlaps(500, 1000, 900));
        assert!(!start_overlaps(500, 1000, 500) && !start_overlaps(500, 1000, 1000) && !start_overlaps(0, 1000, 0));
    }

    #[test]
    fn a_start_inside_the_window_replaces_extrapolation_towards_its_start() {
        let o = Cell::new(false);
        // One sample of 6 at 60 s that started at 30 s, window (10 s, 60 s]: 6 since 30 s.
        let s = pts(&[(60_000, 6.0)]);
        let mut w = Window::plain(60_000, 60_000, 50_000, &[], &o);
        w.st = &[30_000];
        assert_eq!(extrapolated_rate(&s, &w, true, false), Some(6.0));
        assert_eq!(extrapolated_rate(&s, &w, true, true), Some(6.0 / 50.0));
        // A start at the window's (exclusive) start is outside: one sample gives nothing.
        w.st = &[10_000];
        assert_eq!(extrapolated_rate(&s, &w, true, false), None);
        // Not for gauges: delta ignores start times.
        w.st = &[30_000];
        assert_eq!(extrapolated_rate(&s, &w, false, false), None);
        assert!(!o.get());
    }

    #[test]
    fn regression_of_a_line() {
        let s = pts(&[(0, 1.0), (1000, 3.0), (2000, 5.0)]);
        let o = Cell::new(false);
        let w = Window::plain(2000, 2000, 3000, &[1.0], &o);
        assert_eq!(deriv(&s, &w), Some(2.0));
        assert_eq!(predict_linear(&s, &w), Some(7.0));
    }

    /// Prometheus' `extrapolatedRate` for floats, written out as upstream has it, to hold the
    /// split `change_over` / `Sampled::factor` to the same bits.
    fn upstream_rate(s: &[Point], end: i64, range: i64, is_counter: bool, is_rate: bool) -> Option<f64> {
        if s.len() < 2 {
            return None;
        }
        let (first, last) = (s[0], s[s.len() - 1]);
        let range_start = end - range;
        let mut result = last.f - first.f;
        if is_counter {
            for w in s.windows(2) {
                if w[1].f < w[0].f {
                    result += w[0].f;
                }
            }
        }
        let mut to_start = (first.t - range_start) as f64 / 1000.0;
        let mut to_end = (end - last.t) as f64 / 1000.0;
        let sampled = (last.t - first.t) as f64 / 1000.0;
        let avg = sampled / (s.len() - 1) as f64;
        if to_start >= avg * 1.1 {
            to_start = avg / 2.0;
        }
        if is_counter && result > 0.0 && first.f >= 0.0 {
            let to_zero = sampled * (first.f / result);
            if to_zero < to_start {
                to_start = to_zero;
            }
        }
        if to_end >= avg * 1.1 {
            to_end = avg / 2.0;
        }
        let mut factor = (sampled + to_start + to_end) / sampled;
        if is_rate {
            factor /= range as f64 / 1000.0;
        }
        Some(result * factor)
    }

    /// The vector build of a batch's arithmetic gives the scalar one's bits, also in the
    /// slots a window's counter clamp, thresholds or gauge paths decide.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn a_batch_computes_the_same_bits_with_and_without_avx2() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            return;
        }
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..200 {
            let mut batch = Batch::new(round % 2 == 0, (round % 3 != 0).then_some(300.0));
            for i in 0..BATCH {
                batch.sampled_ms[i] = (next() % 600_000 + 1) as f64;
                batch.gaps[i] = (next() % 40 + 1) as f64;
                batch.change[i] = (next() % 2_000_000) as f64 / 7.0 - 1000.0;
                batch.first_f[i] = (next() % 1_000_000) as f64 / 3.0 - 10.0;
                batch.to_start_ms[i] = (next() % 400_000) as f64;
                batch.to_end_ms[i] = (next() % 400_000) as f64;
            }
            let (mut scalar, mut vector) = ([0.0; BATCH], [0.0; BATCH]);
            batch.values(&mut scalar);
            // SAFETY: the CPU has AVX2, as checked above.
            unsafe { batch.values_avx2(&mut vector) };
            assert_eq!(scalar.map(f64::to_bits), vector.map(f64::to_bits));
        }
    }

    /// Counter-like values made of `values`: increments, reset to zero where a value is below
    /// 1% of the range (rare resets, so most windows hold none; else most hold several).
    fn counter_like(values: &[f64]) -> Vec<f64> {
        let mut total = 0.0;
        values
            .iter()
            .map(|&f| {
                if f < 1e4 {
                    total = 0.0;
                } else {
                    total += f;
                }
                total
            })
            .collect()
    }

    /// Upstream's formula at every step, for the steps it gives a value: (time, bits).
    fn upstream_slide(
        samples: &[Point],
        ctx: &Ctx,
        spec: &RangeSpec,
        is_counter: bool,
        is_rate: bool,
    ) -> Vec<(i64, u64)> {
        let mut want = Vec::new();
        for i in 0..ctx.n {
            let end = spec.end_at(ctx.ts(i));
            let window: Vec<Point> = samples.iter().copied().filter(|p| p.t > end - spec.range && p.t <= end).collect();
            if let Some(f) = upstream_rate(&window, end, spec.range, is_counter, is_rate) {
                want.push((ctx.ts(i), f.to_bits()));
            }
        }
        want
    }

    fn bits(points: &[Point]) -> Vec<(i64, u64)> {
        points.iter().map(|p| (p.t, p.f.to_bits())).collect()
    }

    proptest::proptest! {
        /// Sliding with the sample-only part reused across steps gives, at every step, the
        /// bits upstream's formula gives for that step's window.
        #[test]
        fn slide_extrapolated_matches_upstream_bit_for_bit(
            gaps in proptest::collection::vec(1i64..200_000, 0..40),
            values in proptest::collection::vec(-5.0f64..1e6, 40),
            step in 1_000i64..120_000,
            range in 1_000i64..600_000,
            offset in 0i64..100_000,
            fun in 0usize..3,
            counter in proptest::bool::ANY,
        ) {
            let mut t = 0;
            let values = if counter { counter_like(&values) } else { values };
            let samples: Vec<Point> = gaps.iter().zip(&values).map(|(g, &f)| { t += g; Point { t, f } }).collect();
            let ctx = Ctx { start: -50_000, step, n: (t / step + 20) as usize };
            let spec = RangeSpec { range, offset, at: None, mode: RangeMode::Plain };
            let (is_counter, is_rate) = [(true, true), (true, false), (false, false)][fun];
            let got = slide_extrapolated(&samples, &ctx, &spec, is_counter, is_rate);
            proptest::prop_assert_eq!(bits(&got), upstream_slide(&samples, &ctx, &spec, is_counter, is_rate));
        }

        /// Series evaluated one after another on a thread, as a query's series are: the window
        /// plan made for one is reused by the next with the same timestamps (other values,
        /// another function) and made again when the timestamps, the steps or the range
        /// differ; every answer has upstream's bits.
        #[test]
        fn series_sharing_timestamps_share_a_plan_and_keep_upstreams_bits(
            gaps in proptest::collection::vec(1i64..200_000, 2..40),
            values in proptest::collection::vec(-5.0f64..1e6, 40),
            others in proptest::collection::vec(-5.0f64..1e6, 40),
            steps in (1_000i64..120_000, 1_000i64..120_000),
            ranges in (1_000i64..600_000, 1_000i64..600_000),
            offset in 0i64..100_000,
            moved in 0usize..40,
        ) {
            let mut t = 0;
            let times: Vec<i64> = gaps.iter().map(|g| { t += g; t }).collect();
            let series = |times: &[i64], values: &[f64]| -> Vec<Point> {
                times.iter().zip(values).map(|(&t, &f)| Point { t, f }).collect()
            };
            let a = series(&times, &counter_like(&values));
            let b = series(&times, &others);
            // One sample a millisecond later (its neighbours are at least 1 ms away).
            let mut moved_times = times.clone();
            let m = moved % times.len();
            moved_times[m] += if m + 1 < times.len() && times[m + 1] == times[m] + 1 { 0 } else { 1 };
            let c = series(&moved_times, &counter_like(&others));
            let ctx = |step: i64| Ctx { start: -50_000, step, n: (t / step + 20) as usize };
            let spec = |range: i64| RangeSpec { range, offset, at: None, mode: RangeMode::Plain };
            let runs = [
                (&a, ctx(steps.0), spec(ranges.0), (true, true)),
                (&b, ctx(steps.0), spec(ranges.0), (false, false)),
                (&a, ctx(steps.0), spec(ranges.0), (true, false)),
                (&a, ctx(steps.1), spec(ranges.0), (true, true)),
                (&b, ctx(steps.1), spec(ranges.1), (false, false)),
                (&c, ctx(steps.1), spec(ranges.1), (true, true)),
                (&a, ctx(steps.1), spec(ranges.1), (true, true)),
            ];
            for (samples, ctx, spec, (is_counter, is_rate)) in runs {
                let got = slide_extrapolated(samples, &ctx, &spec, is_counter, is_rate);
                proptest::prop_assert_eq!(bits(&got), upstream_slide(samples, &ctx, &spec, is_counter, is_rate));
            }
        }
    }
}
