#!/usr/bin/env python3
"""Oracle check of fastgen.py: its batched greedy continuations (prompts of different lengths, left-padded into
one batch) must equal transformers' `generate` run on each prompt alone; its sampling must stop at EOS.

    python3 tools/dflash-train/check_generate.py .test-assets/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import gzip
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fastgen import generate_batch  # noqa: E402
from gguf_target import load_llama  # noqa: E402


def main():
    path = sys.argv[1]
    new = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    target, _ = load_llama(path)
    target.eval()
    eos = target.config.eos_token_id
    data = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data.jsonl.gz")
    with gzip.open(data, "rt") as f:
        prompts = [json.loads(line)["prompt_ids"] for line in f][:6]
    # Two prompts cut short so that the batch pads several rows by different amounts.
    prompts[1] = prompts[1][:len(prompts[1]) // 2]
    prompts[4] = prompts[4][:7]
    ours = generate_batch(target, prompts, 0.0, new, eos)
    bad = 0
    for i, p in enumerate(prompts):
        with torch.no_grad():
            ref = target.generate(input_ids=torch.tensor([p]), max_new_tokens=new, do_sample=False,
                                  eos_token_id=eos, pad_token_id=eos)[0, len(p):].tolist()
        ref = ref[:ref.index(eos) + 1] if eos in ref else ref
        same = ours[i] == ref
        bad += not same
        first = next((j for j, (a, b) in enumerate(zip(ours[i], ref)) if a != b), min(len(ours[i]), len(ref)))
        print(f"prompt {i} ({len(p)} tokens): {len(ref)} generated, "
              + ("identical" if same else f"differs from token {first}"))
    torch.manual_seed(0)
    sampled = generate_batch(target, prompts, 0.8, new, eos)
    stops = all(eos not in s[:-1] for s in sampled)
    print(f"sampled at T 0.8: lengths {[len(s) for s in sampled]}, nothing after EOS: {stops}")
    if bad or not stops:
        sys.exit("fastgen.py disagrees with transformers' generate")


if __name__ == "__main__":
    main()
