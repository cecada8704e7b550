//! Scraping end to end: `strata serve` scrapes real targets over HTTP. node_exporter from
//! Debian's `prometheus-node-exporter` package (which `.ci/run` installs), Strata's own
//! `/metrics`, and a test target whose series change under the test's control, for staleness,
//! discovery and reloads.

mod support;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::{free_port, http, which, KillOnDrop, Server};

/// An instant query's result: each series' labels and value.
fn query(port: u16, q: &str) -> Vec<(BTreeMap<String, String>, f64)> {
    let enc: String = form_urlencoded::byte_serialize(q.as_bytes()).collect();
    let (status, body) = http(port, "GET", &format!("/api/v1/query?query={enc}"), &[], b"");
    assert_eq!(status, 200, "{q}: {body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["data"]["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let labels = r["metric"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
                .collect();
            (labels, r["value"][1].as_str().unwrap().parse().unwrap())
        })
        .collect()
}

fn value(port: u16, q: &str) -> Option<f64> {
    query(port, q).first().map(|r| r.1)
}

/// Waits up to `secs` for `cond`, then fails with `what` and the server's log.
fn wait_for(srv: &Server, secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}\n{}", srv.log_text());
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn targets(port: u16) -> serde_json::Value {
    let (status, body) = http(port, "GET", "/api/v1/targets", &[], b"");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str::<serde_json::Value>(&body).unwrap()["data"].clone()
}

/// A scrape target whose exposition the test sets; it records each request's head.
#[derive(Clone)]
struct TestTarget {
    port: u16,
    body: Arc<Mutex<String>>,
    content_type: Arc<Mutex<String>>,
    last_request: Arc<Mutex<String>>,
}

impl TestTarget {
    fn start(body: &str) -> TestTarget {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let t = TestTarget {
            port: listener.local_addr().unwrap().port(),
            body: Arc::new(Mutex::new(body.to_owned())),
            content_type: Arc::new(Mutex::new("text/plain; version=0.0.4; charset=utf-8".into())),
            last_request: Arc::default(),
        };
        let t2 = t.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { continue };
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).map(|n| n == 1).unwrap_or(false) {
                    head.push(byte[0]);
                }
                *t2.last_request.lock().unwrap() = String::from_utf8_lossy(&head).into_owned();
                let body = t2.body.lock().unwrap().clone();
                let ct = t2.content_type.lock().unwrap().clone();
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: {ct}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes());
            }
        });
        t
    }

    fn set(&self, body: &str) {
        *self.body.lock().unwrap() = body.to_owned();
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

#[test]
fn scrapes_node_exporter_and_itself_then_marks_a_dead_target_stale() {
    let exporter = which("prometheus-node-exporter");
    let tmp = tempfile::tempdir().unwrap();
    let ne_port = free_port();
    let mut ne = KillOnDrop(
        Command::new(exporter)
            .arg(format!("--web.listen-address=127.0.0.1:{ne_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let config = tmp.path().join("strata.yml");
    let strata_port = free_port();
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: node\n    static_configs:\n      - targets: ['127.0.0.1:{ne_port}']\n        labels: {{env: test}}\n  - job_name: strata\n    static_configs:\n      - targets: ['127.0.0.1:{strata_port}']\n"
        ),
    )
    .unwrap();
    let srv = Server::start_on(strata_port, &tmp.path().join("data"), &["--config", config.to_str().unwrap()]);
    let p = srv.port;
    wait_for(&srv, 30, "node_exporter and strata up", || {
        value(p, "sum(up{job=\"node\"}) + sum(up{job=\"strata\"})") == Some(2.0)
    });
    wait_for(&srv, 10, "two node scrapes", || value(p, "count_over_time(up{job=\"node\"}[1m])").unwrap_or(0.0) >= 2.0);

    // Everything node_exporter exposed is stored with the target's labels.
    let scraped = value(p, "scrape_samples_scraped{job=\"node\"}").unwrap();
    assert!(scraped > 200.0, "node_exporter exposes hundreds of samples, got {scraped}");
    assert_eq!(value(p, "scrape_samples_post_metric_relabeling{job=\"node\"}"), Some(scraped));
    let series = value(
        p,
        &format!("count({{job=\"node\",env=\"test\",instance=\"127.0.0.1:{ne_port}\",__name__!~\"up|scrape_.*\"}})"),
    )
    .unwrap();
    assert!((series - scraped).abs() <= scraped * 0.05, "stored {series} series for {scraped} scraped samples");
    let idle = query(p, "node_cpu_seconds_total{mode=\"idle\",cpu=\"0\"}");
    assert_eq!(idle.len(), 1);
    assert_eq!(idle[0].0["job"], "node");
    assert!(value(p, "rate(node_cpu_seconds_total{mode=\"idle\",cpu=\"0\"}[10s])").is_some());

    // Metadata from the expositions, and the targets API.
    let (_, md) = http(p, "GET", "/api/v1/metadata?metric=node_cpu_seconds_total", &[], b"");
    let md: serde_json::Value = serde_json::from_str(&md).unwrap();
    assert_eq!(md["data"]["node_cpu_seconds_total"][0]["type"], "counter", "{md}");
    assert!(!md["data"]["node_cpu_seconds_total"][0]["help"].as_str().unwrap().is_empty());
    let t = targets(p);
    let active = t["activeTargets"].as_array().unwrap();
    assert_eq!(active.len(), 2, "{t}");
    let node = active.iter().find(|x| x["scrapePool"] == "node").unwrap();
    assert_eq!(node["health"], "up");
    assert_eq!(node["labels"]["env"], "test");
    assert_eq!(node["scrapeUrl"], format!("http://127.0.0.1:{ne_port}/metrics"));
    assert_eq!(node["scrapeInterval"], "1s");
    assert!(node["lastScrapeDuration"].as_f64().unwrap() > 0.0);
    // Strata's own series come from its own /metrics.
    assert!(value(p, "strata_tsdb_head_series{job=\"strata\"}").unwrap() > 0.0);

    // node_exporter dies: `up` goes to 0 and its series are marked stale at once (without the
    // markers they would linger for the 5-minute lookback).
    let _ = ne.0.kill();
    let _ = ne.0.wait();
    wait_for(&srv, 10, "up == 0", || value(p, "up{job=\"node\"}") == Some(0.0));
    assert!(query(p, "node_cpu_seconds_total").is_empty(), "series of a down target are stale");
    let down =
        targets(p)["activeTargets"].as_array().unwrap().iter().find(|x| x["scrapePool"] == "node").cloned().unwrap();
    assert_eq!(down["health"], "down");
    assert!(!down["lastError"].as_str().unwrap().is_empty());
}

#[test]
fn vanished_series_are_stale_and_reloads_keep_unchanged_targets_running() {
    let target = TestTarget::start("a 1\nb 2\n");
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("strata.yml");
    let job_t = format!(
        "  - job_name: t\n    scrape_interval: 1s\n    static_configs:\n      - targets: ['{}']\n",
        target.addr()
    );
    std::fs::write(&config, format!("scrape_configs:\n{job_t}")).unwrap();
    let srv =
        Server::start(&tmp.path().join("data"), &["--config", config.to_str().unwrap(), "--web.enable-lifecycle"]);
    let p = srv.port;
    wait_for(&srv, 20, "b scraped", || value(p, "b{job=\"t\"}") == Some(2.0));

    // b disappears from the exposition: a stale marker ends it at the next scrape.
    target.set("a 1\n");
    wait_for(&srv, 10, "b stale", || query(p, "b").is_empty());
    assert_eq!(value(p, "a{job=\"t\"}"), Some(1.0));
    assert_eq!(value(p, "last_over_time(b[1m])"), Some(2.0), "the samples before the marker stay");

    // Reload with a second job: job t is unchanged, so its loop keeps running (a restarted
    // loop would count its series as added again).
    let job_u = format!(
        "  - job_name: u\n    scrape_interval: 1s\n    static_configs:\n      - targets: ['{}']\n        labels: {{copy: 'yes'}}\n",
        target.addr()
    );
    std::fs::write(&config, format!("scrape_configs:\n{job_t}{job_u}")).unwrap();
    let (status, body) = http(p, "POST", "/-/reload", &[], b"");
    assert_eq!(status, 200, "{body}");
    wait_for(&srv, 10, "job u up", || value(p, "up{job=\"u\",copy=\"yes\"}") == Some(1.0));
    assert_eq!(value(p, "sum_over_time(scrape_series_added{job=\"t\"}[5m])"), Some(2.0), "job t restarted");
    let (_, cfg) = http(p, "GET", "/api/v1/status/config", &[], b"");
    assert!(cfg.contains("job_name: u"), "{cfg}");

    // A broken configuration is refused and the running one stays.
    std::fs::write(&config, format!("scrape_configs:\n{job_t}  - job_name: t\n")).unwrap();
    let (status, body) = http(p, "POST", "/-/reload", &[], b"");
    assert_eq!(status, 500);
    assert!(body.contains("multiple scrape configs with job name \"t\""), "{body}");
    assert_eq!(targets(p)["activeTargets"].as_array().unwrap().len(), 2);
    // ... and said so where Prometheus says it.
    let runtime = |p| {
        serde_json::from_str::<serde_json::Value>(&http(p, "GET", "/api/v1/status/runtimeinfo", &[], b"").1).unwrap()
    };
    assert_eq!(runtime(p)["data"]["reloadConfigSuccess"], false);
    let (_, metrics) = http(p, "GET", "/metrics", &[], b"");
    assert!(metrics.contains("\nstrata_config_last_reload_successful 0\n"), "{metrics}");
    assert!(metrics.contains("\nprocess_cpu_seconds_total "), "{metrics}");
    let applied_before = runtime(p)["data"]["lastConfigTime"].clone();

    // SIGHUP reloads too: job u goes, and its series are marked stale.
    std::fs::write(&config, format!("scrape_configs:\n{job_t}")).unwrap();
    // SAFETY: sends a signal to our own child process.
    unsafe { libc::kill(srv.pid(), libc::SIGHUP) };
    wait_for(&srv, 10, "job u gone", || targets(p)["activeTargets"].as_array().unwrap().len() == 1);
    assert_eq!(runtime(p)["data"]["reloadConfigSuccess"], true);
    assert_ne!(runtime(p)["data"]["lastConfigTime"], applied_before, "a reload that applied moves the time");
    wait_for(&srv, 10, "job u stale", || query(p, "up{job=\"u\"}").is_empty());
    assert!(query(p, "a{job=\"u\"}").is_empty());
    assert_eq!(value(p, "a{job=\"t\"}"), Some(1.0));
}

#[test]
fn file_discovery_relabeling_auth_and_openmetrics() {
    // An explicit timestamp a minute ago, in OpenMetrics' seconds.
    let ts = support::now_ms() / 1000 - 60;
    let one = TestTarget::start(&format!("# TYPE x counter\nx_total 1 {ts}.5\n# EOF\n"));
    *one.content_type.lock().unwrap() = "application/openmetrics-text; version=1.0.0; charset=utf-8".into();
    let two = TestTarget::start("x_total 2\n");
    let tmp = tempfile::tempdir().unwrap();
    let sd = tmp.path().join("sd");
    std::fs::create_dir(&sd).unwrap();
    std::fs::write(tmp.path().join("password"), "s3cret\n").unwrap();
    std::fs::write(sd.join("a.json"), format!(r#"[{{"targets": ["{}"], "labels": {{"team": "a"}}}}]"#, one.addr()))
        .unwrap();
    let config = tmp.path().join("strata.yml");
    std::fs::write(
        &config,
        concat!(
            "global:\n  external_labels: {cluster: c1}\n",
            "scrape_configs:\n  - job_name: files\n    scrape_interval: 1s\n",
            "    basic_auth: {username: scraper, password_file: password}\n",
            "    file_sd_configs:\n      - files: ['sd/*.json']\n",
            "    relabel_configs:\n",
            "      - source_labels: [team]\n        regex: skip\n        action: drop\n",
            "      - source_labels: [__meta_filepath]\n        regex: '.*/(.*)\\.json'\n        target_label: file\n",
        ),
    )
    .unwrap();
    let srv = Server::start(&tmp.path().join("data"), &["--config", config.to_str().unwrap()]);
    let p = srv.port;
    wait_for(&srv, 20, "first target up", || value(p, "up{job=\"files\",team=\"a\"}") == Some(1.0));
    // OpenMetrics: the timestamp is in seconds; the file name came through relabeling.
    let x = query(p, "timestamp(x_total{team=\"a\"})");
    assert_eq!(x.len(), 1);
    assert_eq!(x[0].0["file"], "a");
    assert_eq!(x[0].1, ts as f64 + 0.5);
    // External labels are not stored, but federation adds them, as Prometheus does.
    assert!(!x[0].0.contains_key("cluster"));
    let (_, fed) = http(p, "GET", "/federate?match[]=x_total", &[], b"");
    assert!(fed.contains("cluster=\"c1\"") && fed.contains("x_total{"), "{fed}");
    // basic_auth from a file, relative to the configuration.
    let head = one.last_request.lock().unwrap().clone();
    assert!(
        head.contains("authorization: Basic c2NyYXBlcjpzM2NyZXQ=")
            || head.contains("Authorization: Basic c2NyYXBlcjpzM2NyZXQ="),
        "{head}"
    );
    assert!(head.to_ascii_lowercase().contains("accept: application/openmetrics-text;version=1.0.0"), "{head}");

    // The file changes: a second target, and a third the relabeling drops.
    std::fs::write(
        sd.join("a.json"),
        format!(
            r#"[{{"targets": ["{}", "{}"], "labels": {{"team": "a"}}}}, {{"targets": ["127.0.0.1:1"], "labels": {{"team": "skip"}}}}]"#,
            one.addr(),
            two.addr()
        ),
    )
    .unwrap();
    wait_for(&srv, 10, "second target up", || value(p, &format!("up{{instance=\"{}\"}}", two.addr())) == Some(1.0));
    let t = targets(p);
    assert_eq!(t["activeTargets"].as_array().unwrap().len(), 2, "{t}");
    let dropped = t["droppedTargets"].as_array().unwrap();
    assert_eq!(dropped.len(), 1, "{t}");
    assert_eq!(dropped[0]["discoveredLabels"]["team"], "skip");
    assert!(dropped[0]["discoveredLabels"]["__meta_filepath"].as_str().unwrap().ends_with("a.json"));

    // The first target leaves the file: its series are marked stale.
    std::fs::write(sd.join("a.json"), format!(r#"[{{"targets": ["{}"], "labels": {{"team": "a"}}}}]"#, two.addr()))
        .unwrap();
    wait_for(&srv, 10, "first target stale", || query(p, &format!("up{{instance=\"{}\"}}", one.addr())).is_empty());
    assert_eq!(value(p, &format!("x_total{{instance=\"{}\"}}", two.addr())), Some(2.0));
}

#[test]
fn out_of_the_box_strata_scrapes_itself() {
    let tmp = tempfile::tempdir().unwrap();
    let srv = Server::start_builtin_config(&tmp.path().join("data"));
    let p = srv.port;
    let t = targets(p);
    let active = t["activeTargets"].as_array().unwrap();
    assert_eq!(active.len(), 1, "{t}");
    assert_eq!(active[0]["scrapePool"], "strata");
    assert_eq!(active[0]["scrapeInterval"], "15s");
    // The first scrape comes within one interval (its offset in the interval is the target's).
    wait_for(&srv, 20, "the first self-scrape", || value(p, "up{job=\"strata\"}") == Some(1.0));
    assert!(value(p, "strata_build_info{job=\"strata\"}").is_some());
    let (_, cfg) = http(p, "GET", "/api/v1/status/config", &[], b"");
    assert!(cfg.contains("job_name: strata"), "{cfg}");
}

#[test]
fn http_discovery_finds_and_removes_targets() {
    let tmp = tempfile::tempdir().unwrap();
    let port = support::free_port();
    let body = std::sync::Arc::new(std::sync::Mutex::new(format!(
        r#"[{{"targets": ["127.0.0.1:{port}"], "labels": {{"env": "sd"}}}}]"#
    )));
    let url = support::http_sd_endpoint(body.clone());
    let cfg = tmp.path().join("strata.yml");
    std::fs::write(
        &cfg,
        format!("scrape_configs:\n  - job_name: viahttp\n    scrape_interval: 1s\n    http_sd_configs:\n      - url: {url}\n        refresh_interval: 1s\n    relabel_configs:\n      - source_labels: [env]\n        target_label: stage\n      - regex: env\n        action: labeldrop\n"),
    )
    .unwrap();
    let srv = Server::start_on(port, &tmp.path().join("data"), &["--config", cfg.to_str().unwrap()]);
    wait_for(&srv, 20, "the discovered target scraped", || {
        value(port, "up{job=\"viahttp\", stage=\"sd\"}") == Some(1.0)
    });
    let t = targets(port);
    let discovered = &t["activeTargets"][0]["discoveredLabels"];
    assert_eq!(discovered["__meta_url"], url.as_str(), "{t}");
    // The relabeling of that target, step by step, as Prometheus 3's API shows it.
    let q: String = form_urlencoded::byte_serialize(discovered.to_string().as_bytes()).collect();
    let (code, answer) =
        http(port, "GET", &format!("/api/v1/targets/relabel_steps?scrapePool=viahttp&labels={q}"), &[], b"");
    assert_eq!(code, 200, "{answer}");
    let steps: serde_json::Value = serde_json::from_str(&answer).unwrap();
    let steps = &steps["data"]["steps"];
    assert_eq!(steps[0]["rule"]["action"], "replace");
    assert_eq!(steps[0]["output"]["stage"], "sd");
    assert_eq!(steps[0]["output"]["env"], "sd");
    assert_eq!(steps[1]["rule"]["action"], "labeldrop");
    assert!(steps[1]["output"].get("env").is_none() && steps[1]["keep"] == true, "{steps}");
    let (code, _) = http(port, "GET", "/api/v1/targets/relabel_steps?scrapePool=nope&labels=%7B%7D", &[], b"");
    assert_eq!(code, 404);
    *body.lock().unwrap() = "[]".into();
    wait_for(&srv, 20, "the target removed", || targets(port)["activeTargets"].as_array().unwrap().is_empty());
}

#[test]
fn target_limit_stops_every_target_of_the_job_with_the_reason() {
    let one = TestTarget::start("a 1\n");
    let two = TestTarget::start("a 2\n");
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("strata.yml");
    std::fs::write(
        &config,
        format!(
            "scrape_configs:\n  - job_name: t\n    scrape_interval: 1s\n    target_limit: 1\n    static_configs:\n      - targets: ['{}', '{}']\n",
            one.addr(),
            two.addr()
        ),
    )
    .unwrap();
    let srv = Server::start(&tmp.path().join("data"), &["--config", config.to_str().unwrap()]);
    let t = targets(srv.port);
    let active = t["activeTargets"].as_array().unwrap();
    assert_eq!(active.len(), 2, "{t}");
    for x in active {
        assert_eq!(x["health"], "down");
        assert_eq!(x["lastError"], "target_limit exceeded (number of targets: 2, limit: 1)");
    }
    std::thread::sleep(Duration::from_millis(1500));
    assert!(query(srv.port, "a").is_empty(), "no target of the job is scraped");
}

/// The labels of every series a server holds for `job`, as sorted `name=value` lists.
fn series_of(port: u16, job: &str) -> Vec<Vec<String>> {
    let sel: String = form_urlencoded::byte_serialize(format!("{{job=\"{job}\"}}").as_bytes()).collect();
    let (status, body) = http(port, "GET", &format!("/api/v1/series?match[]={sel}"), &[], b"");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let mut out: Vec<Vec<String>> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let mut l: Vec<String> =
                s.as_object().unwrap().iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap())).collect();
            l.sort();
            l
        })
        .collect();
    out.sort();
    out
}

/// The same scrape configuration, with every relabel action, in Strata and in Debian's
/// Prometheus 2.42 against one target: both must store exactly the same series.
#[test]
fn relabeling_and_target_labels_match_prometheus() {
    let prometheus = which("prometheus");
    let target = TestTarget::start(concat!(
        "# TYPE drop_me_total counter\ndrop_me_total 1\n",
        "m{a=\"1\",b=\"2\"} 1\nm{a=\"3\",x_y=\"9\"} 2\n",
        "k{u=\"q\",v=\"q\"} 1\nk{u=\"q\",v=\"r\"} 2\nk 3\n",
        "c{job=\"inner\",instance=\"i\",exported_job=\"e\"} 3\n",
        "z{z=\"abc\"} 1\nlong{id=\"0123456789\"} 1\n",
        "e{a=\"e\"} 1\ne{a=\"f\"} 2\nr{extra=\"x\",keep=\"y\"} 1\n",
    ));
    let config = format!(
        concat!(
            "global:\n  scrape_interval: 1s\n",
            "scrape_configs:\n  - job_name: rl\n    static_configs:\n      - targets: ['{addr}']\n        labels: {{env: Prod, team: a, __meta_x: y}}\n",
            "    relabel_configs:\n",
            "      - source_labels: [env]\n        target_label: env_lower\n        action: lowercase\n",
            "      - source_labels: [__address__]\n        target_label: shard\n        modulus: 8\n        action: hashmod\n",
            "      - regex: team\n        action: labeldrop\n",
            "      - source_labels: [__address__]\n        regex: '(.*):(\\d+)'\n        target_label: port\n        replacement: 'p$2'\n",
            "      - source_labels: [__meta_x]\n        target_label: from_meta\n",
            "    metric_relabel_configs:\n",
            "      - source_labels: [__name__]\n        regex: 'drop_me.*'\n        action: drop\n",
            "      - source_labels: [a, b]\n        separator: '-'\n        target_label: ab\n",
            "      - regex: 'x_(.*)'\n        action: labelmap\n        replacement: 'mapped_$1'\n",
            "      - source_labels: [u]\n        target_label: v\n        action: keepequal\n",
            "      - source_labels: [z]\n        target_label: z\n        action: uppercase\n",
            "      - source_labels: [id]\n        regex: '(\\d{{3}}).*'\n        target_label: id\n",
            "      - regex: 'x_.*'\n        action: labeldrop\n",
            "      - source_labels: [__name__]\n        regex: '.+'\n        action: keep\n",
            "      - source_labels: [a]\n        target_label: __name__\n        action: dropequal\n",
            "      - regex: '__name__|job|instance|env|env_lower|shard|port|from_meta|a|b|ab|mapped_y|u|v|z|id|keep|exported_.*'\n        action: labelkeep\n",
        ),
        addr = target.addr()
    );
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("both.yml");
    std::fs::write(&cfg, &config).unwrap();
    let srv = Server::start(&tmp.path().join("strata"), &["--config", cfg.to_str().unwrap()]);
    let (_prom, prom_port) = support::start_prometheus(&prometheus, &cfg, tmp.path(), &[]);
    let scraped = |port: u16| {
        support::try_http(port, "GET", "/api/v1/query?query=up", &[], b"")
            .map(|(s, b)| s == 200 && b.contains("\"rl\""))
            .unwrap_or(false)
    };
    wait_for(&srv, 30, "both servers scraped the target", || scraped(srv.port) && scraped(prom_port));
    let ours = series_of(srv.port, "rl");
    let theirs = series_of(prom_port, "rl");
    assert_eq!(ours, theirs, "Strata's series (left) differ from Prometheus' (right)");
    // And the cases this covers are there: a hashmod shard, an exported_ label, a dropped
    // series, a keepequal drop.
    let flat = format!("{ours:?}");
    // The exposed `job` clashes with the target's, and `exported_job` is taken: it becomes
    // `exported_exported_job`.
    assert!(
        flat.contains("shard=") && flat.contains("exported_job=e") && flat.contains("exported_exported_job=inner"),
        "{flat}"
    );
    assert!(!flat.contains("drop_me") && !flat.contains("v=r") && flat.contains("z=ABC"));
    assert!(flat.contains("mapped_y=9") && flat.contains("id=012") && flat.contains("ab=1-2"), "{flat}");
    // dropequal dropped e{a="e"} (its `a` equals its name); labelkeep removed `extra`.
    assert!(
        flat.contains("a=f") && !flat.contains("a=e") && !flat.contains("extra") && flat.contains("keep=y"),
        "{flat}"
    );
    assert_eq!(ours.iter().filter(|s| s.contains(&"__name__=e".to_owned())).count(), 1, "{flat}");
}

fn openssl(dir: &std::path::Path, args: &[&str]) {
    let out = Command::new(which("openssl")).args(args).current_dir(dir).output().unwrap();
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// HTTPS scraping with `tls_config`: node_exporter serves TLS with a certificate from a test
/// CA; the job that trusts the CA (`ca_file`) and the one that skips verification scrape it,
/// the one that trusts only the system's roots is refused with the reason.
#[test]
fn tls_targets_are_verified_against_the_configured_ca() {
    let exporter = which("prometheus-node-exporter");
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    openssl(
        d,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=strata-test-ca",
        ],
    );
    openssl(
        d,
        &["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "key.pem", "-out", "req.csr", "-subj", "/CN=localhost"],
    );
    std::fs::write(d.join("ext.cnf"), "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n").unwrap();
    openssl(
        d,
        &[
            "x509",
            "-req",
            "-in",
            "req.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "cert.pem",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ],
    );
    std::fs::write(d.join("web.yml"), "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\n").unwrap();
    let ne_port = free_port();
    let _ne = KillOnDrop(
        Command::new(exporter)
            .arg(format!("--web.listen-address=127.0.0.1:{ne_port}"))
            .arg(format!("--web.config.file={}", d.join("web.yml").display()))
            .current_dir(d)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let job = |name: &str, tls: &str| {
        format!("  - job_name: {name}\n    scheme: https\n    scrape_interval: 1s\n    tls_config: {tls}\n    static_configs:\n      - targets: ['127.0.0.1:{ne_port}']\n")
    };
    std::fs::write(
        d.join("strata.yml"),
        format!(
            "scrape_configs:\n{}{}{}",
            job("ca", "{ca_file: ca.pem}"),
            job("insecure", "{insecure_skip_verify: true}"),
            job("system-roots", "{}")
        ),
    )
    .unwrap();
    let srv = Server::start(&d.join("data"), &["--config", d.join("strata.yml").to_str().unwrap()]);
    let p = srv.port;
    wait_for(&srv, 30, "all three jobs scraped", || query(p, "up").len() == 3);
    wait_for(&srv, 10, "the CA job up", || value(p, "up{job=\"ca\"}") == Some(1.0));
    assert_eq!(value(p, "up{job=\"insecure\"}"), Some(1.0));
    assert_eq!(value(p, "up{job=\"system-roots\"}"), Some(0.0));
    assert!(value(p, "count(node_cpu_seconds_total{job=\"ca\"})").unwrap() > 0.0);
    let t = targets(p);
    let bad =
        t["activeTargets"].as_array().unwrap().iter().find(|x| x["scrapePool"] == "system-roots").unwrap().clone();
    let err = bad["lastError"].as_str().unwrap();
    assert!(err.to_ascii_lowercase().contains("certificate"), "{err}");
}
