//! Sending alerts to Alertmanager: the `alerting` section of the configuration, Alertmanager
//! discovery (static, file and HTTP), a bounded queue, and delivery in batches over Alertmanager's v2
//! API (`POST {scheme}://{address}{path_prefix}/api/v2/alerts`), as Prometheus' notifier does.
//!
//! The queue holds at most `capacity` alerts; when full, the oldest are dropped and counted (an
//! Alertmanager that is down must not grow our memory). Every batch goes to every discovered
//! Alertmanager; a batch counts as sent when one of them took it. External labels are added to
//! alerts that do not carry them, then `alert_relabel_configs` apply.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use parking_lot::Mutex;
use serde::Deserialize;

use crate::scrape::config::{
    resolve_auth, Auth, Authorization, BasicAuth, FileSdConfig, PromDuration, StaticConfig, TlsConfig,
};
use crate::scrape::discovery::{static_groups, Discoverer, FileDiscovery, TargetGroup, ADDRESS_LABEL};
use crate::scrape::dns_sd::{DnsDiscovery, DnsSdConfig};
use crate::scrape::http_sd::{HttpDiscovery, HttpSdConfig};
use crate::scrape::kubernetes::{KubernetesDiscovery, KubernetesSdConfig};
use crate::scrape::relabel::{self, LabelMap, RelabelConfig};

/// Alerts sent in one request (Prometheus' `maxBatchSize`).
pub const MAX_BATCH: usize = 64;
/// Queue capacity by default (`--alertmanager.notification-queue-capacity`).
pub const QUEUE_CAPACITY_DEFAULT: usize = 10_000;
/// Per-request timeout by default.
pub const TIMEOUT_DEFAULT: PromDuration = PromDuration(10_000);

/// The `alerting` section.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertingConfig {
    #[serde(default)]
    pub alert_relabel_configs: Vec<RelabelConfig>,
    #[serde(default)]
    pub alertmanagers: Vec<AlertmanagerConfig>,
}

/// One `alertmanagers` entry: how to find and reach a set of Alertmanagers.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertmanagerConfig {
    pub scheme: Option<String>,
    pub path_prefix: Option<String>,
    pub timeout: Option<PromDuration>,
    /// Only `v2`: Alertmanager removed v1 in 0.27.
    pub api_version: Option<String>,
    pub basic_auth: Option<BasicAuth>,
    pub authorization: Option<Authorization>,
    #[serde(default)]
    pub tls_config: TlsConfig,
    pub follow_redirects: Option<bool>,
    pub proxy_url: Option<String>,
    #[serde(default)]
    pub static_configs: Vec<StaticConfig>,
    #[serde(default)]
    pub file_sd_configs: Vec<FileSdConfig>,
    #[serde(default)]
    pub http_sd_configs: Vec<HttpSdConfig>,
    #[serde(default)]
    pub kubernetes_sd_configs: Vec<KubernetesSdConfig>,
    #[serde(default)]
    pub dns_sd_configs: Vec<DnsSdConfig>,
    #[serde(default)]
    pub relabel_configs: Vec<RelabelConfig>,
    #[serde(default)]
    pub alert_relabel_configs: Vec<RelabelConfig>,
}

/// An alert as Alertmanager's v2 API takes it.
#[derive(Clone, Debug, PartialEq)]
pub struct NotifyAlert {
    pub labels: LabelMap,
    pub annotations: LabelMap,
    /// Unix ms; 0: unset.
    pub starts_at: i64,
    pub ends_at: i64,
    pub generator_url: String,
}

impl NotifyAlert {
    fn json(&self) -> serde_json::Value {
        let time =
            |ms: i64| crate::http::scrape_api::rfc3339(Some(UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)));
        let mut o = serde_json::json!({
            "labels": self.labels,
            "annotations": self.annotations,
            "generatorURL": self.generator_url,
        });
        if self.starts_at > 0 {
            o["startsAt"] = time(self.starts_at).into();
        }
        if self.ends_at > 0 {
            o["endsAt"] = time(self.ends_at).into();
        }
        o
    }
}

/// A set of Alertmanagers from one `alertmanagers` entry, resolved.
struct AmSet {
    cfg: AlertmanagerConfig,
    client: reqwest::Client,
    auth: Auth,
    timeout: Duration,
    /// Alerts URLs after relabeling.
    active: Vec<String>,
    /// Discovered label sets that relabeling dropped.
    dropped: Vec<LabelMap>,
}

/// Where one set's Alertmanagers come from: kept apart from the set, so that sending never
/// waits for a discovery read (a slow HTTP endpoint).
struct AmDiscovery {
    cfg: AlertmanagerConfig,
    /// File, HTTP, Kubernetes and DNS discovery.
    sources: Vec<Discoverer>,
}

impl AmSet {
    /// Checks and builds a set; with `rt`, discovery runs at once (HTTP discovery needs the
    /// runtime), without it (a check) HTTP endpoints are only validated.
    fn new(
        cfg: AlertmanagerConfig,
        base: &Path,
        index: usize,
        rt: Option<&tokio::runtime::Handle>,
    ) -> Result<(AmSet, AmDiscovery), String> {
        let where_ = |m: &str| format!("alerting.alertmanagers[{index}]: {m}");
        if let Some(v) = &cfg.api_version {
            if v != "v2" {
                return Err(where_(&format!("api_version {v:?} is not supported; Alertmanager's API is v2")));
            }
        }
        let scheme = cfg.scheme.as_deref().unwrap_or("http");
        if scheme != "http" && scheme != "https" {
            return Err(where_(&format!("scheme {scheme:?} must be http or https")));
        }
        for r in cfg.relabel_configs.iter().chain(&cfg.alert_relabel_configs) {
            r.validate().map_err(|e| where_(&e))?;
        }
        let auth = resolve_auth(cfg.basic_auth.as_ref(), cfg.authorization.as_ref(), base, &|m| where_(m))?;
        let client = crate::scrape::scrape_loop::build_http_client(
            &cfg.tls_config,
            cfg.follow_redirects.unwrap_or(true),
            cfg.proxy_url.as_deref(),
        )
        .map_err(|e| where_(&e))?;
        let mut sources: Vec<Discoverer> = cfg
            .file_sd_configs
            .iter()
            .map(|c| {
                let mut c = c.clone();
                c.files = c.files.iter().map(|f| base.join(f).to_string_lossy().into_owned()).collect();
                Discoverer::File(FileDiscovery::new(&c))
            })
            .collect();
        for h in &cfg.http_sd_configs {
            let sd = h.resolve(base, &|m| where_(m))?;
            if let Some(rt) = rt {
                sources.push(Discoverer::Http(Box::new(HttpDiscovery::new(&sd, rt.clone()))));
            }
        }
        for k in &cfg.kubernetes_sd_configs {
            let sd = k.resolve(base, &|m| where_(m))?;
            if let Some(rt) = rt {
                sources.push(Discoverer::Kubernetes(Box::new(KubernetesDiscovery::new(&sd, rt))));
            }
        }
        for d in &cfg.dns_sd_configs {
            let sd = d.resolve(&|m| where_(m))?;
            if let Some(rt) = rt {
                sources.push(Discoverer::Dns(Box::new(DnsDiscovery::new(&sd, rt))));
            }
        }
        let timeout = cfg.timeout.unwrap_or(TIMEOUT_DEFAULT).as_duration();
        let mut discovery = AmDiscovery { cfg: cfg.clone(), sources };
        let (active, dropped) = discovery.refresh(true).expect("a forced refresh gives the targets");
        Ok((AmSet { cfg, client, auth, timeout, active, dropped }, discovery))
    }
}

impl AmDiscovery {
    /// Re-reads discovery; the alerts URLs and the dropped label sets when something changed
    /// (or `force`).
    fn refresh(&mut self, force: bool) -> Option<(Vec<String>, Vec<LabelMap>)> {
        let mut changed = force;
        for d in &mut self.sources {
            changed |= d.poll().is_some();
        }
        if !changed {
            return None;
        }
        let mut groups: Vec<TargetGroup> = static_groups(&self.cfg.static_configs);
        for d in &self.sources {
            groups.extend(d.groups());
        }
        let scheme = self.cfg.scheme.clone().unwrap_or_else(|| "http".into());
        let prefix = self.cfg.path_prefix.clone().unwrap_or_default();
        let alerts_path = format!("{}/api/v2/alerts", prefix.trim_end_matches('/'));
        let (mut active, mut dropped) = (Vec::new(), Vec::new());
        for g in groups {
            for t in &g.targets {
                let mut ls: LabelMap = g.labels.clone();
                ls.extend(t.clone());
                ls.entry("__scheme__".into()).or_insert_with(|| scheme.clone());
                ls.entry("__alerts_path__".into()).or_insert_with(|| alerts_path.clone());
                let original = ls.clone();
                if !relabel::process(&self.cfg.relabel_configs, &mut ls) {
                    dropped.push(original);
                    continue;
                }
                let Some(addr) = ls.get(ADDRESS_LABEL).filter(|a| !a.is_empty()) else {
                    dropped.push(original);
                    continue;
                };
                let url = format!("{}://{}{}", ls["__scheme__"], addr, ls["__alerts_path__"]);
                if !active.contains(&url) {
                    active.push(url);
                }
            }
        }
        Some((active, dropped))
    }
}

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct NotifierMetrics {
    pub sent: AtomicU64,
    pub errors: AtomicU64,
    pub dropped: AtomicU64,
}

/// `alert_relabel_configs` and the external labels added before them.
type AlertRelabeling = (Vec<RelabelConfig>, Vec<(String, String)>);

/// The notifier: configured by `apply`, fed by `enqueue`, drained by `run`.
pub struct Notifier {
    queue: Mutex<VecDeque<NotifyAlert>>,
    capacity: usize,
    wake: tokio::sync::Notify,
    sets: Mutex<Vec<AmSet>>,
    /// Each set's discovery, by the same index; locked before `sets` when both are.
    discovery: Mutex<Vec<AmDiscovery>>,
    relabel: Mutex<AlertRelabeling>,
    /// Active and dropped Alertmanager URLs, for `/api/v1/alertmanagers`.
    view: Mutex<(Vec<String>, Vec<String>)>,
    /// For HTTP discovery of Alertmanagers (none outside a runtime: tests, checks).
    rt: Option<tokio::runtime::Handle>,
    pub metrics: NotifierMetrics,
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier").field("queued", &self.queue.lock().len()).finish()
    }
}

impl Notifier {
    pub fn new(capacity: usize) -> Arc<Notifier> {
        Arc::new(Notifier {
            queue: Mutex::new(VecDeque::new()),
            capacity: capacity.max(1),
            wake: tokio::sync::Notify::new(),
            sets: Mutex::new(Vec::new()),
            discovery: Mutex::new(Vec::new()),
            relabel: Mutex::new((Vec::new(), Vec::new())),
            view: Mutex::new((Vec::new(), Vec::new())),
            rt: tokio::runtime::Handle::try_current().ok(),
            metrics: NotifierMetrics::default(),
        })
    }

    /// Checks a configuration without applying it (`strata check config`, reloads).
    pub fn check(cfg: &AlertingConfig, base: &Path) -> Result<(), String> {
        for r in &cfg.alert_relabel_configs {
            r.validate().map_err(|e| format!("alerting.alert_relabel_configs: {e}"))?;
        }
        for (i, am) in cfg.alertmanagers.iter().enumerate() {
            AmSet::new(am.clone(), base, i, None)?;
        }
        Ok(())
    }

    /// Applies the `alerting` section and external labels (start and reload).
    pub fn apply(
        &self,
        cfg: &AlertingConfig,
        external_labels: Vec<(String, String)>,
        base: &Path,
    ) -> Result<(), String> {
        let (mut sets, mut discovery) = (Vec::new(), Vec::new());
        for (i, am) in cfg.alertmanagers.iter().enumerate() {
            let (set, d) = AmSet::new(am.clone(), base, i, self.rt.as_ref())?;
            sets.push(set);
            discovery.push(d);
        }
        *self.relabel.lock() = (cfg.alert_relabel_configs.clone(), external_labels);
        let mut current_discovery = self.discovery.lock();
        let mut current = self.sets.lock();
        *current_discovery = discovery;
        *current = sets;
        self.update_view(&current);
        Ok(())
    }

    fn update_view(&self, sets: &[AmSet]) {
        let active = sets.iter().flat_map(|s| s.active.iter().cloned()).collect();
        let dropped = sets
            .iter()
            .flat_map(|s| s.dropped.iter().map(|l| l.get(ADDRESS_LABEL).cloned().unwrap_or_default()))
            .collect();
        *self.view.lock() = (active, dropped);
    }

    /// Active and dropped Alertmanagers (alerts URLs; dropped ones by address).
    pub fn alertmanagers(&self) -> (Vec<String>, Vec<String>) {
        self.view.lock().clone()
    }

    pub fn queue_length(&self) -> usize {
        self.queue.lock().len()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Queues alerts: external labels added, relabeled (an alert relabeled away is dropped
    /// here), the oldest dropped beyond the capacity.
    pub fn enqueue(&self, alerts: Vec<NotifyAlert>) {
        if alerts.is_empty() {
            return;
        }
        let (rules, external) = self.relabel.lock().clone();
        let mut q = self.queue.lock();
        for mut a in alerts {
            for (k, v) in &external {
                a.labels.entry(k.clone()).or_insert_with(|| v.clone());
            }
            if !relabel::process(&rules, &mut a.labels) {
                continue;
            }
            q.push_back(a);
        }
        let over = q.len().saturating_sub(self.capacity);
        if over > 0 {
            q.drain(..over);
            self.metrics.dropped.fetch_add(over as u64, Ordering::Relaxed);
            tracing::warn!(dropped = over, "alert notification queue full; dropped the oldest alerts");
        }
        drop(q);
        self.wake.notify_one();
    }

    /// Delivers queued alerts until `stop` turns true; discovery is re-read every second.
    pub async fn run(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tick.tick() => {
                    // On a blocking thread: discovery reads files and may fetch over HTTP.
                    let me = self.clone();
                    let _ = tokio::task::spawn_blocking(move || me.refresh_discovery()).await;
                }
                _ = stop.changed() => {
                    // Deliver what is queued, once, before stopping.
                    self.drain().await;
                    return;
                }
            }
            self.drain().await;
        }
    }

    /// Re-reads every set's discovery (outside the sets' lock) and puts changed URLs in place.
    fn refresh_discovery(&self) {
        let mut discovery = self.discovery.lock();
        let updates: Vec<_> = discovery.iter_mut().map(|d| d.refresh(false)).collect();
        if updates.iter().all(Option::is_none) {
            return;
        }
        let mut sets = self.sets.lock();
        for (set, update) in sets.iter_mut().zip(updates) {
            if let Some((active, dropped)) = update {
                set.active = active;
                set.dropped = dropped;
            }
        }
        self.update_view(&sets);
    }

    async fn drain(&self) {
        loop {
            let batch: Vec<NotifyAlert> = {
                let mut q = self.queue.lock();
                let n = q.len().min(MAX_BATCH);
                q.drain(..n).collect()
            };
            if batch.is_empty() {
                return;
            }
            self.send(&batch).await;
        }
    }

    /// Sends one batch to every Alertmanager, concurrently.
    async fn send(&self, batch: &[NotifyAlert]) {
        let mut sends = Vec::new();
        for s in self.sets.lock().iter() {
            let mut alerts: Vec<NotifyAlert> = batch.to_vec();
            if !s.cfg.alert_relabel_configs.is_empty() {
                alerts.retain_mut(|a| relabel::process(&s.cfg.alert_relabel_configs, &mut a.labels));
            }
            if alerts.is_empty() {
                continue;
            }
            let body = serde_json::Value::Array(alerts.iter().map(NotifyAlert::json).collect()).to_string();
            for url in &s.active {
                let mut req = s
                    .client
                    .post(url)
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .timeout(s.timeout)
                    .body(body.clone());
                match &s.auth {
                    Auth::None => {}
                    Auth::Basic { username, password } => req = req.basic_auth(username, Some(password)),
                    Auth::Header { kind, credentials } => {
                        req = req.header(reqwest::header::AUTHORIZATION, format!("{kind} {credentials}"))
                    }
                }
                let url = url.clone();
                let n = alerts.len() as u64;
                sends.push(async move {
                    let res = match req.send().await {
                        Ok(r) if r.status().is_success() => Ok(()),
                        Ok(r) => Err(format!("bad response status {}", r.status())),
                        Err(e) => Err(crate::scrape::scrape_loop::error_chain(&e)),
                    };
                    (url, n, res)
                });
            }
        }
        let results = futures_util::future::join_all(sends).await;
        // A batch no Alertmanager took is lost: counted as dropped, as Prometheus does.
        let lost = !results.is_empty() && results.iter().all(|(_, _, r)| r.is_err());
        for (url, n, res) in results {
            match res {
                Ok(()) => {
                    self.metrics.sent.fetch_add(n, Ordering::Relaxed);
                }
                Err(e) => {
                    self.metrics.errors.fetch_add(n, Ordering::Relaxed);
                    tracing::warn!(alertmanager = %url, count = n, error = %e, "error sending alerts");
                }
            }
        }
        if lost {
            self.metrics.dropped.fetch_add(batch.len() as u64, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alertmanagers_are_discovered_and_relabeled() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("am.yml"), "- targets: ['am1:9093', 'skip:9093']\n  labels: {env: prod}\n")
            .unwrap();
        let cfg: AlertingConfig = yaml_serde::from_str(
            r#"
alertmanagers:
  - path_prefix: /am
    static_configs:
      - targets: ['127.0.0.1:9093']
    file_sd_configs:
      - files: ['am.yml']
    relabel_configs:
      - source_labels: [__address__]
        regex: 'skip:.*'
        action: drop
"#,
        )
        .unwrap();
        let (set, _) = AmSet::new(cfg.alertmanagers[0].clone(), dir.path(), 0, None).unwrap();
        assert_eq!(set.active, vec!["http://127.0.0.1:9093/am/api/v2/alerts", "http://am1:9093/am/api/v2/alerts"]);
        assert_eq!(set.dropped.len(), 1);
        assert_eq!(set.dropped[0]["__address__"], "skip:9093");
    }

    #[test]
    fn configuration_mistakes_are_named() {
        for (text, want) in [
            ("alertmanagers:\n  - api_version: v1\n", "api_version \"v1\" is not supported"),
            ("alertmanagers:\n  - scheme: ftp\n", "scheme \"ftp\""),
            (
                "alertmanagers:\n  - basic_auth: {username: u, password: p}\n    authorization: {credentials: x}\n",
                "at most one of basic_auth and authorization",
            ),
        ] {
            let cfg: AlertingConfig = yaml_serde::from_str(text).unwrap();
            let err = Notifier::check(&cfg, Path::new(".")).unwrap_err();
            assert!(err.contains(want) && err.starts_with("alerting.alertmanagers[0]"), "{err}");
        }
        let err = yaml_serde::from_str::<AlertingConfig>("alertmanagers:\n  - bogus: 1\n").unwrap_err();
        assert!(err.to_string().contains("unknown field `bogus`"), "{err}");
    }

    #[test]
    fn the_queue_is_bounded_and_adds_external_labels() {
        let n = Notifier::new(3);
        *n.relabel.lock() = (Vec::new(), vec![("dc".into(), "eu".into()), ("alertname".into(), "not-this".into())]);
        let alert = |i: usize| NotifyAlert {
            labels: LabelMap::from([("alertname".into(), format!("A{i}"))]),
            annotations: LabelMap::new(),
            starts_at: 1,
            ends_at: 2,
            generator_url: String::new(),
        };
        n.enqueue((0..5).map(alert).collect());
        assert_eq!(n.queue_length(), 3);
        assert_eq!(n.metrics.dropped.load(Ordering::Relaxed), 2);
        let q = n.queue.lock();
        assert_eq!(q[0].labels["alertname"], "A2", "the oldest went");
        assert_eq!(q[0].labels["dc"], "eu");
        let json = q[0].json();
        assert_eq!(json["startsAt"], "1970-01-01T00:00:00.001Z");
        assert_eq!(json["labels"]["dc"], "eu");
    }
}
