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

--mode cp | ep | pp runs issue 32's, 33's or 34's figures instead (MODES below: each run's
model, ranks, threads, seq_len, batch and keys; MODEL_SPECS the geometries, printed in the
JSON). Memory and byte runs go first and once; a speed pair runs --rounds times alternating
(A B A B ...) and reports each round's B/A tokens/s and their median, beside the 1-minute load
average after every run. Per run: dp.py's figures, the memory estimate's planned activations
and total, the comm volume line's bytes per step by the log's words, and rank 0's bytes sent a
step (EP's and the pipeline's as counted, FSDP's whole buffers times (S-1)/S). PP runs also
give each rank's idle share of the schedule (strategy_pp.c's $CTITAN_PP_IDLE files: the waits
on the pipeline's receives, sends and the loss sum, over the schedule's time, steps after the
first) beside (p-1)/(m+p-1).
  cp  one process against CP=4 at seq 16384 (peak RSS, planned activations); 1 rank x 2
      threads against CP=2 x 1 thread at seq 8192 (tokens/s, exposed comm), alltoall ring
  ep  one process, EP=4 beside FSDP=4 and FSDP=4 on an expert-dominated MoE (RSS, bytes);
      bench/train.py's moe config at FSDP=2 against EP=2 (tokens/s)
  pp  the bubble at PP=2 (1F1B, GPipe) and PP=4 with 8 micro-batches on balanced stages;
      one process, PP=2 and FSDP=2 on a weight-dominated model (RSS, bytes)
  bench/parallel.py --mode pp --quick     # the smoke run of a mode (under a minute)
  bench/parallel.py --mode pp --runs bal_pp2_1f1b,bal_pp4_1f1b   # a part
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


# ---- CP, EP and PP (issues 32-34): --mode cp | ep | pp ------------------------------------------
# Each mode's runs share one invocation. The memory and byte runs run once (they do not depend on
# the load); a speed pair (A, B) runs --rounds times alternating, A B A B ..., and the summary is
# the median of the rounds' B/A tokens/s ratios, beside the load average over those runs.

SMALL_VOCAB = 2048  # so the head does not dominate the activation-, expert- and stage-bound models

MODEL_SPECS = {
    # activations dominate: 2 layers of hidden 128 (2/1 heads of 64), 0.7M parameters, against
    # hundreds of MiB of activations at seq 16384
    "cp_act": dict(n_layers=2, dim=128, n_heads=2, n_kv_heads=1, head_dim=64, ffn_dim=512,
                   vocab_size=SMALL_VOCAB),
    # experts dominate: 6 sparse layers of 64 experts (top-2, width 512) at hidden 256: 151M of
    # the 152M parameters are experts
    "ep_experts": dict(flavor="debugmodel_moe", n_layers=6, dim=256, n_heads=4, n_kv_heads=2,
                       head_dim=64, num_experts=64, num_experts_per_tok=2,
                       moe_intermediate_size=512, vocab_size=SMALL_VOCAB),
    # bench/train.py's moe config: the debugmodel_moe flavor as it is (hidden 128, 4 layers,
    # 8 experts top-2 of width 128, untied, the real vocabulary, HF's aux loss)
    "moe": dict(flavor="debugmodel_moe"),
    # stages balanced by cost for the bubble: 7 layers of hidden 256 (2.1 MFLOP a token each,
    # forward, attention at seq 256 included) and an untied head of vocabulary 4096 (2.1 MFLOP
    # a token): with PP_COST's split every stage computes alike (PP=2: 4 layers | 3 and the
    # head; PP=4: 2 | 2 | 2 | 1 and the head)
    "pp_bal": dict(n_layers=7, dim=256, n_heads=4, n_kv_heads=2, head_dim=64, ffn_dim=1024,
                   vocab_size=4096, tie_embeddings="false"),
    # weights dominate: bench/dp.py's state model cut to 16 layers (369M parameters, 5.5 GiB of
    # fp32 weights, gradients and AdamW moments in one process; ~20 MB of activations at seq 32)
    "pp_state": dict(dp.STATE, n_layers=16),
}
QUICK_SPECS = {  # --quick: the same keys, tiny
    "cp_act": dict(MODEL_SPECS["cp_act"], n_layers=1),
    "ep_experts": dict(MODEL_SPECS["ep_experts"], n_layers=2, num_experts=8, dim=128,
                       moe_intermediate_size=128),
    "moe": dict(MODEL_SPECS["moe"], vocab_size=SMALL_VOCAB),
    "pp_bal": dict(MODEL_SPECS["pp_bal"], dim=128, ffn_dim=256),
    "pp_state": dict(dp.STATE, n_layers=4, dim=128, ffn_dim=256),
}
# the ring's alltoall rotation: each step's keys travel while the pairs compute
CP2, CP4 = ({"parallelism.context_parallel_degree": str(n),
             "parallelism.context_parallel_rotate_method": "alltoall"} for n in (2, 4))


def ep(n):
    return {"parallelism.expert_parallel_degree": str(n)}


def pp(n, schedule="1F1B", extra=None):
    return {"parallelism.pipeline_parallel_degree": str(n),
            "parallelism.pipeline_parallel_schedule": schedule,
            "parallelism.pipeline_parallel_microbatch_size": "1", **(extra or {})}


# torchtitan's split knobs set for cost: the embedding is a lookup (no layer's worth of work on
# the first stage), the head one layer's FLOPs (pp_bal's vocabulary makes it so)
PP_COST = {"parallelism.pipeline_parallel_first_stage_less_layers": "0",
           "parallelism.pipeline_parallel_last_stage_less_layers": "1"}


# mode -> runs: (name, model, ranks, threads per rank, seq_len, local batch, global batch, steps,
# extra keys, speed pair or None). seq_len is the full run's; --quick divides it by 64.
MODES = {
    "cp": [
        ("mem_np1", "cp_act", 1, 2, 16384, 1, 1, 1, {}, None),
        ("mem_cp4", "cp_act", 4, 1, 16384, 1, 1, 1, CP4, None),
        ("speed_np1", "cp_act", 1, 2, 8192, 1, 1, 3, {}, "speed"),
        ("speed_cp2", "cp_act", 2, 1, 8192, 1, 1, 3, CP2, "speed"),
    ],
    "ep": [
        ("np1", "ep_experts", 1, 2, 64, 1, 4, 2, {}, None),
        ("ep4", "ep_experts", 4, 1, 64, 1, 4, 2, ep(4), None),
        ("fsdp4", "ep_experts", 4, 1, 64, 1, 4, 2, dp.FSDP, None),
        ("moe_fsdp2", "moe", 2, 1, 256, 2, 4, 4, dp.FSDP, "speed"),
        ("moe_ep2", "moe", 2, 1, 256, 2, 4, 4, ep(2), "speed"),
    ],
    "pp": [
        ("bal_np1", "pp_bal", 1, 2, 256, 1, 8, 2, {}, None),
        ("bal_pp2_1f1b", "pp_bal", 2, 1, 256, 8, 8, 8, pp(2, "1F1B", PP_COST), None),
        ("bal_pp2_gpipe", "pp_bal", 2, 1, 256, 8, 8, 8, pp(2, "GPipe", PP_COST), None),
        ("bal_pp4_1f1b", "pp_bal", 4, 1, 256, 8, 8, 8, pp(4, "1F1B", PP_COST), None),
        ("state_np1", "pp_state", 1, 2, 32, 1, 4, 2, {}, None),
        ("state_pp2", "pp_state", 2, 1, 32, 4, 4, 2, pp(2), None),
        ("state_fsdp2", "pp_state", 2, 1, 32, 1, 4, 2, dp.FSDP, None),
    ],
}
TARGETS = {
    "cp": {"mem_cp4 rss_max_over_mem_np1": "<= 0.4",
           "mem_cp4 activations_over_mem_np1": "<= 0.3",
           "speed_cp2 tps_over_speed_np1 (median of rounds)": ">= 0.85"},
    "ep": {"ep4 rss_max_over_np1": "<= 0.3",
           "ep4 bytes_sent_per_rank_over_fsdp4": "<= 0.5",
           "moe_ep2 tps_over_moe_fsdp2 (median of rounds)": ">= 1.0"},
    "pp": {"bal_pp2/pp4 idle fraction per rank": "theory (p-1)/(m+p-1) +- 0.05",
           "state_pp2 rss_max_over_state_np1": "<= 0.55"},
}


def volume(text):
    """The "comm volume" line's bytes per step on rank 0, by the log's own words."""
    line = next((ln for ln in text.splitlines() if ln.startswith("comm volume:")), "")
    out = {}
    for part in line.split(";")[1:]:
        for piece in part.split(","):
            m = re.match(r"\s*(.*\D)\s+(\d+)\s*$", piece)
            if m:
                out[m.group(1).strip()] = int(m.group(2))
    return out


def sent_per_rank(vol, ranks):
    """What rank 0 sends a step: the EP all-to-alls' and pipeline's bytes are what it sent; the
    FSDP collectives' whole buffers times (S-1)/S over a ring of S = ranks (an upper bound for
    EP's expert units, sharded over fewer ranks)."""
    ring = (ranks - 1) / ranks
    return round(sum(v if ("sent" in k) else v * ring for k, v in vol.items()))


def estimate(text):
    m = re.search(r"^memory estimate per rank: .*total ([0-9.]+) GiB", text, re.M)
    return float(m.group(1)) if m else None


def idle(dump, ranks, warmup):
    """strategy_pp.c's $CTITAN_PP_IDLE files: per rank, the waited share of the schedule's time
    over the steps after warmup."""
    out = []
    for r in range(ranks):
        try:
            with open(os.path.join(dump, f"idle.{r}")) as f:
                rows = [ln.split() for ln in f if ln.strip()]
        except OSError:
            out.append(None)
            continue
        rows = [(float(a), float(b)) for s, a, b in rows if int(s) > warmup]
        out.append(round(sum(b for _, b in rows) / sum(a for a, _ in rows), 4) if rows else None)
    return out


def one_run(run, args, specs, tokens, work, tag=""):
    name, model, ranks, threads, seq, local, gbatch, steps, extra, _ = run
    if args.quick:
        seq = max(32, seq // 64)
    keys = dict(extra, **{"training.local_batch_size": str(local),
                          "training.global_batch_size": str(gbatch)})
    sub = argparse.Namespace(**vars(args))
    sub.steps, sub.warmup = steps, min(1, steps - 1)
    full = name + tag
    env = {"CTITAN_PP_IDLE": os.path.join(work, full, "idle")}
    vocab = int(specs[model].get("vocab_size", dp.VOCAB))
    res = dp.run_config(full, ranks, threads, keys, sub, specs[model], seq, tokens[vocab], work,
                        env)
    if res is None or "error" in res:
        return res
    with open(os.path.join(work, full, "stdout.log")) as f:
        text = f.read()
    res.pop("losses")
    res.update(seq_len=seq, model=model, activations_planned_mib=activations_mib(text),
               estimate_total_gib=estimate(text), comm_bytes_per_step_rank0=volume(text),
               bytes_sent_per_step_rank0=sent_per_rank(volume(text), ranks),
               loadavg_1min_after=round(os.getloadavg()[0], 2))
    if "parallelism.pipeline_parallel_degree" in extra:
        m = gbatch // local * (local // int(extra["parallelism.pipeline_parallel_microbatch_size"]))
        p = int(extra["parallelism.pipeline_parallel_degree"])
        res["pipeline"] = {"stages": p, "micro_batches": m,
                           "schedule": extra["parallelism.pipeline_parallel_schedule"],
                           "idle_fraction_per_rank": idle(os.path.join(work, full), ranks,
                                                          sub.warmup),
                           "idle_theory": round((p - 1) / (m + p - 1), 4)}
    return res


def summary(mode, runs, pairs):
    get = lambda n, k: runs.get(n, {}).get(k)  # noqa: E731
    out = {}
    if mode == "cp":
        out["mem_cp4_rss_max_over_mem_np1"] = dp.ratio(get("mem_cp4", "rss_max_gib"),
                                                       get("mem_np1", "rss_max_gib"), 3)
        out["mem_cp4_activations_over_mem_np1"] = dp.ratio(
            get("mem_cp4", "activations_planned_mib"), get("mem_np1", "activations_planned_mib"), 3)
        out["mem_cp4_estimate_over_mem_np1"] = dp.ratio(get("mem_cp4", "estimate_total_gib"),
                                                        get("mem_np1", "estimate_total_gib"), 3)
    if mode == "ep":
        for n in ("ep4", "fsdp4"):
            out[f"{n}_rss_max_over_np1"] = dp.ratio(get(n, "rss_max_gib"), get("np1", "rss_max_gib"), 3)
        out["ep4_bytes_sent_per_rank_over_fsdp4"] = dp.ratio(
            get("ep4", "bytes_sent_per_step_rank0"), get("fsdp4", "bytes_sent_per_step_rank0"), 4)
        out["ep4_whole_buffers_over_fsdp4"] = dp.ratio(
            sum((get("ep4", "comm_bytes_per_step_rank0") or {}).values()),
            sum((get("fsdp4", "comm_bytes_per_step_rank0") or {}).values()), 4)
    if mode == "pp":
        out["state_pp2_rss_max_over_state_np1"] = dp.ratio(get("state_pp2", "rss_max_gib"),
                                                           get("state_np1", "rss_max_gib"), 3)
        out["state_pp2_bytes_sent_per_rank_over_fsdp2"] = dp.ratio(
            get("state_pp2", "bytes_sent_per_step_rank0"),
            get("state_fsdp2", "bytes_sent_per_step_rank0"), 6)
        for k in ("rss_max_gib", "activations_planned_mib"):
            out[f"bal_pp2_gpipe_over_1f1b_{k}"] = dp.ratio(get("bal_pp2_gpipe", k),
                                                           get("bal_pp2_1f1b", k), 3)
        for n in ("bal_pp2_1f1b", "bal_pp2_gpipe", "bal_pp4_1f1b"):
            pl = get(n, "pipeline")
            if pl:
                got = [x for x in pl["idle_fraction_per_rank"] if x is not None]
                out[f"{n}_idle_minus_theory"] = [round(x - pl["idle_theory"], 4) for x in got]
                out[f"{n}_idle_mean_over_ranks"] = (round(sum(got) / len(got), 4) if got
                                                    else None)
    for pair, rounds in pairs.items():
        a, b = rounds[0][0][0], rounds[0][1][0]
        ratios = [dp.ratio(rb.get("tps_total"), ra.get("tps_total"), 3)
                  for (_, ra), (_, rb) in rounds]
        ok = sorted(x for x in ratios if x is not None)
        out[f"{b}_tps_over_{a}"] = {
            "rounds": ratios, "median": ok[len(ok) // 2] if ok else None,
            f"{b}_comm_s_per_step": [rb.get("comm_s_per_step") for _, (_, rb) in rounds],
            f"{b}_comm_hidden_s_per_step": [rb.get("comm_hidden_s_per_step")
                                            for _, (_, rb) in rounds]}
    return out


def vocabs(specs):
    """Every vocabulary size the models use: each gets its own token file."""
    return sorted({spec.get("vocab_size", dp.VOCAB) for spec in specs.values()})


def run_mode(args):
    runs_spec = MODES[args.mode]
    if args.runs:
        runs_spec = [r for r in runs_spec if r[0] in args.runs.split(",")]
    specs = QUICK_SPECS if args.quick else MODEL_SPECS
    if args.dry_run:
        for run in runs_spec:
            one_run(run, args, specs, {v: "TOKENS.npy" for v in vocabs(specs)},
                    args.work or "WORK")
        return
    if shutil.which("mpirun") is None:
        raise SystemExit("[parallel] mpirun not found: install OpenMPI (make deps)")
    import numpy as np
    loads = [round(os.getloadavg()[0], 2)]
    tmp = None if args.work else tempfile.TemporaryDirectory(prefix="ctitan-parallel-")
    work = args.work or tmp.name
    os.makedirs(work, exist_ok=True)
    runs, pairs = {}, {}
    try:
        tokens = {}
        for v in vocabs(specs):
            tokens[v] = os.path.join(work, f"tokens{v}.npy")
            np.save(tokens[v], np.random.default_rng(0).integers(0, v, 2_000_000).astype(np.int32))
        for run in runs_spec:  # memory and bytes first: they do not depend on the load
            if run[9] is None:
                runs[run[0]] = one_run(run, args, specs, tokens, work)
                loads.append(runs[run[0]].get("loadavg_1min_after"))
        for pair in dict.fromkeys(r[9] for r in runs_spec if r[9]):
            members = [r for r in runs_spec if r[9] == pair]
            pairs[pair] = []
            for i in range(args.rounds):
                done = []
                for run in members:
                    res = one_run(run, args, specs, tokens, work, f"_r{i + 1}")
                    runs[f"{run[0]}_r{i + 1}"] = res
                    loads.append(res.get("loadavg_1min_after"))
                    done.append((run[0], res))
                pairs[pair].append(done)
    finally:
        if tmp is not None:
            tmp.cleanup()
    loads = [x for x in loads if x is not None]
    result = {
        "mode": args.mode, "cores": os.cpu_count(), "quick": args.quick,
        "models": {m: dict(specs[m], vocab_size=specs[m].get("vocab_size", dp.VOCAB))
                   for m in dict.fromkeys(r[1] for r in runs_spec)},
        "rounds": args.rounds, "runs_asked": args.runs or "all", "loadavg_1min": {"before": loads[0], "max": max(loads),
                                                "median": sorted(loads)[len(loads) // 2]},
        "targets": TARGETS[args.mode], "summary": summary(args.mode, runs, pairs), "runs": runs,
    }
    print(json.dumps(result, indent=2))
    failed = [n for n, r in runs.items() if "error" in r]
    if failed:
        log(f"failed: {', '.join(failed)}")
        sys.exit(1)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-wrapper":
        return dp.rank_wrapper(sys.argv[2], sys.argv[4:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", default="tp", choices=["tp"] + list(MODES),
                    help="tp: the runs above; cp, ep, pp: MODES' (see the docstring)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="cp, ep: times each speed pair runs, alternating (A B A B ...)")
    ap.add_argument("--runs", default="", help="cp, ep, pp: a comma-separated subset of MODES'")
    args, models = dp.parse_run_args(ap)
    if args.mode != "tp":
        return run_mode(args)
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
