/* The test runner: runs the tests that the selectors on its command line pick (all of them by
 * default) on the device CLATTN_DEVICE selects, and ends with the line
 * `N passed, N failed, N skipped`.
 *
 *   clattn-tests [--list] [--suite [!]NAME]... [--tag [!]TAG]... [[!]FILTER]
 *
 * FILTER: the tests whose "suite.test" name contains it (or one of its '|'-separated parts);
 * !FILTER: the others. --suite NAME: the
 * suite of exactly that name (given more than once: any of them); --suite !NAME: not that suite.
 * --tag TAG: the tests that carry TAG (harness.h; given more than once: all of them);
 * --tag !TAG: those that do not. A test runs when it passes every selector given. --list prints
 * the names of the tests the selectors pick, one a line, and runs nothing. */
#include "harness.h"
#include "runtime/runtime.h"
#include "runtime/testing.h"
#include "ref.h"
#include "test_suites.h" /* CLATTN_TEST_SUITES, X(status) X(tensor) ..., from tests/meson.build */

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Every suite, in the order of tests/meson.build's list: its name there and its definition. */
#define X(name) extern const test_suite name##_suite;
CLATTN_TEST_SUITES
#undef X
typedef struct registered_suite {
    const char *name;
    const test_suite *suite;
} registered_suite;
#define X(name) {#name, &name##_suite},
static const registered_suite suites[] = {CLATTN_TEST_SUITES};
#undef X
enum { SUITE_COUNT = sizeof suites / sizeof suites[0] };

typedef struct tag_name {
    unsigned tag;
    const char *name;
} tag_name;
#define X(tag, name) {tag, name},
static const tag_name tag_names[] = {TEST_TAG_NAMES(X)};
#undef X

void test_fail_at(test_ctx *t, const char *file, int line, const char *fmt, ...) {
    int n = snprintf(t->message, sizeof t->message, "%s:%d: ", file, line);
    va_list args;
    va_start(args, fmt);
    vsnprintf(t->message + n, sizeof t->message - (size_t)n, fmt, args);
    va_end(args);
    t->failed = true;
}

void test_skip(test_ctx *t, const char *why) {
    snprintf(t->message, sizeof t->message, "%s", why);
    t->skipped = true;
}

bool test_is_pocl31_basic(test_ctx *t) {
    const clattn_device_desc *desc = clattn_env_device_desc(t->env);
    return strstr(desc->platform_name, "Portable Computing Language") &&
           strncmp(desc->name, "basic", 5) == 0 && strstr(desc->driver, "3.1");
}

test_saved_env test_env_set(const char *name, const char *value) {
    const char *old = getenv(name);
    test_saved_env s = {name, old ? strdup(old) : NULL};
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
    return s;
}

void test_env_restore(test_saved_env *s) {
    if (s->value)
        setenv(s->name, s->value, 1);
    else
        unsetenv(s->name);
    free(s->value);
    s->value = NULL;
}

bool test_platform_is(test_ctx *t, const char *name) {
    return strstr(clattn_env_device_desc(t->env)->platform_name, name) != NULL;
}

bool test_large_shapes(test_ctx *t) {
    (void)t;
    const char *small = getenv("CLATTN_TEST_SMALL");
    return !(small && *small && strcmp(small, "0") != 0);
}

static bool flag_set(const char *name) {
    const char *flag = getenv(name);
    return flag && *flag && strcmp(flag, "0") != 0;
}

bool test_under_uninit_checker(void) {
    return flag_set("CLATTN_TEST_UNINIT_CHECKER");
}

bool test_after_uninit_checker(void) {
    return flag_set("CLATTN_TEST_AFTER_UNINIT_CHECKER");
}

uint64_t test_rand_u64(uint64_t *state) {
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545F4914F6CDD1Dull;
}

float test_rand_uniform(uint64_t *state, float lo, float hi) {
    double u = (double)(test_rand_u64(state) >> 11) / 9007199254740992.0;
    return (float)(lo + (hi - lo) * u);
}

cl_mem test_buffer_whole(test_ctx *t, size_t bytes) {
    cl_int err;
    cl_mem m = clCreateBuffer(clattn_env_context(t->env), CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (err != CL_SUCCESS)
        test_fail_at(t, __FILE__, __LINE__, "clCreateBuffer(%zu): %d", bytes, err);
    return err == CL_SUCCESS ? m : NULL;
}

/* What a test may have changed in the library's choices, back to the library's own after each
 * test, so that a test that failed (CHECK returns at once) leaks none of its hooks, overrides,
 * fault sites or kernel trace (on, its events held) into the next. */
static void restore_library_choices(uint64_t narrow_index_limit) {
    for (int hook = 0; hook < CLATTN__HOOKS; ++hook) clattn__hook_set((clattn__hook)hook, -1);
    clattn__trace_kernels(true); /* drops what the trace held */
    clattn__trace_kernels(false);
    clattn__narrow_index_limit_set(narrow_index_limit);
    for (int site = 0; site < CLATTN__FAULT_SITES; ++site)
        clattn__fault_arm((clattn__fault_site)site, 0);
    clattn__tuning_set_test_row(NULL);
#define RESTORE_OVERRIDE(name, params, kernels) clattn_tuning_override(#name, NULL);
    CLATTN__TUNING_OPS(RESTORE_OVERRIDE)
#undef RESTORE_OVERRIDE
}

/* ---- canaries ---- */

/* Every test_buffer is the middle of a larger buffer whose guard regions, before and after,
 * hold CANARY bytes; after each test the runner reads them back (a write past either end of a
 * view fails the test, whatever the op's own checks saw) and releases the larger buffers. */
enum { CANARY = 0xA5, MAX_GUARDED = 4096 };
typedef struct guarded {
    cl_mem whole;
    size_t guard, bytes;
} guarded;
static guarded guarded_buffers[MAX_GUARDED];
static size_t guarded_count;
static pthread_mutex_t guarded_lock = PTHREAD_MUTEX_INITIALIZER;

/* The guard: at least 256 bytes, a multiple of the device's sub-buffer alignment. */
static size_t guard_bytes(test_ctx *t) {
    cl_uint align_bits = 1024;
    clGetDeviceInfo(clattn_env_device(t->env), CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align_bits,
                    &align_bits, NULL);
    const size_t align = align_bits / 8 ? align_bits / 8 : 1;
    return (256 + align - 1) / align * align;
}

cl_mem test_buffer(test_ctx *t, size_t bytes) {
    const size_t guard = guard_bytes(t), total = bytes + 2 * guard;
    pthread_mutex_lock(&guarded_lock);
    const bool room = guarded_count < MAX_GUARDED;
    pthread_mutex_unlock(&guarded_lock);
    /* Oclgrind checks every access against the buffer's own bounds, reads too, which guards
     * would hide; and its uninitialized-value checker loses what is written through a
     * sub-buffer (every attention test then reports uninitialized tiles) */
    if (bytes == 0 || !room || test_platform_is(t, "Oclgrind")) return test_buffer_whole(t, bytes);
    unsigned char *fill = malloc(total);
    if (!fill) return test_buffer_whole(t, bytes);
    memset(fill, CANARY, total);
    cl_int err;
    cl_mem whole = clCreateBuffer(clattn_env_context(t->env),
                                  CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, total, fill, &err);
    free(fill);
    if (err != CL_SUCCESS) {
        test_fail_at(t, __FILE__, __LINE__, "clCreateBuffer(%zu): %d", total, err);
        return NULL;
    }
    const cl_buffer_region region = {guard, bytes};
    cl_mem view =
        clCreateSubBuffer(whole, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &region, &err);
    if (err != CL_SUCCESS) {
        clReleaseMemObject(whole);
        test_fail_at(t, __FILE__, __LINE__, "clCreateSubBuffer(%zu at %zu): %d", bytes, guard, err);
        return NULL;
    }
    pthread_mutex_lock(&guarded_lock);
    guarded_buffers[guarded_count++] = (guarded){whole, guard, bytes};
    pthread_mutex_unlock(&guarded_lock);
    return view;
}

/* The first byte of the guard region at `origin` that is not CANARY, or -1. */
static long first_overwritten(test_ctx *t, cl_mem whole, size_t origin, size_t bytes) {
    unsigned char *seen = malloc(bytes);
    cl_int err = seen ? clEnqueueReadBuffer(clattn_env_queue(t->env), whole, CL_TRUE, origin, bytes,
                                            seen, 0, NULL, NULL)
                      : CL_OUT_OF_HOST_MEMORY;
    long at = err == CL_SUCCESS ? -1 : 0;
    for (size_t i = 0; err == CL_SUCCESS && i < bytes && at < 0; ++i)
        if (seen[i] != CANARY) at = (long)i;
    free(seen);
    return at;
}

bool test_wait_for(bool (*done)(void *), void *arg) {
    for (int i = 0; i < 100 && !done(arg); ++i) {
        struct timespec pause = {0, 10 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    return done(arg);
}

static bool scratch_back_to(void *baseline) {
    return clattn__scratch_live() <= *(const long *)baseline;
}

long test_scratch_left(long baseline) {
    test_wait_for(scratch_back_to, &baseline);
    return clattn__scratch_live() - baseline;
}

int test_canaries_overwritten(test_ctx *t, char *what, size_t capacity) {
    int broken = 0;
    pthread_mutex_lock(&guarded_lock);
    for (size_t i = 0; i < guarded_count; ++i) {
        const guarded *g = &guarded_buffers[i];
        const long before = first_overwritten(t, g->whole, 0, g->guard);
        const long after = first_overwritten(t, g->whole, g->guard + g->bytes, g->guard);
        if ((before >= 0 || after >= 0) && broken++ == 0)
            snprintf(what, capacity,
                     "the canary %s test buffer #%zu (%zu bytes) was overwritten, %ld bytes from "
                     "its %s",
                     before >= 0 ? "before" : "after", i, g->bytes,
                     before >= 0 ? (long)g->guard - before : after + 1,
                     before >= 0 ? "start" : "end");
        clReleaseMemObject(g->whole);
    }
    guarded_count = 0;
    pthread_mutex_unlock(&guarded_lock);
    return broken;
}

/* After a test: every guard intact, else the test fails naming the buffer and the byte. */
static void check_canaries(test_ctx *t) {
    char what[256];
    if (test_canaries_overwritten(t, what, sizeof what) && !t->failed)
        test_fail_at(t, __FILE__, __LINE__, "%s", what);
}

bool test_write(test_ctx *t, cl_mem buffer, const void *host, size_t bytes) {
    cl_int err = clEnqueueWriteBuffer(clattn_env_queue(t->env), buffer, CL_TRUE, 0, bytes, host, 0,
                                      NULL, NULL);
    if (err != CL_SUCCESS) test_fail_at(t, __FILE__, __LINE__, "clEnqueueWriteBuffer: %d", err);
    return err == CL_SUCCESS;
}

bool test_read(test_ctx *t, cl_mem buffer, void *host, size_t bytes) {
    cl_int err = clEnqueueReadBuffer(clattn_env_queue(t->env), buffer, CL_TRUE, 0, bytes, host, 0,
                                     NULL, NULL);
    if (err != CL_SUCCESS) test_fail_at(t, __FILE__, __LINE__, "clEnqueueReadBuffer: %d", err);
    return err == CL_SUCCESS;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* What the command line selects; a test runs when it passes every part that was given. */
typedef struct selection {
    const char *filter; /* a substring of "suite.test", or NULL */
    bool exclude;       /* !FILTER: the tests whose name does not contain it */
    bool want_suite[SUITE_COUNT], any_suite_wanted, skip_suite[SUITE_COUNT];
    unsigned tags, skip_tags; /* carries all of tags and none of skip_tags */
    bool list;
} selection;

static void usage(FILE *to) {
    fprintf(to, "usage: clattn-tests [--list] [--suite [!]NAME]... [--tag [!]TAG]... [[!]FILTER]\n"
                "suites:");
    for (size_t s = 0; s < SUITE_COUNT; ++s) fprintf(to, " %s", suites[s].name);
    fprintf(to, "\ntags:");
    for (size_t i = 0; i < sizeof tag_names / sizeof tag_names[0]; ++i)
        fprintf(to, " %s", tag_names[i].name);
    fprintf(to, "\n");
}

/* Fills `sel` from the arguments; false (after a message) for a malformed command line. */
static bool parse_args(int argc, char **argv, selection *sel) {
    for (int a = 1; a < argc; ++a) {
        const char *arg = argv[a];
        if (strcmp(arg, "--list") == 0) {
            sel->list = true;
        } else if (strcmp(arg, "--suite") == 0 || strcmp(arg, "--tag") == 0) {
            if (a + 1 >= argc) {
                fprintf(stderr, "clattn-tests: %s needs a name\n", arg);
                return false;
            }
            const char *value = argv[++a];
            const bool negate = value[0] == '!';
            value += negate;
            bool known = false;
            if (arg[2] == 's') {
                for (size_t s = 0; s < SUITE_COUNT; ++s)
                    if (strcmp(suites[s].name, value) == 0) {
                        known = true;
                        if (negate)
                            sel->skip_suite[s] = true;
                        else
                            sel->want_suite[s] = sel->any_suite_wanted = true;
                    }
            } else {
                for (size_t i = 0; i < sizeof tag_names / sizeof tag_names[0]; ++i)
                    if (strcmp(tag_names[i].name, value) == 0) {
                        known = true;
                        if (negate)
                            sel->skip_tags |= tag_names[i].tag;
                        else
                            sel->tags |= tag_names[i].tag;
                    }
            }
            if (!known) {
                fprintf(stderr, "clattn-tests: no %s named \"%s\"\n", arg + 2, value);
                usage(stderr);
                return false;
            }
        } else if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            usage(stdout);
            exit(0);
        } else if (arg[0] == '-' && arg[1] == '-') {
            fprintf(stderr, "clattn-tests: unknown option %s\n", arg);
            usage(stderr);
            return false;
        } else if (sel->filter) {
            fprintf(stderr, "clattn-tests: one FILTER at most (\"%s\", \"%s\")\n", sel->filter,
                    arg);
            return false;
        } else {
            sel->exclude = arg[0] == '!';
            sel->filter = arg + sel->exclude;
        }
    }
    return true;
}

/* Whether `full` contains one of the '|'-separated parts of `filter`. */
static bool names_match(const char *full, const char *filter) {
    for (const char *part = filter;; ++part) {
        const char *bar = strchr(part, '|');
        const size_t n = bar ? (size_t)(bar - part) : strlen(part);
        for (const char *at = full; *at; ++at)
            if (strncmp(at, part, n) == 0) return true;
        if (!bar) return false;
        part = bar;
    }
}

static bool selected(const selection *sel, size_t s, const test_case *c, const char *full) {
    const unsigned tags = c->tags | suites[s].suite->tags;
    if (sel->any_suite_wanted && !sel->want_suite[s]) return false;
    if (sel->skip_suite[s]) return false;
    if ((tags & sel->tags) != sel->tags || (tags & sel->skip_tags)) return false;
    return !sel->filter || !names_match(full, sel->filter) == sel->exclude;
}

/* A suite whose SUITE() label is not its name in tests/meson.build would be selected by one
 * name and printed with the other. */
static bool suites_consistent(void) {
    for (size_t s = 0; s < SUITE_COUNT; ++s)
        if (strcmp(suites[s].name, suites[s].suite->name) != 0) {
            fprintf(stderr,
                    "clattn-tests: %s_suite is labelled \"%s\"; its SUITE() label must be its "
                    "name in tests/meson.build\n",
                    suites[s].name, suites[s].suite->name);
            return false;
        }
    return true;
}

int main(int argc, char **argv) {
    selection sel = {0};
    if (!suites_consistent() || !parse_args(argc, argv, &sel)) return 2;
    if (sel.list) {
        for (size_t s = 0; s < SUITE_COUNT; ++s)
            for (size_t i = 0; i < suites[s].suite->count; ++i) {
                char full[256];
                snprintf(full, sizeof full, "%s.%s", suites[s].name,
                         suites[s].suite->cases[i].name);
                if (selected(&sel, s, &suites[s].suite->cases[i], full)) printf("%s\n", full);
            }
        return 0;
    }
    int passed = 0, failed = 0, skipped = 0;
    clattn_env *env = NULL;
    int status = clattn_env_create(NULL, &env);
    if (status != CLATTN_SUCCESS) {
        /* No device is a failure, not a pass: CI must run on a real OpenCL implementation. */
        printf("FAIL setup: no device (%s): %s\n", clattn_status_name(status), clattn_last_error());
        printf("0 passed, 1 failed, 0 skipped\n");
        return 1;
    }
    const clattn_device_desc *desc = clattn_env_device_desc(env);
    printf("device: %s / %s (%s, driver %s)\n", desc->platform_name, desc->name, desc->version,
           desc->driver);
    fflush(stdout);
    const uint64_t narrow_index_limit = clattn__narrow_index_limit(); /* the library's own */
    for (size_t s = 0; s < SUITE_COUNT; ++s) {
        const test_suite *suite = suites[s].suite;
        for (size_t i = 0; i < suite->count; ++i) {
            char full[256];
            snprintf(full, sizeof full, "%s.%s", suite->name, suite->cases[i].name);
            if (!selected(&sel, s, &suite->cases[i], full)) continue;
            test_ctx t = {env, false, false, ""};
            double start = now_ms();
            suite->cases[i].fn(&t);
            clFinish(clattn_env_queue(env));
            check_canaries(&t);
            restore_library_choices(narrow_index_limit);
            double ms = now_ms() - start;
            if (t.failed) {
                ++failed;
                printf("FAIL %s (%.0f ms): %s\n", full, ms, t.message);
            } else if (t.skipped) {
                ++skipped;
                printf("skip %s: %s\n", full, t.message);
            } else {
                ++passed;
                printf("ok   %s (%.0f ms)\n", full, ms);
            }
            fflush(stdout);
        }
    }
    clattn_env_release(env);
    clattn_cache_clear(NULL);
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed ? 1 : 0;
}

void test_fill_exact(float *x, size_t n, clattn_dtype dt, uint64_t *rng) {
    for (size_t i = 0; i < n; ++i) {
        uint16_t bits[2];
        ref_store(bits, dt, 0, test_rand_uniform(rng, -2.0f, 2.0f));
        x[i] = ref_load(bits, dt, 0);
    }
}

/* A device tensor [B,H,S,D] holding `host` in dtype dt, laid out as harness.h says. */
clattn_tensor test_upload_bhsd(test_ctx *t, const float *host, int64_t B, int64_t H, int64_t S,
                               int64_t D, clattn_dtype dt, int bshd) {
    static const int swap[4] = {0, 2, 1, 3}, transpose[4] = {0, 1, 3, 2};
    clattn_tensor v =
        bshd == 1   ? clattn_tensor_permute(clattn_tensor_4d(NULL, dt, B, S, H, D), swap)
        : bshd == 2 ? clattn_tensor_permute(clattn_tensor_4d(NULL, dt, B, H, D, S), transpose)
                    : clattn_tensor_4d(NULL, dt, B, H, S, D);
    if (bshd == 3) v.offset = 1;
    size_t n = (size_t)(B * H * S * D) + v.offset;
    void *stored = malloc(n * 4);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
            for (int64_t s = 0; s < S; ++s)
                for (int64_t d = 0; d < D; ++d)
                    ref_store(stored, dt,
                              v.offset + (uint64_t)(b * v.strides[0] + h * v.strides[1] +
                                                    s * v.strides[2] + d * v.strides[3]),
                              host[(size_t)(((b * H + h) * S + s) * D + d)]);
    v.buffer = test_buffer(t, n * clattn_dtype_size(dt));
    if (v.buffer) test_write(t, v.buffer, stored, n * clattn_dtype_size(dt));
    free(stored);
    return v;
}
