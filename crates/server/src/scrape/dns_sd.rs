//! `dns_sd_configs`: targets from DNS records, as Prometheus' DNS discovery finds them. Every
//! `refresh_interval` (30s) each name is looked up (type SRV by default; A, AAAA, MX and NS
//! with the configured port) through the system's resolver configuration (`/etc/resolv.conf`:
//! name servers, search list, ndots), without caching, so a change is seen at the next refresh.
//!
//! Each name is a target group (source: the name). A name that does not exist, or has no
//! records of the type, gives no targets; a lookup that fails (time-out, SERVFAIL) keeps the
//! targets the name last gave, logged and counted, as Prometheus keeps them.
//!
//! `STRATA_DNS_SD_NAMESERVER` (`ip:port`) replaces the name servers of `/etc/resolv.conf`,
//! for a resolver on another port (tests, sidecar resolvers).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use hickory_resolver::config::{NameServerConfigGroup, ResolverConfig, ResolverOpts};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::proto::rr::{RData, RecordType};
use hickory_resolver::TokioResolver;
use parking_lot::Mutex;
use serde::Deserialize;

use super::config::PromDuration;
use super::discovery::{join_host_port, TargetGroup, ADDRESS_LABEL};
use super::relabel::LabelMap;

pub const DNS_SD_REFRESH_DEFAULT: PromDuration = PromDuration(30_000);

/// The environment variable that replaces resolv.conf's name servers.
pub const NAMESERVER_ENV: &str = "STRATA_DNS_SD_NAMESERVER";

/// One `dns_sd_configs` entry as written.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DnsSdConfig {
    #[serde(default)]
    pub names: Vec<String>,
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub port: Option<u16>,
    pub refresh_interval: Option<PromDuration>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueryType {
    Srv,
    A,
    Aaaa,
    Mx,
    Ns,
}

/// A `dns_sd_configs` entry checked.
#[derive(Clone, Debug, PartialEq)]
pub struct DnsSd {
    pub names: Vec<String>,
    pub kind: QueryType,
    /// The port of A, AAAA, MX and NS targets (SRV records carry theirs).
    pub port: u16,
    pub refresh: Duration,
}

impl DnsSdConfig {
    pub fn resolve(&self, err: &dyn Fn(&str) -> String) -> Result<DnsSd, String> {
        let e = |m: &str| err(&format!("dns_sd_configs: {m}"));
        if self.names.is_empty() {
            return Err(e("DNS-SD config must contain at least one SRV record name"));
        }
        let kind = match self.kind.as_deref().map(str::to_ascii_uppercase).as_deref() {
            None | Some("SRV") => QueryType::Srv,
            Some("A") => QueryType::A,
            Some("AAAA") => QueryType::Aaaa,
            Some("MX") => QueryType::Mx,
            Some("NS") => QueryType::Ns,
            Some(other) => return Err(e(&format!("invalid DNS-SD records type {other}"))),
        };
        let port = self.port.unwrap_or(0);
        if kind != QueryType::Srv && port == 0 {
            return Err(e("a port is required in DNS-SD configs for all record types except SRV"));
        }
        let refresh = self.refresh_interval.unwrap_or(DNS_SD_REFRESH_DEFAULT);
        if refresh.0 <= 0 {
            return Err(e("refresh_interval must be above zero"));
        }
        Ok(DnsSd { names: self.names.clone(), kind, port, refresh: refresh.as_duration() })
    }
}

/// What the lookup task shares with the discovery.
#[derive(Debug, Default)]
struct Shared {
    /// The last good group of each name.
    groups: BTreeMap<String, TargetGroup>,
    changed: bool,
    errors: u64,
}

/// One `dns_sd_configs` entry at work: a task on the runtime looking its names up every
/// refresh interval.
#[derive(Debug)]
pub struct DnsDiscovery {
    shared: Arc<Mutex<Shared>>,
    task: tokio::task::JoinHandle<()>,
    groups: Vec<TargetGroup>,
    /// Failed lookups so far, for `/metrics`.
    pub errors: u64,
}

impl Drop for DnsDiscovery {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl DnsDiscovery {
    pub fn new(sd: &DnsSd, rt: &tokio::runtime::Handle) -> Self {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let task = rt.spawn(run(sd.clone(), shared.clone()));
        DnsDiscovery { shared, task, groups: Vec::new(), errors: 0 }
    }

    /// `Some(groups)` when the target groups changed since the last poll.
    pub fn poll(&mut self) -> Option<Vec<TargetGroup>> {
        let mut sh = self.shared.lock();
        self.errors = sh.errors;
        if !std::mem::take(&mut sh.changed) {
            return None;
        }
        let groups: Vec<TargetGroup> = sh.groups.values().cloned().collect();
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

/// The resolver: resolv.conf's, or `STRATA_DNS_SD_NAMESERVER`'s server with resolv.conf's
/// search list; no cache (each refresh asks the servers, as Prometheus does).
fn resolver() -> Result<TokioResolver, String> {
    let (mut config, mut opts) = match hickory_resolver::system_conf::read_system_conf() {
        Ok(c) => c,
        Err(e) if std::env::var_os(NAMESERVER_ENV).is_some() => {
            tracing::debug!(error = %e, "dns_sd: no usable resolv.conf; using {NAMESERVER_ENV} alone");
            (ResolverConfig::new(), ResolverOpts::default())
        }
        Err(e) => return Err(format!("could not load resolv.conf: {e}")),
    };
    if let Ok(server) = std::env::var(NAMESERVER_ENV) {
        let addr: std::net::SocketAddr =
            server.parse().map_err(|e| format!("{NAMESERVER_ENV}={server:?}: expected ip:port ({e})"))?;
        let servers = NameServerConfigGroup::from_ips_clear(&[addr.ip()], addr.port(), true);
        config = ResolverConfig::from_parts(config.domain().cloned(), config.search().to_vec(), servers);
    }
    opts.cache_size = 0;
    let mut builder = TokioResolver::builder_with_config(config, TokioConnectionProvider::default());
    *builder.options_mut() = opts;
    Ok(builder.build())
}

async fn run(sd: DnsSd, shared: Arc<Mutex<Shared>>) {
    let mut tick = tokio::time::interval(sd.refresh);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // Built each refresh: an edited resolv.conf is followed, as Prometheus reads it
        // each time.
        let resolver = match resolver() {
            Ok(r) => r,
            Err(e) => {
                shared.lock().errors += 1;
                tracing::error!(error = %e, "dns_sd: cannot set up the resolver");
                continue;
            }
        };
        let lookups = sd.names.iter().map(|name| {
            let resolver = &resolver;
            async move { (name, lookup(resolver, name, sd.kind, sd.port).await) }
        });
        let results = futures_util::future::join_all(lookups).await;
        let mut sh = shared.lock();
        for (name, result) in results {
            match result {
                Ok(group) => {
                    if sh.groups.get(name) != Some(&group) {
                        sh.groups.insert(name.clone(), group);
                        sh.changed = true;
                    }
                }
                Err(e) => {
                    sh.errors += 1;
                    tracing::warn!(name = %name, error = %e, "dns_sd: lookup failed; keeping the targets it last gave");
                }
            }
        }
    }
}

/// One name's group; an error when the answer says nothing about the name (a time-out,
/// SERVFAIL), as opposed to "no such name" or "no such records" (an empty group).
async fn lookup(resolver: &TokioResolver, name: &str, kind: QueryType, port: u16) -> Result<TargetGroup, String> {
    let record_type = match kind {
        QueryType::Srv => RecordType::SRV,
        QueryType::A => RecordType::A,
        QueryType::Aaaa => RecordType::AAAA,
        QueryType::Mx => RecordType::MX,
        QueryType::Ns => RecordType::NS,
    };
    let mut group = TargetGroup { source: name.to_owned(), targets: Vec::new(), labels: LabelMap::new() };
    let answer = match resolver.lookup(name, record_type).await {
        Ok(a) => a,
        Err(e) if e.is_nx_domain() || e.is_no_records_found() => return Ok(group),
        Err(e) => return Err(e.to_string()),
    };
    for rdata in answer.iter() {
        let mut t = LabelMap::new();
        t.insert("__meta_dns_name".into(), name.to_owned());
        for l in ["srv_record_target", "srv_record_port", "mx_record_target", "ns_record_target"] {
            t.insert(format!("__meta_dns_{l}"), String::new());
        }
        let address = match rdata {
            RData::SRV(srv) => {
                let target = srv.target().to_string();
                t.insert("__meta_dns_srv_record_target".into(), target.clone());
                t.insert("__meta_dns_srv_record_port".into(), srv.port().to_string());
                join_host_port(target.trim_end_matches('.'), srv.port())
            }
            RData::A(a) => join_host_port(&a.0.to_string(), port),
            RData::AAAA(a) => join_host_port(&a.0.to_string(), port),
            RData::MX(mx) => {
                let target = mx.exchange().to_string();
                t.insert("__meta_dns_mx_record_target".into(), target.clone());
                join_host_port(target.trim_end_matches('.'), port)
            }
            RData::NS(ns) => {
                let target = ns.0.to_string();
                t.insert("__meta_dns_ns_record_target".into(), target.clone());
                join_host_port(target.trim_end_matches('.'), port)
            }
            // The resolver filters to the asked type; a CNAME on the way is followed, not a target.
            _ => continue,
        };
        t.insert(ADDRESS_LABEL.into(), address);
        group.targets.push(t);
    }
    Ok(group)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(yaml: &str) -> Result<DnsSd, String> {
        let c: DnsSdConfig = yaml_serde::from_str(yaml).map_err(|e| e.to_string())?;
        c.resolve(&|m| m.to_owned())
    }

    #[test]
    fn configuration_is_checked_as_prometheus_checks_it() {
        let sd = resolve("names: [_metrics._tcp.example.com]\n").unwrap();
        assert_eq!((sd.kind, sd.port, sd.refresh), (QueryType::Srv, 0, Duration::from_secs(30)));
        let sd = resolve("names: [web.example.com]\ntype: a\nport: 9100\nrefresh_interval: 5s\n").unwrap();
        assert_eq!((sd.kind, sd.port, sd.refresh), (QueryType::A, 9100, Duration::from_secs(5)));
        for (yaml, want) in [
            ("names: []\n", "at least one SRV record name"),
            ("names: [x]\ntype: AAAA\n", "a port is required"),
            ("names: [x]\ntype: TXT\nport: 1\n", "invalid DNS-SD records type TXT"),
            ("names: [x]\nport: 99999\n", "invalid value"),
            ("names: [x]\nnames2: [y]\n", "unknown field `names2`"),
        ] {
            let e = resolve(yaml).unwrap_err();
            assert!(e.contains(want), "{yaml}: {e}");
        }
    }
}
