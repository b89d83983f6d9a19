//! The model directory reader: `config.json`, `model.safetensors.index.json` and every shard's
//! header — never a payload — into a validated tensor inventory.
//!
//! This is the one module of `shared` that touches the filesystem (reads of a few kilobytes per
//! shard); everything it reads goes through the pure parsers in `config`,
//! `safetensors_header` and `tensor_spec`. Each failure is one `CheckpointError` naming the
//! field or tensor and the file.

use crate::config::{ConfigError, ModelConfig, parse_config};
use crate::safetensors_header::{self, HeaderError, LEN_PREFIX_BYTES, TensorLocation};
use crate::tensor_spec::{
    self, ExpectedTensor, ExpertLayout, PREFIX_RELEASE, PREFIX_TEXT_ONLY, SkippedPart,
};
use safetensors::Dtype;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Configuration file name inside a model directory.
pub const CONFIG_FILE: &str = "config.json";
/// Sharded-checkpoint index file name.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// Single-file checkpoint name (used when there is no index).
pub const SINGLE_FILE: &str = "model.safetensors";

/// One safetensors file of the checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Shard {
    /// File name relative to the model directory.
    pub file_name: String,
    /// Full path.
    pub path: PathBuf,
    /// File length in bytes.
    pub file_len: u64,
    /// Tensors in its header (all parts, including skipped ones).
    pub n_tensors: usize,
}

/// Where one tensor lives: which shard, and its absolute byte range there.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorEntry {
    /// Index into `Checkpoint::shards`.
    pub shard: usize,
    /// Dtype, shape and absolute byte range.
    pub loc: TensorLocation,
}

/// A model directory whose text tensors all exist with the expected shapes and dtypes.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// The model directory.
    pub dir: PathBuf,
    /// The validated configuration.
    pub config: ModelConfig,
    /// Name prefix of the text model (`model.language_model.` or `model.`).
    pub prefix: &'static str,
    /// Shards in file-name order.
    pub shards: Vec<Shard>,
    /// Expert storage layout of each layer.
    pub expert_layouts: Vec<ExpertLayout>,
    /// Tensors skipped because they belong to the vision tower or the MTP head.
    pub skipped: BTreeMap<&'static str, usize>,
    /// Text-model tensors the runtime does not know (reported, not loaded).
    pub unexpected: Vec<String>,
    tensors: HashMap<String, TensorEntry>,
}

/// Why a model directory cannot be loaded.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The model directory is missing or not a directory.
    #[error("{dir}: {message}")]
    Directory {
        /// The directory given.
        dir: PathBuf,
        /// Why it is unusable.
        message: String,
    },
    /// A file could not be opened or read.
    #[error("{path}: {message}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        message: String,
    },
    /// `config.json` is unusable.
    #[error("{path}: {source}")]
    Config {
        /// The config file.
        path: PathBuf,
        /// What is wrong with it.
        source: ConfigError,
    },
    /// The directory has neither an index nor a single `model.safetensors`.
    #[error("{dir}: no {INDEX_FILE} and no {SINGLE_FILE}; is this a safetensors model directory?")]
    NoWeights {
        /// The model directory.
        dir: PathBuf,
    },
    /// The index file is malformed.
    #[error("{path}: {reason}")]
    Index {
        /// The index file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The index names a shard that is not in the directory.
    #[error("{index}: names shard {shard:?} (for tensor {tensor}) but {path} does not exist")]
    MissingShard {
        /// The index file.
        index: PathBuf,
        /// The shard file name.
        shard: String,
        /// One tensor the index places in it.
        tensor: String,
        /// Where the shard was looked for.
        path: PathBuf,
    },
    /// A shard's header is unusable.
    #[error("{path}: {source}")]
    ShardHeader {
        /// The shard file.
        path: PathBuf,
        /// What is wrong with its header.
        source: HeaderError,
    },
    /// The index places a tensor in a shard whose header does not contain it.
    #[error(
        "{index}: places tensor {tensor} in {shard} but that shard's header does not contain it"
    )]
    IndexMismatch {
        /// The index file.
        index: PathBuf,
        /// The tensor.
        tensor: String,
        /// The shard file name.
        shard: String,
    },
    /// The same tensor appears in two shards.
    #[error("tensor {tensor} appears in both {first} and {second}")]
    DuplicateTensor {
        /// The tensor.
        tensor: String,
        /// First shard file name.
        first: String,
        /// Second shard file name.
        second: String,
    },
    /// A required text tensor is absent.
    #[error("missing tensor {tensor} (looked in {looked_in})")]
    MissingTensor {
        /// The tensor (or the alternatives looked for).
        tensor: String,
        /// The index or shard that was searched.
        looked_in: PathBuf,
    },
    /// A tensor has the wrong shape.
    #[error("{file}: tensor {tensor} has shape {found:?}, expected {expected:?}")]
    WrongShape {
        /// The shard file.
        file: PathBuf,
        /// The tensor.
        tensor: String,
        /// Shape the config implies.
        expected: Vec<usize>,
        /// Shape in the file.
        found: Vec<usize>,
    },
    /// A tensor has a dtype the runtime does not accept.
    #[error(
        "{file}: tensor {tensor} has dtype {found:?}, expected {}",
        fmt_dtypes(expected)
    )]
    WrongDtype {
        /// The shard file.
        file: PathBuf,
        /// The tensor.
        tensor: String,
        /// Accepted dtypes.
        expected: Vec<Dtype>,
        /// Dtype in the file.
        found: Dtype,
    },
}

fn fmt_dtypes(d: &[Dtype]) -> String {
    d.iter()
        .map(|d| format!("{d:?}"))
        .collect::<Vec<_>>()
        .join(" or ")
}

fn io_err(path: &Path, e: std::io::Error) -> CheckpointError {
    CheckpointError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// Reads and validates `dir/config.json`.
pub fn read_config(dir: &Path) -> Result<ModelConfig, CheckpointError> {
    // A wrong directory is named as such, not as a missing config.json inside it.
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(CheckpointError::Directory {
                dir: dir.to_path_buf(),
                message: "not a directory".into(),
            });
        }
        Err(e) => {
            return Err(CheckpointError::Directory {
                dir: dir.to_path_buf(),
                message: e.to_string(),
            });
        }
    }
    let path = dir.join(CONFIG_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| io_err(&path, e))?;
    parse_config(&text).map_err(|source| CheckpointError::Config { path, source })
}

impl Checkpoint {
    /// Opens a model directory: parses the config, the index and every shard header, and checks
    /// that every text tensor the config implies exists with the right shape and dtype.
    pub fn open(dir: &Path) -> Result<Checkpoint, CheckpointError> {
        let config = read_config(dir)?;
        let (index_path, weight_map) = read_weight_map(dir)?;
        let (shards, tensors) = read_shards(dir, &index_path, &weight_map)?;
        let mut ckpt = Checkpoint {
            dir: dir.to_path_buf(),
            config,
            prefix: PREFIX_RELEASE,
            shards,
            expert_layouts: Vec::new(),
            skipped: BTreeMap::new(),
            unexpected: Vec::new(),
            tensors,
        };
        ckpt.validate(&index_path)?;
        Ok(ckpt)
    }

    /// Location of a tensor by full name.
    pub fn tensor(&self, name: &str) -> Option<&TensorEntry> {
        self.tensors.get(name)
    }

    /// Path of the shard holding `entry`.
    pub fn shard_path(&self, entry: &TensorEntry) -> &Path {
        &self.shards[entry.shard].path
    }

    /// Bytes the text tensors occupy on disk, split into (dense, routed experts).
    pub fn text_bytes_on_disk(&self) -> (u64, u64) {
        let cfg = &self.config.text;
        let mut dense = 0;
        let mut routed = 0;
        for t in tensor_spec::dense_tensors(cfg, self.prefix) {
            dense += self.tensors.get(&t.name).map_or(0, |e| e.loc.len);
        }
        for (layer, layout) in self.expert_layouts.iter().enumerate() {
            for t in tensor_spec::expert_tensors(cfg, self.prefix, layer, *layout) {
                routed += self.tensors.get(&t.name).map_or(0, |e| e.loc.len);
            }
        }
        (dense, routed)
    }

    /// Number of text tensors the runtime loads (dense + routed expert tensors as stored).
    pub fn text_tensor_count(&self) -> usize {
        let cfg = &self.config.text;
        let experts: usize = self
            .expert_layouts
            .iter()
            .enumerate()
            .map(|(l, layout)| tensor_spec::expert_tensors(cfg, self.prefix, l, *layout).len())
            .sum();
        tensor_spec::dense_tensors(cfg, self.prefix).len() + experts
    }

    fn validate(&mut self, looked_in: &Path) -> Result<(), CheckpointError> {
        let text_only_embed = format!("{PREFIX_TEXT_ONLY}embed_tokens.weight");
        self.prefix = if self.tensors.keys().any(|n| n.starts_with(PREFIX_RELEASE)) {
            PREFIX_RELEASE
        } else if self.tensors.contains_key(&text_only_embed) {
            PREFIX_TEXT_ONLY
        } else {
            return Err(CheckpointError::MissingTensor {
                tensor: format!("{PREFIX_RELEASE}embed_tokens.weight"),
                looked_in: looked_in.to_path_buf(),
            });
        };
        let cfg = self.config.text.clone();
        let mut expected: Vec<ExpectedTensor> = tensor_spec::dense_tensors(&cfg, self.prefix);
        for layer in 0..cfg.num_layers {
            let fused = tensor_spec::fused_gate_up_name(self.prefix, layer);
            let per_expert = tensor_spec::per_expert_name(self.prefix, layer, 0, "gate_proj");
            let layout = if self.tensors.contains_key(&fused) {
                ExpertLayout::Fused
            } else if self.tensors.contains_key(&per_expert) {
                ExpertLayout::PerExpert
            } else {
                return Err(CheckpointError::MissingTensor {
                    tensor: format!("{fused} (or per-expert {per_expert})"),
                    looked_in: looked_in.to_path_buf(),
                });
            };
            self.expert_layouts.push(layout);
            expected.extend(tensor_spec::expert_tensors(
                &cfg,
                self.prefix,
                layer,
                layout,
            ));
        }
        for t in &expected {
            self.check(t, looked_in)?;
        }
        let known: HashSet<&str> = expected.iter().map(|t| t.name.as_str()).collect();
        let mut unexpected = Vec::new();
        for name in self.tensors.keys() {
            if let Some(part) = SkippedPart::of(name) {
                let key = match part {
                    SkippedPart::Vision => "vision",
                    SkippedPart::Mtp => "mtp",
                };
                *self.skipped.entry(key).or_default() += 1;
            } else if !known.contains(name.as_str()) {
                unexpected.push(name.clone());
            }
        }
        unexpected.sort();
        self.unexpected = unexpected;
        Ok(())
    }

    fn check(&self, t: &ExpectedTensor, looked_in: &Path) -> Result<(), CheckpointError> {
        let entry = self
            .tensors
            .get(&t.name)
            .ok_or_else(|| CheckpointError::MissingTensor {
                tensor: t.name.clone(),
                looked_in: looked_in.to_path_buf(),
            })?;
        let file = self.shard_path(entry).to_path_buf();
        if entry.loc.shape != t.shape {
            return Err(CheckpointError::WrongShape {
                file,
                tensor: t.name.clone(),
                expected: t.shape.clone(),
                found: entry.loc.shape.clone(),
            });
        }
        if !t.accepted.contains(&entry.loc.dtype) {
            return Err(CheckpointError::WrongDtype {
                file,
                tensor: t.name.clone(),
                expected: t.accepted.to_vec(),
                found: entry.loc.dtype,
            });
        }
        Ok(())
    }
}

/// Returns the file the tensor map came from and `tensor name → shard file name`.
fn read_weight_map(dir: &Path) -> Result<(PathBuf, BTreeMap<String, String>), CheckpointError> {
    let index_path = dir.join(INDEX_FILE);
    if !index_path.exists() {
        let single = dir.join(SINGLE_FILE);
        if single.exists() {
            // No index: every tensor of the single file is in the map (filled from its header).
            return Ok((single, BTreeMap::new()));
        }
        return Err(CheckpointError::NoWeights {
            dir: dir.to_path_buf(),
        });
    }
    let bad = |reason: String| CheckpointError::Index {
        path: index_path.clone(),
        reason,
    };
    let text = std::fs::read_to_string(&index_path).map_err(|e| io_err(&index_path, e))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    let map = value
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad("missing object field weight_map".into()))?;
    let mut out = BTreeMap::new();
    for (name, file) in map {
        let file = file
            .as_str()
            .ok_or_else(|| bad(format!("weight_map[{name:?}] is not a string")))?;
        // Shards must be plain file names inside the model directory.
        if file.is_empty()
            || file.contains('/')
            || file.contains('\\')
            || file == "."
            || file == ".."
        {
            return Err(bad(format!(
                "weight_map[{name:?}] = {file:?} is not a file name inside the model directory"
            )));
        }
        out.insert(name.clone(), file.to_string());
    }
    if out.is_empty() {
        return Err(bad("weight_map is empty".into()));
    }
    Ok((index_path, out))
}

type Inventory = (Vec<Shard>, HashMap<String, TensorEntry>);

fn read_shards(
    dir: &Path,
    index_path: &Path,
    weight_map: &BTreeMap<String, String>,
) -> Result<Inventory, CheckpointError> {
    let mut files: Vec<String> = weight_map
        .values()
        .cloned()
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    if files.is_empty() {
        files.push(SINGLE_FILE.to_string());
    }
    files.sort();
    let mut shards = Vec::with_capacity(files.len());
    let mut tensors: HashMap<String, TensorEntry> = HashMap::new();
    for (shard_idx, file_name) in files.iter().enumerate() {
        let path = dir.join(file_name);
        if !path.exists() {
            let tensor = weight_map
                .iter()
                .find(|(_, f)| *f == file_name)
                .map(|(t, _)| t.clone())
                .unwrap_or_default();
            return Err(CheckpointError::MissingShard {
                index: index_path.to_path_buf(),
                shard: file_name.clone(),
                tensor,
                path,
            });
        }
        let header = read_shard_header(&path)?;
        for (name, loc) in &header {
            if let Some(prev) = tensors.get(name) {
                return Err(CheckpointError::DuplicateTensor {
                    tensor: name.clone(),
                    first: files[prev.shard].clone(),
                    second: file_name.clone(),
                });
            }
            tensors.insert(
                name.clone(),
                TensorEntry {
                    shard: shard_idx,
                    loc: loc.clone(),
                },
            );
        }
        let file_len = std::fs::metadata(&path)
            .map_err(|e| io_err(&path, e))?
            .len();
        shards.push(Shard {
            file_name: file_name.clone(),
            path,
            file_len,
            n_tensors: header.len(),
        });
    }
    for (name, file) in weight_map {
        let placed = tensors.get(name).map(|e| &shards[e.shard].file_name);
        if placed != Some(file) {
            return Err(CheckpointError::IndexMismatch {
                index: index_path.to_path_buf(),
                tensor: name.clone(),
                shard: file.clone(),
            });
        }
    }
    Ok((shards, tensors))
}

/// Reads only the length prefix and the JSON header of one shard.
pub fn read_shard_header(path: &Path) -> Result<Vec<(String, TensorLocation)>, CheckpointError> {
    let file = File::open(path).map_err(|e| io_err(path, e))?;
    let file_len = file.metadata().map_err(|e| io_err(path, e))?.len();
    let header_err = |source| CheckpointError::ShardHeader {
        path: path.to_path_buf(),
        source,
    };
    let mut prefix = [0u8; LEN_PREFIX_BYTES as usize];
    let got = read_full_at(&file, &mut prefix, 0).map_err(|e| io_err(path, e))?;
    let n = safetensors_header::header_len(&prefix[..got], file_len).map_err(header_err)?;
    // `header_len` capped n at MAX_HEADER_BYTES and checked it fits in the file.
    let mut json = vec![0u8; n as usize];
    let got = read_full_at(&file, &mut json, LEN_PREFIX_BYTES).map_err(|e| io_err(path, e))?;
    if got != json.len() {
        return Err(header_err(HeaderError::Truncated {
            file_len,
            needed: LEN_PREFIX_BYTES + n,
        }));
    }
    safetensors_header::parse_header(&json, file_len).map_err(header_err)
}

/// `pread` until `buf` is full or the file ends; returns the bytes read.
pub fn read_full_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}
