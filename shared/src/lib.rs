//! IO-free building blocks both sluice daemons use: the model configuration, the checkpoint's
//! tensor inventory and its validation, the expert locator and the size arithmetic.
//!
//! `checkpoint` is the one module that touches the filesystem: it reads `config.json`, the
//! safetensors index and each shard's header (never a payload) and hands the bytes to the pure
//! parsers here.

pub mod checkpoint;
pub mod config;
pub mod container;
pub mod error_text;
pub mod kernels;
pub mod moe_combine;
pub mod moe_exec;
pub mod ring;
pub mod safetensors_header;
pub mod safetensors_locator;
pub mod shm_layout;
pub mod sizes;
pub mod tensor_spec;
