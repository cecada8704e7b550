use super::*;
use crate::head::HeadOptions;
use strata_model::MatchOp;

fn head_with(samples: &[(i64, f64)]) -> Head {
    let head = Head::in_memory(HeadOptions::default());
    let mut app = head.appender();
    for &(t, v) in samples {
        app.append(&Labels::from_pairs([("__name__", "s")]), t, v).unwrap();
    }
    app.commit().unwrap();
    head
}

fn sel(head: &Head, mint: i64, maxt: i64) -> Vec<Series> {
    Querier::new(head, mint, maxt).select(&[Matcher::new(MatchOp::Equal, "__name__", "s").unwrap()]).unwrap()
}

#[test]
fn iterator_spans_chunks_and_clips_to_range() {
    let samples: Vec<(i64, f64)> = (0..1000).map(|i| (i * 10, i as f64)).collect();
    let head = head_with(&samples);
    let s = &sel(&head, 1995, 7005)[0];
    assert!(s.chunks.len() >= 2, "range spans several chunks");
    let got: Vec<i64> = s.samples().iter().map(|s| s.t).collect();
    let want: Vec<i64> = (200..=700).map(|i| i * 10).collect();
    assert_eq!(got, want);
}

#[test]
fn seek_moves_forward_only_and_across_chunks() {
    let samples: Vec<(i64, f64)> = (0..1000).map(|i| (i * 10, i as f64)).collect();
    let head = head_with(&samples);
    let s = &sel(&head, i64::MIN, i64::MAX)[0];
    let mut it = s.iter();
    assert_eq!(it.seek(5005).map(|s| s.t), Some(5010));
    assert_eq!(it.seek(100).map(|s| s.t), Some(5010), "seek never moves back");
    assert_eq!(it.next().map(|s| s.t), Some(5020));
    assert_eq!(it.seek(9990).map(|s| s.t), Some(9990));
    assert_eq!(it.next(), None);
    assert_eq!(it.seek(0), None);
    assert!(it.err().is_none());
}

#[test]
fn series_without_samples_in_range_are_not_selected() {
    let head = head_with(&[(100, 1.0)]);
    assert!(sel(&head, 200, 300).is_empty());
    assert_eq!(sel(&head, 100, 100).len(), 1);
}

#[test]
fn select_stops_at_the_series_limit() {
    let head = Head::in_memory(HeadOptions::default());
    let mut app = head.appender();
    for i in 0..10 {
        app.append(&Labels::from_pairs([("__name__", "s"), ("i", &i.to_string())]), 100, 1.0).unwrap();
    }
    app.commit().unwrap();
    let all = [Matcher::new(MatchOp::Equal, "__name__", "s").unwrap()];
    assert_eq!(Querier::new(&head, 0, 200).limit_series(10).select(&all).unwrap().len(), 10);
    let err = Querier::new(&head, 0, 200).limit_series(9).select(&all).unwrap_err();
    assert!(matches!(err, crate::Error::TooManySeries { limit: 9 }), "{err}");
    assert_eq!(err.to_string(), "the query selects more than 9 series");
    // Series without samples in range do not count.
    assert_eq!(Querier::new(&head, 200, 300).limit_series(1).select(&all).unwrap().len(), 0);
}
