// The data-parallel bookkeeping that needs no second process: how gradient buckets cut the
// buffer and how the ZeRO-1 shards and each bucket's per-rank parts tile it. The collectives
// themselves run under mpirun in tests/tok_mpi.sh.
#include "check.h"
#include "parallel/grad_sync.h"

// tensor_start as the model lays it out: a big embedding, then small and middling tensors.
static const size_t starts[] = {0, 5000, 5010, 5400, 5800, 6200, 6210, 9000};
enum { N_TENSORS = 8, N = 9100 };

static void check_buckets(size_t cap, const char *what) {
    dist d = {.rank = 0, .size = 1, .local_size = 1};
    grad_sync s;
    ct_error err;
    static float p[N], g[N];
    CHECK(grad_sync_init(&s, &d, GRAD_SYNC_REPLICATE, NULL, NULL, p, g, N, starts, N_TENSORS, cap,
                         false, &err) == 0,
          "%s: %s", what, err.msg);
    size_t end = N;
    for (int i = 0; i < s.n_buckets; i++) {
        const grad_bucket *b = &s.buckets[i];
        CHECK(b->hi == end && b->lo < b->hi, "%s: bucket %d [%zu, %zu) does not continue at %zu",
              what, i, b->lo, b->hi, end);
        CHECK(b->hi - b->lo < 2 * cap, "%s: bucket %d holds %zu > 2 x cap", what, i, b->hi - b->lo);
        // A cut inside a tensor happens only in a tensor bigger than cap.
        bool at_boundary = false, in_big = false;
        for (int t = 0; t < N_TENSORS; t++) {
            size_t hi = t + 1 < N_TENSORS ? starts[t + 1] : N;
            at_boundary |= starts[t] == b->lo;
            in_big |= starts[t] < b->lo && b->lo < hi && hi - starts[t] > cap;
        }
        CHECK(at_boundary || in_big, "%s: bucket %d starts at %zu, inside a small tensor", what, i,
              b->lo);
        end = b->lo;
    }
    CHECK(end == 0, "%s: buckets stop at %zu, not 0", what, end);
    CHECK(s.shard_lo == 0 && s.shard_hi == N, "%s: one replica owns everything", what);
    grad_sync_free(&s);
}

// Rank r of P owns [N*r/P, N*(r+1)/P); each bucket's parts (counts, displacements) are those
// shards cut by the bucket, so they add up to the bucket in rank order.
static void check_shards(int P, size_t cap) {
    static float p[N], g[N];
    size_t covered = 0;
    for (int r = 0; r < P; r++) {
        dist d = {.rank = r, .size = P, .local_size = P};
        grad_sync s;
        ct_error err;
        CHECK(grad_sync_init(&s, &d, GRAD_SYNC_SHARD, NULL, NULL, p, g, N, starts, N_TENSORS, cap,
                             false, &err) == 0,
              "P=%d: %s", P, err.msg);
        size_t n = s.shard_hi - s.shard_lo;
        CHECK(s.shard_lo == covered && (n == (size_t)(N / P) || n == (size_t)(N / P + 1)),
              "P=%d rank %d: shard [%zu, %zu)", P, r, s.shard_lo, s.shard_hi);
        covered = s.shard_hi;
        for (int i = 0; i < s.n_buckets; i++) {
            const grad_bucket *b = &s.buckets[i];
            size_t at = b->lo;
            for (int q = 0; q < P; q++) {
                int c = s.counts[(size_t)i * P + q], off = s.displs[(size_t)i * P + q];
                if (c == 0) continue;
                CHECK(b->lo + (size_t)off == at, "P=%d bucket %d: rank %d's part is not next", P, i,
                      q);
                at += (size_t)c;
            }
            CHECK(at == b->hi, "P=%d bucket %d: parts cover up to %zu of [%zu, %zu)", P, i, at,
                  b->lo, b->hi);
        }
        grad_sync_free(&s);
    }
    CHECK(covered == N, "P=%d: shards cover %zu of %d", P, covered, N);
}

int main(void) {
    check_buckets(1000, "cap 1000");
    check_buckets(1, "cap 1");
    check_buckets(100000, "one bucket");
    check_buckets(4999, "embedding just over cap");
    for (int P = 2; P <= 7; P++) check_shards(P, 700);
    check_shards(64, 5000);
    return check_summary();
}
