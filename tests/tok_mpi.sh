#!/usr/bin/env bash
# Data parallel training under real OpenMPI (mpirun), on the real tokenizer and real text, in
# ZeRO-1 and replicated modes (FSDP, the default, is tests/fsdp.sh):
# N ranks against one process on the same global batch, ZeRO-1 against replicated state,
# resume with a different rank count, bucketing/overlap invariance, and failures on one rank
# (bad data, a dead rank, a hung rank, a NaN) ending every rank in bounded time, and SIGUSR1
# (which mpirun forwards) stopping every rank at the same step with a checkpoint. MoE runs (HF
# aux loss, aux-free bias) match one process too.
set -u
source "$(dirname "$0")/mpi_test.bash"
text_run_setup
# Under the sanitizers (make check's second pass, a Debug build about 10x slower) one case of
# each kind runs (np2, MoE, replicated, a resume at another rank count, SIGUSR1, bad data, a
# hang, diverged weights, a NaN); the matrix is the optimised pass's (full, mpi_test.bash).

# run NP DUMP [--key value ...]: a 2-layer debugmodel run, shuffle off, 4 steps, 1 thread per
# rank, ZeRO-1; the options given replace these.
run() {
  local np=$1 dump=$2; shift 2
  text_train "$np" "$dump" checkpoint.interval=100 parallelism.data_parallel_shard_mode=zero1 \
    -- "$@"
}
# same A B LOSS NORM WEIGHTS [STEPS] (mpi_test.bash): the learning rate is 3e-4: AdamW's
# g/sqrt(v) turns the rounding difference of a near-zero gradient element (summed in another
# order over ranks) into a step of up to lr, so a few hundred of the 20M weights differ by a
# fraction of lr; at lr 3e-3 the weights' rel L2 is about 4e-6, at 3e-4 under 1e-7. Each bound
# below is about 10 times what was measured (the figure beside it).
export -f run
# drop DUMP...: removes the checkpoints of runs no later check reads (each is 230 MB of this
# model's weights and moments; the logs and metrics stay), so the test needs about 1 GB of disk.
drop() { local d; for d in "$@"; do rm -rf "$d/checkpoint"; done; }

# --- N ranks against one process on the same global batch (issue 5's three pairs). The README
# claims losses within 1e-7 and weights within 1e-6 of one process. Measured on a 2-core x86-64
# (Release), over these five pairs and the two resumes below: losses rel up to 6.2e-9 (bound
# 1e-7, the README's), grad norms 4.1e-8 (bound 4e-7), weights rel L2 6.9e-8 (MoE; bound 7e-7).
# The ASan build (Debug) measured 3.7e-9, 4.3e-8 and 3.7e-8.
ranks_tol=(1e-7 4e-7 7e-7)
check "np1 B2" run 1 "$tmp/np1_b2" --training.local_batch_size 2
check "np2 B1" run 2 "$tmp/np2_b1"
check "np2 B1 = np1 B2" same "$tmp/np2_b1" "$tmp/np1_b2" "${ranks_tol[@]}"
if full; then
check "np1 B3" run 1 "$tmp/np1_b3" --training.local_batch_size 3
check "np3 B1" run 3 "$tmp/np3_b1"
check "np3 B1 = np1 B3" same "$tmp/np3_b1" "$tmp/np1_b3" "${ranks_tol[@]}"
drop "$tmp/np1_b2" "$tmp/np1_b3" "$tmp/np3_b1"
check "np1 B4" run 1 "$tmp/np1_b4" --training.local_batch_size 4
check "np2 accum 2" run 2 "$tmp/np2_acc" --training.global_batch_size 4
check "np2 x accum 2 = np1 B4" same "$tmp/np2_acc" "$tmp/np1_b4" "${ranks_tol[@]}"
drop "$tmp/np1_b4" "$tmp/np2_acc"
fi
grep -q "2 rank(s), ZeRO-1" "$tmp/np2_b1.log" && grep -q "1 thread(s) per rank" "$tmp/np2_b1.log" &&
  ok || bad "np2 log lacks the parallel line: $(grep parallel "$tmp/np2_b1.log")"
ls "$tmp/np2_b1/checkpoint/step-4/optimizer-00001-of-00002.safetensors" >/dev/null && ok ||
  bad "np2 checkpoint lacks rank 1's optimizer shard"

# --- MoE: the aux loss and the expert-bias counts are summed over ranks, so N ranks train as one
# process with the same micro-batches (HF's aux, and the aux-free bias, are per global batch).
moe=(--model.flavor debugmodel_moe --model.tie_embeddings true --model.load_balance)
check "moe hf np1 B2" run 1 "$tmp/moe_np1" "${moe[@]}" hf --training.local_batch_size 2
check "moe hf np2 B1" run 2 "$tmp/moe_np2" "${moe[@]}" hf
check "moe hf: np2 B1 = np1 B2" same "$tmp/moe_np2" "$tmp/moe_np1" "${ranks_tol[@]}"
drop "$tmp/moe_np2" "$tmp/moe_np1"
# The expert bias moves by a fixed step on the sign of each expert's load, so one ulp anywhere
# that flips a near-tie in routing changes the bias, and the runs part a step or two later (the
# flash kernel, or the unoptimised ASan build, differ by an ulp in a token's loss between B2
# and 2 x B1). Step 2 already routes with the bias made from step 1's loads summed over the
# ranks, so the first two steps are the check of the rank-summed counts.
if full; then
check "moe aux_free np1 B2" run 1 "$tmp/moef_np1" "${moe[@]}" aux_free \
  --model.load_balance_coeff 0.01 --training.local_batch_size 2
check "moe aux_free np2 B1" run 2 "$tmp/moef_np2" "${moe[@]}" aux_free \
  --model.load_balance_coeff 0.01
check "moe aux_free: np2 B1 = np1 B2" same "$tmp/moef_np2" "$tmp/moef_np1" "${ranks_tol[@]}" 2
drop "$tmp/moef_np2" "$tmp/moef_np1"
fi

# --- ZeRO-1 against replicated optimizer state (DDP); determinism; buckets and overlap
check "np2 replicated" run 2 "$tmp/np2_rep" --parallelism.data_parallel_replicate_degree 2 \
  --parallelism.data_parallel_shard_degree 1
# The same sums in the same order, whether a rank owns a shard of the update or all of it: losses
# and weights bit-identical (a shard boundary off by one moves a few weights by about lr * wd,
# under 1e-6 of the L2). Only the gradient norm is summed per shard, then over ranks: measured
# rel 1.2e-15 (Release), 3.1e-15 (ASan build); bound 3e-14.
check "ZeRO-1 = replicated" same "$tmp/np2_b1" "$tmp/np2_rep" 0 3e-14 0
drop "$tmp/np2_rep"
grep -q "replicated model and optimizer state (DDP)" "$tmp/np2_rep.log" && ok || bad "replicated mode not logged"
# The same with norms, biases and the embedding excluded from weight decay: the no-decay ranges
# are clipped to each rank's shard (adamw_exclude_decay), and a range cut one element wrong
# decays a weight it must not.
if full; then
nodecay=(--optimizer.decay_norms_and_embeddings false)
check "np2 ZeRO-1, no-decay ranges" run 2 "$tmp/np2_nd" "${nodecay[@]}"
check "np2 replicated, no-decay ranges" run 2 "$tmp/np2_nd_rep" "${nodecay[@]}" \
  --parallelism.data_parallel_replicate_degree 2 --parallelism.data_parallel_shard_degree 1
check "ZeRO-1 = replicated with no-decay ranges" same "$tmp/np2_nd" "$tmp/np2_nd_rep" 0 3e-14 0
drop "$tmp/np2_nd" "$tmp/np2_nd_rep"
# (Determinism: this pair and ZeRO-1 = replicated compare two runs bit for bit.)
check "np2 small buckets, no overlap" run 2 "$tmp/np2_small" --comm.bucket_cap_mb 0.05 \
  --comm.overlap false
check "bucketing and overlap change nothing" same "$tmp/np2_small" "$tmp/np2_b1" 0 0 0
fi
drop "$tmp/np2_small" "$tmp/np2_b1"
if full; then
grep -q "gradient bucket(s)" "$tmp/np2_small.log" && ok || bad "bucket count not logged"
fi
"$CTITAN_PYTHON" - "$tmp/np2_b1/metrics.jsonl" <<'PY' && ok || bad "metrics lack tps_total/comm_s"
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l][-1]
sys.exit(0 if r["ranks"] == 2 and r["tps_total"] > r["tps"] > 0 and r["comm_s"] >= 0 else 1)
PY

# --- checkpoints do not depend on the rank count: save with 2, resume with 1; save with 1,
# resume with 3; losses as an uninterrupted run. The first leg stops at step 2 (training.steps
# is not part of the run's identity; the schedule has no decay, so it does not depend on it).
check "np1 B2 6 steps" run 1 "$tmp/straight2" --training.local_batch_size 2 --training.steps 6
check "np2 leg 1" run 2 "$tmp/resume21" --training.steps 2
check "np1 leg 2" run 1 "$tmp/resume21" --training.steps 6 --training.global_batch_size 2
grep -q "resumed from .*step-2" "$tmp/resume21.log" && ok || bad "np1 did not resume np2's checkpoint"
check "2 -> 1 ranks = straight" same "$tmp/resume21" "$tmp/straight2" "${ranks_tol[@]}"
drop "$tmp/straight2"
if full; then
check "np1 B3 6 steps" run 1 "$tmp/straight3" --training.local_batch_size 3 --training.steps 6
check "np1 leg 1" run 1 "$tmp/resume13" --training.local_batch_size 3 --training.steps 2
check "np3 leg 2" run 3 "$tmp/resume13" --training.steps 6
check "1 -> 3 ranks = straight" same "$tmp/resume13" "$tmp/straight3" "${ranks_tol[@]}"
ls "$tmp/resume13/checkpoint/step-6/optimizer-00002-of-00003.safetensors" >/dev/null && ok ||
  bad "np3 checkpoint lacks rank 2's shard"
drop "$tmp/resume13" "$tmp/straight3"
fi
# A different global batch is a different run: refused, named, non-zero.
if run 2 "$tmp/resume21" --training.steps 8 --training.global_batch_size 4; then
  bad "global batch change: exit 0"
else
  grep -q "different config" "$tmp/resume21.log" && ok || bad "global batch change not refused"
fi
drop "$tmp/resume21"

# --- SIGUSR1 to mpirun reaches every rank: they agree on the step, save it and exit 138
# (128 + SIGUSR1), and so does mpirun; the next run resumes there
sigusr1 "$tmp/usr1" state.json
drop "$tmp/usr1"

# --- failures on one rank end every rank, non-zero, within 60 s, naming the rank
fails bad_token "ctitan: error: rank 1: training data, step 2.*outside the vocabulary" 2 \
  --debug.fault bad_token --debug.fault_rank 1 --debug.fault_step 2
[ "$(grep -c '^ctitan: error:' "$tmp/bad_token.log")" -eq 1 ] && ok ||
  bad "bad token: not exactly one error line: $(grep error "$tmp/bad_token.log")"
if full; then
fails rank_exit "rank 1|\[\[[0-9]+,[0-9]+\],1\]" 3 --debug.fault exit --debug.fault_rank 1 \
  --debug.fault_step 2
grep -q "^step *1/" "$tmp/rank_exit.log" && ok || bad "rank_exit: no step ran before the fault"
fi
fails rank_hang "rank 0: .* did not complete within 5 s" 2 --debug.fault hang \
  --debug.fault_rank 1 --debug.fault_step 2 --comm.train_timeout_seconds 5
# --- before every save the ranks compare their weights' XXH64: one weight moved by an ulp on
# rank 1 (debug.fault weights, test only) stops the save of step 2 with one error line naming
# both ranks, every rank exits 1 by itself, and nothing is saved. The same run checks the
# threads: with neither parallelism.threads_per_rank nor OMP_NUM_THREADS each rank gets the
# node's cores / its ranks on the node (at most the cores it may run on; nproc says how many,
# OMP_NUM_THREADS being unset), and an OMP_WAIT_POLICY the user set reaches libgomp unchanged
# (OMP_DISPLAY_ENV: libgomp prints what it read, once per rank: no re-exec with "passive").
cores=$(getconf _NPROCESSORS_ONLN) allowed=$(nproc)
want=$((cores / 2)); [ "$want" -lt 1 ] && want=1; [ "$allowed" -lt "$want" ] && want=$allowed
OMP_WAIT_POLICY=active OMP_DISPLAY_ENV=true per_rank_rc=1 run 2 "$tmp/diverge" \
  --training.steps 3 --checkpoint.interval 2 --parallelism.threads_per_rank 0 \
  --debug.fault weights --debug.fault_rank 1 --debug.fault_step 2
errors=$(grep '^ctitan: error:' "$tmp/diverge.log")
[ "$(grep -c . <<<"$errors")" -eq 1 ] &&
  grep -qE "at step 2 rank 1's weights differ from rank 0's \(XXH64 [0-9a-f]{16} vs [0-9a-f]{16}\): refusing to save" <<<"$errors" &&
  ok || bad "diverged weights: not one error line naming ranks 1 and 0: $errors"
[ "$(grep -cE '^rank [01] exit 1$' "$tmp/diverge.log")" -eq 2 ] && ok ||
  bad "diverged weights: not every rank exited 1: $(grep '^rank' "$tmp/diverge.log")"
[ -z "$(ls -A "$tmp/diverge/checkpoint" 2>/dev/null)" ] && ok ||
  bad "diverged weights were saved: $(ls "$tmp/diverge/checkpoint")"
grep -qF "; $want thread(s) per rank ($cores cores / 2 ranks on this node" "$tmp/diverge.log" &&
  ok || bad "want $want thread(s) per rank of $cores cores ($allowed allowed): $(grep '^parallel' "$tmp/diverge.log")"
grep -q "idle OpenMP threads: active$" "$tmp/diverge.log" &&
  [ "$(grep -c "OMP_WAIT_POLICY = 'ACTIVE'" "$tmp/diverge.log")" -eq 2 ] &&
  ! grep -q "OMP_WAIT_POLICY = 'PASSIVE'" "$tmp/diverge.log" && ok ||
  bad "OMP_WAIT_POLICY=active not kept: $(grep -i 'wait_policy\|^parallel' "$tmp/diverge.log")"
grep -q "idle OpenMP threads: passive$" "$tmp/np2_b1.log" && ok ||
  bad "OMP_WAIT_POLICY unset: not passive: $(grep '^parallel' "$tmp/np2_b1.log")"

# A NaN on one rank reaches every rank through the sum: all skip the same step and go on.
check "nan on rank 1" run 2 "$tmp/nan" --debug.fault nan --debug.fault_rank 1 --debug.fault_step 2
grep -q "step 2: non-finite gradient norm; step skipped" "$tmp/nan.log" && ok ||
  bad "NaN step not skipped: $(grep -i 'step 2' "$tmp/nan.log")"
drop "$tmp/nan"

finish
