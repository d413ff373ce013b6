// The Qwen3-MoE router: softmax, torch-compatible top-k, renormalisation, and their backward.
//
// Top-k must pick the same experts as torch.topk on CPU even when scores tie (a zero router
// gives all-equal rows, and HF's choice among them is whatever libstdc++'s selection algorithms
// leave in front). PyTorch's TopKImpl.h fills (value, index) pairs in index order, then for
// largest=true runs std::partial_sort when 64*K <= E, else std::nth_element at K-1 followed by
// std::sort of the first K-1, all with the comparator "x is NaN and y is not, or x > y" (so
// NaN counts as largest). The functions below follow libstdc++'s (GCC 12) bits/stl_algo.h and
// bits/stl_heap.h step for step - same pivots, same swaps, same insertion-sort thresholds -
// because with ties any deviation changes which equal element ends up where.
#include <math.h>
#include <omp.h>
#include <string.h>

#include "ops/moe_router.h"
#include "ops/ops_cpu.h"

typedef struct topk_pair {
    float v;
    int i;
} topk_pair;

_Static_assert(sizeof(topk_pair) == 2 * sizeof(float), "a pair takes two scratch floats");

static inline int gt(topk_pair x, topk_pair y) {
    return (isnan(x.v) && !isnan(y.v)) || x.v > y.v;
}

static inline void swap(topk_pair *a, topk_pair *b) {
    const topk_pair t = *a;
    *a = *b;
    *b = t;
}

static int floor_log2(long n) {
    int r = 0;
    while (n >>= 1) r++;
    return r;
}

// ---- stl_heap.h ---------------------------------------------------------------------------

static void push_heap(topk_pair *q, long hole, long top, topk_pair val) {
    long parent = (hole - 1) / 2;
    while (hole > top && gt(q[parent], val)) {
        q[hole] = q[parent];
        hole = parent;
        parent = (hole - 1) / 2;
    }
    q[hole] = val;
}

static void adjust_heap(topk_pair *q, long hole, long len, topk_pair val) {
    const long top = hole;
    long child = hole;
    while (child < (len - 1) / 2) {
        child = 2 * (child + 1);
        if (gt(q[child], q[child - 1])) child--;
        q[hole] = q[child];
        hole = child;
    }
    if ((len & 1) == 0 && child == (len - 2) / 2) {
        child = 2 * (child + 1);
        q[hole] = q[child - 1];
        hole = child - 1;
    }
    push_heap(q, hole, top, val);
}

static void make_heap(topk_pair *q, long len) {
    if (len < 2) return;
    for (long parent = (len - 2) / 2;; parent--) {
        adjust_heap(q, parent, len, q[parent]);
        if (parent == 0) return;
    }
}

// Moves the top of the heap q[0, last) to *result and sifts the old *result into the heap.
static void pop_heap(topk_pair *q, long last, topk_pair *result) {
    const topk_pair val = *result;
    *result = q[0];
    adjust_heap(q, 0, last, val);
}

static void sort_heap(topk_pair *q, long last) {
    while (last > 1) {
        last--;
        pop_heap(q, last, &q[last]);
    }
}

// ---- stl_algo.h ---------------------------------------------------------------------------

static void heap_select(topk_pair *q, long middle, long last) {
    make_heap(q, middle);
    for (long i = middle; i < last; i++)
        if (gt(q[i], q[0])) pop_heap(q, middle, &q[i]);
}

static void partial_sort(topk_pair *q, long middle, long last) {
    heap_select(q, middle, last);
    sort_heap(q, middle);
}

static void unguarded_linear_insert(topk_pair *q, long last) {
    const topk_pair val = q[last];
    long next = last - 1;
    while (gt(val, q[next])) {
        q[last] = q[next];
        last = next;
        next--;
    }
    q[last] = val;
}

static void insertion_sort(topk_pair *q, long first, long last) {
    if (first == last) return;
    for (long i = first + 1; i != last; i++) {
        if (gt(q[i], q[first])) {
            const topk_pair val = q[i];
            memmove(&q[first + 1], &q[first], (size_t)(i - first) * sizeof *q);
            q[first] = val;
        } else {
            unguarded_linear_insert(q, i);
        }
    }
}

enum { S_THRESHOLD = 16 };

static void final_insertion_sort(topk_pair *q, long first, long last) {
    if (last - first > S_THRESHOLD) {
        insertion_sort(q, first, first + S_THRESHOLD);
        for (long i = first + S_THRESHOLD; i != last; i++) unguarded_linear_insert(q, i);
    } else {
        insertion_sort(q, first, last);
    }
}

static void move_median_to_first(topk_pair *q, long result, long a, long b, long c) {
    if (gt(q[a], q[b])) {
        if (gt(q[b], q[c]))
            swap(&q[result], &q[b]);
        else if (gt(q[a], q[c]))
            swap(&q[result], &q[c]);
        else
            swap(&q[result], &q[a]);
    } else if (gt(q[a], q[c])) {
        swap(&q[result], &q[a]);
    } else if (gt(q[b], q[c])) {
        swap(&q[result], &q[c]);
    } else {
        swap(&q[result], &q[b]);
    }
}

static long unguarded_partition(topk_pair *q, long first, long last, long pivot) {
    for (;;) {
        while (gt(q[first], q[pivot])) first++;
        last--;
        while (gt(q[pivot], q[last])) last--;
        if (!(first < last)) return first;
        swap(&q[first], &q[last]);
        first++;
    }
}

static long unguarded_partition_pivot(topk_pair *q, long first, long last) {
    const long mid = first + (last - first) / 2;
    move_median_to_first(q, first, first + 1, mid, last - 1);
    return unguarded_partition(q, first + 1, last, first);
}

static void introsort_loop(topk_pair *q, long first, long last, int depth) {
    while (last - first > S_THRESHOLD) {
        if (depth == 0) {
            // __partial_sort(first, last, last) on the subrange.
            partial_sort(q + first, last - first, last - first);
            return;
        }
        depth--;
        const long cut = unguarded_partition_pivot(q, first, last);
        introsort_loop(q, cut, last, depth);
        last = cut;
    }
}

static void sort(topk_pair *q, long first, long last) {
    if (first == last) return;
    introsort_loop(q, first, last, floor_log2(last - first) * 2);
    final_insertion_sort(q, first, last);
}

static void introselect(topk_pair *q, long first, long nth, long last, int depth) {
    while (last - first > 3) {
        if (depth == 0) {
            heap_select(q + first, nth + 1 - first, last - first);
            swap(&q[first], &q[nth]); // the nth largest into its final place
            return;
        }
        depth--;
        const long cut = unguarded_partition_pivot(q, first, last);
        if (cut <= nth)
            first = cut;
        else
            last = cut;
    }
    insertion_sort(q, first, last);
}

static void nth_element(topk_pair *q, long nth, long last) {
    if (last == 0 || nth == last) return;
    introselect(q, 0, nth, last, floor_log2(last) * 2);
}

// torch.topk(largest=True, sorted=True) over q[0, n): the first k pairs come out in order.
static void topk_torch(topk_pair *q, long n, long k) {
    if (k * 64 <= n) {
        partial_sort(q, k, n);
    } else {
        nth_element(q, k - 1, n);
        sort(q, 0, k - 1);
    }
}

// ---- forward --------------------------------------------------------------------------------

static void route_token(int32_t *expert, float *weight, float *p, const float *bias, int E, int K,
                        bool norm, topk_pair *q) {
    float m = p[0];
    for (int e = 1; e < E; e++) m = p[e] > m ? p[e] : m;
    float sum = 0.0f;
    for (int e = 0; e < E; e++) sum += (p[e] = expf(p[e] - m));
    // torch's CPU softmax scales by the reciprocal of the sum rather than dividing.
    const float inv = 1.0f / sum;
    for (int e = 0; e < E; e++) p[e] *= inv;

    for (int e = 0; e < E; e++) q[e] = (topk_pair){bias ? p[e] + bias[e] : p[e], e};
    topk_torch(q, E, K);
    float s = 0.0f;
    for (int k = 0; k < K; k++) {
        expert[k] = q[k].i;
        weight[k] = p[q[k].i];
        s += weight[k];
    }
    if (norm)
        for (int k = 0; k < K; k++) weight[k] /= s;
}

size_t moe_route_scratch_floats(int E, int threads) {
    if (E <= MOE_ROUTE_STACK) return 0;
    return (size_t)(threads > 0 ? threads : 1) * (size_t)E * (sizeof(topk_pair) / sizeof(float));
}

void moe_route_forward(int32_t *expert, float *weight, float *probs, const float *bias, int N,
                       int E, int K, bool norm, float *scratch, int threads) {
    // A wide router sorts in the planned scratch, one row of E pairs per thread: the team is
    // capped at the threads it was planned for.
    const bool wide = E > MOE_ROUTE_STACK;
    int team = omp_get_max_threads();
    if (wide && threads < team) team = threads > 0 ? threads : 1;
        // The selection costs O(E log E) per token: worth threads at fewer values than a plain
        // loop.
#pragma omp parallel num_threads(team) if ((int64_t)N * E * 8 >= CPU_PAR_MIN)
    {
        topk_pair stack[MOE_ROUTE_STACK];
        topk_pair *q = wide ? (topk_pair *)scratch + (size_t)omp_get_thread_num() * E : stack;
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++)
            route_token(expert + (size_t)n * K, weight + (size_t)n * K, probs + (size_t)n * E, bias,
                        E, K, norm, q);
    }
}

// ---- backward -------------------------------------------------------------------------------
// Dot products are accumulated in double (cheap at these sizes; no ordering subtleties).

void moe_route_backward(float *dlogits, const float *dweight, const float *aux_dprob,
                        const float *probs, const int32_t *expert, const float *weight, int N,
                        int E, int K, bool norm) {
#pragma omp parallel for schedule(static) if ((int64_t)N * E >= CPU_PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *p = probs + (size_t)n * E;
        const int32_t *ex = expert + (size_t)n * K;
        const float *dw = dweight + (size_t)n * K, *w = weight + (size_t)n * K;
        float *dp = dlogits + (size_t)n * E; // dprobs first, then turned into dlogits in place
        for (int e = 0; e < E; e++) dp[e] = aux_dprob ? aux_dprob[e] : 0.0f;
        if (norm) {
            // w_k = p_k / s: d/dp_k = (dw_k - sum_j dw_j w_j) / s. s is recomputed exactly as
            // the forward summed it.
            float s = 0.0f;
            double dot = 0;
            for (int k = 0; k < K; k++) {
                s += p[ex[k]];
                dot += (double)dw[k] * w[k];
            }
            for (int k = 0; k < K; k++) dp[ex[k]] += (float)(((double)dw[k] - dot) / s);
        } else {
            for (int k = 0; k < K; k++) dp[ex[k]] += dw[k];
        }
        double dot = 0;
        for (int e = 0; e < E; e++) dot += (double)p[e] * dp[e];
        for (int e = 0; e < E; e++) dp[e] = (float)(p[e] * (dp[e] - dot));
    }
}

void moe_route_stats(double *load, double *prob_sum, const int32_t *expert, const float *probs,
                     int N, int E, int K) {
    for (size_t s = 0; s < (size_t)N * K; s++) load[expert[s]] += 1.0;
    // Column blocks, each summing its tokens in order: independent of the thread count.
    const int nblocks = (E + CPU_COL_BLOCK - 1) / CPU_COL_BLOCK;
#pragma omp parallel for schedule(static) if ((int64_t)N * E >= CPU_PAR_MIN)
    for (int blk = 0; blk < nblocks; blk++) {
        const int e0 = blk * CPU_COL_BLOCK;
        const int e1 = e0 + CPU_COL_BLOCK < E ? e0 + CPU_COL_BLOCK : E;
        double acc[CPU_COL_BLOCK];
        for (int e = e0; e < e1; e++) acc[e - e0] = prob_sum[e];
        for (int n = 0; n < N; n++) {
            const float *p = probs + (size_t)n * E;
            for (int e = e0; e < e1; e++) acc[e - e0] += p[e];
        }
        for (int e = e0; e < e1; e++) prob_sum[e] = acc[e - e0];
    }
}
