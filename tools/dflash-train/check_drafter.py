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
    feat = batcher.features([(ids[0].tolist(), 0)])[0]
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
    check_soft_labels(target, taps, mask_id, bl, seq, anchors)


@torch.no_grad()
def check_soft_labels(target, taps, mask_id, bl, seq, anchors):
    """--soft-labels K: each labelled block position carries the target's K likeliest tokens after the position
    before it (the argmax first) with their probabilities; with K = 1 the soft loss is the label's."""
    probs = target(torch.tensor([seq])).logits[0].float().softmax(-1)  # probs[j]: the target's after j
    k = 4
    batcher = T.Batcher(target, taps, mask_id, bl, 7.0, torch.device("cpu"), True, False, greedy_labels=True,
                        soft_labels=k)
    batch = batcher.build([(seq, 0)], 0, None, [("train", 0)], fixed=[anchors])
    labels, sel, (top_ids, top_p) = batch[5], batch[6], batch[7]
    worst = 0.0
    for row, flat in enumerate(sel.tolist()):
        j, pos = divmod(flat, bl - 1)
        before = anchors[j] + pos  # block position pos + 1 predicts the token after anchor + pos
        p, ids = probs[before].topk(k)
        if top_ids[row, 0] != labels[0, j, pos] or set(top_ids[row].tolist()) != set(ids.tolist()):
            sys.exit(f"--soft-labels at anchor {anchors[j]}, block position {pos + 1}: {top_ids[row].tolist()}, "
                     f"expected {ids.tolist()} with the label {labels[0, j, pos].item()} first")
        got = dict(zip(top_ids[row].tolist(), top_p[row].float().tolist()))
        worst = max(worst, max(abs(got[i] - q) for i, q in zip(ids.tolist(), p.tolist())))
    if worst > 1e-3:
        sys.exit(f"--soft-labels: probabilities off by {worst:.3g}")
    # The same hidden states through both losses: the K = 1 soft loss (the argmax, renormalized to 1) is the label's.
    one = T.Batcher(target, taps, mask_id, bl, 7.0, torch.device("cpu"), True, False, greedy_labels=True,
                    soft_labels=1)
    batch1 = one.build([(seq, 0)], 0, None, [("train", 0)], fixed=[anchors])
    hid = torch.randn(1, len(anchors) * bl, target.config.hidden_size, generator=torch.Generator().manual_seed(5))
    head = target.get_output_embeddings().weight
    hard = T.draft_loss(lambda *_: hid, head, batch1, one.pos_weight, bl, False, 0.0)[0].item()
    soft = T.draft_loss(lambda *_: hid, head, batch1, one.pos_weight, bl, False, 1.0)[0].item()
    mixed = T.draft_loss(lambda *_: hid, head, batch, batcher.pos_weight, bl, False, 0.5)[0].item()
    if abs(hard - soft) > 1e-4 * abs(hard):
        sys.exit(f"--soft-labels 1 --soft-weight 1: loss {soft}, the label's {hard}")
    print(f"soft labels: the target's top {k} at {len(sel)} labelled positions (probabilities within {worst:.2g}); "
          f"K = 1 soft loss {soft:.5f} = label loss {hard:.5f}; K = {k} at weight 0.5: {mixed:.5f}")


if __name__ == "__main__":
    main()
