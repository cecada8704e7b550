//! Remote-write ingestion, Strata against Prometheus and VictoriaMetrics, in one run.
//!
//! `cargo bench -p strata --bench ingest_compare [-- INSTANCES [CONNECTIONS] [minutes=M]
//! [churn=PCT/MIN]]` (defaults 100, 4, the whole 100-minute recording, no churn).
//! `minutes=M` keeps the recording's first M minutes; `churn=60/15` replaces 60% of the
//! instances every 15 minutes (new `instance` values, as pods replaced by a rollout), so the
//! head holds many more series than are alive at once.
//! Pre-encodes remote-write requests (2,000 samples each, snappy) from the node-exporter
//! recording replicated to INSTANCES `instance` values, re-stamped to end now, in scrape order.
//! Then, for each server found on the PATH (`strata` from this build, Debian's `prometheus`
//! with `--web.enable-remote-write-receiver`, Debian's `victoria-metrics`), starts it on a
//! fresh data directory, sends every request over CONNECTIONS keep-alive connections, and
//! reports samples/s, server CPU seconds per million samples (from /proc), peak RSS and the
//! bytes per sample of its data directory right after ingest (and, for Strata, of everything
//! written to its write-ahead log: the directory's size depends on when the log was last
//! truncated).
//! With `INGEST_TARGET_PORT=N` it only sends to a server already listening there (profiling).

use std::io::Write;
use std::net::TcpStream;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

use common::{proc_usage, read_recording, read_response, start};
use strata_server::remote::{encode, Label, Sample, TimeSeries, WriteRequest};

const SAMPLES_PER_REQUEST: usize = 2_000;

/// Requests per connection (series are sharded over connections, as Prometheus' remote-write
/// shards do, so each series' samples arrive in order), and the sample count.
fn build_requests(instances: usize, shards: usize, shape: Shape) -> (Vec<Vec<Vec<u8>>>, usize) {
    // Samples grouped by timestamp (a scrape), as a scraper would send them.
    let mut by_time = read_recording();
    let first = by_time[0].0;
    if let Some(m) = shape.minutes {
        by_time.retain(|(t, _)| *t < first + m as i64 * 60_000);
    }
    let last = by_time.last().unwrap().0;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let shift = now - 60_000 - last;
    let mut requests: Vec<Vec<Vec<u8>>> = vec![Vec::new(); shards];
    let mut batches: Vec<Vec<TimeSeries>> = vec![Vec::new(); shards];
    let mut total = 0;
    for (t, samples) in &by_time {
        for i in 0..instances {
            let instance = match shape.churn {
                // The first PCT% of the instances are replaced each period.
                Some((pct, minutes)) if i * 100 < instances * pct => {
                    let generation = (t - first) / (minutes as i64 * 60_000);
                    format!("host-{i:05}-{generation}:9100")
                }
                _ => format!("host-{i:05}:9100"),
            };
            for (pairs, v) in samples {
                // By series, so each series' samples stay in one ordered stream.
                let shard = {
                    use std::hash::{Hash, Hasher};
                    let mut h = std::collections::hash_map::DefaultHasher::new();
                    (i, pairs).hash(&mut h);
                    (h.finish() % shards as u64) as usize
                };
                let batch = &mut batches[shard];
                let mut labels: Vec<Label> = pairs.iter().map(|(n, v)| Label::new(n.clone(), v.clone())).collect();
                labels.push(Label::new("instance", instance.clone()));
                labels.push(Label::new("job", "node"));
                labels.sort_by(|a, b| a.name.cmp(&b.name));
                batch.push(TimeSeries {
                    labels,
                    samples: vec![Sample { value: *v, timestamp: t + shift }],
                    histograms: vec![],
                    exemplars: vec![],
                });
                total += 1;
                if batch.len() == SAMPLES_PER_REQUEST {
                    requests[shard].push(encode(&WriteRequest { timeseries: std::mem::take(batch), metadata: vec![] }));
                }
            }
        }
    }
    for (shard, batch) in batches.into_iter().enumerate() {
        if !batch.is_empty() {
            requests[shard].push(encode(&WriteRequest { timeseries: batch, metadata: vec![] }));
        }
    }
    (requests, total)
}

fn send_all(port: u16, path: &str, requests: &Arc<Vec<Vec<Vec<u8>>>>) -> Duration {
    let t0 = Instant::now();
    let workers: Vec<_> = (0..requests.len())
        .map(|shard| {
            let (requests, path) = (requests.clone(), path.to_owned());
            std::thread::spawn(move || {
                let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
                stream.set_nodelay(true).unwrap();
                let mut w = stream.try_clone().unwrap();
                let mut r = std::io::BufReader::new(stream);
                for (i, body) in requests[shard].iter().enumerate() {
                    let head = format!(
                        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Encoding: snappy\r\n\
                         Content-Type: application/x-protobuf\r\nX-Prometheus-Remote-Write-Version: 0.1.0\r\n\
                         Content-Length: {}\r\n\r\n",
                        body.len()
                    );
                    w.write_all(head.as_bytes()).unwrap();
                    w.write_all(body).unwrap();
                    let (status, resp) = read_response(&mut r).unwrap();
                    assert!(status / 100 == 2, "request {i}: HTTP {status}: {}", String::from_utf8_lossy(&resp));
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    t0.elapsed()
}

/// Which part of the recording is sent, and how instances churn.
#[derive(Clone, Copy, Default)]
struct Shape {
    minutes: Option<usize>,
    /// (percent of instances replaced, every so many minutes).
    churn: Option<(usize, usize)>,
}

fn main() {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<usize> = raw.iter().filter_map(|a| a.parse().ok()).collect();
    let instances = args.first().copied().unwrap_or(100);
    let connections = args.get(1).copied().unwrap_or(4);
    let mut shape = Shape::default();
    for a in &raw {
        if let Some(m) = a.strip_prefix("minutes=") {
            shape.minutes = Some(m.parse().expect("minutes=M"));
        } else if let Some(c) = a.strip_prefix("churn=") {
            let (pct, every) = c.split_once('/').expect("churn=PCT/MIN");
            shape.churn = Some((pct.parse().expect("PCT"), every.parse().expect("MIN")));
        }
    }
    // The strata binary this bench drives must exist and be current.
    let built = Command::new(env!("CARGO"))
        .args(["build", "--release", "-p", "strata", "--bin", "strata"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .unwrap();
    assert!(built.success());
    let t0 = Instant::now();
    let (requests, samples) = build_requests(instances, connections.max(1), shape);
    let bytes: usize = requests.iter().flatten().map(Vec::len).sum();
    println!(
        "{instances} instances: {samples} samples in {} requests ({bytes} bytes snappy), built in {:.1?}; {connections} connections",
        requests.iter().map(Vec::len).sum::<usize>(),
        t0.elapsed()
    );
    let requests = Arc::new(requests);
    // Profiling aid: send to a server already running (e.g. under `perf record`) and stop.
    if let Some(port) = std::env::var("INGEST_TARGET_PORT").ok().and_then(|p| p.parse().ok()) {
        let took = send_all(port, "/api/v1/write", &requests);
        println!("sent to :{port} in {took:.2?}: {:.0} samples/s", samples as f64 / took.as_secs_f64());
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    println!(
        "{:<18} {:>12} {:>14} {:>16} {:>12} {:>14}",
        "server", "seconds", "samples/s", "CPU s/M samples", "peak RSS MiB", "disk B/sample"
    );
    for name in ["strata", "prometheus", "victoria-metrics"] {
        let Some(mut peer) = start(name, &tmp.path().join(name), &[]) else {
            println!("{name:<18} not found on the PATH; skipped");
            continue;
        };
        let (cpu0, _) = proc_usage(peer.child.id());
        let took = send_all(peer.port, peer.write_path, &requests);
        let (cpu1, rss) = proc_usage(peer.child.id());
        // The data directory right after ingest (what a crash would leave to replay):
        // VictoriaMetrics flushed first (it buffers up to a second), then a second for the
        // others' page cache to reach their files' sizes.
        if name == "victoria-metrics" {
            common::get(peer.port, "/internal/force_flush");
        }
        std::thread::sleep(Duration::from_secs(1));
        let disk = common::dir_bytes(&tmp.path().join(name));
        // What the directory holds right after ingest depends on when the log last rolled and
        // was truncated; Strata's bytes written to its log are the log's density itself.
        let log_written = (name == "strata").then(|| common::counter(peer.port, "strata_tsdb_wal_bytes_written_total"));
        println!(
            "{:<18} {:>12.2} {:>14.0} {:>16.2} {:>12.0} {:>14.2}",
            peer.name,
            took.as_secs_f64(),
            samples as f64 / took.as_secs_f64(),
            (cpu1 - cpu0) / (samples as f64 / 1e6),
            rss as f64 / (1 << 20) as f64,
            disk as f64 / samples as f64
        );
        if let Some(b) = log_written {
            println!("{:<18} write-ahead log written: {:.2} B/sample", "", b / samples as f64);
        }
        let _ = peer.child.kill();
        let _ = peer.child.wait();
    }
}
