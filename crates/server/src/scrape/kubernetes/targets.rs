//! Kubernetes objects to target groups, one group per object, labelled as Prometheus labels
//! them (`__meta_kubernetes_*`), so that relabeling written for Prometheus works unchanged.
//!
//! Each role reads the objects it needs from `Objects` (the watchers' stores): `endpoints` and
//! `endpointslice` join their addresses with the pods they point at and the service of the
//! same name; `attach_metadata.node` joins pods and endpoints with their node.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Endpoints, Node, ObjectReference, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::Ingress;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::Role;
use crate::scrape::discovery::{join_host_port, TargetGroup, ADDRESS_LABEL};
use crate::scrape::relabel::LabelMap;

const META: &str = "__meta_kubernetes_";
const NAMESPACE_LABEL: &str = "__meta_kubernetes_namespace";
const PRESENT: &str = "true";
/// The label every EndpointSlice carries with the name of its Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Objects by (namespace, name); cluster-scoped ones (nodes) under an empty namespace.
pub type Store<K> = BTreeMap<(String, String), Arc<K>>;

/// What the watchers of one discovery hold.
#[derive(Debug, Default)]
pub struct Objects {
    pub pods: Store<Pod>,
    pub services: Store<Service>,
    pub endpoints: Store<Endpoints>,
    pub endpoint_slices: Store<EndpointSlice>,
    pub nodes: Store<Node>,
    pub ingresses: Store<Ingress>,
}

/// The target groups of a role: one per object, in namespace and name order.
pub fn build(role: Role, objects: &Objects, attach_node: bool) -> Vec<TargetGroup> {
    let nodes = attach_node.then_some(&objects.nodes);
    match role {
        Role::Pod => objects.pods.values().filter_map(|p| pod_group(p, nodes)).collect(),
        Role::Service => objects.services.values().map(|s| service_group(s)).collect(),
        Role::Endpoints => objects.endpoints.values().map(|e| endpoints_group(e, objects, nodes)).collect(),
        Role::EndpointSlice => {
            objects.endpoint_slices.values().map(|e| endpoint_slice_group(e, objects, nodes)).collect()
        }
        Role::Node => objects.nodes.values().filter_map(|n| node_group(n)).collect(),
        Role::Ingress => objects.ingresses.values().map(|i| ingress_group(i)).collect(),
    }
}

/// Prometheus' `SanitizeLabelName`: every character outside `[a-zA-Z0-9_]` becomes `_`.
pub fn sanitize(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect()
}

fn set(labels: &mut LabelMap, name: impl Into<String>, value: impl Into<String>) {
    labels.insert(name.into(), value.into());
}

/// `<role>_name`, and each Kubernetes label and annotation as `<role>_label_<name>` with
/// `<role>_labelpresent_<name>` (and the same for annotations): the present label tells a
/// label set to an empty value from one not set.
fn object_meta_labels(labels: &mut LabelMap, meta: &ObjectMeta, role: &str) {
    set(labels, format!("{META}{role}_name"), meta.name.clone().unwrap_or_default());
    for (kind, map) in [("label", &meta.labels), ("annotation", &meta.annotations)] {
        for (k, v) in map.iter().flatten() {
            let name = sanitize(k);
            set(labels, format!("{META}{role}_{kind}_{name}"), v.clone());
            set(labels, format!("{META}{role}_{kind}present_{name}"), PRESENT);
        }
    }
}

fn ns_name(meta: &ObjectMeta) -> (String, String) {
    (meta.namespace.clone().unwrap_or_default(), meta.name.clone().unwrap_or_default())
}

// ---- pods ----

fn pod_ip(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.pod_ip.as_deref()).unwrap_or("")
}

/// The labels of a pod every target of it shares.
fn pod_labels(pod: &Pod) -> LabelMap {
    let mut l = LabelMap::new();
    let status = pod.status.as_ref();
    let spec = pod.spec.as_ref();
    set(&mut l, "__meta_kubernetes_pod_ip", pod_ip(pod));
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .map_or("unknown".to_owned(), |c| c.status.to_lowercase());
    set(&mut l, "__meta_kubernetes_pod_ready", ready);
    set(&mut l, "__meta_kubernetes_pod_phase", status.and_then(|s| s.phase.clone()).unwrap_or_default());
    set(&mut l, "__meta_kubernetes_pod_node_name", spec.and_then(|s| s.node_name.clone()).unwrap_or_default());
    set(&mut l, "__meta_kubernetes_pod_host_ip", status.and_then(|s| s.host_ip.clone()).unwrap_or_default());
    set(&mut l, "__meta_kubernetes_pod_uid", pod.metadata.uid.clone().unwrap_or_default());
    object_meta_labels(&mut l, &pod.metadata, "pod");
    let controller = pod.metadata.owner_references.iter().flatten().find(|r| r.controller == Some(true));
    if let Some(c) = controller {
        if !c.kind.is_empty() {
            set(&mut l, "__meta_kubernetes_pod_controller_kind", c.kind.clone());
        }
        if !c.name.is_empty() {
            set(&mut l, "__meta_kubernetes_pod_controller_name", c.name.clone());
        }
    }
    l
}

/// The labels of a node attached to what runs on it (`attach_metadata.node`).
fn add_node_labels(labels: &mut LabelMap, nodes: Option<&Store<Node>>, node_name: Option<&str>) {
    let (Some(nodes), Some(name)) = (nodes, node_name) else { return };
    if let Some(node) = nodes.get(&(String::new(), name.to_owned())) {
        object_meta_labels(labels, &node.metadata, "node");
    }
}

fn pod_group(pod: &Pod, nodes: Option<&Store<Node>>) -> Option<TargetGroup> {
    let (ns, name) = ns_name(&pod.metadata);
    let source = format!("pod/{ns}/{name}");
    let ip = pod_ip(pod);
    // A pod has no IP while it starts and after eviction: no targets until it has one.
    if ip.is_empty() {
        return None;
    }
    let mut labels = pod_labels(pod);
    set(&mut labels, NAMESPACE_LABEL, ns);
    let spec = pod.spec.as_ref();
    add_node_labels(&mut labels, nodes, spec.and_then(|s| s.node_name.as_deref()));
    let status = pod.status.as_ref();
    let mut targets = Vec::new();
    let containers = spec.map(|s| s.containers.iter().map(|c| (c, false))).into_iter().flatten();
    let init = spec.and_then(|s| s.init_containers.as_ref()).into_iter().flatten().map(|c| (c, true));
    for (c, is_init) in containers.chain(init) {
        let statuses =
            status.and_then(|s| if is_init { &s.init_container_statuses } else { &s.container_statuses }.as_ref());
        let id = statuses
            .and_then(|ss| ss.iter().find(|s| s.name == c.name))
            .and_then(|s| s.container_id.clone())
            .unwrap_or_default();
        let mut base = LabelMap::new();
        set(&mut base, "__meta_kubernetes_pod_container_name", c.name.clone());
        set(&mut base, "__meta_kubernetes_pod_container_id", id);
        set(&mut base, "__meta_kubernetes_pod_container_image", c.image.clone().unwrap_or_default());
        set(&mut base, "__meta_kubernetes_pod_container_init", is_init.to_string());
        let ports = c.ports.as_deref().unwrap_or_default();
        // A container without declared ports still gives a target, at the pod's IP alone:
        // relabeling adds the port (often from an annotation).
        if ports.is_empty() {
            base.insert(ADDRESS_LABEL.into(), ip.to_owned());
            targets.push(base);
            continue;
        }
        for p in ports {
            let mut t = base.clone();
            set(&mut t, ADDRESS_LABEL, join_host_port(ip, p.container_port));
            set(&mut t, "__meta_kubernetes_pod_container_port_number", p.container_port.to_string());
            set(&mut t, "__meta_kubernetes_pod_container_port_name", p.name.clone().unwrap_or_default());
            set(&mut t, "__meta_kubernetes_pod_container_port_protocol", p.protocol.clone().unwrap_or_default());
            targets.push(t);
        }
    }
    Some(TargetGroup { source, targets, labels })
}

// ---- services ----

fn service_labels(svc: &Service) -> LabelMap {
    let mut l = LabelMap::new();
    set(&mut l, NAMESPACE_LABEL, svc.metadata.namespace.clone().unwrap_or_default());
    object_meta_labels(&mut l, &svc.metadata, "service");
    l
}

fn service_group(svc: &Service) -> TargetGroup {
    let (ns, name) = ns_name(&svc.metadata);
    let labels = service_labels(svc);
    let spec = svc.spec.as_ref();
    let kind = spec.and_then(|s| s.type_.clone()).unwrap_or_default();
    let mut targets = Vec::new();
    for port in spec.and_then(|s| s.ports.as_ref()).into_iter().flatten() {
        let mut t = LabelMap::new();
        set(&mut t, ADDRESS_LABEL, join_host_port(&format!("{name}.{ns}.svc"), port.port));
        set(&mut t, "__meta_kubernetes_service_port_name", port.name.clone().unwrap_or_default());
        set(&mut t, "__meta_kubernetes_service_port_number", port.port.to_string());
        set(&mut t, "__meta_kubernetes_service_port_protocol", port.protocol.clone().unwrap_or_default());
        set(&mut t, "__meta_kubernetes_service_type", kind.clone());
        let spec = spec.expect("ports come from the spec");
        if kind == "ExternalName" {
            set(&mut t, "__meta_kubernetes_service_external_name", spec.external_name.clone().unwrap_or_default());
        } else {
            set(&mut t, "__meta_kubernetes_service_cluster_ip", spec.cluster_ip.clone().unwrap_or_default());
        }
        if kind == "LoadBalancer" {
            set(&mut t, "__meta_kubernetes_service_loadbalancer_ip", spec.load_balancer_ip.clone().unwrap_or_default());
        }
        targets.push(t);
    }
    TargetGroup { source: format!("svc/{ns}/{name}"), targets, labels }
}

// ---- endpoints and endpoint slices ----

fn resolve_pod<'a>(objects: &'a Objects, target: Option<&ObjectReference>) -> Option<&'a Arc<Pod>> {
    let r = target?;
    if r.kind.as_deref() != Some("Pod") {
        return None;
    }
    let key = (r.namespace.clone().unwrap_or_default(), r.name.clone().unwrap_or_default());
    objects.pods.get(&key)
}

/// Labels of the container port of `pod` that serves `port`, when one declares it; the
/// protocol is the endpoint's (`endpoints`) or the container port's (`endpointslice`), as
/// Prometheus has it.
fn container_port_labels(target: &mut LabelMap, pod: &Pod, port: i32, endpoint_protocol: Option<&str>) {
    for c in pod.spec.iter().flat_map(|s| &s.containers) {
        if let Some(cp) = c.ports.iter().flatten().find(|cp| cp.container_port == port) {
            set(target, "__meta_kubernetes_pod_container_name", c.name.clone());
            set(target, "__meta_kubernetes_pod_container_image", c.image.clone().unwrap_or_default());
            set(target, "__meta_kubernetes_pod_container_port_name", cp.name.clone().unwrap_or_default());
            set(target, "__meta_kubernetes_pod_container_port_number", port.to_string());
            let protocol = endpoint_protocol.map(str::to_owned).or_else(|| cp.protocol.clone()).unwrap_or_default();
            set(target, "__meta_kubernetes_pod_container_port_protocol", protocol);
            return;
        }
    }
}

/// Targets for the container ports of pods behind a service that no endpoint port covered:
/// a pod often serves its metrics on a port the service does not expose.
fn uncovered_pod_ports(seen: &BTreeMap<(String, String), (&Pod, BTreeSet<i32>)>, targets: &mut Vec<LabelMap>) {
    for (pod, covered) in seen.values() {
        let ip = pod_ip(pod);
        if ip.is_empty() {
            continue;
        }
        for c in pod.spec.iter().flat_map(|s| &s.containers) {
            for cp in c.ports.iter().flatten() {
                if covered.contains(&cp.container_port) {
                    continue;
                }
                let mut t = pod_labels(pod);
                set(&mut t, ADDRESS_LABEL, join_host_port(ip, cp.container_port));
                set(&mut t, "__meta_kubernetes_pod_container_name", c.name.clone());
                set(&mut t, "__meta_kubernetes_pod_container_image", c.image.clone().unwrap_or_default());
                set(&mut t, "__meta_kubernetes_pod_container_port_name", cp.name.clone().unwrap_or_default());
                set(&mut t, "__meta_kubernetes_pod_container_port_number", cp.container_port.to_string());
                set(&mut t, "__meta_kubernetes_pod_container_port_protocol", cp.protocol.clone().unwrap_or_default());
                targets.push(t);
            }
        }
    }
}

fn add_service_labels(labels: &mut LabelMap, objects: &Objects, ns: &str, name: Option<&str>) {
    if let Some(svc) = name.and_then(|n| objects.services.get(&(ns.to_owned(), n.to_owned()))) {
        labels.extend(service_labels(svc));
    }
}

/// Node labels for an endpoint: from its node name, or from its target when that is a node.
fn endpoint_node_labels(
    t: &mut LabelMap,
    nodes: Option<&Store<Node>>,
    node_name: Option<&str>,
    target: Option<&ObjectReference>,
) {
    let node = match target {
        Some(r) if r.kind.as_deref() == Some("Node") => r.name.as_deref(),
        _ => node_name,
    };
    add_node_labels(t, nodes, node);
}

fn endpoints_group(eps: &Endpoints, objects: &Objects, nodes: Option<&Store<Node>>) -> TargetGroup {
    let (ns, name) = ns_name(&eps.metadata);
    let mut labels = LabelMap::new();
    set(&mut labels, NAMESPACE_LABEL, ns.clone());
    add_service_labels(&mut labels, objects, &ns, Some(&name));
    object_meta_labels(&mut labels, &eps.metadata, "endpoints");
    let mut targets = Vec::new();
    let mut seen: BTreeMap<(String, String), (&Pod, BTreeSet<i32>)> = BTreeMap::new();
    for subset in eps.subsets.iter().flatten() {
        for port in subset.ports.iter().flatten() {
            let ready = subset.addresses.iter().flatten().map(|a| (a, "true"));
            let not_ready = subset.not_ready_addresses.iter().flatten().map(|a| (a, "false"));
            for (addr, ready) in ready.chain(not_ready) {
                let protocol = port.protocol.clone().unwrap_or_default();
                let mut t = LabelMap::new();
                set(&mut t, ADDRESS_LABEL, join_host_port(&addr.ip, port.port));
                set(&mut t, "__meta_kubernetes_endpoint_port_name", port.name.clone().unwrap_or_default());
                set(&mut t, "__meta_kubernetes_endpoint_port_protocol", protocol.clone());
                set(&mut t, "__meta_kubernetes_endpoint_ready", ready);
                if let Some(r) = &addr.target_ref {
                    set(&mut t, "__meta_kubernetes_endpoint_address_target_kind", r.kind.clone().unwrap_or_default());
                    set(&mut t, "__meta_kubernetes_endpoint_address_target_name", r.name.clone().unwrap_or_default());
                }
                if let Some(n) = &addr.node_name {
                    set(&mut t, "__meta_kubernetes_endpoint_node_name", n.clone());
                }
                if let Some(h) = addr.hostname.as_ref().filter(|h| !h.is_empty()) {
                    set(&mut t, "__meta_kubernetes_endpoint_hostname", h.clone());
                }
                endpoint_node_labels(&mut t, nodes, addr.node_name.as_deref(), addr.target_ref.as_ref());
                if let Some(pod) = resolve_pod(objects, addr.target_ref.as_ref()) {
                    t.extend(pod_labels(pod));
                    container_port_labels(&mut t, pod, port.port, Some(&protocol));
                    seen.entry(ns_name(&pod.metadata)).or_insert((pod, BTreeSet::new())).1.insert(port.port);
                }
                targets.push(t);
            }
        }
    }
    uncovered_pod_ports(&seen, &mut targets);
    TargetGroup { source: format!("endpoints/{ns}/{name}"), targets, labels }
}

fn endpoint_slice_group(slice: &EndpointSlice, objects: &Objects, nodes: Option<&Store<Node>>) -> TargetGroup {
    let (ns, name) = ns_name(&slice.metadata);
    let mut labels = LabelMap::new();
    set(&mut labels, NAMESPACE_LABEL, ns.clone());
    set(&mut labels, "__meta_kubernetes_endpointslice_address_type", slice.address_type.clone());
    object_meta_labels(&mut labels, &slice.metadata, "endpointslice");
    let service = slice.metadata.labels.as_ref().and_then(|l| l.get(SERVICE_NAME_LABEL));
    add_service_labels(&mut labels, objects, &ns, service.map(String::as_str));
    let mut targets = Vec::new();
    let mut seen: BTreeMap<(String, String), (&Pod, BTreeSet<i32>)> = BTreeMap::new();
    let no_ports = Vec::new();
    for ep in &slice.endpoints {
        for port in slice.ports.as_ref().unwrap_or(&no_ports) {
            for addr in &ep.addresses {
                let mut t = LabelMap::new();
                let address = match port.port {
                    Some(p) => join_host_port(addr, p),
                    None => addr.clone(),
                };
                set(&mut t, ADDRESS_LABEL, address);
                if let Some(v) = &port.name {
                    set(&mut t, "__meta_kubernetes_endpointslice_port_name", v.clone());
                }
                if let Some(v) = &port.protocol {
                    set(&mut t, "__meta_kubernetes_endpointslice_port_protocol", v.clone());
                }
                if let Some(v) = port.port {
                    set(&mut t, "__meta_kubernetes_endpointslice_port", v.to_string());
                }
                if let Some(v) = &port.app_protocol {
                    set(&mut t, "__meta_kubernetes_endpointslice_port_app_protocol", v.clone());
                }
                let conditions = ep.conditions.as_ref();
                for (cond, value) in [
                    ("ready", conditions.and_then(|c| c.ready)),
                    ("serving", conditions.and_then(|c| c.serving)),
                    ("terminating", conditions.and_then(|c| c.terminating)),
                ] {
                    if let Some(v) = value {
                        set(
                            &mut t,
                            format!("__meta_kubernetes_endpointslice_endpoint_conditions_{cond}"),
                            v.to_string(),
                        );
                    }
                }
                if let Some(v) = &ep.hostname {
                    set(&mut t, "__meta_kubernetes_endpointslice_endpoint_hostname", v.clone());
                }
                if let Some(r) = &ep.target_ref {
                    set(
                        &mut t,
                        "__meta_kubernetes_endpointslice_address_target_kind",
                        r.kind.clone().unwrap_or_default(),
                    );
                    set(
                        &mut t,
                        "__meta_kubernetes_endpointslice_address_target_name",
                        r.name.clone().unwrap_or_default(),
                    );
                }
                if let Some(v) = &ep.node_name {
                    set(&mut t, "__meta_kubernetes_endpointslice_endpoint_node_name", v.clone());
                }
                if let Some(v) = &ep.zone {
                    set(&mut t, "__meta_kubernetes_endpointslice_endpoint_zone", v.clone());
                }
                for (k, v) in ep.deprecated_topology.iter().flatten() {
                    let n = sanitize(k);
                    set(&mut t, format!("__meta_kubernetes_endpointslice_endpoint_topology_{n}"), v.clone());
                    set(&mut t, format!("__meta_kubernetes_endpointslice_endpoint_topology_present_{n}"), PRESENT);
                }
                endpoint_node_labels(&mut t, nodes, ep.node_name.as_deref(), ep.target_ref.as_ref());
                if let Some(pod) = resolve_pod(objects, ep.target_ref.as_ref()) {
                    t.extend(pod_labels(pod));
                    if let Some(p) = port.port {
                        container_port_labels(&mut t, pod, p, None);
                    }
                    let entry = seen.entry(ns_name(&pod.metadata)).or_insert((pod, BTreeSet::new()));
                    entry.1.extend(port.port);
                }
                targets.push(t);
            }
        }
    }
    uncovered_pod_ports(&seen, &mut targets);
    TargetGroup { source: format!("endpointslice/{ns}/{name}"), targets, labels }
}

// ---- nodes ----

/// The address a node is scraped at, in Kubernetes' own order of preference, and the first
/// address of each type.
fn node_address(node: &Node) -> (Option<String>, BTreeMap<String, String>) {
    let mut first: BTreeMap<String, String> = BTreeMap::new();
    for a in node.status.iter().flat_map(|s| s.addresses.iter().flatten()) {
        first.entry(a.type_.clone()).or_insert_with(|| a.address.clone());
    }
    let preferred = ["InternalIP", "InternalDNS", "ExternalIP", "ExternalDNS", "LegacyHostIP", "Hostname"]
        .iter()
        .find_map(|t| first.get(*t).cloned());
    (preferred, first)
}

fn node_group(node: &Node) -> Option<TargetGroup> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let mut labels = LabelMap::new();
    set(
        &mut labels,
        "__meta_kubernetes_node_provider_id",
        node.spec.as_ref().and_then(|s| s.provider_id.clone()).unwrap_or_default(),
    );
    object_meta_labels(&mut labels, &node.metadata, "node");
    let (address, by_type) = node_address(node);
    let Some(address) = address else {
        tracing::warn!(node = %name, "kubernetes_sd: node has no address; no target for it");
        return None;
    };
    let port = node
        .status
        .as_ref()
        .and_then(|s| s.daemon_endpoints.as_ref())
        .and_then(|d| d.kubelet_endpoint.as_ref())
        .map_or(0, |k| k.port);
    let mut t = LabelMap::new();
    set(&mut t, ADDRESS_LABEL, join_host_port(&address, port));
    set(&mut t, "instance", name.clone());
    for (kind, a) in by_type {
        set(&mut t, sanitize(&format!("__meta_kubernetes_node_address_{kind}")), a);
    }
    Some(TargetGroup { source: format!("node/{name}"), targets: vec![t], labels })
}

// ---- ingresses ----

fn ingress_group(ing: &Ingress) -> TargetGroup {
    let (ns, name) = ns_name(&ing.metadata);
    let mut labels = LabelMap::new();
    set(&mut labels, NAMESPACE_LABEL, ns.clone());
    object_meta_labels(&mut labels, &ing.metadata, "ingress");
    let spec = ing.spec.as_ref();
    // The class from the spec, or from the annotation older ingresses use.
    let class = spec
        .and_then(|s| s.ingress_class_name.clone())
        .or_else(|| ing.metadata.annotations.as_ref().and_then(|a| a.get("kubernetes.io/ingress.class")).cloned());
    if let Some(c) = class {
        set(&mut labels, "__meta_kubernetes_ingress_class_name", c);
    }
    let tls_hosts: BTreeSet<&str> = spec
        .iter()
        .flat_map(|s| s.tls.iter().flatten())
        .flat_map(|t| t.hosts.iter().flatten())
        .map(String::as_str)
        .collect();
    let mut targets = Vec::new();
    for rule in spec.iter().flat_map(|s| s.rules.iter().flatten()) {
        let host = rule.host.clone().unwrap_or_default();
        let scheme = if tls_hosts.contains(host.as_str()) { "https" } else { "http" };
        let paths: Vec<String> = match &rule.http {
            None => vec!["/".into()],
            Some(h) => {
                h.paths.iter().map(|p| p.path.clone().filter(|p| !p.is_empty()).unwrap_or_else(|| "/".into())).collect()
            }
        };
        for path in paths {
            let mut t = LabelMap::new();
            set(&mut t, ADDRESS_LABEL, host.clone());
            set(&mut t, "__meta_kubernetes_ingress_scheme", scheme);
            set(&mut t, "__meta_kubernetes_ingress_host", host.clone());
            set(&mut t, "__meta_kubernetes_ingress_path", path);
            targets.push(t);
        }
    }
    TargetGroup { source: format!("ingress/{ns}/{name}"), targets, labels }
}
