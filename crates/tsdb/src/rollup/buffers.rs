//! Bucket buffers kept between tier reads. A long read decodes each series' buckets into a
//! buffer, hands it to the caller and gets it back; the buffers in flight (a few batches of
//! series per decoding worker) are the same from one read to the next, so keeping them spares
//! each read the allocation and the page faults of fresh memory (a 30-day Graphite render of
//! 1000 series from a 10-minute tier grew a 405 KiB buffer per series afresh: a fifth of its
//! CPU, 19k page faults per render, 8k with the buffers kept). Kept capacity is bounded by
//! `KEPT_BYTES_MAX`; a buffer past it is freed.

use parking_lot::Mutex;

use super::{Bucket, BucketColumns};
use crate::chunkenc::rollup::ColumnSet;

/// Bytes of bucket capacity kept at most.
pub const KEPT_BYTES_MAX: usize = 16 << 20;

/// A buffer that never holds more than this is not worth keeping (cheap to allocate).
const KEPT_BUFFER_MIN: usize = 64;

struct Kept {
    buffers: Vec<Vec<Bucket>>,
    bytes: usize,
}

static KEPT: Mutex<Kept> = Mutex::new(Kept { buffers: Vec::new(), bytes: 0 });

fn bytes_of(buffer: &Vec<Bucket>) -> usize {
    buffer.capacity() * std::mem::size_of::<Bucket>()
}

/// An empty buffer with room for at least `capacity` buckets: a kept one if there is one.
pub fn take(capacity: usize) -> Vec<Bucket> {
    let kept = {
        let mut kept = KEPT.lock();
        let buffer = kept.buffers.pop();
        if let Some(b) = &buffer {
            kept.bytes -= bytes_of(b);
        }
        buffer
    };
    let mut buffer = kept.unwrap_or_default();
    buffer.clear();
    buffer.reserve(capacity);
    buffer
}

/// Hands `buffer` back for a later `take`, unless the kept buffers are at their bound.
pub fn give(buffer: Vec<Bucket>) {
    let size = bytes_of(&buffer);
    if buffer.capacity() < KEPT_BUFFER_MIN {
        return;
    }
    let mut kept = KEPT.lock();
    if kept.bytes + size <= KEPT_BYTES_MAX {
        kept.bytes += size;
        kept.buffers.push(buffer);
    }
}

/// Bytes of capacity kept now (`strata_tsdb_rollup_bucket_buffers_bytes` in `/metrics`).
pub fn kept_bytes() -> usize {
    KEPT.lock().bytes + KEPT_COLUMNS.lock().bytes
}

/// The same for the columns tier reads decode into (`BucketColumns`), within the same bound.
struct KeptColumns {
    buffers: Vec<BucketColumns>,
    bytes: usize,
}

static KEPT_COLUMNS: Mutex<KeptColumns> = Mutex::new(KeptColumns { buffers: Vec::new(), bytes: 0 });

fn column_bytes(c: &BucketColumns) -> usize {
    use std::mem::size_of_val;
    let bytes = |len: usize, one: usize| len * one;
    bytes(c.ends.capacity(), size_of_val(&0i64))
        + bytes(c.counts.capacity() + c.changes.capacity() + c.resets.capacity(), size_of_val(&0u64))
        + bytes(
            c.sums.capacity() + c.mins.capacity() + c.maxs.capacity() + c.reset_corrections.capacity(),
            size_of_val(&0f64),
        )
        + bytes(c.firsts.capacity() + c.lasts.capacity(), std::mem::size_of::<strata_model::Sample>())
        + bytes(c.archives.capacity(), std::mem::size_of::<super::ArchiveValue>())
}

/// Empty columns holding `columns`, with room for `capacity` buckets: kept ones if there are.
pub fn take_columns(columns: ColumnSet, capacity: usize) -> BucketColumns {
    let kept = {
        let mut kept = KEPT_COLUMNS.lock();
        let buffer = kept.buffers.pop();
        if let Some(b) = &buffer {
            kept.bytes -= column_bytes(b);
        }
        buffer
    };
    let mut buffer = kept.unwrap_or_default();
    buffer.reset(columns);
    buffer.reserve(capacity);
    buffer
}

/// Hands `columns` back for a later `take_columns`, unless the kept buffers are at their bound.
pub fn give_columns(columns: BucketColumns) {
    let size = column_bytes(&columns);
    if columns.ends.capacity() < KEPT_BUFFER_MIN {
        return;
    }
    let mut kept = KEPT_COLUMNS.lock();
    if kept.bytes + size <= KEPT_BYTES_MAX {
        kept.bytes += size;
        kept.buffers.push(columns);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_empty_and_the_kept_bytes_stay_bounded() {
        let mut b = take(1000);
        assert!(b.is_empty() && b.capacity() >= 1000);
        let blank = crate::rollup::aggregate(&[strata_model::Sample { t: 1, v: 1.0 }], 60_000)[0];
        b.push(blank);
        give(b);
        let again = take(10);
        assert!(again.is_empty(), "a kept buffer is handed out cleared");
        give(again);
        // Far more than the bound: the kept bytes never pass it.
        let per = KEPT_BYTES_MAX / std::mem::size_of::<Bucket>() / 4;
        for _ in 0..10 {
            give(Vec::with_capacity(per));
        }
        assert!(kept_bytes() <= KEPT_BYTES_MAX);
    }
}
