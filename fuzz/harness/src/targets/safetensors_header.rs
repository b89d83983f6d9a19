//! `shared::safetensors_header`: the input is a whole shard file (8-byte length prefix, JSON
//! header, payload). Contract for an accepted header (ARCHITECTURE.md): every returned range
//! lies inside the file, the ranges tile the data section contiguously from its start to the
//! end of the file, and each byte length equals dtype × shape.

use crate::{Outcome, class};
use shared::safetensors_header::{LEN_PREFIX_BYTES, header_len, parse_header};

/// Parses `data` as a shard file of `data.len()` bytes and checks what it returns.
pub fn run(data: &[u8]) -> Outcome {
    let file_len = data.len() as u64;
    let n = match header_len(data, file_len) {
        Ok(n) => n,
        Err(e) => return class("len", &e),
    };
    // `header_len` promised that the header lies inside the file.
    assert!(
        LEN_PREFIX_BYTES + n <= file_len,
        "header_len {n} past a {file_len}-byte file"
    );
    let json = &data[LEN_PREFIX_BYTES as usize..(LEN_PREFIX_BYTES + n) as usize];
    let tensors = match parse_header(json, file_len) {
        Ok(t) => t,
        Err(e) => return class("parse", &e),
    };
    let mut cursor = LEN_PREFIX_BYTES + n;
    for (name, loc) in &tensors {
        assert_eq!(
            loc.offset, cursor,
            "tensor {name} does not start where the previous one ended"
        );
        let elements = loc
            .shape
            .iter()
            .try_fold(1u128, |acc, &d| acc.checked_mul(d as u128));
        let bits = elements.and_then(|e| e.checked_mul(loc.dtype.bitsize() as u128));
        assert_eq!(
            bits,
            Some(u128::from(loc.len) * 8),
            "tensor {name}: {} bytes for {:?} {:?}",
            loc.len,
            loc.dtype,
            loc.shape
        );
        cursor = cursor
            .checked_add(loc.len)
            .unwrap_or_else(|| panic!("tensor {name} ends past u64"));
        assert!(
            cursor <= file_len,
            "tensor {name} ends at {cursor}, past the {file_len}-byte file"
        );
    }
    assert_eq!(cursor, file_len, "the tensors leave bytes unexplained");
    format!("ok:{}", tensors.len().min(4))
}
