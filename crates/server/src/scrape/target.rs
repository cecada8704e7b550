//! From discovered labels to a scrape target, as Prometheus' `PopulateLabels` does it: job and
//! defaults added, `relabel_configs` applied, `__meta_*` removed, `instance` defaulted to the
//! address. The labels that remain without a `__` prefix go on every sample of the target.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

use strata_model::{Labels, METRIC_NAME};

use super::config::{Job, PromDuration};
use super::discovery::{TargetGroup, ADDRESS_LABEL};
use super::relabel::{self, LabelMap};

const SCHEME_LABEL: &str = "__scheme__";
const METRICS_PATH_LABEL: &str = "__metrics_path__";
const SCRAPE_INTERVAL_LABEL: &str = "__scrape_interval__";
const SCRAPE_TIMEOUT_LABEL: &str = "__scrape_timeout__";
const PARAM_PREFIX: &str = "__param_";

/// A target to scrape.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    /// The labels after relabeling, internal ones (`__address__`, `__scheme__`…) included.
    pub full: LabelMap,
    /// What discovery gave, before relabeling (`discoveredLabels` in the targets API).
    pub discovered: LabelMap,
    /// The labels every sample of this target gets: `full` without `__`-prefixed names.
    pub labels: Labels,
    pub url: String,
    pub interval: PromDuration,
    pub timeout: PromDuration,
}

impl Target {
    /// Identity across discovery updates and reloads: same labels and URL, same target.
    pub fn hash(&self) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.full.hash(&mut h);
        self.url.hash(&mut h);
        h.finish()
    }

    /// The label set of one of the target's own series (`up`, `scrape_duration_seconds`…).
    pub fn report_labels(&self, name: &str) -> Labels {
        let mut pairs: Vec<(&str, &str)> = self.labels.iter().map(|l| (&*l.name, &*l.value)).collect();
        pairs.retain(|(n, _)| *n != METRIC_NAME);
        pairs.push((METRIC_NAME, name));
        Labels::from_pairs(pairs)
    }
}

/// What became of one discovered target.
#[derive(Clone, Debug, PartialEq)]
pub enum Populated {
    Target(Target),
    /// Dropped by relabeling: kept with its discovered labels for the targets API.
    Dropped(LabelMap),
}

/// Builds the target for one discovered target of `group`; an error names what is wrong with
/// its labels (no address, a bad interval…).
pub fn populate(job: &Job, group: &TargetGroup, own: &LabelMap) -> Result<Populated, String> {
    let mut ls = group.labels.clone();
    for (k, v) in own {
        ls.insert(k.clone(), v.clone());
    }
    let mut set_default = |k: &str, v: String| {
        if !ls.contains_key(k) && !v.is_empty() {
            ls.insert(k.to_owned(), v);
        }
    };
    set_default("job", job.name.clone());
    set_default(SCRAPE_INTERVAL_LABEL, job.interval.to_string());
    set_default(SCRAPE_TIMEOUT_LABEL, job.timeout.to_string());
    set_default(METRICS_PATH_LABEL, job.metrics_path.clone());
    set_default(SCHEME_LABEL, job.scheme.clone());
    for (k, v) in &job.params {
        if let Some(first) = v.first() {
            set_default(&format!("{PARAM_PREFIX}{k}"), first.clone());
        }
    }
    let discovered = ls.clone();
    if !relabel::process(&job.relabel_configs, &mut ls) {
        return Ok(Populated::Dropped(discovered));
    }
    let Some(addr) = ls.get(ADDRESS_LABEL).cloned() else {
        return Err("no address".into());
    };
    if addr.contains('/') {
        return Err(format!("{addr:?} is not a valid hostname"));
    }
    let dur = |label: &str, what: &str| -> Result<PromDuration, String> {
        let v = ls.get(label).map(String::as_str).unwrap_or("");
        let d = strata_model::parse_duration_ms(v).map_err(|e| format!("error parsing {what}: {e}"))?;
        if d == 0 {
            return Err(format!("{what} cannot be 0"));
        }
        Ok(PromDuration(d))
    };
    let interval = dur(SCRAPE_INTERVAL_LABEL, "scrape interval")?;
    let timeout = dur(SCRAPE_TIMEOUT_LABEL, "scrape timeout")?;
    if timeout > interval {
        let (t, i) = (timeout.to_string(), interval.to_string());
        return Err(format!("scrape timeout cannot be greater than scrape interval ({t:?} > {i:?})"));
    }
    ls.retain(|k, _| !k.starts_with("__meta_"));
    if !ls.contains_key("instance") {
        ls.insert("instance".into(), addr.clone());
    }
    let scheme = ls.get(SCHEME_LABEL).cloned().unwrap_or_else(|| job.scheme.clone());
    if scheme != "http" && scheme != "https" {
        return Err(format!("unknown scheme {scheme:?}"));
    }
    let path = ls.get(METRICS_PATH_LABEL).cloned().unwrap_or_default();
    let url = target_url(&scheme, &addr, &path, &job.params, &ls);
    let labels =
        Labels::from_pairs(ls.iter().filter(|(k, _)| !k.starts_with("__")).map(|(k, v)| (k.as_str(), v.as_str())));
    Ok(Populated::Target(Target { full: ls, discovered, labels, url, interval, timeout }))
}

/// `scheme://address/path?params`; a `__param_<name>` label replaces the first value of
/// parameter `name`, as in Prometheus.
fn target_url(scheme: &str, addr: &str, path: &str, params: &BTreeMap<String, Vec<String>>, ls: &LabelMap) -> String {
    let mut q: BTreeMap<String, Vec<String>> = params.clone();
    for (k, v) in ls {
        if let Some(name) = k.strip_prefix(PARAM_PREFIX) {
            let values = q.entry(name.to_owned()).or_default();
            if values.is_empty() {
                values.push(v.clone());
            } else {
                values[0] = v.clone();
            }
        }
    }
    let mut url = format!("{scheme}://{addr}{path}");
    let mut ser = form_urlencoded::Serializer::new(String::new());
    for (k, vs) in &q {
        for v in vs {
            ser.append_pair(k, v);
        }
    }
    let query = ser.finish();
    if !query.is_empty() {
        url.push(if path.contains('?') { '&' } else { '?' });
        url.push_str(&query);
    }
    url
}

/// Every target of a job's groups, and the dropped ones; targets with bad labels are logged
/// and left out, as Prometheus does.
pub fn targets_of(job: &Job, groups: &[TargetGroup]) -> (Vec<Target>, Vec<LabelMap>) {
    let mut targets = Vec::new();
    let mut dropped = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for g in groups {
        for own in &g.targets {
            match populate(job, g, own) {
                Ok(Populated::Target(t)) => {
                    // The same target from two sources is scraped once.
                    if seen.insert(t.hash()) {
                        targets.push(t);
                    }
                }
                Ok(Populated::Dropped(d)) => dropped.push(d),
                Err(e) => tracing::warn!(job = %job.name, source = %g.source, error = %e, "creating target failed"),
            }
        }
    }
    (targets, dropped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scrape::config::{resolve, GlobalConfig, ScrapeConfig};
    use crate::scrape::discovery::static_groups;

    fn job(yaml: &str) -> Job {
        let c: ScrapeConfig = yaml_serde::from_str(yaml).unwrap();
        resolve(&GlobalConfig::default(), &[c], std::path::Path::new("/")).unwrap().remove(0)
    }

    #[test]
    fn defaults_instance_and_url() {
        let j = job("job_name: node\nscrape_interval: 10s\nparams: {module: [a, b]}\nstatic_configs:\n  - targets: ['h:9100']\n    labels: {env: prod}\n");
        let (t, d) = targets_of(&j, &static_groups(&j.static_configs));
        assert!(d.is_empty());
        let t = &t[0];
        assert_eq!(t.labels.to_string(), "{env=\"prod\", instance=\"h:9100\", job=\"node\"}");
        assert_eq!(t.url, "http://h:9100/metrics?module=a&module=b");
        assert_eq!(t.interval, PromDuration(10_000));
        assert_eq!(t.discovered.get("__scrape_interval__").unwrap(), "10s");
        assert_eq!(t.report_labels("up").to_string(), "up{env=\"prod\", instance=\"h:9100\", job=\"node\"}");
    }

    #[test]
    fn relabeling_rewrites_address_params_and_drops() {
        // The blackbox-exporter pattern from Prometheus' documentation.
        let j = job(concat!(
            "job_name: blackbox\nmetrics_path: /probe\nparams: {module: [http_2xx]}\n",
            "static_configs:\n  - targets: ['example.com:443', 'skip.me:1']\n",
            "relabel_configs:\n",
            "  - source_labels: [__address__]\n    regex: skip.*\n    action: drop\n",
            "  - source_labels: [__address__]\n    target_label: __param_target\n",
            "  - source_labels: [__param_target]\n    target_label: instance\n",
            "  - target_label: __address__\n    replacement: 127.0.0.1:9115\n",
            "  - target_label: __scrape_interval__\n    replacement: 30s\n",
        ));
        let (t, d) = targets_of(&j, &static_groups(&j.static_configs));
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].get("__address__").unwrap(), "skip.me:1");
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].url, "http://127.0.0.1:9115/probe?module=http_2xx&target=example.com%3A443");
        assert_eq!(t[0].labels.to_string(), "{instance=\"example.com:443\", job=\"blackbox\"}");
        assert_eq!(t[0].interval, PromDuration(30_000));
    }

    #[test]
    fn bad_targets_are_errors() {
        let j = job("job_name: x\nrelabel_configs:\n  - target_label: __scrape_timeout__\n    replacement: 2m\n");
        let g = static_groups(&[crate::scrape::config::StaticConfig {
            targets: vec!["a:1".into()],
            labels: Default::default(),
        }]);
        let e = populate(&j, &g[0], &g[0].targets[0]).unwrap_err();
        assert!(e.contains("scrape timeout cannot be greater than scrape interval (\"2m\" > \"1m\")"), "{e}");
        let j = job("job_name: x\nrelabel_configs:\n  - action: labeldrop\n    regex: __address__\n");
        assert_eq!(populate(&j, &g[0], &g[0].targets[0]).unwrap_err(), "no address");
    }
}
