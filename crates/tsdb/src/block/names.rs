//! A block's `names` file: the dictionary of its metric names and their dotted-path nodes
//! (`index::name_dict`), as two fst tries, each with its length and CRC32C. Graphite's find and
//! PromQL's regexes on `__name__` walk it instead of the index's list of names. Byte layout:
//! `docs/format/names.md`.
//!
//! Blocks written before this file existed have none: their readers scan the index's values.

use std::path::Path;

use bytes::Bytes;

use crate::error::{io_err, Error, Result};
use crate::index::name_dict::NameDict;
use crate::vfs::Vfs;

pub const NAMES_FILE: &str = "names";
/// "STNM": Strata names.
pub const MAGIC: u32 = 0x5354_4E4D;
pub const VERSION: u8 = 1;
const HEADER_BYTES: usize = 8;

/// The file's bytes for `dict`.
pub fn encode(dict: &NameDict) -> Vec<u8> {
    let (forward, reversed) = dict.as_bytes();
    let mut out = Vec::with_capacity(HEADER_BYTES + forward.len() + reversed.len() + 24);
    out.extend_from_slice(&super::file_header(MAGIC, VERSION));
    for trie in [forward, reversed] {
        out.extend_from_slice(&(trie.len() as u64).to_be_bytes());
        out.extend_from_slice(trie);
        out.extend_from_slice(&crc32c::crc32c(trie).to_be_bytes());
    }
    out
}

/// The dictionary in `data` (the whole file; the tries stay in it, zero-copy).
pub fn decode(data: Bytes) -> Result<NameDict, String> {
    if data.len() < HEADER_BYTES || data[..HEADER_BYTES] != super::file_header(MAGIC, VERSION) {
        return Err("bad header or file too short".into());
    }
    let mut at = HEADER_BYTES;
    let mut tries = Vec::with_capacity(2);
    for which in ["forward", "reversed"] {
        let len = data
            .get(at..at + 8)
            .map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes")))
            .ok_or_else(|| format!("{which} trie: length cut off"))?;
        let end = usize::try_from(len)
            .ok()
            .and_then(|len| (at + 8).checked_add(len))
            .filter(|&end| end.checked_add(4).is_some_and(|e| e <= data.len()))
            .ok_or_else(|| format!("{which} trie: length {len} runs past the end of the file"))?;
        let trie = data.slice(at + 8..end);
        if crc32c::crc32c(&trie).to_be_bytes() != data[end..end + 4] {
            return Err(format!("{which} trie: checksum mismatch"));
        }
        tries.push(trie);
        at = end + 4;
    }
    if at != data.len() {
        return Err(format!("{} bytes after the tries", data.len() - at));
    }
    let reversed = tries.pop().expect("two tries");
    let forward = tries.pop().expect("two tries");
    NameDict::from_bytes(forward, reversed)
}

/// Writes `dict` as `dir/names`, fsynced.
pub fn write(fs: &dyn Vfs, dir: &Path, dict: &NameDict) -> Result<()> {
    let path = dir.join(NAMES_FILE);
    fs.write_synced(&path, &encode(dict)).map_err(io_err("write", &path))
}

/// The dictionary of the block in `dir`: `None` when the block has no `names` file (written
/// before it existed); `Error::BlockCorrupt` when its bytes fail their checks.
pub fn read(fs: &dyn Vfs, dir: &Path) -> Result<Option<NameDict>> {
    let path = dir.join(NAMES_FILE);
    if !fs.exists(&path) {
        return Ok(None);
    }
    let data = fs.map(&path).map_err(io_err("map", &path))?;
    decode(data)
        .map(Some)
        .map_err(|reason| Error::BlockCorrupt { block: dir.to_owned(), reason: format!("{NAMES_FILE}: {reason}") })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::name_dict::{NamePattern, LEAF};

    #[test]
    fn round_trips_and_every_damage_is_detected() {
        let dict = NameDict::build(["servers.dc1.cpu", "servers.dc2.cpu", "up"]);
        let bytes = encode(&dict);
        let back = decode(Bytes::from(bytes.clone())).unwrap();
        let mut leaves = Vec::new();
        back.search(&NamePattern::new(r".*\.cpu").unwrap(), |k, f| {
            if f & LEAF != 0 {
                leaves.push(String::from_utf8(k.to_vec()).unwrap());
            }
            true
        });
        leaves.sort();
        assert_eq!(leaves, ["servers.dc1.cpu", "servers.dc2.cpu"]);
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            assert!(decode(Bytes::from(bad)).is_err(), "flipping byte {i} went unnoticed");
        }
        for len in 0..bytes.len() {
            assert!(decode(Bytes::copy_from_slice(&bytes[..len])).is_err(), "cut at {len} went unnoticed");
        }
    }

    #[test]
    fn bytes_match_the_format_document() {
        let hex: Vec<String> = encode(&NameDict::build(["a.b"])).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, crate::block::tests::doc_example_hex("names.md", "names-example"));
    }
}
