//! `POST /api/v1/otlp/v1/metrics` (Prometheus' path; also `/opentelemetry/v1/metrics`,
//! VictoriaMetrics'): OTLP/HTTP metrics, protobuf or JSON, gzip or not (`crate::otlp`).
//!
//! The answer is OTLP's: 200 with an `ExportMetricsServiceResponse` in the request's encoding,
//! whose `partial_success` counts and names what was refused (delta temporality, bad points,
//! samples the head refused); 400 for a request that does not decode, 413 past the size
//! limits, 415 for another content type.

use std::io::Read as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use prost::Message as _;

use super::{append_all, blocking, check_write_size, db, read_body, ApiError, ApiResult, AppState, WriteSeries};
use crate::otlp::proto::{ExportMetricsPartialSuccess, ExportMetricsServiceRequest, ExportMetricsServiceResponse};

pub(super) async fn metrics(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> ApiResult {
    let db = db(&st)?;
    let json = match headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) {
        None => false,
        Some(ct) => match ct.split(';').next().unwrap_or("").trim() {
            "application/x-protobuf" | "application/protobuf" => false,
            "application/json" => true,
            other => {
                return Err(ApiError::unsupported(format!(
                    "unsupported content type {other:?}: OTLP/HTTP is application/x-protobuf or application/json"
                )))
            }
        },
    };
    let gzip = match headers.get(header::CONTENT_ENCODING).and_then(|v| v.to_str().ok()) {
        None | Some("identity") => false,
        Some("gzip") => true,
        Some(other) => return Err(ApiError::unsupported(format!("unsupported content encoding {other:?}"))),
    };
    let body = read_body(&st, body).await?;
    let st2 = st.clone();
    blocking(move || -> ApiResult {
        let limits = &st2.limits;
        let raw = if gzip {
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(&body[..])
                .take(limits.max_decompressed_bytes as u64 + 1)
                .read_to_end(&mut out)
                .map_err(|e| ApiError::bad_data(format!("gzip: {e}")))?;
            if out.len() > limits.max_decompressed_bytes {
                return Err(ApiError::too_large(format!(
                    "decompressed body exceeds {} bytes",
                    limits.max_decompressed_bytes
                )));
            }
            out
        } else {
            body.to_vec()
        };
        let req = if json {
            crate::otlp::json::decode(&raw).map_err(ApiError::bad_data)?
        } else {
            ExportMetricsServiceRequest::decode(&raw[..])
                .map_err(|e| ApiError::bad_data(format!("invalid OTLP protobuf: {e}")))?
        };
        let cfg = st2.otlp.lock().clone();
        let converted = crate::otlp::convert(&req, &cfg);
        let samples: usize = converted.series.iter().map(|(_, p)| p.samples.len() + p.histograms.len()).sum();
        check_write_size(limits, converted.series.len(), samples)?;
        if !converted.metadata.is_empty() {
            let mut m = st2.metadata.lock();
            for (name, kind, help, unit) in &converted.metadata {
                m.insert(name.clone(), ((*kind).to_owned(), help.clone(), unit.clone()));
            }
        }
        let series = converted.series.iter().map(|(labels, p)| -> WriteSeries<'_, String> {
            (
                Ok(&labels[..]),
                (&p.samples[..], &p.sample_starts[..]),
                (&p.histograms[..], &p.histogram_starts[..]),
                &[][..],
            )
        });
        let out = append_all(&db, limits, series).map_err(ApiError::internal)?;
        let rejected = converted.rejected + out.rejected;
        st2.metrics.otlp_samples_received.fetch_add(out.appended as u64, Ordering::Relaxed);
        st2.metrics.otlp_samples_rejected.fetch_add(rejected as u64, Ordering::Relaxed);
        let mut reasons = converted.errors;
        reasons.extend(out.first_error);
        if !reasons.is_empty() {
            tracing::warn!(rejected, first = %reasons[0], "OTLP: data points refused");
        }
        let partial = (rejected > 0).then(|| ExportMetricsPartialSuccess {
            rejected_data_points: rejected as i64,
            error_message: reasons.join("; "),
        });
        Ok(respond(json, partial))
    })
    .await?
}

fn respond(json: bool, partial: Option<ExportMetricsPartialSuccess>) -> Response {
    if json {
        let body = match &partial {
            None => serde_json::json!({}),
            Some(p) => serde_json::json!({"partialSuccess": {
                "rejectedDataPoints": p.rejected_data_points.to_string(),
                "errorMessage": p.error_message,
            }}),
        };
        (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
    } else {
        let body = ExportMetricsServiceResponse { partial_success: partial }.encode_to_vec();
        (StatusCode::OK, [(header::CONTENT_TYPE, "application/x-protobuf")], body).into_response()
    }
}
