//! Gzip for large responses, compressed by several threads (as pigz does): Grafana asks for
//! gzip, and compressing a day of thousands of series (tens of MB of JSON) on one thread cost
//! more than evaluating it, or ten times answering it from the result cache.
//!
//! The response is written in pieces; each piece is compressed on its own (a raw deflate
//! stream ended by a sync flush, so it ends on a byte boundary and refers to nothing before it)
//! by one of the threads, and the compressed pieces are sent in order between gzip's header
//! and an empty final block, the CRC-32 and length of the whole (RFC 1952). A piece does not
//! see the 32 KB before it, which costs a few percent of size on pieces of 128 KB.

use flate2::{Compress, Compression, Crc, FlushCompress};

/// gzip's header: deflate, no flags, no time, fastest compression (`xfl` 4), unknown OS.
pub(crate) const HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 4, 0xff];

/// An empty final block (fixed Huffman codes: the final bit, the block type, end of block).
pub(crate) const LAST_BLOCK: [u8; 2] = [0x03, 0x00];

/// Compressed pieces waiting per thread (each its input, ~128 KB, and its output).
const QUEUED_PER_THREAD: usize = 2;

/// `piece` as raw deflate blocks that end on a byte boundary and refer to nothing before them.
pub(crate) fn deflate_piece(compress: &mut Compress, piece: &[u8]) -> Vec<u8> {
    compress.reset();
    let mut out = Vec::with_capacity(piece.len() / 3 + 64);
    let mut run = |input: &[u8], flush: FlushCompress, out: &mut Vec<u8>| {
        if out.capacity() - out.len() < 1024 {
            out.reserve(out.capacity().max(4096));
        }
        let before = compress.total_in();
        compress.compress_vec(input, out, flush).expect("compressing into memory");
        (compress.total_in() - before) as usize
    };
    let mut input = piece;
    while !input.is_empty() {
        input = &input[run(input, FlushCompress::None, &mut out)..];
    }
    // The sync flush, with room for all the piece could still be (incompressible, it is
    // stored: five bytes per 64 KB block): miniz does not say when a flush that ran out of
    // room is done.
    out.reserve(piece.len() + piece.len() / 4096 + 1024);
    run(&[], FlushCompress::Sync, &mut out);
    assert!(out.len() < out.capacity(), "the flush had room to finish");
    debug_assert!(out.ends_with(&[0, 0, 0xff, 0xff]), "a sync flush ends with an empty stored block");
    out
}

/// Appends `text` to a deflate stream that is at a byte boundary as stored (uncompressed)
/// blocks, which leave it at one: for text too short to be worth a compressor's reset.
pub(crate) fn stored_blocks(out: &mut Vec<u8>, text: &[u8]) {
    for part in text.chunks(usize::from(u16::MAX)) {
        let len = part.len() as u16;
        // Not final, type 00 (stored): the three header bits, then padding to the byte.
        out.push(0);
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(part);
    }
}

/// Sends, through `send`, the gzip of what `write` writes: `write` hands each piece to the
/// function it is given, which says whether to go on (false once `send` said the receiver is
/// gone). Up to `threads` threads compress.
pub(super) fn gzip_in_parallel(
    threads: usize,
    write: impl FnOnce(&mut dyn FnMut(String) -> bool),
    send: &mut dyn FnMut(Vec<u8>) -> bool,
) {
    let threads = threads.max(1);
    let mut crc = Crc::new();
    if !send(HEADER.to_vec()) {
        return;
    }
    strata_tsdb::workers::scope(|scope| {
        let mut inputs = Vec::with_capacity(threads);
        let mut outputs = Vec::with_capacity(threads);
        for _ in 0..threads {
            let (in_tx, in_rx) = std::sync::mpsc::sync_channel::<String>(QUEUED_PER_THREAD);
            let (out_tx, out_rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(QUEUED_PER_THREAD);
            inputs.push(in_tx);
            outputs.push(out_rx);
            scope.spawn(move || {
                let mut compress = Compress::new(Compression::fast(), false);
                // Ends when the writer stops handing pieces on, or stops taking them back.
                while let Ok(piece) = in_rx.recv() {
                    if out_tx.send(deflate_piece(&mut compress, piece.as_bytes())).is_err() {
                        return;
                    }
                }
            });
        }
        // Piece k goes to thread k mod threads, and comes back from it in that order.
        let (mut handed, mut sent) = (0usize, 0usize);
        let mut sending = true;
        let mut send_next = |sent: &mut usize| {
            let piece = outputs[*sent % threads].recv().expect("a compressing thread panicked");
            *sent += 1;
            send(piece)
        };
        write(&mut |piece: String| {
            crc.update(piece.as_bytes());
            if handed - sent == threads * QUEUED_PER_THREAD {
                sending = send_next(&mut sent);
            }
            if sending {
                inputs[handed % threads].send(piece).expect("a compressing thread panicked");
                handed += 1;
            }
            sending
        });
        while sending && sent < handed {
            sending = send_next(&mut sent);
        }
        if sending {
            let mut trailer = LAST_BLOCK.to_vec();
            trailer.extend_from_slice(&crc.sum().to_le_bytes());
            trailer.extend_from_slice(&crc.amount().to_le_bytes());
            send(trailer);
        }
        // Dropping `inputs` and `outputs` here ends the threads, whatever they were doing.
    });
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    fn gunzip(bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(bytes).read_to_end(&mut out).expect("valid gzip");
        out
    }

    /// What several threads compress reads back as what was written, through a gzip reader
    /// that checks the CRC and length: with no pieces, empty pieces, small and large ones,
    /// text that repeats across pieces and text that does not compress.
    #[test]
    fn pieces_compressed_by_several_threads_read_back_as_written() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut noise = |n: usize| -> String {
            (0..n)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    char::from(b'!' + (state % 90) as u8)
                })
                .collect()
        };
        let json = |k: usize| format!(r#",[{},"{}.{k}"]"#, 1_796_000_000 + k * 60, k % 97);
        let cases: Vec<Vec<String>> = vec![
            vec![],
            vec![String::new()],
            vec!["a".into(), String::new(), "b".into()],
            (0..40).map(|i| (0..3000).map(|k| json(i * 3000 + k)).collect()).collect(),
            (0..9).map(|i| noise(10_000 * i + 1)).collect(),
        ];
        for pieces in &cases {
            let whole: String = pieces.concat();
            for threads in [1, 2, 3, 8] {
                let mut out = Vec::new();
                gzip_in_parallel(
                    threads,
                    |emit| {
                        for p in pieces {
                            assert!(emit(p.clone()));
                        }
                    },
                    &mut |bytes| {
                        out.extend_from_slice(&bytes);
                        true
                    },
                );
                assert_eq!(gunzip(&out), whole.as_bytes(), "{threads} threads, {} pieces", pieces.len());
            }
        }
    }

    /// Once the receiver is gone, the writer is told to stop and nothing more is sent.
    #[test]
    fn writing_stops_when_the_receiver_is_gone() {
        for threads in [1, 2, 4] {
            let (mut sends, mut written) = (0, 0);
            gzip_in_parallel(
                threads,
                |emit| {
                    for k in 0..1000 {
                        written += 1;
                        if !emit(format!("piece {k} ").repeat(1000)) {
                            return;
                        }
                    }
                },
                &mut |_| {
                    sends += 1;
                    sends < 3
                },
            );
            assert_eq!(sends, 3, "{threads} threads");
            assert!(written < 1000, "{threads} threads: the writer went on");
        }
    }
}
