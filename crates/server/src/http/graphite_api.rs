//! Graphite's HTTP API, as graphite-web serves it (also under `/graphite/`): so far
//! `/metrics/find` in graphite-web's `treejson` (its default, what Grafana's Graphite data
//! source reads) and `completer` formats, and `/render` of paths and globs (no functions yet)
//! in the `json`, `csv` and `raw` formats. Paths are the `__name__` of stored series
//! (`docs/graphite.md`); reads go through the same slots, deadline and limits as PromQL's.

use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::http::header;
use axum::response::IntoResponse;
use serde_json::{json, Value};
use strata_graphite::attime::parse_at_time;
use strata_graphite::find::{find as find_nodes, Node};
use strata_graphite::glob::Glob;
use strata_graphite::render::{to_csv, to_json, to_raw, Series as RenderSeries};

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

/// `/metrics/expand`: the paths every `query` glob matches (branches too unless
/// `leavesOnly=1`), one sorted list, or per query with `groupByExpr=1`, as graphite-web answers.
pub(super) async fn expand(State(st): State<Arc<AppState>>, RawQuery(raw): RawQuery) -> ApiResult {
    let p = Params::from_query(raw);
    let flag = |name: &str| p.get(name).is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    let (leaves_only, group) = (flag("leavesOnly"), flag("groupByExpr"));
    let queries: Vec<String> = p.all("query").into_iter().filter(|q| !q.is_empty()).map(str::to_owned).collect();
    if queries.is_empty() {
        return Err(ApiError::bad_data("missing parameter \"query\""));
    }
    let mut globs = Vec::with_capacity(queries.len());
    for q in &queries {
        globs.push(Glob::parse(q).map_err(|e| ApiError::bad_data(format!("query {q:?}: {e}")))?);
    }
    let db = db(&st)?;
    let st2 = st.clone();
    let found = run_query(&st, move |stopper| {
        let stop = || stopper.stop();
        let q = limited_querier(&db, &st2.limits, &stop, i64::MIN, i64::MAX);
        let paths = q.label_values("__name__", &[]).map_err(|e| ApiError::execution(e.to_string()))?;
        let mut out = Vec::with_capacity(globs.len());
        for g in &globs {
            let nodes =
                find_nodes(g, &paths, st2.limits.max_query_series).map_err(|e| ApiError::execution(e.to_string()))?;
            out.push(nodes.into_iter().filter(|n| n.is_leaf || !leaves_only).map(|n| n.path).collect::<Vec<_>>());
        }
        Ok(out)
    })
    .await?;
    let results = if group {
        Value::Object(queries.into_iter().zip(found).map(|(q, paths)| (q, json!(paths))).collect())
    } else {
        let all: std::collections::BTreeSet<String> = found.into_iter().flatten().collect();
        json!(all)
    };
    Ok(([(header::CONTENT_TYPE, "application/json")], json!({ "results": results }).to_string()).into_response())
}

/// `/metrics/index.json`: every path, sorted, as graphite-web lists its index.
pub(super) async fn index_json(State(st): State<Arc<AppState>>) -> ApiResult {
    let db = db(&st)?;
    let st2 = st.clone();
    let paths = run_query(&st, move |stopper| {
        let stop = || stopper.stop();
        let q = limited_querier(&db, &st2.limits, &stop, i64::MIN, i64::MAX);
        let paths = q.label_values("__name__", &[]).map_err(|e| ApiError::execution(e.to_string()))?;
        if paths.len() > st2.limits.max_query_series {
            return Err(ApiError::execution(format!(
                "the index holds more than {} paths (--query.max-series)",
                st2.limits.max_query_series
            )));
        }
        Ok(paths)
    })
    .await?;
    Ok(([(header::CONTENT_TYPE, "application/json")], json!(paths).to_string()).into_response())
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

/// `/render`: every `target` (a path or a glob), over `from`..`until` in Graphite's time
/// syntax (default the last 24 hours), at the resolution the path's retention schema gives for
/// that range, as whisper would answer for the same points (`strata_graphite::render`).
pub(super) async fn render(State(st): State<Arc<AppState>>, RawQuery(raw): RawQuery) -> ApiResult {
    let p = Params::from_query(raw);
    let targets: Vec<String> = p.all("target").into_iter().filter(|t| !t.is_empty()).map(str::to_owned).collect();
    let format = p.get("format").unwrap_or("json").to_owned();
    if !matches!(format.as_str(), "json" | "csv" | "raw") {
        return Err(ApiError::bad_data(format!(
            "format {format:?} is not supported yet: use json (the default here), csv or raw"
        )));
    }
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    let at = |name: &str, default: &str| {
        let text = p.get(name).filter(|s| !s.is_empty()).unwrap_or(default);
        parse_at_time(text, now)
            .ok_or_else(|| ApiError::bad_data(format!("{name}={text:?} is not a time Graphite understands")))
    };
    let (from, until) = (at("from", "-24h")?, at("until", "now")?);
    if from >= until {
        return Err(ApiError::bad_data(format!("from ({from}) is not before until ({until})")));
    }
    let max_data_points = match p.get("maxDataPoints").filter(|s| !s.is_empty()) {
        None => None,
        Some(s) => Some(
            s.parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 1.0)
                .ok_or_else(|| ApiError::bad_data(format!("maxDataPoints={s:?} is not a positive number")))?
                as usize,
        ),
    };
    let mut globs = Vec::with_capacity(targets.len());
    for t in &targets {
        if t.contains('(') {
            return Err(ApiError::bad_data(format!(
                "target {t:?}: Graphite functions (and seriesByTag) are not supported yet; plain paths and globs are"
            )));
        }
        globs.push(Glob::parse(t).map_err(|e| ApiError::bad_data(format!("target {t:?}: {e}")))?);
    }
    let schemas = st.graphite_schemas.lock().clone();
    let db = db(&st)?;
    let st2 = st.clone();
    let mut series = run_query(&st, move |stopper| {
        let stop = || stopper.stop();
        let (mint, maxt) = (from.saturating_mul(1000), until.saturating_add(RENDER_SLACK_S).saturating_mul(1000));
        let q = limited_querier(&db, &st2.limits, &stop, mint, maxt);
        let execution = |e: &dyn std::fmt::Display| ApiError::execution(e.to_string());
        let names = q.label_values("__name__", &[]).map_err(|e| execution(&e))?;
        let mut out = Vec::new();
        for glob in &globs {
            let nodes = find_nodes(glob, &names, st2.limits.max_query_series).map_err(|e| execution(&e))?;
            for node in nodes.iter().filter(|n| n.is_leaf) {
                let m = strata_model::Matcher::new(strata_model::MatchOp::Equal, "__name__", node.path.as_str())
                    .map_err(|e| execution(&e))?;
                for s in q.select(&[m]).map_err(|e| execution(&e))? {
                    let samples: Vec<(i64, f64)> = s.samples().iter().map(|x| (x.t, x.v)).collect();
                    let mut tags: Vec<(String, String)> = vec![("name".into(), node.path.clone())];
                    tags.extend(
                        s.labels
                            .iter()
                            .filter(|l| &*l.name != "__name__")
                            .map(|l| (l.name.to_string(), l.value.to_string())),
                    );
                    tags.sort();
                    let name = graphite_name(&node.path, &tags);
                    let policy = schemas.policy(&name);
                    if let Some((start, end, step, values)) =
                        strata_graphite::render::fetch(&samples, &policy, from, until, now)
                    {
                        out.push(RenderSeries { name, tags, start, end, step, values });
                    }
                }
            }
        }
        Ok(out)
    })
    .await?;
    let (body, content_type) = match format.as_str() {
        "csv" => (to_csv(&series), "text/csv"),
        "raw" => (to_raw(&series), "text/plain"),
        _ => (to_json(&mut series, max_data_points, until - from), "application/json"),
    };
    Ok(([(header::CONTENT_TYPE, content_type)], body).into_response())
}

/// Past `until`, the seconds of samples a render reads: whisper answers the interval after
/// `until`, up to a day long for the coarsest archives in use.
const RENDER_SLACK_S: i64 = 86_400;

/// The Graphite name of a series: its path, and `;tag=value` for every other label, in tag
/// order (Graphite 1.1's canonical tagged form).
fn graphite_name(path: &str, tags: &[(String, String)]) -> String {
    let mut name = path.to_owned();
    for (k, v) in tags.iter().filter(|(k, _)| k != "name") {
        name.push(';');
        name.push_str(k);
        name.push('=');
        name.push_str(v);
    }
    name
}
