//! Carbon plaintext lines, as a TCP or UDP listener splits them: each parses to a point or an
//! error with a reason, and a point's path spells back to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use strata_graphite::carbon::plaintext;
use strata_graphite::path::GraphitePath;

fuzz_target!(|data: &[u8]| {
    for line in data.split(|&b| b == b'\n') {
        if plaintext::is_blank(line) {
            continue;
        }
        if let Ok(p) = plaintext::parse_line(line, 1_700_000_000_000) {
            assert!(!p.value.is_nan());
            assert_eq!(GraphitePath::parse(&p.path.to_string()).unwrap(), p.path);
        }
    }
});
