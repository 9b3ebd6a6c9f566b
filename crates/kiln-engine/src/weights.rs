//! Weight binding: the model definitions declare every tensor's name, expected shape and whether it is required;
//! [`Binder`] checks each against the file and hands back a [`Weight`] (a zero-copy view into the mapped GGUF).
//! Shape checks are strict: a missing or mis-shaped tensor is an error naming it, with expected and actual
//! shapes; a tensor in the file that no definition asked for is reported as a warning by [`Binder::finish`].

use crate::error::{Error, Result};
use kiln_gguf::{GgufFile, TensorInfo};
use kiln_quant::GgmlType;
use std::collections::HashSet;
use std::sync::Arc;

/// A bound weight tensor: its name, element type, shape (ggml order: `shape[0]` is the row length) and bytes.
///
/// Backends receive weights as these host views and decide what to cache (the CPU backend reads the mapped file
/// directly; a device backend uploads by [`Weight::id`]).
#[derive(Clone)]
pub struct Weight {
    /// The GGUF tensor name.
    pub name: String,
    /// Its element type.
    pub ty: GgmlType,
    /// Its shape in ggml order.
    pub shape: Vec<u64>,
    /// A small integer unique among the model's weights (binding order), for backends that cache per weight.
    pub id: usize,
    info: TensorInfo,
    file: Arc<GgufFile>,
}

impl std::fmt::Debug for Weight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Weight({} {} {:?})", self.name, self.ty, self.shape)
    }
}

/// A 2-D slice of a weight: `rows` rows of `cols` elements, row-major in `bytes`.
#[derive(Clone, Copy, Debug)]
pub struct WeightView<'a> {
    /// The tensor's name (for error messages).
    pub name: &'a str,
    /// Element type.
    pub ty: GgmlType,
    /// Elements per row (the dot-product length).
    pub cols: usize,
    /// Number of rows (output features).
    pub rows: usize,
    /// Bytes per row.
    pub row_bytes: usize,
    /// The rows, `rows * row_bytes` bytes.
    pub bytes: &'a [u8],
}

impl WeightView<'_> {
    /// The bytes of row `r`.
    #[inline]
    pub fn row(&self, r: usize) -> &[u8] {
        &self.bytes[r * self.row_bytes..(r + 1) * self.row_bytes]
    }
}

impl Weight {
    /// Identifies the weight within the process for a backend's cache: its file and binding index. The file
    /// ([`Weight::file`]) must be kept alive by whoever keys by this, so that no other file can take its address.
    pub(crate) fn cache_key(&self) -> (usize, usize) {
        (Arc::as_ptr(&self.file) as usize, self.id)
    }

    /// The mapped file holding the weight.
    pub(crate) fn file(&self) -> Arc<GgufFile> {
        self.file.clone()
    }

    /// The raw bytes of the whole tensor.
    pub fn bytes(&self) -> &[u8] {
        self.file.tensor_data(&self.info)
    }

    /// Elements per row (`shape[0]`).
    pub fn cols(&self) -> usize {
        self.shape[0] as usize
    }

    /// The tensor as a matrix: `shape[0]` columns, `shape[1]` rows (the product of the other dims for 3-D).
    pub fn view(&self) -> WeightView<'_> {
        let cols = self.cols();
        let rows = self.shape[1..].iter().product::<u64>() as usize;
        let row_bytes = self.row_bytes();
        WeightView {
            name: &self.name,
            ty: self.ty,
            cols,
            rows,
            row_bytes,
            bytes: self.bytes(),
        }
    }

    /// Matrix `e` of a 3-D tensor `[cols, rows, n]` (an expert's weights).
    pub fn expert(&self, e: usize) -> WeightView<'_> {
        let cols = self.cols();
        let rows = self.shape[1] as usize;
        let row_bytes = self.row_bytes();
        let size = rows * row_bytes;
        WeightView {
            name: &self.name,
            ty: self.ty,
            cols,
            rows,
            row_bytes,
            bytes: &self.bytes()[e * size..(e + 1) * size],
        }
    }

    fn row_bytes(&self) -> usize {
        // Checked at bind time (`Binder::bind`), so this cannot fail for a bound weight.
        self.ty
            .row_bytes(self.shape[0])
            .expect("row size validated when the weight was bound") as usize
    }
}

/// Whether a declared tensor must be present.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Loading fails without it.
    Required,
    /// May be absent (e.g. `output.weight` with tied embeddings).
    Optional,
}

/// Binds declared tensors to the file, remembering which were used.
pub struct Binder {
    file: Arc<GgufFile>,
    used: HashSet<String>,
    next_id: usize,
}

impl Binder {
    /// A binder over `file`.
    pub fn new(file: Arc<GgufFile>) -> Binder {
        Binder {
            file,
            used: HashSet::new(),
            next_id: 0,
        }
    }

    /// A required tensor of exactly `shape` (ggml order).
    pub fn req(&mut self, name: &str, shape: &[u64]) -> Result<Weight> {
        self.bind(name, shape, Need::Required)?
            .ok_or_else(|| Error::MissingTensor {
                name: name.to_string(),
                expected: shape.to_vec(),
            })
    }

    /// An optional tensor: `None` when absent, an error when present with another shape.
    pub fn opt(&mut self, name: &str, shape: &[u64]) -> Result<Option<Weight>> {
        self.bind(name, shape, Need::Optional)
    }

    /// Whether the file holds a tensor called `name` (without binding it).
    pub fn has(&self, name: &str) -> bool {
        self.file.tensor(name).is_some()
    }

    fn bind(&mut self, name: &str, shape: &[u64], need: Need) -> Result<Option<Weight>> {
        let Some(info) = self.file.tensor(name) else {
            return match need {
                Need::Required => Err(Error::MissingTensor {
                    name: name.to_string(),
                    expected: shape.to_vec(),
                }),
                Need::Optional => Ok(None),
            };
        };
        if info.shape != shape {
            return Err(Error::TensorShape {
                name: name.to_string(),
                actual: info.shape.clone(),
                expected: shape.to_vec(),
            });
        }
        if info.ty.row_bytes(info.shape[0]).is_none() {
            return Err(Error::TensorType {
                name: name.to_string(),
                ty: info.ty,
                usage: "a row length that is not a whole number of blocks",
            });
        }
        self.used.insert(name.to_string());
        let w = Weight {
            name: name.to_string(),
            ty: info.ty,
            shape: info.shape.clone(),
            id: self.next_id,
            info: info.clone(),
            file: self.file.clone(),
        };
        self.next_id += 1;
        Ok(Some(w))
    }

    /// Ends binding: one warning per tensor in the file that no definition used.
    pub fn finish(self) -> Vec<String> {
        self.file
            .tensors()
            .iter()
            .filter(|t| !self.used.contains(&t.name))
            .map(|t| format!("tensor '{}' is not used by the model definition", t.name))
            .collect()
    }
}

/// Requires `w` to be f32 (norm weights, which the CPU backend reads as floats).
pub fn require_f32(w: &Weight, usage: &'static str) -> Result<()> {
    if w.ty != GgmlType::F32 {
        return Err(Error::TensorType {
            name: w.name.clone(),
            ty: w.ty,
            usage,
        });
    }
    Ok(())
}
