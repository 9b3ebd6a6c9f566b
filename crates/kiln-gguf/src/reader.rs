//! The GGUF parser: a bounded cursor over the file's bytes and the validation of every header field, metadata
//! value and tensor info before anything is allocated for it or indexed with it.
//!
//! Invariants the rest of the crate relies on once [`parse`] returns `Ok`: every tensor's `offset..offset+size`
//! lies inside the file, is aligned, does not overlap another tensor, and `size` is exactly `row_bytes(ne[0]) *
//! rows` for a known type; names and keys are unique and non-empty.

use crate::error::{Error, ErrorKind, Result};
use crate::file::TensorInfo;
use crate::value::{Array, Metadata, Value, ValueType};
use kiln_quant::GgmlType;
use std::collections::HashSet;

/// The four bytes every GGUF file starts with.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// The alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The metadata key holding the alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// How deep arrays of arrays may nest (an array of scalars is depth 1). Bounds the parser's recursion so a
/// crafted file cannot overflow the stack; real files use depth 1 (llama.cpp does not read nested arrays at all).
pub const MAX_NESTING: usize = 16;
/// Most dimensions a tensor may have (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;

/// Smallest possible size of one metadata entry: key length (8), an empty key is rejected, so ≥1 key byte,
/// value type (4), smallest value (1).
const MIN_KV_BYTES: u64 = 8 + 1 + 4 + 1;
/// Smallest possible tensor info: name length (8) + ≥1 name byte, n_dims (4), type (4), offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 1 + 4 + 4 + 8;

/// What a parsed file holds, before the bytes are attached.
#[derive(Debug)]
pub(crate) struct Parsed {
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    pub data_offset: u64,
}

/// A read position in a byte slice. Invariant: `pos <= buf.len()`, so `buf.len() - pos` never underflows, and
/// every read checks `n > len - pos` before slicing.
pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(buf: &'a [u8]) -> Cursor<'a> {
        Cursor { buf, pos: 0 }
    }

    pub fn pos(&self) -> u64 {
        self.pos as u64
    }

    pub fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn truncated(&self, what: &'static str, needed: u64) -> Error {
        Error::new(ErrorKind::Truncated {
            what,
            offset: self.pos(),
            needed,
            len: self.buf.len() as u64,
        })
    }

    pub fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.truncated(what, n));
        }
        // n <= remaining <= usize::MAX, so the cast is exact.
        let end = self.pos + n as usize;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub fn u32(&mut self, what: &'static str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub fn u64(&mut self, what: &'static str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A length-prefixed UTF-8 string.
    pub fn string(&mut self, what: &'static str) -> Result<String> {
        let len = self.u64(what)?;
        let start = self.pos();
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(Error::new(ErrorKind::InvalidUtf8 { offset: start })),
        }
    }

    /// A `count` read at the current position, checked so that `count` elements of at least `min_size` bytes
    /// fit in what is left: the guard that keeps a hostile count from allocating.
    fn count(&mut self, what: &'static str, min_size: u64) -> Result<usize> {
        let offset = self.pos();
        let count = self.u64(what)?;
        let remaining = self.remaining();
        let fits = count
            .checked_mul(min_size)
            .is_some_and(|need| need <= remaining);
        if !fits {
            return Err(Error::new(ErrorKind::CountTooLarge {
                what,
                count,
                offset,
                remaining,
            }));
        }
        // count <= remaining, which came from a usize.
        Ok(count as usize)
    }

    fn value_type(&mut self) -> Result<ValueType> {
        let offset = self.pos();
        let id = self.u32("value type")?;
        ValueType::from_id(id).ok_or(Error::new(ErrorKind::UnknownValueType { id, offset }))
    }

    fn bool(&mut self) -> Result<bool> {
        let offset = self.pos();
        match self.array::<1>("bool")?[0] {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(Error::new(ErrorKind::BadBool { value, offset })),
        }
    }

    /// One value of type `ty`; `depth` is the number of arrays enclosing it.
    fn value(&mut self, ty: ValueType, depth: usize) -> Result<Value> {
        Ok(match ty {
            ValueType::U8 => Value::U8(u8::from_le_bytes(self.array("u8")?)),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array("i8")?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array("u16")?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array("i16")?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array("u32")?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array("i32")?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array("f32")?)),
            ValueType::Bool => Value::Bool(self.bool()?),
            ValueType::String => Value::String(self.string("string")?),
            ValueType::Array => Value::Array(self.array_value(depth + 1)?),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array("u64")?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array("i64")?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array("f64")?)),
        })
    }

    /// An array (type, count, elements) at nesting `depth` (1 = not inside another array).
    fn array_value(&mut self, depth: usize) -> Result<Array> {
        if depth > MAX_NESTING {
            return Err(Error::new(ErrorKind::NestingTooDeep {
                max: MAX_NESTING,
                offset: self.pos(),
            }));
        }
        let ty = self.value_type()?;
        let n = self.count("array element count", ty.min_size())?;
        // Fixed-size elements are decoded from one checked slice; `count` already proved it fits.
        macro_rules! fixed {
            ($variant:ident, $t:ty) => {{
                const SZ: usize = std::mem::size_of::<$t>();
                let bytes = self.take((n * SZ) as u64, concat!("array of ", stringify!($t)))?;
                Array::$variant(
                    bytes
                        .chunks_exact(SZ)
                        .map(|c| <$t>::from_le_bytes(c.try_into().expect("chunk of SZ bytes")))
                        .collect(),
                )
            }};
        }
        Ok(match ty {
            ValueType::U8 => fixed!(U8, u8),
            ValueType::I8 => fixed!(I8, i8),
            ValueType::U16 => fixed!(U16, u16),
            ValueType::I16 => fixed!(I16, i16),
            ValueType::U32 => fixed!(U32, u32),
            ValueType::I32 => fixed!(I32, i32),
            ValueType::F32 => fixed!(F32, f32),
            ValueType::U64 => fixed!(U64, u64),
            ValueType::I64 => fixed!(I64, i64),
            ValueType::F64 => fixed!(F64, f64),
            ValueType::Bool => Array::Bool((0..n).map(|_| self.bool()).collect::<Result<_>>()?),
            ValueType::String => Array::String(
                (0..n)
                    .map(|_| self.string("string"))
                    .collect::<Result<_>>()?,
            ),
            ValueType::Array => Array::Array(
                (0..n)
                    .map(|_| self.array_value(depth + 1))
                    .collect::<Result<_>>()?,
            ),
        })
    }
}

/// Parses and validates the whole file in `buf`.
pub(crate) fn parse(buf: &[u8]) -> Result<Parsed> {
    let file_size = buf.len() as u64;
    let mut c = Cursor::new(buf);

    let magic = c.array::<4>("magic")?;
    if magic != MAGIC {
        return Err(Error::new(ErrorKind::BadMagic { found: magic }));
    }
    let version = c.u32("version")?;
    if version != 2 && version != 3 {
        // A big-endian writer stores 3 as 0x03000000.
        let swapped = version.swap_bytes();
        return Err(Error::new(if swapped == 2 || swapped == 3 {
            ErrorKind::BigEndian
        } else {
            ErrorKind::UnsupportedVersion(version)
        }));
    }
    let tensor_count = c.count("tensor count", MIN_TENSOR_INFO_BYTES)?;
    let kv_count = c.count("metadata key count", MIN_KV_BYTES)?;

    let mut metadata = Metadata::new();
    for _ in 0..kv_count {
        let start = c.pos();
        let key = c.string("metadata key")?;
        if key.is_empty() {
            return Err(Error::new(ErrorKind::EmptyName { offset: start }));
        }
        let value = c
            .value_type()
            .and_then(|ty| c.value(ty, 0))
            .map_err(|e| e.with_key(&key))?;
        if metadata.contains(&key) {
            return Err(Error::new(ErrorKind::DuplicateKey { offset: start }).with_key(&key));
        }
        metadata.insert(key, value);
    }

    let alignment = match metadata.opt_u32(ALIGNMENT_KEY)? {
        None => DEFAULT_ALIGNMENT,
        Some(a) if a.is_power_of_two() => u64::from(a),
        Some(a) => {
            return Err(Error::new(ErrorKind::BadAlignment(a.into())).with_key(ALIGNMENT_KEY))
        }
    };

    // Relative offsets are kept in `offset` until the data section's start is known.
    let mut tensors = Vec::with_capacity(tensor_count);
    let mut names = HashSet::with_capacity(tensor_count);
    for _ in 0..tensor_count {
        let start = c.pos();
        let name = c.string("tensor name")?;
        if name.is_empty() {
            return Err(Error::new(ErrorKind::EmptyName { offset: start }));
        }
        let info = tensor_info(&mut c, name.clone()).map_err(|e| e.with_tensor(&name))?;
        if !names.insert(name) {
            return Err(
                Error::new(ErrorKind::DuplicateTensor { offset: start }).with_tensor(&info.name)
            );
        }
        tensors.push(info);
    }

    // The data section starts at the next multiple of the alignment; a file without tensors may end before it.
    let data_offset = c
        .pos()
        .checked_next_multiple_of(alignment)
        .expect("a buffer length plus an alignment below 2^32 fits in u64");
    for t in &mut tensors {
        let rel = t.offset;
        let oob = |start: u64| {
            Error::new(ErrorKind::DataOutOfBounds {
                start,
                end: start.saturating_add(t.size),
                file_size,
            })
            .with_tensor(&t.name)
        };
        if rel % alignment != 0 {
            return Err(Error::new(ErrorKind::Unaligned {
                offset: rel,
                alignment,
            })
            .with_tensor(&t.name));
        }
        let start = data_offset.checked_add(rel).ok_or_else(|| oob(u64::MAX))?;
        match start.checked_add(t.size) {
            Some(end) if end <= file_size => t.offset = start,
            _ => return Err(oob(start)),
        }
    }

    check_overlaps(&tensors)?;
    Ok(Parsed {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

/// The rest of one tensor info after its name: dims, type, offset; with the shape and size validated.
fn tensor_info(c: &mut Cursor<'_>, name: String) -> Result<TensorInfo> {
    let n_dims = c.u32("tensor dimension count")?;
    if n_dims as usize > MAX_DIMS {
        return Err(Error::new(ErrorKind::TooManyDims(n_dims.into())));
    }
    let mut shape = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        shape.push(c.u64("tensor dimension")?);
    }
    let type_id = c.u32("tensor type")?;
    let ty = GgmlType::from_id(type_id).ok_or(Error::new(ErrorKind::UnknownTensorType(type_id)))?;
    let offset = c.u64("tensor data offset")?;
    let size = tensor_size(ty, &shape)?;
    Ok(TensorInfo {
        name,
        ty,
        shape,
        offset,
        size,
    })
}

/// Checks a tensor shape (0 to 4 dims, each in 1..=i64::MAX, element count within i64, whole blocks per row)
/// and returns its byte size. Shared by the reader and the writer so both accept exactly the same tensors.
pub(crate) fn tensor_size(ty: GgmlType, shape: &[u64]) -> Result<u64> {
    if shape.len() > MAX_DIMS {
        return Err(Error::new(ErrorKind::TooManyDims(shape.len() as u64)));
    }
    for (index, &value) in shape.iter().enumerate() {
        // Zero-sized tensors are rejected: no model needs one, and an empty range has no place in the
        // overlap check. ggml stores dims as int64, hence the upper bound.
        if value == 0 || value > i64::MAX as u64 {
            return Err(Error::new(ErrorKind::BadDim { index, value }));
        }
    }
    let overflow = || {
        Error::new(ErrorKind::SizeOverflow {
            shape: shape.to_vec(),
        })
    };
    let n_elements = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or_else(overflow)?;
    // A 0-dim tensor is a scalar: one row of one element.
    let ne0 = shape.first().copied().unwrap_or(1);
    let block = ty.block_elems() as u64;
    if ne0 % block != 0 {
        return Err(Error::new(ErrorKind::PartialBlock { ty, ne0, block }));
    }
    ty.row_bytes(ne0)
        .and_then(|rb| rb.checked_mul(n_elements / ne0))
        .ok_or_else(overflow)
}

/// Rejects tensors whose data ranges overlap (ranges are absolute and non-empty by now).
fn check_overlaps(tensors: &[TensorInfo]) -> Result<()> {
    let mut order: Vec<&TensorInfo> = tensors.iter().collect();
    order.sort_by_key(|t| t.offset);
    for w in order.windows(2) {
        let (a, b) = (w[0], w[1]);
        if b.offset < a.offset + a.size {
            return Err(Error::new(ErrorKind::Overlap {
                start: b.offset,
                end: b.offset + b.size,
                other: a.name.clone(),
                other_start: a.offset,
                other_end: a.offset + a.size,
            })
            .with_tensor(&b.name));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_never_reads_past_the_end() {
        let mut c = Cursor::new(&[1, 0, 0, 0, 9]);
        assert_eq!(c.u32("x").unwrap(), 1);
        let e = c.u64("thing").unwrap_err();
        assert_eq!(
            e.to_string(),
            "thing at offset 4 needs 8 bytes, but the file ends at 5"
        );
        assert_eq!(
            c.take(u64::MAX, "huge").unwrap_err().to_string(),
            "huge at offset 4 needs 18446744073709551615 bytes, but the file ends at 5"
        );
        assert_eq!(c.take(1, "b").unwrap(), &[9]);
        assert_eq!(c.remaining(), 0);
    }

    #[test]
    fn counts_are_checked_against_bytes_left() {
        let mut bytes = (1u64 << 60).to_le_bytes().to_vec();
        bytes.extend([0; 16]);
        let e = Cursor::new(&bytes).count("thing count", 8).unwrap_err();
        assert_eq!(
            e.to_string(),
            "thing count 1152921504606846976 at offset 0 cannot fit in the 16 bytes left"
        );
        // Multiplication overflow is caught too.
        let bytes = u64::MAX.to_le_bytes();
        assert!(Cursor::new(&bytes).count("thing", 2).is_err());
        let mut bytes = 2u64.to_le_bytes().to_vec();
        bytes.extend([0; 16]);
        assert_eq!(Cursor::new(&bytes).count("thing", 8).unwrap(), 2);
    }
}
