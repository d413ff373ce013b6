// The training config: one key table drives defaults, value parsing, the effective-config dump,
// --help and hashing. Loading (file, command line, suggestions) is in config_load.c, torchtitan's
// extra keys and aliases in config_compat.c, cross-key checks in config_validate.c.
#include "train/config.h"

#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/suggest.h"
#include "io/atomic.h"
#include "io/toml.h"
#include "train/config_internal.h"

#define FIELD(sec, name) offsetof(ct_config, sec.name), sizeof(((ct_config *)0)->sec.name)
#define KEY(sec, name, type, def, choices, hashed, help)                                           \
    { #sec, #name, type, FIELD(sec, name), def, choices, hashed, help }

// Sections in the order they are written; keys within a section likewise.
const config_key config_table[] = {
    KEY(job, dump_folder, CONFIG_STR, "./outputs", NULL, false,
        "folder for everything the run writes: checkpoints, metrics.jsonl, config.toml"),
    KEY(job, description, CONFIG_STR, "", NULL, false, "free text describing the run"),

    KEY(model, name, CONFIG_STR, "qwen3", NULL, false,
        "torchtitan's model name: qwen3 (dense and MoE), or transformers_modeling_backend to "
        "train the HF folder [hf_transformers] model (= backend hf)"),
    KEY(model, hf_assets_path, CONFIG_STR, "", NULL, false,
        "torchtitan's HF assets folder: the tokenizer (unless tokenizer_path is set) and the "
        "weights checkpoint.initial_load_in_hf loads (unless initial_load_path is set)"),
    KEY(model, backend, CONFIG_STR, "native", "native|hf", true,
        "where the architecture and weights come from: a built-in flavor, or an HF folder "
        "(the default when model.hf_path is given without model.flavor)"),
    KEY(model, flavor, CONFIG_STR, "debugmodel", NULL, true,
        "native flavor: debugmodel, 0.6B, 1.7B, 4B, 8B, 14B, 32B; MoE: debugmodel_moe, "
        "30B-A3B, 235B-A22B"),
    KEY(model, hf_path, CONFIG_STR, "", NULL, true,
        "backend=hf: folder with config.json, *.safetensors and tokenizer.json"),
    KEY(model, tokenizer_path, CONFIG_STR, "", NULL, true,
        "folder with tokenizer.json (default: hf_path for backend=hf, else "
        "assets/qwen3-tokenizer)"),
    KEY(model, n_layers, CONFIG_INT, "0", NULL, true,
        "override the flavor's layer count (0: keep)"),
    KEY(model, dim, CONFIG_INT, "0", NULL, true, "override the flavor's hidden size (0: keep)"),
    KEY(model, n_heads, CONFIG_INT, "0", NULL, true, "override the flavor's query heads (0: keep)"),
    KEY(model, n_kv_heads, CONFIG_INT, "0", NULL, true,
        "override the flavor's key/value heads (0: keep)"),
    KEY(model, head_dim, CONFIG_INT, "0", NULL, true, "override the flavor's head_dim (0: keep)"),
    KEY(model, ffn_dim, CONFIG_INT, "0", NULL, true,
        "override the flavor's MLP intermediate size (0: keep)"),
    KEY(model, vocab_size, CONFIG_INT, "0", NULL, true,
        "override the flavor's vocabulary size (0: keep)"),
    KEY(model, max_seq_len, CONFIG_INT, "0", NULL, true,
        "override the flavor's max_position_embeddings (0: keep)"),
    KEY(model, tie_embeddings, CONFIG_TRISTATE, "auto", NULL, true,
        "true/false override the flavor's tie_word_embeddings; \"auto\" keeps it"),
    KEY(model, num_experts, CONFIG_INT, "0", NULL, true,
        "override a MoE flavor's routed experts per sparse layer (0: keep)"),
    KEY(model, num_experts_per_tok, CONFIG_INT, "0", NULL, true,
        "override a MoE flavor's experts per token, the router's top-k (0: keep)"),
    KEY(model, moe_intermediate_size, CONFIG_INT, "0", NULL, true,
        "override a MoE flavor's expert intermediate size (0: keep)"),
    KEY(model, moe_impl, CONFIG_STR, "grouped", "grouped|loop", false,
        "MoE expert kernel: grouped (tokens sorted by expert) or loop (the reference); not "
        "hashed: they differ only in fp32 rounding"),
    KEY(model, attn_mask_type, CONFIG_STR, "causal", "causal|block_causal", true,
        "causal: a token sees every earlier token of its window; block_causal: only those of its "
        "own document (documents end at <|endoftext|>, a conversation is one), with RoPE "
        "positions restarting at 0 for each, and no target across a document boundary"),
    KEY(model, attn_backend, CONFIG_STR, "auto", "auto|sdpa|flash", false,
        "attention kernel: sdpa (the reference: materialised scores, batched GEMMs), flash "
        "(tiled, online softmax, O(seq_len) memory) or auto (flash: faster at every length "
        "measured)"),
    KEY(model, load_balance, CONFIG_STR, "hf", "hf|aux_free|none", true,
        "MoE load balancing: hf (HF's aux loss, times router_aux_loss_coef, added when "
        "output_router_logits is on), aux_free (torchtitan's expert bias, no aux loss) or none"),
    KEY(model, load_balance_coeff, CONFIG_FLOAT, "1e-3", NULL, true,
        "load_balance = aux_free: the expert-bias step per optimizer step (torchtitan's "
        "load_balance_coeff)"),
    KEY(model, router_aux_loss_coef, CONFIG_FLOAT, "-1", NULL, true,
        "MoE aux loss coefficient (-1: the model config's router_aux_loss_coef)"),
    KEY(model, output_router_logits, CONFIG_TRISTATE, "auto", NULL, true,
        "MoE: true adds the aux loss (load_balance = hf); \"auto\" keeps the model config's "
        "output_router_logits"),

    KEY(hf_transformers, model, CONFIG_STR, "", NULL, false,
        "with model.name = transformers_modeling_backend: the HF folder to train (a hub id must "
        "be downloaded first)"),

    KEY(training, dataset, CONFIG_STR, "", NULL, false,
        "torchtitan's data set name (c4, ...): a name only, since nothing is downloaded; the "
        "data is training.dataset_path"),
    KEY(training, dataset_path, CONFIG_STR, "", NULL, true,
        "training data: a .txt, .jsonl (\"text\", \"messages\" or \"ids\" lines) or .npy "
        "file, or a folder of them"),
    KEY(training, train_on, CONFIG_STR, "assistant", "assistant|all", true,
        "which tokens of a conversation are trained: its assistant turns (from after "
        "<|im_start|>assistant\\n through <|im_end|>) or all; text is always trained whole"),
    KEY(training, local_batch_size, CONFIG_INT, "8", NULL, false,
        "sequences per worker per micro-step (not hashed: a resume may split the same global "
        "batch differently)"),
    KEY(training, global_batch_size, CONFIG_INT, "-1", NULL, true,
        "sequences per optimizer step over all workers; a multiple of local_batch_size * "
        "data-parallel degree gives gradient accumulation (-1: no accumulation)"),
    KEY(training, seq_len, CONFIG_INT, "2048", NULL, true, "tokens per sequence"),
    KEY(training, steps, CONFIG_INT, "10000", NULL, false, "optimizer steps to train"),
    KEY(training, max_norm, CONFIG_FLOAT, "1.0", NULL, true,
        "clip the global gradient norm to this (0: off)"),
    KEY(training, shuffle, CONFIG_BOOL, "true", NULL, true,
        "permute the windows of each epoch with a seeded RNG"),
    KEY(training, max_skipped_steps, CONFIG_INT, "3", NULL, false,
        "stop with an error after this many non-finite steps in a row"),
    KEY(training, allow_overcommit, CONFIG_BOOL, "false", NULL, false,
        "train even when the memory estimate exceeds the available memory"),
    KEY(training, loss_chunk_tokens, CONFIG_INT, "-1", NULL, false,
        "compute the loss head (logits, cross-entropy and their gradient) in chunks of this many "
        "tokens, so the (tokens x vocab) logits are never held at once; 0: whole; -1: auto "
        "(chunks of at most 256 MiB of logits, 64 MiB with activation checkpointing; under context "
        "parallelism 1/context_parallel_degree of that per rank)"),
    KEY(training, mixed_precision_param, CONFIG_STR, "float32", "float32|bfloat16", true,
        "the dtype the linear layers compute in: float32 (exact parity, ctitan's default) or "
        "bfloat16 (bf16 GEMMs with fp32 accumulation; train keeps its weights, gradients and "
        "optimizer in fp32, torchtitan's default; eval and generate hold only the bf16 weights)"),
    KEY(training, mixed_precision_reduce, CONFIG_STR, "float32", "float32|bfloat16", true,
        "the dtype data parallelism sums gradients in: float32, or bfloat16 (half the bytes, each "
        "addition rounded to bf16; the sum returns to the fp32 gradient)"),

    KEY(optimizer, name, CONFIG_STR, "AdamW", "AdamW", true, "optimizer"),
    KEY(optimizer, lr, CONFIG_FLOAT, "8e-4", NULL, true, "peak learning rate"),
    KEY(optimizer, beta1, CONFIG_FLOAT, "0.9", NULL, true, "AdamW beta1"),
    KEY(optimizer, beta2, CONFIG_FLOAT, "0.95", NULL, true, "AdamW beta2"),
    KEY(optimizer, eps, CONFIG_FLOAT, "1e-8", NULL, true, "AdamW epsilon"),
    KEY(optimizer, weight_decay, CONFIG_FLOAT, "0.1", NULL, true, "decoupled weight decay"),
    KEY(optimizer, decay_norms_and_embeddings, CONFIG_BOOL, "true", NULL, true,
        "true: every parameter decays (torchtitan); false: norms, biases and embeddings do "
        "not"),

    KEY(lr_scheduler, warmup_steps, CONFIG_INT, "200", NULL, true,
        "linear warmup steps: lr factor (step+1)/warmup_steps; clamped to training.steps"),
    KEY(lr_scheduler, decay_ratio, CONFIG_FLOAT, "", NULL, true,
        "fraction of the steps, at the end, over which the lr decays (0: no decay; unset: every "
        "step after the warmup, as torchtitan)"),
    KEY(lr_scheduler, decay_type, CONFIG_STR, "linear", "linear|sqrt|cosine", true,
        "shape of the decay"),
    KEY(lr_scheduler, min_lr_factor, CONFIG_FLOAT, "0.0", NULL, true,
        "the lr factor the decay ends at"),

    KEY(checkpoint, enable, CONFIG_BOOL, "true", NULL, false, "save checkpoints and resume"),
    KEY(checkpoint, folder, CONFIG_STR, "checkpoint", NULL, false,
        "checkpoint folder, relative to job.dump_folder"),
    KEY(checkpoint, interval, CONFIG_INT, "500", NULL, false, "save every this many steps"),
    KEY(checkpoint, keep_latest_k, CONFIG_INT, "10", NULL, false,
        "keep the newest k checkpoints (0: keep all)"),
    KEY(checkpoint, initial_load_path, CONFIG_STR, "", NULL, false,
        "start from this checkpoint (or HF folder) when the run has none of its own"),
    KEY(checkpoint, initial_load_in_hf, CONFIG_BOOL, "false", NULL, false,
        "initial_load_path is a Hugging Face folder"),
    KEY(checkpoint, last_save_in_hf, CONFIG_BOOL, "false", NULL, false,
        "the final save is a Hugging Face folder in export_dtype"),
    KEY(checkpoint, last_save_model_only, CONFIG_BOOL, "false", NULL, false,
        "torchtitan's: the final save holds the model only, in export_dtype; here that is the "
        "HF export, so true implies last_save_in_hf"),
    KEY(checkpoint, export_dtype, CONFIG_STR, "float32", "float32|bfloat16|float16", false,
        "dtype of the final Hugging Face save"),

    KEY(metrics, log_freq, CONFIG_INT, "10", NULL, false,
        "log a metrics line every this many steps"),
    KEY(metrics, peak_gflops, CONFIG_FLOAT, "0.0", NULL, false,
        "per-worker peak GFLOP/s for MFU (0: measure once at start)"),

    KEY(validation, enable, CONFIG_BOOL, "false", NULL, false, "report validation loss"),
    KEY(validation, dataset, CONFIG_STR, "", NULL, false,
        "torchtitan's validation data set name: a name only; the data is validation.dataset_path"),
    KEY(validation, dataset_path, CONFIG_STR, "", NULL, false,
        "validation data, in the forms training.dataset_path takes"),
    KEY(validation, freq, CONFIG_INT, "500", NULL, false, "validate every this many steps"),
    KEY(validation, steps, CONFIG_INT, "10", NULL, false,
        "steps per validation, each a local batch on every data-parallel rank (torchtitan's), at "
        "most one pass over the split (-1: the whole split)"),

    KEY(debug, seed, CONFIG_INT64, "0", NULL, true, "seed for weight init and data shuffling"),
    KEY(debug, fault, CONFIG_STR, "none", "none|bad_token|nan|exit|hang|weights", false,
        "test only: inject a failure on debug.fault_rank at debug.fault_step (weights: move one "
        "weight by an ulp before that step's save, which the ranks' hash check must refuse)"),
    KEY(debug, fault_rank, CONFIG_INT, "0", NULL, false, "the rank debug.fault hits"),
    KEY(debug, fault_step, CONFIG_INT, "1", NULL, false, "the step (from 1) debug.fault hits"),
    KEY(debug, profile_ops, CONFIG_BOOL, "false", NULL, false,
        "time every op and print a table of ms per step and share of the step at the end "
        "(train: the first step, a warm-up, left out; generate: each prompt's decode steps)"),
    KEY(debug, guard_device_memory, CONFIG_BOOL, "false", NULL, false,
        "test only, slow: keep every model, gradient, optimizer and activation buffer "
        "inaccessible (mprotect) outside backend calls, so host code that touches backend memory "
        "directly crashes where a GPU build would; results are bit-identical"),

    KEY(parallelism, data_parallel_shard_degree, CONFIG_INT, "-1", NULL, false,
        "ranks that shard the model: FSDP (parameters, gradients and optimizer state), or the "
        "optimizer state only under data_parallel_shard_mode = \"zero1\" (-1: every rank not "
        "used by data_parallel_replicate_degree)"),
    KEY(parallelism, data_parallel_replicate_degree, CONFIG_INT, "1", NULL, false,
        "groups of data_parallel_shard_degree ranks that each hold the whole model: DDP with "
        "shard degree 1, HSDP above (shard * replicate = ranks)"),
    KEY(parallelism, tensor_parallel_degree, CONFIG_INT, "1", NULL, false,
        "ranks that split each layer (torchtitan's TP with sequence parallelism and loss "
        "parallel; tp innermost: ranks [k*tp, (k+1)*tp) form a group); dense models, with DDP "
        "(data_parallel_replicate_degree) over the remaining ranks"),
    KEY(parallelism, context_parallel_degree, CONFIG_INT, "1", NULL, false,
        "ranks that split each sequence (torchtitan's CP: ring attention over headtail chunks; "
        "inside data parallelism, outside tp: ranks [k*cp, (k+1)*cp) form a group; FSDP shards "
        "over dp_shard x cp); seq_len must divide by 2 * cp"),
    KEY(parallelism, context_parallel_rotate_method, CONFIG_STR, "allgather", "allgather|alltoall",
        false,
        "how the ring attention moves keys and values: allgather (all at once, then the "
        "gradients back by one all-to-all) or alltoall (passed along the ring, one peer's at a "
        "time, the gradients travelling with them); the same bits"),
    KEY(parallelism, expert_parallel_degree, CONFIG_INT, "1", NULL, false,
        "ranks that split each MoE layer's experts (EP: E/ep whole experts each, tokens sent to "
        "their experts by all-to-all); carved out of the data-parallel ranks, with DDP for the "
        "other parameters"),
    KEY(parallelism, expert_tensor_parallel_degree, CONFIG_INT, "1", NULL, false,
        "TP inside each expert under EP: 1 (torchtitan's two choices are 1 and "
        "tensor_parallel_degree; EP with TP is not supported yet)"),
    KEY(parallelism, pipeline_parallel_degree, CONFIG_INT, "1", NULL, false,
        "pipeline stages (PP, outermost: ranks [k*world/pp, (k+1)*world/pp) hold stage k's "
        "layers); with DDP (data_parallel_replicate_degree) inside each stage"),
    KEY(parallelism, pipeline_parallel_schedule, CONFIG_STR, "1F1B", NULL, false,
        "the pipeline's schedule, case-insensitive: 1F1B, GPipe (one stage per rank) or "
        "Interleaved1F1B (stages r, r+pp, ... on rank r); the same gradients"),
    KEY(parallelism, pipeline_parallel_microbatch_size, CONFIG_INT, "1", NULL, false,
        "sequences per pipeline micro-batch: training.local_batch_size / it micro-batches, "
        "which must divide"),
    KEY(parallelism, pipeline_parallel_layers_per_stage, CONFIG_INT, "0", NULL, false,
        "decoder layers per stage, the embedding and the head counting as one each (0: as "
        "many stages as the schedule places, the layers spread evenly)"),
    KEY(parallelism, pipeline_parallel_first_stage_less_layers, CONFIG_INT, "1", NULL, false,
        "layers the first stage holds fewer of (the embedding's share)"),
    KEY(parallelism, pipeline_parallel_last_stage_less_layers, CONFIG_INT, "1", NULL, false,
        "layers the last stage holds fewer of (the norm and head's share)"),
    KEY(parallelism, module_fqns_per_model_part, CONFIG_LIST, "", NULL, false,
        "the stages' modules by torchtitan's names, a list per stage (tok_embeddings, "
        "layers.N, norm, output), each stage's contiguous; empty: the default split"),
    KEY(parallelism, data_parallel_shard_mode, CONFIG_STR, "fsdp", "fsdp|zero1", false,
        "what data_parallel_shard_degree shards: fsdp (everything, unit by unit, torchtitan's "
        "meaning) or zero1 (the optimizer state only; every rank keeps the whole model)"),
    KEY(parallelism, fsdp_reshard_after_forward, CONFIG_STR, "default", "default|always|never",
        false,
        "FSDP: free each unit's gathered weights after its forward (default: all but the head; "
        "always; never: keep them for the backward, one all-gather fewer per unit)"),
    KEY(parallelism, threads_per_rank, CONFIG_INT, "0", NULL, false,
        "OpenMP and BLAS threads per rank (0: OMP_NUM_THREADS if set, else the node's cores "
        "divided among its ranks)"),

    KEY(comm, init_timeout_seconds, CONFIG_FLOAT, "300", NULL, false,
        "deadline of each wait between ranks during start-up"),
    KEY(comm, train_timeout_seconds, CONFIG_FLOAT, "100", NULL, false,
        "deadline of each wait between ranks during a training step"),
    KEY(comm, checkpoint_timeout_seconds, CONFIG_FLOAT, "1800", NULL, false,
        "deadline of each wait between ranks around a checkpoint save or export"),
    KEY(comm, bucket_cap_mb, CONFIG_FLOAT, "25", NULL, false,
        "gradient bucket size in MiB (as DDP's bucket_cap_mb)"),
    KEY(comm, overlap, CONFIG_BOOL, "true", NULL, false,
        "start each bucket's reduction during the backward, as soon as its gradients are "
        "final"),

    KEY(activation_checkpoint, mode, CONFIG_STR, "none", "none|full|selective", false,
        "recompute layer forwards in the backward: none, full (every layer) or selective "
        "(every selective_ac_option-th layer); the results are bit-identical"),
    KEY(activation_checkpoint, selective_ac_option, CONFIG_STR, "2", NULL, false,
        "selective: \"op\" (keep GEMM and attention outputs, recompute norms, RoPE, SwiGLU) "
        "or k (checkpoint every k-th layer)"),

    KEY(lora, rank, CONFIG_INT, "0", NULL, true,
        "PEFT's r: train a LoRA adapter of this rank on the frozen model (0: no LoRA, train every "
        "weight)"),
    KEY(lora, alpha, CONFIG_FLOAT, "8", NULL, true, "PEFT's lora_alpha: scaling alpha / rank"),
    KEY(lora, dropout, CONFIG_FLOAT, "0.0", NULL, true,
        "PEFT's lora_dropout, on the LoRA branch's input only"),
    KEY(lora, target_modules, CONFIG_LIST, "q_proj,v_proj", NULL, true,
        "the projections adapted: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, "
        "or \"all-linear\" (PEFT's default for Qwen3: q_proj, v_proj)"),
    KEY(lora, use_rslora, CONFIG_BOOL, "false", NULL, true, "rsLoRA: scaling alpha / sqrt(rank)"),
    KEY(lora, adapter_path, CONFIG_STR, "", NULL, false,
        "start from this PEFT adapter folder (adapter_config.json + adapter_model.safetensors)"),

    KEY(override, imports, CONFIG_LIST, "", NULL, false,
        "plugins (shared libraries, include/ctitan/plugin.h) whose kernels replace built-in ops; "
        "each override is checked against the built-in op before it is used"),
    KEY(override, allow_mismatch, CONFIG_BOOL, "false", NULL, false,
        "use overrides that fail the parity check anyway (warns loudly)"),
};

#define N_KEYS ((int)(sizeof config_table / sizeof config_table[0]))
const int config_n_keys = N_KEYS;
_Static_assert(sizeof config_table / sizeof config_table[0] <= CONFIG_MAX_KEYS,
               "raise CONFIG_MAX_KEYS");

const config_key *config_keys(int *n) {
    *n = N_KEYS;
    return config_table;
}

void config_full_name(char *buf, size_t cap, const config_key *k) {
    snprintf(buf, cap, "%s.%s", k->section, k->key);
}

int config_key_index(const char *full, size_t len) {
    for (int i = 0; i < N_KEYS; i++) {
        const config_key *k = &config_table[i];
        size_t ls = strlen(k->section), lk = strlen(k->key);
        if (len == ls + 1 + lk && memcmp(full, k->section, ls) == 0 && full[ls] == '.' &&
            memcmp(full + ls + 1, k->key, lk) == 0)
            return i;
    }
    return -1;
}

const config_key *config_find_key(const char *full_name) {
    int i = config_key_index(full_name, strlen(full_name));
    return i < 0 ? NULL : &config_table[i];
}

bool config_section_known(const char *s) {
    for (int i = 0; i < N_KEYS; i++)
        if (strcmp(config_table[i].section, s) == 0) return true;
    return false;
}

static void *field(ct_config *c, const config_key *k) {
    return (char *)c + k->offset;
}
static const void *cfield(const ct_config *c, const config_key *k) {
    return (const char *)c + k->offset;
}

// Is `s` one of the '|'-separated choices? Otherwise suggests the closest.
bool config_choice_ok(const config_key *k, const char *s, const char **suggestion) {
    *suggestion = NULL;
    if (!k->choices) return true;
    char buf[128];
    const char *names[8];
    int n = 0;
    snprintf(buf, sizeof buf, "%s", k->choices);
    for (char *save = NULL, *t = strtok_r(buf, "|", &save); t && n < 8;
         t = strtok_r(NULL, "|", &save)) {
        if (strcmp(t, s) == 0) return true;
        names[n++] = t;
    }
    const char *close = suggest_closest(s, names, n);
    // The buffer is local: hand back the matching choice inside k->choices instead.
    if (close) *suggestion = strstr(k->choices, close);
    return false;
}

// "one of \"a\", \"b\"" for messages.
void config_choices_text(char *out, size_t cap, const config_key *k) {
    size_t n = (size_t)snprintf(out, cap, "one of \"");
    for (const char *p = k->choices; *p && n + 4 < cap; p++) {
        if (*p == '|') {
            n += (size_t)snprintf(out + n, cap - n, "\", \"");
        } else {
            out[n++] = *p;
            out[n] = '\0';
        }
    }
    if (n + 2 < cap) snprintf(out + n, cap - n, "\"");
}

static void describe_value(char *out, size_t cap, const toml_value *v) {
    switch (v->type) {
    case TOML_STRING:
        snprintf(out, cap, "a string (\"%.80s\")", v->str);
        break;
    case TOML_INT:
        snprintf(out, cap, "an integer (%" PRId64 ")", v->i);
        break;
    case TOML_FLOAT:
        snprintf(out, cap, "a float (%g)", v->f);
        break;
    case TOML_BOOL:
        snprintf(out, cap, "a boolean (%s)", v->b ? "true" : "false");
        break;
    case TOML_ARRAY:
        snprintf(out, cap, "an array of %d values", v->n_items);
        break;
    }
}

static int type_fail(const config_key *k, const char *where, const char *expected,
                     const toml_value *v, ct_error *err) {
    char found[160];
    describe_value(found, sizeof found, v);
    return ct_fail(err, "%s: %s.%s: expected %s, found %s", where, k->section, k->key, expected,
                   found);
}

int config_key_set(ct_config *c, const config_key *k, const toml_value *v, const char *where,
                   ct_error *err);

// Appends v's strings to joined (comma-joined) at *len.
static int list_join(char *joined, size_t cap, size_t *len, const config_key *k,
                     const toml_value *v, const char *where, ct_error *err) {
    for (int i = 0; i < v->n_items; i++) {
        const toml_value *item = &v->items[i];
        if (item->type != TOML_STRING) return type_fail(k, where, "an array of strings", item, err);
        if (strpbrk(item->str, ",;"))
            return ct_fail(err, "%s: %s.%s: item %d (\"%.80s\") contains a comma or semicolon",
                           where, k->section, k->key, i, item->str);
        int n = snprintf(joined + *len, cap - *len, "%s%s", i ? "," : "", item->str);
        if (n < 0 || (size_t)n >= cap - *len)
            return ct_fail(err, "%s: %s.%s: the list is too long", where, k->section, k->key);
        *len += (size_t)n;
    }
    return 0;
}

// A TOML array of strings for a CONFIG_LIST key: stored comma-joined. torchtitan's
// module_fqns_per_model_part is an array of such arrays (one per stage): stored with ';' between
// them.
static int list_set(ct_config *c, const config_key *k, const toml_value *v, const char *where,
                    ct_error *err) {
    char joined[8192] = "";
    size_t len = 0;
    const bool nested = strcmp(k->key, "module_fqns_per_model_part") == 0;
    for (int i = 0; nested && i < v->n_items; i++) {
        if (v->items[i].type != TOML_ARRAY)
            return type_fail(k, where, "an array of arrays of strings", &v->items[i], err);
        if (i) joined[len++] = ';';
        joined[len] = 0;
        if (list_join(joined, sizeof joined - 1, &len, k, &v->items[i], where, err) != 0) return -1;
    }
    if (!nested && list_join(joined, sizeof joined, &len, k, v, where, err) != 0) return -1;
    toml_value str = {.type = TOML_STRING, .str = joined};
    return config_key_set(c, k, &str, where, err);
}

// Stores a parsed value into its field, checking type, range, length and choices.
int config_key_set(ct_config *c, const config_key *k, const toml_value *v, const char *where,
                   ct_error *err) {
    switch (k->type) {
    case CONFIG_LIST:
        if (v->type == TOML_ARRAY) return list_set(c, k, v, where, err);
        __attribute__((fallthrough)); // a string is the list already joined
    case CONFIG_STR: {
        if (v->type != TOML_STRING)
            return type_fail(
                k, where, k->type == CONFIG_LIST ? "a string or an array of strings" : "a string",
                v, err);
        size_t len = strlen(v->str);
        if (len >= k->size)
            return ct_fail(err, "%s: %s.%s: the value is %zu bytes long; at most %zu fit", where,
                           k->section, k->key, len, k->size - 1);
        const char *close;
        if (!config_choice_ok(k, v->str, &close)) {
            char choices[256];
            config_choices_text(choices, sizeof choices, k);
            if (close)
                return ct_fail(err, "%s: %s.%s: expected %s, found \"%s\" (did you mean \"%.*s\"?)",
                               where, k->section, k->key, choices, v->str, (int)strcspn(close, "|"),
                               close);
            return ct_fail(err, "%s: %s.%s: expected %s, found \"%s\"", where, k->section, k->key,
                           choices, v->str);
        }
        memset(field(c, k), 0, k->size);
        memcpy(field(c, k), v->str, len);
        return 0;
    }
    case CONFIG_INT:
        if (v->type != TOML_INT) return type_fail(k, where, "an integer", v, err);
        if (v->i < INT_MIN || v->i > INT_MAX)
            return ct_fail(err, "%s: %s.%s: %" PRId64 " does not fit in an int", where, k->section,
                           k->key, v->i);
        *(int *)field(c, k) = (int)v->i;
        return 0;
    case CONFIG_INT64:
        if (v->type != TOML_INT) return type_fail(k, where, "an integer", v, err);
        *(int64_t *)field(c, k) = v->i;
        return 0;
    case CONFIG_FLOAT:
        // An integer is a fine float (lr = 1, max_norm = 1), as torchtitan accepts.
        if (v->type == TOML_INT) {
            *(double *)field(c, k) = (double)v->i;
            return 0;
        }
        if (v->type != TOML_FLOAT) return type_fail(k, where, "a number", v, err);
        *(double *)field(c, k) = v->f;
        return 0;
    case CONFIG_BOOL:
        if (v->type != TOML_BOOL) return type_fail(k, where, "true or false", v, err);
        *(bool *)field(c, k) = v->b;
        return 0;
    case CONFIG_TRISTATE:
        if (v->type == TOML_BOOL) {
            *(int *)field(c, k) = v->b ? 1 : 0;
            return 0;
        }
        if (v->type == TOML_STRING) {
            const char *s = v->str;
            int t = strcmp(s, "true") == 0 ? 1 : strcmp(s, "false") == 0 ? 0 : -2;
            if (strcmp(s, "auto") == 0 || *s == '\0') t = -1;
            if (t != -2) {
                *(int *)field(c, k) = t;
                return 0;
            }
        }
        return type_fail(k, where, "true, false or \"auto\"", v, err);
    }
    return ct_fail(err, "%s: %s.%s: internal: unknown key type", where, k->section, k->key);
}

bool config_key_optional(const config_key *k) {
    return k->type == CONFIG_FLOAT && k->def[0] == '\0';
}

// A command-line (or default) value: strings are taken verbatim, the rest parsed as TOML.
int config_key_set_text(ct_config *c, const config_key *k, const char *text, const char *where,
                        ct_error *err) {
    toml_value v = {0};
    if (config_key_optional(k) && (text[0] == '\0' || strcmp(text, "none") == 0)) {
        *(double *)field(c, k) = NAN;
        return 0;
    }
    bool verbatim =
        k->type == CONFIG_STR || k->type == CONFIG_LIST ||
        (k->type == CONFIG_TRISTATE && strcmp(text, "true") != 0 && strcmp(text, "false") != 0);
    if (verbatim) {
        if (toml_check_text(text, strlen(text), where, err) != 0) return -1;
        v.type = TOML_STRING;
        v.str = (char *)text;
        return config_key_set(c, k, &v, where, err);
    }
    if (k->type == CONFIG_BOOL && strcmp(text, "true") != 0 && strcmp(text, "false") != 0)
        return ct_fail(err, "%s: %s.%s: expected true or false, found '%s'", where, k->section,
                       k->key, text);
    if (toml_parse_value(&v, text, where, err) != 0) {
        // A word where a number belongs: say what the key takes, not what TOML could hold.
        // Numeric-looking text keeps TOML's reason (range, leading zeros, inf, ...).
        bool word = (text[0] >= 'a' && text[0] <= 'z') || (text[0] >= 'A' && text[0] <= 'Z');
        if (word && strcmp(text, "inf") != 0 && strcmp(text, "nan") != 0)
            return ct_fail(err, "%s: %s.%s: expected %s, found '%s'", where, k->section, k->key,
                           k->type == CONFIG_FLOAT ? "a number" : "an integer", text);
        return -1;
    }
    int rc = config_key_set(c, k, &v, where, err);
    toml_value_free(&v);
    return rc;
}

void config_defaults_raw(ct_config *c) {
    memset(c, 0, sizeof *c);
    for (int i = 0; i < N_KEYS; i++) {
        // The table's defaults are tested to parse (tests/test_train_config.c).
        if (config_key_set_text(c, &config_table[i], config_table[i].def, "default", NULL) != 0)
            abort();
    }
}

// Defaults that depend on other keys.
void config_resolve(ct_config *c) {
    ct_config_model *m = &c->model;
    if (m->tokenizer_path[0] == '\0') {
        const char *src = strcmp(m->backend, "hf") == 0 ? m->hf_path : "assets/qwen3-tokenizer";
        snprintf(m->tokenizer_path, sizeof m->tokenizer_path, "%s", src);
    }
}

void config_defaults(ct_config *c) {
    config_defaults_raw(c);
    config_resolve(c);
}

// One key's value as TOML (strings quoted and escaped).
static void key_write(FILE *f, const ct_config *c, const config_key *k) {
    const void *p = cfield(c, k);
    char num[64];
    switch (k->type) {
    case CONFIG_STR:
    case CONFIG_LIST:
        toml_write_string(f, (const char *)p);
        break;
    case CONFIG_INT:
        fprintf(f, "%d", *(const int *)p);
        break;
    case CONFIG_INT64:
        fprintf(f, "%" PRId64, *(const int64_t *)p);
        break;
    case CONFIG_FLOAT:
        if (config_key_optional(k) && isnan(*(const double *)p)) {
            fputs("unset", f); // config_write_toml comments the line out
            break;
        }
        // A non-finite double only gets here from code, never from a file; write what reads
        // back as an error rather than something that reads back as a different value.
        if (toml_format_float(num, sizeof num, *(const double *)p) != 0)
            snprintf(num, sizeof num, "nan");
        fputs(num, f);
        break;
    case CONFIG_BOOL:
        fputs(*(const bool *)p ? "true" : "false", f);
        break;
    case CONFIG_TRISTATE: {
        int t = *(const int *)p;
        fputs(t < 0 ? "\"auto\"" : t ? "true" : "false", f);
        break;
    }
    }
}

// One key's value as text (key_write into a buffer), for comparing two configs.
static void key_text(char *out, size_t cap, const ct_config *c, const config_key *k) {
    FILE *f = fmemopen(out, cap, "w");
    out[0] = '\0';
    if (!f) return;
    key_write(f, c, k);
    fclose(f);
    out[cap - 1] = '\0';
}

static bool key_differs(const ct_config *a, const ct_config *b, const config_key *k) {
    char ta[8192], tb[8192]; // room for a path or the imports list
    key_text(ta, sizeof ta, a, k);
    key_text(tb, sizeof tb, b, k);
    return strcmp(ta, tb) != 0;
}

// All keys, or (`base` non-NULL) only those whose value differs from base's, under their
// sections.
static int write_keys(const ct_config *c, const ct_config *base, FILE *f) {
    const char *section = NULL;
    for (int i = 0; i < N_KEYS; i++) {
        const config_key *k = &config_table[i];
        if (base && !key_differs(c, base, k)) continue;
        if (!section || strcmp(k->section, section) != 0)
            fprintf(f, "%s[%s]\n", section ? "\n" : "", k->section);
        section = k->section;
        bool unset = config_key_optional(k) && isnan(*(const double *)cfield(c, k));
        fprintf(f, "%s%s = ", unset ? "# " : "", k->key);
        key_write(f, c, k);
        fputc('\n', f);
    }
    return ferror(f) ? -1 : 0;
}

int config_write_toml(const ct_config *c, FILE *f) {
    fputs("# ctitan training config (the effective values: defaults, file, command line)\n", f);
    return write_keys(c, NULL, f);
}

int config_write_changed(const ct_config *c, FILE *f) {
    ct_config d;
    config_defaults(&d);
    return write_keys(c, &d, f);
}

int config_describe_changes(char *out, size_t cap, const ct_config *old, const ct_config *now) {
    int n = 0;
    size_t len = 0;
    out[0] = '\0';
    for (int i = 0; i < N_KEYS; i++) {
        const config_key *k = &config_table[i];
        if (!k->hashed || !key_differs(old, now, k)) continue;
        char a[256], b[256];
        key_text(a, sizeof a, old, k);
        key_text(b, sizeof b, now, k);
        if (len < cap)
            len += (size_t)snprintf(out + len, cap - len, "%s%s.%s %s -> %s", n ? ", " : "",
                                    k->section, k->key, a, b);
        n++;
    }
    return n;
}

int config_save(const ct_config *c, const char *path, ct_error *err) {
    atomic_file a;
    if (atomic_open(&a, path, err) != 0) return -1;
    if (config_write_toml(c, a.fp) != 0) {
        atomic_abort(&a);
        return ct_fail(err, "%s: write failed", path);
    }
    return atomic_commit(&a, err);
}

static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

uint64_t config_hash(const ct_config *c) {
    // Hash the text form, not the bytes of the struct: padding and layout then do not matter,
    // and the hash stays the same across builds that print the same values.
    uint64_t h = 0xcbf29ce484222325ull;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return 0;
    for (int i = 0; i < N_KEYS; i++) {
        const config_key *k = &config_table[i];
        if (!k->hashed) continue;
        fprintf(f, "%s.%s=", k->section, k->key);
        key_write(f, c, k);
        fputc('\n', f);
    }
    fclose(f);
    h = fnv1a(h, text, len);
    free(text);
    return h;
}

static const char *type_word(const config_key *k) {
    switch (k->type) {
    case CONFIG_STR:
        return k->choices ? "CHOICE" : "STR";
    case CONFIG_INT:
    case CONFIG_INT64:
        return "INT";
    case CONFIG_FLOAT:
        return "FLOAT";
    case CONFIG_BOOL:
        return "BOOL";
    case CONFIG_TRISTATE:
        return "BOOL|auto";
    case CONFIG_LIST:
        return "LIST";
    }
    return "?";
}

void config_print_help(FILE *f) {
    fputs("Every key can be set in the TOML file (under its [section]) or on the command line as\n"
          "--section.key=value or --section.key value; the command line wins. A boolean key\n"
          "alone (--training.allow_overcommit) means true.\n",
          f);
    for (int i = 0; i < N_KEYS; i++) {
        const config_key *k = &config_table[i];
        if (i == 0 || strcmp(k->section, config_table[i - 1].section) != 0)
            fprintf(f, "\n[%s]\n", k->section);
        char left[128];
        snprintf(left, sizeof left, "--%s.%s=%s", k->section, k->key, type_word(k));
        fprintf(f, "  %-46s %s", left, k->help);
        if (k->choices) {
            char choices[256];
            config_choices_text(choices, sizeof choices, k);
            fprintf(f, "; %s", choices);
        }
        if (k->type == CONFIG_STR || k->type == CONFIG_LIST)
            fprintf(f, " (default: \"%s\")\n", k->def);
        else if (config_key_optional(k))
            fputs(" (default: unset)\n", f);
        else
            fprintf(f, " (default: %s)\n", k->def);
    }
}
