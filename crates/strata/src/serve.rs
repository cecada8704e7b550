//! `strata serve`: the HTTP server over one data directory.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use strata_graphite::schema::Schemas;
use strata_promql::parser::{MAX_DEPTH_DEFAULT, QUERY_THREAD_STACK_BYTES};
use strata_server::carbon::{CarbonConfig, CarbonListeners, Window};
use strata_server::config::{parse_bytes, StorageConfig, WalFsync, DATA_DIR_DEFAULT};
use strata_server::config_file::{default_config_text, parse_listen_address, ConfigFile};
use strata_server::http::{router, ApiSwitches, AppState, GraphiteEvents, Limits, Reloader};
use strata_server::rules::file::{GroupDef, LoadOptions};
use strata_server::rules::notifier::{AlertingConfig, Notifier};
use strata_server::rules::{Env, RuleManager, RuleOptions};
use strata_server::scrape::config::{GlobalConfig, Job};
use strata_server::scrape::ScrapeManager;
use strata_server::web::auth::{authenticate, Authenticator};
use strata_server::web::{self, ConnectionLimits, WebConfigFile};
use strata_tsdb::head::OutOfOrder;

/// How long an idle blocking thread of the HTTP runtime waits for work before it exits.
const BLOCKING_THREAD_KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(60);

/// Every setting has a default; the config file (`--config`) overrides the defaults, and a flag
/// given on the command line overrides the file.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:9090")]
    listen: SocketAddr,
    /// Data directory (created if missing).
    #[arg(long, default_value = DATA_DIR_DEFAULT)]
    data_dir: PathBuf,
    /// YAML configuration file (see `strata_server::config_file`).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Delete blocks entirely older than this behind the newest sample; `0` keeps everything [default: 15d].
    #[arg(long)]
    retention: Option<String>,
    /// Delete the oldest blocks while blocks and WAL exceed this size (e.g. `512GB`) [default: 0, no limit].
    #[arg(long)]
    retention_size: Option<String>,
    /// How far behind the newest sample a late sample is still taken for remote write, scrapes
    /// and imports, as Prometheus' `out_of_order_time_window`; a rewrite of a stored timestamp
    /// is refused as a duplicate [default: 0, late samples refused].
    #[arg(long = "storage.out-of-order-time-window")]
    out_of_order_time_window: Option<String>,
    /// Exemplars kept (remote write, OpenMetrics scrapes; served by /api/v1/query_exemplars),
    /// as Prometheus' `storage.exemplars.max_exemplars`; 0 keeps none [default: 100000].
    #[arg(long = "storage.exemplars.max-exemplars")]
    max_exemplars: Option<String>,
    /// Rollup tiers, `interval:retention` separated by commas as Graphite writes retentions
    /// (`5m:90d,1h:2y`): each series is also kept as per-interval aggregates for that long,
    /// which long-range queries read instead of raw samples (see docs/rollups.md) [default:
    /// none].
    #[arg(long = "storage.rollup-tiers")]
    rollup_tiers: Option<String>,
    /// WAL fsync policy: "interval" (every second) or "always" (before acknowledging a write) [default: interval].
    #[arg(long)]
    wal_fsync: Option<String>,
    /// Compress WAL records with zstd where it pays (about a third of the bytes): "true" or
    /// "false"; segments written either way stay readable [default: true].
    #[arg(long = "storage.wal-compression")]
    wal_compression: Option<String>,
    /// Size at which a WAL segment is closed and a new one started; closed segments are what a
    /// checkpoint rewrites once closed head chunks are written out, so smaller segments keep
    /// the WAL shorter [default: 32MB].
    #[arg(long = "storage.wal-segment-size")]
    wal_segment_size: Option<String>,
    /// Memory kept for decompressed chunk groups and index frames of blocks, shared by every
    /// query (a group or frame is about 16 KiB); 0 decompresses one at each read [default: 64MB].
    #[arg(long = "storage.chunk-cache-size")]
    chunk_cache_size: Option<String>,
    /// Memory kept for series entries read from block indexes (labels and chunk references),
    /// shared by every query, for selections that take at most half of it; 0 reads every
    /// selected series' entry from its index each time [default: 32MB].
    #[arg(long = "storage.series-cache-size")]
    series_cache_size: Option<String>,
    /// Largest request body accepted (compressed size for remote write and read) [default: 32MB].
    #[arg(long = "write.max-body-size")]
    max_body: Option<String>,
    /// Largest remote-write or remote-read body after snappy decompression [default: 128MB].
    #[arg(long = "write.max-decompressed-size")]
    max_decompressed: Option<String>,
    /// Most series in one write request [default: 100000].
    #[arg(long = "write.max-series")]
    max_series_per_write: Option<usize>,
    /// Most samples in one write request [default: 1000000].
    #[arg(long = "write.max-samples")]
    max_samples_per_write: Option<usize>,
    /// Most samples a query may load into memory [default: 50000000].
    #[arg(long = "query.max-samples")]
    max_query_samples: Option<usize>,
    /// Most series a query may select [default: 1000000].
    #[arg(long = "query.max-series")]
    max_query_series: Option<usize>,
    /// Longest a query may run, and wait for a slot [default: 2m].
    #[arg(long = "query.timeout")]
    query_timeout: Option<String>,
    /// How far back an instant selector looks for a series' latest sample (Prometheus'
    /// flag of the same name); a query may ask for its own with `lookback_delta` [default: 5m].
    #[arg(long = "query.lookback-delta")]
    lookback_delta: Option<String>,
    /// Memory for range query results kept so that a dashboard's refresh evaluates only the
    /// steps it has not seen (0: no cache; a request turns it off with nocache=1) [default: 256MB].
    #[arg(long = "query.cache-size")]
    query_cache_size: Option<String>,
    /// Steps of a range result newer than this behind now are never kept, since samples for
    /// them may still arrive (later writes into kept steps are noticed anyway) [default: the
    /// larger of --query.lookback-delta and --storage.out-of-order-time-window].
    #[arg(long = "query.cache-delay")]
    query_cache_delay: Option<String>,
    /// Queries evaluated at once; more wait, up to the query timeout, then get 503 [default: 20].
    #[arg(long = "query.max-concurrency")]
    max_concurrent_queries: Option<usize>,
    /// Threads one query may use for its selections and evaluation; below the number of cores,
    /// a heavy query leaves cores to the queries beside it [default: the number of cores].
    #[arg(long = "query.parallelism")]
    query_parallelism: Option<usize>,
    /// Longest a client may take to send a request body; slow clients get 408 [default: 30s].
    #[arg(long = "web.read-timeout")]
    body_read_timeout: Option<String>,
    /// Longest a client may take to send a request's head, counted from the connection's
    /// start or its previous response (so it also closes idle keep-alive connections); also
    /// the TLS handshake's limit [default: 30s].
    #[arg(long = "web.read-header-timeout")]
    read_header_timeout: Option<String>,
    /// Most HTTP connections open at once; more wait to be accepted [default: 512].
    #[arg(long = "web.max-connections")]
    max_connections: Option<usize>,
    /// Most levels of nesting a query may have (parentheses, operators, calls); at most and by
    /// default 1000, which the server's threads have stack for.
    #[arg(long = "query.max-depth")]
    max_query_depth: Option<usize>,
    /// Serve `/api/v1/admin/tsdb/*` (delete series, clean tombstones, snapshot), as
    /// Prometheus' flag of the same name; off, they answer 503.
    #[arg(long = "web.enable-admin-api")]
    enable_admin_api: bool,
    /// Serve `/-/reload` and `/-/quit`, as Prometheus' flag of the same name; off, they answer
    /// 403 (SIGHUP still reloads, SIGTERM still stops).
    #[arg(long = "web.enable-lifecycle")]
    enable_lifecycle: bool,
    /// TLS and basic authentication for the HTTP API, in Prometheus' web configuration format
    /// (exporter-toolkit's: `tls_server_config`, `basic_auth_users` with bcrypt hashes,
    /// `http_server_config.headers`); reloaded when it or its certificate files change.
    #[arg(long = "web.config.file")]
    web_config_file: Option<PathBuf>,
    /// The URL browsers reach Strata under, when a reverse proxy serves it under a path of its
    /// own (e.g. https://example.com/strata/); the web UI's links use its path, and it is the
    /// route prefix's default, as in Prometheus.
    #[arg(long = "web.external-url")]
    external_url: Option<String>,
    /// Path prefix of every HTTP endpoint and page [default: the path of --web.external-url,
    /// else /].
    #[arg(long = "web.route-prefix")]
    route_prefix: Option<String>,
    /// Experimental PromQL features, comma-separated, named as Prometheus names them:
    /// promql-experimental-functions, promql-duration-expr, promql-extended-range-selectors,
    /// promql-binop-fill-modifiers, use-start-timestamps (rate and friends read samples'
    /// start times where storage has them).
    #[arg(long = "enable-feature", value_delimiter = ',')]
    enable_feature: Vec<String>,
    /// Least time before an alert that is still firing is sent to Alertmanager again [default: 1m].
    #[arg(long = "rules.alert.resend-delay")]
    rules_resend_delay: Option<String>,
    /// How long Strata may have been down for alerts' `for` state to be restored [default: 1h].
    #[arg(long = "rules.alert.for-outage-tolerance")]
    rules_outage_tolerance: Option<String>,
    /// Least time between a restart and a restored alert firing [default: 10m].
    #[arg(long = "rules.alert.for-grace-period")]
    rules_grace_period: Option<String>,
    /// Alerts waiting for Alertmanager at most; beyond it the oldest are dropped [default: 10000].
    #[arg(long = "alertmanager.notification-queue-capacity")]
    notification_queue_capacity: Option<usize>,
    /// Carbon plaintext listener over TCP, `host:port` or `:port` (carbon's is :2003) [default: off].
    #[arg(long = "carbon.plaintext-listen-address")]
    carbon_plaintext: Option<String>,
    /// Carbon plaintext listener over UDP, `host:port` or `:port` [default: off].
    #[arg(long = "carbon.udp-listen-address")]
    carbon_udp: Option<String>,
    /// Carbon pickle listener over TCP, `host:port` or `:port` (carbon's is :2004) [default: off].
    #[arg(long = "carbon.pickle-listen-address")]
    carbon_pickle: Option<String>,
    /// Most carbon TCP connections open at once, both listeners together; more wait to be accepted [default: 1024].
    #[arg(long = "carbon.max-connections")]
    carbon_max_connections: Option<usize>,
    /// A carbon connection silent this long is closed [default: 2m].
    #[arg(long = "carbon.idle-timeout")]
    carbon_idle_timeout: Option<String>,
    /// Longest carbon plaintext line; longer ones are counted and skipped [default: 16KB].
    #[arg(long = "carbon.max-line-size")]
    carbon_max_line: Option<String>,
    /// Graphite's storage-schemas.conf (carbon's format): the resolution /render answers at,
    /// per path [default: 60s:15d for every path].
    #[arg(long = "graphite.storage-schemas")]
    storage_schemas: Option<PathBuf>,
    /// Graphite's storage-aggregation.conf (carbon's format): how coarser resolutions are
    /// aggregated [default: average, xFilesFactor 0.5].
    #[arg(long = "graphite.storage-aggregation")]
    storage_aggregation: Option<PathBuf>,
    /// The time zone /render reads days and clock times (`today`, `12:00_20240101`) in and
    /// writes CSV times in, unless a request names its own `tz` (graphite-web's TIME_ZONE) [default: UTC].
    #[arg(long = "graphite.time-zone")]
    graphite_time_zone: Option<String>,
    /// Most Graphite events (`/events/`) kept; beyond it a post is refused (507) until older
    /// ones pass the retention [default: 100000].
    #[arg(long = "graphite.events-max")]
    graphite_events_max: Option<String>,
    /// How far behind a series' newest point a carbon point is still taken; a point at a stored
    /// timestamp replaces its value (whisper's last write wins); `0` refuses late points [default: 1d].
    #[arg(long = "carbon.out-of-order-window")]
    carbon_out_of_order_window: Option<String>,
    /// Longest carbon pickle message; a longer one closes its connection [default: 16MB].
    #[arg(long = "carbon.max-pickle-size")]
    carbon_max_pickle: Option<String>,
    /// Carbon paths remembered with their series, all connections together (about 40 bytes
    /// each), so a repeated path skips its checks and the index lookup; 0 turns it off [default: 1048576].
    #[arg(long = "carbon.path-cache-entries")]
    carbon_path_cache_entries: Option<usize>,
}

/// The PromQL language features named by `--enable-feature`.
fn promql_features(names: &[String]) -> Result<strata_promql::Features, String> {
    let mut f = strata_promql::Features::default();
    for n in names {
        match n.as_str() {
            "promql-experimental-functions" => f.experimental_functions = true,
            "promql-duration-expr" => f.duration_expressions = true,
            "promql-extended-range-selectors" => f.extended_range_selectors = true,
            "promql-binop-fill-modifiers" => f.fill_modifiers = true,
            "use-start-timestamps" => f.use_start_timestamps = true,
            other => return Err(format!("enable-feature: unknown feature {other:?}")),
        }
    }
    Ok(f)
}

/// The effective settings, and each one's source for `/api/v1/status/flags`.
struct Settings {
    storage: StorageConfig,
    limits: Limits,
    connections: ConnectionLimits,
    flags: BTreeMap<String, String>,
    jobs: Vec<Job>,
    external_labels: Vec<(String, String)>,
    carbon: CarbonConfig,
    schemas: Schemas,
    time_zone: strata_graphite::attime::TimeZone,
    /// `--graphite.events-max`.
    events_max: usize,
    /// `--web.external-url`, `--web.route-prefix`.
    web_paths: strata_server::ui::WebPaths,
    /// Rule groups of the configuration's `rule_files`, checked.
    rule_groups: Vec<GroupDef>,
    rule_options: RuleOptions,
    alerting: AlertingConfig,
    /// What relative paths in the configuration are relative to.
    config_base: PathBuf,
    notification_queue_capacity: usize,
    /// The `otlp` section.
    otlp: strata_server::otlp::OtlpConfig,
}

/// The configuration file, or the built-in one without `--config`: parsed, its text, its
/// scrape jobs and the directory its relative paths are relative to.
fn load_config(
    path: Option<&std::path::Path>,
    listen: SocketAddr,
) -> Result<(ConfigFile, String, Vec<Job>, PathBuf), String> {
    let (file, text, base) = match path {
        Some(p) => {
            let (file, text) = ConfigFile::load(p)?;
            let base = p.parent().map(std::path::Path::to_path_buf).unwrap_or_default();
            (file, text, base)
        }
        None => {
            let text = default_config_text(listen);
            (ConfigFile::parse(&text)?, text, PathBuf::from("."))
        }
    };
    let named = |e: String| match path {
        Some(p) => format!("{}: {e}", p.display()),
        None => e,
    };
    let jobs = file.scrape_jobs(&base).map_err(named)?;
    Notifier::check(&file.alerting, &base).map_err(named)?;
    Ok((file, text, jobs, base))
}

/// The rule groups of a loaded configuration.
fn load_rules(
    rule_files: &[String],
    global: &GlobalConfig,
    base: &std::path::Path,
    opts: &RuleOptions,
) -> Result<Vec<GroupDef>, String> {
    let load = LoadOptions { features: opts.features, max_depth: opts.max_depth, ..LoadOptions::default() };
    strata_server::config_file::rule_groups(rule_files, global, base, &load)
}

fn size_or_zero(s: &str) -> Result<u64, String> {
    if s == "0" {
        Ok(0)
    } else {
        parse_bytes(s)
    }
}

/// A WAL segment size: at least 64KiB (a segment must hold a few commits), at most 1GB.
fn wal_segment_size(s: &str) -> Result<u64, String> {
    let n = parse_bytes(s)?;
    if !(64 << 10..=1 << 30).contains(&n) {
        return Err(format!("{s:?} is outside 64KiB..1GB"));
    }
    Ok(n)
}

/// Flag, else file, else default; `parse` turns the chosen text into a value, and an error
/// names the setting.
fn pick<T>(
    flags: &mut BTreeMap<String, String>,
    name: &str,
    flag: Option<String>,
    file: Option<String>,
    default: &str,
    parse: impl Fn(&str) -> Result<T, String>,
) -> Result<T, String> {
    let text = flag.or(file).unwrap_or_else(|| default.to_owned());
    let v = parse(&text).map_err(|e| format!("{name}: {e}"))?;
    flags.insert(name.to_owned(), text);
    Ok(v)
}

fn settings(args: &ServeArgs) -> Result<(Settings, String), String> {
    let (file, yaml, jobs, config_base) = load_config(args.config.as_deref(), args.listen)?;
    let (st, li, ca) = (file.storage, file.limits, file.carbon);
    let mut flags = BTreeMap::new();
    flags.insert("listen".to_owned(), args.listen.to_string());
    flags.insert("data-dir".to_owned(), args.data_dir.display().to_string());
    if let Some(c) = &args.config {
        flags.insert("config".to_owned(), c.display().to_string());
    }
    let num = |v: Option<usize>| v.map(|n| n.to_string());
    let f = &mut flags;
    let retention = pick(f, "retention", args.retention.clone(), st.retention, "15d", strata_model::parse_duration_ms)?;
    let retention_size = pick(f, "retention-size", args.retention_size.clone(), st.retention_size, "0", size_or_zero)?;
    let wal_fsync: WalFsync = pick(f, "wal-fsync", args.wal_fsync.clone(), st.wal_fsync, "interval", |s| s.parse())?;
    let wal_compression = pick(
        f,
        "storage.wal-compression",
        args.wal_compression.clone(),
        st.wal_compression.map(|b| b.to_string()),
        "true",
        |s| s.parse::<bool>().map_err(|_| format!("expected true or false, got {s:?}")),
    )?;
    let wal_segment_bytes = pick(
        f,
        "storage.wal-segment-size",
        args.wal_segment_size.clone(),
        st.wal_segment_size,
        "32MB",
        wal_segment_size,
    )?;
    let chunk_cache_bytes =
        pick(f, "storage.chunk-cache-size", args.chunk_cache_size.clone(), st.chunk_cache_size, "64MB", size_or_zero)?;
    let series_cache_bytes = pick(
        f,
        "storage.series-cache-size",
        args.series_cache_size.clone(),
        st.series_cache_size,
        "32MB",
        size_or_zero,
    )?;
    let ms = |s: &str| strata_model::parse_duration_ms(s).map(|v| Duration::from_millis(v.max(1) as u64));
    let limits = Limits {
        max_body_bytes: pick(
            f,
            "write.max-body-size",
            args.max_body.clone(),
            li.write_max_body_size,
            "32MB",
            parse_bytes,
        )? as usize,
        max_decompressed_bytes: pick(
            f,
            "write.max-decompressed-size",
            args.max_decompressed.clone(),
            li.write_max_decompressed_size,
            "128MB",
            parse_bytes,
        )? as usize,
        max_series_per_write: pick(
            f,
            "write.max-series",
            num(args.max_series_per_write),
            num(li.write_max_series),
            "100000",
            parse_count,
        )?,
        max_samples_per_write: pick(
            f,
            "write.max-samples",
            num(args.max_samples_per_write),
            num(li.write_max_samples),
            "1000000",
            parse_count,
        )?,
        max_query_samples: pick(
            f,
            "query.max-samples",
            num(args.max_query_samples),
            num(li.query_max_samples),
            "50000000",
            parse_count,
        )?,
        max_query_series: pick(
            f,
            "query.max-series",
            num(args.max_query_series),
            num(li.query_max_series),
            "1000000",
            parse_count,
        )?,
        query_timeout: pick(f, "query.timeout", args.query_timeout.clone(), li.query_timeout, "2m", ms)?,
        lookback_ms: pick(
            f,
            "query.lookback-delta",
            args.lookback_delta.clone(),
            li.query_lookback_delta.clone(),
            "5m",
            positive_ms,
        )?,
        max_concurrent_queries: pick(
            f,
            "query.max-concurrency",
            num(args.max_concurrent_queries),
            num(li.query_max_concurrency),
            "20",
            parse_count,
        )?,
        query_parallelism: pick(
            f,
            "query.parallelism",
            num(args.query_parallelism),
            num(li.query_parallelism),
            &std::thread::available_parallelism().map_or(1, |n| n.get()).to_string(),
            parse_count,
        )?,
        body_read_timeout: pick(f, "web.read-timeout", args.body_read_timeout.clone(), li.web_read_timeout, "30s", ms)?,
        max_age_ms: retention,
        query_features: promql_features(&args.enable_feature)?,
        max_query_depth: pick(
            f,
            "query.max-depth",
            num(args.max_query_depth),
            num(li.query_max_depth),
            &MAX_DEPTH_DEFAULT.to_string(),
            parse_depth,
        )?,
        ..Limits::default()
    };
    let connections = ConnectionLimits {
        max_connections: pick(
            f,
            "web.max-connections",
            num(args.max_connections),
            num(li.web_max_connections),
            "512",
            parse_count,
        )?,
        read_header_timeout: pick(
            f,
            "web.read-header-timeout",
            args.read_header_timeout.clone(),
            li.web_read_header_timeout,
            "30s",
            ms,
        )?,
        ..ConnectionLimits::default()
    };
    for (name, on) in [("web.enable-admin-api", args.enable_admin_api), ("web.enable-lifecycle", args.enable_lifecycle)]
    {
        flags.insert(name.to_owned(), on.to_string());
    }
    if let Some(w) = &args.web_config_file {
        flags.insert("web.config.file".to_owned(), w.display().to_string());
    }
    let web_paths = strata_server::ui::WebPaths::new(args.external_url.as_deref(), args.route_prefix.as_deref())?;
    flags.insert("web.external-url".to_owned(), args.external_url.clone().unwrap_or_default());
    flags.insert("web.route-prefix".to_owned(), web_paths.route_prefix.clone());
    if !args.enable_feature.is_empty() {
        flags.insert("enable-feature".to_owned(), args.enable_feature.join(","));
    }
    let out_of_order_window_ms = pick(
        &mut flags,
        "storage.out-of-order-time-window",
        args.out_of_order_time_window.clone(),
        st.out_of_order_time_window,
        "0",
        strata_model::parse_duration_ms,
    )?;
    let mut limits = limits;
    limits.query_cache_bytes = pick(
        &mut flags,
        "query.cache-size",
        args.query_cache_size.clone(),
        li.query_cache_size,
        "256MB",
        size_or_zero,
    )? as usize;
    let delay_default = strata_model::format_duration_ms(limits.lookback_ms.max(out_of_order_window_ms));
    limits.query_cache_delay_ms = pick(
        &mut flags,
        "query.cache-delay",
        args.query_cache_delay.clone(),
        li.query_cache_delay,
        &delay_default,
        positive_ms,
    )?;
    let rollup_tiers = pick(&mut flags, "storage.rollup-tiers", args.rollup_tiers.clone(), st.rollup_tiers, "", |s| {
        strata_tsdb::rollup::parse_tiers(s, retention)
    })?;
    let max_exemplars = pick(
        &mut flags,
        "storage.exemplars.max-exemplars",
        args.max_exemplars.clone(),
        st.exemplars.and_then(|e| e.max_exemplars).map(|n| n.to_string()),
        "100000",
        |s| s.parse::<usize>().map_err(|e| format!("{s:?}: {e}")),
    )?;
    let mut storage = StorageConfig {
        data_dir: args.data_dir.clone(),
        max_exemplars,
        rollup_tiers,
        wal_fsync,
        wal_compression,
        wal_segment_bytes,
        chunk_cache_bytes,
        series_cache_bytes,
        retention_ms: retention,
        retention_bytes: retention_size,
        out_of_order_window_ms,
        ..Default::default()
    };
    let address = |s: &str| if s.is_empty() { Ok(None) } else { parse_listen_address(s).map(Some) };
    let f = &mut flags;
    let carbon = CarbonConfig {
        plaintext_tcp: pick(
            f,
            "carbon.plaintext-listen-address",
            args.carbon_plaintext.clone(),
            ca.plaintext_listen_address,
            "",
            address,
        )?,
        plaintext_udp: pick(
            f,
            "carbon.udp-listen-address",
            args.carbon_udp.clone(),
            ca.udp_listen_address,
            "",
            address,
        )?,
        pickle_tcp: pick(
            f,
            "carbon.pickle-listen-address",
            args.carbon_pickle.clone(),
            ca.pickle_listen_address,
            "",
            address,
        )?,
        max_connections: pick(
            f,
            "carbon.max-connections",
            num(args.carbon_max_connections),
            num(ca.max_connections),
            "1024",
            parse_count,
        )?,
        idle_timeout: pick(f, "carbon.idle-timeout", args.carbon_idle_timeout.clone(), ca.idle_timeout, "2m", ms)?,
        max_line_bytes: pick(
            f,
            "carbon.max-line-size",
            args.carbon_max_line.clone(),
            ca.max_line_size,
            "16KB",
            parse_bytes,
        )? as usize,
        max_pickle_bytes: pick(
            f,
            "carbon.max-pickle-size",
            args.carbon_max_pickle.clone(),
            ca.max_pickle_size,
            "16MB",
            parse_bytes,
        )? as usize,
        path_cache_entries: pick(
            f,
            "carbon.path-cache-entries",
            num(args.carbon_path_cache_entries),
            num(ca.path_cache_entries),
            "1048576",
            |s: &str| s.parse::<usize>().map_err(|_| format!("expected a whole number, got {s:?}")),
        )?,
        window: Window {
            max_future_ms: limits.max_future_ms,
            max_age_ms: limits.max_age_ms,
            out_of_order: OutOfOrder {
                window_ms: pick(
                    f,
                    "carbon.out-of-order-window",
                    args.carbon_out_of_order_window.clone(),
                    ca.out_of_order_window,
                    "1d",
                    strata_model::parse_duration_ms,
                )?,
                replace: true,
            },
        },
        ..CarbonConfig::default()
    };
    if carbon.enabled() {
        storage.late_window_ms = carbon.window.out_of_order.window_ms;
    }
    let schemas_file = args.storage_schemas.clone().or(file.graphite.storage_schemas.map(PathBuf::from));
    let aggregation_file = args.storage_aggregation.clone().or(file.graphite.storage_aggregation.map(PathBuf::from));
    let read = |p: &Option<PathBuf>| -> Result<Option<String>, String> {
        p.as_ref().map(|p| std::fs::read_to_string(p).map_err(|e| format!("read {}: {e}", p.display()))).transpose()
    };
    let schemas = match (read(&schemas_file)?, read(&aggregation_file)?) {
        (None, None) => Schemas::default(),
        (s, a) => Schemas::parse(s.as_deref().unwrap_or(""), a.as_deref()).map_err(|e| e.to_string())?,
    };
    // Retention schemas get the left-closed tiers their coarse archives are read from, unless
    // left-closed tiers are configured by hand.
    let hand_made = storage.rollup_tiers.iter().any(|t| t.closed == strata_tsdb::rollup::Closed::Left);
    if schemas_file.is_some() && !hand_made {
        let others = storage.rollup_tiers.len();
        let (derived, notes) = strata_server::config::graphite_rollup_tiers(&schemas, storage.retention_ms, others);
        for note in notes {
            tracing::warn!("graphite.storage-schemas: {note}");
        }
        if !derived.is_empty() {
            let names: Vec<String> = derived.iter().map(ToString::to_string).collect();
            tracing::info!(tiers = %names.join(","), "rollup tiers for Graphite's retention schemas");
        }
        storage.rollup_tiers.extend(derived);
        strata_tsdb::rollup::check_tiers(&storage.rollup_tiers, storage.retention_ms).map_err(|e| {
            format!(
                "rollup tiers derived from graphite.storage-schemas: {e}; set them with storage.rollup-tiers (:left)"
            )
        })?;
    }
    if schemas_file.is_some() {
        storage.rollup_filter = Some(strata_server::http::graphite_rollup_filter(Arc::new(schemas.clone())));
    }
    for (name, path) in
        [("graphite.storage-schemas", &schemas_file), ("graphite.storage-aggregation", &aggregation_file)]
    {
        if let Some(p) = path {
            flags.insert(name.to_owned(), p.display().to_string());
        }
    }
    let time_zone = pick(
        &mut flags,
        "graphite.time-zone",
        args.graphite_time_zone.clone(),
        file.graphite.time_zone.clone(),
        "UTC",
        strata_graphite::attime::time_zone,
    )?;
    let events_max = pick(
        &mut flags,
        "graphite.events-max",
        args.graphite_events_max.clone(),
        file.graphite.events_max.map(|n| n.to_string()),
        "100000",
        parse_count,
    )?;
    let external_labels = file.global.external_labels.clone().into_iter().collect();
    let rule_options = RuleOptions {
        resend_delay_ms: pick(
            &mut flags,
            "rules.alert.resend-delay",
            args.rules_resend_delay.clone(),
            None,
            "1m",
            positive_ms,
        )?,
        outage_tolerance_ms: pick(
            &mut flags,
            "rules.alert.for-outage-tolerance",
            args.rules_outage_tolerance.clone(),
            None,
            "1h",
            positive_ms,
        )?,
        for_grace_period_ms: pick(
            &mut flags,
            "rules.alert.for-grace-period",
            args.rules_grace_period.clone(),
            None,
            "10m",
            positive_ms,
        )?,
        external_url: external_url(args),
        features: limits.query_features,
        max_depth: limits.max_query_depth,
    };
    let notification_queue_capacity = pick(
        &mut flags,
        "alertmanager.notification-queue-capacity",
        args.notification_queue_capacity.map(|n| n.to_string()),
        None,
        "10000",
        parse_count,
    )?;
    let rule_groups = load_rules(&file.rule_files, &file.global, &config_base, &rule_options)
        .map_err(|e| format!("cannot load rule files: {e}"))?;
    let settings = Settings {
        storage,
        limits,
        connections,
        flags,
        jobs,
        external_labels,
        carbon,
        schemas,
        time_zone,
        events_max,
        web_paths,
        rule_groups,
        rule_options,
        alerting: file.alerting,
        config_base,
        notification_queue_capacity,
        otlp: file.otlp,
    };
    Ok((settings, yaml))
}

/// Where alerts link back to (`generatorURL`) and what templates' `$externalURL` is: the
/// `--web.external-url`, else `http://<hostname>:<port>` as Prometheus makes it.
fn external_url(args: &ServeArgs) -> String {
    if let Some(u) = &args.external_url {
        return u.trim_end_matches('/').to_owned();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("http://{host}:{}", args.listen.port())
}

/// A duration of at least a millisecond, in milliseconds.
fn positive_ms(s: &str) -> Result<i64, String> {
    match strata_model::parse_duration_ms(s)? {
        ms if ms > 0 => Ok(ms),
        _ => Err(format!("{s:?} must be a positive duration")),
    }
}

fn parse_count(s: &str) -> Result<usize, String> {
    s.parse::<usize>().ok().filter(|&n| n > 0).ok_or_else(|| format!("expected a positive whole number, got {s:?}"))
}

/// A nesting limit no deeper than the server's threads have stack for.
fn parse_depth(s: &str) -> Result<u32, String> {
    let n = parse_count(s)?;
    if n > MAX_DEPTH_DEFAULT as usize {
        return Err(format!("{n} is above {MAX_DEPTH_DEFAULT}, the deepest the server's threads have stack for"));
    }
    Ok(n as u32)
}

pub fn run(args: ServeArgs) -> Result<(), Box<dyn std::error::Error>> {
    let (
        Settings {
            storage: cfg,
            limits,
            connections,
            flags,
            jobs,
            external_labels,
            carbon,
            schemas,
            time_zone,
            events_max,
            web_paths,
            rule_groups,
            rule_options,
            alerting,
            config_base,
            notification_queue_capacity,
            otlp,
        },
        yaml,
    ) = settings(&args)?;
    let web_config = match &args.web_config_file {
        Some(p) => Some(Arc::new(WebConfigFile::load(p).map_err(|e| format!("web.config.file: {e}"))?)),
        None => None,
    };
    let max_future_ms = limits.max_future_ms;
    let switches = ApiSwitches { admin: args.enable_admin_api, lifecycle: args.enable_lifecycle };
    let state = AppState::new(limits, switches, flags, yaml);
    *state.external_labels.lock() = external_labels;
    *state.otlp.lock() = otlp;
    *state.graphite_schemas.lock() = Arc::new(schemas);
    *state.graphite_time_zone.lock() = time_zone;

    // Queries are parsed on the async workers and evaluated on blocking threads, both of this
    // runtime: their stacks must hold the deepest query the parser lets through. Idle blocking
    // threads live a minute rather than tokio's 10 s: each exit abandons its allocator pages
    // (those still holding series or chunks it allocated stay, mostly empty), and under steady
    // ingest threads came and went often enough to keep ~90 MiB of such pages.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("strata-http")
        .thread_keep_alive(BLOCKING_THREAD_KEEP_ALIVE)
        .thread_stack_size(QUERY_THREAD_STACK_BYTES)
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .map_err(|e| format!("listen on {}: {e}", args.listen))?;
        tracing::info!(listen = %args.listen, data_dir = %cfg.data_dir.display(), "serving; not ready until the WAL is replayed");
        // Bound now, so that a taken port fails the start; served once the database is open.
        let carbon = match carbon.enabled() {
            true => Some(CarbonListeners::bind(carbon).await?),
            false => None,
        };
        let (carbon_stop_tx, carbon_stop_rx) = tokio::sync::watch::channel(false);
        let (notifier_stop_tx, notifier_stop_rx) = tokio::sync::watch::channel(false);
        let notifier = Notifier::new(notification_queue_capacity);
        let notifier_task = tokio::spawn(notifier.clone().run(notifier_stop_rx));

        // Replay in the background: /-/healthy answers meanwhile, /-/ready says 503.
        let opener = {
            let state = state.clone();
            let cfg = cfg.clone();
            let (config_path, listen) = (args.config.clone(), args.listen);
            let notifier = notifier.clone();
            tokio::task::spawn_blocking(move || -> Result<(), String> {
                let db = Arc::new(
                    cfg.open_db().map_err(|e| format!("cannot open the data directory: {e}"))?,
                );
                let events = GraphiteEvents::open(&cfg.data_dir.join("graphite"), events_max, cfg.retention_ms)?;
                let _ = state.graphite_events.set(Arc::new(events));
                let seed = {
                    use std::hash::{Hash, Hasher};
                    let mut h = std::collections::hash_map::DefaultHasher::new();
                    (listen, &cfg.data_dir).hash(&mut h);
                    h.finish()
                };
                let scrape = ScrapeManager::new(db.clone(), tokio::runtime::Handle::current(), seed, max_future_ms);
                let n = jobs.len();
                scrape.apply(jobs).map_err(|e| format!("cannot start scraping: {e}"))?;
                let _ = state.scrape.set(scrape.clone());
                let external: Vec<(String, String)> = state.external_labels.lock().clone();
                notifier.apply(&alerting, external.clone(), &config_base)?;
                let rt = tokio::runtime::Handle::current();
                let env = Env {
                    db: db.clone(),
                    querier: Arc::new(strata_server::http::RuleQueries { st: state.clone(), rt: rt.clone() }),
                    notifier,
                    opts: rule_options.clone(),
                    external_labels: Default::default(),
                };
                let rules = RuleManager::new(env, rt);
                rules.set_external_labels(external.into_iter().collect());
                let groups = rule_groups.len();
                rules.apply(rule_groups);
                let _ = state.rules.set(rules.clone());
                let st = state.clone();
                let _ = state.reloader.set(Reloader(Box::new(move || {
                    let (file, text, jobs, base) = load_config(config_path.as_deref(), listen)?;
                    let groups = load_rules(&file.rule_files, &file.global, &base, &rule_options)?;
                    let n = jobs.len();
                    scrape.apply(jobs)?;
                    let external: Vec<(String, String)> = file.global.external_labels.clone().into_iter().collect();
                    rules.notifier().apply(&file.alerting, external.clone(), &base)?;
                    rules.set_external_labels(external.iter().cloned().collect());
                    let g = groups.len();
                    rules.apply(groups);
                    *st.config_yaml.lock() = text;
                    *st.external_labels.lock() = external;
                    *st.otlp.lock() = file.otlp;
                    tracing::info!(jobs = n, rule_groups = g, "configuration reloaded (scrape jobs, rules, alerting; storage settings and limits apply at start only)");
                    Ok(())
                })));
                // Ready (`/-/ready`, the storage endpoints) only now, so that a client that
                // waited for readiness also finds the targets in place.
                if let Some(cache) = &state.query_cache {
                    // Before any query runs: the cache learns of writes behind its delay.
                    db.changes().watch(cache.delay_ms());
                }
                state.db.set(db).map_err(|_| "database opened twice".to_owned())?;
                tracing::info!(scrape_jobs = n, rule_groups = groups, "ready");
                Ok(())
            })
        };
        let _ = state.web_paths.set(web_paths.clone());
        let mut app = router(state.clone());
        if let Some(web) = &web_config {
            let auth = Authenticator::new(web.clone());
            app = app.layer(axum::middleware::from_fn_with_state(auth, authenticate));
            tracing::info!(file = %web.path().display(), tls = web.acceptor().is_some(), "web configuration in force");
            let current = web.current();
            if args.config.is_none() && (current.tls.is_some() || !current.users.is_empty()) {
                // The built-in configuration scrapes our own /metrics over plain HTTP without
                // credentials, which this web configuration refuses.
                tracing::warn!("the built-in self-scrape cannot pass --web.config.file's TLS or authentication; give a --config whose scrape job for this server has its scheme, tls_config and basic_auth");
            }
        }
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<String>();
        let (quit_tx, mut quit_rx) = tokio::sync::mpsc::channel::<()>(1);
        let _ = state.quit.set(quit_tx);
        let stopping = state.clone();
        let shutdown = async move {
            tokio::select! {
                _ = shutdown_signal() => {}
                _ = quit_rx.recv() => tracing::info!("/-/quit: shutting down"),
                reason = stop_rx => tracing::error!(reason = reason.unwrap_or_default(), "stopping"),
            }
            // Scraping stops before the HTTP server: a self-scrape racing the server's own
            // shutdown would record Strata as down and mark its series stale.
            if let Some(scrape) = stopping.scrape.get() {
                scrape.stop().await;
            }
            if let Some(rules) = stopping.rules.get() {
                rules.stop();
            }
            let _ = carbon_stop_tx.send(true);
        };
        // Under the route prefix last, so the layers above see paths without it.
        let app = strata_server::ui::mount(app, &web_paths);
        let stats = state.metrics.connections.clone();
        let server = tokio::spawn(web::serve(listener, app, connections, web_config, stats, shutdown));
        let reloads = tokio::spawn(reload_on_sighup(state.clone()));
        let opened = opener.await.map_err(|e| e.to_string()).and_then(|r| r);
        if let Err(e) = &opened {
            let _ = stop_tx.send(e.clone());
        }
        let carbon = match (carbon, state.db.get()) {
            (Some(listeners), Some(db)) => {
                Some(tokio::spawn(listeners.serve(db.clone(), state.metrics.carbon.clone(), carbon_stop_rx)))
            }
            _ => None,
        };
        let served = server.await;
        if let Some(carbon) = carbon {
            if matches!(served, Ok(Ok(()))) {
                // Stopped with the HTTP server: each connection stores what it has read first.
                let _ = carbon.await;
            } else {
                carbon.abort();
            }
        }
        // Alerts already queued go out before storage closes (bounded by the send timeout).
        let _ = notifier_stop_tx.send(true);
        let _ = notifier_task.await;
        served.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
        reloads.abort();
        if let Some(scrape) = state.scrape.get() {
            // Already stopped with the server, unless the server ended on an error.
            scrape.stop().await;
        }
        tracing::info!("HTTP server, carbon listeners and scraping stopped; closing storage");
        if let Some(db) = state.db.get() {
            db.shutdown().map_err(|e| e.to_string())?;
        }
        opened?;
        tracing::info!("stopped cleanly");
        Ok::<(), String>(())
    })?;
    Ok(())
}

/// SIGHUP re-reads the configuration, as for Prometheus.
async fn reload_on_sighup(state: Arc<AppState>) {
    let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
        tracing::warn!("cannot listen for SIGHUP; reload with POST /-/reload");
        return;
    };
    while hup.recv().await.is_some() {
        let st = state.clone();
        let res = tokio::task::spawn_blocking(move || st.reload_config()).await;
        match res {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::error!(error = %e, "SIGHUP: reloading the configuration failed; the running one stays")
            }
            Err(e) => tracing::error!(error = %e, "SIGHUP: reload task failed"),
        }
    }
}

/// SIGTERM or SIGINT.
async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn settings_of(args: &[&str]) -> Settings {
        let cli = Cli::try_parse_from(std::iter::once("strata").chain(args.iter().copied())).expect("flags parse");
        settings(&cli.serve).expect("settings").0
    }

    /// Carbon senders deliver late (relays retry): tier merges over raw blocks wait until
    /// carbon's out-of-order window has passed them (`DbOptions::late_window_ms`), and without
    /// a carbon listener only the head's own window holds them back.
    #[test]
    fn a_carbon_listener_holds_tier_merges_back_by_its_out_of_order_window() {
        assert_eq!(settings_of(&[]).storage.late_window_ms, 0, "no carbon listener");
        let carbon = ["--carbon.plaintext-listen-address", "127.0.0.1:0"];
        assert_eq!(settings_of(&carbon).storage.late_window_ms, 86_400_000, "carbon's default window, a day");
        let two_hours = [&carbon[..], &["--carbon.out-of-order-window", "2h"]].concat();
        assert_eq!(settings_of(&two_hours).storage.late_window_ms, 7_200_000);
        let udp = ["--carbon.udp-listen-address", "127.0.0.1:0", "--carbon.out-of-order-window", "30m"];
        assert_eq!(settings_of(&udp).storage.late_window_ms, 1_800_000, "any carbon listener");
        let pickle_only = ["--carbon.pickle-listen-address", "127.0.0.1:0", "--carbon.out-of-order-window", "3h"];
        assert_eq!(settings_of(&pickle_only).storage.late_window_ms, 10_800_000);
        let window_alone = ["--carbon.out-of-order-window", "2h"];
        assert_eq!(settings_of(&window_alone).storage.late_window_ms, 0, "a window without a listener");
    }
}
