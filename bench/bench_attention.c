/* Rows for attention: GFLOP/s counting 4*B*H*Sq*Sk*D (halved under causal masking, and
 * labelled so), against the FMA kernel timed beside each row, and the ratio against PyTorch's
 * matmul -> masked_fill -> softmax -> matmul. The fused kernel and the composed (CLBlast) path
 * run the same cases; attention_memory runs a length whose scores would not fit (and reports
 * the scratch the library allocated beside what the composed path would need);
 * attention_decode is one query against a long KV cache (the split-key kernel). */
#include "bench.h"

#include <string.h>

typedef struct attention_case {
    const char *op; /* attention | attention_causal | attention_memory | attention_decode */
    clattn_attention_path path;
    clattn_dtype dtype;
    int64_t b, h, sq, sk, d;
} attention_case;

typedef struct attention_ctx {
    const attention_case *c;
    clattn_tensor q, k, v, out;
    clattn_mask mask;
    clattn_attention_options options;
} attention_ctx;

static int run_attention(void *p, cl_command_queue queue) {
    attention_ctx *x = p;
    return clattn_attention_ex(&x->q, &x->k, &x->v, 0.0f, &x->mask, &x->out, NULL, &x->options,
                               queue, 0, NULL, NULL);
}

static bool is_causal(const attention_case *c) {
    return strcmp(c->op, "attention_causal") == 0 || strcmp(c->op, "attention_memory") == 0;
}

static int alloc_case(clattn_env *env, const attention_case *c, attention_ctx *x) {
    memset(x, 0, sizeof *x);
    x->c = c;
    x->mask.causal = is_causal(c);
    x->options.path = c->path;
    const int64_t queries[4] = {c->b, c->h, c->sq, c->d}, keys[4] = {c->b, c->h, c->sk, c->d};
    clattn_tensor *all[4] = {&x->q, &x->k, &x->v, &x->out};
    int status = CLATTN_SUCCESS;
    for (int i = 0; i < 4 && status == CLATTN_SUCCESS; ++i) {
        const int64_t *shape = i == 1 || i == 2 ? keys : queries;
        status = clattn_env_alloc(env, c->dtype, shape, all[i]);
        cl_uchar zero = 0;
        if (status == CLATTN_SUCCESS)
            status = clEnqueueFillBuffer(
                clattn_env_queue(env), all[i]->buffer, &zero, 1, 0,
                (size_t)clattn_tensor_numel(all[i]) * clattn_dtype_size(c->dtype), 0, NULL, NULL);
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
    if (strcmp(c->op, "attention_decode") == 0)
        snprintf(key, capacity, "%s %s %lld,%lld,%lld,%lld,%lld", c->op,
                 clattn_dtype_name(c->dtype), (long long)c->b, (long long)c->h, (long long)c->sq,
                 (long long)c->sk, (long long)c->d);
    else
        snprintf(key, capacity, "%s %s %lld,%lld,%lld,%lld", c->op, clattn_dtype_name(c->dtype),
                 (long long)c->b, (long long)c->h, (long long)c->sq, (long long)c->d);
}

/* " scratch X MiB (composed: Y MiB)" for the memory row: what the fused run allocated, beside
 * what the composed path would need for the same call. */
static void scratch_note(attention_ctx *x, clattn_env *env, size_t peak, char *out, size_t size) {
    clattn_attention_options composed = {CLATTN_PATH_COMPOSED, NULL, NULL};
    size_t need = 0;
    clattn_attention_workspace_size(&x->q, &x->k, &x->v, &x->mask, &x->out, NULL, &composed,
                                    clattn_env_queue(env), &need);
    snprintf(out, size, " scratch %.1f MiB (composed: %.0f MiB)", (double)peak / 1048576.0,
             (double)need / 1048576.0);
}

static void case_shape(const attention_case *c, const char *note, char *shape, size_t size) {
    if (c->sq == c->sk)
        snprintf(shape, size, "B=%lld H=%lld S=%lld D=%lld%s%s", (long long)c->b, (long long)c->h,
                 (long long)c->sq, (long long)c->d, is_causal(c) ? " causal(flops/2)" : "", note);
    else
        snprintf(shape, size, "B=%lld H=%lld Sq=%lld Sk=%lld D=%lld", (long long)c->b,
                 (long long)c->h, (long long)c->sq, (long long)c->sk, (long long)c->d);
}

/* Decoding streams K and V once: it is a memory row (GB/s of q, k, v and out against the copy
 * kernel); the others are compute rows (GFLOP/s against the FMA kernel). */
static int measure(const bench_options *opt, clattn_env *env, bench_ceilings *ceilings,
                   const void *cases, int i, double torch_ms, bench_report *report) {
    const attention_case *c = (const attention_case *)cases + i;
    const bool decode = strcmp(c->op, "attention_decode") == 0;
    const char *variant = c->path == CLATTN_PATH_COMPOSED ? "composed" : "fused";
    attention_ctx x;
    bench_timing timing;
    double ceiling = 0;
    int status = alloc_case(env, c, &x);
    clattn_scratch_peak_bytes(1);
    cl_command_queue queue = clattn_env_queue(env);
    if (status == CLATTN_SUCCESS)
        status =
            decode ? bench_time_vs_copy(opt, ceilings, run_attention, &x, queue, &timing, &ceiling)
                   : bench_time_vs_fma(opt, ceilings, run_attention, &x, queue, &timing, &ceiling);
    char shape[160], scratch[64] = "";
    if (status == CLATTN_SUCCESS && strcmp(c->op, "attention_memory") == 0)
        scratch_note(&x, env, clattn_scratch_peak_bytes(0), scratch, sizeof scratch);
    case_shape(c, scratch, shape, sizeof shape);
    const double elements = (double)(c->b * c->h * (2 * c->sq + 2 * c->sk) * c->d);
    const double flops =
        4.0 * (double)(c->b * c->h * c->sq * c->sk * c->d) * (x.mask.causal ? 0.5 : 1.0);
    if (status == CLATTN_SUCCESS && decode)
        status =
            bench_add_memory_row(report, env, c->op, variant, c->dtype, shape, &timing,
                                 elements * (double)clattn_dtype_size(c->dtype), ceiling, torch_ms);
    else if (status == CLATTN_SUCCESS)
        status = bench_add_compute_row(report, env, c->op, variant, c->dtype, shape, &timing, flops,
                                       ceiling, torch_ms);
    free_case(&x);
    return status;
}

int bench_attention(const bench_options *opt, clattn_env *env, bench_ceilings *ceilings,
                    bench_report *report) {
    const int64_t b = opt->quick ? 1 : 4, s = opt->quick ? 256 : 1024;
    const int64_t long_s = opt->quick ? 2048 : 16384, cache = opt->quick ? 4096 : 32768;
    const clattn_attention_path fused = CLATTN_PATH_FUSED, composed = CLATTN_PATH_COMPOSED;
    const attention_case cases[] = {
        {"attention_causal", fused, CLATTN_F32, b, 8, s, s, 64},
        {"attention_causal", composed, CLATTN_F32, b, 8, s, s, 64},
        {"attention", fused, CLATTN_F32, b, 8, s, s, 64},
        {"attention", composed, CLATTN_F32, b, 8, s, s, 64},
        {"attention_memory", fused, CLATTN_F32, 1, 8, long_s, long_s, 64},
        {"attention_decode", fused, CLATTN_F32, 1, 32, 1, cache, 128},
    };
    const bench_family family = {sizeof cases / sizeof cases[0], case_op, case_key, measure};
    return bench_run_family(opt, env, ceilings, report, &family, cases);
}
