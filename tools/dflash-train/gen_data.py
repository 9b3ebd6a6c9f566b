#!/usr/bin/env python3
"""Data generator for the DFlash drafter: the target's own responses to prompts.jsonl, produced by kiln itself
(`kiln run --chat`), stored as token ids (one JSON object a line: prompt id, split, sample, prompt_ids, response_ids).

Greedy responses for every prompt (these are what the drafter must predict at temperature 0), plus optional extra
low-temperature samples of the training prompts (more varied data from the same distribution).
Token ids come from `kiln tokenize`: the prompt is the GGUF chat template rendered for one user message, the
response is kiln's text re-tokenized (the same ids kiln produced, save for rare BPE merge differences), followed by
<|im_end|> when the model stopped by itself.

    nice -n 19 python3 tools/dflash-train/gen_data.py --model .test-assets/SmolLM2-135M-Instruct.Q4_1.gguf \
        --out tools/dflash-train/data.jsonl [--samples 1 --temp 0.6] [-n 256]
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
# SmolLM2's chat template for one user message (the GGUF's tokenizer.chat_template adds this system prompt).
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
IM_END = 2


def chat_text(prompt):
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{prompt}<|im_end|>\n"
            f"<|im_start|>assistant\n")


def tokenize(kiln, model, text, special):
    cmd = [kiln, "tokenize", "-m", model, "--json"] + (["--special"] if special else []) + ["--", text]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)["ids"]


def generate(kiln, model, prompt, n, temp, seed, threads):
    cmd = [kiln, "run", "-m", model, "--chat", "-p", prompt, "-n", str(n), "-t", str(threads),
           "--temp", str(temp), "--seed", str(seed)]
    if temp > 0:
        cmd += ["--top-k", "0", "--top-p", "1", "--min-p", "0"]
    r = subprocess.run(cmd, check=True, capture_output=True, text=True)
    text = r.stdout[:-1] if r.stdout.endswith("\n") else r.stdout  # kiln ends its output with one newline
    return text, "finish: stop" in r.stderr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="target GGUF")
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompts", default=os.path.join(HERE, "prompts.jsonl"))
    ap.add_argument("--kiln", default=os.path.join(ROOT, "target", "release", "kiln"))
    ap.add_argument("-n", type=int, default=256, help="max new tokens per response")
    ap.add_argument("--samples", type=int, default=0, help="extra sampled responses per training prompt")
    ap.add_argument("--temp", type=float, default=0.6, help="temperature of the extra samples")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    prompts = [json.loads(line) for line in open(a.prompts)]
    done = set()
    if os.path.exists(a.out):  # resume: keep what is there
        for line in open(a.out):
            r = json.loads(line)
            done.add((r["id"], r["sample"]))
    t0 = time.time()
    n_tok = 0
    with open(a.out, "a") as f:
        for p in prompts:
            samples = [0] + (list(range(1, a.samples + 1)) if p["split"] == "train" else [])
            prompt_ids = None
            for s in samples:
                if (p["id"], s) in done:
                    continue
                if prompt_ids is None:
                    prompt_ids = tokenize(a.kiln, a.model, chat_text(p["prompt"]), True)
                temp = 0.0 if s == 0 else a.temp
                text, stopped = generate(a.kiln, a.model, p["prompt"], a.n, temp, 1000 * p["id"] + s, a.threads)
                resp = tokenize(a.kiln, a.model, text, False) if text else []
                if stopped:
                    resp.append(IM_END)
                n_tok += len(resp)
                f.write(json.dumps({"id": p["id"], "split": p["split"], "sample": s,
                                    "prompt_ids": prompt_ids, "response_ids": resp}, separators=(",", ":")) + "\n")
                f.flush()
            print(f"\rprompt {p['id'] + 1}/{len(prompts)}, {n_tok} response tokens, {time.time() - t0:.0f} s",
                  end="", file=sys.stderr)
    print(file=sys.stderr)


if __name__ == "__main__":
    main()
