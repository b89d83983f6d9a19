//! Opening a GGUF file: reads as much of its start as the header, metadata and tensor infos
//! need (doubling from 16 MiB, since a tokenizer's vocabulary can make the metadata tens of
//! MiB), parses it, and keeps the file open for `pread`s of tensor data. The data itself is
//! never read here, so opening a 20 GB file costs its metadata only.

use super::{Gguf, GgufError, MAGIC, parse};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The first read of a file's start.
const FIRST_READ: u64 = 16 << 20;
/// The most of a file's start read to find its tensor data (header, metadata, tensor infos).
const MAX_HEADER_BYTES: u64 = 1 << 30;

/// Why a GGUF file could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// A read failed.
    #[error("{path}: {message}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        message: String,
    },
    /// The file is not a usable GGUF.
    #[error("{path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        source: GgufError,
    },
}

/// An open GGUF file and its parsed header.
#[derive(Debug)]
pub struct GgufFile {
    /// Where it is.
    pub path: PathBuf,
    /// The open file (read-only).
    pub file: File,
    /// Its length in bytes.
    pub len: u64,
    /// What its header says.
    pub gguf: Gguf,
    /// Its bytes before the tensor data: the header, metadata and tensor infos.
    pub header_bytes: Vec<u8>,
}

/// Whether `path` names a GGUF file (a file whose name ends in `.gguf` or whose first bytes are
/// the GGUF magic) rather than a checkpoint directory.
pub fn is_gguf_path(path: &Path) -> bool {
    if !path.is_file() {
        return false;
    }
    let named = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    let mut magic = [0u8; 4];
    named
        || File::open(path)
            .and_then(|f| f.read_exact_at(&mut magic, 0))
            .is_ok_and(|()| magic == MAGIC)
}

impl GgufFile {
    /// Opens and parses `path`. A split GGUF (`split.count` > 1) is refused with how to merge it.
    pub fn open(path: &Path) -> Result<GgufFile, OpenError> {
        Self::open_with_header_limit(path, MAX_HEADER_BYTES)
    }

    /// [`Self::open`], reading at most `max_header` bytes of the file's start to find its tensor
    /// data (`open` allows 1 GiB); a header that needs more is refused as too large, not as a
    /// truncated file.
    pub fn open_with_header_limit(path: &Path, max_header: u64) -> Result<GgufFile, OpenError> {
        let io = |e: std::io::Error| OpenError::Io {
            path: path.to_path_buf(),
            message: e.to_string(),
        };
        let parse_err = |source| OpenError::Parse {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let mut want = FIRST_READ.min(len).min(max_header);
        let (gguf, mut bytes) = loop {
            let mut bytes = vec![0u8; want as usize];
            file.read_exact_at(&mut bytes, 0).map_err(io)?;
            match parse(&bytes, len) {
                Ok(g) => break (g, bytes),
                Err(GgufError::Truncated { .. }) if want < len.min(max_header) => {
                    want = (want * 2).min(len).min(max_header);
                }
                Err(GgufError::Truncated { what, .. }) if want < len => {
                    return Err(parse_err(GgufError::HeaderTooLarge {
                        limit: max_header,
                        reading: what,
                    }));
                }
                Err(e) => return Err(parse_err(e)),
            }
        };
        if let Some(n) = gguf.get("split.count").and_then(super::Value::as_u64)
            && n > 1
        {
            return Err(parse_err(GgufError::Metadata {
                key: "split.count".into(),
                why: format!(
                    "this is one of {n} split files; merge them first \
                     (llama.cpp: `llama-gguf-split --merge FIRST.gguf OUT.gguf`)"
                ),
            }));
        }
        bytes.truncate(gguf.data_offset.min(bytes.len() as u64) as usize);
        Ok(GgufFile {
            path: path.to_path_buf(),
            file,
            len,
            gguf,
            header_bytes: bytes,
        })
    }

    /// Reads `len` bytes at absolute offset `offset` into a new buffer; the error names `what`.
    pub fn read(&self, offset: u64, len: u64, what: &str) -> Result<Vec<u8>, OpenError> {
        let mut buf = vec![0u8; len as usize];
        self.file
            .read_exact_at(&mut buf, offset)
            .map_err(|e| OpenError::Io {
                path: self.path.clone(),
                message: format!("{what} (bytes {offset}..{}): {e}", offset + len),
            })?;
        Ok(buf)
    }
}
