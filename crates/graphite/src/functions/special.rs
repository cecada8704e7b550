//! Percentages, legends and consolidation settings: `asPercent`, `legendValue`,
//! `cactiStyle`, `consolidateBy`, `cumulative`, `setXFilesFactor` (graphite-web's "Combine",
//! "Alias" and "Special" groups).

use super::alias::agg_key;
use super::combine::{normalize, path_expressions, AggFunc};
use super::{Arg, Args, Consolidation, Context, EvalError, Series};
use crate::render::py_float;
use crate::target::Number;

/// graphite-web's `safeMul(safeDiv(a, b), 100.0)`: a gap where either is, or the total is 0.
fn percent(value: Option<f64>, total: Option<f64>) -> Option<f64> {
    match (value, total) {
        (Some(v), Some(t)) if t != 0.0 => Some(v / t * 100.0),
        _ => None,
    }
}

/// Python's `izip_longest` of two point lists into percentages.
fn percentages(values: &[Option<f64>], totals: &[Option<f64>]) -> Vec<Option<f64>> {
    (0..values.len().max(totals.len()))
        .map(|i| percent(values.get(i).copied().flatten(), totals.get(i).copied().flatten()))
        .collect()
}

/// The sum of each row of points (graphite-web's `safeSum` over `izip_longest`).
fn row_sums(series: &[Series]) -> Vec<Option<f64>> {
    let columns: Vec<Vec<Option<f64>>> = series.iter().map(Series::points).collect();
    let len = columns.iter().map(Vec::len).max().unwrap_or(0);
    (0..len)
        .map(|i| {
            let mut row = columns.iter().filter_map(|c| c.get(i).copied().flatten()).peekable();
            row.peek().is_some().then(|| row.sum())
        })
        .collect()
}

/// Several series made one by summing (`sumSeries(...)` named), or the one series itself.
fn total_of(mut group: Vec<Series>, x_files_factor: f64) -> Series {
    if group.len() == 1 {
        return group.pop().expect("one series");
    }
    let name = format!("sumSeries({})", path_expressions(&group));
    let range = normalize(&mut group).expect("a group has series");
    Series::derived(name, range, row_sums(&group), x_files_factor)
}

/// `asPercent(seriesList, total=None, *nodes)`: each series as a percentage of a total — the
/// sum of all series, a number, one total series, or one total per series (paired by sorted
/// name); with nodes, series and totals are grouped by those nodes and matched by group.
pub(crate) fn as_percent(cx: &mut Context<'_>, mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    let total = args.take(1, "total");
    let nodes = args.nodes_rest(2, "nodes")?;
    args.finish()?;
    let xff = cx.x_files_factor;
    // graphite-web normalizes first, and has nothing to answer for no series.
    if normalize(&mut series).is_none() {
        return Ok(Vec::new());
    }
    if !nodes.is_empty() {
        return as_percent_by_nodes(series, total, &nodes, xff);
    }
    let derived = |name: String, range, values| Series::derived(name, range, values, xff);
    match total {
        None => {
            let totals = row_sums(&series);
            let text = format!("sumSeries({})", path_expressions(&series));
            Ok(series
                .iter()
                .map(|s| {
                    let name = format!("asPercent({},{text})", s.name);
                    derived(name, (s.start, s.end, s.step), percentages(&s.points(), &totals))
                })
                .collect())
        }
        Some(Arg::Number(n)) => {
            let t = n.as_f64();
            let text = match n {
                Number::Int(i) => i.to_string(),
                Number::Float(f) => py_float(f),
            };
            let len = series[0].values.len();
            Ok(series
                .iter()
                .map(|s| {
                    let name = format!("asPercent({},{text})", s.name);
                    derived(name, (s.start, s.end, s.step), percentages(&s.points(), &vec![Some(t); len]))
                })
                .collect())
        }
        Some(Arg::Series(mut totals)) if totals.len() == series.len() => {
            series.sort_by(|a, b| a.name.cmp(&b.name));
            totals.sort_by(|a, b| a.name.cmp(&b.name));
            Ok(series
                .into_iter()
                .zip(totals)
                .map(|(s, t)| {
                    let name = format!("asPercent({},{})", s.name, t.name);
                    let mut pair = [s, t];
                    let range = normalize(&mut pair).expect("two series");
                    derived(name, range, percentages(&pair[0].points(), &pair[1].points()))
                })
                .collect())
        }
        Some(Arg::Series(mut totals)) if totals.len() == 1 => {
            let mut all: Vec<Series> = series.into_iter().chain(totals.drain(..)).collect();
            normalize(&mut all);
            let total = all.pop().expect("the total");
            let total_points = total.points();
            Ok(all
                .iter()
                .map(|s| {
                    let name = format!("asPercent({},{})", s.name, total.name);
                    derived(name, (s.start, s.end, s.step), percentages(&s.points(), &total_points))
                })
                .collect())
        }
        Some(Arg::Series(_)) => Err(EvalError::BadArgument {
            function: "asPercent".into(),
            message: "asPercent second argument must be missing, a single digit, reference exactly 1 series or \
                      reference the same number of series as the first argument"
                .into(),
        }),
        Some(_) => Err(EvalError::BadArgument {
            function: "asPercent".into(),
            message: "total must be None, a number or a seriesList".into(),
        }),
    }
}

/// `asPercent` with nodes: series and totals grouped by `nodes`, each series a percentage of
/// its group's total (its group's sum without a total list); a group on one side only gives
/// `MISSING` series of gaps.
fn as_percent_by_nodes(
    series: Vec<Series>,
    total: Option<Arg>,
    nodes: &[Arg],
    xff: f64,
) -> Result<Vec<Series>, EvalError> {
    let mut keys: Vec<String> = Vec::new();
    let mut groups: std::collections::HashMap<String, Vec<Series>> = std::collections::HashMap::new();
    for s in series {
        let k = agg_key(&s, nodes);
        if !groups.contains_key(&k) {
            keys.push(k.clone());
        }
        groups.entry(k).or_default().push(s);
    }
    let mut totals: std::collections::HashMap<String, Series> = std::collections::HashMap::new();
    match total {
        None => {
            for k in &keys {
                totals.insert(k.clone(), total_of(groups[k].clone(), xff));
            }
        }
        Some(Arg::Series(list)) => {
            let mut by_key: std::collections::HashMap<String, Vec<Series>> = std::collections::HashMap::new();
            for s in list {
                let k = agg_key(&s, nodes);
                if !keys.contains(&k) {
                    keys.push(k.clone());
                }
                by_key.entry(k).or_default().push(s);
            }
            totals = by_key.into_iter().map(|(k, group)| (k, total_of(group, xff))).collect();
        }
        Some(_) => {
            return Err(EvalError::BadArgument {
                function: "asPercent".into(),
                message: "total must be None or a seriesList".into(),
            })
        }
    }
    let mut out = Vec::new();
    for k in &keys {
        let Some(group) = groups.get(k) else {
            let t = &totals[k];
            let name = format!("asPercent(MISSING,{})", t.name);
            out.push(Series::derived(name, (t.start, t.end, t.step), vec![None; t.values.len()], xff));
            continue;
        };
        for s in group {
            match totals.get(k) {
                None => {
                    let name = format!("asPercent({},MISSING)", s.name);
                    out.push(Series::derived(name, (s.start, s.end, s.step), vec![None; s.values.len()], xff));
                }
                Some(t) => {
                    let name = format!("asPercent({},{})", s.name, t.name);
                    let mut pair = [s.clone(), t.clone()];
                    let range = normalize(&mut pair).expect("two series");
                    out.push(Series::derived(name, range, percentages(&pair[0].points(), &pair[1].points()), xff));
                }
            }
        }
    }
    Ok(out)
}

/// A value as Python's `str` writes what graphite-web's aggregation functions return: a float
/// as `repr`, `count`'s integer without a fraction, nothing as `None`.
fn py_str(value: Option<f64>, func: AggFunc) -> String {
    match value {
        None => "None".into(),
        Some(v) if func == AggFunc::Count => format!("{}", v as i64),
        Some(v) => py_float(v),
    }
}

/// graphite-web's `format_units(v, system=...)`: the value scaled to the largest unit prefix
/// it reaches (`k`, `M`, ... or `Ki`, `Mi`, ...), a near-integer above 1 floored.
fn format_units(v: f64, system: &str, units: Option<&str>) -> (f64, String) {
    const SI: [(&str, f64); 5] = [("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)];
    const BINARY: [(&str, f64); 5] = [
        ("Pi", 1_125_899_906_842_624.0),
        ("Ti", 1_099_511_627_776.0),
        ("Gi", 1_073_741_824.0),
        ("Mi", 1_048_576.0),
        ("Ki", 1024.0),
    ];
    let table: &[(&str, f64)] = if system == "binary" { &BINARY } else { &SI };
    let floor_near = |x: f64| if x - x.floor() < 1e-11 && x > 1.0 { x.floor() } else { x };
    for (prefix, size) in table {
        if v.abs() >= *size {
            // graphite-web tests `v > 1` on the unscaled value here.
            let v2 = v / size;
            let v2 = if v2 - v2.floor() < 1e-11 && v > 1.0 { v2.floor() } else { v2 };
            return (v2, format!("{prefix}{}", units.unwrap_or("")));
        }
    }
    (floor_near(v), units.unwrap_or("").to_owned())
}

/// `legendValue(seriesList, *valueTypes)`: each named aggregate of the series appended to its
/// name (`a.b (avg: 5.0)`), or with a last `si`/`binary` in columns with unit prefixes.
pub(crate) fn legend_value(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    let mut types = args.strings_rest(1, "valuesTypes")?;
    args.finish()?;
    let system = match types.last().map(String::as_str) {
        Some(s @ ("si" | "binary")) => {
            let s = s.to_owned();
            types.pop();
            Some(s)
        }
        _ => None,
    };
    for value_type in &types {
        let func = AggFunc::parse(value_type);
        for s in &mut series {
            let value = func.and_then(|f| f.apply(&s.points()));
            match (&system, func) {
                (None, Some(f)) => s.name = format!("{} ({value_type}: {})", s.name, py_str(value, f)),
                (None, None) => s.name = format!("{} ({value_type}: (?))", s.name),
                (Some(system), _) => {
                    let formatted = match (func, value) {
                        (None, _) => "(?)".to_owned(),
                        (Some(_), None) => "None".to_owned(),
                        (Some(_), Some(v)) => {
                            let (v, prefix) = format_units(v, system, None);
                            format!("{v:.2}{prefix}")
                        }
                    };
                    s.name = format!("{:<20}{value_type:<5}{formatted:<10}", s.name);
                }
            }
        }
    }
    Ok(series)
}

/// `cactiStyle(seriesList, system=None, units=None)`: the name padded to a column, then the
/// current, maximum and minimum values in columns (`a.b Current:5.00 Max:9.00 Min:1.00 `).
pub(crate) fn cacti_style(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    let system = args.string(1, "system")?;
    let units = args.string(2, "units")?;
    args.finish()?;
    if series.is_empty() {
        return Ok(series);
    }
    let fmt = |x: f64| -> String {
        match (&system, &units) {
            (Some(system), Some(units)) => {
                let (v, prefix) = format_units(x, system, Some(units));
                format!("{v:.2} {prefix}")
            }
            (Some(system), None) => {
                let (v, prefix) = format_units(x, system, None);
                format!("{v:.2}{prefix}")
            }
            (None, Some(units)) => format!("{x:.2} {units}"),
            (None, None) => format!("{x:.2}"),
        }
    };
    let stats: Vec<[Option<f64>; 3]> = series
        .iter()
        .map(|s| {
            let p = s.points();
            [AggFunc::Last.apply(&p), AggFunc::Max.apply(&p), AggFunc::Min.apply(&p)]
        })
        .collect();
    // Column widths from the values truncated to integers (3 for a missing or zero one), as
    // graphite-web measures them, plus 3.
    let width = |k: usize| {
        stats.iter().map(|st| fmt(st[k].filter(|v| *v != 0.0).map_or(3.0, |v| v.trunc())).len()).max().unwrap_or(0) + 3
    };
    let (name_len, last_len, max_len, min_len) =
        (series.iter().map(|s| s.name.chars().count()).max().unwrap_or(0), width(0), width(1), width(2));
    for (s, st) in series.iter_mut().zip(&stats) {
        let text = |v: Option<f64>| v.map_or_else(|| "nan".to_owned(), fmt);
        s.name = format!(
            "{:<name_len$} Current:{:<last_len$} Max:{:<max_len$} Min:{:<min_len$} ",
            s.name,
            text(st[0]),
            text(st[1]),
            text(st[2]),
        );
    }
    Ok(series)
}

/// `consolidateBy(seriesList, consolidationFunc)` and `cumulative(seriesList)` (`sum`): how
/// several values fold into one point when `maxDataPoints` or a step change asks for it.
pub(crate) fn consolidate_by(mut args: Args<'_>, fixed: Option<&str>) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    let func = match fixed {
        Some(f) => f.to_owned(),
        None => args.string(1, "consolidationFunc")?.ok_or_else(|| args.error("missing consolidationFunc"))?,
    };
    let how = Consolidation::parse(&func).ok_or_else(|| {
        args.error(format!(
            "Invalid consolidation function: '{func}' (sum, average, avg, avg_zero, min, max, first, last)"
        ))
    })?;
    args.finish()?;
    for s in &mut series {
        s.consolidation = how;
        s.tags.insert("consolidateBy".into(), func.clone());
        super::transform::rename(s, format!("consolidateBy({},\"{func}\")", s.name));
    }
    Ok(series)
}

/// `setXFilesFactor(seriesList, xFilesFactor)` (also `xFilesFactor`): the share of values a
/// consolidated point needs, for these series and for the functions evaluated after it.
pub(crate) fn set_x_files_factor(cx: &mut Context<'_>, mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    let x = args.required_number(1, "xFilesFactor")?.as_f64();
    args.finish()?;
    if !(0.0..=1.0).contains(&x) {
        return Err(EvalError::BadArgument {
            function: "setXFilesFactor".into(),
            message: format!("xFilesFactor {x} is not from 0 to 1"),
        });
    }
    cx.x_files_factor = x;
    for s in &mut series {
        s.x_files_factor = x;
        s.tags.insert("xFilesFactor".into(), py_float(x));
    }
    Ok(series)
}
