// One run setup for train, verify, generate and check-kernels: from the parsed config it resolves
// the model's architecture, chooses the kernels (model.moe_impl, model.attn_backend), runs plugin
// trust (load, parity check, refuse or apply: plugin/trusted_ops.c), fills the op table the
// model runs, and checks that the run fits in memory. So every command runs the kernels the
// config names: verify computes with the attention kernel train uses.
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "backend/backend.h"
#include "core/error.h"
#include "parallel/dist.h"
#include "model/qwen3.h"
#include "model/qwen3_config.h"
#include "ops/ops.h"
#include "plugin/kernel_check.h"
#include "plugin/override.h"
#include "train/config.h"

typedef struct run_setup_opts {
    FILE *log;  // what the plugins override and the parity check's table (NULL: not printed)
    FILE *warn; // override.allow_mismatch's warning also goes here (NULL: the log only)
    dist *d;    // the ranks, which agree on the plugins' outcome (NULL: this process alone)
    // check-kernels: load and check the plugins and keep the report in `check`; refuse nothing,
    // apply nothing (ops stays the built-in table).
    bool check_only;
} run_setup_opts;

typedef struct run_setup {
    qwen3_config model;                         // the architecture (run_setup_model_config)
    char model_source[CT_CONFIG_PATH_MAX + 64]; // where it came from, for messages
    int B, T; // training.local_batch_size and training.seq_len: the shape the memory plan is for

    // Where the model's tensors live and its kernels run: the plain CPU backend, or the guarded
    // one (debug.guard_device_memory). A CUDA backend would be chosen here. `builtin` below is
    // the CPU's table; the model binds `ops` to the backend.
    ct_backend *be;
    // training.mixed_precision_param, whether a plugin's matmul keeps it in fp32, and whether
    // a plugin's experts keep them in fp32
    char precision[CT_CONFIG_NAME_MAX];
    bool matmul_plugin, moe_plugin;
    FILE *warn; // run_setup_opts.warn: where warnings also go

    // "flash" | "sdpa": model.attn_backend, "auto" resolved to "flash"
    char attn_backend[CT_CONFIG_NAME_MAX];
    char moe_impl[CT_CONFIG_NAME_MAX]; // "grouped" | "loop": model.moe_impl
    ct_ops builtin;                    // the CPU table with those kernels: the plugins' reference
    // What the model runs (qwen3_init keeps a pointer to it, so the setup outlives the model):
    // builtin, then the trusted plugin kernels, then debug.profile_ops' timing wrappers.
    ct_ops ops;
    override_set overrides;     // the plugins of override.imports (empty without)
    bool plugins_applied;       // their kernels are in ops (not with check_only)
    kernel_check_report check;  // check_only: the parity check's report (else empty)
    qwen3_memory_opts mem_opts; // activation checkpointing and the chunked loss head
    bool allow_overcommit;      // training.allow_overcommit
} run_setup;

// The architecture a config describes: backend=hf reads hf_path/config.json, backend=native
// takes the flavor with the model.* overrides applied; the load-balancing loss keys apply to
// either.
int run_setup_model_config(qwen3_config *out, const ct_config *c, ct_error *err);

// Model config, kernels, plugin trust (in that order), the op table and the memory options.
// With o->d, the ranks agree on the plugins' outcome (every rank checks its own). Call it
// before the process's first OpenMP parallel region: the parity check forks. On error the
// setup holds nothing; else run_setup_close releases it, and closes the backend (its kernel
// state): call it after freeing the model bound to it.
int run_setup_open(run_setup *s, const ct_config *c, const run_setup_opts *o, ct_error *err);
void run_setup_close(run_setup *s);

// What runs attention: "flash", "sdpa", or "from a plugin".
const char *run_setup_attention(const run_setup *s);
// The line "kernels: attention flash[, experts grouped]" (experts for a MoE model).
void run_setup_log_kernels(const run_setup *s, FILE *f);

// params, grads and activations at B x T with the setup's ops and memory options: exactly what
// qwen3_init + qwen3_plan will allocate.
qwen3_memory run_setup_plan(const run_setup *s);

// The memory a run needs on one rank and on its node, in bytes.
typedef struct run_memory {
    qwen3_memory model;      // params, grads, activations: run_setup_plan
    double optimizer, batch; // what the caller adds: optimizer state and token buffers
    double total;            // per rank: all of the above
    int ranks_per_node;
    double node;    // total x ranks_per_node: the ranks on a node share its memory
    uint64_t avail; // available on this node (0: unknown)
} run_memory;
run_memory run_setup_memory(const run_setup *s, double optimizer_bytes, double batch_bytes,
                            int ranks_per_node);
// The same for a LoRA run: the frozen base as held once (qwen3_init_forward_only's bytes), the
// adapter (adapter_bytes) and its gradients; optimizer_bytes the adapter's moments.
run_memory run_setup_memory_lora(const run_setup *s, double adapter_bytes, double optimizer_bytes,
                                 double batch_bytes, int ranks_per_node);
// The same for a forward-only model (eval): its weights as qwen3_init_forward_only holds them
// (each once, bf16 where the bf16 kernels read it), the forward's buffers as it plans them
// (qwen3_forward_only_opts), no gradients.
run_memory run_setup_memory_forward_only(const run_setup *s, double batch_bytes);
// Refuses a run that cannot fit, before anything is allocated: T beyond the model's positions,
// or m->node above the available memory (unless training.allow_overcommit). `what` names the
// run in the message ("the run", "DIR with batch 8 x seq_len 2048"); overcommit_option: the
// message offers --training.allow_overcommit (the command takes it).
int run_setup_check_fit(const run_setup *s, const run_memory *m, const char *what,
                        bool overcommit_option, ct_error *err);
// generate's check, before the weights load: the weights (as a forward-only model holds them)
// and the KV cache with the inference buffers for cache_len positions (qwen3_gen_memory) must
// fit in the available memory (unless training.allow_overcommit). The refusal is one line naming both parts.
int run_setup_check_generate_fit(const run_setup *s, int cache_len, ct_error *err);
