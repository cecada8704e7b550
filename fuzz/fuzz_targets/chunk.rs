//! Chunk bytes of every encoding (XOR, histogram, and both with start times, dense, rollup):
//! iteration ends with the samples or an error, and seeking never goes back; a rollup chunk
//! decodes to its buckets or an error, whichever columns are asked for.
#![no_main]

use libfuzzer_sys::fuzz_target;
use strata_tsdb::chunkenc::rollup::{decode, Column, ColumnSet};
use strata_tsdb::chunkenc::ChunkIterator;

fuzz_target!(|data: &[u8]| {
    let _ = strata_tsdb::chunkenc::num_samples(data);
    for want in [ColumnSet::ALL, ColumnSet::of(&[Column::Sum, Column::Last]), ColumnSet::of(&[Column::Min, Column::Max])] {
        let mut buckets = Vec::new();
        if decode(data, want, &mut buckets).is_ok() {
            assert!(buckets.len() <= 1 << 16, "a chunk holds at most u16::MAX buckets");
        }
    }
    if let Ok(mut it) = ChunkIterator::new(data) {
        let mut out = Vec::new();
        it.decode_typed_into(&mut out);
        assert!(out.len() <= 1 << 16, "a chunk holds at most u16::MAX samples");
    }
    if let Ok(mut it) = ChunkIterator::new(data) {
        let mut last = i64::MIN;
        while let Some(s) = it.seek(last.saturating_add(1)) {
            assert!(s.t > last || last == i64::MIN, "seek went back: {} after {last}", s.t);
            last = s.t;
            if last == i64::MAX {
                break;
            }
        }
    }
});
