#!/usr/bin/env python3
"""A running `kiln serve` under concurrent load gives every request the text it gives that request alone.

usage: serve-check.py URL [--long-file FILE] [--max-tokens N] [--streams N] [--save FILE | --expect FILE]

Standard library only (the GPU machine has no `openai` package). Greedy `/v1/completions` requests: a few short
prompts and one long prompt (the first ~12,000 characters of --long-file: several prefill chunks), first each
alone, one after another, then all at once (half of them streamed), twice. Each concurrent text must equal its
solo text: on CUDA that checks the scheduler's prefill passes (each prompt chunk in a pass of its own) and the
decode rows' batch invariance end to end. `--save` writes the solo texts to a JSON file and `--expect` holds them to
such a file, e.g. a server with a speculative drafter to the texts of one without (greedy output is the same).
Prints the solo and concurrent wall times and completion tok/s; exits 1 on any difference.
"""
import argparse
import json
import sys
import threading
import time
import urllib.request

SHORT = [
    "The capital of France is",
    "def fibonacci(n):",
    "Three primary colors are",
    "Once upon a time, in a small village by the sea,",
    "The derivative of x squared is",
    "A haiku about the ocean:",
    "SELECT name FROM users WHERE",
]


def post(url, body):
    req = urllib.request.Request(
        url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        if not body.get("stream"):
            out = json.load(r)
            return out["choices"][0]["text"], out["usage"]["completion_tokens"]
        text, n = "", 0
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            ev = json.loads(data)
            for c in ev.get("choices", []):
                text += c.get("text") or ""
            if ev.get("usage"):
                n = ev["usage"]["completion_tokens"]
        return text, n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--long-file", help="text whose first ~12,000 characters make the long prompt")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--streams", type=int, default=len(SHORT) + 1, help="requests in the concurrent rounds")
    ap.add_argument("--save", help="write the solo texts here (JSON: prompt -> text)")
    ap.add_argument("--expect", help="the solo texts must equal this file's (written by --save)")
    args = ap.parse_args()
    prompts = list(SHORT)
    if args.long_file:
        with open(args.long_file, encoding="utf-8", errors="replace") as f:
            prompts.append("Summarize the following text.\n\n" + f.read(12000) + "\n\nSummary:")
    prompts = (prompts * (args.streams // len(prompts) + 1))[: args.streams]
    body = lambda p, stream: {  # noqa: E731
        "prompt": p,
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "stream": stream,
        **({"stream_options": {"include_usage": True}} if stream else {}),
    }

    t0 = time.time()
    solo = {}
    for p in dict.fromkeys(prompts):
        solo[p] = post(args.url, body(p, False))[0]
    t_solo = time.time() - t0

    bad = 0
    if args.save:
        with open(args.save, "w", encoding="utf-8") as f:
            json.dump(solo, f)
    if args.expect:
        with open(args.expect, encoding="utf-8") as f:
            want = json.load(f)
        for i, p in enumerate(solo):
            if want.get(p) != solo[p]:
                bad += 1
                print(f"FAIL prompt {i}: solo text differs from {args.expect}")
                print(f"  expected: {want.get(p)!r}")
                print(f"  got:      {solo[p]!r}")
    for rnd in range(2):
        got = [None] * len(prompts)
        errors = []

        def run(i):
            try:
                got[i] = post(args.url, body(prompts[i], i % 2 == 1))
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(f"request {i}: {e}")

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
        t0 = time.time()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.time() - t0
        for e in errors:
            print("FAIL", e)
        bad += len(errors)
        toks = 0
        for i, g in enumerate(got):
            if g is None:
                continue
            text, n = g
            toks += n
            if text != solo[prompts[i]]:
                bad += 1
                print(f"FAIL round {rnd}, request {i} ({'stream' if i % 2 else 'plain'}): concurrent text differs")
                print(f"  alone:      {solo[prompts[i]]!r}")
                print(f"  concurrent: {text!r}")
        print(
            f"round {rnd}: {len(prompts)} requests at once in {wall:.2f} s, {toks} completion tokens, "
            f"{toks / wall:.1f} tok/s (the {len(solo)} distinct prompts alone: {t_solo:.2f} s)"
        )
    if bad:
        print(f"serve-check: {bad} failures")
        sys.exit(1)
    print(
        "serve-check: every concurrent text equals its solo text"
        + (f", and every solo text {args.expect}'s" if args.expect else "")
    )


if __name__ == "__main__":
    main()
