// What the user sees of a run: one readable line per logged step, and the same fields as one
// JSON object per line in <dump_folder>/metrics.jsonl.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/error.h"
#include "model/qwen3_config.h"

typedef struct metrics_row {
    int64_t step, steps; // 1-based step just finished, total steps
    double loss, grad_norm, lr;
    double tps;       // tokens per second per worker, over the steps since the last log
    double tps_total; // the same over all ranks
    int ranks;
    double comm_s;        // per step: seconds spent in MPI calls and waits (not overlapped)
    double comm_share;    // comm_s as a fraction of the step time
    double comm_hidden_s; // per step: communication that ran behind compute (FSDP; else 0)
    double tflops, mfu;   // achieved model TFLOP/s, and its fraction of the peak
    double memory_peak_gib;
    double time_s; // wall time since the run (or resume) started
    double eta_s;
    int64_t skipped; // steps skipped so far for a non-finite loss or gradient
    // MoE models (n_moe_layers > 0): the loss's parts, and each sparse layer's expert load over
    // the step (the most tokens any expert got / the mean per expert; 1 is perfectly even).
    double ce, aux;
    int n_moe_layers;
    const double *moe_load_max_over_mean;
    // With override.imports: the plugins' call counters as a JSON object (override.h), or NULL.
    const char *override_calls_json;
} metrics_row;

typedef struct metrics_log {
    FILE *out;   // the readable lines (stdout)
    FILE *jsonl; // <dump_folder>/metrics.jsonl, appended on resume (after the resumed step)
} metrics_log;

// Opens <dump_folder>/metrics.jsonl for appending, first dropping the rows of steps after
// `resumed_step` (0 for a fresh start), so that each step is logged once.
int metrics_open(metrics_log *m, FILE *out, const char *dump_folder, int64_t resumed_step,
                 ct_error *err);
void metrics_write(metrics_log *m, const metrics_row *r);
void metrics_close(metrics_log *m);

// Model FLOPs per token as torchtitan counts them: 6*N + 12*L*NH*D*T, where N counts the
// parameters in matmuls (a tied embedding once, as lm_head; an untied input embedding not).
// In a sparse layer N counts the parameters a token uses: the router and its K experts.
double metrics_flops_per_token(const qwen3_config *c, int seq_len);
// The same for a run whose base is frozen (LoRA: 4*N, no dW) training `adapter` parameters a
// token uses (6 each; lora_active_params: an expert's adapter counts K/E); frozen false is
// metrics_flops_per_token.
double metrics_flops_per_token_lora(const qwen3_config *c, int seq_len, bool frozen,
                                    double adapter);
// The best rate of `repeats` OpenBLAS sgemms of n x n by n x n, in GFLOP/s (0 if n or repeats
// is below 1, or out of memory). With n = 1024 it is the MFU denominator the trainer measures;
// bench_step reports it for any n.
double metrics_sgemm_gflops(int n, int repeats);
// The same for oneDNN's bf16 matmul as a bf16 linear layer runs it (the input rounded to bf16,
// fp32 out): the peak of bf16 mixed precision's GEMMs. 0 when oneDNN cannot make it.
double metrics_bf16_gflops(int n, int repeats);
