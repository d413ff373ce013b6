// FSDP's memory estimate (fsdp_peak_gathered_bytes): the hook's events replayed on unit sizes,
// against the same events worked out by hand for four small units (an embedding of 100
// elements, two layers of 10, a head of 50, or of 5 when tied: the final norm alone). The
// collectives themselves run under mpirun in tests/fsdp.sh.
#include "check.h"
#include "parallel/fsdp.h"

static const size_t lo[] = {0, 100, 110, 120}, hi_untied[] = {100, 110, 120, 170},
                    hi_tied[] = {100, 110, 120, 125};

static void expect_of(const char *what, const size_t *hi, fsdp_reshard reshard, bool bf16,
                      bool tied, bool frozen, double want) {
    fsdp_opts o = {.shard_degree = 2,
                   .replicate_degree = 1,
                   .reshard = reshard,
                   .bf16_params = bf16,
                   .bf16_reduce = bf16,
                   .frozen = frozen};
    double got = fsdp_peak_gathered_bytes(lo, hi, 4, &o, tied);
    CHECK(got == want, "%s: peak %.0f bytes, expected %.0f", what, got, want);
}
static void expect(const char *what, const size_t *hi, fsdp_reshard reshard, bool bf16, bool tied,
                   double want) {
    expect_of(what, hi, reshard, bf16, tied, false, want);
}

int main(void) {
    // Untied, "default": the worst moment is the embedding's backward, its weights (400) and
    // gradient (400) beside the first layer's gradient in the ring (40).
    expect("untied default", hi_untied, FSDP_RESHARD_DEFAULT, false, false, 840);
    // "never": the head's backward, with every unit still gathered (680) and its gradient (200).
    expect("untied never", hi_untied, FSDP_RESHARD_NEVER, false, false, 880);
    expect("untied always", hi_untied, FSDP_RESHARD_ALWAYS, false, false, 840);
    // bf16 gathers (6 bytes a gathered element: the bf16 gather and its fp32 widening) and a
    // bf16 reduction (2 bytes in the ring): 600 + 400 + 20 at the embedding's backward.
    expect("untied default bf16", hi_untied, FSDP_RESHARD_DEFAULT, true, false, 1020);
    // Tied: the embedding stays gathered from its forward to its own backward, and its gradient
    // lives from the head's backward on. The worst moment is the second layer's backward: the
    // layer, its prefetched neighbour and the embedding (480), their gradients (440) and the
    // head's in the ring (20).
    expect("tied default", hi_tied, FSDP_RESHARD_DEFAULT, false, true, 940);
    // A frozen model (LoRA's base): weights only. Untied, the embedding with its prefetched
    // first layer (110 elements), fp32 or, held in bf16 only, 2 bytes each; tied, the second
    // layer's forward or backward beside the embedding and a neighbour (120).
    expect_of("frozen untied", hi_untied, FSDP_RESHARD_DEFAULT, false, false, true, 440);
    expect_of("frozen untied bf16", hi_untied, FSDP_RESHARD_DEFAULT, true, false, true, 220);
    expect_of("frozen tied", hi_tied, FSDP_RESHARD_DEFAULT, false, true, true, 480);
    return check_summary();
}
