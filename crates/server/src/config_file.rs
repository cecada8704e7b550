//! `strata serve --config FILE`: the YAML configuration. Today it holds the storage settings
//! and limits that flags also set (a flag given on the command line wins over the file); later
//! issues add Prometheus' `global`, `scrape_configs` and other sections. Unknown or invalid
//! settings are refused with the line and the field.
//!
//! ```yaml
//! storage:
//!   retention: 30d
//!   retention_size: 500GB
//!   wal_fsync: always
//! limits:
//!   write_max_body_size: 64MB
//!   query_timeout: 1m
//!   query_max_concurrency: 8
//! ```

use serde::Deserialize;

#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    #[serde(default)]
    pub storage: StorageSection,
    #[serde(default)]
    pub limits: LimitsSection,
}

/// Durations and sizes are strings in Prometheus' notation (`15d`, `512MB`).
#[derive(Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StorageSection {
    pub retention: Option<String>,
    pub retention_size: Option<String>,
    pub wal_fsync: Option<String>,
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
    pub query_max_concurrency: Option<usize>,
    pub web_read_timeout: Option<String>,
}

impl ConfigFile {
    /// Parses the file's text; errors carry the line and column and name the field.
    pub fn parse(text: &str) -> Result<ConfigFile, String> {
        if text.trim().is_empty() {
            return Ok(ConfigFile::default());
        }
        yaml_serde::from_str(text).map_err(|e| e.to_string())
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
            ConfigFile::parse("storage:\n  retention: 30d\n  wal_fsync: always\nlimits:\n  query_max_concurrency: 8\n")
                .unwrap();
        assert_eq!(cfg.storage.retention.as_deref(), Some("30d"));
        assert_eq!(cfg.limits.query_max_concurrency, Some(8));
        assert_eq!(ConfigFile::parse("").unwrap(), ConfigFile::default());

        let err = ConfigFile::parse("storage:\n  retention: 30d\n  retension_size: 1GB\n").unwrap_err();
        assert!(err.contains("unknown field `retension_size`") && err.contains("line 3"), "{err}");
        let err = ConfigFile::parse("limits:\n  query_max_series: lots\n").unwrap_err();
        assert!(err.contains("query_max_series") && err.contains("line 2"), "{err}");
        let err = ConfigFile::parse("scrape_configs: []\n").unwrap_err();
        assert!(err.contains("unknown field `scrape_configs`"), "{err}");
    }
}
