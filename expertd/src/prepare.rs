//! `expertd prepare`: writes `DIR/experts.sluice` from a BF16 checkpoint or a `qwen35moe`
//! GGUF, resumably (docs/container-format.md, "Writing and resuming"; docs/gguf.md).
//!
//! The file is written as `DIR/experts.sluice.partial`, whose every offset follows from the
//! dimensions; a rerun keeps each layer whose blobs all verify and converts the rest again.
//! Header and index are written last, then fsync and an atomic rename. Owns the file IO and the
//! resume decisions; the per-expert work is `convert` (checkpoints) and `convert_gguf`, the format is
//! `shared::container`.

use crate::convert::{ConvertedExpert, ShardFiles, convert_expert};
use crate::convert_gguf::GgufSource;
pub use crate::convert_gguf::Requantized;
use crate::quant_error::{ErrorStats, merge_layers};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use shared::checkpoint::{Checkpoint, CheckpointError};
use shared::container::{
    BlobAt, BlobLayout, CONTAINER_FILE, ContainerError, ContainerFile, ContainerLayout, ExpertDims,
    ExpertFormat, Header, ModelIdentity, PARTIAL_FILE, check_blob, read_full_at, read_header,
    writer,
};
use shared::gguf::{OpenError, is_gguf_path};
use shared::ids::{ExpertId, LayerId};
use shared::safetensors_locator::{ExpertLocator, LocateError};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Per-layer error statistics of the finished layers of a partial file, kept beside it.
pub const STATS_FILE: &str = "experts.sluice.partial-stats.json";
/// The dequantisation report written at the end.
pub const REPORT_FILE: &str = "prepare-report.json";

/// What `prepare` needs.
#[derive(Debug, Clone)]
pub struct PrepareOptions {
    /// The BF16 checkpoint directory, or a `qwen35moe` GGUF file.
    pub model: PathBuf,
    /// The container directory (created if missing).
    pub out: PathBuf,
    /// Sleep after each blob written (tests use it to interrupt a run midway).
    pub throttle: Duration,
    /// How to quantise the experts; `None`: INT8 for a checkpoint, the format nearest the
    /// experts' own types for a GGUF.
    pub format: Option<ExpertFormat>,
}

/// Why `prepare` stopped.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The checkpoint is unusable.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The locator could not place an expert.
    #[error(transparent)]
    Locate(#[from] LocateError),
    /// The GGUF file is unusable.
    #[error(transparent)]
    Gguf(#[from] OpenError),
    /// A container-format error (dimensions, encoding, identity reads).
    #[error(transparent)]
    Container(#[from] ContainerError),
    /// A file operation failed.
    #[error("{path}: {message}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        message: String,
    },
    /// An expert's source matrix is not what the config implies.
    #[error("layer {layer} expert {expert}: {what}: {reason}")]
    Source {
        /// Layer.
        layer: LayerId,
        /// Expert.
        expert: ExpertId,
        /// `gate`, `up` or `down`.
        what: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The output directory already holds a container of another model.
    #[error(
        "{path} holds a container of a different model: its identity is {found}, this model's is {ours} \
         (differs in: {differing}); remove it or choose another --out"
    )]
    DifferentModel {
        /// The existing file.
        path: PathBuf,
        /// Its identity (boxed: keeps the error small).
        found: Box<ModelIdentity>,
        /// The checkpoint's identity.
        ours: Box<ModelIdentity>,
        /// Which components differ.
        differing: String,
    },
    /// The output directory holds a container of this model in another expert format.
    #[error(
        "{path} holds this model's experts in format {found}, not {wanted}; continue it with --format {found}, or remove it or choose another --out"
    )]
    OtherFormat {
        /// The existing file.
        path: PathBuf,
        /// Its format.
        found: ExpertFormat,
        /// The format asked for.
        wanted: ExpertFormat,
    },
    /// The output directory holds an `experts.sluice` that cannot be read.
    #[error("{path} exists but is not a usable container ({source}); remove it to prepare again")]
    ExistingUnreadable {
        /// The existing file.
        path: PathBuf,
        /// Why it is unusable.
        source: ContainerError,
    },
}

impl PrepareError {
    /// An `Io` error for `path`.
    pub fn io(path: &Path, e: std::io::Error) -> PrepareError {
        PrepareError::Io {
            path: path.to_path_buf(),
            message: e.to_string(),
        }
    }
}

/// Progress reported to the caller, in order, from the calling thread.
#[derive(Debug, Clone, Copy)]
pub enum PrepareEvent {
    /// An existing partial file was found; its layers are being checked.
    Resuming {
        /// Layers to check.
        n_layers: usize,
    },
    /// A layer of the partial file was checked.
    LayerChecked {
        /// The layer.
        layer: LayerId,
        /// Whether it is kept (all blobs valid and its statistics recorded).
        kept: bool,
    },
    /// A GGUF tensor whose blocks are not the container's format for its matrix: its values
    /// are dequantized and quantized again (reported before conversion starts, once per tensor).
    Requantizing(Requantized),
    /// Conversion starts.
    Converting {
        /// Layers to convert.
        n_layers: usize,
        /// Layers kept from a previous run.
        n_kept: usize,
        /// Source bytes (BF16 or GGUF blocks) that will be read.
        source_bytes: u64,
    },
    /// One expert's blob was written.
    ExpertWritten {
        /// Its layer.
        layer: LayerId,
        /// Source bytes it was converted from.
        source_bytes: u64,
    },
    /// A layer is complete.
    LayerWritten {
        /// The layer.
        layer: LayerId,
    },
    /// Writing the index and header, syncing and renaming.
    Finishing,
}

/// A finished conversion.
#[derive(Debug, Clone)]
pub struct PrepareSummary {
    /// The container written.
    pub path: PathBuf,
    /// Its header.
    pub header: Header,
    /// Layers converted in this run.
    pub layers_converted: usize,
    /// Layers kept from an interrupted run.
    pub layers_kept: usize,
    /// Per-layer dequantisation error.
    pub layer_stats: Vec<ErrorStats>,
    /// Model-wide dequantisation error.
    pub stats: ErrorStats,
    /// Wall time of this run.
    pub elapsed: Duration,
    /// What was read: `"checkpoint"` or `"gguf"`.
    pub source: &'static str,
    /// The GGUF tensors whose values were requantized (empty for a checkpoint).
    pub requantized: Vec<Requantized>,
}

/// Where the experts come from.
enum Source<'a> {
    /// A BF16 safetensors checkpoint.
    Checkpoint {
        locator: ExpertLocator<'a>,
        files: ShardFiles,
    },
    /// A GGUF file.
    Gguf(&'a GgufSource),
}

impl Source<'_> {
    fn convert(
        &self,
        layout: &BlobLayout,
        layer: LayerId,
        expert: ExpertId,
    ) -> Result<ConvertedExpert, PrepareError> {
        match self {
            Source::Checkpoint { locator, files } => {
                convert_expert(locator, files, layout, layer, expert)
            }
            Source::Gguf(g) => g.convert(layout, layer, expert),
        }
    }

    /// Source bytes of one expert of `layer`.
    fn expert_bytes(&self, layer: LayerId) -> Result<u64, PrepareError> {
        Ok(match self {
            Source::Checkpoint { locator, .. } => {
                locator.expert(layer, ExpertId::new(0))?.total_bytes()
            }
            Source::Gguf(g) => g.experts.expert_bytes(layer.index()),
        })
    }
}

/// What `prepare` did.
#[derive(Debug, Clone)]
pub enum PrepareOutcome {
    /// `DIR/experts.sluice` already holds this model; nothing was written.
    UpToDate {
        /// The container.
        path: PathBuf,
        /// Its header.
        header: Header,
    },
    /// A container was written.
    Written(PrepareSummary),
}

/// Statistics of finished layers, as kept in [`STATS_FILE`].
#[derive(Debug, Default, Serialize, Deserialize)]
struct PartialStats {
    /// The full-hex identity the statistics belong to.
    identity: [String; 3],
    /// The expert format they were measured in (absent in files from before format v2: INT8).
    #[serde(default)]
    format: String,
    /// Layer → statistics.
    layers: BTreeMap<usize, ErrorStats>,
}

/// Converts `opts.model`'s routed experts into `opts.out/experts.sluice`.
pub fn prepare(
    opts: &PrepareOptions,
    on_event: &mut dyn FnMut(PrepareEvent),
) -> Result<PrepareOutcome, PrepareError> {
    let start = Instant::now();
    let (ckpt, gguf) = if is_gguf_path(&opts.model) {
        (None, Some(GgufSource::open(&opts.model)?))
    } else {
        (Some(Checkpoint::open(&opts.model)?), None)
    };
    let (dims, identity, format) = match (&ckpt, &gguf) {
        (Some(c), _) => (
            ExpertDims::from_config(&c.config.text)?,
            ModelIdentity::of_checkpoint(c)?,
            opts.format.unwrap_or_default(),
        ),
        (None, Some(g)) => {
            let e = &g.experts;
            (
                ExpertDims::new(e.n_layers, e.n_experts, e.hidden, e.inner)?,
                ModelIdentity::of_gguf(&g.file, e)?,
                opts.format.unwrap_or_else(|| g.natural_format()),
            )
        }
        (None, None) => unreachable!("one source is opened"),
    };
    let layout = ContainerLayout::new(dims.with_format(format))?;
    let requantized = gguf
        .as_ref()
        .map(|g| g.requantized(format))
        .unwrap_or_default();
    std::fs::create_dir_all(&opts.out).map_err(|e| PrepareError::io(&opts.out, e))?;

    let final_path = opts.out.join(CONTAINER_FILE);
    if final_path.exists() {
        return up_to_date(&final_path, identity, format);
    }
    let partial_path = opts.out.join(PARTIAL_FILE);
    let stats_path = opts.out.join(STATS_FILE);
    let (file, resumable) = open_partial(&partial_path, identity, &layout)?;
    // (Re)write the unfinished header: the file is identified as ours from here on.
    let unfinished = writer::unfinished_header(identity, layout);
    write_at(&file, &partial_path, &unfinished.encode(), 0)?;

    let n_layers = layout.dims.n_layers;
    let mut checksums = vec![0u64; layout.dims.n_blobs()];
    let mut saved = if resumable {
        load_stats(&stats_path, identity, format)
    } else {
        PartialStats::default()
    };
    saved.identity = identity.to_hex();
    saved.format = format.name().to_string();
    let mut todo = Vec::new();
    if resumable {
        on_event(PrepareEvent::Resuming { n_layers });
    }
    for layer in LayerId::all(n_layers) {
        let kept = resumable
            && saved.layers.contains_key(&layer.index())
            && check_layer(&file, &partial_path, &layout, layer, &mut checksums)?;
        if resumable {
            on_event(PrepareEvent::LayerChecked { layer, kept });
        }
        if !kept {
            saved.layers.remove(&layer.index());
            todo.push(layer);
        }
    }
    let layers_kept = n_layers - todo.len();

    let source = match (&ckpt, &gguf) {
        (Some(c), _) => Source::Checkpoint {
            locator: ExpertLocator::new(c),
            files: ShardFiles::open(c)?,
        },
        (None, Some(g)) => Source::Gguf(g),
        (None, None) => unreachable!("one source is opened"),
    };
    let n_experts = layout.dims.n_experts;
    let mut source_bytes = 0u64;
    for &layer in &todo {
        source_bytes += source.expert_bytes(layer)? * n_experts as u64;
    }
    for r in requantized.iter().filter(|r| todo.contains(&r.layer)) {
        on_event(PrepareEvent::Requantizing(*r));
    }
    on_event(PrepareEvent::Converting {
        n_layers: todo.len(),
        n_kept: layers_kept,
        source_bytes,
    });
    // Experts are converted in parallel in chunks of one per thread, then written in order, so
    // memory stays at a few experts whatever the model size.
    let chunk = rayon::current_num_threads().max(1);
    for &layer in &todo {
        let mut layer_stats = ErrorStats::default();
        for first in (0..n_experts).step_by(chunk) {
            let experts: Vec<ExpertId> = (first..(first + chunk).min(n_experts))
                .map(ExpertId::from_index)
                .collect();
            let converted = experts
                .par_iter()
                .map(|&e| source.convert(&layout.blob, layer, e))
                .collect::<Result<Vec<_>, _>>()?;
            for (&expert, c) in experts.iter().zip(&converted) {
                let i = layout.blob_index(layer, expert)?;
                write_at(&file, &partial_path, &c.blob, layout.blob_offset_at(i))?;
                checksums[i] = c.checksum;
                layer_stats.merge(&c.stats);
                on_event(PrepareEvent::ExpertWritten {
                    layer,
                    source_bytes: c.source_bytes,
                });
                if !opts.throttle.is_zero() {
                    std::thread::sleep(opts.throttle);
                }
            }
        }
        saved.layers.insert(layer.index(), layer_stats);
        write_json_atomic(
            &stats_path,
            &serde_json::to_value(&saved).map_err(|e| json_err(&stats_path, e))?,
        )?;
        on_event(PrepareEvent::LayerWritten { layer });
    }

    on_event(PrepareEvent::Finishing);
    let (region, header) = writer::finish(identity, layout, &checksums);
    write_at(&file, &partial_path, &region, layout.index_offset)?;
    write_at(&file, &partial_path, &header.encode(), 0)?;
    file.sync_all()
        .map_err(|e| PrepareError::io(&partial_path, e))?;
    drop(file);
    let layer_stats: Vec<ErrorStats> = (0..n_layers)
        .map(|l| saved.layers.get(&l).copied().unwrap_or_default())
        .collect();
    let summary = PrepareSummary {
        path: final_path.clone(),
        header,
        layers_converted: todo.len(),
        layers_kept,
        stats: merge_layers(&layer_stats),
        layer_stats,
        elapsed: start.elapsed(),
        source: if gguf.is_some() { "gguf" } else { "checkpoint" },
        requantized,
    };
    write_json_atomic(&opts.out.join(REPORT_FILE), &report_json(opts, &summary))?;
    std::fs::rename(&partial_path, &final_path).map_err(|e| PrepareError::io(&final_path, e))?;
    File::open(&opts.out)
        .and_then(|d| d.sync_all())
        .map_err(|e| PrepareError::io(&opts.out, e))?;
    // The statistics now live in the report; a leftover file would only be stale.
    let _ = std::fs::remove_file(&stats_path);
    Ok(PrepareOutcome::Written(summary))
}

/// An existing `experts.sluice`: up to date when it is a valid container of this model.
fn up_to_date(
    path: &Path,
    ours: ModelIdentity,
    format: ExpertFormat,
) -> Result<PrepareOutcome, PrepareError> {
    let unreadable = |source| PrepareError::ExistingUnreadable {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(|e| PrepareError::io(path, e))?;
    let (header, _) = read_header(&file, path).map_err(unreadable)?;
    if header.identity != ours {
        return Err(different(path, header.identity, ours));
    }
    if header.layout.dims.format != format {
        return Err(PrepareError::OtherFormat {
            path: path.to_path_buf(),
            found: header.layout.dims.format,
            wanted: format,
        });
    }
    let container = ContainerFile::open_file(path).map_err(unreadable)?;
    Ok(PrepareOutcome::UpToDate {
        path: path.to_path_buf(),
        header: *container.header(),
    })
}

fn different(path: &Path, found: ModelIdentity, ours: ModelIdentity) -> PrepareError {
    let differing = found.differing(&ours).join(", ");
    PrepareError::DifferentModel {
        path: path.to_path_buf(),
        found: Box::new(found),
        ours: Box::new(ours),
        differing,
    }
}

/// Opens (or creates) the partial file at its final length. Returns whether its contents can
/// be resumed from: a readable header of this model and these dimensions. A partial file of
/// another model or in another expert format is refused; an unreadable one is started over.
fn open_partial(
    path: &Path,
    identity: ModelIdentity,
    layout: &ContainerLayout,
) -> Result<(File, bool), PrepareError> {
    let existed = path.exists();
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| PrepareError::io(path, e))?;
    let mut resumable = false;
    if existed {
        match read_header(&file, path) {
            Ok((h, _)) if h.identity != identity => {
                return Err(different(path, h.identity, identity));
            }
            Ok((h, _)) if h.layout.dims.format != layout.dims.format => {
                // Never wipe another format's half-done work: say so and let the user choose.
                return Err(PrepareError::OtherFormat {
                    path: path.to_path_buf(),
                    found: h.layout.dims.format,
                    wanted: layout.dims.format,
                });
            }
            Ok((h, _)) => resumable = h.layout == *layout,
            Err(_) => {}
        }
    }
    if !resumable {
        // Start over: zero every byte, so no stale blob can pass for a new one.
        file.set_len(0).map_err(|e| PrepareError::io(path, e))?;
    }
    file.set_len(layout.file_bytes)
        .map_err(|e| PrepareError::io(path, e))?;
    Ok((file, resumable))
}

/// Whether every blob of `layer` in the partial file verifies against its own trailer; records
/// their checksums.
fn check_layer(
    file: &File,
    path: &Path,
    layout: &ContainerLayout,
    layer: LayerId,
    checksums: &mut [u64],
) -> Result<bool, PrepareError> {
    let mut buf = vec![0u8; layout.blob.stride];
    for expert in ExpertId::all(layout.dims.n_experts) {
        let i = layout.blob_index(layer, expert)?;
        let offset = layout.blob_offset_at(i);
        let got = read_full_at(file, &mut buf, offset).map_err(|e| PrepareError::io(path, e))?;
        match check_blob(
            &buf[..got],
            &layout.blob,
            BlobAt {
                layer,
                expert,
                offset,
            },
            None,
        ) {
            Ok(sum) => checksums[i] = sum,
            Err(_) => return Ok(false),
        }
    }
    Ok(true)
}

fn load_stats(path: &Path, identity: ModelIdentity, format: ExpertFormat) -> PartialStats {
    let parsed: Option<PartialStats> = std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    let same_format = |s: &PartialStats| {
        s.format == format.name() || (s.format.is_empty() && format == ExpertFormat::Int8)
    };
    match parsed {
        Some(s) if s.identity == identity.to_hex() && same_format(&s) => s,
        _ => PartialStats::default(),
    }
}

fn write_at(file: &File, path: &Path, bytes: &[u8], offset: u64) -> Result<(), PrepareError> {
    file.write_all_at(bytes, offset)
        .map_err(|e| PrepareError::io(path, e))
}

fn json_err(path: &Path, e: serde_json::Error) -> PrepareError {
    PrepareError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// Writes pretty JSON to `path` through a temporary file and a rename.
fn write_json_atomic(path: &Path, value: &serde_json::Value) -> Result<(), PrepareError> {
    let tmp = path.with_extension("json.tmp");
    let text = serde_json::to_string_pretty(value).map_err(|e| json_err(path, e))? + "\n";
    std::fs::write(&tmp, text).map_err(|e| PrepareError::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| PrepareError::io(path, e))
}

/// The contents of `prepare-report.json`.
pub fn report_json(opts: &PrepareOptions, s: &PrepareSummary) -> serde_json::Value {
    let l = &s.header.layout;
    let [config, tensors, sample] = s.header.identity.to_hex();
    serde_json::json!({
        "model": opts.model.display().to_string(),
        "source": s.source,
        "requantized": s.requantized.iter().map(|r| serde_json::json!({ "tensor": r.tensor(), "from": r.from, "to": r.to })).collect::<Vec<_>>(),
        "container": s.path.display().to_string(),
        "format_version": l.dims.format.version(),
        "expert_format": l.dims.format.name(),
        "quant_scheme": l.dims.format.scheme(),
        "identity": { "config_sha256": config, "expert_tensors_sha256": tensors, "expert_sample_sha256": sample },
        "fingerprint": format!("{:#018x}", s.header.fingerprint()),
        "dims": { "n_layers": l.dims.n_layers, "n_experts": l.dims.n_experts, "hidden": l.dims.hidden, "expert_inner": l.dims.inner },
        "file_bytes": l.file_bytes,
        "blob_stride": l.blob.stride,
        "layers_converted": s.layers_converted,
        "layers_kept": s.layers_kept,
        "elapsed_s": s.elapsed.as_secs_f64(),
        "peak_rss_bytes": shared::procfs::vm_hwm_bytes(None),
        "dequant_error": s.stats.to_json(),
        "layers": s.layer_stats.iter().enumerate().map(|(i, st)| serde_json::json!({ "layer": i, "dequant_error": st.to_json() })).collect::<Vec<_>>(),
    })
}
