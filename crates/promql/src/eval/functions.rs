//! Functions over instant vectors and scalars; range-vector functions are in
//! `range_functions`.

use std::collections::HashMap;

use strata_model::civil::{civil_from_days, days_from_civil};
use strata_model::{Labels, LabelsBuilder, MatchOp, METRIC_NAME};

use super::aggregate::fmt_float;
use super::labels::without;
use super::native_histograms::{self, NanNote};
use super::{range_functions, Ctx, Evaluator, Val};
use crate::ast::{Call, Expr, ExprKind};
use crate::error::{exec, EvalError};
use crate::value::{Point, Series};

pub(super) fn eval(ev: &Evaluator, call: &Call, e: &Expr, ctx: &Ctx) -> Result<Val, EvalError> {
    let name = call.func.name;
    let args = &call.args;
    match name {
        "time" => Ok(Val::Scalar((0..ctx.n).map(|i| ctx.ts(i) as f64 / 1000.0).collect())),
        "pi" => Ok(Val::Scalar(vec![std::f64::consts::PI; ctx.n])),
        // Duration functions (experimental), as scalars in seconds.
        "step" => Ok(Val::Scalar(vec![ev.query_step as f64 / 1000.0; ctx.n])),
        "range" => Ok(Val::Scalar(vec![(ev.query_end - ev.query_start) as f64 / 1000.0; ctx.n])),
        "start" => Ok(Val::Scalar(vec![ev.query_start as f64 / 1000.0; ctx.n])),
        "end" => Ok(Val::Scalar(vec![ev.query_end as f64 / 1000.0; ctx.n])),
        "min_of" | "max_of" => {
            let (a, b) = (ev.eval_scalar(&args[0], ctx)?, ev.eval_scalar(&args[1], ctx)?);
            let pick = if name == "min_of" { go_min } else { go_max };
            Ok(Val::Scalar(a.iter().zip(&b).map(|(&x, &y)| pick(x, y)).collect()))
        }
        "vector" => {
            let s = ev.eval_scalar(&args[0], ctx)?;
            let points = s.iter().enumerate().map(|(i, &f)| Point { t: ctx.ts(i), f }).collect();
            Ok(Val::Vector(vec![Series::new(Labels::empty(), points)]))
        }
        "scalar" => {
            let v = ev.eval_vector(&args[0], ctx)?;
            let mut count = vec![0u32; ctx.n];
            let mut val = vec![f64::NAN; ctx.n];
            for s in &v {
                for p in &s.points {
                    let i = ctx.index(p.t);
                    count[i] += 1;
                    val[i] = p.f;
                }
            }
            Ok(Val::Scalar(val.into_iter().zip(count).map(|(v, c)| if c == 1 { v } else { f64::NAN }).collect()))
        }
        "absent" => {
            let v = ev.eval_vector(&args[0], ctx)?;
            let mut present = vec![false; ctx.n];
            for s in &v {
                for t in s.points.iter().map(|p| p.t).chain(s.hists.iter().map(|p| p.t)) {
                    present[ctx.index(t)] = true;
                }
            }
            Ok(Val::Vector(absent_series(&args[0], &present, ctx)))
        }
        "absent_over_time" => {
            let mut present = vec![false; ctx.n];
            let count = Call { func: crate::functions::lookup("count_over_time").expect("known"), args: args.clone() };
            range_functions::stream(ev, &count, ctx, &mut |s| {
                for t in s.points.iter().map(|p| p.t).chain(s.hists.iter().map(|p| p.t)) {
                    present[ctx.index(t)] = true;
                }
                Ok(())
            })?;
            Ok(Val::Vector(absent_series(&args[0], &present, ctx)))
        }
        "timestamp" => {
            let mut v = match &args[0].unparen().kind {
                ExprKind::Vector(sel) => ev.collect("timestamp", |sink| {
                    ev.stream_selector(sel, args[0].start, ctx, super::SelectorValue::SampleTime, sink)
                })?,
                _ => {
                    let mut v = ev.eval_vector(&args[0], ctx)?;
                    for s in &mut v {
                        s.points.iter_mut().for_each(|p| p.f = p.t as f64 / 1000.0);
                    }
                    v
                }
            };
            v.iter_mut().for_each(|s| s.drop_name = true);
            Ok(Val::Vector(v))
        }
        "start_timestamp" => {
            // Start times are a stored sample's: only a selector has them (Prometheus returns
            // nothing for any other argument).
            let mut v = match &args[0].unparen().kind {
                ExprKind::Vector(sel) => ev.collect("start_timestamp", |sink| {
                    ev.stream_selector(sel, args[0].start, ctx, super::SelectorValue::StartTime, sink)
                })?,
                _ => {
                    let v = ev.eval_vector(&args[0], ctx)?;
                    ev.release(v.iter().map(Series::len).sum());
                    Vec::new()
                }
            };
            v.iter_mut().for_each(|s| s.drop_name = true);
            Ok(Val::Vector(v))
        }
        "sort" | "sort_desc" | "sort_by_label" | "sort_by_label_desc" => {
            if ev.query_step != 0 {
                ev.warn(e.start, "sort is ineffective for range queries since results are always ordered by labels");
            }
            let mut v = ev.eval_vector(&args[0], ctx)?;
            if matches!(name, "sort" | "sort_desc") {
                // Sorting by value: histograms have none to sort by and are left out.
                v.iter_mut().for_each(|s| s.hists.clear());
                v.retain(|s| !s.is_empty());
            }
            if ctx.n == 1 {
                match name {
                    "sort" => v.sort_by(|a, b| cmp_value(a, b, false)),
                    "sort_desc" => v.sort_by(|a, b| cmp_value(a, b, true)),
                    _ => {
                        let mut labels = Vec::new();
                        for a in &args[1..] {
                            labels.push(ev.eval_string(a, ctx)?);
                        }
                        let desc = name == "sort_by_label_desc";
                        v.sort_by(|a, b| {
                            let o = cmp_by_labels(&a.labels, &b.labels, &labels);
                            if desc {
                                o.reverse()
                            } else {
                                o
                            }
                        });
                    }
                }
            }
            Ok(Val::Vector(v))
        }
        "label_replace" => label_replace(ev, args, ctx),
        "label_join" => label_join(ev, args, ctx),
        // With an argument these are element-wise and stream; without, they read the step time.
        _ if args.is_empty() && is_date_function(name) => {
            let part = date_part(name);
            let points = (0..ctx.n).map(|i| Point { t: ctx.ts(i), f: part(ctx.ts(i).div_euclid(1000)) }).collect();
            Ok(Val::Vector(vec![Series::new(Labels::empty(), points)]))
        }
        "info" => super::info::eval(ev, call, ctx),
        "histogram_quantile" => histogram_quantile(ev, call, ctx),
        "histogram_quantiles" => histogram_quantiles(ev, call, ctx),
        "histogram_fraction" => histogram_fraction(ev, call, ctx),
        "histogram_count" | "histogram_sum" | "histogram_avg" | "histogram_stddev" | "histogram_stdvar" => {
            // These read native histograms only; float samples give no result.
            let arg = args.last().expect("checked by the parser");
            let f: fn(&strata_model::FloatHistogram) -> f64 = match name {
                "histogram_count" => |h| h.count,
                "histogram_sum" => |h| h.sum,
                "histogram_avg" => |h| h.sum / h.count,
                "histogram_stddev" => |h| native_histograms::variance(h).sqrt(),
                _ => native_histograms::variance,
            };
            let mut out = Vec::new();
            for s in ev.eval_vector(arg, ctx)? {
                if s.hists.is_empty() {
                    continue;
                }
                let points = s.hists.iter().map(|p| Point { t: p.t, f: f(&p.h) }).collect();
                out.push(Series { labels: s.labels, points, hists: Vec::new(), drop_name: true });
            }
            Ok(Val::Vector(out))
        }
        _ => Err(exec(format!("function {name:?} is not supported yet"))),
    }
}

fn is_date_function(name: &str) -> bool {
    matches!(
        name,
        "minute" | "hour" | "day_of_week" | "day_of_month" | "day_of_year" | "days_in_month" | "month" | "year"
    )
}

/// Calls that map each point of their vector argument on its own (with per-step scalar
/// parameters), so they can stream.
pub(super) fn is_elementwise(call: &Call) -> bool {
    let name = call.func.name;
    math_function(name).is_some()
        || matches!(name, "round" | "clamp" | "clamp_min" | "clamp_max")
        || (is_date_function(name) && !call.args.is_empty())
}

/// Streams an element-wise function: its scalar parameters are evaluated first, then each
/// series of the vector argument is mapped as it arrives.
pub(super) fn stream_elementwise(
    ev: &Evaluator,
    call: &Call,
    ctx: &Ctx,
    sink: &mut dyn FnMut(Series) -> Result<(), EvalError>,
) -> Result<(), EvalError> {
    let name = call.func.name;
    let args = &call.args;
    let p1 = if args.len() > 1 { ev.eval_scalar(&args[1], ctx)? } else { vec![1.0; ctx.n] };
    let p2 = if args.len() > 2 { ev.eval_scalar(&args[2], ctx)? } else { Vec::new() };
    let math = math_function(name);
    let date = is_date_function(name).then(|| date_part(name));
    let apply = |f: f64, i: usize| -> Option<f64> {
        if let Some(part) = date {
            return Some(if f.is_finite() { part(f as i64) } else { f64::NAN });
        }
        match name {
            "round" => {
                let inv = 1.0 / p1[i];
                Some((f * inv + 0.5).floor() / inv)
            }
            // An empty range (max below min) gives nothing; NaN bounds give NaN.
            "clamp" => (p2[i] >= p1[i] || p1[i].is_nan() || p2[i].is_nan()).then(|| go_max(p1[i], go_min(p2[i], f))),
            "clamp_min" => Some(go_max(p1[i], f)),
            "clamp_max" => Some(go_min(p1[i], f)),
            _ => math.map(|m| m(f)),
        }
    };
    ev.stream(&args[0], ctx, &mut |mut s: Series| {
        // Float functions; histogram samples have no result (as in Prometheus).
        s.hists.clear();
        let mut steps = ctx.walker();
        s.points.retain_mut(|p| match apply(p.f, steps.index(p.t)) {
            Some(x) => {
                p.f = x;
                true
            }
            None => false,
        });
        s.drop_name = true;
        if s.points.is_empty() {
            Ok(())
        } else {
            sink(s)
        }
    })
}

/// Go's `math.Max`/`math.Min`: NaN wins.
fn go_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

fn go_min(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.min(b)
    }
}

fn math_function(name: &str) -> Option<fn(f64) -> f64> {
    Some(match name {
        "abs" => f64::abs,
        "ceil" => f64::ceil,
        "floor" => f64::floor,
        "exp" => f64::exp,
        "sqrt" => f64::sqrt,
        "ln" => f64::ln,
        "log2" => f64::log2,
        "log10" => f64::log10,
        "sgn" => |v: f64| {
            if v > 0.0 {
                1.0
            } else if v < 0.0 {
                -1.0
            } else {
                v
            }
        },
        "sin" => f64::sin,
        "cos" => f64::cos,
        "tan" => f64::tan,
        "asin" => f64::asin,
        "acos" => f64::acos,
        "atan" => f64::atan,
        "sinh" => f64::sinh,
        "cosh" => f64::cosh,
        "tanh" => f64::tanh,
        "asinh" => f64::asinh,
        "acosh" => f64::acosh,
        "atanh" => f64::atanh,
        "deg" => |v: f64| v * 180.0 / std::f64::consts::PI,
        "rad" => |v: f64| v * std::f64::consts::PI / 180.0,
        _ => return None,
    })
}

/// `absent(x)`: `1` at the steps where `present` is false, labelled with the equality matchers
/// of a selector argument (a label matched twice is left out).
fn absent_series(arg: &Expr, present: &[bool], ctx: &Ctx) -> Vec<Series> {
    let matchers = match &arg.unparen().kind {
        ExprKind::Vector(s) => s.matchers.as_slice(),
        ExprKind::Matrix(m) => m.vector.matchers.as_slice(),
        _ => &[],
    };
    // As Prometheus: the first equality matcher of a label sets it; any other matcher of the
    // same label removes it (`x{job="a",job=~"b"}` gives no `job`).
    let mut pairs: Vec<(&str, &str)> = Vec::new();
    let mut has: Vec<&str> = Vec::new();
    for m in matchers {
        if m.name == METRIC_NAME {
            continue;
        }
        pairs.retain(|(n, _)| *n != m.name);
        if m.op == MatchOp::Equal && !has.contains(&m.name.as_str()) {
            pairs.push((&m.name, &m.value));
            has.push(&m.name);
        }
    }
    let labels = Labels::from_pairs(pairs);
    let points: Vec<Point> =
        present.iter().enumerate().filter(|(_, &p)| !p).map(|(i, _)| Point { t: ctx.ts(i), f: 1.0 }).collect();
    if points.is_empty() {
        return Vec::new();
    }
    vec![Series::new(labels, points)]
}

/// Ascending (or descending) by value; NaN always last.
fn cmp_value(a: &Series, b: &Series, desc: bool) -> std::cmp::Ordering {
    let (x, y) = (a.points.first().map_or(f64::NAN, |p| p.f), b.points.first().map_or(f64::NAN, |p| p.f));
    match (x.is_nan(), y.is_nan()) {
        (true, true) => std::cmp::Ordering::Equal,
        (true, false) => std::cmp::Ordering::Greater,
        (false, true) => std::cmp::Ordering::Less,
        _ => {
            let o = x.partial_cmp(&y).unwrap_or(std::cmp::Ordering::Equal);
            if desc {
                o.reverse()
            } else {
                o
            }
        }
    }
}

/// Natural order of the listed labels' values (digit runs compare as numbers), then the whole
/// label set.
fn cmp_by_labels(a: &Labels, b: &Labels, names: &[String]) -> std::cmp::Ordering {
    for n in names {
        let (x, y) = (a.get(n).unwrap_or(""), b.get(n).unwrap_or(""));
        match natural_cmp(x, y) {
            std::cmp::Ordering::Equal => continue,
            o => return o,
        }
    }
    a.cmp(b)
}

fn natural_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        if a[i].is_ascii_digit() && b[j].is_ascii_digit() {
            let (si, sj) = (i, j);
            while i < a.len() && a[i].is_ascii_digit() {
                i += 1;
            }
            while j < b.len() && b[j].is_ascii_digit() {
                j += 1;
            }
            let x = std::str::from_utf8(&a[si..i]).unwrap_or("0").trim_start_matches('0');
            let y = std::str::from_utf8(&b[sj..j]).unwrap_or("0").trim_start_matches('0');
            let o = x.len().cmp(&y.len()).then_with(|| x.cmp(y));
            if o != std::cmp::Ordering::Equal {
                return o;
            }
        } else {
            if a[i] != b[j] {
                return a[i].cmp(&b[j]);
            }
            i += 1;
            j += 1;
        }
    }
    (a.len() - i).cmp(&(b.len() - j))
}

fn label_replace(ev: &Evaluator, args: &[Expr], ctx: &Ctx) -> Result<Val, EvalError> {
    let dst = ev.eval_string(&args[1], ctx)?;
    let repl = ev.eval_string(&args[2], ctx)?;
    let src = ev.eval_string(&args[3], ctx)?;
    let re_src = ev.eval_string(&args[4], ctx)?;
    let re = regex::Regex::new(&format!("^(?s:{re_src})$"))
        .map_err(|_| exec(format!("invalid regular expression in label_replace(): {re_src}")))?;
    if dst.is_empty() {
        return Err(exec(format!("invalid destination label name in label_replace(): {dst}")));
    }
    let mut v = ev.eval_vector(&args[0], ctx)?;
    for s in &mut v {
        let value = s.labels.get(&src).unwrap_or("").to_string();
        if let Some(caps) = re.captures(&value) {
            let mut res = String::new();
            caps.expand(&repl, &mut res);
            let mut b = LabelsBuilder::new(&s.labels);
            b.set(dst.as_str(), res);
            s.labels = b.build().map_err(|e| exec(e.to_string()))?;
            if dst == METRIC_NAME {
                s.drop_name = false;
            }
        }
    }
    Ok(Val::Vector(v))
}

fn label_join(ev: &Evaluator, args: &[Expr], ctx: &Ctx) -> Result<Val, EvalError> {
    let dst = ev.eval_string(&args[1], ctx)?;
    let sep = ev.eval_string(&args[2], ctx)?;
    let mut srcs = Vec::new();
    for a in &args[3..] {
        let s = ev.eval_string(a, ctx)?;
        if s.is_empty() {
            return Err(exec(format!("invalid source label name in label_join(): {s}")));
        }
        srcs.push(s);
    }
    if dst.is_empty() {
        return Err(exec(format!("invalid destination label name in label_join(): {dst}")));
    }
    let mut v = ev.eval_vector(&args[0], ctx)?;
    for s in &mut v {
        let joined: Vec<&str> = srcs.iter().map(|n| s.labels.get(n).unwrap_or("")).collect();
        let joined = joined.join(&sep);
        let mut b = LabelsBuilder::new(&s.labels);
        b.set(dst.as_str(), joined);
        s.labels = b.build().map_err(|e| exec(e.to_string()))?;
        if dst == METRIC_NAME {
            s.drop_name = false;
        }
    }
    Ok(Val::Vector(v))
}

/// The calendar part a time function extracts, from Unix seconds (UTC).
fn date_part(name: &str) -> fn(i64) -> f64 {
    match name {
        "minute" => |s| (s.rem_euclid(3600) / 60) as f64,
        "hour" => |s| (s.rem_euclid(86_400) / 3600) as f64,
        "day_of_week" => |s| (s.div_euclid(86_400) + 4).rem_euclid(7) as f64,
        "day_of_month" => |s| civil_from_days(s.div_euclid(86_400)).2 as f64,
        "day_of_year" => |s| {
            let days = s.div_euclid(86_400);
            let (y, _, _) = civil_from_days(days);
            (days - days_from_civil(y, 1, 1) + 1) as f64
        },
        "days_in_month" => |s| {
            let (y, m, _) = civil_from_days(s.div_euclid(86_400));
            let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
            (days_from_civil(ny, nm, 1) - days_from_civil(y, m, 1)) as f64
        },
        "month" => |s| civil_from_days(s.div_euclid(86_400)).1 as f64,
        _ => |s| civil_from_days(s.div_euclid(86_400)).0 as f64,
    }
}

/// A classic-histogram bucket: upper bound and cumulative count.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    upper: f64,
    count: f64,
}

fn almost_equal(a: f64, b: f64, eps: f64) -> bool {
    const MIN_NORMAL: f64 = f64::MIN_POSITIVE;
    if a == b {
        return true;
    }
    let abs_sum = a.abs() + b.abs();
    let diff = (a - b).abs();
    if a == 0.0 || b == 0.0 || abs_sum < MIN_NORMAL {
        return diff < eps * MIN_NORMAL;
    }
    diff / abs_sum.min(f64::MAX) < eps
}

/// Prometheus' quantile over classic buckets: sorted by bound, equal bounds merged, made
/// monotonic, then linear interpolation inside the bucket holding the rank. Returns the value
/// and whether monotonicity had to be forced.
fn bucket_quantile(q: f64, buckets: &mut [Bucket]) -> (f64, bool) {
    if q.is_nan() {
        return (f64::NAN, false);
    }
    if q < 0.0 {
        return (f64::NEG_INFINITY, false);
    }
    if q > 1.0 {
        return (f64::INFINITY, false);
    }
    buckets.sort_by(|a, b| a.upper.partial_cmp(&b.upper).unwrap_or(std::cmp::Ordering::Equal));
    if !buckets.last().is_some_and(|b| b.upper == f64::INFINITY) {
        return (f64::NAN, false);
    }
    // Merge equal bounds.
    let mut merged: Vec<Bucket> = Vec::with_capacity(buckets.len());
    for b in buckets.iter() {
        match merged.last_mut() {
            Some(l) if l.upper == b.upper => l.count += b.count,
            _ => merged.push(*b),
        }
    }
    let mut forced = false;
    let mut prev = merged[0].count;
    for b in merged.iter_mut().skip(1) {
        let cur = b.count;
        if cur == prev {
            continue;
        }
        if almost_equal(prev, cur, 1e-12) {
            b.count = prev;
            continue;
        }
        if cur < prev {
            b.count = prev;
            forced = true;
            continue;
        }
        prev = cur;
    }
    if merged.len() < 2 {
        return (f64::NAN, forced);
    }
    let observations = merged[merged.len() - 1].count;
    if observations == 0.0 {
        return (f64::NAN, forced);
    }
    let mut rank = q * observations;
    let b = merged[..merged.len() - 1].partition_point(|x| x.count < rank);
    if b == merged.len() - 1 {
        return (merged[merged.len() - 2].upper, forced);
    }
    if b == 0 && merged[0].upper <= 0.0 {
        return (merged[0].upper, forced);
    }
    let end = merged[b].upper;
    let mut count = merged[b].count;
    let mut start = 0.0;
    if b > 0 {
        start = merged[b - 1].upper;
        count -= merged[b - 1].count;
        rank -= merged[b - 1].count;
    }
    (start + (end - start) * (rank / count), forced)
}

/// Classic-histogram series grouped by their labels without `le`: per group the output labels
/// (also without the name) and the buckets at each step.
type BucketGroups = Vec<(Labels, Vec<Vec<Bucket>>)>;

/// The histograms an argument of `histogram_quantile` and its kin holds: classic ones (float
/// series with `le`, grouped) and native ones. Where a native histogram and classic buckets of
/// the same name and labels meet at a step, neither is used and a warning says so.
struct HistogramInput {
    classic: BucketGroups,
    native: Vec<Series>,
}

fn histogram_input(ev: &Evaluator, arg: &Expr, ctx: &Ctx) -> Result<HistogramInput, EvalError> {
    let input = ev.eval_vector(arg, ctx)?;
    let (mut classic, index) = bucket_groups(ev, arg, &input, ctx);
    let mut native = Vec::new();
    for s in input {
        if s.hists.is_empty() {
            continue;
        }
        let mut hists = Vec::with_capacity(s.hists.len());
        for p in s.hists {
            let i = ctx.index(p.t);
            if let Some(&g) = index.get(&s.labels) {
                if !classic[g].1[i].is_empty() {
                    ev.warn(
                        arg.start,
                        format!(
                            "vector contains a mix of classic and native histograms for metric name {:?}",
                            s.labels.get(METRIC_NAME).unwrap_or("")
                        ),
                    );
                    classic[g].1[i].clear();
                    continue;
                }
            }
            hists.push(p);
        }
        native.push(Series { labels: s.labels, points: Vec::new(), hists, drop_name: true });
    }
    Ok(HistogramInput { classic, native })
}

impl HistogramInput {
    /// One float per native histogram point, from `f(step, histogram)`.
    fn map_native(
        &self,
        ctx: &Ctx,
        mut f: impl FnMut(usize, &Labels, &strata_model::FloatHistogram) -> f64,
    ) -> Vec<Series> {
        let mut out = Vec::new();
        for s in &self.native {
            let points: Vec<Point> =
                s.hists.iter().map(|p| Point { t: p.t, f: f(ctx.index(p.t), &s.labels, &p.h) }).collect();
            if !points.is_empty() {
                out.push(Series { labels: s.labels.clone(), points, hists: Vec::new(), drop_name: true });
            }
        }
        out
    }
}

/// Reports what a native quantile noticed about NaN observations.
fn note_nan(ev: &Evaluator, pos: usize, labels: &Labels, note: NanNote) {
    let what = match note {
        NanNote::None => return,
        NanNote::ResultNaN => "result is NaN",
        NanNote::SkewedHigher => "result is skewed higher",
    };
    ev.info(
        pos,
        format!(
            "input to histogram_quantile has NaN observations, {what} for metric name {:?}",
            labels.get(METRIC_NAME).unwrap_or("")
        ),
    );
}

/// Groups the classic-histogram series of `input`; also returns each group's index by its
/// labels without `le` (the name kept).
fn bucket_groups(ev: &Evaluator, arg: &Expr, input: &[Series], ctx: &Ctx) -> (BucketGroups, HashMap<Labels, usize>) {
    let mut index: HashMap<Labels, usize> = HashMap::new();
    let mut groups: BucketGroups = Vec::new();
    for s in input.iter().filter(|s| !s.points.is_empty()) {
        let le = s.labels.get("le").unwrap_or("");
        let Some(upper) = parse_go_float(le) else {
            ev.warn(
                arg.start,
                format!(
                    "bucket label \"le\" is missing or has a malformed value of {le:?} for metric name {:?}",
                    s.labels.get(METRIC_NAME).unwrap_or("")
                ),
            );
            continue;
        };
        let key = without(&s.labels, &["le"]);
        let g = *index.entry(key.clone()).or_insert_with(|| {
            groups.push((without(&key, &[METRIC_NAME]), vec![Vec::new(); ctx.n]));
            groups.len() - 1
        });
        let steps = &mut groups[g].1;
        ctx.each_step(&s.points, |i, p| steps[i].push(Bucket { upper, count: p.f }));
    }
    (groups, index)
}

fn warn_quantile(ev: &Evaluator, pos: usize, q: &[f64]) {
    if let Some(bad) = q.iter().find(|q| !(0.0..=1.0).contains(*q)) {
        ev.warn(pos, format!("quantile value should be between 0 and 1, got {}", fmt_float(*bad)));
    }
}

/// One quantile of each group's buckets at each step.
fn quantile_series(
    ev: &Evaluator,
    pos: usize,
    labels: &Labels,
    per_step: &mut [Vec<Bucket>],
    q: &[f64],
    ctx: &Ctx,
) -> Vec<Point> {
    let mut points = Vec::new();
    for (i, buckets) in per_step.iter_mut().enumerate() {
        if buckets.is_empty() {
            continue;
        }
        let (v, forced) = bucket_quantile(q[i], buckets);
        if forced {
            ev.info(
                pos,
                format!(
                    "input to histogram_quantile needed to be fixed for monotonicity (see https://prometheus.io/docs/prometheus/latest/querying/functions/#histogram_quantile) for metric name {:?}",
                    labels.get(METRIC_NAME).unwrap_or("")
                ),
            );
        }
        points.push(Point { t: ctx.ts(i), f: v });
    }
    points
}

fn histogram_quantile(ev: &Evaluator, call: &Call, ctx: &Ctx) -> Result<Val, EvalError> {
    let q = ev.eval_scalar(&call.args[0], ctx)?;
    warn_quantile(ev, call.args[0].start, &q);
    let pos = call.args[1].start;
    let input = histogram_input(ev, &call.args[1], ctx)?;
    let mut out = input.map_native(ctx, |i, labels, h| {
        let (v, note) = native_histograms::quantile(q[i], h);
        note_nan(ev, pos, labels, note);
        v
    });
    for (labels, mut per_step) in input.classic {
        let points = quantile_series(ev, pos, &labels, &mut per_step, &q, ctx);
        if !points.is_empty() {
            out.push(Series::new(labels, points));
        }
    }
    Ok(Val::Vector(out))
}

/// `histogram_quantiles(v, "label", q1, q2, …)`: one series per quantile, labelled with it.
fn histogram_quantiles(ev: &Evaluator, call: &Call, ctx: &Ctx) -> Result<Val, EvalError> {
    let label = ev.eval_string(&call.args[1], ctx)?;
    let mut qs = Vec::new();
    for a in &call.args[2..] {
        let q = ev.eval_scalar(a, ctx)?;
        warn_quantile(ev, a.start, &q);
        qs.push(q);
    }
    let pos = call.args[0].start;
    let input = histogram_input(ev, &call.args[0], ctx)?;
    let mut out = Vec::new();
    for q in &qs {
        for mut s in input.map_native(ctx, |i, labels, h| {
            let (v, note) = native_histograms::quantile(q[i], h);
            note_nan(ev, pos, labels, note);
            v
        }) {
            let mut b = LabelsBuilder::new(&s.labels);
            b.set(label.as_str(), openmetrics_float(q[0]));
            s.labels = b.build().map_err(|e| exec(e.to_string()))?;
            out.push(s);
        }
    }
    for (labels, mut per_step) in input.classic {
        for q in &qs {
            let points = quantile_series(ev, call.args[0].start, &labels, &mut per_step, q, ctx);
            if points.is_empty() {
                continue;
            }
            let mut b = LabelsBuilder::new(&labels);
            b.set(label.as_str(), openmetrics_float(q[0]));
            out.push(Series::new(b.build().map_err(|e| exec(e.to_string()))?, points));
        }
    }
    Ok(Val::Vector(out))
}

/// A float as OpenMetrics writes label values: integers keep a `.0` (`1.0`, `0.0`).
fn openmetrics_float(f: f64) -> String {
    let s = fmt_float(f);
    if f.is_finite() && !s.contains(['.', 'e']) {
        format!("{s}.0")
    } else {
        s
    }
}

/// The fraction of observations between `lower` and `upper`, interpolating linearly inside
/// buckets; the infinite first (below zero) and last buckets are not interpolated.
fn bucket_fraction(lower: f64, upper: f64, buckets: &mut [Bucket]) -> f64 {
    buckets.sort_by(|a, b| a.upper.partial_cmp(&b.upper).unwrap_or(std::cmp::Ordering::Equal));
    if !buckets.last().is_some_and(|b| b.upper == f64::INFINITY) {
        return f64::NAN;
    }
    let mut merged: Vec<Bucket> = Vec::with_capacity(buckets.len());
    for b in buckets.iter() {
        match merged.last_mut() {
            Some(l) if l.upper == b.upper => l.count += b.count,
            _ => merged.push(*b),
        }
    }
    let count = merged[merged.len() - 1].count;
    if count == 0.0 || lower.is_nan() || upper.is_nan() {
        return f64::NAN;
    }
    if lower >= upper {
        return 0.0;
    }
    let rank_at = |v: f64| -> f64 {
        let mut prev = 0.0;
        for (i, b) in merged.iter().enumerate() {
            let lb = if i > 0 {
                merged[i - 1].upper
            } else if b.upper > 0.0 {
                0.0
            } else {
                f64::NEG_INFINITY
            };
            if v <= lb {
                return prev;
            }
            if v <= b.upper {
                if v == b.upper || lb == f64::NEG_INFINITY {
                    return b.count;
                }
                if b.upper == f64::INFINITY {
                    return prev;
                }
                return prev + (b.count - prev) * (v - lb) / (b.upper - lb);
            }
            prev = b.count;
        }
        count
    };
    (rank_at(upper).min(count) - rank_at(lower).min(count)) / count
}

fn histogram_fraction(ev: &Evaluator, call: &Call, ctx: &Ctx) -> Result<Val, EvalError> {
    let lower = ev.eval_scalar(&call.args[0], ctx)?;
    let upper = ev.eval_scalar(&call.args[1], ctx)?;
    let pos = call.args[2].start;
    let input = histogram_input(ev, &call.args[2], ctx)?;
    let mut out = input.map_native(ctx, |i, labels, h| {
        if h.sum.is_nan() {
            ev.info(
                pos,
                format!(
                    "input to histogram_fraction has NaN observations, which are excluded from all fractions for metric name {:?}",
                    labels.get(METRIC_NAME).unwrap_or("")
                ),
            );
        }
        native_histograms::fraction(lower[i], upper[i], h)
    });
    for (labels, mut per_step) in input.classic {
        let points: Vec<Point> = per_step
            .iter_mut()
            .enumerate()
            .filter(|(_, b)| !b.is_empty())
            .map(|(i, b)| Point { t: ctx.ts(i), f: bucket_fraction(lower[i], upper[i], b) })
            .collect();
        if !points.is_empty() {
            out.push(Series::new(labels, points));
        }
    }
    Ok(Val::Vector(out))
}

/// Go's `strconv.ParseFloat` for the forms bucket bounds use.
fn parse_go_float(s: &str) -> Option<f64> {
    match s.to_ascii_lowercase().as_str() {
        "+inf" | "inf" | "+infinity" | "infinity" => return Some(f64::INFINITY),
        "-inf" | "-infinity" => return Some(f64::NEG_INFINITY),
        "nan" => return Some(f64::NAN),
        _ => {}
    }
    if s.is_empty() || s.contains(|c: char| c.is_ascii_alphabetic() && !matches!(c, 'e' | 'E')) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(v: &[(f64, f64)]) -> Vec<Bucket> {
        v.iter().map(|&(upper, count)| Bucket { upper, count }).collect()
    }

    #[test]
    fn classic_histogram_quantile() {
        let mut x = b(&[(0.1, 10.0), (0.5, 50.0), (1.0, 100.0), (f64::INFINITY, 100.0)]);
        assert_eq!(bucket_quantile(0.5, &mut x).0, 0.5);
        let mut x = b(&[(0.1, 10.0), (0.5, 50.0), (1.0, 100.0), (f64::INFINITY, 100.0)]);
        assert!((bucket_quantile(0.75, &mut x).0 - 0.75).abs() < 1e-12);
        let mut no_inf = b(&[(0.1, 10.0)]);
        assert!(bucket_quantile(0.5, &mut no_inf).0.is_nan());
        let mut non_monotonic = b(&[(1.0, 10.0), (2.0, 5.0), (f64::INFINITY, 10.0)]);
        assert!(bucket_quantile(0.5, &mut non_monotonic).1);
    }

    #[test]
    fn natural_order() {
        assert_eq!(natural_cmp("a2", "a10"), std::cmp::Ordering::Less);
        assert_eq!(natural_cmp("b", "a10"), std::cmp::Ordering::Greater);
    }

    #[test]
    fn calendar_parts() {
        // 2024-02-29T13:45:00Z
        let s = days_from_civil(2024, 2, 29) * 86_400 + 13 * 3600 + 45 * 60;
        assert_eq!(date_part("year")(s), 2024.0);
        assert_eq!(date_part("month")(s), 2.0);
        assert_eq!(date_part("day_of_month")(s), 29.0);
        assert_eq!(date_part("days_in_month")(s), 29.0);
        assert_eq!(date_part("day_of_year")(s), 60.0);
        assert_eq!(date_part("hour")(s), 13.0);
        assert_eq!(date_part("minute")(s), 45.0);
        assert_eq!(date_part("day_of_week")(s), 4.0);
    }
}
