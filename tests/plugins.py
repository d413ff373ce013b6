"""User kernels end to end: the example plugins pass `ctitan check-kernels`, train 5 steps with
the same losses as the built-in ops (bit for bit for rope_hf), and prove with their own call
counters that they ran; the wrong kernel is refused; every loading error is one clear line."""
import json
import os
import re
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "ref"))
from checks import check, summary  # noqa: E402

BIN = os.environ["CTITAN_BIN"]
BUILD = os.environ["CTITAN_BUILD_DIR"]
TMP = os.environ["CTITAN_TMP"]
EXAMPLES = os.path.join(BUILD, "examples", "kernels")
TEST_PLUGINS = os.path.join(BUILD, "tests", "plugins")
STEPS, LAYERS = 5, 2

def example(name):
    return os.path.join(EXAMPLES, "lib%s.so" % name)


def test_plugin(name):
    return os.path.join(TEST_PLUGINS, "lib%s.so" % name)


def run(args):
    r = subprocess.run([BIN] + args, capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr


def model_args(dump, checkpoints=False):
    return ["--model.flavor", "debugmodel", "--model.vocab_size", "512",
            "--model.n_layers", str(LAYERS), "--training.dataset_path",
            os.path.join(TMP, "tokens.npy"), "--training.seq_len", "32",
            "--training.local_batch_size", "4", "--training.steps", str(STEPS),
            "--training.shuffle", "false", "--lr_scheduler.warmup_steps", "0",
            "--metrics.log_freq", "1", "--metrics.peak_gflops", "100",
            "--checkpoint.enable", str(checkpoints).lower(), "--job.dump_folder", os.path.join(TMP, dump)]


def train(dump, extra, checkpoints=False):
    subprocess.run(["rm", "-rf", os.path.join(TMP, dump)], check=True)
    code, out, err = run(["train"] + model_args(dump, checkpoints) + extra)
    rows = []
    path = os.path.join(TMP, dump, "metrics.jsonl")
    if code == 0 and os.path.exists(path):
        rows = [json.loads(line) for line in open(path)]
    return code, out, err, [r for r in rows if "loss" in r]


def check_kernels(lib, extra=()):
    code, out, err = run(["check-kernels", "--override.imports", lib, "--json",
                          "--model.vocab_size", "512", "--training.seq_len", "64"] + list(extra))
    try:
        doc = json.loads(out)
    except ValueError:
        doc = None
    return code, doc, err


def error_line(err):
    lines = [l for l in err.splitlines() if l.startswith("ctitan: error:")]
    return lines[0] if len(lines) == 1 else "<%d error lines: %r>" % (len(lines), err[-2000:])


os.makedirs(TMP, exist_ok=True)
rng = np.random.default_rng(3)
np.save(os.path.join(TMP, "tokens.npy"), rng.integers(0, 512, 40000).astype("<i4"))

# --- check-kernels on each example
code, doc, err = check_kernels(example("rope_hf_avx2"))
check(code == 0 and doc and doc["check"]["passed"], "rope_hf_avx2 check failed: %s" % err)
if doc:
    rows = doc["check"]["rows"]
    check(rows and all(r["op"] == "rope_hf" for r in rows), "rope rows: %r" % rows)
    check(rows and all(r["max_abs"] == 0.0 for r in rows),
          "rope_hf_avx2 must match the built-in exactly: %r" % [r["max_abs"] for r in rows])
    check({r["direction"] for r in rows} == {"forward", "backward"}, "both directions checked")
    check({r["case"] for r in rows} == {"model", "awkward"}, "both cases checked")
    check(doc["overrides"][0]["library"].endswith("librope_hf_avx2.so"), "library named")
    print("rope_hf_avx2: %d rows, max abs %s" % (len(rows), max(r["max_abs"] for r in rows)))

code, doc, err = check_kernels(example("rmsnorm_fused"))
check(code == 0 and doc and doc["check"]["passed"], "rmsnorm_fused check failed: %s" % err)
if doc:
    rows = doc["check"]["rows"]
    tensors = {(r["direction"], r["tensor"]) for r in rows}
    check({("forward", "out"), ("forward", "rstd"), ("backward", "dinp"),
           ("backward", "dweight")} <= tensors, "rmsnorm tensors: %r" % tensors)
    print("rmsnorm_fused: max rel %.3g" % max(r["max_rel"] for r in rows))

# The table for people, with the speed column.
code, out, err = run(["check-kernels", "--override.imports", example("rope_hf_avx2"),
                      "--model.vocab_size", "512"])
# Every rope_hf row passes, and the model-shape rows carry a speed against the built-in, "2.82x".
table = [f for f in map(str.split, out.splitlines())
         if f[:1] == ["rope_hf"] and f[1:2] in (["forward"], ["backward"])]
check(code == 0 and len(table) == 4 and all(len(f) == 9 and f[7] == "pass" for f in table)
      and all(re.fullmatch(r"[0-9]+\.[0-9]+x", f[8]) for f in table if f[3] == "model"),
      "table: %s%s" % (out, err))

# The wrong kernel is refused by the check, naming the op and the difference.
code, doc, err = check_kernels(example("rope_interleaved_wrong"))
line = error_line(err)
check(code == 1 and doc and not doc["check"]["passed"], "wrong kernel passed: %s" % err)
check("rope_hf" in line and "max abs" in line and "tolerance" in line, "refusal: %s" % line)

# check-kernels takes every train key and reads no data (no training.dataset_path): every key of
# the table at its default (the parallel degrees among them) and torchtitan's inert keys, the
# plugin named last.
every = []
for line in run(["train", "--help"])[1].splitlines():
    m = re.match(r"\s+--(\S+?)=\S+\s.*\(default: (.*)\)$", line)
    if m and m.group(1) not in ("override.imports", "training.dataset_path", "model.vocab_size",
                                "training.seq_len") \
            and m.group(2) not in ("unset", '""'):
        every += ["--" + m.group(1), m.group(2).strip('"')]
for key in ("profiling.enable_profiling", "metrics.enable_tensorboard", "training.enable_cpu_offload",
            "compile.enable", "checkpoint.enable_first_step_checkpoint"):
    every += ["--" + key, "false"]
check(len(every) > 150, "the keys from train --help: %d words" % len(every))
code, doc, err = check_kernels(example("rope_hf_avx2"), every)
check(code == 0 and doc and doc["check"]["passed"], "check-kernels with every key: %s" % err[-2000:])
# Any number of arguments (once, the words past 255 were dropped): 150 times the same key gives 149
# problems, all counted.
code, out, err = run(["check-kernels"] + ["--job.description", "x"] * 150 +
                     ["--override.imports", example("rope_hf_avx2")])
shown = len(re.findall(r"^ctitan: error: command line --job.description: given twice$", err, re.M))
more = re.search(r"\(and ([0-9]+) more problems\)", err)
check(code == 1 and more and shown + int(more.group(1)) == 149,
      "300 arguments: %d shown, %s" % (shown, err[-300:]))

# --- training with each override against the built-in ops
code, out, err, base = train("base", [])
check(code == 0 and len(base) == STEPS, "baseline training failed: %s" % err[-2000:])
base_loss = [r["loss"] for r in base]

code, out, err, rows = train("rope", ["--override.imports", example("rope_hf_avx2")])
check(code == 0 and len(rows) == STEPS, "training with rope_hf_avx2 failed: %s" % err[-2000:])
if rows:
    check([r["loss"] for r in rows] == base_loss,
          "rope_hf_avx2 losses differ: %r vs %r" % ([r["loss"] for r in rows], base_loss))
    calls = rows[-1].get("override_calls", {}).get("rope_hf", {})
    # Per micro-batch and layer the model rotates q and k once each way.
    want = STEPS * LAYERS * 2
    check(calls.get("forward_calls") == want and calls.get("backward_calls") == want,
          "rope_hf call counters %r, expected %d each" % (calls, want))
    check("override: rope_hf forward+backward from" in out, "the log names the override")
    check("override calls: rope_hf forward %d backward %d" % (want, want) in out,
          "the log shows the plugin's counters: %s" % out[-1500:])

code, out, err, rows = train("rmsnorm", ["--override.imports", example("rmsnorm_fused")])
check(code == 0 and len(rows) == STEPS, "training with rmsnorm_fused failed: %s" % err[-2000:])
if rows:
    worst = max(abs(r["loss"] - b) / abs(b) for r, b in zip(rows, base_loss))
    print("rmsnorm_fused: 5-step loss max rel diff %.3g" % worst)
    # Measured 2.4e-8 (x86-64, AVX2/AVX-512); the bound is about 10 times that.
    check(worst <= 2.5e-7, "rmsnorm_fused losses differ by %.3g (tolerance 2.5e-7)" % worst)
    calls = rows[-1]["override_calls"]["rmsnorm"]
    want = STEPS * (LAYERS * 4 + 1)  # input, q, k and post norms per layer, and the final norm
    check(calls["forward_calls"] == want and calls["backward_calls"] == want,
          "rmsnorm counters %r, expected %d" % (calls, want))

# Two plugins together, one of them forward-only (the built-in backward runs).
both = example("rope_hf_avx2") + "," + test_plugin("swiglu_forward_only")
code, out, err, rows = train("two", ["--override.imports", both])
check(code == 0 and len(rows) == STEPS, "two plugins: %s" % err[-2000:])
if rows:
    check([r["loss"] for r in rows] == base_loss, "rope + forward-only swiglu changed the losses")
    calls = rows[-1]["override_calls"]["swiglu"]
    check(calls["forward_calls"] == STEPS * LAYERS and calls["backward_calls"] is None
          and calls["forward_only"], "forward-only counters: %r" % calls)
    check("override: swiglu forward (built-in backward)" in out, "forward-only logged")

# The same plugin from the TOML file, as an array.
toml = os.path.join(TMP, "override.toml")
with open(toml, "w") as f:
    f.write('[override]\nimports = ["%s"]\n' % example("rope_hf_avx2"))
code, out, err, rows = train("toml", ["--config", toml])
check(code == 0 and [r["loss"] for r in rows] == base_loss, "[override] imports: %s" % err)

# Data parallel: each rank loads and checks the plugin.
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMP_NUM_THREADS="1")
if env.get("ASAN_OPTIONS"):  # Open MPI's start-up allocations: see tok_mpi.sh
    env["ASAN_OPTIONS"] += ":detect_leaks=0"
dump = os.path.join(TMP, "mpi")
subprocess.run(["rm", "-rf", dump], check=True)
args = model_args("mpi")
args[args.index("--training.local_batch_size") + 1] = "2"
r = subprocess.run(["mpirun", "--oversubscribe", "-np", "2", BIN, "train"] + args +
                   ["--override.imports", example("rope_hf_avx2")],
                   capture_output=True, text=True, env=env, timeout=300)
check(r.returncode == 0 and "override calls: rope_hf" in r.stdout,
      "mpirun -np 2 with a plugin: %s" % (r.stdout + r.stderr)[-2000:])

# --- refusal in training: nothing runs, nothing is written; allow_mismatch runs it loudly
wrong = ["--override.imports", example("rope_interleaved_wrong")]
code, out, err, rows = train("wrong", wrong, checkpoints=True)
line = error_line(err)
check(code == 1 and "refused" in line and "rope_hf" in line and "max abs" in line,
      "wrong kernel in training: rc %d, %s" % (code, line))
check(not os.path.exists(os.path.join(TMP, "wrong", "checkpoint")), "a refused run saved")
code, out, err, rows = train("wrong_allowed", wrong + ["--override.allow_mismatch"])
check(code == 0 and len(rows) == STEPS and "WARNING" in err and "FAILED" in err,
      "allow_mismatch: rc %d, %s" % (code, err[-1500:]))
if rows:
    check([r["loss"] for r in rows] != base_loss, "the wrong kernel did not change the losses")

# --- loading errors: one line each, naming the library and the cause, exit 1
errors = [
    ("not_found", os.path.join(TMP, "nope.so"), r"nope.so: file not found"),
    ("not_a_library", toml, r"cannot load it"),
    ("no_entry", test_plugin("no_entry"), r"no entry point ctitan_plugin_init"),
    ("abi", test_plugin("abi_mismatch"), r"ABI version 2, but this ctitan provides version 1"),
    ("unknown_op", test_plugin("unknown_op"), r'unknown op "rope_neox"'),
    ("twice", example("rope_hf_avx2") + "," + example("rope_interleaved_wrong"),
     r'"rope_hf" is registered twice: .*librope_hf_avx2.so already overrides it'),
    ("init_fails", test_plugin("init_fails"), r"refused to load: needs a GPU, none found"),
    ("empty", test_plugin("empty"), r"registered no op"),
    ("crash", test_plugin("crash"), r"libcrash.so crashed in the parity check: swiglu forward"),
]

for name, imports, pattern in errors:
    code, out, err, rows = train("err_" + name, ["--override.imports", imports])
    line = error_line(err)
    check(code == 1 and re.search(pattern, line), "%s: rc %d, %s" % (name, code, line))
    print("%-14s %s" % (name, line))
# check-kernels reports the crash too, and survives it.
code, doc, err = check_kernels(test_plugin("crash"))
check(code == 1 and doc and doc["check"]["crashed"], "check-kernels on a crash: %s" % err)

# --- verify with an override: the counters in the text and the JSON
ref = os.path.join(os.environ["CTITAN_REF_DIR"], "mha_untied_f32")
code, out, err = run(["verify", "--model.hf_path", os.path.join(ref, "hf"),
                      "--training.dataset_path", os.path.join(ref, "tokens.npy"),
                      "--training.seq_len", "8", "--training.local_batch_size", "2", "--json",
                      "--override.imports", example("rope_hf_avx2")])
check(code == 0, "verify with rope_hf_avx2: %s" % err)
if code == 0:
    doc = json.loads(out.strip().splitlines()[-1])
    calls = doc["override_calls"]["rope_hf"]
    check(calls["forward_calls"] > 0 and calls["backward_calls"] > 0, "verify calls %r" % calls)

summary()
