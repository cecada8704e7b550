//! A block's `meta.json`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = strata_tsdb::block::BlockMeta::parse(std::path::Path::new("meta.json"), data);
});
