//! Series entries read from block indexes (labels and chunk references), kept for the next
//! query that selects them.
//!
//! A dashboard asks the same selections again and again: every refresh, every panel reloaded.
//! Over block data each of them read every selected series' entry from its block's index again
//! (varints, symbol lookups, label strings made and freed): for a one-step refresh of a count
//! over 180k series, over a quarter of its CPU (`perf`). Blocks never change, so an entry read once
//! stays right for as long as its index is open; this cache keeps them, shared by every query,
//! within a byte budget (`--storage.series-cache-size`). Tombstones are not kept here (they are
//! read per query), nor are entries of series the query's range left out (their labels are
//! not read).
//!
//! Keys are an opened index's number (`IndexFile::opened_id`: never reused in a process) and
//! the series' ref. Entries of an index that was closed (its block compacted away or
//! deleted) are never asked for again and go as the budget makes room. Shards, each a FIFO
//! with its share of the budget, so that selections on several threads rarely meet on a lock
//! and a hit needs no bookkeeping.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use strata_model::{Label, Labels, SeriesRef};

use super::fifo::Fifo;
use super::index::ChunkMetaRef;

/// Default byte budget: about 70k node-exporter series (labels and a few chunk references
/// each, counted as if no string were shared with another entry: about 450 bytes).
pub const SERIES_CACHE_BYTES_DEFAULT: usize = 32 << 20;

const SHARDS: usize = 16;

/// What an entry is taken to cost when deciding whether a selection is kept (`admits`): a
/// node-exporter series' five labels and a chunk reference or two, as `CachedSeries::bytes`
/// counts them, are 400-500 bytes.
const ADMIT_BYTES_PER_SERIES: usize = 512;

/// A series' entry as its block's index holds it: its labels and all its chunks.
#[derive(Debug)]
pub struct CachedSeries {
    pub labels: Labels,
    pub chunks: Box<[ChunkMetaRef]>,
}

impl CachedSeries {
    /// Bytes it holds, counting its label strings as its own (entries share most of them, so
    /// this errs towards keeping fewer).
    fn bytes(&self) -> usize {
        let strings: usize = self.labels.iter().map(|l| l.name.len() + l.value.len() + 32).sum();
        std::mem::size_of::<Self>()
            + 16
            + self.labels.len() * std::mem::size_of::<Label>()
            + strings
            + std::mem::size_of_val(&*self.chunks)
            + 64
    }
}

type Key = (u64, u64);

type Shard = Fifo<Key, Arc<CachedSeries>>;

/// The process-wide cache of series entries (`SeriesCache::global`).
#[derive(Debug)]
pub struct SeriesCache {
    shards: [Mutex<Shard>; SHARDS],
    budget: AtomicUsize,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl SeriesCache {
    fn new(budget: usize) -> SeriesCache {
        SeriesCache {
            shards: std::array::from_fn(|_| Mutex::new(Shard::default())),
            budget: AtomicUsize::new(budget),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// The process-wide cache.
    pub fn global() -> &'static SeriesCache {
        static CACHE: std::sync::OnceLock<SeriesCache> = std::sync::OnceLock::new();
        CACHE.get_or_init(|| SeriesCache::new(SERIES_CACHE_BYTES_DEFAULT))
    }

    /// Sets the byte budget (0 keeps nothing); entries past it go at the next insert into
    /// their shard, and all of them at once when it is 0.
    pub fn set_budget(&self, bytes: usize) {
        self.budget.store(bytes, Ordering::Relaxed);
        if bytes == 0 {
            for shard in &self.shards {
                *shard.lock() = Shard::default();
            }
        }
    }

    /// Whether a selection of `series` entries is looked up and kept: only one that takes at
    /// most half the budget. A larger one would push its own first entries out before it ends
    /// (a FIFO meets each entry again only in the next query), and every read would then pay
    /// for an entry kept and dropped: a one-step count over 180k series took 250 ms instead of
    /// 154 with a budget a fifth of its entries.
    pub fn admits(&self, series: usize) -> bool {
        let budget = self.budget.load(Ordering::Relaxed);
        budget > 0 && series.saturating_mul(ADMIT_BYTES_PER_SERIES) <= budget / 2
    }

    /// `(bytes held, entries held, hits, misses)`, for `/metrics`.
    pub fn stats(&self) -> (usize, usize, u64, u64) {
        let (mut bytes, mut entries) = (0, 0);
        for shard in &self.shards {
            let s = shard.lock();
            bytes += s.bytes();
            entries += s.len();
        }
        (bytes, entries, self.hits.load(Ordering::Relaxed), self.misses.load(Ordering::Relaxed))
    }

    fn shard(&self, key: Key) -> &Mutex<Shard> {
        // Series refs of one block are consecutive, so their low bits spread them.
        &self.shards[(key.1 as usize ^ key.0 as usize) % SHARDS]
    }

    /// The kept entry of series `id` of the index read as `reader`, counted as a hit when found
    /// (a miss is counted where the entry is read from the index: `insert_missed`).
    pub fn get(&self, reader: u64, id: SeriesRef) -> Option<Arc<CachedSeries>> {
        let key = (reader, id.0);
        let found = self.shard(key).lock().get(&key).cloned();
        if found.is_some() {
            self.hits.fetch_add(1, Ordering::Relaxed);
        }
        found
    }

    /// Keeps `entry`, just read from the index (counted as a miss), if it fits its shard's
    /// share of the budget, dropping the shard's oldest entries to make room.
    pub fn insert_missed(&self, reader: u64, id: SeriesRef, entry: Arc<CachedSeries>) {
        self.misses.fetch_add(1, Ordering::Relaxed);
        let share = self.budget.load(Ordering::Relaxed) / SHARDS;
        let key = (reader, id.0);
        self.shard(key).lock().insert(key, entry, share, |e| e.bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::ChunkRef;

    fn entry(name: &str, chunks: usize) -> Arc<CachedSeries> {
        let labels = Labels::from_pairs([("__name__", name), ("job", "node")]);
        let chunks = (0..chunks as i64)
            .map(|i| ChunkMetaRef { mint: i * 10, maxt: i * 10 + 9, chunk: ChunkRef(1 << 32 | i as u64) })
            .collect();
        Arc::new(CachedSeries { labels, chunks })
    }

    #[test]
    fn a_kept_entry_is_found_by_its_reader_and_ref_only() {
        let cache = SeriesCache::new(1 << 20);
        cache.insert_missed(7, SeriesRef(3), entry("up", 2));
        let found = cache.get(7, SeriesRef(3)).expect("kept");
        assert_eq!(found.labels.get("__name__"), Some("up"));
        assert_eq!(found.chunks.len(), 2);
        assert!(cache.get(8, SeriesRef(3)).is_none(), "another index's series 3");
        assert!(cache.get(7, SeriesRef(4)).is_none());
        let (bytes, entries, hits, misses) = cache.stats();
        assert_eq!((entries, hits, misses), (1, 1, 1));
        assert_eq!(bytes, found.bytes());
    }

    #[test]
    fn the_budget_holds_and_the_oldest_go_first() {
        let one = entry("a_metric_name", 3).bytes();
        // Room for four entries per shard.
        let cache = SeriesCache::new(SHARDS * one * 4);
        // Refs that all fall in shard 0 for reader 0.
        let refs: Vec<SeriesRef> = (0..10u64).map(|i| SeriesRef(i * SHARDS as u64)).collect();
        for &r in &refs {
            cache.insert_missed(0, r, entry("a_metric_name", 3));
        }
        let kept: Vec<bool> = refs.iter().map(|&r| cache.get(0, r).is_some()).collect();
        assert_eq!(kept, [false, false, false, false, false, false, true, true, true, true]);
        let (bytes, entries, ..) = cache.stats();
        assert_eq!((bytes, entries), (4 * one, 4));
        // An entry larger than a shard's share (a chunk reference is 24 bytes) is not kept.
        cache.insert_missed(0, SeriesRef(1), entry("a_metric_name", 4 * one / 24 + 1));
        assert!(cache.get(0, SeriesRef(1)).is_none());
        // A budget of 0 empties it and keeps nothing after.
        cache.set_budget(0);
        assert_eq!(cache.stats().1, 0);
        cache.insert_missed(0, SeriesRef(2), entry("up", 1));
        assert!(cache.get(0, SeriesRef(2)).is_none());
    }

    #[test]
    fn only_selections_within_half_the_budget_are_kept() {
        let cache = SeriesCache::new(ADMIT_BYTES_PER_SERIES * 1000);
        assert!(cache.admits(0));
        assert!(cache.admits(500));
        assert!(!cache.admits(501));
        assert!(!cache.admits(usize::MAX));
        cache.set_budget(0);
        assert!(!cache.admits(1));
    }
}
