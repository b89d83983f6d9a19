//! One module per parser boundary; each exposes `run(&[u8]) -> Outcome`.

pub mod container;
pub mod http_params;
pub mod proto_convert;
pub mod safetensors_header;
pub mod shm_ring;
pub mod shm_segment;
