use super::*;
use crate::querier::{Querier, SampleIterator};
use crate::wal::FsyncPolicy;
use proptest::prelude::*;
use rand::SeedableRng;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use strata_model::MatchOp;

fn l(pairs: &[(&str, &str)]) -> Labels {
    Labels::from_pairs(pairs.iter().copied())
}

fn m(op: MatchOp, name: &str, v: &str) -> Matcher {
    Matcher::new(op, name, v).unwrap()
}

fn wal_opts() -> HeadOptions {
    HeadOptions { wal: WalOptions { fsync: FsyncPolicy::Always, ..Default::default() }, ..Default::default() }
}

/// Every series and sample of the head, as a model map.
fn dump(head: &Head) -> BTreeMap<Labels, Vec<(i64, u64)>> {
    Querier::new(head, i64::MIN, i64::MAX)
        .select(&[m(MatchOp::RegexMatch, "__name__", ".+")])
        .unwrap()
        .into_iter()
        .map(|s| (s.labels.clone(), s.samples().iter().map(|x| (x.t, x.v.to_bits())).collect()))
        .collect()
}

#[test]
fn append_then_select_sorted_by_labels() {
    let head = Head::in_memory(HeadOptions::default());
    let mut app = head.appender();
    for (i, job) in ["b", "a", "c"].iter().enumerate() {
        for t in 0..300 {
            app.append(&l(&[("__name__", "up"), ("job", job)]), t * 1000, (t + i as i64) as f64).unwrap();
        }
    }
    app.append(&l(&[("__name__", "other")]), 0, 1.0).unwrap();
    assert_eq!(app.commit().unwrap().appended, 901);

    let q = Querier::new(&head, 10_000, 20_000);
    let got = q.select(&[m(MatchOp::Equal, "__name__", "up")]).unwrap();
    let jobs: Vec<&str> = got.iter().map(|s| s.labels.get("job").unwrap()).collect();
    assert_eq!(jobs, ["a", "b", "c"]);
    let s = got[0].samples();
    assert_eq!(s.first().map(|s| s.t), Some(10_000));
    assert_eq!(s.last().map(|s| s.t), Some(20_000));
    assert_eq!(s.len(), 11);
    assert_eq!(head.num_series(), 4);
    assert_eq!(head.time_range(), Some((0, 299_000)));
}

#[test]
fn time_range_of_covers_the_selected_series_only() {
    let head = Head::in_memory(HeadOptions {
        out_of_order: OutOfOrder { window_ms: 60_000, replace: false },
        ..HeadOptions::default()
    });
    let mut app = head.appender();
    for t in 100..200 {
        app.append(&l(&[("__name__", "late"), ("job", "a")]), t * 1000, 1.0).unwrap();
        app.append(&l(&[("__name__", "early")]), (t - 100) * 1000, 1.0).unwrap();
    }
    app.commit().unwrap();
    // A late sample counts too: before the series' first in-order one.
    let mut app = head.appender();
    app.append(&l(&[("__name__", "late"), ("job", "b")]), 180_000, 2.0).unwrap();
    app.commit().unwrap();
    let mut app = head.appender();
    app.append(&l(&[("__name__", "late"), ("job", "b")]), 145_000, 2.0).unwrap();
    app.commit().unwrap();
    assert_eq!(head.time_range(), Some((0, 199_000)));
    assert_eq!(head.time_range_of(&[m(MatchOp::Equal, "__name__", "late")]), Some((100_000, 199_000)));
    assert_eq!(head.time_range_of(&[m(MatchOp::Equal, "job", "b")]), Some((145_000, 180_000)));
    assert_eq!(head.time_range_of(&[m(MatchOp::Equal, "__name__", "early")]), Some((0, 99_000)));
    assert_eq!(head.time_range_of(&[m(MatchOp::Equal, "__name__", "none")]), None);
}

#[test]
fn typed_append_errors() {
    let head = Head::in_memory(HeadOptions::default());
    let a = l(&[("__name__", "x")]);
    let mut app = head.appender();
    app.append(&a, 10_000_000, 1.0).unwrap();
    assert_eq!(
        app.append(&a, 9_000_000, 1.0),
        Err(AppendError::Sample(SampleError::OutOfOrder { t: 9_000_000, latest: 10_000_000 }))
    );
    assert_eq!(app.append(&a, 10_000_000, 2.0), Err(AppendError::Sample(SampleError::Duplicate { t: 10_000_000 })));
    app.commit().unwrap();

    let mut app = head.appender();
    assert_eq!(app.append(&a, 10_000_000, 1.0), Ok(SeriesRef(1)), "an identical retry is accepted");
    assert_eq!(app.append(&a, 10_000_000, 3.0), Err(AppendError::Sample(SampleError::Duplicate { t: 10_000_000 })));
    let min_t = 10_000_000 - BLOCK_RANGE_MS_DEFAULT / 2;
    assert_eq!(app.append(&a, min_t - 1, 1.0), Err(AppendError::Sample(SampleError::TooOld { t: min_t - 1, min_t })));
    assert!(matches!(app.append(&Labels::empty(), 1, 1.0), Err(AppendError::InvalidLabels(_))));
    assert_eq!(app.append_ref(SeriesRef(99), 10_000_001, 1.0), Err(AppendError::UnknownSeries(SeriesRef(99))));
    assert_eq!(app.commit().unwrap().appended, 0);
    assert_eq!(head.stats.rejected_duplicate.load(Ordering::Relaxed), 2);
    assert_eq!(head.stats.rejected_too_old.load(Ordering::Relaxed), 1);
}

#[test]
fn matchers_follow_prometheus_semantics() {
    let head = Head::in_memory(HeadOptions::default());
    let mut app = head.appender();
    let sets = [
        l(&[("__name__", "m"), ("a", "1")]),
        l(&[("__name__", "m"), ("a", "2"), ("b", "x")]),
        l(&[("__name__", "m"), ("b", "y")]),
        l(&[("__name__", "n"), ("a", "1")]),
    ];
    for s in &sets {
        app.append(s, 1, 1.0).unwrap();
    }
    app.commit().unwrap();
    let q = Querier::new(&head, 0, 10);
    let names =
        |ms: &[Matcher]| -> Vec<String> { q.select(ms).unwrap().iter().map(|s| s.labels.to_string()).collect() };
    let name_m = m(MatchOp::Equal, "__name__", "m");
    assert_eq!(names(&[name_m.clone(), m(MatchOp::RegexMatch, "a", ".*")]).len(), 3, "=~.* includes series without a");
    assert_eq!(names(&[name_m.clone(), m(MatchOp::NotEqual, "a", "")]), [r#"m{a="1"}"#, r#"m{a="2", b="x"}"#]);
    assert_eq!(names(&[name_m.clone(), m(MatchOp::Equal, "a", "")]), [r#"m{b="y"}"#]);
    assert_eq!(names(&[name_m.clone(), m(MatchOp::NotEqual, "a", "1")]), [r#"m{a="2", b="x"}"#, r#"m{b="y"}"#]);
    assert_eq!(names(&[name_m.clone(), m(MatchOp::RegexNoMatch, "b", "x|z")]), [r#"m{a="1"}"#, r#"m{b="y"}"#]);
    assert_eq!(names(&[m(MatchOp::RegexMatch, "a", "1|2")]).len(), 3);
    assert_eq!(names(&[m(MatchOp::RegexMatch, "__name__", "m|n"), m(MatchOp::Equal, "a", "1")]).len(), 2);
    assert!(names(&[m(MatchOp::Equal, "nope", "x")]).is_empty());

    assert_eq!(q.label_names(&[]).unwrap(), ["__name__", "a", "b"]);
    assert_eq!(q.label_names(&[m(MatchOp::Equal, "__name__", "n")]).unwrap(), ["__name__", "a"]);
    assert_eq!(q.label_values("a", &[]).unwrap(), ["1", "2"]);
    assert_eq!(q.label_values("b", &[m(MatchOp::Equal, "a", "2")]).unwrap(), ["x"]);
    assert!(q.label_values("zzz", &[]).unwrap().is_empty());
}

#[test]
fn wal_replay_rebuilds_the_head_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let before = {
        let (head, _) = Head::open(tmp.path(), wal_opts()).unwrap();
        for batch in 0..20 {
            let mut app = head.appender();
            for s in 0..50 {
                let labels =
                    l(&[("__name__", "metric"), ("series", &s.to_string()), ("batch_parity", &(s % 3).to_string())]);
                for k in 0..5 {
                    let t = (batch * 5 + k) * 15_000;
                    let v = if k == 3 {
                        f64::from_bits(strata_model::STALE_NAN_BITS)
                    } else {
                        (t as f64).sqrt() * s as f64
                    };
                    app.append(&labels, t, v).unwrap();
                }
            }
            app.commit().unwrap();
        }
        head.delete(&[m(MatchOp::Equal, "series", "7")], 0, 100_000).unwrap();
        head.close().unwrap();
        dump(&head)
    };
    let (head, outcome) = Head::open(tmp.path(), wal_opts()).unwrap();
    assert_eq!(outcome.cut, None);
    assert_eq!(dump(&head), before);
    assert_eq!(head.num_series(), 50);
    // The head accepts new appends and new series after replay, with fresh references.
    let mut app = head.appender();
    let r = app.append(&l(&[("__name__", "new")]), 10_000_000, 1.0).unwrap();
    assert_eq!(r, SeriesRef(51));
    app.commit().unwrap();
}

#[test]
fn concurrent_appenders_to_shared_series_replay_identically() {
    let tmp = tempfile::tempdir().unwrap();
    let before = {
        let (head, _) = Head::open(tmp.path(), wal_opts()).unwrap();
        let head = Arc::new(head);
        let threads: Vec<_> = (0..4)
            .map(|th| {
                let head = head.clone();
                std::thread::spawn(move || {
                    for i in 0..200i64 {
                        let mut app = head.appender();
                        for s in 0..10 {
                            // Every thread writes every series: commits race on each one.
                            let _ = app.append(&l(&[("__name__", "shared"), ("s", &s.to_string())]), i * 10 + th, 1.0);
                        }
                        app.commit().unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        head.close().unwrap();
        dump(&head)
    };
    let (head, _) = Head::open(tmp.path(), wal_opts()).unwrap();
    assert_eq!(dump(&head), before);
}

#[test]
fn deleted_samples_are_hidden() {
    let head = Head::in_memory(HeadOptions::default());
    let mut app = head.appender();
    for t in 0..10 {
        app.append(&l(&[("__name__", "x")]), t, t as f64).unwrap();
    }
    app.commit().unwrap();
    assert_eq!(head.delete(&[m(MatchOp::Equal, "__name__", "x")], 3, 5).unwrap(), 1);
    let s = Querier::new(&head, 0, 100).select(&[m(MatchOp::Equal, "__name__", "x")]).unwrap();
    let ts: Vec<i64> = s[0].samples().iter().map(|s| s.t).collect();
    assert_eq!(ts, [0, 1, 2, 6, 7, 8, 9]);
    let mut it = s[0].iter();
    assert_eq!(it.seek(4).map(|s| s.t), Some(6));
}

fn label_set() -> impl Strategy<Value = Vec<(String, String)>> {
    prop::collection::vec(
        (prop::sample::select(vec!["a", "b", "c"]), prop::sample::select(vec!["", "1", "2", "10", "x"])),
        0..3,
    )
    .prop_map(|v| {
        let mut v: Vec<(String, String)> = v.into_iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        v.sort();
        v.dedup_by(|x, y| x.0 == y.0);
        v
    })
}

fn matcher() -> impl Strategy<Value = Matcher> {
    (
        prop::sample::select(vec![MatchOp::Equal, MatchOp::NotEqual, MatchOp::RegexMatch, MatchOp::RegexNoMatch]),
        prop::sample::select(vec!["a", "b", "c", "d"]),
        prop::sample::select(vec!["", "1", "x", "1|2", ".*", ".+", "1.*", "x|", "[12]0?"]),
    )
        .prop_map(|(op, n, v)| m(op, n, v))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Index-based selection agrees with testing every series against every matcher.
    #[test]
    fn select_agrees_with_naive_filter(sets in prop::collection::vec(label_set(), 1..30), ms in prop::collection::vec(matcher(), 1..4)) {
        let head = Head::in_memory(HeadOptions::default());
        let mut app = head.appender();
        let mut all = std::collections::BTreeSet::new();
        for (i, s) in sets.iter().enumerate() {
            let mut pairs = s.clone();
            pairs.push(("__name__".into(), format!("m{}", i % 2)));
            let labels = Labels::from_pairs(pairs);
            if all.insert(labels.clone()) {
                app.append(&labels, 1, 1.0).unwrap();
            }
        }
        app.commit().unwrap();
        let want: Vec<Labels> = all.into_iter().filter(|ls| ms.iter().all(|m| m.matches(ls.get(&m.name).unwrap_or("")))).collect();
        let got: Vec<Labels> = Querier::new(&head, 0, 2).select(&ms).unwrap().into_iter().map(|s| s.labels).collect();
        prop_assert_eq!(got, want);
    }
}

#[test]
fn truncation_forgets_churned_series_and_their_symbols() {
    const RANGE: i64 = 1000;
    let head = Head::in_memory(HeadOptions { chunk_range_ms: RANGE, ..Default::default() });
    let mut peak_symbols = 0;
    for gen in 0..20i64 {
        let mut app = head.appender();
        for t in (gen * RANGE..(gen + 1) * RANGE).step_by(100) {
            app.append(&l(&[("__name__", "up"), ("pod", "stable")]), t, 1.0).unwrap();
            for p in 0..50 {
                app.append(&l(&[("__name__", "up"), ("pod", &format!("g{gen}-p{p}"))]), t, 1.0).unwrap();
            }
        }
        app.commit().unwrap();
        if gen >= 1 {
            let (_, removed) = head.truncate(gen * RANGE, u64::MAX);
            assert_eq!(removed, 50, "generation {}'s pods are gone", gen - 1);
        }
        peak_symbols = peak_symbols.max(head.symbols.capacity());
    }
    assert_eq!(head.num_series(), 51);
    assert!(peak_symbols <= 2 * 51 + 4, "freed symbol ids are reused: {peak_symbols} slots");
    assert_eq!(head.symbols.lookup("g0-p0"), None);
    assert_eq!(head.label_values("pod", &[]).len(), 51);
    let d = dump(&head);
    assert_eq!(d.len(), 51);
    assert!(d.values().all(|s| s.first().unwrap().0 >= 19 * RANGE));
    // Appends before the truncation point are refused; the head stays consistent for new series.
    let mut app = head.appender();
    assert!(matches!(
        app.append(&l(&[("__name__", "up"), ("pod", "late")]), 19 * RANGE - 1, 1.0),
        Err(AppendError::Sample(SampleError::TooOld { .. }))
    ));
    app.append(&l(&[("__name__", "up"), ("pod", "g0-p0")]), 20 * RANGE, 2.0).unwrap();
    app.commit().unwrap();
    let got = Querier::new(&head, 0, i64::MAX).select(&[m(MatchOp::Equal, "pod", "g0-p0")]).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].samples().len(), 1);
}

#[test]
fn append_pairs_finds_the_same_series_as_append() {
    let head = Head::in_memory(HeadOptions::default());
    let mut app = head.appender();
    let r = app.append(&l(&[("__name__", "up"), ("job", "a")]), 10, 1.0).unwrap();
    // Canonical pairs take the no-allocation path and find the series.
    assert_eq!(app.append_pairs(&[("__name__", "up"), ("job", "a")], 20, 2.0).unwrap(), r);
    // Unsorted pairs, or with an empty value (an absent label), are normalized first.
    assert_eq!(app.append_pairs(&[("job", "a"), ("__name__", "up")], 30, 3.0).unwrap(), r);
    assert_eq!(app.append_pairs(&[("__name__", "up"), ("x", ""), ("job", "a")], 40, 4.0).unwrap(), r);
    // A new series through the pairs path is created like any other.
    let r2 = app.append_pairs(&[("__name__", "up"), ("job", "b")], 10, 1.0).unwrap();
    assert_ne!(r2, r);
    assert!(matches!(app.append_pairs(&[("", "x")], 10, 1.0), Err(AppendError::InvalidLabels(_))));
    assert!(matches!(app.append_pairs(&[("a", "1"), ("a", "2")], 10, 1.0), Err(AppendError::InvalidLabels(_))));
    app.commit().unwrap();
    let d = dump(&head);
    assert_eq!(d[&l(&[("__name__", "up"), ("job", "a")])].len(), 4);
    assert_eq!(head.num_series(), 2);
}

#[test]
fn hash_stripes_keep_colliding_series_apart() {
    let symbols = Symbols::default();
    let a = Arc::new(MemSeries::new(SeriesRef(1), symbols.intern_labels(&l(&[("x", "a")]))));
    let b = Arc::new(MemSeries::new(SeriesRef(2), symbols.intern_labels(&l(&[("x", "b")]))));
    let mut stripe = HashStripe::default();
    // Two label sets with one hash: the first inline, the second in the side map.
    stripe.first.insert(7, a.clone());
    stripe.more.entry(7).or_default().push(b.clone());
    let find = |hash: u64, v: &str| {
        let want = l(&[("x", v)]);
        stripe.find(hash, |s| symbols.equals(&s.labels, &want)).map(|s| s.series_ref)
    };
    assert_eq!(find(7, "a"), Some(SeriesRef(1)));
    assert_eq!(find(7, "b"), Some(SeriesRef(2)));
    assert_eq!(find(7, "c"), None);
    assert_eq!(find(8, "a"), None);
}

#[test]
fn consecutive_appends_by_ref_reuse_the_series_and_unknown_refs_still_fail() {
    let head = Head::in_memory(HeadOptions::default());
    let mut app = head.appender();
    let r = app.append(&l(&[("__name__", "up")]), 10, 1.0).unwrap();
    for t in [20, 30, 40] {
        app.append_ref(r, t, 1.0).unwrap();
    }
    assert!(matches!(app.append_ref(r, 35, 1.0), Err(AppendError::Sample(SampleError::OutOfOrder { .. }))));
    assert!(matches!(app.append_ref(SeriesRef(999), 50, 1.0), Err(AppendError::UnknownSeries(_))));
    assert_eq!(app.commit().unwrap().appended, 4);
    assert_eq!(dump(&head)[&l(&[("__name__", "up")])].len(), 4);
}

#[test]
fn a_kept_series_handle_is_refused_once_truncation_removed_the_series() {
    let head = Head::in_memory(HeadOptions::default());
    let up = l(&[("__name__", "up")]);
    let mut app = head.appender();
    let s = app.append_handle(&up, 1_000, 1.0).unwrap();
    app.append_to(&s, 2_000, 2.0).unwrap();
    assert_eq!(app.commit().unwrap().appended, 2);
    let mut app = head.appender();
    app.append_to(&s, 3_000, 3.0).unwrap();
    app.commit().unwrap();
    assert_eq!(dump(&head)[&up].len(), 3);

    // Everything before 10 s is truncated: the series is empty and removed.
    assert_eq!(head.truncate(10_000, u64::MAX).1, 1);
    let mut app = head.appender();
    assert_eq!(app.append_to(&s, 11_000, 4.0), Err(AppendError::UnknownSeries(s.series_ref)));
    // By labels, it is created again and takes the sample.
    let s2 = app.append_handle(&up, 11_000, 4.0).unwrap();
    assert_ne!(s2.series_ref, s.series_ref);
    app.commit().unwrap();
    assert_eq!(dump(&head)[&up].len(), 1);
}

#[test]
fn a_waiting_truncation_is_visible_to_appenders_that_must_not_block() {
    let head = Arc::new(Head::in_memory(HeadOptions::default()));
    assert!(!head.appender_would_wait());
    let app = head.appender();
    // A truncation now waits for this appender's gate; new appenders would queue behind it.
    let h2 = head.clone();
    let truncation = std::thread::spawn(move || h2.truncate(1_000, u64::MAX));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !head.appender_would_wait() {
        assert!(std::time::Instant::now() < deadline, "the truncation never waited");
        std::thread::yield_now();
    }
    drop(app);
    truncation.join().unwrap();
    assert!(!head.appender_would_wait());
}

/// Series ids of `{__name__=~re}` found through the names dictionary, and by testing every
/// series' name (what the index does without a dictionary).
fn by_dictionary_and_by_scan(head: &Head, re: &str) -> (Vec<SeriesRef>, Vec<SeriesRef>) {
    let matcher = m(MatchOp::RegexMatch, "__name__", re);
    let found = postings::expand(head.postings_for(std::slice::from_ref(&matcher)));
    let scanned = postings::expand(postings_for_matchers(&ScanOnly(head), &[matcher]));
    (found, scanned)
}

/// The head's index without its names dictionary.
struct ScanOnly<'a>(&'a Head);

impl IndexReader for ScanOnly<'_> {
    fn postings(&self, name: &str, values: &[&str]) -> BoxPostings {
        HeadIndex(self.0).postings(name, values)
    }
    fn postings_matching(&self, name: &str, prefix: &str, accept: &dyn Fn(&str) -> bool) -> BoxPostings {
        HeadIndex(self.0).postings_matching(name, prefix, accept)
    }
    fn all_postings(&self) -> BoxPostings {
        HeadIndex(self.0).all_postings()
    }
}

#[test]
fn name_regexes_walk_the_dictionary_and_its_delta_and_agree_with_a_scan() {
    let dir = tempfile::tempdir().unwrap();
    let paths = |dc: usize| -> Vec<String> {
        (0..40).map(|h| format!("servers.dc{dc}.host-{h:03}.{}", ["cpu.user", "net.eth0.rx_bytes"][h % 2])).collect()
    };
    {
        let (head, _) = Head::open(dir.path(), wal_opts()).unwrap();
        let mut app = head.appender();
        for p in paths(1) {
            app.append(&l(&[("__name__", &p)]), 1000, 1.0).unwrap();
        }
        app.commit().unwrap();
        head.close().unwrap();
    }
    // Replayed names are in the dictionary; names created after replay in the delta.
    let (head, _) = Head::open(dir.path(), wal_opts()).unwrap();
    let mut app = head.appender();
    for p in paths(2) {
        app.append(&l(&[("__name__", &p), ("x", "y")]), 2000, 2.0).unwrap();
    }
    app.commit().unwrap();
    let names = head.names_stats();
    assert!(names.dictionary_nodes > 40 && names.delta_names == 40, "{names:?}");
    for re in [
        r".*\.net\.eth0\.rx_bytes",
        r"servers\.dc2\.host-0[0-2].*",
        r"servers\.dc[12]\.host-001\.cpu\.user",
        r".*host-03.*",
        "nothing",
    ] {
        let (found, scanned) = by_dictionary_and_by_scan(&head, re);
        assert_eq!(found, scanned, "{re}");
    }
    assert_eq!(by_dictionary_and_by_scan(&head, r".*\.net\.eth0\.rx_bytes").0.len(), 40);
    // A small delta asks for no rebuild; one folds it in and answers the same.
    assert!(!head.maintain_names());
    head.rebuild_names();
    assert_eq!(head.names_stats().delta_names, 0);
    assert_eq!(by_dictionary_and_by_scan(&head, r".*\.net\.eth0\.rx_bytes").0.len(), 40);
    // Truncation removes dc1's series; the next maintenance drops their names, once the
    // pause after the last rebuild is over.
    head.truncate(1500, u64::MAX);
    let before = head.names_stats().dictionary_nodes;
    let later = std::time::Instant::now() + std::time::Duration::from_secs(3600);
    assert!(head.maintain_names_at(later));
    assert!(head.names_stats().dictionary_nodes < before);
    let (found, scanned) = by_dictionary_and_by_scan(&head, r".*\.cpu\.user");
    assert_eq!((found.len(), &found), (20, &scanned));
    assert!(!head.maintain_names_at(later + std::time::Duration::from_secs(3600)), "nothing changed since");
    // Due again, but within the pause after a rebuild: it waits.
    let mut app = head.appender();
    for p in paths(3) {
        app.append(&l(&[("__name__", &p)]), 3000, 3.0).unwrap();
    }
    app.commit().unwrap();
    let during = std::time::Instant::now();
    head.rebuild_names();
    head.truncate(2500, u64::MAX);
    assert!(!head.maintain_names_at(during), "a rebuild before the pause after the last is over waits");
    assert!(head.maintain_names_at(during + std::time::Duration::from_secs(3600)));
}

/// While a rebuild waits, a burst of new names is folded into levels a few thousand names at
/// a time, merged as they grow (a level at least half the one before it joins it): found as
/// before, the delta emptied; the next rebuild takes everything back into one dictionary.
#[test]
fn a_burst_of_names_is_folded_into_levels_while_a_rebuild_waits() {
    let head = Head::in_memory(HeadOptions::default());
    let add = |from: usize, to: usize| {
        let mut app = head.appender();
        for h in from..to {
            for m in ["cpu.user", "net.eth0.rx_bytes"] {
                app.append(&l(&[("__name__", &format!("servers.dc1.host-{h:05}.{m}"))]), 1000, 1.0).unwrap();
            }
        }
        app.commit().unwrap();
    };
    add(0, 20_000);
    let during = std::time::Instant::now();
    head.rebuild_names();
    let main_nodes = head.names_stats().dictionary_nodes;
    let agrees = |head: &Head| {
        for re in
            [r".*\.rx_bytes", r"servers\.dc1\.host-0(39|41)..\..*", r"servers\.dc1\.host-2[0-9]{4}\..*", "nothing"]
        {
            let (found, scanned) = by_dictionary_and_by_scan(head, re);
            assert_eq!(found, scanned, "{re}");
        }
    };
    // Under the fold's threshold: nothing to do.
    add(20_000, 21_000);
    assert!(!head.maintain_names_at(during));
    assert_eq!(head.names_stats().delta_names, 2000);
    // Each fold makes a level; a level at least half the one before it is merged into it.
    let mut dictionaries = Vec::new();
    for round in 0..4 {
        add(21_000 + round * 2100, 21_000 + (round + 1) * 2100);
        assert!(head.maintain_names_at(during), "folded while the rebuild waits");
        let names = head.names_stats();
        assert_eq!(names.delta_names, 0);
        dictionaries.push(names.dictionaries);
        agrees(&head);
    }
    // 6200 names, then 4200 (merged: 10400), 4200 (kept beside it), 4200 (merged into the
    // second, 8400, which then joins the first).
    assert_eq!(dictionaries, [2, 2, 3, 2]);
    let (_, scanned) = by_dictionary_and_by_scan(&head, r".*\.cpu\.user");
    assert_eq!(scanned.len(), 29_400);
    // Past the pause: one dictionary again, with every name.
    assert!(head.maintain_names_at(during + std::time::Duration::from_secs(3600)));
    let names = head.names_stats();
    assert_eq!((names.dictionaries, names.delta_names), (1, 0));
    assert!(names.dictionary_nodes > main_nodes + 18_000, "{names:?}");
    assert_eq!(by_dictionary_and_by_scan(&head, r".*\.cpu\.user").0.len(), 29_400);
    agrees(&head);
}

const WINDOW: OutOfOrder = OutOfOrder { window_ms: 3_600_000, replace: false };
const MINUTE: i64 = 60_000;

fn late_head(rules: OutOfOrder) -> Head {
    Head::in_memory(HeadOptions { out_of_order: rules, ..Default::default() })
}

fn values(head: &Head) -> Vec<(i64, f64)> {
    dump(head).into_values().flatten().map(|(t, b)| (t / MINUTE, f64::from_bits(b))).collect()
}

#[test]
fn late_samples_are_refused_unless_a_window_is_set() {
    let head = late_head(OutOfOrder::OFF);
    let a = l(&[("__name__", "x")]);
    let mut app = head.appender();
    app.append(&a, 30 * MINUTE, 1.0).unwrap();
    app.commit().unwrap();
    let mut app = head.appender();
    assert!(matches!(app.append(&a, 20 * MINUTE, 1.0), Err(AppendError::Sample(SampleError::OutOfOrder { .. }))));
    // A writer may ask for other rules than the head's.
    let mut app = head.appender_with(WINDOW);
    app.append(&a, 20 * MINUTE, 2.0).unwrap();
    app.commit().unwrap();
    assert_eq!(values(&head), [(20, 2.0), (30, 1.0)]);
}

#[test]
fn late_samples_inside_the_window_are_stored_duplicates_refused_under_prometheus_rules() {
    let head = late_head(WINDOW);
    let a = l(&[("__name__", "x")]);
    let mut app = head.appender();
    for t in [50, 60, 70, 100] {
        app.append(&a, t * MINUTE, t as f64).unwrap();
    }
    app.commit().unwrap();
    let mut app = head.appender();
    app.append(&a, 80 * MINUTE, 80.0).unwrap();
    app.append(&a, 75 * MINUTE, 75.0).unwrap();
    // The same value again is a retry; another value at a stored timestamp a duplicate.
    app.append(&a, 100 * MINUTE, 100.0).unwrap();
    app.append(&a, 100 * MINUTE - 60 * MINUTE, 40.0).unwrap();
    assert!(matches!(app.append(&a, 60 * MINUTE, 61.0), Err(AppendError::Sample(SampleError::Duplicate { .. }))));
    assert!(matches!(app.append(&a, 100 * MINUTE, 99.0), Err(AppendError::Sample(SampleError::Duplicate { .. }))));
    // Further back than the window behind the head's newest sample: too old, counted.
    let err = app.append(&a, 100 * MINUTE - 60 * MINUTE - 1, 0.0).unwrap_err();
    assert!(matches!(err, AppendError::Sample(SampleError::TooOld { min_t, .. }) if min_t == 40 * MINUTE), "{err}");
    // A new series may start late too.
    app.append(&l(&[("__name__", "y")]), 60 * MINUTE, 6.0).unwrap();
    // Histograms are only taken in order.
    let h = strata_model::FloatHistogram { count: 1.0, zero_count: 1.0, ..Default::default() };
    let hist = l(&[("__name__", "h")]);
    app.append_histogram(&hist, 100 * MINUTE, h.clone()).unwrap();
    let out = app.commit().unwrap();
    assert_eq!((out.appended, out.rejected), (5, 0));
    let mut app = head.appender();
    assert!(matches!(
        app.append_histogram(&hist, 99 * MINUTE, h),
        Err(AppendError::Sample(SampleError::OutOfOrder { .. }))
    ));
    drop(app);
    let x: Vec<(i64, f64)> = dump(&head)[&a].iter().map(|&(t, b)| (t / MINUTE, f64::from_bits(b))).collect();
    assert_eq!(x, [(40, 40.0), (50, 50.0), (60, 60.0), (70, 70.0), (75, 75.0), (80, 80.0), (100, 100.0)]);
    assert_eq!(head.stats.samples_appended_late.load(Ordering::Relaxed), 3);
    assert_eq!(head.stats.rejected_duplicate.load(Ordering::Relaxed), 2);
    assert_eq!(head.stats.rejected_too_old.load(Ordering::Relaxed), 1);
}

#[test]
fn under_last_write_wins_every_rewrite_replaces_the_value_in_memory_and_after_replay() {
    let rules = OutOfOrder { replace: true, ..WINDOW };
    let tmp = tempfile::tempdir().unwrap();
    let opts = HeadOptions { out_of_order: rules, ..wal_opts() };
    let a = l(&[("__name__", "servers.a.load")]);
    let mut want = BTreeMap::new();
    {
        let (head, _) = Head::open(tmp.path(), opts).unwrap();
        // Shuffled minutes with rewrites, some within one batch, over several commits.
        let mut order: Vec<i64> = (0..60).chain((0..60).step_by(7)).chain([59, 59, 0]).collect();
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        rand::seq::SliceRandom::shuffle(&mut order[..], &mut rng);
        for (i, batch) in order.chunks(9).enumerate() {
            let mut app = head.appender();
            for (j, &m) in batch.iter().enumerate() {
                let v = (i * 100 + j) as f64;
                app.append(&a, m * MINUTE, v).unwrap();
                want.insert(m, v);
            }
            assert_eq!(app.commit().unwrap().rejected, 0);
        }
        let want: Vec<(i64, f64)> = want.iter().map(|(&m, &v)| (m, v)).collect();
        assert_eq!(values(&head), want);
        head.close().unwrap();
    }
    let (head, _) = Head::open(tmp.path(), opts).unwrap();
    let want: Vec<(i64, f64)> = want.into_iter().collect();
    assert_eq!(values(&head), want, "after replay");
}

#[test]
fn a_late_sample_written_while_its_range_is_cut_stays_in_the_head_and_the_wal() {
    const RANGE: i64 = BLOCK_RANGE_MS_DEFAULT;
    let tmp = tempfile::tempdir().unwrap();
    let opts = HeadOptions { out_of_order: OutOfOrder { window_ms: 10 * RANGE, replace: true }, ..wal_opts() };
    let a = l(&[("__name__", "x")]);
    let (head, _) = Head::open(tmp.path(), opts).unwrap();
    let mut app = head.appender();
    for t in (0..3 * RANGE).step_by(MINUTE as usize) {
        app.append(&a, t, 1.0).unwrap();
    }
    app.commit().unwrap();
    let (epoch, segment) = head.begin_cut().unwrap();
    // After the cut began: in its range, but not written by it.
    let mut app = head.appender();
    app.append(&a, MINUTE, 2.0).unwrap();
    app.commit().unwrap();
    let fs = crate::vfs::OsFs::shared();
    let blocks = tempfile::tempdir().unwrap();
    let cut = crate::compact::HeadCut { seq: 1, max_epoch: epoch };
    let meta = crate::compact::write_head_block(&fs, &head, blocks.path(), 0, RANGE, cut).unwrap().unwrap();
    assert_eq!(meta.stats.num_samples, (RANGE / MINUTE) as u64);
    head.truncate(RANGE, epoch);
    head.wal().unwrap().checkpoint(segment.unwrap() - 1, |r| head.series(r).map(|_| i64::MIN), RANGE).unwrap();
    let in_head = |head: &Head| Querier::new(head, 0, RANGE - 1).select(&[m(MatchOp::Equal, "__name__", "x")]).unwrap();
    assert_eq!(in_head(&head)[0].samples(), [strata_model::Sample { t: MINUTE, v: 2.0 }]);
    head.close().unwrap();
    drop(head);
    let (head, _) = Head::open(tmp.path(), opts).unwrap();
    let replayed = in_head(&head)[0].samples();
    assert!(replayed.contains(&strata_model::Sample { t: MINUTE, v: 2.0 }), "{replayed:?}");
}

#[test]
fn the_window_counts_from_the_newest_sample_of_the_batch_too() {
    let head = late_head(WINDOW);
    let a = l(&[("__name__", "x")]);
    let mut app = head.appender();
    app.append(&a, 1000 * MINUTE, 1.0).unwrap();
    // The head was empty when the batch began; its first sample still sets the window.
    let err = app.append(&a, 1000 * MINUTE - 61 * MINUTE, 2.0).unwrap_err();
    assert!(matches!(err, AppendError::Sample(SampleError::TooOld { .. })), "{err}");
    app.append(&a, 1000 * MINUTE - 59 * MINUTE, 3.0).unwrap();
    assert_eq!(app.commit().unwrap().appended, 2);
}

#[test]
fn exemplars_are_logged_and_replayed_with_the_rules_kept() {
    use super::exemplars::{Exemplar, ExemplarError};
    let tmp = tempfile::tempdir().unwrap();
    let ex = |t: i64, trace: &str| Exemplar { labels: l(&[("trace_id", trace)]), t, v: t as f64 / 1000.0 };
    let before = {
        let (head, _) = Head::open(tmp.path(), wal_opts()).unwrap();
        let mut app = head.appender();
        let a = app.append(&l(&[("__name__", "req_seconds_bucket"), ("le", "0.5")]), 1_000, 3.0).unwrap();
        let b = app.append(&l(&[("__name__", "req_seconds_bucket"), ("le", "1")]), 1_000, 4.0).unwrap();
        app.append_exemplar(a, ex(900, "a1")).unwrap();
        app.append_exemplar(b, ex(950, "b1")).unwrap();
        // A retry of the same exemplar is taken quietly; an older one is refused.
        app.append_exemplar(a, ex(900, "a1")).unwrap();
        let e = app.append_exemplar(a, ex(800, "a0")).unwrap_err();
        assert_eq!(e, AppendError::Exemplar(ExemplarError::OutOfOrder { t: 800, newest: 900 }));
        let out = app.commit().unwrap();
        assert_eq!(out.exemplars_appended, 2);
        let mut app = head.appender();
        app.append_ref(a, 2_000, 5.0).unwrap();
        app.append_exemplar(a, ex(1_900, "a2")).unwrap();
        // Against the stored newest now.
        assert!(app.append_exemplar(b, ex(950, "b0")).is_err());
        app.commit().unwrap();
        head.close().unwrap();
        head.exemplars.select(i64::MIN, i64::MAX, |_| true)
    };
    assert_eq!(before.len(), 2);
    assert_eq!(before[0].1.iter().map(|e| e.t).collect::<Vec<_>>(), [900, 1_900], "{before:?}");
    let (head, _) = Head::open(tmp.path(), wal_opts()).unwrap();
    assert_eq!(head.exemplars.select(i64::MIN, i64::MAX, |_| true), before);
    let le1 = head.exemplars.select(0, 1_000, |s| s.get("le") == Some("1"));
    assert_eq!(le1.len(), 1);
    assert_eq!(le1[0].1[0].labels.get("trace_id"), Some("b1"));
}

#[test]
fn memory_recent_walks_again_only_past_its_age() {
    let head = Head::in_memory(HeadOptions::default());
    let mut app = head.appender();
    app.append(&l(&[("__name__", "a")]), 1000, 1.0).unwrap();
    app.commit().unwrap();
    let first = head.memory_recent(Duration::from_secs(3600));
    assert_eq!(first, head.memory());
    let mut app = head.appender();
    for i in 0..100 {
        app.append(&l(&[("__name__", "b"), ("i", &i.to_string())]), 1000, 1.0).unwrap();
    }
    app.commit().unwrap();
    let now = head.memory();
    assert!(now.series > first.series, "the new series are counted by a walk");
    // Within its age the last walk is answered; past it (here: any age) the head is walked.
    assert_eq!(head.memory_recent(Duration::from_secs(3600)), first);
    assert_eq!(head.memory_recent(Duration::ZERO), now);
    assert_eq!(head.memory_recent(Duration::from_secs(3600)), now);
}

#[test]
fn the_head_says_which_ranges_it_may_hold_samples_in_and_selections_skip_the_others() {
    let head = late_head(WINDOW);
    assert!(!head.may_hold_samples_in(0, i64::MAX), "an empty head holds nothing");
    let a = l(&[("__name__", "x")]);
    let mut app = head.appender();
    for t in 100..=200 {
        app.append(&a, t * MINUTE, t as f64).unwrap();
    }
    app.commit().unwrap();
    let selected = |mint: i64, maxt: i64| {
        let q = Querier::new(&head, mint * MINUTE, maxt * MINUTE);
        q.select(&[m(MatchOp::Equal, "__name__", "x")]).unwrap().iter().map(|s| s.samples().len()).sum::<usize>()
    };
    let may = |mint: i64, maxt: i64| head.may_hold_samples_in(mint * MINUTE, maxt * MINUTE);
    assert_eq!((may(0, 99), may(0, 100), may(200, 300), may(201, 300)), (false, true, true, false));
    assert_eq!((selected(0, 99), selected(0, 100), selected(200, 300), selected(201, 300)), (0, 1, 1, 0));
    // Truncated at 150: whole chunks go, so the head keeps from the start of the chunk that
    // holds 150 on.
    head.truncate(150 * MINUTE, u64::MAX);
    let kept_from = head.time_range().expect("samples remain").0 / MINUTE;
    assert!((101..=150).contains(&kept_from), "kept from {kept_from}");
    assert_eq!((may(0, kept_from - 1), may(0, kept_from)), (false, true));
    assert_eq!((selected(0, kept_from - 1), selected(140, 155)), (0, 16));
    // A late sample inside the window, above the truncation: seen by the range that holds it.
    let mut app = head.appender();
    app.append(&l(&[("__name__", "x"), ("late", "yes")]), 152 * MINUTE, 1.0).unwrap();
    app.commit().unwrap();
    assert!(may(151, 152));
    assert_eq!(selected(151, 152), 3);
}

proptest! {
    /// Reads of recent windows go through the open chunks' cuts (`SeriesState::move_cut`): what
    /// every read returns is the series' samples in its range, whether the cut moved for it,
    /// was moved past its start by an earlier read, or the chunk grew or was closed since.
    #[test]
    fn reads_through_open_chunk_cuts_return_the_samples_in_range(
        ops in prop::collection::vec(prop_oneof![
            2 => (1usize..60).prop_map(Err),
            4 => (0i64..30, 0i64..60).prop_map(Ok),
            1 => (0i64..400, 0i64..400).prop_map(Ok),
        ], 1..40),
        values in prop::collection::vec((0u8..4, any::<u32>()), 64),
    ) {
        let head = Head::in_memory(HeadOptions::default());
        let labels = l(&[("__name__", "x")]);
        let mut model: Vec<strata_model::Sample> = Vec::new();
        let (mut t, mut v, mut k) = (1_000_000i64, 0.0, 0usize);
        for op in ops {
            match op {
                Err(n) => {
                    let mut app = head.appender();
                    for _ in 0..n {
                        // A 10 s scrape, jittered now and then; values repeating in stretches.
                        let (kind, r) = values[k % values.len()];
                        k += 1;
                        t += if kind == 3 { 9_000 + (r % 2_000) as i64 } else { 10_000 };
                        if kind == 0 {
                            v = (r % 1000) as f64 / 8.0;
                        }
                        app.append(&labels, t, v).unwrap();
                        model.push(strata_model::Sample::new(t, v));
                    }
                    app.commit().unwrap();
                }
                Ok((back, len)) => {
                    // A window ending `back` scrapes before the newest sample, `len` long.
                    let maxt = t - back * 10_000 + 5_000;
                    let mint = maxt - len * 10_000;
                    let got = Querier::new(&head, mint, maxt).select(&[m(MatchOp::Equal, "__name__", "x")]).unwrap();
                    let want: Vec<strata_model::Sample> = model.iter().copied().filter(|s| s.t >= mint && s.t <= maxt).collect();
                    let (samples, floats) = match got.first() {
                        Some(s) => {
                            let mut floats = Vec::new();
                            prop_assert!(s.read_floats(&mut floats).unwrap());
                            (s.samples(), floats)
                        }
                        None => (Vec::new(), Vec::new()),
                    };
                    prop_assert_eq!(&samples, &want);
                    prop_assert_eq!(&floats, &want);
                }
            }
        }
    }
}

/// A window moving along a long open chunk reads it from a cut that follows the window: the
/// chunk handed out starts at most a cut's move (`CUT_MIN_SKIP` samples, about) before the
/// window, not at the chunk's start.
#[test]
fn a_moving_window_reads_the_open_chunk_from_its_cut() {
    let head = Head::in_memory(HeadOptions::default());
    let labels = l(&[("__name__", "x")]);
    let series_at = |t: i64| {
        let mut app = head.appender();
        app.append(&labels, t, (t / 1000) as f64).unwrap();
        app.commit().unwrap();
    };
    for i in 0..60 {
        series_at(i * 10_000);
    }
    for step in 0..40 {
        let t = (60 + step) * 10_000;
        series_at(t);
        // Five minutes back: 30 samples of a chunk of 61 and more.
        let (mint, maxt) = (t - 300_000 + 1, t);
        let got = Querier::new(&head, mint, maxt).select(&[m(MatchOp::Equal, "__name__", "x")]).unwrap();
        assert_eq!(got[0].samples().len(), 30);
        let first = got[0].chunks[0].mint;
        assert!(
            first < mint && first >= mint - 20 * 10_000,
            "step {step}: the chunk handed out starts at {first}, the window at {mint}"
        );
        assert_eq!(head.find_series(&labels).unwrap().lock().open_cut_t(), Some(first));
    }
}
