#!/usr/bin/env python3
"""GGUF fixtures for kiln-gguf, written by the independent `gguf` Python package (0.19).

    python3 tools/gen_gguf_fixtures.py                 # writes crates/kiln-gguf/tests/fixtures/oracle_all_types.gguf
    python3 tools/gen_gguf_fixtures.py --check FILE    # reads a kiln-written FILE (see tests/oracle.rs) and checks it

The fixture holds every metadata value type, arrays of each, nested arrays, a few tensors of several types and a
non-default alignment (64). Tensor bytes follow simple formulas that the Rust test recomputes:
  f32 "t.f32"   shape (ggml) [5, 3]: element i = i * 0.25 - 1
  f16 "t.f16"   shape [8]:           element i = i / 8 as f16
  quantized tensors: byte k of the data = (k * 7 + seed) % 256, seed = 11 (q8_0), 13 (q4_k), 17 (q6_k)
"""
import argparse
import os
import sys

import numpy as np
import gguf
from gguf import GGUFValueType as VT, GGMLQuantizationType as QT

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FIXTURE = os.path.join(ROOT, "crates", "kiln-gguf", "tests", "fixtures", "oracle_all_types.gguf")

SCALARS = [
    ("t.u8", 200, VT.UINT8),
    ("t.i8", -100, VT.INT8),
    ("t.u16", 60000, VT.UINT16),
    ("t.i16", -30000, VT.INT16),
    ("t.u32", 4000000000, VT.UINT32),
    ("t.i32", -2000000000, VT.INT32),
    ("t.f32", 1.5, VT.FLOAT32),
    ("t.bool", True, VT.BOOL),
    ("t.string", "héllo, gguf ✓", VT.STRING),
    ("t.u64", 2**63 + 5, VT.UINT64),
    ("t.i64", -(2**62), VT.INT64),
    ("t.f64", -0.1, VT.FLOAT64),
]

ARRAYS = [
    ("a.u8", [0, 1, 255], VT.UINT8),
    ("a.i8", [-128, 0, 127], VT.INT8),
    ("a.u16", [1, 65535], VT.UINT16),
    ("a.i16", [-32768, 32767], VT.INT16),
    ("a.u32", [7, 4294967295], VT.UINT32),
    ("a.i32", [-1, 2, -3], VT.INT32),
    ("a.f32", [0.5, -2.25, 1e-7], VT.FLOAT32),
    ("a.bool", [True, False, True], VT.BOOL),
    ("a.string", ["a", "", "ü"], VT.STRING),
    ("a.u64", [0, 2**64 - 1], VT.UINT64),
    ("a.i64", [-(2**63), 2**63 - 1], VT.INT64),
    ("a.f64", [3.25, -1e300], VT.FLOAT64),
]


def pattern(n, seed):
    return np.array([(k * 7 + seed) % 256 for k in range(n)], dtype=np.uint8)


def write():
    w = gguf.GGUFWriter(FIXTURE, arch="llama")
    w.add_custom_alignment(64)
    w.add_name("kiln oracle fixture")
    for key, val, vt in SCALARS:
        w.add_key_value(key, val, vt)
    for key, val, vt in ARRAYS:
        w.add_key_value(key, val, VT.ARRAY, sub_type=vt)
    # Nested: an array of arrays (inner types inferred by the writer: int -> i32, str -> string) and a depth-3 array.
    w.add_key_value("n.mixed", [[1, 2, 3], ["x", "yz"], [0.5]], VT.ARRAY)
    w.add_key_value("n.deep", [[[1], [2, 3]], [[4]]], VT.ARRAY)

    w.add_tensor("t.f32", (np.arange(15, dtype=np.float32) * 0.25 - 1).reshape(3, 5))
    w.add_tensor("t.f16", (np.arange(8, dtype=np.float32) / 8).astype(np.float16))
    # Quantized tensors from raw bytes: (rows, row_bytes) byte shapes, converted by the writer to element shapes.
    w.add_tensor("t.q8_0", pattern(2 * 34, 11).reshape(2, 34), raw_dtype=QT.Q8_0)
    w.add_tensor("t.q4_k", pattern(144, 13).reshape(1, 144), raw_dtype=QT.Q4_K)
    w.add_tensor("t.q6_k", pattern(3 * 210, 17).reshape(3, 210), raw_dtype=QT.Q6_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {FIXTURE} ({os.path.getsize(FIXTURE)} bytes)")


def check(path):
    """Checks a file written by kiln's round-trip test (tests/oracle.rs, `kiln_written_file`)."""
    r = gguf.GGUFReader(path)
    f = {k: v for k, v in r.fields.items()}
    assert f["GGUF.version"].contents() == 3
    for key, val, vt in SCALARS:
        got = f[key]
        assert got.types == [vt], (key, got.types)
        if vt in (VT.FLOAT32,):
            assert np.float32(got.contents()) == np.float32(val), (key, got.contents())
        else:
            assert got.contents() == val, (key, got.contents(), val)
    for key, val, vt in ARRAYS:
        got = f[key]
        assert got.types == [VT.ARRAY, vt], (key, got.types)
        if vt == VT.FLOAT32:
            assert list(np.float32(got.contents())) == list(np.float32(val)), key
        else:
            assert got.contents() == val, (key, got.contents())
    assert f["general.alignment"].contents() == 64
    assert r.alignment == 64
    names = [t.name for t in r.tensors]
    assert names == ["w.f32", "w.q8_0"], names
    t = r.tensors[0]
    assert list(t.shape) == [5, 3] and t.tensor_type == QT.F32
    assert list(np.asarray(t.data).reshape(-1)) == [np.float32(i) * np.float32(0.5) for i in range(15)]
    t = r.tensors[1]
    assert list(t.shape) == [32, 2] and t.tensor_type == QT.Q8_0
    assert bytes(np.asarray(t.data).reshape(-1)) == bytes(pattern(68, 5))
    for t in r.tensors:
        assert t.data_offset % 64 == 0
    print(f"{path}: ok ({len(r.fields)} fields, {len(r.tensors)} tensors)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", metavar="FILE")
    a = ap.parse_args()
    if a.check:
        check(a.check)
    else:
        write()
    sys.exit(0)
