//! [`UringSource`]: the daemon's expert reader, and the only file in the workspace that touches
//! io_uring. A layer call's misses go into one ring together — one `IORING_OP_READ` per blob,
//! straight into the caller's aligned buffer, `O_DIRECT` where the filesystem allows — and the
//! call blocks until every completion has been reaped. A read that comes back short is
//! resubmitted for its remainder; `EINTR`/`EAGAIN` are retried. Each blob is verified on the
//! calling thread as soon as its last byte lands, while the device works on the others.
//!
//! Buffer ownership: the buffers are borrowed from the caller for the duration of
//! [`ExpertSource::read_blobs`], and an [`InFlight`] guard counts every submitted read and, in
//! its `Drop`, waits for each outstanding completion — so neither an early return nor a panic
//! can end the borrow while the kernel may still write into a buffer.
//!
//! Rings: an `IoUring` is used by one thread at a time, so the source keeps a small pool of idle
//! rings behind a mutex (held only to take or return a ring, never across IO). A call that finds
//! the pool empty makes a new ring, so concurrent layer calls never wait for each other; at most
//! [`MAX_POOLED_RINGS`] idle rings are kept. (Thread-local rings would tie a ring to a thread
//! rather than to the open file, and leak one per thread that ever read.)
//!
//! Availability: [`UringSupport::detect`] creates a ring and probes for `IORING_OP_READ`; where
//! `io_uring_setup` is refused (seccomp in containers, `kernel.io_uring_disabled`, old kernels)
//! it returns the reason and `open_source` falls back to `pread`.

use super::{
    ContainerIndex, DataFile, ExpertSource, IoError, MAX_RETRIES_PER_BLOB, ReadRequest, errno_of,
    retryable,
};
use io_uring::{IoUring, Probe, opcode, types};
use rustix::io::Errno;
use shared::container::IndexEntry;
use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::sync::{Mutex, PoisonError};

/// Submission-queue entries per ring: the most blob reads in flight at once from one call. A
/// decode step's layer call misses at most top_k × tokens experts; 64 covers a batch of 8
/// tokens at top-8 in one submission, and a larger batch streams through the ring (a finished
/// read's slot is refilled at once). The completion queue is twice this (the kernel default),
/// so it cannot overflow.
pub const RING_ENTRIES: u32 = 64;

/// Most idle rings a source keeps for reuse (one per concurrent layer call; the daemon runs a
/// few at most). Rings made beyond this while calls overlap are dropped after use.
pub const MAX_POOLED_RINGS: usize = 4;

/// Consecutive failed waits on a ring with reads in flight before the process aborts: past that
/// the kernel may still write into buffers we cannot keep borrowing, and returning would be
/// unsound.
const DRAIN_MAX_FAILURES: u32 = 1000;

/// Proof that io_uring works here (holding one means a ring was created and `IORING_OP_READ` is
/// supported), with the kernel's features for the startup log.
pub struct UringSupport {
    ring: IoUring,
    features: Vec<String>,
}

impl UringSupport {
    /// Creates a ring and probes it; `Err` is a one-line reason to log when io_uring cannot be
    /// used (`io_uring_setup` blocked by seccomp or `kernel.io_uring_disabled`: EPERM; kernel
    /// without io_uring: ENOSYS; ring memory over `RLIMIT_MEMLOCK`: ENOMEM; no `IORING_OP_READ`).
    pub fn detect() -> Result<UringSupport, String> {
        let ring = IoUring::new(RING_ENTRIES).map_err(|e| setup_error(&e))?;
        let mut probe = Probe::new();
        ring.submitter().register_probe(&mut probe).map_err(|e| {
            format!("IORING_REGISTER_PROBE failed ({e}); the kernel is older than 5.6")
        })?;
        if !probe.is_supported(opcode::Read::CODE) {
            return Err("the kernel does not support IORING_OP_READ (needs Linux 5.6)".to_string());
        }
        let p = ring.params();
        let mut features = vec![
            format!("sq_entries={}", p.sq_entries()),
            format!("cq_entries={}", p.cq_entries()),
        ];
        let flags = [
            (p.is_feature_single_mmap(), "single_mmap"),
            (p.is_feature_nodrop(), "nodrop"),
            (p.is_feature_submit_stable(), "submit_stable"),
            (p.is_feature_rw_cur_pos(), "rw_cur_pos"),
            (p.is_feature_cur_personality(), "cur_personality"),
            (p.is_feature_fast_poll(), "fast_poll"),
            (p.is_feature_poll_32bits(), "poll_32bits"),
            (p.is_feature_sqpoll_nonfixed(), "sqpoll_nonfixed"),
            (p.is_feature_ext_arg(), "ext_arg"),
            (p.is_feature_native_workers(), "native_workers"),
            (p.is_feature_resource_tagging(), "resource_tagging"),
            (p.is_feature_skip_cqe_on_success(), "cqe_skip"),
            (p.is_feature_linked_file(), "linked_file"),
            (p.is_feature_recvsend_bundle(), "recvsend_bundle"),
            (p.is_feature_min_timeout(), "min_timeout"),
            (p.is_feature_no_iowait(), "no_iowait"),
            (probe.is_supported(opcode::Read::CODE), "op_read"),
            (probe.is_supported(opcode::ReadFixed::CODE), "op_read_fixed"),
        ];
        features.extend(
            flags
                .iter()
                .filter(|(on, _)| *on)
                .map(|(_, name)| name.to_string()),
        );
        Ok(UringSupport { ring, features })
    }

    /// Ring sizes and kernel feature names (`nodrop`, `fast_poll`, `op_read`, …).
    pub fn features(&self) -> &[String] {
        &self.features
    }
}

fn setup_error(e: &std::io::Error) -> String {
    let disabled =
        std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled").map(|s| s.trim().to_string());
    match Errno::from_io_error(e) {
        Some(Errno::PERM) => match disabled {
            Ok(v) if v != "0" => format!("io_uring_setup: {e}; kernel.io_uring_disabled = {v}"),
            _ => {
                format!("io_uring_setup: {e}; blocked by a seccomp filter or a container runtime?")
            }
        },
        Some(Errno::NOSYS) => format!(
            "io_uring_setup: {e}; kernel built without io_uring, or the syscall is filtered"
        ),
        Some(Errno::NOMEM) => format!("io_uring_setup: {e}; RLIMIT_MEMLOCK too low for the ring?"),
        _ => format!("io_uring_setup: {e}"),
    }
}

/// Reads blobs through io_uring.
pub struct UringSource {
    index: ContainerIndex,
    data: DataFile,
    /// Idle rings. A std mutex: it is held only to pop or push a ring (no IO, no await), and a
    /// caller that finds it empty makes a ring instead of waiting.
    rings: Mutex<Vec<IoUring>>,
    /// Largest single read; smaller than a blob only in tests, to exercise the resubmission of
    /// short reads. A multiple of 4096 so `O_DIRECT` accepts the remainder.
    max_sqe_bytes: u32,
    /// Tests: panic right after the first submission, with every read in flight, to prove the
    /// guard waits for them while unwinding.
    #[cfg(test)]
    panic_in_flight: bool,
}

impl std::fmt::Debug for UringSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringSource")
            .field("data", &self.data)
            .finish_non_exhaustive()
    }
}

/// One blob read in progress.
struct Op {
    /// Index into the caller's requests.
    req: usize,
    entry: IndexEntry,
    /// Bytes read so far.
    done: usize,
    retries: u32,
    /// Submitted and not yet reaped.
    in_flight: bool,
}

/// Completions reaped by `InFlight::drain` (tests: proof that unwinding waited for them).
#[cfg(test)]
pub(crate) static DRAINED_READS: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// Counts reads submitted to `ring` and not yet reaped; dropping it waits for all of them.
struct InFlight<'r> {
    ring: &'r mut IoUring,
    count: usize,
}

impl InFlight<'_> {
    /// Waits for every outstanding completion and discards it. Returns false if the ring had
    /// to be given up with reads that the kernel never saw (still in the submission queue),
    /// which is safe: the kernel only reads the queue inside `io_uring_enter`.
    fn drain(&mut self) -> bool {
        let mut failures = 0;
        while self.count > 0 {
            if let Err(e) = self.ring.submit_and_wait(1) {
                let errno = errno_of(&e);
                if !retryable(errno) && errno != Errno::BUSY.raw_os_error() {
                    if self.ring.submission().len() == self.count {
                        self.count = 0;
                        return false;
                    }
                    failures += 1;
                    if failures > DRAIN_MAX_FAILURES {
                        eprintln!(
                            "expertd: io_uring: cannot reap {} reads in flight ({e}); aborting",
                            self.count
                        );
                        std::process::abort();
                    }
                }
            }
            let reaped = self.ring.completion().count();
            self.count -= reaped;
            #[cfg(test)]
            DRAINED_READS.fetch_add(reaped, std::sync::atomic::Ordering::Relaxed);
        }
        true
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.count > 0 {
            self.drain();
        }
    }
}

impl UringSource {
    /// A reader over an opened container, starting with `support`'s ring in its pool.
    pub fn new(index: ContainerIndex, data: DataFile, support: UringSupport) -> UringSource {
        UringSource {
            index,
            data,
            rings: Mutex::new(vec![support.ring]),
            max_sqe_bytes: u32::MAX,
            #[cfg(test)]
            panic_in_flight: false,
        }
    }

    /// Whether reads bypass the page cache.
    pub fn o_direct(&self) -> bool {
        self.data.o_direct()
    }

    #[cfg(test)]
    pub(crate) fn with_max_sqe_bytes(mut self, n: u32) -> UringSource {
        assert!(
            n > 0 && (n as usize).is_multiple_of(super::BLOCK_BYTES),
            "O_DIRECT needs 4096-byte pieces"
        );
        self.max_sqe_bytes = n;
        self
    }

    #[cfg(test)]
    pub(crate) fn with_panic_in_flight(mut self) -> UringSource {
        self.panic_in_flight = true;
        self
    }

    /// Idle rings in the pool (tests).
    #[cfg(test)]
    pub(crate) fn pooled_rings(&self) -> usize {
        self.rings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    fn take_ring(&self) -> std::io::Result<IoUring> {
        let pooled = self
            .rings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        match pooled {
            Some(ring) => Ok(ring),
            None => IoUring::new(RING_ENTRIES),
        }
    }

    fn put_ring(&self, ring: IoUring) {
        let mut rings = self.rings.lock().unwrap_or_else(PoisonError::into_inner);
        if rings.len() < MAX_POOLED_RINGS {
            rings.push(ring);
        }
    }

    fn os_error(reqs: &[ReadRequest<'_>], op: &Op, errno: i32) -> IoError {
        let r = &reqs[op.req];
        IoError::Os {
            layer: r.layer,
            expert: r.expert,
            offset: op.entry.offset,
            errno,
        }
    }

    /// Reads every op; returns false if the ring failed and must not be reused.
    // PERF-CRITICAL: every cache miss of every layer call goes through this loop.
    fn run(
        &self,
        ring: &mut IoUring,
        reqs: &mut [ReadRequest<'_>],
        ops: &mut [Op],
        results: &mut [Result<(), IoError>],
    ) -> bool {
        let fd = types::Fd(self.data.file.as_raw_fd());
        let max_in_flight =
            (ring.params().sq_entries().min(ring.params().cq_entries()) as usize).max(1);
        let mut queue: VecDeque<usize> = (0..ops.len()).collect();
        let mut finished: Vec<usize> = Vec::with_capacity(ops.len());
        let mut failed_errno = None;
        let mut guard = InFlight { ring, count: 0 };
        loop {
            while guard.count < max_in_flight {
                let Some(k) = queue.pop_front() else { break };
                let op = &mut ops[k];
                let dst = &mut reqs[op.req].dst[op.done..];
                // Fits: a blob is at most 1 GiB (`MAX_BLOB_BYTES`).
                let len = dst.len().min(self.max_sqe_bytes as usize) as u32;
                let sqe = opcode::Read::new(fd, dst.as_mut_ptr(), len)
                    .offset(op.entry.offset + op.done as u64)
                    .build()
                    .user_data(k as u64);
                // SAFETY: the entry points at `len` bytes of `reqs[op.req].dst`, which the caller
                // lent us mutably for this whole call and which nothing else touches until this
                // read's completion is reaped. The read is counted in `guard` as soon as it is
                // pushed, and this function cannot return or unwind past `guard` while the
                // count is non-zero: `InFlight::drop` waits for every completion (or aborts the
                // process if the kernel cannot be waited on). So the kernel never writes into
                // the buffer after the borrow ends. `fd` is `self.data.file`, open while `self`
                // lives, which outlasts this call.
                let pushed = unsafe { guard.ring.submission().push(&sqe) };
                pushed.expect("in-flight reads never exceed the submission queue");
                op.in_flight = true;
                guard.count += 1;
            }
            if guard.count == 0 && finished.is_empty() {
                break;
            }
            #[cfg(test)]
            if self.panic_in_flight {
                let _ = guard.ring.submit();
                panic!("test: panic with {} reads in flight", guard.count);
            }
            if guard.count > 0 {
                // Wait for a completion only when there is no checksum work to overlap with.
                let want = usize::from(finished.is_empty());
                if let Err(e) = guard.ring.submit_and_wait(want) {
                    let errno = errno_of(&e);
                    if !retryable(errno) && errno != Errno::BUSY.raw_os_error() {
                        failed_errno = Some(errno);
                        break;
                    }
                }
            }
            for k in finished.drain(..) {
                let (op, r) = (&ops[k], &reqs[ops[k].req]);
                results[op.req] = self.index.verify(r.layer, r.expert, op.entry, r.dst);
            }
            for cqe in guard.ring.completion() {
                guard.count -= 1;
                let k = cqe.user_data() as usize;
                let op = &mut ops[k];
                op.in_flight = false;
                let res = cqe.result();
                let want = reqs[op.req].dst.len();
                if res < 0 {
                    if retryable(-res) && op.retries < MAX_RETRIES_PER_BLOB {
                        op.retries += 1;
                        queue.push_back(k);
                    } else {
                        results[op.req] = Err(Self::os_error(reqs, op, -res));
                    }
                } else if res == 0 {
                    let r = &reqs[op.req];
                    let (got, want) = (op.done as u64, want as u64);
                    results[op.req] = Err(IoError::ShortRead {
                        layer: r.layer,
                        expert: r.expert,
                        offset: op.entry.offset,
                        got,
                        want,
                    });
                } else {
                    op.done += res as usize;
                    if op.done < want {
                        queue.push_back(k);
                    } else {
                        finished.push(k);
                    }
                }
            }
        }
        let Some(errno) = failed_errno else {
            return true;
        };
        // The ring failed: wait out what the kernel has, then fail every read not finished.
        guard.drain();
        for (k, op) in ops.iter().enumerate() {
            if op.in_flight || queue.contains(&k) {
                results[op.req] = Err(Self::os_error(reqs, op, errno));
            }
        }
        for k in finished {
            let (op, r) = (&ops[k], &reqs[ops[k].req]);
            results[op.req] = self.index.verify(r.layer, r.expert, op.entry, r.dst);
        }
        false
    }
}

impl ExpertSource for UringSource {
    fn name(&self) -> &'static str {
        "io_uring"
    }

    fn container(&self) -> &ContainerIndex {
        &self.index
    }

    fn read_blobs(&self, reqs: &mut [ReadRequest<'_>]) -> Vec<Result<(), IoError>> {
        let mut results = Vec::with_capacity(reqs.len());
        let mut ops = Vec::with_capacity(reqs.len());
        for (i, r) in reqs.iter().enumerate() {
            match self.index.check_request(r) {
                Ok(entry) => {
                    results.push(Ok(()));
                    ops.push(Op {
                        req: i,
                        entry,
                        done: 0,
                        retries: 0,
                        in_flight: false,
                    });
                }
                Err(e) => results.push(Err(e)),
            }
        }
        if ops.is_empty() {
            return results;
        }
        let mut ring = match self.take_ring() {
            Ok(ring) => ring,
            Err(e) => {
                for op in &ops {
                    results[op.req] = Err(Self::os_error(reqs, op, errno_of(&e)));
                }
                return results;
            }
        };
        if self.run(&mut ring, reqs, &mut ops, &mut results) {
            self.put_ring(ring);
        }
        results
    }
}
