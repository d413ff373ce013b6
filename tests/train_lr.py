#!/usr/bin/env python3
"""The learning rate of every step of `ctitan train` equals torchtitan's build_lr_schedulers +
LambdaLR (tests/ref/train_ref.py, compared exactly), in the cases where it differs from a naive
reading: decay_ratio unset (decay over every step after the warmup), a warmup longer than the run
(torchtitan's default of 200 with a short run), warmup + decay longer than the run, and
warmup_steps = 0. The clamps print torchtitan's warnings; a short run with the defaults trains."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.environ["CTITAN_SOURCE_DIR"], "tests", "ref"))
from checks import check, summary  # noqa: E402
import train_ref  # noqa: E402

BIN, REF, TMP = os.environ["CTITAN_BIN"], os.environ["CTITAN_REF_DIR"], os.environ["CTITAN_TMP"]
CASE = os.path.join(REF, "train", "const_clip_tied_bias")  # any tiny HF folder + tokens will do
STEPS, LR = 10, 2e-3



def expected_lrs(warmup, ratio, kind, min_f):
    w, s, d = train_ref.decay_steps_of(STEPS, warmup, ratio)
    return [LR * train_ref.linear_warmup_stable_decay(k, w, s, d, kind, min_f)
            for k in range(STEPS)]


# (name, extra options, warmup, decay_ratio (None: unset), type, min factor, warnings expected)
CASES = [
    ("defaults_short_run", [], 200, None, "linear", 0.0, ["warmup_steps (200) exceeds"]),
    ("ratio_unset", ["--lr_scheduler.warmup_steps", "3", "--lr_scheduler.decay_type", "cosine",
                     "--lr_scheduler.min_lr_factor", "0.1"], 3, None, "cosine", 0.1, []),
    ("decay_clamped", ["--lr_scheduler.warmup_steps", "6", "--lr_scheduler.decay_ratio", "0.6"],
     6, 0.6, "linear", 0.0, ["decaying over the 4 steps left"]),
    ("warmup_zero", ["--lr_scheduler.warmup_steps", "0", "--lr_scheduler.decay_type", "sqrt"],
     0, None, "sqrt", 0.0, []),
    ("no_decay", ["--lr_scheduler.warmup_steps", "2", "--lr_scheduler.decay_ratio", "0"],
     2, 0.0, "linear", 0.0, []),
]

for name, extra, warmup, ratio, kind, min_f, warnings in CASES:
    dump = os.path.join(TMP, name)
    subprocess.run(["rm", "-rf", dump], check=True)
    cmd = [BIN, "train", "--model.backend", "hf", "--model.hf_path", os.path.join(CASE, "hf"),
           "--training.dataset_path", os.path.join(CASE, "tokens.npy"),
           "--training.steps", str(STEPS), "--training.seq_len", "8",
           "--training.local_batch_size", "2", "--optimizer.lr", repr(LR),
           "--metrics.log_freq", "1", "--metrics.peak_gflops", "100",
           "--checkpoint.enable", "false", "--job.dump_folder", dump] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    out = r.stdout + r.stderr
    check(r.returncode == 0, "%s: ctitan train failed: %s" % (name, out[-2000:]))
    if r.returncode != 0:
        continue
    for w in warnings:
        check(("warning: " in out) and (w in out), "%s: no warning with %r in:\n%s" % (name, w, out))
    if not warnings:
        check("warning: " not in out, "%s: unexpected warning:\n%s" % (name, out))
    rows = [json.loads(line) for line in open(os.path.join(dump, "metrics.jsonl"))]
    got = [row["lr"] for row in rows if "loss" in row]
    want = expected_lrs(warmup, ratio, kind, min_f)
    # Exact: the same double expressions in the same order (tests/test_optim.c checks the factor
    # alone over many more settings).
    check(got == want, "%s: lr per step\n  ctitan %s\n  torch  %s" % (name, got, want))

# The effective config says the ratio is unset, and a resume of it reads back the same schedule.
cfg = open(os.path.join(TMP, "ratio_unset", "config.toml")).read()
check("\n# decay_ratio = unset\n" in cfg, "config.toml does not show decay_ratio unset:\n" + cfg)

summary()
