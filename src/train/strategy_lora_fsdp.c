// LoRA under FSDP/HSDP: two strategies side by side. The frozen base is strategy_fsdp's model
// (fsdp.h's frozen mode: each unit gathered for its forward and for the backward's input
// gradients, never a gradient, so nothing is reduce-scattered); the adapter, a few MB, is
// strategy_zero1's trained buffer: replicated, its gradients all-reduced in buckets during the
// last backward, AdamW's moments sharded over every rank. So checkpoints are ZeRO-1's of the
// adapter (the base is never saved: it is re-read and re-sharded), and a run resumes on any
// number of ranks, one process too.
#include "optim/adamw.h"
#include "train/strategy.h"
#include "train/trainer_internal.h"

static void describe(const trainer *t, char *buf, size_t size) {
    snprintf(buf, size,
             "FSDP: the frozen LoRA base sharded over %d ranks%s; the adapter replicated, its "
             "optimizer state sharded over all %d ranks (ZeRO-1)",
             t->shard_degree,
             t->d->size / t->shard_degree > 1 ? ", in each of the replica groups (HSDP)" : "",
             t->d->size);
}

static int setup(trainer *t, ct_error *err) {
    if (strategy_fsdp.setup(t, err) != 0) return -1;
    return strategy_replicate_setup_sync(t, err); // the hook becomes unit_ready below
}

static void free_(trainer *t) {
    strategy_replicate_free_sync(t);
    strategy_fsdp.free(t);
}

// The base's gathers, then the adapter's buckets.
static void unit_ready(void *ctx, int unit, int event) {
    strategy_fsdp.unit_ready(ctx, unit, event);
    strategy_zero1.unit_ready(ctx, unit, event);
}

// A gather's failure inside the hook, then the adapter's reductions.
static int grads_final(trainer *t, ct_error *err) {
    if (fsdp_finish(&t->strat.fsdp, err) != 0) return -1;
    return strategy_zero1.grads_final(t, err);
}

// strategy_fsdp's table for the base, strategy_zero1's for the adapter's step and checkpoints
// (their functions are not visible here): filled at the first call.
const strategy_vt *strategy_lora_fsdp(void) {
    static strategy_vt vt;
    if (!vt.setup) {
        vt = strategy_zero1;
        vt.describe = describe;
        vt.memory_note = " (ZeRO-1 shard of the adapter's)";
        vt.estimate = strategy_fsdp.estimate;
        vt.setup = setup;
        vt.free = free_;
        vt.init_random = strategy_fsdp.init_random;
        vt.load_sharded = strategy_fsdp.load_sharded;
        vt.load_hf = strategy_fsdp.load_hf;
        vt.weights_ready = strategy_fsdp.weights_ready;
        vt.unit_ready = unit_ready;
        vt.grads_final = grads_final;
        vt.after_eval = strategy_fsdp.after_eval;
        vt.take_comm = strategy_fsdp.take_comm;
    }
    return &vt;
}
