// Everything before the first step: the ranks' shape and the strategy, threads, the memory
// plan, the model, the optimizer, the weights, the data, the config and metrics files.
#include <math.h>
#include <omp.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cblas.h>

#include "core/fs.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "model/hf_adapter.h"
#include "model/moe_balance.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "checkpoint/checkpoint.h"
#include "train/peak.h"
#include "train/metrics.h"
#include "train/run_setup.h"
#include "model/peft_adapter.h"
#include "model/qwen3_lora.h"
#include "train/trainer_internal.h"

// Under PP (t->d: a stage's data-parallel ranks), what does not compose with it yet, and the
// micro-batches: one line each.
static int pp_refusals(trainer *t, bool fsdp_on, int P, ct_error *err) {
    const ct_config *c = t->cfg;
    const int pp = t->pp, mbs = c->parallelism.pipeline_parallel_microbatch_size;
    const char *with = c->lora.rank > 0 && fsdp_on
                           ? "lora.rank > 0 under FSDP (data_parallel_shard_mode = \"fsdp\" over "
                             "more than one rank)"
                           : NULL;
    if (with)
        return ct_fail(err,
                       "parallelism.pipeline_parallel_degree = %d with %s: not supported yet; PP "
                       "runs with DDP, ZeRO-1, FSDP, TP, CP or EP inside each stage (LoRA with "
                       "DDP or ZeRO-1; %d data-parallel ranks)",
                       pp, with, P);
    if (t->B % mbs != 0)
        return ct_fail(err,
                       "parallelism.pipeline_parallel_microbatch_size = %d does not divide "
                       "training.local_batch_size = %d (micro-batches = local_batch_size / "
                       "microbatch_size)",
                       mbs, t->B);
    return 0;
}

// The ranks' shape: ZeRO-1 over all of them or a replica on each, and the global batch split
// into per-rank micro-batches. The config's -1s are resolved against the rank count here.
static int setup_parallel(trainer *t, ct_error *err) {
    const ct_config *c = t->cfg;
    // Under CP the ranks of a CP group share their samples: the data-parallel degree is P / cp,
    // and FSDP shards over dp_shard x cp (the CP ranks are FSDP ranks too).
    int P = t->d->size / t->cp, rep = c->parallelism.data_parallel_replicate_degree;
    int shard = c->parallelism.data_parallel_shard_degree;
    if (shard == -1) shard = P % rep == 0 ? P / rep : -1;
    if (shard < 1 || (int64_t)shard * rep != P)
        return ct_fail(err,
                       "parallelism.data_parallel_shard_degree (%d) * data_parallel_replicate_degree "
                       "(%d)%s must equal the number of ranks%s, %d",
                       c->parallelism.data_parallel_shard_degree, rep,
                       t->cp > 1 ? " * context_parallel_degree" : "", t->cp > 1 ? " / it" : "", P);
    t->shard_degree = shard * t->cp;
    shard = t->shard_degree;
    const bool fsdp_on = strcmp(c->parallelism.data_parallel_shard_mode, "fsdp") == 0 && shard > 1;
    const bool zero1 = !fsdp_on && shard > 1;
    if (t->tp > 1 && zero1)
        return ct_fail(err,
                       "parallelism.tensor_parallel_degree = %d with data_parallel_shard_mode = "
                       "\"zero1\": ZeRO-1 under tensor parallelism is not supported yet; use "
                       "\"fsdp\" (2D/3D with TP) or data_parallel_replicate_degree = %d",
                       t->tp, P);
    if (t->ep > 1) {
        if (c->lora.rank > 0)
            return ct_fail(err,
                           "parallelism.expert_parallel_degree = %d with lora.rank = %d: LoRA "
                           "under EP is not supported yet (its experts are frozen, EP's strategy "
                           "reduces their gradients); use DDP or ZeRO-1",
                           t->ep, c->lora.rank);
        // With TP and expert_tensor_parallel_degree 1, torchtitan's default: the EP groups are
        // carved out of dp_shard x tp, TP groups whole (ep a multiple of tp). With etp = tp, out
        // of the data-parallel ranks of one TP rank (checked below), each expert cut by TP.
        if (t->tp > 1 && t->etp == 1 && (t->ep % t->tp != 0 || (P * t->tp) % t->ep != 0))
            return ct_fail(err,
                           "parallelism.expert_parallel_degree = %d with tensor_parallel_degree = "
                           "%d: expected a multiple of tp that divides the %d ranks",
                           t->ep, t->tp, P * t->tp);
        // torchtitan's dp2ep: the EP groups are carved out of dp_shard x cp (FSDP); with no
        // shard ranks, out of the replicas (DDP for the rest).
        if (zero1)
            return ct_fail(err,
                           "parallelism.expert_parallel_degree = %d with data_parallel_shard_mode "
                           "= \"zero1\": EP beside ZeRO-1 is not supported; use \"fsdp\" or "
                           "data_parallel_replicate_degree = %d",
                           t->ep, P);
        // Under TP with etp 1, out of the FSDP ranks x tp.
        const int carve = t->etp == 1 ? t->tp : 1;
        if (fsdp_on && (shard * carve) % t->ep != 0)
            return ct_fail(err,
                           "parallelism.expert_parallel_degree = %d does not divide "
                           "data_parallel_shard_degree%s%s = %d (EP is carved out of the FSDP "
                           "ranks%s)",
                           t->ep, t->cp > 1 ? " * context_parallel_degree" : "",
                           carve > 1 ? " * tensor_parallel_degree" : "", shard * carve,
                           carve > 1 ? " and the TP ranks" : "");
        // The CP ranks hold tokens of their own, as the replicas do.
        if (t->etp == t->tp && t->d->size % t->ep != 0)
            return ct_fail(err,
                           "parallelism.expert_parallel_degree = %d does not divide the %d "
                           "data-parallel ranks",
                           t->ep, t->d->size);
        if (strcmp(c->training.mixed_precision_reduce, "float32") != 0)
            return ct_fail(err,
                           "parallelism.expert_parallel_degree = %d with "
                           "training.mixed_precision_reduce = \"%s\": EP reduces in float32 only",
                           t->ep, c->training.mixed_precision_reduce);
    }
    if (t->pp > 1 && pp_refusals(t, fsdp_on, P, err) != 0) return -1;
    t->strat.vt = t->pp > 1              ? &strategy_pp
                  : t->tp > 1            ? &strategy_tp
                  : t->ep > 1 && fsdp_on ? strategy_ep_fsdp()
                  : t->ep > 1            ? &strategy_ep
                  : fsdp_on && c->lora.rank > 0 ? strategy_lora_fsdp()
                  : fsdp_on              ? &strategy_fsdp
                  : zero1                ? &strategy_zero1
                                         : &strategy_replicate;
    if (t->strat.vt->model_in_shards && c->checkpoint.last_save_in_hf && !c->checkpoint.enable)
        return ct_fail(err,
                       "checkpoint.last_save_in_hf under FSDP exports the last checkpoint, tensor "
                       "by tensor (no rank holds the whole model): set checkpoint.enable = true");
    if (zero1 && rep > 1)
        return ct_fail(err,
                       "parallelism.data_parallel_shard_mode = \"zero1\" shards the optimizer over "
                       "all %d ranks or none: data_parallel_replicate_degree = %d leaves %d per "
                       "group; use \"fsdp\" for HSDP",
                       P, rep, shard);
    int64_t per_pass = (int64_t)t->B * P; // sequences of one micro-batch on every rank
    int64_t global = c->training.global_batch_size > 0 ? c->training.global_batch_size : per_pass;
    if (global % per_pass != 0)
        return ct_fail(err,
                       "training.global_batch_size = %lld is not a multiple of "
                       "training.local_batch_size (%d) * %d ranks = %lld",
                       (long long)global, t->B, P, (long long)per_pass);
    t->global_batch = (int)global;
    t->accum = (int)(global / per_pass);
    t->val_B = t->B;
    if (t->pp > 1) { // the pipeline's micro-batches: every accumulation step's local batch cut
        const int mbs = c->parallelism.pipeline_parallel_microbatch_size;
        t->accum *= t->B / mbs;
        t->B = mbs;
    }
    // The hash sees the global batch, not how ranks and accumulation split it, so a run saved
    // with N ranks resumes with M.
    ct_config eff = *c;
    eff.training.global_batch_size = t->global_batch;
    t->config_hash = config_hash(&eff);
    return 0;
}

// OpenMP and OpenBLAS threads of this rank: the config, else OMP_NUM_THREADS, else the node's
// cores shared among its ranks (never more than the cores the launcher bound us to).
static void setup_threads(trainer *t) {
    const ct_config *c = t->cfg;
    int n = c->parallelism.threads_per_rank;
    const char *env = getenv("OMP_NUM_THREADS");
    char why[160];
    if (n > 0) {
        snprintf(why, sizeof why, "parallelism.threads_per_rank");
    } else if (env && atoi(env) > 0) {
        n = atoi(env);
        snprintf(why, sizeof why, "OMP_NUM_THREADS");
    } else {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        n = (int)(cores > 0 ? cores : 1) / t->d->local_size;
        if (n < 1) n = 1;
        snprintf(why, sizeof why, "%ld cores / %d ranks on this node", cores, t->d->local_size);
        cpu_set_t set;
        if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) < n) {
            n = CPU_COUNT(&set);
            snprintf(why + strlen(why), sizeof why - strlen(why),
                     ", bound to %d by the launcher (mpirun --bind-to none lifts that)", n);
        }
    }
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    const bool over = t->d->size > 1 && cores > 0 && (long)t->d->local_size * n > cores;
    dist_wait_oversubscribed(over);
    // The ctitan binary sets OMP_WAIT_POLICY=passive unless the user chose (src/cli/main.c).
    const char *wait = getenv("OMP_WAIT_POLICY");
    char mode[400];
    t->strat.vt->describe(t, mode, sizeof mode);
    const int blas = openblas_get_parallel();
    fprintf(t->log,
            "parallel: %d rank(s), %s; %d thread(s) per rank (%s); OpenBLAS on %s; idle OpenMP "
            "threads: %s%s\n",
            t->world->size, mode, n, why,
            blas == OPENBLAS_OPENMP ? "OpenMP's threads"
            : blas == OPENBLAS_THREAD ? "its own threads"
                                      : "one thread",
            wait ? wait : "libgomp's default (spin, then sleep)",
            over ? "; more threads than cores on this node: comm waits sleep after 0.1 ms" : "");
}

// Pre-run validation: everything that can be refused is refused before any work. The memory
// estimate is printed in any case.
static int check_plan(trainer *t, ct_error *err) {
    const ct_config *c = t->cfg;
    const ct_config_activation_checkpoint *ac = &c->activation_checkpoint;
    const bool selective = strcmp(ac->mode, "selective") == 0;
    // AdamW's two fp32 moments, for this rank's 1/N of the parameters under ZeRO-1.
    const strategy_vt *vt = t->strat.vt;
    double optim =
        2.0 * (double)run_setup_plan(&t->setup).params / (vt->optimizer_sharded ? t->d->size : 1);
    double batch = 2.0 * t->accum * t->B * (double)t->T * sizeof(int32_t);
    run_memory mem = run_setup_memory(&t->setup, optim, batch, t->d->local_size);
    if (c->lora.rank > 0) { // the frozen base as held once, the adapter, its grads and moments
        lora_config lc;
        lora_layout L;
        if (config_lora(&lc, c, err) != 0 || lora_layout_init(&L, &t->setup.model, &lc, err) != 0)
            return -1;
        const double adapter = (double)L.num * sizeof(float);
        lora_layout_free(&L);
        mem = run_setup_memory_lora(&t->setup, adapter,
                                    2.0 * adapter / (vt->optimizer_sharded ? t->d->size : 1),
                                    batch, t->d->local_size);
    }
    if (vt->estimate && vt->estimate(t, &mem, err) != 0) return -1;
    char bf16_copy[64] = "";
    if (mem.model.weights_bf16)
        snprintf(bf16_copy, sizeof bf16_copy, " (+ %.3f GiB bf16 copy)",
                 mem.model.weights_bf16 / GIB);
    fprintf(t->log,
            "memory estimate per rank: params %.3f GiB%s, grads %.3f GiB, optimizer %.3f GiB%s, "
            "activations %.3f GiB (%.2f MiB, activation checkpointing %s%s%s), total %.3f GiB; "
            "%d rank(s) on this node: %.3f GiB (available %.1f GiB)\n",
            mem.model.params / GIB, bf16_copy, mem.model.grads / GIB, mem.optimizer / GIB,
            vt->memory_note, mem.model.activations / GIB, mem.model.activations / (1024.0 * 1024.0),
            ac->mode, selective ? " " : "", selective ? ac->selective_ac_option : "",
            mem.total / GIB, t->d->local_size, mem.node / GIB, mem.avail / GIB);
    return run_setup_check_fit(&t->setup, &mem, "the run", true, err);
}

// Data, its tokenizer and chat template (train/run_data.c).
static int setup_data(trainer *t, ct_error *err) {
    const ct_config *c = t->cfg;
    const char *paths[] = {c->training.dataset_path, c->validation.dataset_path};
    if (run_text_open(&t->text, c, paths, c->validation.enable ? 2 : 1, t->setup.model.vocab_size,
                      err) != 0)
        return -1;
    if (run_data_open(&t->train_data, &t->train_loader, &t->text, c->training.dataset_path, t->T,
                      c->training.shuffle, (uint64_t)c->debug.seed, err) != 0)
        return ct_wrap(err, "training.dataset_path");
    if (t->train_data.warning[0]) fprintf(t->log, "data: %s\n", t->train_data.warning);
    const token_stream *s = &t->train_data;
    fprintf(t->log, "data: %s: %llu tokens%s, %llu windows of %d+1 tokens, shuffle %s\n",
            c->training.dataset_path, (unsigned long long)s->n_tokens,
            s->n_npy ? " (.npy files read as used)" : "",
            (unsigned long long)t->train_loader.n_windows, t->T,
            c->training.shuffle ? "on" : "off");
    if (s->n_chats)
        fprintf(t->log,
                "data: %llu conversations rendered with %s's chat template; %llu of their tokens "
                "trained (training.train_on = \"%s\")\n",
                (unsigned long long)s->n_chats, c->model.tokenizer_path,
                (unsigned long long)s->n_trained, c->training.train_on);
    if (run_data_block_causal(c))
        fprintf(t->log, "attention: block_causal: documents packed in a window do not see each "
                        "other; RoPE positions restart at each\n");
    if (c->validation.enable) {
        if (run_data_open(&t->val_data, &t->val_loader, &t->text, c->validation.dataset_path, t->T,
                          false, 0, err) != 0)
            return ct_wrap(err, "validation.dataset_path");
        t->has_val = true;
    }
    return 0;
}

// A ctitan checkpoint folder (state.json) without model.safetensors: its model is in shards.
static bool checkpoint_with_sharded_model(const char *dir) {
    char state[4200], model[4200];
    snprintf(state, sizeof state, "%s/state.json", dir);
    snprintf(model, sizeof model, "%s/model.safetensors", dir);
    return access(state, F_OK) == 0 && access(model, F_OK) != 0;
}

// The initial weights: initial_load_path, else the HF folder (backend=hf), else a seeded random
// init. Every rank loads the same weights.
static int initial_weights(trainer *t, ct_error *err) {
    const ct_config *c = t->cfg;
    const char *from = c->checkpoint.initial_load_path[0]    ? c->checkpoint.initial_load_path
                       : strcmp(c->model.backend, "hf") == 0 ? c->model.hf_path
                                                             : NULL;
    if (!from) {
        const uint64_t seed = (uint64_t)c->debug.seed;
        if (t->strat.vt->init_random(t, seed, err) != 0) return -1;
        fprintf(t->log, "weights: random init (torchtitan's init_weights), seed %lld\n",
                (long long)c->debug.seed);
        return 0;
    }
    // A ctitan checkpoint folder's model.safetensors is HF-named too, so both load the same way;
    // one whose model is in shards (FSDP's) loads through the checkpoint's ranges.
    if (checkpoint_with_sharded_model(from)) {
        int rc = t->strat.vt->load_sharded(t, from, err);
        if (rc == 0) fprintf(t->log, "weights: %s (a checkpoint's model shards)\n", from);
        return dist_agree(t->d, rc, "loading the initial weights", err);
    }
    st_set set;
    hf_load_report rep = {0};
    int rc = st_set_open(&set, from, err);
    if (rc == 0) {
        rc = t->strat.vt->load_hf(t, &rep, &set, from, err);
        st_set_close(&set);
    }
    if (rc == 0)
        fprintf(t->log, "weights: %s (%d tensors, %s, %d unexpected)\n", from, rep.n_loaded,
                dtype_name(rep.source_dtype), rep.n_unexpected);
    hf_report_free(&rep);
    return dist_agree(t->d, rc, "loading the initial weights", err);
}

// Weights: resume from the newest complete checkpoint, else the initial weights. A LoRA run's
// checkpoints hold the adapter only: its base is the initial weights every time, then the
// adapter is PEFT's init from the seed, or the checkpoint's.
static int setup_weights(trainer *t, ct_error *err) {
    const ct_config *c = t->cfg;
    uint64_t base = 0;
    if (t->model.lora) {
        if (initial_weights(t, err) != 0) return -1;
        // A pipeline stage's adapter: its tensors of the whole model's.
        const qwen3_config *whole = t->pp > 1 ? &t->setup.model : NULL;
        if (qwen3_lora_init_random(&t->model, (uint64_t)c->debug.seed, whole, err) != 0) return -1;
        if (c->lora.adapter_path[0] &&
            dist_agree(t->world, peft_adapter_apply(&t->model, c->lora.adapter_path, whole, err),
                       "reading lora.adapter_path", err) != 0)
            return -1;
        base = t->strat.lora_base_hashed ? t->strat.lora_base_hash
                                         : qwen3_lora_base_hash(&t->model);
        if (t->pp > 1 && strategy_pp_lora_base_hash(t, &base, err) != 0) return -1;
    }
    if (c->checkpoint.enable) {
        int found = trainer_resume(t, err);
        if (found > 0 && t->model.lora) {
            if (t->state.lora_base_hash != base)
                return ct_fail(err,
                               "the checkpoint's LoRA adapter was trained on another base (its "
                               "frozen weights' XXH64 %016llx, this run's %016llx): resume with "
                               "the base it was trained on, or train into a new job.dump_folder",
                               (unsigned long long)t->state.lora_base_hash,
                               (unsigned long long)base);
            t->model.lora->forwards = t->state.lora_forwards;
        }
        if (found != 0) return found < 0 ? -1 : 0;
    }
    t->state.config_hash = t->config_hash;
    t->state.lora_base_hash = base;
    if (t->model.lora) {
        if (c->lora.adapter_path[0])
            fprintf(t->log, "lora: the adapter starts as %s's\n", c->lora.adapter_path);
        else
            fprintf(t->log,
                    "lora: the adapter starts as PEFT's (A kaiming-uniform from seed %lld, B "
                    "zero)\n",
                    (long long)c->debug.seed);
        return 0;
    }
    return initial_weights(t, err);
}

// The phases, and torchtitan's warnings where it clamps them.
static void log_lr_schedule(const trainer *t) {
    const ct_config *c = t->cfg;
    int64_t steps = c->training.steps;
    lr_phases p = lr_phases_of(&t->sched, steps);
    if (p.warmup_clamped)
        fprintf(t->log,
                "warning: lr_scheduler.warmup_steps (%d) exceeds training.steps (%lld); warming up "
                "over all %lld steps\n",
                c->lr_scheduler.warmup_steps, (long long)steps, (long long)p.warmup);
    if (p.decay_clamped)
        fprintf(
            t->log,
            "warning: warmup (%lld) + decay (%lld = round(lr_scheduler.decay_ratio %g * %lld)) "
            "steps exceed training.steps (%lld); decaying over the %lld steps left\n",
            (long long)p.warmup, (long long)nearbyint(c->lr_scheduler.decay_ratio * (double)steps),
            c->lr_scheduler.decay_ratio, (long long)steps, (long long)steps, (long long)p.decay);
    fprintf(t->log, "lr: peak %g, warmup %lld steps, stable %lld, %s decay %lld%s to %g x\n",
            c->optimizer.lr, (long long)p.warmup, (long long)p.stable - 1,
            c->lr_scheduler.decay_type, (long long)p.decay,
            isnan(c->lr_scheduler.decay_ratio) ? " (decay_ratio unset: all after warmup)" : "",
            c->lr_scheduler.min_lr_factor);
}

// The data-parallel mode's synchronisation and optimizer, then AdamW's hyperparameters and the
// learning-rate schedule.
static int setup_optimizer(trainer *t, ct_error *err) {
    const ct_config *c = t->cfg;
    if (t->strat.vt->setup(t, err) != 0) return -1;
    t->hp = (adamw_hparams){c->optimizer.beta1, c->optimizer.beta2, c->optimizer.eps,
                            c->optimizer.weight_decay};
    t->sched = (lr_schedule_cfg){c->optimizer.lr, c->lr_scheduler.warmup_steps,
                                 c->lr_scheduler.decay_ratio, LR_DECAY_LINEAR,
                                 c->lr_scheduler.min_lr_factor};
    if (lr_decay_parse(&t->sched.decay_type, c->lr_scheduler.decay_type, err) != 0) return -1;
    log_lr_schedule(t);
    return 0;
}

// The ranks of this rank's pipeline stage under PP, else the world: what TP, and EP with TP
// (etp 1), cut into groups. Under PP the world would mix the stages, whose layers differ.
static dist *stage_ranks(trainer *t) {
    return t->pp > 1 ? &t->stage_group : t->world;
}

// moe_balance's sum over ranks.
static int moe_sum_ranks(void *ctx, double *buf, int n, double *scratch, ct_error *err) {
    return dist_sum_array(ctx, buf, n, scratch, "the MoE routing statistics", err);
}

// MoE: the load-balancing mode and the component that owns its statistics, attached to the
// model.
static int setup_moe(trainer *t, ct_error *err) {
    qwen3_model *m = &t->model;
    const qwen3_config *mc = &m->cfg;
    const char *lb = t->cfg->model.load_balance;
    // Every rank alike, a pipeline stage without sparse layers too (the loss adds the aux).
    t->aux_in_loss = mc->num_experts > 0 && strcmp(lb, "hf") == 0 && mc->output_router_logits;
    t->aux_free = mc->num_experts > 0 && strcmp(lb, "aux_free") == 0;
    // Under EP with TP and etp 1 every rank routes its own sequence shard: the statistics span
    // the stage's ranks (the world without PP; with etp = tp the TP ranks route the same gathered
    // rows, as TP alone).
    t->moe_ranks = t->ep > 1 && t->tp > 1 && t->etp == 1 ? stage_ranks(t) : t->d;
    if (m->n_sparse == 0) return 0;
    t->n_moe_metric = m->n_sparse;
    // The backward adds the gradient of coef * aux / accum when the aux is in the loss.
    const float aux_scale = t->aux_in_loss ? (float)(mc->router_aux_loss_coef / t->accum) : 0.0f;
    dist *over = t->moe_ranks;
    if (moe_balance_init(&t->moe, m, over->size, moe_sum_ranks, over, aux_scale, err) != 0)
        return -1;
    t->moe_metric = moe_balance_metric(&t->moe);
    fprintf(t->log,
            "moe: %d of %d layers sparse, %d experts of width %d, top-%d%s, expert kernel %s; "
            "load balancing %s%s\n",
            m->n_sparse, mc->num_hidden_layers, mc->num_experts, mc->moe_intermediate_size,
            mc->num_experts_per_tok, mc->norm_topk_prob ? " renormalised" : "",
            t->cfg->model.moe_impl, lb,
            t->aux_in_loss          ? " (aux loss in the loss, coefficient below)"
            : t->aux_free           ? " (expert bias, no aux loss)"
            : strcmp(lb, "hf") == 0 ? " (output_router_logits is off: aux reported, not added)"
                                    : " (none: aux reported only)");
    if (t->aux_in_loss) fprintf(t->log, "moe: loss = ce + %g * aux\n", mc->router_aux_loss_coef);
    return 0;
}

static int config_text(char **out, const ct_config *c, ct_error *err) {
    size_t len = 0;
    FILE *f = open_memstream(out, &len);
    if (!f || config_write_toml(c, f) != 0) {
        if (f) fclose(f);
        return ct_fail(err, "cannot format the effective config");
    }
    fclose(f);
    return 0;
}

// config.toml holds every key; the log shows those that differ from the defaults.
static int save_config(trainer *t, ct_error *err) {
    const ct_config *c = t->cfg;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.toml", c->job.dump_folder);
    if (fs_mkdirs(c->job.dump_folder, err) != 0 || config_save(c, path, err) != 0) return -1;
    fprintf(t->log, "config: differences from the defaults (every key is in %s):\n", path);
    config_write_changed(c, t->log);
    return 0;
}

// Everything before the first step. Errors that every rank meets alike (config, memory,
// model) need no agreement; the ones that may differ between ranks are agreed on.
// Tensor parallelism: the world cut into TP groups of tp consecutive ranks (tp innermost, as
// torchtitan's mesh) and the data-parallel groups across them; t->d becomes this rank's DP
// group, so data, loss and gradient sums run over the data-parallel ranks only.
static int setup_tp_groups(trainer *t, ct_error *err) {
    dist *in = stage_ranks(t);
    const int tp = t->tp, P = in->size, r = in->rank;
    if (P % tp != 0)
        return ct_fail(err, "parallelism.tensor_parallel_degree = %d does not divide the %d ranks%s",
                       tp, P, t->pp > 1 ? " of a pipeline stage" : "");
    if (dist_split(in, r / tp, r % tp, &t->tp_group, err) != 0 ||
        dist_split(in, r % tp, r / tp, &t->dp_group, err) != 0)
        return -1;
    t->d = &t->dp_group;
    return 0;
}

// Expert parallelism: EP groups of ep consecutive data-parallel ranks (t->d's order: replicate,
// shard, cp; under TP with etp 1, of the stage's ranks (the world without PP), TP innermost; with
// etp = tp, of this TP rank's data-parallel ranks, and the blocks of ep x tp ranks of the stage),
// and across them the ranks
// that hold the same experts. This rank's local model holds experts [rank * E/ep,
// (rank + 1) * E/ep) of every sparse layer.
static int setup_ep(trainer *t, qwen3_config *mc, ct_error *err) {
    dist *from = t->tp > 1 && t->etp == 1 ? stage_ranks(t) : t->d;
    const int ep = t->ep, r = from->rank, E = mc->num_experts;
    if (E == 0)
        return ct_fail(err, "parallelism.expert_parallel_degree = %d: the model has no experts "
                            "(a dense Qwen3)",
                       ep);
    if (E % ep != 0)
        return ct_fail(err,
                       "parallelism.expert_parallel_degree = %d does not divide num_experts = %d",
                       ep, E);
    if (dist_split(from, r / ep, r % ep, &t->ep_group, err) != 0 ||
        dist_split(from, r % ep, r / ep, &t->erep_group, err) != 0)
        return -1;
    // etp = tp: TP innermost in the stage's ranks (the world without PP)
    dist *in = stage_ranks(t);
    const int block = ep * t->tp, w = in->rank;
    if (t->etp > 1 && dist_split(in, w / block, w % block, &t->eblock_group, err) != 0) return -1;
    mc->local_experts = E / ep;
    mc->expert_lo = t->ep_group.rank * mc->local_experts;
    return 0;
}

// Under TP, EP or PP, a refusal every rank meets alike, printed once (by rank 0): agreed over
// the world.
static int tp_agree(trainer *t, int rc, ct_error *err) {
    return t->tp > 1 || t->ep > 1 || t->pp > 1 ? dist_agree(t->world, rc, "the parallel setup", err)
                                               : rc;
}

// Pipeline parallelism: pp outermost, as torchtitan's mesh: ranks [s * W/pp, (s + 1) * W/pp)
// form stage group s's data-parallel ranks (t->d), and the ranks of one data-parallel index
// across the stage groups the pp group.
static int setup_pp_groups(trainer *t, ct_error *err) {
    const int pp = t->pp, W = t->world->size, r = t->world->rank;
    int rc = 0;
    if (W % pp != 0)
        rc = ct_fail(err, "parallelism.pipeline_parallel_degree = %d does not divide the %d ranks",
                     pp, W);
    if (tp_agree(t, rc, err) != 0) return -1;
    const int per = W / pp;
    if (dist_split(t->world, r % per, r / per, &t->pp_group, err) != 0 ||
        dist_split(t->world, r / per, r % per, &t->stage_group, err) != 0)
        return -1;
    t->d = &t->stage_group; // under TP, split further (setup_tp_groups)
    t->strat.pp.group = &t->pp_group;
    return 0;
}

// This rank's stages under PP: the split, its stages' local layers, and the local model.
static int pp_local_config(trainer *t, qwen3_config *mc, ct_error *err) {
    const ct_config_parallelism *c = &t->cfg->parallelism;
    strategy_pp_state *p = &t->strat.pp;
    if (mc->tie_word_embeddings)
        return ct_fail(err,
                       "parallelism.pipeline_parallel_degree = %d with tied embeddings "
                       "(model.tie_embeddings): refused, as torchtitan does; untie them",
                       t->pp);
    if (pp_schedule_parse(c->pipeline_parallel_schedule, &p->kind, err) != 0 ||
        pp_split(p->stage, (int)(sizeof p->stage / sizeof p->stage[0]), &p->S,
                 mc->num_hidden_layers, t->pp, p->kind, c->pipeline_parallel_layers_per_stage,
                 c->pipeline_parallel_first_stage_less_layers,
                 c->pipeline_parallel_last_stage_less_layers, c->module_fqns_per_model_part,
                 err) != 0)
        return -1;
    p->v = p->S / t->pp;
    p->m = t->accum;
    if (p->v > PP_MAX_LOCAL || p->v > QWEN3_MAX_PARTS)
        return ct_fail(err, "parallelism.pipeline_parallel_degree = %d: %d stages per rank; at "
                            "most %d",
                       t->pp, p->v, PP_MAX_LOCAL);
    for (int k = 0; k < p->v; k++) {
        const pp_stage *s = &p->stage[k * t->pp + p->group->rank];
        p->l0[k] = k ? p->l1[k - 1] : 0;
        p->l1[k] = p->l0[k] + s->hi - s->lo;
    }
    return strategy_pp_local_config(t, p->group->rank, mc, err);
}

// This rank's local model under TP, and the sequence cut.
static int tp_local_config(trainer *t, qwen3_config *mc, ct_error *err) {
    if (t->T % t->tp != 0)
        return ct_fail(err,
                       "parallelism.tensor_parallel_degree = %d does not divide training.seq_len "
                       "= %d (sequence parallelism cuts each batch's tokens over the TP ranks)",
                       t->tp, t->T);
    return qwen3_tp_config(mc, &t->setup.model, t->tp, t->etp, err);
}

int trainer_setup(trainer *t, const ct_config *c, FILE *log, ct_error *err) {
    t->cfg = c;
    t->world = t->d;
    t->tp = c->parallelism.tensor_parallel_degree;
    t->ep = c->parallelism.expert_parallel_degree;
    t->etp = t->ep > 1 ? c->parallelism.expert_tensor_parallel_degree : t->tp;
    t->pp = c->parallelism.pipeline_parallel_degree;
    if (t->pp > 1 && setup_pp_groups(t, err) != 0) return -1;
    if (t->tp > 1 && setup_tp_groups(t, err) != 0) return -1;
    t->B = c->training.local_batch_size;
    t->T = c->training.seq_len;
    t->cp = c->parallelism.context_parallel_degree;
    t->log = is_root(t) ? log : fopen("/dev/null", "w");
    if (!t->log) return ct_fail(err, "rank %d: cannot open /dev/null for its log", t->d->rank);
    t->d->timeout_s = c->comm.init_timeout_seconds;
    snprintf(t->ckpt_root, sizeof t->ckpt_root, "%s/%s", c->job.dump_folder, c->checkpoint.folder);
    // A CP refusal every rank meets alike, printed once: agreed over the world.
    if (t->cp > 1 && dist_agree(t->world, cp_setup(t, err), "the context-parallel setup", err) != 0)
        return -1;
    if (t->cp > 1 && cp_split(t, err) != 0) return -1;
    if (tp_agree(t, setup_parallel(t, err), err) != 0) return -1;
    setup_threads(t);
    // First thing after the config: the plugins' parity check forks, which must precede any
    // OpenMP region.
    run_setup_opts so = {.log = t->log, .warn = is_root(t) ? stderr : NULL, .d = t->d};
    if (run_setup_open(&t->setup, c, &so, err) != 0) return -1;
    qwen3_config mc = t->setup.model; // under TP: this rank's local model
    if (t->tp > 1 && tp_agree(t, tp_local_config(t, &mc, err), err) != 0) return -1;
    if (t->pp > 1 && tp_agree(t, pp_local_config(t, &mc, err), err) != 0) return -1;
    if (t->cp > 1) { // the model holds its T / cp rows of each sequence
        t->setup.T = t->T / t->cp;
        t->setup.mem_opts.cp = t->cp;
        t->setup.mem_opts.cp_ring =
            strcmp(c->parallelism.context_parallel_rotate_method, "alltoall") == 0;
        // The loss head's automatic chunk (sized for the whole sequence's logits) splits as
        // every other activation does: 1/cp of one process's.
        if (c->training.loss_chunk_tokens < 0 && t->setup.mem_opts.loss_chunk > 0)
            t->setup.mem_opts.loss_chunk = (t->setup.mem_opts.loss_chunk + t->cp - 1) / t->cp;
    }
    if (t->ep > 1 && tp_agree(t, setup_ep(t, &mc, err), err) != 0) return -1;
    // Under PP: a checkpoint's writers, the first replica's ranks (its TP or EP ranks too; under
    // EP x TP each stage's first EP block, its ep x etp first ranks), in world order (pipeline
    // rank, then the rank in the stage): one shard each.
    if (t->pp > 1 && dist_split(t->world, t->stage_group.rank >= t->ep * t->etp, t->world->rank,
                                &t->pp_writers, err) != 0)
        return -1;
    const qwen3_memory_opts *mo = &t->setup.mem_opts;
    if (check_plan(t, err) != 0) return -1;
    if (config_text(&t->config_toml, c, err) != 0) return -1;

    ct_backend *be = t->setup.be;
    if (c->lora.rank > 0) { // the base frozen and held once, the adapter trained
        lora_config lc;
        if (config_lora(&lc, c, err) != 0 ||
            qwen3_init_lora(&t->model, &mc, be, &t->setup.ops, mo, &lc, err) != 0)
            return -1;
        fprintf(t->log,
                "lora: rank %d, alpha %g (scaling %g%s), dropout %g, %s: %zu adapter parameters "
                "(%d tensors); the base is frozen%s\n",
                lc.rank, (double)lc.alpha, (double)lora_scale(&lc), lc.use_rslora ? ", rsLoRA" : "",
                (double)lc.dropout, c->lora.target_modules, t->model.lora->L.num,
                t->model.lora->L.n, t->model.weights16 ? ", held in bf16 only" : "");
    } else if (qwen3_init_on(&t->model, &mc, be, &t->setup.ops, err) != 0) {
        return -1;
    }
    fprintf(t->log, "backend: %s\n", be->name);
    t->model.mem_opts = *mo;
    t->model.mem_opts.sp = t->tp; // sequence parallelism: the shard's buffers are N / tp rows
    if (qwen3_plan(&t->model, t->B, t->T / t->cp, err) != 0 || setup_moe(t, err) != 0) return -1;
    fprintf(t->log,
            "model: %s, %d layers, hidden %d, heads %d/%d kv, head_dim %d, ffn %d, vocab %d, "
            "%s, %zu parameters\n",
            strcmp(c->model.backend, "hf") == 0 ? c->model.hf_path : c->model.flavor,
            mc.num_hidden_layers, mc.hidden_size, mc.num_attention_heads, mc.num_key_value_heads,
            mc.head_dim, mc.intermediate_size, mc.vocab_size,
            mc.tie_word_embeddings ? "tied" : "untied", qwen3_num_hf_parameters(&t->model));
    run_setup_log_kernels(&t->setup, t->log);
    if (mo->loss_chunk > 0)
        fprintf(t->log, "loss head: in chunks of %d tokens (training.loss_chunk_tokens)\n",
                mo->loss_chunk);
    if (mo->ac_op)
        fprintf(t->log,
                "activation checkpointing: selective op, every layer keeps its GEMM and attention "
                "outputs and recomputes its norms, q/k norm + RoPE and SwiGLU in the backward\n");
    else if (mo->ac_every > 0) {
        int n = 0;
        for (int l = 0; l < mc.num_hidden_layers; l++)
            n += qwen3_layer_checkpointed(mo->ac_every, l);
        fprintf(t->log,
                "activation checkpointing: %s, %d of %d layers recompute their forward in the "
                "backward\n",
                c->activation_checkpoint.mode, n, mc.num_hidden_layers);
    }
    if (t->cp > 1) {
        if (cp_attach(t, err) != 0) return -1;
        fprintf(t->log,
                "context parallel: %d ranks per sequence, each 2 chunks of %d tokens (headtail), "
                "ring attention by %s; data parallel over %d%s\n",
                t->cp, t->T / (2 * t->cp), c->parallelism.context_parallel_rotate_method,
                cp_dp_size(t),
                strcmp(t->setup.attn_backend, "sdpa") == 0
                    ? "; with model.attn_backend sdpa too, the chunk pairs run the ring's "
                      "online-softmax kernels (attention_pair), which return the lse the merge "
                      "needs"
                    : "");
    }
    if (setup_optimizer(t, err) != 0 || setup_weights(t, err) != 0) return -1;
    t->strat.vt->weights_ready(t);
    if (dist_agree(t->d, setup_data(t, err), "opening the data", err) != 0) return -1;

    t->save_tag = (long)getpid(); // world rank 0's: one temporary folder for every rank's files
    if (dist_bcast(t->world, &t->save_tag, sizeof t->save_tag, 0, "the checkpoint tag", err) != 0)
        return -1;
    size_t n = (size_t)t->accum * t->B * t->T;
    t->inputs = malloc(n * sizeof *t->inputs);
    t->targets = malloc(n * sizeof *t->targets);
    if (run_data_block_causal(c)) t->positions = malloc(n * sizeof *t->positions);
    if (!t->inputs || !t->targets || (run_data_block_causal(c) && !t->positions))
        return ct_fail(err, "out of memory for the batch buffers");
    t->flops_per_token = metrics_flops_per_token_lora( // the whole model's (tps is per rank)
        &t->setup.model, t->T, t->model.lora != NULL,
        t->model.lora ? lora_active_params(&t->model.lora->L, &t->setup.model) : 0);
    char peak_source[4200];
    t->peak_gflops = peak_gflops(c->metrics.peak_gflops, omp_get_max_threads(),
                                 t->model.mem_opts.bf16, peak_source, sizeof peak_source);
    fprintf(t->log,
            "batch: %d sequences of %d tokens per step = %d rank(s) x %d micro-batch(es) x %d\n"
            "mfu: against a peak of %.1f GFLOP/s per rank (%s)\n",
            t->global_batch, t->T, t->cp > 1 ? cp_dp_size(t) : t->d->size, t->accum, t->B,
            t->peak_gflops, peak_source);
    // The dump folder changes only now, when nothing can refuse the run any more.
    int rc = is_root(t) ? save_config(t, err) : 0;
    if (dist_agree(t->d, rc, "writing the run's config", err) != 0) return -1;
    rc = is_root(t) ? metrics_open(&t->metrics, log, c->job.dump_folder, t->state.step, err) : 0;
    return dist_agree(t->d, rc, "opening metrics.jsonl", err);
}

void trainer_free(trainer *t) {
    metrics_close(&t->metrics);
    free(t->inputs);
    free(t->targets);
    free(t->config_toml);
    loader_free(&t->train_loader);
    if (t->has_val) loader_free(&t->val_loader);
    stream_free(&t->train_data);
    stream_free(&t->val_data);
    run_text_free(&t->text);
    free(t->positions);
    if (t->strat.vt) t->strat.vt->free(t);
    adamw_free(&t->opt);
    moe_balance_free(&t->moe);
    if (t->cp > 1) cp_free(t);
    qwen3_free(&t->model);
    if (t->tp > 1) {
        t->d = t->world;
        dist_group_free(&t->dp_group);
        dist_group_free(&t->tp_group);
    }
    if (t->pp > 1) {
        t->d = t->world;
        dist_group_free(&t->pp_writers);
        dist_group_free(&t->stage_group);
        dist_group_free(&t->pp_group);
    }
    if (t->ep > 1) {
        if (t->etp > 1) dist_group_free(&t->eblock_group);
        dist_group_free(&t->erep_group);
        dist_group_free(&t->ep_group);
    }
    run_setup_close(&t->setup);
    if (t->log && !is_root(t)) fclose(t->log);
}
