/* Rows for attention: GFLOP/s counting 4*B*H*Sq*Sk*D (halved under causal masking, and
 * labelled so), against the FMA kernel timed beside each row, and the ratio against PyTorch's
 * scaled_dot_product_attention (torch 2.0 and later; matmul -> masked_fill -> softmax -> matmul
 * on torch 1.x). The fused kernel and the composed (CLBlast) path
 * run the same cases; attention_memory runs a length whose scores would not fit (and reports
 * the scratch the library allocated beside what the composed path would need);
 * attention_decode is one query against a long KV cache (the split-key kernel). The fused kernel
 * also runs D=128 and f16 storage (non-causal and causal: the matrix-unit variant's rows),
 * which should reach the f32 D=64 row's GFLOP/s. */
#include "bench.h"

#include <math.h>
#include <stdlib.h>
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
    float *host[3]; /* the host images of q, k, v */
} attention_ctx;

/* Every row but attention_memory's (which reports what the library allocates itself) passes a
 * workspace, as a caller who repeats the call would: a call without one allocates its scratch
 * afresh, and on a CPU the first touch of it costs page faults every call. */
static bool takes_workspace(const attention_case *c) {
    return strcmp(c->op, "attention_memory") != 0;
}

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
        if (status == CLATTN_SUCCESS)
            status = bench_fill_random(env, all[i], (uint64_t)(i + 20), 1.0f,
                                       i < 3 ? &x->host[i] : NULL);
    }
    size_t bytes = 0;
    if (status == CLATTN_SUCCESS && takes_workspace(c))
        status = clattn_attention_workspace_size(&x->q, &x->k, &x->v, &x->mask, &x->out, NULL,
                                                 &x->options, clattn_env_queue(env), &bytes);
    if (status == CLATTN_SUCCESS && bytes > 0)
        status = bench_workspace(env, bytes, &x->options.workspace);
    return status;
}

static void free_case(attention_ctx *x) {
    clattn_tensor *all[4] = {&x->q, &x->k, &x->v, &x->out};
    for (int i = 0; i < 4; ++i) clattn_tensor_free(all[i]);
    for (int i = 0; i < 3; ++i) free(x->host[i]);
    if (x->options.workspace) clReleaseMemObject(x->options.workspace);
}

/* Query row (b, h, i) in float64: keys j <= i when causal (Sq = Sk), else every key. */
static void reference_row(const attention_ctx *x, int64_t b, int64_t h, int64_t i, double *w,
                          double *out) {
    const attention_case *c = x->c;
    const int64_t d = c->d, head = b * c->h + h;
    bench_attention_row(x->host[0] + (head * c->sq + i) * d, x->host[1] + head * c->sk * d,
                        x->host[2] + head * c->sk * d, d, x->mask.causal ? i + 1 : c->sk, w, out);
}

/* 8 sampled query rows, every output dim, against the reference (|v| < 1: errors are taken
 * against 1). */
static int check_attention(void *p, clattn_env *env, bench_report *report, bool *ok) {
    attention_ctx *x = p;
    const attention_case *c = x->c;
    float *out = NULL;
    double *w = malloc((size_t)c->sk * sizeof *w), *want = malloc((size_t)c->d * sizeof *want);
    int status = w && want ? bench_read(env, &x->out, &out) : CLATTN_ERR_OUT_OF_HOST_MEMORY;
    uint64_t state = 13;
    *ok = status == CLATTN_SUCCESS;
    for (int n = 0; n < 8 && *ok; ++n) {
        const size_t row = bench_sample(&state, (size_t)(c->b * c->h * c->sq));
        const int64_t i = (int64_t)row % c->sq, bh = (int64_t)row / c->sq;
        reference_row(x, bh / c->h, bh % c->h, i, w, want);
        for (int64_t e = 0; e < c->d && *ok; ++e)
            *ok = bench_close(report, "out", row * (size_t)c->d + (size_t)e,
                              out[row * (size_t)c->d + (size_t)e], want[e], 1.0, c->dtype);
    }
    free(out), free(w), free(want);
    return status;
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
 * kernel); the others are compute rows (GFLOP/s against the FMA kernel, or for 16-bit rows the
 * matrix-unit kernel where the device has one). */
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
    char shape[160], scratch[64] = "";
    case_shape(c, "", shape, sizeof shape);
    const bench_row_name row = {c->op, variant, c->dtype, shape};
    bool wrong = false;
    if (status == CLATTN_SUCCESS)
        status = bench_check_row(report, env, run_attention, &x, check_attention, &row, &wrong);
    if (status == CLATTN_SUCCESS && !wrong)
        status =
            decode ? bench_time_vs_copy(opt, ceilings, run_attention, &x, queue, &timing, &ceiling)
                   : bench_time_vs_compute(opt, ceilings, c->dtype, run_attention, &x, queue,
                                           &timing, &ceiling);
    if (status == CLATTN_SUCCESS && !wrong && strcmp(c->op, "attention_memory") == 0)
        scratch_note(&x, env, clattn_scratch_peak_bytes(0), scratch, sizeof scratch);
    case_shape(c, scratch, shape, sizeof shape);
    const double elements = (double)(c->b * c->h * (2 * c->sq + 2 * c->sk) * c->d);
    const double flops =
        4.0 * (double)(c->b * c->h * c->sq * c->sk * c->d) * (x.mask.causal ? 0.5 : 1.0);
    if (status == CLATTN_SUCCESS && !wrong && decode)
        status =
            bench_add_memory_row(report, env, c->op, variant, c->dtype, shape, &timing,
                                 elements * (double)clattn_dtype_size(c->dtype), ceiling, torch_ms);
    else if (status == CLATTN_SUCCESS && !wrong)
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
        {"attention_causal", fused, CLATTN_F16, b, 8, s, s, 64},
        {"attention", fused, CLATTN_F32, b, 8, s, s, 64},
        {"attention", composed, CLATTN_F32, b, 8, s, s, 64},
        {"attention", fused, CLATTN_F32, b, 8, s, s, 128},
        {"attention", fused, CLATTN_F16, b, 8, s, s, 64},
        {"attention", fused, CLATTN_F16, b, 8, s, s, 128},
        {"attention_memory", fused, CLATTN_F32, 1, 8, long_s, long_s, 64},
        {"attention_decode", fused, CLATTN_F32, 1, 32, 1, cache, 128},
    };
    const bench_family family = {sizeof cases / sizeof cases[0], case_op, case_key, measure};
    return bench_run_family(opt, env, ceilings, report, &family, cases);
}
