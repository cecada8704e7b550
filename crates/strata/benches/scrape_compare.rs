//! Scraping cost, Strata against Prometheus (and VictoriaMetrics' built-in scraper), in one run:
//! TARGETS targets, each serving the node-exporter recording's series, scraped every 10 s.
//!
//! `cargo build --release -p strata && cargo bench -p strata --bench scrape_compare [-- TARGETS [WARM_S [MEASURE_S]]]`
//! (defaults 1000, 60, 180).
//!
//! The targets are one HTTP server in this process listening on every loopback address:
//! target i is `127.0.x.y:PORT`, and each request to it gets the recording's next scrape in
//! the Prometheus text format (HELP and TYPE lines included, ~600 samples, no timestamps), so
//! values move as they did on the real host. Each server is started on a fresh directory with
//! the same scrape configuration, left WARM_S seconds to create its series and settle, then
//! measured for MEASURE_S: CPU seconds from /proc, samples from the requests the targets
//! served, RSS at the end and at its peak, and its own view of the targets (how many are up,
//! mean scrape duration). One server runs at a time. `SCRAPE_SERVERS=strata,prometheus`
//! (comma-separated) limits the servers.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{free_port, get, proc_status_bytes, proc_usage, start_with_config, urlencode};

const INTERVAL_S: u64 = 10;

/// A metric family of the recording: its HELP/TYPE lines, and its sample lines per timestamp.
type Family<'a> = (Vec<String>, std::collections::BTreeMap<&'a str, Vec<&'a str>>);

/// The recording as text-format bodies, one per scrape, and the samples in each.
fn bodies() -> Vec<(String, usize)> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/node-exporter-600x10s.om.gz");
    let mut text = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap()), &mut text)
        .unwrap();
    // Families in order: their HELP/TYPE lines, then each scrape's samples (the timestamp is
    // the line's last field).
    let mut families: Vec<Family> = Vec::new();
    let mut in_samples = true;
    for line in text.lines() {
        if line == "# EOF" {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            if in_samples || families.is_empty() {
                families.push((Vec::new(), Default::default()));
            }
            in_samples = false;
            // The text format has no UNIT, and calls OpenMetrics' `unknown` type `untyped`.
            if rest.starts_with("HELP") {
                families.last_mut().unwrap().0.push(line.to_owned());
            } else if rest.starts_with("TYPE") {
                families.last_mut().unwrap().0.push(line.replace(" unknown", " untyped"));
            }
            continue;
        }
        in_samples = true;
        let (sample, ts) = line.rsplit_once(' ').unwrap();
        families.last_mut().unwrap().1.entry(ts).or_default().push(sample);
    }
    let mut times: Vec<&str> = families.iter().flat_map(|f| f.1.keys().copied()).collect();
    times.sort();
    times.dedup();
    times
        .iter()
        .map(|t| {
            let mut body = String::new();
            let mut n = 0;
            for (meta, by_time) in &families {
                let Some(samples) = by_time.get(t) else { continue };
                for m in meta {
                    body.push_str(m);
                    body.push('\n');
                }
                for s in samples {
                    body.push_str(s);
                    body.push('\n');
                    n += 1;
                }
            }
            (body, n)
        })
        .collect()
}

fn target_addr(i: usize, port: u16) -> String {
    format!("127.0.{}.{}:{port}", i / 200, i % 200 + 1)
}

struct Targets {
    requests: AtomicU64,
    samples: AtomicU64,
    bodies: Vec<(axum::body::Bytes, usize)>,
    next: Vec<AtomicU64>,
}

async fn serve_target(
    axum::extract::State(t): axum::extract::State<Arc<Targets>>,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let host = headers.get("host").and_then(|h| h.to_str().ok()).unwrap_or("");
    let ip = host.split(':').next().unwrap_or("");
    let parts: Vec<usize> = ip.split('.').filter_map(|p| p.parse().ok()).collect();
    let i = if parts.len() == 4 { parts[2] * 200 + parts[3].saturating_sub(1) } else { 0 };
    let k = t.next.get(i).map_or(0, |c| c.fetch_add(1, Ordering::Relaxed)) as usize;
    let (body, n) = &t.bodies[(k + i) % t.bodies.len()];
    t.requests.fetch_add(1, Ordering::Relaxed);
    t.samples.fetch_add(*n as u64, Ordering::Relaxed);
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body.clone()).into_response()
}

/// The first value of an instant query's result.
fn instant(port: u16, q: &str) -> Option<f64> {
    let (status, body, _) = get(port, &format!("/api/v1/query?query={}", urlencode(q)));
    let v: serde_json::Value = serde_json::from_str(&body).ok().filter(|_| status == 200)?;
    v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
}

struct Row {
    name: &'static str,
    cpu_s: f64,
    samples: u64,
    scrapes: u64,
    rss: u64,
    peak: u64,
    up: Option<f64>,
    duration: Option<f64>,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let n_targets: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let warm = Duration::from_secs(args.get(1).and_then(|a| a.parse().ok()).unwrap_or(60));
    let measure = Duration::from_secs(args.get(2).and_then(|a| a.parse().ok()).unwrap_or(180));
    let only: Option<Vec<String>> =
        std::env::var("SCRAPE_SERVERS").ok().map(|s| s.split(',').map(str::to_owned).collect());

    let bodies = bodies();
    let per_body = bodies.iter().map(|b| b.1).sum::<usize>() / bodies.len();
    println!(
        "{n_targets} targets × ~{per_body} samples every {INTERVAL_S} s ({} samples/s), warm-up {warm:?}, measured {measure:?}",
        n_targets * per_body / INTERVAL_S as usize
    );
    let targets = Arc::new(Targets {
        requests: AtomicU64::new(0),
        samples: AtomicU64::new(0),
        bodies: bodies.into_iter().map(|(b, n)| (axum::body::Bytes::from(b), n)).collect(),
        next: (0..n_targets).map(|_| AtomicU64::new(0)).collect(),
    });
    let port = free_port();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    {
        let targets = targets.clone();
        rt.spawn(async move {
            let app = axum::Router::new().route("/metrics", axum::routing::get(serve_target)).with_state(targets);
            let l = tokio::net::TcpListener::bind(("0.0.0.0", port)).await.unwrap();
            axum::serve(l, app).await.unwrap();
        });
    }
    let list: Vec<String> = (0..n_targets).map(|i| format!("'{}'", target_addr(i, port))).collect();
    let config = format!(
        "global:\n  scrape_interval: {INTERVAL_S}s\n  scrape_timeout: {INTERVAL_S}s\nscrape_configs:\n  - job_name: node\n    static_configs:\n      - targets: [{}]\n",
        list.join(", ")
    );

    let tmp = tempfile::tempdir().unwrap();
    let mut rows = Vec::new();
    for name in ["strata", "prometheus", "victoria-metrics"] {
        if only.as_ref().is_some_and(|o| !o.iter().any(|x| x == name)) {
            continue;
        }
        let Some(mut peer) = start_with_config(name, &tmp.path().join(name), &config, &[]) else {
            println!("{name}: not installed, skipped");
            continue;
        };
        let pid = peer.child.id();
        println!("{name}: pid {pid}, warming up");
        std::thread::sleep(warm);
        let (cpu0, _) = proc_usage(pid);
        let (req0, smp0) = (targets.requests.load(Ordering::Relaxed), targets.samples.load(Ordering::Relaxed));
        let t0 = Instant::now();
        std::thread::sleep(measure);
        let (cpu1, peak) = proc_usage(pid);
        let (req1, smp1) = (targets.requests.load(Ordering::Relaxed), targets.samples.load(Ordering::Relaxed));
        let took = t0.elapsed().as_secs_f64();
        let row = Row {
            name,
            cpu_s: cpu1 - cpu0,
            samples: smp1 - smp0,
            scrapes: req1 - req0,
            rss: proc_status_bytes(pid, "VmRSS"),
            peak,
            up: instant(peer.port, "sum(up)"),
            duration: instant(peer.port, "avg(scrape_duration_seconds)"),
        };
        println!(
            "{name}: {:.1} CPU s over {took:.0} s, {} scrapes, {} samples, {:.2} µs CPU/sample, RSS {} MiB (peak {} MiB), up {:?}, mean scrape {:?} s",
            row.cpu_s,
            row.scrapes,
            row.samples,
            row.cpu_s * 1e6 / row.samples.max(1) as f64,
            row.rss >> 20,
            row.peak >> 20,
            row.up,
            row.duration
        );
        rows.push(row);
        let _ = peer.child.kill();
        let _ = peer.child.wait();
        std::thread::sleep(Duration::from_secs(2));
    }

    println!();
    println!("| server | CPU s | scrapes | samples | µs CPU / sample | RSS MiB (peak) | up | mean scrape s |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for r in &rows {
        println!(
            "| {} | {:.1} | {} | {} | {:.3} | {} ({}) | {} | {} |",
            r.name,
            r.cpu_s,
            r.scrapes,
            r.samples,
            r.cpu_s * 1e6 / r.samples.max(1) as f64,
            r.rss >> 20,
            r.peak >> 20,
            r.up.map_or("?".into(), |u| format!("{u}")),
            r.duration.map_or("?".into(), |d| format!("{d:.4}")),
        );
    }
    if let Some(s) = rows.iter().find(|r| r.name == "strata") {
        let per = |r: &Row| r.cpu_s / r.samples.max(1) as f64;
        for r in rows.iter().filter(|r| r.name != "strata") {
            println!("{} / strata CPU per sample: {:.2}×", r.name, per(r) / per(s));
        }
    }
}
