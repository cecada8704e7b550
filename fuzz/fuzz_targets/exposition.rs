//! The text exposition format and OpenMetrics (the first byte picks), as scrapes and
//! `/api/v1/import/prometheus` parse them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use strata_server::textparse::{Format, Parser};

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else { return };
    let Ok(text) = std::str::from_utf8(body) else { return };
    let format = if which & 1 == 1 { Format::OpenMetrics } else { Format::Prometheus };
    let mut p = Parser::new(text, format);
    for entry in p.by_ref() {
        let _ = entry;
    }
    let _ = p.finish();
});
