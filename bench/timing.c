/* Timing and the device's ceilings (bench/roofline.cl). */
#include "bench.h"
#include "runtime/sources.h"
#include "runtime/testing.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

extern const clattn__source_file bench_roofline_sources[];

double bench_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int compare_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One call waited for: `ms` from the enqueue to the end of clFinish, `host_ms` until the call
 * returned (the library's and the driver's work on the host; either may be NULL). */
static int run_once(bench_fn fn, void *ctx, cl_command_queue queue, double *ms, double *host_ms) {
    double start = bench_now_ms();
    int status = fn(ctx, queue);
    if (host_ms) *host_ms = bench_now_ms() - start;
    if (status == CLATTN_SUCCESS) status = clFinish(queue);
    if (ms) *ms = bench_now_ms() - start;
    return status;
}

static double median_of(double *times, int count) {
    qsort(times, (size_t)count, sizeof *times, compare_double);
    return times[count / 2];
}

static void summarize(double *times, double *host_times, int count, bench_timing *out) {
    out->host_ms = median_of(host_times, count);
    out->median_ms = median_of(times, count);
    out->min_ms = times[0];
}

_Static_assert(sizeof((bench_timing *)0)->kernel[0] == sizeof((clattn__traced_kernel *)0)->name,
               "a traced kernel's name is copied whole");

/* A traced kernel's device time (0 where the queue keeps no profile). */
static double kernel_ms(cl_event event) {
    cl_ulong start = 0, end = 0;
    clGetEventProfilingInfo(event, CL_PROFILING_COMMAND_START, sizeof start, &start, NULL);
    clGetEventProfilingInfo(event, CL_PROFILING_COMMAND_END, sizeof end, &end, NULL);
    return end > start ? (double)(end - start) / 1e6 : 0.0;
}

/* With CLATTN_BENCH_KERNELS=1: one more call of fn under the library's kernel trace, its
 * kernels' device times into out (a breakdown of the calls of several kernels: the first 64
 * kernels of the call, the first BENCH_KERNELS names). */
static int trace_kernels(bench_fn fn, void *ctx, cl_command_queue queue, bench_timing *out) {
    const char *asked = getenv("CLATTN_BENCH_KERNELS");
    out->kernels = 0;
    if (!asked || strcmp(asked, "1") != 0) return CLATTN_SUCCESS;
    clattn__trace_kernels(true);
    const int status = run_once(fn, ctx, queue, NULL, NULL);
    clattn__trace_kernels(false);
    clattn__traced_kernel traced[64];
    const size_t count = clattn__trace_take(traced, 64);
    for (size_t i = 0; i < count; ++i) {
        int k = 0;
        while (k < out->kernels && strcmp(out->kernel[k], traced[i].name) != 0) ++k;
        if (k == out->kernels && k < BENCH_KERNELS) {
            memcpy(out->kernel[k], traced[i].name, sizeof out->kernel[k]);
            out->kernel_ms[k] = 0.0;
            out->kernels++;
        }
        if (k < out->kernels) out->kernel_ms[k] += kernel_ms(traced[i].event);
        clReleaseEvent(traced[i].event);
    }
    return status;
}

int bench_kernel_that_ran(bench_fn fn, void *ctx, cl_command_queue queue, char name[64]) {
    clattn__trace_kernels(true);
    const int status = run_once(fn, ctx, queue, NULL, NULL);
    clattn__trace_kernels(false);
    clattn__traced_kernel traced[1];
    if (clattn__trace_take(traced, 1) == 1) {
        memcpy(name, traced[0].name, sizeof traced[0].name);
        clReleaseEvent(traced[0].event);
    }
    return status;
}

int bench_time_beside(const bench_options *opt, bench_fn fn, void *ctx, bench_fn ref, void *ref_ctx,
                      cl_command_queue queue, bench_timing *out, bench_timing *ref_out) {
    *out = (bench_timing){0};
    if (ref_out) *ref_out = (bench_timing){0}; /* (ref's first call is not timed apart) */
    int status = run_once(fn, ctx, queue, &out->first_ms, NULL);
    /* calls of seconds: the first warms up enough, and a few repeats tell enough (as the torch
     * peer does) */
    bench_options few = *opt;
    if (out->first_ms > 1000.0) few.warmup = 0, few.repeats = opt->repeats < 3 ? opt->repeats : 3;
    opt = &few;
    for (int i = 1; i < opt->warmup && status == CLATTN_SUCCESS; ++i) {
        status = run_once(fn, ctx, queue, NULL, NULL);
        if (ref && status == CLATTN_SUCCESS) status = run_once(ref, ref_ctx, queue, NULL, NULL);
    }
    const size_t n = (size_t)opt->repeats;
    double *times = calloc(4 * n, sizeof *times);
    if (!times) return CLATTN_ERR_OUT_OF_HOST_MEMORY;
    double *host = times + n, *ref_times = times + 2 * n, *ref_host = times + 3 * n;
    for (int i = 0; i < opt->repeats && status == CLATTN_SUCCESS; ++i) {
        status = run_once(fn, ctx, queue, &times[i], &host[i]);
        if (ref && status == CLATTN_SUCCESS)
            status = run_once(ref, ref_ctx, queue, &ref_times[i], &ref_host[i]);
    }
    if (status == CLATTN_SUCCESS) {
        summarize(times, host, opt->repeats, out);
        if (ref) summarize(ref_times, ref_host, opt->repeats, ref_out);
    }
    free(times);
    return status == CLATTN_SUCCESS ? trace_kernels(fn, ctx, queue, out) : status;
}

int bench_time(const bench_options *opt, bench_fn fn, void *ctx, cl_command_queue queue,
               bench_timing *out) {
    return bench_time_beside(opt, fn, ctx, NULL, NULL, queue, out, NULL);
}

/* ---- ceilings ---- */

/* A ceiling's work per ns over `t`'s runs: GB/s or GFLOP/s. */
static double ceiling_rate(const bench_ceiling_run *run, const bench_timing *t) {
    return run->work / (t->median_ms * 1e6);
}

static int run_ceiling(void *p, cl_command_queue queue) {
    bench_ceiling_run *c = p;
    return clEnqueueNDRangeKernel(queue, c->kernel, 1, NULL, &c->global,
                                  c->local ? &c->local : NULL, 0, NULL, NULL);
}

/* The device's preferred float vector width, as the FMA kernel's WIDTH (1, 2, 4, 8 or 16). */
static cl_uint fma_width(cl_device_id device) {
    cl_uint width = 1;
    clGetDeviceInfo(device, CL_DEVICE_PREFERRED_VECTOR_WIDTH_FLOAT, sizeof width, &width, NULL);
    return width == 2 || width == 4 || width == 8 || width == 16 ? width : 1;
}

static cl_program build_roofline(clattn_env *env, cl_uint width, cl_int *err) {
    const char *text = bench_roofline_sources[0].text;
    cl_program program = clCreateProgramWithSource(clattn_env_context(env), 1, &text, NULL, err);
    if (*err != CL_SUCCESS) return NULL;
    cl_device_id device = clattn_env_device(env);
    char options[64];
    snprintf(options, sizeof options, "-cl-std=CL1.2 -DWIDTH=%u", width);
    *err = clBuildProgram(program, 1, &device, options, NULL, NULL);
    return program;
}

static void release_run(bench_ceiling_run *run) {
    if (run->kernel) clReleaseKernel(run->kernel);
    for (int i = 0; i < 2; ++i)
        if (run->buffers[i]) clReleaseMemObject(run->buffers[i]);
    memset(run, 0, sizeof *run);
}

/* Copy: 64 MiB each way, the size of the reshape rows (16 MiB with --quick). */
static cl_int open_copy(const bench_options *opt, clattn_env *env, cl_program program,
                        bench_ceiling_run *run) {
    size_t bytes = (size_t)(opt->quick ? 16 : 64) << 20;
    cl_context context = clattn_env_context(env);
    cl_int err = CL_SUCCESS;
    run->global = bytes / 16;
    run->work = 2.0 * (double)bytes;
    for (int i = 0; i < 2 && err == CL_SUCCESS; ++i)
        run->buffers[i] = clCreateBuffer(context, CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (err == CL_SUCCESS) run->kernel = clCreateKernel(program, "copy_vec4", &err);
    for (cl_uint i = 0; i < 2 && err == CL_SUCCESS; ++i)
        err = clSetKernelArg(run->kernel, i, sizeof(cl_mem), &run->buffers[i]);
    /* fill the source, so no driver takes a shortcut on untouched pages */
    float zero = 0.0f;
    if (err == CL_SUCCESS)
        err = clEnqueueFillBuffer(clattn_env_queue(env), run->buffers[0], &zero, sizeof zero, 0,
                                  bytes, 0, NULL, NULL);
    return err;
}

static size_t compute_units(cl_device_id device) {
    cl_uint units = 1;
    clGetDeviceInfo(device, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof units, &units, NULL);
    return units;
}

/* FMA: enough work-items to fill every compute unit, enough iterations to run for milliseconds. */
static cl_int open_fma(const bench_options *opt, clattn_env *env, cl_program program, cl_uint width,
                       bench_ceiling_run *run) {
    run->global = compute_units(clattn_env_device(env)) * 8192;
    float a = 0.999f, b = 1e-4f;
    cl_int iterations = (cl_int)((opt->quick ? 8192 : 32768) / width);
    run->work = 16.0 * width * (double)iterations * (double)run->global;
    cl_int err;
    run->buffers[0] = clCreateBuffer(clattn_env_context(env), CL_MEM_READ_WRITE,
                                     sizeof(float) * width * run->global, NULL, &err);
    if (err == CL_SUCCESS) run->kernel = clCreateKernel(program, "fma_peak", &err);
    if (err == CL_SUCCESS) err = clSetKernelArg(run->kernel, 0, sizeof(cl_mem), &run->buffers[0]);
    if (err == CL_SUCCESS) err = clSetKernelArg(run->kernel, 1, sizeof a, &a);
    if (err == CL_SUCCESS) err = clSetKernelArg(run->kernel, 2, sizeof b, &b);
    if (err == CL_SUCCESS) err = clSetKernelArg(run->kernel, 3, sizeof iterations, &iterations);
    return err;
}

/* The f16 matrix-unit peak (roofline.cl's mma_peak, on cl/mma.cl's instruction), where
 * clattn_matrix_units found the unit: 16 warps a compute unit, 8 products a warp in flight.
 * Elsewhere (no unit, or its probe failed) no kernel, and the 16-bit rows keep the FMA ceiling. */
static cl_int open_matrix(const bench_options *opt, clattn_env *env, bench_ceiling_run *run) {
    unsigned units = 0;
    if (clattn_matrix_units(clattn_env_queue(env), &units) != CLATTN_SUCCESS ||
        !(units & CLATTN_MATRIX_MMA_F16))
        return CL_SUCCESS;
    const char *texts[3] = {bench_roofline_sources[1].text, bench_roofline_sources[2].text,
                            bench_roofline_sources[0].text}; /* common.cl, mma.cl, roofline.cl */
    cl_int err;
    cl_program program = clCreateProgramWithSource(clattn_env_context(env), 3, texts, NULL, &err);
    cl_device_id device = clattn_env_device(env);
    if (err == CL_SUCCESS)
        err = clBuildProgram(program, 1, &device,
                             "-cl-std=CL1.2 -DMMA_PEAK=1 -DMMA_PTX=1 -DMMA_T=f16", NULL, NULL);
    run->local = 128;
    run->global = compute_units(device) * 512;
    cl_int iterations = opt->quick ? 1024 : 4096;
    run->work = 4096.0 * 8 * (double)iterations * (double)(run->global / 32);
    if (err == CL_SUCCESS)
        run->buffers[0] = clCreateBuffer(clattn_env_context(env), CL_MEM_READ_WRITE,
                                         sizeof(float) * run->global, NULL, &err);
    if (err == CL_SUCCESS) run->kernel = clCreateKernel(program, "mma_peak", &err);
    if (err == CL_SUCCESS) err = clSetKernelArg(run->kernel, 0, sizeof(cl_mem), &run->buffers[0]);
    if (err == CL_SUCCESS) err = clSetKernelArg(run->kernel, 1, sizeof iterations, &iterations);
    if (program) clReleaseProgram(program);
    return err;
}

/* The launch latency: one work-item of an empty kernel. */
static cl_int open_nop(clattn_env *env, cl_program program, bench_ceiling_run *run) {
    cl_int err;
    run->global = 1;
    run->buffers[0] = clCreateBuffer(clattn_env_context(env), CL_MEM_READ_WRITE, 4, NULL, &err);
    if (err == CL_SUCCESS) run->kernel = clCreateKernel(program, "nop", &err);
    if (err == CL_SUCCESS) err = clSetKernelArg(run->kernel, 0, sizeof(cl_mem), &run->buffers[0]);
    return err;
}

int bench_ceilings_open(const bench_options *opt, clattn_env *env, bench_ceilings *out) {
    memset(out, 0, sizeof *out);
    out->first_warm_ms = out->first_cold_ms = -1.0; /* measured last, if at all */
    cl_int err;
    cl_uint width = fma_width(clattn_env_device(env));
    cl_program program = build_roofline(env, width, &err);
    if (err == CL_SUCCESS) err = open_copy(opt, env, program, &out->copy_run);
    if (err == CL_SUCCESS) err = open_fma(opt, env, program, width, &out->fma_run);
    if (err == CL_SUCCESS) err = open_nop(env, program, &out->nop_run);
    if (err == CL_SUCCESS && open_matrix(opt, env, &out->matrix_run) != CL_SUCCESS) {
        fprintf(stderr, "clattn-bench: the matrix-unit ceiling did not build; the 16-bit rows "
                        "keep the FMA ceiling\n");
        release_run(&out->matrix_run);
    }
    if (program) clReleaseProgram(program); /* the kernels keep it alive */
    cl_command_queue queue = clattn_env_queue(env);
    int status = err;
    if (status == CLATTN_SUCCESS)
        status = bench_time(opt, run_ceiling, &out->copy_run, queue, &out->copy);
    if (status == CLATTN_SUCCESS)
        status = bench_time(opt, run_ceiling, &out->fma_run, queue, &out->fma);
    if (status == CLATTN_SUCCESS)
        status = bench_time(opt, run_ceiling, &out->nop_run, queue, &out->launch);
    if (status == CLATTN_SUCCESS && out->matrix_run.kernel &&
        bench_time(opt, run_ceiling, &out->matrix_run, queue, &out->matrix) != CLATTN_SUCCESS) {
        fprintf(stderr, "clattn-bench: the matrix-unit ceiling did not run; the 16-bit rows "
                        "keep the FMA ceiling\n");
        release_run(&out->matrix_run);
    }
    if (status == CLATTN_SUCCESS) {
        out->launch_us = out->launch.median_ms * 1e3;
        out->copy_gbs = ceiling_rate(&out->copy_run, &out->copy);
        out->fma_gflops = ceiling_rate(&out->fma_run, &out->fma);
        if (out->matrix_run.kernel)
            out->matrix_gflops = ceiling_rate(&out->matrix_run, &out->matrix);
    }
    if (status != CLATTN_SUCCESS) bench_ceilings_close(out);
    return status;
}

void bench_ceilings_close(bench_ceilings *c) {
    release_run(&c->copy_run);
    release_run(&c->fma_run);
    release_run(&c->nop_run);
    release_run(&c->matrix_run);
}

/* The ceiling's work per ns by its kernel's own device time: the median of `repeats` profiled
 * runs (0 where the queue keeps no profile). */
static int ceiling_device_rate(const bench_options *opt, const bench_ceiling_run *run,
                               cl_command_queue queue, double *rate) {
    double *times = calloc((size_t)opt->repeats, sizeof *times);
    if (!times) return CLATTN_ERR_OUT_OF_HOST_MEMORY;
    cl_int err = CL_SUCCESS;
    for (int i = 0; i < opt->repeats && err == CL_SUCCESS; ++i) {
        cl_event event = NULL;
        err = clEnqueueNDRangeKernel(queue, run->kernel, 1, NULL, &run->global,
                                     run->local ? &run->local : NULL, 0, NULL, &event);
        if (err == CL_SUCCESS) err = clWaitForEvents(1, &event);
        if (err == CL_SUCCESS) times[i] = kernel_ms(event);
        if (event) clReleaseEvent(event);
    }
    const double ms = err == CL_SUCCESS ? median_of(times, opt->repeats) : 0.0;
    *rate = ms > 0.0 ? run->work / (ms * 1e6) : 0.0;
    free(times);
    return err;
}

/* fn timed alternately with the ceiling `run` (with --apart, fn's calls then the ceiling's);
 * *rate is the ceiling's work per ns (GB/s or GFLOP/s) over those runs; where fn's kernels were
 * traced, the ceiling's device rate too. */
static int time_beside_ceiling(const bench_options *opt, bench_ceiling_run *run, bench_fn fn,
                               void *ctx, cl_command_queue queue, bench_timing *out, double *rate) {
    bench_timing ceiling;
    int status = opt->apart
                     ? bench_time(opt, fn, ctx, queue, out)
                     : bench_time_beside(opt, fn, ctx, run_ceiling, run, queue, out, &ceiling);
    if (status == CLATTN_SUCCESS && opt->apart)
        status = bench_time(opt, run_ceiling, run, queue, &ceiling);
    if (status == CLATTN_SUCCESS) *rate = ceiling_rate(run, &ceiling);
    if (status == CLATTN_SUCCESS && out->kernels > 0)
        status = ceiling_device_rate(opt, run, queue, &out->ceiling_device_rate);
    return status;
}

int bench_time_vs_copy(const bench_options *opt, bench_ceilings *c, bench_fn fn, void *ctx,
                       cl_command_queue queue, bench_timing *out, double *copy_gbs) {
    return time_beside_ceiling(opt, &c->copy_run, fn, ctx, queue, out, copy_gbs);
}

int bench_time_vs_fma(const bench_options *opt, bench_ceilings *c, bench_fn fn, void *ctx,
                      cl_command_queue queue, bench_timing *out, double *fma_gflops) {
    return time_beside_ceiling(opt, &c->fma_run, fn, ctx, queue, out, fma_gflops);
}

int bench_time_vs_compute(const bench_options *opt, bench_ceilings *c, clattn_dtype dtype,
                          bench_fn fn, void *ctx, cl_command_queue queue, bench_timing *out,
                          double *gflops) {
    const bool matrix = dtype != CLATTN_F32 && c->matrix_run.kernel;
    return time_beside_ceiling(opt, matrix ? &c->matrix_run : &c->fma_run, fn, ctx, queue, out,
                               gflops);
}
