use super::*;
use proptest::prelude::*;
use strata_model::STALE_NAN_BITS;

fn encode(samples: &[Sample]) -> Vec<u8> {
    let mut a = XorAppender::new();
    for s in samples {
        a.append(s.t, s.v);
    }
    a.into_bytes()
}

fn decode(bytes: &[u8]) -> Vec<Sample> {
    let mut it = ChunkIterator::new(bytes).unwrap();
    let mut out = Vec::new();
    while let Some(s) = it.next() {
        out.push(s);
    }
    assert_eq!(it.err(), None);
    out
}

fn assert_bit_equal(a: &[Sample], b: &[Sample]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert!(x.bit_eq(y), "{x:?} != {y:?}");
    }
}

/// Strictly increasing timestamps built from arbitrary positive gaps (wrapping allowed, since the
/// head only requires each timestamp to exceed the previous one), scrape-like ones among them (an
/// exact 10 s grid, and one jittered by a few milliseconds).
pub(super) fn increasing_times() -> impl Strategy<Value = Vec<i64>> {
    let gap = prop_oneof![Just(10_000i64), 9_995i64..10_006, 1i64..20, 1i64..100_000, 1i64..i64::MAX];
    (any::<i64>(), prop::collection::vec(gap, 0..300)).prop_map(|(start, gaps)| {
        let mut t = start;
        let mut out = vec![start];
        for g in gaps {
            match t.checked_add(g) {
                Some(n) => {
                    t = n;
                    out.push(t);
                }
                None => break,
            }
        }
        out
    })
}

fn interesting_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        any::<u64>().prop_map(f64::from_bits),
        Just(f64::from_bits(STALE_NAN_BITS)),
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(-0.0),
        Just(0.0),
        (0i64..1000).prop_map(|i| i as f64),
        (0.0f64..1.0),
    ]
}

proptest! {
    #[test]
    fn every_sample_round_trips(times in increasing_times(), values in prop::collection::vec(interesting_f64(), 301)) {
        let samples: Vec<Sample> = times.iter().zip(&values).map(|(&t, &v)| Sample::new(t, v)).collect();
        let bytes = encode(&samples);
        assert_bit_equal(&decode(&bytes), &samples);
        prop_assert_eq!(num_samples(&bytes).unwrap(), samples.len());
    }

    #[test]
    fn decode_into_matches_next(times in increasing_times(), values in prop::collection::vec(interesting_f64(), 301), skip in 0usize..5) {
        let samples: Vec<Sample> = times.iter().zip(&values).map(|(&t, &v)| Sample::new(t, v)).collect();
        let bytes = encode(&samples);
        let mut it = ChunkIterator::new(&bytes[..]).unwrap();
        let mut got: Vec<Sample> = (0..skip).filter_map(|_| it.next()).collect();
        it.decode_into(&mut got);
        assert_bit_equal(&got, &samples);
    }

    /// A range decode writes exactly the samples in its range that `next` gives, including
    /// inside runs of repeated samples (values repeat in long stretches here, on a regular
    /// interval mostly, jittered or irregular now and then), after any number of `next` calls.
    #[test]
    fn decode_range_into_is_next_clipped(
        start in -1i64 << 50..1 << 50,
        gaps in prop::collection::vec(
            prop_oneof![6 => Just(10_000i64), 1 => 9_995i64..10_006, 1 => 1i64..100_000],
            0..300,
        ),
        values in prop::collection::vec((interesting_f64(), 0u8..4), 301),
        skip in 0usize..5,
        bounds in (any::<i64>(), any::<i64>(), 0usize..310, 0usize..310),
    ) {
        let later = gaps.iter().scan(start, |t, g| { *t += g; Some(*t) });
        let times: Vec<i64> = std::iter::once(start).chain(later).collect();
        let mut v = 0.0;
        let samples: Vec<Sample> = times.iter().zip(&values).map(|(&t, &(f, keep))| {
            if keep == 0 { v = f; }
            Sample::new(t, v)
        }).collect();
        let bytes = encode(&samples);
        // Bounds drawn anywhere, or at sample timestamps (and one either side).
        let at = |i: usize, d: i64| samples.get(i).map_or(bounds.0, |s| s.t.saturating_add(d));
        let ranges = [(bounds.0, bounds.1), (at(bounds.2, 0), at(bounds.3, 0)), (at(bounds.2, 1), at(bounds.3, -1))];
        for (mint, maxt) in ranges {
            let inside = |s: &Sample| s.t >= mint && s.t <= maxt;
            let mut it = XorIterator::new(&bytes[..]);
            let mut got: Vec<Sample> = (0..skip).filter_map(|_| it.next()).filter(inside).collect();
            let consumed = got.len();
            it.decode_range_into(mint, maxt, &mut got);
            prop_assert_eq!(it.err(), None);
            let mut want: Vec<Sample> = samples.iter().take(skip).copied().filter(inside).collect();
            prop_assert_eq!(want.len(), consumed);
            // Past the skipped ones: up to (not including) the first one after `maxt`.
            want.extend(samples.iter().skip(skip).take_while(|s| s.t <= maxt).filter(|s| s.t >= mint));
            assert_bit_equal(&got, &want);
        }
    }

    #[test]
    fn seek_finds_first_at_or_after(times in increasing_times(), target in any::<i64>()) {
        let samples: Vec<Sample> = times.iter().map(|&t| Sample::new(t, t as f64)).collect();
        let bytes = encode(&samples);
        let mut it = ChunkIterator::new(&bytes[..]).unwrap();
        let want = samples.iter().find(|s| s.t >= target).copied();
        prop_assert_eq!(it.seek(target).map(|s| s.t), want.map(|s| s.t));
    }

    #[test]
    fn truncated_chunks_error_never_panic(times in increasing_times(), cut in 0usize..2000) {
        let samples: Vec<Sample> = times.iter().map(|&t| Sample::new(t, (t % 977) as f64 * 1.5)).collect();
        let bytes = encode(&samples);
        let cut = cut.min(bytes.len());
        match ChunkIterator::new(&bytes[..cut]) {
            Err(e) => prop_assert!(cut < HEADER_BYTES, "{e}"),
            Ok(mut it) => {
                let mut n = 0;
                while it.next().is_some() { n += 1; }
                if cut < bytes.len() && n < samples.len() {
                    prop_assert!(it.err().is_some());
                }
            }
        }
    }

    #[test]
    fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(mut it) = ChunkIterator::new(&bytes[..]) {
            while it.next().is_some() {}
        }
    }
}

#[test]
fn special_values_round_trip() {
    let vals = [
        f64::from_bits(STALE_NAN_BITS),
        f64::NAN,
        -f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        -0.0,
        0.0,
        f64::MIN_POSITIVE,
        f64::MAX,
        5e-324,
    ];
    let samples: Vec<Sample> = vals.iter().enumerate().map(|(i, &v)| Sample::new(i as i64 * 15_000, v)).collect();
    assert_bit_equal(&decode(&encode(&samples)), &samples);
}

#[test]
fn extreme_timestamps_round_trip() {
    let samples = [
        Sample::new(i64::MIN, 1.0),
        Sample::new(-1, 2.0),
        Sample::new(0, 3.0),
        Sample::new(i64::MAX - 1, 4.0),
        Sample::new(i64::MAX, 5.0),
    ];
    assert_bit_equal(&decode(&encode(&samples)), &samples);
}

#[test]
fn regular_scrapes_cost_about_two_bits_per_sample() {
    let samples: Vec<Sample> = (0..120).map(|i| Sample::new(1_700_000_000_000 + i * 15_000, 1.0)).collect();
    let bytes = encode(&samples);
    // 3 header + 6 varint time + 8 value + 3 delta + ~2 bits for each of 118 samples.
    assert!(bytes.len() <= 3 + 6 + 8 + 3 + 1 + 30, "{} bytes", bytes.len());
}

/// Byte-exact example from docs/format/chunks.md; keeps the document and the encoder honest.
#[test]
fn doc_example_bytes() {
    let bytes =
        encode(&[Sample::new(1000, 1.0), Sample::new(2000, 1.0), Sample::new(3000, 2.0), Sample::new(4001, 2.0)]);
    assert_eq!(hex(&bytes), DOC_EXAMPLE_HEX);
}

const DOC_EXAMPLE_HEX: &str = "010004d00f3ff0000000000000e8073097ffe00040";

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn unknown_encoding_is_a_typed_error() {
    assert_eq!(ChunkIterator::new(&[9u8, 0, 0][..]).err(), Some(ChunkError::UnknownEncoding(9)));
    assert_eq!(ChunkIterator::new(&[1u8][..]).err(), Some(ChunkError::ShortHeader(1)));
}

/// Scrape-like samples for the cut tests: a regular interval mostly (jittered or irregular now
/// and then), values repeating in stretches (runs of `0 0` samples) and changing in few or
/// many bits.
fn scrape_like() -> impl Strategy<Value = Vec<Sample>> {
    (
        -1i64 << 50..1 << 50,
        prop::collection::vec(prop_oneof![6 => Just(10_000i64), 1 => 9_995i64..10_006, 1 => 1i64..100_000], 1..250),
        prop::collection::vec((interesting_f64(), 0u8..4), 251),
    )
        .prop_map(|(start, gaps, values)| {
            let later = gaps.iter().scan(start, |t, g| {
                *t += g;
                Some(*t)
            });
            let mut v = 0.0;
            std::iter::once(start)
                .chain(later)
                .zip(&values)
                .map(|(t, &(f, keep))| {
                    if keep == 0 {
                        v = f;
                    }
                    Sample::new(t, v)
                })
                .collect()
        })
}

proptest! {
    /// A cut is at the last sample at or before its time that has a sample after it, and the
    /// tail written from it holds exactly the samples from there on, also once the chunk has
    /// grown since the cut was found; a cut found from an earlier cut is the one found from the
    /// chunk's start.
    #[test]
    fn tails_from_cuts_are_the_chunks_samples_from_there(
        samples in scrape_like(),
        grown_from in 0usize..260,
        at in (0usize..260, -1i64..=1, 0usize..260, -1i64..=1),
    ) {
        let early = grown_from.clamp(1, samples.len());
        let (prefix, whole) = (encode(&samples[..early]), encode(&samples));
        let time = |i: usize, d: i64| samples[i.min(samples.len() - 1)].t + d;
        let (t1, t2) = (time(at.0, at.1), time(at.2, at.3));
        let cut = xor::find_cut(&prefix, None, t1);
        // Where it must be: the last index with a successor whose time is at or before t1.
        let want = (1..early.saturating_sub(1)).rev().find(|&i| samples[i].t <= t1);
        prop_assert_eq!(cut.map(|c| c.index()), want);
        let Some(cut) = cut else { return Ok(()) };
        prop_assert_eq!(cut.t(), samples[cut.index()].t);
        for (bytes, n) in [(&prefix, early), (&whole, samples.len())] {
            let mut tail = vec![0xaa; 3];
            xor::write_tail(bytes, &cut, &mut tail);
            prop_assert_eq!(&tail[..3], &[0xaa; 3], "appended after what the buffer held");
            assert_bit_equal(&decode(&tail[3..]), &samples[cut.index()..n]);
        }
        // From the first cut to a second one in the grown chunk.
        let from_start = xor::find_cut(&whole, None, t2).filter(|c| c.index() > cut.index());
        prop_assert_eq!(xor::find_cut(&whole, Some(&cut), t2), from_start);
    }
}
