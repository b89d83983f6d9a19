//! Conversions between wire messages and `shared` types: model identities, shared-memory
//! slices, f32 activations as little-endian bytes, a call's cost in its response, and the
//! status metadata by which the daemon signs its answers and names a failed expert (wire
//! integers ↔ `LayerId`/`ExpertId`). `TryFrom` where the wire value can be malformed (a digest
//! of the wrong length, a slice of the wrong dtype); each failure names the field.
//!
//! No IO and no policy: whether a value is acceptable for a call (lengths against the model,
//! slices against a segment) is decided by the daemon.

use crate::v1;
use shared::call_cost::CallCost;
use shared::container::ModelIdentity;
use shared::ids::{ExpertId, LayerId};
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
    bytes.try_into().map_err(|_| ConvertError::DigestLength {
        field,
        found: bytes.len(),
    })
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

/// The `MoeLayer` response carrying `output` and the call's `cost` (its time queued included).
pub fn moe_layer_response(
    output: v1::moe_layer_response::Output,
    cost: &CallCost,
) -> v1::MoeLayerResponse {
    let CallCost {
        queue_ns,
        io_wait_ns,
        compute_ns,
        hits,
        misses,
        bytes_read,
        prefetched_hits,
    } = *cost;
    v1::MoeLayerResponse {
        output: Some(output),
        queue_ns,
        io_wait_ns,
        compute_ns,
        hits,
        misses,
        bytes_read,
        prefetched_hits,
    }
}

/// The cost a `MoeLayer` response reports.
impl From<&v1::MoeLayerResponse> for CallCost {
    fn from(r: &v1::MoeLayerResponse) -> CallCost {
        let v1::MoeLayerResponse {
            queue_ns,
            io_wait_ns,
            compute_ns,
            hits,
            misses,
            bytes_read,
            prefetched_hits,
            output: _,
        } = *r;
        CallCost {
            queue_ns,
            io_wait_ns,
            compute_ns,
            hits,
            misses,
            bytes_read,
            prefetched_hits,
        }
    }
}

/// Metadata key set on every status the daemon sends, so a client can tell the daemon's
/// refusals from transport failures (which carry no such key).
pub const ORIGIN_METADATA: &str = "expertd-origin";
/// Metadata key naming the layer of a failed expert read.
pub const LAYER_METADATA: &str = "expertd-layer";
/// Metadata key naming the expert of a failed expert read.
pub const EXPERT_METADATA: &str = "expertd-expert";

/// Marks `status` as the daemon's own answer, naming the expert whose read failed, if any.
pub fn mark_daemon_status(status: &mut tonic::Status, expert: Option<(LayerId, ExpertId)>) {
    let meta = status.metadata_mut();
    meta.insert(
        ORIGIN_METADATA,
        tonic::metadata::MetadataValue::from_static("expertd"),
    );
    if let Some((layer, expert)) = expert {
        meta.insert(
            LAYER_METADATA,
            tonic::metadata::MetadataValue::from(layer.get()),
        );
        meta.insert(
            EXPERT_METADATA,
            tonic::metadata::MetadataValue::from(expert.get()),
        );
    }
}

/// Whether the daemon sent `status` (see [`mark_daemon_status`]).
pub fn is_daemon_status(status: &tonic::Status) -> bool {
    status.metadata().get(ORIGIN_METADATA).is_some()
}

/// The expert a status names as the one whose read failed: both keys present, each a `u32`.
pub fn failed_expert(status: &tonic::Status) -> Option<(LayerId, ExpertId)> {
    let id = |key: &str| {
        status
            .metadata()
            .get(key)?
            .to_str()
            .ok()?
            .parse::<u32>()
            .ok()
    };
    Some((
        LayerId::new(id(LAYER_METADATA)?),
        ExpertId::new(id(EXPERT_METADATA)?),
    ))
}

/// Converts a wire slice named `field`; only f32 slices exist today.
pub fn shm_slice(field: &'static str, s: &v1::ShmSlice) -> Result<ShmSlice, ConvertError> {
    if s.dtype != v1::Dtype::F32 as i32 {
        return Err(ConvertError::Dtype {
            field,
            found: s.dtype,
        });
    }
    Ok(ShmSlice {
        segment_id: s.segment_id,
        offset_bytes: s.offset_bytes,
        length_bytes: s.length_bytes,
    })
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
pub fn le_bytes_to_f32s(
    field: &'static str,
    bytes: &[u8],
    out: &mut Vec<f32>,
) -> Result<(), ConvertError> {
    if !bytes.len().is_multiple_of(4) {
        return Err(ConvertError::F32Bytes {
            field,
            found: bytes.len(),
        });
    }
    out.clear();
    out.extend(
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
    );
    Ok(())
}

/// Decodes little-endian f32 bytes into a slice of exactly `bytes.len() / 4` values.
pub fn le_bytes_into_f32s(
    field: &'static str,
    bytes: &[u8],
    out: &mut [f32],
) -> Result<(), ConvertError> {
    if bytes.len() != out.len() * 4 {
        return Err(ConvertError::F32Bytes {
            field,
            found: bytes.len(),
        });
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
        let values = [
            0.0f32,
            -0.0,
            1.5,
            f32::MIN_POSITIVE / 2.0,
            f32::from_bits(0x7fc0_1234),
        ];
        let bytes = f32s_to_le_bytes(&values);
        let mut back = Vec::new();
        le_bytes_to_f32s("x", &bytes, &mut back).expect("decodes");
        assert_eq!(
            values.map(f32::to_bits).to_vec(),
            back.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        assert!(le_bytes_to_f32s("x", &bytes[1..], &mut back).is_err());
    }

    #[test]
    fn a_call_cost_round_trips_through_its_response() {
        let cost = CallCost {
            queue_ns: 1,
            io_wait_ns: 2,
            compute_ns: 3,
            hits: 4,
            misses: 5,
            bytes_read: 6,
            prefetched_hits: 7,
        };
        let resp = moe_layer_response(
            v1::moe_layer_response::Output::OutputInlineF32Le(vec![0; 4]),
            &cost,
        );
        assert_eq!(CallCost::from(&resp), cost);
        assert!(resp.output.is_some());
    }

    #[test]
    fn a_status_names_its_origin_and_failed_expert() {
        let mut s = tonic::Status::data_loss("layer 1 expert 2: checksum mismatch");
        assert!(!is_daemon_status(&s) && failed_expert(&s).is_none());
        mark_daemon_status(&mut s, Some((LayerId::new(1), ExpertId::new(2))));
        assert!(is_daemon_status(&s));
        assert_eq!(failed_expert(&s), Some((LayerId::new(1), ExpertId::new(2))));
        assert_eq!(
            s.metadata()
                .get(LAYER_METADATA)
                .and_then(|v| v.to_str().ok()),
            Some("1"),
            "the wire value is the bare number"
        );
        s.metadata_mut()
            .insert(EXPERT_METADATA, "4294967296".parse().expect("ascii"));
        assert_eq!(failed_expert(&s), None, "a value past u32 names no expert");
    }

    #[test]
    fn identity_digests_must_be_32_bytes() {
        let id = ModelIdentity {
            config_sha256: [1; 32],
            expert_tensors_sha256: [2; 32],
            expert_sample_sha256: [3; 32],
        };
        let wire = v1::ModelIdentity::from(&id);
        assert_eq!(ModelIdentity::try_from(&wire), Ok(id));
        let short = v1::ModelIdentity {
            config_sha256: vec![1; 31],
            ..wire
        };
        assert_eq!(
            ModelIdentity::try_from(&short),
            Err(ConvertError::DigestLength {
                field: "config_sha256",
                found: 31
            })
        );
    }
}
