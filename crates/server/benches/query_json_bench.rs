//! What writing a range query's JSON costs per point, in Prometheus' format: 900 series of a
//! day at a 60 s step (1440 points each, as a dashboard's `rate(...)` over a day returns), with
//! rate-like values (fractions), counter-like values (integers) and gauge-like values (a few
//! decimals); timestamps whole seconds, or with milliseconds (a step of 1.5 s). Median of 9
//! renders, streamed in 1 MiB chunks as the server streams them (the chunks are dropped), by
//! one thread and by as many as there are cores (`--query.parallelism`'s default).
//!
//! `cargo bench -p strata-server --bench query_json_bench`

use std::time::Instant;

use strata_model::Labels;
use strata_promql::{Point, Series, Value};

const SERIES: usize = 900;
const POINTS: usize = 1440;

fn matrix(step_ms: i64, value: impl Fn(usize, usize) -> f64) -> Value {
    let start = 1_764_000_000_000i64;
    Value::Matrix(
        (0..SERIES)
            .map(|s| {
                let labels = Labels::from_pairs([
                    ("device", format!("eth{}", s % 3)),
                    ("instance", format!("host-{:04}:9100", s / 3)),
                    ("job", "node".to_owned()),
                ]);
                let points = (0..POINTS).map(|i| Point { t: start + i as i64 * step_ms, f: value(s, i) }).collect();
                Series::new(labels, points)
            })
            .collect(),
    )
}

fn main() {
    let shapes: [(&str, Value); 4] = [
        ("rate-like fractions, 60 s step", matrix(60_000, |s, i| (s * 7919 + i * 104_729) as f64 / 977.0)),
        ("counter-like integers, 60 s step", matrix(60_000, |s, i| (s * 1_000_003 + i * 4093) as f64)),
        ("gauge-like two decimals, 60 s step", matrix(60_000, |s, i| ((s * 31 + i * 17) % 10_000) as f64 / 100.0)),
        ("rate-like fractions, 1.5 s step", matrix(1_500, |s, i| (s * 7919 + i * 104_729) as f64 / 977.0)),
    ];
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    for (name, value) in &shapes {
        for threads in if cores > 1 { vec![1, cores] } else { vec![1] } {
            let mut times = Vec::new();
            let mut bytes = 0;
            for _ in 0..9 {
                let t0 = Instant::now();
                bytes = 0;
                strata_server::query_json::render(value, &[], "q", None, 1 << 20, threads, &mut |chunk| {
                    bytes += chunk.len();
                    true
                });
                times.push(t0.elapsed().as_secs_f64());
            }
            times.sort_by(f64::total_cmp);
            let per_point = times[4] / (SERIES * POINTS) as f64 * 1e9;
            println!(
                "{name}, {threads} thread(s): {:.1} ns per point, {:.1} ms, {:.1} MB",
                per_point,
                times[4] * 1e3,
                bytes as f64 / 1e6
            );
        }
    }
}
