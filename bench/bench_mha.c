/* Rows for multi-head attention and the GEMMs under it.
 *
 * gemm: c = a w^T on the MHA's projection shapes, first through CLBlast with its own database
 * (what a CLBlast user gets untuned), then through clattn's bridge with the tuning table's gemm
 * row, each against the FMA kernel timed beside it, beside torch's a @ w.T (OpenBLAS). CLBlast
 * cannot return to its database once parameters were given, and it rebuilds its GEMM on each
 * change, so the two cannot alternate call by call: the database rows run first, before any
 * other op of the process gives CLBlast the row (clattn-bench runs this family first), and the
 * ratio of the two is taken on values normalized by their own FMA rate.
 *
 * mha: clattn_mha_forward on self-attention (packed weights, biases, no mask, no weights),
 * beside torch.nn.MultiheadAttention (eval, no grad, need_weights=False); GFLOP/s count the four
 * projections (8*B*S*E^2) and the attention (4*B*S^2*E). Each row is followed by its time split:
 * the two GEMMs of the projections and the fused attention, each timed alone.
 */
#include "bench.h"

#include "blas.h"

#include <clblast_c.h>
#include <string.h>

/* ---- gemm ---- */

typedef struct gemm_case {
    const char *op; /* "gemm" */
    int64_t m, n, k;
    bool tuned; /* false: CLBlast's database; true: the tuning table's row */
    int shape;  /* the database row of the same shape, for the ratio */
} gemm_case;

/* The database rows' GFLOP/s over their FMA rate, by shape (< 0: not measured). */
#define GEMM_SHAPES 4
static double db_relative[GEMM_SHAPES] = {-1, -1, -1, -1};

typedef struct gemm_ctx {
    const gemm_case *c;
    clattn_tensor a, w, out;
    clattn__call call;
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

/* The same through the bridge, which gives CLBlast the tuning table's gemm row. */
static int gemm_tuned(void *p, cl_command_queue queue) {
    gemm_ctx *x = p;
    x->call.queue = queue;
    const size_t m = (size_t)x->c->m, n = (size_t)x->c->n, k = (size_t)x->c->k;
    const clattn__matrices a = {x->a.buffer, 0, k, 0}, w = {x->w.buffer, 0, k, 0},
                           c = {x->out.buffer, 0, n, 0};
    return clattn__sgemm_batched(&x->call, true, m, n, k, &a, &w, 0.0f, &c, 1);
}

/* Zero-filled f32 tensors of the given shapes (zeros: the timing does not depend on values). */
static int alloc_zeroed(clattn_env *env, const int64_t (*shapes)[4], clattn_tensor **tensors,
                        int count) {
    int status = CLATTN_SUCCESS;
    for (int i = 0; i < count && status == CLATTN_SUCCESS; ++i) {
        status = clattn_env_alloc(env, CLATTN_F32, shapes[i], tensors[i]);
        const cl_uchar zero = 0;
        if (status == CLATTN_SUCCESS)
            status =
                clEnqueueFillBuffer(clattn_env_queue(env), tensors[i]->buffer, &zero, 1, 0,
                                    (size_t)clattn_tensor_numel(tensors[i]) * 4, 0, NULL, NULL);
    }
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
    snprintf(key, capacity, "gemm f32 %lld,%lld,%lld", (long long)c->m, (long long)c->n,
             (long long)c->k);
}

static void gemm_shape(const gemm_case *c, char *shape, size_t size) {
    snprintf(shape, size, "M=%lld N=%lld K=%lld (a w^T)", (long long)c->m, (long long)c->n,
             (long long)c->k);
}

/* The tuned row's ratio to the database row of the same shape, both normalized by their FMA
 * rate, or why there is none. */
static void print_gemm_ratio(const gemm_case *c, double relative) {
    char shape[96];
    gemm_shape(c, shape, sizeof shape);
    if (db_relative[c->shape] > 0)
        printf("  gemm %s: tuned row / CLBlast's database %.2fx (each GFLOP/s over the FMA rate "
               "timed beside it)\n",
               shape, relative / db_relative[c->shape]);
    else
        printf("  gemm %s: CLBlast's database not measured (parameters were given before in "
               "this process: run --op gemm)\n",
               shape);
}

static int measure_gemm(const bench_options *opt, clattn_env *env, bench_ceilings *ceilings,
                        const void *cases, int i, double torch_ms, bench_report *report) {
    const gemm_case *c = (const gemm_case *)cases + i;
    gemm_ctx x = {
        c, {0}, {0}, {0}, {NULL, clattn_env_context(env), clattn_env_device(env), 0, NULL, NULL}};
    if (!c->tuned && clattn__blas_overridden(x.call.device)) return CLATTN_SUCCESS;
    const int64_t shapes[3][4] = {{1, 1, c->m, c->k}, {1, 1, c->n, c->k}, {1, 1, c->m, c->n}};
    clattn_tensor *tensors[3] = {&x.a, &x.w, &x.out};
    char shape[96];
    gemm_shape(c, shape, sizeof shape);
    const double flops = 2.0 * (double)c->m * (double)c->n * (double)c->k;
    bench_timing t;
    double fma = 0;
    int status = alloc_zeroed(env, shapes, tensors, 3);
    if (status == CLATTN_SUCCESS)
        status = bench_time_vs_fma(opt, ceilings, c->tuned ? gemm_tuned : gemm_clblast_db, &x,
                                   clattn_env_queue(env), &t, &fma);
    if (status == CLATTN_SUCCESS)
        status = bench_add_compute_row(report, env, "gemm", c->tuned ? "tuned-row" : "clblast-db",
                                       CLATTN_F32, shape, &t, flops, fma, torch_ms);
    const double relative = flops / t.median_ms * 1e-6 / fma;
    if (status == CLATTN_SUCCESS && !c->tuned) db_relative[c->shape] = relative;
    if (status == CLATTN_SUCCESS && c->tuned) print_gemm_ratio(c, relative);
    free_tensors(tensors, 3);
    return status;
}

/* ---- mha ---- */

typedef struct mha_case {
    const char *op; /* "mha" */
    int64_t b, s, e, h;
} mha_case;

typedef struct mha_ctx {
    const mha_case *c;
    clattn_tensor x, in_w, in_b, out_w, out_b, out;
    clattn_tensor in_bias, out_bias; /* the first rows of in_b and out_b */
    clattn_mha_params params;
    clattn_mha_options options;
    gemm_ctx qkv, proj;     /* the two projection GEMMs alone */
    clattn_tensor heads[4]; /* q, k, v views of the packed projection; the attention output */
} mha_ctx;

static int run_mha(void *p, cl_command_queue queue) {
    mha_ctx *x = p;
    return clattn_mha_forward(&x->x, &x->x, &x->x, &x->params, &x->out, &x->options, queue, 0, NULL,
                              NULL);
}

static int run_projections(void *p, cl_command_queue queue) {
    mha_ctx *x = p;
    int status = gemm_tuned(&x->qkv, queue);
    return status == CLATTN_SUCCESS ? gemm_tuned(&x->proj, queue) : status;
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
    x->qkv = (gemm_ctx){&g[0], x->x, x->in_w, x->in_b, call};
    x->proj = (gemm_ctx){&g[1], x->out, x->out_w, x->out_b, call};
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
    int status = alloc_zeroed(env, shapes, tensors, 6);
    return status;
}

static void free_mha(mha_ctx *x) {
    clattn_tensor *tensors[6] = {&x->x, &x->in_w, &x->in_b, &x->out_w, &x->out_b, &x->out};
    free_tensors(tensors, 6);
    if (x->options.workspace) clReleaseMemObject(x->options.workspace);
}

/* The forward's parameters: the biases are the first row of the larger split buffers. */
static int set_forward(mha_ctx *x, clattn_env *env) {
    const mha_case *c = x->c;
    x->in_bias = clattn_tensor_4d(x->in_b.buffer, CLATTN_F32, 1, 1, 1, 3 * c->e);
    x->out_bias = clattn_tensor_4d(x->out_b.buffer, CLATTN_F32, 1, 1, 1, c->e);
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
    snprintf(key, capacity, "mha f32 %lld,%lld,%lld,%lld", (long long)c->b, (long long)c->s,
             (long long)c->e, (long long)c->h);
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
    if (status == CLATTN_SUCCESS)
        status = bench_time_vs_fma(opt, ceilings, run_mha, &x, queue, &timing, &fma);
    char shape[96];
    snprintf(shape, sizeof shape, "B=%lld S=%lld E=%lld H=%lld self, no mask", (long long)c->b,
             (long long)c->s, (long long)c->e, (long long)c->h);
    const double e = (double)c->e,
                 flops = 8.0 * (double)rows * e * e + 4.0 * (double)rows * (double)c->s * e;
    if (status == CLATTN_SUCCESS)
        status = bench_add_compute_row(report, env, "mha", "fused", CLATTN_F32, shape, &timing,
                                       flops, fma, torch_ms);
    if (status == CLATTN_SUCCESS) status = print_split(opt, &x, queue, timing.median_ms);
    free_mha(&x);
    return status;
}

int bench_mha(const bench_options *opt, clattn_env *env, bench_ceilings *ceilings,
              bench_report *report) {
    const int64_t b = opt->quick ? 1 : 4, s = opt->quick ? 256 : 1024;
    const int64_t e = opt->quick ? 256 : 512, big_s = opt->quick ? 512 : 4096;
    const int64_t big_e = opt->quick ? 256 : 1024;
    /* every database row before the first tuned one: see the top of this file */
    const gemm_case gemms[] = {
        {"gemm", b * s, 3 * e, e, false, 0},  {"gemm", b * s, e, e, false, 1},
        {"gemm", 1024, 1024, 1024, false, 2}, {"gemm", b * s, 3 * e, e, true, 0},
        {"gemm", b * s, e, e, true, 1},       {"gemm", 1024, 1024, 1024, true, 2},
    };
    const mha_case cases[] = {
        {"mha", b, s, e, 8},
        {"mha", 1, big_s, big_e, 16},
    };
    const bench_family gemm_family = {sizeof gemms / sizeof gemms[0], gemm_op, gemm_key,
                                      measure_gemm};
    const bench_family mha_family = {sizeof cases / sizeof cases[0], mha_op, mha_key, measure_mha};
    int status = bench_run_family(opt, env, ceilings, report, &gemm_family, gemms);
    if (status == CLATTN_SUCCESS)
        status = bench_run_family(opt, env, ceilings, report, &mha_family, cases);
    return status;
}
