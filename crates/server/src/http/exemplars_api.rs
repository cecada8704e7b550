//! `/api/v1/query_exemplars`: the exemplars of the series a query's selectors select, in a time
//! range, as Prometheus answers it. Every vector and range selector of the query is a matcher
//! set; a series is in the answer when it matches any of them and has exemplars in
//! `[start, end]` (both default to all time). The answer is a list of `{"seriesLabels": {…},
//! "exemplars": [{"labels": {…}, "value": "…", "timestamp": seconds}]}`, series in label order,
//! exemplars oldest first.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, Method};
use serde_json::{json, Value};
use strata_model::Matcher;
use strata_promql::ast::ExprKind;

use super::{db, format_value, labels_json, params, parse_promql, success, ApiError, ApiResult, AppState};

pub(super) async fn query_exemplars(
    State(st): State<Arc<AppState>>,
    method: Method,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let p = params(&st, &method, raw, &headers, body).await?;
    let q = p.query()?;
    let expr = parse_promql(&st, q)?;
    let (start, end) = (p.time("start", i64::MIN)?, p.time("end", i64::MAX)?);
    if end < start {
        return Err(ApiError::bad_data("invalid parameter \"end\": end timestamp must not be before start time"));
    }
    let sets = selectors(&expr);
    let db = db(&st)?;
    let found = db.head().exemplars.select(start, end, |labels| {
        sets.iter().any(|set| set.iter().all(|m| m.matches(labels.get(&m.name).unwrap_or(""))))
    });
    let out: Vec<Value> = found
        .iter()
        .map(|(series, exemplars)| {
            let exemplars: Vec<Value> = exemplars
                .iter()
                .map(|e| {
                    json!({
                        "labels": labels_json(&e.labels),
                        "value": format_value(e.v),
                        "timestamp": seconds(e.t),
                    })
                })
                .collect();
            json!({"seriesLabels": labels_json(series), "exemplars": exemplars})
        })
        .collect();
    Ok(success(Value::Array(out)))
}

/// The matcher sets of every vector and range selector in the query.
fn selectors(expr: &strata_promql::ast::Expr) -> Vec<Vec<Matcher>> {
    let mut sets = Vec::new();
    expr.walk(&mut |e| match &e.kind {
        ExprKind::Vector(v) => sets.push(v.matchers.clone()),
        ExprKind::Matrix(m) => sets.push(m.vector.matchers.clone()),
        _ => {}
    });
    sets
}

/// Milliseconds as a JSON number of seconds with up to three decimals, as Prometheus writes
/// times.
fn seconds(ms: i64) -> Value {
    let mut s = String::new();
    crate::query_json::seconds(&mut s, ms);
    serde_json::from_str(&s).expect("a decimal number")
}
