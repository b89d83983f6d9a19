//! expertd's expert readers on containers made by `expertd prepare` from the committed tiny and
//! small fixtures: io_uring and pread return, for every expert, exactly the bytes
//! `ContainerFile::read_expert` returns; a corrupt blob on disk is `DataLoss` for that expert
//! only; a fault-injecting wrapper maps each fault to exactly one `IoError`. The io_uring cases
//! print a SKIP line and are left out where the kernel refuses io_uring.

use expertd::io::{
    AlignedBuf, ExpertSource, Fault, FaultySource, IoError, IoKind, ReadRequest, SourceInfo,
    open_source,
};
use shared::container::{ContainerError, ContainerFile};
use shared::ids::{ExpertId, LayerId};
use std::path::Path;
use tests::{model_dir, prepare_container};

/// A fresh directory on the build's disk (not a tmpfs /tmp), so `O_DIRECT` is exercised.
fn scratch() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir")
}

/// The sources to test: pread always, io_uring where the kernel allows it (else a SKIP line).
fn sources(dir: &Path) -> Vec<(Box<dyn ExpertSource>, SourceInfo)> {
    let mut out = vec![open_source(dir, IoKind::Pread).expect("open pread")];
    let (uring, info) = open_source(dir, IoKind::Uring).expect("open uring");
    if info.kind == IoKind::Uring {
        out.push((uring, info));
    } else {
        shared::skip::skip(
            "io_uring",
            "the io_uring cases",
            info.fallback_reason
                .as_deref()
                .unwrap_or("io_uring not in use"),
        );
    }
    for (_, info) in &out {
        println!("{}: {info}", dir.display());
    }
    out
}

/// Every (layer, expert) of the container.
fn every_expert(source: &dyn ExpertSource) -> Vec<(u32, u32)> {
    let dims = source.container().header().layout.dims;
    (0..dims.n_layers as u32)
        .flat_map(|l| (0..dims.n_experts as u32).map(move |e| (l, e)))
        .collect()
}

/// Reads `batch` (one submission) into aligned buffers; returns each blob's bytes or error.
fn read(source: &dyn ExpertSource, batch: &[(u32, u32)]) -> Vec<Result<Vec<u8>, IoError>> {
    let stride = source.blob_stride();
    let mut buf = AlignedBuf::zeroed(stride * batch.len());
    let mut reqs: Vec<ReadRequest<'_>> = buf
        .chunks_exact_mut(stride)
        .zip(batch)
        .map(|(dst, &(l, e))| ReadRequest {
            layer: LayerId::new(l),
            expert: ExpertId::new(e),
            dst,
        })
        .collect();
    let results = source.read_blobs(&mut reqs);
    assert_eq!(results.len(), batch.len());
    results
        .into_iter()
        .zip(&reqs)
        .map(|(r, req)| r.map(|()| req.dst.to_vec()))
        .collect()
}

/// `ContainerFile::read_expert`'s bytes for (layer, expert).
fn reference(file: &ContainerFile, layer: u32, expert: u32) -> Vec<u8> {
    let mut buf = Vec::new();
    file.read_expert(LayerId::new(layer), ExpertId::new(expert), &mut buf)
        .expect("read_expert");
    buf
}

#[test]
fn uring_and_pread_return_read_expert_bytes_for_every_expert() {
    for preset in ["tiny", "small"] {
        let dir = scratch();
        prepare_container(&model_dir(preset), dir.path());
        let file = ContainerFile::open(dir.path()).expect("open container");
        for (source, info) in sources(dir.path()) {
            let all = every_expert(&*source);
            let expected: Vec<Vec<u8>> = all.iter().map(|&(l, e)| reference(&file, l, e)).collect();
            // The whole container in one batch, then layer-call-sized batches of 8.
            let whole = read(&*source, &all);
            for chunk in [
                whole,
                all.chunks(8).flat_map(|c| read(&*source, c)).collect(),
            ] {
                for ((got, want), (l, e)) in chunk.into_iter().zip(&expected).zip(&all) {
                    let got = got.unwrap_or_else(|err| {
                        panic!("{preset} {info}: layer {l} expert {e}: {err}")
                    });
                    assert!(
                        &got == want,
                        "{preset} {info}: layer {l} expert {e}: bytes differ from read_expert"
                    );
                }
            }
        }
    }
}

#[test]
fn corrupt_blob_on_disk_is_data_loss_for_that_expert_only() {
    let dir = scratch();
    prepare_container(&model_dir("small"), dir.path());
    let file = ContainerFile::open(dir.path()).expect("open container");
    let (layer, expert) = (2u32, 5u32);
    let entry = file.index()[layer as usize * 16 + expert as usize];
    let healthy = [(2, 4), (2, 6), (0, 0)].map(|(l, e)| (l, e, reference(&file, l, e)));
    drop(file);
    tests::corrupt_blobs(dir.path(), &[layer as usize * 16 + expert as usize], 1000);
    for (source, info) in sources(dir.path()) {
        let batch = [(2, 4), (layer, expert), (2, 6), (0, 0)];
        let results = read(&*source, &batch);
        match &results[1] {
            Err(IoError::DataLoss {
                layer,
                expert,
                offset,
                detail: ContainerError::BlobChecksum { index, .. },
            }) if (layer.get(), expert.get()) == (2, 5) => {
                assert_eq!(
                    (*offset, *index),
                    (entry.offset, Some(entry.checksum)),
                    "{info}"
                );
            }
            other => panic!("{info}: expected DataLoss for layer 2 expert 5, got {other:?}"),
        }
        let err = results[1].as_ref().unwrap_err();
        assert_eq!(err.error_type(), "data_loss");
        assert!(
            err.to_string().contains(&format!(
                "layer 2 expert 5: blob at file offset {}",
                entry.offset
            )),
            "{err}"
        );
        for (got, (l, e, want)) in [&results[0], &results[2], &results[3]]
            .into_iter()
            .zip(&healthy)
        {
            assert!(
                got.as_ref().is_ok_and(|b| b == want),
                "{info}: layer {l} expert {e} should be unaffected: {got:?}"
            );
        }
    }
}

#[test]
fn faulty_source_over_a_disk_source_maps_each_fault_exactly() {
    let dir = scratch();
    prepare_container(&model_dir("tiny"), dir.path());
    let file = ContainerFile::open(dir.path()).expect("open container");
    for (source, info) in sources(dir.path()) {
        let stride = source.blob_stride() as u64;
        let offset = |l: u32, e: u32| {
            source
                .container()
                .entry(LayerId::new(l), ExpertId::new(e))
                .expect("in range")
                .offset
        };
        let (o_eio, o_short, o_flip) = (offset(1, 1), offset(1, 2), offset(3, 7));
        let faulty = FaultySource::new(source)
            .with_fault(LayerId::new(1), ExpertId::new(1), Fault::Eio)
            .with_fault(
                LayerId::new(1),
                ExpertId::new(2),
                Fault::ShortRead { got: 4096 },
            )
            .with_fault(LayerId::new(3), ExpertId::new(7), Fault::FlipByte { at: 0 });
        let results = read(&faulty, &[(1, 0), (1, 1), (1, 2), (3, 7), (4, 0)]);
        assert_eq!(
            results[0].as_ref().ok(),
            Some(&reference(&file, 1, 0)),
            "{info}"
        );
        assert_eq!(
            results[1],
            Err(IoError::Os {
                layer: LayerId::new(1),
                expert: ExpertId::new(1),
                offset: o_eio,
                errno: 5 /* EIO */
            }),
            "{info}"
        );
        assert_eq!(
            results[2],
            Err(IoError::ShortRead {
                layer: LayerId::new(1),
                expert: ExpertId::new(2),
                offset: o_short,
                got: 4096,
                want: stride
            }),
            "{info}"
        );
        assert!(
            matches!(&results[3], Err(IoError::DataLoss { layer, expert, offset, detail: ContainerError::BlobChecksum { .. } }) if (layer.get(), expert.get(), *offset) == (3, 7, o_flip)),
            "{info}: {:?}",
            results[3]
        );
        assert_eq!(
            results[4],
            Err(IoError::OutOfRange {
                layer: LayerId::new(4),
                expert: ExpertId::new(0)
            }),
            "{info}"
        );
        let types: Vec<&str> = results
            .iter()
            .skip(1)
            .map(|r| r.as_ref().unwrap_err().error_type())
            .collect();
        assert_eq!(types, ["os", "short_read", "data_loss", "out_of_range"]);
        assert_eq!(faulty.injected(), 3, "{info}");
    }
}
