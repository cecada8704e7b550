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
use support::{free_port, http, which, Server};

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
        None => floats(answer),
    }
}

/// Non-null points in a render's JSON answer.
fn known_points(render: &Value) -> usize {
    render.as_array().map_or(0, |series| {
        series.iter().flat_map(|s| s["datapoints"].as_array().unwrap().iter()).filter(|p| !p[0].is_null()).count()
    })
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
    let requests = json!([
        ["/render/", recent],
        // Over two days: the 5-minute archive, averages where half the minutes are known.
        ["/render/", {"target": "servers.dc1.host-{1,3}.load", "from": (now_s - 2 * 86_400).to_string(), "until": until, "format": "json"}],
        ["/render/", {"target": "servers.dc2.*.load", "from": t0.to_string(), "until": until, "format": "json", "maxDataPoints": "20"}],
        ["/metrics/find/", {"query": "servers.*"}],
        ["/metrics/find/", {"query": "servers.dc1.*"}],
        ["/metrics/find/", {"query": "*.*.host-[12].load"}],
        ["/metrics/find/", {"query": "servers.*.host-1", "format": "completer"}],
        // Functions: graphite-web evaluates them over what its cluster server returns.
        ["/render/", {"target": "sumSeries(servers.dc1.*.load)", "from": t0.to_string(), "until": until, "format": "json"}],
        ["/render/", {"target": "aliasByNode(movingAverage(servers.*.host-1.load,5),1)", "from": t0.to_string(), "until": until, "format": "json"}],
    ]);
    // Functions Strata evaluates itself, each answered as graphite-web answers over whisper.
    let mut requests = requests;
    let two_days = (now_s - 2 * 86_400).to_string();
    for (target, from, extra) in [
        ("averageSeries(servers.*.*.load)", &t0.to_string(), None),
        ("minSeries(servers.*.*.load)", &t0.to_string(), None),
        ("maxSeries(servers.*.*.load)", &t0.to_string(), None),
        ("diffSeries(servers.dc1.host-1.load, servers.dc1.host-2.load)", &t0.to_string(), None),
        ("multiplySeries(servers.dc1.host-{1,2}.load)", &t0.to_string(), None),
        ("stddevSeries(servers.*.*.load)", &t0.to_string(), None),
        ("rangeOfSeries(servers.*.*.load)", &t0.to_string(), None),
        ("sum(servers.dc1.*.load, servers.dc2.*.load)", &two_days, None),
        ("aggregate(servers.*.*.load, 'median')", &t0.to_string(), None),
        ("aggregate(servers.*.*.load, 'count')", &t0.to_string(), None),
        ("aggregate(servers.*.*.load, 'avg_zero')", &t0.to_string(), None),
        ("aggregate(servers.*.*.load, 'last')", &t0.to_string(), None),
        ("aggregate(servers.*.*.load, 'sumSeries', 0.75)", &t0.to_string(), None),
        ("sumSeries(servers.*.*.load)", &t0.to_string(), Some(("xFilesFactor", "1"))),
        ("averageSeries(servers.*.*.load)", &t0.to_string(), Some(("maxDataPoints", "20"))),
        ("alias(servers.dc1.host-1.load, 'one')", &t0.to_string(), None),
        ("aliasByNode(servers.*.*.load, 1, -2)", &t0.to_string(), None),
        ("aliasByNode(sumSeries(servers.dc1.*.load), 1)", &t0.to_string(), None),
        ("aliasByMetric(servers.dc1.*.load)", &t0.to_string(), None),
        ("scale(servers.dc2.*.load, 0.5)", &t0.to_string(), None),
        ("servers.dc2.*.load | offset(-30) | absolute()", &t0.to_string(), None),
        ("offset(scale(servers.dc1.host-3.load, 1e7), 2)", &t0.to_string(), None),
        ("derivative(servers.dc1.host-1.load)", &t0.to_string(), None),
        ("nonNegativeDerivative(servers.dc1.*.load)", &t0.to_string(), None),
        // With maxValue or minValue graphite-web 1.1.8 fails on any gap (Python 3 refuses
        // `None > 2000.0`): those are checked in Strata's unit tests only.
        ("perSecond(servers.dc2.*.load)", &t0.to_string(), None),
        ("perSecond(servers.*.*.load)", &two_days, None),
        ("integral(servers.dc1.host-2.load)", &t0.to_string(), None),
        ("keepLastValue(servers.*.*.load)", &t0.to_string(), None),
        ("keepLastValue(servers.*.*.load, 1)", &two_days, None),
        ("transformNull(servers.dc1.*.load)", &t0.to_string(), None),
        ("transformNull(servers.dc1.*.load, -1, servers.dc2.*.load)", &t0.to_string(), None),
        ("removeBelowValue(servers.*.*.load, 50)", &t0.to_string(), None),
        ("removeAboveValue(servers.*.*.load, 100.5)", &t0.to_string(), None),
        ("highestCurrent(servers.*.*.load, 2)", &t0.to_string(), None),
        ("highestMax(servers.*.*.load, 1)", &t0.to_string(), None),
        ("lowestAverage(servers.*.*.load, 2)", &t0.to_string(), None),
        ("lowestCurrent(servers.*.*.load, 3)", &t0.to_string(), None),
        ("highest(servers.*.*.load, 2, 'sum')", &t0.to_string(), None),
        ("lowest(servers.*.*.load)", &t0.to_string(), None),
        ("currentAbove(servers.*.*.load, 50)", &t0.to_string(), None),
        ("currentBelow(servers.*.*.load, 70)", &t0.to_string(), None),
        ("averageBelow(servers.*.*.load, 130)", &t0.to_string(), None),
        ("maximumAbove(servers.*.*.load, 999)", &t0.to_string(), None),
        ("minimumBelow(servers.*.*.load, 30)", &t0.to_string(), None),
        ("filterSeries(servers.*.*.load, 'max', '>=', 1000)", &t0.to_string(), None),
        ("limit(servers.*.*.load, 2)", &t0.to_string(), None),
        ("exclude(servers.*.*.load, 'host-[12]')", &t0.to_string(), None),
        ("grep(servers.*.*.load, 'dc2')", &t0.to_string(), None),
        ("sortByName(servers.*.*.load, true, true)", &t0.to_string(), None),
        ("sortBy(servers.*.*.load, 'max')", &t0.to_string(), None),
        ("sortByMaxima(servers.*.*.load)", &t0.to_string(), None),
        ("sortByMinima(servers.*.*.load)", &t0.to_string(), None),
        ("sortByTotal(servers.*.*.load)", &t0.to_string(), None),
        ("aliasByNode(highestCurrent(nonNegativeDerivative(servers.*.*.load), 2), 2)", &t0.to_string(), None),
        ("divideSeries(servers.dc1.*.load, servers.dc2.host-1.load)", &t0.to_string(), None),
        ("divideSeries(servers.dc1.host-1.load, no.such.path)", &t0.to_string(), None),
        ("constantLine(42)", &t0.to_string(), None),
        ("threshold(7.5)", &t0.to_string(), None),
        ("threshold(7.5, 'limit', 'red')", &t0.to_string(), None),
        ("countSeries(servers.*.*.load)", &t0.to_string(), None),
        ("countSeries(servers.dc1.*.load, servers.dc2.*.load)", &two_days, None),
        ("groupByNode(servers.*.*.load, 1, 'sum')", &t0.to_string(), None),
        ("groupByNode(servers.*.*.load, 1)", &t0.to_string(), None),
        ("groupByNodes(servers.*.*.load, 'maxSeries', 1, 3)", &t0.to_string(), None),
        ("groupByNode(servers.*.*.load, 2, 'multiplySeries')", &t0.to_string(), None),
        ("aggregateWithWildcards(servers.*.*.load, 'sum', 1)", &t0.to_string(), None),
        ("sumSeriesWithWildcards(servers.*.*.load, 2)", &t0.to_string(), None),
        ("averageSeriesWithWildcards(servers.*.*.load, 1, 2)", &t0.to_string(), None),
        ("multiplySeriesWithWildcards(servers.*.*.load, 1)", &t0.to_string(), None),
        ("invert(servers.dc1.host-1.load)", &t0.to_string(), None),
        ("squareRoot(offset(servers.dc1.host-1.load, -30))", &t0.to_string(), None),
        ("isNonNull(servers.*.*.load)", &t0.to_string(), None),
        ("changed(servers.dc1.host-2.load)", &t0.to_string(), None),
        ("offsetToZero(servers.*.*.load)", &t0.to_string(), None),
        ("delay(servers.dc1.host-1.load, 2)", &t0.to_string(), None),
        ("delay(servers.dc1.host-1.load, -3)", &t0.to_string(), None),
        ("summarize(servers.*.*.load, '10min')", &t0.to_string(), None),
        ("summarize(servers.dc1.*.load, '1h', 'max')", &two_days, None),
        ("summarize(servers.dc2.*.load, '7min', 'average', true)", &t0.to_string(), None),
        ("summarize(servers.dc1.host-1.load, '30s', 'last')", &t0.to_string(), None),
        ("summarize(servers.*.*.load, '1d', 'count')", &two_days, None),
        ("aliasByTags(servers.dc1.*.load, 'name')", &t0.to_string(), None),
        ("aliasSub(servers.*.*.load, 'servers\\.(dc\\d)\\.host-(\\d+)', '\\2 in \\g<1>')", &t0.to_string(), None),
        ("pow(servers.dc1.host-1.load, 0.5)", &t0.to_string(), None),
        ("log(servers.dc1.*.load)", &t0.to_string(), None),
        ("log(offset(servers.dc1.host-1.load, -30), 2)", &t0.to_string(), None),
        ("scaleToSeconds(servers.dc2.*.load, 1)", &t0.to_string(), None),
        ("nPercentile(servers.*.*.load, 95)", &t0.to_string(), None),
        ("percentileOfSeries(servers.*.*.load, 50)", &t0.to_string(), None),
        ("percentileOfSeries(servers.*.*.load, 75, true)", &t0.to_string(), None),
        ("removeEmptySeries(removeAboveValue(servers.*.*.load, 30))", &t0.to_string(), None),
        ("unique(servers.dc1.*.load, servers.dc1.host-1.load, servers.dc2.*.load)", &t0.to_string(), None),
        ("color(lineWidth(alpha(servers.dc1.*.load, 0.5), 2), 'red')", &t0.to_string(), None),
    ] {
        let mut params = json!({"target": target, "from": from, "until": until, "format": "json"});
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
    let probe = json!([["/render/", recent]]);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = known_points(&graphite_web(&dir.path().join("gw-probe"), &whisper_env, &probe)[0].1);
        if got == distinct {
            break;
        }
        assert!(Instant::now() < deadline, "carbon-cache holds {got} of {distinct} points");
        std::thread::sleep(Duration::from_millis(500));
    }
    let reference = graphite_web(&dir.path().join("gw-whisper"), &whisper_env, &requests);
    let cluster_env = [("GW_CLUSTER", format!("127.0.0.1:{}", srv.port))];
    let over_strata = graphite_web(&dir.path().join("gw-strata"), &cluster_env, &requests);

    assert_eq!(known_points(&reference[0].1), distinct);
    for (i, request) in requests.as_array().unwrap().iter().enumerate() {
        let what = request.to_string();
        let want = normalized(&reference[i].1);
        assert_eq!(reference[i].0, 200, "{what}: {want}");
        assert!(want.as_array().is_some_and(|a| !a.is_empty()), "{what}: {want}");
        assert_eq!(
            (over_strata[i].0, normalized(&over_strata[i].1)),
            (200, want.clone()),
            "graphite-web over Strata, {what}"
        );
        let (path, params) = (request[0].as_str().unwrap(), &request[1]);
        // Functions Strata does not have yet are left to graphite-web.
        if params["target"].as_str().is_some_and(|t| t.contains("movingAverage")) {
            continue;
        }
        let direct = strata(srv.port, path.trim_end_matches('/'), params);
        assert_eq!((direct.0, normalized(&direct.1)), (200, want), "Strata itself, {what}");
    }
    drop(carbon);
}
