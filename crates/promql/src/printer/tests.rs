use super::*;
use crate::parser::{parse, parse_with, Features};

fn printed(q: &str) -> String {
    parse_with(q, Features::all()).unwrap_or_else(|e| panic!("{q}: {e:?}")).to_string()
}

fn formatted(q: &str) -> String {
    pretty(&parse_with(q, Features::all()).unwrap())
}

/// Prometheus 2.42's `/api/v1/format_query` answers (taken from the running server).
#[test]
fn as_prometheus_writes_them() {
    for (q, want) in [
        (
            r#"sum by(job)(rate(foo{b="c",a=~"x"}[5m] offset 1m)) / on(job) group_left(x) bar"#,
            r#"sum by (job) (rate(foo{a=~"x",b="c"}[5m] offset 1m)) / on (job) group_left (x) bar"#,
        ),
        (
            "max_over_time(rate(foo[5m])[1h:1m] @ 100 offset -5m) > bool 2",
            "max_over_time(rate(foo[5m])[1h:1m] @ 100.000 offset -5m) > bool 2",
        ),
        ("-(foo)", "-(foo)"),
        (r#"count_values("value", foo)"#, r#"count_values("value", foo)"#),
        (r#"{__name__=~"a.*"}"#, r#"{__name__=~"a.*"}"#),
        ("1e10 + 0.0000001 + Inf + -Inf + NaN + 0x10", "1e+10 + 1e-07 + +Inf + -Inf + NaN + 16"),
        ("a and on() b", "a and on () b"),
        ("sum(a) by (x)", "sum by (x) (a)"),
        (r#"label_replace(up, "a", "$1", "b", "(.*)")"#, r#"label_replace(up, "a", "$1", "b", "(.*)")"#),
        (r#""x\ty""#, r#""x\ty""#),
        ("foo[5m:]", "foo[5m:]"),
        ("foo @ start() offset 1h30m", "foo @ start() offset 1h30m"),
        ("sum without () (x)", "sum without () (x)"),
        ("topk(3, x)", "topk(3, x)"),
    ] {
        assert_eq!(printed(q), want, "{q}");
    }
    assert_eq!(
        formatted(r#"sum by(job)(rate(foooooooooooooooooooooooooooooooooo{b="c",a=~"x"}[5m] offset 1m)) / on(job) group_left(x) barrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr"#),
        "  sum by (job) (rate(foooooooooooooooooooooooooooooooooo{a=~\"x\",b=\"c\"}[5m] offset 1m))\n/ on (job) group_left (x)\n  barrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrrr"
    );
    assert_eq!(
        formatted(r#"topk(5, -(histogram_quantile(0.9, sum by (le) (rate(http_request_duration_seconds_bucket{job="apiserver",verb!="WATCH"}[5m])))))"#),
        "topk(\n  5,\n  -(\n    histogram_quantile(\n      0.9,\n      sum by (le) (rate(http_request_duration_seconds_bucket{job=\"apiserver\",verb!=\"WATCH\"}[5m]))\n    )\n  )\n)"
    );
}

#[test]
fn numbers_as_go_writes_them() {
    for (v, want) in [
        (1.0, "1"),
        (0.5, "0.5"),
        (100000.0, "100000"),
        (123456.7, "123456.7"),
        (1e6, "1e+06"),
        (1234567.0, "1.234567e+06"),
        (0.0001, "0.0001"),
        (0.00001, "1e-05"),
        (-2.5e-300, "-2.5e-300"),
        (1.5e300, "1.5e+300"),
        (-0.0, "-0"),
    ] {
        assert_eq!(go_float(v), want, "{v}");
    }
}

#[test]
fn what_prometheus_would_lose_is_kept() {
    // Prometheus prints `a * b` here, a one-to-one match: not the query that was given.
    assert_eq!(printed("a * ignoring() group_left b"), "a * ignoring () group_left () b");
    assert_eq!(printed("a + fill(0) b"), "a + fill(0) b");
    assert_eq!(printed("a + fill_left(1) fill_right(-2) b"), "a + fill_left(1) fill_right(-2) b");
    assert_eq!(printed("rate(foo[5m] anchored)"), "rate(foo[5m] anchored)");
    assert_eq!(printed("foo[step() * 2]"), "foo[(step() * 2)]");
    assert_eq!(printed("foo offset min_of(step(), 1m)"), "foo offset (min_of(step(), 60))");
}

/// Every query of Prometheus' PromQL test files that parses: printed, it parses again to a
/// tree that prints the same, one line and pretty.
#[test]
fn printing_reads_back_over_the_upstream_test_queries() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/promql");
    let (mut checked, mut files) = (0, 0);
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "test") {
            continue;
        }
        files += 1;
        for line in std::fs::read_to_string(&path).unwrap().lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            let query_at = match words.as_slice() {
                [e, "instant", "at", ..] if e.starts_with("eval") => 4,
                [e, "range", "from", _, "to", _, "step", ..] if e.starts_with("eval") => 8,
                _ => continue,
            };
            let Some(q) = nth_word_rest(line, query_at) else { continue };
            let Ok(first) = parse_with(q, Features::all()) else { continue };
            let text = first.to_string();
            let again = parse_with(&text, Features::all()).unwrap_or_else(|e| {
                panic!("{}: {q:?} printed as {text:?}, which does not parse: {e:?}", path.display())
            });
            assert_eq!(again.to_string(), text, "{}: {q}", path.display());
            let p = pretty(&first);
            let from_pretty = parse_with(&p, Features::all())
                .unwrap_or_else(|e| panic!("{q:?} formatted as {p:?}, which does not parse: {e:?}"));
            assert_eq!(from_pretty.to_string(), text, "{q}: formatted as {p}");
            checked += 1;
        }
    }
    assert!(files >= 21 && checked > 1500, "{checked} queries in {files} files");
}

/// The text of `line` from its `n`th whitespace-separated word on.
fn nth_word_rest(line: &str, n: usize) -> Option<&str> {
    let mut rest = line.trim_start();
    for _ in 0..n {
        let end = rest.find(char::is_whitespace)?;
        rest = rest[end..].trim_start();
    }
    (!rest.is_empty()).then_some(rest)
}

#[test]
fn utf8_names_print_quoted() {
    for q in [r#"{"foo.bar"}"#, r#"{"foo.bar", a="b"}"#, r#"rate({"http.requests"}[5m])"#, r#"sum by ("a.b") (x)"#] {
        let text = printed(q);
        assert_eq!(printed(&text), text, "{q} printed as {text}");
    }
}

#[test]
fn plain_parse_prints_too() {
    assert_eq!(parse("up").unwrap().to_string(), "up");
}
