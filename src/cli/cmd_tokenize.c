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
#include <fcntl.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/fs.h"
#include "data/jsonl.h"
#include "io/atomic.h"
#include "io/json.h"
#include "text/chat.h"
#include "text/chat_mask.h"
#include "text/tokenizer.h"
#include "core/utf8.h"

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

// One per thread: the ids of the unit it just encoded, until they are written. Cache-line
// aligned, as each thread updates its counters for every word.
// A document of the unit: where its ids end, and for a conversation its mask and text.
typedef struct doc {
    size_t end;      // ids.n at its end
    bool chat;       // a conversation: mask[] holds its mask, render[] its text
    size_t text_end; // render_n at its end
    size_t at;       // its file offset (messages)
} doc;

typedef struct __attribute__((aligned(64))) worker {
    tok_encoder *enc;
    tok_ids ids;
    uint8_t *mask; // parallel to ids (conversations)
    size_t mask_cap;
    char *render; // the conversations' rendered texts, back to back
    size_t render_n, render_cap;
    jsonl_buf json; // a .jsonl text with escapes, decoded
    doc *docs;      // the documents of the unit
    size_t n_docs, docs_cap;
    int line_kind; // the jsonl_kind of the unit's first line, -1 before it
    size_t kind_at;
    char *fixed; // repaired text (invalid UTF-8)
    size_t fixed_cap;
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

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

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
    if (w->n_docs == w->docs_cap) {
        size_t cap = w->docs_cap ? 2 * w->docs_cap : 1024;
        doc *d = realloc(w->docs, cap * sizeof *d);
        if (!d) return fail_at(w, at, "out of memory");
        w->docs = d;
        w->docs_cap = cap;
    }
    w->docs[w->n_docs++] = (doc){w->ids.n, chat, w->render_n, at};
    return true;
}

static bool encode_doc(worker *w, const char *text, size_t len, size_t at, bool end);

// A conversation: rendered with the chat template (kept for --render), encoded, and its
// assistant tokens marked in mask.
static bool encode_chat(worker *w, const job *j, const cJSON *root, size_t at) {
    if (!j->chat) return fail_at(w, at, j->chat_missing);
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    char *text;
    size_t len, first = w->ids.n;
    ct_error err;
    if (chat_render(j->chat, cJSON_GetObjectItemCaseSensitive(root, "messages"),
                    cJSON_IsNull(tools) ? NULL : tools, false, -1, &text, &len, &err) != 0)
        return fail_at(w, at, err.msg);
    bool ok = true;
    if (w->render_cap - w->render_n < len) {
        size_t cap = w->render_cap ? w->render_cap : 1 << 16;
        while (cap - w->render_n < len) cap *= 2;
        char *grown = realloc(w->render, cap);
        if (grown) w->render = grown, w->render_cap = cap;
        ok = grown != NULL;
    }
    if (ok) {
        memcpy(w->render + w->render_n, text, len);
        w->render_n += len;
    }
    ok = ok ? encode_doc(w, text, len, at, false) : fail_at(w, at, "out of memory");
    free(text);
    if (!ok) return false;
    if (w->mask_cap < w->ids.cap) {
        uint8_t *grown = realloc(w->mask, w->ids.cap);
        if (!grown) return fail_at(w, at, "out of memory");
        w->mask = grown;
        w->mask_cap = w->ids.cap;
    }
    if (chat_assistant_mask(j->tok, w->ids.v + first, w->ids.n - first, w->mask + first, &err) < 0)
        return fail_at(w, at, err.msg);
    return end_doc(w, at, true);
}

// Encodes one document's text (at file offset `at`, for messages) and ends it if asked.
static bool encode_doc(worker *w, const char *text, size_t len, size_t at, bool end) {
    size_t bad = utf8_valid_prefix(text, len);
    if (bad < len) {
        size_t need = utf8_repair_bound(len), n_bad;
        if (need > w->fixed_cap) {
            free(w->fixed);
            w->fixed = malloc(need);
            w->fixed_cap = w->fixed ? need : 0;
            if (!w->fixed) return fail_at(w, at, "out of memory repairing UTF-8");
        }
        len = utf8_repair(w->fixed, text, len, &n_bad);
        text = w->fixed;
        w->n_replaced += n_bad;
        if (at + bad < w->first_bad) w->first_bad = at + bad;
    }
    if (tok_encode(w->enc, &w->ids, text, len, &w->err) != 0) {
        w->failed = true;
        w->err_at = at;
        return false;
    }
    if (end) return end_doc(w, at, false);
    return true;
}

static void encode_unit(worker *w, const unit *u, const job *j) {
    w->ids.n = 0;
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
        if (jsonl_doc_parse(&d, &w->json, line, n, &err) != 0) {
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

// The output: a .npy stream (header rewritten with the count at the end), a folder of them
// (shards of shard_tokens ids), or .jsonl lines.
typedef struct writer {
    atomic_file f;
    bool npy, in_doc, render;
    const char *dir; // shards: the folder; else NULL
    uint64_t shard_tokens;
    int shards;     // shards begun
    uint64_t count; // ids written, in the current file for .npy
    uint64_t total; // ids written, all files
    uint32_t buf[4096];
    size_t nbuf;
    json_buf esc; // a rendered text escaped for JSON
} writer;

#define NPY_HEADER 128 // fixed, so the final count can be written over the placeholder

static int npy_header(writer *w, ct_error *err) {
    char h[NPY_HEADER];
    memcpy(h, "\x93NUMPY\x01\x00", 8);
    h[8] = (char)(NPY_HEADER - 10);
    h[9] = 0;
    int n = snprintf(h + 10, NPY_HEADER - 10,
                     "{'descr': '<u4', 'fortran_order': False, 'shape': (%llu,), }",
                     (unsigned long long)w->count);
    memset(h + 10 + n, ' ', (size_t)(NPY_HEADER - 11 - n));
    h[NPY_HEADER - 1] = '\n';
    return atomic_write(&w->f, h, NPY_HEADER, err);
}

static int writer_flush(writer *w, ct_error *err) {
    int rc = w->nbuf ? atomic_write(&w->f, w->buf, w->nbuf * sizeof *w->buf, err) : 0;
    w->nbuf = 0;
    return rc;
}

static int writer_finish(writer *w, ct_error *err);

// The next shard of a folder output: DIR/tokens-00000.npy, ...
static int next_shard(writer *w, ct_error *err) {
    if (w->shards > 0 && writer_finish(w, err) != 0) return -1;
    char path[4200];
    snprintf(path, sizeof path, "%s/tokens-%05d.npy", w->dir, w->shards++);
    w->count = 0;
    if (atomic_open(&w->f, path, err) != 0) return -1;
    return npy_header(w, err);
}

static int writer_ids(writer *w, const int32_t *ids, size_t n, ct_error *err) {
    char num[16];
    for (size_t i = 0; i < n; i++) {
        if (!w->npy) {
            int k = snprintf(num, sizeof num, "%s%d", w->in_doc ? "," : "{\"ids\":[", ids[i]);
            w->in_doc = true;
            if (atomic_write(&w->f, num, (size_t)k, err) != 0) return -1;
            continue;
        }
        // A shard may end inside a document: the stream goes on in the next.
        if (w->dir && w->count == w->shard_tokens && next_shard(w, err) != 0) return -1;
        if (w->nbuf == 4096 && writer_flush(w, err) != 0) return -1;
        w->buf[w->nbuf++] = (uint32_t)ids[i]; // little-endian hosts: stored as is
        w->count++;
    }
    if (!w->npy) w->count += n;
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

static int writer_finish(writer *w, ct_error *err) {
    if (w->npy) {
        if (writer_flush(w, err) != 0) return -1;
        if (fseek(w->f.fp, 0, SEEK_SET) != 0 || npy_header(w, err) != 0) {
            atomic_abort(&w->f);
            return ct_fail(err, "%s: cannot rewrite the .npy header", w->f.path);
        }
    }
    return atomic_commit(&w->f, err);
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
        if (j->kind == IN_TXT) return ct_fail(err, "%s: %s", j->path, wk->err.msg);
        return ct_fail(err, "%s:%llu: %s", j->path,
                       (unsigned long long)line_of(j->text, wk->err_at), wk->err.msg);
    }
    size_t prev = 0, text_prev = 0;
    for (size_t d = 0; d < wk->n_docs; d++) {
        const doc *dc = &wk->docs[d];
        if (dc->chat && w->npy)
            return ct_fail(err,
                           "%s:%llu: a conversation: its mask needs a .jsonl --output (the .npy "
                           "holds ids only)",
                           j->path, (unsigned long long)line_of(j->text, dc->at));
        if (writer_ids(w, wk->ids.v + prev, dc->end - prev, err) != 0) return -1;
        int rc = dc->chat ? writer_chat(w, wk->mask + prev, dc->end - prev, wk->render + text_prev,
                                        dc->text_end - text_prev, err)
                          : writer_end_doc(w, j->eos, err);
        if (rc != 0) return -1;
        for (size_t i = prev; dc->chat && i < dc->end; i++) st->trained += wk->mask[i];
        st->chats += dc->chat;
        prev = dc->end;
        text_prev = dc->text_end;
        st->docs++;
        st->in_doc = false;
    }
    if (prev < wk->ids.n || (j->kind == IN_TXT && !u->doc_end)) {
        if (writer_ids(w, wk->ids.v + prev, wk->ids.n - prev, err) != 0) return -1;
        st->in_doc = true;
    }
    double t = now();
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
    worker *ws = aligned_alloc(64, (size_t)threads * sizeof *ws);
    if (ws) memset(ws, 0, (size_t)threads * sizeof *ws);
    int rc = 0;
    if (!units || !ws) rc = ct_fail(err, "out of memory");
    for (int i = 0; i < threads && rc == 0; i++) {
        ws[i].first_bad = SIZE_MAX;
        rc = tok_encoder_new(&ws[i].enc, j->tok, err);
    }
    st->start = st->last_report = now();
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
        tok_encoder_free(ws[i].enc);
        tok_ids_free(&ws[i].ids);
        jsonl_buf_free(&ws[i].json);
        free(ws[i].docs);
        free(ws[i].mask);
        free(ws[i].render);
        free(ws[i].fixed);
    }
    st->tokens = w->total;
    free(units);
    free(ws);
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

// Maps the input read-only (an empty file has nothing to map).
static int map_input(const char **text, size_t *len, const char *path, ct_error *err) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return ct_fail(err, "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return ct_fail(err, "%s: not a regular file", path);
    }
    *len = (size_t)sb.st_size;
    *text = "";
    if (*len) {
        void *m = mmap(NULL, *len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            close(fd);
            return ct_fail(err, "%s: mmap failed: %s", path, strerror(errno));
        }
        *text = m;
    }
    close(fd);
    return 0;
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
    const char *text = "";
    size_t len = 0;
    if (map_input(&text, &len, in, &err) != 0) {
        tok_free(tok);
        return cli_report(&err);
    }
    // A folder without a chat template is an error only if the input holds a conversation.
    chat_template *chat = NULL;
    ct_error no_chat = {0};
    if (kind == IN_JSONL && chat_template_load(&chat, dir, &no_chat) != 0) chat = NULL;
    writer w = {.npy = npy,
                .render = cli_flag(&args, "render"),
                .dir = to_dir ? out : NULL,
                .shard_tokens = (uint64_t)shard_tokens};
    run_stats st = {0};
    int rc = to_dir ? next_shard(&w, &err) : atomic_open(&w.f, out, &err);
    if (rc == 0 && npy && !to_dir) rc = npy_header(&w, &err);
    // Timed: reading, encoding and writing every id. Not timed: loading the tokenizer, and the
    // final fsync and rename of the output (reported apart: it is the disk, not the tokenizer).
    double t0 = now();
    job j = {tok, chat, no_chat.msg, kind, in, text, len, eos};
    if (rc == 0) rc = tokenize_all(&st, &j, &w, (int)threads, &err);
    double secs = now() - t0;
    if (rc == 0 && st.docs == 0) rc = ct_fail(&err, "%s: no documents (the input is empty)", in);
    if (rc == 0) {
        rc = writer_finish(&w, &err);
    } else if (w.f.fp) {
        atomic_abort(&w.f);
    }
    double sync_secs = now() - t0 - secs;
    // Where the first repair was: a byte offset, or for .jsonl (the text is inside JSON) a line.
    uint64_t first_bad =
        kind == IN_JSONL && st.replaced ? line_of(text, st.first_bad) : (uint64_t)st.first_bad;
    if (len) munmap((void *)text, len);
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
