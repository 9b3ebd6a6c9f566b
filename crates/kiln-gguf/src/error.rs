//! The crate's error type: an [`ErrorKind`] saying what is wrong, plus the metadata key or tensor it concerns.
//!
//! Display is one lowercase line: the context first ("tensor 'x': ", "metadata key 'k': "), then the kind's message,
//! which carries the byte offsets and sizes involved.

use kiln_quant::GgmlType;
use std::path::PathBuf;

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A GGUF read, validation, lookup or write error.
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    context: Context,
}

/// What an error is about, when it concerns one named item.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Context {
    None,
    Key(String),
    Tensor(String),
}

/// What went wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The file could not be opened, mapped or written.
    // The io error is printed in the message and deliberately not a `source`, so that a cause chain printed
    // with `{:#}` does not repeat it.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        error: std::io::Error,
    },
    /// Writing to the output stream failed.
    #[error("write failed: {0}")]
    Write(std::io::Error),
    /// The first four bytes are not `GGUF`.
    #[error("not a gguf file: it starts with \"{}\", not \"GGUF\"", .found.escape_ascii())]
    BadMagic {
        /// The first four bytes.
        found: [u8; 4],
    },
    /// The version is not 2 or 3.
    #[error("gguf version {0} is not supported (kiln reads versions 2 and 3)")]
    UnsupportedVersion(u32),
    /// The version field reads as a byte-swapped 2 or 3: a big-endian file.
    #[error("big-endian gguf files are not supported")]
    BigEndian,
    /// A field runs past the end of the file.
    #[error("{what} at offset {offset} needs {needed} bytes, but the file ends at {len}")]
    Truncated {
        /// The field being read.
        what: &'static str,
        /// Where it starts.
        offset: u64,
        /// How many bytes it needs.
        needed: u64,
        /// The file's length.
        len: u64,
    },
    /// A count is larger than the bytes left could possibly hold.
    #[error("{what} {count} at offset {offset} cannot fit in the {remaining} bytes left")]
    CountTooLarge {
        /// What is counted ("tensor count").
        what: &'static str,
        /// The count read.
        count: u64,
        /// Where the count is stored.
        offset: u64,
        /// Bytes left after the count.
        remaining: u64,
    },
    /// A string is not UTF-8.
    #[error("string at offset {offset} is not valid utf-8")]
    InvalidUtf8 {
        /// Where the string's bytes start.
        offset: u64,
    },
    /// A bool is neither 0 nor 1.
    #[error("bool at offset {offset} is {value} (must be 0 or 1)")]
    BadBool {
        /// The byte.
        value: u8,
        /// Where it is stored.
        offset: u64,
    },
    /// A metadata value type id is unknown.
    #[error("unknown metadata value type {id} at offset {offset}")]
    UnknownValueType {
        /// The type id.
        id: u32,
        /// Where it is stored.
        offset: u64,
    },
    /// Arrays of arrays nest deeper than [`crate::MAX_NESTING`].
    #[error("arrays nested deeper than {max} levels at offset {offset}")]
    NestingTooDeep {
        /// The limit.
        max: usize,
        /// Where the too-deep array starts.
        offset: u64,
    },
    /// A metadata key appears twice.
    #[error("duplicate metadata key (second copy at offset {offset})")]
    DuplicateKey {
        /// Where the second copy starts.
        offset: u64,
    },
    /// A tensor name appears twice.
    #[error("duplicate tensor name (second copy at offset {offset})")]
    DuplicateTensor {
        /// Where the second tensor info starts.
        offset: u64,
    },
    /// An empty metadata key or tensor name.
    #[error("empty name at offset {offset}")]
    EmptyName {
        /// Where the name starts.
        offset: u64,
    },
    /// `general.alignment` is zero or not a power of two.
    #[error("alignment {0} is not a nonzero power of two")]
    BadAlignment(u64),
    /// A tensor has more than 4 dimensions.
    #[error("{0} dimensions (at most 4 are allowed)")]
    TooManyDims(u64),
    /// A tensor dimension is zero or above `i64::MAX` (ggml stores dims as int64).
    #[error("dimension {index} is {value} (must be 1..=2^63-1)")]
    BadDim {
        /// Which dimension (0 = row length).
        index: usize,
        /// Its value.
        value: u64,
    },
    /// The element count or byte size overflows.
    #[error("shape {shape:?} overflows the element count or byte size")]
    SizeOverflow {
        /// The shape.
        shape: Vec<u64>,
    },
    /// A tensor type id kiln does not know.
    #[error("unknown tensor type id {0}")]
    UnknownTensorType(u32),
    /// The row length is not a whole number of the type's blocks.
    #[error("row length {ne0} is not a multiple of the {ty} block size {block}")]
    PartialBlock {
        /// The type.
        ty: GgmlType,
        /// The row length (`ne[0]`).
        ne0: u64,
        /// Elements per block.
        block: u64,
    },
    /// A tensor's data offset is not a multiple of the alignment.
    #[error("data offset {offset} is not a multiple of the alignment {alignment}")]
    Unaligned {
        /// The offset relative to the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// A tensor's data range ends past the end of the file.
    #[error("data range {start}..{end} ends past the end of the file ({file_size} bytes)")]
    DataOutOfBounds {
        /// Absolute start.
        start: u64,
        /// Absolute end (exclusive), saturated on overflow.
        end: u64,
        /// The file's size.
        file_size: u64,
    },
    /// Two tensors' data ranges overlap.
    #[error("data range {start}..{end} overlaps tensor '{other}' ({other_start}..{other_end})")]
    Overlap {
        /// This tensor's absolute start.
        start: u64,
        /// This tensor's absolute end.
        end: u64,
        /// The other tensor.
        other: String,
        /// Its absolute start.
        other_start: u64,
        /// Its absolute end.
        other_end: u64,
    },
    /// A required metadata key is absent.
    #[error("missing")]
    MissingKey,
    /// A metadata value has another type than the accessor expects.
    #[error("expected {expected}, found {found}")]
    WrongType {
        /// What the accessor wanted.
        expected: &'static str,
        /// What the file holds.
        found: String,
    },
    /// An integer value does not fit the accessor's type.
    #[error("value {value} does not fit in {target}")]
    OutOfRange {
        /// The value, printed.
        value: String,
        /// The accessor's type.
        target: &'static str,
    },
    /// The writer was used out of order or given inconsistent data.
    #[error("{0}")]
    Writer(String),
}

impl Error {
    /// An error of `kind` with no key or tensor context.
    pub fn new(kind: ErrorKind) -> Error {
        Error {
            kind,
            context: Context::None,
        }
    }

    /// This error, about metadata key `key`.
    pub(crate) fn with_key(mut self, key: &str) -> Error {
        if self.context == Context::None {
            self.context = Context::Key(key.to_owned());
        }
        self
    }

    /// This error, about tensor `name`.
    pub(crate) fn with_tensor(mut self, name: &str) -> Error {
        if self.context == Context::None {
            self.context = Context::Tensor(name.to_owned());
        }
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> &ErrorKind {
        &self.kind
    }

    /// The metadata key the error concerns, if any.
    pub fn key(&self) -> Option<&str> {
        match &self.context {
            Context::Key(k) => Some(k),
            _ => None,
        }
    }

    /// The tensor the error concerns, if any.
    pub fn tensor(&self) -> Option<&str> {
        match &self.context {
            Context::Tensor(t) => Some(t),
            _ => None,
        }
    }
}

impl From<ErrorKind> for Error {
    fn from(kind: ErrorKind) -> Error {
        Error::new(kind)
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.context {
            Context::None => {}
            Context::Key(k) => write!(f, "metadata key '{}': ", k.escape_debug())?,
            Context::Tensor(t) => write!(f, "tensor '{}': ", t.escape_debug())?,
        }
        write!(f, "{}", self.kind)
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_puts_context_first() {
        let e = Error::new(ErrorKind::DataOutOfBounds {
            start: 1200,
            end: 5000,
            file_size: 4096,
        })
        .with_tensor("blk.0.attn_q.weight");
        assert_eq!(
            e.to_string(),
            "tensor 'blk.0.attn_q.weight': data range 1200..5000 ends past the end of the file (4096 bytes)"
        );
        assert_eq!(e.tensor(), Some("blk.0.attn_q.weight"));
        assert_eq!(e.key(), None);
        // The innermost context wins: a later with_key does not relabel it.
        let e = Error::new(ErrorKind::MissingKey)
            .with_key("a")
            .with_key("b");
        assert_eq!(e.to_string(), "metadata key 'a': missing");
    }
}
