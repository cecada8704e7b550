//! The `global` and `scrape_configs` sections, in the shape of Prometheus' `prometheus.yml`,
//! so that a Prometheus scrape section works here unchanged.
//!
//! Parsing is strict: an unknown field, a bad duration or regex is refused by the YAML decoder
//! with its line and column; combinations that cannot work (timeout above interval, two jobs of
//! one name, both a password and a password file) are refused by `resolve` with the job named.
//! Prometheus fields Strata does not implement (other service discoveries, OAuth2, the protobuf
//! exposition) are unknown fields and refused the same way, never silently ignored.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer};

use super::relabel::RelabelConfig;

/// A Prometheus duration (`15s`, `1m30s`), in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PromDuration(pub i64);

impl PromDuration {
    pub fn as_duration(self) -> Duration {
        Duration::from_millis(self.0.max(0) as u64)
    }
}

impl std::fmt::Display for PromDuration {
    /// Prometheus' rendering: the largest units first, `1m30s`, `0s` for zero.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut ms = self.0;
        if ms == 0 {
            return f.write_str("0s");
        }
        for (unit, size) in [
            ("y", 31_536_000_000),
            ("w", 604_800_000),
            ("d", 86_400_000),
            ("h", 3_600_000),
            ("m", 60_000),
            ("s", 1000),
            ("ms", 1),
        ] {
            if ms >= size {
                write!(f, "{}{unit}", ms / size)?;
                ms %= size;
            }
        }
        Ok(())
    }
}

impl<'de> Deserialize<'de> for PromDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        strata_model::parse_duration_ms(&s).map(PromDuration).map_err(D::Error::custom)
    }
}

/// A size in Prometheus' notation (`10MB`); `0` is no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if s == "0" {
            return Ok(ByteSize(0));
        }
        crate::config::parse_bytes(&s).map(ByteSize).map_err(D::Error::custom)
    }
}

/// Exposition formats a scrape may ask for, by Prometheus' names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum ScrapeProtocol {
    #[serde(rename = "OpenMetricsText1.0.0")]
    OpenMetricsText1,
    #[serde(rename = "OpenMetricsText0.0.1")]
    OpenMetricsText0,
    #[serde(rename = "PrometheusText1.0.0")]
    PrometheusText1,
    #[serde(rename = "PrometheusText0.0.4")]
    PrometheusText0,
}

impl ScrapeProtocol {
    /// Prometheus 3's default order.
    pub const DEFAULT: [ScrapeProtocol; 4] = [
        ScrapeProtocol::OpenMetricsText1,
        ScrapeProtocol::OpenMetricsText0,
        ScrapeProtocol::PrometheusText1,
        ScrapeProtocol::PrometheusText0,
    ];

    /// The media type asked for; the 1.0.0 formats also say that UTF-8 names may come
    /// unescaped (Strata stores them as they are), as Prometheus 3 does by default.
    pub fn media_type(self) -> &'static str {
        match self {
            ScrapeProtocol::OpenMetricsText1 => "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8",
            ScrapeProtocol::OpenMetricsText0 => "application/openmetrics-text;version=0.0.1",
            ScrapeProtocol::PrometheusText1 => "text/plain;version=1.0.0;escaping=allow-utf-8",
            ScrapeProtocol::PrometheusText0 => "text/plain;version=0.0.4",
        }
    }
}

/// The `Accept` header Prometheus sends for these protocols: each with a falling weight, then
/// anything at the lowest.
pub fn accept_header(protocols: &[ScrapeProtocol]) -> String {
    // Weights count down from one above the number of known protocols (5 with Prometheus'
    // protobuf, which keeps the header byte-identical to Prometheus').
    let mut weight = 6;
    let mut out = String::new();
    for p in protocols {
        out.push_str(p.media_type());
        out.push_str(&format!(";q=0.{weight},"));
        weight -= 1;
    }
    out.push_str(&format!("*/*;q=0.{weight}"));
    out
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GlobalConfig {
    pub scrape_interval: Option<PromDuration>,
    pub scrape_timeout: Option<PromDuration>,
    /// How often rule groups are evaluated unless a group sets its own `interval` (1m).
    pub evaluation_interval: Option<PromDuration>,
    #[serde(default)]
    pub external_labels: BTreeMap<String, String>,
    pub scrape_protocols: Option<Vec<ScrapeProtocol>>,
    pub body_size_limit: Option<ByteSize>,
    pub sample_limit: Option<usize>,
    pub label_limit: Option<usize>,
    pub label_name_length_limit: Option<usize>,
    pub label_value_length_limit: Option<usize>,
    pub target_limit: Option<usize>,
}

pub const SCRAPE_INTERVAL_DEFAULT: PromDuration = PromDuration(60_000);
pub const SCRAPE_TIMEOUT_DEFAULT: PromDuration = PromDuration(10_000);

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BasicAuth {
    pub username: String,
    pub password: Option<String>,
    pub password_file: Option<PathBuf>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Authorization {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub credentials: Option<String>,
    pub credentials_file: Option<PathBuf>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub server_name: Option<String>,
    #[serde(default)]
    pub insecure_skip_verify: bool,
    pub min_version: Option<TlsVersion>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum TlsVersion {
    TLS12,
    TLS13,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticConfig {
    #[serde(default)]
    pub targets: Vec<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSdConfig {
    pub files: Vec<String>,
    pub refresh_interval: Option<PromDuration>,
}

pub const FILE_SD_REFRESH_DEFAULT: PromDuration = PromDuration(300_000);

/// One `scrape_configs` entry as written.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScrapeConfig {
    pub job_name: String,
    #[serde(default)]
    pub honor_labels: bool,
    pub honor_timestamps: Option<bool>,
    #[serde(default)]
    pub track_timestamps_staleness: bool,
    pub scrape_interval: Option<PromDuration>,
    pub scrape_timeout: Option<PromDuration>,
    pub scrape_protocols: Option<Vec<ScrapeProtocol>>,
    pub fallback_scrape_protocol: Option<ScrapeProtocol>,
    pub metrics_path: Option<String>,
    pub scheme: Option<String>,
    #[serde(default)]
    pub params: BTreeMap<String, Vec<String>>,
    pub basic_auth: Option<BasicAuth>,
    pub authorization: Option<Authorization>,
    #[serde(default)]
    pub tls_config: TlsConfig,
    pub follow_redirects: Option<bool>,
    /// Accepted; Strata scrapes over HTTP/1.1.
    pub enable_http2: Option<bool>,
    pub proxy_url: Option<String>,
    #[serde(default)]
    pub static_configs: Vec<StaticConfig>,
    #[serde(default)]
    pub file_sd_configs: Vec<FileSdConfig>,
    #[serde(default)]
    pub http_sd_configs: Vec<super::http_sd::HttpSdConfig>,
    #[serde(default)]
    pub kubernetes_sd_configs: Vec<super::kubernetes::KubernetesSdConfig>,
    #[serde(default)]
    pub dns_sd_configs: Vec<super::dns_sd::DnsSdConfig>,
    #[serde(default)]
    pub relabel_configs: Vec<RelabelConfig>,
    #[serde(default)]
    pub metric_relabel_configs: Vec<RelabelConfig>,
    pub body_size_limit: Option<ByteSize>,
    pub sample_limit: Option<usize>,
    pub label_limit: Option<usize>,
    pub label_name_length_limit: Option<usize>,
    pub label_value_length_limit: Option<usize>,
    pub target_limit: Option<usize>,
}

/// How a job authenticates, with secrets read from their files.
#[derive(Clone, Debug, PartialEq)]
pub enum Auth {
    None,
    Basic {
        username: String,
        password: String,
    },
    /// `Authorization: <kind> <credentials>` (kind defaults to Bearer).
    Header {
        kind: String,
        credentials: String,
    },
}

/// A job with every default filled in and every file path made absolute: what the scrape
/// manager runs. Two jobs compare equal exactly when their scrapes would behave the same, which
/// is how a reload tells unchanged jobs from changed ones.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    pub name: String,
    pub interval: PromDuration,
    pub timeout: PromDuration,
    pub honor_labels: bool,
    pub honor_timestamps: bool,
    pub track_timestamps_staleness: bool,
    pub accept: String,
    /// Parser for a response with no or an unknown Content-Type.
    pub fallback_protocol: Option<ScrapeProtocol>,
    pub metrics_path: String,
    pub scheme: String,
    pub params: BTreeMap<String, Vec<String>>,
    pub auth: Auth,
    pub tls: TlsConfig,
    pub follow_redirects: bool,
    pub proxy_url: Option<String>,
    pub static_configs: Vec<StaticConfig>,
    pub file_sd_configs: Vec<FileSdConfig>,
    pub http_sd: Vec<super::http_sd::HttpSd>,
    pub kubernetes_sd: Vec<super::kubernetes::KubernetesSd>,
    pub dns_sd: Vec<super::dns_sd::DnsSd>,
    pub relabel_configs: Vec<RelabelConfig>,
    pub metric_relabel_configs: Vec<RelabelConfig>,
    /// 0 in each limit means none, as in Prometheus, except the body size: see `BODY_SIZE_CAP`.
    pub body_size_limit: u64,
    pub sample_limit: usize,
    pub label_limit: usize,
    pub label_name_length_limit: usize,
    pub label_value_length_limit: usize,
    pub target_limit: usize,
}

/// The body size a scrape reads when its job sets no `body_size_limit`: Prometheus reads without
/// bound, which lets one misbehaving target exhaust memory. 256 MiB is far above any real
/// exposition (node_exporter serves ~100 KiB).
pub const BODY_SIZE_CAP: u64 = 256 << 20;

fn job_err(job: &str, msg: impl std::fmt::Display) -> String {
    format!("scrape config with job name {job:?}: {msg}")
}

fn read_secret(path: &Path, base: &Path, err: &dyn Fn(&str) -> String, field: &str) -> Result<String, String> {
    let p = base.join(path);
    let s = std::fs::read_to_string(&p).map_err(|e| err(&format!("{field} {}: {e}", p.display())))?;
    Ok(s.trim_end_matches(['\n', '\r']).to_owned())
}

/// A client's credentials (`basic_auth` or `authorization`, Prometheus' HTTP client settings),
/// secrets read from their files; `err` places a message (names the job or Alertmanager).
pub fn resolve_auth(
    basic: Option<&BasicAuth>,
    authorization: Option<&Authorization>,
    base: &Path,
    err: &dyn Fn(&str) -> String,
) -> Result<Auth, String> {
    Ok(match (basic, authorization) {
        (Some(_), Some(_)) => return Err(err("at most one of basic_auth and authorization may be set")),
        (Some(b), None) => {
            let password = match (&b.password, &b.password_file) {
                (Some(_), Some(_)) => {
                    return Err(err("basic_auth: at most one of password and password_file may be set"))
                }
                (Some(p), None) => p.clone(),
                (None, Some(f)) => read_secret(f, base, err, "basic_auth password_file")?,
                (None, None) => String::new(),
            };
            Auth::Basic { username: b.username.clone(), password }
        }
        (None, Some(a)) => {
            let kind = a.kind.clone().unwrap_or_else(|| "Bearer".into());
            if kind.eq_ignore_ascii_case("basic") {
                return Err(err("authorization type cannot be set to \"basic\", use \"basic_auth\" instead"));
            }
            let credentials = match (&a.credentials, &a.credentials_file) {
                (Some(_), Some(_)) => {
                    return Err(err("authorization: at most one of credentials and credentials_file may be set"))
                }
                (Some(s), None) => s.clone(),
                (None, Some(f)) => read_secret(f, base, err, "authorization credentials_file")?,
                (None, None) => String::new(),
            };
            Auth::Header { kind, credentials }
        }
        (None, None) => Auth::None,
    })
}

/// Fills in defaults from `global` and checks each job; `base` is the configuration file's
/// directory, against which relative file paths resolve (as in Prometheus).
pub fn resolve(global: &GlobalConfig, jobs: &[ScrapeConfig], base: &Path) -> Result<Vec<Job>, String> {
    let g_interval = global.scrape_interval.unwrap_or(SCRAPE_INTERVAL_DEFAULT);
    // An unset timeout is the default, or the interval when that is shorter (Prometheus).
    let g_timeout = global.scrape_timeout.unwrap_or(SCRAPE_TIMEOUT_DEFAULT.min(g_interval));
    if g_interval.0 <= 0 {
        return Err("global scrape_interval must be above zero".into());
    }
    if g_timeout > g_interval {
        return Err("global scrape timeout greater than scrape interval".into());
    }
    for (name, value) in &global.external_labels {
        if name.is_empty() || value.is_empty() {
            return Err(format!("global external_labels: empty name or value in {name:?}: {value:?}"));
        }
    }
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(jobs.len());
    for c in jobs {
        let name = c.job_name.clone();
        if name.is_empty() {
            return Err("scrape config: job_name is empty".into());
        }
        if !seen.insert(name.clone()) {
            return Err(format!("found multiple scrape configs with job name {name:?}"));
        }
        let interval = c.scrape_interval.unwrap_or(g_interval);
        if interval.0 <= 0 {
            return Err(job_err(&name, "scrape_interval must be above zero"));
        }
        let timeout = match c.scrape_timeout {
            Some(t) if t > interval => {
                return Err(format!(
                    "scrape timeout greater than scrape interval for scrape config with job name {name:?}"
                ))
            }
            Some(t) if t.0 <= 0 => return Err(job_err(&name, "scrape_timeout must be above zero")),
            Some(t) => t,
            None => g_timeout.min(interval),
        };
        let scheme = c.scheme.clone().unwrap_or_else(|| "http".into());
        if scheme != "http" && scheme != "https" {
            return Err(job_err(&name, format!("unknown scheme {scheme:?}: expected http or https")));
        }
        let metrics_path = c.metrics_path.clone().unwrap_or_else(|| "/metrics".into());
        if !metrics_path.starts_with('/') {
            return Err(job_err(&name, format!("metrics_path {metrics_path:?} must start with '/'")));
        }
        let protocols = c.scrape_protocols.clone().or_else(|| global.scrape_protocols.clone());
        let protocols = protocols.unwrap_or_else(|| ScrapeProtocol::DEFAULT.to_vec());
        if protocols.is_empty() {
            return Err(job_err(&name, "scrape_protocols is empty"));
        }
        let auth = resolve_auth(c.basic_auth.as_ref(), c.authorization.as_ref(), base, &|m| job_err(&name, m))?;
        if c.tls_config.server_name.is_some() {
            // Verifying a certificate against a name other than the URL's host is not wired
            // into the HTTP client yet; refusing is better than scraping with the wrong check.
            return Err(job_err(&name, "tls_config server_name is not supported yet"));
        }
        let mut tls = c.tls_config.clone();
        for f in [&mut tls.ca_file, &mut tls.cert_file, &mut tls.key_file].into_iter().flatten() {
            *f = base.join(&*f);
        }
        if tls.cert_file.is_some() != tls.key_file.is_some() {
            return Err(job_err(&name, "tls_config: cert_file and key_file must be set together"));
        }
        for sc in &c.static_configs {
            for t in &sc.targets {
                if t.is_empty() || t.contains('/') {
                    return Err(job_err(&name, format!("{t:?} is not a valid hostname (expected host:port)")));
                }
            }
        }
        let mut file_sd = c.file_sd_configs.clone();
        for f in &mut file_sd {
            for pattern in &mut f.files {
                let ok = [".json", ".yml", ".yaml"].iter().any(|ext| pattern.ends_with(ext));
                if !ok {
                    return Err(job_err(
                        &name,
                        format!(
                            "path name {pattern:?} is not valid for file discovery (expected .json, .yml or .yaml)"
                        ),
                    ));
                }
                *pattern = base.join(&*pattern).display().to_string();
            }
        }
        let http_sd =
            c.http_sd_configs.iter().map(|h| h.resolve(base, &|m| job_err(&name, m))).collect::<Result<Vec<_>, _>>()?;
        let kubernetes_sd = c
            .kubernetes_sd_configs
            .iter()
            .map(|k| k.resolve(base, &|m| job_err(&name, m)))
            .collect::<Result<Vec<_>, _>>()?;
        let dns_sd =
            c.dns_sd_configs.iter().map(|d| d.resolve(&|m| job_err(&name, m))).collect::<Result<Vec<_>, _>>()?;
        for (i, r) in c.relabel_configs.iter().enumerate() {
            r.validate().map_err(|e| job_err(&name, format!("relabel_configs[{i}]: {e}")))?;
        }
        for (i, r) in c.metric_relabel_configs.iter().enumerate() {
            r.validate().map_err(|e| job_err(&name, format!("metric_relabel_configs[{i}]: {e}")))?;
        }
        if let Some(p) = &c.proxy_url {
            if !(p.starts_with("http://") || p.starts_with("https://")) {
                return Err(job_err(&name, format!("proxy_url {p:?}: expected an http:// or https:// URL")));
            }
        }
        let pick = |job: Option<usize>, glob: Option<usize>| job.or(glob).unwrap_or(0);
        out.push(Job {
            name: name.clone(),
            interval,
            timeout,
            honor_labels: c.honor_labels,
            honor_timestamps: c.honor_timestamps.unwrap_or(true),
            track_timestamps_staleness: c.track_timestamps_staleness,
            accept: accept_header(&protocols),
            fallback_protocol: c.fallback_scrape_protocol,
            metrics_path,
            scheme,
            params: c.params.clone(),
            auth,
            tls,
            follow_redirects: c.follow_redirects.unwrap_or(true),
            proxy_url: c.proxy_url.clone(),
            static_configs: c.static_configs.clone(),
            file_sd_configs: file_sd,
            http_sd,
            kubernetes_sd,
            dns_sd,
            relabel_configs: c.relabel_configs.clone(),
            metric_relabel_configs: c.metric_relabel_configs.clone(),
            body_size_limit: c.body_size_limit.or(global.body_size_limit).map_or(0, |b| b.0),
            sample_limit: pick(c.sample_limit, global.sample_limit),
            label_limit: pick(c.label_limit, global.label_limit),
            label_name_length_limit: pick(c.label_name_length_limit, global.label_name_length_limit),
            label_value_length_limit: pick(c.label_value_length_limit, global.label_value_length_limit),
            target_limit: pick(c.target_limit, global.target_limit),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct File {
        #[serde(default)]
        global: GlobalConfig,
        #[serde(default)]
        scrape_configs: Vec<ScrapeConfig>,
    }

    fn load(yaml: &str) -> Result<Vec<Job>, String> {
        let f: File = yaml_serde::from_str(yaml).map_err(|e| e.to_string())?;
        resolve(&f.global, &f.scrape_configs, Path::new("/etc/strata"))
    }

    #[test]
    fn prometheus_example_config_resolves_with_its_defaults() {
        let jobs = load(
            "global:\n  scrape_interval: 15s\n  evaluation_interval: 15s\n  external_labels:\n    monitor: codelab\nscrape_configs:\n  - job_name: prometheus\n    static_configs:\n      - targets: ['localhost:9090']\n  - job_name: node\n    scrape_interval: 5s\n    scrape_timeout: 5s\n    metrics_path: /probe\n    scheme: https\n    params:\n      module: [http_2xx]\n    file_sd_configs:\n      - files: ['targets/*.json']\n",
        )
        .unwrap();
        assert_eq!(jobs[0].name, "prometheus");
        assert_eq!(jobs[0].interval, PromDuration(15_000));
        assert_eq!(jobs[0].timeout, PromDuration(10_000));
        assert_eq!(jobs[0].metrics_path, "/metrics");
        assert!(jobs[0].honor_timestamps && !jobs[0].honor_labels);
        assert_eq!(jobs[1].timeout, PromDuration(5_000));
        assert_eq!(jobs[1].scheme, "https");
        assert_eq!(jobs[1].file_sd_configs[0].files, ["/etc/strata/targets/*.json"]);
        // A job interval below the global timeout lowers the timeout to the interval.
        let jobs = load("scrape_configs:\n  - job_name: fast\n    scrape_interval: 2s\n").unwrap();
        assert_eq!(jobs[0].timeout, PromDuration(2_000));
        // So does a global interval below the default timeout, when no timeout is set.
        let jobs = load("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: fast\n").unwrap();
        assert_eq!(jobs[0].timeout, PromDuration(1_000));
    }

    #[test]
    fn accept_header_is_prometheus_3s() {
        assert_eq!(
            accept_header(&ScrapeProtocol::DEFAULT),
            "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
        );
    }

    #[test]
    fn mistakes_are_refused_with_the_job_or_line_named() {
        let cases = [
            ("scrape_configs:\n  - job_name: a\n    scrape_interval: 5s\n    scrape_timeout: 10s\n", "scrape timeout greater than scrape interval for scrape config with job name \"a\""),
            ("scrape_configs:\n  - job_name: a\n  - job_name: a\n", "multiple scrape configs with job name \"a\""),
            ("scrape_configs:\n  - job_name: a\n    scheme: ftp\n", "unknown scheme"),
            ("scrape_configs:\n  - job_name: a\n    static_configs:\n      - targets: ['http://x:1']\n", "not a valid hostname"),
            ("scrape_configs:\n  - job_name: a\n    file_sd_configs:\n      - files: [targets.txt]\n", "not valid for file discovery"),
            ("scrape_configs:\n  - job_name: a\n    relabel_configs:\n      - action: hashmod\n        target_label: x\n", "relabel_configs[0]: relabel configuration for hashmod requires non-zero modulus"),
            ("scrape_configs:\n  - job_name: a\n    basic_auth: {username: u, password: p, password_file: f}\n", "at most one of password"),
            ("global:\n  scrape_interval: 5s\n  scrape_timeout: 6s\n", "global scrape timeout greater"),
            ("scrape_configs:\n  - job_name: a\n    tls_config: {server_name: x}\n", "server_name is not supported yet"),
            ("scrape_configs:\n  - job_name: a\n    kubernetes_sd_configs: [{api_server: 'https://k:6443'}]\n", "job name \"a\": kubernetes_sd_configs: role missing"),
            ("scrape_configs:\n  - job_name: a\n    kubernetes_sd_configs: [{role: pods}]\n", "unknown variant `pods`"),
            ("scrape_configs:\n  - job_name: a\n    kubernetes_sd_configs: [{role: pod, api_server: 'https://k', kubeconfig_file: kc}]\n", "cannot use 'kubeconfig_file' and 'api_server' simultaneously"),
            ("scrape_configs:\n  - job_name: a\n    kubernetes_sd_configs: [{role: pod, basic_auth: {username: u}}]\n", "please provide the 'api_server' URL explicitly"),
            ("scrape_configs:\n  - job_name: a\n    kubernetes_sd_configs: [{role: pod, api_server: 'https://k', namespaces: {own_namespace: true}}]\n", "cannot use 'api_server' and 'namespaces.own_namespace'"),
            ("scrape_configs:\n  - job_name: a\n    kubernetes_sd_configs: [{role: pod, selectors: [{role: service, label: 'a=b'}]}]\n", "pod role supports only pod selectors"),
            ("scrape_configs:\n  - job_name: a\n    kubernetes_sd_configs: [{role: endpoints, selectors: [{role: pod, label: 'a=b'}, {role: pod, field: 'x=y'}]}]\n", "duplicated selector role: pod"),
            ("scrape_configs:\n  - job_name: a\n    kubernetes_sd_configs: [{role: pod, selectors: [{role: pod, label: 'env in (a,b'}]}]\n", "unbalanced parentheses"),
            ("scrape_configs:\n  - job_name: a\n    kubernetes_sd_configs: [{role: node, kubeconfig_file: /nonexistent/kc}]\n", "kubeconfig_file /nonexistent/kc"),
        ];
        for (yaml, want) in cases {
            let e = load(yaml).unwrap_err();
            assert!(e.contains(want), "{yaml}\n→ {e}");
        }
        let yaml_errors = [
            (
                "scrape_configs:\n  - job_name: a\n    kubernetes_sd_configs:\n      - role: pod\n        namespace: [a]\n",
                "unknown field `namespace`",
                "line 5",
            ),
            // A bad value is located at its job's entry, and named.
            (
                "scrape_configs:\n  - job_name: a\n    scrape_interval: often\n",
                "scrape_configs[0]: invalid duration \"often\"",
                "line 2",
            ),
            (
                "scrape_configs:\n  - job_name: a\n    scrape_protocols: [PrometheusProto]\n",
                "PrometheusProto",
                "line 3",
            ),
            ("global:\n  scrape_intervall: 1m\n", "unknown field `scrape_intervall`", "line 2"),
        ];
        for (yaml, want, line) in yaml_errors {
            let e = load(yaml).unwrap_err();
            assert!(e.contains(want) && e.contains(line), "{yaml}\n→ {e}");
        }
    }

    #[test]
    fn secrets_are_read_from_files_relative_to_the_config() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pw"), "s3cret\n").unwrap();
        let f: File = yaml_serde::from_str(
            "scrape_configs:\n  - job_name: a\n    basic_auth: {username: u, password_file: pw}\n  - job_name: b\n    authorization: {credentials: tok}\n",
        )
        .unwrap();
        let jobs = resolve(&f.global, &f.scrape_configs, dir.path()).unwrap();
        assert_eq!(jobs[0].auth, Auth::Basic { username: "u".into(), password: "s3cret".into() });
        assert_eq!(jobs[1].auth, Auth::Header { kind: "Bearer".into(), credentials: "tok".into() });
        let f: File = yaml_serde::from_str(
            "scrape_configs:\n  - job_name: a\n    basic_auth: {username: u, password_file: missing}\n",
        )
        .unwrap();
        let e = resolve(&f.global, &f.scrape_configs, dir.path()).unwrap_err();
        assert!(e.contains("password_file") && e.contains("missing"), "{e}");
    }

    #[test]
    fn durations_render_like_prometheus() {
        assert_eq!(PromDuration(90_000).to_string(), "1m30s");
        assert_eq!(PromDuration(0).to_string(), "0s");
        assert_eq!(PromDuration(15_000).to_string(), "15s");
        assert_eq!(PromDuration(1_500).to_string(), "1s500ms");
    }
}
