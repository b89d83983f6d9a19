//! [`FaultySource`]: wraps another [`ExpertSource`] and injects failures for chosen (layer,
//! expert) pairs — a short read, `EIO`, or a flipped byte that the real checksum verification
//! then catches — so tests can assert exactly how each one surfaces (as `IoError` here, as a
//! gRPC status in the server). Requests without a fault go to the inner source unchanged, in
//! the same batch.
//!
//! A test double: nothing in the daemon's read path uses it.

use super::{ContainerIndex, ExpertSource, IoError, ReadRequest};
use rustix::io::Errno;
use shared::ids::{ExpertId, LayerId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

/// A failure to inject into every read of one (layer, expert) until cleared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The file ends `got` bytes into the blob: the read returns [`IoError::ShortRead`] and the
    /// bytes after `got` are zeroed.
    ShortRead {
        /// Bytes delivered before the (simulated) end of file.
        got: u64,
    },
    /// The device fails the read: [`IoError::Os`] with `EIO`; the inner source is not asked.
    Eio,
    /// Byte `at` of the blob (modulo the stride) arrives with every bit flipped; the
    /// container's own verification then reports [`IoError::DataLoss`].
    FlipByte {
        /// Offset inside the blob.
        at: usize,
    },
}

/// An [`ExpertSource`] that fails the reads it was told to.
#[derive(Debug)]
pub struct FaultySource<S> {
    inner: S,
    /// Faults by (layer, expert). A std mutex: tests change it rarely, and each batch holds it
    /// only to copy out the faults of its requests, never across a read.
    faults: Mutex<HashMap<(LayerId, ExpertId), Fault>>,
    /// Faults injected so far; relaxed, it orders nothing.
    injected: AtomicU64,
}

impl<S: ExpertSource> FaultySource<S> {
    /// Wraps `inner` with no faults yet.
    pub fn new(inner: S) -> FaultySource<S> {
        FaultySource {
            inner,
            faults: Mutex::new(HashMap::new()),
            injected: AtomicU64::new(0),
        }
    }

    /// Adds a fault for (layer, expert) (builder form of [`FaultySource::set_fault`]).
    pub fn with_fault(self, layer: LayerId, expert: ExpertId, fault: Fault) -> FaultySource<S> {
        self.set_fault(layer, expert, Some(fault));
        self
    }

    /// Sets (`Some`) or clears (`None`) the fault of (layer, expert).
    pub fn set_fault(&self, layer: LayerId, expert: ExpertId, fault: Option<Fault>) {
        let mut faults = self.faults.lock().unwrap_or_else(PoisonError::into_inner);
        match fault {
            Some(f) => faults.insert((layer, expert), f),
            None => faults.remove(&(layer, expert)),
        };
    }

    /// How many faults have been injected.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    /// The wrapped source.
    pub fn inner(&self) -> &S {
        &self.inner
    }
}

impl<S: ExpertSource> ExpertSource for FaultySource<S> {
    fn name(&self) -> &'static str {
        "faulty"
    }

    fn container(&self) -> &ContainerIndex {
        self.inner.container()
    }

    fn read_blobs(&self, reqs: &mut [ReadRequest<'_>]) -> Vec<Result<(), IoError>> {
        let faults: Vec<Option<Fault>> = {
            let map = self.faults.lock().unwrap_or_else(PoisonError::into_inner);
            reqs.iter()
                .map(|r| map.get(&(r.layer, r.expert)).copied())
                .collect()
        };
        let container = self.inner.container();
        let mut results: Vec<Option<Result<(), IoError>>> = vec![None; reqs.len()];
        // Contract errors come first, as from a real source; EIO needs no read at all.
        let mut forwarded = Vec::with_capacity(reqs.len());
        for (i, r) in reqs.iter().enumerate() {
            match (container.check_request(r), faults[i]) {
                (Err(e), _) => results[i] = Some(Err(e)),
                (Ok(entry), Some(Fault::Eio)) => {
                    self.injected.fetch_add(1, Ordering::Relaxed);
                    let (layer, expert, offset) = (r.layer, r.expert, entry.offset);
                    results[i] = Some(Err(IoError::Os {
                        layer,
                        expert,
                        offset,
                        errno: Errno::IO.raw_os_error(),
                    }));
                }
                (Ok(_), _) => forwarded.push(i),
            }
        }
        let inner_results = {
            let mut sub: Vec<ReadRequest<'_>> = Vec::with_capacity(forwarded.len());
            let mut next = forwarded.iter().peekable();
            for (i, r) in reqs.iter_mut().enumerate() {
                if next.next_if(|&&f| f == i).is_some() {
                    sub.push(ReadRequest {
                        layer: r.layer,
                        expert: r.expert,
                        dst: &mut *r.dst,
                    });
                }
            }
            self.inner.read_blobs(&mut sub)
        };
        for (&i, inner) in forwarded.iter().zip(inner_results) {
            let r = &mut reqs[i];
            results[i] = Some(match (inner, faults[i]) {
                (Ok(()), Some(fault)) => {
                    self.injected.fetch_add(1, Ordering::Relaxed);
                    let entry = container.entry(r.layer, r.expert).expect("checked above");
                    match fault {
                        Fault::ShortRead { got } => {
                            let got = got.min(r.dst.len() as u64);
                            r.dst[got as usize..].fill(0);
                            let (layer, expert, offset, want) =
                                (r.layer, r.expert, entry.offset, r.dst.len() as u64);
                            Err(IoError::ShortRead {
                                layer,
                                expert,
                                offset,
                                got,
                                want,
                            })
                        }
                        Fault::FlipByte { at } => {
                            let at = at % r.dst.len();
                            r.dst[at] ^= 0xff;
                            container.verify(r.layer, r.expert, entry, r.dst)
                        }
                        Fault::Eio => unreachable!("EIO requests are not forwarded"),
                    }
                }
                (inner, _) => inner,
            });
        }
        results
            .into_iter()
            .map(|r| r.expect("every request has a result"))
            .collect()
    }
}
