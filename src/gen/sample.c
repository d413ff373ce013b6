// HF's logits processors and draw (sample.h). Following transformers' RepetitionPenalty-
// LogitsProcessor, then (do_sample) TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper
// and MinPLogitsWarper, in generate's order:
//   repetition   each id of the sequence so far, once: x < 0 ? x * penalty : x / penalty (fp32);
//   temperature  scores / t (in fp32);
//   top-k        remove scores < the k-th largest score (ties at it stay);
//   top-p        sort ascending (stable: among equal scores the lower id first), softmax,
//                cumulative sum; remove the tokens whose cumulative probability is <= 1 - p,
//                but never the last (the highest) one;
//   min-p        softmax; remove the tokens whose probability is < min_p times the largest;
// then softmax over what remains and one draw. The cumulative sum runs in double and compares
// in float as torch's CPU cumsum (double accumulation for float tensors) and comparison do.
#include "gen/sample.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"

int gen_sampler_init(gen_sampler *s, int V, const gen_settings *set, ct_error *err) {
    memset(s, 0, sizeof *s);
    if (!(set->temperature >= 0.0f) || !isfinite(set->temperature))
        return ct_fail(err, "--temperature %g: expected a finite number >= 0", set->temperature);
    if (set->top_k < 0)
        return ct_fail(err, "--top_k %d: expected an integer >= 0 (0: off)", set->top_k);
    if (!(set->top_p > 0.0f && set->top_p <= 1.0f))
        return ct_fail(err, "--top_p %g: expected a number in (0, 1] (1: off)", set->top_p);
    if (!(set->min_p >= 0.0f && set->min_p <= 1.0f))
        return ct_fail(err, "--min_p %g: expected a number in [0, 1] (0: off)", set->min_p);
    if (!(set->repetition_penalty > 0.0f) || !isfinite(set->repetition_penalty))
        return ct_fail(err, "--repetition_penalty %g: expected a finite number > 0 (1: off)",
                       set->repetition_penalty);
    if (V < 1) return ct_fail(err, "sampling: vocabulary size %d", V);
    s->probs = malloc((size_t)V * sizeof *s->probs);
    s->order = malloc(2 * (size_t)V * sizeof *s->order); // the sort's merge buffer after it
    s->keys = malloc(2 * (size_t)V * sizeof *s->keys);
    s->sorted = malloc((size_t)V * sizeof *s->sorted);
    s->left = malloc((size_t)V * sizeof *s->left);
    s->seen = calloc((size_t)V, sizeof *s->seen);
    if (!s->probs || !s->order || !s->keys || !s->sorted || !s->left || !s->seen) {
        gen_sampler_free(s);
        return ct_fail(err, "sampling: out of memory for a vocabulary of %d", V);
    }
    s->V = V;
    s->set = *set;
    return 0;
}

void gen_sampler_free(gen_sampler *s) {
    free(s->probs);
    free(s->order);
    free(s->keys);
    free(s->sorted);
    free(s->left);
    free(s->seen);
    memset(s, 0, sizeof *s);
}

// ids[0, n), given in ascending id order, sorted by x ascending, equal values keeping their id
// order (a stable sort, as torch's sort keeps ties here); tmp holds n more. The merge sort
// compares with `<`, which a NaN makes no order: rows with one take it (radix_sort_ids cannot
// give its result).
static void merge_sort_ids(int32_t *ids, int32_t *tmp, const float *x, int n) {
    for (int w = 1; w < n; w *= 2) {
        for (int lo = 0; lo < n; lo += 2 * w) {
            const int mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int a = lo, b = mid, o = lo;
            while (a < mid && b < hi) tmp[o++] = x[ids[b]] < x[ids[a]] ? ids[b++] : ids[a++];
            while (a < mid) tmp[o++] = ids[a++];
            while (b < hi) tmp[o++] = ids[b++];
        }
        memcpy(ids, tmp, (size_t)n * sizeof *ids);
    }
}

enum { RADIX_BITS = 11, RADIX = 1 << RADIX_BITS };

// The same order by a least-significant-digit radix sort (each pass stable, so ties keep their id
// order): the keys are the floats' bits made unsigned and ordered as the values, -0 as +0 (`<`
// ties them), three passes of 11 bits, a pass skipped where every key has the same digit. A
// whole vocabulary of 151936 ids: about 1 ms, where the merge sort's 17 passes of indirect
// compares took 17-20 ms. keys holds 2n. Returns false, sorting nothing, if x has a NaN.
static bool radix_sort_ids(int32_t *ids, int32_t *tmp, uint32_t *keys, const float *x, int n) {
    uint32_t *k = keys, *ktmp = keys + n;
    if (n < 2) return true;
    for (int i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[ids[i]], sizeof u);
        if ((u & 0x7fffffffu) > 0x7f800000u) return false;
        if (u == 0x80000000u) u = 0;
        k[i] = u & 0x80000000u ? ~u : u | 0x80000000u;
    }
    static_assert(3 * RADIX_BITS >= 32, "three passes cover the key");
    for (int shift = 0; shift < 32; shift += RADIX_BITS) {
        int count[RADIX] = {0};
        for (int i = 0; i < n; i++) count[(k[i] >> shift) & (RADIX - 1)]++;
        if (count[(k[0] >> shift) & (RADIX - 1)] == n) continue;
        for (int d = 0, at = 0; d < RADIX; d++) {
            const int c = count[d];
            count[d] = at;
            at += c;
        }
        for (int i = 0; i < n; i++) {
            const int o = count[(k[i] >> shift) & (RADIX - 1)]++;
            tmp[o] = ids[i], ktmp[o] = k[i];
        }
        int32_t *ti = ids;
        ids = tmp, tmp = ti;
        uint32_t *tk = k;
        k = ktmp, ktmp = tk;
    }
    if (k != keys) memcpy(tmp, ids, (size_t)n * sizeof *ids); // an odd number of passes ran
    return true;
}

// The k-th largest of x[0, V) (0 < k < V), counting equal values, as x[order[V - k]] after the
// full sort: a min-heap (heap, k floats) of the k largest seen, its root their smallest.
static float kth_largest(float *heap, const float *x, int V, int k) {
    for (int i = 0; i < V; i++) {
        if (i >= k && !(x[i] > heap[0])) continue;
        int at = 0; // i < k: sift x[i] up from the end; else it replaces the root and sifts down
        if (i < k) {
            for (at = i; at > 0 && x[i] < heap[(at - 1) / 2]; at = (at - 1) / 2)
                heap[at] = heap[(at - 1) / 2];
        } else {
            for (int c; (c = 2 * at + 1) < k; at = c) {
                if (c + 1 < k && heap[c + 1] < heap[c]) c++;
                if (!(heap[c] < x[i])) break;
                heap[at] = heap[c];
            }
        }
        heap[at] = x[i];
    }
    return heap[0];
}

// Top-k in place: the scores below the k-th largest become -inf. order[0, n) gets the ids that
// stay (n >= k with ties), in id order; returns n. (A NaN score compares false: once the heap is
// full it never enters it, and it is never removed.)
static int top_k_filter(gen_sampler *s, float *x) {
    const float kth = kth_largest(s->sorted, x, s->V, s->set.top_k);
    int n = 0;
    for (int i = 0; i < s->V; i++) {
        if (x[i] < kth)
            x[i] = -INFINITY;
        else
            s->order[n++] = i;
    }
    return n;
}

// probs[at(j)] = the softmax of x[at(j)] over j in [0, n), at(j) = ids[j] (or j without ids);
// a -inf entry gets 0.
static void softmax(float *probs, const float *x, const int32_t *ids, int n) {
#define AT(j) (ids ? ids[j] : (j))
    float m = -INFINITY;
    for (int j = 0; j < n; j++) m = x[AT(j)] > m ? x[AT(j)] : m;
    double sum = 0.0;
    for (int j = 0; j < n; j++)
        sum += probs[AT(j)] = x[AT(j)] == -INFINITY ? 0.0f : expf(x[AT(j)] - m);
    const float inv = (float)(1.0 / sum);
    for (int j = 0; j < n; j++) probs[AT(j)] *= inv;
#undef AT
}

// x = logits with the repetition penalty over ids[0, n): each id once (HF gathers the logits of
// the ids, then scatters the penalised values back, a repeated id writing the same value). Ids
// outside [0, V) are none of the vocabulary's and are passed over.
static void penalize(gen_sampler *s, float *x, const float *logits, const int32_t *ids, size_t n) {
    memcpy(x, logits, (size_t)s->V * sizeof *x);
    const float penalty = s->set.repetition_penalty;
    for (size_t i = 0; i < n; i++) {
        const int32_t id = ids[i];
        if (id < 0 || id >= s->V || s->seen[id]) continue;
        s->seen[id] = 1;
        x[id] = x[id] < 0.0f ? x[id] * penalty : x[id] / penalty;
    }
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < s->V) s->seen[ids[i]] = 0;
}

// s->left[0, s->n_left) = the ids whose score x is not -inf, and x = the softmax over them (the
// others 0).
static void softmax_left(gen_sampler *s, float *x) {
    s->n_left = 0;
    for (int i = 0; i < s->V; i++) {
        if (x[i] == -INFINITY)
            x[i] = 0.0f;
        else
            s->left[s->n_left++] = i;
    }
    softmax(x, x, s->left, s->n_left);
}

int gen_sampler_probs(gen_sampler *s, const float *logits, const int32_t *ids, size_t n_ids) {
    const int V = s->V;
    float *x = s->probs;                     // the scores, then their softmax in place
    if (s->set.repetition_penalty == 1.0f) { // one pass: the scores straight from the logits
        for (int i = 0; i < V; i++) x[i] = logits[i] / s->set.temperature;
    } else {
        penalize(s, x, logits, ids, n_ids);
        for (int i = 0; i < V; i++) x[i] = x[i] / s->set.temperature;
    }
    const bool top_k = s->set.top_k > 0 && s->set.top_k < V, top_p = s->set.top_p < 1.0f;
    int n = V; // the ids top-p orders: top-k's survivors (the others' probability is 0)
    if (top_k) {
        n = top_k_filter(s, x);
    } else if (top_p) {
        for (int i = 0; i < V; i++) s->order[i] = i;
    }
    if (top_p) {
        // Ascending over the survivors; the removed tokens, all below them, would only add zeros
        // before them to the softmax's sum and the cumulative one.
        if (!radix_sort_ids(s->order, s->order + V, s->keys, x, n))
            merge_sort_ids(s->order, s->order + V, x, n);
        float *p = s->sorted;
        for (int i = 0; i < n; i++) p[i] = x[s->order[i]];
        softmax(p, p, NULL, n);
        const float limit = (float)(1.0 - (double)s->set.top_p);
        double cum = 0.0;
        for (int i = 0; i < n - 1; i++) {
            cum += p[i];
            if ((float)cum <= limit) x[s->order[i]] = -INFINITY;
        }
    }
    if (s->set.min_p > 0.0f) {
        // The softmax of what is left (kept in s->sorted, as x's scores are needed after), its
        // largest probability, and the tokens below min_p times it removed. The likeliest token
        // never is (min_p <= 1).
        float *p = s->sorted;
        memcpy(p, x, (size_t)V * sizeof *p);
        softmax_left(s, p);
        float top = 0.0f;
        for (int j = 0; j < s->n_left; j++) top = p[s->left[j]] > top ? p[s->left[j]] : top;
        const float threshold = s->set.min_p * top;
        for (int j = 0; j < s->n_left; j++)
            if (p[s->left[j]] < threshold) x[s->left[j]] = -INFINITY;
    }
    // The softmax and the draw run over the tokens left, in id order: the removed ones' zeros
    // would add nothing to their sums.
    softmax_left(s, x);
    int kept = 0;
    for (int j = 0; j < s->n_left; j++) kept += x[s->left[j]] != 0.0f;
    return kept;
}

// The first index of the largest of x[0, V), as a scan keeping the first strictly larger one:
// NaNs are passed over, except one at index 0, which that scan never leaves. The largest by a
// vector reduction, then its first index (a tenth of the scan's time over 151936 ids).
static int32_t argmax(const float *x, int V) {
    float m = x[0];
    if (isnan(m)) return 0;
#pragma omp simd reduction(max : m)
    for (int i = 1; i < V; i++) m = x[i] > m ? x[i] : m;
    int32_t i = 0;
    while (!(x[i] == m)) i++;
    return i;
}

int32_t gen_sample(gen_sampler *s, const float *logits, const int32_t *ids, size_t n) {
    const int V = s->V;
    if (s->set.temperature == 0.0f) {
        if (s->set.repetition_penalty == 1.0f) return argmax(logits, V);
        penalize(s, s->probs, logits, ids, n);
        return argmax(s->probs, V);
    }
    gen_sampler_probs(s, logits, ids, n);
    const double u = ct_splitmix64_uniform_at(s->set.seed, s->draws++);
    double total = 0.0;
    for (int j = 0; j < s->n_left; j++) total += s->probs[s->left[j]];
    double cum = 0.0, at = u * total;
    int32_t last = 0;
    for (int j = 0; j < s->n_left; j++) {
        const int32_t i = s->left[j];
        if (s->probs[i] == 0.0f) continue;
        last = i;
        cum += s->probs[i];
        if (cum > at) return i;
    }
    return last; // rounding left u * total at the very end
}
