#!/usr/bin/env bash
# Context parallelism (issue 32): ring attention over headtail sequence shards, under real mpirun,
# against one process on the same global batch. Causal: CP=2 (with validation; both rotate
# methods and the guarded backend, the same bits), CP=2 x FSDP=2, bf16 is block-causal below.
# Block-causal (packed documents, each line of the text one, so that documents cross chunks and
# ranks), against one process on sdpa: CP=2, CP=4, CP=2 x TP=2 with sdpa too, bf16 (op-level checkpointing, ZeRO-1), MoE at seq 1024 (flash's
# tiles crossed inside each chunk; HF's aux loss, its routing statistics summed over the CP
# ranks, full activation checkpointing, 2 micro-batches); EP beside CP (fp32 against one
# process, bf16 against CP alone); a CP=4 checkpoint resumed at CP=4 (bit
# for bit), CP=2 and one process; the weights after the last step compared through the final HF
# export; a hung ring peer; the refusals, one line each. The runs train on the text's ids in a
# vocabulary of 2048 (ids_setup), the block-causal ones (documents) on the real tokenizer and
# vocabulary.
set -u
source "$(dirname "$0")/mpi_test.bash"
text_run_setup
ids_setup 2048
# Under the sanitizers (full, mpi_test.bash) one case of each kind: CP=2 both methods with the
# guarded backend, CP=2 block-causal, the hang, the refusals.

# run NP DUMP [--key value ...]: the 2-layer debugmodel, 4 steps of 2 sequences of 64 tokens,
# 1 thread per rank, the final weights exported to DUMP/hf (FSDP's export streams the last
# checkpoint, so checkpoints are on).
run() {
  local np=$1 dump=$2; shift 2
  text_train "$np" "$dump" training.seq_len=64 training.local_batch_size=2 \
    training.global_batch_size=2 checkpoint.enable=true checkpoint.interval=100 \
    checkpoint.last_save_in_hf=true -- "$@"
}
export -f run
cpn() { local n=$1 dump=$2; shift 2; run "$n" "$dump" --parallelism.context_parallel_degree "$n" "$@"; }
ring=(--parallelism.context_parallel_rotate_method alltoall)
# Measured on a 2-core x86-64 (Release), fp32 (cp2 and its validation, cp2 x fsdp2): losses rel
# up to 2.4e-8, grad norms 5.6e-8, weights rel L2 2.3e-7, most of it one element of layer 1's
# v_proj that any other order of the sums moves (one process accumulating 2 micro-batches:
# 8.7e-8); bounds about 10 times that (the weights' 4 times), within the issue's 1e-6 / 1e-5 /
# 1e-6.
tol=(2e-7 6e-7 1e-6)

# Validation (every 2 steps, 3 batches) runs the ring forward on its own batches.
val=(--validation.enable true --validation.dataset_path "$text" --validation.freq 2
     --validation.steps 3)
check "np1" run 1 "$tmp/np1" "${val[@]}"
check "cp2" cpn 2 "$tmp/cp2" "${val[@]}"
check "cp2 = np1" same "$tmp/cp2" "$tmp/np1" "${tol[@]}"
same_val "$tmp/cp2" "$tmp/np1" "${tol[0]}" && ok || bad "cp2's validation losses differ from np1's"
grep -q "context parallel: 2 ranks per sequence, each 2 chunks of 16 tokens (headtail), ring attention by allgather" \
  "$tmp/cp2.log" && ok || bad "cp2 log lacks the CP line: $(grep '^context' "$tmp/cp2.log")"
# The logged loss is the global token-weighted mean (not scaled by cp): the same 4 decimals.
[ "$(grep -o 'loss  *[0-9.]*' "$tmp/cp2.log")" = "$(grep -o 'loss  *[0-9.]*' "$tmp/np1.log")" ] && ok ||
  bad "cp2's logged losses differ from np1's"
# Both rotate methods give the same bits, and so does the guarded backend: one run checks both.
check "cp2 alltoall guarded" cpn 2 "$tmp/cp2_ring" "${ring[@]}" --debug.guard_device_memory true
check "cp2 alltoall guarded = allgather, bit for bit" same "$tmp/cp2_ring" "$tmp/cp2" 0 0 0
# The ring's bytes a step: (6 cp - 4) K|V blocks a layer for alltoall (keys forward, keys and
# their gradients back, the last gradient home), K|V = 64 tokens x 2 kv heads x 64 x 4 bytes, on
# 2 layers: 8 x 32768 x 2.
grep -q "CP ring attention (sent to the other CP ranks) 524288;" "$tmp/cp2_ring.log" && ok ||
  bad "cp2 alltoall's ring bytes: $(grep '^comm volume' "$tmp/cp2_ring.log")"
rm -rf "$tmp/cp2_ring" "$tmp/cp2" # each run writes ~14 MB (checkpoint, export): freed when compared

if full; then
# FSDP over dp_shard x cp = 4 ranks; 2 data-parallel groups of one sequence each.
check "cp2 x fsdp2" run 4 "$tmp/cp2fsdp2" --parallelism.context_parallel_degree 2 \
  --parallelism.data_parallel_shard_degree 2 --training.local_batch_size 1
check "cp2 x fsdp2 = np1" same "$tmp/cp2fsdp2" "$tmp/np1" "${tol[@]}"
grep -q "sharded over 4 ranks" "$tmp/cp2fsdp2.log" && ok ||
  bad "cp2 x fsdp2 is not FSDP over 4: $(grep '^parallel' "$tmp/cp2fsdp2.log")"
rm -rf "$tmp/cp2fsdp2"
fi
rm -rf "$tmp/np1"

# --- block-causal: each line of the text a document (~20 tokens: 2-3 chunks of 16 at CP=2,
# dozens of documents crossing the tiles and chunks at seq 1024).
text_docs "$tmp/docs.jsonl"
blk=(--model.attn_mask_type block_causal --training.dataset_path "$tmp/docs.jsonl" "${real[@]}")
# Measured on the real vocabulary (Release, 2-core x86-64): CP=2, CP=4, CP=2 x TP=2, MoE at 1024
# and the CP=4 resumes: losses rel up to 1.5e-8, grad norms 3.8e-8, weights rel L2 3.0e-8; bounds
# about 10 times that, within the issue's 1e-6 / 1e-5 / 1e-6.
tolb=(1.5e-7 4e-7 3e-7)
# The one-process reference runs sdpa (the materialised scores); the CP runs' rings run the pair
# kernels either way, and CP=2 x TP=2 below asks for sdpa.
check "np1 block sdpa" run 1 "$tmp/np1_blk" "${blk[@]}" --model.attn_backend sdpa
if ! full; then
check "cp2 block alltoall" cpn 2 "$tmp/cp2_blk" "${blk[@]}" "${ring[@]}"
check "cp2 block = np1 block" same "$tmp/cp2_blk" "$tmp/np1_blk" "${tolb[@]}"
rm -rf "$tmp/cp2_blk"
fi

if full; then
# CP=4, whose first two steps are also the resumes' first leg: a CP=4 checkpoint resumed at CP=4
# (bit for bit), at CP=2 and in one process (to the tolerance).
check "cp4 block alltoall" cpn 4 "$tmp/cp4" "${blk[@]}" "${ring[@]}"
check "cp4 block = np1 block" same "$tmp/cp4" "$tmp/np1_blk" "${tolb[@]}"
check "cp4 leg 1" cpn 4 "$tmp/res4" "${blk[@]}" "${ring[@]}" --training.steps 2
cp -r "$tmp/res4" "$tmp/res2"; cp -r "$tmp/res4" "$tmp/res1"
check "cp4 leg 2" cpn 4 "$tmp/res4" "${blk[@]}" "${ring[@]}"
check "cp4 -> cp4 = cp4, bit for bit" same "$tmp/res4" "$tmp/cp4" 0 0 0
check "cp2 leg 2" cpn 2 "$tmp/res2" "${blk[@]}"
check "cp4 -> cp2 = np1" same "$tmp/res2" "$tmp/np1_blk" "${tolb[@]}"
check "np1 leg 2" run 1 "$tmp/res1" "${blk[@]}"
check "cp4 -> np1 = np1" same "$tmp/res1" "$tmp/np1_blk" "${tolb[@]}"
for r in res2 res1; do
  grep -q "resumed from .*step-2" "$tmp/$r.log" && ok || bad "$r did not resume the CP=4 checkpoint"
done
rm -rf "$tmp/cp4" "$tmp/res4" "$tmp/res2" "$tmp/res1"

# CP=2 x TP=2 (tp innermost: each CP group one TP rank's column), FSDP over the CP pair, with
# model.attn_backend sdpa: accepted, the ring's pair kernels run, and the log says so.
check "cp2 x tp2 block sdpa" run 4 "$tmp/cptp" --parallelism.context_parallel_degree 2 \
  --parallelism.tensor_parallel_degree 2 "${blk[@]}" --model.attn_backend sdpa
check "cp2 x tp2 block sdpa = np1 block sdpa" same "$tmp/cptp" "$tmp/np1_blk" "${tolb[@]}"
grep -q "with model.attn_backend sdpa too, the chunk pairs run the ring's online-softmax kernels" \
  "$tmp/cptp.log" && ok || bad "cp2 x tp2 sdpa's log does not say what runs: $(grep '^context' "$tmp/cptp.log")"
rm -rf "$tmp/cptp" "$tmp/np1_blk"

# bf16 (the pair kernels round as flash's bf16 kernel), with op-level checkpointing, under ZeRO-1
# over the CP ranks (FSDP's bf16 gathers would round the norms too, as one process does not).
bf16=(--training.mixed_precision_param bfloat16 "${blk[@]}")
# Each chunk pair's output is normalised and rounded to bf16 where one process's flash normalises
# the row once, so the two differ as bf16 roundings do: measured 3.7e-5, 3.1e-5, 3.1e-5
# (block-causal, on the real vocabulary; causal, on it, 7.1e-5, 1.2e-4, 3.3e-5 before).
tol16=(4e-4 4e-4 3e-4)
check "np1 bf16 block" run 1 "$tmp/np1_bf16" "${bf16[@]}"
check "cp2 bf16 block zero1" cpn 2 "$tmp/cp2_bf16" "${bf16[@]}" --activation_checkpoint.mode selective \
  --activation_checkpoint.selective_ac_option op --parallelism.data_parallel_shard_mode zero1
check "cp2 bf16 = np1 bf16" same "$tmp/cp2_bf16" "$tmp/np1_bf16" "${tol16[@]}"
rm -rf "$tmp/cp2_bf16" "$tmp/np1_bf16"

# seq 1024, MoE (debugmodel_moe: 8 experts of width 128, top-2) with HF's aux loss in the loss,
# 2 micro-batches a step, full activation checkpointing on the CP run (the recomputed forward
# runs the ring again): chunks of 256 rows, so each pair runs several 64-row tiles each way,
# and the documents cross them.
long=(--training.seq_len 1024 --training.local_batch_size 1 --training.global_batch_size 2
      --training.steps 2 --model.flavor debugmodel_moe --model.load_balance hf
      --model.output_router_logits true --model.router_aux_loss_coef 0.1 "${blk[@]}")
check "np1 moe 1024" run 1 "$tmp/np1_long" "${long[@]}"
check "cp2 moe 1024 alltoall" cpn 2 "$tmp/cp2_long" "${long[@]}" "${ring[@]}" \
  --activation_checkpoint.mode full
check "cp2 moe 1024 = np1" same "$tmp/cp2_long" "$tmp/np1_long" "${tolb[@]}"
rm -rf "$tmp/cp2_long" "$tmp/np1_long"

# EP beside CP (issue 33: EP is carved out of dp_shard x cp; a CP rank's tokens are its own at
# the MoE block, as a replica's are), with HF's aux loss over the global routing statistics.
# fp32: EP=4 x CP=2 (the EP group spans both CP pairs) against one process, measured 4.0e-9,
# 9.3e-9, 6.8e-9 (break-tested on the real vocabulary: the routing statistics left unsummed
# under CP gave 4.4e-5, 2.3e-3, 1.2e-5). bf16: EP=2 x CP=2 against CP=2 alone, whose FSDP rounds
# the same gathers: measured loss 4.9e-10, grad norm 1.8e-7, weights 1.2e-7 (the grad norms
# within 7e-11 for two steps, then the masters' last bits round a few bf16 weights apart; on the
# real vocabulary 0, 1.2e-10, 1.5e-9). Bounds about 10 times that.
moe=(--model.flavor debugmodel_moe --model.load_balance hf --model.output_router_logits true
     --model.router_aux_loss_coef 0.1)
check "np1 moe" run 1 "$tmp/np1_moe" "${moe[@]}"
check "ep4 x cp2 moe" run 4 "$tmp/ep4cp2" "${moe[@]}" --parallelism.context_parallel_degree 2 \
  --parallelism.expert_parallel_degree 4 --training.local_batch_size 1
check "ep4 x cp2 = np1" same "$tmp/ep4cp2" "$tmp/np1_moe" 4e-8 9e-8 7e-8
rm -rf "$tmp/ep4cp2" "$tmp/np1_moe"
check "cp2 moe bf16" cpn 2 "$tmp/cp2_moe16" "${moe[@]}" --training.mixed_precision_param bfloat16
check "ep2 x cp2 moe bf16" cpn 2 "$tmp/ep2cp2_16" "${moe[@]}" \
  --training.mixed_precision_param bfloat16 --parallelism.expert_parallel_degree 2
check "ep2 x cp2 bf16 = cp2 bf16" same "$tmp/ep2cp2_16" "$tmp/cp2_moe16" 5e-9 2e-6 1e-6
rm -rf "$tmp/ep2cp2_16" "$tmp/cp2_moe16"
fi
rm -rf "$tmp/np1_blk"

# --- a hung ring peer: every rank ends, non-zero, within the comm timeout, the wait named.
# (ZeRO-1, whose first collective of a step is in the backward, so the ring's wait is first.)
fails cp_hang "the ring attention's .* did not complete within 5 s" 2 \
  --parallelism.context_parallel_degree 2 --parallelism.data_parallel_shard_mode zero1 \
  --debug.fault hang --debug.fault_rank 1 --debug.fault_step 2 --comm.train_timeout_seconds 5

# --- refusals: one line each, naming the keys and numbers
refused seq_len "training.seq_len = 66 is not a multiple of 2 \* parallelism.context_parallel_degree = 4" \
  2 --parallelism.context_parallel_degree 2 --training.seq_len 66
refused seq_len_tp "training.seq_len = 68 is not a multiple of 2 \* parallelism.context_parallel_degree \* tensor_parallel_degree = 8" \
  4 --parallelism.context_parallel_degree 2 --parallelism.tensor_parallel_degree 2 --training.seq_len 68
refused ranks "context_parallel_degree = 2 does not divide the 3 ranks" 3 \
  --parallelism.context_parallel_degree 2
finish
