use proptest::prelude::*;
use strata_model::Labels;
use strata_promql::{Engine, EngineOptions, Series};
use strata_tsdb::head::OutOfOrder;
use strata_tsdb::{Db, DbOptions};

use super::*;

const STEP: i64 = 15_000;
const DELAY: i64 = 5 * 60_000;

fn wall() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

const QUERIES: &[&str] = &[
    "c",
    "rate(c[1m])",
    "sum by (job) (rate(c[2m]))",
    "max_over_time(g[3m])",
    "avg(g) + 1",
    "g offset 1m",
    "g > 0.5",
    "count(g)",
    "topk(2, g)",
    "max_over_time(rate(c[1m])[2m:30s])",
    // Annotated: every refresh raises the same info (g is not a counter's name)…
    "rate(g[1m])",
    // …or not: h only has samples where a late series put them.
    r#"sum(rate({__name__=~"g|h"}[1m]))"#,
];

/// One thing that happens between two refreshes of a dashboard.
#[derive(Clone, Debug)]
enum Op {
    /// Scrapes up to `minutes` more (in order, near now).
    Ingest { minutes: i64 },
    /// A new series whose samples reach back `back_min` minutes (a sender running late).
    LateSeries { back_min: i64, id: u8 },
    /// Out-of-order samples into an existing series, `back_min` minutes back.
    OutOfOrder { back_min: i64, series: u8 },
    /// A deletion of `[back_min, back_min - 2]` minutes back.
    Delete { back_min: i64, series: u8 },
    /// A refresh of the query with its window moved by `steps` steps (may be 0 or negative).
    Refresh { query: usize, steps: i64, minutes: i64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1i64..4).prop_map(|minutes| Op::Ingest { minutes }),
        (6i64..60, any::<u8>()).prop_map(|(back_min, id)| Op::LateSeries { back_min, id }),
        (6i64..50, 0u8..4).prop_map(|(back_min, series)| Op::OutOfOrder { back_min, series }),
        (6i64..50, 0u8..4).prop_map(|(back_min, series)| Op::Delete { back_min, series }),
        (0..QUERIES.len(), -2i64..6, 10i64..50).prop_map(|(query, steps, minutes)| Op::Refresh {
            query,
            steps,
            minutes
        }),
    ]
}

fn labels(name: &str, i: u8) -> Labels {
    Labels::from_pairs([("__name__", name.to_owned()), ("job", format!("j{}", i % 2)), ("i", i.to_string())])
}

/// Samples `(t, v)` of series `i` at the scrapes in `[from, to]`, timestamps jittered as real
/// scrapes are.
fn scrapes(i: u8, from: i64, to: i64) -> Vec<(i64, f64)> {
    let first = from.div_euclid(STEP) * STEP;
    (0..)
        .map(|k| first + k * STEP)
        .take_while(|&t| t <= to)
        .map(|t| (t + (t / STEP * 7 + i as i64 * 13) % 900, ((t / STEP) * (i as i64 + 1)) as f64))
        .filter(|&(t, _)| t >= from && t <= to)
        .collect()
}

fn run(ops: &[Op]) {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = DbOptions::default();
    opts.head.out_of_order = OutOfOrder { window_ms: 2 * 3_600_000, replace: false };
    opts.compact_interval = None;
    let db = Db::open(dir.path(), opts).unwrap();
    let cache = QueryCache::new(8 << 20, DELAY);
    db.changes().watch(DELAY);
    let engine = Engine::new(EngineOptions::default());
    let origin = wall() - 70 * 60_000;
    let mut ingested = origin;
    let ingest_to = |db: &Db, from: i64, to: i64| {
        let mut app = db.appender();
        for i in 0..4u8 {
            for (t, v) in scrapes(i, from, to) {
                app.append(&labels("c", i), t, v).unwrap();
                app.append(&labels("g", i), t, (v * 0.37).sin()).unwrap();
            }
        }
        app.commit().unwrap();
    };
    ingest_to(&db, origin, wall() - 60 * 60_000);
    ingested = ingested.max(wall() - 60 * 60_000);
    let mut window_end = wall() - 2 * 60_000;
    for op in ops {
        match *op {
            Op::Ingest { minutes } => {
                let to = (ingested + minutes * 60_000).min(wall());
                ingest_to(&db, ingested + 1, to);
                ingested = to;
            }
            Op::LateSeries { back_min, id } => {
                let mut app = db.appender_with(OutOfOrder { window_ms: 2 * 3_600_000, replace: false });
                let (from, to) = (wall() - back_min * 60_000, wall() - (back_min - 3) * 60_000);
                let name = if id % 3 == 0 { "h" } else { "g" };
                for (t, v) in scrapes(id % 8, from, to) {
                    let _ = app.append(&labels(name, 10 + id % 8), t, v);
                }
                app.commit().unwrap();
            }
            Op::OutOfOrder { back_min, series } => {
                let mut app = db.appender_with(OutOfOrder { window_ms: 2 * 3_600_000, replace: false });
                let t = wall() - back_min * 60_000 + 3_333;
                let _ = app.append(&labels("g", series), t, 0.9);
                let _ = app.append(&labels("c", series), t, 1e6);
                app.commit().unwrap();
            }
            Op::Delete { back_min, series } => {
                let m = [strata_model::Matcher::new(strata_model::MatchOp::Equal, "i", series.to_string()).unwrap()];
                let maxt = wall() - (back_min - 2) * 60_000;
                db.delete(&m, maxt - 2 * 60_000, maxt).unwrap();
            }
            Op::Refresh { query, steps, minutes } => {
                window_end = (window_end + steps * STEP).min(wall());
                let end = window_end / STEP * STEP;
                let start = end - minutes * 60_000;
                let expr = strata_promql::parser::parse(QUERIES[query]).unwrap();
                assert!(cacheable(&expr));
                let key = CacheKey::new(&expr, start, STEP, EngineOptions::default().lookback_ms);
                let (cached, _) = evaluate_range(&cache, db.changes(), key, start, end, wall(), 2, &mut |from| {
                    engine.range(&db, &expr, from, end, STEP)
                })
                .unwrap();
                let direct = engine.range(&db, &expr, start, end, STEP).unwrap();
                let cached_text =
                    crate::query_json::response(cached.body(), cached.annotations(), QUERIES[query], None);
                let direct_text = crate::query_json::response(&direct.value, &direct.annotations, QUERIES[query], None);
                assert_eq!(cached_text, direct_text, "{} over [{start}, {end}] after {ops:?}", QUERIES[query]);
                assert!(matches!(cached, Answer::Shared { .. }));
                // Asked for gzip: from the kept deflated groups when there are enough of them
                // (deflated after the first answer that had to do without).
                let (body, annotations) = (cached.body(), cached.annotations());
                for _ in 0..2 {
                    let mut gz = Vec::new();
                    if crate::query_json::gzip_kept(body, annotations, QUERIES[query], None, 4096, 2, &mut |piece| {
                        gz.extend_from_slice(&piece);
                        true
                    }) {
                        let mut text = String::new();
                        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&gz[..]), &mut text).unwrap();
                        assert_eq!(text, direct_text, "gzip of {} over [{start}, {end}] after {ops:?}", QUERIES[query]);
                    }
                    crate::query_json::deflate_kept_groups(body, 2);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Answers through the cache are byte for byte the uncached answers, whatever happened to
    /// the data between refreshes: appends, late series, out-of-order writes, deletions.
    #[test]
    fn cached_answers_are_uncached_answers(ops in proptest::collection::vec(op(), 1..30)) {
        run(&ops);
    }
}

/// A database watching changes from `DELAY` back, holding series `g` 0 over the last hour
/// and the wall clock then.
fn db_with_an_hour_of_g(dir: &std::path::Path) -> (Db, i64) {
    let db = Db::open(dir, DbOptions { compact_interval: None, ..DbOptions::default() }).unwrap();
    db.changes().watch(DELAY);
    let now = wall();
    let mut app = db.appender();
    for (t, v) in scrapes(0, now - 3_600_000, now) {
        app.append(&labels("g", 0), t, v).unwrap();
    }
    app.commit().unwrap();
    (db, now)
}

#[test]
fn a_refresh_moved_by_a_step_evaluates_only_the_new_steps() {
    let dir = tempfile::tempdir().unwrap();
    let (db, now) = db_with_an_hour_of_g(dir.path());
    let cache = QueryCache::new(1 << 20, DELAY);
    let engine = Engine::new(EngineOptions::default());
    let expr = strata_promql::parser::parse("g").unwrap();
    let end = (now - 10 * 60_000) / STEP * STEP;
    let evaluated = std::cell::RefCell::new(Vec::new());
    let query = |start: i64, end: i64| {
        let key = CacheKey::new(&expr, start, STEP, 300_000);
        let (out, outcome) = evaluate_range(&cache, db.changes(), key, start, end, now, 2, &mut |from| {
            evaluated.borrow_mut().push((from, end));
            engine.range(&db, &expr, from, end, STEP)
        })
        .unwrap();
        (out, outcome)
    };
    assert_eq!(query(end - 1_800_000, end).1, Outcome::Miss);
    assert_eq!(query(end - 1_800_000 + STEP, end + STEP).1, Outcome::PartialHit);
    assert_eq!(query(end - 1_800_000 + STEP, end).1, Outcome::Hit);
    assert_eq!(*evaluated.borrow(), vec![(end - 1_800_000, end), (end + STEP, end + STEP)]);
    // Another grid (a phase off the step) does not share the kept steps.
    assert_eq!(query(end - 1_800_000 + 1000, end + 1000).1, Outcome::Miss);
    // A deletion behind the kept steps cuts them back.
    let m = [strata_model::Matcher::new(strata_model::MatchOp::Equal, "i", "0").unwrap()];
    db.delete(&m, end - 600_000, end - 590_000).unwrap();
    let (_, outcome) = query(end - 1_800_000 + STEP, end + STEP);
    assert_eq!(outcome, Outcome::PartialHit);
    assert_eq!(
        evaluated.borrow().last(),
        Some(&(end - 600_000, end + STEP)),
        "from the first step at or after the deletion"
    );
    assert_eq!(cache.stats.invalidations.load(Ordering::Relaxed), 1);
}

#[test]
fn annotated_results_are_kept_while_new_steps_raise_the_same_annotations() {
    let dir = tempfile::tempdir().unwrap();
    let (db, now) = db_with_an_hour_of_g(dir.path());
    let mut app = db.appender();
    // h: only 50 to 40 minutes back.
    for (t, v) in scrapes(1, now - 3_000_000, now - 2_400_000) {
        app.append(&labels("h", 1), t, v).unwrap();
    }
    app.commit().unwrap();
    let cache = QueryCache::new(1 << 20, DELAY);
    let engine = Engine::new(EngineOptions::default());
    let query = |q: &str, start: i64, end: i64| {
        let expr = strata_promql::parser::parse(q).unwrap();
        let key = CacheKey::new(&expr, start, STEP, 300_000);
        let (out, outcome) = evaluate_range(&cache, db.changes(), key, start, end, now, 2, &mut |from| {
            engine.range(&db, &expr, from, end, STEP)
        })
        .unwrap();
        let direct = engine.range(&db, &expr, start, end, STEP).unwrap();
        assert!(!direct.annotations.is_empty());
        assert_eq!(out.annotations(), direct.annotations, "{q} over [{start}, {end}]");
        let text = crate::query_json::response(out.body(), &[], q, None);
        assert_eq!(text, crate::query_json::response(&direct.value, &[], q, None), "{q} over [{start}, {end}]");
        outcome
    };
    let end = (now - 10 * 60_000) / STEP * STEP;
    let g = "rate(g[1m])";
    assert_eq!(query(g, end - 1_800_000, end), Outcome::Miss);
    assert_eq!(query(g, end - 1_800_000 + STEP, end + STEP), Outcome::PartialHit, "the same info again");
    assert_eq!(query(g, end - 1_800_000 + STEP, end), Outcome::Hit, "its last step raises the same info");
    // Both infos over the first window; the new steps raise only g's, so the refresh is
    // evaluated whole (and still answers both, as h has samples in the moved window too).
    let gh = r#"rate({__name__=~"g|h"}[1m])"#;
    let start = end - 3_300_000;
    assert_eq!(query(gh, start, end), Outcome::Miss);
    assert_eq!(query(gh, start + STEP, end + STEP), Outcome::Miss);
}

#[test]
fn queries_reading_their_own_start_or_end_are_not_cached() {
    for (q, ok) in [
        ("rate(x[5m])", true),
        ("x offset 5m", true),
        ("x @ 100", false),
        ("x @ end()", false),
        ("x offset -5m", false),
        ("max_over_time(x[1h:1m] @ start())", false),
    ] {
        let e = strata_promql::parser::parse(q).unwrap();
        assert_eq!(cacheable(&e), ok, "{q}");
    }
    let e = strata_promql::parser::parse_with("x[range()]", strata_promql::Features::all()).unwrap();
    assert!(!cacheable(&e));
}

#[test]
fn the_size_is_kept_by_dropping_the_least_recently_used() {
    let cache = QueryCache::new(4096, DELAY);
    let now = wall();
    let log = ChangeLog::default();
    let series = |n: usize| -> Vec<Series> {
        vec![Series::new(
            Labels::from_pairs([("a", "b")]),
            (0..n as i64).map(|k| strata_promql::Point { t: k * STEP, f: 1.0 }).collect(),
        )]
    };
    let key = |q: &str| CacheKey { query: q.into(), step_ms: STEP, phase_ms: 0, lookback_ms: 1, tier_ms: 0 };
    cache.put(key("a"), 0, 100 * STEP, now, 0, Arc::new(keep_series(&series(100), 1)), &[]);
    cache.put(key("b"), 0, 100 * STEP, now, 0, Arc::new(keep_series(&series(100), 1)), &[]);
    assert!(cache.get(&key("a"), 0, 100 * STEP, &log).is_some(), "a used last");
    cache.put(key("c"), 0, 100 * STEP, now, 0, Arc::new(keep_series(&series(100), 1)), &[]);
    assert!(cache.bytes() <= 4096);
    assert!(cache.get(&key("b"), 0, 100 * STEP, &log).is_none(), "b dropped first");
    assert!(cache.get(&key("a"), 0, 100 * STEP, &log).is_some());
    assert!(cache.stats.evictions.load(Ordering::Relaxed) >= 1);
    // Never more than asked for, even by one big result.
    cache.put(key("d"), 0, 10_000 * STEP, now, 0, Arc::new(keep_series(&series(10_000), 1)), &[]);
    assert!(cache.get(&key("d"), 0, 10 * STEP, &log).is_none());
}

#[test]
fn a_window_moving_by_over_a_quarter_drops_the_steps_it_left() {
    let dir = tempfile::tempdir().unwrap();
    let (db, now) = db_with_an_hour_of_g(dir.path());
    let cache = QueryCache::new(1 << 20, DELAY);
    let engine = Engine::new(EngineOptions::default());
    let expr = strata_promql::parser::parse("rate(g[1m])").unwrap();
    let mut end = (now - 50 * 60_000) / STEP * STEP;
    let mut bytes = Vec::new();
    for round in 0..40 {
        // Twelve steps, moved by one, then by four (a third of the window) at a time.
        let start = end - 11 * STEP;
        let key = CacheKey::new(&expr, start, STEP, 300_000);
        let (out, outcome) = evaluate_range(&cache, db.changes(), key, start, end, now, 2, &mut |from| {
            engine.range(&db, &expr, from, end, STEP)
        })
        .unwrap();
        assert_eq!(outcome, if round == 0 { Outcome::Miss } else { Outcome::PartialHit });
        let direct = engine.range(&db, &expr, start, end, STEP).unwrap();
        let text = crate::query_json::response(out.body(), out.annotations(), "q", None);
        assert_eq!(text, crate::query_json::response(&direct.value, &direct.annotations, "q", None), "round {round}");
        bytes.push(cache.bytes());
        end += if round % 2 == 0 { STEP } else { 4 * STEP };
    }
    // What the cache holds stays about one window's worth, however far the window moved.
    assert!(bytes.iter().all(|&b| b <= 2 * bytes[0]), "{bytes:?}");
}
