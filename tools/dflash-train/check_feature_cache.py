#!/usr/bin/env python3
"""Checks that a cached-feature format does not change what a trained drafter sees: its held-out loss, teacher-forced
τ and replayed τ with the target's features as computed (float32) and round-tripped through train.py's cache forms
(f16, and fp8 e4m3 with a scale per token and tap). CPU is enough (a few minutes on 2 cores).

    python3 tools/dflash-train/check_feature_cache.py --gguf .test-assets/SmolLM2-135M-Instruct.Q4_1.gguf \
        --draft tools/dflash-train/trained/smollm2-135m-dflash-2l-q8_0.gguf [--layers 2] [--sim-new 64]
"""
import argparse
import os
import sys
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train as T  # noqa: E402
from gguf_target import load_llama  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--draft", required=True, help="trained drafter (directory or converted GGUF)")
    ap.add_argument("--data", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "data.jsonl.gz"))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--ff", type=int, default=0)
    ap.add_argument("--sim-new", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    target, _ = load_llama(a.gguf)
    target.eval()
    tc = target.config
    taps = T.default_taps(tc.num_hidden_layers, 5)
    drafter = T.Drafter(T.drafter_config(tc, a.layers, taps, T.DEFAULT_MASK_ID, 16, a.ff))
    T.load_init(a.draft, drafter, None)
    head_w = target.get_output_embeddings().weight
    _, test = T.load_data(a.data, 1024)
    args = types.SimpleNamespace(eval_batch=8, eval_anchors=64, block=16)
    rows = {}
    for form in ["f32", "f16", "fp8"]:
        b = T.Batcher(target, taps, T.DEFAULT_MASK_ID, 16, 7.0, torch.device("cpu"), False, False)
        computed = b.features

        def roundtrip(f):
            return torch.stack([T.unpack_features(T.pack_features(x, len(taps), form)) for x in f])

        if form != "f32":
            def features(seqs, greedy=False):
                f, nxt, soft = computed(seqs, greedy)
                return roundtrip(f), nxt, soft
            b.features = features
        with torch.no_grad():
            f = computed(test[:4])[0]
            err = 0.0 if form == "f32" else ((roundtrip(f) - f).norm() / f.norm()).item()
        loss, tau = T.evaluate(drafter, head_w, b, test, args, False)
        sim = T.simulate_tau(drafter, head_w, b, test, a.sim_new, False)
        rows[form] = (loss, tau, sim)
        print(f"{form}: features' relative error {err:.4f}; held-out loss {loss:.4f}, teacher-forced tau {tau:.3f}, "
              f"replayed tau {sim:.3f}", flush=True)
    worst = max(abs(rows[f][0] - rows["f32"][0]) for f in ("f16", "fp8"))
    if worst > 0.01:
        sys.exit(f"a cached form moves the held-out loss by {worst:.4f} (> 0.01)")


if __name__ == "__main__":
    main()
