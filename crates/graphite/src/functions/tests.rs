use std::collections::BTreeMap;

use super::*;
use crate::target::parse;

fn fetched(name: &str, step: i64, values: &[Option<f64>]) -> Series {
    let tags = BTreeMap::from([("name".to_owned(), name.to_owned())]);
    let end = 100 + step * values.len() as i64;
    Series::fetched(name.to_owned(), tags, (100, end, step), values.to_vec(), String::new(), 0.0)
}

/// Evaluates `target` over a store of named series; a glob `x.*` matches names starting `x.`.
fn run(target: &str, store: &[Series]) -> Result<Vec<Series>, EvalError> {
    let mut fetches = Vec::new();
    let mut fetch = |pe: &str, _from: i64, _until: i64| -> Result<Vec<Series>, EvalError> {
        fetches.push(pe.to_owned());
        let prefix = pe.strip_suffix('*');
        Ok(store
            .iter()
            .filter(|s| prefix.map_or(s.name == pe, |p| s.name.starts_with(p)))
            .map(|s| Series { path_expression: pe.to_owned(), ..s.clone() })
            .collect())
    };
    let mut cx = Context::new(100, 200, 0.0, 10, &mut fetch);
    let out = evaluate(&parse(target).unwrap(), &mut cx);
    drop(cx);
    assert!(
        fetches.len() == fetches.iter().collect::<std::collections::BTreeSet<_>>().len(),
        "fetched twice: {fetches:?}"
    );
    out
}

fn store() -> Vec<Series> {
    vec![
        fetched("a.x", 10, &[Some(1.0), None, Some(3.0), Some(-4.0)]),
        fetched("a.y", 10, &[Some(10.0), Some(20.0), None, None]),
        fetched("b.z", 20, &[Some(5.0), None]),
    ]
}

#[test]
fn aggregations_name_and_fold_like_graphite_web() {
    let s = &run("sumSeries(a.*)", &store()).unwrap()[0];
    assert_eq!(s.name, "sumSeries(a.*)");
    assert_eq!(s.values, [Some(11.0), Some(20.0), Some(3.0), Some(-4.0)]);
    assert_eq!(s.tags.get("aggregatedBy").map(String::as_str), Some("sum"));
    let s = &run("averageSeries(a.*)", &store()).unwrap()[0];
    assert_eq!(s.values, [Some(5.5), Some(20.0), Some(3.0), Some(-4.0)]);
    // Several lists: names joined; steps brought to their least common multiple (20 s), each
    // series averaging its own points.
    let s = &run("sumSeries(a.x, b.z)", &store()).unwrap()[0];
    assert_eq!((s.name.as_str(), s.step), ("sumSeries(a.x,b.z)", 20));
    assert_eq!(s.values, [Some(6.0), Some(-0.5)]);
    let s = &run("aggregate(a.*, 'diffSeries')", &store()).unwrap()[0];
    assert_eq!((s.name.as_str(), s.values[0]), ("diffSeries(a.*)", Some(-9.0)));
    let s = &run("aggregate(a.*, 'max', 0.6)", &store()).unwrap()[0];
    assert_eq!(s.values, [Some(10.0), None, None, None]);
    let s = &run("multiplySeries(a.*)", &store()).unwrap()[0];
    assert_eq!(s.values, [Some(10.0), None, None, None]);
    assert_eq!(run("multiplySeries(a.x)", &store()).unwrap()[0].name, "a.x");
    assert_eq!(run("sumSeries(nothing)", &store()).unwrap(), []);
    // One path expression used twice: fetched once (`run` checks), each use sees the same data.
    let s = &run("sumSeries(a.x, scale(a.x, 2), a.x)", &store()).unwrap()[0];
    assert_eq!(s.values, [Some(4.0), None, Some(12.0), Some(-16.0)]);
}

#[test]
fn aliases_and_transforms() {
    let names = |t: &str| run(t, &store()).unwrap().into_iter().map(|s| s.name).collect::<Vec<_>>();
    assert_eq!(names("alias(a.*, 'x')"), ["x", "x"]);
    assert_eq!(names("aliasByNode(a.*, 1)"), ["x", "y"]);
    assert_eq!(names("aliasByNode(a.*, -1, 0)"), ["x.a", "y.a"]);
    assert_eq!(names("aliasByNode(sumSeries(a.*), 0)"), ["a"]);
    assert_eq!(names("aliasByNode(a.x, 'name')"), ["a.x"]);
    assert_eq!(names("aliasByMetric(scale(a.x, 2))"), ["x"]);
    assert_eq!(names("scale(a.x, 0.5)"), ["scale(a.x,0.5)"]);
    assert_eq!(names("offset(a.x, -10)"), ["offset(a.x,-10)"]);
    assert_eq!(names("a.x | absolute() | scale(1e7)"), ["scale(absolute(a.x),1e+07)"]);
    let s = &run("offset(scale(a.x, 2), 1)", &store()).unwrap()[0];
    assert_eq!(s.values, [Some(3.0), None, Some(7.0), Some(-7.0)]);
    assert_eq!(s.tags.get("scale").map(String::as_str), Some("2.0"));
}

#[test]
fn bad_calls_are_named() {
    let err = |t: &str| run(t, &store()).unwrap_err().to_string();
    assert!(err("nosuch(a.x)").contains("unknown function nosuch()"));
    assert!(err("scale(a.x)").contains("scale(): missing factor"));
    assert!(err("scale(a.x, 'two')").contains("factor must be a number"));
    assert!(err("alias(a.x, 'n', 3)").contains("too many arguments"));
    assert!(err("aggregate(a.x, 'mode')").contains("Unsupported aggregation function: mode"));
    assert!(err("sumSeries(a.x, 3)").contains("must be series lists"));
    assert!(err("scale(a.x, factr=2)").contains("missing factor"));
    // Fetched once, but every use counts against the limit (10 here).
    assert!(err("sumSeries(a.*, a.*, a.*, a.*, a.*, a.*)").contains("more than 10 series"));
}

#[test]
fn percent_g_as_python_writes_it() {
    for (v, want) in [
        (10.0, "10"),
        (0.5, "0.5"),
        (-10.0, "-10"),
        (1e7, "1e+07"),
        (123456.0, "123456"),
        (1234567.0, "1.23457e+06"),
        (0.0001, "0.0001"),
        (0.00001, "1e-05"),
        (1.0 / 3.0, "0.333333"),
        (0.0, "0"),
    ] {
        assert_eq!(py_g(v), want, "{v}");
    }
}

#[test]
fn counters_wrap_at_the_bounds_given() {
    let counter = vec![fetched("c", 10, &[Some(5.0), Some(8.0), Some(2.0), None, Some(4.0), Some(300.0)])];
    let values = |t: &str| run(t, &counter).unwrap()[0].values.clone();
    // A reset is a gap without bounds; with maxValue the counter wrapped past it; a value past
    // the bounds is a gap and forgets the previous value.
    assert_eq!(values("nonNegativeDerivative(c)"), [None, Some(3.0), None, None, None, Some(296.0)]);
    assert_eq!(values("nonNegativeDerivative(c, 9)"), [None, Some(3.0), Some(4.0), None, None, None]);
    assert_eq!(values("nonNegativeDerivative(c, minValue=1)"), [None, Some(3.0), Some(1.0), None, None, Some(296.0)]);
    assert_eq!(values("perSecond(c)"), [None, Some(0.3), None, None, None, Some(29.6)]);
    assert_eq!(run("perSecond(c)", &counter).unwrap()[0].name, "perSecond(c)");
    assert_eq!(values("integral(c)"), [Some(5.0), Some(13.0), Some(15.0), None, Some(19.0), Some(319.0)]);
    assert_eq!(transform::py_round(2.675, 2), 2.67);
    assert_eq!(transform::py_round(1.0 / 3.0, 6), 0.333333);
}

#[test]
fn gaps_filled_and_series_chosen_as_graphite_web_does() {
    let gappy = vec![
        fetched("g.b", 10, &[Some(1.0), None, None, Some(4.0), None]),
        fetched("g.a10", 10, &[Some(7.0), Some(8.0), Some(9.0), Some(1.0), Some(2.0)]),
        fetched("g.a9", 10, &[None, None, None, None, None]),
    ];
    let values = |t: &str| run(t, &gappy).unwrap()[0].values.clone();
    assert_eq!(values("keepLastValue(g.b)"), [Some(1.0), Some(1.0), Some(1.0), Some(4.0), Some(4.0)]);
    assert_eq!(values("keepLastValue(g.b, 1)"), [Some(1.0), None, None, Some(4.0), Some(4.0)]);
    assert_eq!(values("transformNull(g.b, -1)"), [Some(1.0), Some(-1.0), Some(-1.0), Some(4.0), Some(-1.0)]);
    assert_eq!(run("transformNull(g.b, -1)", &gappy).unwrap()[0].name, "transformNull(g.b,-1)");
    let names = |t: &str| run(t, &gappy).unwrap().into_iter().map(|s| s.name).collect::<Vec<_>>();
    assert_eq!(names("sortByName(g.*)"), ["g.a10", "g.a9", "g.b"]);
    assert_eq!(names("sortByName(g.*, true)"), ["g.a9", "g.a10", "g.b"]);
    // A summary that is a gap sorts lowest; ties keep their order.
    assert_eq!(names("highestCurrent(g.*, 3)"), ["g.b", "g.a10", "g.a9"]);
    assert_eq!(names("lowest(g.*, 2)"), ["g.a9", "g.b"]);
    assert_eq!(names("currentBelow(g.*, 2)"), ["g.a10", "g.a9"]);
    assert_eq!(names("exclude(g.*, 'a\\d+')"), ["g.b"]);
    assert_eq!(names("limit(grep(g.*, 'a'), 1)"), ["g.a10"]);
    assert!(run("filterSeries(g.*, 'max', '~', 1)", &gappy)
        .unwrap_err()
        .to_string()
        .contains("Unsupported operator: ~"));
    assert!(run("grep(g.*, '(')", &gappy).unwrap_err().to_string().contains("pattern"));
}

#[test]
fn groups_quotients_and_shifts() {
    let values = |t: &str| run(t, &store()).unwrap().into_iter().map(|s| (s.name, s.values)).collect::<Vec<_>>();
    assert_eq!(
        values("groupByNode(a.*, 0, 'sum')"),
        [("a".to_owned(), vec![Some(11.0), Some(20.0), Some(3.0), Some(-4.0)])]
    );
    assert_eq!(values("sumSeriesWithWildcards(a.*, 1)"), values("groupByNode(a.*, 0, 'sum')"));
    assert_eq!(values("divideSeries(a.x, a.y)")[0].1, [Some(0.1), None, None, None]);
    assert_eq!(values("divideSeries(a.x, nothing)")[0], ("divideSeries(a.x,MISSING)".to_owned(), vec![None; 4]));
    assert!(run("divideSeries(a.x, a.*)", &store()).unwrap_err().to_string().contains("exactly 1 series (got 2)"));
    assert_eq!(values("delay(a.x, 1)")[0].1, [None, Some(1.0), None, Some(3.0)]);
    assert_eq!(values("delay(a.x, -1)")[0].1, [None, Some(3.0), Some(-4.0), None]);
    assert!(values("delay(a.x, 0)")[0].1.is_empty(), "graphite-web's series[:-0]");
    assert_eq!(values("invert(a.x)")[0].1, [Some(1.0), None, Some(1.0 / 3.0), Some(-0.25)]);
    assert_eq!(values("squareRoot(a.x)")[0].1, [Some(1.0), None, Some(3f64.sqrt()), None]);
    assert_eq!(values("countSeries(a.*)")[0].1, [Some(2.0); 4]);
    assert_eq!(values("countSeries()")[0], ("0".to_owned(), vec![Some(0.0); 3]));
    assert_eq!(values("constantLine(1.5)")[0], ("1.5".to_owned(), vec![Some(1.5); 3]));
}

#[test]
fn summarize_buckets_and_refuses_what_it_cannot_do() {
    let s = &run("summarize(a.x, '20s')", &store()).unwrap()[0];
    assert_eq!(s.name, "summarize(a.x, \"20s\", \"sum\")");
    // Buckets aligned to 20 s from 100: [100,120) [120,140) [140,160).
    assert_eq!((s.start, s.end, s.step), (100, 160, 20));
    assert_eq!(s.values, [Some(1.0), Some(-1.0), None]);
    let err = |t: &str| run(t, &store()).unwrap_err().to_string();
    assert!(err("summarize(a.x, 'soon')").contains("not a positive interval"));
    assert!(err("summarize(a.x, '-1h')").contains("not a positive interval"));
    assert!(err("summarize(a.x, '1h', 'sumSeries')").contains("Unsupported aggregation function"));
    assert_eq!(transform::time_offset("1h30min"), Some(5400));
    assert_eq!(transform::time_offset("-2d"), Some(-172_800));
    assert_eq!(transform::time_offset("1mon"), Some(2_592_000));
    assert_eq!(transform::time_offset("5m"), None);
}

#[test]
fn percentiles_and_python_replacements() {
    let p = |v: &[f64], n: f64, i: bool| transform::percentile(&v.iter().map(|x| Some(*x)).collect::<Vec<_>>(), n, i);
    assert_eq!(p(&[4.0, 1.0, 3.0, 2.0], 50.0, false), Some(3.0));
    assert_eq!(p(&[4.0, 1.0, 3.0, 2.0], 50.0, true), Some(2.5));
    assert_eq!(p(&[1.0, 2.0], 100.0, false), Some(2.0));
    assert_eq!(p(&[1.0, 2.0], 150.0, false), Some(2.0), "past the end: the largest, not a panic");
    assert_eq!(p(&[], 50.0, false), None);
    let names = |t: &str| run(t, &store()).unwrap().into_iter().map(|s| s.name).collect::<Vec<_>>();
    assert_eq!(names(r"aliasSub(a.x, '(\w)\.(\w)', '\2-\1 $0 \g<1>')"), ["x-a $0 a"]);
    assert!(run("aliasSub(a.x, '(?<=a)x', 'y')", &store()).unwrap_err().to_string().contains("search"));
    assert!(run("log(a.x, 1)", &store()).unwrap_err().to_string().contains("no logarithm"));
    assert!(run("color(a.x)", &store()).unwrap_err().to_string().contains("missing theColor"));
    assert_eq!(names("unique(a.x, a.*)"), ["a.x", "a.y"]);
}

/// Evaluates `target` over `[from, until]` against series stored from 0 at 10 s: a fetch
/// answers, as whisper does, the intervals from the first after `from` to the first after
/// `until`. Returns the series and the ranges fetched.
fn run_ranged(
    target: &str,
    from: i64,
    until: i64,
    values: &[(&str, Vec<Option<f64>>)],
) -> (Vec<Series>, Vec<(i64, i64)>) {
    let mut ranges = Vec::new();
    let mut fetch = |pe: &str, from: i64, until: i64| -> Result<Vec<Series>, EvalError> {
        ranges.push((from, until));
        let (lo, hi) = (from - from.rem_euclid(10) + 10, until - until.rem_euclid(10) + 10);
        Ok(values
            .iter()
            .filter(|(name, _)| pe.strip_suffix('*').map_or(*name == pe, |p| name.starts_with(p)))
            .map(|(name, v)| {
                let at = |t: i64| v.get((t / 10) as usize).copied().flatten();
                let vals = (lo..hi).step_by(10).map(at).collect();
                let tags = BTreeMap::from([("name".to_owned(), name.to_string())]);
                Series::fetched(name.to_string(), tags, (lo, hi, 10), vals, pe.to_owned(), 0.0)
            })
            .collect())
    };
    let mut cx = Context::new(from, until, 0.0, 100, &mut fetch);
    let out = evaluate(&parse(target).unwrap(), &mut cx).unwrap();
    drop(cx);
    (out, ranges)
}

#[test]
fn moving_windows_fetch_the_window_before_the_range() {
    // A ramp 0, 1, 2, ... at 0, 10, 20 s, with a gap at 150 s.
    let ramp: Vec<Option<f64>> = (0..100).map(|i| (i != 15).then_some(i as f64)).collect();
    let data = [("a.x", ramp.clone())];
    let (out, ranges) = run_ranged("movingAverage(a.x, 3)", 100, 200, &data);
    // Evaluated over the request's range first (for the step), then 3 steps earlier.
    assert_eq!(ranges, [(100, 200), (70, 200)]);
    let s = &out[0];
    assert_eq!((s.name.as_str(), s.start, s.end), ("movingAverage(a.x,3)", 110, 210));
    assert_eq!(s.tags["movingAverage"], "3");
    // The point at 110 s averages 80, 90 and 100 s (not itself); the gap leaves two values.
    assert_eq!(&s.values[..7], [Some(9.0), Some(10.0), Some(11.0), Some(12.0), Some(13.0), Some(13.5), Some(15.0)]);
    assert_eq!(s.values.len(), 10);
    let (out, ranges) = run_ranged("movingMax(a.x, '30s', 1)", 100, 200, &data);
    assert_eq!(ranges[1], (70, 200));
    assert_eq!(out[0].name, "movingMax(a.x,\"30s\")");
    // xFilesFactor 1: a window with the gap in it is a gap.
    assert_eq!(&out[0].values[5..9], [None, None, None, Some(18.0)]);
    let (out, _) = run_ranged("movingWindow(a.x, 2, 'median')", 100, 200, &data);
    assert_eq!(out[0].name, "movingMedian(a.x,2)");
    assert_eq!(out[0].values[0], Some(9.5));
    let (out, _) = run_ranged("exponentialMovingAverage(a.x, 3)", 100, 200, &data);
    assert_eq!(out[0].name, "exponentialMovingAverage(a.x,3)");
    // Seeded with the average of the first window (80, 90, 100 s), then c = 0.5 with 11, 12.
    assert_eq!(&out[0].values[..3], [Some(9.0), Some(10.0), Some(11.0)]);
    assert_eq!(out[0].values.len(), 11);
}

#[test]
fn time_shifts_lay_earlier_data_over_the_range() {
    let ramp: Vec<Option<f64>> = (0..100).map(|i| Some(i as f64)).collect();
    let data = [("a.x", ramp)];
    let (out, ranges) = run_ranged("timeShift(a.x, '50s')", 500, 600, &data);
    assert_eq!(ranges, [(500, 600), (450, 550)]);
    let s = &out[0];
    assert_eq!((s.name.as_str(), s.start, s.end), ("timeShift(a.x, \"-50s\")", 510, 610));
    assert_eq!(s.values[0], Some(46.0));
    let (out, ranges) = run_ranged("timeStack(a.x, '100s', 1, 3)", 500, 600, &data);
    assert_eq!(ranges, [(500, 600), (400, 500), (300, 400)]);
    let firsts: Vec<_> = out.iter().map(|s| (s.name.as_str(), s.start, s.values[0])).collect();
    assert_eq!(firsts, [("timeShift(a.x, -100s, 1)", 510, Some(41.0)), ("timeShift(a.x, -100s, 2)", 510, Some(31.0))]);
}

#[test]
fn holt_winters_follows_a_steady_series_and_flags_a_jump() {
    let mut flat: Vec<Option<f64>> = vec![Some(5.0); 100];
    flat[95] = Some(50.0);
    let data = [("a.x", flat)];
    let (out, ranges) = run_ranged("holtWintersForecast(a.x, '300s', '100s')", 800, 990, &data);
    assert_eq!(ranges, [(800, 990), (500, 990)]);
    assert_eq!(out[0].name, "holtWintersForecast(a.x)");
    assert_eq!(out[0].start, 810);
    assert!(out[0].values[..14].iter().all(|v| (v.unwrap() - 5.0).abs() < 1e-9), "{:?}", out[0].values);
    let (bands, _) = run_ranged("holtWintersConfidenceBands(a.x, 3, '300s', '100s')", 800, 990, &data);
    let names: Vec<_> = bands.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["holtWintersConfidenceLower(a.x)", "holtWintersConfidenceUpper(a.x)"]);
    let (aberration, _) = run_ranged("holtWintersAberration(a.x, 3, '300s', '100s')", 800, 990, &data);
    let a = &aberration[0].values;
    // The jump (45 above the forecast) widens the band by 3 × 0.1 × 45 at once.
    assert_eq!(a[14], Some(31.5), "the jump at 950 s is above the band: {a:?}");
    assert_eq!(a[0], Some(0.0));
    let (area, _) = run_ranged("holtWintersConfidenceArea(a.x, 3, '300s', '100s')", 800, 990, &data);
    assert_eq!(area.len(), 2);
    assert_eq!(area[0].name, "holtWintersConfidenceArea(a.x)");
}

#[test]
fn list_functions_refuse_what_graphite_web_cannot_answer() {
    let err = |t: &str| run(t, &store()).unwrap_err().to_string();
    assert!(err("mapSeries(a.*, 0)").contains("only reduceSeries() takes"));
    assert!(err("reduceSeries(mapSeries(a.*, 0), 'sumSeries', 1, 'x', 'q')").contains("no series matches q"));
    assert!(err("sumSeriesLists(a.*, b.z)").contains("equal length"));
    assert!(err("asPercent(a.*, group(b.z, b.z, b.z))").contains("asPercent second argument"));
    assert!(err("consolidateBy(a.x, 'mean')").contains("Invalid consolidation function"));
    assert!(err("aliasQuery(a.x, 'x', 'y', '%d %d')").contains("not enough arguments"));
    let names = |t: &str| run(t, &store()).unwrap().into_iter().map(|s| s.name).collect::<Vec<_>>();
    assert_eq!(names("reduceSeries(mapSeries(a.*, 0), 'diffSeries', 1, 'y', 'x')"), ["a.reduce.diffSeries"]);
    let s = &run("reduceSeries(mapSeries(a.*, 0), 'diffSeries', 1, 'y', 'x')", &store()).unwrap()[0];
    // diffSeries takes the first present value of a row as the minuend.
    assert_eq!(s.values, [Some(9.0), Some(20.0), Some(3.0), Some(-4.0)]);
    // The stack's running total carries from one stacked() call to the next in a request.
    let s = run("group(stacked(a.x), stacked(a.x))", &store()).unwrap();
    assert_eq!(s[1].values, [Some(2.0), None, Some(6.0), Some(-8.0)]);
    // A series with values past its end (timeShift keeps the request's end, whatever the shifted
    // range held) counts the hits inside it and no others, without a panic.
    let mut past_end = fetched("p.q", 10, &[Some(1.0); 6]);
    past_end.end = 120;
    let hits = &run("hitcount(p.q, '20s')", &[past_end]).unwrap()[0];
    assert_eq!(hits.values, [Some(20.0)], "1 hit/s over the 20 s inside the end");
    let walk = &run("randomWalk('w', 10)", &store()).unwrap()[0];
    assert_eq!((walk.values.len(), walk.values[0]), (10, Some(0.0)));
    assert!(walk.values.windows(2).all(|w| (w[1].unwrap() - w[0].unwrap()).abs() <= 0.5));
}

#[test]
fn python_percent_formats_one_number() {
    let f = |fmt: &str, v: f64| lists::py_percent_format(fmt, v).unwrap();
    assert_eq!(f("%d MHz", 99.9), "99 MHz");
    assert_eq!(f("%08.1f", -3.25), "-00003.2");
    assert_eq!(f("[%-6s]", 2.5), "[2.5   ]");
    assert_eq!(f("%+g %%", 1e20), "+1e+20 %");
    assert_eq!(f("%.3e", 12345.678), "1.235e+04");
    assert_eq!(f("%x", 255.0), "ff");
    assert!(lists::py_percent_format("no conversion", 1.0).is_err());
    assert!(lists::py_percent_format("%q", 1.0).is_err());
    // Found by the fuzzer: a width of 10^17 asked for that much memory.
    assert!(lists::py_percent_format("%0000598478350481679246r", 1.0).is_err());
    assert!(lists::py_percent_format("%.999f", 1.0).is_err());
    // Found by the fuzzer: infinities have no exponent; Python writes them as words.
    assert_eq!(f("%2e", f64::INFINITY), "inf");
    assert_eq!(f("%G", f64::NEG_INFINITY), "-INF");
    assert!(lists::py_percent_format("%d", f64::NAN).is_err());
}

#[test]
fn events_count_the_servers_events_per_second() {
    // Events at 110 (deploy web), 110 (deploy), 150 (outage) and at the range's end, 200.
    let stored: [(i64, &[&str]); 4] =
        [(110, &["deploy", "web"]), (110, &["deploy"]), (150, &["outage"]), (200, &["deploy"])];
    let times = |tags: Option<&[String]>, from: i64, until: i64| -> Vec<i64> {
        stored
            .iter()
            .filter(|(t, has)| {
                (from..=until).contains(t) && tags.is_none_or(|want| want.iter().all(|w| has.contains(&w.as_str())))
            })
            .map(|(t, _)| *t)
            .collect()
    };
    let eval = |target: &str, with_events: bool| {
        let mut fetch = |_: &str, _: i64, _: i64| -> Result<Vec<Series>, EvalError> { Ok(Vec::new()) };
        let mut cx = Context::new(100, 200, 0.0, 10, &mut fetch);
        if with_events {
            cx = cx.with_events(&times);
        }
        evaluate(&parse(target).unwrap(), &mut cx)
    };
    let all = &eval("events('*')", true).unwrap()[0];
    assert_eq!(
        (all.name.as_str(), all.start, all.end, all.step, all.values.len()),
        ("events(\"*\")", 100, 200, 1, 100)
    );
    assert_eq!((all.values[10], all.values[50], all.values[11]), (Some(2.0), Some(1.0), None));
    assert_eq!(all.consolidation, Consolidation::Sum);
    let deploys = &eval("events('deploy', 'web')", true).unwrap()[0];
    assert_eq!(deploys.name, "events(\"deploy\", \"web\")");
    assert_eq!(deploys.values.iter().flatten().sum::<f64>(), 1.0);
    assert!(eval("events()", true).unwrap_err().to_string().contains("needs a tag"));
    assert!(eval("events(1)", true).unwrap_err().to_string().contains("strings"));
    assert!(eval("events('*')", false).unwrap_err().to_string().contains("keeps no events"));
}

proptest::proptest! {
    /// `py_round`'s fast way gives the float Python's `round` gives (its decimal text parsed),
    /// also on values a hair from a half.
    #[test]
    fn py_round_fast_way_agrees_with_the_decimal_text(
        mantissa in -1e7f64..1e7,
        exponent in -12i32..12,
        digits in 0usize..12,
        nudge in -4i64..=4,
    ) {
        let x = mantissa * 10f64.powi(exponent);
        let near_half = ((x * 10f64.powi(digits as i32)).trunc() + 0.5) / 10f64.powi(digits as i32);
        let near_half = f64::from_bits((near_half.to_bits() as i64 + nudge) as u64);
        for v in [x, near_half, -near_half] {
            proptest::prop_assert_eq!(
                transform::py_round(v, digits).to_bits(),
                transform::py_round_by_text(v, digits).to_bits(),
                "round({}, {})", v, digits
            );
        }
    }
}

/// Calls over enough points to spread over the cores answer exactly as over each series alone
/// (which stays on one thread), and an aggregation as the plain fold in series order.
#[test]
fn spread_over_the_cores_the_answers_are_the_same() {
    let points = 8192;
    let big: Vec<Series> = (0..64)
        .map(|i| {
            let mut count = 0.0;
            let values: Vec<Option<f64>> = (0..points)
                .map(|k| {
                    count = if (k + i) % 997 == 0 { 1.0 } else { count + ((k * 37 + i * 11) % 90) as f64 / 7.0 };
                    ((k * 7 + i) % 13 != 0).then_some(count)
                })
                .collect();
            fetched(&format!("big.host-{i:02}"), 10, &values)
        })
        .collect();
    assert!(big.len() * points >= PARALLEL_POINTS_MIN && points < PARALLEL_POINTS_MIN);
    let eval = |target: &str| {
        let mut fetch = |pe: &str, _: i64, _: i64| -> Result<Vec<Series>, EvalError> {
            let prefix = pe.strip_suffix('*');
            Ok(big.iter().filter(|s| prefix.map_or(s.name == pe, |p| s.name.starts_with(p))).cloned().collect())
        };
        let mut cx = Context::new(100, 100 + 10 * points as i64, 0.0, usize::MAX, &mut fetch);
        evaluate(&parse(target).unwrap(), &mut cx).unwrap()
    };
    for f in [
        "nonNegativeDerivative(%)",
        "perSecond(%)",
        "derivative(%)",
        "integral(%)",
        "keepLastValue(%, 3)",
        "summarize(%, '1h', 'max')",
        "movingAverage(%, 5)",
        "exponentialMovingAverage(%, 5)",
        "squareRoot(%)",
        "exp(scale(%, 0.001))",
    ] {
        let together = eval(&f.replace('%', "big.*"));
        let alone: Vec<Series> = big.iter().flat_map(|s| eval(&f.replace('%', &s.name))).collect();
        assert_eq!(together.len(), alone.len(), "{f}");
        for (t, a) in together.iter().zip(&alone) {
            assert_eq!(
                t.values.iter().map(|v| v.map(f64::to_bits)).collect::<Vec<_>>(),
                a.values.iter().map(|v| v.map(f64::to_bits)).collect::<Vec<_>>(),
                "{f}: {}",
                t.name
            );
        }
    }
    let sum = &eval("sumSeries(big.*)")[0];
    for (i, v) in sum.values.iter().enumerate() {
        let present: Vec<f64> = big.iter().filter_map(|s| s.values[i]).collect();
        let want = (!present.is_empty()).then(|| present.iter().fold(0.0, |a, b| a + b));
        assert_eq!(v.map(f64::to_bits), want.map(f64::to_bits), "sumSeries at {i}");
    }
}
