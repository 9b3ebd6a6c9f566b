#!/usr/bin/env python3
"""Writes a random-weight DFlash drafter for SmolLM2-135M in the z-lab format (config.json + bf16
model.safetensors), with the standard library only, so the server tests need no numpy or torch.

SmolLM2 has no mask token: id 0 (`<|endoftext|>`, inside its embedding table) fills the draft rows. A random
drafter accepts almost nothing; the server tests use it to check that speculative requests give the same
output as plain ones whatever the drafter proposes.

Usage: write_drafter.py OUT_DIR [--block 8] [--seed 1]
"""
import argparse
import json
import os
import struct

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FF, VOCAB, TARGET_LAYERS = 576, 9, 3, 64, 256, 49152, 30
TAPS = [2, 15, 27]


def bf16_values(n, center, amp, state):
    """n bf16 values center + U(-amp, amp) from a 64-bit LCG (high bits), as little-endian bytes."""
    out = bytearray(2 * n)
    s = state[0]
    for i in range(n):
        s = (s * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        u = (s >> 40) / float(1 << 24)
        v = center + amp * (2.0 * u - 1.0)
        # bf16 = the high half of the f32 (truncation is fine for random weights).
        out[2 * i:2 * i + 2] = struct.pack("<I", struct.unpack("<I", struct.pack("<f", v))[0])[2:4]
    state[0] = s
    return bytes(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    config = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": HIDDEN,
        "intermediate_size": FF,
        "num_hidden_layers": 1,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "attention_bias": False,
        "rms_norm_eps": 1e-6,
        "rope_theta": 100000.0,
        "rope_scaling": None,
        "max_position_embeddings": 40960,
        "vocab_size": VOCAB,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "block_size": a.block,
        "num_target_layers": TARGET_LAYERS,
        "dflash_config": {"mask_token_id": 0, "target_layer_ids": TAPS},
    }
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    qd, kvd = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    p = "layers.0."
    shapes = [
        (p + "input_layernorm.weight", [HIDDEN], True),
        (p + "post_attention_layernorm.weight", [HIDDEN], True),
        (p + "self_attn.q_proj.weight", [qd, HIDDEN], False),
        (p + "self_attn.k_proj.weight", [kvd, HIDDEN], False),
        (p + "self_attn.v_proj.weight", [kvd, HIDDEN], False),
        (p + "self_attn.o_proj.weight", [HIDDEN, qd], False),
        (p + "self_attn.q_norm.weight", [HEAD_DIM], True),
        (p + "self_attn.k_norm.weight", [HEAD_DIM], True),
        (p + "mlp.gate_proj.weight", [FF, HIDDEN], False),
        (p + "mlp.up_proj.weight", [FF, HIDDEN], False),
        (p + "mlp.down_proj.weight", [HIDDEN, FF], False),
        ("fc.weight", [HIDDEN, len(TAPS) * HIDDEN], False),
        ("hidden_norm.weight", [HIDDEN], True),
        ("norm.weight", [HIDDEN], True),
    ]
    state = [a.seed * 0x9E3779B97F4A7C15 & 0xFFFFFFFFFFFFFFFF | 1]
    header, blobs, offset = {}, [], 0
    for name, shape, is_norm in shapes:
        n = 1
        for d in shape:
            n *= d
        data = bf16_values(n, 1.0, 0.1, state) if is_norm else bf16_values(n, 0.0, shape[1] ** -0.5, state)
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


if __name__ == "__main__":
    main()
