// ctitan tokenize: text (.txt, .jsonl) -> token ids (.npy stream for training, a folder of .npy
// shards, or .jsonl), with the Qwen tokenizer of a Hugging Face folder. Conversations (.jsonl
// "messages" lines) are rendered with the folder's chat template and written as .jsonl
// {"ids", "mask"} (mask 1: an assistant token, see text/chat_mask.h), with --render also the
// rendered "text". Multi-threaded; output order is input order.
//
// Text is bytes: NUL and the other controls are encoded like any other character (a .jsonl's
// \u0000 too). Invalid UTF-8 in the input is replaced by U+FFFD, one per maximal ill-formed
// subsequence (as Python's errors="replace"), and a warning says how many and where the first was.
#include <dirent.h>
#include <errno.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/clock.h"
#include "core/fs.h"
#include "core/grow.h"
#include "data/doc_encoder.h"
#include "data/jsonl.h"
#include "io/atomic.h"
#include "io/json.h"
#include "io/npy.h"
#include "text/chat.h"
#include "text/tokenizer.h"

static const cli_option tokenize_options[] = {
    {"tokenizer", NULL, "folder with tokenizer.json (and tokenizer_config.json)", false},
    {"input", NULL,
     "text to encode: .txt (the whole file is one document; with --lines one per line) or "
     ".jsonl (one document per line: its \"text\", or a conversation's \"messages\")",
     false},
    {"output", NULL,
     ".npy (uint32: all documents, <|endoftext|> after each), a folder (ends with /: .npy "
     "shards of --shard_tokens each, training reads them as used), or .jsonl ({\"ids\": [...]} "
     "per document, in input order; conversations add \"mask\")",
     false},
    {"shard_tokens", "100000000", "tokens per .npy shard when --output is a folder", false},
    {"render", "false", "conversations: add the rendered \"text\" to each .jsonl line", true},
    {"no-eos", "false", "do not put <|endoftext|> after each document in .npy output", true},
    {"lines", "false", ".txt input: each non-empty line is a document (without its \\n or \\r\\n)",
     true},
    {"threads", "0", "threads to encode with (0: all cores, or OMP_NUM_THREADS when set)", false},
};

#define BATCH_BYTES (64u << 20)  // input per list of units: bounds that list
#define UNIT_TARGET (256u << 10) // the input one thread takes at a time

typedef enum { IN_TXT, IN_LINES, IN_JSONL } input_kind;

// The input one thread encodes at a time: a piece of the document (IN_TXT, cut where the
// tokenizer allows, see tok_cut_points), or a run of whole lines, each a document.
typedef struct unit {
    const char *p;
    size_t len;
    bool doc_end; // IN_TXT: the piece ends the document
} unit;

// A document of the unit: where its ids end, and for a conversation its mask and text.
typedef struct doc {
    size_t end;      // ids.n at its end
    bool chat;       // a conversation: mask[] holds its mask, render[] its text
    size_t text_end; // render_n at its end
    size_t at;       // its file offset (messages)
} doc;

// One per thread (data/doc_encoder.h, the dataset's encoder): d.ids holds the ids of the unit it
// just encoded until they are written, d.mask their mask (conversations).
typedef struct __attribute__((aligned(64))) worker {
    doc_encoder d; // first: doc_encoders_new makes the array
    char *render;  // the conversations' rendered texts, back to back
    size_t render_n, render_cap;
    doc *docs; // the documents of the unit
    size_t n_docs, docs_cap;
    int line_kind; // the jsonl_kind of the unit's first line, -1 before it
    size_t kind_at;
    uint64_t n_replaced;
    size_t first_bad; // file offset of the first repair (for .jsonl, of its line); SIZE_MAX: none
    bool failed;
    size_t err_at; // file offset the error is about (its line is named)
    ct_error err;
} worker;

typedef struct job {
    const tokenizer *tok;
    const chat_template *chat; // NULL: the folder has none (chat_missing says why)
    const char *chat_missing;
    input_kind kind;
    const char *path, *text; // the mapped input
    size_t len;
    int32_t eos; // after each document in .npy output; -1: none
} job;

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

// 1-based line of a file offset (only for messages, so counting is fine).
static uint64_t line_of(const char *text, size_t off) {
    uint64_t line = 1;
    for (const char *p = text; (p = memchr(p, '\n', (size_t)(text + off - p))); p++) line++;
    return line;
}

static bool fail_at(worker *w, size_t at, const char *msg) {
    w->failed = true;
    w->err_at = at;
    ct_fail(&w->err, "%s", msg);
    return false;
}

static bool end_doc(worker *w, size_t at, bool chat) {
    if (grow_to((void **)&w->docs, &w->docs_cap, w->n_docs + 1, sizeof *w->docs) != 0)
        return fail_at(w, at, "out of memory");
    w->docs[w->n_docs++] = (doc){w->d.ids.n, chat, w->render_n, at};
    return true;
}

// Encodes one document's text (at file offset `at`, for messages) and ends it if asked.
static bool encode_doc(worker *w, const char *text, size_t len, size_t at, bool end) {
    size_t bad = SIZE_MAX;
    if (doc_encode_text(&w->d, text, len, &w->n_replaced, &bad, &w->err) != 0) {
        w->failed = true;
        w->err_at = at;
        return false;
    }
    if (bad != SIZE_MAX && at + bad < w->first_bad) w->first_bad = at + bad;
    if (end) return end_doc(w, at, false);
    return true;
}

// A conversation: encoded with its assistant mask (text/chat_encode.h), its rendered text kept
// for --render.
static bool encode_chat(worker *w, const job *j, const cJSON *root, size_t at) {
    if (!j->chat) return fail_at(w, at, j->chat_missing);
    uint64_t replaced = w->n_replaced;
    ct_error err;
    if (doc_encode_chat(&w->d, j->tok, j->chat, root, true, &w->n_replaced, &err) != 0)
        return fail_at(w, at, err.msg);
    // Repairs inside a JSON string are located by their line.
    if (w->n_replaced > replaced && at < w->first_bad) w->first_bad = at;
    const chat_scratch *c = &w->d.chat;
    if (grow_to((void **)&w->render, &w->render_cap, w->render_n + c->len, 1) != 0)
        return fail_at(w, at, "out of memory");
    memcpy(w->render + w->render_n, c->text, c->len);
    w->render_n += c->len;
    return end_doc(w, at, true);
}

static void encode_unit(worker *w, const unit *u, const job *j) {
    w->d.ids.n = 0;
    w->n_docs = 0;
    w->render_n = 0;
    w->line_kind = -1;
    w->failed = false;
    size_t base = (size_t)(u->p - j->text);
    if (j->kind == IN_TXT) {
        encode_doc(w, u->p, u->len, base, u->doc_end);
        return;
    }
    for (size_t pos = 0; pos < u->len;) {
        const char *line = u->p + pos, *nl = memchr(line, '\n', u->len - pos);
        size_t n = nl ? (size_t)(nl - line) : u->len - pos, at = base + pos;
        pos += n + 1;
        if (n && line[n - 1] == '\r') n--;
        if (n == 0) continue; // empty lines are not documents
        if (j->kind == IN_LINES) {
            if (!encode_doc(w, line, n, at, true)) return;
            continue;
        }
        jsonl_doc d;
        ct_error err;
        if (jsonl_doc_parse(&d, &w->d.json, line, n, &err) != 0) {
            fail_at(w, at, err.msg);
            return;
        }
        if (w->line_kind < 0) w->line_kind = (int)d.kind, w->kind_at = at;
        if ((int)d.kind != w->line_kind || d.kind == JSONL_IDS) {
            cJSON_Delete(d.root);
            snprintf(err.msg, sizeof err.msg,
                     d.kind == JSONL_IDS ? "a line of ids: the input is already tokenized"
                                         : "a \"%s\" line among \"%s\" lines: one kind per file",
                     jsonl_kind_names[d.kind], jsonl_kind_names[w->line_kind]);
            fail_at(w, at, err.msg);
            return;
        }
        // Repairs inside a JSON string are located by their line.
        size_t first_bad = w->first_bad;
        bool ok = d.kind == JSONL_CHAT ? encode_chat(w, j, d.root, at)
                                       : encode_doc(w, d.text, d.len, at, true);
        cJSON_Delete(d.root);
        if (w->first_bad < first_bad) w->first_bad = at;
        if (!ok) return;
    }
}

// The output: a .npy stream (io/npy.h's writer: the header gets the count at the end), a folder
// of them (shards of shard_tokens ids), or .jsonl lines.
typedef struct writer {
    npy_writer out; // .npy: the file, or the current shard
    atomic_file f;  // .jsonl
    bool npy, in_doc, render;
    const char *dir; // shards: the folder; else NULL
    uint64_t shard_tokens;
    int shards;     // shards begun
    uint64_t total; // ids written, all files
    json_buf esc;   // a rendered text escaped for JSON
} writer;

static int writer_finish(writer *w, ct_error *err) {
    return w->npy ? npy_writer_commit(&w->out, err) : atomic_commit(&w->f, err);
}

static void writer_abort(writer *w) {
    if (w->npy)
        npy_writer_abort(&w->out);
    else if (w->f.fp)
        atomic_abort(&w->f);
}

// The next shard of a folder output: DIR/tokens-00000.npy, ...
static int next_shard(writer *w, ct_error *err) {
    if (w->shards > 0 && writer_finish(w, err) != 0) return -1;
    char path[4200];
    snprintf(path, sizeof path, "%s/tokens-%05d.npy", w->dir, w->shards++);
    return npy_writer_open(&w->out, path, "<u4", err);
}

static int writer_ids(writer *w, const int32_t *ids, size_t n, ct_error *err) {
    if (!w->npy) {
        char num[16];
        for (size_t i = 0; i < n; i++) {
            int k = snprintf(num, sizeof num, "%s%d", w->in_doc ? "," : "{\"ids\":[", ids[i]);
            w->in_doc = true;
            if (atomic_write(&w->f, num, (size_t)k, err) != 0) return -1;
        }
        w->total += n;
        return 0;
    }
    int64_t v[1024];
    for (size_t i = 0; i < n;) {
        // A shard may end inside a document: the stream goes on in the next.
        if (w->dir && w->out.count == w->shard_tokens && next_shard(w, err) != 0) return -1;
        size_t k = n - i < 1024 ? n - i : 1024;
        if (w->dir && k > w->shard_tokens - w->out.count) k = w->shard_tokens - w->out.count;
        for (size_t t = 0; t < k; t++) v[t] = ids[i + t];
        if (npy_writer_put(&w->out, v, k, err) != 0) return -1;
        i += k;
    }
    w->total += n;
    return 0;
}

// A conversation's mask, and with --render its text, end its .jsonl line.
static int writer_chat(writer *w, const uint8_t *mask, size_t n, const char *text, size_t len,
                       ct_error *err) {
    static const char mask_key[] = "],\"mask\":[", text_key[] = "],\"text\":";
    if (atomic_write(&w->f, mask_key, strlen(mask_key), err) != 0) return -1;
    char num[4];
    for (size_t i = 0; i < n; i++) {
        int k = snprintf(num, sizeof num, "%s%d", i ? "," : "", mask[i] ? 1 : 0);
        if (atomic_write(&w->f, num, (size_t)k, err) != 0) return -1;
    }
    if (w->render) {
        w->esc.len = 0;
        if (json_quote(&w->esc, text, len, JSON_SHORT) != 0) return ct_fail(err, "out of memory");
        if (atomic_write(&w->f, text_key, strlen(text_key), err) != 0 ||
            atomic_write(&w->f, w->esc.p, w->esc.len, err) != 0)
            return -1;
        w->in_doc = false;
        return atomic_write(&w->f, "}\n", 2, err);
    }
    w->in_doc = false;
    return atomic_write(&w->f, "]}\n", 3, err);
}

static int writer_end_doc(writer *w, int32_t eos, ct_error *err) {
    if (w->npy) return eos >= 0 ? writer_ids(w, &eos, 1, err) : 0;
    const char *end = w->in_doc ? "]}\n" : "{\"ids\":[]}\n";
    w->in_doc = false;
    return atomic_write(&w->f, end, strlen(end), err);
}

// Cuts the next list of units from the input at *pos.
static size_t next_units(unit *units, size_t max_units, const job *j, size_t *pos) {
    size_t n = 0, start = *pos;
    while (*pos < j->len && n < max_units && *pos - start < BATCH_BYTES) {
        const char *p = j->text + *pos;
        size_t rest = j->len - *pos, take = rest, cut;
        if (j->kind == IN_TXT) {
            if (tok_cut_points(j->tok, &cut, 1, p, rest, UNIT_TARGET)) take = cut;
        } else if (rest > UNIT_TARGET) {
            const char *nl = memchr(p + UNIT_TARGET, '\n', rest - UNIT_TARGET);
            if (nl) take = (size_t)(nl - p) + 1; // whole lines
        }
        units[n++] = (unit){p, take, take == rest};
        *pos += take;
    }
    return n;
}

typedef struct run_stats {
    uint64_t docs, tokens, replaced, chats, trained;
    size_t first_bad;
    bool in_doc; // ids of a document have been written but not its end
    double start, last_report;
} run_stats;

// Writes what one worker encoded for unit u; units are written in input order.
static int write_unit(run_stats *st, const worker *wk, const unit *u, const job *j, writer *w,
                      ct_error *err) {
    if (wk->failed) {
        *err = wk->err;
        if (j->kind == IN_TXT) return ct_wrap(err, "%s", j->path);
        return ct_wrap(err, "%s:%llu", j->path, (unsigned long long)line_of(j->text, wk->err_at));
    }
    size_t prev = 0, text_prev = 0;
    for (size_t d = 0; d < wk->n_docs; d++) {
        const doc *dc = &wk->docs[d];
        if (dc->chat && w->npy)
            return ct_fail(err,
                           "%s:%llu: a conversation: its mask needs a .jsonl --output (the .npy "
                           "holds ids only)",
                           j->path, (unsigned long long)line_of(j->text, dc->at));
        if (writer_ids(w, wk->d.ids.v + prev, dc->end - prev, err) != 0) return -1;
        int rc = dc->chat ? writer_chat(w, wk->d.mask + prev, dc->end - prev,
                                        wk->render + text_prev, dc->text_end - text_prev, err)
                          : writer_end_doc(w, j->eos, err);
        if (rc != 0) return -1;
        for (size_t i = prev; dc->chat && i < dc->end; i++) st->trained += wk->d.mask[i];
        st->chats += dc->chat;
        prev = dc->end;
        text_prev = dc->text_end;
        st->docs++;
        st->in_doc = false;
    }
    if (prev < wk->d.ids.n || (j->kind == IN_TXT && !u->doc_end)) {
        if (writer_ids(w, wk->d.ids.v + prev, wk->d.ids.n - prev, err) != 0) return -1;
        st->in_doc = true;
    }
    double t = ct_now_s();
    size_t done = (size_t)(u->p + u->len - j->text);
    if (t - st->last_report > 2 && done < j->len) {
        fprintf(stderr, "tokenize: %.1f/%.1f MB (%.0f%%), %.1f MB/s, %llu documents\n", done / 1e6,
                j->len / 1e6, 100.0 * done / j->len, done / 1e6 / (t - st->start),
                (unsigned long long)st->docs);
        st->last_report = t;
    }
    return 0;
}

static int tokenize_all(run_stats *st, const job *j, writer *w, int threads, ct_error *err) {
    const size_t max_units = 1 << 16;
    unit *units = calloc(max_units, sizeof *units);
    int rc = 0;
    if (!units) rc = ct_fail(err, "out of memory");
    worker *ws = rc == 0 ? doc_encoders_new(threads, sizeof *ws, j->tok, err) : NULL;
    if (!ws) rc = -1;
    for (int i = 0; i < threads && rc == 0; i++) ws[i].first_bad = SIZE_MAX;
    st->start = st->last_report = ct_now_s();
    size_t pos = 0;
    while (rc == 0 && pos < j->len) {
        size_t n = next_units(units, max_units, j, &pos);
        // Each thread encodes a unit, then waits its turn to write it: the output streams in
        // input order while the other threads go on encoding.
#pragma omp parallel for schedule(dynamic, 1) ordered num_threads(threads)
        for (size_t i = 0; i < n; i++) {
            worker *wk = &ws[omp_get_thread_num()];
            encode_unit(wk, &units[i], j);
#pragma omp ordered
            if (rc == 0) rc = write_unit(st, wk, &units[i], j, w, err);
        }
    }
    if (rc == 0 && st->in_doc) rc = ct_fail(err, "internal: the last document was not closed");
    st->first_bad = SIZE_MAX;
    for (int i = 0; i < threads && ws; i++) {
        st->replaced += ws[i].n_replaced;
        if (ws[i].first_bad < st->first_bad) st->first_bad = ws[i].first_bad;
        free(ws[i].docs);
        free(ws[i].render);
    }
    st->tokens = w->total;
    free(units);
    doc_encoders_free(ws, threads, sizeof *ws);
    return rc;
}

// A shard folder must not hold .npy files already: training would read them too.
static int folder_has_npy(const char *dir, ct_error *err) {
    DIR *d = opendir(dir);
    if (!d) return ct_fail(err, "cannot open folder %s: %s", dir, strerror(errno));
    const char *found = NULL;
    for (struct dirent *e; !found && (e = readdir(d));)
        if (e->d_name[0] != '.' && ends_with(e->d_name, ".npy")) found = e->d_name;
    int rc = found ? ct_fail(err,
                             "--output %s already holds .npy files (%s): training would read "
                             "them with the new shards; empty it or choose another folder",
                             dir, found)
                   : 0;
    closedir(d);
    return rc;
}

int cmd_tokenize(int argc, char **argv) {
    const int n_opts = sizeof tokenize_options / sizeof tokenize_options[0];
    if (cli_wants_help(argc, argv)) {
        cli_print_help(
            "ctitan tokenize --tokenizer DIR --input FILE --output FILE|DIR/ [--no-eos] [--lines] "
            "[--shard_tokens N] [--render] [--threads N]",
            "Encodes text with the tokenizer.json of DIR, exactly as Hugging Face tokenizers "
            "does.\nInvalid UTF-8 is replaced by U+FFFD (as Python's errors=\"replace\") with a "
            "warning.\nEnds with documents, tokens, MB/s and tokens/s.",
            tokenize_options, n_opts);
        return 0;
    }
    ct_error err;
    cli_args args;
    if (cli_parse(&args, tokenize_options, n_opts, argc, argv, 0, &err) != 0)
        return cli_report(&err);
    const char *dir = cli_str(&args, "tokenizer"), *in = cli_str(&args, "input");
    const char *out = cli_str(&args, "output");
    int64_t threads;
    if (!dir || !in || !out) {
        ct_fail(&err, "tokenize needs --tokenizer, --input and --output (see --help)");
        return cli_report(&err);
    }
    if (cli_int(&threads, &args, "threads", &err) != 0) return cli_report(&err);
    if (threads < 0 || threads > 1024) {
        ct_fail(&err, "--threads %lld: expected 0 (all cores) to 1024", (long long)threads);
        return cli_report(&err);
    }
    if (threads == 0) threads = omp_get_max_threads(); // the cores, or OMP_NUM_THREADS
    input_kind kind = ends_with(in, ".jsonl")    ? IN_JSONL
                      : cli_flag(&args, "lines") ? IN_LINES
                                                 : IN_TXT;
    if (!ends_with(in, ".jsonl") && !ends_with(in, ".txt")) {
        ct_fail(&err, "--input %s: expected a .txt or .jsonl file", in);
        return cli_report(&err);
    }
    if (kind == IN_JSONL && cli_flag(&args, "lines")) {
        ct_fail(&err, "--lines is for .txt input; .jsonl is always one document per line");
        return cli_report(&err);
    }
    int64_t shard_tokens;
    if (cli_int(&shard_tokens, &args, "shard_tokens", &err) != 0) return cli_report(&err);
    bool to_dir = ends_with(out, "/"), npy = to_dir || ends_with(out, ".npy");
    if (!npy && !ends_with(out, ".jsonl")) {
        ct_fail(&err, "--output %s: expected a .npy or .jsonl file, or a folder (ending in /)",
                out);
        return cli_report(&err);
    }
    if (shard_tokens < 1) {
        ct_fail(&err, "--shard_tokens %lld: expected at least 1", (long long)shard_tokens);
        return cli_report(&err);
    }
    if (to_dir && (fs_mkdirs(out, &err) != 0 || folder_has_npy(out, &err) != 0))
        return cli_report(&err);

    tokenizer *tok;
    if (tok_load(&tok, dir, &err) != 0) return cli_report(&err);
    int32_t eos = -1;
    if (npy && !cli_flag(&args, "no-eos") && (eos = tok_eos_id(tok)) < 0) {
        tok_free(tok);
        ct_fail(&err,
                "%s: the tokenizer has no <|endoftext|> or eos_token to end documents "
                "with (use --no-eos)",
                dir);
        return cli_report(&err);
    }
    void *map;
    size_t len;
    if (fs_map_readonly(&map, &len, in, &err) != 0) {
        tok_free(tok);
        return cli_report(&err);
    }
    const char *text = map ? map : ""; // an empty file has nothing to map
    // A folder without a chat template is an error only if the input holds a conversation.
    chat_template *chat = NULL;
    ct_error no_chat = {0};
    if (kind == IN_JSONL && chat_template_load(&chat, dir, &no_chat) != 0) chat = NULL;
    writer w = {.npy = npy,
                .render = cli_flag(&args, "render"),
                .dir = to_dir ? out : NULL,
                .shard_tokens = (uint64_t)shard_tokens};
    run_stats st = {0};
    int rc = to_dir ? next_shard(&w, &err)
             : npy  ? npy_writer_open(&w.out, out, "<u4", &err)
                    : atomic_open(&w.f, out, &err);
    // Timed: reading, encoding and writing every id. Not timed: loading the tokenizer, and the
    // final fsync and rename of the output (reported apart: it is the disk, not the tokenizer).
    double t0 = ct_now_s();
    job j = {tok, chat, no_chat.msg, kind, in, text, len, eos};
    if (rc == 0) rc = tokenize_all(&st, &j, &w, (int)threads, &err);
    double secs = ct_now_s() - t0;
    if (rc == 0 && st.docs == 0) rc = ct_fail(&err, "%s: no documents (the input is empty)", in);
    if (rc == 0) {
        rc = writer_finish(&w, &err);
    } else {
        writer_abort(&w);
    }
    double sync_secs = ct_now_s() - t0 - secs;
    // Where the first repair was: a byte offset, or for .jsonl (the text is inside JSON) a line.
    uint64_t first_bad =
        kind == IN_JSONL && st.replaced ? line_of(text, st.first_bad) : (uint64_t)st.first_bad;
    fs_unmap(map, len);
    tok_free(tok);
    chat_template_free(chat);
    free(w.esc.p);
    if (rc != 0) return cli_report(&err);
    if (st.replaced)
        fprintf(stderr,
                "warning: %s: %llu invalid UTF-8 sequence(s) replaced by U+FFFD (the first at "
                "%s %llu)\n",
                in, (unsigned long long)st.replaced, kind == IN_JSONL ? "line" : "byte offset",
                (unsigned long long)first_bad);
    printf("tokenize: %llu documents, %llu tokens, %.2f MB in %.3f s: %.2f MB/s, %.0f tokens/s "
           "(%d threads) -> %s (synced in %.3f s)\n",
           (unsigned long long)st.docs, (unsigned long long)st.tokens, len / 1e6, secs,
           secs > 0 ? len / 1e6 / secs : 0.0, secs > 0 ? st.tokens / secs : 0.0, (int)threads, out,
           sync_secs);
    if (to_dir)
        printf("tokenize: %d shard(s) of at most %lld tokens\n", w.shards, (long long)shard_tokens);
    if (st.chats)
        printf("tokenize: %llu conversations, %llu of their tokens in assistant turns (mask 1)\n",
               (unsigned long long)st.chats, (unsigned long long)st.trained);
    return 0;
}
