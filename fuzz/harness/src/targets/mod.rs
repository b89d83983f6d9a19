//! One module per parser boundary; each exposes `run(&[u8]) -> Outcome`.

pub mod container;
pub mod gguf;
#[cfg(feature = "http")]
pub mod http_params;
pub mod proto_convert;
pub mod safetensors_header;
#[cfg(feature = "daemon")]
pub mod shm_ring;
#[cfg(feature = "daemon")]
pub mod shm_segment;
