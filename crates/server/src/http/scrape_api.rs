//! The scrape side of the API: `/api/v1/targets`, `/api/v1/targets/metadata` and `/-/reload`,
//! in Prometheus' shapes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use strata_model::{parse_selector, Labels};

use super::{blocking, success, ApiError, ApiResult, AppState, Params};
use crate::scrape::relabel::LabelMap;

fn labels_json(l: &Labels) -> Value {
    Value::Object(l.iter().map(|l| (l.name.to_string(), Value::String(l.value.to_string()))).collect())
}

fn map_json(m: &LabelMap) -> Value {
    Value::Object(m.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect())
}

/// Go's RFC 3339 with nanoseconds, in UTC, as Prometheus renders `lastScrape`; the zero time
/// for never.
pub fn rfc3339(t: Option<SystemTime>) -> String {
    let Some(d) = t.and_then(|t| t.duration_since(UNIX_EPOCH).ok()) else {
        return "0001-01-01T00:00:00Z".into();
    };
    let secs = d.as_secs() as i64;
    let (y, m, day) = strata_model::civil::civil_from_days(secs.div_euclid(86_400));
    let s = secs.rem_euclid(86_400);
    let mut out = format!("{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
    let nanos = d.subsec_nanos();
    if nanos > 0 {
        let frac = format!("{nanos:09}");
        out.push('.');
        out.push_str(frac.trim_end_matches('0'));
    }
    out.push('Z');
    out
}

pub(super) fn parse_limit(v: Option<&str>, name: &str) -> Result<Option<usize>, ApiError> {
    match v {
        None | Some("") => Ok(None),
        Some(v) => match v.parse::<i64>() {
            Ok(n) if n <= 0 => Ok(None),
            Ok(n) => Ok(Some(n as usize)),
            Err(_) => Err(ApiError::bad_data(format!("invalid parameter {name:?}: {v:?} is not a number"))),
        },
    }
}

pub(super) async fn targets(State(st): State<Arc<AppState>>, RawQuery(raw): RawQuery) -> ApiResult {
    let p = Params::from_query(raw);
    let which = p.get("state").unwrap_or("any").to_ascii_lowercase();
    let (active, dropped) = match which.as_str() {
        "" | "any" => (true, true),
        "active" => (true, false),
        "dropped" => (false, true),
        other => {
            return Err(ApiError::bad_data(format!(
                "invalid parameter \"state\": {other:?} (expected active, dropped or any)"
            )))
        }
    };
    let pool = p.get("scrapePool").map(str::to_owned);
    let in_pool = |name: &str| pool.as_deref().is_none_or(|p| p == name);
    let mut out = Map::new();
    let scrape = st.scrape.get();
    if active {
        let mut list = Vec::new();
        for t in scrape.map(|s| s.active_targets()).unwrap_or_default() {
            if !in_pool(&t.pool) {
                continue;
            }
            let health = match t.health.up {
                None => "unknown",
                Some(true) => "up",
                Some(false) => "down",
            };
            list.push(json!({
                "discoveredLabels": map_json(&t.target.discovered),
                "labels": labels_json(&t.target.labels),
                "scrapePool": t.pool,
                "scrapeUrl": t.target.url,
                "globalUrl": t.target.url,
                "lastError": t.health.last_error,
                "lastScrape": rfc3339(t.health.last_scrape),
                "lastScrapeDuration": t.health.last_duration.as_secs_f64(),
                "health": health,
                "scrapeInterval": t.target.interval.to_string(),
                "scrapeTimeout": t.target.timeout.to_string(),
            }));
        }
        out.insert("activeTargets".into(), Value::Array(list));
    }
    if dropped {
        let mut list = Vec::new();
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for (name, labels) in scrape.map(|s| s.dropped_targets()).unwrap_or_default() {
            if !in_pool(&name) {
                continue;
            }
            *counts.entry(name.clone()).or_default() += 1;
            list.push(json!({"discoveredLabels": map_json(&labels), "scrapePool": name}));
        }
        out.insert("droppedTargets".into(), Value::Array(list));
        out.insert("droppedTargetCounts".into(), json!(counts));
    }
    Ok(success(Value::Object(out)))
}

/// `match_target` (a label selector on target labels), `metric` and `limit`, as in Prometheus.
pub(super) async fn targets_metadata(State(st): State<Arc<AppState>>, RawQuery(raw): RawQuery) -> ApiResult {
    let p = Params::from_query(raw);
    let matchers = match p.get("match_target") {
        None | Some("") => Vec::new(),
        Some(s) => {
            parse_selector(s).map_err(|e| ApiError::bad_data(format!("invalid parameter \"match_target\": {e}")))?
        }
    };
    let metric = p.get("metric").filter(|m| !m.is_empty());
    let limit = parse_limit(p.get("limit"), "limit")?;
    let mut list = Vec::new();
    if let Some(scrape) = st.scrape.get() {
        'targets: for (target, metadata) in scrape.targets_metadata() {
            if !matchers.iter().all(|m| m.matches(target.labels.get(&m.name).unwrap_or(""))) {
                continue;
            }
            for (family, md) in metadata {
                if metric.is_some_and(|m| m != family) {
                    continue;
                }
                if limit.is_some_and(|l| list.len() >= l) {
                    break 'targets;
                }
                list.push(json!({
                    "target": labels_json(&target.labels),
                    "metric": family,
                    "type": md.kind,
                    "help": md.help,
                    "unit": md.unit,
                }));
            }
        }
    }
    Ok(success(Value::Array(list)))
}

/// `POST /-/reload` (with `--web.enable-lifecycle`, else 403): 200 when the configuration was
/// applied, 500 with the reason when not (the running configuration then stays), as
/// Prometheus answers.
/// `/api/v1/targets/relabel_steps?scrapePool=…&labels={…}`: the pool's relabeling applied to
/// the given (discovered) labels one rule at a time, as Prometheus 3's API shows it.
pub(super) async fn relabel_steps(State(st): State<Arc<AppState>>, RawQuery(raw): RawQuery) -> ApiResult {
    let p = Params::from_query(raw);
    let pool = p
        .get("scrapePool")
        .filter(|s| !s.is_empty())
        .ok_or_else(|| ApiError::bad_data("missing parameter \"scrapePool\""))?;
    let labels = p.get("labels").ok_or_else(|| ApiError::bad_data("missing parameter \"labels\""))?;
    let labels: LabelMap = serde_json::from_str(labels).map_err(|e| {
        ApiError::bad_data(format!(
            "invalid parameter \"labels\": {e} (expected a JSON object of label names to values)"
        ))
    })?;
    let rules = st
        .scrape
        .get()
        .and_then(|s| s.relabel_configs(pool))
        .ok_or_else(|| ApiError::not_found(format!("scrape pool {pool:?} not found")))?;
    let steps: Vec<Value> = crate::scrape::relabel::steps(&rules, labels)
        .into_iter()
        .zip(&rules)
        .map(|((out, keep), rule)| json!({"rule": rule.to_json(), "output": map_json(&out), "keep": keep}))
        .collect();
    Ok(success(json!({"steps": steps})))
}

pub(super) async fn reload(State(st): State<Arc<AppState>>) -> Result<Response, ApiError> {
    if let Some(refused) = super::lifecycle_refusal(&st) {
        return Ok(refused);
    }
    let st2 = st.clone();
    let res = blocking(move || st2.reload_config()).await?;
    Ok(match res {
        Ok(()) => (StatusCode::OK, "").into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("failed to reload config: {e}\n")).into_response(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_render_like_go() {
        assert_eq!(rfc3339(None), "0001-01-01T00:00:00Z");
        let t = UNIX_EPOCH + std::time::Duration::from_millis(1_484_665_664_723);
        assert_eq!(rfc3339(Some(t)), "2017-01-17T15:07:44.723Z");
        assert_eq!(rfc3339(Some(UNIX_EPOCH + std::time::Duration::from_secs(86_400))), "1970-01-02T00:00:00Z");
    }
}
