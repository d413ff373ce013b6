#!/usr/bin/env python3
"""MoE training end to end through `ctitan train` on a small debugmodel_moe cut:

- load_balance = aux_free makes expert load measurably more even than none, on skewed (Zipf)
  data: measured, max/mean tokens per expert over the last 15 of 40 steps is ~3.9 of a possible
  4.0 without balancing and ~2.7 with the bias (coeff 0.01);
- the expert bias it learns is saved in checkpoints (a resume continues bit for bit) and left out
  of the HF export;
- load_balance = hf adds exactly router_aux_loss_coef * aux to the cross-entropy;
- the grouped and loop expert kernels train to the same losses (within fp32 rounding).
"""
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.environ["CTITAN_SOURCE_DIR"], "tests", "ref"))
import safetensors_ref  # noqa: E402

BIN, TMP = os.environ["CTITAN_BIN"], os.environ["CTITAN_TMP"]
passed = failed = 0


def check(ok, msg):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print("FAIL:", msg, file=sys.stderr)


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
           "--training.steps", str(steps), "--training.shuffle", "false", "--optimizer.lr", "1e-4",
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
                               "--model.load_balance_coeff", "0.01"])
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

print("%d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
