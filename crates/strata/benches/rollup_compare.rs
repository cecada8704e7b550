//! Long-range dashboards over rollup tiers: Strata reading its 5m/1h tiers against Strata
//! reading raw samples and against VictoriaMetrics (which has no downsampling in its free
//! version: it reads raw samples), on the same data, in one run.
//!
//! `cargo bench -p strata --bench rollup_compare [-- INSTANCES [DAYS [RUNS]]]` (defaults 1000,
//! 30, 5; `cargo build --release -p strata` first).
//!
//! Data: INSTANCES instances, each with a counter (`requests_total`, increments of 0–20 per
//! scrape, a reset now and then) and two gauges (`temperature`, a decimal random walk;
//! `queue_depth`, small integers), scraped every 60 s with timestamps jittered by up to
//! ±250 ms, for DAYS days ending at the last whole hour. Strata gets it as a backfill, a day
//! at a time through `Db::import_head` (what `strata tsdb import` does) into a directory with
//! tiers `5m:forever,1h:forever` and raw data kept forever (so the raw answer covers the whole
//! range too), compacted as the server would; the server is then started on it. Debian's
//! `victoria-metrics` (result cache off, retention 100 years) gets the same samples through
//! `/api/v1/import` and is force-merged. Debian's Prometheus 2.42 (retention 100 years) gets
//! them as blocks written by `promtool tsdb create-blocks-from openmetrics`, a day's OpenMetrics
//! file at a time, and is started on them once they are written, then left to compact them
//! until idle (Prometheus has no downsampling either: it reads raw samples).
//!
//! `RAW_RETENTION_DAYS=N` loads the same samples into a second Strata directory that keeps raw
//! data for N days only, as a server started with `--retention Nd` would hold them: raw blocks
//! compacted to at most a tenth of N days (18 h blocks for 15 days), older raw data deleted once
//! rolled up, so its tiers are split as a live server's are (blocks of the last N days follow
//! the raw ones: 18 buckets per 1 h chunk). Its tier answers are timed as "tier Nd" and checked
//! against the first directory's raw answers.
//!
//! Each query (a 30-day dashboard at a 1 h step, `start` aligned to the step as Grafana sends
//! it) runs once per server to warm up, then RUNS rounds, each asking every server in turn (the
//! order rotating). The table shows the median wall time per request (HTTP, evaluation, JSON),
//! what each read (raw samples, or the buckets a tier answer's stats report), and the
//! ratios; Strata's tier answer is checked against its raw answer (1e-9 relative). Then the
//! disk: raw blocks, each tier, VictoriaMetrics' data directory.

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::{get, urlencode, Peer};
use strata_model::Labels;
use strata_tsdb::rollup::RollupTier;

const HOUR_MS: i64 = 3_600_000;
const DAY_MS: i64 = 24 * HOUR_MS;
const SCRAPE_MS: i64 = 60_000;
const METRICS: [&str; 3] = ["requests_total", "temperature", "queue_depth"];

/// One series' generator: deterministic per (instance, metric), carried from day to day.
struct Gen {
    rng: u64,
    value: f64,
}

impl Gen {
    fn new(instance: usize, metric: usize) -> Gen {
        Gen {
            rng: 0x9e37_79b9_7f4a_7c15 ^ ((instance as u64) << 8 | metric as u64).wrapping_mul(0xff51_afd7_ed55_8ccd),
            value: 0.0,
        }
    }

    fn next(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// The samples of one day from `day_start`.
    fn day(&mut self, metric: usize, day_start: i64, out: &mut Vec<(i64, f64)>) {
        out.clear();
        let mut t = day_start;
        while t < day_start + DAY_MS {
            let r = self.next();
            let at = t + (r % 501) as i64 - 250;
            self.value = match metric {
                0 if r.is_multiple_of(5000) => 0.0,
                0 => self.value + (r >> 16) as f64 % 21.0,
                1 => ((self.value + ((r >> 16) % 201) as f64 / 100.0 - 1.0) * 100.0).round() / 100.0,
                _ => ((r >> 16) % 50) as f64,
            };
            out.push((at, self.value));
            t += SCRAPE_MS;
        }
    }
}

fn labels(instance: usize, metric: usize) -> Labels {
    Labels::from_pairs([("__name__", METRICS[metric].to_string()), ("instance", format!("host-{instance:04}"))])
}

/// Load times: Strata, VictoriaMetrics, promtool.
struct LoadTimes {
    strata: Duration,
    /// Loading the `RAW_RETENTION_DAYS` directory.
    short: Duration,
    vm: Duration,
    promtool: Duration,
}

/// Writes the data into Strata's directory, VictoriaMetrics and (with `prom`, a directory)
/// Prometheus blocks through promtool, a day at a time.
#[allow(clippy::too_many_arguments, reason = "a bench's load step, called once")]
fn load(
    dir: &std::path::Path,
    short: Option<(&std::path::Path, i64)>,
    vm: Option<&Peer>,
    prom: Option<&std::path::Path>,
    instances: usize,
    days: i64,
    start: i64,
) -> LoadTimes {
    let db = common::backfill_db(dir, tiers(), None);
    let short_db = short.map(|(dir, days)| common::backfill_db_retaining(dir, tiers(), None, days * DAY_MS));
    let mut short_time = Duration::ZERO;
    let mut gens: Vec<Gen> = (0..instances).flat_map(|i| (0..METRICS.len()).map(move |m| Gen::new(i, m))).collect();
    let (mut strata_time, mut vm_time, mut promtool_time) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let mut samples = Vec::new();
    for d in 0..days {
        let day_start = start + d * DAY_MS;
        let head = common::backfill_head();
        let mut body = String::new();
        let mut om = String::new();
        let t0 = Instant::now();
        let mut gen_time = Duration::ZERO;
        for (k, g) in gens.iter_mut().enumerate() {
            let (i, m) = (k / METRICS.len(), k % METRICS.len());
            let g0 = Instant::now();
            g.day(m, day_start, &mut samples);
            gen_time += g0.elapsed();
            let mut app = head.appender();
            let l = labels(i, m);
            for &(t, v) in &samples {
                app.append(&l, t, v).unwrap();
            }
            app.commit().unwrap();
            if vm.is_some() {
                let g0 = Instant::now();
                body.push_str(&format!(
                    "{{\"metric\":{{\"__name__\":\"{}\",\"instance\":\"host-{i:04}\"}},\"values\":[",
                    METRICS[m]
                ));
                for (j, (_, v)) in samples.iter().enumerate() {
                    body.push_str(if j == 0 { "" } else { "," });
                    body.push_str(&v.to_string());
                }
                body.push_str("],\"timestamps\":[");
                for (j, (t, _)) in samples.iter().enumerate() {
                    body.push_str(if j == 0 { "" } else { "," });
                    body.push_str(&t.to_string());
                }
                body.push_str("]}\n");
                gen_time += g0.elapsed();
            }
            if prom.is_some() {
                let g0 = Instant::now();
                for &(t, v) in &samples {
                    om.push_str(&format!(
                        "{}{{instance=\"host-{i:04}\"}} {v} {}.{:03}\n",
                        METRICS[m],
                        t.div_euclid(1000),
                        t.rem_euclid(1000)
                    ));
                }
                gen_time += g0.elapsed();
            }
        }
        db.import_head(&head).unwrap();
        db.compact().unwrap();
        strata_time += t0.elapsed() - gen_time;
        if let Some(short_db) = &short_db {
            let t0 = Instant::now();
            short_db.import_head(&head).unwrap();
            short_db.compact().unwrap();
            short_time += t0.elapsed();
        }
        if let Some(vm) = vm {
            let t0 = Instant::now();
            post(vm.port, "/api/v1/import", body.as_bytes());
            vm_time += t0.elapsed();
        }
        if let Some(prom) = prom {
            om.push_str("# EOF\n");
            let file = prom.join("day.om");
            std::fs::write(&file, &om).unwrap();
            let t0 = Instant::now();
            let out = std::process::Command::new("promtool")
                .args(["tsdb", "create-blocks-from", "openmetrics", "-q"])
                .arg(&file)
                .arg(prom.join("data"))
                .output()
                .unwrap();
            assert!(out.status.success(), "promtool: {}", String::from_utf8_lossy(&out.stderr));
            promtool_time += t0.elapsed();
            std::fs::remove_file(&file).unwrap();
        }
        eprint!("\rloaded day {}/{days}", d + 1);
    }
    eprintln!();
    let t0 = Instant::now();
    db.compact().unwrap();
    db.close().unwrap();
    strata_time += t0.elapsed();
    if let Some(short_db) = short_db {
        let t0 = Instant::now();
        short_db.compact().unwrap();
        short_db.close().unwrap();
        short_time += t0.elapsed();
    }
    LoadTimes { strata: strata_time, short: short_time, vm: vm_time, promtool: promtool_time }
}

fn tiers() -> Vec<RollupTier> {
    vec![RollupTier::new(300_000, 0), RollupTier::new(HOUR_MS, 0)]
}

fn post(port: u16, path: &str, body: &[u8]) {
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(conn, "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len())
        .unwrap();
    conn.write_all(body).unwrap();
    let mut r = std::io::BufReader::new(conn);
    let (status, resp) = common::read_response(&mut r).unwrap();
    assert!(status < 300, "POST {path}: {status} {}", String::from_utf8_lossy(&resp));
}

/// The matrix of a query_range response: labels → points.
fn matrix(body: &str) -> Vec<(String, Vec<(f64, f64)>)> {
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    let mut out: Vec<(String, Vec<(f64, f64)>)> = v["data"]["result"]
        .as_array()
        .unwrap_or_else(|| panic!("no result in {}", &body[..body.len().min(300)]))
        .iter()
        .map(|s| {
            let points = s["values"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| (p[0].as_f64().unwrap(), p[1].as_str().unwrap().parse::<f64>().unwrap()))
                .collect();
            (s["metric"].to_string(), points)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The buckets a tier answer read (its stats, asked with `stats=all`); `None` for an answer
/// from raw samples (no tier info annotation).
fn buckets_read(body: &str) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_str(body).ok()?;
    v["infos"].as_array()?.iter().find(|i| i.as_str().is_some_and(|s| s.contains("rollup tier")))?;
    v["data"]["stats"]["samples"]["totalQueryableSamples"].as_u64()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let instances: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(1000);
    let days: i64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(30);
    let runs: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(5);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let end = now.div_euclid(HOUR_MS) * HOUR_MS;
    let start = end - days * DAY_MS;
    let tmp = tempfile::tempdir().unwrap();
    // `ROLLUP_DATA_DIR=path`: Strata's data is loaded there once and reused by later runs with
    // the same arguments (for profiling the queries); VictoriaMetrics is then left out.
    let kept = std::env::var_os("ROLLUP_DATA_DIR").map(std::path::PathBuf::from);
    let samples = instances as u64 * METRICS.len() as u64 * (days * DAY_MS / SCRAPE_MS) as u64;
    println!(
        "{instances} instances × {} series × {days} days at {}s: {samples} samples",
        METRICS.len(),
        SCRAPE_MS / 1000
    );

    let strata_dir = kept.clone().unwrap_or_else(|| tmp.path().join("strata"));
    let reuse = strata_dir.join("data").exists();
    let short_days: Option<i64> =
        std::env::var("RAW_RETENTION_DAYS").ok().map(|v| v.parse().expect("RAW_RETENTION_DAYS"));
    let short_dir = short_days.map(|n| {
        let mut name = strata_dir.clone().into_os_string();
        name.push(format!("-raw{n}d"));
        std::path::PathBuf::from(name)
    });
    let short_reuse = short_dir.as_ref().is_none_or(|d| d.join("data").exists());
    let vm = if kept.is_some() { None } else { start_vm(&tmp.path().join("vm")) };
    let promtool = std::process::Command::new("promtool").arg("--version").output().is_ok_and(|o| o.status.success());
    if !promtool && kept.is_none() {
        println!("promtool is not installed (Debian's prometheus package): no Prometheus");
    }
    let prom_dir = (promtool && kept.is_none()).then(|| tmp.path().join("prometheus"));
    if let Some(p) = &prom_dir {
        std::fs::create_dir_all(p.join("data")).unwrap();
    }
    let times = if reuse && short_reuse {
        LoadTimes { strata: Duration::ZERO, short: Duration::ZERO, vm: Duration::ZERO, promtool: Duration::ZERO }
    } else {
        // Both directories are loaded together, from the same days: never one into the other's
        // leftovers (a second import would put every sample in twice).
        assert!(
            !reuse && short_dir.as_ref().is_none_or(|d| !d.join("data").exists()),
            "ROLLUP_DATA_DIR holds one of the two directories but not the other: remove it"
        );
        let short_data = short_dir.as_ref().map(|d| d.join("data"));
        let short = short_data.as_deref().zip(short_days);
        load(&strata_dir.join("data"), short, vm.as_ref(), prom_dir.as_deref(), instances, days, start)
    };
    println!(
        "load: strata {:.1} s (import and compaction, rollups included){}{}{}",
        times.strata.as_secs_f64(),
        short_days
            .map_or(String::new(), |n| format!(", strata with {n} d of raw data {:.1} s", times.short.as_secs_f64())),
        vm.as_ref()
            .map_or(String::new(), |_| format!(", victoria-metrics {:.1} s (import API)", times.vm.as_secs_f64())),
        prom_dir.as_ref().map_or(String::new(), |_| format!(
            ", prometheus {:.1} s (promtool create-blocks-from, a day at a time)",
            times.promtool.as_secs_f64()
        ))
    );
    if let Some(vm) = &vm {
        let (status, _, _) = get(vm.port, "/internal/force_merge");
        assert_eq!(status, 200);
        get(vm.port, "/internal/force_flush");
        std::thread::sleep(Duration::from_secs(10));
        common::wait_idle(vm.child.id(), Duration::from_secs(600));
    }
    // Prometheus on the promtool blocks, left to compact them until it idles.
    let prometheus = prom_dir.as_ref().and_then(|p| {
        let peer = common::start("prometheus", p, &["--storage.tsdb.retention.time=100y".into()])?;
        common::wait_idle(peer.child.id(), Duration::from_secs(1800));
        Some(peer)
    });
    let strata = common::start(
        "strata",
        &strata_dir,
        // The result cache off: the table compares evaluations, raw against tiers.
        &[
            "--retention".into(),
            "0".into(),
            "--storage.rollup-tiers".into(),
            "5m:forever,1h:forever".into(),
            "--query.cache-size".into(),
            "0".into(),
        ],
    )
    .expect("target/release/strata (cargo build --release -p strata)");
    let short_strata = short_dir.as_ref().zip(short_days).map(|(dir, n)| {
        let args = [
            "--retention",
            &format!("{n}d"),
            "--storage.rollup-tiers",
            "5m:forever,1h:forever",
            "--query.cache-size",
            "0",
        ];
        common::start("strata", dir, &args.map(String::from)).expect("target/release/strata")
    });

    let queries = [
        ("sum(rate(requests_total[1h]))", "sum of rates"),
        ("sum by (instance) (increase(requests_total[1h]))", "increase per instance"),
        ("avg(avg_over_time(temperature[1h]))", "average gauge"),
        ("max(max_over_time(queue_depth[1h]))", "peak gauge"),
        ("quantile(0.9, temperature)", "plain selector"),
    ];
    let step = HOUR_MS / 1000;
    let (qs, qe) = ((start + HOUR_MS) / 1000, end / 1000);
    let url = |q: &str, resolution: &str| {
        format!("/api/v1/query_range?query={}&start={qs}&end={qe}&step={step}{resolution}", urlencode(q))
    };
    let mut servers: Vec<(&str, u16, &str)> =
        vec![("strata raw", strata.port, "&max_source_resolution=raw"), ("strata tier", strata.port, "")];
    // Peers are optional: their columns show "-" when absent.
    let vm_column = vm.as_ref().map(|vm| {
        servers.push(("victoria-metrics", vm.port, ""));
        servers.len() - 1
    });
    let prom_column = prometheus.as_ref().map(|p| {
        servers.push(("prometheus", p.port, ""));
        servers.len() - 1
    });
    let short_column = short_strata.as_ref().map(|p| {
        servers.push(("strata tier, short raw retention", p.port, ""));
        servers.len() - 1
    });
    let short_name = short_days.map_or(String::new(), |n| format!("tier {n}d"));
    println!(
        "\n{:<24} {:>12} {:>12} {:>12} {:>12} {:>9} {:>9} {:>9} {:>12} {:>9}  read (raw samples → buckets)",
        format!("query ({days} d, 1 h step)"),
        "strata raw",
        "strata tier",
        "VM 1.79",
        "Prom 2.42",
        "raw/tier",
        "VM/tier",
        "Prom/tier",
        short_name,
        "raw/short"
    );
    for (q, name) in queries {
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); servers.len()];
        let mut bodies: Vec<String> = vec![String::new(); servers.len()];
        for (k, (_, port, res)) in servers.iter().enumerate() {
            let (status, body, _) = get(*port, &format!("{}&stats=all", url(q, res)));
            assert_eq!(status, 200, "{q}: {body}");
            bodies[k] = body;
        }
        for round in 0..runs {
            for j in 0..servers.len() {
                let k = (round + j) % servers.len();
                let (_, port, res) = servers[k];
                let (_, _, took) = get(port, &url(q, res));
                times[k].push(took.as_secs_f64() * 1000.0);
            }
        }
        // Each tier's answer is the raw one.
        let raw = matrix(&bodies[0]);
        for k in std::iter::once(1).chain(short_column) {
            let tier = matrix(&bodies[k]);
            assert_eq!(raw.len(), tier.len(), "{q} ({}): series", servers[k].0);
            for ((la, pa), (lb, pb)) in raw.iter().zip(&tier) {
                assert_eq!(la, lb);
                assert_eq!(pa.len(), pb.len(), "{q} {la} ({}): points", servers[k].0);
                for (a, b) in pa.iter().zip(pb) {
                    assert!(
                        a.0 == b.0 && (a.1 - b.1).abs() <= 1e-9 * a.1.abs().max(b.1.abs()).max(1.0),
                        "{q} {la} ({}): {a:?} vs {b:?}",
                        servers[k].0
                    );
                }
            }
        }
        let m: Vec<f64> = times.into_iter().map(common::median).collect();
        let metric_samples = samples / METRICS.len() as u64;
        let time = |c: Option<usize>| c.map_or("-".into(), |c| format!("{:.1}ms", m[c]));
        let ratio = |c: Option<usize>| c.map_or("-".into(), |c| format!("{:.1}×", m[c] / m[1]));
        println!(
            "{:<24} {:>10.1}ms {:>10.1}ms {:>12} {:>12} {:>8.1}× {:>9} {:>9} {:>12} {:>9}  {metric_samples} → {}",
            name,
            m[0],
            m[1],
            time(vm_column),
            time(prom_column),
            m[0] / m[1],
            ratio(vm_column),
            ratio(prom_column),
            time(short_column),
            short_column.map_or("-".into(), |c| format!("{:.1}×", m[0] / m[c])),
            buckets_read(&bodies[1]).map_or("raw (no tier)".into(), |b| b.to_string()),
        );
    }
    let mut strata = strata;
    let _ = strata.child.kill();
    let _ = strata.child.wait();
    if let Some(mut p) = short_strata {
        let _ = p.child.kill();
        let _ = p.child.wait();
    }
    let raw_bytes: u64 = std::fs::read_dir(strata_dir.join("data"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().join("meta.json").exists())
        .map(|e| common::dir_bytes(&e.path()))
        .sum();
    println!("\ndisk: strata raw blocks {raw_bytes} B ({:.3} B/sample)", raw_bytes as f64 / samples as f64);
    for t in tiers() {
        let b = common::dir_bytes(&strata_dir.join("data/rollups").join(t.dir_name()));
        let buckets = samples * SCRAPE_MS as u64 / t.interval_ms as u64;
        println!(
            "      strata {} tier {b} B ({:.3} B/bucket, {:.1}% of raw)",
            t.dir_name(),
            b as f64 / buckets as f64,
            100.0 * b as f64 / raw_bytes as f64
        );
    }
    if let Some((dir, n)) = short_dir.as_ref().zip(short_days) {
        let blocks = |d: std::path::PathBuf| {
            std::fs::read_dir(d).map_or(0, |es| es.flatten().filter(|e| e.path().join("meta.json").exists()).count())
        };
        let raw_blocks = blocks(dir.join("data"));
        let tier_blocks: Vec<String> = tiers()
            .iter()
            .map(|t| {
                let d = dir.join("data/rollups").join(t.dir_name());
                format!("{} tier {} blocks, {} B", t.dir_name(), blocks(d.clone()), common::dir_bytes(&d))
            })
            .collect();
        println!("      strata with {n} d of raw data: {raw_blocks} raw blocks; {}", tier_blocks.join("; "));
    }
    if let Some(mut p) = prometheus {
        let b = common::dir_bytes(&tmp.path().join("prometheus/data"));
        println!("      prometheus {b} B ({:.3} B/sample)", b as f64 / samples as f64);
        let _ = p.child.kill();
        let _ = p.child.wait();
    }
    if let Some(mut vm) = vm {
        let b = common::dir_bytes(&tmp.path().join("vm/data"));
        println!("      victoria-metrics {b} B ({:.3} B/sample)", b as f64 / samples as f64);
        let _ = vm.child.kill();
        let _ = vm.child.wait();
    }
}

fn start_vm(dir: &std::path::Path) -> Option<Peer> {
    let peer = common::start(
        "victoria-metrics",
        dir,
        &[
            "-search.disableCache".into(),
            "-retentionPeriod=100y".into(),
            "-search.maxPointsPerTimeseries=100000".into(),
        ],
    );
    if peer.is_none() {
        println!("victoria-metrics is not installed: Strata only");
    }
    peer
}
