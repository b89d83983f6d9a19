//! The generated services' codec: prost's, plus a scan of each `MoeLayerRequest` before prost
//! decodes it, so that what a request decodes to is bounded by its size on the wire.
//!
//! prost grows a packed `repeated uint32` one element at a time: `n` bytes of one-byte varint
//! ids decode to `4·n` bytes, so a request of ids alone would decode to four times what the
//! server counted for it at its length prefix. The scan walks the message's top-level fields
//! without allocating and refuses one whose `expert_ids` and `weights` differ in count (which
//! validation refuses anyway, after decoding). Each weight is 4 bytes on the wire and each id
//! at least 1, so an accepted request decodes to at most `8/5` of its wire size: the daemon
//! counts a request arriving as its wire bytes plus [`DECODED_PER_WIRE_BYTE`] times that. The
//! decoder then reserves exactly the scanned counts before prost merges into them, so the
//! vectors never grow by doubling past that bound.

use crate::v1::MoeLayerRequest;
use std::any::TypeId;
use std::marker::PhantomData;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::{ProstCodec, ProstDecoder};

/// The most bytes a request the scan accepts decodes to per byte on the wire, rounded up
/// (`8/5`: ids and weights in equal number, 4 bytes decoded for at least 5 on the wire;
/// inline activations 1:1).
pub const DECODED_PER_WIRE_BYTE: u64 = 2;

/// [`ProstCodec`] with the scan (the `codec_path` of the generated code).
pub struct CheckedCodec<T, U>(ProstCodec<T, U>);

impl<T, U> Default for CheckedCodec<T, U> {
    fn default() -> Self {
        CheckedCodec(ProstCodec::default())
    }
}

impl<T, U> Codec for CheckedCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = <ProstCodec<T, U> as Codec>::Encoder;
    type Decoder = CheckedDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        self.0.encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        CheckedDecoder(self.0.decoder(), PhantomData)
    }
}

/// prost's decoder, after [`scan_moe_layer_request`] for `MoeLayerRequest`.
pub struct CheckedDecoder<U>(ProstDecoder<U>, PhantomData<U>);

impl<U: prost::Message + Default + 'static> Decoder for CheckedDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        if TypeId::of::<U>() == TypeId::of::<MoeLayerRequest>() {
            use prost::bytes::Buf;
            // tonic hands the decoder one contiguous buffer holding the whole message.
            if buf.chunk().len() != buf.remaining() {
                return Err(Status::internal(
                    "MoeLayer request: the message is not contiguous in the decode buffer",
                ));
            }
            let counts = scan_moe_layer_request(buf.chunk()).map_err(Status::invalid_argument)?;
            let mut request = MoeLayerRequest::default();
            // Counts bounded by the message's length (at least a byte per id, 4 per weight).
            request.expert_ids.reserve_exact(counts.expert_ids as usize);
            request.weights.reserve_exact(counts.weights as usize);
            prost::Message::merge(&mut request, buf)
                .map_err(|e| Status::internal(format!("MoeLayer request: {e}")))?;
            let any: Box<dyn std::any::Any> = Box::new(request);
            return Ok(any.downcast::<U>().ok().map(|u| *u));
        }
        self.0.decode(buf)
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}

/// What a `MoeLayerRequest` holds, counted from its wire form without decoding it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RequestCounts {
    /// Elements of `expert_ids` (field 7), packed and unpacked occurrences together.
    pub expert_ids: u64,
    /// Elements of `weights` (field 8).
    pub weights: u64,
    /// Bytes of `input_inline_f32_le` (field 9; the last occurrence, as prost keeps).
    pub inline_bytes: u64,
}

/// Counts the repeated fields of an encoded `MoeLayerRequest` and refuses one whose ids and
/// weights differ in number, or that it cannot walk (a truncated field, a group: nothing a
/// proto3 encoder writes), since it could not bound what such a message decodes to.
pub fn scan_moe_layer_request(mut b: &[u8]) -> Result<RequestCounts, String> {
    let malformed = |what: &str| format!("MoeLayer request: {what}; refused before decoding");
    let mut c = RequestCounts::default();
    while !b.is_empty() {
        let key = varint(&mut b).ok_or_else(|| malformed("a field key is truncated"))?;
        let (field, wire) = (key >> 3, key & 7);
        match wire {
            0 => {
                varint(&mut b).ok_or_else(|| malformed("a varint is truncated"))?;
                if field == 7 {
                    c.expert_ids += 1;
                }
            }
            1 | 5 => {
                let n = if wire == 1 { 8 } else { 4 };
                b = b
                    .get(n..)
                    .ok_or_else(|| malformed("a fixed-width field is truncated"))?;
                if field == 8 && wire == 5 {
                    c.weights += 1;
                }
            }
            2 => {
                let len = varint(&mut b).ok_or_else(|| malformed("a length is truncated"))?;
                let payload = usize::try_from(len)
                    .ok()
                    .and_then(|l| b.get(..l))
                    .ok_or_else(|| malformed("a field runs past the message"))?;
                match field {
                    // A packed varint field: one element per byte without the continuation bit.
                    7 => c.expert_ids += payload.iter().filter(|&&x| x < 0x80).count() as u64,
                    8 => c.weights += payload.len() as u64 / 4,
                    9 => c.inline_bytes = payload.len() as u64,
                    _ => {}
                }
                b = &b[payload.len()..];
            }
            _ => return Err(malformed(&format!("field {field} has wire type {wire}"))),
        }
    }
    if c.expert_ids != c.weights {
        return Err(format!(
            "MoeLayer request carries {} expert_ids and {} weights: they must be equal in number \
             (n_tokens × top_k each); refused before decoding",
            c.expert_ids, c.weights
        ));
    }
    Ok(c)
}

/// A protobuf varint from the front of `b`, or `None` when `b` ends first or it runs past 10
/// bytes.
fn varint(b: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for i in 0..10 {
        let byte = *b.get(i)?;
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte < 0x80 {
            *b = &b[i + 1..];
            return Some(v);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::moe_layer_request::Input;
    use prost::Message;

    fn request(ids: Vec<u32>, weights: Vec<f32>, inline: usize) -> Vec<u8> {
        MoeLayerRequest {
            session_id: 7,
            n_tokens: 1,
            top_k: ids.len() as u32,
            expert_ids: ids,
            weights,
            input: Some(Input::InputInlineF32Le(vec![1; inline])),
            ..MoeLayerRequest::default()
        }
        .encode_to_vec()
    }

    #[test]
    fn the_scan_counts_what_prost_decodes() {
        for (ids, inline) in [
            (vec![0u32, 127, 128, 300, u32::MAX], 64),
            (vec![], 0),
            (vec![5], 3),
        ] {
            let w = vec![0.5; ids.len()];
            let bytes = request(ids.clone(), w, inline);
            let c = scan_moe_layer_request(&bytes).expect("equal counts");
            assert_eq!(c.expert_ids, ids.len() as u64);
            assert_eq!(c.weights, ids.len() as u64);
            assert_eq!(c.inline_bytes, inline as u64);
            let decoded = 4 * (c.expert_ids + c.weights) + c.inline_bytes;
            assert!(decoded <= DECODED_PER_WIRE_BYTE * bytes.len() as u64);
        }
    }

    #[test]
    fn ids_without_weights_are_refused_before_decoding() {
        // 1 MiB of one-byte ids: 4 MiB decoded, were it decoded.
        let bytes = request(vec![0; 1 << 20], vec![], 0);
        let e = scan_moe_layer_request(&bytes).expect_err("unequal counts");
        assert!(e.contains("1048576 expert_ids and 0 weights"), "{e}");
        // Unpacked ids count too.
        let mut unpacked = Vec::new();
        for _ in 0..3 {
            unpacked.extend_from_slice(&[7 << 3, 1]);
        }
        let e = scan_moe_layer_request(&unpacked).expect_err("3 ids, 0 weights");
        assert!(e.contains("3 expert_ids and 0 weights"), "{e}");
        let decoded = MoeLayerRequest::decode(unpacked.as_slice()).expect("valid protobuf");
        assert_eq!(decoded.expert_ids.len(), 3);
    }

    /// Mutated encodings: whenever prost decodes one, the scan either counts exactly what
    /// prost decoded, or refuses it because those counts differ.
    #[test]
    fn the_scan_agrees_with_prost_on_mutated_messages() {
        let base = request(vec![1, 200, 3, 70_000], vec![0.5, 0.5, 0.25, 0.75], 24);
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut agreed, mut refused) = (0, 0);
        for _ in 0..200_000 {
            let mut m = base.clone();
            for _ in 0..1 + next() % 3 {
                let at = (next() % m.len() as u64) as usize;
                match next() % 3 {
                    0 => m[at] = next() as u8,
                    1 => m.truncate(at),
                    _ => m.insert(at, next() as u8),
                }
                if m.is_empty() {
                    break;
                }
            }
            let Ok(decoded) = MoeLayerRequest::decode(m.as_slice()) else {
                continue;
            };
            let (ids, weights) = (
                decoded.expert_ids.len() as u64,
                decoded.weights.len() as u64,
            );
            match scan_moe_layer_request(&m) {
                Ok(c) => {
                    assert_eq!((c.expert_ids, c.weights), (ids, weights), "{m:?}");
                    agreed += 1;
                }
                Err(e) => {
                    assert!(ids != weights || e.contains("wire type"), "{e}: {m:?}");
                    refused += 1;
                }
            }
        }
        assert!(
            agreed > 1000 && refused > 100,
            "{agreed} agreed, {refused} refused"
        );
    }
}
