#!/usr/bin/env python3
"""MoE training end to end through `ctitan train` on a small debugmodel_moe cut:

- load_balance = aux_free makes expert load measurably more even than none, on skewed (Zipf)
  data: measured (torchtitan's init, lr 1e-3), max/mean tokens per expert over the last 15 of 40
  steps is 3.66 of a possible 4.0 without balancing and 1.79 with the bias (coeff 0.002; 0.01
  gives 2.86, 0.05 overshoots: 3.71);
- the expert bias it learns is saved in checkpoints (a resume continues bit for bit) and left out
  of the HF export;
- load_balance = hf adds exactly router_aux_loss_coef * aux to the cross-entropy, and the aux
  loss's gradient reaches the model: on a reference MoE folder with the aux loss at coefficient
  0.1, `ctitan verify`'s gradient norm of every tensor (the routers' included) and the global
  norm `ctitan train` logs at step 1 match the PyTorch reference (tests/ref/qwen3_ref.py) with the
  aux loss on, where they differ from the aux-off reference by far more than the tolerance;
- the grouped and loop expert kernels train to the same losses (within fp32 rounding).
"""
import json
import os
import subprocess
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.environ["CTITAN_SOURCE_DIR"], "tests", "ref"))
from checks import check, summary  # noqa: E402
import qwen3_ref  # noqa: E402
import safetensors_ref  # noqa: E402

BIN, TMP, REF = os.environ["CTITAN_BIN"], os.environ["CTITAN_TMP"], os.environ["CTITAN_REF_DIR"]



def skewed_tokens(path, n, vocab, seed):
    """Zipf-distributed ids (a quarter of the tokens are id 0): the router at init already sends
    most tokens to one expert, and training without balancing collapses onto it."""
    rng = np.random.default_rng(seed)
    np.save(path, np.minimum(rng.zipf(1.3, n) - 1, vocab - 1).astype("<i4"))


def train(name, extra, steps=40):
    dump = os.path.join(TMP, name)
    subprocess.run(["rm", "-rf", dump], check=True)
    cmd = [BIN, "train", "--model.flavor", "debugmodel_moe", "--model.vocab_size", "512",
           "--model.n_layers", "2", "--training.dataset_path", os.path.join(TMP, "skewed.npy"),
           "--training.seq_len", "32", "--training.local_batch_size", "4",
           "--training.steps", str(steps), "--training.shuffle", "false", "--optimizer.lr", "1e-3",
           "--lr_scheduler.warmup_steps", "0", "--metrics.log_freq", "1",
           "--metrics.peak_gflops", "100", "--checkpoint.interval", "20",
           "--job.dump_folder", dump] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    check(r.returncode == 0, "%s: ctitan train failed: %s" % (name, (r.stdout + r.stderr)[-3000:]))
    if r.returncode != 0:
        return [], r.stdout
    rows = [json.loads(line) for line in open(os.path.join(dump, "metrics.jsonl"))]
    return [x for x in rows if "loss" in x], r.stdout


def late_imbalance(rows):
    """Mean over the last 15 steps and over layers of max/mean tokens per expert."""
    tail = rows[-15:]
    return sum(sum(x["moe_load_max_over_mean"]) / len(x["moe_load_max_over_mean"])
               for x in tail) / max(len(tail), 1)


os.makedirs(TMP, exist_ok=True)
skewed_tokens(os.path.join(TMP, "skewed.npy"), 40 * 4 * 33 + 10, 512, 7)

none, _ = train("none", ["--model.load_balance", "none"])
free, log = train("aux_free", ["--model.load_balance", "aux_free",
                               "--model.load_balance_coeff", "0.002"])
check(len(none) == 40 and len(free) == 40, "metric rows: %d, %d" % (len(none), len(free)))
if none and free:
    a, b = late_imbalance(none), late_imbalance(free)
    print("expert load max/mean over the last 15 steps: none %.3f, aux_free %.3f" % (a, b))
    check(b < 0.85 * a, "aux_free did not even the load: %.3f vs none %.3f" % (b, a))
    check("load balancing aux_free" in log, "the log names the balancing mode")

# The bias is in the checkpoint (not zero after 40 steps), not in the export.
ck = os.path.join(TMP, "aux_free", "checkpoint", "step-40", "model.safetensors")
if os.path.exists(ck):
    t = safetensors_ref.load_file(ck)
    bias = [k for k in t if k.endswith(".mlp.expert_bias")]
    check(len(bias) == 2, "checkpoint has %d expert_bias tensors" % len(bias))
    check(all(float(t[k].abs().max()) > 0 for k in bias), "the expert bias moved")
else:
    check(False, "no checkpoint %s" % ck)
ex = os.path.join(TMP, "aux_free", "export")
r = subprocess.run([BIN, "export", "--checkpoint", os.path.dirname(ck), "--output", ex],
                   capture_output=True, text=True)
check(r.returncode == 0, "export: %s" % r.stderr)
if r.returncode == 0:
    keys = safetensors_ref.load_folder(ex)
    check(not any(k.endswith("expert_bias") for k in keys), "the export has no expert_bias")
    check(any(".mlp.experts.0.gate_proj.weight" in k for k in keys), "the export has experts")
    cfg = json.load(open(os.path.join(ex, "config.json")))
    check(cfg.get("architectures") == ["Qwen3MoeForCausalLM"], "exported architectures %r"
          % cfg.get("architectures"))

# Resume: stop at 20 (remove the step-40 checkpoint), continue to 40: the same losses bit for bit,
# which needs the bias restored.
if free:
    dump = os.path.join(TMP, "aux_free")
    subprocess.run(["rm", "-rf", os.path.join(dump, "checkpoint", "step-40"),
                    os.path.join(dump, "metrics.jsonl")], check=True)
    r = subprocess.run([BIN, "train", "--config", os.path.join(dump, "config.toml")],
                       capture_output=True, text=True)
    check(r.returncode == 0 and "resumed from" in r.stdout, "resume: %s" % (r.stdout + r.stderr)[-2000:])
    if r.returncode == 0:
        rows = [json.loads(line) for line in open(os.path.join(dump, "metrics.jsonl"))]
        rows = [x for x in rows if "loss" in x]
        same = [x["loss"] == y["loss"] for x, y in zip(rows, free[20:])]
        check(len(rows) == 20 and all(same), "resumed losses differ: %d rows, %d equal"
              % (len(rows), sum(same)))

# hf mode: loss = ce + coef * aux; loop and grouped agree.
hf, _ = train("hf", ["--model.load_balance", "hf", "--model.router_aux_loss_coef", "0.05"], 5)
loop, _ = train("hf_loop", ["--model.load_balance", "hf", "--model.router_aux_loss_coef", "0.05",
                            "--model.moe_impl", "loop"], 5)
for x in hf:
    check(abs(x["loss"] - (x["ce"] + 0.05 * x["aux"])) <= 1e-12 * x["loss"],
          "step %d: loss %r != ce %r + 0.05 * aux %r" % (x["step"], x["loss"], x["ce"], x["aux"]))
worst = max((abs(x["loss"] - y["loss"]) / x["loss"] for x, y in zip(hf, loop)), default=1)
print("grouped vs loop over 5 steps: worst loss rel %.2e" % worst)
check(len(hf) == 5 and len(loop) == 5 and worst <= 1e-5, "grouped vs loop: rel %.2e" % worst)

# The aux gradient against PyTorch. A reference MoE folder (top-2 of 8, renormalised, 2 sparse
# layers) with the aux coefficient raised to 0.1, so that the aux loss moves the routers'
# gradient norms by 1.1e-3 and 5.2e-4 of the global norm, and the global norm by 1.4e-3: ctitan
# must land on the aux-on reference, 500x the tolerance away from the aux-off one.
AUX_COEF = 0.1
PARAM_REL = 1e-6  # each tensor's grad norm, relative to the global norm; measured 8.2e-8
GLOBAL_REL = 1e-6  # the global grad norm, relative; measured 9.5e-8 (verify), 1.0e-8 (train)
src = os.path.join(REF, "moe_e8k2_norm_aux_untied")
hf_dir = os.path.join(TMP, "aux_grad_hf")
subprocess.run(["rm", "-rf", hf_dir], check=True)
subprocess.run(["cp", "-r", os.path.join(src, "hf"), hf_dir], check=True)
cfg = json.load(open(os.path.join(hf_dir, "config.json")))
cfg.update(router_aux_loss_coef=AUX_COEF, output_router_logits=True)
json.dump(cfg, open(os.path.join(hf_dir, "config.json"), "w"), indent=2)
meta = json.load(open(os.path.join(src, "meta.json")))
B, T = meta["B"], meta["T"]
tokens_path = os.path.join(src, "tokens.npy")
inputs, targets = qwen3_ref.windows(np.load(tokens_path).astype(np.int64), B, T)
weights = {k: v.float() for k, v in safetensors_ref.load_folder(hf_dir).items()}


def ref_norms(c):
    r = qwen3_ref.run_full(weights, c, inputs, targets)
    norms = {k: float(g.double().norm()) for k, g in r["grads"].items()}
    return norms, float(np.sqrt(sum(n * n for n in norms.values())))


on, on_global = ref_norms(cfg)
off, off_global = ref_norms(dict(cfg, output_router_logits=False))
routers = [k for k in on if k.endswith(".mlp.gate.weight")]
check(len(routers) == 2, "routers in the reference: %r" % routers)
for k in routers + ["global"]:
    a, b, scale = ((on_global, off_global, on_global) if k == "global" else
                   (on[k], off[k], on_global))
    check(abs(a - b) / scale > 100 * PARAM_REL, "%s: aux on %.9g vs off %.9g: the test would not "
          "see a missing aux gradient" % (k, a, b))

r = subprocess.run([BIN, "verify", "--model.hf_path", hf_dir, "--training.dataset_path",
                    tokens_path, "--training.seq_len", str(T), "--training.local_batch_size",
                    str(B), "--json"], capture_output=True, text=True)
check(r.returncode == 0, "verify: %s" % (r.stdout + r.stderr)[-2000:])
if r.returncode == 0:
    got = json.loads(r.stdout.strip().splitlines()[-1])
    norms = got["grad_norm_by_parameter"]
    check(set(norms) == set(on), "verify names %d tensors, the reference %d"
          % (len(norms), len(on)))
    worst = max(abs(norms.get(k, 0.0) - v) / on_global for k, v in on.items())
    check(worst <= PARAM_REL, "verify: per-tensor grad norms within %.2e of the global norm "
          "(> %g)" % (worst, PARAM_REL))
    for k in routers:
        check(abs(norms[k] - on[k]) / on_global <= PARAM_REL,
              "verify: %s grad norm %.9g, PyTorch aux on %.9g, aux off %.9g"
              % (k, norms[k], on[k], off[k]))
    e = abs(got["grad_norm"] - on_global) / on_global
    check(e <= GLOBAL_REL, "verify: grad_norm %.9g, PyTorch aux on %.9g, aux off %.9g"
          % (got["grad_norm"], on_global, off_global))
    print("aux gradient, verify: tensors within %.2e of the global norm, global %.2e "
          "(aux on vs off: routers %s, global %.2e)"
          % (worst, e, ", ".join("%.2e" % (abs(on[k] - off[k]) / on_global) for k in routers),
             abs(on_global - off_global) / on_global))

# `ctitan train` applies it too: the global grad norm it logs at step 1 (before clipping).
dump = os.path.join(TMP, "aux_grad_train")
subprocess.run(["rm", "-rf", dump], check=True)
r = subprocess.run([BIN, "train", "--model.backend", "hf", "--model.hf_path", hf_dir,
                    "--training.dataset_path", tokens_path, "--training.shuffle", "false",
                    "--training.steps", "1", "--training.seq_len", str(T),
                    "--training.local_batch_size", str(B), "--training.global_batch_size", str(B),
                    "--lr_scheduler.warmup_steps", "0", "--model.load_balance", "hf", "--model.router_aux_loss_coef", str(AUX_COEF),
                    "--metrics.log_freq", "1", "--metrics.peak_gflops", "100",
                    "--checkpoint.enable", "false", "--job.dump_folder", dump],
                   capture_output=True, text=True)
check(r.returncode == 0, "train: %s" % (r.stdout + r.stderr)[-2000:])
if r.returncode == 0:
    rows = [json.loads(line) for line in open(os.path.join(dump, "metrics.jsonl"))]
    row = [x for x in rows if "grad_norm" in x][0]
    e = abs(row["grad_norm"] - on_global) / on_global
    check(e <= GLOBAL_REL, "train: step-1 grad_norm %.9g, PyTorch aux on %.9g, aux off %.9g"
          % (row["grad_norm"], on_global, off_global))
    print("aux gradient, train: step-1 grad_norm within %.2e of PyTorch's" % e)

summary()
