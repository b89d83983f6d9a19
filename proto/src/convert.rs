//! Conversions between wire messages and `shared` types: model identities, shared-memory
//! slices, a call's cost, and f32 activations as little-endian bytes. `TryFrom` where the wire value can be
//! malformed (a digest of the wrong length, a slice of the wrong dtype); each failure names
//! the field.
//!
//! No IO and no policy: whether a value is acceptable for a call (lengths against the model,
//! slices against a segment) is decided by the daemon.

use crate::v1;
use shared::container::ModelIdentity;
use shared::ring::CallCost;
use shared::shm_layout::ShmSlice;

/// A wire message that does not convert; names the field and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConvertError {
    /// A SHA-256 digest field that is not 32 bytes.
    #[error("{field} must be 32 bytes, got {found}")]
    DigestLength {
        /// The field.
        field: &'static str,
        /// Bytes found.
        found: usize,
    },
    /// A slice whose element type is not f32.
    #[error("{field}: dtype {found} is not DTYPE_F32")]
    Dtype {
        /// The field.
        field: &'static str,
        /// The raw enum value found.
        found: i32,
    },
    /// Inline f32 bytes whose length is not a multiple of 4.
    #[error("{field}: {found} bytes is not a whole number of f32 values")]
    F32Bytes {
        /// The field.
        field: &'static str,
        /// Bytes found.
        found: usize,
    },
}

fn digest(field: &'static str, bytes: &[u8]) -> Result<[u8; 32], ConvertError> {
    bytes.try_into().map_err(|_| ConvertError::DigestLength { field, found: bytes.len() })
}

impl From<&ModelIdentity> for v1::ModelIdentity {
    fn from(id: &ModelIdentity) -> v1::ModelIdentity {
        v1::ModelIdentity {
            config_sha256: id.config_sha256.to_vec(),
            expert_tensors_sha256: id.expert_tensors_sha256.to_vec(),
            expert_sample_sha256: id.expert_sample_sha256.to_vec(),
        }
    }
}

impl TryFrom<&v1::ModelIdentity> for ModelIdentity {
    type Error = ConvertError;

    fn try_from(id: &v1::ModelIdentity) -> Result<ModelIdentity, ConvertError> {
        Ok(ModelIdentity {
            config_sha256: digest("config_sha256", &id.config_sha256)?,
            expert_tensors_sha256: digest("expert_tensors_sha256", &id.expert_tensors_sha256)?,
            expert_sample_sha256: digest("expert_sample_sha256", &id.expert_sample_sha256)?,
        })
    }
}

impl From<ShmSlice> for v1::ShmSlice {
    fn from(s: ShmSlice) -> v1::ShmSlice {
        v1::ShmSlice {
            segment_id: s.segment_id,
            offset_bytes: s.offset_bytes,
            length_bytes: s.length_bytes,
            dtype: v1::Dtype::F32 as i32,
        }
    }
}

/// Converts a wire slice named `field`; only f32 slices exist today.
pub fn shm_slice(field: &'static str, s: &v1::ShmSlice) -> Result<ShmSlice, ConvertError> {
    if s.dtype != v1::Dtype::F32 as i32 {
        return Err(ConvertError::Dtype { field, found: s.dtype });
    }
    Ok(ShmSlice { segment_id: s.segment_id, offset_bytes: s.offset_bytes, length_bytes: s.length_bytes })
}

/// The cost fields of a `MoeLayer` response.
pub fn call_cost(r: &v1::MoeLayerResponse) -> CallCost {
    let v1::MoeLayerResponse { output: _, queue_ns, io_wait_ns, compute_ns, hits, misses, bytes_read, prefetched_hits } = *r;
    CallCost { queue_ns, io_wait_ns, compute_ns, bytes_read, hits, misses, prefetched_hits }
}

/// A `MoeLayer` response: the output and the call's cost.
pub fn moe_layer_response(output: v1::moe_layer_response::Output, cost: &CallCost) -> v1::MoeLayerResponse {
    let CallCost { queue_ns, io_wait_ns, compute_ns, bytes_read, hits, misses, prefetched_hits } = *cost;
    v1::MoeLayerResponse { output: Some(output), queue_ns, io_wait_ns, compute_ns, hits, misses, bytes_read, prefetched_hits }
}

/// `values` as little-endian bytes (the inline transport's encoding).
pub fn f32s_to_le_bytes(values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * 4);
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

/// Decodes little-endian f32 bytes into `out` (cleared first); every bit pattern, NaN payloads
/// and signed zeros included, survives the round trip.
pub fn le_bytes_to_f32s(field: &'static str, bytes: &[u8], out: &mut Vec<f32>) -> Result<(), ConvertError> {
    if !bytes.len().is_multiple_of(4) {
        return Err(ConvertError::F32Bytes { field, found: bytes.len() });
    }
    out.clear();
    out.extend(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])));
    Ok(())
}

/// Decodes little-endian f32 bytes into a slice of exactly `bytes.len() / 4` values.
pub fn le_bytes_into_f32s(field: &'static str, bytes: &[u8], out: &mut [f32]) -> Result<(), ConvertError> {
    if bytes.len() != out.len() * 4 {
        return Err(ConvertError::F32Bytes { field, found: bytes.len() });
    }
    for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_bytes_round_trip_bit_for_bit() {
        let values = [0.0f32, -0.0, 1.5, f32::MIN_POSITIVE / 2.0, f32::from_bits(0x7fc0_1234)];
        let bytes = f32s_to_le_bytes(&values);
        let mut back = Vec::new();
        le_bytes_to_f32s("x", &bytes, &mut back).expect("decodes");
        assert_eq!(values.map(f32::to_bits).to_vec(), back.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
        assert!(le_bytes_to_f32s("x", &bytes[1..], &mut back).is_err());
    }

    #[test]
    fn identity_digests_must_be_32_bytes() {
        let id = ModelIdentity { config_sha256: [1; 32], expert_tensors_sha256: [2; 32], expert_sample_sha256: [3; 32] };
        let wire = v1::ModelIdentity::from(&id);
        assert_eq!(ModelIdentity::try_from(&wire), Ok(id));
        let short = v1::ModelIdentity { config_sha256: vec![1; 31], ..wire };
        assert_eq!(ModelIdentity::try_from(&short), Err(ConvertError::DigestLength { field: "config_sha256", found: 31 }));
    }
}
