//! Random tensor data, generated directly in the on-disk format: floats drawn uniformly, and quantized blocks
//! made of random quant bits under fixed scale fields chosen so that the dequantized weights have the requested
//! standard deviation and (near) zero mean. No quantization search is run, so an 8B model is a matter of
//! memory bandwidth.
//!
//! Determinism: a tensor's bytes depend only on (seed, tensor name); they are produced in fixed chunks of
//! blocks, each from its own generator seeded by (tensor seed, chunk index), so the output is the same for
//! any thread count.

use half::{bf16, f16};
use kiln_quant::blocks::*;
use kiln_quant::GgmlType;
use rayon::prelude::*;

/// SplitMix64 (Steele, Lea, Flood): tiny, fast, and a fixed published algorithm, so files are reproducible.
#[derive(Debug, Clone)]
pub(crate) struct SplitMix64(u64);

impl SplitMix64 {
    pub(crate) fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    fn next_sym(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32) * (2.0 / (1u64 << 24) as f32) - 1.0
    }
    fn fill(&mut self, out: &mut [u8]) {
        for c in out.chunks_mut(8) {
            let r = self.next_u64().to_le_bytes();
            c.copy_from_slice(&r[..c.len()]);
        }
    }
}

/// A seed for one tensor: the model seed mixed with an FNV-1a hash of the name.
pub(crate) fn tensor_seed(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    SplitMix64::new(seed ^ h.rotate_left(17)).next_u64()
}

/// How a tensor's values are distributed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// Zero mean, this standard deviation (uniform distribution).
    Std(f32),
    /// `center ± spread` uniformly (norm weights: around 1).
    Around {
        /// Mean.
        center: f32,
        /// Half-width.
        spread: f32,
    },
}

/// Elements generated per chunk (a multiple of every block size).
const CHUNK_ELEMS: usize = 1 << 16;

/// Fills `out` (exactly `ty.row_bytes(n)` bytes for `n` elements) with random data of type `ty`.
/// Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K; `Init::Around` only for floats.
pub(crate) fn fill_tensor(ty: GgmlType, init: Init, seed: u64, out: &mut [u8]) {
    let elem_chunk_bytes = CHUNK_ELEMS / ty.block_elems() * ty.block_bytes();
    out.par_chunks_mut(elem_chunk_bytes)
        .enumerate()
        .for_each(|(i, chunk)| {
            let mut rng = SplitMix64::new(seed ^ (i as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93));
            fill_chunk(ty, init, &mut rng, chunk);
        });
}

/// `(center, half-width)` of a uniform distribution with this init.
fn uniform(init: Init) -> (f32, f32) {
    match init {
        Init::Std(s) => (0.0, s * 3f32.sqrt()),
        Init::Around { center, spread } => (center, spread),
    }
}

fn std_of(init: Init) -> f32 {
    match init {
        Init::Std(s) => s,
        // Only floats take `Around`; callers never ask blocks for it (a norm is 1-D, kept F32).
        Init::Around { spread, .. } => spread / 3f32.sqrt(),
    }
}

/// Standard deviations of a uniform random integer of `bits` bits: sqrt((2^2b − 1) / 12).
fn uniform_int_std(bits: u32) -> f32 {
    (((1u64 << (2 * bits)) - 1) as f32 / 12.0).sqrt()
}

/// Random blocks of type `B`; `set` writes the scale fields, given a random sign. Formats whose quant levels
/// are not symmetric around zero (Q4_0: q − 8 for q in 0..16 has mean −0.5) get zero-mean weights overall by
/// flipping the scale's sign on a random half of the blocks.
fn blocks<B: bytemuck::Pod>(chunk: &mut [u8], rng: &mut SplitMix64, set: impl Fn(&mut B, f32)) {
    let n = std::mem::size_of::<B>();
    for c in chunk.chunks_exact_mut(n) {
        rng.fill(c);
        let sign = if rng.next_u64() & 1 == 0 { 1.0 } else { -1.0 };
        let mut b: B = bytemuck::pod_read_unaligned(c);
        set(&mut b, sign);
        c.copy_from_slice(bytemuck::bytes_of(&b));
    }
}

/// Packs eight 6-bit (scale, min) pairs the way Q4_K and Q5_K store them (ggml's `get_scale_min_k4`, inverted).
fn pack_k4_scales(sc: u8, m: u8) -> [u8; 12] {
    let mut q = [0u8; 12];
    for j in 0..4 {
        q[j] = (sc & 63) | ((sc >> 4) << 6);
        q[j + 4] = (m & 63) | ((m >> 4) << 6);
        q[j + 8] = (sc & 0xF) | ((m & 0xF) << 4);
    }
    q
}

fn fill_chunk(ty: GgmlType, init: Init, rng: &mut SplitMix64, chunk: &mut [u8]) {
    let s = std_of(init);
    let h = |x: f32| f16::from_f32(x);
    match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {
            let (c, w) = uniform(init);
            let n = ty.block_bytes();
            for e in chunk.chunks_exact_mut(n) {
                let x = c + w * rng.next_sym();
                match ty {
                    GgmlType::F32 => e.copy_from_slice(&x.to_le_bytes()),
                    GgmlType::F16 => e.copy_from_slice(&f16::from_f32(x).to_le_bytes()),
                    _ => e.copy_from_slice(&bf16::from_f32(x).to_le_bytes()),
                }
            }
        }
        // x = d (q − 8), q uniform in 0..16.
        GgmlType::Q4_0 => {
            let d = s / uniform_int_std(4);
            blocks(chunk, rng, |b: &mut BlockQ4_0, sign| b.d = h(sign * d));
        }
        // x = d q + m, m = −7.5 d centres it.
        GgmlType::Q4_1 => {
            let dv = s / uniform_int_std(4);
            let (d, m) = (h(dv), h(-7.5 * dv));
            blocks(chunk, rng, |b: &mut BlockQ4_1, _| (b.d, b.m) = (d, m));
        }
        // x = d (q − 16), q uniform in 0..32.
        GgmlType::Q5_0 => {
            let d = s / uniform_int_std(5);
            blocks(chunk, rng, |b: &mut BlockQ5_0, sign| b.d = h(sign * d));
        }
        GgmlType::Q5_1 => {
            let dv = s / uniform_int_std(5);
            let (d, m) = (h(dv), h(-15.5 * dv));
            blocks(chunk, rng, |b: &mut BlockQ5_1, _| (b.d, b.m) = (d, m));
        }
        // x = d q, q uniform over all of i8 (mean −0.5).
        GgmlType::Q8_0 => {
            let d = s / uniform_int_std(8);
            blocks(chunk, rng, |b: &mut BlockQ8_0, sign| b.d = h(sign * d));
        }
        // x = d·sc·q − dmin·m with q in 0..16: sc = 8, m = 60, dmin = d gives mean d(8·7.5 − 60) = 0.
        GgmlType::Q4_K => {
            let d = h(s / (8.0 * uniform_int_std(4)));
            let scales = pack_k4_scales(8, 60);
            blocks(chunk, rng, |b: &mut BlockQ4K, _| {
                (b.d, b.dmin, b.scales) = (d, d, scales);
            });
        }
        // q in 0..32: sc = 4, m = 62, dmin = d gives mean d(4·15.5 − 62) = 0.
        GgmlType::Q5_K => {
            let d = h(s / (4.0 * uniform_int_std(5)));
            let scales = pack_k4_scales(4, 62);
            blocks(chunk, rng, |b: &mut BlockQ5K, _| {
                (b.d, b.dmin, b.scales) = (d, d, scales);
            });
        }
        // x = d·sc·(q − 32), q in 0..64, sc = 16 (mean −0.5·16·d).
        GgmlType::Q6_K => {
            let d = s / (16.0 * uniform_int_std(6));
            blocks(chunk, rng, |b: &mut BlockQ6K, sign| {
                (b.d, b.scales) = (h(sign * d), [16; 16]);
            });
        }
        GgmlType::Q8_1
        | GgmlType::Q2_K
        | GgmlType::Q3_K
        | GgmlType::Q8_K
        | GgmlType::IQ2_XXS
        | GgmlType::IQ4_NL => unreachable!("synth plans never pick {ty}: see quant_mix::SUPPORTED"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mean and std of dequantized random data, for every supported type.
    #[test]
    fn dequantized_statistics_match_the_request() {
        let n = 1 << 16;
        for ty in super::super::quant_mix::SUPPORTED {
            let mut bytes = vec![0u8; ty.row_bytes(n as u64).unwrap() as usize];
            fill_tensor(ty, Init::Std(0.02), 7, &mut bytes);
            let mut x = vec![0f32; n];
            kiln_quant::dequantize(ty, &bytes, &mut x).unwrap();
            let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
            let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64;
            assert!(mean.abs() < 0.0003, "{ty}: mean {mean}");
            assert!(
                (var.sqrt() - 0.02).abs() < 0.001,
                "{ty}: std {}",
                var.sqrt()
            );
        }
    }

    #[test]
    fn norm_init_is_centred_on_one() {
        let mut bytes = vec![0u8; 4 * 1000];
        fill_tensor(
            GgmlType::F32,
            Init::Around {
                center: 1.0,
                spread: 0.1,
            },
            1,
            &mut bytes,
        );
        let x: Vec<f32> = bytes
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert!(x.iter().all(|&v| (0.9..1.1).contains(&v)));
        let mean = x.iter().sum::<f32>() / 1000.0;
        assert!((mean - 1.0).abs() < 0.01);
    }

    #[test]
    fn same_seed_same_bytes_any_chunking() {
        let n = 3 * CHUNK_ELEMS + 256;
        let ty = GgmlType::Q4_K;
        let mut a = vec![0u8; ty.row_bytes(n as u64).unwrap() as usize];
        let mut b = a.clone();
        fill_tensor(ty, Init::Std(0.1), 9, &mut a);
        rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap()
            .install(|| fill_tensor(ty, Init::Std(0.1), 9, &mut b));
        assert_eq!(a, b);
        fill_tensor(ty, Init::Std(0.1), 10, &mut b);
        assert_ne!(a, b);
        assert_ne!(tensor_seed(1, "a"), tensor_seed(1, "b"));
    }
}
