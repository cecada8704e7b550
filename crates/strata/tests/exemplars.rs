//! Exemplars end to end: received by remote write 1.0 (with their samples, and apart from them
//! as Prometheus' queue sends them) and 2.0, and by scraping OpenMetrics; served by
//! `/api/v1/query_exemplars` exactly as Debian's Prometheus 2.42 (`--enable-feature=
//! exemplar-storage`) serves the same scraped target's; kept over a SIGKILL through the WAL.

mod support;

use std::time::{Duration, Instant};

use prost::Message;
use serde_json::Value;
use strata_server::remote::{self, Exemplar, Label, Sample, TimeSeries, WriteRequest};
use support::{http, now_ms, which, Server};

fn urlencode(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// `query_exemplars`' data, series sorted by their labels (Prometheus answers in map order).
fn exemplars(port: u16, query: &str, start: f64, end: f64) -> Vec<Value> {
    let path = format!("/api/v1/query_exemplars?query={}&start={start}&end={end}", urlencode(query));
    let (status, body) = http(port, "GET", &path, &[], b"");
    assert_eq!(status, 200, "{query}: {body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let mut data = v["data"].as_array().unwrap().clone();
    data.sort_by_key(|s| s["seriesLabels"].to_string());
    data
}

const TARGET: &str = concat!(
    "# TYPE req_seconds histogram\n",
    "req_seconds_bucket{le=\"0.1\"} 5 # {trace_id=\"aaa\"} 0.05 1700000000.001\n",
    "req_seconds_bucket{le=\"1\"} 8 # {trace_id=\"bbb\",span_id=\"s1\"} 0.5 1700000000.5\n",
    "req_seconds_bucket{le=\"+Inf\"} 9 # {trace_id=\"ccc\"} 3 1700000001\n",
    "req_seconds_sum 10\n",
    "req_seconds_count 9\n",
    "# TYPE jobs counter\n",
    "jobs_total 3 # {trace_id=\"ddd\"} 1 1700000002.25\n",
    "# TYPE untimed counter\n",
    "untimed_total 1 # {trace_id=\"eee\"} 1\n",
    "# EOF\n",
);

#[test]
fn scraped_exemplars_are_served_as_prometheus_serves_them() {
    let prometheus = which("prometheus");
    let target = support::fixed_target("application/openmetrics-text; version=1.0.0; charset=utf-8", TARGET);
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("scrape.yml");
    std::fs::write(
        &cfg,
        format!("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: om\n    static_configs:\n      - targets: ['{target}']\n"),
    )
    .unwrap();
    let mut srv = Server::start(&tmp.path().join("strata"), &["--config", cfg.to_str().unwrap()]);
    let (_prom, prom_port) =
        support::start_prometheus(&prometheus, &cfg, tmp.path(), &["--enable-feature=exemplar-storage"]);
    let query = "req_seconds_bucket or jobs_total";
    let (start, end) = (1_699_999_999.0, 1_700_000_010.0);
    let deadline = Instant::now() + Duration::from_secs(60);
    let (ours, theirs) = loop {
        let ours = exemplars(srv.port, query, start, end);
        let theirs = support::try_http(prom_port, "GET", "/-/ready", &[], b"")
            .ok()
            .filter(|(s, _)| *s == 200)
            .map(|_| exemplars(prom_port, query, start, end))
            .unwrap_or_default();
        if ours.len() == 4 && theirs.len() == 4 {
            break (ours, theirs);
        }
        assert!(Instant::now() < deadline, "exemplars never appeared: {ours:#?} {theirs:#?}\n{}", srv.log_text());
        std::thread::sleep(Duration::from_millis(250));
    };
    assert_eq!(ours, theirs, "Strata (left) and Prometheus (right) differ");
    // What they agree on is what the target gave.
    let bbb = ours.iter().find(|s| s["seriesLabels"]["le"] == "1").unwrap();
    assert_eq!(bbb["exemplars"][0]["labels"]["span_id"], "s1", "{bbb}");
    assert_eq!(bbb["exemplars"][0]["value"], "0.5");
    assert_eq!(bbb["exemplars"][0]["timestamp"].as_f64(), Some(1_700_000_000.5));
    assert_eq!(ours[0]["seriesLabels"]["job"], "om");
    // A repeated scrape stored each exemplar once.
    assert!(ours.iter().all(|s| s["exemplars"].as_array().unwrap().len() == 1), "{ours:#?}");
    // An exemplar without a timestamp takes its sample's (the scrape's).
    let now = now_ms() as f64 / 1000.0;
    let untimed = exemplars(srv.port, "untimed_total", now - 600.0, now + 60.0);
    assert_eq!(untimed.len(), 1, "{untimed:#?}");
    assert_eq!(untimed[0]["exemplars"][0]["labels"]["trace_id"], "eee");
    // A time range that excludes some, and a selector that matches none.
    assert_eq!(exemplars(srv.port, "req_seconds_bucket", 1_700_000_000.4, 1_700_000_000.6).len(), 1);
    assert!(exemplars(srv.port, "nothing_here", start, end).is_empty());

    // Kept over a crash: replayed from the WAL.
    srv.kill();
    let srv = Server::start_on(srv.port, &tmp.path().join("strata"), &["--wal-fsync", "always"]);
    let after = exemplars(srv.port, query, start, end);
    assert_eq!(after, ours, "{}", srv.log_text());
}

#[test]
fn remote_write_exemplars_are_stored_and_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let srv = Server::start(tmp.path(), &[]);
    let t0 = now_ms() / 1000 * 1000 - 60_000;
    let labels = |name: &str| vec![Label::new("__name__", name), Label::new("job", "rw")];
    let exemplar =
        |trace: &str, t: i64, v: f64| Exemplar { labels: vec![Label::new("trace_id", trace)], value: v, timestamp: t };
    // 1.0: one series with its samples and an exemplar, and one whose exemplars come in a
    // series entry of their own (as Prometheus' queue sends them), one of them out of order.
    let req = WriteRequest {
        timeseries: vec![
            TimeSeries {
                labels: labels("a_total"),
                samples: vec![Sample { value: 1.0, timestamp: t0 }],
                exemplars: vec![exemplar("a1", t0, 0.5)],
                histograms: vec![],
            },
            TimeSeries {
                labels: labels("b_total"),
                samples: vec![Sample { value: 2.0, timestamp: t0 }],
                exemplars: vec![],
                histograms: vec![],
            },
            TimeSeries {
                labels: labels("b_total"),
                samples: vec![],
                exemplars: vec![exemplar("b2", t0 + 2000, 2.0), exemplar("b1", t0 + 1000, 1.0)],
                histograms: vec![],
            },
        ],
        metadata: vec![],
    };
    let (status, head, body) = support::http_with_head(
        srv.port,
        "POST",
        "/api/v1/write",
        &[("Content-Encoding", "snappy"), ("Content-Type", "application/x-protobuf")],
        &remote::encode(&req),
    );
    assert_eq!(status, 204, "{body}");
    assert!(head.to_ascii_lowercase().contains("x-prometheus-remote-write-exemplars-written: 2"), "{head}");
    // 2.0: labels as symbol references.
    let mut req2 = remote::v2::request(&[(vec![("__name__", "c_total"), ("job", "rw")], vec![(t0, 3.0)])]);
    let trace = req2.symbols.len() as u32;
    req2.symbols.extend(["trace_id".to_owned(), "c1".to_owned()]);
    req2.timeseries[0].exemplars =
        vec![remote::v2::Exemplar { labels_refs: vec![trace, trace + 1], value: 3.0, timestamp: t0 }];
    let (status, head, body) = support::http_with_head(
        srv.port,
        "POST",
        "/api/v1/write",
        &[
            ("Content-Encoding", "snappy"),
            ("Content-Type", "application/x-protobuf;proto=io.prometheus.write.v2.Request"),
        ],
        &support::snappy(&req2.encode_to_vec()),
    );
    assert_eq!(status, 204, "{body}");
    assert!(head.to_ascii_lowercase().contains("x-prometheus-remote-write-exemplars-written: 1"), "{head}");

    let (start, end) = ((t0 - 1000) as f64 / 1000.0, (t0 + 5000) as f64 / 1000.0);
    let got = exemplars(srv.port, "{job=\"rw\"}", start, end);
    let traces: Vec<(String, Vec<String>)> = got
        .iter()
        .map(|s| {
            let name = s["seriesLabels"]["__name__"].as_str().unwrap().to_owned();
            let t =
                s["exemplars"].as_array().unwrap().iter().map(|e| e["labels"]["trace_id"].as_str().unwrap().to_owned());
            (name, t.collect())
        })
        .collect();
    assert_eq!(
        traces,
        [
            ("a_total".into(), vec!["a1".into()]),
            ("b_total".into(), vec!["b2".into()]),
            ("c_total".into(), vec!["c1".into()])
        ]
    );
    let (_, metrics) = http(srv.port, "GET", "/metrics", &[], b"");
    assert!(metrics.contains("strata_remote_write_exemplars_rejected_total 1"), "the out-of-order one");
    // Bad parameters are 400 with the reason.
    let (status, body) = http(srv.port, "GET", "/api/v1/query_exemplars?query=up%7B", &[], b"");
    assert_eq!(status, 400, "{body}");
    let (status, body) = http(srv.port, "GET", "/api/v1/query_exemplars?query=up&start=10&end=5", &[], b"");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("end timestamp must not be before start"), "{body}");
}
