//! Carbon plaintext ingestion, Strata against VictoriaMetrics (`-graphiteListenAddr`), in one
//! run.
//!
//! `cargo bench -p strata --bench carbon_compare [-- PATHS [POINTS [CONNECTIONS]]]` (defaults
//! 20000, 60, 4). Pre-builds the lines: PATHS paths (`servers.dcN.host-NNNNN.metric`), POINTS
//! points each 10 s apart ending now, in time order, the paths sharded over CONNECTIONS
//! connections (each path's points on one connection, in order, as a relay sends them). Then,
//! for each server found (`strata` from this build's `target/release`, Debian's
//! `victoria-metrics`), starts it on a fresh data directory, sends every line as fast as the
//! connections take them, and reports points/s until every point is stored (counted by the
//! server's own `/metrics`), server CPU seconds per million points and peak RSS.
//!
//! Debian's carbon-cache is not driven yet: it needs a configuration tree of its own and
//! reports its writes only through its own metrics; that is the next addition here.

use std::io::Write;
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{free_port, get, proc_usage, wait_ready};

const METRICS: [&str; 10] = [
    "cpu.user",
    "cpu.system",
    "cpu.idle",
    "mem.used",
    "mem.free",
    "load.1",
    "load.5",
    "disk.read",
    "disk.write",
    "net.rx",
];

fn build_lines(paths: usize, points: usize, connections: usize) -> Vec<Vec<u8>> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let names: Vec<String> = (0..paths)
        .map(|p| format!("servers.dc{}.host-{:05}.{}", p % 4, p / METRICS.len(), METRICS[p % METRICS.len()]))
        .collect();
    let mut out = vec![Vec::new(); connections];
    for i in 0..points {
        let t = now - 10 * (points - i) as i64;
        for (p, name) in names.iter().enumerate() {
            let v = ((p * 7 + i * 13) % 1000) as f64 / 10.0;
            let _ = writeln!(out[p % connections], "{name} {v} {t}");
        }
    }
    out
}

/// The sum of the samples of a metric family in a server's `/metrics` whose line starts with
/// `prefix`.
fn counter(port: u16, prefix: &str) -> f64 {
    let (_, body, _) = get(port, "/metrics");
    body.lines().filter(|l| l.starts_with(prefix)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
}

struct Server {
    name: &'static str,
    child: std::process::Child,
    http: u16,
    carbon: u16,
    /// The `/metrics` line prefix that counts stored points.
    stored: &'static str,
}

fn start(name: &'static str, dir: &std::path::Path) -> Option<Server> {
    let (http, carbon) = (free_port(), free_port());
    std::fs::create_dir_all(dir).unwrap();
    let (cmd, args, ready, stored): (String, Vec<String>, &str, &str) = match name {
        "strata" => {
            let cfg = dir.join("config.yml");
            std::fs::write(&cfg, "").unwrap();
            (
                std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../../target/release/strata")
                    .display()
                    .to_string(),
                vec![
                    "serve".into(),
                    "--listen".into(),
                    format!("127.0.0.1:{http}"),
                    "--data-dir".into(),
                    dir.join("data").display().to_string(),
                    "--config".into(),
                    cfg.display().to_string(),
                    "--carbon.plaintext-listen-address".into(),
                    format!("127.0.0.1:{carbon}"),
                ],
                "/-/ready",
                "strata_carbon_points_stored_total{protocol=\"plaintext_tcp\"}",
            )
        }
        "victoria-metrics" => (
            "victoria-metrics".into(),
            vec![
                format!("-storageDataPath={}", dir.join("data").display()),
                format!("-httpListenAddr=127.0.0.1:{http}"),
                format!("-graphiteListenAddr=127.0.0.1:{carbon}"),
            ],
            "/health",
            "vm_rows_inserted_total{type=\"graphite\"}",
        ),
        _ => unreachable!(),
    };
    let child = Command::new(&cmd).args(&args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().ok()?;
    wait_ready(http, ready);
    Some(Server { name, child, http, carbon, stored })
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let paths = args.first().copied().unwrap_or(20_000);
    let points = args.get(1).copied().unwrap_or(60);
    let connections = args.get(2).copied().unwrap_or(4);
    let lines = build_lines(paths, points, connections);
    let total = (paths * points) as f64;
    let bytes: usize = lines.iter().map(Vec::len).sum();
    println!(
        "{paths} paths x {points} points = {total} points ({:.1} MB of lines) over {connections} connections",
        bytes as f64 / 1e6
    );
    println!("{:<18} {:>12} {:>12} {:>14} {:>10}", "server", "points/s", "wall s", "CPU-s/1M pts", "peak RSS");
    for name in ["strata", "victoria-metrics"] {
        let dir = tempfile::tempdir().unwrap();
        let Some(mut srv) = start(name, dir.path()) else {
            println!("{name:<18} not installed");
            continue;
        };
        let pid = srv.child.id();
        let (cpu0, _) = proc_usage(pid);
        let t0 = Instant::now();
        let senders: Vec<_> = lines
            .iter()
            .cloned()
            .map(|text| {
                let port = srv.carbon;
                std::thread::spawn(move || {
                    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
                    s.set_nodelay(true).unwrap();
                    for chunk in text.chunks(64 * 1024) {
                        s.write_all(chunk).unwrap();
                    }
                })
            })
            .collect();
        for s in senders {
            s.join().unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(600);
        let mut stored = 0.0;
        while Instant::now() < deadline {
            stored = counter(srv.http, srv.stored);
            if stored >= total {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let wall = t0.elapsed().as_secs_f64();
        let (cpu1, rss) = proc_usage(pid);
        if stored < total {
            println!("{:<18} stored only {stored} of {total} points in {wall:.1} s", srv.name);
        } else {
            println!(
                "{:<18} {:>12.0} {:>12.2} {:>14.3} {:>9.0}M",
                srv.name,
                total / wall,
                wall,
                (cpu1 - cpu0) / (total / 1e6),
                rss as f64 / 1048576.0
            );
        }
        let _ = srv.child.kill();
        let _ = srv.child.wait();
    }
}
