//! OTLP/HTTP metrics requests, protobuf or JSON (first byte picks), decoded and converted to
//! Prometheus series (native histograms from exponential ones included).
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message as _;
use strata_server::otlp::{convert, json, proto::ExportMetricsServiceRequest, OtlpConfig};

fuzz_target!(|data: &[u8]| {
    let Some((&first, body)) = data.split_first() else { return };
    let req = if first & 1 == 0 {
        ExportMetricsServiceRequest::decode(body).ok()
    } else {
        json::decode(body).ok()
    };
    if let Some(req) = req {
        let cfg = OtlpConfig {
            promote_resource_attributes: vec!["k8s.pod.name".into()],
            keep_identifying_resource_attributes: first & 2 != 0,
            ..Default::default()
        };
        let out = convert(&req, &cfg);
        for (labels, points) in &out.series {
            assert!(labels.windows(2).all(|w| w[0].0 <= w[1].0), "labels sorted");
            assert_eq!(points.samples.len(), points.sample_starts.len());
            for (_, h) in &points.histograms {
                let spans: u32 = h.positive_spans.iter().map(|s| s.length).sum();
                assert_eq!(spans as usize, h.positive_buckets.len(), "spans cover the buckets");
            }
        }
    }
});
