//! Graphite dashboards over long ranges: `/render` reading a path's coarse archives from the
//! left-closed rollup tiers its retention schema gives, against the same server reading every
//! raw point, on the same data, in one run. (VictoriaMetrics' open-source build has no
//! `/render`; graphite-web over whisper is compared for answers, not speed, by the tests.)
//!
//! `cargo bench -p strata --bench graphite_rollup_compare [-- PATHS [DAYS [RUNS]]]` (defaults
//! 1000, 30, 5; `cargo build --release -p strata` first).
//!
//! Data: PATHS paths `servers.host-NNNN.load`, a point a minute for DAYS days ending at the
//! last whole hour, a quarter stamped on the minute and the rest jittered inside it (as carbon
//! senders stamp), a decimal random walk; backfilled a day at a time through `Db::import_head`
//! (what `strata tsdb import` does) into a directory with the tiers the schema
//! `60s:1d,10m:7d,1h:1y` derives with raw data kept forever (`10m:forever:left,
//! 1h:forever:left`, the hourly tier keeping whisper's hourly values), compacted as the server
//! would. The server then runs twice on it: with
//! the schema (renders read the tiers), and with the schema but a hand-set left-closed tier
//! that fits none of its archives (renders read raw points; the answers must be the same).
//!
//! Each render runs once per server to warm up, then RUNS rounds alternating the two servers;
//! the table shows the median wall time per request (HTTP, reading, JSON) and the ratio.

mod common;

use std::time::{Duration, Instant};

use common::{get, urlencode};
use strata_model::Labels;
use strata_tsdb::rollup::RollupTier;

const HOUR_MS: i64 = 3_600_000;
const DAY_MS: i64 = 24 * HOUR_MS;
const SCHEMA: &str = "[default]\npattern = .*\nretentions = 60s:1d,10m:7d,1h:1y\n";

fn tiers() -> Vec<RollupTier> {
    vec![RollupTier::left(600_000, 0), RollupTier::left(HOUR_MS, 0)]
}

fn load(dir: &std::path::Path, paths: usize, days: i64, start: i64) -> Duration {
    // As the server rolls up with the schema: the tiers keep the paths it serves, and the
    // hourly tier whisper's hourly values.
    let schemas = strata_graphite::schema::Schemas::parse(SCHEMA, None).unwrap();
    let filter = strata_server::http::graphite_rollup_filter(std::sync::Arc::new(schemas));
    let db = common::backfill_db(dir, tiers(), Some(filter));
    let mut values: Vec<(u64, f64)> = (0..paths).map(|p| (0x9e37_79b9_7f4a_7c15 ^ (p as u64 + 1) << 20, 0.0)).collect();
    let t0 = Instant::now();
    for d in 0..days {
        let day_start = start + d * DAY_MS;
        let head = common::backfill_head();
        for (p, (rng, value)) in values.iter_mut().enumerate() {
            let labels = Labels::from_pairs([("__name__", format!("servers.host-{p:04}.load"))]);
            let mut app = head.appender();
            for minute in 0..24 * 60 {
                *rng ^= *rng << 13;
                *rng ^= *rng >> 7;
                *rng ^= *rng << 17;
                let jitter = if rng.is_multiple_of(4) { 0 } else { (*rng >> 8) % 60 } as i64 * 1000;
                *value = ((*value + ((*rng >> 16) % 201) as f64 / 100.0 - 1.0) * 100.0).round() / 100.0;
                app.append(&labels, day_start + minute * 60_000 + jitter, *value).unwrap();
            }
            app.commit().unwrap();
        }
        db.import_head(&head).unwrap();
        db.compact().unwrap();
        eprint!("\rloaded day {}/{days}", d + 1);
    }
    eprintln!();
    db.compact().unwrap();
    db.close().unwrap();
    t0.elapsed()
}

/// A rendered series: its name and (timestamp, value) pairs.
type Rendered = (String, Vec<(i64, Option<f64>)>);

/// The series of a render.
fn series(body: &str) -> Vec<Rendered> {
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    v.as_array()
        .unwrap_or_else(|| panic!("not a render answer: {}", &body[..body.len().min(300)]))
        .iter()
        .map(|s| {
            let points = s["datapoints"].as_array().unwrap();
            let points = points.iter().map(|p| (p[1].as_i64().unwrap(), p[0].as_f64())).collect();
            (s["target"].as_str().unwrap().to_owned(), points)
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let paths: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(1000);
    let days: i64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(30);
    let runs: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(5);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let end = now.div_euclid(HOUR_MS) * HOUR_MS;
    let start = end - days * DAY_MS;
    let points = paths as u64 * (days * 24 * 60) as u64;
    println!("{paths} paths × {days} days at 60 s: {points} points; schema 60s:1d,10m:7d,1h:1y");
    let tmp = tempfile::tempdir().unwrap();
    // `GRAPHITE_DATA_DIR=path`: the data is loaded there once and reused by later runs with the
    // same arguments (for profiling the renders).
    let kept = std::env::var_os("GRAPHITE_DATA_DIR").map(std::path::PathBuf::from);
    let dir = kept.unwrap_or_else(|| tmp.path().join("strata"));
    if !dir.join("data").exists() {
        let took = load(&dir.join("data"), paths, days, start);
        println!("load: {:.1} s (import and compaction, rollups included)", took.as_secs_f64());
    }
    let schema = tmp.path().join("storage-schemas.conf");
    std::fs::write(&schema, SCHEMA).unwrap();
    let base =
        ["--retention".to_string(), "0".into(), "--graphite.storage-schemas".into(), schema.display().to_string()];
    let start_server = |extra: &[&str]| {
        let mut flags = base.to_vec();
        flags.extend(extra.iter().map(|s| s.to_string()));
        common::start("strata", &dir, &flags).expect("target/release/strata (cargo build --release -p strata)")
    };

    // The data's end: a reused directory's newest hour.
    let end = match std::fs::read_to_string(dir.join("end")) {
        Ok(s) => s.trim().parse().unwrap(),
        Err(_) => {
            std::fs::write(dir.join("end"), end.to_string()).unwrap();
            end
        }
    };
    let now_s = end / 1000 - 1;
    let renders = [
        (format!("servers.*.load, {days} d"), "servers.*.load".to_string(), days),
        (format!("sumSeries, {days} d"), "sumSeries(servers.*.load)".into(), days),
        ("servers.*.load, 7 d".into(), "servers.*.load".into(), 7.min(days)),
        (format!("one path, {days} d"), "servers.host-0007.load".into(), days),
    ];
    let url = |target: &str, days: i64| {
        format!(
            "/render?target={}&from={}&until={now_s}&now={now_s}&format=json",
            urlencode(target),
            now_s - days * 86_400
        )
    };
    // Answers and times per server: the tier-reading one first.
    let mut times: Vec<[Vec<f64>; 2]> = vec![[Vec::new(), Vec::new()]; renders.len()];
    let mut bodies: Vec<[String; 2]> = vec![[String::new(), String::new()]; renders.len()];
    let mut tier_series = 0.0;
    for (k, extra) in [&[][..], &["--storage.rollup-tiers", "7m:forever:left"][..]].iter().enumerate() {
        let mut server = start_server(extra);
        for (i, (_, target, d)) in renders.iter().enumerate() {
            let (status, body, _) = get(server.port, &url(target, *d));
            assert_eq!(status, 200, "{target}: {body}");
            bodies[i][k] = body;
            for _ in 0..runs {
                let (_, _, took) = get(server.port, &url(target, *d));
                times[i][k].push(took.as_secs_f64() * 1000.0);
            }
        }
        if k == 0 {
            tier_series = common::counter(server.port, "strata_graphite_render_series_tier_total");
            // The hourly tier kept whisper's values for every interval: no path moved on to
            // the 10-minute tier.
            let missing = common::counter(server.port, "strata_graphite_render_tier_archive_missing_total");
            assert_eq!(missing, 0.0, "series read from a finer tier than the archive's");
        } else {
            assert_eq!(
                common::counter(server.port, "strata_graphite_render_series_tier_total"),
                0.0,
                "raw run read a tier"
            );
        }
        let _ = server.child.kill();
        let _ = server.child.wait();
    }
    assert!(tier_series > 0.0, "no render read a tier");
    println!("\n{:<28} {:>12} {:>12} {:>9}  points per path", "render", "raw", "tier", "raw/tier");
    for (i, (name, _, _)) in renders.iter().enumerate() {
        let (tier, raw) = (series(&bodies[i][0]), series(&bodies[i][1]));
        assert_eq!(tier.len(), raw.len(), "{name}: series");
        for ((na, pa), (nb, pb)) in tier.iter().zip(&raw) {
            assert_eq!((na, pa.len()), (nb, pb.len()), "{name}");
            for (a, b) in pa.iter().zip(pb) {
                let same = a.0 == b.0
                    && match (a.1, b.1) {
                        (Some(x), Some(y)) => (x - y).abs() <= 1e-9 * x.abs().max(1.0),
                        (x, y) => x == y,
                    };
                assert!(same, "{name} {na}: tier {a:?}, raw {b:?}");
            }
        }
        let (t, r) = (common::median(times[i][0].clone()), common::median(times[i][1].clone()));
        println!("{:<28} {:>10.1}ms {:>10.1}ms {:>8.1}×  {}", name, r, t, r / t, tier[0].1.len());
    }
}
