"""The PyTorch reference for bf16 mixed-precision training (issue 18), for tests/train_bf16.py:
train_ref.py's training loop with the forward under torch.autocast("cpu", dtype=torch.bfloat16)
(qwen3_ref.py's model, as HF's under autocast; parameters, gradients and the AdamW state stay
fp32), and the same steps in plain fp32 from the same weights and data, so the test can say how
far bf16 lands from fp32 in torch itself. make_ref.py calls write_all(DIR).

DIR/bf16/index.json        {"cases": [names], "moe_cases": [the MoE ones]}
DIR/bf16/<case>/hf/        the initial weights: config.json + model.safetensors, stored as
                           meta["weights_dtype"] (F32 or BF16: then ctitan loads bf16 weights into
                           fp32 masters, and both torch runs start from the bf16-rounded values)
DIR/bf16/<case>/tokens.npy the token stream (<i4); data as in train_ref.py (no ignored targets)
DIR/bf16/<case>/meta.json  train_ref.py's run settings (B, T, accum, steps, lr, eps, beta1,
                           beta2, weight_decay, max_norm, warmup, decay_ratio, decay_type,
                           min_lr_factor, decay_norms_and_embeddings, params), "weights_dtype",
                           "mixed_precision_param": "bfloat16", and "log": per step the autocast
                           run's "loss", "grad_norm" (before clipping), "lr", "clipped", "n_valid"
                           (MoE: "ce", "aux", "tokens_per_expert", "router_ties"), with the fp32
                           run's "fp32_loss" and "fp32_grad_norm" beside them; "bf16_vs_fp32":
                           first-step loss and gradient-norm relative differences and the mean
                           and max absolute loss difference over the steps. MoE cases add
                           train_ref.py's "moe": true, the MoE keys, "sparse_layers" and
                           "load_balance".

Clipping is on in every case. In the dense ones max_norm is set so that some steps clip and no
step's norm, in either run, lies within CLIP_MARGIN of max_norm (bf16 gradient norms are only
good to a few percent, and the clip decision should not hang on them); the MoE case clips every
step (train_ref.py's "clip": "hard").
"""
import json
import os
import sys

import torch

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_ref  # noqa: E402

CLIP_MARGIN = 0.05

# 20 steps each, AdamW with warmup + decay, clipping on:
# - odd shapes: head_dim 12 != 40 / 6, GQA 6 heads on 2 kv heads, untied, F32 weights, accum 2,
#   clipping step 7 only (norms 2.4-3.5);
# - tied head with attention biases, weights stored as BF16, clipping steps 1-3 (norms 5.5, then
#   4 and below);
# - Qwen3-MoE with HF's aux loss (output_router_logits), norm_topk_prob, F32 weights, accum 2,
#   every step clipped to a third or so of its norm.
CASES = [
    dict(name="dense_odd_gqa3_untied_f32", dtype="F32", V=96, C=40, F=72, L=2, NH=6, NKV=2, D=12,
         tied=False, bias=False, B=2, T=12, accum=2, steps=20, lr=3e-3, betas=(0.9, 0.95),
         eps=1e-8, wd=0.1, max_norm=3.3, warmup=3, decay_ratio=0.5, decay_type="cosine",
         min_lr_factor=0.1, decay_all=False, ignore=[]),
    dict(name="dense_tied_bias_bf16", dtype="BF16", V=80, C=32, F=64, L=2, NH=4, NKV=2, D=16,
         tied=True, bias=True, B=2, T=16, accum=1, steps=20, lr=4e-3, betas=(0.9, 0.95),
         eps=1e-8, wd=0.1, max_norm=4.6, warmup=2, decay_ratio=0.8, decay_type="linear",
         min_lr_factor=0.0, decay_all=True, ignore=[]),
    dict(name="moe_hf_aux_norm_f32", dtype="F32", V=96, C=32, F=48, L=2, NH=4, NKV=2, D=8,
         tied=False, bias=False, B=2, T=8, accum=2, steps=20, lr=3e-3, betas=(0.9, 0.95),
         eps=1e-8, wd=0.1, max_norm=1.0, warmup=2, decay_ratio=0.5, decay_type="cosine",
         min_lr_factor=0.1, decay_all=False, ignore=[], E=8, K=2, Fm=16, norm=True, step=1,
         mlp_only=[], aux=True, coef=0.02, lb="hf", clip="hard"),
]


def write_case(d, c, gen, make_ref):
    cfg, order, params, tokens, _ = train_ref.write_case_inputs(d, c, gen, make_ref, c["dtype"])
    bf = train_ref.train_run(c, cfg, order, params, tokens, autocast=True)["log"]
    fp = train_ref.train_run(c, cfg, order, params, tokens)["log"]
    for log in (bf, fp):
        train_ref.check_clipping(c, log, CLIP_MARGIN)
    for e, f in zip(bf, fp):
        e.update(fp32_loss=f["loss"], fp32_grad_norm=f["grad_norm"])
    diffs = [abs(e["loss"] - e["fp32_loss"]) for e in bf]
    meta = train_ref.case_meta(c, order, bf)
    meta.update(weights_dtype=c["dtype"], mixed_precision_param="bfloat16", bf16_vs_fp32=dict(
        first_loss_rel=abs(bf[0]["loss"] - fp[0]["loss"]) / fp[0]["loss"],
        first_grad_norm_rel=abs(bf[0]["grad_norm"] - fp[0]["grad_norm"]) / fp[0]["grad_norm"],
        loss_mean_abs=sum(diffs) / len(diffs), loss_max_abs=max(diffs)))
    if c.get("E"):
        meta.update(moe=True, **make_ref.moe_keys(c), sparse_layers=train_ref.qwen3_ref
                    .sparse_layers(cfg), load_balance=c["lb"])
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    return meta


def write_all(out, quiet=False):
    import make_ref  # its model init and config.json; imported late, it imports train_ref

    d = os.path.join(out, "bf16")
    os.makedirs(d, exist_ok=True)
    gen = torch.Generator().manual_seed(1818)
    for c in CASES:
        meta = write_case(os.path.join(d, c["name"]), c, gen, make_ref)
        if not quiet:
            e = meta["bf16_vs_fp32"]
            print("bf16 %-28s losses %s ... %s" % (c["name"], " ".join(
                "%.4f" % x["loss"] for x in meta["log"][:3]), "%.4f" % meta["log"][-1]["loss"]))
            print("     %-28s vs fp32: first loss %.1e grad norm %.1e rel, mean |loss| %.1e "
                  "max %.1e; clipped %s" % (
                      "", e["first_loss_rel"], e["first_grad_norm_rel"], e["loss_mean_abs"],
                      e["loss_max_abs"], "".join(str(int(x["clipped"])) for x in meta["log"])))
    with open(os.path.join(d, "index.json"), "w") as f:
        json.dump({"cases": [c["name"] for c in CASES],
                   "moe_cases": [c["name"] for c in CASES if c.get("E")]}, f, indent=2)
        f.write("\n")
