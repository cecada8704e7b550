//! Target groups from the recorded cluster (`testdata/kubernetes/cluster.json`), checked
//! against what Prometheus' discovery gives for the same objects. The end-to-end test
//! (`crates/strata/tests/kubernetes_sd.rs`) compares with VictoriaMetrics; these cover the
//! labels VictoriaMetrics 1.79 does not have and the cases relabeling hides there.

use std::sync::Arc;

use serde_json::Value;

use super::targets::{build, sanitize, Objects};
use super::*;
use crate::scrape::discovery::ADDRESS_LABEL;

const CLUSTER: &str = include_str!("../../../../../testdata/kubernetes/cluster.json");

fn objects() -> Objects {
    let list: Value = serde_json::from_str(CLUSTER).unwrap();
    let mut o = Objects::default();
    for item in list["items"].as_array().unwrap() {
        let meta = &item["metadata"];
        let key = (meta["namespace"].as_str().unwrap_or("").to_owned(), meta["name"].as_str().unwrap().to_owned());
        let item = item.clone();
        match item["kind"].as_str().unwrap() {
            "Pod" => drop(o.pods.insert(key, Arc::new(serde_json::from_value(item).unwrap()))),
            "Service" => drop(o.services.insert(key, Arc::new(serde_json::from_value(item).unwrap()))),
            "Endpoints" => drop(o.endpoints.insert(key, Arc::new(serde_json::from_value(item).unwrap()))),
            "EndpointSlice" => drop(o.endpoint_slices.insert(key, Arc::new(serde_json::from_value(item).unwrap()))),
            "Node" => drop(o.nodes.insert(key, Arc::new(serde_json::from_value(item).unwrap()))),
            "Ingress" => drop(o.ingresses.insert(key, Arc::new(serde_json::from_value(item).unwrap()))),
            k => panic!("unexpected kind {k}"),
        }
    }
    o
}

/// Each target with its group's labels, as relabeling sees it.
fn flat(groups: &[TargetGroup]) -> Vec<(String, crate::scrape::relabel::LabelMap)> {
    let mut out = Vec::new();
    for g in groups {
        for t in &g.targets {
            let mut l = g.labels.clone();
            l.extend(t.clone());
            out.push((g.source.clone(), l));
        }
    }
    out
}

fn get<'a>(l: &'a crate::scrape::relabel::LabelMap, k: &str) -> Option<&'a str> {
    l.get(k).map(String::as_str)
}

#[test]
fn pods_give_a_target_per_container_port_and_per_portless_container() {
    let groups = build(Role::Pod, &objects(), false);
    let sources: Vec<&str> = groups.iter().map(|g| g.source.as_str()).collect();
    // The pending pod has no IP: no group.
    assert_eq!(sources, ["pod/data/db-0", "pod/shop/web-7d9f-abc", "pod/shop/web-7d9f-def"]);
    let t = flat(&groups);
    let abc: Vec<_> = t.iter().filter(|(s, _)| s == "pod/shop/web-7d9f-abc").map(|(_, l)| l).collect();
    assert_eq!(abc.len(), 4, "two ports of `web`, the sidecar, the init container");
    let init = abc.iter().find(|l| get(l, "__meta_kubernetes_pod_container_name") == Some("init-db")).unwrap();
    assert_eq!(get(init, "__meta_kubernetes_pod_container_init"), Some("true"));
    assert_eq!(get(init, "__meta_kubernetes_pod_container_id"), Some("containerd://c3"));
    assert_eq!(get(init, ADDRESS_LABEL), Some("10.244.1.5"));
    assert_eq!(get(init, "__meta_kubernetes_pod_container_port_number"), None);
    let metrics = abc.iter().find(|l| get(l, ADDRESS_LABEL) == Some("10.244.1.5:9113")).unwrap();
    for (k, v) in [
        ("__meta_kubernetes_namespace", "shop"),
        ("__meta_kubernetes_pod_name", "web-7d9f-abc"),
        ("__meta_kubernetes_pod_ip", "10.244.1.5"),
        ("__meta_kubernetes_pod_ready", "true"),
        ("__meta_kubernetes_pod_phase", "Running"),
        ("__meta_kubernetes_pod_node_name", "node-a"),
        ("__meta_kubernetes_pod_host_ip", "172.18.0.2"),
        ("__meta_kubernetes_pod_uid", "uid-web-7d9f-abc"),
        ("__meta_kubernetes_pod_controller_kind", "ReplicaSet"),
        ("__meta_kubernetes_pod_controller_name", "web-7d9f"),
        ("__meta_kubernetes_pod_label_pod_template_hash", "7d9f"),
        ("__meta_kubernetes_pod_labelpresent_pod_template_hash", "true"),
        ("__meta_kubernetes_pod_annotation_prometheus_io_port", "9113"),
        ("__meta_kubernetes_pod_annotationpresent_prometheus_io_port", "true"),
        ("__meta_kubernetes_pod_container_name", "web"),
        ("__meta_kubernetes_pod_container_image", "nginx:1.25"),
        ("__meta_kubernetes_pod_container_id", "containerd://a1"),
        ("__meta_kubernetes_pod_container_init", "false"),
        ("__meta_kubernetes_pod_container_port_name", "metrics"),
        ("__meta_kubernetes_pod_container_port_number", "9113"),
        ("__meta_kubernetes_pod_container_port_protocol", "TCP"),
    ] {
        assert_eq!(get(metrics, k), Some(v), "{k} in {metrics:#?}");
    }
    // An IPv6 pod address is bracketed; a port without name or protocol gives empty labels.
    let db: Vec<_> = t.iter().filter(|(s, _)| s == "pod/data/db-0").map(|(_, l)| l).collect();
    let bare = db.iter().find(|l| get(l, ADDRESS_LABEL) == Some("[fd00:10:244::8]:9187")).unwrap();
    assert_eq!(get(bare, "__meta_kubernetes_pod_container_port_name"), Some(""));
    assert_eq!(get(bare, "__meta_kubernetes_pod_container_port_protocol"), Some(""));
    // A not-ready pod, and a container without a status yet (no ID).
    let def: Vec<_> = t.iter().filter(|(s, _)| s == "pod/shop/web-7d9f-def").map(|(_, l)| l).collect();
    assert_eq!(get(def[0], "__meta_kubernetes_pod_ready"), Some("false"));
    let sidecar = def.iter().find(|l| get(l, "__meta_kubernetes_pod_container_name") == Some("sidecar")).unwrap();
    assert_eq!(get(sidecar, "__meta_kubernetes_pod_container_id"), Some(""));
}

#[test]
fn attach_metadata_node_adds_the_nodes_labels_to_pods() {
    let groups = build(Role::Pod, &objects(), true);
    let abc = groups.iter().find(|g| g.source == "pod/shop/web-7d9f-abc").unwrap();
    assert_eq!(get(&abc.labels, "__meta_kubernetes_node_name"), Some("node-a"));
    assert_eq!(get(&abc.labels, "__meta_kubernetes_node_label_topology_kubernetes_io_zone"), Some("eu-1a"));
    assert_eq!(get(&abc.labels, "__meta_kubernetes_node_annotation_node_alpha_kubernetes_io_ttl"), Some("0"));
}

#[test]
fn services_give_a_target_per_port_by_type() {
    let t = flat(&build(Role::Service, &objects(), false));
    let by_addr = |a: &str| t.iter().find(|(_, l)| get(l, ADDRESS_LABEL) == Some(a)).map(|(_, l)| l).unwrap();
    let lb = by_addr("db-lb.data.svc:5432");
    assert_eq!(get(lb, "__meta_kubernetes_service_type"), Some("LoadBalancer"));
    assert_eq!(get(lb, "__meta_kubernetes_service_cluster_ip"), Some("10.96.0.20"));
    assert_eq!(get(lb, "__meta_kubernetes_service_loadbalancer_ip"), Some("203.0.113.5"));
    assert_eq!(get(lb, "__meta_kubernetes_service_port_name"), Some("pg"));
    assert_eq!(get(lb, "__meta_kubernetes_service_port_number"), Some("5432"));
    let ext = by_addr("external-db.shop.svc:5432");
    assert_eq!(get(ext, "__meta_kubernetes_service_external_name"), Some("db.example.com"));
    assert_eq!(get(ext, "__meta_kubernetes_service_cluster_ip"), None);
    assert_eq!(get(ext, "__meta_kubernetes_service_port_name"), Some(""));
    let web = by_addr("web.shop.svc:80");
    assert_eq!(get(web, "__meta_kubernetes_service_annotation_prometheus_io_scrape"), Some("true"));
    assert_eq!(get(web, "__meta_kubernetes_service_loadbalancer_ip"), None);
}

#[test]
fn endpoints_join_pods_and_services_and_cover_every_container_port() {
    let objects = objects();
    let t = flat(&build(Role::Endpoints, &objects, false));
    assert_eq!(t.len(), 5);
    let by_addr = |a: &str| t.iter().find(|(_, l)| get(l, ADDRESS_LABEL) == Some(a)).map(|(_, l)| l).unwrap();
    let ready = by_addr("10.244.1.5:8080");
    for (k, v) in [
        ("__meta_kubernetes_endpoints_name", "web"),
        ("__meta_kubernetes_endpoint_ready", "true"),
        ("__meta_kubernetes_endpoint_port_name", "http"),
        ("__meta_kubernetes_endpoint_address_target_kind", "Pod"),
        ("__meta_kubernetes_endpoint_node_name", "node-a"),
        ("__meta_kubernetes_service_name", "web"),
        ("__meta_kubernetes_service_label_app", "web"),
        ("__meta_kubernetes_pod_name", "web-7d9f-abc"),
        ("__meta_kubernetes_pod_container_name", "web"),
        ("__meta_kubernetes_pod_container_port_name", "http"),
        ("__meta_kubernetes_pod_container_port_number", "8080"),
    ] {
        assert_eq!(get(ready, k), Some(v), "{k} in {ready:#?}");
    }
    // Prometheus does not give a service's cluster IP or type on endpoints targets.
    assert_eq!(get(ready, "__meta_kubernetes_service_cluster_ip"), None);
    assert_eq!(get(by_addr("10.244.2.7:8080"), "__meta_kubernetes_endpoint_ready"), Some("false"));
    // The pod's metrics port, which the service's endpoints do not list: a target with the
    // pod's labels and the group's (endpoints and service), no endpoint labels.
    let uncovered = by_addr("10.244.1.5:9113");
    assert_eq!(get(uncovered, "__meta_kubernetes_pod_container_port_name"), Some("metrics"));
    assert_eq!(get(uncovered, "__meta_kubernetes_endpoints_name"), Some("web"));
    assert_eq!(get(uncovered, "__meta_kubernetes_endpoint_port_name"), None);
    // An address with no pod behind it.
    let legacy = by_addr("192.168.1.50:9100");
    assert_eq!(get(legacy, "__meta_kubernetes_endpoint_hostname"), Some("legacy-host"));
    assert_eq!(get(legacy, "__meta_kubernetes_endpoint_address_target_kind"), None);
    assert_eq!(get(legacy, "__meta_kubernetes_pod_name"), None);

    // With node metadata: on the endpoint targets, not on the uncovered ports.
    let t = flat(&build(Role::Endpoints, &objects, true));
    let by_addr = |a: &str| t.iter().find(|(_, l)| get(l, ADDRESS_LABEL) == Some(a)).map(|(_, l)| l).unwrap();
    assert_eq!(get(by_addr("10.244.2.7:8080"), "__meta_kubernetes_node_name"), Some("node-b"));
    assert_eq!(get(by_addr("10.244.2.7:9113"), "__meta_kubernetes_node_name"), None);
}

#[test]
fn endpoint_slices_carry_conditions_zone_and_topology() {
    let t = flat(&build(Role::EndpointSlice, &objects(), false));
    assert_eq!(t.len(), 4);
    let by_addr = |a: &str| t.iter().find(|(_, l)| get(l, ADDRESS_LABEL) == Some(a)).map(|(_, l)| l).unwrap();
    let a = by_addr("10.244.1.5:8080");
    for (k, v) in [
        ("__meta_kubernetes_endpointslice_name", "web-x7k2p"),
        ("__meta_kubernetes_endpointslice_address_type", "IPv4"),
        ("__meta_kubernetes_endpointslice_port", "8080"),
        ("__meta_kubernetes_endpointslice_port_name", "http"),
        ("__meta_kubernetes_endpointslice_port_protocol", "TCP"),
        ("__meta_kubernetes_endpointslice_port_app_protocol", "http"),
        ("__meta_kubernetes_endpointslice_endpoint_conditions_ready", "true"),
        ("__meta_kubernetes_endpointslice_endpoint_conditions_serving", "true"),
        ("__meta_kubernetes_endpointslice_endpoint_conditions_terminating", "false"),
        ("__meta_kubernetes_endpointslice_endpoint_zone", "eu-1a"),
        ("__meta_kubernetes_endpointslice_endpoint_node_name", "node-a"),
        ("__meta_kubernetes_endpointslice_endpoint_topology_kubernetes_io_hostname", "node-a"),
        ("__meta_kubernetes_endpointslice_endpoint_topology_present_kubernetes_io_hostname", "true"),
        ("__meta_kubernetes_endpointslice_address_target_name", "web-7d9f-abc"),
        ("__meta_kubernetes_service_name", "web"),
        ("__meta_kubernetes_pod_container_port_name", "http"),
    ] {
        assert_eq!(get(a, k), Some(v), "{k} in {a:#?}");
    }
    let b = by_addr("10.244.2.7:8080");
    assert_eq!(get(b, "__meta_kubernetes_endpointslice_endpoint_conditions_terminating"), Some("true"));
    assert_eq!(get(b, "__meta_kubernetes_endpointslice_endpoint_zone"), None);
}

#[test]
fn nodes_are_scraped_at_their_preferred_address_with_the_kubelet_port() {
    let t = flat(&build(Role::Node, &objects(), false));
    let (_, a) = &t[0];
    assert_eq!(get(a, ADDRESS_LABEL), Some("172.18.0.2:10250"));
    assert_eq!(get(a, "instance"), Some("node-a"));
    assert_eq!(get(a, "__meta_kubernetes_node_address_InternalIP"), Some("172.18.0.2"));
    assert_eq!(get(a, "__meta_kubernetes_node_provider_id"), Some("kind://docker/kind/node-a"));
    assert_eq!(get(a, "__meta_kubernetes_node_label_node_role_kubernetes_io_control_plane"), Some(""));
    // No InternalIP: ExternalIP comes before Hostname; the first of each type is labelled.
    let (_, b) = &t[1];
    assert_eq!(get(b, ADDRESS_LABEL), Some("198.51.100.7:10250"));
    assert_eq!(get(b, "__meta_kubernetes_node_address_ExternalIP"), Some("198.51.100.7"));
    assert_eq!(get(b, "__meta_kubernetes_node_address_Hostname"), Some("node-b"));
    assert_eq!(get(b, "__meta_kubernetes_node_provider_id"), Some(""));
}

#[test]
fn ingresses_give_a_target_per_host_and_path() {
    let t = flat(&build(Role::Ingress, &objects(), false));
    let got: Vec<(Option<&str>, Option<&str>, Option<&str>)> = t
        .iter()
        .map(|(_, l)| {
            (
                get(l, ADDRESS_LABEL),
                get(l, "__meta_kubernetes_ingress_scheme"),
                get(l, "__meta_kubernetes_ingress_path"),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (Some("shop.example.com"), Some("https"), Some("/")),
            (Some("shop.example.com"), Some("https"), Some("/api")),
            (Some("admin.example.com"), Some("http"), Some("/")),
        ]
    );
    assert_eq!(get(&t[0].1, "__meta_kubernetes_ingress_class_name"), Some("nginx"));
}

#[test]
fn label_names_are_sanitized_as_prometheus_does() {
    assert_eq!(sanitize("app.kubernetes.io/name"), "app_kubernetes_io_name");
    assert_eq!(sanitize("ok_Name9"), "ok_Name9");
    assert_eq!(sanitize("ünï-code"), "_n__code");
}

fn resolve(yaml: &str) -> Result<KubernetesSd, String> {
    let c: KubernetesSdConfig = yaml_serde::from_str(yaml).map_err(|e| e.to_string())?;
    c.resolve(Path::new("/etc/strata"), &|m| m.to_owned())
}

#[test]
fn configuration_resolves_credentials_and_selectors() {
    let sd = resolve(
        "role: endpoints\napi_server: https://k8s.example:6443\nauthorization: {credentials: tok}\ntls_config: {ca_file: ca.pem}\nnamespaces: {names: [a, b]}\nselectors: [{role: pod, label: 'app=web'}, {role: endpoints, field: 'metadata.name=web'}]\n",
    )
    .unwrap();
    assert_eq!(sd.role, Role::Endpoints);
    assert_eq!(sd.namespaces, ["a", "b"]);
    assert_eq!(sd.selectors[&Role::Pod].label.as_deref(), Some("app=web"));
    let ApiSource::Server { url, auth, tls, .. } = &sd.source else { panic!("{sd:?}") };
    assert_eq!(url, "https://k8s.example:6443");
    assert_eq!(*auth, Auth::Header { kind: "Bearer".into(), credentials: "tok".into() });
    assert_eq!(tls.ca_file.as_deref(), Some(Path::new("/etc/strata/ca.pem")));
    // A bare host is https, as client-go takes it; no server and no kubeconfig is in-cluster.
    let ApiSource::Server { url, .. } = resolve("role: pod\napi_server: k8s.example\n").unwrap().source else {
        panic!()
    };
    assert_eq!(url, "https://k8s.example");
    assert_eq!(resolve("role: node\n").unwrap().source, ApiSource::InCluster);
    // attach_metadata.node matters to the roles that have pods only.
    assert!(resolve("role: pod\nattach_metadata: {node: true}\n").unwrap().attach_node);
    assert!(!resolve("role: service\nattach_metadata: {node: true}\n").unwrap().attach_node);
    assert!(resolve("role: pod\napi_server: 'ftp://x'\n").unwrap_err().contains("scheme must be http or https"));
}

#[test]
fn a_kubeconfig_file_is_read_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    std::fs::write(
        &kc,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:6443'}\nusers:\n- name: u\n  user: {token: t}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n",
    )
    .unwrap();
    let sd = resolve(&format!("role: pod\nkubeconfig_file: {}\n", kc.display())).unwrap();
    assert_eq!(sd.source, ApiSource::Kubeconfig(kc.clone()));
    std::fs::write(&kc, "clusters: [").unwrap();
    let e = resolve(&format!("role: pod\nkubeconfig_file: {}\n", kc.display())).unwrap_err();
    assert!(e.contains("kubeconfig_file"), "{e}");
}
