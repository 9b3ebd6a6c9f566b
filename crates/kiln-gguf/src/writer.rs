//! [`GgufWriter`]: writes GGUF v3 files in one forward pass, so an 8B model can be written from tensors produced
//! one at a time (no seeking, no buffering of tensor data).
//!
//! Two phases: declare metadata and every tensor (name, type, shape) on a [`GgufWriter`]; then
//! [`GgufWriter::begin`] writes the header and hands back a [`TensorDataWriter`] that takes each tensor's bytes
//! in declaration order (whole, or in pieces for tensors that should never be whole in memory), checks their
//! size, and pads to the alignment.

use crate::error::{Error, ErrorKind, Result};
use crate::file::TensorInfo;
use crate::reader::{tensor_size, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAGIC, MAX_NESTING};
use crate::value::{Array, Metadata, Value};
use kiln_quant::GgmlType;
use std::collections::HashSet;
use std::io::Write;

/// Declares the contents of a GGUF v3 file. See the crate docs for an example.
#[derive(Debug, Default)]
pub struct GgufWriter {
    metadata: Metadata,
    /// Offsets are filled in by [`GgufWriter::begin`], when the alignment is final.
    tensors: Vec<TensorInfo>,
    names: HashSet<String>,
}

impl GgufWriter {
    /// An empty file: no metadata, no tensors.
    pub fn new() -> GgufWriter {
        GgufWriter::default()
    }

    /// Adds metadata `key = value`. Keys must be unique and non-empty; arrays may nest at most
    /// [`crate::MAX_NESTING`] deep; `general.alignment` must be an integer that is a nonzero power of two
    /// fitting in u32 (it is stored as given).
    pub fn add(&mut self, key: &str, value: impl Into<Value>) -> Result<&mut GgufWriter> {
        let value = value.into();
        let err = |m: String| Error::new(ErrorKind::Writer(m)).with_key(key);
        if key.is_empty() {
            return Err(Error::new(ErrorKind::Writer("empty metadata key".into())));
        }
        if depth(&value) > MAX_NESTING {
            return Err(err(format!(
                "arrays nested deeper than {MAX_NESTING} levels"
            )));
        }
        if key == ALIGNMENT_KEY {
            let mut probe = Metadata::new();
            probe.insert(key.to_owned(), value.clone());
            let a = probe.get_u32(key)?;
            if !a.is_power_of_two() {
                return Err(Error::new(ErrorKind::BadAlignment(a.into())).with_key(key));
            }
        }
        if !self.metadata.insert(key.to_owned(), value) {
            return Err(err("duplicate metadata key".into()));
        }
        Ok(self)
    }

    /// Sets `general.alignment` (as u32).
    pub fn set_alignment(&mut self, alignment: u32) -> Result<&mut GgufWriter> {
        self.add(ALIGNMENT_KEY, Value::U32(alignment))
    }

    /// Declares a tensor; data is written later in declaration order. `shape` is in ggml order (row length
    /// first). The shape is checked exactly as the reader checks it.
    pub fn add_tensor(
        &mut self,
        name: &str,
        ty: GgmlType,
        shape: &[u64],
    ) -> Result<&mut GgufWriter> {
        if name.is_empty() {
            return Err(Error::new(ErrorKind::Writer("empty tensor name".into())));
        }
        let size = tensor_size(ty, shape).map_err(|e| e.with_tensor(name))?;
        if !self.names.insert(name.to_owned()) {
            return Err(
                Error::new(ErrorKind::Writer("duplicate tensor name".into())).with_tensor(name),
            );
        }
        self.tensors.push(TensorInfo {
            name: name.to_owned(),
            ty,
            shape: shape.to_vec(),
            offset: 0,
            size,
        });
        Ok(self)
    }

    /// The metadata declared so far.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    fn alignment(&self) -> u64 {
        // `add` validated the value.
        self.metadata
            .opt_u32(ALIGNMENT_KEY)
            .ok()
            .flatten()
            .map_or(DEFAULT_ALIGNMENT, u64::from)
    }

    /// Writes the header, metadata and tensor infos (and the padding before the data section) to `out`, and
    /// returns the writer for the tensors' data. A file without tensors is complete after
    /// [`TensorDataWriter::finish`].
    pub fn begin<W: Write>(mut self, mut out: W) -> Result<TensorDataWriter<W>> {
        let alignment = self.alignment();
        let mut offset = 0u64;
        for t in &mut self.tensors {
            t.offset = offset;
            offset = offset
                .checked_add(t.size)
                .and_then(|e| e.checked_next_multiple_of(alignment))
                .ok_or_else(|| {
                    Error::new(ErrorKind::Writer("total tensor data overflows u64".into()))
                        .with_tensor(&t.name)
                })?;
        }

        let mut head = Vec::new();
        head.extend_from_slice(&MAGIC);
        head.extend_from_slice(&3u32.to_le_bytes());
        head.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        head.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in self.metadata.iter() {
            put_str(&mut head, k);
            head.extend_from_slice(&v.value_type().id().to_le_bytes());
            put_value(&mut head, v);
        }
        for t in &self.tensors {
            put_str(&mut head, &t.name);
            head.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
            for d in &t.shape {
                head.extend_from_slice(&d.to_le_bytes());
            }
            head.extend_from_slice(&t.ty.id().to_le_bytes());
            head.extend_from_slice(&t.offset.to_le_bytes());
        }
        // A file without tensors ends after its metadata: padding to a (possibly huge) alignment would only add
        // zeros that nothing reads.
        let pad = if self.tensors.is_empty() {
            0
        } else {
            (head.len() as u64).next_multiple_of(alignment) - head.len() as u64
        };
        out.write_all(&head)
            .and_then(|()| write_zeros(&mut out, pad))
            .map_err(|e| Error::new(ErrorKind::Write(e)))?;
        Ok(TensorDataWriter {
            out,
            tensors: self.tensors,
            next: 0,
            written: 0,
            alignment,
        })
    }
}

/// Receives tensor data in declaration order, after [`GgufWriter::begin`].
pub struct TensorDataWriter<W: Write> {
    out: W,
    tensors: Vec<TensorInfo>,
    next: usize,
    /// Bytes of tensor `next` written so far by [`TensorDataWriter::write_tensor_part`].
    written: u64,
    alignment: u64,
}

impl<W: Write> TensorDataWriter<W> {
    /// The tensor whose data is expected next, if any is left. Its `offset` is relative to the data section.
    pub fn next_tensor(&self) -> Option<&TensorInfo> {
        self.tensors.get(self.next)
    }

    /// Writes the data of tensor `name`, which must be the next declared tensor and exactly its size, followed
    /// by zero padding to the alignment.
    pub fn write_tensor_data(&mut self, name: &str, data: &[u8]) -> Result<()> {
        self.check_next(name)?;
        let t = &self.tensors[self.next];
        if self.written != 0 || data.len() as u64 != t.size {
            return Err(self.size_error(name, self.written + data.len() as u64));
        }
        self.write_tensor_part(name, data)
    }

    /// Writes the next piece of tensor `name`'s data, for tensors produced in pieces (a row block at a time)
    /// that should never be whole in memory. Pieces must add up to exactly the tensor's size; the padding is
    /// written after the last one.
    pub fn write_tensor_part(&mut self, name: &str, data: &[u8]) -> Result<()> {
        self.check_next(name)?;
        let size = self.tensors[self.next].size;
        let total = self.written + data.len() as u64;
        if total > size {
            return Err(self.size_error(name, total));
        }
        let pad = if total == size {
            size.next_multiple_of(self.alignment) - size
        } else {
            0
        };
        let write = |out: &mut W| -> std::io::Result<()> {
            out.write_all(data)?;
            write_zeros(out, pad)
        };
        write(&mut self.out).map_err(|e| Error::new(ErrorKind::Write(e)).with_tensor(name))?;
        if total == size {
            self.next += 1;
            self.written = 0;
        } else {
            self.written = total;
        }
        Ok(())
    }

    fn check_next(&self, name: &str) -> Result<()> {
        let Some(t) = self.tensors.get(self.next) else {
            return Err(Error::new(ErrorKind::Writer(
                "all declared tensors are already written".into(),
            ))
            .with_tensor(name));
        };
        if t.name != name {
            return Err(Error::new(ErrorKind::Writer(format!(
                "written out of order: '{}' is next",
                t.name.escape_debug()
            )))
            .with_tensor(name));
        }
        Ok(())
    }

    fn size_error(&self, name: &str, got: u64) -> Error {
        let t = &self.tensors[self.next];
        Error::new(ErrorKind::Writer(format!(
            "got {got} bytes of data, expected {} ({} {:?})",
            t.size, t.ty, t.shape
        )))
        .with_tensor(name)
    }

    /// Checks that every declared tensor was written, flushes, and returns the output.
    pub fn finish(mut self) -> Result<W> {
        if let Some(t) = self.tensors.get(self.next) {
            return Err(Error::new(ErrorKind::Writer(format!(
                "finished with {} of {} tensors' data complete",
                self.next,
                self.tensors.len()
            )))
            .with_tensor(&t.name));
        }
        self.out
            .flush()
            .map_err(|e| Error::new(ErrorKind::Write(e)))?;
        Ok(self.out)
    }
}

/// Writes `n` zero bytes without allocating `n` bytes (alignments may be as large as 2^31).
fn write_zeros<W: Write>(out: &mut W, mut n: u64) -> std::io::Result<()> {
    const ZEROS: [u8; 4096] = [0; 4096];
    while n > 0 {
        let k = n.min(ZEROS.len() as u64);
        out.write_all(&ZEROS[..k as usize])?;
        n -= k;
    }
    Ok(())
}

/// Nesting depth: 0 for a scalar, 1 for an array of scalars, …
fn depth(v: &Value) -> usize {
    fn arr(a: &Array) -> usize {
        match a {
            Array::Array(v) => 1 + v.iter().map(arr).max().unwrap_or(0),
            _ => 1,
        }
    }
    match v {
        Value::Array(a) => arr(a),
        _ => 0,
    }
}

fn put_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

fn put_value(buf: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => buf.push(*x),
        Value::I8(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => buf.push(u8::from(*x)),
        Value::String(s) => put_str(buf, s),
        Value::Array(a) => put_array(buf, a),
        Value::U64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => buf.extend_from_slice(&x.to_le_bytes()),
    }
}

fn put_array(buf: &mut Vec<u8>, a: &Array) {
    buf.extend_from_slice(&a.elem_type().id().to_le_bytes());
    buf.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! each {
        ($v:expr) => {
            for x in $v {
                buf.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        Array::U8(v) => buf.extend_from_slice(v),
        Array::I8(v) => each!(v),
        Array::U16(v) => each!(v),
        Array::I16(v) => each!(v),
        Array::U32(v) => each!(v),
        Array::I32(v) => each!(v),
        Array::F32(v) => each!(v),
        Array::Bool(v) => buf.extend(v.iter().map(|&b| u8::from(b))),
        Array::String(v) => v.iter().for_each(|s| put_str(buf, s)),
        Array::Array(v) => v.iter().for_each(|a| put_array(buf, a)),
        Array::U64(v) => each!(v),
        Array::I64(v) => each!(v),
        Array::F64(v) => each!(v),
    }
}

macro_rules! from_impls {
    ($($t:ty => $variant:ident),* $(,)?) => {$(
        impl From<$t> for Value {
            fn from(x: $t) -> Value {
                Value::$variant(x)
            }
        }
        impl From<Vec<$t>> for Array {
            fn from(v: Vec<$t>) -> Array {
                Array::$variant(v)
            }
        }
        impl From<Vec<$t>> for Value {
            fn from(v: Vec<$t>) -> Value {
                Value::Array(Array::$variant(v))
            }
        }
    )*};
}

from_impls! {
    u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32, bool => Bool,
    String => String, u64 => U64, i64 => I64, f64 => F64,
}

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::String(s.to_owned())
    }
}

impl From<Array> for Value {
    fn from(a: Array) -> Value {
        Value::Array(a)
    }
}

impl From<Vec<Array>> for Value {
    fn from(v: Vec<Array>) -> Value {
        Value::Array(Array::Array(v))
    }
}

impl From<Vec<&str>> for Value {
    fn from(v: Vec<&str>) -> Value {
        Value::Array(Array::String(v.into_iter().map(str::to_owned).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GgufFile;

    #[test]
    fn data_writer_checks_order_and_size() {
        let mut w = GgufWriter::new();
        w.add_tensor("a", GgmlType::F32, &[2]).unwrap();
        w.add_tensor("b", GgmlType::F16, &[3]).unwrap();
        let mut d = w.begin(Vec::new()).unwrap();
        assert_eq!(
            d.write_tensor_data("b", &[0; 6]).unwrap_err().to_string(),
            "tensor 'b': written out of order: 'a' is next"
        );
        assert_eq!(
            d.write_tensor_data("a", &[0; 7]).unwrap_err().to_string(),
            "tensor 'a': got 7 bytes of data, expected 8 (f32 [2])"
        );
        d.write_tensor_data("a", &1.5f32.to_le_bytes().repeat(2))
            .unwrap();
        assert_eq!(d.next_tensor().unwrap().name, "b");
        let d2 = d;
        assert_eq!(
            d2.finish().unwrap_err().to_string(),
            "tensor 'b': finished with 1 of 2 tensors' data complete"
        );
    }

    #[test]
    fn tensors_can_be_written_in_parts() {
        let mut w = GgufWriter::new();
        w.add_tensor("a", GgmlType::F32, &[3]).unwrap();
        w.add_tensor("b", GgmlType::F32, &[1]).unwrap();
        let mut d = w.begin(Vec::new()).unwrap();
        d.write_tensor_part("a", &[1; 5]).unwrap();
        assert_eq!(
            d.write_tensor_data("a", &[1; 12]).unwrap_err().to_string(),
            "tensor 'a': got 17 bytes of data, expected 12 (f32 [3])"
        );
        assert_eq!(
            d.write_tensor_part("a", &[1; 8]).unwrap_err().to_string(),
            "tensor 'a': got 13 bytes of data, expected 12 (f32 [3])"
        );
        d.write_tensor_part("a", &[2; 7]).unwrap();
        d.write_tensor_part("b", &[3; 4]).unwrap();
        let f = GgufFile::from_bytes(d.finish().unwrap()).unwrap();
        assert_eq!(
            f.tensor_bytes("a").unwrap(),
            [1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2]
        );
        assert_eq!(f.tensor_bytes("b").unwrap(), [3; 4]);
    }

    #[test]
    fn files_without_tensors_are_not_padded() {
        // Found by the round-trip fuzz target: a 1 GiB alignment made the writer allocate 1 GiB of padding.
        let mut w = GgufWriter::new();
        w.add("general.alignment", 1i32 << 30).unwrap();
        let bytes = w.begin(Vec::new()).unwrap().finish().unwrap();
        assert_eq!(bytes.len(), 24 + 8 + 17 + 4 + 4);
        let f = GgufFile::from_bytes(bytes).unwrap();
        assert_eq!(f.alignment(), 1 << 30);
        assert!(f.tensors().is_empty());
    }

    #[test]
    fn declarations_are_validated() {
        let mut w = GgufWriter::new();
        assert_eq!(
            w.add_tensor("q", GgmlType::Q4_0, &[33, 2])
                .unwrap_err()
                .to_string(),
            "tensor 'q': row length 33 is not a multiple of the q4_0 block size 32"
        );
        w.add_tensor("q", GgmlType::Q4_0, &[32, 2]).unwrap();
        assert!(w.add_tensor("q", GgmlType::F32, &[1]).is_err());
        assert_eq!(
            w.set_alignment(48).unwrap_err().to_string(),
            "metadata key 'general.alignment': alignment 48 is not a nonzero power of two"
        );
        w.add("k", 1u8).unwrap();
        assert_eq!(
            w.add("k", 2u8).unwrap_err().to_string(),
            "metadata key 'k': duplicate metadata key"
        );
        let mut deep = Array::U8(vec![1]);
        for _ in 0..MAX_NESTING {
            deep = Array::Array(vec![deep]);
        }
        assert!(w.add("deep", deep).is_err());
    }

    #[test]
    fn tensors_are_padded_to_the_alignment() {
        let mut w = GgufWriter::new();
        w.set_alignment(64).unwrap();
        w.add_tensor("a", GgmlType::F32, &[3]).unwrap();
        w.add_tensor("b", GgmlType::F32, &[1]).unwrap();
        let mut d = w.begin(Vec::new()).unwrap();
        d.write_tensor_data("a", &[1; 12]).unwrap();
        d.write_tensor_data("b", &[2; 4]).unwrap();
        let bytes = d.finish().unwrap();
        let f = GgufFile::from_bytes(bytes).unwrap();
        assert_eq!(f.alignment(), 64);
        let (a, b) = (f.tensor("a").unwrap(), f.tensor("b").unwrap());
        assert_eq!(a.offset % 64, 0);
        assert_eq!(b.offset, a.offset + 64);
        assert_eq!(f.tensor_data(b), &[2; 4]);
        // Padding is zeros, and the file ends padded.
        assert!(f.as_bytes()[(a.offset + 12) as usize..b.offset as usize]
            .iter()
            .all(|&x| x == 0));
        assert_eq!(f.file_size(), b.offset + 64);
    }
}
