/*
 * Whole files written through a temporary name and a rename.
 */
#include "files.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static bool write_all(int fd, const unsigned char *data, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, data, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        data += w;
        n -= (size_t)w;
    }
    return true;
}

/* Distinguishes the temporary files of threads of one process (the pid, processes). */
static atomic_ulong temp_counter;

/* strerror's text, thread-safely (the library's calls come from any thread). */
static void error_text(int code, char *buffer, size_t capacity) {
    if (strerror_r(code, buffer, capacity) != 0) snprintf(buffer, capacity, "errno %d", code);
}

bool clattn__write_file(const char *path, const void *data, size_t size, char *why,
                        size_t why_size) {
    const size_t n = strlen(path) + 64;
    char *temp = malloc(n);
    if (!temp) {
        snprintf(why, why_size, "out of memory");
        return false;
    }
    snprintf(temp, n, "%s.tmp.%ld.%lu", path, (long)getpid(), atomic_fetch_add(&temp_counter, 1));
    bool ok = false;
    const int fd = open(temp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        error_text(errno, why, why_size);
    } else {
        const bool written = write_all(fd, data, size);
        const int saved = errno;
        if (close(fd) != 0 || !written)
            error_text(written ? errno : saved, why, why_size);
        else if (rename(temp, path) != 0)
            error_text(errno, why, why_size);
        else
            ok = true;
        if (!ok) unlink(temp);
    }
    free(temp);
    return ok;
}
