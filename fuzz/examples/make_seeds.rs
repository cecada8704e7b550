//! Writes the starting corpus of every binary target into `fuzz/corpus/<target>/`: real bytes
//! from Strata's own encoders (a block written by the block writer, chunks of every encoding,
//! WAL records of every type, remote write 1.0/2.0 and remote read requests), so the fuzzer
//! starts past the magic numbers and checksums instead of rediscovering them. The text targets'
//! seeds (queries, exposition, YAML) are cut from files by `fuzz/seed-text.sh`.
//!
//! Run from `fuzz/`: `cargo run --release --example make_seeds`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use strata_model::histogram::{CounterResetHint, FloatHistogram, Span};
use strata_model::{Labels, SeriesRef};
use strata_server::remote;
use strata_tsdb::block::meta::Compaction;
use strata_tsdb::block::writer::{BlockWriter, ChunkInput};
use strata_tsdb::block::{tombstones, BlockMeta};
use strata_tsdb::chunkenc::histogram::{HistogramAppender, Layout};
use strata_tsdb::chunkenc::start_time::{self, StartTimeWriter};
use strata_tsdb::chunkenc::xor::XorAppender;
use strata_tsdb::record::{self, RefSample, Tombstone};

fn corpus(target: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus").join(target);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn put(target: &str, name: &str, bytes: &[u8]) {
    std::fs::write(corpus(target).join(name), bytes).unwrap();
}

/// A scrape-like series: 10 s interval with a few ms of jitter, a slowly rising counter.
fn samples(n: usize, seed: i64) -> Vec<(i64, f64)> {
    (0..n as i64)
        .map(|i| (1_700_000_000_000 + i * 10_000 + (i * 7 + seed) % 13, (i * (seed + 3)) as f64 * 0.5))
        .collect()
}

fn histogram(i: usize) -> FloatHistogram {
    FloatHistogram {
        hint: CounterResetHint::Unknown,
        schema: 3,
        zero_threshold: 1e-128,
        zero_count: i as f64,
        count: 10.0 + i as f64 * 4.0,
        sum: 100.5 + i as f64,
        positive_spans: vec![Span { offset: 0, length: 2 }, Span { offset: 3, length: 1 }],
        negative_spans: vec![],
        positive_buckets: vec![1.0 + i as f64, 2.0, 3.0 + i as f64],
        negative_buckets: vec![],
        custom_values: vec![],
    }
}

fn xor_chunk(n: usize, seed: i64) -> (i64, i64, Vec<u8>) {
    let mut app = XorAppender::new();
    let s = samples(n, seed);
    for &(t, v) in &s {
        app.append(t, v);
    }
    (s[0].0, s[n - 1].0, app.into_bytes())
}

fn histogram_chunk(n: usize) -> Vec<u8> {
    let first = histogram(0);
    let mut app = HistogramAppender::new(Layout::of(&first), CounterResetHint::NotReset);
    for i in 0..n {
        app.append(1_700_000_000_000 + i as i64 * 15_000, &histogram(i));
    }
    app.into_bytes()
}

fn with_start_times(base: &[u8], ts: &[i64]) -> Vec<u8> {
    let mut col = StartTimeWriter::new();
    for &t in ts {
        col.push(t, 1_699_999_000_000);
    }
    start_time::join(base, &col)
}

fn chunks() {
    let (_, _, xor) = xor_chunk(120, 1);
    put("chunk", "xor-120", &xor);
    put("chunk", "xor-1", &xor_chunk(1, 2).2);
    let ts: Vec<i64> = samples(120, 1).iter().map(|s| s.0).collect();
    put("chunk", "xor-start-times", &with_start_times(&xor, &ts));
    let h = histogram_chunk(20);
    put("chunk", "histogram-20", &h);
    let hts: Vec<i64> = (0..20).map(|i| 1_700_000_000_000 + i * 15_000).collect();
    put("chunk", "histogram-start-times", &with_start_times(&h, &hts));
}

fn block() {
    let tmp = std::env::temp_dir().join(format!("strata-seeds-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let series: Vec<Labels> = (0..20)
        .map(|i| {
            Labels::from_pairs([
                ("__name__", if i % 2 == 0 { "node_cpu_seconds_total" } else { "up" }),
                ("instance", &*format!("host-{:02}:9100", i / 2)),
                ("job", "node"),
            ])
        })
        .collect();
    let mut symbols: Vec<Arc<str>> =
        series.iter().flat_map(|l| l.iter().flat_map(|p| [p.name.clone(), p.value.clone()])).collect();
    symbols.sort();
    symbols.dedup();
    let mut sorted = series.clone();
    sorted.sort();
    let mut w = BlockWriter::create(&strata_tsdb::vfs::OsFs::shared(), &tmp, &symbols).unwrap();
    let (mint, maxt) = (1_700_000_000_000, 1_700_000_000_000 + 240 * 10_000);
    for (i, l) in sorted.iter().enumerate() {
        let (a0, a1, a) = xor_chunk(120, i as i64);
        let (_, b1, b) = {
            let mut app = XorAppender::new();
            let s: Vec<(i64, f64)> = samples(120, i as i64).iter().map(|&(t, v)| (t + 1_200_000, v)).collect();
            for &(t, v) in &s {
                app.append(t, v);
            }
            (s[0].0, s[119].0, app.into_bytes())
        };
        let b0 = a1 + 10_000;
        w.add_series(l, &[ChunkInput { mint: a0, maxt: a1, data: &a }, ChunkInput { mint: b0, maxt: b1, data: &b }])
            .unwrap();
    }
    let meta = w.finish(mint, maxt, Compaction { level: 1, ..Default::default() }).unwrap().unwrap();
    let dir = tmp.join(meta.ulid.to_string());
    put("block_index", "index-20-series", &std::fs::read(dir.join("index")).unwrap());
    put("block_meta", "meta.json", &std::fs::read(dir.join("meta.json")).unwrap());
    let read = BlockMeta::read(&strata_tsdb::vfs::OsFs, &dir).unwrap();
    assert_eq!(read.ulid, meta.ulid);
    std::fs::remove_dir_all(&tmp).unwrap();

    let mut stones = tombstones::Tombstones::new();
    stones.insert(1, vec![(1_700_000_000_000, 1_700_000_100_000)]);
    stones.insert(7, vec![(i64::MIN, -1), (5, i64::MAX)]);
    put("tombstones", "two-series", &tombstones::encode(&stones));
    put("tombstones", "empty", &tombstones::encode(&Default::default()));
}

fn wal_records() {
    let labels = [
        Labels::from_pairs([("__name__", "up"), ("job", "node")]),
        Labels::from_pairs([("__name__", "http_requests_total"), ("code", "200"), ("job", "api")]),
    ];
    let mut buf = Vec::new();
    record::encode_series(labels.iter().enumerate().map(|(i, l)| (SeriesRef(i as u64 + 1), l)), &mut buf);
    put("wal_record", "series", &buf);
    let s: Vec<RefSample> = samples(30, 1)
        .iter()
        .enumerate()
        .map(|(i, &(t, v))| RefSample { series: SeriesRef(1 + i as u64 % 2), t, st: 0, v })
        .collect();
    buf.clear();
    record::encode_samples(&s, &mut buf);
    put("wal_record", "samples", &buf);
    let with_st: Vec<RefSample> = s.iter().map(|x| RefSample { st: x.t - 60_000, ..*x }).collect();
    buf.clear();
    record::encode_samples(&with_st, &mut buf);
    put("wal_record", "samples-start-times", &buf);
    let h: Vec<record::RefHistogram> = (0..5)
        .map(|i| record::RefHistogram {
            series: SeriesRef(2),
            t: 1_700_000_000_000 + i * 15_000,
            st: 0,
            h: histogram(i as usize),
        })
        .collect();
    buf.clear();
    record::encode_histograms(&h, &mut buf);
    put("wal_record", "histograms", &buf);
    buf.clear();
    record::encode_tombstones(&[Tombstone { series: SeriesRef(1), mint: 0, maxt: 1_700_000_000_000 }], &mut buf);
    put("wal_record", "tombstones", &buf);
}

fn remote() {
    let req = remote::WriteRequest {
        timeseries: (0..5)
            .map(|i| remote::TimeSeries {
                labels: vec![
                    remote::Label::new("__name__", "node_load1"),
                    remote::Label::new("instance", format!("host-{i}:9100")),
                    remote::Label::new("job", "node"),
                ],
                samples: samples(10, i).iter().map(|&(t, v)| remote::Sample { value: v, timestamp: t }).collect(),
                histograms: if i == 0 {
                    vec![remote::Histogram::from_float(1_700_000_000_000, &histogram(1))]
                } else {
                    vec![]
                },
            })
            .collect(),
        metadata: vec![],
    };
    let raw = prost::Message::encode_to_vec(&req);
    put("remote_write", "v1-raw", &[&[0u8][..], &raw].concat());
    put("remote_write", "v1-snappy", &[&[2u8][..], &remote::encode(&req)].concat());
    let s1 = samples(10, 1);
    let v2 = remote::v2::request(&[
        (vec![("__name__", "up"), ("job", "node")], s1.clone()),
        (vec![("__name__", "node_load5"), ("instance", "a:9100")], s1),
    ]);
    put("remote_write", "v2-raw", &[&[1u8][..], &prost::Message::encode_to_vec(&v2)].concat());
    put("remote_write", "v2-snappy", &[&[3u8][..], &remote::encode(&v2)].concat());

    let read = remote::ReadRequest {
        queries: vec![remote::Query {
            start_timestamp_ms: 1_700_000_000_000,
            end_timestamp_ms: 1_700_000_300_000,
            matchers: vec![
                remote::LabelMatcher { r#type: 0, name: "__name__".into(), value: "up".into() },
                remote::LabelMatcher { r#type: 2, name: "job".into(), value: "no.*".into() },
            ],
        }],
        accepted_response_types: vec![0, 1],
    };
    put("remote_read", "two-matchers", &remote::encode(&read));
}

fn main() {
    chunks();
    block();
    wal_records();
    remote();
    println!("seeds written under {}", Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus").display());
}
