//! `kubernetes_sd_configs`: targets from a Kubernetes API server, as Prometheus discovers them.
//!
//! Each entry has a role (pod, service, endpoints, endpointslice, node, ingress) and watches
//! the kinds of objects the role needs (endpoints also watch services and pods, to label their
//! addresses) with kube's watcher: a list, then a watch from its resourceVersion; when the
//! watch ends it is resumed, and when the server answers that the resourceVersion is gone
//! (410) the kind is listed afresh and the new list replaces what was held. Target groups are
//! rebuilt from the held objects (`targets`) when something changed, at most once per
//! discovery poll, and only once every watched kind has been listed: a half-listed cluster
//! never takes targets away.
//!
//! Credentials: `api_server` with Prometheus' HTTP client settings (basic_auth,
//! authorization, tls_config, proxy_url), or `kubeconfig_file` (its current context, exec
//! plugins included), or neither: the pod's service account (in-cluster).

pub mod targets;

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Resource};
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::Deserialize;

use super::config::{resolve_auth, Auth, Authorization, BasicAuth, TlsConfig};
use super::discovery::TargetGroup;
use super::scrape_loop::error_chain;
use targets::{Objects, Store};

/// Where a pod finds its own namespace (`namespaces.own_namespace`).
const OWN_NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// How long to wait before trying again to build a client that could not be built (a
/// kubeconfig exec plugin that failed, an in-cluster token not there yet).
const CLIENT_RETRY: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Pod,
    Service,
    Endpoints,
    #[serde(rename = "endpointslice")]
    EndpointSlice,
    Node,
    Ingress,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Pod => "pod",
            Role::Service => "service",
            Role::Endpoints => "endpoints",
            Role::EndpointSlice => "endpointslice",
            Role::Node => "node",
            Role::Ingress => "ingress",
        }
    }

    /// The roles whose selectors apply to a discovery of this role (the kinds it watches).
    fn selector_roles(self) -> &'static [Role] {
        match self {
            Role::Endpoints => &[Role::Pod, Role::Service, Role::Endpoints],
            Role::EndpointSlice => &[Role::Pod, Role::Service, Role::EndpointSlice],
            Role::Pod => &[Role::Pod],
            Role::Service => &[Role::Service],
            Role::Node => &[Role::Node],
            Role::Ingress => &[Role::Ingress],
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceDiscovery {
    #[serde(default)]
    pub own_namespace: bool,
    #[serde(default)]
    pub names: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SelectorConfig {
    pub role: Role,
    pub label: Option<String>,
    pub field: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachMetadata {
    #[serde(default)]
    pub node: bool,
}

/// One `kubernetes_sd_configs` entry as written.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesSdConfig {
    pub role: Option<Role>,
    pub api_server: Option<String>,
    pub kubeconfig_file: Option<PathBuf>,
    #[serde(default)]
    pub namespaces: NamespaceDiscovery,
    #[serde(default)]
    pub selectors: Vec<SelectorConfig>,
    #[serde(default)]
    pub attach_metadata: AttachMetadata,
    pub basic_auth: Option<BasicAuth>,
    pub authorization: Option<Authorization>,
    #[serde(default)]
    pub tls_config: TlsConfig,
    pub follow_redirects: Option<bool>,
    /// Accepted; the API server is spoken to over kube's client.
    pub enable_http2: Option<bool>,
    pub proxy_url: Option<String>,
}

/// How the API server is reached.
#[derive(Clone, Debug, PartialEq)]
pub enum ApiSource {
    /// The pod's service account.
    InCluster,
    Kubeconfig(PathBuf),
    Server {
        url: String,
        auth: Auth,
        tls: TlsConfig,
        proxy_url: Option<String>,
    },
}

/// A label and a field selector for one kind of object.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Selector {
    pub label: Option<String>,
    pub field: Option<String>,
}

/// A `kubernetes_sd_configs` entry checked, secrets read, paths resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct KubernetesSd {
    pub role: Role,
    pub source: ApiSource,
    /// Empty: every namespace.
    pub namespaces: Vec<String>,
    pub own_namespace: bool,
    pub selectors: BTreeMap<Role, Selector>,
    pub attach_node: bool,
}

impl KubernetesSdConfig {
    /// Checks the entry as Prometheus does; `err` places a message (names the job).
    pub fn resolve(&self, base: &Path, err: &dyn Fn(&str) -> String) -> Result<KubernetesSd, String> {
        let e = |m: &str| err(&format!("kubernetes_sd_configs: {m}"));
        let role = self
            .role
            .ok_or_else(|| e("role missing (one of: pod, service, endpoints, endpointslice, node, ingress)"))?;
        let custom_http = self.basic_auth.is_some()
            || self.authorization.is_some()
            || self.tls_config != TlsConfig::default()
            || self.proxy_url.is_some();
        let source = match (&self.api_server, &self.kubeconfig_file) {
            (Some(_), Some(_)) => return Err(e("cannot use 'kubeconfig_file' and 'api_server' simultaneously")),
            (None, Some(_)) if custom_http => {
                return Err(e("cannot use a custom HTTP client configuration together with 'kubeconfig_file'"))
            }
            (None, None) if custom_http => {
                return Err(e("to use custom HTTP client configuration please provide the 'api_server' URL explicitly"))
            }
            (Some(_), None) | (None, Some(_)) if self.namespaces.own_namespace => {
                let what = if self.api_server.is_some() { "api_server" } else { "kubeconfig_file" };
                return Err(e(&format!("cannot use '{what}' and 'namespaces.own_namespace' simultaneously")));
            }
            (None, None) => ApiSource::InCluster,
            (None, Some(k)) => {
                let path = base.join(k);
                // Read now so that a wrong path or broken file stops the load, not the
                // discovery later.
                kube::config::Kubeconfig::read_from(&path)
                    .map_err(|x| e(&format!("kubeconfig_file {}: {}", path.display(), error_chain(&x))))?;
                ApiSource::Kubeconfig(path)
            }
            (Some(url), None) => {
                // client-go takes a bare host as https.
                let url = if url.contains("://") { url.clone() } else { format!("https://{url}") };
                let parsed = reqwest::Url::parse(&url).map_err(|x| e(&format!("api_server {url:?}: {x}")))?;
                if parsed.scheme() != "http" && parsed.scheme() != "https" {
                    return Err(e(&format!("api_server {url:?}: the scheme must be http or https")));
                }
                url.parse::<axum::http::Uri>().map_err(|x| e(&format!("api_server {url:?}: {x}")))?;
                let mut tls = self.tls_config.clone();
                for f in [&mut tls.ca_file, &mut tls.cert_file, &mut tls.key_file].into_iter().flatten() {
                    *f = base.join(&*f);
                }
                if tls.cert_file.is_some() != tls.key_file.is_some() {
                    return Err(e("tls_config: cert_file and key_file must be set together"));
                }
                if let Some(p) = &self.proxy_url {
                    p.parse::<axum::http::Uri>().map_err(|x| e(&format!("proxy_url {p:?}: {x}")))?;
                }
                ApiSource::Server {
                    url,
                    auth: resolve_auth(self.basic_auth.as_ref(), self.authorization.as_ref(), base, &e)?,
                    tls,
                    proxy_url: self.proxy_url.clone(),
                }
            }
        };
        let mut selectors = BTreeMap::new();
        for s in &self.selectors {
            if selectors.contains_key(&s.role) {
                return Err(e(&format!("duplicated selector role: {}", s.role.name())));
            }
            if !role.selector_roles().contains(&s.role) {
                let allowed: Vec<&str> = role.selector_roles().iter().map(|r| r.name()).collect();
                return Err(e(&format!("{} role supports only {} selectors", role.name(), allowed.join(", "))));
            }
            for (what, sel) in [("label", &s.label), ("field", &s.field)] {
                if let Some(sel) = sel {
                    check_selector(sel).map_err(|m| e(&format!("{what} selector {sel:?}: {m}")))?;
                }
            }
            selectors.insert(s.role, Selector { label: s.label.clone(), field: s.field.clone() });
        }
        if self.attach_metadata.node && !matches!(role, Role::Pod | Role::Endpoints | Role::EndpointSlice) {
            tracing::warn!(
                role = role.name(),
                "kubernetes_sd: attach_metadata.node has an effect on the pod, endpoints and endpointslice roles only"
            );
        }
        Ok(KubernetesSd {
            role,
            source,
            namespaces: self.namespaces.names.clone(),
            own_namespace: self.namespaces.own_namespace,
            selectors,
            attach_node: self.attach_metadata.node && matches!(role, Role::Pod | Role::Endpoints | Role::EndpointSlice),
        })
    }
}

/// A light check of a label or field selector's syntax (`a=b,c!=d`, `env in (x,y)`, `!k`):
/// catches what is plainly not a selector; the API server is the final judge.
fn check_selector(sel: &str) -> Result<(), String> {
    let mut depth = 0i32;
    for c in sel.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            _ => {}
        }
        if depth < 0 {
            return Err("unbalanced parentheses".into());
        }
    }
    if depth != 0 {
        return Err("unbalanced parentheses".into());
    }
    if sel.split(',').any(|req| req.trim().is_empty()) && !sel.trim().is_empty() && !sel.contains('(') {
        return Err("empty requirement".into());
    }
    Ok(())
}

/// What the watchers of one discovery share with it.
#[derive(Debug, Default)]
struct Shared {
    objects: Objects,
    /// Something changed since the groups were last built.
    dirty: bool,
    /// Watchers that have not finished their first list.
    unsynced: usize,
    /// Watch and client failures so far.
    errors: u64,
}

/// One `kubernetes_sd_configs` entry at work: a task on the runtime that keeps the objects,
/// and the groups built from them when last polled.
#[derive(Debug)]
pub struct KubernetesDiscovery {
    sd: KubernetesSd,
    shared: Arc<Mutex<Shared>>,
    task: tokio::task::JoinHandle<()>,
    groups: Vec<TargetGroup>,
    /// Watch and client failures so far, for `/metrics`.
    pub errors: u64,
}

impl Drop for KubernetesDiscovery {
    fn drop(&mut self) {
        // The watchers are the task's own: they stop with it.
        self.task.abort();
    }
}

impl KubernetesDiscovery {
    pub fn new(sd: &KubernetesSd, rt: &tokio::runtime::Handle) -> Self {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let task = rt.spawn(run(sd.clone(), shared.clone()));
        KubernetesDiscovery { sd: sd.clone(), shared, task, groups: Vec::new(), errors: 0 }
    }

    /// `Some(groups)` when the target groups changed since the last poll.
    pub fn poll(&mut self) -> Option<Vec<TargetGroup>> {
        let mut sh = self.shared.lock();
        self.errors = sh.errors;
        if !sh.dirty || sh.unsynced > 0 {
            return None;
        }
        sh.dirty = false;
        let groups = targets::build(self.sd.role, &sh.objects, self.sd.attach_node);
        drop(sh);
        if groups == self.groups {
            return None;
        }
        self.groups = groups;
        Some(self.groups.clone())
    }

    pub fn groups(&self) -> Vec<TargetGroup> {
        self.groups.clone()
    }
}

/// Builds the client (retrying until it can), then runs the role's watchers until aborted.
async fn run(sd: KubernetesSd, shared: Arc<Mutex<Shared>>) {
    let client = loop {
        match client(&sd.source).await {
            Ok(c) => break c,
            Err(e) => {
                shared.lock().errors += 1;
                tracing::error!(role = sd.role.name(), error = %e, "kubernetes_sd: cannot build the API client; retrying");
                tokio::time::sleep(CLIENT_RETRY).await;
            }
        }
    };
    let mut namespaces = sd.namespaces.clone();
    if sd.own_namespace && sd.source == ApiSource::InCluster {
        match std::fs::read_to_string(OWN_NAMESPACE_FILE) {
            Ok(ns) if !ns.trim().is_empty() => namespaces.push(ns.trim().to_owned()),
            Ok(_) => tracing::error!("kubernetes_sd: could not read own namespace name (empty file)"),
            Err(e) => tracing::error!(error = %e, "kubernetes_sd: could not determine the pod's namespace"),
        }
    }
    // `None`: all namespaces.
    let scopes: Vec<Option<String>> =
        if namespaces.is_empty() { vec![None] } else { namespaces.into_iter().map(Some).collect() };
    let mut set = tokio::task::JoinSet::new();
    let mut spawn_kind =
        |role: Role, namespaced: bool, start: &dyn Fn(Option<String>, watcher::Config) -> WatchTask| {
            let sel = sd.selectors.get(&role).cloned().unwrap_or_default();
            let mut cfg = watcher::Config::default();
            if let Some(l) = &sel.label {
                cfg = cfg.labels(l);
            }
            if let Some(f) = &sel.field {
                cfg = cfg.fields(f);
            }
            let scopes = if namespaced { scopes.clone() } else { vec![None] };
            for scope in scopes {
                shared.lock().unsynced += 1;
                set.spawn(start(scope, cfg.clone()));
            }
        };
    let c = &client;
    let sh = &shared;
    let pods = |scope: Option<String>, cfg| -> WatchTask {
        Box::pin(watch_kind(api(c, scope.as_deref()), cfg, sh.clone(), scope, "pod", |o: &mut Objects| &mut o.pods))
    };
    let services = |scope: Option<String>, cfg| -> WatchTask {
        Box::pin(watch_kind(api(c, scope.as_deref()), cfg, sh.clone(), scope, "service", |o: &mut Objects| {
            &mut o.services
        }))
    };
    let nodes = |_: Option<String>, cfg| -> WatchTask {
        Box::pin(watch_kind(Api::all(c.clone()), cfg, sh.clone(), None, "node", |o: &mut Objects| &mut o.nodes))
    };
    match sd.role {
        Role::Pod => spawn_kind(Role::Pod, true, &pods),
        Role::Service => spawn_kind(Role::Service, true, &services),
        Role::Node => spawn_kind(Role::Node, false, &nodes),
        Role::Ingress => spawn_kind(Role::Ingress, true, &|scope, cfg| {
            Box::pin(watch_kind(api(c, scope.as_deref()), cfg, sh.clone(), scope, "ingress", |o: &mut Objects| {
                &mut o.ingresses
            }))
        }),
        Role::Endpoints => {
            spawn_kind(Role::Endpoints, true, &|scope, cfg| {
                Box::pin(watch_kind(
                    api(c, scope.as_deref()),
                    cfg,
                    sh.clone(),
                    scope,
                    "endpoints",
                    |o: &mut Objects| &mut o.endpoints,
                ))
            });
            spawn_kind(Role::Service, true, &services);
            spawn_kind(Role::Pod, true, &pods);
        }
        Role::EndpointSlice => {
            spawn_kind(Role::EndpointSlice, true, &|scope, cfg| {
                Box::pin(watch_kind(
                    api(c, scope.as_deref()),
                    cfg,
                    sh.clone(),
                    scope,
                    "endpointslice",
                    |o: &mut Objects| &mut o.endpoint_slices,
                ))
            });
            spawn_kind(Role::Service, true, &services);
            spawn_kind(Role::Pod, true, &pods);
        }
    }
    if sd.attach_node {
        spawn_kind(Role::Node, false, &nodes);
    }
    while set.join_next().await.is_some() {}
}

type WatchTask = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

fn api<K>(client: &kube::Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    <K as Resource>::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Keeps one kind of object (in one namespace, or all) in the shared store.
async fn watch_kind<K>(
    api: Api<K>,
    cfg: watcher::Config,
    shared: Arc<Mutex<Shared>>,
    scope: Option<String>,
    kind: &'static str,
    store: fn(&mut Objects) -> &mut Store<K>,
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let key = |o: &K| (o.meta().namespace.clone().unwrap_or_default(), o.meta().name.clone().unwrap_or_default());
    // Managed fields are the largest part of most objects and never read here.
    let slim = |mut o: K| {
        o.meta_mut().managed_fields = None;
        Arc::new(o)
    };
    let mut stream = std::pin::pin!(watcher::watcher(api, cfg).default_backoff());
    let mut listing: Option<Store<K>> = None;
    let mut synced = false;
    while let Some(event) = stream.next().await {
        let mut sh = shared.lock();
        match event {
            Ok(Event::Init) => listing = Some(Store::new()),
            Ok(Event::InitApply(o)) => {
                listing.get_or_insert_default().insert(key(&o), slim(o));
            }
            Ok(Event::InitDone) => {
                // A fresh list replaces what this watcher held: objects deleted while the
                // watch was down go with it.
                let fresh = listing.take().unwrap_or_default();
                let held = store(&mut sh.objects);
                held.retain(|(ns, _), _| scope.as_ref().is_some_and(|s| s != ns));
                held.extend(fresh);
                if !synced {
                    synced = true;
                    sh.unsynced -= 1;
                }
                sh.dirty = true;
            }
            Ok(Event::Apply(o)) => {
                store(&mut sh.objects).insert(key(&o), slim(o));
                sh.dirty = true;
            }
            Ok(Event::Delete(o)) => {
                store(&mut sh.objects).remove(&key(&o));
                sh.dirty = true;
            }
            Err(e) => {
                sh.errors += 1;
                tracing::warn!(kind, namespace = scope.as_deref().unwrap_or("(all)"), error = %error_chain(&e), "kubernetes_sd: watch failed; retrying");
            }
        }
    }
}

/// A kube client for the configured source.
async fn client(source: &ApiSource) -> Result<kube::Client, String> {
    let config = match source {
        ApiSource::InCluster => kube::Config::incluster().map_err(|e| error_chain(&e))?,
        ApiSource::Kubeconfig(path) => {
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| error_chain(&e))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| error_chain(&e))?
        }
        ApiSource::Server { url, auth, tls, proxy_url } => {
            let uri = url.parse::<axum::http::Uri>().map_err(|e| format!("api_server {url:?}: {e}"))?;
            let mut c = kube::Config::new(uri);
            if let Some(ca) = &tls.ca_file {
                use rustls::pki_types::pem::PemObject;
                let pem = std::fs::read(ca).map_err(|e| format!("tls_config ca_file {}: {e}", ca.display()))?;
                let certs = rustls::pki_types::CertificateDer::pem_slice_iter(&pem)
                    .map(|c| c.map(|c| c.to_vec()))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("tls_config ca_file {}: {e}", ca.display()))?;
                c.root_cert = Some(certs);
            }
            if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
                c.auth_info.client_certificate = Some(cert.display().to_string());
                c.auth_info.client_key = Some(key.display().to_string());
            }
            c.accept_invalid_certs = tls.insecure_skip_verify;
            c.tls_server_name = tls.server_name.clone();
            match auth {
                Auth::None => {}
                Auth::Basic { username, password } => {
                    c.auth_info.username = Some(username.clone());
                    c.auth_info.password = Some(password.clone().into());
                }
                Auth::Header { kind, credentials } => {
                    let value = format!("{kind} {credentials}")
                        .parse()
                        .map_err(|_| "authorization credentials are not a valid header value".to_owned())?;
                    c.headers.push((axum::http::header::AUTHORIZATION, value));
                }
            }
            if let Some(p) = proxy_url {
                c.proxy_url = Some(p.parse().map_err(|e| format!("proxy_url {p:?}: {e}"))?);
            }
            c
        }
    };
    kube::Client::try_from(config).map_err(|e| error_chain(&e))
}

#[cfg(test)]
mod tests;
