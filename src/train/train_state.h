// What the trainer needs, besides the model and the optimizer's moments, to continue a run
// exactly where it stopped. Saved in a checkpoint's state.json by ckpt_save.
//
// There is no data RNG state to save: the loader's shuffle is a counter-based RNG (data/ctr_rng.h)
// keyed by (debug.seed, epoch), so (seed, samples_seen) determine every future sample, and the
// seed is part of the config (and of config_hash).
#pragma once
#include <stdint.h>

typedef struct train_state {
    int64_t step;           // training steps completed; the checkpoint folder is step-<step>
    int64_t opt_step;       // AdamW's step count t (lags `step` by the skipped steps)
    uint64_t samples_seen;  // the data loader's global sample index g (all ranks together)
    uint64_t config_hash;   // config_hash() of the run's effective config
    int32_t skipped_in_row; // non-finite steps skipped in a row at the time of the save
    double time_s;          // wall-clock seconds of training so far (metrics continue from it)
    // LoRA runs (0 otherwise): the identity of the frozen base the adapter trains on (XXH64 of
    // its weights as held, qwen3_lora_base_hash), which a resume must find again, and the
    // forwards run so far (the dropout masks' counter, qwen3_lora.forwards).
    uint64_t lora_base_hash;
    uint64_t lora_forwards;
} train_state;
