//! The model test of evaluation from rollup tiers: a database with tiers, part of its data
//! rolled up and part still raw (blocks and head), and random queries evaluated both raw and
//! from the tier the planner picks; the answers must agree (bit for bit where `eval::rollup`
//! says exact, within 1e-9 relative where float additions are reordered).

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use strata_model::Labels;
use strata_tsdb::head::HeadOptions;
use strata_tsdb::rollup::RollupTier;
use strata_tsdb::{Db, DbOptions};

use crate::eval::{Engine, EngineOptions, SourceResolution};
use crate::value::Value;

const MIN: i64 = 60_000;
const HOURS: i64 = 4;

/// Functions whose tier answer is bit for bit the raw one.
const EXACT: [&str; 11] = [
    "count_over_time",
    "min_over_time",
    "max_over_time",
    "last_over_time",
    "first_over_time",
    "present_over_time",
    "changes",
    "resets",
    "ts_of_first_over_time",
    "ts_of_last_over_time",
    "absent_over_time",
];
/// Functions whose tier answer adds floats in another order.
const CLOSE: [&str; 5] = ["rate", "increase", "delta", "sum_over_time", "avg_over_time"];

/// Samples every 10 s (jittered like scrapes) for four hours: counters that reset, gauges,
/// decimals, series with gaps of tens of minutes, a series that starts late; compacted as a
/// server would, so that the older part is rolled up and the newer one is not.
fn database(dir: &std::path::Path) -> Db {
    let opts = DbOptions {
        head: HeadOptions { chunk_range_ms: 10 * MIN, ..HeadOptions::default() },
        // Compaction ranges 10 and 30 min: raw blocks settle (and are rolled up) after 30 min.
        retention_ms: 10 * 60 * MIN,
        retention_bytes: 0,
        compact_interval: None,
        // A left-closed tier (Graphite's) the planner must never pick: its buckets do not cut
        // PromQL's windows, so answers from it would differ from raw ones.
        rollups: vec![RollupTier::new(MIN, 0), RollupTier::new(5 * MIN, 0), RollupTier::left(15 * MIN, 0)],
        rollup_filter: None,
        late_window_ms: 0,
    };
    let db = Db::open(dir, opts).unwrap();
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut counters = [0.0f64; 12];
    let mut t = 0;
    while t < HOURS * 60 * MIN {
        let mut app = db.appender();
        for (i, counter) in counters.iter_mut().enumerate() {
            let gap = i % 4 == 1 && (t / (20 * MIN)) % 3 == 1;
            let late = i == 11 && t < 90 * MIN;
            if gap || late {
                continue;
            }
            let at = t + (next() % 900) as i64;
            let r = next();
            let v = match i % 3 {
                0 => {
                    *counter = if r % 200 == 0 { (r % 7) as f64 } else { *counter + (r % 1000) as f64 / 10.0 };
                    *counter
                }
                1 => (r % 10_000) as f64 / 100.0 - 30.0,
                _ => ((r % 5) as f64).powi(2) * 1.5,
            };
            let kind = ["requests_total", "temperature", "queue"][i % 3];
            let labels = Labels::from_pairs([("__name__", kind.to_string()), ("i", i.to_string())]);
            app.append(&labels, at, v).unwrap();
        }
        app.commit().unwrap();
        t += 10_000;
        if t % (5 * MIN) == 0 {
            db.compact().unwrap();
        }
    }
    let status = db.status(1).unwrap();
    assert!(status.tiers.iter().all(|t| !t.blocks.is_empty()), "part of the data is rolled up");
    assert!(db.head().time_range().is_some(), "part is still in the head");
    db
}

fn engine(resolution: SourceResolution) -> Engine {
    Engine::new(EngineOptions { max_source_resolution: resolution, parallelism: 1, ..EngineOptions::default() })
}

fn same(a: f64, b: f64, exact: bool) -> bool {
    if a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()) || a == b {
        return true;
    }
    !exact && (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

fn compare(raw: &Value, tier: &Value, exact: bool, query: &str) {
    let (Value::Matrix(a), Value::Matrix(b)) = (raw, tier) else {
        match (raw, tier) {
            (Value::Vector(a), Value::Vector(b)) => {
                assert_eq!(a.len(), b.len(), "{query}: series");
                for (x, y) in a.iter().zip(b) {
                    assert_eq!(x.labels, y.labels, "{query}");
                    assert_eq!(x.points.len(), y.points.len(), "{query} {}", x.labels);
                    for (p, q) in x.points.iter().zip(&y.points) {
                        assert!(p.t == q.t && same(p.f, q.f, exact), "{query} {}: {p:?} vs {q:?}", x.labels);
                    }
                }
                return;
            }
            _ => panic!("{query}: {raw:?} vs {tier:?}"),
        }
    };
    assert_eq!(
        a.len(),
        b.len(),
        "{query}: series {:?} vs {:?}",
        a.iter().map(|s| &s.labels).collect::<Vec<_>>(),
        b.iter().map(|s| &s.labels).collect::<Vec<_>>()
    );
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.labels, y.labels, "{query}");
        assert_eq!(
            x.points.iter().map(|p| p.t).collect::<Vec<_>>(),
            y.points.iter().map(|p| p.t).collect::<Vec<_>>(),
            "{query} {}: steps",
            x.labels
        );
        for (p, q) in x.points.iter().zip(&y.points) {
            assert!(same(p.f, q.f, exact), "{query} {}: {p:?} vs {q:?}", x.labels);
        }
    }
}

#[test]
fn tier_answers_equal_raw_answers() {
    let tmp = tempfile::tempdir().unwrap();
    let db = database(tmp.path());
    let (raw, auto) = (engine(SourceResolution::Raw), engine(SourceResolution::Auto));
    let used_tier = |out: &crate::eval::QueryOutput| out.annotations.iter().any(|a| a.msg.contains("rollup tier"));
    let functions: Vec<&str> = EXACT.iter().chain(CLOSE.iter()).copied().collect();
    let strategy = (
        prop::sample::select(functions),
        prop::sample::select(vec![1i64, 2, 5, 10, 15, 30, 60]),
        prop::sample::select(vec![1i64, 2, 5, 10, 30]),
        0i64..(HOURS * 60),
        1usize..200,
        prop::sample::select(vec!["requests_total", "temperature", "queue", "{__name__=~\".+\", i=~\"1|5|11\"}"]),
        0u8..4,
    );
    let mut runner = TestRunner::new(Config { cases: 300, failure_persistence: None, ..Config::default() });
    runner
        .run(&strategy, |(func, range_min, step_min, start_min, steps, metric, shape)| {
            let step = step_min * MIN;
            let start = start_min / step_min * step;
            let end = start + (steps as i64 - 1) * step;
            let range = format!("{range_min}m");
            let (query, exact) = match shape {
                // A plain selector, and its timestamps.
                0 => (metric.to_string(), true),
                1 => (format!("timestamp({metric})"), true),
                // An aggregation over a range function.
                2 => (format!("sum by (__name__) ({func}({metric}[{range}]))"), false),
                _ => (format!("{func}({metric}[{range}])"), EXACT.contains(&func)),
            };
            let features = crate::parser::Features { experimental_functions: true, ..Default::default() };
            let expr = crate::parser::parse_with(&query, features).unwrap();
            let want = match raw.range(&db, &expr, start, end, step) {
                Ok(out) => out,
                Err(e) => {
                    // The same error either way.
                    let got = auto.range(&db, &expr, start, end, step).unwrap_err();
                    prop_assert_eq!(e.to_string(), got.to_string(), "{}", query);
                    return Ok(());
                }
            };
            let got = auto.range(&db, &expr, start, end, step).unwrap();
            prop_assert!(used_tier(&got), "{query} at step {step}: no tier used");
            prop_assert!(!used_tier(&want));
            compare(&want.value, &got.value, exact, &format!("{query} {start}..{end} step {step}"));
            // The same as an instant query at an aligned time.
            let want = raw.instant(&db, &expr, end).unwrap();
            let got = auto.instant(&db, &expr, end).unwrap();
            compare(&want.value, &got.value, exact, &format!("{query} at {end}"));
            Ok(())
        })
        .unwrap();
}

/// A dashboard over the tier of its step (the window is the step, one bucket per step:
/// `step_per_bucket`'s shape, which `rate`, `increase` and `delta` read straight from the
/// columns) answers as raw data does, at every alignment of its start, over series with gaps
/// (no bucket for some steps) and without.
#[test]
fn extrapolating_functions_over_one_bucket_per_step_equal_raw_answers() {
    let tmp = tempfile::tempdir().unwrap();
    let db = database(tmp.path());
    let (raw, auto) = (engine(SourceResolution::Raw), engine(SourceResolution::Auto));
    for func in ["rate", "increase", "delta"] {
        for (step_min, metric) in
            [(1, "requests_total"), (5, "requests_total"), (5, "temperature"), (1, "{i=~\"1|5\"}")]
        {
            let step = step_min * MIN;
            for start in [0, 3, 47, 100, 170, 235].map(|m| m / step_min * step) {
                let end = (start + 80 * step).min(HOURS * 60 * MIN);
                let query = format!("{func}({metric}[{step_min}m])");
                let expr = crate::parser::parse(&query).unwrap();
                let want = raw.range(&db, &expr, start, end, step).unwrap();
                let got = auto.range(&db, &expr, start, end, step).unwrap();
                assert!(got.annotations.iter().any(|a| a.msg.contains("rollup tier")), "{query}: no tier used");
                compare(&want.value, &got.value, false, &format!("{query} {start}..{end} step {step}"));
            }
        }
    }
}

#[test]
fn the_planner_reads_raw_data_when_no_tier_fits() {
    let tmp = tempfile::tempdir().unwrap();
    let db = database(tmp.path());
    let auto = engine(SourceResolution::Auto);
    let tier_of = |q: &str, start: i64, step: i64| {
        let out = auto.range(&db, &crate::parser::parse(q).unwrap(), start, start + 10 * step, step).unwrap();
        out.annotations
            .iter()
            .find(|a| a.msg.contains("rollup tier"))
            .map(|a| a.msg.split(' ').nth(3).unwrap().to_string())
    };
    assert_eq!(tier_of("rate(requests_total[10m])", 60 * MIN, 5 * MIN).as_deref(), Some("5m"));
    assert_eq!(tier_of("rate(requests_total[10m])", 60 * MIN, 2 * MIN).as_deref(), Some("1m"));
    // Off the grid: start, step, window or offset; functions tiers do not answer; subqueries.
    assert_eq!(tier_of("rate(requests_total[10m])", 60 * MIN + 1000, 5 * MIN), None);
    assert_eq!(tier_of("rate(requests_total[10m])", 60 * MIN, 30_000), None);
    assert_eq!(tier_of("rate(requests_total[90s])", 60 * MIN, 5 * MIN), None);
    assert_eq!(tier_of("rate(requests_total[10m] offset 30s)", 60 * MIN, 5 * MIN), None);
    assert_eq!(tier_of("irate(requests_total[10m])", 60 * MIN, 5 * MIN), None);
    assert_eq!(tier_of("quantile_over_time(0.5, temperature[10m])", 60 * MIN, 5 * MIN), None);
    assert_eq!(tier_of("max_over_time(rate(requests_total[5m])[30m:5m])", 60 * MIN, 5 * MIN), None);
    // Asked for raw data, or tiers up to 1m.
    let at_most = |r| {
        engine(r)
            .range(&db, &crate::parser::parse("rate(requests_total[10m])").unwrap(), 60 * MIN, 120 * MIN, 5 * MIN)
            .unwrap()
    };
    assert!(!at_most(SourceResolution::Raw).annotations.iter().any(|a| a.msg.contains("rollup tier")));
    assert!(at_most(SourceResolution::AtMost(MIN)).annotations.iter().any(|a| a.msg.contains("the 1m rollup tier")));
}

proptest! {
    #![proptest_config(Config { cases: 2000, failure_persistence: None, ..Config::default() })]

    /// Where `step_per_bucket` finds the dashboard shape, its steps and buckets are exactly
    /// the one-bucket windows `for_windows` walks, and that walk finds no window of several
    /// buckets; where it does not, the shape is not there.
    #[test]
    fn steps_per_bucket_are_the_windows_walked(
        interval in prop::sample::select(vec![1_000i64, 3_000]),
        first_bucket in -6i64..30,
        gaps in proptest::collection::vec(prop::sample::select(vec![1i64, 1, 1, 1, 2, 3]), 0..30),
        start in -8i64..40,
        step in 1i64..4,
        n in 1usize..40,
        range in 1i64..4,
        offset in -3i64..4,
        at in proptest::option::weighted(0.1, -5i64..40),
    ) {
        use strata_tsdb::chunkenc::rollup::ColumnSet;
        use strata_tsdb::rollup::{Bucket, BucketColumns};
        use super::{for_windows, step_per_bucket, Window};
        use crate::ast::RangeMode;
        use crate::eval::{Ctx, RangeSpec};

        let mut buckets = BucketColumns::new(ColumnSet::of(&[]));
        let mut end = first_bucket * interval;
        for gap in gaps {
            end += gap * interval;
            let sample = strata_model::Sample { t: end, v: 1.0 };
            buckets.push(&Bucket::ending(sample, end));
        }
        let ctx = Ctx { start: start * interval, step: step * interval, n };
        let spec = RangeSpec { range: range * interval, offset: offset * interval, at: at.map(|a| a * interval), mode: RangeMode::Plain };
        let mut walked = Vec::new();
        let mut several = false;
        for_windows(&buckets, &ctx, &spec, false, |i, _, w| match w {
            Window::One(k) => walked.push((i, k)),
            Window::Many(_) => several = true,
        });
        if let Some((run, first_step)) = step_per_bucket(&buckets, &ctx, &spec) {
            prop_assert!(!several);
            let found: Vec<(usize, usize)> = run.clone().map(|k| (first_step + (k - run.start), k)).collect();
            prop_assert_eq!(found, walked);
        } else {
            // Not found where it applies: contiguous buckets on the windows' grid.
            let applies = at.is_none() && n > 1 && range == step && !buckets.ends().is_empty()
                && buckets.ends().windows(2).all(|w| w[1] - w[0] == ctx.step)
                && (buckets.ends()[0] - spec.end_at(ctx.start)).rem_euclid(ctx.step) == 0;
            prop_assert!(!applies);
        }
    }
}
