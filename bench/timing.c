/* Timing and the device's ceilings (bench/roofline.cl). */
#include "bench.h"
#include "sources.h"

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

/* Copy: 64 MiB each way, the size of the reshape rows (16 MiB with --quick). */
static int measure_copy(const bench_options *opt, clattn_env *env, cl_program program,
                        bench_ceilings *out) {
    size_t bytes = (size_t)(opt->quick ? 16 : 64) << 20;
    cl_context context = clattn_env_context(env);
    cl_int err, err2;
    cl_mem src = clCreateBuffer(context, CL_MEM_READ_WRITE, bytes, NULL, &err);
    cl_mem dst = clCreateBuffer(context, CL_MEM_READ_WRITE, bytes, NULL, &err2);
    ceiling_ctx copy = {NULL, bytes / 16};
    if (err == CL_SUCCESS && err2 == CL_SUCCESS)
        copy.kernel = clCreateKernel(program, "copy_vec4", &err);
    if (err == CL_SUCCESS && err2 == CL_SUCCESS) {
        clSetKernelArg(copy.kernel, 0, sizeof src, &src);
        clSetKernelArg(copy.kernel, 1, sizeof dst, &dst);
        /* fill the source, so no driver takes a shortcut on untouched pages */
        float zero = 0.0f;
        err = clEnqueueFillBuffer(clattn_env_queue(env), src, &zero, sizeof zero, 0, bytes, 0, NULL,
                                  NULL);
    }
    int status = err != CL_SUCCESS ? err : err2;
    if (status == CLATTN_SUCCESS)
        status = bench_time(opt, run_ceiling, &copy, clattn_env_queue(env), &out->copy);
    if (status == CLATTN_SUCCESS) out->copy_gbs = 2.0 * (double)bytes / (out->copy.median_ms * 1e6);
    if (copy.kernel) clReleaseKernel(copy.kernel);
    if (src) clReleaseMemObject(src);
    if (dst) clReleaseMemObject(dst);
    return status;
}

/* FMA: enough work-items to fill every compute unit, enough iterations to run for milliseconds. */
static int measure_fma(const bench_options *opt, clattn_env *env, cl_program program, cl_uint width,
                       bench_ceilings *out) {
    cl_uint units = 1;
    clGetDeviceInfo(clattn_env_device(env), CL_DEVICE_MAX_COMPUTE_UNITS, sizeof units, &units,
                    NULL);
    ceiling_ctx fma = {NULL, (size_t)units * 8192};
    cl_int err;
    cl_mem sink = clCreateBuffer(clattn_env_context(env), CL_MEM_READ_WRITE,
                                 sizeof(float) * width * fma.global, NULL, &err);
    if (err == CL_SUCCESS) fma.kernel = clCreateKernel(program, "fma_peak", &err);
    float a = 0.999f, b = 1e-4f;
    cl_int iterations = (cl_int)((opt->quick ? 8192 : 32768) / width);
    if (err == CL_SUCCESS) {
        clSetKernelArg(fma.kernel, 0, sizeof sink, &sink);
        clSetKernelArg(fma.kernel, 1, sizeof a, &a);
        clSetKernelArg(fma.kernel, 2, sizeof b, &b);
        clSetKernelArg(fma.kernel, 3, sizeof iterations, &iterations);
    }
    int status = err;
    if (status == CLATTN_SUCCESS)
        status = bench_time(opt, run_ceiling, &fma, clattn_env_queue(env), &out->fma);
    if (status == CLATTN_SUCCESS)
        out->fma_gflops =
            16.0 * width * (double)iterations * (double)fma.global / (out->fma.median_ms * 1e6);
    if (fma.kernel) clReleaseKernel(fma.kernel);
    if (sink) clReleaseMemObject(sink);
    return status;
}

int bench_measure_ceilings(const bench_options *opt, clattn_env *env, bench_ceilings *out) {
    memset(out, 0, sizeof *out);
    cl_int err;
    cl_uint width = fma_width(clattn_env_device(env));
    cl_program program = build_roofline(env, width, &err);
    int status = err;
    if (status == CLATTN_SUCCESS) status = measure_copy(opt, env, program, out);
    if (status == CLATTN_SUCCESS) status = measure_fma(opt, env, program, width, out);
    if (program) clReleaseProgram(program);
    return status;
}
