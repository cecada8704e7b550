use proptest::prelude::*;

use super::notation::{format, parse};
use super::KahanSum;
use super::*;

fn h(s: &str) -> FloatHistogram {
    parse(s).unwrap()
}

/// Equality after compaction, the way the PromQL test files compare histograms.
fn same(a: &FloatHistogram, b: &FloatHistogram) -> bool {
    let (mut a, mut b) = (a.clone(), b.clone());
    a.compact();
    b.compact();
    a.bit_eq(&b)
}

#[test]
fn exponential_bounds() {
    assert_eq!(exponential_bound(0, 0), 1.0);
    assert_eq!(exponential_bound(1, 0), 2.0);
    assert_eq!(exponential_bound(-1, 0), 0.5);
    assert_eq!(exponential_bound(1, 1), std::f64::consts::SQRT_2);
    assert_eq!(exponential_bound(2, 1), 2.0);
    assert_eq!(exponential_bound(1, -1), 4.0);
    assert_eq!(exponential_bound(-1, -2), 1.0 / 16.0);
    assert_eq!(exponential_bound(256, 8), 2.0);
    assert_eq!(exponential_bound(1024, 0), f64::MAX);
    assert_eq!(exponential_bound(1025, 0), f64::INFINITY);
    assert_eq!(exponential_bound(-1074, 0), f64::from_bits(1));
    // Every bound is the previous one times the base.
    for schema in EXPONENTIAL_SCHEMA_MIN..=EXPONENTIAL_SCHEMA_MAX {
        let base = 2f64.powf(2f64.powi(-schema));
        for idx in -20..20 {
            let r = exponential_bound(idx + 1, schema) / exponential_bound(idx, schema);
            assert!((r / base - 1.0).abs() < 1e-12, "schema {schema} idx {idx}: ratio {r}, base {base}");
        }
    }
}

#[test]
fn target_indexes_nest() {
    // Schema 0 buckets (1,2] and (2,4] both lie in schema −1's (1,4].
    assert_eq!(target_index(1, 0, -1), 1);
    assert_eq!(target_index(2, 0, -1), 1);
    assert_eq!(target_index(3, 0, -1), 2);
    assert_eq!(target_index(0, 0, -1), 0);
    assert_eq!(target_index(-1, 0, -1), 0);
    assert_eq!(target_index(-2, 0, -1), -1);
    for from in -3..=8 {
        for idx in -50..50 {
            let t = target_index(idx, from, from - 1);
            let (lo, hi) = (exponential_bound(t - 1, from - 1), exponential_bound(t, from - 1));
            let (blo, bhi) = (exponential_bound(idx - 1, from), exponential_bound(idx, from));
            assert!(lo <= blo * (1.0 + 1e-12) && bhi <= hi * (1.0 + 1e-12), "schema {from} idx {idx}");
        }
    }
}

#[test]
fn notation_round_trips() {
    for s in [
        "{{}}",
        "{{schema:-53 custom_values:[-2 3]}}",
        "{{count:4 sum:5 buckets:[1 2 1]}}",
        "{{schema:-1 count:5 sum:8 z_bucket:1 z_bucket_w:0.5 offset:1 buckets:[5] n_offset:-2 n_buckets:[1 0 2]}}",
        "{{count:2 counter_reset_hint:gauge buckets:[0.5 1 0.5]}}",
    ] {
        assert_eq!(format(&h(s)), s);
    }
    assert!(parse("{{sum:1 sum:2}}").unwrap_err().contains("duplicate"));
    assert!(parse("{{bogus:1}}").unwrap_err().contains("bogus"));
    assert!(parse("{{sum:x}}").is_err());
}

#[test]
fn add_reduces_to_the_lower_schema() {
    // From native_histograms.test: the schema 0 buckets (1,2] and (2,4] both land in (1,4].
    let mut a = h("{{schema:-1 sum:4 count:1 buckets:[1] offset:1}}");
    a.add(&h("{{schema:0 sum:4 count:4 buckets:[2 2] offset:1}}")).unwrap();
    assert!(same(&a, &h("{{schema:-1 count:5 sum:8 offset:1 buckets:[5]}}")), "{}", format(&a));
    // And the other way round: the receiver's resolution drops.
    let mut b = h("{{schema:0 sum:4 count:4 buckets:[2 2] offset:1}}");
    b.add(&h("{{schema:-1 sum:4 count:1 buckets:[1] offset:1}}")).unwrap();
    assert!(same(&a, &b));
}

#[test]
fn add_inserts_missing_buckets_and_keeps_negative_ones_apart() {
    let mut a = h("{{count:4 sum:4 buckets:[1 2 1] n_buckets:[1]}}");
    a.add(&h("{{count:3 sum:2 offset:5 buckets:[3] n_offset:-1 n_buckets:[2]}}")).unwrap();
    assert!(same(&a, &h("{{count:7 sum:6 buckets:[1 2 1 0 0 3] n_offset:-1 n_buckets:[2 1]}}")), "{}", format(&a));
}

#[test]
fn zero_buckets_are_widened_to_the_larger_threshold() {
    // Schema 0: bucket 0 is (0.5, 1]; with a zero bucket of width 1 it joins the zero count.
    let mut a = h("{{z_bucket:1 z_bucket_w:0.001 count:4 sum:3 buckets:[1 2] n_buckets:[1]}}");
    a.add(&h("{{z_bucket:2 z_bucket_w:1 count:2 sum:1}}")).unwrap();
    assert!(same(&a, &h("{{z_bucket:5 z_bucket_w:1 count:6 sum:4 offset:1 buckets:[2]}}")), "{}", format(&a));
    // A threshold inside a populated bucket moves up to that bucket's upper bound.
    let mut b = h("{{z_bucket:0 z_bucket_w:0.7 count:1 sum:1}}");
    b.add(&h("{{count:1 sum:1 buckets:[1]}}")).unwrap();
    assert!(same(&b, &h("{{z_bucket:1 z_bucket_w:1 count:2 sum:2}}")), "{}", format(&b));
}

#[test]
fn custom_buckets_add_over_the_shared_bounds() {
    let mut a = h("{{schema:-53 custom_values:[1 2 4] count:10 sum:10 buckets:[1 2 3 4]}}");
    let r = a.add(&h("{{schema:-53 custom_values:[2 4 8] count:4 sum:4 buckets:[1 1 1 1]}}")).unwrap();
    assert!(r.custom_bounds_reconciled);
    // Shared bounds [2 4]: (-Inf,2] = 1+2 + 1, (2,4] = 3 + 1, (4,+Inf] = 4 + 1+1.
    assert!(same(&a, &h("{{schema:-53 custom_values:[2 4] count:14 sum:14 buckets:[4 4 6]}}")), "{}", format(&a));
    let mut same_bounds = h("{{schema:-53 custom_values:[1] buckets:[1 1]}}");
    assert!(!same_bounds.add(&h("{{schema:-53 custom_values:[1] buckets:[0 2]}}")).unwrap().custom_bounds_reconciled);
    assert_eq!(same_bounds.positive_buckets, vec![1.0, 3.0]);
    let mut exp = h("{{count:1}}");
    assert_eq!(exp.add(&h("{{schema:-53 custom_values:[1]}}")), Err(HistogramError::IncompatibleSchema));
}

#[test]
fn hints_combine_like_prometheus() {
    use CounterResetHint::*;
    let with = |hint| FloatHistogram { hint, ..FloatHistogram::default() };
    for (a, b, want, collision) in [
        (NotReset, NotReset, NotReset, false),
        (Gauge, NotReset, Gauge, false),
        (NotReset, Gauge, Gauge, false),
        (Unknown, NotReset, Unknown, false),
        (NotReset, Unknown, Unknown, false),
        (Reset, NotReset, Unknown, true),
    ] {
        let mut x = with(a);
        assert_eq!(x.add(&with(b)).unwrap().counter_reset_collision, collision);
        assert_eq!(x.hint, want, "{a:?} + {b:?}");
    }
}

#[test]
fn scaling_and_division_by_zero() {
    let mut a = h("{{count:4 sum:4 z_bucket:1 buckets:[1 2] n_buckets:[0]}}");
    a.mul(-2.0);
    assert_eq!(a.hint, CounterResetHint::Gauge);
    assert_eq!((a.count, a.zero_count, a.positive_buckets.clone()), (-8.0, -2.0, vec![-2.0, -4.0]));
    a.div(0.0);
    assert_eq!(a.count, f64::NEG_INFINITY);
    assert!(a.positive_buckets.is_empty() && a.positive_spans.is_empty() && a.negative_spans.is_empty());
}

#[test]
fn kahan_sums_keep_small_counts_next_to_cancelling_huge_ones() {
    let parts = [
        "{{count:25 sum:3.1 z_bucket:4 z_bucket_w:0.001 buckets:[1 2]}}",
        "{{count:41 sum:1e100 z_bucket:5 z_bucket_w:0.001 buckets:[1e100 3]}}",
        "{{count:41 sum:-1e100 z_bucket:5 z_bucket_w:0.001 buckets:[-1e100 3]}}",
        "{{schema:1 count:0 sum:1.3 z_bucket:3 z_bucket_w:0.001 buckets:[2 4 2]}}",
    ];
    let mut k = KahanSum::new(&h(parts[0]));
    for p in &parts[1..] {
        k.add(&h(p)).unwrap();
    }
    let r = k.result();
    assert!((r.sum - 4.4).abs() < 1e-12, "{}", r.sum);
    assert_eq!(r.count, 107.0);
    // Schema 1's buckets 0 | 1, 2 fall into schema 0's buckets 0 | 1.
    assert_eq!(r.positive_buckets, vec![1.0 + 2.0, 2.0 + 3.0 + 3.0 + 4.0 + 2.0]);
    // A plain sum loses the 3.1 + 1.3.
    let mut plain = h(parts[0]);
    for p in &parts[1..] {
        plain.add(&h(p)).unwrap();
    }
    assert!((plain.sum - 4.4).abs() > 1.0);
    // Different zero buckets fall back to a plain, still correct addition.
    let mut k = KahanSum::new(&h("{{count:1 z_bucket:1 z_bucket_w:0.5}}"));
    k.add(&h("{{count:2 buckets:[2]}}")).unwrap();
    assert_eq!(k.result().count, 3.0);
}

#[test]
fn go_formatting() {
    assert_eq!(go_g(1234567.0), "1.234567e+06");
    assert_eq!(go_g(123456.0), "123456");
    assert_eq!(go_g(0.0001), "0.0001");
    assert_eq!(go_g(0.00001), "1e-05");
    assert_eq!(go_g(-2.5), "-2.5");
    let x = h("{{schema:0 sum:10 count:20 z_bucket_w:0.001 z_bucket:2 buckets:[1 2] n_buckets:[1 2]}}");
    assert_eq!(x.to_string(), "{count:20, sum:10, [-2,-1):2, [-1,-0.5):1, [-0.001,0.001]:2, (0.5,1]:1, (1,2]:2}");
}

#[test]
fn compaction_drops_empty_buckets() {
    let mut a = h("{{offset:-1 buckets:[0 1 0 0 2 0]}}");
    a.compact();
    assert_eq!(a.positive_spans, vec![Span { offset: 0, length: 1 }, Span { offset: 2, length: 1 }]);
    assert_eq!(a.positive_buckets, vec![1.0, 2.0]);
}

#[test]
fn counter_resets_are_detected() {
    let prev = h("{{count:4 sum:4 z_bucket:1 buckets:[1 2]}}");
    assert!(!h("{{count:5 sum:1 z_bucket:1 buckets:[1 3]}}").detect_reset(&prev), "a lower sum is no reset");
    assert!(h("{{count:5 sum:5 z_bucket:1 buckets:[2 1 1]}}").detect_reset(&prev), "a bucket went down");
    assert!(h("{{count:5 sum:5 z_bucket:0 buckets:[3 2]}}").detect_reset(&prev), "the zero bucket went down");
    assert!(h("{{count:5 sum:5 z_bucket:1 offset:1 buckets:[4]}}").detect_reset(&prev), "a populated bucket vanished");
    assert!(h("{{count:3 sum:5 z_bucket:1 buckets:[1 2]}}").detect_reset(&prev), "the count went down");
    assert!(!h("{{count:4 counter_reset_hint:not_reset}}").detect_reset(&prev), "the hint wins");
    assert!(h("{{count:9 z_bucket:1 buckets:[1 2] counter_reset_hint:reset}}").detect_reset(&prev));
    assert!(h("{{schema:1 count:9 z_bucket:1 buckets:[1 2]}}").detect_reset(&prev), "resolution rose");
    // A lower resolution is compared after merging the previous buckets.
    assert!(!h("{{schema:-1 count:4 z_bucket:1 buckets:[1 2]}}").detect_reset(&prev));
    // Custom buckets with different bounds compare over the shared bounds.
    let p = h("{{schema:-53 custom_values:[1 2] count:3 buckets:[1 1 1]}}");
    assert!(!h("{{schema:-53 custom_values:[2] count:3 buckets:[2 1]}}").detect_reset(&p));
    assert!(h("{{schema:-53 custom_values:[2] count:3 buckets:[1 2]}}").detect_reset(&p));
}

#[test]
fn all_buckets_ascend_with_clipped_zero_neighbours() {
    let a = h("{{z_bucket:1 z_bucket_w:0.7 count:4 buckets:[1 2] n_buckets:[1]}}");
    let b = a.all_buckets();
    let bounds: Vec<(f64, f64, f64)> = b.iter().map(|b| (b.lower, b.upper, b.count)).collect();
    assert_eq!(bounds, vec![(-1.0, -0.7, 1.0), (-0.7, 0.7, 1.0), (0.7, 1.0, 1.0), (1.0, 2.0, 2.0)]);
    let c = h("{{schema:-53 custom_values:[5 10] buckets:[1 2 3]}}");
    let bounds: Vec<(f64, f64)> = c.all_buckets().iter().map(|b| (b.lower, b.upper)).collect();
    assert_eq!(bounds, vec![(f64::NEG_INFINITY, 5.0), (5.0, 10.0), (10.0, f64::INFINITY)]);
}

#[test]
fn validation_names_the_problem() {
    assert!(h("{{count:4 buckets:[1 2 1]}}").validate().is_ok());
    assert!(h("{{schema:9}}").validate().is_err());
    let mut bad = h("{{buckets:[1 2]}}");
    bad.positive_buckets.pop();
    assert!(bad.validate().unwrap_err().to_string().contains("need 2 buckets, have 1"));
    assert!(h("{{buckets:[1 -2]}}").validate().unwrap_err().to_string().contains("observation count of -2"));
    assert!(h("{{schema:-53 custom_values:[2 1]}}")
        .validate()
        .unwrap_err()
        .to_string()
        .contains("strictly increasing"));
    assert!(h("{{schema:-53 custom_values:[1] buckets:[1 1 1]}}").validate().is_err());
    assert!(h("{{schema:-53 z_bucket:1}}").validate().is_err());
}

fn arb_histogram(schema: i32) -> impl Strategy<Value = FloatHistogram> {
    (
        -8i32..8,
        prop::collection::vec(0u32..20, 0..12),
        -8i32..8,
        prop::collection::vec(0u32..20, 0..6),
        0u32..5,
        prop::bool::ANY,
    )
        .prop_map(move |(off, pos, noff, neg, zero, wide_zero)| {
            // No bucket inside the zero bucket (valid histograms have none): with schemas ≥ 0,
            // bucket −1 starts at 1/2 at the lowest.
            let (off, noff) = if wide_zero { (off.max(-1), noff.max(-1)) } else { (off, noff) };
            let (positive_spans, positive_buckets) =
                notation::dense(off, &pos.iter().map(|c| *c as f64).collect::<Vec<_>>());
            let (negative_spans, negative_buckets) =
                notation::dense(noff, &neg.iter().map(|c| *c as f64).collect::<Vec<_>>());
            let count = (pos.iter().chain(&neg).sum::<u32>() + zero) as f64;
            FloatHistogram {
                schema,
                zero_threshold: if wide_zero { 0.25 } else { 0.0 },
                zero_count: zero as f64,
                count,
                sum: count,
                positive_spans,
                positive_buckets,
                negative_spans,
                negative_buckets,
                ..FloatHistogram::default()
            }
        })
}

fn total(h: &FloatHistogram) -> f64 {
    h.zero_count + h.positive_buckets.iter().sum::<f64>() + h.negative_buckets.iter().sum::<f64>()
}

proptest! {
    /// Addition keeps every observation (integer counts add exactly), is commutative, and
    /// subtracting the addend again gives back the first operand when nothing was merged away.
    #[test]
    fn add_keeps_observations(a in arb_histogram(1), b in arb_histogram(0)) {
        let mut x = a.clone();
        x.add(&b).unwrap();
        prop_assert_eq!(total(&x), total(&a) + total(&b));
        prop_assert_eq!(x.count, a.count + b.count);
        prop_assert_eq!(x.schema, 0);
        let mut y = b.clone();
        y.add(&a).unwrap();
        prop_assert!(same(&x, &y), "{} vs {}", format(&x), format(&y));
        prop_assert!(x.validate().is_ok());
    }

    #[test]
    fn sub_undoes_add(a in arb_histogram(2), b in arb_histogram(2)) {
        prop_assume!(a.zero_threshold == b.zero_threshold);
        let mut x = a.clone();
        x.add(&b).unwrap();
        x.sub(&b).unwrap();
        prop_assert!(same(&x, &a), "{} vs {}", format(&x), format(&a));
        // And a sum never looks like a reset against either operand.
        let mut s = a.clone();
        s.add(&b).unwrap();
        prop_assert!(!s.detect_reset(&a));
    }
}
