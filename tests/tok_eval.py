#!/usr/bin/env python3
"""`ctitan eval`, forward-only loss and perplexity, against what it must equal:

- `ctitan verify`'s loss on the same window, bit for bit (fp32 and bf16, dense, and MoE with
  HF's aux loss in it), and the PyTorch reference (tests/ref/qwen3_ref.py) on the dense case.
  bf16 on weights stored as BF16, as published checkpoints are: eval holds the matrices (the
  embedding too) in bf16 only, so on fp32 weights its embedding rows are the rounded ones and
  only the bf16 copy of a trained model's fp32 master agrees with it;
- `ctitan train`'s first logged loss, bit for bit, on the same config: a native flavor at
  torchtitan's random init over real text through the real tokenizer, shuffled, with
  gradient accumulation (global batch 4 in micro-batches of 2); fp32; block_causal;
  conversations, where only the assistant tokens count (train_on = "assistant", fewer targets
  than "all"); bf16 within a tolerance (the random init is fp32, see above);
- a whole pass (--steps 0) takes every window once, its last, partial step padded with ignored
  targets, and its loss is the token-weighted mean of the steps;
- bad input is one line and a non-zero exit."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.environ["CTITAN_SOURCE_DIR"], "tests", "ref"))
from checks import check, summary  # noqa: E402
import qwen3_ref  # noqa: E402
import safetensors_ref  # noqa: E402

BIN, REF, TMP = os.environ["CTITAN_BIN"], os.environ["CTITAN_REF_DIR"], os.environ["CTITAN_TMP"]
ASSETS = os.environ["CTITAN_ASSETS_DIR"]
TOK = os.path.join(ASSETS, "qwen3-tokenizer")
os.makedirs(TMP, exist_ok=True)


def run(args):
    r = subprocess.run([BIN] + args, capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr


def eval_json(args):
    rc, out, err = run(["eval", "--json"] + args)
    check(rc == 0, "eval %s failed: %s" % (" ".join(args), err[-2000:]))
    return json.loads(out) if rc == 0 else None


def verify_json(args):
    rc, out, err = run(["verify", "--json"] + args)
    check(rc == 0, "verify failed: %s" % err[-2000:])
    return json.loads(out) if rc == 0 else None


def train_first_loss(args, name):
    dump = os.path.join(TMP, name)
    subprocess.run(["rm", "-rf", dump], check=True)
    rc, out, err = run(["train", "--training.steps", "1", "--metrics.log_freq", "1",
                        "--metrics.peak_gflops", "100", "--checkpoint.enable", "false",
                        "--job.dump_folder", dump] + args)
    check(rc == 0, "train %s failed: %s" % (name, (out + err)[-2000:]))
    if rc != 0:
        return None
    rows = [json.loads(l) for l in open(os.path.join(dump, "metrics.jsonl"))]
    return [r["loss"] for r in rows if "loss" in r][0]


def bf16_copy(src, dst):
    """The HF folder src with its weights stored as BF16 (rounded to nearest even)."""
    os.makedirs(dst, exist_ok=True)
    for f in os.listdir(src):
        if f.endswith(".json") and "safetensors" not in f:
            with open(os.path.join(src, f)) as i, open(os.path.join(dst, f), "w") as o:
                o.write(i.read())
    t = safetensors_ref.load_folder(src)
    safetensors_ref.write_folder(dst, [(n, v.float()) for n, v in sorted(t.items())], "BF16")
    return dst


# --- eval = verify, bit for bit, on a reference HF folder (first window batch, no shuffle)
for case, B in [("warmup_cosine_clip_accum_untied", 4), ("moe_hf_aux_clip_accum", 2)]:
    d = os.path.join(REF, "train", case)
    for prec in ["float32", "bfloat16"]:
        hf = os.path.join(d, "hf")
        if prec == "bfloat16":
            hf = bf16_copy(hf, os.path.join(TMP, case + "_bf16"))
        common = ["--model.hf_path", hf, "--training.dataset_path",
                  os.path.join(d, "tokens.npy"), "--training.seq_len", "5",
                  "--training.local_batch_size", str(B)]
        p = ["--training.mixed_precision_param", prec]
        v = verify_json(common + p)
        e = eval_json(common + p + ["--model.backend", "hf", "--training.shuffle", "false",
                                    "--steps", "1"])
        if v and e:
            check(e["step_losses"][0] == v["loss"],
                  "%s %s: eval %r != verify %r" % (case, prec, e["step_losses"][0], v["loss"]))
            if "aux" in v:
                check(e["aux"] == v["aux"], "%s: aux %r vs %r" % (case, e["aux"], v["aux"]))
    if case.startswith("warmup"):
        # The PyTorch reference on the same windows (fp32): measured 0 to 2e-8 relative.
        meta = json.load(open(os.path.join(d, "meta.json")))
        cfg = json.load(open(os.path.join(d, "hf", "config.json")))
        tensors, _ = safetensors_ref.read_file(os.path.join(d, "hf", "model.safetensors"))
        params = {n: torch.frombuffer(bytearray(raw), dtype=torch.float32).view(shape)
                  for n, (dt, shape, raw) in tensors.items() if dt == "F32"}
        check(len(params) == len(tensors), "the reference case's weights are F32")
        tokens = np.load(os.path.join(d, "tokens.npy")).astype(np.int64)
        x = torch.tensor(tokens[:B * 6]).view(B, 6)
        with torch.no_grad():
            logits = qwen3_ref.forward(params, cfg, x[:, :5])
            ref = float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                          x[:, 1:].reshape(-1)))
        # model.hf_path alone: the folder's model (backend hf), as a downloaded model is checked
        e = eval_json(["--model.hf_path", os.path.join(d, "hf"), "--training.dataset_path",
                       os.path.join(d, "tokens.npy"), "--training.seq_len", "5",
                       "--training.local_batch_size", str(B),
                       "--training.shuffle", "false", "--steps", "1"])
        if e:
            rel = abs(e["loss"] - ref) / ref
            print("eval vs PyTorch: %.6f vs %.6f (rel %.2e)" % (e["loss"], ref, rel))
            check(rel < 1e-6, "eval %.8f vs PyTorch %.8f" % (e["loss"], ref))

# --- eval = train's first step, bit for bit, on train's config
text = os.path.join(ASSETS, "corpus", "small.txt")
native = ["--model.flavor", "debugmodel", "--model.n_layers", "2", "--model.tokenizer_path", TOK,
          "--training.seq_len", "32", "--training.local_batch_size", "2",
          "--training.global_batch_size", "4", "--debug.seed", "7"]
cases = [("text_fp32", ["--training.dataset_path", text]),
         ("text_bf16", ["--training.dataset_path", text,
                        "--training.mixed_precision_param", "bfloat16"]),
         ("block_causal", ["--training.dataset_path", text,
                           "--model.attn_mask_type", "block_causal"])]
# Conversations: every chat case of the template tests, several times over.
chats = os.path.join(TMP, "chats.jsonl")
with open(os.path.join(os.environ["CTITAN_SOURCE_DIR"], "tests", "chat_cases.jsonl")) as f:
    rows = [json.loads(l) for l in f if l.strip()]
with open(chats, "w") as f:
    for _ in range(6):
        for r in rows:
            msgs = r.get("messages") or []
            plain = all(set(m) == {"role", "content"} and isinstance(m["content"], str) and
                        m["role"] in ("system", "user", "assistant") for m in msgs)
            if plain and any(m["role"] == "assistant" for m in msgs):
                f.write(json.dumps({"messages": r["messages"]}) + "\n")
cases.append(("chat", ["--training.dataset_path", chats]))
for name, extra in cases:
    want = train_first_loss(native + extra, name)
    e = eval_json(native + extra + ["--steps", "1"])
    if want is not None and e:
        got = e["step_losses"][0]
        if name.endswith("bf16"):
            # The embedding rows rounded to bf16 (eval holds no fp32 master): measured 2.6e-5
            # relative on this case.
            rel = abs(got - want) / want
            print("%s: eval %.7f vs train %.7f (rel %.1e)" % (name, got, want, rel))
            check(rel < 3e-4, "%s: eval's first step %r vs train's %r" % (name, got, want))
        else:
            check(got == want, "%s: eval's first step %r != train's %r" % (name, got, want))
# The assistant mask: fewer targets than training on every token.
e_mask = eval_json(native + ["--training.dataset_path", chats, "--steps", "2"])
e_all = eval_json(native + ["--training.dataset_path", chats, "--steps", "2",
                            "--training.train_on", "all"])
if e_mask and e_all:
    check(0 < e_mask["tokens"] < e_all["tokens"] == 2 * 4 * 32,
          "chat: %r assistant targets vs %r in all" % (e_mask["tokens"], e_all["tokens"]))

# --- a whole pass: every window once, the last step padded
tokens = os.path.join(TMP, "tokens.npy")
np.save(tokens, np.random.default_rng(3).integers(0, 151643, 11 * 33 + 5).astype(np.uint32))
whole = eval_json(native + ["--training.dataset_path", tokens])
if whole:
    # 11 windows of 33 tokens in 3 steps of 4 (the last holds 3).
    check(whole["windows"] == 11 and whole["steps"] == 3 and whole["tokens"] == 11 * 32,
          "whole pass: %r" % {k: whole[k] for k in ("windows", "steps", "tokens")})
    weights = [4 * 32, 4 * 32, 3 * 32]
    mean = sum(w * l for w, l in zip(weights, whole["step_losses"])) / sum(weights)
    check(abs(mean - whole["loss"]) < 1e-12 * whole["loss"], "loss %r vs the steps' mean %r" %
          (whole["loss"], mean))
    check(abs(whole["perplexity"] - math.exp(whole["loss"])) < 1e-9 * whole["perplexity"],
          "perplexity")

# --- errors: one line each
for args, want in [
        (native + ["--training.dataset_path", tokens, "--steps", "-1"], "--steps -1"),
        (native, "training.dataset_path"),
        (native + ["--training.dataset_path", os.path.join(TMP, "missing.npy")], "missing.npy"),
        (["--model.backend", "hf", "--model.hf_path", os.path.join(TMP, "nofolder"),
          "--training.dataset_path", tokens], "nofolder"),
        (native + ["--training.dataset_path", tokens, "--model.flavour", "x"], "model.flavor")]:
    rc, out, err = run(["eval"] + args)
    lines = [l for l in err.splitlines() if l.startswith("ctitan: error:")]
    check(rc == 1 and len(lines) == 1 and want in lines[0],
          "eval %s: rc %d, %r" % (" ".join(args[-2:]), rc, err[-500:]))

sys.exit(summary())
