//! Graphite's events API, as graphite-web serves it (also under `/graphite/`): `POST /events/`
//! stores an event (a JSON object: `what`, `when`, `tags`, `data`), `GET /events/get_data`
//! lists them (`from`, `until`, `tags`, `set=union|intersection`, `jsonp`), which is what
//! Grafana's Graphite annotations read, and `GET /events/<id>` answers one. `events(...)` in
//! `/render` counts them (`graphite_api`). The store is `strata_graphite::events`: an
//! append-only log under the data directory, each event synced before the post is answered,
//! events older than the retention dropped.

use std::path::Path;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{header, Method, StatusCode};
use axum::response::IntoResponse;
use parking_lot::Mutex;
use serde_json::Value;
use strata_graphite::attime::parse_at_time;
use strata_graphite::events::{EventError, EventLog, NewEvent, TagMatch};

use super::graphite_api::{json_or_jsonp, jsonp_param};
use super::{read_body, ApiError, ApiResult, AppState, Params};

/// The server's events and how long it keeps them.
#[derive(Debug)]
pub struct GraphiteEvents {
    log: Mutex<EventLog>,
    /// The retention, milliseconds (0: kept for ever).
    keep_for_ms: i64,
}

impl GraphiteEvents {
    /// Opens the events log in `dir`, saying loudly what it had to repair or set aside.
    pub fn open(dir: &Path, max_events: usize, keep_for_ms: i64) -> Result<GraphiteEvents, String> {
        let keep_since = keep_since_us(keep_for_ms);
        let (log, opened) =
            EventLog::open(dir, max_events, keep_since).map_err(|e| format!("cannot open the Graphite events: {e}"))?;
        if let Some(d) = opened.damage {
            match &d.set_aside {
                None => tracing::warn!(offset = d.offset, reason = %d.reason, kept = d.kept, dir = %dir.display(),
                    "the Graphite events log ended in a torn record (a write cut by a crash, never acknowledged); cut it off"),
                Some(aside) => {
                    tracing::error!(offset = d.offset, reason = %d.reason, kept = d.kept, set_aside = %aside.display(),
                    "the Graphite events log is damaged: kept the events before the damage, moved the file aside")
                }
            }
        }
        if opened.expired > 0 {
            tracing::info!(dropped = opened.expired, "Graphite events older than the retention dropped");
        }
        Ok(GraphiteEvents { log: Mutex::new(log), keep_for_ms })
    }

    /// For `events(...)`: the epoch seconds of the events with all of `tags` (every event for
    /// `None`) from `from` to `until`, both included.
    pub(super) fn times(&self, tags: Option<&[String]>, from: i64, until: i64) -> Vec<i64> {
        let (from_us, until_us) = (from.saturating_mul(1_000_000), until.saturating_mul(1_000_000));
        self.log.lock().find(from_us, until_us, tags, TagMatch::All).map(|e| e.when_s()).collect()
    }
}

fn now_us() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64)
}

fn keep_since_us(keep_for_ms: i64) -> i64 {
    match keep_for_ms {
        0 => i64::MIN,
        ms => now_us().saturating_sub(ms.saturating_mul(1000)),
    }
}

fn store(st: &AppState) -> Result<Arc<GraphiteEvents>, ApiError> {
    st.graphite_events.get().cloned().ok_or_else(|| ApiError::unavailable("not ready: the events are being opened"))
}

/// `/events/`: `POST` stores an event (answered 200 with no body, as graphite-web does);
/// `GET` lists them as `get_data` does (graphite-web draws an HTML page there).
pub(super) async fn events(
    State(st): State<Arc<AppState>>,
    method: Method,
    RawQuery(raw): RawQuery,
    body: Body,
) -> ApiResult {
    if method != Method::POST {
        return get_data(State(st), RawQuery(raw)).await;
    }
    let events = store(&st)?;
    let body = read_body(&st, body).await?;
    let event = NewEvent::from_json(&body, now_us()).map_err(|e| ApiError::bad_data(e.to_string()))?;
    let added = tokio::task::spawn_blocking(move || {
        let keep_since = keep_since_us(events.keep_for_ms);
        events.log.lock().add(event, keep_since).map(|e| e.id)
    })
    .await
    .map_err(|e| ApiError::internal(format!("storing the event: {e}")))?;
    match added {
        Ok(_) => Ok(StatusCode::OK.into_response()),
        Err(e @ EventError::Full(_)) => {
            Err(ApiError { status: StatusCode::INSUFFICIENT_STORAGE, kind: "unavailable", message: e.to_string() })
        }
        Err(e @ EventError::BadEvent(_)) => Err(ApiError::bad_data(e.to_string())),
        Err(e @ EventError::Io { .. }) => {
            tracing::error!(error = %e, "cannot store a Graphite event");
            Err(ApiError::internal(e.to_string()))
        }
    }
}

/// `/events/get_data`: the events from `from` (default: all) to `until` (default: now), in
/// time order, with the `tags` (space-separated: all of them, or any with `set=union`); JSONP
/// with `jsonp=callback`.
pub(super) async fn get_data(State(st): State<Arc<AppState>>, RawQuery(raw): RawQuery) -> ApiResult {
    let events = store(&st)?;
    let p = Params::from_query(raw);
    let tz = st.graphite_time_zone.lock().clone();
    let now = now_us().div_euclid(1_000_000);
    let at = |name: &str, default: i64| match p.get(name) {
        None => Ok(default),
        Some(text) => parse_at_time(text, now, &tz)
            .ok_or_else(|| ApiError::bad_data(format!("{name}={text:?} is not a time Graphite understands"))),
    };
    let (from, until) = (at("from", 0)?, at("until", now)?);
    let jsonp = jsonp_param(&p)?;
    // graphite-web splits at single spaces; an empty word names no tag and is passed over,
    // and tags given but all empty select nothing.
    let tags: Option<Vec<String>> =
        p.get("tags").map(|t| t.split(' ').filter(|w| !w.is_empty()).map(str::to_owned).collect());
    let how = match p.get("set") {
        Some("union") => TagMatch::Any,
        _ => TagMatch::All,
    };
    let listed: Vec<Value> = events
        .log
        .lock()
        .find(from.saturating_mul(1_000_000), until.saturating_mul(1_000_000), tags.as_deref(), how)
        .map(|e| e.to_json())
        .collect();
    Ok(json_or_jsonp(Value::Array(listed).to_string().into_bytes(), jsonp.as_deref()))
}

/// `/events/<id>`: one event, as `get_data` lists it.
pub(super) async fn event(
    State(st): State<Arc<AppState>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> ApiResult {
    let events = store(&st)?;
    let id: u64 = id.trim_end_matches('/').parse().map_err(|_| ApiError::not_found(format!("no event {id:?}")))?;
    let found = events.log.lock().get(id).map(|e| e.to_json());
    match found {
        Some(e) => Ok(([(header::CONTENT_TYPE, "application/json")], e.to_string()).into_response()),
        None => Err(ApiError::not_found(format!("no event {id}"))),
    }
}
