//! Debian's graphite-web 1.1.8 (run in process by `support/graphite_web.py`) in front of Strata
//! as a `CLUSTER_SERVERS` backend, and in front of Debian's carbon-cache's whisper files as the
//! reference: the same carbon lines go to Strata and to carbon-cache, and graphite-web's answers
//! over Strata, and Strata's own, must equal graphite-web's over whisper. `.ci/run` installs
//! graphite-web and graphite-carbon.

mod support;

use std::io::Write;
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{free_port, http, http_raw_body, which, Server};

const PYTHON: &str = "/usr/bin/python3";
const SCHEMAS: &str = "[default]\npattern = .*\nretentions = 60s:1d,5m:7d\n";

/// Debian's carbon-cache writing whisper files under `dir`, stopped on drop.
struct CarbonCache {
    child: Child,
    line_port: u16,
    query_port: u16,
}

impl CarbonCache {
    fn start(dir: &std::path::Path) -> CarbonCache {
        let (line_port, pickle_port, query_port) = (free_port(), free_port(), free_port());
        for sub in ["whisper", "log", "run", "lists"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        std::fs::write(dir.join("storage-schemas.conf"), SCHEMAS).unwrap();
        let d = dir.display();
        let conf = format!(
            "[cache]\nSTORAGE_DIR = {d}\nLOCAL_DATA_DIR = {d}/whisper\nWHITELISTS_DIR = {d}/lists\nCONF_DIR = {d}\n\
             LOG_DIR = {d}/log\nPID_DIR = {d}/run\nENABLE_LOGROTATION = False\nUSER =\nMAX_CACHE_SIZE = inf\n\
             MAX_UPDATES_PER_SECOND = 100000\nMAX_CREATES_PER_MINUTE = inf\n\
             LINE_RECEIVER_INTERFACE = 127.0.0.1\nLINE_RECEIVER_PORT = {line_port}\nENABLE_UDP_LISTENER = False\n\
             PICKLE_RECEIVER_INTERFACE = 127.0.0.1\nPICKLE_RECEIVER_PORT = {pickle_port}\n\
             CACHE_QUERY_INTERFACE = 127.0.0.1\nCACHE_QUERY_PORT = {query_port}\nLOG_UPDATES = False\n"
        );
        std::fs::write(dir.join("carbon.conf"), conf).unwrap();
        let child = Command::new(which("carbon-cache"))
            .args(["--config", &format!("{d}/carbon.conf"), "--nodaemon", "--pidfile", &format!("{d}/run/pid")])
            .arg("start")
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", line_port)).is_err() {
            assert!(Instant::now() < deadline, "carbon-cache did not listen on {line_port}");
            std::thread::sleep(Duration::from_millis(100));
        }
        CarbonCache { child, line_port, query_port }
    }
}

impl Drop for CarbonCache {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// graphite-web's answers, `(status, body as JSON)`, to `requests` (`[path, {params}]`), with
/// its settings from `env` (see `support/graphite_web.py`).
fn graphite_web(scratch: &std::path::Path, env: &[(&str, String)], requests: &Value) -> Vec<(u16, Value)> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/graphite_web.py");
    let mut cmd = Command::new(PYTHON);
    cmd.arg(script).env("GW_DIR", scratch).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("Debian's python3 runs graphite-web");
    child.stdin.take().unwrap().write_all(requests.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "graphite-web: {}", String::from_utf8_lossy(&out.stderr));
    let answers: Vec<(u16, String, String)> = serde_json::from_slice(&out.stdout).unwrap();
    answers
        .into_iter()
        .map(|(status, _, body)| (status, serde_json::from_str(&body).unwrap_or(Value::String(body))))
        .collect()
}

/// Strata's own answer to a graphite-web request.
fn strata(port: u16, path: &str, params: &Value) -> (u16, Value) {
    let query: String = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(params.as_object().unwrap().iter().map(|(k, v)| (k, v.as_str().unwrap())))
        .finish();
    let (status, body) = http(port, "GET", &format!("{path}?{query}"), &[], b"");
    (status, serde_json::from_str(&body).unwrap_or(Value::String(body)))
}

/// An answer in a comparable form: a completer's `metrics`, sorted by path (graphite-web lists
/// them in its finders' order, which for whisper is the directory's).
/// Numbers compare as numbers: graphite-web writes a Python int (`countSeries`' 4) where Strata
/// writes a float (4.0), the same value to any JSON reader.
fn normalized(answer: &Value) -> Value {
    fn floats(v: &Value) -> Value {
        match v {
            Value::Number(n) => n.as_f64().map_or(v.clone(), |f| json!(f)),
            Value::Array(a) => Value::Array(a.iter().map(floats).collect()),
            Value::Object(o) => Value::Object(o.iter().map(|(k, v)| (k.clone(), floats(v))).collect()),
            other => other.clone(),
        }
    }
    match answer.get("metrics").and_then(Value::as_array) {
        Some(metrics) => {
            let mut m = metrics.clone();
            m.sort_by(|a, b| a["path"].as_str().cmp(&b["path"].as_str()));
            Value::Array(m)
        }
        // A `nodelist` find: its sorted components.
        None => match answer.get("nodes") {
            Some(nodes) => nodes.clone(),
            None => floats(answer),
        },
    }
}

/// Non-null points in a render's JSON answer.
fn known_points(render: &Value) -> usize {
    render.as_array().map_or(0, |series| {
        series.iter().flat_map(|s| s["datapoints"].as_array().unwrap().iter()).filter(|p| !p[0].is_null()).count()
    })
}

/// A request parameter: name and value.
type Param = (&'static str, &'static str);

/// Targets Strata evaluates itself, each compared with graphite-web's answer over whisper: a
/// range, and a request parameter to add.
const TARGETS: &[(&str, Range, Option<Param>)] = &[
    ("averageSeries(servers.*.*.load)", Recent, None),
    ("minSeries(servers.*.*.load)", Recent, None),
    ("maxSeries(servers.*.*.load)", Recent, None),
    ("diffSeries(servers.dc1.host-1.load, servers.dc1.host-2.load)", Recent, None),
    ("multiplySeries(servers.dc1.host-{1,2}.load)", Recent, None),
    ("stddevSeries(servers.*.*.load)", Recent, None),
    ("rangeOfSeries(servers.*.*.load)", Recent, None),
    ("sum(servers.dc1.*.load, servers.dc2.*.load)", TwoDays, None),
    ("aggregate(servers.*.*.load, 'median')", Recent, None),
    ("aggregate(servers.*.*.load, 'count')", Recent, None),
    ("aggregate(servers.*.*.load, 'avg_zero')", Recent, None),
    ("aggregate(servers.*.*.load, 'last')", Recent, None),
    ("aggregate(servers.*.*.load, 'sumSeries', 0.75)", Recent, None),
    ("sumSeries(servers.*.*.load)", Recent, Some(("xFilesFactor", "1"))),
    ("averageSeries(servers.*.*.load)", Recent, Some(("maxDataPoints", "20"))),
    ("alias(servers.dc1.host-1.load, 'one')", Recent, None),
    ("aliasByNode(servers.*.*.load, 1, -2)", Recent, None),
    ("aliasByNode(sumSeries(servers.dc1.*.load), 1)", Recent, None),
    ("aliasByMetric(servers.dc1.*.load)", Recent, None),
    ("scale(servers.dc2.*.load, 0.5)", Recent, None),
    ("servers.dc2.*.load | offset(-30) | absolute()", Recent, None),
    ("offset(scale(servers.dc1.host-3.load, 1e7), 2)", Recent, None),
    ("derivative(servers.dc1.host-1.load)", Recent, None),
    ("nonNegativeDerivative(servers.dc1.*.load)", Recent, None),
    ("perSecond(servers.dc2.*.load)", Recent, None),
    ("perSecond(servers.*.*.load)", TwoDays, None),
    ("integral(servers.dc1.host-2.load)", Recent, None),
    ("keepLastValue(servers.*.*.load)", Recent, None),
    ("keepLastValue(servers.*.*.load, 1)", TwoDays, None),
    ("transformNull(servers.dc1.*.load)", Recent, None),
    ("transformNull(servers.dc1.*.load, -1, servers.dc2.*.load)", Recent, None),
    ("removeBelowValue(servers.*.*.load, 50)", Recent, None),
    ("removeAboveValue(servers.*.*.load, 100.5)", Recent, None),
    ("highestCurrent(servers.*.*.load, 2)", Recent, None),
    ("highestMax(servers.*.*.load, 1)", Recent, None),
    ("lowestAverage(servers.*.*.load, 2)", Recent, None),
    ("lowestCurrent(servers.*.*.load, 3)", Recent, None),
    ("highest(servers.*.*.load, 2, 'sum')", Recent, None),
    ("lowest(servers.*.*.load)", Recent, None),
    ("currentAbove(servers.*.*.load, 50)", Recent, None),
    ("currentBelow(servers.*.*.load, 70)", Recent, None),
    ("averageBelow(servers.*.*.load, 130)", Recent, None),
    ("maximumAbove(servers.*.*.load, 999)", Recent, None),
    ("minimumBelow(servers.*.*.load, 30)", Recent, None),
    ("filterSeries(servers.*.*.load, 'max', '>=', 1000)", Recent, None),
    ("limit(servers.*.*.load, 2)", Recent, None),
    ("exclude(servers.*.*.load, 'host-[12]')", Recent, None),
    ("grep(servers.*.*.load, 'dc2')", Recent, None),
    ("sortByName(servers.*.*.load, true, true)", Recent, None),
    ("sortBy(servers.*.*.load, 'max')", Recent, None),
    ("sortByMaxima(servers.*.*.load)", Recent, None),
    ("sortByMinima(servers.*.*.load)", Recent, None),
    ("sortByTotal(servers.*.*.load)", Recent, None),
    ("aliasByNode(highestCurrent(nonNegativeDerivative(servers.*.*.load), 2), 2)", Recent, None),
    ("divideSeries(servers.dc1.*.load, servers.dc2.host-1.load)", Recent, None),
    ("divideSeries(servers.dc1.host-1.load, no.such.path)", Recent, None),
    ("constantLine(42)", Recent, None),
    ("threshold(7.5)", Recent, None),
    ("threshold(7.5, 'limit', 'red')", Recent, None),
    ("countSeries(servers.*.*.load)", Recent, None),
    ("countSeries(servers.dc1.*.load, servers.dc2.*.load)", TwoDays, None),
    ("groupByNode(servers.*.*.load, 1, 'sum')", Recent, None),
    ("groupByNode(servers.*.*.load, 1)", Recent, None),
    ("groupByNodes(servers.*.*.load, 'maxSeries', 1, 3)", Recent, None),
    ("groupByNode(servers.*.*.load, 2, 'multiplySeries')", Recent, None),
    ("aggregateWithWildcards(servers.*.*.load, 'sum', 1)", Recent, None),
    ("sumSeriesWithWildcards(servers.*.*.load, 2)", Recent, None),
    ("averageSeriesWithWildcards(servers.*.*.load, 1, 2)", Recent, None),
    ("multiplySeriesWithWildcards(servers.*.*.load, 1)", Recent, None),
    ("invert(servers.dc1.host-1.load)", Recent, None),
    ("squareRoot(offset(servers.dc1.host-1.load, -30))", Recent, None),
    ("isNonNull(servers.*.*.load)", Recent, None),
    ("changed(servers.dc1.host-2.load)", Recent, None),
    ("offsetToZero(servers.*.*.load)", Recent, None),
    ("delay(servers.dc1.host-1.load, 2)", Recent, None),
    ("delay(servers.dc1.host-1.load, -3)", Recent, None),
    ("summarize(servers.*.*.load, '10min')", Recent, None),
    ("summarize(servers.dc1.*.load, '1h', 'max')", TwoDays, None),
    ("summarize(servers.dc2.*.load, '7min', 'average', true)", Recent, None),
    ("summarize(servers.dc1.host-1.load, '30s', 'last')", Recent, None),
    ("summarize(servers.*.*.load, '1d', 'count')", TwoDays, None),
    ("aliasByTags(servers.dc1.*.load, 'name')", Recent, None),
    ("aliasSub(servers.*.*.load, 'servers\\.(dc\\d)\\.host-(\\d+)', '\\2 in \\g<1>')", Recent, None),
    ("pow(servers.dc1.host-1.load, 0.5)", Recent, None),
    ("log(servers.dc1.*.load)", Recent, None),
    ("log(offset(servers.dc1.host-1.load, -30), 2)", Recent, None),
    ("scaleToSeconds(servers.dc2.*.load, 1)", Recent, None),
    ("nPercentile(servers.*.*.load, 95)", Recent, None),
    ("percentileOfSeries(servers.*.*.load, 50)", Recent, None),
    ("percentileOfSeries(servers.*.*.load, 75, true)", Recent, None),
    ("removeEmptySeries(removeAboveValue(servers.*.*.load, 30))", Recent, None),
    ("unique(servers.dc1.*.load, servers.dc1.host-1.load, servers.dc2.*.load)", Recent, None),
    ("color(lineWidth(alpha(servers.dc1.*.load, 0.5), 2), 'red')", Recent, None),
    // Counters with resets and gaps.
    ("nonNegativeDerivative(counters.*.requests)", Recent, None),
    ("nonNegativeDerivative(counters.app-1.requests, 5000)", Recent, None),
    ("nonNegativeDerivative(counters.app-1.requests, minValue=0)", Recent, None),
    ("perSecond(counters.*.requests)", Recent, None),
    ("perSecond(counters.app-1.requests, 100000)", Recent, None),
    ("perSecond(counters.*.requests)", TwoDays, None),
    ("derivative(counters.*.requests)", Recent, None),
    ("integral(nonNegativeDerivative(counters.*.requests))", Recent, None),
    ("summarize(nonNegativeDerivative(counters.*.requests), '15min', 'sum')", Recent, None),
    ("summarize(counters.*.requests, '30min', 'last', true)", Recent, None),
    ("keepLastValue(counters.app-2.requests, 3)", Recent, None),
    ("changed(counters.*.requests)", Recent, None),
    ("sumSeries(perSecond(counters.*.requests))", Recent, None),
    ("scaleToSeconds(nonNegativeDerivative(counters.*.requests), 60)", Recent, None),
    ("delay(counters.app-1.requests, 5)", Recent, None),
    ("offsetToZero(counters.*.requests)", Recent, None),
    ("highestMax(counters.*.requests, 1)", Recent, None),
    ("removeBelowValue(counters.*.requests, 2000)", Recent, None),
    ("transformNull(counters.app-2.requests, 0, counters.app-1.requests)", Recent, None),
    ("nPercentile(counters.*.requests, 50)", Recent, None),
    ("divideSeries(nonNegativeDerivative(counters.app-1.requests), counters.app-2.requests)", Recent, None),
    ("log(counters.*.requests, 10)", Recent, None),
    ("averageSeries(counters.*.requests)", Recent, Some(("maxDataPoints", "30"))),
    // Moving windows: by points and by time, each function, xFilesFactor, over both archives.
    ("movingAverage(servers.dc1.host-1.load, 5)", Recent, None),
    ("movingAverage(servers.*.*.load, '10min')", Recent, None),
    ("movingAverage(servers.dc1.*.load, 5, 0.5)", Recent, None),
    ("movingAverage(servers.*.*.load, 3)", TwoDays, None),
    ("movingAverage(sumSeries(servers.dc1.*.load), 4)", Recent, None),
    ("movingMedian(servers.dc2.*.load, 3)", Recent, None),
    ("movingMedian(servers.*.*.load, '5min')", Recent, None),
    ("movingSum(servers.dc1.host-2.load, 4)", Recent, None),
    ("movingSum(counters.*.requests, '20min', 0.9)", Recent, None),
    ("movingMin(servers.*.*.load, 3)", Recent, None),
    ("movingMax(servers.*.*.load, '7min')", Recent, None),
    ("movingWindow(servers.dc1.*.load, 6, 'stddev')", Recent, None),
    ("movingWindow(servers.*.*.load, '15min', 'max', 0.8)", Recent, None),
    ("movingWindow(servers.dc2.host-1.load, 3, 'avg_zero')", Recent, None),
    ("movingWindow(servers.dc1.host-3.load, 4, 'last')", Recent, None),
    ("movingWindow(counters.app-2.requests, 5, 'count')", Recent, None),
    ("movingWindow(servers.dc1.host-1.load, 2, 'range')", Recent, None),
    ("aliasByNode(movingMedian(servers.*.*.load, 4), 2)", Recent, None),
    ("exponentialMovingAverage(servers.dc1.host-1.load, 5)", Recent, None),
    ("exponentialMovingAverage(servers.*.*.load, '10min')", Recent, None),
    ("exponentialMovingAverage(counters.app-2.requests, 3)", Recent, None),
    // Shifted ranges.
    ("timeShift(servers.dc1.host-1.load, '30min')", Recent, None),
    ("timeShift(servers.*.*.load, '1h', false)", Recent, None),
    ("timeShift(servers.dc2.*.load, '+10min')", Recent, None),
    ("timeShift(servers.dc1.*.load, '-20min', true, true)", Recent, None),
    ("timeShift(sumSeries(servers.dc1.*.load), '15min')", Recent, None),
    ("timeShift(servers.dc1.host-2.load, '1d')", TwoDays, None),
    ("timeStack(servers.dc1.host-1.load, '30min', 0, 3)", Recent, None),
    ("timeStack(servers.dc2.*.load, '20min', 1, 4)", Recent, None),
    ("timeStack(counters.app-1.requests, '10min')", Recent, None),
    // Holt-Winters, with a bootstrap and season the data covers, and graphite-web's defaults.
    ("holtWintersForecast(servers.dc1.host-1.load, '1h', '20min')", Recent, None),
    ("holtWintersForecast(servers.*.*.load)", Recent, None),
    ("holtWintersForecast(servers.*.*.load, '2h')", Recent, None),
    ("holtWintersForecast(counters.app-2.requests, '40min', '10min')", Recent, None),
    ("holtWintersConfidenceBands(servers.dc1.*.load, 2, '1h', '20min')", Recent, None),
    ("holtWintersConfidenceBands(servers.dc2.host-1.load)", Recent, None),
    ("holtWintersConfidenceBands(servers.dc2.host-1.load, 3, '3h')", Recent, None),
    ("holtWintersAberration(servers.dc2.host-1.load, 3, '1h', '20min')", Recent, None),
    ("holtWintersAberration(counters.*.requests, 1, '30min', '10min')", Recent, None),
    ("holtWintersConfidenceArea(servers.dc1.host-2.load, 3, '1h', '20min')", Recent, None),
    ("areaBetween(servers.dc1.host-{1,2}.load)", Recent, None),
    // More argument variants of the first functions.
    ("sumSeries(servers.dc1.host-1.load, servers.dc1.host-1.load)", Recent, None),
    ("averageSeries(servers.*.*.load)", TwoDays, Some(("maxDataPoints", "100"))),
    ("maxSeries(servers.dc1.*.load, counters.*.requests)", Recent, None),
    ("aggregate(servers.*.*.load, 'range')", Recent, None),
    ("aggregate(servers.*.*.load, 'stddev', 0.5)", TwoDays, None),
    ("aggregate(servers.*.*.load, 'multiply')", Recent, None),
    ("aggregate(servers.*.*.load, 'diff')", Recent, None),
    ("aliasByNode(servers.*.*.load, -1)", Recent, None),
    ("aliasByNode(summarize(servers.*.*.load, '30min', 'max'), 1, 2)", Recent, None),
    ("aliasByMetric(nonNegativeDerivative(counters.*.requests))", Recent, None),
    ("aliasSub(counters.*.requests, '^counters\\.', '')", Recent, None),
    ("alias(sumSeries(counters.*.requests), 'all requests')", Recent, None),
    ("scale(counters.*.requests, -0.001)", Recent, None),
    ("offset(servers.*.*.load, 1e-5)", Recent, None),
    ("keepLastValue(servers.dc1.*.load, 0)", Recent, None),
    ("transformNull(servers.*.*.load, 1.5)", TwoDays, None),
    ("highestAverage(servers.*.*.load, 2)", TwoDays, None),
    ("highestCurrent(counters.*.requests, 1)", Recent, None),
    ("lowest(servers.*.*.load, 2, 'max')", Recent, None),
    ("highest(servers.*.*.load, 3, 'median')", Recent, None),
    ("averageAbove(counters.*.requests, 500)", Recent, None),
    ("minimumAbove(servers.*.*.load, 30)", Recent, None),
    ("maximumBelow(servers.*.*.load, 1100)", Recent, None),
    ("filterSeries(counters.*.requests, 'last', '<', 3000)", Recent, None),
    ("filterSeries(servers.*.*.load, 'sum', '!=', 0)", Recent, None),
    ("sortBy(servers.*.*.load, 'last', true)", Recent, None),
    ("sortByName(servers.*.*.load, false, true)", Recent, None),
    ("limit(sortByMaxima(servers.*.*.load), 1)", Recent, None),
    ("groupByNode(counters.*.requests, 0, 'sum')", Recent, None),
    ("groupByNodes(servers.*.*.load, 'average', 1)", TwoDays, None),
    ("groupByNode(servers.*.*.load, 2, 'maxSeries')", Recent, None),
    ("percentileOfSeries(counters.*.requests, 90)", Recent, None),
    ("nPercentile(servers.dc1.*.load, 5)", TwoDays, None),
    ("summarize(counters.*.requests, '1h', 'avg')", TwoDays, None),
    ("summarize(servers.*.*.load, '10min', 'median')", Recent, None),
    ("summarize(servers.*.*.load, '10min', 'stddev', true)", Recent, None),
    ("pow(servers.dc2.*.load, 2)", Recent, None),
    ("invert(counters.app-2.requests)", Recent, None),
    ("squareRoot(counters.*.requests)", Recent, None),
    ("isNonNull(counters.app-2.requests)", TwoDays, None),
    ("integral(servers.dc1.*.load)", TwoDays, None),
    ("countSeries(counters.*.requests, servers.*.*.load)", Recent, None),
    ("removeEmptySeries(servers.*.*.load, 0.9)", Recent, None),
    ("unique(counters.*.requests, counters.app-1.requests)", Recent, None),
    ("constantLine(-3.25)", TwoDays, None),
    // Percentages, legends, consolidation settings.
    ("asPercent(servers.*.*.load)", Recent, None),
    ("asPercent(servers.*.*.load, 200)", Recent, None),
    ("asPercent(servers.*.*.load, 150.5)", TwoDays, None),
    ("asPercent(servers.dc1.*.load, servers.dc2.host-1.load)", Recent, None),
    ("asPercent(servers.dc1.host-{1,2}.load, servers.dc1.host-{2,3}.load)", Recent, None),
    ("asPercent(servers.*.*.load, None, 1)", Recent, None),
    ("asPercent(servers.*.*.load, sumSeries(servers.*.*.load))", Recent, None),
    ("asPercent(servers.*.*.load, servers.dc1.host-1.load, 2)", Recent, None),
    ("asPercent(servers.*.*.load, servers.dc1.*.load, 1)", Recent, None),
    ("pct(counters.*.requests)", Recent, None),
    ("legendValue(servers.*.*.load, 'avg')", Recent, None),
    ("legendValue(servers.dc1.*.load, 'last', 'max', 'count')", Recent, None),
    ("legendValue(counters.*.requests, 'avg', 'si')", Recent, None),
    ("legendValue(counters.*.requests, 'max', 'nonsense', 'binary')", Recent, None),
    ("legendValue(servers.dc1.host-1.load, 'sum', 'median', 'nonsense')", Recent, None),
    ("cactiStyle(servers.*.*.load)", Recent, None),
    ("cactiStyle(counters.*.requests, 'si')", Recent, None),
    ("cactiStyle(counters.*.requests, 'binary', 'B')", Recent, None),
    ("cactiStyle(servers.dc1.*.load, None, 'load')", Recent, None),
    ("consolidateBy(servers.*.*.load, 'max')", Recent, Some(("maxDataPoints", "20"))),
    ("consolidateBy(servers.*.*.load, 'sum')", Recent, Some(("maxDataPoints", "7"))),
    ("consolidateBy(counters.*.requests, 'last')", Recent, Some(("maxDataPoints", "13"))),
    ("consolidateBy(servers.dc1.*.load, 'min')", Recent, None),
    ("consolidateBy(servers.dc1.*.load, 'first')", TwoDays, Some(("maxDataPoints", "50"))),
    ("consolidateBy(servers.dc2.*.load, 'avg_zero')", Recent, Some(("maxDataPoints", "15"))),
    ("cumulative(counters.*.requests)", Recent, Some(("maxDataPoints", "10"))),
    ("setXFilesFactor(servers.*.*.load, 0.8)", Recent, Some(("maxDataPoints", "20"))),
    ("xFilesFactor(servers.dc2.*.load, 0.5)", Recent, Some(("maxDataPoints", "30"))),
    ("sumSeries(setXFilesFactor(servers.*.*.load, 1))", Recent, None),
    ("averageSeries(servers.*.*.load)", Recent, Some(("maxDataPoints", "1"))),
    ("servers.*.*.load", TwoDays, Some(("maxDataPoints", "45"))),
    // Statistics, and functions that evaluate new targets.
    ("stdev(servers.dc1.host-1.load, 5)", Recent, None),
    ("stdev(servers.*.*.load, 10, 0.5)", Recent, None),
    ("stdev(counters.app-2.requests, 4, 1)", TwoDays, None),
    ("linearRegression(servers.dc1.host-1.load)", Recent, None),
    ("linearRegression(counters.*.requests, '{t0}')", Recent, None),
    ("linearRegression(servers.dc1.*.load, '{t0}', '{t1}')", Recent, None),
    ("mostDeviant(servers.*.*.load, 2)", Recent, None),
    ("mostDeviant(counters.*.requests, 5)", TwoDays, None),
    ("hitcount(counters.*.requests, '10min')", Recent, None),
    ("hitcount(servers.dc1.*.load, '7min', true)", Recent, None),
    ("hitcount(perSecond(counters.app-1.requests), '1h')", TwoDays, None),
    ("hitcount(servers.dc2.host-1.load, '45s')", Recent, None),
    ("smartSummarize(servers.*.*.load, '10min')", Recent, None),
    ("smartSummarize(counters.*.requests, '1h', 'max', 'hours')", Recent, None),
    ("smartSummarize(servers.dc1.*.load, '30min', 'avg', 'minutes')", Recent, None),
    ("smartSummarize(servers.*.*.load, '1d', 'sum', 'days')", TwoDays, None),
    ("useSeriesAbove(counters.app-1.requests, 100, 'app-1', 'app-2')", Recent, None),
    ("applyByNode(servers.*.*.load, 1, 'sumSeries(%.*.load)')", Recent, None),
    ("applyByNode(servers.*.*.load, 2, 'scale(%.load, 2)', '%.doubled')", Recent, None),
    ("groupByTags(servers.*.*.load, 'sumSeries', 'name')", Recent, None),
    ("groupByTags(servers.dc1.*.load, 'max', 'name')", TwoDays, None),
    ("powSeries(servers.dc1.host-1.load, servers.dc1.host-2.load)", Recent, None),
    ("powSeries(scale(servers.dc1.*.load, 0.01))", Recent, None),
    ("minMax(servers.*.*.load)", Recent, None),
    ("minMax(counters.*.requests)", TwoDays, None),
    ("interpolate(servers.*.*.load)", Recent, None),
    ("interpolate(counters.app-2.requests, 2)", Recent, None),
    ("exp(scale(servers.dc1.host-1.load, 0.01))", Recent, None),
    ("logit(scale(servers.dc1.*.load, 0.001))", Recent, None),
    ("sigmoid(offset(servers.dc1.host-2.load, -50))", Recent, None),
    ("add(servers.*.*.load, 2.5)", Recent, None),
    ("add(counters.*.requests, -7)", Recent, None),
    ("round(servers.*.*.load)", Recent, None),
    ("round(scale(servers.dc1.*.load, 0.333), 2)", Recent, None),
    ("round(counters.*.requests, -2)", Recent, None),
    ("secondYAxis(servers.dc1.*.load)", Recent, None),
    ("drawAsInfinite(changed(counters.*.requests))", Recent, None),
    ("dashed(servers.dc2.*.load)", Recent, None),
    ("dashed(servers.dc2.*.load, 2.5)", Recent, None),
    ("identity('the time')", Recent, None),
    ("time('t', 300)", TwoDays, None),
    ("timeFunction('t')", Recent, None),
    ("sin('wave', 2, 120)", Recent, None),
    ("sinFunction('wave')", Recent, None),
    ("aliasByNode(sin('a.b'), 1)", Recent, None),
    // Whole lists: grouping, pairing, map and reduce, percentile filters, lines, stacks.
    ("group(servers.dc1.*.load, counters.*.requests)", Recent, None),
    ("fallbackSeries(no.such.*, constantLine(1))", Recent, None),
    ("fallbackSeries(servers.dc2.*.load, constantLine(1))", Recent, None),
    ("sumSeriesLists(servers.dc1.host-{1,2}.load, servers.dc1.host-{2,3}.load)", Recent, None),
    ("diffSeriesLists(counters.*.requests, servers.dc1.host-{1,2}.load)", Recent, None),
    ("multiplySeriesLists(servers.dc1.host-1.load, servers.dc2.host-1.load)", TwoDays, None),
    ("aggregateSeriesLists(servers.dc1.host-{1,2}.load, servers.dc1.host-{2,3}.load, 'max')", Recent, None),
    ("aggregateSeriesLists(servers.dc1.host-{1,2}.load, servers.dc1.host-{2,3}.load, 'average', 0.6)", Recent, None),
    ("divideSeriesLists(counters.*.requests, servers.dc1.host-{1,2}.load)", Recent, None),
    ("weightedAverage(servers.dc1.*.load, servers.dc1.*.load)", Recent, None),
    ("reduceSeries(mapSeries(servers.dc1.*.load, 1), 'divideSeries', 2, 'host-1', 'host-2')", Recent, None),
    ("reduceSeries(mapSeries(counters.*.requests, 0), 'asPercent', 1, 'app-1', 'app-2')", Recent, None),
    ("removeAbovePercentile(servers.*.*.load, 50)", Recent, None),
    ("removeBelowPercentile(counters.*.requests, 25.5)", Recent, None),
    ("removeBetweenPercentile(group(counters.app-1.requests, scale(counters.app-1.requests, 2), offset(counters.app-1.requests, 500)), 30)", Recent, None),
    ("averageOutsidePercentile(servers.*.*.load, 30)", Recent, None),
    ("averageOutsidePercentile(servers.*.*.load, 90)", TwoDays, None),
    ("aggregateLine(servers.*.*.load)", Recent, None),
    ("aggregateLine(counters.*.requests, 'max', true)", Recent, None),
    ("aggregateLine(servers.dc1.*.load, 'median')", TwoDays, None),
    ("stacked(servers.*.*.load)", Recent, None),
    ("stacked(servers.dc1.*.load, 'mystack')", Recent, None),
    ("timeSlice(servers.*.*.load, '{t0}', '{t1}')", Recent, None),
    ("timeSlice(counters.*.requests, '{t1}', '{t2}')", Recent, None),
    ("substr(servers.*.*.load, 1)", Recent, None),
    ("substr(aliasByNode(servers.*.*.load, 0, 1, 2), 1, 2)", Recent, None),
    ("substr(scale(servers.dc1.*.load, 2), -2)", Recent, None),
    ("aliasQuery(counters.app-1.requests, 'app-1', 'app-2', 'app two at %d')", Recent, None),
    ("aliasQuery(servers.dc1.host-1.load, 'host-1', 'host-2', '%.2f load')", Recent, None),
    ("aliasQuery(servers.dc1.host-{1,3}.load, 'host-[0-9]', 'host-2', '%08.1f MHz')", Recent, None),
    ("aliasQuery(servers.dc1.host-3.load, 'host-3', 'host-1', 'at %-9s|')", Recent, None),
    ("aliasQuery(counters.app-2.requests, 'app-2', 'app-1', '%+g %%')", Recent, None),
    // Templates: keyword and positional variables, a number argument, the request's values.
    ("template(servers.$dc.*.load, dc='dc1')", Recent, None),
    ("template(sumSeries(servers.$1.*.load), 'dc2')", Recent, None),
    ("template(scale(servers.dc1.host-1.load, $f), f=2)", Recent, None),
    ("template(servers.$dc.host-1.load, dc='dc1')", Recent, Some(("template[dc]", "dc2"))),
    ("template(aliasByNode(servers.dc1.$h.load, $n), h='host-3', n=2)", Recent, None),
    // Aliases graphite-web registers under second names.
    ("avg(servers.dc1.*.load, counters.app-1.requests)", Recent, None),
    ("reduce(map(servers.dc1.*.load, 1), 'asPercent', 2, 'host-2', 'host-3')", Recent, None),
];

/// Targets graphite-web 1.1.8 fails on itself, with why; Strata must answer them (200), and
/// the test says so when graphite-web starts answering.
const KNOWN_WRONG: &[(&str, Range, &str)] = &[
    (
        "nonNegativeDerivative(servers.dc1.*.load, 1000)",
        Recent,
        "with maxValue, any gap fails under Python 3 (None > maxValue)",
    ),
    ("perSecond(servers.*.*.load, 1000, 0)", Recent, "with maxValue or minValue, any gap fails under Python 3"),
    (
        "useSeriesAbove(servers.*.*.load, 100, 'load', 'load')",
        Recent,
        "max() of a series with gaps fails under Python 3",
    ),
];

/// The range a target is rendered over: the recent 150 minutes (the 1-minute archive) or the
/// last two days (the 5-minute archive).
#[derive(Debug, Clone, Copy)]
enum Range {
    Recent,
    TwoDays,
}
use Range::{Recent, TwoDays};

/// Where `got` differs from `want` (`None` when it does not): numbers within a relative 1e-9,
/// everything else equal.
fn difference(want: &Value, got: &Value, at: &str) -> Option<String> {
    match (want, got) {
        (Value::Number(a), Value::Number(b)) => {
            let (a, b) = (a.as_f64().unwrap_or(f64::NAN), b.as_f64().unwrap_or(f64::NAN));
            let close = a == b || (a - b).abs() <= 1e-9 * a.abs().max(b.abs());
            (!close).then(|| format!("{at}: {b} where graphite-web has {a}"))
        }
        (Value::Array(a), Value::Array(b)) if a.len() != b.len() => {
            Some(format!("{at}: {} items where graphite-web has {}", b.len(), a.len()))
        }
        (Value::Array(a), Value::Array(b)) => {
            a.iter().zip(b).enumerate().find_map(|(i, (x, y))| difference(x, y, &format!("{at}[{i}]")))
        }
        (Value::Object(a), Value::Object(b)) if a.len() == b.len() && a.keys().all(|k| b.contains_key(k)) => {
            a.iter().find_map(|(k, x)| difference(x, &b[k], &format!("{at}.{k}")))
        }
        _ => (want != got).then(|| format!("{at}: {got} where graphite-web has {want}")),
    }
}

/// Per function, the targets using it that Strata answered as graphite-web and those it did
/// not.
#[derive(Default)]
struct Report {
    by_function: std::collections::BTreeMap<String, (usize, usize)>,
    failures: Vec<String>,
    /// Targets graphite-web answers with no series (Strata must too).
    empty: Vec<String>,
}

impl Report {
    fn record(&mut self, target: &str, outcome: Result<(), String>) {
        // Every identifier followed by `(` is a call.
        let mut functions: Vec<&str> = Vec::new();
        let bytes = target.as_bytes();
        let mut start = None;
        for (i, &c) in bytes.iter().enumerate() {
            match (c.is_ascii_alphanumeric() || c == b'_', start) {
                (true, None) => start = Some(i),
                (false, Some(s)) => {
                    if c == b'(' && bytes[s].is_ascii_alphabetic() && !functions.contains(&&target[s..i]) {
                        functions.push(&target[s..i]);
                    }
                    start = None;
                }
                _ => {}
            }
        }
        for f in functions {
            let e = self.by_function.entry(f.to_owned()).or_default();
            if outcome.is_ok() {
                e.0 += 1;
            } else {
                e.1 += 1;
            }
        }
        if let Err(why) = outcome {
            self.failures.push(format!("{target}: {why}"));
        }
    }

    fn table(&self) -> String {
        let mut out = format!("{} functions checked against graphite-web (passed/failed):\n", self.by_function.len());
        for (f, (passed, failed)) in &self.by_function {
            out.push_str(&format!("  {f:<32} {passed:>3} {failed:>3}\n"));
        }
        out.push_str(&format!("answered with no series by graphite-web: {:?}\n", self.empty));
        out
    }
}

#[test]
fn graphite_web_reads_strata_as_a_cluster_server_and_answers_as_over_carbon_caches_whisper_files() {
    let dir = tempfile::tempdir().unwrap();
    let carbon = CarbonCache::start(&dir.path().join("carbon"));
    let schemas = dir.path().join("storage-schemas.conf");
    std::fs::write(&schemas, SCHEMAS).unwrap();
    let strata_carbon = free_port();
    let srv = Server::start(
        &dir.path().join("data"),
        &[
            "--carbon.plaintext-listen-address",
            &format!("127.0.0.1:{strata_carbon}"),
            "--graphite.storage-schemas",
            schemas.to_str().unwrap(),
        ],
    );

    // 150 minutes of four paths: a timestamp jittered inside each minute (one per minute and
    // path), gaps, and rewrites of some timestamps later in the stream, whose values both
    // stores must keep (last write wins).
    let now_s = support::now_ms() / 1000;
    let t0 = now_s - now_s.rem_euclid(60) - 150 * 60;
    let paths =
        ["servers.dc1.host-1.load", "servers.dc1.host-2.load", "servers.dc1.host-3.load", "servers.dc2.host-1.load"];
    let (mut lines, mut rewrites) = (Vec::new(), Vec::new());
    for (p, path) in paths.iter().enumerate() {
        for k in 0..150i64 {
            if (k * 7 + p as i64) % 11 == 0 {
                continue;
            }
            let t = t0 + 60 * k + (k * 13 + p as i64 * 5) % 50;
            lines.push(format!("{path} {} {t}\n", ((p as i64 + 1) * 100 + k) as f64 / 4.0));
            if k % 17 == 3 {
                rewrites.push(format!("{path} {} {t}\n", 1000.0 + k as f64));
            }
        }
    }
    // Two counters with resets, one every minute without gaps, one with gaps.
    for (c, path) in ["counters.app-1.requests", "counters.app-2.requests"].iter().enumerate() {
        let mut count = 1000.0 * c as f64;
        for k in 0..150i64 {
            count = if k % 53 == 52 { (k % 7) as f64 } else { count + ((k * 37 + c as i64 * 11) % 90) as f64 };
            if c == 1 && (k % 13 == 4 || (70..76).contains(&k)) {
                continue;
            }
            let t = t0 + 60 * k + (k * 17 + c as i64 * 7) % 45;
            lines.push(format!("{path} {count} {t}\n"));
        }
    }
    let distinct = lines.len();
    // Arriving out of order: each run of 40 lines reversed.
    let mut stream: Vec<String> = lines.chunks(40).flat_map(|c| c.iter().rev().cloned()).collect();
    stream.extend(rewrites);
    let text: String = stream.concat();
    for port in [strata_carbon, carbon.line_port] {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(text.as_bytes()).unwrap();
    }
    let stored = "strata_carbon_points_stored_total{protocol=\"plaintext_tcp\"}";
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, metrics) = http(srv.port, "GET", "/metrics", &[], b"");
        let n: f64 = metrics
            .lines()
            .find(|l| l.starts_with(stored))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0.0);
        if n as usize == stream.len() {
            break;
        }
        assert!(Instant::now() < deadline, "Strata stored {n} of {} points", stream.len());
        std::thread::sleep(Duration::from_millis(100));
    }

    let until = (now_s - 60).to_string();
    let recent = json!({"target": "servers.*.*.load", "from": (t0 - 60).to_string(), "until": until, "format": "json"});
    let counters =
        json!({"target": "counters.*.requests", "from": (t0 - 60).to_string(), "until": until, "format": "json"});
    let requests = json!([
        ["/render/", recent],
        ["/render/", counters],
        // Over two days: the 5-minute archive, averages where half the minutes are known.
        ["/render/", {"target": "servers.dc1.host-{1,3}.load", "from": (now_s - 2 * 86_400).to_string(), "until": until, "format": "json"}],
        ["/render/", {"target": "servers.dc2.*.load", "from": t0.to_string(), "until": until, "format": "json", "maxDataPoints": "20"}],
        ["/metrics/find/", {"query": "servers.*"}],
        ["/metrics/find/", {"query": "servers.dc1.*"}],
        ["/metrics/find/", {"query": "*.*.host-[12].load"}],
        ["/metrics/find/", {"query": "servers.*.host-1", "format": "completer"}],
        // graphite-web's completer rewrites its query: a `*` is added, `..` is `*.`, and with
        // `automatic_variants` commas make an alternation.
        ["/metrics/find/", {"query": "servers.dc1.host-", "format": "completer"}],
        ["/metrics/find/", {"query": "servers..host-1", "format": "completer"}],
        ["/metrics/find/", {"query": "servers.dc1.host-1,host-3", "format": "completer", "automatic_variants": "1"}],
        ["/metrics/find/", {"query": "servers.*.*", "format": "nodelist", "position": "1"}],
        ["/metrics/find/", {"query": "servers.*.*.load", "format": "nodelist"}],
        ["/metrics/find/", {"query": "servers.*.*", "format": "nodelist", "position": "-2"}],
        ["/metrics/find/", {"query": "*.*.*", "leavesOnly": "1"}],
        ["/metrics/find/", {"query": "counters.*", "from": "-3h", "until": "now"}],
        // Functions: graphite-web evaluates them over what its cluster server returns.
        ["/render/", {"target": "sumSeries(servers.dc1.*.load)", "from": t0.to_string(), "until": until, "format": "json"}],
        ["/render/", {"target": "aliasByNode(movingAverage(servers.*.host-1.load,5),1)", "from": t0.to_string(), "until": until, "format": "json"}],
    ]);
    // Functions Strata evaluates itself, each answered as graphite-web answers over whisper.
    let mut requests = requests;
    let two_days = (now_s - 2 * 86_400).to_string();
    let known_wrong = KNOWN_WRONG.iter().map(|&(t, r, _)| (t, r, None));
    for (target, range, extra) in TARGETS.iter().copied().chain(known_wrong) {
        let from = match range {
            Range::Recent => t0.to_string(),
            Range::TwoDays => two_days.clone(),
        };
        // Dates in targets: the data's first minute, an hour and an hour and a half later.
        let target = target
            .replace("{t0}", &t0.to_string())
            .replace("{t1}", &(t0 + 3600).to_string())
            .replace("{t2}", &(t0 + 5400).to_string());
        // One `now` for both (a range reaching past it is clamped to it, and the two answer
        // seconds apart).
        let mut params =
            json!({"target": target, "from": from, "until": until, "now": now_s.to_string(), "format": "json"});
        if let Some((k, v)) = extra {
            params[k] = json!(v);
        }
        requests.as_array_mut().unwrap().push(json!(["/render/", params]));
    }

    // The reference: graphite-web over carbon-cache's files (and its cache, for points not yet
    // written), once carbon-cache has every point.
    let whisper_env = [
        ("GW_WHISPER", dir.path().join("carbon/whisper").display().to_string()),
        ("GW_CARBONLINK", format!("127.0.0.1:{}", carbon.query_port)),
    ];
    let probe = json!([["/render/", recent], ["/render/", counters]]);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got: usize =
            graphite_web(&dir.path().join("gw-probe"), &whisper_env, &probe).iter().map(|a| known_points(&a.1)).sum();
        if got == distinct {
            break;
        }
        assert!(Instant::now() < deadline, "carbon-cache holds {got} of {distinct} points");
        std::thread::sleep(Duration::from_millis(500));
    }
    let reference = graphite_web(&dir.path().join("gw-whisper"), &whisper_env, &requests);
    let cluster_env = [("GW_CLUSTER", format!("127.0.0.1:{}", srv.port))];
    let over_strata = graphite_web(&dir.path().join("gw-strata"), &cluster_env, &requests);

    assert_eq!(known_points(&reference[0].1) + known_points(&reference[1].1), distinct);
    let mut report = Report::default();
    for (i, request) in requests.as_array().unwrap().iter().enumerate() {
        let what = request.to_string();
        let (path, params) = (request[0].as_str().unwrap(), &request[1]);
        let target = params["target"].as_str().unwrap_or_default();
        if let Some((_, _, reason)) = KNOWN_WRONG.iter().find(|(t, _, _)| *t == target) {
            // graphite-web fails these itself; Strata must answer them.
            assert_ne!(reference[i].0, 200, "graphite-web now answers {what} ({reason}): compare it");
            let direct = strata(srv.port, path.trim_end_matches('/'), params);
            assert_eq!(direct.0, 200, "Strata itself, {what}: {}", direct.1);
            continue;
        }
        let want = normalized(&reference[i].1);
        if reference[i].0 != 200 || !want.is_array() {
            report.failures.push(format!("{what}: graphite-web answers {} {want}", reference[i].0));
            continue;
        }
        if want.as_array().is_some_and(Vec::is_empty) {
            report.empty.push(target.to_owned());
        }
        match (over_strata[i].0, difference(&want, &normalized(&over_strata[i].1), "")) {
            (200, None) => {}
            (status, d) => report.failures.push(format!("graphite-web over Strata, {what}: {status} {d:?}")),
        }
        let direct = strata(srv.port, path.trim_end_matches('/'), params);
        let outcome = match (direct.0, difference(&want, &normalized(&direct.1), "")) {
            (200, None) => Ok(()),
            (200, Some(d)) => Err(d),
            (status, _) => Err(format!("status {status}: {}", direct.1)),
        };
        report.record(target, outcome);
    }
    eprintln!("{}", report.table());
    assert!(report.failures.is_empty(), "Strata differs from graphite-web:\n{}", report.failures.join("\n"));
    // JSONP: the same JSON, wrapped in the callback, as JavaScript.
    let jsonp = json!([
        ["/metrics/find/", {"query": "servers.*", "jsonp": "cb.x_1"}],
        ["/metrics/find/", {"query": "servers.*.host-1", "format": "completer", "jsonp": "cb"}],
        ["/metrics/expand/", {"query": "servers.*.host-1", "jsonp": "cb"}],
        ["/render/", {"target": "servers.dc1.host-1.load", "from": t0.to_string(), "until": until, "format": "json", "jsonp": "cb"}],
    ]);
    let wrapped = graphite_web(&dir.path().join("gw-jsonp"), &whisper_env, &jsonp);
    let unwrapped = |text: &str, callback: &str| -> Value {
        let inner = text.strip_prefix(&format!("{callback}(")).and_then(|t| t.strip_suffix(')'));
        normalized(&serde_json::from_str(inner.unwrap_or_else(|| panic!("not wrapped in {callback}: {text}"))).unwrap())
    };
    for (i, request) in jsonp.as_array().unwrap().iter().enumerate() {
        let (path, params) = (request[0].as_str().unwrap().trim_end_matches('/'), &request[1]);
        let callback = params["jsonp"].as_str().unwrap();
        let want = unwrapped(wrapped[i].1.as_str().expect("JSONP is not JSON"), callback);
        let query: String = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(params.as_object().unwrap().iter().map(|(k, v)| (k, v.as_str().unwrap())))
            .finish();
        let (status, headers, body) = http_raw_body(srv.port, "GET", &format!("{path}?{query}"), &[]);
        let body = String::from_utf8(body).unwrap();
        assert_eq!(status, 200, "{request}: {body}");
        assert!(headers.to_ascii_lowercase().contains("content-type: text/javascript"), "{request}: {headers}");
        assert_eq!(difference(&want, &unwrapped(&body, callback), ""), None, "{request}");
    }
    // A callback that is not a function name is refused, not written into the script.
    let (status, body) = http(srv.port, "GET", "/metrics/find?query=servers.*&jsonp=alert(1)%3Bcb", &[], b"");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("jsonp"), "{body}");
    // Grafana posts its finds as a form: the same answer as the query string's.
    let form = [("Content-Type", "application/x-www-form-urlencoded")];
    let posted = http(srv.port, "POST", "/metrics/find", &form, b"query=servers.dc1.*&format=completer");
    let got = http(srv.port, "GET", "/metrics/find?query=servers.dc1.*&format=completer", &[], b"");
    assert_eq!(posted, got);
    assert!(got.1.contains("servers.dc1.host-3."), "{got:?}");
    // So do expand, findSeries (also with jQuery's `expr[]`) and the tag autocompletion.
    for (path, body) in [
        ("/metrics/expand", "query=servers.*.host-1&leavesOnly=0"),
        ("/tags/findSeries", "expr=name%3D~%5Eservers%5C.dc1"),
        ("/tags/autoComplete/values", "tag=name&valuePrefix=servers.dc2"),
    ] {
        let posted = http(srv.port, "POST", path, &form, body.as_bytes());
        let got = http(srv.port, "GET", &format!("{path}?{body}"), &[], b"");
        assert_eq!(posted, got, "{path}");
        assert_eq!(got.0, 200, "{path}: {}", got.1);
    }
    let listed = http(srv.port, "GET", "/tags/findSeries?expr[]=name%3D~%5Eservers%5C.dc1", &[], b"");
    assert_eq!(listed, http(srv.port, "GET", "/tags/findSeries?expr=name%3D~%5Eservers%5C.dc1", &[], b""));
    assert!(listed.1.contains("servers.dc1.host-2.load"), "{listed:?}");
    // graphite-web's version, which Grafana reads to pick its features.
    assert_eq!(http(srv.port, "GET", "/version", &[], b""), (200, "1.1.8\n".to_owned()));
    // The two-day renders read the schema's 5-minute archive from the left-closed tier the
    // schema gave the server (aggregated from the head here: nothing is old enough for blocks;
    // `graphite_tiers.rs` renders from tier blocks), the recent ones raw samples.
    let (_, metrics) = http(srv.port, "GET", "/metrics", &[], b"");
    let counter = |name: &str| -> f64 {
        metrics.lines().find(|l| l.starts_with(name)).and_then(|l| l.rsplit(' ').next()?.parse().ok()).unwrap_or(0.0)
    };
    assert!(counter("strata_graphite_render_series_tier_total") > 0.0, "no render read the tier");
    assert!(counter("strata_graphite_render_series_raw_total") > 0.0, "no render read raw samples");
    assert!(metrics.contains("strata_tsdb_rollup_tier_blocks{tier=\"5m-left\"}"), "{metrics}");
    drop(carbon);
}

/// Graphite's events: the same events posted to graphite-web (its Django database) and to
/// Strata, then listed by `/events/get_data` and counted by `events(...)` in `/render`, answer
/// for answer. graphite-web over Strata as a cluster server reads its own database for events,
/// so only Strata's own answers are compared.
#[test]
fn events_are_stored_listed_and_rendered_as_graphite_web_does() {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(&dir.path().join("data"), &[]);
    let now_s = support::now_ms() / 1000;
    let t0 = now_s - now_s.rem_euclid(60) - 7200;
    let posts = [
        json!({"what": "deploy app v1", "tags": ["deploy", "app"], "when": t0 + 100, "data": "v1"}),
        json!({"what": "deploy db", "tags": "deploy db", "when": t0 + 100}),
        json!({"what": "outage", "tags": "outage, \"on call\"", "when": t0 as f64 + 1000.7, "data": "paged"}),
        json!({"what": "untagged", "when": t0 + 2000}),
        json!({"what": "deploy app v2", "tags": ["deploy", "app"], "when": t0 as f64 + 3000.25}),
        json!({"what": "old deploy", "tags": ["deploy"], "when": t0 - 86_400}),
        // Refused by both: tags neither a list nor a string.
        json!({"what": "bad", "tags": 3, "when": t0}),
    ];
    let mut requests: Vec<Value> = posts.iter().map(|e| json!(["/events/", {}, e.to_string()])).collect();
    let (from, until) = (t0.to_string(), (t0 + 3600).to_string());
    let gets = [
        json!({}),
        json!({"from": from, "until": (t0 + 2500).to_string()}),
        json!({"tags": "deploy"}),
        json!({"tags": "deploy app"}),
        json!({"tags": "app db", "set": "union"}),
        json!({"tags": "deploy app", "set": "intersection"}),
        json!({"tags": "on call", "set": "union", "from": from}),
        json!({"tags": "outage"}),
        json!({"from": "-3d", "until": "now"}),
    ];
    requests.extend(gets.iter().map(|p| json!(["/events/get_data", p])));
    let renders = [
        ("events('*')", None),
        ("events('deploy')", Some(("maxDataPoints", "60"))),
        ("events('deploy', 'app')", None),
        ("drawAsInfinite(events('outage'))", None),
        ("summarize(events('*'), '10min', 'sum')", None),
        ("events('no-such-tag')", None),
        ("aliasByNode(events('deploy'), 0)", None),
    ];
    for (target, extra) in renders {
        let mut params =
            json!({"target": target, "from": from, "until": until, "now": now_s.to_string(), "format": "json"});
        if let Some((k, v)) = extra {
            params[k] = json!(v);
        }
        requests.push(json!(["/render/", params]));
    }
    let env =
        [("GW_WHISPER", dir.path().join("none").display().to_string()), ("GW_CARBONLINK", "127.0.0.1:1".to_owned())];
    std::fs::create_dir_all(dir.path().join("none")).unwrap();
    let reference = graphite_web(&dir.path().join("gw"), &env, &Value::Array(requests.clone()));

    let mut failures = Vec::new();
    for (i, request) in requests.iter().enumerate() {
        let (path, params) = (request[0].as_str().unwrap(), &request[1]);
        let got = match request.get(2).and_then(Value::as_str) {
            Some(body) => {
                let (status, text) =
                    http(srv.port, "POST", path, &[("Content-Type", "application/json")], body.as_bytes());
                (status, Value::String(text))
            }
            None => strata(srv.port, path.trim_end_matches('/'), params),
        };
        let want = &reference[i];
        if request.get(2).is_some() {
            // Posts: the status only (graphite-web's error text is its own).
            if got.0 != want.0 {
                failures.push(format!("{request}: status {} where graphite-web answers {}", got.0, want.0));
            }
            continue;
        }
        if want.0 != 200 {
            failures.push(format!("{request}: graphite-web answers {} {}", want.0, want.1));
            continue;
        }
        if let Some(d) = difference(&normalized(&want.1), &normalized(&got.1), "") {
            failures.push(format!("{request}: {} {d}", got.0));
        }
    }
    assert!(failures.is_empty(), "Strata differs from graphite-web:\n{}", failures.join("\n"));
    // Something was compared: the deploys of the last three days listed, the five events of
    // the hour counted.
    assert_eq!(reference[posts.len() + 2].1.as_array().map(Vec::len), Some(4));
    let counted: f64 = reference[posts.len() + gets.len()].1[0]["datapoints"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p[0].as_f64())
        .sum();
    assert_eq!(counted, 5.0);

    // Acknowledged events survive a SIGKILL; JSONP; one event by id.
    let mut srv = srv;
    srv.kill();
    let srv = Server::start(&dir.path().join("data"), &[]);
    let (_, all) = http(srv.port, "GET", "/events/get_data", &[], b"");
    assert_eq!(serde_json::from_str::<Value>(&all).unwrap(), reference[posts.len()].1);
    let (status, body) = http(srv.port, "GET", "/events/get_data?tags=outage&jsonp=show", &[], b"");
    assert_eq!(status, 200);
    assert!(body.starts_with("show([{") && body.contains("\"what\":\"outage\""), "{body}");
    let (status, body) = http(srv.port, "GET", "/events/3", &[], b"");
    assert_eq!((status, serde_json::from_str::<Value>(&body).unwrap()["what"].clone()), (200, json!("outage")));
    assert_eq!(http(srv.port, "GET", "/events/99/", &[], b"").0, 404);
    assert_eq!(http(srv.port, "GET", "/events/get_data?jsonp=alert(1)", &[], b"").0, 400);
}
