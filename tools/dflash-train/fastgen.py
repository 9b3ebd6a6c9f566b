"""Batched generation with the target's own weights and a preallocated KV cache, for the drafter's training data.

transformers' `generate` spends most of each step in per-step Python work on a model this small (~7 k tokens/s at
batches of 512 on an H200); here a step is the model's matmuls over the whole batch and nothing else. Same model
(the `LlamaForCausalLM` from gguf_target.py, its modules called directly), same positions as `generate` with left
padding (a row's first real token is position 0), same top-p sampling. The attention over the cache is one fused
`scaled_dot_product_attention` call a layer. The cache takes the model's dtype (train.py --gen-dtype f16 passes an
f16 copy). check_generate.py compares it with transformers' greedy `generate`.
"""
import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb


def pick(logits, temp, top_p, top_k=1024):
    """Greedy at temp 0; otherwise sampled at `temp` from the smallest set of tokens whose probability reaches
    `top_p` (the token that crosses it included), as transformers' top-p."""
    if temp == 0:
        return logits.argmax(-1)
    tok = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
    for rows, p, ids in nucleus(torch.softmax(logits.float() / temp, -1), top_p, top_k):
        tok[rows] = ids.gather(-1, torch.multinomial(p, 1)).squeeze(-1)
    return tok


def nucleus(probs, top_p, top_k):
    """Each row's top-p set as (rows, kept probabilities, their token ids) groups, sorted in descending order, the
    tokens outside the set at probability 0. The set is looked for among the `top_k` most likely tokens (cheaper
    than sorting all 49,152 a row); the rows whose set does not fit there (the top_k tokens' mass is at most top_p,
    so the next token belongs to it too) are sorted whole. The same set either way."""
    top, ids = probs.topk(min(top_k, probs.shape[-1]), -1)
    fits = top.sum(-1) > top_p
    groups = [(fits.nonzero().squeeze(-1), top[fits], ids[fits])]
    if not bool(fits.all()):
        rest = (~fits).nonzero().squeeze(-1)
        groups.append((rest, *probs[rest].sort(-1, descending=True)))
    return [(r, p.masked_fill((p.cumsum(-1) - p) > top_p, 0), i) for r, p, i in groups if r.numel()]


SPAN_STEP = 64  # the attention's key span is rounded up to this (see forward below)


@torch.no_grad()
def generate_batch(target, prompts, temp, max_new, eos, top_p=0.95):
    """Each prompt's continuation (greedy at temp 0), cut after its first EOS."""
    m, cfg = target.model, target.config
    dev = target.lm_head.weight.device
    dt = target.lm_head.weight.dtype
    n, width = len(prompts), max(len(p) for p in prompts)
    total = width + max_new
    n_head, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_head
    group = n_head // n_kv

    ids = torch.full((n, width), eos, dtype=torch.long)
    for j, p in enumerate(prompts):
        ids[j, width - len(p):] = torch.tensor(p)
    ids = ids.to(dev)
    pad = torch.tensor([width - len(p) for p in prompts], device=dev)
    cols = torch.arange(total, device=dev)
    positions = (cols[None] - pad[:, None]).clamp(min=0)
    real = cols[None] >= pad[:, None]  # (n, total): key j holds a real token of row b
    # Zeroed: a step's attention also reads the columns past its own (below), masked, and 0 x NaN would be NaN.
    caches = [(torch.zeros(n, n_kv, total, head_dim, device=dev, dtype=dt),
               torch.zeros(n, n_kv, total, head_dim, device=dev, dtype=dt)) for _ in m.layers]

    def forward(tokens, start):
        """Logits of the last of `tokens` (n, t), which sit at columns start..start+t-1."""
        t = tokens.shape[1]
        end = start + t
        # The keys read: `end` rounded up to a multiple of SPAN_STEP, the columns past it masked. On a GPU the
        # fused attention (cuDNN's for f16) builds an execution plan for every new shape, 55-75 ms on an H100
        # against ~22 ms for a whole step at 2,048 rows; with the span rounded, consecutive steps share one.
        span = min(total, -(-end // SPAN_STEP) * SPAN_STEP)
        h = m.embed_tokens(tokens)
        cos, sin = m.rotary_emb(h, positions[:, start:end])
        q_col = torch.arange(start, end, device=dev)
        # A query sees real keys up to itself; a padding query sees only itself (no all-masked row, no NaN that a
        # later zero weight would still carry through). One row per query of a KV head's group (group-major, as
        # the queries below), broadcast over the KV heads.
        allowed = ((real[:, None, :span] | (cols[None, None, :span] == q_col[None, :, None]))
                   & (cols[None, None, :span] <= q_col[None, :, None])).repeat(1, group, 1)[:, None]
        for layer, (kc, vc) in zip(m.layers, caches):
            a = layer.self_attn
            x = layer.input_layernorm(h)
            q = a.q_proj(x).view(n, t, n_head, head_dim).transpose(1, 2)
            k = a.k_proj(x).view(n, t, n_kv, head_dim).transpose(1, 2)
            v = a.v_proj(x).view(n, t, n_kv, head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            kc[:, :, start:end] = k
            vc[:, :, start:end] = v
            # Fused attention over the cache. Grouped-query without repeating K/V: the query heads of a KV head
            # are that head's queries (no reliance on SDPA's GQA option, which not every fused kernel takes).
            q = q.reshape(n, n_kv, group * t, head_dim)
            o = F.scaled_dot_product_attention(q, kc[:, :, :span], vc[:, :, :span], attn_mask=allowed)
            o = o.view(n, n_head, t, head_dim).transpose(1, 2).reshape(n, t, n_head * head_dim)
            h = h + a.o_proj(o)
            x = layer.post_attention_layernorm(h)
            h = h + layer.mlp(x)
        return target.lm_head(m.norm(h[:, -1]))

    out = torch.empty(n, max_new, dtype=torch.long, device=dev)
    done = torch.zeros(n, dtype=torch.bool, device=dev)
    logits = forward(ids, 0)
    steps = 0
    for i in range(max_new):
        tok = torch.where(done, eos, pick(logits, temp, top_p))
        out[:, i] = tok
        steps = i + 1
        done |= tok == eos
        # Whether every row has finished is asked every 8th step only: the question waits for the GPU, and the
        # host would otherwise queue each step's launches only after the step before it has run. A finished row
        # only adds EOS, which the cut below removes.
        if i + 1 == max_new or (i % 8 == 7 and bool(done.all())):
            break
        logits = forward(tok[:, None], width + i)
    rows = out[:, :steps].tolist()
    return [row[:row.index(eos) + 1] if eos in row else row for row in rows]
