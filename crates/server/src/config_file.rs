//! `strata serve --config FILE`: the YAML configuration. It holds the storage settings and
//! limits that flags also set (a flag given on the command line wins over the file), and
//! Prometheus' `global` and `scrape_configs` sections (see `scrape::config`), so that a
//! Prometheus scrape section can be pasted in unchanged. Unknown or invalid settings are refused
//! with the line and the field.
//!
//! ```yaml
//! storage:
//!   retention: 30d
//!   retention_size: 500GB
//!   wal_fsync: always
//!   wal_segment_size: 64MB
//!   chunk_cache_size: 256MB
//!   series_cache_size: 64MB
//!   out_of_order_time_window: 30m
//!   rollup_tiers: 5m:90d,1h:2y
//!   exemplars:
//!     max_exemplars: 100000
//! limits:
//!   write_max_body_size: 64MB
//!   query_timeout: 1m
//!   query_max_concurrency: 8
//!   query_parallelism: 2
//! carbon:
//!   plaintext_listen_address: ":2003"
//!   pickle_listen_address: ":2004"
//!   out_of_order_window: 1d
//! global:
//!   scrape_interval: 15s
//!   evaluation_interval: 1m
//! rule_files: ['rules/*.yml']
//! otlp:
//!   promote_resource_attributes: [k8s.namespace.name]
//!   translation_strategy: UnderscoreEscapingWithSuffixes
//! alerting:
//!   alertmanagers:
//!     - static_configs:
//!         - targets: ['localhost:9093']
//! scrape_configs:
//!   - job_name: node
//!     static_configs:
//!       - targets: ['localhost:9100']
//! ```
//!
//! Without `--config`, Strata runs `default_config_text`: it scrapes itself.

use std::path::Path;

use serde::Deserialize;

use crate::rules::file::{expand_globs, load_file, GroupDef, LoadOptions};
use crate::rules::notifier::AlertingConfig;
use crate::scrape::config::{resolve, GlobalConfig, Job, ScrapeConfig};

#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    #[serde(default)]
    pub storage: StorageSection,
    #[serde(default)]
    pub limits: LimitsSection,
    #[serde(default)]
    pub carbon: CarbonSection,
    #[serde(default)]
    pub graphite: GraphiteSection,
    #[serde(default)]
    pub global: GlobalConfig,
    #[serde(default)]
    pub scrape_configs: Vec<ScrapeConfig>,
    /// Rule files (globs, relative to the configuration file), as Prometheus' `rule_files`.
    #[serde(default)]
    pub rule_files: Vec<String>,
    /// Where alerts go (`crate::rules::notifier`).
    #[serde(default)]
    pub alerting: AlertingConfig,
    /// How OTLP metrics become series (`crate::otlp`).
    #[serde(default)]
    pub otlp: crate::otlp::OtlpConfig,
}

/// The configuration `strata serve` runs without `--config`: Strata scrapes its own `/metrics`
/// every 15 s, like Prometheus' example configuration, so that a newcomer sees data at once.
pub fn default_config_text(listen: std::net::SocketAddr) -> String {
    let host = if listen.ip().is_unspecified() { format!("localhost:{}", listen.port()) } else { listen.to_string() };
    format!(
        "# Built-in configuration (strata serve without --config).\nglobal:\n  scrape_interval: 15s\nscrape_configs:\n  - job_name: strata\n    static_configs:\n      - targets: ['{host}']\n"
    )
}

/// Durations and sizes are strings in Prometheus' notation (`15d`, `512MB`).
#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StorageSection {
    pub retention: Option<String>,
    pub retention_size: Option<String>,
    pub wal_fsync: Option<String>,
    pub wal_compression: Option<bool>,
    /// WAL segment size, e.g. `64MB`.
    pub wal_segment_size: Option<String>,
    /// Memory for decompressed chunk groups, e.g. `64MB`.
    pub chunk_cache_size: Option<String>,
    /// Memory for series entries read from block indexes, e.g. `32MB`.
    pub series_cache_size: Option<String>,
    /// Prometheus' `storage.tsdb.out_of_order_time_window`.
    pub out_of_order_time_window: Option<String>,
    /// Rollup tiers, `interval:retention` by commas (`5m:90d,1h:2y`; `docs/rollups.md`).
    pub rollup_tiers: Option<String>,
    /// Prometheus' `storage.exemplars`.
    pub exemplars: Option<ExemplarsSection>,
}

#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExemplarsSection {
    /// How many exemplars the head keeps (100000); 0 keeps none.
    pub max_exemplars: Option<usize>,
}

#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    pub write_max_body_size: Option<String>,
    pub write_max_decompressed_size: Option<String>,
    pub write_max_series: Option<usize>,
    pub write_max_samples: Option<usize>,
    pub query_max_samples: Option<usize>,
    pub query_max_series: Option<usize>,
    pub query_timeout: Option<String>,
    pub query_lookback_delta: Option<String>,
    pub query_cache_size: Option<String>,
    pub query_cache_delay: Option<String>,
    pub query_max_concurrency: Option<usize>,
    pub query_parallelism: Option<usize>,
    pub query_max_depth: Option<usize>,
    pub web_read_timeout: Option<String>,
    pub web_read_header_timeout: Option<String>,
    pub web_max_connections: Option<usize>,
}

/// The carbon listeners (`--carbon.*` flags); each listener is off unless its address is set.
#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CarbonSection {
    pub plaintext_listen_address: Option<String>,
    pub udp_listen_address: Option<String>,
    pub pickle_listen_address: Option<String>,
    pub max_connections: Option<usize>,
    pub idle_timeout: Option<String>,
    pub max_line_size: Option<String>,
    pub max_pickle_size: Option<String>,
    pub out_of_order_window: Option<String>,
    pub path_cache_entries: Option<usize>,
}

/// Graphite's retention schemas, in carbon's file formats (`docs/graphite.md`).
#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GraphiteSection {
    pub storage_schemas: Option<String>,
    pub storage_aggregation: Option<String>,
    pub time_zone: Option<String>,
    pub events_max: Option<usize>,
}

/// The rule groups of `rule_files` (globs), checked, with `global.evaluation_interval` as the
/// groups' default interval. Every error of every file is listed.
pub fn rule_groups(
    rule_files: &[String],
    global: &GlobalConfig,
    base: &Path,
    opts: &LoadOptions,
) -> Result<Vec<GroupDef>, String> {
    let opts = LoadOptions {
        default_interval_ms: global.evaluation_interval.map(|d| d.0).unwrap_or(opts.default_interval_ms),
        ..*opts
    };
    let mut groups = Vec::new();
    let mut errors = Vec::new();
    for f in expand_globs(rule_files, base)? {
        match load_file(&f, &opts) {
            Ok(g) => groups.extend(g),
            Err(e) => errors.extend(e),
        }
    }
    if errors.is_empty() {
        Ok(groups)
    } else {
        Err(format!("error loading rules:\n{}", errors.join("\n")))
    }
}

/// A listen address as Prometheus' and carbon's flags take it: `host:port`, or `:port` for
/// every interface.
pub fn parse_listen_address(s: &str) -> Result<std::net::SocketAddr, String> {
    let full = if s.starts_with(':') { format!("0.0.0.0{s}") } else { s.to_owned() };
    full.parse().map_err(|_| format!("invalid listen address {s:?}: expected host:port or :port"))
}

impl ConfigFile {
    /// Parses the file's text; errors carry the line and column and name the field.
    pub fn parse(text: &str) -> Result<ConfigFile, String> {
        if text.trim().is_empty() {
            return Ok(ConfigFile::default());
        }
        yaml_serde::from_str(text).map_err(|e| e.to_string())
    }

    /// The scrape jobs, defaults filled in; `base` is the directory relative file paths in the
    /// configuration are resolved against (the configuration file's).
    pub fn scrape_jobs(&self, base: &Path) -> Result<Vec<Job>, String> {
        resolve(&self.global, &self.scrape_configs, base)
    }

    /// The rule groups of every rule file, checked; `base` as for `scrape_jobs`.
    pub fn rule_groups(&self, base: &Path, opts: &LoadOptions) -> Result<Vec<GroupDef>, String> {
        rule_groups(&self.rule_files, &self.global, base, opts)
    }

    /// Reads and parses `path`; errors name the file.
    pub fn load(path: &std::path::Path) -> Result<(ConfigFile, String), String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("read {}: {e}", path.display()))?;
        let cfg = ConfigFile::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok((cfg, text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_and_mistakes_are_named_with_their_line() {
        let cfg =
            ConfigFile::parse("storage:\n  retention: 30d\n  wal_fsync: always\nlimits:\n  query_max_concurrency: 8\n  query_parallelism: 2\n")
                .unwrap();
        assert_eq!(cfg.storage.retention.as_deref(), Some("30d"));
        assert_eq!(cfg.limits.query_max_concurrency, Some(8));
        assert_eq!(cfg.limits.query_parallelism, Some(2));
        assert_eq!(ConfigFile::parse("").unwrap(), ConfigFile::default());

        let err = ConfigFile::parse("storage:\n  retention: 30d\n  retension_size: 1GB\n").unwrap_err();
        assert!(err.contains("unknown field `retension_size`") && err.contains("line 3"), "{err}");
        let err = ConfigFile::parse("limits:\n  query_max_series: lots\n").unwrap_err();
        assert!(err.contains("query_max_series") && err.contains("line 2"), "{err}");
        let err = ConfigFile::parse("remote_write: []\n").unwrap_err();
        assert!(err.contains("unknown field `remote_write`"), "{err}");
    }

    #[test]
    fn carbon_settings_and_listen_addresses() {
        let cfg = ConfigFile::parse(
            "carbon:\n  plaintext_listen_address: \":2003\"\n  max_line_size: 64KB\n  out_of_order_window: 6h\n  path_cache_entries: 0\n\
             storage:\n  out_of_order_time_window: 30m\n",
        )
        .unwrap();
        assert_eq!(cfg.carbon.plaintext_listen_address.as_deref(), Some(":2003"));
        assert_eq!(cfg.carbon.out_of_order_window.as_deref(), Some("6h"));
        assert_eq!(cfg.carbon.path_cache_entries, Some(0));
        assert_eq!(cfg.storage.out_of_order_time_window.as_deref(), Some("30m"));
        assert_eq!(parse_listen_address(":2003").unwrap(), "0.0.0.0:2003".parse().unwrap());
        assert_eq!(parse_listen_address("127.0.0.1:2004").unwrap(), "127.0.0.1:2004".parse().unwrap());
        assert!(parse_listen_address("2003").unwrap_err().contains("host:port"));
        let err = ConfigFile::parse("carbon:\n  listen: x\n").unwrap_err();
        assert!(err.contains("unknown field `listen`"), "{err}");
    }

    #[test]
    fn the_built_in_configuration_scrapes_strata_itself() {
        let text = default_config_text("0.0.0.0:9090".parse().unwrap());
        let cfg = ConfigFile::parse(&text).unwrap();
        let jobs = cfg.scrape_jobs(Path::new(".")).unwrap();
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].name, "strata");
        assert_eq!(jobs[0].static_configs[0].targets, ["localhost:9090"]);
        assert_eq!(jobs[0].interval.0, 15_000);
    }
}
