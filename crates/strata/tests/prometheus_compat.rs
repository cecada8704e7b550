//! Compatibility with real Prometheus tooling (Debian's `prometheus` package, which `.ci/run`
//! installs): a Prometheus 2.42 server scrapes itself and Strata and remote-writes everything
//! into Strata without errors; `promtool query` reads it back through Strata's query API.

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use support::{free_port, http, try_http, which, Server};

/// Value of an instant query against any Prometheus-compatible API, summed over the result.
fn instant_sum(port: u16, q: &str) -> Option<f64> {
    let (status, body) = try_http(port, "GET", &format!("/api/v1/query?query={q}"), &[], b"").ok()?;
    if status != 200 {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    let result = v["data"]["result"].as_array()?;
    if result.is_empty() {
        return None;
    }
    Some(result.iter().filter_map(|r| r["value"][1].as_str()?.parse::<f64>().ok()).sum())
}

#[test]
fn prometheus_remote_writes_into_strata_and_promtool_reads_it_back() {
    let prometheus = which("prometheus");
    let promtool = which("promtool");
    let tmp = tempfile::tempdir().unwrap();
    let strata = Server::start(&tmp.path().join("strata"), &[]);
    let prom_port = free_port();
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
         scrape_configs:\n\
         \x20 - job_name: prometheus\n    static_configs:\n      - targets: ['127.0.0.1:{prom_port}']\n\
         \x20 - job_name: strata\n    static_configs:\n      - targets: ['127.0.0.1:{}']\n\
         remote_write:\n  - url: http://127.0.0.1:{}/api/v1/write\n    queue_config:\n      batch_send_deadline: 1s\n",
        strata.port, strata.port
    );
    let cfg_path = tmp.path().join("prometheus.yml");
    std::fs::write(&cfg_path, config).unwrap();
    let prom = support::start_prometheus_on(prom_port, &prometheus, &cfg_path, tmp.path(), &[]);

    // Wait until both scrape jobs' `up` arrived in Strata through remote write, with a few
    // samples each, and Prometheus has sent a good number of samples.
    let deadline = Instant::now() + Duration::from_secs(90);
    let sent = loop {
        let up = instant_sum(strata.port, "up");
        let sent = instant_sum(prom_port, "prometheus_remote_storage_samples_total").unwrap_or(0.0);
        let samples_in_strata =
            http(strata.port, "GET", "/api/v1/query?query=up[30s]", &[], b"").1.matches("\"1\"]").count() >= 6;
        if up == Some(2.0) && sent > 500.0 && samples_in_strata {
            break sent;
        }
        if Instant::now() > deadline {
            drop(prom);
            let plog = std::fs::read_to_string(tmp.path().join("prometheus.log")).unwrap_or_default();
            panic!(
                "no data from Prometheus in 90 s (up={up:?}, sent={sent})\nprometheus log:\n{plog}\nstrata log:\n{}",
                strata.log_text()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    // Nothing failed or was dropped on Prometheus' side.
    let failed =
        instant_sum(prom_port, "prometheus_remote_storage_samples_failed_total").expect("Prometheus reports failures");
    let dropped =
        instant_sum(prom_port, "prometheus_remote_storage_samples_dropped_total").expect("Prometheus reports drops");
    assert_eq!((failed, dropped), (0.0, 0.0), "after {sent} samples sent");
    // Strata's own metrics, scraped by Prometheus, parsed and stored.
    assert!(instant_sum(strata.port, "strata_tsdb_head_series").is_some_and(|n| n > 100.0));

    // promtool talks to Strata as to a Prometheus.
    let url = format!("http://127.0.0.1:{}", strata.port);
    let out = Command::new(&promtool).args(["query", "instant", &url, "up{job=\"prometheus\"}"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "promtool query instant: {}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains(&format!("up{{instance=\"127.0.0.1:{prom_port}\", job=\"prometheus\"}} => 1 @[")), "{text}");
    let out = Command::new(&promtool).args(["query", "series", &url, "--match=up"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "promtool query series: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(text.lines().filter(|l| l.contains("__name__=\"up\"")).count(), 2, "{text}");
    let out = Command::new(&promtool).args(["query", "labels", &url, "job"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("prometheus") && text.contains("strata"), "{text}");
    drop(prom);
}

/// A counter from Prometheus' own `/metrics`, summed over its series (0 when absent).
fn own_metric(port: u16, name: &str) -> f64 {
    let Ok((200, text)) = try_http(port, "GET", "/metrics", &[], b"") else { return 0.0 };
    text.lines()
        .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with(['{', ' '])))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn openssl(dir: &std::path::Path, args: &[&str]) {
    let out = Command::new(which("openssl")).args(args).current_dir(dir).output().unwrap();
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// With `--web.config.file` (TLS and basic auth, Prometheus' own format, which promtool's
/// `check web-config` accepts): a real Prometheus scrapes Strata's `/metrics` over HTTPS with
/// credentials and remote-writes into it the same way, nothing failing, and promtool queries
/// it; a client without credentials gets 401, and a plain-HTTP one no answer.
#[test]
fn prometheus_scrapes_and_remote_writes_over_tls_with_basic_auth() {
    let prometheus = which("prometheus");
    let promtool = which("promtool");
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
    openssl(d, &["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "key.pem", "-out", "req.csr", "-subj", "/CN=x"]);
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
    let hash = bcrypt::hash("s3cret", 4).unwrap();
    let web = d.join("web.yml");
    std::fs::write(
        &web,
        format!(
            "tls_server_config:\n  cert_file: cert.pem\n  key_file: key.pem\nbasic_auth_users:\n  writer: {hash}\n"
        ),
    )
    .unwrap();
    let out = Command::new(&promtool).args(["check", "web-config", web.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "promtool check web-config: {}", String::from_utf8_lossy(&out.stderr));

    let strata = Server::start_secured(&d.join("strata"), &["--web.config.file", web.to_str().unwrap()]);
    let prom_port = free_port();
    let auth = "    basic_auth: {username: writer, password: s3cret}\n    tls_config: {ca_file: ca.pem}\n";
    let config = format!(
        "global:\n  scrape_interval: 1s\n\
         scrape_configs:\n\
         \x20 - job_name: strata\n    scheme: https\n{auth}    static_configs:\n      - targets: ['127.0.0.1:{}']\n\
         remote_write:\n  - url: https://127.0.0.1:{}/api/v1/write\n{auth}    queue_config:\n      batch_send_deadline: 1s\n",
        strata.port, strata.port
    );
    std::fs::write(d.join("prometheus.yml"), config).unwrap();
    // The configuration's relative paths (`ca.pem`) are read from its directory.
    let prom = support::start_prometheus_on(prom_port, &prometheus, &d.join("prometheus.yml"), d, &[]);

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let ca = reqwest::Certificate::from_pem(&std::fs::read(d.join("ca.pem")).unwrap()).unwrap();
    let client = reqwest::Client::builder().add_root_certificate(ca).build().unwrap();
    let get = |path: &str, user: Option<(&str, &str)>| -> (u16, String) {
        rt.block_on(async {
            let mut r = client.get(format!("https://127.0.0.1:{}{path}", strata.port));
            if let Some((u, p)) = user {
                r = r.basic_auth(u, Some(p));
            }
            let resp = r.send().await.unwrap();
            (resp.status().as_u16(), resp.text().await.unwrap())
        })
    };
    let writer = Some(("writer", "s3cret"));
    // `up` for the strata job, 1, in Strata: Prometheus scraped it over HTTPS with credentials
    // and remote-wrote the result the same way.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let (status, body) = get("/api/v1/query?query=up%7Bjob%3D%22strata%22%7D", writer);
        assert_eq!(status, 200, "{body}");
        let sent = own_metric(prom_port, "prometheus_remote_storage_samples_total");
        if body.contains("\"1\"]") && sent > 100.0 {
            break;
        }
        if Instant::now() > deadline {
            drop(prom);
            let plog = std::fs::read_to_string(d.join("prometheus.log")).unwrap_or_default();
            panic!("no data over TLS in 90 s: {body}\nprometheus log:\n{plog}\nstrata log:\n{}", strata.log_text());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(own_metric(prom_port, "prometheus_remote_storage_samples_failed_total"), 0.0);
    assert_eq!(own_metric(prom_port, "prometheus_remote_storage_samples_dropped_total"), 0.0);
    assert_eq!(get("/api/v1/query?query=up", None).0, 401);
    assert_eq!(get("/metrics", Some(("writer", "wrong"))).0, 401);
    assert!(try_http(strata.port, "GET", "/-/ready", &[], b"").map_or(true, |(s, _)| s != 200));
    // promtool reads over the same TLS with the same credentials (2.42 has no
    // --http.config.file: the CA goes through Go's SSL_CERT_FILE, the credentials in the URL).
    let promtool_query = |url: &str| {
        Command::new(&promtool)
            .env("SSL_CERT_FILE", d.join("ca.pem"))
            .args(["query", "instant", url, "up{job=\"strata\"}"])
            .output()
            .unwrap()
    };
    let out = promtool_query(&format!("https://writer:s3cret@127.0.0.1:{}", strata.port));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("=> 1"),
        "promtool over TLS: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = promtool_query(&format!("https://127.0.0.1:{}", strata.port));
    assert!(!out.status.success(), "promtool without credentials was answered");
    drop(prom);
}

/// `/api/v1/format_query` of every query in Prometheus' PromQL test files that Prometheus 2.42
/// accepts: Strata's text equals Prometheus', byte for byte (one deliberate difference, kept
/// out: Prometheus drops a label-less `ignoring () group_x ()`, changing the query).
#[test]
fn format_query_writes_what_prometheus_writes() {
    let tmp = tempfile::tempdir().unwrap();
    let strata = Server::start(&tmp.path().join("strata"), &[]);
    let prom_port = free_port();
    std::fs::write(tmp.path().join("prometheus.yml"), "global: {}\n").unwrap();
    let prom = support::start_prometheus_on(
        prom_port,
        &which("prometheus"),
        &tmp.path().join("prometheus.yml"),
        tmp.path(),
        &[],
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while !matches!(try_http(prom_port, "GET", "/-/ready", &[], b""), Ok((200, _))) {
        assert!(Instant::now() < deadline, "prometheus not ready");
        std::thread::sleep(Duration::from_millis(100));
    }
    let format = |port: u16, q: &str| -> (u16, serde_json::Value) {
        let body: String = form_urlencoded::Serializer::new(String::new()).append_pair("query", q).finish();
        let (status, text) = http(
            port,
            "POST",
            "/api/v1/format_query",
            &[("Content-Type", "application/x-www-form-urlencoded")],
            body.as_bytes(),
        );
        (status, serde_json::from_str(&text).unwrap_or_else(|_| panic!("{q}: {text}")))
    };
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/promql");
    let mut queries = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for line in text.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            let skip = match words.as_slice() {
                [e, "instant", "at", ..] if e.starts_with("eval") => 4,
                [e, "range", "from", _, "to", _, "step", ..] if e.starts_with("eval") => 8,
                _ => continue,
            };
            queries.insert(words[skip..].join(" "));
        }
    }
    // Long enough to be split over lines, and numbers around Go's exponent switch.
    queries.insert(
        "topk(5, -(histogram_quantile(0.9, sum by (le) (rate(http_request_duration_seconds_bucket{job=\"apiserver\",verb!=\"WATCH\"}[5m])))))".into(),
    );
    queries.insert("100000 + 123456.7 + 1e6 + 1234567 + 0.0001 + 0.00001 + 1.5e300 + -2.5e-300".into());
    let (mut same, mut refused, mut kept_grouping) = (0, 0, 0);
    for q in &queries {
        let (prom_status, prom_answer) = format(prom_port, q);
        if prom_status != 200 {
            refused += 1;
            continue;
        }
        let (status, answer) = format(strata.port, q);
        assert_eq!(status, 200, "{q}: Prometheus formats it as {prom_answer}, Strata answers {answer}");
        let want = prom_answer["data"].as_str().unwrap();
        let got = answer["data"].as_str().unwrap();
        if got != want && q.contains("group_") && !want.contains("group_") {
            kept_grouping += 1;
            continue;
        }
        assert_eq!(got, want, "{q}");
        same += 1;
    }
    println!(
        "{same} queries formatted alike, {kept_grouping} with a label-less grouping Prometheus drops, {refused} refused by Prometheus 2.42"
    );
    assert!(same > 1000, "{same} queries formatted alike, {refused} refused by Prometheus 2.42");
    drop(prom);
}

/// Prometheus 2.42 with Strata as its `remote_read` storage (and nothing of its own) answers
/// range queries exactly as Strata does: its remote read client decodes what `/api/v1/read`
/// sends. (2.42's client asks for samples; the streamed response is checked in `serve.rs`.)
#[test]
fn prometheus_reads_strata_by_remote_read() {
    let prometheus = which("prometheus");
    let tmp = tempfile::tempdir().unwrap();
    let strata = Server::start(&tmp.path().join("strata"), &[]);
    // Two hours of a counter and a gauge, 15 s apart with jitter, in three series.
    let end = support::now_ms() / 1000 * 1000 - 60_000;
    let start = end - 2 * 3_600_000;
    let mut text = String::from("# TYPE requests_total counter\n# TYPE temperature gauge\n");
    for k in 0..480i64 {
        let t = start + k * 15_000 + (k * 7919 % 400);
        for (code, rate) in [("200", 5), ("500", 1)] {
            text += &format!("requests_total{{code=\"{code}\",job=\"api\"}} {} {t}\n", k * rate + (k / 200) * 3);
        }
        text += &format!("temperature{{room=\"lab\"}} {} {t}\n", 20.0 + (k as f64 / 30.0).sin());
    }
    let (status, body) = http(strata.port, "POST", "/api/v1/import/prometheus", &[], text.as_bytes());
    assert_eq!(status, 204, "{body}");
    let config =
        format!("remote_read:\n  - url: http://127.0.0.1:{}/api/v1/read\n    read_recent: true\n", strata.port);
    let cfg = tmp.path().join("prometheus.yml");
    std::fs::write(&cfg, config).unwrap();
    let (prom, prom_port) = support::start_prometheus(&prometheus, &cfg, tmp.path(), &[]);
    let range = |port: u16, q: &str| -> Option<serde_json::Value> {
        let path = format!(
            "/api/v1/query_range?query={}&start={}&end={}&step=60",
            form_urlencoded::byte_serialize(q.as_bytes()).collect::<String>(),
            // 7 s off the samples' 15 s grid: no range boundary falls on a sample, where
            // Prometheus 2.42 (closed on the left) and 3 (open, as Strata) differ.
            start / 1000 + 607,
            end / 1000
        );
        let (status, body) = try_http(port, "GET", &path, &[], b"").ok()?;
        (status == 200).then(|| {
            let mut v: serde_json::Value = serde_json::from_str(&body).unwrap();
            let mut r = v["data"]["result"].as_array().unwrap().clone();
            r.sort_by_key(|s| s["metric"].to_string());
            v["data"]["result"] = serde_json::Value::Array(r);
            v["data"].clone()
        })
    };
    let queries = [
        "requests_total",
        "sum by (code) (rate(requests_total[5m]))",
        "increase(requests_total{code=\"500\"}[10m])",
        "max_over_time(temperature[7m])",
        "temperature - on() group_left sum(requests_total) * 0",
    ];
    let deadline = Instant::now() + Duration::from_secs(30);
    while range(prom_port, "temperature").is_none_or(|d| d["result"].as_array().unwrap().is_empty()) {
        assert!(Instant::now() < deadline, "Prometheus never answered from remote read");
        std::thread::sleep(Duration::from_millis(250));
    }
    for q in queries {
        let (ours, theirs) = (range(strata.port, q).unwrap(), range(prom_port, q).unwrap());
        assert!(!ours["result"].as_array().unwrap().is_empty(), "{q}: empty");
        assert_eq!(ours, theirs, "{q}: Strata (left), Prometheus reading Strata (right)");
    }
    drop(prom);
}
