use proptest::prelude::*;
use strata_model::{Sample, STALE_NAN_BITS};

use super::*;

/// Aggregates computed the way PromQL computes them over a window's samples: increase as
/// `last - first` plus the value before each drop, min/max skipping a leading NaN.
fn reference(samples: &[Sample], end: i64) -> Bucket {
    let first = samples[0];
    let last = samples[samples.len() - 1];
    let mut reset_correction = 0.0;
    let (mut changes, mut resets) = (0, 0);
    for p in samples.windows(2) {
        if p[1].v < p[0].v {
            reset_correction += p[0].v;
            resets += 1;
        }
        if p[1].v != p[0].v && !(p[1].v.is_nan() && p[0].v.is_nan()) {
            changes += 1;
        }
    }
    let mut min = first.v;
    let mut max = first.v;
    for s in &samples[1..] {
        if s.v < min || min.is_nan() {
            min = s.v;
        }
        if s.v > max || max.is_nan() {
            max = s.v;
        }
    }
    Bucket {
        end,
        count: samples.len() as u64,
        sum: samples.iter().map(|s| s.v).sum(),
        min,
        max,
        first,
        last,
        reset_correction,
        changes,
        resets,
        archive: ArchiveValue::NotKept,
    }
}

fn close(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()) || (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

fn assert_equivalent(got: &Bucket, want: &Bucket) {
    assert_eq!(got.end, want.end);
    assert_eq!(got.count, want.count);
    assert_eq!((got.changes, got.resets), (want.changes, want.resets), "{got:?} vs {want:?}");
    assert_eq!(got.first.t, want.first.t);
    assert_eq!(got.last.t, want.last.t);
    for (g, w) in [(got.first.v, want.first.v), (got.last.v, want.last.v), (got.min, want.min), (got.max, want.max)] {
        assert_eq!(g.to_bits(), w.to_bits(), "{got:?} vs {want:?}");
    }
    assert!(close(got.sum, want.sum), "sum {got:?} vs {want:?}");
    assert!(close(got.reset_correction, want.reset_correction), "reset correction {got:?} vs {want:?}");
    assert!(close(got.increase(), want.increase()), "increase {got:?} vs {want:?}");
}

/// Samples with increasing, jittered timestamps: counters that reset, gauges, some NaN.
fn samples() -> impl Strategy<Value = Vec<Sample>> {
    prop::collection::vec((1i64..40_000, 0u8..10, -50i64..1000), 1..300).prop_map(|steps| {
        let mut t = 1_700_000_000_000i64;
        let mut counter = 0.0;
        steps
            .into_iter()
            .map(|(dt, kind, x)| {
                t += dt;
                let v = match kind {
                    0 => f64::NAN,
                    1 => {
                        counter = x.max(0) as f64;
                        counter
                    }
                    2..=6 => {
                        counter += x.max(0) as f64 / 8.0;
                        counter
                    }
                    _ => x as f64 * 0.25,
                };
                Sample { t, v }
            })
            .collect()
    })
}

#[test]
fn bucket_ends_are_right_closed() {
    assert_eq!(bucket_end(0, 60), 0);
    assert_eq!(bucket_end(1, 60), 60);
    assert_eq!(bucket_end(60, 60), 60);
    assert_eq!(bucket_end(61, 60), 120);
    assert_eq!(bucket_end(-1, 60), 0);
    assert_eq!(bucket_end(-60, 60), -60);
    assert_eq!(bucket_end(-61, 60), -60);
}

#[test]
fn left_closed_buckets_take_the_boundary_sample_they_open() {
    assert_eq!(Closed::Left.bucket_end(0, 60), 60);
    assert_eq!(Closed::Left.bucket_end(59, 60), 60);
    assert_eq!(Closed::Left.bucket_end(60, 60), 120);
    assert_eq!(Closed::Left.bucket_end(-1, 60), 0);
    assert_eq!(Closed::Left.span(120, 60), (60, 119));
    assert_eq!(Closed::Right.span(120, 60), (61, 120));
    let samples = [Sample { t: 0, v: 1.0 }, Sample { t: 30, v: 2.0 }, Sample { t: 60, v: 3.0 }];
    let got = aggregate_closed(&samples, 60, Closed::Left);
    assert_eq!(got.iter().map(|b| (b.end, b.count)).collect::<Vec<_>>(), [(60, 2), (120, 1)]);
    let got = aggregate(&samples, 60);
    assert_eq!(got.iter().map(|b| (b.end, b.count)).collect::<Vec<_>>(), [(0, 1), (60, 2)]);
}

#[test]
fn stale_markers_are_not_values() {
    let stale = f64::from_bits(STALE_NAN_BITS);
    let got = aggregate(&[Sample { t: 10, v: 1.0 }, Sample { t: 20, v: stale }, Sample { t: 30, v: 3.0 }], 60);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].count, 2);
    assert_eq!(got[0].sum, 4.0);
    assert_eq!(got[0].last, Sample { t: 30, v: 3.0 });
}

proptest! {
    /// Every bucket equals the reference computed over exactly the samples of its interval.
    #[test]
    fn buckets_match_the_reference(samples in samples(), interval in prop::sample::select(vec![1_000i64, 15_000, 60_000, 300_000, 3_600_000]), left in any::<bool>()) {
        let closed = if left { Closed::Left } else { Closed::Right };
        let got = aggregate_closed(&samples, interval, closed);
        let mut i = 0;
        for b in &got {
            let (lo, hi) = closed.span(b.end, interval);
            prop_assert_eq!(b.end.rem_euclid(interval), 0);
            let n = samples[i..].partition_point(|s| s.t <= hi);
            prop_assert!(n > 0);
            prop_assert!(samples[i].t >= lo);
            assert_equivalent(b, &reference(&samples[i..i + n], b.end));
            i += n;
        }
        prop_assert_eq!(i, samples.len());
    }

    /// Aggregating in two parts (a block boundary anywhere, even inside a bucket) and merging
    /// gives what aggregating at once gives.
    #[test]
    fn parts_compose(samples in samples(), cut in any::<prop::sample::Index>(), fine in prop::sample::select(vec![1_000i64, 15_000, 60_000])) {
        let coarse = fine * 5;
        let whole = aggregate(&samples, coarse);
        let at = cut.index(samples.len() + 1);
        let (a, b) = (aggregate(&samples[..at], coarse), aggregate(&samples[at..], coarse));
        let mut merged = Vec::new();
        merge_runs(&a, &b, &mut merged);
        prop_assert_eq!(merged.len(), whole.len());
        for (g, w) in merged.iter().zip(&whole) {
            assert_equivalent(g, w);
        }
    }

    /// A bucket of short decimals (a gauge's `21.37`, a counter's `1234.5`, mixed exponents and
    /// signs) keeps their exact sum and reset correction, rounded once: the decimal, not the
    /// float additions' drift (`0.1 + 0.2`); with any sample that is no such decimal (NaN, an
    /// extreme), the float sums as before.
    #[test]
    fn decimal_buckets_keep_exact_sums(
        steps in prop::collection::vec((1i64..40_000, -1_000_000i64..1_000_000, 0u32..4), 1..300),
        odd in prop::option::of((any::<prop::sample::Index>(), prop::sample::select(vec![f64::NAN, 1e300, 0.1 + 0.2]))),
        interval in prop::sample::select(vec![15_000i64, 60_000, 300_000]),
    ) {
        let mut t = 1_700_000_000_000i64;
        // Each value `x / 10^e` as a double, and as thousandths (exact: e ≤ 3).
        let mut samples: Vec<Sample> = Vec::new();
        let mut thousandths: Vec<i64> = Vec::new();
        for &(dt, x, e) in &steps {
            t += dt;
            samples.push(Sample { t, v: x as f64 / 10f64.powi(e as i32) });
            thousandths.push(x * 10i64.pow(3 - e));
        }
        let odd_at = odd.map(|(at, v)| {
            let j = at.index(samples.len());
            samples[j].v = v;
            j
        });
        let got = aggregate(&samples, interval);
        let mut i = 0;
        for b in &got {
            let n = samples[i..].partition_point(|s| s.t <= b.end);
            let part = i..i + n;
            i += n;
            if odd_at.is_some_and(|j| part.contains(&j)) {
                let sum: f64 = samples[part.clone()].iter().fold(0.0, |a, s| a + s.v);
                prop_assert!(sum.to_bits() == b.sum.to_bits() || (sum.is_nan() && b.sum.is_nan()), "{} vs {}", sum, b.sum);
                continue;
            }
            let ints = &thousandths[part];
            let sum: i64 = ints.iter().sum();
            let correction: i64 = ints.windows(2).filter(|p| p[1] < p[0]).map(|p| p[0]).sum();
            prop_assert_eq!(b.sum.to_bits(), (sum as f64 / 1000.0).to_bits(), "{:?}", ints);
            prop_assert_eq!(b.reset_correction.to_bits(), (correction as f64 / 1000.0).to_bits(), "{:?}", ints);
        }
    }

    /// `append_totals` gives the count, sum, min and max that `append` gives, bit for bit, and
    /// reads no first or last sample: buckets whose ends were never decoded (zeroed, as a read
    /// without those columns leaves them) combine to the same totals.
    #[test]
    fn appending_totals_is_appending_for_the_totals(samples in samples(), fine in prop::sample::select(vec![1_000i64, 15_000, 60_000])) {
        let buckets = aggregate(&samples, fine);
        let (mut appended, mut totals) = (buckets[0], buckets[0]);
        let blank = |b: &Bucket| Bucket { first: Sample { t: 0, v: 0.0 }, last: Sample { t: 0, v: 0.0 }, ..*b };
        let mut blanked = blank(&buckets[0]);
        for b in &buckets[1..] {
            appended.append(b);
            totals.append_totals(b);
            blanked.append_totals(&blank(b));
        }
        let totals_of = |b: &Bucket| (b.end, b.count, b.sum.to_bits(), b.min.to_bits(), b.max.to_bits());
        prop_assert_eq!(totals_of(&totals), totals_of(&appended));
        prop_assert_eq!(totals_of(&blanked), totals_of(&appended));
    }

    /// `append_runs` is `merge_runs` in place: for parts cut anywhere (the appending case, a
    /// shared bucket absorbed, or the later part first) and for interleaved parts.
    #[test]
    fn appending_runs_in_place_is_merging_them(samples in samples(), cut in any::<prop::sample::Index>(), picks in prop::collection::vec(any::<bool>(), 1..300), interleave in any::<bool>()) {
        let interval = 60_000;
        let (a, b) = if interleave {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for (s, pick) in samples.iter().zip(picks.iter().cycle()) {
                if *pick { a.push(*s) } else { b.push(*s) }
            }
            (aggregate(&a, interval), aggregate(&b, interval))
        } else {
            let at = cut.index(samples.len() + 1);
            (aggregate(&samples[..at], interval), aggregate(&samples[at..], interval))
        };
        for (x, y) in [(&a, &b), (&b, &a)] {
            let mut merged = Vec::new();
            merge_runs(x, y, &mut merged);
            let mut appended = x.clone();
            append_runs(&mut appended, y);
            prop_assert_eq!(appended.len(), merged.len());
            for (g, w) in appended.iter().zip(&merged) {
                prop_assert_eq!(format!("{g:?}"), format!("{w:?}"));
            }
        }
    }

    /// Buckets of neighbouring parts gathered in any order (tier blocks side by side, cut
    /// anywhere, even inside a bucket) coalesce into the whole's buckets; one part's buckets,
    /// already in order, are left as they are.
    #[test]
    fn coalescing_parts_in_any_order_gives_the_whole(samples in samples(), cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..4), reverse in any::<bool>()) {
        let interval = 60_000;
        let mut at: Vec<usize> = cuts.iter().map(|c| c.index(samples.len() + 1)).collect();
        at.extend([0, samples.len()]);
        at.sort_unstable();
        let mut parts: Vec<Vec<Bucket>> = at.windows(2).map(|w| aggregate(&samples[w[0]..w[1]], interval)).collect();
        if reverse {
            parts.reverse();
        }
        let mut gathered: Vec<Bucket> = parts.concat();
        coalesce(&mut gathered);
        let whole = aggregate(&samples, interval);
        prop_assert_eq!(gathered.len(), whole.len());
        for (g, w) in gathered.iter().zip(&whole) {
            assert_equivalent(g, w);
        }
    }

    /// Interleaved parts (backfill into rolled-up time): count, sum, min, max, first and last
    /// are those of the union.
    #[test]
    fn absorbing_interleaved_parts_keeps_the_exact_aggregates(samples in samples(), picks in prop::collection::vec(any::<bool>(), 300)) {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for (s, pick) in samples.iter().zip(picks.iter().cycle()) {
            if *pick { a.push(*s) } else { b.push(*s) }
        }
        let interval = 60_000;
        let mut merged = Vec::new();
        merge_runs(&aggregate(&a, interval), &aggregate(&b, interval), &mut merged);
        let whole = aggregate(&samples, interval);
        prop_assert_eq!(merged.len(), whole.len());
        for (g, w) in merged.iter().zip(&whole) {
            prop_assert_eq!((g.end, g.count, g.first.t, g.last.t), (w.end, w.count, w.first.t, w.last.t));
            prop_assert!(close(g.sum, w.sum));
            prop_assert!(g.min.to_bits() == w.min.to_bits() || (g.min.is_nan() && w.min.is_nan()) || g.min == w.min);
            prop_assert!(g.max.to_bits() == w.max.to_bits() || (g.max.is_nan() && w.max.is_nan()) || g.max == w.max);
        }
    }
}
