/* Rows for the masked softmax: GB/s (one read and one write of the scores), percent of the copy
 * bandwidth timed beside each row, and the ratio against PyTorch's x.masked_fill(~mask, -inf)
 * followed by softmax (mask built once, outside the timing, as users do). */
#include "bench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct softmax_case {
    const char *op; /* softmax | softmax_masked (causal + key lengths) */
    clattn_dtype dtype;
    int64_t b, h, s;
} softmax_case;

typedef struct softmax_ctx {
    const softmax_case *c;
    clattn_tensor x, y, lengths;
    clattn_mask mask;
    float *scores; /* the host image of x */
} softmax_ctx;

static int run_softmax(void *p, cl_command_queue queue) {
    softmax_ctx *x = p;
    bool masked = strcmp(x->c->op, "softmax_masked") == 0;
    return clattn_softmax(&x->x, 0.125f, masked ? &x->mask : NULL, &x->y, NULL, queue, 0, NULL,
                          NULL);
}

static const char *case_op(const void *cases, int i) {
    return ((const softmax_case *)cases)[i].op;
}

static void case_key(const void *cases, int i, char *key, size_t capacity) {
    const softmax_case *c = (const softmax_case *)cases + i;
    snprintf(key, capacity, "%s %s %lld,%lld,%lld,%lld", c->op, clattn_dtype_name(c->dtype),
             (long long)c->b, (long long)c->h, (long long)c->s, (long long)c->s);
}

/* Key lengths Sk - b*Sk/8: the same rule as bench/peers/torch_ops.py. */
static int alloc_case(clattn_env *env, const softmax_case *c, softmax_ctx *x) {
    memset(x, 0, sizeof *x);
    x->c = c;
    const int64_t scores[4] = {c->b, c->h, c->s, c->s}, vector[4] = {1, 1, 1, c->b};
    int status = clattn_env_alloc(env, c->dtype, scores, &x->x);
    if (status == CLATTN_SUCCESS) status = clattn_env_alloc(env, c->dtype, scores, &x->y);
    if (status == CLATTN_SUCCESS) status = clattn_env_alloc(env, CLATTN_I32, vector, &x->lengths);
    int32_t *lengths = calloc((size_t)c->b, sizeof *lengths);
    for (int64_t b = 0; b < c->b && lengths; ++b) lengths[b] = (int32_t)(c->s - b * c->s / 8);
    if (status == CLATTN_SUCCESS)
        status =
            lengths ? clattn_env_upload(env, &x->lengths, lengths) : CLATTN_ERR_OUT_OF_HOST_MEMORY;
    free(lengths);
    if (status == CLATTN_SUCCESS) status = bench_fill_random(env, &x->x, 3, 1.0f, &x->scores);
    x->mask.causal = 1;
    x->mask.key_lengths = &x->lengths;
    return status;
}

static void free_case(softmax_ctx *x) {
    clattn_tensor_free(&x->x);
    clattn_tensor_free(&x->y);
    clattn_tensor_free(&x->lengths);
    free(x->scores);
}

/* One row of probabilities in float64: exp(0.125 x_j - max) / sum over the visible j (j <= i
 * and j below the batch's key length when masked), 0 elsewhere. */
static void reference_row(const softmax_ctx *x, int64_t b, int64_t i, const float *row, double *p) {
    const softmax_case *c = x->c;
    const bool masked = strcmp(c->op, "softmax_masked") == 0;
    const int64_t visible =
        masked ? (i + 1 < c->s - b * c->s / 8 ? i + 1 : c->s - b * c->s / 8) : c->s;
    double top = -INFINITY, sum = 0;
    for (int64_t j = 0; j < visible; ++j) top = fmax(top, 0.125 * row[j]);
    for (int64_t j = 0; j < c->s; ++j) {
        p[j] = j < visible ? exp(0.125 * row[j] - top) : 0.0;
        sum += p[j];
    }
    for (int64_t j = 0; j < c->s; ++j) p[j] /= sum;
}

/* 16 sampled rows, every entry, against the reference; errors relative to the row's largest
 * probability (a 16-bit store of a tiny one is off by its spacing, not by a relative bit). */
static int check_softmax(void *p, clattn_env *env, bench_report *report, bool *ok) {
    softmax_ctx *x = p;
    const softmax_case *c = x->c;
    float *y = NULL;
    double *want = malloc((size_t)c->s * sizeof *want);
    int status = want ? bench_read(env, &x->y, &y) : CLATTN_ERR_OUT_OF_HOST_MEMORY;
    uint64_t state = 11;
    *ok = status == CLATTN_SUCCESS;
    for (int k = 0; k < 16 && *ok; ++k) {
        const size_t row = bench_sample(&state, (size_t)(c->b * c->h * c->s));
        const int64_t i = (int64_t)row % c->s, b = (int64_t)row / (c->s * c->h);
        reference_row(x, b, i, x->scores + row * (size_t)c->s, want);
        double top = 0;
        for (int64_t j = 0; j < c->s; ++j) top = fmax(top, want[j]);
        for (int64_t j = 0; j < c->s && *ok; ++j)
            *ok = bench_close(report, "y", row * (size_t)c->s + (size_t)j,
                              y[row * (size_t)c->s + (size_t)j], want[j], top, c->dtype);
    }
    free(y);
    free(want);
    return status;
}

static int measure(const bench_options *opt, clattn_env *env, bench_ceilings *ceilings,
                   const void *cases, int i, double torch_ms, bench_report *report) {
    const softmax_case *c = (const softmax_case *)cases + i;
    softmax_ctx x;
    bench_timing timing;
    double copy_gbs = 0;
    char shape[96];
    snprintf(shape, sizeof shape, "%lldx%lldx%lldx%lld%s", (long long)c->b, (long long)c->h,
             (long long)c->s, (long long)c->s,
             strcmp(c->op, "softmax_masked") == 0 ? " causal+klen" : "");
    const bench_row_name row = {c->op, "auto", c->dtype, shape};
    bool wrong = false;
    int status = alloc_case(env, c, &x);
    if (status == CLATTN_SUCCESS)
        status = bench_check_row(report, env, run_softmax, &x, check_softmax, &row, &wrong);
    if (status == CLATTN_SUCCESS && !wrong)
        status = bench_time_vs_copy(opt, ceilings, run_softmax, &x, clattn_env_queue(env), &timing,
                                    &copy_gbs);
    if (status == CLATTN_SUCCESS && !wrong) {
        double bytes =
            2.0 * (double)(c->b * c->h * c->s * c->s) * (double)clattn_dtype_size(c->dtype);
        status = bench_add_memory_row(report, env, c->op, "auto", c->dtype, shape, &timing, bytes,
                                      copy_gbs, torch_ms);
    }
    free_case(&x);
    return status;
}

int bench_softmax(const bench_options *opt, clattn_env *env, bench_ceilings *ceilings,
                  bench_report *report) {
    int64_t b = opt->quick ? 1 : 4, h = opt->quick ? 4 : 8;
    int64_t s1 = opt->quick ? 256 : 1024, s2 = opt->quick ? 512 : 2048;
    const softmax_case cases[] = {
        {"softmax_masked", CLATTN_F32, b, h, s1},
        {"softmax_masked", CLATTN_F16, b, h, s1},
        {"softmax", CLATTN_F32, b, h, s2},
        {"softmax", CLATTN_F16, b, h, s2},
    };
    const bench_family family = {sizeof cases / sizeof cases[0], case_op, case_key, measure};
    return bench_run_family(opt, env, ceilings, report, &family, cases);
}
