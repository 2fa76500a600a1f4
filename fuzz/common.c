/* What the fuzz targets share (common.h). */
#define _XOPEN_SOURCE 700 /* putenv */
#include "common.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- signals ---- */

static const int crash_signals[] = {SIGABRT, SIGSEGV, SIGILL, SIGBUS};
static struct sigaction saved_actions[sizeof crash_signals / sizeof crash_signals[0]];
static bool saved;

static void save_signals(void) {
    for (size_t i = 0; !saved && i < sizeof crash_signals / sizeof crash_signals[0]; ++i)
        sigaction(crash_signals[i], NULL, &saved_actions[i]);
    saved = true;
}

void fuzz_restore_signals(void) {
    for (size_t i = 0; saved && i < sizeof crash_signals / sizeof crash_signals[0]; ++i)
        sigaction(crash_signals[i], &saved_actions[i], NULL);
}

clattn_env *fuzz_env(void) {
    static clattn_env *env;
    if (!env) {
        save_signals();
        int status = clattn_env_create(NULL, &env);
        fuzz_restore_signals();
        if (status != CLATTN_SUCCESS) {
            fprintf(stderr, "fuzz: no device (CLATTN_DEVICE=%s): %s: %s\n",
                    getenv("CLATTN_DEVICE") ? getenv("CLATTN_DEVICE") : "(unset)",
                    clattn_status_name(status), clattn_last_error());
            exit(1);
        }
    }
    return env;
}

void fuzz_fail(const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    fputs("fuzz invariant broken: ", stderr);
    vfprintf(stderr, fmt, args);
    fputc('\n', stderr);
    va_end(args);
    abort();
}

void fuzz_expect(int status, const char *call, const int *allowed, size_t count) {
    if (status == CLATTN_SUCCESS) return;
    if (strncmp(clattn_status_name(status), "CLATTN_ERR_", 11) != 0)
        fuzz_fail("%s -> %d (%s), not a CLATTN_ERR_* status: %s", call, status,
                  clattn_status_name(status), clattn_last_error());
    if (!clattn_last_error()[0])
        fuzz_fail("%s -> %s with an empty clattn_last_error()", call, clattn_status_name(status));
    for (size_t i = 0; i < count; ++i)
        if (status == allowed[i]) return;
    fuzz_fail("%s -> %s, which it does not return for this input: %s", call,
              clattn_status_name(status), clattn_last_error());
}

/* ---- environment variables ---- */

#define FUZZ_MAX_VARS  4
#define FUZZ_VAR_BYTES 8192

static struct fuzz_var {
    const char *name;
    char *saved; /* the value at start (malloc'ed), NULL when unset */
    char buffer[FUZZ_VAR_BYTES];
} vars[FUZZ_MAX_VARS];

static struct fuzz_var *find_var(const char *name) {
    for (int i = 0; i < FUZZ_MAX_VARS; ++i) {
        if (!vars[i].name) {
            const char *start = getenv(name);
            vars[i].name = name;
            vars[i].saved = start ? strdup(start) : NULL;
            return &vars[i];
        }
        if (strcmp(vars[i].name, name) == 0) return &vars[i];
    }
    fuzz_fail("fuzz_setenv: more than %d variables", FUZZ_MAX_VARS);
}

void fuzz_setenv(const char *name, const char *value) {
    struct fuzz_var *v = find_var(name);
    if (!value) {
        unsetenv(name);
        return;
    }
    snprintf(v->buffer, sizeof v->buffer, "%s=%s", name, value);
    putenv(v->buffer);
}

void fuzz_restore_env(const char *name) {
    fuzz_setenv(name, find_var(name)->saved);
}

/* ---- input ---- */

uint8_t fuzz_u8(fuzz_reader *r) {
    if (r->size == 0) return 0;
    --r->size;
    return *r->data++;
}

int64_t fuzz_i64(fuzz_reader *r) {
    uint8_t b = fuzz_u8(r);
    if (b < 0xc0) return (int64_t)b - 16;
    if (b < 0xff) { /* 2^0 .. 2^62, minus one, itself, or plus one */
        int64_t p = (int64_t)1 << (b - 0xc0);
        return p + (int64_t)(fuzz_u8(r) % 3) - 1;
    }
    uint64_t raw = 0;
    for (int i = 0; i < 8; ++i) raw |= (uint64_t)fuzz_u8(r) << (8 * i);
    return (int64_t)raw;
}
