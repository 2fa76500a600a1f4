/* The correctness check each row passes before it is timed: the op's inputs are random, its
 * first call's output is read back, and a sample of the output is compared with a float64
 * reference computed on the host for just those elements (bench/bench_*.c say which). */
#include "bench.h"
#include "../tests/ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* xorshift64*, as the tests' */
static float uniform(uint64_t *state) {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    const uint64_t r = *state * 2685821657736338717ull;
    return (float)((double)(r >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

int bench_fill_random(clattn_env *env, const clattn_tensor *t, uint64_t seed, float scale,
                      float **host) {
    const size_t n = (size_t)clattn_tensor_numel(t), size = clattn_dtype_size(t->dtype);
    float *values = malloc(n * sizeof *values);
    void *stored = malloc(n * size);
    uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
    int status = values && stored ? CLATTN_SUCCESS : CLATTN_ERR_OUT_OF_HOST_MEMORY;
    for (size_t i = 0; status == CLATTN_SUCCESS && i < n; ++i) {
        ref_store(stored, t->dtype, i, scale * uniform(&state));
        values[i] = ref_load(stored, t->dtype, i); /* what the device holds */
    }
    if (status == CLATTN_SUCCESS) status = clattn_env_upload(env, t, stored);
    free(stored);
    if (status != CLATTN_SUCCESS || !host) free(values);
    if (host) *host = status == CLATTN_SUCCESS ? values : NULL;
    return status;
}

int bench_read(clattn_env *env, const clattn_tensor *t, float **host) {
    const size_t n = (size_t)clattn_tensor_numel(t), size = clattn_dtype_size(t->dtype);
    float *values = malloc(n * sizeof *values);
    void *stored = malloc(n * size);
    int status =
        values && stored ? clattn_env_download(env, t, stored) : CLATTN_ERR_OUT_OF_HOST_MEMORY;
    for (size_t i = 0; status == CLATTN_SUCCESS && i < n; ++i)
        values[i] = ref_load(stored, t->dtype, i);
    free(stored);
    if (status != CLATTN_SUCCESS) free(values);
    *host = status == CLATTN_SUCCESS ? values : NULL;
    return status;
}

/* The relative tolerance of a sampled output stored in `dtype` (f32 math inside). */
static double bench_tolerance(clattn_dtype dtype) {
    return dtype == CLATTN_F32 ? 1e-4 : dtype == CLATTN_F16 ? 2e-3 : 1.6e-2;
}

bool bench_close(bench_report *report, const char *what, size_t index, double got, double want,
                 double scale, clattn_dtype dtype) {
    const double tol = bench_tolerance(dtype);
    if (fabs(got - want) <= tol * (fabs(want) + scale) || (isnan(got) && isnan(want))) return true;
    snprintf(report->check_detail, sizeof report->check_detail, "%s[%zu] = %.7g, expected %.7g",
             what, index, got, want);
    return false;
}

size_t bench_sample(uint64_t *state, size_t n) {
    const double u = 0.5 * ((double)uniform(state) + 1.0);
    const size_t i = (size_t)(u * (double)n);
    return i < n ? i : n - 1;
}

/* Runs fn once, waits, and checks its result into report->check: "ok", "wrong", or with
 * report->time_wrong "ablated" (wrong, and timed all the same). */
static int bench_run_checked(bench_report *report, bench_fn fn, void *ctx, cl_command_queue queue,
                             bench_check_fn check, clattn_env *env) {
    int status = fn(ctx, queue);
    if (status == CLATTN_SUCCESS) status = clFinish(queue);
    report->check_detail[0] = '\0';
    bool ok = false;
    if (status == CLATTN_SUCCESS) status = check(ctx, env, report, &ok);
    snprintf(report->check, sizeof report->check, "%s",
             ok                   ? "ok"
             : report->time_wrong ? "ablated"
                                  : "wrong");
    if (status == CLATTN_SUCCESS && !ok)
        fprintf(stderr, "clattn-bench: wrong result, %s: %s\n",
                report->time_wrong ? "timed (--time-wrong)" : "not timed", report->check_detail);
    return status;
}

int bench_check_row(bench_report *report, clattn_env *env, bench_fn fn, void *ctx,
                    bench_check_fn check, const bench_row_name *row, bool *wrong) {
    int status = bench_run_checked(report, fn, ctx, clattn_env_queue(env), check, env);
    *wrong = status == CLATTN_SUCCESS && strcmp(report->check, "wrong") == 0;
    if (*wrong)
        status = bench_add_wrong_row(report, env, row->op, row->variant, row->dtype, row->shape);
    return status;
}

void bench_attention_row(const float *q, const float *k, const float *v, int64_t d, int64_t keys,
                         double *w, double *out) {
    double top = -INFINITY, sum = 0;
    for (int64_t j = 0; j < keys; ++j) {
        double dot = 0;
        for (int64_t e = 0; e < d; ++e) dot += (double)q[e] * k[j * d + e];
        w[j] = dot / sqrt((double)d);
        top = fmax(top, w[j]);
    }
    for (int64_t j = 0; j < keys; ++j) sum += (w[j] = exp(w[j] - top));
    for (int64_t e = 0; e < d; ++e) out[e] = 0;
    for (int64_t j = 0; j < keys; ++j)
        for (int64_t e = 0; e < d; ++e) out[e] += w[j] / sum * v[j * d + e];
}
