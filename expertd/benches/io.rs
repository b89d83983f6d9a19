//! Expert-read throughput in GB/s on a real-dimension container (3,174,400-byte blobs):
//! io_uring vs pread, batches of 8 and 64 blobs, cold (`O_DIRECT`: every byte comes from the
//! device, which the bench proves by counting /proc/self/io `read_bytes`) and warm (buffered,
//! the same blobs already in the page cache). Every read includes the checksum verification;
//! `verify_only` measures that part alone.
//!
//! The container is `$SLUICE_BENCH_CONTAINER` or `/tmp/rd4c/experts.sluice` (made by
//! `expertd prepare` from a 4-layer real-dimension checkpoint); without one the bench prints
//! why and measures nothing. Run: `cargo bench -p expertd --bench io`.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use expertd::io::{AlignedBuf, ExpertSource, IoKind, ReadRequest, SourceOptions, open_source_with};
use shared::ids::{ExpertId, LayerId};
use std::path::PathBuf;
use std::time::Duration;

const DEFAULT_CONTAINER: &str = "/tmp/rd4c/experts.sluice";
const BATCHES: [usize; 2] = [8, 64];

fn container() -> Option<PathBuf> {
    let path = std::env::var_os("SLUICE_BENCH_CONTAINER")
        .map_or_else(|| PathBuf::from(DEFAULT_CONTAINER), PathBuf::from);
    if path.exists() {
        Some(path)
    } else {
        eprintln!(
            "SKIP io bench: no container at {} (set SLUICE_BENCH_CONTAINER)",
            path.display()
        );
        None
    }
}

fn open(path: &std::path::Path, kind: IoKind, o_direct: bool) -> Box<dyn ExpertSource> {
    let (source, info) =
        open_source_with(path, SourceOptions { kind, o_direct }).expect("open container");
    eprintln!("{kind:?} o_direct={o_direct}: {info}");
    source
}

/// Every (layer, expert) of the container in a fixed pseudo-random order.
fn shuffled(source: &dyn ExpertSource) -> Vec<(u32, u32)> {
    let dims = source.container().header().layout.dims;
    let mut all: Vec<(u32, u32)> = (0..dims.n_layers as u32)
        .flat_map(|l| (0..dims.n_experts as u32).map(move |e| (l, e)))
        .collect();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for i in (1..all.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        all.swap(i, (state % (i as u64 + 1)) as usize);
    }
    all
}

fn read_batch(source: &dyn ExpertSource, buf: &mut AlignedBuf, batch: &[(u32, u32)]) {
    let stride = source.blob_stride();
    let mut reqs: Vec<ReadRequest<'_>> = buf
        .chunks_exact_mut(stride)
        .zip(batch)
        .map(|(dst, &(layer, expert))| ReadRequest {
            layer: LayerId::new(layer),
            expert: ExpertId::new(expert),
            dst,
        })
        .collect();
    for (r, (l, e)) in source.read_blobs(&mut reqs).into_iter().zip(batch) {
        r.unwrap_or_else(|err| panic!("layer {l} expert {e}: {err}"));
    }
}

/// `read_bytes` of /proc/self/io: bytes this process (all threads, io-wq workers included)
/// caused to be fetched from storage.
fn physical_read_bytes() -> u64 {
    shared::procfs::read_bytes(None).unwrap_or(0)
}

/// Reads 64 distinct blobs and prints how many bytes came from the device.
fn prove(label: &str, source: &dyn ExpertSource, batch: &[(u32, u32)], buf: &mut AlignedBuf) {
    let before = physical_read_bytes();
    read_batch(source, buf, batch);
    let device = physical_read_bytes() - before;
    let asked = (batch.len() * source.blob_stride()) as u64;
    eprintln!(
        "{label}: {asked} bytes read, {device} from the device (/proc/self/io read_bytes) = {:.3}",
        device as f64 / asked as f64
    );
}

fn bench_io(c: &mut Criterion) {
    let Some(path) = container() else { return };
    for kind in [IoKind::Uring, IoKind::Pread] {
        let cold = open(&path, kind, true);
        let all = shuffled(&*cold);
        let stride = cold.blob_stride();
        let mut buf = AlignedBuf::zeroed(stride * BATCHES[1]);
        prove(&format!("{kind:?} O_DIRECT"), &*cold, &all[..64], &mut buf);
        let mut group = c.benchmark_group(format!("cold_o_direct/{kind:?}"));
        for n in BATCHES {
            group.throughput(Throughput::Bytes((n * stride) as u64));
            let mut cursor = 0;
            group.bench_function(BenchmarkId::from_parameter(n), |b| {
                b.iter(|| {
                    // Distinct blobs each iteration, cycling through the whole container.
                    if cursor + n > all.len() {
                        cursor = 0;
                    }
                    read_batch(&*cold, &mut buf, &all[cursor..cursor + n]);
                    cursor += n;
                });
            });
        }
        group.finish();
        drop(cold);

        let warm = open(&path, kind, false);
        let set = &all[..BATCHES[1]];
        read_batch(&*warm, &mut buf, set); // Fill the page cache with this set.
        prove(&format!("{kind:?} buffered, warm"), &*warm, set, &mut buf);
        let mut group = c.benchmark_group(format!("warm_page_cache/{kind:?}"));
        for n in BATCHES {
            group.throughput(Throughput::Bytes((n * stride) as u64));
            group.bench_function(BenchmarkId::from_parameter(n), |b| {
                b.iter(|| read_batch(&*warm, &mut buf, &set[..n]));
            });
        }
        group.finish();
    }

    // The verification every read includes, alone: one blob already in memory.
    let source = open(&path, IoKind::Pread, false);
    let stride = source.blob_stride();
    let mut buf = AlignedBuf::zeroed(stride);
    read_batch(&*source, &mut buf, &[(0, 0)]);
    let index = source.container();
    let (l0, e0) = (LayerId::new(0), ExpertId::new(0));
    let entry = index.entry(l0, e0).expect("blob (0, 0)");
    let mut group = c.benchmark_group("verify_only");
    group.throughput(Throughput::Bytes(stride as u64));
    group.bench_function("check_blob", |b| {
        b.iter(|| index.verify(l0, e0, entry, &buf).expect("valid blob"));
    });
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
}

criterion_group! { name = benches; config = config(); targets = bench_io }
criterion_main!(benches);
