// Reading tokenizer.json (+ tokenizer_config.json) into a tokenizer. Every field that changes the
// ids is either implemented or rejected as "not supported", so a file we load gives HF's ids.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "core/grow.h"
#include "core/utf8.h"
#include "io/json.h"
#include "text/bytelevel.h"
#include "text/tokenizer_internal.h"

#define TOKENIZER_JSON_MAX (1u << 30)

// The Split regex of Qwen2/Qwen2.5/Qwen3. Cuts before a letter or digit that follows '\n' are
// safe for it (no match can span them; see tok_cut_points), which lets one long document be
// encoded in parallel.
static const char qwen2_pattern[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
                                    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
                                    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// What ByteLevel(use_regex=true) splits with (GPT-2's pattern, as in HF's byte_level.rs).
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// One id's string while loading (points into the cJSON tree).
typedef struct id_entry {
    const char *s;
    size_t len;
    uint8_t kind;
} id_entry;

typedef struct loader {
    const char *what, *config_what; // file names for errors
    cJSON *root, *config;
    tokenizer *t;
    id_entry *ids;
    int32_t n_ids;
} loader;

static const char *type_of(const cJSON *obj) {
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(obj, "type");
    return cJSON_IsString(ty) ? ty->valuestring : NULL;
}

static bool is_null_or_absent(const cJSON *item) {
    return !item || cJSON_IsNull(item);
}

static bool is_false_or_absent(const cJSON *item) {
    return !item || cJSON_IsNull(item) || cJSON_IsFalse(item);
}

static bool is_empty_string_or_absent(const cJSON *item) {
    return !item || cJSON_IsNull(item) || (cJSON_IsString(item) && item->valuestring[0] == 0);
}

static int load_normalizer(loader *L, const cJSON *n, ct_error *err) {
    if (is_null_or_absent(n)) return 0;
    const char *ty = type_of(n);
    if (ty && strcmp(ty, "NFC") == 0) {
        L->t->nfc = true;
        return 0;
    }
    if (ty && strcmp(ty, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers"), *item;
        if (!cJSON_IsArray(list))
            return ct_fail(err, "%s: normalizer Sequence without a \"normalizers\" array", L->what);
        cJSON_ArrayForEach(item, list) {
            if (load_normalizer(L, item, err) != 0) return -1;
        }
        return 0;
    }
    return ct_fail(err, "%s: not supported: normalizer type %s (only NFC)", L->what,
                   ty ? ty : "(missing)");
}

// ByteLevel as a pre-tokenizer: maps bytes to its alphabet (our BPE works on bytes directly) and,
// with use_regex, first splits with GPT-2's pattern.
static int load_bytelevel(loader *L, const cJSON *p, const char **regex, ct_error *err) {
    if (!is_false_or_absent(cJSON_GetObjectItemCaseSensitive(p, "add_prefix_space")))
        return ct_fail(err, "%s: not supported: ByteLevel pre-tokenizer with add_prefix_space",
                       L->what);
    const cJSON *use_regex = cJSON_GetObjectItemCaseSensitive(p, "use_regex");
    if (!use_regex || cJSON_IsTrue(use_regex)) { // HF's default is true
        if (*regex)
            return ct_fail(err, "%s: not supported: a Split and a ByteLevel(use_regex) together",
                           L->what);
        *regex = gpt2_pattern;
    }
    return 0;
}

static int load_split(loader *L, const cJSON *p, const char **regex, ct_error *err) {
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
    if (!cJSON_IsString(re))
        return ct_fail(err, "%s: not supported: Split pattern other than {\"Regex\": ...}",
                       L->what);
    const cJSON *behavior = cJSON_GetObjectItemCaseSensitive(p, "behavior");
    if (!cJSON_IsString(behavior) || strcmp(behavior->valuestring, "Isolated") != 0)
        return ct_fail(err, "%s: not supported: Split behavior %s (only Isolated)", L->what,
                       cJSON_IsString(behavior) ? behavior->valuestring : "(missing)");
    if (!is_false_or_absent(cJSON_GetObjectItemCaseSensitive(p, "invert")))
        return ct_fail(err, "%s: not supported: Split with invert", L->what);
    if (*regex)
        return ct_fail(err, "%s: not supported: more than one regex pre-tokenizer", L->what);
    *regex = re->valuestring;
    return 0;
}

static int load_pre_tokenizer(loader *L, const cJSON *p, ct_error *err) {
    const char *ty = type_of(p), *regex = NULL;
    bool bytelevel = false;
    if (ty && strcmp(ty, "ByteLevel") == 0) {
        if (load_bytelevel(L, p, &regex, err) != 0) return -1;
        bytelevel = true;
    } else if (ty && strcmp(ty, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers"), *item;
        if (!cJSON_IsArray(list))
            return ct_fail(err, "%s: pre_tokenizer Sequence without a \"pretokenizers\" array",
                           L->what);
        cJSON_ArrayForEach(item, list) {
            const char *ity = type_of(item);
            if (bytelevel)
                return ct_fail(err, "%s: not supported: a pre-tokenizer after ByteLevel", L->what);
            if (ity && strcmp(ity, "Split") == 0) {
                if (load_split(L, item, &regex, err) != 0) return -1;
            } else if (ity && strcmp(ity, "ByteLevel") == 0) {
                if (load_bytelevel(L, item, &regex, err) != 0) return -1;
                bytelevel = true;
            } else {
                return ct_fail(err, "%s: not supported: pre-tokenizer type %s", L->what,
                               ity ? ity : "(missing)");
            }
        }
    } else {
        return ct_fail(err,
                       "%s: not supported: pre_tokenizer type %s (expected ByteLevel or a "
                       "Sequence of Split and ByteLevel)",
                       L->what,
                       ty                     ? ty
                       : is_null_or_absent(p) ? "null"
                                              : "(missing)");
    }
    if (!bytelevel)
        return ct_fail(err,
                       "%s: not supported: a pre-tokenizer without ByteLevel (byte-level "
                       "BPE needs it)",
                       L->what);
    if (regex && pretok_compile(&L->t->split, regex, err) != 0) return ct_wrap(err, "%s", L->what);
    L->t->cut_safe = regex && strcmp(regex, qwen2_pattern) == 0;
    return 0;
}

static int load_post_and_decoder(loader *L, ct_error *err) {
    const cJSON *post = cJSON_GetObjectItemCaseSensitive(L->root, "post_processor");
    const char *ty = type_of(post);
    // ByteLevel's post-processing only adjusts offsets; ids are untouched.
    if (!is_null_or_absent(post) && !(ty && strcmp(ty, "ByteLevel") == 0))
        return ct_fail(err, "%s: not supported: post_processor type %s", L->what,
                       ty ? ty : "(missing)");
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(L->root, "decoder");
    ty = type_of(dec);
    if (!(ty && strcmp(ty, "ByteLevel") == 0))
        return ct_fail(err, "%s: not supported: decoder %s (only ByteLevel)", L->what,
                       ty                       ? ty
                       : is_null_or_absent(dec) ? "null"
                                                : "(missing)");
    return 0;
}

static int set_id(loader *L, int32_t id, const char *s, size_t len, uint8_t kind, ct_error *err) {
    id_entry *e = &L->ids[id];
    if (e->kind != TOK_UNUSED && !(e->len == len && memcmp(e->s, s, len) == 0))
        return ct_fail(err, "%s: id %d is both \"%.*s\" and \"%s\"", L->what, (int)id, (int)e->len,
                       e->s, s);
    // An added token that repeats a vocabulary entry keeps its added status (it is matched).
    *e = (id_entry){s, len, e->kind > kind ? e->kind : kind};
    return 0;
}

static int read_id(int32_t *out, const cJSON *item, const char *what, const char *key,
                   ct_error *err) {
    uint64_t v;
    if (!json_is_uint(item, &v) || v >= INT32_MAX)
        return ct_fail(err, "%s: %s: id must be an integer in [0, 2^31-1)", what, key);
    *out = (int32_t)v;
    return 0;
}

// Ids a tokenizer may leave unused below its largest (a real one leaves a few hundred): the
// per-id tables are sized by the largest id, so one stray id of 2e9 would ask for 48 GB.
#define TOK_MAX_UNUSED_IDS (1 << 20)

// First pass: the largest id, so the per-id tables can be sized.
static int scan_ids(loader *L, const cJSON *vocab, const cJSON *added, ct_error *err) {
    int32_t max_id = -1, id = 0;
    int64_t n = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, vocab) {
        if (read_id(&id, item, L->what, item->string, err) != 0) return -1;
        if (id > max_id) max_id = id;
        n++;
    }
    cJSON_ArrayForEach(item, added) {
        if (read_id(&id, cJSON_GetObjectItemCaseSensitive(item, "id"), L->what, "added_tokens",
                    err) != 0)
            return -1;
        if (id > max_id) max_id = id;
        n++;
    }
    if (max_id < 0) return ct_fail(err, "%s: the vocabulary is empty", L->what);
    if (max_id >= n + TOK_MAX_UNUSED_IDS)
        return ct_fail(err,
                       "%s: token id %d leaves more than %d ids unused (%lld tokens in all); "
                       "expected ids near 0 .. %lld",
                       L->what, (int)max_id, TOK_MAX_UNUSED_IDS, (long long)n, (long long)n - 1);
    L->n_ids = max_id + 1;
    L->ids = calloc((size_t)L->n_ids, sizeof *L->ids);
    if (!L->ids) return ct_fail(err, "%s: out of memory for %d ids", L->what, (int)L->n_ids);
    return 0;
}

static int load_merges(loader *L, const cJSON *merges, ct_error *err) {
    tokenizer *t = L->t;
    if (bpe_pairs_init(&t->pairs, (size_t)cJSON_GetArraySize(merges), err) != 0) return -1;
    char *joined = NULL;
    size_t joined_cap = 0;
    uint32_t rank = 0;
    const cJSON *m;
    int rc = 0;
    cJSON_ArrayForEach(m, merges) {
        // Either "a b" (one space: byte-level tokens never contain a space) or ["a", "b"].
        const char *a, *b;
        size_t la, lb;
        if (cJSON_IsString(m)) {
            const char *sp = strchr(m->valuestring, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                rc = ct_fail(err, "%s: merge #%u \"%s\" is not two tokens separated by a space",
                             L->what, rank, m->valuestring);
                break;
            }
            a = m->valuestring;
            la = (size_t)(sp - a);
            b = sp + 1;
            lb = strlen(b);
        } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 &&
                   cJSON_IsString(cJSON_GetArrayItem(m, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(m, 1))) {
            a = cJSON_GetArrayItem(m, 0)->valuestring;
            b = cJSON_GetArrayItem(m, 1)->valuestring;
            la = strlen(a);
            lb = strlen(b);
        } else {
            rc = ct_fail(err, "%s: merge #%u is neither \"a b\" nor [\"a\", \"b\"]", L->what, rank);
            break;
        }
        if (grow_to((void **)&joined, &joined_cap, la + lb + 1, 1) != 0) {
            rc = ct_fail(err, "%s: out of memory", L->what);
            break;
        }
        memcpy(joined, a, la);
        memcpy(joined + la, b, lb);
        int32_t ia = strmap_get(&t->by_str, a, la), ib = strmap_get(&t->by_str, b, lb);
        int32_t im = strmap_get(&t->by_str, joined, la + lb);
        if (ia < 0 || ib < 0 || im < 0) {
            const char *miss = ia < 0 ? a : ib < 0 ? b : joined;
            int miss_len = (int)(ia < 0 ? la : ib < 0 ? lb : la + lb);
            rc = ct_fail(err, "%s: merge #%u \"%.*s\" + \"%.*s\": \"%.*s\" is not in the vocab",
                         L->what, rank, (int)la, a, (int)lb, b, miss_len, miss);
            break;
        }
        bpe_pairs_put(&t->pairs, ia, ib, rank, im);
        rank++;
    }
    free(joined);
    return rc;
}

static int load_model(loader *L, const cJSON *added, ct_error *err) {
    tokenizer *t = L->t;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(L->root, "model");
    if (!cJSON_IsObject(model)) return ct_fail(err, "%s: no \"model\" object", L->what);
    const char *ty = type_of(model);
    if (!ty || strcmp(ty, "BPE") != 0)
        return ct_fail(err, "%s: not supported: model type %s (only BPE)", L->what,
                       ty ? ty : "(missing)");
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (!is_null_or_absent(dropout) && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0))
        return ct_fail(err, "%s: not supported: BPE dropout", L->what);
    if (!is_false_or_absent(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback")))
        return ct_fail(err, "%s: not supported: BPE byte_fallback", L->what);
    if (!is_empty_string_or_absent(
            cJSON_GetObjectItemCaseSensitive(model, "continuing_subword_prefix")) ||
        !is_empty_string_or_absent(cJSON_GetObjectItemCaseSensitive(model, "end_of_word_suffix")))
        return ct_fail(err,
                       "%s: not supported: BPE continuing_subword_prefix or "
                       "end_of_word_suffix",
                       L->what);
    const cJSON *ignore = cJSON_GetObjectItemCaseSensitive(model, "ignore_merges");
    t->ignore_merges = cJSON_IsTrue(ignore);
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsObject(vocab)) return ct_fail(err, "%s: model.vocab is not an object", L->what);
    if (!cJSON_IsArray(merges)) return ct_fail(err, "%s: model.merges is not an array", L->what);
    if (scan_ids(L, vocab, added, err) != 0) return -1;

    // The model's vocabulary first: merges resolve against it alone, as in HF.
    if (strmap_init(&t->by_str, (size_t)L->n_ids, err) != 0) return -1;
    const cJSON *item;
    cJSON_ArrayForEach(item, vocab) {
        int32_t id = (int32_t)item->valuedouble;
        size_t len = strlen(item->string);
        if (set_id(L, id, item->string, len, TOK_MODEL, err) != 0) return -1;
        if (strmap_put(&t->by_str, item->string, len, id, err) != 0) return -1;
    }
    for (int b = 0; b < 256; b++) {
        char s[4];
        int len = utf8_encode(s, bytelevel_char((unsigned char)b));
        t->byte_id[b] = strmap_get(&t->by_str, s, (size_t)len);
        if (t->byte_id[b] < 0)
            return ct_fail(err,
                           "%s: not supported: the vocabulary has no token for byte 0x%02X "
                           "(\"%.*s\"); byte-level BPE needs all 256",
                           L->what, b, len, s);
    }
    return load_merges(L, merges, err);
}

static int load_added(loader *L, const cJSON *added, bool split_special, ct_error *err) {
    tokenizer *t = L->t;
    int n = cJSON_GetArraySize(added), k = 0;
    added_token *list = calloc((size_t)(n ? n : 1), sizeof *list);
    if (!list) return ct_fail(err, "%s: out of memory", L->what);
    const cJSON *item;
    int rc = 0;
    cJSON_ArrayForEach(item, added) {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(item, "content");
        int32_t id = (int32_t)cJSON_GetObjectItemCaseSensitive(item, "id")->valuedouble;
        if (!cJSON_IsString(content) || content->valuestring[0] == 0) {
            rc = ct_fail(err, "%s: added token %d has no content", L->what, (int)id);
            break;
        }
        const char *c = content->valuestring;
        static const char *const unsupported[] = {"single_word", "lstrip", "rstrip", "normalized"};
        for (int f = 0; f < 4 && rc == 0; f++)
            if (!is_false_or_absent(cJSON_GetObjectItemCaseSensitive(item, unsupported[f])))
                rc = ct_fail(err, "%s: not supported: added token \"%s\" with %s=true", L->what, c,
                             unsupported[f]);
        if (rc) break;
        bool special = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(item, "special"));
        size_t len = strlen(c);
        if ((rc = set_id(L, id, c, len, special ? TOK_SPECIAL : TOK_ADDED, err)) != 0) break;
        if ((rc = strmap_put(&t->by_str, c, len, id, err)) != 0) break;
        if (special && split_special) continue; // split_special_tokens: matched as plain text
        char *copy = strdup(c);
        if (!copy) {
            rc = ct_fail(err, "%s: out of memory", L->what);
            break;
        }
        list[k++] = (added_token){copy, len, id, special};
    }
    if (rc) {
        for (int i = 0; i < k; i++) free(list[i].content);
        free(list);
        return -1;
    }
    return added_set_init(&t->added, list, k, err);
}

static const char *token_name(const cJSON *v) {
    if (cJSON_IsString(v)) return v->valuestring;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(v, "content");
    return cJSON_IsString(c) ? c->valuestring : NULL;
}

// tokenizer_config.json may name tokens and flags that change encoding; check they agree.
static int check_config(loader *L, bool *split_special, ct_error *err) {
    const cJSON *c = L->config;
    *split_special = false;
    if (!c) return 0;
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "add_bos_token")) ||
        cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "add_eos_token")))
        return ct_fail(err, "%s: not supported: add_bos_token/add_eos_token", L->config_what);
    *split_special = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "split_special_tokens"));
    // Tokens that only the config declares would be added by transformers; we take tokens from
    // tokenizer.json alone, so they must be there.
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(c, "added_tokens_decoder"), *item;
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(L->root, "added_tokens");
    cJSON_ArrayForEach(item, dec) {
        const char *content = token_name(item);
        bool found = false;
        const cJSON *a;
        cJSON_ArrayForEach(a, added) {
            const cJSON *ac = cJSON_GetObjectItemCaseSensitive(a, "content");
            const cJSON *aid = cJSON_GetObjectItemCaseSensitive(a, "id");
            if (content && cJSON_IsString(ac) && strcmp(ac->valuestring, content) == 0 &&
                cJSON_IsNumber(aid) && aid->valuedouble == atof(item->string))
                found = true;
        }
        if (!found)
            return ct_fail(err,
                           "%s: not supported: added_tokens_decoder has %s \"%s\", which "
                           "tokenizer.json's added_tokens lacks",
                           L->config_what, item->string, content ? content : "?");
    }
    return 0;
}

static int pack_tables(loader *L, ct_error *err) {
    tokenizer *t = L->t;
    size_t total = 0;
    for (int32_t i = 0; i < L->n_ids; i++) total += L->ids[i].len + 1;
    if (total > UINT32_MAX) return ct_fail(err, "%s: token strings exceed 4 GiB", L->what);
    t->n_ids = L->n_ids;
    size_t n = L->n_ids > 0 ? (size_t)L->n_ids : 1;
    t->kind = malloc(n);
    t->str = malloc(total);
    t->dec = malloc(total);
    t->str_off = malloc((n + 1) * sizeof *t->str_off);
    t->dec_off = malloc((n + 1) * sizeof *t->dec_off);
    if (!t->kind || !t->str || !t->dec || !t->str_off || !t->dec_off)
        return ct_fail(err, "%s: out of memory for the token tables", L->what);
    size_t so = 0, dof = 0;
    for (int32_t i = 0; i < t->n_ids; i++) {
        const id_entry *e = &L->ids[i];
        t->kind[i] = e->kind;
        t->str_off[i] = (uint32_t)so;
        t->dec_off[i] = (uint32_t)dof;
        if (e->len) memcpy(t->str + so, e->s, e->len);
        so += e->len;
        t->str[so++] = 0;
        dof += bytelevel_decode(t->dec + dof, e->s, e->len);
    }
    t->str_off[t->n_ids] = (uint32_t)so;
    t->dec_off[t->n_ids] = (uint32_t)dof;
    return 0;
}

static int load_all(loader *L, ct_error *err) {
    const cJSON *root = L->root;
    if (!cJSON_IsObject(root)) return ct_fail(err, "%s: not a JSON object", L->what);
    if (!is_null_or_absent(cJSON_GetObjectItemCaseSensitive(root, "truncation")) ||
        !is_null_or_absent(cJSON_GetObjectItemCaseSensitive(root, "padding")))
        return ct_fail(err, "%s: not supported: truncation or padding in tokenizer.json", L->what);
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), *item;
    if (!is_null_or_absent(added) && !cJSON_IsArray(added))
        return ct_fail(err, "%s: added_tokens is not an array", L->what);
    cJSON_ArrayForEach(item, added) {
        if (!cJSON_IsObject(item))
            return ct_fail(err, "%s: an added_tokens entry is not an object", L->what);
    }
    bool split_special;
    if (check_config(L, &split_special, err) != 0) return -1;
    if (load_model(L, added, err) != 0) return -1;
    if (load_added(L, added, split_special, err) != 0) return -1;
    if (load_normalizer(L, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), err) != 0)
        return -1;
    if (load_pre_tokenizer(L, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), err) != 0)
        return -1;
    if (load_post_and_decoder(L, err) != 0) return -1;
    if (pack_tables(L, err) != 0) return -1;

    tokenizer *t = L->t;
    for (int i = 0; i < t->added.n; i++)
        if (memchr(t->added.tok[i].content, '\n', t->added.tok[i].len)) t->cut_safe = false;
    t->eos_id = strmap_get(&t->by_str, "<|endoftext|>", 13);
    if (t->eos_id < 0 && L->config) {
        const char *eos = token_name(cJSON_GetObjectItemCaseSensitive(L->config, "eos_token"));
        if (eos) t->eos_id = strmap_get(&t->by_str, eos, strlen(eos));
    }
    return 0;
}

int tok_load_json(tokenizer **out, const char *json, size_t len, const char *config,
                  size_t config_len, const char *what, const char *config_what, ct_error *err) {
    *out = NULL;
    loader L = {.what = what, .config_what = config_what ? config_what : "tokenizer_config.json"};
    if (json_parse(&L.root, json, len, what, err) != 0) return -1;
    if (config && json_parse(&L.config, config, config_len, L.config_what, err) != 0) {
        cJSON_Delete(L.root);
        return -1;
    }
    L.t = calloc(1, sizeof *L.t);
    int rc = L.t ? load_all(&L, err) : ct_fail(err, "%s: out of memory", what);
    free(L.ids);
    cJSON_Delete(L.root);
    cJSON_Delete(L.config);
    if (rc != 0) {
        tok_free(L.t);
        return -1;
    }
    *out = L.t;
    return 0;
}

int tok_load(tokenizer **out, const char *dir, ct_error *err) {
    *out = NULL;
    char path[4096], cfg_path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    snprintf(cfg_path, sizeof cfg_path, "%s/tokenizer_config.json", dir);
    char *json = NULL, *cfg = NULL;
    size_t len = 0, cfg_len = 0;
    if (file_read_all(&json, &len, path, TOKENIZER_JSON_MAX, err) != 0) return -1;
    struct stat st;
    if (stat(cfg_path, &st) == 0 &&
        file_read_all(&cfg, &cfg_len, cfg_path, TOKENIZER_JSON_MAX, err) != 0) {
        free(json);
        return -1;
    }
    int rc = tok_load_json(out, json, len, cfg, cfg_len, path, cfg_path, err);
    free(json);
    free(cfg);
    return rc;
}

void tok_free(tokenizer *t) {
    if (!t) return;
    free(t->kind);
    free(t->str);
    free(t->str_off);
    free(t->dec);
    free(t->dec_off);
    strmap_free(&t->by_str);
    bpe_pairs_free(&t->pairs);
    added_set_free(&t->added);
    pretok_free(t->split);
    free(t);
}
