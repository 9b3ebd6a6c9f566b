#!/usr/bin/env python3
"""Load test for `kiln serve` (not a CI test): N concurrent streaming chat clients for M minutes on loopback.

Reports requests/s, generated tokens/s, p50/p99 time to first token and inter-token latency, errors (must be 0),
and the server's resident memory before and after (from /proc, so run it on the server's machine).

    kiln serve -m model.gguf --parallel 8 -c 8192 &
    python3 bench/load-test.py --url http://127.0.0.1:8080 --streams 8 --minutes 2

Standard library only. Prompts mix short questions with a long shared system prompt, so chunked prefill and
prefix reuse are exercised along with decode.
"""
import argparse
import http.client
import json
import os
import random
import statistics
import subprocess
import threading
import time
import urllib.parse

QUESTIONS = [
    "What is the capital of France?", "Write a haiku about the sea.", "Name three primary colors.",
    "How many legs does a spider have?", "Explain what a CPU does.", "Give me a synonym for happy.",
    "What is 12 times 12?", "Describe a cat in five words.", "Why is the sky blue?", "Tell me a short joke.",
    "List four planets.", "What does a compiler do?",
]
SYSTEM = "You are a helpful assistant. Answer clearly and politely, and keep answers short. " * 12


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def find_pid(port):
    try:
        out = subprocess.run(["pgrep", "-f", "kiln serve"], capture_output=True, text=True).stdout.split()
    except OSError:
        return None
    for pid in out:
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if str(port).encode() in cmd or b"--port" not in cmd:
            return int(pid)
    return None


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.ttft, self.itl, self.tokens, self.requests, self.errors = [], [], 0, 0, []


def one_stream(host, port, key, rng, st, max_tokens):
    long = rng.random() < 0.3
    messages = ([{"role": "system", "content": SYSTEM}] if long else []) + [
        {"role": "user", "content": rng.choice(QUESTIONS)}]
    body = json.dumps({"messages": messages, "max_tokens": rng.randint(max_tokens // 2, max_tokens),
                       "temperature": 0.7, "seed": rng.randrange(1 << 31), "stream": True,
                       "stream_options": {"include_usage": True}})
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=300)
    try:
        conn.request("POST", "/v1/chat/completions", body, headers)
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
        last, first, done, usage, ttft, gaps = None, True, False, None, None, []
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(f"stream error: {chunk['error']}")
            if chunk.get("usage"):
                usage = chunk["usage"]
            for ch in chunk.get("choices", []):
                if ch["delta"].get("content"):
                    now = time.perf_counter()
                    if first:
                        ttft, first = now - t0, False
                    else:
                        gaps.append(now - last)
                    last = now
        if not done or usage is None:
            raise RuntimeError("stream ended without usage and [DONE]")
        with st.lock:
            st.requests += 1
            st.tokens += usage["completion_tokens"]
            if ttft is not None:
                st.ttft.append(ttft)
            st.itl.extend(gaps)
    except Exception as e:  # noqa: BLE001 - every failure counts as an error
        with st.lock:
            st.errors.append(repr(e))
    finally:
        conn.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--minutes", type=float, default=2.0)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--api-key", default=os.environ.get("KILN_API_KEY", ""))
    ap.add_argument("--pid", type=int, help="server process id for memory readings (default: found by pgrep)")
    args = ap.parse_args()
    u = urllib.parse.urlparse(args.url)
    host, port = u.hostname, u.port or 80
    pid = args.pid or find_pid(port)
    rss0 = rss_kib(pid) if pid else None
    st = Stats()
    deadline = time.time() + args.minutes * 60

    def worker(i):
        rng = random.Random(i)
        while time.time() < deadline:
            one_stream(host, port, args.api_key, rng, st, args.max_tokens)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(args.streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    rss1 = rss_kib(pid) if pid else None
    ms = lambda x: f"{x * 1000:.1f} ms"
    rows = [
        ("streams × duration", f"{args.streams} × {args.minutes:g} min (wall {wall:.0f} s)"),
        ("requests", f"{st.requests}"),
        ("requests/s", f"{st.requests / wall:.2f}"),
        ("generated tokens/s", f"{st.tokens / wall:.1f}"),
        ("TTFT p50 / p99", f"{ms(pct(st.ttft, 50))} / {ms(pct(st.ttft, 99))}"),
        ("inter-token p50 / p99", f"{ms(pct(st.itl, 50))} / {ms(pct(st.itl, 99))}"),
        ("errors", f"{len(st.errors)}"),
        ("server RSS before / after", f"{rss0 / 1024:.1f} MiB / {rss1 / 1024:.1f} MiB" if rss0 and rss1
         else "unknown (pass --pid)"),
    ]
    print("| metric | value |\n|---|---|")
    for k, v in rows:
        print(f"| {k} | {v} |")
    for e in st.errors[:5]:
        print("error:", e)
    raise SystemExit(1 if st.errors else 0)


if __name__ == "__main__":
    main()
