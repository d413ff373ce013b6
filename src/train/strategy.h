// Data-parallel strategies behind one interface: replicate (DDP), ZeRO-1, FSDP/HSDP. The step
// (trainer_step.c) calls these and nothing else to synchronise; the model meets a strategy only
// through its unit hook; the tensors' units and splits come from the model's parallelize plan
// (model/qwen3_parallelize.h). A new mode (TP, CP, EP, PP) is one more strategy_vt and its
// plan entries.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "model/hf_adapter.h"
#include "model/qwen3_parallelize.h"
#include "parallel/fsdp.h"
#include "parallel/grad_sync.h"
#include "train/pipeline_schedule.h"
#include "train/run_setup.h"
#include "train/train_state.h"

typedef struct trainer trainer;

// The buffers this rank's optimizer steps: the fp32 weights, their gradients and (when the same
// pass refreshes it) their bf16 copy.
typedef struct strategy_shard {
    float *params, *grads;
    uint16_t *bf16; // NULL: after_update refreshes the copy, or there is none
} strategy_shard;

typedef struct strategy_vt {
    // The "parallel:" line's words for the mode, and the note after the optimizer's size on
    // the memory line.
    void (*describe)(const trainer *t, char *buf, size_t size);
    const char *memory_note;
    bool optimizer_sharded; // AdamW's moments are this rank's 1/N (the memory estimate)
    // The memory estimate's own parts (NULL: none): mem's parameters, gradients and optimizer
    // become this rank's; logs them.
    int (*estimate)(const trainer *t, run_memory *mem, ct_error *err);
    // After the model and its activations are planned: the plan, the synchronisation, the
    // optimizer over this rank's shard, the model's unit hook.
    int (*setup)(trainer *t, ct_error *err);
    void (*free)(trainer *t);
    // The weights' first values: a seeded init, a checkpoint whose model is in shards, a
    // Hugging Face folder (every rank the same weights; each keeps what its shard holds); then
    // weights_ready, after any of them or a resume.
    int (*init_random)(trainer *t, uint64_t seed, ct_error *err);
    int (*load_sharded)(trainer *t, const char *dir, ct_error *err);
    int (*load_hf)(trainer *t, hf_load_report *rep, const st_set *set, const char *from,
                   ct_error *err);
    void (*weights_ready)(trainer *t);
    // A step: the gradients start at zero; a micro-batch begins (`last`: its backward makes
    // the gradients final); the model's unit hook (ctx: the trainer) sees every unit's events.
    void (*begin_step)(trainer *t);
    void (*begin_micro)(trainer *t, bool last);
    void (*unit_ready)(void *ctx, int unit, int event);
    // The step's micro-batches (NULL: the step's own loop, a forward and backward each): the
    // loss and MoE aux sums over this rank's, gradients scaled by `scale` (1 / the step's valid
    // targets, NaN under debug.fault nan). Pipeline parallelism runs its schedule here.
    int (*run_micro)(trainer *t, float scale, double *loss_sum, double *aux_sum, ct_error *err);
    // After the last backward: the reductions are done (the gradients are final).
    int (*grads_final)(trainer *t, ct_error *err);
    // The summed gradient's sum of squares over every rank's shard.
    int (*grad_sq)(trainer *t, double *sq, ct_error *err);
    // The buffers this rank's optimizer indexes (from its base).
    strategy_shard (*shard)(trainer *t);
    // After the optimizer stepped the shard: the weights the model reads are current.
    int (*after_update)(trainer *t, ct_error *err);
    // A forward without backward of validation's batch (t->val_B sequences): its summed loss and
    // valid-target count, the same on every rank of the stage's data-parallel index (NULL: the
    // model's qwen3_forward). PP passes it through the stages, micro-batch by micro-batch.
    int (*eval_forward)(trainer *t, const qwen3_batch *b, double *loss, int64_t *n_valid,
                        ct_error *err);
    // After a forward without backward (validation): what a unit kept for its backward goes.
    void (*after_eval)(trainer *t);
    // The "comm volume" line's clauses for the strategy's own payload bytes (NULL: none), per
    // step over n steps, into buf ("; what N" each); returns snprintf's count.
    int (*comm_bytes)(const trainer *t, double n, char *buf, size_t size);
    // Communication seconds of the step beyond dist's own count: exposed and hidden.
    void (*take_comm)(trainer *t, double *exposed, double *hidden);
    // Checkpoints: a resume loads this rank's weights, its range of the moments (views of
    // the optimizer's, from opt.base) and the run state from a step folder; a save writes the
    // step; model_in_shards: no rank holds the whole model, so the export streams the saved
    // checkpoint.
    int (*load_checkpoint)(trainer *t, const char *dir, float *moments[2], ct_error *err);
    int (*save_checkpoint)(trainer *t, ct_error *err);
    bool model_in_shards;
    // The final HF export streamed from the ranks holding the model's pieces (NULL: one rank's
    // model or the saved checkpoint), and what the log line says it is assembled from.
    int (*export_hf)(trainer *t, const char *dir, ct_dtype dtype, ct_error *err);
    const char *export_from;
} strategy_vt;

extern const strategy_vt strategy_replicate, strategy_zero1, strategy_fsdp;
// LoRA under FSDP/HSDP (strategy_lora_fsdp.c): the frozen base sharded as strategy_fsdp shards a
// model (gathered for the forward and the backward's input gradients, no gradient), the adapter
// replicated under ZeRO-1 (strategy_zero1: its gradients all-reduced, its moments sharded over
// every rank, its checkpoints the replicated layout).
const strategy_vt *strategy_lora_fsdp(void);
// Replicate's and ZeRO-1's part after the plan (for strategy_lora_fsdp): the trained
// parameters' gradient sync (ZeRO-1 when the table's optimizer_sharded), AdamW over this rank's
// range, the unit hook (the table's unit_ready); and its release.
int strategy_replicate_setup_sync(trainer *t, ct_error *err);
void strategy_replicate_free_sync(trainer *t);
// Tensor parallelism with sequence parallelism (strategy_tp.c) over the trainer's TP group,
// with replicate (DDP) over the data-parallel ranks (the trainer's t->d).
extern const strategy_vt strategy_tp;
// Every rank of the TP group: global tensor gp (g's, the one-process layout) assembled into full
// (its numel floats) from the group's slices of it in `local` (each rank's local weights, host),
// through all (tp times the local tensor's floats).
int strategy_tp_gather(trainer *t, const float *local, const qwen3_param *gp, float *all,
                       float *full, ct_error *err);
// A checkpoint of TP slices in the one-process layout (format 4, any degree resumes it): S
// shards, shard q written by rank q of `writers` (rank 0 of t->d of each TP rank, together; the
// group the writers' shard checksums are gathered over), as TP rank q % tp of a local model
// whose config layout_of makes from t->model.cfg (under PP: pipeline rank q / per's stages).
// Every rank calls strategy_tp_save_shards.
typedef struct strategy_tp_writers {
    int S;
    int per; // shards per pipeline rank (S without PP): shard q's rank in its stage is q % per
    dist *writers;
    int (*layout_of)(const trainer *t, int q, qwen3_config *lc, ct_error *err);
    const char *note; // for the log line: ", one per ..."
} strategy_tp_writers;
int strategy_tp_save_shards(trainer *t, const strategy_tp_writers *w, ct_error *err);
// FSDP composed with another cut (TP): every unit of the full buffer (which a load filled) into
// the shard; a shard buffer (backend memory: the fp32 weights f->shard_params, or an AdamW
// moment t->opt.m / t->opt.v) assembled from the shard group's pieces into `full` (host, the
// full buffer's layout; every rank of the shard group takes part); and the reverse in host
// memory: this rank's pieces of `full` into `shard` (a host view of its n_shard floats).
void strategy_fsdp_take_all(trainer *t);
int strategy_fsdp_gather(trainer *t, float *shard, float *full, ct_error *err);
void strategy_fsdp_pieces(const trainer *t, const float *full, float *shard);
// This rank's local model's weights and two moments in host memory, src[0..2] (a save; release
// with strategy_local_state_free): views of the model and the optimizer, or (sharded: FSDP
// beside TP or PP) assembled from the shard group's pieces (every rank of the group takes part).
int strategy_local_state(trainer *t, bool sharded, float *src[3], ct_error *err);
void strategy_local_state_free(trainer *t, bool sharded, float *src[3]);
// FSDP's parts of the memory estimate for the model cfg (the run's, or a rank's under TP).
int strategy_fsdp_estimate_of(const trainer *t, const qwen3_config *cfg, run_memory *mem,
                              ct_error *err);

// Tensor parallelism's state: the group (its collectives carry the model's qwen3_tp hook) and
// the first failure of a collective the hook ran (reported after the backward).
typedef struct strategy_tp_state {
    const strategy_vt *dp; // over the data-parallel ranks (t->d): replicate, or FSDP/HSDP
    dist *group;
    qwen3_tp tp;
    ct_error err;
    bool failed;
    // Payload bytes of the group's collectives since setup, each its whole buffer (an
    // all-gather's or reduce-scatter's tp pieces, an all-reduce's one): TP_AG all-gathers (the
    // sequence-parallel rows, the loss's row maxes), TP_RS reduce-scatters, TP_AR the loss's
    // all-reduce, TP_AR_WHOLE the replicated tensors' gradients (bench/parallel.py).
    double bytes[4];
} strategy_tp_state;
enum { TP_AG, TP_RS, TP_AR, TP_AR_WHOLE };

// Expert parallelism with DDP or FSDP for the rest (strategy_ep.c): the model's qwen3_ep hook, its
// all-to-all's byte counts, and the first failure of an exchange (reported after the backward).
typedef struct strategy_ep_state {
    qwen3_ep ep;
    int *sc, *sd, *rc, *rd;
    double bytes; // payload bytes this rank's all-to-alls sent to other ranks since setup
    ct_error err;
    bool failed;
    int n_sets; // set before setup under PP: the activation sets the kept rows need (0: one)
} strategy_ep_state;
extern const strategy_vt strategy_ep;
// EP beside FSDP (torchtitan's dp2ep; strategy_ep.c): strategy_fsdp's table with the dispatch,
// the experts cut over the shard ranks holding the same ones (parallel/fsdp.h's eshard).
const strategy_vt *strategy_ep_fsdp(void);
// Under EP, the one-process random init of the local tensors starting in [lo, hi).
int strategy_ep_init_range(trainer *t, uint64_t seed, size_t lo, size_t hi, ct_error *err);
// Under EP: the weights as one HF folder in dir (world rank 0 writes; the first replica's EP
// group takes part).
int strategy_ep_export(trainer *t, const char *dir, ct_dtype dtype, ct_error *err);
// Under EP, every rank of the EP group: the global tensor gp (an expert) from the rank holding it
// (its weights `local`, a host view of the model) into full.
int strategy_ep_fetch_expert(trainer *t, const qwen3_param *gp, const float *local, float *full,
                             ct_error *err);
// A tensor EP splits (by name: an expert's projection), and the EP rank holding it (-1: none).
bool strategy_ep_is_expert(const char *name);
int strategy_ep_owner(const trainer *t, const char *name);
// The ranks holding the same experts (t->erep_group) hold the same local model, bit for bit
// (else an error naming the replica): checked before a save.
int strategy_ep_check_replicas(trainer *t, ct_error *err);
// Which tensors EP rank r of the first replica saves: its experts; rank 0 every tensor (NULL).
typedef bool (*strategy_keep_fn)(const char *name);
strategy_keep_fn strategy_ep_saves(int r);

// Pipeline parallelism (strategy_pp.c): this rank's stages of the split (pipeline_schedule.h),
// its schedule's actions, and per (local stage k, micro-batch i) at [k * m + i] the stage input
// received, the output's gradient received, and the output and input gradient sent (N x C
// floats each on the backend) with their requests in flight. DDP (strategy_replicate) or
// FSDP/HSDP (strategy_fsdp, on the local model) runs over the stage's data-parallel ranks (t->d).
// TP's per-forward buffers in a qwen3_tp for the model's N rows (the ids, the targets, the
// loss's row maxes and sums, their host scratch): setup's, and one more per activation set
// under PP (strategy_pp.c). free leaves the rest of tp as it is.
int strategy_tp_buffers(trainer *t, qwen3_tp *tp, ct_error *err);
void strategy_tp_buffers_free(trainer *t, qwen3_tp *tp);

typedef struct strategy_pp_state {
    const strategy_vt *dp; // inside each stage: replicate, or FSDP/HSDP
    dist *group; // the pp ranks of this data-parallel index (stage s on group rank s % pp)
    pp_schedule_kind kind;
    int S, v, m;                // stages, stages on this rank, micro-batches per step
    pp_stage stage[64];         // every stage (global layer ranges)
    int l0[PP_MAX_LOCAL], l1[PP_MAX_LOCAL]; // local stage k's local layers
    pp_action *actions;
    int n_actions;
    float **in, **dout, **out, **din;
    ct_request **req; // 8 * v * m: in, dout, out, din, then the same four of sums
    // MoE: each micro-batch's routing statistics summed over sparse layers (MOE_SUMS(E) doubles;
    // 0 when dense) travel with it: forward, the stages' so far (this rank's); from the last
    // stage back, the whole model's over every rank, which the stage's backward differentiates
    // HF's aux with. Per (k, i) as above, on the backend, and one host copy.
    int n_sums;
    double **sums_in, **sums_dout, **sums_out, **sums_din, *sums, *sums_scratch;
    // MoE: every stage's load balance per sparse layer (the whole model's n_sparse, in layer
    // order), gathered over the pp group after each update for the metrics row.
    double *balance, *balance_scratch;
    int n_balance;
    double bytes;     // payload sent to other stages since setup
    // The activation sets (pp_schedule_in_flight of the actions): a forward takes a free one
    // (free_sets, a stack of n_free), its backward reads it and gives it back; set_of[k m + i]
    // is local stage k's micro-batch i's. Under TP each set has its own TP buffers (tps[j], j >
    // 0; set 0 is TP's own).
    int n_sets, n_free;
    int *free_sets, *set_of;
    qwen3_tp *tps;
} strategy_pp_state;
extern const strategy_vt strategy_pp;
// Pipeline rank r's local model: the global config mc becomes its stages' parts (after the split
// in t->strat.pp).
int strategy_pp_local_config(const trainer *t, int r, qwen3_config *mc, ct_error *err);
// A LoRA run's frozen base identity (qwen3_lora_base_hash) of the whole model, one process's:
// each stage hashes its tensors, the pp group chains them in the whole table's order.
int strategy_pp_lora_base_hash(trainer *t, uint64_t *h, ct_error *err);
// w (n floats, the whole model's layout, this rank's stages' elements and zeros elsewhere) summed
// over the pp group in double: every element is one stage's, so the sum is exact. Every rank of
// the pp group calls it.
int strategy_pp_sum_stages(trainer *t, float *w, size_t n, const char *what, ct_error *err);

// Local models that hold each of their tensors whole (EP's, PP's), in checkpoints of the global
// layout (trainer_checkpoint.c): m's tensors' ranges in the global layout g, by name, those
// keep(name) accepts (NULL: all), ascending; and a checkpoint's values for the trainer's model
// by name: a strategy's load_checkpoint (the moments, which must span the local model, and the
// run state too) and load_sharded (the weights only).
int trainer_named_ranges(const qwen3_model *g, const qwen3_model *m, bool (*keep)(const char *),
                         ckpt_range **out, ct_error *err);
// Shard `shard` of n_shards into the temporary folder tmp: the trainer's local tensors that keep
// accepts (NULL: all) at their ranges in g, from src (host: the local model's weights and AdamW
// moments, as strategy_local_state gives them).
int trainer_write_named_shard(trainer *t, const qwen3_model *g, const char *tmp,
                              float *const src[3], bool (*keep)(const char *), int shard,
                              int n_shards, ckpt_shard_info info[2], ct_error *err);
int trainer_load_by_name(trainer *t, const char *dir, float *moments[2], ct_error *err);
// The same into the model's full buffer and host moments (NULL: not read) that span the local
// model whatever the optimizer holds (a composition with FSDP then takes its pieces); st: the run
// state, or NULL.
int trainer_load_local_by_name(trainer *t, const char *dir, float *moments[2], train_state *st,
                               ct_error *err);
int trainer_load_model_by_name(trainer *t, const char *dir, ct_error *err);

// A checkpoint of P shards in the global layout (TP's, EP's, PP's), around the strategy's own
// writes (trainer_checkpoint.c). begin: the buffers and the temporary folder (0, or -1 with err
// set; the caller still calls end). end, on every rank, with its rc: agreed over `agree`; this
// rank's infos (mine) gathered over grp (NULL: this rank writes no shard and gathers nothing);
// world rank 0 commits (of[q], n_of[q]: shard q's ranges; note: after the shard count) or
// abandons the folder; everything freed; the outcome agreed over `agree`.
typedef struct trainer_shards {
    int P;
    char tmp[4200];
    ckpt_shard_info mine[2];
    ckpt_range **of;
    int *n_of;
} trainer_shards;
int trainer_shards_begin(trainer *t, trainer_shards *s, int P, ct_error *err);
int trainer_shards_end(trainer *t, trainer_shards *s, int rc, dist *agree, dist *grp,
                       const qwen3_model *g, const char *note, ct_error *err);

// A final HF export streamed over grp (trainer_checkpoint.c): grp's rank 0 writes g's folder
// (the global layout; hf_save_folder_from's tensor order) and, for each tensor i it reaches, names
// it to the group, whose ranks all run fetch(ctx, i) (a collective of theirs) that leaves the
// whole tensor in *full on rank 0. Every rank of grp calls it; 0 or -1 (rank 0: the tokenizer
// files copied, as ckpt_export_hf_from).
typedef struct strategy_export {
    dist *grp;
    const qwen3_model *g;
    float **full;
    int (*fetch)(void *ctx, int i, ct_error *err);
    void *ctx;
    int cur; // the tensor in *full, or -1
} strategy_export;
int strategy_export_stream(strategy_export *x, const trainer *t, const char *dir, ct_dtype dtype,
                           const char *what, ct_error *err);

// One run's strategy and its state.
typedef struct strategy {
    const strategy_vt *vt;
    qwen3_parallel_plan plan; // the model's (after setup)
    grad_sync sync;           // replicate, ZeRO-1: buckets, and ZeRO-1's parameter gather
    // replicate, ZeRO-1: unit u's first element in the trained buffer (qwen3_trained_units):
    // the model's own, or a LoRA model's adapter.
    size_t *unit_lo;
    bool overlap;             // replicate, ZeRO-1: reduce during this micro-batch's backward
    fsdp fsdp;                // FSDP: the shards, the gathers and reduce-scatters
    // FSDP: model unit u is FSDP units [fsdp_first[u], fsdp_first[u + 1]) (under EP a sparse
    // layer is three: before its experts, its experts, after them; otherwise one each).
    int *fsdp_first;
    // FSDP: the plan's QWEN3_SPLIT_WHOLE tensors (the MoE expert biases), whole, back to back in
    // plan order.
    float *whole;
    // FSDP of a frozen LoRA base: its identity (qwen3_lora_base_hash), hashed unit by unit at
    // the load, while each was whole.
    uint64_t lora_base_hash;
    bool lora_base_hashed;
    strategy_tp_state tp; // TP (strategy_tp)
    strategy_ep_state ep; // EP (strategy_ep)
    strategy_pp_state pp; // PP (strategy_pp)
} strategy;

// Replicate, ZeRO-1 (trainer_checkpoint.c): every rank its 1/N of the optimizer state, rank 0
// the model and state.json, after the replicas agree bit for bit.
int trainer_save_replicated(trainer *t, ct_error *err);
// Rank 0, once the P optimizer shards of model m (the trained parameters, or under PP a LoRA
// run's whole adapter) are written: ckpt_commit, the prune, and the "saved" line (note: in its
// parentheses).
int trainer_commit_replicated(trainer *t, const qwen3_model *m, const ckpt_shard_info *shards,
                              int P, const char *note, ct_error *err);
// The replicas over t->d hold the same weights, bit for bit (else an error naming the rank):
// checked before a save.
int trainer_check_replicas(trainer *t, ct_error *err);
// Rank 0, once every shard's pair of infos is gathered (pairs[2s]: shard s's optimizer file,
// pairs[2s + 1]: its model file): ckpt_commit_ranges over `layout` (the global model's), the
// prune, and the "saved" line (note: words after the shard count).
int trainer_commit_shards(trainer *t, const qwen3_model *layout, const ckpt_shard_info *pairs,
                          int S, const ckpt_range *const *ranges, const int *n_ranges,
                          const char *note, ct_error *err);
// The end of a save whose shards each rank of grp writes one of (rc: this rank's write): agreed
// over `over` (every rank of the run), grp's checksums gathered (the first S are the shards;
// grp NULL: this rank writes none and gathers nothing), committed by rank 0
// (trainer_commit_shards) or abandoned, and the commit agreed over `over`. trainer_shards_end
// is this over a trainer_shards, which it then frees.
int trainer_finish_shards(trainer *t, dist *over, dist *grp, int rc,
                          const ckpt_shard_info mine[2], int S, const qwen3_model *layout,
                          const ckpt_range *const *ranges, const int *n_ranges, const char *note,
                          ct_error *err);
