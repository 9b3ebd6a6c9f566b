//! Truncated, corrupt and hostile files: each must give a specific error, never a panic or a huge allocation.

use kiln_gguf::{ErrorKind, GgufFile, GgufWriter};
use kiln_quant::GgmlType;

/// Hand-assembles GGUF bytes, so tests can write what no writer would.
#[derive(Default)]
struct Raw(Vec<u8>);

impl Raw {
    fn header(version: u32, tensors: u64, kvs: u64) -> Raw {
        let mut r = Raw(b"GGUF".to_vec());
        r.u32(version).u64(tensors).u64(kvs);
        r
    }
    fn u32(&mut self, v: u32) -> &mut Raw {
        self.0.extend(v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Raw {
        self.0.extend(v.to_le_bytes());
        self
    }
    fn str(&mut self, s: &str) -> &mut Raw {
        self.u64(s.len() as u64);
        self.0.extend(s.as_bytes());
        self
    }
    fn kv_u32(&mut self, k: &str, v: u32) -> &mut Raw {
        self.str(k).u32(4).u32(v)
    }
    fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut Raw {
        self.str(name).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    /// Pads to 32 and appends `n` data bytes.
    fn data(&mut self, n: usize) -> &mut Raw {
        let len = self.0.len().next_multiple_of(32);
        self.0.resize(len + n, 0xAB);
        self
    }
    fn open(&self) -> Result<GgufFile, kiln_gguf::Error> {
        GgufFile::from_bytes(self.0.clone())
    }
    fn err(&self) -> String {
        match self.open() {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.to_string(),
        }
    }
}

fn small_valid_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add("general.architecture", "llama").unwrap();
    w.add("a.f32s", vec![1.0f32, 2.0]).unwrap();
    w.add("a.strs", vec!["x", "yy"]).unwrap();
    w.add("a.bool", true).unwrap();
    w.add_tensor("t0", GgmlType::F32, &[3, 2]).unwrap();
    w.add_tensor("t1", GgmlType::Q8_0, &[32]).unwrap();
    let mut d = w.begin(Vec::new()).unwrap();
    d.write_tensor_data("t0", &[1; 24]).unwrap();
    d.write_tensor_data("t1", &[2; 34]).unwrap();
    d.finish().unwrap()
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = small_valid_file();
    let full = GgufFile::from_bytes(bytes.clone()).unwrap();
    let end_of_data = full
        .tensors()
        .iter()
        .map(|t| t.offset + t.size)
        .max()
        .unwrap() as usize;
    assert!(end_of_data < bytes.len(), "the file ends with padding");
    for n in 0..bytes.len() {
        let r = GgufFile::from_bytes(bytes[..n].to_vec());
        if n < end_of_data {
            let e = r.expect_err(&format!("prefix of {n} bytes parsed"));
            let msg = e.to_string();
            assert!(
                msg.contains("needs")
                    || msg.contains("cannot fit")
                    || msg.contains("ends past the end"),
                "prefix {n}: {msg}"
            );
        } else {
            // Only trailing padding is missing: the data is all there.
            assert!(r.is_ok(), "prefix {n}");
        }
    }
    assert_eq!(
        GgufFile::from_bytes(bytes[..10].to_vec())
            .unwrap_err()
            .to_string(),
        "tensor count at offset 8 needs 8 bytes, but the file ends at 10"
    );
    assert_eq!(
        GgufFile::from_bytes(bytes[..end_of_data - 1].to_vec())
            .unwrap_err()
            .to_string(),
        format!(
            "tensor 't1': data range {}..{} ends past the end of the file ({} bytes)",
            end_of_data - 34,
            end_of_data,
            end_of_data - 1
        )
    );
}

#[test]
fn bad_magic_and_versions() {
    let mut b = small_valid_file();
    b[0] = b'X';
    assert_eq!(
        GgufFile::from_bytes(b).unwrap_err().to_string(),
        "not a gguf file: it starts with \"XGUF\", not \"GGUF\""
    );
    assert_eq!(
        Raw::header(1, 0, 0).err(),
        "gguf version 1 is not supported (kiln reads versions 2 and 3)"
    );
    assert_eq!(
        Raw::header(4, 0, 0).err(),
        "gguf version 4 is not supported (kiln reads versions 2 and 3)"
    );
    assert_eq!(
        Raw::header(3u32.swap_bytes(), 0, 0).err(),
        "big-endian gguf files are not supported"
    );
    assert_eq!(Raw::header(2, 0, 0).open().unwrap().version(), 2);
    let mut b = small_valid_file();
    b[..4].copy_from_slice(&[0, 0xff, b'\n', b'"']);
    assert_eq!(
        GgufFile::from_bytes(b).unwrap_err().to_string(),
        "not a gguf file: it starts with \"\\x00\\xff\\n\\\"\", not \"GGUF\""
    );
    assert_eq!(
        GgufFile::from_bytes(Vec::new()).unwrap_err().to_string(),
        "magic at offset 0 needs 4 bytes, but the file ends at 0"
    );
}

#[test]
fn absurd_counts_and_lengths_are_rejected_before_allocating() {
    let mut r = Raw::header(3, 1 << 60, 0);
    r.data(64);
    assert_eq!(
        r.err(),
        format!(
            "tensor count 1152921504606846976 at offset 8 cannot fit in the {} bytes left",
            r.0.len() - 16
        )
    );
    let r = Raw::header(3, 0, u64::MAX);
    assert!(r
        .err()
        .starts_with("metadata key count 18446744073709551615 at offset 16"));

    // A key whose length is 2^62.
    let mut r = Raw::header(3, 0, 1);
    r.u64(1 << 62).data(32);
    assert_eq!(
        r.err(),
        format!(
            "metadata key at offset 32 needs 4611686018427387904 bytes, but the file ends at {}",
            r.0.len()
        )
    );
    // A string value whose length is 2^62: the error names the key.
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(8).u64(1 << 62);
    assert_eq!(
        r.err(),
        "metadata key 'k': string at offset 45 needs 4611686018427387904 bytes, but the file ends at 45"
    );
    // An array of 2^61 u64: 2^64 bytes, overflowing the size check's multiplication.
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(9).u32(10).u64(1 << 61).data(100);
    assert!(r
        .err()
        .starts_with("metadata key 'k': array element count 2305843009213693952 at offset 41"));
    // An array of a million strings in a few bytes.
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(9).u32(8).u64(1_000_000).data(100);
    assert!(r
        .err()
        .starts_with("metadata key 'k': array element count 1000000 at offset 41 cannot fit"));
}

#[test]
fn nesting_bombs_are_rejected() {
    let mut r = Raw::header(3, 0, 1);
    r.str("bomb").u32(9);
    for _ in 0..100_000 {
        r.u32(9).u64(1);
    }
    assert_eq!(
        r.err(),
        format!(
            "metadata key 'bomb': arrays nested deeper than {} levels at offset {}",
            kiln_gguf::MAX_NESTING,
            24 + 12 + 4 + 12 * kiln_gguf::MAX_NESTING
        )
    );
}

#[test]
fn bad_metadata_values() {
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(13).u32(0);
    assert_eq!(
        r.err(),
        "metadata key 'k': unknown metadata value type 13 at offset 33"
    );
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(7);
    r.0.push(2);
    assert_eq!(
        r.err(),
        "metadata key 'k': bool at offset 37 is 2 (must be 0 or 1)"
    );
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(8).u64(2);
    r.0.extend([0xff, 0xfe]);
    assert_eq!(
        r.err(),
        "metadata key 'k': string at offset 45 is not valid utf-8"
    );
    let mut r = Raw::header(3, 0, 2);
    r.kv_u32("k", 1).kv_u32("k", 2);
    assert_eq!(
        r.err(),
        "metadata key 'k': duplicate metadata key (second copy at offset 41)"
    );
    let mut r = Raw::header(3, 0, 1);
    r.kv_u32("", 1);
    assert_eq!(r.err(), "empty name at offset 24");
}

#[test]
fn bad_alignment() {
    let mut r = Raw::header(3, 0, 1);
    r.kv_u32("general.alignment", 48);
    assert_eq!(
        r.err(),
        "metadata key 'general.alignment': alignment 48 is not a nonzero power of two"
    );
    let mut r = Raw::header(3, 0, 1);
    r.kv_u32("general.alignment", 0);
    assert!(r.err().contains("alignment 0 is not"));
    let mut r = Raw::header(3, 0, 1);
    r.str("general.alignment").u32(8).str("32");
    assert_eq!(
        r.err(),
        "metadata key 'general.alignment': expected u32, found string"
    );
}

#[test]
fn bad_tensor_infos() {
    let one = |dims: &[u64], ty: u32, offset: u64| {
        let mut r = Raw::header(3, 1, 0);
        r.tensor("w", dims, ty, offset).data(4096);
        r.err()
    };
    assert_eq!(one(&[8], 4, 0), "tensor 'w': unknown tensor type id 4");
    assert_eq!(
        one(&[8], 1000, 0),
        "tensor 'w': unknown tensor type id 1000"
    );
    assert_eq!(
        one(&[1, 1, 1, 1, 1], 0, 0),
        "tensor 'w': 5 dimensions (at most 4 are allowed)"
    );
    assert_eq!(
        one(&[8, 0], 0, 0),
        "tensor 'w': dimension 1 is 0 (must be 1..=2^63-1)"
    );
    assert_eq!(
        one(&[1 << 32, 1 << 32, 1 << 32], 0, 0),
        "tensor 'w': shape [4294967296, 4294967296, 4294967296] overflows the element count or byte size"
    );
    // Element count fits i64 but bytes (×4) overflow u64.
    assert!(one(&[1 << 31, 1 << 31, 1], 0, 0).contains("overflows"));
    assert_eq!(
        one(&[1 << 20, 1 << 20], 0, 0),
        "tensor 'w': data range 96..4398046511200 ends past the end of the file (4192 bytes)"
    );
    assert!(one(&[1 << 62, 1], 0, 0).contains("overflows"));
    assert_eq!(
        one(&[48, 2], 8, 0),
        "tensor 'w': row length 48 is not a multiple of the q8_0 block size 32"
    );
    assert_eq!(
        one(&[8], 0, 8),
        "tensor 'w': data offset 8 is not a multiple of the alignment 32"
    );
    assert!(one(&[8], 0, u64::MAX - 31).starts_with("tensor 'w': data range"));
    assert!(one(&[2048], 0, 0).ends_with("ends past the end of the file (4160 bytes)"));

    let mut r = Raw::header(3, 1, 0);
    r.tensor("", &[8], 0, 0).data(32);
    assert_eq!(r.err(), "empty name at offset 24");
}

#[test]
fn duplicate_and_overlapping_tensors() {
    let mut r = Raw::header(3, 2, 0);
    r.tensor("a", &[8], 0, 0).tensor("a", &[8], 0, 32).data(64);
    assert_eq!(
        r.err(),
        "tensor 'a': duplicate tensor name (second copy at offset 57)"
    );
    let mut r = Raw::header(3, 2, 0);
    r.tensor("a", &[16], 0, 0)
        .tensor("b", &[8], 0, 32)
        .data(128);
    let start = r.0.len() as u64 - 128;
    assert_eq!(
        r.err(),
        format!(
            "tensor 'b': data range {}..{} overlaps tensor 'a' ({}..{})",
            start + 32,
            start + 64,
            start,
            start + 64
        )
    );
    // Adjacent ranges are fine; file order need not be data order.
    let mut r = Raw::header(3, 2, 0);
    r.tensor("a", &[16], 0, 64)
        .tensor("b", &[16], 0, 0)
        .data(128);
    let f = r.open().unwrap();
    assert_eq!(f.tensors()[0].name, "a");
    assert_eq!(f.tensors()[0].offset, f.tensors()[1].offset + 64);
    assert_eq!(f.tensor_bytes("b").unwrap(), &[0xAB; 64]);
}

#[test]
fn scalar_tensors_and_kinds_are_inspectable() {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("s", &[], 0, 0).data(32);
    let f = r.open().unwrap();
    let s = f.tensor("s").unwrap();
    assert_eq!(
        (s.n_elements(), s.size, s.row_len(), s.n_rows()),
        (1, 4, 1, 1)
    );

    let mut r = Raw::header(3, 1, 0);
    r.tensor("w", &[8], 7777, 0).data(32);
    let e = r.open().unwrap_err();
    assert_eq!(e.tensor(), Some("w"));
    assert!(matches!(e.kind(), ErrorKind::UnknownTensorType(7777)));
}
