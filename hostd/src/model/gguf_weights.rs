//! Dense weights read from a `qwen35moe` GGUF file instead of a safetensors directory: the
//! config from its metadata, each dense tensor dequantized and converted back to the
//! transformers layout (`shared::gguf::GgufDense`) when the model asks for it, then held as BF16
//! (or converted on to the dense format) like a safetensors matrix; with `--dense gguf` a
//! projection stored as `Q4_K` or `Q6_K` keeps its blocks instead ([`GgufWeights::kquant`]). The routed experts are not
//! read here: they come from a container prepared from the same file.

use half::bf16;
use shared::config::ModelConfig;
use shared::container::{ContainerError, ModelIdentity};
use shared::gguf::{DenseTensor, GgufDense, GgufExperts, GgufFile, OpenError};
use shared::kernels::kquant::KMatrix;
use shared::tensor_spec::PREFIX_RELEASE;
use std::path::Path;

use super::weights::{Matrix, WeightsError};

/// An open GGUF with its dense tensors located and checked.
pub struct GgufWeights {
    file: GgufFile,
    config: ModelConfig,
    dense: GgufDense,
    experts: GgufExperts,
}

/// A GGUF problem as a [`WeightsError`] naming the file.
fn gguf_err(path: &Path, source: impl std::fmt::Display) -> WeightsError {
    WeightsError::Gguf {
        path: path.display().to_string(),
        message: source.to_string(),
    }
}

impl From<OpenError> for WeightsError {
    fn from(e: OpenError) -> WeightsError {
        let path = match &e {
            OpenError::Io { path, .. } | OpenError::Parse { path, .. } => path.clone(),
        };
        let message = match e {
            OpenError::Io { message, .. } => message,
            OpenError::Parse { source, .. } => source.to_string(),
        };
        WeightsError::Gguf {
            path: path.display().to_string(),
            message,
        }
    }
}

impl GgufWeights {
    /// Opens `path` (its header only) and checks that every dense tensor and routed expert the
    /// metadata implies is there with its shape and a type we read.
    pub fn open(path: &Path) -> Result<GgufWeights, WeightsError> {
        let file = GgufFile::open(path)?;
        let config = shared::gguf::model_config(&file.gguf).map_err(|e| gguf_err(path, e))?;
        let experts = GgufExperts::locate(&file.gguf).map_err(|e| gguf_err(path, e))?;
        let dense = GgufDense::locate(&file.gguf, &config.text, PREFIX_RELEASE)
            .map_err(|e| gguf_err(path, e))?;
        Ok(GgufWeights {
            file,
            config,
            dense,
            experts,
        })
    }

    /// The validated configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.file.path
    }

    /// The identity a container prepared from this file records.
    pub fn identity(&self) -> Result<ModelIdentity, ContainerError> {
        ModelIdentity::of_gguf(&self.file, &self.experts)
    }

    /// The located tensor `name` (nothing read yet).
    fn located(&self, name: &str) -> Result<&DenseTensor, WeightsError> {
        self.dense
            .get(name)
            .ok_or_else(|| WeightsError::Missing(name.to_string()))
    }

    /// The located tensor `name`, checked to be a `[rows, cols]` matrix.
    fn located_matrix(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<&DenseTensor, WeightsError> {
        let t = self.located(name)?;
        if (t.rows(), t.cols()) != (rows, cols) {
            return Err(WeightsError::Shape {
                name: name.to_string(),
                found: format!("{} × {} in {}", t.rows(), t.cols(), t.gguf().name),
                wanted: format!("{rows} × {cols}"),
            });
        }
        Ok(t)
    }

    /// A located tensor's bytes.
    fn read(&self, t: &DenseTensor) -> Result<Vec<u8>, WeightsError> {
        let info = t.gguf();
        Ok(self.file.read(info.offset, info.len, &info.name)?)
    }

    /// The transformers tensor `name` as a `[rows, cols]` BF16 matrix.
    pub fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix, WeightsError> {
        let t = self.located_matrix(name, rows, cols)?;
        let bytes = self.read(t)?;
        let mut data = vec![bf16::ZERO; rows * cols];
        t.for_each_row(&bytes, |r, v| {
            for (o, &x) in data[r * cols..(r + 1) * cols].iter_mut().zip(v) {
                *o = bf16::from_f32(x);
            }
        })
        .map_err(|e| gguf_err(self.path(), e))?;
        Ok(Matrix::from_vec(data, rows, cols))
    }

    /// The transformers tensor `name` as its k-quant blocks in the transformers row order, if
    /// the file stores it as `Q4_K` or `Q6_K` in a layout the k-quant kernels run as it is
    /// (`DenseTensor::kquant_rows`); `None` otherwise. Every block's super-scales are checked
    /// finite, naming the tensor.
    pub fn kquant(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<Option<KMatrix>, WeightsError> {
        let t = self.located_matrix(name, rows, cols)?;
        if t.kquant_kind().is_none() {
            // Not read here: the caller dequantizes it instead.
            return Ok(None);
        }
        let bytes = self.read(t)?;
        let Some((kind, data)) = t.kquant_rows(bytes).map_err(|e| gguf_err(self.path(), e))? else {
            return Ok(None);
        };
        let m = KMatrix {
            kind,
            rows,
            cols,
            data,
        };
        m.as_ref().verify().map_err(|why| {
            gguf_err(
                self.path(),
                format!("tensor {:?} (it holds {name}): {why}", t.gguf().name),
            )
        })?;
        Ok(Some(m))
    }

    /// The transformers tensor `name` (a vector) as f32 values.
    pub fn vector_f32(&self, name: &str) -> Result<Vec<f32>, WeightsError> {
        let t = self.located(name)?;
        t.values(&self.read(t)?)
            .map_err(|e| gguf_err(self.path(), e))
    }

    /// SHA-256 over the file's length, its header (metadata and tensor table) and 4 KiB
    /// samples of its data every 64 MiB and at its end: what a saved sequence state is checked
    /// against, as `MappedCheckpoint::digest` is for a directory.
    pub fn digest(&self) -> Result<[u8; 32], WeightsError> {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(b"sluice gguf digest v1");
        h.update(self.file.len.to_le_bytes());
        h.update(&self.file.header_bytes);
        let start = self.file.header_bytes.len() as u64;
        for r in super::weights::digest_samples(start, self.file.len, start) {
            h.update(
                self.file
                    .read(r.start, r.end - r.start, "a digest sample")?,
            );
        }
        Ok(h.finalize().into())
    }
}
