//! Carbon listeners: what carbon senders and relays (collectd, diamond, carbon-c-relay,
//! go-carbon's clients, `nc`) push, stored as series (see `docs/graphite.md` for the mapping):
//! plaintext lines over TCP and UDP, pickle messages over TCP. Each is off unless an address is
//! configured (carbon's ports are 2003 and 2004).
//!
//! Bad input never stops a stream: a bad line or datapoint is counted by reason
//! (`strata_carbon_points_rejected_total`) and logged with a sample at a limited rate, and the
//! lines after it are read as usual. Only a pickle frame longer than the limit closes its
//! connection, because the stream cannot be resynchronized after it. Every connection is
//! bounded: how many are open (`max_connections`), how long one may stay silent
//! (`idle_timeout`), how long a line or a message may be.
//!
//! Points are committed in batches: what one read brought in (at most `read_buffer_bytes`), so
//! a point is stored, and with `--wal-fsync always` durable, soon after it arrives. TCP
//! connections store their batches on blocking threads, at most one per core at a time: more
//! stores at once than cores only preempt each other while holding the head's locks (series
//! creation takes the postings lock), the others spinning and parking.

mod cache;
pub mod ingest;
mod tcp;
mod udp;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use strata_tsdb::Db;
use tokio::sync::watch;

use crate::scrape::scrape_loop::now_ms;
use crate::web::stopped;
use cache::{CacheBudget, SeriesCache};
use ingest::LogLimiter;
pub use ingest::{CarbonStats, Protocol, Window};

/// The listeners' settings (`--carbon.*` flags, the `carbon:` section of the config file).
#[derive(Clone, Debug)]
pub struct CarbonConfig {
    pub plaintext_tcp: Option<SocketAddr>,
    pub plaintext_udp: Option<SocketAddr>,
    pub pickle_tcp: Option<SocketAddr>,
    /// TCP connections open at once, both TCP listeners together; more wait to be accepted.
    pub max_connections: usize,
    /// A connection that sends nothing for this long is closed (a sender reconnects).
    pub idle_timeout: Duration,
    /// Longest plaintext line; a longer one is refused (`line_too_long`) and skipped up to its
    /// end. Carbon's own limit is 16 KiB (Twisted's `LineReceiver`).
    pub max_line_bytes: usize,
    /// Longest pickle message (its 4-byte length prefix); a longer one closes the connection.
    pub max_pickle_bytes: usize,
    /// Most bytes read from a connection before its complete lines are stored.
    pub read_buffer_bytes: usize,
    /// Paths remembered with their series, all connections together (`cache`); 0: none.
    pub path_cache_entries: usize,
    pub window: Window,
}

impl Default for CarbonConfig {
    fn default() -> Self {
        CarbonConfig {
            plaintext_tcp: None,
            plaintext_udp: None,
            pickle_tcp: None,
            max_connections: 1024,
            idle_timeout: Duration::from_secs(120),
            max_line_bytes: 16 * 1024,
            max_pickle_bytes: strata_graphite::carbon::pickle::MESSAGE_BYTES_MAX_DEFAULT,
            read_buffer_bytes: 256 * 1024,
            path_cache_entries: PATH_CACHE_ENTRIES_DEFAULT,
            window: Window {
                max_future_ms: 24 * 3600 * 1000,
                max_age_ms: 0,
                out_of_order: ingest::OUT_OF_ORDER_DEFAULT,
            },
        }
    }
}

/// About 40 MiB when full: one entry per path of a million-path installation.
pub const PATH_CACHE_ENTRIES_DEFAULT: usize = 1 << 20;

impl CarbonConfig {
    pub fn enabled(&self) -> bool {
        self.plaintext_tcp.is_some() || self.plaintext_udp.is_some() || self.pickle_tcp.is_some()
    }
}

/// The bound sockets, ready to serve once the database is open: binding first makes a taken
/// port an error at start, before the WAL replay.
#[derive(Debug)]
pub struct CarbonListeners {
    config: CarbonConfig,
    plaintext_tcp: Option<tokio::net::TcpListener>,
    plaintext_udp: Option<tokio::net::UdpSocket>,
    pickle_tcp: Option<tokio::net::TcpListener>,
}

impl CarbonListeners {
    pub async fn bind(config: CarbonConfig) -> Result<CarbonListeners, String> {
        let tcp = |a: Option<SocketAddr>, what: &'static str| async move {
            match a {
                None => Ok(None),
                Some(a) => tokio::net::TcpListener::bind(a).await.map(Some).map_err(|e| format!("{what} on {a}: {e}")),
            }
        };
        let plaintext_tcp = tcp(config.plaintext_tcp, "carbon plaintext listener (TCP)").await?;
        let pickle_tcp = tcp(config.pickle_tcp, "carbon pickle listener").await?;
        let plaintext_udp = match config.plaintext_udp {
            None => None,
            Some(a) => Some(
                tokio::net::UdpSocket::bind(a)
                    .await
                    .map_err(|e| format!("carbon plaintext listener (UDP) on {a}: {e}"))?,
            ),
        };
        Ok(CarbonListeners { config, plaintext_tcp, plaintext_udp, pickle_tcp })
    }

    /// The addresses actually bound (a configured port 0 becomes the one the kernel gave).
    pub fn local_addrs(&self) -> Vec<(Protocol, SocketAddr)> {
        let mut out = Vec::new();
        if let Some(Ok(a)) = self.plaintext_tcp.as_ref().map(|l| l.local_addr()) {
            out.push((Protocol::PlaintextTcp, a));
        }
        if let Some(Ok(a)) = self.plaintext_udp.as_ref().map(|l| l.local_addr()) {
            out.push((Protocol::PlaintextUdp, a));
        }
        if let Some(Ok(a)) = self.pickle_tcp.as_ref().map(|l| l.local_addr()) {
            out.push((Protocol::PickleTcp, a));
        }
        out
    }

    /// Serves until `stop` turns true; then stops accepting, lets every connection store what
    /// it has read, and returns once all are closed.
    pub async fn serve(self, db: Arc<Db>, stats: Arc<CarbonStats>, stop: watch::Receiver<bool>) {
        for (p, a) in self.local_addrs() {
            tracing::info!(protocol = p.name(), listen = %a, "carbon listener ready");
        }
        let cache_budget = CacheBudget::new(self.config.path_cache_entries);
        let shared = Arc::new(Shared {
            db,
            stats,
            config: self.config,
            slots: Arc::new(tokio::sync::Semaphore::new(0)),
            storing: tokio::sync::Semaphore::new(std::thread::available_parallelism().map_or(1, |n| n.get())),
            log: LogLimiter::new(Duration::from_secs(10)),
            cache_budget,
        });
        shared.slots.add_permits(shared.config.max_connections);
        shared.stats.max_connections.store(shared.config.max_connections as u64, Ordering::Relaxed);
        let mut tasks = tokio::task::JoinSet::new();
        if let Some(l) = self.plaintext_tcp {
            tasks.spawn(tcp::accept_loop(l, Protocol::PlaintextTcp, shared.clone(), stop.clone()));
        }
        if let Some(l) = self.pickle_tcp {
            tasks.spawn(tcp::accept_loop(l, Protocol::PickleTcp, shared.clone(), stop.clone()));
        }
        if let Some(s) = self.plaintext_udp {
            tasks.spawn(udp::receive_loop(s, shared.clone(), stop.clone()));
        }
        while tasks.join_next().await.is_some() {}
    }
}

/// What every listener task holds.
struct Shared {
    db: Arc<Db>,
    stats: Arc<CarbonStats>,
    config: CarbonConfig,
    /// One permit per open TCP connection.
    slots: Arc<tokio::sync::Semaphore>,
    /// One permit per core: batches stored at once. Connections past it wait for a permit
    /// without a thread; more stores at once than cores only preempt each other while they
    /// hold the head's locks (series creation takes the postings lock), so they spin and park.
    storing: tokio::sync::Semaphore,
    log: LogLimiter,
    cache_budget: Arc<CacheBudget>,
}

impl Shared {
    fn ingest(&self, protocol: Protocol) -> ingest::Ingest<'_> {
        ingest::Ingest {
            db: &self.db,
            stats: self.stats.of(protocol),
            log: &self.log,
            protocol,
            window: self.config.window,
        }
    }

    fn series_cache(&self) -> SeriesCache {
        SeriesCache::new(self.cache_budget.clone())
    }
}

/// Parses the complete lines in `buf` and stores their points in one commit (see
/// `Ingest::store_lines`).
fn store_lines(shared: &Shared, protocol: Protocol, buf: &[u8], cache: &mut SeriesCache) {
    shared.ingest(protocol).store_lines(buf, shared.config.max_line_bytes, cache, now_ms());
}

#[cfg(test)]
mod tests;
