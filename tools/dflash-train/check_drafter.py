#!/usr/bin/env python3
"""Oracle check of train.py's drafter: a checkpoint written by train.py, loaded by the reference `dflash` package
(DFlashDraftModel.from_pretrained), must give the same block outputs and draft tokens as train.py's own forward
(the one that was trained), for several anchors of a real sequence with the target's real features; and the
training-time masked multi-anchor pass must equal one inference round per anchor; and --greedy-labels' labels must
be the target's own argmax continuation (computed here one token at a time), cut where the sequence leaves it.

    python3 tools/dflash-train/check_drafter.py --gguf .test-assets/SmolLM2-135M-Instruct.Q4_1.gguf --draft DIR
"""
import argparse
import json
import os
import sys

import torch
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train as T  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--draft", required=True)
    a = ap.parse_args()
    from dflash.model import DFlashDraftModel

    target, _ = T.load_llama(a.gguf)
    cfg = json.load(open(os.path.join(a.draft, "config.json")))
    ours = T.Drafter(cfg)
    ours.load_state_dict({k: v.float() for k, v in load_file(os.path.join(a.draft, "model.safetensors")).items()})
    ours.eval()
    ref = DFlashDraftModel.from_pretrained(a.draft, dtype=torch.float32).eval()
    taps, bl, mask_id = cfg["dflash_config"]["target_layer_ids"], cfg["block_size"], cfg["dflash_config"]["mask_token_id"]
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 20000, (1, 120), generator=g)
    batcher = T.Batcher(target, taps, mask_id, bl, 7.0, torch.device("cpu"), False, False)
    feat, _ = batcher.features([(ids[0].tolist(), 0)])
    emb = target.get_input_embeddings().weight
    worst, same = 0.0, True
    anchors = [5, 40, 87, 104]
    singles = []
    with torch.no_grad():
        for anc in anchors:
            blk = torch.full((1, bl), mask_id)
            blk[0, 0] = ids[0, anc]
            e = emb[blk]
            r = ref(target_hidden=feat[:, :anc], noise_embedding=e, position_ids=torch.arange(anc + bl)[None])
            o = ours(feat[:, :anc], torch.arange(anc)[None], e, torch.arange(anc, anc + bl)[None],
                     torch.ones(1, 1, bl, anc + bl, dtype=torch.bool))
            singles.append(o)
            worst = max(worst, (r - o).abs().max().item())
            same &= bool((ref.compute_logits(r, target.lm_head).argmax(-1)
                          == target.lm_head(o).argmax(-1)).all())
        # The training path: all anchors of the sequence in one masked pass, batched with a shorter sequence
        # (padding, a dummy block) as Batcher.build makes it.
        seq = ids[0].tolist()
        short = seq[:60]
        batch = batcher.build([(seq, 0), (short, 0)], 0, None, [0, 1], fixed=[anchors, [7]])
        multi = ours(*batch[:5])
        labels = batch[5]
        worst_multi = max((multi[0, j * bl:(j + 1) * bl] - s[0]).abs().max().item() for j, s in enumerate(singles))
        ok_labels = all(labels[0, j].tolist() == [seq[anc + k] if anc + k < len(seq) else T.IGNORE
                                                  for k in range(1, bl)] for j, anc in enumerate(anchors))
        ok_labels &= labels[1, 0].tolist() == short[8:8 + bl - 1] and bool((labels[1, 1:] == T.IGNORE).all())
    print(f"reference vs train.py: max |dhidden| {worst:.3g}, same drafts {same}; "
          f"masked multi-anchor batch vs single rounds: max |dhidden| {worst_multi:.3g}, labels {ok_labels}")
    if worst > 1e-3 or not same or worst_multi > 1e-3 or not ok_labels:
        sys.exit("train.py's drafter disagrees with the reference dflash model")
    check_greedy_labels(target, taps, mask_id, bl)


@torch.no_grad()
def check_greedy_labels(target, taps, mask_id, bl):
    """A sequence of 40 random tokens, 20 tokens of the target's greedy continuation, then 20 random ones: a block
    anchored inside the greedy part is labelled with the greedy tokens, then (once) the target's argmax after the
    last greedy token, then nothing; a block anchored in the random tail only at k = 1."""
    g = torch.Generator().manual_seed(1)
    seq = torch.randint(100, 20000, (40,), generator=g).tolist()
    for _ in range(20):
        seq.append(int(target(torch.tensor([seq])).logits[0, -1].argmax()))
    seq += torch.randint(100, 20000, (20,), generator=g).tolist()
    argmax = target(torch.tensor([seq])).logits[0].argmax(-1).tolist()  # argmax[j]: the target's token after j
    batcher = T.Batcher(target, taps, mask_id, bl, 7.0, torch.device("cpu"), True, False, greedy_labels=True)
    anchors = [45, 50, 70]
    labels = batcher.build([(seq, 0)], 0, None, [("train", 0)], fixed=[anchors])[5][0].tolist()
    for j, a in enumerate(anchors):
        want, follows = [], True
        for k in range(1, bl):
            pos = a + k
            want.append(argmax[pos - 1] if follows and pos < len(seq) else T.IGNORE)
            follows &= pos < len(seq) and seq[pos] == argmax[pos - 1]
        if labels[j] != want:
            sys.exit(f"--greedy-labels at anchor {a}: {labels[j]}, expected {want}")
    print(f"greedy labels: the target's argmax continuation at anchors {anchors} "
          f"({sum(l != T.IGNORE for r in labels for l in r)} labels)")


if __name__ == "__main__":
    main()
