//! Bit-for-bit comparison against the `gguf` Python package (the oracle), through fixtures written by
//! tools/gen_quant_fixtures.py: for every type the package dequantizes, random valid blocks and its f32
//! output; for every type it quantizes, f32 inputs (random rows plus edge cases) and its bytes.
//!
//! Floats are compared by bits, so -0.0 differs from 0.0 and a NaN equals a NaN only with the same
//! payload. One documented deviation: numpy widens a signalling f16 NaN to a signalling f32 NaN, while
//! ggml's C code (F16C `vcvtph2ps`, or its portable bit-trick conversion, which multiplies by a power of
//! two) returns it quiet, as does kiln. For F16 the oracle's NaNs are therefore compared with the quiet
//! bit set ([`ggml_f16_nan`]). Everywhere else the package agrees with ggml's C code on these inputs
//! (round-half-away for Q8_0, truncating casts for Q4_0..Q5_1, nearest-even f16/bf16).
//!
//! In every dequantization formula the products of an f16 scale with small integers are exact in f32, so
//! only a final add or subtract rounds: these fixtures check the decoding (bit layouts, offsets, tables).
//! Operation order is observable in the quantizers, and the tie and sign cases below exercise it.

use kiln_quant::{dequantize, quantize, GgmlType};

const FIXTURE_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

/// Types with an oracle fixture, by file name.
const FIXTURES: [(&str, GgmlType); 15] = [
    ("f32", GgmlType::F32),
    ("f16", GgmlType::F16),
    ("bf16", GgmlType::BF16),
    ("q4_0", GgmlType::Q4_0),
    ("q4_1", GgmlType::Q4_1),
    ("q5_0", GgmlType::Q5_0),
    ("q5_1", GgmlType::Q5_1),
    ("q8_0", GgmlType::Q8_0),
    ("q2_k", GgmlType::Q2_K),
    ("q3_k", GgmlType::Q3_K),
    ("q4_k", GgmlType::Q4_K),
    ("q5_k", GgmlType::Q5_K),
    ("q6_k", GgmlType::Q6_K),
    ("iq2_xxs", GgmlType::IQ2_XXS),
    ("iq4_nl", GgmlType::IQ4_NL),
];

/// The types the package quantizes; their fixtures must carry a quantization case.
const QUANTIZED: [GgmlType; 8] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
];

struct Fixture {
    deq_raw: Vec<u8>,
    deq_out: Vec<f32>,
    q_in: Vec<f32>,
    q_bytes: Vec<u8>,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    name: &'a str,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        assert!(
            n <= self.buf.len() - self.pos,
            "fixture {}: truncated at byte {} (wanted {n} more); regenerate with tools/gen_quant_fixtures.py",
            self.name,
            self.pos
        );
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        s
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().unwrap())
    }
    fn f32s(&mut self, n: usize) -> Vec<f32> {
        self.take(4 * n)
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }
}

fn row_bytes(ty: GgmlType, n: usize) -> usize {
    ty.row_bytes(n as u64)
        .expect("fixture element count is whole blocks") as usize
}

fn load(name: &str, ty: GgmlType) -> Fixture {
    let path = format!("{FIXTURE_DIR}/{name}.bin");
    let buf = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}; regenerate with tools/gen_quant_fixtures.py"));
    let mut c = Cursor {
        buf: &buf,
        pos: 0,
        name,
    };
    assert_eq!(c.take(4), b"KQF1", "{name}: bad magic");
    assert_eq!(c.u32(), ty.id(), "{name}: type id");
    let n = c.u32() as usize;
    let deq_raw = c.take(row_bytes(ty, n)).to_vec();
    let deq_out = c.f32s(n);
    let nq = c.u32() as usize;
    let q_in = c.f32s(nq);
    let q_bytes = c.take(row_bytes(ty, nq)).to_vec();
    assert_eq!(c.pos, buf.len(), "{name}: trailing bytes");
    Fixture {
        deq_raw,
        deq_out,
        q_in,
        q_bytes,
    }
}

/// Index of the first element whose bits differ, with both values.
fn first_bit_difference(got: &[f32], want: &[f32]) -> Option<(usize, f32, f32)> {
    got.iter()
        .zip(want)
        .position(|(a, b)| a.to_bits() != b.to_bits())
        .map(|i| (i, got[i], want[i]))
}

/// What ggml's C code gives for an f16 NaN the oracle widened without quieting.
fn ggml_f16_nan(v: f32) -> f32 {
    if v.is_nan() {
        f32::from_bits(v.to_bits() | 0x0040_0000)
    } else {
        v
    }
}

#[test]
fn dequantize_matches_the_python_oracle_bit_for_bit() {
    for (name, ty) in FIXTURES {
        let f = load(name, ty);
        assert!(!f.deq_out.is_empty(), "{name}: no dequantization case");
        let want: Vec<f32> = if ty == GgmlType::F16 {
            f.deq_out.iter().map(|&v| ggml_f16_nan(v)).collect()
        } else {
            f.deq_out.clone()
        };
        let mut got = vec![f32::from_bits(0x7fa5_a5a5); want.len()];
        dequantize(ty, &f.deq_raw, &mut got).unwrap();
        if let Some((i, g, w)) = first_bit_difference(&got, &want) {
            panic!(
                "{name}: element {i} (block {}) is {g:e} ({:#010x}), oracle {w:e} ({:#010x})",
                i / ty.block_elems(),
                g.to_bits(),
                w.to_bits()
            );
        }
        // The same bytes at an odd address take the copying path and must give the same bits.
        let mut shifted = vec![0u8; f.deq_raw.len() + 1];
        shifted[1..].copy_from_slice(&f.deq_raw);
        got.fill(f32::from_bits(0x7fa5_a5a5));
        dequantize(ty, &shifted[1..], &mut got).unwrap();
        assert!(
            first_bit_difference(&got, &want).is_none(),
            "{name}: unaligned source differs"
        );
    }
}

#[test]
fn quantize_matches_the_python_oracle_bit_for_bit() {
    for (name, ty) in FIXTURES {
        let f = load(name, ty);
        if !QUANTIZED.contains(&ty) {
            assert!(f.q_in.is_empty(), "{name}: unexpected quantization case");
            continue;
        }
        assert!(!f.q_in.is_empty(), "{name}: no quantization case");
        let mut got = vec![0xa5u8; f.q_bytes.len()];
        quantize(ty, &f.q_in, &mut got).unwrap();
        let bb = ty.block_bytes();
        for (blk, (g, w)) in got.chunks(bb).zip(f.q_bytes.chunks(bb)).enumerate() {
            let be = ty.block_elems();
            assert_eq!(
                g,
                w,
                "{name}: block {blk} differs from the oracle; input {:?}",
                &f.q_in[blk * be..(blk + 1) * be]
            );
        }
    }
}
