//! Graphite render targets as `/render` takes them from a URL: parsing never panics, and a
//! parsed target evaluates (over a few small series, gaps and different steps among them, laid
//! from the start of the range asked for) to series or to an error, never a panic.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use strata_graphite::functions::{evaluate, Context, EvalError, Series};
use strata_graphite::target::parse;

fn store() -> Vec<Series> {
    let series = |name: &str, step: i64, values: &[Option<f64>]| {
        let tags = BTreeMap::from([("name".to_owned(), name.to_owned())]);
        let end = step * values.len() as i64;
        Series::fetched(name.to_owned(), tags, (0, end, step), values.to_vec(), name.to_owned(), 0.0)
    };
    vec![
        series("a.b", 10, &[Some(1.0), None, Some(-3.5), Some(f64::INFINITY)]),
        series("a.c", 20, &[None, Some(2.0)]),
        series("d", 30, &[]),
    ]
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(expr) = parse(text) else { return };
    let store = store();
    // Laid from the interval after `from`, as whisper answers: shifted and widened ranges give
    // series of other starts.
    let mut fetch = |pe: &str, from: i64, _until: i64| -> Result<Vec<Series>, EvalError> {
        Ok(store
            .iter()
            .filter(|s| pe == "*" || s.name.starts_with(pe))
            .map(|s| {
                let start = from.saturating_sub(from.rem_euclid(s.step)).saturating_add(s.step);
                Series { start, end: start.saturating_add(s.end - s.start), ..s.clone() }
            })
            .collect())
    };
    let mut cx = Context::new(0, 100, 0.0, 1000, &mut fetch);
    let _ = evaluate(&expr, &mut cx);
});
