//! The on-disk form of one saved sequence state: the tokens it consumed, every attention
//! layer's key/value rows and every DeltaNet layer's conv and recurrent state, under the
//! identity of what computed it, checksummed as a whole.
//!
//! ```text
//! magic "SLUICEST" | version u32 | identity [32] | n_tokens u64 | tokens u32 × n_tokens
//! | n_layers u32 | per layer: kind u8 = 0 (attention): width u32, k f32 × n_tokens × width,
//! |                                                    v f32 × n_tokens × width
//! |                          kind u8 = 1 (DeltaNet):  conv_len u64, conv f32 × conv_len,
//! |                                                    rec_len u64, rec f32 × rec_len
//! | xxh3-64 of every byte before it, u64
//! ```
//! Little-endian throughout. A file is refused, naming why, when its checksum, magic, version
//! or identity differ, when it is truncated, or when its layers do not have the model's layout;
//! a refused file is never resumed from.

use crate::model::gdn::DeltaNetState;
use crate::model::snapshot::{KvRows, RecurrentSnapshot};
use std::io::{Read, Write};
use xxhash_rust::xxh3::{Xxh3, xxh3_64};

const MAGIC: &[u8; 8] = b"SLUICEST";
const VERSION: u32 = 1;
/// Bytes before the tokens: magic, version, identity, token count.
const HEAD: usize = 8 + 4 + 32 + 8;

/// Why a saved state was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FileError {
    /// The checksum does not match the contents (corrupt or truncated).
    #[error("checksum mismatch (a corrupt or truncated file)")]
    Checksum,
    /// Not a sequence-state file, or another version of the format.
    #[error("not a sluice sequence-state file of version {VERSION}")]
    Format,
    /// Saved by another model, weights, format, build or ISA.
    #[error("saved under identity {theirs}, this model's is {ours}")]
    Identity {
        /// The file's identity (hex, shortened).
        theirs: String,
        /// This model's (hex, shortened).
        ours: String,
    },
    /// The contents do not fit this model's layer layout.
    #[error("its layers do not fit this model: {0}")]
    Layout(String),
    /// Reading failed.
    #[error("{0}")]
    Io(String),
}

/// The model's layer layout a file must match: a fresh state's snapshot (kinds and DeltaNet
/// sizes) and the attention rows' width.
pub struct Layout {
    /// A fresh state's recurrent snapshot.
    pub fresh: RecurrentSnapshot,
    /// Floats per position of one attention layer's keys (and values).
    pub kv_width: usize,
}

impl Layout {
    /// The layout of `model`'s states.
    pub fn of(model: &crate::model::Model) -> Layout {
        let at = model.config().attention;
        Layout {
            fresh: model.new_state().recurrent_snapshot(),
            kv_width: at.n_kv_heads * at.head_dim,
        }
    }
}

fn short(id: &[u8; 32]) -> String {
    id[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// A writer that hashes what it writes.
struct Hashing<W: Write> {
    out: W,
    hash: Xxh3,
}

impl<W: Write> Hashing<W> {
    fn put(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.hash.update(bytes);
        self.out.write_all(bytes)
    }
    fn floats(&mut self, v: &[f32]) -> std::io::Result<()> {
        self.put(bytemuck::cast_slice(v))
    }
}

/// Writes the state that consumed `tokens` (`kv` its rows `0..tokens.len()`, `recurrent` its
/// DeltaNet layers at that position) to `out`.
pub fn write(
    out: impl Write,
    identity: &[u8; 32],
    tokens: &[u32],
    kv: &KvRows,
    recurrent: &RecurrentSnapshot,
) -> std::io::Result<()> {
    assert_eq!(kv.rows(), tokens.len(), "rows cover the tokens");
    let mut w = Hashing {
        out,
        hash: Xxh3::new(),
    };
    w.put(MAGIC)?;
    w.put(&VERSION.to_le_bytes())?;
    w.put(identity)?;
    w.put(&(tokens.len() as u64).to_le_bytes())?;
    w.put(bytemuck::cast_slice(tokens))?;
    w.put(&(recurrent.layers().len() as u32).to_le_bytes())?;
    let mut attention = kv.layers().iter();
    for layer in recurrent.layers() {
        match layer {
            None => {
                let (k, v) = attention.next().expect("an attention layer's rows");
                let width = if tokens.is_empty() {
                    0
                } else {
                    k.len() / tokens.len()
                };
                w.put(&[0])?;
                w.put(&(width as u32).to_le_bytes())?;
                w.floats(k)?;
                w.floats(v)?;
            }
            Some(s) => {
                let (conv, rec) = s.parts();
                w.put(&[1])?;
                w.put(&(conv.len() as u64).to_le_bytes())?;
                w.floats(conv)?;
                w.put(&(rec.len() as u64).to_le_bytes())?;
                w.floats(rec)?;
            }
        }
    }
    let sum = w.hash.digest();
    w.out.write_all(&sum.to_le_bytes())?;
    w.out.flush()
}

/// The identity and tokens of a file, read from its head only (for the index; the contents
/// are checked when the state is loaded). `None` when it is not a state file.
pub fn read_head(
    mut input: impl Read,
    max_tokens: usize,
) -> Result<([u8; 32], Vec<u32>), FileError> {
    let mut head = [0u8; HEAD];
    input.read_exact(&mut head).map_err(|_| FileError::Format)?;
    let (identity, n) = parse_head(&head)?;
    if n > max_tokens {
        return Err(FileError::Format);
    }
    let mut bytes = vec![0u8; n * 4];
    input
        .read_exact(&mut bytes)
        .map_err(|_| FileError::Format)?;
    Ok((identity, u32s(&bytes)))
}

fn u32s(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
        .collect()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
        .collect()
}

fn parse_head(head: &[u8]) -> Result<([u8; 32], usize), FileError> {
    if head.len() < HEAD || &head[..8] != MAGIC || head[8..12] != VERSION.to_le_bytes() {
        return Err(FileError::Format);
    }
    let identity: [u8; 32] = head[12..44].try_into().expect("32 bytes");
    let n = u64::from_le_bytes(head[44..52].try_into().expect("8 bytes"));
    Ok((identity, usize::try_from(n).map_err(|_| FileError::Format)?))
}

/// A cursor over a verified file's bytes.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], FileError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| FileError::Layout(format!("{n} bytes past the end at {}", self.at)))?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32, FileError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<usize, FileError> {
        let v = u64::from_le_bytes(self.take(8)?.try_into().expect("8"));
        usize::try_from(v).map_err(|_| FileError::Layout(format!("length {v}")))
    }
    fn floats(&mut self, n: usize) -> Result<Vec<f32>, FileError> {
        let bytes = n
            .checked_mul(4)
            .ok_or_else(|| FileError::Layout(format!("{n} floats")))?;
        Ok(f32s(self.take(bytes)?))
    }
}

/// A saved state, verified: its tokens, its rows and its DeltaNet layers.
pub struct Saved {
    /// The tokens it consumed.
    pub tokens: Vec<u32>,
    /// Key/value rows of positions `0..tokens.len()`.
    pub kv: KvRows,
    /// The DeltaNet layers at `tokens.len()`.
    pub recurrent: RecurrentSnapshot,
}

/// Decodes a whole file, checking its checksum first, then its format, identity and layout.
pub fn read(bytes: &[u8], identity: &[u8; 32], layout: &Layout) -> Result<Saved, FileError> {
    let body_len = bytes.len().checked_sub(8).ok_or(FileError::Checksum)?;
    let sum = u64::from_le_bytes(bytes[body_len..].try_into().expect("8 bytes"));
    if xxh3_64(&bytes[..body_len]) != sum {
        return Err(FileError::Checksum);
    }
    let (theirs, n) = parse_head(bytes)?;
    if &theirs != identity {
        return Err(FileError::Identity {
            theirs: short(&theirs),
            ours: short(identity),
        });
    }
    let mut c = Cursor {
        bytes: &bytes[..body_len],
        at: HEAD,
    };
    let tokens = u32s(c.take(n.checked_mul(4).ok_or(FileError::Format)?)?);
    let n_layers = c.u32()? as usize;
    let fresh = layout.fresh.layers();
    if n_layers != fresh.len() {
        return Err(FileError::Layout(format!(
            "{n_layers} layers, the model has {}",
            fresh.len()
        )));
    }
    let mut attention = Vec::new();
    let mut layers = Vec::with_capacity(n_layers);
    for (i, like) in fresh.iter().enumerate() {
        let kind = c.take(1)?[0];
        match (kind, like) {
            (0, None) => {
                let width = c.u32()? as usize;
                if width != layout.kv_width {
                    return Err(FileError::Layout(format!(
                        "layer {i}: rows of {width} floats, the model's are {}",
                        layout.kv_width
                    )));
                }
                let whole = n
                    .checked_mul(width)
                    .ok_or_else(|| FileError::Layout(format!("layer {i}: {n} rows")))?;
                let k = c.floats(whole)?;
                let v = c.floats(whole)?;
                attention.push((k, v));
                layers.push(None);
            }
            (1, Some(like)) => {
                let conv_len = c.u64()?;
                let conv = c.floats(conv_len)?;
                let rec_len = c.u64()?;
                let rec = c.floats(rec_len)?;
                let s = DeltaNetState::from_parts(like, conv, rec).ok_or_else(|| {
                    FileError::Layout(format!("layer {i}: DeltaNet state of another size"))
                })?;
                layers.push(Some(s));
            }
            _ => {
                return Err(FileError::Layout(format!(
                    "layer {i}: kind {kind} where the model has {}",
                    if like.is_none() {
                        "attention"
                    } else {
                        "DeltaNet"
                    }
                )));
            }
        }
    }
    if c.at != body_len {
        return Err(FileError::Layout(format!(
            "{} bytes after the last layer",
            body_len - c.at
        )));
    }
    let kv = KvRows::from_layers(attention, n, layout.kv_width)
        .ok_or_else(|| FileError::Layout("attention rows".into()))?;
    Ok(Saved {
        tokens,
        kv,
        recurrent: RecurrentSnapshot::from_layers(layers, n),
    })
}
