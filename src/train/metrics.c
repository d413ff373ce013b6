#include "train/metrics.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include <cblas.h>

#include "core/clock.h"
#include "io/atomic.h"
#include "io/json.h"
#include "ops/cpu_kernels.h"
#include "ops/ops.h"

// The rows of steps up to `keep_through`: a resumed run logs the later steps again, and a
// line cut short by a kill is not JSON. Rewritten atomically, so a crash here loses nothing.
static int keep_rows_through(const char *path, int64_t keep_through, ct_error *err) {
    char *text = NULL;
    size_t len = 0;
    if (access(path, F_OK) != 0) return 0;
    if (file_read_all(&text, &len, path, (size_t)1 << 34, err) != 0) return -1;
    atomic_file a;
    if (atomic_open(&a, path, err) != 0) {
        free(text);
        return -1;
    }
    for (char *line = text; line < text + len;) {
        char *end = memchr(line, '\n', (size_t)(text + len - line));
        size_t n = end ? (size_t)(end - line) : (size_t)(text + len - line);
        cJSON *row = cJSON_ParseWithLength(line, n);
        const cJSON *step = cJSON_GetObjectItemCaseSensitive(row, "step");
        if (cJSON_IsNumber(step) && step->valuedouble <= (double)keep_through) {
            fwrite(line, 1, n, a.fp);
            fputc('\n', a.fp);
        }
        cJSON_Delete(row);
        line += n + 1;
    }
    free(text);
    return atomic_commit(&a, err);
}

int metrics_open(metrics_log *m, FILE *out, const char *dump_folder, int64_t resumed_step,
                 ct_error *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dump_folder);
    m->out = out;
    if (keep_rows_through(path, resumed_step, err) != 0) return -1;
    m->jsonl = fopen(path, "a");
    if (!m->jsonl) return ct_fail(err, "%s: cannot open for appending: %s", path, strerror(errno));
    return 0;
}

static void format_duration(char *buf, size_t cap, double s) {
    if (!isfinite(s) || s < 0) s = 0;
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, cap, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else
        snprintf(buf, cap, "%ldm%02lds", t / 60, t % 60);
}

// NaN and inf are not JSON: write null.
static void json_number(FILE *f, const char *key, double v, const char *fmt) {
    fprintf(f, ",\"%s\":", key);
    if (isfinite(v))
        fprintf(f, fmt, v);
    else
        fputs("null", f);
}

void metrics_write(metrics_log *m, const metrics_row *r) {
    char eta[32];
    format_duration(eta, sizeof eta, r->eta_s);
    if (m->out) {
        fprintf(m->out,
                "step %6lld/%lld  loss %8.4f  grad_norm %8.4f  lr %.3e  tps %7.0f  "
                "tflops %6.3f  mfu %5.1f%%  mem %.2f GiB  eta %s",
                (long long)r->step, (long long)r->steps, r->loss, r->grad_norm, r->lr, r->tps,
                r->tflops, 100 * r->mfu, r->memory_peak_gib, eta);
        if (r->ranks > 1)
            fprintf(m->out, "  ranks %d  total tps %.0f  comm %.1f ms (%.1f%%, %.1f ms hidden)",
                    r->ranks, r->tps_total, 1e3 * r->comm_s, 100 * r->comm_share,
                    1e3 * r->comm_hidden_s);
        if (r->skipped) fprintf(m->out, "  skipped %lld", (long long)r->skipped);
        if (r->n_moe_layers > 0) {
            double worst = 0;
            for (int i = 0; i < r->n_moe_layers; i++)
                if (r->moe_load_max_over_mean[i] > worst) worst = r->moe_load_max_over_mean[i];
            fprintf(m->out, "  ce %.4f  aux %.4f  load max/mean %.2f", r->ce, r->aux, worst);
        }
        fputc('\n', m->out);
        fflush(m->out);
    }
    if (m->jsonl) {
        // %.17g round-trips the double exactly: the resume test compares losses bit for bit.
        fprintf(m->jsonl, "{\"step\":%lld", (long long)r->step);
        json_number(m->jsonl, "loss", r->loss, "%.17g");
        json_number(m->jsonl, "grad_norm", r->grad_norm, "%.17g");
        json_number(m->jsonl, "lr", r->lr, "%.17g");
        json_number(m->jsonl, "tps", r->tps, "%.1f");
        json_number(m->jsonl, "tps_total", r->tps_total, "%.1f");
        fprintf(m->jsonl, ",\"ranks\":%d", r->ranks);
        json_number(m->jsonl, "comm_s", r->comm_s, "%.6f");
        json_number(m->jsonl, "comm_share", r->comm_share, "%.5f");
        json_number(m->jsonl, "comm_hidden_s", r->comm_hidden_s, "%.6f");
        json_number(m->jsonl, "tflops", r->tflops, "%.4f");
        json_number(m->jsonl, "mfu", r->mfu, "%.5f");
        json_number(m->jsonl, "memory_peak_gib", r->memory_peak_gib, "%.4f");
        json_number(m->jsonl, "time_s", r->time_s, "%.3f");
        json_number(m->jsonl, "eta_s", r->eta_s, "%.1f");
        fprintf(m->jsonl, ",\"skipped\":%lld", (long long)r->skipped);
        if (r->n_moe_layers > 0) {
            json_number(m->jsonl, "ce", r->ce, "%.17g");
            json_number(m->jsonl, "aux", r->aux, "%.17g");
            fputs(",\"moe_load_max_over_mean\":[", m->jsonl);
            for (int i = 0; i < r->n_moe_layers; i++)
                fprintf(m->jsonl, "%s%.4f", i ? "," : "", r->moe_load_max_over_mean[i]);
            fputc(']', m->jsonl);
        }
        if (r->override_calls_json)
            fprintf(m->jsonl, ",\"override_calls\":%s", r->override_calls_json);
        fputs("}\n", m->jsonl);
        fflush(m->jsonl);
    }
}

void metrics_close(metrics_log *m) {
    if (m->jsonl) fclose(m->jsonl);
    m->jsonl = NULL;
}

double metrics_flops_per_token(const qwen3_config *c, int seq_len) {
    return metrics_flops_per_token_lora(c, seq_len, false, 0);
}

double metrics_flops_per_token_lora(const qwen3_config *c, int seq_len, bool frozen,
                                    double adapter) {
    double C = c->hidden_size, F = c->intermediate_size, V = c->vocab_size;
    double q = (double)c->num_attention_heads * c->head_dim;
    double kv = (double)c->num_key_value_heads * c->head_dim;
    double attn = C * q + 2 * C * kv + q * C;
    double n = V * C; // lm_head (tied or not) counts once
    for (int i = 0; i < c->num_hidden_layers; i++)
        n += attn + (qwen3_layer_is_sparse(c, i)
                         ? (double)c->num_experts * C +
                               3.0 * C * c->moe_intermediate_size * c->num_experts_per_tok
                         : 3 * C * F);
    // A frozen base (LoRA) skips dW: 2N forward + 2N for the input gradients; the adapter's own
    // matmuls train (6 a parameter).
    return (frozen ? 4 * n + 6.0 * adapter : 6 * n) +
           12.0 * c->num_hidden_layers * q * seq_len;
}

double metrics_sgemm_gflops(int n, int repeats) {
    if (n < 1 || repeats < 1) return 0;
    size_t nn = (size_t)n * (size_t)n;
    float *a = malloc(nn * sizeof *a), *b = malloc(nn * sizeof *b), *c = malloc(nn * sizeof *c);
    double best = 0;
    if (a && b && c) {
        for (size_t i = 0; i < nn; i++) a[i] = b[i] = (float)(i % 13) * 0.01f;
        // The best run, not the mean: the first pays for thread start-up and page faults.
        for (int r = 0; r < repeats; r++) {
            double t0 = ct_now_s();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f,
                        c, n);
            double rate = 2.0 * n * n * (double)n / (ct_now_s() - t0) / 1e9;
            if (rate > best) best = rate;
        }
    }
    free(a), free(b), free(c);
    return best;
}

double metrics_bf16_gflops(int n, int repeats) {
    if (n < 1 || repeats < 1) return 0;
    // The built-in table on a kernel state of the measurement's own: its primitives go with it.
    cpu_kernels kernels = {0};
    ct_ops ops = ct_ops_cpu;
    ops.kernel_state = &kernels;
    const size_t nn = (size_t)n * (size_t)n,
                 scratch_n = ops.matmul_bf16_scratch_floats(&ops, n, n, n, false);
    if (scratch_n == SIZE_MAX) {
        cpu_kernels_free(&kernels);
        return 0;
    }
    float *a = malloc(nn * sizeof *a), *c = malloc(nn * sizeof *c);
    float *scratch = malloc(scratch_n * sizeof *scratch);
    uint16_t *b = malloc(nn * sizeof *b);
    double best = 0;
    if (a && b && c && scratch) {
        for (size_t i = 0; i < nn; i++) a[i] = (float)(i % 13) * 0.01f;
        ct_ops_cpu.f32_to_bf16(b, a, nn);
        // As a bf16 linear layer runs: the input rounded to bf16 first, fp32 out.
        for (int r = 0; r < repeats; r++) {
            double t0 = ct_now_s();
            ops.matmul_bf16_forward(&ops, c, NULL, scratch, a, NULL, b, NULL, n, n, n);
            double rate = 2.0 * n * n * (double)n / (ct_now_s() - t0) / 1e9;
            if (rate > best) best = rate;
        }
    }
    free(a), free(b), free(c), free(scratch);
    cpu_kernels_free(&kernels);
    return best;
}
