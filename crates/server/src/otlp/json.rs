//! OTLP/JSON (`Content-Type: application/json`): the protobuf messages in proto3's JSON
//! mapping as OTLP specifies it — lowerCamelCase field names, 64-bit integers as strings or
//! numbers, doubles as numbers or `"NaN"`/`"Infinity"`/`"-Infinity"`, enums as integers, bytes
//! in base64 — read into the same structs the protobuf decoder fills.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer};

use super::proto::*;

/// Decodes an OTLP/JSON export request.
pub fn decode(body: &[u8]) -> Result<ExportMetricsServiceRequest, String> {
    let r: JRequest = serde_json::from_slice(body).map_err(|e| format!("invalid OTLP/JSON: {e}"))?;
    Ok(ExportMetricsServiceRequest { resource_metrics: r.resource_metrics.into_iter().map(Into::into).collect() })
}

fn u64_any<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(s) => s.parse().map_err(D::Error::custom),
        serde_json::Value::Number(n) => {
            n.as_u64().ok_or_else(|| D::Error::custom(format!("{n} is not a non-negative integer")))
        }
        v => Err(D::Error::custom(format!("expected an integer, got {v}"))),
    }
}

fn i64_any<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(s) => s.parse().map_err(D::Error::custom),
        serde_json::Value::Number(n) => n.as_i64().ok_or_else(|| D::Error::custom(format!("{n} is not an integer"))),
        v => Err(D::Error::custom(format!("expected an integer, got {v}"))),
    }
}

fn f64_of<E: serde::de::Error>(v: serde_json::Value) -> Result<f64, E> {
    match v {
        serde_json::Value::Number(n) => n.as_f64().ok_or_else(|| E::custom(format!("{n} is not a number"))),
        serde_json::Value::String(s) => match s.as_str() {
            "NaN" => Ok(f64::NAN),
            "Infinity" => Ok(f64::INFINITY),
            "-Infinity" => Ok(f64::NEG_INFINITY),
            _ => s.parse().map_err(E::custom),
        },
        v => Err(E::custom(format!("expected a number, got {v}"))),
    }
}

fn f64_any<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    f64_of(serde_json::Value::deserialize(d)?)
}

fn opt_f64_any<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    match serde_json::Value::deserialize(d)? {
        serde_json::Value::Null => Ok(None),
        v => f64_of(v).map(Some),
    }
}

fn u64s_any<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u64>, D::Error> {
    let vs = Vec::<serde_json::Value>::deserialize(d)?;
    vs.into_iter()
        .map(|v| match v {
            serde_json::Value::String(s) => s.parse().map_err(D::Error::custom),
            serde_json::Value::Number(n) => n.as_u64().ok_or_else(|| D::Error::custom(format!("{n} is not a count"))),
            v => Err(D::Error::custom(format!("expected a count, got {v}"))),
        })
        .collect()
}

fn f64s_any<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
    Vec::<serde_json::Value>::deserialize(d)?.into_iter().map(f64_of).collect()
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JRequest {
    #[serde(default)]
    resource_metrics: Vec<JResourceMetrics>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JResourceMetrics {
    resource: Option<JResource>,
    #[serde(default)]
    scope_metrics: Vec<JScopeMetrics>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JResource {
    #[serde(default)]
    attributes: Vec<JKeyValue>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JScopeMetrics {
    scope: Option<JScope>,
    #[serde(default)]
    metrics: Vec<JMetric>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JScope {
    #[serde(default)]
    name: String,
    #[serde(default)]
    version: String,
    #[serde(default)]
    attributes: Vec<JKeyValue>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JMetric {
    #[serde(default)]
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    unit: String,
    gauge: Option<JPoints<JNumberPoint>>,
    sum: Option<JSum>,
    histogram: Option<JTemporal<JHistogramPoint>>,
    exponential_histogram: Option<JTemporal<JExpPoint>>,
    summary: Option<JPoints<JSummaryPoint>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JPoints<P> {
    #[serde(default = "Vec::new")]
    data_points: Vec<P>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JTemporal<P> {
    #[serde(default = "Vec::new")]
    data_points: Vec<P>,
    #[serde(default)]
    aggregation_temporality: i32,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JSum {
    #[serde(default)]
    data_points: Vec<JNumberPoint>,
    #[serde(default)]
    aggregation_temporality: i32,
    #[serde(default)]
    is_monotonic: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JNumberPoint {
    #[serde(default)]
    attributes: Vec<JKeyValue>,
    #[serde(default, deserialize_with = "u64_any")]
    start_time_unix_nano: u64,
    #[serde(default, deserialize_with = "u64_any")]
    time_unix_nano: u64,
    #[serde(default, deserialize_with = "opt_f64_any")]
    as_double: Option<f64>,
    #[serde(default, deserialize_with = "opt_i64_any")]
    as_int: Option<i64>,
    #[serde(default)]
    flags: u32,
}

fn opt_i64_any<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    i64_any(d).map(Some)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JHistogramPoint {
    #[serde(default)]
    attributes: Vec<JKeyValue>,
    #[serde(default, deserialize_with = "u64_any")]
    start_time_unix_nano: u64,
    #[serde(default, deserialize_with = "u64_any")]
    time_unix_nano: u64,
    #[serde(default, deserialize_with = "u64_any")]
    count: u64,
    #[serde(default, deserialize_with = "opt_f64_any")]
    sum: Option<f64>,
    #[serde(default, deserialize_with = "u64s_any")]
    bucket_counts: Vec<u64>,
    #[serde(default, deserialize_with = "f64s_any")]
    explicit_bounds: Vec<f64>,
    #[serde(default)]
    flags: u32,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JExpPoint {
    #[serde(default)]
    attributes: Vec<JKeyValue>,
    #[serde(default, deserialize_with = "u64_any")]
    start_time_unix_nano: u64,
    #[serde(default, deserialize_with = "u64_any")]
    time_unix_nano: u64,
    #[serde(default, deserialize_with = "u64_any")]
    count: u64,
    #[serde(default, deserialize_with = "opt_f64_any")]
    sum: Option<f64>,
    #[serde(default)]
    scale: i32,
    #[serde(default, deserialize_with = "u64_any")]
    zero_count: u64,
    positive: Option<JBuckets>,
    negative: Option<JBuckets>,
    #[serde(default)]
    flags: u32,
    #[serde(default, deserialize_with = "f64_any")]
    zero_threshold: f64,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JBuckets {
    #[serde(default)]
    offset: i32,
    #[serde(default, deserialize_with = "u64s_any")]
    bucket_counts: Vec<u64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JSummaryPoint {
    #[serde(default)]
    attributes: Vec<JKeyValue>,
    #[serde(default, deserialize_with = "u64_any")]
    start_time_unix_nano: u64,
    #[serde(default, deserialize_with = "u64_any")]
    time_unix_nano: u64,
    #[serde(default, deserialize_with = "u64_any")]
    count: u64,
    #[serde(default, deserialize_with = "f64_any")]
    sum: f64,
    #[serde(default)]
    quantile_values: Vec<JQuantile>,
    #[serde(default)]
    flags: u32,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JQuantile {
    #[serde(default, deserialize_with = "f64_any")]
    quantile: f64,
    #[serde(default, deserialize_with = "f64_any")]
    value: f64,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JKeyValue {
    key: String,
    value: Option<JAnyValue>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JAnyValue {
    string_value: Option<String>,
    bool_value: Option<bool>,
    #[serde(default, deserialize_with = "opt_i64_any")]
    int_value: Option<i64>,
    #[serde(default, deserialize_with = "opt_f64_any")]
    double_value: Option<f64>,
    array_value: Option<JArray>,
    kvlist_value: Option<JKvList>,
    bytes_value: Option<String>,
}

#[derive(Deserialize)]
struct JArray {
    #[serde(default)]
    values: Vec<JAnyValue>,
}

#[derive(Deserialize)]
struct JKvList {
    #[serde(default)]
    values: Vec<JKeyValue>,
}

impl From<JResourceMetrics> for ResourceMetrics {
    fn from(r: JResourceMetrics) -> Self {
        ResourceMetrics {
            resource: r.resource.map(|r| Resource { attributes: kvs(r.attributes) }),
            scope_metrics: r
                .scope_metrics
                .into_iter()
                .map(|s| ScopeMetrics {
                    scope: s.scope.map(|sc| InstrumentationScope {
                        name: sc.name,
                        version: sc.version,
                        attributes: kvs(sc.attributes),
                    }),
                    metrics: s.metrics.into_iter().map(Into::into).collect(),
                })
                .collect(),
        }
    }
}

fn kvs(v: Vec<JKeyValue>) -> Vec<KeyValue> {
    v.into_iter().map(|kv| KeyValue { key: kv.key, value: kv.value.map(Into::into) }).collect()
}

impl From<JAnyValue> for AnyValue {
    fn from(v: JAnyValue) -> Self {
        use base64::Engine as _;
        let value = if let Some(s) = v.string_value {
            Some(Any::String(s))
        } else if let Some(b) = v.bool_value {
            Some(Any::Bool(b))
        } else if let Some(i) = v.int_value {
            Some(Any::Int(i))
        } else if let Some(d) = v.double_value {
            Some(Any::Double(d))
        } else if let Some(a) = v.array_value {
            Some(Any::Array(ArrayValue { values: a.values.into_iter().map(Into::into).collect() }))
        } else if let Some(kv) = v.kvlist_value {
            Some(Any::KvList(KeyValueList { values: kvs(kv.values) }))
        } else {
            v.bytes_value.map(|b| Any::Bytes(base64::engine::general_purpose::STANDARD.decode(b).unwrap_or_default()))
        };
        AnyValue { value }
    }
}

fn number_point(p: JNumberPoint) -> NumberDataPoint {
    NumberDataPoint {
        attributes: kvs(p.attributes),
        start_time_unix_nano: p.start_time_unix_nano,
        time_unix_nano: p.time_unix_nano,
        value: match (p.as_double, p.as_int) {
            (Some(d), _) => Some(NumberValue::AsDouble(d)),
            (None, Some(i)) => Some(NumberValue::AsInt(i)),
            (None, None) => None,
        },
        flags: p.flags,
    }
}

fn buckets(b: JBuckets) -> Buckets {
    Buckets { offset: b.offset, bucket_counts: b.bucket_counts }
}

impl From<JMetric> for Metric {
    fn from(m: JMetric) -> Self {
        let data = if let Some(g) = m.gauge {
            Some(MetricData::Gauge(Gauge { data_points: g.data_points.into_iter().map(number_point).collect() }))
        } else if let Some(s) = m.sum {
            Some(MetricData::Sum(Sum {
                data_points: s.data_points.into_iter().map(number_point).collect(),
                aggregation_temporality: s.aggregation_temporality,
                is_monotonic: s.is_monotonic,
            }))
        } else if let Some(h) = m.histogram {
            Some(MetricData::Histogram(Histogram {
                aggregation_temporality: h.aggregation_temporality,
                data_points: h
                    .data_points
                    .into_iter()
                    .map(|p| HistogramDataPoint {
                        attributes: kvs(p.attributes),
                        start_time_unix_nano: p.start_time_unix_nano,
                        time_unix_nano: p.time_unix_nano,
                        count: p.count,
                        sum: p.sum,
                        bucket_counts: p.bucket_counts,
                        explicit_bounds: p.explicit_bounds,
                        flags: p.flags,
                    })
                    .collect(),
            }))
        } else if let Some(h) = m.exponential_histogram {
            Some(MetricData::ExponentialHistogram(ExponentialHistogram {
                aggregation_temporality: h.aggregation_temporality,
                data_points: h
                    .data_points
                    .into_iter()
                    .map(|p| ExponentialHistogramDataPoint {
                        attributes: kvs(p.attributes),
                        start_time_unix_nano: p.start_time_unix_nano,
                        time_unix_nano: p.time_unix_nano,
                        count: p.count,
                        sum: p.sum,
                        scale: p.scale,
                        zero_count: p.zero_count,
                        positive: p.positive.map(buckets),
                        negative: p.negative.map(buckets),
                        flags: p.flags,
                        zero_threshold: p.zero_threshold,
                    })
                    .collect(),
            }))
        } else {
            m.summary.map(|s| {
                MetricData::Summary(Summary {
                    data_points: s
                        .data_points
                        .into_iter()
                        .map(|p| SummaryDataPoint {
                            attributes: kvs(p.attributes),
                            start_time_unix_nano: p.start_time_unix_nano,
                            time_unix_nano: p.time_unix_nano,
                            count: p.count,
                            sum: p.sum,
                            quantile_values: p
                                .quantile_values
                                .into_iter()
                                .map(|q| ValueAtQuantile { quantile: q.quantile, value: q.value })
                                .collect(),
                            flags: p.flags,
                        })
                        .collect(),
                })
            })
        };
        Metric { name: m.name, description: m.description, unit: m.unit, data }
    }
}
