//! Series made from nothing but the request's range: `identity`, `timeFunction` (`time`),
//! `sinFunction` (`sin`), one point per step from the range's start, as graphite-web makes them.

use super::{Args, Context, EvalError, Series};
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
    if (cx.until - cx.from) / step > POINTS_MAX {
        return Err(EvalError::BadArgument {
            function: function.to_owned(),
            message: format!("a step of {step} s makes more than {POINTS_MAX} points"),
        });
    }
    Ok((cx.from..cx.until).step_by(step as usize).collect())
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
