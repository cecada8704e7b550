//! Carbon pickle messages (the body after the length prefix): a list of points (each taken or
//! refused) or an error; never a panic, a hang or unbounded memory from the memo.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = strata_graphite::carbon::pickle::decode(data, 1_700_000_000_000);
});
