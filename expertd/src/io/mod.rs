//! Every expert read goes through one trait, [`ExpertSource`]: it reads a layer call's cache
//! misses (submitted together) into the caller's 4096-aligned buffers and verifies each blob's
//! checksum against its trailer and the index before reporting success.
//!
//! Implementations: [`uring::UringSource`] (the daemon's path; `uring.rs` is the only file that
//! touches io_uring), [`pread::PreadSource`] (the fallback, `--io pread`), [`mem::MemSource`]
//! (the container's bytes in memory, for tests) and [`faulty::FaultySource`] (wraps another
//! source and injects short reads, EIO and flipped bytes). [`open_source`] picks one, opens
//! the container with `O_DIRECT` where the filesystem allows it, and reports what it chose in
//! [`SourceInfo`] for the daemon to log.
//!
//! This module does not decide what to read, where the bytes go or how long they stay (that is
//! `expertd/src/cache/`), and does not view blobs as matrices (`shared::container::ExpertBlob`).

pub mod faulty;
pub mod mem;
pub mod pread;
#[cfg(test)]
mod tests;
pub mod uring;

pub use faulty::{Fault, FaultySource};
pub use mem::MemSource;
pub use pread::PreadSource;
pub use uring::{UringSource, UringSupport};

use rustix::io::Errno;
use shared::container::index::{parse_index, region_bytes};
use shared::container::layout::{ALIGNMENT, HEADER_BYTES};
use shared::container::{
    BlobAt, CONTAINER_FILE, ContainerError, ContainerFile, Header, IndexEntry, check_blob,
};
use shared::ids::{ExpertId, LayerId};
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// Alignment every destination buffer must have, and the granularity of `O_DIRECT` reads: the
/// container's blob alignment.
pub const BLOCK_BYTES: usize = ALIGNMENT as usize;

/// Reads of one blob retried after `EINTR` or `EAGAIN` before the read is reported as failed.
pub const MAX_RETRIES_PER_BLOB: u32 = 16;

/// One blob to read: (layer, expert) of the container into `dst`.
pub struct ReadRequest<'a> {
    /// Layer of the expert.
    pub layer: LayerId,
    /// Expert within the layer.
    pub expert: ExpertId,
    /// Where the blob goes: [`BLOCK_BYTES`]-aligned and exactly one blob stride long (what a
    /// cache lease hands out for a miss). Its contents are unspecified after a failed read.
    pub dst: &'a mut [u8],
}

/// Why one blob could not be read. Every variant names the layer and expert; the ones that
/// reached the file name its offset. No variant allocates, so the error path does not either.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum IoError {
    /// The bytes read do not match their checksum (trailer or index) or have non-zero padding:
    /// the file is corrupt at this blob. `detail` names what disagreed, and where.
    #[error("data loss: {detail}")]
    DataLoss {
        /// Layer.
        layer: LayerId,
        /// Expert.
        expert: ExpertId,
        /// File offset of the blob.
        offset: u64,
        /// The check that failed (`BlobChecksum` or `BlobPadding`).
        detail: ContainerError,
    },
    /// The file ended before the blob did (it shrank after it was opened and validated).
    #[error(
        "layer {layer} expert {expert}: short read of the blob at file offset {offset}: got {got} of {want} bytes (file truncated?)"
    )]
    ShortRead {
        /// Layer.
        layer: LayerId,
        /// Expert.
        expert: ExpertId,
        /// File offset of the blob.
        offset: u64,
        /// Bytes read before end of file.
        got: u64,
        /// Bytes of the blob.
        want: u64,
    },
    /// The operating system failed the read (`EIO`, …).
    #[error("layer {layer} expert {expert}: reading the blob at file offset {offset}: {}", std::io::Error::from_raw_os_error(*errno))]
    Os {
        /// Layer.
        layer: LayerId,
        /// Expert.
        expert: ExpertId,
        /// File offset of the blob.
        offset: u64,
        /// The `errno` value (`EIO`, …); the message is rendered from it.
        errno: i32,
    },
    /// The destination buffer breaks the request contract (a caller bug): it is not
    /// [`BLOCK_BYTES`]-aligned or not exactly one blob stride long. Nothing was read.
    #[error(
        "layer {layer} expert {expert}: destination buffer at {addr:#x} of {len} bytes is not a {BLOCK_BYTES}-aligned buffer of exactly one blob stride ({stride} bytes)"
    )]
    Unaligned {
        /// Layer.
        layer: LayerId,
        /// Expert.
        expert: ExpertId,
        /// Address of the buffer.
        addr: usize,
        /// Length of the buffer.
        len: usize,
        /// The blob stride the buffer must have.
        stride: usize,
    },
    /// The (layer, expert) is not in the container. Nothing was read.
    #[error("layer {layer} expert {expert} is not in the container")]
    OutOfRange {
        /// Requested layer.
        layer: LayerId,
        /// Requested expert.
        expert: ExpertId,
    },
}

impl IoError {
    /// A stable, low-cardinality name for metric labels and logs.
    pub fn error_type(&self) -> &'static str {
        match self {
            IoError::DataLoss { .. } => "data_loss",
            IoError::ShortRead { .. } => "short_read",
            IoError::Os { .. } => "os",
            IoError::Unaligned { .. } => "unaligned",
            IoError::OutOfRange { .. } => "out_of_range",
        }
    }
}

/// A reader of expert blobs. All implementations verify every blob they return.
pub trait ExpertSource: Send + Sync {
    /// `"io_uring"`, `"pread"`, `"mem"` or `"faulty"`.
    fn name(&self) -> &'static str;

    /// The validated header and index of the container being read.
    fn container(&self) -> &ContainerIndex;

    /// Bytes of one blob, padding included: the length every `dst` must have.
    fn blob_stride(&self) -> usize {
        self.container().stride()
    }

    /// Reads every request (all misses of one layer call submitted TOGETHER), verifies each
    /// blob's checksum against its trailer and the index, and returns one result per request,
    /// in order. A failed request does not affect the others. Blocks until every read has
    /// finished: no read is still writing into any `dst` when this returns (or unwinds).
    fn read_blobs(&self, reqs: &mut [ReadRequest<'_>]) -> Vec<Result<(), IoError>>;
}

/// `ExpertSource` through a smart pointer (`Box`, `Arc`): every method forwarded.
macro_rules! forward_expert_source {
    ($($ptr:ident)::+) => {
        impl<S: ExpertSource + ?Sized> ExpertSource for $($ptr)::+<S> {
            fn name(&self) -> &'static str {
                (**self).name()
            }
            fn container(&self) -> &ContainerIndex {
                (**self).container()
            }
            fn read_blobs(&self, reqs: &mut [ReadRequest<'_>]) -> Vec<Result<(), IoError>> {
                (**self).read_blobs(reqs)
            }
        }
    };
}
forward_expert_source!(Box);
forward_expert_source!(std::sync::Arc);

/// Which reader [`open_source`] should use (`--io`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum IoKind {
    /// io_uring: one read per blob, the whole batch in flight at once (falls back to `pread`
    /// when the kernel or a seccomp filter refuses io_uring).
    Uring,
    /// Plain `pread`, a few threads per batch.
    Pread,
}

impl std::fmt::Display for IoKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IoKind::Uring => "io_uring",
            IoKind::Pread => "pread",
        })
    }
}

/// What [`open_source`] set up, for the daemon's startup log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceInfo {
    /// The reader in use (may differ from the one asked for; see `fallback_reason`).
    pub kind: IoKind,
    /// Whether the container is read with `O_DIRECT` (bypassing the page cache).
    pub o_direct: bool,
    /// io_uring ring parameters and kernel feature flags (empty for `pread`).
    pub features: Vec<String>,
    /// Why io_uring or `O_DIRECT` was asked for but is not in use, if so.
    pub fallback_reason: Option<String>,
}

impl std::fmt::Display for SourceInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "io={} o_direct={}", self.kind, self.o_direct)?;
        if !self.features.is_empty() {
            write!(f, " features=[{}]", self.features.join(","))?;
        }
        if let Some(reason) = &self.fallback_reason {
            write!(f, " fallback: {reason}")?;
        }
        Ok(())
    }
}

/// How to open a source; [`open_source`] uses `o_direct: true`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceOptions {
    /// The reader to use.
    pub kind: IoKind,
    /// Open with `O_DIRECT` if the filesystem allows it (false: buffered, through the page
    /// cache; benchmarks of warm reads use it).
    pub o_direct: bool,
}

/// Opens `container_dir/experts.sluice` (validating its header, index and length) for reading
/// with `kind`, with `O_DIRECT` where the filesystem allows it.
pub fn open_source(
    container_dir: &Path,
    kind: IoKind,
) -> Result<(Box<dyn ExpertSource>, SourceInfo), ContainerError> {
    open_source_with(
        &container_dir.join(CONTAINER_FILE),
        SourceOptions {
            kind,
            o_direct: true,
        },
    )
}

/// Opens the container file `path` as `opts` says; see [`open_source`].
pub fn open_source_with(
    path: &Path,
    opts: SourceOptions,
) -> Result<(Box<dyn ExpertSource>, SourceInfo), ContainerError> {
    open_source_inner(path, opts, DirectProbe::Real, UringSupport::detect)
}

/// Whether to really try `O_DIRECT` or to act as if the filesystem refused it (tests: tmpfs
/// accepts `O_DIRECT` since Linux 6.6, so no local filesystem reliably refuses it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DirectProbe {
    Real,
    #[cfg(test)]
    Refuse,
}

pub(crate) fn open_source_inner(
    path: &Path,
    opts: SourceOptions,
    direct_probe: DirectProbe,
    detect_uring: impl FnOnce() -> Result<UringSupport, String>,
) -> Result<(Box<dyn ExpertSource>, SourceInfo), ContainerError> {
    let index = ContainerIndex::open(path)?;
    let data = DataFile::open(path, opts.o_direct, direct_probe)?;
    let mut reasons: Vec<String> = data.refused.iter().cloned().collect();
    let o_direct = data.o_direct;
    let source: Box<dyn ExpertSource>;
    let mut features = Vec::new();
    let kind = match opts.kind {
        IoKind::Uring => match detect_uring() {
            Ok(support) => {
                features = support.features().to_vec();
                source = Box::new(UringSource::new(index, data, support));
                IoKind::Uring
            }
            Err(reason) => {
                reasons.push(format!("io_uring unavailable ({reason}); using pread"));
                source = Box::new(PreadSource::new(index, data));
                IoKind::Pread
            }
        },
        IoKind::Pread => {
            source = Box::new(PreadSource::new(index, data));
            IoKind::Pread
        }
    };
    let fallback_reason = if reasons.is_empty() {
        None
    } else {
        Some(reasons.join("; "))
    };
    Ok((
        source,
        SourceInfo {
            kind,
            o_direct,
            features,
            fallback_reason,
        },
    ))
}

/// The validated header and index of an open container: where each blob is and what it must
/// hash to. Shared by every source; pure apart from [`ContainerIndex::open`].
#[derive(Debug, Clone)]
pub struct ContainerIndex {
    header: Header,
    entries: Vec<IndexEntry>,
}

impl ContainerIndex {
    /// Reads and validates the header, the index and the file length of the container file
    /// `path` (via [`ContainerFile::open_file`]).
    pub fn open(path: &Path) -> Result<ContainerIndex, ContainerError> {
        let file = ContainerFile::open_file(path)?;
        Ok(ContainerIndex {
            header: *file.header(),
            entries: file.index().to_vec(),
        })
    }

    /// Validates a whole container held in memory, as [`ContainerIndex::open`] does a file.
    pub fn from_bytes(bytes: &[u8]) -> Result<ContainerIndex, ContainerError> {
        let header = Header::parse(&bytes[..bytes.len().min(HEADER_BYTES)])?;
        if header.magic.is_unfinished() {
            return Err(ContainerError::Unfinished);
        }
        let layout = &header.layout;
        if bytes.len() as u64 != layout.file_bytes {
            return Err(ContainerError::FileLength {
                found: bytes.len() as u64,
                expected: layout.file_bytes,
            });
        }
        let start = layout.index_offset as usize;
        let entries = parse_index(&header, &bytes[start..start + region_bytes(layout)])?;
        Ok(ContainerIndex { header, entries })
    }

    /// The validated header (dimensions, layout, identity).
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Bytes of one blob, padding included.
    pub fn stride(&self) -> usize {
        self.header.layout.blob.stride
    }

    /// The index entry of (layer, expert), or `OutOfRange`.
    pub fn entry(&self, layer: LayerId, expert: ExpertId) -> Result<IndexEntry, IoError> {
        self.header
            .layout
            .blob_index(layer, expert)
            .map(|i| self.entries[i])
            .map_err(|_| IoError::OutOfRange { layer, expert })
    }

    /// Checks a request against the contract (in range; `dst` aligned and one stride long)
    /// and returns where its blob is.
    pub fn check_request(&self, req: &ReadRequest<'_>) -> Result<IndexEntry, IoError> {
        let entry = self.entry(req.layer, req.expert)?;
        let (addr, len, stride) = (req.dst.as_ptr() as usize, req.dst.len(), self.stride());
        if !addr.is_multiple_of(BLOCK_BYTES) || len != stride {
            return Err(IoError::Unaligned {
                layer: req.layer,
                expert: req.expert,
                addr,
                len,
                stride,
            });
        }
        Ok(entry)
    }

    /// Verifies a blob just read (trailer, index checksum, zero padding): `DataLoss` naming
    /// the layer, expert and file offset if any check fails.
    pub fn verify(
        &self,
        layer: LayerId,
        expert: ExpertId,
        entry: IndexEntry,
        bytes: &[u8],
    ) -> Result<(), IoError> {
        // PERF-CRITICAL: one xxh3 pass over every blob read from disk.
        let at = BlobAt {
            layer,
            expert,
            offset: entry.offset,
        };
        match check_blob(bytes, &self.header.layout.blob, at, Some(entry.checksum)) {
            Ok(_) => Ok(()),
            Err(detail) => Err(IoError::DataLoss {
                layer,
                expert,
                offset: entry.offset,
                detail,
            }),
        }
    }
}

/// The container file opened for blob reads: with `O_DIRECT` when asked and the filesystem
/// allows it, else buffered, with the reason.
#[derive(Debug)]
pub struct DataFile {
    file: File,
    o_direct: bool,
    refused: Option<String>,
}

impl DataFile {
    /// Opens `path` read-only; with `want_direct`, tries `O_DIRECT` and proves it with one
    /// aligned read of the header, falling back to buffered reads if either is refused.
    pub(crate) fn open(
        path: &Path,
        want_direct: bool,
        probe: DirectProbe,
    ) -> Result<DataFile, ContainerError> {
        let io_err = |e: std::io::Error| ContainerError::Io {
            path: path.to_path_buf(),
            message: e.to_string(),
        };
        let buffered = || File::open(path).map_err(io_err);
        if !want_direct {
            return Ok(DataFile {
                file: buffered()?,
                o_direct: false,
                refused: None,
            });
        }
        let direct = match probe {
            DirectProbe::Real => std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
                .open(path),
            #[cfg(test)]
            DirectProbe::Refuse => Err(Errno::INVAL.into()),
        };
        let refused = match direct {
            Ok(file) => {
                let mut page = AlignedBuf::zeroed(BLOCK_BYTES);
                match file.read_at(&mut page, 0) {
                    Ok(_) => {
                        return Ok(DataFile {
                            file,
                            o_direct: true,
                            refused: None,
                        });
                    }
                    // Some filesystems accept the open and refuse the aligned read instead.
                    Err(e) if Errno::from_io_error(&e) == Some(Errno::INVAL) => {
                        format!(
                            "O_DIRECT read refused by the filesystem ({e}); reading through the page cache"
                        )
                    }
                    Err(e) => return Err(io_err(e)),
                }
            }
            Err(e) if Errno::from_io_error(&e) == Some(Errno::INVAL) => {
                format!(
                    "O_DIRECT open refused by the filesystem ({e}); reading through the page cache"
                )
            }
            Err(e) => return Err(io_err(e)),
        };
        Ok(DataFile {
            file: buffered()?,
            o_direct: false,
            refused: Some(refused),
        })
    }

    /// Whether reads bypass the page cache.
    pub fn o_direct(&self) -> bool {
        self.o_direct
    }
}

/// `errno` of an `std::io::Error` (`EIO` if it carries none).
pub(crate) fn errno_of(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(Errno::IO.raw_os_error())
}

/// Whether a failed read is worth retrying as is.
pub(crate) fn retryable(errno: i32) -> bool {
    matches!(Errno::from_raw_os_error(errno), Errno::INTR | Errno::AGAIN)
}

/// One 4096-byte page; `AlignedBuf` is a vector of them, so its bytes are [`BLOCK_BYTES`]-aligned.
#[derive(Clone, Copy)]
#[repr(C, align(4096))]
struct Page([u8; BLOCK_BYTES]);

const _: () = assert!(size_of::<Page>() == BLOCK_BYTES && align_of::<Page>() == BLOCK_BYTES);

/// A zeroed, [`BLOCK_BYTES`]-aligned byte buffer, for tests, benchmarks and probes (the
/// daemon's buffers come from the cache arena). Split it into blob-stride chunks with
/// `chunks_exact_mut(stride)`: the stride is a multiple of [`BLOCK_BYTES`], so every chunk is
/// aligned.
pub struct AlignedBuf {
    pages: Vec<Page>,
    len: usize,
}

impl AlignedBuf {
    /// `len` zero bytes starting on a [`BLOCK_BYTES`] boundary.
    pub fn zeroed(len: usize) -> AlignedBuf {
        AlignedBuf {
            pages: vec![Page([0; BLOCK_BYTES]); len.div_ceil(BLOCK_BYTES)],
            len,
        }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `pages` holds `len.div_ceil(4096) * 4096 >= len` initialised bytes (`Page` is
        // `repr(C)` over a byte array, so it has no padding), borrowed for as long as `self`.
        unsafe { std::slice::from_raw_parts(self.pages.as_ptr().cast::<u8>(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and the borrow is unique because `self` is.
        unsafe { std::slice::from_raw_parts_mut(self.pages.as_mut_ptr().cast::<u8>(), self.len) }
    }
}
