//! The GGUF reader: every count is checked against the bytes that remain before anything of
//! its size is allocated, every string is UTF-8 and bounded, every tensor's type is known, its
//! first dimension a whole number of blocks, its byte size free of overflow, its offset aligned
//! and its bytes inside the file and apart from every other tensor's.

use super::{
    DEFAULT_ALIGNMENT, GgmlType, Gguf, MAGIC, MAX_DIMS, MAX_NAME_BYTES, TensorInfo, VERSIONS, Value,
};

/// Longest metadata string accepted (a chat template is kilobytes; a token, bytes).
pub const MAX_STRING_BYTES: u64 = 64 << 20;
/// Most array elements over all the metadata (the Qwen3.6 vocabulary's tokens, token types and
/// merges hold about 744 thousand): bounds what a file's counts make the reader hold (128 MiB of values).
pub const MAX_ARRAY_ELEMENTS: u64 = 1 << 22;

/// Why a GGUF file cannot be used. Each names the key or tensor and the offset where it can.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GgufError {
    /// The file does not start with `GGUF`.
    #[error("not a GGUF file: it starts with {0:02x?}, not \"GGUF\"")]
    NotGguf([u8; 4]),
    /// A version this reader does not know.
    #[error("GGUF version {0} is not supported (versions 2 and 3 are)")]
    Version(u32),
    /// The bytes end inside something.
    #[error("truncated: the file ends inside {what} (at byte {offset})")]
    Truncated {
        /// What was being read.
        what: String,
        /// Where it started.
        offset: u64,
    },
    /// A count larger than the bytes that remain could hold, or than the reader's limits.
    #[error(
        "{what}: count {count} is more than {room} (the bytes left, or the reader's limit): corrupt count"
    )]
    TooMany {
        /// What was counted.
        what: String,
        /// The count read.
        count: u64,
        /// The most it could be.
        room: u64,
    },
    /// The header (metadata and tensor table) does not end within the bytes a reader reads to
    /// find it.
    #[error(
        "the header (metadata and tensor table) is larger than the {limit} bytes read to find the tensor data (it was still reading {reading}); llama.cpp's files need a few MiB to tens of MiB"
    )]
    HeaderTooLarge {
        /// The most read.
        limit: u64,
        /// What was being read at the limit.
        reading: String,
    },
    /// A string that is not UTF-8.
    #[error("{what} at byte {offset} is not UTF-8")]
    NotUtf8 {
        /// Which string.
        what: String,
        /// Where it starts.
        offset: u64,
    },
    /// A metadata value of an unknown type, or an array of arrays.
    #[error("metadata key {key:?}: value type {ty} is not supported")]
    ValueType {
        /// The key.
        key: String,
        /// The type code.
        ty: u32,
    },
    /// A key given twice.
    #[error("metadata key {0:?} appears twice")]
    DuplicateKey(String),
    /// `general.alignment` that is not a power of two held as a `UINT32`.
    #[error("general.alignment is {0:?}: it must be a UINT32 power of two")]
    Alignment(Value),
    /// A tensor name given twice.
    #[error("tensor {0:?} appears twice")]
    DuplicateTensor(String),
    /// A metadata value the model needs that is missing or out of range.
    #[error("metadata key {key:?}: {why}")]
    Metadata {
        /// The key.
        key: String,
        /// What is wrong.
        why: String,
    },
    /// Something wrong with one tensor's info.
    #[error("tensor {tensor:?}: {why}")]
    Tensor {
        /// The tensor's name.
        tensor: String,
        /// What is wrong.
        why: String,
    },
}

/// Bytes one tensor info takes at least (an empty name, no dimensions).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;
/// Bytes one key-value pair takes at least (an empty key, a one-byte value).
const MIN_KV_BYTES: u64 = 8 + 4 + 1;

struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
    /// The whole file's length (`b` may be its first bytes only).
    file_len: u64,
}

impl<'a> Cursor<'a> {
    fn left(&self) -> u64 {
        (self.b.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
        if n > self.left() {
            return Err(GgufError::Truncated {
                what: what(),
                offset: self.pos as u64,
            });
        }
        let s = &self.b[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, what)?;
        Ok(s.try_into().expect("N bytes"))
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A `u64` count of items of at least `min_bytes` each, checked against the bytes left
    /// and `limit`.
    fn count(
        &mut self,
        min_bytes: u64,
        limit: u64,
        what: &dyn Fn() -> String,
    ) -> Result<u64, GgufError> {
        let n = self.u64(what)?;
        let in_file = self.file_len.saturating_sub(self.pos as u64);
        let room = (in_file / min_bytes.max(1)).min(limit);
        if n > room {
            return Err(GgufError::TooMany {
                what: what(),
                count: n,
                room,
            });
        }
        // It fits the file but not the bytes given: read more of the file.
        if n > self.left() / min_bytes.max(1) {
            return Err(GgufError::Truncated {
                what: what(),
                offset: self.pos as u64,
            });
        }
        Ok(n)
    }

    fn string(&mut self, limit: u64, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let len = self.count(1, limit, what)?;
        let offset = self.pos as u64;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::NotUtf8 {
            what: what(),
            offset,
        })
    }
}

/// Parses a GGUF file from `bytes` (its first bytes: at least the header, metadata and tensor
/// infos; typically the whole file, mapped) and its length `file_len` (tensor data must lie
/// inside it).
pub fn parse(bytes: &[u8], file_len: u64) -> Result<Gguf, GgufError> {
    let mut c = Cursor {
        b: bytes,
        pos: 0,
        file_len: file_len.max(bytes.len() as u64),
    };
    let mut keys = std::collections::HashSet::new();
    let mut names = std::collections::HashSet::new();
    let magic = c.array::<4>(&|| "the magic".into())?;
    if magic != MAGIC {
        return Err(GgufError::NotGguf(magic));
    }
    let version = c.u32(&|| "the version".into())?;
    if !VERSIONS.contains(&version) {
        return Err(GgufError::Version(version));
    }
    let n_tensors = c.u64(&|| "the tensor count".into())?;
    let n_kv = c.count(MIN_KV_BYTES, u64::MAX, &|| "the metadata count".into())?;
    // The tensor count is checked once the metadata is read (it bounds the bytes after it).
    let mut metadata: Vec<(String, Value)> = Vec::new();
    let mut elements = 0u64;
    for i in 0..n_kv {
        let key = c.string(1 << 16, &|| format!("metadata key {i}"))?;
        if !keys.insert(key.clone()) {
            return Err(GgufError::DuplicateKey(key));
        }
        let ty = c.u32(&|| format!("the type of metadata key {key:?}"))?;
        let value = read_value(&mut c, ty, &key, &mut elements, true)?;
        metadata.push((key, value));
    }
    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, Value::U32(a))) if a.is_power_of_two() => u64::from(*a),
        Some((_, v)) => return Err(GgufError::Alignment(v.clone())),
    };
    let room = c.left() / MIN_TENSOR_INFO_BYTES;
    if n_tensors > room {
        return Err(GgufError::TooMany {
            what: "the tensor count".into(),
            count: n_tensors,
            room,
        });
    }
    let mut infos: Vec<(String, Vec<u64>, u32, u64)> = Vec::new();
    for i in 0..n_tensors {
        let name = c.string(MAX_NAME_BYTES as u64 + 1, &|| {
            format!("the name of tensor {i}")
        })?;
        if name.len() > MAX_NAME_BYTES {
            return Err(tensor_error(
                &name,
                format!(
                    "its name is {} bytes, more than {MAX_NAME_BYTES}",
                    name.len()
                ),
            ));
        }
        let what = |part: &str| {
            let name = name.clone();
            let part = part.to_string();
            move || format!("the {part} of tensor {name:?}")
        };
        let n_dims = c.u32(&what("dimension count"))?;
        if n_dims as usize > MAX_DIMS {
            return Err(tensor_error(
                &name,
                format!("{n_dims} dimensions, more than {MAX_DIMS}"),
            ));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(c.u64(&what("dimensions"))?);
        }
        let ty = c.u32(&what("type"))?;
        let offset = c.u64(&what("offset"))?;
        if !names.insert(name.clone()) {
            return Err(GgufError::DuplicateTensor(name));
        }
        infos.push((name, dims, ty, offset));
    }
    let data_offset = (c.pos as u64).next_multiple_of(alignment);
    let mut tensors = Vec::with_capacity(infos.len());
    for (name, dims, ty, rel) in infos {
        tensors.push(locate(
            name,
            dims,
            ty,
            rel,
            alignment,
            data_offset,
            file_len,
        )?);
    }
    let mut by_offset: Vec<&TensorInfo> = tensors.iter().collect();
    by_offset.sort_by_key(|t| t.offset);
    for pair in by_offset.windows(2) {
        if pair[0].offset + pair[0].len > pair[1].offset {
            return Err(tensor_error(
                &pair[1].name,
                format!("its bytes overlap tensor {:?}'s", pair[0].name),
            ));
        }
    }
    Ok(Gguf {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

fn tensor_error(name: &str, why: String) -> GgufError {
    GgufError::Tensor {
        tensor: name.to_string(),
        why,
    }
}

/// A tensor's absolute place, with its shape, type, size and bounds checked.
fn locate(
    name: String,
    dims: Vec<u64>,
    ty: u32,
    rel: u64,
    alignment: u64,
    data_offset: u64,
    file_len: u64,
) -> Result<TensorInfo, GgufError> {
    let Some(t) = GgmlType::from_id(ty) else {
        return Err(tensor_error(
            &name,
            format!("ggml type {ty} is unknown or removed"),
        ));
    };
    // The element count, whatever the byte size (a zero dimension makes that 0), must fit
    // ggml's int64, as ggml checks.
    let elements = dims
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .filter(|&e| i64::try_from(e).is_ok());
    if dims.iter().any(|&d| i64::try_from(d).is_err()) || elements.is_none() {
        return Err(tensor_error(
            &name,
            format!("dimensions {dims:?} exceed ggml's int64"),
        ));
    }
    let inner = dims.first().copied().unwrap_or(1);
    if inner % t.block != 0 {
        return Err(tensor_error(
            &name,
            format!(
                "its first dimension {inner} is not a whole number of {} blocks of {}",
                t.name, t.block
            ),
        ));
    }
    let len = dims
        .iter()
        .skip(1)
        .try_fold((inner / t.block).checked_mul(t.block_bytes), |acc, &d| {
            acc.map(|a| a.checked_mul(d))
        })
        .flatten()
        .filter(|&l| i64::try_from(l).is_ok())
        .ok_or_else(|| {
            tensor_error(
                &name,
                format!("its size ({dims:?} of {}) overflows", t.name),
            )
        })?;
    if !rel.is_multiple_of(alignment) {
        return Err(tensor_error(
            &name,
            format!("its offset {rel} is not a multiple of the alignment {alignment}"),
        ));
    }
    let offset = data_offset.checked_add(rel);
    let end = offset.and_then(|o| o.checked_add(len));
    match (offset, end) {
        (Some(offset), Some(end)) if end <= file_len => Ok(TensorInfo {
            name,
            dims,
            ty: t,
            offset,
            len,
        }),
        _ => Err(tensor_error(
            &name,
            format!(
                "its {len} bytes at data offset {rel} (file byte {}) run past the file's {file_len} bytes (truncated file?)",
                data_offset.saturating_add(rel)
            ),
        )),
    }
}

/// Reads one value of type `ty` for `key`; arrays only at the top level.
fn read_value(
    c: &mut Cursor<'_>,
    ty: u32,
    key: &str,
    elements: &mut u64,
    top: bool,
) -> Result<Value, GgufError> {
    let what = || format!("the value of metadata key {key:?}");
    Ok(match ty {
        0 => Value::U8(c.array::<1>(&what)?[0]),
        1 => Value::I8(c.array::<1>(&what)?[0] as i8),
        2 => Value::U16(u16::from_le_bytes(c.array(&what)?)),
        3 => Value::I16(i16::from_le_bytes(c.array(&what)?)),
        4 => Value::U32(u32::from_le_bytes(c.array(&what)?)),
        5 => Value::I32(i32::from_le_bytes(c.array(&what)?)),
        6 => Value::F32(f32::from_le_bytes(c.array(&what)?)),
        // Any byte but 0 is true, as llama.cpp reads it.
        7 => Value::Bool(c.array::<1>(&what)?[0] != 0),
        8 => Value::String(c.string(MAX_STRING_BYTES, &what)?),
        9 if top => {
            let elem = c.u32(&what)?;
            let min = match elem {
                0 | 1 | 7 => 1,
                2 | 3 => 2,
                4..=6 => 4,
                8 | 10..=12 => 8,
                _ => {
                    return Err(GgufError::ValueType {
                        key: key.to_string(),
                        ty: elem,
                    });
                }
            };
            let n = c.count(min, MAX_ARRAY_ELEMENTS - *elements, &|| {
                format!("the array of metadata key {key:?}")
            })?;
            *elements += n;
            let mut values = Vec::with_capacity(n as usize);
            for _ in 0..n {
                values.push(read_value(c, elem, key, elements, false)?);
            }
            Value::Array(elem, values)
        }
        10 => Value::U64(c.u64(&what)?),
        11 => Value::I64(c.u64(&what)? as i64),
        12 => Value::F64(f64::from_bits(c.u64(&what)?)),
        _ => {
            return Err(GgufError::ValueType {
                key: key.to_string(),
                ty,
            });
        }
    })
}
