//! Range functions over windows that hold native histograms.
//!
//! A window may hold floats, histograms, or both. Functions defined on histograms (`rate`,
//! `increase`, `delta`, `irate`, `idelta`, `sum_over_time`, `avg_over_time`) compute a
//! histogram and refuse a mixed window with a warning; functions about samples whatever their
//! kind (`count_over_time`, `last_over_time`, `changes`, …) take both; float-only functions
//! use the floats and say (as an info) that histograms were ignored.

use std::sync::Arc;

use strata_model::histogram::{HistogramMean, KahanSum};
use strata_model::{CounterResetHint, FloatHistogram, HistogramError};

use super::range_functions::{
    factor_from_start, factor_with_zero_clamp, is_start_reset, start_overlaps, starts_inside, Window,
};
use super::Evaluator;
use crate::value::{HPoint, Point};

/// A range function's value at one step.
pub(super) enum Out {
    Float(f64),
    /// Shared: `last_over_time` and the like hand out a stored histogram as it is.
    Hist(Arc<FloatHistogram>),
}

impl Out {
    fn hist(h: FloatHistogram) -> Out {
        Out::Hist(Arc::new(h))
    }
}

/// Where annotations go, and what they name.
pub(super) struct Notes<'a> {
    pub ev: &'a Evaluator<'a>,
    /// Position of the range argument in the query.
    pub pos: usize,
    /// The series' metric name ("" when it has none).
    pub metric: &'a str,
}

impl Notes<'_> {
    fn mixed(&self) {
        self.ev.warn(self.pos, format!("encountered a mix of histograms and floats for metric name {:?}", self.metric));
    }

    fn mixed_schemas(&self) {
        self.ev.warn(
            self.pos,
            format!(
                "vector contains a mix of histograms with exponential and custom buckets schemas for metric name {:?}",
                self.metric
            ),
        );
    }

    /// Reports what an addition or subtraction noticed, or its failure (returns false then).
    fn combined(&self, r: Result<strata_model::histogram::Combined, HistogramError>, op: &str) -> bool {
        match r {
            Ok(c) => {
                if c.custom_bounds_reconciled {
                    self.ev.info(self.pos, format!("mismatched custom buckets were reconciled during {op}"));
                }
                true
            }
            Err(_) => {
                self.mixed_schemas();
                false
            }
        }
    }
}

/// The value of range function `name` over a window with histograms; `float_fn` is the
/// function's float version, for float-only functions.
pub(super) fn eval(
    name: &str,
    float_fn: fn(&[Point], &Window) -> Option<f64>,
    floats: &[Point],
    hists: &[HPoint],
    w: &Window,
    notes: &Notes,
) -> Option<Out> {
    debug_assert!(!hists.is_empty());
    match name {
        "rate" | "increase" | "delta" => {
            if !floats.is_empty() {
                notes.mixed();
                return None;
            }
            rate(hists, w, name != "delta", name == "rate", notes).map(Out::hist)
        }
        "irate" | "idelta" => instant(floats, hists, w, name == "irate", notes),
        "sum_over_time" | "avg_over_time" => {
            if !floats.is_empty() {
                notes.mixed();
                return None;
            }
            if name == "sum_over_time" {
                sum(hists, notes).map(Out::hist)
            } else {
                mean(hists, notes).map(Out::hist)
            }
        }
        "count_over_time" => Some(Out::Float((floats.len() + hists.len()) as f64)),
        "present_over_time" => Some(Out::Float(1.0)),
        "last_over_time" | "ts_of_last_over_time" => {
            let h = hists.last().expect("not empty");
            let later_float = floats.last().filter(|f| f.t > h.t);
            Some(match (name, later_float) {
                ("last_over_time", Some(f)) => Out::Float(f.f),
                ("last_over_time", None) => Out::Hist(h.h.clone()),
                (_, f) => Out::Float(f.map_or(h.t, |f| f.t) as f64 / 1000.0),
            })
        }
        "first_over_time" | "ts_of_first_over_time" => {
            let h = &hists[0];
            let earlier_float = floats.first().filter(|f| f.t < h.t);
            Some(match (name, earlier_float) {
                ("first_over_time", Some(f)) => Out::Float(f.f),
                ("first_over_time", None) => Out::Hist(h.h.clone()),
                (_, f) => Out::Float(f.map_or(h.t, |f| f.t) as f64 / 1000.0),
            })
        }
        "changes" | "resets" => Some(Out::Float(changes_or_resets(floats, hists, w.st, w.hst, name == "resets"))),
        _ => {
            // Float-only functions.
            if floats.is_empty() {
                return None;
            }
            notes.ev.info(
                notes.pos,
                format!(
                    "ignored histograms in a range containing both floats and histograms for metric name {:?}",
                    notes.metric
                ),
            );
            float_fn(floats, w).map(Out::Float)
        }
    }
}

/// Warns when a counter function meets a gauge histogram, or a gauge function (`delta`) a
/// window that does not start and end with gauge histograms.
fn check_kind(hs: &[&FloatHistogram], counter: bool, notes: &Notes) {
    if counter {
        if hs.iter().any(|h| h.hint == CounterResetHint::Gauge) {
            notes.ev.warn(notes.pos, format!("this native histogram metric is not a counter: {:?}", notes.metric));
        }
    } else if hs[0].hint != CounterResetHint::Gauge || hs[hs.len() - 1].hint != CounterResetHint::Gauge {
        notes.ev.warn(notes.pos, format!("this native histogram metric is not a gauge: {:?}", notes.metric));
    }
}

/// The change over `hs` (at least one histogram), a gauge histogram. For a gauge: last minus
/// first. For a counter: summed pair by pair, each pair adding the difference of its samples,
/// or after a counter reset the later sample itself, so samples on either side of a reset
/// never meet (a counter that switched between exponential and custom buckets, a reset, still
/// has a change). `by_counts(i)` says the pair `i, i+1` is judged by its counts alone, whatever
/// the later sample's reset hint says; `reset_by_start(i)` that start times say it reset.
fn change(
    hs: &[&FloatHistogram],
    counter: bool,
    by_counts: impl Fn(usize) -> bool,
    reset_by_start: impl Fn(usize) -> bool,
    notes: &Notes,
) -> Option<FloatHistogram> {
    let pairs: Vec<(usize, &FloatHistogram, &FloatHistogram)> = if counter {
        hs.windows(2).enumerate().map(|(i, p)| (i, p[0], p[1])).collect()
    } else {
        vec![(0, hs[0], hs[hs.len() - 1])]
    };
    let mut total: Option<FloatHistogram> = None;
    if pairs.is_empty() {
        // A single sample: no change.
        let mut zero = hs[0].clone();
        zero.mul(0.0);
        total = Some(zero);
    }
    for (i, prev, cur) in pairs {
        let mut delta = cur.clone();
        let reset = counter
            && (reset_by_start(i) || if by_counts(i) { cur.counts_decreased(prev) } else { cur.detect_reset(prev) });
        if !reset && !notes.combined(delta.sub(prev), "subtraction") {
            return None;
        }
        match &mut total {
            None => total = Some(delta),
            Some(c) => {
                if !notes.combined(c.add(&delta), "addition") {
                    return None;
                }
            }
        }
    }
    let mut h = total.expect("a change was computed");
    h.hint = CounterResetHint::Gauge;
    h.compact();
    Some(h)
}

/// `rate`, `increase` (counters) and `delta` (gauges) of histograms, extrapolated like
/// floats. The change is summed pair by pair: the difference of two samples, or for a counter
/// that reset, the later sample itself. Summed that way, samples on either side of a reset
/// never meet, so a counter that switched between exponential and custom buckets (a reset)
/// still has a rate, made of the samples after the switch. A counter's start times (as for
/// floats) reveal resets too, and a first start inside the window is where it counted from zero.
fn rate(s: &[HPoint], w: &Window, counter: bool, per_second: bool, notes: &Notes) -> Option<FloatHistogram> {
    let first = s.first()?;
    let st = if counter { w.hst } else { &[] };
    let from_start = !st.is_empty() && starts_inside(st[0], first.t, w);
    if s.len() < 2 && !from_start {
        return None;
    }
    let hs: Vec<&FloatHistogram> = s.iter().map(|p| &*p.h).collect();
    check_kind(&hs, counter, notes);
    if (1..st.len()).any(|i| start_overlaps(st[i - 1], s[i - 1].t, st[i])) {
        w.overlap.set(true);
    }
    let by_start = |i: usize| !st.is_empty() && is_start_reset(st[i], s[i].t, st[i + 1], s[i + 1].t);
    let mut h = change(&hs, counter, |_| false, by_start, notes)?;
    let (first_t, last_t) = (first.t, s[s.len() - 1].t);
    let factor = if from_start {
        if !notes.combined(h.add(&first.h), "addition") {
            return None;
        }
        factor_from_start(st[0], first_t, last_t, s.len(), w, per_second)
    } else {
        // A counter cannot have been below zero: extrapolation towards the window's start
        // stops where its count would reach zero.
        let zero_at = (counter && h.count > 0.0 && first.h.count >= 0.0).then(|| first.h.count / h.count);
        factor_with_zero_clamp(first_t, last_t, s.len(), w, per_second, zero_at)
    };
    h.mul(factor);
    Some(h)
}

/// `irate` / `idelta` from the last two samples, which must both be histograms (or both
/// floats); a reset by start time counts as one.
fn instant(floats: &[Point], hists: &[HPoint], w: &Window, per_second: bool, notes: &Notes) -> Option<Out> {
    // The last two samples of either kind, with their start times.
    let start = |starts: &[i64], i: usize| starts.get(i).copied().unwrap_or(0);
    let mut last_two: Vec<(i64, Option<&Arc<FloatHistogram>>, f64, i64)> = Vec::with_capacity(4);
    let (nf, nh) = (floats.len(), hists.len());
    last_two.extend((nf.saturating_sub(2)..nf).map(|i| (floats[i].t, None, floats[i].f, start(w.st, i))));
    last_two.extend((nh.saturating_sub(2)..nh).map(|i| (hists[i].t, Some(&hists[i].h), 0.0, start(w.hst, i))));
    last_two.sort_by_key(|x| std::cmp::Reverse(x.0));
    if last_two.len() < 2 {
        return None;
    }
    let (last, prev) = (last_two[0], last_two[1]);
    let start_reset = is_start_reset(prev.3, prev.0, last.3, last.0);
    match (prev.1, last.1) {
        (None, None) => {
            let v = if per_second && (last.2 < prev.2 || start_reset) { last.2 } else { last.2 - prev.2 };
            let dt = (last.0 - prev.0) as f64 / 1000.0;
            Some(Out::Float(if per_second { v / dt } else { v }))
        }
        (Some(p), Some(l)) => {
            if per_second && (p.hint == CounterResetHint::Gauge || l.hint == CounterResetHint::Gauge) {
                notes.ev.warn(notes.pos, format!("this native histogram metric is not a counter: {:?}", notes.metric));
            }
            if !per_second && (p.hint != CounterResetHint::Gauge || l.hint != CounterResetHint::Gauge) {
                notes.ev.warn(notes.pos, format!("this native histogram metric is not a gauge: {:?}", notes.metric));
            }
            let mut h = (**l).clone();
            // After a counter reset, irate uses the last histogram as it is.
            let reset = per_second && (start_reset || l.detect_reset(p));
            if !reset && !notes.combined(h.sub(p), "subtraction") {
                return None;
            }
            h.hint = CounterResetHint::Gauge;
            h.compact();
            if per_second {
                h.div((last.0 - prev.0) as f64 / 1000.0);
            }
            Some(Out::hist(h))
        }
        _ => {
            notes.mixed();
            None
        }
    }
}

/// Warns when the histograms summed say both "counter reset" and "no counter reset": adding
/// them mixes counts from before and after a reset.
fn check_reset_conflict(s: &[HPoint], notes: &Notes) {
    let has = |hint| s.iter().any(|p| p.h.hint == hint);
    if has(CounterResetHint::Reset) && has(CounterResetHint::NotReset) {
        notes.ev.warn(notes.pos, "conflicting counter resets during histogram aggregation");
    }
}

fn sum(s: &[HPoint], notes: &Notes) -> Option<FloatHistogram> {
    fold(s, notes, KahanSum::new, KahanSum::add, KahanSum::result)
}

fn mean(s: &[HPoint], notes: &Notes) -> Option<FloatHistogram> {
    fold(s, notes, HistogramMean::new, HistogramMean::add, HistogramMean::result)
}

/// Folds the histograms of a window with an accumulator (a compensated sum or mean); None
/// when two cannot be added (a warning says why).
fn fold<A>(
    s: &[HPoint],
    notes: &Notes,
    new: fn(&FloatHistogram) -> A,
    add: fn(&mut A, &FloatHistogram) -> Result<strata_model::histogram::Combined, HistogramError>,
    result: fn(&A) -> FloatHistogram,
) -> Option<FloatHistogram> {
    check_reset_conflict(s, notes);
    let mut acc = new(&s[0].h);
    for p in &s[1..] {
        if !notes.combined(add(&mut acc, &p.h), "aggregation") {
            return None;
        }
    }
    let mut h = result(&acc);
    h.compact();
    Some(h)
}

/// The samples just outside a window, of both kinds (anchored and smoothed windows read them).
pub(super) struct Edges<'a> {
    pub before: Option<Point>,
    pub after: Option<Point>,
    pub hbefore: Option<&'a HPoint>,
    pub hafter: Option<&'a HPoint>,
}

/// A sample of either kind, by reference.
#[derive(Clone)]
enum Sample<'a> {
    F(f64),
    H(std::borrow::Cow<'a, FloatHistogram>),
}

/// The later (or, with `earlier`, the earlier) of a float and a histogram sample.
fn pick<'a>(f: Option<Point>, h: Option<&'a HPoint>, earlier: bool) -> Option<(i64, Sample<'a>)> {
    let f = f.map(|p| (p.t, Sample::F(p.f)));
    let h = h.map(|p| (p.t, Sample::H(std::borrow::Cow::Borrowed(&*p.h))));
    match (f, h) {
        (Some(a), Some(b)) => Some(if (a.0 < b.0) == earlier { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// The value at `t` between samples `a` and `b` (same kind): linear, and for a counter that
/// reset in between, rising from zero to `b`. None (after a warning) across kinds or bucket
/// schemas.
fn interpolate<'a>(
    a: &(i64, Sample<'a>),
    b: &(i64, Sample<'a>),
    t: i64,
    counter: bool,
    notes: &Notes,
) -> Option<Sample<'a>> {
    if b.0 == a.0 {
        return Some(b.1.clone());
    }
    let frac = (t - a.0) as f64 / (b.0 - a.0) as f64;
    match (&a.1, &b.1) {
        (Sample::F(x), Sample::F(y)) => {
            let from = if counter && y < x { 0.0 } else { *x };
            Some(Sample::F(from + (y - from) * frac))
        }
        (Sample::H(x), Sample::H(y)) => {
            interpolate_histograms(x, y, frac, counter, notes).map(|v| Sample::H(std::borrow::Cow::Owned(v)))
        }
        _ => {
            notes.mixed();
            None
        }
    }
}

/// The histogram `frac` of the way from `x` to `y`: `x + (y − x)·frac`, or for a counter
/// that reset in between, `y·frac` (rising from zero). None (after a warning) when one has
/// custom buckets and the other not.
pub(super) fn interpolate_histograms(
    x: &FloatHistogram,
    y: &FloatHistogram,
    frac: f64,
    counter: bool,
    notes: &Notes,
) -> Option<FloatHistogram> {
    if x.uses_custom_buckets() != y.uses_custom_buckets() {
        notes.mixed_schemas();
        return None;
    }
    let gauge = x.hint == CounterResetHint::Gauge && y.hint == CounterResetHint::Gauge;
    let mut v = y.clone();
    if counter && y.detect_reset(x) {
        v.mul(frac);
    } else {
        v.sub(x).ok()?;
        v.mul(frac);
        v.add(x).ok()?;
    }
    v.hint = if gauge { CounterResetHint::Gauge } else { CounterResetHint::Unknown };
    Some(v)
}

/// The value of a `smoothed` instant selector at `t` over a series with histograms:
/// interpolated between the samples either side of `t` (each within the lookback, stale
/// markers ignored), or the one that exists. `j` and `k` count the float and histogram
/// samples at or before `t`. Samples of different kinds either side give no value and a
/// warning.
#[allow(clippy::too_many_arguments, reason = "both kinds' samples and cursors")]
pub(super) fn smoothed_sample(
    floats: &[Point],
    j: usize,
    hists: &[HPoint],
    k: usize,
    t: i64,
    lookback: i64,
    notes: &Notes,
) -> Option<Out> {
    let fresh = |pt: i64| pt > t - lookback && pt < t + lookback;
    let fb = j.checked_sub(1).map(|j| floats[j]).filter(|p| fresh(p.t) && !strata_model::is_stale_nan(p.f));
    let fa = floats.get(j).copied().filter(|p| fresh(p.t) && !strata_model::is_stale_nan(p.f));
    let hb = k.checked_sub(1).map(|k| &hists[k]).filter(|p| fresh(p.t) && !p.h.is_stale());
    let ha = hists.get(k).filter(|p| fresh(p.t) && !p.h.is_stale());
    let before = pick(fb, hb, false);
    let after = pick(fa, ha, true);
    let value = match (before, after) {
        (Some(b), _) if b.0 == t => b.1,
        (Some(b), Some(a)) => {
            // A histogram counter that reset in between rises from zero.
            let counter = matches!(&a.1, Sample::H(h) if h.hint != CounterResetHint::Gauge);
            interpolate(&b, &a, t, counter, notes)?
        }
        (Some(b), None) => b.1,
        (None, Some(a)) => a.1,
        (None, None) => return None,
    };
    Some(match value {
        Sample::F(f) => Out::Float(f),
        Sample::H(h) => Out::hist(h.into_owned()),
    })
}

/// An anchored or smoothed window that involves histograms (inside it or at its edges): the
/// window's samples of both kinds, preceded by the anchor (anchored) or framed by values
/// interpolated at its start and end (smoothed), then `rate`, `increase` and `delta` over that
/// sequence (one kind only), or `changes` and `resets` (a change of kind counts).
pub(super) fn extended(
    name: &str,
    mode: crate::ast::RangeMode,
    floats: &[Point],
    hists: &[HPoint],
    edges: &Edges,
    w: &Window,
    notes: &Notes,
) -> Option<Out> {
    let counter = matches!(name, "rate" | "increase" | "resets");
    let mut window: Vec<(i64, Sample)> = floats.iter().map(|p| (p.t, Sample::F(p.f))).collect();
    window.extend(hists.iter().map(|p| (p.t, Sample::H(std::borrow::Cow::Borrowed(&*p.h)))));
    window.sort_by_key(|x| x.0);
    let before = pick(edges.before, edges.hbefore, false);
    let after = pick(edges.after, edges.hafter, true);
    let mut seq: Vec<(i64, Sample)> = Vec::with_capacity(window.len() + 2);
    if mode == crate::ast::RangeMode::Anchored {
        if window.is_empty() {
            return None;
        }
        seq.extend(before);
        seq.extend(window);
    } else {
        let start = w.end - w.range;
        let first_after_start = window.first().cloned().or_else(|| after.clone())?;
        let start_v = match &before {
            Some(b) => interpolate(b, &first_after_start, start, counter, notes)?,
            None => first_after_start.1.clone(),
        };
        let last_before_end = window.last().cloned().or_else(|| before.clone())?;
        let end_v = match &after {
            Some(a) if last_before_end.0 < w.end => interpolate(&last_before_end, a, w.end, counter, notes)?,
            _ => last_before_end.1.clone(),
        };
        seq.push((start, start_v));
        seq.extend(window);
        seq.push((w.end, end_v));
    }
    if matches!(name, "changes" | "resets") {
        let mut floats: Vec<Point> = Vec::new();
        let mut hs: Vec<HPoint> = Vec::new();
        for (t, v) in &seq {
            match v {
                Sample::F(f) => floats.push(Point { t: *t, f: *f }),
                Sample::H(h) => hs.push(HPoint { t: *t, h: Arc::new((**h).clone()) }),
            }
        }
        return Some(Out::Float(changes_or_resets(&floats, &hs, &[], &[], name == "resets")));
    }
    let all_hists = seq.iter().all(|x| matches!(x.1, Sample::H(_)));
    if !all_hists {
        if seq.iter().any(|x| matches!(x.1, Sample::H(_))) {
            notes.mixed();
            return None;
        }
        let values: Vec<f64> =
            seq.iter().filter_map(|(_, v)| if let Sample::F(f) = v { Some(*f) } else { None }).collect();
        return super::range_functions::extended_sequence(name, &values, w).map(Out::Float);
    }
    let hs: Vec<&FloatHistogram> =
        seq.iter().filter_map(|x| if let Sample::H(h) = &x.1 { Some(&**h) } else { None }).collect();
    // Smoothed edges are interpolated: a reset between the edge's neighbours is already in
    // the interpolation (from zero), so pairs with an edge are judged by their counts alone,
    // not by a sample's reset hint.
    let smoothed = mode == crate::ast::RangeMode::Smoothed;
    let interpolated = |i: usize| smoothed && (i == 0 || i == hs.len() - 1);
    let is_counter = name != "delta";
    check_kind(&hs, is_counter, notes);
    let mut h = change(&hs, is_counter, |i| interpolated(i) || interpolated(i + 1), |_| false, notes)?;
    if name == "rate" {
        h.div(w.range as f64 / 1000.0);
    }
    Some(Out::hist(h))
}

/// `changes` or `resets` over a window of floats and histograms in time order; a change of
/// kind counts as a change (and, for `resets`, as a reset, as does one that start times
/// reveal: `float_starts` and `hist_starts`, empty when none).
fn changes_or_resets(
    floats: &[Point],
    hists: &[HPoint],
    float_starts: &[i64],
    hist_starts: &[i64],
    resets: bool,
) -> f64 {
    enum V<'a> {
        F(f64),
        H(&'a FloatHistogram),
    }
    let start = |starts: &[i64], i: usize| starts.get(i).copied().unwrap_or(0);
    let mut seq: Vec<(i64, V, i64)> =
        floats.iter().enumerate().map(|(i, p)| (p.t, V::F(p.f), start(float_starts, i))).collect();
    seq.extend(hists.iter().enumerate().map(|(i, p)| (p.t, V::H(&p.h), start(hist_starts, i))));
    seq.sort_by_key(|x| x.0);
    let mut n = 0.0;
    for pair in seq.windows(2) {
        if resets && is_start_reset(pair[0].2, pair[0].0, pair[1].2, pair[1].0) {
            n += 1.0;
            continue;
        }
        let counted = match (&pair[0].1, &pair[1].1) {
            (V::F(a), V::F(b)) => {
                if resets {
                    b < a
                } else {
                    a != b && !(a.is_nan() && b.is_nan())
                }
            }
            (V::H(a), V::H(b)) => {
                if resets {
                    b.detect_reset(a)
                } else {
                    !a.bit_eq(b)
                }
            }
            _ => true,
        };
        if counted {
            n += 1.0;
        }
    }
    n
}
