//! What rebuilding Kubernetes target groups costs as a cluster grows: every change (at most one
//! rebuild a second) rebuilds every group of a role from the held objects. Pods and endpoints
//! over N pods shaped like the recorded cluster's (`testdata/kubernetes/cluster.json`), N in
//! 1k, 10k, 50k; median of 9 rebuilds.
//!
//! `cargo bench -p strata-server --bench kubernetes_targets`

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::{Endpoints, Pod};
use serde_json::{json, Value};
use strata_server::scrape::kubernetes::targets::{build, Objects};
use strata_server::scrape::kubernetes::Role;

const CLUSTER: &str = include_str!("../../../testdata/kubernetes/cluster.json");

fn cluster(pods: usize) -> Objects {
    let list: Value = serde_json::from_str(CLUSTER).unwrap();
    let items = list["items"].as_array().unwrap();
    let template = items.iter().find(|i| i["metadata"]["name"] == "web-7d9f-abc").unwrap();
    let mut o = Objects::default();
    // Services of 50 pods each, with an Endpoints object listing them.
    for s in 0..pods.div_ceil(50) {
        let mut addresses = Vec::new();
        for i in s * 50..((s + 1) * 50).min(pods) {
            let mut p = template.clone();
            let name = format!("web-{s}-{i}");
            let ip = format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255);
            p["metadata"]["name"] = json!(name);
            p["metadata"]["namespace"] = json!(format!("ns{s}"));
            p["metadata"]["labels"]["app"] = json!(format!("app{s}"));
            p["status"]["podIP"] = json!(ip);
            addresses.push(json!({"ip": ip, "nodeName": "node-a", "targetRef": {"kind": "Pod", "namespace": format!("ns{s}"), "name": name}}));
            let pod: Pod = serde_json::from_value(p).unwrap();
            o.pods.insert((format!("ns{s}"), name), Arc::new(pod));
        }
        let eps: Endpoints = serde_json::from_value(json!({
            "metadata": {"name": format!("app{s}"), "namespace": format!("ns{s}")},
            "subsets": [{"addresses": addresses, "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}]
        }))
        .unwrap();
        o.endpoints.insert((format!("ns{s}"), format!("app{s}")), Arc::new(eps));
    }
    o
}

fn main() {
    println!("{:>7} {:>14} {:>8} {:>14} {:>8}", "pods", "role", "targets", "median ms", "µs/pod");
    for n in [1_000, 10_000, 50_000] {
        let objects = cluster(n);
        for role in [Role::Pod, Role::Endpoints] {
            let mut times = Vec::new();
            let mut targets = 0;
            for _ in 0..9 {
                let t = Instant::now();
                let groups = build(role, &objects, false);
                times.push(t.elapsed().as_secs_f64() * 1e3);
                targets = groups.iter().map(|g| g.targets.len()).sum();
                std::hint::black_box(groups);
            }
            times.sort_by(f64::total_cmp);
            let median = times[times.len() / 2];
            println!("{n:>7} {:>14} {targets:>8} {median:>14.1} {:>8.1}", format!("{role:?}"), median * 1e3 / n as f64);
        }
    }
}
