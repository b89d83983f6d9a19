//! IO-free building blocks both sluice daemons use: the model configuration, the checkpoint's
//! tensor inventory and its validation, the expert locator and the size arithmetic.
//!
//! `checkpoint` and the container's `reader` and `identity` are the modules that touch the
//! filesystem: they read `config.json`, the safetensors index, each shard's header (never a
//! payload) and the container, and hand the bytes to the pure parsers here; `procfs` reads this
//! or another process's figures from /proc.

pub mod byte_size;
pub mod call_cost;
pub mod checkpoint;
pub mod config;
pub mod container;
pub mod error_text;
pub mod gguf;
pub mod ids;
pub mod keep_awake;
pub mod kernels;
pub mod moe_combine;
pub mod moe_exec;
pub mod procfs;
pub mod ring;
pub mod safetensors_header;
pub mod safetensors_locator;
pub mod shm_copy;
pub mod shm_layout;
pub mod sizes;
#[doc(hidden)]
pub mod skip;
pub mod splitmix;
pub mod tensor_spec;
