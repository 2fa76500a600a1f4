/* The softmax op's cases: causal rows of the benchmark's kind, and rows longer than the rows
 * variant's local-memory scratch. Tolerance as tests/test_softmax.c's for f32. */
#include "tune.h"

#include "../tests/ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct softmax_shape {
    int64_t B, H, Sq, Sk;
    int causal;
} softmax_shape;

static const softmax_shape shapes[] = {{2, 8, 512, 512, 1}, {1, 4, 32, 8192, 0}};

static int enqueue(tune_case *c, cl_command_queue queue) {
    return clattn_softmax(&c->in[0], 1.0f, &c->mask, &c->out, NULL, queue, 0, NULL, NULL);
}

static double *reference(const softmax_shape *s, const float *x, size_t n) {
    double *x64 = malloc(n * sizeof *x64), *y = malloc(n * sizeof *y);
    const ref_mask mask = {.causal = s->causal, .left = -1, .right = -1};
    for (size_t i = 0; x64 && i < n; ++i) x64[i] = x[i];
    if (x64 && y) ref_softmax(x64, s->B, s->H, s->Sq, s->Sk, 1.0, &mask, y, NULL, NULL);
    free(x64);
    if (!x64) free(y);
    return x64 ? y : NULL;
}

static int make(tune_case *c, bool with_reference, int index) {
    const softmax_shape *s = &shapes[index];
    const int64_t shape[4] = {s->B, s->H, s->Sq, s->Sk};
    const size_t n = (size_t)(s->B * s->H * s->Sq * s->Sk);
    snprintf(c->shape, sizeof c->shape, "%lldx%lldx%lldx%lld%s", (long long)s->B, (long long)s->H,
             (long long)s->Sq, (long long)s->Sk, s->causal ? " causal" : "");
    uint64_t seed = 11 + (uint64_t)index;
    float *x = tune_random(n, &seed, -4.0f, 4.0f);
    int status = x ? tune_tensor(c, shape, x, &c->in[0]) : CLATTN_ERR_OUT_OF_HOST_MEMORY;
    if (status == CLATTN_SUCCESS) status = tune_tensor(c, shape, NULL, &c->out);
    if (status == CLATTN_SUCCESS && with_reference && !(c->ref = reference(s, x, n)))
        status = CLATTN_ERR_OUT_OF_HOST_MEMORY;
    c->mask.causal = s->causal;
    c->work = 2.0 * 4.0 * (double)n; /* bytes read and written */
    c->atol = 3e-8;
    c->rtol = 2e-5 + 4e-7 * sqrt((double)s->Sk);
    c->enqueue = enqueue;
    free(x);
    return status;
}

int tune_softmax_cases(clattn_env *env, bool with_reference, tune_case *cases, int *count) {
    const int n = (int)(sizeof shapes / sizeof shapes[0]);
    return tune_make_cases(env, with_reference, n, make, cases, count);
}
