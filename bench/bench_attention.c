/* Rows for the fused attention: GFLOP/s counting 4*B*H*Sq*Sk*D (halved under causal masking,
 * and labelled so), against the FMA kernel timed beside each row, and the ratio against
 * PyTorch's matmul -> masked_fill -> softmax -> matmul. */
#include "bench.h"

#include <string.h>

typedef struct attention_case {
    const char *op; /* attention | attention_causal */
    clattn_dtype dtype;
    int64_t b, h, s, d;
} attention_case;

typedef struct attention_ctx {
    const attention_case *c;
    clattn_tensor q, k, v, out;
    clattn_mask mask;
} attention_ctx;

static int run_attention(void *p, cl_command_queue queue) {
    attention_ctx *x = p;
    return clattn_attention(&x->q, &x->k, &x->v, 0.0f, &x->mask, &x->out, NULL, queue, 0, NULL,
                            NULL);
}

static int alloc_case(clattn_env *env, const attention_case *c, attention_ctx *x) {
    memset(x, 0, sizeof *x);
    x->c = c;
    x->mask.causal = strcmp(c->op, "attention_causal") == 0;
    const int64_t shape[4] = {c->b, c->h, c->s, c->d};
    clattn_tensor *all[4] = {&x->q, &x->k, &x->v, &x->out};
    int status = CLATTN_SUCCESS;
    for (int i = 0; i < 4 && status == CLATTN_SUCCESS; ++i) {
        status = clattn_env_alloc(env, c->dtype, shape, all[i]);
        cl_uchar zero = 0;
        if (status == CLATTN_SUCCESS)
            status = clEnqueueFillBuffer(
                clattn_env_queue(env), all[i]->buffer, &zero, 1, 0,
                (size_t)(c->b * c->h * c->s * c->d) * clattn_dtype_size(c->dtype), 0, NULL, NULL);
    }
    return status;
}

static void free_case(attention_ctx *x) {
    clattn_tensor *all[4] = {&x->q, &x->k, &x->v, &x->out};
    for (int i = 0; i < 4; ++i) clattn_tensor_free(all[i]);
}

static const char *case_op(const void *cases, int i) {
    return ((const attention_case *)cases)[i].op;
}

static void case_key(const void *cases, int i, char *key, size_t capacity) {
    const attention_case *c = (const attention_case *)cases + i;
    snprintf(key, capacity, "%s %s %lld,%lld,%lld,%lld", c->op, clattn_dtype_name(c->dtype),
             (long long)c->b, (long long)c->h, (long long)c->s, (long long)c->d);
}

static int measure(const bench_options *opt, clattn_env *env, bench_ceilings *ceilings,
                   const void *cases, int i, double torch_ms, bench_report *report) {
    const attention_case *c = (const attention_case *)cases + i;
    attention_ctx x;
    bench_timing timing;
    double fma_gflops = 0;
    int status = alloc_case(env, c, &x);
    if (status == CLATTN_SUCCESS)
        status = bench_time_vs_fma(opt, ceilings, run_attention, &x, clattn_env_queue(env), &timing,
                                   &fma_gflops);
    if (status == CLATTN_SUCCESS) {
        bool causal = x.mask.causal != 0;
        char shape[96];
        snprintf(shape, sizeof shape, "B=%lld H=%lld S=%lld D=%lld%s", (long long)c->b,
                 (long long)c->h, (long long)c->s, (long long)c->d,
                 causal ? " causal(flops/2)" : "");
        double flops = 4.0 * (double)(c->b * c->h * c->s * c->s * c->d) * (causal ? 0.5 : 1.0);
        status = bench_add_compute_row(report, env, c->op, "fused", c->dtype, shape, &timing, flops,
                                       fma_gflops, torch_ms);
    }
    free_case(&x);
    return status;
}

int bench_attention(const bench_options *opt, clattn_env *env, bench_ceilings *ceilings,
                    bench_report *report) {
    int64_t b = opt->quick ? 1 : 4, s = opt->quick ? 256 : 1024;
    const attention_case cases[] = {
        {"attention_causal", CLATTN_F32, b, 8, s, 64},
        {"attention", CLATTN_F32, b, 8, s, 64},
    };
    const bench_family family = {sizeof cases / sizeof cases[0], case_op, case_key, measure};
    return bench_run_family(opt, env, ceilings, report, &family, cases);
}
