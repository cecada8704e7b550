//! A block's `tombstones` file: deleted time ranges per series id. Blocks are immutable, so a
//! deletion only rewrites this small file (atomically, by rename); compaction then drops the
//! deleted samples for good. Byte layout: `docs/format/block.md`.

use std::collections::BTreeMap;
use std::path::Path;

use crate::encoding::{put_uvarint, put_varint, Decoder};
use crate::error::{io_err, Error, Result};
use crate::fsutil::rename_durable;
use crate::vfs::Vfs;

pub const TOMBSTONES_FILE: &str = "tombstones";
/// "STTB": Strata tombstones.
pub const MAGIC: u32 = 0x5354_5442;
pub const VERSION: u8 = 1;

/// Deleted intervals (inclusive) by series id.
pub type Tombstones = BTreeMap<u64, Vec<(i64, i64)>>;

pub fn encode(stones: &Tombstones) -> Vec<u8> {
    let mut body = Vec::new();
    let n: usize = stones.values().map(Vec::len).sum();
    put_uvarint(&mut body, n as u64);
    for (&series, ivs) in stones {
        for &(mint, maxt) in ivs {
            put_uvarint(&mut body, series);
            put_varint(&mut body, mint);
            put_varint(&mut body, maxt);
        }
    }
    let mut out = Vec::with_capacity(body.len() + 16);
    out.extend_from_slice(&super::file_header(MAGIC, VERSION));
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
    out
}

pub fn decode(data: &[u8]) -> Result<Tombstones, String> {
    if data.len() < 16 || data[..4] != MAGIC.to_be_bytes() || data[4] != VERSION {
        return Err("bad header or file too short".into());
    }
    let len = u32::from_be_bytes(data[8..12].try_into().expect("4 bytes")) as usize;
    if data.len() != 12 + len + 4 {
        return Err(format!("length {len} does not match the file size {}", data.len()));
    }
    let body = &data[12..12 + len];
    if crc32c::crc32c(body).to_be_bytes() != data[12 + len..] {
        return Err("checksum mismatch".into());
    }
    let mut d = Decoder::new(body);
    let mut out = Tombstones::new();
    let mut read = || -> Result<(), crate::encoding::DecodeError> {
        let n = d.uvarint("tombstone count")?;
        for _ in 0..n {
            let series = d.uvarint("series id")?;
            let mint = d.varint("mint")?;
            let maxt = d.varint("maxt")?;
            out.entry(series).or_default().push((mint, maxt));
        }
        Ok(())
    };
    read().map_err(|e| e.to_string())?;
    Ok(out)
}

/// Reads `dir/tombstones` (none if missing): `Error::Io` if the disk fails,
/// `Error::BlockCorrupt` if the bytes fail their checks.
pub fn read(fs: &dyn Vfs, dir: &Path) -> Result<Tombstones> {
    let path = dir.join(TOMBSTONES_FILE);
    match fs.read(&path) {
        Ok(data) => decode(&data)
            .map_err(|e| Error::BlockCorrupt { block: dir.to_owned(), reason: format!("{}: {e}", path.display()) }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Tombstones::new()),
        Err(e) => Err(io_err("read", &path)(e)),
    }
}

/// Replaces `dir/tombstones` atomically: write a temporary file, fsync, rename.
pub fn write(fs: &dyn Vfs, dir: &Path, stones: &Tombstones) -> Result<()> {
    let tmp = dir.join(format!("{TOMBSTONES_FILE}.tmp"));
    let path = dir.join(TOMBSTONES_FILE);
    fs.write_synced(&tmp, &encode(stones)).map_err(io_err("write", &tmp))?;
    rename_durable(fs, &tmp, &path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_checksum() {
        let mut t = Tombstones::new();
        t.insert(3, vec![(-5, 10), (100, i64::MAX)]);
        t.insert(1, vec![(i64::MIN, 0)]);
        let data = encode(&t);
        assert_eq!(decode(&data).unwrap(), t);
        let mut bad = data.clone();
        bad[13] ^= 1;
        assert_eq!(decode(&bad).unwrap_err(), "checksum mismatch");
        assert!(decode(&data[..data.len() - 1]).is_err());
        assert_eq!(decode(&encode(&Tombstones::new())).unwrap(), Tombstones::new());
    }
}
