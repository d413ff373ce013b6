// The kernel check in a forked child (kernel_check_isolated, kernel_check.h): a plugin that
// crashes or hangs takes the child down, not the caller. The child streams its progress lines
// over a pipe, then its rows; the parent reads with a deadline that each new line renews, reaps
// the child, and turns a signal, an early exit or silence into a crash report naming the step
// the child was at.
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "plugin/kernel_check.h"
#include "plugin/kernel_check_internal.h"
#include "core/grow.h"

// The child writes to one pipe: its progress lines, then "rows N\n" and N binary rows (the same
// binary on both ends), or "error MESSAGE\n" when the check itself fails (exit code 2).

static void child_main(int fd, const override_set *s, const ct_ops *builtin,
                       const kernel_check_shape *shape) {
    FILE *f = fdopen(fd, "w");
    if (!f) _exit(2);
    kernel_check_report r;
    ct_error err = {{0}};
    if (kernel_check_run(&r, s, builtin, shape, f, &err) != 0) {
        fprintf(f, "error %s\n", err.msg);
        fflush(f);
        _exit(2);
    }
    fprintf(f, "rows %d\n", r.n_rows);
    if (fwrite(r.rows, sizeof *r.rows, (size_t)r.n_rows, f) != (size_t)r.n_rows || fflush(f) != 0)
        _exit(2);
    // The plugin's own prints; the parent flushed before fork, so nothing is written twice.
    fflush(stdout);
    fflush(stderr);
    _exit(0);
}

static const char *signal_name(int sig, char *buf, size_t cap) {
    static const struct {
        int sig;
        const char *name;
    } names[] = {{SIGSEGV, "SIGSEGV"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
                 {SIGILL, "SIGILL"},   {SIGABRT, "SIGABRT"}, {SIGKILL, "SIGKILL"},
                 {SIGTERM, "SIGTERM"}, {SIGTRAP, "SIGTRAP"}, {SIGSYS, "SIGSYS"},
                 {SIGPIPE, "SIGPIPE"}, {SIGINT, "SIGINT"},   {SIGXCPU, "SIGXCPU"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].sig == sig) return names[i].name;
    snprintf(buf, cap, "signal %d", sig);
    return buf;
}

// Where the child was: "rope_hf forward (model case)" from its last progress line.
static void last_step(char *out, size_t cap, const char *buf, size_t len) {
    snprintf(out, cap, "kernel check (before the first op)");
    static const char tag[] = "checking ";
    for (size_t i = 0; i < len;) {
        const char *nl = memchr(buf + i, '\n', len - i);
        const size_t end = nl ? (size_t)(nl - buf) : len;
        const size_t n = end - i;
        if (n > sizeof tag && memcmp(buf + i, tag, sizeof tag - 1) == 0 && buf[end - 1] == ')')
            snprintf(out, cap, "%.*s case)", (int)(n - sizeof tag), buf + i + sizeof tag - 1);
        else if (n >= 5 && memcmp(buf + i, "rows ", 5) == 0)
            break; // binary rows follow
        i = end + 1;
    }
}

// Parses "rows N\n" + N rows or "error MSG\n" out of the child's output. 1: rows, 2: error
// message in err, 0: neither (the child did not finish), -1: out of memory.
static int parse_child(kernel_check_report *r, const char *buf, size_t len, ct_error *err) {
    for (size_t i = 0; i < len;) {
        const char *nl = memchr(buf + i, '\n', len - i);
        if (!nl) return 0;
        const size_t end = (size_t)(nl - buf), n_line = end - i;
        if (n_line > 5 && n_line < 20 && memcmp(buf + i, "rows ", 5) == 0) {
            char num[20];
            memcpy(num, buf + i + 5, n_line - 5);
            num[n_line - 5] = '\0';
            char *tail;
            const long n = strtol(num, &tail, 10);
            if (*tail || n < 0 || n > INT_MAX || len - (end + 1) != (size_t)n * sizeof *r->rows)
                return 0;
            r->rows = malloc(n ? (size_t)n * sizeof *r->rows : 1);
            if (!r->rows) return -1;
            memcpy(r->rows, nl + 1, (size_t)n * sizeof *r->rows);
            r->n_rows = (int)n;
            r->passed = true;
            for (int j = 0; j < r->n_rows; j++) r->passed = r->passed && r->rows[j].pass;
            return 1;
        }
        if (n_line >= 6 && memcmp(buf + i, "error ", 6) == 0) {
            ct_fail(err, "%.*s", (int)(n_line - 6), buf + i + 6);
            return 2;
        }
        i = end + 1;
    }
    return 0;
}

static pid_t wait_eintr(pid_t pid, int *status, int flags) {
    pid_t w;
    while ((w = waitpid(pid, status, flags)) < 0 && errno == EINTR) {
    }
    return w;
}

// Reads the child's output into *buf until EOF: 0. 1: the child said nothing for timeout_s
// (<= 0: no limit). -1: error.
static int read_child(int fd, double timeout_s, char **buf, size_t *len, ct_error *err) {
    size_t cap = 0;
    double deadline = ct_now_s() + timeout_s;
    for (;;) {
        int ms = -1;
        if (timeout_s > 0) {
            const double left = deadline - ct_now_s();
            if (left <= 0) return 1;
            ms = left * 1000 + 1 < INT_MAX ? (int)(left * 1000 + 1) : INT_MAX;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        const int rc = poll(&p, 1, ms);
        if (rc < 0 && errno != EINTR)
            return ct_fail(err, "kernel check: poll: %s", strerror(errno));
        if (rc <= 0) continue;
        // 64 KiB first, so a report takes few reads; doubled when full.
        if (grow_to((void **)buf, &cap, cap ? *len + 1 : 65536, 1) != 0)
            return ct_fail(err, "kernel check: out of memory");
        const ssize_t n = read(fd, *buf + *len, cap - *len);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n < 0) return ct_fail(err, "kernel check: read: %s", strerror(errno));
        if (n == 0) return 0;
        *len += (size_t)n;
        deadline = ct_now_s() + timeout_s;
    }
}

// After EOF the child is exiting; 1 if it is still there timeout_s later.
static int reap_child(pid_t pid, double timeout_s, int *status) {
    const double deadline = ct_now_s() + timeout_s;
    for (;;) {
        const pid_t w = wait_eintr(pid, status, WNOHANG);
        if (w == pid || w < 0) return 0;
        if (timeout_s > 0 && ct_now_s() > deadline) return 1;
        nanosleep(&(struct timespec){.tv_nsec = 5000000}, NULL);
    }
}

int kernel_check_isolated(kernel_check_report *r, const override_set *s, const ct_ops *builtin,
                          const kernel_check_shape *shape, double timeout_s, ct_error *err) {
    memset(r, 0, sizeof *r);
    if (kernel_check_validate_shape(shape, err) != 0) return -1;
    int fd[2];
    if (pipe(fd) != 0) return ct_fail(err, "kernel check: pipe: %s", strerror(errno));
    fflush(NULL); // else the child's copies of unwritten stdio buffers would be written twice
    const pid_t pid = fork();
    if (pid < 0) {
        const int e = errno;
        close(fd[0]), close(fd[1]);
        return ct_fail(err, "kernel check: fork: %s", strerror(e));
    }
    if (pid == 0) {
        close(fd[0]);
        child_main(fd[1], s, builtin, shape);
    }
    close(fd[1]);

    char *buf = NULL;
    size_t len = 0;
    int status = 0;
    int rc = read_child(fd[0], timeout_s, &buf, &len, err);
    close(fd[0]);
    if (rc == 0) rc = reap_child(pid, timeout_s, &status);
    if (rc != 0) {
        kill(pid, SIGKILL);
        wait_eintr(pid, &status, 0);
    }
    if (rc < 0) {
        free(buf);
        return -1;
    }
    const bool timed_out = rc == 1;
    // Exit code 0 comes with the rows, 2 with the check's own error.
    const int code = !timed_out && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    const int got = code == 0 || code == 2 ? parse_child(r, buf, len, err) : 0;
    if (got != 0 && (got != 1 || code == 0)) {
        free(buf);
        if (got == 1) return 0;
        kernel_check_free(r);
        return got < 0 ? ct_fail(err, "kernel check: out of memory") : -1;
    }
    kernel_check_free(r);
    char where[160], sig[32];
    last_step(where, sizeof where, buf, len);
    free(buf);
    r->crashed = true;
    r->passed = false;
    if (timed_out)
        snprintf(r->crash, sizeof r->crash, "%s: no answer after %g s", where, timeout_s);
    else if (WIFSIGNALED(status))
        snprintf(r->crash, sizeof r->crash, "%s: killed by %s", where,
                 signal_name(WTERMSIG(status), sig, sizeof sig));
    else
        snprintf(r->crash, sizeof r->crash, "%s: exited with code %d without finishing", where,
                 WEXITSTATUS(status));
    return 0;
}
