//! The UDP listener: each datagram holds whole plaintext lines (a line cannot span datagrams,
//! as for carbon). Datagrams already waiting are stored together, in one commit.

use std::sync::Arc;

use tokio::net::UdpSocket;
use tokio::sync::watch;

use super::ingest::Protocol;
use super::{stopped, store_lines, Shared};

/// The largest UDP payload.
const DATAGRAM_BYTES_MAX: usize = 65_536;

pub(super) async fn receive_loop(sock: UdpSocket, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let batch_bytes = shared.config.read_buffer_bytes.max(DATAGRAM_BYTES_MAX);
    let mut datagram = vec![0u8; DATAGRAM_BYTES_MAX];
    // The series of the paths seen (one cache for all senders: datagrams carry no connection).
    let mut cache = Some(shared.series_cache());
    loop {
        let n = tokio::select! {
            r = sock.recv(&mut datagram) => match r {
                Ok(n) => n,
                Err(e) => {
                    tracing::debug!(error = %e, "carbon UDP receive failed");
                    continue;
                }
            },
            _ = stopped(&mut stop) => return,
        };
        let mut lines = Vec::with_capacity(batch_bytes);
        push_datagram(&mut lines, &datagram[..n]);
        // Whatever else has arrived, without waiting.
        while lines.len() + DATAGRAM_BYTES_MAX <= batch_bytes {
            match sock.try_recv(&mut datagram) {
                Ok(n) => push_datagram(&mut lines, &datagram[..n]),
                Err(_) => break,
            }
        }
        let sh = shared.clone();
        let mut paths = cache.take().unwrap_or_else(|| shared.series_cache());
        match tokio::task::spawn_blocking(move || {
            store_lines(&sh, Protocol::PlaintextUdp, &lines, &mut paths);
            paths
        })
        .await
        {
            Ok(paths) => cache = Some(paths),
            Err(_) => tracing::error!("storing carbon UDP lines panicked"),
        }
    }
}

/// Appends a datagram's lines; its last line needs no newline (the datagram ends it).
fn push_datagram(lines: &mut Vec<u8>, datagram: &[u8]) {
    lines.extend_from_slice(datagram);
    if !datagram.ends_with(b"\n") {
        lines.push(b'\n');
    }
}
