/* Rows for the multi-head reshape ops: GB/s (one read and one write of every element), percent
 * of the copy bandwidth measured in the same run, and the ratio against PyTorch's
 * x.view(B,S,H,D).transpose(1,2).contiguous() and its inverse; and for a transposing copy,
 * clattn_copy of a [B,H,S,E] tensor's view with its two inner dims swapped against
 * x.transpose(-1, -2).contiguous() (attention's backward transposes p and dS so). */
#include "bench.h"

#include <stdlib.h>
#include <string.h>

typedef struct heads_case {
    const char *op; /* split_heads | merge_heads | split_qkv | transpose */
    clattn_dtype dtype;
    int64_t b, s, e, h; /* e = H*D (per part for split_qkv); transpose: [B,H,S,E] */
} heads_case;

typedef struct heads_ctx {
    const heads_case *c;
    clattn_tensor packed, heads[3];
    float *input; /* the host image of the op's input: packed, or heads[0] for merge_heads */
} heads_ctx;

static const int swap_inner[4] = {0, 1, 3, 2};

static bool is_transpose(const heads_case *c) {
    return strcmp(c->op, "transpose") == 0;
}

static int run_heads(void *p, cl_command_queue queue) {
    heads_ctx *x = p;
    if (is_transpose(x->c)) {
        clattn_tensor view = clattn_tensor_permute(x->packed, swap_inner);
        return clattn_copy(&view, NULL, &x->heads[0], queue, 0, NULL, NULL);
    }
    if (strcmp(x->c->op, "split_heads") == 0)
        return clattn_split_heads(&x->packed, (int)x->c->h, &x->heads[0], queue, 0, NULL, NULL);
    if (strcmp(x->c->op, "merge_heads") == 0)
        return clattn_merge_heads(&x->heads[0], &x->packed, queue, 0, NULL, NULL);
    return clattn_split_qkv(&x->packed, NULL, (int)x->c->h, &x->heads[0], &x->heads[1],
                            &x->heads[2], queue, 0, NULL, NULL);
}

static int parts_of(const heads_case *c) {
    return strcmp(c->op, "split_qkv") == 0 ? 3 : 1;
}

static const char *case_op(const void *cases, int i) {
    return ((const heads_case *)cases)[i].op;
}

static void case_key(const void *cases, int i, char *key, size_t capacity) {
    const heads_case *c = (const heads_case *)cases + i;
    snprintf(key, capacity, "%s %s %lld,%lld,%lld,%lld", c->op, clattn_dtype_name(c->dtype),
             (long long)c->b, (long long)c->s, (long long)c->e, (long long)c->h);
}

static int alloc_case(clattn_env *env, const heads_case *c, heads_ctx *x) {
    memset(x, 0, sizeof *x);
    x->c = c;
    int parts = parts_of(c);
    const bool transpose = is_transpose(c);
    const int64_t packed[4] = {transpose ? c->b : 1, transpose ? c->h : c->b, c->s, parts * c->e};
    const int64_t heads[4] = {c->b, c->h, transpose ? c->e : c->s, transpose ? c->s : c->e / c->h};
    int status = clattn_env_alloc(env, c->dtype, packed, &x->packed);
    for (int p = 0; p < parts && status == CLATTN_SUCCESS; ++p)
        status = clattn_env_alloc(env, c->dtype, heads, &x->heads[p]);
    /* fill every tensor, so no driver sees untouched pages; the input's values are checked */
    const bool merge = strcmp(c->op, "merge_heads") == 0;
    for (int p = -1; p < parts && status == CLATTN_SUCCESS; ++p) {
        clattn_tensor *t = p < 0 ? &x->packed : &x->heads[p];
        const bool input = merge ? p == 0 : p < 0;
        status = bench_fill_random(env, t, (uint64_t)(p + 2), 1.0f, input ? &x->input : NULL);
    }
    return status;
}

static void free_case(heads_ctx *x) {
    clattn_tensor_free(&x->packed);
    for (int p = 0; p < 3; ++p) clattn_tensor_free(&x->heads[p]);
    free(x->input);
}

/* Sampled elements of the transpose are the input's, bit for bit. */
static int check_transpose(heads_ctx *x, clattn_env *env, bench_report *report, bool *ok) {
    const heads_case *c = x->c;
    float *out = NULL;
    int status = bench_read(env, &x->heads[0], &out);
    uint64_t state = 7;
    *ok = true;
    const int64_t n = c->b * c->h * c->s * c->e;
    for (int k = 0; k < 256 && status == CLATTN_SUCCESS && *ok; ++k) {
        const int64_t at = (int64_t)bench_sample(&state, (size_t)n); /* in [B,H,E,S] order */
        const int64_t ss = at % c->s, ee = at / c->s % c->e, bh = at / (c->s * c->e);
        *ok = bench_close(report, "transposed", (size_t)at, out[at],
                          x->input[(bh * c->s + ss) * c->e + ee], 0.0, CLATTN_F32);
    }
    free(out);
    return status;
}

/* Sampled elements of each output are the input's, bit for bit (the same dtype). */
static int check_heads(void *p, clattn_env *env, bench_report *report, bool *ok) {
    heads_ctx *x = p;
    const heads_case *c = x->c;
    if (is_transpose(c)) return check_transpose(x, env, report, ok);
    const bool merge = strcmp(c->op, "merge_heads") == 0;
    const int64_t d = c->e / c->h, width = parts_of(c) * c->e, n = c->b * c->h * c->s * d;
    uint64_t state = 7;
    int status = CLATTN_SUCCESS;
    *ok = true;
    for (int part = 0; part < parts_of(c) && *ok && status == CLATTN_SUCCESS; ++part) {
        float *out = NULL;
        status = bench_read(env, merge ? &x->packed : &x->heads[part], &out);
        for (int k = 0; k < 256 && status == CLATTN_SUCCESS && *ok; ++k) {
            const int64_t at = (int64_t)bench_sample(&state, (size_t)n); /* in [B,H,S,D] order */
            const int64_t dd = at % d, ss = at / d % c->s, hh = at / (d * c->s) % c->h,
                          bb = at / (d * c->s * c->h);
            const int64_t packed = (bb * c->s + ss) * width + part * c->e + hh * d + dd;
            const float got = merge ? out[packed] : out[at],
                        want = merge ? x->input[at] : x->input[packed];
            *ok = bench_close(report, merge ? "packed" : "heads", (size_t)(merge ? packed : at),
                              got, want, 0.0, CLATTN_F32);
        }
        free(out);
    }
    return status;
}

static int measure(const bench_options *opt, clattn_env *env, bench_ceilings *ceilings,
                   const void *cases, int i, double torch_ms, bench_report *report) {
    const heads_case *c = (const heads_case *)cases + i;
    heads_ctx x;
    bench_timing timing;
    double copy_gbs = 0;
    char shape[96];
    const bool transpose = is_transpose(c);
    if (transpose)
        snprintf(shape, sizeof shape, "B=%lld H=%lld S=%lld E=%lld", (long long)c->b,
                 (long long)c->h, (long long)c->s, (long long)c->e);
    else
        snprintf(shape, sizeof shape, "B=%lld S=%lld H=%lld D=%lld", (long long)c->b,
                 (long long)c->s, (long long)c->h, (long long)(c->e / c->h));
    int status = alloc_case(env, c, &x);
    /* the kernel the library chose for the shape and the device's row (transpose_tiles or
     * transpose4d for a transposed view) */
    char kernel[64] = "copy4d";
    if (status == CLATTN_SUCCESS)
        status = bench_kernel_that_ran(run_heads, &x, clattn_env_queue(env), kernel);
    const bench_row_name row = {c->op, kernel, c->dtype, shape};
    bool wrong = false;
    if (status == CLATTN_SUCCESS)
        status = bench_check_row(report, env, run_heads, &x, check_heads, &row, &wrong);
    if (status == CLATTN_SUCCESS && !wrong)
        status = bench_time_vs_copy(opt, ceilings, run_heads, &x, clattn_env_queue(env), &timing,
                                    &copy_gbs);
    if (status == CLATTN_SUCCESS && !wrong) {
        double elements = (double)(c->b * c->s * c->e) * (transpose ? (double)c->h : parts_of(c));
        double bytes = 2.0 * elements * (double)clattn_dtype_size(c->dtype);
        status = bench_add_memory_row(report, env, c->op, kernel, c->dtype, shape, &timing, bytes,
                                      copy_gbs, torch_ms);
    }
    free_case(&x);
    return status;
}

int bench_heads(const bench_options *opt, clattn_env *env, bench_ceilings *ceilings,
                bench_report *report) {
    /* The 16-bit rows move the bytes of the f32 rows beside them (twice the batch), so that their
     * share of the copy kernel (whose size is the f32 reshape's) is not a share of a call half
     * as long, whose fixed cost (the host, the launch) weighs twice as much. */
    int64_t b = opt->quick ? 2 : 8, s = opt->quick ? 512 : 2048;
    const heads_case cases[] = {
        {"split_heads", CLATTN_F32, b, s, 1024, 16},
        {"merge_heads", CLATTN_F32, b, s, 1024, 16},
        {"split_heads", CLATTN_F16, 2 * b, s, 1024, 16},
        {"merge_heads", CLATTN_F16, 2 * b, s, 1024, 16},
        {"split_heads", CLATTN_F32, b, s, 1024, 8},
        {"split_qkv", CLATTN_F32, b, s, 1024, 16},
        /* attention's p at B=4 H=8 S=1024 (B=1 H=4 S=256 quick) */
        {"transpose", CLATTN_F32, b / 2, s / 2, s / 2, 8 / (1 + opt->quick)},
        {"transpose", CLATTN_F16, b, s / 2, s / 2, 8 / (1 + opt->quick)},
    };
    const bench_family family = {sizeof cases / sizeof cases[0], case_op, case_key, measure};
    return bench_run_family(opt, env, ceilings, report, &family, cases);
}
