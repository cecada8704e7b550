//! A hasher for maps keyed by u64 values that are already well mixed (label-set hashes) or
//! sequential (series references). SipHash would cost more than the rest of a lookup.

use std::hash::{BuildHasherDefault, Hasher};

#[derive(Default, Clone, Copy, Debug)]
pub struct U64Hasher(u64);

impl Hasher for U64Hasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only used for keys that are not plain integers; FNV-1a is enough there.
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
    }

    fn write_u64(&mut self, v: u64) {
        // Fibonacci hashing spreads sequential keys over the high bits hashbrown uses.
        self.0 = v.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn write_u32(&mut self, v: u32) {
        self.write_u64(v as u64);
    }
}

pub type U64BuildHasher = BuildHasherDefault<U64Hasher>;
pub type U64Map<K, V> = std::collections::HashMap<K, V, U64BuildHasher>;
