// A correct, naive "moe_experts" (forward and backward): token by token, each of its experts
// in ascending order, in double, rounded to fp32 where plugin.h's contract adds the terms; the
// backward recomputes what it needs, so neither the state nor the scratch is used (four rows of
// F doubles live on the stack). The bf16 test uses it: the
// plugin ABI is fp32, so under training.mixed_precision_param = "bfloat16" a run with it keeps
// the experts in fp32 (this kernel) while its linear layers run in bf16, and says so.
#include <ctitan/plugin.h>
#include <math.h>
#include <string.h>

static uint64_t forward_calls, backward_calls;

// Expert e's gate g, up u and h = silu(g) * u at one token (F each); returns its weights.
static const float *hidden(double *g, double *u, double *h, const float *x, const float *w, int e,
                           int C, int F) {
    const float *wg = w + (size_t)e * 3 * F * C, *wu = wg + (size_t)F * C;
    for (int f = 0; f < F; f++) {
        double sg = 0, su = 0;
        for (int c = 0; c < C; c++) {
            sg += (double)wg[(size_t)f * C + c] * x[c];
            su += (double)wu[(size_t)f * C + c] * x[c];
        }
        g[f] = sg, u[f] = su, h[f] = sg / (1 + exp(-sg)) * su;
    }
    return wg;
}

// The slot (t, k) of expert e, or -1.
static int slot_of(const int32_t *expert, int t, int e, int K) {
    for (int k = 0; k < K; k++)
        if (expert[(size_t)t * K + k] == e) return t * K + k;
    return -1;
}

static void forward(float *out, float *state, float *scratch, const float *x, const int32_t *expert,
                    const float *weight, const float *w, int N, int C, int F, int E, int K) {
    (void)state, (void)scratch;
    forward_calls++;
    double buf[3 * F], *g = buf, *u = g + F, *h = u + F;
    for (int t = 0; t < N; t++) {
        float *o = out + (size_t)t * C;
        memset(o, 0, (size_t)C * sizeof *o);
        for (int e = 0; e < E; e++) {
            const int s = slot_of(expert, t, e, K);
            if (s < 0) continue;
            const float *wd = hidden(g, u, h, x + (size_t)t * C, w, e, C, F) + (size_t)2 * F * C;
            for (int c = 0; c < C; c++) {
                double y = 0;
                for (int f = 0; f < F; f++) y += (double)wd[(size_t)c * F + f] * h[f];
                o[c] += (float)(weight[s] * y);
            }
        }
    }
}

static void backward(float *dx, float *dweight, float *dw, float *scratch, const float *dout,
                     const float *state, const float *x, const int32_t *expert, const float *weight,
                     const float *w, int N, int C, int F, int E, int K) {
    (void)state, (void)scratch;
    backward_calls++;
    double buf[4 * F], *g = buf, *u = g + F, *h = u + F, *dh = h + F;
    for (int t = 0; t < N; t++) {
        const float *xt = x + (size_t)t * C, *d = dout + (size_t)t * C;
        float *dxt = dx + (size_t)t * C;
        memset(dxt, 0, (size_t)C * sizeof *dxt);
        for (int e = 0; e < E; e++) {
            const int s = slot_of(expert, t, e, K);
            if (s < 0) continue;
            const float *wg = hidden(g, u, h, xt, w, e, C, F), *wu = wg + (size_t)F * C;
            const float *wd = wu + (size_t)F * C;
            float *dwg = dw + (size_t)e * 3 * F * C, *dwu = dwg + (size_t)F * C;
            float *dwd = dwu + (size_t)F * C;
            double dwt = 0;
            for (int f = 0; f < F; f++) {
                double a = 0;
                for (int c = 0; c < C; c++) a += (double)d[c] * wd[(size_t)c * F + f];
                dwt += a * h[f];
                dh[f] = weight[s] * a;
            }
            dweight[s] = (float)dwt;
            for (int c = 0; c < C; c++)
                for (int f = 0; f < F; f++)
                    dwd[(size_t)c * F + f] += (float)(weight[s] * d[c] * h[f]);
            for (int f = 0; f < F; f++) {
                const double sg = 1 / (1 + exp(-g[f]));
                const double dg = dh[f] * u[f] * sg * (1 + g[f] * (1 - sg)), du = dh[f] * g[f] * sg;
                for (int c = 0; c < C; c++) {
                    dwg[(size_t)f * C + c] += (float)(dg * xt[c]);
                    dwu[(size_t)f * C + c] += (float)(du * xt[c]);
                    dxt[c] += (float)(dg * wg[(size_t)f * C + c] + du * wu[(size_t)f * C + c]);
                }
            }
        }
    }
}

CTITAN_PLUGIN_EXPORT int ctitan_plugin_init(uint32_t api_version, ctitan_registry *reg) {
    (void)api_version;
    if (ctitan_register_op(reg, "moe_experts", (ctitan_fn)forward, (ctitan_fn)backward, 0))
        return 1;
    return ctitan_register_counters(reg, "moe_experts", &forward_calls, &backward_calls) ? 1 : 0;
}
