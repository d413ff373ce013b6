#include "core/fs.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int fs_mkdirs(const char *dir, ct_error *err) {
    char path[4096];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof path) return ct_fail(err, "bad folder name \"%s\"", dir);
    memcpy(path, dir, n + 1);
    // Each prefix ending at a '/' (and the whole path) is created in turn; 0777 as mkdir -p,
    // so the umask decides.
    for (size_t i = 1; i <= n; i++) {
        if (path[i] != '/' && path[i] != '\0') continue;
        char c = path[i];
        path[i] = '\0';
        if (mkdir(path, 0777) != 0 && errno != EEXIST)
            return ct_fail(err, "%s: cannot create folder: %s", path, strerror(errno));
        path[i] = c;
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return ct_fail(err, "%s: exists and is not a folder", dir);
    return 0;
}

int fs_open_regular(int *fd, size_t *size, const char *path, ct_error *err) {
    *fd = open(path, O_RDONLY);
    if (*fd < 0) return ct_fail(err, "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(*fd, &sb) != 0) {
        int e = errno;
        close(*fd);
        *fd = -1;
        return ct_fail(err, "cannot stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(*fd);
        *fd = -1;
        return ct_fail(err, "%s: not a regular file", path);
    }
    *size = (size_t)sb.st_size;
    return 0;
}

int fs_map_readonly(void **map, size_t *size, const char *path, ct_error *err) {
    int fd;
    *map = NULL;
    *size = 0;
    size_t n;
    if (fs_open_regular(&fd, &n, path, err) != 0) return -1;
    void *m = NULL;
    if (n > 0) {
        m = mmap(NULL, n, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            return ct_fail(err, "%s: mmap of %zu bytes failed: %s", path, n, strerror(e));
        }
    }
    close(fd); // the mapping stays valid without the descriptor
    *map = m;
    *size = n;
    return 0;
}

void fs_unmap(void *map, size_t size) {
    if (map) munmap(map, size);
}

void fs_release_read(const void *p, size_t bytes) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), lo = (uintptr_t)p;
    const uintptr_t in_lo = (lo + page - 1) / page * page, in_hi = (lo + bytes) / page * page;
    if (in_hi > in_lo) madvise((void *)in_lo, in_hi - in_lo, MADV_DONTNEED);
}
