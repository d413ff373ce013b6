#!/usr/bin/env python3
"""The PyTorch reference for training (torch.optim.AdamW, torch.nn.utils.clip_grad_norm_,
LambdaLR with torchtitan's linear_warmup_stable_decay), for tests/train_cli_parity.py (`ctitan
train` end to end), tests/test_train_parity.c (the cases with ignored targets) and
tests/test_optim.c. make_ref.py calls write_all(DIR); alone: train_ref.py --out DIR.

DIR/train/index.json            {"cases": [all names], "moe_cases": [the MoE ones]}
DIR/train/<case>/hf/            the initial weights: config.json + model.safetensors (F32);
                                max_position_embeddings is max(64, T)
DIR/train/<case>/tokens.npy     the token stream (<i4)
DIR/train/<case>/val.npy        cases with "val": the validation token stream (<i4)
DIR/train/<case>/meta.json      the run's settings and, per step, "loss", "grad_norm" (before
                                clipping), "lr" and "clipped"; with "val" (meta "val": windows,
                                freq, steps = -1), "val_loss" after every freq-th step: the eval
                                loss of the updated weights over the whole validation split,
                                batch b holding windows (b*B + i) mod windows, as the trainer
                                reads them
DIR/train/<case>/final.safetensors  F32: the weights after the last step under their HF names,
                                and "exp_avg.<name>", "exp_avg_sq.<name>" (the optimizer state)
DIR/train/schedules.json        LambdaLR's learning rates for steps 0..steps over many settings
DIR/train/adamw.safetensors     single AdamW steps on one tensor: "p0" and, for run r and step
                                k, "g.r.k" (input), "p.r.k", "m.r.k", "v.r.k" (torch's results)
DIR/train/adamw.json            the settings of those runs; "fused": whether this torch's CPU
                                kernels fuse the multiply-add in the moment updates (then ctitan
                                must agree bit for bit)

Data (torchtitan): step s uses global samples g = s*G .. s*G+G-1 with G = B*accum; sample g is
tokens[g*(T+1) : (g+1)*(T+1)], inputs its first T, targets its last T; micro-batch j holds samples
s*G + j*B ..; then every target [g, t] listed in meta["ignore"] is -100. The loss of a step is
(sum of token cross-entropies over all micro-batches) / (valid targets in the whole step), and
each micro-batch backpropagates its own share of it, so accumulation adds up to exactly that.

MoE cases (MOE_CASES, Qwen3MoeForCausalLM) record per step also "ce" (the cross-entropy part),
"aux" (the mean over micro-batches of HF's load-balancing statistic, each micro-batch's from its
own forward; with the expert bias it counts the experts actually chosen) and
"tokens_per_expert" [[per expert] per sparse layer] (summed over the micro-batches). meta adds
"moe": true, the MoE config, "sparse_layers" and "load_balance":
  "hf":       loss = ce + router_aux_loss_coef * aux (output_router_logits); micro-batch j
              backpropagates CE_sum_j / n_valid + router_aux_loss_coef * aux_j / accum;
  "none":     loss = ce;
  "aux_free": loss = ce; torchtitan's aux-loss-free balancing: each sparse layer has an
              expert_bias (E), zero at first, that only the choice sees (topk(probs + bias));
              after a step's micro-batches, before clipping and the optimizer step,
              delta = load_balance_coeff * sign(mean(tokens_per_expert) - tokens_per_expert),
              bias += delta - mean(delta) (fp32). The log adds "expert_bias" (after that update)
              and "bias_changed_choices" (tokens whose chosen experts the bias changed);
              final.safetensors adds "model.layers.{i}.mlp.expert_bias"; meta adds
              "load_balance_coeff".
Experts with no token in a step get zero gradients (AdamW still decays them and their moments).
"""
import argparse
import functools
import json
import math
import os
import shutil
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen3_ref  # noqa: E402
import safetensors_ref  # noqa: E402

# Clipping is on in the first two cases, with max_norm set so that some steps clip and some do
# not (train_case checks both happen, and that no norm lies too near max_norm). The cases cover
# constant LR and warmup + cosine (the parity runs), sqrt decay, tied and untied heads,
# biases, GQA/MQA, gradient accumulation with and without ignored targets, and weight decay off
# for norms, biases and embeddings. A case without ignored targets is also a plain `ctitan train`
# run (backend hf on hf/, dataset tokens.npy, shuffle off) whose metrics must match its log.
CASES = [
    dict(name="const_clip_tied_bias", V=96, C=32, F=64, L=2, NH=4, NKV=2, D=8, tied=True,
         bias=True, B=2, T=8, accum=1, steps=5, lr=2e-3, betas=(0.9, 0.95), eps=1e-8, wd=0.1,
         max_norm=7.2, warmup=0, decay_ratio=0.0, decay_type="linear", min_lr_factor=0.0,
         decay_all=True, ignore=[]),
    dict(name="warmup_cosine_clip_accum_untied", V=112, C=24, F=48, L=2, NH=3, NKV=3, D=8,
         tied=False, bias=False, B=1, T=12, accum=3, steps=5, lr=3e-3, betas=(0.9, 0.95),
         eps=1e-8, wd=0.1, max_norm=2.5, warmup=2, decay_ratio=0.6, decay_type="cosine",
         min_lr_factor=0.1, decay_all=False, ignore=[]),
    dict(name="sqrt_noclip_mqa_tied_ignore", V=80, C=32, F=40, L=2, NH=4, NKV=1, D=12,
         tied=True, bias=False, B=2, T=6, accum=2, steps=5, lr=4e-3, betas=(0.85, 0.99), eps=1e-8,
         wd=0.01, max_norm=0.0, warmup=1, decay_ratio=0.8, decay_type="sqrt", min_lr_factor=0.0,
         decay_all=True, ignore=[[0, 3], [1, 0], [1, 5], [7, 2], [13, 5], [19, 0]]),
]

# MoE training cases (the MoE keys as in make_ref.MOE_VARIANTS; lb is the load balancing):
# HF's aux loss with clipping and accumulation; no balancing with K=1, no renormalisation,
# dense and sparse layers mixed and a tied head; and the aux-loss-free expert bias with
# accumulation, its coefficient large enough that the bias changes choices within 5 steps.
MOE_CASES = [
    dict(name="moe_hf_aux_clip_accum", V=96, C=32, F=48, L=2, NH=4, NKV=2, D=8, tied=False,
         bias=False, B=2, T=5, accum=2, steps=5, lr=3e-3, betas=(0.9, 0.95), eps=1e-8, wd=0.1,
         max_norm=3.5, warmup=1, decay_ratio=0.4, decay_type="linear", min_lr_factor=0.1,
         decay_all=False, ignore=[], E=8, K=2, Fm=16, norm=True, step=1, mlp_only=[], aux=True,
         coef=0.02, lb="hf"),
    dict(name="moe_none_k1_nonorm_mix_tied", V=80, C=24, F=40, L=3, NH=2, NKV=1, D=12, tied=True,
         bias=True, B=2, T=5, accum=1, steps=5, lr=4e-3, betas=(0.9, 0.95), eps=1e-8, wd=0.1,
         max_norm=0.0, warmup=0, decay_ratio=0.4, decay_type="sqrt", min_lr_factor=0.0,
         decay_all=True, ignore=[], E=4, K=1, Fm=12, norm=False, step=1, mlp_only=[1],
         aux=False, coef=0.001, lb="none"),
    dict(name="moe_aux_free_bias_accum", V=88, C=32, F=48, L=2, NH=4, NKV=4, D=8, tied=False,
         bias=False, B=2, T=8, accum=2, steps=5, lr=3e-3, betas=(0.9, 0.95), eps=1e-8, wd=0.1,
         max_norm=0.0, warmup=2, decay_ratio=0.4, decay_type="cosine", min_lr_factor=0.1,
         decay_all=False, ignore=[], E=8, K=2, Fm=8, norm=True, step=1, mlp_only=[], aux=False,
         coef=0.001, lb="aux_free", lb_coeff=1e-2),
]

# Cases for the end-to-end test (tests/train_cli_parity.py), written after the MoE cases so the
# earlier cases keep their random draws. "clip": "hard" sets max_norm well below every step's
# gradient norm (train_case checks each step clips to at most half, by coefficients that differ
# between steps: AdamW is nearly blind to a gradient scale that is the same at every step, so
# only varying coefficients make the clipping show in the losses and weights). "val" adds a
# validation split of `windows` windows, evaluated after every `freq` steps over the whole split
# (validation.steps = -1; windows is a multiple of B so no batch wraps around). T = 257 crosses
# four 64-key tiles of the flash attention kernel and ends in a one-key tile.
LATER_CASES = [
    dict(name="hardclip_val_accum_bias", V=96, C=32, F=64, L=2, NH=4, NKV=2, D=8, tied=False,
         bias=True, B=2, T=16, accum=2, steps=6, lr=3e-3, betas=(0.9, 0.95), eps=1e-8, wd=0.1,
         max_norm=0.5, warmup=2, decay_ratio=0.5, decay_type="linear", min_lr_factor=0.1,
         decay_all=True, ignore=[], clip="hard", val=dict(windows=6, freq=2)),
    dict(name="long_t257_gqa_tied_val", V=64, C=32, F=64, L=2, NH=4, NKV=2, D=16, tied=True,
         bias=False, B=2, T=257, accum=1, steps=4, lr=3e-3, betas=(0.9, 0.95), eps=1e-8,
         wd=0.1, max_norm=0.0, warmup=1, decay_ratio=0.5, decay_type="cosine",
         min_lr_factor=0.0, decay_all=True, ignore=[], val=dict(windows=2, freq=2)),
]

# (steps, warmup_steps, decay_ratio, decay_type, min_lr_factor) for schedules.json: constant,
# warmup only, each decay alone and after warmup, warmup clamped to steps, decay clamped to
# steps - warmup, and Python's round-half-even on steps * decay_ratio (2.5 -> 2, 3.5 -> 4).
SCHEDULES = [
    (10, 0, 0.0, "linear", 0.0),
    (10, 3, 0.0, "cosine", 0.0),
    (10, 0, 0.5, "linear", 0.0),
    (10, 0, 0.5, "sqrt", 0.0),
    (10, 0, 0.5, "cosine", 0.0),
    (12, 3, 0.4, "linear", 0.1),
    (12, 3, 0.4, "sqrt", 0.25),
    (12, 3, 0.4, "cosine", 0.1),
    (10, 20, 0.3, "cosine", 0.0),
    (10, 6, 0.6, "linear", 0.0),
    (5, 1, 0.5, "linear", 0.0),
    (7, 0, 0.5, "cosine", 0.05),
    (1, 0, 1.0, "cosine", 0.0),
    (1, 1, 0.0, "linear", 0.0),
    (200, 20, 1.0, "cosine", 0.1),
    # decay_ratio unset (None): decay over every step after the warmup
    (10, 3, None, "linear", 0.0),
    (10, 0, None, "cosine", 0.1),
    (10, 20, None, "sqrt", 0.0),
    (1, 0, None, "linear", 0.0),
]


def decay_steps_of(steps, warmup, decay_ratio):
    """build_lr_schedulers' phase lengths (torchtitan; decay_ratio 0 = no decay, None = all
    steps after the warmup)."""
    warmup = min(int(warmup), steps)
    decay = steps - warmup if decay_ratio is None else round(steps * decay_ratio)
    if warmup + decay > steps:
        decay = steps - warmup
    # torchtitan adds a virtual last step so the last real step is not at the floor.
    stable = steps + 1 - warmup - decay
    return warmup, stable, decay


def linear_warmup_stable_decay(current_step, warmup_steps, stable_steps, decay_steps,
                               lr_decay_type, min_lr_factor):
    """torchtitan's LambdaLR factor, as in torchtitan/components/lr_scheduler.py."""
    warmup_stable_steps = warmup_steps + stable_steps
    if current_step < warmup_steps:
        current_step += 1
        curr_adjustment = float(current_step / warmup_steps)
    elif current_step < warmup_stable_steps:
        curr_adjustment = 1.0
    else:
        current_step += 1
        progress = float(current_step - warmup_stable_steps) / decay_steps
        if lr_decay_type == "linear":
            curr_adjustment = 1 - progress
        elif lr_decay_type == "sqrt":
            curr_adjustment = 1 - math.sqrt(progress)
        elif lr_decay_type == "cosine":
            curr_adjustment = 0.5 * (1.0 + math.cos(math.pi * progress))
        else:
            raise ValueError(lr_decay_type)
        curr_adjustment = min_lr_factor + (1 - min_lr_factor) * curr_adjustment
    return curr_adjustment


def make_scheduler(opt, steps, warmup, decay_ratio, decay_type, min_lr_factor):
    w, s, d = decay_steps_of(steps, warmup, decay_ratio)
    fn = functools.partial(linear_warmup_stable_decay, warmup_steps=w, stable_steps=s,
                           decay_steps=d, lr_decay_type=decay_type, min_lr_factor=min_lr_factor)
    return torch.optim.lr_scheduler.LambdaLR(opt, fn)


def write_schedules(d):
    out = []
    base_lr = 3e-4
    for steps, warmup, ratio, kind, min_f in SCHEDULES:
        p = torch.zeros(1, requires_grad=True)
        opt = torch.optim.SGD([p], lr=base_lr)
        sched = make_scheduler(opt, steps, warmup, ratio, kind, min_f)
        lrs = []
        for i in range(steps + 1):  # through the virtual step at index `steps`
            lrs.append(opt.param_groups[0]["lr"])
            if i < steps:
                opt.step()
                sched.step()
        out.append(dict(lr=base_lr, steps=steps, warmup_steps=warmup, decay_ratio=ratio,
                        decay_type=kind, min_lr_factor=min_f, lrs=lrs))
    with open(os.path.join(d, "schedules.json"), "w") as f:
        json.dump({"schedules": out}, f, indent=1)
        f.write("\n")


def torch_fuses_fma():
    """Whether torch's CPU add(alpha=) rounds once (a fused multiply-add, as its AVX2 kernels
    do): with a = b = 1 + 2^-12, a*b = 1 + 2^-11 + 2^-24 loses its last bit in fp32."""
    x = torch.full((64,), -1.0)
    b = torch.full((64,), 1.0 + 2.0 ** -12)
    x.add_(b, alpha=1.0 + 2.0 ** -12)
    return bool((x == 2.0 ** -11 + 2.0 ** -24).all())


def write_adamw(d, gen):
    """A few AdamW steps on one odd-sized tensor (vector body and scalar tail), torch's results
    after each; run 0 decays, run 1 has weight_decay 0; the LR changes between steps."""
    n = 1003
    p0 = torch.randn(n, generator=gen) * 0.5
    # Gradients across magnitudes, including exact zeros and values near eps.
    scales = torch.tensor([1e-9, 1e-6, 1e-3, 1.0, 30.0])
    entries = [("p0", p0)]
    runs = []
    for r, (wd, betas, eps, lrs) in enumerate([(0.1, (0.9, 0.95), 1e-8, [1e-3, 3e-3, 2e-3, 5e-4]),
                                               (0.0, (0.8, 0.999), 1e-6, [1e-2, 1e-2, 5e-3])]):
        p = p0.clone().requires_grad_(True)
        opt = torch.optim.AdamW([p], lr=lrs[0], betas=betas, eps=eps, weight_decay=wd)
        for k, lr in enumerate(lrs):
            g = torch.randn(n, generator=gen) * scales[torch.arange(n) % len(scales)]
            g[torch.arange(n) % 17 == 0] = 0.0
            opt.param_groups[0]["lr"] = lr
            p.grad = g.clone()
            opt.step()
            st = opt.state[p]
            entries += [("g.%d.%d" % (r, k), g), ("p.%d.%d" % (r, k), p.detach().clone()),
                        ("m.%d.%d" % (r, k), st["exp_avg"].clone()),
                        ("v.%d.%d" % (r, k), st["exp_avg_sq"].clone())]
        runs.append(dict(weight_decay=wd, beta1=betas[0], beta2=betas[1], eps=eps, lrs=lrs))
    safetensors_ref.write_file(os.path.join(d, "adamw.safetensors"), entries, "F32")
    with open(os.path.join(d, "adamw.json"), "w") as f:
        json.dump(dict(n=n, runs=runs, fused=torch_fuses_fma()), f, indent=2)
        f.write("\n")


def model_cfg(c):
    return {
        "vocab_size": c["V"], "hidden_size": c["C"], "intermediate_size": c["F"],
        "num_hidden_layers": c["L"], "num_attention_heads": c["NH"],
        "num_key_value_heads": c["NKV"], "head_dim": c["D"], "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "tie_word_embeddings": c["tied"], "attention_bias": c["bias"],
    }


def param_decays(name, ndim):
    """decay_norms_and_embeddings = false: no decay for 1-D tensors (norms, biases) and the
    embedding (ctitan's adamw_param_decays)."""
    return ndim >= 2 and "embed_tokens" not in name


def step_batches(tokens, c, s):
    """[(inputs, targets)] for the micro-batches of 0-based step s, ignores applied."""
    B, T, G = c["B"], c["T"], c["B"] * c["accum"]
    ignore = {(g, t) for g, t in c["ignore"]}
    out = []
    for j in range(c["accum"]):
        first = s * G + j * B
        inp, tgt = qwen3_ref.windows(tokens[first * (T + 1):], B, T)
        for b in range(B):
            for t in range(T):
                if (first + b, t) in ignore:
                    tgt[b, t] = qwen3_ref.IGNORE_INDEX
        out.append((inp, tgt))
    return out


def write_case_inputs(d, c, gen, make_ref, dtype="F32"):
    """Writes d/hf/ (the initial weights stored as `dtype`), d/tokens.npy and, with "val",
    d/val.npy. Returns (cfg, order, params, tokens, val_tokens): params are the values a reader
    of the stored weights sees (rounded to `dtype`), the ones training starts from."""
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(os.path.join(d, "hf"))
    cfg = model_cfg(c)
    if c.get("E"):
        cfg.update(make_ref.moe_keys(c))
    order = [n for n, _ in qwen3_ref.param_shapes(cfg)]
    params = {n: safetensors_ref.round_to(t, dtype)
              for n, t in make_ref.make_params(cfg, gen).items()}
    hfc = make_ref.hf_config(dict(c, dtype=dtype, eps=cfg["rms_norm_eps"],
                                  theta=cfg["rope_theta"]))
    hfc["max_position_embeddings"] = max(hfc["max_position_embeddings"], c["T"])
    with open(os.path.join(d, "hf", "config.json"), "w") as f:
        json.dump(hfc, f, indent=2, sort_keys=True)
        f.write("\n")
    safetensors_ref.write_file(os.path.join(d, "hf", "model.safetensors"),
                               [(n, params[n]) for n in order], dtype)
    G, T, steps = c["B"] * c["accum"], c["T"], c["steps"]
    tokens = torch.randint(0, c["V"], (steps * G * (T + 1) + 5,), generator=gen).numpy()
    np.save(os.path.join(d, "tokens.npy"), tokens.astype("<i4"))
    val = c.get("val")
    val_tokens = None
    if val:
        assert not c.get("E") and val["windows"] % c["B"] == 0
        # A few tokens past the last window, which the loader leaves out.
        val_tokens = torch.randint(0, c["V"], (val["windows"] * (T + 1) + 3,),
                                   generator=gen).numpy()
        np.save(os.path.join(d, "val.npy"), val_tokens.astype("<i4"))
    return cfg, order, params, tokens, val_tokens


def train_run(c, cfg, order, params, tokens, val_tokens=None, autocast=False):
    """The training loop of case c from params (not modified). autocast: every forward, the
    loss and the MoE aux loss run under torch.autocast("cpu", dtype=torch.bfloat16), as an HF
    model's forward under autocast would (tests/ref/bf16_ref.py); parameters, gradients and the
    AdamW state stay fp32. The cross-entropy reads the logits upcast to fp32 (HF's
    logits.float(); a no-op in fp32). Under autocast, exact ties in the router's top-k (bf16
    router logits make them common) are counted in the log's "router_ties", not refused.
    Returns dict(log, ps {name: parameter}, opt, expert_bias, min_gap)."""
    moe = bool(c.get("E"))
    steps = c["steps"]
    val = c.get("val")
    ps = {n: params[n].clone().requires_grad_(True) for n in order}
    plist = [ps[n] for n in order]
    decay = [ps[n] for n in order if c["decay_all"] or param_decays(n, ps[n].dim())]
    keep = [ps[n] for n in order if not (c["decay_all"] or param_decays(n, ps[n].dim()))]
    groups = [{"params": decay}] + ([{"params": keep, "weight_decay": 0.0}] if keep else [])
    opt = torch.optim.AdamW(groups, lr=c["lr"], betas=c["betas"], eps=c["eps"],
                            weight_decay=c["wd"])
    sched = make_scheduler(opt, steps, c["warmup"], c["decay_ratio"], c["decay_type"],
                           c["min_lr_factor"])
    max_norm = c["max_norm"]
    sparse = qwen3_ref.sparse_layers(cfg)
    lb = c.get("lb")
    expert_bias = {i: torch.zeros(c["E"]) for i in sparse} if lb == "aux_free" else None
    min_gap = None
    log = []
    for s in range(steps):
        lr = opt.param_groups[0]["lr"]
        opt.zero_grad(set_to_none=False)
        batches = step_batches(tokens, c, s)
        n_valid = sum(int((t != qwen3_ref.IGNORE_INDEX).sum()) for _, t in batches)
        loss_sum = 0.0
        if moe:
            st = dict(aux_sum=0.0, load=torch.zeros(len(sparse), c["E"]), changed=0, ties=0)
        for inp, tgt in batches:
            if moe:
                min_gap = moe_microbatch(ps, cfg, c, inp, tgt, n_valid, expert_bias, st, min_gap,
                                         autocast)
                loss_sum += st.pop("ce")
                continue
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                logits = qwen3_ref.forward(ps, cfg, inp)
                ce = F.cross_entropy(logits.float().reshape(-1, c["V"]), tgt.reshape(-1),
                                     ignore_index=qwen3_ref.IGNORE_INDEX, reduction="sum")
            (ce / n_valid).backward()
            loss_sum += float(ce)
        for p in plist:  # experts that saw no token in the step: zero gradients, as in ctitan
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        entry = {}
        if moe:
            aux = st["aux_sum"] / c["accum"]
            entry = dict(ce=loss_sum / n_valid, aux=aux,
                         tokens_per_expert=[[int(x) for x in row] for row in st["load"]])
            if autocast:
                entry["router_ties"] = st["ties"]
            if expert_bias is not None:
                for k, i in enumerate(sparse):  # torchtitan's update, in fp32
                    tpe = st["load"][k]
                    delta = c["lb_coeff"] * torch.sign(tpe.mean() - tpe)
                    expert_bias[i] += delta - delta.mean()
                entry.update(expert_bias=[[float(x) for x in expert_bias[i]] for i in sparse],
                             bias_changed_choices=st["changed"])
        norm = float(torch.norm(torch.stack([torch.norm(p.grad.detach()) for p in plist])))
        if max_norm > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(plist, max_norm))
        opt.step()
        sched.step()
        loss = loss_sum / n_valid
        if lb == "hf":
            loss += c["coef"] * aux
        if val and (s + 1) % val["freq"] == 0:
            entry["val_loss"] = eval_loss(ps, cfg, c, val_tokens)
        log.append(dict(loss=loss, grad_norm=norm, lr=lr, n_valid=n_valid,
                        clipped=bool(max_norm > 0 and norm > max_norm), **entry))
    return dict(log=log, ps=ps, opt=opt, expert_bias=expert_bias, min_gap=min_gap)


def check_clipping(c, log, margin=1e-3):
    """Refuses a case whose clipping does not do what it is there for: "clip": "hard" must clip
    every step to at most half, by varying coefficients; otherwise, with max_norm > 0, some
    steps must clip and some not, and no norm may lie within `margin` (relative) of max_norm,
    where another implementation's rounding could decide the other way."""
    max_norm = c["max_norm"]
    coefs = [max_norm / (e["grad_norm"] + 1e-6) for e in log]
    if c.get("clip") == "hard" and (max(coefs) > 0.5 or min(coefs) > 0.8 * max(coefs)):
        raise RuntimeError("%s: max_norm %g gives clip coefficients %s: want all <= 0.5 and "
                           "varying by over 20%%" % (c["name"], max_norm, coefs))
    if max_norm > 0 and c.get("clip") != "hard":
        clipped = [e["clipped"] for e in log]
        near = [e["grad_norm"] for e in log
                if abs(e["grad_norm"] - max_norm) < margin * max_norm]
        if all(clipped) or not any(clipped) or near:
            raise RuntimeError("%s: max_norm %g clips steps %s, norms %s" % (
                c["name"], max_norm, clipped, [e["grad_norm"] for e in log]))


def case_meta(c, order, log):
    """meta.json's run settings (the keys train_cli_parity.py's command line reads), params and
    the log."""
    meta = {k: c[k] for k in ("name", "B", "T", "accum", "steps", "lr", "eps", "warmup",
                              "decay_ratio", "decay_type", "min_lr_factor", "ignore")}
    meta.update(beta1=c["betas"][0], beta2=c["betas"][1], weight_decay=c["wd"],
                max_norm=c["max_norm"], decay_norms_and_embeddings=c["decay_all"], params=order,
                log=log)
    return meta


def train_case(d, c, gen, make_ref):
    cfg, order, params, tokens, val_tokens = write_case_inputs(d, c, gen, make_ref)
    r = train_run(c, cfg, order, params, tokens, val_tokens)
    log, ps, opt, expert_bias = r["log"], r["ps"], r["opt"], r["expert_bias"]
    lb = c.get("lb")
    if lb == "aux_free" and not any(e["bias_changed_choices"] for e in log):
        raise RuntimeError("%s: the expert bias never changed a choice" % c["name"])
    check_clipping(c, log)
    sparse = qwen3_ref.sparse_layers(cfg)
    final = [(n, ps[n].detach()) for n in order]
    for n in order:
        st = opt.state[ps[n]]
        final += [("exp_avg." + n, st["exp_avg"]), ("exp_avg_sq." + n, st["exp_avg_sq"])]
    if expert_bias is not None:
        final += [("model.layers.%d.mlp.expert_bias" % i, expert_bias[i]) for i in sparse]
    safetensors_ref.write_file(os.path.join(d, "final.safetensors"), final, "F32")
    meta = case_meta(c, order, log)
    if c.get("val"):
        meta["val"] = dict(c["val"], steps=-1)
    if c.get("E"):
        meta.update(moe=True, **make_ref.moe_keys(c), sparse_layers=sparse, load_balance=lb,
                    moe_min_gap=r["min_gap"])
        if lb == "aux_free":
            meta["load_balance_coeff"] = c["lb_coeff"]
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    return meta


def eval_loss(ps, cfg, c, val_tokens):
    """The trainer's validation over the whole split (validation.steps = -1): batch b holds
    windows (b*B + i) mod n for i < B, for ceil(n/B) batches; the loss is the CE summed over
    every target of every batch divided by their count."""
    B, T = c["B"], c["T"]
    n = len(val_tokens) // (T + 1)
    w = torch.as_tensor(val_tokens[: n * (T + 1)], dtype=torch.int64).reshape(n, T + 1)
    total, count = 0.0, 0
    with torch.no_grad():
        for b in range((n + B - 1) // B):
            batch = w[[(b * B + i) % n for i in range(B)]]
            logits = qwen3_ref.forward(ps, cfg, batch[:, :-1])
            total += float(F.cross_entropy(logits.reshape(-1, c["V"]), batch[:, 1:].reshape(-1),
                                           reduction="sum"))
            count += B * T
    return total / count


def moe_microbatch(ps, cfg, c, inp, tgt, n_valid, expert_bias, st, min_gap, autocast=False):
    """Forward + backward of one MoE micro-batch: its share of the step's loss (see the module
    doc). Adds to st: "ce" (the CE sum), "aux_sum", "load" (per sparse layer and expert),
    "changed" (choices the expert bias changed) and "ties" (exact ties at the top-k boundary).
    Returns the smallest top-k gap so far, after refusing choices that hang on an exact tie or a
    gap under make_ref.MIN_GAP (under autocast ties are counted, not refused)."""
    import make_ref

    E, K = c["E"], c["K"]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):  # as HF's forward
        logits, routers = qwen3_ref.forward_full(ps, cfg, inp, expert_bias)
        ce = F.cross_entropy(logits.float().reshape(-1, c["V"]), tgt.reshape(-1),
                             ignore_index=qwen3_ref.IGNORE_INDEX, reduction="sum")
        chosen = [r["selected"] for r in routers] if expert_bias is not None else None
        aux = qwen3_ref.aux_loss([r["logits"] for r in routers], E, K, chosen)
    obj = ce / n_valid
    if c["lb"] == "hf":
        obj = obj + aux * (c["coef"] / c["accum"])
    obj.backward()
    st["ce"] = float(ce)
    st["aux_sum"] += float(aux)
    for k, r in enumerate(routers):
        sel = r["selected"].detach()
        st["load"][k] += torch.bincount(sel.reshape(-1), minlength=E).float()
        probs = r["probs"].detach()
        scores = probs if expert_bias is None else probs + expert_bias[r["layer"]]
        ties, gap = qwen3_ref.topk_margin(scores, K)
        st["ties"] += ties
        if autocast:
            ties, gap = 0, None
        if ties or (gap is not None and gap < make_ref.MIN_GAP):
            raise RuntimeError("%s: layer %d: %d tied choices, smallest gap %s" % (
                c["name"], r["layer"], ties, gap))
        if gap is not None:
            min_gap = gap if min_gap is None else min(min_gap, gap)
        if expert_bias is not None:
            plain = torch.topk(probs, K, dim=-1)[1]
            st["changed"] += int((plain.sort(1)[0] != sel.sort(1)[0]).any(1).sum())
    return min_gap


def write_all(out, quiet=False):
    import make_ref  # its model init and config.json; imported late, it imports this module

    d = os.path.join(out, "train")
    os.makedirs(d, exist_ok=True)
    gen = torch.Generator().manual_seed(4321)
    write_schedules(d)
    write_adamw(d, gen)
    names = []
    for c in CASES + MOE_CASES + LATER_CASES:
        meta = train_case(os.path.join(d, c["name"]), c, gen, make_ref)
        names.append(c["name"])
        if not quiet:
            print("train %-32s losses %s" % (c["name"], " ".join(
                "%.5f" % e["loss"] for e in meta["log"])))
            if c.get("E"):
                print("      %-32s aux %s clipped %s changed %s gap %.1e" % (
                    "", " ".join("%.5f" % e["aux"] for e in meta["log"]),
                    [int(e["clipped"]) for e in meta["log"]],
                    [e.get("bias_changed_choices") for e in meta["log"]], meta["moe_min_gap"]))
    with open(os.path.join(d, "index.json"), "w") as f:
        json.dump({"cases": names, "moe_cases": [c["name"] for c in MOE_CASES]}, f, indent=2)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    write_all(args.out, args.quiet)
    return 0


if __name__ == "__main__":
    sys.exit(main())
