//! Graphite's HTTP API, as graphite-web serves it (also under `/graphite/`): so far
//! `/metrics/find` in graphite-web's `treejson` (its default, what Grafana's Graphite data
//! source reads) and `completer` formats. Paths are the `__name__` of stored series
//! (`docs/graphite.md`); reads go through the same slots, deadline and limits as PromQL's.

use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use strata_graphite::find::{find as find_nodes, Node};
use strata_graphite::glob::Glob;

use super::{db, limited_querier, run_query, ApiError, ApiResult, AppState, Params};

/// `from` and `until` of a find: epoch seconds, as graphite-web and Grafana send them.
fn seconds_param(p: &Params, name: &str, default: i64) -> Result<i64, ApiError> {
    match p.get(name) {
        None | Some("") => Ok(default),
        Some(s) => s
            .parse::<i64>()
            .ok()
            .and_then(|v| v.checked_mul(1000))
            .ok_or_else(|| ApiError::bad_data(format!("{name}={s:?} is not a number of seconds since the epoch"))),
    }
}

pub(super) async fn find(State(st): State<Arc<AppState>>, RawQuery(raw): RawQuery) -> ApiResult {
    let p = Params::from_query(raw);
    let query =
        p.get("query").filter(|q| !q.is_empty()).ok_or_else(|| ApiError::bad_data("missing parameter \"query\""))?;
    let glob = Glob::parse(query).map_err(|e| ApiError::bad_data(format!("query {query:?}: {e}")))?;
    let format = p.get("format").unwrap_or("treejson").to_owned();
    if !matches!(format.as_str(), "treejson" | "completer") {
        return Err(ApiError::bad_data(format!(
            "format {format:?} is not supported yet: use treejson (the default) or completer"
        )));
    }
    let (from, until) = (seconds_param(&p, "from", i64::MIN)?, seconds_param(&p, "until", i64::MAX)?);
    let db = db(&st)?;
    let st2 = st.clone();
    let nodes = run_query(&st, move |stopper| {
        let stop = || stopper.stop();
        let q = limited_querier(&db, &st2.limits, &stop, from, until);
        let paths = q.label_values("__name__", &[]).map_err(|e| ApiError::execution(e.to_string()))?;
        find_nodes(&glob, &paths, st2.limits.max_query_series).map_err(|e| ApiError::execution(e.to_string()))
    })
    .await?;
    let body = match format.as_str() {
        "completer" => completer(&nodes),
        _ => tree_json(&nodes),
    };
    Ok(([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response())
}

/// graphite-web's `treejson`: one object per node, branches expandable.
fn tree_json(nodes: &[Node]) -> Value {
    Value::Array(
        nodes
            .iter()
            .map(|n| {
                let branch = i32::from(!n.is_leaf);
                json!({
                    "allowChildren": branch,
                    "expandable": branch,
                    "leaf": i32::from(n.is_leaf),
                    "id": n.path,
                    "text": n.name(),
                    "context": {},
                })
            })
            .collect(),
    )
}

/// graphite-web's `completer`: a branch's path ends with a dot.
fn completer(nodes: &[Node]) -> Value {
    let metrics: Vec<Value> = nodes
        .iter()
        .map(|n| {
            let path = if n.is_leaf { n.path.clone() } else { format!("{}.", n.path) };
            json!({"path": path, "name": n.name(), "is_leaf": if n.is_leaf { "1" } else { "0" }})
        })
        .collect();
    json!({ "metrics": metrics })
}

/// A response for a request the router does not know under `/graphite/`: graphite-web's
/// endpoints not served yet, named.
pub(super) async fn not_yet(uri: axum::http::Uri) -> Response {
    ApiError::bad_data(format!("{} is not served yet (Graphite support so far: /metrics/find)", uri.path()))
        .into_response()
}
