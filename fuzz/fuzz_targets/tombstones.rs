//! A block's tombstones file.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(t) = strata_tsdb::block::tombstones::decode(data) {
        // What decodes, encodes and decodes to the same.
        let again = strata_tsdb::block::tombstones::decode(&strata_tsdb::block::tombstones::encode(&t)).unwrap();
        assert_eq!(format!("{t:?}"), format!("{again:?}"));
    }
});
