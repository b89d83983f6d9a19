//! The expertd contract as either side decodes it (`proto`): protobuf bytes → the generated
//! message (prost) → the domain conversions in `proto::convert` and the checks the daemon and
//! the client apply next (`validate_routing`, `ShmSlice::range_in`, `BlobLayout::new` on the
//! dimensions a daemon announces).
//!
//! Contract: no panic and no allocation beyond the input's size; a decoded message re-encodes
//! and decodes to itself; an accepted identity or slice converts back to the same wire value;
//! accepted f32 bytes round-trip bit for bit; a call that passes the routing checks names only
//! valid experts with finite weights.

use crate::bytes::Input;
use crate::{Outcome, class};
use prost::Message;
use proto::convert::{self, f32s_to_le_bytes, le_bytes_into_f32s, le_bytes_to_f32s};
use proto::v1;
use shared::container::{BlobLayout, ExpertFormat, ModelIdentity};
use shared::moe_exec::validate_routing;

/// Picks the message from the first byte; the rest is its protobuf encoding.
pub fn run(data: &[u8]) -> Outcome {
    let mut input = Input::new(data);
    let which = input.u8();
    let bytes = input.rest();
    match which % 6 {
        0 => decode::<v1::HandshakeRequest>(bytes, "handshake", |r| {
            identity(r.model_identity.as_ref())
        }),
        1 => decode::<v1::MoeLayerRequest>(bytes, "moe", moe_request),
        2 => decode::<v1::HandshakeResponse>(bytes, "handshake-reply", handshake_response),
        3 => decode::<v1::MoeLayerResponse>(bytes, "moe-reply", moe_response),
        4 => decode::<v1::StatsResponse>(bytes, "stats", |_| "ok".into()),
        _ => decode::<v1::ShmSlice>(bytes, "slice", |s| slice("slice", s)),
    }
}

fn decode<M: Message + Default>(
    bytes: &[u8],
    what: &str,
    then: impl FnOnce(&M) -> Outcome,
) -> Outcome {
    let m = match M::decode(bytes) {
        Ok(m) => m,
        Err(e) => return class(what, &e.to_string().split(':').next().unwrap_or_default()),
    };
    // Compared as bytes: a float field may hold a NaN, which is not equal to itself.
    let canonical = m.encode_to_vec();
    let again = M::decode(canonical.as_slice()).expect("a re-encoded message decodes");
    assert_eq!(
        again.encode_to_vec(),
        canonical,
        "{what}: decode(encode(m)) is not m"
    );
    format!("{what}:{}", then(&m))
}

fn identity(id: Option<&v1::ModelIdentity>) -> Outcome {
    let Some(id) = id else {
        return "no-identity".into();
    };
    match ModelIdentity::try_from(id) {
        Ok(ours) => {
            assert_eq!(
                &v1::ModelIdentity::from(&ours),
                id,
                "identity does not convert back"
            );
            "ok-identity".into()
        }
        Err(e) => class("identity", &e),
    }
}

fn slice(field: &'static str, s: &v1::ShmSlice) -> Outcome {
    match convert::shm_slice(field, s) {
        Ok(ours) => {
            assert_eq!(&v1::ShmSlice::from(ours), s, "slice does not convert back");
            // Against a segment of the size the slice's own id suggests (bounded).
            let segment_bytes = s.segment_id % (1 << 20);
            match ours.range_in(segment_bytes) {
                Ok(r) => {
                    assert!(r.end as u64 <= segment_bytes && r.len() as u64 == s.length_bytes);
                    "ok-slice".into()
                }
                Err(e) => class("range", &e),
            }
        }
        Err(e) => class("slice", &e),
    }
}

fn f32_bytes(field: &'static str, bytes: &[u8]) -> Outcome {
    let mut v = Vec::new();
    match le_bytes_to_f32s(field, bytes, &mut v) {
        Ok(()) => {
            assert_eq!(f32s_to_le_bytes(&v), bytes, "f32 bytes do not round-trip");
            let mut exact = vec![0f32; v.len()];
            le_bytes_into_f32s(field, bytes, &mut exact).expect("same length");
            assert!(
                exact
                    .iter()
                    .zip(&v)
                    .all(|(a, b)| a.to_bits() == b.to_bits())
            );
            "ok-f32".into()
        }
        Err(e) => {
            assert!(le_bytes_into_f32s(field, bytes, &mut vec![0f32; bytes.len() / 4]).is_err());
            class("f32", &e)
        }
    }
}

fn moe_request(r: &v1::MoeLayerRequest) -> Outcome {
    // A container of 16 experts per layer, as the daemon's call executor would check against.
    let routing = match validate_routing(
        r.n_tokens as usize,
        r.top_k as usize,
        &r.expert_ids,
        &r.weights,
        16,
    ) {
        Ok(()) => {
            assert_eq!(r.expert_ids.len(), r.n_tokens as usize * r.top_k as usize);
            assert!(
                r.expert_ids.iter().all(|&e| e < 16) && r.weights.iter().all(|w| w.is_finite())
            );
            "ok-routing".to_string()
        }
        Err(_) => "bad-routing".to_string(),
    };
    let input = match &r.input {
        Some(v1::moe_layer_request::Input::InputInlineF32Le(b)) => {
            f32_bytes("input_inline_f32_le", b)
        }
        Some(v1::moe_layer_request::Input::InputShm(s)) => slice("input_shm", s),
        None => "no-input".into(),
    };
    let output = r
        .output_shm
        .as_ref()
        .map_or("inline".into(), |s| slice("output_shm", s));
    format!("{routing}/{input}/{output}")
}

fn handshake_response(r: &v1::HandshakeResponse) -> Outcome {
    let id = identity(r.container_identity.as_ref());
    let dims = r.dims.clone().unwrap_or_default();
    let Some(format) = ExpertFormat::from_wire(&dims.expert_format) else {
        return format!("{id}/unknown-format");
    };
    let layout = match BlobLayout::with_format(
        dims.hidden_size as usize,
        dims.expert_inner_size as usize,
        format,
    ) {
        Ok(l) => {
            assert!(
                l.content_bytes <= l.stride
                    && l.stride as u64 <= shared::container::layout::MAX_BLOB_BYTES
            );
            "ok-dims".to_string()
        }
        Err(e) => class("dims", &e),
    };
    format!("{id}/{layout}")
}

fn moe_response(r: &v1::MoeLayerResponse) -> Outcome {
    match &r.output {
        Some(v1::moe_layer_response::Output::OutputInlineF32Le(b)) => {
            f32_bytes("output_inline_f32_le", b)
        }
        Some(v1::moe_layer_response::Output::OutputShm(s)) => slice("output_shm", s),
        None => "no-output".into(),
    }
}
