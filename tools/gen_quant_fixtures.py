#!/usr/bin/env python3
"""Writes the (de)quantization oracle fixtures of kiln-quant: crates/kiln-quant/tests/fixtures/<type>.bin.

The oracle is the `gguf` Python package (0.19): `gguf.quants.dequantize` and `gguf.quants.quantize`, numpy
re-implementations of ggml's reference C code. For every type it can dequantize, the fixture holds random
but valid blocks (random bytes with every f16 scale replaced by a finite f16, mostly |d| in [1e-3, 1], plus
a zero, a negative zero, the largest and a subnormal scale) and the package's f32 output. For every type it
can quantize, it also holds f32 inputs (random rows and edge cases) and the package's bytes.

File layout (all little-endian):
    b"KQF1", u32 ggml type id,
    u32 n_deq, row bytes of n_deq elements, n_deq f32       (dequantization case; n_deq may be 0)
    u32 n_q,   n_q f32 inputs, row bytes of n_q elements      (quantization case; n_q may be 0)

Usage: python3 tools/gen_quant_fixtures.py   (from the repository root; deterministic)
"""
import os
import struct

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

OUT_DIR = os.path.join(os.path.dirname(__file__), "..", "crates", "kiln-quant", "tests", "fixtures")

# Byte offsets of the f16 scale fields inside each block (ggml-common.h layouts).
SCALE_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.IQ2_XXS: [0], T.IQ4_NL: [0],
}
DEQ_TYPES = [T.F32, T.F16, T.BF16] + list(SCALE_FIELDS)
QUANT_TYPES = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]

# Special scales placed in the first blocks: +0, -0, f16 max, smallest subnormal, a mid subnormal.
SPECIAL_F16_BITS = [0x0000, 0x8000, 0x7BFF, 0x0001, 0x0234]


def random_scales(rng: np.random.Generator, n: int) -> np.ndarray:
    mag = np.exp(rng.uniform(np.log(1e-3), np.log(1.0), n))
    sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
    return (mag * sign).astype(np.float16).view(np.uint16)


def deq_case(rng: np.random.Generator, qtype: T) -> tuple[int, bytes, np.ndarray]:
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    if qtype in (T.F32, T.F16, T.BF16):
        n = 512
        if qtype == T.F32:
            vals = np.concatenate([
                rng.standard_normal(n - 8).astype(np.float32) * np.float32(3.0),
                np.array([0.0, -0.0, np.inf, -np.inf, 1e-45, 3.4e38, 1e-40, -7.5], dtype=np.float32),
            ])
            raw = vals.tobytes()
        else:
            # Every bit pattern is a valid f16/bf16, NaNs and infinities included.
            bits = rng.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16)
            bits[:6] = [0x0000, 0x8000, 0x7C00, 0xFC00, 0x0001, 0x7E00] if qtype == T.F16 else \
                [0x0000, 0x8000, 0x7F80, 0xFF80, 0x0001, 0x7FC0]
            raw = bits.tobytes()
        out = quants.dequantize(np.frombuffer(raw, dtype=np.uint8), qtype)
        return n, raw, np.asarray(out, dtype=np.float32).reshape(-1)
    n_blocks = 16 if block_elems == 32 else 8
    blocks = rng.integers(0, 256, (n_blocks, block_bytes), dtype=np.uint16).astype(np.uint8)
    for off in SCALE_FIELDS[qtype]:
        scales = random_scales(rng, n_blocks)
        for i, bits in enumerate(SPECIAL_F16_BITS[: n_blocks // 2]):
            if i < n_blocks:
                scales[i] = bits
        blocks[:, off:off + 2] = scales.reshape(-1, 1).view(np.uint8)
    raw = blocks.tobytes()
    out = quants.dequantize(np.frombuffer(raw, dtype=np.uint8), qtype)
    return n_blocks * block_elems, raw, np.asarray(out, dtype=np.float32).reshape(-1)


def quant_inputs(rng: np.random.Generator) -> np.ndarray:
    """24 rows of 32: random data at several magnitudes and the edge cases a quantizer gets wrong."""
    rows = []
    for scale in (1.0, 0.01, 30.0, 1e-3, 5.0, 0.2):
        rows.append(rng.standard_normal(32) * scale)
    rows.append(rng.uniform(-1, 1, 32) * 1e4)
    rows.append(np.zeros(32))
    rows.append(np.full(32, 0.7))
    rows.append(np.full(32, -2.5))
    rows.append(rng.uniform(1e4, 6e4, 32) * np.where(rng.random(32) < 0.5, -1, 1))  # near f16 max
    rows.append(rng.standard_normal(32) * 1e6)  # the f16 scale overflows to infinity
    rows.append(rng.standard_normal(32) * 1e-6)  # the f16 scale is subnormal
    rows.append(rng.standard_normal(32) * 1e-9)  # the f16 scale rounds to zero
    rows.append(-np.abs(rng.standard_normal(32)) - 0.1)  # negative only
    rows.append(np.abs(rng.standard_normal(32)) + 3.0)  # positive only, away from zero
    # Exact halves after scaling: amax 127 gives d = 1, so x * id lands on .5 ties.
    rows.append(np.array([127.0] + [k + 0.5 for k in range(-15, 16)]))
    # Same magnitude with both signs: the first one wins the sign of the scale.
    rows.append(np.array([-3.0, 3.0] + list(rng.uniform(-2, 2, 30))))
    rows.append(np.array([3.0, -3.0] + list(rng.uniform(-2, 2, 30))))
    rows.append(np.array([1.0] * 31 + [0.0]))
    rows.append(np.linspace(-1, 1, 32))
    rows.append(rng.standard_normal(32) * 2.0 + 10.0)  # offset: min far from zero
    rows.append(np.where(np.arange(32) % 2 == 0, 1e-30, -1e-30))  # tiny but non-zero
    rows.append(rng.standard_normal(32))
    return np.concatenate(rows).astype(np.float32)


def quant_case(rng: np.random.Generator, qtype: T) -> tuple[np.ndarray, bytes]:
    x = quant_inputs(rng)
    if qtype in (T.F16, T.BF16, T.F32):
        extra = np.array([np.inf, -np.inf, np.nan, 65504.0, 65520.0, 1e-8, -1e-8, 3.4e38], dtype=np.float32)
        x = np.concatenate([x, extra])
        if qtype == T.BF16:
            # A signalling NaN (payload only in the low half) and a rounding tie.
            x = np.concatenate([x, np.array([0x7F800001, 0x3F808000, 0x3F818000, 0x80000000], dtype=np.uint32)
                                .view(np.float32)])
        else:
            x = np.concatenate([x, np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)])
    q = quants.quantize(x, qtype)
    return x, np.ascontiguousarray(q).view(np.uint8).tobytes()


def main() -> None:
    os.makedirs(OUT_DIR, exist_ok=True)
    rng = np.random.default_rng(20261130)
    total = 0
    for qtype in DEQ_TYPES:
        n_deq, raw, out = deq_case(rng, qtype)
        parts = [b"KQF1", struct.pack("<II", int(qtype), n_deq), raw, out.astype("<f4").tobytes()]
        if qtype in QUANT_TYPES:
            x, qbytes = quant_case(rng, qtype)
            parts += [struct.pack("<I", x.size), x.astype("<f4").tobytes(), qbytes]
        else:
            parts.append(struct.pack("<I", 0))
        data = b"".join(parts)
        path = os.path.join(OUT_DIR, f"{qtype.name.lower()}.bin")
        with open(path, "wb") as f:
            f.write(data)
        total += len(data)
        print(f"{qtype.name:8} {len(data):7} bytes")
    print(f"total    {total:7} bytes")


if __name__ == "__main__":
    main()
