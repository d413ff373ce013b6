#!/usr/bin/env bash
# Expert parallelism (issue 33), under real mpirun: EP=2 and EP=4 with DDP for the other
# parameters against one process on the same global batch (debugmodel_moe: every layer sparse,
# top-2 of 8; a mixed dense/sparse model, top-3 of 6, norm_topk_prob false; a router whose bias
# sends every token to one expert, so that the others, and at EP=2 a whole rank, get none; HF's
# aux loss and the aux-loss-free bias; fp32 and bf16; the grouped and loop expert kernels), the
# weights after 4 steps compared through the final HF export (the experts streamed from their
# owners); an EP=2 checkpoint resumed on one process; the guarded backend; a hung peer in an
# all-to-all; the refusals, one line each.
set -u
source "$(dirname "$0")/mpi_test.bash"
text_run_setup
# Under the sanitizers (make check's second pass) one case of each kind: EP=2 against one
# process, a checkpoint resumed, a hung peer, two refusals (full, mpi_test.bash).

# run NP DUMP [--key value ...]: the 2-layer debugmodel_moe, 4 steps of one sequence of 32 tokens
# per rank (global batch = NP), 1 thread per rank, the final weights exported to DUMP/hf.
run() {
  local np=$1 dump=$2; shift 2
  text_train "$np" "$dump" model.flavor=debugmodel_moe training.global_batch_size="$np" \
    checkpoint.enable=false checkpoint.last_save_in_hf=true -- "$@"
}
export -f run
# ep N DUMP [...]: EP over all N ranks, DDP over them for the rest; np1 N DUMP: one process on
# the same global batch of N sequences.
ep() {
  local n=$1 dump=$2; shift 2
  run "$n" "$dump" --parallelism.expert_parallel_degree "$n" \
    --parallelism.data_parallel_replicate_degree "$n" "$@"
}
np1() {
  local n=$1 dump=$2; shift 2
  run 1 "$dump" --training.local_batch_size "$n" --training.global_batch_size "$n" "$@"
}
# agree A B BOUNDS...: `same`, then A's 160 MB export goes (the matrix would hold some 4 GB).
agree() { same "$@" && rm -rf "$1/hf"; }
# Measured on a 2-core x86-64 (Release) against one process on the same global batch (the ranks'
# non-expert gradients are summed by the all-reduce, as DDP's; each expert's rows reach its
# GEMMs in one process's order, test_moe_ep.c checks that bit for bit): losses rel up to 3.6e-9,
# grad norms 1.0e-8, weights rel L2 1.0e-9 (EP=2 with the HF aux loss, the aux-free bias, the
# loop kernel, bf16 (0, 7.9e-9, 3.5e-10), EP=4, EP=2 x 2 replicas, the mixed and one-expert
# models, an EP=2 checkpoint resumed on one process). Bounds about 10 times that, within the
# issue's 1e-6 / 1e-5 / 1e-6. Break-test: the aux-free counts summed over the EP group only
# (EP=2 x 2 replicas) moves the run by 8.1e-6, 6.2e-6, 4.4e-5.
tol=(5e-8 1e-7 2e-8)
hf=(--model.load_balance hf --model.output_router_logits true --model.router_aux_loss_coef 0.1)
free=(--model.load_balance aux_free --model.load_balance_coeff 0.01)

check "np1 (batch 2)" np1 2 "$tmp/np1" "${hf[@]}"
check "ep2" ep 2 "$tmp/ep2" "${hf[@]}"
check "ep2 = np1" same "$tmp/ep2" "$tmp/np1" "${tol[@]}"
grep -q "expert parallel over 2 ranks (each holds 1/2 of every sparse layer.s experts" "$tmp/ep2.log" &&
  grep -q "comm: expert parallel over 2 ranks, 4 experts each" "$tmp/ep2.log" && ok ||
  bad "ep2 log lacks the EP line: $(grep '^parallel' "$tmp/ep2.log")"
if full; then
# guarded backend: the same EP run, bit for bit
check "ep2 guarded" ep 2 "$tmp/ep2_guard" "${hf[@]}" --debug.guard_device_memory true
check "ep2 guarded = ep2" agree "$tmp/ep2_guard" "$tmp/ep2" 0 0 0
# the aux-loss-free bias (its update sums the expert counts over every data-parallel rank), on
# the loop kernel
check "np1 aux-free loop" np1 2 "$tmp/np1_free" "${free[@]}" --model.moe_impl loop
check "ep2 aux-free loop" ep 2 "$tmp/ep2_free" "${free[@]}" --model.moe_impl loop
check "ep2 aux-free loop = np1" agree "$tmp/ep2_free" "$tmp/np1_free" "${tol[@]}"
rm -rf "$tmp/np1_free/hf"
# bf16 (the bf16 expert kernels; the dispatched rows are the bf16 copy of the layer's input)
bf16=(--training.mixed_precision_param bfloat16)
check "np1 bf16" np1 2 "$tmp/np1_bf16" "${hf[@]}" "${bf16[@]}"
check "ep2 bf16" ep 2 "$tmp/ep2_bf16" "${hf[@]}" "${bf16[@]}"
check "ep2 bf16 = np1 bf16" agree "$tmp/ep2_bf16" "$tmp/np1_bf16" "${tol[@]}"
rm -rf "$tmp/np1_bf16/hf"
# full activation checkpointing (each sparse layer's dispatch runs again in the backward) with 2
# micro-batches per step, against DDP on the same ranks: one process's micro-batches hold other
# sequences (rank r reads its own rows of the step), which HF's per-micro-batch aux loss sees
# (np 2 DDP vs one process: 2.1e-5, 3.1e-5, 1.1e-5). Measured 1.7e-9, 1.9e-9, 6.5e-10.
acc=(--activation_checkpoint.mode full --training.global_batch_size 4)
check "dp2 ac full, 2 micro-batches" run 2 "$tmp/dp2_acc" "${hf[@]}" "${acc[@]}" \
  --parallelism.data_parallel_replicate_degree 2
check "ep2 ac full, 2 micro-batches" ep 2 "$tmp/ep2_acc" "${hf[@]}" "${acc[@]}"
check "ep2 ac full, 2 micro-batches = dp2" agree "$tmp/ep2_acc" "$tmp/dp2_acc" "${tol[@]}"
rm -rf "$tmp/dp2_acc/hf"
# np 4 on 2 cores: EP=4; and EP=2 x 2 replicas with the aux-free bias, whose counts are summed
# over all 4 ranks (the EP group sees only half the batch) and whose experts' gradients are
# summed over their 2 replicas
check "np1 aux-free (batch 4)" np1 4 "$tmp/np1_free4" "${free[@]}"
check "ep4 aux-free" ep 4 "$tmp/ep4" "${free[@]}"
check "ep4 aux-free = np1" same "$tmp/ep4" "$tmp/np1_free4" "${tol[@]}"
check "ep2 x dp2 aux-free" run 4 "$tmp/ep2dp2_free" "${free[@]}" \
  --parallelism.expert_parallel_degree 2 --parallelism.data_parallel_replicate_degree 4
check "ep2 x dp2 aux-free = np1" agree "$tmp/ep2dp2_free" "$tmp/np1_free4" "${tol[@]}"
rm -rf "$tmp/np1_free4/hf"
# crafted HF folders from np1's export (tests/ep_craft.py): mixed dense/sparse, top-3 of 6 without
# renormalisation; and top-1 with a bias that sends every token to expert 3 (EP rank 1 of 2
# receives no row at all)
check "np1 6 experts" np1 2 "$tmp/np1_6" "${hf[@]}" --model.num_experts 6 \
  --model.num_experts_per_tok 3
for c in mixed one; do
  "$CTITAN_PYTHON" "$(dirname "$0")/ep_craft.py" "$tmp/$([ $c = mixed ] && echo np1_6 || echo np1)/hf" \
    "$tmp/${c}_hf" "$c" || bad "ep_craft.py $c"
  from=(--model.backend hf --model.hf_path "$tmp/${c}_hf" --model.n_layers 0 "${hf[@]}")
  check "np1 $c" np1 2 "$tmp/np1_$c" "${from[@]}"
  check "ep2 $c" ep 2 "$tmp/ep2_$c" "${from[@]}"
  check "ep2 $c = np1" agree "$tmp/ep2_$c" "$tmp/np1_$c" "${tol[@]}"
  rm -rf "$tmp/np1_$c/hf" "$tmp/${c}_hf"
done
rm -rf "$tmp/np1_6/hf" "$tmp/np1/hf"
grep -q "1 of 2 layers sparse, 6 experts of width 128, top-3" "$tmp/ep2_mixed.log" && ok ||
  bad "ep2 mixed: $(grep '^moe' "$tmp/ep2_mixed.log")"
grep -q "load max/mean 8.00" "$tmp/ep2_one.log" && ok ||
  bad "ep2 one: not every token went to one expert: $(grep '^step' "$tmp/ep2_one.log" | tail -1)"
fi

# --- checkpoints: an EP=2 checkpoint of step 2 (one model and optimizer shard per EP rank, by
# expert id in the one-process layout) resumed on one process, against the uninterrupted run.
ckpt=(--lr_scheduler.warmup_steps 1 --lr_scheduler.decay_ratio 0)
save=(--checkpoint.enable true --checkpoint.interval 2 --checkpoint.keep_latest_k 1)
check "np1 flat schedule" np1 2 "$tmp/np1_ckpt" "${hf[@]}" "${ckpt[@]}"
check "ep2 2 steps" ep 2 "$tmp/ep2_leg" "${hf[@]}" "${ckpt[@]}" "${save[@]}" --training.steps 2
ls "$tmp/ep2_leg/checkpoint/step-2/model-00001-of-00002.safetensors" >/dev/null &&
  [ ! -e "$tmp/ep2_leg/checkpoint/step-2/model.safetensors" ] && ok ||
  bad "ep2's checkpoint is not one model shard per EP rank"
rm -rf "$tmp/ep2_np1" "$tmp/ep2_leg/hf"; mv "$tmp/ep2_leg" "$tmp/ep2_np1"
check "ep2 -> np1" np1 2 "$tmp/ep2_np1" "${hf[@]}" "${ckpt[@]}" "${save[@]}"
grep -q "resumed from .*step-2 " "$tmp/ep2_np1.log" && ok || bad "ep2 -> np1 did not resume"
check "ep2 -> np1 = np1" agree "$tmp/ep2_np1" "$tmp/np1_ckpt" "${tol[@]}"
rm -rf "$tmp"/*/checkpoint "$tmp"/*/hf

# --- a hung EP peer: every rank ends, non-zero, within the comm timeout, the all-to-all named;
fails ep_hang "an expert-parallel all-to-all did not complete within 5 s" 2 \
  --parallelism.expert_parallel_degree 2 --parallelism.data_parallel_replicate_degree 2 \
  --debug.fault hang --debug.fault_rank 1 --debug.fault_step 2 --comm.train_timeout_seconds 5
if full; then # a dead one: mpirun ends the job, naming the rank
fails ep_exit "rank 1|\[\[[0-9]+,[0-9]+\],1\]" 2 --parallelism.expert_parallel_degree 2 \
  --parallelism.data_parallel_replicate_degree 2 --debug.fault exit --debug.fault_rank 1 \
  --debug.fault_step 2
fi

# --- refusals: one line each
refused fsdp "expert_parallel_degree = 2 with data_parallel_shard_degree = 2 \(FSDP\): EP beside FSDP" \
  2 --parallelism.expert_parallel_degree 2
refused etp "expert_tensor_parallel_degree = 2; expected 1 or tensor_parallel_degree \(1\)" 1 \
  --parallelism.expert_tensor_parallel_degree 2
if full; then
refused dense "expert_parallel_degree = 2: the model has no experts" 2 \
  --parallelism.expert_parallel_degree 2 --parallelism.data_parallel_replicate_degree 2 \
  --model.flavor debugmodel
refused experts "expert_parallel_degree = 2 does not divide num_experts = 3" 2 \
  --parallelism.expert_parallel_degree 2 --parallelism.data_parallel_replicate_degree 2 \
  --model.num_experts 3
refused ranks "expert_parallel_degree = 2 does not divide the 3 data-parallel ranks" 3 \
  --parallelism.expert_parallel_degree 2 --parallelism.data_parallel_replicate_degree 3
refused tp "expert_parallel_degree = 2 with tensor_parallel_degree = 2: EP with TP is not supported" \
  4 --parallelism.expert_parallel_degree 2 --parallelism.tensor_parallel_degree 2 \
  --parallelism.data_parallel_replicate_degree 2
fi
finish
