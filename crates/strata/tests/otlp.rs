//! OTLP ingest with a real OpenTelemetry SDK: the Python SDK's OTLP/HTTP exporter sends a
//! counter, an up-down counter, histograms (explicit and exponential) and a gauge; the series
//! read back through PromQL are the ones Prometheus' OTLP receiver makes of them.
//!
//! The SDK lives in a virtual environment `.ci/run` makes (`target/otel-venv`; or set
//! `STRATA_OTEL_PYTHON` to a Python that has `opentelemetry-sdk` and
//! `opentelemetry-exporter-otlp-proto-http`).

mod support;

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;
use support::{http, Server};

fn otel_python() -> PathBuf {
    if let Some(p) = std::env::var_os("STRATA_OTEL_PYTHON") {
        return p.into();
    }
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/otel-venv/bin/python");
    assert!(
        p.exists(),
        "{} is missing: run .ci/run, or `python3 -m venv target/otel-venv && target/otel-venv/bin/pip install opentelemetry-sdk opentelemetry-exporter-otlp-proto-http`",
        p.display()
    );
    p
}

fn query(port: u16, q: &str) -> Vec<Value> {
    let path = format!("/api/v1/query?query={}", form_urlencoded::byte_serialize(q.as_bytes()).collect::<String>());
    let (code, body) = http(port, "GET", &path, &[], b"");
    assert_eq!(code, 200, "{q}: {body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["data"]["result"].as_array().unwrap().clone()
}

fn value(r: &Value) -> f64 {
    r["value"][1].as_str().unwrap().parse().unwrap()
}

#[test]
fn the_opentelemetry_sdk_writes_prometheus_series() {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(&dir.path().join("data"), &[]);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/support/otel_send.py");
    let out = Command::new(otel_python())
        .arg(&script)
        .arg(format!("http://127.0.0.1:{}/api/v1/otlp/v1/metrics", srv.port))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the SDK's export failed:\n{}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        srv.log_text()
    );

    let counter = query(srv.port, "http_server_requests_total");
    assert_eq!(counter.len(), 2, "{counter:?}");
    let get = counter.iter().find(|r| r["metric"]["http_method"] == "GET").unwrap();
    assert_eq!(value(get), 7.0);
    let m = &get["metric"];
    assert_eq!(m["job"], "shop/checkout");
    assert_eq!(m["instance"], "pod-1");
    assert_eq!(m["http_status_code"], "200");

    let inflight = query(srv.port, "http_server_active_requests");
    assert_eq!(value(&inflight[0]), 3.0, "an up-down counter is a gauge without _total");

    let buckets = query(srv.port, "http_server_duration_seconds_bucket");
    let le = |b: &str| value(buckets.iter().find(|r| r["metric"]["le"] == b).unwrap());
    // The SDK's default boundaries: 0, 5, 10, 25, … (in the instrument's unit).
    assert_eq!(le("0"), 0.0, "{buckets:?}");
    assert_eq!(le("5"), 4.0);
    assert_eq!(le("10"), 5.0);
    assert_eq!(le("+Inf"), 5.0);
    assert_eq!(value(&query(srv.port, "http_server_duration_seconds_count")[0]), 5.0);
    let sum = value(&query(srv.port, "http_server_duration_seconds_sum")[0]);
    assert!((sum - 7.343).abs() < 1e-9, "{sum}");
    let p50 = value(&query(srv.port, "histogram_quantile(0.5, http_server_duration_seconds_bucket)")[0]);
    assert!((3.125 - p50).abs() < 1e-9, "{p50}: rank 2.5 of 4 in (0, 5]");

    // The exponential histogram is a native histogram: PromQL's histogram functions read it.
    assert_eq!(value(&query(srv.port, "histogram_count(payload_size_bytes)")[0]), 6.0);
    assert_eq!(value(&query(srv.port, "histogram_sum(payload_size_bytes)")[0]), 2106.0);
    // Buckets (0.5,1] (1,2] (2,4] (64,128] (512,1024]x2: the median's rank, 3 of 6, is the
    // boundary between the third and fourth observation; read from the high side (as
    // Prometheus 3 does for q >= 0.5) it is the lower edge of (64,128].
    let median = value(&query(srv.port, "histogram_quantile(0.5, payload_size_bytes)")[0]);
    assert_eq!(median, 64.0);
    let q25 = value(&query(srv.port, "histogram_quantile(0.25, payload_size_bytes)")[0]);
    assert!((q25 - 2f64.sqrt()).abs() < 1e-9, "{q25}: halfway through (1,2], exponentially");

    let gauge = query(srv.port, "queue_length");
    assert_eq!(value(&gauge[0]), 12.5);
    assert_eq!(gauge[0]["metric"]["queue"], "main");

    let info = query(srv.port, "target_info");
    assert_eq!(info.len(), 1, "{info:?}");
    assert_eq!(info[0]["metric"]["deployment_environment"], "test");
    assert_eq!(info[0]["metric"]["job"], "shop/checkout");

    let (_, metadata) = http(srv.port, "GET", "/api/v1/metadata?metric=http_server_requests_total", &[], b"");
    assert!(metadata.contains("Requests served.") && metadata.contains("counter"), "{metadata}");
}

#[test]
fn bad_otlp_requests_are_refused_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(&dir.path().join("data"), &[]);
    let path = "/api/v1/otlp/v1/metrics";
    let (code, body) = http(srv.port, "POST", path, &[("Content-Type", "application/x-protobuf")], b"\xff\xff\xff");
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("invalid OTLP protobuf"), "{body}");
    let (code, body) = http(srv.port, "POST", path, &[("Content-Type", "text/plain")], b"x");
    assert_eq!(code, 415, "{body}");
    let (code, body) =
        http(srv.port, "POST", path, &[("Content-Type", "application/json")], b"{\"resourceMetrics\":[{");
    assert_eq!(code, 400, "{body}");
    // A delta sum is refused by name in OTLP's partial success; the gauge beside it is stored.
    let now = support::now_ms() as u128 * 1_000_000;
    let json = format!(
        r#"{{"resourceMetrics":[{{"scopeMetrics":[{{"metrics":[
          {{"name":"d","sum":{{"aggregationTemporality":1,"isMonotonic":true,"dataPoints":[{{"asInt":"1","timeUnixNano":"{now}"}}]}}}},
          {{"name":"g","gauge":{{"dataPoints":[{{"asDouble":2,"timeUnixNano":"{now}"}}]}}}}]}}]}}]}}"#
    );
    let (code, body) = http(srv.port, "POST", path, &[("Content-Type", "application/json")], json.as_bytes());
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["partialSuccess"]["rejectedDataPoints"], "1");
    assert!(v["partialSuccess"]["errorMessage"].as_str().unwrap().contains("delta temporality"), "{body}");
    assert_eq!(value(&query(srv.port, "g")[0]), 2.0);
}
