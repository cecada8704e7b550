//! The TCP listeners: plaintext lines and pickle messages, one task per connection, within
//! the shared connection limit.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::ingest::Protocol;
use super::{now_ms, stopped, store_lines, Shared};

/// Accepts connections until `stop`, each in its own task, then waits for them to close.
pub(super) async fn accept_loop(
    listener: TcpListener,
    protocol: Protocol,
    shared: Arc<Shared>,
    stop: watch::Receiver<bool>,
) {
    let stats = shared.stats.of(protocol);
    let mut stopping = stop.clone();
    loop {
        let permit = tokio::select! {
            p = shared.slots.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            _ = stopped(&mut stopping) => break,
        };
        let sock = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    // Out of file descriptors, or a connection reset before it was taken.
                    tracing::warn!(protocol = protocol.name(), error = %e, "accepting a carbon connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stopped(&mut stopping) => break,
        };
        stats.connections_accepted.fetch_add(1, Ordering::Relaxed);
        stats.connections_open.fetch_add(1, Ordering::Relaxed);
        let (shared, stop) = (shared.clone(), stop.clone());
        tokio::spawn(async move {
            let clean = match protocol {
                Protocol::PickleTcp => pickle_connection(sock, &shared, stop).await,
                _ => plaintext_connection(sock, &shared, protocol, stop).await,
            };
            let stats = shared.stats.of(protocol);
            if !clean {
                stats.connections_failed.fetch_add(1, Ordering::Relaxed);
            }
            stats.connections_open.fetch_sub(1, Ordering::Relaxed);
            drop(permit);
        });
    }
    drop(listener);
    // Every connection holds a slot until it closes: having them all back means all closed.
    let all = shared.config.max_connections as u32;
    let _all = shared.slots.acquire_many(all).await;
}

/// What one read brought: data, the end of the stream, or why the connection must close.
enum Read {
    Data,
    Eof,
    Stop,
    Idle,
    Failed(std::io::Error),
}

/// Reads into `buf`'s spare capacity (at most `max` bytes in all), within the idle timeout.
async fn read_some<R: AsyncRead + Unpin>(
    sock: &mut R,
    buf: &mut Vec<u8>,
    max: usize,
    idle: Duration,
    stop: &mut watch::Receiver<bool>,
) -> Read {
    let mut limited = (&mut *sock).take((max - buf.len()) as u64);
    tokio::select! {
        r = tokio::time::timeout(idle, limited.read_buf(buf)) => match r {
            Ok(Ok(0)) => Read::Eof,
            Ok(Ok(_)) => Read::Data,
            Ok(Err(e)) => Read::Failed(e),
            Err(_) => Read::Idle,
        },
        _ = stopped(stop) => Read::Stop,
    }
}

/// One plaintext connection: complete lines are stored as they arrive, what one read brought
/// in one commit. `false` when a limit or an error closed it.
pub(super) async fn plaintext_connection<R: AsyncRead + Unpin>(
    mut sock: R,
    shared: &Arc<Shared>,
    protocol: Protocol,
    mut stop: watch::Receiver<bool>,
) -> bool {
    let cap = shared.config.read_buffer_bytes.max(shared.config.max_line_bytes + 1);
    let max_line = shared.config.max_line_bytes;
    let mut buf: Vec<u8> = Vec::with_capacity(cap);
    let mut spare: Vec<u8> = Vec::with_capacity(cap);
    // Inside a line past the limit, already counted: drop bytes up to its end.
    let mut skipping = false;
    // The series of the paths this connection sent; it goes along with the lines it serves.
    let mut cache = Some(shared.series_cache());
    loop {
        let read_from = buf.len();
        match read_some(&mut sock, &mut buf, cap, shared.config.idle_timeout, &mut stop).await {
            Read::Data => {}
            Read::Eof => {
                if !buf.is_empty() && !skipping && !strata_graphite::carbon::plaintext::is_blank(&buf) {
                    // Carbon drops a last line without its newline too; counted here.
                    shared.ingest(protocol).refuse_line("partial_line", || {
                        format!("the connection closed inside a line: {}", super::ingest::sample(&buf))
                    });
                }
                return true;
            }
            Read::Stop => return true,
            Read::Idle => {
                tracing::debug!(
                    protocol = protocol.name(),
                    "closing a carbon connection idle for longer than the limit"
                );
                return false;
            }
            Read::Failed(e) => {
                tracing::debug!(protocol = protocol.name(), error = %e, "carbon connection failed");
                return false;
            }
        }
        if skipping {
            match memchr::memchr(b'\n', &buf[read_from..]) {
                Some(i) => {
                    buf.drain(..read_from + i + 1);
                    skipping = false;
                }
                None => {
                    buf.clear();
                    continue;
                }
            }
        }
        if let Some(last) = memchr::memrchr(b'\n', &buf) {
            // The complete lines go to a blocking thread and come back, emptied, as the next
            // spare buffer: two buffers per connection, never reallocated (a fresh 256 KiB
            // buffer per read cost more in page faults than parsing the lines).
            spare.clear();
            spare.extend_from_slice(&buf[last + 1..]);
            buf.truncate(last + 1);
            let lines = std::mem::replace(&mut buf, std::mem::take(&mut spare));
            let sh = shared.clone();
            let mut paths = cache.take().expect("the cache is back after every batch");
            let _storing = shared.storing.acquire().await.expect("the store semaphore is never closed");
            match tokio::task::spawn_blocking(move || {
                store_lines(&sh, protocol, &lines, &mut paths);
                (lines, paths)
            })
            .await
            {
                Ok((back, paths)) => {
                    spare = back;
                    cache = Some(paths);
                }
                Err(_) => {
                    tracing::error!(
                        protocol = protocol.name(),
                        "storing carbon lines panicked; closing the connection"
                    );
                    return false;
                }
            }
        }
        if buf.len() > max_line {
            shared.ingest(protocol).refuse_line("line_too_long", || {
                format!("a line of more than {max_line} bytes, skipped to its end: {}", super::ingest::sample(&buf))
            });
            buf.clear();
            skipping = true;
        }
    }
}

/// One pickle connection: 4-byte big-endian length, then that many bytes of pickle, again and
/// again. A message that does not decode is counted and the next one is read; a length past
/// the limit closes the connection (nothing after it can be trusted to be a frame).
pub(super) async fn pickle_connection<R: AsyncRead + Unpin>(
    mut sock: R,
    shared: &Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) -> bool {
    let protocol = Protocol::PickleTcp;
    let stats = shared.stats.of(protocol);
    let idle = shared.config.idle_timeout;
    loop {
        let mut head = Vec::with_capacity(4);
        while head.len() < 4 {
            match read_some(&mut sock, &mut head, 4, idle, &mut stop).await {
                Read::Data => {}
                Read::Eof if head.is_empty() => return true,
                Read::Eof => {
                    stats.reject("partial_message", 1);
                    return true;
                }
                Read::Stop => return true,
                Read::Idle | Read::Failed(_) => return false,
            }
        }
        let len = u32::from_be_bytes(head[..4].try_into().expect("four bytes")) as usize;
        if len > shared.config.max_pickle_bytes {
            stats.reject("message_too_large", 1);
            shared.log.warn(protocol, || {
                format!(
                    "a pickle message of {len} bytes is over the limit of {} bytes; closing the connection",
                    shared.config.max_pickle_bytes
                )
            });
            return false;
        }
        // Grown as bytes arrive, so a large announced length costs nothing until it is sent.
        let mut message = Vec::with_capacity(len.min(64 * 1024));
        while message.len() < len {
            message.reserve((len - message.len()).min(1 << 20));
            match read_some(&mut sock, &mut message, len, idle, &mut stop).await {
                Read::Data => {}
                Read::Eof | Read::Stop => {
                    stats.reject("partial_message", 1);
                    return true;
                }
                Read::Idle | Read::Failed(_) => return false,
            }
        }
        let sh = shared.clone();
        let _storing = shared.storing.acquire().await.expect("the store semaphore is never closed");
        if tokio::task::spawn_blocking(move || store_pickle(&sh, &message)).await.is_err() {
            tracing::error!("storing a carbon pickle panicked; closing the connection");
            return false;
        }
    }
}

/// Decodes one pickle message and stores its points in one commit.
fn store_pickle(shared: &Shared, message: &[u8]) {
    let protocol = Protocol::PickleTcp;
    let ingest = shared.ingest(protocol);
    let now = now_ms();
    match strata_graphite::carbon::pickle::decode(message, now) {
        Err(e) => {
            ingest.stats.reject(e.reason(), 1);
            shared.log.warn(protocol, || format!("a pickle message of {} bytes was refused: {e}", message.len()));
        }
        Ok(decoded) => {
            let mut points = Vec::with_capacity(decoded.len());
            for p in decoded {
                match p {
                    Ok(p) => points.push(p),
                    Err(e) => ingest.refuse(&e, b""),
                }
            }
            ingest.store(&points, now);
        }
    }
}
