#!/usr/bin/env bash
# Tensor parallelism with sequence parallelism and loss parallel (issue 30), under real mpirun:
# TP=2, TP=4 and TP=2 x DP=2 against one process on the same global batch (dense tied and
# untied, GQA with num_key_value_heads = tp, head_dim != hidden/heads, fp32 and bf16), the
# weights after 4 steps compared through the final HF export (assembled from the TP slices),
# and the refusals, each one line.
set -u
source "$(dirname "$0")/mpi_test.bash"
text_run_setup

# run NP DUMP [--key value ...]: the 2-layer debugmodel, 4 steps of 2 sequences of 32 tokens,
# 1 thread per rank, no checkpoints, the final weights exported to DUMP/hf.
run() {
  local np=$1 dump=$2; shift 2
  text_train "$np" "$dump" training.local_batch_size=2 training.global_batch_size=2 \
    checkpoint.enable=false checkpoint.last_save_in_hf=true -- "$@"
}
export -f run
# Measured on a 2-core x86-64 (Release), fp32 (tp2, tp4, tp2 x dp2, untied): losses rel up to
# 1.5e-8, grad norms 4.4e-8, weights rel L2 3.7e-8; bounds about 10 times that, within the
# issue's 1e-6 / 1e-5 / 1e-6. bf16 against one bf16 process (the partial sums are reduced in
# fp32 and rounded once, where one process rounds the whole GEMM's output): 3.1e-5, 3.9e-5,
# 1.9e-5.
tol=(2e-7 5e-7 4e-7)
tol16=(3e-4 4e-4 2e-4)
tp() { local n=$1 dump=$2; shift 2; run "$n" "$dump" --parallelism.tensor_parallel_degree "$n" "$@"; }

check "np1" run 1 "$tmp/np1"
check "tp2 (GQA: 2 kv heads = tp)" tp 2 "$tmp/tp2"
check "tp2 = np1" same "$tmp/tp2" "$tmp/np1" "${tol[@]}"
grep -q "tensor parallel over 2 ranks with sequence parallelism and loss parallel" "$tmp/tp2.log" &&
  ok || bad "tp2 log lacks the TP line: $(grep '^parallel' "$tmp/tp2.log")"

mha=(--model.n_kv_heads 4)
check "np1 kv4" run 1 "$tmp/np1_kv4" "${mha[@]}"
check "tp4" tp 4 "$tmp/tp4" "${mha[@]}"
check "tp4 = np1" same "$tmp/tp4" "$tmp/np1_kv4" "${tol[@]}"

check "tp2 x dp2" run 4 "$tmp/tp2dp2" --parallelism.tensor_parallel_degree 2 \
  --parallelism.data_parallel_replicate_degree 2 --training.local_batch_size 1
check "tp2 x dp2 = np1" same "$tmp/tp2dp2" "$tmp/np1" "${tol[@]}"

check "np1 untied" run 1 "$tmp/np1_untied" --model.tie_embeddings false
check "tp2 untied" tp 2 "$tmp/tp2_untied" --model.tie_embeddings false
check "tp2 untied = np1" same "$tmp/tp2_untied" "$tmp/np1_untied" "${tol[@]}"

bf16=(--training.mixed_precision_param bfloat16)
check "np1 bf16" run 1 "$tmp/np1_bf16" "${bf16[@]}"
check "tp2 bf16" tp 2 "$tmp/tp2_bf16" "${bf16[@]}"
check "tp2 bf16 = np1 bf16" same "$tmp/tp2_bf16" "$tmp/np1_bf16" "${tol16[@]}"

# --- refusals: one line each, naming the key and both numbers
refused() { # NAME PATTERN NP [--key value ...]
  local name=$1 pattern=$2 np=$3; shift 3
  if run "$np" "$tmp/$name" "$@"; then bad "$name: the run was not refused"; return; fi
  local n
  n=$(grep -c "^ctitan: error" "$tmp/$name.log")
  if [ "$n" = 1 ] && grep -qE -- "$pattern" "$tmp/$name.log"; then ok; else
    bad "$name: $n error line(s): $(grep '^ctitan: error' "$tmp/$name.log" | head -2)"; fi
}
refused heads "tensor_parallel_degree = 3 does not divide the model's num_attention_heads = 4" 3 \
  --parallelism.tensor_parallel_degree 3 --training.seq_len 30
refused kv_heads "tensor_parallel_degree = 4 does not divide the model's num_key_value_heads = 2" 4 \
  --parallelism.tensor_parallel_degree 4
refused ffn "tensor_parallel_degree = 2 does not divide the model's intermediate_size = 511" 2 \
  --parallelism.tensor_parallel_degree 2 --model.ffn_dim 511
refused seq_len "tensor_parallel_degree = 2 does not divide training.seq_len = 33" 2 \
  --parallelism.tensor_parallel_degree 2 --training.seq_len 33
refused moe "MoE models \(num_experts = 8\) are not supported under tensor parallelism yet" 2 \
  --parallelism.tensor_parallel_degree 2 --model.flavor debugmodel_moe
refused fsdp "FSDP, HSDP and ZeRO-1 under tensor parallelism are not supported yet" 4 \
  --parallelism.tensor_parallel_degree 2
refused async "enable_async_tensor_parallel" 2 \
  --parallelism.tensor_parallel_degree 2 --parallelism.enable_async_tensor_parallel true
finish
