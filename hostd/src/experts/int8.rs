//! The in-process container expert backend (INT8 or 4-bit, as the container holds): memory-maps the container (the page cache is the
//! only cache; io_uring, O_DIRECT and the leased, byte-budgeted cache are expertd's job),
//! verifies each expert blob's checksum the first time it is used, and runs the W8A8 kernels
//! straight from the mapping afterwards.
//!
//! Each expert's weights are read once per call for all rows routed to it; each row's weighted
//! outputs are summed in the call's order, so results do not depend on grouping. A blob that
//! fails verification fails every call that uses it (it is never marked verified).

use super::{ExpertBackend, ExpertError, MoeCall, validate_call};
use crate::model::weights::MappedCheckpoint;
use crate::profile::Profiler;
use memmap2::Mmap;
use shared::container::{BlobAt, ContainerError, ContainerFile, ExpertBlob, check_blob};
use shared::ids::{ExpertId, LayerId};
use shared::kernels::int8::Int8Isa;
use shared::moe_exec::MoeExec;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

/// Why the container cannot serve this model.
#[derive(Debug, thiserror::Error)]
pub enum Int8LoadError {
    /// The container is unreadable or corrupt.
    #[error(transparent)]
    Container(#[from] ContainerError),
    /// The container file cannot be memory-mapped.
    #[error("{path}: cannot memory-map: {message}")]
    Map {
        /// The container file.
        path: String,
        /// The OS error.
        message: String,
    },
    /// The container was prepared from another model.
    #[error(
        "container {container} was prepared from a different model than {model} ({what} differ); make one for it with `expertd prepare {model} --out DIR [--format FORMAT]` (identities: container {theirs}, model {ours})"
    )]
    WrongModel {
        /// The container file.
        container: String,
        /// The model directory.
        model: String,
        /// Which identity components differ.
        what: String,
        /// The container's config digest (hex).
        theirs: String,
        /// The model's config digest (hex).
        ours: String,
    },
}

/// Routed experts computed with W8A8 kernels from the INT8 container.
pub struct Int8Experts {
    container: ContainerFile,
    map: Mmap,
    /// One flag per index entry: its blob's checksum has been verified in the mapping.
    verified: Vec<AtomicBool>,
    isa: Int8Isa,
    n_layers: usize,
    n_experts: usize,
    hidden: usize,
}

impl Int8Experts {
    /// Opens the container in `dir` and checks it was prepared from `weights` (a checkpoint
    /// directory or a GGUF file).
    pub fn open(
        dir: &Path,
        weights: &MappedCheckpoint,
        isa: Int8Isa,
    ) -> Result<Int8Experts, Int8LoadError> {
        let container = ContainerFile::open(dir)?;
        let ours = weights.identity()?;
        let theirs = container.header().identity;
        let what = theirs.differing(&ours);
        if !what.is_empty() {
            return Err(Int8LoadError::WrongModel {
                container: container.path().display().to_string(),
                model: weights.path().display().to_string(),
                what: what.join(", "),
                theirs: theirs.short_hex(),
                ours: ours.short_hex(),
            });
        }
        let cfg = &weights.config().text;
        let map_err = |e: std::io::Error| Int8LoadError::Map {
            path: container.path().display().to_string(),
            message: e.to_string(),
        };
        let file = std::fs::File::open(container.path()).map_err(map_err)?;
        // SAFETY: read-only private mapping. As with the checkpoint shards, we rely on nobody
        // rewriting the container while it is served; every blob is still checksummed once in
        // the mapping before its first use, and the length was checked when it was opened.
        let map = unsafe { Mmap::map(&file) }.map_err(map_err)?;
        if (map.len() as u64) < container.header().layout.file_bytes {
            return Err(Int8LoadError::Map {
                path: container.path().display().to_string(),
                message: "file shrank after it was opened".into(),
            });
        }
        let verified = container
            .index()
            .iter()
            .map(|_| AtomicBool::new(false))
            .collect();
        Ok(Int8Experts {
            container,
            map,
            verified,
            isa,
            n_layers: cfg.num_layers,
            n_experts: cfg.num_experts,
            hidden: cfg.hidden_size,
        })
    }

    /// (layer, expert)'s matrices in the mapping, verifying the blob on its first use.
    fn blob(&self, layer: LayerId, expert: ExpertId) -> Result<ExpertBlob<'_>, ContainerError> {
        let layout = &self.container.header().layout;
        let i = layout.blob_index(layer, expert)?;
        let entry = self.container.index()[i];
        let at = BlobAt {
            layer,
            expert,
            offset: entry.offset,
        };
        let start = entry.offset as usize;
        let bytes =
            self.map
                .get(start..start + layout.blob.stride)
                .ok_or(ContainerError::BlobLength {
                    layer,
                    expert,
                    offset: entry.offset,
                    found: self.map.len().saturating_sub(start) as u64,
                    expected: layout.blob.stride as u64,
                })?;
        if !self.verified[i].load(Ordering::Acquire) {
            // Two threads may both verify the same blob the first time; that is harmless.
            check_blob(bytes, &layout.blob, at, Some(entry.checksum))?;
            self.verified[i].store(true, Ordering::Release);
        }
        ExpertBlob::view_verified(bytes, &layout.blob, at)
    }
}

impl ExpertBackend for Int8Experts {
    /// The container's expert format: `int8`, `q4k` or `q4k-q6k`.
    fn name(&self) -> &'static str {
        self.container.header().layout.dims.format.name()
    }

    fn results_identity(&self) -> Option<String> {
        // The fingerprint covers the header, the expert format included; expertd serving the
        // same container gives the same results, so it says the same.
        Some(format!(
            "container {:#018x}",
            self.container.header().fingerprint()
        ))
    }

    fn expert_bytes(&self) -> Option<usize> {
        Some(self.container.header().layout.blob.stride)
    }

    fn moe_layer_profiled(
        &self,
        call: &MoeCall<'_>,
        out: &mut [f32],
        profiler: Option<&Profiler>,
    ) -> Result<(), ExpertError> {
        validate_call(call, self.n_layers, self.n_experts, self.hidden, out.len())?;
        let d = self.hidden;
        let mut exec = MoeExec::new(
            call.x,
            call.ids,
            call.weights,
            call.n_rows,
            call.top_k,
            d,
            self.n_experts,
        );
        // Profiling: thread time the workers spend getting blobs (the first-use checksum of a
        // mapped blob; later uses are a lookup). Page faults on the mapping happen while the
        // kernels touch the weights, so they count as compute here (the rest of the wall).
        let timing = profiler.is_some();
        let read_ns = AtomicU64::new(0);
        let t_wall = timing.then(Instant::now);
        let all: Vec<usize> = (0..exec.groups().len()).collect();
        exec.compute(self.isa, &all, |_, e| {
            let t = timing.then(Instant::now);
            let blob = self
                .blob(call.layer, e)
                .map_err(|err| ExpertError::Expert {
                    layer: call.layer,
                    expert: e,
                    reason: err.to_string(),
                })?;
            if let Some(t) = t {
                read_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
            }
            Ok(blob)
        })?;
        if let (Some(t), Some(p)) = (t_wall, profiler) {
            let wall = t.elapsed().as_nanos() as u64;
            let r = read_ns.into_inner().min(wall);
            p.add("experts.io_wait", r, 0);
            p.add("experts.compute", wall - r, 0);
        }
        exec.finish(out);
        Ok(())
    }
}
