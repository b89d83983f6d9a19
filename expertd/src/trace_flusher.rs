//! The route trace's writer thread: while the daemon records a trace, the cache only journals
//! events in memory under its lock, and this thread writes them to the file every
//! [`FLUSH_EVERY`] (`ExpertCache::flush_trace`). No call ever waits for the trace's file IO: a
//! slow or stalled file delays this thread alone, and the journal's growth meanwhile is capped
//! by the cache (events past the cap are dropped and `finish_trace` reports the trace incomplete).

use crate::cache::ExpertCache;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How often the journal is written while tracing.
pub const FLUSH_EVERY: Duration = Duration::from_millis(50);

/// The running writer thread; stopped (and joined) on [`TraceFlusher::stop`] or drop.
pub struct TraceFlusher {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TraceFlusher {
    /// Starts writing `cache`'s journaled trace events every [`FLUSH_EVERY`].
    pub fn start(cache: ExpertCache) -> std::io::Result<TraceFlusher> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("expertd-trace".into())
            .spawn(move || {
                while !flag.load(Ordering::Acquire) {
                    std::thread::park_timeout(FLUSH_EVERY);
                    // A write error sticks to the writer; `finish_trace` reports it at shutdown.
                    let _ = cache.flush_trace();
                }
            })?;
        Ok(TraceFlusher {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the thread once its current write (if any) is done; the caller then finishes the
    /// trace (`ExpertCache::finish_trace`), which writes what is left.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        if let Some(t) = self.thread.take() {
            self.stop.store(true, Ordering::Release);
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

impl Drop for TraceFlusher {
    fn drop(&mut self) {
        self.halt();
    }
}
