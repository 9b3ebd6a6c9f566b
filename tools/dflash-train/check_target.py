#!/usr/bin/env python3
"""Oracle check of gguf_target.py: the GGUF loaded by our reader and by transformers' own GGUF loader (needs the
`gguf` and `accelerate` packages) must give the same logits and hidden states.

    python3 tools/dflash-train/check_target.py .test-assets/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import os
import sys

import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_target import load_llama  # noqa: E402


def main():
    path = sys.argv[1]
    ours, _ = load_llama(path)
    ref = AutoModelForCausalLM.from_pretrained(os.path.dirname(path) or ".", gguf_file=os.path.basename(path),
                                               dtype=torch.float32).eval()
    ids = torch.tensor([[1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 4093, 198, 6106, 2531, 5574, 338]])
    with torch.no_grad():
        a = ours(ids, output_hidden_states=True)
        b = ref(ids, output_hidden_states=True)
    dl = (a.logits - b.logits).abs().max().item()
    dh = max((x - y).abs().max().item() for x, y in zip(a.hidden_states, b.hidden_states))
    same_top1 = bool((a.logits.argmax(-1) == b.logits.argmax(-1)).all())
    print(f"max |dlogit| {dl:.3g}, max |dhidden| {dh:.3g}, same argmax {same_top1}")
    if dl > 1e-3 or not same_top1:
        sys.exit("gguf_target.py disagrees with transformers' GGUF loader")


if __name__ == "__main__":
    main()
