use prost::Message as _;

use super::*;

fn kv(k: &str, v: &str) -> KeyValue {
    KeyValue { key: k.into(), value: Some(AnyValue { value: Some(Any::String(v.into())) }) }
}

const T: u64 = 1_700_000_000_123_456_789;
const START: u64 = 1_699_999_000_000_000_000;

fn request(metrics: Vec<Metric>) -> ExportMetricsServiceRequest {
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(Resource {
                attributes: vec![
                    kv("service.name", "checkout"),
                    kv("service.namespace", "shop"),
                    kv("service.instance.id", "pod-1"),
                    kv("host.name", "node-7"),
                    kv("k8s.namespace.name", "prod"),
                ],
            }),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(InstrumentationScope { name: "lib".into(), version: "1.0".into(), attributes: vec![] }),
                metrics,
            }],
        }],
    }
}

fn number(attrs: Vec<KeyValue>, v: NumberValue) -> NumberDataPoint {
    NumberDataPoint { attributes: attrs, start_time_unix_nano: START, time_unix_nano: T, value: Some(v), flags: 0 }
}

fn series_text(c: &Converted) -> Vec<String> {
    let mut v: Vec<String> = c
        .series
        .iter()
        .map(|(l, p)| {
            let labels: Vec<String> = l.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
            let vals: Vec<String> = p.samples.iter().map(|s| format!("{}@{}", s.v, s.t)).collect();
            format!("{{{}}} {}", labels.join(", "), vals.join(" "))
        })
        .collect();
    v.sort();
    v
}

#[test]
fn counters_gauges_histograms_and_summaries_become_prometheus_series() {
    let req = request(vec![
        Metric {
            name: "http.server.requests".into(),
            description: "Requests served.".into(),
            unit: "{request}".into(),
            data: Some(MetricData::Sum(Sum {
                data_points: vec![number(vec![kv("http.method", "GET")], NumberValue::AsInt(42))],
                aggregation_temporality: TEMPORALITY_CUMULATIVE,
                is_monotonic: true,
            })),
        },
        Metric {
            name: "queue.size".into(),
            description: String::new(),
            unit: "1".into(),
            data: Some(MetricData::Gauge(Gauge { data_points: vec![number(vec![], NumberValue::AsDouble(0.25))] })),
        },
        Metric {
            name: "http.server.duration".into(),
            description: String::new(),
            unit: "s".into(),
            data: Some(MetricData::Histogram(Histogram {
                data_points: vec![HistogramDataPoint {
                    attributes: vec![],
                    start_time_unix_nano: START,
                    time_unix_nano: T,
                    count: 10,
                    sum: Some(3.5),
                    bucket_counts: vec![2, 5, 3],
                    explicit_bounds: vec![0.1, 1.0],
                    flags: 0,
                }],
                aggregation_temporality: TEMPORALITY_CUMULATIVE,
            })),
        },
        Metric {
            name: "rpc.latency".into(),
            description: String::new(),
            unit: "ms".into(),
            data: Some(MetricData::Summary(Summary {
                data_points: vec![SummaryDataPoint {
                    attributes: vec![],
                    start_time_unix_nano: START,
                    time_unix_nano: T,
                    count: 4,
                    sum: 10.0,
                    quantile_values: vec![ValueAtQuantile { quantile: 0.5, value: 2.0 }],
                    flags: 0,
                }],
            })),
        },
    ]);
    // Through the wire format and back, as a client sends it.
    let req = ExportMetricsServiceRequest::decode(&*req.encode_to_vec()).unwrap();
    let c = convert(&req, &OtlpConfig::default());
    assert_eq!(c.rejected, 0, "{:?}", c.errors);
    let t = 1_700_000_000_123i64;
    let id = r#"instance="pod-1", job="shop/checkout""#;
    let want: Vec<String> = vec![
        format!(r#"{{__name__="http_server_duration_seconds_bucket", {id}, le="+Inf"}} 10@{t}"#),
        format!(r#"{{__name__="http_server_duration_seconds_bucket", {id}, le="0.1"}} 2@{t}"#),
        format!(r#"{{__name__="http_server_duration_seconds_bucket", {id}, le="1"}} 7@{t}"#),
        format!(r#"{{__name__="http_server_duration_seconds_count", {id}}} 10@{t}"#),
        format!(r#"{{__name__="http_server_duration_seconds_sum", {id}}} 3.5@{t}"#),
        format!(r#"{{__name__="http_server_requests_total", http_method="GET", {id}}} 42@{t}"#),
        format!(r#"{{__name__="queue_size_ratio", {id}}} 0.25@{t}"#),
        format!(r#"{{__name__="rpc_latency_milliseconds", {id}, quantile="0.5"}} 2@{t}"#),
        format!(r#"{{__name__="rpc_latency_milliseconds_count", {id}}} 4@{t}"#),
        format!(r#"{{__name__="rpc_latency_milliseconds_sum", {id}}} 10@{t}"#),
        format!(r#"{{__name__="target_info", host_name="node-7", {id}, k8s_namespace_name="prod"}} 1@{t}"#),
    ];
    let mut want = want;
    want.sort();
    assert_eq!(series_text(&c), want);
    // Start times travel with the samples.
    let counter = c.series.iter().find(|(l, _)| l.iter().any(|(_, v)| v == "http_server_requests_total")).unwrap();
    assert_eq!(counter.1.sample_starts, vec![1_699_999_000_000]);
    assert!(c.metadata.contains(&(
        "http_server_requests_total".into(),
        "counter",
        "Requests served.".into(),
        "{request}".into()
    )));
}

#[test]
fn delta_temporality_is_refused_by_name_and_the_rest_is_kept() {
    let req = request(vec![
        Metric {
            name: "deltas".into(),
            description: String::new(),
            unit: String::new(),
            data: Some(MetricData::Sum(Sum {
                data_points: vec![number(vec![], NumberValue::AsInt(1)), number(vec![], NumberValue::AsInt(2))],
                aggregation_temporality: TEMPORALITY_DELTA,
                is_monotonic: true,
            })),
        },
        Metric {
            name: "g".into(),
            description: String::new(),
            unit: String::new(),
            data: Some(MetricData::Gauge(Gauge { data_points: vec![number(vec![], NumberValue::AsDouble(1.0))] })),
        },
    ]);
    let c = convert(&req, &OtlpConfig::default());
    assert_eq!(c.rejected, 2);
    assert!(c.errors[0].contains("\"deltas\": delta temporality is not supported"), "{:?}", c.errors);
    assert!(series_text(&c).iter().any(|s| s.starts_with(r#"{__name__="g""#)));
}

#[test]
fn no_recorded_value_is_a_stale_marker_and_promoted_attributes_are_copied() {
    let mut p = number(vec![kv("k8s.namespace.name", "point-wins")], NumberValue::AsDouble(5.0));
    p.flags = FLAG_NO_RECORDED_VALUE;
    let req = request(vec![Metric {
        name: "g".into(),
        description: String::new(),
        unit: String::new(),
        data: Some(MetricData::Gauge(Gauge { data_points: vec![p, number(vec![], NumberValue::AsDouble(1.0))] })),
    }]);
    let cfg = OtlpConfig { promote_resource_attributes: vec!["k8s.namespace.name".into()], ..Default::default() };
    let c = convert(&req, &cfg);
    let texts = series_text(&c);
    let stale = c.series.iter().find(|(l, _)| l.iter().any(|(_, v)| v == "point-wins")).unwrap();
    assert!(strata_model::is_stale_nan(stale.1.samples[0].v));
    assert!(texts.iter().any(|s| s.contains(r#"k8s_namespace_name="prod""#) && s.contains(r#""g""#)), "{texts:?}");
}

#[test]
fn exponential_histograms_become_native_histograms() {
    // Scale 0: OpenTelemetry bucket i covers (2^i, 2^(i+1)]; Prometheus bucket i+1 the same.
    let p = ExponentialHistogramDataPoint {
        attributes: vec![],
        start_time_unix_nano: START,
        time_unix_nano: T,
        count: 9,
        sum: Some(20.0),
        scale: 0,
        zero_count: 1,
        positive: Some(Buckets { offset: 0, bucket_counts: vec![2, 0, 3, 0, 0, 0, 1] }),
        negative: Some(Buckets { offset: -1, bucket_counts: vec![2] }),
        flags: 0,
        zero_threshold: 0.0,
    };
    let h = native_histogram(&p).unwrap();
    assert_eq!(h.schema, 0);
    assert_eq!(h.positive_spans, vec![Span { offset: 1, length: 3 }, Span { offset: 3, length: 1 }]);
    assert_eq!(h.positive_buckets, vec![2.0, 0.0, 3.0, 1.0]);
    assert_eq!(h.negative_spans, vec![Span { offset: 0, length: 1 }]);
    assert_eq!((h.count, h.sum, h.zero_count), (9.0, 20.0, 1.0));
    // Total of the buckets and zero bucket is the count.
    let total: f64 = h.positive_buckets.iter().chain(&h.negative_buckets).sum::<f64>() + h.zero_count;
    assert_eq!(total, h.count);
    // Scale 10 merges four buckets into one at scale 8.
    let fine = ExponentialHistogramDataPoint {
        scale: 10,
        positive: Some(Buckets { offset: 4, bucket_counts: vec![1, 1, 1, 1, 5] }),
        negative: None,
        count: 9,
        zero_count: 0,
        ..p.clone()
    };
    let h = native_histogram(&fine).unwrap();
    assert_eq!(h.schema, 8);
    assert_eq!(h.positive_spans, vec![Span { offset: 2, length: 2 }]);
    assert_eq!(h.positive_buckets, vec![4.0, 5.0]);
    let coarse = ExponentialHistogramDataPoint { scale: -5, ..p };
    assert!(native_histogram(&coarse).unwrap_err().contains("below -4"));
}

#[test]
fn json_requests_decode_to_the_same_series() {
    let body = r#"{"resourceMetrics":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"api"}}]},
      "scopeMetrics":[{"scope":{"name":"x"},"metrics":[
        {"name":"requests","unit":"1","sum":{"aggregationTemporality":2,"isMonotonic":true,
          "dataPoints":[{"asInt":"7","timeUnixNano":"1700000000000000000","startTimeUnixNano":"1690000000000000000",
            "attributes":[{"key":"code","value":{"intValue":"200"}}]}]}},
        {"name":"temp","gauge":{"dataPoints":[{"asDouble":"NaN","timeUnixNano":1700000000000000000}]}},
        {"name":"lat","unit":"s","histogram":{"aggregationTemporality":2,"dataPoints":[{"timeUnixNano":"1700000000000000000",
          "count":"3","sum":1.5,"bucketCounts":["1","2"],"explicitBounds":[0.5]}]}}
      ]}]}]}"#;
    let req = json::decode(body.as_bytes()).unwrap();
    let c = convert(&req, &OtlpConfig::default());
    let texts = series_text(&c);
    assert!(
        texts.contains(&r#"{__name__="requests_total", code="200", job="api"} 7@1700000000000"#.to_owned()),
        "{texts:?}"
    );
    assert!(texts.iter().any(|s| s.starts_with(r#"{__name__="temp", job="api"} NaN"#)), "{texts:?}");
    assert!(
        texts.contains(&r#"{__name__="lat_seconds_bucket", job="api", le="0.5"} 1@1700000000000"#.to_owned()),
        "{texts:?}"
    );
    let err = json::decode(b"{\"resourceMetrics\": 5}").unwrap_err();
    assert!(err.starts_with("invalid OTLP/JSON"), "{err}");
}
