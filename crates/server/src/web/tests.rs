//! The listener over real sockets: timeouts, the connection limit, oversized heads, TLS with
//! client certificates, basic authentication, and graceful shutdown.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing::get;
use axum::Router;

use super::*;

struct Running {
    addr: SocketAddr,
    stats: Arc<ConnectionStats>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: Option<std::thread::JoinHandle<()>>,
}

impl Running {
    fn stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(d) = self.done.take() {
            d.join().unwrap();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A listener on its own runtime thread, serving `/` and `/slow` (a response after 300 ms).
fn start(limits: ConnectionLimits, web: Option<Arc<WebConfigFile>>) -> Running {
    let stats = Arc::new(ConnectionStats::default());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let st = stats.clone();
    let done = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async move {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            addr_tx.send(listener.local_addr().unwrap()).unwrap();
            let mut app = Router::new().route("/", get(|| async { "hello\n" })).route(
                "/slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    "slow\n"
                }),
            );
            if let Some(w) = &web {
                let auth = auth::Authenticator::new(w.clone());
                app = app.layer(axum::middleware::from_fn_with_state(auth, auth::authenticate));
            }
            serve(listener, app, limits, web, st, async move {
                let _ = stop_rx.await;
            })
            .await
            .unwrap();
        });
    });
    Running { addr: addr_rx.recv().unwrap(), stats, stop: Some(stop_tx), done: Some(done) }
}

fn limits(timeout_ms: u64, max_connections: usize) -> ConnectionLimits {
    ConnectionLimits {
        max_connections,
        read_header_timeout: Duration::from_millis(timeout_ms),
        ..ConnectionLimits::default()
    }
}

/// Sends `request` and reads until the server closes or 10 s pass.
fn exchange(addr: SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether the server closes `s` within 10 s (reads return 0 or an error).
fn closed_by_server(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {
                return false
            }
            Err(_) => return true,
        }
    }
}

#[test]
fn a_request_is_served_and_the_socket_has_no_delay() {
    let srv = start(limits(5_000, 8), None);
    let out = exchange(srv.addr, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    assert!(out.starts_with("HTTP/1.1 200") && out.ends_with("hello\n"), "{out}");
    assert_eq!(srv.stats.accepted.load(Ordering::Relaxed), 1);
}

#[test]
fn a_half_sent_header_is_closed_at_the_header_timeout() {
    let srv = start(limits(300, 8), None);
    let mut s = TcpStream::connect(srv.addr).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ").unwrap();
    let t0 = Instant::now();
    assert!(closed_by_server(&mut s), "a stalled header must not hold the connection");
    // Not a timing assertion: only that the limit, not the 10 s read timeout, closed it.
    assert!(t0.elapsed() < Duration::from_secs(9));
    // A fresh connection is served meanwhile.
    let out = exchange(srv.addr, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
}

#[test]
fn an_idle_keep_alive_connection_is_closed() {
    let srv = start(limits(300, 8), None);
    let mut s = TcpStream::connect(srv.addr).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut buf = [0u8; 256];
    let n = s.read(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    assert!(closed_by_server(&mut s), "an idle keep-alive connection must be closed");
}

#[test]
fn a_response_slower_than_the_header_timeout_is_still_delivered() {
    // The header timeout covers waiting for a request, not the handler's work.
    let srv = start(limits(100, 8), None);
    let out = exchange(srv.addr, b"GET /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    assert!(out.ends_with("slow\n"), "{out}");
}

#[test]
fn an_oversized_header_is_refused_with_431() {
    let srv = start(ConnectionLimits { max_header_bytes: 16 * 1024, ..limits(5_000, 8) }, None);
    let big = "a".repeat(64 * 1024);
    let out = exchange(srv.addr, format!("GET / HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\r\n").as_bytes());
    assert!(out.starts_with("HTTP/1.1 431"), "{}", &out[..out.len().min(200)]);
}

#[test]
fn connections_past_the_limit_wait_for_a_slot() {
    let srv = start(limits(1_000, 2), None);
    let mut held: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(srv.addr).unwrap()).collect();
    // Both held connections are accepted before the third arrives.
    let t0 = Instant::now();
    while srv.stats.open.load(Ordering::Relaxed) < 2 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(srv.stats.open.load(Ordering::Relaxed), 2);
    // The third is left in the backlog, not accepted: the count stays at the limit until the
    // held ones time out, and then it is served.
    let mut third = TcpStream::connect(srv.addr).unwrap();
    third.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(srv.stats.accepted.load(Ordering::Relaxed) <= 2, "accepted past the limit");
    third.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut out = String::new();
    let _ = third.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(srv.stats.open.load(Ordering::Relaxed) <= 2);
    held.clear();
}

#[test]
fn shutdown_waits_for_a_request_in_flight() {
    let mut srv = start(limits(5_000, 8), None);
    let addr = srv.addr;
    let client = std::thread::spawn(move || exchange(addr, b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"));
    std::thread::sleep(Duration::from_millis(100));
    srv.stop();
    let out = client.join().unwrap();
    assert!(out.ends_with("slow\n"), "the request in flight finishes: {out}");
    assert!(TcpStream::connect(addr).is_err(), "no longer listening");
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").args(args).current_dir(dir).output().expect("openssl (Debian's openssl package)");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A test CA, a server certificate for 127.0.0.1 and a client certificate, in `dir`.
fn make_certificates(dir: &Path) {
    openssl(
        dir,
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
    std::fs::write(dir.join("server.cnf"), "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n").unwrap();
    std::fs::write(dir.join("client.cnf"), "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n").unwrap();
    for who in ["server", "client"] {
        let (key, csr, crt, cnf) =
            (format!("{who}.key"), format!("{who}.csr"), format!("{who}.pem"), format!("{who}.cnf"));
        openssl(dir, &["req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj", "/CN=x"]);
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &crt,
                "-days",
                "2",
                "-extfile",
                &cnf,
            ],
        );
    }
}

fn client(dir: &Path, with_cert: bool) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(dir.join("ca.pem")).unwrap()).unwrap();
    // A request the server never answers fails the test instead of hanging it.
    let mut b = reqwest::Client::builder()
        .add_root_certificate(ca)
        .tls_built_in_root_certs(false)
        .timeout(Duration::from_secs(20));
    if with_cert {
        let mut pem = std::fs::read(dir.join("client.pem")).unwrap();
        pem.extend(std::fs::read(dir.join("client.key")).unwrap());
        b = b.identity(reqwest::Identity::from_pem(&pem).unwrap());
    }
    b.build().unwrap()
}

async fn status(c: &reqwest::Client, url: &str, user: Option<(&str, &str)>) -> Result<u16, String> {
    let mut r = c.get(url);
    if let Some((u, p)) = user {
        r = r.basic_auth(u, Some(p));
    }
    r.send().await.map(|r| r.status().as_u16()).map_err(|e| format!("{e:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_client_certificates_and_basic_auth_reloaded_on_change() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().to_owned();
    let dir = d.clone();
    tokio::task::spawn_blocking(move || make_certificates(&dir)).await.unwrap();
    let hash = bcrypt::hash("pw", 4).unwrap();
    let web = d.join("web.yml");
    let tls = "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\n";
    std::fs::write(
        &web,
        format!(
            "{tls}basic_auth_users:\n  alice: {hash}\nhttp_server_config:\n  headers:\n    X-Frame-Options: deny\n"
        ),
    )
    .unwrap();
    let srv = start(limits(5_000, 8), Some(Arc::new(WebConfigFile::load(&web).unwrap())));
    let url = format!("https://{}/", srv.addr);

    let with_cert = client(&d, true);
    assert_eq!(status(&with_cert, &url, Some(("alice", "pw"))).await, Ok(200));
    assert_eq!(status(&with_cert, &url, Some(("alice", "nope"))).await, Ok(401));
    assert_eq!(status(&with_cert, &url, None).await, Ok(401));
    let resp = with_cert.get(&url).basic_auth("alice", Some("pw")).send().await.unwrap();
    assert_eq!(resp.headers()["x-frame-options"], "deny");
    // Without a client certificate the handshake is refused.
    assert!(status(&client(&d, false), &url, Some(("alice", "pw"))).await.is_err());
    // Plain HTTP on the TLS port is not served.
    let plain = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
    assert!(!matches!(status(&plain, &format!("http://{}/", srv.addr), None).await, Ok(200)));
    assert!(srv.stats.tls_handshake_failures.load(Ordering::Relaxed) >= 1);

    // Changed: client certificates optional, a second user. Seen within a second or two.
    let hash2 = bcrypt::hash("pw2", 4).unwrap();
    std::fs::write(
        &web,
        format!(
            "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: ca.pem\nbasic_auth_users:\n  alice: {hash}\n  bob: {hash2}\n"
        ),
    )
    .unwrap();
    let no_cert = client(&d, false);
    let t0 = Instant::now();
    while status(&no_cert, &url, Some(("bob", "pw2"))).await != Ok(200) {
        assert!(t0.elapsed() < Duration::from_secs(10), "the changed web config was not picked up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A broken file keeps the last good configuration.
    std::fs::write(&web, "basic_auth_users: [this is not a map\n").unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(status(&no_cert, &url, Some(("bob", "pw2"))).await, Ok(200));
    assert_eq!(status(&no_cert, &url, Some(("bob", "wrong"))).await, Ok(401));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strata_authorization_splits_read_write_and_admin_between_users() {
    let tmp = tempfile::tempdir().unwrap();
    let hash = bcrypt::hash("pw", 4).unwrap();
    let web = tmp.path().join("web.yml");
    std::fs::write(
        &web,
        format!(
            "basic_auth_users:\n  alice: {hash}\n  bob: {hash}\n  carol: {hash}\n\
             strata_authorization:\n  read: [alice]\n  write: [bob]\n  admin: [alice]\n"
        ),
    )
    .unwrap();
    let srv = start(limits(5_000, 8), Some(Arc::new(WebConfigFile::load(&web).unwrap())));
    let c = reqwest::Client::new();
    let base = format!("http://{}", srv.addr);
    // 404: authorized, and the test server has no such route; 403: refused before routing.
    for (user, path, want) in [
        ("alice", "/", 200),
        ("alice", "/api/v1/write", 403),
        ("alice", "/api/v1/import/prometheus", 403),
        ("alice", "/api/v1/admin/tsdb/snapshot", 404),
        ("alice", "/-/reload", 404),
        ("bob", "/", 403),
        ("bob", "/metrics", 403),
        ("bob", "/api/v1/write", 404),
        ("bob", "/api/v1/import/prometheus", 404),
        ("bob", "/-/quit", 403),
        ("carol", "/", 403),
    ] {
        let got = status(&c, &format!("{base}{path}"), Some((user, "pw"))).await;
        assert_eq!(got, Ok(want), "{user} {path}");
    }
    assert_eq!(status(&c, &format!("{base}/"), None).await, Ok(401));
    let body = c.get(format!("{base}/")).basic_auth("bob", Some("pw")).send().await.unwrap().text().await.unwrap();
    assert!(body.contains("\"bob\" may not read"), "{body}");
}
