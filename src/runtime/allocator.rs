//! Keeping glibc's allocator from holding on to memory the daemon no longer uses.
//!
//! The daemon's live data is small (well under 1 kB per autoscaler), but the initial listings
//! of watched objects, rules reloads and scrapes allocate a lot briefly. glibc keeps freed
//! memory in per-thread arenas and returns it to the kernel only from the top of the heap, so
//! resident memory would stay at the peak. Two arenas, and a trim after each such burst, keep
//! it near what is live. Elsewhere (musl) these do nothing.
//!
//! Whatever leaves such a burst behind asks for a trim through a [`Trim`] handle; one health
//! loop (`health::trim_allocator`) does it, then and every so often.

use std::sync::Arc;

use tokio::sync::Notify;

/// Blocks this large or larger are mapped on their own and unmapped when freed.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 128 * 1024;

/// At most two malloc arenas (one per core of the usual pod), and large blocks always mapped on
/// their own; set before threads start using the allocator heavily.
///
/// glibc raises its mmap threshold to the size of any mapped block that is freed, up to 32 MB,
/// so after the first large cycle the next cycle's large vectors (a scrape's snapshot, a
/// cycle's jobs and answers, a reload's autoscalers) come from the heap, where they leave holes
/// that small long-lived blocks land in and keep resident. A fixed threshold keeps them out of
/// the heap: at 10,000 autoscalers, 8 MiB less resident (BENCHMARKS.md).
pub fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets allocator parameters; glibc takes its own lock, and
        // M_ARENA_MAX and M_MMAP_THRESHOLD with these positive values are valid at any time.
        #[expect(unsafe_code, reason = "glibc's mallopt has no safe binding")]
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 2);
            libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        }
    }
}

/// Returns free heap pages to the kernel.
pub fn release_free() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only returns pages the allocator holds as free to the kernel, under
        // glibc's own locks; no memory in use is touched.
        #[expect(unsafe_code, reason = "glibc's malloc_trim has no safe binding")]
        unsafe {
            libc::malloc_trim(0);
        }
    }
}

/// A request to give freed memory back now, which the one trimming loop acts on. Requests made
/// before it gets to them count as one.
#[derive(Clone, Debug, Default)]
pub(crate) struct Trim(Arc<Notify>);

impl Trim {
    /// Asks for a trim, after a burst of garbage (a large cycle, a reload, the initial listings).
    pub(crate) fn request(&self) {
        self.0.notify_one();
    }

    /// Returns once a trim was asked for.
    pub(crate) async fn requested(&self) {
        self.0.notified().await;
    }
}
