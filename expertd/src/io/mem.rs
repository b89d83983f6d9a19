//! [`MemSource`]: a whole container held in memory, for tests of the cache and the server that
//! should not touch a disk. It checks requests and verifies blobs exactly as the disk readers
//! do, and counts the blobs it copied so tests can tell hits from misses.

use super::{ContainerIndex, ExpertSource, IoError, ReadRequest};
use shared::container::ContainerError;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Serves blobs from the container's bytes in memory.
#[derive(Debug)]
pub struct MemSource {
    index: ContainerIndex,
    bytes: Vec<u8>,
    /// Blobs copied out (successful or not), for tests; relaxed, it orders nothing.
    blob_reads: AtomicU64,
}

impl MemSource {
    /// Reads the container file `path` into memory (test-sized containers only) and validates
    /// it as [`ContainerIndex::open`] does.
    pub fn open(path: &Path) -> Result<MemSource, ContainerError> {
        let bytes = std::fs::read(path).map_err(|e| ContainerError::Io {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        MemSource::from_bytes(bytes)
    }

    /// A source over a container's bytes; the header, index and length are validated now and
    /// the blobs on each read (so a test may hand in a container with a corrupt blob).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<MemSource, ContainerError> {
        let index = ContainerIndex::from_bytes(&bytes)?;
        Ok(MemSource {
            index,
            bytes,
            blob_reads: AtomicU64::new(0),
        })
    }

    /// Blobs copied out so far.
    pub fn blob_reads(&self) -> u64 {
        self.blob_reads.load(Ordering::Relaxed)
    }

    fn read_one(&self, req: &mut ReadRequest<'_>) -> Result<(), IoError> {
        let entry = self.index.check_request(req)?;
        self.blob_reads.fetch_add(1, Ordering::Relaxed);
        // In bounds: `from_bytes` checked the length and the index entries against the layout.
        let start = entry.offset as usize;
        req.dst
            .copy_from_slice(&self.bytes[start..start + req.dst.len()]);
        self.index.verify(req.layer, req.expert, entry, req.dst)
    }
}

impl ExpertSource for MemSource {
    fn name(&self) -> &'static str {
        "mem"
    }

    fn container(&self) -> &ContainerIndex {
        &self.index
    }

    fn read_blobs(&self, reqs: &mut [ReadRequest<'_>]) -> Vec<Result<(), IoError>> {
        reqs.iter_mut().map(|r| self.read_one(r)).collect()
    }
}
