//! The shared-memory pre-handshake and segment header: `shared::shm_layout`'s hello frame,
//! hello reply and segment header, and `expertd::shm::Segment::from_fd`, which the daemon
//! runs on a descriptor a client sent (here a real sealed memfd holding the input).
//!
//! Contract: no panic; an accepted frame or header re-encodes to exactly its bytes (unused
//! bytes included); an accepted segment's ring lies inside it and can be taken once; a slice
//! is accepted by the segment exactly when `ShmSlice::range_in` accepts it.

use crate::bytes::Input;
use crate::{Outcome, class};
use expertd::shm::{Segment, SegmentPolicy};
use rustix::fs::{MemfdFlags, SealFlags};
use shared::shm_layout::{
    HELLO_BYTES, Hello, HelloReply, MIN_SEGMENT_BYTES, REPLY_BYTES, SEGMENT_HEADER_BYTES,
    SegmentHeader, ShmLayoutError, ShmSlice,
};
use std::io::Write;

/// Picks the frame from the first byte: 0 hello, 1 reply, 2 segment header, 3 memfd segment.
pub fn run(data: &[u8]) -> Outcome {
    let mut input = Input::new(data);
    let mode = input.u8();
    match mode % 4 {
        0 => frame(
            "hello",
            input.rest(),
            HELLO_BYTES + (mode >> 7) as usize,
            Hello::parse,
            Hello::encode,
        ),
        1 => frame(
            "reply",
            input.rest(),
            REPLY_BYTES + (mode >> 7) as usize,
            HelloReply::parse,
            HelloReply::encode,
        ),
        2 => header(mode, input),
        _ => memfd(mode, input),
    }
}

/// One pre-handshake frame: the first `max` bytes of `rest`; an accepted frame must re-encode
/// to exactly its bytes.
fn frame<F, const N: usize>(
    what: &str,
    rest: &[u8],
    max: usize,
    parse: fn(&[u8]) -> Result<F, ShmLayoutError>,
    encode: fn(&F) -> [u8; N],
) -> Outcome {
    let bytes = &rest[..rest.len().min(max)];
    match parse(bytes) {
        Ok(f) => {
            assert_eq!(
                encode(&f),
                bytes,
                "an accepted {what} frame does not re-encode to its bytes"
            );
            format!("ok:{what}")
        }
        Err(e) => class(what, &e),
    }
}

/// Overwrites the header's `segment_bytes` with the real size (so mutations reach the ring).
fn fix_size(bytes: &mut [u8], size: u64) {
    if bytes.len() >= 24 {
        bytes[16..24].copy_from_slice(&size.to_le_bytes());
    }
}

fn header(mode: u8, mut input: Input<'_>) -> Outcome {
    let claimed = input.u64();
    let mut bytes = input.rest().to_vec();
    // The file size: the header's own claim, or a size the input picks near it.
    let file_bytes = if mode & 0x10 != 0 {
        bytes.len() as u64
    } else {
        claimed
    };
    if mode & 0x20 != 0 {
        fix_size(&mut bytes, file_bytes);
    }
    match SegmentHeader::parse(&bytes, file_bytes) {
        Ok(h) => {
            assert_eq!(
                h.encode(),
                bytes[..SEGMENT_HEADER_BYTES],
                "an accepted segment header does not re-encode to its bytes"
            );
            assert_eq!(h.segment_bytes, file_bytes);
            if let Some(r) = h.ring {
                assert_eq!(r.check(file_bytes), Ok(()));
                assert!(r.offset + r.bytes() <= file_bytes, "ring past the segment");
            }
            format!("ok:header:{}", h.ring.is_some())
        }
        Err(e) => class("header", &e),
    }
}

fn memfd(mode: u8, mut input: Input<'_>) -> Outcome {
    let slices: Vec<(u64, u64)> = (0..3)
        .map(|_| (input.u64() % 4096, input.u64() % 8192))
        .collect();
    let mut bytes = input.rest().to_vec();
    if mode & 0x10 != 0 && (bytes.len() as u64) < MIN_SEGMENT_BYTES {
        bytes.resize(MIN_SEGMENT_BYTES as usize, 0);
    }
    if mode & 0x20 != 0 {
        let len = bytes.len() as u64;
        fix_size(&mut bytes, len);
    }
    let fd = rustix::fs::memfd_create(
        "sluice-fuzz",
        MemfdFlags::ALLOW_SEALING | MemfdFlags::CLOEXEC,
    )
    .expect("memfd_create");
    let mut file = std::fs::File::from(fd);
    file.write_all(&bytes).expect("write memfd");
    if mode & 0x40 == 0 {
        rustix::fs::fcntl_add_seals(&file, SealFlags::SHRINK | SealFlags::GROW)
            .expect("seal memfd");
    }
    // Bit 0x80: a cap of 8 KiB, so the size refusal is reached too.
    let policy = SegmentPolicy {
        max_bytes: if mode & 0x80 != 0 {
            8192
        } else {
            shared::shm_layout::MAX_SEGMENT_BYTES
        },
    };
    let segment = match Segment::from_fd(7, file.into(), policy) {
        Ok(s) => s,
        Err(e) => return class("segment", &e),
    };
    assert_eq!(segment.len_bytes(), bytes.len() as u64);
    let header =
        SegmentHeader::parse(&bytes, bytes.len() as u64).expect("the daemon accepted this header");
    let ring = segment.take_ring();
    assert_eq!(
        ring.map(|r| *r.layout()),
        header.ring,
        "the segment's ring is not the header's"
    );
    assert!(segment.take_ring().is_none(), "a ring was handed out twice");
    for (offset_bytes, length_bytes) in slices {
        let slice = ShmSlice {
            segment_id: 7,
            offset_bytes,
            length_bytes,
        };
        let got = segment.range(&slice).ok();
        assert_eq!(
            got,
            // The rule, stated here on its own: inside the segment past the header
            // (`range_in`), and ending before the ring when there is one.
            slice
                .range_in(bytes.len() as u64)
                .ok()
                .filter(|r| header.ring.is_none_or(|ring| r.end as u64 <= ring.offset)),
            "segment range disagrees with the layout"
        );
        if let Some(r) = got {
            assert!(r.end <= bytes.len(), "slice past the segment");
        }
    }
    format!("ok:segment:{}", header.ring.is_some())
}
