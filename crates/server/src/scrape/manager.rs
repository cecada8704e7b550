//! The scrape manager: one pool per job, one loop per target, kept in step with discovery and
//! with configuration reloads.
//!
//! A reload leaves a job whose resolved configuration is unchanged alone: its loops keep their
//! schedule and caches. A changed job gets a new HTTP client and restarts its loops quietly (no
//! stale markers for targets it still has); a removed job, or a target discovery no longer
//! lists, has its series marked stale when its loop stops.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use strata_tsdb::Db;
use tokio::sync::watch;

use super::config::Job;
use super::discovery::{static_groups, Discoverer, FileDiscovery, TargetGroup, WATCH_PERIOD};
use super::dns_sd::DnsDiscovery;
use super::http_sd::HttpDiscovery;
use super::kubernetes::KubernetesDiscovery;
use super::relabel::LabelMap;
use super::scrape_loop::{
    self, build_client, BufferPool, LoopShared, LoopState, Metadata, MetadataMap, ScrapeStats, StopMode, TargetHealth,
};
use super::target::{targets_of, Target};

#[derive(Debug)]
struct LoopHandle {
    target: Arc<Target>,
    health: Arc<Mutex<TargetHealth>>,
    metadata: Arc<Mutex<MetadataMap>>,
    stop: watch::Sender<Option<StopMode>>,
    task: tokio::task::JoinHandle<()>,
}

impl LoopHandle {
    fn stop(self, mode: StopMode) -> tokio::task::JoinHandle<()> {
        let _ = self.stop.send(Some(mode));
        self.task
    }
}

#[derive(Debug)]
struct PoolState {
    job: Arc<Job>,
    client: reqwest::Client,
    /// Target groups per source: static configs first, then each file_sd config.
    static_groups: Vec<TargetGroup>,
    file_groups: Vec<Vec<TargetGroup>>,
    loops: HashMap<u64, LoopHandle>,
    dropped: Vec<LabelMap>,
    /// Set while the job has more targets than its `target_limit`: none are scraped.
    limit_error: Option<(String, Vec<Arc<Target>>)>,
    /// Tells the current file-watching thread to end.
    discovery_stop: Option<Arc<AtomicBool>>,
}

/// A job's pool: its configuration, discovered groups and loops, behind one lock.
type Pool = Mutex<PoolState>;

/// Metadata of a target's metric families, by family name.
pub type FamilyMetadata = Vec<(String, Metadata)>;

/// A target as `/api/v1/targets` shows it.
#[derive(Clone, Debug)]
pub struct ActiveTarget {
    pub pool: String,
    pub target: Arc<Target>,
    pub health: TargetHealth,
}

#[derive(Debug)]
pub struct ScrapeManager {
    db: Arc<Db>,
    rt: tokio::runtime::Handle,
    pub stats: Arc<ScrapeStats>,
    /// Mixed into every target's offset, so that two servers scraping the same targets do
    /// not hit them at the same instant.
    seed: u64,
    max_future_ms: i64,
    pools: Mutex<BTreeMap<String, Arc<Pool>>>,
    buffers: Arc<BufferPool>,
    /// file_sd read and parse failures, counted by every discovery thread.
    sd_errors: Arc<std::sync::atomic::AtomicU64>,
}

impl ScrapeManager {
    pub fn new(db: Arc<Db>, rt: tokio::runtime::Handle, seed: u64, max_future_ms: i64) -> Arc<Self> {
        Arc::new(ScrapeManager {
            db,
            rt,
            stats: Arc::default(),
            seed,
            max_future_ms,
            pools: Mutex::new(BTreeMap::new()),
            buffers: Arc::default(),
            sd_errors: Arc::default(),
        })
    }

    /// Makes the running jobs `jobs`. Every job's HTTP client is built first, so that a bad
    /// TLS file refuses the whole configuration and the running one stays.
    pub fn apply(self: &Arc<Self>, jobs: Vec<Job>) -> Result<(), String> {
        let mut pools = self.pools.lock();
        let mut clients = HashMap::new();
        for job in &jobs {
            let unchanged = pools.get(&job.name).is_some_and(|p| *p.lock().job == *job);
            if !unchanged {
                let c = build_client(job).map_err(|e| format!("scrape config with job name {:?}: {e}", job.name))?;
                clients.insert(job.name.clone(), c);
            }
        }
        let names: BTreeSet<String> = jobs.iter().map(|j| j.name.clone()).collect();
        pools.retain(|name, pool| {
            if names.contains(name) {
                return true;
            }
            let mut st = pool.lock();
            if let Some(s) = st.discovery_stop.take() {
                s.store(true, Ordering::Relaxed);
            }
            for (_, h) in st.loops.drain() {
                h.stop(StopMode::Gone);
            }
            false
        });
        for job in jobs {
            let Some(client) = clients.remove(&job.name) else { continue };
            let job = Arc::new(job);
            let pool = pools
                .entry(job.name.clone())
                .or_insert_with(|| {
                    Arc::new(Mutex::new(PoolState {
                        job: job.clone(),
                        client: client.clone(),
                        static_groups: Vec::new(),
                        file_groups: Vec::new(),
                        loops: HashMap::new(),
                        dropped: Vec::new(),
                        limit_error: None,
                        discovery_stop: None,
                    }))
                })
                .clone();
            self.configure(&pool, job, client);
        }
        Ok(())
    }

    /// Installs a (new or changed) job in its pool: discovery restarted, loops restarted.
    fn configure(self: &Arc<Self>, pool: &Arc<Pool>, job: Arc<Job>, client: reqwest::Client) {
        let mut files: Vec<Discoverer> = job
            .file_sd_configs
            .iter()
            .map(|c| Discoverer::File(FileDiscovery::new(c)))
            .chain(job.http_sd.iter().map(|h| Discoverer::Http(Box::new(HttpDiscovery::new(h, self.rt.clone())))))
            .chain(
                job.kubernetes_sd
                    .iter()
                    .map(|k| Discoverer::Kubernetes(Box::new(KubernetesDiscovery::new(k, &self.rt)))),
            )
            .chain(job.dns_sd.iter().map(|d| Discoverer::Dns(Box::new(DnsDiscovery::new(d, &self.rt)))))
            .collect();
        // The first read happens here, so the job starts with its targets.
        let file_groups: Vec<Vec<TargetGroup>> = files.iter_mut().map(|f| f.poll().unwrap_or_default()).collect();
        let mut st = pool.lock();
        if let Some(s) = st.discovery_stop.take() {
            s.store(true, Ordering::Relaxed);
        }
        st.job = job.clone();
        st.client = client;
        st.static_groups = static_groups(&job.static_configs);
        st.file_groups = file_groups;
        self.sync(&mut st, true);
        if !files.is_empty() {
            let stop = Arc::new(AtomicBool::new(false));
            st.discovery_stop = Some(stop.clone());
            let (weak_pool, weak_mgr) = (Arc::downgrade(pool), Arc::downgrade(self));
            let errors = self.sd_errors.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("sd-{}", job.name))
                .spawn(move || watch_files(files, stop, weak_pool, weak_mgr, errors));
            if let Err(e) = spawned {
                tracing::error!(job = %job.name, error = %e, "cannot start file discovery");
            }
        }
    }

    /// Brings the pool's loops in line with its target groups. `restart` restarts the loops
    /// of targets that remain (the job's configuration changed).
    fn sync(&self, st: &mut PoolState, restart: bool) {
        let groups: Vec<TargetGroup> =
            st.static_groups.iter().chain(st.file_groups.iter().flatten()).cloned().collect();
        let (targets, dropped) = targets_of(&st.job, &groups);
        st.dropped = dropped;
        let limit = st.job.target_limit;
        if limit > 0 && targets.len() > limit {
            let msg = format!("target_limit exceeded (number of targets: {}, limit: {limit})", targets.len());
            tracing::warn!(job = %st.job.name, "{msg}");
            for (_, h) in st.loops.drain() {
                h.stop(StopMode::Gone);
            }
            st.limit_error = Some((msg, targets.into_iter().map(Arc::new).collect()));
            return;
        }
        st.limit_error = None;
        let mut wanted: HashMap<u64, Target> = targets.into_iter().map(|t| (t.hash(), t)).collect();
        let old: Vec<u64> = st.loops.keys().copied().collect();
        for h in old {
            if !wanted.contains_key(&h) {
                let handle = st.loops.remove(&h).expect("listed above");
                handle.stop(StopMode::Gone);
            } else if restart {
                let handle = st.loops.remove(&h).expect("listed above");
                handle.stop(StopMode::Quiet);
            } else if let Some(t) = wanted.remove(&h) {
                // The same target, perhaps from changed discovered labels (a pod label that
                // relabeling does not keep): the targets API shows the latest, as
                // Prometheus' does.
                st.loops.get_mut(&h).expect("listed above").target = Arc::new(t);
            }
        }
        for (h, t) in wanted {
            let handle = self.start_loop(st, Arc::new(t));
            st.loops.insert(h, handle);
        }
    }

    fn start_loop(&self, st: &PoolState, target: Arc<Target>) -> LoopHandle {
        let state = LoopState::new(st.job.clone(), target.clone(), self.max_future_ms);
        let metadata = state.metadata.clone();
        let health = Arc::new(Mutex::new(TargetHealth::default()));
        let (tx, rx) = watch::channel(None);
        let shared = LoopShared {
            db: self.db.clone(),
            stats: self.stats.clone(),
            buffers: self.buffers.clone(),
            seed: self.seed,
        };
        let task = self.rt.spawn(scrape_loop::run(state, st.client.clone(), shared, health.clone(), rx));
        LoopHandle { target, health, metadata, stop: tx, task }
    }

    /// Stops every loop (no stale markers: the data simply ends) and waits for them.
    pub async fn stop(&self) {
        let mut tasks = Vec::new();
        for pool in std::mem::take(&mut *self.pools.lock()).into_values() {
            let mut st = pool.lock();
            if let Some(s) = st.discovery_stop.take() {
                s.store(true, Ordering::Relaxed);
            }
            tasks.extend(st.loops.drain().map(|(_, h)| h.stop(StopMode::Quiet)));
        }
        for t in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(30), t).await;
        }
    }

    pub fn active_targets(&self) -> Vec<ActiveTarget> {
        let mut out = Vec::new();
        for (name, pool) in self.pools.lock().iter() {
            let st = pool.lock();
            if let Some((msg, targets)) = &st.limit_error {
                for t in targets {
                    let health = TargetHealth { up: Some(false), last_error: msg.clone(), ..Default::default() };
                    out.push(ActiveTarget { pool: name.clone(), target: t.clone(), health });
                }
            }
            for h in st.loops.values() {
                out.push(ActiveTarget {
                    pool: name.clone(),
                    target: h.target.clone(),
                    health: h.health.lock().clone(),
                });
            }
        }
        out.sort_by(|a, b| (&a.pool, &a.target.url).cmp(&(&b.pool, &b.target.url)));
        out
    }

    /// A scrape pool's `relabel_configs`; `None` for an unknown pool.
    pub fn relabel_configs(&self, pool: &str) -> Option<Vec<super::relabel::RelabelConfig>> {
        self.pools.lock().get(pool).map(|p| p.lock().job.relabel_configs.clone())
    }

    pub fn dropped_targets(&self) -> Vec<(String, LabelMap)> {
        let mut out = Vec::new();
        for (name, pool) in self.pools.lock().iter() {
            out.extend(pool.lock().dropped.iter().map(|d| (name.clone(), d.clone())));
        }
        out
    }

    /// Metadata per metric family across all targets, each distinct one once.
    pub fn metadata(&self) -> BTreeMap<String, BTreeSet<Metadata>> {
        let mut out: BTreeMap<String, BTreeSet<Metadata>> = BTreeMap::new();
        for pool in self.pools.lock().values() {
            for h in pool.lock().loops.values() {
                for (family, md) in h.metadata.lock().iter() {
                    out.entry(family.clone()).or_default().insert(md.clone());
                }
            }
        }
        out
    }

    /// Each active target with the metadata it exposes, sorted by family.
    pub fn targets_metadata(&self) -> Vec<(Arc<Target>, FamilyMetadata)> {
        let mut out = Vec::new();
        for pool in self.pools.lock().values() {
            for h in pool.lock().loops.values() {
                let mut md: Vec<(String, Metadata)> =
                    h.metadata.lock().iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                md.sort();
                out.push((h.target.clone(), md));
            }
        }
        out.sort_by(|a, b| a.0.url.cmp(&b.0.url));
        out
    }

    /// Targets per job, for `/metrics`.
    pub fn target_counts(&self) -> Vec<(String, usize)> {
        self.pools.lock().iter().map(|(n, p)| (n.clone(), p.lock().loops.len())).collect()
    }

    pub fn sd_file_errors(&self) -> u64 {
        self.sd_errors.load(Ordering::Relaxed)
    }
}

/// The discovery thread of one pool: polls its files and HTTP endpoints and syncs the pool when
/// their targets change.
fn watch_files(
    mut files: Vec<Discoverer>,
    stop: Arc<AtomicBool>,
    pool: Weak<Pool>,
    mgr: Weak<ScrapeManager>,
    errors: Arc<std::sync::atomic::AtomicU64>,
) {
    loop {
        std::thread::sleep(WATCH_PERIOD);
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let mut changed = Vec::new();
        for (i, f) in files.iter_mut().enumerate() {
            let before = f.errors();
            if let Some(groups) = f.poll() {
                changed.push((i, groups));
            }
            errors.fetch_add(f.errors() - before, Ordering::Relaxed);
        }
        if changed.is_empty() {
            continue;
        }
        let (Some(pool), Some(mgr)) = (pool.upgrade(), mgr.upgrade()) else { return };
        let mut st = pool.lock();
        // Checked under the lock: a reload that replaced this thread has set the flag first.
        if stop.load(Ordering::Relaxed) {
            return;
        }
        for (i, groups) in changed {
            if let Some(slot) = st.file_groups.get_mut(i) {
                *slot = groups;
            }
        }
        mgr.sync(&mut st, false);
    }
}
