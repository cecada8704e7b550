//! One target's scrape loop: fetch on a fixed, jittered schedule, parse, relabel, append in one
//! commit, write staleness markers and the target's own series (`up`…).
//!
//! The cost that matters is per scraped sample, so a sample of a series seen before costs one
//! lookup of its text as written (by position, else by hash: see `cache`) and one append to
//! the head series it became: the *scrape cache* maps the series text to that series (or to
//! "dropped by metric relabeling"), and labels are parsed and relabeled only for a series text
//! not seen in the previous scrape. Comment lines are only hashed unless they changed.
//!
//! Staleness (Prometheus' rules): a series present in the previous successful scrape and absent
//! from this one gets a stale marker at this scrape's timestamp; a failed scrape marks every
//! series of the previous one stale; a target that goes away marks its series stale when its
//! loop stops. Samples with an explicit timestamp are left out (unless the job sets
//! `track_timestamps_staleness`), since their own timestamps say when they were true.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use strata_model::{Labels, STALE_NAN_BITS};
use strata_tsdb::head::{AppendError, MemSeries};
use strata_tsdb::Db;

use super::cache::ScrapeCache;
use super::config::{Auth, Job, ScrapeProtocol, BODY_SIZE_CAP};
use super::relabel::{self, LabelMap};
use super::target::Target;
use crate::textparse::{Format, MetricType, Parser, RawEntry};

/// What the targets API shows of a loop.
#[derive(Clone, Debug, Default)]
pub struct TargetHealth {
    /// `None` before the first scrape ends.
    pub up: Option<bool>,
    pub last_error: String,
    pub last_scrape: Option<SystemTime>,
    pub last_duration: Duration,
    pub last_samples: usize,
}

/// One metric family's metadata as the target exposes it.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Metadata {
    pub kind: &'static str,
    pub help: String,
    pub unit: String,
}

/// A target's metadata by family. hashbrown's `entry_ref` finds a family by `&str` and
/// allocates its name only when it is new.
pub type MetadataMap = hashbrown::HashMap<String, Metadata>;

/// Counts shared by every loop, for `/metrics`.
#[derive(Debug, Default)]
pub struct ScrapeStats {
    pub scrapes: std::sync::atomic::AtomicU64,
    pub failed: std::sync::atomic::AtomicU64,
    pub samples_appended: std::sync::atomic::AtomicU64,
    pub out_of_order: std::sync::atomic::AtomicU64,
    pub duplicate: std::sync::atomic::AtomicU64,
    /// Exemplars the head refused (out of order, labels too long).
    pub exemplars_rejected: std::sync::atomic::AtomicU64,
    pub out_of_bounds: std::sync::atomic::AtomicU64,
    pub sample_limit_exceeded: std::sync::atomic::AtomicU64,
}

#[derive(Clone, Debug)]
enum CacheEntry {
    Series {
        /// The head series itself, not its reference: appending by handle skips the head's
        /// lookup by reference (a cache miss per sample among millions of series).
        series: Arc<MemSeries>,
        /// Iterations (scrapes) that last saw it, newest first.
        seen: u64,
        seen_before: u64,
        /// Gets a stale marker when it disappears (no explicit timestamp).
        track: bool,
    },
    /// Dropped by `metric_relabel_configs`.
    Dropped { seen: u64 },
}

/// The target's own series, in the order Prometheus appends them.
const REPORT_NAMES: [&str; 5] = [
    "up",
    "scrape_duration_seconds",
    "scrape_samples_scraped",
    "scrape_samples_post_metric_relabeling",
    "scrape_series_added",
];

/// Why a scrape's samples were refused as a whole.
#[derive(Debug)]
struct ScrapeFailure(String);

/// Counts of one scrape, for its report series.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ScrapeCounts {
    pub scraped: usize,
    pub post_relabel: usize,
    pub series_added: usize,
}

/// Everything a loop keeps between scrapes; owned by the loop (and moved to a blocking thread
/// for each ingest when commits wait for fsync).
#[derive(Debug)]
pub struct LoopState {
    pub job: Arc<Job>,
    pub target: Arc<Target>,
    /// Keyed by the series text as exposed (see `cache`).
    cache: ScrapeCache<CacheEntry>,
    /// Scrape attempts so far.
    iter: u64,
    /// Whether the previous attempt succeeded (its series are live, not yet marked stale).
    last_ok: bool,
    report_labels: [Labels; 5],
    report_series: [Option<Arc<MemSeries>>; 5],
    pub metadata: Arc<Mutex<MetadataMap>>,
    /// Samples are refused beyond this many milliseconds ahead of the scrape.
    max_future_ms: i64,
    /// Hash of the last successful scrape's comment lines (0: none read yet).
    meta_hash: u64,
}

impl LoopState {
    pub fn new(job: Arc<Job>, target: Arc<Target>, max_future_ms: i64) -> Self {
        let report_labels = REPORT_NAMES.map(|n| target.report_labels(n));
        LoopState {
            job,
            target,
            cache: ScrapeCache::default(),
            iter: 0,
            last_ok: false,
            report_labels,
            report_series: Default::default(),
            metadata: Arc::default(),
            max_future_ms,
            meta_hash: 0,
        }
    }

    /// Number of series texts cached.
    pub fn cached(&self) -> usize {
        self.cache.len()
    }

    /// Ingests one scrape: `body` with its format, or the error that made the scrape fail.
    /// Everything (samples, staleness markers, report series) goes in one commit. Returns the
    /// error to show for the target, if any.
    pub fn ingest(
        &mut self,
        db: &Db,
        stats: &ScrapeStats,
        t: i64,
        body: Result<(&[u8], Format), String>,
        duration: Duration,
    ) -> (Option<String>, ScrapeCounts) {
        self.iter += 1;
        let mut counts = ScrapeCounts::default();
        let mut app = db.appender();
        // Room for a scrape like the last one, so the batch does not grow step by step.
        app.reserve(self.cache.len() + REPORT_NAMES.len());
        let failure = match body {
            Ok((bytes, format)) => match self.append_body(&mut app, stats, t, bytes, format, &mut counts) {
                Ok(()) => None,
                Err(ScrapeFailure(e)) => Some(e),
            },
            Err(e) => Some(e),
        };
        if failure.is_some() {
            // Nothing of a failed scrape is kept: start over with an empty batch.
            drop(app);
            app = db.appender();
            counts.post_relabel = 0;
            counts.series_added = 0;
        }
        self.mark_stale(&mut app, t, failure.is_some());
        let up = if failure.is_some() { 0.0 } else { 1.0 };
        let report =
            [up, duration.as_secs_f64(), counts.scraped as f64, counts.post_relabel as f64, counts.series_added as f64];
        self.append_report(&mut app, t, report);
        let failure = match app.commit() {
            Ok(out) => {
                stats.samples_appended.fetch_add(out.appended as u64, std::sync::atomic::Ordering::Relaxed);
                failure
            }
            Err(e) => Some(format!("storage: {e}")),
        };
        if failure.is_none() {
            let iter = self.iter;
            self.cache.retain(|e| match e {
                CacheEntry::Series { seen, .. } | CacheEntry::Dropped { seen } => *seen == iter,
            });
        }
        self.last_ok = failure.is_none();
        (failure, counts)
    }

    fn append_body(
        &mut self,
        app: &mut strata_tsdb::head::Appender<'_>,
        stats: &ScrapeStats,
        t: i64,
        bytes: &[u8],
        format: Format,
        counts: &mut ScrapeCounts,
    ) -> Result<(), ScrapeFailure> {
        let text = std::str::from_utf8(bytes)
            .map_err(|e| ScrapeFailure(format!("the response is not valid UTF-8 (at byte {})", e.valid_up_to())))?;
        let mut parser = Parser::new(text, format);
        self.cache.start();
        let job = self.job.clone();
        let iter = self.iter;
        let mut limit_exceeded = false;
        // Comment lines are not parsed while reading: they are hashed, and only when the hash
        // differs from the last scrape's (metadata changed, rarely) are they parsed into the
        // target's metadata, in a second pass. Parsing ~300 HELP/TYPE pairs per scrape would
        // cost as much as the samples' cache lookups.
        let mut meta_hash = 0u64;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix('#') {
                let eof = format == Format::OpenMetrics && rest.trim() == "EOF";
                if !eof {
                    parser.skip_line();
                    meta_hash = xxhash_rust::xxh3::xxh3_64_with_seed(line.as_bytes(), meta_hash);
                    continue;
                }
            }
            let Some(entry) = parser.parse_line_raw(line) else { continue };
            let entry = entry.map_err(|e| ScrapeFailure(format!("parse error: {e}")))?;
            let (series_text, value, ts, exemplar) = match entry {
                RawEntry::Sample { series, value, timestamp_ms, exemplar } => (series, value, timestamp_ms, exemplar),
                RawEntry::Eof => break,
                // Comments were taken above.
                RawEntry::Type { .. } | RawEntry::Help { .. } | RawEntry::Unit { .. } => continue,
            };
            counts.scraped += 1;
            let explicit = ts.filter(|_| job.honor_timestamps);
            let st = explicit.unwrap_or(t);
            let track = explicit.is_none() || job.track_timestamps_staleness;
            // A cached series: one lookup (usually by position), one append by handle. A new
            // one is parsed and relabeled first, so that the sample limit counts only what
            // relabeling keeps.
            let series = match self.cache.find(series_text) {
                Some(CacheEntry::Dropped { seen }) => {
                    *seen = iter;
                    continue;
                }
                Some(CacheEntry::Series { series, seen, seen_before, track: tr }) => {
                    if *seen != iter {
                        *seen_before = *seen;
                        *seen = iter;
                    }
                    *tr = track;
                    Ok(series.clone())
                }
                None => match self.series_labels(&parser, series_text)? {
                    None => {
                        self.cache.insert(series_text, CacheEntry::Dropped { seen: iter });
                        continue;
                    }
                    Some(labels) => Err(labels),
                },
            };
            counts.post_relabel += 1;
            if job.sample_limit > 0 && counts.post_relabel > job.sample_limit {
                limit_exceeded = true;
            }
            if limit_exceeded {
                continue;
            }
            if st > t + self.max_future_ms {
                stats.out_of_bounds.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                continue;
            }
            let appended = match series {
                Ok(series) => match app.append_to(&series, st, value) {
                    Err(AppendError::UnknownSeries(_)) => {
                        // The head dropped the series meanwhile: build it again from the text
                        // (relabeling kept it before, and its rules have not changed since).
                        let labels = self.series_labels(&parser, series_text)?.ok_or_else(|| {
                            ScrapeFailure(format!("series {series_text} is now dropped by relabeling"))
                        })?;
                        app.append_handle(&labels, st, value).map(|r| {
                            let series_ref = r.series_ref;
                            self.cache.replace_last_found(CacheEntry::Series {
                                series: r,
                                seen: iter,
                                seen_before: 0,
                                track,
                            });
                            series_ref
                        })
                    }
                    Ok(()) => Ok(series.series_ref),
                    Err(e) => Err(e),
                },
                Err(labels) => app.append_handle(&labels, st, value).map(|r| {
                    let series_ref = r.series_ref;
                    counts.series_added += 1;
                    self.cache.insert(series_text, CacheEntry::Series { series: r, seen: iter, seen_before: 0, track });
                    series_ref
                }),
            };
            // The sample's exemplar, at the sample's time when it has none of its own. A
            // malformed one fails the scrape (as in Prometheus); one the storage refuses (older
            // than the series' newest) is counted.
            if let (Some(text), Ok(series_ref)) = (exemplar, &appended) {
                let (labels, v, et) = parser.exemplar(text).map_err(|e| ScrapeFailure(format!("parse error: {e}")))?;
                let e = strata_tsdb::head::exemplars::Exemplar { labels, t: et.unwrap_or(st), v };
                if app.append_exemplar(*series_ref, e).is_err() {
                    stats.exemplars_rejected.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
            let appended = appended.map(drop);
            match appended {
                Ok(()) => {}
                Err(AppendError::Sample(e)) => {
                    use strata_tsdb::head::SampleError as S;
                    let c = match e {
                        S::OutOfOrder { .. } => &stats.out_of_order,
                        S::Duplicate { .. } => &stats.duplicate,
                        _ => &stats.out_of_bounds,
                    };
                    c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Err(e) => return Err(ScrapeFailure(format!("series {series_text}: {e}"))),
            }
        }
        parser.finish().map_err(|e| ScrapeFailure(format!("parse error: {e}")))?;
        if limit_exceeded {
            stats.sample_limit_exceeded.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Err(ScrapeFailure(format!(
                "sample limit exceeded ({} samples, limit {})",
                counts.post_relabel, job.sample_limit
            )));
        }
        if meta_hash != self.meta_hash {
            self.read_metadata(&parser, text, format)?;
            self.meta_hash = meta_hash;
        }
        Ok(())
    }

    /// Reads the body's `# TYPE`, `# HELP` and `# UNIT` lines into the target's metadata; a
    /// malformed one fails the scrape, as it would in Prometheus.
    fn read_metadata(&self, parser: &Parser<'_>, text: &str, format: Format) -> Result<(), ScrapeFailure> {
        let mut metadata = self.metadata.lock();
        for (i, line) in text.lines().enumerate() {
            let Some(rest) = line.strip_prefix('#') else { continue };
            if format == Format::OpenMetrics && rest.trim() == "EOF" {
                break;
            }
            let entry = parser.parse_comment(i + 1, line).map_err(|e| ScrapeFailure(format!("parse error: {e}")))?;
            match entry {
                Some(RawEntry::Type { family, kind }) => family_metadata(&mut metadata, family).kind = kind.as_str(),
                Some(RawEntry::Help { family, text }) => {
                    let e = family_metadata(&mut metadata, family);
                    if e.help != text {
                        e.help = text.into_owned();
                    }
                }
                Some(RawEntry::Unit { family, unit }) => {
                    let e = family_metadata(&mut metadata, family);
                    if e.unit != unit {
                        e.unit = unit.to_owned();
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Labels of a series not in the cache: parsed, given the target's labels, relabeled and
    /// checked against the job's label limits. `None` when metric relabeling drops it.
    fn series_labels(&self, parser: &Parser<'_>, series_text: &str) -> Result<Option<Labels>, ScrapeFailure> {
        let exposed = parser.series_labels(series_text).map_err(|e| ScrapeFailure(format!("parse error: {e}")))?;
        let mut ls: LabelMap = exposed.iter().map(|l| (l.name.to_string(), l.value.to_string())).collect();
        merge_target_labels(&mut ls, &self.target.labels, self.job.honor_labels);
        if !relabel::process(&self.job.metric_relabel_configs, &mut ls) || ls.is_empty() {
            return Ok(None);
        }
        let name = ls.get(strata_model::METRIC_NAME).cloned().unwrap_or_default();
        if name.is_empty() {
            return Err(ScrapeFailure(format!("series {series_text}: __name__ label is missing after relabeling")));
        }
        check_label_limits(&self.job, &name, &ls).map_err(ScrapeFailure)?;
        let labels = Labels::try_from_pairs(ls).map_err(|e| ScrapeFailure(format!("series {series_text}: {e}")))?;
        Ok(Some(labels))
    }

    /// Stale markers for series of the previous successful scrape missing from this one (all
    /// of them when this one failed).
    fn mark_stale(&mut self, app: &mut strata_tsdb::head::Appender<'_>, t: i64, failed: bool) {
        if !self.last_ok {
            return;
        }
        let (iter, prev) = (self.iter, self.iter - 1);
        let stale = f64::from_bits(STALE_NAN_BITS);
        for e in self.cache.values() {
            if let CacheEntry::Series { series, seen, seen_before, track: true } = e {
                let (seen, seen_before) = (*seen, *seen_before);
                let was_live = seen == prev || (seen == iter && seen_before == prev);
                let still_live = seen == iter && !failed;
                if was_live && !still_live {
                    // Refused only if the series is gone or has newer samples: nothing to mark.
                    let _ = app.append_to(series, t, stale);
                }
            }
        }
    }

    fn append_report(&mut self, app: &mut strata_tsdb::head::Appender<'_>, t: i64, values: [f64; 5]) {
        for ((r, labels), v) in self.report_series.iter_mut().zip(&self.report_labels).zip(values) {
            let done = r.as_ref().is_some_and(|s| app.append_to(s, t, v).is_ok());
            if !done {
                *r = app.append_handle(labels, t, v).ok();
            }
        }
    }

    /// When the loop stops because its target went away: every live series, and the report
    /// series, get a stale marker at `t`, as for a failed scrape that follows the last one.
    pub fn end_of_run_staleness(&mut self, db: &Db, t: i64) {
        if !self.last_ok {
            return;
        }
        self.iter += 1;
        let mut app = db.appender();
        self.mark_stale(&mut app, t, true);
        self.append_report(&mut app, t, [f64::from_bits(STALE_NAN_BITS); 5]);
        if let Err(e) = app.commit() {
            tracing::warn!(target = %self.target.url, error = %e, "writing end-of-run stale markers failed");
        }
        self.last_ok = false;
    }
}

/// The metadata entry of `family`, created as `unknown` the first time (allocates only then).
fn family_metadata<'m>(m: &'m mut MetadataMap, family: &str) -> &'m mut Metadata {
    m.entry_ref(family).or_insert_with(|| Metadata { kind: MetricType::Unknown.as_str(), ..Default::default() })
}

/// Puts the target's labels on an exposed series. With `honor_labels` the exposed value wins;
/// otherwise the target's does, and a clashing exposed label is kept as `exported_<name>`
/// (prefixed again until the name is free), shortest names first, as Prometheus does.
pub fn merge_target_labels(ls: &mut LabelMap, target: &Labels, honor_labels: bool) {
    if honor_labels {
        for l in target.iter() {
            ls.entry(l.name.to_string()).or_insert_with(|| l.value.to_string());
        }
        return;
    }
    let mut clashes: Vec<(String, String)> = Vec::new();
    for l in target.iter() {
        if let Some(old) = ls.insert(l.name.to_string(), l.value.to_string()) {
            if !old.is_empty() {
                clashes.push((l.name.to_string(), old));
            }
        }
    }
    clashes.sort_by_key(|(n, _)| n.len());
    for (name, value) in clashes {
        let mut new = name;
        loop {
            new = format!("exported_{new}");
            if let std::collections::btree_map::Entry::Vacant(e) = ls.entry(new.clone()) {
                e.insert(value);
                break;
            }
        }
    }
}

/// `label_limit`, `label_name_length_limit` and `label_value_length_limit`, with Prometheus'
/// messages.
fn check_label_limits(job: &Job, metric: &str, ls: &LabelMap) -> Result<(), String> {
    let short = |s: &str| s.chars().take(50).collect::<String>();
    if job.label_limit > 0 && ls.len() > job.label_limit {
        return Err(format!(
            "label_limit exceeded (metric: {}, number of labels: {}, limit: {})",
            short(metric),
            ls.len(),
            job.label_limit
        ));
    }
    for (n, v) in ls {
        if job.label_name_length_limit > 0 && n.len() > job.label_name_length_limit {
            return Err(format!(
                "label_name_length_limit exceeded (metric: {}, label name: {}, length: {}, limit: {})",
                short(metric),
                short(n),
                n.len(),
                job.label_name_length_limit
            ));
        }
        if job.label_value_length_limit > 0 && v.len() > job.label_value_length_limit {
            return Err(format!(
                "label_value_length_limit exceeded (metric: {}, label name: {}, value: {:?}, length: {}, limit: {})",
                short(metric),
                short(n),
                short(v),
                v.len(),
                job.label_value_length_limit
            ));
        }
    }
    Ok(())
}

/// The parser for a response's Content-Type; unknown or missing types use the job's fallback
/// protocol, else the Prometheus text format (what Prometheus 2 and VictoriaMetrics do).
pub fn format_for(content_type: Option<&str>, fallback: Option<ScrapeProtocol>) -> Format {
    let media = content_type.and_then(|c| c.split(';').next()).map(|m| m.trim().to_ascii_lowercase());
    match media.as_deref() {
        Some("application/openmetrics-text") => Format::OpenMetrics,
        Some("text/plain") => Format::Prometheus,
        _ => match fallback {
            Some(ScrapeProtocol::OpenMetricsText0 | ScrapeProtocol::OpenMetricsText1) => Format::OpenMetrics,
            _ => Format::Prometheus,
        },
    }
}

/// The HTTP client for a job: its TLS settings, redirects and proxy.
pub fn build_client(job: &Job) -> Result<reqwest::Client, String> {
    build_http_client(&job.tls, job.follow_redirects, job.proxy_url.as_deref())
}

/// An HTTP client with Prometheus' client settings: TLS, redirects, proxy.
pub fn build_http_client(
    tls: &super::config::TlsConfig,
    follow_redirects: bool,
    proxy_url: Option<&str>,
) -> Result<reqwest::Client, String> {
    let mut b = reqwest::Client::builder()
        .user_agent(concat!("Strata/", env!("CARGO_PKG_VERSION")))
        .redirect(if follow_redirects {
            reqwest::redirect::Policy::limited(10)
        } else {
            reqwest::redirect::Policy::none()
        })
        .pool_max_idle_per_host(2)
        .tcp_nodelay(true);
    if let Some(ca) = &tls.ca_file {
        let pem = std::fs::read(ca).map_err(|e| format!("tls_config ca_file {}: {e}", ca.display()))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| format!("tls_config ca_file {}: {e}", ca.display()))?;
        b = b.tls_built_in_root_certs(false);
        for c in certs {
            b = b.add_root_certificate(c);
        }
    }
    if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
        let mut pem = std::fs::read(cert).map_err(|e| format!("tls_config cert_file {}: {e}", cert.display()))?;
        pem.push(b'\n');
        pem.extend(std::fs::read(key).map_err(|e| format!("tls_config key_file {}: {e}", key.display()))?);
        let id = reqwest::Identity::from_pem(&pem).map_err(|e| format!("tls_config cert_file/key_file: {e}"))?;
        b = b.identity(id);
    }
    if tls.insecure_skip_verify {
        b = b.danger_accept_invalid_certs(true);
    }
    if let Some(v) = tls.min_version {
        b = b.min_tls_version(match v {
            super::config::TlsVersion::TLS12 => reqwest::tls::Version::TLS_1_2,
            super::config::TlsVersion::TLS13 => reqwest::tls::Version::TLS_1_3,
        });
    }
    match proxy_url {
        Some(p) => b = b.proxy(reqwest::Proxy::all(p).map_err(|e| format!("proxy_url {p:?}: {e}"))?),
        None => b = b.no_proxy(),
    }
    b.build().map_err(|e| format!("HTTP client: {e}"))
}

/// An error and its causes, `a: b: c` (reqwest's own Display leaves the causes out).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        // Many errors already print their source (`thiserror`'s "{0}"): not twice.
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

/// The request a target's scrapes send, built once per loop (URL parsed, headers and
/// credentials encoded) and cloned for each scrape.
pub fn prepare_request(client: &reqwest::Client, job: &Job, target: &Target) -> Result<reqwest::Request, String> {
    let timeout = target.timeout.as_duration();
    let url = reqwest::Url::parse(&target.url).map_err(|e| format!("invalid target URL {:?}: {e}", target.url))?;
    let mut req = client
        .get(url)
        .header(reqwest::header::ACCEPT, &job.accept)
        .header("X-Prometheus-Scrape-Timeout-Seconds", format!("{}", timeout.as_secs_f64()))
        .timeout(timeout);
    match &job.auth {
        Auth::None => {}
        Auth::Basic { username, password } => req = req.basic_auth(username, Some(password)),
        Auth::Header { kind, credentials } => {
            req = req.header(reqwest::header::AUTHORIZATION, format!("{kind} {credentials}"))
        }
    }
    req.build().map_err(|e| format!("building the scrape request: {}", error_chain(&e)))
}

/// Fetches the target once into `buf`: the body's format, or what went wrong.
pub async fn fetch(
    client: &reqwest::Client,
    request: &Result<reqwest::Request, String>,
    job: &Job,
    target: &Target,
    buf: &mut Vec<u8>,
) -> Result<Format, String> {
    buf.clear();
    let req = request.as_ref().map_err(Clone::clone)?;
    let req = req.try_clone().ok_or("the scrape request cannot be repeated")?;
    let deadline = tokio::time::Instant::now() + target.timeout.as_duration();
    let work = async {
        let mut resp = client.execute(req).await.map_err(|e| error_chain(&e))?;
        if resp.status() != reqwest::StatusCode::OK {
            return Err(format!("server returned HTTP status {}", resp.status()));
        }
        let ct = resp.headers().get(reqwest::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let limit = if job.body_size_limit > 0 { job.body_size_limit } else { BODY_SIZE_CAP };
        while let Some(chunk) = resp.chunk().await.map_err(|e| error_chain(&e))? {
            if (buf.len() + chunk.len()) as u64 > limit {
                return Err(format!("body size limit exceeded (limit {limit} bytes)"));
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(format_for(ct.as_deref(), job.fallback_protocol))
    };
    match tokio::time::timeout_at(deadline, work).await {
        Ok(r) => r,
        Err(_) => Err(format!("scrape timed out after {}", target.timeout)),
    }
}

/// Where in each interval this target is scraped: spread by a hash of the target, so that
/// thousands of targets do not all fire at once, and stable across restarts.
pub fn offset_ms(target: &Target, interval_ms: i64, seed: u64) -> i64 {
    ((target.hash() ^ seed) % interval_ms.max(1) as u64) as i64
}

pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// The next scrape time after `now` (milliseconds since the epoch) on the target's grid.
pub fn next_tick(now: i64, interval: i64, offset: i64) -> i64 {
    let base = now - now.rem_euclid(interval) + offset;
    if base > now {
        base
    } else {
        base + interval
    }
}

/// What a running loop is told when it stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopMode {
    /// The target went away: mark its series stale.
    Gone,
    /// Shutdown, or replaced by a loop for the same target with a new configuration.
    Quiet,
}

/// Response buffers shared by every loop: a scrape takes one for its body and gives it back
/// after the ingest, so memory holds a buffer per scrape in flight, not one per target (1000
/// targets of a 60 KiB exposition would otherwise keep 60 MiB).
#[derive(Debug, Default)]
pub struct BufferPool {
    free: Mutex<Vec<Vec<u8>>>,
}

impl BufferPool {
    /// Buffers kept for reuse; more in flight at once are freed when returned.
    const KEEP: usize = 32;

    fn take(&self) -> Vec<u8> {
        self.free.lock().pop().unwrap_or_default()
    }

    fn give(&self, mut buf: Vec<u8>) {
        buf.clear();
        let mut free = self.free.lock();
        if free.len() < Self::KEEP {
            free.push(buf);
        }
    }
}

/// What every loop shares.
#[derive(Clone, Debug)]
pub struct LoopShared {
    pub db: Arc<Db>,
    pub stats: Arc<ScrapeStats>,
    pub buffers: Arc<BufferPool>,
    /// Mixed into each target's offset (see `offset_ms`).
    pub seed: u64,
}

/// Runs the loop until told to stop.
pub async fn run(
    mut state: LoopState,
    client: reqwest::Client,
    shared: LoopShared,
    health: Arc<Mutex<TargetHealth>>,
    mut stop: tokio::sync::watch::Receiver<Option<StopMode>>,
) {
    let LoopShared { db, stats, buffers, seed } = shared;
    let interval = state.target.interval.0;
    let offset = offset_ms(&state.target, interval, seed);
    let request = prepare_request(&client, &state.job, &state.target);
    // With a WAL that fsyncs in the background, a commit never waits for the disk, and an
    // ingest (well under a millisecond for a typical target) runs right here; the hand-off
    // to a blocking thread and back cost more than that. Under `--wal-fsync always` a commit
    // waits for an fsync, and while the head is being truncated an appender waits for it:
    // neither may hold up a runtime thread, so those ingests go to a blocking thread.
    let fsync_per_commit = matches!(db.options().head.wal.fsync, strata_tsdb::wal::FsyncPolicy::Always);
    let mut tick = next_tick(now_ms(), interval, offset);
    loop {
        let wait = Duration::from_millis((tick - now_ms()).max(0) as u64);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => break,
        }
        // The scheduled time, not the wake-up time: regular timestamps compress to almost
        // nothing (delta-of-delta zero) and line up across targets.
        let t = tick;
        let started = Instant::now();
        let mut buf = buffers.take();
        let fetched = tokio::select! {
            r = fetch(&client, &request, &state.job, &state.target, &mut buf) => r,
            _ = stop.changed() => {
                buffers.give(buf);
                break;
            }
        };
        let inline = !fsync_per_commit && !db.head().appender_would_wait();
        let (err, counts, took) = if inline {
            let took = started.elapsed();
            let body = fetched.as_ref().map(|f| (buf.as_slice(), *f)).map_err(Clone::clone);
            let (err, counts) = state.ingest(&db, &stats, t, body, took);
            buffers.give(buf);
            (err, counts, took)
        } else {
            let (db2, stats2) = (db.clone(), stats.clone());
            let ingested = tokio::task::spawn_blocking(move || {
                let took = started.elapsed();
                let body = fetched.as_ref().map(|f| (buf.as_slice(), *f)).map_err(Clone::clone);
                let (err, counts) = state.ingest(&db2, &stats2, t, body, took);
                (state, buf, err, counts, took)
            })
            .await;
            let Ok((s, b, err, counts, took)) = ingested else {
                tracing::error!("scrape ingest task panicked; stopping the loop");
                return;
            };
            state = s;
            buffers.give(b);
            (err, counts, took)
        };
        stats.scrapes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if err.is_some() {
            stats.failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        {
            let mut h = health.lock();
            h.up = Some(err.is_none());
            h.last_error = err.unwrap_or_default();
            h.last_scrape = Some(UNIX_EPOCH + Duration::from_millis(t as u64));
            h.last_duration = took;
            h.last_samples = counts.scraped;
        }
        // Skip ticks a slow scrape overran, as Prometheus' ticker does.
        let now = now_ms();
        tick += interval;
        if tick <= now {
            tick = next_tick(now, interval, offset);
        }
    }
    if *stop.borrow() == Some(StopMode::Gone) {
        let _ = tokio::task::spawn_blocking(move || state.end_of_run_staleness(&db, now_ms())).await;
    }
}

#[cfg(test)]
mod tests;
