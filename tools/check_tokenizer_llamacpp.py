#!/usr/bin/env python3
"""Cross-checks kiln-tokenizer's committed id fixtures against llama.cpp's llama-tokenize (the ground truth for
GGUF tokenizer semantics). Not part of CI: it needs a llama.cpp build.

Usage: LLAMA_TOKENIZE=/path/to/llama-tokenize python3 tools/check_tokenizer_llamacpp.py QWEN3_VOCAB_GGUF
where QWEN3_VOCAB_GGUF is written by
  cargo run -p kiln-tokenizer --example vocab_gguf -- .test-assets/tokenizer-qwen3/tokenizer.json \
      .test-assets/tokenizer-qwen3/tokenizer_config.json qwen3-vocab.gguf
Exit status 1 if any string tokenizes differently.
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ASSETS = os.environ.get("KILN_TEST_ASSETS", os.path.join(ROOT, ".test-assets"))
FIX = os.path.join(ROOT, "crates", "kiln-tokenizer", "tests", "fixtures")


def llama_ids(binary, model, text, parse_special):
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        f.write(text.encode("utf-8"))
        path = f.name
    try:
        args = [binary, "-m", model, "-f", path, "--no-escape", "--no-bos", "--ids", "--log-disable"]
        if not parse_special:
            args.append("--no-parse-special")
        out = subprocess.run(args, capture_output=True, check=True).stdout.decode()
    finally:
        os.unlink(path)
    line = [l for l in out.splitlines() if l.startswith("[")][-1]
    return json.loads(line)


def main():
    binary = os.environ.get("LLAMA_TOKENIZE")
    if not binary or len(sys.argv) != 2:
        print(__doc__)
        return 2
    models = [
        ("qwen3", sys.argv[1], "ids_qwen3.json"),
        ("smollm2", os.path.join(ASSETS, "SmolLM2-135M-Instruct.Q4_1.gguf"), "ids_smollm2.json"),
        ("gemma3", os.path.join(ASSETS, "gemma-3-270m-q4_k_m.gguf"), "ids_gemma3.json"),
    ]
    bad = 0
    for name, gguf, fixture in models:
        fx = json.load(open(os.path.join(FIX, fixture), encoding="utf-8"))
        n = 0
        for mode, parse in (("plain", False), ("special", True)):
            for case in fx[mode]:
                got = llama_ids(binary, gguf, case["text"], parse)
                n += 1
                if got != case["ids"]:
                    bad += 1
                    print(f"{name} {mode} {case['text']!r}\n  llama.cpp {got}\n  fixture   {case['ids']}")
        for case in fx.get("transformers_gguf_differs", []):
            got = llama_ids(binary, gguf, case["text"], False)
            verdict = "agrees with transformers" if got == case["ids"] else "disagrees with transformers"
            print(f"{name}: llama.cpp {verdict} on {case['text']!r}")
        print(f"{name}: {n} strings checked")
    print("mismatches:", bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
