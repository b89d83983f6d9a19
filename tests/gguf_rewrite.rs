//! GGUF files rewritten for tests: llama.cpp's tiny conversion with tensors left out, a tensor
//! given other dimensions, or a metadata key set, everything else copied byte for byte through
//! sluice's writer.

use shared::gguf::{GgufFile, GgufWriter, Value, WriteTensor};
use std::path::{Path, PathBuf};

/// llama.cpp's conversion of the `tiny` fixture checkpoint (BF16), made by
/// `tests/oracle/make_llamacpp_gguf.sh`.
pub fn llamacpp_tiny_gguf() -> PathBuf {
    crate::workspace_root().join("tests/fixtures/gguf/tiny-llamacpp-bf16.gguf")
}

/// What [`rewrite_gguf`] changes.
#[derive(Debug, Default)]
pub struct GgufEdit<'a> {
    /// Tensors left out.
    pub drop: &'a [&'a str],
    /// A tensor given these dimensions (ggml order), its bytes unchanged.
    pub reshape: Option<(&'a str, &'a [u64])>,
    /// A metadata key set to this value: in place if the file has it, else added last.
    pub set: Option<(&'a str, Value)>,
}

/// The bytes of the GGUF at `path` with `edit` applied.
pub fn rewrite_gguf(path: &Path, edit: GgufEdit<'_>) -> Vec<u8> {
    let f = GgufFile::open(path).expect("the GGUF opens");
    let bytes = std::fs::read(path).expect("read the GGUF");
    let mut w = GgufWriter::new();
    let mut set = edit.set;
    for (k, v) in &f.gguf.metadata {
        w = match set.take_if(|(key, _)| key == k) {
            Some((_, value)) => w.kv(k, value),
            None => w.kv(k, v.clone()),
        };
    }
    if let Some((key, value)) = set {
        w = w.kv(key, value);
    }
    let tensors: Vec<WriteTensor<'_>> = f
        .gguf
        .tensors
        .iter()
        .filter(|t| !edit.drop.contains(&t.name.as_str()))
        .map(|t| WriteTensor {
            name: &t.name,
            dims: match edit.reshape {
                Some((name, dims)) if name == t.name => dims,
                _ => &t.dims,
            },
            ty: t.ty,
            data: &bytes[t.offset as usize..(t.offset + t.len) as usize],
        })
        .collect();
    w.to_bytes(&tensors).expect("rewrite")
}
