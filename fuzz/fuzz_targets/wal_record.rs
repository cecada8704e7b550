//! Write-ahead log records (series, samples, histograms, tombstones, with and without start
//! times), as replay reads them after the page checksums passed.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = strata_tsdb::record::decode(data);
});
