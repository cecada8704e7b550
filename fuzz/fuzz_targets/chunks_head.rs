//! A head chunk file (`docs/format/chunks_head.md`): parsing ends in entries that lie inside
//! the file, in time order within each entry, and at most an error naming the damaged offset;
//! each entry's chunk then decodes or fails with an error. Checksums pass under the fuzzer
//! (`cfg(fuzzing)`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use strata_tsdb::chunkenc::{ChunkIterator, TypedSample};
use strata_tsdb::head::chunk_files::parse;

fuzz_target!(|data: &[u8]| {
    let (entries, _err) = parse(data);
    for e in entries {
        assert!(e.start + e.len <= data.len() && e.mint <= e.maxt);
        if let Ok(mut it) = ChunkIterator::new(&data[e.start..e.start + e.len]) {
            let mut out: Vec<TypedSample> = Vec::new();
            it.decode_typed_into(&mut out);
        }
    }
});
