//! PromQL query latency, Strata against Prometheus and VictoriaMetrics on the same data, in one
//! run: a dashboard mix over the node-exporter recording replicated to INSTANCES instances.
//!
//! `cargo bench -p strata --bench query_compare [-- INSTANCES [RUNS [STRIDE]] [minutes=M]
//! [churn=PCT/MIN] [stagger]]` (defaults 1000, 5, 1, the 24 h shape, no churn).
//!
//! Data: the recording's 600 scrapes (every STRIDE-th of them), re-stamped evenly over the
//! 24 h before now (600 scrapes: 144 s apart), for INSTANCES `instance` values, plus a
//! synthetic classic histogram per instance (two handlers × 12 buckets, with `_sum` and
//! `_count`; the recording has none) so that `histogram_quantile` has input. `minutes=M`
//! instead keeps the recording's first M minutes at their own 10 s spacing, ending two minutes
//! before now: data still in the servers' heads (Strata's and Prometheus' heads hold up to
//! two hours) rather than in compacted blocks, and the queries cover those M minutes.
//! `churn=60/15` replaces the first 60% of the instances every 15 minutes (new `instance`
//! values, as pods replaced by a rollout), so most selected series are dead for most of the
//! range. `stagger` scrapes each instance at its own offset within the interval, with up to
//! 20 ms of jitter per scrape, as Prometheus scrapes targets (without it every instance has the
//! same timestamps, which flatters work shared between series of equal timestamps). Each server
//! (`strata` from this build, Debian's `prometheus` with the remote-write receiver, Debian's
//! `victoria-metrics` with its result cache off) is started on a fresh directory and loaded by
//! remote write in time order over 4 connections, and left until its background work (head
//! compaction, merges) has settled; all stay up. Then each query runs once per server to warm
//! up and RUNS rounds measured, each round asking every server in turn (the order rotating),
//! so a noisy moment of the shared machine falls on all servers alike rather than on whichever
//! ran then. The table shows median wall time per request (HTTP, evaluation and JSON), the
//! series each server returned, and Strata's speed-up.
//! `QUERY_SERVERS=strata` (comma-separated) limits the servers, e.g. to profile one: each
//! prints its PID once loaded. `QUERY_NAMES=topk` (comma-separated parts of the names in the
//! table) limits the queries. `STRATA_BASELINE_BIN=path/to/strata` adds that build as
//! `strata-baseline`, for comparing a change against the build before it in one run.
//! Strata's result cache is bypassed in that table (`nocache=1`: it compares evaluations, and
//! VictoriaMetrics runs with its cache off); a second table then shows the cache: each range
//! query refreshed with its window moved by one step, against the same window evaluated whole,
//! the two answers compared byte for byte (the windows move up to the end of the data, so each
//! new step has samples to read, as a live dashboard's has). A last table shows fairness: a small panel's
//! latency alone and while heavy queries run back to back beside it, per server
//! (`QUERY_NO_FAIRNESS=1` skips it).
//! `QUERY_DATA_DIR=path` keeps each server's data there: a later run with the same INSTANCES
//! and STRIDE restarts the servers on it instead of loading again (for A/B runs and profiling).

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::sync::mpsc::{sync_channel, SyncSender};
use std::time::{Duration, Instant};

use common::{get, get_gzip, read_recording, read_response, start, urlencode, Peer, Scrape, Scraped};
use strata_server::remote::{encode, Label, Sample, TimeSeries, WriteRequest};

/// The recording's 600 scrapes, every `SCRAPE_STRIDE`-th kept, spread evenly over 24 h.
const DAY_MS: i64 = 24 * 3600 * 1000;
const SAMPLES_PER_REQUEST: usize = 5_000;
const CONNECTIONS: usize = 4;
const STEP_S: i64 = 60;

/// (name, query, range query?); `[10m]` stands for the rate window, about four scrape
/// intervals.
const QUERIES: &[(&str, &str, bool)] = &[
    ("rate by label", r#"rate(node_network_receive_bytes_total{device!="lo"}[10m])"#, true),
    ("sum by instance", r#"sum by (instance) (rate(node_cpu_seconds_total{mode!="idle"}[10m]))"#, true),
    ("ratio of two metrics", "1 - node_memory_MemAvailable_bytes / node_memory_MemTotal_bytes", true),
    ("topk", "topk(5, rate(node_disk_io_time_seconds_total[10m]))", true),
    (
        "histogram_quantile",
        "histogram_quantile(0.99, sum by (le, handler) (rate(demo_request_duration_seconds_bucket[10m])))",
        true,
    ),
    (
        "regex selector",
        r#"sum by (device) (rate(node_network_transmit_bytes_total{device=~"eth.*|ifb.*"}[10m]))"#,
        true,
    ),
    (
        "131k series: sum of rates",
        r#"sum by (instance) (rate({__name__=~"node_interrupts_total|node_cpu_seconds_total|node_scrape_collector_duration_seconds"}[10m]))"#,
        true,
    ),
    (
        "180k series: count by",
        r#"count by (instance) ({__name__=~"node_(interrupts_total|scrape_collector_.+|cpu_seconds_total)"})"#,
        true,
    ),
    ("instant: sum by instance", "sum by (instance) (rate(node_cpu_seconds_total[10m]))", false),
];

/// Fairness: a small panel (two series per instance over the last hour), measured alone and
/// beside the heavy query running back to back on other connections.
const FAIRNESS_SMALL: &str = "1 - node_memory_MemAvailable_bytes / node_memory_MemTotal_bytes";
const FAIRNESS_HEAVY: &str =
    r#"count by (instance) ({__name__=~"node_(interrupts_total|scrape_collector_.+|cpu_seconds_total)"})"#;
const FAIRNESS_HEAVY_CONNECTIONS: usize = 2;
const FAIRNESS_RUNS: usize = 30;

/// Cumulative bucket counts of the synthetic histogram at scrape `k`.
fn histogram_samples(k: usize, instance: usize) -> Vec<Scraped> {
    const BOUNDS: [&str; 12] = ["0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "+Inf"];
    let mut out = Vec::new();
    for (h, handler) in ["/api", "/metrics"].iter().enumerate() {
        let mut cum = 0.0;
        let scale = 1.0 + ((instance * 7 + h * 3) % 11) as f64 / 10.0;
        for (b, le) in BOUNDS.iter().enumerate() {
            // Requests per scrape in bucket b: more in the middle buckets.
            let per_scrape = scale * (6 - (b as i64 - 5).abs()).max(1) as f64;
            cum += per_scrape * k as f64;
            out.push((
                vec![
                    ("__name__".into(), "demo_request_duration_seconds_bucket".into()),
                    ("handler".into(), handler.to_string()),
                    ("le".into(), le.to_string()),
                ],
                cum,
            ));
        }
        let base = vec![("handler".to_string(), handler.to_string())];
        let mut count = base.clone();
        count.push(("__name__".into(), "demo_request_duration_seconds_count".into()));
        let mut sum = base;
        sum.push(("__name__".into(), "demo_request_duration_seconds_sum".into()));
        out.push((count, cum));
        out.push((sum, cum * 0.3));
    }
    out
}

/// Sends every sample by remote write in time order; series are sharded over connections so
/// each series' samples stay in order. Returns the sample count.
fn load(port: u16, scrapes: &[Scrape], instances: usize, end_ms: i64, shape: Shape) -> u64 {
    let mut senders: Vec<SyncSender<Vec<u8>>> = Vec::new();
    let mut workers = Vec::new();
    for _ in 0..CONNECTIONS {
        let (tx, rx) = sync_channel::<Vec<u8>>(8);
        senders.push(tx);
        workers.push(std::thread::spawn(move || {
            let connect = || {
                let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
                stream.set_nodelay(true).unwrap();
                (stream.try_clone().unwrap(), std::io::BufReader::new(stream))
            };
            let (mut w, mut r) = connect();
            for body in rx {
                let head = format!(
                    "POST /api/v1/write HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Encoding: snappy\r\n\
                     Content-Type: application/x-protobuf\r\nX-Prometheus-Remote-Write-Version: 0.1.0\r\n\
                     Content-Length: {}\r\n\r\n",
                    body.len()
                );
                // VictoriaMetrics closes keep-alive connections every 2 minutes
                // (-http.connTimeout): reconnect and send the request again.
                let mut attempt = 0;
                loop {
                    let sent = w.write_all(head.as_bytes()).and_then(|()| w.write_all(&body));
                    match sent.and_then(|()| read_response(&mut r)) {
                        Ok((status, resp)) => {
                            assert!(status / 100 == 2, "HTTP {status}: {}", String::from_utf8_lossy(&resp));
                            break;
                        }
                        Err(e) if attempt < 3 => {
                            attempt += 1;
                            eprintln!("reconnecting after: {e}");
                            (w, r) = connect();
                        }
                        Err(e) => panic!("remote write failed: {e}"),
                    }
                }
            }
        }));
    }
    let mut batches: Vec<Vec<TimeSeries>> = vec![Vec::new(); CONNECTIONS];
    let mut total = 0u64;
    let begin_ms = end_ms - shape.span_ms();
    let spacing_ms = shape.spacing_ms(scrapes);
    for (k, (recorded, samples)) in scrapes.iter().enumerate() {
        let scrape_t = shape.restamp(scrapes, k, *recorded, end_ms);
        for i in 0..instances {
            let t = scrape_t - shape.stagger_ms(k, i, instances, spacing_ms);
            let instance = match shape.churn {
                // The first PCT% of the instances are replaced each period.
                Some((pct, minutes)) if i * 100 < instances * pct => {
                    let generation = (t - begin_ms) / (minutes * 60_000);
                    format!("host-{i:05}-{generation}:9100")
                }
                _ => format!("host-{i:05}:9100"),
            };
            let shard = i % CONNECTIONS;
            let extra = histogram_samples(k, i);
            for (pairs, v) in samples.iter().chain(extra.iter()) {
                let mut labels: Vec<Label> = pairs.iter().map(|(n, v)| Label::new(n.clone(), v.clone())).collect();
                labels.push(Label::new("instance", instance.clone()));
                labels.push(Label::new("job", "node"));
                labels.sort_by(|a, b| a.name.cmp(&b.name));
                batches[shard].push(TimeSeries {
                    labels,
                    samples: vec![Sample { value: *v, timestamp: t }],
                    histograms: vec![],
                    exemplars: vec![],
                });
                total += 1;
                if batches[shard].len() == SAMPLES_PER_REQUEST {
                    let req = WriteRequest { timeseries: std::mem::take(&mut batches[shard]), metadata: vec![] };
                    senders[shard].send(encode(&req)).unwrap();
                }
            }
        }
    }
    for (shard, batch) in batches.into_iter().enumerate() {
        if !batch.is_empty() {
            senders[shard].send(encode(&WriteRequest { timeseries: batch, metadata: vec![] })).unwrap();
        }
    }
    drop(senders);
    for w in workers {
        w.join().unwrap();
    }
    total
}

/// Where the data lies in time, and whether instances churn.
#[derive(Clone, Copy, PartialEq, Debug)]
struct Shape {
    /// The recording's first minutes at their own spacing, instead of 24 h.
    minutes: Option<i64>,
    /// (percent of the instances, minutes): that share replaced by new ones every period.
    churn: Option<(usize, i64)>,
    /// Each instance scraped at its own offset within the scrape interval, with up to 20 ms
    /// of jitter per scrape (as Prometheus scrapes targets), instead of every instance at the
    /// same times. All samples of one scrape of an instance still share its time.
    stagger: bool,
}

impl Shape {
    fn parse(args: &[String]) -> Shape {
        let mut shape = Shape { minutes: None, churn: None, stagger: false };
        for a in args {
            if a == "stagger" {
                shape.stagger = true;
            }
            if let Some(m) = a.strip_prefix("minutes=") {
                shape.minutes = Some(m.parse().expect("minutes=M: a whole number of minutes"));
            } else if let Some(c) = a.strip_prefix("churn=") {
                let (pct, min) = c.split_once('/').expect("churn=PCT/MIN");
                shape.churn = Some((pct.parse().expect("churn's PCT"), min.parse().expect("churn's MIN")));
            }
        }
        shape
    }

    /// How much earlier than `t` instance `i` of `instances` takes scrape `k` (scrapes
    /// `spacing_ms` apart): its offset within the interval and this scrape's jitter, with
    /// `stagger`; else 0.
    fn stagger_ms(&self, k: usize, i: usize, instances: usize, spacing_ms: i64) -> i64 {
        if !self.stagger {
            return 0;
        }
        let mut x = (k as u64) << 32 ^ i as u64 ^ 0x9e37_79b9_7f4a_7c15;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (i as i64 * (spacing_ms - 20) / instances as i64) + (x % 21) as i64
    }

    fn span_ms(&self) -> i64 {
        self.minutes.map_or(DAY_MS, |m| m * 60_000)
    }

    /// The time scrape `k` of `scrapes` (recorded at `recorded`) gets, for data ending at
    /// `end_ms`: spread evenly over 24 h, or shifted whole so the last scrape is at the end.
    fn restamp(&self, scrapes: &[Scrape], k: usize, recorded: i64, end_ms: i64) -> i64 {
        match self.minutes {
            None => {
                let n = scrapes.len() as i64;
                end_ms - (n - 1 - k as i64) * (DAY_MS / n)
            }
            Some(_) => end_ms - (scrapes.last().unwrap().0 - recorded),
        }
    }

    /// The time between scrapes: 24 h over the scrapes, or the recording's own mean interval.
    fn spacing_ms(&self, scrapes: &[Scrape]) -> i64 {
        match self.minutes {
            None => DAY_MS / scrapes.len() as i64,
            Some(_) => (scrapes.last().unwrap().0 - scrapes[0].0) / (scrapes.len() as i64 - 1).max(1),
        }
    }

    /// For the table's caption and the kept data's parameters.
    fn describe(&self) -> String {
        let mut s = match self.minutes {
            None => "24 h".to_string(),
            Some(m) => format!("the last {m} min (head)"),
        };
        if let Some((pct, min)) = self.churn {
            s += &format!(", {pct}% of instances replaced every {min} min");
        }
        if self.stagger {
            s += ", instances scraped at their own offsets";
        }
        s
    }
}

/// A gzip body as text (a body that was not compressed comes back as it is, and then
/// differs from what it is compared with only if its text does).
fn gunzip(body: &[u8]) -> String {
    use std::io::Read;
    if !body.starts_with(&[0x1f, 0x8b]) {
        return String::from_utf8_lossy(body).into_owned();
    }
    let mut out = String::new();
    flate2::read::GzDecoder::new(body).read_to_string(&mut out).expect("a valid gzip body");
    out
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let words: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<usize> = words.iter().filter_map(|a| a.parse().ok()).collect();
    let shape = Shape::parse(&words);
    let instances = args.first().copied().unwrap_or(1000);
    let runs = args.get(1).copied().unwrap_or(5).max(1);
    let built = std::process::Command::new(env!("CARGO"))
        .args(["build", "--release", "-p", "strata", "--bin", "strata"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .unwrap();
    assert!(built.success());
    // Every stride-th scrape (default all 600); rate windows hold about four samples.
    let stride = args.get(2).copied().unwrap_or(1).max(1);
    let mut scrapes: Vec<Scrape> = read_recording();
    if let Some(m) = shape.minutes {
        let first = scrapes[0].0;
        scrapes.retain(|(t, _)| *t < first + m * 60_000);
    }
    let scrapes: Vec<Scrape> = scrapes.into_iter().step_by(stride).collect();
    let spacing_ms = shape.spacing_ms(&scrapes);
    let window = format!("{}m", (4 * spacing_ms / 60_000).max(5));
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    // Data ends two minutes before now, on a whole minute; queries cover the span before that.
    let mut end_ms = (now - 120_000) / 60_000 * 60_000;
    // QUERY_DATA_DIR keeps the loaded servers' directories for the next run with the same
    // instances and stride (which then reuses their end time and skips the load).
    let tmp = tempfile::tempdir().unwrap();
    let kept = std::env::var_os("QUERY_DATA_DIR").map(std::path::PathBuf::from);
    let root = kept.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    if kept.is_some() {
        let params = root.join("params");
        let same = std::fs::read_to_string(&params).ok().and_then(|p| {
            let v: Vec<i64> = p.lines().next()?.split_whitespace().filter_map(|x| x.parse().ok()).collect();
            let same_shape = p.lines().nth(1) == Some(format!("{shape:?}").as_str());
            (same_shape && v.len() == 3 && v[0] == instances as i64 && v[1] == stride as i64).then_some(v[2])
        });
        match same {
            Some(end) => end_ms = end,
            None => {
                let _ = std::fs::remove_dir_all(&root);
                std::fs::create_dir_all(&root).unwrap();
                std::fs::write(&params, format!("{instances} {stride} {end_ms}\n{shape:?}\n")).unwrap();
            }
        }
    }
    let end_s = end_ms / 1000;
    let start_s = end_s - shape.span_ms() / 1000;
    // results[query][server] = (median, series)
    let servers = ["strata", "prometheus", "victoria-metrics", "strata-baseline"];
    let mut results: Vec<Vec<Option<(Duration, usize)>>> = vec![vec![None; servers.len()]; QUERIES.len()];
    let only: Option<Vec<String>> =
        std::env::var("QUERY_SERVERS").ok().map(|s| s.split(',').map(String::from).collect());
    let only_queries: Option<Vec<String>> =
        std::env::var("QUERY_NAMES").ok().map(|s| s.split(',').map(String::from).collect());
    // Load every server, one at a time; all stay up for the queries.
    let mut peers: Vec<(usize, Peer)> = Vec::new();
    for (si, name) in servers.iter().enumerate() {
        if only.as_ref().is_some_and(|o| !o.iter().any(|x| x == name)) {
            continue;
        }
        // Strata and VictoriaMetrics get the same series limit: the churned shape's 131k query
        // selects more than Strata's default of 1M series (about 11,600 instance values over
        // the day, 131 series each).
        let extra: Vec<String> = match *name {
            "strata" | "strata-baseline" => vec![
                "--query.max-samples".into(),
                "1000000000".into(),
                "--query.max-series".into(),
                "10000000".into(),
                "--retention".into(),
                "30d".into(),
            ],
            "prometheus" => vec!["--query.max-samples=1000000000".into(), "--storage.tsdb.retention.time=30d".into()],
            _ => vec![
                "-search.disableCache".into(),
                "-search.maxUniqueTimeseries=10000000".into(),
                "-retentionPeriod=30d".into(),
            ],
        };
        let dir = root.join(name);
        let loaded = dir.join("loaded");
        let reuse = kept.is_some() && loaded.exists();
        let Some(peer): Option<Peer> = start(name, &dir, &extra) else {
            println!("{name}: not found on the PATH; skipped");
            continue;
        };
        let t0 = Instant::now();
        let samples = if reuse {
            println!("{name}: reusing the data loaded in {}", dir.display());
            0
        } else {
            load(peer.port, &scrapes, instances, end_ms, shape)
        };
        let load_time = t0.elapsed();
        if *name == "victoria-metrics" {
            let _ = get(peer.port, "/internal/force_flush");
            std::thread::sleep(Duration::from_secs(2));
        }
        let (cpu, rss) = common::proc_usage(peer.child.id());
        let t_idle = Instant::now();
        common::wait_idle(peer.child.id(), Duration::from_secs(900));
        println!("{name}: background work after the load settled in {:.0?}", t_idle.elapsed());
        if kept.is_some() {
            std::fs::write(&loaded, "").unwrap();
        }
        let settled_rss = common::proc_status_bytes(peer.child.id(), "VmRSS") >> 20;
        if reuse {
            println!("{name} (pid {}): restarted on kept data, RSS once settled {settled_rss} MiB", peer.child.id());
        } else {
            println!(
                "{name} (pid {}): loaded {samples} samples in {load_time:.1?} ({:.0} samples/s), {cpu:.0} CPU s, peak RSS {} MiB, RSS once settled {settled_rss} MiB",
                peer.child.id(),
                samples as f64 / load_time.as_secs_f64(),
                rss >> 20,
            );
        }
        peers.push((si, peer));
    }
    for (qi, (label, q, range)) in QUERIES.iter().enumerate() {
        if only_queries.as_ref().is_some_and(|o| !o.iter().any(|x| label.contains(x.as_str()))) {
            continue;
        }
        let q = q.replace("[10m]", &format!("[{window}]"));
        let path = if *range {
            format!("/api/v1/query_range?query={}&start={start_s}&end={end_s}&step={STEP_S}", urlencode(&q))
        } else {
            format!("/api/v1/query?query={}&time={end_s}", urlencode(&q))
        };
        // Strata's result cache would answer repeated requests from kept steps: the
        // comparison is of evaluations (VictoriaMetrics' cache is off too); the cache's own
        // table follows.
        let path_of =
            |si: usize| if servers[si].starts_with("strata") { format!("{path}&nocache=1") } else { path.clone() };
        // Warm-up, and the series each server returns.
        let mut counted: Vec<Option<usize>> = Vec::new();
        for (si, peer) in &peers {
            let path = path_of(*si);
            let (status, body, _) = get(peer.port, &path);
            if status != 200 {
                println!("  {} {label}: HTTP {status}: {}", servers[*si], body.chars().take(300).collect::<String>());
                counted.push(None);
                continue;
            }
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            counted.push(Some(v["data"]["result"].as_array().map_or(0, |a| a.len())));
        }
        let mut times: Vec<Vec<Duration>> = vec![Vec::new(); peers.len()];
        for run in 0..runs {
            for k in 0..peers.len() {
                let p = (run + k) % peers.len();
                if counted[p].is_some() {
                    times[p].push(get(peers[p].1.port, &path_of(peers[p].0)).2);
                }
            }
        }
        for (p, (si, _)) in peers.iter().enumerate() {
            if let Some(series) = counted[p] {
                let m = median(std::mem::take(&mut times[p]));
                println!("  {} {label}: {:.1} ms ({series} series)", servers[*si], m.as_secs_f64() * 1000.0);
                results[qi][*si] = Some((m, series));
            }
        }
    }
    // The result cache: a dashboard refreshing each range query with its window moved by one
    // step, against the same request evaluated whole (nocache=1); answers must be equal. The
    // windows end inside the data, the last one where it ends.
    let mut refreshes: Vec<(&str, Duration, Duration, Duration, Duration)> = Vec::new();
    if let Some((_, strata)) = peers.iter().find(|(si, _)| servers[*si] == "strata") {
        for (label, q, range) in QUERIES.iter() {
            if !range || only_queries.as_ref().is_some_and(|o| !o.iter().any(|x| label.contains(x.as_str()))) {
                continue;
            }
            let q = urlencode(&q.replace("[10m]", &format!("[{window}]")));
            // The first window ends `2 * runs` steps before the data does, so every refresh's
            // new step has data behind it, as a live dashboard's has (a window moved past the
            // end of the data would evaluate new steps over fewer and fewer samples, down to
            // none).
            let back = 2 * runs as i64;
            let at = |k: i64, extra: &str| {
                let (s, e) = (start_s + (k - back) * STEP_S, end_s + (k - back) * STEP_S);
                format!("/api/v1/query_range?query={q}&start={s}&end={e}&step={STEP_S}{extra}")
            };
            let (status, _, _) = get(strata.port, &at(0, ""));
            if status != 200 {
                continue;
            }
            let (mut cold, mut refresh) = (Vec::new(), Vec::new());
            for k in 1..=runs as i64 {
                let (_, fresh, took) = get(strata.port, &at(k, ""));
                refresh.push(took);
                let (_, whole, took) = get(strata.port, &at(k, "&nocache=1"));
                cold.push(took);
                assert_eq!(fresh, whole, "{label}: the cached answer differs from the evaluated one");
            }
            // The same with gzip asked for, as Grafana asks (its window moved on further).
            let (mut cold_gz, mut refresh_gz) = (Vec::new(), Vec::new());
            for k in 1..=runs as i64 {
                let k = runs as i64 + k;
                let (_, fresh, took) = get_gzip(strata.port, &at(k, ""));
                refresh_gz.push(took);
                let (_, whole, took) = get_gzip(strata.port, &at(k, "&nocache=1"));
                cold_gz.push(took);
                let (_, plain, _) = get(strata.port, &at(k, "&nocache=1"));
                assert_eq!(gunzip(&fresh), plain, "{label}: the cached gzip answer differs from the evaluated one");
                assert_eq!(gunzip(&whole), plain, "{label}: the gzip answer differs from the plain one");
            }
            refreshes.push((label, median(cold), median(refresh), median(cold_gz), median(refresh_gz)));
        }
        let (_, metrics, _) = get(strata.port, "/metrics");
        for line in metrics.lines().filter(|l| l.starts_with("strata_query_cache_")) {
            println!("  {line}");
        }
    }
    // Fairness: a small dashboard panel's latency alone, then while heavy queries run back to
    // back on other connections (each server in turn, so they do not load each other).
    let mut fairness: Vec<(usize, Duration, Duration, usize)> = Vec::new();
    if std::env::var_os("QUERY_NO_FAIRNESS").is_none() {
        let small = format!(
            "/api/v1/query_range?query={}&start={}&end={end_s}&step={STEP_S}",
            urlencode(FAIRNESS_SMALL),
            end_s - (shape.span_ms() / 1000).min(3600)
        );
        let heavy = format!(
            "/api/v1/query_range?query={}&start={start_s}&end={end_s}&step={STEP_S}",
            urlencode(FAIRNESS_HEAVY)
        );
        for (si, peer) in &peers {
            let cache_off =
                |p: &str| if servers[*si].starts_with("strata") { format!("{p}&nocache=1") } else { p.to_string() };
            let (small, heavy) = (cache_off(&small), cache_off(&heavy));
            let port = peer.port;
            let _ = get(port, &small);
            let alone: Vec<Duration> = (0..FAIRNESS_RUNS).map(|_| get(port, &small).2).collect();
            let stop = std::sync::atomic::AtomicBool::new(false);
            let (loaded, heavy_done) = std::thread::scope(|scope| {
                let loaders: Vec<_> = (0..FAIRNESS_HEAVY_CONNECTIONS)
                    .map(|_| {
                        let (heavy, stop) = (&heavy, &stop);
                        scope.spawn(move || {
                            let mut done = 0;
                            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                                let (status, _, _) = get(port, heavy);
                                assert_eq!(status, 200, "the heavy query failed");
                                done += 1;
                            }
                            done
                        })
                    })
                    .collect();
                // Let the heavy queries get going before measuring.
                std::thread::sleep(Duration::from_millis(500));
                let loaded: Vec<Duration> = (0..FAIRNESS_RUNS).map(|_| get(port, &small).2).collect();
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                (loaded, loaders.into_iter().map(|l| l.join().unwrap()).sum::<usize>())
            });
            fairness.push((*si, median(alone), median(loaded), heavy_done));
        }
    }
    for (si, mut peer) in peers {
        let rss = common::proc_status_bytes(peer.child.id(), "VmRSS") >> 20;
        println!("{}: RSS after the queries {rss} MiB", servers[si]);
        if kept.is_some() {
            // Kept data: a graceful stop, so the next start does not replay a whole WAL.
            // SAFETY: signalling our own child process, whose PID is still ours until `wait`.
            unsafe { libc::kill(peer.child.id() as libc::pid_t, libc::SIGTERM) };
        } else {
            let _ = peer.child.kill();
        }
        let _ = peer.child.wait();
    }
    println!(
        "\n{instances} instances, {} scrapes per series over {}, rate windows {window}; the whole range at {STEP_S} s step (instant: at the end), median of {runs} runs, ms (series returned)",
        scrapes.len(),
        shape.describe()
    );
    println!(
        "{:<28} {:>18} {:>18} {:>18} {:>18} {:>10} {:>10} {:>10}",
        "query", "strata", "prometheus", "victoria-metrics", "strata-baseline", "vs prom", "vs vm", "vs base"
    );
    let cell = |r: &Option<(Duration, usize)>| match r {
        Some((d, n)) => format!("{:.1} ({n})", d.as_secs_f64() * 1000.0),
        None => "-".into(),
    };
    for (qi, (label, _, _)) in QUERIES.iter().enumerate() {
        let r = &results[qi];
        let ratio = |other: &Option<(Duration, usize)>| match (&r[0], other) {
            (Some((s, _)), Some((o, _))) => format!("{:.2}x", o.as_secs_f64() / s.as_secs_f64()),
            _ => "-".into(),
        };
        println!(
            "{label:<28} {:>18} {:>18} {:>18} {:>18} {:>10} {:>10} {:>10}",
            cell(&r[0]),
            cell(&r[1]),
            cell(&r[2]),
            cell(&r[3]),
            ratio(&r[1]),
            ratio(&r[2]),
            ratio(&r[3])
        );
    }
    if !fairness.is_empty() {
        println!(
            "\nfairness: `{FAIRNESS_SMALL}` over (at most) 1 h alone and while `{FAIRNESS_HEAVY}` over the range runs back to back on {FAIRNESS_HEAVY_CONNECTIONS} other connections; median of {FAIRNESS_RUNS}, ms (goal: at most 2x)"
        );
        println!("{:<20} {:>10} {:>14} {:>10} {:>14}", "server", "alone", "beside heavy", "slowdown", "heavy answered");
        for (si, alone, loaded, heavy_done) in &fairness {
            println!(
                "{:<20} {:>10.1} {:>14.1} {:>9.2}x {:>14}",
                servers[*si],
                alone.as_secs_f64() * 1000.0,
                loaded.as_secs_f64() * 1000.0,
                loaded.as_secs_f64() / alone.as_secs_f64(),
                heavy_done
            );
        }
    }
    if !refreshes.is_empty() {
        println!("\nstrata's result cache: the range moved by one step ({STEP_S} s) per request, median of {runs}, ms");
        println!("(gzip: asked for as Grafana asks, timed to the last byte received, before decompressing)");
        println!(
            "{:<28} {:>12} {:>12} {:>10} {:>12} {:>12} {:>10}",
            "query", "evaluated", "refresh", "speed-up", "gzip eval.", "gzip refr.", "speed-up"
        );
        let ms = |d: &Duration| d.as_secs_f64() * 1000.0;
        for (label, cold, warm, cold_gz, warm_gz) in &refreshes {
            println!(
                "{label:<28} {:>12.1} {:>12.1} {:>9.1}x {:>12.1} {:>12.1} {:>9.1}x",
                ms(cold),
                ms(warm),
                ms(cold) / ms(warm),
                ms(cold_gz),
                ms(warm_gz),
                ms(cold_gz) / ms(warm_gz)
            );
        }
    }
}
