//! Series made from nothing but the request's range: `identity`, `timeFunction` (`time`),
//! `sinFunction` (`sin`), one point per step from the range's start, as graphite-web makes them;
//! and `events`, the server's events counted per second.

use super::{Args, Consolidation, Context, EvalError, Series};
use crate::target::Number;

/// Most points a generated series may have.
const POINTS_MAX: i64 = 10_000_000;

/// The name argument and the step (`step`, or 60 s), checked.
fn name_and_step(args: &mut Args<'_>, step_index: Option<usize>) -> Result<(String, i64), EvalError> {
    let name = args.string(0, "name")?.ok_or_else(|| args.error("missing name"))?;
    let step = match step_index {
        Some(i) => args.number(i, "step")?.map_or(60.0, Number::as_f64),
        None => 60.0,
    };
    if !(1.0..=1e9).contains(&step) {
        return Err(args.error(format!("step must be a positive number of seconds, not {step}")));
    }
    Ok((name, step as i64))
}

/// The times from the range's start, `step` apart, before its end.
fn times(cx: &Context<'_>, step: i64, function: &str) -> Result<Vec<i64>, EvalError> {
    check_points(cx, step, function)?;
    Ok((cx.from..cx.until).step_by(step as usize).collect())
}

/// Refuses a range with more than `POINTS_MAX` points `step` apart.
fn check_points(cx: &Context<'_>, step: i64, function: &str) -> Result<(), EvalError> {
    if (cx.until - cx.from) / step > POINTS_MAX {
        return Err(EvalError::BadArgument {
            function: function.to_owned(),
            message: format!("a step of {step} s makes more than {POINTS_MAX} points"),
        });
    }
    Ok(())
}

/// `identity(name)`: each point's value is its time.
pub(crate) fn identity(cx: &mut Context<'_>, mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let (name, step) = name_and_step(&mut args, None)?;
    args.finish()?;
    let values = times(cx, step, "identity")?.into_iter().map(|t| Some(t as f64)).collect();
    let mut s = Series::derived(name.clone(), (cx.from, cx.until, step), values, cx.x_files_factor);
    s.path_expression = format!("identity(\"{name}\")");
    Ok(vec![s])
}

/// `timeFunction(name, step=60)` (also `time`): each point's value is its time.
pub(crate) fn time_function(cx: &mut Context<'_>, mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let (name, step) = name_and_step(&mut args, Some(1))?;
    args.finish()?;
    let values = times(cx, step, "timeFunction")?.into_iter().map(|t| Some(t as f64)).collect();
    Ok(vec![Series::derived(name, (cx.from, cx.until, step), values, cx.x_files_factor)])
}

/// `sinFunction(name, amplitude=1, step=60)` (also `sin`): the sine of each point's time.
pub(crate) fn sin_function(cx: &mut Context<'_>, mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let amplitude = args.number(1, "amplitude")?.map_or(1.0, Number::as_f64);
    let (name, step) = name_and_step(&mut args, Some(2))?;
    args.finish()?;
    let values = times(cx, step, "sinFunction")?.into_iter().map(|t| Some((t as f64).sin() * amplitude)).collect();
    Ok(vec![Series::derived(name, (cx.from, cx.until, step), values, cx.x_files_factor)])
}

/// `events(*tags)`: how many of the server's events with all the tags (`"*"` alone: every
/// event) fall in each second of the range, a gap where none does; named `events("a", "b")`
/// and consolidated by sum, as graphite-web makes it (to be drawn with `drawAsInfinite`). An
/// event at the range's very end, which graphite-web fails on, falls outside the series.
pub(crate) fn events(cx: &mut Context<'_>, mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let tags = args.strings_rest(0, "tags")?;
    args.finish()?;
    let error = |message: String| EvalError::BadArgument { function: "events".to_owned(), message };
    if tags.is_empty() {
        return Err(error("needs a tag, or \"*\" for every event".to_owned()));
    }
    let source = cx.events.ok_or_else(|| error("this server keeps no events".to_owned()))?;
    let name = format!("events(\"{}\")", tags.join("\", \""));
    let (start, end) = (cx.from, cx.until);
    check_points(cx, 1, "events")?;
    let points = (end - start).max(0) as usize;
    let selected = (tags != ["*"]).then_some(&tags[..]);
    let mut values: Vec<Option<f64>> = vec![None; points];
    for t in source(selected, start, end) {
        if let Some(v) = usize::try_from(t - start).ok().and_then(|i| values.get_mut(i)) {
            *v = Some(v.unwrap_or(0.0) + 1.0);
        }
    }
    let mut s = Series::derived(name, (start, end, 1), values, cx.x_files_factor);
    s.consolidation = Consolidation::Sum;
    Ok(vec![s])
}
