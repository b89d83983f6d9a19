//! Memory-mapped checkpoint weights: every shard is mapped once (memmap2) and matrices are
//! borrowed straight from the mapping as `&[bf16]`, never copied into a second in-RAM layout.
//!
//! Small vectors (norm weights, biases, `A_log`) are converted to `Vec<f32>` at load because
//! that converted copy is what the math uses. A bf16 matrix whose file offset is odd (possible
//! in a hand-written safetensors file, never in the release) is copied once into an aligned
//! buffer, which is then the copy used for compute.

use half::bf16;
use memmap2::Mmap;
use safetensors::Dtype;
use shared::checkpoint::{Checkpoint, CheckpointError, TensorEntry};
use shared::config::ModelConfig;
use shared::container::{ContainerError, ModelIdentity};
use std::sync::Arc;

use super::gguf_weights::GgufWeights;
use super::linear::{DenseFormat, Linear};

/// A loading or shape problem, naming the tensor.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    /// The checkpoint failed validation.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A shard could not be mapped.
    #[error("{path}: cannot memory-map: {message}")]
    Map {
        /// The shard file.
        path: String,
        /// The OS error.
        message: String,
    },
    /// A tensor the model needs is absent (the checkpoint validation should have caught it).
    #[error("tensor {0} is missing")]
    Missing(String),
    /// A tensor has a dtype this code path cannot use.
    #[error("tensor {name} has dtype {found:?}; {wanted}")]
    Dtype {
        /// The tensor.
        name: String,
        /// Its dtype.
        found: Dtype,
        /// What was wanted.
        wanted: &'static str,
    },
    /// A mapped range lies outside its shard (the shard changed after validation?).
    #[error("tensor {0} lies outside its mapped shard (was the file modified while loading?)")]
    OutOfMap(String),
    /// A GGUF file is unusable or a read of it failed.
    #[error("{path}: {message}")]
    Gguf {
        /// The file.
        path: String,
        /// What is wrong, naming the tensor or key.
        message: String,
    },
    /// A tensor has another shape than the model asks for.
    #[error("tensor {name} is {found}, expected {wanted}")]
    Shape {
        /// The tensor.
        name: String,
        /// Its shape.
        found: String,
        /// The shape asked for.
        wanted: String,
    },
    /// Something only a safetensors directory has was asked of a GGUF file.
    #[error("{path} is a GGUF file: {what}")]
    NotSafetensors {
        /// The file.
        path: String,
        /// What was asked, and what to do instead.
        what: String,
    },
}

/// Storage of a bf16 matrix: a range of a shared mapping, or an owned aligned copy.
#[derive(Clone)]
enum Storage {
    Mapped {
        map: Arc<Mmap>,
        offset: usize,
        len: usize,
    },
    Owned(Arc<Vec<bf16>>),
}

/// A row-major `[rows, cols]` bf16 weight matrix.
#[derive(Clone)]
pub struct Matrix {
    storage: Storage,
    /// Output dimension.
    pub rows: usize,
    /// Input dimension.
    pub cols: usize,
}

impl std::fmt::Debug for Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Matrix[{}×{}]", self.rows, self.cols)
    }
}

impl Matrix {
    /// The weights as a flat row-major slice of `rows × cols` values.
    pub fn data(&self) -> &[bf16] {
        match &self.storage {
            Storage::Mapped { map, offset, len } => {
                // Alignment and bounds were checked when the matrix was built.
                bytemuck::cast_slice(&map[*offset..*offset + *len])
            }
            Storage::Owned(v) => v,
        }
    }

    /// Row `r` as a slice of `cols` values.
    pub fn row(&self, r: usize) -> &[bf16] {
        &self.data()[r * self.cols..(r + 1) * self.cols]
    }

    /// Bytes of weights this matrix streams per full pass.
    pub fn bytes(&self) -> usize {
        self.rows * self.cols * 2
    }

    /// Tells the kernel this matrix's mapped pages are no longer needed, so they leave the
    /// process's resident set (used after converting the matrix to another format). Reading
    /// the matrix again afterwards is still correct: the pages fault back in from the file.
    /// A no-op for owned matrices; failures are ignored (the advice only saves memory).
    pub fn release_pages(&self) {
        if let Storage::Mapped { map, offset, len } = &self.storage {
            // SAFETY: the mapping is private and read-only and this process never writes it, so
            // MADV_DONTNEED only unmaps pages whose contents are the file's bytes; any later
            // read (of this matrix, or of a neighbour sharing an edge page) faults the same
            // bytes back in from the file. Values seen through existing borrows never change.
            let _ = unsafe {
                map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, *offset, *len)
            };
        }
    }

    /// Tells the kernel this matrix is read in scattered rows (an embedding table), so a page
    /// fault reads only the faulting page instead of a readahead window: a decode step then
    /// costs one or two pages of disk reads for its token's row when the table is not cached.
    /// Failures are ignored (the advice only saves reads).
    pub fn advise_random_rows(&self) {
        if let Storage::Mapped { map, offset, len } = &self.storage {
            let _ = map.advise_range(memmap2::Advice::Random, *offset, *len);
        }
    }

    /// A matrix over an owned buffer (synthetic weights in tests and tools).
    pub fn from_vec(data: Vec<bf16>, rows: usize, cols: usize) -> Matrix {
        assert_eq!(data.len(), rows * cols, "matrix data length");
        Matrix {
            storage: Storage::Owned(Arc::new(data)),
            rows,
            cols,
        }
    }
}

/// The model's weights: a validated safetensors directory with every shard memory-mapped, or a
/// GGUF file whose dense tensors are read and converted when asked for.
pub struct MappedCheckpoint {
    source: Source,
}

enum Source {
    Safetensors {
        ckpt: Box<Checkpoint>,
        maps: Vec<Arc<Mmap>>,
    },
    Gguf(Box<GgufWeights>),
}

impl MappedCheckpoint {
    /// Opens a model: a GGUF file ([`shared::gguf::is_gguf_path`]) or a checkpoint directory.
    pub fn open(path: &std::path::Path) -> Result<MappedCheckpoint, WeightsError> {
        if shared::gguf::is_gguf_path(path) {
            return Ok(MappedCheckpoint {
                source: Source::Gguf(Box::new(GgufWeights::open(path)?)),
            });
        }
        Self::open_dir(path)
    }

    /// Validates the directory and maps every shard read-only.
    fn open_dir(dir: &std::path::Path) -> Result<MappedCheckpoint, WeightsError> {
        let ckpt = Checkpoint::open(dir)?;
        let mut maps = Vec::with_capacity(ckpt.shards.len());
        for shard in &ckpt.shards {
            let map_err = |e: std::io::Error| WeightsError::Map {
                path: shard.path.display().to_string(),
                message: e.to_string(),
            };
            let file = std::fs::File::open(&shard.path).map_err(map_err)?;
            // SAFETY: the mapping is read-only and private to this process. Like every mmap-based
            // loader we rely on nobody truncating or rewriting a checkpoint while it is served;
            // lengths are re-checked against the mapping below, so a shrunk file fails loading
            // instead of being read out of bounds.
            let map = unsafe { Mmap::map(&file) }.map_err(map_err)?;
            maps.push(Arc::new(map));
        }
        Ok(MappedCheckpoint {
            source: Source::Safetensors {
                ckpt: Box::new(ckpt),
                maps,
            },
        })
    }

    /// The validated configuration.
    pub fn config(&self) -> &ModelConfig {
        match &self.source {
            Source::Safetensors { ckpt, .. } => &ckpt.config,
            Source::Gguf(g) => g.config(),
        }
    }

    /// Name prefix of the text model's tensors (a GGUF's are read under the release names).
    pub fn prefix(&self) -> &'static str {
        match &self.source {
            Source::Safetensors { ckpt, .. } => ckpt.prefix,
            Source::Gguf(_) => shared::tensor_spec::PREFIX_RELEASE,
        }
    }

    /// The model directory or GGUF file.
    pub fn path(&self) -> &std::path::Path {
        match &self.source {
            Source::Safetensors { ckpt, .. } => &ckpt.dir,
            Source::Gguf(g) => g.path(),
        }
    }

    /// The safetensors inventory; `None` for a GGUF file.
    pub fn checkpoint(&self) -> Option<&Checkpoint> {
        match &self.source {
            Source::Safetensors { ckpt, .. } => Some(ckpt),
            Source::Gguf(_) => None,
        }
    }

    /// The identity a container prepared from these weights records (its routed experts).
    pub fn identity(&self) -> Result<ModelIdentity, ContainerError> {
        match &self.source {
            Source::Safetensors { ckpt, .. } => ModelIdentity::of_checkpoint(ckpt),
            Source::Gguf(g) => g.identity(),
        }
    }

    /// The directory's inventory and mappings, or an error saying a GGUF cannot do `what`.
    fn safetensors(&self, what: &str) -> Result<(&Checkpoint, &[Arc<Mmap>]), WeightsError> {
        match &self.source {
            Source::Safetensors { ckpt, maps } => Ok((ckpt, maps)),
            Source::Gguf(g) => Err(WeightsError::NotSafetensors {
                path: g.path().display().to_string(),
                what: what.to_string(),
            }),
        }
    }

    /// A digest of the checkpoint's contents, cheap to compute: SHA-256 over `config.json`,
    /// each shard's length and safetensors header (every tensor's name, dtype, shape and
    /// offsets) and 4 KiB samples of its data every 64 MiB and at its end. Two checkpoints
    /// with the same layout but other weights (another seed, another fine-tune) differ in the
    /// samples. What a saved sequence state is checked against (with the formats that shape
    /// the numbers): a state from other weights is never resumed.
    /// For a GGUF file: its own digest (`GgufWeights::digest`).
    pub fn digest(&self) -> Result<[u8; 32], WeightsError> {
        use sha2::{Digest, Sha256};
        let (ckpt, maps) = match &self.source {
            Source::Gguf(g) => return g.digest(),
            Source::Safetensors { ckpt, maps } => (ckpt, maps),
        };
        let config = ckpt.dir.join(shared::checkpoint::CONFIG_FILE);
        let config = std::fs::read(&config).map_err(|e| WeightsError::Map {
            path: config.display().to_string(),
            message: e.to_string(),
        })?;
        let mut h = Sha256::new();
        h.update(b"sluice checkpoint digest v1");
        h.update((config.len() as u64).to_le_bytes());
        h.update(&config);
        for (shard, map) in ckpt.shards.iter().zip(maps) {
            let header_len = map.get(..8).map_or(0, |b| {
                u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize
            });
            let data_start = (8 + header_len).min(map.len());
            h.update(shard.file_name.as_bytes());
            h.update((map.len() as u64).to_le_bytes());
            h.update(&map[..data_start]);
            for r in digest_samples(data_start as u64, map.len() as u64, 0) {
                h.update(&map[r.start as usize..r.end as usize]);
            }
        }
        Ok(h.finalize().into())
    }

    fn entry(&self, name: &str) -> Result<&TensorEntry, WeightsError> {
        self.safetensors("its tensors are not safetensors entries")?
            .0
            .tensor(name)
            .ok_or_else(|| WeightsError::Missing(name.to_string()))
    }

    /// The raw bytes of a tensor.
    pub fn bytes(&self, name: &str) -> Result<&[u8], WeightsError> {
        let e = self.entry(name)?;
        self.range(name, e.shard, e.loc.offset, e.loc.len)
    }

    /// Bytes `[offset, offset + len)` of shard `shard`.
    pub fn range(
        &self,
        name: &str,
        shard: usize,
        offset: u64,
        len: u64,
    ) -> Result<&[u8], WeightsError> {
        let map = &self.safetensors("it has no safetensors shards")?.1[shard];
        let start =
            usize::try_from(offset).map_err(|_| WeightsError::OutOfMap(name.to_string()))?;
        let end = start
            .checked_add(len as usize)
            .ok_or_else(|| WeightsError::OutOfMap(name.to_string()))?;
        map.get(start..end)
            .ok_or_else(|| WeightsError::OutOfMap(name.to_string()))
    }

    /// A bf16 `[rows, cols]` view of a shard byte range (used for expert slices).
    pub fn matrix_at(
        &self,
        name: &str,
        shard: usize,
        offset: u64,
        rows: usize,
        cols: usize,
    ) -> Result<Matrix, WeightsError> {
        let len = rows * cols * 2;
        let bytes = self.range(name, shard, offset, len as u64)?;
        if bytes.as_ptr().align_offset(align_of::<bf16>()) == 0 {
            Ok(Matrix {
                storage: Storage::Mapped {
                    map: self.safetensors("it has no safetensors shards")?.1[shard].clone(),
                    offset: offset as usize,
                    len,
                },
                rows,
                cols,
            })
        } else {
            let owned: Vec<bf16> = bytes
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]))
                .collect();
            Ok(Matrix::from_vec(owned, rows, cols))
        }
    }

    /// A 2-D (or `[rows, cols]`-viewable) BF16 tensor as a matrix.
    /// From a GGUF: the tensor dequantized and converted to the transformers layout.
    pub fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix, WeightsError> {
        if let Source::Gguf(g) = &self.source {
            return g.matrix(name, rows, cols);
        }
        let e = self.entry(name)?;
        if e.loc.dtype != Dtype::BF16 {
            return Err(WeightsError::Dtype {
                name: name.to_string(),
                found: e.loc.dtype,
                wanted: "a BF16 matrix",
            });
        }
        if e.loc.len != (rows * cols * 2) as u64 {
            return Err(WeightsError::OutOfMap(name.to_string()));
        }
        self.matrix_at(name, e.shard, e.loc.offset, rows, cols)
    }

    /// `name` as a `[rows, cols]` projection held in `format`. With [`DenseFormat::Gguf`] a
    /// GGUF projection stored as `Q4_K` or `Q6_K` keeps its blocks (the k-quant kernels run
    /// them); anything else is held as INT8.
    pub fn linear(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
        format: DenseFormat,
    ) -> Result<Linear, WeightsError> {
        if format == DenseFormat::Gguf
            && let Source::Gguf(g) = &self.source
            && let Some(m) = g.kquant(name, rows, cols)?
        {
            return Ok(Linear::kquant(m));
        }
        Ok(Linear::new(self.matrix(name, rows, cols)?, format))
    }

    /// A BF16 or F32 tensor converted to f32 values.
    pub fn vector_f32(&self, name: &str) -> Result<Vec<f32>, WeightsError> {
        if let Source::Gguf(g) = &self.source {
            return g.vector_f32(name);
        }
        let e = self.entry(name)?;
        let bytes = self.bytes(name)?;
        match e.loc.dtype {
            Dtype::BF16 => Ok(bytes
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect()),
            Dtype::F32 => Ok(bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()),
            found => Err(WeightsError::Dtype {
                name: name.to_string(),
                found,
                wanted: "BF16 or F32",
            }),
        }
    }
}

/// The tensors of one layer, or of one module of it, named `{prefix}layers.{layer}.[module.]NAME`
/// in the checkpoint: what `Model::load` and each layer part's `load` read their weights through.
pub struct LayerTensors<'a> {
    w: &'a MappedCheckpoint,
    /// `{prefix}layers.{layer}.`, then `{module}.` for a module.
    base: String,
    /// The layer's index.
    pub layer: usize,
    /// The format of the large projections ([`LayerTensors::linear`]).
    pub dense: DenseFormat,
}

impl<'a> LayerTensors<'a> {
    /// Layer `layer`'s tensors; its large projections load as `dense`.
    pub fn layer(w: &'a MappedCheckpoint, layer: usize, dense: DenseFormat) -> LayerTensors<'a> {
        LayerTensors {
            w,
            base: format!("{}layers.{layer}.", w.prefix()),
            layer,
            dense,
        }
    }

    /// The tensors of the layer's `module` (`self_attn`, `linear_attn`, `mlp`).
    pub fn module(&self, module: &str) -> LayerTensors<'a> {
        LayerTensors {
            w: self.w,
            base: format!("{}{module}.", self.base),
            layer: self.layer,
            dense: self.dense,
        }
    }

    /// `NAME` as a `[rows, cols]` projection in the dense format.
    pub fn linear(&self, name: &str, rows: usize, cols: usize) -> Result<Linear, WeightsError> {
        self.linear_in(self.dense, name, rows, cols)
    }

    /// `NAME` as a `[rows, cols]` projection in `format`, whatever the dense format (the
    /// router and the gates stay BF16; see `linear`).
    pub fn linear_in(
        &self,
        format: DenseFormat,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<Linear, WeightsError> {
        self.w
            .linear(&format!("{}{name}", self.base), rows, cols, format)
    }

    /// `NAME` (a BF16 or F32 vector) as f32 values.
    pub fn vector(&self, name: &str) -> Result<Vec<f32>, WeightsError> {
        self.w.vector_f32(&format!("{}{name}", self.base))
    }
}

/// The data bytes a checkpoint digest samples from `start..len`: 4 KiB every 64 MiB from
/// `start`, then the last 4 KiB, beginning no earlier than `tail_floor` (the safetensors
/// digest passes 0, so a small shard's tail may repeat header bytes; changing either would
/// change every digest already recorded).
pub(crate) fn digest_samples(
    start: u64,
    len: u64,
    tail_floor: u64,
) -> impl Iterator<Item = std::ops::Range<u64>> {
    const SAMPLE: u64 = 4096;
    const STRIDE: u64 = 64 << 20;
    let strided = (start..len)
        .step_by(STRIDE as usize)
        .map(move |at| at..(at + SAMPLE).min(len));
    let tail = len.saturating_sub(SAMPLE).max(tail_floor).min(len);
    strided.chain(std::iter::once(tail..len))
}

#[cfg(test)]
mod tests {
    use super::digest_samples;

    #[test]
    fn digest_samples_stride_from_the_start_and_end_with_the_tail() {
        let mib = 1u64 << 20;
        let got: Vec<_> = digest_samples(100, 130 * mib, 0).collect();
        assert_eq!(
            got,
            [
                100..4196,
                100 + 64 * mib..4196 + 64 * mib,
                100 + 128 * mib..4196 + 128 * mib,
                130 * mib - 4096..130 * mib,
            ]
        );
        // A short file: one sample to the end, and the tail from the floor (or 0).
        assert_eq!(
            digest_samples(100, 1000, 100).collect::<Vec<_>>(),
            [100..1000, 100..1000]
        );
        assert_eq!(
            digest_samples(100, 1000, 0).collect::<Vec<_>>(),
            [100..1000, 0..1000]
        );
        let empty: Vec<_> = digest_samples(1000, 1000, 1000).collect();
        assert_eq!(empty.len(), 1);
        assert!(empty[0].is_empty() && empty[0].start == 1000, "{empty:?}");
    }
}
