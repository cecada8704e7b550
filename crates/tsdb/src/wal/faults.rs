//! The log on a failing disk (`vfs::sim`): a seeded random run of commits, segment rolls,
//! checkpoints, disk-full spells and crashes, checked after every crash against a model of
//! what was acknowledged. What must hold, whatever the faults:
//! - a commit that returned `Ok` (under `Always`; under `Interval`, once a later `sync_all`
//!   returned `Ok`) is replayed after any crash, unless a checkpoint dropped it by its time;
//! - nothing is replayed twice, nothing that was never committed is replayed, and records come
//!   back in commit order;
//! - every fault reaches the caller as an error, and once the faults stop the log works again
//!   by itself, without a restart.
//!
//! Each sample's timestamp is its identity. `STRATA_FAULT_SEEDS=N` runs N seeds (default 300).

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use super::*;
use crate::record::{self, Record, RefSample};
use crate::vfs::sim::{FaultRates, SimFs};

const SERIES: SeriesRef = SeriesRef(1);

struct Run {
    fs: SimFs,
    dir: &'static Path,
    policy: FsyncPolicy,
    /// Samples acknowledged durable.
    acked: BTreeSet<i64>,
    /// Samples whose commit returned `Ok` under `Interval`, not yet followed by a good sync.
    unsynced: BTreeSet<i64>,
    /// Samples whose commit failed and no commit succeeded since: may or may not come back
    /// (at most once).
    maybe: BTreeSet<i64>,
    /// Samples below this may have been dropped by a checkpoint.
    floor: i64,
    next: i64,
    log: Vec<String>,
}

impl Run {
    fn open(&mut self) -> Arc<Wal> {
        // Replay may meet read faults: each is an error, and opening again must work.
        for attempt in 0.. {
            let mut got: Vec<i64> = Vec::new();
            let opened = Wal::open_on(
                Arc::new(self.fs.clone()),
                self.dir,
                WalOptions { segment_bytes: 600, fsync: self.policy, compression: true, progress: None },
                |body| {
                    if let Record::Samples(v) = record::decode(body)? {
                        got.extend(v.iter().map(|s| s.t));
                    }
                    Ok(())
                },
            );
            match opened {
                Ok((wal, outcome)) => {
                    self.log.push(format!("opened: {outcome:?}"));
                    self.check(&got);
                    return wal;
                }
                Err(e) => {
                    self.log.push(format!("open failed: {e}"));
                    assert!(attempt < 1000, "the log never opened again: {e}\n{}", self.log.join("\n"));
                }
            }
        }
        unreachable!()
    }

    fn check(&mut self, got: &[i64]) {
        let ctx = || self.log.join("\n");
        for w in got.windows(2) {
            assert!(w[0] < w[1], "replayed {} after {}: out of order or twice\n{}", w[1], w[0], ctx());
        }
        let got_set: BTreeSet<i64> = got.iter().copied().collect();
        for &t in &got_set {
            let committed = self.acked.contains(&t) || self.unsynced.contains(&t) || self.maybe.contains(&t);
            assert!(committed, "replayed {t}, never committed\n{}", ctx());
        }
        for &t in self.acked.range(self.floor..) {
            assert!(got_set.contains(&t), "acknowledged sample {t} lost\n{}", ctx());
        }
        // What came back is on disk for good: the next crash must keep it too.
        self.acked = got_set;
        self.unsynced.clear();
        self.maybe.clear();
    }

    fn commit(&mut self, wal: &Wal, n: usize) {
        let samples: Vec<RefSample> =
            (0..n).map(|i| RefSample { series: SERIES, t: self.next + i as i64, st: 0, v: 1.0 }).collect();
        self.next += n as i64;
        let mut rec = Vec::new();
        record::encode_samples(&samples, &mut rec);
        let ts = samples.iter().map(|s| s.t);
        let result = wal.commit(&[&rec]);
        if result.is_ok() {
            self.log.push(format!("commit {}..{} ok in segment {}", samples[0].t, self.next, wal.current_segment()));
        }
        // A failed commit's records go out ahead of the next one: a later success covers them.
        match result {
            Ok(()) if self.policy == FsyncPolicy::Always => {
                self.acked.extend(ts);
                self.acked.append(&mut self.maybe);
            }
            Ok(()) => {
                self.unsynced.extend(ts);
                self.unsynced.append(&mut self.maybe);
            }
            Err(e) => {
                self.log.push(format!("commit {}..{} failed: {e}", samples[0].t, self.next));
                self.maybe.extend(ts);
            }
        }
    }

    fn sync(&mut self, wal: &Wal) {
        match wal.sync_all() {
            Ok(()) => {
                let synced = std::mem::take(&mut self.unsynced);
                self.acked.extend(synced);
            }
            Err(e) => self.log.push(format!("sync failed: {e}")),
        }
    }
}

fn run_seed(seed: u64, policy: FsyncPolicy) -> crate::vfs::sim::FaultCounts {
    let fs = SimFs::new(seed);
    fs.create_dir_all(Path::new("/data")).unwrap();
    fs.fsync_dir(Path::new("/")).unwrap();
    let mut run = Run {
        fs: fs.clone(),
        dir: Path::new("/data/wal"),
        policy,
        acked: BTreeSet::new(),
        unsynced: BTreeSet::new(),
        maybe: BTreeSet::new(),
        floor: i64::MIN,
        next: 1,
        log: vec![format!("seed {seed}, {policy:?}")],
    };
    let rates = FaultRates { write: 0.04, fsync: 0.04, read: 0.02, namespace: 0.02 };
    let mut wal = run.open();
    fs.set_rates(rates);
    for _ in 0..400 {
        match fs.random(100) {
            0..=59 => {
                let n = 1 + fs.random(12);
                run.commit(&wal, n);
            }
            60..=69 => run.sync(&wal),
            70..=74 => {
                let r = wal.roll();
                run.log.push(format!("roll: {r:?}"));
            }
            75..=79 => {
                // A head cut: checkpoint what is before the segment being written, dropping
                // samples older than a point the blocks would now hold.
                let cur = wal.current_segment();
                if cur > 0 {
                    let mint = run.next - 1 - fs.random(40) as i64;
                    run.floor = run.floor.max(mint);
                    let r = wal.checkpoint(cur - 1, |s| (s == SERIES).then_some(i64::MIN), mint);
                    run.log.push(format!("checkpoint ..={} from {mint}: {:?}", cur - 1, r.map(|s| s.samples_kept)));
                }
            }
            80..=84 => {
                let full = fs.random(2) == 0;
                fs.set_disk_full(full);
                run.log.push(format!("disk full: {full}"));
            }
            85..=91 => {
                run.log.push("crash".into());
                drop(wal);
                fs.crash();
                fs.set_disk_full(false);
                wal = run.open();
            }
            _ => {
                // The disk comes back: with no faults, the log must work again by itself.
                fs.set_rates(FaultRates::default());
                fs.set_disk_full(false);
                run.commit(&wal, 3);
                run.sync(&wal);
                let before = run.next;
                run.commit(&wal, 1);
                assert!(
                    run.acked.contains(&before) || policy != FsyncPolicy::Always,
                    "a commit on a healthy disk failed after earlier faults\n{}",
                    run.log.join("\n")
                );
                fs.set_rates(rates);
            }
        }
    }
    fs.set_rates(FaultRates::default());
    fs.set_disk_full(false);
    drop(wal);
    fs.crash();
    run.open();
    fs.counts()
}

/// The seeds to run: `STRATA_FAULT_SEEDS=N` runs 0..N, `STRATA_FAULT_SEED=S` only S.
fn seeds() -> std::ops::Range<u64> {
    let var = |name: &str| std::env::var(name).ok().and_then(|s| s.parse::<u64>().ok());
    match var("STRATA_FAULT_SEED") {
        Some(s) => s..s + 1,
        None => 0..var("STRATA_FAULT_SEEDS").unwrap_or(300),
    }
}

#[test]
fn nothing_acknowledged_is_lost_on_a_failing_disk_fsync_always() {
    let mut total = crate::vfs::sim::FaultCounts::default();
    for seed in seeds() {
        let c = run_seed(seed, FsyncPolicy::Always);
        total.write += c.write;
        total.fsync += c.fsync;
        total.read += c.read;
        total.namespace += c.namespace;
        total.crashes += c.crashes;
    }
    // The run is only worth something if faults of every kind actually happened.
    assert!(total.write > 0 && total.fsync > 0 && total.read > 0 && total.namespace > 0 && total.crashes > 0);
    eprintln!("seeds {:?}: {total:?}", seeds());
}

#[test]
fn nothing_synced_is_lost_on_a_failing_disk_fsync_interval() {
    for seed in seeds() {
        run_seed(seed, FsyncPolicy::Interval(Duration::from_secs(3600)));
    }
}

#[test]
fn the_log_writes_again_when_space_returns() {
    let fs = SimFs::new(42);
    fs.create_dir_all(Path::new("/d")).unwrap();
    let dir = Path::new("/d/wal");
    let open = || {
        let mut got = Vec::new();
        let (wal, _) = Wal::open_on(
            Arc::new(fs.clone()),
            dir,
            WalOptions { segment_bytes: 600, fsync: FsyncPolicy::Always, compression: true, progress: None },
            |b| {
                got.push(b.to_vec());
                Ok(())
            },
        )
        .unwrap();
        (wal, got)
    };
    let (wal, _) = open();
    wal.commit(&[b"first"]).unwrap();
    fs.set_disk_full(true);
    let e = wal.commit(&[b"refused while full"]).unwrap_err();
    assert!(e.to_string().contains("ENOSPC"), "{e}");
    let e = wal.commit(&[b"refused again"]).unwrap_err();
    assert!(e.to_string().contains("ENOSPC"), "the first error is named: {e}");
    fs.set_disk_full(false);
    wal.commit(&[b"after"]).unwrap();
    drop(wal);
    fs.crash();
    let (_, got) = open();
    // The refused commits went out, whole and once, ahead of the next one: the head applied
    // their samples to memory before the log refused them.
    let want: Vec<Vec<u8>> =
        [&b"first"[..], b"refused while full", b"refused again", b"after"].map(<[u8]>::to_vec).into();
    assert_eq!(got, want);
}
