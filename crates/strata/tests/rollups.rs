//! Rollup tiers through the binary, as an operator uses them: a month of history imported,
//! the server started with tiers, dashboards asked at a 1 h step with and without
//! `max_source_resolution=raw`, the tiers written by compaction, shown by `strata status` and
//! `/metrics`, and the answers unchanged once they are read from the tiers' blocks.

mod support;

use std::io::Write;
use std::process::Command;

use support::{http, sample_value, Server};

const HOUR_S: i64 = 3600;

fn strata(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_strata")).args(args).output().unwrap();
    assert!(out.status.success(), "strata {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// Three instances' request counters (resets now and then) and temperatures, every 15 s
/// (jittered) for 3 days ending at `end`, as OpenMetrics.
fn history(path: &std::path::Path, end: i64) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    writeln!(f, "# TYPE requests counter").unwrap();
    let start = end - 3 * 24 * HOUR_S;
    for i in 0..3 {
        let mut counter = 0u64;
        let mut t = start * 1000;
        let mut k = 0u64;
        while t < end * 1000 {
            k += 1;
            counter = if k.is_multiple_of(2000) { 0 } else { counter + (k * 7 + i) % 13 };
            let at = t + ((k * 31 + i * 7) % 400) as i64;
            writeln!(f, "requests_total{{instance=\"i{i}\"}} {counter} {}.{:03}", at / 1000, at % 1000).unwrap();
            t += 15_000;
        }
    }
    writeln!(f, "# TYPE temperature gauge").unwrap();
    for i in 0..3 {
        let mut t = start * 1000;
        let mut k = 0u64;
        while t < end * 1000 {
            k += 1;
            let v = ((k * 37 + i * 11) % 1000) as f64 / 10.0;
            writeln!(f, "temperature{{instance=\"i{i}\"}} {v} {}.{:03}", t / 1000, 0).unwrap();
            t += 15_000;
        }
    }
    writeln!(f, "# EOF").unwrap();
}

/// Series of a query_range response: labels (as JSON), points `(t, value)`.
type Matrix = Vec<(String, Vec<(f64, f64)>)>;

/// The matrix of a query_range response, and its infos.
fn matrix(body: &str) -> (Matrix, Vec<String>) {
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["status"], "success", "{body}");
    let series = v["data"]["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let points = s["values"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| (p[0].as_f64().unwrap(), p[1].as_str().unwrap().parse().unwrap()))
                .collect();
            (s["metric"].to_string(), points)
        })
        .collect();
    let infos =
        v["infos"].as_array().map_or(Vec::new(), |a| a.iter().map(|i| i.as_str().unwrap().to_string()).collect());
    (series, infos)
}

fn query(port: u16, q: &str, start: i64, end: i64, extra: &str) -> (Matrix, Vec<String>) {
    let q: String = form_urlencoded::byte_serialize(q.as_bytes()).collect();
    let (status, body) =
        http(port, "GET", &format!("/api/v1/query_range?query={q}&start={start}&end={end}&step=3600{extra}"), &[], b"");
    assert_eq!(status, 200, "{body}");
    matrix(&body)
}

const QUERIES: [&str; 4] = [
    "sum(rate(requests_total[1h]))",
    "increase(requests_total[2h])",
    "max_over_time(temperature[1h])",
    "avg(temperature)",
];

/// Every query at a 1 h step, read from a tier, equals the raw answer.
fn tier_answers_are_raw_answers(port: u16, start: i64, end: i64) {
    for q in QUERIES {
        let (raw, raw_infos) = query(port, q, start, end, "&max_source_resolution=raw");
        let (tier, infos) = query(port, q, start, end, "");
        assert!(!raw.is_empty() && raw.iter().all(|(_, p)| p.len() > 40), "{q}: {raw:?}");
        assert!(!raw_infos.iter().any(|i| i.contains("rollup tier")), "{q}: {raw_infos:?}");
        assert!(infos.iter().any(|i| i.contains("answered from the 5m rollup tier")), "{q}: {infos:?}");
        assert_eq!(raw.len(), tier.len(), "{q}");
        for ((la, pa), (lb, pb)) in raw.iter().zip(&tier) {
            assert_eq!(la, lb, "{q}");
            assert_eq!(pa.len(), pb.len(), "{q} {la}");
            for (a, b) in pa.iter().zip(pb) {
                assert!(a.0 == b.0 && (a.1 - b.1).abs() <= 1e-9 * a.1.abs().max(1.0), "{q} {la}: {a:?} vs {b:?}");
            }
        }
    }
}

#[test]
fn dashboards_read_rollup_tiers_and_answer_as_raw_data_does() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let d = dir.to_str().unwrap();
    let end = support::now_ms() / 1000 / HOUR_S * HOUR_S;
    let file = tmp.path().join("history.om");
    history(&file, end);
    strata(&["tsdb", "import", "openmetrics", file.to_str().unwrap(), d]);
    let flags = ["--retention", "0", "--storage.rollup-tiers", "1m:forever,5m:forever"];
    let (start, last) = (end - 3 * 24 * HOUR_S + 2 * HOUR_S, end);

    // Nothing rolled up yet: the tier's buckets come from raw data as it is read.
    let mut server = Server::start(&dir, &flags);
    tier_answers_are_raw_answers(server.port, start, last);
    let (status, body) = http(
        server.port,
        "GET",
        "/api/v1/query_range?query=up&start=0&end=60&step=60&max_source_resolution=banana",
        &[],
        b"",
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("max_source_resolution"), "{body}");
    // Tiers in the wrong order are refused at start, naming the tier.
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args([
            "serve",
            "--data-dir",
            tmp.path().join("other").to_str().unwrap(),
            "--storage.rollup-tiers",
            "1h:30d,5m:90d",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("rollup tier 5m:90d"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    server.terminate();

    // Compaction rolls the blocks up; status and /metrics show the tiers.
    let out = strata(&["tsdb", "compact", d]);
    assert!(out.contains("rolled up") && !out.contains("rolled up 0 blocks"), "{out}");
    let analyzed = strata(&["tsdb", "analyze", d]);
    assert!(analyzed.contains("rollup tiers:") && analyzed.contains("5m:forever:"), "{analyzed}");
    // 15 s samples in 5-minute buckets: 20 per bucket.
    let fewer = analyzed
        .lines()
        .skip_while(|l| !l.contains("5m:forever:"))
        .find_map(|l| l.split("bytes: ").nth(1)?.split('×').next()?.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("{analyzed}"));
    assert!((15.0..=25.0).contains(&fewer), "{fewer}: {analyzed}");
    let status = strata(&["status", "--data-dir", d]);
    assert!(status.lines().any(|l| l.starts_with("rollup 5m:") && !l.contains(" 0 block(s)")), "{status}");
    let mut server = Server::start(&dir, &flags);
    let (_, metrics) = http(server.port, "GET", "/metrics", &[], b"");
    let blocks_line = metrics.lines().find(|l| l.starts_with("strata_tsdb_rollup_tier_blocks{tier=\"5m\"}")).unwrap();
    assert!(!blocks_line.ends_with(" 0"), "{blocks_line}");
    // Read from the tiers' blocks now: the same answers.
    tier_answers_are_raw_answers(server.port, start, last);
    range_queries_are_cached_beside_tiers(server.port, start, last);
    server.terminate();
}

/// With tiers configured, range queries go through the result cache, kept by the source the
/// planner reads (raw data, a tier): a query read raw (a 15 s step, no multiple of a tier's
/// interval) and one the 5m tier answers (a 1 h step on the hour) are each a hit when asked
/// again, and, moved by a step, equal the uncached answer byte for byte.
fn range_queries_are_cached_beside_tiers(port: u16, start: i64, end: i64) {
    let count = |result: &str| -> f64 {
        let (_, metrics) = http(port, "GET", "/metrics", &[], b"");
        let series = format!("strata_query_cache_requests_total{{result=\"{result}\"}}");
        sample_value(&metrics, &series).unwrap_or_else(|| panic!("{series}: {metrics}"))
    };
    // Two hours back: every step older than the cache's delay (steps newer are not kept,
    // and a second request would be a partial hit).
    let end = end - 2 * HOUR_S;
    let get = |q: &str, from: i64, step: i64, extra: &str| -> String {
        let q: String = form_urlencoded::byte_serialize(q.as_bytes()).collect();
        let path = format!("/api/v1/query_range?query={q}&start={from}&end={end}&step={step}{extra}");
        let (status, body) = http(port, "GET", &path, &[], b"");
        assert_eq!(status, 200, "{body}");
        body
    };
    let q = "sum(rate(requests_total[5m]))";
    for (from, step, tier) in [(end - 6 * HOUR_S, 15, false), (start, 3600, true)] {
        let hits = count("hit");
        let first = get(q, from, step, "");
        assert_eq!(first.contains("answered from the 5m rollup tier"), tier, "{first}");
        assert_eq!(get(q, from, step, ""), first);
        assert_eq!(count("hit"), hits + 1.0, "step {step}");
        assert_eq!(get(q, from + step, step, ""), get(q, from + step, step, "&nocache=1"), "step {step}");
    }
}

const SCHEMAS: &str = "[default]\npattern = .*\nretentions = 60s:1d,10m:30d,1h:1y\n";
const AGGREGATION: &str =
    "[max]\npattern = \\.max$\nxFilesFactor = 0\naggregationMethod = max\n[default]\npattern = .*\nxFilesFactor = 0.5\naggregationMethod = average\n";
const PATHS: [&str; 3] = ["servers.a.load", "servers.b.max", "servers.c.load"];

/// Twenty days of three Graphite paths, a point a minute ending at `end`: a quarter stamped on
/// the minute itself (carbon senders often do), the rest jittered inside it; `servers.c.load`
/// with gaps (every seventh minute, so its 10-minute intervals hold 8 or 9 points and an hourly
/// average of their averages is not the average of its points; and six hours on day 9). As
/// OpenMetrics with quoted names.
fn graphite_history(path: &std::path::Path, end: i64) -> Vec<Vec<(i64, f64)>> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let start = end - 20 * 24 * HOUR_S;
    let mut all = Vec::new();
    for (p, name) in PATHS.iter().enumerate() {
        let mut points = Vec::new();
        for k in 0..(20 * 24 * 60) as i64 {
            let t = start + 60 * k + if k % 4 == 0 { 0 } else { (k * 7 + p as i64) % 59 };
            if p == 2 && (k % 7 == 0 || (9 * 1440..9 * 1440 + 360).contains(&k)) {
                continue;
            }
            let v = ((k * 37 + p as i64 * 11) % 1000) as f64 / 8.0 - 20.0;
            writeln!(f, "{{\"{name}\"}} {v} {t}").unwrap();
            points.push((t * 1000, v));
        }
        all.push(points);
    }
    writeln!(f, "# EOF").unwrap();
    all
}

/// `/render` of the three paths over `[now - span, now]`: each path's (start, step, values).
fn render(port: u16, span: i64, now: i64) -> Vec<(String, i64, i64, Vec<Option<f64>>)> {
    let q = format!("/render?target=servers.*.*&from={}&until={now}&now={now}&format=json", now - span);
    let (status, body) = http(port, "GET", &q, &[], b"");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let points = s["datapoints"].as_array().unwrap();
            let times: Vec<i64> = points.iter().map(|p| p[1].as_i64().unwrap()).collect();
            let values = points.iter().map(|p| p[0].as_f64()).collect();
            (s["target"].as_str().unwrap().to_owned(), times[0], times[1] - times[0], values)
        })
        .collect()
}

/// Graphite paths under a retention schema: the server derives left-closed tiers from the
/// schema, `/render` reads the 10-minute archive of a 15-day range and the hourly one of a
/// 60-day range from them, and answers as whisper would over every point (`render::fetch`,
/// which `strata-graphite`'s whisper reference test holds to whisper itself): before the
/// tiers have blocks, and after raw retention (3 days) deleted the raw data they hold.
#[test]
fn graphite_renders_read_the_tiers_of_their_retention_schema_as_whisper_would() {
    use strata_graphite::render::fetch;
    use strata_graphite::schema::Schemas;

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let d = dir.to_str().unwrap();
    let end = support::now_ms() / 1000 / HOUR_S * HOUR_S;
    let file = tmp.path().join("graphite.om");
    let points = graphite_history(&file, end);
    strata(&["tsdb", "import", "openmetrics", file.to_str().unwrap(), d]);
    let (schemas_file, aggregation_file) = (tmp.path().join("schemas.conf"), tmp.path().join("aggregation.conf"));
    std::fs::write(&schemas_file, SCHEMAS).unwrap();
    std::fs::write(&aggregation_file, AGGREGATION).unwrap();
    let flags = [
        "--retention",
        "3d",
        "--graphite.storage-schemas",
        schemas_file.to_str().unwrap(),
        "--graphite.storage-aggregation",
        aggregation_file.to_str().unwrap(),
    ];
    let schemas = Schemas::parse(SCHEMAS, Some(AGGREGATION)).unwrap();
    let now = end - 1;
    let check = |port: u16| {
        for (span, archive_step) in [(15 * 24 * HOUR_S, 600), (60 * 24 * HOUR_S, HOUR_S)] {
            let got = render(port, span, now);
            assert_eq!(got.len(), 3, "{got:?}");
            for ((name, start, step, values), samples) in got.iter().zip(&points) {
                let policy = schemas.policy(name);
                let (want_start, _, want_step, want) = fetch(samples, &policy, now - span, now, now).unwrap();
                assert_eq!((*start, *step), (want_start, want_step), "{name} over {span} s");
                assert_eq!(*step, archive_step);
                assert_eq!(values.len(), want.len(), "{name} over {span} s");
                let known = want.iter().flatten().count();
                assert!(known > 300, "{name} over {span} s: {known} known values");
                // Exact: the 10-minute archive from the 10-minute tier's intervals, the hourly
                // one from whisper's hourly values the hourly tier keeps (for the path with
                // gaps, averages of 10-minute averages, not of its minutes).
                for (i, (g, w)) in values.iter().zip(&want).enumerate() {
                    let same = match (g, w) {
                        (Some(g), Some(w)) => (g - w).abs() <= 1e-9 * w.abs().max(1.0),
                        (None, None) => true,
                        _ => false,
                    };
                    assert!(
                        same,
                        "{name} over {span} s, value {i} at {}: {g:?}, whisper {w:?}",
                        start + i as i64 * step
                    );
                }
            }
        }
    };

    // The imported blocks are not rolled up yet: the tiers' intervals are aggregated from raw
    // data as it is read.
    let mut server = Server::start(&dir, &flags);
    check(server.port);
    let (_, metrics) = http(server.port, "GET", "/metrics", &[], b"");
    assert!(metrics.contains("strata_tsdb_rollup_tier_blocks{tier=\"10m-left\"} 0"), "{metrics}");
    assert!(metrics.contains("strata_tsdb_rollup_tier_blocks{tier=\"1h-left\"} 0"), "{metrics}");
    server.terminate();

    // Rolled up by the schemas, as the server rolls up, and raw data older than 3 days deleted:
    // the tiers alone hold it, the hourly one with whisper's hourly values.
    // (The server's flags: the same retention and schema files.)
    let out = strata(&[&["tsdb", "compact", d][..], &flags[..]].concat());
    assert!(out.contains("retention deleted") && !out.contains("retention deleted 0 blocks"), "{out}");
    let old = strata(&["tsdb", "dump", d, "--max-time", &((end - 10 * 24 * HOUR_S) * 1000).to_string()]);
    assert!(old.is_empty(), "raw data 10 days old is still there: {}", &old[..old.len().min(200)]);
    let status = strata(&["status", "--data-dir", d]);
    assert!(status.lines().any(|l| l.starts_with("rollup 10m:") && l.contains("left")), "{status}");
    let server = Server::start(&dir, &flags);
    check(server.port);
    let (_, metrics) = http(server.port, "GET", "/metrics", &[], b"");
    let tier_reads = sample_value(&metrics, "strata_graphite_render_series_tier_total").unwrap();
    assert_eq!(tier_reads, 6.0, "{metrics}");
    assert!(metrics.contains("strata_graphite_render_tier_archive_missing_total 0\n"), "{metrics}");
    drop(server);

    // A chunk limit (samples + 2 × series: 40) far below what the 60 days' raw chunks take
    // (the last 3 days' raw samples alone are over 150 chunks) but above what the hourly
    // tier's take: 18 to 24, as its blocks fall with the hour of day the test runs (a limit
    // of 20 failed at some hours).
    let mut limited = flags.to_vec();
    limited.extend(["--query.max-series", "3", "--query.max-samples", "34"]);
    let server = Server::start(&dir, &limited);
    let got = render(server.port, 60 * 24 * HOUR_S, now);
    assert_eq!(got.len(), 3, "{got:?}");
    drop(server);
    // A render of the last 23 hours reads raw samples (the schema's finest archive, a day):
    // over 20 chunks, refused under a limit of 7.
    let mut tight = flags.to_vec();
    tight.extend(["--query.max-series", "3", "--query.max-samples", "1"]);
    let server = Server::start(&dir, &tight);
    let (status, body) = http(
        server.port,
        "GET",
        &format!("/render?target=servers.*.*&from={}&until={now}&now={now}&format=json", now - 23 * HOUR_S),
        &[],
        b"",
    );
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("chunks") || body.contains("samples"), "{body}");
}
