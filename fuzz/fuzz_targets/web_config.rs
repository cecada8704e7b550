//! `--web.config.file` (TLS and basic authentication, exporter-toolkit's format).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let _ = strata_server::web::WebConfig::parse(text, std::path::Path::new("/nonexistent"));
});
