//! Carbon ingest into the real binary: plaintext and pickle over real sockets, a SIGKILL after
//! the points were read, and Debian's `carbon-c-relay` relaying into Strata (`.ci/run`
//! installs it). PromQL reads the paths back (`__name__` is the path).

mod support;

use std::io::Write;
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use support::{free_port, http, which, Server};

/// Held by each test of this file: they pick free ports, and one of them restarts servers and
/// another starts carbon-c-relay, either of which takes a while to bind its port, long enough
/// for a test running alongside to be handed the same port. One at a time, they cannot.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The value of the first sample of `/metrics` whose line starts with `prefix`.
fn metric(port: u16, prefix: &str) -> f64 {
    let (code, body) = http(port, "GET", "/metrics", &[], b"");
    assert_eq!(code, 200);
    body.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

fn wait_for(port: u16, prefix: &str, want: f64) {
    wait_for_or_say(port, prefix, want, String::new);
}

/// `wait_for`, whose failure message adds what `context` says then (peers' logs).
fn wait_for_or_say(port: u16, prefix: &str, want: f64, context: impl FnOnce() -> String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = metric(port, prefix);
        if got >= want {
            return;
        }
        if Instant::now() >= deadline {
            panic!("{prefix} stayed at {got}, not {want}{}", context());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An instant query's single scalar-like result (`sum`, `count`), by URL-encoded `q`.
fn query_value(port: u16, q: &str) -> f64 {
    let path = format!("/api/v1/query?query={}", form_encode(q));
    let (code, body) = http(port, "GET", &path, &[], b"");
    assert_eq!(code, 200, "{q}: {body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let result = &v["data"]["result"];
    assert_eq!(result.as_array().map(Vec::len), Some(1), "{q}: {body}");
    result[0]["value"][1].as_str().unwrap().parse().unwrap()
}

fn form_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

const PATHS: usize = 50;
const POINTS: usize = 20;

/// `PATHS` paths × `POINTS` points a minute apart ending about now, as lines, path by path
/// in time order, split over `connections` groups.
fn lines(connections: usize, now_s: i64) -> Vec<String> {
    let mut out = vec![String::new(); connections];
    for p in 0..PATHS {
        for i in 0..POINTS {
            let t = now_s - 60 * (POINTS - i) as i64;
            out[p % connections].push_str(&format!("servers.dc1.host-{p:05}.cpu.user {} {t}\n", p * 1000 + i));
        }
    }
    out
}

#[test]
fn carbon_lines_and_pickles_are_stored_survive_a_sigkill_and_are_read_by_promql() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (plain, pickle) = (free_port(), free_port());
    let schemas = dir.path().join("storage-schemas.conf");
    std::fs::write(&schemas, "[servers]\npattern = ^servers\\.\nretentions = 60s:1d,5m:7d\n").unwrap();
    let args = [
        "--graphite.storage-schemas",
        schemas.to_str().unwrap(),
        "--wal-fsync",
        "always",
        "--carbon.plaintext-listen-address",
        &format!("127.0.0.1:{plain}"),
        "--carbon.pickle-listen-address",
        &format!("127.0.0.1:{pickle}"),
    ];
    let mut srv = Server::start(&data, &args);
    let now_s = support::now_ms() / 1000;
    let threads: Vec<_> = lines(4, now_s)
        .into_iter()
        .map(|text| {
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(("127.0.0.1", plain)).unwrap();
                // A bad line in the middle of each stream: counted, the stream goes on.
                let half = text.len() / 2;
                let cut = half + text[half..].find('\n').unwrap() + 1;
                s.write_all(&text.as_bytes()[..cut]).unwrap();
                s.write_all(b"servers.bad value-is-not-a-number 1\n").unwrap();
                s.write_all(&text.as_bytes()[cut..]).unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // One pickle message (Python's protocol 2, as carbon's senders use), and an evil one.
    let mut s = TcpStream::connect(("127.0.0.1", pickle)).unwrap();
    for msg in [&b"cos\nsystem\n(S'echo pwned'\ntR."[..], &python_pickle(now_s)[..]] {
        s.write_all(&(msg.len() as u32).to_be_bytes()).unwrap();
        s.write_all(msg).unwrap();
    }
    drop(s);
    let total = (PATHS * POINTS) as f64;
    wait_for(srv.port, "strata_carbon_points_stored_total{protocol=\"plaintext_tcp\"}", total);
    wait_for(srv.port, "strata_carbon_points_stored_total{protocol=\"pickle_tcp\"}", 2.0);
    assert_eq!(
        metric(srv.port, "strata_carbon_points_rejected_total{protocol=\"plaintext_tcp\",reason=\"bad_value\"}"),
        4.0
    );
    assert_eq!(
        metric(
            srv.port,
            "strata_carbon_points_rejected_total{protocol=\"pickle_tcp\",reason=\"pickle_opcode_refused\"}"
        ),
        1.0
    );

    // Stored means committed to the WAL, fsynced: a crash now loses nothing.
    srv.kill();
    let srv = Server::start(&data, &args);
    let matcher = r#"{__name__=~"servers\\.dc1\\..*"}"#;
    assert_eq!(query_value(srv.port, &format!("count({matcher})")), PATHS as f64);
    assert_eq!(query_value(srv.port, &format!("sum(count_over_time({matcher}[1h]))")), total);
    // Prometheus 3's quoted names reach a path directly.
    let one = r#"max_over_time({"servers.dc1.host-00007.cpu.user"}[1h])"#;
    assert_eq!(query_value(srv.port, one), (7 * 1000 + POINTS - 1) as f64);
    assert_eq!(query_value(srv.port, r#"sum(max_over_time({__name__="pickled.path",dc="eu"}[1h]))"#), 5.0);

    // Graphite's find over the same paths, graphite-web's formats.
    let find = |q: &str| {
        let (code, body) = http(srv.port, "GET", &format!("/metrics/find?query={}", form_encode(q)), &[], b"");
        assert_eq!(code, 200, "{q}: {body}");
        serde_json::from_str::<serde_json::Value>(&body).unwrap()
    };
    let top = find("servers.*");
    assert_eq!(
        top,
        serde_json::json!([{"allowChildren": 1, "expandable": 1, "leaf": 0, "id": "servers.dc1", "text": "dc1"}])
    );
    assert_eq!(find("servers.dc1.*").as_array().unwrap().len(), PATHS);
    // As graphite-web: one node per name, its id the query's prefix and the name.
    let leaves = find("servers.*.host-0000[0-2].{cpu,mem}.*");
    assert_eq!(
        leaves,
        serde_json::json!([{"allowChildren": 0, "expandable": 0, "leaf": 1, "id": "servers.*.host-0000[0-2].{cpu,mem}.user", "text": "user"}])
    );
    let hosts = find("servers.dc1.host-0000[0-2]");
    let ids: Vec<&str> = hosts.as_array().unwrap().iter().map(|n| n["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["servers.dc1.host-00000", "servers.dc1.host-00001", "servers.dc1.host-00002"]);
    assert_eq!(find("*.*.*").as_array().unwrap().len(), PATHS, "a leading star");
    let (code, body) =
        http(srv.port, "GET", "/graphite/metrics/find?format=completer&query=servers.dc1.host-0000%3F", &[], b"");
    assert_eq!(code, 200);
    let c: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        c["metrics"][0],
        serde_json::json!({"path": "servers.dc1.host-00000.", "name": "host-00000", "is_leaf": "0"})
    );
    assert_eq!(c["metrics"].as_array().unwrap().len(), 10);
    let get_json = |path: &str| {
        let (code, body) = http(srv.port, "GET", path, &[], b"");
        assert_eq!(code, 200, "{path}: {body}");
        serde_json::from_str::<serde_json::Value>(&body).unwrap()
    };
    assert_eq!(
        get_json("/metrics/expand?query=servers.dc1.host-0000%5B12%5D&query=pickled.*"),
        serde_json::json!({"results": ["pickled.path", "servers.dc1.host-00001", "servers.dc1.host-00002"]})
    );
    assert_eq!(
        get_json("/metrics/expand?query=servers.*.host-00001&query=pickled&groupByExpr=1&leavesOnly=1"),
        serde_json::json!({"results": {"servers.*.host-00001": [], "pickled": []}})
    );
    let index = get_json("/graphite/metrics/index.json");
    assert_eq!(index.as_array().unwrap().len(), PATHS + 1, "{index}");
    assert_eq!(index[0], "pickled.path");
    let (code, body) = http(srv.port, "GET", "/metrics/find?query=servers.%7Bdc1", &[], b"");
    assert!(code == 400 && body.contains("unbalanced"), "{code} {body}");

    // Render, raw format: over the last hour the 60 s archive, a value per minute.
    let render = |q: &str| {
        let (code, body) = http(srv.port, "GET", &format!("/render?{q}"), &[], b"");
        assert_eq!(code, 200, "{q}: {body}");
        body
    };
    let raw = render("target=servers.dc1.host-0000%5B0-1%5D.cpu.user&from=-1h&format=raw");
    let lines: Vec<&str> = raw.lines().collect();
    assert_eq!(lines.len(), 2, "{raw}");
    for (p, line) in lines.iter().enumerate() {
        let (head, values) = line.split_once('|').unwrap();
        let head: Vec<&str> = head.split(',').collect();
        assert_eq!(head[0], format!("servers.dc1.host-{p:05}.cpu.user"));
        let (start, end, step): (i64, i64, i64) =
            (head[1].parse().unwrap(), head[2].parse().unwrap(), head[3].parse().unwrap());
        assert_eq!((step, (end - start) / step), (60, 60), "{line}");
        let values: Vec<&str> = values.split(',').collect();
        assert_eq!(values.len(), 60);
        // Points every minute up to a minute before the write, each in its own interval
        // (computed from the answer's start: the render's "now" may be a minute later).
        let want: Vec<String> = (0..60)
            .map(|k| {
                let interval = start + k * 60;
                (0..POINTS)
                    .find(|&i| {
                        let t = now_s - 60 * (POINTS - i) as i64;
                        t - t.rem_euclid(60) == interval
                    })
                    .map_or("None".into(), |i| format!("{}.0", p * 1000 + i))
            })
            .collect();
        assert_eq!(values.iter().filter(|v| **v != "None").count(), POINTS, "{line}");
        assert_eq!(values, want, "{line}");
    }
    // All 50 paths: read on several threads, answered in path order with their own values.
    let raw = render("target=servers.dc1.*.cpu.user&from=-1h&format=raw");
    let lines: Vec<&str> = raw.lines().collect();
    assert_eq!(lines.len(), PATHS, "{raw}");
    for (p, line) in lines.iter().enumerate() {
        assert!(line.starts_with(&format!("servers.dc1.host-{p:05}.cpu.user,")), "{line}");
        let last = line.rsplit(',').find(|v| *v != "None").unwrap();
        assert_eq!(last, format!("{}.0", p * 1000 + POINTS - 1), "{line}");
    }
    // Six hours of all paths, 18,000 points: JSON this large is written on a blocking thread
    // and sent as it is written; it holds what the raw format holds, and JSONP wraps it whole.
    let raw = render("target=servers.dc1.*.cpu.user&from=-6h&format=raw");
    let json = render("target=servers.dc1.*.cpu.user&from=-6h&format=json");
    let parsed: serde_json::Value = serde_json::from_str(&json).unwrap();
    let series = parsed.as_array().unwrap();
    assert_eq!((series.len(), raw.lines().count()), (PATHS, PATHS));
    let mut points = 0;
    for (s, line) in series.iter().zip(raw.lines()) {
        let values: Vec<&str> = line.split_once('|').unwrap().1.split(',').collect();
        let datapoints = s["datapoints"].as_array().unwrap();
        assert_eq!(datapoints.len(), values.len(), "{line}");
        for (point, value) in datapoints.iter().zip(&values) {
            match *value {
                "None" => assert!(point[0].is_null(), "{point}"),
                v => assert_eq!(point[0].as_f64(), Some(v.parse::<f64>().unwrap()), "{point}"),
            }
        }
        points += values.len();
    }
    assert!(points >= 16 * 1024, "{points} points: the streamed size");
    let jsonp = render("target=servers.dc1.*.cpu.user&from=-6h&format=json&jsonp=show");
    let wrapped = jsonp.strip_prefix("show(").and_then(|j| j.strip_suffix(')'));
    assert!(wrapped == Some(json.as_str()), "JSONP is not show(<the JSON>): {}…", &jsonp[..jsonp.len().min(80)]);
    // `tz`: absolute times are read, and CSV times written, in the request's zone.
    let target = "target=servers.dc1.host-00000.cpu.user";
    let csv_minutes = |tz: &str| -> Vec<i64> {
        render(&format!("{target}&from=-1h&format=csv&tz={tz}"))
            .lines()
            .map(|l| {
                let clock = l.split(',').nth(1).unwrap().split(' ').nth(1).unwrap();
                let hm: Vec<i64> = clock.split(':').map(|x| x.parse().unwrap()).collect();
                hm[0] * 60 + hm[1]
            })
            .collect()
    };
    let (utc, india) = (csv_minutes("UTC"), csv_minutes("Asia/Kolkata"));
    assert_eq!(utc.len(), india.len());
    assert!(utc.iter().zip(&india).all(|(u, i)| (i - u).rem_euclid(1440) == 330), "{utc:?} {india:?}");
    let start_of = |tz: &str| -> i64 {
        let raw = render(&format!("{target}&from=today&until=now&format=raw&tz={tz}"));
        raw.split(',').nth(1).unwrap_or_else(|| panic!("{raw}")).parse().unwrap()
    };
    // Midnight in Kolkata is 5:30 before midnight in UTC (of the same day, or of the next).
    assert_eq!((start_of("UTC") - start_of("Asia/Kolkata")).rem_euclid(86_400), 19_800);
    let (code, body) = http(srv.port, "GET", &format!("/render?{target}&tz=Mars%2FOlympus"), &[], b"");
    assert!(code == 400 && body.contains("Mars/Olympus"), "{code} {body}");

    // carbonapi's protobuf formats carry the same series.
    let pb = |q: &str| {
        let (code, body) = support::http_bytes(srv.port, "GET", &format!("/render/?{q}"), &[], b"");
        assert_eq!(code, 200, "{q}: {}", String::from_utf8_lossy(&body));
        body
    };
    use prost::Message;
    use strata_graphite::carbonapi::{GlobResponse, MultiFetchResponseV2, MultiFetchResponseV3, MultiGlobResponseV3};
    let v2 = MultiFetchResponseV2::decode(
        &pb("target=servers.dc1.host-0000%5B0-1%5D.cpu.user&from=-1h&format=protobuf")[..],
    )
    .unwrap();
    assert_eq!(v2.metrics.len(), 2);
    for (m, line) in v2.metrics.iter().zip(&lines) {
        let (head, values) = line.split_once('|').unwrap();
        assert_eq!(head, format!("{},{},{},{}", m.name, m.start_time, m.stop_time, m.step_time));
        let want: Vec<Option<f64>> = values.split(',').map(|v| v.parse().ok()).collect();
        let got: Vec<Option<f64>> =
            m.values.iter().zip(&m.is_absent).map(|(v, absent)| (!absent).then_some(*v)).collect();
        assert_eq!(got, want);
    }
    let v3 =
        MultiFetchResponseV3::decode(&pb("target=servers.dc1.host-00000.cpu.user&from=-1h&format=carbonapi_v3_pb")[..])
            .unwrap();
    assert_eq!(v3.metrics[0].path_expression, "servers.dc1.host-00000.cpu.user");
    assert_eq!(v3.metrics[0].values.iter().filter(|v| !v.is_nan()).count(), POINTS);
    let (code, found) = support::http_bytes(
        srv.port,
        "GET",
        "/metrics/find/?query=servers.dc1.host-0000%5B12%5D&format=protobuf",
        &[],
        b"",
    );
    assert_eq!(code, 200);
    let found = GlobResponse::decode(&found[..]).unwrap();
    assert_eq!(found.name, "servers.dc1.host-0000[12]");
    let paths: Vec<&str> = found.matches.iter().map(|m| m.path.as_str()).collect();
    assert_eq!(paths, ["servers.dc1.host-00001", "servers.dc1.host-00002"]);
    let (_, found) =
        support::http_bytes(srv.port, "GET", "/metrics/find/?query=servers.dc1&format=carbonapi_v3_pb", &[], b"");
    assert_eq!(MultiGlobResponseV3::decode(&found[..]).unwrap().metrics[0].matches[0].path, "servers.dc1");
    // carbonapi v3 backends POST their requests as protobuf, each target with its own range.
    use strata_graphite::carbonapi::{FetchRequest, MultiFetchRequest, MultiGlobRequest};
    let proto = [("Content-Type", "application/x-protobuf")];
    let request = MultiFetchRequest {
        metrics: vec![
            FetchRequest {
                name: "servers.dc1.host-00000.cpu.user".into(),
                start_time: now_s - 3600,
                stop_time: now_s,
                ..Default::default()
            },
            FetchRequest {
                name: "servers.dc1.host-0000[12].cpu.user".into(),
                path_expression: "servers.dc1.host-0000[12].cpu.user".into(),
                start_time: now_s - 600,
                stop_time: now_s,
                ..Default::default()
            },
        ],
    };
    let (code, body) =
        support::http_bytes(srv.port, "POST", "/render/?format=carbonapi_v3_pb", &proto, &request.encode_to_vec());
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    let v3 = MultiFetchResponseV3::decode(&body[..]).unwrap();
    let got: Vec<(&str, i64, usize)> =
        v3.metrics.iter().map(|m| (m.name.as_str(), m.request_start_time, m.values.len())).collect();
    assert_eq!(
        got,
        [
            ("servers.dc1.host-00000.cpu.user", now_s - 3600, 60),
            ("servers.dc1.host-00001.cpu.user", now_s - 600, 10),
            ("servers.dc1.host-00002.cpu.user", now_s - 600, 10)
        ]
    );
    let globs = MultiGlobRequest { metrics: vec!["servers.*".into(), "pickled.*".into()], ..Default::default() };
    let (code, body) =
        support::http_bytes(srv.port, "POST", "/metrics/find/?format=carbonapi_v3_pb", &proto, &globs.encode_to_vec());
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
    let found = MultiGlobResponseV3::decode(&body[..]).unwrap();
    let names: Vec<(&str, &str)> =
        found.metrics.iter().map(|g| (g.name.as_str(), g.matches[0].path.as_str())).collect();
    assert_eq!(names, [("servers.*", "servers.dc1"), ("pickled.*", "pickled.path")]);
    let (code, body) = support::http_bytes(srv.port, "POST", "/render/?format=carbonapi_v3_pb", &proto, b"\xff\xff");
    assert!(code == 400 && String::from_utf8_lossy(&body).contains("MultiFetchRequest"), "{code}");
    // Over two days the 5 min archive: averages of the minutes known in each five, when at
    // least half (carbon's default xFilesFactor) are.
    let raw = render("target=servers.dc1.host-00003.cpu.user&from=-2d&format=raw");
    let (head, values) = raw.trim_end().split_once('|').unwrap();
    let head: Vec<i64> = head.split(',').skip(1).map(|x| x.parse().unwrap()).collect();
    assert_eq!(head[2], 300);
    let points: Vec<(i64, f64)> = (0..POINTS).map(|i| (now_s - 60 * (POINTS - i) as i64, (3000 + i) as f64)).collect();
    let want: Vec<String> = (0..(head[1] - head[0]) / 300)
        .map(|k| {
            let interval = head[0] + k * 300;
            let known: Vec<f64> =
                points.iter().filter(|(t, _)| t - t.rem_euclid(300) == interval).map(|x| x.1).collect();
            if known.len() * 2 >= 5 {
                let avg = known.iter().sum::<f64>() / known.len() as f64;
                if avg.fract() == 0.0 {
                    format!("{avg}.0")
                } else {
                    format!("{avg}")
                }
            } else {
                "None".into()
            }
        })
        .collect();
    assert_eq!(values.split(',').collect::<Vec<_>>(), want);
    // JSON, graphite-web's shape; a function is refused by name.
    let json: serde_json::Value = serde_json::from_str(&render("target=pickled.path&from=-10min")).unwrap();
    assert_eq!(json[0]["target"], "pickled.path;dc=eu");
    assert_eq!(json[0]["tags"], serde_json::json!({"dc": "eu", "name": "pickled.path"}));
    let known: Vec<f64> = json[0]["datapoints"].as_array().unwrap().iter().filter_map(|p| p[0].as_f64()).collect();
    assert_eq!(known, [4.0, 5.0]);

    // Tags: the pickled path's `dc` tag, and `name` for every path.
    let tags = get_json("/tags");
    assert!(tags.as_array().unwrap().contains(&serde_json::json!({"tag": "dc"})), "{tags}");
    assert!(tags.as_array().unwrap().contains(&serde_json::json!({"tag": "name"})), "{tags}");
    assert_eq!(get_json("/tags/dc"), serde_json::json!({"tag": "dc", "values": [{"count": 1, "value": "eu"}]}));
    assert_eq!(get_json("/tags/findSeries?expr=dc%3Deu"), serde_json::json!(["pickled.path;dc=eu"]));
    // Graphite's `=~` is anchored at the start only.
    let found = get_json("/tags/findSeries?expr=name%3D~servers%5C.dc1%5C.host-0000%5B12%5D");
    assert_eq!(found, serde_json::json!(["servers.dc1.host-00001.cpu.user", "servers.dc1.host-00002.cpu.user"]));
    assert_eq!(get_json("/tags/autoComplete/tags?expr=name%3Dpickled.path"), serde_json::json!(["dc"]));
    assert_eq!(get_json("/tags/autoComplete/values?tag=dc&valuePrefix=e"), serde_json::json!(["eu"]));
    let (code, body) = http(srv.port, "GET", "/tags/findSeries?expr=dc%21%3Deu", &[], b"");
    assert!(code == 400 && body.contains("at least one expression"), "{code} {body}");
    // seriesByTag in render reads the same series.
    let json: serde_json::Value =
        serde_json::from_str(&render(&format!("target={}&from=-10min", form_encode("seriesByTag('dc=eu')")))).unwrap();
    assert_eq!(json[0]["target"], "pickled.path;dc=eu");
    // No events posted: the count is all gaps (graphite_web.rs posts and counts them).
    let json: serde_json::Value =
        serde_json::from_str(&render(&format!("target={}&from=-1min", form_encode("events('deploy')")))).unwrap();
    assert_eq!(json[0]["target"], "events(\"deploy\")");
    assert!(json[0]["datapoints"].as_array().unwrap().iter().all(|p| p[0].is_null()));
    let (code, body) = http(srv.port, "GET", "/render?target=scale(pickled.path,'x')", &[], b"");
    assert!(code == 400 && body.contains("scale(): factor must be a number"), "{code} {body}");
    // The function catalog, as Grafana reads it.
    // keepLastValue's infinite default is written 1e9999, as graphite-web writes it: JavaScript
    // reads infinity, serde_json refuses it.
    let catalog = |path: &str| -> serde_json::Value {
        let (code, body) = http(srv.port, "GET", path, &[], b"");
        assert_eq!(code, 200, "{body}");
        assert!(body.contains(r#""default":1e9999"#), "{body}");
        serde_json::from_str(&body.replace("1e9999", "null")).unwrap()
    };
    assert_eq!(catalog("/functions")["sumSeries"]["group"], "Combine");
    assert_eq!(catalog("/functions?grouped=1")["Transform"]["summarize"]["name"], "summarize");
    let (code, body) = http(srv.port, "GET", "/functions/events", &[], b"");
    assert!(code == 200 && body.contains(r#""group":"Special""#), "{code} {body}");
    let (code, body) = http(srv.port, "GET", "/functions/noSuchFunction", &[], b"");
    assert!(code == 404 && body.contains("Function not found"), "{code} {body}");
    let (code, body) = http(srv.port, "GET", "/render?target=noSuchFunction(a.b)", &[], b"");
    assert!(code == 400 && body.contains("noSuchFunction() is not a Graphite function"), "{code} {body}");
    // A target that does not parse is refused with where and what.
    let (code, body) = http(srv.port, "GET", "/render?target=sumSeries(a.*", &[], b"");
    assert!(code == 400 && body.contains("at position 13"), "{code} {body}");
}

/// `[("pickled.path;dc=eu", (now-60, 4.0)), ("pickled.path;dc=eu", (now, 5.0))]`, pickled
/// by hand in protocol 2's opcodes (what Python's `pickle.dumps(..., 2)` writes).
fn python_pickle(now_s: i64) -> Vec<u8> {
    let mut out = b"\x80\x02]q\x00(".to_vec();
    for (t, v) in [(now_s - 60, 4.0f64), (now_s, 5.0)] {
        let path = b"pickled.path;dc=eu";
        out.push(b'X');
        out.extend_from_slice(&(path.len() as u32).to_le_bytes());
        out.extend_from_slice(path);
        out.push(b'J');
        out.extend_from_slice(&(t as i32).to_le_bytes());
        out.push(b'G');
        out.extend_from_slice(&v.to_be_bytes());
        out.extend_from_slice(b"\x86\x86");
    }
    out.extend_from_slice(b"e.");
    out
}

#[test]
fn carbon_c_relay_relays_plaintext_into_strata() {
    let _serial = one_at_a_time();
    let relay_bin = which("carbon-c-relay");
    let dir = tempfile::tempdir().unwrap();
    let plain = free_port();
    let srv =
        Server::start(&dir.path().join("data"), &["--carbon.plaintext-listen-address", &format!("127.0.0.1:{plain}")]);
    let conf = dir.path().join("relay.conf");
    std::fs::write(
        &conf,
        format!("cluster strata\n    forward\n        127.0.0.1:{plain}\n    ;\nmatch *\n    send to strata\n    stop\n    ;\n"),
    )
    .unwrap();
    let relay_port = free_port();
    // The relay's own words, for a failure message (once, in CI, nothing arrived in 60 s and
    // nothing said why).
    let relay_log = dir.path().join("relay.log");
    let log_file = std::fs::File::create(&relay_log).unwrap();
    let mut relay = Command::new(relay_bin)
        .args(["-f", conf.to_str().unwrap(), "-p", &relay_port.to_string(), "-s"])
        .stdout(log_file.try_clone().unwrap())
        .stderr(log_file)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut s = loop {
        match TcpStream::connect(("127.0.0.1", relay_port)) {
            Ok(s) => break s,
            Err(e) => {
                assert!(Instant::now() < deadline, "carbon-c-relay does not listen: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    };
    let now_s = support::now_ms() / 1000;
    for text in lines(1, now_s) {
        s.write_all(text.as_bytes()).unwrap();
    }
    drop(s);
    let total = (PATHS * POINTS) as f64;
    wait_for_or_say(srv.port, "strata_carbon_points_stored_total{protocol=\"plaintext_tcp\"}", total, || {
        let running = relay.try_wait().map(|status| status.map_or("running".to_string(), |s| s.to_string()));
        let _ = relay.kill();
        format!(
            "; carbon-c-relay: {running:?}, said:\n{}\nstrata said:\n{}",
            std::fs::read_to_string(&relay_log).unwrap_or_default(),
            srv.log_text()
        )
    });
    let _ = relay.kill();
    let _ = relay.wait();
    let matcher = r#"{__name__=~"servers\\.dc1\\..*"}"#;
    assert_eq!(query_value(srv.port, &format!("sum(count_over_time({matcher}[1h]))")), total);
    assert_eq!(
        query_value(srv.port, r#"max_over_time({"servers.dc1.host-00003.cpu.user"}[1h])"#),
        (3000 + POINTS - 1) as f64
    );
}

const LATE_PATHS: usize = 12;
/// Points 5 minutes apart over 8 hours: enough for the head to be cut into blocks.
const LATE_POINTS: i64 = 96;

/// A small deterministic generator (the test needs no crate for it).
struct XorShift(u64);

impl XorShift {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Each `(path, t)` pair's last written value, as every source must report it.
type LastWrites = std::collections::BTreeMap<(String, i64), f64>;

/// Sends `writes` in order over one connection (so they are stored in that order), waits until
/// the server counts them all stored, and folds them into `last`.
fn send_in_order(port: u16, carbon: u16, writes: &[(String, i64, f64)], last: &mut LastWrites, stored_before: f64) {
    let mut text = String::new();
    for (path, t, v) in writes {
        text.push_str(&format!("{path} {v} {t}\n"));
        last.insert((path.clone(), *t), *v);
    }
    let mut s = TcpStream::connect(("127.0.0.1", carbon)).unwrap();
    for piece in text.as_bytes().chunks(4096) {
        s.write_all(piece).unwrap();
    }
    drop(s);
    let want = stored_before + writes.len() as f64;
    wait_for(port, "strata_carbon_points_stored_total{protocol=\"plaintext_tcp\"}", want);
    assert_eq!(metric(port, "strata_carbon_points_stored_total{protocol=\"plaintext_tcp\"}"), want);
}

/// `got == want`, or a panic naming `what` and the first differences (not both maps whole).
fn assert_same(got: &LastWrites, want: &LastWrites, what: &str) {
    let wrong: Vec<String> = want
        .iter()
        .filter(|(k, v)| got.get(*k) != Some(*v))
        .map(|(k, v)| format!("{k:?}: want {v}, got {:?}", got.get(k)))
        .chain(got.keys().filter(|k| !want.contains_key(*k)).map(|k| format!("{k:?}: not written, got {}", got[k])))
        .collect();
    assert!(wrong.is_empty(), "{what}: {} points differ, first: {:?}", wrong.len(), &wrong[..wrong.len().min(5)]);
}

/// What a server returns for every late path over the last 9 hours, raw (a range selector).
fn served(port: u16) -> LastWrites {
    let q = form_encode(r#"{__name__=~"late\\..*"}[9h]"#);
    let (code, body) = http(port, "GET", &format!("/api/v1/query?query={q}"), &[], b"");
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let mut out = LastWrites::new();
    for series in v["data"]["result"].as_array().unwrap() {
        let path = series["metric"]["__name__"].as_str().unwrap().to_owned();
        for p in series["values"].as_array().unwrap() {
            let t = p[0].as_f64().unwrap() as i64;
            let value: f64 = p[1].as_str().unwrap().parse().unwrap();
            assert!(out.insert((path.clone(), t), value).is_none(), "{path} {t} twice");
        }
    }
    out
}

/// `strata tsdb compact`, then every late path's samples as `strata tsdb dump` prints them.
fn compacted(data: &std::path::Path) -> (LastWrites, String) {
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_strata")).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let data = data.to_str().unwrap();
    let report = run(&["tsdb", "compact", data]);
    let mut out = LastWrites::new();
    for line in run(&["tsdb", "dump", data, "--match", r#"{__name__=~"late\\..*"}"#]).lines() {
        let mut fields = line.rsplitn(3, ' ');
        let t: i64 = fields.next().unwrap().parse().unwrap();
        let v: f64 = fields.next().unwrap().parse().unwrap();
        let labels = fields.next().unwrap();
        let start = labels.find("late.").unwrap();
        let path = labels[start..].split(['"', '{']).next().unwrap().to_owned();
        assert!(out.insert((path.clone(), t / 1000), v).is_none(), "{path} {t} twice: {line}");
    }
    (out, report)
}

#[test]
fn late_and_rewritten_carbon_points_keep_their_last_value_through_sigkill_and_compaction() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // A fresh carbon port at every start: a port freed by a killed server may meanwhile have
    // gone to another test's listener.
    let start = || {
        let carbon = free_port();
        let address = format!("127.0.0.1:{carbon}");
        (Server::start(&data, &["--wal-fsync", "always", "--carbon.plaintext-listen-address", &address]), carbon)
    };
    let now_s = support::now_ms() / 1000;
    let start_s = now_s - now_s.rem_euclid(300) - 300 * LATE_POINTS;
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    // Every point once, then rewrites of a third of them with other values; all shuffled, so
    // most points are older than their path's newest when they arrive, and a rewrite may
    // arrive before the point it rewrites (then the point is the last write).
    let mut writes: Vec<(String, i64, f64)> = Vec::new();
    for p in 0..LATE_PATHS {
        for i in 0..LATE_POINTS {
            writes.push((format!("late.host-{p:02}.load"), start_s + 300 * i, (p * 1000) as f64 + i as f64));
        }
    }
    for k in 0..writes.len() / 3 {
        let (path, t, _) = writes[rng.below(writes.len())].clone();
        writes.push((path, t, 0.5 + k as f64));
    }
    for i in (1..writes.len()).rev() {
        writes.swap(i, rng.below(i + 1));
    }
    let mut last = LastWrites::new();
    let (mut srv, carbon) = start();
    send_in_order(srv.port, carbon, &writes, &mut last, 0.0);
    assert_eq!(last.len(), LATE_PATHS * LATE_POINTS as usize);
    assert!(metric(srv.port, "strata_tsdb_head_samples_appended_late_total") > (writes.len() / 3) as f64);
    // Stored means in the fsynced WAL: a SIGKILL loses nothing, and replay keeps the order.
    srv.kill();
    let (mut srv, _) = start();
    assert_same(&served(srv.port), &last, "after SIGKILL and restart");
    srv.terminate();

    // Cut into blocks (8 hours of points: everything but the newest 3 hours or so).
    let (dumped, report) = compacted(&data);
    assert!(!report.starts_with("wrote 0 blocks"), "{report}");
    assert_same(&dumped, &last, &format!("after compaction: {report}"));

    // Rewrites and late points into ranges blocks now hold: written again as blocks of their
    // own, which win where they overlap the older ones, and are merged into them.
    let (mut srv, carbon) = start();
    let mut more: Vec<(String, i64, f64)> = Vec::new();
    for k in 0..60 {
        // In the older half of the 8 hours, which blocks hold.
        let path = format!("late.host-{:02}.load", rng.below(LATE_PATHS));
        let t = start_s + 300 * rng.below(LATE_POINTS as usize / 2) as i64;
        more.push((path, t, 10_000.0 + k as f64));
    }
    more.push(("late.host-99.load".into(), start_s + 7, -1.0));
    let before = metric(srv.port, "strata_carbon_points_stored_total{protocol=\"plaintext_tcp\"}");
    send_in_order(srv.port, carbon, &more, &mut last, before);
    srv.kill();
    let (mut srv, _) = start();
    assert_same(&served(srv.port), &last, "rewrites of block data, after SIGKILL and restart");
    srv.terminate();
    let (dumped, report) = compacted(&data);
    assert_same(&dumped, &last, &format!("rewrites of block data, after compaction: {report}"));
    // The late points' blocks overlapped older ones and were merged into them.
    assert!(!report.starts_with("wrote 0 blocks") && !report.contains(" ran 0 compactions"), "{report}");
    let (dumped, report) = compacted(&data);
    assert_same(&dumped, &last, &format!("compacted twice: {report}"));
}
