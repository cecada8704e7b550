//! Write-ahead log segments as replay reads them: the header (both versions), frames and their
//! checksums, the encoding byte, zstd payloads, then the records. The first byte picks how the
//! rest is taken: as a segment's bytes (most inputs stop at a checksum), or as frame bodies
//! (`u16` length, then the body) framed here with valid checksums, so that the encoding byte
//! and the decompression of arbitrary payloads are reached.
#![no_main]

use libfuzzer_sys::fuzz_target;
use strata_tsdb::wal::segment::{Frame, SegmentReader, SEGMENT_MAGIC};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let bytes = if mode & 1 == 0 {
        rest.to_vec()
    } else {
        // A version-2 header (or version 1 when bit 1 is set), then each body framed.
        let mut out = SEGMENT_MAGIC.to_vec();
        out.extend_from_slice(&[if mode & 2 == 0 { 2 } else { 1 }, 1, 0, 0]);
        let mut rest = rest;
        while rest.len() >= 2 {
            let len = (u16::from_le_bytes([rest[0], rest[1]]) as usize).min(rest.len() - 2);
            let body = &rest[2..2 + len];
            let len_bytes = (body.len() as u32).to_le_bytes();
            let crc = crc32c::crc32c_append(crc32c::crc32c(&len_bytes), body);
            out.extend_from_slice(&len_bytes);
            out.extend_from_slice(&crc.to_le_bytes());
            out.extend_from_slice(body);
            rest = &rest[2 + len..];
        }
        out
    };
    let mut reader = SegmentReader::from_bytes(std::path::Path::new("fuzz"), bytes);
    while let Ok(Frame::Record) = reader.next_frame() {
        let _ = strata_tsdb::record::decode(&reader.body);
    }
});
