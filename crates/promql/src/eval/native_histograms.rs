//! What PromQL computes from one native histogram: quantiles, fractions, standard deviation
//! and variance.
//!
//! Inside a bucket, observations are assumed spread so that they would fill a finer
//! exponential histogram evenly: interpolation is linear on a logarithmic scale
//! ("exponential interpolation"). The zero bucket and custom buckets are interpolated
//! linearly. Observations of NaN count in `count` but in no bucket; they show as a NaN `sum`.

use strata_model::histogram::Bucket;
use strata_model::FloatHistogram;

use super::aggregate::kahan_inc;

/// What a quantile computation noticed about NaN observations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NanNote {
    None,
    /// The rank lies among the NaN observations: the result is NaN.
    ResultNaN,
    /// NaN observations exist and push every rank up.
    SkewedHigher,
}

/// Buckets as PromQL reads them: clipped around the zero bucket, and with a natural bound of
/// zero where one side of the histogram is empty.
fn buckets(h: &FloatHistogram) -> Vec<Bucket> {
    let only_positive = h.negative_buckets.is_empty() && !h.positive_buckets.is_empty();
    let only_negative = h.positive_buckets.is_empty() && !h.negative_buckets.is_empty();
    let mut out = h.all_buckets();
    for b in &mut out {
        if b.lower < 0.0 && b.upper > 0.0 && !h.uses_custom_buckets() {
            if only_positive {
                b.lower = 0.0;
            } else if only_negative {
                b.upper = 0.0;
            }
        }
    }
    out
}

/// Whether `b` is interpolated linearly: custom buckets, and the zero bucket.
fn linear(h: &FloatHistogram, b: &Bucket) -> bool {
    h.uses_custom_buckets() || (b.lower <= 0.0 && b.upper >= 0.0)
}

/// The value at `fraction` (0..=1) of the way through bucket `b`.
fn value_at(h: &FloatHistogram, b: &Bucket, fraction: f64) -> f64 {
    if linear(h, b) {
        return b.lower + (b.upper - b.lower) * fraction;
    }
    let (lo, hi) = (b.lower.abs().log2(), b.upper.abs().log2());
    if b.lower > 0.0 {
        (lo + (hi - lo) * fraction).exp2()
    } else {
        // Negative buckets mirror the positive ones.
        -(hi + (lo - hi) * (1.0 - fraction)).exp2()
    }
}

/// How far (0..=1) value `v` lies into bucket `b`, the inverse of [`value_at`].
fn fraction_at(h: &FloatHistogram, b: &Bucket, v: f64) -> f64 {
    if linear(h, b) {
        if b.lower.is_infinite() || b.upper.is_infinite() {
            // An open-ended custom bucket: nothing can be said inside it.
            return if b.upper.is_infinite() { 0.0 } else { 1.0 };
        }
        return (v - b.lower) / (b.upper - b.lower);
    }
    let (lo, hi, x) = (b.lower.abs().log2(), b.upper.abs().log2(), v.abs().log2());
    if b.lower > 0.0 {
        (x - lo) / (hi - lo)
    } else {
        1.0 - (x - hi) / (lo - hi)
    }
}

/// The `q` quantile of `h`.
pub(super) fn quantile(q: f64, h: &FloatHistogram) -> (f64, NanNote) {
    if q < 0.0 {
        return (f64::NEG_INFINITY, NanNote::None);
    }
    if q > 1.0 {
        return (f64::INFINITY, NanNote::None);
    }
    if h.count == 0.0 || q.is_nan() {
        return (f64::NAN, NanNote::None);
    }
    let nan_observations = h.sum.is_nan();
    let mut all = buckets(h);
    // From the side nearer the rank, unless NaN observations (in no bucket) make the high
    // side's ranks meaningless.
    let forward = nan_observations || q < 0.5;
    let mut rank = if forward { q * h.count } else { (1.0 - q) * h.count };
    if !forward {
        all.reverse();
    }
    let mut count = 0.0;
    let mut found: Option<Bucket> = None;
    for b in all.iter().filter(|b| b.count != 0.0) {
        count += b.count;
        found = Some(*b);
        if count >= rank {
            break;
        }
    }
    let Some(mut b) = found else {
        return (f64::NAN, if nan_observations { NanNote::ResultNaN } else { NanNote::None });
    };
    if h.uses_custom_buckets() {
        if b.lower == f64::NEG_INFINITY {
            if b.upper <= 0.0 {
                return (b.upper, NanNote::None);
            }
            b.lower = 0.0;
        } else if b.upper == f64::INFINITY {
            return (b.lower, NanNote::None);
        }
    }
    count = count.min(h.count);
    if count < rank {
        // The rank lies beyond every bucket: among NaN observations.
        return (f64::NAN, NanNote::ResultNaN);
    }
    if forward {
        rank -= count - b.count;
    } else {
        rank = count - rank;
    }
    let note = if nan_observations { NanNote::SkewedHigher } else { NanNote::None };
    (value_at(h, &b, rank / b.count), note)
}

/// The fraction of observations of `h` between `lower` and `upper`; NaN observations are in
/// none (they only count in the total).
pub(super) fn fraction(lower: f64, upper: f64, h: &FloatHistogram) -> f64 {
    if h.count == 0.0 || lower.is_nan() || upper.is_nan() {
        return f64::NAN;
    }
    if lower >= upper {
        return 0.0;
    }
    let (mut rank, mut lower_rank, mut upper_rank) = (0.0, None::<f64>, None::<f64>);
    for mut b in buckets(h) {
        if h.uses_custom_buckets() && b.lower == f64::NEG_INFINITY && b.upper > 0.0 {
            b.lower = 0.0;
        }
        if lower_rank.is_none() && b.lower >= lower {
            lower_rank = Some(rank);
        }
        if upper_rank.is_none() && b.lower >= upper {
            upper_rank = Some(rank);
        }
        if lower_rank.is_some() && upper_rank.is_some() {
            break;
        }
        if lower_rank.is_none() && b.lower < lower && b.upper > lower {
            lower_rank = Some(rank + b.count * fraction_at(h, &b, lower));
        }
        if upper_rank.is_none() && b.lower < upper && b.upper > upper {
            upper_rank = Some(rank + b.count * fraction_at(h, &b, upper));
        }
        if lower_rank.is_some() && upper_rank.is_some() {
            break;
        }
        rank += b.count;
    }
    // A bound above every bucket takes every bucketed observation.
    let lower_rank = lower_rank.unwrap_or(rank).min(h.count);
    let upper_rank = upper_rank.unwrap_or(rank).min(h.count);
    (upper_rank - lower_rank) / h.count
}

/// The variance of `h`'s observations, each bucket's observations taken at its middle: the
/// geometric mean of its bounds for exponential buckets, the arithmetic one for custom buckets,
/// zero for the zero bucket.
pub(super) fn variance(h: &FloatHistogram) -> f64 {
    let mean = h.sum / h.count;
    let (mut v, mut c) = (0.0, 0.0);
    for b in h.all_buckets() {
        if b.count == 0.0 {
            continue;
        }
        let mid = if h.uses_custom_buckets() {
            (b.upper + b.lower) / 2.0
        } else if b.lower <= 0.0 && b.upper >= 0.0 {
            0.0
        } else {
            let m = (b.upper * b.lower).sqrt();
            if b.upper < 0.0 {
                -m
            } else {
                m
            }
        };
        let delta = mid - mean;
        (v, c) = kahan_inc(b.count * delta * delta, v, c);
    }
    (v + c) / h.count
}

/// One bucket for trimming: bounds as PromQL reads them, and how to interpolate inside it.
struct TrimBucket {
    lower: f64,
    upper: f64,
    count: f64,
    /// Linear (custom buckets, the zero bucket) rather than exponential.
    linear: bool,
}

impl TrimBucket {
    /// Where `count` observations between `lo` and `hi` (inside this bucket) are taken to be:
    /// the geometric middle for exponential buckets, the arithmetic one otherwise; the finite
    /// bound of a half-infinite range.
    fn middle(&self, lo: f64, hi: f64) -> f64 {
        if lo == f64::NEG_INFINITY {
            return hi;
        }
        if hi == f64::INFINITY {
            return lo;
        }
        if self.linear {
            (lo + hi) / 2.0
        } else {
            let m = (lo * hi).sqrt();
            if hi < 0.0 {
                -m
            } else {
                m
            }
        }
    }

    /// The share of this (finite) bucket's observations at or below `v`.
    fn share_below(&self, v: f64) -> f64 {
        if self.linear {
            return (v - self.lower) / (self.upper - self.lower);
        }
        let (lo, hi, x) = (self.lower.abs().log2(), self.upper.abs().log2(), v.abs().log2());
        if self.lower >= 0.0 {
            (x - lo) / (hi - lo)
        } else {
            // Magnitudes shrink towards zero on the negative side.
            (lo - x) / (lo - hi)
        }
    }
}

/// `h </ cut` (`keep_below`: only the observations at or below `cut`) or `h >/ cut` (only
/// those above). A bucket the cut falls inside keeps the interpolated share of its count; an
/// infinite bucket cannot be split: the +Inf bucket is dropped when cut from above and kept
/// whole (its observations taken at the cut) when cut from below, and the reverse for the
/// -Inf bucket. When anything was cut, count and sum are recomputed from what is left, each
/// bucket's observations taken at its middle; when nothing was, `h` is returned as it is.
pub(super) fn trim(h: &FloatHistogram, cut: f64, keep_below: bool) -> FloatHistogram {
    let custom = h.uses_custom_buckets();
    let only_positive = h.negative_buckets.is_empty() && !h.positive_buckets.is_empty();
    let only_negative = h.positive_buckets.is_empty() && !h.negative_buckets.is_empty();
    let changed = std::cell::Cell::new(false);
    let (mut count, mut sum) = (0.0, 0.0);
    let mut out = h.clone();
    let mut keep = |b: &TrimBucket| -> f64 {
        let (lo, hi) = (b.lower, b.upper);
        let (kept, middle) = if keep_below {
            if hi <= cut {
                (b.count, b.middle(lo, hi))
            } else if lo >= cut || hi == f64::INFINITY {
                (0.0, 0.0)
            } else if lo == f64::NEG_INFINITY {
                (b.count, cut)
            } else {
                (b.count * b.share_below(cut), b.middle(lo, cut))
            }
        } else if lo >= cut {
            (b.count, b.middle(lo, hi))
        } else if hi <= cut || lo == f64::NEG_INFINITY {
            (0.0, 0.0)
        } else if hi == f64::INFINITY {
            (b.count, cut)
        } else {
            (b.count * (1.0 - b.share_below(cut)), b.middle(cut, hi))
        };
        if kept != b.count {
            changed.set(true);
        }
        count += kept;
        if kept != 0.0 {
            sum += kept * middle;
        }
        kept
    };
    if !custom {
        let zt = h.zero_threshold;
        let (lower, upper) = if only_positive {
            (0.0, zt)
        } else if only_negative {
            (-zt, 0.0)
        } else {
            (-zt, zt)
        };
        out.zero_count = keep(&TrimBucket { lower, upper, count: h.zero_count, linear: true });
    }
    for positive in [true, false] {
        let side: Vec<Bucket> = if positive { h.positive_buckets().collect() } else { h.negative_buckets().collect() };
        let mut kept = Vec::new();
        for b in side {
            let (mut lower, mut upper) = (b.lower, b.upper);
            if custom && lower == f64::NEG_INFINITY && upper > 0.0 && upper != f64::INFINITY {
                // The first custom bucket reaching above zero starts at zero, as for quantiles;
                // a cut below zero falls outside it and removes it either way.
                if cut < 0.0 && cut != f64::NEG_INFINITY {
                    changed.set(changed.get() || b.count != 0.0);
                    kept.push(0.0);
                    continue;
                }
                lower = 0.0;
            }
            if !custom {
                // Buckets overlapping the zero bucket end at its threshold.
                if lower > 0.0 && lower < h.zero_threshold {
                    lower = h.zero_threshold;
                }
                if upper < 0.0 && upper > -h.zero_threshold {
                    upper = -h.zero_threshold;
                }
            }
            kept.push(keep(&TrimBucket { lower, upper, count: b.count, linear: custom }));
        }
        if positive {
            out.positive_buckets = kept;
        } else {
            out.negative_buckets = kept;
        }
    }
    if !changed.get() {
        return h.clone();
    }
    out.count = count;
    out.sum = sum;
    out
}

#[cfg(test)]
mod tests {
    use strata_model::histogram::notation::parse;

    use super::*;

    #[test]
    fn exponential_interpolation() {
        let h = parse("{{schema:0 sum:5 count:4 buckets:[1 2 1]}}").unwrap();
        // The median is the middle of (1, 2] on a log scale: √2.
        assert_eq!(quantile(0.5, &h).0, std::f64::consts::SQRT_2);
        assert_eq!(fraction(1.0, 2.0, &h), 0.5);
        assert_eq!(fraction(0.0, 8.0, &h), 1.0);
        assert!((fraction(f64::NEG_INFINITY, quantile(0.3, &h).0, &h) - 0.3).abs() < 1e-12);
    }

    #[test]
    fn trimming_interpolates_and_recomputes_the_sum() {
        let h =
            parse("{{schema:0 sum:123.75 count:34 z_bucket:1 z_bucket_w:0.001 buckets:[2 4 8 16] n_buckets:[1 2]}}")
                .unwrap();
        let below = trim(&h, 2.0, true);
        assert_eq!(below.count, 10.0);
        assert!((below.sum - 3.5355339059327373).abs() < 1e-12, "{}", below.sum);
        let above = trim(&h, std::f64::consts::SQRT_2, false);
        assert!((above.count - 26.0).abs() < 1e-9 && (above.sum - 116.50067065070982).abs() < 1e-9);
        // Nothing cut: the histogram as it was, sum included.
        assert!(trim(&h, f64::INFINITY, true).bit_eq(&h));
        let cbh = parse("{{schema:-53 sum:172.5 count:15 custom_values:[5 10 15 20] buckets:[1 6 4 3 1]}}").unwrap();
        let t = trim(&cbh, 13.0, false);
        assert!((t.count - 5.6).abs() < 1e-12 && (t.sum - 94.9).abs() < 1e-9, "{} {}", t.count, t.sum);
    }

    #[test]
    fn nan_observations() {
        let h = parse("{{schema:0 count:15 sum:NaN buckets:[12]}}").unwrap();
        assert_eq!(quantile(0.8, &h), (1.0, NanNote::SkewedHigher));
        assert_eq!(quantile(0.4, &h), (std::f64::consts::FRAC_1_SQRT_2, NanNote::SkewedHigher));
        assert!(quantile(0.81, &h).0.is_nan());
        assert_eq!(quantile(0.81, &h).1, NanNote::ResultNaN);
        assert!((fraction(f64::NEG_INFINITY, std::f64::consts::FRAC_1_SQRT_2, &h) - 0.4).abs() < 1e-12);
    }
}
