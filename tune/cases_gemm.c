/* The gemm and matmul ops' cases: the projections of multi-head attention, y = x W^T, the
 * packed q/k/v projection and the output projection of B=4, S=1024, E=512. gemm's run through
 * the library's CLBlast bridge (so the gemm row reaches CLBlast the way every op gives it),
 * matmul's through the GEMM every op calls (clattn's kernel where the matmul row says so).
 * Tolerance: the bound on a float32 sum of K products, 2 K 2^-24 times sum_k |x_ik W_jk|. */
#include "tune.h"

#include "ops/gemm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* M (tokens), N (outputs), K (inputs) */
static const int64_t shapes[][3] = {{4096, 1536, 512}, {4096, 512, 512}};

static int enqueue(tune_case *c, cl_command_queue queue, bool clblast) {
    const size_t m = (size_t)c->out.shape[2], n = (size_t)c->out.shape[3];
    const size_t k = (size_t)c->in[0].shape[3];
    const clattn__call call = {
        queue, clattn_env_context(c->env), clattn_env_device(c->env), 0, NULL, NULL};
    const clattn__matrices x = {c->in[0].buffer, 0, k, m * k}, w = {c->in[1].buffer, 0, k, n * k};
    const clattn__matrices y = {c->out.buffer, 0, n, m * n};
    return clblast ? clattn__sgemm_batched(&call, true, m, n, k, &x, &w, 0.0f, &y, 1)
                   : clattn__gemm_batched(&call, true, m, n, k, &x, &w, 0.0f, &y, 1);
}

static int enqueue_clblast(tune_case *c, cl_command_queue queue) {
    return enqueue(c, queue, true);
}

static int enqueue_matmul(tune_case *c, cl_command_queue queue) {
    return enqueue(c, queue, false);
}

static int reference(tune_case *c, const int64_t *s, const float *x, const float *w) {
    const int64_t M = s[0], N = s[1], K = s[2];
    c->ref = malloc((size_t)(M * N) * sizeof *c->ref);
    c->err_scale = malloc((size_t)(M * N) * sizeof *c->err_scale);
    if (!c->ref || !c->err_scale) return CLATTN_ERR_OUT_OF_HOST_MEMORY;
    for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
            double sum = 0, magnitude = 0;
            for (int64_t e = 0; e < K; ++e) {
                const double p = (double)x[i * K + e] * w[j * K + e];
                sum += p;
                magnitude += fabs(p);
            }
            c->ref[i * N + j] = sum;
            c->err_scale[i * N + j] = magnitude;
        }
    return CLATTN_SUCCESS;
}

static int make(tune_case *c, bool with_reference, int index,
                int (*enqueue_fn)(tune_case *, cl_command_queue)) {
    const int64_t *s = shapes[index];
    const int64_t x_shape[4] = {1, 1, s[0], s[2]}, w_shape[4] = {1, 1, s[1], s[2]};
    const int64_t y_shape[4] = {1, 1, s[0], s[1]};
    snprintf(c->shape, sizeof c->shape, "M=%lld N=%lld K=%lld", (long long)s[0], (long long)s[1],
             (long long)s[2]);
    uint64_t seed = 19 + (uint64_t)index;
    float *x = tune_random((size_t)(s[0] * s[2]), &seed, -1.0f, 1.0f);
    float *w = tune_random((size_t)(s[1] * s[2]), &seed, -1.0f, 1.0f);
    int status = x && w ? tune_tensor(c, x_shape, x, &c->in[0]) : CLATTN_ERR_OUT_OF_HOST_MEMORY;
    if (status == CLATTN_SUCCESS) status = tune_tensor(c, w_shape, w, &c->in[1]);
    if (status == CLATTN_SUCCESS) status = tune_tensor(c, y_shape, NULL, &c->out);
    if (status == CLATTN_SUCCESS && with_reference) status = reference(c, s, x, w);
    c->atol = 2.0 * (double)s[2] * ldexp(1.0, -24);
    c->compute = true;
    c->work = 2.0 * (double)(s[0] * s[1] * s[2]);
    c->enqueue = enqueue_fn;
    free(x);
    free(w);
    return status;
}

static int make_gemm(tune_case *c, bool with_reference, int index) {
    return make(c, with_reference, index, enqueue_clblast);
}

static int make_matmul(tune_case *c, bool with_reference, int index) {
    return make(c, with_reference, index, enqueue_matmul);
}

int tune_gemm_cases(clattn_env *env, bool with_reference, tune_case *cases, int *count) {
    const int n = (int)(sizeof shapes / sizeof shapes[0]);
    return tune_make_cases(env, with_reference, n, make_gemm, cases, count);
}

int tune_matmul_cases(clattn_env *env, bool with_reference, tune_case *cases, int *count) {
    const int n = (int)(sizeof shapes / sizeof shapes[0]);
    return tune_make_cases(env, with_reference, n, make_matmul, cases, count);
}
