//! The container's checksum: xxh3-64 with seed 0 over a byte slice, for the header, the index
//! and every blob. Corruption detection, not authentication: the model identity uses SHA-256
//! (see `identity`).

/// xxh3-64 (seed 0) of `bytes`, the checksum of every checksummed region of the container.
pub fn checksum(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// Reads a little-endian u64 at `offset` of `bytes`; the caller has checked the bounds.
pub(crate) fn le_u64(bytes: &[u8], offset: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[offset..offset + 8]);
    u64::from_le_bytes(b)
}

/// Reads a little-endian u32 at `offset` of `bytes`; the caller has checked the bounds.
pub(crate) fn le_u32(bytes: &[u8], offset: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&bytes[offset..offset + 4]);
    u32::from_le_bytes(b)
}
