//! The expert container `experts.sluice`: one file holding every routed expert, as INT8 (v1)
//! or in k-quant blocks (v2)
//! (docs/container-format.md is the normative description; `header` repeats its byte map).
//!
//! Owns the format: layout arithmetic (`layout`), header and index encoding and validation
//! (`header`, `index`), blob encoding (`writer`) and verification (`blob`), checksums
//! (`checksum`), and the model identity (`identity`). Everything is pure except two small
//! readers: `identity` reads `config.json` and 64-byte samples of the checkpoint, and `reader`
//! is a plain `pread` reader for tools and tests. Converting a checkpoint (`expertd prepare`)
//! and the daemon's io_uring reads live in expertd.

mod blob;
pub mod checksum;
mod error;
pub mod format;
pub mod header;
pub mod identity;
pub mod index;
pub mod layout;
mod reader;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_kquant;
pub mod writer;

pub use blob::{BlobAt, ExpertBlob, check_blob};
pub use error::ContainerError;
pub use format::ExpertFormat;
pub use header::{Header, VersionedMagic};
pub use identity::ModelIdentity;
pub use index::IndexEntry;
pub use layout::{BlobLayout, ContainerLayout, ExpertDims};
pub use reader::{ContainerFile, read_full_at, read_header};

// The f32 and i32 parts of a blob are viewed in place, which is only correct on a
// little-endian host (every target sluice runs on).
#[cfg(target_endian = "big")]
compile_error!(
    "shared::container views little-endian f32/i32 blob parts in place; big-endian hosts are unsupported"
);

/// File name of a complete container inside its directory.
pub const CONTAINER_FILE: &str = "experts.sluice";
/// File name `expertd prepare` writes into before the final rename.
pub const PARTIAL_FILE: &str = "experts.sluice.partial";
