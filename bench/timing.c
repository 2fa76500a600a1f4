/* Timing and the device's ceilings (bench/roofline.cl). */
#include "bench.h"
#include "sources.h"

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

int bench_time(const bench_options *opt, bench_fn fn, void *ctx, cl_command_queue queue,
               bench_timing *out) {
    double start = bench_now_ms();
    int status = fn(ctx, queue);
    if (status == CLATTN_SUCCESS) status = clFinish(queue);
    out->first_ms = bench_now_ms() - start;
    for (int i = 1; i < opt->warmup && status == CLATTN_SUCCESS; ++i) {
        status = fn(ctx, queue);
        if (status == CLATTN_SUCCESS) status = clFinish(queue);
    }
    double *times = calloc((size_t)opt->repeats, sizeof *times);
    if (!times) return CLATTN_ERR_OUT_OF_HOST_MEMORY;
    for (int i = 0; i < opt->repeats && status == CLATTN_SUCCESS; ++i) {
        start = bench_now_ms();
        status = fn(ctx, queue);
        if (status == CLATTN_SUCCESS) status = clFinish(queue);
        times[i] = bench_now_ms() - start;
    }
    if (status == CLATTN_SUCCESS) {
        qsort(times, (size_t)opt->repeats, sizeof *times, compare_double);
        out->min_ms = times[0];
        out->median_ms = times[opt->repeats / 2];
    }
    free(times);
    return status;
}

/* ---- ceilings ---- */

typedef struct ceiling_ctx {
    cl_kernel kernel;
    size_t global;
} ceiling_ctx;

static int run_ceiling(void *p, cl_command_queue queue) {
    ceiling_ctx *c = p;
    return clEnqueueNDRangeKernel(queue, c->kernel, 1, NULL, &c->global, NULL, 0, NULL, NULL);
}

static cl_program build_roofline(clattn_env *env, cl_int *err) {
    const char *text = bench_roofline_sources[0].text;
    cl_program program = clCreateProgramWithSource(clattn_env_context(env), 1, &text, NULL, err);
    if (*err != CL_SUCCESS) return NULL;
    cl_device_id device = clattn_env_device(env);
    *err = clBuildProgram(program, 1, &device, "-cl-std=CL1.2", NULL, NULL);
    return program;
}

int bench_measure_ceilings(const bench_options *opt, clattn_env *env, bench_ceilings *out) {
    memset(out, 0, sizeof *out);
    cl_int err;
    cl_program program = build_roofline(env, &err);
    if (err != CL_SUCCESS) {
        if (program) clReleaseProgram(program);
        return err;
    }
    /* copy: 64 MiB each way, the size of the reshape rows (16 MiB with --quick) */
    size_t bytes = (size_t)(opt->quick ? 16 : 64) << 20;
    cl_context context = clattn_env_context(env);
    cl_mem src = clCreateBuffer(context, CL_MEM_READ_WRITE, bytes, NULL, &err);
    cl_mem dst = clCreateBuffer(context, CL_MEM_READ_WRITE, bytes, NULL, &err);
    cl_mem sink = clCreateBuffer(context, CL_MEM_READ_WRITE, sizeof(float) << 16, NULL, &err);
    ceiling_ctx copy = {clCreateKernel(program, "copy_vec4", &err), bytes / 16};
    ceiling_ctx fma = {clCreateKernel(program, "fma_peak", &err), (size_t)1 << 16};
    float a = 0.999f, b = 1e-4f;
    cl_int iterations = opt->quick ? 2048 : 8192;
    clSetKernelArg(copy.kernel, 0, sizeof src, &src);
    clSetKernelArg(copy.kernel, 1, sizeof dst, &dst);
    clSetKernelArg(fma.kernel, 0, sizeof sink, &sink);
    clSetKernelArg(fma.kernel, 1, sizeof a, &a);
    clSetKernelArg(fma.kernel, 2, sizeof b, &b);
    clSetKernelArg(fma.kernel, 3, sizeof iterations, &iterations);
    cl_command_queue queue = clattn_env_queue(env);
    /* an uninitialized source is fine for a copy; fill it anyway so no driver takes a shortcut */
    float zero = 0.0f;
    err = clEnqueueFillBuffer(queue, src, &zero, sizeof zero, 0, bytes, 0, NULL, NULL);
    int status = err != CL_SUCCESS ? err : bench_time(opt, run_ceiling, &copy, queue, &out->copy);
    if (status == CLATTN_SUCCESS) status = bench_time(opt, run_ceiling, &fma, queue, &out->fma);
    if (status == CLATTN_SUCCESS) {
        out->copy_gbs = 2.0 * (double)bytes / (out->copy.median_ms * 1e6);
        out->fma_gflops = 16.0 * (double)iterations * (double)fma.global / (out->fma.median_ms * 1e6);
    }
    clReleaseKernel(copy.kernel);
    clReleaseKernel(fma.kernel);
    clReleaseMemObject(src);
    clReleaseMemObject(dst);
    clReleaseMemObject(sink);
    clReleaseProgram(program);
    return status;
}
