#!/usr/bin/env python3
"""Tensor parallelism against one process and FSDP, side by side, in one invocation (issue 30).

For each model (--models), three real `mpirun` runs of `ctitan train` on the same data, seed and
global batch (bench/dp.py's run_config: 4 sequences a step, micro-batches of 2):
  np1       -np 1, 2 threads, 2 accumulated micro-batches
  fsdp_np2  -np 2, 1 thread per rank, FSDP over both (one micro-batch each)
  tp2       -np 2, 1 thread per rank, tensor_parallel_degree 2 with sequence parallelism and
            loss parallel (both ranks read the same micro-batch: 2 accumulated micro-batches)
Models: c1 (bench/dp.py's: hidden 512, 4 layers, tied 151936 vocabulary, seq 256) and "state",
the weight-dominated model of bench/dp.py (583M parameters, untied, seq 32).

Prints one JSON object (progress on stderr); a benchmark, not a test. Per run, bench/dp.py's
figures (tokens/s, step time, per-rank peak RSS, ...), the memory estimate's planned activations
per rank, and the bytes per step each collective moved on rank 0 (the run's "comm volume" line:
counters in the TP strategy, FSDP and the gradient sync, each collective counted as its whole
buffer), beside the formula below. Per model, the ratios the issue sets targets for:
  tp2 peak RSS per rank / np1's          (state: <= 0.55)
  tp2 planned activations / np1's        (<= 0.55, the logits included: loss parallel)
  tp2 tokens/s / fsdp_np2's              (c1: >= 0.8)

The formula, per optimizer step, of each collective's whole buffer (L layers, hidden C, head_dim
D, N = tokens of a micro-batch, A micro-batches a step, P = TP degree, 4-byte floats):
  TP all-gathers      A (4L + 2) N C 4 + A P N 4: per layer, the normed rows before q|k|v and
                      before gate|up (forward) and the output gradient's rows before o_proj's
                      and down's backward; the final norm's rows before the head; the
                      embedding's gradient rows; the loss's row maxes (N per rank)
  TP reduce-scatters  A (4L + 2) N C 4: per layer, o_proj's and down's partial outputs
                      (forward) and the q|k|v and gate|up input gradients (backward); the
                      embedding's output; the head's input gradient
  TP loss all-reduce  A 2N 4 (each row's sum of exponentials and target logit)
  TP replicated grads (L (2C + 2D) + C) 4 (the norms, q/k norms, final norm; once a step)
  FSDP gathers        A (2 W - W_kept) 4: every unit in the forward and again in the backward
                      but the head's unit and a tied embedding (reshard_after_forward default)
  FSDP reduce-scatter A W 4 (every unit's gradients, every micro-batch)
  DDP all-reduce      W 4 (not run here: TP x DDP adds it on the TP-local W / P)
with W the parameters of the model (one process's). Over a ring each rank sends (P-1)/P of an
all-gather's or reduce-scatter's buffer and 2 (P-1)/P of an all-reduce's.

  bench/parallel.py                       # both models, 8 steps
  bench/parallel.py --quick --models c1   # a small c1, a smoke run
"""
import argparse
import json
import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dp  # noqa: E402  (bench/dp.py: run_config, the models, the rank wrapper)

TP2 = {"parallelism.tensor_parallel_degree": "2"}
RUNS = [("np1", 1, 2, {}), ("fsdp_np2", 2, 1, dp.FSDP), ("tp2", 2, 1, TP2)]
MODELS = ("c1", "state")


def log(msg):
    print(f"[parallel] {msg}", file=sys.stderr, flush=True)


def dims(model):
    """The parameter counts the formula needs, for dp.py's model dicts (debugmodel's vocab)."""
    C, L, D = model["dim"], model["n_layers"], model["head_dim"]
    NH, NKV, F = model["n_heads"], model["n_kv_heads"], model["ffn_dim"]
    tied = str(model.get("tie_embeddings", "true")) != "false"
    layer = C * NH * D + 2 * C * NKV * D + NH * D * C + 2 * D + 2 * C + 3 * C * F
    emb = dp.VOCAB * C
    head = C + (0 if tied else emb)  # the final norm, lm_head when untied
    return dict(C=C, L=L, D=D, tied=tied, W=emb + L * layer + head, emb=emb, head=head)


def formula(model, seq_len, run, ranks):
    """Bytes per step of each collective (whole buffers), for a run of RUNS."""
    d = dims(model)
    micro = min(dp.MICRO_BATCH, dp.GLOBAL_BATCH // ranks)
    N = micro * seq_len
    if run == "tp2":
        P, A = 2, dp.GLOBAL_BATCH // micro  # every TP rank reads the same micro-batches
        rows = (4 * d["L"] + 2) * N * d["C"] * 4
        return {"tp_all_gathers": A * rows + A * P * N * 4, "tp_reduce_scatters": A * rows,
                "tp_loss_all_reduces": A * 2 * N * 4,
                "tp_replicated_grad_all_reduces": (d["L"] * (2 * d["C"] + 2 * d["D"]) + d["C"]) * 4}
    if run == "fsdp_np2":
        A = dp.GLOBAL_BATCH // (micro * ranks)
        kept = d["head"] + (d["emb"] if d["tied"] else 0)
        return {"fsdp_gathers": A * (2 * d["W"] - kept) * 4, "fsdp_reduce_scatters": A * d["W"] * 4}
    return {}


VOLUME = {  # the log's words -> the JSON's keys
    "TP all-gathers": "tp_all_gathers", "reduce-scatters": None, "loss all-reduces":
    "tp_loss_all_reduces", "replicated gradients' all-reduces": "tp_replicated_grad_all_reduces",
    "FSDP gathers": "fsdp_gathers", "replica all-reduces": "hsdp_replica_all_reduces",
    "data-parallel gradient reductions": "dp_gradient_reductions"}


def measured_volume(text, run):
    """The "comm volume" line's bytes per step, by collective."""
    line = next((ln for ln in text.splitlines() if ln.startswith("comm volume:")), None)
    if line is None:
        return {}
    out = {}
    for part in line.split(";")[1:]:
        for piece in part.split(","):
            m = re.match(r"\s*(.*\D)\s+(\d+)\s*$", piece)
            if not m:
                continue
            words, value = m.group(1).strip(), int(m.group(2))
            key = VOLUME.get(words)
            if words == "reduce-scatters":
                key = "tp_reduce_scatters" if run == "tp2" else "fsdp_reduce_scatters"
            if key:
                out[key] = value
    return out


def activations_mib(text):
    m = re.search(r"^memory estimate per rank: .*activations [0-9.]+ GiB \(([0-9.]+) MiB", text,
                  re.M)
    return float(m.group(1)) if m else None


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-wrapper":
        return dp.rank_wrapper(sys.argv[2], sys.argv[4:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    args, models = dp.parse_run_args(ap)
    spec = {"c1": (dp.QUICK if args.quick else dp.FULL, args.seq_len),
            "state": (dp.STATE, dp.STATE_SEQ_LEN)}
    if args.dry_run:
        for m in models:
            for name, r, th, extra in RUNS:
                dp.run_config(f"{m}_{name}", r, th, extra, args, *spec[m], "TOKENS.npy",
                              args.work or "WORK")
        return
    if shutil.which("mpirun") is None:
        raise SystemExit("[parallel] mpirun not found: install OpenMPI (make deps)")
    import numpy as np
    load_before = round(os.getloadavg()[0], 2)
    tmp = None if args.work else tempfile.TemporaryDirectory(prefix="ctitan-parallel-")
    work = args.work or tmp.name
    os.makedirs(work, exist_ok=True)
    out = {}
    try:
        tokens = os.path.join(work, "tokens.npy")
        np.save(tokens, np.random.default_rng(0).integers(0, dp.VOCAB, 2_000_000).astype(np.int32))
        for m in models:
            model, seq_len = spec[m]
            runs = {}
            for name, r, th, extra in RUNS:
                full = f"{m}_{name}"
                res = dp.run_config(full, r, th, extra, args, model, seq_len, tokens, work)
                with open(os.path.join(work, full, "stdout.log")) as f:
                    text = f.read()
                if "error" not in res:
                    losses = res.pop("losses")
                    res["loss_last"] = losses[-1]
                    base = runs.get("np1", {}).get("_losses")
                    if base:  # the same global batch: the losses agree to rounding
                        res["loss_max_rel_diff_vs_np1"] = max(
                            abs(a - b) / abs(b) for a, b in zip(losses, base))
                    res["_losses"] = losses
                    res["activations_planned_mib"] = activations_mib(text)
                    meas, want = measured_volume(text, name), formula(model, seq_len, name, r)
                    res["comm_bytes_per_step"] = {
                        k: {"measured": meas.get(k), "formula": v,
                            "measured_over_formula": dp.ratio(meas.get(k), v, 6)}
                        for k, v in want.items()}
                    for k, v in meas.items():  # any the formula does not name
                        res["comm_bytes_per_step"].setdefault(k, {"measured": v})
                runs[name] = res
            for res in runs.values():
                res.pop("_losses", None)
            get = lambda n, k: runs.get(n, {}).get(k)  # noqa: E731
            out[m] = {
                "model": dict(flavor="debugmodel", vocab=dp.VOCAB, seq_len=seq_len, **model,
                              params=dims(model)["W"]),
                "runs": runs,
                "tp2_rss_max_over_np1": dp.ratio(get("tp2", "rss_max_gib"),
                                                 get("np1", "rss_max_gib"), 3),
                "tp2_activations_over_np1": dp.ratio(get("tp2", "activations_planned_mib"),
                                                     get("np1", "activations_planned_mib"), 3),
                "tp2_tps_over_fsdp_np2": dp.ratio(get("tp2", "tps_total"),
                                                  get("fsdp_np2", "tps_total"), 3),
            }
    finally:
        if tmp is not None:
            tmp.cleanup()
    result = {
        "global_batch": dp.GLOBAL_BATCH, "steps": args.steps,
        "averaged_steps": f"{args.warmup + 1}..{args.steps}", "cores": os.cpu_count(),
        "loadavg_1min_before": load_before, "loadavg_1min_after": round(os.getloadavg()[0], 2),
        "targets": {"state tp2_rss_max_over_np1": "<= 0.55",
                    "tp2_activations_over_np1": "<= 0.55",
                    "c1 tp2_tps_over_fsdp_np2": ">= 0.8"},
        "models": out,
    }
    print(json.dumps(result, indent=2))
    failed = [f"{m}_{n}" for m, o in out.items() for n, r in o["runs"].items() if "error" in r]
    if failed:
        log(f"failed: {', '.join(failed)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
