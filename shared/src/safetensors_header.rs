//! Parses one safetensors shard header from its first bytes and the file length, without the
//! payload: the 8-byte little-endian header length, the JSON header (via the `safetensors`
//! crate's `Metadata`, which checks that tensors tile the data section contiguously and that
//! each byte length matches dtype × shape), then the bounds against the real file length.
//!
//! Pure: the caller reads the bytes (see `checkpoint`).

use safetensors::Dtype;
use safetensors::tensor::Metadata;

/// Bytes of the little-endian u64 that opens every safetensors file.
pub const LEN_PREFIX_BYTES: u64 = 8;
/// Largest JSON header accepted (the `safetensors` crate's own limit is 100 MB).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// One tensor's place in a shard, in absolute file offsets.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorLocation {
    /// Element type.
    pub dtype: Dtype,
    /// Shape in row-major order.
    pub shape: Vec<usize>,
    /// Absolute byte offset of the first element in the shard file.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

/// Why a shard header cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HeaderError {
    /// The file ends before the header does.
    #[error("truncated: file is {file_len} bytes but its header needs {needed}")]
    Truncated {
        /// Actual file length.
        file_len: u64,
        /// Bytes the length prefix and header require.
        needed: u64,
    },
    /// The length prefix is implausibly large.
    #[error(
        "header length {len} exceeds the {MAX_HEADER_BYTES}-byte limit (corrupt length prefix?)"
    )]
    TooLarge {
        /// The length read from the prefix.
        len: u64,
    },
    /// The JSON header is malformed or internally inconsistent.
    #[error("corrupt header: {0}")]
    Corrupt(String),
    /// A tensor's data lies beyond the end of the file.
    #[error(
        "tensor {tensor} spans bytes {start}..{end} but the file is {file_len} bytes (truncated payload or bad offsets)"
    )]
    OutOfBounds {
        /// The tensor whose range does not fit.
        tensor: String,
        /// Absolute start offset.
        start: u64,
        /// Absolute end offset.
        end: u64,
        /// Actual file length.
        file_len: u64,
    },
    /// The data section is followed by bytes no tensor owns.
    #[error(
        "{extra} unexplained bytes after the last tensor (file {file_len} bytes, data ends at {data_end})"
    )]
    TrailingBytes {
        /// Bytes past the data section.
        extra: u64,
        /// Where the data section ends.
        data_end: u64,
        /// Actual file length.
        file_len: u64,
    },
}

/// Reads the header length from the first 8 bytes and returns how many header bytes follow.
pub fn header_len(prefix: &[u8], file_len: u64) -> Result<u64, HeaderError> {
    let bytes: [u8; 8] =
        prefix
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .ok_or(HeaderError::Truncated {
                file_len,
                needed: LEN_PREFIX_BYTES,
            })?;
    let len = u64::from_le_bytes(bytes);
    if len > MAX_HEADER_BYTES {
        return Err(HeaderError::TooLarge { len });
    }
    let needed = LEN_PREFIX_BYTES + len;
    if needed > file_len {
        return Err(HeaderError::Truncated { file_len, needed });
    }
    Ok(len)
}

/// Parses the JSON header (the `header_len` bytes after the prefix) of a file of `file_len`
/// bytes into absolute tensor locations, sorted by offset.
pub fn parse_header(
    json: &[u8],
    file_len: u64,
) -> Result<Vec<(String, TensorLocation)>, HeaderError> {
    let data_start = LEN_PREFIX_BYTES + json.len() as u64;
    let text =
        std::str::from_utf8(json).map_err(|e| HeaderError::Corrupt(format!("not UTF-8: {e}")))?;
    let meta: Metadata =
        serde_json::from_str(text).map_err(|e| HeaderError::Corrupt(e.to_string()))?;
    let mut out: Vec<(String, TensorLocation)> = meta
        .tensors()
        .into_iter()
        .map(|(name, info)| {
            let (s, e) = info.data_offsets;
            let loc = TensorLocation {
                dtype: info.dtype,
                shape: info.shape.clone(),
                offset: data_start + s as u64,
                len: (e - s) as u64,
            };
            (name, loc)
        })
        .collect();
    out.sort_by_key(|(_, loc)| loc.offset);
    for (name, loc) in &out {
        let end = loc.offset + loc.len;
        if end > file_len {
            return Err(HeaderError::OutOfBounds {
                tensor: name.clone(),
                start: loc.offset,
                end,
                file_len,
            });
        }
    }
    let data_end = data_start + meta.data_len() as u64;
    if data_end > file_len {
        return Err(HeaderError::OutOfBounds {
            tensor: "(data section)".into(),
            start: data_start,
            end: data_end,
            file_len,
        });
    }
    if data_end < file_len {
        return Err(HeaderError::TrailingBytes {
            extra: file_len - data_end,
            data_end,
            file_len,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(header: &str, payload: usize) -> Vec<u8> {
        let mut v = (header.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(header.as_bytes());
        v.resize(v.len() + payload, 0);
        v
    }

    fn parse(bytes: &[u8]) -> Result<Vec<(String, TensorLocation)>, HeaderError> {
        let n = header_len(bytes, bytes.len() as u64)?;
        parse_header(&bytes[8..8 + n as usize], bytes.len() as u64)
    }

    const TWO: &str = r#"{"b":{"dtype":"BF16","shape":[2,3],"data_offsets":[8,20]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;

    #[test]
    fn absolute_offsets_sorted() {
        let got = parse(&file(TWO, 20)).expect("valid");
        let base = 8 + TWO.len() as u64;
        assert_eq!(got[0].0, "a");
        assert_eq!(
            got[0].1,
            TensorLocation {
                dtype: Dtype::F32,
                shape: vec![2],
                offset: base,
                len: 8
            }
        );
        assert_eq!(
            got[1].1,
            TensorLocation {
                dtype: Dtype::BF16,
                shape: vec![2, 3],
                offset: base + 8,
                len: 12
            }
        );
    }

    #[test]
    fn truncated_prefix_and_header() {
        assert_eq!(
            header_len(&[1, 2, 3], 3),
            Err(HeaderError::Truncated {
                file_len: 3,
                needed: 8
            })
        );
        let f = file(TWO, 20);
        assert_eq!(
            header_len(&f, 40),
            Err(HeaderError::Truncated {
                file_len: 40,
                needed: 8 + TWO.len() as u64
            })
        );
    }

    #[test]
    fn absurd_length_prefix() {
        let f = u64::MAX.to_le_bytes();
        assert_eq!(
            header_len(&f, 1 << 40),
            Err(HeaderError::TooLarge { len: u64::MAX })
        );
    }

    #[test]
    fn corrupt_json_and_inconsistent_offsets() {
        assert!(matches!(
            parse(&file("{not json", 0)),
            Err(HeaderError::Corrupt(_))
        ));
        // Length in the header disagrees with dtype × shape.
        let bad = r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#;
        assert!(matches!(parse(&file(bad, 8)), Err(HeaderError::Corrupt(_))));
        // A gap between tensors.
        let gap = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}"#;
        assert!(matches!(
            parse(&file(gap, 12)),
            Err(HeaderError::Corrupt(_))
        ));
    }

    #[test]
    fn payload_shorter_than_offsets() {
        let f = file(TWO, 19);
        match parse(&f) {
            Err(HeaderError::OutOfBounds {
                tensor,
                end,
                file_len,
                ..
            }) => {
                assert_eq!(tensor, "b");
                assert_eq!(end, file_len + 1);
            }
            other => panic!("expected OutOfBounds, got {other:?}"),
        }
    }

    #[test]
    fn trailing_bytes() {
        assert!(matches!(
            parse(&file(TWO, 21)),
            Err(HeaderError::TrailingBytes { extra: 1, .. })
        ));
    }
}
