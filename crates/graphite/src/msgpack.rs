//! MessagePack answers as graphite-web writes them (`format=msgpack`): what a graphite-web
//! configured with `CLUSTER_SERVERS = ["host:port?format=msgpack"]` asks its cluster servers
//! for instead of pickle. The same lists of dicts as the pickle format, strings as `str`
//! (graphite-web packs with `use_bin_type=True`), `None` as nil, tuples as arrays.

/// Writes MessagePack values into a buffer, one call per value; maps and arrays announce
/// their length first.
#[derive(Debug, Default)]
pub struct Packer {
    out: Vec<u8>,
}

/// Writing into a `Vec` cannot fail; `rmp`'s writers still return a `Result`.
const INFALLIBLE: &str = "writing MessagePack into a Vec cannot fail";

/// A length as MessagePack's 32-bit length fields take it.
fn len32(len: usize) -> u32 {
    u32::try_from(len).expect("MessagePack arrays, maps and strings hold fewer than 2^32 entries")
}

impl Packer {
    pub fn new() -> Packer {
        Packer::default()
    }

    pub fn array(&mut self, len: usize) -> &mut Packer {
        rmp::encode::write_array_len(&mut self.out, len32(len)).expect(INFALLIBLE);
        self
    }

    pub fn map(&mut self, len: usize) -> &mut Packer {
        rmp::encode::write_map_len(&mut self.out, len32(len)).expect(INFALLIBLE);
        self
    }

    pub fn str(&mut self, s: &str) -> &mut Packer {
        rmp::encode::write_str(&mut self.out, s).expect(INFALLIBLE);
        self
    }

    /// The smallest encoding that holds `v`, as Python's packers choose.
    pub fn int(&mut self, v: i64) -> &mut Packer {
        rmp::encode::write_sint(&mut self.out, v).expect(INFALLIBLE);
        self
    }

    /// A Python float: always 64 bits.
    pub fn float(&mut self, v: f64) -> &mut Packer {
        rmp::encode::write_f64(&mut self.out, v).expect(INFALLIBLE);
        self
    }

    pub fn opt_float(&mut self, v: Option<f64>) -> &mut Packer {
        match v {
            Some(v) => self.float(v),
            None => {
                rmp::encode::write_nil(&mut self.out).expect(INFALLIBLE);
                self
            }
        }
    }

    pub fn bool(&mut self, v: bool) -> &mut Packer {
        rmp::encode::write_bool(&mut self.out, v).expect(INFALLIBLE);
        self
    }

    pub fn finish(self) -> Vec<u8> {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_packed_as_python_packs_them() {
        let mut p = Packer::new();
        p.array(2).map(1).str("a").int(1).array(4).opt_float(None).float(0.5).bool(true).int(-1_700_000_000);
        // Bytes as graphite-web's bundled packer writes them (`graphite.umsgpack.packb([{"a": 1},
        // [None, 0.5, True, -1700000000]])`, run with Debian's python3).
        let want: &[u8] = &[
            0x92, 0x81, 0xa1, b'a', 0x01, 0x94, 0xc0, 0xcb, 0x3f, 0xe0, 0, 0, 0, 0, 0, 0, 0xc3, 0xd2, 0x9a, 0xac, 0x0f,
            0x00,
        ];
        assert_eq!(p.finish(), want);
        let mut p = Packer::new();
        p.int(300).int(1_700_000_000).str(&"x".repeat(40));
        let out = p.finish();
        // `umsgpack.packb([300, 1700000000, "x" * 40])` after its array header.
        assert_eq!(&out[..3], &[0xcd, 0x01, 0x2c], "uint16 300");
        assert_eq!(&out[3..8], &[0xce, 0x65, 0x53, 0xf1, 0x00], "uint32 1700000000");
        assert_eq!(&out[8..10], &[0xd9, 40], "str8 of 40 bytes");
    }
}
