//! The dense chunk (encoding 0x05): how blocks store float samples.
//!
//! The head appends one sample at a time, so it needs an encoding that is valid after every
//! append (XOR). A block's chunks are written once, whole, and read many times; knowing every
//! sample up front, the encoder picks per chunk the representation that is smallest:
//!
//! - **Timestamps** as integers: usually their deltas as the chunk's smallest delta plus a
//!   bit-packed residual of a fixed width per chunk, so an exact scrape grid costs nothing per
//!   sample; a missed scrape is an exception (patched frame of reference, PFOR), not a wider
//!   field for every sample. Jittered timestamps are cheaper as their distance from a line
//!   (`t0 + j × step`: each one's own jitter, where a delta holds two), and a range that is not
//!   a power of two (3 values) packs in its own radix (1.6 bits, not 2).
//! - **Values** that are decimal numbers (what exporters print: `1234.56`, `0.25`, byte
//!   counts) as scaled integers `i / 10^e`, coded like the timestamps: raw, as deltas (counters)
//!   or as deltas of deltas, whichever is smallest, with a common factor taken out (memory sizes
//!   that are multiples of 4096). A value that is not such a number (NaN, the stale marker, ±Inf,
//!   -0.0, more than 15 significant digits) is an exception stored as its raw 64 bits.
//! - **Other values** (results of arithmetic, `0.1 + 0.2`) Gorilla XOR-coded as in the XOR
//!   chunk, when that is smaller.
//!
//! Decoding `i / 10^e` is exact: a decimal `d` with at most 15 significant digits parses to the
//! double nearest `d`, and IEEE division of the exact integer `i` by the exact `10^e` also
//! rounds `i / 10^e = d` to the nearest double; the encoder still checks every value bit for bit
//! and makes any that does not come back an exception, so every bit pattern round-trips.
//!
//! The byte layout is in `docs/format/chunks.md`.

use super::bstream::{BitReader, BitWriter};
use super::xor::{read_xor, write_xor, NO_WINDOW};
use super::{ChunkError, Encoding, HEADER_BYTES, SAMPLES_MAX};
use crate::encoding::{gcd, zigzag};
use strata_model::Sample;

/// Largest decimal exponent `e` of a scaled value `i / 10^e` (10^18 and every smaller power of
/// ten are exact doubles).
pub const DECIMAL_EXPONENT_MAX: usize = 18;

const POW10: [f64; DECIMAL_EXPONENT_MAX + 1] =
    [1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18];

/// Integers up to 2^53 in magnitude are exact doubles; scaled values stay below.
const EXACT_INT_MAX: f64 = 9_007_199_254_740_992.0;

/// Value section modes.
const VALUES_DECIMAL: u8 = 0;
const VALUES_XOR: u8 = 1;

/// Integer columns code their values raw (0), as deltas (1), as deltas of deltas (2), or as
/// their distance from a line `x0 + j × step` (3, `ORDER_LINE`).
const ORDER_LINE: usize = 3;
/// Heads (values the residuals start from) an order writes at most.
const HEADS_MAX: usize = 2;
/// A packed width field above 64 means offsets packed in base `width − RADIX_CODE_OFFSET`.
const RADIX_CODE_OFFSET: u32 = 62;
/// The largest radix: 7-bit width codes 65 to 127 are radixes 3 to 65.
const RADIX_MAX: u64 = 127 - RADIX_CODE_OFFSET as u64;

/// Encodes `samples` (at least one, at most `SAMPLES_MAX`, timestamps strictly increasing) as a
/// dense chunk.
pub fn encode(samples: &[Sample]) -> Vec<u8> {
    assert!(!samples.is_empty() && samples.len() <= SAMPLES_MAX, "a dense chunk holds 1..={SAMPLES_MAX} samples");
    debug_assert!(samples.windows(2).all(|p| p[0].t < p[1].t), "timestamps must increase");
    let mut header = Vec::with_capacity(samples.len() * 2 + 32);
    header.extend_from_slice(&[Encoding::Dense as u8]);
    header.extend_from_slice(&(samples.len() as u16).to_be_bytes());
    let mut w = BitWriter::with_bytes(header);
    let times: Vec<i64> = samples.iter().map(|s| s.t).collect();
    write_ints(&mut w, &times);

    let mut xor = w.clone();
    match decimal_values(samples) {
        Some(dec) => {
            write_decimal_values(&mut w, &dec);
            write_xor_values(&mut xor, samples);
            if w.bytes().len() <= xor.bytes().len() {
                w.into_bytes()
            } else {
                xor.into_bytes()
            }
        }
        None => {
            write_xor_values(&mut xor, samples);
            xor.into_bytes()
        }
    }
}

/// Values as scaled integers `ints[j] / 10^exponent`, and the ones that are not (by index, raw).
struct Decimal {
    exponent: u8,
    ints: Vec<i64>,
    exceptions: Vec<(usize, u64)>,
}

/// The smallest `e` with `v == round(v · 10^e) / 10^e`, bit for bit; `None` for values that
/// are no such decimal (non-finite, -0.0, too many digits).
fn decimal_exponent(v: f64) -> Option<usize> {
    as_decimal(v, DECIMAL_EXPONENT_MAX).map(|(_, e)| e)
}

/// `v` as the decimal `i / 10^e` with the smallest `e ≤ max_exponent` that gives `v` back bit
/// for bit as `i as f64 / 10^e` (what `decimal_value` computes); `None` for values that are no
/// such decimal (non-finite, -0.0, more digits, `|i| ≥ 2^53`).
pub(crate) fn as_decimal(v: f64, max_exponent: usize) -> Option<(i64, usize)> {
    if !v.is_finite() || v.to_bits() == (-0.0f64).to_bits() {
        return None;
    }
    for (e, p) in POW10.iter().enumerate().take(max_exponent.min(DECIMAL_EXPONENT_MAX) + 1) {
        let scaled = v * p;
        if scaled.abs() >= EXACT_INT_MAX {
            return None;
        }
        let i = scaled.round();
        if (i / p).to_bits() == v.to_bits() {
            return Some((i as i64, e));
        }
    }
    None
}

/// The value of the decimal `i / 10^e` (`e ≤ DECIMAL_EXPONENT_MAX`): exact for what
/// `as_decimal` returns.
pub(crate) fn decimal_value(i: i64, e: usize) -> f64 {
    if e == 0 {
        i as f64
    } else {
        i as f64 / POW10[e]
    }
}

/// `v` scaled by `10^e` (`e ≤ DECIMAL_EXPONENT_MAX`) if it comes back bit for bit.
pub(crate) fn scaled(v: f64, e: usize) -> Option<i64> {
    if v.to_bits() == (-0.0f64).to_bits() {
        return None;
    }
    let s = (v * POW10[e]).round();
    (s.abs() < EXACT_INT_MAX && (s / POW10[e]).to_bits() == v.to_bits()).then_some(s as i64)
}

/// The chunk's values as decimals at the one exponent the most precise value needs, or `None`
/// when under half of them are decimals (XOR is then smaller anyway).
fn decimal_values(samples: &[Sample]) -> Option<Decimal> {
    let exponent = samples.iter().filter_map(|s| decimal_exponent(s.v)).max()?;
    let mut ints = Vec::with_capacity(samples.len());
    let mut exceptions = Vec::new();
    for (j, s) in samples.iter().enumerate() {
        match scaled(s.v, exponent) {
            Some(i) => ints.push(i),
            None => {
                exceptions.push((j, s.v.to_bits()));
                // Repeat the previous integer so that deltas stay small around the exception.
                ints.push(ints.last().copied().unwrap_or(0));
            }
        }
    }
    (exceptions.len() * 2 <= samples.len()).then_some(Decimal { exponent: exponent as u8, ints, exceptions })
}

fn write_decimal_values(w: &mut BitWriter, dec: &Decimal) {
    w.write_bits(VALUES_DECIMAL as u64, 8);
    w.write_bits(dec.exponent as u64, 8);
    w.write_uvarint(dec.exceptions.len() as u64);
    let mut prev = 0;
    for &(j, bits) in &dec.exceptions {
        w.write_uvarint((j - prev) as u64);
        w.write_bits(bits, 64);
        prev = j;
    }
    write_ints(w, &dec.ints);
}

fn write_xor_values(w: &mut BitWriter, samples: &[Sample]) {
    w.write_bits(VALUES_XOR as u64, 8);
    let first = samples[0].v.to_bits();
    w.write_bits(first, 64);
    let (mut prev, mut leading, mut trailing) = (first, NO_WINDOW, 0);
    for s in &samples[1..] {
        let bits = s.v.to_bits();
        write_xor(w, prev, bits, &mut leading, &mut trailing);
        prev = bits;
    }
}

/// How many heads order `order` writes.
fn head_count(order: usize) -> usize {
    match order {
        ORDER_LINE => 2,
        k => k,
    }
}

/// How many residuals a column of `n` values has at `order` (`n` must be above `head_count`
/// or, for the line, at least 2).
fn residual_count(order: usize, n: usize) -> usize {
    match order {
        ORDER_LINE => n - 1,
        k => n - k,
    }
}

/// `xs` differenced `order` times (wrapping), or (the line) `x_j − x0 − j × step` from `j = 1`:
/// the values the packed part of a column holds.
fn residuals(xs: &[i64], order: usize, step: i64) -> Vec<i64> {
    if order == ORDER_LINE {
        let x0 = xs[0];
        return (1..xs.len()).map(|j| xs[j].wrapping_sub(x0).wrapping_sub((j as i64).wrapping_mul(step))).collect();
    }
    let mut r = xs.to_vec();
    for _ in 0..order {
        for j in (1..r.len()).rev() {
            r[j] = r[j].wrapping_sub(r[j - 1]);
        }
    }
    r.split_off(order.min(r.len()))
}

/// The values a column's residuals start from: `x0`, then `x1 − x0` (order 2) or the step (the
/// line).
fn column_heads(xs: &[i64], order: usize, step: i64) -> Vec<i64> {
    let mut heads = Vec::with_capacity(HEADS_MAX);
    if order >= 1 {
        heads.push(xs[0]);
    }
    if order == 2 {
        heads.push(xs[1].wrapping_sub(xs[0]));
    }
    if order == ORDER_LINE {
        heads.push(step);
    }
    heads
}

/// The steps worth trying for a line through `xs` (at least two values): the average step,
/// rounded, and the median one (a gap in a scrape grid moves the average, not the median).
fn line_steps(xs: &[i64]) -> Vec<i64> {
    let n = xs.len() as i128;
    let span = xs[xs.len() - 1] as i128 - xs[0] as i128;
    let average = ((2 * span + (n - 1)).div_euclid(2 * (n - 1))) as i64;
    let mut deltas: Vec<i64> = xs.windows(2).map(|p| p[1].wrapping_sub(p[0])).collect();
    let mid = deltas.len() / 2;
    let median = *deltas.select_nth_unstable(mid).1;
    if median == average {
        vec![average]
    } else {
        vec![average, median]
    }
}

/// How the offsets of a column are packed: `Bits(w)`, each in `w` bits; or `Radix(r)`, each a
/// digit below `r`, as many per group as fit 32 bits (`radix_group`). An offset that does not
/// fit is an exception: its low part packed, the rest (`offset / modulus`) patched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Packing {
    Bits(u32),
    Radix(u64),
}

impl Packing {
    /// The 7-bit width field: the width, or the radix plus `RADIX_CODE_OFFSET`.
    fn code(self) -> u32 {
        match self {
            Packing::Bits(w) => w,
            Packing::Radix(r) => r as u32 + RADIX_CODE_OFFSET,
        }
    }

    fn from_code(code: u32) -> Self {
        if code <= 64 {
            Packing::Bits(code)
        } else {
            Packing::Radix((code - RADIX_CODE_OFFSET) as u64)
        }
    }

    /// What the packed part of an offset is taken modulo; `None` for 64 bits (no exceptions).
    fn modulus(self) -> Option<u64> {
        match self {
            Packing::Bits(w) if w >= 64 => None,
            Packing::Bits(w) => Some(1u64 << w),
            Packing::Radix(r) => Some(r),
        }
    }

    /// Bits of `m` packed offsets.
    fn packed_bits(self, m: usize) -> usize {
        match self {
            Packing::Bits(w) => m * w as usize,
            Packing::Radix(r) => {
                let (k, bits) = radix_group(r, SAMPLES_MAX);
                let rest = m % k;
                (m / k) * bits + if rest > 0 { radix_group(r, rest).1 } else { 0 }
            }
        }
    }
}

/// The most digits a radix group holds: 20 of radix 3 (3^20 < 2^32 < 3^21).
const RADIX_GROUP_DIGITS_MAX: usize = 20;

/// For radix `r` (3..=65): how many digits a group holds (the most, up to `most`, whose
/// `r^k` fits 32 bits) and its bits (those of `r^k − 1`).
fn radix_group(r: u64, most: usize) -> (usize, usize) {
    let (mut k, mut pow) = (0usize, 1u64);
    while k < most && pow * r <= 1 << 32 {
        pow *= r;
        k += 1;
    }
    (k, (64 - (pow - 1).leading_zeros()) as usize)
}

/// The bits of group `group` of `m` offsets packed in base `radix`: a whole group's, but for
/// the column's last one of fewer digits.
fn radix_group_bits(radix: u64, m: usize, group: usize) -> usize {
    let (k, bits) = radix_group(radix, SAMPLES_MAX);
    match m.saturating_sub(group * k) {
        digits if digits >= k => bits,
        digits => radix_group(radix, digits).1,
    }
}

/// A packed column's plan: offsets from the smallest residual, divided by their common factor,
/// packed, offsets too large for the packing patched.
struct Packed {
    base: i64,
    factor: u64,
    packing: Packing,
    offsets: Vec<u64>,
    /// Estimated bits, to compare orders.
    bits: usize,
}

fn varint_bits(v: u64) -> usize {
    8 * (((64 - v.leading_zeros()).max(1) as usize).div_ceil(7))
}

fn plan(res: &[i64]) -> Packed {
    let base = res.iter().copied().min().unwrap_or(0);
    let mut offsets: Vec<u64> = res.iter().map(|&r| r.wrapping_sub(base) as u64).collect();
    let mut factor = 0;
    for &o in &offsets {
        factor = gcd(factor, o);
        if factor == 1 {
            break;
        }
    }
    if factor > 1 {
        offsets.iter_mut().for_each(|o| *o /= factor);
    }
    // Histogram of bit lengths, then the width with the fewest bits once exceptions (index and
    // high bits, about a byte each plus the high bits' varint) are counted.
    let mut lengths = [0usize; 65];
    for &o in &offsets {
        lengths[(64 - o.leading_zeros()) as usize] += 1;
    }
    let longest = lengths.iter().rposition(|&n| n > 0).unwrap_or(0);
    let index_bits = if offsets.len() <= 128 { 8 } else { 16 };
    let (mut width, mut best) = (longest, usize::MAX);
    for w in 0..=longest {
        let mut bits = offsets.len() * w;
        for (len, &n) in lengths.iter().enumerate().take(longest + 1).skip(w + 1) {
            bits += n * (index_bits + 8 * (len - w).div_ceil(7));
        }
        if bits < best {
            (width, best) = (w, bits);
        }
    }
    let mut packing = Packing::Bits(width as u32);
    // Offsets in a range that is not a power of two (a jitter of ±1 s in whole seconds: 3
    // values, 2 bits each, 1.6 in base 3): a radix just above the largest offset, or above the
    // few largest, which become exceptions.
    if longest <= 7 && offsets.len() > 1 {
        // The four largest offsets, largest first.
        let mut top = [0u64; 4];
        for &o in &offsets {
            if o > top[3] {
                let at = top.iter().position(|&t| o > t).expect("o > top[3]");
                top.copy_within(at..3, at + 1);
                top[at] = o;
            }
        }
        for exceptions in 0..4.min(offsets.len()) {
            let r = top[exceptions] + 1;
            if !(3..=RADIX_MAX).contains(&r) || r.is_power_of_two() {
                continue;
            }
            let p = Packing::Radix(r);
            let mut bits = p.packed_bits(offsets.len());
            for &o in &top[..exceptions] {
                bits += index_bits + varint_bits(o / r);
            }
            if bits < best {
                (packing, best) = (p, bits);
            }
        }
    }
    let overhead = varint_bits(zigzag(base)) + varint_bits(factor) + 7 + 8;
    Packed { base, factor, packing, offsets, bits: best + overhead }
}

/// Writes an integer column: the order (2 bits), its heads as zig-zag varints, then the packed
/// residuals (see `docs/format/chunks.md`).
fn write_ints(w: &mut BitWriter, xs: &[i64]) {
    let try_order = |k: usize, step: i64| {
        let p = plan(&residuals(xs, k, step));
        let head_bits: usize = column_heads(xs, k, step).iter().map(|&h| varint_bits(zigzag(h))).sum();
        (p.bits + head_bits, k, step, p)
    };
    let mut best = (0..=2.min(xs.len().saturating_sub(1)))
        .map(|k| try_order(k, 0))
        .min_by_key(|c| c.0)
        .expect("order 0 is always possible");
    // Off a line only when the orders so far pack anything: an exact grid (no bits per value)
    // is as small as a column gets.
    let exact = best.3.packing == Packing::Bits(0) && best.3.offsets.iter().all(|&o| o == 0);
    if xs.len() >= 3 && !exact {
        for step in line_steps(xs) {
            let c = try_order(ORDER_LINE, step);
            if c.0 < best.0 {
                best = c;
            }
        }
    }
    let (_, order, step, packed) = best;
    w.write_bits(order as u64, 2);
    for h in column_heads(xs, order, step) {
        w.write_varint(h);
    }
    w.write_varint(packed.base);
    w.write_uvarint(packed.factor);
    w.write_bits(packed.packing.code() as u64, 7);
    let modulus = packed.packing.modulus();
    let high = |o: u64| modulus.map_or(0, |m| o / m);
    let low = |o: u64| modulus.map_or(o, |m| o % m);
    let exceptions = packed.offsets.iter().filter(|&&o| high(o) != 0).count();
    w.write_uvarint(exceptions as u64);
    match packed.packing {
        Packing::Bits(width) => {
            for &o in &packed.offsets {
                w.write_bits(low(o), width);
            }
        }
        Packing::Radix(r) => {
            let (k, _) = radix_group(r, SAMPLES_MAX);
            for group in packed.offsets.chunks(k) {
                // Little-endian digits: the first offset is the lowest.
                let value = group.iter().rev().fold(0u64, |acc, &o| acc * r + low(o));
                w.write_bits(value, radix_group(r, group.len()).1 as u32);
            }
        }
    }
    let mut prev = 0;
    for (j, &o) in packed.offsets.iter().enumerate() {
        if high(o) != 0 {
            w.write_uvarint((j - prev) as u64);
            w.write_uvarint(high(o));
            prev = j;
        }
    }
}

fn corrupt(what: &str) -> ChunkError {
    ChunkError::Corrupt(format!("dense chunk: {what}"))
}

/// Reads the index of exception number `x`, written as its distance from the previous one at
/// `prev` (the first as the index itself; never 0 after it), and checks it is below `len`.
fn read_exception_index(
    r: &mut BitReader,
    data: &[u8],
    x: usize,
    prev: usize,
    len: usize,
) -> Result<usize, ChunkError> {
    let gap = r.read_uvarint(data).ok_or_else(|| corrupt("exception list ends early"))? as usize;
    let j = if x == 0 { Some(gap) } else { prev.checked_add(gap).filter(|_| gap > 0) };
    j.filter(|&j| j < len).ok_or_else(|| corrupt("exception index out of range"))
}

/// The fields of an integer column before its packed offsets.
#[derive(Clone, Copy)]
struct IntsHeader {
    order: usize,
    heads: [i64; HEADS_MAX],
    base: i64,
    factor: u64,
    packing: Packing,
    exceptions: usize,
}

/// Reads and checks an integer column's header (`n` values).
#[inline(always)]
fn read_ints_header(r: &mut BitReader, data: &[u8], n: usize) -> Result<IntsHeader, ChunkError> {
    let ends = || corrupt("integer column ends early");
    let order = r.read_bits(data, 2).ok_or_else(ends)? as usize;
    let fits = if order == ORDER_LINE { n >= 2 } else { order < n.max(1) };
    if !fits {
        return Err(corrupt("integer column order out of range"));
    }
    let mut heads = [0i64; HEADS_MAX];
    for h in heads.iter_mut().take(head_count(order)) {
        *h = r.read_varint(data).ok_or_else(ends)?;
    }
    let base = r.read_varint(data).ok_or_else(ends)?;
    let factor = r.read_uvarint(data).ok_or_else(ends)?;
    let packing = Packing::from_code(r.read_bits(data, 7).ok_or_else(ends)? as u32);
    if let Packing::Radix(radix) = packing {
        if radix < 3 {
            return Err(corrupt("packing radix below 3"));
        }
    }
    let exceptions = r.read_uvarint(data).ok_or_else(ends)? as usize;
    if exceptions > residual_count(order, n) {
        return Err(corrupt("more exceptions than values"));
    }
    if exceptions > 0 && packing.modulus().is_none() {
        return Err(corrupt("exceptions in a 64-bit column"));
    }
    Ok(IntsHeader { order, heads, base, factor, packing, exceptions })
}

/// `v / d` for `v` below 2^32 and `d` in 3..=65, by multiplying with `reciprocal(d)`: exact,
/// as `d < 2^8` (the error `v × (M·d − 2^40) / (d · 2^40)` stays under `1/d`).
#[inline(always)]
fn divide(v: u64, d: u64, reciprocal: u64) -> u64 {
    debug_assert!(v < 1 << 32 && (3..=RADIX_MAX).contains(&d));
    ((v as u128 * reciprocal as u128) >> 40) as u64
}

fn reciprocal(d: u64) -> u64 {
    (1u64 << 40).div_ceil(d)
}

/// Reads an integer column of `n` values written by `write_ints` into `out`.
fn read_ints(r: &mut BitReader, data: &[u8], n: usize, out: &mut Vec<i64>) -> Result<(), ChunkError> {
    out.clear();
    let header = read_ints_header(r, data, n)?;
    // One loop per order, the order's arithmetic inlined into it.
    match header.order {
        0 => read_offsets::<0>(r, data, n, &header, out),
        1 => read_offsets::<1>(r, data, n, &header, out),
        2 => read_offsets::<2>(r, data, n, &header, out),
        _ => read_offsets::<ORDER_LINE>(r, data, n, &header, out),
    }
}

/// Turns a column's packed offsets into its values, one after another (`value`), keeping what
/// the next one is computed from.
struct Offsets<const ORDER: usize> {
    base: i64,
    factor: u64,
    /// The last value (the line's last point for `ORDER_LINE`).
    value: i64,
    /// The last delta (order 2), or the line's step.
    delta: i64,
}

impl<const ORDER: usize> Offsets<ORDER> {
    /// The next value from its packed offset: scaled by the factor, moved by the base, then the
    /// differencing undone (order 1, 2) or the line added (`ORDER_LINE`).
    #[inline(always)]
    fn value(&mut self, offset: u64) -> i64 {
        // Baseline x86-64 has no vector 64-bit multiply: a factor of 1 (most columns) is not
        // multiplied (a fifth of `read_ints` was these multiplies).
        let scaled = if self.factor == 1 { offset } else { offset.wrapping_mul(self.factor) };
        let residual = self.base.wrapping_add(scaled as i64);
        match ORDER {
            0 => residual,
            1 => {
                self.value = self.value.wrapping_add(residual);
                self.value
            }
            2 => {
                self.delta = self.delta.wrapping_add(residual);
                self.value = self.value.wrapping_add(self.delta);
                self.value
            }
            _ => {
                self.value = self.value.wrapping_add(self.delta);
                self.value.wrapping_add(residual)
            }
        }
    }
}

/// `read_ints` after the header, for its order: the heads' values, then each packed offset
/// turned into its value as it is unpacked (one pass), or, where exceptions patch offsets,
/// once they are patched.
#[inline(always)]
fn read_offsets<const ORDER: usize>(
    r: &mut BitReader,
    data: &[u8],
    n: usize,
    header: &IntsHeader,
    out: &mut Vec<i64>,
) -> Result<(), ChunkError> {
    let ends = || corrupt("integer column ends early");
    let IntsHeader { heads, base, factor, packing, exceptions, .. } = *header;
    let m = residual_count(ORDER, n);
    let first = n - m;
    out.reserve(n);
    // The values the heads stand for: `x0` (orders 1, 2 and the line), `x1 = x0 + d0` (order 2).
    let mut offsets = Offsets::<ORDER> { base, factor, value: heads[0], delta: heads[1] };
    match ORDER {
        0 => {}
        1 | ORDER_LINE => out.push(heads[0]),
        _ => {
            offsets.value = heads[0].wrapping_add(heads[1]);
            out.extend([heads[0], offsets.value]);
        }
    }
    debug_assert_eq!(out.len(), first);
    if exceptions == 0 {
        unpack(r, data, packing, m, out, |o| offsets.value(o));
        return if r.overran(data) { Err(ends()) } else { Ok(()) };
    }
    // Exceptions add their high part to offsets: the offsets first (as u64 bits), patched,
    // then turned into values.
    unpack(r, data, packing, m, out, |o| o as i64);
    if r.overran(data) {
        return Err(ends());
    }
    let modulus = packing.modulus().unwrap_or(0);
    let mut j = 0usize;
    for x in 0..exceptions {
        j = read_exception_index(r, data, x, j, m)?;
        let high = r.read_uvarint(data).ok_or_else(ends)?;
        out[first + j] = (out[first + j] as u64).wrapping_add(high.wrapping_mul(modulus)) as i64;
    }
    for x in &mut out[first..] {
        *x = offsets.value(*x as u64);
    }
    Ok(())
}

/// Appends `m` packed offsets, each turned into a value by `value`, to `out`.
#[inline(always)]
fn unpack(
    r: &mut BitReader,
    data: &[u8],
    packing: Packing,
    m: usize,
    out: &mut Vec<i64>,
    mut value: impl FnMut(u64) -> i64,
) {
    match packing {
        Packing::Bits(0) => out.extend((0..m).map(|_| value(0))),
        Packing::Bits(width) if width <= UNPACK_WIDTH_MAX => unpack_bits(r, data, width, m, out, value),
        Packing::Bits(width) => {
            for _ in 0..m {
                out.push(value(r.read_bits_unchecked(data, width)));
            }
        }
        Packing::Radix(radix) => unpack_radix(r, data, radix, m, out, value),
    }
}

/// The widest offsets `unpack_bits` reads: a field of up to 56 bits starting anywhere in a byte
/// lies within the 8 bytes from that byte.
const UNPACK_WIDTH_MAX: u32 = 56;

/// Appends `m` offsets of `width` bits (1..=`UNPACK_WIDTH_MAX`) to `out`, each read from the
/// 8 bytes at its own bit position rather than through the reader's register (no refill
/// bookkeeping between values: one load and two shifts each). Values whose 8 bytes run past the
/// data are read zero-padded, as the register would; the reader is left after the last one.
#[inline(always)]
fn unpack_bits(
    r: &mut BitReader,
    data: &[u8],
    width: u32,
    m: usize,
    out: &mut Vec<i64>,
    mut value: impl FnMut(u64) -> i64,
) {
    debug_assert!((1..=UNPACK_WIDTH_MAX).contains(&width));
    let start = r.pos();
    let w = width as usize;
    // Offsets whose 8 bytes lie wholly inside `data`: the bit position `start + j·w` with
    // `pos / 8 + 8 <= len`.
    let whole = match (data.len() * 8).checked_sub(64 + start) {
        Some(room) => (room / w + 1).min(m),
        None => 0,
    };
    out.extend((0..whole).map(|j| {
        let bit = start + j * w;
        let word = u64::from_be_bytes(data[bit / 8..bit / 8 + 8].try_into().expect("8 bytes"));
        value((word << (bit % 8)) >> (64 - width))
    }));
    let mut rest = BitReader::new(0);
    rest.skip(data, start + whole * w);
    for _ in whole..m {
        out.push(value(rest.read_bits_unchecked(data, width)));
    }
    *r = rest;
}

/// Appends `m` base-`radix` digits, read a group at a time, to `out`. Kept out of `read_ints`
/// so that its loop over bit-packed offsets (most columns) stays as tight as before radixes.
#[inline(never)]
fn unpack_radix(
    r: &mut BitReader,
    data: &[u8],
    radix: u64,
    m: usize,
    out: &mut Vec<i64>,
    mut value: impl FnMut(u64) -> i64,
) {
    let (k, bits) = radix_group(radix, SAMPLES_MAX);
    let inverse = reciprocal(radix);
    let mut left = m;
    // Whole groups `LANES` at a time, their digits taken off side by side: each digit is a
    // multiply and a shift of the one before (a chain of about five cycles), so one group
    // at a time left the core waiting on each; four chains run in the time of one.
    const LANES: usize = 4;
    let mut digits = [0u64; LANES * RADIX_GROUP_DIGITS_MAX];
    debug_assert!(k <= RADIX_GROUP_DIGITS_MAX);
    while left >= LANES * k {
        let mut v = [0u64; LANES];
        for x in &mut v {
            *x = r.read_bits_unchecked(data, bits as u32);
        }
        for j in 0..k {
            for (lane, x) in v.iter_mut().enumerate() {
                let q = divide(*x, radix, inverse);
                digits[lane * k + j] = *x - q * radix;
                *x = q;
            }
        }
        out.extend(digits[..LANES * k].iter().map(|&d| value(d)));
        left -= LANES * k;
    }
    while left > 0 {
        let digits = left.min(k);
        let group_bits = if digits == k { bits } else { radix_group(radix, digits).1 };
        // At most 32 bits (`radix_group`), as `divide` needs.
        let mut v = r.read_bits_unchecked(data, group_bits as u32);
        for _ in 0..digits {
            let q = divide(v, radix, inverse);
            out.push(value(v - q * radix));
            v = q;
        }
        left -= digits;
    }
}

/// Moves past an integer column of `n` values written by `write_ints`, checking its header
/// and exception list as `read_ints` does but unpacking nothing.
fn skip_ints(r: &mut BitReader, data: &[u8], n: usize) -> Result<(), ChunkError> {
    RandomColumn::read(r, data, n).map(|_| ())
}

thread_local! {
    /// The integer columns of the chunk being decoded, kept per thread so that decoding a
    /// chunk allocates only its samples.
    static COLUMNS: std::cell::RefCell<Columns> = const {
        std::cell::RefCell::new(Columns { times: Vec::new(), ints: Vec::new() })
    };
}

/// Buffers of one chunk's decoding.
struct Columns {
    times: Vec<i64>,
    ints: Vec<i64>,
}

#[inline(always)]
fn with_columns<T>(f: impl FnOnce(&mut Columns) -> T) -> T {
    COLUMNS.with(|c| match c.try_borrow_mut() {
        Ok(mut cols) => f(&mut cols),
        // Only reentrancy could hold it; decode with fresh buffers then.
        Err(_) => f(&mut Columns { times: Vec::new(), ints: Vec::new() }),
    })
}

/// Decodes a whole dense chunk into `out` (appended). The header has been checked.
pub(crate) fn decode(data: &[u8], out: &mut Vec<Sample>) -> Result<(), ChunkError> {
    let start = out.len();
    decode_into(data, &mut Samples { out, start }).map(|_| ())
}

/// Decodes the samples of a dense chunk from `from` to `until` (inclusive) into `out`
/// (appended). The header must have been checked.
///
/// A read of a few minutes of a chunk (an instant query or a refreshed dashboard's new step
/// over a block's chunk of 240 samples, or over the head's newest written-out chunk) needs a
/// few of its samples. Columns coded raw or off a line hold each value on its own, and a value
/// of a delta-coded column is its first plus the residuals before it, so each column is
/// unpacked into values for the samples in range only (`RandomColumn`): the first and the last
/// are found from the line or the grid the timestamps are coded on, and the residuals of
/// deltas before the first are only summed. Timestamps coded as uneven deltas, and columns
/// coded as deltas of deltas, are read whole and the samples out of range dropped; XOR-coded
/// values are decoded whole but written in range. What is returned is checked as `decode`
/// checks it: the timestamps read increase, every column ends where its length says, and the
/// chunk ends with its last sample.
pub(crate) fn decode_range(data: &[u8], from: i64, until: i64, out: &mut Vec<Sample>) -> Result<(), ChunkError> {
    let n = u16::from_be_bytes([data[1], data[2]]) as usize;
    let mut r = BitReader::new(HEADER_BYTES);
    let times = match n {
        0 => None,
        _ => RandomColumn::open(&mut r, data, n)?,
    };
    let Some(times) = times.filter(RandomColumn::random_access) else {
        // Timestamps found only by summing (or an empty chunk): decoded whole.
        let start = out.len();
        decode(data, out)?;
        let kept = out[start..].partition_point(|s| s.t <= until);
        out.truncate(start + kept);
        let early = out[start..].partition_point(|s| s.t < from);
        out.drain(start..start + early);
        return Ok(());
    };
    let first = times.first_at_or_after(data, from);
    let end = until.checked_add(1).map_or(n, |after| times.first_at_or_after(data, after)).max(first);
    if first == 0 && end == n {
        return decode(data, out);
    }
    with_columns(|c| {
        times.values_in(data, first..end, &mut c.times);
        if c.times.windows(2).fold(false, |disorder, p| disorder | (p[0] >= p[1])) {
            return Err(corrupt("timestamps do not increase"));
        }
        let start = out.len();
        let mut r = BitReader::new(0);
        r.skip(data, times.end);
        read_values_in(&mut r, data, n, first..end, &mut c.ints, &c.times, &mut Samples { out, start })
    })
}

/// `read_values` of the values in `range` only (part of the chunk), into `sink` with their
/// timestamps `times` (one per value of the range); the sink's value 0 is the range's first.
fn read_values_in(
    r: &mut BitReader,
    data: &[u8],
    n: usize,
    range: std::ops::Range<usize>,
    ints: &mut Vec<i64>,
    times: &[i64],
    sink: &mut impl ValueSink,
) -> Result<(), ChunkError> {
    let ends = || corrupt("value section ends early");
    match r.read_bits(data, 8).ok_or_else(ends)? as u8 {
        VALUES_DECIMAL => {
            let (e, mut patches) = read_decimal_head(r, data, n)?;
            patches.retain(|(j, _)| range.contains(j));
            patches.iter_mut().for_each(|(j, _)| *j -= range.start);
            let mut after = *r;
            match RandomColumn::open(&mut after, data, n)? {
                Some(column) => {
                    column.values_in(data, range, ints);
                    *r = after;
                }
                None => {
                    read_ints(r, data, n, ints)?;
                    ints.truncate(range.end);
                    ints.drain(..range.start);
                }
            }
            decimal_into(sink, times, ints, e, &patches);
        }
        VALUES_XOR => {
            // Decoded to the end all the same (each value needs the one before it), so that
            // the chunk is checked as a whole read checks it.
            let mut bits = r.read_bits(data, 64).ok_or_else(ends)?;
            let (mut leading, mut trailing) = (0u8, 0u8);
            let mut values = Vec::with_capacity(range.len());
            for j in 0..n {
                if j > 0 && !read_xor(r, data, &mut bits, &mut leading, &mut trailing) {
                    return Err(corrupt("XOR value window over 64 bits"));
                }
                if range.contains(&j) {
                    values.push(f64::from_bits(bits));
                }
            }
            if r.overran(data) {
                return Err(ends());
            }
            sink.extend(times, values.into_iter());
        }
        other => return Err(corrupt(&format!("unknown value mode {other}"))),
    }
    if r.pos().div_ceil(8) != data.len() {
        return Err(corrupt("bytes after the last sample"));
    }
    Ok(())
}

/// An integer column read from any of its values on, without unpacking those before it into
/// values: coded raw (order 0) or off a line, where a value is its own residual (plus the
/// line at its index), or as deltas (order 1), where it is the sum of the residuals before
/// it, which are then summed rather than turned into values one by one.
struct RandomColumn {
    header: IntsHeader,
    n: usize,
    /// Where the packed offsets start and where the column ends (bit positions).
    packed: usize,
    end: usize,
    /// Exceptions: residual index and what is added to its packed part, in index order.
    patches: Vec<(usize, u64)>,
}

impl RandomColumn {
    /// Reads the header of a column of `n` values at `r` and its exception list, leaving `r`
    /// after the column; `None` for deltas of deltas.
    fn open(r: &mut BitReader, data: &[u8], n: usize) -> Result<Option<RandomColumn>, ChunkError> {
        Ok(Some(Self::read(r, data, n)?).filter(|c| c.header.order != 2))
    }

    /// `open`, of a column of any order.
    fn read(r: &mut BitReader, data: &[u8], n: usize) -> Result<RandomColumn, ChunkError> {
        let ends = || corrupt("integer column ends early");
        let header = read_ints_header(r, data, n)?;
        let packed = r.pos();
        let m = residual_count(header.order, n);
        r.skip(data, header.packing.packed_bits(m));
        if r.overran(data) {
            return Err(ends());
        }
        let modulus = header.packing.modulus().unwrap_or(0);
        let mut patches = Vec::with_capacity(header.exceptions);
        let mut j = 0usize;
        for x in 0..header.exceptions {
            j = read_exception_index(r, data, x, j, m)?;
            let high = r.read_uvarint(data).ok_or_else(ends)?;
            patches.push((j, high.wrapping_mul(modulus)));
        }
        Ok(RandomColumn { header, n, packed, end: r.pos(), patches })
    }

    /// Whether each value can be read on its own (`at`): raw and line-coded columns, and
    /// deltas that are all the same (an exact scrape grid: no packed bits, no exception).
    fn random_access(&self) -> bool {
        self.header.order != 1 || (self.header.packing == Packing::Bits(0) && self.patches.is_empty())
    }

    /// The index of value `j`'s residual among the packed ones (`None`: the head `x0`).
    fn residual_index(&self, j: usize) -> Option<usize> {
        match self.header.order {
            0 => Some(j),
            _ => j.checked_sub(1),
        }
    }

    /// Value `j` from its residual's offset (patched), for raw and line-coded columns.
    #[inline(always)]
    fn value(&self, j: usize, offset: u64) -> i64 {
        let h = &self.header;
        let residual = h.base.wrapping_add(offset.wrapping_mul(h.factor) as i64);
        match h.order {
            ORDER_LINE => h.heads[0].wrapping_add((j as i64).wrapping_mul(h.heads[1])).wrapping_add(residual),
            _ => residual,
        }
    }

    /// Value `j` (below `n`) of a column with `random_access`.
    fn at(&self, data: &[u8], j: usize) -> i64 {
        debug_assert!(self.random_access());
        let Some(i) = self.residual_index(j) else { return self.header.heads[0] };
        if self.header.order == 1 {
            // Equal deltas: the base each.
            return self.header.heads[0].wrapping_add((j as i64).wrapping_mul(self.header.base));
        }
        let mut offset = match self.header.packing {
            Packing::Bits(0) => 0,
            Packing::Bits(w) => {
                let mut r = BitReader::new(0);
                r.skip(data, self.packed + i * w as usize);
                r.read_bits_unchecked(data, w)
            }
            Packing::Radix(radix) => {
                let (k, bits) = radix_group(radix, SAMPLES_MAX);
                let m = residual_count(self.header.order, self.n);
                let group = i / k;
                let mut r = BitReader::new(0);
                r.skip(data, self.packed + group * bits);
                let v = r.read_bits_unchecked(data, radix_group_bits(radix, m, group) as u32);
                (v / radix.pow((i - group * k) as u32)) % radix
            }
        };
        if let Ok(x) = self.patches.binary_search_by_key(&i, |p| p.0) {
            offset = offset.wrapping_add(self.patches[x].1);
        }
        self.value(j, offset)
    }

    /// The first index whose value is at least `from` (`n` if none), in a column with
    /// `random_access` whose values increase (timestamps). Off a line or on a grid it starts
    /// where the line puts `from` and walks from there: a scrape's timestamps are within a
    /// step of it, so that is one or two reads. Raw values are searched by halves.
    fn first_at_or_after(&self, data: &[u8], from: i64) -> usize {
        let h = &self.header;
        let line = match h.order {
            ORDER_LINE => Some((h.heads[0] as i128 + h.base as i128, h.heads[1])),
            1 => Some((h.heads[0] as i128, h.base)),
            _ => None,
        };
        let Some((x0, step)) = line.filter(|&(_, step)| step > 0) else {
            let (mut lo, mut hi) = (0, self.n);
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if self.at(data, mid) < from {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            return lo;
        };
        let guess = (from as i128 - x0).div_euclid(step as i128);
        let mut j = guess.clamp(0, self.n as i128 - 1) as usize;
        if self.at(data, j) >= from {
            while j > 0 && self.at(data, j - 1) >= from {
                j -= 1;
            }
        } else {
            while j < self.n && self.at(data, j) < from {
                j += 1;
            }
        }
        j
    }

    /// Value `i` of a delta-coded column: `x0` plus the residuals before it, their offsets
    /// summed as packed.
    fn delta_prefix(&self, data: &[u8], i: usize) -> i64 {
        let h = &self.header;
        let mut sum = sum_offsets(data, self.packed, h.packing, residual_count(h.order, self.n), i);
        for &(_, add) in self.patches.iter().take_while(|p| p.0 < i) {
            sum = sum.wrapping_add(add);
        }
        h.heads[0].wrapping_add((i as i64).wrapping_mul(h.base)).wrapping_add(sum.wrapping_mul(h.factor) as i64)
    }

    /// Values `range` (within `0..n`) into `out` (cleared).
    fn values_in(&self, data: &[u8], range: std::ops::Range<usize>, out: &mut Vec<i64>) {
        out.clear();
        if range.is_empty() {
            return;
        }
        let m = residual_count(self.header.order, self.n);
        let i0 = match self.residual_index(range.start) {
            Some(i) => i,
            None => {
                out.push(self.header.heads[0]);
                0
            }
        };
        // Residuals `i0..i1` stand for the range's values after any head.
        let i1 = self.residual_index(range.end - 1).map_or(0, |i| i + 1);
        if i0 >= i1 {
            return;
        }
        // The packed offsets from `i0`: a radix group is read whole (to its end, or the
        // column's), its digits outside `i0..i1` dropped.
        let mut r = BitReader::new(0);
        let (from, skipped, count) = match self.header.packing {
            Packing::Bits(w) => (self.packed + i0 * w as usize, 0, i1 - i0),
            Packing::Radix(radix) => {
                let (k, bits) = radix_group(radix, SAMPLES_MAX);
                let group_start = (i0 / k) * k;
                (self.packed + (i0 / k) * bits, i0 - group_start, i1.next_multiple_of(k).min(m) - group_start)
            }
        };
        r.skip(data, from);
        let at = out.len();
        unpack(&mut r, data, self.header.packing, count, out, |o| o as i64);
        out.truncate(at + skipped + (i1 - i0));
        out.drain(at..at + skipped);
        let patched = self.patches.partition_point(|p| p.0 < i0);
        for &(i, add) in self.patches[patched..].iter().take_while(|p| p.0 < i1) {
            let x = &mut out[at + i - i0];
            *x = (*x as u64).wrapping_add(add) as i64;
        }
        if self.header.order == 1 {
            let (base, factor) = (self.header.base, self.header.factor);
            let mut x = self.delta_prefix(data, i0);
            for o in &mut out[at..] {
                x = x.wrapping_add(base).wrapping_add((*o as u64).wrapping_mul(factor) as i64);
                *o = x;
            }
            return;
        }
        let j0 = match self.header.order {
            ORDER_LINE => i0 + 1,
            _ => i0,
        };
        for (x, j) in out[at..].iter_mut().zip(j0..) {
            *x = self.value(j, *x as u64);
        }
    }
}

/// The sum (wrapping) of the first `count` offsets packed from bit `packed`, unpatched: what
/// the residuals before a value of a delta-coded column add up to, without unpacking them
/// into a buffer.
fn sum_offsets(data: &[u8], packed: usize, packing: Packing, m: usize, count: usize) -> u64 {
    debug_assert!(count <= m);
    let mut r = BitReader::new(0);
    r.skip(data, packed);
    match packing {
        Packing::Bits(0) => 0,
        Packing::Bits(w) if w <= UNPACK_WIDTH_MAX => {
            let w = w as usize;
            let mut sum = 0u64;
            // Each offset from the 8 bytes at its own bit position (as `unpack_bits`), those
            // near the end through the reader.
            let whole = match (data.len() * 8).checked_sub(64 + packed) {
                Some(room) => (room / w + 1).min(count),
                None => 0,
            };
            for j in 0..whole {
                let bit = packed + j * w;
                let word = u64::from_be_bytes(data[bit / 8..bit / 8 + 8].try_into().expect("8 bytes"));
                sum = sum.wrapping_add((word << (bit % 8)) >> (64 - w));
            }
            r.skip(data, whole * w);
            for _ in whole..count {
                sum = sum.wrapping_add(r.read_bits_unchecked(data, w as u32));
            }
            sum
        }
        Packing::Bits(w) => (0..count).fold(0u64, |sum, _| sum.wrapping_add(r.read_bits_unchecked(data, w))),
        Packing::Radix(radix) => {
            let k = radix_group(radix, SAMPLES_MAX).0;
            let inverse = reciprocal(radix);
            let mut sum = 0u64;
            let mut left = count;
            let mut group = 0;
            while left > 0 {
                let mut v = r.read_bits_unchecked(data, radix_group_bits(radix, m, group) as u32);
                group += 1;
                for _ in 0..left.min(k) {
                    let q = divide(v, radix, inverse);
                    sum = sum.wrapping_add(v - q * radix);
                    v = q;
                }
                left -= left.min(k);
            }
            sum
        }
    }
}

/// Decodes a whole dense chunk into `sink`, its timestamps with its values. The header must
/// have been checked. Returns where its timestamps end (a bit position in `data`), for
/// `decode_values_into` of columns with the same timestamps.
pub(super) fn decode_into(data: &[u8], sink: &mut impl ValueSink) -> Result<usize, ChunkError> {
    after_times(data, |r, c, n| {
        let times_end = r.pos();
        read_values(r, data, n, &mut c.ints, &c.times, sink)?;
        Ok(times_end)
    })
}

/// Decodes the timestamps of a whole dense chunk into `out` (appended), not its values (a
/// rollup chunk's bucket ends, from its count column, for a reader of other aggregates). The
/// header must have been checked. Returns where the timestamps end, as `decode_into` does.
pub(super) fn decode_times_into(data: &[u8], out: &mut Vec<i64>) -> Result<usize, ChunkError> {
    after_times(data, |r, c, _| {
        out.extend_from_slice(&c.times);
        Ok(r.pos())
    })
}

/// Reads a dense chunk's timestamps into the thread's `Columns::times`, then calls `then` with
/// the reader after them, the columns and the sample count; an empty chunk's answer is where
/// its header ends. The header must have been checked.
#[inline(always)]
fn after_times(
    data: &[u8],
    then: impl FnOnce(&mut BitReader, &mut Columns, usize) -> Result<usize, ChunkError>,
) -> Result<usize, ChunkError> {
    with_columns(|c| {
        let n = u16::from_be_bytes([data[1], data[2]]) as usize;
        if n == 0 {
            return Ok(HEADER_BYTES * 8);
        }
        let mut r = BitReader::new(HEADER_BYTES);
        read_times(&mut r, data, n, &mut c.times)?;
        then(&mut r, c, n)
    })
}

/// Reads the timestamp column of `n` (at least one) samples into `times`, checking that they
/// increase.
#[inline(always)]
fn read_times(r: &mut BitReader, data: &[u8], n: usize, times: &mut Vec<i64>) -> Result<(), ChunkError> {
    read_ints(r, data, n, times)?;
    // Checked without stopping at the first disorder (which only damage has): a loop that runs
    // to the end vectorizes, one that may stop does not.
    if times.iter().zip(&times[1..]).fold(false, |disorder, (a, b)| disorder | (a >= b)) {
        return Err(corrupt("timestamps do not increase"));
    }
    Ok(())
}

/// Decodes the values of a whole dense chunk into `sink`, skipping its timestamps (a rollup
/// chunk's columns share theirs: `sink` is given none). The header must have been checked.
///
/// `shared`: a chunk of as many samples and where its timestamps end (`decode_into`'s
/// answer; a position before the end of the header when there is none). Where this chunk's
/// timestamp bits are those bits, they are the same integer column
/// and end at the same place, so they are stepped over without reading their header and
/// exception list (each column of a rollup chunk stamped at its buckets' ends writes the same
/// bits: at a few buckets per chunk, reading them was a tenth of decoding). Otherwise they are
/// read through as any others.
pub(super) fn decode_values_into(
    data: &[u8],
    (other, end): (&[u8], usize),
    sink: &mut impl ValueSink,
) -> Result<(), ChunkError> {
    with_columns(|c| {
        let n = u16::from_be_bytes([data[1], data[2]]) as usize;
        if n == 0 {
            return Ok(());
        }
        let mut r = BitReader::new(HEADER_BYTES);
        if same_bits(data, other, end) {
            r.skip(data, end - HEADER_BYTES * 8);
        } else {
            skip_ints(&mut r, data, n)?;
        }
        read_values(&mut r, data, n, &mut c.ints, &[], sink)
    })
}

/// Whether `a` and `b` hold the same bits from the end of the header up to bit `end`.
fn same_bits(a: &[u8], b: &[u8], end: usize) -> bool {
    let (whole, rest) = (end / 8, end % 8);
    if end < HEADER_BYTES * 8 || a.len() < end.div_ceil(8) || b.len() < end.div_ceil(8) {
        return false;
    }
    let mask = !(0xffu8 >> rest);
    a[HEADER_BYTES..whole] == b[HEADER_BYTES..whole] && (rest == 0 || a[whole] & mask == b[whole] & mask)
}

/// Where a chunk's decoded values go, in one pass: the rollup chunk fills its buckets' fields
/// straight from its columns.
pub(super) trait ValueSink {
    /// Takes the chunk's values in order, with its timestamps (`times`: empty when they were
    /// skipped, else one per value).
    fn extend(&mut self, times: &[i64], values: impl Iterator<Item = f64>);
    /// `extend` with values that are whole numbers, as read (a decimal chunk of exponent 0):
    /// a sink of counts takes them as they are, without a trip through `f64` and back.
    #[inline(always)]
    fn extend_ints(&mut self, times: &[i64], ints: &[i64]) {
        self.extend(times, ints.iter().map(|&i| i as f64));
    }
    /// Replaces the `j`-th value taken (an exception: a value stored as its raw bits).
    fn patch(&mut self, j: usize, v: f64);
}

/// Values paired with the chunk's timestamps into samples.
struct Samples<'a> {
    out: &'a mut Vec<Sample>,
    start: usize,
}

impl ValueSink for Samples<'_> {
    #[inline(always)]
    fn extend(&mut self, times: &[i64], values: impl Iterator<Item = f64>) {
        self.out.extend(times.iter().zip(values).map(|(&t, v)| Sample { t, v }));
    }

    fn patch(&mut self, j: usize, v: f64) {
        self.out[self.start + j].v = v;
    }
}

/// Reads what a decimal value section holds before its integers: the exponent, and the
/// exceptions as (index, raw bits of the value) in index order.
fn read_decimal_head(r: &mut BitReader, data: &[u8], n: usize) -> Result<(usize, Vec<(usize, u64)>), ChunkError> {
    let ends = || corrupt("value section ends early");
    let e = r.read_bits(data, 8).ok_or_else(ends)? as usize;
    if e > DECIMAL_EXPONENT_MAX {
        return Err(corrupt("decimal exponent over 18"));
    }
    let exceptions = r.read_uvarint(data).ok_or_else(ends)? as usize;
    if exceptions > n {
        return Err(corrupt("more exceptions than values"));
    }
    let mut patches = Vec::with_capacity(exceptions);
    let mut j = 0usize;
    for x in 0..exceptions {
        j = read_exception_index(r, data, x, j, n)?;
        patches.push((j, r.read_bits(data, 64).ok_or_else(ends)?));
    }
    Ok((e, patches))
}

/// Hands a decimal section's integers to `sink` as values `i / 10^e`, then its exceptions
/// (`(index in ints, raw bits)`).
#[inline(always)]
fn decimal_into(sink: &mut impl ValueSink, times: &[i64], ints: &[i64], e: usize, patches: &[(usize, u64)]) {
    if e == 0 {
        sink.extend_ints(times, ints);
    } else {
        let p = POW10[e];
        sink.extend(times, ints.iter().map(|&i| i as f64 / p));
    }
    for &(j, bits) in patches {
        sink.patch(j, f64::from_bits(bits));
    }
}

/// Reads the value section of `n` values into `sink`, and checks that the chunk ends there.
#[inline(always)]
fn read_values(
    r: &mut BitReader,
    data: &[u8],
    n: usize,
    ints: &mut Vec<i64>,
    times: &[i64],
    sink: &mut impl ValueSink,
) -> Result<(), ChunkError> {
    let ends = || corrupt("value section ends early");
    match r.read_bits(data, 8).ok_or_else(ends)? as u8 {
        VALUES_DECIMAL => {
            let (e, patches) = read_decimal_head(r, data, n)?;
            read_ints(r, data, n, ints)?;
            decimal_into(sink, times, ints, e, &patches);
        }
        VALUES_XOR => {
            let mut bits = r.read_bits(data, 64).ok_or_else(ends)?;
            let (mut leading, mut trailing) = (0u8, 0u8);
            let mut bad_window = false;
            let mut first = true;
            sink.extend(
                times,
                (0..n).map_while(|_| {
                    if !std::mem::take(&mut first) && !read_xor(r, data, &mut bits, &mut leading, &mut trailing) {
                        bad_window = true;
                        return None;
                    }
                    Some(f64::from_bits(bits))
                }),
            );
            if bad_window {
                return Err(corrupt("XOR value window over 64 bits"));
            }
            if r.overran(data) {
                return Err(ends());
            }
        }
        other => return Err(corrupt(&format!("unknown value mode {other}"))),
    }
    // Stored chunks are sliced to their exact length: anything after the padding is damage.
    if r.pos().div_ceil(8) != data.len() {
        return Err(corrupt("bytes after the last sample"));
    }
    Ok(())
}

/// Iterates over a dense chunk. The chunk is decoded whole when the iterator is made (its
/// columns are bit-packed, so decoding all of them at once is the fast way); a corrupt chunk
/// yields no sample and reports its error from `err`.
#[derive(Clone, Debug)]
pub struct DenseIterator {
    samples: Vec<Sample>,
    pos: usize,
    total: usize,
    err: Option<ChunkError>,
}

impl DenseIterator {
    /// The caller has checked the encoding byte and that the header is present.
    pub(super) fn new(data: &[u8]) -> Self {
        let total = u16::from_be_bytes([data[1], data[2]]) as usize;
        let mut samples = Vec::new();
        let err = decode(data, &mut samples).err();
        if err.is_some() {
            samples.clear();
        }
        DenseIterator { samples, pos: 0, total, err }
    }

    pub fn num_samples(&self) -> usize {
        self.total
    }

    pub fn err(&self) -> Option<&ChunkError> {
        self.err.as_ref()
    }

    #[inline]
    #[allow(clippy::should_implement_trait, reason = "mirrors XorIterator::next; Iterator would hide seek")]
    pub fn next(&mut self) -> Option<Sample> {
        let s = self.samples.get(self.pos).copied()?;
        self.pos += 1;
        Some(s)
    }

    /// Appends every remaining sample to `out`.
    pub fn decode_into(&mut self, out: &mut Vec<Sample>) {
        out.extend_from_slice(&self.samples[self.pos..]);
        self.pos = self.samples.len();
    }

    /// Advances to the first sample with timestamp ≥ `t`.
    pub fn seek(&mut self, t: i64) -> Option<Sample> {
        // Readers mostly seek just past the last sample: try the next one before searching.
        let rest = &self.samples[self.pos..];
        if rest.first().is_some_and(|s| s.t < t) {
            self.pos += 1 + rest[1..].partition_point(|s| s.t < t);
        }
        self.next()
    }
}

#[cfg(test)]
mod tests;
