//! The model identity a container records: SHA-256 of `config.json`'s bytes, of the expert
//! tensors' safetensors header entries in canonical order, and of a 64-byte sample of every
//! expert matrix (docs/container-format.md, "Model identity").
//!
//! The hashing of each component is pure ([`IdentityHasher`]); [`ModelIdentity::of_checkpoint`]
//! does the few small reads (the config file and 3 · L · E samples of ≤ 64 bytes) over a
//! validated `Checkpoint`. `prepare` and `verify --model` both call it, so the list of what is
//! hashed exists once.

use super::ContainerError;
use crate::checkpoint::{CONFIG_FILE, Checkpoint};
use crate::gguf::{GgufExperts, GgufFile};
use crate::ids::{ExpertId, LayerId};
use crate::safetensors_locator::{ByteRange, ExpertLocator};
use crate::tensor_spec;
use safetensors::Dtype;
use sha2::{Digest, Sha256};
use std::fmt;
use std::fs::File;
use std::os::unix::fs::FileExt;

/// Bytes sampled from the start of each expert matrix for `expert_sample_sha256`.
pub const SAMPLE_BYTES: u64 = 64;

/// Which model a container was made from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelIdentity {
    /// SHA-256 of `config.json`'s bytes as on disk.
    pub config_sha256: [u8; 32],
    /// SHA-256 of the expert tensors' header entries (name, dtype, shape, byte length).
    pub expert_tensors_sha256: [u8; 32],
    /// SHA-256 of the first [`SAMPLE_BYTES`] of every expert's gate, up and down matrix.
    pub expert_sample_sha256: [u8; 32],
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl ModelIdentity {
    /// All three digests in full hex, for reports.
    pub fn to_hex(&self) -> [String; 3] {
        [
            hex(&self.config_sha256),
            hex(&self.expert_tensors_sha256),
            hex(&self.expert_sample_sha256),
        ]
    }

    /// The three digests' first 12 hex digits, `/`-joined: enough to tell two identities
    /// apart in an error message without a screenful of hex.
    pub fn short_hex(&self) -> String {
        self.to_hex().map(|h| h[..12].to_string()).join("/")
    }

    /// Names of the components that differ between `self` and `other`.
    pub fn differing(&self, other: &ModelIdentity) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.config_sha256 != other.config_sha256 {
            out.push("config.json");
        }
        if self.expert_tensors_sha256 != other.expert_tensors_sha256 {
            out.push("expert tensor names/shapes");
        }
        if self.expert_sample_sha256 != other.expert_sample_sha256 {
            out.push("expert weight sample");
        }
        out
    }

    /// Computes the identity of a validated checkpoint: reads `config.json` and samples every
    /// expert matrix through the locator.
    pub fn of_checkpoint(ckpt: &Checkpoint) -> Result<ModelIdentity, ContainerError> {
        let config_path = ckpt.dir.join(CONFIG_FILE);
        let config = std::fs::read(&config_path).map_err(|e| ContainerError::Io {
            path: config_path.clone(),
            message: e.to_string(),
        })?;
        let mut h = IdentityHasher::new(&config);
        let cfg = &ckpt.config.text;
        for (layer, layout) in ckpt.expert_layouts.iter().enumerate() {
            for t in tensor_spec::expert_tensors(cfg, ckpt.prefix, layer, *layout) {
                let entry = ckpt.tensor(&t.name).ok_or_else(|| {
                    ContainerError::Identity(format!(
                        "tensor {} missing from the checkpoint",
                        t.name
                    ))
                })?;
                h.tensor_entry(&t.name, entry.loc.dtype, &entry.loc.shape, entry.loc.len);
            }
        }
        let locator = ExpertLocator::new(ckpt);
        let files = ckpt
            .shards
            .iter()
            .map(|s| {
                File::open(&s.path).map_err(|e| ContainerError::Io {
                    path: s.path.clone(),
                    message: e.to_string(),
                })
            })
            .collect::<Result<Vec<File>, ContainerError>>()?;
        let mut buf = [0u8; SAMPLE_BYTES as usize];
        for layer in LayerId::all(cfg.num_layers) {
            for expert in ExpertId::all(cfg.num_experts) {
                let r = locator
                    .expert(layer, expert)
                    .map_err(|e| ContainerError::Identity(e.to_string()))?;
                for range in [&r.gate, &r.up, &r.down] {
                    let n = sample(&files, range, &mut buf)?;
                    h.sample(&buf[..n]);
                }
            }
        }
        Ok(h.finish())
    }
}

impl ModelIdentity {
    /// The identity of a GGUF's routed experts: the "config" digest is over the file's whole
    /// header (metadata and tensor table), the tensor digest over every expert tensor's name,
    /// ggml type, shape and bytes, the sample over the first [`SAMPLE_BYTES`] of every expert's
    /// gate, up and down slice — 3 · L · E small reads, as for a checkpoint.
    pub fn of_gguf(f: &GgufFile, experts: &GgufExperts) -> Result<ModelIdentity, ContainerError> {
        let mut h = IdentityHasher::new(&f.header_bytes);
        let mut last: Option<&str> = None;
        for t in experts.tensors() {
            // A fused gate/up tensor is two views of one tensor: hashed once.
            if last != Some(t.name.as_str()) {
                h.tensor_entry_named(&t.name, t.ty.name, &t.dims, t.tensor_bytes);
            }
            last = Some(&t.name);
        }
        for layer in &experts.layers {
            for expert in 0..experts.n_experts {
                for t in [&layer.gate, &layer.up, &layer.down] {
                    let (offset, len) = t.expert_range(expert);
                    let bytes = f
                        .read(offset, len.min(SAMPLE_BYTES), &t.name)
                        .map_err(|e| ContainerError::Identity(e.to_string()))?;
                    h.sample(&bytes);
                }
            }
        }
        Ok(h.finish())
    }
}

/// Reads the first ≤ [`SAMPLE_BYTES`] of `range` into `buf`; returns the bytes read.
fn sample(files: &[File], range: &ByteRange, buf: &mut [u8]) -> Result<usize, ContainerError> {
    let file = files.get(range.shard).ok_or_else(|| {
        ContainerError::Identity(format!("shard index {} out of range", range.shard))
    })?;
    let n = range.len.min(SAMPLE_BYTES) as usize;
    file.read_exact_at(&mut buf[..n], range.offset)
        .map_err(|e| ContainerError::Io {
            path: range.file.clone(),
            message: e.to_string(),
        })?;
    Ok(n)
}

impl fmt::Display for ModelIdentity {
    /// `config <16 hex> / expert tensors <16 hex> / expert sample <16 hex>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "config {} / expert tensors {} / expert sample {}",
            &hex(&self.config_sha256)[..16],
            &hex(&self.expert_tensors_sha256)[..16],
            &hex(&self.expert_sample_sha256)[..16]
        )
    }
}

/// Builds a [`ModelIdentity`] from its inputs in canonical order, without IO.
pub struct IdentityHasher {
    config_sha256: [u8; 32],
    tensors: Sha256,
    samples: Sha256,
}

impl IdentityHasher {
    /// Starts an identity for a model whose `config.json` has these bytes.
    pub fn new(config_json: &[u8]) -> IdentityHasher {
        IdentityHasher {
            config_sha256: Sha256::digest(config_json).into(),
            tensors: Sha256::new(),
            samples: Sha256::new(),
        }
    }

    /// Adds one expert tensor's header entry (call in canonical order).
    pub fn tensor_entry(&mut self, name: &str, dtype: Dtype, shape: &[usize], byte_len: u64) {
        let shape: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        self.tensor_entry_named(name, &format!("{dtype:?}"), &shape, byte_len);
    }

    /// Adds one expert tensor's entry with its element type by name (`BF16`, or a GGUF's `Q4_K`).
    pub fn tensor_entry_named(&mut self, name: &str, dtype: &str, shape: &[u64], byte_len: u64) {
        self.tensors.update((name.len() as u32).to_le_bytes());
        self.tensors.update(name.as_bytes());
        self.tensors.update((dtype.len() as u32).to_le_bytes());
        self.tensors.update(dtype.as_bytes());
        self.tensors.update((shape.len() as u32).to_le_bytes());
        for &dim in shape {
            self.tensors.update(dim.to_le_bytes());
        }
        self.tensors.update(byte_len.to_le_bytes());
    }

    /// Adds the sample of one expert matrix (call for gate, up, down of each (layer, expert)).
    pub fn sample(&mut self, bytes: &[u8]) {
        self.samples.update((bytes.len() as u32).to_le_bytes());
        self.samples.update(bytes);
    }

    /// The finished identity.
    pub fn finish(self) -> ModelIdentity {
        ModelIdentity {
            config_sha256: self.config_sha256,
            expert_tensors_sha256: self.tensors.finalize().into(),
            expert_sample_sha256: self.samples.finalize().into(),
        }
    }
}
