//! From decoded carbon points to stored samples: the path model (`__name__` is the path's
//! name, tags become labels), the accepted time window, one commit per batch, and every
//! refusal counted by reason and logged with a sample, at a limited rate.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use strata_graphite::carbon::plaintext::{self, RawPoint};
use strata_graphite::carbon::{CarbonPoint, PointError};
use strata_graphite::path::GraphitePath;
use strata_tsdb::head::{AppendError, OutOfOrder, SampleError};
use strata_tsdb::Db;

use super::cache::{path_key, SeriesCache};

/// The carbon listeners: plaintext over TCP and UDP, pickle over TCP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    PlaintextTcp,
    PlaintextUdp,
    PickleTcp,
}

impl Protocol {
    pub const ALL: [Protocol; 3] = [Protocol::PlaintextTcp, Protocol::PlaintextUdp, Protocol::PickleTcp];

    /// The `protocol` label of the counters.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::PlaintextTcp => "plaintext_tcp",
            Protocol::PlaintextUdp => "plaintext_udp",
            Protocol::PickleTcp => "pickle_tcp",
        }
    }
}

/// Counters of one listener, shown in `/metrics`.
#[derive(Debug, Default)]
pub struct ListenerStats {
    /// Points decoded, good or not (a pickle refused as a whole counts its message only).
    pub received: AtomicU64,
    /// Points stored (committed to the head and its WAL).
    pub stored: AtomicU64,
    pub connections_accepted: AtomicU64,
    pub connections_open: AtomicU64,
    /// Connections closed by a limit (idle too long, a pickle frame past the size limit) or a
    /// read error.
    pub connections_failed: AtomicU64,
    /// Points (or whole lines and messages) refused, by reason.
    rejected: Mutex<BTreeMap<&'static str, u64>>,
}

impl ListenerStats {
    pub fn reject(&self, reason: &'static str, n: u64) {
        *self.rejected.lock().entry(reason).or_default() += n;
    }

    pub fn rejected(&self) -> BTreeMap<&'static str, u64> {
        self.rejected.lock().clone()
    }
}

/// Every listener's counters, and the limit on connections they share.
#[derive(Debug, Default)]
pub struct CarbonStats {
    pub plaintext_tcp: ListenerStats,
    pub plaintext_udp: ListenerStats,
    pub pickle_tcp: ListenerStats,
    /// `--carbon.max-connections`, for the gauge beside the open connections.
    pub max_connections: AtomicU64,
}

impl CarbonStats {
    pub fn of(&self, p: Protocol) -> &ListenerStats {
        match p {
            Protocol::PlaintextTcp => &self.plaintext_tcp,
            Protocol::PlaintextUdp => &self.plaintext_udp,
            Protocol::PickleTcp => &self.pickle_tcp,
        }
    }

    /// The counters in the text exposition format.
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write;
        let each = |out: &mut String, name: &str, kind: &str, help: &str, get: &dyn Fn(&ListenerStats) -> u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for p in Protocol::ALL {
                let _ = writeln!(out, "{name}{{protocol=\"{}\"}} {}", p.name(), get(self.of(p)));
            }
        };
        each(out, "strata_carbon_points_received_total", "counter", "Carbon datapoints decoded.", &|s| {
            s.received.load(Ordering::Relaxed)
        });
        each(out, "strata_carbon_points_stored_total", "counter", "Carbon datapoints stored.", &|s| {
            s.stored.load(Ordering::Relaxed)
        });
        each(out, "strata_carbon_connections_accepted_total", "counter", "Carbon connections accepted.", &|s| {
            s.connections_accepted.load(Ordering::Relaxed)
        });
        each(out, "strata_carbon_connections_open", "gauge", "Carbon connections open.", &|s| {
            s.connections_open.load(Ordering::Relaxed)
        });
        each(
            out,
            "strata_carbon_connections_failed_total",
            "counter",
            "Carbon connections closed by a limit or an error.",
            &|s| s.connections_failed.load(Ordering::Relaxed),
        );
        let name = "strata_carbon_points_rejected_total";
        let _ = writeln!(
            out,
            "# HELP {name} Carbon datapoints, lines or messages refused, by reason.\n# TYPE {name} counter"
        );
        for p in Protocol::ALL {
            for (reason, n) in self.of(p).rejected() {
                let _ = writeln!(out, "{name}{{protocol=\"{}\",reason=\"{reason}\"}} {n}", p.name());
            }
        }
        let name = "strata_carbon_connections_limit";
        let _ = writeln!(
            out,
            "# HELP {name} Most carbon TCP connections open at once.\n# TYPE {name} gauge\n{name} {}",
            self.max_connections.load(Ordering::Relaxed)
        );
    }
}

/// Logs refused input at most once per `every`, with a sample and how many were not logged.
#[derive(Debug)]
pub struct LogLimiter {
    every: Duration,
    state: Mutex<(Option<Instant>, u64)>,
}

impl LogLimiter {
    pub fn new(every: Duration) -> LogLimiter {
        LogLimiter { every, state: Mutex::new((None, 0)) }
    }

    /// Logs `what` (built only when it will be logged) unless one was logged less than `every`
    /// ago, in which case it is only counted.
    pub fn warn(&self, protocol: Protocol, what: impl FnOnce() -> String) {
        let mut st = self.state.lock();
        let now = Instant::now();
        if st.0.is_some_and(|last| now.duration_since(last) < self.every) {
            st.1 += 1;
            return;
        }
        let suppressed = std::mem::take(&mut st.1);
        st.0 = Some(now);
        drop(st);
        tracing::warn!(
            protocol = protocol.name(),
            suppressed_since_last = suppressed,
            "carbon input refused: {}",
            what()
        );
    }
}

/// Lines parsed ahead of their cache lookup: enough for a slot's cache miss to be served while
/// they are parsed, few enough that the slots stay in cache until read.
const PREFETCH_BATCH: usize = 16;

/// At most this many bytes of a refused line go into the log.
const SAMPLE_BYTES: usize = 200;

/// A refused line, shortened for the log.
pub fn sample(line: &[u8]) -> String {
    let cut = &line[..line.len().min(SAMPLE_BYTES)];
    let more = if line.len() > SAMPLE_BYTES { "…" } else { "" };
    format!("{:?}{more}", String::from_utf8_lossy(cut))
}

/// What points may be stored: timestamps inside `[now - max_age, now + max_future]` (as for
/// remote write), and of those older than their series' newest point the ones the head's
/// out-of-order rules take (`out_of_order`: carbon's window, last write wins).
#[derive(Clone, Copy, Debug)]
pub struct Window {
    pub max_future_ms: i64,
    /// 0: no lower bound.
    pub max_age_ms: i64,
    pub out_of_order: OutOfOrder,
}

/// Carbon's default out-of-order rules: points up to a day behind the newest are taken, and a
/// rewrite of a timestamp replaces its value, as whisper does (it takes any timestamp inside
/// its retention; a day covers relays that buffer through an outage, without keeping late data
/// in memory for long).
pub const OUT_OF_ORDER_DEFAULT: OutOfOrder = OutOfOrder { window_ms: 24 * 3600 * 1000, replace: true };

/// Stores points into `db` in one commit and counts them in `stats`. A point the head refuses
/// (out of order, a duplicate timestamp, older than the head accepts) is counted by reason and
/// logged through `log`; the others are stored.
#[derive(Debug)]
pub struct Ingest<'a> {
    pub db: &'a Db,
    pub stats: &'a ListenerStats,
    pub log: &'a LogLimiter,
    pub protocol: Protocol,
    pub window: Window,
}

impl Ingest<'_> {
    /// Counts a point that did not decode.
    pub fn refuse(&self, e: &PointError, raw: &[u8]) {
        self.refuse_line(e.reason(), || format!("{e}: {}", sample(raw)));
    }

    /// Counts one received line or datapoint refused for `reason`, and logs `what` (at the
    /// limiter's rate).
    pub fn refuse_line(&self, reason: &'static str, what: impl FnOnce() -> String) {
        self.stats.received.fetch_add(1, Ordering::Relaxed);
        self.stats.reject(reason, 1);
        self.log.warn(self.protocol, what);
    }

    /// Parses the complete lines in `buf` and stores their points in one commit. A path seen
    /// before is appended to the series `cache` remembers for it; a new one is checked, looked
    /// up or created, and remembered. Blank lines are skipped; a line past `max_line_bytes`,
    /// one that does not parse, or a point the head refuses is counted by reason.
    pub fn store_lines(&self, buf: &[u8], max_line_bytes: usize, cache: &mut SeriesCache, now_ms: i64) {
        let bounds = self.bounds(now_ms);
        let mut app = self.db.appender_with(self.window.out_of_order);
        // Sized once, for lines of about 50 bytes: growing it by doubling faulted in fresh
        // pages again and again.
        app.reserve(buf.len() / 50 + 1);
        let (mut received, mut pending) = (0u64, 0u64);
        let mut batch = Vec::with_capacity(PREFETCH_BATCH);
        for line in plaintext::lines(buf) {
            if plaintext::is_blank(line) {
                continue;
            }
            received += 1;
            if line.len() > max_line_bytes {
                self.stats.reject("line_too_long", 1);
                self.log.warn(self.protocol, || {
                    format!("a line of {} bytes is over the limit of {max_line_bytes}: {}", line.len(), sample(line))
                });
                continue;
            }
            let raw = match plaintext::parse_fields(line, now_ms) {
                Ok(raw) => raw,
                Err(e) => {
                    self.reject_point(&e, line);
                    continue;
                }
            };
            if !self.in_window(raw.t_ms, bounds, &raw.path_display()) {
                continue;
            }
            let key = path_key(raw.path);
            // The slot is asked for now and read a batch of lines later, so its cache miss
            // overlaps the parsing of the lines between.
            cache.prefetch(key);
            batch.push((raw, key, line));
            if batch.len() == PREFETCH_BATCH {
                self.append_batch(&mut batch, &mut app, cache, &mut pending);
            }
        }
        self.append_batch(&mut batch, &mut app, cache, &mut pending);
        self.commit(app, pending, received);
    }

    /// Appends the parsed lines of `batch` (emptied) to `app`: a path seen before to the series
    /// `cache` remembers for it; a new one is checked, looked up or created, and remembered.
    fn append_batch<'l>(
        &self,
        batch: &mut Vec<(RawPoint<'l>, u128, &'l [u8])>,
        app: &mut strata_tsdb::head::Appender<'_>,
        cache: &mut SeriesCache,
        pending: &mut u64,
    ) {
        for (raw, key, line) in batch.drain(..) {
            if let Some(series) = cache.get(key) {
                match app.append_to(series, raw.t_ms, raw.value) {
                    Ok(()) => {
                        *pending += 1;
                        continue;
                    }
                    // Removed from the head since (it had no samples left): found or made anew.
                    Err(AppendError::UnknownSeries(_)) => cache.remove(key),
                    Err(e) => {
                        self.reject_append(&e, &raw.path_display());
                        continue;
                    }
                }
            }
            let point = match raw.parse_path() {
                Ok(p) => p,
                Err(e) => {
                    self.reject_point(&e, line);
                    continue;
                }
            };
            // New to this connection: its own pairs (they borrow this line's path).
            let mut pairs = Vec::with_capacity(1 + point.path.tags.len());
            path_pairs(&point.path, &mut pairs);
            match app.append_pairs_handle(&pairs, point.t_ms, point.value) {
                Ok(series) => {
                    *pending += 1;
                    cache.insert(key, series);
                }
                Err(e) => self.reject_append(&e, &raw.path_display()),
            }
        }
    }

    /// Appends `points` and commits them. An error is the WAL's: nothing of the batch was
    /// stored, and every point is counted as refused (`storage`).
    pub fn store(&self, points: &[CarbonPoint], now_ms: i64) {
        if points.is_empty() {
            return;
        }
        let bounds = self.bounds(now_ms);
        let mut app = self.db.appender_with(self.window.out_of_order);
        app.reserve(points.len());
        let mut pairs: Vec<(&str, &str)> = Vec::with_capacity(8);
        let mut pending = 0u64;
        for p in points {
            if !self.in_window(p.t_ms, bounds, &p.path) {
                continue;
            }
            path_pairs(&p.path, &mut pairs);
            match app.append_pairs(&pairs, p.t_ms, p.value) {
                Ok(_) => pending += 1,
                Err(e) => self.reject_append(&e, &p.path),
            }
        }
        self.commit(app, pending, points.len() as u64);
    }

    /// The oldest and newest timestamps taken at `now_ms`.
    fn bounds(&self, now_ms: i64) -> (i64, i64) {
        let newest = now_ms.saturating_add(self.window.max_future_ms);
        let oldest = if self.window.max_age_ms > 0 { now_ms.saturating_sub(self.window.max_age_ms) } else { i64::MIN };
        (oldest, newest)
    }

    /// Whether `t_ms` is inside `(oldest, newest)`; if not, the point is counted and logged.
    fn in_window(&self, t_ms: i64, (oldest, newest): (i64, i64), path: &dyn std::fmt::Display) -> bool {
        if t_ms <= newest && t_ms >= oldest {
            return true;
        }
        let reason = if t_ms > newest { "too_far_in_future" } else { "too_old" };
        self.stats.reject(reason, 1);
        self.log
            .warn(self.protocol, || format!("{path} at {t_ms} ms is outside the accepted window [{oldest}, {newest}]"));
        false
    }

    /// Counts (and logs) a received line whose point did not decode.
    fn reject_point(&self, e: &PointError, raw: &[u8]) {
        self.stats.reject(e.reason(), 1);
        self.log.warn(self.protocol, || format!("{e}: {}", sample(raw)));
    }

    /// Counts (and logs) a point the head refused.
    fn reject_append(&self, e: &AppendError, path: &dyn std::fmt::Display) {
        self.stats.reject(append_reason(e), 1);
        self.log.warn(self.protocol, || format!("{path}: {e}"));
    }

    /// Commits the `pending` points appended to `app`, of `received` decoded, and counts them.
    fn commit(&self, app: strata_tsdb::head::Appender<'_>, pending: u64, received: u64) {
        match app.commit() {
            Ok(c) => {
                self.stats.stored.fetch_add(c.appended as u64, Ordering::Relaxed);
                if c.rejected > 0 {
                    let reason = c.first_rejection.map_or("out_of_order", |(_, e)| sample_reason(&e));
                    self.stats.reject(reason, c.rejected as u64);
                }
            }
            Err(e) => {
                self.stats.reject("storage", pending);
                self.log.warn(self.protocol, || format!("{pending} points not stored: {e}"));
            }
        }
        // Counted once the batch is settled, so that a reader who saw them received also sees
        // them stored or refused.
        self.stats.received.fetch_add(received, Ordering::Relaxed);
    }
}

/// The label pairs of `path` (`__name__` and its tags, sorted), in `pairs`.
fn path_pairs<'p>(path: &'p GraphitePath, pairs: &mut Vec<(&'p str, &'p str)>) {
    pairs.clear();
    pairs.push(("__name__", &path.name));
    pairs.extend(path.tags.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    // Tags are sorted by name, but a tag may sort before `__name__` (`A` < `_`).
    if pairs.len() > 1 && pairs[1].0 < "__name__" {
        pairs.sort_unstable();
    }
}

fn append_reason(e: &AppendError) -> &'static str {
    match e {
        AppendError::InvalidLabels(_) => "invalid_labels",
        AppendError::Sample(s) => sample_reason(s),
        AppendError::Wal(_) => "storage",
        _ => "invalid",
    }
}

fn sample_reason(e: &SampleError) -> &'static str {
    match e {
        SampleError::OutOfOrder { .. } => "out_of_order",
        SampleError::Duplicate { .. } => "duplicate_timestamp",
        SampleError::TooOld { .. } => "too_old",
        _ => "invalid",
    }
}
