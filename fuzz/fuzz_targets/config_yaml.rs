//! `strata serve --config`: storage, limits, global and scrape_configs (with relabeling and
//! discovery), as a start or a reload reads it.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(c) = strata_server::config_file::ConfigFile::parse(text) {
        let _ = c.scrape_jobs(std::path::Path::new("/nonexistent"));
    }
});
