//! Service discovery: where targets come from. `static_configs` list them in the configuration;
//! `file_sd_configs` read them from JSON or YAML files (globs allowed in the file name), which
//! are watched: a change is picked up within `WATCH_PERIOD`, and every file is re-read each
//! `refresh_interval` anyway, as Prometheus does.
//!
//! A file that cannot be read or parsed keeps the targets it last gave, and the error is logged
//! and counted: a half-written file never takes targets away.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use serde::Deserialize;

use super::config::{FileSdConfig, StaticConfig, FILE_SD_REFRESH_DEFAULT};
use super::relabel::LabelMap;

/// How often watched files are checked for changes (a `stat` per file).
pub const WATCH_PERIOD: Duration = Duration::from_secs(1);

pub const ADDRESS_LABEL: &str = "__address__";

/// Targets sharing labels, from one source.
#[derive(Clone, Debug, PartialEq)]
pub struct TargetGroup {
    /// Where the group came from (`static/0`, `/etc/targets/a.json:2`).
    pub source: String,
    /// Each target's own labels, `__address__` among them.
    pub targets: Vec<LabelMap>,
    /// Labels every target of the group gets (a target's own labels win).
    pub labels: LabelMap,
}

/// `host:port`, the host bracketed when it is an IPv6 address (Go's `net.JoinHostPort`).
pub fn join_host_port(host: &str, port: impl std::fmt::Display) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

pub fn static_groups(configs: &[StaticConfig]) -> Vec<TargetGroup> {
    configs
        .iter()
        .enumerate()
        .map(|(i, c)| TargetGroup {
            source: format!("static/{i}"),
            targets: c.targets.iter().map(|t| LabelMap::from([(ADDRESS_LABEL.to_owned(), t.clone())])).collect(),
            labels: c.labels.clone(),
        })
        .collect()
}

/// One entry of a file_sd file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileGroup {
    #[serde(default)]
    targets: Vec<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

/// Parses one file_sd file; the error names what is wrong (and, for YAML and JSON, where).
pub fn parse_file(path: &Path, text: &str) -> Result<Vec<TargetGroup>, String> {
    let is_json = path.extension().is_some_and(|e| e == "json");
    let groups: Vec<FileGroup> = if is_json {
        serde_json::from_str(text).map_err(|e| e.to_string())?
    } else if text.trim().is_empty() {
        Vec::new()
    } else {
        yaml_serde::from_str(text).map_err(|e| e.to_string())?
    };
    let shown = path.display().to_string();
    let mut out = Vec::with_capacity(groups.len());
    for (i, g) in groups.into_iter().enumerate() {
        let mut labels: LabelMap = g.labels.into_iter().filter(|(_, v)| !v.is_empty()).collect();
        for name in labels.keys() {
            if name.is_empty() {
                return Err(format!("group {i}: empty label name"));
            }
        }
        labels.insert("__meta_filepath".into(), shown.clone());
        let mut targets = Vec::with_capacity(g.targets.len());
        for t in g.targets {
            if t.is_empty() || t.contains('/') {
                return Err(format!("group {i}: {t:?} is not a valid hostname (expected host:port)"));
            }
            targets.push(LabelMap::from([(ADDRESS_LABEL.to_owned(), t)]));
        }
        out.push(TargetGroup { source: format!("{shown}:{i}"), targets, labels });
    }
    Ok(out)
}

/// What a file looked like when last read: changed size or mtime means read it again.
type Fingerprint = Option<(SystemTime, u64)>;

fn fingerprint(p: &Path) -> Fingerprint {
    let m = std::fs::metadata(p).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// One `file_sd_configs` entry and what its files last gave.
#[derive(Debug)]
pub struct FileDiscovery {
    patterns: Vec<String>,
    refresh: Duration,
    last_full_read: Option<Instant>,
    files: BTreeMap<PathBuf, (Fingerprint, Vec<TargetGroup>)>,
    /// Read or parse failures so far, for `/metrics`.
    pub errors: u64,
}

impl FileDiscovery {
    pub fn new(c: &FileSdConfig) -> Self {
        FileDiscovery {
            patterns: c.files.clone(),
            refresh: c.refresh_interval.unwrap_or(FILE_SD_REFRESH_DEFAULT).as_duration(),
            last_full_read: None,
            files: BTreeMap::new(),
            errors: 0,
        }
    }

    fn matching_files(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for p in &self.patterns {
            match glob::glob(p) {
                Ok(paths) => out.extend(paths.filter_map(Result::ok)),
                Err(e) => tracing::warn!(pattern = %p, error = %e, "file_sd: bad pattern"),
            }
        }
        out.sort();
        out.dedup();
        out
    }

    /// Re-reads the files that changed (all of them once `refresh_interval` has passed);
    /// `Some(groups)` when the target groups changed.
    pub fn poll(&mut self) -> Option<Vec<TargetGroup>> {
        let full = self.last_full_read.is_none_or(|t| t.elapsed() >= self.refresh);
        if full {
            self.last_full_read = Some(Instant::now());
        }
        let paths = self.matching_files();
        let mut changed = false;
        // Files that no longer match take their targets with them.
        let before = self.files.len();
        self.files.retain(|p, _| paths.contains(p));
        changed |= self.files.len() != before;
        for p in paths {
            let fp = fingerprint(&p);
            if !full && self.files.get(&p).is_some_and(|(old, _)| *old == fp) {
                continue;
            }
            let read = std::fs::read_to_string(&p).map_err(|e| e.to_string());
            match read.and_then(|text| parse_file(&p, &text)) {
                Ok(groups) => {
                    let entry = self.files.entry(p).or_insert((None, Vec::new()));
                    changed |= entry.1 != groups;
                    *entry = (fp, groups);
                }
                Err(e) => {
                    self.errors += 1;
                    tracing::warn!(file = %p.display(), error = %e, "file_sd: cannot read targets; keeping the last good ones");
                    // Remember the fingerprint so that a broken file is not re-read every
                    // second; keep its last good groups.
                    self.files.entry(p).or_insert((None, Vec::new())).0 = fp;
                }
            }
        }
        changed.then(|| self.groups())
    }

    pub fn groups(&self) -> Vec<TargetGroup> {
        self.files.values().flat_map(|(_, g)| g.iter().cloned()).collect()
    }
}

/// A source of target groups that changes over time: files, an HTTP endpoint, a Kubernetes
/// API server, DNS records.
#[derive(Debug)]
pub enum Discoverer {
    File(FileDiscovery),
    Http(Box<super::http_sd::HttpDiscovery>),
    Kubernetes(Box<super::kubernetes::KubernetesDiscovery>),
    Dns(Box<super::dns_sd::DnsDiscovery>),
}

impl Discoverer {
    /// `Some(groups)` when the source's target groups changed since the last poll.
    pub fn poll(&mut self) -> Option<Vec<TargetGroup>> {
        match self {
            Discoverer::File(f) => f.poll(),
            Discoverer::Http(h) => h.poll(),
            Discoverer::Kubernetes(k) => k.poll(),
            Discoverer::Dns(d) => d.poll(),
        }
    }

    /// The groups the source last gave.
    pub fn groups(&self) -> Vec<TargetGroup> {
        match self {
            Discoverer::File(f) => f.groups(),
            Discoverer::Http(h) => h.groups(),
            Discoverer::Kubernetes(k) => k.groups(),
            Discoverer::Dns(d) => d.groups(),
        }
    }

    /// Failed reads so far.
    pub fn errors(&self) -> u64 {
        match self {
            Discoverer::File(f) => f.errors,
            Discoverer::Http(h) => h.errors,
            Discoverer::Kubernetes(k) => k.errors,
            Discoverer::Dns(d) => d.errors,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_yaml_files_give_groups_with_their_path() {
        let g = parse_file(
            Path::new("/t/a.json"),
            r#"[{"targets": ["h1:9100", "h2:9100"], "labels": {"env": "prod", "empty": ""}}, {"targets": []}]"#,
        )
        .unwrap();
        assert_eq!(g.len(), 2);
        assert_eq!(g[0].source, "/t/a.json:0");
        assert_eq!(g[0].targets[1].get(ADDRESS_LABEL).unwrap(), "h2:9100");
        assert_eq!(g[0].labels.get("env").unwrap(), "prod");
        assert!(!g[0].labels.contains_key("empty"));
        assert_eq!(g[0].labels.get("__meta_filepath").unwrap(), "/t/a.json");
        let g = parse_file(Path::new("/t/b.yml"), "- targets: ['h3:1']\n  labels:\n    team: db\n").unwrap();
        assert_eq!(g[0].targets[0].get(ADDRESS_LABEL).unwrap(), "h3:1");
        let e = parse_file(Path::new("/t/c.yaml"), "- targets: ['h3:1']\n  lables: {}\n").unwrap_err();
        assert!(e.contains("unknown field `lables`") && e.contains("line 2"), "{e}");
        let e = parse_file(Path::new("/t/c.json"), "[{\"targets\": [\"http://x:1\"]}]").unwrap_err();
        assert!(e.contains("not a valid hostname"), "{e}");
    }

    #[test]
    fn watching_picks_up_changes_and_keeps_targets_over_a_broken_file() {
        let dir = tempfile::tempdir().unwrap();
        let pattern = dir.path().join("*.json").display().to_string();
        let mut d = FileDiscovery::new(&FileSdConfig { files: vec![pattern], refresh_interval: None });
        assert_eq!(d.poll(), None, "no files yet");
        std::fs::write(dir.path().join("a.json"), r#"[{"targets": ["a:1"]}]"#).unwrap();
        let g = d.poll().expect("a new file is a change");
        assert_eq!(g[0].targets[0].get(ADDRESS_LABEL).unwrap(), "a:1");
        assert_eq!(d.poll(), None, "nothing changed");

        // A broken write keeps the last good targets and counts an error.
        std::fs::write(dir.path().join("a.json"), r#"[{"targets": ["a:1"#).unwrap();
        assert_eq!(d.poll(), None);
        assert_eq!(d.errors, 1);
        assert_eq!(d.groups()[0].targets[0].get(ADDRESS_LABEL).unwrap(), "a:1");

        // Mended (different size, so the change is seen whatever the mtime resolution).
        std::fs::write(dir.path().join("a.json"), r#"[{"targets": ["a:1", "b:2"]}]"#).unwrap();
        assert_eq!(d.poll().unwrap()[0].targets.len(), 2);
        // A file that goes away takes its targets with it.
        std::fs::remove_file(dir.path().join("a.json")).unwrap();
        assert_eq!(d.poll(), Some(vec![]));
    }
}
