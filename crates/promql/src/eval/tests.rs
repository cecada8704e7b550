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
        // Aggregations whose groups are dealt to the workers (each group folded by one),
        // and those left to the pipeline's consumer (one group, or groups too uneven).
        "avg by (job) (m_total)",
        "stddev without (instance) (irate(m_total[2m]))",
        "max by (job) (max_over_time(m_total[10m]))",
        "count by (instance) (changes(m_total[10m]))",
        "sum(increase(m_total[5m]))",
        r#"sum by (job) (rate(m_total{job=~"j1|j2|j3"}[5m]))"#,
        r#"sum by (job) (rate(m_total{job=~"j1.*|j2"}[5m]))"#,
    ] {
        let one = run(&head, q, 1);
        let four = run(&head, q, 4);
        assert_eq!(one, four, "{q}");
        let two = run(&head, q, 2);
        assert_eq!(one, two, "{q}");
        let Value::Matrix(m) = &one else { panic!("{q}") };
        assert!(!m.is_empty(), "{q} selects something");
    }
}

/// An instant query's aggregation gives its groups in the order their first members come in
/// label order, however the groups were dealt to workers.
#[test]
fn parallel_aggregation_keeps_the_order_of_groups() {
    let head = head();
    for q in ["sum by (job) (rate(m_total[5m]))", "count by (instance) (m_total)", "min without (job) (m_total)"] {
        let e = parse_with(q, Features::all()).unwrap();
        let at = |parallelism| {
            let engine = Engine::new(EngineOptions { parallelism, ..EngineOptions::default() });
            engine.instant(&head, &e, 3_000_000).unwrap().value
        };
        let one = at(1);
        assert_eq!(one, at(2), "{q}");
        assert_eq!(one, at(3), "{q}");
        let Value::Vector(v) = &one else { panic!("{q}") };
        assert!(v.len() >= 30, "{q}");
        // Over a range, where groups are dealt to the workers. `Engine::range` sorts its
        // answer, so the order is taken from the evaluator's own (which a subquery's `topk`,
        // breaking ties by it, would see).
        let over_range = |parallelism| {
            let engine = Engine::new(EngineOptions { parallelism, ..EngineOptions::default() });
            let ev = Evaluator::new(&engine, &head, 3_000_000, 3_600_000, 60_000, None);
            match ev.eval(&e, &Ctx { start: 3_000_000, step: 60_000, n: 11 }).unwrap() {
                Val::Vector(v) => v.into_iter().map(|s| s.labels).collect::<Vec<_>>(),
                _ => panic!("{q}"),
            }
        };
        let one = over_range(1);
        assert!(one.len() >= 30, "{q}");
        assert_eq!(one, over_range(2), "{q}");
        assert_eq!(one, over_range(3), "{q}");
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

#[test]
fn groups_are_dealt_evenly_or_not_at_all() {
    // Largest first, each to the least loaded part.
    let part_of = deal_groups(&[5, 3, 3, 2, 2, 1], 2).unwrap();
    let load = |p| (0..6).filter(|&g| part_of[g] == p).map(|g| [5, 3, 3, 2, 2, 1][g]).sum::<usize>();
    assert_eq!((load(0), load(1)), (8, 8));
    // Three equal groups on two parts: one part would get a third more than half.
    assert_eq!(deal_groups(&[500, 500, 500], 2), None);
    // One group: never dealt.
    assert_eq!(deal_groups(&[3000], 4), None);
    // Within an eighth over an even share.
    assert!(deal_groups(&[9, 8, 8, 9], 2).is_some());
    assert!(deal_groups(&[100; 17], 2).is_some());
    assert_eq!(deal_groups(&[100; 7], 2), None);
    // Every group goes to a part that exists.
    let many: Vec<usize> = (0..500).map(|g| 100 + g % 37).collect();
    let part_of = deal_groups(&many, 3).unwrap();
    assert!(part_of.iter().all(|&p| p < 3));
}

/// 200 instances scraped at staggered times, three devices and two directions each: series of
/// one instance share their timestamps, neighbours in label order (device before instance)
/// do not.
fn staggered_head() -> Head {
    let head = Head::in_memory(HeadOptions { backfill: true, ..HeadOptions::default() });
    let mut app = head.appender();
    for i in 0..200 {
        for device in ["eth0", "eth1", "lo"] {
            for dir in ["rx", "tx"] {
                let l = Labels::from_pairs([
                    ("__name__", "bytes_total".to_string()),
                    ("device", device.to_string()),
                    ("dir", dir.to_string()),
                    ("instance", format!("i{i:03}")),
                ]);
                for k in 0..240 {
                    let t = k * 15_000 + (i * 37 % 15_000);
                    let v = (k * (i % 13 + 1)) as f64 * 1.37 + if device == "lo" { 0.1 } else { 0.0 };
                    app.append(&l, t, v).unwrap();
                }
            }
        }
    }
    app.commit().unwrap();
    head
}

#[test]
fn grouped_parts_fold_in_any_order_that_keeps_each_group_in_label_order() {
    let head = staggered_head();
    let stored = Storage::select(&head, &[Matcher::equal("__name__", "bytes_total")], 0, 3_600_000).unwrap();
    let label = |i: usize, name: &str| stored[i].labels.get(name).unwrap().to_string();
    let numbered = |name: &str| -> Vec<usize> {
        let mut seen: Vec<String> = Vec::new();
        (0..stored.len())
            .map(|i| {
                let v = label(i, name);
                seen.iter().position(|s| *s == v).unwrap_or_else(|| {
                    seen.push(v);
                    seen.len() - 1
                })
            })
            .collect()
    };
    let keeps_group_order = |order: &[usize], group_of: &[usize]| {
        let mut last = vec![None; stored.len()];
        order.iter().all(|&i| {
            let ok = last[group_of[i]].is_none_or(|l| l < i);
            last[group_of[i]] = Some(i);
            ok
        })
    };
    // By instance: group after group, each group's six series sharing timestamps.
    let by_instance = numbered("instance");
    let order = part_order(&stored, &by_instance, &vec![0; 200], 0);
    assert!(keeps_group_order(&order, &by_instance));
    assert!(order.windows(2).all(|p| by_instance[p[0]] <= by_instance[p[1]]), "group after group");
    // By device: each device's first member (instance 0), then the second ones, ….
    let by_device = numbered("device");
    let order = part_order(&stored, &by_device, &[0, 0, 0], 0);
    assert_eq!(order.len(), stored.len());
    assert!(keeps_group_order(&order, &by_device));
    assert_eq!(label(order[0], "instance"), label(order[2], "instance"), "members in turn");
    // Only the part's own series.
    let order = part_order(&stored, &by_device, &[0, 1, 0], 1);
    assert!(order.iter().all(|&i| label(i, "device") == "eth1") && order.len() == 400);

    // The answers do not depend on the order or on how groups are dealt.
    for q in [
        "sum by (instance) (rate(bytes_total[2m]))",
        "sum by (device) (rate(bytes_total[2m]))",
        "avg by (dir) (increase(bytes_total[5m]))",
        "sum by (device, dir) (rate(bytes_total[2m]))",
        "max by (instance, dir) (bytes_total)",
    ] {
        let one = run(&head, q, 1);
        assert_eq!(one, run(&head, q, 2), "{q}");
        assert_eq!(one, run(&head, q, 3), "{q}");
        let Value::Matrix(m) = &one else { panic!("{q}") };
        assert!(!m.is_empty(), "{q} selects something");
    }
}

#[test]
fn range_queries_in_time_slices_answer_as_one_evaluation() {
    let head = staggered_head();
    let parse = |q: &str| parse_with(q, Features::all()).unwrap();
    // Which queries are sliced: aggregations with few groups (by the head's label values) or
    // that pick series.
    for (q, sliced) in [
        ("sum by (device) (rate(bytes_total[2m]))", true),
        ("sum(rate(bytes_total[2m]))", true),
        ("topk(3, rate(bytes_total[2m]))", true),
        ("histogram_quantile(0.9, sum by (device) (rate(bytes_total[2m])))", true),
        ("sum by (instance) (rate(bytes_total[2m]))", false),
        ("sum without (instance) (rate(bytes_total[2m]))", false),
        ("rate(bytes_total[2m])", false),
        // A label the head has no value of: unknown, not sliced.
        ("sum by (pod) (rate(bytes_total[2m]))", false),
    ] {
        assert_eq!(gains_from_time_slices(&parse(q), &head, 2), sliced, "{q}");
    }
    // 301 steps: two slices of at least SLICE_STEPS_MIN.
    let range = |q: &str, parallelism| {
        let engine = Engine::new(EngineOptions { parallelism, ..EngineOptions::default() });
        engine.range(&head, &parse(q), 600_000, 3_600_000, 10_000).unwrap()
    };
    for q in [
        "sum by (device) (rate(bytes_total[2m]))",
        "avg(increase(bytes_total[5m]))",
        "topk(3, rate(bytes_total[2m]))",
        "bottomk(2, bytes_total)",
        "quantile(0.3, rate(bytes_total[2m]))",
        "count(bytes_total @ start())",
        "max by (dir) (bytes_total offset 3m) - min by (dir) (bytes_total)",
        "sum by (device) (rate(bytes_total[2m])) / on() group_left sum(rate(bytes_total[2m]))",
    ] {
        let one = range(q, 1);
        for parallelism in [2, 3] {
            let sliced = range(q, parallelism);
            assert_eq!(one.value, sliced.value, "{q}");
            assert_eq!(one.annotations, sliced.annotations, "{q}");
            assert_eq!(one.stats.samples_read > 0, sliced.stats.samples_read > 0, "{q}");
        }
        let Value::Matrix(m) = &one.value else { panic!("{q}") };
        assert!(m.iter().map(|s| s.points.len()).sum::<usize>() > 250, "{q} answers over the range");
    }
}

/// `Ctx::each_step` gives each point's step index whether its points fill consecutive steps
/// (counted) or leave gaps (walked), as a division would.
#[test]
fn each_step_gives_the_step_of_every_point() {
    let ctx = Ctx { start: -120_000, step: 30_000, n: 40 };
    let at = |steps: &[usize]| steps.iter().map(|&i| Point { t: ctx.ts(i), f: i as f64 }).collect::<Vec<_>>();
    for steps in [vec![], vec![0], vec![39], vec![3, 4, 5, 6], vec![0, 2, 3, 39], vec![5, 6, 30, 31, 32]] {
        let points = at(&steps);
        let mut seen = Vec::new();
        ctx.each_step(&points, |i, p| {
            assert_eq!(i, ctx.index(p.t));
            seen.push(i);
        });
        assert_eq!(seen, steps);
    }
}
