//! Bucket buffers kept between tier reads. A long read decodes each series' buckets into a
//! buffer (columns, `BucketColumns`), hands it to the caller and gets it back; the buffers in flight (a few batches of
//! series per decoding worker) are the same from one read to the next, so keeping them spares
//! each read the allocation and the page faults of fresh memory (a 30-day Graphite render of
//! 1000 series from a 10-minute tier grew a 405 KiB buffer per series afresh: a fifth of its
//! CPU, 19k page faults per render, 8k with the buffers kept). Kept capacity is bounded by
//! `KEPT_BYTES_MAX`; a buffer past it is freed.

use parking_lot::Mutex;

use super::{Bucket, BucketColumns};
use crate::chunkenc::rollup::ColumnSet;

/// Bytes of capacity kept at most, by each of the two kinds of buffer (`Bucket` runs, which
/// merges and compaction use, and the columns tier reads decode into).
pub const KEPT_BYTES_MAX: usize = 16 << 20;

/// A buffer that never holds more than this many buckets is not worth keeping (cheap to
/// allocate).
const KEPT_BUFFER_MIN: usize = 64;

/// Buffers of one kind kept, and their bytes.
struct Kept<T> {
    buffers: Vec<T>,
    bytes: usize,
}

/// What a kept buffer is: its bytes and its room in buckets.
trait Buffer: Default {
    fn bytes(&self) -> usize;
    fn room(&self) -> usize;
}

impl Buffer for Vec<Bucket> {
    fn bytes(&self) -> usize {
        self.capacity() * std::mem::size_of::<Bucket>()
    }

    fn room(&self) -> usize {
        self.capacity()
    }
}

impl Buffer for BucketColumns {
    fn bytes(&self) -> usize {
        use std::mem::size_of;
        let c = self;
        c.ends.capacity() * size_of::<i64>()
            + (c.counts.capacity() + c.changes.capacity() + c.resets.capacity()) * size_of::<u64>()
            + (c.sums.capacity() + c.mins.capacity() + c.maxs.capacity() + c.reset_corrections.capacity())
                * size_of::<f64>()
            + (c.firsts.capacity() + c.lasts.capacity()) * size_of::<strata_model::Sample>()
            + c.archives.capacity() * size_of::<super::ArchiveValue>()
    }

    fn room(&self) -> usize {
        self.ends.capacity()
    }
}

impl<T: Buffer> Kept<T> {
    const fn new() -> Kept<T> {
        Kept { buffers: Vec::new(), bytes: 0 }
    }

    /// A kept buffer, or a new one.
    fn take(kept: &Mutex<Kept<T>>) -> T {
        let mut kept = kept.lock();
        let buffer = kept.buffers.pop();
        if let Some(b) = &buffer {
            kept.bytes -= b.bytes();
        }
        buffer.unwrap_or_default()
    }

    /// Keeps `buffer` unless it is small or the kept ones are at their bound.
    fn give(kept: &Mutex<Kept<T>>, buffer: T) {
        let size = buffer.bytes();
        if buffer.room() < KEPT_BUFFER_MIN {
            return;
        }
        let mut kept = kept.lock();
        if kept.bytes + size <= KEPT_BYTES_MAX {
            kept.bytes += size;
            kept.buffers.push(buffer);
        }
    }
}

static KEPT: Mutex<Kept<Vec<Bucket>>> = Mutex::new(Kept::new());
static KEPT_COLUMNS: Mutex<Kept<BucketColumns>> = Mutex::new(Kept::new());

/// An empty buffer with room for at least `capacity` buckets: a kept one if there is one.
pub fn take(capacity: usize) -> Vec<Bucket> {
    let mut buffer = Kept::take(&KEPT);
    buffer.clear();
    buffer.reserve(capacity);
    buffer
}

/// Hands `buffer` back for a later `take`, unless the kept buffers are at their bound.
pub fn give(buffer: Vec<Bucket>) {
    Kept::give(&KEPT, buffer)
}

/// Empty columns holding `columns`, with room for `capacity` buckets: kept ones if there are.
pub fn take_columns(columns: ColumnSet, capacity: usize) -> BucketColumns {
    let mut buffer = Kept::take(&KEPT_COLUMNS);
    buffer.reset(columns);
    buffer.reserve(capacity);
    buffer
}

/// Hands `columns` back for a later `take_columns`, unless the kept ones are at their bound.
pub fn give_columns(columns: BucketColumns) {
    Kept::give(&KEPT_COLUMNS, columns)
}

/// Bytes of capacity kept now (`strata_tsdb_rollup_bucket_buffers_bytes` in `/metrics`).
pub fn kept_bytes() -> usize {
    KEPT.lock().bytes + KEPT_COLUMNS.lock().bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunkenc::rollup::Column;

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
        assert!(kept_bytes() <= 2 * KEPT_BYTES_MAX);
        // Columns come back emptied, holding the columns asked for.
        let mut c = take_columns(ColumnSet::ALL, 100);
        c.push(&blank);
        give_columns(c);
        let again = take_columns(ColumnSet::of(&[Column::Max]), 10);
        assert!(again.is_empty() && again.columns() == ColumnSet::of(&[Column::Max]) && again.is_consistent());
    }
}
