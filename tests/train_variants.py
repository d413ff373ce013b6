"""Training variants that must not change the numbers, dense and MoE, through `ctitan train`
and its HF export: activation checkpointing (none, full, selective every 2nd layer, selective
"op") gives bit-identical losses and weights (op also with the chunked loss head, sdpa attention
and the loop expert kernel, against the run without at the same settings; every run accumulates
2 micro-batches a step) and plans fewer activation bytes, and so does --debug.profile_ops
(which prints its table); the chunked loss head agrees to fp32 rounding (1e-6 on the losses,
1e-4 on the weights, for MoE too, where a rounding-level change can flip a routing choice);
the attention kernels (sdpa, the reference, and flash, the default) agree within 2e-6 on the
losses and 2e-4 (MoE 3e-4) on the weights. Each bound is near 10x the error measured, written
beside it."""
import json
import os
import re
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "ref"))
import safetensors_ref  # noqa: E402
from checks import check, summary  # noqa: E402

BIN = os.environ["CTITAN_BIN"]
TMP = os.environ["CTITAN_TMP"]
STEPS = 5


def train(name, flavor, extra):
    dump = os.path.join(TMP, name)
    subprocess.run(["rm", "-rf", dump], check=True)
    cmd = [BIN, "train", "--model.flavor", flavor, "--model.vocab_size", "512",
           "--model.n_layers", "3", "--training.dataset_path", os.path.join(TMP, "tokens.npy"),
           "--training.seq_len", "48", "--training.local_batch_size", "2",
           "--training.global_batch_size", "4", "--training.steps", str(STEPS),
           "--training.shuffle", "false", "--lr_scheduler.warmup_steps", "0",
           "--metrics.log_freq", "1", "--metrics.peak_gflops", "100",
           "--checkpoint.enable", "true", "--checkpoint.interval", "1000",
           "--checkpoint.last_save_in_hf", "true", "--job.dump_folder", dump] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    check(r.returncode == 0, "%s: ctitan train failed: %s" % (name, (r.stdout + r.stderr)[-3000:]))
    if r.returncode != 0:
        return None
    rows = [json.loads(line) for line in open(os.path.join(dump, "metrics.jsonl"))]
    weights = safetensors_ref.load_folder(os.path.join(dump, "hf"))
    return {"loss": [x["loss"] for x in rows if "loss" in x], "weights": weights,
            "log": r.stdout}


def close(a, b, what, loss_tol, weight_tol):
    """The worst relative loss difference and the worst weight tensor's relative L2 one."""
    worst = max(abs(x - y) / abs(y) for x, y in zip(a["loss"], b["loss"]))
    check(len(a["loss"]) == len(b["loss"]) and worst <= loss_tol,
          "%s: losses differ by %.3g (tolerance %g)" % (what, worst, loss_tol))
    worst_w = 0.0
    for n in b["weights"]:
        x, y = np.asarray(a["weights"][n], np.float64), np.asarray(b["weights"][n], np.float64)
        rel = np.linalg.norm(x - y) / max(np.linalg.norm(y), 1e-30)
        worst_w = max(worst_w, rel)
        check(rel <= weight_tol, "%s: %s rel L2 %.3g (tolerance %g)" % (what, n, rel, weight_tol))
    return worst, worst_w


def planned_activations(log):
    """The activations of the memory estimate line, in MiB, and the mode it names."""
    m = re.search(r"activations [0-9.]+ GiB \(([0-9.]+) MiB, activation checkpointing ([^)]*)\)",
                  log)
    return (float(m.group(1)), m.group(2)) if m else (None, None)


def same_bits(a, b, what):
    check(a["loss"] == b["loss"], "%s: losses %r vs %r" % (what, a["loss"], b["loss"]))
    differ = [n for n in a["weights"] if not np.array_equal(a["weights"][n], b["weights"][n])]
    check(not differ, "%s: weights differ: %s" % (what, differ[:5]))


os.makedirs(TMP, exist_ok=True)
bad = subprocess.run([BIN, "train", "--model.flavor", "debugmodel", "--training.dataset_path", "x",
                      "--activation_checkpoint.mode", "selective",
                      "--activation_checkpoint.selective_ac_option", "ops"],
                     capture_output=True, text=True)
check(bad.returncode != 0 and 'selective_ac_option = "ops"; expected "op"' in bad.stderr,
      "a bad selective_ac_option is refused: %s" % bad.stderr[-500:])
np.save(os.path.join(TMP, "tokens.npy"),
        np.random.default_rng(5).integers(0, 512, 20000).astype("<i4"))

for flavor in ["debugmodel", "debugmodel_moe"]:
    base = train(flavor + "_none", flavor, [])
    if base is None:
        continue
    OP = ["--activation_checkpoint.mode", "selective",
          "--activation_checkpoint.selective_ac_option", "op"]
    none_acts, none_mode = planned_activations(base["log"])
    check(none_mode == "none", "memory line names the mode: %r" % none_mode)
    for mode in (["full"], ["selective", "--activation_checkpoint.selective_ac_option", "2"],
                 OP[1:]):
        label = " ".join(mode[::2])
        r = train(flavor + "_" + mode[-1], flavor, ["--activation_checkpoint.mode"] + mode)
        if r:
            same_bits(base, r, "%s activation_checkpoint %s" % (flavor, label))
            logged = label if mode[-1] == "op" else mode[0]
            check("activation checkpointing: %s" % logged in r["log"], "logged: " + logged)
            # Selective every 2nd layer of 3 recomputes one layer: its set is no smaller.
            acts, named = planned_activations(r["log"])
            check(named == label and acts is not None and
                  (acts <= none_acts if mode[-1] == "2" else acts < none_acts),
                  "%s: planned activations %r MiB (%r) against none's %r" %
                  (label, acts, named, none_acts))
            print("%s: %s plans %.2f MiB of activations, none %.2f" %
                  (flavor, label, acts, none_acts))
    r = train(flavor + "_chunked", flavor, ["--training.loss_chunk_tokens", "17"])
    if r:
        # MoE: a rounding-level change can flip a top-k choice, so its weights drift further.
        # Measured (torchtitan's init): losses 1.2e-7 (dense: one or two ulps of a loss near
        # 12.7), 6.1e-9 (MoE); weights 1.3e-5, 2.9e-6.
        worst, worst_w = close(r, base, flavor + " loss_chunk_tokens 17", 1e-6, 1e-4)
        print("%s: chunked loss head, losses within %.3g, weights %.3g" % (flavor, worst, worst_w))
        check("loss head: in chunks of 17 tokens" in r["log"], "chunking logged")
        r_op = train(flavor + "_chunked_op", flavor, ["--training.loss_chunk_tokens", "17"] + OP)
        if r_op:
            same_bits(r, r_op, flavor + " op checkpointing with loss_chunk_tokens 17")
    check("idle OpenMP threads: passive" in base["log"], "ctitan sets OMP_WAIT_POLICY=passive")
    # scripts/install-deps installs OpenBLAS's OpenMP build, and CMake links it ahead of the
    # system's default (pthread) one
    check("OpenBLAS on OpenMP's threads" in base["log"], "OpenBLAS's OpenMP build runs the GEMMs")
    # auto is flash; sdpa is the reference kernel (materialised probabilities).
    check("kernels: attention flash" in base["log"], "auto picks flash")
    r = train(flavor + "_sdpa", flavor, ["--model.attn_backend", "sdpa"])
    if r:
        # Measured (torchtitan's init): losses 2.3e-7 (dense), 3.9e-9 (MoE); weights 1.6e-5,
        # 4.5e-6 (5 AdamW steps magnify rounding in the weights that have small gradients).
        worst, worst_w = close(r, base, flavor + " sdpa vs flash", 2e-6,
                               3e-4 if "moe" in flavor else 2e-4)
        print("%s: sdpa vs flash, losses within %.3g, weights %.3g" % (flavor, worst, worst_w))
        check("kernels: attention sdpa" in r["log"], "sdpa logged")
        r_op = train(flavor + "_sdpa_op", flavor, ["--model.attn_backend", "sdpa"] + OP)
        if r_op:
            same_bits(r, r_op, flavor + " op checkpointing with sdpa")
    if flavor == "debugmodel_moe":
        r = train(flavor + "_loop", flavor, ["--model.moe_impl", "loop"])
        r_op = train(flavor + "_loop_op", flavor, ["--model.moe_impl", "loop"] + OP)
        if r and r_op:
            same_bits(r, r_op, flavor + " op checkpointing with the loop expert kernel")
            check("experts loop" in r_op["log"], "loop kernel logged")
    r = train(flavor + "_profile", flavor, ["--debug.profile_ops"])
    if r:
        same_bits(base, r, "%s --debug.profile_ops" % flavor)
        check("op profile: mean over %d step(s)" % (STEPS - 1) in r["log"] and
              re.search(r"matmul +forward", r["log"]) and "other" in r["log"],
              "the profile table: %s" % r["log"][-2000:])
        if flavor == "debugmodel_moe":
            check(re.search(r"moe_experts +backward", r["log"]), "MoE ops profiled")

summary()
