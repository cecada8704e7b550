//! A block's index file: opened (the table of contents' checksum is fixed up first, so the
//! fuzzer explores what lies behind it), then every label name, value and series read.
#![no_main]

use libfuzzer_sys::fuzz_target;
use strata_tsdb::block::{IndexFile, SymbolInterner};
use strata_tsdb::index::postings::Postings;

/// The table of contents: 4 offsets and a CRC32C over them, at the end of the file.
const TOC_BYTES: usize = 36;

fuzz_target!(|data: &[u8]| {
    let mut bytes = data.to_vec();
    if bytes.len() >= TOC_BYTES {
        let n = bytes.len();
        let crc = crc32c::crc32c(&bytes[n - TOC_BYTES..n - 4]);
        bytes[n - 4..].copy_from_slice(&crc.to_be_bytes());
    }
    let Ok(ix) = IndexFile::from_bytes(std::path::Path::new("index"), bytes.into()) else { return };
    for name in ix.label_names() {
        for value in ix.label_values(name) {
            if let Ok(Some(mut p)) = ix.postings(name, value) {
                while p.next().is_some() {}
            }
        }
    }
    let mut chunks = Vec::new();
    let mut interner = SymbolInterner::default();
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
