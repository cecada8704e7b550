//! Compatibility with real Prometheus tooling (Debian's `prometheus` package, which `.ci/run`
//! installs): a Prometheus 2.42 server scrapes itself and Strata and remote-writes everything
//! into Strata without errors; `promtool query` reads it back through Strata's query API.

mod support;

use std::process::{Command, Stdio};
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
    let log = std::fs::File::create(tmp.path().join("prometheus.log")).unwrap();
    let mut prom = Command::new(prometheus)
        .arg(format!("--config.file={}", cfg_path.display()))
        .arg(format!("--storage.tsdb.path={}", tmp.path().join("prom-data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start prometheus");

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
            let _ = prom.kill();
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

    let _ = prom.kill();
    let _ = prom.wait();
}
