#!/usr/bin/env python3
"""Hugging Face Qwen3 folder -> GGUF v3, so llama.cpp (the inference peer of bench/generate.py)
runs the very weights ctitan runs. Written from the format's documentation (../shared/design.md,
"llama.cpp, the inference peer"), for dense Qwen3 only (`general.architecture` "qwen3").

    bench/gguf.py HF_FOLDER OUT.gguf [--dtype f32|bf16] [--tokenizer DIR]

The file: the magic "GGUF", version 3, the tensor and key counts; the keys (typed values);
one info record per tensor (name, dims fastest first, ggml type, offset); then the tensor data,
each tensor at a multiple of general.alignment (32). Matrices keep HF's row-major bytes: an HF
weight of shape (out, in) is the GGUF tensor with ne = (in, out). Q and K stay in HF's order
(llama.cpp's qwen3 graph applies NEOX RoPE, which is HF's rotate_half). Norm weights are F32;
matrices F32 or BF16 (round to nearest even from F32 sources, as torch's .to(bfloat16)). The
weights stream tensor by tensor from the safetensors mapping, so memory stays one tensor.

The vocabulary: tokenizer.json's, padded to config.json's vocab_size with "[PAD{id}]" tokens of
type UNUSED, added tokens CONTROL when special, else USER_DEFINED; merges as "a b" strings;
`tokenizer.ggml.model` "gpt2" and `pre` "qwen2", no BOS added (Qwen adds none).
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

ALIGN = 32
# gguf value types
U32, I32, F32V, BOOL, STR, ARR, U64 = 4, 5, 6, 7, 8, 9, 10
# ggml tensor types
GGML_F32, GGML_F16, GGML_BF16 = 0, 1, 30
# token types
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5


def gstr(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, value):
    out = gstr(key) + struct.pack("<I", vtype)
    if vtype == STR:
        return out + gstr(value)
    if vtype == ARR:
        etype, items = value
        out += struct.pack("<IQ", etype, len(items))
        if etype == STR:
            return out + b"".join(gstr(x) for x in items)
        return out + np.asarray(items, dtype={I32: "<i4", U32: "<u4", F32V: "<f4"}[etype]).tobytes()
    fmt = {U32: "<I", I32: "<i", F32V: "<f", BOOL: "<?", U64: "<Q"}[vtype]
    return out + struct.pack(fmt, value)


def read_safetensors(folder):
    """{name: (mapping file, dtype, shape, begin, end)} over every *.safetensors of the folder."""
    tensors = {}
    for fn in sorted(os.listdir(folder)):
        if not fn.endswith(".safetensors"):
            continue
        path = os.path.join(folder, fn)
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
        for name, t in header.items():
            if name == "__metadata__":
                continue
            b, e = t["data_offsets"]
            tensors[name] = (path, t["dtype"], tuple(t["shape"]), 8 + n + b, 8 + n + e)
    if not tensors:
        sys.exit(f"gguf.py: {folder}: no .safetensors files")
    return tensors


def as_f32(raw, dtype):
    if dtype == "F32":
        return raw.view("<f4")
    if dtype == "BF16":
        return (raw.view("<u2").astype(np.uint32) << 16).view("<f4")
    if dtype == "F16":
        return raw.view("<f2").astype(np.float32)
    sys.exit(f"gguf.py: tensor dtype {dtype} is not supported (F32, BF16, F16)")


def to_bf16(x):
    """F32 -> BF16 bits, round to nearest even (NaN kept a NaN)."""
    u = x.view(np.uint32)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), r)


def tensor_bytes(src, name, want):
    """(ggml type, bytes) of one HF tensor in the requested type."""
    path, dtype, shape, b, e = src[name]
    raw = np.memmap(path, dtype=np.uint8, mode="r", offset=b, shape=(e - b,))
    if want == GGML_BF16 and dtype == "BF16":
        return GGML_BF16, bytes(raw)
    x = as_f32(np.asarray(raw), dtype)
    if want == GGML_BF16:
        return GGML_BF16, to_bf16(x).tobytes()
    return GGML_F32, x.astype("<f4").tobytes()


def names_of(cfg, src):
    """[(gguf name, HF name, is a matrix)] in llama.cpp's order."""
    out = [("token_embd.weight", "model.embed_tokens.weight", True)]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [(f"blk.{i}.attn_norm.weight", p + "input_layernorm.weight", False),
                (f"blk.{i}.attn_q.weight", p + "self_attn.q_proj.weight", True),
                (f"blk.{i}.attn_k.weight", p + "self_attn.k_proj.weight", True),
                (f"blk.{i}.attn_v.weight", p + "self_attn.v_proj.weight", True),
                (f"blk.{i}.attn_output.weight", p + "self_attn.o_proj.weight", True),
                (f"blk.{i}.attn_q_norm.weight", p + "self_attn.q_norm.weight", False),
                (f"blk.{i}.attn_k_norm.weight", p + "self_attn.k_norm.weight", False),
                (f"blk.{i}.ffn_norm.weight", p + "post_attention_layernorm.weight", False),
                (f"blk.{i}.ffn_gate.weight", p + "mlp.gate_proj.weight", True),
                (f"blk.{i}.ffn_up.weight", p + "mlp.up_proj.weight", True),
                (f"blk.{i}.ffn_down.weight", p + "mlp.down_proj.weight", True)]
    out.append(("output_norm.weight", "model.norm.weight", False))
    if not cfg.get("tie_word_embeddings", False):
        out.append(("output.weight", "lm_head.weight", True))
    missing = [hf for _, hf, _ in out if hf not in src]
    if missing:
        sys.exit(f"gguf.py: tensor {missing[0]} is missing ({len(missing)} missing in all)")
    return out


def vocab_keys(tok_dir, cfg):
    with open(os.path.join(tok_dir, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    by_id = {i: t for t, i in tj["model"]["vocab"].items()}
    special = {}
    for a in tj.get("added_tokens", []):
        by_id[a["id"]] = a["content"]
        special[a["id"]] = a.get("special", False)
    V = cfg["vocab_size"]
    if max(by_id) >= V:
        sys.exit(f"gguf.py: token id {max(by_id)} >= vocab_size {V}")
    tokens, types = [], []
    for i in range(V):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
        else:
            tokens.append(by_id[i])
            types.append((CONTROL if special[i] else USER_DEFINED) if i in special else NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    eos = cfg.get("eos_token_id", 151645)
    eos = eos[0] if isinstance(eos, list) else eos
    return [kv("tokenizer.ggml.model", STR, "gpt2"), kv("tokenizer.ggml.pre", STR, "qwen2"),
            kv("tokenizer.ggml.tokens", ARR, (STR, tokens)),
            kv("tokenizer.ggml.token_type", ARR, (I32, types)),
            kv("tokenizer.ggml.merges", ARR, (STR, merges)),
            kv("tokenizer.ggml.bos_token_id", U32, 151643),
            kv("tokenizer.ggml.eos_token_id", U32, int(eos) if eos is not None and eos >= 0 else 151645),
            kv("tokenizer.ggml.padding_token_id", U32, 151643),
            kv("tokenizer.ggml.add_bos_token", BOOL, False)]


def convert(folder, out_path, dtype, tok_dir):
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("num_experts", 0) > 0:
        sys.exit("gguf.py: MoE (qwen3moe) is not written by this converter; dense Qwen3 only")
    src = read_safetensors(folder)
    C, NH = cfg["hidden_size"], cfg["num_attention_heads"]
    D = cfg.get("head_dim") or C // NH
    keys = [kv("general.architecture", STR, "qwen3"), kv("general.name", STR, "ctitan-bench"),
            kv("general.alignment", U32, ALIGN),
            kv("qwen3.block_count", U32, cfg["num_hidden_layers"]),
            kv("qwen3.context_length", U32, cfg.get("max_position_embeddings", 40960)),
            kv("qwen3.embedding_length", U32, C),
            kv("qwen3.feed_forward_length", U32, cfg["intermediate_size"]),
            kv("qwen3.attention.head_count", U32, NH),
            kv("qwen3.attention.head_count_kv", U32, cfg.get("num_key_value_heads", NH)),
            kv("qwen3.attention.key_length", U32, D), kv("qwen3.attention.value_length", U32, D),
            kv("qwen3.attention.layer_norm_rms_epsilon", F32V, cfg.get("rms_norm_eps", 1e-6)),
            kv("qwen3.rope.freq_base", F32V, cfg.get("rope_theta", 1e6))]
    keys += vocab_keys(tok_dir, cfg)
    want = GGML_BF16 if dtype == "bf16" else GGML_F32
    plan, offset = [], 0
    for gname, hf, matrix in names_of(cfg, src):
        _, sdt, shape, b, e = src[hf]
        t = want if matrix else GGML_F32
        n = int(np.prod(shape))
        size = n * (2 if t == GGML_BF16 else 4)
        plan.append((gname, hf, t, shape, offset, size))
        offset += (size + ALIGN - 1) // ALIGN * ALIGN
    with open(out_path, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, len(plan), len(keys)))
        for k in keys:
            f.write(k)
        for gname, _, t, shape, off, _ in plan:
            dims = list(reversed(shape))  # ne[0] is the fastest (row-major columns)
            f.write(gstr(gname) + struct.pack("<I", len(dims)) +
                    struct.pack("<%dQ" % len(dims), *dims) + struct.pack("<IQ", t, off))
        f.write(b"\0" * (-f.tell() % ALIGN))
        base = f.tell()
        for gname, hf, t, shape, off, size in plan:
            f.write(b"\0" * (base + off - f.tell()))
            _, data = tensor_bytes(src, hf, t)
            if len(data) != size:
                sys.exit(f"gguf.py: {hf}: {len(data)} bytes, expected {size}")
            f.write(data)
    return out_path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder")
    ap.add_argument("out")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--tokenizer", help="folder with tokenizer.json (default: the HF folder)")
    a = ap.parse_args()
    convert(a.folder, a.out, a.dtype, a.tokenizer or a.folder)


if __name__ == "__main__":
    main()
