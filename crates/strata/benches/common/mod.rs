//! Helpers shared by the benchmarks that run Strata beside Prometheus and VictoriaMetrics:
//! starting each server on a fresh directory, waiting for it, reading its CPU and memory,
//! and a minimal HTTP/1.1 client.

#![allow(dead_code)]

use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use strata_server::textparse::{Entry, Format, Parser};

const RECORDING: &str = "../../testdata/node-exporter-600x10s.om.gz";

/// One sample of a scrape: label pairs and value.
pub type Scraped = (Vec<(String, String)>, f64);
/// A scrape of the recording: timestamp and samples.
pub type Scrape = (i64, Vec<Scraped>);

/// The node-exporter recording as scrapes in time order.
pub fn read_recording() -> Vec<Scrape> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(RECORDING);
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap()).read_to_string(&mut text).unwrap();
    let mut by_time: std::collections::BTreeMap<i64, Vec<Scraped>> = Default::default();
    for e in Parser::new(&text, Format::OpenMetrics) {
        if let Entry::Sample { labels, value, timestamp_ms: Some(t) } = e.unwrap() {
            let pairs = labels.iter().map(|l| (l.name.to_string(), l.value.to_string())).collect();
            by_time.entry(t).or_default().push((pairs, value));
        }
    }
    by_time.into_iter().collect()
}

/// A loopback port free now and not handed out before by this process (the kernel may give a
/// port it just gave again once the probe closes: a server's two listeners on one port).
pub fn free_port() -> u16 {
    static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        if HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner()).insert(port) {
            return port;
        }
    }
}

/// Reads one HTTP/1.1 response (status, body) from a keep-alive connection.
pub fn read_response(r: &mut std::io::BufReader<TcpStream>) -> std::io::Result<(u16, Vec<u8>)> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status: u16 = line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let mut len = 0usize;
    loop {
        line.clear();
        r.read_line(&mut line)?;
        if line == "\r\n" || line.is_empty() {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body)?;
    Ok((status, body))
}

pub fn urlencode(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// One GET; returns (status, body, wall time). The time ends when the last byte of the body
/// has arrived: it is the server's (and the loopback's), not the client's. The body is read
/// into a buffer this thread keeps from one call to the next, through a 64 KiB reader, and
/// copied into the returned string after the clock stops. Timed before that copy, with a
/// fresh vector grown per answer, a 24 MB answer cost the client about as long as the server
/// took to write it (faults of fresh pages, UTF-8 checks, 8 KiB reads), the same for every
/// server compared, which shrank each ratio towards 1.
pub fn get(port: u16, path: &str) -> (u16, String, Duration) {
    thread_local! {
        static BODY: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    BODY.with_borrow_mut(|body| {
        let t0 = Instant::now();
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").as_bytes()).unwrap();
        let mut r = std::io::BufReader::with_capacity(64 << 10, s);
        let status = read_response_into(&mut r, body);
        let took = t0.elapsed();
        (status, String::from_utf8_lossy(body).into_owned(), took)
    })
}

/// `get` asking for gzip, as Grafana does: the body as it came (compressed when the server
/// compressed it), timed to its last byte (the client's decompression is not the server's).
#[allow(dead_code, reason = "used by some of the benches that share this module")]
pub fn get_gzip(port: u16, path: &str) -> (u16, Vec<u8>, Duration) {
    let t0 = Instant::now();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes()).unwrap();
    let mut r = std::io::BufReader::with_capacity(64 << 10, s);
    let mut body = Vec::new();
    let status = read_response_into(&mut r, &mut body);
    (status, body, t0.elapsed())
}

/// Reads a response that may be chunked (Prometheus, VictoriaMetrics) or sized.
pub fn read_chunked_or_plain(r: &mut std::io::BufReader<TcpStream>) -> (u16, String) {
    let mut body = Vec::new();
    let status = read_response_into(r, &mut body);
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// `read_chunked_or_plain` into `body` (cleared first, its capacity kept): a latency loop
/// reusing one buffer times the server, not the client's allocation of each answer.
pub fn read_response_into(r: &mut std::io::BufReader<TcpStream>, body: &mut Vec<u8>) -> u16 {
    body.clear();
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status: u16 = line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let mut chunked = false;
    let mut len: Option<usize> = None;
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        if line == "\r\n" || line.is_empty() {
            break;
        }
        let l = line.to_ascii_lowercase();
        if l.starts_with("transfer-encoding:") && l.contains("chunked") {
            chunked = true;
        }
        if let Some(v) = l.strip_prefix("content-length:") {
            len = v.trim().parse().ok();
        }
    }
    if chunked {
        loop {
            line.clear();
            r.read_line(&mut line).unwrap();
            let size = usize::from_str_radix(line.trim(), 16).unwrap_or(0);
            if size == 0 {
                // The empty line after the last chunk.
                line.clear();
                r.read_line(&mut line).unwrap();
                break;
            }
            let at = body.len();
            body.resize(at + size, 0);
            r.read_exact(&mut body[at..]).unwrap();
            let mut crlf = [0u8; 2];
            r.read_exact(&mut crlf).unwrap();
        }
    } else if let Some(n) = len {
        body.resize(n, 0);
        r.read_exact(body).unwrap();
    } else {
        r.read_to_end(body).unwrap();
    }
    status
}

/// (CPU seconds, peak RSS bytes) of a process, from /proc.
pub fn proc_usage(pid: u32) -> (f64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit_once(')').map(|(_, r)| r.split_whitespace().collect()).unwrap_or_default();
    let ticks = 100.0; // USER_HZ on Linux
    let cpu = fields.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
        + fields.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (cpu / ticks, proc_status_bytes(pid, "VmHWM"))
}

/// A size field of /proc/PID/status (`VmRSS`, `VmHWM`), in bytes.
pub fn proc_status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.strip_prefix(field).is_some_and(|r| r.starts_with(':')))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

pub fn wait_ready(port: u16, path: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
            let _ = s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes());
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            if out.starts_with("HTTP/1.1 200") {
                return;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("server on {port} not ready");
}

pub struct Peer {
    pub name: &'static str,
    pub child: Child,
    pub port: u16,
    pub write_path: &'static str,
}

/// Starts a server by name on a fresh directory under `dir`, with `extra` arguments, and waits
/// until it is ready; `None` when its binary is not installed. Strata and Prometheus get a
/// configuration that scrapes nothing.
pub fn start(name: &'static str, dir: &Path, extra: &[String]) -> Option<Peer> {
    start_with_config(name, dir, "global:\n  scrape_interval: 1m\n", extra)
}

/// `start`, with `config` as Strata's `--config` or Prometheus' `--config.file` (the two read
/// the same `global` and `scrape_configs` sections).
pub fn start_with_config(name: &'static str, dir: &Path, config: &str, extra: &[String]) -> Option<Peer> {
    let port = free_port();
    std::fs::create_dir_all(dir).unwrap();
    let cfg = dir.join("config.yml");
    std::fs::write(&cfg, config).unwrap();
    let (cmd, args, ready, write_path): (String, Vec<String>, &str, &str) = match name {
        // `strata-baseline`: another build of Strata (`STRATA_BASELINE_BIN`), for A/B runs.
        "strata" | "strata-baseline" => (
            if name == "strata" {
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/release/strata").display().to_string()
            } else {
                std::env::var("STRATA_BASELINE_BIN").ok()?
            },
            vec![
                "serve".into(),
                "--listen".into(),
                format!("127.0.0.1:{port}"),
                "--data-dir".into(),
                dir.join("data").display().to_string(),
                "--config".into(),
                cfg.display().to_string(),
            ],
            "/-/ready",
            "/api/v1/write",
        ),
        "prometheus" => (
            "prometheus".into(),
            vec![
                format!("--config.file={}", cfg.display()),
                format!("--storage.tsdb.path={}", dir.join("data").display()),
                format!("--web.listen-address=127.0.0.1:{port}"),
                "--web.enable-remote-write-receiver".into(),
            ],
            "/-/ready",
            "/api/v1/write",
        ),
        "victoria-metrics" => {
            let mut args = vec![
                format!("-storageDataPath={}", dir.join("data").display()),
                format!("-httpListenAddr=127.0.0.1:{port}"),
            ];
            if config.contains("scrape_configs") {
                args.push(format!("-promscrape.config={}", cfg.display()));
            }
            ("victoria-metrics".into(), args, "/health", "/api/v1/write")
        }
        _ => unreachable!(),
    };
    let child = Command::new(&cmd).args(&args).args(extra).stdout(Stdio::null()).stderr(Stdio::null()).spawn().ok()?;
    wait_ready(port, ready);
    Some(Peer { name, child, port, write_path })
}

/// Waits until a server's background work after a load (head compaction, merges) has settled:
/// at least 75 s (Strata and Prometheus look for head compaction once a minute), then until it
/// uses less than 2% of a core over 5 s, or at most `max`.
pub fn wait_idle(pid: u32, max: Duration) {
    let deadline = Instant::now() + max;
    std::thread::sleep(Duration::from_secs(75));
    let mut last = proc_usage(pid).0;
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_secs(5));
        let now = proc_usage(pid).0;
        if now - last < 0.1 {
            return;
        }
        last = now;
    }
}

/// The 100 metrics of a host in the Graphite benchmarks' path trees: cpu per core, memory,
/// load, network per interface, disk per device, uptime.
pub fn host_metrics() -> Vec<String> {
    let mut m = Vec::new();
    for cpu in 0..8 {
        for k in ["user", "system", "idle", "iowait"] {
            m.push(format!("cpu.cpu{cpu}.{k}"));
        }
    }
    for k in ["free", "used", "cached", "buffers"] {
        m.push(format!("mem.{k}"));
    }
    for k in ["1", "5", "15"] {
        m.push(format!("load.{k}"));
    }
    for eth in 0..4 {
        for k in ["rx_bytes", "tx_bytes", "rx_packets", "tx_packets", "rx_errors"] {
            m.push(format!("net.eth{eth}.{k}"));
        }
    }
    for dev in ["sda", "sdb", "sdc", "sdd", "sde", "sdf", "sdg", "sdh"] {
        for k in ["reads", "writes", "read_bytes", "write_bytes", "io_time"] {
            m.push(format!("disk.{dev}.{k}"));
        }
    }
    m.push("uptime".into());
    assert_eq!(m.len(), 100);
    m
}

/// Two hours in milliseconds: the head's and the import's block range.
const BACKFILL_RANGE_MS: i64 = 2 * 3_600_000;

/// A data directory to backfill with rollup `tiers`: raw data kept forever, no background
/// compaction (the loader compacts as it goes, as the server would).
pub fn backfill_db(
    dir: &Path,
    tiers: Vec<strata_tsdb::rollup::RollupTier>,
    rollup_filter: Option<strata_tsdb::rollup::SeriesFilter>,
) -> strata_tsdb::Db {
    backfill_db_retaining(dir, tiers, rollup_filter, 0)
}

/// `backfill_db` keeping raw data for `retention_ms` (0: forever): compaction then caps raw
/// block ranges at a tenth of it and deletes raw blocks past it once their rollups exist, as
/// a server started with `--retention` does.
pub fn backfill_db_retaining(
    dir: &Path,
    tiers: Vec<strata_tsdb::rollup::RollupTier>,
    rollup_filter: Option<strata_tsdb::rollup::SeriesFilter>,
    retention_ms: i64,
) -> strata_tsdb::Db {
    let opts = strata_tsdb::DbOptions {
        compact_interval: None,
        retention_ms,
        rollups: tiers,
        rollup_filter,
        head: strata_tsdb::head::HeadOptions { chunk_range_ms: BACKFILL_RANGE_MS, ..Default::default() },
        ..strata_tsdb::DbOptions::default()
    };
    strata_tsdb::Db::open(dir, opts).unwrap()
}

/// An in-memory head to append a slice of backfill to, then hand to `Db::import_head` (what
/// `strata tsdb import` does).
pub fn backfill_head() -> strata_tsdb::head::Head {
    strata_tsdb::head::Head::in_memory(strata_tsdb::head::HeadOptions {
        chunk_range_ms: BACKFILL_RANGE_MS,
        backfill: true,
        ..Default::default()
    })
}

/// Bytes of the files under `dir`, recursively.
pub fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .flatten()
            .map(|e| match e.file_type() {
                Ok(t) if t.is_dir() => dir_bytes(&e.path()),
                Ok(_) => e.metadata().map_or(0, |m| m.len()),
                Err(_) => 0,
            })
            .sum()
    })
}

/// The middle of `xs` (the upper one of an even count).
pub fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// The sum of the samples of a metric family in a server's `/metrics` whose line starts with
/// `prefix`.
pub fn counter(port: u16, prefix: &str) -> f64 {
    let (_, body, _) = get(port, "/metrics");
    body.lines().filter(|l| l.starts_with(prefix)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
}
