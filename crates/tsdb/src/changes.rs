//! Changes to data a reader may already have seen: samples written into the past (late,
//! out-of-order, backfilled, or from a sender running behind), deletions, and blocks removed by
//! retention. A cache of query results holds answers for times up to some moment behind now;
//! it asks which times changed since it computed them and drops what it holds from there on.
//!
//! Writes are noted only when they reach further back than the horizon a watcher set
//! ([`ChangeLog::watch`]): in-order writes near now, the steady flow, cost one atomic load per
//! commit. Deletions, imports and retention are always noted. The log keeps the latest
//! [`CHANGES_KEPT`] changes; a reader asking about older ones is told everything changed.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use parking_lot::Mutex;

/// Changes remembered; a watcher older than these is told that everything changed.
pub const CHANGES_KEPT: usize = 4096;

#[derive(Debug, Default)]
pub struct ChangeLog {
    /// Writes reaching back further than this behind the wall clock are noted (0: none are).
    horizon_ms: AtomicI64,
    /// The sequence number of the last change noted.
    seq: AtomicU64,
    recent: Mutex<Recent>,
}

#[derive(Debug, Default)]
struct Recent {
    changes: VecDeque<Change>,
    /// Changes up to this sequence number were dropped from `changes`.
    forgotten_through: u64,
}

/// Data in `[mint, maxt]` changed; noted as change number `seq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Change {
    pub seq: u64,
    pub mint: i64,
    pub maxt: i64,
    /// Only rollup tiers' blocks changed there (rolled up, merged, dropped): the samples did
    /// not, but a bucket's sum may have changed at its last bit (parts of a bucket a block
    /// boundary cut, combined in another order). Only readers of tiers care.
    pub tiers_only: bool,
}

impl ChangeLog {
    /// Notes from now on writes whose oldest sample is `horizon_ms` or more behind the wall
    /// clock (the widest horizon asked for wins).
    pub fn watch(&self, horizon_ms: i64) {
        assert!(horizon_ms > 0, "a horizon is a positive duration");
        let _ = self.horizon_ms.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| {
            Some(if h == 0 { horizon_ms } else { h.min(horizon_ms) })
        });
    }

    /// The last change's sequence number: a reader records it before reading.
    pub fn seq(&self) -> u64 {
        self.seq.load(Ordering::Acquire)
    }

    /// The oldest time changed after change `seq` (`i64::MIN` when those changes are no longer
    /// all remembered); `None` when nothing changed since.
    /// Changes to tiers' blocks alone (`Change::tiers_only`) are not counted: see
    /// `changed_in_tiers_since`.
    pub fn changed_since(&self, seq: u64) -> Option<i64> {
        self.changed(seq, false)
    }

    /// `changed_since` for a reader of rollup tiers: changes to tiers' blocks count too.
    pub fn changed_in_tiers_since(&self, seq: u64) -> Option<i64> {
        self.changed(seq, true)
    }

    fn changed(&self, seq: u64, tiers: bool) -> Option<i64> {
        if self.seq() <= seq {
            return None;
        }
        let recent = self.recent.lock();
        if seq < recent.forgotten_through {
            return Some(i64::MIN);
        }
        recent.changes.iter().rev().take_while(|c| c.seq > seq).filter(|c| tiers || !c.tiers_only).map(|c| c.mint).min()
    }

    /// A commit wrote samples in `[mint, maxt]`: noted when it reaches behind the horizon.
    pub(crate) fn note_write(&self, mint: i64, maxt: i64) {
        let horizon = self.horizon_ms.load(Ordering::Relaxed);
        if horizon == 0 {
            return;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(i64::MAX, |d| d.as_millis() as i64);
        if mint <= now.saturating_sub(horizon) {
            self.note(mint, maxt);
        }
    }

    /// Data in `[mint, maxt]` changed (deleted, imported, removed by retention).
    pub(crate) fn note(&self, mint: i64, maxt: i64) {
        self.push(mint, maxt, false);
    }

    /// A rollup tier's blocks over `[mint, maxt]` were replaced, added or removed (after the
    /// swap: a reader that saw the old blocks has an older number).
    pub(crate) fn note_tiers(&self, mint: i64, maxt: i64) {
        self.push(mint, maxt, true);
    }

    fn push(&self, mint: i64, maxt: i64, tiers_only: bool) {
        debug_assert!(mint <= maxt, "a change covers a time range");
        let mut recent = self.recent.lock();
        // Numbered under the lock, so the log is in sequence order; published after it is in
        // the log, so a reader that sees the number finds the change.
        let seq = self.seq.load(Ordering::Relaxed) + 1;
        if recent.changes.len() == CHANGES_KEPT {
            let dropped = recent.changes.pop_front().expect("full");
            recent.forgotten_through = dropped.seq;
        }
        recent.changes.push_back(Change { seq, mint, maxt, tiers_only });
        self.seq.store(seq, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> i64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
    }

    #[test]
    fn writes_behind_the_horizon_are_noted_others_not() {
        let log = ChangeLog::default();
        log.note_write(0, 10);
        assert_eq!(log.seq(), 0, "nothing is watched yet");
        log.watch(60_000);
        let seen = log.seq();
        log.note_write(now() - 1000, now());
        assert_eq!(log.changed_since(seen), None, "a write near now");
        log.note_write(now() - 120_000, now());
        let t = log.changed_since(seen).expect("a write two minutes back");
        assert!(t <= now() - 120_000);
        log.note(5, 7);
        assert_eq!(log.changed_since(seen), Some(5));
        assert_eq!(log.changed_since(log.seq()), None);
    }

    #[test]
    fn tier_changes_count_for_tier_readers_only() {
        let log = ChangeLog::default();
        let seen = log.seq();
        log.note_tiers(100, 200);
        assert_eq!(log.changed_since(seen), None);
        assert_eq!(log.changed_in_tiers_since(seen), Some(100));
        log.note(300, 400);
        assert_eq!(log.changed_since(seen), Some(300));
        assert_eq!(log.changed_in_tiers_since(seen), Some(100));
    }

    #[test]
    fn forgotten_changes_mean_everything_changed() {
        let log = ChangeLog::default();
        let seen = log.seq();
        for i in 0..CHANGES_KEPT as i64 + 1 {
            log.note(1000 + i, 2000 + i);
        }
        assert_eq!(log.changed_since(seen), Some(i64::MIN));
        let later = log.seq() - 1;
        assert_eq!(log.changed_since(later), Some(1000 + CHANGES_KEPT as i64));
    }
}
