//! Render-function evaluation alone (no storage, no HTTP), run with
//! `cargo bench -p strata-graphite --bench functions_bench [-- SERIES POINTS]` (default 2000
//! series × 8640 points: a day at 10 s, 17M points, with gaps and counter resets). Each figure
//! is the median of several runs; the machine is shared and noisy, so compare ratios from one
//! run rather than absolute times across runs. Under `taskset -c 0` the functions run on one
//! thread (they spread over the cores the process may use).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use strata_graphite::functions::{evaluate, Context, EvalError, Series};
use strata_graphite::target::parse;

/// The server's allocator (`crates/strata/src/main.rs`): allocation is much of this work.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const TARGETS: &[&str] = &[
    // The fetch alone (a copy of every series): part of every other figure.
    "app.*.requests",
    "sumSeries(app.*.requests)",
    "scale(app.*.requests, 0.5)",
    "nonNegativeDerivative(app.*.requests)",
    "perSecond(app.*.requests)",
    "summarize(app.*.requests, '1h', 'max')",
    "movingAverage(app.*.requests, 10)",
    "keepLastValue(app.*.requests)",
    "highestCurrent(app.*.requests, 10)",
    "holtWintersForecast(app.*.requests, '6h', '1h')",
];

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (n_series, points) = (args.first().copied().unwrap_or(2000), args.get(1).copied().unwrap_or(8640));
    let step = 10i64;
    let until = 1_700_000_000i64;
    let from = until - points as i64 * step;
    let store: Vec<Series> = (0..n_series)
        .map(|i| {
            let name = format!("app.host-{i:05}.requests");
            let mut count = 0.0;
            let values = (0..points)
                .map(|k| {
                    count = if (k + i) % 5000 == 4999 { 0.0 } else { count + ((k * 37 + i * 11) % 90) as f64 };
                    ((k * 7 + i) % 31 != 0).then_some(count)
                })
                .collect();
            let tags = BTreeMap::from([("name".to_owned(), name.clone())]);
            Series::fetched(name, tags, (from, until, step), values, String::new(), 0.0)
        })
        .collect();
    println!("{n_series} series × {points} points; median of 5 runs, ms");
    for target in TARGETS {
        let expr = parse(target).unwrap();
        let mut times: Vec<Duration> = (0..5)
            .map(|_| {
                let mut fetch = |pe: &str, f: i64, u: i64| -> Result<Vec<Series>, EvalError> {
                    let prefix = pe.trim_end_matches(".requests").trim_end_matches('*');
                    // A widened range (moving windows, Holt-Winters) gets the same points; the
                    // work is what is measured, not the values.
                    Ok(store
                        .iter()
                        .filter(|s| s.name.starts_with(prefix))
                        .map(|s| Series { start: f, end: u.max(f + s.step * s.values.len() as i64), ..s.clone() })
                        .collect())
                };
                let mut cx = Context::new(from, until, 0.0, usize::MAX, &mut fetch);
                let t = Instant::now();
                let out = evaluate(&expr, &mut cx).unwrap();
                let took = t.elapsed();
                drop(cx);
                assert!(!out.is_empty());
                took
            })
            .collect();
        times.sort();
        println!("{:<52} {:>9.1}", target, times[2].as_secs_f64() * 1e3);
    }
}
