// Reading a dataset into one token stream (see dataset.h).
//
// The work is a list of units in stream order: a .npy file, a piece of a .txt document, or a
// .jsonl line. Units are encoded in batches (bounding the temporary ids to about BATCH_BYTES of
// text) by OpenMP threads, each appending to its own id buffer; then the batch is copied into
// the stream in unit order, so the result is the same for any thread count and schedule.
#include "data/dataset.h"

#include <dirent.h>
#include <errno.h>
#include <omp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/fs.h"
#include "core/grow.h"
#include "data/doc_encoder.h"
#include "data/jsonl.h"
#include "io/npy.h"
#include "text/strmap.h"
#include "core/utf8.h"

#define BATCH_BYTES (64u << 20)  // text per encode batch
#define PIECE_BYTES (256u << 10) // a long .txt document is cut into pieces of about this size
#define SCAN_TOKENS (1u << 20)   // .npy ids checked per read at open

typedef enum { SRC_TXT, SRC_JSONL, SRC_NPY } src_kind;

typedef struct src_file {
    char *path;
    src_kind kind;
    const char *text; // the mapped file, or `repaired` (SRC_TXT, SRC_JSONL)
    size_t len;
    void *map;
    size_t map_len;
    char *repaired;      // a .txt with invalid UTF-8, repaired as a whole before it is cut
    uint64_t n_replaced; // in `repaired`
    uint64_t first_bad;  // byte offset of the first replacement in the file
    npy_tokens npy;      // SRC_NPY
    bool npy_open;
    uint64_t hash; // SRC_TXT, when duplicates are looked for: text_hash of the whole text
    int line_kind; // SRC_JSONL: the kind (jsonl_kind) of its first line, -1 before it
    uint64_t kind_line;
} src_file;

// A text that could be in the dataset twice: a document (a .jsonl text, a whole .txt) or a line
// of a .txt (the documents of a .txt written one per line). Two files share a document when a
// hash of a document in one is that of a document or line in the other; lines that two files
// share (headings, boilerplate) are not documents.
typedef struct doc_key {
    uint64_t hash; // text_hash
    uint32_t file;
    uint32_t is_line;
} doc_key;

typedef struct unit {
    uint32_t file;
    bool doc_end;  // the last unit of a text document: <|endoftext|> follows
    bool flagged;  // a conversation: its ids' flags are in the worker's flags
    uint8_t kind;  // SRC_JSONL: the line's jsonl_kind
    const char *p; // the text (a .txt piece, or a .jsonl line before parsing)
    size_t len;
    uint64_t where;      // .jsonl: 1-based line; .txt: byte offset of the piece
    uint64_t n_replaced; // invalid UTF-8 sequences repaired in this .jsonl line
    int thread;          // whose ids buffer holds the result
    size_t ids_off, n_ids;
} unit;

// One per thread, on its own cache lines (data/doc_encoder.h). d.ids holds the units this
// thread encoded in the current batch, back to back, and d.mask their flags (where a unit is
// flagged).
typedef struct __attribute__((aligned(64))) worker {
    doc_encoder d; // first: doc_encoders_new makes the array
    doc_key *keys; // the hashes of the documents and lines this thread met (find_dups)
    size_t n_keys, cap_keys;
    size_t err_unit; // the first unit (in stream order) that failed, SIZE_MAX if none
    ct_error err;
} worker;

typedef struct reader {
    token_stream *s;
    const stream_options *o;
    const tokenizer *tok;
    int32_t vocab_size, eos;
    int32_t *scratch; // SCAN_TOKENS ids: the .npy files' check
    bool track_flags; // the dataset has a .jsonl: keep flags while reading, in case
    bool any_flagged; // a conversation was met: the flags are kept
    bool at_doc_start;
    src_file *files;
    size_t n_files;
    unit *units;
    size_t n_units, cap_units;
    size_t cap_tokens;
    bool find_dups; // two or more text files: look for documents in two of them
} reader;

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static int kind_of(src_kind *kind, const char *name) {
    if (ends_with(name, ".txt"))
        *kind = SRC_TXT;
    else if (ends_with(name, ".jsonl"))
        *kind = SRC_JSONL;
    else if (ends_with(name, ".npy"))
        *kind = SRC_NPY;
    else
        return -1;
    return 0;
}

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int add_file(reader *r, const char *path, src_kind kind, ct_error *err) {
    src_file *f = realloc(r->files, (r->n_files + 1) * sizeof *f);
    if (!f) return ct_fail(err, "%s: out of memory", path);
    r->files = f;
    f += r->n_files;
    memset(f, 0, sizeof *f);
    f->kind = kind;
    f->line_kind = -1;
    if (!(f->path = strdup(path))) return ct_fail(err, "%s: out of memory", path);
    r->n_files++;
    return 0;
}

// The dataset's files: path itself, or its .txt/.jsonl/.npy entries in sorted name order.
static int list_files(reader *r, const char *path, ct_error *err) {
    struct stat sb;
    if (stat(path, &sb) != 0) return ct_fail(err, "cannot open %s: %s", path, strerror(errno));
    src_kind kind;
    if (!S_ISDIR(sb.st_mode)) {
        if (kind_of(&kind, path) != 0)
            return ct_fail(err, "%s: expected a .txt, .jsonl or .npy file, or a folder of them",
                           path);
        return add_file(r, path, kind, err);
    }
    DIR *d = opendir(path);
    if (!d) return ct_fail(err, "cannot open folder %s: %s", path, strerror(errno));
    char **names = NULL;
    size_t n = 0;
    int rc = 0;
    for (struct dirent *e; rc == 0 && (e = readdir(d));) {
        if (e->d_name[0] == '.' || kind_of(&kind, e->d_name) != 0) continue;
        char **grown = realloc(names, (n + 1) * sizeof *names);
        if (!grown || !(grown[n] = strdup(e->d_name))) rc = ct_fail(err, "%s: out of memory", path);
        if (grown) names = grown;
        if (rc == 0) n++;
    }
    closedir(d);
    if (names) qsort(names, n, sizeof *names, cmp_names);
    size_t plen = strlen(path);
    bool slash = plen && path[plen - 1] == '/';
    for (size_t i = 0; i < n && rc == 0; i++) {
        char *full = malloc(plen + strlen(names[i]) + 2);
        if (!full) {
            rc = ct_fail(err, "%s: out of memory", path);
            break;
        }
        sprintf(full, "%s%s%s", path, slash ? "" : "/", names[i]);
        // Sub-folders named like data files (and other non-files) are skipped, not read.
        if (stat(full, &sb) == 0 && S_ISREG(sb.st_mode)) {
            kind_of(&kind, names[i]);
            rc = add_file(r, full, kind, err);
        }
        free(full);
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    if (rc == 0 && r->n_files == 0)
        rc = ct_fail(err, "%s: the folder has no .txt, .jsonl or .npy files", path);
    return rc;
}

// Maps a text file read-only; a 0-byte file is an error.
static int map_text(src_file *f, ct_error *err) {
    if (fs_map_readonly(&f->map, &f->map_len, f->path, err) != 0) return -1;
    if (f->map_len == 0) return ct_fail(err, "%s: the file is empty", f->path);
    f->text = f->map;
    f->len = f->map_len;
    return 0;
}

static int add_unit(reader *r, unit u, ct_error *err) {
    if (grow_to((void **)&r->units, &r->cap_units, r->n_units + 1, sizeof *r->units) != 0)
        return ct_fail(err, "out of memory listing the documents of the dataset");
    r->units[r->n_units++] = u;
    return 0;
}

// Opens file fi and appends its units.
static int plan_file(reader *r, uint32_t fi, ct_error *err) {
    src_file *f = &r->files[fi];
    if (f->kind == SRC_NPY) {
        struct stat sb;
        if (stat(f->path, &sb) == 0 && sb.st_size == 0)
            return ct_fail(err, "%s: the file is empty", f->path);
        if (npy_open(&f->npy, f->path, err) != 0) return -1;
        f->npy_open = true;
        if (f->npy.count == 0) return ct_fail(err, "%s: the file is empty (0 tokens)", f->path);
        return add_unit(r, (unit){.file = fi}, err);
    }
    if (!r->tok)
        return ct_fail(err,
                       "%s: a text file needs a tokenizer (only .npy token files can be "
                       "read without one)",
                       f->path);
    if (map_text(f, err) != 0) return -1;
    if (f->kind == SRC_TXT) {
        size_t bad = utf8_valid_prefix(f->text, f->len);
        if (bad < f->len) {
            size_t n_bad;
            if (!(f->repaired = malloc(utf8_repair_bound(f->len))))
                return ct_fail(err, "%s: out of memory repairing invalid UTF-8", f->path);
            f->len = utf8_repair(f->repaired, f->text, f->len, &n_bad);
            f->text = f->repaired;
            f->n_replaced = n_bad;
            f->first_bad = bad;
        }
        if (r->find_dups) f->hash = text_hash(f->text, f->len);
        size_t max_cuts = f->len / PIECE_BYTES + 1;
        size_t *cuts = malloc(max_cuts * sizeof *cuts);
        if (!cuts) return ct_fail(err, "%s: out of memory", f->path);
        size_t k = tok_cut_points(r->tok, cuts, max_cuts, f->text, f->len, PIECE_BYTES);
        int rc = 0;
        for (size_t i = 0, from = 0; i <= k && rc == 0; i++) {
            size_t to = i < k ? cuts[i] : f->len;
            unit u = {.file = fi,
                      .doc_end = i == k,
                      .p = f->text + from,
                      .len = to - from,
                      .where = from};
            rc = add_unit(r, u, err);
            from = to;
        }
        free(cuts);
        return rc;
    }
    size_t before = r->n_units;
    uint64_t line = 1;
    for (size_t pos = 0; pos < f->len; line++) {
        const char *p = f->text + pos, *nl = memchr(p, '\n', f->len - pos);
        size_t take = nl ? (size_t)(nl - p) + 1 : f->len - pos, n = nl ? take - 1 : take;
        if (n && p[n - 1] == '\r') n--;
        pos += take;
        if (n == 0) continue; // blank lines are not documents
        if (add_unit(r, (unit){.file = fi, .doc_end = true, .p = p, .len = n, .where = line},
                     err) != 0)
            return -1;
    }
    if (r->n_units == before)
        return ct_fail(err, "%s: no documents (every line is blank)", f->path);
    return 0;
}

static void fail_unit(worker *w, size_t ui, const unit *u, const src_file *f, const char *msg) {
    if (ui >= w->err_unit) return;
    w->err_unit = ui;
    if (f->kind == SRC_JSONL)
        ct_fail(&w->err, "%s:%llu: %s", f->path, (unsigned long long)u->where, msg);
    else
        ct_fail(&w->err, "%s: in the text from byte %llu: %s", f->path,
                (unsigned long long)u->where, msg);
}

static bool add_key(worker *w, const char *text, size_t len, uint32_t file, bool is_line) {
    if (grow_to((void **)&w->keys, &w->cap_keys, w->n_keys + 1, sizeof *w->keys) != 0) return false;
    w->keys[w->n_keys++] = (doc_key){text_hash(text, len), file, is_line};
    return true;
}

// The keys of a text: a .jsonl document, or the lines of a piece of a .txt (pieces end at line
// ends). Empty texts are not documents anyone would mind seeing twice.
static bool add_keys(worker *w, const unit *u, const src_file *f, const char *text, size_t len) {
    if (f->kind == SRC_JSONL) return len == 0 || add_key(w, text, len, u->file, false);
    for (size_t pos = 0; pos < len;) {
        const char *line = text + pos, *nl = memchr(line, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - line) : len - pos;
        pos += n + 1;
        if (n && line[n - 1] == '\r') n--;
        if (n && !add_key(w, line, n, u->file, true)) return false;
    }
    return true;
}

// The flags of the unit's ids: mask[i] (1 = trained, or all under train_on_all) as
// STREAM_TRAIN, and the first token starts a document.
static void set_flags(worker *w, const unit *u, bool train_all) {
    uint8_t *f = w->d.mask + u->ids_off;
    for (size_t i = 0; i < u->n_ids; i++) f[i] = train_all || f[i] ? STREAM_TRAIN : 0;
    if (u->n_ids) f[0] |= STREAM_DOC_START;
}

// A conversation: rendered with the chat template, tokenized, and its assistant tokens marked
// (data/doc_encoder.h); under train_on_all every token is trained, so there is no mask to find.
static int encode_chat(worker *w, unit *u, const reader *r, const cJSON *root, ct_error *err) {
    if (!r->o->chat)
        return ct_fail(err, "a conversation (\"messages\"), but there is no chat template: %s",
                       r->o->chat_from ? r->o->chat_from : "none was given");
    if (doc_encode_chat(&w->d, r->tok, r->o->chat, root, !r->o->train_on_all, &u->n_replaced,
                        err) != 0)
        return -1;
    u->n_ids = w->d.ids.n - u->ids_off;
    if (doc_encoder_reserve(&w->d, 0) != 0)
        return ct_fail(err, "out of memory for a conversation's flags");
    return 0;
}

// A pre-tokenized line: with a mask a conversation, without a text document.
static int encode_ids(worker *w, unit *u, const reader *r, const cJSON *root, ct_error *err) {
    size_t n;
    bool has_mask;
    if (jsonl_ids_check(root, r->vocab_size, &n, &has_mask, err) != 0) return -1;
    if (doc_encoder_reserve(&w->d, n) != 0) return ct_fail(err, "out of memory for %zu ids", n);
    jsonl_ids_copy(root, w->d.ids.v + w->d.ids.n, w->d.mask + w->d.ids.n);
    w->d.ids.n += n;
    u->n_ids = n;
    u->flagged = has_mask;
    u->doc_end = !has_mask;
    return 0;
}

static void encode_unit(worker *w, unit *u, size_t ui, const reader *r) {
    const src_file *f = &r->files[u->file];
    const char *text = u->p;
    size_t len = u->len;
    ct_error err;
    u->ids_off = w->d.ids.n;
    u->n_ids = 0;
    if (f->kind == SRC_JSONL) {
        jsonl_doc d;
        if (jsonl_doc_parse(&d, &w->d.json, u->p, u->len, &err) != 0) {
            fail_unit(w, ui, u, f, err.msg);
            return;
        }
        u->kind = (uint8_t)d.kind;
        if (d.kind != JSONL_TEXT) {
            u->flagged = d.kind == JSONL_CHAT;
            u->doc_end = false;
            int rc = d.kind == JSONL_CHAT ? encode_chat(w, u, r, d.root, &err)
                                          : encode_ids(w, u, r, d.root, &err);
            cJSON_Delete(d.root);
            if (rc != 0) fail_unit(w, ui, u, f, err.msg);
            if (rc == 0 && u->flagged) set_flags(w, u, r->o->train_on_all);
            return;
        }
        text = d.text;
        len = d.len;
        if (utf8_repair_text(&w->d.fixed, &text, &len, &u->n_replaced, NULL) != 0) {
            fail_unit(w, ui, u, f, "out of memory repairing invalid UTF-8");
            return;
        }
    }
    if (r->find_dups && !add_keys(w, u, f, text, len)) {
        fail_unit(w, ui, u, f, "out of memory hashing documents");
        return;
    }
    if (tok_encode(w->d.enc, &w->d.ids, text, len, &err) != 0) fail_unit(w, ui, u, f, err.msg);
    u->n_ids = w->d.ids.n - u->ids_off;
}

static int reserve_tokens(reader *r, size_t more, ct_error *err) {
    token_stream *s = r->s;
    if (more <= r->cap_tokens - s->n_mem) return 0;
    if (more > SIZE_MAX / sizeof(int32_t) / 2 - s->n_mem)
        return ct_fail(err, "dataset %s: too many tokens", s->path);
    size_t cap = r->cap_tokens;
    if (grow_to((void **)&s->tokens, &cap, s->n_mem + more, sizeof *s->tokens) != 0)
        return ct_fail(err, "dataset %s: out of memory for %zu tokens", s->path, s->n_mem + more);
    if (r->track_flags) {
        uint8_t *flags = realloc(s->flags, cap);
        if (!flags) return ct_fail(err, "dataset %s: out of memory for %zu tokens", s->path, cap);
        s->flags = flags;
    }
    r->cap_tokens = cap;
    return 0;
}

// Starts a part of the stream at its end (in memory, or the .npy file npy).
static int add_part(token_stream *s, int npy, ct_error *err) {
    stream_part *grown = realloc(s->parts, (s->n_parts + 1) * sizeof *grown);
    if (!grown) return ct_fail(err, "dataset %s: out of memory", s->path);
    s->parts = grown;
    s->parts[s->n_parts++] = (stream_part){.first = s->n_tokens, .mem_first = s->n_mem, .npy = npy};
    return 0;
}

// Appends n ids (and, when the unit is flagged, their flags) to the stream in memory.
static int append_ids(reader *r, const int32_t *ids, const uint8_t *flags, size_t n,
                      ct_error *err) {
    token_stream *s = r->s;
    if (n == 0) return 0; // an empty document's ids may be NULL
    if (reserve_tokens(r, n, err) != 0) return -1;
    if (s->n_parts == 0 || s->parts[s->n_parts - 1].npy >= 0)
        if (add_part(s, -1, err) != 0) return -1;
    memcpy(s->tokens + s->n_mem, ids, n * sizeof *ids);
    if (r->track_flags) {
        if (flags)
            memcpy(s->flags + s->n_mem, flags, n);
        else
            memset(s->flags + s->n_mem, STREAM_TRAIN, n);
        if (r->at_doc_start) s->flags[s->n_mem] |= STREAM_DOC_START;
    }
    r->at_doc_start = false;
    s->n_mem += n;
    s->n_tokens += n;
    s->parts[s->n_parts - 1].n += n;
    return 0;
}

// A .npy file joins the stream as a part of its own, read when used; its ids are checked here,
// SCAN_TOKENS at a time.
static int append_npy(reader *r, src_file *f, ct_error *err) {
    token_stream *s = r->s;
    npy_tokens *grown = realloc(s->npy, (s->n_npy + 1) * sizeof *grown);
    if (!grown) return ct_fail(err, "%s: out of memory", f->path);
    s->npy = grown;
    if (!r->scratch && !(r->scratch = malloc(SCAN_TOKENS * sizeof *r->scratch)))
        return ct_fail(err, "%s: out of memory", f->path);
    for (uint64_t at = 0; at < f->npy.count; at += SCAN_TOKENS) {
        uint64_t n = f->npy.count - at < SCAN_TOKENS ? f->npy.count - at : SCAN_TOKENS;
        if (npy_read(r->scratch, &f->npy, at, (size_t)n, r->vocab_size, err) != 0) return -1;
    }
    if (add_part(s, (int)s->n_npy, err) != 0) return -1;
    s->npy[s->n_npy++] = f->npy; // the stream owns the file now
    f->npy_open = false;
    s->parts[s->n_parts - 1].n = f->npy.count;
    s->n_tokens += f->npy.count;
    r->at_doc_start = true; // the text after it starts a document
    return 0;
}

// A .jsonl holds one kind of line: the first line of another kind is an error.
static int check_kind(src_file *f, const unit *u, ct_error *err) {
    if (f->line_kind < 0) {
        f->line_kind = u->kind;
        f->kind_line = u->where;
    } else if (f->line_kind != u->kind) {
        return ct_fail(err,
                       "%s:%llu: a \"%s\" line in a file of \"%s\" lines (line %llu): one kind "
                       "per file",
                       f->path, (unsigned long long)u->where, jsonl_kind_names[u->kind],
                       jsonl_kind_names[f->line_kind], (unsigned long long)f->kind_line);
    }
    return 0;
}

// Copies unit ui's ids (and <|endoftext|> after a document) into the stream.
static int append_unit(reader *r, const worker *ws, size_t ui, ct_error *err) {
    token_stream *s = r->s;
    const unit *u = &r->units[ui];
    src_file *f = &r->files[u->file];
    if (f->kind == SRC_NPY) return append_npy(r, f, err);
    if (f->kind == SRC_JSONL && check_kind(f, u, err) != 0) return -1;
    const int32_t *ids = ws[u->thread].d.ids.v + u->ids_off;
    for (size_t i = 0; i < u->n_ids; i++) {
        if (r->vocab_size > 0 && ids[i] >= r->vocab_size) {
            const char *str = tok_token_str(r->tok, ids[i]);
            return ct_fail(err, "%s%s%llu: token id %d (%s) is outside the model's vocab_size %d",
                           f->path, f->kind == SRC_JSONL ? ":" : ": in the text from byte ",
                           (unsigned long long)u->where, ids[i], str ? str : "?", r->vocab_size);
        }
    }
    if (u->flagged) {
        const uint8_t *flags = ws[u->thread].d.mask + u->ids_off;
        r->any_flagged = true;
        r->at_doc_start = true;
        s->n_chats++;
        for (size_t i = 0; i < u->n_ids; i++) s->n_trained += flags[i] & STREAM_TRAIN;
        if (append_ids(r, ids, flags, u->n_ids, err) != 0) return -1;
        r->at_doc_start = true;
        return 0;
    }
    if (append_ids(r, ids, NULL, u->n_ids, err) != 0) return -1;
    if (u->doc_end) {
        if (append_ids(r, &r->eos, NULL, 1, err) != 0) return -1;
        s->n_docs++;
        r->at_doc_start = true;
    }
    return 0;
}

// Appends a warning for the caller to log ("; " between two).
static void add_warning(token_stream *s, const char *fmt, ...) {
    size_t n = strlen(s->warning);
    if (n && n + 2 < sizeof s->warning) {
        memcpy(s->warning + n, "; ", 3);
        n += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->warning + n, sizeof s->warning - n, fmt, ap);
    va_end(ap);
}

static int cmp_keys(const void *a, const void *b) {
    const doc_key *x = a, *y = b;
    if (x->hash != y->hash) return x->hash < y->hash ? -1 : 1;
    if (x->file != y->file) return x->file < y->file ? -1 : 1;
    return (int)x->is_line - (int)y->is_line;
}

typedef struct file_pair {
    uint32_t a, b; // a < b
    uint64_t hash;
} file_pair;

static int cmp_pairs(const void *p, const void *q) {
    const file_pair *x = p, *y = q;
    if (x->a != y->a) return x->a < y->a ? -1 : 1;
    if (x->b != y->b) return x->b < y->b ? -1 : 1;
    return x->hash < y->hash ? -1 : x->hash > y->hash;
}

// Files that share a document (see doc_key): one warning naming the first such pair in file
// order, how many documents they share, and how many other pairs there are.
static int note_duplicates(reader *r, const worker *ws, int threads, ct_error *err) {
    size_t n = 0;
    for (int t = 0; t < threads; t++) n += ws[t].n_keys;
    for (size_t i = 0; i < r->n_files; i++) n += r->files[i].kind == SRC_TXT;
    doc_key *keys = malloc((n + 1) * sizeof *keys);
    file_pair *pairs = malloc((n + 1) * sizeof *pairs);
    if (!keys || !pairs) {
        free(keys);
        free(pairs);
        return ct_fail(err, "%s: out of memory comparing the files' documents", r->s->path);
    }
    size_t k = 0, n_pairs = 0;
    for (int t = 0; t < threads; t++) {
        if (ws[t].n_keys)
            memcpy(keys + k, ws[t].keys, ws[t].n_keys * sizeof *keys); // keys may be NULL
        k += ws[t].n_keys;
    }
    for (uint32_t i = 0; i < r->n_files; i++)
        if (r->files[i].kind == SRC_TXT) keys[k++] = (doc_key){r->files[i].hash, i, false};
    qsort(keys, n, sizeof *keys, cmp_keys);
    const uint32_t none = UINT32_MAX;
    for (size_t g0 = 0, g1; g0 < n; g0 = g1) {
        for (g1 = g0 + 1; g1 < n && keys[g1].hash == keys[g0].hash;) g1++;
        if (keys[g0].file == keys[g1 - 1].file) continue; // one file (sorted by file)
        // The two lowest files holding the text, and the two lowest holding it as a document.
        uint32_t f[2] = {none, none}, d[2] = {none, none};
        for (size_t i = g0; i < g1; i++) {
            uint32_t fi = keys[i].file;
            if (f[0] == none)
                f[0] = fi;
            else if (f[1] == none && fi != f[0])
                f[1] = fi;
            if (keys[i].is_line) continue;
            if (d[0] == none)
                d[0] = fi;
            else if (d[1] == none && fi != d[0])
                d[1] = fi;
        }
        // Each holder is paired with the lowest other file it shares the text with: a document
        // with any holder, a line with a document.
        for (size_t i = g0; i < g1; i++) {
            const uint32_t *c = keys[i].is_line ? d : f, fi = keys[i].file;
            uint32_t other = c[0] != fi ? c[0] : c[1];
            if (other == none) continue;
            pairs[n_pairs++] =
                (file_pair){fi < other ? fi : other, fi < other ? other : fi, keys[i].hash};
        }
    }
    qsort(pairs, n_pairs, sizeof *pairs, cmp_pairs);
    size_t n_distinct = 0;
    uint64_t shared = 0; // documents the first pair shares
    for (size_t i = 0; i < n_pairs; i++) {
        bool new_pair = i == 0 || pairs[i].a != pairs[i - 1].a || pairs[i].b != pairs[i - 1].b;
        n_distinct += new_pair;
        if (n_distinct == 1 && (new_pair || pairs[i].hash != pairs[i - 1].hash)) shared++;
    }
    if (n_distinct) {
        add_warning(r->s,
                    "%s and %s hold the same text (%llu documents in common, as documents or "
                    ".txt lines): it is trained twice; keep one of them",
                    r->files[pairs[0].a].path, r->files[pairs[0].b].path,
                    (unsigned long long)shared);
        if (n_distinct > 1)
            add_warning(r->s, "%zu more pair(s) of files share documents", n_distinct - 1);
    }
    free(keys);
    free(pairs);
    return 0;
}

// Encodes every unit in batches on `threads` threads and fills the stream in unit order.
// threads = 0 when there is no text: the .npy files are only appended.
static int encode_all(reader *r, int threads, ct_error *err) {
    worker *ws = NULL;
    int rc = 0;
    if (threads > 0 && !(ws = doc_encoders_new(threads, sizeof *ws, r->tok, err))) return -1;
    for (size_t u0 = 0, u1; rc == 0 && u0 < r->n_units; u0 = u1) {
        size_t bytes = 0;
        for (u1 = u0; u1 < r->n_units && (u1 == u0 || bytes < BATCH_BYTES); u1++)
            bytes += r->units[u1].len;
        for (int t = 0; t < threads; t++) {
            ws[t].d.ids.n = 0;
            ws[t].err_unit = SIZE_MAX;
        }
        if (threads > 0) {
            // Chunks of neighbouring units: short .jsonl lines share cache lines of `units`,
            // and single-line chunks would have threads writing to the same line.
            int chunk = (int)((u1 - u0) / ((size_t)threads * 64) + 1);
#pragma omp parallel for schedule(dynamic, chunk) num_threads(threads)
            for (size_t i = u0; i < u1; i++) {
                unit *u = &r->units[i];
                const src_file *f = &r->files[u->file];
                if (f->kind == SRC_NPY) continue;
                int t = omp_get_thread_num();
                u->thread = t;
                encode_unit(&ws[t], u, i, r);
            }
        }
        // The units before the first failed one (in stream order, whichever thread met it)
        // are appended, since they can fail too (an id beyond vocab_size): the error reported
        // is the first in the stream, for any thread count.
        size_t first = u1;
        const worker *failed = NULL;
        for (int t = 0; t < threads; t++) {
            if (ws[t].err_unit < first) {
                first = ws[t].err_unit;
                failed = &ws[t];
            }
        }
        for (size_t i = u0; i < first && rc == 0; i++) rc = append_unit(r, ws, i, err);
        if (rc == 0 && failed) *err = failed->err, rc = -1;
    }
    if (rc == 0 && r->find_dups) rc = note_duplicates(r, ws, threads, err);
    for (int t = 0; t < threads; t++) free(ws[t].keys);
    doc_encoders_free(ws, threads, sizeof *ws);
    return rc;
}

// The count of U+FFFD replacements and, in `warning`, where the first one was. Units are in
// stream order and every file has at least one, so the first hit below is the first in the
// stream: a .txt file is repaired as a whole (counted at its first unit), a .jsonl by line.
static void note_replacements(reader *r) {
    token_stream *s = r->s;
    const src_file *first = NULL;
    uint64_t where = 0;
    for (size_t i = 0; i < r->n_units; i++) {
        const unit *u = &r->units[i];
        const src_file *f = &r->files[u->file];
        uint64_t n = u->n_replaced, at = u->where;
        if (f->kind == SRC_TXT && u->where == 0) n = f->n_replaced, at = f->first_bad;
        s->n_replaced += n;
        if (n && !first) first = f, where = at;
    }
    if (first)
        add_warning(s,
                    "%s: %llu invalid UTF-8 sequence(s) replaced by U+FFFD; the first in %s at %s "
                    "%llu",
                    s->path, (unsigned long long)s->n_replaced, first->path,
                    first->kind == SRC_JSONL ? "line" : "byte offset", (unsigned long long)where);
}

static void reader_free(reader *r) {
    for (size_t i = 0; i < r->n_files; i++) {
        src_file *f = &r->files[i];
        fs_unmap(f->map, f->map_len);
        free(f->repaired);
        if (f->npy_open) npy_close(&f->npy);
        free(f->path);
    }
    free(r->files);
    free(r->units);
    free(r->scratch);
}

int stream_open_with(token_stream *s, const char *path, const stream_options *o, ct_error *err) {
    memset(s, 0, sizeof *s);
    s->eos = o->tok ? tok_eos_id(o->tok) : -1;
    if (!(s->path = strdup(path))) return ct_fail(err, "%s: out of memory", path);
    reader r = {.s = s,
                .o = o,
                .tok = o->tok,
                .vocab_size = o->vocab_size,
                .eos = -1,
                .at_doc_start = true};
    int rc = list_files(&r, path, err);
    size_t n_text = 0;
    for (size_t i = 0; i < r.n_files; i++) {
        n_text += r.files[i].kind != SRC_NPY;
        r.track_flags |= r.files[i].kind == SRC_JSONL;
    }
    r.find_dups = n_text >= 2;
    for (size_t i = 0; i < r.n_files && rc == 0; i++) rc = plan_file(&r, (uint32_t)i, err);
    bool text = n_text > 0;
    if (rc == 0 && text) {
        r.eos = s->eos;
        if (r.eos < 0)
            rc = ct_fail(err,
                         "%s: the tokenizer has no <|endoftext|> or eos_token to end "
                         "documents with",
                         path);
        else if (o->vocab_size > 0 && r.eos >= o->vocab_size)
            rc = ct_fail(err, "%s: the end-of-document id %d is outside the model's vocab_size %d",
                         path, r.eos, o->vocab_size);
    }
    int threads = o->threads > 0 ? o->threads : omp_get_max_threads();
    if (rc == 0) rc = encode_all(&r, text ? threads : 0, err);
    if (rc == 0 && r.any_flagged && s->n_trained == 0 && s->n_docs == 0 && s->n_npy == 0)
        rc = ct_fail(err,
                     "%s: no token is trained: no conversation has an assistant turn (to train "
                     "on every token: training.train_on = \"all\")",
                     path);
    if (rc == 0) {
        s->n_files = r.n_files;
        note_replacements(&r);
        if (!r.any_flagged) { // text only: the flags say nothing the ids do not
            free(s->flags);
            s->flags = NULL;
        }
        // Give back the growth slack: the stream lives as long as training does.
        int32_t *fit = s->n_mem ? realloc(s->tokens, s->n_mem * sizeof *fit) : NULL;
        if (fit) s->tokens = fit;
        uint8_t *fit_flags = s->flags && s->n_mem ? realloc(s->flags, s->n_mem) : NULL;
        if (fit_flags) s->flags = fit_flags;
    }
    reader_free(&r);
    if (rc != 0) stream_free(s);
    return rc;
}

int stream_open(token_stream *s, const char *path, const tokenizer *tok, int32_t vocab_size,
                int threads, ct_error *err) {
    stream_options o = {.tok = tok, .vocab_size = vocab_size, .threads = threads};
    return stream_open_with(s, path, &o, err);
}

void stream_free(token_stream *s) {
    for (size_t i = 0; i < s->n_npy; i++) npy_close(&s->npy[i]);
    free(s->npy);
    free(s->parts);
    free(s->tokens);
    free(s->flags);
    free(s->path);
    memset(s, 0, sizeof *s);
}

// The part holding token `at` (parts are in stream order).
static const stream_part *part_of(const token_stream *s, uint64_t at) {
    size_t lo = 0, hi = s->n_parts;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (s->parts[mid].first <= at)
            lo = mid;
        else
            hi = mid;
    }
    return &s->parts[lo];
}

int stream_read(const token_stream *s, uint64_t first, size_t n, int32_t *ids, uint8_t *flags,
                ct_error *err) {
    if (first > s->n_tokens || n > s->n_tokens - first)
        return ct_fail(err, "dataset %s: tokens [%llu, %llu) read, it has %llu", s->path,
                       (unsigned long long)first, (unsigned long long)(first + n),
                       (unsigned long long)s->n_tokens);
    for (size_t done = 0; done < n;) {
        uint64_t at = first + done;
        const stream_part *p = part_of(s, at);
        uint64_t off = at - p->first;
        size_t k = (size_t)(p->n - off < n - done ? p->n - off : n - done);
        bool own_flags = p->npy < 0 && s->flags;
        if (p->npy >= 0) {
            if (npy_read(ids + done, &s->npy[p->npy], off, k, 0, err) != 0) return -1;
        } else {
            memcpy(ids + done, s->tokens + p->mem_first + off, k * sizeof *ids);
            if (own_flags && flags) memcpy(flags + done, s->flags + p->mem_first + off, k);
        }
        if (flags && !own_flags) {
            // Text and .npy: every token is trained; a document starts after the end id.
            for (size_t i = done; i < done + k; i++) {
                bool start = i == 0 ? first == 0 : s->eos >= 0 && ids[i - 1] == s->eos;
                flags[i] = STREAM_TRAIN | (start ? STREAM_DOC_START : 0);
            }
        }
        done += k;
    }
    return 0;
}
