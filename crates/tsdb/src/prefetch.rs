//! Hints to the CPU to bring memory closer before it is read: for loops that know which
//! scattered objects they will touch a few steps ahead (a selection's series, a merge's
//! chunk bytes), so that a cache miss is paid while other work runs rather than waited for.

/// Asks the CPU to bring every cache line of `items` closer (a hint: nothing is read).
#[inline]
pub(crate) fn prefetch<T>(items: &[T]) {
    let start = items.as_ptr().cast::<u8>();
    for offset in (0..std::mem::size_of_val(items)).step_by(64) {
        prefetch_line(start.wrapping_add(offset));
    }
}

/// Asks the CPU to bring the cache line at `at` closer (a hint: nothing is read, and any
/// address, even a dangling one, is allowed).
#[inline(always)]
pub(crate) fn prefetch_line<T>(at: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing and cannot fault; SSE is part of x86-64.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(at.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}
