//! Graphite side by side, in one run: Strata, Debian's VictoriaMetrics (`-graphiteListenAddr`)
//! and Debian's carbon-cache (whisper files, read through Debian's graphite-web).
//!
//! `cargo bench -p strata --bench carbon_compare [-- --paths N --points P --connections C
//! --servers strata,victoria-metrics,carbon-cache --deadline SECONDS]` (defaults 20000, 60, 4,
//! all three, 600). The paths are a host tree, `servers.dc<D>.host-<NNNNN>.<metric>` with 100
//! metrics per host (cpu per core, memory, load, network per interface, disk per device) over 5
//! data centres; P points each, 10 s apart and ending now, with timestamps jittered by up to
//! ±1 s as real senders' clocks are; the paths sharded over C connections (each path's points
//! on one connection, in order, as a relay sends them). For each server found, on a fresh data
//! directory:
//!
//! - **ingest**: every line sent as fast as the connections take it; points/s until every point
//!   is stored (Strata and VictoriaMetrics count them in `/metrics`; carbon-cache until its
//!   CPU falls idle with every path's file created), server CPU seconds per million points,
//!   peak RSS;
//! - **disk**: bytes on disk per point, as written (Strata: WAL; VictoriaMetrics: after
//!   `/internal/force_flush`; carbon-cache: its whisper files, preallocated for the schema
//!   `10s:1d`), and for Strata once compacted (a snapshot, which writes the head as a block);
//! - **find**: (Strata: once new paths are folded into its names dictionary, the time that
//!   took reported) median and p90 over HTTP keep-alive of `/metrics/find` for an exact path,
//!   `servers.dc2.*.load.1`, `*.*.*.net.eth0.rx_bytes` and `servers.*.host-00042.{cpu,mem}.*`
//!   in the `treejson` format (Grafana's: the glob as written, an entry per distinct name) and
//!   the `completer` format (every node, of the glob with the `*` graphite-web appends);
//!   graphite-web over whisper for carbon-cache, served by Python's wsgiref, a connection per
//!   request as it speaks HTTP/1.0;
//! - **render**: `/render?format=json` of a 108-path glob over the last hour (VictoriaMetrics'
//!   open-source build has no `/render`).
//! - with `--render-day`: before the ingest (and not counted in it), those 108 paths get a day
//!   of points 10 s apart up to where the ingest's points begin, and the render stage renders
//!   the glob over the last 24 hours alone and through `sumSeries`, `groupByNode(..., 2,
//!   'sum')`, `summarize(..., '1h', 'max')` and `highestCurrent(..., 10)` (Graphite's issue's
//!   benchmark; graphite-web over whisper is the peer).
//!
//! With `--hold SECONDS`, each server is kept running that long after its measurements, its
//! pid and HTTP port printed (to profile it, or to query it by hand).
//! With `CARBON_SNAPSHOT_TO=DIR` set, Strata's compacted snapshot is copied to `DIR` (to read
//! with `strata tsdb analyze`).
//!
//! Heavy: not a test. Run the two shapes of the Graphite issue: `-- --paths 20000 --points 60`
//! and `-- --paths 1000000 --points 10 --servers strata,victoria-metrics` (carbon-cache creates
//! whisper files at a few thousand per second: an hour for a million).

use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{free_port, get, proc_usage, read_chunked_or_plain, read_response_into, urlencode, wait_ready};

const FINDS: [&str; 4] = [
    "servers.dc3.host-00042.cpu.cpu3.user",
    "servers.dc2.*.load.1",
    "*.*.*.net.eth0.rx_bytes",
    "servers.*.host-00042.{cpu,mem}.*",
];

/// 9 hosts x 6 cores x 2 = 108 paths (every shape has hosts 0 to 8).
const RENDER: &str = "servers.dc0.host-0000[0-8].cpu.cpu[0-5].{user,system}";

/// The paths `RENDER` names.
fn render_paths() -> Vec<String> {
    let mut out = Vec::new();
    for h in 0..9 {
        for c in 0..6 {
            for m in ["user", "system"] {
                out.push(format!("servers.dc0.host-{h:05}.cpu.cpu{c}.{m}"));
            }
        }
    }
    out
}

/// With `--render-day`: the functions rendered over the day of `RENDER`'s paths.
const RENDER_FUNCTIONS: [&str; 5] = [
    RENDER,
    "sumSeries(servers.dc0.host-0000[0-8].cpu.cpu[0-5].{user,system})",
    "groupByNode(servers.dc0.host-0000[0-8].cpu.cpu[0-5].{user,system}, 2, 'sum')",
    "summarize(servers.dc0.host-0000[0-8].cpu.cpu[0-5].{user,system}, '1h', 'max')",
    "highestCurrent(servers.dc0.host-0000[0-8].cpu.cpu[0-5].{user,system}, 10)",
];

/// A day of `RENDER`'s paths, 10 s apart, ending before `end`; one buffer.
fn render_day_lines(end: i64) -> Vec<u8> {
    let mut out = Vec::new();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let steps = 8640;
    for i in 0..steps {
        let t = end - 10 * (steps - i) as i64;
        for (p, name) in render_paths().iter().enumerate() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // A daily wave per path with noise: CPU seconds.
            let v = 50.0
                + 40.0 * ((t as f64 / 86_400.0 + p as f64 / 108.0) * std::f64::consts::TAU).sin()
                + (x % 1000) as f64 / 100.0;
            out.extend_from_slice(format!("{name} {v:.2} {t}\n").as_bytes());
        }
    }
    out
}

const SCHEMAS: &str = "[default]\npattern = .*\nretentions = 10s:1d\n";

/// `n` paths, host by host, each host in every data centre.
fn paths(n: usize) -> Vec<String> {
    let metrics = common::host_metrics();
    let mut out = Vec::with_capacity(n);
    'all: for h in 0.. {
        for dc in 0..5 {
            for m in &metrics {
                if out.len() == n {
                    break 'all;
                }
                out.push(format!("servers.dc{dc}.host-{h:05}.{m}"));
            }
        }
    }
    out
}

/// The lines, one buffer per connection.
fn build_lines(paths: &[String], points: usize, connections: usize, now: i64) -> Vec<Vec<u8>> {
    let mut out = vec![Vec::new(); connections];
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    for i in 0..points {
        let base = now - 10 * (points - i) as i64;
        for (p, name) in paths.iter().enumerate() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Up to a second either way, as senders' clocks and schedules drift; whole seconds,
            // as carbon senders send them.
            let t = base + (x % 3) as i64 - 1;
            let v = match p % 3 {
                0 => ((p * 7 + i * 13) % 1000) as f64 / 10.0,
                1 => (p * 1000 + i * (p % 17)) as f64,
                _ => (x % 100) as f64,
            };
            let _ = writeln!(out[p % connections], "{name} {v} {t}");
        }
    }
    out
}

struct Server {
    name: &'static str,
    child: Child,
    /// graphite-web, for carbon-cache.
    web: Option<Child>,
    http: u16,
    carbon: u16,
    data: std::path::PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        for c in [Some(&mut self.child), self.web.as_mut()].into_iter().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn which(cmd: &str) -> Option<String> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| format!("{d}/{cmd}")).find(|p| Path::new(p).is_file())
}

fn spawn(cmd: &str, args: &[String], dir: &Path) -> Option<Child> {
    Command::new(cmd)
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("stderr.log")).ok()?)
        .spawn()
        .ok()
}

fn start(name: &'static str, dir: &Path) -> Option<Server> {
    let (http, carbon) = (free_port(), free_port());
    std::fs::create_dir_all(dir).unwrap();
    match name {
        "strata" => {
            let bin = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/release/strata");
            let cfg = dir.join("config.yml");
            std::fs::write(&cfg, "").unwrap();
            let schemas = dir.join("storage-schemas.conf");
            std::fs::write(&schemas, SCHEMAS).unwrap();
            let data = dir.join("data");
            let args: Vec<String> = [
                "serve",
                "--listen",
                &format!("127.0.0.1:{http}"),
                "--data-dir",
                &data.display().to_string(),
                "--config",
                &cfg.display().to_string(),
                "--carbon.plaintext-listen-address",
                &format!("127.0.0.1:{carbon}"),
                "--graphite.storage-schemas",
                &schemas.display().to_string(),
                "--web.enable-admin-api",
            ]
            .map(String::from)
            .into();
            let child = spawn(&bin.display().to_string(), &args, dir)?;
            wait_ready(http, "/-/ready");
            Some(Server { name, child, web: None, http, carbon, data })
        }
        "victoria-metrics" => {
            let data = dir.join("data");
            let args = vec![
                format!("-storageDataPath={}", data.display()),
                format!("-httpListenAddr=127.0.0.1:{http}"),
                format!("-graphiteListenAddr=127.0.0.1:{carbon}"),
            ];
            let child = spawn(&which("victoria-metrics")?, &args, dir)?;
            wait_ready(http, "/health");
            Some(Server { name, child, web: None, http, carbon, data })
        }
        "carbon-cache" => {
            let bin = which("carbon-cache")?;
            let (pickle, query) = (free_port(), free_port());
            for sub in ["whisper", "log", "run", "lists", "web"] {
                std::fs::create_dir_all(dir.join(sub)).unwrap();
            }
            std::fs::write(dir.join("storage-schemas.conf"), SCHEMAS).unwrap();
            let d = dir.display();
            let conf = format!(
                "[cache]\nSTORAGE_DIR = {d}\nLOCAL_DATA_DIR = {d}/whisper\nWHITELISTS_DIR = {d}/lists\nCONF_DIR = {d}\n\
                 LOG_DIR = {d}/log\nPID_DIR = {d}/run\nENABLE_LOGROTATION = False\nUSER =\nMAX_CACHE_SIZE = inf\n\
                 MAX_UPDATES_PER_SECOND = inf\nMAX_CREATES_PER_MINUTE = inf\n\
                 LINE_RECEIVER_INTERFACE = 127.0.0.1\nLINE_RECEIVER_PORT = {carbon}\nENABLE_UDP_LISTENER = False\n\
                 PICKLE_RECEIVER_INTERFACE = 127.0.0.1\nPICKLE_RECEIVER_PORT = {pickle}\n\
                 CACHE_QUERY_INTERFACE = 127.0.0.1\nCACHE_QUERY_PORT = {query}\nLOG_UPDATES = False\n\
                 LOG_CREATES = False\n"
            );
            std::fs::write(dir.join("carbon.conf"), conf).unwrap();
            let args: Vec<String> =
                ["--config", &format!("{d}/carbon.conf"), "--nodaemon", "--pidfile", &format!("{d}/run/pid"), "start"]
                    .map(String::from)
                    .into();
            let child = spawn(&bin, &args, dir)?;
            let deadline = Instant::now() + Duration::from_secs(30);
            while TcpStream::connect(("127.0.0.1", carbon)).is_err() {
                assert!(Instant::now() < deadline, "carbon-cache did not listen on {carbon}");
                std::thread::sleep(Duration::from_millis(100));
            }
            // graphite-web over the whisper files and carbon-cache's cache, over HTTP.
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/graphite_web.py");
            let web = Command::new("/usr/bin/python3")
                .arg(script)
                .env("GW_DIR", dir.join("web"))
                .env("GW_WHISPER", dir.join("whisper"))
                .env("GW_CARBONLINK", format!("127.0.0.1:{query}"))
                .env("GW_SERVE", http.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(dir.join("web.log")).ok()?)
                .spawn()
                .ok();
            let mut srv = Server { name, child, web, http, carbon, data: dir.join("whisper") };
            if srv.web.is_some() {
                let deadline = Instant::now() + Duration::from_secs(60);
                while TcpStream::connect(("127.0.0.1", http)).is_err() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(200));
                }
            } else {
                srv.web = None;
            }
            Some(srv)
        }
        _ => panic!("unknown server {name}"),
    }
}

/// Files under `dir` (recursively) and their bytes.
fn files_and_bytes(dir: &Path) -> (u64, u64) {
    let mut out = (0, 0);
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(meta) = e.metadata() else { continue };
        if meta.is_dir() {
            let (f, b) = files_and_bytes(&e.path());
            out = (out.0 + f, out.1 + b);
        } else {
            out = (out.0 + 1, out.1 + meta.len());
        }
    }
    out
}

/// Waits until `srv` has stored `total` points; false at the deadline.
fn wait_stored(srv: &Server, total: f64, paths: u64, deadline: Instant) -> bool {
    let pid = srv.child.id();
    let mut last_cpu = (proc_usage(pid).0, Instant::now());
    while Instant::now() < deadline {
        match srv.name {
            "strata" => {
                if common::counter(srv.http, "strata_carbon_points_stored_total{protocol=\"plaintext_tcp\"}") >= total {
                    return true;
                }
            }
            "victoria-metrics" => {
                if common::counter(srv.http, "vm_rows_inserted_total{type=\"graphite\"}") >= total {
                    return true;
                }
            }
            _ => {
                // carbon-cache reports its writes only into its own whisper files: done once
                // every path has its file and the process has been idle for a second.
                let cpu = proc_usage(pid).0;
                if cpu > last_cpu.0 + 0.02 {
                    last_cpu = (cpu, Instant::now());
                } else if last_cpu.1.elapsed() > Duration::from_secs(1) && files_and_bytes(&srv.data).0 >= paths {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Median and p90 of `n` GETs of `path`, and the last body: over one keep-alive connection, or
/// (`keep_alive` false, for an HTTP/1.0 server) a connection each.
fn latency(port: u16, path: &str, n: usize, keep_alive: bool) -> Option<(Duration, Duration, String)> {
    let connect = || -> Option<(TcpStream, BufReader<TcpStream>)> {
        let s = TcpStream::connect(("127.0.0.1", port)).ok()?;
        s.set_nodelay(true).ok()?;
        let r = BufReader::new(s.try_clone().ok()?);
        Some((s, r))
    };
    let mut conn = connect()?;
    let mut times = Vec::with_capacity(n);
    let mut body = Vec::new();
    for i in 0..n {
        let t = Instant::now();
        if !keep_alive && i > 0 {
            conn = connect()?;
        }
        let close = if keep_alive { "" } else { "Connection: close\r\n" };
        conn.0.write_all(format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{close}\r\n").as_bytes()).ok()?;
        let status = read_response_into(&mut conn.1, &mut body);
        times.push(t.elapsed());
        if status != 200 {
            eprintln!("GET {path}: {status} {}", String::from_utf8_lossy(&body).chars().take(300).collect::<String>());
            return None;
        }
    }
    times.sort();
    Some((times[n / 2], times[n * 9 / 10], String::from_utf8_lossy(&body).into_owned()))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let n_paths: usize = arg("--paths").map_or(20_000, |s| s.parse().unwrap());
    let points: usize = arg("--points").map_or(60, |s| s.parse().unwrap());
    let connections: usize = arg("--connections").map_or(4, |s| s.parse().unwrap());
    let deadline_s: u64 = arg("--deadline").map_or(600, |s| s.parse().unwrap());
    let render_day = args.iter().any(|a| a == "--render-day");
    let hold_s: Option<u64> = arg("--hold").map(|s| s.parse().unwrap());
    let servers: Vec<String> = arg("--servers")
        .unwrap_or_else(|| "strata,victoria-metrics,carbon-cache".into())
        .split(',')
        .map(String::from)
        .collect();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let paths = paths(n_paths);
    let lines = build_lines(&paths, points, connections, now);
    drop(paths);
    let total = (n_paths * points) as f64;
    let bytes: usize = lines.iter().map(Vec::len).sum();
    println!(
        "{n_paths} paths x {points} points = {total} points ({:.1} MB of lines) over {connections} connections",
        bytes as f64 / 1e6
    );
    for name in &servers {
        let name: &'static str = match name.as_str() {
            "strata" => "strata",
            "victoria-metrics" => "victoria-metrics",
            "carbon-cache" => "carbon-cache",
            other => panic!("unknown server {other}"),
        };
        let dir = tempfile::tempdir().unwrap();
        let Some(srv) = start(name, dir.path()) else {
            println!("{name}: not installed");
            continue;
        };
        let pid = srv.child.id();
        // The day of the rendered paths, first: older than every ingested point.
        let day_points = if render_day {
            let day = render_day_lines(now - 10 * points as i64 - 10);
            let mut s = TcpStream::connect(("127.0.0.1", srv.carbon)).unwrap();
            for chunk in day.chunks(64 * 1024) {
                s.write_all(chunk).unwrap();
            }
            drop(s);
            let day_points = (108 * 8640) as f64;
            if !wait_stored(&srv, day_points, 108, Instant::now() + Duration::from_secs(deadline_s)) {
                println!("{name}: the day of the rendered paths was not stored within {deadline_s} s");
            }
            day_points
        } else {
            0.0
        };
        let (cpu0, _) = proc_usage(pid);
        let t0 = Instant::now();
        let senders: Vec<_> = lines
            .iter()
            .cloned()
            .map(|text| {
                let port = srv.carbon;
                std::thread::spawn(move || {
                    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
                    for chunk in text.chunks(64 * 1024) {
                        s.write_all(chunk).unwrap();
                    }
                })
            })
            .collect();
        for s in senders {
            s.join().unwrap();
        }
        let done = wait_stored(&srv, day_points + total, n_paths as u64, t0 + Duration::from_secs(deadline_s));
        let wall = t0.elapsed().as_secs_f64();
        let (cpu1, rss) = proc_usage(pid);
        let mut report = format!("{name}\n");
        if done {
            report += &format!(
                "  ingest   {:>10.0} points/s  {wall:>7.2} s  {:>6.3} CPU-s per 1M points  peak RSS {:.0} MiB\n",
                total / wall,
                (cpu1 - cpu0) / (total / 1e6),
                rss as f64 / 1048576.0
            );
        } else {
            report += &format!("  ingest   not all points stored within {deadline_s} s\n");
        }
        // Where the head's memory goes (its own estimate, by part), to read beside the RSS.
        if name == "strata" {
            let parts = ["series", "chunks", "chunk_index", "symbols", "postings", "names"].map(|part| {
                let mib = common::counter(srv.http, &format!("strata_tsdb_head_memory_bytes{{part=\"{part}\"}}"));
                format!("{part} {:.0}", mib / 1048576.0)
            });
            report += &format!("  head     MiB by part: {}\n", parts.join(", "));
        }
        // Disk, as written.
        if name == "victoria-metrics" {
            let _ = get(srv.http, "/internal/force_flush");
            std::thread::sleep(Duration::from_secs(3));
        }
        let (_, written) = files_and_bytes(&srv.data);
        report += &format!("  disk     {:>10.2} bytes/point as written ({written} bytes)\n", written as f64 / total);
        if name == "strata" {
            let (status, body, _) = http_post(srv.http, "/api/v1/admin/tsdb/snapshot");
            if status == 200 {
                let snap = body.split("\"name\":\"").nth(1).and_then(|s| s.split('"').next()).unwrap_or("");
                let snapshot = srv.data.join("snapshots").join(snap);
                let (_, compacted) = files_and_bytes(&snapshot);
                // `CARBON_SNAPSHOT_TO=DIR` keeps the compacted block (e.g. for `strata tsdb analyze`).
                if let Some(to) = std::env::var_os("CARBON_SNAPSHOT_TO") {
                    let status = Command::new("cp").arg("-r").arg(&snapshot).arg(&to).status();
                    assert!(status.is_ok_and(|s| s.success()), "copying the snapshot to {to:?}");
                }
                report += &format!(
                    "  disk     {:>10.2} bytes/point compacted (a snapshot: the head as a block, {compacted} bytes)\n",
                    compacted as f64 / total
                );
            }
        }
        // Strata folds new paths into sorted lists (levels) in the background, once a second,
        // and once they stop coming, merges the lists into its main names dictionary; until
        // then finds also read the new names one by one, then the lists. Measured once it has,
        // as VictoriaMetrics' once it has flushed; both times are reported.
        if name == "strata" {
            let started = Instant::now();
            let mut folded = None;
            while started.elapsed() < Duration::from_secs(60) {
                let delta = common::counter(srv.http, "strata_tsdb_head_names_delta");
                if delta < 4096.0 && folded.is_none() {
                    folded = Some(started.elapsed());
                }
                if delta < 4096.0 && common::counter(srv.http, "strata_tsdb_head_names_dictionaries") == 1.0 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            report += &format!(
                "  names    folded into levels {:.1} s and into one dictionary {:.1} s after the ingest (and snapshot)\n",
                folded.unwrap_or(started.elapsed()).as_secs_f64(),
                started.elapsed().as_secs_f64()
            );
        }
        // Finds and the render, over HTTP.
        if name != "carbon-cache" || srv.web.is_some() {
            let (reps, keep_alive) = if name == "carbon-cache" { (20, false) } else { (200, true) };
            // treejson (Grafana's) searches the glob as written and answers one entry per
            // distinct name; completer answers every node, for the glob graphite-web makes of
            // the query (a `*` appended: `load.1` also finds `load.15`).
            for (format, entry) in [("treejson", "\"id\""), ("completer", "\"path\"")] {
                for q in FINDS {
                    match latency(
                        srv.http,
                        &format!("/metrics/find?format={format}&query={}", urlencode(q)),
                        reps,
                        keep_alive,
                    ) {
                        Some((p50, p90, body)) => {
                            report += &format!(
                            "  find     {q:<40} {format:<9} p50 {:>8.3} ms  p90 {:>8.3} ms  ({} entries, {} bytes)\n",
                            ms(p50),
                            ms(p90),
                            body.matches(entry).count(),
                            body.len()
                        )
                        }
                        None => report += &format!("  find     {q:<40} {format:<9} failed\n"),
                    }
                }
            }
            let (targets, from): (&[&str], &str) =
                if render_day { (&RENDER_FUNCTIONS, "-24h") } else { (&[RENDER], "-1h") };
            for target in targets {
                let render = format!("/render?format=json&from={from}&until=now&target={}", urlencode(target));
                match latency(srv.http, &render, (reps / 4).max(5), keep_alive) {
                    Some((p50, p90, body)) => {
                        report += &format!(
                        "  render   {target:<40} from {from}  p50 {:>8.3} ms  p90 {:>8.3} ms  ({} series, {} points)\n",
                        ms(p50),
                        ms(p90),
                        body.matches("\"target\"").count(),
                        body.matches("], [").count() + body.matches("\"target\"").count()
                    )
                    }
                    // VictoriaMetrics serves /render only in its enterprise build.
                    None => report += &format!("  render   {target:<40} not served\n"),
                }
            }
        }
        print!("{report}");
        if let Some(hold) = hold_s {
            println!("  holding {name} (pid {pid}, HTTP port {}) for {hold} s", srv.http);
            std::thread::sleep(Duration::from_secs(hold));
        }
        drop(srv);
    }
}

/// One POST without a body; (status, body, wall time).
fn http_post(port: u16, path: &str) -> (u16, String, Duration) {
    let t0 = Instant::now();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(
        format!("POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .unwrap();
    let mut r = BufReader::new(s);
    let (status, body) = read_chunked_or_plain(&mut r);
    (status, body, t0.elapsed())
}
