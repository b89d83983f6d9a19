//! A plain reader of a complete container: [`ContainerFile::open`] validates the header, the
//! index and the file length; [`ContainerFile::read_expert`] reads one blob with `pread`,
//! verifies it and views it as two `MatrixRef`s.
//!
//! This is the simple synchronous path (tests, tools, `hostd`'s local backend). The daemon's
//! io_uring reads live in expertd and reuse the pure [`super::ExpertBlob::parse`].

use super::blob::{BlobAt, ExpertBlob};
use super::header::Header;
use super::index::{self, IndexEntry};
use super::layout::HEADER_BYTES;
use super::{CONTAINER_FILE, ContainerError};
use crate::ids::{ExpertId, LayerId};
use std::fs::File;
use std::path::{Path, PathBuf};

/// An open, validated container.
#[derive(Debug)]
pub struct ContainerFile {
    path: PathBuf,
    file: File,
    header: Header,
    index: Vec<IndexEntry>,
}

fn io_err(path: &Path, e: std::io::Error) -> ContainerError {
    ContainerError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

pub use crate::checkpoint::read_full_at;

/// Reads and parses the header of an open file (complete or unfinished) and returns it with
/// the file's length.
pub fn read_header(file: &File, path: &Path) -> Result<(Header, u64), ContainerError> {
    let file_len = file.metadata().map_err(|e| io_err(path, e))?.len();
    let mut buf = vec![0u8; HEADER_BYTES];
    let got = read_full_at(file, &mut buf, 0).map_err(|e| io_err(path, e))?;
    buf.truncate(got);
    Ok((Header::parse(&buf)?, file_len))
}

impl ContainerFile {
    /// Opens `dir/experts.sluice`.
    pub fn open(dir: &Path) -> Result<ContainerFile, ContainerError> {
        ContainerFile::open_file(&dir.join(CONTAINER_FILE))
    }

    /// Opens a container file by path: the header must be a complete (v1 or v2) header, the file
    /// exactly `file_bytes` long, and the index valid.
    pub fn open_file(path: &Path) -> Result<ContainerFile, ContainerError> {
        let file = File::open(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => ContainerError::Missing {
                path: path.to_path_buf(),
            },
            _ => io_err(path, e),
        })?;
        let (header, file_len) = read_header(&file, path)?;
        if header.magic.is_unfinished() {
            return Err(ContainerError::Unfinished);
        }
        if file_len != header.layout.file_bytes {
            return Err(ContainerError::FileLength {
                found: file_len,
                expected: header.layout.file_bytes,
            });
        }
        let mut region = vec![0u8; index::region_bytes(&header.layout)];
        let got = read_full_at(&file, &mut region, header.layout.index_offset)
            .map_err(|e| io_err(path, e))?;
        region.truncate(got);
        let index = index::parse_index(&header, &region)?;
        Ok(ContainerFile {
            path: path.to_path_buf(),
            file,
            header,
            index,
        })
    }

    /// The validated header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The index entries in (layer, expert) order.
    pub fn index(&self) -> &[IndexEntry] {
        &self.index
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads (layer, expert)'s blob into `buf` (resized to the blob stride), verifies it against
    /// its trailer and the index, and views its two matrices.
    pub fn read_expert<'b>(
        &self,
        layer: LayerId,
        expert: ExpertId,
        buf: &'b mut Vec<u8>,
    ) -> Result<ExpertBlob<'b>, ContainerError> {
        let layout = &self.header.layout;
        let i = layout.blob_index(layer, expert)?;
        let entry = self.index[i];
        buf.resize(layout.blob.stride, 0);
        let got = read_full_at(&self.file, buf, entry.offset).map_err(|e| io_err(&self.path, e))?;
        let at = BlobAt {
            layer,
            expert,
            offset: entry.offset,
        };
        ExpertBlob::parse(&buf[..got], &layout.blob, at, entry.checksum)
    }
}
