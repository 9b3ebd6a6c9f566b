#!/usr/bin/env python3
"""Reference logits from transformers (fp32, eager attention) on the SAME weights kiln loads.

Writes one dump per model into crates/kiln-engine/tests/fixtures/logits/ (format: kiln_engine::fidelity::LogitDump):
teacher-forced top-64 logits + the full log-sum-exp at every position of a few fixed texts, and greedy
continuations (with the reference's top-1 − top-2 gap at each step). The dump's metadata records the model and the
sha256 of the exact GGUF, which the parity tests check before comparing.

Models:
- SmolLM2-135M-Instruct Q4_1 (real; .test-assets, fetched by tools/fetch-test-assets.sh): transformers dequantizes it.
- tiny random-weight llama / qwen3 / qwen3moe models written by `kiln synth` (built-in byte tokenizer, seed 1):
  the tests regenerate the same bytes with kiln_engine::synth, so no GGUF is committed.

Usage: python3 tools/gen_logit_fixtures.py [--kiln target/release/kiln]
Needs: torch, transformers, accelerate, gguf, numpy.
"""

import argparse
import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(ROOT, "crates", "kiln-engine", "tests", "fixtures", "logits")
K = 64

# Fixed English prompts for the real model: teacher-forced texts and greedy prompts.
TEXTS = [
    "The capital of France is Paris, and the capital of Germany is Berlin. Both cities are known for",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) +",
    "Water boils at 100 degrees Celsius at sea level. At higher altitudes, the boiling point",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "The mitochondria is often called the powerhouse of the cell because it produces",
    "To make a cup of tea, first boil some water, then put a tea bag in a cup and",
    "In 1969, Neil Armstrong became the first person to walk on the Moon. He said",
    "The quick brown fox jumps over the lazy dog. This sentence contains every letter of",
    "Machine learning models are trained on data. During training, the model adjusts its",
    "Dear Sir or Madam, I am writing to inquire about the position advertised in your",
    "Photosynthesis is the process by which green plants use sunlight to turn water and carbon dioxide into",
    "The stock market fell sharply on Monday after the central bank announced that interest rates would",
    "for i in range(10):\n    if i % 2 == 0:\n        print(i, \"is even\")\n    else:",
    "The human heart has four chambers: two atria and two ventricles. Blood flows from the",
    "Shakespeare wrote many famous plays, including Hamlet, Macbeth and Romeo and Juliet, which tell",
    "To reset your password, open the settings menu, choose your account, and then click on",
    "The Great Wall of China stretches for thousands of kilometres across the north of the country and was built",
    "A healthy breakfast might include oatmeal with fruit, a boiled egg, and a glass of",
    "The Pacific Ocean is the largest and deepest of the world's oceans. It covers more than",
    "Thank you for your order! Your package will be shipped within two business days and should arrive",
    "SELECT name, age FROM users WHERE age > 30 ORDER BY",
    "The French Revolution began in 1789 and led to the end of the monarchy. Its ideals of liberty,",
    "Honey never spoils. Archaeologists have found pots of honey in ancient Egyptian tombs that are",
    "When learning to ride a bicycle, most children start with training wheels before they",
    "Electric cars are becoming more popular because they produce no exhaust and are cheaper to",
    "The theory of evolution by natural selection was first proposed by Charles Darwin, who observed that",
    "In the morning the streets were quiet, but by noon the market square was full of people selling",
    "A triangle has three sides and three angles, and the sum of its angles is always",
    "Please remember to bring your passport, your ticket, and a copy of your hotel reservation when you",
    "The library opens at nine in the morning and closes at eight in the evening, except on",
]
PROMPTS = [
    "The best way to learn a new language is",
    "Here is a short poem about the ocean:\n",
    "Q: What is the largest planet in the solar system?\nA:",
    "List three primary colors:",
    "The history of the Roman Empire",
    "import numpy as np\n\ndef mean(x):",
    "My favourite food is",
    "Climate change is caused by",
    "The recipe for pancakes requires",
    "Once there was a robot who",
]

# Tiny synthetic models: (name, arch, quant). Seed 1, preset "tiny", built-in 512-token byte tokenizer.
TINY = [
    ("qwen3-tiny-f32", "qwen3", "f32"),
    ("qwen3-tiny-q4_k_m", "qwen3", "q4_k_m"),
    ("qwen3moe-tiny-f16", "qwen3moe", "f16"),
    ("qwen3moe-tiny-q4_k_m", "qwen3moe", "q4_k_m"),
    ("llama-tiny-q8_0", "llama", "q8_0"),
]
TINY_SEED = 1
# Tiny fixtures keep fewer positions (5 texts x 24 tokens, 10 prompts x 8 tokens + 32 generated) so five of them
# stay well under the repository's fixture budget.
TINY_TEXTS, TINY_TEXT_LEN, TINY_PROMPT_LEN, TINY_GEN = 5, 24, 8, 32
TINY_TOKENS = 267  # the built-in tokenizer's real entries (bytes, merges, specials); the rest are [PAD] rows


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def gguf_fields(path):
    import gguf

    r = gguf.GGUFReader(path)
    out = {}
    for k, f in r.fields.items():
        if k.startswith("tokenizer."):
            continue
        try:
            out[k] = f.contents()
        except Exception:  # noqa: BLE001 - a field we do not need
            pass
    return out


def load(path):
    """transformers model on the GGUF, with the config fields its GGUF loader misses set from the metadata."""
    d, f = os.path.dirname(path), os.path.basename(path)
    meta = gguf_fields(path)
    arch = meta["general.architecture"]
    cfg = AutoConfig.from_pretrained(d, gguf_file=f)
    if arch in ("qwen3", "qwen3moe"):
        cfg.head_dim = int(meta[f"{arch}.attention.key_length"])
    if arch == "qwen3moe":
        # The loader ignores expert_feed_forward_length (falls back to 768).
        cfg.moe_intermediate_size = int(meta["qwen3moe.expert_feed_forward_length"])
        cfg.norm_topk_prob = True
    cfg.tie_word_embeddings = False  # set below from the file
    model = AutoModelForCausalLM.from_pretrained(
        d, gguf_file=f, config=cfg, dtype=torch.float32, attn_implementation="eager"
    )
    import gguf

    names = {t.name for t in gguf.GGUFReader(path).tensors}
    if "output.weight" not in names:
        # Tied embeddings: make the LM head the embedding (the loader may or may not have done it).
        model.lm_head.weight = model.model.embed_tokens.weight
    model.eval()
    return model


@torch.no_grad()
def teacher_forced(model, ids):
    logits = model(torch.tensor([ids])).logits[0].double()
    lse = torch.logsumexp(logits, dim=-1)
    positions = []
    for i in range(len(ids)):
        row = logits[i]
        # Descending by logit, then ascending id (kiln's tie order).
        top = torch.topk(row, K + 16)
        cand = sorted(zip(top.values.tolist(), top.indices.tolist()), key=lambda t: (-t[0], t[1]))[:K]
        order = [j for _, j in cand]
        positions.append((float(lse[i]), order, [float(row[j]) for j in order]))
    return positions


@torch.no_grad()
def greedy(model, prompt, n):
    out = model(torch.tensor([prompt]), use_cache=True)
    past, logits = out.past_key_values, out.logits[0, -1]
    gen, margins = [], []
    for _ in range(n):
        top2 = torch.topk(logits, 2)
        tok = int(torch.argmax(logits))  # first index on ties, as kiln
        gen.append(tok)
        margins.append(float(top2.values[0] - top2.values[1]))
        out = model(torch.tensor([[tok]]), past_key_values=past, use_cache=True)
        past, logits = out.past_key_values, out.logits[0, -1]
    return gen, margins


def write_dump(path, meta, texts, greedy_cases):
    b = bytearray(b"KILNTOPK")
    b += struct.pack("<I", 1)
    m = json.dumps(meta, sort_keys=True).encode()
    b += struct.pack("<I", len(m)) + m
    b += struct.pack("<I", K)
    b += struct.pack("<I", len(texts))
    for ids, positions in texts:
        b += struct.pack("<I", len(ids)) + struct.pack(f"<{len(ids)}I", *ids)
        for lse, top_ids, top_logits in positions:
            b += struct.pack("<f", lse) + struct.pack(f"<{K}I", *top_ids) + struct.pack(f"<{K}f", *top_logits)
    b += struct.pack("<I", len(greedy_cases))
    for prompt, gen, margins in greedy_cases:
        b += struct.pack("<I", len(prompt)) + struct.pack(f"<{len(prompt)}I", *prompt)
        b += struct.pack("<I", len(gen)) + struct.pack(f"<{len(gen)}I", *gen) + struct.pack(f"<{len(gen)}f", *margins)
    with open(path, "wb") as f:
        f.write(b)
    print(f"wrote {path} ({len(b)} bytes)", file=sys.stderr)


def base_meta(path, name):
    return {
        "model": name,
        "sha256": sha256(path),
        "reference": f"transformers {transformers.__version__}, torch {torch.__version__}, fp32, eager attention",
        "k": K,
    }


def smollm2():
    path = os.path.join(os.environ.get("KILN_TEST_ASSETS", os.path.join(ROOT, ".test-assets")),
                        "SmolLM2-135M-Instruct.Q4_1.gguf")
    model = load(path)
    tok = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    texts = []
    for t in TEXTS:
        ids = tok(t, add_special_tokens=False)["input_ids"]
        texts.append((ids, teacher_forced(model, ids)))
    cases = []
    for p in PROMPTS:
        ids = tok(p, add_special_tokens=False)["input_ids"]
        gen, margins = greedy(model, ids, 64)
        cases.append((ids, gen, margins))
    meta = base_meta(path, "SmolLM2-135M-Instruct.Q4_1.gguf")
    meta["texts"] = TEXTS
    meta["prompts"] = PROMPTS
    write_dump(os.path.join(OUT_DIR, "smollm2-135m-q4_1.bin"), meta, texts, cases)


def tiny(kiln, tmp):
    rng = np.random.default_rng(1234)
    texts_ids = [rng.integers(0, TINY_TOKENS, TINY_TEXT_LEN).tolist() for _ in range(TINY_TEXTS)]
    prompt_ids = [rng.integers(0, TINY_TOKENS, TINY_PROMPT_LEN).tolist() for _ in range(10)]
    for name, arch, quant in TINY:
        path = os.path.join(tmp, name + ".gguf")
        subprocess.run([kiln, "synth", "--arch", arch, "--preset", "tiny", "--quant", quant,
                        "--seed", str(TINY_SEED), "-o", path], check=True)
        model = load(path)
        texts = [(ids, teacher_forced(model, ids)) for ids in texts_ids]
        cases = []
        for ids in prompt_ids:
            gen, margins = greedy(model, ids, TINY_GEN)
            cases.append((ids, gen, margins))
        meta = base_meta(path, name + ".gguf")
        meta["synth"] = {"arch": arch, "preset": "tiny", "quant": quant, "seed": TINY_SEED}
        write_dump(os.path.join(OUT_DIR, name + ".bin"), meta, texts, cases)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default=os.path.join(ROOT, "target", "release", "kiln"))
    ap.add_argument("--only", choices=["smollm2", "tiny"])
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    os.makedirs(OUT_DIR, exist_ok=True)
    if a.only != "smollm2":
        with tempfile.TemporaryDirectory() as tmp:
            tiny(a.kiln, tmp)
    if a.only != "tiny":
        smollm2()


if __name__ == "__main__":
    main()
