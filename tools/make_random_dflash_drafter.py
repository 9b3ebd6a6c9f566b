#!/usr/bin/env python3
"""Writes a random-weight DFlash drafter in the z-lab format (config.json + bf16 model.safetensors) with the
reference `dflash` package's own model class and `save_pretrained`, for a given target shape.

Example (SmolLM2-135M: hidden 576, 30 layers, vocab 49152; it has no mask token, so id 0 is used):
    tools/make_random_dflash_drafter.py OUT --hidden 576 --heads 9 --kv-heads 3 --head-dim 64 --ff 1536 \\
        --vocab 49152 --target-layers 30 --taps 2,15,27 --layers 1 --block 16 --mask 0 --rope-theta 100000
"""
import argparse

import torch
from transformers import Qwen3Config
from dflash.model import DFlashDraftModel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--hidden", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--kv-heads", type=int, required=True)
    ap.add_argument("--head-dim", type=int, required=True)
    ap.add_argument("--ff", type=int, required=True)
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--target-layers", type=int, required=True)
    ap.add_argument("--taps", required=True, help="comma-separated target layer ids")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--mask", type=int, required=True)
    ap.add_argument("--rope-theta", type=float, default=1e6)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    cfg = Qwen3Config(
        hidden_size=a.hidden, intermediate_size=a.ff, num_hidden_layers=a.layers,
        num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, head_dim=a.head_dim,
        vocab_size=a.vocab, rope_theta=a.rope_theta, rms_norm_eps=1e-6, max_position_embeddings=40960,
    )
    cfg.architectures = ["DFlashDraftModel"]
    cfg.block_size = a.block
    cfg.num_target_layers = a.target_layers
    cfg.dflash_config = {"mask_token_id": a.mask, "target_layer_ids": [int(x) for x in a.taps.split(",")]}
    model = DFlashDraftModel(cfg).to(torch.bfloat16)
    model.save_pretrained(a.out, safe_serialization=True)


if __name__ == "__main__":
    main()
