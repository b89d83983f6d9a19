//! Tests of opening a source: which reader and O_DIRECT `open_source` reports, the fallbacks with
//! their reasons, device reads, concurrent callers, a panic with reads in flight, and error
//! messages.

use super::*;

#[test]
fn open_source_reports_the_reader_and_o_direct() {
    let fx = fixture();
    let dir = fx.path.parent().expect("dir");
    let (source, info) = open_source(dir, IoKind::Pread).expect("open pread");
    assert_eq!(
        (source.name(), info.kind, info.features.len()),
        ("pread", IoKind::Pread, 0)
    );
    println!("pread: {info}");
    let (source, info) = open_source(dir, IoKind::Uring).expect("open uring");
    println!("uring asked: {info}");
    match uring() {
        Some(_) => {
            assert_eq!((source.name(), info.kind), ("io_uring", IoKind::Uring));
            assert!(info.features.iter().any(|f| f == "op_read"), "{info}");
        }
        None => {
            assert_eq!((source.name(), info.kind), ("pread", IoKind::Pread));
            assert!(
                info.fallback_reason
                    .as_deref()
                    .is_some_and(|r| r.contains("io_uring unavailable")),
                "{info}"
            );
        }
    }
    if !info.o_direct {
        println!(
            "NOTE: O_DIRECT not in use on {}: {:?}",
            dir.display(),
            info.fallback_reason
        );
    }
    check(
        "open_source",
        &*source,
        &fx.bytes,
        &every_expert(),
        &vec![None; every_expert().len()],
    );
}

#[test]
fn uring_unavailable_falls_back_to_pread_with_the_reason() {
    let fx = fixture();
    let opts = SourceOptions {
        kind: IoKind::Uring,
        o_direct: true,
    };
    let (source, info) = open_source_inner(&fx.path, opts, DirectProbe::Real, || {
        Err("io_uring_setup: EPERM (test)".into())
    })
    .expect("open");
    assert_eq!((source.name(), info.kind), ("pread", IoKind::Pread));
    assert!(info.features.is_empty());
    let reason = info.fallback_reason.clone().expect("a reason");
    assert!(
        reason.contains("io_uring unavailable (io_uring_setup: EPERM (test)); using pread"),
        "{reason}"
    );
    assert!(info.to_string().starts_with("io=pread"), "{info}");
    check(
        "fallback",
        &*source,
        &fx.bytes,
        &[(2, 2), (3, 3)],
        &[None, None],
    );
}

#[test]
fn o_direct_refused_falls_back_to_buffered_with_the_reason() {
    let fx = fixture();
    for kind in [IoKind::Uring, IoKind::Pread] {
        let opts = SourceOptions {
            kind,
            o_direct: true,
        };
        let (source, info) =
            open_source_inner(&fx.path, opts, DirectProbe::Refuse, UringSupport::detect)
                .expect("open");
        assert!(!info.o_direct);
        let reason = info.fallback_reason.clone().expect("a reason");
        assert!(
            reason.starts_with("O_DIRECT open refused by the filesystem"),
            "{reason}"
        );
        check(
            "buffered",
            &*source,
            &fx.bytes,
            &[(0, 0), (3, 39)],
            &[None, None],
        );
    }
    let opts = SourceOptions {
        kind: IoKind::Pread,
        o_direct: false,
    };
    let (_, info) =
        open_source_inner(&fx.path, opts, DirectProbe::Real, UringSupport::detect).expect("open");
    assert_eq!(
        (info.o_direct, info.fallback_reason),
        (false, None),
        "buffered by choice is not a fallback"
    );
}

/// `read_bytes` of /proc/self/io: bytes this process caused to be fetched from storage.
fn physical_read_bytes() -> Option<u64> {
    shared::procfs::read_bytes(None)
}

#[test]
fn o_direct_reads_come_from_the_device_not_the_page_cache() {
    let fx = fixture(); // Just written: every page of it is in the page cache.
    for kind in [IoKind::Uring, IoKind::Pread] {
        let (source, info) = open_source(fx.path.parent().expect("dir"), kind).expect("open");
        if !info.o_direct {
            println!("SKIP O_DIRECT proof for {kind}: {info}");
            continue;
        }
        let Some(before) = physical_read_bytes() else {
            println!("SKIP O_DIRECT proof: /proc/self/io has no read_bytes");
            return;
        };
        let all = every_expert();
        check(
            "o_direct",
            &*source,
            &fx.bytes,
            &all,
            &vec![None; all.len()],
        );
        let read = physical_read_bytes().expect("read_bytes") - before;
        let want = (all.len() * source.blob_stride()) as u64;
        // Other tests may read concurrently, so at least; a buffered read of cached pages adds 0.
        assert!(
            read >= want,
            "{}: {read} bytes from the device, {want} requested: not bypassing the page cache?",
            source.name()
        );
    }
}

#[test]
fn concurrent_callers_share_the_uring_source() {
    let Some(support) = uring() else { return };
    let fx = fixture();
    let source = UringSource::new(
        ContainerIndex::open(&fx.path).expect("index"),
        data(&fx.path),
        support,
    );
    std::thread::scope(|s| {
        for t in 0..8u32 {
            let (source, bytes) = (&source, &fx.bytes);
            s.spawn(move || {
                for round in 0..5u32 {
                    let batch: Vec<_> = (0..12)
                        .map(|i| ((t + round + i) % 4, (t * 5 + i * 3 + round) % 40))
                        .collect();
                    check(
                        "concurrent",
                        source,
                        bytes,
                        &batch,
                        &vec![None; batch.len()],
                    );
                }
            });
        }
    });
    let pooled = source.pooled_rings();
    assert!(
        (1..=uring::MAX_POOLED_RINGS).contains(&pooled),
        "{pooled} idle rings"
    );
}

#[test]
fn a_panic_with_reads_in_flight_waits_for_them_before_unwinding() {
    let Some(support) = uring() else { return };
    let fx = fixture();
    let source = UringSource::new(
        ContainerIndex::open(&fx.path).expect("index"),
        data(&fx.path),
        support,
    )
    .with_panic_in_flight();
    let all = every_expert();
    let stride = source.blob_stride();
    let mut buf = AlignedBuf::zeroed(stride * all.len());
    buf.fill(0xaa);
    let drained_before = uring::DRAINED_READS.load(std::sync::atomic::Ordering::Relaxed);
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut reqs: Vec<ReadRequest<'_>> = buf
            .chunks_exact_mut(stride)
            .zip(&all)
            .map(|(dst, &(layer, expert))| ReadRequest {
                layer: lid(layer),
                expert: eid(expert),
                dst,
            })
            .collect();
        source.read_blobs(&mut reqs)
    }));
    assert!(unwound.is_err(), "the test hook panics");
    // Every read that was in flight (the first ring's worth) was reaped, so finished, before
    // the unwind ended the borrow; the rest were never submitted.
    let in_flight = uring::RING_ENTRIES as usize;
    let drained = uring::DRAINED_READS.load(std::sync::atomic::Ordering::Relaxed) - drained_before;
    assert_eq!(
        drained, in_flight,
        "the guard reaps every read in flight while unwinding"
    );
    for (i, (chunk, &(l, e))) in buf.chunks_exact(stride).zip(&all).enumerate() {
        let at = blob_offset(l, e) as usize;
        if i < in_flight {
            assert!(
                chunk == &fx.bytes[at..at + stride],
                "blob {i} was in flight and must be complete"
            );
        } else {
            assert!(
                chunk.iter().all(|&b| b == 0xaa),
                "blob {i} was never submitted"
            );
        }
    }
    // Nothing writes into the buffer later, and the ring was not put back into the pool.
    buf.fill(0x55);
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(buf.iter().all(|&b| b == 0x55));
    assert_eq!(source.pooled_rings(), 0);
}

#[test]
fn sources_are_send_sync_and_boxable() {
    fn assert_source<S: ExpertSource>() {}
    assert_source::<UringSource>();
    assert_source::<PreadSource>();
    assert_source::<MemSource>();
    assert_source::<FaultySource<Box<dyn ExpertSource>>>();
    assert_source::<std::sync::Arc<dyn ExpertSource>>();
}

#[test]
fn error_messages_name_layer_expert_and_offset() {
    let cases = [
        (
            IoError::ShortRead {
                layer: lid(3),
                expert: eid(7),
                offset: 8192,
                got: 4096,
                want: 8192,
            },
            "layer 3 expert 7: short read of the blob at file offset 8192: got 4096 of 8192 bytes (file truncated?)",
        ),
        (
            IoError::Os {
                layer: lid(3),
                expert: eid(7),
                offset: 8192,
                errno: Errno::IO.raw_os_error(),
            },
            "layer 3 expert 7: reading the blob at file offset 8192: Input/output error (os error 5)",
        ),
        (
            IoError::OutOfRange {
                layer: lid(40),
                expert: eid(0),
            },
            "layer 40 expert 0 is not in the container",
        ),
        (
            IoError::Unaligned {
                layer: lid(1),
                expert: eid(2),
                addr: 0x1040,
                len: 8192,
                stride: 8192,
            },
            "layer 1 expert 2: destination buffer at 0x1040 of 8192 bytes is not a 4096-aligned buffer of exactly one blob stride (8192 bytes)",
        ),
    ];
    for (e, text) in cases {
        assert_eq!(e.to_string(), text);
    }
    let fx = fixture();
    let loss = data_loss_checksum(&corrupt(&fx, 0), 1, 2);
    let text = loss.to_string();
    assert!(
        text.starts_with(&format!(
            "data loss: layer 1 expert 2: blob at file offset {}: checksum mismatch",
            blob_offset(1, 2)
        )),
        "{text}"
    );
}
