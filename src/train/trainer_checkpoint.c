// The trainer's checkpoints: resume (rank 0 picks the newest complete one, every rank loads
// the model and its range of the optimizer state), save (every rank its optimizer shard, rank 0
// the model and state.json, after the replicas agree bit for bit), and the final HF export.
#include <stdlib.h>
#include <string.h>

#include "model/peft_adapter.h"
#include "model/qwen3_lora.h"
#include "train/trainer_internal.h"

void trainer_log_notes(trainer *t, ckpt_notes *notes) {
    for (int i = 0; i < notes->n; i++) fprintf(t->log, "checkpoint: %s\n", notes->msgs[i]);
    ckpt_notes_free(notes);
}

// A checkpoint of another config: name each key that changed, from the config.toml saved in
// the checkpoint, and the two ways out.
static void refuse_resume(const trainer *t, const char *dir, ct_error *err) {
    char path[4200], changes[2048] = "";
    snprintf(path, sizeof path, "%s/config.toml", dir);
    ct_config old;
    ct_error ignored;
    int n = 0;
    if (config_load(&old, path, 0, NULL, &ignored) == 0) {
        n = config_describe_changes(changes, sizeof changes, &old, t->cfg);
        if (n == 0) // the same keys, but not the same resolved global batch
            snprintf(changes, sizeof changes,
                     "the global batch (training.global_batch_size resolves to %d sequences now)",
                     t->global_batch);
    }
    ct_fail(err,
            "%s was written by a run with a different config: %s; to resume, restore %s, or "
            "train into a new job.dump_folder",
            dir, changes[0] ? changes : "its config.toml could not be compared",
            n == 1 ? "that key" : "those keys");
}

// Host views of the optimizer moments' elements [lo, lo + n) of the parameter buffer (the
// moments themselves on the plain CPU backend), for the checkpoint files; released with
// `write_back` after a load.
static int moments_view(trainer *t, size_t lo, size_t n, bool fill, float *host[2], ct_error *err) {
    ct_backend *be = t->opt.be;
    float *dev[2] = {t->opt.m + (lo - t->opt.base), t->opt.v + (lo - t->opt.base)};
    host[1] = NULL;
    if (!(host[0] = be->view(be, dev[0], n * sizeof(float), fill, err))) return -1;
    if (!(host[1] = be->view(be, dev[1], n * sizeof(float), fill, err))) {
        be->view_release(be, host[0], dev[0], n * sizeof(float), false);
        return -1;
    }
    return 0;
}
static void moments_release(trainer *t, size_t lo, size_t n, float *host[2], bool write_back) {
    ct_backend *be = t->opt.be;
    be->view_release(be, host[0], t->opt.m + (lo - t->opt.base), n * sizeof(float), write_back);
    be->view_release(be, host[1], t->opt.v + (lo - t->opt.base), n * sizeof(float), write_back);
}

// Rank 0 picks the newest complete checkpoint (verifying every file) and tells the others (over
// the world: under TP, t->d is only this TP rank's data-parallel group); each rank then loads the
// model and its own range of the optimizer state, whatever rank count wrote it. Returns 1 when
// resumed, 0 when there is nothing to resume, -1 on error.
int trainer_resume(trainer *t, ct_error *err) {
    char dir[4096] = "";
    int rc = 0;
    if (is_root(t)) {
        ckpt_notes notes = {0};
        rc = ckpt_clean_stale(t->ckpt_root, &notes, err);
        if (rc == 0) rc = ckpt_find_latest(dir, sizeof dir, NULL, t->ckpt_root, NULL, &notes, err);
        trainer_log_notes(t, &notes);
    }
    if (dist_agree(t->world, rc < 0 ? -1 : 0, "finding the checkpoint to resume", err) != 0 ||
        dist_bcast(t->world, dir, sizeof dir, 0, "the checkpoint to resume", err) != 0)
        return -1;
    if (!dir[0]) return 0;
    size_t lo = t->opt.base;
    float *moments[2];
    rc = moments_view(t, lo, t->opt.n, false, moments, err);
    if (rc == 0) {
        rc = t->strat.vt->load_checkpoint(t, dir, moments, err);
        moments_release(t, lo, t->opt.n, moments, rc == 0);
    }
    if (rc == 0 && t->state.config_hash != t->config_hash) refuse_resume(t, dir, err), rc = -1;
    if (dist_agree(t->world, rc, "loading the checkpoint", err) != 0) return -1;
    t->opt.step = t->state.opt_step;
    fprintf(t->log, "resumed from %s at step %lld (sample %llu)\n", dir, (long long)t->state.step,
            (unsigned long long)t->state.samples_seen);
    return 1;
}

// Replicas must agree bit for bit; a difference means the reduction was not deterministic or
// memory was corrupted, and is caught before it is saved.
int trainer_check_replicas(trainer *t, ct_error *err) {
    if (t->d->size == 1) return 0;
    // debug.fault weights: one weight of this rank moves by an ulp before the save of step
    // debug.fault_step, as memory corruption would move it.
    qwen3_model *m = qwen3_trained(&t->model);
    if (trainer_fault_at(t, "weights", t->state.step)) {
        uint32_t bits;
        m->be->read(m->be, &bits, m->param_mem, sizeof bits);
        bits ^= 1;
        m->be->write(m->be, m->param_mem, &bits, sizeof bits);
    }
    uint64_t mine = qwen3_params_hash(m);
    uint64_t *all = malloc((size_t)t->d->size * sizeof *all);
    if (!all) return ct_fail(err, "out of memory");
    int rc = dist_allgather(t->d, &mine, all, sizeof mine, "the weights' checksums", err);
    for (int r = 1; rc == 0 && r < t->d->size; r++)
        if (all[r] != all[0])
            rc = ct_fail(err,
                         "at step %lld rank %d's weights differ from rank 0's (XXH64 %016llx vs "
                         "%016llx): refusing to save them",
                         (long long)t->state.step, r, (unsigned long long)all[r],
                         (unsigned long long)all[0]);
    free(all);
    return rc;
}

// Every rank writes its 1/N of the optimizer state into one temporary folder that rank 0
// created; rank 0 then writes the model and state.json (which lists every shard) and renames
// the folder into place. The shards are cut the same way in both modes, so the files do not
// depend on whether the state was replicated.
int trainer_save_checkpoint(trainer *t, ct_error *err) {
    if (t->model.lora) t->state.lora_forwards = t->model.lora->forwards;
    return t->strat.vt->save_checkpoint(t, err);
}

int trainer_save_replicated(trainer *t, ct_error *err) {
    const int P = t->d->size, r = t->d->rank;
    const int64_t step = t->state.step;
    int rc = trainer_check_replicas(t, err);
    if (rc == 0 && is_root(t)) rc = ckpt_begin(t->ckpt_root, step, t->save_tag, err);
    if (dist_agree(t->d, rc, "starting the checkpoint", err) != 0) return -1;

    size_t n = qwen3_trained(&t->model)->num_params;
    size_t lo = grad_sync_shard_start(n, r, P), hi = grad_sync_shard_start(n, r + 1, P);
    char tmp[4200];
    ckpt_shard_info mine = {0}, *all = calloc((size_t)P, sizeof *all);
    rc = all ? ckpt_tmp_path(tmp, sizeof tmp, t->ckpt_root, step, t->save_tag, err)
             : ct_fail(err, "out of memory");
    float *moments[2];
    if (rc == 0 && (rc = moments_view(t, lo, hi - lo, true, moments, err)) == 0) {
        rc = ckpt_write_optimizer_shard(tmp, r, P, lo, hi - lo, n, moments[0], moments[1], &mine,
                                        err);
        moments_release(t, lo, hi - lo, moments, false);
    }
    if (dist_agree(t->d, rc, "writing the optimizer shards", err) != 0 ||
        dist_allgather(t->d, &mine, all, sizeof mine, "the shards' checksums", err) != 0) {
        if (is_root(t)) ckpt_abandon(t->ckpt_root, step, t->save_tag);
        free(all);
        return -1;
    }
    rc = 0;
    if (is_root(t)) {
        char note[64];
        snprintf(note, sizeof note, "%d optimizer shard%s", P, P > 1 ? "s" : "");
        rc = trainer_commit_replicated(t, qwen3_trained(&t->model), all, P, note, err);
    }
    free(all);
    return dist_agree(t->d, rc, "committing the checkpoint", err);
}

int trainer_commit_replicated(trainer *t, const qwen3_model *m, const ckpt_shard_info *shards,
                              int P, const char *note, ct_error *err) {
    const int64_t step = t->state.step;
    int rc = ckpt_commit(t->ckpt_root, t->save_tag, m, shards, P, &t->state, t->config_toml, err);
    ckpt_notes notes = {0};
    if (rc == 0) rc = ckpt_prune(t->ckpt_root, t->cfg->checkpoint.keep_latest_k, step, &notes, err);
    trainer_log_notes(t, &notes);
    if (rc == 0)
        fprintf(t->log, "checkpoint: saved step %lld in %s/step-%lld (%s)\n", (long long)step,
                t->ckpt_root, (long long)step, note);
    return rc;
}

int trainer_commit_shards(trainer *t, const qwen3_model *layout, const ckpt_shard_info *pairs,
                          int S, const ckpt_range *const *ranges, const int *n_ranges,
                          const char *note, ct_error *err) {
    const int64_t step = t->state.step;
    ckpt_shard_info *optim = calloc(2 * (size_t)S, sizeof *optim), *model = optim + S;
    for (int s = 0; optim && s < S; s++) optim[s] = pairs[2 * s], model[s] = pairs[2 * s + 1];
    int rc = optim ? ckpt_commit_ranges(t->ckpt_root, t->save_tag, layout, optim, model, S, ranges,
                                        n_ranges, &t->state, t->config_toml, err)
                   : ct_fail(err, "out of memory");
    free(optim);
    ckpt_notes notes = {0};
    if (rc == 0) rc = ckpt_prune(t->ckpt_root, t->cfg->checkpoint.keep_latest_k, step, &notes, err);
    trainer_log_notes(t, &notes);
    if (rc == 0)
        fprintf(t->log,
                "checkpoint: saved step %lld in %s/step-%lld (%d model and optimizer shards%s)\n",
                (long long)step, t->ckpt_root, (long long)step, S, note);
    return rc;
}

int trainer_finish_shards(trainer *t, dist *over, dist *grp, int rc,
                          const ckpt_shard_info mine[2], int S, const qwen3_model *layout,
                          const ckpt_range *const *ranges, const int *n_ranges, const char *note,
                          ct_error *err) {
    ckpt_shard_info *all = grp ? calloc(2 * (size_t)grp->size, sizeof *all) : NULL;
    if (grp && !all && rc == 0) rc = ct_fail(err, "out of memory for the shards' checksums");
    if (dist_agree(over, rc, "writing the model and optimizer shards", err) != 0 ||
        (grp && dist_allgather(grp, mine, all, 2 * sizeof *mine, "the shards' checksums", err) !=
                    0)) {
        if (is_root(t)) ckpt_abandon(t->ckpt_root, t->state.step, t->save_tag);
        free(all);
        return -1;
    }
    rc = is_root(t) ? trainer_commit_shards(t, layout, all, S, ranges, n_ranges, note, err) : 0;
    free(all);
    return dist_agree(over, rc, "committing the checkpoint", err);
}

// A LoRA run's final export: the adapter as a PEFT folder (adapter_config.json and
// adapter_model.safetensors) in dump_folder/hf, which PeftModel.from_pretrained loads onto the
// base it names. Every rank holds the whole adapter, or under PP its stages' part of it: each
// places its tensors in the whole model's layout and the pp group sums them (each element is
// one stage's, the others add zeros: exact); the root writes it.
static int export_adapter(trainer *t, ct_error *err) {
    const lora_layout *L = &t->model.lora->L;
    lora_layout G;
    const bool pp = t->pp > 1;
    int rc = pp ? lora_layout_init(&G, &t->setup.model, &L->lc, err) : 0;
    const lora_layout *W = pp && rc == 0 ? &G : L;
    const size_t n = W->num;
    float *buf = rc == 0 ? calloc(n + 1, sizeof *buf) : NULL;
    if (rc == 0 && !buf)
        rc = ct_fail(err, "the final export: out of memory for %zu adapter floats", n);
    if (rc == 0) rc = qwen3_lora_read_whole(&t->model, W, buf, err);
    if (pp && dist_agree(t->world, rc, "the final export's adapter", err) != 0) rc = -1;
    else if (pp) rc = strategy_pp_sum_stages(t, buf, n, "the adapter over the stages", err);
    if (rc == 0 && is_root(t)) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/hf", t->cfg->job.dump_folder);
        peft_config pc = {.lc = L->lc};
        config_lora_base_name(pc.base_model, sizeof pc.base_model, t->cfg);
        rc = peft_adapter_save(dir, &pc, W, buf, err);
        if (rc == 0)
            fprintf(t->log,
                    "export: %s (a PEFT LoRA adapter: %s and %s, %zu parameters, base %s%s)\n", dir,
                    PEFT_CONFIG_NAME, PEFT_WEIGHTS_NAME, n, pc.base_model,
                    pp ? ", assembled from the pipeline stages" : "");
    }
    free(buf);
    if (pp && W == &G) lora_layout_free(&G);
    return dist_agree(t->world, rc, "the final export", err);
}

int trainer_shards_begin(trainer *t, trainer_shards *s, int P, ct_error *err) {
    memset(s, 0, sizeof *s);
    s->P = P;
    s->of = calloc((size_t)P, sizeof *s->of);
    s->n_of = calloc((size_t)P, sizeof *s->n_of);
    return s->of && s->n_of
               ? ckpt_tmp_path(s->tmp, sizeof s->tmp, t->ckpt_root, t->state.step, t->save_tag, err)
               : ct_fail(err, "out of memory");
}

int trainer_shards_end(trainer *t, trainer_shards *s, int rc, dist *agree, dist *grp,
                       const qwen3_model *g, const char *note, ct_error *err) {
    rc = trainer_finish_shards(t, agree, grp, rc, s->mine, s->P, g,
                               (const ckpt_range *const *)s->of, s->n_of, note, err);
    for (int q = 0; s->of && q < s->P; q++) free(s->of[q]);
    free(s->of);
    free(s->n_of);
    return rc;
}

int trainer_named_ranges(const qwen3_model *g, const qwen3_model *m, bool (*keep)(const char *),
                         ckpt_range **out, ct_error *err) {
    ckpt_range *x = malloc(((size_t)m->n_params + 1) * sizeof *x);
    if (!x) return ct_fail(err, "out of memory for the checkpoint's ranges");
    int k = 0;
    for (int i = 0; i < m->n_params; i++) {
        const qwen3_param *gp = qwen3_find_param(g, m->params[i].name);
        if (!gp) {
            free(x);
            return ct_fail(err, "tensor %s is not in the global layout", m->params[i].name);
        }
        if (keep && !keep(m->params[i].name)) continue;
        x[k++] = (ckpt_range){gp->offset, gp->offset + gp->numel};
    }
    *out = x;
    return k;
}

int trainer_write_named_shard(trainer *t, const qwen3_model *g, const char *tmp,
                              float *const src[3], bool (*keep)(const char *), int shard,
                              int n_shards, ckpt_shard_info info[2], ct_error *err) {
    const qwen3_model *m = &t->model;
    ckpt_range *x = NULL;
    const int n = trainer_named_ranges(g, m, keep, &x, err);
    if (n < 0) return -1;
    // All of them: the local buffers are exactly the ranges back to back; else the kept ones
    // packed.
    size_t total = 0;
    for (int i = 0; keep && i < n; i++) total += x[i].hi - x[i].lo;
    float *buf = keep ? malloc((3 * total + 1) * sizeof *buf) : NULL;
    int rc = !keep || buf ? 0 : ct_fail(err, "out of memory for the checkpoint shard");
    size_t pos = 0;
    for (int i = 0; keep && rc == 0 && i < m->n_params; i++) {
        const qwen3_param *p = &m->params[i];
        if (!keep(p->name)) continue;
        for (int k = 0; k < 3; k++)
            memcpy(buf + k * total + pos, src[k] + p->offset, p->numel * sizeof *buf);
        pos += p->numel;
    }
    if (rc == 0)
        rc = keep ? ckpt_write_shard(tmp, g, shard, n_shards, x, n, buf, buf + total,
                                     buf + 2 * total, &info[0], &info[1], err)
                  : ckpt_write_shard(tmp, g, shard, n_shards, x, n, src[0], src[1], src[2],
                                     &info[0], &info[1], err);
    free(buf);
    free(x);
    return rc;
}

int trainer_load_by_name(trainer *t, const char *dir, float *moments[2], ct_error *err) {
    if (moments && (t->opt.base != 0 || t->opt.n != t->model.num_params))
        return ct_fail(err, "the optimizer does not span the local model");
    return trainer_load_local_by_name(t, dir, moments, moments ? &t->state : NULL, err);
}

int trainer_load_local_by_name(trainer *t, const char *dir, float *moments[2], train_state *st,
                               ct_error *err) {
    qwen3_model *m = &t->model, g;
    if (qwen3_init_layout(&g, &t->setup.model, err) != 0) return -1;
    ckpt_range *x = NULL;
    int n = trainer_named_ranges(&g, m, NULL, &x, err);
    float *host = n >= 0 ? qwen3_params_view(m, false, err) : NULL;
    int rc = host ? ckpt_load_ranges(dir, &g, x, n, host, moments ? moments[0] : NULL,
                                     moments ? moments[1] : NULL, st, NULL, err)
                  : -1;
    if (host) qwen3_params_view_release(m, host, rc == 0);
    free(x);
    qwen3_free(&g);
    return rc;
}

int trainer_load_model_by_name(trainer *t, const char *dir, ct_error *err) {
    return trainer_load_by_name(t, dir, NULL, err);
}

// hf_save_folder_from's reads (within one tensor) on the group's rank 0.
static int export_read(float *dst, uint64_t lo, uint64_t n, void *ctx, ct_error *err) {
    strategy_export *x = ctx;
    const qwen3_param *gp = qwen3_param_at(x->g, lo);
    int i = (int)(gp - x->g->params);
    if (i != x->cur) {
        if (dist_bcast(x->grp, &i, sizeof i, 0, "the export's next tensor", err) != 0 ||
            x->fetch(x->ctx, i, err) != 0)
            return -1;
        x->cur = i;
    }
    memcpy(dst, *x->full + (lo - gp->offset), n * sizeof *dst);
    return 0;
}

int strategy_export_stream(strategy_export *x, const trainer *t, const char *dir, ct_dtype dtype,
                           const char *what, ct_error *err) {
    int rc = 0;
    x->cur = -1;
    if (x->grp->rank == 0) {
        rc = ckpt_export_hf_from(x->g, dir, dtype, 5000000000ull, t->cfg->model.tokenizer_path,
                                 export_read, x, err);
        int done = -1; // the peers stop (after a failure too)
        ct_error ignored;
        if (dist_bcast(x->grp, &done, sizeof done, 0, what, &ignored) != 0 && rc >= 0)
            rc = -1, *err = ignored;
        return rc;
    }
    for (int i; rc == 0;) {
        rc = dist_bcast(x->grp, &i, sizeof i, 0, "the export's next tensor", err);
        if (rc == 0 && i < 0) break;
        if (rc == 0) rc = x->fetch(x->ctx, i, err);
    }
    return rc;
}

int trainer_export_final(trainer *t, ct_error *err) {
    if (t->model.lora) return export_adapter(t, err);
    int rc = 0;
    const strategy_vt *vt = t->strat.vt;
    if (vt->export_hf) { // streamed, each tensor assembled from its ranks as written (TP, PP, EP)
        ct_dtype dtype;
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/hf", t->cfg->job.dump_folder);
        rc = ckpt_parse_dtype(&dtype, t->cfg->checkpoint.export_dtype, err);
        int copied = rc != 0 ? -1 : vt->export_hf(t, dir, dtype, err);
        if (copied < 0)
            rc = -1;
        else if (is_root(t))
            fprintf(t->log, "export: %s (%s, assembled from the %s%s)\n", dir,
                    t->cfg->checkpoint.export_dtype, vt->export_from,
                    copied ? ", with tokenizer files" : ", no tokenizer files");
        return dist_agree(t->world, rc, "the final export", err);
    }
    if (is_root(t)) {
        ct_dtype dtype;
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/hf", t->cfg->job.dump_folder);
        rc = ckpt_parse_dtype(&dtype, t->cfg->checkpoint.export_dtype, err);
        // 5 GB shards, as transformers' save_pretrained default. FSDP streams the checkpoint just
        // saved, tensor by tensor, since no rank holds the model.
        char saved[4200];
        snprintf(saved, sizeof saved, "%s/step-%lld", t->ckpt_root, (long long)t->state.step);
        int copied = rc ? -1
                     : t->strat.vt->model_in_shards
                         ? ckpt_export_hf_streaming(saved, dir, dtype, 5000000000ull,
                                                    t->cfg->model.tokenizer_path, err)
                         : ckpt_export_hf(&t->model, dir, dtype, 5000000000ull,
                                          t->cfg->model.tokenizer_path, err);
        if (copied < 0)
            rc = -1;
        else
            fprintf(t->log, "export: %s (%s%s)\n", dir, t->cfg->checkpoint.export_dtype,
                    copied ? ", with tokenizer files" : ", no tokenizer files");
    }
    return dist_agree(t->d, rc, "the final export", err);
}
