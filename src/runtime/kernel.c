/*
 * Kernels from cached programs: the cache first, then the on-disk binary cache
 * (CLATTN_CACHE_DIR), then a build from source.
 */
#include "kernel.h"
#include "kernel_args.h"
#include "launch.h"
#include "program_binary.h"
#include "program_build.h"
#include "program_cache.h"
#include "program_dump.h"
#include "sources.h"
#include "status.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A monotonic clock, for the build times of the program dump. */
static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* The program of (op_file, options) under cache key `hash` (`text`: the source when the key
 * came with it, else NULL; freed here). */
static int get_program(cl_context context, cl_device_id device, const char *op_file,
                       const char *options, char *text, uint64_t hash, cl_program *out) {
    int status = CLATTN_SUCCESS;
    cl_program program = clattn__cache_lookup(context, device, hash, options);

    if (!program && !text) status = clattn__program_source(op_file, &text);
    if (!program && status == CLATTN_SUCCESS) {
        const uint64_t text_hash = clattn__text_hash(text);
        const bool loaded =
            clattn__disk_cache_load(context, device, op_file, options, text_hash, &program);
        const double start_ms = now_ms();
        if (!loaded)
            status = clattn__program_build(context, device, text, options, op_file, &program);
        const double build_ms = loaded ? -1.0 : now_ms() - start_ms;
        if (status == CLATTN_SUCCESS && !loaded)
            clattn__disk_cache_store(device, op_file, options, text_hash, program);
        /* only programs the device accepted: a test's deliberately broken source is no
         * program for another compiler to check */
        if (status == CLATTN_SUCCESS)
            clattn__program_dump(op_file, options, text, program, device, build_ms);
        if (status == CLATTN_SUCCESS)
            program = clattn__cache_insert(context, device, hash, op_file, options, text_hash,
                                           program, !loaded);
    }
    free(text);
    *out = program;
    return status;
}

/* ---- kernels ---- */

/* The op's options plus CLATTN_BUILD_OPTIONS (for debugging builds: -cl-opt-disable, -g).
 * Options that relax IEEE semantics (the -cl-*-math family, mad, signed zeros) are refused:
 * the masks rely on infinities and NaN, the tests on exact results. */
static int full_options(const char *options, char *out, size_t capacity) {
    static const char *const refused[] = {"math", "mad-enable", "signed-zeros"};
    const char *extra = getenv("CLATTN_BUILD_OPTIONS");
    if (!extra) extra = "";
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; ++i)
        if (strstr(extra, refused[i]))
            return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT,
                                "CLATTN_BUILD_OPTIONS \"%s\": options with \"%s\" are refused "
                                "(clattn relies on IEEE infinities and NaN)",
                                extra, refused[i]);
    if ((size_t)snprintf(out, capacity, "%s %s", options, extra) >= capacity)
        return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT, "build options longer than %zu bytes",
                            capacity);
    return CLATTN_SUCCESS;
}

/* A kernel of the key's program that the cache keeps and no call holds, lent to this call with a
 * fresh argument record, or NULL (none free, or this thread records no more kernels: then it
 * goes back, and the call makes a kernel of its own). */
static cl_kernel lend_kept_kernel(cl_context context, cl_device_id device, uint64_t key,
                                  const char *options, const char *name) {
    clattn__kernel_memo *memo;
    cl_kernel kernel = clattn__cache_lend_kernel(context, device, key, options, name, &memo);
    if (kernel && !clattn__args_begin(kernel, memo)) {
        clattn__cache_take_back_kernel(kernel, memo);
        clReleaseKernel(kernel);
        kernel = NULL;
    }
    return kernel;
}

/* A new kernel of the key's program (built now if the cache has none; `text` as get_program
 * takes it), kept for later calls where its program has a slot free. */
static int new_kernel(cl_context context, cl_device_id device, const char *op_file,
                      const char *options, char *text, uint64_t hash, const char *kernel_name,
                      cl_kernel *kernel) {
    cl_program program = NULL;
    int status = get_program(context, device, op_file, options, text, hash, &program);
    if (status != CLATTN_SUCCESS) return status;
    cl_int err;
    *kernel = clCreateKernel(program, kernel_name, &err);
    if (err == CL_SUCCESS && clattn__args_begin(*kernel, NULL))
        clattn__cache_keep_kernel(program, kernel_name, *kernel);
    clReleaseProgram(program); /* the kernel holds its own reference */
    if (err != CL_SUCCESS) {
        *kernel = NULL;
        return clattn__fail(err, "clCreateKernel(%s) in cl/%s failed: %s", kernel_name, op_file,
                            clattn_status_name(err));
    }
    return CLATTN_SUCCESS;
}

int clattn__create_kernel(cl_context context, cl_device_id device, const char *op_file,
                          const char *options, const char *kernel_name, cl_kernel *kernel) {
    char all_options[2048], *text = NULL;
    uint64_t hash = 0;
    *kernel = NULL;
    int status = full_options(options, all_options, sizeof all_options);
    if (status == CLATTN_SUCCESS) status = clattn__program_key(op_file, &text, &hash);
    if (status == CLATTN_SUCCESS)
        *kernel = lend_kept_kernel(context, device, hash, all_options, kernel_name);
    if (status == CLATTN_SUCCESS && !*kernel)
        return new_kernel(context, device, op_file, all_options, text, hash, kernel_name, kernel);
    free(text);
    return status;
}

int clattn__kernels_group_limit(cl_context context, cl_device_id device, const char *op_file,
                                const char *options, const char *const *names, int count,
                                size_t *most) {
    int status = CLATTN_SUCCESS;
    *most = SIZE_MAX;
    for (int i = 0; i < count && status == CLATTN_SUCCESS; ++i) {
        cl_kernel kernel = NULL;
        size_t limit = 0;
        status = clattn__create_kernel(context, device, op_file, options, names[i], &kernel);
        if (status == CLATTN_SUCCESS) status = clattn__kernel_max_group(kernel, device, &limit);
        clattn__release_kernel(kernel);
        if (limit < *most) *most = limit;
    }
    return status;
}

void clattn__release_kernel(cl_kernel kernel) {
    if (!kernel) return;
    /* a kept kernel must name none of the call's buffers: some drivers (Mesa's rusticl) retain
     * the buffers a kernel's arguments name, which would keep a freed tensor or the call's
     * scratch alive until the kernel's next call */
    bool cleared;
    clattn__kernel_memo *memo = clattn__args_end(kernel, &cleared);
    if (cleared) {
        clattn__cache_take_back_kernel(kernel, memo);
    } else {
        clattn__cache_forget_kernel(kernel);
        clattn__kernel_memo_free(memo);
    }
    clReleaseKernel(kernel);
}
