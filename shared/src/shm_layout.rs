//! Byte layouts of expertd's shared-memory transport, as pure encode/parse functions: the
//! pre-handshake frames a unix-socket client exchanges before the HTTP/2 preface (the frame
//! that carries the memfd with SCM_RIGHTS, and the daemon's reply), the segment header at the
//! start of every segment, the client's slot layout, and the checks on a slice descriptor.
//!
//! Owns no IO and no mapping: creating, sealing, passing and mapping the memfd live in
//! `hostd/src/expert_client/shm.rs` (client) and `expertd/src/shm.rs` (daemon). Everything in
//! a segment is addressed by offsets from its start, never by pointers, because the two
//! processes map it at different addresses.
//!
//! ```text
//! segment (memfd, sealed against shrinking and growing before it is passed)
//! offset 0   64-byte SegmentHeader: "SLUICESM", version, header_bytes, segment_bytes, …
//! offset 64  slot 0: input  (max_rows · hidden · 4 bytes, rounded up to 64)
//!                    output (same size)
//!            slot 1: …
//! ```

use std::ops::Range;

/// Magic of the client's pre-handshake frame.
pub const HELLO_MAGIC: [u8; 8] = *b"SLUICEHI";
/// Magic of the daemon's reply frame.
pub const REPLY_MAGIC: [u8; 8] = *b"SLUICEOK";
/// Version of the pre-handshake frames.
pub const HELLO_VERSION: u32 = 1;
/// Bytes of the client's frame: magic, version u32, flags u32.
pub const HELLO_BYTES: usize = 16;
/// Bytes of the daemon's reply: magic, status u32, reserved u32, segment id u64.
pub const REPLY_BYTES: usize = 24;
/// Hello flag: a memfd segment rides on the frame's first byte (SCM_RIGHTS).
pub const HELLO_FLAG_SEGMENT: u32 = 1;

/// Magic at offset 0 of every segment.
pub const SEGMENT_MAGIC: [u8; 8] = *b"SLUICESM";
/// Segment layout version.
pub const SEGMENT_VERSION: u32 = 1;
/// Bytes of the segment header; the first slot starts here.
pub const SEGMENT_HEADER_BYTES: usize = 64;
/// Every slice offset is a multiple of this (one cache line; f32 needs only 4).
pub const SLICE_ALIGN: u64 = 64;
/// The largest segment a daemon maps, in bytes (64 GiB: far above any sane slot count).
pub const MAX_SEGMENT_BYTES: u64 = 64 << 30;
/// The smallest segment: a header and one 64-byte slot pair.
pub const MIN_SEGMENT_BYTES: u64 = SEGMENT_HEADER_BYTES as u64 + 2 * SLICE_ALIGN;

/// Why a frame, header or slice is not acceptable. Each names the value found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShmLayoutError {
    /// A frame of the wrong length.
    #[error("{what} must be {expected} bytes, got {found}")]
    FrameLength {
        /// Which frame.
        what: &'static str,
        /// Bytes received.
        found: usize,
        /// Bytes required.
        expected: usize,
    },
    /// Wrong magic bytes.
    #[error("{what}: magic {found:02x?} is not {expected:?}")]
    Magic {
        /// Which frame or header.
        what: &'static str,
        /// The bytes found.
        found: [u8; 8],
        /// The magic required, as text.
        expected: &'static str,
    },
    /// A version this build does not speak.
    #[error("{what}: version {found} is not supported (this build speaks {expected})")]
    Version {
        /// Which frame or header.
        what: &'static str,
        /// The version found.
        found: u32,
        /// The version required.
        expected: u32,
    },
    /// A header field that disagrees with the segment.
    #[error("segment header field {field} is {found}, expected {expected}")]
    HeaderField {
        /// The field.
        field: &'static str,
        /// The value found.
        found: u64,
        /// The value required.
        expected: u64,
    },
    /// A byte that is unused in this version (reserved) but not zero: only zero is ever
    /// written, so anything else is a foreign or corrupted frame.
    #[error("{what}: reserved byte {offset} is {found:#04x}, expected 0")]
    Reserved {
        /// The frame or header.
        what: &'static str,
        /// Offset of the first non-zero reserved byte.
        offset: usize,
        /// Its value.
        found: u8,
    },
    /// A segment size outside the accepted range.
    #[error("segment of {found} bytes is outside {min}..={max}")]
    SegmentSize {
        /// The size found.
        found: u64,
        /// The smallest size accepted.
        min: u64,
        /// The largest size accepted.
        max: u64,
    },
    /// A slice offset that is not a multiple of [`SLICE_ALIGN`] or falls inside the header.
    #[error(
        "slice offset {offset_bytes} must be a multiple of {SLICE_ALIGN} at or after the {SEGMENT_HEADER_BYTES}-byte header"
    )]
    SliceOffset {
        /// The offset found.
        offset_bytes: u64,
    },
    /// A slice that ends past the segment.
    #[error("slice [{offset_bytes}, +{length_bytes}) ends past the {segment_bytes}-byte segment")]
    SliceBounds {
        /// The slice offset.
        offset_bytes: u64,
        /// The slice length.
        length_bytes: u64,
        /// The segment size.
        segment_bytes: u64,
    },
    /// A slice that reaches into the segment's call ring (its control words and cells).
    #[error(
        "slice [{offset_bytes}, +{length_bytes}) reaches into the call ring at offset {ring_offset}: activations must lie between the segment header and the ring"
    )]
    SliceIntoRing {
        /// The slice offset.
        offset_bytes: u64,
        /// The slice length.
        length_bytes: u64,
        /// Where the ring starts.
        ring_offset: u64,
    },
    /// A slot layout that does not fit the arithmetic.
    #[error("slot layout overflows: {n_slots} slots of {max_rows} rows × {hidden} f32")]
    SlotOverflow {
        /// Slots asked for.
        n_slots: usize,
        /// Rows per slot.
        max_rows: usize,
        /// Elements per row.
        hidden: usize,
    },
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// `Err(Reserved)` naming the first non-zero byte of `b[range]`.
fn reserved_zero(what: &'static str, b: &[u8], range: Range<usize>) -> Result<(), ShmLayoutError> {
    let start = range.start;
    match b[range].iter().position(|&x| x != 0) {
        None => Ok(()),
        Some(i) => Err(ShmLayoutError::Reserved {
            what,
            offset: start + i,
            found: b[start + i],
        }),
    }
}

/// `Err(Magic)` unless `b` (at least 8 bytes) starts with `magic`.
#[expect(
    clippy::trivially_copy_pass_by_ref,
    reason = "the error names the expected magic as a &'static str"
)]
fn check_magic(
    what: &'static str,
    b: &[u8],
    magic: &'static [u8; 8],
) -> Result<(), ShmLayoutError> {
    if b[..8] == *magic {
        return Ok(());
    }
    let mut found = [0u8; 8];
    found.copy_from_slice(&b[..8]);
    // Every magic is ASCII text.
    Err(ShmLayoutError::Magic {
        what,
        found,
        expected: std::str::from_utf8(magic).unwrap_or("?"),
    })
}

/// `Err(FrameLength)` unless `b` is exactly `len` bytes, then [`check_magic`].
#[expect(
    clippy::trivially_copy_pass_by_ref,
    reason = "passed on to check_magic"
)]
fn check_frame(
    what: &'static str,
    b: &[u8],
    len: usize,
    magic: &'static [u8; 8],
) -> Result<(), ShmLayoutError> {
    if b.len() != len {
        return Err(ShmLayoutError::FrameLength {
            what,
            found: b.len(),
            expected: len,
        });
    }
    check_magic(what, b, magic)
}

/// The client's pre-handshake frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// Frame version ([`HELLO_VERSION`]).
    pub version: u32,
    /// [`HELLO_FLAG_SEGMENT`] when a memfd rides on the frame.
    pub flags: u32,
}

impl Hello {
    /// Whether the client says it attached a segment.
    pub fn has_segment(&self) -> bool {
        self.flags & HELLO_FLAG_SEGMENT != 0
    }

    /// The frame's bytes.
    pub fn encode(&self) -> [u8; HELLO_BYTES] {
        let mut out = [0u8; HELLO_BYTES];
        out[..8].copy_from_slice(&HELLO_MAGIC);
        out[8..12].copy_from_slice(&self.version.to_le_bytes());
        out[12..16].copy_from_slice(&self.flags.to_le_bytes());
        out
    }

    /// Parses a frame; the magic must already have been recognised by [`is_hello_magic`], but
    /// is checked again.
    pub fn parse(bytes: &[u8]) -> Result<Hello, ShmLayoutError> {
        check_frame("hello frame", bytes, HELLO_BYTES, &HELLO_MAGIC)?;
        let version = le_u32(bytes, 8);
        if version != HELLO_VERSION {
            return Err(ShmLayoutError::Version {
                what: "hello frame",
                found: version,
                expected: HELLO_VERSION,
            });
        }
        Ok(Hello {
            version,
            flags: le_u32(bytes, 12),
        })
    }
}

/// Whether a connection's first eight bytes are the pre-handshake magic (anything else is an
/// HTTP/2 preface from a plain gRPC client, which the daemon then serves inline).
pub fn is_hello_magic(first8: &[u8]) -> bool {
    first8 == HELLO_MAGIC
}

/// The daemon's reply status: the segment was mapped (or none was offered).
pub const REPLY_OK: u32 = 0;
/// The daemon's reply status: the segment was refused (the daemon logs why); the connection
/// carries activations inline.
pub const REPLY_SEGMENT_REFUSED: u32 = 1;

/// The daemon's reply to a hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelloReply {
    /// [`REPLY_OK`] or [`REPLY_SEGMENT_REFUSED`].
    pub status: u32,
    /// The id requests use for the segment; 0 when there is none.
    pub segment_id: u64,
}

impl HelloReply {
    /// The frame's bytes.
    pub fn encode(&self) -> [u8; REPLY_BYTES] {
        let mut out = [0u8; REPLY_BYTES];
        out[..8].copy_from_slice(&REPLY_MAGIC);
        out[8..12].copy_from_slice(&self.status.to_le_bytes());
        out[16..24].copy_from_slice(&self.segment_id.to_le_bytes());
        out
    }

    /// Parses a reply.
    pub fn parse(bytes: &[u8]) -> Result<HelloReply, ShmLayoutError> {
        check_frame("hello reply", bytes, REPLY_BYTES, &REPLY_MAGIC)?;
        reserved_zero("hello reply", bytes, 12..16)?;
        Ok(HelloReply {
            status: le_u32(bytes, 8),
            segment_id: le_u64(bytes, 16),
        })
    }
}

/// The 64-byte header at offset 0 of a segment. `#[repr(C)]` plain data with offsets only;
/// it is written and read through [`SegmentHeader::encode`] / [`SegmentHeader::parse`] as
/// explicit little-endian bytes, never by casting the mapping.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    /// [`SEGMENT_MAGIC`].
    pub magic: [u8; 8],
    /// [`SEGMENT_VERSION`].
    pub version: u32,
    /// [`SEGMENT_HEADER_BYTES`].
    pub header_bytes: u32,
    /// The segment's total size in bytes (equals the memfd's size).
    pub segment_bytes: u64,
    /// Offset of the first slot (= `header_bytes`).
    pub data_offset: u64,
    /// The MoE-call ring (`crate::ring`), when the client offers one (bytes 32..48; zero
    /// when absent, which is all a daemon that predates rings ever saw there).
    pub ring: Option<crate::ring::RingLayout>,
}

impl SegmentHeader {
    /// The header of a segment of `segment_bytes`.
    pub fn new(segment_bytes: u64) -> SegmentHeader {
        SegmentHeader {
            magic: SEGMENT_MAGIC,
            version: SEGMENT_VERSION,
            header_bytes: SEGMENT_HEADER_BYTES as u32,
            segment_bytes,
            data_offset: SEGMENT_HEADER_BYTES as u64,
            ring: None,
        }
    }

    /// The header's 64 bytes (unused bytes zero).
    pub fn encode(&self) -> [u8; SEGMENT_HEADER_BYTES] {
        let mut out = [0u8; SEGMENT_HEADER_BYTES];
        out[..8].copy_from_slice(&self.magic);
        out[8..12].copy_from_slice(&self.version.to_le_bytes());
        out[12..16].copy_from_slice(&self.header_bytes.to_le_bytes());
        out[16..24].copy_from_slice(&self.segment_bytes.to_le_bytes());
        out[24..32].copy_from_slice(&self.data_offset.to_le_bytes());
        if let Some(r) = &self.ring {
            out[32..40].copy_from_slice(&r.offset.to_le_bytes());
            out[40..44].copy_from_slice(&r.entries.to_le_bytes());
            out[44..48].copy_from_slice(&r.cells.to_le_bytes());
        }
        out
    }

    /// Parses and checks a header against the size of the file that holds it.
    pub fn parse(bytes: &[u8], file_bytes: u64) -> Result<SegmentHeader, ShmLayoutError> {
        if !(MIN_SEGMENT_BYTES..=MAX_SEGMENT_BYTES).contains(&file_bytes) {
            return Err(ShmLayoutError::SegmentSize {
                found: file_bytes,
                min: MIN_SEGMENT_BYTES,
                max: MAX_SEGMENT_BYTES,
            });
        }
        if bytes.len() < SEGMENT_HEADER_BYTES {
            return Err(ShmLayoutError::FrameLength {
                what: "segment header",
                found: bytes.len(),
                expected: SEGMENT_HEADER_BYTES,
            });
        }
        check_magic("segment header", bytes, &SEGMENT_MAGIC)?;
        let h = SegmentHeader {
            magic: SEGMENT_MAGIC,
            version: le_u32(bytes, 8),
            header_bytes: le_u32(bytes, 12),
            segment_bytes: le_u64(bytes, 16),
            data_offset: le_u64(bytes, 24),
            ring: None,
        };
        if h.version != SEGMENT_VERSION {
            return Err(ShmLayoutError::Version {
                what: "segment header",
                found: h.version,
                expected: SEGMENT_VERSION,
            });
        }
        let exact = |field, found: u64, expected: u64| {
            if found == expected {
                Ok(())
            } else {
                Err(ShmLayoutError::HeaderField {
                    field,
                    found,
                    expected,
                })
            }
        };
        exact(
            "header_bytes",
            u64::from(h.header_bytes),
            SEGMENT_HEADER_BYTES as u64,
        )?;
        exact("segment_bytes", h.segment_bytes, file_bytes)?;
        exact("data_offset", h.data_offset, SEGMENT_HEADER_BYTES as u64)?;
        // Bytes 48..64 are unused, and so are the ring's counts when no ring is announced.
        reserved_zero("segment header", bytes, 48..SEGMENT_HEADER_BYTES)?;
        let ring_offset = le_u64(bytes, 32);
        let ring = if ring_offset == 0 {
            reserved_zero("segment header (no ring)", bytes, 40..48)?;
            None
        } else {
            let r = crate::ring::RingLayout {
                offset: ring_offset,
                entries: le_u32(bytes, 40),
                cells: le_u32(bytes, 44),
            };
            r.check(file_bytes)?;
            Some(r)
        };
        Ok(SegmentHeader { ring, ..h })
    }
}

/// A byte range of a segment, as a request names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShmSlice {
    /// The segment id the daemon assigned in its hello reply.
    pub segment_id: u64,
    /// Offset from the segment start, a multiple of [`SLICE_ALIGN`], past the header.
    pub offset_bytes: u64,
    /// Length in bytes.
    pub length_bytes: u64,
}

impl ShmSlice {
    /// The slice as a byte range of a segment of `segment_bytes` whose data (the slots) ends at
    /// `data_end` (the ring's offset, or `segment_bytes` without a ring), after checking
    /// alignment and bounds with checked arithmetic: a slice lies between the header and the
    /// ring, so a call's output can never overwrite the ring's control words.
    pub fn range_in_data(
        &self,
        segment_bytes: u64,
        data_end: u64,
    ) -> Result<Range<usize>, ShmLayoutError> {
        let range = self.range_in(segment_bytes)?;
        if range.end as u64 > data_end {
            return Err(ShmLayoutError::SliceIntoRing {
                offset_bytes: self.offset_bytes,
                length_bytes: self.length_bytes,
                ring_offset: data_end,
            });
        }
        Ok(range)
    }

    /// The slice as a byte range of a segment of `segment_bytes`, after checking alignment
    /// and bounds with checked arithmetic.
    pub fn range_in(&self, segment_bytes: u64) -> Result<Range<usize>, ShmLayoutError> {
        let ShmSlice {
            offset_bytes,
            length_bytes,
            ..
        } = *self;
        if !offset_bytes.is_multiple_of(SLICE_ALIGN) || offset_bytes < SEGMENT_HEADER_BYTES as u64 {
            return Err(ShmLayoutError::SliceOffset { offset_bytes });
        }
        let bounds = ShmLayoutError::SliceBounds {
            offset_bytes,
            length_bytes,
            segment_bytes,
        };
        let end = offset_bytes
            .checked_add(length_bytes)
            .ok_or(bounds.clone())?;
        if end > segment_bytes {
            return Err(bounds);
        }
        let start = usize::try_from(offset_bytes).map_err(|_| bounds.clone())?;
        let end = usize::try_from(end).map_err(|_| bounds)?;
        Ok(start..end)
    }
}

/// How a client divides its segment: `n_slots` slots, each an input and an output region of
/// `max_rows × hidden` f32, so up to `n_slots` calls can be in flight at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotLayout {
    /// Slots in the segment.
    pub n_slots: usize,
    /// Rows one slot holds.
    pub max_rows: usize,
    /// Elements per row.
    pub hidden: usize,
    /// Bytes of one region (input or output), rounded up to [`SLICE_ALIGN`].
    pub region_bytes: u64,
    /// The whole segment's size in bytes.
    pub segment_bytes: u64,
    /// The MoE-call ring after the slots (one entry per slot, plus one for hints), when asked for.
    pub ring: Option<crate::ring::RingLayout>,
}

impl SlotLayout {
    /// The layout for `n_slots` slots of `max_rows × hidden` f32 each way.
    pub fn new(
        n_slots: usize,
        max_rows: usize,
        hidden: usize,
    ) -> Result<SlotLayout, ShmLayoutError> {
        let overflow = ShmLayoutError::SlotOverflow {
            n_slots,
            max_rows,
            hidden,
        };
        if n_slots == 0 || max_rows == 0 || hidden == 0 {
            return Err(overflow);
        }
        let region_bytes = (max_rows as u64)
            .checked_mul(hidden as u64)
            .and_then(|n| n.checked_mul(4))
            .and_then(|n| n.checked_next_multiple_of(SLICE_ALIGN))
            .ok_or(overflow.clone())?;
        let segment_bytes = region_bytes
            .checked_mul(2)
            .and_then(|n| n.checked_mul(n_slots as u64))
            .and_then(|n| n.checked_add(SEGMENT_HEADER_BYTES as u64))
            .ok_or(overflow.clone())?;
        if segment_bytes > MAX_SEGMENT_BYTES {
            return Err(overflow);
        }
        Ok(SlotLayout {
            n_slots,
            max_rows,
            hidden,
            region_bytes,
            segment_bytes,
            ring: None,
        })
    }

    /// The same slots followed by a ring of one entry per slot plus one for prefetch hints
    /// (the last), each carrying up to `cells` ids and weights (`max_rows × top_k` of the
    /// largest call that may use the ring).
    pub fn with_ring(self, cells: usize) -> Result<SlotLayout, ShmLayoutError> {
        let overflow = ShmLayoutError::SlotOverflow {
            n_slots: self.n_slots,
            max_rows: self.max_rows,
            hidden: self.hidden,
        };
        let ring = crate::ring::RingLayout {
            offset: self.segment_bytes,
            entries: u32::try_from(self.n_slots + 1).map_err(|_| overflow.clone())?,
            cells: u32::try_from(cells).map_err(|_| overflow.clone())?,
        };
        let segment_bytes = self
            .segment_bytes
            .checked_add(ring.bytes())
            .filter(|&b| b <= MAX_SEGMENT_BYTES)
            .ok_or(overflow)?;
        ring.check(segment_bytes)?;
        Ok(SlotLayout {
            segment_bytes,
            ring: Some(ring),
            ..self
        })
    }

    /// The segment header for this layout.
    pub fn header(&self) -> SegmentHeader {
        SegmentHeader {
            ring: self.ring,
            ..SegmentHeader::new(self.segment_bytes)
        }
    }

    /// Offset of slot `slot`'s input region.
    pub fn input_offset(&self, slot: usize) -> u64 {
        SEGMENT_HEADER_BYTES as u64 + 2 * self.region_bytes * slot as u64
    }

    /// Offset of slot `slot`'s output region.
    pub fn output_offset(&self, slot: usize) -> u64 {
        self.input_offset(slot) + self.region_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let h = Hello {
            version: HELLO_VERSION,
            flags: HELLO_FLAG_SEGMENT,
        };
        assert_eq!(Hello::parse(&h.encode()), Ok(h));
        let r = HelloReply {
            status: REPLY_OK,
            segment_id: 7,
        };
        assert_eq!(HelloReply::parse(&r.encode()), Ok(r));
        let mut bad = h.encode();
        bad[8] = 9;
        assert!(matches!(
            Hello::parse(&bad),
            Err(ShmLayoutError::Version { found: 9, .. })
        ));
        assert!(!is_hello_magic(b"PRI * HT"));
        // Reserved bytes must be zero (found by fuzzing: a reply with garbage there was accepted).
        let mut odd = r.encode();
        odd[13] = 1;
        assert_eq!(
            HelloReply::parse(&odd),
            Err(ShmLayoutError::Reserved {
                what: "hello reply",
                offset: 13,
                found: 1
            })
        );
    }

    #[test]
    fn unused_header_bytes_must_be_zero() {
        // Found by fuzzing (`fuzz/corpus/shm_segment/finding-*`): non-zero unused bytes were
        // accepted, so the accepted header did not re-encode to its bytes.
        let h = SegmentHeader::new(4096);
        let mut b = h.encode();
        b[58] = 0x80;
        assert!(matches!(
            SegmentHeader::parse(&b, 4096),
            Err(ShmLayoutError::Reserved { offset: 58, .. })
        ));
        let mut b = h.encode();
        b[44] = 3; // ring cells without a ring
        assert!(matches!(
            SegmentHeader::parse(&b, 4096),
            Err(ShmLayoutError::Reserved { offset: 44, .. })
        ));
        let l = SlotLayout::new(1, 1, 16)
            .expect("layout")
            .with_ring(8)
            .expect("ring");
        let mut b = l.header().encode();
        b[63] = 1;
        assert!(matches!(
            SegmentHeader::parse(&b, l.segment_bytes),
            Err(ShmLayoutError::Reserved { offset: 63, .. })
        ));
    }

    #[test]
    fn header_checks_its_size_against_the_file() {
        let h = SegmentHeader::new(4096);
        assert_eq!(SegmentHeader::parse(&h.encode(), 4096), Ok(h));
        assert!(matches!(
            SegmentHeader::parse(&h.encode(), 8192),
            Err(ShmLayoutError::HeaderField {
                field: "segment_bytes",
                ..
            })
        ));
        assert!(matches!(
            SegmentHeader::parse(&h.encode(), 8),
            Err(ShmLayoutError::SegmentSize { .. })
        ));
    }

    fn check(
        offset_bytes: u64,
        length_bytes: u64,
        segment_bytes: u64,
        expected: Result<Range<usize>, ()>,
    ) {
        let got = ShmSlice {
            segment_id: 1,
            offset_bytes,
            length_bytes,
        }
        .range_in(segment_bytes)
        .map_err(|_| ());
        assert_eq!(
            got, expected,
            "offset {offset_bytes} length {length_bytes} in {segment_bytes}"
        );
    }

    #[test]
    fn slices_are_aligned_and_in_bounds() {
        check(64, 128, 256, Ok(64..192));
        check(64, 192, 256, Ok(64..256));
        check(64, 193, 256, Err(()));
        check(0, 4, 256, Err(()));
        check(65, 4, 256, Err(()));
        check(64, u64::MAX, 256, Err(()));
    }

    #[test]
    fn slot_layout_tiles_the_segment() {
        let l = SlotLayout::new(2, 3, 5).expect("layout");
        assert_eq!(l.region_bytes, 64);
        assert_eq!(l.input_offset(0), 64);
        assert_eq!(l.output_offset(1), 64 + 3 * 64);
        assert_eq!(l.segment_bytes, 64 + 4 * 64);
        assert!(SlotLayout::new(2, usize::MAX, 5).is_err());
        // A ring goes after the slots and its header round-trips.
        let r = l.with_ring(3 * 8).expect("ring");
        let ring = r.ring.expect("ring layout");
        assert_eq!(ring.offset, l.segment_bytes);
        assert_eq!(r.segment_bytes, l.segment_bytes + ring.bytes());
        assert_eq!(
            SegmentHeader::parse(&r.header().encode(), r.segment_bytes),
            Ok(r.header())
        );
        // A ring that does not fit the file is refused.
        assert!(SegmentHeader::parse(&r.header().encode(), l.segment_bytes).is_err());
    }
}
