//! `expertd verify`: re-checks a container's header, index and every blob checksum (optionally
//! the R16C4 invariants of every matrix, and the model identity against a checkpoint) and
//! collects every problem instead of stopping at the first.
//!
//! Each problem names the header field, or the layer, expert and file offset. Blobs are read at
//! the offsets the header's dimensions imply, so a corrupt index entry cannot hide a blob.

use rayon::prelude::*;
use shared::checkpoint::Checkpoint;
use shared::container::{
    BlobAt, CONTAINER_FILE, ContainerError, ExpertBlob, ExpertDims, Header, ModelIdentity,
    check_blob, index, read_full_at, read_header,
};
use shared::ids::{ExpertId, LayerId};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What to check.
#[derive(Debug, Clone)]
pub struct VerifyOptions {
    /// The container directory.
    pub dir: PathBuf,
    /// A checkpoint (or GGUF file) to compare the identity and dimensions with.
    pub model: Option<PathBuf>,
    /// Also check every matrix's padding and row sums (reads every value; slower).
    pub deep: bool,
}

/// One thing wrong with a container.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Problem {
    /// A format problem (header field, index entry, blob).
    #[error(transparent)]
    Container(#[from] ContainerError),
    /// A blob whose checksum is right but whose matrix breaks its format's invariants (R16C4
    /// padding and row sums; finite k-quant super-scales).
    #[error("layer {layer} expert {expert}: blob at file offset {offset}: {part}: {error}")]
    Matrix {
        /// Layer.
        layer: LayerId,
        /// Expert.
        expert: ExpertId,
        /// File offset of the blob.
        offset: u64,
        /// `gate_up` or `down`.
        part: &'static str,
        /// The broken invariant.
        error: String,
    },
    /// The container was made from another model than `--model`.
    #[error(
        "identity mismatch: the container's is {container}, {model}'s is {checkpoint} (differs in: {differing})"
    )]
    Identity {
        /// The container's identity.
        container: ModelIdentity,
        /// The checkpoint's identity.
        checkpoint: ModelIdentity,
        /// The checkpoint directory.
        model: String,
        /// Which components differ.
        differing: String,
    },
    /// `--model` could not be read.
    #[error("--model {model}: {reason}")]
    Model {
        /// The checkpoint directory.
        model: String,
        /// What went wrong.
        reason: String,
    },
}

/// The outcome of a verification.
#[derive(Debug, Clone)]
pub struct VerifyReport {
    /// The container file.
    pub path: PathBuf,
    /// Its length in bytes.
    pub file_len: u64,
    /// The header, when it parsed.
    pub header: Option<Header>,
    /// Blobs read and checked.
    pub blobs_checked: usize,
    /// Bytes of blobs read.
    pub blob_bytes: u64,
    /// Whether the identity was compared with a checkpoint, and matched.
    pub identity_checked: Option<bool>,
    /// Every problem found, header and index first, then blobs in (layer, expert) order.
    pub problems: Vec<Problem>,
    /// Wall time.
    pub elapsed: Duration,
}

impl VerifyReport {
    /// True when nothing is wrong.
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Verifies `opts.dir/experts.sluice`. Only failing to open the file at all is an `Err`; every
/// problem with its contents is in the report. `on_blob_bytes` is called (from any thread) with
/// the bytes of each blob checked.
pub fn verify(
    opts: &VerifyOptions,
    on_blob_bytes: &(dyn Fn(u64) + Sync),
) -> Result<VerifyReport, ContainerError> {
    let start = Instant::now();
    let path = opts.dir.join(CONTAINER_FILE);
    let file = File::open(&path).map_err(|e| ContainerError::Io {
        path: path.clone(),
        message: e.to_string(),
    })?;
    let file_len = file
        .metadata()
        .map_err(|e| ContainerError::Io {
            path: path.clone(),
            message: e.to_string(),
        })?
        .len();
    let mut report = VerifyReport {
        path: path.clone(),
        file_len,
        header: None,
        blobs_checked: 0,
        blob_bytes: 0,
        identity_checked: None,
        problems: Vec::new(),
        elapsed: Duration::ZERO,
    };
    let header = match read_header(&file, &path) {
        Ok((h, _)) => h,
        Err(e) => {
            report.problems.push(e.into());
            report.elapsed = start.elapsed();
            return Ok(report);
        }
    };
    report.header = Some(header);
    if header.magic.is_unfinished() {
        report.problems.push(ContainerError::Unfinished.into());
    }
    let layout = header.layout;
    if file_len != layout.file_bytes {
        report.problems.push(
            ContainerError::FileLength {
                found: file_len,
                expected: layout.file_bytes,
            }
            .into(),
        );
    }
    // An unfinished file has no index yet: its blobs are checked against their own trailers.
    let mut entries = Vec::new();
    if !header.magic.is_unfinished() {
        let mut region = vec![0u8; index::region_bytes(&layout)];
        let got = read_full_at(&file, &mut region, layout.index_offset).map_err(|e| {
            ContainerError::Io {
                path: path.clone(),
                message: e.to_string(),
            }
        })?;
        region.truncate(got);
        let (found, index_problems) = index::check_index(&header, &region);
        entries = found;
        report
            .problems
            .extend(index_problems.into_iter().map(Problem::from));
    }

    let n_experts = layout.dims.n_experts;
    let blob_problems: Vec<Vec<Problem>> = (0..layout.dims.n_layers)
        .into_par_iter()
        .map(|l| {
            let mut buf = vec![0u8; layout.blob.stride];
            let mut problems = Vec::new();
            for i in l * n_experts..(l + 1) * n_experts {
                let (layer, expert) = layout.blob_ids(i);
                let offset = layout.blob_offset_at(i);
                let at = BlobAt {
                    layer,
                    expert,
                    offset,
                };
                let got = match read_full_at(&file, &mut buf, offset) {
                    Ok(n) => n,
                    Err(e) => {
                        problems.push(
                            ContainerError::Io {
                                path: path.clone(),
                                message: format!("layer {layer} expert {expert}: {e}"),
                            }
                            .into(),
                        );
                        continue;
                    }
                };
                on_blob_bytes(got as u64);
                let expected = entries.get(i).map(|e| e.checksum);
                if let Err(e) = check_blob(&buf[..got], &layout.blob, at, expected) {
                    problems.push(e.into());
                    continue;
                }
                if opts.deep {
                    problems.extend(deep_check(&buf, &layout.blob, at));
                }
            }
            problems
        })
        .collect();
    report.blobs_checked = layout.dims.n_blobs();
    report.blob_bytes = layout.file_bytes - layout.blobs_offset;
    report.problems.extend(blob_problems.into_iter().flatten());

    if let Some(model) = &opts.model {
        match identity_of(model) {
            Ok((identity, dims)) => {
                let matches = identity == header.identity
                    && dims.with_format(layout.dims.format) == layout.dims;
                report.identity_checked = Some(matches);
                if !matches {
                    report.problems.push(Problem::Identity {
                        container: header.identity,
                        checkpoint: identity,
                        model: model.display().to_string(),
                        differing: header.identity.differing(&identity).join(", "),
                    });
                }
            }
            Err(reason) => report.problems.push(Problem::Model {
                model: model.display().to_string(),
                reason,
            }),
        }
    }
    report.elapsed = start.elapsed();
    Ok(report)
}

/// Checks the format invariants of a blob whose checksum already verified.
fn deep_check(buf: &[u8], layout: &shared::container::BlobLayout, at: BlobAt) -> Vec<Problem> {
    let mut problems = Vec::new();
    // The checksum was verified just before; pass the trailer so `parse` accepts it.
    let trailer = u64::from_le_bytes(
        buf[layout.checksum_offset..layout.content_bytes]
            .try_into()
            .unwrap_or([0; 8]),
    );
    match ExpertBlob::parse(buf, layout, at, trailer) {
        Ok(blob) => {
            let checks = match blob {
                ExpertBlob::Int8 { gate_up, down } => [
                    ("gate_up", gate_up.verify().map_err(|e| e.to_string())),
                    ("down", down.verify().map_err(|e| e.to_string())),
                ],
                ExpertBlob::KQuant { gate_up, down } => {
                    [("gate_up", gate_up.verify()), ("down", down.verify())]
                }
            };
            for (part, result) in checks {
                if let Err(error) = result {
                    problems.push(Problem::Matrix {
                        layer: at.layer,
                        expert: at.expert,
                        offset: at.offset,
                        part,
                        error,
                    });
                }
            }
        }
        Err(e) => problems.push(e.into()),
    }
    problems
}

/// The identity and expert dimensions of a checkpoint or a GGUF file.
fn identity_of(model: &Path) -> Result<(ModelIdentity, ExpertDims), String> {
    if shared::gguf::is_gguf_path(model) {
        let g = crate::convert_gguf::GgufSource::open(model).map_err(|e| e.to_string())?;
        let e = &g.experts;
        let dims = ExpertDims::new(e.n_layers, e.n_experts, e.hidden, e.inner)
            .map_err(|e| e.to_string())?;
        let identity = ModelIdentity::of_gguf(&g.file, e).map_err(|e| e.to_string())?;
        return Ok((identity, dims));
    }
    let ckpt = Checkpoint::open(model).map_err(|e| e.to_string())?;
    let dims = ExpertDims::from_config(&ckpt.config.text).map_err(|e| e.to_string())?;
    let identity = ModelIdentity::of_checkpoint(&ckpt).map_err(|e| e.to_string())?;
    Ok((identity, dims))
}
