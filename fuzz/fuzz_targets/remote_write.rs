//! Remote write bodies, 1.0 and 2.0 (the first byte picks), snappy-compressed as senders send
//! them and raw: decoding must return a batch or an error, never panic or allocate past the
//! decompression limit.
#![no_main]

use libfuzzer_sys::fuzz_target;
use strata_server::remote;

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else { return };
    let v2 = which & 1 == 1;
    let read = |raw: &[u8]| {
        let batch = if v2 { remote::read_write_request_v2(raw) } else { remote::read_write_request(raw) };
        if let Ok(b) = batch {
            // Every span the decoder hands out must lie inside its arrays.
            for s in &b.series {
                assert!(s.labels.end <= b.labels.len() && s.samples.end <= b.samples.len());
                assert!(s.histograms.end <= b.histograms.len());
            }
        }
    };
    if which & 2 == 2 {
        if let Ok(raw) = remote::decompress(body, 1 << 20) {
            assert!(raw.len() <= 1 << 20);
            read(&raw);
        }
    } else {
        read(body);
    }
});
