//! OTLP metrics ingest (`POST /api/v1/otlp/v1/metrics`, protobuf or JSON): OpenTelemetry's
//! data model turned into Prometheus series as Prometheus' own OTLP receiver turns it, so that
//! dashboards and alerts written against a Prometheus fed by OTLP read the same series here.
//!
//! - Gauges are gauges; monotonic cumulative sums are counters (`_total`); non-monotonic sums
//!   are gauges. Delta temporality is refused (counted and named in the response's partial
//!   success): a delta is not a Prometheus value without state across requests.
//! - Explicit-bucket histograms become classic histograms (`_bucket{le}` cumulative,
//!   `_sum`, `_count`); exponential histograms become native histograms (scale above 8 is
//!   merged down to 8, below -4 refused); summaries become `{quantile}`, `_sum`, `_count`.
//! - A point flagged "no recorded value" is a staleness marker.
//! - Resource attributes: `service.namespace`/`service.name` → `job`, `service.instance.id` →
//!   `instance`, the other attributes on a `target_info` series; `promote_resource_attributes`
//!   copies chosen ones onto every series. Names per `translation_strategy` (`names`).
//! - Start times go with the samples (read by `rate` under `--enable-feature=use-start-timestamps`).

pub mod json;
pub mod names;
pub mod proto;

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;
use strata_model::histogram::Span;
use strata_model::{FloatHistogram, Sample, STALE_NAN_BITS};

use names::{label_name, metric_name, Kind, TranslationStrategy};
use proto::*;

/// The `otlp` section of the configuration (Prometheus' names).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OtlpConfig {
    /// Resource attributes copied onto every series (as labels, translated).
    #[serde(default)]
    pub promote_resource_attributes: Vec<String>,
    #[serde(default)]
    pub translation_strategy: TranslationStrategy,
    /// Keep `service.*` attributes on `target_info` too.
    #[serde(default)]
    pub keep_identifying_resource_attributes: bool,
}

/// One series' converted points.
#[derive(Debug, Default, PartialEq)]
pub struct SeriesPoints {
    pub samples: Vec<Sample>,
    /// Start times of `samples` (0: none), parallel.
    pub sample_starts: Vec<i64>,
    pub histograms: Vec<(i64, FloatHistogram)>,
    pub histogram_starts: Vec<i64>,
}

/// A request, converted.
#[derive(Debug, Default)]
pub struct Converted {
    /// Series by their labels (sorted by name).
    pub series: Vec<(Vec<(String, String)>, SeriesPoints)>,
    /// Data points refused, and why (the first few reasons).
    pub rejected: usize,
    pub errors: Vec<String>,
    /// Metric families: (name, Prometheus type, help, unit).
    pub metadata: Vec<(String, &'static str, String, String)>,
}

/// Reasons kept for the response; the count goes on.
const MAX_ERRORS: usize = 10;

struct Builder {
    /// Series by labels (foldhash: SipHash over every label of every point was a sixth of the
    /// conversion's time).
    index: HashMap<Vec<(String, String)>, usize, foldhash::fast::RandomState>,
    out: Converted,
}

impl Builder {
    fn series(&mut self, mut labels: Vec<(String, String)>) -> &mut SeriesPoints {
        labels.sort_unstable();
        let i = match self.index.get(&labels) {
            Some(&i) => i,
            None => {
                let i = self.out.series.len();
                self.index.insert(labels.clone(), i);
                self.out.series.push((labels, SeriesPoints::default()));
                i
            }
        };
        &mut self.out.series[i].1
    }

    fn float(&mut self, labels: Vec<(String, String)>, t: i64, start: i64, v: f64) {
        let s = self.series(labels);
        s.samples.push(Sample { t, v });
        s.sample_starts.push(start);
    }

    fn reject(&mut self, n: usize, why: impl FnOnce() -> String) {
        self.out.rejected += n;
        if self.out.errors.len() < MAX_ERRORS {
            self.out.errors.push(why());
        }
    }
}

fn ms(nanos: u64) -> i64 {
    (nanos / 1_000_000) as i64
}

const STALE: f64 = f64::from_bits(STALE_NAN_BITS);

/// Attributes as label pairs: names translated; two attributes that translate to one name
/// have their values joined with `;` in the order of their original names (Prometheus' rule).
fn attribute_labels(attrs: &[KeyValue], strategy: TranslationStrategy) -> Vec<(String, String)> {
    let mut sorted: Vec<&KeyValue> = attrs.iter().collect();
    sorted.sort_by(|a, b| a.key.cmp(&b.key));
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    for kv in sorted {
        let v = kv.value.as_ref().map(AnyValue::as_label).unwrap_or_default();
        let name = label_name(&kv.key, strategy);
        if name.is_empty() || v.is_empty() {
            continue;
        }
        out.entry(name)
            .and_modify(|old| {
                old.push(';');
                old.push_str(&v);
            })
            .or_insert(v);
    }
    out.into_iter().collect()
}

fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a AnyValue> {
    attrs.iter().find(|kv| kv.key == key).and_then(|kv| kv.value.as_ref())
}

/// Converts an export request.
pub fn convert(req: &ExportMetricsServiceRequest, cfg: &OtlpConfig) -> Converted {
    let strategy = cfg.translation_strategy;
    let mut b = Builder { index: HashMap::default(), out: Converted::default() };
    let mut families: BTreeMap<String, (&'static str, String, String)> = BTreeMap::new();
    for rm in &req.resource_metrics {
        let empty = Vec::new();
        let rattrs = rm.resource.as_ref().map(|r| &r.attributes).unwrap_or(&empty);
        // job and instance, and the promoted attributes, go on every series of the resource.
        let mut resource_labels: Vec<(String, String)> = Vec::new();
        for name in &cfg.promote_resource_attributes {
            if let Some(v) = attr(rattrs, name) {
                resource_labels.push((label_name(name, strategy), v.as_label()));
            }
        }
        let job = attr(rattrs, "service.name").map(|n| match attr(rattrs, "service.namespace") {
            Some(ns) => format!("{}/{}", ns.as_label(), n.as_label()),
            None => n.as_label(),
        });
        let instance = attr(rattrs, "service.instance.id").map(AnyValue::as_label);
        let mut latest = 0i64;
        for sm in &rm.scope_metrics {
            for m in &sm.metrics {
                let base = |point_attrs: &[KeyValue]| -> Vec<(String, String)> {
                    let mut l = attribute_labels(point_attrs, strategy);
                    for (k, v) in &resource_labels {
                        if !l.iter().any(|(n, _)| n == k) {
                            l.push((k.clone(), v.clone()));
                        }
                    }
                    for (k, v) in [("job", &job), ("instance", &instance)] {
                        if let Some(v) = v {
                            l.retain(|(n, _)| n != k);
                            l.push((k.to_owned(), v.clone()));
                        }
                    }
                    l
                };
                let with_name = |mut l: Vec<(String, String)>, name: &str| {
                    l.retain(|(n, _)| n != "__name__");
                    l.push(("__name__".to_owned(), name.to_owned()));
                    l
                };
                let Some(data) = &m.data else {
                    continue;
                };
                // The metric's Prometheus name, with its family noted for the metadata.
                let mut family = |kind: Kind, type_name: &'static str| {
                    let name = metric_name(&m.name, &m.unit, kind, strategy);
                    families.insert(name.clone(), (type_name, m.description.clone(), m.unit.clone()));
                    name
                };
                match data {
                    MetricData::Gauge(g) => {
                        let name = family(Kind::Gauge, "gauge");
                        for p in &g.data_points {
                            number_point(&mut b, &mut latest, with_name(base(&p.attributes), &name), p, &m.name);
                        }
                    }
                    MetricData::Sum(s) => {
                        if !cumulative(&mut b, &m.name, s.aggregation_temporality, s.data_points.len()) {
                            continue;
                        }
                        let name = match s.is_monotonic {
                            true => family(Kind::Counter, "counter"),
                            false => family(Kind::UpDownSum, "gauge"),
                        };
                        for p in &s.data_points {
                            number_point(&mut b, &mut latest, with_name(base(&p.attributes), &name), p, &m.name);
                        }
                    }
                    MetricData::Histogram(h) => {
                        if !cumulative(&mut b, &m.name, h.aggregation_temporality, h.data_points.len()) {
                            continue;
                        }
                        let name = family(Kind::Histogram, "histogram");
                        for p in &h.data_points {
                            classic_histogram(&mut b, &mut latest, base(&p.attributes), &name, p);
                        }
                    }
                    MetricData::ExponentialHistogram(h) => {
                        if !cumulative(&mut b, &m.name, h.aggregation_temporality, h.data_points.len()) {
                            continue;
                        }
                        let name = family(Kind::Histogram, "histogram");
                        for p in &h.data_points {
                            let t = ms(p.time_unix_nano);
                            match native_histogram(p) {
                                Ok(hist) => {
                                    latest = latest.max(t);
                                    let s = b.series(with_name(base(&p.attributes), &name));
                                    s.histograms.push((t, hist));
                                    s.histogram_starts.push(ms(p.start_time_unix_nano));
                                }
                                Err(e) => b.reject(1, || format!("metric {:?}: {e}", m.name)),
                            }
                        }
                    }
                    MetricData::Summary(s) => {
                        let name = family(Kind::Summary, "summary");
                        for p in &s.data_points {
                            let t = ms(p.time_unix_nano);
                            let start = ms(p.start_time_unix_nano);
                            latest = latest.max(t);
                            let stale = p.flags & FLAG_NO_RECORDED_VALUE != 0;
                            let v = |x: f64| if stale { STALE } else { x };
                            let l = base(&p.attributes);
                            b.float(with_name(l.clone(), &format!("{name}_sum")), t, start, v(p.sum));
                            b.float(with_name(l.clone(), &format!("{name}_count")), t, start, v(p.count as f64));
                            for q in &p.quantile_values {
                                let mut ql = with_name(l.clone(), &name);
                                ql.retain(|(n, _)| n != "quantile");
                                ql.push(("quantile".into(), format_bound(q.quantile)));
                                b.float(ql, t, start, v(q.value));
                            }
                        }
                    }
                }
            }
        }
        // target_info: the resource's other attributes, when there are any and a job or
        // instance to join them on.
        let identifying = ["service.name", "service.namespace", "service.instance.id"];
        let others: Vec<KeyValue> = rattrs
            .iter()
            .filter(|kv| cfg.keep_identifying_resource_attributes || !identifying.contains(&kv.key.as_str()))
            .cloned()
            .collect();
        let has_other = rattrs.iter().any(|kv| !identifying.contains(&kv.key.as_str()));
        if has_other && latest > 0 && (job.is_some() || instance.is_some()) {
            let mut l = attribute_labels(&others, strategy);
            for (k, v) in [("job", &job), ("instance", &instance)] {
                if let Some(v) = v {
                    l.retain(|(n, _)| n != k);
                    l.push((k.to_owned(), v.clone()));
                }
            }
            l.push(("__name__".into(), "target_info".into()));
            b.float(l, latest, 0, 1.0);
        }
    }
    b.out.metadata = families.into_iter().map(|(n, (t, h, u))| (n, t, h, u)).collect();
    b.out
}

/// Whether a metric's points are cumulative; other temporalities are refused, counted and named.
fn cumulative(b: &mut Builder, metric: &str, temporality: i32, points: usize) -> bool {
    if temporality == TEMPORALITY_CUMULATIVE {
        return true;
    }
    let which = if temporality == TEMPORALITY_DELTA { "delta" } else { "unspecified" };
    b.reject(points, || {
        format!("metric {metric:?}: {which} temporality is not supported; configure the exporter for cumulative temporality")
    });
    false
}

fn number_point(b: &mut Builder, latest: &mut i64, labels: Vec<(String, String)>, p: &NumberDataPoint, metric: &str) {
    let t = ms(p.time_unix_nano);
    let v = if p.flags & FLAG_NO_RECORDED_VALUE != 0 {
        STALE
    } else {
        match p.value {
            Some(NumberValue::AsDouble(d)) => d,
            Some(NumberValue::AsInt(i)) => i as f64,
            None => {
                b.reject(1, || format!("metric {metric:?}: a data point has no value"));
                return;
            }
        }
    };
    *latest = (*latest).max(t);
    b.float(labels, t, ms(p.start_time_unix_nano), v);
}

/// A bucket bound or quantile as Prometheus writes it (Go's `FormatFloat(v, 'f', -1, 64)`).
fn format_bound(v: f64) -> String {
    if v.is_infinite() {
        return if v > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    if v.is_nan() {
        return "NaN".into();
    }
    format!("{v}")
}

fn classic_histogram(
    b: &mut Builder,
    latest: &mut i64,
    labels: Vec<(String, String)>,
    name: &str,
    p: &HistogramDataPoint,
) {
    let t = ms(p.time_unix_nano);
    let start = ms(p.start_time_unix_nano);
    *latest = (*latest).max(t);
    let stale = p.flags & FLAG_NO_RECORDED_VALUE != 0;
    let v = |x: f64| if stale { STALE } else { x };
    let named = |suffix: &str, extra: Option<(&str, String)>| {
        let mut l = labels.clone();
        l.retain(|(n, _)| n != "__name__" && extra.as_ref().is_none_or(|(k, _)| n != k));
        l.push(("__name__".into(), format!("{name}{suffix}")));
        if let Some((k, val)) = extra {
            l.push((k.to_owned(), val));
        }
        l
    };
    if let Some(sum) = p.sum {
        b.float(named("_sum", None), t, start, v(sum));
    }
    b.float(named("_count", None), t, start, v(p.count as f64));
    let mut cumulative = 0u64;
    for (bound, count) in p.explicit_bounds.iter().zip(&p.bucket_counts) {
        cumulative += count;
        b.float(named("_bucket", Some(("le", format_bound(*bound)))), t, start, v(cumulative as f64));
    }
    b.float(named("_bucket", Some(("le", "+Inf".into()))), t, start, v(p.count as f64));
}

/// Prometheus' default zero threshold, for points that send none.
const DEFAULT_ZERO_THRESHOLD: f64 = 1e-128;

/// An exponential histogram point as a native histogram: OpenTelemetry's bucket `i` at scale
/// `s` covers `(base^i, base^(i+1)]`, Prometheus' bucket `i` covers `(base^(i-1), base^i]`, so
/// indexes move by one; scales above 8 are merged down to 8 (Prometheus' finest schema).
pub fn native_histogram(p: &ExponentialHistogramDataPoint) -> Result<FloatHistogram, String> {
    let mut scale = p.scale;
    if scale < -4 {
        return Err(format!("exponential histogram scale {scale} is below -4, the coarsest native histogram schema"));
    }
    let mut down = 0;
    if scale > 8 {
        down = scale - 8;
        scale = 8;
    }
    let stale = p.flags & FLAG_NO_RECORDED_VALUE != 0;
    let (positive_spans, positive_buckets) = layout(p.positive.as_ref(), down);
    let (negative_spans, negative_buckets) = layout(p.negative.as_ref(), down);
    let sum = if stale { STALE } else { p.sum.unwrap_or(0.0) };
    if !stale && p.count == 0 && sum != 0.0 {
        return Err(format!("histogram data point has zero count, but non-zero sum: {sum}"));
    }
    Ok(FloatHistogram {
        hint: strata_model::CounterResetHint::Unknown,
        schema: scale,
        zero_threshold: if p.zero_threshold > 0.0 { p.zero_threshold } else { DEFAULT_ZERO_THRESHOLD },
        zero_count: p.zero_count as f64,
        count: if stale { STALE } else { p.count as f64 },
        sum,
        positive_spans,
        negative_spans,
        positive_buckets,
        negative_buckets,
        custom_values: Vec::new(),
    })
}

/// Buckets as spans and absolute counts, `down` scales coarser; gaps of one or two buckets are
/// filled with zeros rather than opening a span (as Prometheus lays them out).
fn layout(b: Option<&Buckets>, down: i32) -> (Vec<Span>, Vec<f64>) {
    let Some(b) = b else { return (Vec::new(), Vec::new()) };
    let mut merged: Vec<(i32, f64)> = Vec::new();
    for (i, &c) in b.bucket_counts.iter().enumerate() {
        let idx = ((b.offset + i as i32) >> down) + 1;
        match merged.last_mut() {
            Some((last, n)) if *last == idx => *n += c as f64,
            _ => merged.push((idx, c as f64)),
        }
    }
    // Empty buckets carry nothing: the spans skip them (short gaps refilled below).
    merged.retain(|(_, n)| *n != 0.0);
    let mut spans: Vec<Span> = Vec::new();
    let mut counts = Vec::with_capacity(merged.len());
    let mut next = None::<i32>;
    for (idx, n) in merged {
        match next {
            None => spans.push(Span { offset: idx, length: 1 }),
            Some(expected) => {
                let gap = idx - expected;
                if gap <= 2 {
                    counts.extend(std::iter::repeat_n(0.0, gap as usize));
                    spans.last_mut().expect("a span is open").length += gap as u32 + 1;
                } else {
                    spans.push(Span { offset: gap, length: 1 });
                }
            }
        }
        counts.push(n);
        next = Some(idx + 1);
    }
    (spans, counts)
}

#[cfg(test)]
mod tests;
