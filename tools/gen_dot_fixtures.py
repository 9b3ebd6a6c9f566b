#!/usr/bin/env python3
"""Real weight rows for kiln-quant's dot-product test (crates/kiln-quant/tests/dot_real.rs).

Takes two rows of one tensor per weight type used by the test models (SmolLM2-135M Q4_1, Gemma-3-270M Q4_K_M),
with the rows dequantized by the gguf package as the oracle, and writes
crates/kiln-quant/tests/fixtures/dot_rows.bin:

    b"KDOT" u32 count, then per record:
    u32 name_len, name (utf-8), u32 ggml type id, u32 n, u32 rows, rows * row_bytes raw bytes,
    rows * n little-endian f32 (gguf's dequantization)

Run from the repository root after tools/fetch-test-assets.sh: python3 tools/gen_dot_fixtures.py
"""

import struct
from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

ROOT = Path(__file__).resolve().parent.parent
ASSETS = ROOT / ".test-assets"
OUT = ROOT / "crates/kiln-quant/tests/fixtures/dot_rows.bin"

PICKS = [
    ("SmolLM2-135M-Instruct.Q4_1.gguf", "blk.0.ffn_down.weight", [3, 401]),
    ("SmolLM2-135M-Instruct.Q4_1.gguf", "token_embd.weight", [17, 30000]),
    ("gemma-3-270m-q4_k_m.gguf", "blk.0.attn_output.weight", [5, 600]),
    ("gemma-3-270m-q4_k_m.gguf", "blk.2.ffn_down.weight", [0, 333]),
    ("gemma-3-270m-q4_k_m.gguf", "blk.0.ffn_down.weight", [9, 640 - 1]),
    ("gemma-3-270m-q4_k_m.gguf", "blk.0.attn_q.weight", [2, 1000]),
]


def main() -> None:
    readers = {}
    records = []
    for file, name, rows in PICKS:
        reader = readers.setdefault(file, GGUFReader(ASSETS / file))
        tensor = next(t for t in reader.tensors if t.name == name)
        n = int(tensor.shape[0])
        raw = np.asarray(tensor.data)[rows]  # (rows, row_bytes) uint8
        deq = dequantize(raw, tensor.tensor_type).astype("<f4").reshape(len(rows), n)
        records.append((f"{file}:{name}", int(tensor.tensor_type), n, raw, deq))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with open(OUT, "wb") as f:
        f.write(b"KDOT" + struct.pack("<I", len(records)))
        for label, ty, n, raw, deq in records:
            enc = label.encode()
            f.write(struct.pack("<I", len(enc)) + enc)
            f.write(struct.pack("<III", ty, n, raw.shape[0]))
            f.write(raw.tobytes())
            f.write(deq.tobytes())
    print(f"wrote {OUT.relative_to(ROOT)} ({OUT.stat().st_size} bytes, {len(records)} tensors)")


if __name__ == "__main__":
    main()
