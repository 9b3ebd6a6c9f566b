//! [`GgufFile`]: a parsed, validated GGUF file over its bytes (a memory map or a shared buffer), with zero-copy
//! tensor views.

use crate::error::{Error, ErrorKind, Result};
use crate::reader::{parse, Parsed};
use crate::value::Metadata;
use kiln_quant::GgmlType;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// One tensor's directory entry.
///
/// For tensors returned by [`GgufFile`], `offset..offset + size` is inside the file, aligned to the file's
/// alignment, and `size` is the exact byte size of `shape` in `ty`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor's name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Element type.
    pub ty: GgmlType,
    /// Dimensions in ggml order: `shape[0]` (`ne[0]`) is the row length, the contiguous one. 0 to 4 entries,
    /// each ≥ 1; an empty shape is a scalar.
    pub shape: Vec<u64>,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    /// Byte size of the data.
    pub size: u64,
}

impl TensorInfo {
    /// Number of elements (the product of the shape; 1 for a scalar).
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().fold(1u64, |a, &d| a.saturating_mul(d))
    }

    /// The row length, `ne[0]` (1 for a scalar).
    pub fn row_len(&self) -> u64 {
        self.shape.first().copied().unwrap_or(1)
    }

    /// Number of rows: every dimension after the first multiplied together.
    pub fn n_rows(&self) -> u64 {
        self.shape
            .iter()
            .skip(1)
            .fold(1u64, |a, &d| a.saturating_mul(d))
    }
}

/// The bytes a [`GgufFile`] reads from.
enum Storage {
    Mmap(memmap2::Mmap),
    Shared(Arc<[u8]>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) => m,
            Storage::Shared(b) => b,
        }
    }
}

/// A validated GGUF file (version 2 or 3).
///
/// Opening parses and checks the whole header, metadata and tensor directory; after that, tensor data views
/// are plain slices of the mapped file and cannot fail. See the crate docs for what is validated.
pub struct GgufFile {
    storage: Storage,
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

impl GgufFile {
    /// Memory-maps and parses the file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref();
        let io = |error| {
            Error::new(ErrorKind::Io {
                path: path.to_owned(),
                error,
            })
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        // Mapping an empty file fails on some platforms; an empty buffer gives the proper "magic" error.
        if len == 0 {
            return GgufFile::from_bytes(Vec::new());
        }
        // SAFETY: the map is read-only. As with every mmap-based reader, another process truncating or rewriting
        // the file while it is mapped is outside what Rust can guard against; kiln never writes files it maps.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        GgufFile::from_storage(Storage::Mmap(map))
    }

    /// Parses a GGUF file held in memory (tests, fuzzing, files received over the network). Takes a `Vec<u8>`,
    /// `Box<[u8]>` or `Arc<[u8]>`.
    pub fn from_bytes(bytes: impl Into<Arc<[u8]>>) -> Result<GgufFile> {
        GgufFile::from_storage(Storage::Shared(bytes.into()))
    }

    fn from_storage(storage: Storage) -> Result<GgufFile> {
        let Parsed {
            version,
            metadata,
            tensors,
            alignment,
            data_offset,
        } = parse(storage.bytes())?;
        let by_name = tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(GgufFile {
            storage,
            version,
            metadata,
            tensors,
            by_name,
            alignment,
            data_offset,
        })
    }

    /// The GGUF version: 2 or 3.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The metadata table.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The data of a tensor of this file: a view into the map, no copy. It is aligned in the file to
    /// [`GgufFile::alignment`]; in memory that holds for mapped files (pages are aligned) but not necessarily
    /// for [`GgufFile::from_bytes`] buffers.
    ///
    /// # Panics
    /// If `info` is not a range of this file. Infos from [`GgufFile::tensors`] / [`GgufFile::tensor`] always are;
    /// use [`GgufFile::tensor_bytes`] to look up by name.
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        let start = usize::try_from(info.offset).expect("tensor info from this file");
        let end = start
            .checked_add(usize::try_from(info.size).expect("tensor info from this file"))
            .expect("tensor info from this file");
        &self.storage.bytes()[start..end]
    }

    /// The data of the tensor named `name`, if there is one.
    pub fn tensor_bytes(&self, name: &str) -> Option<&[u8]> {
        self.tensor(name).map(|t| self.tensor_data(t))
    }

    /// The file's size in bytes.
    pub fn file_size(&self) -> u64 {
        self.storage.bytes().len() as u64
    }

    /// The alignment of tensor data (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute offset where the tensor data section starts.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// The whole file's bytes (for backends that upload or map weights themselves).
    pub fn as_bytes(&self) -> &[u8] {
        self.storage.bytes()
    }
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("file_size", &self.file_size())
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_can_be_shared_across_threads() {
        // Model weights are read by worker threads through one GgufFile.
        fn shareable<T: Send + Sync>() {}
        shareable::<GgufFile>();
        shareable::<crate::Error>();
    }

    #[test]
    fn open_reports_the_path_and_reads_empty_files_as_truncated() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.gguf");
        let e = GgufFile::open(&missing).unwrap_err();
        assert!(matches!(e.kind(), ErrorKind::Io { .. }));
        assert!(e
            .to_string()
            .starts_with(&format!("{}: ", missing.display())));
        let empty = dir.path().join("empty.gguf");
        std::fs::write(&empty, b"").unwrap();
        assert_eq!(
            GgufFile::open(&empty).unwrap_err().to_string(),
            "magic at offset 0 needs 4 bytes, but the file ends at 0"
        );
    }
}
