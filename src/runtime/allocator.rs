//! Keeping glibc's allocator from holding on to memory the daemon no longer uses.
//!
//! The daemon's live data is small (well under 1 kB per autoscaler), but the initial listings
//! of watched objects, rules reloads and scrapes allocate a lot briefly. glibc keeps freed
//! memory in per-thread arenas and returns it to the kernel only from the top of the heap, so
//! resident memory would stay at the peak. Two arenas, and a trim after each such burst, keep
//! it near what is live. Elsewhere (musl) these do nothing.

/// At most two malloc arenas (one per core of the usual pod), set before threads start using
/// the allocator heavily.
pub fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only adjusts allocator parameters.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 2);
        }
    }
}

/// Returns free heap pages to the kernel.
pub fn release_free() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only releases memory the allocator holds as free.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}
