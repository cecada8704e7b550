//! The HTTP listener: accepting connections and holding them to their limits, before any
//! request reaches the router.
//!
//! Why not `axum::serve`: it offers none of the limits a server on an open port needs. Here
//! every accepted socket gets `TCP_NODELAY` (a response written in pieces must not wait for the
//! client's delayed ACK: that stalled large query results by ~40 ms), a request head must
//! arrive within the header read timeout (which also closes keep-alive connections left idle
//! that long: hyper starts the timer when it waits for the next request), at most
//! `max_connections` are open at once (past that, new connections wait in the kernel's
//! backlog, as Go's `netutil.LimitListener` makes Prometheus' `--web.max-connections` do),
//! and with `--web.config.file` the connection is TLS and requests must authenticate
//! ([`config`], [`auth`]).

pub mod auth;
pub mod config;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

pub use config::{WebConfig, WebConfigFile};

/// Limits on connections; each has a flag in `strata serve`.
#[derive(Clone, Debug)]
pub struct ConnectionLimits {
    /// Connections open at once (`--web.max-connections`, Prometheus' default 512).
    pub max_connections: usize,
    /// Time from a connection's start, or the end of its previous response, to the end of the
    /// next request's head (`--web.read-header-timeout`); also the TLS handshake's limit.
    pub read_header_timeout: Duration,
    /// Bytes of a request's start line and headers; larger ones get 431.
    pub max_header_bytes: usize,
}

/// Go's `http.DefaultMaxHeaderBytes`, which Prometheus serves with: a long query in a URL fits.
pub const MAX_HEADER_BYTES_DEFAULT: usize = 1 << 20;

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: 512,
            read_header_timeout: Duration::from_secs(30),
            max_header_bytes: MAX_HEADER_BYTES_DEFAULT,
        }
    }
}

/// Connection counters for `/metrics`.
#[derive(Debug, Default)]
pub struct ConnectionStats {
    pub accepted: AtomicU64,
    pub open: AtomicU64,
    /// Connections that ended with an error: a header too slow or too large, a reset, a
    /// failed TLS handshake.
    pub failed: AtomicU64,
    pub tls_handshake_failures: AtomicU64,
    /// `max_connections`, for the gauge beside `open`.
    pub limit: AtomicU64,
}

/// Serves `app` on `listener` until `shutdown` completes, then lets open connections finish
/// their requests (idle ones close at once) and returns when all are closed.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    tls: Option<Arc<WebConfigFile>>,
    stats: Arc<ConnectionStats>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    assert!(limits.max_connections > 0, "a listener must admit a connection");
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    stats.limit.store(limits.max_connections as u64, Ordering::Relaxed);
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let mut stopping = stop_rx.clone();
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            _ = stopped(&mut stopping) => break,
        };
        let (tcp, _peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors or a connection reset before it was taken:
                    // nothing to do but wait a moment, as Go's http.Server does.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stopped(&mut stopping) => break,
        };
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        stats.accepted.fetch_add(1, Ordering::Relaxed);
        stats.open.fetch_add(1, Ordering::Relaxed);
        let (app, limits, tls, stats, stop) =
            (app.clone(), limits.clone(), tls.clone(), stats.clone(), stop_rx.clone());
        tokio::spawn(async move {
            let ok = match tls.as_ref().and_then(|t| t.acceptor()) {
                None => connection(TokioIo::new(tcp), app, &limits, stop).await,
                Some(acceptor) => match tokio::time::timeout(limits.read_header_timeout, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => connection(TokioIo::new(stream), app, &limits, stop).await,
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "TLS handshake failed");
                        stats.tls_handshake_failures.fetch_add(1, Ordering::Relaxed);
                        false
                    }
                    Err(_) => {
                        stats.tls_handshake_failures.fetch_add(1, Ordering::Relaxed);
                        false
                    }
                },
            };
            if !ok {
                stats.failed.fetch_add(1, Ordering::Relaxed);
            }
            stats.open.fetch_sub(1, Ordering::Relaxed);
            drop(permit);
        });
    }
    drop(listener);
    // Every connection holds a slot until it closes: having them all back means all closed.
    let _all = slots.acquire_many(limits.max_connections as u32).await;
    Ok(())
}

/// One HTTP/1.1 connection, until the client closes it, a limit closes it, or shutdown asks it
/// to finish its request; `false` when it ended with an error.
async fn connection<I>(io: TokioIo<I>, app: Router, limits: &ConnectionLimits, mut stop: watch::Receiver<bool>) -> bool
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.read_header_timeout)
        .max_buf_size(limits.max_header_bytes.max(MIN_READ_BUFFER_BYTES))
        .max_header_size(limits.max_header_bytes);
    let conn = builder.serve_connection(io, TowerToHyperService::new(app));
    tokio::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        _ = stopped(&mut stop) => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    match result {
        Ok(()) => true,
        Err(e) => {
            tracing::debug!(error = %e, "connection ended with an error");
            false
        }
    }
}

/// Completes once shutdown is asked for (or its sender is gone). The carbon listeners stop on
/// the same signal.
pub(crate) async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// hyper refuses a read buffer smaller than this (8 KiB plus its own margin).
const MIN_READ_BUFFER_BYTES: usize = 64 * 1024;

#[cfg(test)]
mod tests;
