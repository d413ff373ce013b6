// The filesystem steps behind crash-safe checkpoints, and their checksums (core/xxh64.c).
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fs.h"
#include "core/xxh64.h"
#include "io/atomic.h"
#include "checkpoint/checkpoint_internal.h"
#include "core/grow.h"

int ckpt_hash_file(uint64_t *hash, uint64_t *size, const char *path, ct_error *err) {
    void *map;
    size_t n;
    if (fs_map_readonly(&map, &n, path, err) != 0) return -1;
    if (map) madvise(map, n, MADV_SEQUENTIAL); // read once, front to back
    *hash = map ? ct_xxh64_file_map(map, n, 0) : ct_xxh64("", 0, 0);
    *size = n;
    fs_unmap(map, n);
    return 0;
}

// --- folders and durability

int ckpt_fsync_path(const char *path, bool is_dir, ct_error *err) {
    int fd = open(path, O_RDONLY | (is_dir ? O_DIRECTORY : 0));
    if (fd < 0) return ct_fail(err, "%s: cannot open to sync: %s", path, strerror(errno));
    int rc = 0;
    // A folder on a filesystem that cannot fsync folders (EINVAL) has nothing more to make
    // durable; every other failure means the data may not be on disk.
    if (fsync(fd) != 0 && !(is_dir && (errno == EINVAL || errno == ENOTSUP)))
        rc = ct_fail(err, "%s: fsync failed: %s", path, strerror(errno));
    close(fd);
    return rc;
}

int ckpt_fsync_folder(const char *dir, ct_error *err) {
    DIR *d = opendir(dir);
    if (!d) return ct_fail(err, "%s: cannot list folder: %s", dir, strerror(errno));
    int rc = 0;
    for (struct dirent *de; rc == 0 && (de = readdir(d));) {
        if (de->d_name[0] == '.') continue;
        char path[8192];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        if (lstat(path, &sb) == 0 && S_ISREG(sb.st_mode)) rc = ckpt_fsync_path(path, false, err);
    }
    closedir(d);
    return rc == 0 ? ckpt_fsync_path(dir, true, err) : -1;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)ftw;
    int rc = flag == FTW_DP ? rmdir(path) : unlink(path);
    return rc != 0 && errno != ENOENT ? -1 : 0;
}

int ckpt_rmtree(const char *path, ct_error *err) {
    struct stat sb;
    if (lstat(path, &sb) != 0) {
        if (errno == ENOENT) return 0;
        return ct_fail(err, "%s: %s", path, strerror(errno));
    }
    if (nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return ct_fail(err, "%s: cannot remove: %s", path, strerror(errno));
    return 0;
}

int ckpt_write_text(const char *path, const char *text, size_t len, ct_error *err) {
    atomic_file af;
    if (atomic_open(&af, path, err) != 0) return -1;
    if (atomic_write(&af, text, len, err) != 0) {
        atomic_abort(&af);
        return -1;
    }
    return atomic_commit(&af, err);
}

// --- names

// Parses the digits at s into *v (at least one, no sign, no overflow); *end after them.
static bool parse_digits(const char *s, int64_t *v, const char **end) {
    int64_t x = 0;
    const char *p = s;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (x > (INT64_MAX - (*p - '0')) / 10) return false;
        x = x * 10 + (*p - '0');
    }
    if (p == s) return false;
    *v = x;
    *end = p;
    return true;
}

int ckpt_step_path(char *out, size_t cap, const char *root, int64_t step, ct_error *err) {
    int n = snprintf(out, cap, "%s/step-%" PRId64, root, step);
    if (n < 0 || (size_t)n >= cap) return ct_fail(err, "%s: checkpoint path too long", root);
    return 0;
}

bool ckpt_parse_step_name(const char *name, int64_t *step) {
    const char *end;
    return strncmp(name, "step-", 5) == 0 && parse_digits(name + 5, step, &end) && *end == '\0';
}

bool ckpt_parse_tmp_name(const char *name, long *pid) {
    int64_t step, p;
    const char *end;
    if (strncmp(name, "step-", 5) != 0 || !parse_digits(name + 5, &step, &end)) return false;
    if (strncmp(end, ".tmp-", 5) != 0 || !parse_digits(end + 5, &p, &end)) return false;
    *pid = (long)p;
    return true;
}

static int step_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x > y ? -1 : x < y;
}

int ckpt_list_steps(int64_t **steps, int *n, const char *root, ct_error *err) {
    *steps = NULL;
    *n = 0;
    DIR *d = opendir(root);
    if (!d) {
        if (errno == ENOENT) return 0;
        return ct_fail(err, "%s: cannot list folder: %s", root, strerror(errno));
    }
    size_t cap = 0;
    int rc = 0;
    for (struct dirent *de; (de = readdir(d));) {
        int64_t step;
        if (!ckpt_parse_step_name(de->d_name, &step)) continue;
        char path[8192];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", root, de->d_name);
        if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) continue;
        if (grow_to((void **)steps, &cap, (size_t)*n + 1, sizeof **steps) != 0) {
            rc = ct_fail(err, "%s: out of memory listing checkpoints", root);
            break;
        }
        (*steps)[(*n)++] = step;
    }
    closedir(d);
    if (rc != 0) {
        free(*steps);
        *steps = NULL;
        *n = 0;
        return -1;
    }
    if (*n > 1) qsort(*steps, (size_t)*n, sizeof **steps, step_desc);
    return 0;
}

// --- notes

void ckpt_note(ckpt_notes *notes, const char *fmt, ...) {
    if (!notes) return;
    char buf[1280];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    char *copy = strdup(buf);
    char **grown = copy ? realloc(notes->msgs, (size_t)(notes->n + 1) * sizeof *grown) : NULL;
    if (!grown) { // a note lost to out-of-memory is not worth failing a checkpoint for
        free(copy);
        return;
    }
    grown[notes->n++] = copy;
    notes->msgs = grown;
}

void ckpt_notes_free(ckpt_notes *notes) {
    for (int i = 0; i < notes->n; i++) free(notes->msgs[i]);
    free(notes->msgs);
    notes->msgs = NULL;
    notes->n = 0;
}
