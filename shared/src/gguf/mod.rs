//! GGUF files (llama.cpp's container): the header, the metadata, the tensor infos and where each
//! tensor's bytes lie, parsed from the file's bytes with every count, length, offset and size
//! checked ([`parse`]); and a writer of the same format ([`write`]) for tests and synthetic
//! models. IO-free: the caller maps or reads the file.
//!
//! Why not a crate: the maintained GGUF readers (`candle-core`'s `gguf_file`, `ggus`, the
//! `gguf` crates) either pull in a tensor library or read from a `Read + Seek` without bounding
//! what a hostile file's counts make them allocate; ours is about 400 lines, checks every count
//! against the bytes that remain before allocating, and names the tensor or key that failed.

mod config;
mod dense;
mod dequant;
mod experts;
mod file;
mod parse;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_experts;
mod tokenizer;
mod write;

pub use config::{config_json, model_config};
pub use dense::{DenseTensor, GgufDense, HeadOrder, Stored};
pub use dequant::{DEQUANTIZED, dequantize};
pub use experts::{ARCHITECTURE, ExpertTensor, GgufExperts, LayerExperts, MAX_EXPERT_WEIGHTS};
pub use file::{GgufFile, OpenError, is_gguf_path};
pub use parse::{GgufError, MAX_ARRAY_ELEMENTS, MAX_STRING_BYTES, parse};
pub use tokenizer::{QWEN35_SPLIT, tokenizer_json};
pub use write::{GgufWriter, WriteTensor};

/// The four bytes that open a GGUF file.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// The GGUF versions read (2 and 3 share their layout: 64-bit counts).
pub const VERSIONS: std::ops::RangeInclusive<u32> = 2..=3;
/// The data section's alignment when `general.alignment` does not say.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Most dimensions a tensor has (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;
/// Longest tensor name, in bytes (ggml's `GGML_MAX_NAME` less its terminating zero).
pub const MAX_NAME_BYTES: usize = 63;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `UINT8`.
    U8(u8),
    /// `INT8`.
    I8(i8),
    /// `UINT16`.
    U16(u16),
    /// `INT16`.
    I16(i16),
    /// `UINT32`.
    U32(u32),
    /// `INT32`.
    I32(i32),
    /// `FLOAT32`.
    F32(f32),
    /// `BOOL`.
    Bool(bool),
    /// `STRING` (UTF-8).
    String(String),
    /// `ARRAY` of one element type (its id, `ValueType`'s code) and the values.
    Array(u32, Vec<Value>),
    /// `UINT64`.
    U64(u64),
    /// `INT64`.
    I64(i64),
    /// `FLOAT64`.
    F64(f64),
}

impl Value {
    /// The value as an unsigned integer, when it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a string, when it is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }
}

/// ggml's tensor element types that a GGUF may name: id, name, weights per block, bytes per
/// block (ggml's `sizeof(block_*)`; the PyPI `gguf` package agrees on every one but `Q8_1`,
/// which it sizes with f32 scales as 40: ggml's is 36, and no file stores it). Removed ids
/// (4, 5, 31–33, 36–38) are absent and refused.
pub const GGML_TYPES: &[(u32, &str, u64, u64)] = &[
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (9, "Q8_1", 32, 36),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17),
    (40, "NVFP4", 64, 36),
    (41, "Q1_0", 128, 18),
];

/// A tensor element type (a row of [`GGML_TYPES`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgmlType {
    /// ggml's id.
    pub id: u32,
    /// ggml's name (`Q4_K`).
    pub name: &'static str,
    /// Weights per block.
    pub block: u64,
    /// Bytes per block.
    pub block_bytes: u64,
}

impl GgmlType {
    /// The type with ggml id `id`, if it is one GGUF files may hold.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        GGML_TYPES
            .iter()
            .find(|t| t.0 == id)
            .map(|&(id, name, block, block_bytes)| GgmlType {
                id,
                name,
                block,
                block_bytes,
            })
    }

    /// The type named `name` (ggml's spelling).
    pub fn from_name(name: &str) -> Option<GgmlType> {
        GGML_TYPES
            .iter()
            .find(|t| t.1 == name)
            .and_then(|t| GgmlType::from_id(t.0))
    }
}

/// One tensor: its name, shape (ggml order: `dims[0]` is the contiguous, innermost one), type
/// and bytes, as an absolute range of the file.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// The tensor's name.
    pub name: String,
    /// Dimensions, innermost first (ggml's `ne`).
    pub dims: Vec<u64>,
    /// Element type.
    pub ty: GgmlType,
    /// Absolute byte offset of the tensor's data in the file.
    pub offset: u64,
    /// Bytes of data.
    pub len: u64,
}

impl TensorInfo {
    /// Checks that this tensor is `count` matrices of `rows` rows of `cols` values each, in a
    /// type [`dequantize`] reads, every row whole blocks; returns the bytes of one row. The
    /// error says what is wrong, without the tensor's name (the caller adds it and what the
    /// tensor holds).
    pub fn row_bytes(&self, rows: usize, cols: usize, count: usize) -> Result<u64, String> {
        let ty = self.ty;
        if !DEQUANTIZED.contains(&ty.name) {
            return Err(format!(
                "type {} is not supported (supported: {})",
                ty.name,
                DEQUANTIZED.join(", ")
            ));
        }
        if !(cols as u64).is_multiple_of(ty.block) {
            return Err(format!(
                "rows of {cols} values are not whole {} blocks of {}",
                ty.name, ty.block
            ));
        }
        let row_bytes = cols as u64 / ty.block * ty.block_bytes;
        let want = u128::from(row_bytes) * rows as u128 * count as u128;
        if want != u128::from(self.len) {
            let each = if count == 1 {
                String::new()
            } else {
                format!("{count} × ")
            };
            return Err(format!(
                "{} bytes, expected {each}{rows} rows × {row_bytes}",
                self.len
            ));
        }
        Ok(row_bytes)
    }
}

/// A parsed GGUF file: version, metadata in file order, tensors in file order, and where the
/// data section starts.
#[derive(Debug, Clone, PartialEq)]
pub struct Gguf {
    /// The format version (2 or 3).
    pub version: u32,
    /// Metadata key-value pairs, in file order (keys are unique).
    pub metadata: Vec<(String, Value)>,
    /// Tensors, in file order (names are unique).
    pub tensors: Vec<TensorInfo>,
    /// The data section's alignment.
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_offset: u64,
}

impl Gguf {
    /// The metadata value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }
}
