//! The gRPC face of the daemon: the `expertd.v1.ExpertService` implementation (`service`), the
//! one mapping from domain errors to `tonic::Status` (`status`), and peer and token checks
//! (`auth`), and the shared-memory call ring's worker (`ring`), which carries MoE calls on a
//! unix socket without RPC. Connection handling and the listener loop are `crate::server`; the work of a call
//! is `crate::moe_call`.

pub mod auth;
pub mod ring;
pub mod service;
pub mod status;

pub use service::{ConnInfo, ExpertdService, Peer, ServiceConfig, ServiceState};
pub use status::RpcError;
