//! `strata serve`'s HTTP API: Prometheus' endpoints and JSON shapes, remote write and read,
//! import and export, health, and `/metrics`.
//!
//! Storage work runs on blocking threads (`spawn_blocking`): appends and queries take locks and
//! can run for a while, and an appender must never be held across an `.await`. Every request is
//! bounded: body bytes (and their decompressed size), series and samples per write, samples and
//! series per query, query time, and concurrent queries (queued, then 503).

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use flate2::write::GzEncoder;
use flate2::Compression;
use parking_lot::Mutex;
use serde_json::{json, Value};
use strata_model::{parse_selector, FloatHistogram, Labels, MatchOp, Matcher, Sample};
use strata_promql::ast::ValueType;
use strata_promql::{Engine, EngineOptions, EvalError, SourceResolution};
use strata_tsdb::chunkenc::TypedValue;
use strata_tsdb::head::exemplars::Exemplar;
use strata_tsdb::querier::Series;
use strata_tsdb::Db;

use crate::metrics::ServerMetrics;
use crate::query_cache;
use crate::remote::{self, DecodeError};
use crate::scrape::scrape_loop::now_ms;
use crate::textparse::{Entry, Format, Parser};
use crate::timeparse::{parse_duration_param_ms, parse_time_ms};

/// Prometheus' default lookback for instant selectors.
pub const LOOKBACK_MS: i64 = 5 * 60 * 1000;

/// Every per-request limit; each has a flag in `strata serve`.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Bytes of a request body as sent (compressed for remote write/read).
    pub max_body_bytes: usize,
    /// Bytes of a remote-write/read body after snappy decompression.
    pub max_decompressed_bytes: usize,
    pub max_series_per_write: usize,
    pub max_samples_per_write: usize,
    /// Samples a query may load into memory (Prometheus' `--query.max-samples`).
    pub max_query_samples: usize,
    /// Series a query may select.
    pub max_query_series: usize,
    pub query_timeout: Duration,
    pub max_concurrent_queries: usize,
    /// Threads one query's selections and evaluation use at most (`--query.parallelism`): with
    /// fewer than the cores, a heavy query leaves the rest to the queries beside it.
    pub query_parallelism: usize,
    /// How long a request body may take to arrive (slow clients).
    pub body_read_timeout: Duration,
    /// Samples further than this in the future are refused (clock skew is fine, year 3000 is not).
    pub max_future_ms: i64,
    /// How far back an instant selector looks (`--query.lookback-delta`; Prometheus' 5m).
    pub lookback_ms: i64,
    /// Bytes of range query results kept for refreshes (`--query.cache-size`; 0: no cache).
    pub query_cache_bytes: usize,
    /// Steps newer than this behind the wall clock are never kept (`--query.cache-delay`).
    pub query_cache_delay_ms: i64,
    /// Samples older than this are refused (the retention: they would be deleted at once);
    /// 0 accepts any age the head takes.
    pub max_age_ms: i64,
    /// Experimental PromQL features enabled (`--enable-feature`), off by default.
    pub query_features: strata_promql::Features,
    /// Nesting a query may have (`--query.max-depth`); at most
    /// `strata_promql::parser::MAX_DEPTH_DEFAULT`, which the server's threads have stack for.
    pub max_query_depth: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 32 << 20,
            max_decompressed_bytes: 128 << 20,
            max_series_per_write: 100_000,
            max_samples_per_write: 1_000_000,
            max_query_samples: 50_000_000,
            max_query_series: 1_000_000,
            query_timeout: Duration::from_secs(120),
            lookback_ms: LOOKBACK_MS,
            query_cache_bytes: 64 << 20,
            query_cache_delay_ms: LOOKBACK_MS,
            max_concurrent_queries: 20,
            query_parallelism: std::thread::available_parallelism().map_or(1, |n| n.get()),
            body_read_timeout: Duration::from_secs(30),
            max_future_ms: 24 * 3600 * 1000,
            max_age_ms: 0,
            query_features: strata_promql::Features::default(),
            max_query_depth: strata_promql::parser::MAX_DEPTH_DEFAULT,
        }
    }
}

/// Endpoints that change or stop the server, off unless turned on by the flags Prometheus
/// names them by.
#[derive(Clone, Copy, Debug, Default)]
pub struct ApiSwitches {
    /// `--web.enable-admin-api`: `/api/v1/admin/tsdb/*` (delete series, clean tombstones,
    /// snapshot).
    pub admin: bool,
    /// `--web.enable-lifecycle`: `/-/reload` and `/-/quit`.
    pub lifecycle: bool,
}

/// Shared by every handler.
#[derive(Debug)]
pub struct AppState {
    /// Set once the WAL is replayed; until then storage endpoints answer 503.
    pub db: OnceLock<Arc<Db>>,
    pub limits: Limits,
    pub switches: ApiSwitches,
    /// `/-/quit` asks the server to shut down through this (set by the binary).
    pub quit: OnceLock<tokio::sync::mpsc::Sender<()>>,
    pub metrics: ServerMetrics,
    query_slots: tokio::sync::Semaphore,
    started: std::time::SystemTime,
    /// Command-line flags as given, for `/api/v1/status/flags`.
    pub flags: BTreeMap<String, String>,
    /// The configuration's text, for `/api/v1/status/config` (replaced by a reload).
    pub config_yaml: Mutex<String>,
    /// Set once the database is open and scraping runs.
    pub scrape: OnceLock<Arc<crate::scrape::ScrapeManager>>,
    /// How OTLP metrics become series (the configuration's `otlp` section; replaced by a reload).
    pub otlp: Mutex<crate::otlp::OtlpConfig>,
    /// Recording and alerting rules, set once the database is open.
    pub rules: OnceLock<Arc<crate::rules::RuleManager>>,
    /// Re-reads the configuration file (`POST /-/reload`, SIGHUP); set by the binary. Run it
    /// through `reload_config`, which keeps `last_reload`.
    pub reloader: OnceLock<Reloader>,
    /// Whether the last reload applied, and when one last did (the start until then).
    last_reload: Mutex<LastReload>,
    /// `global.external_labels`: added to `/federate` output, as Prometheus does (replaced by a
    /// reload).
    pub external_labels: Mutex<Vec<(String, String)>>,
    /// Graphite's retention schemas (`--graphite.storage-schemas`), for `/render`.
    pub graphite_schemas: Mutex<Arc<strata_graphite::schema::Schemas>>,
    /// The zone `/render` reads days and clock times in and writes CSV times in, unless a
    /// request names its own `tz` (`--graphite.time-zone`; graphite-web's `TIME_ZONE`).
    pub graphite_time_zone: Mutex<strata_graphite::attime::TimeZone>,
    /// Graphite's events (`/events/`, `events(...)`), set once the database is open.
    pub graphite_events: OnceLock<Arc<GraphiteEvents>>,
    /// Latest metadata per metric family (from remote write), for `/api/v1/metadata`.
    metadata: Mutex<HashMap<String, (String, String, String)>>,
    /// The range query result cache (`--query.cache-size`; none when 0). The binary makes the
    /// database note late writes from its delay back (`ChangeLog::watch`) before queries run.
    pub query_cache: Option<Arc<crate::query_cache::QueryCache>>,
    /// Where browsers reach the server (`--web.external-url`, `--web.route-prefix`), for the
    /// web UI; set by the binary before the router is built (default: `/`).
    pub web_paths: OnceLock<crate::ui::WebPaths>,
}

impl AppState {
    pub fn new(
        limits: Limits,
        switches: ApiSwitches,
        flags: BTreeMap<String, String>,
        config_yaml: String,
    ) -> Arc<AppState> {
        let query_cache = (limits.query_cache_bytes > 0).then(|| {
            Arc::new(crate::query_cache::QueryCache::new(limits.query_cache_bytes, limits.query_cache_delay_ms))
        });
        Arc::new(AppState {
            db: OnceLock::new(),
            query_slots: tokio::sync::Semaphore::new(limits.max_concurrent_queries.max(1)),
            limits,
            switches,
            quit: OnceLock::new(),
            metrics: ServerMetrics::default(),
            started: std::time::SystemTime::now(),
            flags,
            config_yaml: Mutex::new(config_yaml),
            scrape: OnceLock::new(),
            rules: OnceLock::new(),
            otlp: Mutex::new(Default::default()),
            reloader: OnceLock::new(),
            last_reload: Mutex::new(LastReload { success: true, applied_at: std::time::SystemTime::now() }),
            external_labels: Mutex::new(Vec::new()),
            graphite_schemas: Mutex::new(Arc::default()),
            graphite_time_zone: Mutex::new(strata_graphite::attime::TimeZone::UTC),
            graphite_events: OnceLock::new(),
            metadata: Mutex::new(HashMap::new()),
            web_paths: OnceLock::new(),
            query_cache,
        })
    }
}

impl AppState {
    /// Reads the configuration again and applies it (`POST /-/reload`, SIGHUP), noting the
    /// outcome for `/api/v1/status/runtimeinfo` and `/metrics`; `Err` says why it was not
    /// applied (the running configuration stays).
    pub fn reload_config(&self) -> Result<(), String> {
        let outcome = match self.reloader.get() {
            Some(r) => (r.0)(),
            None => Err("configuration reload is not available yet: the server is still starting".into()),
        };
        let mut last = self.last_reload.lock();
        last.success = outcome.is_ok();
        if outcome.is_ok() {
            last.applied_at = std::time::SystemTime::now();
        }
        outcome
    }

    /// Whether the last reload applied, and when the configuration was last applied.
    pub fn last_reload(&self) -> LastReload {
        *self.last_reload.lock()
    }
}

/// The outcome of configuration reloads (Prometheus' `reloadConfigSuccess`, `lastConfigTime`).
#[derive(Debug, Clone, Copy)]
pub struct LastReload {
    pub success: bool,
    /// When the running configuration was applied: at start, or by the last reload that
    /// succeeded.
    pub applied_at: std::time::SystemTime,
}

/// What `/-/reload` runs: reads the configuration again and applies it, or says why not.
pub struct Reloader(pub Box<dyn Fn() -> Result<(), String> + Send + Sync>);

impl std::fmt::Debug for Reloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reloader")
    }
}

/// An API error in Prometheus' shape: `{"status":"error","errorType":…,"error":…}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
}

impl ApiError {
    fn bad_data(m: impl Into<String>) -> Self {
        ApiError { status: StatusCode::BAD_REQUEST, kind: "bad_data", message: m.into() }
    }
    fn not_found(m: impl Into<String>) -> Self {
        ApiError { status: StatusCode::NOT_FOUND, kind: "not_found", message: m.into() }
    }
    fn execution(m: impl Into<String>) -> Self {
        ApiError { status: StatusCode::UNPROCESSABLE_ENTITY, kind: "execution", message: m.into() }
    }
    fn timeout(m: impl Into<String>) -> Self {
        ApiError { status: StatusCode::SERVICE_UNAVAILABLE, kind: "timeout", message: m.into() }
    }
    fn unavailable(m: impl Into<String>) -> Self {
        ApiError { status: StatusCode::SERVICE_UNAVAILABLE, kind: "unavailable", message: m.into() }
    }
    fn canceled(m: impl Into<String>) -> Self {
        // 499 as nginx and Prometheus use for a request the client gave up on.
        ApiError {
            status: StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            kind: "canceled",
            message: m.into(),
        }
    }
    fn internal(m: impl Into<String>) -> Self {
        ApiError { status: StatusCode::INTERNAL_SERVER_ERROR, kind: "internal", message: m.into() }
    }
    fn too_large(m: impl Into<String>) -> Self {
        ApiError { status: StatusCode::PAYLOAD_TOO_LARGE, kind: "bad_data", message: m.into() }
    }
    fn unsupported(m: impl Into<String>) -> Self {
        ApiError { status: StatusCode::UNSUPPORTED_MEDIA_TYPE, kind: "bad_data", message: m.into() }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"status": "error", "errorType": self.kind, "error": self.message});
        (self.status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
    }
}

fn success(data: Value) -> Response {
    let body = json!({"status": "success", "data": data});
    ([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

type ApiResult = Result<Response, ApiError>;

/// The router with every endpoint.
pub fn router(state: Arc<AppState>) -> Router {
    let web_paths = state.web_paths.get().cloned().unwrap_or_default();
    Router::new()
        .merge(crate::ui::routes(&web_paths))
        .route("/-/healthy", get(|| async { "Strata is Healthy.\n" }))
        .route("/-/ready", get(ready))
        .route("/metrics", get(metrics))
        .route("/api/v1/write", post(remote_write))
        .route("/api/v1/otlp/v1/metrics", post(otlp_api::metrics))
        .route("/opentelemetry/v1/metrics", post(otlp_api::metrics))
        .route("/api/v1/read", post(remote_read))
        .route("/api/v1/import/prometheus", post(import_text))
        .route("/api/v1/export", get(export).post(export))
        .route("/federate", get(federate))
        .route("/api/v1/query", get(query).post(query))
        .route("/api/v1/query_range", get(query_range).post(query_range))
        .route("/api/v1/series", get(series).post(series))
        .route("/api/v1/labels", get(labels).post(labels))
        .route("/api/v1/label/{name}/values", get(label_values))
        .route("/api/v1/metadata", get(metadata))
        .route("/api/v1/targets", get(scrape_api::targets))
        .route("/api/v1/targets/metadata", get(scrape_api::targets_metadata))
        .route("/api/v1/targets/relabel_steps", get(scrape_api::relabel_steps))
        .route("/-/reload", post(scrape_api::reload).put(scrape_api::reload))
        .route("/-/quit", post(quit).put(quit))
        .route("/api/v1/rules", get(rules_api::rules))
        .route("/api/v1/alerts", get(rules_api::alerts))
        .route("/api/v1/alertmanagers", get(rules_api::alertmanagers))
        .route("/api/v1/status/buildinfo", get(buildinfo))
        .route("/api/v1/status/runtimeinfo", get(runtimeinfo))
        .route("/api/v1/status/flags", get(flags))
        .route("/api/v1/status/config", get(config))
        .route("/api/v1/status/tsdb", get(tsdb_status))
        .route("/api/v1/status/walreplay", get(walreplay))
        .route("/api/v1/parse_query", get(query_syntax::parse_query).post(query_syntax::parse_query))
        .route("/api/v1/query_exemplars", get(exemplars_api::query_exemplars).post(exemplars_api::query_exemplars))
        .route("/api/v1/format_query", get(query_syntax::format_query).post(query_syntax::format_query))
        .route("/api/v1/admin/tsdb/delete_series", post(delete_series).put(delete_series))
        .route("/api/v1/admin/tsdb/clean_tombstones", post(clean_tombstones).put(clean_tombstones))
        .route("/api/v1/admin/tsdb/snapshot", post(snapshot).put(snapshot))
        .route("/metrics/find", get(graphite_api::find).post(graphite_api::find))
        .route("/metrics/find/", get(graphite_api::find).post(graphite_api::find))
        .route("/graphite/metrics/find", get(graphite_api::find).post(graphite_api::find))
        .route("/metrics/expand", get(graphite_api::expand).post(graphite_api::expand))
        .route("/metrics/expand/", get(graphite_api::expand).post(graphite_api::expand))
        .route("/graphite/metrics/expand", get(graphite_api::expand).post(graphite_api::expand))
        .route("/metrics/index.json", get(graphite_api::index_json))
        .route("/tags", get(graphite_api::tags))
        .route("/graphite/tags", get(graphite_api::tags))
        .route("/tags/findSeries", get(graphite_api::find_series).post(graphite_api::find_series))
        .route("/graphite/tags/findSeries", get(graphite_api::find_series).post(graphite_api::find_series))
        .route("/tags/autoComplete/{what}", get(graphite_api::auto_complete).post(graphite_api::auto_complete))
        .route("/graphite/tags/autoComplete/{what}", get(graphite_api::auto_complete).post(graphite_api::auto_complete))
        .route("/version", get(graphite_api::version))
        .route("/version/", get(graphite_api::version))
        .route("/graphite/version", get(graphite_api::version))
        .route("/tags/{tag}", get(graphite_api::tag_details))
        .route("/graphite/tags/{tag}", get(graphite_api::tag_details))
        .route("/graphite/metrics/index.json", get(graphite_api::index_json))
        .route("/functions", get(graphite_api::functions))
        .route("/functions/", get(graphite_api::functions))
        .route("/functions/{name}", get(graphite_api::function_details))
        .route("/graphite/functions", get(graphite_api::functions))
        .route("/graphite/functions/{name}", get(graphite_api::function_details))
        .route("/events", get(graphite_events::events).post(graphite_events::events))
        .route("/events/", get(graphite_events::events).post(graphite_events::events))
        .route("/graphite/events", get(graphite_events::events).post(graphite_events::events))
        .route("/graphite/events/", get(graphite_events::events).post(graphite_events::events))
        .route("/events/get_data", get(graphite_events::get_data))
        .route("/graphite/events/get_data", get(graphite_events::get_data))
        .route("/events/{id}", get(graphite_events::event))
        .route("/events/{id}/", get(graphite_events::event))
        .route("/graphite/events/{id}", get(graphite_events::event))
        .route("/graphite/events/{id}/", get(graphite_events::event))
        .route("/render", get(graphite_api::render).post(graphite_api::render))
        .route("/render/", get(graphite_api::render).post(graphite_api::render))
        .route("/graphite/render", get(graphite_api::render).post(graphite_api::render))
        // Panics are caught inside the counting, so a failed request is counted as the 500
        // it answered.
        .layer(axum::middleware::from_fn_with_state(state.clone(), catch_panic))
        .layer(axum::middleware::from_fn_with_state(state.clone(), observe))
        .with_state(state)
}

/// A handler that panics fails its own request with a 500, is counted and logged, and the
/// server goes on (a panic on a blocking thread comes here too: [`blocking`] resumes it).
async fn catch_panic(
    State(st): State<Arc<AppState>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    use futures_util::FutureExt as _;
    let path = req.uri().path().to_owned();
    match std::panic::AssertUnwindSafe(next.run(req)).catch_unwind().await {
        Ok(resp) => resp,
        Err(payload) => {
            st.metrics.handler_panics.fetch_add(1, Ordering::Relaxed);
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_owned());
            tracing::error!(path, panic = what, "request handler panicked; the request failed with 500");
            ApiError::internal(format!("internal error while serving {path}: {what}")).into_response()
        }
    }
}

/// Prometheus' answer to an admin call without `--web.enable-admin-api`.
fn admin_enabled(st: &AppState) -> Result<(), ApiError> {
    if st.switches.admin {
        Ok(())
    } else {
        Err(ApiError::unavailable("admin APIs disabled; start strata serve with --web.enable-admin-api"))
    }
}

/// Prometheus' answer to `/-/reload` or `/-/quit` without `--web.enable-lifecycle` (`None`
/// when enabled).
fn lifecycle_refusal(st: &AppState) -> Option<Response> {
    (!st.switches.lifecycle).then(|| (StatusCode::FORBIDDEN, "Lifecycle API is not enabled.\n").into_response())
}

/// `POST /-/quit`: shuts the server down gracefully, as SIGTERM does.
async fn quit(State(st): State<Arc<AppState>>) -> Response {
    if let Some(refused) = lifecycle_refusal(&st) {
        return refused;
    }
    match st.quit.get() {
        Some(tx) => {
            let _ = tx.try_send(());
            (StatusCode::OK, "Requesting termination... Goodbye!\n").into_response()
        }
        None => (StatusCode::SERVICE_UNAVAILABLE, "the server is still starting\n").into_response(),
    }
}

/// Counts requests by handler and status code, and their latency.
async fn observe(
    State(st): State<Arc<AppState>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let handler = handler_name(req.uri().path());
    let t0 = Instant::now();
    let resp = next.run(req).await;
    st.metrics.observe_request(handler, resp.status().as_u16(), t0.elapsed());
    resp
}

fn handler_name(path: &str) -> &'static str {
    match path {
        "/api/v1/write" => "write",
        "/api/v1/read" => "read",
        "/api/v1/query" => "query",
        "/api/v1/query_range" => "query_range",
        "/api/v1/series" => "series",
        "/api/v1/labels" => "labels",
        "/metrics" => "metrics",
        "/metrics/find" | "/metrics/find/" | "/graphite/metrics/find" => "graphite_find",
        "/metrics/expand" | "/metrics/expand/" | "/graphite/metrics/expand" => "graphite_expand",
        "/version" | "/version/" | "/graphite/version" => "graphite_version",
        "/metrics/index.json" | "/graphite/metrics/index.json" => "graphite_index",
        p if p.starts_with("/tags") || p.starts_with("/graphite/tags") => "graphite_tags",
        "/render" | "/render/" | "/graphite/render" => "graphite_render",
        p if p.starts_with("/events") || p.starts_with("/graphite/events") => "graphite_events",
        "/-/ready" | "/-/healthy" => "health",
        "/-/reload" | "/-/quit" => "lifecycle",
        "/api/v1/targets" | "/api/v1/targets/metadata" => "targets",
        "/api/v1/import/prometheus" => "import",
        "/api/v1/export" | "/federate" => "export",
        p if p.starts_with("/api/v1/label/") => "label_values",
        p if p.starts_with("/api/v1/status/") => "status",
        "/api/v1/parse_query" | "/api/v1/format_query" => "query_syntax",
        p if p == "/" || p.starts_with("/assets/") || crate::ui::PAGES.contains(&p) => "ui",
        p if p.starts_with("/api/v1/admin/") => "admin",
        _ => "other",
    }
}

fn db(st: &AppState) -> Result<Arc<Db>, ApiError> {
    st.db.get().cloned().ok_or_else(|| ApiError::unavailable("not ready: the write-ahead log is being replayed"))
}

async fn ready(State(st): State<Arc<AppState>>) -> Response {
    if st.db.get().is_some() {
        (StatusCode::OK, "Strata is Ready.\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "Service Unavailable: replaying the write-ahead log.\n").into_response()
    }
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    let mut text = st.metrics.render(st.db.get().map(|d| &**d), st.scrape.get().map(|s| &**s));
    let reload = st.last_reload();
    let applied = reload.applied_at.duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    crate::metrics::render_config_reload(&mut text, reload.success, applied);
    crate::metrics::render_process(&mut text, &crate::process::read());
    if let Some(cache) = &st.query_cache {
        crate::metrics::render_query_cache(&mut text, cache);
    }
    rules_api::render_metrics(&mut text, &st);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

/// Reads a request body within the size limit and the read timeout.
async fn read_body(st: &AppState, body: Body) -> Result<Bytes, ApiError> {
    let limit = st.limits.max_body_bytes;
    match tokio::time::timeout(st.limits.body_read_timeout, axum::body::to_bytes(body, limit)).await {
        Err(_) => Err(ApiError {
            status: StatusCode::REQUEST_TIMEOUT,
            kind: "bad_data",
            message: format!("request body not received within {:?}", st.limits.body_read_timeout),
        }),
        Ok(Err(e)) => {
            let text = e.to_string();
            if text.contains("length limit") {
                Err(ApiError::too_large(format!("request body exceeds the limit of {limit} bytes")))
            } else {
                Err(ApiError::bad_data(format!("reading the request body: {text}")))
            }
        }
        Ok(Ok(b)) => Ok(b),
    }
}

fn decode_err(e: DecodeError) -> ApiError {
    match e {
        DecodeError::BodyTooLarge { .. } => ApiError::too_large(e.to_string()),
        other => ApiError::bad_data(other.to_string()),
    }
}

/// Runs storage work on a blocking thread. A panic there is resumed here, so that
/// [`catch_panic`] answers and counts it like any handler's.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, ApiError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(v) => Ok(v),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(ApiError::internal(format!("worker failed: {e}"))),
    }
}

/// What one write request did, for the response and the counters.
#[derive(Debug, Default)]
struct WriteOutcome {
    samples: usize,
    appended: usize,
    rejected: usize,
    first_error: Option<String>,
    exemplars_appended: usize,
    exemplars_rejected: usize,
    /// Of `appended`, native histograms.
    histograms_appended: usize,
}

impl WriteOutcome {
    fn reject(&mut self, n: usize, why: impl FnOnce() -> String) {
        self.rejected += n;
        if self.first_error.is_none() {
            self.first_error = Some(why());
        }
    }

    /// 204, or 400 naming the first refusal; either way with remote write 2.0's
    /// `X-Prometheus-Remote-Write-*-Written` headers (harmless to 1.0 clients).
    fn into_response(self, st: &AppState) -> Response {
        st.metrics.remote_write_samples_received.fetch_add(self.samples as u64, Ordering::Relaxed);
        st.metrics.remote_write_samples_rejected.fetch_add(self.rejected as u64, Ordering::Relaxed);
        st.metrics.remote_write_exemplars_rejected.fetch_add(self.exemplars_rejected as u64, Ordering::Relaxed);
        let mut resp = match self.first_error {
            None => StatusCode::NO_CONTENT.into_response(),
            Some(first) => {
                let msg = format!(
                    "{} of {} samples rejected ({} stored); first: {first}\n",
                    self.rejected, self.samples, self.appended
                );
                (StatusCode::BAD_REQUEST, msg).into_response()
            }
        };
        let h = resp.headers_mut();
        h.insert(
            "X-Prometheus-Remote-Write-Samples-Written",
            HeaderValue::from(self.appended - self.histograms_appended),
        );
        h.insert("X-Prometheus-Remote-Write-Histograms-Written", HeaderValue::from(self.histograms_appended));
        h.insert("X-Prometheus-Remote-Write-Exemplars-Written", HeaderValue::from(self.exemplars_appended));
        resp
    }
}

/// One series of a write request: its label pairs as sent (or why they are invalid), its
/// samples and its native histograms, each with their start times (0: none; empty when none
/// has one), and its exemplars.
pub(crate) type WriteSeries<'a, S> =
    (Result<&'a [(S, S)], String>, (&'a [Sample], &'a [i64]), (&'a [(i64, FloatHistogram)], &'a [i64]), &'a [Exemplar]);

/// The start times of a series' items, from a batch's parallel `all` (empty when none).
fn starts_of<'a>(all: &'a [i64], items: &std::ops::Range<usize>) -> &'a [i64] {
    if all.is_empty() {
        &[]
    } else {
        &all[items.clone()]
    }
}

/// Appends every series in one commit: good samples are stored even when others are refused;
/// the first refusal is named. Label pairs in canonical order (as Prometheus sends them) find
/// their series without allocating.
fn append_all<'a, S: AsRef<str> + 'a>(
    db: &Db,
    limits: &Limits,
    series: impl Iterator<Item = WriteSeries<'a, S>>,
) -> Result<WriteOutcome, String> {
    let mut out = WriteOutcome::default();
    let now = now_ms();
    let newest = now.saturating_add(limits.max_future_ms);
    let oldest = if limits.max_age_ms > 0 { now.saturating_sub(limits.max_age_ms) } else { i64::MIN };
    let show = |pairs: &[(S, S)]| {
        let inner: Vec<String> = pairs.iter().map(|(n, v)| format!("{}={:?}", n.as_ref(), v.as_ref())).collect();
        format!("{{{}}}", inner.join(", "))
    };
    let mut app = db.appender();
    for (pairs, (samples, sample_starts), (histograms, histogram_starts), exemplars) in series {
        out.samples += samples.len() + histograms.len();
        let pairs = match pairs {
            Ok(p) => p,
            Err(why) => {
                out.reject(samples.len() + histograms.len(), || why);
                continue;
            }
        };
        let mut r = None;
        for (i, &s) in samples.iter().enumerate() {
            let st = sample_starts.get(i).copied().unwrap_or(0);
            if s.t > newest || s.t < oldest {
                out.reject(1, || {
                    format!(
                        "series {}: sample timestamp {} is outside the accepted window [{oldest}, {newest}]",
                        show(pairs),
                        s.t
                    )
                });
                continue;
            }
            let res = match r {
                Some(r) => app.append_ref_with_start(r, s.t, st, s.v),
                None => app.append_pairs_with_start(pairs, s.t, st, s.v).map(|x| r = Some(x)),
            };
            if let Err(e) = res {
                let what = match e {
                    strata_tsdb::head::AppendError::InvalidLabels(e) => format!("invalid labels: {e}"),
                    e => e.to_string(),
                };
                out.reject(1, || format!("series {}: {what}", show(pairs)));
            }
        }
        // Histograms after the floats, as Prometheus appends a series' samples.
        if !histograms.is_empty() {
            match Labels::try_from_pairs(pairs.iter().map(|(n, v)| (n.as_ref(), v.as_ref()))) {
                Err(e) => out.reject(histograms.len(), || format!("series {}: invalid labels: {e}", show(pairs))),
                Ok(labels) => {
                    for (i, (t, h)) in histograms.iter().enumerate() {
                        let st = histogram_starts.get(i).copied().unwrap_or(0);
                        if *t > newest || *t < oldest {
                            out.reject(1, || {
                                format!(
                                    "series {}: sample timestamp {t} is outside the accepted window [{oldest}, {newest}]",
                                    show(pairs)
                                )
                            });
                            continue;
                        }
                        if let Err(e) = app.append_histogram_with_start(&labels, *t, st, h.clone()) {
                            out.reject(1, || format!("series {}: {e}", show(pairs)));
                        }
                    }
                }
            }
        }
        // Exemplars after the samples, by the series the samples found (or by labels: a sender
        // may send them apart). As in Prometheus, a refused exemplar (out of order, labels too
        // long, no such series) is counted, never a reason to refuse the request.
        for e in exemplars {
            let res = match r {
                Some(r) => app.append_exemplar(r, e.clone()),
                None => app.append_exemplar_pairs(pairs, e.clone()).map(drop),
            };
            if res.is_err() {
                out.exemplars_rejected += 1;
            }
        }
    }
    let c = app.commit().map_err(|e| e.to_string())?;
    out.appended = c.appended;
    out.exemplars_appended = c.exemplars_appended;
    out.histograms_appended = c.histograms_appended;
    if let Some((_, e)) = c.first_rejection {
        out.reject(c.rejected, || e.to_string());
    }
    Ok(out)
}

/// Remote write's content negotiation: `true` for 2.0 (`proto=io.prometheus.write.v2.Request`),
/// `false` for 1.0 (no `proto`, or `proto=prometheus.WriteRequest`); anything else is 415, as
/// the 2.0 specification asks, so the sender can fall back.
fn remote_write_protocol(headers: &HeaderMap) -> Result<bool, ApiError> {
    let unsupported =
        |what: String| ApiError { status: StatusCode::UNSUPPORTED_MEDIA_TYPE, kind: "bad_data", message: what };
    let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("application/x-protobuf");
    let mut parts = ct.split(';').map(str::trim);
    let media = parts.next().unwrap_or("");
    if !media.eq_ignore_ascii_case("application/x-protobuf") {
        return Err(unsupported(format!("content type {ct:?} is not supported; send application/x-protobuf")));
    }
    let proto = parts.find_map(|p| p.strip_prefix("proto=")).map(|p| p.trim_matches('"'));
    let v2 = match proto {
        None | Some("prometheus.WriteRequest") => false,
        Some("io.prometheus.write.v2.Request") => true,
        Some(other) => {
            return Err(unsupported(format!(
                "remote write message {other:?} is not supported; send prometheus.WriteRequest (1.0) or io.prometheus.write.v2.Request (2.0)"
            )))
        }
    };
    if let Some(v) = headers.get("X-Prometheus-Remote-Write-Version").and_then(|v| v.to_str().ok()) {
        let major_ok = if v2 { v.starts_with("2.") } else { v.starts_with("0.1") || v.starts_with("1.") };
        if !major_ok {
            return Err(unsupported(format!("remote write version {v:?} does not match the content type {ct:?}")));
        }
    }
    Ok(v2)
}

async fn remote_write(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> ApiResult {
    let db = db(&st)?;
    let v2 = remote_write_protocol(&headers)?;
    let body = read_body(&st, body).await?;
    let limits = st.limits.clone();
    let st2 = st.clone();
    // Decompressed, read in place and appended on one blocking thread, into buffers that
    // thread keeps for the next request: label strings are borrowed from the decompressed
    // buffer, and nothing is allocated per series or per label.
    let out = blocking(move || -> Result<WriteOutcome, ApiError> {
        WRITE_BUFFERS.with_borrow_mut(|buffers| {
            let (mut raw, batch, mut strs) = buffers.take();
            let (out, batch) = write_decoded(&db, &st2, &limits, v2, &body, &mut raw, batch, &mut strs);
            strs.clear();
            // Emptied first: they no longer borrow from `raw` then.
            let (batch, strs) = (batch.recycle(), remote::reborrow_empty(strs));
            buffers.keep(raw, batch, strs);
            out
        })
    })
    .await??;
    Ok(out.into_response(&st))
}

/// Buffers a blocking thread decodes remote-write requests into, kept between requests so that
/// ingestion does not grow (and fault in) fresh ones of a few hundred kilobytes per request:
/// with freed pages purged at once (`strata`'s allocator setting), the 200-instance churn
/// ingest spent 13 s of system time without them and 4.4 s with them (the appender's kept
/// buffers included). Bounded: buffers that grew past `WRITE_BUFFERS_KEPT_BYTES` for one large
/// request are dropped after it.
#[derive(Default)]
struct WriteBuffers {
    raw: Vec<u8>,
    batch: remote::WriteBatch<'static>,
    strs: Vec<(&'static str, &'static str)>,
}

/// Most buffer bytes a blocking thread keeps for the next remote-write request.
const WRITE_BUFFERS_KEPT_BYTES: usize = 8 << 20;

thread_local! {
    static WRITE_BUFFERS: std::cell::RefCell<WriteBuffers> = std::cell::RefCell::default();
}

impl WriteBuffers {
    fn take<'a>(&mut self) -> (Vec<u8>, remote::WriteBatch<'a>, Vec<(&'a str, &'a str)>) {
        let b = std::mem::take(self);
        (b.raw, b.batch.recycle(), remote::reborrow_empty(b.strs))
    }

    /// Keeps emptied buffers for the next request, unless one large request grew them too far.
    fn keep(&mut self, raw: Vec<u8>, batch: remote::WriteBatch<'static>, strs: Vec<(&'static str, &'static str)>) {
        let kept = raw.capacity() + batch.capacity_bytes() + strs.capacity() * std::mem::size_of::<(&str, &str)>();
        if kept <= WRITE_BUFFERS_KEPT_BYTES {
            *self = WriteBuffers { raw, batch, strs };
        }
    }
}

/// Decompresses, decodes and appends one remote-write request; gives back the batch's buffers
/// (new, empty ones after a request that did not decode).
#[allow(clippy::too_many_arguments)]
fn write_decoded<'a>(
    db: &Db,
    st: &AppState,
    limits: &Limits,
    v2: bool,
    body: &[u8],
    raw: &'a mut Vec<u8>,
    batch: remote::WriteBatch<'a>,
    strs: &mut Vec<(&'a str, &'a str)>,
) -> (Result<WriteOutcome, ApiError>, remote::WriteBatch<'a>) {
    if let Err(e) = remote::decompress_into(body, limits.max_decompressed_bytes, raw) {
        return (Err(decode_err(e)), batch);
    }
    let raw: &'a [u8] = raw;
    let decoded =
        if v2 { remote::read_write_request_v2_into(raw, batch) } else { remote::read_write_request_into(raw, batch) };
    let batch = match decoded {
        Ok(b) => b,
        Err(e) => return (Err(decode_err(e)), remote::WriteBatch::default()),
    };
    let out = append_batch(db, st, limits, &batch, strs);
    (out, batch)
}

/// A write request's series and samples against `--write.max-series` and `--write.max-samples`.
fn check_write_size(limits: &Limits, series: usize, samples: usize) -> Result<(), ApiError> {
    if series > limits.max_series_per_write {
        return Err(ApiError::bad_data(format!(
            "{series} series in one request exceed the limit of {}",
            limits.max_series_per_write
        )));
    }
    if samples > limits.max_samples_per_write {
        return Err(ApiError::bad_data(format!(
            "{samples} samples in one request exceed the limit of {}",
            limits.max_samples_per_write
        )));
    }
    Ok(())
}

/// Appends a decoded remote-write batch (`strs`: an empty buffer for its label strings).
fn append_batch<'a>(
    db: &Db,
    st: &AppState,
    limits: &Limits,
    batch: &remote::WriteBatch<'a>,
    strs: &mut Vec<(&'a str, &'a str)>,
) -> Result<WriteOutcome, ApiError> {
    check_write_size(limits, batch.series.len(), batch.samples.len() + batch.histograms.len())?;
    if !batch.metadata.is_empty() {
        let mut m = st.metadata.lock();
        for md in &batch.metadata {
            let kind = metric_type_name(md.r#type).to_owned();
            m.insert(md.metric_family_name.clone(), (kind, md.help.clone(), md.unit.clone()));
        }
    }
    // Label strings checked as UTF-8 once; a series with a bad one is refused by name.
    strs.reserve(batch.labels.len());
    let mut bad: Vec<Option<String>> = vec![None; batch.series.len()];
    let shown = |span: &remote::SeriesSpan| {
        let inner: Vec<String> = batch.labels[span.labels.clone()]
            .iter()
            .map(|(n, v)| format!("{}={:?}", String::from_utf8_lossy(n), String::from_utf8_lossy(v)))
            .collect();
        format!("{{{}}}", inner.join(", "))
    };
    for (i, span) in batch.series.iter().enumerate() {
        for &(n, v) in &batch.labels[span.labels.clone()] {
            match (std::str::from_utf8(n), std::str::from_utf8(v)) {
                (Ok(n), Ok(v)) => strs.push((n, v)),
                (n, _) => {
                    let which = match n {
                        Ok(n) => format!("value of label {n:?}"),
                        Err(_) => "a label name".to_owned(),
                    };
                    bad[i].get_or_insert_with(|| {
                        format!("series {}: invalid labels: {which} is not valid UTF-8", shown(span))
                    });
                    strs.push(("", ""));
                }
            }
        }
    }
    let invalid = bad.iter().filter(|b| b.is_some()).count();
    st.metrics.remote_write_series_invalid.fetch_add(invalid as u64, Ordering::Relaxed);
    // Exemplars are rare: decoded into owned label sets; one with invalid labels is counted.
    let exemplars: Vec<Vec<Exemplar>> = batch
        .series
        .iter()
        .map(|span| {
            batch.exemplars[span.exemplars.clone()]
                .iter()
                .filter_map(|(labels, t, v)| {
                    let pairs = batch.exemplar_labels[labels.clone()]
                        .iter()
                        .map(|&(n, v)| Some((std::str::from_utf8(n).ok()?, std::str::from_utf8(v).ok()?)))
                        .collect::<Option<Vec<_>>>();
                    let labels = pairs.and_then(|p| Labels::try_from_pairs(p).ok());
                    if labels.is_none() {
                        st.metrics.remote_write_exemplars_rejected.fetch_add(1, Ordering::Relaxed);
                    }
                    Some(Exemplar { labels: labels?, t: *t, v: *v })
                })
                .collect()
        })
        .collect();
    let series = batch.series.iter().zip(bad).zip(&exemplars).map(|((span, bad), exemplars)| {
        let pairs = match bad {
            Some(why) => Err(why),
            None => Ok(&strs[span.labels.clone()]),
        };
        (
            pairs,
            (&batch.samples[span.samples.clone()], starts_of(&batch.sample_starts, &span.samples)),
            (&batch.histograms[span.histograms.clone()], starts_of(&batch.histogram_starts, &span.histograms)),
            &exemplars[..],
        )
    });
    append_all(db, limits, series).map_err(ApiError::internal)
}

fn metric_type_name(t: i32) -> &'static str {
    match t {
        1 => "counter",
        2 => "gauge",
        3 => "histogram",
        4 => "gaugehistogram",
        5 => "summary",
        6 => "info",
        7 => "stateset",
        _ => "unknown",
    }
}

/// Most bytes of chunk data in one frame of a streamed read (Prometheus'
/// `--storage.remote.read-max-bytes-in-frame`): a series with more goes out in several frames.
const READ_FRAME_BYTES: usize = 1 << 20;

/// Remote read: the response type is the first of the client's `accepted_response_types` that
/// Strata serves (`SAMPLES`, `STREAMED_XOR_CHUNKS`), as Prometheus chooses it; none given means
/// samples. Streamed responses are frames of `ChunkedReadResponse` (Thanos' sidecar and
/// Prometheus' streamed client read them); their series must be float series (native histograms
/// are refused there, with the reason, until their chunk format is written).
async fn remote_read(State(st): State<Arc<AppState>>, body: Body) -> ApiResult {
    let db = db(&st)?;
    let body = read_body(&st, body).await?;
    let req: remote::ReadRequest = remote::decode(&body, st.limits.max_decompressed_bytes).map_err(decode_err)?;
    let streamed = if req.accepted_response_types.is_empty() {
        false
    } else {
        req.accepted_response_types
            .iter()
            .find_map(|&t| match t {
                remote::RESPONSE_SAMPLES => Some(false),
                remote::RESPONSE_STREAMED_XOR_CHUNKS => Some(true),
                _ => None,
            })
            .ok_or_else(|| {
                ApiError::bad_data(format!(
                    "none of the accepted response types {:?} is served (0: SAMPLES, 1: STREAMED_XOR_CHUNKS)",
                    req.accepted_response_types
                ))
            })?
    };
    let max_samples = st.limits.max_query_samples;
    let st2 = st.clone();
    let results = run_query(&st, move |stopper| -> Result<Vec<Vec<remote::TimeSeries>>, ApiError> {
        let mut budget = Budget::new(&st2, &stopper);
        let mut results = Vec::with_capacity(req.queries.len());
        for q in &req.queries {
            let matchers = q
                .matchers
                .iter()
                .map(|m| {
                    let op = match m.r#type {
                        0 => MatchOp::Equal,
                        1 => MatchOp::NotEqual,
                        2 => MatchOp::RegexMatch,
                        3 => MatchOp::RegexNoMatch,
                        t => return Err(ApiError::bad_data(format!("unknown matcher type {t}"))),
                    };
                    Matcher::new(op, m.name.clone(), m.value.clone()).map_err(|e| ApiError::bad_data(e.to_string()))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let selected = select_checked(&st2, &db, &stopper, &matchers, q.start_timestamp_ms, q.end_timestamp_ms)?;
            let mut timeseries = Vec::new();
            for s in selected {
                let (mut samples, mut histograms) = (Vec::new(), Vec::new());
                let read = s.visit(|x| match x.value {
                    TypedValue::Float(v) => samples.push(remote::Sample { value: v, timestamp: x.t }),
                    TypedValue::Histogram(h) => histograms.push(remote::Histogram::from_float(x.t, &h)),
                });
                read.map_err(|e| ApiError::internal(format!("reading series {}: {e}", s.labels)))?;
                if samples.is_empty() && histograms.is_empty() {
                    continue;
                }
                if streamed && !histograms.is_empty() {
                    return Err(ApiError::bad_data(format!(
                        "series {} holds native histograms, which streamed remote read cannot send yet: ask for SAMPLES (response type 0)",
                        s.labels
                    )));
                }
                budget.take(samples.len() + histograms.len()).map_err(|e| {
                    if e.kind == "execution" {
                        ApiError::execution(format!("remote read would return more than {max_samples} samples"))
                    } else {
                        e
                    }
                })?;
                let labels = s.labels.iter().map(|l| remote::Label::new(&*l.name, &*l.value)).collect();
                timeseries.push(remote::TimeSeries { labels, samples, histograms, exemplars: Vec::new() });
            }
            results.push(timeseries);
        }
        Ok(results)
    })
    .await?;
    if !streamed {
        let resp = remote::ReadResponse {
            results: results.into_iter().map(|timeseries| remote::QueryResult { timeseries }).collect(),
        };
        return Ok((
            [(header::CONTENT_TYPE, "application/x-protobuf"), (header::CONTENT_ENCODING, "snappy")],
            remote::encode(&resp),
        )
            .into_response());
    }
    let mut out = Vec::new();
    for (query_index, timeseries) in results.into_iter().enumerate() {
        for ts in timeseries {
            let mut frame = remote::ChunkedSeries { labels: ts.labels, chunks: Vec::new() };
            let mut bytes = 0;
            for chunk in remote::xor_chunks(&ts.samples) {
                if bytes + chunk.data.len() > READ_FRAME_BYTES && !frame.chunks.is_empty() {
                    let msg = remote::ChunkedReadResponse {
                        chunked_series: vec![remote::ChunkedSeries {
                            labels: frame.labels.clone(),
                            chunks: std::mem::take(&mut frame.chunks),
                        }],
                        query_index: query_index as i64,
                    };
                    remote::put_frame(&msg, &mut out);
                    bytes = 0;
                }
                bytes += chunk.data.len();
                frame.chunks.push(chunk);
            }
            let msg = remote::ChunkedReadResponse { chunked_series: vec![frame], query_index: query_index as i64 };
            remote::put_frame(&msg, &mut out);
        }
    }
    Ok(([(header::CONTENT_TYPE, "application/x-streamed-protobuf; proto=prometheus.ChunkedReadResponse")], out)
        .into_response())
}

/// Request parameters from the query string and, for a form POST, the body.
async fn params(
    st: &AppState,
    method: &Method,
    raw: Option<String>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Params, ApiError> {
    let mut out: Vec<(String, String)> = form_urlencoded::parse(raw.unwrap_or_default().as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let is_form = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    if *method == Method::POST && is_form {
        let b = read_body(st, body).await?;
        out.extend(form_urlencoded::parse(&b).map(|(k, v)| (k.into_owned(), v.into_owned())));
    }
    Ok(Params(out))
}

struct Params(Vec<(String, String)>);

impl Params {
    /// From a query string alone (GET-only endpoints).
    fn from_query(raw: Option<String>) -> Params {
        Params(
            form_urlencoded::parse(raw.unwrap_or_default().as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    fn get(&self, k: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }
    /// The `query` parameter the PromQL endpoints require.
    fn query(&self) -> Result<&str, ApiError> {
        self.get("query").ok_or_else(|| ApiError::bad_data("invalid parameter \"query\": no query given"))
    }
    fn all(&self, k: &str) -> Vec<&str> {
        self.0.iter().filter(|(n, _)| n == k).map(|(_, v)| v.as_str()).collect()
    }
    fn time(&self, k: &str, default: i64) -> Result<i64, ApiError> {
        match self.get(k) {
            None | Some("") => Ok(default),
            Some(v) => parse_time_ms(v).map_err(|e| ApiError::bad_data(format!("invalid parameter {k:?}: {e}"))),
        }
    }
    /// `match[]` selectors; `required` makes an empty list an error, as for `/api/v1/series`.
    fn selectors(&self, required: bool) -> Result<Vec<Vec<Matcher>>, ApiError> {
        let raw = self.all("match[]");
        if raw.is_empty() && required {
            return Err(ApiError::bad_data("no match[] parameter provided"));
        }
        raw.iter()
            .map(|s| parse_selector(s).map_err(|e| ApiError::bad_data(format!("invalid parameter \"match[]\": {e}"))))
            .collect()
    }
}

/// Prometheus' float formatting: shortest round-trip decimal, `NaN`, `+Inf`, `-Inf`.
pub fn format_value(v: f64) -> String {
    let mut s = String::new();
    crate::query_json::sample_value(&mut s, v);
    s
}

fn labels_json(l: &Labels) -> Value {
    Value::Object(l.iter().map(|x| (x.name.to_string(), Value::String(x.value.to_string()))).collect())
}

/// What stops a read while it runs: its deadline, and its client going away (the flag is
/// raised when the request's handler is dropped).
#[derive(Clone, Debug)]
struct Stopper {
    deadline: Instant,
    canceled: Arc<AtomicBool>,
}

impl Stopper {
    /// Why to stop now, if at all (asked by selections as they go).
    fn stop(&self) -> Option<strata_tsdb::error::Stop> {
        if self.canceled.load(Ordering::Relaxed) {
            Some(strata_tsdb::error::Stop::Canceled)
        } else if Instant::now() > self.deadline {
            Some(strata_tsdb::error::Stop::Timeout)
        } else {
            None
        }
    }
}

/// A storage error as the API answers it: a deadline or cancellation in Prometheus' shapes,
/// limits as execution errors (422), the rest as internal errors.
fn storage_error(st: &AppState, e: strata_tsdb::Error) -> ApiError {
    use strata_tsdb::error::Stop;
    match e {
        strata_tsdb::Error::Stopped(Stop::Timeout) => {
            ApiError::timeout(format!("query timed out in series selection (timeout {:?})", st.limits.query_timeout))
        }
        strata_tsdb::Error::Stopped(Stop::Canceled) => ApiError::canceled("query was canceled in series selection"),
        strata_tsdb::Error::TooManyChunks { .. } => ApiError::execution(format!(
            "query processing would load too many samples into memory in series selection (limit {})",
            st.limits.max_query_samples
        )),
        e @ strata_tsdb::Error::TooManySeries { .. } => ApiError::execution(e.to_string()),
        e => ApiError::internal(e.to_string()),
    }
}

/// Gives a read its slot (waiting up to the query timeout), counting and timing it; `f` runs
/// on a blocking thread with the read's [`Stopper`]. Every read endpoint goes through here:
/// queries, series, labels, label values, remote read, export and federation.
async fn run_query<T: Send + 'static>(
    st: &Arc<AppState>,
    f: impl FnOnce(Stopper) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    run_query_within(st, st.limits.query_timeout, f).await
}

/// `run_query` with its own `timeout` (a request's `timeout` parameter, at most the server's).
async fn run_query_within<T: Send + 'static>(
    st: &Arc<AppState>,
    timeout: Duration,
    f: impl FnOnce(Stopper) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let Ok(Ok(_slot)) = tokio::time::timeout(timeout, st.query_slots.acquire()).await else {
        return Err(ApiError::unavailable(format!(
            "too many concurrent queries (limit {}); none finished within {timeout:?}",
            st.limits.max_concurrent_queries
        )));
    };
    let t0 = Instant::now();
    // Raised if this future is dropped (the client went away) before the work is done.
    let cancel = CancelOnDrop::default();
    let stopper = Stopper { deadline: t0 + timeout, canceled: cancel.0.clone() };
    // Counted where the work ends: when the client went away, nothing awaits the result.
    let st2 = st.clone();
    let res = blocking(move || {
        let res = f(stopper);
        if matches!(&res, Err(e) if e.kind == "canceled") {
            st2.metrics.queries_canceled.fetch_add(1, Ordering::Relaxed);
        }
        res
    })
    .await
    .and_then(|r| r);
    drop(cancel);
    st.metrics.queries.fetch_add(1, Ordering::Relaxed);
    st.metrics.query_duration.observe(t0.elapsed());
    if res.is_err() {
        st.metrics.queries_failed.fetch_add(1, Ordering::Relaxed);
    }
    res
}

/// Checks the query's deadline and budgets as it goes.
struct Budget {
    stopper: Stopper,
    samples_left: usize,
    max_samples: usize,
    timeout: Duration,
}

impl Budget {
    fn new(st: &AppState, stopper: &Stopper) -> Self {
        Budget {
            stopper: stopper.clone(),
            samples_left: st.limits.max_query_samples,
            max_samples: st.limits.max_query_samples,
            timeout: st.limits.query_timeout,
        }
    }
    fn take(&mut self, n: usize) -> Result<(), ApiError> {
        match self.stopper.stop() {
            Some(strata_tsdb::error::Stop::Timeout) => {
                return Err(ApiError::timeout(format!(
                    "query timed out in query execution (timeout {:?})",
                    self.timeout
                )))
            }
            Some(strata_tsdb::error::Stop::Canceled) => {
                return Err(ApiError::canceled("query was canceled in query execution"))
            }
            None => {}
        }
        self.samples_left = self.samples_left.checked_sub(n).ok_or_else(|| {
            ApiError::execution(format!(
                "query processing would load too many samples into memory in query execution (limit {})",
                self.max_samples
            ))
        })?;
        Ok(())
    }
}

/// A querier over `[mint, maxt]` held to the read's limits: series, chunks (bounded by the
/// samples budget: each chunk in range holds a sample in range, but the two at each series'
/// edges), deadline and cancellation, all checked while selecting.
fn limited_querier<'a>(
    db: &'a Db,
    limits: &Limits,
    stopper: &'a (dyn Fn() -> Option<strata_tsdb::error::Stop> + Sync),
    mint: i64,
    maxt: i64,
) -> strata_tsdb::querier::Querier<'a> {
    db.querier(mint, maxt)
        .limit_series(limits.max_query_series)
        .limit_chunks(limits.max_query_samples.saturating_add(limits.max_query_series.saturating_mul(2)))
        .interrupt(stopper)
}

/// `limited_querier`'s limits for a read that is not a `Querier`'s (a rollup tier's).
fn read_limits<'a>(
    limits: &Limits,
    stopper: &'a (dyn Fn() -> Option<strata_tsdb::error::Stop> + Sync),
) -> strata_tsdb::querier::ReadLimits<'a> {
    strata_tsdb::querier::ReadLimits {
        max_series: limits.max_query_series,
        max_chunks: limits.max_query_samples.saturating_add(limits.max_query_series.saturating_mul(2)),
        interrupt: Some(stopper),
        threads: limits.query_parallelism.max(1),
    }
}

/// Selects with the read's limits: the querier stops as soon as one is passed.
fn select_checked(
    st: &AppState,
    db: &Db,
    stopper: &Stopper,
    matchers: &[Matcher],
    mint: i64,
    maxt: i64,
) -> Result<Vec<Series>, ApiError> {
    let stop = || stopper.stop();
    limited_querier(db, &st.limits, &stop, mint, maxt).select(matchers).map_err(|e| storage_error(st, e))
}

/// The database as the PromQL engine sees it, with the read's limits.
struct QueryStorage {
    db: Arc<Db>,
    limits: Limits,
    stopper: Stopper,
    /// Threads a selection reads blocks on: the engine's.
    parallelism: usize,
}

/// A storage error as the engine reports it: a stop, a limit, or a failure.
fn read_error(e: strata_tsdb::Error) -> EvalError {
    use strata_tsdb::error::Stop;
    match e {
        strata_tsdb::Error::Stopped(Stop::Timeout) => EvalError::Timeout("series selection"),
        strata_tsdb::Error::Stopped(Stop::Canceled) => EvalError::Canceled("series selection"),
        strata_tsdb::Error::TooManyChunks { .. } => EvalError::TooManySamples("series selection"),
        e => EvalError::Storage(e.to_string()),
    }
}

impl QueryStorage {
    /// A selection under the request's limits and stop; `newest_only` as `Querier::newest_only`.
    fn select_in(
        &self,
        matchers: &[Matcher],
        mint: i64,
        maxt: i64,
        newest_only: bool,
    ) -> Result<Vec<Series>, EvalError> {
        let stop = || self.stopper.stop();
        let querier = limited_querier(&self.db, &self.limits, &stop, mint, maxt).parallelism(self.parallelism);
        let querier = if newest_only { querier.newest_only() } else { querier };
        querier.select(matchers).map_err(read_error)
    }
}

impl strata_promql::Storage for QueryStorage {
    fn select(&self, matchers: &[Matcher], mint: i64, maxt: i64) -> Result<Vec<Series>, EvalError> {
        self.select_in(matchers, mint, maxt, false)
    }

    fn select_newest(&self, matchers: &[Matcher], mint: i64, maxt: i64) -> Result<Vec<Series>, EvalError> {
        self.select_in(matchers, mint, maxt, true)
    }

    fn rollup_tiers(&self) -> Vec<strata_tsdb::rollup::RollupTier> {
        self.db.rollup_tiers()
    }

    fn label_value_count(&self, name: &str) -> Option<usize> {
        Some(self.db.head().label_value_count(name))
    }

    fn map_rollup(
        &self,
        interval_ms: i64,
        matchers: &[Matcher],
        mint: i64,
        maxt: i64,
        columns: strata_tsdb::chunkenc::rollup::ColumnSet,
        map: &strata_promql::RollupMapFn<'_>,
        sink: &mut dyn FnMut(strata_promql::Series) -> Result<(), EvalError>,
    ) -> Result<usize, EvalError> {
        let stop = || self.stopper.stop();
        let limits = read_limits(&self.limits, &stop);
        strata_promql::map_rollup_with(&self.db, interval_ms, matchers, mint, maxt, columns, &limits, map, sink)
            .map_err(read_error)?
    }
}

/// Rule evaluation's queries: the same engine, limits, deadline, concurrency slots and
/// counters as `/api/v1/query` (`run_query`). Called on a blocking thread (a group's
/// evaluation), which waits there for the query's own blocking thread.
#[derive(Debug)]
pub struct RuleQueries {
    pub st: Arc<AppState>,
    pub rt: tokio::runtime::Handle,
}

impl crate::rules::RuleQuerier for RuleQueries {
    fn instant(&self, expr: &strata_promql::ast::Expr, t: i64) -> Result<strata_promql::Value, String> {
        let (st, expr) = (self.st.clone(), expr.clone());
        let run = run_query(&self.st, move |stopper| {
            let db = db(&st)?;
            let mut engine = engine(&st, stopper.deadline, st.limits.lookback_ms);
            // Rules write what they compute back as raw series: they read raw data.
            engine.opts.max_source_resolution = SourceResolution::Raw;
            let storage = QueryStorage { db, limits: st.limits.clone(), stopper, parallelism: engine.opts.parallelism };
            engine.instant(&storage, &expr, t).map(|o| o.value).map_err(eval_error)
        });
        self.rt.block_on(run).map_err(|e| e.message)
    }
}

/// Cancels a running query when the request handler is dropped before it finishes, which is
/// what happens when the client goes away: the evaluation stops at its next check instead of
/// running to the deadline for nobody.
#[derive(Debug, Default)]
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

fn parse_promql(st: &AppState, q: &str) -> Result<strata_promql::ast::Expr, ApiError> {
    strata_promql::parser::parse_with_depth(q, st.limits.query_features, st.limits.max_query_depth).map_err(|e| {
        if e.msg.contains("nested too deeply") {
            st.metrics.queries_too_deep.fetch_add(1, Ordering::Relaxed);
        }
        ApiError::bad_data(format!("invalid parameter \"query\": {}", e.render(q)))
    })
}

fn engine(st: &AppState, deadline: Instant, lookback_ms: i64) -> Engine {
    Engine::new(EngineOptions {
        lookback_ms,
        max_samples: st.limits.max_query_samples,
        timeout: deadline.saturating_duration_since(Instant::now()),
        use_start_timestamps: st.limits.query_features.use_start_timestamps,
        parallelism: st.limits.query_parallelism.max(1),
        ..EngineOptions::default()
    })
}

fn eval_error(e: EvalError) -> ApiError {
    match e {
        EvalError::Timeout(_) => ApiError::timeout(e.to_string()),
        EvalError::Canceled(_) => ApiError::canceled(e.to_string()),
        _ => ApiError::execution(e.to_string()),
    }
}

/// A PromQL result in Prometheus' JSON, with its warnings and infos rendered as Prometheus
/// renders them; gzip-compressed when the client accepts it (as Prometheus' API does: Grafana
/// asks, and a day of a thousand series is tens of MB of JSON).
///
/// A small result is written here. A large one is written on a blocking thread, so the async
/// workers stay free of the writing and compressing, and sent chunk by chunk as it is written:
/// sending overlaps writing, and the response is never held whole. Its pieces are compressed
/// by up to `threads` threads (`gzip`), unless it is kept steps mostly in groups the cache
/// keeps deflated (`query_json::gzip_kept`).
fn query_response(
    out: query_cache::Answer,
    query: &str,
    stats: Option<String>,
    gzip: bool,
    threads: usize,
) -> Response {
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    if gzip {
        headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    if crate::query_json::points(out.body()) < STREAMED_RESPONSE_POINTS {
        let json = crate::query_json::response(out.body(), out.annotations(), query, stats.as_deref());
        return if gzip {
            (headers, gzipped(json.as_bytes())).into_response()
        } else {
            (headers, json).into_response()
        };
    }
    let query = query.to_owned();
    let body = streamed_body(move |send| {
        let write = |emit: &mut dyn FnMut(String) -> bool| {
            let (body, annotations) = (out.body(), out.annotations());
            crate::query_json::render(body, annotations, &query, stats.as_deref(), RESPONSE_CHUNK_BYTES, threads, emit)
        };
        if gzip {
            let (body, annotations) = (out.body(), out.annotations());
            let chunk = RESPONSE_CHUNK_BYTES;
            if !crate::query_json::gzip_kept(body, annotations, &query, stats.as_deref(), chunk, threads, send) {
                gzip::gzip_in_parallel(threads, write, send);
                // A refreshed result's groups deflated for its next refreshes (not a result
                // evaluated once: that would double its cost), on a task of their own, since
                // the response ends when this one returns.
                if let Some((series, from, to)) = out.refreshed() {
                    tokio::task::spawn_blocking(move || {
                        crate::query_json::deflate_kept_groups((&series[..], from, to).into(), threads)
                    });
                }
            }
        } else {
            write(&mut |chunk| send(chunk.into_bytes()));
        }
    });
    (headers, body).into_response()
}

/// A response body that `write` writes on a blocking thread, so the async workers stay free of
/// the writing: each piece it hands to `send` goes out as soon as the client takes it (at most
/// `RESPONSE_CHUNKS_QUEUED` ahead), and `send` returns `false` once the client went away (the
/// body was dropped), when `write` should stop.
pub(crate) fn streamed_body(write: impl FnOnce(&mut dyn FnMut(Vec<u8>) -> bool) + Send + 'static) -> Body {
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(RESPONSE_CHUNKS_QUEUED);
    tokio::task::spawn_blocking(move || write(&mut |bytes| tx.blocking_send(Bytes::from(bytes)).is_ok()));
    Body::new(ChunkedBody(rx))
}

/// `bytes` gzip-compressed, at the fastest level: query JSON still shrinks 3 to 9 times, and
/// the time spent compressing adds to the query's latency.
fn gzipped(bytes: &[u8]) -> Vec<u8> {
    let mut gz = GzEncoder::new(Vec::with_capacity(bytes.len() / 8 + 64), Compression::fast());
    gz.write_all(bytes).expect("compressing into memory");
    gz.finish().expect("compressing into memory")
}

/// Whether an `Accept-Encoding` header accepts gzip (listed, or `*`, without `q=0`).
fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers.get_all(header::ACCEPT_ENCODING).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).any(
        |coding| {
            let mut parts = coding.split(';').map(str::trim);
            let name = parts.next().unwrap_or("");
            let refused = parts
                .any(|p| p.strip_prefix("q=").and_then(|q| q.trim().parse::<f64>().ok()).is_some_and(|q| q <= 0.0));
            (name.eq_ignore_ascii_case("gzip") || name.eq_ignore_ascii_case("x-gzip") || name == "*") && !refused
        },
    )
}

/// Results with fewer points than this are written in one piece, on the request's own task
/// (well under a millisecond of work).
pub(crate) const STREAMED_RESPONSE_POINTS: usize = 16 * 1024;
/// Size of each piece of a streamed response.
pub(crate) const RESPONSE_CHUNK_BYTES: usize = 128 * 1024;
/// Pieces written ahead of the client before the writer waits for it.
const RESPONSE_CHUNKS_QUEUED: usize = 4;

/// A response body fed piece by piece through a channel; it ends when the sender is dropped.
#[derive(Debug)]
struct ChunkedBody(tokio::sync::mpsc::Receiver<Bytes>);

impl http_body::Body for ChunkedBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        self.0.poll_recv(cx).map(|chunk| chunk.map(|bytes| Ok(http_body::Frame::data(bytes))))
    }
}

/// What a query request asks of its evaluation besides the query: Prometheus' `stats`,
/// `lookback_delta` and `timeout` parameters (the timeout at most `--query.timeout`), and
/// `max_source_resolution` (Thanos' name): `auto` (default) lets the planner answer from the
/// coarsest rollup tier that gives the raw answer, `raw` (or `0s`) reads raw samples only, a
/// duration allows tiers up to that interval.
struct EvalParams {
    resolution: SourceResolution,
    stats: bool,
    lookback_ms: i64,
    timeout: Duration,
}

fn eval_params(st: &AppState, p: &Params) -> Result<EvalParams, ApiError> {
    let resolution = SourceResolution::parse(p.get("max_source_resolution").unwrap_or(""))
        .map_err(|e| ApiError::bad_data(format!("invalid parameter \"max_source_resolution\": {e}")))?;
    let positive = |name: &str| -> Result<Option<i64>, ApiError> {
        match p.get(name) {
            None | Some("") => Ok(None),
            Some(v) => match parse_duration_param_ms(v) {
                Ok(ms) if ms > 0 => Ok(Some(ms)),
                Ok(_) => Err(ApiError::bad_data(format!("invalid parameter \"{name}\": {v:?} is not positive"))),
                Err(e) => Err(ApiError::bad_data(format!("invalid parameter \"{name}\": {e}"))),
            },
        }
    };
    let timeout = match positive("timeout")? {
        Some(ms) => st.limits.query_timeout.min(Duration::from_millis(ms as u64)),
        None => st.limits.query_timeout,
    };
    Ok(EvalParams {
        resolution,
        stats: p.get("stats").is_some_and(|v| !v.is_empty()),
        lookback_ms: positive("lookback_delta")?.unwrap_or(st.limits.lookback_ms),
        timeout,
    })
}

/// Runs one PromQL evaluation in a query slot, with the limits, deadline and a cancel flag
/// raised if the client goes away, and renders the result.
async fn evaluate(
    st: &Arc<AppState>,
    query: String,
    headers: &HeaderMap,
    params: EvalParams,
    run: impl FnOnce(&Engine, &QueryStorage, &AtomicBool) -> Result<query_cache::Answer, EvalError> + Send + 'static,
) -> ApiResult {
    let db = db(st)?;
    let st2 = st.clone();
    let asked = Instant::now();
    let (out, queued, evaluated) = run_query_within(st, params.timeout, move |stopper| {
        let queued = asked.elapsed();
        let t0 = Instant::now();
        let mut engine = engine(&st2, stopper.deadline, params.lookback_ms);
        engine.opts.max_source_resolution = params.resolution;
        let flag = stopper.canceled.clone();
        let storage = QueryStorage { db, limits: st2.limits.clone(), stopper, parallelism: engine.opts.parallelism };
        let out = run(&engine, &storage, &flag).map_err(eval_error)?;
        Ok((out, queued, t0.elapsed()))
    })
    .await?;
    let stats = params.stats.then(|| {
        json!({
            "timings": {
                "evalTotalTime": evaluated.as_secs_f64(),
                "resultSortTime": 0.0,
                "queryPreparationTime": 0.0,
                "innerEvalTime": evaluated.as_secs_f64(),
                "execQueueTime": queued.as_secs_f64(),
                "execTotalTime": (queued + evaluated).as_secs_f64(),
            },
            "samples": {
                "totalQueryableSamples": out.stats().samples_read,
                "peakSamples": out.stats().peak_samples,
            },
        })
        .to_string()
    });
    Ok(query_response(out, &query, stats, accepts_gzip(headers), st.limits.query_parallelism.max(1)))
}

async fn query(
    State(st): State<Arc<AppState>>,
    method: Method,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let p = params(&st, &method, raw, &headers, body).await?;
    let q = p.query()?.to_string();
    let expr = parse_promql(&st, &q)?;
    let t = p.time("time", now_ms())?;
    let params = eval_params(&st, &p)?;
    evaluate(&st, q, &headers, params, move |engine, storage, cancel| {
        engine.instant_with_cancel(storage, &expr, t, Some(cancel)).map(Into::into)
    })
    .await
}

async fn query_range(
    State(st): State<Arc<AppState>>,
    method: Method,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let p = params(&st, &method, raw, &headers, body).await?;
    let q = p.query()?.to_string();
    let start = p.time("start", i64::MIN)?;
    let end = p.time("end", i64::MIN)?;
    if start == i64::MIN || end == i64::MIN {
        return Err(ApiError::bad_data("invalid parameter \"start\" or \"end\": both are required"));
    }
    if end < start {
        return Err(ApiError::bad_data("invalid parameter \"end\": end timestamp must not be before start time"));
    }
    let step = parse_duration_param_ms(p.get("step").unwrap_or(""))
        .map_err(|e| ApiError::bad_data(format!("invalid parameter \"step\": {e}")))?;
    if step <= 0 {
        return Err(ApiError::bad_data(
            "invalid parameter \"step\": zero or negative query resolution step widths are not accepted. Try a positive integer",
        ));
    }
    if (end - start) / step > 11_000 {
        return Err(ApiError::bad_data(
            "exceeded maximum resolution of 11,000 points per timeseries. Try decreasing the query resolution (?step=XX)",
        ));
    }
    let expr = parse_promql(&st, &q)?;
    if !matches!(expr.value_type(), ValueType::Scalar | ValueType::Vector) {
        return Err(ApiError::bad_data(format!(
            "invalid parameter \"query\": invalid expression type \"{}\" for range query, must be Scalar or instant Vector",
            expr.value_type().name()
        )));
    }
    let params = eval_params(&st, &p)?;
    let cache = range_cache(&st, &p, &expr)?;
    evaluate(&st, q, &headers, params, move |engine, storage, cancel| match &cache {
        Some(cache) => {
            let mut key = query_cache::CacheKey::new(&expr, start, step, engine.opts.lookback_ms);
            if let Some(tier) = engine.planned_tier(storage, &expr, start, step) {
                key = key.from_tier(tier.interval_ms);
            }
            let mut eval = |from| engine.range_with_cancel(storage, &expr, from, end, step, Some(cancel));
            let threads = storage.parallelism.max(1);
            query_cache::evaluate_range(cache, storage.db.changes(), key, start, end, now_ms(), threads, &mut eval)
                .map(|(answer, _)| answer)
        }
        None => engine.range_with_cancel(storage, &expr, start, end, step, Some(cancel)).map(Into::into),
    })
    .await
}

/// The result cache, when this range query may go through it: the cache is on, the request
/// did not turn it off (`nocache=1`, as VictoriaMetrics names it), and the query reads nothing
/// of its own start or end ([`query_cache::cacheable`]). Statistics asked for describe the work
/// done: none for steps taken from the cache.
///
/// With rollup tiers, results are kept by the tier the planner answers the query from
/// (`Engine::planned_tier`, raw data or a tier's interval, in the key): the plan depends on
/// the start only through its alignment to the tiers' grid, which every later step of the
/// range shares, so the steps a refresh evaluates are planned as the whole range was. A
/// tier's kept steps are also cut back when its blocks change (rolled up, merged, dropped:
/// a bucket's sum may change at its last bit), and a refresh whose new steps fall back to raw
/// data raises other annotations than the kept ones and is evaluated whole.
fn range_cache(
    st: &AppState,
    p: &Params,
    expr: &strata_promql::ast::Expr,
) -> Result<Option<Arc<query_cache::QueryCache>>, ApiError> {
    let Some(cache) = &st.query_cache else { return Ok(None) };
    let off = match p.get("nocache") {
        None | Some("") | Some("0") | Some("false") => false,
        Some("1") | Some("true") => true,
        Some(v) => return Err(ApiError::bad_data(format!("invalid parameter \"nocache\": {v:?} (1 or 0)"))),
    };
    if off || !query_cache::cacheable(expr) {
        cache.stats.bypassed.fetch_add(1, Ordering::Relaxed);
        return Ok(None);
    }
    Ok(Some(cache.clone()))
}

/// Series matching any of the selector `sets` (`match[]`) in `[mint, maxt]`, each once, in
/// label order; the series limit applies to the union too.
fn select_union(
    st: &AppState,
    db: &Db,
    stopper: &Stopper,
    sets: &[Vec<Matcher>],
    mint: i64,
    maxt: i64,
) -> Result<Vec<Series>, ApiError> {
    let limit = st.limits.max_query_series;
    let mut out: BTreeMap<Labels, Series> = BTreeMap::new();
    for m in sets {
        for s in select_checked(st, db, stopper, m, mint, maxt)? {
            out.entry(s.labels.clone()).or_insert(s);
        }
        if out.len() > limit {
            return Err(ApiError::execution(strata_tsdb::Error::TooManySeries { limit }.to_string()));
        }
    }
    Ok(out.into_values().collect())
}

/// Label names or values (`get`) over the union of the selector `sets`, or over everything
/// when there is none, sorted and unique.
fn strings_union(
    st: &AppState,
    sets: &[Vec<Matcher>],
    get: impl Fn(&[Matcher]) -> strata_tsdb::Result<Vec<String>>,
) -> Result<Vec<String>, ApiError> {
    let err = |e: strata_tsdb::Error| storage_error(st, e);
    if sets.is_empty() {
        return get(&[]).map_err(err);
    }
    let mut all = std::collections::BTreeSet::new();
    for m in sets {
        all.extend(get(m).map_err(err)?);
    }
    Ok(all.into_iter().collect())
}

async fn series(
    State(st): State<Arc<AppState>>,
    method: Method,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let p = params(&st, &method, raw, &headers, body).await?;
    let sets = p.selectors(true)?;
    let (start, end) = (p.time("start", i64::MIN)?, p.time("end", i64::MAX)?);
    let db = db(&st)?;
    let st2 = st.clone();
    let found = run_query(&st, move |stopper| select_union(&st2, &db, &stopper, &sets, start, end)).await?;
    Ok(success(Value::Array(found.iter().map(|s| labels_json(&s.labels)).collect())))
}

async fn labels(
    State(st): State<Arc<AppState>>,
    method: Method,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let p = params(&st, &method, raw, &headers, body).await?;
    let sets = p.selectors(false)?;
    let (start, end) = (p.time("start", i64::MIN)?, p.time("end", i64::MAX)?);
    let db = db(&st)?;
    let st2 = st.clone();
    let names = run_query(&st, move |stopper| {
        let stop = || stopper.stop();
        let q = limited_querier(&db, &st2.limits, &stop, start, end);
        strings_union(&st2, &sets, |m| q.label_names(m))
    })
    .await?;
    Ok(success(json!(names)))
}

async fn label_values(State(st): State<Arc<AppState>>, Path(name): Path<String>, RawQuery(raw): RawQuery) -> ApiResult {
    let p = Params::from_query(raw);
    let sets = p.selectors(false)?;
    let (start, end) = (p.time("start", i64::MIN)?, p.time("end", i64::MAX)?);
    let db = db(&st)?;
    let st2 = st.clone();
    let values = run_query(&st, move |stopper| {
        let stop = || stopper.stop();
        let q = limited_querier(&db, &st2.limits, &stop, start, end);
        strings_union(&st2, &sets, |m| q.label_values(&name, m))
    })
    .await?;
    Ok(success(json!(values)))
}

async fn metadata(State(st): State<Arc<AppState>>, RawQuery(raw): RawQuery) -> ApiResult {
    let p = Params::from_query(raw);
    let only = p.get("metric").map(str::to_owned);
    let limit = scrape_api::parse_limit(p.get("limit"), "limit")?;
    // Distinct entries per family: from remote write, then from every scraped target.
    let mut all: BTreeMap<String, Vec<(String, String, String)>> = BTreeMap::new();
    for (name, md) in st.metadata.lock().iter() {
        all.entry(name.clone()).or_default().push(md.clone());
    }
    if let Some(scrape) = st.scrape.get() {
        for (name, set) in scrape.metadata() {
            let list = all.entry(name).or_default();
            for md in set {
                let md = (md.kind.to_owned(), md.help, md.unit);
                if !list.contains(&md) {
                    list.push(md);
                }
            }
        }
    }
    let mut out = serde_json::Map::new();
    for (name, list) in all {
        if only.as_ref().is_some_and(|o| *o != name) {
            continue;
        }
        if limit.is_some_and(|l| out.len() >= l) {
            break;
        }
        let entries: Vec<Value> = list.into_iter().map(|(k, h, u)| json!({"type": k, "help": h, "unit": u})).collect();
        out.insert(name, Value::Array(entries));
    }
    Ok(success(Value::Object(out)))
}

async fn buildinfo() -> Response {
    success(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "revision": "",
        "branch": "",
        "buildUser": "",
        "buildDate": "",
        "goVersion": "strata (Rust)",
    }))
}

/// `/api/v1/status/walreplay`, in Prometheus' shape: the first and last WAL segment the start
/// replays after the checkpoint, and the one being replayed (the last, once done). It answers
/// while the replay runs (the database is not open yet), from the replay's progress.
async fn walreplay(State(st): State<Arc<AppState>>) -> ApiResult {
    let Ok(db) = db(&st) else {
        let (first, last, current, _) = crate::status::wal_replay_progress().snapshot();
        return Ok(success(json!({"min": first, "max": last, "current": current})));
    };
    let r = db.replay_outcome();
    let (min, max) = match r.segments_read {
        0 => (0, 0),
        n => (r.next_segment - n as u64, r.next_segment - 1),
    };
    Ok(success(json!({"min": min, "max": max, "current": max})))
}

async fn runtimeinfo(State(st): State<Arc<AppState>>) -> ApiResult {
    let db = db(&st)?;
    let epoch_ms =
        |t: std::time::SystemTime| t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    let started = epoch_ms(st.started);
    let reload = st.last_reload();
    Ok(success(json!({
        "startTime": crate::status::format_ms(started),
        "CWD": std::env::current_dir().map(|p| p.display().to_string()).unwrap_or_default(),
        "reloadConfigSuccess": reload.success,
        "lastConfigTime": crate::status::format_ms(epoch_ms(reload.applied_at)),
        "corruptionCount": db.stats().blocks_set_aside.load(Ordering::Relaxed),
        "goroutineCount": 0,
        "GOMAXPROCS": std::thread::available_parallelism().map_or(1, |n| n.get()),
        "GOGC": "",
        "GODEBUG": "",
        "storageRetention": st.flags.get("retention").cloned().unwrap_or_default(),
    })))
}

async fn flags(State(st): State<Arc<AppState>>) -> Response {
    success(json!(st.flags))
}

async fn config(State(st): State<Arc<AppState>>) -> Response {
    success(json!({"yaml": *st.config_yaml.lock()}))
}

async fn tsdb_status(State(st): State<Arc<AppState>>, RawQuery(raw): RawQuery) -> ApiResult {
    let p = Params::from_query(raw);
    let limit: usize = match p.get("limit") {
        None => 10,
        Some(v) => v
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| ApiError::bad_data(format!("invalid parameter \"limit\": {v:?}")))?,
    };
    let db = db(&st)?;
    let status = blocking(move || db.status(limit)).await?.map_err(|e| ApiError::internal(e.to_string()))?;
    let pairs = |v: &[(String, usize)]| -> Value {
        Value::Array(v.iter().map(|(n, c)| json!({"name": n, "value": c})).collect())
    };
    let (min, max) = status.time_range.unwrap_or((0, 0));
    Ok(success(json!({
        "headStats": {
            "numSeries": status.series,
            "numLabelPairs": status.cardinality.by_pair.len(),
            "chunkCount": 0,
            "minTime": min,
            "maxTime": max,
        },
        "seriesCountByMetricName": pairs(&status.cardinality.by_metric),
        "labelValueCountByLabelName": pairs(&status.cardinality.by_label),
        "memoryInBytesByLabelName": [],
        "seriesCountByLabelValuePair": pairs(&status.cardinality.by_pair),
        // Strata's own, for its web UI and operators: what Prometheus shows on other pages.
        "strata": {
            "wal": {
                "segments": status.wal_segments,
                "bytes": status.wal_bytes,
                "replayedRecords": status.replay.records,
            },
            "headMemory": {
                "series": status.memory.series,
                "chunks": status.memory.chunks,
                "chunkIndex": status.memory.chunk_index,
                "symbols": status.memory.symbols,
                "postings": status.memory.postings,
                "names": status.memory.names,
                "chunkFiles": status.memory.chunk_files,
            },
            "blocks": blocks_json(&status.blocks, &status.block_bytes),
            "tiers": status.tiers.iter().map(|t| json!({
                "name": t.tier.to_string(),
                "intervalMs": t.tier.interval_ms,
                "retention": if t.tier.retention_ms == 0 { "forever".to_owned() } else { strata_model::format_duration_ms(t.tier.retention_ms) },
                "bytes": t.bytes,
                "blocks": blocks_json(&t.blocks, &t.block_bytes),
            })).collect::<Vec<_>>(),
        },
    })))
}

fn blocks_json(blocks: &[strata_tsdb::block::BlockMeta], bytes: &[u64]) -> Value {
    blocks
        .iter()
        .zip(bytes)
        .map(|(b, bytes)| {
            json!({
                "ulid": b.ulid,
                "minTime": b.min_time,
                "maxTime": b.max_time,
                "numSeries": b.stats.num_series,
                "numSamples": b.stats.num_samples,
                "numChunks": b.stats.num_chunks,
                "level": b.compaction.level,
                "bytes": bytes,
            })
        })
        .collect()
}

async fn delete_series(
    State(st): State<Arc<AppState>>,
    method: Method,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    admin_enabled(&st)?;
    let p = params(&st, &method, raw, &headers, body).await?;
    let sets = p.selectors(true)?;
    let (start, end) = (p.time("start", i64::MIN)?, p.time("end", i64::MAX)?);
    let db = db(&st)?;
    blocking(move || -> Result<(), ApiError> {
        for m in &sets {
            db.delete(m, start, end).map_err(|e| ApiError::internal(e.to_string()))?;
        }
        Ok(())
    })
    .await??;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn clean_tombstones(State(st): State<Arc<AppState>>) -> ApiResult {
    admin_enabled(&st)?;
    let db = db(&st)?;
    blocking(move || db.clean_tombstones()).await?.map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /api/v1/admin/tsdb/snapshot[?skip_head=true]`: hard-links every block (and writes the
/// head as a block) into `<data dir>/snapshots/<name>`, as Prometheus does.
async fn snapshot(State(st): State<Arc<AppState>>, RawQuery(raw): RawQuery) -> ApiResult {
    admin_enabled(&st)?;
    let p = Params::from_query(raw);
    let skip_head = match p.get("skip_head") {
        None | Some("false") | Some("0") => false,
        Some("true") | Some("1") => true,
        Some(v) => return Err(ApiError::bad_data(format!("invalid parameter \"skip_head\": {v:?}"))),
    };
    let db = db(&st)?;
    let path = blocking(move || db.snapshot(skip_head)).await?.map_err(|e| ApiError::internal(e.to_string()))?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    Ok(success(json!({"name": name})))
}

/// `POST /api/v1/import/prometheus`: text exposition or OpenMetrics (by content type, or an
/// `# EOF` at the end); samples without a timestamp get the time of the request.
async fn import_text(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> ApiResult {
    let db = db(&st)?;
    let body = read_body(&st, body).await?;
    let text = String::from_utf8(body.to_vec()).map_err(|e| ApiError::bad_data(format!("body is not UTF-8: {e}")))?;
    let om = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/openmetrics-text"))
        || text.trim_end().ends_with("# EOF");
    let format = if om { Format::OpenMetrics } else { Format::Prometheus };
    let now = now_ms();
    let max_samples = st.limits.max_samples_per_write;
    /// Label pairs and samples of one imported series.
    type Imported = (Vec<(Arc<str>, Arc<str>)>, Vec<Sample>);
    let mut by_series: Vec<Imported> = Vec::new();
    let mut index: HashMap<Labels, usize> = HashMap::new();
    let mut n = 0;
    for e in Parser::new(&text, format) {
        let e = e.map_err(|e| ApiError::bad_data(e.to_string()))?;
        let Entry::Sample { labels, value, timestamp_ms } = e else { continue };
        n += 1;
        if n > max_samples {
            return Err(ApiError::bad_data(format!("more than {max_samples} samples in one request")));
        }
        let i = *index.entry(labels.clone()).or_insert_with(|| {
            let pairs = labels.iter().map(|l| (l.name.clone(), l.value.clone())).collect();
            by_series.push((pairs, Vec::new()));
            by_series.len() - 1
        });
        by_series[i].1.push(Sample::new(timestamp_ms.unwrap_or(now), value));
    }
    let limits = st.limits.clone();
    let out = blocking(move || {
        append_all(
            &db,
            &limits,
            by_series.iter().map(|(p, s)| (Ok(&p[..]), (&s[..], &[][..]), (&[][..], &[][..]), &[][..])),
        )
    })
    .await?
    .map_err(ApiError::internal)?;
    Ok(out.into_response(&st))
}

/// `GET /api/v1/export`: JSON lines, one series per line, in VictoriaMetrics' shape
/// (`{"metric":{…},"values":[…],"timestamps":[…]}`).
async fn export(
    State(st): State<Arc<AppState>>,
    method: Method,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> ApiResult {
    let p = params(&st, &method, raw, &headers, body).await?;
    let sets = p.selectors(true)?;
    let (start, end) = (p.time("start", i64::MIN)?, p.time("end", i64::MAX)?);
    let db = db(&st)?;
    let st2 = st.clone();
    let text = run_query(&st, move |stopper| {
        let mut budget = Budget::new(&st2, &stopper);
        let mut out = String::new();
        for s in select_union(&st2, &db, &stopper, &sets, start, end)? {
            // This JSON-lines format has no form for native histograms: only floats are exported.
            let samples = float_samples(&s)?;
            budget.take(samples.len())?;
            if samples.is_empty() {
                continue;
            }
            let values: Vec<Value> = samples
                .iter()
                .map(|x| {
                    serde_json::Number::from_f64(x.v).map_or_else(|| Value::String(format_value(x.v)), Value::Number)
                })
                .collect();
            let ts: Vec<i64> = samples.iter().map(|x| x.t).collect();
            out.push_str(&json!({"metric": labels_json(&s.labels), "values": values, "timestamps": ts}).to_string());
            out.push('\n');
        }
        Ok(out)
    })
    .await?;
    Ok(([(header::CONTENT_TYPE, "application/stream+json")], text).into_response())
}

/// `GET /federate`: the latest sample of each matching series in the text format.
async fn federate(State(st): State<Arc<AppState>>, RawQuery(raw): RawQuery) -> ApiResult {
    let p = Params::from_query(raw);
    let sets = p.selectors(true)?;
    let t = now_ms();
    let db = db(&st)?;
    let st2 = st.clone();
    let external = st.external_labels.lock().clone();
    let text = run_query(&st, move |stopper| {
        let mut budget = Budget::new(&st2, &stopper);
        let mut out = String::new();
        for s in select_union(&st2, &db, &stopper, &sets, t - st2.limits.lookback_ms + 1, t)? {
            // The text format has no native histograms (Prometheus federates them only in its
            // protobuf format): float series only.
            let samples = float_samples(&s)?;
            budget.take(samples.len())?;
            if let Some(x) = samples.last().filter(|x| !strata_model::is_stale_nan(x.v)) {
                let labels = with_external_labels(&s.labels, &external);
                out.push_str(&exposition_line(&labels, x.v, x.t));
            }
        }
        Ok(out)
    })
    .await?;
    let mut resp = text.into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
    Ok(resp)
}

/// A series' float samples (its histogram samples left out), or the storage error.
fn float_samples(s: &Series) -> Result<Vec<Sample>, ApiError> {
    let mut out = Vec::new();
    s.visit(|x| {
        if let TypedValue::Float(v) = x.value {
            out.push(Sample::new(x.t, v));
        }
    })
    .map_err(|e| ApiError::internal(format!("reading series {}: {e}", s.labels)))?;
    Ok(out)
}

/// `labels` with each external label it does not have (a series' own label wins).
fn with_external_labels(labels: &Labels, external: &[(String, String)]) -> Labels {
    if external.is_empty() {
        return labels.clone();
    }
    let mut b = strata_model::LabelsBuilder::new(labels);
    for (n, v) in external {
        if labels.get(n).is_none() {
            b.set(n.as_str(), v.as_str());
        }
    }
    b.build().unwrap_or_else(|_| labels.clone())
}

/// One sample as a text-format line: `name{a="b"} value timestamp_ms`.
fn exposition_line(l: &Labels, v: f64, t: i64) -> String {
    let mut s = l.metric_name().unwrap_or("").to_owned();
    let rest: Vec<String> = l
        .iter()
        .filter(|x| &*x.name != strata_model::METRIC_NAME)
        .map(|x| format!("{}=\"{}\"", x.name, x.value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")))
        .collect();
    if !rest.is_empty() {
        s.push('{');
        s.push_str(&rest.join(","));
        s.push('}');
    }
    format!("{s} {} {t}\n", format_value(v))
}

mod exemplars_api;
mod graphite_api;
mod graphite_events;
mod graphite_tiers;
pub(crate) mod gzip;
mod otlp_api;
mod query_syntax;
mod rules_api;
pub use graphite_events::GraphiteEvents;
pub use graphite_tiers::rollup_filter as graphite_rollup_filter;
pub(crate) mod scrape_api;

#[cfg(test)]
mod tests;
