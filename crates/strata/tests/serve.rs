//! `strata serve` end to end: the real binary on a free loopback port, spoken to over real
//! HTTP: remote write, the query API, restarts (SIGKILL and graceful), bad input and limits.

mod support;

use std::time::Duration;

use support::{http, now_ms, remote_write_body, sample_value, Server};

#[test]
fn written_samples_are_queryable_and_survive_sigkill_and_graceful_restarts() {
    let tmp = tempfile::tempdir().unwrap();
    let mut srv = Server::start(tmp.path(), &["--wal-fsync", "always"]);
    let t0 = now_ms() / 1000 * 1000 - 100 * 15_000;
    let series: Vec<support::TestSeries> = (0..3)
        .map(|i| {
            let labels = vec![("__name__", "e2e_metric".to_owned()), ("instance", format!("host-{i}"))];
            let samples = (0..100).map(|k| (t0 + k * 15_000, (i * 1000 + k) as f64)).collect();
            (labels, samples)
        })
        .collect();
    let (status, body) =
        http(srv.port, "POST", "/api/v1/write", &[("Content-Encoding", "snappy")], &remote_write_body(&series));
    assert_eq!(status, 204, "{body}");
    // The log goes to a file here: plain text, no terminal colour codes.
    let log = srv.log_text();
    assert!(log.contains("INFO") && !log.contains('\x1b'), "{log}");

    let check = |port: u16| {
        let q = format!(
            "/api/v1/query_range?query=e2e_metric&start={}&end={}&step=15",
            t0 / 1000,
            (t0 + 99 * 15_000) / 1000
        );
        let (status, body) = http(port, "GET", &q, &[], b"");
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["status"], "success");
        assert_eq!(v["data"]["resultType"], "matrix");
        let result = v["data"]["result"].as_array().unwrap();
        assert_eq!(result.len(), 3, "{body}");
        assert_eq!(result[1]["metric"]["instance"], "host-1");
        let values = result[1]["values"].as_array().unwrap();
        assert_eq!(values.len(), 100);
        assert_eq!(values[7][1], "1007");
        let (status, body) = http(port, "GET", "/api/v1/series?match[]=e2e_metric", &[], b"");
        assert_eq!(status, 200);
        assert_eq!(serde_json::from_str::<serde_json::Value>(&body).unwrap()["data"].as_array().unwrap().len(), 3);
        let (_, body) = http(port, "GET", "/api/v1/label/instance/values", &[], b"");
        assert_eq!(body, r#"{"status":"success","data":["host-0","host-1","host-2"]}"#);
    };
    check(srv.port);

    srv.kill();
    let mut srv = Server::start(tmp.path(), &["--wal-fsync", "always"]);
    check(srv.port);
    // The restart replayed the first run's segment: Prometheus' walreplay shape, done.
    let (status, body) = http(srv.port, "GET", "/api/v1/status/walreplay", &[], b"");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["data"], serde_json::json!({"min": 0, "max": 0, "current": 0}), "{body}");

    let (code, log) = srv.terminate();
    assert_eq!(code, Some(0), "graceful shutdown exits 0:\n{log}");
    assert!(log.contains("stopped cleanly"), "{log}");
    let srv = Server::start(tmp.path(), &[]);
    check(srv.port);
    let (status, metrics) = http(srv.port, "GET", "/metrics", &[], b"");
    assert_eq!(status, 200);
    assert!(metrics.contains("strata_tsdb_head_series 3"), "{metrics}");
}

/// A result too large to write in one piece is streamed in chunks; the client reads the same
/// JSON, every point in place, as when the result is small.
#[test]
fn a_large_query_result_is_streamed_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let srv = Server::start(tmp.path(), &[]);
    let (n_series, n_points) = (40i64, 1000i64);
    let t0 = now_ms() / 1000 * 1000 - n_points * 15_000;
    let series: Vec<support::TestSeries> = (0..n_series)
        .map(|i| {
            let labels = vec![("__name__", "big".to_owned()), ("i", format!("{i:02}"))];
            let samples = (0..n_points).map(|k| (t0 + k * 15_000, (i * 100_000 + k) as f64 + 0.25)).collect();
            (labels, samples)
        })
        .collect();
    let (status, body) =
        http(srv.port, "POST", "/api/v1/write", &[("Content-Encoding", "snappy")], &remote_write_body(&series));
    assert_eq!(status, 204, "{body}");
    let range = |matcher: &str| {
        let q = format!(
            "/api/v1/query_range?query=big{matcher}&start={}&end={}&step=15",
            t0 / 1000,
            (t0 + (n_points - 1) * 15_000) / 1000
        );
        let (status, body) = http(srv.port, "GET", &q, &[], b"");
        assert_eq!(status, 200, "{body}");
        body
    };
    // 40 000 points: streamed. One series: written whole.
    let body = range("");
    let v: serde_json::Value = serde_json::from_str(&body).expect("the streamed response is whole JSON");
    let result = v["data"]["result"].as_array().unwrap();
    assert_eq!(result.len(), n_series as usize);
    for (i, s) in result.iter().enumerate() {
        assert_eq!(s["metric"]["i"], format!("{i:02}"));
        let values = s["values"].as_array().unwrap();
        assert_eq!(values.len(), n_points as usize);
        for (k, p) in values.iter().enumerate() {
            assert_eq!(p[0].as_f64().unwrap() as i64, (t0 + k as i64 * 15_000) / 1000);
            assert_eq!(p[1], format!("{}.25", i * 100_000 + k));
        }
    }
    let one = range("%7Bi%3D%2207%22%7D");
    let start = body.find(r#"{"metric":{"__name__":"big","i":"07"}"#).unwrap();
    let series_07 =
        &body[start..start + one.len() - r#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#.len()];
    assert!(one.contains(series_07), "a series reads the same streamed and written whole");

    // Asked for gzip (as Grafana asks), both are compressed, and decompress to the same JSON.
    for (matcher, whole) in [("", &body), ("%7Bi%3D%2207%22%7D", &one)] {
        let q = format!(
            "/api/v1/query_range?query=big{matcher}&start={}&end={}&step=15",
            t0 / 1000,
            (t0 + (n_points - 1) * 15_000) / 1000
        );
        let (status, head, gz) = support::http_raw_body(srv.port, "GET", &q, &[("Accept-Encoding", "gzip, deflate")]);
        assert_eq!(status, 200);
        assert!(head.to_ascii_lowercase().contains("content-encoding: gzip"), "{head}");
        assert!(gz.len() * 4 < whole.len(), "compressed: {} of {} bytes", gz.len(), whole.len());
        let mut json = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&gz[..]), &mut json).unwrap();
        assert_eq!(&json, whole);
        let (_, head, plain) = support::http_raw_body(srv.port, "GET", &q, &[("Accept-Encoding", "gzip;q=0")]);
        let head = head.to_ascii_lowercase();
        assert!(!head.contains("content-encoding"), "{head}");
        assert_eq!(&plain, whole.as_bytes());
        // The large one is sent in pieces as it is written; the small one with its length.
        let streamed = matcher.is_empty();
        assert_eq!(head.contains("transfer-encoding: chunked"), streamed, "{head}");
        assert_eq!(head.contains("content-length"), !streamed, "{head}");
    }
}

#[test]
fn bad_input_gets_a_clear_4xx_and_the_server_stays_healthy() {
    let tmp = tempfile::tempdir().unwrap();
    let srv = Server::start(
        tmp.path(),
        &["--write.max-body-size", "4KB", "--write.max-series", "5", "--web.read-timeout", "1s"],
    );
    let now = now_ms();
    let snappy = [("Content-Encoding", "snappy")];
    let write = |body: &[u8]| http(srv.port, "POST", "/api/v1/write", &snappy, body);
    let one = |labels: Vec<(&str, String)>, t: i64| remote_write_body(&[(labels, vec![(t, 1.0)])]);
    let name = |n: &str| ("__name__", n.to_owned());

    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        ("malformed snappy", b"\x05\xff\x01garbage".to_vec(), 400, "snappy"),
        ("malformed protobuf", support::snappy(b"\x0a\x05\x0a\x03\xff"), 400, "protobuf"),
        ("invalid UTF-8 label", support::snappy(&support::raw_utf8_violation()), 400, "not valid UTF-8"),
        ("empty label name", one(vec![name("m"), ("", "x".into())], now), 400, "invalid labels"),
        ("duplicate label", one(vec![name("m"), ("a", "1".into()), ("a", "2".into())], now), 400, "invalid labels"),
        ("far future", one(vec![name("m")], now + 10 * 86_400_000), 400, "outside the accepted window"),
        ("absurd past", one(vec![name("m")], i64::MIN), 400, "outside the accepted window"),
        (
            "too many series",
            remote_write_body(&(0..6).map(|i| (vec![name(&format!("m{i}"))], vec![(now, 1.0)])).collect::<Vec<_>>()),
            400,
            "exceed the limit of 5",
        ),
        ("oversized body", vec![0u8; 8 << 10], 413, "exceeds the limit"),
    ];
    for (what, body, want, text) in cases {
        let (status, resp) = write(&body);
        assert_eq!(status, want, "{what}: {resp}");
        assert!(resp.contains(text), "{what}: {resp}");
        assert_eq!(http(srv.port, "GET", "/-/healthy", &[], b"").0, 200, "healthy after {what}");
    }

    // Good samples in a batch with bad ones are stored; the answer names the first bad one.
    let mixed = remote_write_body(&[
        (vec![name("good")], vec![(now - 1000, 1.0), (now, 2.0)]),
        (vec![name("bad"), ("", "x".into())], vec![(now, 1.0)]),
        (vec![name("late")], vec![(now, 1.0), (now - 5000, 2.0)]),
    ]);
    let (status, resp) = write(&mixed);
    assert_eq!(status, 400, "{resp}");
    assert!(resp.starts_with("2 of 5 samples rejected (3 stored)"), "{resp}");
    assert!(resp.contains("invalid labels"), "{resp}");
    let (_, body) = http(srv.port, "GET", "/api/v1/query?query=good", &[], b"");
    assert!(body.contains(r#""value":["#) && body.contains(r#""2"]"#), "{body}");

    // Query API errors in Prometheus' shape.
    for (path, want) in [
        ("/api/v1/query?query=up&time=yesterday", "cannot parse \\\"yesterday\\\""),
        ("/api/v1/query_range?query=up&start=1&end=2&step=0", "zero or negative query resolution"),
        ("/api/v1/query_range?query=up&start=2&end=1&step=1", "end timestamp must not be before start"),
        ("/api/v1/series", "no match[] parameter provided"),
        ("/api/v1/query?query=up{", "expected"),
    ] {
        let (status, body) = http(srv.port, "GET", path, &[], b"");
        assert_eq!(status, 400, "{path}: {body}");
        assert!(body.contains(r#""errorType":"bad_data""#) && body.contains(want), "{path}: {body}");
    }

    // A client that announces a body and never sends it is cut off.
    let t0 = std::time::Instant::now();
    let (status, _) = support::http_raw(
        srv.port,
        b"POST /api/v1/write HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\nContent-Encoding: snappy\r\n\r\nabc",
    );
    assert_eq!(status, 408);
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert_eq!(http(srv.port, "GET", "/-/ready", &[], b"").0, 200);
}

#[test]
fn remote_read_import_export_federate_and_delete() {
    use prost::Message;
    use strata_server::remote::{LabelMatcher, Query, ReadRequest, ReadResponse};
    let tmp = tempfile::tempdir().unwrap();
    let srv = Server::start(tmp.path(), &["--web.enable-admin-api"]);
    let now = now_ms() / 1000 * 1000;
    let text = format!(
        "# TYPE temp gauge\ntemp{{room=\"a\"}} 21.5 {}\ntemp{{room=\"a\"}} 22 {}\ntemp{{room=\"b\",note=\"q\\\"x\"}} 19 {}\n",
        now - 2000,
        now - 1000,
        now - 1000
    );
    let (status, body) = http(srv.port, "POST", "/api/v1/import/prometheus", &[], text.as_bytes());
    assert_eq!(status, 204, "{body}");
    let (status, body) = http(srv.port, "POST", "/api/v1/import/prometheus", &[], b"temp{room=\"a\" 1\n");
    assert_eq!(status, 400);
    assert!(body.contains("line 1"), "{body}");

    // Remote read returns raw samples.
    let req = ReadRequest {
        queries: vec![Query {
            start_timestamp_ms: now - 60_000,
            end_timestamp_ms: now,
            matchers: vec![LabelMatcher { r#type: 0, name: "room".into(), value: "a".into() }],
        }],
        accepted_response_types: vec![0],
    };
    let body = strata_server::remote::encode(&req);
    let (status, resp) =
        support::http_bytes(srv.port, "POST", "/api/v1/read", &[("Content-Encoding", "snappy")], &body);
    assert_eq!(status, 200);
    let raw = snap::raw::Decoder::new().decompress_vec(&resp).unwrap();
    let read = ReadResponse::decode(&raw[..]).unwrap();
    let ts = &read.results[0].timeseries;
    assert_eq!(ts.len(), 1);
    let got: Vec<(i64, f64)> = ts[0].samples.iter().map(|s| (s.timestamp, s.value)).collect();
    assert_eq!(got, [(now - 2000, 21.5), (now - 1000, 22.0)]);

    // Export: JSON lines; federate: text format with escapes.
    let (status, body) = http(srv.port, "GET", "/api/v1/export?match[]=temp", &[], b"");
    assert_eq!(status, 200);
    assert_eq!(body.lines().count(), 2, "{body}");
    // Label order: {__name__, note, room="b"} sorts before {__name__, room="a"}.
    let line: serde_json::Value = serde_json::from_str(body.lines().nth(1).unwrap()).unwrap();
    assert_eq!(line["metric"]["room"], "a");
    assert_eq!(line["values"], serde_json::json!([21.5, 22.0]));
    assert_eq!(line["timestamps"], serde_json::json!([now - 2000, now - 1000]));
    let (_, body) = http(srv.port, "GET", "/federate?match[]=temp", &[], b"");
    assert!(body.contains(&format!("temp{{room=\"a\"}} 22 {}\n", now - 1000)), "{body}");
    assert!(body.contains(&format!("temp{{note=\"q\\\"x\",room=\"b\"}} 19 {}\n", now - 1000)), "{body}");

    // Deletion hides the samples at once.
    let (status, body) =
        http(srv.port, "POST", "/api/v1/admin/tsdb/delete_series?match%5B%5D=temp%7Broom%3D%22a%22%7D", &[], b"");
    assert_eq!(status, 204, "{body}");
    let (_, body) = http(srv.port, "GET", "/api/v1/export?match[]=temp", &[], b"");
    assert_eq!(body.lines().count(), 1, "{body}");
    let (status, _) = http(srv.port, "POST", "/api/v1/admin/tsdb/clean_tombstones", &[], b"");
    assert_eq!(status, 204);
    let (status, body) = http(srv.port, "POST", "/api/v1/admin/tsdb/snapshot", &[], b"");
    assert_eq!(status, 200, "{body}");
    let name = serde_json::from_str::<serde_json::Value>(&body).unwrap()["data"]["name"].as_str().unwrap().to_owned();
    assert!(tmp.path().join("snapshots").join(&name).is_dir(), "{body}");

    // Status endpoints answer in Prometheus' shapes.
    let (_, body) = http(srv.port, "GET", "/api/v1/status/tsdb", &[], b"");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["data"]["headStats"]["numSeries"], 2, "{body}");
    assert_eq!(v["data"]["seriesCountByMetricName"][0]["name"], "temp");
    let (_, body) = http(srv.port, "GET", "/api/v1/status/buildinfo", &[], b"");
    assert!(body.contains("\"version\""), "{body}");
    let (_, body) = http(srv.port, "GET", "/api/v1/status/flags", &[], b"");
    assert!(body.contains("\"retention\""), "{body}");
    // Form POST works like GET.
    let (status, body) = http(
        srv.port,
        "POST",
        "/api/v1/series",
        &[("Content-Type", "application/x-www-form-urlencoded")],
        b"match%5B%5D=temp",
    );
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"room\":\"b\""), "{body}");
}

#[test]
fn query_limits_are_enforced_with_prometheus_errors() {
    let tmp = tempfile::tempdir().unwrap();
    // Limits from the config file; a flag overrides the file.
    let cfg = tmp.path().with_extension("yml");
    std::fs::write(&cfg, "limits:\n  query_max_series: 2\n  query_max_samples: 1000\n").unwrap();
    let srv = Server::start(
        tmp.path(),
        &["--config", cfg.to_str().unwrap(), "--query.max-samples", "50", "--query.parallelism", "1"],
    );
    let (status, replay) = http(srv.port, "GET", "/api/v1/status/walreplay", &[], b"");
    assert_eq!(status, 200, "{replay}");
    let replay: serde_json::Value = serde_json::from_str(&replay).unwrap();
    assert_eq!(replay["data"]["current"], replay["data"]["max"], "{replay}");
    let (_, flags) = http(srv.port, "GET", "/api/v1/status/flags", &[], b"");
    assert!(flags.contains(r#""query.max-series":"2""#) && flags.contains(r#""query.max-samples":"50""#), "{flags}");
    assert!(flags.contains(r#""query.parallelism":"1""#), "{flags}");
    let (_, config) = http(srv.port, "GET", "/api/v1/status/config", &[], b"");
    assert!(config.contains("query_max_series: 2"), "{config}");
    let t0 = now_ms() / 1000 * 1000 - 60_000;
    let series: Vec<support::TestSeries> = (0..3)
        .map(|i| {
            (
                vec![("__name__", "lim".to_owned()), ("i", i.to_string())],
                (0..40).map(|k| (t0 + k * 1000, 1.0)).collect(),
            )
        })
        .collect();
    let (status, body) =
        http(srv.port, "POST", "/api/v1/write", &[("Content-Encoding", "snappy")], &remote_write_body(&series));
    assert_eq!(status, 204, "{body}");
    let (status, body) = http(srv.port, "GET", "/api/v1/query?query=lim", &[], b"");
    assert_eq!(status, 422, "{body}");
    assert!(body.contains(r#""errorType":"execution""#) && body.contains("more than 2 series"), "{body}");
    let q = format!("/api/v1/query_range?query=lim%7Bi%3D%220%22%7D&start={}&end={}&step=1", t0 / 1000, t0 / 1000 + 59);
    let (status, body) = http(srv.port, "GET", &q, &[], b"");
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("too many samples"), "{body}");
    let (status, body) = http(srv.port, "GET", "/api/v1/query?query=lim%7Bi%3D%220%22%7D", &[], b"");
    assert_eq!(status, 200, "a query within the limits still answers: {body}");
    // Graphite functions: a fetch past the limit answers as the limit, not as a bad target;
    // one path expression used three times counts three times.
    let render = |target: &str| http(srv.port, "GET", &format!("/render?from=-10min&target={target}"), &[], b"");
    let (status, body) = render("sumSeries(lim)");
    assert_eq!(status, 422, "{body}");
    assert!(body.contains(r#""errorType":"execution""#) && body.contains("more than 2 series"), "{body}");
    let one = "seriesByTag(%27i%3D0%27)";
    let (status, body) = render(&format!("sumSeries({one})"));
    assert_eq!(status, 200, "{body}");
    let (status, body) = render(&format!("sumSeries({one},{one},{one})"));
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("more than 2 series in all"), "{body}");
}

#[test]
fn remote_write_2_0_is_negotiated_by_content_type() {
    use prost::Message;
    let tmp = tempfile::tempdir().unwrap();
    let srv = Server::start(tmp.path(), &[]);
    let t = now_ms() / 1000 * 1000;
    let req = strata_server::remote::v2::request(&[
        (vec![("__name__", "v2_metric"), ("job", "a")], vec![(t - 1000, 1.0), (t, 2.0)]),
        (vec![("__name__", "v2_metric"), ("job", "b")], vec![(t, 3.0)]),
    ]);
    let body = support::snappy(&req.encode_to_vec());
    let v2 = [
        ("Content-Encoding", "snappy"),
        ("Content-Type", "application/x-protobuf;proto=io.prometheus.write.v2.Request"),
        ("X-Prometheus-Remote-Write-Version", "2.0.0"),
    ];
    let (status, head, resp) = support::http_with_head(srv.port, "POST", "/api/v1/write", &v2, &body);
    assert_eq!(status, 204, "{resp}");
    assert!(head.to_ascii_lowercase().contains("x-prometheus-remote-write-samples-written: 3"), "{head}");
    let (_, body_json) = http(srv.port, "GET", "/api/v1/query?query=v2_metric", &[], b"");
    assert!(
        body_json.contains(r#""job":"a""#) && body_json.contains(r#""2"]"#) && body_json.contains(r#""3"]"#),
        "{body_json}"
    );

    // An unknown message type is 415, so a sender can fall back to 1.0.
    let other = [
        ("Content-Encoding", "snappy"),
        ("Content-Type", "application/x-protobuf;proto=io.prometheus.write.v3.Request"),
    ];
    let (status, resp) = http(srv.port, "POST", "/api/v1/write", &other, &body);
    assert_eq!(status, 415, "{resp}");
    // A 2.0 body sent as 1.0 is refused by name rather than read as an empty 1.0 request.
    let (status, resp) = http(srv.port, "POST", "/api/v1/write", &[("Content-Encoding", "snappy")], &body);
    assert_eq!(status, 400);
    assert!(resp.contains("remote write 2.0 request"), "{resp}");
}

/// Start times sent by remote write 2.0 are stored (through a SIGKILL and WAL replay), and
/// with `--enable-feature=use-start-timestamps` PromQL reads them: a counter restart that its
/// values hide is a reset, and `start_timestamp()` returns them. Without the feature they are
/// kept but not read, as in Prometheus.
#[test]
fn start_times_from_remote_write_2_0_reach_promql() {
    use prost::Message;
    let tmp = tempfile::tempdir().unwrap();
    let features = "--enable-feature=use-start-timestamps,promql-experimental-functions";
    let mut srv = Server::start(tmp.path(), &["--wal-fsync", "always", features]);
    let t0 = now_ms() / 1000 * 1000 - 60_000;
    // Values 10, 20, 30, 40 every 10 s: no reset by value. The third sample's start time is
    // after the second sample: the counter restarted in between (and counted 30 since).
    let mut req = strata_server::remote::v2::request(&[(
        vec![("__name__", "restarts_total")],
        (0..4).map(|k| (t0 + k * 10_000, 10.0 * (k + 1) as f64)).collect(),
    )]);
    for (k, s) in req.timeseries[0].samples.iter_mut().enumerate() {
        s.start_timestamp = if k < 2 { t0 - 5000 } else { t0 + 15_000 };
    }
    let v2 = [
        ("Content-Encoding", "snappy"),
        ("Content-Type", "application/x-protobuf;proto=io.prometheus.write.v2.Request"),
    ];
    let (status, resp) = http(srv.port, "POST", "/api/v1/write", &v2, &support::snappy(&req.encode_to_vec()));
    assert_eq!(status, 204, "{resp}");
    let at = (t0 + 30_000) as f64 / 1000.0;
    let value = |port: u16, query: &str| -> Option<f64> {
        let (status, body) =
            http(port, "GET", &format!("/api/v1/query?query={}&time={at}", urlencode(query)), &[], b"");
        assert_eq!(status, 200, "{query}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["data"]["result"].as_array().unwrap().first().map(|r| r["value"][1].as_str().unwrap().parse().unwrap())
    };
    let near = |got: Option<f64>, want: f64| got.is_some_and(|g| (g - want).abs() < 1e-9);
    let check = |port: u16| {
        assert_eq!(value(port, "resets(restarts_total[1m])"), Some(1.0));
        // 20 - 10 before the restart and 30 + 10 after it: 50 over the 30 s sampled, scaled
        // by 31/30 to the window.
        assert!(near(value(port, "increase(restarts_total[31s])"), 50.0 * 31.0 / 30.0));
        assert_eq!(value(port, "start_timestamp(restarts_total)"), Some((t0 + 15_000) as f64 / 1000.0));
    };
    check(srv.port);
    srv.kill();
    let srv = Server::start(tmp.path(), &["--wal-fsync", "always", features]);
    check(srv.port);
    drop(srv);
    // Without the feature: stored, not read.
    let srv = Server::start(tmp.path(), &["--enable-feature=promql-experimental-functions"]);
    assert_eq!(value(srv.port, "resets(restarts_total[1m])"), Some(0.0));
    assert!(near(value(srv.port, "increase(restarts_total[31s])"), 31.0));
    assert_eq!(value(srv.port, "start_timestamp(restarts_total)"), None);
}

/// PromQL through the HTTP API: functions, aggregation, binary operators, scalars and strings,
/// annotations, errors in Prometheus' shape, and experimental syntax only when enabled.
#[test]
fn promql_queries_over_http() {
    let tmp = tempfile::tempdir().unwrap();
    let srv = Server::start(tmp.path(), &["--enable-feature", "promql-experimental-functions"]);
    let t0 = now_ms() / 1000 * 1000 - 60 * 15_000;
    let series: Vec<support::TestSeries> = (0..4)
        .map(|i| {
            let labels = vec![
                ("__name__", "req_total".to_owned()),
                ("instance", format!("host-{i}")),
                ("job", if i < 2 { "api" } else { "web" }.to_owned()),
            ];
            // Counter growing by i+1 per 15 s scrape.
            let samples = (0..=60).map(|k| (t0 + k * 15_000, (k * (i + 1)) as f64)).collect();
            (labels, samples)
        })
        .collect();
    let (status, body) =
        http(srv.port, "POST", "/api/v1/write", &[("Content-Encoding", "snappy")], &remote_write_body(&series));
    assert_eq!(status, 204, "{body}");
    let t_end = (t0 + 60 * 15_000) / 1000;
    let get = |q: &str, extra: &str| -> serde_json::Value {
        let path = format!("/api/v1/query?query={}&time={t_end}{extra}", urlencode(q));
        let (status, body) = http(srv.port, "GET", &path, &[], b"");
        assert_eq!(status, 200, "{q}: {body}");
        serde_json::from_str(&body).unwrap()
    };

    // rate per series and summed by job: job api has counters growing 1 and 2 per 15 s.
    let v = get("sum by (job) (rate(req_total[5m]))", "");
    assert_eq!(v["data"]["resultType"], "vector");
    let result = v["data"]["result"].as_array().unwrap();
    let api = result.iter().find(|r| r["metric"]["job"] == "api").unwrap();
    let rate: f64 = api["value"][1].as_str().unwrap().parse().unwrap();
    assert!((rate - 3.0 / 15.0).abs() < 1e-9, "{v}");
    assert_eq!(api["metric"].as_object().unwrap().len(), 1, "only the grouping label: {v}");

    // Ratio of two aggregations, topk ordering, scalar and string results.
    let v = get("sum(rate(req_total{job=\"web\"}[5m])) / sum(rate(req_total[5m]))", "");
    let ratio: f64 = v["data"]["result"][0]["value"][1].as_str().unwrap().parse().unwrap();
    assert!((ratio - 7.0 / 10.0).abs() < 1e-9, "{v}");
    let v = get("topk(2, req_total)", "");
    let names: Vec<&str> =
        v["data"]["result"].as_array().unwrap().iter().map(|r| r["metric"]["instance"].as_str().unwrap()).collect();
    assert_eq!(names, ["host-3", "host-2"]);
    let v = get("scalar(count(req_total)) * 2", "");
    assert_eq!(v["data"]["resultType"], "scalar");
    assert_eq!(v["data"]["result"][1], "8");
    let v = get("\"hello\"", "");
    assert_eq!(v["data"]["result"][1], "hello");

    // A range query of an expression: one matrix series per job, 11 points.
    let q = format!(
        "/api/v1/query_range?query={}&start={}&end={t_end}&step=30",
        urlencode("sum by (job) (increase(req_total[1m]))"),
        t_end - 300
    );
    let (status, body) = http(srv.port, "GET", &q, &[], b"");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let result = v["data"]["result"].as_array().unwrap();
    assert_eq!(result.len(), 2, "{body}");
    assert_eq!(result[0]["values"].as_array().unwrap().len(), 11, "{body}");

    // Annotations come back as Prometheus renders them.
    let (_, body) =
        http(srv.port, "GET", &format!("/api/v1/query?query={}", urlencode("rate(up_gauge[5m])")), &[], b"");
    assert!(!body.contains("infos"), "no series, no annotation: {body}");
    let v = get("quantile(2, req_total)", "");
    assert_eq!(v["warnings"][0], "PromQL warning: quantile value should be between 0 and 1, got 2 (1:10)", "{v}");
    // Experimental functions are enabled on this server.
    let v = get("sort_by_label(req_total, \"instance\")", "");
    assert_eq!(v["data"]["result"].as_array().unwrap().len(), 4);

    // Prometheus' per-request parameters: a lookback of its own, statistics, a timeout.
    let later = |extra: &str| -> serde_json::Value {
        let path = format!("/api/v1/query?query=req_total&time={}{extra}", t_end + 240);
        let (status, body) = http(srv.port, "GET", &path, &[], b"");
        assert_eq!(status, 200, "{extra}: {body}");
        serde_json::from_str(&body).unwrap()
    };
    assert_eq!(later("").pointer("/data/result").unwrap().as_array().unwrap().len(), 4, "4 min after: inside 5m");
    assert!(later("&lookback_delta=1m")["data"]["result"].as_array().unwrap().is_empty(), "outside 1m");
    let v = later("&stats=all&timeout=30s");
    assert!(v["data"]["stats"]["samples"]["totalQueryableSamples"].as_u64().unwrap() >= 4, "{v}");
    assert!(v["data"]["stats"]["timings"]["evalTotalTime"].as_f64().unwrap() >= 0.0, "{v}");
    assert!(later("").pointer("/data/stats").is_none(), "stats only when asked");
    for bad in ["&lookback_delta=0s", "&timeout=-1s", "&timeout=soon"] {
        let path = format!("/api/v1/query?query=req_total&time={t_end}{bad}");
        let (status, body) = http(srv.port, "GET", &path, &[], b"");
        assert_eq!(status, 400, "{bad}: {body}");
        let name = bad[1..].split('=').next().unwrap();
        assert!(body.contains(&format!("invalid parameter \\\"{name}\\\"")), "{bad}: {body}");
    }
    let (_, flags) = http(srv.port, "GET", "/api/v1/status/flags", &[], b"");
    assert!(flags.contains("\"query.lookback-delta\":\"5m\""), "{flags}");

    // The query's syntax alone: Prometheus' tree, and the error with its position.
    let (status, body) =
        http(srv.port, "GET", &format!("/api/v1/parse_query?query={}", urlencode("-sum(x)")), &[], b"");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!((v["data"]["type"].as_str(), v["data"]["expr"]["op"].as_str()), (Some("unaryExpr"), Some("sum")));
    let (status, body) = http(srv.port, "GET", &format!("/api/v1/parse_query?query={}", urlencode("sum(x")), &[], b"");
    assert_eq!(status, 400);
    assert!(body.contains("1:6: parse error"), "{body}");

    // Errors: syntax → bad_data with position; evaluation → execution.
    for (q, status, kind, want) in [
        ("rate(req_total)", 400, "bad_data", "expected type range vector in call to function \\\"rate\\\""),
        ("sum(", 400, "bad_data", "1:5: parse error"),
        ("req_total + on(job) req_total", 422, "execution", "many-to-many matching not allowed"),
        ("{__name__=~\"req.*\"} offset 1m anchored", 400, "bad_data", "not enabled"),
    ] {
        let path = format!("/api/v1/query?query={}&time={t_end}", urlencode(q));
        let (got, body) = http(srv.port, "GET", &path, &[], b"");
        assert_eq!(got, status, "{q}: {body}");
        assert!(body.contains(&format!("\"errorType\":\"{kind}\"")) && body.contains(want), "{q}: {body}");
    }
}

fn urlencode(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// Native histograms end to end over real HTTP: an integer histogram by remote write 1.0 and
/// a float (custom-bucket) one by 2.0; queried as histograms and through PromQL functions,
/// returned by remote read, refused with a reason when invalid, and still there after a
/// SIGKILL (WAL replay).
#[test]
fn native_histograms_over_remote_write_query_and_remote_read() {
    use prost::Message;
    use strata_server::remote::{
        v2, BucketSpan, Histogram, Label, LabelMatcher, Query, ReadRequest, ReadResponse, TimeSeries, WriteRequest,
    };
    let tmp = tempfile::tempdir().unwrap();
    let mut srv = Server::start(tmp.path(), &[]);
    let t0 = now_ms() / 1000 * 1000 - 60_000;
    // 1.0: an integer counter histogram every 15 s; buckets (0.5,1], (1,2], (2,4] as deltas.
    let int_hist = |i: i64| Histogram {
        count_int: Some(4 * i as u64),
        sum: 6.0 * i as f64,
        schema: 0,
        zero_threshold: 0.001,
        zero_count_int: Some(0),
        positive_spans: vec![BucketSpan { offset: 0, length: 3 }],
        positive_deltas: vec![i, i, -i], // counts i, 2i, i
        timestamp: t0 + i * 15_000,
        ..Histogram::default()
    };
    let req = WriteRequest {
        timeseries: vec![TimeSeries {
            labels: vec![Label::new("__name__", "rpc_seconds"), Label::new("job", "api")],
            samples: vec![],
            histograms: (1..=4).map(int_hist).collect(),
            exemplars: vec![],
        }],
        metadata: vec![],
    };
    let snappy = [("Content-Encoding", "snappy")];
    let (status, head, body) =
        support::http_with_head(srv.port, "POST", "/api/v1/write", &snappy, &strata_server::remote::encode(&req));
    assert_eq!(status, 204, "{body}");
    // Remote write 2.0's headers count floats and histograms apart.
    let head = head.to_ascii_lowercase();
    assert!(head.contains("x-prometheus-remote-write-samples-written: 0"), "{head}");
    assert!(head.contains("x-prometheus-remote-write-histograms-written: 4"), "{head}");

    // 2.0: a gauge histogram with custom buckets.
    let mut req2 = v2::request(&[(vec![("__name__", "queue_depth"), ("job", "api")], vec![])]);
    req2.timeseries[0].histograms = vec![Histogram {
        count_float: Some(10.0),
        sum: 42.0,
        schema: -53,
        positive_spans: vec![BucketSpan { offset: 0, length: 3 }],
        positive_counts: vec![2.0, 3.0, 5.0],
        custom_values: vec![1.0, 5.0],
        reset_hint: 3,
        timestamp: t0 + 60_000,
        ..Histogram::default()
    }];
    let v2_headers = [
        ("Content-Encoding", "snappy"),
        ("Content-Type", "application/x-protobuf;proto=io.prometheus.write.v2.Request"),
    ];
    let (status, head, body) = support::http_with_head(
        srv.port,
        "POST",
        "/api/v1/write",
        &v2_headers,
        &support::snappy(&req2.encode_to_vec()),
    );
    assert_eq!(status, 204, "{body}");
    assert!(head.to_ascii_lowercase().contains("x-prometheus-remote-write-histograms-written: 1"), "{head}");

    // Streamed remote read cannot carry histograms yet: refused with the reason.
    let streamed = ReadRequest {
        queries: vec![Query {
            start_timestamp_ms: t0,
            end_timestamp_ms: t0 + 60_000,
            matchers: vec![LabelMatcher { r#type: 0, name: "__name__".into(), value: "queue_depth".into() }],
        }],
        accepted_response_types: vec![1],
    };
    let (status, resp) = support::http_bytes(
        srv.port,
        "POST",
        "/api/v1/read",
        &[("Content-Encoding", "snappy")],
        &strata_server::remote::encode(&streamed),
    );
    assert_eq!(status, 400);
    assert!(String::from_utf8_lossy(&resp).contains("ask for SAMPLES"), "{}", String::from_utf8_lossy(&resp));

    // An invalid histogram (a negative bucket count) is refused with the reason.
    let mut bad = int_hist(5);
    bad.positive_deltas = vec![1, -3, 0];
    let req = WriteRequest {
        timeseries: vec![TimeSeries {
            labels: vec![Label::new("__name__", "rpc_seconds"), Label::new("job", "api")],
            samples: vec![],
            histograms: vec![bad],
            exemplars: vec![],
        }],
        metadata: vec![],
    };
    let (status, body) = http(srv.port, "POST", "/api/v1/write", &snappy, &strata_server::remote::encode(&req));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("invalid histogram") && body.contains("observation count of -2"), "{body}");

    let at = (t0 + 60_000) as f64 / 1000.0;
    let port = srv.port;
    let query = |q: &str| {
        let (status, body) = http(port, "GET", &format!("/api/v1/query?query={}&time={at}", urlencode(q)), &[], b"");
        assert_eq!(status, 200, "{q}: {body}");
        serde_json::from_str::<serde_json::Value>(&body).unwrap()
    };
    let check = |stage: &str| {
        let v = query("rpc_seconds");
        let h = &v["data"]["result"][0]["histogram"][1];
        assert_eq!(h["count"], "16", "{stage}: {v}");
        assert_eq!(h["sum"], "24", "{stage}: {v}");
        assert_eq!(
            h["buckets"],
            serde_json::json!([[0, "0.5", "1", "4"], [0, "1", "2", "8"], [0, "2", "4", "4"]]),
            "{stage}"
        );
        // The median is in (1, 2]: exponential interpolation puts it at 2^(1/2 · …).
        let v = query("histogram_quantile(0.5, rpc_seconds)");
        let q: f64 = v["data"]["result"][0]["value"][1].as_str().unwrap().parse().unwrap();
        assert!((q - 2f64.powf(0.5)).abs() < 1e-9, "{stage}: {v}");
        let v = query("histogram_count(rate(rpc_seconds[1m]))");
        let r: f64 = v["data"]["result"][0]["value"][1].as_str().unwrap().parse().unwrap();
        assert!(r > 0.2 && r < 0.3, "{stage}: 4 observations per 15 s is about 0.27/s, got {v}");
        let v = query("histogram_fraction(0, 5, queue_depth)");
        assert_eq!(v["data"]["result"][0]["value"][1], "0.5", "{stage}: {v}");
        let v = query("sum(queue_depth)");
        assert_eq!(v["data"]["result"][0]["histogram"][1]["count"], "10", "{stage}: {v}");
    };
    check("live");

    // Remote read returns the histograms as float histograms.
    let req = ReadRequest {
        queries: vec![Query {
            start_timestamp_ms: t0,
            end_timestamp_ms: t0 + 60_000,
            matchers: vec![LabelMatcher { r#type: 0, name: "job".into(), value: "api".into() }],
        }],
        accepted_response_types: vec![0],
    };
    let (status, resp) =
        support::http_bytes(port, "POST", "/api/v1/read", &snappy, &strata_server::remote::encode(&req));
    assert_eq!(status, 200);
    let read = ReadResponse::decode(&snap::raw::Decoder::new().decompress_vec(&resp).unwrap()[..]).unwrap();
    let ts = &read.results[0].timeseries;
    assert_eq!(ts.len(), 2);
    let rpc = ts.iter().find(|s| s.labels.iter().any(|l| l.value == "rpc_seconds")).unwrap();
    assert_eq!(rpc.histograms.len(), 4);
    assert_eq!(rpc.histograms[3].count_float, Some(16.0));
    assert_eq!(rpc.histograms[3].positive_counts, vec![4.0, 8.0, 4.0]);
    let depth = ts.iter().find(|s| s.labels.iter().any(|l| l.value == "queue_depth")).unwrap();
    assert_eq!((depth.histograms[0].reset_hint, depth.histograms[0].custom_values.clone()), (3, vec![1.0, 5.0]));

    // After a SIGKILL, the WAL gives everything back.
    srv.kill();
    let _srv = Server::start_on(port, tmp.path(), &[]);
    check("after SIGKILL");
}

#[test]
fn remote_write_takes_late_samples_inside_the_out_of_order_window_and_refuses_rewrites() {
    let tmp = tempfile::tempdir().unwrap();
    let srv = Server::start(tmp.path(), &["--storage.out-of-order-time-window", "1h"]);
    let now = now_ms();
    let write = |t: i64, v: f64| {
        let body = remote_write_body(&[(vec![("__name__", "late_metric".to_owned())], vec![(t, v)])]);
        http(srv.port, "POST", "/api/v1/write", &[("Content-Encoding", "snappy")], &body)
    };
    assert_eq!(write(now, 1.0).0, 204);
    assert_eq!(write(now - 600_000, 2.0).0, 204, "ten minutes late, inside the window");
    assert_eq!(write(now - 600_000, 2.0).0, 204, "the same sample again is a retry");
    let (status, body) = write(now - 600_000, 3.0);
    assert!(status == 400 && body.contains("duplicate"), "{status} {body}");
    let (status, body) = write(now - 2 * 3_600_000, 4.0);
    assert!(status == 400 && body.contains("too old"), "{status} {body}");
    let (_, body) = http(srv.port, "GET", "/api/v1/query?query=late_metric%5B1h%5D", &[], b"");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let values: Vec<&str> =
        v["data"]["result"][0]["values"].as_array().unwrap().iter().map(|p| p[1].as_str().unwrap()).collect();
    assert_eq!(values, ["2", "1"], "{body}");
    let (_, metrics) = http(srv.port, "GET", "/metrics", &[], b"");
    assert!(metrics.contains("strata_tsdb_head_samples_appended_late_total 1"), "{metrics}");
}

/// The range result cache over HTTP: a refresh moved by a step is a partial hit, answers equal
/// the uncached ones (`nocache=1`) byte for byte, also after a late write and a deletion behind
/// the kept steps, and `/metrics` counts what the cache did.
#[test]
fn range_results_are_cached_and_stay_exact() {
    let tmp = tempfile::tempdir().unwrap();
    let srv = Server::start(tmp.path(), &["--web.enable-admin-api", "--query.cache-delay", "2m"]);
    let now = now_ms();
    let t0 = now / 15_000 * 15_000 - 3_600_000;
    let series = |name: &str, i: usize, from: i64, to: i64| -> support::TestSeries<'static> {
        let labels = vec![("__name__", name.to_owned()), ("i", i.to_string())];
        let samples =
            (0..).map(|k| from + k * 15_000).take_while(|&t| t <= to).map(|t| (t, (t / 15_000) as f64)).collect();
        (labels, samples)
    };
    let write = |s: Vec<support::TestSeries<'_>>| {
        let (status, body) =
            http(srv.port, "POST", "/api/v1/write", &[("Content-Encoding", "snappy")], &remote_write_body(&s));
        assert_eq!(status, 204, "{body}");
    };
    write((0..3).map(|i| series("cnt_total", i, t0, now)).collect());
    let range = |start: i64, end: i64, extra: &str| -> String {
        let q = urlencode("sum by (i) (rate(cnt_total[2m]))");
        let path = format!("/api/v1/query_range?query={q}&start={}&end={}&step=15{extra}", start / 1000, end / 1000);
        let (status, body) = http(srv.port, "GET", &path, &[], b"");
        assert_eq!(status, 200, "{body}");
        body
    };
    let end = now / 15_000 * 15_000 - 60_000;
    let check = |start: i64, end: i64| {
        let cached = range(start, end, "");
        assert_eq!(cached, range(start, end, "&nocache=1"), "[{start}, {end}]");
    };
    check(end - 1_800_000, end);
    check(end - 1_800_000 + 15_000, end + 15_000);
    // Wholly behind the delay: answered from the kept steps alone, reading no sample.
    check(end - 1_800_000 + 15_000, end - 300_000);
    let stats: serde_json::Value =
        serde_json::from_str(&range(end - 1_800_000 + 15_000, end - 300_000, "&stats=all")).unwrap();
    assert_eq!(stats["data"]["stats"]["samples"]["totalQueryableSamples"], 0, "{stats}");
    // A sender running late: a new series reaching 20 minutes back, inside the kept steps.
    write(vec![series("cnt_total", 7, now - 1_200_000, now - 600_000)]);
    check(end - 1_800_000 + 30_000, end + 30_000);
    // A deletion behind the kept steps.
    let (status, body) = http(
        srv.port,
        "POST",
        &format!(
            "/api/v1/admin/tsdb/delete_series?match[]={}&start={}&end={}",
            urlencode("cnt_total{i=\"1\"}"),
            (now - 900_000) / 1000,
            (now - 800_000) / 1000
        ),
        &[],
        b"",
    );
    assert_eq!(status, 204, "{body}");
    check(end - 1_800_000 + 30_000, end + 30_000);
    let (_, metrics) = http(srv.port, "GET", "/metrics", &[], b"");
    let count = |result: &str| -> f64 {
        let series = format!("strata_query_cache_requests_total{{result=\"{result}\"}}");
        sample_value(&metrics, &series).unwrap_or_else(|| panic!("{series}: {metrics}"))
    };
    assert!(count("hit") >= 1.0 && count("partial") >= 1.0, "{metrics}");
    assert_eq!(count("bypass"), 5.0, "the nocache=1 requests");
    assert!(metrics.contains("strata_query_cache_invalidations_total 2"), "{metrics}");
}

/// A Prometheus XOR chunk decoded from its bytes alone (big-endian sample count, then the bit
/// stream), written from Prometheus' `tsdb/chunkenc/xor.go` layout rather than with Strata's
/// decoder, so that the streamed read is checked against the format, not against itself.
fn decode_prometheus_xor(data: &[u8]) -> Vec<(i64, f64)> {
    struct Bits<'a> {
        b: &'a [u8],
        pos: usize,
    }
    impl Bits<'_> {
        fn bit(&mut self) -> u64 {
            let v = (self.b[self.pos / 8] >> (7 - self.pos % 8)) & 1;
            self.pos += 1;
            v as u64
        }
        fn bits(&mut self, n: u32) -> u64 {
            (0..n).fold(0u64, |acc, _| (acc << 1) | self.bit())
        }
        fn uvarint(&mut self) -> u64 {
            let (mut v, mut shift) = (0u64, 0);
            loop {
                let byte = self.bits(8);
                v |= (byte & 0x7f) << shift;
                if byte < 0x80 {
                    return v;
                }
                shift += 7;
            }
        }
    }
    let n = u16::from_be_bytes([data[0], data[1]]) as usize;
    let mut r = Bits { b: &data[2..], pos: 0 };
    let mut out = Vec::with_capacity(n);
    let (mut t, mut delta, mut v_bits, mut leading, mut trailing) = (0i64, 0i64, 0u64, 0u32, 0u32);
    for i in 0..n {
        if i == 0 {
            let z = r.uvarint();
            t = ((z >> 1) as i64) ^ -((z & 1) as i64);
            v_bits = r.bits(64);
        } else {
            if i == 1 {
                delta = r.uvarint() as i64;
            } else {
                let dod = if r.bit() == 0 {
                    0
                } else if r.bit() == 0 {
                    sign_extend(r.bits(14), 14)
                } else if r.bit() == 0 {
                    sign_extend(r.bits(17), 17)
                } else if r.bit() == 0 {
                    sign_extend(r.bits(20), 20)
                } else {
                    r.bits(64) as i64
                };
                delta = delta.wrapping_add(dod);
            }
            t = t.wrapping_add(delta);
            if r.bit() == 1 {
                if r.bit() == 1 {
                    leading = r.bits(5) as u32;
                    let mut sig = r.bits(6) as u32;
                    if sig == 0 {
                        sig = 64;
                    }
                    trailing = 64 - leading - sig;
                }
                let sig = 64 - leading - trailing;
                v_bits ^= r.bits(sig) << trailing;
            }
        }
        out.push((t, f64::from_bits(v_bits)));
    }
    out
}

fn sign_extend(v: u64, bits: u32) -> i64 {
    ((v << (64 - bits)) as i64) >> (64 - bits)
}

/// Streamed remote read (`STREAMED_XOR_CHUNKS`, what Thanos' sidecar asks for): frames with a
/// CRC-32C, XOR chunks of at most 120 samples, the query index; the response type chosen in
/// the client's order; types Strata does not serve and histograms refused with the reason.
#[test]
fn streamed_remote_read_sends_xor_chunks_in_checked_frames() {
    use prost::Message;
    use strata_server::remote::{ChunkedReadResponse, LabelMatcher, Query, ReadRequest};
    let tmp = tempfile::tempdir().unwrap();
    let srv = Server::start(tmp.path(), &[]);
    let t0 = now_ms() / 1000 * 1000 - 3_600_000;
    // 300 samples 10 s apart, with jitter and values that change in few bits or a lot.
    let many: Vec<(i64, f64)> = (0..300)
        .map(|k| (t0 + k * 10_000 + (k * 37 % 11), if k % 7 == 0 { f64::NAN } else { (k as f64).sqrt() }))
        .collect();
    let body = support::remote_write_body(&[
        (vec![("__name__", "streamed".into()), ("n", "many".into())], many.clone()),
        (vec![("__name__", "streamed".into()), ("n", "one".into())], vec![(t0, 5e-324)]),
    ]);
    let (status, resp) = http(srv.port, "POST", "/api/v1/write", &[("Content-Encoding", "snappy")], &body);
    assert_eq!(status, 204, "{resp}");
    let query = |types: Vec<i32>, name: &str| ReadRequest {
        queries: vec![
            Query {
                start_timestamp_ms: t0 - 1000,
                end_timestamp_ms: t0 + 3_600_000,
                matchers: vec![LabelMatcher { r#type: 0, name: "__name__".into(), value: name.into() }],
            },
            Query {
                start_timestamp_ms: t0 - 1000,
                end_timestamp_ms: t0 + 3_600_000,
                matchers: vec![LabelMatcher { r#type: 0, name: "n".into(), value: "one".into() }],
            },
        ],
        accepted_response_types: types,
    };
    let read = |req: &ReadRequest| {
        let raw = strata_server::remote::encode(req);
        support::http_bytes_with_head(srv.port, "POST", "/api/v1/read", &[("Content-Encoding", "snappy")], &raw)
    };
    let (status, head, body) = read(&query(vec![1, 0], "streamed"));
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/x-streamed-protobuf; proto=prometheus.chunkedreadresponse"),
        "{head}"
    );
    // Frames: uvarint length, CRC-32C big-endian, message.
    let mut frames = Vec::new();
    let mut rest = &body[..];
    while !rest.is_empty() {
        let (mut len, mut shift, mut i) = (0usize, 0, 0);
        loop {
            let b = rest[i];
            len |= ((b & 0x7f) as usize) << shift;
            i += 1;
            if b < 0x80 {
                break;
            }
            shift += 7;
        }
        let crc = u32::from_be_bytes(rest[i..i + 4].try_into().unwrap());
        let data = &rest[i + 4..i + 4 + len];
        assert_eq!(crc, crc32c_of(data), "frame checksum");
        frames.push(ChunkedReadResponse::decode(data).unwrap());
        rest = &rest[i + 4 + len..];
    }
    assert_eq!(frames.iter().map(|f| f.query_index).collect::<Vec<_>>(), [0, 0, 1]);
    let many_series = &frames[0].chunked_series[0];
    assert!(many_series.labels.iter().any(|l| l.name == "n" && l.value == "many"));
    assert_eq!(
        many_series.chunks.iter().map(|c| u16::from_be_bytes([c.data[0], c.data[1]])).collect::<Vec<_>>(),
        [120, 120, 60]
    );
    let mut got = Vec::new();
    for c in &many_series.chunks {
        assert_eq!(c.r#type, 1, "XOR");
        let samples = decode_prometheus_xor(&c.data);
        assert_eq!((c.min_time_ms, c.max_time_ms), (samples[0].0, samples[samples.len() - 1].0));
        got.extend(samples);
    }
    assert_eq!(got.len(), many.len());
    for ((t, v), (wt, wv)) in got.iter().zip(&many) {
        assert_eq!((t, v.to_bits()), (wt, wv.to_bits()));
    }
    let one = decode_prometheus_xor(&frames[2].chunked_series[0].chunks[0].data);
    assert_eq!(one.len(), 1);
    assert_eq!((one[0].0, one[0].1.to_bits()), (t0, 5e-324f64.to_bits()));

    // SAMPLES first in the client's list: the samples response.
    let (status, _, body) = read(&query(vec![0, 1], "streamed"));
    assert_eq!(status, 200);
    let raw = snap::raw::Decoder::new().decompress_vec(&body).unwrap();
    assert_eq!(strata_server::remote::ReadResponse::decode(&raw[..]).unwrap().results.len(), 2);
    // Only types Strata does not serve: 400 naming them.
    let (status, _, body) = read(&query(vec![7], "streamed"));
    assert_eq!(status, 400);
    assert!(String::from_utf8_lossy(&body).contains("none of the accepted response types [7]"));
}

/// CRC-32C (Castagnoli), bit by bit: the checksum streamed remote read frames carry.
fn crc32c_of(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0x82F6_3B78 } else { crc >> 1 };
        }
    }
    !crc
}

/// A client that gives up on a long query stops its evaluation: the request handler is dropped
/// with the connection, its flag is raised, and the evaluation sees it and ends (counted in
/// `/metrics`), instead of running on for nobody until the deadline.
#[test]
fn a_query_whose_client_goes_away_is_canceled() {
    use std::io::Write;
    let tmp = tempfile::tempdir().unwrap();
    let srv = Server::start(tmp.path(), &["--query.timeout", "5m"]);
    let t0 = now_ms() / 1000 * 1000 - 60_000;
    let series: Vec<support::TestSeries> = (0..40)
        .map(|i| {
            (vec![("__name__", "gone".to_owned()), ("i", i.to_string())], vec![(t0 - 100_000_000, i as f64), (t0, 1.0)])
        })
        .collect();
    let (status, body) =
        http(srv.port, "POST", "/api/v1/write", &[("Content-Encoding", "snappy")], &remote_write_body(&series));
    assert_eq!(status, 204, "{body}");
    // Each series has a sample 100,000 s back, so the subquery has a point every second since:
    // per series 10,001 steps each scanning a window of 90,000 of them, minutes of work in
    // all on a few megabytes (over the HTTP helper's timeout when left to finish).
    let q = "max_over_time(last_over_time(gone[100d])[90000s:1s])";
    let end = t0 / 1000;
    let path = format!("/api/v1/query_range?query={}&start={}&end={end}&step=1", urlencode(q), end - 10_000);
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", srv.port)).unwrap();
    write!(conn, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    std::thread::sleep(Duration::from_secs(1));
    drop(conn);
    let canceled = || {
        let (_, metrics) = http(srv.port, "GET", "/metrics", &[], b"");
        sample_value(&metrics, "strata_engine_queries_canceled_total")
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while canceled() != Some(1.0) {
        assert!(std::time::Instant::now() < deadline, "the query ran on after its client left: {:?}", canceled());
        std::thread::sleep(Duration::from_millis(100));
    }
}
