#!/usr/bin/env bash
# The guarded backend (--debug.guard_device_memory): every model, gradient, optimizer and
# activation buffer is inaccessible outside backend calls, so any host code that reads or writes
# backend memory past the seam crashes. Each run below goes twice, on the plain CPU backend and
# on the guarded one, and must give the same bits: losses, gradient norms, checkpoints (weights
# and AdamW moments), exports and verify's numbers. Covered: dense and MoE (HF aux loss and
# aux-free bias), both expert kernels, flash and sdpa, activation checkpointing (full and op),
# the chunked loss head, gradient accumulation, clipping, bf16 mixed precision (oneDNN's kernels
# through the bound table), a plugin kernel, checkpoint save and resume, mpirun with ZeRO-1,
# replicated state, FSDP (fp32, and bf16 with a bf16 reduction) and HSDP (4 ranks), verify,
# export and check-kernels.
set -u
: "${CTITAN_BIN:?run through ctest}" "${CTITAN_REF_DIR:?}" "${CTITAN_TMP:?}" "${CTITAN_BUILD_DIR:?}"
source "$(dirname "$0")/mpi_test.bash"
ct=$CTITAN_BIN tmp=$CTITAN_TMP
rm -rf "$tmp"; mkdir -p "$tmp"
dense=$CTITAN_REF_DIR/train/warmup_cosine_clip_accum_untied
moe=$CTITAN_REF_DIR/train/moe_hf_aux_clip_accum
guard=(--debug.guard_device_memory=true)

# train DUMP CASE [--key value ...]: STEPS (4) steps of 2 micro-batches, clipped, a checkpoint
# every 2.
train() {
  local dump=$1 case=$2; shift 2
  "$ct" train --model.backend hf --model.hf_path "$case/hf" \
    --training.dataset_path "$case/tokens.npy" --training.seq_len 5 \
    --training.local_batch_size 2 --training.global_batch_size 4 --training.steps "${STEPS:-4}" \
    --training.max_norm 0.5 --optimizer.lr 3e-3 --lr_scheduler.warmup_steps 1 \
    --metrics.log_freq 1 --metrics.peak_gflops 100 --checkpoint.interval 2 \
    --checkpoint.keep_latest_k 0 --job.dump_folder "$dump" "$@" >"$dump.log" 2>&1
}
source "$(dirname "$0")/same_run.bash" # numbers, same_run
# pair NAME CASE [--key value ...]: plain and guarded, the same bits
pair() {
  local name=$1 case=$2; shift 2
  if ! train "$tmp/$name.plain" "$case" "$@"; then bad "$name (plain): $(tail -3 "$tmp/$name.plain.log")"; return; fi
  if ! train "$tmp/$name.guard" "$case" "$@" "${guard[@]}"; then
    bad "$name (guarded): $(tail -3 "$tmp/$name.guard.log")"; return
  fi
  local why
  why=$(same_run "$tmp/$name.plain" "$tmp/$name.guard") && ok || bad "$name: $why"
}

pair dense_sdpa_full_ac "$dense" --model.attn_backend sdpa --activation_checkpoint.mode full
pair dense_flash_op_ac_chunked "$dense" --model.attn_backend flash \
  --activation_checkpoint.mode selective --activation_checkpoint.selective_ac_option op \
  --training.loss_chunk_tokens 3
pair moe_grouped_hf_aux "$moe" --model.moe_impl grouped --model.load_balance hf
pair moe_loop_aux_free "$moe" --model.moe_impl loop --model.load_balance aux_free \
  --model.load_balance_coeff 0.01 --activation_checkpoint.mode full
pair moe_bf16 "$moe" --training.mixed_precision_param bfloat16
pair dense_plugin "$dense" --override.imports "$CTITAN_BUILD_DIR/examples/kernels/librope_hf_avx2.so"
grep -q "cpu-guarded" "$tmp/dense_plugin.guard.log" && ok || bad "the guarded run does not say its backend"

# --- resume: a guarded run stopped at step 2 and resumed gives a plain straight run's bits (a
# constant LR after warmup, so that the first leg's shorter run does not change the schedule)
const=(--lr_scheduler.decay_ratio 0)
train "$tmp/straight.plain" "$dense" "${const[@]}" || bad "straight: $(tail -3 "$tmp/straight.plain.log")"
STEPS=2 train "$tmp/resume.guard" "$dense" "${const[@]}" "${guard[@]}" &&
  train "$tmp/resume.guard" "$dense" "${const[@]}" "${guard[@]}" &&
  grep -q "resumed from .*step-2" "$tmp/resume.guard.log" &&
  ok || bad "guarded resume: $(tail -3 "$tmp/resume.guard.log")"
why=$(same_run "$tmp/straight.plain" "$tmp/resume.guard") && ok || bad "guarded resume: $why"

# --- under mpirun: ZeRO-1 (fp32, and bf16 with a bf16 reduction) and replicated optimizer
# state (2 ranks), FSDP in fp32 and in bf16 with a bf16 reduction (2 ranks), HSDP (2 replica
# groups x 2 shard ranks). Every collective is the backend's, and the guarded one opens exactly
# the buffers a collective touches while it is in flight: the buckets, the gathers, the
# reduce-scatter ring's sends and receives, the all-reduces.
for mode in zero1 zero1_bf16 replicated fsdp fsdp_bf16 hsdp; do
  np=2 opts=(--training.local_batch_size 1)
  case $mode in
    zero1) opts+=(--parallelism.data_parallel_shard_mode zero1) ;;
    zero1_bf16) opts+=(--parallelism.data_parallel_shard_mode zero1
      --training.mixed_precision_param bfloat16 --training.mixed_precision_reduce bfloat16) ;;
    replicated) opts+=(--parallelism.data_parallel_shard_mode zero1
      --parallelism.data_parallel_replicate_degree 2 --parallelism.data_parallel_shard_degree 1) ;;
    fsdp_bf16) opts+=(--training.mixed_precision_param bfloat16
      --training.mixed_precision_reduce bfloat16) ;;
    hsdp) np=4 opts+=(--parallelism.data_parallel_replicate_degree 2) ;;
  esac
  for side in plain guard; do
    extra=(); [ $side = guard ] && extra=("${guard[@]}")
    d=$tmp/np${np}_$mode.$side
    mpirun --oversubscribe --bind-to none -np $np "$ct" train --model.backend hf \
      --model.hf_path "$moe/hf" --training.dataset_path "$moe/tokens.npy" \
      --training.seq_len 5 --training.global_batch_size 4 --training.steps 4 \
      --training.max_norm 0.5 --metrics.log_freq 1 --metrics.peak_gflops 100 \
      --checkpoint.interval 2 --checkpoint.keep_latest_k 0 --job.dump_folder "$d" \
      --parallelism.threads_per_rank 1 "${opts[@]}" "${extra[@]}" >"$d.log" 2>&1 ||
      bad "np$np $mode ($side): $(tail -3 "$d.log")"
  done
  why=$(same_run "$tmp/np${np}_$mode.plain" "$tmp/np${np}_$mode.guard") && ok || bad "np$np $mode: $why"
done
grep -q "FSDP over 2 ranks" "$tmp/np2_fsdp.guard.log" && ok || bad "the guarded FSDP run is not FSDP"
grep -q "HSDP" "$tmp/np4_hsdp.guard.log" && ok || bad "the guarded HSDP run is not HSDP"

# --- verify, export and check-kernels under the guard
ckpt=$tmp/moe_grouped_hf_aux.plain/checkpoint/step-4
verify_numbers() { # the --json object without its timings and memory
  "$ct" verify --model.hf_path "$1" --training.dataset_path "$moe/tokens.npy" \
    --training.seq_len 5 --training.local_batch_size 2 --json "${@:2}" |
    sed -E 's/,"(peak_rss_mib|forward_ms|backward_ms)":[0-9.e+-]+//g'
}
for side in plain guard; do
  extra=(); [ $side = guard ] && extra=("${guard[@]}")
  "$ct" export --checkpoint "$ckpt" --output "$tmp/export.$side" --dtype float32 \
    "${extra[@]}" >"$tmp/export.$side.log" 2>&1 || bad "export ($side): $(tail -3 "$tmp/export.$side.log")"
  verify_numbers "$tmp/export.$side" "${extra[@]}" >"$tmp/verify.$side.json" 2>"$tmp/verify.$side.log" ||
    bad "verify ($side): $(tail -3 "$tmp/verify.$side.log")"
  "$ct" check-kernels --override.imports "$CTITAN_BUILD_DIR/examples/kernels/librope_hf_avx2.so" \
    "${extra[@]}" >"$tmp/check.$side.log" 2>&1 || bad "check-kernels ($side): $(tail -3 "$tmp/check.$side.log")"
done
cmp -s "$tmp/export.plain/model.safetensors" "$tmp/export.guard/model.safetensors" && ok ||
  bad "guarded export differs"
[ -s "$tmp/verify.plain.json" ] && cmp -s "$tmp/verify.plain.json" "$tmp/verify.guard.json" && ok ||
  bad "guarded verify differs: $(diff "$tmp/verify.plain.json" "$tmp/verify.guard.json" | head -c 600)"
grep -q '"loss"' "$tmp/verify.plain.json" && ok || bad "verify printed no loss: $(head -c 300 "$tmp/verify.plain.json")"

finish
