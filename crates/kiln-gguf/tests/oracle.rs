//! Cross-checks against the independent `gguf` Python package: kiln reads the fixture written by
//! tools/gen_gguf_fixtures.py and gets exactly the values the script wrote; kiln writes the file the script's
//! `--check` mode verifies; and every value type survives a kiln write → read round trip.

use kiln_gguf::{Array, GgufFile, GgufWriter, Value, ValueType};
use kiln_quant::GgmlType;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/oracle_all_types.gguf"
);

/// Byte `k` of the quantized tensors' data in the fixture.
fn pattern(n: usize, seed: usize) -> Vec<u8> {
    (0..n).map(|k| ((k * 7 + seed) % 256) as u8).collect()
}

#[test]
fn reads_every_value_type_written_by_the_python_writer() {
    let f = GgufFile::open(FIXTURE).unwrap();
    let md = f.metadata();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 64);
    assert_eq!(md.len(), 29);
    let keys: Vec<&str> = md.iter().map(|(k, _)| k).take(4).collect();
    assert_eq!(
        keys,
        [
            "general.architecture",
            "general.alignment",
            "general.name",
            "t.u8"
        ]
    );

    let scalars = [
        ("t.u8", Value::U8(200)),
        ("t.i8", Value::I8(-100)),
        ("t.u16", Value::U16(60000)),
        ("t.i16", Value::I16(-30000)),
        ("t.u32", Value::U32(4_000_000_000)),
        ("t.i32", Value::I32(-2_000_000_000)),
        ("t.f32", Value::F32(1.5)),
        ("t.bool", Value::Bool(true)),
        ("t.string", Value::String("héllo, gguf ✓".into())),
        ("t.u64", Value::U64((1 << 63) + 5)),
        ("t.i64", Value::I64(-(1 << 62))),
        ("t.f64", Value::F64(-0.1)),
        ("general.alignment", Value::U32(64)),
        ("general.architecture", Value::String("llama".into())),
    ];
    for (k, v) in scalars {
        assert_eq!(md.get(k), Some(&v), "{k}");
    }
    let arrays = [
        ("a.u8", Array::U8(vec![0, 1, 255])),
        ("a.i8", Array::I8(vec![-128, 0, 127])),
        ("a.u16", Array::U16(vec![1, 65535])),
        ("a.i16", Array::I16(vec![-32768, 32767])),
        ("a.u32", Array::U32(vec![7, u32::MAX])),
        ("a.i32", Array::I32(vec![-1, 2, -3])),
        ("a.f32", Array::F32(vec![0.5, -2.25, 1e-7])),
        ("a.bool", Array::Bool(vec![true, false, true])),
        (
            "a.string",
            Array::String(vec!["a".into(), "".into(), "ü".into()]),
        ),
        ("a.u64", Array::U64(vec![0, u64::MAX])),
        ("a.i64", Array::I64(vec![i64::MIN, i64::MAX])),
        ("a.f64", Array::F64(vec![3.25, -1e300])),
        (
            "n.mixed",
            Array::Array(vec![
                Array::I32(vec![1, 2, 3]),
                Array::String(vec!["x".into(), "yz".into()]),
                Array::F32(vec![0.5]),
            ]),
        ),
        (
            "n.deep",
            Array::Array(vec![
                Array::Array(vec![Array::I32(vec![1]), Array::I32(vec![2, 3])]),
                Array::Array(vec![Array::I32(vec![4])]),
            ]),
        ),
    ];
    for (k, a) in arrays {
        assert_eq!(md.get(k), Some(&Value::Array(a)), "{k}");
    }

    // Typed accessors on the same values.
    assert_eq!(md.get_u32("t.u32").unwrap(), 4_000_000_000);
    assert_eq!(md.get_i64("t.u32").unwrap(), 4_000_000_000);
    assert_eq!(md.get_u64("t.u64").unwrap(), (1 << 63) + 5);
    assert_eq!(md.get_f64("t.f64").unwrap(), -0.1);
    assert!(md.get_bool("t.bool").unwrap());
    assert_eq!(md.get_str("general.name").unwrap(), "kiln oracle fixture");
    assert_eq!(md.get_arr_str("a.string").unwrap(), ["a", "", "ü"]);
    assert_eq!(md.get_arr_f32("a.f32").unwrap(), [0.5, -2.25, 1e-7]);
    assert_eq!(&*md.get_arr_i32("a.u16").unwrap(), [1, 65535]);
    assert_eq!(
        md.get_i32("t.u32").unwrap_err().to_string(),
        "metadata key 't.u32': value 4000000000 does not fit in i32"
    );

    // Tensors: names, types, ggml-order shapes, aligned absolute offsets and exact bytes.
    let t: Vec<(&str, GgmlType, &[u64])> = f
        .tensors()
        .iter()
        .map(|t| (t.name.as_str(), t.ty, t.shape.as_slice()))
        .collect();
    assert_eq!(
        t,
        [
            ("t.f32", GgmlType::F32, &[5, 3][..]),
            ("t.f16", GgmlType::F16, &[8][..]),
            ("t.q8_0", GgmlType::Q8_0, &[32, 2][..]),
            ("t.q4_k", GgmlType::Q4_K, &[256, 1][..]),
            ("t.q6_k", GgmlType::Q6_K, &[256, 3][..]),
        ]
    );
    // Offsets as reported by the Python reader for this fixture.
    let offsets: Vec<u64> = f.tensors().iter().map(|t| t.offset).collect();
    assert_eq!(offsets, [1344, 1408, 1472, 1600, 1792]);
    let f32s: Vec<f32> = f
        .tensor_bytes("t.f32")
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let want: Vec<f32> = (0..15).map(|i| i as f32 * 0.25 - 1.0).collect();
    assert_eq!(f32s, want);
    let f16s: Vec<u16> = f
        .tensor_bytes("t.f16")
        .unwrap()
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes(c.try_into().unwrap()))
        .collect();
    // i/8 for i in 0..8 as IEEE half: exact, so compare bits.
    let want: Vec<u16> = [
        0x0000, 0x3000, 0x3400, 0x3600, 0x3800, 0x3900, 0x3a00, 0x3b00,
    ]
    .to_vec();
    assert_eq!(f16s, want);
    assert_eq!(f.tensor_bytes("t.q8_0").unwrap(), pattern(68, 11));
    assert_eq!(f.tensor_bytes("t.q4_k").unwrap(), pattern(144, 13));
    assert_eq!(f.tensor_bytes("t.q6_k").unwrap(), pattern(630, 17));
    assert_eq!(f.file_size(), 2432);
}

/// Every value in the fixture, written by kiln, reads back identical; the tensor layout too.
#[test]
fn round_trips_the_fixture_through_the_kiln_writer() {
    let src = GgufFile::open(FIXTURE).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata().iter() {
        w.add(k, v.clone()).unwrap();
    }
    for t in src.tensors() {
        w.add_tensor(&t.name, t.ty, &t.shape).unwrap();
    }
    let mut d = w.begin(Vec::new()).unwrap();
    for t in src.tensors() {
        d.write_tensor_data(&t.name, src.tensor_data(t)).unwrap();
    }
    let bytes = d.finish().unwrap();
    let back = GgufFile::from_bytes(bytes.clone()).unwrap();
    assert_eq!(back.metadata(), src.metadata());
    assert_eq!(back.alignment(), 64);
    for (a, b) in src.tensors().iter().zip(back.tensors()) {
        assert_eq!(
            (&a.name, a.ty, &a.shape, a.size),
            (&b.name, b.ty, &b.shape, b.size)
        );
        assert_eq!(src.tensor_data(a), back.tensor_data(b));
    }
    // Same layout rules as the Python writer: byte-identical output.
    assert_eq!(bytes, src.as_bytes());
}

/// Empty arrays of every element type and deep nesting, which the Python writer cannot produce.
#[test]
fn round_trips_empty_and_nested_arrays() {
    let types = [
        ValueType::U8,
        ValueType::I8,
        ValueType::U16,
        ValueType::I16,
        ValueType::U32,
        ValueType::I32,
        ValueType::F32,
        ValueType::Bool,
        ValueType::String,
        ValueType::Array,
        ValueType::U64,
        ValueType::I64,
        ValueType::F64,
    ];
    let mut w = GgufWriter::new();
    for ty in types {
        w.add(&format!("empty.{}", ty.name()), Array::empty(ty))
            .unwrap();
    }
    let mut deep = Array::Bool(vec![true]);
    for _ in 1..kiln_gguf::MAX_NESTING {
        deep = Array::Array(vec![deep, Array::empty(ValueType::F64)]);
    }
    w.add("deep", deep.clone()).unwrap();
    let f = GgufFile::from_bytes(w.begin(Vec::new()).unwrap().finish().unwrap()).unwrap();
    for ty in types {
        let a = f
            .metadata()
            .get_array(&format!("empty.{}", ty.name()))
            .unwrap();
        assert_eq!((a.elem_type(), a.len()), (ty, 0));
    }
    assert_eq!(f.metadata().get("deep"), Some(&Value::Array(deep)));
    assert!(f.tensors().is_empty());
}

/// Writes the file `tools/gen_gguf_fixtures.py --check` verifies with the Python reader, and checks it here.
/// The copy is left at `$CARGO_TARGET_TMPDIR/kiln_written.gguf` for that script.
#[test]
fn kiln_written_file() {
    let src = GgufFile::open(FIXTURE).unwrap();
    let mut w = GgufWriter::new();
    w.set_alignment(64).unwrap();
    for (k, v) in src.metadata().iter() {
        if k.starts_with("t.") || k.starts_with("a.") {
            w.add(k, v.clone()).unwrap();
        }
    }
    w.add_tensor("w.f32", GgmlType::F32, &[5, 3]).unwrap();
    w.add_tensor("w.q8_0", GgmlType::Q8_0, &[32, 2]).unwrap();
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("kiln_written.gguf");
    let out = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    let mut d = w.begin(out).unwrap();
    let f32s: Vec<u8> = (0..15)
        .flat_map(|i| (i as f32 * 0.5).to_le_bytes())
        .collect();
    d.write_tensor_data("w.f32", &f32s).unwrap();
    d.write_tensor_data("w.q8_0", &pattern(68, 5)).unwrap();
    d.finish().unwrap();

    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.metadata().len(), 25);
    assert_eq!(f.metadata().get("t.i16"), Some(&Value::I16(-30000)));
    assert_eq!(f.tensor_bytes("w.f32").unwrap(), f32s);
    assert_eq!(f.tensor_bytes("w.q8_0").unwrap(), pattern(68, 5));
    assert_eq!(f.tensor("w.q8_0").unwrap().offset % 64, 0);
}
