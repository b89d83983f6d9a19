//! expertd, the sluice expert daemon, as a library. Today: `prepare` converts a BF16
//! checkpoint's routed experts into the INT8 container `experts.sluice` (one expert at a time,
//! resumable), `verify` checks one, and `serve` ([`run`]) serves the experts over gRPC to hostd
//! processes: `rpc` (the service and its status mapping), `call` (the one pipeline every MoE
//! call passes, and the call ring's worker), `moe_call` (one call: leases, reads, kernels),
//! `session` (sessions and fairness), `shm` (shared-memory activations).
//!
//! The container format itself (layout, header, index, blobs, identity) is
//! `shared::container`; this crate owns the file IO around it and the command line.

pub mod cache;
pub mod call;
pub mod call_memory;
pub mod cli;
mod convert;
mod convert_gguf;
pub mod io;
pub mod logsafe;
pub mod memlimit;
pub mod metrics;
pub mod moe_call;
pub mod prefetch;
pub mod prepare;
pub mod quant_error;
pub mod replay;
pub mod rpc;
pub mod server;
pub mod session;
pub mod shm;
pub mod stats_client;
pub mod systemd;
pub mod trace;
pub mod trace_flusher;
pub mod verify;

pub use server::run;
