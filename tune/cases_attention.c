/* The fused attention op's cases: a causal prefill and a decoding step against a long KV cache
 * (the split-keys launch). Tolerance as tests/test_attention.c's for f32. */
#include "tune.h"

#include "../tests/ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct attention_shape {
    int64_t B, H, Sq, Sk, D;
    int causal;
} attention_shape;

static const attention_shape shapes[] = {{1, 8, 512, 512, 64, 1}, {1, 8, 1, 8192, 64, 0}};

/* The workspace is sized for each candidate: its split of the keys sets the need. */
static int enqueue(tune_case *c, cl_command_queue queue) {
    clattn_attention_options options = {CLATTN_PATH_FUSED, NULL, NULL};
    size_t bytes = 0;
    int status = clattn_attention_workspace_size(&c->in[0], &c->in[1], &c->in[2], &c->mask, &c->out,
                                                 NULL, &options, queue, &bytes);
    if (status == CLATTN_SUCCESS) status = tune_workspace(c, bytes);
    options.workspace = bytes ? c->workspace : NULL;
    if (status == CLATTN_SUCCESS)
        status = clattn_attention_ex(&c->in[0], &c->in[1], &c->in[2], 0.0f, &c->mask, &c->out, NULL,
                                     &options, queue, 0, NULL, NULL);
    return status;
}

/* softmax(q k^T / sqrt(D)) v in float64 (tests/ref.c). */
static double *reference(const attention_shape *s, const float *q, const float *k, const float *v) {
    const ref_mask mask = {.causal = s->causal};
    double *out = malloc((size_t)(s->B * s->H * s->Sq * s->D) * sizeof *out);
    double *p = malloc((size_t)(s->B * s->H * s->Sq * s->Sk) * sizeof *p);
    bool done = out && p &&
                ref_attention(q, k, v, s->B, s->H, s->H, s->Sq, s->Sk, s->D, s->D,
                              1.0 / sqrt((double)s->D), &mask, out, p, NULL);
    free(p);
    if (!done) free(out);
    return done ? out : NULL;
}

static int make(tune_case *c, bool with_reference, int index) {
    const attention_shape *s = &shapes[index];
    const int64_t q_shape[4] = {s->B, s->H, s->Sq, s->D}, kv_shape[4] = {s->B, s->H, s->Sk, s->D};
    snprintf(c->shape, sizeof c->shape, "B=%lld H=%lld Sq=%lld Sk=%lld D=%lld%s", (long long)s->B,
             (long long)s->H, (long long)s->Sq, (long long)s->Sk, (long long)s->D,
             s->causal ? " causal" : "");
    uint64_t seed = 13 + (uint64_t)index;
    float *q = tune_random((size_t)(s->B * s->H * s->Sq * s->D), &seed, -1.0f, 1.0f);
    float *k = tune_random((size_t)(s->B * s->H * s->Sk * s->D), &seed, -1.0f, 1.0f);
    float *v = tune_random((size_t)(s->B * s->H * s->Sk * s->D), &seed, -1.0f, 1.0f);
    int status =
        q && k && v ? tune_tensor(c, q_shape, q, &c->in[0]) : CLATTN_ERR_OUT_OF_HOST_MEMORY;
    if (status == CLATTN_SUCCESS) status = tune_tensor(c, kv_shape, k, &c->in[1]);
    if (status == CLATTN_SUCCESS) status = tune_tensor(c, kv_shape, v, &c->in[2]);
    if (status == CLATTN_SUCCESS) status = tune_tensor(c, q_shape, NULL, &c->out);
    if (status == CLATTN_SUCCESS && with_reference && !(c->ref = reference(s, q, k, v)))
        status = CLATTN_ERR_OUT_OF_HOST_MEMORY;
    c->mask.causal = s->causal;
    /* a prefill computes (4*B*H*Sq*Sk*D flops, halved when causal); decoding streams K and V */
    c->compute = s->Sq > 1;
    c->work = c->compute ? 4.0 * (double)(s->B * s->H * s->Sq * s->Sk * s->D) / (s->causal ? 2 : 1)
                         : 4.0 * 2.0 * (double)(s->B * s->H * (s->Sk + s->Sq) * s->D);
    c->atol = 1e-5;
    c->rtol = 2e-5;
    c->enqueue = enqueue;
    free(q);
    free(k);
    free(v);
    return status;
}

int tune_attention_cases(clattn_env *env, bool with_reference, tune_case *cases, int *count) {
    const int n = (int)(sizeof shapes / sizeof shapes[0]);
    return tune_make_cases(env, with_reference, n, make, cases, count);
}
