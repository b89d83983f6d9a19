//! A GGUF writer (version 3): metadata in the order given, tensors in the order given, each
//! tensor's data at the next multiple of the alignment, the file padded to it. For tests and
//! synthetic models; it refuses what the reader would refuse about a tensor's size.

use super::{DEFAULT_ALIGNMENT, GgmlType, MAGIC, Value};

/// One tensor to write: name, dimensions (innermost first), type and its bytes.
pub struct WriteTensor<'a> {
    /// The tensor's name.
    pub name: &'a str,
    /// Dimensions, innermost first.
    pub dims: &'a [u64],
    /// Element type.
    pub ty: GgmlType,
    /// The encoded data (`dims` of `ty`, exactly).
    pub data: &'a [u8],
}

/// Metadata to write, in order.
#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
}

impl GgufWriter {
    /// An empty file.
    pub fn new() -> GgufWriter {
        GgufWriter::default()
    }

    /// Adds a metadata pair.
    pub fn kv(mut self, key: &str, value: Value) -> GgufWriter {
        self.metadata.push((key.to_string(), value));
        self
    }

    /// The file's bytes with `tensors`; refuses a tensor whose data is not its dimensions' size.
    pub fn to_bytes(&self, tensors: &[WriteTensor<'_>]) -> Result<Vec<u8>, String> {
        let alignment = match self.metadata.iter().find(|(k, _)| k == "general.alignment") {
            Some((_, Value::U32(a))) if a.is_power_of_two() => u64::from(*a),
            Some((_, v)) => {
                return Err(format!(
                    "general.alignment must be a UINT32 power of two, not {v:?}"
                ));
            }
            None => DEFAULT_ALIGNMENT,
        };
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            string(&mut out, k);
            out.extend_from_slice(&type_code(v).to_le_bytes());
            value(&mut out, v)?;
        }
        let mut rel = 0u64;
        let mut offsets = Vec::with_capacity(tensors.len());
        for t in tensors {
            let inner = t.dims.first().copied().unwrap_or(1);
            let elements = t.dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
            if inner % t.ty.block != 0
                || elements.and_then(|e| (e / t.ty.block).checked_mul(t.ty.block_bytes))
                    != Some(t.data.len() as u64)
            {
                return Err(format!(
                    "tensor {}: {} bytes are not {:?} of {}",
                    t.name,
                    t.data.len(),
                    t.dims,
                    t.ty.name
                ));
            }
            string(&mut out, t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ty.id.to_le_bytes());
            out.extend_from_slice(&rel.to_le_bytes());
            offsets.push(rel);
            rel = (rel + t.data.len() as u64).next_multiple_of(alignment);
        }
        let data_offset = (out.len() as u64).next_multiple_of(alignment);
        out.resize(data_offset as usize, 0);
        for (t, rel) in tensors.iter().zip(offsets) {
            out.resize((data_offset + rel) as usize, 0);
            out.extend_from_slice(t.data);
        }
        out.resize((data_offset + rel) as usize, 0);
        Ok(out)
    }
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn type_code(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(..) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn value(out: &mut Vec<u8>, v: &Value) -> Result<(), String> {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => string(out, s),
        Value::Array(elem, values) => {
            out.extend_from_slice(&elem.to_le_bytes());
            out.extend_from_slice(&(values.len() as u64).to_le_bytes());
            for x in values {
                if type_code(x) != *elem || matches!(x, Value::Array(..)) {
                    return Err(format!("array of type {elem} holds {x:?}"));
                }
                value(out, x)?;
            }
        }
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
    Ok(())
}
