#!/usr/bin/env python3
"""Per-tensor dequantization checksums of the SmolLM2 test model, computed by the `gguf` Python package.

    python3 tools/gen_gguf_dequant_checksums.py   # writes crates/kiln-gguf/tests/fixtures/smollm2_dequant.txt

One line per tensor, in file order:
    name type n_elements sum sum_abs sum_sq idx:bits idx:bits ... (8 samples)
sums are float64 over the dequantized f32 values (repr, round-trips exactly); `bits` is the exact f32 bit
pattern (hex) of element `idx`, idx_k = (k * 0x9E3779B1 + 12345) % n_elements for k in 0..8.
"""
import os

import numpy as np
import gguf

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MODEL = os.path.join(os.environ.get("KILN_TEST_ASSETS", os.path.join(ROOT, ".test-assets")),
                     "SmolLM2-135M-Instruct.Q4_1.gguf")
OUT = os.path.join(ROOT, "crates", "kiln-gguf", "tests", "fixtures", "smollm2_dequant.txt")


def main():
    r = gguf.GGUFReader(MODEL)
    lines = ["# " + line for line in __doc__.strip().splitlines()[2:]]
    for t in r.tensors:
        x = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32).reshape(-1)
        n = x.size
        assert n == int(t.n_elements), t.name
        x64 = x.astype(np.float64)
        bits = x.view(np.uint32)
        samples = " ".join(f"{i}:{bits[i]:08x}" for i in ((k * 0x9E3779B1 + 12345) % n for k in range(8)))
        lines.append(f"{t.name} {t.tensor_type.name.lower()} {n} {float(x64.sum())!r} "
                     f"{float(np.abs(x64).sum())!r} {float((x64 * x64).sum())!r} {samples}")
    with open(OUT, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes, {len(r.tensors)} tensors)")


if __name__ == "__main__":
    main()
