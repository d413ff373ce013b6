#!/usr/bin/env bash
# Tensor parallelism with sequence parallelism and loss parallel (issue 30), under real mpirun:
# TP=2, TP=4, TP=2 x DP=2 (HSDP 2 x 1 x 2) and TP=2 x FSDP=2 (2D) against one process on the
# same global batch (dense tied and untied, GQA with num_key_value_heads = tp, head_dim !=
# hidden/heads, fp32 and bf16; MoE without EP with HF's aux loss and with the aux-loss-free expert
# bias), the weights after 4 steps compared through the final HF export (assembled from the TP
# slices, under FSDP from the shards); the compositions (activation checkpointing, both attention
# kernels, block_causal, gradient accumulation, chat masks, attention bias, the chunked loss head,
# the guarded backend), the memory estimate's TP shares, a dead TP peer, and the refusals, each
# one line. The runs train on the text's ids in a vocabulary of 2048 (ids_setup); block_causal,
# the chat masks and the memory shares on the real tokenizer and vocabulary.
set -u
source "$(dirname "$0")/mpi_test.bash"
text_run_setup
ids_setup 2048
# Under the sanitizers (make check's second pass, a Debug build about 10x slower) the matrix is
# the optimised pass's job: this pass runs one case of each kind (dense TP=2, 2D with FSDP, MoE,
# the guarded backend, a hung peer, three refusals) for memory errors on the TP paths (full,
# mpi_test.bash).

# run NP DUMP [--key value ...]: the 2-layer debugmodel, 4 steps of 2 sequences of 32 tokens,
# 1 thread per rank, no checkpoints, the final weights exported to DUMP/hf.
run() {
  local np=$1 dump=$2; shift 2
  text_train "$np" "$dump" training.local_batch_size=2 training.global_batch_size=2 \
    checkpoint.enable=false checkpoint.last_save_in_hf=true -- "$@"
}
export -f run
# Measured on a 2-core x86-64 (Release), fp32 (tp2, tp4, tp2 x dp2, untied, 2D, the
# compositions): losses rel up to 3.0e-8, grad norms 7.2e-8, weights rel L2 1.3e-7 (tp4); bounds
# about 10 times that, within the issue's 1e-6 / 1e-5 / 1e-6 (weights: 8 times). bf16 against
# one bf16 process (the partial sums are reduced in fp32 and rounded once, where one process
# rounds the whole GEMM's output): 6.8e-5, 1.2e-4, 8.8e-5; 2D's below.
tol=(3e-7 7e-7 1e-6)
tol16=(2e-3 5e-3 9e-4)
tp() { local n=$1 dump=$2; shift 2; run "$n" "$dump" --parallelism.tensor_parallel_degree "$n" "$@"; }

check "np1" run 1 "$tmp/np1"
check "tp2 (GQA: 2 kv heads = tp)" tp 2 "$tmp/tp2"
check "tp2 = np1" same "$tmp/tp2" "$tmp/np1" "${tol[@]}"
grep -q "tensor parallel over 2 ranks with sequence parallelism and loss parallel" "$tmp/tp2.log" &&
  ok || bad "tp2 log lacks the TP line: $(grep '^parallel' "$tmp/tp2.log")"

mha=(--model.n_kv_heads 4)
if full; then
check "np1 kv4" run 1 "$tmp/np1_kv4" "${mha[@]}"
check "tp4" tp 4 "$tmp/tp4" "${mha[@]}"
check "tp4 = np1" same "$tmp/tp4" "$tmp/np1_kv4" "${tol[@]}"

# HSDP 2 x 1 x 2 (dp_replicate x dp_shard x tp): DDP over the replicas.
check "tp2 x dp2" run 4 "$tmp/tp2dp2" --parallelism.tensor_parallel_degree 2 \
  --parallelism.data_parallel_replicate_degree 2 --training.local_batch_size 1
check "tp2 x dp2 = np1" same "$tmp/tp2dp2" "$tmp/np1" "${tol[@]}"
fi

# 2D: each rank's TP-sliced model sharded over its FSDP group. Measured 2.3e-8, 7.1e-8, 8.3e-8.
# 3D, TP=2 x HSDP 2 x 2 on 8 ranks against one process of batch 4 (measured 5.8e-9, 4.2e-8,
# 7.8e-8; the optimised pass).
check "tp2 x fsdp2" run 4 "$tmp/tp2fsdp2" --parallelism.tensor_parallel_degree 2 \
  --parallelism.data_parallel_shard_degree 2 --training.local_batch_size 1
check "tp2 x fsdp2 = np1" same "$tmp/tp2fsdp2" "$tmp/np1" "${tol[@]}"
grep -q "tensor parallel over 2 ranks .*; FSDP: parameters, gradients and optimizer state sharded over 2" \
  "$tmp/tp2fsdp2.log" && ok || bad "tp2 x fsdp2 log lacks the 2D line: $(grep '^parallel' "$tmp/tp2fsdp2.log")"
if full; then
  check "np1 b4" run 1 "$tmp/np1_b4" --training.local_batch_size 4 --training.global_batch_size 4
  check "tp2 x hsdp 2x2" run 8 "$tmp/tp2hsdp" --parallelism.tensor_parallel_degree 2 \
    --parallelism.data_parallel_shard_degree 2 --parallelism.data_parallel_replicate_degree 2 \
    --training.local_batch_size 1 --training.global_batch_size 4
  check "tp2 x hsdp 2x2 = np1" same "$tmp/tp2hsdp" "$tmp/np1_b4" "${tol[@]}"
fi

bf16=(--training.mixed_precision_param bfloat16)
if full; then
check "np1 untied" run 1 "$tmp/np1_untied" --model.tie_embeddings false
check "tp2 untied" tp 2 "$tmp/tp2_untied" --model.tie_embeddings false
check "tp2 untied = np1" same "$tmp/tp2_untied" "$tmp/np1_untied" "${tol[@]}"


check "np1 bf16" run 1 "$tmp/np1_bf16" "${bf16[@]}"
check "tp2 bf16" tp 2 "$tmp/tp2_bf16" "${bf16[@]}"
check "tp2 bf16 = np1 bf16" same "$tmp/tp2_bf16" "$tmp/np1_bf16" "${tol16[@]}"
# FSDP's bf16 gathers round every weight, the norms too (MixedPrecisionPolicy): against FSDP=2
# bf16 on the same batch. Measured 2.1e-4, 4.7e-4, 8.8e-5.
check "fsdp2 bf16" run 2 "$tmp/fsdp2_bf16" --training.local_batch_size 1 "${bf16[@]}" \
  --checkpoint.enable true --checkpoint.interval 100
check "tp2 x fsdp2 bf16" run 4 "$tmp/tp2fsdp2_bf16" --parallelism.tensor_parallel_degree 2 \
  --parallelism.data_parallel_shard_degree 2 --training.local_batch_size 1 "${bf16[@]}"
check "tp2 x fsdp2 bf16 = fsdp2 bf16" same "$tmp/tp2fsdp2_bf16" "$tmp/fsdp2_bf16" "${tol16[@]}"
fi

# --- compositions: options against one process with the same ones (measured (loss, grad norm,
# weights) on the real vocabulary when each pair ran alone: ac full + sdpa 9.4e-9, 1.5e-8,
# 2.0e-8; ac op + chunked head 1.3e-8, 2.9e-8, 3.7e-8; block_causal + accumulation 5.3e-9,
# 1.6e-8, 1.4e-8; chat 1.0e-8, 4.6e-8, 2.2e-8; two pairs to a run now, on the real vocabulary:
# ac full + sdpa + block_causal + accumulation 7.1e-9, 1.6e-8, 1.6e-8; chat + ac op + chunked
# head 1.0e-8, 5.1e-8, 2.2e-8; attention bias on the ids 2.4e-8, 7.2e-8, 6.1e-8). The guarded
# run: 0, 0, 0.
compose() { # NAME [--key value ...]: np1 and tp2, compared at the fp32 tolerances
  local name=$1; shift
  check "np1 $name" run 1 "$tmp/np1_$name" "$@"
  check "tp2 $name" tp 2 "$tmp/tp2_$name" "$@"
  check "tp2 $name = np1" same "$tmp/tp2_$name" "$tmp/np1_$name" "${tol[@]}"
}
if full; then
# full AC on sdpa, with block_causal on packed documents (the text's lines, each ended by the
# real tokenizer's end-of-document id) and 2 micro-batches per step (global 4 = 2 x local 2)
compose ac_full_sdpa_block_accum --activation_checkpoint.mode full --model.attn_backend sdpa \
  --model.attn_mask_type block_causal --training.global_batch_size 4 "${real[@]}" \
  --training.dataset_path "$text0"
# chat masks: conversations of real text, the assistant turns trained (training.train_on)
"$CTITAN_PYTHON" - "$text0" "$tmp/chat.jsonl" <<'PY'
import json, sys
lines = [l.strip() for l in open(sys.argv[1], encoding="utf-8") if l.strip()]
with open(sys.argv[2], "w", encoding="utf-8") as f:
    for i in range(0, len(lines) - 2, 2):
        m = [{"role": "user", "content": lines[i]}, {"role": "assistant", "content": lines[i + 1]}]
        f.write(json.dumps({"messages": m}, ensure_ascii=False) + "\n")
PY
# ... with op-level AC and the chunked loss head
compose chat_ac_op_chunked --training.dataset_path "$tmp/chat.jsonl" --training.train_on assistant \
  --activation_checkpoint.mode selective --activation_checkpoint.selective_ac_option op \
  --training.loss_chunk_tokens 24 "${real[@]}"
grep -q "conversations rendered" "$tmp/tp2_chat_ac_op_chunked.log" && ok || bad "tp2 chat: no conversations"
# attention bias: np1's exported weights with q/k/v/o biases added (attention_bias: true), as an
# HF folder (model.n_layers 0, model.vocab_size 0: the architecture is config.json's, its
# vocabulary 2048)
"$CTITAN_PYTHON" "$(dirname "$0")/tp_add_bias.py" "$tmp/np1/hf" "$tmp/bias_hf" || bad "tp_add_bias.py"
compose bias --model.backend hf --model.hf_path "$tmp/bias_hf" --model.n_layers 0 \
  --model.vocab_size 0
fi
# guarded backend: the same TP run, bit for bit
check "tp2 guarded" tp 2 "$tmp/tp2_guard" --debug.guard_device_memory true
check "tp2 guarded = tp2" same "$tmp/tp2_guard" "$tmp/tp2" 0 0 0

if full; then
# --- the memory estimate's TP shares (the "memory, TP" and estimate lines, before any step), one
# step each on the real vocabulary, whose embedding and logits make the shares a real model's
# (measured: weights 0.493, activations 0.506).
# Weights: the debugmodel is weight-dominated (its 151936-row embedding); TP=2 holds half of
# every cut tensor and the replicated norms whole. Activations: 4 x 128 tokens, where the
# logits and the layers' buffers dominate; sequence parallelism keeps the residual stream's
# shard, loss parallel the logits' vocabulary half.
mib() { sed -n "s/^memory, TP: .* $1 \([0-9.]*\) MiB.*/\1/p" "$2"; }
mem=(--training.steps 1 --training.seq_len 128 --training.local_batch_size 4
  --training.global_batch_size 4 --checkpoint.last_save_in_hf false "${real[@]}")
check "np1 mem" run 1 "$tmp/np1_mem" "${mem[@]}"
check "tp2 mem" tp 2 "$tmp/tp2_mem" "${mem[@]}"
"$CTITAN_PYTHON" - "$tmp/np1_mem.log" "$tmp/tp2_mem.log" <<'PY' && ok || bad "TP memory shares"
import re, sys
def parse(path):
    for l in open(path):
        m = re.match(r"memory estimate per rank: params ([0-9.]+) GiB.*activations [0-9.]+ GiB \(([0-9.]+) MiB", l)
        if m: return float(m.group(1)), float(m.group(2))
(w1, a1), (w2, a2) = parse(sys.argv[1]), parse(sys.argv[2])
print(f"TP=2 / one process: weights {w2 / w1:.3f}, activations {a2 / a1:.3f} ({a2:.1f} / {a1:.1f} MiB)")
sys.exit(0 if w2 / w1 <= 0.52 and a2 / a1 <= 0.55 else 1)
PY
fi

# --- a hung or dead TP peer: every rank ends, non-zero, within the comm timeout, the wait named
fails tp_hang "a tensor-parallel .* did not complete within 5 s" 2 \
  --parallelism.tensor_parallel_degree 2 --debug.fault hang --debug.fault_rank 1 \
  --debug.fault_step 2 --comm.train_timeout_seconds 5
if full; then
fails tp_exit "rank 1|\[\[[0-9]+,[0-9]+\],1\]" 2 --parallelism.tensor_parallel_degree 2 \
  --debug.fault exit --debug.fault_rank 1 --debug.fault_step 2
fi

# --- MoE without EP (debugmodel_moe: 8 experts of width 128, top-2, every layer sparse): the
# router replicated, every expert's gate/up rows and down columns cut. HF's aux loss in the loss
# (coefficient 0.1, so that its gradient counts), and the aux-loss-free expert bias (0.01: it
# moves the losses 6.4e-5 and the weights 4.6e-4 away from no balancing in these 4 steps,
# hundreds of times the bounds). Measured on a 2-core x86-64 (Release), fp32 (tp2, tp4, tp2 x
# dp2, aux-free, full AC): losses rel up to 1.3e-8, grad norms 1.7e-8, weights rel L2 1.0e-8;
# bf16 (moe_bf16 expert kernels) against one bf16 process: 1.9e-5, 1.3e-5, 1.2e-5. Break-tests,
# on the real vocabulary: the aux gradient added on every TP rank (tp times) moves tp2 and tp2 x
# dp2 by 1.1e-6, 3.1e-4, 5.7e-6; the routing statistics summed over the world (every token
# counted tp times: the aux value does not change, its gradient E * load_e / rows^2 shrinks tp
# times) by 6.3e-6, 7.2e-5, 4.8e-6.
tolmoe=(1e-7 2e-7 1e-7)
tolmoe16=(2e-4 1.3e-4 1.2e-4)
hf=(--model.flavor debugmodel_moe --model.load_balance hf --model.output_router_logits true
    --model.router_aux_loss_coef 0.1)
free=(--model.flavor debugmodel_moe --model.load_balance aux_free --model.load_balance_coeff 0.01)
check "np1 moe" run 1 "$tmp/np1_moe" "${hf[@]}"
check "tp2 moe" tp 2 "$tmp/tp2_moe" "${hf[@]}"
check "tp2 moe = np1" same "$tmp/tp2_moe" "$tmp/np1_moe" "${tolmoe[@]}"
if full; then
check "np1 moe kv4" run 1 "$tmp/np1_moe_kv4" "${hf[@]}" "${mha[@]}"
check "tp4 moe" tp 4 "$tmp/tp4_moe" "${hf[@]}" "${mha[@]}"
check "tp4 moe = np1" same "$tmp/tp4_moe" "$tmp/np1_moe_kv4" "${tolmoe[@]}"
# The statistics are summed over the data-parallel ranks only (each TP rank routes all rows).
check "tp2 x dp2 moe (full AC)" run 4 "$tmp/tp2dp2_moe" "${hf[@]}" \
  --parallelism.tensor_parallel_degree 2 --parallelism.data_parallel_replicate_degree 2 \
  --training.local_batch_size 1 --activation_checkpoint.mode full
check "tp2 x dp2 moe = np1" same "$tmp/tp2dp2_moe" "$tmp/np1_moe" "${tolmoe[@]}"
check "np1 moe aux-free" run 1 "$tmp/np1_free" "${free[@]}"
check "tp2 x dp2 moe aux-free" run 4 "$tmp/tp2dp2_free" "${free[@]}" \
  --parallelism.tensor_parallel_degree 2 --parallelism.data_parallel_replicate_degree 2 \
  --training.local_batch_size 1
check "tp2 x dp2 moe aux-free = np1" same "$tmp/tp2dp2_free" "$tmp/np1_free" "${tolmoe[@]}"
check "np1 moe bf16" run 1 "$tmp/np1_moe_bf16" "${hf[@]}" "${bf16[@]}"
check "tp2 moe bf16" tp 2 "$tmp/tp2_moe_bf16" "${hf[@]}" "${bf16[@]}"
check "tp2 moe bf16 = np1 bf16" same "$tmp/tp2_moe_bf16" "$tmp/np1_moe_bf16" "${tolmoe16[@]}"
fi

# --- refusals: one line each, naming the key and both numbers
refused heads "tensor_parallel_degree = 3 does not divide the model's num_attention_heads = 4" 3 \
  --parallelism.tensor_parallel_degree 3 --training.seq_len 30
if full; then
refused kv_heads "tensor_parallel_degree = 4 does not divide the model's num_key_value_heads = 2" 4 \
  --parallelism.tensor_parallel_degree 4
refused ffn "tensor_parallel_degree = 2 does not divide the model's intermediate_size = 511" 2 \
  --parallelism.tensor_parallel_degree 2 --model.ffn_dim 511
refused seq_len "tensor_parallel_degree = 2 does not divide training.seq_len = 33" 2 \
  --parallelism.tensor_parallel_degree 2 --training.seq_len 33
refused moe_ffn "tensor_parallel_degree = 2 does not divide the model's moe_intermediate_size = 127" \
  2 --parallelism.tensor_parallel_degree 2 --model.flavor debugmodel_moe \
  --model.moe_intermediate_size 127
refused zero1 "ZeRO-1 under tensor parallelism is not supported yet" 4 \
  --parallelism.tensor_parallel_degree 2 --parallelism.data_parallel_shard_mode zero1
fi
refused async "enable_async_tensor_parallel" 2 \
  --parallelism.tensor_parallel_degree 2 --parallelism.enable_async_tensor_parallel true
finish
