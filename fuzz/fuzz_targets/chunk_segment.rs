//! A block's chunk segment file (both versions: entries, and groups stored or zstd-compressed),
//! read at refs taken from the input and at every place of the first groups: each read ends in
//! the chunk's bytes or an error naming the file and offset. Checksums pass under the fuzzer
//! (`cfg(fuzzing)`), so mutations reach the group decoding behind them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use strata_tsdb::block::chunks::{ChunkReader, ChunkRef, GROUP_ALIGN};

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let (refs, segment) = data.split_at(8);
    let dir = std::path::Path::new("fuzz/chunks");
    let Ok(r) = ChunkReader::from_segments(dir, vec![bytes::Bytes::copy_from_slice(segment)]) else { return };
    let given = u64::from_be_bytes(refs.try_into().expect("8 bytes"));
    let _ = r.chunk(ChunkRef(given));
    let _ = r.chunk(ChunkRef::new(1, given as u32));
    for group in 1..4u64 {
        for place in [0usize, 1, 2, 254] {
            if let Ok(c) = r.chunk(ChunkRef::in_group(1, group * GROUP_ALIGN, place)) {
                assert!(c.len() <= segment.len() * 64 + (16 << 20), "a chunk no bigger than a group");
            }
        }
    }
});
