//! expertd, the sluice expert daemon, as a library. Today: `prepare` converts a BF16
//! checkpoint's routed experts into the INT8 container `experts.sluice` (one expert at a time,
//! resumable) and `verify` checks one; the server that streams experts comes later.
//!
//! The container format itself (layout, header, index, blobs, identity) is
//! `shared::container`; this crate owns the file IO around it and the command line.

pub mod cli;
mod convert;
pub mod prepare;
pub mod stats;
pub mod verify;
