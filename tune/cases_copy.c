/* The copy op's cases: split heads, a row-major [B,S,H*D] into [B,H,S,D]; exact. */
#include "tune.h"

#include <stdio.h>
#include <stdlib.h>

/* B, S, H, D: a head layout of the benchmark's size class, and an odd one (tails). */
static const int64_t shapes[][4] = {{2, 1024, 8, 64}, {1, 333, 3, 40}};

static int enqueue(tune_case *c, cl_command_queue queue) {
    return clattn_split_heads(&c->in[0], (int)c->heads, &c->out, queue, 0, NULL, NULL);
}

static double *reference(const int64_t *s, const float *x) {
    const int64_t B = s[0], S = s[1], H = s[2], D = s[3];
    double *ref = malloc((size_t)(B * S * H * D) * sizeof *ref);
    for (int64_t b = 0; ref && b < B; ++b)
        for (int64_t h = 0; h < H; ++h)
            for (int64_t i = 0; i < S; ++i)
                for (int64_t d = 0; d < D; ++d)
                    ref[((b * H + h) * S + i) * D + d] = x[(b * S + i) * H * D + h * D + d];
    return ref;
}

static int make(tune_case *c, bool with_reference, int index) {
    const int64_t *s = shapes[index];
    const int64_t in_shape[4] = {1, s[0], s[1], s[2] * s[3]},
                  out_shape[4] = {s[0], s[2], s[1], s[3]};
    snprintf(c->shape, sizeof c->shape, "B=%lld S=%lld H=%lld D=%lld", (long long)s[0],
             (long long)s[1], (long long)s[2], (long long)s[3]);
    uint64_t seed = 7 + (uint64_t)index;
    float *x = tune_random((size_t)(s[0] * s[1] * s[2] * s[3]), &seed, -1.0f, 1.0f);
    int status = x ? tune_tensor(c, in_shape, x, &c->in[0]) : CLATTN_ERR_OUT_OF_HOST_MEMORY;
    if (status == CLATTN_SUCCESS) status = tune_tensor(c, out_shape, NULL, &c->out);
    if (status == CLATTN_SUCCESS && with_reference && !(c->ref = reference(s, x)))
        status = CLATTN_ERR_OUT_OF_HOST_MEMORY;
    c->heads = s[2];
    c->work = 2.0 * 4.0 * (double)(s[0] * s[1] * s[2] * s[3]); /* bytes read and written */
    c->enqueue = enqueue;
    free(x);
    return status;
}

int tune_copy_cases(clattn_env *env, bool with_reference, tune_case *cases, int *count) {
    const int n = (int)(sizeof shapes / sizeof shapes[0]);
    return tune_make_cases(env, with_reference, n, make, cases, count);
}
