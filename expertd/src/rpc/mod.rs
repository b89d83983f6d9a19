//! The gRPC face of the daemon: the `expertd.v1.ExpertService` implementation (`service`), the
//! one mapping from domain errors to `tonic::Status` (`status`), peer and token checks
//! (`auth`), and what a request holds while it arrives (`intake`). Connection handling and the listener loop are `crate::server`; every MoE call, from
//! here or from a call ring, passes `crate::call`'s pipeline; the work of a call is
//! `crate::moe_call`.

pub mod auth;
pub mod intake;
pub mod service;
pub mod status;

pub use service::{ConnInfo, ExpertdService, Peer, ServiceConfig, ServiceState};
pub use status::RpcError;
