//! Engine behaviour that Prometheus' test files do not reach: parallel evaluation over many
//! series, the samples limit, deadlines and cancellation.

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use strata_model::Labels;
use strata_tsdb::head::{Head, HeadOptions};

use super::*;
use crate::parser::{parse_with, Features};

/// 3000 series in 30 jobs, one sample per 15 s over an hour, values varied per series.
fn head() -> Head {
    let head = Head::in_memory(HeadOptions { backfill: true, ..HeadOptions::default() });
    let mut app = head.appender();
    for i in 0..3000 {
        let l = Labels::from_pairs([
            ("__name__", "m_total".to_string()),
            ("job", format!("j{}", i % 30)),
            ("instance", format!("i{i}")),
        ]);
        for k in 0..240 {
            let v = (k * (i % 7 + 1)) as f64 + if k > 120 && i % 11 == 0 { -50.0 } else { 0.0 };
            app.append(&l, k * 15_000, v.max(0.0)).unwrap();
        }
    }
    app.commit().unwrap();
    head
}

fn run(head: &Head, q: &str, parallelism: usize) -> Value {
    let e = parse_with(q, Features::all()).unwrap();
    let engine = Engine::new(EngineOptions { parallelism, ..EngineOptions::default() });
    engine.range(head, &e, 600_000, 3_600_000, 30_000).unwrap().value
}

#[test]
fn parallel_evaluation_matches_sequential() {
    let head = head();
    for q in [
        "m_total",
        "rate(m_total[5m])",
        "sum by (job) (rate(m_total[5m]))",
        "topk(3, m_total) * 2",
        "max_over_time(m_total[10m]) - min_over_time(m_total[10m] offset 5m)",
        "m_total / on(instance) group_left m_total",
        "count(abs(m_total) > 100)",
    ] {
        let one = run(&head, q, 1);
        let four = run(&head, q, 4);
        assert_eq!(one, four, "{q}");
        let Value::Matrix(m) = &one else { panic!("{q}") };
        assert!(!m.is_empty(), "{q} selects something");
    }
}

#[test]
fn samples_limit_fails_the_query() {
    let head = head();
    let e = parse_with("m_total", Features::default()).unwrap();
    let engine = Engine::new(EngineOptions { max_samples: 10_000, ..EngineOptions::default() });
    let err = engine.range(&head, &e, 0, 3_600_000, 15_000).unwrap_err();
    assert!(matches!(err, EvalError::TooManySamples(_)), "{err}");
    // Aggregating keeps only groups × steps: the same data fits when summed.
    let e = parse_with("sum by (job) (m_total)", Features::default()).unwrap();
    let engine = Engine::new(EngineOptions { max_samples: 10_000, ..EngineOptions::default() });
    assert!(engine.range(&head, &e, 0, 3_600_000, 60_000).is_ok());
}

#[test]
fn deadline_and_cancellation() {
    let head = head();
    let e = parse_with("sum(rate(m_total[5m]))", Features::default()).unwrap();
    let engine = Engine::new(EngineOptions { timeout: Duration::ZERO, ..EngineOptions::default() });
    assert!(matches!(engine.range(&head, &e, 0, 3_600_000, 15_000), Err(EvalError::Timeout(_))));
    let cancel = AtomicBool::new(true);
    let engine = Engine::default();
    let r = engine.range_with_cancel(&head, &e, 0, 3_600_000, 15_000, Some(&cancel));
    assert!(matches!(r, Err(EvalError::Canceled(_))));
}

/// Vector/vector matching walks each side's steps with a cursor: with series that come and
/// go on both sides (gaps longer than the lookback, "one"-side series taking turns), every
/// step of a range query must be what an instant query at that step gives, and every series
/// that `and` finds matched must have its result.
#[test]
fn vector_matching_over_gaps_matches_instant_queries() {
    let head = Head::in_memory(HeadOptions { backfill: true, ..HeadOptions::default() });
    let mut app = head.appender();
    for i in 0..6 {
        // "c" has one series per job, which several "a" series match.
        let sides: &[(&str, usize)] = if i < 2 { &[("a", 0), ("b", 3), ("c", 5)] } else { &[("a", 0), ("b", 3)] };
        for &(name, phase) in sides {
            let l = Labels::from_pairs([
                ("__name__", name.to_string()),
                ("job", format!("j{}", i % 2)),
                ("instance", format!("i{i}")),
                // "b" takes turns between two series per job.
                ("turn", if name == "b" { format!("{}", i / 2 % 2) } else { String::new() }),
            ]);
            for k in 0..240i64 {
                // Gaps of 10 min (twice the lookback) at times that differ by series and side.
                if (k + (phase * i) as i64) % 80 < 40 || (name == "b" && (k / 60) % 2 != (i / 2 % 2) as i64) {
                    continue;
                }
                app.append(&l, k * 15_000, (k * (i as i64 + 1) + 1) as f64).unwrap();
            }
        }
    }
    app.commit().unwrap();
    let engine = Engine::default();
    let (start, end, step) = (0, 3_600_000, 15_000);
    let range = |q: &str| {
        let e = parse_with(q, Features::all()).unwrap();
        let Value::Matrix(m) = engine.range(&head, &e, start, end, step).unwrap().value else { panic!("{q}") };
        m
    };
    // Each operation, and the `and` (set matching, which does not walk cursors) that selects
    // the "many"-side series it must give a result for.
    for (q, matched) in [
        ("a / ignoring(turn) b", "a and ignoring(turn) b"),
        ("a + on(job, instance) group_left b", "a and on(job, instance) b"),
        ("a > bool on(instance) b", "a and on(instance) b"),
        ("a * on(job) group_left c", "a and on(job) c"),
        ("c - on(job) group_right a", "a and on(job) c"),
    ] {
        let e = parse_with(q, Features::all()).unwrap();
        let (result, matched) = (range(q), range(matched));
        let mut points = 0;
        for t in (start..=end).step_by(step as usize) {
            let Value::Vector(at) = engine.instant(&head, &e, t).unwrap().value else { panic!("{q}") };
            for s in &at {
                let r = result.iter().find(|r| r.labels == s.labels).unwrap_or_else(|| panic!("{q}: {:?}", s.labels));
                let p = r.points.iter().find(|p| p.t == t).unwrap_or_else(|| panic!("{q} at {t}"));
                assert_eq!(p.f.to_bits(), s.points[0].f.to_bits(), "{q} at {t}");
                points += 1;
            }
            let at_t = |m: &[Series]| m.iter().filter(|r| r.points.iter().any(|p| p.t == t)).count();
            assert_eq!(at_t(&result), at.len(), "{q} at {t}");
            assert_eq!(at_t(&result), at_t(&matched), "{q} at {t}");
        }
        assert!(points > 100, "{q} matched only {points} points");
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

    /// The instant selector's step walk against its definition: at each step the newest
    /// sample at or before the step's time, within the lookback and not a stale marker; over
    /// steps denser and sparser than the samples, gaps, stale markers, offsets and `@`.
    #[test]
    fn newest_float_at_steps_is_the_newest_sample_in_the_lookback(
        gaps in proptest::collection::vec(1i64..400_000, 0..60),
        stale in proptest::collection::vec(proptest::bool::weighted(0.1), 60),
        step in 1_000i64..200_000,
        lookback in 1_000i64..600_000,
        offset in -100_000i64..100_000,
        at in proptest::option::weighted(0.1, 0i64..2_000_000),
    ) {
        let mut t = 0;
        let samples: Vec<Point> = gaps
            .iter()
            .zip(&stale)
            .enumerate()
            .map(|(i, (g, &s))| {
                t += g;
                Point { t, f: if s { f64::from_bits(strata_model::STALE_NAN_BITS) } else { i as f64 } }
            })
            .collect();
        let ctx = Ctx { start: -100_000, step, n: ((t + 200_000) / step + 2) as usize };
        let end_at = |ts: i64| at.unwrap_or(ts) - offset;
        let mut got = Vec::new();
        newest_float_at_steps(&samples, &ctx, end_at, lookback, &mut got);
        let mut want = Vec::new();
        for i in 0..ctx.n {
            let te = end_at(ctx.ts(i));
            if let Some(s) = samples.iter().rev().find(|s| s.t <= te) {
                if s.t > te - lookback && !is_stale_nan(s.f) {
                    want.push(Point { t: ctx.ts(i), f: s.f });
                }
            }
        }
        let bits = |v: &[Point]| v.iter().map(|p| (p.t, p.f.to_bits())).collect::<Vec<_>>();
        proptest::prop_assert_eq!(bits(&got), bits(&want));
    }
}
