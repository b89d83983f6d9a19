//! [`PreadSource`]: the fallback reader (`--io pread`, or when io_uring is unavailable). Each
//! blob is one `pread` (continued after a short read) straight into the caller's buffer, with
//! `O_DIRECT` when the filesystem allows it; a batch is split across at most
//! [`PREAD_MAX_THREADS`] scoped threads so the device still sees a few reads at once.
//!
//! Owns no buffers and no policy: the cache decides what to read, `ContainerIndex` checks the
//! requests and verifies what was read.

use super::{
    ContainerIndex, DataFile, ExpertSource, IoError, MAX_RETRIES_PER_BLOB, ReadRequest, errno_of,
    retryable,
};
use std::os::unix::fs::FileExt;

/// Most threads one batch is spread over (the calling thread included). Four keep an NVMe
/// queue busy without spawning a thread per blob of a 64-blob batch.
pub const PREAD_MAX_THREADS: usize = 4;

/// Reads blobs with `pread(2)`.
#[derive(Debug)]
pub struct PreadSource {
    index: ContainerIndex,
    data: DataFile,
    threads: usize,
    /// Largest single `pread`; smaller than a blob only in tests, to exercise the
    /// continue-after-short-read path.
    max_read_bytes: usize,
}

impl PreadSource {
    /// A reader over an opened container (see [`super::open_source`]).
    pub fn new(index: ContainerIndex, data: DataFile) -> PreadSource {
        PreadSource {
            index,
            data,
            threads: PREAD_MAX_THREADS,
            max_read_bytes: usize::MAX,
        }
    }

    /// Spreads each batch over at most `threads` threads (1: read in order on the caller).
    pub fn with_threads(mut self, threads: usize) -> PreadSource {
        self.threads = threads.clamp(1, PREAD_MAX_THREADS);
        self
    }

    /// Whether reads bypass the page cache.
    pub fn o_direct(&self) -> bool {
        self.data.o_direct()
    }

    #[cfg(test)]
    pub(crate) fn with_max_read_bytes(mut self, n: usize) -> PreadSource {
        self.max_read_bytes = n;
        self
    }

    fn read_one(&self, req: &mut ReadRequest<'_>) -> Result<(), IoError> {
        let entry = self.index.check_request(req)?;
        let (layer, expert, offset) = (req.layer, req.expert, entry.offset);
        let want = req.dst.len();
        let (mut done, mut retries) = (0usize, 0u32);
        while done < want {
            let end = want.min(done.saturating_add(self.max_read_bytes));
            match self
                .data
                .file
                .read_at(&mut req.dst[done..end], offset + done as u64)
            {
                Ok(0) => {
                    return Err(IoError::ShortRead {
                        layer,
                        expert,
                        offset,
                        got: done as u64,
                        want: want as u64,
                    });
                }
                Ok(n) => done += n,
                Err(e) if retryable(errno_of(&e)) && retries < MAX_RETRIES_PER_BLOB => retries += 1,
                Err(e) => {
                    return Err(IoError::Os {
                        layer,
                        expert,
                        offset,
                        errno: errno_of(&e),
                    });
                }
            }
        }
        self.index.verify(layer, expert, entry, req.dst)
    }

    fn read_in_order(&self, reqs: &mut [ReadRequest<'_>]) -> Vec<Result<(), IoError>> {
        reqs.iter_mut().map(|r| self.read_one(r)).collect()
    }
}

impl ExpertSource for PreadSource {
    fn name(&self) -> &'static str {
        "pread"
    }

    fn container(&self) -> &ContainerIndex {
        &self.index
    }

    fn read_blobs(&self, reqs: &mut [ReadRequest<'_>]) -> Vec<Result<(), IoError>> {
        let threads = self.threads.min(reqs.len());
        if threads <= 1 {
            return self.read_in_order(reqs);
        }
        let per_thread = reqs.len().div_ceil(threads);
        let mut chunks = reqs.chunks_mut(per_thread);
        let first = chunks.next().expect("at least two requests");
        std::thread::scope(|s| {
            let others: Vec<_> = chunks
                .map(|chunk| s.spawn(move || self.read_in_order(chunk)))
                .collect();
            let mut out = self.read_in_order(first);
            for handle in others {
                // A panic in a reader thread is a bug here, not bad input: propagate it.
                out.extend(
                    handle
                        .join()
                        .unwrap_or_else(|p| std::panic::resume_unwind(p)),
                );
            }
            out
        })
    }
}
