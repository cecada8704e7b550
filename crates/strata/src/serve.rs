//! `strata serve`: the HTTP server over one data directory.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use strata_server::config::{parse_bytes, StorageConfig, WalFsync, DATA_DIR_DEFAULT};
use strata_server::http::{router, AppState, Limits};
use strata_tsdb::Db;

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:9090")]
    listen: SocketAddr,
    /// Data directory (created if missing).
    #[arg(long, default_value = DATA_DIR_DEFAULT)]
    data_dir: PathBuf,
    /// Delete blocks entirely older than this behind the newest sample (`0` keeps everything).
    #[arg(long, default_value = "15d", value_parser = duration_ms)]
    retention: i64,
    /// Delete the oldest blocks while blocks and WAL exceed this size (e.g. `512GB`; `0` = no limit).
    #[arg(long, default_value = "0", value_parser = size_or_zero)]
    retention_size: u64,
    /// WAL fsync policy: "interval" (every second) or "always" (before acknowledging a write).
    #[arg(long, default_value = "interval")]
    wal_fsync: WalFsync,
    /// Largest request body accepted (compressed size for remote write and read).
    #[arg(long = "write.max-body-size", default_value = "32MB", value_parser = parse_bytes)]
    max_body: u64,
    /// Largest remote-write or remote-read body after snappy decompression.
    #[arg(long = "write.max-decompressed-size", default_value = "128MB", value_parser = parse_bytes)]
    max_decompressed: u64,
    /// Most series in one write request.
    #[arg(long = "write.max-series", default_value_t = 100_000)]
    max_series_per_write: usize,
    /// Most samples in one write request.
    #[arg(long = "write.max-samples", default_value_t = 1_000_000)]
    max_samples_per_write: usize,
    /// Most samples a query may load into memory.
    #[arg(long = "query.max-samples", default_value_t = 50_000_000)]
    max_query_samples: usize,
    /// Most series a query may select.
    #[arg(long = "query.max-series", default_value_t = 1_000_000)]
    max_query_series: usize,
    /// Longest a query may run (and wait for a slot).
    #[arg(long = "query.timeout", default_value = "2m", value_parser = duration_ms)]
    query_timeout: i64,
    /// Longest a client may take to send a request body (slow clients get 408).
    #[arg(long = "web.read-timeout", default_value = "30s", value_parser = duration_ms)]
    body_read_timeout: i64,
    /// Queries evaluated at once; more wait, up to the query timeout, then get 503.
    #[arg(long = "query.max-concurrency", default_value_t = 20)]
    max_concurrent_queries: usize,
}

fn duration_ms(s: &str) -> Result<i64, String> {
    strata_model::parse_duration_ms(s)
}

fn size_or_zero(s: &str) -> Result<u64, String> {
    if s == "0" {
        Ok(0)
    } else {
        parse_bytes(s)
    }
}

pub fn run(args: ServeArgs) -> Result<(), Box<dyn std::error::Error>> {
    let limits = Limits {
        max_body_bytes: args.max_body as usize,
        max_decompressed_bytes: args.max_decompressed as usize,
        max_series_per_write: args.max_series_per_write,
        max_samples_per_write: args.max_samples_per_write,
        max_query_samples: args.max_query_samples,
        max_query_series: args.max_query_series,
        query_timeout: Duration::from_millis(args.query_timeout.max(1) as u64),
        max_concurrent_queries: args.max_concurrent_queries,
        max_age_ms: args.retention,
        body_read_timeout: Duration::from_millis(args.body_read_timeout.max(1) as u64),
        ..Limits::default()
    };
    let cfg = StorageConfig {
        data_dir: args.data_dir.clone(),
        wal_fsync: args.wal_fsync,
        retention_ms: args.retention,
        retention_bytes: args.retention_size,
        ..Default::default()
    };
    let mut flags = BTreeMap::new();
    flags.insert("listen".to_owned(), args.listen.to_string());
    flags.insert("data-dir".to_owned(), args.data_dir.display().to_string());
    flags.insert("retention".to_owned(), format!("{}ms", args.retention));
    flags.insert("retention-size".to_owned(), args.retention_size.to_string());
    flags.insert("wal-fsync".to_owned(), format!("{:?}", args.wal_fsync).to_lowercase());
    flags.insert("query.timeout".to_owned(), format!("{}ms", args.query_timeout));
    flags.insert("query.max-samples".to_owned(), args.max_query_samples.to_string());
    flags.insert("query.max-concurrency".to_owned(), args.max_concurrent_queries.to_string());
    let state = AppState::new(limits, flags, String::new());

    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().thread_name("strata-http").build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .map_err(|e| format!("listen on {}: {e}", args.listen))?;
        tracing::info!(listen = %args.listen, data_dir = %cfg.data_dir.display(), "serving; not ready until the WAL is replayed");

        // Replay in the background: /-/healthy answers meanwhile, /-/ready says 503.
        let opener = {
            let state = state.clone();
            let cfg = cfg.clone();
            tokio::task::spawn_blocking(move || -> Result<(), String> {
                let db = Db::open(&cfg.data_dir, cfg.db_options()).map_err(|e| e.to_string())?;
                state.db.set(Arc::new(db)).map_err(|_| "database opened twice".to_owned())?;
                tracing::info!("ready");
                Ok(())
            })
        };
        let app = router(state.clone());
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<String>();
        let server = axum::serve(listener, app).with_graceful_shutdown(async move {
            tokio::select! {
                _ = shutdown_signal() => {}
                reason = stop_rx => tracing::error!(reason = reason.unwrap_or_default(), "stopping"),
            }
        });
        let server = tokio::spawn(async move { server.await });
        let opened = opener.await.map_err(|e| e.to_string()).and_then(|r| r);
        if let Err(e) = &opened {
            let _ = stop_tx.send(format!("cannot open the data directory: {e}"));
        }
        server.await.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
        tracing::info!("HTTP server stopped; closing storage");
        if let Some(db) = state.db.get() {
            db.shutdown().map_err(|e| e.to_string())?;
        }
        opened.map_err(|e| format!("cannot open the data directory: {e}"))?;
        tracing::info!("stopped cleanly");
        Ok::<(), String>(())
    })?;
    Ok(())
}

/// SIGTERM or SIGINT.
async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
    }
}
