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
    deflate_then_flush(compress, piece, FlushCompress::Sync)
}

/// `piece` as raw deflate blocks that end on a byte boundary (a sync or a full flush). A
/// full flush also clears what the compressor remembers of its input, so that what it
/// compresses next refers to nothing before it either: for many small pieces, about half
/// the cost of the reset `deflate_piece` starts with.
pub(crate) fn deflate_then_flush(compress: &mut Compress, piece: &[u8], flush: FlushCompress) -> Vec<u8> {
    debug_assert!(matches!(flush, FlushCompress::Sync | FlushCompress::Full));
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
    // The flush, with room for all the piece could still be (incompressible, it is stored:
    // five bytes per 64 KB block): miniz does not say when a flush that ran out of room is
    // done.
    out.reserve(piece.len() + piece.len() / 4096 + 1024);
    run(&[], flush, &mut out);
    assert!(out.len() < out.capacity(), "the flush had room to finish");
    debug_assert!(out.ends_with(&[0, 0, 0xff, 0xff]), "a flush ends with an empty stored block");
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

/// The CRC-32 of a piece of a stream and what appending the piece does to the CRC of what
/// came before it, so that pieces whose CRCs were computed once (the result cache's deflated
/// groups) join into the stream's CRC without reading their text again (reading it was 12%
/// of a gzip answer from the cache).
///
/// CRC-32 is a remainder of polynomials over GF(2): for a stream `a` followed by `b`,
/// `crc(ab) = crc(a) · x^(8·|b|) + crc(b)` (mod gzip's polynomial), with the conditioning of
/// the start and end folded in since both are CRCs of whole pieces. `shift` is that
/// `x^(8·|b|)`, computed once per piece, so joining is one multiplication.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CrcPiece {
    pub crc: u32,
    shift: u32,
    pub len: u64,
}

/// gzip's CRC-32 polynomial, bits reversed (bit 31 is `x^0`).
const CRC_POLY: u32 = 0xedb8_8320;

/// `x^(2^k)` mod the polynomial, for k in 0..32 (`x^(2^k)` for larger k repeats these:
/// the multiplicative order of x divides 2^32 - 1).
const X_POW_2K: [u32; 32] = {
    let mut table = [0u32; 32];
    // x^1: bit 30 in the reversed order.
    table[0] = 1 << 30;
    let mut k = 1;
    while k < 32 {
        table[k] = crc_multiply(table[k - 1], table[k - 1]);
        k += 1;
    }
    table
};

/// `v · x` mod the polynomial.
const fn crc_times_x(v: u32) -> u32 {
    if v & 1 != 0 {
        (v >> 1) ^ CRC_POLY
    } else {
        v >> 1
    }
}

/// `n · x^8` mod the polynomial for each byte `n` (a CRC's table: one zero byte read).
const CRC_TIMES_X8: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut n = 0;
    while n < 256 {
        let mut v = n as u32;
        let mut k = 0;
        while k < 8 {
            v = crc_times_x(v);
            k += 1;
        }
        table[n] = v;
        n += 1;
    }
    table
};

/// `a · b` mod the polynomial, both in the reversed bit order: by Horner's rule over `a`'s
/// bytes from its highest-degree terms, each byte's terms picked from `b · x^j` without
/// branches (a loop over `a`'s bits, branching on each, cost five times more, and joining
/// an answer's groups does one per group).
const fn crc_multiply(a: u32, b: u32) -> u32 {
    let mut b_times = [0u32; 8];
    b_times[0] = b;
    let mut j = 1;
    while j < 8 {
        b_times[j] = crc_times_x(b_times[j - 1]);
        j += 1;
    }
    let mut product = 0u32;
    // Byte k of `a` holds degrees 31 - 8k down to 24 - 8k (bit i: degree 31 - 8k - i).
    let mut k = 0;
    while k < 4 {
        product = (product >> 8) ^ CRC_TIMES_X8[(product & 0xff) as usize];
        let byte = (a >> (8 * k)) & 0xff;
        let mut i = 0;
        while i < 8 {
            product ^= b_times[7 - i] & 0u32.wrapping_sub((byte >> i) & 1);
            i += 1;
        }
        k += 1;
    }
    product
}

/// `x^(8·len)` mod the polynomial: what a CRC is multiplied by when `len` bytes follow.
fn crc_shift(len: u64) -> u32 {
    // x^(8·len) = product of x^(2^k) over the set bits k of 8·len.
    let (mut shift, mut n, mut k) = (1u32 << 31, len, 3usize);
    while n != 0 {
        if n & 1 != 0 {
            shift = crc_multiply(X_POW_2K[k % 32], shift);
        }
        n >>= 1;
        k += 1;
    }
    shift
}

impl CrcPiece {
    pub fn of(bytes: &[u8]) -> CrcPiece {
        let mut crc = Crc::new();
        crc.update(bytes);
        CrcPiece { crc: crc.sum(), shift: crc_shift(bytes.len() as u64), len: bytes.len() as u64 }
    }

    /// The empty stream's.
    pub fn empty() -> CrcPiece {
        CrcPiece { crc: 0, shift: 1 << 31, len: 0 }
    }

    /// Makes this the CRC of this piece followed by `next`. Only the CRC and length move on:
    /// a running CRC never needs its own shift (a second multiplication).
    pub fn append(&mut self, next: &CrcPiece) {
        self.crc = crc_multiply(self.crc, next.shift) ^ next.crc;
        self.len += next.len;
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

    /// Joined CRCs are the CRC of the joined bytes: pieces of any length, empty ones, and
    /// pieces joined in any grouping.
    #[test]
    fn joined_crcs_are_the_crc_of_the_joined_bytes() {
        let bytes: Vec<u8> = (0..100_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        let mut state = 7u64;
        let mut cuts: Vec<usize> = (0..40)
            .map(|_| {
                state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                (state >> 33) as usize % bytes.len()
            })
            .chain([0, 0, 1, bytes.len(), bytes.len()])
            .collect();
        cuts.sort_unstable();
        let pieces: Vec<&[u8]> = cuts.windows(2).map(|w| &bytes[w[0]..w[1]]).collect();
        let whole = CrcPiece::of(&bytes);
        let mut running = CrcPiece::empty();
        pieces.iter().for_each(|p| running.append(&CrcPiece::of(p)));
        assert_eq!(running, CrcPiece { shift: running.shift, ..whole }, "the running CRC");
        // A long piece joined: the first half's pieces, then the rest whole.
        let half = cuts[cuts.len() / 2];
        let mut left = CrcPiece::empty();
        pieces[..cuts.len() / 2].iter().for_each(|p| left.append(&CrcPiece::of(p)));
        left.append(&CrcPiece::of(&bytes[half..]));
        assert_eq!((left.crc, left.len), (whole.crc, whole.len));
        let mut crc = Crc::new();
        crc.update(&bytes);
        assert_eq!((whole.crc, whole.len), (crc.sum(), bytes.len() as u64), "flate2's CRC");
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
