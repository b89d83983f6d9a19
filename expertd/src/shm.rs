//! The daemon's side of the shared-memory transport: the pre-handshake on a freshly accepted
//! unix connection (receive the client's memfd with SCM_RIGHTS, check it, map it, reply with a
//! segment id), the mapped [`Segment`] that calls copy activations out of and outputs into, and
//! [`PrefixedStream`], which gives back to HTTP/2 the bytes read while telling a plain gRPC
//! client (no pre-handshake) from a sluice client.
//!
//! Frame and header layouts are `shared::shm_layout` (pure); the client's side is
//! `hostd/src/expert_client/shm.rs`. A segment lives exactly as long as its connection: the
//! mapping and the fd are dropped with the connection, so a client that exits (or is killed)
//! releases it, and it is never a file anyone else can open.

use rustix::fs::SealFlags;
use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
use shared::ring::{RingLayout, RingView};
use shared::shm_layout::{self, Hello, HelloReply, SegmentHeader, ShmLayoutError, ShmSlice};
use std::io::IoSliceMut;
use std::mem::MaybeUninit;
use std::ops::Range;
use std::os::fd::{AsFd, OwnedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, Interest, ReadBuf};
use tokio::net::UnixStream;

// Activations are copied as little-endian f32 bytes in place.
#[cfg(target_endian = "big")]
compile_error!(
    "expertd's shared-memory transport copies little-endian f32 in place; big-endian hosts are unsupported"
);

/// How long a new unix connection may take to send its first bytes (hello or HTTP/2 preface).
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a segment or a pre-handshake was refused.
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    /// The socket failed or closed during the pre-handshake.
    #[error("pre-handshake: {0}")]
    Io(#[from] std::io::Error),
    /// The client sent no bytes within [`HELLO_TIMEOUT`].
    #[error("pre-handshake: no bytes within {0:?}")]
    Timeout(Duration),
    /// A malformed frame or segment header.
    #[error("pre-handshake: {0}")]
    Layout(#[from] ShmLayoutError),
    /// The hello said a segment was attached but no descriptor arrived.
    #[error("pre-handshake: the hello announced a segment but carried no file descriptor")]
    NoDescriptor,
    /// The descriptor is not a sealed memfd-like regular file.
    #[error("segment descriptor refused: {0}")]
    Refused(String),
    /// A slice names another segment than this connection's.
    #[error(
        "shared-memory slice names segment {found}, but this connection's segment is {expected}"
    )]
    WrongSegment {
        /// The segment id in the request.
        found: u64,
        /// This connection's segment id (0: none).
        expected: u64,
    },
    /// A slice that is misaligned or out of the segment.
    #[error("shared-memory slice: {0}")]
    Slice(ShmLayoutError),
    /// A segment larger than this daemon maps for one connection.
    #[error(
        "segment of {found} B refused: this daemon maps at most {max} B per connection (expertd serve --max-segment-bytes)"
    )]
    TooLarge {
        /// The segment's size.
        found: u64,
        /// The cap.
        max: u64,
    },
    /// A segment whose pages the client has not allocated: the daemon's writes would allocate
    /// them and charge them to the daemon's memory.
    #[error(
        "segment refused: its bytes from offset {hole} are not allocated (of {len}); the client must write every page of the memfd before passing it, so that its pages are allocated and charged to the client"
    )]
    NotAllocated {
        /// Offset of the first unallocated byte.
        hole: u64,
        /// The segment's size.
        len: u64,
    },
}

/// What a connection's segment may be: checked before it is mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentPolicy {
    /// The largest segment mapped, in bytes (`expertd serve --max-segment-bytes`).
    pub max_bytes: u64,
}

impl SegmentPolicy {
    /// Slots for the default cap: twice hostd's default of two.
    pub const DEFAULT_SLOTS: usize = 4;
    /// Rows per slot for the default cap: twice hostd's default of 1024.
    pub const DEFAULT_ROWS: usize = 2048;
    /// Experts per row the default cap's ring holds (twice the model's 8).
    pub const DEFAULT_TOP_K: usize = 16;

    /// The default cap for activations of `hidden` values:
    /// the segment of [`DEFAULT_SLOTS`](Self::DEFAULT_SLOTS) slots of up to
    /// [`DEFAULT_ROWS`](Self::DEFAULT_ROWS) rows with a ring of
    /// [`DEFAULT_TOP_K`](Self::DEFAULT_TOP_K) experts per row: room for hostd's defaults twice
    /// over, a small multiple of what a client can use, never the 64 GiB the layout allows.
    pub fn derived(hidden: usize) -> SegmentPolicy {
        // Not tied to --max-rows-per-call: a client sizes its segment before it learns the
        // daemon's limits, and calls past them travel inline anyway.
        let rows = Self::DEFAULT_ROWS;
        let max_bytes = shm_layout::SlotLayout::new(Self::DEFAULT_SLOTS, rows, hidden.max(1))
            .and_then(|l| l.with_ring(rows * Self::DEFAULT_TOP_K))
            .map_or(shm_layout::MAX_SEGMENT_BYTES, |l| l.segment_bytes);
        SegmentPolicy { max_bytes }
    }
}

/// Where a segment's slices may lie: its id, its length, and the end of its data area (the
/// call ring's offset, or the length when it has no ring). Plain values, so that checking a
/// slice needs no mapping (the ring fuzz target checks entries against the same bounds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentBounds {
    /// The segment's id.
    pub id: u64,
    /// Its length in bytes.
    pub len: u64,
    /// Where its data area ends.
    pub data_end: u64,
}

impl SegmentBounds {
    /// Checks a request's slice and returns its byte range: this segment's, inside it, past the
    /// header and ending before the call ring (if any).
    pub fn range(&self, slice: &ShmSlice) -> Result<Range<usize>, ShmError> {
        if slice.segment_id != self.id {
            return Err(ShmError::WrongSegment {
                found: slice.segment_id,
                expected: self.id,
            });
        }
        slice
            .range_in_data(self.len, self.data_end)
            .map_err(ShmError::Slice)
    }
}

/// A client's memfd, mapped shared and read-write. Owns the fd and the mapping; both are
/// released when the last `Arc<Segment>` (held by the connection and by in-flight calls) drops.
pub struct Segment {
    id: u64,
    len: u64,
    map: memmap2::MmapRaw,
    _fd: OwnedFd,
    /// The MoE-call ring the header announces, if any.
    ring: Option<RingLayout>,
    /// Set once a session's worker serves the ring (one worker per ring).
    ring_taken: AtomicBool,
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment")
            .field("id", &self.id)
            .field("len", &self.len)
            .finish()
    }
}

impl Segment {
    /// Checks and maps a received descriptor: a regular file (memfd) whose size is within the
    /// layout's limits and sealed against shrinking (so no access to the mapping can fault),
    /// whose header agrees with its size.
    ///
    /// The seal is checked *before* the size is read: a seal can never be removed, so once
    /// `F_SEAL_SHRINK` is seen the size read afterwards is a floor for as long as the mapping
    /// lives. In the other order a client still holding the fd could shrink and seal between the
    /// two reads, and the daemon would map the old size and take SIGBUS past the new end.
    ///
    /// The segment must be within `policy`'s size cap and wholly allocated by the client (no
    /// hole, by `SEEK_HOLE`): pages the client allocated are charged to the client's memory, so
    /// a client cannot make the daemon's writes allocate (and its cgroup pay for) a large,
    /// untouched segment. Once mapped, the daemon seals the file with `F_SEAL_FUTURE_WRITE`
    /// (checking for holes only after that), so the client cannot punch pages out later either
    /// (a memfd already sealed with `F_SEAL_SEAL` is refused: it could not be protected).
    pub fn from_fd(id: u64, fd: OwnedFd, policy: SegmentPolicy) -> Result<Segment, ShmError> {
        Segment::from_fd_observed(id, fd, policy, |_| {})
    }

    /// [`Segment::from_fd`], calling `after_seal_check` between the seal check and the size read
    /// (where a racing client would act; the tests put a shrink there).
    fn from_fd_observed(
        id: u64,
        fd: OwnedFd,
        policy: SegmentPolicy,
        after_seal_check: impl FnOnce(&OwnedFd),
    ) -> Result<Segment, ShmError> {
        let refused = |what: String| ShmError::Refused(what);
        let seals = rustix::fs::fcntl_get_seals(&fd)
            .map_err(|e| refused(format!("not a sealable memfd: {e}")))?;
        if !seals.contains(SealFlags::SHRINK) {
            return Err(refused(
                "the memfd is not sealed against shrinking (F_SEAL_SHRINK)".into(),
            ));
        }
        after_seal_check(&fd);
        let stat = rustix::fs::fstat(&fd).map_err(|e| refused(format!("fstat: {e}")))?;
        if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
            return Err(refused("not a regular file (expected a memfd)".into()));
        }
        let len = u64::try_from(stat.st_size)
            .map_err(|_| refused(format!("negative size {}", stat.st_size)))?;
        if !(shm_layout::MIN_SEGMENT_BYTES..=shm_layout::MAX_SEGMENT_BYTES).contains(&len) {
            return Err(ShmLayoutError::SegmentSize {
                found: len,
                min: shm_layout::MIN_SEGMENT_BYTES,
                max: shm_layout::MAX_SEGMENT_BYTES,
            }
            .into());
        }
        if len > policy.max_bytes {
            return Err(ShmError::TooLarge {
                found: len,
                max: policy.max_bytes,
            });
        }
        let file = std::fs::File::from(fd.try_clone().map_err(ShmError::Io)?);
        let map = memmap2::MmapOptions::new()
            .len(len as usize)
            .map_raw(&file)
            .map_err(ShmError::Io)?;
        // Mapped: now nobody may punch a page out of the file any more (`fallocate` and
        // `MADV_REMOVE` need no new mapping, but shmem refuses both once this seal is set), so
        // every page the daemon writes stays the client's allocated page. Existing mappings,
        // the client's and this one, stay writable; new writable mappings and `write(2)` are
        // refused from here on.
        rustix::fs::fcntl_add_seals(&fd, SealFlags::FUTURE_WRITE).map_err(|e| {
            refused(format!(
                "could not seal it against writes through new mappings (F_SEAL_FUTURE_WRITE: {e}); \
                 leave F_SEAL_SEAL off so that the daemon can add it"
            ))
        })?;
        // The first hole at or after 0 is the end of the file when every page is allocated;
        // checked after the seal, so no hole can appear once the check has passed.
        let hole = rustix::fs::seek(&fd, rustix::fs::SeekFrom::Hole(0))
            .map_err(|e| refused(format!("SEEK_HOLE: {e}")))?;
        if hole < len {
            return Err(ShmError::NotAllocated { hole, len });
        }
        let mut segment = Segment {
            id,
            len,
            map,
            _fd: fd,
            ring: None,
            ring_taken: AtomicBool::new(false),
        };
        let mut header = [0u8; shm_layout::SEGMENT_HEADER_BYTES];
        segment.copy_out(0..header.len(), &mut header);
        segment.ring = SegmentHeader::parse(&header, len)?.ring;
        Ok(segment)
    }

    /// The id requests name this segment by.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The segment's size in bytes.
    pub fn len_bytes(&self) -> u64 {
        self.len
    }

    /// The segment's call ring, for the first session that asks (one worker per ring); `None`
    /// when the header announced none or another session already serves it.
    pub fn take_ring(&self) -> Option<RingView> {
        let layout = self.ring?;
        if self.ring_taken.swap(true, Ordering::AcqRel) {
            return None;
        }
        // SAFETY: the header's ring layout was checked against the mapping's length when the
        // segment was mapped (`SegmentHeader::parse` → `RingLayout::check`); the mapping is
        // page-aligned and shrink-sealed, and the worker that uses the view holds an `Arc` of
        // this segment for as long as it runs.
        Some(unsafe { RingView::new(self.map.as_mut_ptr(), layout) })
    }

    /// Where this segment's slices may lie.
    pub fn bounds(&self) -> SegmentBounds {
        SegmentBounds {
            id: self.id,
            len: self.len,
            data_end: self.ring.map_or(self.len, |r| r.offset),
        }
    }

    /// Checks a request's slice against this segment and returns its byte range
    /// ([`SegmentBounds::range`]).
    pub fn range(&self, slice: &ShmSlice) -> Result<Range<usize>, ShmError> {
        self.bounds().range(slice)
    }

    fn copy_out(&self, range: Range<usize>, out: &mut [u8]) {
        assert!(
            range.end as u64 <= self.len && range.len() == out.len(),
            "segment copy out of bounds"
        );
        // SAFETY: `range` lies inside the mapping (asserted), which stays mapped while `self`
        // lives, and the memfd is sealed against shrinking, so every page stays backed and the
        // read cannot fault. The client may write these bytes concurrently: the copy is atomic
        // loads (`shared::shm_copy`), so a racing client can only garble its own activations,
        // never our memory, and the race is not undefined behaviour.
        unsafe {
            shared::shm_copy::load_from_shared(self.map.as_ptr().add(range.start), out);
        }
    }

    /// Copies `out.len()` f32 values from `range` (exactly `4 · out.len()` bytes).
    // PERF-CRITICAL: one memcpy of a call's activations.
    pub fn read_f32s(&self, range: Range<usize>, out: &mut [f32]) {
        self.copy_out(range, bytemuck::cast_slice_mut(out));
    }

    /// Copies `values` into the first `4 · values.len()` bytes of `range`.
    // PERF-CRITICAL: one memcpy of a call's output.
    pub fn write_f32s(&self, range: Range<usize>, values: &[f32]) {
        let bytes: &[u8] = bytemuck::cast_slice(values);
        assert!(
            range.end as u64 <= self.len && bytes.len() <= range.len(),
            "segment copy out of bounds"
        );
        // SAFETY: the destination lies inside the live, shrink-sealed mapping (asserted above),
        // `bytes` is our own buffer and cannot overlap it, and the stores are atomic
        // (`shared::shm_copy`), so a client reading or writing them concurrently is no data race.
        unsafe {
            shared::shm_copy::store_to_shared(self.map.as_mut_ptr().add(range.start), bytes);
        }
    }
}

/// What the pre-handshake found on a new unix connection.
pub struct Negotiated {
    /// Bytes read that belong to HTTP/2 (a plain gRPC client's preface); empty after a hello.
    pub prefix: Vec<u8>,
    /// The mapped segment, when the client sent one and it was accepted.
    pub segment: Option<std::sync::Arc<Segment>>,
}

/// Reads up to `buf.len()` bytes with `recvmsg`, collecting any SCM_RIGHTS descriptors into
/// `fds` (extra descriptors are closed when dropped). Returns 0 at end of stream.
async fn recv_with_fds(
    stream: &UnixStream,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> std::io::Result<usize> {
    loop {
        stream.readable().await?;
        let got = stream.try_io(Interest::READABLE, || {
            let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(2))];
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let msg = rustix::net::recvmsg(
                stream.as_fd(),
                &mut [IoSliceMut::new(buf)],
                &mut control,
                RecvFlags::CMSG_CLOEXEC,
            )
            .map_err(std::io::Error::from)?;
            for m in control.drain() {
                if let RecvAncillaryMessage::ScmRights(received) = m {
                    fds.extend(received);
                }
            }
            Ok(msg.bytes)
        });
        match got {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
}

/// Runs the pre-handshake on a freshly accepted connection: if the first eight bytes are the
/// hello magic, reads the frame (and its memfd), maps the segment as `segment_id` and replies;
/// otherwise returns the bytes read so HTTP/2 can start from them. A refused segment is logged
/// and reported in the reply; the connection then carries activations inline.
/// `accept_segment` false (a peer outside the allow lists): a descriptor the peer sends is closed
/// unread (never `fstat`ed, sealed-checked or mapped) and the reply says refused.
pub async fn negotiate(
    stream: &mut UnixStream,
    segment_id: u64,
    accept_segment: bool,
    policy: SegmentPolicy,
) -> Result<Negotiated, ShmError> {
    let mut buf = [0u8; shm_layout::HELLO_BYTES];
    let mut fds = Vec::new();
    let mut got = 0;
    // Only the magic decides: read until eight bytes (or the stream ends).
    let first = tokio::time::timeout(HELLO_TIMEOUT, async {
        while got < 8 {
            let n = recv_with_fds(stream, &mut buf[got..8], &mut fds).await?;
            if n == 0 {
                break;
            }
            got += n;
        }
        Ok::<_, std::io::Error>(())
    })
    .await;
    match first {
        Err(_) => return Err(ShmError::Timeout(HELLO_TIMEOUT)),
        Ok(r) => r?,
    }
    if got < 8 || !shm_layout::is_hello_magic(&buf[..8]) {
        return Ok(Negotiated {
            prefix: buf[..got].to_vec(),
            segment: None,
        });
    }
    tokio::time::timeout(HELLO_TIMEOUT, async {
        while got < buf.len() {
            let n = recv_with_fds(stream, &mut buf[got..], &mut fds).await?;
            if n == 0 {
                return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
            }
            got += n;
        }
        Ok(())
    })
    .await
    .map_err(|_| ShmError::Timeout(HELLO_TIMEOUT))??;
    let hello = Hello::parse(&buf)?;
    let mut segment = None;
    let mut status = shm_layout::REPLY_OK;
    if hello.has_segment() && !accept_segment {
        // The descriptor is never looked at; it closes with `fds`.
        status = shm_layout::REPLY_SEGMENT_REFUSED;
    } else if hello.has_segment() {
        let mapped = match fds.drain(..).next() {
            Some(fd) => Segment::from_fd(segment_id, fd, policy),
            None => Err(ShmError::NoDescriptor),
        };
        match mapped {
            Ok(s) => segment = Some(std::sync::Arc::new(s)),
            Err(e) => {
                tracing::warn!(error = %crate::logsafe::text(&e.to_string()), "shared-memory segment refused; this connection carries activations inline");
                status = shm_layout::REPLY_SEGMENT_REFUSED;
            }
        }
    }
    let reply = HelloReply {
        status,
        segment_id: segment.as_ref().map_or(0, |s| s.id()),
    };
    stream.write_all(&reply.encode()).await?;
    Ok(Negotiated {
        prefix: Vec::new(),
        segment,
    })
}

/// A unix stream that first yields `prefix` (bytes the pre-handshake read that belong to
/// HTTP/2), then the socket.
pub struct PrefixedStream {
    prefix: Vec<u8>,
    pos: usize,
    inner: UnixStream,
}

impl PrefixedStream {
    /// Wraps `inner`, replaying `prefix` first.
    pub fn new(prefix: Vec<u8>, inner: UnixStream) -> PrefixedStream {
        PrefixedStream {
            prefix,
            pos: 0,
            inner,
        }
    }

    /// The socket.
    pub fn inner(&self) -> &UnixStream {
        &self.inner
    }
}

impl AsyncRead for PrefixedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.pos < self.prefix.len() {
            let n = buf.remaining().min(self.prefix.len() - self.pos);
            let start = self.pos;
            buf.put_slice(&self.prefix[start..start + n]);
            self.pos += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for PrefixedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::fs::MemfdFlags;

    const BIG: u64 = 1 << 20;
    /// A cap well above [`BIG`].
    const POLICY: SegmentPolicy = SegmentPolicy { max_bytes: 4 * BIG };

    /// An unsealed memfd of `len` bytes with a valid segment header, every page written, as a
    /// client makes one.
    fn memfd(len: u64) -> OwnedFd {
        let fd = sparse_memfd(len);
        let zeros = vec![0u8; len as usize - shm_layout::SEGMENT_HEADER_BYTES];
        rustix::io::pwrite(&fd, &zeros, shm_layout::SEGMENT_HEADER_BYTES as u64)
            .expect("write the rest");
        fd
    }

    /// [`memfd`] without the rest: only the header's page is written.
    fn sparse_memfd(len: u64) -> OwnedFd {
        let fd =
            rustix::fs::memfd_create("shm-test", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
                .expect("memfd_create");
        rustix::fs::ftruncate(&fd, len).expect("ftruncate");
        let header = SegmentHeader::new(len).encode();
        rustix::io::pwrite(&fd, &header, 0).expect("write the header");
        fd
    }

    fn sealed(fd: OwnedFd) -> OwnedFd {
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW).expect("seal");
        fd
    }

    #[test]
    fn a_segment_over_the_cap_or_not_allocated_by_the_client_is_refused() {
        // Over the cap: refused by size, before anything is mapped.
        let policy = SegmentPolicy { max_bytes: BIG };
        match Segment::from_fd(1, sealed(memfd(2 * BIG)), policy) {
            Err(ShmError::TooLarge { found, max }) => assert_eq!((found, max), (2 * BIG, BIG)),
            other => panic!("a segment over the cap: {other:?}"),
        }
        // At the cap and allocated: mapped.
        let s = Segment::from_fd(2, sealed(memfd(BIG)), policy).expect("allocated segment");
        assert_eq!(s.len_bytes(), BIG);
        // Sparse (the client wrote only its header): the daemon's writes would allocate the
        // rest in the daemon's cgroup, so it is refused, naming the first unallocated byte.
        match Segment::from_fd(3, sealed(sparse_memfd(BIG)), policy) {
            Err(e @ ShmError::NotAllocated { hole, len }) => {
                assert_eq!((hole, len), (4096, BIG), "{e}");
                assert!(e.to_string().contains("write every page"), "{e}");
            }
            other => panic!("a sparse segment: {other:?}"),
        }
        // The derived cap fits hostd's default segment (2 slots × 1024 rows, ring of top-8)
        // at the real hidden size, and is far below the layout's 64 GiB.
        let hostd_default = shm_layout::SlotLayout::new(2, 1024, 2048)
            .and_then(|l| l.with_ring(1024 * 8))
            .expect("layout")
            .segment_bytes;
        let derived = SegmentPolicy::derived(2048).max_bytes;
        assert!(
            hostd_default <= derived && derived <= 160 << 20,
            "{hostd_default} {derived}"
        );
    }

    #[test]
    fn a_shrink_and_seal_racing_the_checks_never_leaves_a_mapping_past_the_end() {
        // The hostile client sends the fd unsealed at full size and, between the daemon's seal
        // check and its size read, shrinks the file and seals it. Sealing is checked first, so
        // the daemon saw no seal and refuses; had it read the size first it would now map 1 MiB
        // of a file that holds a few KiB.
        let small = shm_layout::MIN_SEGMENT_BYTES;
        let got = Segment::from_fd_observed(1, memfd(BIG), POLICY, |fd| {
            rustix::fs::ftruncate(fd, small).expect("shrink");
            rustix::fs::fcntl_add_seals(fd, SealFlags::SHRINK).expect("seal");
        });
        match got {
            Err(ShmError::Refused(why)) => assert!(why.contains("F_SEAL_SHRINK"), "{why}"),
            Ok(s) => panic!("mapped {} bytes of a {small}-byte file", s.len_bytes()),
            Err(e) => panic!("refused for another reason: {e}"),
        }
        // Sealed before it is sent: the size can no longer drop, whatever the client tries.
        let fd = memfd(BIG);
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK).expect("seal");
        let segment = Segment::from_fd_observed(2, fd, POLICY, |fd| {
            assert!(
                rustix::fs::ftruncate(fd, small).is_err(),
                "a sealed memfd shrank"
            );
        })
        .expect("a sealed memfd maps");
        assert_eq!(segment.len_bytes(), BIG);
    }

    #[test]
    fn a_mapped_segment_can_no_longer_have_pages_punched_out() {
        // The client keeps its own descriptor of the memfd it passes.
        let fd = sealed(memfd(BIG));
        let client = fd.try_clone().expect("dup");
        let punch = |fd: &OwnedFd| {
            rustix::fs::fallocate(
                fd,
                rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE,
                4096,
                64 << 10,
            )
        };
        // Before the daemon maps it, the client could punch pages out (the daemon's writes
        // would then allocate them again, in the daemon's memory) ...
        let spare = sealed(memfd(BIG));
        punch(&spare).expect("an unmapped memfd's pages can be punched out");
        // ... once mapped, it cannot: the daemon sealed it against writes through new mappings.
        let segment = Segment::from_fd(1, fd, POLICY).expect("mapped");
        assert!(
            punch(&client).is_err(),
            "a client punched pages out of a mapped segment"
        );
        let hole = rustix::fs::seek(&client, rustix::fs::SeekFrom::Hole(0)).expect("SEEK_HOLE");
        assert_eq!(hole, segment.len_bytes(), "a hole appeared at {hole}");
        // The daemon's own mapping still writes.
        segment.write_f32s(4096..4104, &[1.0, 2.0]);
        let mut back = [0.0f32; 2];
        segment.read_f32s(4096..4104, &mut back);
        assert_eq!(back, [1.0, 2.0]);

        // A memfd the client sealed against further seals cannot be protected: refused.
        let locked = memfd(BIG);
        rustix::fs::fcntl_add_seals(&locked, SealFlags::SHRINK | SealFlags::SEAL).expect("seal");
        match Segment::from_fd(2, locked, POLICY) {
            Err(ShmError::Refused(why)) => assert!(why.contains("F_SEAL_SEAL"), "{why}"),
            other => panic!("a memfd sealed with F_SEAL_SEAL: {other:?}"),
        }
    }

    /// Sends the pre-handshake hello with `fd` over `client` (as hostd's client does) and
    /// returns the daemon's reply status, with what `negotiate` made of it.
    fn hello_with(fd: &OwnedFd, accept_segment: bool) -> (u32, Option<std::sync::Arc<Segment>>) {
        use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
        use std::io::Read;
        let (mut client, server) = std::os::unix::net::UnixStream::pair().expect("socketpair");
        let hello = Hello {
            version: shm_layout::HELLO_VERSION,
            flags: shm_layout::HELLO_FLAG_SEGMENT,
        };
        let frame = hello.encode();
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        let fds = [fd.as_fd()];
        assert!(control.push(SendAncillaryMessage::ScmRights(&fds)));
        let sent = rustix::net::sendmsg(
            &client,
            &[std::io::IoSlice::new(&frame)],
            &mut control,
            SendFlags::empty(),
        )
        .expect("sendmsg");
        assert_eq!(sent, frame.len());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let negotiated = rt.block_on(async {
            server.set_nonblocking(true).expect("nonblocking");
            let mut s = UnixStream::from_std(server).expect("tokio stream");
            negotiate(&mut s, 7, accept_segment, POLICY)
                .await
                .expect("negotiate")
        });
        let mut reply = [0u8; shm_layout::REPLY_BYTES];
        client.read_exact(&mut reply).expect("reply");
        let reply = HelloReply::parse(&reply).expect("a well-formed reply");
        (reply.status, negotiated.segment)
    }

    #[test]
    fn a_peer_outside_the_allow_lists_never_gets_its_descriptor_mapped() {
        let fd = memfd(BIG);
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK).expect("seal");
        let (status, segment) = hello_with(&fd, false);
        assert_eq!(status, shm_layout::REPLY_SEGMENT_REFUSED);
        assert!(segment.is_none(), "a disallowed peer's segment was mapped");
        // The same descriptor from an allowed peer is mapped: the refusal above is the flag's.
        let (status, segment) = hello_with(&fd, true);
        assert_eq!(status, shm_layout::REPLY_OK);
        assert_eq!(segment.expect("mapped").len_bytes(), BIG);
    }
}
