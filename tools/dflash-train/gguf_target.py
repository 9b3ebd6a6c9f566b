"""Loads a llama-architecture GGUF (SmolLM2) as a transformers `LlamaForCausalLM` in float32, with only numpy,
torch and transformers: the GGUF container is parsed and its blocks dequantized here, so the training machine
needs neither the `gguf` package nor `accelerate` (transformers' own GGUF loading needs both).

Supported tensor types: F32, F16, BF16, Q4_0, Q4_1, Q8_0 (what SmolLM2's Q4_1 file holds, plus the common
simple ones); anything else is refused with the tensor's name. Checked against transformers' GGUF loader by
`check_target.py` (same logits).
"""
import struct

import numpy as np
import torch

GGUF_MAGIC = b"GGUF"
# GGUF metadata value types -> struct format (scalars); 8 = string, 9 = array.
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
# ggml type id -> (name, elements per block, bytes per block)
TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 8: ("Q8_0", 32, 34),
         30: ("BF16", 1, 2)}


class GGUFError(Exception):
    """A GGUF file this loader cannot read; the message names the key or tensor."""


class _Cursor:
    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def take(self, n, what):
        if n < 0 or self.pos + n > len(self.buf):
            raise GGUFError(f"truncated GGUF while reading {what} at byte {self.pos}")
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def scalar(self, fmt, what):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what):
        n = self.scalar("<Q", what)
        return bytes(self.take(n, what)).decode("utf-8", errors="replace")

    def value(self, ty, what):
        if ty in SCALARS:
            return self.scalar(SCALARS[ty], what)
        if ty == 8:
            return self.string(what)
        if ty == 9:
            ety = self.scalar("<I", what)
            n = self.scalar("<Q", what)
            return [self.value(ety, what) for _ in range(n)]
        raise GGUFError(f"metadata '{what}' has unknown value type {ty}")


def read_gguf(path):
    """Returns (metadata dict, {name: (ggml type id, shape as numpy order, raw bytes view)})."""
    with open(path, "rb") as f:
        buf = memoryview(f.read())
    c = _Cursor(buf)
    if bytes(c.take(4, "magic")) != GGUF_MAGIC:
        raise GGUFError(f"{path}: not a GGUF file")
    version = c.scalar("<I", "version")
    if version not in (2, 3):
        raise GGUFError(f"{path}: GGUF version {version} (2 or 3 supported)")
    n_tensors = c.scalar("<Q", "tensor count")
    n_kv = c.scalar("<Q", "metadata count")
    meta = {}
    for _ in range(n_kv):
        key = c.string("metadata key")
        meta[key] = c.value(c.scalar("<I", key), key)
    infos = []
    for _ in range(n_tensors):
        name = c.string("tensor name")
        nd = c.scalar("<I", name)
        dims = [c.scalar("<Q", name) for _ in range(nd)]
        ty = c.scalar("<I", name)
        off = c.scalar("<Q", name)
        infos.append((name, dims, ty, off))
    align = int(meta.get("general.alignment", 32))
    base = (c.pos + align - 1) // align * align
    tensors = {}
    for name, dims, ty, off in infos:
        if ty not in TYPES:
            raise GGUFError(f"tensor '{name}' has ggml type {ty}, which this loader does not dequantize")
        _, blk, bsz = TYPES[ty]
        n = int(np.prod(dims)) if dims else 1
        if n % blk:
            raise GGUFError(f"tensor '{name}': {n} elements is not a whole number of blocks of {blk}")
        nbytes = n // blk * bsz
        start = base + off
        if start + nbytes > len(buf):
            raise GGUFError(f"tensor '{name}' points outside the file")
        tensors[name] = (ty, tuple(reversed(dims)), buf[start:start + nbytes])
    return meta, tensors


def dequantize(name, ty, shape, raw):
    """float32 numpy array of `shape` from a tensor's raw bytes."""
    kind = TYPES[ty][0]
    if kind == "F32":
        out = np.frombuffer(raw, dtype="<f4")
    elif kind == "F16":
        out = np.frombuffer(raw, dtype="<f2").astype(np.float32)
    elif kind == "BF16":
        out = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    elif kind == "Q8_0":
        b = np.frombuffer(raw, dtype=np.dtype([("d", "<f2"), ("q", "i1", 32)]))
        out = b["d"].astype(np.float32)[:, None] * b["q"].astype(np.float32)
    elif kind in ("Q4_0", "Q4_1"):
        if kind == "Q4_0":
            b = np.frombuffer(raw, dtype=np.dtype([("d", "<f2"), ("q", "u1", 16)]))
            m = -8.0 * b["d"].astype(np.float32)[:, None]
        else:
            b = np.frombuffer(raw, dtype=np.dtype([("d", "<f2"), ("m", "<f2"), ("q", "u1", 16)]))
            m = b["m"].astype(np.float32)[:, None]
        # Low nibbles are elements 0..15 of the block, high nibbles 16..31.
        q = np.concatenate([b["q"] & 0x0F, b["q"] >> 4], axis=1).astype(np.float32)
        out = b["d"].astype(np.float32)[:, None] * q + m
    else:  # TYPES and this function list the same types
        raise GGUFError(f"tensor '{name}': no dequantizer for {kind}")
    # A writable copy: torch refuses to wrap the read-only file buffer.
    return out.reshape(shape).astype(np.float32, copy=True)


def _unpermute(w, n_head):
    """Undoes the rows permutation llama.cpp's converter applies to Q/K (interleaved RoPE pairs -> HF halves)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load_llama(path, dtype=torch.float32):
    """The GGUF's llama model as a transformers LlamaForCausalLM (eval mode, no grad), plus its metadata."""
    from transformers import LlamaConfig, LlamaForCausalLM

    meta, tensors = read_gguf(path)
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise GGUFError(f"{path}: architecture '{arch}' (this loader reads llama)")

    def need(key):
        if key not in meta:
            raise GGUFError(f"{path}: metadata '{key}' is missing")
        return meta[key]

    n_layer = int(need("llama.block_count"))
    n_head = int(need("llama.attention.head_count"))
    n_head_kv = int(meta.get("llama.attention.head_count_kv", n_head))
    if "token_embd.weight" not in tensors:
        raise GGUFError(f"{path}: tensor 'token_embd.weight' is missing")
    vocab = tensors["token_embd.weight"][1][0]
    tied = "output.weight" not in tensors
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=int(need("llama.embedding_length")),
        intermediate_size=int(need("llama.feed_forward_length")), num_hidden_layers=n_layer,
        num_attention_heads=n_head, num_key_value_heads=n_head_kv,
        max_position_embeddings=int(meta.get("llama.context_length", 8192)),
        rms_norm_eps=float(need("llama.attention.layer_norm_rms_epsilon")),
        rope_theta=float(meta.get("llama.rope.freq_base", 10000.0)),
        tie_word_embeddings=tied, bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"), attention_bias=False, mlp_bias=False,
    )
    names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
    per_layer = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                 "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                 "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                 "ffn_down": "mlp.down_proj"}
    for i in range(n_layer):
        for g, h in per_layer.items():
            names[f"blk.{i}.{g}.weight"] = f"model.layers.{i}.{h}.weight"
    state = {}
    for gname, hname in names.items():
        if gname not in tensors:
            if gname == "output.weight":
                continue
            raise GGUFError(f"{path}: tensor '{gname}' is missing")
        ty, shape, raw = tensors[gname]
        w = dequantize(gname, ty, shape, raw)
        if gname.endswith("attn_q.weight"):
            w = _unpermute(w, n_head)
        elif gname.endswith("attn_k.weight"):
            w = _unpermute(w, n_head_kv)
        state[hname] = torch.from_numpy(w)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [k for k in missing if not (tied and k == "lm_head.weight")]
    if missing or unexpected:
        raise GGUFError(f"{path}: weights do not fit the model (missing {missing[:3]}, unexpected {unexpected[:3]})")
    if tied:
        model.tie_weights()
    # Non-persistent buffers (RoPE inverse frequencies) were created on the meta device: rebuild them.
    model.model.rotary_emb = type(model.model.rotary_emb)(cfg)
    model = model.to(dtype).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, meta
