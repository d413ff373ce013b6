#!/usr/bin/env bash
# Checkpoints under tensor parallelism (issue 30), under real mpirun: a TP checkpoint holds one
# model and one optimizer shard per TP rank over flat ranges of the one-process layout, so it
# resumes at the same TP degree bit for bit, and at one process, FSDP=2 and TP=4 as the
# uninterrupted run continues; a one-process checkpoint resumes at TP=2; under TP x FSDP (2D,
# and 3D with HSDP) each TP rank's local model is assembled from its FSDP shards into the same
# layout, so it resumes at TP x FSDP bit for bit, at one process, and the reverse; a TP
# checkpoint or an HF folder as initial_load_path loads each rank's slices; the final HF export
# under TP and `ctitan export` of a TP checkpoint are the files one process exports for the same
# weights, byte for byte. The runs train on the text's ids in a vocabulary of 2048 (ids_setup);
# the two lr 0 runs whose exports are compared, tokenizer files too, on the real tokenizer and
# vocabulary.
set -u
source "$(dirname "$0")/mpi_test.bash"
text_run_setup
ids_setup 2048

# run NP DUMP [--key value ...]: the 2-layer debugmodel with 4 kv heads (TP=4 divides it), 4
# steps of 2 sequences of 32 tokens, a checkpoint every step, a flat schedule (one warm-up step,
# no decay: no leg's training.steps changes it). The last checkpoint is exported to DUMP/hf,
# which `same` compares (checkpoint.last_save_in_hf's folder, if any, becomes DUMP/hf_train).
run() {
  local np=$1 dump=$2; shift 2
  text_train "$np" "$dump" training.local_batch_size=2 training.global_batch_size=2 \
    model.n_kv_heads=4 checkpoint.enable=true checkpoint.interval=1 \
    lr_scheduler.warmup_steps=1 lr_scheduler.decay_ratio=0 -- "$@" || return
  local last
  last=$(ls -d "$dump"/checkpoint/step-* 2>/dev/null | sort -t- -k2 -n | tail -1)
  rm -rf "$dump/hf_train"; [ ! -d "$dump/hf" ] || mv "$dump/hf" "$dump/hf_train"
  [ -z "$last" ] || "$ct" export --checkpoint "$last" --output "$dump/hf" >/dev/null
}
export -f run
tp() { local n=$1 dump=$2; shift 2; run "$n" "$dump" --parallelism.tensor_parallel_degree "$n" "$@"; }
# resume FROM DUMP NP [--key value ...]: a copy of FROM's folder (its checkpoint of step 2 and
# its first two metrics rows) trained on to step 4 at NP ranks.
resume() {
  local from=$1 dump=$2 np=$3; shift 3
  rm -rf "$dump"; cp -r "$from" "$dump"; rm -rf "$dump/hf"
  run "$np" "$dump" "$@" && grep -q "resumed from .*step-2 " "$dump.log"
}
# Measured on a 2-core x86-64 (Release), fp32, against the uninterrupted one-process run (the
# first two steps at the saving degree, the last two at the loading one): TP=2 -> one process
# losses rel 3.3e-8, grad norms 2.8e-8, weights rel L2 2.5e-7; -> FSDP=2 3.1e-8, 4.3e-8, 2.5e-7;
# -> TP=4 1.4e-8, 6.5e-8, 2.5e-7; one process -> TP=2 2.0e-8, 5.2e-8, 8.7e-9; TP=2 x DP=2 -> one
# process 3.0e-8, 5.5e-8, 2.7e-7 (the weights differ most where the first steps ran under TP).
# Bounds as tp.sh's, about 10 times that; the weights' 3.7 times, the issue's 1e-6. TP=2 ->
# TP=2: 0.
tol=(3e-7 7e-7 1e-6)

check "np1" run 1 "$tmp/np1"
check "tp2" tp 2 "$tmp/tp2"
ls "$tmp/tp2/checkpoint/step-4/model-00001-of-00002.safetensors" \
  "$tmp/tp2/checkpoint/step-4/optimizer-00001-of-00002.safetensors" >/dev/null &&
  [ ! -e "$tmp/tp2/checkpoint/step-4/model.safetensors" ] && ok ||
  bad "tp2's checkpoint is not one model and one optimizer shard per TP rank"
check "tp2 2 steps" tp 2 "$tmp/tp2_leg" --training.steps 2

# --- a TP=2 checkpoint resumed at TP=2 (bit for bit), one process, FSDP=2 and TP=4
check "tp2 -> tp2" resume "$tmp/tp2_leg" "$tmp/tp2_tp2" 2 --parallelism.tensor_parallel_degree 2
check "tp2 -> tp2 = tp2, bit for bit" same "$tmp/tp2_tp2" "$tmp/tp2" 0 0 0
check "tp2 -> np1" resume "$tmp/tp2_leg" "$tmp/tp2_np1" 1
check "tp2 -> np1 = np1" same "$tmp/tp2_np1" "$tmp/np1" "${tol[@]}"
if ! sanitized_build; then # the optimised pass: the other degrees
check "tp2 -> fsdp2" resume "$tmp/tp2_leg" "$tmp/tp2_fsdp2" 2 --training.local_batch_size 1
check "tp2 -> fsdp2 = np1" same "$tmp/tp2_fsdp2" "$tmp/np1" "${tol[@]}"
check "tp2 -> tp4" resume "$tmp/tp2_leg" "$tmp/tp2_tp4" 4 --parallelism.tensor_parallel_degree 4
check "tp2 -> tp4 = np1" same "$tmp/tp2_tp4" "$tmp/np1" "${tol[@]}"

# --- a one-process checkpoint resumed at TP=2; TP=2 x DP=2's resumed at one process
check "np1 2 steps" run 1 "$tmp/np1_leg" --training.steps 2
check "np1 -> tp2" resume "$tmp/np1_leg" "$tmp/np1_tp2" 2 --parallelism.tensor_parallel_degree 2
check "np1 -> tp2 = np1" same "$tmp/np1_tp2" "$tmp/np1" "${tol[@]}"
check "tp2 x dp2 2 steps" run 4 "$tmp/tp2dp2_leg" --training.steps 2 \
  --parallelism.tensor_parallel_degree 2 --parallelism.data_parallel_replicate_degree 2 \
  --training.local_batch_size 1
check "tp2 x dp2 -> np1" resume "$tmp/tp2dp2_leg" "$tmp/tp2dp2_np1" 1
check "tp2 x dp2 -> np1 = np1" same "$tmp/tp2dp2_np1" "$tmp/np1" "${tol[@]}"

# --- TP x FSDP (2D): each TP rank's local model assembled from its FSDP shard group's pieces
# and written in TP=2's layout, so it resumes at TP=2 x FSDP=2 bit for bit, at one process, and
# a TP=2 checkpoint resumes under 2D. The 2D run's own step 2 is the leg (its later steps and
# metrics rows dropped). Measured: 2D -> 2D 0, 0, 0; 2D -> one process 3.0e-8, 5.5e-8, 2.7e-7;
# TP=2 -> 2D 1.6e-8, 4.5e-8, 2.5e-7.
d2=(--parallelism.tensor_parallel_degree 2 --parallelism.data_parallel_shard_degree 2
    --training.local_batch_size 1)
check "tp2 x fsdp2" run 4 "$tmp/tp2fsdp2" "${d2[@]}"
leg() { # FROM DUMP: FROM's folder as it was after step 2
  rm -rf "$2"; cp -r "$1" "$2"; rm -rf "$2"/checkpoint/step-[34]
  head -2 "$1/metrics.jsonl" >"$2/metrics.jsonl"
}
leg "$tmp/tp2fsdp2" "$tmp/tp2fsdp2_leg"
check "tp2 x fsdp2 -> tp2 x fsdp2" resume "$tmp/tp2fsdp2_leg" "$tmp/2d_2d" 4 "${d2[@]}"
check "tp2 x fsdp2 -> tp2 x fsdp2 = tp2 x fsdp2, bit for bit" same "$tmp/2d_2d" "$tmp/tp2fsdp2" 0 0 0
check "tp2 x fsdp2 -> np1" resume "$tmp/tp2fsdp2_leg" "$tmp/2d_np1" 1
check "tp2 x fsdp2 -> np1 = np1" same "$tmp/2d_np1" "$tmp/np1" "${tol[@]}"
check "tp2 -> tp2 x fsdp2" resume "$tmp/tp2_leg" "$tmp/tp2_2d" 4 "${d2[@]}"
check "tp2 -> tp2 x fsdp2 = np1" same "$tmp/tp2_2d" "$tmp/np1" "${tol[@]}"
# 3D, TP=2 x HSDP 2 x 2 on 8 ranks, resumed at one process of batch 4 (measured 1.9e-8, 2.8e-8,
# 1.8e-7; the optimised pass).
if full; then
  b4=(--training.local_batch_size 4 --training.global_batch_size 4)
  check "np1 b4" run 1 "$tmp/np1_b4" "${b4[@]}"
  check "tp2 x hsdp 2x2 2 steps" run 8 "$tmp/3d_leg" --training.steps 2 "${d2[@]}" \
    --parallelism.data_parallel_replicate_degree 2 --training.global_batch_size 4
  check "tp2 x hsdp 2x2 -> np1" resume "$tmp/3d_leg" "$tmp/3d_np1" 1 "${b4[@]}"
  check "tp2 x hsdp 2x2 -> np1 = np1" same "$tmp/3d_np1" "$tmp/np1_b4" "${tol[@]}"
fi

# --- initial_load_path at TP=2: a TP checkpoint's folder (model shards) and its HF export give
# the same weights (bit for bit), each rank reading its slices; the HF folder as one process
# (4 steps at TP=2 against one process, measured: 2.1e-8, 5.8e-8, 1.3e-7)
hf=(--checkpoint.initial_load_in_hf true)
check "tp2 from a TP checkpoint" tp 2 "$tmp/from_ckpt" \
  --checkpoint.initial_load_path "$tmp/tp2_leg/checkpoint/step-2"
check "tp2 from its HF export" tp 2 "$tmp/from_hf" --checkpoint.initial_load_path "$tmp/tp2_leg/hf" \
  "${hf[@]}"
check "np1 from the HF export" run 1 "$tmp/from_hf1" --checkpoint.initial_load_path \
  "$tmp/tp2_leg/hf" "${hf[@]}"
check "from a TP checkpoint = from its export, bit for bit" same "$tmp/from_ckpt" "$tmp/from_hf" 0 0 0
check "from the HF export: tp2 = np1" same "$tmp/from_hf" "$tmp/from_hf1" "${tol[@]}"
grep -q "weights: .*(a checkpoint's model shards)" "$tmp/from_ckpt.log" && ok ||
  bad "tp2 did not load the checkpoint's model shards: $(grep '^weights' "$tmp/from_ckpt.log")"

# --- the export: lr 0 keeps the seeded init (TP's init is one process's, sliced), so both runs
# hold the same weights. The final export under TP (streamed, tensor by tensor) and `ctitan
# export` of the TP checkpoint are one process's export, byte for byte (tokenizer files too: these
# runs keep the real tokenizer and vocabulary).
zero=(--optimizer.lr 0 --training.steps 1 --checkpoint.last_save_in_hf true "${real[@]}")
check "np1 lr 0" run 1 "$tmp/np1_lr0" "${zero[@]}"
check "tp2 lr 0" tp 2 "$tmp/tp2_lr0" "${zero[@]}"
exported() { # A B: the same HF folder, byte for byte
  [ -s "$1/model.safetensors" ] && [ -s "$1/tokenizer.json" ] && diff -r "$1" "$2" >/dev/null
}
check "tp2's final export = np1's" exported "$tmp/tp2_lr0/hf_train" "$tmp/np1_lr0/hf_train"
check "ctitan export of tp2's checkpoint = np1's" exported "$tmp/tp2_lr0/hf" "$tmp/np1_lr0/hf_train"
check "np1's final export = its ctitan export" exported "$tmp/np1_lr0/hf" "$tmp/np1_lr0/hf_train"
grep -q "export: .*assembled from the TP slices, with tokenizer files" "$tmp/tp2_lr0.log" && ok ||
  bad "tp2's export line: $(grep '^export' "$tmp/tp2_lr0.log")"
fi
finish
