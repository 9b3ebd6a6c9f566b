//! Metadata values and the key → value table with typed accessors.
//!
//! Arrays are stored typed ([`Array`]): a 150k-entry vocabulary is one `Vec<String>` and its scores one
//! `Vec<f32>`, not 150k boxed enum values, and accessors hand out slices without copying.

use crate::error::{Error, ErrorKind, Result};
use std::borrow::Cow;
use std::collections::HashMap;

/// A GGUF metadata value type, with its id as stored in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ValueType {
    /// id 0
    U8,
    /// id 1
    I8,
    /// id 2
    U16,
    /// id 3
    I16,
    /// id 4
    U32,
    /// id 5
    I32,
    /// id 6
    F32,
    /// id 7
    Bool,
    /// id 8
    String,
    /// id 9
    Array,
    /// id 10
    U64,
    /// id 11
    I64,
    /// id 12
    F64,
}

impl ValueType {
    /// The type with file id `id`.
    pub fn from_id(id: u32) -> Option<ValueType> {
        Some(match id {
            0 => ValueType::U8,
            1 => ValueType::I8,
            2 => ValueType::U16,
            3 => ValueType::I16,
            4 => ValueType::U32,
            5 => ValueType::I32,
            6 => ValueType::F32,
            7 => ValueType::Bool,
            8 => ValueType::String,
            9 => ValueType::Array,
            10 => ValueType::U64,
            11 => ValueType::I64,
            12 => ValueType::F64,
            _ => return None,
        })
    }

    /// The id stored in the file.
    pub fn id(self) -> u32 {
        match self {
            ValueType::U8 => 0,
            ValueType::I8 => 1,
            ValueType::U16 => 2,
            ValueType::I16 => 3,
            ValueType::U32 => 4,
            ValueType::I32 => 5,
            ValueType::F32 => 6,
            ValueType::Bool => 7,
            ValueType::String => 8,
            ValueType::Array => 9,
            ValueType::U64 => 10,
            ValueType::I64 => 11,
            ValueType::F64 => 12,
        }
    }

    /// Lowercase name used in error messages.
    pub fn name(self) -> &'static str {
        match self {
            ValueType::U8 => "u8",
            ValueType::I8 => "i8",
            ValueType::U16 => "u16",
            ValueType::I16 => "i16",
            ValueType::U32 => "u32",
            ValueType::I32 => "i32",
            ValueType::F32 => "f32",
            ValueType::Bool => "bool",
            ValueType::String => "string",
            ValueType::Array => "array",
            ValueType::U64 => "u64",
            ValueType::I64 => "i64",
            ValueType::F64 => "f64",
        }
    }

    /// The fewest bytes one value of this type occupies in the file: the bound that lets the reader reject an
    /// array count before allocating for it (a string is at least its 8-byte length, an array its 4-byte type and
    /// 8-byte count).
    pub(crate) fn min_size(self) -> u64 {
        match self {
            ValueType::U8 | ValueType::I8 | ValueType::Bool => 1,
            ValueType::U16 | ValueType::I16 => 2,
            ValueType::U32 | ValueType::I32 | ValueType::F32 => 4,
            ValueType::U64 | ValueType::I64 | ValueType::F64 | ValueType::String => 8,
            ValueType::Array => 12,
        }
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `u8`
    U8(u8),
    /// `i8`
    I8(i8),
    /// `u16`
    U16(u16),
    /// `i16`
    I16(i16),
    /// `u32`
    U32(u32),
    /// `i32`
    I32(i32),
    /// `f32`
    F32(f32),
    /// `bool` (a byte 0 or 1 in the file)
    Bool(bool),
    /// A UTF-8 string.
    String(String),
    /// A typed array.
    Array(Array),
    /// `u64`
    U64(u64),
    /// `i64`
    I64(i64),
    /// `f64`
    F64(f64),
}

/// A metadata array: one element type for all elements; arrays of arrays hold one [`Array`] per element, each with
/// its own element type.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    /// `u8` elements.
    U8(Vec<u8>),
    /// `i8` elements.
    I8(Vec<i8>),
    /// `u16` elements.
    U16(Vec<u16>),
    /// `i16` elements.
    I16(Vec<i16>),
    /// `u32` elements.
    U32(Vec<u32>),
    /// `i32` elements.
    I32(Vec<i32>),
    /// `f32` elements.
    F32(Vec<f32>),
    /// `bool` elements.
    Bool(Vec<bool>),
    /// String elements.
    String(Vec<String>),
    /// Nested arrays.
    Array(Vec<Array>),
    /// `u64` elements.
    U64(Vec<u64>),
    /// `i64` elements.
    I64(Vec<i64>),
    /// `f64` elements.
    F64(Vec<f64>),
}

impl Value {
    /// The value's type.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// The type as written in error messages: "u32", "string", "array of f32".
    pub fn type_name(&self) -> String {
        match self {
            Value::Array(a) => format!("array of {}", a.elem_type().name()),
            v => v.value_type().name().to_owned(),
        }
    }

    /// The value as an integer when it is one of the integer types (any width or sign).
    pub fn as_int(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The string, when the value is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The array, when the value is one.
    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// Converts an integer value to `T`, or says why not.
fn int_to<T: TryFrom<i128>>(v: &Value, target: &'static str) -> Result<T, ErrorKind> {
    let Some(i) = v.as_int() else {
        return Err(ErrorKind::WrongType {
            expected: target,
            found: v.type_name(),
        });
    };
    T::try_from(i).map_err(|_| ErrorKind::OutOfRange {
        value: i.to_string(),
        target,
    })
}

impl Array {
    /// The element type.
    pub fn elem_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// An empty array of element type `ty`.
    pub fn empty(ty: ValueType) -> Array {
        Array::with_capacity(ty, 0)
    }

    pub(crate) fn with_capacity(ty: ValueType, n: usize) -> Array {
        match ty {
            ValueType::U8 => Array::U8(Vec::with_capacity(n)),
            ValueType::I8 => Array::I8(Vec::with_capacity(n)),
            ValueType::U16 => Array::U16(Vec::with_capacity(n)),
            ValueType::I16 => Array::I16(Vec::with_capacity(n)),
            ValueType::U32 => Array::U32(Vec::with_capacity(n)),
            ValueType::I32 => Array::I32(Vec::with_capacity(n)),
            ValueType::F32 => Array::F32(Vec::with_capacity(n)),
            ValueType::Bool => Array::Bool(Vec::with_capacity(n)),
            ValueType::String => Array::String(Vec::with_capacity(n)),
            ValueType::Array => Array::Array(Vec::with_capacity(n)),
            ValueType::U64 => Array::U64(Vec::with_capacity(n)),
            ValueType::I64 => Array::I64(Vec::with_capacity(n)),
            ValueType::F64 => Array::F64(Vec::with_capacity(n)),
        }
    }

    /// The elements converted to integers, when the element type is an integer type.
    fn ints(&self) -> Option<Vec<i128>> {
        fn conv<T: Copy + Into<i128>>(v: &[T]) -> Vec<i128> {
            v.iter().map(|&x| x.into()).collect()
        }
        Some(match self {
            Array::U8(v) => conv(v),
            Array::I8(v) => conv(v),
            Array::U16(v) => conv(v),
            Array::I16(v) => conv(v),
            Array::U32(v) => conv(v),
            Array::I32(v) => conv(v),
            Array::U64(v) => conv(v),
            Array::I64(v) => conv(v),
            _ => return None,
        })
    }
}

impl std::fmt::Display for Value {
    /// Scalars print plainly (strings without quotes); arrays of up to 8 elements print their elements, longer
    /// ones their length and type.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::String(v) => write!(f, "{v}"),
            Value::Array(a) => write!(f, "{a}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
        }
    }
}

impl std::fmt::Display for Array {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        fn list<T: std::fmt::Debug>(f: &mut std::fmt::Formatter<'_>, v: &[T]) -> std::fmt::Result {
            write!(f, "{v:?}")
        }
        if self.len() > 8 {
            return write!(f, "[{} × {}]", self.len(), self.elem_type().name());
        }
        match self {
            Array::U8(v) => list(f, v),
            Array::I8(v) => list(f, v),
            Array::U16(v) => list(f, v),
            Array::I16(v) => list(f, v),
            Array::U32(v) => list(f, v),
            Array::I32(v) => list(f, v),
            Array::F32(v) => list(f, v),
            Array::Bool(v) => list(f, v),
            Array::String(v) => list(f, v),
            Array::U64(v) => list(f, v),
            Array::I64(v) => list(f, v),
            Array::F64(v) => list(f, v),
            Array::Array(v) => {
                f.write_str("[")?;
                for (i, a) in v.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{a}")?;
                }
                f.write_str("]")
            }
        }
    }
}

/// The metadata table: keys in file order, each once, with typed accessors.
///
/// Accessors come in pairs: `get_*` errors when the key is missing, `opt_*` returns `Ok(None)`. Both error when
/// the value has another type; the error names the key, the expected and the found type.
///
/// Integer accessors (`get_u32`, `get_i64`, `get_arr_i32`, …) accept a value of **any** integer type whose value
/// fits the requested type, because GGUF writers disagree on widths and signs (`u32` vs `i32` vs `u64` for the
/// same key); a value that does not fit is an error naming the value. Float accessors accept `f32` and `f64`
/// (`get_f32` rounds an `f64`); bool, string and array accessors want exactly that type.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

macro_rules! int_accessors {
    ($($t:ty, $get:ident, $opt:ident);* $(;)?) => {$(
        #[doc = concat!("The `", stringify!($t), "` at `key` (any integer type that fits); an error if missing.")]
        pub fn $get(&self, key: &str) -> Result<$t> {
            self.$opt(key)?.ok_or_else(|| Error::new(ErrorKind::MissingKey).with_key(key))
        }
        #[doc = concat!("The `", stringify!($t), "` at `key` (any integer type that fits), or `None` if absent.")]
        pub fn $opt(&self, key: &str) -> Result<Option<$t>> {
            self.get(key)
                .map(|v| int_to::<$t>(v, stringify!($t)).map_err(|k| Error::new(k).with_key(key)))
                .transpose()
        }
    )*};
}

macro_rules! int_array_accessors {
    ($($t:ty, $variant:ident, $get:ident, $opt:ident);* $(;)?) => {$(
        #[doc = concat!("The integer array at `key` as `", stringify!($t), "`s: borrowed when stored as `",
                        stringify!($t), "`, converted from any other integer element type when every element fits.")]
        pub fn $get(&self, key: &str) -> Result<Cow<'_, [$t]>> {
            self.$opt(key)?.ok_or_else(|| Error::new(ErrorKind::MissingKey).with_key(key))
        }
        #[doc = concat!("Like [`Metadata::", stringify!($get), "`], or `None` if absent.")]
        pub fn $opt(&self, key: &str) -> Result<Option<Cow<'_, [$t]>>> {
            let Some(a) = self.opt_array(key)? else { return Ok(None) };
            if let Array::$variant(v) = a {
                return Ok(Some(Cow::Borrowed(v)));
            }
            let expected = concat!("array of ", stringify!($t));
            let wrong = || Error::new(ErrorKind::WrongType {
                expected,
                found: format!("array of {}", a.elem_type().name()),
            }).with_key(key);
            let ints = a.ints().ok_or_else(wrong)?;
            let out = ints
                .into_iter()
                .map(|i| <$t>::try_from(i).map_err(|_| Error::new(ErrorKind::OutOfRange {
                    value: i.to_string(),
                    target: stringify!($t),
                }).with_key(key)))
                .collect::<Result<Vec<$t>>>()?;
            Ok(Some(Cow::Owned(out)))
        }
    )*};
}

impl Metadata {
    /// An empty table.
    pub fn new() -> Metadata {
        Metadata::default()
    }

    /// Adds `key`; returns false (and changes nothing) when the key is already present.
    pub(crate) fn insert(&mut self, key: String, value: Value) -> bool {
        if self.index.contains_key(&key) {
            return false;
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        true
    }

    /// The value at `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// True when `key` is present.
    pub fn contains(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// Keys and values in file order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when there are no keys.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn wrong(key: &str, expected: &'static str, v: &Value) -> Error {
        Error::new(ErrorKind::WrongType {
            expected,
            found: v.type_name(),
        })
        .with_key(key)
    }

    int_accessors! {
        u8, get_u8, opt_u8;
        u16, get_u16, opt_u16;
        u32, get_u32, opt_u32;
        u64, get_u64, opt_u64;
        i32, get_i32, opt_i32;
        i64, get_i64, opt_i64;
        usize, get_usize, opt_usize;
    }

    int_array_accessors! {
        u32, U32, get_arr_u32, opt_arr_u32;
        i32, I32, get_arr_i32, opt_arr_i32;
        u64, U64, get_arr_u64, opt_arr_u64;
        i64, I64, get_arr_i64, opt_arr_i64;
    }

    /// The `f32` at `key` (an `f64` is rounded); an error if missing.
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        self.opt_f32(key)?
            .ok_or_else(|| Error::new(ErrorKind::MissingKey).with_key(key))
    }

    /// The `f32` at `key` (an `f64` is rounded), or `None` if absent.
    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::F32(v)) => Ok(Some(*v)),
            Some(Value::F64(v)) => Ok(Some(*v as f32)),
            Some(v) => Err(Self::wrong(key, "f32", v)),
        }
    }

    /// The `f64` at `key` (an `f32` is widened); an error if missing.
    pub fn get_f64(&self, key: &str) -> Result<f64> {
        self.opt_f64(key)?
            .ok_or_else(|| Error::new(ErrorKind::MissingKey).with_key(key))
    }

    /// The `f64` at `key` (an `f32` is widened), or `None` if absent.
    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::F32(v)) => Ok(Some(f64::from(*v))),
            Some(Value::F64(v)) => Ok(Some(*v)),
            Some(v) => Err(Self::wrong(key, "f64", v)),
        }
    }

    /// The bool at `key`; an error if missing.
    pub fn get_bool(&self, key: &str) -> Result<bool> {
        self.opt_bool(key)?
            .ok_or_else(|| Error::new(ErrorKind::MissingKey).with_key(key))
    }

    /// The bool at `key`, or `None` if absent.
    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(v)) => Ok(Some(*v)),
            Some(v) => Err(Self::wrong(key, "bool", v)),
        }
    }

    /// The string at `key`; an error if missing.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        self.opt_str(key)?
            .ok_or_else(|| Error::new(ErrorKind::MissingKey).with_key(key))
    }

    /// The string at `key`, or `None` if absent.
    pub fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(v)) => Ok(Some(v)),
            Some(v) => Err(Self::wrong(key, "string", v)),
        }
    }

    /// The array (any element type) at `key`; an error if missing.
    pub fn get_array(&self, key: &str) -> Result<&Array> {
        self.opt_array(key)?
            .ok_or_else(|| Error::new(ErrorKind::MissingKey).with_key(key))
    }

    /// The array (any element type) at `key`, or `None` if absent.
    pub fn opt_array(&self, key: &str) -> Result<Option<&Array>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(v) => Err(Self::wrong(key, "array", v)),
        }
    }

    /// The string array at `key` (e.g. `tokenizer.ggml.tokens`); an error if missing.
    pub fn get_arr_str(&self, key: &str) -> Result<&[String]> {
        self.opt_arr_str(key)?
            .ok_or_else(|| Error::new(ErrorKind::MissingKey).with_key(key))
    }

    /// The string array at `key`, or `None` if absent.
    pub fn opt_arr_str(&self, key: &str) -> Result<Option<&[String]>> {
        match self.opt_array(key)? {
            None => Ok(None),
            Some(Array::String(v)) => Ok(Some(v)),
            Some(a) => Err(Error::new(ErrorKind::WrongType {
                expected: "array of string",
                found: format!("array of {}", a.elem_type().name()),
            })
            .with_key(key)),
        }
    }

    /// The `f32` array at `key` (e.g. `tokenizer.ggml.scores`); an error if missing.
    pub fn get_arr_f32(&self, key: &str) -> Result<&[f32]> {
        self.opt_arr_f32(key)?
            .ok_or_else(|| Error::new(ErrorKind::MissingKey).with_key(key))
    }

    /// The `f32` array at `key`, or `None` if absent.
    pub fn opt_arr_f32(&self, key: &str) -> Result<Option<&[f32]>> {
        match self.opt_array(key)? {
            None => Ok(None),
            Some(Array::F32(v)) => Ok(Some(v)),
            Some(a) => Err(Error::new(ErrorKind::WrongType {
                expected: "array of f32",
                found: format!("array of {}", a.elem_type().name()),
            })
            .with_key(key)),
        }
    }
}

impl<'a> IntoIterator for &'a Metadata {
    type Item = (&'a str, &'a Value);
    type IntoIter = Box<dyn ExactSizeIterator<Item = (&'a str, &'a Value)> + 'a>;
    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Metadata {
        let mut m = Metadata::new();
        assert!(m.insert("a.u32".into(), Value::U32(7)));
        assert!(m.insert("a.i32".into(), Value::I32(-1)));
        assert!(m.insert("a.u64big".into(), Value::U64(1 << 40)));
        assert!(m.insert("a.str".into(), Value::String("x".into())));
        assert!(m.insert("a.f64".into(), Value::F64(0.5)));
        assert!(m.insert("a.tt".into(), Value::Array(Array::U8(vec![1, 2]))));
        assert!(m.insert("a.neg".into(), Value::Array(Array::I64(vec![-1]))));
        assert!(!m.insert("a.u32".into(), Value::U32(8)), "duplicate");
        m
    }

    #[test]
    fn integer_accessors_convert_when_the_value_fits() {
        let m = table();
        assert_eq!(m.get_u32("a.u32").unwrap(), 7);
        assert_eq!(m.get_i64("a.u32").unwrap(), 7);
        assert_eq!(m.get_u8("a.u32").unwrap(), 7);
        assert_eq!(m.get_i32("a.i32").unwrap(), -1);
        assert_eq!(m.get_u64("a.u64big").unwrap(), 1 << 40);
        assert_eq!(
            m.get_u32("a.i32").unwrap_err().to_string(),
            "metadata key 'a.i32': value -1 does not fit in u32"
        );
        assert_eq!(
            m.get_u32("a.u64big").unwrap_err().to_string(),
            "metadata key 'a.u64big': value 1099511627776 does not fit in u32"
        );
        assert_eq!(m.opt_u32("nope").unwrap(), None);
        assert_eq!(
            m.get_u32("nope").unwrap_err().to_string(),
            "metadata key 'nope': missing"
        );
        assert_eq!(
            m.get_u32("a.str").unwrap_err().to_string(),
            "metadata key 'a.str': expected u32, found string"
        );
    }

    #[test]
    fn other_accessors_check_types() {
        let m = table();
        assert_eq!(m.get_f32("a.f64").unwrap(), 0.5);
        assert_eq!(m.get_f64("a.f64").unwrap(), 0.5);
        assert_eq!(m.get_str("a.str").unwrap(), "x");
        assert_eq!(
            m.get_bool("a.str").unwrap_err().to_string(),
            "metadata key 'a.str': expected bool, found string"
        );
        assert_eq!(
            m.get_arr_str("a.tt").unwrap_err().to_string(),
            "metadata key 'a.tt': expected array of string, found array of u8"
        );
        assert_eq!(&*m.get_arr_i32("a.tt").unwrap(), &[1, 2]);
        assert!(matches!(m.get_arr_i32("a.tt").unwrap(), Cow::Owned(_)));
        assert_eq!(
            m.get_arr_u32("a.neg").unwrap_err().to_string(),
            "metadata key 'a.neg': value -1 does not fit in u32"
        );
        assert_eq!(
            m.get_arr_f32("a.u32").unwrap_err().to_string(),
            "metadata key 'a.u32': expected array, found u32"
        );
        let keys: Vec<&str> = m.iter().map(|(k, _)| k).collect();
        assert_eq!(keys[0], "a.u32");
        assert_eq!(keys.len(), 7);
    }

    #[test]
    fn parsed_elements_are_at_most_3x_their_file_size() {
        // The bound the crate docs promise: the smallest array elements in a file are an empty string (8 bytes)
        // and an empty array (12 bytes: type + count).
        assert!(std::mem::size_of::<String>() <= 3 * 8);
        assert!(std::mem::size_of::<Array>() <= 3 * 12);
    }

    #[test]
    fn display_is_short_for_long_arrays() {
        assert_eq!(
            Value::Array(Array::String(vec!["en".into()])).to_string(),
            "[\"en\"]"
        );
        assert_eq!(
            Value::Array(Array::F32(vec![0.0; 100])).to_string(),
            "[100 × f32]"
        );
        assert_eq!(
            Value::Array(Array::Array(vec![
                Array::U8(vec![1]),
                Array::empty(ValueType::Bool)
            ]))
            .to_string(),
            "[[1], []]"
        );
    }
}
