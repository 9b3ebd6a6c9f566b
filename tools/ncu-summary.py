#!/usr/bin/env python3
"""Per-kernel time of a decode step from `ncu --print-summary per-kernel --csv --metrics gpu__time_duration.sum`.

usage: ncu-summary.py FILE.csv STEPS
Prints one row per (kernel, grid): calls, microseconds a call, and microseconds a step (calls / STEPS), the largest
first, then the total a step. ncu times each kernel alone, so each row carries the ~1 us of launch that
programmatic dependent launch hides inside a CUDA graph. Kernels that run once at load (the bf16 weight copies
for prefill, `dequant_bf16`) are listed after the total, apart from it.
"""
import csv
import io
import sys

LOAD_KERNELS = {"dequant_bf16"}
UNIT = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}


def main():
    path, steps = sys.argv[1], float(sys.argv[2])
    lines = [l for l in open(path, encoding="utf-8", errors="replace") if l.startswith('"')]
    rows = list(csv.reader(io.StringIO("".join(lines))))
    if not rows:
        sys.exit(f"{path}: no ncu summary rows")
    col = {name: i for i, name in enumerate(rows[0])}
    out = []
    for r in rows[1:]:
        calls = int(r[col["Invocations"]])
        us = float(r[col["Average"]].replace(",", "")) * UNIT[r[col["Metric Unit"]]]
        out.append((calls * us / steps, calls, us, r[col["Kernel Name"]].split("(")[0], r[col["Grid Size"]]))
    out.sort(reverse=True)
    step = [o for o in out if o[3] not in LOAD_KERNELS]
    load = [o for o in out if o[3] in LOAD_KERNELS]
    print("| kernel | grid | calls | µs a call | µs a step |")
    print("|---|---|---:|---:|---:|")
    for per_step, calls, us, name, grid in step:
        print(f"| {name} | {grid} | {calls} | {us:.2f} | {per_step:.1f} |")
    print(f"| total | | | | {sum(o[0] for o in step):.1f} |")
    if load:
        total = sum(o[1] * o[2] for o in load)
        print(f"at load, not in the total: {', '.join(sorted({o[3] for o in load}))} "
              f"({sum(o[1] for o in load)} calls, {total / 1e3:.1f} ms)")


if __name__ == "__main__":
    main()
