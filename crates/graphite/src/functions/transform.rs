//! Point-by-point arithmetic: `scale`, `offset`, `absolute` (graphite-web's "Transform"
//! group). Each renames its series after itself (`scale(a.b,10)`, with the factor as Python's
//! `%g` writes it) and records itself in the tags (the factor as the float graphite-web's
//! parameter check made of it: `10.0`).

use super::{per_series, py_g, Args, EvalError, Series};
use crate::render::py_float;
use crate::target::Number;

/// Names a series a function made: graphite-web sets its path expression to the new name too.
pub(crate) fn rename(s: &mut Series, name: String) {
    s.name = name;
    s.path_expression = s.name.clone();
}

/// `what(seriesList, <param>)`: every present value through `op` with the number; the name is
/// `what(name,number)` with the number as `in_name` writes it, the tag the number as a float.
fn with_factor(
    mut args: Args<'_>,
    what: &str,
    param: &str,
    in_name: fn(f64) -> String,
    op: impl Fn(f64, f64) -> f64,
) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    let f = args.required_number(1, param)?.as_f64();
    args.finish()?;
    for s in &mut series {
        s.tags.insert(what.to_owned(), py_float(f));
        rename(s, format!("{what}({},{})", s.name, in_name(f)));
        for v in s.values.iter_mut().flatten() {
            *v = op(*v, f);
        }
    }
    Ok(series)
}

/// `scale(seriesList, factor)`: every value times the factor.
pub(crate) fn scale(args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    with_factor(args, "scale", "factor", py_g, |v, f| v * f)
}

/// `offset(seriesList, factor)`: the factor added to every value.
pub(crate) fn offset(args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    with_factor(args, "offset", "factor", py_g, |v, f| v + f)
}

/// `absolute(seriesList)`.
pub(crate) fn absolute(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    args.finish()?;
    for s in &mut series {
        s.tags.insert("absolute".into(), "1".into());
        rename(s, format!("absolute({})", s.name));
        for v in s.values.iter_mut().flatten() {
            *v = v.abs();
        }
    }
    Ok(series)
}

/// A copy of `s` under `name` with `values`, as graphite-web's `series.copy(name=, values=)`:
/// its path expression becomes the name, and `tag` is set (on the original's tags too in
/// graphite-web, which shares them; the original is not returned).
fn derive(s: &Series, name: String, values: Vec<Option<f64>>, tag: &str) -> Series {
    let mut tags = s.tags.clone();
    tags.insert(tag.to_owned(), "1".to_owned());
    Series { path_expression: name.clone(), name, values, values_per_point: 1, tags, ..s.clone() }
}

/// `derivative(seriesList)`: the change from the previous point (a gap next to a gap).
pub(crate) fn derivative(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let series = args.series(0, "seriesList")?;
    args.finish()?;
    Ok(per_series(series.iter().collect(), |s| {
        let mut prev = None;
        let values = s
            .points_cow()
            .iter()
            .map(|&v| {
                let d = match (prev, v) {
                    (Some(p), Some(x)) => Some(x - p),
                    _ => None,
                };
                prev = v;
                d
            })
            .collect();
        derive(s, format!("derivative({})", s.name), values, "derivative")
    }))
}

/// graphite-web's `_nonNegativeDelta`: the increase from `prev`, a counter wrap when bounds
/// are given, a gap on a reset without them; the new `prev`.
fn non_negative_delta(
    val: Option<f64>,
    prev: Option<f64>,
    max: Option<f64>,
    min: Option<f64>,
) -> (Option<f64>, Option<f64>) {
    let Some(v) = val else { return (None, None) };
    if max.is_some_and(|m| v > m) || min.is_some_and(|m| v < m) {
        return (None, None);
    }
    let Some(p) = prev else { return (None, Some(v)) };
    if v >= p {
        return (Some(v - p), Some(v));
    }
    if let Some(m) = max {
        return (Some(m + 1.0 + v - p - min.unwrap_or(0.0)), Some(v));
    }
    if let Some(m) = min {
        return (Some(v - m), Some(v));
    }
    (None, Some(v))
}

/// `nonNegativeDerivative(seriesList, maxValue=None, minValue=None)` and `perSecond` (the same
/// delta over the step, rounded to six decimals as graphite-web rounds it).
pub(crate) fn non_negative(mut args: Args<'_>, per_second: bool) -> Result<Vec<Series>, EvalError> {
    let series = args.series(0, "seriesList")?;
    let max = args.number(1, "maxValue")?.map(Number::as_f64);
    let min = args.number(2, "minValue")?.map(Number::as_f64);
    args.finish()?;
    let what = if per_second { "perSecond" } else { "nonNegativeDerivative" };
    Ok(per_series(series.iter().collect(), |s| {
        let mut prev = None;
        // graphite-web divides by the stored step even when points are consolidated.
        let step = s.step as f64;
        let values = s
            .points_cow()
            .iter()
            .map(|&v| {
                let (d, p) = non_negative_delta(v, prev, max, min);
                prev = p;
                if per_second {
                    d.map(|d| py_round(d / step, 6))
                } else {
                    d
                }
            })
            .collect();
        derive(s, format!("{what}({})", s.name), values, what)
    }))
}

/// Python's `round(x, digits)`: the decimal nearest the exact value, back to the nearest float.
pub(crate) fn py_round(x: f64, digits: usize) -> f64 {
    if !x.is_finite() {
        return x;
    }
    // The fast way, where it gives the same float: `x · 10^digits` is computed within half an
    // ulp of the exact product, so unless that lands near a half the nearest integer `k` is the
    // exact product's too; and `k / 10^digits`, one correctly rounded division of exact
    // operands, is the float nearest the decimal, as parsing it would give.
    if digits <= 22 {
        let scale = 10f64.powi(digits as i32);
        let y = x * scale;
        if y.abs() < 4_503_599_627_370_496.0 {
            let distance_from_half = ((y - y.trunc()).abs() - 0.5).abs();
            if distance_from_half > 4.0 * f64::EPSILON * y.abs().max(1.0) {
                return y.round() / scale;
            }
        }
    }
    format!("{x:.digits$}").parse().unwrap_or(x)
}

/// `py_round`'s slow way alone, which the fast one must always agree with.
#[cfg(test)]
pub(crate) fn py_round_by_text(x: f64, digits: usize) -> f64 {
    format!("{x:.digits$}").parse().unwrap_or(x)
}

/// `integral(seriesList)`: the running sum (a gap stays a gap and adds nothing).
pub(crate) fn integral(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let series = args.series(0, "seriesList")?;
    args.finish()?;
    Ok(per_series(series.iter().collect(), |s| {
        let mut current = 0.0;
        let values = s
            .points_cow()
            .iter()
            .map(|&v| {
                v.map(|x| {
                    current += x;
                    current
                })
            })
            .collect();
        derive(s, format!("integral({})", s.name), values, "integral")
    }))
}

/// `keepLastValue(seriesList, limit=inf)`: runs of at most `limit` gaps after a value take it.
pub(crate) fn keep_last_value(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    let limit = args.number(1, "limit")?.map_or(f64::INFINITY, Number::as_f64);
    args.finish()?;
    per_series(series.iter_mut().collect(), |s| {
        rename(s, format!("keepLastValue({})", s.name));
        let (mut gaps, mut last) = (0usize, None);
        let n = s.values.len();
        for i in 0..=n {
            let v = if i < n { s.values[i] } else { Some(f64::NAN) };
            match v {
                None => gaps += 1,
                Some(x) => {
                    if gaps > 0 && gaps as f64 <= limit {
                        if let Some(l) = last {
                            s.values[i - gaps..i].fill(Some(l));
                        }
                    }
                    gaps = 0;
                    last = Some(x);
                }
            }
        }
    });
    Ok(series)
}

/// `transformNull(seriesList, default=0, referenceSeries=None)`: gaps become `default`, or with
/// reference series only where one of them has a value.
pub(crate) fn transform_null(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    let given = args.number(1, "default")?;
    let default = given.map_or(0.0, Number::as_f64);
    // A given default went through graphite-web's float parameter check (`-1.0`); the
    // declared one is the int 0.
    let default_tag = given.map_or_else(|| "0".to_owned(), |_| py_float(default));
    let reference = match args.take(2, "referenceSeries") {
        None => None,
        Some(super::Arg::Series(r)) => Some(r),
        Some(_) => return Err(args.error("referenceSeries must be a series list")),
    };
    args.finish()?;
    // Per point: whether any reference series has a value there (an empty list: none).
    let defaults: Option<Vec<bool>> = reference.filter(|r| !r.is_empty()).map(|r| {
        let columns: Vec<Vec<Option<f64>>> = r.iter().map(Series::points).collect();
        let len = columns.iter().map(Vec::len).max().unwrap_or(0);
        (0..len).map(|i| columns.iter().any(|c| c.get(i).copied().flatten().is_some())).collect()
    });
    for s in &mut series {
        s.tags.insert("transformNull".into(), default_tag.clone());
        let suffix = if defaults.is_some() {
            s.tags.insert("referenceSeries".into(), "1".into());
            ",referenceSeries"
        } else {
            ""
        };
        rename(s, format!("transformNull({},{}{suffix})", s.name, py_g(default)));
        let points = s.points();
        let len = defaults.as_ref().map_or(points.len(), |d| d.len().max(points.len()));
        s.values = (0..len)
            .map(|i| {
                let v = points.get(i).copied().flatten();
                let d = match &defaults {
                    Some(d) => d.get(i).copied().unwrap_or(false).then_some(default),
                    None => Some(default),
                };
                v.or(d)
            })
            .collect();
        s.values_per_point = 1;
    }
    Ok(series)
}

/// `removeBelowValue(seriesList, n)` and `removeAboveValue`: values past `n` become gaps.
pub(crate) fn remove_value(mut args: Args<'_>, below: bool) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    let n = args.required_number(1, "n")?.as_f64();
    args.finish()?;
    let what = if below { "removeBelowValue" } else { "removeAboveValue" };
    for s in &mut series {
        rename(s, format!("{what}({}, {})", s.name, py_g(n)));
        for v in &mut s.values {
            if v.is_some_and(|x| if below { x < n } else { x > n }) {
                *v = None;
            }
        }
    }
    Ok(series)
}

/// Applies `f` to every point of every series, renaming them `what(name)` with the tag
/// `what=1` (graphite-web's in-place transforms).
fn map_points(
    mut args: Args<'_>,
    what: &str,
    f: impl Fn(Option<f64>) -> Option<f64> + Sync,
) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    args.finish()?;
    per_series(series.iter_mut().collect(), |s| {
        s.tags.insert(what.to_owned(), "1".into());
        rename(s, format!("{what}({})", s.name));
        s.values = s.points_cow().iter().map(|&v| f(v)).collect();
        s.values_per_point = 1;
    });
    Ok(series)
}

/// Python's `math.pow` as graphite-web's `safePow` calls it: a domain error (a negative base
/// to a fractional power, zero to a negative one) or an overflow is a gap.
fn safe_pow(v: Option<f64>, e: f64) -> Option<f64> {
    let v = v?;
    let r = v.powf(e);
    (!r.is_nan() && (r.is_finite() || !v.is_finite())).then_some(r)
}

pub(crate) fn invert(args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    map_points(args, "invert", |v| safe_pow(v, -1.0))
}

pub(crate) fn square_root(args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    map_points(args, "squareRoot", |v| safe_pow(v, 0.5))
}

/// `isNonNull(seriesList)`: 1 where there is a value, 0 in a gap.
pub(crate) fn is_non_null(args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    map_points(args, "isNonNull", |v| Some(if v.is_some() { 1.0 } else { 0.0 }))
}

/// `changed(seriesList)`: 1 where the value differs from the last value seen, else 0 (the
/// first point, and gaps, are 0).
pub(crate) fn changed(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    args.finish()?;
    for s in &mut series {
        rename(s, format!("changed({})", s.name));
        let mut previous: Option<f64> = None;
        s.values = s
            .points()
            .into_iter()
            .map(|v| {
                Some(match (previous, v) {
                    (None, v) => {
                        previous = v;
                        0.0
                    }
                    (Some(p), Some(x)) if p != x => {
                        previous = Some(x);
                        1.0
                    }
                    _ => 0.0,
                })
            })
            .collect();
        s.values_per_point = 1;
    }
    Ok(series)
}

/// `offsetToZero(seriesList)`: the series' minimum subtracted from every value.
pub(crate) fn offset_to_zero(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    args.finish()?;
    for s in &mut series {
        let points = s.points();
        let minimum = super::combine::AggFunc::Min.apply(&points);
        s.tags.insert("offsetToZero".into(), minimum.map_or_else(|| "None".to_owned(), py_float));
        rename(s, format!("offsetToZero({})", s.name));
        s.values = points.into_iter().map(|v| Some(v? - minimum?)).collect();
        s.values_per_point = 1;
    }
    Ok(series)
}

/// `delay(seriesList, steps)`: every value moved `steps` points later (earlier if negative),
/// gaps filling in. As in graphite-web, `delay(x, 0)` leaves no values at all.
pub(crate) fn delay(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let series = args.series(0, "seriesList")?;
    let steps = args.required_number(1, "steps")?;
    let Number::Int(steps) = steps else { return Err(args.error("steps must be a whole number")) };
    args.finish()?;
    Ok(series
        .iter()
        .map(|s| {
            let points = s.points();
            let len = points.len() as i64;
            let values: Vec<Option<f64>> = if steps < 0 {
                let k = (-steps).min(len) as usize;
                points[k..].iter().copied().chain(std::iter::repeat_n(None, k)).collect()
            } else {
                // Python's `series[:-steps]`: with steps 0, nothing.
                let keep = if steps == 0 { 0 } else { (len - steps).max(0) as usize };
                std::iter::repeat_n(None, steps.min(len) as usize).chain(points[..keep].iter().copied()).collect()
            };
            let mut out = derive(s, format!("delay({},{steps})", s.name), values, "delay");
            out.tags.insert("delay".into(), steps.to_string());
            out
        })
        .collect())
}

/// Most points `summarize` may make for one series: a one-second interval over years would
/// otherwise fill memory.
const SUMMARIZE_POINTS_MAX: i64 = 1_000_000;

/// graphite-web's `parseTimeOffset` (for function arguments such as `summarize`'s interval):
/// `[+-]` then number-unit pairs (`1h30min`); units `s`, `min`, `h`, `d`, `w`, `mon` (30 days),
/// `y` (365 days) by their prefixes. Seconds; `None` if malformed.
pub(crate) fn time_offset(s: &str) -> Option<i64> {
    let (sign, mut rest) = match s.as_bytes().first()? {
        b'+' => (1, &s[1..]),
        b'-' => (-1, &s[1..]),
        c if c.is_ascii_digit() => (1, s),
        _ => return None,
    };
    let mut total = 0i64;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let n: i64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let letters = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let unit = &rest[..letters];
        rest = &rest[letters..];
        let seconds = if unit.starts_with('s') {
            1
        } else if unit.starts_with("min") {
            60
        } else if unit.starts_with('h') {
            3600
        } else if unit.starts_with('d') {
            86_400
        } else if unit.starts_with('w') {
            7 * 86_400
        } else if unit.starts_with("mon") {
            30 * 86_400
        } else if unit.starts_with('y') {
            365 * 86_400
        } else {
            return None;
        };
        total = total.checked_add(n.checked_mul(seconds)?)?;
    }
    // Beyond a few thousand years an offset means nothing, and epoch arithmetic with it could
    // overflow.
    (total <= TIME_OFFSET_MAX).then_some(sign * total)
}

/// The longest offset `time_offset` reads, seconds (about 3000 years).
const TIME_OFFSET_MAX: i64 = 100_000_000_000;

/// `summarize(seriesList, intervalString, func='sum', alignToFrom=False)`: the points in each
/// interval (aligned to multiples of it, or to the series' start) folded into one, as
/// graphite-web's `_summarizeValues` folds them: a bucket also takes the last point at or
/// before its start, and is a gap unless its present points reach the series' xFilesFactor of
/// the points an interval holds.
pub(crate) fn summarize(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let series = args.series(0, "seriesList")?;
    let interval_string = args.string(1, "intervalString")?.ok_or_else(|| args.error("missing intervalString"))?;
    let func_name = args.string(2, "func")?.unwrap_or_else(|| "sum".into());
    let align_to_from = match args.take(3, "alignToFrom") {
        None => false,
        Some(super::Arg::Bool(b)) => b,
        Some(_) => return Err(args.error("alignToFrom must be true or false")),
    };
    let func = super::combine::AggFunc::parse(&func_name)
        .ok_or_else(|| args.error(format!("Unsupported aggregation function: {func_name}")))?;
    let interval = time_offset(&interval_string).filter(|i| *i > 0).ok_or_else(|| {
        args.error(format!("intervalString {interval_string:?} is not a positive interval such as \"1h\""))
    })?;
    args.finish()?;
    per_series(series.iter().collect(), |s| {
        let (new_start, mut new_end) = if align_to_from {
            (s.start, s.end)
        } else {
            (s.start - s.start.rem_euclid(interval), s.end - s.end.rem_euclid(interval) + interval)
        };
        if (new_end - new_start) / interval > SUMMARIZE_POINTS_MAX {
            return Err(EvalError::BadArgument {
                function: "summarize".into(),
                message: format!("an interval of {interval_string} makes more than {SUMMARIZE_POINTS_MAX} points"),
            });
        }
        let (values, t) = summarize_values(s, func, interval, new_start, new_end);
        if align_to_from {
            new_end = t;
        }
        let name = format!(
            "summarize({}, \"{interval_string}\", \"{func_name}\"{})",
            s.name,
            if align_to_from { ", true" } else { "" }
        );
        let mut tags = s.tags.clone();
        tags.insert("summarize".into(), interval_string.clone());
        tags.insert("summarizeFunction".into(), func_name.clone());
        Ok(Series {
            path_expression: name.clone(),
            name,
            start: new_start,
            end: new_end,
            step: interval,
            values,
            values_per_point: 1,
            tags,
            ..s.clone()
        })
    })
    .into_iter()
    .collect()
}

/// graphite-web's `_summarizeValues`: the points of `s` in buckets of `interval` from
/// `new_start` until `new_end`, each folded by `func`; with the end of the last bucket. A bucket
/// also takes the last point at or before its start, and is a gap unless its present points
/// reach the series' xFilesFactor of the points an interval holds.
pub(crate) fn summarize_values(
    s: &Series,
    func: super::combine::AggFunc,
    interval: i64,
    new_start: i64,
    new_end: i64,
) -> (Vec<Option<f64>>, i64) {
    let step = s.step * s.values_per_point.max(1) as i64;
    let timestamps: Vec<i64> = (s.start..s.end).step_by(step.max(1) as usize).collect();
    let points = s.points();
    let n = timestamps.len().min(points.len());
    let per_interval = interval as f64 / step as f64;
    let mut values = Vec::new();
    let (mut i, mut t) = (0usize, new_start);
    while t < new_end {
        let mut first = i;
        let mut present = 0usize;
        while i < n && timestamps[i] < t + interval {
            if timestamps[i] <= t {
                first = i;
            }
            if timestamps[i] >= t && points[i].is_some() {
                present += 1;
            }
            i += 1;
        }
        let enough = present > 0 && per_interval != 0.0 && present as f64 / per_interval >= s.x_files_factor;
        values.push(if enough { func.apply(&points[first..i]) } else { None });
        t += interval;
    }
    (values, t)
}

/// `pow(seriesList, factor)`.
pub(crate) fn pow(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    let f = args.required_number(1, "factor")?.as_f64();
    args.finish()?;
    for s in &mut series {
        s.tags.insert("pow".into(), py_float(f));
        rename(s, format!("pow({},{})", s.name, py_g(f)));
        s.values = s.points().into_iter().map(|v| safe_pow(v, f)).collect();
        s.values_per_point = 1;
    }
    Ok(series)
}

/// `log(seriesList, base=10)` (graphite-web's `logarithm`, registered as `log`): values not
/// above 0 are gaps.
pub(crate) fn logarithm(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let series = args.series(0, "seriesList")?;
    let base = match args.number(1, "base")? {
        None => 10,
        Some(Number::Int(b)) => b,
        Some(_) => return Err(args.error("base must be a whole number")),
    };
    args.finish()?;
    if base <= 0 || base == 1 {
        return Err(EvalError::BadArgument {
            function: "log".into(),
            message: format!("base {base} has no logarithm"),
        });
    }
    let b = base as f64;
    Ok(series
        .iter()
        .map(|s| {
            // Python's math.log(x, base): log(x) / log(base).
            let values = s.points().into_iter().map(|v| v.filter(|x| *x > 0.0).map(|x| x.ln() / b.ln())).collect();
            let mut out = derive(s, format!("log({}, {base})", s.name), values, "log");
            out.tags.insert("log".into(), base.to_string());
            out
        })
        .collect())
}

/// `scaleToSeconds(seriesList, seconds)`: values per step turned into values per `seconds`,
/// rounded to six decimals.
pub(crate) fn scale_to_seconds(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    let seconds = args.required_number(1, "seconds")?.as_f64();
    args.finish()?;
    for s in &mut series {
        s.tags.insert("scaleToSeconds".into(), py_float(seconds));
        rename(s, format!("scaleToSeconds({},{})", s.name, seconds.trunc() as i64));
        let factor = seconds / s.step as f64;
        for v in s.values.iter_mut().flatten() {
            *v = py_round(*v * factor, 6);
        }
    }
    Ok(series)
}

/// graphite-web's `_getPercentile` of the present points: the nearest rank, or with
/// `interpolate` the value between the two ranks around the fractional one.
pub(crate) fn percentile(points: &[Option<f64>], n: f64, interpolate: bool) -> Option<f64> {
    let mut sorted: Vec<f64> = points.iter().flatten().copied().collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    let fractional = n / 100.0 * (sorted.len() + 1) as f64;
    let mut rank = fractional.trunc() as usize;
    let fraction = fractional - rank as f64;
    if !interpolate {
        rank += fraction.ceil() as usize;
    }
    let mut p = if rank == 0 {
        sorted[0]
    } else if rank > sorted.len() {
        // Past the end (n above 100): the largest (graphite-web fails here).
        sorted[sorted.len() - 1]
    } else {
        sorted[rank - 1]
    };
    if interpolate && rank < sorted.len() {
        p += fraction * (sorted[rank] - p);
    }
    Some(p)
}

/// `nPercentile(seriesList, n)`: each series' n-th percentile as a constant line.
pub(crate) fn n_percentile(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let series = args.series(0, "seriesList")?;
    let n = args.required_number(1, "n")?.as_f64();
    args.finish()?;
    if n == 0.0 {
        return Err(EvalError::BadArgument {
            function: "nPercentile".into(),
            message: "The requested percent is required to be greater than 0".into(),
        });
    }
    Ok(series
        .iter()
        .filter_map(|s| {
            let points = s.points();
            let p = percentile(&points, n, false)?;
            let count = ((s.end - s.start) / s.step.max(1)).max(0) as usize;
            let mut out =
                derive(s, format!("nPercentile({}, {})", s.name, py_g(n)), vec![Some(p); count], "nPercentile");
            out.tags.insert("nPercentile".into(), py_float(n));
            Some(out)
        })
        .collect())
}

/// Graph options that change neither names nor values (`color`, `lineWidth`, `alpha`):
/// nothing a data answer shows, so the series pass through once the arguments check.
pub(crate) fn graph_option(mut args: Args<'_>, option: &str) -> Result<Vec<Series>, EvalError> {
    let series = args.series(0, "seriesList")?;
    if args.take(1, option).is_none() {
        return Err(args.error(format!("missing {option}")));
    }
    args.finish()?;
    Ok(series)
}

/// A point-by-point function named `what(name)` with tag `what` = `tag`.
fn pointwise(
    mut args: Args<'_>,
    what: &str,
    tag: &str,
    op: impl Fn(f64) -> Option<f64> + Sync,
) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    args.finish()?;
    per_series(series.iter_mut().collect(), |s| {
        s.tags.insert(what.to_owned(), tag.to_owned());
        rename(s, format!("{what}({})", s.name));
        s.values = s.points_cow().iter().map(|v| v.and_then(&op)).collect();
        s.values_per_point = 1;
    });
    Ok(series)
}

/// `exp(seriesList)`: e to the power of each value.
pub(crate) fn exp(args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    pointwise(args, "exp", "e", |v| Some(v.exp()))
}

/// `logit(seriesList)`: `log(x / (1 - x))`, a gap outside 0 < x < 1 (and at 1).
pub(crate) fn logit(args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    pointwise(args, "logit", "logit", |v| {
        // Python raises (and graphite-web answers a gap) for a zero divisor or a log of a
        // non-positive number.
        let q = if 1.0 - v == 0.0 { return None } else { v / (1.0 - v) };
        (q > 0.0).then(|| q.ln())
    })
}

/// `sigmoid(seriesList)`: `1 / (1 + exp(-x))`.
pub(crate) fn sigmoid(args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    pointwise(args, "sigmoid", "sigmoid", |v| Some(1.0 / (1.0 + (-v).exp())))
}

/// `add(seriesList, constant)`: the constant added to each value; named with the constant
/// truncated to an integer, as graphite-web's `%d` writes it.
pub(crate) fn add(args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    with_factor(args, "add", "constant", |c| (c.trunc() as i64).to_string(), |v, c| v + c)
}

/// `round(seriesList, precision=None)`: each value rounded to `precision` decimals (tens,
/// hundreds... when negative), halves to even as Python rounds.
pub(crate) fn round(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    let precision = args.number(1, "precision")?.map(|n| n.as_f64() as i64);
    args.finish()?;
    if precision.is_some_and(|p| p.abs() > 300) {
        return Err(args_error("round", "precision must be from -300 to 300"));
    }
    for s in &mut series {
        s.tags.insert("round".into(), precision.unwrap_or(0).to_string());
        let name = match precision {
            None => format!("round({})", s.name),
            Some(p) => format!("round({},{p})", s.name),
        };
        rename(s, name);
        let p = precision.unwrap_or(0);
        for v in s.values.iter_mut().flatten() {
            *v = if p >= 0 {
                py_round(*v, p as usize)
            } else {
                let m = 10f64.powi(-p as i32);
                (*v / m).round_ties_even() * m
            };
        }
    }
    Ok(series)
}

fn args_error(function: &str, message: &str) -> EvalError {
    EvalError::BadArgument { function: function.to_owned(), message: message.to_owned() }
}

/// `secondYAxis`, `drawAsInfinite` (graph options that rename: `secondYAxis(a.b)`) and
/// `dashed(seriesList, dashLength=5)` (`dashed(a.b, 5)`): the data unchanged.
pub(crate) fn renaming_graph_option(mut args: Args<'_>, what: &str) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    let dash = if what == "dashed" { Some(args.number(1, "dashLength")?.unwrap_or(Number::Int(5))) } else { None };
    args.finish()?;
    for s in &mut series {
        match dash {
            Some(d) => {
                s.tags.insert(what.to_owned(), super::number_str(d));
                s.name = format!("dashed({}, {})", s.name, py_g(d.as_f64()));
            }
            None => {
                s.tags.insert(what.to_owned(), "1".into());
                s.name = format!("{what}({})", s.name);
            }
        }
    }
    Ok(series)
}
