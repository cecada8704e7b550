//! Point-by-point arithmetic: `scale`, `offset`, `absolute` (graphite-web's "Transform"
//! group). Each renames its series after itself (`scale(a.b,10)`, with the factor as Python's
//! `%g` writes it) and records itself in the tags (the factor as the float graphite-web's
//! parameter check made of it: `10.0`).

use super::{py_g, Args, EvalError, Series};
use crate::render::py_float;
use crate::target::Number;

fn rename(s: &mut Series, name: String) {
    s.name = name;
    s.path_expression = s.name.clone();
}

fn factor(args: &mut Args<'_>) -> Result<Number, EvalError> {
    args.required_number(1, "factor")
}

/// `scale(seriesList, factor)`: every value times the factor.
pub(crate) fn scale(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    let f = factor(&mut args)?;
    args.finish()?;
    for s in &mut series {
        s.tags.insert("scale".into(), py_float(f.as_f64()));
        rename(s, format!("scale({},{})", s.name, py_g(f.as_f64())));
        for v in s.values.iter_mut().flatten() {
            *v *= f.as_f64();
        }
    }
    Ok(series)
}

/// `offset(seriesList, factor)`: the factor added to every value.
pub(crate) fn offset(mut args: Args<'_>) -> Result<Vec<Series>, EvalError> {
    let mut series = args.series(0, "seriesList")?;
    let f = factor(&mut args)?;
    args.finish()?;
    for s in &mut series {
        s.tags.insert("offset".into(), py_float(f.as_f64()));
        rename(s, format!("offset({},{})", s.name, py_g(f.as_f64())));
        for v in s.values.iter_mut().flatten() {
            *v += f.as_f64();
        }
    }
    Ok(series)
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
