//! A block's index file: opened (the table of contents' checksum is fixed up first, so the
//! fuzzer explores what lies behind it), then every label name, value and series read.
#![no_main]

use libfuzzer_sys::fuzz_target;
use strata_tsdb::block::{IndexFile, ReadCache};
use strata_tsdb::index::postings::Postings;

use strata_tsdb::block::index::{TOC_BYTES, TOC_BYTES_V1};

fuzz_target!(|data: &[u8]| {
    let mut bytes = data.to_vec();
    // The table of contents (its size depends on the version byte) ends with a CRC32C.
    let version_1 = bytes.get(4) == Some(&1);
    let toc = if version_1 { TOC_BYTES_V1 } else { TOC_BYTES };
    if bytes.len() >= toc {
        let n = bytes.len();
        let crc = crc32c::crc32c(&bytes[n - toc..n - 4]);
        bytes[n - 4..].copy_from_slice(&crc.to_be_bytes());
    }
    let Ok(ix) = IndexFile::from_bytes(std::path::Path::new("index"), bytes.into()) else { return };
    for name in ix.label_names() {
        for value in ix.label_values(&name) {
            if let Ok(Some(mut p)) = ix.postings(&name, &value) {
                let mut last = None;
                while let Some(id) = p.next() {
                    // Version 2 and 3 lists are increasing by construction (gaps + 1); version
                    // 1 lists are raw ids, whatever a damaged file holds.
                    assert!(version_1 || last < Some(id), "postings go forward");
                    last = Some(id);
                }
            }
            // Seeking never goes back either.
            if let Ok(Some(mut p)) = ix.postings(&name, &value) {
                let mut target = strata_model::SeriesRef(0);
                while let Some(id) = p.seek(target) {
                    assert!(version_1 || id >= target, "seek went back");
                    if id < target {
                        break;
                    }
                    target = strata_model::SeriesRef(id.0 + 3);
                }
            }
        }
    }
    // Version 5's time bounds: any range, any id (one past the series too), never a panic.
    let word = |i: usize| data.get(i * 8..i * 8 + 8).map_or(0, |b| i64::from_le_bytes(b.try_into().expect("8 bytes")));
    if let Some(filter) = ix.time_filter(word(1).min(word(2)), word(1).max(word(2))) {
        for id in 0..=ix.num_series().min(10_000) {
            let _ = filter.may_overlap(strata_model::SeriesRef(id));
        }
    }
    let mut chunks = Vec::new();
    let mut interner = ReadCache::default();
    let Ok(mut all) = ix.all_postings() else { return };
    let mut n = 0;
    while let Some(id) = all.next() {
        let _ = ix.series(id, &mut chunks, &mut interner);
        n += 1;
        if n > 10_000 {
            break;
        }
    }
});
