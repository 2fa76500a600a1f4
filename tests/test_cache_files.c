/* Program files: binaries (src/runtime/program_binary.c) through clattn_cache_export and
 * clattn_cache_import, damaged and foreign blobs, the on-disk cache CLATTN_CACHE_DIR filled by
 * two processes at once; and the program dump CLATTN_DUMP_PROGRAMS (program_dump.c). */
#include "harness.h"
#include "runtime/testing.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* ---- helpers ---- */

enum { R = 3, C = 37 };

/* Two programs: a transpose (heads.cl) of `a` into `b` and a softmax (softmax.cl) of `a` into
 * `c`, each checked. False (the test failed) on a status or a wrong value. */
static bool run_ops_on(test_ctx *t, cl_mem a, cl_mem b, cl_mem c) {
    float in[R * C], out[R * C], y[R * C];
    uint64_t rng = 11;
    for (int i = 0; i < R * C; ++i) in[i] = test_rand_uniform(&rng, -2.0f, 2.0f);
    if (!test_write(t, a, in, sizeof in)) return false;
    cl_command_queue q = clattn_env_queue(t->env);
    static const int swap[4] = {0, 1, 3, 2};
    clattn_tensor src = clattn_tensor_permute(clattn_tensor_4d(a, CLATTN_F32, 1, 1, R, C), swap);
    clattn_tensor dst = clattn_tensor_4d(b, CLATTN_F32, 1, 1, C, R);
    clattn_tensor x = clattn_tensor_4d(a, CLATTN_F32, 1, 1, R, C);
    clattn_tensor sm = clattn_tensor_4d(c, CLATTN_F32, 1, 1, R, C);
    int status = clattn_copy(&src, NULL, &dst, q, 0, NULL, NULL);
    if (status == CLATTN_SUCCESS)
        status = clattn_softmax(&x, 0.5f, NULL, &sm, NULL, q, 0, NULL, NULL);
    if (status != CLATTN_SUCCESS) {
        test_fail_at(t, __FILE__, __LINE__, "op -> %s: %s", clattn_status_name(status),
                     clattn_last_error());
        return false;
    }
    if (!test_read(t, b, out, sizeof out) || !test_read(t, c, y, sizeof y)) return false;
    for (int r = 0; r < R; ++r) {
        double max = -INFINITY, sum = 0;
        for (int j = 0; j < C; ++j) max = fmax(max, 0.5 * in[r * C + j]);
        for (int j = 0; j < C; ++j) sum += exp(0.5 * in[r * C + j] - max);
        for (int j = 0; j < C; ++j) {
            const double want = exp(0.5 * in[r * C + j] - max) / sum;
            if (out[j * R + r] != in[r * C + j] || fabs(y[r * C + j] - want) > 1e-6 + 1e-5 * want) {
                test_fail_at(t, __FILE__, __LINE__,
                             "row %d col %d: transpose %g (want %g), softmax %g (want %g)", r, j,
                             out[j * R + r], in[r * C + j], y[r * C + j], want);
                return false;
            }
        }
    }
    return true;
}

static bool run_ops(test_ctx *t) {
    const size_t bytes = sizeof(float) * R * C;
    cl_mem a = test_buffer(t, bytes), b = test_buffer(t, bytes), c = test_buffer(t, bytes);
    const bool ok = a && b && c && run_ops_on(t, a, b, c);
    cl_mem views[3] = {a, b, c};
    for (int i = 0; i < 3; ++i)
        if (views[i]) clReleaseMemObject(views[i]);
    return ok;
}

static size_t stat_builds(void) {
    size_t builds;
    clattn_cache_stats(NULL, &builds, NULL);
    return builds;
}

static size_t stat_programs(void) {
    size_t programs;
    clattn_cache_stats(&programs, NULL, NULL);
    return programs;
}

/* The programs cached for the test env, exported (malloc'ed; NULL and *size 0 when none). */
static unsigned char *export_env(test_ctx *t, size_t *size) {
    *size = 0;
    cl_context ctx = clattn_env_context(t->env);
    cl_device_id dev = clattn_env_device(t->env);
    if (clattn_cache_export(ctx, dev, NULL, 0, size) != CLATTN_SUCCESS || *size == 0) return NULL;
    unsigned char *blob = malloc(*size);
    if (blob && clattn_cache_export(ctx, dev, blob, *size, size) != CLATTN_SUCCESS) {
        free(blob);
        blob = NULL;
    }
    return blob;
}

/* How many programs `data` gives a context of its own on the device under test (cleared after):
 * a blob or cache file is valid when this counts its entries. -1 when no context. */
static long imports_elsewhere(test_ctx *t, const void *data, size_t size) {
    cl_device_id device = clattn_env_device(t->env);
    cl_int err;
    cl_context other = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
    if (err != CL_SUCCESS) return -1;
    size_t imported = 0;
    int status = clattn_cache_import(other, device, data, size, &imported);
    clattn_cache_clear(other);
    clReleaseContext(other);
    return status == CLATTN_SUCCESS ? (long)imported : -1;
}

/* The layout of src/runtime/program_binary.c: a header of 52 bytes with six u32 string lengths at
 * 28 (op file, options, platform, device, driver, device version), the binary's u64 size at 20 and
 * the text hash at 12, then the strings, the binary, and an FNV-1a 64 checksum. */
enum { HEADER = 52 };
static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = v << 8 | p[i];
    return v;
}
typedef struct span {
    size_t string_at[6], binary_at, binary_size, bytes;
} span;
static span entry_span(const unsigned char *e) {
    span s;
    size_t at = HEADER;
    for (int i = 0; i < 6; ++i) {
        s.string_at[i] = at;
        at += get_u32(e + 28 + 4 * i);
    }
    s.binary_at = at;
    s.binary_size = (size_t)get_u64(e + 20);
    s.bytes = at + s.binary_size + 8;
    return s;
}
/* Writes a valid checksum after an edit, so that only the edited field is wrong. */
static void reseal(unsigned char *e, span s) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i + 8 < s.bytes; ++i) h = (h ^ e[i]) * 1099511628211ull;
    for (int i = 0; i < 8; ++i) e[s.bytes - 8 + i] = (unsigned char)(h >> (8 * i));
}

/* Warnings the library sent while a test watched (skipped entries, unusable cache files). */
typedef struct warnings {
    int count;
    char last[512];
} warnings;
static void collect_warning(int status, const char *message, void *user) {
    warnings *w = user;
    if (status != CLATTN_SUCCESS) return;
    ++w->count;
    snprintf(w->last, sizeof w->last, "%s", message);
}

static bool make_temp_dir(char *dir, size_t capacity) {
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, capacity, "%s/clattn-cache-files-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    return mkdtemp(dir) != NULL;
}

/* Removes the files in `dir` (one level), then `dir`. */
static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    if (d) closedir(d);
    rmdir(dir);
}

static unsigned char *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    unsigned char *data = NULL;
    long n = -1;
    if (f && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (data = malloc((size_t)n + 1)) && fread(data, 1, (size_t)n, f) != (size_t)n) {
        free(data);
        data = NULL;
    }
    if (f) fclose(f);
    *size = data ? (size_t)n : 0;
    return data;
}

static bool write_file(const char *path, const unsigned char *data, size_t size) {
    FILE *f = fopen(path, "wb");
    bool ok = f && fwrite(data, 1, size, f) == size;
    if (f && fclose(f) != 0) ok = false;
    return ok;
}

/* What a cache dir holds: its .clbin files (names in `names`, up to 8), the ones that import
 * alone into a fresh context (valid), and any other file (a leftover temporary). */
typedef struct dir_files {
    int clbin, valid, other;
    char names[8][1024];
    char first_other[256];
} dir_files;
static dir_files list_cache_dir(test_ctx *t, const char *dir) {
    dir_files f = {0, 0, 0, {{0}}, ""};
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        const size_t n = strlen(e->d_name);
        if (n != 22 || strcmp(e->d_name + 16, ".clbin") != 0) {
            if (!f.other++) snprintf(f.first_other, sizeof f.first_other, "%s", e->d_name);
            continue;
        }
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (f.clbin < 8) snprintf(f.names[f.clbin], sizeof f.names[0], "%s", path);
        ++f.clbin;
        size_t size;
        unsigned char *data = read_file(path, &size);
        if (data && imports_elsewhere(t, data, size) == 1) ++f.valid;
        free(data);
    }
    if (d) closedir(d);
    return f;
}

/* Export with nothing to export: a driver without program binaries skips these tests. */
static bool binaries_unsupported(test_ctx *t) {
    clattn_cache_clear(NULL);
    if (!run_ops(t)) return true;
    size_t size = 0;
    int status =
        clattn_cache_export(clattn_env_context(t->env), clattn_env_device(t->env), NULL, 0, &size);
    if (status == CLATTN_SUCCESS && size == 0)
        test_skip(t, "the driver gives no program binaries (CL_PROGRAM_BINARY_SIZES is 0)");
    else if (status != CLATTN_SUCCESS)
        test_fail_at(t, __FILE__, __LINE__, "export -> %s: %s", clattn_status_name(status),
                     clattn_last_error());
    return status != CLATTN_SUCCESS || size == 0;
}

/* ---- export and import ---- */

static void export_clear_import_builds_nothing(test_ctx *t) {
    if (binaries_unsupported(t)) return;
    size_t size;
    unsigned char *blob = export_env(t, &size);
    CHECK(t, blob, "export failed: %s", clattn_last_error());
    const size_t programs = stat_programs();
    clattn_cache_clear(clattn_env_context(t->env));
    size_t imported = 0;
    int status = clattn_cache_import(clattn_env_context(t->env), clattn_env_device(t->env), blob,
                                     size, &imported);
    free(blob);
    CHECK_OK(t, status);
    CHECK(t, imported == programs && stat_programs() == programs,
          "%zu of %zu programs imported, %zu cached", imported, programs, stat_programs());
    const size_t builds = stat_builds();
    if (!run_ops(t)) return;
    CHECK(t, stat_builds() == builds, "the ops built %zu programs after the import",
          stat_builds() - builds);
    CHECK(t, stat_programs() == programs, "%zu programs, %zu before", stat_programs(), programs);
}

static void export_size_query_and_a_small_buffer(test_ctx *t) {
    if (binaries_unsupported(t)) return;
    cl_context ctx = clattn_env_context(t->env);
    cl_device_id dev = clattn_env_device(t->env);
    size_t needed = 0, size = 0;
    CHECK_OK(t, clattn_cache_export(ctx, dev, NULL, 12345, &needed));
    unsigned char *blob = malloc(needed);
    CHECK(t, blob, "no memory");
    memset(blob, 0x5A, needed);
    int small = clattn_cache_export(ctx, dev, blob, needed - 1, &size);
    bool untouched = true;
    for (size_t i = 0; i < needed; ++i) untouched = untouched && blob[i] == 0x5A;
    size_t exact = 0;
    int status = clattn_cache_export(ctx, dev, blob, needed, &exact);
    free(blob);
    CHECK(t, small == CLATTN_ERR_BUFFER_TOO_SMALL && size == needed && untouched,
          "capacity %zu of %zu -> %s, *size %zu, buffer %s", needed - 1, needed,
          clattn_status_name(small), size, untouched ? "untouched" : "written");
    CHECK_OK(t, status);
    CHECK(t, exact == needed, "wrote %zu bytes of %zu", exact, needed);
    CHECK_STATUS(t, clattn_cache_export(NULL, dev, NULL, 0, &size), CLATTN_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(t, clattn_cache_export(ctx, NULL, NULL, 0, &size), CLATTN_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(t, clattn_cache_export(ctx, dev, NULL, 0, NULL), CLATTN_ERR_INVALID_ARGUMENT);
    /* a context with nothing cached exports nothing */
    cl_int err;
    cl_context other = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
    CHECK(t, err == CL_SUCCESS, "clCreateContext: %d", err);
    size = 99;
    status = clattn_cache_export(other, dev, NULL, 0, &size);
    clReleaseContext(other);
    CHECK(t, status == CLATTN_SUCCESS && size == 0, "empty cache -> %s, %zu bytes",
          clattn_status_name(status), size);
}

/* Imports a damaged copy of `blob`: `expect` programs load, the warning names `reason`, and the
 * ops then build what was skipped and give the right results. */
static void import_damaged(test_ctx *t, const unsigned char *blob, size_t size, size_t expect,
                           const char *reason, const char *what) {
    clattn_cache_clear(clattn_env_context(t->env));
    warnings w = {0, ""};
    clattn_set_log_callback(collect_warning, &w);
    size_t imported = 99;
    int status = clattn_cache_import(clattn_env_context(t->env), clattn_env_device(t->env), blob,
                                     size, &imported);
    clattn_set_log_callback(NULL, NULL);
    CHECK(t, status == CLATTN_SUCCESS && imported == expect,
          "%s: import -> %s, %zu imported, %zu expected: %s", what, clattn_status_name(status),
          imported, expect, clattn_last_error());
    CHECK(t, w.count >= 1 && strstr(w.last, reason), "%s: warning \"%s\", wanted one with \"%s\"",
          what, w.last, reason);
    const size_t programs = stat_programs(), builds = stat_builds();
    if (!run_ops(t)) return;
    CHECK(t, stat_builds() == builds + (2 - programs), "%s: %zu builds, %zu programs were cached",
          what, stat_builds() - builds, programs);
}

/* Whether the driver returns from clCreateProgramWithBinary on a binary it did not write, asked
 * of tests/probes/foreign_binary.c in a child process, since some crash (Mesa 22.3's rusticl
 * aborts). clattn's own checks hand a driver only binaries of its identity and source text, so
 * this matters only to the test that hands it a foreign one. */
static bool driver_survives_foreign_binaries(test_ctx *t) {
    char platform_name[256] = "", device_name[256] = "";
    cl_platform_id platform = NULL;
    cl_device_id device = clattn_env_device(t->env);
    clGetDeviceInfo(device, CL_DEVICE_PLATFORM, sizeof platform, &platform, NULL);
    clGetPlatformInfo(platform, CL_PLATFORM_NAME, sizeof platform_name, platform_name, NULL);
    clGetDeviceInfo(device, CL_DEVICE_NAME, sizeof device_name, device_name, NULL);
    char *argv[] = {"probe-foreign-binary", platform_name, device_name, NULL};
    pid_t pid;
    int status = 0;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    const bool ran =
        posix_spawn(&pid, CLATTN_PROBE_FOREIGN_BINARY, &actions, NULL, argv, environ) == 0 &&
        waitpid(pid, &status, 0) == pid;
    posix_spawn_file_actions_destroy(&actions);
    /* a probe that could not run (no such device in a child) says nothing against the driver */
    return !ran || !WIFSIGNALED(status);
}

static void damaged_or_foreign_entries_are_skipped(test_ctx *t) {
    if (binaries_unsupported(t)) return;
    size_t size;
    unsigned char *blob = export_env(t, &size), *copy = blob ? malloc(size) : NULL;
    CHECK(t, blob && copy, "export failed: %s", clattn_last_error());
    const span first = entry_span(blob);
    CHECK(t, stat_programs() == 2 && first.bytes < size && first.binary_size > 16,
          "%zu programs, first entry %zu of %zu bytes", stat_programs(), first.bytes, size);
    /* cut anywhere: the entries before the cut load */
    import_damaged(t, blob, size - 1, 1, "hold no entry", "cut by a byte");
    if (t->failed) goto done;
    import_damaged(t, blob, first.bytes + HEADER, 1, "hold no entry", "cut in the second header");
    if (t->failed) goto done;
    import_damaged(t, blob, first.bytes / 2, 0, "hold no entry", "cut in the first binary");
    if (t->failed) goto done;
    /* one byte of a binary: the checksum */
    memcpy(copy, blob, size);
    copy[first.binary_at + first.binary_size / 2] ^= 0x10;
    import_damaged(t, copy, size, 1, "checksum", "a flipped binary byte");
    if (t->failed) goto done;
    /* another driver version, with a valid checksum */
    memcpy(copy, blob, size);
    CHECK(t, first.string_at[5] > first.string_at[4], "the entry names no driver version");
    unsigned char *driver = copy + first.string_at[4];
    *driver = *driver == 'Z' ? 'Y' : 'Z';
    reseal(copy, first);
    import_damaged(t, copy, size, 1, "another device or driver", "another driver");
    if (t->failed) goto done;
    /* another source text (another clattn version), with a valid checksum */
    memcpy(copy, blob, size);
    copy[12] ^= 1;
    reseal(copy, first);
    import_damaged(t, copy, size, 1, "another source text", "another source text");
    if (t->failed) goto done;
    /* a binary the driver refuses (its checksum valid); not under Oclgrind, whose --check-api
     * reports the refusal (CL_INVALID_BINARY) as a runtime error, which its lane counts, nor on
     * a driver that crashes on a binary it did not write */
    if (test_platform_is(t, "Oclgrind")) goto done;
    if (!driver_survives_foreign_binaries(t)) {
        test_skip(t, "the other cases passed; the driver crashes on a binary it did not write "
                     "(tests/probes/foreign_binary.c), so none is handed to it");
        goto done;
    }
    memcpy(copy, blob, size);
    memset(copy + first.binary_at, 0x7F, first.binary_size);
    reseal(copy, first);
    import_damaged(t, copy, size, 1, "refuses its binary", "a binary of 0x7F bytes");
done:
    free(copy);
    free(blob);
}

static void garbage_empty_and_null_blobs(test_ctx *t) {
    cl_context ctx = clattn_env_context(t->env);
    cl_device_id dev = clattn_env_device(t->env);
    clattn_cache_clear(NULL);
    unsigned char junk[4096];
    uint64_t rng = 3;
    size_t imported = 99;
    for (int round = 0; round < 64; ++round) {
        const size_t n = (size_t)(test_rand_u64(&rng) % sizeof junk);
        for (size_t i = 0; i < n; ++i) junk[i] = (unsigned char)test_rand_u64(&rng);
        if (round % 2 && n >= 8) memcpy(junk, "CLATTNPB", 8); /* past the magic, then garbage */
        if (round % 4 == 1 && n >= 52) /* a first version, small lengths that may fit */
            for (int i = 8; i < 52; ++i) junk[i] = i == 8 ? 1 : i % 4 == 0 ? junk[i] % 8 : 0;
        CHECK_OK(t, clattn_cache_import(ctx, dev, junk, n, &imported));
        CHECK(t, imported == 0, "round %d: %zu imported from garbage", round, imported);
    }
    CHECK_OK(t, clattn_cache_import(ctx, dev, junk, 0, &imported));
    CHECK(t, imported == 0, "%zu imported from nothing", imported);
    CHECK_OK(t, clattn_cache_import(ctx, dev, junk, 7, NULL));
    CHECK_STATUS(t, clattn_cache_import(ctx, dev, NULL, 10, &imported),
                 CLATTN_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(t, clattn_cache_import(NULL, dev, junk, 10, &imported),
                 CLATTN_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(t, clattn_cache_import(ctx, NULL, junk, 10, &imported),
                 CLATTN_ERR_INVALID_ARGUMENT);
    CHECK(t, stat_programs() == 0, "%zu programs cached from garbage", stat_programs());
    run_ops(t);
}

/* ---- the on-disk cache ---- */

static void disk_cache_is_written_then_loaded(test_ctx *t) {
    char dir[512];
    CHECK(t, make_temp_dir(dir, sizeof dir), "mkdtemp: %s", strerror(errno));
    test_saved_env env = test_env_set("CLATTN_CACHE_DIR", dir);
    clattn_cache_clear(NULL);
    const size_t builds = stat_builds();
    bool ok = run_ops(t);
    const size_t built = stat_builds() - builds;
    dir_files files = list_cache_dir(t, dir);
    clattn_cache_clear(NULL);
    const size_t before = stat_builds();
    ok = ok && run_ops(t);
    const size_t rebuilt = stat_builds() - before, programs = stat_programs();
    test_env_restore(&env);
    remove_dir(dir);
    if (!ok) return;
    if (files.clbin == 0 && files.other == 0)
        return test_skip(t, "the driver gives no program binaries");
    CHECK(t, built == 2, "%zu builds on an empty cache dir", built);
    CHECK(t, files.clbin == 2 && files.valid == 2 && files.other == 0,
          "%d .clbin files (%d valid) and %d others (%s) for 2 programs", files.clbin, files.valid,
          files.other, files.first_other);
    CHECK(t, rebuilt == 0 && programs == 2, "after a clear: %zu builds, %zu programs", rebuilt,
          programs);
}

static void damaged_cache_files_are_misses_and_rewritten(test_ctx *t) {
    char dir[512];
    CHECK(t, make_temp_dir(dir, sizeof dir), "mkdtemp: %s", strerror(errno));
    test_saved_env env = test_env_set("CLATTN_CACHE_DIR", dir);
    clattn_cache_clear(NULL);
    bool ok = run_ops(t);
    dir_files files = list_cache_dir(t, dir);
    size_t sizes[2] = {0, 0};
    bool damaged = files.clbin == 2;
    for (int i = 0; damaged && i < 2; ++i) {
        unsigned char *data = read_file(files.names[i], &sizes[i]);
        if (data && i == 0) data[sizes[i] / 2] ^= 0x01; /* one byte */
        damaged = data && write_file(files.names[i], data, i == 0 ? sizes[i] : sizes[i] / 3);
        free(data);
    }
    clattn_cache_clear(NULL);
    warnings w = {0, ""};
    clattn_set_log_callback(collect_warning, &w);
    const size_t builds = stat_builds();
    ok = ok && damaged && run_ops(t);
    clattn_set_log_callback(NULL, NULL);
    const size_t rebuilt = stat_builds() - builds;
    dir_files after = list_cache_dir(t, dir);
    size_t new_sizes[2] = {0, 0};
    for (int i = 0; i < 2; ++i) free(read_file(files.names[i], &new_sizes[i]));
    test_env_restore(&env);
    remove_dir(dir);
    if (!ok && !t->failed) {
        if (files.clbin == 0) return test_skip(t, "the driver gives no program binaries");
        CHECK(t, false, "%d cache files, damaging them %s", files.clbin,
              damaged ? "worked" : "failed");
    }
    if (!ok) return;
    CHECK(t, rebuilt == 2, "%zu builds with both files damaged", rebuilt);
    CHECK(t, w.count >= 2 && strstr(w.last, "truncated or corrupt"), "%d warnings, last \"%s\"",
          w.count, w.last);
    CHECK(t, after.clbin == 2 && after.valid == 2 && after.other == 0,
          "after the rebuild: %d .clbin (%d valid), %d others (%s)", after.clbin, after.valid,
          after.other, after.first_other);
    CHECK(t, new_sizes[0] == sizes[0] && new_sizes[1] == sizes[1],
          "rewritten files of %zu and %zu bytes, %zu and %zu before", new_sizes[0], new_sizes[1],
          sizes[0], sizes[1]);
}

static void unusable_cache_dirs_do_not_fail_ops(test_ctx *t) {
    char dir[512], path[600];
    CHECK(t, make_temp_dir(dir, sizeof dir), "mkdtemp: %s", strerror(errno));
    /* a dir that does not exist, and one under a regular file (not writable even by root) */
    snprintf(path, sizeof path, "%s/a-file", dir);
    CHECK(t, write_file(path, (const unsigned char *)"x", 1), "cannot write %s", path);
    const char *names[3] = {"missing", "a-file/under-a-file", "a-file"};
    for (int i = 0; i < 3 && !t->failed; ++i) {
        char bad[700];
        snprintf(bad, sizeof bad, "%s/%s", dir, names[i]);
        test_saved_env env = test_env_set("CLATTN_CACHE_DIR", bad);
        clattn_cache_clear(NULL);
        warnings w = {0, ""};
        clattn_set_log_callback(collect_warning, &w);
        const size_t builds = stat_builds();
        const bool ok = run_ops(t);
        clattn_set_log_callback(NULL, NULL);
        test_env_restore(&env);
        if (!ok) break;
        CHECK(t, clattn_last_error()[0] == '\0', "CLATTN_CACHE_DIR=%s left an error: %s", bad,
              clattn_last_error());
        CHECK(t, stat_builds() == builds + 2, "CLATTN_CACHE_DIR=%s: %zu builds", bad,
              stat_builds() - builds);
        CHECK(t, w.count >= 2 && strstr(w.last, "CLATTN_CACHE_DIR"),
              "CLATTN_CACHE_DIR=%s: %d warnings, last \"%s\"", bad, w.count, w.last);
    }
    remove_dir(dir);
}

/* Runs `argv` on the test binary itself with CLATTN_CACHE_DIR=dir and CLATTN_TEST_CACHE_CHILD=1
 * added to this environment, its output into `log`. */
static bool spawn_child(const char *dir, const char *log, pid_t *pid) {
    size_t n = 0;
    while (environ[n]) ++n;
    char **envp = calloc(n + 3, sizeof *envp);
    if (!envp) return false;
    size_t m = 0;
    for (size_t i = 0; i < n; ++i)
        if (strncmp(environ[i], "CLATTN_CACHE_DIR=", 17) != 0 &&
            strncmp(environ[i], "CLATTN_TEST_CACHE_CHILD=", 24) != 0)
            envp[m++] = environ[i];
    char dir_var[600];
    snprintf(dir_var, sizeof dir_var, "CLATTN_CACHE_DIR=%s", dir);
    envp[m++] = dir_var;
    envp[m++] = "CLATTN_TEST_CACHE_CHILD=1";
    char *argv[] = {"clattn-tests", "cache_files.child_fills_the_cache", NULL};
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    const int err = posix_spawn(pid, "/proc/self/exe", &actions, NULL, argv, envp);
    posix_spawn_file_actions_destroy(&actions);
    free(envp);
    return err == 0;
}

/* The last line of a child's log, for a failure message. */
static void log_tail(const char *log, char *out, size_t capacity) {
    size_t size;
    unsigned char *data = read_file(log, &size);
    out[0] = '\0';
    if (!data) return;
    data[size] = '\0';
    char *end = (char *)data + size;
    while (end > (char *)data && (end[-1] == '\n')) *--end = '\0';
    char *line = strrchr((char *)data, '\n');
    snprintf(out, capacity, "%s", line ? line + 1 : (char *)data);
    free(data);
}

static void two_processes_fill_one_empty_dir(test_ctx *t) {
    if (test_platform_is(t, "Oclgrind"))
        return test_skip(t, "children would run without the Oclgrind simulator");
    if (access("/proc/self/exe", X_OK) != 0) return test_skip(t, "no /proc/self/exe");
    char dir[512], logs[512];
    CHECK(t, make_temp_dir(dir, sizeof dir) && make_temp_dir(logs, sizeof logs), "mkdtemp: %s",
          strerror(errno));
    enum { CHILDREN = 2 };
    pid_t pids[CHILDREN];
    int codes[CHILDREN];
    char log[CHILDREN][600];
    bool spawned = true;
    for (int i = 0; i < CHILDREN; ++i) {
        snprintf(log[i], sizeof log[i], "%s/child%d.log", logs, i);
        spawned = spawn_child(dir, log[i], &pids[i]) && spawned;
        if (!spawned) pids[i] = -1;
    }
    for (int i = 0; i < CHILDREN; ++i) {
        int status = 0;
        codes[i] = pids[i] > 0 && waitpid(pids[i], &status, 0) == pids[i] && WIFEXITED(status)
                       ? WEXITSTATUS(status)
                       : -1;
    }
    char tails[CHILDREN][256];
    for (int i = 0; i < CHILDREN; ++i) log_tail(log[i], tails[i], sizeof tails[i]);
    dir_files files = list_cache_dir(t, dir);
    remove_dir(logs);
    remove_dir(dir);
    CHECK(t, spawned, "posix_spawn of /proc/self/exe failed");
    for (int i = 0; i < CHILDREN; ++i)
        CHECK(t, codes[i] == 0 && strstr(tails[i], "1 passed"), "child %d exited %d: %s", i,
              codes[i], tails[i]);
    if (files.clbin == 0 && files.other == 0)
        return test_skip(t, "the driver gives no program binaries");
    CHECK(t, files.clbin == 2 && files.valid == 2 && files.other == 0,
          "%d .clbin files (%d valid) and %d others (%s) for 2 programs", files.clbin, files.valid,
          files.other, files.first_other);
}

/* ---- the program dump ---- */

/* Builds the dumped pair DIR/NAME.cl, DIR/NAME.options on the test's device: true when it
 * builds, as the dump promises. */
static bool dumped_pair_builds(test_ctx *t, const char *dir, const char *name) {
    char path[1024];
    size_t text_size, options_size;
    snprintf(path, sizeof path, "%s/%s.cl", dir, name);
    char *text = (char *)read_file(path, &text_size);
    snprintf(path, sizeof path, "%s/%s.options", dir, name);
    char *options = (char *)read_file(path, &options_size);
    bool ok = false;
    if (text && options) {
        text[text_size] = options[options_size] = '\0';
        cl_device_id device = clattn_env_device(t->env);
        cl_int err;
        const char *texts[1] = {text};
        cl_program p = clCreateProgramWithSource(clattn_env_context(t->env), 1, texts, NULL, &err);
        ok = err == CL_SUCCESS && clBuildProgram(p, 1, &device, options, NULL, NULL) == CL_SUCCESS;
        if (p) clReleaseProgram(p);
    }
    free(text);
    free(options);
    return ok;
}

/* Whether DIR/NAME is a build log of the dump: its first line the build's time. */
static bool is_build_log(const char *dir, const char *name) {
    char path[1024], line[64] = "";
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    const bool read = f && fgets(line, sizeof line, f);
    if (f) fclose(f);
    return read && strncmp(line, "built in ", 9) == 0 && strstr(line, " ms");
}

/* CLATTN_DUMP_PROGRAMS: a pair per program, named by op, written once, and each pair builds;
 * a program built from source (here all: no disk cache) also has its build log. */
static void programs_are_dumped_one_pair_each(test_ctx *t) {
    char dir[512];
    CHECK(t, make_temp_dir(dir, sizeof dir), "mkdtemp: %s", strerror(errno));
    test_saved_env env = test_env_set("CLATTN_DUMP_PROGRAMS", dir);
    /* no disk cache: every program is built from source, so each gets its build log */
    test_saved_env disk = test_env_set("CLATTN_CACHE_DIR", NULL);
    /* a build the device refuses (injected) dumps nothing */
    clattn_cache_clear(NULL);
    clattn__fault_arm(CLATTN__FAULT_BUILD, 1);
    cl_mem from = test_buffer(t, sizeof(float) * 64), to = test_buffer(t, sizeof(float) * 64);
    clattn_tensor x = clattn_tensor_4d(from, CLATTN_F32, 1, 1, 8, 8);
    clattn_tensor y = clattn_tensor_4d(to, CLATTN_F32, 1, 1, 8, 8);
    const int refused =
        from && to ? clattn_copy(&x, NULL, &y, clattn_env_queue(t->env), 0, NULL, NULL) : -1;
    clattn__fault_arm(CLATTN__FAULT_BUILD, 0);
    if (from) clReleaseMemObject(from);
    if (to) clReleaseMemObject(to);
    DIR *after_refusal = opendir(dir);
    int entries = 0;
    for (struct dirent *e; after_refusal && (e = readdir(after_refusal));)
        entries += e->d_name[0] != '.';
    if (after_refusal) closedir(after_refusal);
    bool ok = true;
    for (int round = 0; round < 2 && ok; ++round) { /* the second round finds its pairs there */
        clattn_cache_clear(NULL);
        ok = run_ops(t);
    }
    test_env_restore(&disk);
    test_env_restore(&env);
    int cl = 0, options = 0, other = 0, built = 0, heads = 0, softmax = 0, logs = 0;
    char first_other[256] = "";
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        const char *name = e->d_name, *dot = strrchr(name, '.');
        if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0) continue;
        if (dot && strcmp(dot, ".options") == 0) {
            ++options;
        } else if (dot && strcmp(dot, ".log") == 0 && is_build_log(dir, name)) {
            ++logs;
        } else if (dot && strcmp(dot, ".cl") == 0) {
            char stem[256];
            snprintf(stem, sizeof stem, "%.*s", (int)(dot - name), name);
            ++cl;
            heads += strncmp(name, "heads-", 6) == 0;
            softmax += strncmp(name, "softmax-", 8) == 0;
            built += ok && dumped_pair_builds(t, dir, stem);
        } else if (!other++) {
            snprintf(first_other, sizeof first_other, "%s", name);
        }
    }
    if (d) closedir(d);
    remove_dir(dir);
    if (!ok) return;
    CHECK(t, refused == CLATTN_ERR_BUILD_FAILED && entries == 0,
          "a refused build -> %s, %d files dumped", clattn_status_name(refused), entries);
    CHECK(t, cl == 2 && options == 2 && logs == 2 && other == 0,
          "%d .cl, %d .options, %d .log and %d other files (%s) for 2 programs", cl, options, logs,
          other, first_other);
    CHECK(t, heads == 1 && softmax == 1, "%d heads and %d softmax programs", heads, softmax);
    CHECK(t, built == 2, "%d of the 2 dumped programs build with their options", built);
}

/* A dump directory that cannot be written only warns. */
static void unusable_dump_dir_warns(test_ctx *t) {
    test_saved_env env = test_env_set("CLATTN_DUMP_PROGRAMS", "/nonexistent/clattn-dump");
    clattn_cache_clear(NULL);
    warnings w = {0, ""};
    clattn_set_log_callback(collect_warning, &w);
    const bool ok = run_ops(t);
    clattn_set_log_callback(NULL, NULL);
    test_env_restore(&env);
    if (!ok) return;
    CHECK(t, clattn_last_error()[0] == '\0', "the dump left an error: %s", clattn_last_error());
    CHECK(t, w.count >= 2 && strstr(w.last, "CLATTN_DUMP_PROGRAMS"), "%d warnings, last \"%s\"",
          w.count, w.last);
}

/* The child of two_processes_fill_one_empty_dir: a few rounds of ops on CLATTN_CACHE_DIR. */
static void child_fills_the_cache(test_ctx *t) {
    const char *child = getenv("CLATTN_TEST_CACHE_CHILD");
    if (!(child && *child && strcmp(child, "0") != 0))
        return test_skip(t, "runs only as a child of two_processes_fill_one_empty_dir");
    for (int round = 0; round < 3; ++round) {
        clattn_cache_clear(NULL);
        if (!run_ops(t)) return;
    }
}

static const test_case cases[] = {
    {"export_clear_import_builds_nothing", export_clear_import_builds_nothing},
    {"export_size_query_and_a_small_buffer", export_size_query_and_a_small_buffer},
    {"damaged_or_foreign_entries_are_skipped", damaged_or_foreign_entries_are_skipped},
    {"garbage_empty_and_null_blobs", garbage_empty_and_null_blobs},
    {"disk_cache_is_written_then_loaded", disk_cache_is_written_then_loaded},
    {"damaged_cache_files_are_misses_and_rewritten", damaged_cache_files_are_misses_and_rewritten},
    {"unusable_cache_dirs_do_not_fail_ops", unusable_cache_dirs_do_not_fail_ops},
    {"two_processes_fill_one_empty_dir", two_processes_fill_one_empty_dir},
    {"child_fills_the_cache", child_fills_the_cache},
    {"programs_are_dumped_one_pair_each", programs_are_dumped_one_pair_each},
    {"unusable_dump_dir_warns", unusable_dump_dir_warns},
};
SUITE_TAGGED(cache_files_suite, "cache_files", cases, TAG_SMOKE);
