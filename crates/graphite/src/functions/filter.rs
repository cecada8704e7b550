//! Choosing and ordering series: `highest`/`lowest` and their `*Current`/`*Max`/`*Average`
//! forms, `filterSeries` and the `*Above`/`*Below` thresholds, `limit`, `exclude`, `grep`, and
//! the `sortBy*` family (graphite-web's "Filter Series" and "Sorting" groups). Orders are
//! stable, as Python's sorts are, and a series whose summary is a gap sorts as -inf.

use std::cmp::Ordering;

use super::combine::AggFunc;
use super::{Args, EvalError, Series};
use crate::target::Number;

/// A series' summary by `func`, gaps as -inf (graphite-web's `keyFunc`).
fn key(s: &Series, func: AggFunc) -> f64 {
    func.apply(&s.points()).unwrap_or(f64::NEG_INFINITY)
}

fn agg_func(args: &Args<'_>, name: &str) -> Result<AggFunc, EvalError> {
    AggFunc::parse(name.strip_suffix("Series").unwrap_or(name))
        .ok_or_else(|| args.error(format!("Unsupported aggregation function: {name}")))
}

fn sort_by_key(series: &mut [Series], func: AggFunc, descending: bool) {
    let mut keyed: Vec<(f64, Series)> = series.iter().map(|s| (key(s, func), s.clone())).collect();
    keyed.sort_by(|a, b| {
        let o = a.0.partial_cmp(&b.0).unwrap_or(Ordering::Equal);
        if descending {
            o.reverse()
        } else {
            o
        }
    });
    for (slot, (_, s)) in series.iter_mut().zip(keyed) {
        *slot = s;
    }
}

fn count(n: Number) -> usize {
    n.as_f64().max(0.0) as usize
}

/// `highest(seriesList, n=1, func='average')` and `lowest`; `fixed`: the `*Current`, `*Max`,
/// `*Average` forms, whose `n` is required and whose function is given.
pub(crate) fn highest(mut args: Args<'_>, descending: bool, fixed: Option<&str>) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    let n = match fixed {
        Some(_) => count(args.required_number(1, "n")?),
        None => args.number(1, "n")?.map_or(1, count),
    };
    let func_name = match fixed {
        Some(f) => f.to_owned(),
        None => args.string(2, "func")?.unwrap_or_else(|| "average".into()),
    };
    let func = agg_func(&args, &func_name)?;
    args.finish()?;
    sort_by_key(&mut series, func, descending);
    series.truncate(n);
    Ok(series)
}

/// graphite-web's `operatorFuncs`: a gap passes `!=`, `<` and `<=` only.
fn passes(op: &str, v: Option<f64>, threshold: f64) -> bool {
    match (op, v) {
        ("=", Some(x)) => x == threshold,
        ("!=", Some(x)) => x != threshold,
        (">", Some(x)) => x > threshold,
        (">=", Some(x)) => x >= threshold,
        ("<", Some(x)) => x < threshold,
        ("<=", Some(x)) => x <= threshold,
        ("!=" | "<" | "<=", None) => true,
        _ => false,
    }
}

/// `filterSeries(seriesList, func, operator, threshold)`; `fixed`: the `*Above`/`*Below` forms
/// (`currentAbove` is `last` `>`), whose only other argument is `n`.
pub(crate) fn filter_series(mut args: Args<'_>, fixed: Option<(&str, &str)>) -> Result<Vec<Series>, EvalError> {
    let series = args.series(0, "seriesList")?;
    let (func_name, op, threshold) = match fixed {
        Some((f, op)) => (f.to_owned(), op.to_owned(), args.required_number(1, "n")?.as_f64()),
        None => {
            let f = args.string(1, "func")?.ok_or_else(|| args.error("missing func"))?;
            let op = args.string(2, "operator")?.ok_or_else(|| args.error("missing operator"))?;
            (f, op, args.required_number(3, "threshold")?.as_f64())
        }
    };
    if !["=", "!=", ">", ">=", "<", "<="].contains(&op.as_str()) {
        return Err(args.error(format!("Unsupported operator: {op}")));
    }
    let func = agg_func(&args, &func_name)?;
    args.finish()?;
    Ok(series.into_iter().filter(|s| passes(&op, func.apply(&s.points()), threshold)).collect())
}

/// `limit(seriesList, n)`: the first `n`.
pub(crate) fn limit(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    let n = count(args.required_number(1, "n")?);
    args.finish()?;
    series.truncate(n);
    Ok(series)
}

/// `exclude(seriesList, pattern)` (`keep`: false) and `grep` (true): by a regular expression
/// searched in the name.
pub(crate) fn grep(mut args: Args<'_>, keep: bool) -> Result<Vec<Series>, EvalError> {
    let series = args.series(0, "seriesList")?;
    let pattern = args.string(1, "pattern")?.ok_or_else(|| args.error("missing pattern"))?;
    args.finish()?;
    let re = regex::RegexBuilder::new(&pattern).size_limit(1 << 20).build().map_err(|e| EvalError::BadArgument {
        function: if keep { "grep" } else { "exclude" }.into(),
        message: format!("pattern: {e}"),
    })?;
    Ok(series.into_iter().filter(|s| re.is_match(&s.name) == keep).collect())
}

/// `sortByName(seriesList, natural=False, reverse=False)`.
pub(crate) fn sort_by_name(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    let natural = boolean(&mut args, 1, "natural")?;
    let reverse = boolean(&mut args, 2, "reverse")?;
    args.finish()?;
    // Natural order: every run of digits zero-padded to ten places, as graphite-web pads them.
    let sort_key = |s: &Series| -> String {
        if !natural {
            return s.name.clone();
        }
        let mut out = String::new();
        let mut digits = String::new();
        for c in s.name.chars().chain(std::iter::once('\0')) {
            if c.is_ascii_digit() {
                digits.push(c);
                continue;
            }
            if !digits.is_empty() {
                let trimmed = digits.trim_start_matches('0');
                out.push_str(&format!("{:0>10}", if trimmed.is_empty() { "0" } else { trimmed }));
                digits.clear();
            }
            if c != '\0' {
                out.push(c);
            }
        }
        out
    };
    series.sort_by(|a, b| {
        let o = sort_key(a).cmp(&sort_key(b));
        if reverse {
            o.reverse()
        } else {
            o
        }
    });
    Ok(series)
}

fn boolean(args: &mut Args<'_>, index: usize, name: &str) -> Result<bool, EvalError> {
    match args.take(index, name) {
        None => Ok(false),
        Some(super::Arg::Bool(b)) => Ok(b),
        Some(_) => Err(args.error(format!("{name} must be true or false"))),
    }
}

/// `sortBy(seriesList, func='average', reverse=False)`.
pub(crate) fn sort_by(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    let func_name = args.string(1, "func")?.unwrap_or_else(|| "average".into());
    let func = agg_func(&args, &func_name)?;
    let reverse = boolean(&mut args, 2, "reverse")?;
    args.finish()?;
    sort_by_key(&mut series, func, reverse);
    Ok(series)
}

/// `sortByMaxima` (descending maxima), `sortByTotal` (descending sums), `sortByMinima`
/// (ascending minima of the series whose maximum is above 0).
pub(crate) fn sort_by_fixed(mut args: Args<'_>, which: &str) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    args.finish()?;
    match which {
        "sortByMaxima" => sort_by_key(&mut series, AggFunc::Max, true),
        "sortByTotal" => sort_by_key(&mut series, AggFunc::Sum, true),
        _ => {
            series.retain(|s| AggFunc::Max.apply(&s.points()).unwrap_or(0.0) > 0.0);
            sort_by_key(&mut series, AggFunc::Min, false);
        }
    }
    Ok(series)
}
