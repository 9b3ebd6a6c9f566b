#!/usr/bin/env python3
"""Trains a DFlash drafter for a llama-architecture GGUF target (SmolLM2-135M-Instruct) and writes it in the z-lab
format kiln loads (`config.json` + bf16 `model.safetensors`).

Recipe (DFlash paper / z-lab): the target is teacher-forced over prompt + its own response and its hidden states
after the tapped layers are taken on the fly; random anchor positions a in the response; the drafter sees the
context features of positions < a and the block [token(a), MASK x (B-1)] at positions a..a+B-1 (non-causal in the
block), and predicts token(a+k) at block position k; loss = CE over k = 1..B-1 weighted exp(-(k-1)/gamma).
Many anchors of one sequence are trained in one pass: each block's queries see only its own block and the
context before its anchor (an attention mask), exactly what one inference round sees.
The drafter is a stack of Qwen3 layers at the target's hidden size; the target's embedding and LM head are shared
and frozen. AdamW, linear warm-up then cosine decay over the step or time budget.

    python3 tools/dflash-train/train.py --gguf .test-assets/SmolLM2-135M-Instruct.Q4_1.gguf \
        --data tools/dflash-train/data.jsonl --out OUT --minutes 30 [--layers 1] [--device cpu|cuda]
"""
import argparse
import collections
import contextlib
import copy
import gzip
import json
import math
import os
import random
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fastgen import generate_batch  # noqa: E402
from gguf_target import dequantize, load_llama, read_gguf  # noqa: E402

IGNORE = -100
# SmolLM2 has no mask token. `<empty_output>` (id 16) is a special token of its vocabulary (a Jupyter-notebook
# marker) that never occurs in chat; its row of the embedding table is a trained, distinct vector. The
# drafter only needs a fixed input at the draft positions that no real token shares.
DEFAULT_MASK_ID = 16


def default_taps(n_target_layers, n_taps):
    """z-lab's rule for spreading taps over the target: round(1 + i*(L-4)/(n-1))."""
    if n_taps == 1:
        return [n_target_layers // 2]
    return [round(1 + i * (n_target_layers - 4) / (n_taps - 1)) for i in range(n_taps)]


class RMSNorm(nn.Module):
    """Qwen3's RMSNorm: normalized in float32, scaled in the input dtype."""

    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


def rope_tables(pos, head_dim, theta):
    """cos/sin of shape [B, 1, N, head_dim] for integer positions [B, N] (HF rotate-half layout)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=pos.device, dtype=torch.float32) / head_dim))
    f = pos.float()[..., None] * inv
    emb = torch.cat([f, f], dim=-1)
    return emb.cos()[:, None], emb.sin()[:, None]


def rotate(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat([-x2, x1], dim=-1) * sin.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, nh, nkv, hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.q_proj = nn.Linear(h, nh * hd, bias=False)
        self.k_proj = nn.Linear(h, nkv * hd, bias=False)
        self.v_proj = nn.Linear(h, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, h, bias=False)
        self.q_norm = RMSNorm(hd, c["rms_norm_eps"])
        self.k_norm = RMSNorm(hd, c["rms_norm_eps"])

    def forward(self, x, ctx, rope_q, rope_k, mask):
        b, n, _ = x.shape
        t = ctx.shape[1]
        q = self.q_norm(self.q_proj(x).view(b, n, self.nh, self.hd)).transpose(1, 2)
        # Context features and block tokens share the K/V projections; K is normalized and rotated as one.
        k = torch.cat([self.k_proj(ctx), self.k_proj(x)], dim=1).view(b, t + n, self.nkv, self.hd)
        v = torch.cat([self.v_proj(ctx), self.v_proj(x)], dim=1).view(b, t + n, self.nkv, self.hd)
        k = self.k_norm(k).transpose(1, 2)
        v = v.transpose(1, 2)
        q = rotate(q, *rope_q)
        k = rotate(k, *rope_k)
        rep = self.nh // self.nkv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.hd ** -0.5)
        return self.o_proj(o.transpose(1, 2).reshape(b, n, self.nh * self.hd))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, ff = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(h, ff, bias=False)
        self.up_proj = nn.Linear(h, ff, bias=False)
        self.down_proj = nn.Linear(ff, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, x, ctx, rope_q, rope_k, mask):
        x = x + self.self_attn(self.input_layernorm(x), ctx, rope_q, rope_k, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Drafter(nn.Module):
    """The DFlash drafter; parameter names are the z-lab checkpoint's tensor names."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        h = c["hidden_size"]
        n_taps = len(c["dflash_config"]["target_layer_ids"])
        self.layers = nn.ModuleList([Layer(c) for _ in range(c["num_hidden_layers"])])
        self.fc = nn.Linear(n_taps * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, c["rms_norm_eps"])
        self.norm = RMSNorm(h, c["rms_norm_eps"])
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=c["initializer_range"])

    def forward(self, ctx_feat, ctx_pos, blk_emb, blk_pos, mask):
        """ctx_feat [B,T,taps*H], ctx_pos [B,T], blk_emb [B,N,H], blk_pos [B,N], mask [B,1,N,T+N] (True = visible)."""
        hd, theta = self.c["head_dim"], self.c["rope_theta"]
        ctx = self.hidden_norm(self.fc(ctx_feat))
        rope_q = rope_tables(blk_pos, hd, theta)
        rope_k = rope_tables(torch.cat([ctx_pos, blk_pos], dim=1), hd, theta)
        x = blk_emb
        for layer in self.layers:
            x = layer(x, ctx, rope_q, rope_k, mask)
        return self.norm(x)


def drafter_config(target_cfg, layers, taps, mask_id, block, ff):
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": target_cfg.hidden_size,
        "intermediate_size": ff or target_cfg.intermediate_size,
        "num_hidden_layers": layers,
        "num_attention_heads": target_cfg.num_attention_heads,
        "num_key_value_heads": target_cfg.num_key_value_heads,
        "head_dim": target_cfg.hidden_size // target_cfg.num_attention_heads,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": float(getattr(target_cfg, "rope_theta", None)
                            or target_cfg.rope_parameters["rope_theta"]),
        "max_position_embeddings": target_cfg.max_position_embeddings,
        "vocab_size": target_cfg.vocab_size,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "layer_types": ["full_attention"] * layers,
        "block_size": block,
        "num_target_layers": target_cfg.num_hidden_layers,
        "dflash_config": {"mask_token_id": mask_id, "target_layer_ids": taps},
        "torch_dtype": "bfloat16",
    }


def save_drafter(model, out):
    from safetensors.torch import save_file

    os.makedirs(out, exist_ok=True)
    state = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(model.c, f, indent=2)


def load_init(path, drafter, keep_layers=None):
    """Loads drafter weights to start from: a z-lab directory (model.safetensors) or a `kiln convert-draft` GGUF
    (tensors under the safetensors names, matrices dequantized). Its config must equal the drafter's, except that
    `keep_layers` (indices into the init's layers, in order) starts a shallower drafter from some of its layers, a
    wider FFN (--ff) starts from a narrower one, and more taps (--taps) from some of them."""
    if os.path.isdir(path):
        from safetensors.torch import load_file

        with open(os.path.join(path, "config.json")) as f:
            cfg = json.load(f)
        state = load_file(os.path.join(path, "model.safetensors"))
    else:
        meta, tensors = read_gguf(path)
        cfg = json.loads(meta["dflash.config_json"])
        state = {k: torch.from_numpy(dequantize(k, ty, shape, raw)) for k, (ty, shape, raw) in tensors.items()}
    if keep_layers is not None:
        n = cfg["num_hidden_layers"]
        if len(keep_layers) != drafter.c["num_hidden_layers"] or any(not 0 <= l < n for l in keep_layers):
            sys.exit(f"--init-layers {keep_layers}: pick {drafter.c['num_hidden_layers']} of the init's layers "
                     f"0..{n - 1}")
        renamed = {}
        for k, v in state.items():
            if k.startswith("layers."):
                idx, rest = k[len("layers."):].split(".", 1)
                if int(idx) in keep_layers:
                    renamed[f"layers.{keep_layers.index(int(idx))}.{rest}"] = v
            else:
                renamed[k] = v
        state = renamed
        cfg = dict(cfg, num_hidden_layers=len(keep_layers),
                   layer_types=[cfg["layer_types"][l] for l in keep_layers])
    state = {k: v.float() for k, v in state.items()}
    ff, wide = cfg["intermediate_size"], drafter.c["intermediate_size"]
    if ff < wide:
        # A wider FFN (--ff) from a narrower init: the new units' gate/up rows keep this drafter's random init and
        # their down-projection columns start at zero, so the widened drafter starts as the init's function.
        own = drafter.state_dict()
        for k, v in list(state.items()):
            if k.endswith(("mlp.gate_proj.weight", "mlp.up_proj.weight")):
                state[k] = torch.cat([v, own[k][ff:].to(v.device, v.dtype)], 0)
            elif k.endswith("mlp.down_proj.weight"):
                state[k] = torch.cat([v, torch.zeros(v.shape[0], wide - ff)], 1)
        cfg = dict(cfg, intermediate_size=wide)
    taps, mine = cfg["dflash_config"]["target_layer_ids"], drafter.c["dflash_config"]["target_layer_ids"]
    if taps != mine and set(taps) < set(mine):
        # More taps (--taps) from an init with some of them: each of the init's taps keeps its fc columns, moved to
        # its place in the new order, and the new taps' columns start at zero, so the drafter starts as the init's
        # function and learns what the new layers add.
        h = cfg["hidden_size"]
        old = state["fc.weight"]
        fc = torch.zeros(old.shape[0], len(mine) * h)
        for i, l in enumerate(taps):
            j = mine.index(l)
            fc[:, j * h:(j + 1) * h] = old[:, i * h:(i + 1) * h]
        state["fc.weight"] = fc
        cfg = dict(cfg, dflash_config=dict(cfg["dflash_config"], target_layer_ids=mine))
    if cfg != drafter.c:
        diff = sorted(k for k in set(cfg) | set(drafter.c) if cfg.get(k) != drafter.c.get(k))
        sys.exit(f"--init {path}: its config differs from this run's drafter in {diff}")
    drafter.load_state_dict(state)


def load_data(path, max_len):
    train, test = [], []
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        for line in f:
            r = json.loads(line)
            ids = (r["prompt_ids"] + r["response_ids"])[:max_len]
            if len(ids) - len(r["prompt_ids"]) < 2:
                continue  # no anchor with a token after it
            (test if r["split"] == "test" else train).append((ids, len(r["prompt_ids"])))
    return train, test


# The generation batch size since a batch ran out of GPU memory (None: none did); later calls start there.
_gen_batch_fits = None


def generate(target, prompts, temp, max_new, batch, eos):
    """The target's continuation of each prompt (sampled at `temp`, top-p 0.95; greedy when temp is 0), cut after
    its first EOS, in batches (fastgen.py). A batch that runs out of GPU memory is split in halves (and the smaller
    size kept, for later calls too), so a large --gen-batch is safe to ask for."""
    global _gen_batch_fits
    if _gen_batch_fits is not None:
        batch = min(batch, _gen_batch_fits)
    out = []
    i = 0
    while i < len(prompts):
        chunk = prompts[i:i + batch]
        try:
            out += generate_batch(target, chunk, temp, max_new, eos)
        except torch.cuda.OutOfMemoryError:
            if batch == 1:
                raise
            batch = max(1, batch // 2)
            _gen_batch_fits = batch
            torch.cuda.empty_cache()
            print(f"generation ran out of GPU memory: batches of {batch} from here", flush=True)
            continue
        i += len(chunk)
    return out


def chat_parts(rows, user_header, eos):
    """The chat template around one user message, from the data's first prompt: (system turn + user header, what
    follows the user's text: <|im_end|> "\n" then the assistant header)."""
    ids0 = rows[0][0][:rows[0][1]]
    h = len(user_header)
    at = next((i for i in range(len(ids0) - h + 1) if ids0[i:i + h] == user_header), None)
    if at is None:
        sys.exit(f"the chat template's user header {user_header} is not in the data's prompts")
    if ids0[-6] != eos:
        sys.exit("the data's prompts do not end with <|im_end|> + newline + assistant header")
    return ids0[:at + h], [eos] + ids0[len(ids0) - 5:]


def self_instruct(target, prefix, tail, n, max_new, batch, eos, temp=1.0, max_tokens=0):
    """More prompts than any hand-written set: the target writes the user turn itself (sampled after the chat
    template's user header), then answers it greedily, as at inference. Returns (ids, prompt length) rows: up to
    `n` prompts, written and answered a batch at a time, stopping early once the rows hold `max_tokens` tokens
    (0: no limit)."""
    rows, tokens = [], 0
    for start in range(0, n, batch):
        questions = generate(target, [prefix] * min(batch, n - start), temp, 96, batch, eos)
        prompts = [prefix + [t for t in q if t != eos] + tail for q in questions
                   if q and q[-1] == eos and len(q) >= 4]  # keep finished, non-trivial questions
        answers = generate(target, prompts, 0.0, max_new, batch, eos)
        new = [(p + a, len(p)) for p, a in zip(prompts, answers) if len(a) >= 2]
        rows += new
        tokens += sum(len(ids) for ids, _ in new)
        if max_tokens and tokens >= max_tokens:
            break
    return rows


def answer_prompts(target, prompts, samples, temp, max_new, batch, eos):
    """Each prompt answered greedily (as at inference) and `samples` times at `temp`: (ids, prompt length) rows."""
    jobs = prompts + [p for p in prompts for _ in range(samples)]
    answers = generate(target, prompts, 0.0, max_new, batch, eos)
    answers += generate(target, jobs[len(prompts):], temp, max_new, batch, eos) if samples else []
    return [(p + a, len(p)) for p, a in zip(jobs, answers) if len(a) >= 2]


FP8_MAX = 448.0  # the largest finite float8_e4m3fn


def pack_features(f, taps, dtype):
    """The cached form of [T, taps*H] float32 features: f16 (2 bytes a value), or with dtype "fp8" e4m3 values
    and one float32 scale per token and tap (1 byte a value: twice the tokens in the same memory). e4m3 keeps a
    relative precision (3 mantissa bits) at every magnitude; int8 with one scale a vector would round the small
    values next to the few very large channels of SmolLM2's hidden states to zero."""
    if dtype == "f16":
        return f.to(torch.float16)
    t = f.view(f.shape[0], taps, -1)
    scale = t.abs().amax(-1, keepdim=True).clamp_min(1e-30) / FP8_MAX
    return (t / scale).to(torch.float8_e4m3fn), scale


def unpack_features(c):
    """[T, taps*H] float32 from pack_features' form."""
    if isinstance(c, tuple):
        q, scale = c
        return (q.float() * scale).flatten(1)
    return c.float()


class Batcher:
    """Turns sequences into one training batch: target features (on the fly or cached), anchors, blocks, masks."""

    def __init__(self, target, taps, mask_id, block, gamma, device, cache, bf16, greedy_labels=False,
                 cache_dtype="f16", soft_labels=0):
        self.target, self.taps, self.mask_id, self.block = target, taps, mask_id, block
        self.device, self.bf16, self.greedy_labels = device, bf16, greedy_labels
        self.soft_labels = soft_labels  # --soft-labels: the target's K likeliest next tokens kept with the argmax
        self.cache_dtype = cache_dtype
        self.cache = {} if cache else None
        k = torch.arange(1, block, dtype=torch.float32)
        self.pos_weight = torch.exp(-(k - 1) / gamma).to(device)  # weight of block position k = 1..B-1
        self.embed = target.get_input_embeddings().weight
        self.head = target.get_output_embeddings().weight

    @contextlib.contextmanager
    def float32_features(self):
        """Evaluations see the features kiln computes (float32), whatever the training batches use."""
        bf16, self.bf16 = self.bf16, False
        try:
            yield
        finally:
            self.bf16 = bf16

    @torch.no_grad()
    def features(self, seqs, greedy=False):
        """[B, T, taps*H] float32 target hidden states after the tapped layers (padded with zeros); with `greedy`,
        also [B, T] the target's argmax next token at each position (for --greedy-labels), else None; with
        --soft-labels K also its K likeliest next tokens and their probabilities ([B, T, K] int32 and f16; the
        argmax is the first), else None."""
        t = max(len(s) for s, _ in seqs)
        ids = torch.zeros(len(seqs), t, dtype=torch.long)
        att = torch.zeros(len(seqs), t, dtype=torch.long)
        for i, (s, _) in enumerate(seqs):
            ids[i, :len(s)] = torch.tensor(s)
            att[i, :len(s)] = 1
        with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            out = self.target.model(ids.to(self.device), attention_mask=att.to(self.device),
                                    output_hidden_states=True)
        # hidden_states[0] is the embedding output, [l + 1] the output of layer l.
        feat = torch.cat([out.hidden_states[l + 1] for l in self.taps], dim=-1).float()
        if not greedy:
            return feat, None, None
        last = out.last_hidden_state.reshape(-1, out.last_hidden_state.shape[-1])
        # In row chunks: the logits of a whole batch (tokens x 49,152 floats) need not fit at once.
        nxt, top_ids, top_p = [], [], []
        for i in range(0, last.shape[0], 4096):
            logits = F.linear(last[i:i + 4096].float(), self.head.float())
            nxt.append(logits.argmax(-1))
            if self.soft_labels:
                p, k = logits.softmax(-1).topk(self.soft_labels, dim=-1)
                top_ids.append(k.to(torch.int32))
                top_p.append(p.to(torch.float16))
        nxt = torch.cat(nxt).view(ids.shape).to(torch.int32)
        soft = None
        if self.soft_labels:
            # The argmax first (topk may order an exact tie otherwise), so a soft label's first token is the label.
            top_ids = torch.cat(top_ids).view(*ids.shape, -1)
            top_ids[..., 0] = nxt
            soft = (top_ids, torch.cat(top_p).view(*ids.shape, -1))
        return feat, nxt, soft

    def cached_features(self, seqs, keys):
        """(features, greedy next tokens or None, soft labels or None) of `seqs`; the greedy tokens (and the soft
        labels) only for training sequences with --greedy-labels (held-out labels stay the sequence's own
        tokens), and in host memory: the labels are built on the host, where the count of labelled positions is
        known without waiting for the GPU."""
        greedy = self.greedy_labels and keys[0][0] == "train"
        # Held-out sequences are never cached: evaluations see the features kiln computes (float32).
        if self.cache is None or keys[0][0] != "train":
            f, nxt, soft = self.features(seqs, greedy)
            return (f, None if nxt is None else nxt.cpu(),
                    None if soft is None else tuple(x.cpu() for x in soft))
        miss = [i for i, k in enumerate(keys) if k not in self.cache]
        if miss:
            f, nxt, soft = self.features([seqs[i] for i in miss], greedy)
            nxt = None if nxt is None else nxt.cpu()
            soft = None if soft is None else tuple(x.cpu() for x in soft)
            for j, i in enumerate(miss):
                # Features on the batch's device: in RAM on a CPU, in GPU memory on a GPU (no transfer per step).
                n = len(seqs[i][0])
                self.cache[keys[i]] = (pack_features(f[j, :n], len(self.taps), self.cache_dtype),
                                       None if nxt is None else nxt[j, :n].clone(),
                                       None if soft is None else tuple(x[j, :n].clone() for x in soft))
        t = max(len(s) for s, _ in seqs)
        out = torch.zeros(len(seqs), t, len(self.taps) * self.embed.shape[1], device=self.device)
        nxt = torch.full((len(seqs), t), IGNORE, dtype=torch.int32) if greedy else None
        k_soft = self.soft_labels if greedy else 0
        soft = (torch.zeros(len(seqs), t, k_soft, dtype=torch.int32),
                torch.zeros(len(seqs), t, k_soft, dtype=torch.float16)) if k_soft else None
        for i, k in enumerate(keys):
            c, g, sl = self.cache[k]
            c = unpack_features(c)
            out[i, :c.shape[0]] = c
            if greedy:
                nxt[i, :g.shape[0]] = g
            if soft is not None:
                soft[0][i, :g.shape[0]], soft[1][i, :g.shape[0]] = sl
        return out, nxt, soft

    def precompute(self, train, max_tokens):
        """Fills the cache with every training sequence's features before the first step: batches of similar
        lengths (little padding) of at most `max_tokens` padded tokens, instead of one padded batch a step."""
        order = sorted(range(len(train)), key=lambda i: len(train[i][0]))
        t0, i = time.time(), 0
        while i < len(order):
            j = i + 1
            while j < len(order) and (j - i + 1) * len(train[order[j]][0]) <= max_tokens:
                j += 1
            ids = order[i:j]
            self.cached_features([train[k] for k in ids], [("train", k) for k in ids])
            i = j
        n_tok = sum(len(s) for s, _ in train)
        dt = time.time() - t0
        print(f"precomputed the features of {len(train)} sequences ({n_tok} tokens) in {dt:.1f} s "
              f"({n_tok / max(dt, 1e-9):,.0f} tokens/s)", flush=True)

    def build(self, seqs, anchors_per_seq, rng, keys, all_anchors=False, fixed=None):
        """One batch: random anchors (evenly spaced with all_anchors, or the lists in `fixed`)."""
        bl, d = self.block, self.device
        feat, nxt, soft = self.cached_features(seqs, keys)
        b, t = feat.shape[:2]
        anchors = [] if fixed is None else fixed
        for ids, p_len in seqs if fixed is None else []:
            cand = range(p_len, len(ids) - 1)  # anchor = a response token with at least one token after it
            if all_anchors:
                a = list(cand[::max(1, len(cand) // anchors_per_seq)][:anchors_per_seq])
            else:
                a = sorted(rng.sample(cand, min(anchors_per_seq, len(cand))))
            anchors.append(a)
        na = max(len(a) for a in anchors)
        n = na * bl
        self.last_anchors = anchors
        # A missing anchor (-1, short response) makes a dummy block: it sees only itself and has no labels.
        anc = torch.full((b, na), -1, dtype=torch.long)
        toks = torch.full((b, t + bl), IGNORE, dtype=torch.long)
        for i, ((ids, _), a) in enumerate(zip(seqs, anchors)):
            anc[i, :len(a)] = torch.tensor(a, dtype=torch.long)
            toks[i, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        real = anc >= 0
        a0 = anc.clamp_min(0)
        blk_pos = a0[..., None] + torch.arange(bl)  # [b, na, bl]: positions a .. a+B-1
        blk_tok = toks.gather(1, blk_pos.view(b, n)).view(b, na, bl)  # IGNORE past the sequence's end
        blk_ids = torch.full((b, na, bl), self.mask_id, dtype=torch.long)
        blk_ids[..., 0] = torch.where(real, blk_tok[..., 0], self.mask_id)
        soft_sel = None
        if nxt is None:
            labels = torch.where(real[..., None], blk_tok[..., 1:], IGNORE)
        else:
            # --greedy-labels: block position k is labelled with the target's argmax after position a+k-1 (what
            # greedy verification accepts), and only while the sequence's own tokens a+1..a+k-1 are the target's
            # argmax too (past a sampled token that differs, the greedy continuation is unknown).
            nxt = torch.cat([nxt.long(), torch.full((b, bl), IGNORE, dtype=torch.long)], dim=1)
            blk_nxt = nxt.gather(1, blk_pos[..., :-1].reshape(b, -1)).view(b, na, bl - 1)
            same = blk_tok[..., 1:-1] == blk_nxt[..., :-1]
            ok = torch.cat([torch.ones_like(same[..., :1]), same], dim=-1).long().cumprod(-1).bool()
            labels = torch.where(real[..., None] & ok & (blk_tok[..., 1:] != IGNORE), blk_nxt, IGNORE)
        # The labelled block positions (flat over [b, na, bl-1]): only they go through the LM head. On sampled
        # data most positions past the first few have no greedy label.
        sel = (labels != IGNORE).view(-1).nonzero().squeeze(-1)
        if soft is not None:
            # --soft-labels: the target's K likeliest tokens after position a+k-1 for each labelled block position.
            at = blk_pos[..., :-1].reshape(b, -1).clamp_max(t - 1)
            soft_sel = tuple(x.gather(1, at[..., None].expand(-1, -1, x.shape[-1])).view(-1, x.shape[-1])
                             .index_select(0, sel) for x in soft)
            soft_sel = tuple(x.pin_memory().to(d, non_blocking=True) if d.type == "cuda" else x.to(d)
                             for x in soft_sel)
        # On a GPU through pinned memory, so the copies do not wait for the GPU's queue.
        a0, real, blk_pos, blk_ids, labels, sel = (
            x.pin_memory().to(d, non_blocking=True) if d.type == "cuda" else x.to(d)
            for x in (a0, real, blk_pos, blk_ids, labels, sel))
        qb = torch.arange(n, device=d) // bl  # block of each query / block key
        sees_ctx = torch.arange(t, device=d).view(1, 1, t) < (a0 * real)[:, qb].unsqueeze(-1)  # context before a
        sees_blk = (qb[:, None] == qb[None, :]).expand(b, n, n)  # its own block, in both directions
        mask = torch.cat([sees_ctx, sees_blk], dim=-1).unsqueeze(1)
        ctx_pos = torch.arange(t, device=d).expand(b, t)
        return (feat, ctx_pos, F.embedding(blk_ids.view(b, n), self.embed), blk_pos.view(b, n), mask, labels, sel,
                soft_sel)


def draft_loss(drafter, head_w, batch, pos_weight, block, amp, soft_weight=0.0):
    """The γ-weighted loss of a batch; with soft labels in it (--soft-labels), each labelled position's cross-
    entropy mixes the label's ((1 - soft_weight) of it) with the target's top-K distribution's (renormalized over
    the K; soft_weight of it)."""
    feat, ctx_pos, emb, blk_pos, mask, labels, sel, soft = batch
    lab = labels.view(-1).index_select(0, sel)
    with torch.autocast(device_type=feat.device.type, dtype=torch.bfloat16, enabled=amp):
        hid = drafter(feat, ctx_pos, emb, blk_pos, mask)
        b, n, h = hid.shape
        hid = hid.view(b, n // block, block, h)[:, :, 1:]  # positions 1..B-1 predict tokens a+1..a+B-1
        logits = F.linear(hid.reshape(-1, h).index_select(0, sel), head_w)  # the labelled positions only
    ce = F.cross_entropy(logits.float(), lab, reduction="none")
    if soft is not None and soft_weight > 0:
        top_ids, top_p = soft
        p = top_p.float()
        p = p / p.sum(-1, keepdim=True).clamp_min(1e-12)
        soft_ce = -(p * logits.float().log_softmax(-1).gather(1, top_ids.long())).sum(-1)
        ce = (1.0 - soft_weight) * ce + soft_weight * soft_ce
    w = pos_weight[sel % (block - 1)]
    loss = (ce * w).sum() / w.sum().clamp_min(1e-6)
    # Accepted length under greedy verification: drafts accepted while each equals the target's token.
    # Returned as sums on the device (no host sync): accepted drafts over the blocks with a label, and their count.
    correct = torch.zeros(labels.numel(), dtype=torch.bool, device=labels.device)
    correct[sel] = logits.argmax(-1) == lab
    accepted = correct.view(labels.shape).long().cumprod(-1).sum(-1)  # [B, anchors]
    has_block = labels[..., 0] != IGNORE
    # Where decoding would start its next round: the anchor + accepted + 1 (the target's token at the first wrong
    # draft, or past the block), as an offset from the anchor; 0 where unknown (the block ran out of labels, so
    # whether the next draft would be accepted is not known).
    after = labels.gather(-1, accepted.clamp_max(block - 2)[..., None])[..., 0]
    known = has_block & ((accepted == block - 1) | (after != IGNORE))
    next_round = torch.where(known, accepted + 1, 0)
    return loss, (accepted * has_block).sum(), has_block.sum(), next_round


# --round-anchors: the round starts of a sequence kept for its later batches, and how often a step's are read
# back (a host sync each time).
ROUND_ANCHOR_KEEP = 64
ROUND_ANCHOR_EVERY = 4


def record_round_starts(round_starts, seqs, idx, anchors, next_round):
    """Keeps, per training sequence, where decoding would have started its next round after each of this step's
    blocks (anchor + accepted drafts + 1), from `next_round` [B, anchors] (0: unknown)."""
    for i, ((ids, _), a) in enumerate(zip(seqs, anchors)):
        starts = round_starts.setdefault(idx[i], collections.deque(maxlen=ROUND_ANCHOR_KEEP))
        for j, anchor in enumerate(a):
            off = int(next_round[i, j])
            if off > 0 and anchor + off < len(ids) - 1:
                starts.append(anchor + off)


def mix_round_anchors(seqs, idx, round_starts, per_seq, frac, rng):
    """Anchors of a training batch with --round-anchors: up to `frac` of each sequence's from the round starts
    kept for it (decoding starts a round at the token after a wrong draft, harder than a random position), the
    rest uniform over its response; None (uniform only) when `frac` is 0."""
    if frac <= 0:
        return None
    out = []
    for (ids, p_len), i in zip(seqs, idx):
        cand = range(p_len, len(ids) - 1)
        kept = sorted(set(round_starts.get(i, ())))
        a = set(rng.sample(kept, min(len(kept), round(frac * per_seq))))
        rest = [c for c in rng.sample(cand, min(per_seq, len(cand))) if c not in a]
        a.update(rest[:max(0, min(per_seq, len(cand)) - len(a))])
        out.append(sorted(a))
    return out


def timer(on, dev):
    """A wall-clock mark after the device's queued work (when `on`), else 0."""
    if not on:
        return 0.0
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def lr_at(progress, step, warmup, peak, floor=0.1):
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


@torch.no_grad()
def evaluate(drafter, head_w, batcher, test, args, amp):
    drafter.eval()
    losses, n, acc, blocks = [], 0, 0, 0
    for i in range(0, len(test), args.eval_batch):
        seqs = test[i:i + args.eval_batch]
        batch = batcher.build(seqs, args.eval_anchors, None, [("test", i + j) for j in range(len(seqs))],
                              all_anchors=True)
        loss, a, nb, _ = draft_loss(drafter, head_w, batch, batcher.pos_weight, args.block, amp)
        losses.append(loss.item() * len(seqs))
        n += len(seqs)
        acc, blocks = acc + a.item(), blocks + nb.item()
    drafter.train()
    # τ = tokens per verify round = accepted drafts + the bonus token (teacher-forced estimate).
    return sum(losses) / max(n, 1), 1.0 + acc / max(blocks, 1)


@torch.no_grad()
def simulate_tau(drafter, head_w, batcher, test, max_new, amp):
    """τ of greedy DFlash decoding replayed over the held-out responses (the target's own greedy tokens): rounds
    start at the token after the last accepted one, as in kiln. Anchors that follow a rejection are harder than
    random ones, so this is lower than the teacher-forced τ at random anchors, and it is what `kiln run --draft`
    measures (checked: per prompt within a few % of kiln's τ)."""
    drafter.eval()
    bl, d = batcher.block, batcher.device
    tokens = rounds = 0
    for ids, p in test:
        ids = ids[:p + max_new]
        feat = batcher.features([(ids, p)])[0]
        a = p
        while a < len(ids) - 1:
            blk = torch.full((1, bl), batcher.mask_id, dtype=torch.long, device=d)
            blk[0, 0] = ids[a]
            with torch.autocast(device_type=d.type, dtype=torch.bfloat16, enabled=amp):
                h = drafter(feat[:, :a], torch.arange(a, device=d)[None], F.embedding(blk, batcher.embed),
                            torch.arange(a, a + bl, device=d)[None], None)
                drafts = F.linear(h[0, 1:], head_w).argmax(-1).tolist()
            acc = 0
            while acc < bl - 1 and a + 1 + acc < len(ids) and drafts[acc] == ids[a + 1 + acc]:
                acc += 1
            step = min(acc + 1, len(ids) - 1 - a)  # accepted drafts + the bonus token
            tokens += step
            rounds += 1
            a += step
    drafter.train()
    return tokens / max(1, rounds)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True, help="target GGUF (llama architecture)")
    ap.add_argument("--data", required=True, help="jsonl from gen_data.py")
    ap.add_argument("--out", required=True, help="drafter directory to write (config.json + model.safetensors)")
    ap.add_argument("--minutes", type=float, default=30.0, help="training time budget (the schedule follows it)")
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0 = time budget only)")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--taps", default="", help="comma-separated target layer ids (default: z-lab rule, 5 taps)")
    ap.add_argument("--ff", type=int, default=0, help="drafter FFN width (default: the target's)")
    ap.add_argument("--mask-id", type=int, default=DEFAULT_MASK_ID)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--gamma", type=float, default=7.0)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--wd", type=float, default=0.01)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--batch", type=int, default=8, help="sequences per step")
    ap.add_argument("--anchors", type=int, default=32, help="anchors per sequence per step")
    ap.add_argument("--round-anchors", type=float, default=0.0,
                    help="fraction of a sequence's anchors taken where decoding would start a round (after a wrong "
                         "draft), as seen in its earlier batches; the rest uniform (0: all uniform)")
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--cache-features", action="store_true",
                    help="keep each training sequence's target features after its first use (f16, in RAM on a CPU, "
                         "in GPU memory on a GPU: ~5.8 KB a token for SmolLM2's 5 taps): later epochs skip the "
                         "target forward")
    ap.add_argument("--cache-dtype", choices=["f16", "fp8"], default="f16",
                    help="cached features as f16 (5,760 bytes a token with 5 taps) or fp8 e4m3 with a scale per "
                         "token and tap (2,900 bytes: twice the data in the same memory)")
    ap.add_argument("--precompute-features", type=int, default=0, metavar="TOKENS",
                    help="with --cache-features: compute every training sequence's features before the first step, "
                         "in length-sorted batches of at most TOKENS padded tokens (every step then skips the target)")
    ap.add_argument("--target-bf16", action="store_true",
                    help="the target's forward for the training features under bf16 autocast (float32 otherwise; "
                         "the evaluations and the replayed decoding always use float32 features, as kiln does)")
    ap.add_argument("--greedy-labels", action="store_true",
                    help="label the training blocks with the target's argmax next tokens (what greedy verification "
                         "accepts) instead of the sequence's own, possibly sampled, tokens; block positions past a "
                         "sampled token that is not the argmax get no label. Held-out labels are unchanged")
    ap.add_argument("--soft-labels", type=int, default=0, metavar="K",
                    help="with --greedy-labels: also keep the target's K likeliest next tokens and their "
                         "probabilities at every training position (host memory, 6 K bytes a token) for "
                         "--soft-weight")
    ap.add_argument("--soft-weight", type=float, default=0.5,
                    help="with --soft-labels: the share of each labelled position's loss that is the cross-entropy "
                         "against the target's top-K distribution (renormalized), the rest against its argmax")
    ap.add_argument("--init", default="",
                    help="start from this drafter (z-lab directory or `kiln convert-draft` GGUF) instead of random "
                         "weights; a new schedule (warm-up, cosine decay) runs over --minutes")
    ap.add_argument("--init-layers", default="",
                    help="with --init: these of its layers (comma-separated indices, in order) start a drafter of "
                         "--layers layers, e.g. 0,2 of a 3-layer drafter for a 2-layer one")
    ap.add_argument("--gen-samples", type=int, default=0,
                    help="before training, sample this many extra target responses per training prompt (GPU)")
    ap.add_argument("--gen-temp", type=float, default=0.8)
    ap.add_argument("--gen-tokens", type=int, default=0,
                    help="stop self-instructing once the training data (committed + generated) holds this many "
                         "tokens, e.g. what the feature cache can hold (0: --gen-prompts alone decides)")
    ap.add_argument("--gen-prompts", type=int, default=0,
                    help="before training, let the target write this many user prompts and answer them greedily (GPU)")
    ap.add_argument("--gen-prompt-ids", default="",
                    help="before training, answer these prompts (extra_prompts.py's user-text ids, wrapped in the "
                         "data's chat template) greedily (GPU)")
    ap.add_argument("--gen-prompt-samples", type=int, default=0,
                    help="with --gen-prompt-ids, also this many sampled answers (at --gen-temp) per prompt")
    ap.add_argument("--user-header", default="1,4093,198",
                    help="token ids of the chat template's user header (SmolLM2: <|im_start|> user \\n)")
    ap.add_argument("--gen-max-new", type=int, default=256)
    ap.add_argument("--gen-batch", type=int, default=128)
    ap.add_argument("--gen-dtype", choices=["f32", "f16"], default="f32",
                    help="the extra data written by the target as loaded (float32) or by an f16 copy (half the "
                         "KV cache and matmul bytes)")
    ap.add_argument("--stop-after", type=float, default=0,
                    help="end this run after this many minutes of training (state saved in OUT/state.pt), although "
                         "the schedule runs over --minutes; --resume continues it (for runs longer than one job)")
    ap.add_argument("--extra-data", default="",
                    help="train on these rows too (a generated.jsonl another run wrote) instead of generating any: "
                         "two runs on the same data differ only in their arguments")
    ap.add_argument("--resume", action="store_true",
                    help="continue from OUT/state.pt when it exists, with OUT/generated.jsonl as the extra data")
    ap.add_argument("--eval-every", type=float, default=5.0, help="minutes between held-out evaluations + saves")
    ap.add_argument("--eval-batch", type=int, default=4)
    ap.add_argument("--eval-anchors", type=int, default=24)
    ap.add_argument("--sim-new", type=int, default=128,
                    help="response tokens per held-out prompt for the replayed-decoding τ (0 = skip it)")
    ap.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = default)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.soft_labels and not args.greedy_labels:
        sys.exit("--soft-labels needs --greedy-labels (the soft labels are the target's at the greedy labels)")

    dev = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available()
                       else ("cpu" if args.device == "auto" else args.device))
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    amp = dev.type == "cuda"
    if amp:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    t0 = time.time()
    target, _ = load_llama(args.gguf)
    target.to(dev)
    tc = target.config
    vocab = tc.vocab_size
    if not 0 <= args.mask_id < vocab:
        sys.exit(f"--mask-id {args.mask_id} is outside the target's embedding table (vocab {vocab})")
    taps = [int(x) for x in args.taps.split(",")] if args.taps else default_taps(tc.num_hidden_layers, 5)
    if any(not 0 <= l < tc.num_hidden_layers for l in taps):
        sys.exit(f"--taps {taps}: the target has layers 0..{tc.num_hidden_layers - 1}")
    cfg = drafter_config(tc, args.layers, taps, args.mask_id, args.block, args.ff)
    drafter = Drafter(cfg).to(dev)
    with torch.no_grad():
        # A small output-norm scale: with the usual 1.0 a random drafter's hidden state meets SmolLM2's large
        # embedding rows with logits in the hundreds (CE ~77 at step 0, ~14 at 0.1); near-uniform logits let the
        # first steps learn instead of unlearning the scale.
        drafter.norm.weight.fill_(0.05)
    if args.init:
        keep = [int(x) for x in args.init_layers.split(",")] if args.init_layers else None
        load_init(args.init, drafter, keep)
    head_w = target.get_output_embeddings().weight  # frozen, shared with the target
    train, test = load_data(args.data, args.max_len)
    if not train:
        sys.exit(f"{args.data}: no training sequences")
    eos = tc.eos_token_id if isinstance(tc.eos_token_id, int) else tc.eos_token_id[0]
    os.makedirs(args.out, exist_ok=True)
    state_path = os.path.join(args.out, "state.pt")
    gen_path = os.path.join(args.out, "generated.jsonl")
    state = torch.load(state_path, map_location=dev) if args.resume and os.path.exists(state_path) else None
    if state is not None and os.path.exists(gen_path):
        extra, _ = load_data(gen_path, args.max_len)
        print(f"resuming at step {state['step']}: {len(extra)} generated rows from {gen_path}", flush=True)
        train += extra
        args.gen_samples = args.gen_prompts = 0
        args.gen_prompt_ids = ""
    elif args.extra_data:
        extra, _ = load_data(args.extra_data, args.max_len)
        print(f"{len(extra)} extra training rows from {args.extra_data}; no data generated", flush=True)
        train += extra
        args.gen_samples = args.gen_prompts = 0
        args.gen_prompt_ids = ""
    n_data = len(train)
    # The target that writes the extra data: itself, or an f16 copy (--gen-dtype). f16 rather than bf16: bf16's
    # 8-bit mantissa moved SmolLM2's greedy text off the float32 model's within 0-6 tokens (CPU, 4 prompts), f16
    # kept all 40 (check_generate.py --dtype f16 checks it); either way the labels come from the float32 forward
    # that computes the features.
    writer = target
    if args.gen_dtype == "f16" and (args.gen_samples or args.gen_prompt_ids or args.gen_prompts):
        writer = copy.deepcopy(target).to(torch.float16)
    if args.gen_samples:
        t1 = time.time()
        prompts = [list(p) for p in {tuple(ids[:p]): None for ids, p in train}]
        jobs = [p for p in prompts for _ in range(args.gen_samples)]
        answers = generate(writer, jobs, args.gen_temp, args.gen_max_new, args.gen_batch, eos)
        extra = [(p + a, len(p)) for p, a in zip(jobs, answers) if len(a) >= 2]
        print(f"sampled {len(extra)} extra responses ({sum(len(s) - p for s, p in extra)} tokens) "
              f"in {time.time() - t1:.0f} s", flush=True)
        train += extra
    prefix, tail = chat_parts(train, [int(x) for x in args.user_header.split(",")], eos)
    if args.gen_prompt_ids:
        t1 = time.time()
        with gzip.open(args.gen_prompt_ids, "rt") as f:
            prompts = [prefix + json.loads(line)["ids"] + tail for line in f]
        extra = answer_prompts(writer, prompts, args.gen_prompt_samples, args.gen_temp, args.gen_max_new,
                               args.gen_batch, eos)
        print(f"answered {len(prompts)} prompts of {args.gen_prompt_ids} ({len(extra)} responses, "
              f"{sum(len(s) - p for s, p in extra)} tokens) in {time.time() - t1:.0f} s", flush=True)
        train += extra
    if args.gen_prompts:
        t1 = time.time()
        have = sum(len(ids) for ids, _ in train)
        if args.gen_tokens and have >= args.gen_tokens:
            print(f"the data holds {have} tokens, --gen-tokens {args.gen_tokens}: no self-instructed prompts",
                  flush=True)
            extra = []
        else:
            left = args.gen_tokens - have if args.gen_tokens else 0
            extra = self_instruct(writer, prefix, tail, args.gen_prompts, args.gen_max_new, args.gen_batch, eos,
                                  max_tokens=left)
        print(f"self-instructed {len(extra)} prompts + greedy answers ({sum(len(s) - p for s, p in extra)} "
              f"response tokens) in {time.time() - t1:.0f} s", flush=True)
        train += extra
    del writer
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    if len(train) > n_data:  # kept for --resume (and for a look at what the target wrote)
        with open(gen_path, "w") as f:
            for ids, p in train[n_data:]:
                f.write(json.dumps({"split": "train", "prompt_ids": ids[:p], "response_ids": ids[p:]},
                                   separators=(",", ":")) + "\n")
    n_params = sum(p.numel() for p in drafter.parameters())
    print(f"device {dev}, target loaded in {time.time() - t0:.1f} s; drafter {args.layers} layer(s), "
          f"{n_params / 1e6:.2f} M params, taps {taps}, mask id {args.mask_id}; "
          f"{len(train)} train / {len(test)} test sequences", flush=True)

    batcher = Batcher(target, taps, args.mask_id, args.block, args.gamma, dev, args.cache_features,
                      args.target_bf16, args.greedy_labels, args.cache_dtype, args.soft_labels)
    if args.precompute_features:
        if not args.cache_features:
            sys.exit("--precompute-features needs --cache-features")
        batcher.precompute(train, args.precompute_features)
    opt = torch.optim.AdamW(drafter.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=args.wd,
                            fused=dev.type == "cuda")
    budget = args.minutes * 60.0
    start = time.time()
    last_eval = start
    order, cursor, step, done_s = [], 0, 0, 0.0
    log = []
    if state is not None:
        drafter.load_state_dict(state["drafter"])
        opt.load_state_dict(state["opt"])
        step, done_s, log = state["step"], state["trained_s"], state["log"]
        rng.seed(args.seed + step)
    # Running sums stay on the device: a step waits for the GPU only at the printed steps.
    run_loss, run_acc, run_blocks = 0.0, 0, 0
    round_starts = {}  # --round-anchors: training sequence -> where decoding would have started rounds
    while True:
        elapsed = done_s + time.time() - start
        progress = elapsed / budget
        if args.steps:
            progress = max(progress, step / args.steps)
        if progress >= 1.0 or (args.stop_after and time.time() - start >= args.stop_after * 60):
            break
        if cursor + args.batch > len(order):
            order, cursor = list(range(len(train))), 0
            rng.shuffle(order)
        idx = order[cursor:cursor + args.batch]
        cursor += args.batch
        # Every 200th step is timed in parts (synchronized, so only those steps pay for it): where a step's
        # time goes on the GPU decides what to make faster.
        timed = step % 200 == 100
        marks = [timer(timed, dev)]
        seqs = [train[i] for i in idx]
        fixed = mix_round_anchors(seqs, idx, round_starts, args.anchors, args.round_anchors, rng)
        batch = batcher.build(seqs, args.anchors, rng, [("train", i) for i in idx], fixed=fixed)
        marks.append(timer(timed, dev))
        lr = lr_at(progress, step, args.warmup, args.lr)
        for g in opt.param_groups:
            g["lr"] = lr
        loss, accepted, blocks, next_round = draft_loss(drafter, head_w, batch, batcher.pos_weight, args.block,
                                                        amp, args.soft_weight)
        if args.round_anchors > 0 and step % ROUND_ANCHOR_EVERY == 0:
            record_round_starts(round_starts, seqs, idx, batcher.last_anchors, next_round.cpu())
        marks.append(timer(timed, dev))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        marks.append(timer(timed, dev))
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        marks.append(timer(timed, dev))
        if timed:
            parts = [f"{name} {1e3 * (b - a):.1f}" for name, a, b in
                     zip(("batch (features, masks)", "forward + loss", "backward", "optimizer"), marks, marks[1:])]
            print(f"step {step} time, ms: " + ", ".join(parts), flush=True)
        step += 1
        run_loss, run_acc, run_blocks = run_loss + loss.detach(), run_acc + accepted, run_blocks + blocks
        if step % 10 == 0:
            run_loss, tau = run_loss.item() / 10, 1 + run_acc.item() / max(run_blocks.item(), 1)
            print(f"step {step} {elapsed / 60:.1f} min lr {lr:.2e} loss {run_loss:.3f} train tau~{tau:.2f}",
                  flush=True)
            log.append({"step": step, "minutes": elapsed / 60, "loss": run_loss, "tau_train": tau})
            run_loss, run_acc, run_blocks = 0.0, 0, 0
        if time.time() - last_eval > args.eval_every * 60 and test:
            with batcher.float32_features():
                tl, tau = evaluate(drafter, head_w, batcher, test, args, amp)
                # The replayed decoding is a few seconds on a GPU, minutes on a CPU: periodic on GPUs only.
                sim = simulate_tau(drafter, head_w, batcher, test, args.sim_new, amp) if amp and args.sim_new else None
            print(f"eval step {step}: held-out loss {tl:.3f}, teacher-forced tau {tau:.2f}"
                  + (f", replayed-decoding tau {sim:.2f}" if sim else ""), flush=True)
            log.append({"step": step, "minutes": (done_s + time.time() - start) / 60, "test_loss": tl,
                        "tau_test": tau, "tau_sim": sim})
            save_drafter(drafter, args.out)
            last_eval = time.time()
    trained_s = done_s + time.time() - start
    finished = progress >= 1.0
    result = {"steps": step, "minutes": trained_s / 60, "finished": finished}
    if test:
        with batcher.float32_features():
            tl, tau = evaluate(drafter, head_w, batcher, test, args, amp)
            sim = simulate_tau(drafter, head_w, batcher, test, args.sim_new, amp) if args.sim_new else None
        print(f"final step {step}: held-out loss {tl:.3f}, teacher-forced tau {tau:.2f}"
              + (f", replayed-decoding tau {sim:.2f}" if sim else ""), flush=True)
        result.update(test_loss=tl, tau_test=tau, tau_sim=sim)
    save_drafter(drafter, args.out)
    if finished:
        if os.path.exists(state_path):
            os.remove(state_path)
    else:
        torch.save({"drafter": drafter.state_dict(), "opt": opt.state_dict(), "step": step, "trained_s": trained_s,
                    "log": log}, state_path)
    with open(os.path.join(args.out, "train_log.json"), "w") as f:
        # Paths as given, but never absolute: the log is committed next to the drafter.
        logged = {k: os.path.relpath(v) if isinstance(v, str) and os.path.isabs(v) else v
                  for k, v in vars(args).items()}
        json.dump({"args": logged, "result": result, "log": log}, f, indent=1)
    print(f"wrote {args.out} ({step} steps, {trained_s / 60:.1f} of {args.minutes:g} min"
          + ("; finished" if finished else "; unfinished: run again with --resume to continue") + ")")


if __name__ == "__main__":
    main()
