//! The listeners over real sockets, on a real database in a temporary directory.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use strata_model::{MatchOp, Matcher};
use strata_tsdb::{Db, DbOptions};

use super::*;

struct Running {
    db: Arc<Db>,
    stats: Arc<CarbonStats>,
    addrs: Vec<(Protocol, SocketAddr)>,
    stop: watch::Sender<bool>,
    done: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Running {
    fn addr(&self, p: Protocol) -> SocketAddr {
        self.addrs.iter().find(|(q, _)| *q == p).expect("listener configured").1
    }

    /// Waits until `n` points have been decoded by `p`'s listener.
    async fn received(&self, p: Protocol, n: u64) {
        for _ in 0..500 {
            if self.stats.of(p).received.load(Ordering::Relaxed) >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{} received {} points, not {n}", p.name(), self.stats.of(p).received.load(Ordering::Relaxed));
    }

    /// `(t_ms, value)` of the series whose `__name__` is `name`.
    fn samples(&self, name: &str) -> Vec<(i64, f64)> {
        let q = self.db.querier(i64::MIN, i64::MAX);
        let m = Matcher::new(MatchOp::Equal, "__name__", name).unwrap();
        let series = q.select(&[m]).unwrap();
        series.iter().flat_map(|s| s.samples()).map(|s| (s.t, s.v)).collect()
    }

    fn rejected(&self, p: Protocol, reason: &str) -> u64 {
        self.stats.of(p).rejected().get(reason).copied().unwrap_or(0)
    }
}

async fn start(config: CarbonConfig) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let db = Arc::new(Db::open(dir.path(), DbOptions::default()).unwrap());
    let listeners = CarbonListeners::bind(config).await.unwrap();
    let addrs = listeners.local_addrs();
    let stats = Arc::new(CarbonStats::default());
    let (stop, rx) = watch::channel(false);
    let done = tokio::spawn(listeners.serve(db.clone(), stats.clone(), rx));
    Running { db, stats, addrs, stop, done, _dir: dir }
}

fn local() -> Option<SocketAddr> {
    Some("127.0.0.1:0".parse().unwrap())
}

const T: i64 = 1_700_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_lines_over_tcp_are_stored_and_bad_ones_counted_without_closing_the_connection() {
    let config = CarbonConfig { plaintext_tcp: local(), max_line_bytes: 100, ..CarbonConfig::default() };
    let run = start(config).await;
    let addr = run.addr(Protocol::PlaintextTcp);
    let mut good = 0;
    let lines: Vec<(Vec<u8>, Option<&str>)> = vec![
        (format!("sys.cpu.load 0.5 {T}\n").into_bytes(), None),
        (b"no.value\n".to_vec(), Some("field_count")),
        (format!("sys.cpu.load abc {T}\n").into_bytes(), Some("bad_value")),
        (format!("sys.cpu.load nan {}\n", T + 1).into_bytes(), Some("nan_value")),
        (b"sys.cpu.load 1 yesterday\n".to_vec(), Some("bad_timestamp")),
        (format!("{} 1 {T}\n", "x".repeat(500)).into_bytes(), Some("line_too_long")),
        (format!("m;=v 1 {T}\n").into_bytes(), Some("bad_path")),
        (format!("sys.cpu.load 0.25 {}\r\n", T + 10).into_bytes(), None),
        (format!("disk.used;host=a;dc=eu 42 {T}\n").into_bytes(), None),
        // Late: stored (carbon's out-of-order window); a day and more behind the newest: refused.
        (format!("sys.cpu.load 7 {}\n", T + 5).into_bytes(), None),
        (format!("sys.cpu.load 7 {}\n", T - 2 * 86400).into_bytes(), Some("too_old")),
        (b"\n   \n".to_vec(), None),
    ];
    let mut all = Vec::new();
    for (l, _) in &lines {
        all.extend_from_slice(l);
    }
    // Invalid UTF-8, by hand (the line above is only text).
    all.extend_from_slice(b"bad\xffpath 1 1700000000\n");
    let mut s = TcpStream::connect(addr).unwrap();
    // Written in small pieces, so lines are split across reads.
    for piece in all.chunks(7) {
        s.write_all(piece).unwrap();
    }
    s.write_all(format!("late.good 3 {T}\npartial.line 1").as_bytes()).unwrap();
    drop(s);
    good += 5;
    // 14 lines with content, of which the last is partial.
    run.received(Protocol::PlaintextTcp, 14).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(run.samples("sys.cpu.load"), [(T * 1000, 0.5), ((T + 5) * 1000, 7.0), ((T + 10) * 1000, 0.25)]);
    assert_eq!(run.samples("late.good"), [(T * 1000, 3.0)]);
    let q = run.db.querier(i64::MIN, i64::MAX);
    let tagged = q.select(&[Matcher::new(MatchOp::Equal, "__name__", "disk.used").unwrap()]).unwrap();
    assert_eq!(tagged.len(), 1);
    assert_eq!(tagged[0].labels.get("dc"), Some("eu"));
    assert_eq!(tagged[0].labels.get("host"), Some("a"));
    for reason in
        ["field_count", "bad_value", "nan_value", "bad_timestamp", "line_too_long", "bad_path", "too_old", "not_utf8"]
    {
        assert!(
            run.rejected(Protocol::PlaintextTcp, reason) >= 1,
            "{reason}: {:?}",
            run.stats.plaintext_tcp.rejected()
        );
    }
    assert_eq!(run.rejected(Protocol::PlaintextTcp, "partial_line"), 1);
    assert_eq!(run.stats.plaintext_tcp.stored.load(Ordering::Relaxed), good);
    assert_eq!(run.stats.plaintext_tcp.connections_failed.load(Ordering::Relaxed), 0);
    let _ = run.stop.send(true);
    run.done.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_longer_than_the_read_buffer_is_skipped_to_its_end() {
    let config =
        CarbonConfig { plaintext_tcp: local(), max_line_bytes: 64, read_buffer_bytes: 128, ..CarbonConfig::default() };
    let run = start(config).await;
    let mut s = TcpStream::connect(run.addr(Protocol::PlaintextTcp)).unwrap();
    s.write_all(format!("a.b 1 {T}\n{} 2 {T}\na.b 3 {}\n", "y".repeat(10_000), T + 60).as_bytes()).unwrap();
    drop(s);
    run.received(Protocol::PlaintextTcp, 3).await;
    assert_eq!(run.samples("a.b"), [(T * 1000, 1.0), ((T + 60) * 1000, 3.0)]);
    assert_eq!(run.rejected(Protocol::PlaintextTcp, "line_too_long"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_whose_series_the_head_dropped_is_stored_again_on_the_same_connection() {
    let run = start(CarbonConfig { plaintext_tcp: local(), ..CarbonConfig::default() }).await;
    let mut s = TcpStream::connect(run.addr(Protocol::PlaintextTcp)).unwrap();
    // Two spellings of one tagged series: two cache entries, one series.
    s.write_all(format!("c.one;b=2;a=1 1 {T}\nc.one;a=1;b=2 2 {}\n", T + 60).as_bytes()).unwrap();
    run.received(Protocol::PlaintextTcp, 2).await;
    // As after a head cut: the series had nothing newer than the cut, and is gone from the head
    // while the connection still remembers it.
    let (_, removed) = run.db.head().truncate((T + 3600) * 1000, u64::MAX);
    assert_eq!(removed, 1);
    assert!(run.samples("c.one").is_empty());
    s.write_all(format!("c.one;b=2;a=1 3 {}\nc.one;a=1;b=2 4 {}\n", T + 7200, T + 7260).as_bytes()).unwrap();
    run.received(Protocol::PlaintextTcp, 4).await;
    assert_eq!(run.samples("c.one"), [((T + 7200) * 1000, 3.0), ((T + 7260) * 1000, 4.0)]);
    assert_eq!(run.stats.plaintext_tcp.stored.load(Ordering::Relaxed), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_over_udp() {
    let run = start(CarbonConfig { plaintext_udp: local(), ..CarbonConfig::default() }).await;
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let to = run.addr(Protocol::PlaintextUdp);
    // The last line of a datagram needs no newline.
    sock.send_to(format!("u.one 1 {T}\nu.two 2 {T}").as_bytes(), to).unwrap();
    sock.send_to(format!("u.one 5 {}\nu.one x {T}\n", T + 60).as_bytes(), to).unwrap();
    // A tag named `__name__` would collide with the path's name.
    sock.send_to(format!("u.three;__name__=x 1 {T}\n").as_bytes(), to).unwrap();
    run.received(Protocol::PlaintextUdp, 5).await;
    assert_eq!(run.rejected(Protocol::PlaintextUdp, "invalid_labels"), 1);
    assert_eq!(run.samples("u.one"), [(T * 1000, 1.0), ((T + 60) * 1000, 5.0)]);
    assert_eq!(run.samples("u.two"), [(T * 1000, 2.0)]);
    assert_eq!(run.rejected(Protocol::PlaintextUdp, "bad_value"), 1);
}

/// A pickle message as carbon's senders frame it.
fn frame(pickle: &[u8]) -> Vec<u8> {
    let mut out = (pickle.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(pickle);
    out
}

/// `[("p.a", (1700000000, 1.5)), ("p.b", (1700000060, 2.0))]` pickled by Python 3 with
/// protocol 2 (`pickle.dumps(..., 2)`), as carbon's own clients send.
const PICKLE_P2: &[u8] = b"\x80\x02]q\x00(X\x03\x00\x00\x00p.aq\x01J\x00\xf1SeG?\xf8\x00\x00\x00\x00\x00\x00\x86q\x02\x86q\x03X\x03\x00\x00\x00p.bq\x04J<\xf1SeG@\x00\x00\x00\x00\x00\x00\x00\x86q\x05\x86q\x06e.";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pickle_messages_are_stored_and_an_evil_one_is_refused_without_closing_the_connection() {
    let run = start(CarbonConfig { pickle_tcp: local(), max_pickle_bytes: 4096, ..CarbonConfig::default() }).await;
    let addr = run.addr(Protocol::PickleTcp);
    let mut s = TcpStream::connect(addr).unwrap();
    // A global (os.system) is refused by name; the connection goes on.
    let evil = b"cos\nsystem\n(S'echo pwned'\ntR.";
    s.write_all(&frame(evil)).unwrap();
    s.write_all(&frame(b"\x80\x02]q\x00(")).unwrap();
    s.write_all(&frame(PICKLE_P2)).unwrap();
    s.flush().unwrap();
    run.received(Protocol::PickleTcp, 2).await;
    assert_eq!(run.samples("p.a"), [(T * 1000, 1.5)]);
    assert_eq!(run.samples("p.b"), [((T + 60) * 1000, 2.0)]);
    assert_eq!(run.rejected(Protocol::PickleTcp, "pickle_opcode_refused"), 1);
    assert_eq!(run.rejected(Protocol::PickleTcp, "pickle_truncated"), 1);
    // A length past the limit closes the connection; a new one works.
    s.write_all(&(1u32 << 30).to_be_bytes()).unwrap();
    // Read off the runtime's workers: the server's tasks run on them (a blocking read here
    // once held one of the two for the whole timeout).
    let closed = tokio::task::spawn_blocking(move || {
        let mut buf = [0u8; 1];
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        std::io::Read::read(&mut s, &mut buf)
    })
    .await
    .unwrap();
    let reset = |e: &std::io::Error| e.kind() == std::io::ErrorKind::ConnectionReset;
    assert!(matches!(&closed, Ok(0)) || closed.as_ref().is_err_and(reset), "the connection stayed open: {closed:?}");
    assert_eq!(run.rejected(Protocol::PickleTcp, "message_too_large"), 1);
    // The socket is closed before the connection's task counts its failure: the client can
    // see the close first (a clean-clone CI run under load did).
    let failed = || run.stats.pickle_tcp.connections_failed.load(Ordering::Relaxed);
    let waited = std::time::Instant::now();
    while failed() < 1 && waited.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(failed(), 1);
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&frame(PICKLE_P2)).unwrap();
    drop(s);
    // Decoded on the new connection (the wait fails otherwise), and not stored twice.
    run.received(Protocol::PickleTcp, 4).await;
    assert_eq!(run.stats.pickle_tcp.stored.load(Ordering::Relaxed), 2, "the same points again change nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_limit_wait_and_idle_ones_are_closed() {
    let config = CarbonConfig {
        plaintext_tcp: local(),
        max_connections: 2,
        idle_timeout: Duration::from_millis(300),
        ..CarbonConfig::default()
    };
    let run = start(config).await;
    let addr = run.addr(Protocol::PlaintextTcp);
    let idle: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let mut third = TcpStream::connect(addr).unwrap();
    third.write_all(format!("c.waited 1 {T}\n").as_bytes()).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(run.stats.plaintext_tcp.connections_open.load(Ordering::Relaxed), 2);
    assert!(run.samples("c.waited").is_empty(), "a third connection was served past the limit of 2");
    // The idle two are closed after 300 ms; then the third is served.
    run.received(Protocol::PlaintextTcp, 1).await;
    assert_eq!(run.samples("c.waited"), [(T * 1000, 1.0)]);
    // The third is served once the first idle one is closed; the second's close may be
    // counted a moment later.
    let failed = || run.stats.plaintext_tcp.connections_failed.load(Ordering::Relaxed);
    let waited = std::time::Instant::now();
    while failed() < 2 && waited.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(failed() >= 2, "both idle connections are closed");
    drop(idle);
    let mut text = String::new();
    run.stats.render(&mut text);
    assert!(text.contains("strata_carbon_points_stored_total{protocol=\"plaintext_tcp\"} 1"), "{text}");
    assert!(text.contains("strata_carbon_connections_limit 2"), "{text}");
    // Shutdown stores what was read, and returns with connections still open.
    third.write_all(format!("c.waited 2 {}\n", T + 60).as_bytes()).unwrap();
    run.received(Protocol::PlaintextTcp, 2).await;
    let _ = run.stop.send(true);
    tokio::time::timeout(Duration::from_secs(5), run.done)
        .await
        .expect("shutdown waited on an open connection")
        .unwrap();
}
