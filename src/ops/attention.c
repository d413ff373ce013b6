// Causal GQA attention with materialised probabilities (the reference kernel; a flash-style
// kernel can replace it through ct_ops, it only has to size its own state and scratch).
//
// Per (batch b, head h), with Q = q[b,:,h,:] (T,D), K, V = k, v[b,:,h/rep,:] (T,D):
//   S = scale * Q K^T (T,T), P = softmax(S) row-wise over j <= t,   O = P V
// backward, with dO given:
//   dP = dO V^T,  dS = scale * P * (dP - rowsum(P * dP)),
//   dQ = dS K,    dK += dS^T Q,    dV += P^T dO      (+= over the rep heads sharing a kv head)
// The heads are strided views of the (B,T,H,D) tensors (leading dimension H*D), so BLAS reads
// them in place. Rows are processed in blocks of ATT_ROWS: block [r0,r1) only needs keys
// [0,r1), which skips most of the masked upper triangle.
//
// GEMMs are issued serially (OpenBLAS threads each one; the Debian build is pthreads-based and
// must not be called from inside an OpenMP region without oversubscribing), and the row-wise
// softmax work runs as one OpenMP loop over all B*NH*T rows. The kv-gradient sums run in a fixed
// order (b, h, row block), so results are deterministic for a fixed thread count.
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "ops/ops_cpu.h"

#define ATT_ROWS 128

size_t cpu_attention_state_floats(int B, int T, int NH, int NKV, int D) {
    (void)NKV, (void)D;
    return (size_t)B * NH * T * T; // probabilities
}

size_t cpu_attention_scratch_floats(int B, int T, int NH, int NKV, int D) {
    (void)NKV, (void)D;
    return (size_t)B * NH * T * T; // dP, then dS in place
}

static float attention_scale(int D) {
    return (float)(1.0 / sqrt((double)D));
}

void cpu_attention_forward(float *out, float *probs, const float *q, const float *k, const float *v,
                           int B, int T, int NH, int NKV, int D) {
    const int rep = NH / NKV, ldq = NH * D, ldk = NKV * D;
    const float scale = attention_scale(D);
    // S = scale * Q K^T into probs, lower-triangle blocks only.
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const float *qh = q + (size_t)b * T * ldq + (size_t)h * D;
            const float *kh = k + (size_t)b * T * ldk + (size_t)(h / rep) * D;
            float *p = probs + ((size_t)b * NH + h) * T * T;
            for (int r0 = 0; r0 < T; r0 += ATT_ROWS) {
                const int r1 = r0 + ATT_ROWS < T ? r0 + ATT_ROWS : T;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, r1, D, scale,
                            qh + (size_t)r0 * ldq, ldq, kh, ldk, 0.0f, p + (size_t)r0 * T, T);
            }
        }
    }
    // Causal softmax per row; masked entries become exact zeros.
    const int64_t rows = (int64_t)B * NH * T;
#pragma omp parallel for schedule(static) if (rows * T >= CPU_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const int t = (int)(r % T);
        float *row = probs + (size_t)r * T;
        float m = row[0];
        for (int j = 1; j <= t; j++) m = row[j] > m ? row[j] : m;
        double sum = 0.0;
        for (int j = 0; j <= t; j++) {
            row[j] = expf(row[j] - m);
            sum += row[j];
        }
        const float inv = (float)(1.0 / sum);
        for (int j = 0; j <= t; j++) row[j] *= inv;
        for (int j = t + 1; j < T; j++) row[j] = 0.0f;
    }
    // O = P V
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const float *vh = v + (size_t)b * T * ldk + (size_t)(h / rep) * D;
            const float *p = probs + ((size_t)b * NH + h) * T * T;
            float *oh = out + (size_t)b * T * ldq + (size_t)h * D;
            for (int r0 = 0; r0 < T; r0 += ATT_ROWS) {
                const int r1 = r0 + ATT_ROWS < T ? r0 + ATT_ROWS : T;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, D, r1, 1.0f,
                            p + (size_t)r0 * T, T, vh, ldk, 0.0f, oh + (size_t)r0 * ldq, ldq);
            }
        }
    }
}

void cpu_attention_backward(float *dq, float *dk, float *dv, float *dscores, const float *dout,
                            const float *out, const float *probs, const float *q, const float *k,
                            const float *v, int B, int T, int NH, int NKV, int D) {
    (void)out; // the probabilities make rowsum(dO * O) = rowsum(P * dP) directly
    const int rep = NH / NKV, ldq = NH * D, ldk = NKV * D;
    const float scale = attention_scale(D);
    // dP = dO V^T
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const float *vh = v + (size_t)b * T * ldk + (size_t)(h / rep) * D;
            const float *doh = dout + (size_t)b * T * ldq + (size_t)h * D;
            float *ds = dscores + ((size_t)b * NH + h) * T * T;
            for (int r0 = 0; r0 < T; r0 += ATT_ROWS) {
                const int r1 = r0 + ATT_ROWS < T ? r0 + ATT_ROWS : T;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, r1, D, 1.0f,
                            doh + (size_t)r0 * ldq, ldq, vh, ldk, 0.0f, ds + (size_t)r0 * T, T);
            }
        }
    }
    // dS = scale * P * (dP - rowsum(P * dP)), in place; zero above the diagonal so the block
    // GEMMs below can read whole [0, r1) rows.
    const int64_t rows = (int64_t)B * NH * T;
#pragma omp parallel for schedule(static) if (rows * T >= CPU_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const int t = (int)(r % T);
        const float *p = probs + (size_t)r * T;
        float *ds = dscores + (size_t)r * T;
        double dot = 0.0;
        for (int j = 0; j <= t; j++) dot += (double)p[j] * ds[j];
        const float fdot = (float)dot;
        for (int j = 0; j <= t; j++) ds[j] = scale * (p[j] * (ds[j] - fdot));
        for (int j = t + 1; j < T; j++) ds[j] = 0.0f;
    }
    memset(dk, 0, (size_t)B * T * ldk * sizeof(float));
    memset(dv, 0, (size_t)B * T * ldk * sizeof(float));
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const size_t kvoff = (size_t)b * T * ldk + (size_t)(h / rep) * D;
            const size_t qoff = (size_t)b * T * ldq + (size_t)h * D;
            const float *ds = dscores + ((size_t)b * NH + h) * T * T;
            const float *p = probs + ((size_t)b * NH + h) * T * T;
            for (int r0 = 0; r0 < T; r0 += ATT_ROWS) {
                const int r1 = r0 + ATT_ROWS < T ? r0 + ATT_ROWS : T, nr = r1 - r0;
                const float *dsb = ds + (size_t)r0 * T, *pb = p + (size_t)r0 * T;
                // dQ[r0:r1] = dS[r0:r1, 0:r1] K[0:r1]
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nr, D, r1, 1.0f, dsb, T,
                            k + kvoff, ldk, 0.0f, dq + qoff + (size_t)r0 * ldq, ldq);
                // dK[0:r1] += dS[r0:r1, 0:r1]^T Q[r0:r1]
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, D, nr, 1.0f, dsb, T,
                            q + qoff + (size_t)r0 * ldq, ldq, 1.0f, dk + kvoff, ldk);
                // dV[0:r1] += P[r0:r1, 0:r1]^T dO[r0:r1]
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, D, nr, 1.0f, pb, T,
                            dout + qoff + (size_t)r0 * ldq, ldq, 1.0f, dv + kvoff, ldk);
            }
        }
    }
}
