// Generation's attention for one new token (ct_ops.attention_decode, contract in ops.h): its
// query row against the KV cache of positions [0, T), the token's own key and value last. Each
// query head is independent, so the heads run in parallel; GQA: query head h reads kv head
// h / (NH/NKV). Per head: s_j = scale * q.k_j, p = softmax(s) (the exponentials in float, their
// sum in double, as the sdpa kernel's rows), out = sum_j p_j v_j.
#include <math.h>

#include "ops/ops_cpu.h"
#include "ops/vec_math.h"

// q . k over D, in 16 lanes: a single running sum is one dependent add per element, which
// made decode at 512 cached positions 50% slower than at 128 (it cannot be vectorized without
// reordering, which this does explicitly).
CPU_SIMD_CLONES
static float dot_lanes(const float *a, const float *b, int D) {
    float lane[16] = {0};
    int i = 0;
    for (; i + 16 <= D; i += 16)
        for (int j = 0; j < 16; j++) lane[j] += a[i + j] * b[i + j];
    float dot = 0.0f;
    for (int j = 0; j < 16; j++) dot += lane[j];
    for (; i < D; i++) dot += a[i] * b[i];
    return dot;
}

void cpu_attention_decode(float *out, float *scratch, const float *q, const float *k,
                          const float *v, int T, int NH, int NKV, int D) {
    const int rep = NH / NKV, ldk = NKV * D;
    const float scale = (float)(1.0 / sqrt((double)D));
#pragma omp parallel for schedule(static) if ((int64_t)NH * T * D >= CPU_PAR_MIN)
    for (int h = 0; h < NH; h++) {
        const float *qh = q + (size_t)h * D;
        const float *kh = k + (size_t)(h / rep) * D, *vh = v + (size_t)(h / rep) * D;
        float *s = scratch + (size_t)h * T, *o = out + (size_t)h * D;
        float m = -INFINITY;
        for (int j = 0; j < T; j++) {
            s[j] = dot_lanes(qh, kh + (size_t)j * ldk, D) * scale;
            m = s[j] > m ? s[j] : m;
        }
        double sum = 0.0;
        for (int j = 0; j < T; j++) {
            s[j] = expf(s[j] - m);
            sum += s[j];
        }
        const float inv = (float)(1.0 / sum);
        for (int i = 0; i < D; i++) o[i] = 0.0f;
        for (int j = 0; j < T; j++) {
            const float p = s[j] * inv, *vj = vh + (size_t)j * ldk;
            for (int i = 0; i < D; i++) o[i] += p * vj[i];
        }
    }
}
