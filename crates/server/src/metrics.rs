//! `/metrics`: Strata's own metrics in the Prometheus text format, named like Prometheus' where
//! the meaning is the same (`prometheus_tsdb_*` becomes `strata_tsdb_*`), so existing dashboards
//! translate directly. The output parses with our own text parser, so Strata can store it.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use strata_tsdb::Db;

use crate::scrape::ScrapeManager;

/// How stale the head's memory gauges may be: walking every series' state took ~0.1 s of CPU
/// per million series (85 ms per `/metrics` read at 1M carbon paths), and `/metrics` may be
/// read many times a second.
const HEAD_MEMORY_MAX_AGE: Duration = Duration::from_secs(5);

/// Latency buckets in seconds, as Prometheus' HTTP and query histograms use.
const BUCKETS: [f64; 12] = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0];

#[derive(Debug, Default)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        for (i, b) in BUCKETS.iter().enumerate() {
            if s <= *b {
                self.counts[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        for (i, b) in BUCKETS.iter().enumerate() {
            let _ =
                writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{b}\"}} {}", self.counts[i].load(Ordering::Relaxed));
        }
        let n = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {n}");
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let braces = if labels.is_empty() { String::new() } else { format!("{{{labels}}}") };
        let _ = writeln!(out, "{name}_sum{braces} {sum}");
        let _ = writeln!(out, "{name}_count{braces} {n}");
    }
}

/// Counters the HTTP layer updates.
#[derive(Debug, Default)]
pub struct ServerMetrics {
    /// Requests by (handler, status code).
    http_requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    http_duration: Mutex<BTreeMap<&'static str, std::sync::Arc<Histogram>>>,
    pub remote_write_samples_received: AtomicU64,
    pub remote_write_samples_rejected: AtomicU64,
    pub remote_write_series_invalid: AtomicU64,
    /// Exemplars remote write refused (out of order, labels too long or invalid, no series).
    pub remote_write_exemplars_rejected: AtomicU64,
    /// OTLP samples (a histogram's bucket, sum and count are one each) stored and refused.
    pub otlp_samples_received: AtomicU64,
    pub otlp_samples_rejected: AtomicU64,
    pub queries: AtomicU64,
    pub queries_failed: AtomicU64,
    /// Queries stopped because their client went away (the flag raised when the request
    /// handler is dropped, seen by the evaluation).
    pub queries_canceled: AtomicU64,
    pub query_duration: Histogram,
    /// Request handlers that panicked (each failed its request with a 500).
    pub handler_panics: AtomicU64,
    /// Queries refused at parse time for nesting deeper than the limit.
    pub queries_too_deep: AtomicU64,
    /// Series `/render` answered from their raw samples and from a left-closed rollup tier.
    pub graphite_render_series_raw: AtomicU64,
    pub graphite_render_series_tier: AtomicU64,
    /// Series a tier keeping archive values could not answer exactly (some interval without
    /// one), moved on to a finer tier.
    pub graphite_render_tier_archive_missing: AtomicU64,
    /// The listener's connection counters.
    pub connections: std::sync::Arc<crate::web::ConnectionStats>,
    /// The carbon listeners' counters (shown once a listener serves).
    pub carbon: std::sync::Arc<crate::carbon::CarbonStats>,
}

impl ServerMetrics {
    pub fn observe_request(&self, handler: &'static str, code: u16, took: Duration) {
        *self.http_requests.lock().entry((handler, code)).or_default() += 1;
        let h = self.http_duration.lock().entry(handler).or_default().clone();
        h.observe(took);
    }

    /// Everything, in the text exposition format.
    pub fn render(&self, db: Option<&Db>, scrape: Option<&ScrapeManager>) -> String {
        let mut o = String::with_capacity(8192);
        family(&mut o, "strata_build_info", "Build information.", "gauge");
        let _ = writeln!(o, "strata_build_info{{version=\"{}\"}} 1", env!("CARGO_PKG_VERSION"));
        family(&mut o, "strata_http_requests_total", "HTTP requests by handler and status code.", "counter");
        for ((h, code), n) in self.http_requests.lock().iter() {
            let _ = writeln!(o, "strata_http_requests_total{{handler=\"{h}\",code=\"{code}\"}} {n}");
        }
        family(&mut o, "strata_http_request_duration_seconds", "HTTP request latency by handler.", "histogram");
        for (h, hist) in self.http_duration.lock().iter() {
            hist.render(&mut o, "strata_http_request_duration_seconds", &format!("handler=\"{h}\""));
        }
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        singles(
            &mut o,
            &[
                (
                    "strata_remote_write_samples_received_total",
                    "Samples received by remote write.",
                    "counter",
                    load(&self.remote_write_samples_received),
                ),
                (
                    "strata_remote_write_samples_rejected_total",
                    "Samples remote write refused.",
                    "counter",
                    load(&self.remote_write_samples_rejected),
                ),
                (
                    "strata_remote_write_exemplars_rejected_total",
                    "Exemplars remote write refused: out of order, labels too long or invalid, or of a series the head does not have.",
                    "counter",
                    load(&self.remote_write_exemplars_rejected),
                ),
                (
                    "strata_remote_write_series_invalid_total",
                    "Series with invalid labels in remote write.",
                    "counter",
                    load(&self.remote_write_series_invalid),
                ),
                (
                    "strata_otlp_samples_received_total",
                    "Samples converted from OTLP data points (a histogram point gives several).",
                    "counter",
                    load(&self.otlp_samples_received),
                ),
                (
                    "strata_otlp_samples_rejected_total",
                    "OTLP samples or data points refused (delta temporality, bad values, the head's refusals).",
                    "counter",
                    load(&self.otlp_samples_rejected),
                ),
                (
                    "strata_graphite_render_series_raw_total",
                    "Series /render answered from raw samples (the finest archive, or no rollup tier fits).",
                    "counter",
                    load(&self.graphite_render_series_raw),
                ),
                (
                    "strata_graphite_render_series_tier_total",
                    "Series /render answered from a rollup tier (a coarse archive of their retention schema).",
                    "counter",
                    load(&self.graphite_render_series_tier),
                ),
                (
                    "strata_graphite_render_tier_archive_missing_total",
                    "Series a rollup tier could not answer with whisper's archive values (intervals rolled up without the retention schema, or cut by a block boundary), read from a finer tier instead.",
                    "counter",
                    load(&self.graphite_render_tier_archive_missing),
                ),
                (
                    "strata_http_handler_panics_total",
                    "Request handlers that panicked; each request failed with 500 and the server went on.",
                    "counter",
                    load(&self.handler_panics),
                ),
                (
                    "strata_http_connections_accepted_total",
                    "HTTP connections accepted.",
                    "counter",
                    load(&self.connections.accepted),
                ),
                ("strata_http_connections_open", "HTTP connections open.", "gauge", load(&self.connections.open)),
                (
                    "strata_http_connections_max",
                    "Most HTTP connections open at once (--web.max-connections); more wait to be accepted.",
                    "gauge",
                    load(&self.connections.limit),
                ),
                (
                    "strata_http_connections_failed_total",
                    "HTTP connections that ended in an error (slow or oversized request head, reset, failed TLS handshake).",
                    "counter",
                    load(&self.connections.failed),
                ),
                (
                    "strata_http_tls_handshake_failures_total",
                    "TLS handshakes that failed or timed out.",
                    "counter",
                    load(&self.connections.tls_handshake_failures),
                ),
                (
                    "strata_engine_queries_too_deep_total",
                    "Queries refused for nesting deeper than the parser's limit.",
                    "counter",
                    load(&self.queries_too_deep),
                ),
                ("strata_engine_queries_total", "Queries evaluated.", "counter", load(&self.queries)),
                (
                    "strata_engine_queries_failed_total",
                    "Queries that ended in an error.",
                    "counter",
                    load(&self.queries_failed),
                ),
                (
                    "strata_engine_queries_canceled_total",
                    "Queries stopped because their client went away.",
                    "counter",
                    load(&self.queries_canceled),
                ),
            ],
        );
        family(&mut o, "strata_engine_query_duration_seconds", "Query latency.", "histogram");
        self.query_duration.render(&mut o, "strata_engine_query_duration_seconds", "");
        if let Some(db) = db {
            render_db(&mut o, db);
        }
        if let Some(s) = scrape {
            render_scrape(&mut o, s);
        }
        if self.carbon.max_connections.load(Ordering::Relaxed) > 0 {
            self.carbon.render(&mut o);
        }
        o
    }
}

fn render_scrape(o: &mut String, m: &ScrapeManager) {
    let st = &m.stats;
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
    family(o, "strata_scrape_targets", "Targets scraped, by job.", "gauge");
    for (job, n) in m.target_counts() {
        let _ = writeln!(o, "strata_scrape_targets{{job={job:?}}} {n}");
    }
    singles(
        o,
        &[
            ("strata_scrapes_total", "Scrapes attempted.", "counter", load(&st.scrapes)),
            (
                "strata_scrapes_failed_total",
                "Scrapes that failed (target down, bad body, limits).",
                "counter",
                load(&st.failed),
            ),
            (
                "strata_scrape_samples_appended_total",
                "Samples appended by scrapes, report series and stale markers included.",
                "counter",
                load(&st.samples_appended),
            ),
            (
                "strata_scrape_exemplars_rejected_total",
                "Scraped exemplars the head refused: older than their series' newest, or labels too long.",
                "counter",
                load(&st.exemplars_rejected),
            ),
            (
                "strata_scrape_sample_limit_exceeded_total",
                "Scrapes refused for exceeding sample_limit.",
                "counter",
                load(&st.sample_limit_exceeded),
            ),
            (
                "strata_sd_file_read_errors_total",
                "Service discovery reads that failed: file_sd files that could not be read or parsed, http_sd fetches that failed or answered badly, kubernetes_sd watches and clients that failed.",
                "counter",
                m.sd_file_errors() as f64,
            ),
        ],
    );
    family(o, "strata_scrape_samples_rejected_total", "Scraped samples the head refused, by reason.", "counter");
    for (reason, v) in
        [("out_of_order", &st.out_of_order), ("duplicate", &st.duplicate), ("out_of_bounds", &st.out_of_bounds)]
    {
        let _ = writeln!(o, "strata_scrape_samples_rejected_total{{reason=\"{reason}\"}} {}", load(v));
    }
}

/// `# HELP` and `# TYPE` lines of a metric family.
fn family(o: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// Families of one unlabelled sample each: (name, help, type, value).
fn singles(o: &mut String, rows: &[(&str, &str, &str, f64)]) {
    for &(name, help, kind, v) in rows {
        family(o, name, help, kind);
        let _ = writeln!(o, "{name} {v}");
    }
}

/// The outcome of configuration reloads, as Prometheus' `prometheus_config_last_reload_*`.
pub fn render_config_reload(o: &mut String, success: bool, applied_at_seconds: f64) {
    singles(
        o,
        &[
            (
                "strata_config_last_reload_successful",
                "Whether the last configuration reload applied (1) or was refused (0).",
                "gauge",
                f64::from(u8::from(success)),
            ),
            (
                "strata_config_last_reload_success_timestamp_seconds",
                "When the running configuration was applied (at start, or by the last reload that applied).",
                "gauge",
                applied_at_seconds,
            ),
        ],
    );
}

/// The range query result cache's requests by outcome, its size and what it dropped.
pub fn render_query_cache(o: &mut String, cache: &crate::query_cache::QueryCache) {
    let s = &cache.stats;
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    family(
        o,
        "strata_query_cache_requests_total",
        "Range queries by what the result cache did: hit (answered from kept steps), partial (kept steps and the rest evaluated), miss (nothing kept), bypass (not cacheable or turned off).",
        "counter",
    );
    for (result, n) in [("hit", &s.hits), ("partial", &s.partial_hits), ("miss", &s.misses), ("bypass", &s.bypassed)] {
        let _ = writeln!(o, "strata_query_cache_requests_total{{result=\"{result}\"}} {}", load(n));
    }
    singles(
        o,
        &[
            ("strata_query_cache_bytes", "Bytes of kept range results.", "gauge", cache.bytes() as f64),
            ("strata_query_cache_entries", "Kept range results.", "gauge", cache.entries() as f64),
            (
                "strata_query_cache_evictions_total",
                "Kept results dropped to stay within --query.cache-size.",
                "counter",
                load(&s.evictions) as f64,
            ),
            (
                "strata_query_cache_invalidations_total",
                "Kept results cut back because data behind them changed (late or out-of-order writes, deletions, retention).",
                "counter",
                load(&s.invalidations) as f64,
            ),
        ],
    );
}

/// The `process_*` families `/proc/self` gave (`crate::process`).
pub fn render_process(o: &mut String, stats: &crate::process::ProcessStats) {
    singles(o, &stats.families());
}

fn render_db(o: &mut String, db: &Db) {
    let head = db.head();
    let st = &head.stats;
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
    singles(
        o,
        &[
            ("strata_tsdb_head_series", "Series in the head.", "gauge", head.num_series() as f64),
            (
                "strata_tsdb_head_samples_appended_total",
                "Samples appended to the head.",
                "counter",
                load(&st.samples_appended),
            ),
            (
                "strata_tsdb_head_samples_appended_late_total",
                "Samples appended to the head out of order, inside the out-of-order window (also in samples_appended_total).",
                "counter",
                load(&st.samples_appended_late),
            ),
            (
                "strata_tsdb_exemplar_exemplars_appended_total",
                "Exemplars stored (as Prometheus' prometheus_tsdb_exemplar_exemplars_appended_total).",
                "counter",
                load(&head.exemplars.stats.appended),
            ),
            (
                "strata_tsdb_exemplar_out_of_order_exemplars_total",
                "Exemplars refused for being older than their series' newest.",
                "counter",
                load(&head.exemplars.stats.out_of_order),
            ),
            (
                "strata_tsdb_exemplar_max_exemplars",
                "How many exemplars the head keeps (storage.exemplars.max_exemplars).",
                "gauge",
                head.exemplars.capacity() as f64,
            ),
            (
                "strata_tsdb_head_series_created_total",
                "Series created in the head.",
                "counter",
                load(&st.series_created),
            ),
            (
                "strata_tsdb_head_chunks_created_total",
                "Chunks created in the head.",
                "counter",
                load(&st.chunks_created),
            ),
        ],
    );
    let (cache_bytes, cache_groups, hits, misses) = strata_tsdb::block::GroupCache::global().stats();
    let (series_bytes, series_entries, series_hits, series_misses) = strata_tsdb::block::SeriesCache::global().stats();
    singles(
        o,
        &[
            (
                "strata_tsdb_chunk_cache_bytes",
                "Bytes of block chunk groups and index frames held for queries, decompressed or as chunk offsets (--storage.chunk-cache-size).",
                "gauge",
                cache_bytes as f64,
            ),
            ("strata_tsdb_chunk_cache_groups", "Chunk groups and index frames held.", "gauge", cache_groups as f64),
            ("strata_tsdb_chunk_cache_hits_total", "Chunk and index reads served by a cached group or frame.", "counter", hits as f64),
            (
                "strata_tsdb_chunk_cache_misses_total",
                "Chunk and index reads that had to read their group or frame from its file (checksum, decompression).",
                "counter",
                misses as f64,
            ),
            (
                "strata_tsdb_series_cache_bytes",
                "Bytes of block series entries (labels and chunk references) held for queries (--storage.series-cache-size).",
                "gauge",
                series_bytes as f64,
            ),
            ("strata_tsdb_series_cache_entries", "Block series entries held.", "gauge", series_entries as f64),
            (
                "strata_tsdb_series_cache_hits_total",
                "Block series entries a selection found held.",
                "counter",
                series_hits as f64,
            ),
            (
                "strata_tsdb_series_cache_misses_total",
                "Block series entries a cached selection read from their index.",
                "counter",
                series_misses as f64,
            ),
            (
                "strata_tsdb_rollup_bucket_buffers_bytes",
                "Bytes of bucket buffers kept between rollup tier reads (at most 16 MiB).",
                "gauge",
                strata_tsdb::rollup::buffers::kept_bytes() as f64,
            ),
        ],
    );
    let (files, file_bytes) = head.chunk_files_usage();
    let names = head.names_stats();
    singles(
        o,
        &[
            (
                "strata_tsdb_head_chunks_written_total",
                "Closed head chunks written out of the heap into head chunk files.",
                "counter",
                load(&st.chunks_written),
            ),
            ("strata_tsdb_head_chunk_files", "Head chunk files (data/chunks_head).", "gauge", files as f64),
            (
                "strata_tsdb_head_chunk_files_bytes",
                "Bytes of the head chunk files (mapped).",
                "gauge",
                file_bytes as f64,
            ),
            (
                "strata_tsdb_wal_shortenings_total",
                "Rounds that wrote head chunks out and checkpointed the WAL to drop their samples.",
                "counter",
                load(&db.stats().wal_shortenings),
            ),
            (
                "strata_tsdb_head_chunk_write_passes_total",
                "Passes over the head writing closed chunks out to shorten the WAL, checkpointed or not.",
                "counter",
                load(&db.stats().chunk_write_passes),
            ),
            (
                "strata_tsdb_head_names_dictionary_nodes",
                "Metric names and path nodes in the head's names dictionaries (what finds and name regexes walk).",
                "gauge",
                names.dictionary_nodes as f64,
            ),
            (
                "strata_tsdb_head_names_dictionaries",
                "The head's names dictionaries: the main one and the sorted lists (levels) of names folded in since it was built.",
                "gauge",
                names.dictionaries as f64,
            ),
            (
                "strata_tsdb_head_names_delta",
                "Metric names created since the last fold into a names dictionary (searched name by name).",
                "gauge",
                names.delta_names as f64,
            ),
        ],
    );
    let mem = head.memory_recent(HEAD_MEMORY_MAX_AGE);
    family(
        o,
        "strata_tsdb_head_memory_bytes",
        "Approximate heap bytes of the head, by part (series: structures, labels and maps; chunks: open chunks, closed ones not yet written out, late samples; chunk_index: per-series chunk handles); walked over every series at most every 5 s.",
        "gauge",
    );
    for (part, v) in [
        ("series", mem.series),
        ("chunks", mem.chunks),
        ("chunk_index", mem.chunk_index),
        ("symbols", mem.symbols),
        ("postings", mem.postings),
        ("names", mem.names),
    ] {
        let _ = writeln!(o, "strata_tsdb_head_memory_bytes{{part=\"{part}\"}} {v}");
    }
    if let Some((a, b)) = head.time_range() {
        singles(
            o,
            &[
                ("strata_tsdb_head_min_time_seconds", "Oldest sample in the head.", "gauge", a as f64 / 1000.0),
                ("strata_tsdb_head_max_time_seconds", "Newest sample in the head.", "gauge", b as f64 / 1000.0),
            ],
        );
    }
    family(o, "strata_tsdb_samples_rejected_total", "Samples the head refused, by reason.", "counter");
    for (reason, v) in [
        ("out_of_order", &st.rejected_out_of_order),
        ("duplicate", &st.rejected_duplicate),
        ("too_old", &st.rejected_too_old),
    ] {
        let _ = writeln!(o, "strata_tsdb_samples_rejected_total{{reason=\"{reason}\"}} {}", load(v));
    }
    if let Some(wal) = head.wal() {
        let w = &wal.stats;
        singles(
            o,
            &[
                ("strata_tsdb_wal_bytes_written_total", "Bytes written to the WAL.", "counter", load(&w.bytes_written)),
                (
                    "strata_tsdb_wal_records_written_total",
                    "Records written to the WAL.",
                    "counter",
                    load(&w.records_written),
                ),
                ("strata_tsdb_wal_fsyncs_total", "WAL fsyncs.", "counter", load(&w.fsyncs)),
                (
                    "strata_tsdb_wal_fsync_duration_seconds_total",
                    "Time spent in WAL fsyncs.",
                    "counter",
                    load(&w.fsync_nanos_total) / 1e9,
                ),
                (
                    "strata_tsdb_wal_segments_created_total",
                    "WAL segments created.",
                    "counter",
                    load(&w.segments_created),
                ),
                (
                    "strata_tsdb_wal_segment_current",
                    "Index of the WAL segment being written.",
                    "gauge",
                    wal.current_segment() as f64,
                ),
            ],
        );
    }
    let blocks = db.blocks();
    let d = db.stats();
    singles(
        o,
        &[
            ("strata_tsdb_blocks_loaded", "Persisted blocks.", "gauge", blocks.len() as f64),
            (
                "strata_tsdb_storage_blocks_bytes",
                "Bytes of persisted blocks.",
                "gauge",
                blocks.iter().map(|b| b.bytes()).sum::<u64>() as f64,
            ),
            (
                "strata_tsdb_head_blocks_written_total",
                "Blocks cut from the head.",
                "counter",
                load(&d.head_blocks_written),
            ),
            ("strata_tsdb_compactions_total", "Compactions run.", "counter", load(&d.compactions)),
            (
                "strata_tsdb_compactions_failed_total",
                "Compactions that failed.",
                "counter",
                load(&d.compaction_failures),
            ),
            (
                "strata_tsdb_compaction_duration_seconds_total",
                "Time spent compacting.",
                "counter",
                load(&d.compaction_nanos_total) / 1e9,
            ),
            (
                "strata_tsdb_retention_blocks_deleted_total",
                "Blocks deleted by retention.",
                "counter",
                load(&d.blocks_deleted_by_retention),
            ),
            (
                "strata_tsdb_blocks_set_aside_total",
                "Blocks set aside as corrupt.",
                "counter",
                load(&d.blocks_set_aside),
            ),
            (
                "strata_tsdb_rollup_blocks_written_total",
                "Rollup tier blocks written from raw blocks.",
                "counter",
                load(&d.rollup_blocks_written),
            ),
            (
                "strata_tsdb_rollup_compactions_total",
                "Merges of rollup tier blocks.",
                "counter",
                load(&d.rollup_compactions),
            ),
            (
                "strata_tsdb_rollup_retention_blocks_deleted_total",
                "Rollup tier blocks deleted by their tier's retention.",
                "counter",
                load(&d.rollup_blocks_deleted_by_retention),
            ),
            (
                "strata_tsdb_rollup_histogram_series_skipped_total",
                "Series left out of rollups because they hold native histograms.",
                "counter",
                load(&d.rollup_histogram_series_skipped),
            ),
            (
                "strata_tsdb_rollup_coarse_blocks_dropped_total",
                "Coarse rollup tier blocks dropped to roll their raw blocks up again (late data, raw retention).",
                "counter",
                load(&d.rollup_coarse_blocks_dropped),
            ),
            (
                "strata_tsdb_rollup_raw_blocks_read_total",
                "Raw blocks that rollup tier reads aggregated sample by sample (not rolled up yet, or overlapped by late samples).",
                "counter",
                load(&d.rollup_raw_blocks_read),
            ),
        ],
    );
    render_tiers(o, &db.tier_status());
}

/// Each rollup tier's blocks, bytes and time range, labelled by its interval.
fn render_tiers(o: &mut String, tiers: &[strata_tsdb::db::TierStatus]) {
    if tiers.is_empty() {
        return;
    }
    type Value = fn(&strata_tsdb::db::TierStatus) -> f64;
    let rows: [(&str, &str, Value); 5] = [
        ("strata_tsdb_rollup_tier_blocks", "Blocks of the rollup tier.", |t| t.blocks.len() as f64),
        ("strata_tsdb_rollup_tier_bytes", "Bytes of the rollup tier's blocks.", |t| t.bytes as f64),
        ("strata_tsdb_rollup_tier_retention_seconds", "How long the tier keeps its buckets (0: forever).", |t| {
            t.tier.retention_ms as f64 / 1e3
        }),
        ("strata_tsdb_rollup_tier_min_time_seconds", "Start of the tier's oldest block (NaN: no block).", |t| {
            t.blocks.iter().map(|b| b.min_time).min().map_or(f64::NAN, |ms| ms as f64 / 1e3)
        }),
        ("strata_tsdb_rollup_tier_max_time_seconds", "End of the tier's newest block (NaN: no block).", |t| {
            t.blocks.iter().map(|b| b.max_time).max().map_or(f64::NAN, |ms| ms as f64 / 1e3)
        }),
    ];
    for (name, help, value) in rows {
        family(o, name, help, "gauge");
        for t in tiers {
            let _ = writeln!(o, "{name}{{tier=\"{}\"}} {}", t.tier.dir_name(), value(t));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::textparse::{Entry, Format, Parser};

    #[test]
    fn output_is_valid_exposition_text() {
        let tmp = tempfile::tempdir().unwrap();
        let db = Db::open(tmp.path(), strata_tsdb::DbOptions { compact_interval: None, ..Default::default() }).unwrap();
        let mut app = db.appender();
        for t in 0..300 {
            app.append(&strata_model::Labels::from_pairs([("__name__", "up")]), t * 15_000, 1.0).unwrap();
        }
        app.commit().unwrap();
        let m = ServerMetrics::default();
        m.observe_request("query", 200, Duration::from_millis(3));
        m.query_duration.observe(Duration::from_millis(30));
        let text = m.render(Some(&db), None);
        let mut samples = 0;
        for e in Parser::new(&text, Format::Prometheus) {
            if let Entry::Sample { .. } = e.unwrap_or_else(|e| panic!("{e}\n{text}")) {
                samples += 1;
            }
        }
        assert!(samples > 40, "{samples}");
        assert!(text.contains("strata_http_requests_total{handler=\"query\",code=\"200\"} 1"));
        assert!(text.contains("strata_engine_query_duration_seconds_bucket{le=\"0.05\"} 1"));
        assert!(text.contains("strata_tsdb_samples_rejected_total{reason=\"too_old\"} 0"));
        let memory = |part: &str| -> f64 {
            let key = format!("strata_tsdb_head_memory_bytes{{part=\"{part}\"}} ");
            let line = text.lines().find(|l| l.starts_with(&key)).unwrap_or_else(|| panic!("{key}\n{text}"));
            line[key.len()..].parse().unwrap()
        };
        // One series of 300 samples: its chunks (about 1 byte a sample here) and its labels.
        assert!((100.0..4000.0).contains(&memory("chunks")), "{}", memory("chunks"));
        assert!(memory("series") > 0.0 && memory("symbols") > 0.0 && memory("postings") > 0.0);
    }
}
