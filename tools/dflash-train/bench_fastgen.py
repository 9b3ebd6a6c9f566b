#!/usr/bin/env python3
"""Times fastgen.py on the data's prompts: greedy and sampled (T 0.8), each twice (the first run of a shape pays
the fused attention's plan building on a GPU, the second shows the steady step), then a torch profile of a short
greedy run. On a GPU the target runs as the f16 copy train.py --gen-dtype f16 uses.

    python3 tools/dflash-train/bench_fastgen.py GGUF [--rows 2048] [--new 128] [--fastgen path/to/fastgen.py]

--fastgen times another version of fastgen.py (e.g. `git show REV:tools/dflash-train/fastgen.py > old.py`).
"""
import argparse
import copy
import gzip
import importlib.util
import json
import os
import sys
import time

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
from gguf_target import load_llama  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("gguf")
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--fastgen", default=os.path.join(here, "fastgen.py"))
    ap.add_argument("--no-profile", action="store_true")
    args = ap.parse_args()
    spec = importlib.util.spec_from_file_location("fastgen_timed", args.fastgen)
    fastgen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fastgen)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    target, _ = load_llama(args.gguf)
    target = target.to(dev).eval()
    writer = copy.deepcopy(target).to(torch.float16) if dev == "cuda" else target
    eos = target.config.eos_token_id
    with gzip.open(os.path.join(here, "data.jsonl.gz"), "rt") as f:
        base = [json.loads(line)["prompt_ids"] for line in f]
    prompts = [base[i % len(base)] for i in range(args.rows)]

    def sync():
        if dev == "cuda":
            torch.cuda.synchronize()

    for temp in (0.0, 0.8):
        for run in ("first", "again"):
            torch.manual_seed(0)
            sync()
            t0 = time.time()
            out = fastgen.generate_batch(writer, prompts, temp, args.new, eos)
            sync()
            dt = time.time() - t0
            toks, steps = sum(len(o) for o in out), max(len(o) for o in out)
            print(f"T {temp} {run}: {toks} tokens, {steps} steps, {dt:.2f} s, {toks / dt:,.0f} tokens/s, "
                  f"{1000 * dt / steps:.1f} ms a step", flush=True)
    if args.no_profile:
        return
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
    with profile(activities=acts) as prof:
        fastgen.generate_batch(writer, prompts, 0.0, min(args.new, 32), eos)
        sync()
    key = "cuda_time_total" if dev == "cuda" else "cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=18, max_name_column_width=50))


if __name__ == "__main__":
    main()
