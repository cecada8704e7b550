//! Functions over whole series lists: `group`, `fallbackSeries`, the pairwise
//! `*SeriesLists`, `weightedAverage`, `mapSeries`/`reduceSeries`, the percentile filters
//! (`removeAbovePercentile`, `removeBelowPercentile`, `removeBetweenPercentile`,
//! `averageOutsidePercentile`), `aggregateLine`, `stacked`, `timeSlice`, `substr`,
//! `aliasQuery` and `randomWalk`, as graphite-web computes them.

use super::alias::agg_key;
use super::combine::{aggregate, constant, lcm, AggFunc};
use super::transform::percentile;
use super::{py_g, Arg, Args, Context, EvalError, Series};
use crate::target::Number;

fn bad(function: &str, message: impl Into<String>) -> EvalError {
    EvalError::BadArgument { function: function.to_owned(), message: message.into() }
}

/// `group(*seriesLists)`: the lists as one.
pub(crate) fn group(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let lists = args.series_rest(0, "seriesLists")?;
    args.finish()?;
    Ok(lists.into_iter().flatten().collect())
}

/// `fallbackSeries(seriesList, fallback)`: the list, or the fallback when it is empty.
pub(crate) fn fallback_series(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let series = args.series(0, "seriesList")?;
    let fallback = args.series(1, "fallback")?;
    args.finish()?;
    Ok(if series.is_empty() { fallback } else { series })
}

/// `aggregateSeriesLists(first, second, func, xFilesFactor=None)` and its fixed forms
/// (`sumSeriesLists`, `diffSeriesLists`, `multiplySeriesLists`): the i-th series of each list
/// aggregated together, named `<func>Series(<first>,<second>)`.
pub(crate) fn aggregate_series_lists(
    cx: &mut Context<'_>,
    mut args: Args<'_>,
    fixed: Option<&str>,
) -> Result<Vec<Series>, EvalError> {
    let first = args.series(0, "seriesListFirstPos")?;
    let second = args.series(1, "seriesListSecondPos")?;
    let func_name = match fixed {
        Some(f) => f.to_owned(),
        None => args.string(2, "func")?.ok_or_else(|| args.error("missing func"))?,
    };
    let xff = if fixed.is_none() { args.number(3, "xFilesFactor")?.map(Number::as_f64) } else { None };
    args.finish()?;
    let function = fixed.map_or("aggregateSeriesLists".to_owned(), |f| format!("{f}SeriesLists"));
    if first.len() != second.len() {
        return Err(bad(&function, "seriesListFirstPos and seriesListSecondPos argument must have equal length"));
    }
    let func_name = func_name.strip_suffix("Series").unwrap_or(&func_name).to_owned();
    let func = AggFunc::parse(&func_name)
        .ok_or_else(|| bad(&function, format!("Unsupported aggregation function: {func_name}")))?;
    let mut out = Vec::new();
    for (a, b) in first.into_iter().zip(second) {
        let names = format!("{},{}", a.name, b.name);
        if let Some(mut s) = aggregate(cx, vec![a, b], &func_name, func, xff).into_iter().next() {
            let head = s.name.find("Series(").map_or(s.name.as_str(), |i| &s.name[..i]).to_owned();
            s.name = format!("{head}Series({names})");
            out.push(s);
        }
    }
    Ok(out)
}

/// `divideSeriesLists(dividendSeriesList, divisorSeriesList)`: the i-th series of the first
/// divided by the i-th of the second.
pub(crate) fn divide_series_lists(cx: &mut Context<'_>, mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let dividends = args.series(0, "dividendSeriesList")?;
    let divisors = args.series(1, "divisorSeriesList")?;
    args.finish()?;
    if dividends.len() != divisors.len() {
        return Err(bad(
            "divideSeriesLists",
            "dividendSeriesList and divisorSeriesList argument must have equal length",
        ));
    }
    Ok(dividends
        .into_iter()
        .zip(divisors)
        .map(|(a, b)| {
            let name = format!("divideSeries({},{})", a.name, b.name);
            let step = lcm(a.step, b.step);
            let mut pair = [a, b];
            for s in &mut pair {
                s.values_per_point = (step / s.step.max(1)) as usize;
            }
            let start = pair[0].start.min(pair[1].start);
            let mut end = pair[0].end.max(pair[1].end);
            end -= (end - start) % step;
            let (x, y) = (pair[0].points(), pair[1].points());
            let values = (0..x.len().max(y.len()))
                .map(|i| match (x.get(i).copied().flatten(), y.get(i).copied().flatten()) {
                    (Some(a), Some(b)) if b != 0.0 => Some(a / b),
                    _ => None,
                })
                .collect();
            Series::derived(name, (start, end, step), values, cx.x_files_factor)
        })
        .collect())
}

/// `weightedAverage(seriesListAvg, seriesListWeight, *nodes)`: the sum of value × weight over
/// the sum of weights, series paired by the nodes of their names.
pub(crate) fn weighted_average(cx: &mut Context<'_>, mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let averages = args.series(0, "seriesListAvg")?;
    let weights = args.series(1, "seriesListWeight")?;
    let nodes = args.nodes_rest(2, "nodes")?;
    args.finish()?;
    if averages.len() != weights.len() {
        return Err(bad(
            "weightedAverage",
            format!(
                "weightedAverage must receive the same number of series for seriesListAvg and seriesListWeight but \
                 received respectively {} and {}",
                averages.len(),
                weights.len()
            ),
        ));
    }
    // By key, in first-seen order: (average, weight).
    let mut keyed: Vec<(String, Option<Series>, Option<Series>)> = Vec::new();
    let slot = |k: String, keyed: &mut Vec<(String, Option<Series>, Option<Series>)>| match keyed
        .iter()
        .position(|e| e.0 == k)
    {
        Some(i) => i,
        None => {
            keyed.push((k, None, None));
            keyed.len() - 1
        }
    };
    for (a, w) in averages.iter().zip(&weights) {
        let i = slot(agg_key(a, &nodes), &mut keyed);
        keyed[i].1 = Some(a.clone());
        let i = slot(agg_key(w, &nodes), &mut keyed);
        keyed[i].2 = Some(w.clone());
    }
    let xff = cx.x_files_factor;
    let products: Vec<Series> = keyed
        .into_iter()
        .filter_map(|(_, a, w)| {
            let (a, w) = (a?, w?);
            let (x, y) = (a.points(), w.points());
            let values = (0..x.len().max(y.len()))
                .map(|i| Some(x.get(i).copied().flatten()? * y.get(i).copied().flatten()?))
                .collect();
            let name = format!("product({},{})", w.name, a.name);
            Some(Series::derived(name, (a.start, a.end, a.step), values, xff))
        })
        .collect();
    if products.is_empty() {
        return Ok(Vec::new());
    }
    let sum = |list: Vec<Series>| aggregate(cx, list, "sum", AggFunc::Sum, None).pop();
    let (Some(products), Some(total_weight)) = (sum(products), sum(weights.clone())) else { return Ok(Vec::new()) };
    let (x, y) = (products.points(), total_weight.points());
    let values = (0..x.len().max(y.len()))
        .map(|i| match (x.get(i).copied().flatten(), y.get(i).copied().flatten()) {
            (Some(a), Some(b)) if b != 0.0 => Some(a / b),
            _ => None,
        })
        .collect();
    let sorted_expressions = |list: &[Series]| {
        let mut e: Vec<&str> = list.iter().map(|s| s.path_expression.as_str()).collect();
        e.sort();
        e.dedup();
        e.join(",")
    };
    let node_text: Vec<String> = nodes
        .iter()
        .map(|n| match n {
            Arg::Number(n) => super::number_str(*n),
            Arg::String(s) => s.clone(),
            _ => String::new(),
        })
        .collect();
    let name = format!(
        "weightedAverage({}, {}, {})",
        sorted_expressions(&averages),
        sorted_expressions(&weights),
        node_text.join(",")
    );
    Ok(vec![Series::derived(name, (products.start, products.end, products.step), values, xff)])
}

/// `mapSeries(seriesList, *mapNodes)`: the series grouped by the nodes, a list per group, for
/// `reduceSeries`.
pub(crate) fn map_series(mut args: Args<'_>) -> Result<Vec<Vec<Series>>, EvalError> {
    let series = args.series(0, "seriesList")?;
    let nodes = args.nodes_rest(1, "mapNodes")?;
    args.finish()?;
    let mut out: Vec<(String, Vec<Series>)> = Vec::new();
    for s in series {
        let k = agg_key(&s, &nodes);
        match out.iter_mut().find(|(key, _)| *key == k) {
            Some((_, group)) => group.push(s),
            None => out.push((k, vec![s])),
        }
    }
    Ok(out.into_iter().map(|(_, g)| g).collect())
}

/// `reduceSeries(seriesLists, reduceFunction, reduceNode, *reduceMatchers)`: in each list (as
/// `mapSeries` makes them), the series whose node `reduceNode` is one of the matchers passed,
/// in the matchers' order and each as its own list, to the function `reduceFunction`; the
/// result named `<nodes before>.reduce.<function>`.
pub(crate) fn reduce_series(cx: &mut Context<'_>, mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let lists = match args.take(0, "seriesLists") {
        Some(Arg::SeriesLists(l)) => l,
        Some(Arg::Series(s)) => vec![s],
        _ => return Err(args.error("seriesLists must be series lists (mapSeries makes them)")),
    };
    let function = args.string(1, "reduceFunction")?.ok_or_else(|| args.error("missing reduceFunction"))?;
    let node = args.required_number(2, "reduceNode")?.as_f64() as i64;
    let matchers = args.strings_rest(3, "reduceMatchers")?;
    args.finish()?;
    let mut keyed: Vec<(String, Vec<Option<Series>>)> = Vec::new();
    for s in lists.into_iter().flatten() {
        let parts: Vec<&str> = s.name.split('.').collect();
        let index = if node < 0 { parts.len() as i64 + node } else { node };
        let Some(&part) = usize::try_from(index).ok().and_then(|i| parts.get(i)) else {
            return Err(bad("reduceSeries", format!("{} has no node {node}", s.name)));
        };
        let Some(m) = matchers.iter().position(|m| m == part) else { continue };
        let key = format!("{}.reduce.{function}", parts[..index as usize].join("."));
        let i = match keyed.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                keyed.push((key, vec![None; matchers.len()]));
                keyed.len() - 1
            }
        };
        keyed[i].1[m] = Some(s);
    }
    let mut out = Vec::new();
    for (key, slots) in keyed {
        let mut positional = Vec::with_capacity(slots.len());
        for (slot, m) in slots.into_iter().zip(&matchers) {
            let s = slot.ok_or_else(|| bad("reduceSeries", format!("{key}: no series matches {m}")))?;
            positional.push(Arg::Series(vec![s]));
        }
        let call_args = Args { function: &function, positional, keyword: Vec::new() };
        if let Some(mut s) = super::dispatch(&function, call_args, cx, &[])?.into_iter().next() {
            s.name = key;
            out.push(s);
        }
    }
    Ok(out)
}

/// `removeAbovePercentile(seriesList, n)` and `removeBelowPercentile`: values above (below)
/// the series' n-th percentile become gaps.
pub(crate) fn remove_percentile(mut args: Args<'_>, above: bool) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    let n = args.required_number(1, "n")?.as_f64();
    args.finish()?;
    let what = if above { "removeAbovePercentile" } else { "removeBelowPercentile" };
    for s in &mut series {
        super::transform::rename(s, format!("{what}({}, {})", s.name, py_g(n)));
        let points = s.points();
        // graphite-web skips a series whose nPercentile has no points.
        let Some(p) = percentile(&points, n, false).filter(|_| (s.end - s.start) / s.step.max(1) > 0) else { continue };
        // graphite-web's nPercentile tags the series it shares its tags with.
        s.tags.insert("nPercentile".into(), crate::render::py_float(n));
        s.values = points
            .into_iter()
            .map(|v| match v {
                Some(x) if above && x > p => None,
                Some(x) if !above && x < p => None,
                other => other,
            })
            .collect();
        s.values_per_point = 1;
    }
    Ok(series)
}

/// `removeBetweenPercentile(seriesList, n)`: the series with at least one point outside the
/// band between the (100−n)-th and n-th percentiles of the points at its time.
pub(crate) fn remove_between_percentile(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let series = args.series(0, "seriesList")?;
    let mut n = args.required_number(1, "n")?.as_f64();
    args.finish()?;
    if n < 50.0 {
        n = 100.0 - n;
    }
    let columns: Vec<Vec<Option<f64>>> = series.iter().map(Series::points).collect();
    let len = columns.iter().map(Vec::len).min().unwrap_or(0);
    let bands: Vec<(Option<f64>, Option<f64>)> = (0..len)
        .map(|i| {
            let column: Vec<Option<f64>> = columns.iter().map(|c| c[i]).collect();
            (percentile(&column, 100.0 - n, false), percentile(&column, n, false))
        })
        .collect();
    Ok(series
        .into_iter()
        .zip(&columns)
        .filter(|(_, points)| {
            points.iter().zip(&bands).any(|(v, (low, high))| match (low, v, high) {
                (Some(l), Some(x), Some(h)) => !(l < x && x < h),
                // Python 3 cannot compare a gap; graphite-web fails. A gap is not inside.
                _ => true,
            })
        })
        .map(|(s, _)| s)
        .collect())
}

/// `averageOutsidePercentile(seriesList, n)`: the series whose average lies outside the band
/// between the (100−n)-th and n-th percentiles of all the averages.
pub(crate) fn average_outside_percentile(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let series = args.series(0, "seriesList")?;
    let mut n = args.required_number(1, "n")?.as_f64();
    args.finish()?;
    if n < 50.0 {
        n = 100.0 - n;
    }
    let averages: Vec<Option<f64>> = series.iter().map(|s| AggFunc::Average.apply(&s.points())).collect();
    let (low, high) = (percentile(&averages, 100.0 - n, false), percentile(&averages, n, false));
    Ok(series
        .into_iter()
        .zip(averages)
        .filter(|(_, avg)| match (low, avg, high) {
            (Some(l), Some(a), Some(h)) => !(l < *a && *a < h),
            _ => true,
        })
        .map(|(s, _)| s)
        .collect())
}

/// `aggregateLine(seriesList, func='average', keepStep=False)`: each series replaced by a
/// constant line at its aggregate (over the request's range, or at its own step).
pub(crate) fn aggregate_line(cx: &mut Context<'_>, mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let series = args.series(0, "seriesList")?;
    let func_name = args.string(1, "func")?.unwrap_or_else(|| "average".into());
    let keep_step = match args.take(2, "keepStep") {
        None => false,
        Some(Arg::Bool(b)) => b,
        Some(_) => return Err(args.error("keepStep must be true or false")),
    };
    args.finish()?;
    let func = AggFunc::parse(&func_name)
        .ok_or_else(|| bad("aggregateLine", format!("Unsupported aggregation function: {func_name}")))?;
    Ok(series
        .into_iter()
        .map(|s| {
            let value = func.apply(&s.points());
            let name = format!("aggregateLine({}, {})", s.name, value.map_or_else(|| "None".to_owned(), py_g));
            if keep_step {
                let len = s.values.len();
                Series { path_expression: name.clone(), name, values: vec![value; len], values_per_point: 1, ..s }
            } else {
                let text = value.map_or_else(|| "None".to_owned(), crate::render::py_float);
                let mut line = constant(cx, &text, value.unwrap_or(f64::NAN));
                if value.is_none() {
                    line.values = vec![None; line.values.len()];
                }
                line.name = name.clone();
                line.path_expression = name;
                line
            }
        })
        .collect())
}

/// `stacked(seriesList, stack='__DEFAULT__')`: each series' values added to the running total
/// of the stack (kept for later `stacked` calls in the request), named `stacked(...)` for the
/// default stack.
pub(crate) fn stacked(cx: &mut Context<'_>, mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let series = args.series(0, "seriesLists")?;
    let stack = args.string(1, "stack")?.unwrap_or_else(|| "__DEFAULT__".into());
    args.finish()?;
    let mut total = cx.stacks.remove(&stack).unwrap_or_default();
    let out = series
        .into_iter()
        .map(|mut s| {
            let points = s.points();
            if total.len() < points.len() {
                total.resize(points.len(), 0.0);
            }
            let values = points
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    v.map(|v| {
                        total[i] += v;
                        total[i]
                    })
                })
                .collect();
            if stack == "__DEFAULT__" {
                s.tags.insert("stacked".into(), stack.clone());
                s.name = format!("stacked({})", s.name);
            }
            Series { path_expression: s.name.clone(), values, values_per_point: 1, ..s }
        })
        .collect();
    cx.stacks.insert(stack, total);
    Ok(out)
}

/// `timeSlice(seriesList, startSliceAt, endSliceAt='now')`: the points outside the two dates
/// become gaps.
pub(crate) fn time_slice(cx: &mut Context<'_>, mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    let mut date = |index: usize, name: &str, default: Option<&str>| -> Result<i64, EvalError> {
        let text = match args.take(index, name) {
            Some(Arg::String(s)) => s,
            Some(Arg::Number(n)) => super::number_str(n),
            None => default.map(str::to_owned).ok_or_else(|| bad("timeSlice", format!("missing {name}")))?,
            Some(_) => return Err(bad("timeSlice", format!("{name} must be a date"))),
        };
        crate::attime::parse_at_time(&text, cx.now, &cx.time_zone)
            .ok_or_else(|| bad("timeSlice", format!("{name} {text:?} is not a time Graphite understands")))
    };
    let start = date(1, "startSliceAt", None)?;
    let end = date(2, "endSliceAt", Some("now"))?;
    args.finish()?;
    for s in &mut series {
        s.tags.insert("timeSliceStart".into(), start.to_string());
        s.tags.insert("timeSliceEnd".into(), end.to_string());
        s.name = format!("timeSlice({}, {start}, {end})", s.name);
        // graphite-web walks from the request's start, not the series'.
        let mut t = cx.from;
        let step = s.step;
        s.values = s
            .points()
            .into_iter()
            .map(|v| {
                let kept = v.filter(|_| t >= start && t <= end);
                t += step;
                kept
            })
            .collect();
        s.values_per_point = 1;
    }
    Ok(series)
}

/// `substr(seriesList, start=0, stop=0)`: the name's nodes from `start` to `stop` (to the
/// end for 0), of the innermost path inside the name.
pub(crate) fn substr(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    let start = args.number(1, "start")?.map_or(0, |n| n.as_f64() as i64);
    let stop = args.number(2, "stop")?.map_or(0, |n| n.as_f64() as i64);
    args.finish()?;
    for s in &mut series {
        let left = s.name.rfind('(').map_or(0, |i| i + 1);
        let right = s.name.find(')').unwrap_or(s.name.len());
        let clean = s.name.get(left..right.max(left)).unwrap_or("");
        let parts: Vec<&str> = clean.split('.').collect();
        let len = parts.len() as i64;
        let bound = |i: i64| if i < 0 { (len + i).max(0) } else { i.min(len) } as usize;
        let (a, b) = (bound(start), if stop == 0 { parts.len() } else { bound(stop) });
        let name = if a < b { parts[a..b].join(".") } else { String::new() };
        s.name = name.split(',').next().unwrap_or("").to_owned();
    }
    Ok(series)
}

/// Python's `fmt % value` for one number: conversions `d i u f F e E g G s r x X o %` with
/// flags `-+ 0#`, a width and a precision.
pub(crate) fn py_percent_format(fmt: &str, value: f64) -> Result<String, String> {
    let mut out = String::new();
    let mut chars = fmt.chars().peekable();
    let mut used = false;
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut flags = String::new();
        while let Some(&f) = chars.peek().filter(|f| "-+ 0#".contains(**f)) {
            flags.push(f);
            chars.next();
        }
        let mut width = String::new();
        while let Some(&d) = chars.peek().filter(|d| d.is_ascii_digit()) {
            width.push(d);
            chars.next();
        }
        let mut precision: Option<usize> = None;
        if chars.peek() == Some(&'.') {
            chars.next();
            let mut p = String::new();
            while let Some(&d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                p.push(d);
                chars.next();
            }
            precision = Some(p.parse().unwrap_or(usize::MAX));
        }
        // A name is a legend: a huge width or precision is a mistake, not a request for memory.
        if width.len() > 4 || precision.is_some_and(|p| p > 100) {
            return Err("width or precision too large (at most 9999 and 100)".into());
        }
        let conversion = chars.next().ok_or("incomplete format")?;
        if conversion == '%' {
            out.push('%');
            continue;
        }
        if used {
            return Err("not enough arguments for format string".into());
        }
        used = true;
        let integral = matches!(conversion, 'd' | 'i' | 'u' | 'x' | 'X' | 'o');
        if !value.is_finite() && integral {
            return Err(format!("cannot convert {} to an integer", crate::render::py_float(value)));
        }
        let body = match conversion {
            _ if !value.is_finite() && conversion != 'r' && conversion != 's' => {
                let text = crate::render::py_float(value);
                if conversion.is_ascii_uppercase() {
                    text.to_uppercase()
                } else {
                    text
                }
            }
            'd' | 'i' | 'u' => format!("{}", value.trunc() as i64),
            'f' | 'F' => format!("{value:.*}", precision.unwrap_or(6)),
            'e' | 'E' => {
                let s = format!("{value:.*e}", precision.unwrap_or(6));
                let (m, e) = s.split_once('e').expect("an exponent");
                let e: i32 = e.parse().expect("an integer exponent");
                let s = format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs());
                if conversion == 'E' {
                    s.to_uppercase()
                } else {
                    s
                }
            }
            'g' | 'G' => {
                let s = super::py_g_precision(value, precision.unwrap_or(6));
                if conversion == 'G' {
                    s.to_uppercase()
                } else {
                    s
                }
            }
            's' | 'r' => crate::render::py_float(value),
            'x' => format!("{:x}", value.trunc() as i64),
            'X' => format!("{:X}", value.trunc() as i64),
            'o' => format!("{:o}", value.trunc() as i64),
            other => return Err(format!("unsupported format character '{other}'")),
        };
        let numeric = !matches!(conversion, 's' | 'r');
        let body = if numeric && flags.contains('+') && !body.starts_with('-') {
            format!("+{body}")
        } else if numeric && flags.contains(' ') && !body.starts_with('-') {
            format!(" {body}")
        } else {
            body
        };
        let width: usize = width.parse().unwrap_or(0);
        let pad = width.saturating_sub(body.chars().count());
        if flags.contains('-') {
            out.push_str(&body);
            out.extend(std::iter::repeat_n(' ', pad));
        } else if flags.contains('0') && numeric {
            let (sign, digits) = match body.strip_prefix(['-', '+', ' ']) {
                Some(rest) => (&body[..1], rest),
                None => ("", body.as_str()),
            };
            out.push_str(sign);
            out.extend(std::iter::repeat_n('0', pad));
            out.push_str(digits);
        } else {
            out.extend(std::iter::repeat_n(' ', pad));
            out.push_str(&body);
        }
    }
    if !used {
        return Err("not all arguments converted during string formatting".into());
    }
    Ok(out)
}

/// `aliasQuery(seriesList, search, replace, newName)`: each series named by `newName`
/// (`%`-formatted) with the last value of the series its name, with `search` replaced, selects.
pub(crate) fn alias_query(cx: &mut Context<'_>, mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    let search = args.string(1, "search")?.ok_or_else(|| args.error("missing search"))?;
    let replace = args.string(2, "replace")?.ok_or_else(|| args.error("missing replace"))?;
    let new_name = args.string(3, "newName")?.ok_or_else(|| args.error("missing newName"))?;
    args.finish()?;
    let re = regex::RegexBuilder::new(&search)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| bad("aliasQuery", format!("search: {e}")))?;
    let replacement = super::alias::python_replacement(&replace);
    for s in &mut series {
        let query = re.replace_all(&s.name, replacement.as_str()).into_owned();
        let found = super::calculate::evaluate_text(cx, &query, "aliasQuery")?;
        let first = found.first().ok_or_else(|| bad("aliasQuery", format!("No series found with query: {query}")))?;
        let current = AggFunc::Last
            .apply(&first.points())
            .ok_or_else(|| bad("aliasQuery", format!("Cannot get last value of series: {}", first.name)))?;
        s.name = py_percent_format(&new_name, current).map_err(|e| bad("aliasQuery", format!("newName: {e}")))?;
    }
    Ok(series)
}

/// `randomWalk(name, step=60)` (also `randomWalkFunction`): from 0, each point the previous
/// plus a uniform step in [-0.5, 0.5).
pub(crate) fn random_walk(cx: &mut Context<'_>, mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let name = args.string(0, "name")?.ok_or_else(|| args.error("missing name"))?;
    let step = args.number(1, "step")?.map_or(60.0, Number::as_f64);
    args.finish()?;
    if !(1.0..=1e9).contains(&step) || (cx.until - cx.from) as f64 / step > 1e7 {
        return Err(bad(
            "randomWalk",
            format!("step {step} is not a positive number of seconds making at most 10^7 points"),
        ));
    }
    let step = step as i64;
    // xorshift64*, seeded from the clock: a walk need not be reproducible, only random.
    let mut state =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64) | 1;
    let mut next = || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut current = 0.0;
    let values = (cx.from..cx.until)
        .step_by(step as usize)
        .map(|_| {
            let v = current;
            current += next() - 0.5;
            Some(v)
        })
        .collect();
    Ok(vec![Series::derived(name, (cx.from, cx.until, step), values, cx.x_files_factor)])
}
