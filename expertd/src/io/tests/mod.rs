//! Unit tests of the expert readers on a synthetic container (4 layers × 40 experts, two-page
//! blobs): every source returns the file's bytes; corruption, truncation, contract violations
//! and injected faults map to exactly the expected `IoError`, for that request only; io_uring
//! falls back to pread, and O_DIRECT to buffered reads, with a reason. io_uring cases print a
//! SKIP line and are left out when the ring cannot be created here.

use super::*;
use shared::container::ModelIdentity;
use shared::container::layout::{ContainerLayout, ExpertDims};
use shared::container::writer::{encode_blob, finish};
use shared::kernels::int8::quantize_weights;
use std::path::PathBuf;

mod open;

/// 160 blobs: more than one ring's worth (64) in a single batch.
const DIMS: (usize, usize, usize, usize) = (4, 40, 64, 32);

fn layout() -> ContainerLayout {
    ContainerLayout::new(ExpertDims::new(DIMS.0, DIMS.1, DIMS.2, DIMS.3).expect("dims"))
        .expect("layout")
}

/// A deterministic container's bytes: blob i holds weights from an LCG seeded with i.
fn container_bytes() -> Vec<u8> {
    let layout = layout();
    let b = layout.blob;
    let mut out = vec![0u8; layout.file_bytes as usize];
    let mut sums = Vec::new();
    for i in 0..layout.dims.n_blobs() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ (i as u64 + 1);
        let mut values = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    state = state
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    ((state >> 40) as f32 / (1u64 << 24) as f32) - 0.5
                })
                .collect()
        };
        let gu = quantize_weights(
            &values(b.gate_up_rows * b.gate_up_cols),
            b.gate_up_rows,
            b.gate_up_cols,
        );
        let dn = quantize_weights(&values(b.down_rows * b.down_cols), b.down_rows, b.down_cols);
        let at = layout.blob_offset_at(i) as usize;
        sums.push(
            encode_blob(&b, &gu.as_ref(), &dn.as_ref(), &mut out[at..at + b.stride])
                .expect("encode"),
        );
    }
    let identity = ModelIdentity {
        config_sha256: [1; 32],
        expert_tensors_sha256: [2; 32],
        expert_sample_sha256: [3; 32],
    };
    let (region, header) = finish(identity, layout, &sums);
    out[..HEADER_BYTES].copy_from_slice(&header.encode());
    let at = layout.index_offset as usize;
    out[at..at + region.len()].copy_from_slice(&region);
    out
}

/// A container written under the target directory (so on the build's disk, not a tmpfs /tmp).
struct Fixture {
    _dir: tempfile::TempDir,
    path: PathBuf,
    bytes: Vec<u8>,
}

fn fixture() -> Fixture {
    let exe = std::env::current_exe().expect("test executable");
    let dir = tempfile::tempdir_in(exe.parent().expect("target/<profile>/deps")).expect("tempdir");
    let bytes = container_bytes();
    let path = dir.path().join(CONTAINER_FILE);
    std::fs::write(&path, &bytes).expect("write container");
    Fixture {
        _dir: dir,
        path,
        bytes,
    }
}

/// io_uring support, or `None` after printing why the io_uring cases are skipped.
fn uring() -> Option<UringSupport> {
    match UringSupport::detect() {
        Ok(s) => Some(s),
        Err(reason) => {
            println!("SKIP io_uring cases: {reason}");
            None
        }
    }
}

fn data(path: &Path) -> DataFile {
    DataFile::open(path, true, DirectProbe::Real).expect("open data file")
}

/// Every disk and memory reader over `path`, including ones that split each blob into
/// one-page reads (the short-read continuation path) and a single-threaded pread.
fn sources(path: &Path) -> Vec<(String, Box<dyn ExpertSource>)> {
    let index = || ContainerIndex::open(path).expect("open index");
    let mut out: Vec<(String, Box<dyn ExpertSource>)> = vec![
        ("mem".into(), Box::new(MemSource::open(path).expect("mem"))),
        (
            "pread".into(),
            Box::new(PreadSource::new(index(), data(path))),
        ),
        (
            "pread 1 thread".into(),
            Box::new(PreadSource::new(index(), data(path)).with_threads(1)),
        ),
        (
            "pread 4 KiB pieces".into(),
            Box::new(PreadSource::new(index(), data(path)).with_max_read_bytes(BLOCK_BYTES)),
        ),
    ];
    if let Some(s) = uring() {
        out.push((
            "io_uring".into(),
            Box::new(UringSource::new(index(), data(path), s)),
        ));
    }
    if let Some(s) = uring() {
        let src = UringSource::new(index(), data(path), s).with_max_sqe_bytes(BLOCK_BYTES as u32);
        out.push(("io_uring 4 KiB pieces".into(), Box::new(src)));
    }
    out
}

/// Reads `batch` through `source` into aligned stride-sized buffers and checks each result:
/// `None` means success with exactly the file's bytes for that blob, `Some(e)` that error.
fn check(
    name: &str,
    source: &dyn ExpertSource,
    file: &[u8],
    batch: &[(u32, u32)],
    expected: &[Option<IoError>],
) {
    assert_eq!(batch.len(), expected.len());
    let stride = source.blob_stride();
    let mut buf = AlignedBuf::zeroed(stride * batch.len());
    let mut reqs: Vec<ReadRequest<'_>> = buf
        .chunks_exact_mut(stride)
        .zip(batch)
        .map(|(dst, &(layer, expert))| ReadRequest {
            layer: lid(layer),
            expert: eid(expert),
            dst,
        })
        .collect();
    let results = source.read_blobs(&mut reqs);
    assert_eq!(results.len(), batch.len(), "{name}: one result per request");
    for ((req, result), want) in reqs.iter().zip(results).zip(expected) {
        match (result, want) {
            (Ok(()), None) => {
                let at = source
                    .container()
                    .entry(req.layer, req.expert)
                    .expect("in range")
                    .offset as usize;
                assert!(
                    req.dst == &file[at..at + stride],
                    "{name}: layer {} expert {}: bytes differ from the file",
                    req.layer,
                    req.expert
                );
            }
            (got, want) => assert_eq!(
                got.err(),
                want.clone(),
                "{name}: layer {} expert {}",
                req.layer,
                req.expert
            ),
        }
    }
}

fn every_expert() -> Vec<(u32, u32)> {
    (0..DIMS.0 as u32)
        .flat_map(|l| (0..DIMS.1 as u32).map(move |e| (l, e)))
        .collect()
}

fn blob_offset(layer: u32, expert: u32) -> u64 {
    layout()
        .blob_offset(lid(layer), eid(expert))
        .expect("in range")
}

fn lid(layer: u32) -> LayerId {
    LayerId::new(layer)
}

fn eid(expert: u32) -> ExpertId {
    ExpertId::new(expert)
}

#[test]
fn every_source_returns_the_file_bytes_for_every_expert() {
    let fx = fixture();
    let all = every_expert();
    for (name, source) in sources(&fx.path) {
        check(&name, &*source, &fx.bytes, &all, &vec![None; all.len()]);
        // Small batches, a repeated expert, and reverse order.
        check(&name, &*source, &fx.bytes, &[(3, 39)], &[None]);
        check(
            &name,
            &*source,
            &fx.bytes,
            &[(1, 7), (1, 7), (0, 0)],
            &[None, None, None],
        );
        let rev: Vec<_> = all.iter().rev().copied().take(70).collect();
        check(&name, &*source, &fx.bytes, &rev, &vec![None; rev.len()]);
        assert!(source.read_blobs(&mut []).is_empty(), "{name}: empty batch");
    }
}

#[test]
fn disk_sources_match_container_file_read_expert() {
    let fx = fixture();
    let reader = ContainerFile::open_file(&fx.path).expect("open");
    let mut expected = Vec::new();
    for (l, e) in every_expert() {
        let mut buf = Vec::new();
        reader
            .read_expert(lid(l), eid(e), &mut buf)
            .expect("read_expert");
        expected.extend_from_slice(&buf);
    }
    let start = layout().blobs_offset as usize;
    assert!(
        expected == fx.bytes[start..],
        "read_expert returns the blob region in order"
    );
    // `check` compares against the same file bytes, so every source equals read_expert.
}

/// Flips one byte of blob (1, 2) on disk at `at` (offset inside the blob).
fn corrupt(fx: &Fixture, at: usize) -> Vec<u8> {
    let mut bytes = fx.bytes.clone();
    bytes[blob_offset(1, 2) as usize + at] ^= 0x01;
    std::fs::write(&fx.path, &bytes).expect("rewrite");
    bytes
}

fn data_loss_checksum(bytes: &[u8], layer: u32, expert: u32) -> IoError {
    let b = layout().blob;
    let offset = blob_offset(layer, expert);
    let blob = &bytes[offset as usize..offset as usize + b.stride];
    let computed = shared::container::checksum::checksum(&blob[..b.checksum_offset]);
    let trailer = u64::from_le_bytes(
        blob[b.checksum_offset..b.content_bytes]
            .try_into()
            .expect("8 bytes"),
    );
    let index = ContainerIndex::from_bytes(bytes)
        .expect("index")
        .entry(lid(layer), eid(expert))
        .expect("in range")
        .checksum;
    let (layer, expert) = (lid(layer), eid(expert));
    let detail = ContainerError::BlobChecksum {
        layer,
        expert,
        offset,
        computed,
        trailer,
        index: Some(index),
    };
    IoError::DataLoss {
        layer,
        expert,
        offset,
        detail,
    }
}

#[test]
fn corrupt_blob_is_data_loss_for_that_expert_only() {
    let fx = fixture();
    let bytes = corrupt(&fx, 100);
    let want = data_loss_checksum(&bytes, 1, 2);
    assert_eq!(want.error_type(), "data_loss");
    for (name, source) in sources(&fx.path) {
        check(
            &name,
            &*source,
            &bytes,
            &[(1, 1), (1, 2), (1, 3)],
            &[None, Some(want.clone()), None],
        );
    }
}

#[test]
fn corrupt_trailer_and_padding_are_data_loss() {
    let b = layout().blob;
    let fx = fixture();
    let bytes = corrupt(&fx, b.checksum_offset + 3);
    for (name, source) in sources(&fx.path) {
        check(
            &name,
            &*source,
            &bytes,
            &[(1, 2), (0, 0)],
            &[Some(data_loss_checksum(&bytes, 1, 2)), None],
        );
    }
    let bytes = corrupt(&fx, b.stride - 1);
    let offset = blob_offset(1, 2);
    let detail = ContainerError::BlobPadding {
        layer: lid(1),
        expert: eid(2),
        offset,
        byte_offset: offset + b.stride as u64 - 1,
    };
    for (name, source) in sources(&fx.path) {
        let want = IoError::DataLoss {
            layer: lid(1),
            expert: eid(2),
            offset,
            detail: detail.clone(),
        };
        check(
            &name,
            &*source,
            &bytes,
            &[(0, 0), (1, 2)],
            &[None, Some(want)],
        );
    }
}

#[test]
fn truncated_file_is_short_read_for_the_blobs_past_the_end() {
    let fx = fixture();
    let sources = sources(&fx.path);
    // Opened and validated first, then the file shrinks: the last blob is cut after one page.
    let stride = layout().blob.stride as u64;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&fx.path)
        .expect("open for truncate");
    file.set_len(layout().file_bytes - stride + BLOCK_BYTES as u64)
        .expect("truncate");
    let (last_l, last_e) = (DIMS.0 as u32 - 1, DIMS.1 as u32 - 1);
    let offset = blob_offset(last_l, last_e);
    let want = IoError::ShortRead {
        layer: lid(last_l),
        expert: eid(last_e),
        offset,
        got: BLOCK_BYTES as u64,
        want: stride,
    };
    assert_eq!(want.error_type(), "short_read");
    for (name, source) in &sources {
        if source.name() == "mem" {
            continue; // holds the bytes it was opened with
        }
        check(
            name,
            &**source,
            &fx.bytes,
            &[(0, 5), (last_l, last_e), (last_l, 0)],
            &[None, Some(want.clone()), None],
        );
    }
    file.set_len(layout().file_bytes - stride)
        .expect("truncate");
    let want = IoError::ShortRead {
        layer: lid(last_l),
        expert: eid(last_e),
        offset,
        got: 0,
        want: stride,
    };
    for (name, source) in &sources {
        if source.name() != "mem" {
            check(
                name,
                &**source,
                &fx.bytes,
                &[(last_l, last_e), (2, 2)],
                &[Some(want.clone()), None],
            );
        }
    }
}

#[test]
fn contract_violations_fail_that_request_only() {
    let fx = fixture();
    for (name, source) in sources(&fx.path) {
        let stride = source.blob_stride();
        check(
            &name,
            &*source,
            &fx.bytes,
            &[(0, 1), (4, 0), (0, 40)],
            &[
                None,
                Some(IoError::OutOfRange {
                    layer: lid(4),
                    expert: eid(0),
                }),
                Some(IoError::OutOfRange {
                    layer: lid(0),
                    expert: eid(40),
                }),
            ],
        );
        let mut buf = AlignedBuf::zeroed(3 * stride + BLOCK_BYTES);
        let (good, rest) = buf.split_at_mut(stride);
        let (misaligned, short) = rest.split_at_mut(64 + stride);
        let misaligned = &mut misaligned[64..];
        let short = &mut short[..stride - BLOCK_BYTES];
        let (m_addr, s_addr) = (misaligned.as_ptr() as usize, short.as_ptr() as usize);
        let mut reqs = [
            ReadRequest {
                layer: lid(2),
                expert: eid(3),
                dst: misaligned,
            },
            ReadRequest {
                layer: lid(2),
                expert: eid(4),
                dst: good,
            },
            ReadRequest {
                layer: lid(2),
                expert: eid(5),
                dst: short,
            },
        ];
        let results = source.read_blobs(&mut reqs);
        let unaligned = |expert, addr, len| {
            Err(IoError::Unaligned {
                layer: lid(2),
                expert,
                addr,
                len,
                stride,
            })
        };
        assert_eq!(
            results,
            vec![
                unaligned(eid(3), m_addr, stride),
                Ok(()),
                unaligned(eid(5), s_addr, stride - BLOCK_BYTES)
            ],
            "{name}"
        );
        assert_eq!(results[0].as_ref().unwrap_err().error_type(), "unaligned");
    }
}

#[test]
fn faulty_source_maps_each_fault_exactly() {
    let fx = fixture();
    let stride = layout().blob.stride;
    let faulty = FaultySource::new(MemSource::from_bytes(fx.bytes.clone()).expect("mem"))
        .with_fault(lid(0), eid(1), Fault::Eio)
        .with_fault(lid(0), eid(2), Fault::ShortRead { got: 100 })
        .with_fault(lid(0), eid(3), Fault::FlipByte { at: 10 })
        .with_fault(lid(0), eid(4), Fault::FlipByte { at: stride - 1 })
        .with_fault(lid(9), eid(9), Fault::Eio);
    let mut flipped = fx.bytes.clone();
    flipped[blob_offset(0, 3) as usize + 10] ^= 0xff;
    let offset = |e| blob_offset(0, e);
    let expected = [
        None,
        Some(IoError::Os {
            layer: lid(0),
            expert: eid(1),
            offset: offset(1),
            errno: Errno::IO.raw_os_error(),
        }),
        Some(IoError::ShortRead {
            layer: lid(0),
            expert: eid(2),
            offset: offset(2),
            got: 100,
            want: stride as u64,
        }),
        Some(data_loss_checksum(&flipped, 0, 3)),
        Some(IoError::DataLoss {
            layer: lid(0),
            expert: eid(4),
            offset: offset(4),
            detail: ContainerError::BlobPadding {
                layer: lid(0),
                expert: eid(4),
                offset: offset(4),
                byte_offset: offset(4) + stride as u64 - 1,
            },
        }),
        Some(IoError::OutOfRange {
            layer: lid(9),
            expert: eid(9),
        }),
        None,
    ];
    check(
        "faulty",
        &faulty,
        &fx.bytes,
        &[(0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (9, 9), (0, 5)],
        &expected,
    );
    assert_eq!(
        (faulty.injected(), faulty.inner().blob_reads()),
        (4, 5),
        "EIO and out-of-range never reach the inner source"
    );
    let eio = expected[1].clone().expect("error");
    assert_eq!(
        (
            eio.error_type(),
            eio.to_string().contains("Input/output error")
        ),
        ("os", true),
        "{eio}"
    );
    faulty.set_fault(lid(0), eid(1), None);
    check("faulty, cleared", &faulty, &fx.bytes, &[(0, 1)], &[None]);
}
