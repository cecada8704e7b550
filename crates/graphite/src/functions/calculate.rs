//! Statistics over each series and functions that evaluate new targets: `stdev`,
//! `linearRegression`, `mostDeviant`, `hitcount`, `smartSummarize`, `useSeriesAbove`,
//! `applyByNode`, `groupByTags`, `powSeries`, `minMax`, `interpolate` (graphite-web's
//! "Calculate", "Combine" and "Transform" groups), as graphite-web computes them.

use super::combine::{group_by, normalize, AggFunc};
use super::transform::{summarize_values, time_offset};
use super::{eval, Arg, Args, Context, EvalError, Series};
use crate::target::{self, Expr, Number};

fn bad(function: &str, message: impl Into<String>) -> EvalError {
    EvalError::BadArgument { function: function.to_owned(), message: message.into() }
}

/// `stdev(seriesList, points, windowTolerance=0.1)`: the standard deviation over a moving
/// window of `points` points (the point itself and those before it), from running sums as
/// graphite-web keeps them; a gap unless the window's present points reach the tolerance.
pub(crate) fn stdev(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let series = args.series(0, "seriesList")?;
    let points = args.required_number(1, "points")?;
    let tolerance = args.number(2, "windowTolerance")?.map_or(0.1, Number::as_f64);
    args.finish()?;
    let window = points.as_f64();
    if !(1.0..1e9).contains(&window) {
        return Err(bad("stdev", format!("points must be at least 1, not {window}")));
    }
    let window = window as usize;
    let tag = super::number_str(points);
    Ok(series
        .into_iter()
        .map(|mut s| {
            let values = s.points();
            let (mut valid, mut sum, mut sum_of_squares) = (0usize, 0.0f64, 0.0f64);
            let out = (0..values.len())
                .map(|i| {
                    let dropped = if i >= window { values[i - window] } else { None };
                    if dropped.is_some() {
                        valid -= 1;
                    }
                    if values[i].is_some() {
                        valid += 1;
                    }
                    if let Some(d) = dropped {
                        sum -= d;
                        sum_of_squares -= d * d;
                    }
                    if let Some(v) = values[i] {
                        sum += v;
                        sum_of_squares += v * v;
                    }
                    if valid > 0 && valid as f64 / window as f64 >= tolerance {
                        let d = (valid as f64 * sum_of_squares - sum * sum).sqrt() / valid as f64;
                        // Python's math.sqrt refuses a negative (a rounding residue): a gap.
                        (!d.is_nan()).then_some(d)
                    } else {
                        None
                    }
                })
                .collect();
            s.tags.insert("stdev".into(), tag.clone());
            s.name = format!("stdev({},{window})", s.name);
            Series { values: out, values_per_point: 1, ..s }
        })
        .collect())
}

/// graphite-web's `_linearRegressionAnalysis`: the least-squares line through the present
/// points, as `(factor per second, offset at time 0)`; `None` when it is undefined.
fn regression(s: &Series) -> Option<(f64, f64)> {
    let points = s.points();
    let present = points.iter().enumerate().filter_map(|(i, v)| v.map(|v| (i as i128, v)));
    let (mut n, mut sum_i, mut sum_ii, mut sum_v, mut sum_iv) = (0i128, 0i128, 0i128, 0.0f64, 0.0f64);
    for (i, v) in present {
        n += 1;
        sum_i += i;
        sum_ii += i * i;
        sum_v += v;
        sum_iv += i as f64 * v;
    }
    let denominator = (n * sum_ii - sum_i * sum_i) as f64;
    if denominator == 0.0 {
        return None;
    }
    let factor = (n as f64 * sum_iv - sum_i as f64 * sum_v) / denominator / s.step as f64;
    let offset = (sum_ii as f64 * sum_v - sum_iv * sum_i as f64) / denominator - factor * s.start as f64;
    Some((factor, offset))
}

/// `linearRegression(seriesList, startSourceAt=None, endSourceAt=None)`: each series replaced
/// by the line fitted to its points between the two dates (the request's range by default).
pub(crate) fn linear_regression(
    cx: &mut Context<'_>,
    mut args: Args<'_>,
    first: &Expr,
) -> Result<Vec<Series>, EvalError> {
    let series = args.series(0, "seriesList")?;
    let mut date = |index: usize, name: &str, default: i64| -> Result<i64, EvalError> {
        match args.take(index, name) {
            None => Ok(default),
            Some(Arg::String(s)) => crate::attime::parse_at_time(&s, cx.now, &cx.time_zone)
                .ok_or_else(|| bad("linearRegression", format!("{name} {s:?} is not a time Graphite understands"))),
            Some(Arg::Number(n)) => Ok(n.as_f64() as i64),
            Some(_) => Err(bad("linearRegression", format!("{name} must be a date"))),
        }
    };
    let start = date(1, "startSourceAt", cx.from)?;
    let end = date(2, "endSourceAt", cx.until)?;
    args.finish()?;
    let sources = cx.evaluate_over(first, start, end)?;
    Ok(sources
        .iter()
        .zip(series)
        .filter_map(|(source, mut s)| {
            let (factor, offset) = regression(source)?;
            s.tags.insert("linearRegressions".into(), format!("{start}, {end}"));
            let name = format!("linearRegression({}, {start}, {end})", s.name);
            let values =
                (0..s.values.len()).map(|i| Some(offset + (s.start + i as i64 * s.step) as f64 * factor)).collect();
            Some(Series { path_expression: name.clone(), name, values, values_per_point: 1, ..s })
        })
        .collect())
}

/// `mostDeviant(seriesList, n)`: the `n` series with the largest variance of their points.
pub(crate) fn most_deviant(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let series = args.series(0, "seriesList")?;
    let n = args.required_number(1, "n")?.as_f64();
    args.finish()?;
    let mut deviants: Vec<(f64, Series)> = series
        .into_iter()
        .filter_map(|s| {
            let points = s.points();
            let mean = AggFunc::Average.apply(&points)?;
            let present = points.iter().flatten().count();
            let square_sum = points.iter().flatten().fold(0.0, |acc, v| acc + (v - mean).powi(2));
            Some((square_sum / present as f64, s))
        })
        .collect();
    // Python's stable sort with reverse=True keeps equal variances in their order.
    deviants.sort_by(|a, b| b.0.total_cmp(&a.0));
    Ok(deviants.into_iter().take(n.max(0.0) as usize).map(|(_, s)| s).collect())
}

/// Most buckets `hitcount` and `smartSummarize` may make for one series.
const BUCKETS_MAX: i64 = 1_000_000;

/// The range start floored as `hitcount(..., alignToInterval=true)` floors it: to the day for
/// an interval of a day or more, the hour, or the minute.
fn align_to_interval(cx: &Context<'_>, interval: i64) -> Option<i64> {
    let unit = match interval {
        i if i >= 86_400 => "days",
        i if i >= 3600 => "hours",
        i if i >= 60 => "minutes",
        _ => return Some(cx.from),
    };
    cx.floor_to_unit(cx.from, unit)
}

/// `hitcount(seriesList, intervalString, alignToInterval=False)`: values taken as hits per
/// second, summed into buckets of the interval ending at the series' end, each value spread
/// over the buckets its step overlaps.
pub(crate) fn hitcount(cx: &mut Context<'_>, mut args: Args<'_>, first: &Expr) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    let interval_string = args.string(1, "intervalString")?.ok_or_else(|| args.error("missing intervalString"))?;
    let align = match args.take(2, "alignToInterval") {
        None => false,
        Some(Arg::Bool(b)) => b,
        Some(_) => return Err(args.error("alignToInterval must be true or false")),
    };
    args.finish()?;
    let interval = time_offset(&interval_string)
        .filter(|i| *i > 0)
        .ok_or_else(|| bad("hitcount", format!("intervalString {interval_string:?} is not a positive interval")))?;
    if align {
        let from =
            align_to_interval(cx, interval).ok_or_else(|| bad("hitcount", "the range start cannot be aligned"))?;
        series = cx.evaluate_over(first, from, cx.until)?;
        for s in &mut series {
            let count = (s.end - s.start).div_euclid(interval);
            s.end = s.start + count * interval + interval;
        }
    }
    let mut out = Vec::with_capacity(series.len());
    for mut s in series {
        let buckets_len = (s.end - s.start + interval - 1).div_euclid(interval).max(0);
        if buckets_len > BUCKETS_MAX {
            return Err(bad(
                "hitcount",
                format!("an interval of {interval_string} makes more than {BUCKETS_MAX} points"),
            ));
        }
        let mut buckets: Vec<Vec<f64>> = vec![Vec::new(); buckets_len as usize];
        let new_start = s.end - buckets_len * interval;
        let step = s.step;
        for (i, v) in s.points().into_iter().enumerate() {
            let Some(v) = v else { continue };
            let start_time = s.start + i as i64 * step;
            let (start_bucket, start_mod) =
                ((start_time - new_start).div_euclid(interval), (start_time - new_start).rem_euclid(interval));
            // A value past the series' end (a function may leave one) has no bucket.
            if start_bucket >= buckets_len {
                continue;
            }
            let end_time = start_time + step;
            let (mut end_bucket, mut end_mod) =
                ((end_time - new_start).div_euclid(interval), (end_time - new_start).rem_euclid(interval));
            if end_bucket >= buckets_len {
                (end_bucket, end_mod) = (buckets_len - 1, interval);
            }
            if start_bucket == end_bucket {
                if start_bucket >= 0 {
                    buckets[start_bucket as usize].push(v * (end_mod - start_mod) as f64);
                }
            } else {
                if start_bucket >= 0 {
                    buckets[start_bucket as usize].push(v * (interval - start_mod) as f64);
                }
                for j in (start_bucket + 1).max(0)..end_bucket {
                    buckets[j as usize].push(v * interval as f64);
                }
                if end_mod > 0 && end_bucket >= 0 {
                    buckets[end_bucket as usize].push(v * end_mod as f64);
                }
            }
        }
        let values = buckets.iter().map(|b| (!b.is_empty()).then(|| b.iter().fold(0.0, |a, x| a + x))).collect();
        s.tags.insert("hitcount".into(), interval_string.clone());
        let name = format!("hitcount({}, \"{interval_string}\"{})", s.name, if align { ", true" } else { "" });
        out.push(Series { name, start: new_start, step: interval, values, values_per_point: 1, ..s });
    }
    Ok(out)
}

/// `smartSummarize(seriesList, intervalString, func='sum', alignTo=None)`: `summarize` with
/// buckets from the series' start, which `alignTo` (a unit: `hours`, `days`, `weeks4`, ...)
/// first floors, fetching again from there.
pub(crate) fn smart_summarize(
    cx: &mut Context<'_>,
    mut args: Args<'_>,
    first: &Expr,
) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    let interval_string = args.string(1, "intervalString")?.ok_or_else(|| args.error("missing intervalString"))?;
    let func_name = args.string(2, "func")?.unwrap_or_else(|| "sum".into());
    let align_to = match args.take(3, "alignTo") {
        None | Some(Arg::Bool(_)) => None,
        Some(Arg::String(s)) => Some(s),
        Some(_) => return Err(args.error("alignTo must be a unit such as \"hours\"")),
    };
    args.finish()?;
    let func = AggFunc::parse(&func_name)
        .ok_or_else(|| bad("smartSummarize", format!("Unsupported aggregation function: {func_name}")))?;
    let interval = time_offset(&interval_string).filter(|i| *i > 0).ok_or_else(|| {
        bad("smartSummarize", format!("intervalString {interval_string:?} is not a positive interval"))
    })?;
    if let Some(unit) = align_to {
        let from = cx
            .floor_to_unit(cx.from, &unit)
            .ok_or_else(|| bad("smartSummarize", format!("alignTo {unit:?} is not a unit such as \"hours\"")))?;
        series = cx.evaluate_over(first, from, cx.until)?;
    }
    let mut out = Vec::with_capacity(series.len());
    for mut s in series {
        if (s.end - s.start) / interval > BUCKETS_MAX {
            return Err(bad(
                "smartSummarize",
                format!("an interval of {interval_string} makes more than {BUCKETS_MAX} points"),
            ));
        }
        let (values, aligned_end) = summarize_values(&s, func, interval, s.start, s.end);
        s.tags.insert("smartSummarize".into(), interval_string.clone());
        s.tags.insert("smartSummarizeFunction".into(), func_name.clone());
        let name = format!("smartSummarize({}, \"{interval_string}\", \"{func_name}\")", s.name);
        out.push(Series { name, end: aligned_end, step: interval, values, values_per_point: 1, ..s });
    }
    Ok(out)
}

/// Evaluates target text (a series' new name, a filled-in template) as a target of its own.
pub(crate) fn evaluate_text(cx: &mut Context<'_>, text: &str, function: &str) -> Result<Vec<Series>, EvalError> {
    let expr = target::parse(text).map_err(|e| bad(function, format!("{text:?}: {e}")))?;
    cx.count_uses(&expr);
    match eval(&expr, cx)? {
        Arg::Series(s) => Ok(s),
        _ => Err(bad(function, format!("{text:?} is not a series list"))),
    }
}

/// `useSeriesAbove(seriesList, value, search, replace)`: for each series whose maximum is
/// above `value`, the series named by its name with `search` replaced (Python's `re.sub`).
pub(crate) fn use_series_above(cx: &mut Context<'_>, mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let series = args.series(0, "seriesList")?;
    let value = args.required_number(1, "value")?.as_f64();
    let search = args.string(2, "search")?.ok_or_else(|| args.error("missing search"))?;
    let replace = args.string(3, "replace")?.ok_or_else(|| args.error("missing replace"))?;
    args.finish()?;
    let re = regex::RegexBuilder::new(&search)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| bad("useSeriesAbove", format!("search: {e}")))?;
    let replacement = super::alias::python_replacement(&replace);
    let names: Vec<String> = series
        .iter()
        .filter(|s| AggFunc::Max.apply(&s.points()).is_some_and(|m| m > value))
        .map(|s| re.replace_all(&s.name, replacement.as_str()).into_owned())
        .collect();
    let mut out = Vec::new();
    for name in names {
        out.extend(evaluate_text(cx, &name, "useSeriesAbove")?.into_iter().filter(|s| !s.values.is_empty()));
    }
    Ok(out)
}

/// `applyByNode(seriesList, nodeNum, templateFunction, newName=None)`: for each distinct prefix
/// of the names up to node `nodeNum` (sorted), the template with `%` replaced by the prefix,
/// evaluated; named by `newName` with the same replacement.
pub(crate) fn apply_by_node(cx: &mut Context<'_>, mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let series = args.series(0, "seriesList")?;
    let node = args.required_number(1, "nodeNum")?.as_f64() as i64;
    let template = args.string(2, "templateFunction")?.ok_or_else(|| args.error("missing templateFunction"))?;
    let new_name = args.string(3, "newName")?;
    args.finish()?;
    let mut prefixes: Vec<String> = series
        .iter()
        .map(|s| {
            let parts: Vec<&str> = s.name.split('.').collect();
            // Python's `[:node + 1]`: a negative end counts from the back.
            let end = node + 1;
            let end = if end < 0 { (parts.len() as i64 + end).max(0) } else { end.min(parts.len() as i64) };
            parts[..end as usize].join(".")
        })
        .collect();
    prefixes.sort();
    prefixes.dedup();
    // graphite-web lays every result over the last series' range (its loop variable).
    let Some(last) = series.last() else { return Ok(Vec::new()) };
    let (start, end) = (last.start, last.end);
    let mut out = Vec::new();
    for prefix in prefixes {
        for mut s in evaluate_text(cx, &template.replace('%', &prefix), "applyByNode")? {
            if let Some(n) = new_name.as_deref().filter(|n| !n.is_empty()) {
                s.name = n.replace('%', &prefix);
            }
            s.path_expression = prefix.clone();
            (s.start, s.end) = (start, end);
            out.push(s);
        }
    }
    Ok(out)
}

/// `groupByTags(seriesList, callback, *tags)`: series grouped by the values of the tags, each
/// group aggregated and named `name;tag=value;...` (the shared `name` tag, else the
/// callback's name).
pub(crate) fn group_by_tags(cx: &mut Context<'_>, mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let series = args.series(0, "seriesList")?;
    let callback = args.string(1, "callback")?.ok_or_else(|| args.error("missing callback"))?;
    let tags = args.strings_rest(2, "tags")?;
    args.finish()?;
    if tags.is_empty() {
        return Err(bad("groupByTags", "no tags specified"));
    }
    let by_name = tags.iter().any(|t| t == "name");
    let shared_name = {
        let mut names = series.iter().map(|s| s.tags.get("name").cloned().unwrap_or_default());
        let first = names.next();
        match first {
            Some(f) if names.all(|n| n == f) => f,
            _ => callback.clone(),
        }
    };
    let key = |s: &Series| {
        let head = if by_name { s.tags.get("name").cloned().unwrap_or_default() } else { shared_name.clone() };
        let mut parts: Vec<String> = tags
            .iter()
            .filter(|t| *t != "name")
            .map(|t| format!("{t}={}", s.tags.get(t).map_or("", String::as_str)))
            .collect();
        parts.sort();
        std::iter::once(head).chain(parts).collect::<Vec<_>>().join(";")
    };
    let mut grouped = group_by(cx, series, &callback, key, "groupByTags")?;
    for s in &mut grouped {
        s.path_expression = s.name.clone();
        let mut parts = s.name.split(';');
        s.tags.clear();
        s.tags.insert("name".into(), parts.next().unwrap_or_default().to_owned());
        for p in parts {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            s.tags.insert(k.to_owned(), v.to_owned());
        }
    }
    Ok(grouped)
}

/// `powSeries(*seriesLists)`: each row's first value raised to the next, and so on; a gap
/// where any is one or Python's `math.pow` refuses.
pub(crate) fn pow_series(cx: &mut Context<'_>, mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let mut series: Vec<Series> = args.series_rest(0, "seriesLists")?.into_iter().flatten().collect();
    args.finish()?;
    let Some(range) = normalize(&mut series) else { return Ok(Vec::new()) };
    let name = format!("powSeries({})", series.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(","));
    let columns: Vec<Vec<Option<f64>>> = series.iter().map(Series::points).collect();
    let len = columns.iter().map(Vec::len).max().unwrap_or(0);
    let values = (0..len)
        .map(|i| {
            let mut row = columns.iter().map(|c| c.get(i).copied().flatten());
            let first = row.next().flatten();
            row.fold(first, |acc, x| {
                let r = acc?.powf(x?);
                // math.pow raises on a domain error (NaN) and an overflow (infinity).
                r.is_finite().then_some(r)
            })
        })
        .collect();
    Ok(vec![Series::derived(name, range, values, cx.x_files_factor)])
}

/// `minMax(seriesList)`: each value scaled to 0..1 between the series' minimum and maximum
/// (all 0 for a flat series).
pub(crate) fn min_max(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    args.finish()?;
    for s in &mut series {
        super::transform::rename(s, format!("minMax({})", s.name));
        let points = s.points();
        let min = AggFunc::Min.apply(&points).unwrap_or(0.0);
        let max = AggFunc::Max.apply(&points).unwrap_or(0.0);
        s.values = points
            .into_iter()
            .map(|v| v.map(|v| if max - min == 0.0 { 0.0 } else { (v - min) / (max - min) }))
            .collect();
        s.values_per_point = 1;
    }
    Ok(series)
}

/// `interpolate(seriesList, limit=INF)`: runs of at most `limit` gaps between two values
/// filled on the straight line between them (not at the start or end).
pub(crate) fn interpolate(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    let limit = match args.take(1, "limit") {
        None => f64::INFINITY,
        Some(Arg::Number(n)) => n.as_f64(),
        Some(_) => return Err(args.error("limit must be a number")),
    };
    args.finish()?;
    for s in &mut series {
        super::transform::rename(s, format!("interpolate({})", s.name));
        let mut v = s.points();
        let mut gaps = 0usize;
        for i in 1..v.len() {
            match v[i] {
                None => gaps += 1,
                Some(_) if gaps == 0 => {}
                Some(value) => {
                    if let Some(before) = v[i - gaps - 1] {
                        if gaps as f64 <= limit {
                            let base = i - gaps - 1;
                            for (index, slot) in v.iter_mut().enumerate().take(i).skip(i - gaps) {
                                *slot = Some(before + (index - base) as f64 * (value - before) / (gaps + 1) as f64);
                            }
                        }
                    }
                    gaps = 0;
                }
            }
        }
        s.values = v;
        s.values_per_point = 1;
    }
    Ok(series)
}
