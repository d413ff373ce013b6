#include "io/atomic.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void atomic_free(atomic_file *a) {
    free(a->path);
    free(a->tmp);
    a->path = a->tmp = NULL;
    a->fp = NULL;
}

int atomic_open(atomic_file *a, const char *path, ct_error *err) {
    memset(a, 0, sizeof *a);
    size_t len = strlen(path) + 32;
    a->path = strdup(path);
    a->tmp = malloc(len);
    if (!a->path || !a->tmp) {
        atomic_free(a);
        return ct_fail(err, "%s: out of memory", path);
    }
    snprintf(a->tmp, len, "%s.tmp.%ld", path, (long)getpid());
    a->fp = fopen(a->tmp, "wb");
    if (!a->fp) {
        int e = errno;
        ct_fail(err, "%s: cannot create temp file %s: %s", path, a->tmp, strerror(e));
        atomic_free(a);
        return -1;
    }
    return 0;
}

int atomic_write(atomic_file *a, const void *buf, size_t n, ct_error *err) {
    if (n && fwrite(buf, 1, n, a->fp) != n)
        return ct_fail(err, "%s: write failed: %s", a->path, strerror(errno));
    return 0;
}

void atomic_abort(atomic_file *a) {
    if (a->fp) fclose(a->fp);
    if (a->tmp) unlink(a->tmp);
    atomic_free(a);
}

// fsync the directory so the rename itself survives a crash.
static void atomic_sync_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, (size_t)(slash - path) + (slash == path)) : strdup(".");
    if (!dir) return;
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd); // best effort: some filesystems refuse fsync on directories
        close(fd);
    }
    free(dir);
}

int atomic_commit(atomic_file *a, ct_error *err) {
    int rc = 0;
    if (fflush(a->fp) != 0 || fsync(fileno(a->fp)) != 0)
        rc = ct_fail(err, "%s: write failed: %s", a->path, strerror(errno));
    if (fclose(a->fp) != 0 && rc == 0)
        rc = ct_fail(err, "%s: write failed: %s", a->path, strerror(errno));
    a->fp = NULL;
    if (rc == 0 && rename(a->tmp, a->path) != 0)
        rc = ct_fail(err, "%s: cannot rename %s into place: %s", a->path, a->tmp, strerror(errno));
    if (rc != 0) {
        unlink(a->tmp);
    } else {
        atomic_sync_dir(a->path);
    }
    atomic_free(a);
    return rc;
}
