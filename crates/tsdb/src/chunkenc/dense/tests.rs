use super::*;
use crate::chunkenc::tests::increasing_times;
use crate::chunkenc::{ChunkIterator, XorAppender};
use proptest::prelude::*;
use strata_model::STALE_NAN_BITS;

fn decode_all(bytes: &[u8]) -> Vec<Sample> {
    let mut it = ChunkIterator::new(bytes).unwrap();
    let mut out = Vec::new();
    it.decode_into(&mut out);
    assert_eq!(it.err(), None);
    out
}

fn assert_round_trip(samples: &[Sample]) -> Vec<u8> {
    let bytes = encode(samples);
    assert_eq!(bytes[0], Encoding::Dense as u8);
    let back = decode_all(&bytes);
    assert_eq!(back.len(), samples.len());
    for (a, b) in samples.iter().zip(&back) {
        assert!(a.bit_eq(b), "{a:?} came back as {b:?}");
    }
    // `next` and `seek` agree with the whole-chunk decode.
    let mut it = ChunkIterator::new(&bytes[..]).unwrap();
    for s in samples {
        assert!(it.next().unwrap().bit_eq(s));
    }
    assert!(it.next().is_none());
    bytes
}

fn xor_bytes(samples: &[Sample]) -> usize {
    let mut a = XorAppender::new();
    for s in samples {
        a.append(s.t, s.v);
    }
    a.into_bytes().len()
}

fn scrape(n: usize, v: impl Fn(usize) -> f64) -> Vec<Sample> {
    (0..n).map(|j| Sample::new(1_795_332_570_000 + 10_000 * j as i64, v(j))).collect()
}

/// The `(mode, exponent)` bytes of a chunk whose time column is a regular grid: which value
/// representation the encoder picked.
fn value_mode(bytes: &[u8]) -> u8 {
    let n = u16::from_be_bytes([bytes[1], bytes[2]]) as usize;
    let mut r = BitReader::new(HEADER_BYTES);
    let mut times = Vec::new();
    read_ints(&mut r, bytes, n, &mut times).unwrap();
    r.read_bits(bytes, 8).unwrap() as u8
}

#[test]
fn constant_series_cost_a_few_bytes() {
    let samples = scrape(240, |_| 42.0);
    let bytes = assert_round_trip(&samples);
    assert!(bytes.len() <= 24, "{} bytes", bytes.len());
    assert_eq!(value_mode(&bytes), VALUES_DECIMAL);
}

#[test]
fn decimal_counters_are_smaller_than_xor() {
    // A CPU-seconds counter: two decimals, about 9.9 per 10 s.
    let samples = scrape(240, |j| ((12_345_678 + j * 990 + (j * 7919) % 23) as f64) / 100.0);
    let bytes = assert_round_trip(&samples);
    assert_eq!(value_mode(&bytes), VALUES_DECIMAL);
    assert!(bytes.len() * 3 < xor_bytes(&samples), "dense {} vs xor {}", bytes.len(), xor_bytes(&samples));
}

#[test]
fn multiples_of_a_page_take_out_the_factor() {
    let samples = scrape(240, |j| (1_000_000 + (j * 7919) % 1000) as f64 * 4096.0);
    let bytes = assert_round_trip(&samples);
    // 1000 distinct pages: 10 bits a value, not 22.
    assert!(bytes.len() < 240 * 11 / 8 + 40, "{} bytes", bytes.len());
}

#[test]
fn jittered_and_gapped_timestamps_round_trip_compactly() {
    let mut t = 1_795_332_570_000i64;
    let samples: Vec<Sample> = (0..240)
        .map(|j| {
            t += 10_000 + ((j * 7919) % 11) as i64 - 5 + if j == 100 { 20_000 } else { 0 };
            Sample::new(t, 1.0)
        })
        .collect();
    let bytes = assert_round_trip(&samples);
    // About 5 bits per jittered delta, one exception for the missed scrapes.
    assert!(bytes.len() < 240 * 5 / 8 + 40, "{} bytes", bytes.len());
}

#[test]
fn whole_second_jitter_is_coded_off_a_line_in_base_3() {
    // Carbon senders: a point every 10 s, whole seconds, each up to a second early or late. As
    // deltas that is 5 values (3 bits each); off the line `t0 + j × 10 s` it is 3 (a base-3
    // digit, 1.6 bits).
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let samples: Vec<Sample> = (0..60)
        .map(|j| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            Sample::new(1_795_332_570_000 + 10_000 * j + 1000 * ((x % 3) as i64 - 1), 1.0)
        })
        .collect();
    let bytes = assert_round_trip(&samples);
    let mut r = BitReader::new(HEADER_BYTES);
    let header = read_ints_header(&mut r, &bytes, samples.len()).unwrap();
    assert_eq!((header.order, header.factor, header.packing), (ORDER_LINE, 1000, Packing::Radix(3)));
    // 59 digits in base 3: 2 groups of 20 (32 bits each) and one of 19 (31 bits), 12 bytes;
    // the heads, the column fields and the constant values about 20 more.
    assert!(bytes.len() <= 3 + 12 + 24, "{} bytes", bytes.len());
}

#[test]
fn radix_groups_fill_32_bits() {
    assert_eq!(radix_group(3, SAMPLES_MAX), (20, 32));
    assert_eq!(radix_group(3, 19), (19, 31));
    assert_eq!(radix_group(5, SAMPLES_MAX), (13, 31));
    assert_eq!(radix_group(65, SAMPLES_MAX), (5, 31));
    assert_eq!(radix_group(65, 1), (1, 7));
    assert!((3..=RADIX_MAX).all(|r| radix_group(r, SAMPLES_MAX).0 <= RADIX_GROUP_DIGITS_MAX));
    for d in 3..=RADIX_MAX {
        let inverse = reciprocal(d);
        for v in [0u64, 1, d - 1, d, d + 1, (1 << 32) - 1, (1 << 32) - d, 123_456_789] {
            assert_eq!(divide(v, d, inverse), v / d, "{v} / {d}");
        }
    }
}

#[test]
fn special_values_are_exceptions_in_a_decimal_chunk() {
    let specials = [f64::from_bits(STALE_NAN_BITS), f64::NAN, -0.0, f64::INFINITY, f64::NEG_INFINITY, 1e300, 0.1 + 0.2];
    let samples = scrape(120, |j| if j % 17 == 3 { specials[j / 17 % specials.len()] } else { j as f64 / 4.0 });
    let bytes = assert_round_trip(&samples);
    assert_eq!(value_mode(&bytes), VALUES_DECIMAL);
}

#[test]
fn computed_floats_fall_back_to_xor() {
    let samples = scrape(120, |j| (j as f64 * 0.37).sin() / 3.0);
    let bytes = assert_round_trip(&samples);
    assert_eq!(value_mode(&bytes), VALUES_XOR);
    assert!(bytes.len() <= xor_bytes(&samples) + 8);
}

#[test]
fn extreme_timestamps_and_single_samples() {
    assert_round_trip(&[Sample::new(i64::MIN, -0.0)]);
    assert_round_trip(&[Sample::new(i64::MIN, 1.0), Sample::new(i64::MAX, 2.0)]);
    assert_round_trip(&[Sample::new(i64::MIN, 1.0), Sample::new(0, 2.0), Sample::new(i64::MAX, 3.0)]);
    assert_round_trip(&[Sample::new(-5, i64::MAX as f64), Sample::new(-4, i64::MIN as f64), Sample::new(7, 0.5)]);
}

#[test]
fn seek_finds_the_first_sample_at_or_after() {
    let samples = scrape(100, |j| j as f64);
    let bytes = encode(&samples);
    let mut it = ChunkIterator::new(&bytes[..]).unwrap();
    assert_eq!(it.seek(samples[40].t - 1).unwrap().t, samples[40].t);
    assert_eq!(it.seek(samples[40].t).unwrap().t, samples[41].t, "seek never goes back");
    assert!(it.seek(samples[99].t + 1).is_none());
}

#[test]
fn corrupt_chunks_report_an_error() {
    let bytes = encode(&scrape(240, |j| j as f64 * 1.5));
    for cut in HEADER_BYTES..bytes.len() {
        let it = ChunkIterator::new(&bytes[..cut]).unwrap();
        assert!(it.err().is_some(), "cut at {cut} of {}", bytes.len());
    }
    let mut trailing = bytes.clone();
    trailing.push(0);
    assert!(ChunkIterator::new(&trailing[..]).unwrap().err().is_some(), "bytes past the chunk's end");
}

/// Timestamps that repeat or go back (anywhere: the first pair, the middle, the last pair) are
/// damage the decoder names.
#[test]
fn timestamps_that_do_not_increase_are_damage() {
    let samples = scrape(240, |j| j as f64);
    for at in [1, 120, 239] {
        for back in [0, 1, 60_000] {
            let mut times: Vec<i64> = samples.iter().map(|s| s.t).collect();
            times[at] = times[at - 1] - back;
            let mut w = BitWriter::with_bytes(vec![Encoding::Dense as u8, 0, 240]);
            write_ints(&mut w, &times);
            write_decimal_values(&mut w, &decimal_values(&samples).unwrap());
            let bytes = w.into_bytes();
            let err = ChunkIterator::new(&bytes[..]).unwrap().err().map(|e| e.to_string());
            assert!(err.as_deref().is_some_and(|e| e.contains("timestamps do not increase")), "{at} {back}: {err:?}");
        }
    }
}

fn value() -> impl Strategy<Value = f64> {
    prop_oneof![
        any::<u64>().prop_map(f64::from_bits),
        Just(f64::from_bits(STALE_NAN_BITS)),
        Just(f64::NAN),
        Just(-0.0),
        Just(0.0),
        Just(f64::INFINITY),
        (-1_000_000i64..1_000_000, 0u32..10).prop_map(|(i, e)| i as f64 / 10f64.powi(e as i32)),
        (0u64..1 << 40).prop_map(|i| (i * 4096) as f64),
        any::<i64>().prop_map(|i| i as f64),
    ]
}

proptest! {
    #[test]
    fn every_bit_pattern_round_trips(times in increasing_times(), values in prop::collection::vec(value(), 300)) {
        let samples: Vec<Sample> = times.iter().zip(&values).map(|(&t, &v)| Sample::new(t, v)).collect();
        assert_round_trip(&samples);
    }

    #[test]
    fn decimal_series_round_trip(
        times in increasing_times(),
        start in -1_000_000i64..1_000_000,
        steps in prop::collection::vec(-50i64..500, 300),
        e in 0i32..12,
    ) {
        let mut i = start;
        let samples: Vec<Sample> = times
            .iter()
            .zip(&steps)
            .map(|(&t, &d)| {
                i += d;
                Sample::new(t, i as f64 / 10f64.powi(e))
            })
            .collect();
        assert_round_trip(&samples);
    }

    /// Integer columns in every order and packing: offsets in small ranges (radixes), a few
    /// outliers (exceptions over a radix or a width), lines with jitter, and wide values.
    #[test]
    fn integer_columns_round_trip(
        start in any::<i64>(),
        step in prop_oneof![Just(0i64), -3i64..3, 1i64..100_000, any::<i64>()],
        range in 1u64..70,
        jitter in prop::collection::vec(any::<u64>(), 1..241),
        outliers in prop::collection::vec((any::<prop::sample::Index>(), any::<i64>()), 0..4),
        scale in prop_oneof![Just(1i64), Just(1000i64)],
    ) {
        let mut xs: Vec<i64> = jitter
            .iter()
            .enumerate()
            .map(|(j, r)| start.wrapping_add((j as i64).wrapping_mul(step)).wrapping_add((r % range) as i64 * scale))
            .collect();
        for (i, v) in &outliers {
            let at = i.index(xs.len());
            xs[at] = *v;
        }
        let mut w = BitWriter::with_bytes(Vec::new());
        write_ints(&mut w, &xs);
        let bytes = w.into_bytes();
        let mut back = Vec::new();
        let mut r = BitReader::new(0);
        read_ints(&mut r, &bytes, xs.len(), &mut back).unwrap();
        prop_assert_eq!(&back, &xs);
        let mut r2 = BitReader::new(0);
        skip_ints(&mut r2, &bytes, xs.len()).unwrap();
        prop_assert_eq!(r2.pos(), r.pos());
        // Columns of raw values, of a line or of deltas read from any index on as whole; those
        // with random access at any index.
        let mut r3 = BitReader::new(0);
        if let Some(column) = RandomColumn::open(&mut r3, &bytes, xs.len()).unwrap() {
            prop_assert_eq!(column.end, r.pos());
            prop_assert_eq!(r3.pos(), r.pos());
            if column.random_access() {
                for (j, &x) in xs.iter().enumerate() {
                    prop_assert_eq!(column.at(&bytes, j), x, "value {}", j);
                }
            }
            let n = xs.len();
            for first in [0, 1, n / 3, n - 1, n] {
                for end in [first, first + 1, (first + 7).min(n), (2 * n / 3).max(first), n] {
                    let end = end.min(n);
                    column.values_in(&bytes, first..end, &mut back);
                    prop_assert_eq!(&back[..], &xs[first..end], "values {}..{}", first, end);
                }
            }
        }
    }

    /// `decode_range` gives what a whole decode gives in its range, whichever way the chunk's
    /// columns are coded: timestamps off a line (jittered scrapes, missed ones), as deltas (an
    /// exact grid) or raw; values as decimals of each order, with exceptions, or XOR.
    #[test]
    fn a_decode_of_a_range_is_the_whole_decode_in_it(
        start in -1i64 << 50..1 << 50,
        step in prop_oneof![Just(10_000i64), 1i64..100_000],
        jitter in prop_oneof![Just(0u64), 1u64..40, 1u64..1000],
        missed in prop::collection::vec(any::<prop::sample::Index>(), 0..3),
        n in 1usize..241,
        kind in 0u8..6,
        seed in any::<u64>(),
        specials in prop::collection::vec((any::<prop::sample::Index>(), value()), 0..3),
        at in any::<prop::sample::Index>(),
        offset in prop_oneof![Just(0i64), -1i64..=1, -20_000i64..20_000],
        end in prop_oneof![Just(None), (any::<prop::sample::Index>(), -1i64..=1).prop_map(Some)],
    ) {
        let mut x = seed | 1;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let jitter = jitter.min(step as u64 - 1);
        let mut times: Vec<i64> = (0..n as i64)
            .map(|j| start + j * step + if jitter > 0 { (next() % jitter) as i64 } else { 0 })
            .collect();
        for m in &missed {
            if times.len() > 2 {
                times.remove(m.index(times.len()));
            }
        }
        let mut counter = 1_000_000i64;
        let samples: Vec<Sample> = times
            .iter()
            .enumerate()
            .map(|(j, &t)| {
                let v = match kind {
                    // A counter's decimals: deltas.
                    0 => {
                        counter += (next() % 500) as i64;
                        counter as f64 / 100.0
                    }
                    // A gauge's: raw.
                    1 => (next() % 10_000) as f64 / 10.0,
                    // A steady counter: off a line.
                    2 => (1_000 + 37 * j as i64 + (next() % 3) as i64) as f64,
                    // Any bits: XOR.
                    3 => f64::from_bits(next()),
                    4 => 0.0,
                    _ => (next() % 7) as f64 * 0.1 + 0.2,
                };
                Sample::new(t, v)
            })
            .collect();
        let mut samples = samples;
        for (i, v) in &specials {
            let j = i.index(samples.len());
            samples[j].v = *v;
        }
        let bytes = encode(&samples);
        let from = samples[at.index(samples.len())].t + offset;
        // To the end, or at, just before or just after a sample.
        let until = end.map_or(i64::MAX, |(at, d)| samples[at.index(samples.len())].t + d);
        let mut want = Vec::new();
        decode(&bytes, &mut want).unwrap();
        want.retain(|s| s.t >= from && s.t <= until);
        let mut got = vec![Sample::new(i64::MIN, 1.0)];
        decode_range(&bytes, from, until, &mut got).unwrap();
        prop_assert!(got[0].t == i64::MIN, "what was in `out` stays");
        prop_assert_eq!(got.len() - 1, want.len());
        for (a, b) in got[1..].iter().zip(&want) {
            prop_assert!(a.bit_eq(b), "{:?} against {:?}", a, b);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(body in prop::collection::vec(any::<u8>(), 0..400), count in any::<u16>()) {
        let mut bytes = vec![Encoding::Dense as u8];
        bytes.extend_from_slice(&count.to_be_bytes());
        bytes.extend_from_slice(&body);
        let mut it = ChunkIterator::new(&bytes[..]).unwrap();
        let mut out = Vec::new();
        it.decode_into(&mut out);
        prop_assert!(out.len() <= count as usize);
        prop_assert!(out.windows(2).all(|p| p[0].t < p[1].t));
        for from in [i64::MIN, 0, 1 << 40, i64::MAX] {
            let mut since = Vec::new();
            if decode_range(&bytes, from, from.saturating_add(1 << 20), &mut since).is_ok() {
                prop_assert!(since.len() <= count as usize);
                prop_assert!(since.windows(2).all(|p| p[0].t < p[1].t));
            }
        }
    }
}

/// The worked example of `docs/format/chunks.md`, byte for byte.
#[test]
fn doc_example_bytes() {
    let samples = [
        Sample::new(1000, 1.5),
        Sample::new(2000, 2.5),
        Sample::new(3000, 2.75),
        Sample::new(4001, f64::from_bits(STALE_NAN_BITS)),
    ];
    let bytes = assert_round_trip(&samples);
    let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let expected = "05 00 04 74 03 f4 03 c0 40 80 10 00 20 10 37 ff 00 00 00 00 00 00 22 b0 08 66 20 05 04";
    assert_eq!(hex.join(" "), expected);
    let doc = include_str!("../../../../../docs/format/chunks.md");
    assert!(doc.contains(expected), "docs/format/chunks.md shows other bytes");
}

proptest! {
    /// Offsets read at their own bit positions are those the register reads, up to the last
    /// bytes of the data (where the 8-byte load would run past it), and the reader ends after
    /// the last one.
    #[test]
    fn unpacked_offsets_are_the_written_ones(
        width in 1u32..=UNPACK_WIDTH_MAX,
        lead in 0u32..64,
        words in prop::collection::vec(any::<u64>(), 1..80),
        trailing in 0usize..3,
    ) {
        let mut w = BitWriter::with_bytes(Vec::new());
        w.write_bits(0x5a5a_5a5a_5a5a_5a5a >> (64 - lead.max(1)), lead);
        let values: Vec<u64> = words.iter().map(|x| x >> (64 - width)).collect();
        for &v in &values {
            w.write_bits(v, width);
        }
        let mut data = w.into_bytes();
        data.extend(std::iter::repeat_n(0xff, trailing));
        let mut r = BitReader::new(0);
        r.skip(&data, lead as usize);
        let mut out = vec![-1i64];
        unpack_bits(&mut r, &data, width, values.len(), &mut out, |o| o as i64);
        prop_assert_eq!(&out[1..], &values.iter().map(|&v| v as i64).collect::<Vec<_>>()[..]);
        prop_assert_eq!(r.pos(), lead as usize + values.len() * width as usize);
        prop_assert!(!r.overran(&data));
    }
}

/// `same_bits` compares from the end of the header up to the bit given, not past it.
#[test]
fn same_bits_stops_at_the_bit() {
    let a = [5u8, 0, 1, 0b1010_1100, 0b1110_0000, 0xff];
    let mut b = a;
    b[0] = 9; // the header is not compared
    b[4] = 0b1111_0000; // differs at bit 3 of byte 4 (bit 35)
    b[5] = 0; // after it
    assert!(same_bits(&a, &b, 35));
    assert!(!same_bits(&a, &b, 36));
    assert!(same_bits(&a, &b, 32));
    assert!(same_bits(&a, &b, 24), "nothing to compare");
    assert!(!same_bits(&a, &b[..4], 35), "b is too short");
    assert!(!same_bits(&a, &b, 23), "before the end of the header");
}
