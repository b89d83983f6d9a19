//! The expertd wire contract: the code generated from `expertd/v1/expert.proto` (client and
//! server, module [`v1`]), the protocol version history ([`version`]) and the conversions
//! between wire messages and `shared` types ([`convert`]).
//!
//! Only this crate names generated types' construction details; expertd and hostd convert at
//! their boundary with [`convert`]. Nothing here does IO.

pub mod codec;
pub mod convert;

/// Generated from `expertd/v1/expert.proto` (package `expertd.v1`).
#[allow(
    clippy::all,
    clippy::pedantic,
    missing_docs,
    unreachable_pub,
    unused_qualifications,
    rustdoc::all
)]
pub mod v1 {
    tonic::include_proto!("expertd.v1");
}

/// Protocol versions, each named after the feature it added. The handshake carries one; the
/// daemon accepts clients in `OLDEST_SUPPORTED..=CURRENT` and names both values otherwise.
pub mod version {
    /// Handshake, sessions, `MoeLayer` with inline activations, `Stats`.
    pub const MOE_LAYER_INLINE: u32 = 1;
    /// Activations and outputs in a memfd segment passed with SCM_RIGHTS over the unix socket.
    pub const SHM_SEGMENTS: u32 = 2;
    /// MoE calls through a shared-memory ring in the segment (`shared::ring`), announced in the
    /// segment header and confirmed by `HandshakeResponse.ring_entries`.
    pub const CALL_RING: u32 = 3;
    /// The version this build speaks.
    pub const CURRENT: u32 = CALL_RING;
    /// The oldest client version the daemon accepts. Version 1 never shipped on its own.
    pub const OLDEST_SUPPORTED: u32 = SHM_SEGMENTS;
    /// The oldest daemon version a client accepts (a version-2 daemon serves `MoeLayer` only).
    pub const OLDEST_DAEMON: u32 = SHM_SEGMENTS;
}

/// Largest gRPC message either side sends or accepts (inline activations of a big prefill
/// block over TCP): the daemon announces it in the handshake and both sides configure tonic's
/// codec limits with it.
pub const MAX_MESSAGE_BYTES: usize = 512 << 20;

/// The gRPC metadata key that carries a TCP client's bearer token.
pub const AUTHORIZATION_HEADER: &str = "authorization";
