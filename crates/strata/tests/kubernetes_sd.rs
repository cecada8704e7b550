//! `kubernetes_sd_configs` end to end: `strata serve` and Debian's Prometheus 2.42 discover
//! targets from one stand-in API server (`support/kube_api.rs`) serving a recorded cluster
//! (`testdata/kubernetes/cluster.json`: nodes, pods, services, endpoints, an EndpointSlice, an
//! Ingress). Every role's discovered labels must be Prometheus' exactly, at the start and
//! after the cluster changes: objects added, modified and deleted through watch events, every
//! watch ended (resumed from its resourceVersion), and an object deleted while the history
//! was compacted (the next watch gets 410 Gone: only a new list shows the deletion).

#[path = "support/kube_api.rs"]
mod kube_api;
mod support;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kube_api::FakeApiServer;
use serde_json::{json, Value};
use support::{free_port, http, which, KillOnDrop, Server};

type LabelSet = BTreeMap<String, String>;

/// The discovered labels of each job's active targets, as sorted lists, keeping the labels
/// discovery gives (`__address__`, `instance` and `__meta_kubernetes_*`): the rest comes from
/// the job's own settings.
fn discovered(port: u16) -> BTreeMap<String, Vec<LabelSet>> {
    let Ok((200, body)) = support::try_http(port, "GET", "/api/v1/targets", &[], b"") else {
        return BTreeMap::new();
    };
    let v: Value = serde_json::from_str(&body).unwrap();
    let mut out: BTreeMap<String, Vec<LabelSet>> = BTreeMap::new();
    for t in v["data"]["activeTargets"].as_array().into_iter().flatten() {
        let labels: LabelSet = t["discoveredLabels"]
            .as_object()
            .unwrap()
            .iter()
            .filter(|(k, _)| k.starts_with("__meta_kubernetes") || *k == "__address__" || *k == "instance")
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
            .collect();
        out.entry(t["scrapePool"].as_str().unwrap().to_owned()).or_default().push(labels);
    }
    for v in out.values_mut() {
        v.sort();
    }
    out
}

/// Labels Prometheus gives that VictoriaMetrics 1.79 (Debian's) does not: Prometheus added
/// them after VictoriaMetrics copied its discovery. Strata gives them, as Prometheus does; the
/// test checks them against hand-written expectations instead.
const NEWER_IN_PROMETHEUS: &[&str] = &[
    "__meta_kubernetes_pod_container_id",
    "__meta_kubernetes_pod_container_image",
    "__meta_kubernetes_service_port_number",
    "__meta_kubernetes_service_loadbalancer_ip",
    "__meta_kubernetes_endpointslice_endpoint_conditions_serving",
    "__meta_kubernetes_endpointslice_endpoint_conditions_terminating",
    "__meta_kubernetes_endpointslice_endpoint_node_name",
    "__meta_kubernetes_endpointslice_endpoint_zone",
    "__meta_kubernetes_endpointslice_endpoint_topology_",
];

/// Both sides with the known differences between Prometheus' discovery (which Strata follows)
/// and VictoriaMetrics 1.79's taken out:
/// - the labels in `NEWER_IN_PROMETHEUS`;
/// - VictoriaMetrics adds `service_cluster_ip` and `service_type` to endpoints targets;
///   Prometheus gives a service's name, labels and annotations there, nothing more;
/// - for a pod's container port that no endpoint covers, Prometheus' target is in the
///   endpoints object's group (so it has the group's `endpoints_*`/`endpointslice_*` labels)
///   with the pod's labels and no node labels; VictoriaMetrics gives it node labels and no
///   group labels.
fn without_known_differences(d: &BTreeMap<String, Vec<LabelSet>>) -> BTreeMap<String, Vec<LabelSet>> {
    let mut out = d.clone();
    for (job, targets) in &mut out {
        let endpoints_role = job.starts_with("endpoints") || job == "slices";
        for t in targets.iter_mut() {
            t.retain(|k, _| !NEWER_IN_PROMETHEUS.iter().any(|p| k.starts_with(p)));
            if endpoints_role {
                t.remove("__meta_kubernetes_service_cluster_ip");
                t.remove("__meta_kubernetes_service_type");
                let uncovered = !t.contains_key("__meta_kubernetes_endpoint_port_name")
                    && !t.contains_key("__meta_kubernetes_endpointslice_port");
                if uncovered {
                    t.retain(|k, _| {
                        !k.starts_with("__meta_kubernetes_endpoints_")
                            && !k.starts_with("__meta_kubernetes_endpointslice_")
                            && !k.starts_with("__meta_kubernetes_node_")
                    });
                }
            }
        }
        targets.sort();
    }
    out
}

/// Target by target (paired by address), the labels only one side has.
fn difference(ours: &[LabelSet], theirs: &[LabelSet]) -> String {
    let mut out = format!("Strata has {} targets, VictoriaMetrics {}\n", ours.len(), theirs.len());
    for (i, a) in ours.iter().enumerate() {
        let same_address: Vec<&LabelSet> = theirs.iter().filter(|b| b["__address__"] == a["__address__"]).collect();
        let Some(b) = same_address.iter().min_by_key(|b| a.iter().filter(|(k, v)| b.get(*k) != Some(*v)).count())
        else {
            out += &format!("#{i} {}: only Strata has it: {a:#?}\n", a["__address__"]);
            continue;
        };
        let only_a: Vec<_> = a.iter().filter(|(k, v)| b.get(*k) != Some(*v)).collect();
        let only_b: Vec<_> = b.iter().filter(|(k, v)| a.get(*k) != Some(*v)).collect();
        if !only_a.is_empty() || !only_b.is_empty() {
            out += &format!("#{i} {}: only Strata {only_a:?}; only VictoriaMetrics {only_b:?}\n", a["__address__"]);
        }
    }
    for b in theirs {
        if !ours.iter().any(|a| a["__address__"] == b["__address__"]) {
            out += &format!("{}: only VictoriaMetrics has it: {b:#?}\n", b["__address__"]);
        }
    }
    out
}

fn addresses(d: &BTreeMap<String, Vec<LabelSet>>, job: &str) -> Vec<String> {
    let mut a: Vec<String> = d.get(job).into_iter().flatten().map(|l| l["__address__"].clone()).collect();
    a.sort();
    a
}

fn wait_until(what: &str, srv: &Server, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}\n{}", srv.log_text());
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Prometheus on the same configuration, and where it logs.
struct Prometheus {
    port: u16,
    log: std::path::PathBuf,
}

/// Waits until Strata and Prometheus agree and `check` holds for Strata's targets, then
/// returns them; on time-out, shows the first difference and both logs.
fn agree(
    what: &str,
    srv: &Server,
    prom: &Prometheus,
    check: impl Fn(&BTreeMap<String, Vec<LabelSet>>) -> bool,
) -> BTreeMap<String, Vec<LabelSet>> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (ours, theirs) = (discovered(srv.port), discovered(prom.port));
        let (ours_cmp, theirs_cmp) = (without_known_differences(&ours), without_known_differences(&theirs));
        if check(&ours) && ours_cmp == theirs_cmp {
            return ours;
        }
        if Instant::now() > deadline {
            let plog = std::fs::read_to_string(&prom.log).unwrap_or_default();
            let mut diffs = String::new();
            for job in ours_cmp.keys().chain(theirs_cmp.keys()) {
                let (a, b) =
                    (ours_cmp.get(job).cloned().unwrap_or_default(), theirs_cmp.get(job).cloned().unwrap_or_default());
                if a != b {
                    diffs += &format!("job {job} differs\n{}\n", difference(&a, &b));
                }
            }
            if !diffs.is_empty() {
                panic!("{what}: {diffs}\n{}\n{plog}", srv.log_text());
            }
            panic!("{what}: the check never held for {ours:#?}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn kubernetes_discovery_matches_prometheus_through_changes_restarts_and_relists() {
    let victoria = which("victoria-metrics");
    let cluster: Value =
        serde_json::from_str(include_str!("../../../testdata/kubernetes/cluster.json")).expect("the recorded cluster");
    let api = FakeApiServer::start(&cluster);
    let url = &api.url;
    // Pod and service labels become target labels (a common setup): a changed label makes a
    // new target, in both servers. (VictoriaMetrics 1.79 keeps showing a target's old
    // discovered labels when only they change; Prometheus and Strata show the latest.)
    let job = |name: &str, role: &str, extra: &str| {
        format!(
            "  - job_name: {name}\n    kubernetes_sd_configs:\n      - role: {role}\n        api_server: {url}\n{extra}{}",
            "    relabel_configs:\n      - action: labelmap\n        regex: __meta_kubernetes_(pod|service)_label_(.+)\n        replacement: $2\n"
        )
    };
    let config = [
        "global:\n  scrape_interval: 1m\nscrape_configs:\n".to_owned(),
        job("pods", "pod", ""),
        job("services", "service", ""),
        job("endpoints", "endpoints", ""),
        job("slices", "endpointslice", ""),
        job("nodes", "node", ""),
        job("ingresses", "ingress", ""),
        job(
            "selected",
            "pod",
            concat!(
                "        namespaces:\n          names: [shop]\n",
                "        selectors:\n          - role: pod\n            label: app=web\n            field: spec.nodeName=node-a\n",
                "        attach_metadata:\n          node: true\n",
            ),
        ),
        job("endpoints_with_nodes", "endpoints", "        attach_metadata:\n          node: true\n"),
    ]
    .concat();
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("k8s.yml");
    std::fs::write(&cfg, &config).unwrap();
    let srv = Server::start(&tmp.path().join("strata"), &["--config", cfg.to_str().unwrap()]);
    let prom_port = free_port();
    let prom = Prometheus { port: prom_port, log: tmp.path().join("peer.log") };
    let _prom = KillOnDrop(
        Command::new(victoria)
            .arg(format!("-promscrape.config={}", cfg.display()))
            .arg("-promscrape.kubernetesSDCheckInterval=1s")
            .arg(format!("-storageDataPath={}", tmp.path().join("vm").display()))
            .arg(format!("-httpListenAddr=127.0.0.1:{prom_port}"))
            .stdout(std::fs::File::create(&prom.log).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );

    // The recorded cluster, every role.
    let all_jobs =
        ["endpoints", "endpoints_with_nodes", "ingresses", "nodes", "pods", "selected", "services", "slices"];
    let d = agree("the recorded cluster", &srv, &prom, |d| all_jobs.iter().all(|j| d.contains_key(*j)));
    // What the cluster gives, so that agreement on nothing cannot pass.
    assert_eq!(
        addresses(&d, "pods"),
        [
            "10.244.1.5",
            "10.244.1.5:8080",
            "10.244.1.5:9113",
            "10.244.2.7",
            "10.244.2.7:8080",
            "10.244.2.7:9113",
            "[fd00:10:244::8]:5432",
            "[fd00:10:244::8]:9187"
        ],
        // The containers without ports (a sidecar, an init container) give targets at the
        // pod's IP alone, which relabel to the same labels: one target, as in Prometheus.
        "a target per container port, one per pod IP for containers without ports, none for a pod without an IP"
    );
    assert_eq!(addresses(&d, "nodes"), ["172.18.0.2:10250", "198.51.100.7:10250"]);
    assert_eq!(
        addresses(&d, "services"),
        ["db-lb.data.svc:5432", "external-db.shop.svc:5432", "web.shop.svc:80", "web.shop.svc:9113"]
    );
    // Two paths of one host relabel to one target too; the one kept has a path.
    assert_eq!(addresses(&d, "ingresses"), ["admin.example.com", "shop.example.com"]);
    let shop = d["ingresses"].iter().find(|l| l["__address__"] == "shop.example.com").unwrap();
    assert_eq!(shop["__meta_kubernetes_ingress_scheme"], "https", "{shop:#?}");
    assert_eq!(shop["__meta_kubernetes_ingress_class_name"], "nginx", "{shop:#?}");
    // Endpoints: the two addresses of `web` (one not ready), the pods' ports the service
    // does not cover, and `legacy` (no pod behind it).
    assert_eq!(
        addresses(&d, "endpoints"),
        ["10.244.1.5:8080", "10.244.1.5:9113", "10.244.2.7:8080", "10.244.2.7:9113", "192.168.1.50:9100"]
    );
    assert_eq!(addresses(&d, "slices"), ["10.244.1.5:8080", "10.244.1.5:9113", "10.244.2.7:8080", "10.244.2.7:9113"]);
    // The selectors went to the API server, and node metadata was attached.
    assert_eq!(addresses(&d, "selected"), ["10.244.1.5", "10.244.1.5:8080", "10.244.1.5:9113"]);
    let sel = &d["selected"][0];
    assert_eq!(sel["__meta_kubernetes_node_label_topology_kubernetes_io_zone"], "eu-1a", "{sel:#?}");
    let requests = api.requests();
    assert!(
        requests.iter().any(|r| r.contains("/api/v1/namespaces/shop/pods?") && r.contains("labelSelector=app%3Dweb")),
        "{requests:#?}"
    );
    let web_abc = d["pods"].iter().find(|l| l["__address__"] == "10.244.1.5:9113").unwrap();
    for (k, v) in [
        ("__meta_kubernetes_pod_controller_kind", "ReplicaSet"),
        ("__meta_kubernetes_pod_annotation_prometheus_io_port", "9113"),
        ("__meta_kubernetes_pod_labelpresent_pod_template_hash", "true"),
        ("__meta_kubernetes_pod_container_id", "containerd://a1"),
        ("__meta_kubernetes_pod_ready", "true"),
    ] {
        assert_eq!(web_abc.get(k).map(String::as_str), Some(v), "{k} in {web_abc:#?}");
    }

    // Changes through watch events, as a rollout makes them: a label added to a pod, a pod
    // replaced by a new one (the endpoints controller moves the address over), the old one
    // deleted.
    let mut abc = api.get("Pod", "shop", "web-7d9f-abc");
    abc["metadata"]["labels"]["version"] = json!("2");
    api.apply(abc);
    let mut ghi = api.get("Pod", "shop", "web-7d9f-def");
    ghi["metadata"]["name"] = json!("web-7d9f-ghi");
    ghi["metadata"]["uid"] = json!("uid-web-7d9f-ghi");
    ghi["status"]["podIP"] = json!("10.244.2.9");
    api.apply(ghi);
    let moved = json!({"ip": "10.244.2.9", "nodeName": "node-b", "targetRef": {"kind": "Pod", "namespace": "shop", "name": "web-7d9f-ghi", "uid": "uid-web-7d9f-ghi"}});
    let mut eps = api.get("Endpoints", "shop", "web");
    eps["subsets"][0]["notReadyAddresses"] = json!([moved]);
    api.apply(eps);
    let mut slice = api.get("EndpointSlice", "shop", "web-x7k2p");
    slice["endpoints"][1]["addresses"] = json!(["10.244.2.9"]);
    slice["endpoints"][1]["targetRef"] = moved["targetRef"].clone();
    api.apply(slice);
    api.delete("Pod", "shop", "web-7d9f-def");
    let d = agree("after watch events", &srv, &prom, |d| {
        let pods = addresses(d, "pods");
        pods.contains(&"10.244.2.9:8080".to_owned())
            && !pods.contains(&"10.244.2.7:8080".to_owned())
            && addresses(d, "slices").contains(&"10.244.2.9:8080".to_owned())
            && d["pods"].iter().any(|l| l.get("__meta_kubernetes_pod_label_version").is_some_and(|v| v == "2"))
    });
    // The endpoints role saw the pod change too (its labels come from the pod).
    assert!(d["endpoints"].iter().any(|l| l.get("__meta_kubernetes_pod_label_version").is_some()));

    // Every watch ends; the clients resume from where they were and see what follows.
    api.end_watches();
    std::thread::sleep(Duration::from_millis(500));
    let mut svc = api.get("Service", "shop", "web");
    svc["metadata"]["labels"]["tier"] = json!("front");
    api.apply(svc);
    agree("after the watches were ended", &srv, &prom, |d| {
        d["services"].iter().any(|l| l.get("__meta_kubernetes_service_label_tier").is_some())
    });

    // A deletion the watches never see, with the history compacted: only a new list after
    // 410 Gone shows it.
    api.delete_unseen("Pod", "data", "db-0");
    agree("after 410 Gone and a new list", &srv, &prom, |d| {
        !addresses(d, "pods").iter().any(|a| a.starts_with("[fd00"))
    });
    let relists = api.requests().iter().filter(|r| r.contains("/api/v1/pods?") && !r.contains("watch=")).count();
    assert!(relists >= 2, "the pod list was read again: {:#?}", api.requests());
}

/// An API server that cannot be reached keeps the job (with no targets), counts the failures
/// and logs them; the rest of the server is unaffected.
#[test]
fn an_unreachable_api_server_is_logged_and_counted() {
    let dead = format!("http://127.0.0.1:{}", free_port());
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("k8s.yml");
    std::fs::write(
        &cfg,
        format!("scrape_configs:\n  - job_name: pods\n    kubernetes_sd_configs:\n      - role: pod\n        api_server: {dead}\n"),
    )
    .unwrap();
    let srv = Server::start(&tmp.path().join("strata"), &["--config", cfg.to_str().unwrap()]);
    wait_until("the failures counted", &srv, || {
        let (_, m) = http(srv.port, "GET", "/metrics", &[], b"");
        m.lines().any(|l| l.starts_with("strata_sd_file_read_errors_total ") && !l.ends_with(" 0"))
    });
    assert!(srv.log_text().contains("kubernetes_sd"), "{}", srv.log_text());
    let (code, _) = http(srv.port, "GET", "/api/v1/query?query=1", &[], b"");
    assert_eq!(code, 200);
}

/// Credentials reach the API server: a kubeconfig's user token, and `api_server` with
/// `basic_auth` or `authorization` from the job's settings.
#[test]
fn credentials_from_a_kubeconfig_or_the_http_settings_reach_the_api_server() {
    let cluster: Value =
        serde_json::from_str(include_str!("../../../testdata/kubernetes/cluster.json")).expect("the recorded cluster");
    let api = FakeApiServer::start(&cluster);
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("kubeconfig"),
        format!(
            concat!(
                "apiVersion: v1\nkind: Config\ncurrent-context: test\n",
                "clusters:\n- name: c\n  cluster: {{server: '{}'}}\n",
                "users:\n- name: u\n  user: {{token: from-kubeconfig}}\n",
                "contexts:\n- name: test\n  context: {{cluster: c, user: u, namespace: shop}}\n",
            ),
            api.url
        ),
    )
    .unwrap();
    std::fs::write(tmp.path().join("token"), "from-file\n").unwrap();
    let cfg = tmp.path().join("k8s.yml");
    std::fs::write(
        &cfg,
        format!(
            concat!(
                "scrape_configs:\n",
                "  - job_name: via_kubeconfig\n    kubernetes_sd_configs:\n      - role: node\n        kubeconfig_file: kubeconfig\n",
                "  - job_name: via_token\n    kubernetes_sd_configs:\n      - role: service\n        api_server: {url}\n",
                "        authorization: {{credentials_file: token}}\n",
                "  - job_name: via_basic\n    kubernetes_sd_configs:\n      - role: ingress\n        api_server: {url}\n",
                "        basic_auth: {{username: sd, password: secret}}\n",
            ),
            url = api.url
        ),
    )
    .unwrap();
    let srv = Server::start(&tmp.path().join("strata"), &["--config", cfg.to_str().unwrap()]);
    wait_until("the three jobs discovered their targets", &srv, || {
        let d = discovered(srv.port);
        ["via_kubeconfig", "via_token", "via_basic"].iter().all(|j| d.contains_key(*j))
    });
    let auth = api.authorizations();
    for want in ["Bearer from-kubeconfig", "Bearer from-file", "Basic c2Q6c2VjcmV0"] {
        assert!(auth.iter().any(|a| a == want), "{want} not among {auth:?}");
    }
}
