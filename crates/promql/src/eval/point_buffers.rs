//! Point buffers handed back by the consumers of series to their producers.
//!
//! A range query's series are produced on worker threads (one output vector per series,
//! steps × 16 bytes: 23 KiB at 1,440 steps) and consumed on the evaluating thread, which
//! often drops them at once (an aggregation folds a series into its group and is done with
//! it). Allocated and freed that way, thousands of vectors per query went through the
//! allocator's cross-thread frees and its purge of idle pages and came back as fresh zeroed
//! pages: 9,500 page faults per `histogram_quantile(0.99, sum by (le, handler) (rate(…)))`
//! over 7,200 series, 3,800 with the vectors handed back here.

use std::sync::Mutex;

use crate::value::Point;

/// The process' pool, shared by every query.
pub(crate) static POOL: PointBuffers = PointBuffers::new(KEPT_BYTES_MAX);

/// The pool keeps at most this many bytes of buffers: a few per worker, as a pipeline holds
/// (two batches of 32 series per worker in flight), beyond which buffers are freed.
const KEPT_BYTES_MAX: usize = 8 << 20;

/// Empty point vectors waiting for reuse, at most `bytes_max` of them.
pub(crate) struct PointBuffers {
    bytes_max: usize,
    kept: Mutex<Kept>,
}

struct Kept {
    buffers: Vec<Vec<Point>>,
    bytes: usize,
}

impl PointBuffers {
    pub(crate) const fn new(bytes_max: usize) -> PointBuffers {
        PointBuffers { bytes_max, kept: Mutex::new(Kept { buffers: Vec::new(), bytes: 0 }) }
    }

    /// An empty vector with room for at least `capacity` points, reused when one is kept.
    pub(crate) fn take(&self, capacity: usize) -> Vec<Point> {
        if capacity >= POOLED_POINTS_MIN {
            let reused = {
                let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
                // Not one far larger than asked for: a series that keeps its points (one per
                // series in an instant result) would hold the rest idle.
                let fits = |v: &Vec<Point>| v.capacity() <= capacity.saturating_mul(4);
                let v = if kept.buffers.last().is_some_and(fits) { kept.buffers.pop() } else { None };
                if let Some(v) = &v {
                    kept.bytes -= bytes_of(v);
                }
                v
            };
            if let Some(mut v) = reused {
                debug_assert!(v.is_empty());
                v.reserve(capacity);
                return v;
            }
        }
        Vec::with_capacity(capacity)
    }

    /// Frees every kept buffer.
    pub(crate) fn clear(&self) {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.buffers = Vec::new();
        kept.bytes = 0;
    }

    /// Keeps `points`' allocation for a later `take`, if there is room.
    pub(crate) fn give(&self, mut points: Vec<Point>) {
        let bytes = bytes_of(&points);
        if points.capacity() < POOLED_POINTS_MIN || bytes > self.bytes_max {
            return;
        }
        points.clear();
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if kept.bytes + bytes <= self.bytes_max {
            kept.bytes += bytes;
            kept.buffers.push(points);
        }
    }
}

/// Buffers smaller than this (4 KiB) go through the allocator: its thread-local free lists
/// serve them faster than the pool's lock, which the workers of an instant query (a point per
/// series) took twice per series and contended for (4% of one over 8000 head series).
const POOLED_POINTS_MIN: usize = 256;

fn bytes_of(points: &Vec<Point>) -> usize {
    points.capacity() * std::mem::size_of::<Point>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_given_back_is_taken_again_empty_and_large_enough() {
        let pool = PointBuffers::new(1 << 20);
        let mut v = pool.take(300);
        assert!(v.capacity() >= 300);
        v.push(Point { t: 1, f: 2.0 });
        let at = v.as_ptr();
        pool.give(v);
        let again = pool.take(POOLED_POINTS_MIN);
        assert_eq!(again.as_ptr(), at, "the kept allocation is reused");
        assert!(again.is_empty() && again.capacity() >= 300);
        // Asking for more than it holds grows it.
        pool.give(again);
        let grown = pool.take(2000);
        assert!(grown.capacity() >= 2000);
        // Asking for far less than it holds leaves it kept.
        pool.give(grown);
        let fewer = pool.take(POOLED_POINTS_MIN);
        assert!(fewer.capacity() < 2000);
        assert_eq!(pool.kept.lock().unwrap().buffers.len(), 1);
        // A small request is the allocator's, and a small buffer is not kept.
        let small = pool.take(2);
        assert!(small.capacity() >= 2 && small.capacity() < POOLED_POINTS_MIN);
        pool.give(small);
        assert_eq!(pool.kept.lock().unwrap().buffers.len(), 1);
    }

    #[test]
    fn the_pool_keeps_no_more_than_its_bytes() {
        let pool = PointBuffers::new(10 * 16 * 300);
        for _ in 0..20 {
            pool.give(Vec::with_capacity(300));
        }
        let kept = pool.kept.lock().unwrap();
        assert_eq!(kept.buffers.len(), 10);
        assert_eq!(kept.bytes, 10 * 16 * 300);
        drop(kept);
        // A buffer larger than the whole pool is never kept.
        pool.give(Vec::with_capacity(4000));
        assert_eq!(pool.kept.lock().unwrap().buffers.len(), 10);
        // Nothing is kept of an empty vector, and nothing reused for an empty request.
        assert!(pool.take(0).capacity() == 0);
        // Cleared (an idle server), it keeps nothing, and takes buffers again.
        pool.clear();
        let kept = pool.kept.lock().unwrap();
        assert!(kept.buffers.is_empty() && kept.bytes == 0);
        drop(kept);
        pool.give(Vec::with_capacity(300));
        assert_eq!(pool.kept.lock().unwrap().bytes, 16 * 300);
    }
}
