#!/usr/bin/env bash
# FSDP and HSDP (issue 19) under real mpirun at 1, 2, 3 and 4 ranks, on the real text: N ranks
# against one process on the same global batch (dense tied and untied, MoE, bf16), determinism,
# reshard_after_forward "never" giving the default's bits, HSDP, checkpoints of per-rank shards
# resumed at any rank count and in any mode (bit for bit where the layout is unchanged), the
# streamed HF export, an HF initial load of each rank's ranges, and failures on one rank (a hang,
# a dead rank, a NaN, bad data, SIGUSR1) ending every rank. The runs train on the text's ids in a
# vocabulary of 2048 (ids_setup); no case needs the real tokenizer or vocabulary (no documents,
# no conversations, and the HF folders loaded are these runs' own exports).
set -u
source "$(dirname "$0")/mpi_test.bash"
text_run_setup
ids_setup 2048
# Under the sanitizers (make check's second pass, a Debug build about 10x slower) one case of
# each kind runs (np2, HSDP, a resume, the export and HF load, bf16, MoE, a hang, a NaN, SIGUSR1)
# for memory errors on the FSDP paths; the matrix is the optimised pass's (full, mpi_test.bash).

# run NP DUMP [--key value ...]: a 2-layer debugmodel, 4 steps of 4 sequences, 1 thread per rank,
# FSDP (the default); the options given replace the defaults. Then the last checkpoint is
# exported to DUMP/hf (streamed from the shards), which `same` compares.
run() {
  local np=$1 dump=$2; shift 2
  text_train "$np" "$dump" training.global_batch_size=4 checkpoint.interval=2 -- "$@" || return
  local last
  last=$(ls -d "$dump"/checkpoint/step-* 2>/dev/null | sort -t- -k2 -n | tail -1)
  [ -z "$last" ] || "$ct" export --checkpoint "$last" --output "$dump/hf" >/dev/null
}
export -f run
losses() { grep -o '"loss":[^,}]*' "$1/metrics.jsonl" | cut -d: -f2 | tr '\n' ' '; }
# Measured on a 2-core x86-64 (Release) over the pairs below (np2, np3, np4, HSDP, untied, the
# HF load, MoE, the checkpoint chain), on the ids (ids_setup): losses rel up to 1.9e-8, grad norms
# 2.9e-8, weights rel L2 8.4e-8; the sanitizer build's cases (Debug) up to 2.6e-8, 7.2e-8, 1.1e-7
# (the HF load). Bounds about 10 times the larger; the issue asks for 1e-6 on losses, 1e-5 on
# weights.
tol=(3e-7 7e-7 1e-6)

# --- N ranks = one process on the same global batch: 2, 3 and 4 ranks, with accumulation
check "np1" run 1 "$tmp/np1" --training.local_batch_size 2
check "np2" run 2 "$tmp/np2"
check "np2 = np1" same "$tmp/np2" "$tmp/np1" "${tol[@]}"
if full; then
check "np4" run 4 "$tmp/np4"
check "np4 = np1" same "$tmp/np4" "$tmp/np1" "${tol[@]}"
check "np1 B3" run 1 "$tmp/np1b3" --training.local_batch_size 3 --training.global_batch_size 6
check "np3" run 3 "$tmp/np3" --training.global_batch_size 6
check "np3 = np1" same "$tmp/np3" "$tmp/np1b3" "${tol[@]}"
fi
grep -q "2 rank(s), FSDP: parameters, gradients and optimizer state sharded over 2 ranks" \
  "$tmp/np2.log" && ok || bad "np2 log lacks the FSDP line: $(grep '^parallel' "$tmp/np2.log")"
if full; then
grep -q "^memory, FSDP: shard (1/4) weights" "$tmp/np4.log" && ok ||
  bad "np4 log lacks the FSDP memory line"
fi
ls "$tmp/np2/checkpoint/step-4/model-00001-of-00002.safetensors" \
  "$tmp/np2/checkpoint/step-4/optimizer-00001-of-00002.safetensors" >/dev/null &&
  [ ! -e "$tmp/np2/checkpoint/step-4/model.safetensors" ] && ok ||
  bad "np2's checkpoint is not one model and one optimizer shard per rank"
grep -q '"comm_hidden_s"' "$tmp/np2/metrics.jsonl" && ok || bad "metrics lack comm_hidden_s"

# --- the reshard policies: the same bits (gathers are exact copies). "never", the farthest
# from the default's gathers, stands for both; determinism is the bit-for-bit resume below.
if full; then
check "np2 never" run 2 "$tmp/np2_never" --parallelism.fsdp_reshard_after_forward never
check "reshard never = default" same "$tmp/np2_never" "$tmp/np2" 0 0 0
rm -rf "$tmp/np2_never"
fi

# --- HSDP: 2 replica groups x 2 shard ranks
check "hsdp 2x2" run 4 "$tmp/hsdp" --parallelism.data_parallel_replicate_degree 2
check "hsdp = np1" same "$tmp/hsdp" "$tmp/np1" "${tol[@]}"
grep -q "sharded over 2 ranks, in each of the replica groups (HSDP)" "$tmp/hsdp.log" && ok ||
  bad "HSDP not logged: $(grep '^parallel' "$tmp/hsdp.log")"
# 4 ranks of 1 thread: on fewer than 4 cores the comm waits sleep after 0.1 ms (the yields took
# the cores from the ranks being waited for: a 4-step np4 run on the real vocabulary took 14-16 s
# before, 9-10 after).
if [ "$(getconf _NPROCESSORS_ONLN)" -lt 4 ]; then
  grep -q "more threads than cores on this node: comm waits sleep after 0.1 ms$" "$tmp/hsdp.log"
else
  ! grep -q "comm waits sleep" "$tmp/hsdp.log"
fi && ok || bad "oversubscription not logged as expected: $(grep '^parallel' "$tmp/hsdp.log")"
ls "$tmp/hsdp/checkpoint/step-4/model-00001-of-00002.safetensors" >/dev/null && ok ||
  bad "HSDP's checkpoint is not 2 shards"

# --- untied embeddings (the head its own unit)
if full; then
check "untied np1" run 1 "$tmp/untied1" --training.local_batch_size 2 --model.tie_embeddings false
check "untied np2" run 2 "$tmp/untied2" --model.tie_embeddings false
check "untied np2 = np1" same "$tmp/untied2" "$tmp/untied1" "${tol[@]}"
rm -rf "$tmp/untied1" "$tmp/untied2"
fi

# --- checkpoints: the same layout resumes bit for bit; np4 -> np2 -> np1 -> ZeRO-1 -> FSDP as
# an uninterrupted run, to the tolerance of the reductions' order
check "np2 leg 1" run 2 "$tmp/res22" --training.steps 2
check "np2 leg 2" run 2 "$tmp/res22"
grep -q "resumed from .*step-2" "$tmp/res22.log" && ok || bad "np2 did not resume"
check "np2 resumed = straight, bit for bit" same "$tmp/res22" "$tmp/np2" 0 0 0
if full; then
# (A schedule no leg's training.steps changes: one warm-up step, no decay.)
flat=(--lr_scheduler.warmup_steps 1 --lr_scheduler.decay_ratio 0 --checkpoint.interval 1)
check "chain np4" run 4 "$tmp/chain" --training.steps 1 "${flat[@]}"
check "chain np2" run 2 "$tmp/chain" --training.steps 2 "${flat[@]}"
check "chain np1" run 1 "$tmp/chain" --training.steps 3 "${flat[@]}" --training.local_batch_size 2
check "chain zero1" run 2 "$tmp/chain" --training.steps 4 "${flat[@]}" \
  --parallelism.data_parallel_shard_mode zero1
check "chain back to fsdp" run 2 "$tmp/chain" --training.steps 5 "${flat[@]}"
check "np2 5 steps" run 2 "$tmp/np2_5" --training.steps 5 "${flat[@]}"
check "np4 -> np2 -> np1 -> zero1 -> fsdp = straight" same "$tmp/chain" "$tmp/np2_5" "${tol[@]}"
[ "$(grep -c '"loss"' "$tmp/chain/metrics.jsonl")" -eq 5 ] && ok || bad "the chain lost steps"
fi
rm -rf "$tmp/res22" "$tmp/chain" "$tmp/np2_5"

# --- the final HF export streams the last checkpoint: the same files as `ctitan export`
check "export np2" run 2 "$tmp/export" --checkpoint.last_save_in_hf true --training.steps 2
"$ct" export --checkpoint "$tmp/export/checkpoint/step-2" --output "$tmp/export_cli" >/dev/null &&
  cmp -s "$tmp/export/hf/model.safetensors" "$tmp/export_cli/model.safetensors" && ok ||
  bad "last_save_in_hf under FSDP differs from ctitan export"
if run 2 "$tmp/noexport" --checkpoint.last_save_in_hf true --checkpoint.enable false; then
  bad "last_save_in_hf without checkpoints: exit 0"
else
  grep -q "set checkpoint.enable = true" "$tmp/noexport.log" && ok ||
    bad "last_save_in_hf without checkpoints: $(grep error "$tmp/noexport.log")"
fi
# --- an HF folder as initial_load_path: each rank reads its ranges; the same run as one process
check "from hf np1" run 1 "$tmp/fromhf1" --checkpoint.initial_load_path "$tmp/export_cli" \
  --checkpoint.initial_load_in_hf true --training.local_batch_size 2
check "from hf np2" run 2 "$tmp/fromhf2" --checkpoint.initial_load_path "$tmp/export_cli" \
  --checkpoint.initial_load_in_hf true
check "from hf: np2 = np1" same "$tmp/fromhf2" "$tmp/fromhf1" "${tol[@]}"
if full; then
# ... and the checkpoint folder itself, its model in shards: the same weights, the same bits
check "from a sharded checkpoint np2" run 2 "$tmp/fromckpt2" \
  --checkpoint.initial_load_path "$tmp/export/checkpoint/step-2"
check "from a sharded checkpoint np2 = from its export" same "$tmp/fromckpt2" "$tmp/fromhf2" 0 0 0
fi
rm -rf "$tmp/export" "$tmp/export_cli" "$tmp"/fromhf* "$tmp"/fromckpt*

# --- bf16: parameters gathered in bf16 (MixedPrecisionPolicy), deterministic; near one process,
# whose norms and embedding stay fp32 (measured on the ids with torchtitan's init: losses rel
# 8.2e-4, grad norms 5.3e-4, weights 2.5e-4; bounds about 10 times that. Its tied output has
# unit-variance logits, so the embedding's bf16 rounding under FSDP moves the loss more than
# normal(0, 0.02) did: 1.7e-5 then, on the real vocabulary); a bf16 reduction runs and moves the
# curve
bf=(--training.mixed_precision_param bfloat16)
check "bf16 np1" run 1 "$tmp/bf1" "${bf[@]}" --training.local_batch_size 2
check "bf16 np2" run 2 "$tmp/bf2" "${bf[@]}"
bftol=(9e-3 8e-3 3e-3)
check "bf16 np2 near np1" same "$tmp/bf2" "$tmp/bf1" "${bftol[@]}"
grep -q "gathers in bfloat16" "$tmp/bf2.log" && ok || bad "bf16 gathers not logged"
if full; then
check "bf16 reduce np2" run 2 "$tmp/bf2r" "${bf[@]}" --training.mixed_precision_reduce bfloat16
[ "$(losses "$tmp/bf2r")" != "$(losses "$tmp/bf2")" ] && ok || bad "the bf16 reduction changed nothing"
check "bf16 reduce HSDP" run 4 "$tmp/bf4r" "${bf[@]}" --training.mixed_precision_reduce bfloat16 \
  --parallelism.data_parallel_replicate_degree 2
# Measured 8.9e-4, 7.5e-4, 2.5e-4: the bf16 sums add little to the bf16 gathers' difference.
check "bf16 reduce HSDP near np1" same "$tmp/bf4r" "$tmp/bf1" "${bftol[@]}"
fi
rm -rf "$tmp"/bf*

# --- MoE: the HF aux loss against ZeRO-1 on the same micro-batches; aux-free balancing (its
# expert bias a replicated buffer) against one process for the two steps before routing can part
moe=(--model.flavor debugmodel_moe --model.tie_embeddings true)
check "moe hf zero1" run 2 "$tmp/moez" "${moe[@]}" --model.load_balance hf \
  --parallelism.data_parallel_shard_mode zero1
check "moe hf fsdp" run 2 "$tmp/moef" "${moe[@]}" --model.load_balance hf
check "moe hf: fsdp = zero1" same "$tmp/moef" "$tmp/moez" "${tol[@]}"
if full; then
check "moe aux_free np1" run 1 "$tmp/moea1" "${moe[@]}" --model.load_balance aux_free \
  --model.load_balance_coeff 0.01 --training.local_batch_size 2 --training.global_batch_size 2
check "moe aux_free np2" run 2 "$tmp/moea2" "${moe[@]}" --model.load_balance aux_free \
  --model.load_balance_coeff 0.01 --training.global_batch_size 2
check "moe aux_free: np2 = np1" same "$tmp/moea2" "$tmp/moea1" "${tol[@]}" 2
fi
rm -rf "$tmp"/moe*

# --- failures on one rank end every rank, non-zero, within 60 s
fails rank_hang "rank [0-9]: .*FSDP unit.* did not complete within 5 s" 2 --debug.fault hang \
  --debug.fault_rank 1 --debug.fault_step 2 --comm.train_timeout_seconds 5
if full; then
# (the run's global batch of 4 would be refused at 3 ranks before any step: 3 here)
fails rank_exit "rank 1|\[\[[0-9]+,[0-9]+\],1\]" 3 --debug.fault exit --debug.fault_rank 1 \
  --debug.fault_step 2 --training.global_batch_size 3
grep -q "^step *1/" "$tmp/rank_exit.log" && ok || bad "rank_exit: no step ran before the fault"
fi
if full; then
# (the fault puts the id vocab_size + 7, here 2055, in rank 1's step-2 inputs)
fails bad_token "ctitan: error: rank 1: training data, step 2.*outside the vocabulary" 2 \
  --debug.fault bad_token --debug.fault_rank 1 --debug.fault_step 2
fi
# A NaN in one rank's gradients reaches every shard through the reduce-scatter: all skip step 2.
check "nan np2" run 2 "$tmp/nan" --debug.fault nan --debug.fault_rank 1 --debug.fault_step 2
grep -q "^step 2: non-finite gradient norm; step skipped" "$tmp/nan.log" && ok ||
  bad "NaN on rank 1: step 2 not skipped: $(grep -i 'skip\|error' "$tmp/nan.log" | head -3)"

# --- SIGUSR1 to mpirun: every rank saves the same step (its shards) and exits 138; the next run
# resumes it
sigusr1 "$tmp/usr1" model-00001-of-00002.safetensors
finish
