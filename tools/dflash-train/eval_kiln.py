#!/usr/bin/env python3
"""Measures a trained drafter with kiln itself on the held-out prompts: for each prompt, `kiln run --chat --temp 0`
without and with `--draft`; reports τ (tokens emitted per target verify forward, over all prompts), the
accepted-drafts histogram, the wall-clock speed-up (generation time including prefill, model load excluded, as
kiln reports it on stderr; and of generation alone, prefill and the drafter's set-up left out) and checks that both outputs are identical (speculative decoding is lossless).

    python3 tools/dflash-train/eval_kiln.py --model .test-assets/SmolLM2-135M-Instruct.Q4_1.gguf --draft DIR \
        [-n 128] [--split test] [--json out.json] [--device cuda]
"""
import argparse
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))

PLAIN = re.compile(r"prompt (\d+) tokens in ([\d.]+) s .*generation (\d+) tokens in ([\d.]+) s")
DRAFT = re.compile(r"kiln: (\d+) tokens in ([\d.]+) s incl\. prefill")
ROUND = re.compile(r"dflash per round: draft ([\d.]+) ms, verify ([\d.]+) ms")
SPLIT = re.compile(r"dflash time: drafter state ([\d.]+) ms, prefill ([\d.]+) ms")
TAU = re.compile(r"dflash tau ([\d.]+) \((\d+) tokens over (\d+) verify forwards\); accepted-drafts histogram \[([\d, ]+)\]")


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return r.stdout, r.stderr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft", required=True, help="drafter directory or GGUF")
    ap.add_argument("--prompts", default=os.path.join(HERE, "prompts.jsonl"))
    ap.add_argument("--split", default="test")
    ap.add_argument("--kiln", default=os.path.join(ROOT, "target", "release", "kiln"))
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--limit", type=int, default=0, help="first N prompts only")
    ap.add_argument("--extra", default="", help="extra kiln run arguments, space-separated (e.g. '--device cuda')")
    ap.add_argument("--draft-extra", default="", help="extra arguments of the --draft runs only (e.g. '--draft-max 3')")
    ap.add_argument("--json", help="write the per-prompt results here")
    a = ap.parse_args()
    prompts = [json.loads(line) for line in open(a.prompts)]
    prompts = [p for p in prompts if p["split"] == a.split or a.split == "all"]
    if a.limit:
        prompts = prompts[:a.limit]
    base = [a.kiln, "run", "-m", a.model, "--chat", "--temp", "0", "-n", str(a.n), "-t", str(a.threads)]
    base += a.extra.split()
    rows = []
    hist = None
    for p in prompts:
        out0, err0 = run(base + ["-p", p["prompt"]])
        out1, err1 = run(base + ["-p", p["prompt"], "--draft", a.draft] + a.draft_extra.split())
        m0, m1, mt, mr = PLAIN.search(err0), DRAFT.search(err1), TAU.search(err1), ROUND.search(err1)
        ms = SPLIT.search(err1)
        if not (m0 and m1 and mt):
            sys.exit(f"cannot parse kiln's stderr for prompt {p['id']}:\n{err0[-800:]}\n{err1[-800:]}")
        h = [int(x) for x in mt.group(4).split(",")]
        hist = h if hist is None else [x + y for x, y in zip(hist, h)]
        row = {"id": p["id"], "same": out0 == out1, "tokens": int(m1.group(1)),
               "plain_s": float(m0.group(2)) + float(m0.group(4)), "draft_s": float(m1.group(2)),
               "emitted": int(mt.group(2)), "verify": int(mt.group(3)),
               "draft_ms": float(mr.group(1)) if mr else None, "verify_ms": float(mr.group(2)) if mr else None,
               # Generation alone (after the prompt's prefill and the drafter's set-up), as plain's "generation".
               "plain_gen_s": float(m0.group(4)),
               "draft_gen_s": float(m1.group(2)) - (float(ms.group(1)) + float(ms.group(2))) / 1e3 if ms else None}
        rows.append(row)
        print(f"prompt {p['id']:3d}: tau {int(mt.group(2)) / max(1, int(mt.group(3))):.2f}, "
              f"{row['tokens']} tokens, plain {row['plain_s']:.2f} s, draft {row['draft_s']:.2f} s, "
              f"{'same' if row['same'] else 'DIFFERENT'}", flush=True)
    emitted = sum(r["emitted"] for r in rows)
    verify = sum(r["verify"] for r in rows)
    plain = sum(r["plain_s"] for r in rows)
    draft = sum(r["draft_s"] for r in rows)
    tokens = sum(r["tokens"] for r in rows)
    summary = {"prompts": len(rows), "tau": emitted / max(1, verify), "tokens": tokens,
               "plain_tok_s": tokens / plain, "draft_tok_s": tokens / draft, "speedup": plain / draft,
               "identical": sum(r["same"] for r in rows), "accepted_hist": hist}
    if all(r["draft_gen_s"] is not None for r in rows):
        summary["gen_speedup"] = sum(r["plain_gen_s"] for r in rows) / sum(r["draft_gen_s"] for r in rows)
    timed = [r for r in rows if r["draft_ms"] is not None]
    if timed:  # per-round cost next to one plain decode step, weighted by rounds
        rounds = sum(r["verify"] for r in timed)
        summary["round_draft_ms"] = sum(r["draft_ms"] * r["verify"] for r in timed) / rounds
        summary["round_verify_ms"] = sum(r["verify_ms"] * r["verify"] for r in timed) / rounds
        summary["plain_ms_per_token"] = 1000 * plain / tokens
    print(f"{len(rows)} prompts: tau {summary['tau']:.2f} ({emitted} tokens / {verify} verify forwards); "
          f"plain {summary['plain_tok_s']:.1f} tok/s, dflash {summary['draft_tok_s']:.1f} tok/s, "
          f"speed-up {summary['speedup']:.2f}x; identical outputs {summary['identical']}/{len(rows)}; "
          f"accepted-drafts histogram {hist}")
    # Draft k's acceptance given drafts 1..k-1 were (from the histogram: rounds that reached draft k over those
    # that reached k - 1; a round cut short by the token limit counts as a rejection).
    reach = [sum(hist[k:]) for k in range(len(hist))]
    summary["accept_given_prev"] = [reach[k] / reach[k - 1] for k in range(1, len(reach)) if reach[k - 1]]
    print("draft k accepted given drafts 1..k-1: "
          + ", ".join(f"{k + 1}: {p:.3f}" for k, p in enumerate(summary["accept_given_prev"][:6])))
    if "gen_speedup" in summary:
        print(f"generation alone (prefill and set-up left out of both): speed-up {summary['gen_speedup']:.2f}x")
    if timed:
        print(f"per round: draft {summary['round_draft_ms']:.1f} ms + verify {summary['round_verify_ms']:.1f} ms; "
              f"plain decoding {summary['plain_ms_per_token']:.1f} ms a token (prefill included)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"summary": summary, "rows": rows}, f, indent=1)
    if summary["identical"] != len(rows):
        sys.exit("speculative output differs from plain greedy output")


if __name__ == "__main__":
    main()
