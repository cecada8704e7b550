//! Combining series point by point: `aggregate` and its `*Series` forms (`sumSeries`,
//! `averageSeries`, ...), graphite-web's `aggregate` with its `normalize`: the series are brought
//! to the least common multiple of their steps (each consolidating by its own function), from the
//! earliest start to the latest end, and each row of points is folded unless too few are present.

use std::collections::BTreeMap;

use super::{Arg, Args, Context, EvalError, Series};
use crate::target::Number;

/// An aggregation function, by graphite-web's names (`aggFuncs` and their aliases).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AggFunc {
    Average,
    AvgZero,
    Median,
    Sum,
    Min,
    Max,
    Diff,
    Stddev,
    Count,
    Range,
    Multiply,
    Last,
}

impl AggFunc {
    pub(crate) fn parse(name: &str) -> Option<AggFunc> {
        Some(match name {
            "average" | "avg" => AggFunc::Average,
            "avg_zero" => AggFunc::AvgZero,
            "median" => AggFunc::Median,
            "sum" | "total" => AggFunc::Sum,
            "min" => AggFunc::Min,
            "max" => AggFunc::Max,
            "diff" => AggFunc::Diff,
            "stddev" => AggFunc::Stddev,
            "count" => AggFunc::Count,
            "range" | "rangeOf" => AggFunc::Range,
            "multiply" => AggFunc::Multiply,
            "last" | "current" => AggFunc::Last,
            _ => return None,
        })
    }

    /// graphite-web's `safe*` function over one row (gaps are `None`).
    pub(crate) fn apply(self, row: &[Option<f64>]) -> Option<f64> {
        let present = || row.iter().flatten().copied();
        let any = row.iter().any(Option::is_some);
        match self {
            AggFunc::Sum => any.then(|| present().sum()),
            AggFunc::Average => any.then(|| present().sum::<f64>() / present().count() as f64),
            AggFunc::AvgZero => {
                (!row.is_empty()).then(|| row.iter().map(|v| v.unwrap_or(0.0)).sum::<f64>() / row.len() as f64)
            }
            AggFunc::Median => {
                let mut v: Vec<f64> = present().collect();
                if v.is_empty() {
                    return None;
                }
                v.sort_by(f64::total_cmp);
                let mid = v.len() / 2;
                Some(if v.len().is_multiple_of(2) { (v[mid - 1] + v[mid]) / 2.0 } else { v[mid] })
            }
            AggFunc::Min => present().reduce(|a, b| if b < a { b } else { a }),
            AggFunc::Max => present().reduce(|a, b| if b > a { b } else { a }),
            AggFunc::Diff => {
                let mut it = present();
                let first = it.next()?;
                // Python: sum([first] + [-x for x in rest]), from 0 and left to right.
                Some(it.fold(0.0 + first, |acc, x| acc + -x))
            }
            AggFunc::Stddev => {
                let n = present().count();
                if n == 0 {
                    return None;
                }
                let avg = present().sum::<f64>() / n as f64;
                let sq: f64 = present().fold(0.0, |acc, x| acc + (x - avg) * (x - avg));
                Some((sq / n as f64).sqrt())
            }
            // `len` of the present values: 0 for a row of gaps, which is still a value.
            AggFunc::Count => Some(present().count() as f64),
            AggFunc::Range => Some(AggFunc::Max.apply(row)? - AggFunc::Min.apply(row)?),
            AggFunc::Multiply => {
                if row.iter().any(Option::is_none) || row.is_empty() {
                    return None;
                }
                present().reduce(|a, b| a * b)
            }
            AggFunc::Last => row.iter().rev().flatten().next().copied(),
        }
    }
}

/// Least common multiple, as graphite-web's `lcm`.
pub(crate) fn lcm(a: i64, b: i64) -> i64 {
    fn gcd(a: i64, b: i64) -> i64 {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    if a == b {
        return a;
    }
    let (a, b) = if a < b { (b, a) } else { (a, b) };
    a / gcd(a, b) * b
}

/// graphite-web's `normalize`: every series consolidated to the common step; the common
/// `(start, end, step)`. `None` for no series.
pub(crate) fn normalize(series: &mut [Series]) -> Option<(i64, i64, i64)> {
    let step = series.iter().map(|s| s.step).reduce(lcm)?;
    for s in series.iter_mut() {
        s.values_per_point = (step / s.step.max(1)) as usize;
    }
    let start = series.iter().map(|s| s.start).min()?;
    let mut end = series.iter().map(|s| s.end).max()?;
    end -= (end - start) % step;
    Some((start, end, step))
}

/// Unique path expressions in order, joined by commas (`formatPathExpressions`).
pub(crate) fn path_expressions(series: &[Series]) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for s in series {
        if !seen.contains(&s.path_expression.as_str()) {
            seen.push(&s.path_expression);
        }
    }
    seen.join(",")
}

/// Rows read across the columns at a time: a block of them is gathered column by column
/// (each column read in order, the block staying in cache) before each row is folded.
const ROWS_PER_BLOCK: usize = 32;

/// Rows of one task when the rows are spread over the cores: small enough that the tasks
/// divide evenly between the threads (`spread` gives each a contiguous run of them).
const ROWS_PER_TASK: usize = 512;

/// `fold(row)` for each row `i` of the columns (the `i`-th value of each, a gap past a
/// column's end), as many rows as the longest column; row ranges spread over the cores when
/// the columns hold enough points. Each row is folded whole, in column order, so the result
/// is the same however the rows are spread.
pub(crate) fn fold_rows<C: AsRef<[Option<f64>]> + Sync>(
    columns: &[C],
    fold: impl Fn(&[Option<f64>]) -> Option<f64> + Sync,
) -> Vec<Option<f64>> {
    let len = columns.iter().map(|c| c.as_ref().len()).max().unwrap_or(0);
    let width = columns.len();
    let fold_range = |rows: std::ops::Range<usize>| -> Vec<Option<f64>> {
        let mut out = Vec::with_capacity(rows.len());
        let mut block = vec![None; ROWS_PER_BLOCK * width];
        let mut first = rows.start;
        while first < rows.end {
            let n = ROWS_PER_BLOCK.min(rows.end - first);
            for (c, column) in columns.iter().enumerate() {
                let column = column.as_ref();
                for r in 0..n {
                    block[r * width + c] = column.get(first + r).copied().flatten();
                }
            }
            out.extend((0..n).map(|r| fold(&block[r * width..(r + 1) * width])));
            first += n;
        }
        out
    };
    if len.saturating_mul(width) < super::PARALLEL_POINTS_MIN {
        return fold_range(0..len);
    }
    let tasks: Vec<_> = (0..len).step_by(ROWS_PER_TASK).map(|s| s..(s + ROWS_PER_TASK).min(len)).collect();
    super::spread(tasks, fold_range).into_iter().flatten().collect()
}

/// graphite-web's `aggregate(seriesList, func, xFilesFactor)` over the series of every list.
pub(crate) fn aggregate(
    cx: &Context<'_>,
    mut series: Vec<Series>,
    func_name: &str,
    func: AggFunc,
    x_files_factor: Option<f64>,
) -> Vec<Series> {
    let Some((start, end, step)) = normalize(&mut series) else { return Vec::new() };
    let xff = x_files_factor.unwrap_or(cx.x_files_factor);
    let name = format!("{func_name}Series({})", path_expressions(&series));
    let columns: Vec<std::borrow::Cow<'_, [Option<f64>]>> = series.iter().map(Series::points_cow).collect();
    let values = fold_rows(&columns, |row| {
        let present = row.iter().filter(|v| v.is_some()).count();
        // xffValues: some present, and at least the factor's share.
        (present > 0 && present as f64 / row.len() as f64 >= xff).then(|| func.apply(row)).flatten()
    });
    // The tags every series shares, then `name` (unless shared) and `aggregatedBy`.
    let mut tags: BTreeMap<String, String> = series[0].tags.clone();
    for s in &series[1..] {
        tags.retain(|k, v| s.tags.get(k) == Some(v));
    }
    tags.entry("name".into()).or_insert_with(|| name.clone());
    tags.insert("aggregatedBy".into(), func_name.to_owned());
    let mut out = Series::derived(name, (start, end, step), values, xff);
    out.tags = tags;
    vec![out]
}

/// `aggregate(seriesList, func, xFilesFactor=None)`.
pub(crate) fn aggregate_call(cx: &mut Context<'_>, mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let series = args.series(0, "seriesList")?;
    let raw = args.string(1, "func")?.ok_or_else(|| args.error("missing func"))?;
    let xff = args.number(2, "xFilesFactor")?.map(|n| n.as_f64());
    args.finish()?;
    // `sumSeries` works as `sum`.
    let name = raw.strip_suffix("Series").unwrap_or(&raw);
    let func = AggFunc::parse(name).ok_or_else(|| EvalError::BadArgument {
        function: "aggregate".into(),
        message: format!("Unsupported aggregation function: {raw}"),
    })?;
    Ok(aggregate(cx, series, name, func, xff))
}

/// `sumSeries(*seriesLists)` and the other `*Series` forms: `aggregate` of all lists together.
pub(crate) fn series_form(cx: &mut Context<'_>, mut args: Args<'_>, func_name: &str) -> Result<Vec<Series>, EvalError> {
    let lists = args.series_rest(0, "seriesLists")?;
    args.finish()?;
    let func = AggFunc::parse(func_name).expect("a known aggregation");
    Ok(aggregate(cx, lists.into_iter().flatten().collect(), func_name, func, None))
}

/// `multiplySeries(*seriesLists)`: one series alone is returned as it is (graphite-web's
/// legacy rule).
pub(crate) fn multiply_series(cx: &mut Context<'_>, mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let mut lists = args.series_rest(0, "seriesLists")?;
    args.finish()?;
    if lists.len() == 1 && lists[0].len() == 1 {
        return Ok(lists.remove(0));
    }
    Ok(aggregate(cx, lists.into_iter().flatten().collect(), "multiply", AggFunc::Multiply, None))
}

/// `divideSeries(dividendSeriesList, divisorSeries)`: each dividend over the one divisor, the
/// pair brought to a common step; no divisor makes every dividend all gaps.
pub(crate) fn divide_series(cx: &mut Context<'_>, mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let mut dividends = args.series(0, "dividendSeriesList")?;
    let divisors = args.series(1, "divisorSeries")?;
    args.finish()?;
    if divisors.is_empty() {
        for s in &mut dividends {
            super::transform::rename(s, format!("divideSeries({},MISSING)", s.name));
            s.values.fill(None);
        }
        return Ok(dividends);
    }
    if divisors.len() > 1 {
        return Err(EvalError::BadArgument {
            function: "divideSeries".into(),
            message: format!("divideSeries second argument must reference exactly 1 series (got {})", divisors.len()),
        });
    }
    Ok(dividends
        .into_iter()
        .map(|dividend| {
            let name = format!("divideSeries({},{})", dividend.name, divisors[0].name);
            let mut both = [dividend, divisors[0].clone()];
            let (start, end, step) = normalize(&mut both).expect("two series");
            let (a, b) = (both[0].points(), both[1].points());
            let values = (0..a.len().max(b.len()))
                .map(|i| {
                    let (x, y) = (a.get(i).copied().flatten(), b.get(i).copied().flatten());
                    match (x, y) {
                        (Some(x), Some(y)) if y != 0.0 => Some(x / y),
                        _ => None,
                    }
                })
                .collect();
            Series::derived(name, (start, end, step), values, cx.x_files_factor)
        })
        .collect())
}

/// `constantLine(value)`: three points across the request's range, named by the value.
pub(crate) fn constant_line(cx: &mut Context<'_>, mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let value = args.required_number(0, "value")?.as_f64();
    args.finish()?;
    Ok(vec![constant(cx, &crate::render::py_float(value), value)])
}

/// `threshold(value, label=None, color=None)`: `constantLine`, named `label` when given (the
/// color only matters to graphs).
pub(crate) fn threshold(cx: &mut Context<'_>, mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let value = args.required_number(0, "value")?.as_f64();
    let label = args.string(1, "label")?;
    let _color = args.string(2, "color")?;
    args.finish()?;
    let mut line = constant(cx, &crate::render::py_float(value), value);
    if let Some(label) = label.filter(|l| !l.is_empty()) {
        line.name = label;
    }
    Ok(vec![line])
}

pub(crate) fn constant(cx: &Context<'_>, name: &str, value: f64) -> Series {
    let (start, end) = (cx.from, cx.until);
    // At least a second: a one-second range would make a step of 0, which no later function
    // could divide by.
    let step = (((end - start) as f64 / 2.0) as i64).max(1);
    let mut s = Series::derived(name.to_owned(), (start, end, step), vec![Some(value); 3], cx.x_files_factor);
    s.path_expression = format!("constantLine({name})");
    s
}

/// `countSeries(*seriesLists)`: how many series there are, at every point (a constant 0 line
/// for none).
pub(crate) fn count_series(cx: &mut Context<'_>, mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let mut series: Vec<Series> = args.series_rest(0, "seriesLists")?.into_iter().flatten().collect();
    args.finish()?;
    let Some((start, end, step)) = normalize(&mut series) else {
        let mut zero = constant(cx, "0", 0.0);
        zero.path_expression = "countSeries()".into();
        return Ok(vec![zero]);
    };
    let name = format!("countSeries({})", path_expressions(&series));
    let len = series.iter().map(|s| s.points().len()).max().unwrap_or(0);
    let n = series.len() as f64;
    Ok(vec![Series::derived(name, (start, end, step), vec![Some(n); len], cx.x_files_factor)])
}

/// Groups in first-seen order by `key`, each aggregated by `callback` (an aggregation, or a
/// `*Series` function's name) and named by its key.
pub(crate) fn group_by(
    cx: &mut Context<'_>,
    series: Vec<Series>,
    callback: &str,
    key: impl Fn(&Series) -> String,
    function: &str,
) -> Result<Vec<Series>, EvalError> {
    let bad = || EvalError::BadArgument {
        function: function.into(),
        message: format!("Unsupported aggregation function: {callback}"),
    };
    // graphite-web calls the series function of that name when there is one (`sum` is
    // `sumSeries`), else `aggregate` with it: the same values and names either way.
    let (func_name, legacy_multiply) = match callback {
        "sumSeries" | "sum" | "total" => ("sum", false),
        "averageSeries" | "avg" => ("average", false),
        "minSeries" => ("min", false),
        "maxSeries" => ("max", false),
        "diffSeries" => ("diff", false),
        "stddevSeries" => ("stddev", false),
        "rangeOfSeries" => ("rangeOf", false),
        "multiplySeries" => ("multiply", true),
        other => (other, false),
    };
    let func = AggFunc::parse(func_name).ok_or_else(bad)?;
    let mut out = Vec::new();
    for (k, group) in groups_in_order(series, key) {
        let aggregated =
            if legacy_multiply && group.len() == 1 { group } else { aggregate(cx, group, func_name, func, None) };
        if let Some(mut s) = aggregated.into_iter().next() {
            s.name = k;
            out.push(s);
        }
    }
    Ok(out)
}

/// `series` grouped by `key`, the groups in the order their first series came (graphite-web
/// keeps the keys' first-seen order).
fn groups_in_order(series: Vec<Series>, key: impl Fn(&Series) -> String) -> Vec<(String, Vec<Series>)> {
    let mut out: Vec<(String, Vec<Series>)> = Vec::new();
    let mut index: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for s in series {
        let k = key(&s);
        match index.get(&k) {
            Some(&i) => out[i].1.push(s),
            None => {
                index.insert(k.clone(), out.len());
                out.push((k, vec![s]));
            }
        }
    }
    out
}

/// `groupByNode(seriesList, nodeNum, callback='average')` and `groupByNodes(seriesList,
/// callback, *nodes)`: series grouped by the given nodes (or tags) of their names.
pub(crate) fn group_by_nodes(cx: &mut Context<'_>, mut args: Args<'_>, single: bool) -> Result<Vec<Series>, EvalError> {
    let series = args.series(0, "seriesList")?;
    let (callback, nodes) = if single {
        let node = args.take(1, "nodeNum").ok_or_else(|| args.error("missing nodeNum"))?;
        if !matches!(node, Arg::Number(_) | Arg::String(_)) {
            return Err(args.error("nodeNum must be a node number or a tag name"));
        }
        let callback = args.string(2, "callback")?.unwrap_or_else(|| "average".into());
        (callback, vec![node])
    } else {
        let callback = args.string(1, "callback")?.ok_or_else(|| args.error("missing callback"))?;
        (callback, args.nodes_rest(2, "nodes")?)
    };
    let function = if single { "groupByNode" } else { "groupByNodes" };
    args.finish()?;
    group_by(cx, series, &callback, |s| super::alias::agg_key(s, &nodes), function)
}

/// `aggregateWithWildcards(seriesList, func, *positions)` and the `sum`/`average`/`multiply`
/// `SeriesWithWildcards` forms: series grouped by their names without the given nodes.
pub(crate) fn with_wildcards(
    cx: &mut Context<'_>,
    mut args: Args<'_>,
    fixed: Option<&str>,
) -> Result<Vec<Series>, EvalError> {
    let series = args.series(0, "seriesList")?;
    let (func, from) = match fixed {
        Some(f) => (f.to_owned(), 1),
        None => (args.string(1, "func")?.ok_or_else(|| args.error("missing func"))?, 2),
    };
    let rest: Vec<Arg> = args.positional.drain(from.min(args.positional.len())..).collect();
    let positions: Vec<i64> = rest
        .into_iter()
        .map(|a| match a {
            Arg::Number(Number::Int(i)) => Ok(i),
            _ => Err(args.error("positions must be whole numbers")),
        })
        .collect::<Result<_, _>>()?;
    let function = match fixed {
        Some("sum") => "sumSeriesWithWildcards",
        Some("average") => "averageSeriesWithWildcards",
        Some(_) => "multiplySeriesWithWildcards",
        None => "aggregateWithWildcards",
    };
    args.finish()?;
    let key = |s: &Series| -> String {
        s.name
            .split('.')
            .enumerate()
            .filter(|(i, _)| !positions.contains(&(*i as i64)))
            .map(|(_, p)| p)
            .collect::<Vec<_>>()
            .join(".")
    };
    // Always `aggregate` here, never the legacy single-series `multiplySeries`.
    let name = if func == "multiply" { "multiply" } else { func.as_str() };
    let agg = AggFunc::parse(name.strip_suffix("Series").unwrap_or(name)).ok_or_else(|| EvalError::BadArgument {
        function: function.into(),
        message: format!("Unsupported aggregation function: {func}"),
    })?;
    let agg_name = name.strip_suffix("Series").unwrap_or(name).to_owned();
    Ok(groups_in_order(series, key)
        .into_iter()
        .filter_map(|(k, group)| {
            let mut s = aggregate(cx, group, &agg_name, agg, None).into_iter().next()?;
            s.name = k;
            Some(s)
        })
        .collect())
}

/// `percentileOfSeries(seriesList, n, interpolate=False)`: the n-th percentile across the
/// series at each point.
pub(crate) fn percentile_of_series(cx: &mut Context<'_>, mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    let n = args.required_number(1, "n")?.as_f64();
    let interpolate = match args.take(2, "interpolate") {
        None => false,
        Some(Arg::Bool(b)) => b,
        Some(_) => return Err(args.error("interpolate must be true or false")),
    };
    args.finish()?;
    if n <= 0.0 {
        return Err(EvalError::BadArgument {
            function: "percentileOfSeries".into(),
            message: "The requested percent is required to be greater than 0".into(),
        });
    }
    let Some(first) = series.first() else { return Ok(Vec::new()) };
    let name = format!("percentileOfSeries({},{})", first.path_expression, super::py_g(n));
    let (start, end, step) = normalize(&mut series).expect("some series");
    let columns: Vec<Vec<Option<f64>>> = series.iter().map(Series::points).collect();
    let len = columns.iter().map(Vec::len).max().unwrap_or(0);
    let values = (0..len)
        .map(|i| {
            let row: Vec<Option<f64>> = columns.iter().map(|c| c.get(i).copied().flatten()).collect();
            super::transform::percentile(&row, n, interpolate)
        })
        .collect();
    Ok(vec![Series::derived(name, (start, end, step), values, cx.x_files_factor)])
}

/// `removeEmptySeries(seriesList, xFilesFactor=None)`: series with no values (or fewer than
/// the factor's share).
pub(crate) fn remove_empty_series(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let series = args.series(0, "seriesList")?;
    let xff = args.number(1, "xFilesFactor")?.map_or(0.0, Number::as_f64);
    args.finish()?;
    Ok(series
        .into_iter()
        .filter(|s| {
            let points = s.points();
            let present = points.iter().filter(|v| v.is_some()).count();
            present > 0 && present as f64 / points.len() as f64 >= xff
        })
        .collect())
}

/// `unique(*seriesLists)`: the first series of each name.
pub(crate) fn unique(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let lists = args.series_rest(0, "seriesLists")?;
    args.finish()?;
    let mut seen = std::collections::HashSet::new();
    Ok(lists.into_iter().flatten().filter(|s| seen.insert(s.name.clone())).collect())
}
