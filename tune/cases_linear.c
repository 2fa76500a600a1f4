/* The linear attention op's cases: the whole-sequence form, non-causal and causal (elu+1
 * features). Tolerance as tests/test_linear_attention.c's for f32: relative to each element's
 * error scale, sum_j |w_ij v_j| / |sum_j w_ij + eps|. The reference is the running-sum form
 * (the naive one took 45 s for these shapes on an H200's host): elu+1 features make every
 * w_ij positive, so the error scale is the same op run on |v|. */
#include "tune.h"

#include "../tests/ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct linear_shape {
    int64_t B, H, S, D;
    int causal;
} linear_shape;

/* The benchmark's shape: a row tuned on a smaller one (B=1 H=4) ran an H200's benchmark
 * 1.2-1.4x slower than the row it replaced, while 2x faster on its own shape. */
static const linear_shape shapes[] = {{4, 8, 1024, 64, 0}, {4, 8, 1024, 64, 1}};

/* The workspace is sized for each candidate: its chunking sets the need. */
static int enqueue(tune_case *c, cl_command_queue queue) {
    clattn_linear_options options = CLATTN_LINEAR_OPTIONS_DEFAULT;
    size_t bytes = 0;
    int status = clattn_linear_attention_workspace_size(&c->in[0], &c->in[1], &c->in[2], &c->mask,
                                                        &c->out, &options, queue, &bytes);
    if (status == CLATTN_SUCCESS) status = tune_workspace(c, bytes);
    options.workspace = bytes ? c->workspace : NULL;
    if (status == CLATTN_SUCCESS)
        status = clattn_linear_attention(&c->in[0], &c->in[1], &c->in[2], &c->mask, &c->out,
                                         &options, queue, 0, NULL, NULL);
    return status;
}

static int reference(tune_case *c, const linear_shape *s, const float *q, const float *k,
                     const float *v) {
    const size_t n = (size_t)(s->B * s->H * s->S * s->D);
    const ref_mask mask = {.causal = s->causal};
    const ref_linear p = {
        s->B, s->H, s->H, s->S, s->S, s->D, s->D, CLATTN_FEATURE_ELU1, CLATTN_LINEAR_EPS, &mask};
    c->ref = malloc(n * sizeof *c->ref);
    c->err_scale = malloc(n * sizeof *c->err_scale);
    float *v_abs = malloc(n * sizeof *v_abs);
    if (c->ref && c->err_scale && v_abs) {
        for (size_t i = 0; i < n; ++i) v_abs[i] = fabsf(v[i]);
        ref_linear_attention_cumsum(&p, q, k, v, c->ref);
        ref_linear_attention_cumsum(&p, q, k, v_abs, c->err_scale);
    }
    free(v_abs);
    return c->ref && c->err_scale ? CLATTN_SUCCESS : CLATTN_ERR_OUT_OF_HOST_MEMORY;
}

static int make(tune_case *c, bool with_reference, int index) {
    const linear_shape *s = &shapes[index];
    const int64_t shape[4] = {s->B, s->H, s->S, s->D};
    const size_t n = (size_t)(s->B * s->H * s->S * s->D);
    snprintf(c->shape, sizeof c->shape, "B=%lld H=%lld S=%lld D=%lld%s", (long long)s->B,
             (long long)s->H, (long long)s->S, (long long)s->D, s->causal ? " causal" : "");
    uint64_t seed = 17 + (uint64_t)index;
    float *q = tune_random(n, &seed, -1.0f, 1.0f), *k = tune_random(n, &seed, -1.0f, 1.0f);
    float *v = tune_random(n, &seed, -1.0f, 1.0f);
    int status = q && k && v ? tune_tensor(c, shape, q, &c->in[0]) : CLATTN_ERR_OUT_OF_HOST_MEMORY;
    if (status == CLATTN_SUCCESS) status = tune_tensor(c, shape, k, &c->in[1]);
    if (status == CLATTN_SUCCESS) status = tune_tensor(c, shape, v, &c->in[2]);
    if (status == CLATTN_SUCCESS) status = tune_tensor(c, shape, NULL, &c->out);
    if (status == CLATTN_SUCCESS && with_reference) status = reference(c, s, q, k, v);
    c->mask.causal = s->causal;
    c->compute = true;
    c->work = 4.0 * (double)(n * (size_t)s->D); /* 4*B*H*S*D*Dv flops */
    c->atol = 2e-5 * fmax(1.0, sqrt((double)s->S / 64.0));
    c->enqueue = enqueue;
    free(q);
    free(k);
    free(v);
    return status;
}

int tune_linear_cases(clattn_env *env, bool with_reference, tune_case *cases, int *count) {
    const int n = (int)(sizeof shapes / sizeof shapes[0]);
    return tune_make_cases(env, with_reference, n, make, cases, count);
}
