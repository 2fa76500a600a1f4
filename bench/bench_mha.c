/* Rows for multi-head attention and the GEMMs under it.
 *
 * gemm: c = a w^T on the MHA's projection shapes, first through CLBlast with its own database
 * (what a CLBlast user gets untuned), then through clattn's bridge with the tuning table's gemm
 * row (clblast-row), then as the library runs it (clattn: the GEMM the device's matmul row
 * picks: clattn's micro-kernel on CPUs, matmul_mma's 3xTF32 products where the probes find
 * NVIDIA's tf32 unit and the row's UNIT_F32 asks), each against the FMA kernel timed beside it,
 * beside torch's a @ w.T (OpenBLAS). CLBlast cannot return to its database once parameters were
 * given, and it rebuilds its GEMM on each change, so the two cannot alternate call by call: the
 * database rows run first, before any other op of the process gives CLBlast the row
 * (clattn-bench runs this family first), and the ratio of the two is taken on values normalized
 * by their own FMA rate.
 *
 * units: f16 a, w and c on the matrix units (matmul_mma, MHA's GEMM with f16 storage), beside
 * torch's f16 a @ w.T, against the matrix-unit kernel; only where clattn_matrix_units finds
 * the f16 unit.
 *
 * mha: clattn_mha_forward on self-attention (packed weights, biases, no mask, no weights),
 * beside torch.nn.MultiheadAttention (eval, no grad, need_weights=False) in the row's dtype;
 * GFLOP/s count the four projections (8*B*S*E^2) and the attention (4*B*S^2*E). Each f32 row
 * is followed by its time split: the two GEMMs of the projections and the fused attention,
 * each timed alone. The f16 row takes the matrix units where clattn_matrix_units finds them
 * (f16 projections on matmul_mma, attention_mma), f32 images and GEMMs elsewhere.
 */
#include "bench.h"

#include "ops/gemm.h"

#include <clblast_c.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- gemm ---- */

typedef struct gemm_case {
    const char *op; /* "gemm" */
    int64_t m, n, k;
    int kind;  /* GEMM_DATABASE, GEMM_ROW, GEMM_LIBRARY or GEMM_UNITS */
    int shape; /* the database row of the same shape, for the ratio */
} gemm_case;

/* The database rows' GFLOP/s over their FMA rate, by shape (< 0: not measured). */
#define GEMM_SHAPES 4
static double db_relative[GEMM_SHAPES] = {-1, -1, -1, -1};

typedef struct gemm_ctx {
    const gemm_case *c;
    clattn_tensor a, w, out;
    clattn__call call;
    float *host_a, *host_w; /* for the check (NULL in the MHA's split) */
} gemm_ctx;

/* CLBlast as it comes: its database's parameters for the device. */
static int gemm_clblast_db(void *p, cl_command_queue queue) {
    gemm_ctx *x = p;
    const size_t m = (size_t)x->c->m, n = (size_t)x->c->n, k = (size_t)x->c->k;
    CLBlastStatusCode s =
        CLBlastSgemm(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeYes, m, n, k, 1.0f,
                     x->a.buffer, 0, k, x->w.buffer, 0, k, 0.0f, x->out.buffer, 0, n, &queue, NULL);
    return s == CLBlastSuccess ? CLATTN_SUCCESS : CLATTN_ERR_BLAS;
}

enum { GEMM_DATABASE, GEMM_ROW, GEMM_LIBRARY, GEMM_UNITS };
static const char *const gemm_variants[] = {"clblast-db", "clblast-row", "clattn", "units"};

/* The dtype of a GEMM_UNITS row's a, w and c; f32 for the others. */
static clattn_dtype gemm_dtype(const gemm_case *c) {
    return c->kind == GEMM_UNITS ? CLATTN_F16 : CLATTN_F32;
}

/* The same through the bridge, which gives CLBlast the tuning table's gemm row (`library`
 * false), or as the library runs it: the GEMM the device's matmul row picks. */
static int gemm_through(gemm_ctx *x, cl_command_queue queue, bool library) {
    x->call.queue = queue;
    const size_t m = (size_t)x->c->m, n = (size_t)x->c->n, k = (size_t)x->c->k;
    const clattn__matrices a = {x->a.buffer, 0, k, 0}, w = {x->w.buffer, 0, k, 0},
                           c = {x->out.buffer, 0, n, 0};
    return library ? clattn__gemm_batched(&x->call, true, m, n, k, &a, &w, 0.0f, &c, 1)
                   : clattn__sgemm_batched(&x->call, true, m, n, k, &a, &w, 0.0f, &c, 1);
}

static int gemm_tuned(void *p, cl_command_queue queue) {
    return gemm_through(p, queue, false);
}

static int gemm_library(void *p, cl_command_queue queue) {
    return gemm_through(p, queue, true);
}

/* f16 on the matrix units (matmul_mma), as MHA with f16 storage runs its projections. */
static int gemm_units(void *p, cl_command_queue queue) {
    gemm_ctx *x = p;
    x->call.queue = queue;
    const size_t m = (size_t)x->c->m, n = (size_t)x->c->n, k = (size_t)x->c->k;
    const clattn__matrices a = {x->a.buffer, 0, k, 0}, w = {x->w.buffer, 0, k, 0},
                           c = {x->out.buffer, 0, n, 0};
    return clattn__gemm_units_batched(&x->call, CLATTN_F16, CLATTN_F16, true, m, n, k, &a, &w, NULL,
                                      0.0f, &c, 1);
}

/* dt tensors of the given shapes, uniform in [-scales[i], scales[i]); hosts[i] receives
 * tensor i's values (as stored). */
static int alloc_random(clattn_env *env, clattn_dtype dt, const int64_t (*shapes)[4],
                        clattn_tensor **tensors, const float *scales, float **hosts, int count) {
    int status = CLATTN_SUCCESS;
    for (int i = 0; i < count && status == CLATTN_SUCCESS; ++i) {
        status = clattn_env_alloc(env, dt, shapes[i], tensors[i]);
        if (status == CLATTN_SUCCESS)
            status = bench_fill_random(env, tensors[i], (uint64_t)(i + 40), scales[i], &hosts[i]);
    }
    return status;
}

/* About 1/sqrt(fan_in): projections of unit-sized inputs stay unit-sized. */
static float weight_scale(int64_t fan_in) {
    return 1.0f / sqrtf((float)fan_in);
}

/* 64 sampled elements of c = a w^T against float64. */
static int check_gemm(void *p, clattn_env *env, bench_report *report, bool *ok) {
    gemm_ctx *x = p;
    const gemm_case *c = x->c;
    float *out = NULL;
    int status = bench_read(env, &x->out, &out);
    uint64_t state = 17;
    *ok = status == CLATTN_SUCCESS;
    for (int n = 0; n < 64 && *ok; ++n) {
        const size_t at = bench_sample(&state, (size_t)(c->m * c->n));
        const size_t r = at / (size_t)c->n, col = at % (size_t)c->n, k = (size_t)c->k;
        double want = 0, scale = 0;
        for (size_t e = 0; e < k; ++e) {
            const double term = (double)x->host_a[r * k + e] * x->host_w[col * k + e];
            want += term, scale += fabs(term);
        }
        *ok = bench_close(report, "c", at, out[at], want, scale, gemm_dtype(c));
    }
    free(out);
    return status;
}

static void free_tensors(clattn_tensor **tensors, int count) {
    for (int i = 0; i < count; ++i) clattn_tensor_free(tensors[i]);
}

static const char *gemm_op(const void *cases, int i) {
    return ((const gemm_case *)cases)[i].op;
}

static void gemm_key(const void *cases, int i, char *key, size_t capacity) {
    const gemm_case *c = (const gemm_case *)cases + i;
    snprintf(key, capacity, "gemm %s %lld,%lld,%lld", clattn_dtype_name(gemm_dtype(c)),
             (long long)c->m, (long long)c->n, (long long)c->k);
}

static void gemm_shape(const gemm_case *c, char *shape, size_t size) {
    snprintf(shape, size, "M=%lld N=%lld K=%lld (a w^T)", (long long)c->m, (long long)c->n,
             (long long)c->k);
}

/* A row's ratio to the database row of the same shape, both normalized by their FMA rate, or
 * why there is none. */
static void print_gemm_ratio(const gemm_case *c, double relative) {
    char shape[96];
    gemm_shape(c, shape, sizeof shape);
    if (db_relative[c->shape] > 0)
        printf("  gemm %s: %s / CLBlast's database %.2fx (each GFLOP/s over the FMA rate "
               "timed beside it)\n",
               shape, gemm_variants[c->kind], relative / db_relative[c->shape]);
    else
        printf("  gemm %s: CLBlast's database not measured (parameters were given before in "
               "this process: run --op gemm)\n",
               shape);
}

static int measure_gemm(const bench_options *opt, clattn_env *env, bench_ceilings *ceilings,
                        const void *cases, int i, double torch_ms, bench_report *report) {
    const gemm_case *c = (const gemm_case *)cases + i;
    const clattn__call call = {NULL, clattn_env_context(env), clattn_env_device(env), 0, NULL,
                               NULL};
    gemm_ctx x = {c, {0}, {0}, {0}, call, NULL, NULL};
    if (c->kind == GEMM_DATABASE && clattn__blas_overridden(x.call.device)) return CLATTN_SUCCESS;
    bool runs = c->kind != GEMM_UNITS; /* a units row: where the device takes the units */
    x.call.queue = clattn_env_queue(env);
    int status = runs ? CLATTN_SUCCESS
                      : clattn__gemm_units_available(&x.call, CLATTN_F16, (size_t)c->m,
                                                     (size_t)c->n, (size_t)c->k, 1, &runs);
    if (status != CLATTN_SUCCESS || !runs) return status;
    const clattn_dtype dt = gemm_dtype(c);
    const int64_t shapes[3][4] = {{1, 1, c->m, c->k}, {1, 1, c->n, c->k}, {1, 1, c->m, c->n}};
    clattn_tensor *tensors[3] = {&x.a, &x.w, &x.out};
    char shape[96];
    gemm_shape(c, shape, sizeof shape);
    const double flops = 2.0 * (double)c->m * (double)c->n * (double)c->k;
    bench_timing t;
    double fma = 0;
    const float scales[3] = {1.0f, 1.0f, 1.0f};
    float *hosts[3] = {NULL, NULL, NULL};
    status = alloc_random(env, dt, shapes, tensors, scales, hosts, 3);
    x.host_a = hosts[0], x.host_w = hosts[1];
    const bench_fn fns[] = {gemm_clblast_db, gemm_tuned, gemm_library, gemm_units};
    const bench_fn fn = fns[c->kind];
    const bench_row_name row = {"gemm", gemm_variants[c->kind], dt, shape};
    bool wrong = false;
    if (status == CLATTN_SUCCESS)
        status = bench_check_row(report, env, fn, &x, check_gemm, &row, &wrong);
    if (status == CLATTN_SUCCESS && !wrong)
        status = bench_time_vs_compute(opt, ceilings, dt, fn, &x, clattn_env_queue(env), &t, &fma);
    if (status == CLATTN_SUCCESS && !wrong)
        status = bench_add_compute_row(report, env, row.op, row.variant, dt, shape, &t, flops, fma,
                                       torch_ms);
    if (status == CLATTN_SUCCESS && !wrong && c->kind != GEMM_UNITS) {
        const double relative = flops / t.median_ms * 1e-6 / fma;
        if (c->kind == GEMM_DATABASE) db_relative[c->shape] = relative;
        if (c->kind != GEMM_DATABASE) print_gemm_ratio(c, relative);
    }
    free_tensors(tensors, 3);
    for (int k = 0; k < 3; ++k) free(hosts[k]);
    return status;
}

/* ---- mha ---- */

typedef struct mha_case {
    const char *op;  /* "mha" */
    clattn_dtype dt; /* every tensor's */
    int64_t b, s, e, h;
} mha_case;

typedef struct mha_ctx {
    const mha_case *c;
    clattn_tensor x, in_w, in_b, out_w, out_b, out;
    clattn_tensor in_bias, out_bias; /* the first rows of in_b and out_b */
    clattn_mha_params params;
    clattn_mha_options options;
    gemm_ctx qkv, proj;     /* the two projection GEMMs alone */
    float *hosts[6];        /* x, in_w, in_b, out_w, out_b, out: the check's inputs */
    clattn_tensor heads[4]; /* q, k, v views of the packed projection; the attention output */
} mha_ctx;

static int run_mha(void *p, cl_command_queue queue) {
    mha_ctx *x = p;
    return clattn_mha_forward(&x->x, &x->x, &x->x, &x->params, &x->out, &x->options, queue, 0, NULL,
                              NULL);
}

static int run_projections(void *p, cl_command_queue queue) {
    mha_ctx *x = p;
    int status = gemm_library(&x->qkv, queue);
    return status == CLATTN_SUCCESS ? gemm_library(&x->proj, queue) : status;
}

static int run_attention_alone(void *p, cl_command_queue queue) {
    mha_ctx *x = p;
    return clattn_attention(&x->heads[0], &x->heads[1], &x->heads[2], 0.0f, NULL, &x->heads[3],
                            NULL, queue, 0, NULL, NULL);
}

/* The [B,H,S,D] view of columns `first`.. of rows `ld` wide in t. */
static clattn_tensor head_view(const clattn_tensor *t, const mha_case *c, int64_t first,
                               int64_t ld) {
    const int64_t d = c->e / c->h;
    clattn_tensor v = clattn_tensor_4d(t->buffer, CLATTN_F32, c->b, c->h, c->s, d);
    v.offset = (size_t)first;
    v.strides[0] = c->s * ld, v.strides[1] = d, v.strides[2] = ld, v.strides[3] = 1;
    return v;
}

/* The split's GEMMs and attention reuse the GEMM contexts on the forward's own scratch-sized
 * buffers: qkv (B*S x 3E) and ctx (B*S x E). */
static void set_split(mha_ctx *x, const mha_case *c, clattn_env *env, const gemm_case *g) {
    const clattn__call call = {NULL, clattn_env_context(env), clattn_env_device(env), 0, NULL,
                               NULL};
    x->qkv = (gemm_ctx){&g[0], x->x, x->in_w, x->in_b, call, NULL, NULL};
    x->proj = (gemm_ctx){&g[1], x->out, x->out_w, x->out_b, call, NULL, NULL};
    for (int i = 0; i < 3; ++i) x->heads[i] = head_view(&x->in_b, c, i * c->e, 3 * c->e);
    x->heads[3] = head_view(&x->out_b, c, 0, c->e);
}

static int alloc_mha(clattn_env *env, const mha_case *c, mha_ctx *x) {
    memset(x, 0, sizeof *x);
    x->c = c;
    const int64_t rows = c->b * c->s, e = c->e;
    /* in_b and out_b are bias-sized for the forward; the split reuses larger buffers below */
    const int64_t shapes[6][4] = {{1, c->b, c->s, e}, {1, 1, 3 * e, e}, {1, 1, rows, 3 * e},
                                  {1, 1, e, e},       {1, 1, rows, e},  {1, c->b, c->s, e}};
    clattn_tensor *tensors[6] = {&x->x, &x->in_w, &x->in_b, &x->out_w, &x->out_b, &x->out};
    const float scales[6] = {1.0f, weight_scale(e), 0.5f, weight_scale(e), 0.5f, 1.0f};
    return alloc_random(env, c->dt, shapes, tensors, scales, x->hosts, 6);
}

static void free_mha(mha_ctx *x) {
    clattn_tensor *tensors[6] = {&x->x, &x->in_w, &x->in_b, &x->out_w, &x->out_b, &x->out};
    free_tensors(tensors, 6);
    for (int i = 0; i < 6; ++i) free(x->hosts[i]);
    if (x->options.workspace) clReleaseMemObject(x->options.workspace);
}

/* rows x [n, k] w^T + bias, in float64 */
static void project(const float *x, const float *w, const float *bias, int64_t rows, int64_t n,
                    int64_t k, double *y) {
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < n; ++c) {
            double sum = bias[c];
            for (int64_t e = 0; e < k; ++e) sum += (double)x[r * k + e] * w[c * k + e];
            y[r * n + c] = sum;
        }
}

/* One head's context for query projection q against the batch's k and v (kv: rows of k then v,
 * 2E wide), in float64; p receives the scores, ctx[E + t] the weighted magnitudes
 * sum_j p_j |v_jt|. */
static void head_context(const mha_case *c, int64_t h, const double *q, const double *kv, double *p,
                         double *ctx) {
    const int64_t e = c->e, d = e / c->h;
    double top = -INFINITY, sum = 0;
    for (int64_t j = 0; j < c->s; ++j) {
        double dot = 0;
        for (int64_t t = 0; t < d; ++t) dot += q[h * d + t] * kv[j * 2 * e + h * d + t];
        p[j] = dot / sqrt((double)d);
        top = fmax(top, p[j]);
    }
    for (int64_t j = 0; j < c->s; ++j) sum += (p[j] = exp(p[j] - top));
    for (int64_t t = 0; t < d; ++t) {
        double acc = 0, size = 0;
        for (int64_t j = 0; j < c->s; ++j) {
            acc += p[j] / sum * kv[j * 2 * e + e + h * d + t];
            size += p[j] / sum * fabs(kv[j * 2 * e + e + h * d + t]);
        }
        ctx[h * d + t] = acc, ctx[e + h * d + t] = size;
    }
}

/* Output row i of batch b in float64 (self-attention: q, k, v from the same x); scale[] gets
 * the size of each output's last sum, sum |ctx_t wo_t| + |bo|, and with 16-bit storage also
 * sum |wo_t| sum_j p_j |v_jt|: that path rounds v and the weights before p v, which moves ctx_t
 * by a few roundings of its terms' size, not of ctx_t's (which cancels). ctx holds 3E doubles
 * (q, then the context and its magnitudes). */
static void reference_row(const mha_ctx *x, int64_t b, int64_t i, const double *kv, double *ctx,
                          double *p, double *out, double *scale) {
    const mha_case *c = x->c;
    const int64_t e = c->e;
    project(x->hosts[0] + (b * c->s + i) * e, x->hosts[1], x->hosts[2], 1, e, e, ctx);
    for (int64_t h = 0; h < c->h; ++h) head_context(c, h, ctx, kv, p, ctx + e);
    const bool half = c->dt != CLATTN_F32;
    for (int64_t o = 0; o < e; ++o) {
        const float *wo = x->hosts[3] + o * e;
        out[o] = x->hosts[4][o], scale[o] = fabs(x->hosts[4][o]);
        for (int64_t t = 0; t < e; ++t) {
            out[o] += ctx[e + t] * wo[t], scale[o] += fabs(ctx[e + t] * wo[t]);
            if (half) scale[o] += fabs(wo[t]) * ctx[2 * e + t];
        }
    }
}

/* Two sampled rows of one sampled batch, every output column, against the reference (the
 * batch's k and v projections computed once). */
static int check_mha(void *p, clattn_env *env, bench_report *report, bool *ok) {
    mha_ctx *x = p;
    const mha_case *c = x->c;
    const int64_t e = c->e, s = c->s;
    uint64_t state = 19;
    const int64_t b = (int64_t)bench_sample(&state, (size_t)c->b);
    double *kv = malloc((size_t)(s * 2 * e) * sizeof *kv);
    double *ctx = malloc((size_t)(3 * e) * sizeof *ctx), *w = malloc((size_t)s * sizeof *w);
    double *want = malloc((size_t)(2 * e) * sizeof *want);
    float *out = NULL;
    int status =
        kv && ctx && w && want ? bench_read(env, &x->out, &out) : CLATTN_ERR_OUT_OF_HOST_MEMORY;
    *ok = status == CLATTN_SUCCESS;
    if (*ok) /* rows E..3E of in_proj_weight: k, then v */
        project(x->hosts[0] + b * s * e, x->hosts[1] + e * e, x->hosts[2] + e, s, 2 * e, e, kv);
    for (int n = 0; n < 2 && *ok; ++n) {
        const int64_t i = (int64_t)bench_sample(&state, (size_t)s);
        reference_row(x, b, i, kv, ctx, w, want, want + e);
        for (int64_t o = 0; o < e && *ok; ++o) {
            const size_t at = (size_t)((b * s + i) * e + o);
            *ok = bench_close(report, "out", at, out[at], want[o], want[e + o], c->dt);
        }
    }
    free(kv), free(ctx), free(w), free(want), free(out);
    return status;
}

/* The forward's parameters: the biases are the first row of the larger split buffers. */
static int set_forward(mha_ctx *x, clattn_env *env) {
    const mha_case *c = x->c;
    x->in_bias = clattn_tensor_4d(x->in_b.buffer, c->dt, 1, 1, 1, 3 * c->e);
    x->out_bias = clattn_tensor_4d(x->out_b.buffer, c->dt, 1, 1, 1, c->e);
    x->params = (clattn_mha_params){(int)c->h, &x->in_w,    NULL,      NULL,
                                    NULL,      &x->in_bias, &x->out_w, &x->out_bias};
    size_t bytes = 0;
    int status = clattn_mha_workspace_size(&x->x, &x->x, &x->x, &x->params, &x->out, &x->options,
                                           clattn_env_queue(env), &bytes);
    return status == CLATTN_SUCCESS ? bench_workspace(env, bytes, &x->options.workspace) : status;
}

static const char *mha_op(const void *cases, int i) {
    return ((const mha_case *)cases)[i].op;
}

static void mha_key(const void *cases, int i, char *key, size_t capacity) {
    const mha_case *c = (const mha_case *)cases + i;
    snprintf(key, capacity, "mha %s %lld,%lld,%lld,%lld", clattn_dtype_name(c->dt), (long long)c->b,
             (long long)c->s, (long long)c->e, (long long)c->h);
}

/* The GEMMs' and the attention's shares of the forward, each timed alone (on this shared VM
 * the parts can sum past the whole; then no rest is printed). */
static int print_split(const bench_options *opt, mha_ctx *x, cl_command_queue queue,
                       double total_ms) {
    bench_timing gemms, attention;
    int status = bench_time(opt, run_projections, x, queue, &gemms);
    if (status == CLATTN_SUCCESS)
        status = bench_time(opt, run_attention_alone, x, queue, &attention);
    if (status != CLATTN_SUCCESS) return status;
    const double rest = total_ms - gemms.median_ms - attention.median_ms;
    printf("  mha split (medians, each timed alone): GEMMs %.1f ms (%.0f%%), attention %.1f ms "
           "(%.0f%%)",
           gemms.median_ms, 100.0 * gemms.median_ms / total_ms, attention.median_ms,
           100.0 * attention.median_ms / total_ms);
    if (rest > 0) printf(", the rest (bias fills, launches) %.1f ms", rest);
    printf(", of %.1f ms\n", total_ms);
    return status;
}

static int measure_mha(const bench_options *opt, clattn_env *env, bench_ceilings *ceilings,
                       const void *cases, int i, double torch_ms, bench_report *report) {
    const mha_case *c = (const mha_case *)cases + i;
    const int64_t rows = c->b * c->s;
    const gemm_case g[2] = {{"gemm", rows, 3 * c->e, c->e, true, 0},
                            {"gemm", rows, c->e, c->e, true, 0}};
    mha_ctx x;
    bench_timing timing;
    double fma = 0;
    int status = alloc_mha(env, c, &x);
    if (status == CLATTN_SUCCESS) status = set_forward(&x, env);
    set_split(&x, c, env, g);
    cl_command_queue queue = clattn_env_queue(env);
    char shape[96];
    snprintf(shape, sizeof shape, "B=%lld S=%lld E=%lld H=%lld self, no mask", (long long)c->b,
             (long long)c->s, (long long)c->e, (long long)c->h);
    const bench_row_name row = {"mha", "fused", c->dt, shape};
    bool wrong = false;
    if (status == CLATTN_SUCCESS)
        status = bench_check_row(report, env, run_mha, &x, check_mha, &row, &wrong);
    if (status == CLATTN_SUCCESS && !wrong)
        status = bench_time_vs_compute(opt, ceilings, c->dt, run_mha, &x, queue, &timing, &fma);
    const double e = (double)c->e,
                 flops = 8.0 * (double)rows * e * e + 4.0 * (double)rows * (double)c->s * e;
    if (status == CLATTN_SUCCESS && !wrong)
        status = bench_add_compute_row(report, env, "mha", "fused", c->dt, shape, &timing, flops,
                                       fma, torch_ms);
    if (status == CLATTN_SUCCESS && !wrong && c->dt == CLATTN_F32) /* the split's GEMMs: f32 */
        status = print_split(opt, &x, queue, timing.median_ms);
    free_mha(&x);
    return status;
}

int bench_mha(const bench_options *opt, clattn_env *env, bench_ceilings *ceilings,
              bench_report *report) {
    const int64_t b = opt->quick ? 1 : 4, s = opt->quick ? 256 : 1024;
    const int64_t e = opt->quick ? 256 : 512, big_s = opt->quick ? 512 : 4096;
    const int64_t big_e = opt->quick ? 256 : 1024;
    /* every database row before the first that gives CLBlast parameters: see the top of this file
     */
    const gemm_case gemms[] = {
        {"gemm", b * s, 3 * e, e, GEMM_DATABASE, 0},  {"gemm", b * s, e, e, GEMM_DATABASE, 1},
        {"gemm", 1024, 1024, 1024, GEMM_DATABASE, 2}, {"gemm", b * s, 3 * e, e, GEMM_ROW, 0},
        {"gemm", b * s, e, e, GEMM_ROW, 1},           {"gemm", 1024, 1024, 1024, GEMM_ROW, 2},
        {"gemm", b * s, 3 * e, e, GEMM_LIBRARY, 0},   {"gemm", b * s, e, e, GEMM_LIBRARY, 1},
        {"gemm", 1024, 1024, 1024, GEMM_LIBRARY, 2},  {"gemm", b * s, 3 * e, e, GEMM_UNITS, 0},
        {"gemm", b * s, e, e, GEMM_UNITS, 1},         {"gemm", 1024, 1024, 1024, GEMM_UNITS, 2},
    };
    const mha_case cases[] = {
        {"mha", CLATTN_F32, b, s, e, 8},
        {"mha", CLATTN_F32, 1, big_s, big_e, 16},
        {"mha", CLATTN_F16, b, s, e, 8}, /* on the matrix units where the device has them */
    };
    const bench_family gemm_family = {sizeof gemms / sizeof gemms[0], gemm_op, gemm_key,
                                      measure_gemm};
    const bench_family mha_family = {sizeof cases / sizeof cases[0], mha_op, mha_key, measure_mha};
    int status = bench_run_family(opt, env, ceilings, report, &gemm_family, gemms);
    if (status == CLATTN_SUCCESS)
        status = bench_run_family(opt, env, ceilings, report, &mha_family, cases);
    return status;
}
