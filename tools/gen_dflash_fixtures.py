#!/usr/bin/env python3
"""Reference output for kiln's DFlash drafter (crates/kiln-engine/tests/dflash_parity.rs).

1. kiln writes the inputs: a tiny synthetic Qwen3 target (F32) and a random-weight drafter in the z-lab format
   (config.json + bf16 model.safetensors), both from fixed seeds:
       KILN_DFLASH_OUT=DIR cargo test -p kiln-engine --test dflash_parity -- --ignored write_oracle_inputs
2. This script loads the drafter with the reference `dflash` package (0.1.0; `pip install --no-deps dflash==0.1.0`),
   in float32 on the CPU, takes the target's embedding table and output head from the GGUF, and runs two rounds the
   way `dflash_generate` does (context features appended to the draft cache, the block cropped off afterwards).
   It writes random context features, the blocks and the draft logits into the fixture directory, plus the
   SHA-256 of the two input files so the test can tell when its regenerated inputs no longer match.

Usage: tools/gen_dflash_fixtures.py DIR [FIXTURE_DIR]

The sliding-window fixture: the inputs written with KILN_DFLASH_SLIDING=1 as well, then
    tools/gen_dflash_fixtures.py DIR crates/kiln-engine/tests/fixtures/dflash-sliding
"""
import hashlib
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from gguf import GGUFReader
from dflash.model import DFlashDraftModel, _crop_to, _make_cache, _draft_value

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def tensor(reader, name):
    for t in reader.tensors:
        if t.name == name:
            # GGUF shape is [cols, rows]; the data array comes back as rows × cols.
            return torch.from_numpy(np.array(t.data, dtype=np.float32).reshape(int(t.shape[1]), int(t.shape[0])))
    return None


def main():
    src = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(ROOT, "crates/kiln-engine/tests/fixtures/dflash")
    os.makedirs(out, exist_ok=True)
    target = os.path.join(src, "target.gguf")
    ddir = os.path.join(src, "drafter")
    reader = GGUFReader(target)
    embd = tensor(reader, "token_embd.weight")
    head = tensor(reader, "output.weight")
    if head is None:
        head = embd
    model = DFlashDraftModel.from_pretrained(ddir, dtype=torch.float32).eval()
    cfg = model.config
    hidden = cfg.hidden_size
    n_taps = len(model.target_layer_ids)
    scale = float(_draft_value(cfg, "input_embedding_scale", 1.0))
    mask = model.mask_token_id
    b = model.block_size
    gen = torch.Generator().manual_seed(1234)
    cache = _make_cache(cfg)
    rounds = []
    start = 0
    # (new context rows, anchor token) per round: a prompt of 6, then 3 accepted tokens.
    for r, (n_ctx, anchor) in enumerate([(6, 17), (3, 201)]):
        ctx = torch.randn(1, n_ctx, n_taps * hidden, generator=gen) * 2.0
        block = torch.tensor([[anchor] + [mask] * (b - 1)])
        noise = F.embedding(block, embd) * scale
        ctx_start = start
        start += n_ctx
        pos = torch.arange(start - n_ctx, start + b)[None]
        with torch.no_grad():
            h = model(target_hidden=ctx, noise_embedding=noise, position_ids=pos,
                      past_key_values=cache, use_cache=True)[:, 1 - b:, :]
            _crop_to(cache, start)
            logits = model.compute_logits(h, lambda x: x @ head.T)
        ctx.numpy().astype("<f4").tofile(os.path.join(out, f"round{r}_ctx.f32"))
        logits[0].numpy().astype("<f4").tofile(os.path.join(out, f"round{r}_logits.f32"))
        rounds.append({"ctx_start": ctx_start, "block": block[0].tolist()})
    meta = {
        "note": "written by tools/gen_dflash_fixtures.py (reference dflash 0.1.0, torch float32, CPU)",
        "target_sha256": sha(target),
        "drafter_sha256": sha(os.path.join(ddir, "model.safetensors")),
        "rounds": rounds,
    }
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
