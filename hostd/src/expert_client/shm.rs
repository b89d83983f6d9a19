//! hostd's side of the shared-memory transport: [`ClientSegment`] creates an anonymous memfd
//! (never a file anyone can open by name), sizes and allocates it for `n_slots` calls of `max_rows` rows,
//! seals it against shrinking and growing (so the daemon's mapping can never fault), maps it,
//! and lends out slots; [`send_hello`] passes it to the daemon with SCM_RIGHTS in the
//! pre-handshake. Each session gets a fresh segment, so nothing a daemon-side call of an
//! abandoned session might still write can reach a later call; within a session, the slot of
//! an abandoned call is quarantined ([`Slot::quarantine`]), never lent again. It is freed when hostd drops it
//! (or exits) and the daemon's connection closes. The segment may end with a MoE-call ring
//! (`shared::ring`), one entry per slot.
//!
//! Layouts are `shared::shm_layout`; the daemon's side is `expertd/src/shm.rs`.

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use shared::ring::RingView;
use shared::shm_layout::{self, Hello, HelloReply, ShmSlice, SlotLayout};
use std::io::{IoSlice, Read};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

// Activations are copied as little-endian f32 bytes in place.
#[cfg(target_endian = "big")]
compile_error!(
    "the expertd shared-memory transport copies little-endian f32 in place; big-endian hosts are unsupported"
);

/// How long the daemon may take to answer the pre-handshake.
pub const HELLO_REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// A sealed memfd mapped read-write, divided into slots.
pub struct ClientSegment {
    fd: OwnedFd,
    map: memmap2::MmapRaw,
    layout: SlotLayout,
    /// Free slot indices. A std mutex: held for a push or pop only.
    free: Mutex<Vec<usize>>,
    /// Slots withheld because their call was abandoned ([`Slot::quarantine`]).
    quarantined: std::sync::atomic::AtomicUsize,
}

impl std::fmt::Debug for ClientSegment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientSegment")
            .field("layout", &self.layout)
            .finish()
    }
}

/// One slot lent to one call; returned when dropped, unless quarantined.
pub struct Slot<'a> {
    segment: &'a ClientSegment,
    index: usize,
    quarantined: bool,
}

impl Slot<'_> {
    /// The slot's index (also its ring entry).
    pub fn index(&self) -> usize {
        self.index
    }

    /// Never lends this slot again: its call was abandoned (deadline, lost connection, a
    /// malformed answer) while the daemon may still be computing it and write its output
    /// region. The slot stays out of the pool until the segment itself is dropped with its
    /// session, so no later call can read an abandoned call's output.
    pub fn quarantine(&mut self) {
        self.quarantined = true;
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        // A slot dropped by a panic's unwind may belong to a call the daemon is still
        // computing: it is quarantined like an abandoned call's, never lent again.
        if self.quarantined || std::thread::panicking() {
            self.segment
                .quarantined
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return;
        }
        self.segment
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(self.index);
    }
}

impl ClientSegment {
    /// Creates, sizes, seals and maps a segment for `layout`.
    pub fn create(layout: SlotLayout) -> std::io::Result<ClientSegment> {
        let fd = rustix::fs::memfd_create(
            "sluice-expertd-activations",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )?;
        rustix::fs::ftruncate(&fd, layout.segment_bytes)?;
        // No `F_SEAL_SEAL`: the daemon adds `F_SEAL_FUTURE_WRITE` once it has mapped the
        // segment, so that no page can be punched out of it afterwards (it refuses a segment it
        // cannot seal). This process maps the segment once, below, before sending it.
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW)?;
        let file = std::fs::File::from(fd.try_clone()?);
        let map = memmap2::MmapOptions::new()
            .len(layout.segment_bytes as usize)
            .map_raw(&file)?;
        // Every page written here, so it is allocated and charged to this process: the daemon
        // refuses a segment with holes, whose pages its own writes would allocate in its memory.
        // (`fallocate` alone is not enough: shmem reports fallocated, never-written pages as
        // holes.)
        // SAFETY: the mapping is `segment_bytes` long, freshly created, read-write and not yet
        // shared with anyone (the fd has not been sent), so nothing else accesses it.
        unsafe {
            std::ptr::write_bytes(map.as_mut_ptr(), 0, layout.segment_bytes as usize);
        }
        let segment = ClientSegment {
            fd,
            map,
            layout,
            free: Mutex::new((0..layout.n_slots).rev().collect()),
            quarantined: Default::default(),
        };
        segment.copy_in(0, &layout.header().encode());
        if let Some(ring) = segment.ring() {
            ring.reset();
        }
        Ok(segment)
    }

    /// The segment's call ring, when its layout has one.
    pub fn ring(&self) -> Option<RingView> {
        let layout = self.layout.ring?;
        // SAFETY: the layout was checked to fit the segment (`SlotLayout::with_ring`), the
        // mapping is page-aligned, sealed against shrinking and lives as long as `self`; views
        // are used only while the segment is borrowed.
        Some(unsafe { RingView::new(self.map.as_mut_ptr(), layout) })
    }

    /// The slot layout.
    pub fn layout(&self) -> &SlotLayout {
        &self.layout
    }

    /// A free slot, if any (calls beyond the slot count travel inline).
    pub fn try_slot(&self) -> Option<Slot<'_>> {
        let index = self
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()?;
        Some(Slot {
            segment: self,
            index,
            quarantined: false,
        })
    }

    /// Slots withheld from reuse because their call was abandoned.
    pub fn quarantined(&self) -> usize {
        self.quarantined.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn copy_in(&self, offset: u64, bytes: &[u8]) {
        assert!(
            offset + bytes.len() as u64 <= self.layout.segment_bytes,
            "segment write out of bounds"
        );
        // SAFETY: the range lies inside the mapping (asserted), which lives as long as `self`;
        // the memfd is sealed against shrinking, so no page can disappear. The daemon only
        // touches a slot while the call that lent it is in flight, and this process writes a
        // slot only while it holds the slot, so nobody reads these bytes concurrently.
        // The stores are atomic (`shared::shm_copy`): a misbehaving daemon writing the same
        // bytes cannot make this a data race.
        unsafe {
            shared::shm_copy::store_to_shared(self.map.as_mut_ptr().add(offset as usize), bytes);
        }
    }

    fn copy_out(&self, offset: u64, out: &mut [u8]) {
        assert!(
            offset + out.len() as u64 <= self.layout.segment_bytes,
            "segment read out of bounds"
        );
        // SAFETY: as in `copy_in`; the daemon finished writing before it answered the call.
        unsafe {
            shared::shm_copy::load_from_shared(self.map.as_ptr().add(offset as usize), out);
        }
    }

    /// Writes a call's activations into `slot`'s input region and returns its descriptor.
    // PERF-CRITICAL: one memcpy of a call's activations.
    pub fn write_input(&self, slot: &Slot<'_>, segment_id: u64, x: &[f32]) -> ShmSlice {
        let offset = self.layout.input_offset(slot.index);
        self.copy_in(offset, bytemuck::cast_slice(x));
        ShmSlice {
            segment_id,
            offset_bytes: offset,
            length_bytes: x.len() as u64 * 4,
        }
    }

    /// The descriptor of `slot`'s output region for `n_values` f32.
    pub fn output_slice(&self, slot: &Slot<'_>, segment_id: u64, n_values: usize) -> ShmSlice {
        ShmSlice {
            segment_id,
            offset_bytes: self.layout.output_offset(slot.index),
            length_bytes: n_values as u64 * 4,
        }
    }

    /// Reads a call's output from `slot`'s output region.
    // PERF-CRITICAL: one memcpy of a call's output.
    pub fn read_output(&self, slot: &Slot<'_>, out: &mut [f32]) {
        self.copy_out(
            self.layout.output_offset(slot.index),
            bytemuck::cast_slice_mut(out),
        );
    }

    /// Whether a call of `n_rows` fits a slot.
    pub fn fits(&self, n_rows: usize) -> bool {
        n_rows <= self.layout.max_rows
    }
}

/// Runs the pre-handshake on a freshly connected unix stream: sends the hello frame, with the
/// segment's memfd attached when there is one, and reads the daemon's reply.
pub fn send_hello(
    stream: &mut UnixStream,
    segment: Option<&ClientSegment>,
) -> std::io::Result<HelloReply> {
    send_hello_within(stream, segment, HELLO_REPLY_TIMEOUT)
}

/// [`send_hello`], waiting at most `timeout` (at least 1 ms) for the reply.
pub fn send_hello_within(
    stream: &mut UnixStream,
    segment: Option<&ClientSegment>,
    timeout: Duration,
) -> std::io::Result<HelloReply> {
    let hello = Hello {
        version: shm_layout::HELLO_VERSION,
        flags: if segment.is_some() {
            shm_layout::HELLO_FLAG_SEGMENT
        } else {
            0
        },
    };
    let frame = hello.encode();
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds;
    if let Some(seg) = segment {
        fds = [seg.fd.as_fd()];
        if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
            return Err(std::io::Error::other(
                "SCM_RIGHTS control message does not fit",
            ));
        }
    }
    let mut sent = rustix::net::sendmsg(
        &*stream,
        &[IoSlice::new(&frame)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    // The descriptor rode on the first bytes; any remainder is plain data.
    while sent < frame.len() {
        sent += rustix::net::send(&*stream, &frame[sent..], SendFlags::NOSIGNAL)?;
    }
    stream.set_read_timeout(Some(timeout.max(Duration::from_millis(1))))?;
    let mut reply = [0u8; shm_layout::REPLY_BYTES];
    stream.read_exact(&mut reply)?;
    stream.set_read_timeout(None)?;
    HelloReply::parse(&reply).map_err(std::io::Error::other)
}
