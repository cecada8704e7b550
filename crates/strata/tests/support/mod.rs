//! Helpers for tests that run `strata serve`: start and stop the real binary, and a minimal
//! HTTP/1.1 client (no client library: requests are written by hand, `Connection: close`).

#![allow(dead_code, reason = "each test binary uses part of the helpers")]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The value of the sample whose series is exactly `series` (a name, with its labels as the
/// exposition writes them) in `/metrics` text; `None` when there is none.
pub fn sample_value(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

/// The path of a peer program (Debian's `prometheus`, `promtool`, `prometheus-node-exporter`,
/// `openssl`: `.ci/run` installs them); fails the test, naming it, when it is missing.
pub fn which(bin: &str) -> String {
    let out = Command::new("sh").args(["-c", &format!("command -v {bin}")]).output().unwrap();
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(!path.is_empty(), "{bin} not found: install it from Debian's packages (.ci/run does)");
    path
}

/// A loopback port free now and not handed out before by this test process: the kernel may
/// give a port it just gave again once the probe closes, and a server started with its HTTP
/// and carbon listeners on the same port refuses to start (a clean-clone CI run failed so).
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

/// A peer process, killed (and reaped) when dropped: a failing test leaves none behind.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Debian's Prometheus (`prometheus`, the path `which` found) on a free loopback port with
/// `config`, its data in `dir/prom`, its log in `dir/prometheus.log`, and `extra` flags.
pub fn start_prometheus(prometheus: &str, config: &Path, dir: &Path, extra: &[&str]) -> (KillOnDrop, u16) {
    let port = free_port();
    (start_prometheus_on(port, prometheus, config, dir, extra), port)
}

/// `start_prometheus` on `port` (for a configuration that names Prometheus' own address).
pub fn start_prometheus_on(port: u16, prometheus: &str, config: &Path, dir: &Path, extra: &[&str]) -> KillOnDrop {
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let child = Command::new(prometheus)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("prom").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .args(extra)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start prometheus");
    KillOnDrop(child)
}

pub struct Server {
    pub port: u16,
    child: Option<Child>,
    log: PathBuf,
}

impl Server {
    /// Starts `strata serve` on `data_dir` and waits until `/-/ready` answers 200.
    pub fn start(data_dir: &Path, extra: &[&str]) -> Server {
        Server::start_on(free_port(), data_dir, extra)
    }

    /// `start` on a port chosen by the caller (a configuration that names the server's own
    /// address needs it before the start).
    pub fn start_on(port: u16, data_dir: &Path, extra: &[&str]) -> Server {
        Server::spawn(port, data_dir, extra, false)
    }

    /// `start` with strata's built-in configuration (it scrapes itself).
    pub fn start_builtin_config(data_dir: &Path) -> Server {
        Server::spawn(free_port(), data_dir, &[], true)
    }

    /// `start` for a server whose web configuration (TLS, authentication) keeps a plain
    /// client out: ready when its log says so.
    pub fn start_secured(data_dir: &Path, extra: &[&str]) -> Server {
        Server::spawn_waiting(free_port(), data_dir, extra, false, |srv| {
            srv.log_text().lines().any(|l| l.contains("ready") && !l.contains("not ready"))
        })
    }

    /// `start` with every route under `prefix` (`--web.route-prefix`).
    pub fn start_under_prefix(data_dir: &Path, prefix: &str, extra: &[&str]) -> Server {
        let mut args = vec!["--web.route-prefix", prefix];
        args.extend_from_slice(extra);
        let ready = format!("{}/-/ready", prefix.trim_end_matches('/'));
        Server::spawn_waiting(free_port(), data_dir, &args, false, |srv| {
            matches!(try_http(srv.port, "GET", &ready, &[], b""), Ok((200, _)))
        })
    }

    fn spawn(port: u16, data_dir: &Path, extra: &[&str], builtin_config: bool) -> Server {
        Server::spawn_waiting(port, data_dir, extra, builtin_config, |srv| {
            matches!(try_http(srv.port, "GET", "/-/ready", &[], b""), Ok((200, _)))
        })
    }

    fn spawn_waiting(
        port: u16,
        data_dir: &Path,
        extra: &[&str],
        builtin_config: bool,
        ready: impl Fn(&Server) -> bool,
    ) -> Server {
        let log = data_dir.with_extension(format!("{port}.log"));
        let out = std::fs::File::create(&log).unwrap();
        // Without a configuration, strata scrapes itself every 15 s; tests that count series
        // must not see those, so they get an empty configuration unless they pass their own.
        let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        if !extra.contains(&"--config") && !builtin_config {
            let empty = data_dir.with_extension("empty.yml");
            std::fs::write(&empty, "").unwrap();
            args.extend(["--config".to_owned(), empty.to_str().unwrap().to_owned()]);
        }
        let child = Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--data-dir", data_dir.to_str().unwrap()])
            .args(&args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .expect("start strata serve");
        let mut srv = Server { port, child: Some(child), log };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if ready(&srv) {
                return srv;
            }
            // A server that gave up (a listener it could not bind) is reported at once, not
            // waited for.
            if let Some(status) = srv.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("server exited ({status}) before it was ready:\n{}", srv.log_text());
            }
            assert!(Instant::now() < deadline, "server not ready in 60 s:\n{}", srv.log_text());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The server's process id (for signals).
    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }

    /// SIGKILL, as a crash.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    /// SIGTERM and wait: (exit code, log).
    pub fn terminate(&mut self) -> (Option<i32>, String) {
        let mut c = self.child.take().unwrap();
        // SAFETY: sends a signal to our own child process.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let status = c.wait().unwrap();
        (status.code(), self.log_text())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The bytes of one `Connection: close` request.
fn request_bytes(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    let mut raw = req.into_bytes();
    raw.extend_from_slice(body);
    raw
}

pub fn try_http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<(u16, String)> {
    let raw = request_bytes(method, path, headers, body);
    send(port, &raw)
}

/// One request with a binary response body: (status, body bytes). Bodies here are never chunked
/// (the server sends a length for buffered responses).
pub fn http_bytes(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> (u16, Vec<u8>) {
    let raw = request_bytes(method, path, headers, body);
    let resp = exchange(port, &raw).unwrap();
    let split = resp.windows(4).position(|w| w == b"\r\n\r\n").expect("response head");
    let head = String::from_utf8_lossy(&resp[..split]);
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, resp[split + 4..].to_vec())
}

fn exchange(port: u16, raw: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    s.write_all(raw)?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp)?;
    Ok(resp)
}

fn send(port: u16, raw: &[u8]) -> std::io::Result<(u16, String)> {
    let resp = exchange(port, raw)?;
    let text = String::from_utf8_lossy(&resp).into_owned();
    let status: u16 = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let body =
        if head.to_ascii_lowercase().contains("transfer-encoding: chunked") { dechunk(body) } else { body.to_owned() };
    Ok((status, body))
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((len, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// One request; returns (status, response head, body bytes), a chunked body reassembled.
pub fn http_raw_body(port: u16, method: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String, Vec<u8>) {
    http_bytes_with_head(port, method, path, headers, b"")
}

/// A request with a body: (status, response head, body bytes, de-chunked).
pub fn http_bytes_with_head(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String, Vec<u8>) {
    let resp = exchange(port, &request_bytes(method, path, headers, body)).unwrap();
    let split = resp.windows(4).position(|w| w == b"\r\n\r\n").expect("response head");
    let head = String::from_utf8_lossy(&resp[..split]).into_owned();
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let mut rest = &resp[split + 4..];
    if !head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        return (status, head, rest.to_vec());
    }
    let mut body = Vec::new();
    loop {
        let eol = rest.windows(2).position(|w| w == b"\r\n").expect("chunk size line");
        let n = usize::from_str_radix(std::str::from_utf8(&rest[..eol]).unwrap().trim(), 16).expect("chunk size");
        if n == 0 {
            return (status, head, body);
        }
        body.extend_from_slice(&rest[eol + 2..eol + 2 + n]);
        rest = &rest[eol + 2 + n + 2..];
    }
}

/// One request; returns (status, body).
pub fn http(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> (u16, String) {
    try_http(port, method, path, headers, body).unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

/// One request; returns (status, response head, body). Bodies here are never chunked.
pub fn http_with_head(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String, String) {
    let raw = request_bytes(method, path, headers, body);
    let resp = exchange(port, &raw).unwrap();
    let text = String::from_utf8_lossy(&resp).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, head.to_owned(), rest.to_owned())
}

/// Sends raw bytes (for malformed or slow requests).
pub fn http_raw(port: u16, raw: &[u8]) -> (u16, String) {
    send(port, raw).unwrap()
}

pub fn snappy(data: &[u8]) -> Vec<u8> {
    snap::raw::Encoder::new().compress_vec(data).unwrap()
}

/// A series to write: label pairs and `(timestamp ms, value)` samples.
pub type TestSeries<'a> = (Vec<(&'a str, String)>, Vec<(i64, f64)>);

/// A snappy-compressed remote-write body.
pub fn remote_write_body(series: &[TestSeries<'_>]) -> Vec<u8> {
    use strata_server::remote::{Label, Sample, TimeSeries, WriteRequest};
    let req = WriteRequest {
        timeseries: series
            .iter()
            .map(|(l, s)| TimeSeries {
                labels: l.iter().map(|(n, v)| Label::new(*n, v.clone())).collect(),
                samples: s.iter().map(|&(t, v)| Sample { value: v, timestamp: t }).collect(),
                histograms: vec![],
                exemplars: vec![],
            })
            .collect(),
        metadata: vec![],
    };
    strata_server::remote::encode(&req)
}

/// A protobuf WriteRequest whose label value is not UTF-8.
pub fn raw_utf8_violation() -> Vec<u8> {
    // timeseries { labels { name: "a" value: "\xff" } }
    vec![0x0a, 0x08, 0x0a, 0x06, 0x0a, 0x01, b'a', 0x12, 0x01, 0xff]
}

/// A stand-in HTTP service discovery endpoint: answers every request with the current body.
pub fn http_sd_endpoint(body: std::sync::Arc<std::sync::Mutex<String>>) -> String {
    format!("http://{}/sd", serve_body("application/json", body))
}

/// A target that serves `body` as `content_type` (an exposition), at the returned `host:port`.
pub fn fixed_target(content_type: &'static str, body: &str) -> String {
    serve_body(content_type, std::sync::Arc::new(std::sync::Mutex::new(body.to_owned())))
}

/// An HTTP/1.1 server answering every request with the current `body`: its `host:port`.
fn serve_body(content_type: &'static str, body: std::sync::Arc<std::sync::Mutex<String>>) -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                match conn.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(k) => got.extend_from_slice(&buf[..k]),
                }
            }
            let b = body.lock().unwrap().clone();
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}",
                b.len()
            );
        }
    });
    addr
}
