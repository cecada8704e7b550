use super::*;
use crate::record::{encode_samples, encode_series, RefSample};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::io::{Seek, SeekFrom};
use strata_model::Labels;

fn opts() -> WalOptions {
    WalOptions { segment_bytes: SEGMENT_BYTES_DEFAULT, fsync: FsyncPolicy::Always, compression: true, progress: None }
}

/// `opts()` without compression: frames at offsets a test can compute.
fn opts_plain() -> WalOptions {
    WalOptions { compression: false, ..opts() }
}

/// Opens the WAL in `dir` and returns it with every replayed record.
fn open_collect(dir: &Path, o: WalOptions) -> (Arc<Wal>, Vec<Vec<u8>>, ReplayOutcome) {
    let mut got = Vec::new();
    let (wal, outcome) = Wal::open(dir, o, |r| {
        got.push(r.to_vec());
        Ok(())
    })
    .unwrap();
    (wal, got, outcome)
}

fn rec(i: u8, len: usize) -> Vec<u8> {
    let mut v = vec![i; len];
    v[0] = 2; // a samples record type byte; content is opaque to the WAL
    v
}

/// Segment 0 holding three records; returns their offsets and lengths.
fn three_records(dir: &Path) -> Vec<Vec<u8>> {
    let recs = vec![rec(1, 10), rec(2, 300), rec(3, 40)];
    let (wal, got, _) = open_collect(dir, opts_plain());
    assert!(got.is_empty());
    for r in &recs {
        wal.commit(&[r]).unwrap();
    }
    wal.close().unwrap();
    recs
}

fn modify(path: &Path, f: impl FnOnce(&mut File, u64)) {
    let mut file = OpenOptions::new().read(true).write(true).open(path).unwrap();
    let len = file.metadata().unwrap().len();
    f(&mut file, len);
}

fn write_at(f: &mut File, off: u64, bytes: &[u8]) {
    f.seek(SeekFrom::Start(off)).unwrap();
    f.write_all(bytes).unwrap();
}

/// Offsets of the frames of `three_records` in segment 0 (each body an encoding byte and the
/// record).
const R1: u64 = SEGMENT_HEADER_BYTES;
const R2: u64 = R1 + 8 + 1 + 10;
const R3: u64 = R2 + 8 + 1 + 300;
const END: u64 = R3 + 8 + 1 + 40;

struct Case {
    name: &'static str,
    damage: fn(&mut File, u64),
    survivors: usize,
    cut_at: Option<u64>,
}

/// Each named corruption, and exactly what must survive it.
const CASES: &[Case] = &[
    Case { name: "intact", damage: |_, _| {}, survivors: 3, cut_at: None },
    Case { name: "torn tail", damage: |f, len| f.set_len(len - 3).unwrap(), survivors: 2, cut_at: Some(R3) },
    Case { name: "torn frame header", damage: |f, _| f.set_len(R3 + 5).unwrap(), survivors: 2, cut_at: Some(R3) },
    Case {
        name: "bad crc in middle record",
        damage: |f, _| write_at(f, R2 + 8 + 100, &[0xee]),
        survivors: 1,
        cut_at: Some(R2),
    },
    Case {
        name: "bad length",
        damage: |f, _| write_at(f, R3, &[0xff, 0xff, 0xff, 0x7f]),
        survivors: 2,
        cut_at: Some(R3),
    },
    Case {
        name: "length off by one",
        damage: |f, _| write_at(f, R2, &302u32.to_le_bytes()),
        survivors: 1,
        cut_at: Some(R2),
    },
    Case { name: "zero-filled tail", damage: |f, len| write_at(f, len, &[0u8; 4096]), survivors: 3, cut_at: Some(END) },
    Case {
        name: "garbage tail",
        damage: |f, len| write_at(f, len, b"garbage!garbage!"),
        survivors: 3,
        cut_at: Some(END),
    },
    Case { name: "bad magic", damage: |f, _| write_at(f, 0, b"XXXX"), survivors: 0, cut_at: Some(0) },
    Case { name: "truncated to half a header", damage: |f, _| f.set_len(4).unwrap(), survivors: 0, cut_at: Some(0) },
];

#[test]
fn corruption_cases() {
    for case in CASES {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let recs = three_records(dir);
        // A newer, intact segment after the damaged one must be dropped with the cut.
        std::fs::write(segment_path(dir, 1), segment_header(false)).unwrap();
        modify(&segment_path(dir, 0), case.damage);

        let (wal, got, outcome) = open_collect(dir, opts());
        assert_eq!(got, recs[..case.survivors].to_vec(), "case {:?}", case.name);
        assert_eq!(outcome.cut.as_ref().map(|c| c.1), case.cut_at, "case {:?}", case.name);
        if case.cut_at.is_none() {
            assert_eq!(outcome.segments_read, 2, "case {:?}", case.name);
        } else {
            assert_eq!(outcome.cut.as_ref().unwrap().0, 0, "case {:?}", case.name);
        }

        // The log accepts new records after the repair, and they replay after the survivors.
        let extra = rec(9, 20);
        wal.commit(&[&extra]).unwrap();
        wal.close().unwrap();
        drop(wal);
        let (_, again, outcome) = open_collect(dir, opts());
        let mut want = recs[..case.survivors].to_vec();
        want.push(extra);
        assert_eq!(again, want, "case {:?} after reopen", case.name);
        assert_eq!(outcome.cut, None, "case {:?}: a repaired log reopens clean", case.name);
    }
}

#[test]
fn segments_roll_at_the_size_limit_and_replay_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let o = WalOptions {
        segment_bytes: 1000,
        fsync: FsyncPolicy::Interval(Duration::from_millis(5)),
        compression: true,
        progress: None,
    };
    let (wal, _, _) = open_collect(tmp.path(), o);
    let recs: Vec<Vec<u8>> = (0..50u8).map(|i| rec(i, 100 + i as usize)).collect();
    for r in &recs {
        wal.commit(&[r]).unwrap();
    }
    assert!(wal.current_segment() > 5, "expected several segments, at {}", wal.current_segment());
    for s in list_segments(&OsFs, tmp.path()).unwrap() {
        let len = std::fs::metadata(segment_path(tmp.path(), s)).unwrap().len();
        assert!(len <= 1000, "segment {s} is {len} bytes");
    }
    wal.close().unwrap();
    drop(wal);
    let (_, got, outcome) = open_collect(tmp.path(), o);
    assert_eq!(got, recs);
    assert_eq!(outcome.cut, None);
}

#[test]
fn oversized_records_are_refused_not_written() {
    let tmp = tempfile::tempdir().unwrap();
    let (wal, _, _) = open_collect(tmp.path(), opts());
    let huge = vec![2u8; segment::RECORD_BYTES_MAX as usize + 1];
    assert!(matches!(wal.commit(&[&huge]), Err(Error::RecordTooLarge { .. })));
    assert!(matches!(wal.buffer(&huge), Err(Error::RecordTooLarge { .. })));
    wal.commit(&[&rec(1, 10)]).unwrap();
    drop(wal);
    let (_, got, _) = open_collect(tmp.path(), opts());
    assert_eq!(got, vec![rec(1, 10)]);
}

#[test]
fn buffered_entries_go_out_as_few_records_ahead_of_the_next_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let (wal, _, _) = open_collect(tmp.path(), opts());
    // 3,000 new series, logged one at a time as the head creates them, then a commit using them;
    // a record of another kind ends the batch, and a later series starts a new one.
    let mut entries = Vec::new();
    for r in 1..=3000u64 {
        let mut e = Vec::new();
        crate::record::encode_series_entry(
            SeriesRef(r),
            &Labels::from_pairs([("__name__", &*format!("servers.host-{r:05}.cpu"))]),
            &mut e,
        );
        wal.buffer_entry(1, &e).unwrap();
        entries.push(e);
    }
    wal.buffer(&[3]).unwrap();
    let mut last = Vec::new();
    crate::record::encode_series_entry(SeriesRef(3001), &Labels::from_pairs([("__name__", "x")]), &mut last);
    wal.buffer_entry(1, &last).unwrap();
    assert_eq!(wal.stats.bytes_written.load(Ordering::Relaxed), 0, "nothing written before a commit");
    wal.commit(&[&samples_rec(&[(1, 10), (3000, 10)])]).unwrap();
    let written = wal.stats.bytes_written.load(Ordering::Relaxed);
    drop(wal);
    let (_, got, _) = open_collect(tmp.path(), opts());
    // Every entry, in order, in records of at most BATCH_RECORD_BYTES and an entry; then the
    // other record, the late series, the commit.
    let n = got.len();
    assert!((2..=3).contains(&(n - 3)), "{n} records");
    let series: Vec<u8> = got[..n - 3]
        .iter()
        .flat_map(|r| {
            assert_eq!(r[0], 1);
            assert!(r.len() < BATCH_RECORD_BYTES + 100);
            r[1..].to_vec()
        })
        .collect();
    assert_eq!(series, entries.concat());
    assert_eq!(got[n - 3], vec![3]);
    assert_eq!(got[n - 2], [&[1u8][..], &last].concat());
    assert_eq!(got[n - 1], samples_rec(&[(1, 10), (3000, 10)]));
    // Compressed together, similar paths take a fraction of their bytes.
    assert!(written * 3 < series.len() as u64, "{written} bytes written for {} of entries", series.len());
}

#[test]
fn a_missing_segment_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let o = WalOptions { segment_bytes: 200, fsync: FsyncPolicy::Always, compression: true, progress: None };
    let (wal, _, _) = open_collect(tmp.path(), o);
    for i in 0..10 {
        wal.commit(&[&rec(i, 150)]).unwrap();
    }
    drop(wal);
    std::fs::remove_file(segment_path(tmp.path(), 3)).unwrap();
    let err = Wal::open(tmp.path(), o, |_| Ok(())).unwrap_err();
    assert!(matches!(err, Error::WalSegmentGap { before: 2, after: 4, .. }), "{err}");
}

#[test]
fn group_commit_acknowledges_every_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let (wal, _, _) = open_collect(tmp.path(), opts());
    let threads: Vec<_> = (0..4u8)
        .map(|t| {
            let wal = wal.clone();
            std::thread::spawn(move || {
                for i in 0..100u8 {
                    wal.commit(&[&[2, t, i]]).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // How many commits share an fsync depends on timing, so only durability is asserted here:
    // `Always` did fsync, and every commit replays, in each thread's order.
    assert!(wal.stats.fsyncs.load(Ordering::Relaxed) >= 1, "the Always policy fsyncs");
    drop(wal);
    let (_, got, _) = open_collect(tmp.path(), opts());
    assert_eq!(got.len(), 400);
    for t in 0..4u8 {
        let mine: Vec<u8> = got.iter().filter(|r| r[1] == t).map(|r| r[2]).collect();
        assert_eq!(mine, (0..100).collect::<Vec<u8>>(), "thread {t}'s commits in order");
    }
}

fn series_rec(r: u64, name: &str) -> Vec<u8> {
    let mut b = Vec::new();
    encode_series([(SeriesRef(r), &Labels::from_pairs([("__name__", name)]))], &mut b);
    b
}

fn samples_rec(s: &[(u64, i64)]) -> Vec<u8> {
    let mut b = Vec::new();
    let v: Vec<RefSample> = s.iter().map(|&(r, t)| RefSample { series: SeriesRef(r), t, st: 0, v: t as f64 }).collect();
    encode_samples(&v, &mut b);
    b
}

#[test]
fn checkpoint_keeps_live_series_and_recent_samples() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (wal, _, _) = open_collect(dir, opts());
    wal.commit(&[&series_rec(1, "a"), &series_rec(2, "b")]).unwrap();
    wal.commit(&[&samples_rec(&[(1, 10), (2, 10), (1, 20), (2, 20)])]).unwrap();
    let s0 = wal.current_segment();
    wal.roll().unwrap();
    wal.commit(&[&series_rec(3, "c"), &samples_rec(&[(1, 30), (3, 30)])]).unwrap();
    let last = wal.current_segment();
    wal.roll().unwrap();
    wal.commit(&[&samples_rec(&[(1, 40)])]).unwrap();

    // Drop series 2; keep samples from t=20 on.
    let stats = wal.checkpoint(last, |r| (r != SeriesRef(2)).then_some(i64::MIN), 20).unwrap();
    assert_eq!((stats.series_kept, stats.series_dropped), (2, 1));
    assert_eq!((stats.samples_kept, stats.samples_dropped), (3, 3));
    assert!(!segment_path(dir, s0).exists() && !segment_path(dir, last).exists());
    assert!(dir.join(checkpoint_name(last)).is_dir());
    wal.close().unwrap();
    drop(wal);

    let mut series = Vec::new();
    let mut samples = Vec::new();
    let (_, outcome) = Wal::open(dir, opts(), |r| {
        match crate::record::decode(r)? {
            crate::record::Record::Series(v) => series.extend(v.into_iter().map(|s| s.series.0)),
            crate::record::Record::Samples(v) => samples.extend(v.into_iter().map(|s| (s.series.0, s.t))),
            crate::record::Record::Tombstones(_)
            | crate::record::Record::Histograms(_)
            | crate::record::Record::OutOfOrderSamples(_)
            | crate::record::Record::Exemplars(_) => {}
        }
        Ok(())
    })
    .unwrap();
    assert_eq!(outcome.checkpoint, Some(last));
    assert_eq!(series, vec![1, 3]);
    assert_eq!(samples, vec![(1, 20), (1, 30), (3, 30), (1, 40)]);

    // A leftover temporary checkpoint (crash while writing one) is removed on open.
    std::fs::create_dir(dir.join(format!("{}.tmp", checkpoint_name(99)))).unwrap();
    let (_, _, _) = open_collect(dir, opts());
    assert!(!dir.join(format!("{}.tmp", checkpoint_name(99))).exists());
}

mod garbage {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Whatever bytes a segment holds, replay keeps a valid prefix and never panics; a second
        /// open finds the log clean.
        #[test]
        fn replay_of_arbitrary_segment_bytes(
            good in prop::collection::vec((prop::collection::vec(any::<u8>(), 1..50), 0usize..600), 0..5),
            compression in any::<bool>(),
            tail in prop::collection::vec(any::<u8>(), 0..200),
        ) {
            let tmp = tempfile::tempdir().unwrap();
            let mut bytes = segment_header(compression).to_vec();
            // Each record some random bytes and a run of zeros: long ones are compressed.
            let good: Vec<Vec<u8>> = good.into_iter().map(|(mut r, zeros)| { r.resize(r.len() + zeros, 0); r }).collect();
            for r in &good {
                frame_record(r, compression, &mut bytes);
            }
            bytes.extend_from_slice(&tail);
            std::fs::write(segment_path(tmp.path(), 0), &bytes).unwrap();
            let (wal, got, _) = open_collect(tmp.path(), opts());
            prop_assert!(got.len() >= good.len(), "a valid prefix of {} records is kept, got {}", good.len(), got.len());
            prop_assert_eq!(&got[..good.len()], &good[..]);
            drop(wal);
            let (_, again, outcome) = open_collect(tmp.path(), opts());
            prop_assert_eq!(again, got);
            prop_assert_eq!(outcome.cut, None);
        }
    }
}

/// Compressed frames read back as the records written, across segments and a checkpoint, and
/// take a fraction of the bytes.
#[test]
fn compressed_records_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let labels = Labels::from_pairs([("__name__", "up"), ("job", "node")]);
    let mut series = Vec::new();
    encode_series([(SeriesRef(1), &labels)], &mut series);
    let samples: Vec<RefSample> =
        (0..2000).map(|i| RefSample { series: SeriesRef(1), t: 1000 + i * 15_000, st: 0, v: (i % 7) as f64 }).collect();
    let mut body = Vec::new();
    encode_samples(&samples, &mut body);
    let (wal, _, _) = open_collect(tmp.path(), WalOptions { segment_bytes: 20_000, ..opts() });
    wal.commit(&[&series]).unwrap();
    for _ in 0..20 {
        wal.commit(&[&body]).unwrap();
    }
    let written = wal.stats.bytes_written.load(Ordering::Relaxed);
    assert!(written < 20 * body.len() as u64 / 2, "{written} bytes for {} of records", 20 * body.len());
    wal.close().unwrap();
    drop(wal);
    let (wal, got, outcome) = open_collect(tmp.path(), opts());
    assert_eq!(outcome.cut, None);
    assert_eq!(got.len(), 21);
    assert!(got[1..].iter().all(|r| *r == body));
    // Through a checkpoint, compressed too.
    let last = wal.roll().unwrap() - 1;
    wal.checkpoint(last, |_| Some(i64::MIN), i64::MIN).unwrap();
    drop(wal);
    let (_, again, _) = open_collect(tmp.path(), opts());
    assert_eq!(decode_all(&again), decode_all(&got));
}

fn decode_all(records: &[Vec<u8>]) -> Vec<RefSample> {
    let mut out = Vec::new();
    for r in records {
        if let Ok(crate::record::Record::Samples(s)) = crate::record::decode(r) {
            out.extend(s);
        }
    }
    out
}

/// Segments written before compression (version 1: no encoding byte) are still read, and a log
/// that holds both kinds replays in order.
#[test]
fn version_1_segments_are_still_read() {
    let tmp = tempfile::tempdir().unwrap();
    let records = [rec(1, 10), rec(2, 3000), rec(3, 40)];
    let mut bytes = segment::segment_header_v1().to_vec();
    for r in &records {
        segment::frame_record_v1(r, &mut bytes);
    }
    std::fs::write(segment_path(tmp.path(), 0), &bytes).unwrap();
    let (wal, got, outcome) = open_collect(tmp.path(), opts());
    assert_eq!((got, outcome.cut), (records.to_vec(), None));
    wal.commit(&[&rec(4, 5000)]).unwrap();
    wal.close().unwrap();
    drop(wal);
    let (_, got, _) = open_collect(tmp.path(), opts());
    assert_eq!(got.len(), 4);
    assert_eq!(got[3], rec(4, 5000));
}

/// A frame whose checksum holds but whose compressed record does not decode, or whose encoding
/// byte is unknown, ends the log there like any damaged frame.
#[test]
fn undecodable_frames_are_cut() {
    for (encoding, payload) in [(1u8, b"not zstd at all".to_vec()), (7u8, vec![2, 0, 0])] {
        let tmp = tempfile::tempdir().unwrap();
        let mut bytes = segment_header(true).to_vec();
        frame_record(&rec(1, 10), true, &mut bytes);
        let cut_at = bytes.len() as u64;
        let mut body = vec![encoding];
        body.extend_from_slice(&payload);
        let len = (body.len() as u32).to_le_bytes();
        let crc = crc32c::crc32c_append(crc32c::crc32c(&len), &body);
        bytes.extend_from_slice(&len);
        bytes.extend_from_slice(&crc.to_le_bytes());
        bytes.extend_from_slice(&body);
        std::fs::write(segment_path(tmp.path(), 0), &bytes).unwrap();
        let (_, got, outcome) = open_collect(tmp.path(), opts());
        assert_eq!(got, vec![rec(1, 10)], "encoding {encoding}");
        assert_eq!(outcome.cut.map(|c| c.1), Some(cut_at), "encoding {encoding}");
    }
}

#[test]
fn replay_reports_its_progress_segment_by_segment() {
    let tmp = tempfile::tempdir().unwrap();
    let o = WalOptions { segment_bytes: 200, fsync: FsyncPolicy::Always, compression: false, progress: None };
    let (wal, _, _) = open_collect(tmp.path(), o);
    for i in 0..10 {
        wal.commit(&[&rec(i, 150)]).unwrap();
    }
    drop(wal);
    let progress: &'static ReplayProgress = Box::leak(Box::default());
    let mut seen = Vec::new();
    let (_, outcome) = Wal::open(tmp.path(), WalOptions { progress: Some(progress), ..o }, |_| {
        seen.push(progress.snapshot());
        Ok(())
    })
    .unwrap();
    let last = outcome.next_segment - 1;
    assert!(last >= 5, "{outcome:?}");
    // While a record is applied: the range is known, the segment is in it, replay is not done.
    assert!(
        seen.iter().all(|&(first, l, current, done)| first == 0 && l == last && current <= last && !done),
        "{seen:?}"
    );
    assert!(seen.windows(2).all(|w| w[0].2 <= w[1].2), "current never goes back: {seen:?}");
    assert_eq!(seen.last().unwrap().2, seen.iter().map(|s| s.2).max().unwrap());
    assert!(progress.snapshot().3, "done at the end");
}
