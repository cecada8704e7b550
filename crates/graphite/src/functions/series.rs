//! A series as graphite-web's functions see it (`render/datalib.py`, `TimeSeries`): values at a
//! fixed step from `start` (gaps are `None`), a name, the path expression that fetched it, its
//! tags, and how it consolidates when several of its values make one point
//! (`values_per_point`, set by `normalize` and by `maxDataPoints`).

use std::collections::BTreeMap;

/// How a series folds `values_per_point` values into one (`consolidateBy`; `average` unless
/// set), each ignoring gaps except `avg_zero`, which counts them as 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Consolidation {
    Average,
    AvgZero,
    Sum,
    Min,
    Max,
    First,
    Last,
}

impl Consolidation {
    pub fn parse(name: &str) -> Option<Consolidation> {
        Some(match name {
            "average" | "avg" => Consolidation::Average,
            "avg_zero" => Consolidation::AvgZero,
            "sum" => Consolidation::Sum,
            "min" => Consolidation::Min,
            "max" => Consolidation::Max,
            "first" => Consolidation::First,
            "last" => Consolidation::Last,
            _ => return None,
        })
    }

    /// Folds `usable` (non-empty; with `AvgZero` gaps already turned to 0) as graphite-web
    /// does: Python's left-to-right sums.
    fn fold(self, usable: &[f64]) -> f64 {
        match self {
            Consolidation::Average | Consolidation::AvgZero => usable.iter().sum::<f64>() / usable.len() as f64,
            Consolidation::Sum => usable.iter().sum(),
            Consolidation::Min => usable.iter().copied().fold(f64::INFINITY, py_min),
            Consolidation::Max => usable.iter().copied().fold(f64::NEG_INFINITY, py_max),
            Consolidation::First => usable[0],
            Consolidation::Last => usable[usable.len() - 1],
        }
    }
}

/// Python's `min` of two floats: the first unless the second is smaller (NaN never is).
fn py_min(a: f64, b: f64) -> f64 {
    if b < a {
        b
    } else {
        a
    }
}

fn py_max(a: f64, b: f64) -> f64 {
    if b > a {
        b
    } else {
        a
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub start: i64,
    pub end: i64,
    pub step: i64,
    /// As stored, before consolidation.
    pub values: Vec<Option<f64>>,
    pub consolidation: Consolidation,
    pub values_per_point: usize,
    /// Share of a point's values that must be present for it not to be a gap.
    pub x_files_factor: f64,
    pub path_expression: String,
    /// Graphite's tags (`name` among them), as strings (graphite-web stores `str(value)`).
    pub tags: BTreeMap<String, String>,
}

impl Series {
    /// A series as fetched: tags `name` and the path's own; consolidation `average`.
    pub fn fetched(
        name: String,
        tags: BTreeMap<String, String>,
        (start, end, step): (i64, i64, i64),
        values: Vec<Option<f64>>,
        path_expression: String,
        x_files_factor: f64,
    ) -> Series {
        Series {
            name,
            start,
            end,
            step,
            values,
            consolidation: Consolidation::Average,
            values_per_point: 1,
            x_files_factor,
            path_expression,
            tags,
        }
    }

    /// A series a function made (graphite-web's `TimeSeries(name, ...)`): its tags are just
    /// `name`, its path expression the name.
    pub fn derived(name: String, range: (i64, i64, i64), values: Vec<Option<f64>>, x_files_factor: f64) -> Series {
        let tags = BTreeMap::from([("name".to_owned(), name.clone())]);
        Series::fetched(name.clone(), tags, range, values, name, x_files_factor)
    }

    /// The values as graphite-web iterates them: every `values_per_point` stored values folded
    /// into one (a gap unless enough are present: more than none, and at least
    /// `x_files_factor` of them), the last group possibly shorter.
    pub fn points(&self) -> Vec<Option<f64>> {
        consolidate(&self.values, self.values_per_point, self.consolidation, self.x_files_factor)
    }

    /// `points()`, borrowed where nothing is folded.
    pub fn points_cow(&self) -> std::borrow::Cow<'_, [Option<f64>]> {
        match self.values_per_point {
            0 | 1 => std::borrow::Cow::Borrowed(&self.values),
            _ => std::borrow::Cow::Owned(self.points()),
        }
    }
}

/// Every `per` values folded into one as graphite-web's `TimeSeries` iterates them: a gap
/// unless enough are present (more than none, and at least `x_files_factor` of `per`), the
/// last group possibly shorter.
pub fn consolidate(values: &[Option<f64>], per: usize, how: Consolidation, x_files_factor: f64) -> Vec<Option<f64>> {
    let per = per.max(1);
    if per == 1 {
        return values.to_vec();
    }
    let mut buf = Vec::with_capacity(per);
    values
        .chunks(per)
        .map(|group| {
            buf.clear();
            let mut present = 0;
            for v in group {
                match v {
                    Some(x) => {
                        buf.push(*x);
                        present += 1;
                    }
                    None if how == Consolidation::AvgZero => buf.push(0.0),
                    None => {}
                }
            }
            // graphite-web divides by the full group size, even for a short last group.
            (present > 0 && present as f64 / per as f64 >= x_files_factor).then(|| how.fold(&buf))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_fold_groups_as_graphite_web_does() {
        let mut s = Series::derived("a".into(), (0, 50, 10), vec![Some(1.0), None, Some(3.0), None, None], 0.0);
        assert_eq!(s.points(), s.values);
        s.values_per_point = 2;
        assert_eq!(s.points(), [Some(1.0), Some(3.0), None]);
        s.consolidation = Consolidation::AvgZero;
        assert_eq!(s.points(), [Some(0.5), Some(1.5), None]);
        s.consolidation = Consolidation::Sum;
        s.x_files_factor = 0.6;
        assert_eq!(s.points(), [None, None, None]);
        s.x_files_factor = 0.5;
        s.consolidation = Consolidation::Max;
        assert_eq!(s.points(), [Some(1.0), Some(3.0), None]);
    }
}
