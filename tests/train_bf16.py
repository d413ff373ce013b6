#!/usr/bin/env python3
"""bf16 mixed-precision training (issue 18) against PyTorch's CPU autocast: each case of
tests/ref/bf16_ref.py (DIR/bf16/) runs through `ctitan train ... --training.mixed_precision_param
bfloat16` (and the MoE case with both expert kernels) and float32, with the issue's bounds or
tighter ones (GLOBAL_BOUNDS below, and MOE_BOUNDS for the MoE case: about 10x what was
measured):

- the first step's loss within 1e-3 relative of torch's autocast run (the issue: 1e-2), its
  pre-clip gradient norm within 1e-2 relative (the issue: 5e-2);
- the 20-step curve: mean |loss_ctitan_bf16 - loss_torch_bf16| <= 2e-2, and against ctitan's own
  float32 run on the same data, mean |loss_bf16 - loss_fp32| <= 2e-2;
- the same config run twice gives bit-identical bf16 losses (metrics.jsonl);
- stop and resume: the straight run saves at steps 10 and 20; a copy of its folder without the
  step-20 checkpoint resumes at step 10 and must log the straight run's losses for steps 11-20
  bit for bit (the bf16 copies of the weights must come back from the fp32 masters);
- SIGTERM, then resume (the first case, made SIGNAL_STEPS long so that the signal lands mid-run):
  the run stops after the step it is in with a checkpoint (exit 143), the resumed run continues
  from there, and every step's loss equals a straight run's bit for bit;
- `ctitan verify --training.mixed_precision_param bfloat16` on the case's hf/ over step 1's
  windows (B * accum, one batch) prints a loss within 3e-3 relative of torch's first-step loss
  (MoE: the aux loss then covers the whole batch, not each micro-batch), a gradient norm within
  1e-2, and says it computed in bf16 (its "source dtype:" line says
  "computed in" bf16/bfloat16, or --json has "mixed_precision_param": "bfloat16");
- plugins (the ABI is fp32): a matmul plugin keeps a bf16 run entirely fp32 (bit for bit the
  float32 run); an expert plugin keeps only the experts fp32, which the precision: line says.
Also, as a check of this test's own command lines: ctitan's float32 run against torch's fp32 run
of the same case (meta "fp32_loss"), mean |diff| <= 3e-6 (measured 2.4e-7).

The scale (bf16_ref.py, printed by make_ref.py): torch's own autocast run against its fp32 run,
    case                        first loss rel  first grad-norm rel  mean |loss|  max |loss|
    dense_odd_gqa3_untied_f32   3.8e-5          9.6e-4               8.1e-4       1.9e-3
    dense_tied_bias_bf16        1.8e-4          4.6e-4               1.0e-3       2.3e-3
    moe_hf_aux_norm_f32         5.6e-5          1.0e-3               2.5e-3       1.3e-2
so the issue's bounds are 10-50x what bf16 itself costs. The test prints the measured values
beside the bounds.

What torch 1.13's CPU autocast (bf16) computes for this model (qwen3_ref.py = HF's Qwen3 /
Qwen3-MoE eager code; found with a TorchDispatchMode printing every aten op's dtypes, and the
rounding by comparing against emulations). "bf16 GEMM" = both operands rounded to bf16 (weights
from the fp32 masters, activations from whatever dtype they are in), products summed in fp32,
the result rounded once to bf16 (checked: mm equals the exact product rounded; a linear's bias
is rounded to bf16 and added to the fp32 sum before that one rounding).

  op                                  computes in / output
  embedding                           fp32 table lookup -> fp32 (the residual stream is fp32)
  RoPE cos/sin tables                 fp32 (HF turns autocast off there)
  RMSNorm (input, post-attn, final)   fp32 in -> statistics fp32 -> w * h, fp32 out
  q|k|v, o, gate|up, down, lm_head,   bf16 GEMM -> bf16 out (bias: as above)
   router gate, expert GEMMs
  q_norm / k_norm                     bf16 in -> upcast, statistics fp32 -> h rounded to bf16
                                      (HF's .to(input_dtype)) -> w(fp32) * h(bf16) promotes:
                                      fp32 out
  RoPE rotation                       fp32 (q, k fp32 after their norms; cos/sin fp32)
  GQA repeat_kv                       k in fp32 (before the cast), v in bf16
  scores q @ k^T                      bf16 GEMM (q, k rounded to bf16) -> bf16
  * head_dim**-0.5                    bf16 * scalar: the scalar is rounded to bf16 first
                                      (D=12: 0.2890625, not 0.288675), the product rounded
  causal mask add                     bf16 (finfo(bf16).min); = HF's fp32 mask in effect
  softmax                             scores upcast, softmax in fp32 (dtype=float32); the
                                      probabilities stay fp32 (.to(q.dtype), q is fp32)
  probs @ v                           bf16 GEMM (probabilities rounded to bf16) -> bf16
  residual adds                       fp32 + bf16 -> fp32
  SiLU                                bf16 in/out, each step rounded to bf16:
                                      bf(x / bf(1 + bf(exp(-x))))
  silu(g) * u                         bf16 * bf16 -> bf16 (fp32 product rounded)
  router softmax, top-k, renorm       logits bf16 -> upcast -> softmax/top-k/renorm fp32;
                                      weights fp32 (hidden dtype); bf16 logits make exact ties
                                      common (meta "router_ties"): torch.topk's tie order
  expert out * routing weight         bf16 * fp32 -> fp32; index_add_ into the fp32 output
  aux loss (HF load_balancing)        softmax of the bf16 router logits IN bf16 (no dtype
                                      argument), top-k on those bf16 probabilities, expert
                                      mask .float() -> tokens_per_expert fp32, mean of the bf16
                                      probabilities in bf16, product/sum fp32, * E
  cross-entropy                       logits bf16 -> .float() -> log_softmax/NLL fp32
Backward: each op's gradient comes out in its forward output's dtype. GEMM backward (dX, dW)
are bf16 GEMMs with bf16 outputs; dW is then upcast and accumulated into the fp32 .grad (so
each micro-batch's weight gradient is bf16-rounded; a bias gradient is a bf16 sum); a cast's
backward casts the gradient back (bf16 -> fp32 where the forward upcast, fp32 -> bf16 where it
rounded). RMSNorm backward in fp32 (q/k_norm: its input gradient rounded to bf16, w's gradient
from the bf16 h); attention softmax backward fp32, its result rounded to bf16 before the scale
(bf16) and the two bf16 GEMMs; v's GQA head sum in bf16, k's in fp32; SiLU backward in bf16:
s = bf(1/bf(1 + bf(exp(-x)))), dx = bf(bf(dy * s) * bf(1 + bf(x * bf(1 - s)))). Embedding,
clipping, AdamW: fp32.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys

sys.path.insert(0, os.path.join(os.environ["CTITAN_SOURCE_DIR"], "tests", "ref"))
from checks import check, summary  # noqa: E402
from ctitan_cli import train_cmd  # noqa: E402

BIN, REF, TMP = os.environ["CTITAN_BIN"], os.environ["CTITAN_REF_DIR"], os.environ["CTITAN_TMP"]

# The contract is 1e-2 (first loss), 5e-2 (first gradient norm) and 2e-2 (the curves);
# the bounds here are tighter, about 10x what was measured (the worst case beside each), so that a
# regression well inside the contract still shows.
GLOBAL_BOUNDS = dict(
    first_loss_rel=1e-3,  # measured 1.1e-4
    first_grad_norm_rel=1e-2,  # measured 1.1e-3
    curve_mean_abs=2e-2,  # measured 4.2e-3 against torch's autocast run, 3.3e-3 against fp32
    verify_loss_rel=3e-3,  # measured 3.9e-4 (MoE: verify's aux is over the whole batch)
)
# The MoE case since its experts run in bf16 too. Measured on main before (fp32 experts, after
# main's bf16 activations, loss head and attention): first loss 8.1e-5, grad norm 7.8e-4 (verify
# 5.4e-4), curve 2.2e-3 and 1.6e-3 against fp32, verify loss 5.2e-4. With bf16 experts (whose
# forward is autocast's MoE block bit for bit given the same input) step 1 routes as torch and its
# cross-entropy lands nearer (1.07e-3 -> 0.92e-3 absolute) but the total with the aux term further;
# later steps are set by single routing flips (~3e-3 each), so the curve stays at the 2e-2.
MOE_BOUNDS = dict(
    cases=["moe_hf_aux_norm_f32"],
    first_loss_rel=1.5e-3,  # measured 1.4e-4 (both kernels and emulated)
    first_grad_norm_rel=1e-2,  # measured 6.4e-4 (verify 1.2e-3)
    curve_mean_abs=2e-2,  # measured 4.2e-3 (emulated 4.4e-3) against autocast, 2.7e-3 against fp32
    verify_loss_rel=5e-3,  # measured 5.8e-4 (verify's aux is over the whole batch)
)
FP32_MEAN_ABS = 3e-6  # measured 2.4e-7: ctitan float32 against torch fp32, this test's plumbing
STOP = 10  # the checkpoint the resumed run starts from

BF16 = "bfloat16"
AC_RUNS = {"full": {"activation_checkpoint.mode": "full"},
           "op": {"activation_checkpoint.mode": "selective",
                  "activation_checkpoint.selective_ac_option": "op"}}


def metric_rows(dump):
    """{step: row} from metrics.jsonl (the last row of a step, should one be logged twice)."""
    rows = {}
    for line in open(os.path.join(dump, "metrics.jsonl")):
        r = json.loads(line)
        if "loss" in r:
            rows[r["step"]] = r
    return rows


def train(d, m, dump, precision, impl="grouped", log=None, env=None, **extra):
    """Runs the case into a fresh dump; returns its metric rows by step, or None after
    recording the failure. log: a list that gets the run's output; env: variables to add."""
    shutil.rmtree(dump, ignore_errors=True)
    cmd = train_cmd(BIN, d, m, dump, impl, **{
        "training.mixed_precision_param": precision, "checkpoint.interval": STOP,
        "checkpoint.keep_latest_k": 0, **extra})
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if log is not None:
        log.append(r.stdout + r.stderr)
    check(r.returncode == 0, "%s: ctitan train (%s) failed (rc %d): %s\n  command: %s" % (
        os.path.basename(dump), precision, r.returncode, (r.stdout + r.stderr)[-1500:],
        " ".join(cmd)))
    if r.returncode:
        return None
    rows = metric_rows(dump)
    check(sorted(rows) == list(range(1, m["steps"] + 1)),
          "%s: metric rows for steps %s" % (dump, sorted(rows)))
    return rows


def mean_abs(a, b):
    return sum(abs(x - y) for x, y in zip(a, b)) / len(a)


def bound(label, what, got, limit):
    """Checks got <= limit and prints both."""
    ok = got <= limit
    print("%-40s %-34s %.2e (bound %.0e)%s" % (label, what, got, limit, "" if ok else "  FAIL"))
    check(ok, "%s: %s %.3e > %.0e" % (label, what, got, limit))


def bounds_of(name):
    """The case's bounds: the MoE case's own (MOE_BOUNDS) or the global ones."""
    return MOE_BOUNDS if name in MOE_BOUNDS["cases"] else GLOBAL_BOUNDS


def compare_to_ref(label, rows, m, b):
    ref = m["log"]
    got = [rows[k + 1]["loss"] for k in range(m["steps"])]
    bound(label, "first-step loss rel vs torch bf16",
          abs(got[0] - ref[0]["loss"]) / ref[0]["loss"], b["first_loss_rel"])
    bound(label, "first-step grad_norm rel vs torch",
          abs(rows[1]["grad_norm"] - ref[0]["grad_norm"]) / ref[0]["grad_norm"],
          b["first_grad_norm_rel"])
    bound(label, "mean |loss - torch bf16|", mean_abs(got, [e["loss"] for e in ref]),
          b["curve_mean_abs"])
    return got


def resume(label, d, m, straight_dump, straight):
    """A copy of the straight run's folder without its last checkpoint resumes at STOP."""
    dump = straight_dump + "_resume"
    shutil.rmtree(dump, ignore_errors=True)
    shutil.copytree(straight_dump, dump)
    shutil.rmtree(os.path.join(dump, "checkpoint", "step-%d" % m["steps"]))
    cmd = train_cmd(BIN, d, m, dump, "grouped", **{
        "training.mixed_precision_param": BF16, "checkpoint.interval": STOP,
        "checkpoint.keep_latest_k": 0})
    r = subprocess.run(cmd, capture_output=True, text=True)
    check(r.returncode == 0, "%s: resume failed: %s" % (label, (r.stdout + r.stderr)[-1500:]))
    if r.returncode:
        return
    check(re.search(r"^resumed from .* at step %d\b" % STOP, r.stdout + r.stderr, re.M),
          "%s: no 'resumed from ... at step %d' line" % (label, STOP))
    rows = metric_rows(dump)
    check(sorted(rows) == list(range(1, m["steps"] + 1)),
          "%s: metric rows after the resume for steps %s" % (label, sorted(rows)))
    same = all(rows.get(k, {}).get("loss") == straight[k]["loss"] for k in straight)
    print("%-40s resumed at step %d: losses %s" % (label, STOP, "bit-identical" if same else
                                                     "DIFFER"))
    check(same, "%s: resumed losses %s != straight %s" % (
        label, [rows.get(k, {}).get("loss") for k in sorted(straight)],
        [straight[k]["loss"] for k in sorted(straight)]))


SIGNAL_STEPS = 2000  # a few ms a step: long enough for the signal to land mid-run


def sigterm_resume(name, d, m):
    long = dict(m, steps=SIGNAL_STEPS)
    keys = {"checkpoint.interval": 50, "checkpoint.keep_latest_k": 2}
    straight = train(d, long, os.path.join(TMP, name + "_long"), BF16, **keys)
    dump = os.path.join(TMP, name + "_sigterm")
    shutil.rmtree(dump, ignore_errors=True)
    cmd = train_cmd(BIN, d, long, dump, "grouped", **{
        "training.mixed_precision_param": BF16, **keys})
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in p.stdout:
        lines.append(line)
        if line.startswith("checkpoint: saved step"):
            p.send_signal(signal.SIGTERM)
            break
    lines += p.stdout.read().splitlines(True)
    rc = p.wait()
    out = "".join(lines)
    stop = re.search(r"^stopped by signal 15 at step (\d+)", out, re.M)
    check(rc == 128 + 15 and stop and int(stop.group(1)) < SIGNAL_STEPS,
          "%s: SIGTERM: exit %d, %s" % (name, rc, out[-600:]))
    if not stop or not straight:
        return
    r = subprocess.run(cmd, capture_output=True, text=True)
    resumed = re.search(r"^resumed from .* at step (\d+)", r.stdout + r.stderr, re.M)
    check(r.returncode == 0 and resumed and resumed.group(1) == stop.group(1),
          "%s: the resume after SIGTERM at step %s: %s" % (name, stop.group(1),
                                                          (r.stdout + r.stderr)[-600:]))
    rows = metric_rows(dump)
    same = all(rows.get(k, {}).get("loss") == straight[k]["loss"] for k in straight)
    print("%-40s SIGTERM at step %s, resumed: %d losses %s" % (
        name, stop.group(1), len(straight), "bit-identical" if same else "DIFFER"))
    check(same, "%s: losses after SIGTERM and resume differ from the straight run" % name)


def verify(label, d, m, b):
    cmd = [BIN, "verify", "--model.hf_path", os.path.join(d, "hf"), "--training.dataset_path",
           os.path.join(d, "tokens.npy"), "--training.seq_len", str(m["T"]),
           "--training.local_batch_size", str(m["B"] * m["accum"]),
           "--training.mixed_precision_param", BF16, "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    check(r.returncode == 0, "%s: verify failed (rc %d): %s\n  command: %s" % (
        label, r.returncode, (r.stdout + r.stderr)[-1000:], " ".join(cmd)))
    if r.returncode:
        return
    out = json.loads(r.stdout.strip().splitlines()[-1])
    line = [s for s in r.stderr.splitlines() if s.startswith("source dtype")]
    said = bool(line) and re.search(r"computed in[^;]*\b(bf16|bfloat16)\b", line[0], re.I)
    check(said or out.get("mixed_precision_param") == BF16,
          "%s: verify does not say it computed in bf16: %s" % (label, line))
    ref = m["log"][0]
    bound(label, "verify loss rel vs torch bf16", abs(out["loss"] - ref["loss"]) / ref["loss"],
          b["verify_loss_rel"])
    bound(label, "verify grad_norm rel vs torch",
          abs(out["grad_norm"] - ref["grad_norm"]) / ref["grad_norm"], b["first_grad_norm_rel"])


def with_plugin(name, d, m, stem, suffix):
    """A bfloat16 run of the case with the test plugin lib<stem>.so: (its metric rows or None,
    its precision: line or "")."""
    plugin = os.path.join(os.environ["CTITAN_BUILD_DIR"], "tests", "plugins",
                          "lib%s.so" % stem)
    out = []
    rows = train(d, m, os.path.join(TMP, name + suffix), BF16, log=out,
                 **{"override.imports": plugin})
    said = [s for s in out[0].splitlines() if s.startswith("precision")] if out else []
    return rows, said[0] if said else ""


def matmul_plugin(name, d, m, fp):
    """The plugin ABI is fp32: with a plugin's matmul, a bfloat16 run keeps its linear layers in
    fp32 around it and says so. The test plugin's forward is the built-in's sgemm call, so the
    run's losses are ctitan's float32 run's, bit for bit."""
    rows, said = with_plugin(name, d, m, "matmul_forward_blas", "_plugin")
    if not rows:
        return
    check("float32: the matmul plugin's kernel is fp32" in said,
          "%s: a bf16 run with a matmul plugin does not say it keeps fp32: %s" % (name, said))
    same = [rows[k]["loss"] for k in sorted(rows)] == [fp[k]["loss"] for k in sorted(fp)]
    print("%-40s bf16 with a matmul plugin: fp32 losses %s" % (
        name, "bit for bit" if same else "DIFFER"))
    check(same, "%s: a bf16 run with a matmul plugin is not the float32 run" % name)


def experts_plugin(name, d, m):
    """The plugin ABI is fp32: with a plugin's experts (tests/plugins/moe_experts_naive.c), a
    bfloat16 run keeps them in fp32 (the plugin's kernel runs, as its call counters show) while
    the linear layers run in bf16, and says so. Its curve is held to the global bounds: fp32
    experts land where the bf16 runs did before the experts went bf16."""
    rows, said = with_plugin(name, d, m, "moe_experts_naive", "_experts_plugin")
    if not rows:
        return
    check(said.startswith("precision: bf16 mixed precision: linear layers") and
          "MoE experts," not in said and
          "the MoE experts in fp32: the plugin's kernel is fp32" in said,
          "%s: a bf16 run with an expert plugin does not say it keeps them fp32: %s" % (
              name, said))
    calls = rows[m["steps"]].get("override_calls", {}).get("moe_experts", {})
    check(calls.get("forward_calls", 0) > 0 and calls.get("backward_calls", 0) > 0,
          "%s: the expert plugin's kernels did not run: %s" % (name, calls))
    compare_to_ref(name + "/experts_plugin", rows, m, GLOBAL_BOUNDS)


def run_case(name):
    d = os.path.join(REF, "bf16", name)
    m = json.load(open(os.path.join(d, "meta.json")))
    e = m["bf16_vs_fp32"]
    print("%-40s torch bf16 vs fp32: first loss %.1e, grad_norm %.1e rel; mean |loss| %.1e" % (
        name, e["first_loss_rel"], e["first_grad_norm_rel"], e["loss_mean_abs"]))
    dump = os.path.join(TMP, name)
    fp = train(d, m, dump + "_fp32", "float32")
    if fp:
        bound(name, "fp32: mean |loss - torch fp32|", mean_abs(
            [fp[k + 1]["loss"] for k in range(m["steps"])], [x["fp32_loss"] for x in m["log"]]),
            FP32_MEAN_ABS)
    b = bounds_of(name)
    bf = train(d, m, dump, BF16)
    if bf:
        got = compare_to_ref(name, bf, m, b)
        if fp:
            bound(name, "mean |loss bf16 - ctitan fp32|",
                  mean_abs(got, [fp[k + 1]["loss"] for k in range(m["steps"])]),
                  b["curve_mean_abs"])
        again = train(d, m, dump + "_again", BF16)
        if again:
            same = [again[k]["loss"] for k in sorted(again)] == got
            print("%-40s rerun: losses %s" % (name, "bit-identical" if same else "DIFFER"))
            check(same, "%s: rerun losses differ" % name)
        resume(name, d, m, dump, {k: bf[k] for k in bf if k > STOP})
        # Checkpointing recomputes from the bf16-saved activations (rounding again what was
        # rounded, widening what was saved): no bit may change.
        for mode, keys in AC_RUNS.items():
            ac = train(d, m, dump + "_ac_" + mode, BF16, **keys)
            if ac:
                same = [ac[k]["loss"] for k in sorted(ac)] == got
                print("%-40s activation checkpointing %s: losses %s" % (
                    name, mode, "bit-identical" if same else "DIFFER"))
                check(same, "%s: losses with activation checkpointing %s differ" % (name, mode))
    if fp and "load_balance" not in m and m.get("weights_dtype") == "F32":
        matmul_plugin(name, d, m, fp)
    # A CPU without oneDNN's bf16 matmul (no AVX-512) runs the same products emulated on sgemm;
    # CTITAN_BF16_GEMM=emulated takes that path here. It rounds differently only by summation
    # order, so it meets the same bounds against torch.
    out = []
    emulated = train(d, m, dump + "_emulated", BF16, log=out, env={"CTITAN_BF16_GEMM": "emulated"})
    if emulated:
        check("bf16 matmuls are emulated on OpenBLAS sgemm" in out[0],
              "%s: an emulated bf16 run does not say so" % name)
        compare_to_ref(name + "/emulated", emulated, m, b)
    if "load_balance" in m:  # the other expert kernel against the reference too
        loop = train(d, m, dump + "_loop", BF16, "loop")
        if loop:
            compare_to_ref(name + "/loop", loop, m, b)
        experts_plugin(name, d, m)
    verify(name, d, m, b)


index = json.load(open(os.path.join(REF, "bf16", "index.json")))
check(len(index["cases"]) >= 3 and index["moe_cases"], "bf16 reference cases: %s" % index)
for case in index["cases"]:
    run_case(case)
case = index["cases"][0]
sigterm_resume(case, os.path.join(REF, "bf16", case), json.load(
    open(os.path.join(REF, "bf16", case, "meta.json"))))
summary()
