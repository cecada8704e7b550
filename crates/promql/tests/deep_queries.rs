//! Queries nested as deeply as the parser allows are parsed, evaluated, cloned and dropped on
//! a thread stack smaller than the server's, and one level more is refused with an error that
//! names the limit: no query text can overflow a stack (a server that crashed on
//! `((((…1…))))` or `1+1+…+1` was the bug this freezes).

use strata_model::Labels;
use strata_promql::parser::{parse_with, parse_with_depth, Features, MAX_DEPTH_DEFAULT, QUERY_THREAD_STACK_BYTES};
use strata_promql::{Engine, EngineOptions};
use strata_tsdb::head::{Head, HeadOptions};

/// Half the stack of the server's query threads: the margin covers frames that differ
/// between this build and a release build (measured within 15 % of each other).
const TEST_STACK_BYTES: usize = QUERY_THREAD_STACK_BYTES / 2;

/// A shape of nesting: its name, and its query text at `n` levels.
type Shape = (&'static str, fn(usize) -> String);

fn shapes() -> Vec<Shape> {
    vec![
        ("parentheses", |n| format!("{}up{}", "(".repeat(n), ")".repeat(n))),
        ("unary minus", |n| format!("{}up", "-".repeat(n))),
        ("unary minus on a number", |n| format!("{}1", "-".repeat(n))),
        ("scalar chain", |n| vec!["1"; n].join("+")),
        ("vector chain", |n| vec!["up"; n].join(" + ")),
        ("or chain", |n| vec!["up"; n].join(" or ")),
        ("power chain (right-associative)", |n| vec!["2"; n].join("^")),
        ("nested calls", |n| format!("{}up{}", "abs(".repeat(n), ")".repeat(n))),
        ("nested aggregations", |n| format!("{}up{}", "sum(".repeat(n), ")".repeat(n))),
        ("nested subqueries", |n| format!("{}up{}", "max_over_time(".repeat(n), "[5m:1m])".repeat(n))),
        ("parenthesised duration", |n| format!("up[{}5m{}]", "(".repeat(n), ")".repeat(n))),
        ("duration chain", |n| format!("up[{}]", vec!["1s"; n].join("+"))),
        ("signed offset", |n| format!("up offset {}5m", "-".repeat(n))),
    ]
}

fn head() -> Head {
    let head = Head::in_memory(HeadOptions { backfill: true, ..HeadOptions::default() });
    let mut app = head.appender();
    for i in 0..3 {
        let l = Labels::from_pairs([("__name__", "up".to_string()), ("instance", format!("i{i}"))]);
        for k in 0..40 {
            app.append(&l, k * 15_000, 1.0).unwrap();
        }
    }
    app.commit().unwrap();
    head
}

/// The largest `n` for which `make(n)` parses (0 if none does): the shape at the limit.
fn deepest_accepted(make: fn(usize) -> String) -> usize {
    let parses = |n: usize| parse_with(&make(n), Features::all()).is_ok();
    let (mut lo, mut hi) = (0, MAX_DEPTH_DEFAULT as usize * 4 + 8);
    assert!(!parses(hi), "{} levels must be refused", hi);
    while lo + 1 < hi {
        let mid = (lo + hi) / 2;
        if parses(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

#[test]
fn the_deepest_query_allowed_runs_on_a_small_stack() {
    let run = || {
        let head = head();
        let engine = Engine::new(EngineOptions { parallelism: 1, ..EngineOptions::default() });
        for (name, make) in shapes() {
            let n = deepest_accepted(make);
            // The limit is what stopped it, not an unrelated error at every size.
            assert!(n >= MAX_DEPTH_DEFAULT as usize / 3, "{name}: only {n} levels parse");
            let err = parse_with(&make(n + 1), Features::all()).unwrap_err();
            assert!(err.msg.contains("nested too deeply"), "{name}: {err}");
            assert!(err.msg.contains(&MAX_DEPTH_DEFAULT.to_string()), "{name} names the limit: {err}");
            let expr = parse_with(&make(n), Features::all()).unwrap();
            assert!(expr.height <= MAX_DEPTH_DEFAULT, "{name}: height {}", expr.height);
            let copy = expr.clone();
            let _ = format!("{copy:?}").len();
            if matches!(
                expr.value_type(),
                strata_promql::ast::ValueType::Scalar | strata_promql::ast::ValueType::Vector
            ) {
                let out = engine.range(&head, &expr, 0, 600_000, 60_000);
                assert!(out.is_ok(), "{name}: {:?}", out.err());
                let _ = engine.instant(&head, &expr, 300_000).unwrap();
            } else {
                let _ = engine.instant(&head, &expr, 300_000).unwrap();
            }
            drop(copy);
        }
    };
    std::thread::Builder::new().stack_size(TEST_STACK_BYTES).spawn(run).unwrap().join().unwrap();
}

#[test]
fn the_reported_crashers_are_refused() {
    let run = || {
        for q in [
            format!("{}1{}", "(".repeat(1000 + 1), ")".repeat(1000 + 1)),
            format!("{}1", "-".repeat(100_000)),
            vec!["1"; 100_000].join("+"),
            "(".repeat(1_000_000),
            vec!["up"; 100_000].join(" or "),
        ] {
            let err = parse_with(&q, Features::all()).unwrap_err();
            assert!(err.msg.contains("nested too deeply"), "{}…: {err}", &q[..20]);
        }
    };
    std::thread::Builder::new().stack_size(TEST_STACK_BYTES).spawn(run).unwrap().join().unwrap();
}

#[test]
fn a_lower_limit_is_obeyed() {
    assert!(parse_with_depth("sum(abs(up))", Features::default(), 3).is_ok());
    let err = parse_with_depth("sum(abs(abs(up)))", Features::default(), 3).unwrap_err();
    assert!(err.msg.contains("more than 3 levels"), "{err}");
    assert!(parse_with_depth("1+2+3", Features::default(), 2).is_err());
    assert!(parse_with_depth("1+2+3", Features::default(), 3).is_ok());
}
