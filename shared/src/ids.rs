//! The ids of the expert boundary: [`LayerId`] (a decoder layer, each of which has one MoE
//! block) and [`ExpertId`] (a routed expert within a layer). Both wrap the `u32` every wire
//! format already uses (protobuf, the shared-memory ring, route traces; the container's index
//! is in (layer, expert) order), so converting at a boundary is free and the encodings stay bit
//! for bit what they were.
//!
//! An id says what a number is, not that it is in range: a value that crosses a process
//! boundary is checked against the container's or the model's dimensions once, where it enters
//! (`expertd`'s call validation, the ring's hint check, `ContainerLayout::blob_index`), with
//! the messages those checks always gave. Table lookups go through [`LayerId::index`] /
//! [`ExpertId::index`] rather than casts.
//!
//! Where the line is drawn: one id (a call's layer, a cache key, a read request, an error's
//! subject, a hint's layer) is typed; a *route*, the `n_rows × top_k` list of expert ids of a
//! call, stays a `&[u32]`. It is the wire encoding itself (copied verbatim into the ring entry
//! or the protobuf message, validated in one pass by `moe_exec::validate_routing`), and the
//! ids that come out of it one at a time (`moe_combine::cells_by_expert`) are typed.

use std::fmt;

/// Defines one id type; both share every method, so they are written once.
macro_rules! boundary_id {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
        #[repr(transparent)]
        #[serde(transparent)]
        pub struct $name(u32);

        impl $name {
            #[doc = concat!("The ", $what, " whose wire encoding is `raw`.")]
            pub const fn new(raw: u32) -> $name {
                $name(raw)
            }

            /// The wire encoding.
            pub const fn get(self) -> u32 {
                self.0
            }

            #[doc = concat!("The ", $what, " as an index into a per-", $what, " table.")]
            pub const fn index(self) -> usize {
                self.0 as usize
            }

            #[doc = concat!("The ", $what, " at position `i` of a per-", $what, " table. Dimensions are capped far")]
            /// below `u32::MAX` (the config and the container allow 2²⁴), so a position of a
            /// validated table always fits; a larger `i` is a bug and panics.
            pub fn from_index(i: usize) -> $name {
                $name(u32::try_from(i).unwrap_or_else(|_| panic!(concat!($what, " index {} does not fit u32"), i)))
            }

            #[doc = concat!("Every ", $what, " of a table of `n` entries, ascending.")]
            pub fn all(n: usize) -> impl DoubleEndedIterator<Item = $name> + ExactSizeIterator {
                (0..n).map($name::from_index)
            }
        }

        /// The bare number, as every message naming one has always printed it.
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }

        impl From<$name> for u32 {
            fn from(id: $name) -> u32 {
                id.0
            }
        }
    };
}

boundary_id! {
    /// A decoder layer, and so its MoE block: the layer of an expert call, a cache key, a
    /// container blob.
    LayerId, "layer"
}

boundary_id! {
    /// A routed expert within its layer (`0..n_experts`).
    ExpertId, "expert"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_print_and_encode_as_their_number() {
        let (l, e) = (LayerId::new(7), ExpertId::from_index(255));
        assert_eq!(format!("layer {l} expert {e}"), "layer 7 expert 255");
        assert_eq!((l.get(), l.index(), u32::from(e)), (7, 7, 255));
        assert_eq!(
            serde_json::to_string(&(l, vec![e])).expect("json"),
            "[7,[255]]"
        );
        assert_eq!(serde_json::from_str::<LayerId>("7").expect("json"), l);
        assert_eq!(
            LayerId::all(3).collect::<Vec<_>>(),
            [0, 1, 2].map(LayerId::new)
        );
        assert!(LayerId::new(2) < LayerId::new(10));
    }

    #[test]
    #[should_panic(expected = "does not fit u32")]
    #[cfg(target_pointer_width = "64")]
    fn positions_past_u32_are_a_bug() {
        let _ = LayerId::from_index(1 << 32);
    }
}
