//! Remote read requests (snappy-compressed protobuf).
#![no_main]

use libfuzzer_sys::fuzz_target;
use strata_server::remote;

fuzz_target!(|data: &[u8]| {
    let _ = remote::decode::<remote::ReadRequest>(data, 1 << 20);
});
