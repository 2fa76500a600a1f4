/* Tests of the multi-head attention forward (src/ops/mha.c, cl/mha.cl) against the float64
 * reference of torch.nn.MultiheadAttention (tests/ref.c), and of the CLBlast bridge it runs
 * its projections on (src/ops/blas.c). */
#include "ops/gemm.h"
#include "harness.h"
#include "runtime/runtime.h"
#include "runtime/testing.h"
#include "ref.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { NO_MASK = 0, KEEP_MASK = 1, ADD_MASK = 2 };

typedef struct mha_spec {
    int64_t B, Sq, Sk, E, H, kdim, vdim;
    bool self;      /* key = value = query: one view */
    bool shared_kv; /* key = value: one view */
    bool separate;  /* q/k/v_proj_weight instead of in_proj_weight */
    bool in_bias, out_bias;
    int kpm, attn;      /* NO_MASK, KEEP_MASK (u8) or ADD_MASK (f32) */
    bool per_head_attn; /* attn_mask {B,H,Sq,Sk} (torch's [B*H,Sq,Sk]); else {1,1,Sq,Sk} */
    int causal;
    int weights;        /* 0: none, 1: averaged, 2: per head */
    bool hide_batch;    /* the padding mask hides every key of the last batch */
    bool strided;       /* query and out as views with a row stride past E */
    int workspace;      /* a caller workspace of exactly the size asked for (2: a sub-buffer) */
    bool out_of_order;  /* on an out-of-order queue (where the device has one) */
    int emulate;        /* the tile unit the hook offers emulated (0: none) */
    bool gated;         /* it and the queue (a marker) wait for a user event opened after it */
    const char *absent; /* a kernel the forward must not enqueue (the kernel trace; NULL: any) */
    clattn_dtype dt;
    uint64_t seed;
} mha_spec;

static mha_spec self_spec(int64_t B, int64_t S, int64_t E, int64_t H) {
    mha_spec s;
    memset(&s, 0, sizeof s);
    s.B = B, s.Sq = s.Sk = S, s.E = s.kdim = s.vdim = E, s.H = H;
    s.self = s.shared_kv = true;
    s.in_bias = s.out_bias = true;
    s.dt = CLATTN_F32;
    s.seed = (uint64_t)(B * 7 + S * 13 + E * 17 + H);
    return s;
}

static mha_spec cross_spec(int64_t B, int64_t Sq, int64_t Sk, int64_t E, int64_t H) {
    mha_spec s = self_spec(B, Sq, E, H);
    s.Sk = Sk, s.self = s.shared_kv = false;
    s.seed += 1000;
    return s;
}

/* n values exact in dt, uniform in [-2, 2) times `scale` (a power of two). */
static float *values(size_t n, clattn_dtype dt, float scale, uint64_t *rng) {
    float *x = malloc(n * sizeof(float));
    if (!x) return NULL;
    test_fill_exact(x, n, dt, rng);
    uint16_t bits;
    for (size_t i = 0; i < n; ++i) {
        ref_store(&bits, dt == CLATTN_F32 ? CLATTN_F16 : dt, 0, x[i] * scale);
        x[i] = dt == CLATTN_F32 ? x[i] * scale : ref_load(&bits, dt, 0);
    }
    return x;
}

/* About 1/sqrt(fan_in), a power of two, so that projections stay near 1. */
static float weight_scale(int64_t fan_in) {
    return (float)ldexp(1.0, -(int)ceil(log2(sqrt((double)fan_in))));
}

/* Everything one case allocates, on the host and the device. */
typedef struct mha_case {
    float *query, *key, *value, *w[4], *bias[2], *kpm_add, *attn_add;
    uint8_t *kpm_keep, *attn_keep;
    cl_mem buffers[16];
    int nbuffers;
    clattn_tensor t_query, t_key, t_value, t_w[4], t_bias[2], t_kpm, t_attn, t_out, t_weights;
} mha_case;

static void free_case(mha_case *c) {
    if (c->value != c->key) free(c->value);
    if (c->key != c->query) free(c->key);
    float *host[8] = {c->query, c->w[0],    c->w[1],    c->w[2],
                      c->w[3],  c->bias[0], c->bias[1], c->kpm_add};
    for (int i = 0; i < 8; ++i) free(host[i]);
    free(c->attn_add), free(c->kpm_keep), free(c->attn_keep);
    for (int i = 0; i < c->nbuffers; ++i)
        if (c->buffers[i]) clReleaseMemObject(c->buffers[i]);
}

/* A dense device tensor {1, rows, S, cols} (rows=1: a matrix) holding `host` in dt. */
static clattn_tensor upload(test_ctx *t, mha_case *c, const float *host, int64_t rows, int64_t S,
                            int64_t cols, clattn_dtype dt) {
    clattn_tensor x = test_upload_bhsd(t, host, 1, rows, S, cols, dt, 0);
    c->buffers[c->nbuffers++] = x.buffer;
    return x;
}

static clattn_tensor upload_u8(test_ctx *t, mha_case *c, const uint8_t *host, const int64_t n[4]) {
    const size_t bytes = (size_t)(n[0] * n[1] * n[2] * n[3]);
    cl_mem buffer = test_buffer(t, bytes);
    c->buffers[c->nbuffers++] = buffer;
    if (buffer) test_write(t, buffer, host, bytes);
    return clattn_tensor_4d(buffer, CLATTN_U8, n[0], n[1], n[2], n[3]);
}

/* A zero-filled device tensor of shape n in dt. */
static clattn_tensor fresh(test_ctx *t, mha_case *c, const int64_t n[4], clattn_dtype dt) {
    const size_t bytes = (size_t)(n[0] * n[1] * n[2] * n[3]) * clattn_dtype_size(dt);
    void *zeros = calloc(bytes, 1);
    cl_mem buffer = test_buffer(t, bytes);
    c->buffers[c->nbuffers++] = buffer;
    if (buffer && zeros) test_write(t, buffer, zeros, bytes);
    free(zeros);
    return clattn_tensor_4d(buffer, dt, n[0], n[1], n[2], n[3]);
}

/* A mask of n entries: u8 keep (about 1 in 4 hidden) or f32 additive (about 1 in 8 -inf). */
static void make_mask(int kind, size_t n, uint64_t *rng, uint8_t **keep, float **add) {
    if (kind == KEEP_MASK) *keep = malloc(n);
    if (kind == ADD_MASK) *add = values(n, CLATTN_F32, 1.0f, rng);
    for (size_t i = 0; i < n; ++i) {
        const uint64_t r = test_rand_u64(rng) % 8;
        if (kind == KEEP_MASK) (*keep)[i] = r >= 2;
        if (kind == ADD_MASK && r == 0) (*add)[i] = -INFINITY;
    }
}

static void make_host(const mha_spec *s, mha_case *c) {
    uint64_t rng = s->seed;
    const int64_t E = s->E, cols[3] = {E, s->kdim, s->vdim};
    c->query = values((size_t)(s->B * s->Sq * E), s->dt, 1.0f, &rng);
    c->key = s->self ? c->query : values((size_t)(s->B * s->Sk * s->kdim), s->dt, 1.0f, &rng);
    c->value = s->shared_kv ? c->key : values((size_t)(s->B * s->Sk * s->vdim), s->dt, 1.0f, &rng);
    for (int i = 0; i < 4; ++i) {
        const int64_t k = i < 3 ? cols[i] : E;
        c->w[i] = values((size_t)(E * k), s->dt, weight_scale(k), &rng);
    }
    c->bias[0] = s->in_bias ? values((size_t)(3 * E), s->dt, 0.5f, &rng) : NULL;
    c->bias[1] = s->out_bias ? values((size_t)E, s->dt, 0.5f, &rng) : NULL;
    make_mask(s->kpm, (size_t)(s->B * s->Sk), &rng, &c->kpm_keep, &c->kpm_add);
    const int64_t planes = s->per_head_attn ? s->B * s->H : 1;
    make_mask(s->attn, (size_t)(planes * s->Sq * s->Sk), &rng, &c->attn_keep, &c->attn_add);
    for (int64_t j = 0; s->hide_batch && j < s->Sk; ++j) {
        if (c->kpm_keep) c->kpm_keep[(s->B - 1) * s->Sk + j] = 0;
        if (c->kpm_add) c->kpm_add[(s->B - 1) * s->Sk + j] = -INFINITY;
    }
}

/* The same packed weight [3E,E] from the three: rows of Wq, Wk, Wv. */
static float *packed_weight(const mha_spec *s, const mha_case *c) {
    const size_t block = (size_t)(s->E * s->E);
    float *w = malloc(3 * block * sizeof(float));
    for (int i = 0; w && i < 3; ++i) memcpy(w + i * block, c->w[i], block * sizeof(float));
    return w;
}

/* query (and out) as views into rows of E + 3 elements: not rows CLBlast can read in place. */
static clattn_tensor strided_query(test_ctx *t, mha_case *c, const mha_spec *s) {
    const int64_t rows = s->B * s->Sq, ld = s->E + 3;
    float *wide = calloc((size_t)(rows * ld), sizeof(float));
    for (int64_t r = 0; wide && r < rows; ++r)
        memcpy(wide + r * ld, c->query + r * s->E, (size_t)s->E * sizeof(float));
    clattn_tensor x = upload(t, c, wide, s->B, s->Sq, ld, s->dt);
    free(wide);
    x.shape[3] = s->E;
    return x;
}

static void make_device(test_ctx *t, const mha_spec *s, mha_case *c) {
    const int64_t E = s->E;
    c->t_query =
        s->strided ? strided_query(t, c, s) : upload(t, c, c->query, s->B, s->Sq, E, s->dt);
    c->t_key = s->self ? c->t_query : upload(t, c, c->key, s->B, s->Sk, s->kdim, s->dt);
    c->t_value = s->shared_kv ? c->t_key : upload(t, c, c->value, s->B, s->Sk, s->vdim, s->dt);
    if (s->separate) {
        const int64_t cols[3] = {E, s->kdim, s->vdim};
        for (int i = 0; i < 3; ++i) c->t_w[i] = upload(t, c, c->w[i], 1, E, cols[i], s->dt);
    } else {
        float *packed = packed_weight(s, c);
        c->t_w[0] = upload(t, c, packed, 1, 3 * E, E, s->dt);
        free(packed);
    }
    c->t_w[3] = upload(t, c, c->w[3], 1, E, E, s->dt);
    if (s->in_bias) c->t_bias[0] = upload(t, c, c->bias[0], 1, 1, 3 * E, s->dt);
    if (s->out_bias) c->t_bias[1] = upload(t, c, c->bias[1], 1, 1, E, s->dt);
    const int64_t kpm[4] = {1, 1, s->B, s->Sk};
    const int64_t attn[4] = {s->per_head_attn ? s->B : 1, s->per_head_attn ? s->H : 1, s->Sq,
                             s->Sk};
    if (c->kpm_keep) c->t_kpm = upload_u8(t, c, c->kpm_keep, kpm);
    if (c->kpm_add) c->t_kpm = upload(t, c, c->kpm_add, 1, s->B, s->Sk, CLATTN_F32);
    if (c->attn_keep) c->t_attn = upload_u8(t, c, c->attn_keep, attn);
    if (c->attn_add) {
        c->t_attn = upload(t, c, c->attn_add, attn[0] * attn[1], s->Sq, s->Sk, CLATTN_F32);
        c->t_attn = clattn_tensor_4d(c->t_attn.buffer, CLATTN_F32, attn[0], attn[1], s->Sq, s->Sk);
    }
    const int64_t out[4] = {1, s->B, s->Sq, s->strided ? E + 3 : E};
    c->t_out = fresh(t, c, out, s->dt);
    c->t_out.shape[3] = E;
    const int64_t per_head[4] = {s->B, s->H, s->Sq, s->Sk}, mean[4] = {1, s->B, s->Sq, s->Sk};
    if (s->weights) c->t_weights = fresh(t, c, s->weights == 2 ? per_head : mean, s->dt);
}

/* The reference's view of the case. */
static ref_mha reference_of(const mha_spec *s, const mha_case *c) {
    ref_mha r;
    memset(&r, 0, sizeof r);
    r.B = s->B, r.Sq = s->Sq, r.Sk = s->Sk, r.E = s->E, r.H = s->H, r.kdim = s->kdim;
    r.vdim = s->vdim;
    r.query = c->query, r.key = c->key, r.value = c->value;
    r.wq = c->w[0], r.wk = c->w[1], r.wv = c->w[2], r.wo = c->w[3];
    if (c->bias[0]) r.bq = c->bias[0], r.bk = c->bias[0] + s->E, r.bv = c->bias[0] + 2 * s->E;
    r.bo = c->bias[1];
    r.kpm_keep = c->kpm_keep, r.kpm_add = c->kpm_add;
    r.attn_keep = c->attn_keep, r.attn_add = c->attn_add;
    const int64_t plane = s->Sq * s->Sk;
    r.attn_strides[0] = s->per_head_attn ? s->H * plane : 0;
    r.attn_strides[1] = s->per_head_attn ? plane : 0;
    r.attn_strides[2] = s->Sk, r.attn_strides[3] = 1;
    r.causal = s->causal;
    return r;
}

/* The unit roundoff of a stored dtype. */
static double roundoff(clattn_dtype dt) {
    return dt == CLATTN_F32 ? 0x1p-24 : dt == CLATTN_F16 ? 0x1p-11 : 0x1p-8;
}

/* On the units (FlashAttention's test): got's largest error against float64 at most twice that
 * of the reference's own 16-bit path (ref_mha's rounding, its results stored in dt), plus
 * 1e-5 for the f32 sums. A NaN where the reference has a number is the largest error. */
static bool within_twice(test_ctx *t, const char *what, const float *got, const double *want,
                         const double *path, size_t n) {
    double err = 0.0, path_err = 0.0;
    size_t worst = 0;
    for (size_t i = 0; i < n; ++i) {
        path_err = fmax(path_err, fabs(path[i] - want[i]));
        const double e = isnan(got[i]) ? INFINITY : fabs(got[i] - want[i]);
        if (e > err) err = e, worst = i;
    }
    if (err <= 2 * path_err + 1e-5) return true;
    test_fail_at(t, __FILE__, __LINE__,
                 "%s[%zu] = %.7g, expected %.7g: error %.3g, the 16-bit "
                 "reference's %.3g",
                 what, worst, (double)got[worst], want[worst], err, path_err);
    return false;
}

/* |got - want| <= atol + rtol |want| everywhere: the f32 error of sums of E products, plus the
 * rounding of the stored dtype. */
static bool close_to(test_ctx *t, const char *what, const float *got, const double *want, size_t n,
                     clattn_dtype dt) {
    const double rtol = dt == CLATTN_F32 ? 1e-4 : dt == CLATTN_F16 ? 1e-3 : 8e-3, atol = 2e-5;
    for (size_t i = 0; i < n; ++i)
        if (!(fabs(got[i] - want[i]) <= atol + rtol * fabs(want[i]))) {
            test_fail_at(t, __FILE__, __LINE__, "%s[%zu] = %.7g, expected %.7g", what, i,
                         (double)got[i], want[i]);
            return false;
        }
    return true;
}

/* Reads a {1,R,S,C} or 4-D view (rows possibly strided) into dense floats. */
static float *download(test_ctx *t, const clattn_tensor *v) {
    const int64_t *n = v->shape;
    const size_t count = (size_t)(n[0] * n[1] * n[2] * n[3]);
    const size_t extent = (size_t)clattn__tensor_last_element(v) + 1;
    void *raw = malloc(extent * clattn_dtype_size(v->dtype));
    float *dense = malloc(count * sizeof(float));
    if (!raw || !dense || !test_read(t, v->buffer, raw, extent * clattn_dtype_size(v->dtype))) {
        free(raw), free(dense);
        return NULL;
    }
    size_t at = 0;
    for (int64_t a = 0; a < n[0]; ++a)
        for (int64_t b = 0; b < n[1]; ++b)
            for (int64_t i = 0; i < n[2]; ++i)
                for (int64_t j = 0; j < n[3]; ++j)
                    dense[at++] =
                        ref_load(raw, v->dtype,
                                 (uint64_t)(v->offset + a * v->strides[0] + b * v->strides[1] +
                                            i * v->strides[2] + j * v->strides[3]));
    free(raw);
    return dense;
}

/* An out-of-order queue on the test device, or NULL where it has none. */
static cl_command_queue out_of_order_queue(test_ctx *t) {
    cl_command_queue_properties props = 0;
    clGetDeviceInfo(clattn_env_device(t->env), CL_DEVICE_QUEUE_PROPERTIES, sizeof props, &props,
                    NULL);
    if (!(props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE)) return NULL;
    cl_int err;
    cl_command_queue q = clCreateCommandQueue(clattn_env_context(t->env), clattn_env_device(t->env),
                                              CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, &err);
    return err == CL_SUCCESS ? q : NULL;
}

/* A caller workspace of exactly the size asked for; as a sub-buffer of a larger buffer at an
 * aligned origin when `sub` (OpenCL makes no sub-buffer of a sub-buffer: the call must cut its
 * own region from the parent). */
static int make_workspace(test_ctx *t, mha_case *c, const clattn_mha_params *p,
                          clattn_mha_options *o, cl_command_queue queue, bool sub) {
    size_t bytes = 0;
    int status = clattn_mha_workspace_size(&c->t_query, &c->t_key, &c->t_value, p, &c->t_out, o,
                                           queue, &bytes);
    if (status != CLATTN_SUCCESS) return status;
    cl_uint align_bits = 1024;
    clGetDeviceInfo(clattn_env_device(t->env), CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align_bits,
                    &align_bits, NULL);
    const size_t origin = sub ? align_bits / 8 : 0;
    cl_mem whole = test_buffer_whole(t, origin + bytes);
    c->buffers[c->nbuffers++] = whole;
    o->workspace = whole;
    if (!sub || !whole) return CLATTN_SUCCESS;
    const cl_buffer_region region = {origin, bytes};
    cl_int err;
    o->workspace = clCreateSubBuffer(whole, 0, CL_BUFFER_CREATE_TYPE_REGION, &region, &err);
    c->buffers[c->nbuffers++] = o->workspace;
    return err;
}

/* The case's params and options (no workspace). */
static void call_args(const mha_spec *s, mha_case *c, clattn_mha_params *p, clattn_mha_options *o) {
    *p = (clattn_mha_params){(int)s->H, NULL, NULL, NULL, NULL, NULL, &c->t_w[3], NULL};
    if (s->separate) p->q_proj_weight = &c->t_w[0], p->k_proj_weight = &c->t_w[1];
    if (s->separate)
        p->v_proj_weight = &c->t_w[2];
    else
        p->in_proj_weight = &c->t_w[0];
    if (s->in_bias) p->in_proj_bias = &c->t_bias[0];
    if (s->out_bias) p->out_proj_bias = &c->t_bias[1];
    memset(o, 0, sizeof *o);
    o->key_padding_mask = s->kpm ? &c->t_kpm : NULL;
    o->attn_mask = s->attn ? &c->t_attn : NULL;
    o->is_causal = s->causal;
    o->weights = s->weights ? &c->t_weights : NULL;
    o->average_attn_weights = s->weights == 1;
}

/* Offers every device the emulated tile unit `units` (0: none, as the device is). With it, f32
 * attention (the f32 path's) stays on the FMA units: the emulated tf32 unit's 3xTF32 attention
 * is the attention suite's, and here it would build its slow emulated programs for each case. */
static void emulate_units(int units) {
    clattn__hook_set(CLATTN__HOOK_MATRIX_EMULATION, units ? units : -1);
    clattn_tuning_override("attention", units ? "UNIT_F32=0" : NULL);
}

/* The workspace the case asks for, with the emulated tile unit `units` offered or none (0 on
 * failure). */
static size_t workspace_bytes(test_ctx *t, const mha_spec *s, mha_case *c, int units) {
    clattn_mha_params p;
    clattn_mha_options o;
    call_args(s, c, &p, &o);
    cl_context context = clattn_env_context(t->env);
    clattn_cache_clear(context); /* the probe's answer goes with the cache */
    emulate_units(units);
    size_t bytes = 0;
    const int status = clattn_mha_workspace_size(&c->t_query, &c->t_key, &c->t_value, &p, &c->t_out,
                                                 &o, clattn_env_queue(t->env), &bytes);
    if (status != CLATTN_SUCCESS)
        test_fail_at(t, __FILE__, __LINE__, "clattn_mha_workspace_size -> %s: %s",
                     clattn_status_name(status), clattn_last_error());
    emulate_units(0);
    clattn_cache_clear(context);
    return bytes;
}

/* A gate (a user event) that a watchdog thread opens after 30 s unless the test opened it first:
 * a call that waits, before it returns, for work behind its own wait list fails, not hangs. */
typedef struct gate {
    cl_event event;
    atomic_bool returned, forced;
    pthread_t watchdog;
    bool watching;
} gate;

static void *watch_gate(void *arg) {
    gate *g = arg;
    for (int i = 0; i < 300 && !atomic_load(&g->returned); ++i)
        nanosleep(&(struct timespec){0, 100000000}, NULL);
    if (!atomic_load(&g->returned)) {
        atomic_store(&g->forced, true);
        clSetUserEventStatus(g->event, CL_COMPLETE);
    }
    return NULL;
}

static bool gate_close(test_ctx *t, gate *g) {
    cl_int err;
    memset(g, 0, sizeof *g);
    g->event = clCreateUserEvent(clattn_env_context(t->env), &err);
    if (err != CL_SUCCESS) test_fail_at(t, __FILE__, __LINE__, "clCreateUserEvent: %d", err);
    g->watching = g->event && pthread_create(&g->watchdog, NULL, watch_gate, g) == 0;
    return g->watching;
}

/* The call returned: the gate must still be closed and `done` (NULL: none) not complete; then
 * it opens. */
static void gate_open(test_ctx *t, gate *g, cl_event done) {
    atomic_store(&g->returned, true);
    if (g->watching) pthread_join(g->watchdog, NULL);
    cl_int state = CL_QUEUED;
    if (done) clGetEventInfo(done, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof state, &state, NULL);
    if (atomic_load(&g->forced))
        test_fail_at(t, __FILE__, __LINE__, "the call waited for the gate (30 s)");
    else if (state == CL_COMPLETE)
        test_fail_at(t, __FILE__, __LINE__, "the call completed before its wait list");
    if (g->event) clSetUserEventStatus(g->event, CL_COMPLETE), clReleaseEvent(g->event);
}

/* Whether the kernel trace holds `name`; takes (and releases) what it holds. */
static bool traced(const char *name) {
    clattn__traced_kernel kernels[64];
    const size_t n = clattn__trace_take(kernels, 64);
    bool seen = false;
    for (size_t i = 0; i < n; ++i) {
        seen = seen || strcmp(kernels[i].name, name) == 0;
        clReleaseEvent(kernels[i].event);
    }
    return seen;
}

static int run_forward(test_ctx *t, const mha_spec *s, mha_case *c) {
    clattn_mha_params p;
    clattn_mha_options o;
    call_args(s, c, &p, &o);
    cl_command_queue queue = s->out_of_order ? out_of_order_queue(t) : NULL;
    if (!queue) queue = clattn_env_queue(t->env);
    int status = CLATTN_SUCCESS;
    cl_event done = NULL, blocked = NULL;
    gate g = {0};
    if (s->gated && !gate_close(t, &g)) status = CL_OUT_OF_RESOURCES;
    if (status == CLATTN_SUCCESS && s->gated) /* the queue itself behind the gate */
        status = clEnqueueMarkerWithWaitList(queue, 1, &g.event, &blocked);
    if (status == CLATTN_SUCCESS && s->workspace)
        status = make_workspace(t, c, &p, &o, queue, s->workspace == 2);
    clattn__trace_kernels(s->absent != NULL);
    if (status == CLATTN_SUCCESS)
        status = clattn_mha_forward(&c->t_query, &c->t_key, &c->t_value, &p, &c->t_out, &o, queue,
                                    s->gated ? 1 : 0, s->gated ? &g.event : NULL, &done);
    clattn__trace_kernels(false);
    if (s->gated) gate_open(t, &g, done);
    if (blocked) clReleaseEvent(blocked);
    if (s->absent && traced(s->absent) && status == CLATTN_SUCCESS)
        test_fail_at(t, __FILE__, __LINE__, "the forward enqueued %s", s->absent);
    if (done) clWaitForEvents(1, &done), clReleaseEvent(done);
    if (queue != clattn_env_queue(t->env)) clReleaseCommandQueue(queue);
    return status;
}

/* The heads' mean of per-head values [B,H,Sq,Sk] into the first B*Sq*Sk, as torch takes it:
 * the sum, then a division. */
static void head_mean(const mha_spec *s, double *x) {
    const size_t plane = (size_t)(s->Sq * s->Sk), n = (size_t)s->B * plane;
    for (size_t e = 0; e < n; ++e) {
        const size_t b = e / plane, rest = e % plane;
        double sum = 0;
        for (int64_t h = 0; h < s->H; ++h) sum += x[(b * (size_t)s->H + (size_t)h) * plane + rest];
        x[e] = sum / (double)s->H;
    }
}

/* Whether the forward of s keeps 16 bits on matrix units (ops/mha.c's inner dtype): every
 * tensor of the case is in s->dt, so a 16-bit dt does wherever the GEMMs take the units (the
 * emulated tile unit `emulate`, the hook; a GPU's own where its probe passed). */
static bool on_units(test_ctx *t, const mha_spec *s, int emulate) {
    if (s->dt == CLATTN_F32) return false;
    const clattn__call call = {clattn_env_queue(t->env),
                               clattn_env_context(t->env),
                               clattn_env_device(t->env),
                               0,
                               NULL,
                               NULL};
    const int64_t rows = s->B * (s->Sq > s->Sk ? s->Sq : s->Sk);
    const int64_t deep = s->E > s->kdim ? (s->E > s->vdim ? s->E : s->vdim)
                                        : (s->kdim > s->vdim ? s->kdim : s->vdim);
    bool takes = false;
    if (emulate)
        clattn_cache_clear(call.context), clattn__hook_set(CLATTN__HOOK_MATRIX_EMULATION, emulate);
    const int status = clattn__gemm_units_available(&call, s->dt, (size_t)rows, (size_t)(3 * s->E),
                                                    (size_t)deep, 1, &takes);
    /* the emulated probe's answer goes with the cache */
    if (emulate)
        clattn__hook_set(CLATTN__HOOK_MATRIX_EMULATION, -1), clattn_cache_clear(call.context);
    if (status != CLATTN_SUCCESS)
        test_fail_at(t, __FILE__, __LINE__, "clattn__gemm_units_available -> %s: %s",
                     clattn_status_name(status), clattn_last_error());
    return takes;
}

/* The reference's out and weights (*want, *want_w) and, on the units, those of its own 16-bit
 * path (*path, *path_w: ref_mha's rounding, then stored in dt); the weights averaged when the
 * case asks. */
static bool reference_values(const mha_spec *s, bool units, const mha_case *c, double **want,
                             double **want_w, double **path, double **path_w) {
    ref_mha r = reference_of(s, c);
    const size_t n_out = (size_t)(s->B * s->Sq * s->E), n_w = (size_t)(s->B * s->H * s->Sq * s->Sk);
    *want = malloc(n_out * sizeof(double)), *want_w = malloc(n_w * sizeof(double));
    bool ok = *want && *want_w && ref_mha_forward(&r, *want, *want_w);
    if (units) {
        r.rounding = s->dt;
        *path = malloc(n_out * sizeof(double)), *path_w = malloc(n_w * sizeof(double));
        ok = ok && *path && *path_w && ref_mha_forward(&r, *path, *path_w);
    }
    if (ok && s->weights == 1) head_mean(s, *want_w);
    if (ok && s->weights == 1 && units) head_mean(s, *path_w);
    uint16_t bits;
    for (size_t i = 0; ok && units && i < n_out; ++i)
        ref_store(&bits, s->dt, 0, (float)(*path)[i]), (*path)[i] = ref_load(&bits, s->dt, 0);
    for (size_t i = 0; ok && units && i < n_w; ++i)
        ref_store(&bits, s->dt, 0, (float)(*path_w)[i]), (*path_w)[i] = ref_load(&bits, s->dt, 0);
    return ok;
}

/* Whether `got` is the reference's: on the units as within_twice, else close_to's tolerance. */
static bool matches(test_ctx *t, const mha_spec *s, bool units, const char *what, const float *got,
                    const double *want, const double *path, size_t n) {
    return units ? within_twice(t, what, got, want, path, n)
                 : close_to(t, what, got, want, n, s->dt);
}

/* Runs the case and compares out (and the weights) with the reference. With `emulate`, the
 * forward runs with the emulation hook, and on a device whose own units do not take it its
 * workspace must be smaller than without the hook (the 16-bit projections): the proof that it
 * took them. */
static void check_case(test_ctx *t, const mha_spec *s) {
    mha_case c;
    memset(&c, 0, sizeof c);
    make_host(s, &c);
    make_device(t, s, &c);
    const size_t n_out = (size_t)(s->B * s->Sq * s->E), n_w = (size_t)(s->B * s->H * s->Sq * s->Sk);
    double *want = NULL, *want_w = NULL, *path = NULL, *path_w = NULL;
    float *got = NULL, *got_w = NULL;
    const bool units = on_units(t, s, s->emulate), own_units = s->emulate && on_units(t, s, 0);
    bool ok = !t->failed && reference_values(s, units, &c, &want, &want_w, &path, &path_w);
    if (ok && s->emulate && s->dt != CLATTN_F32 && !own_units) {
        const size_t f32 = workspace_bytes(t, s, &c, 0),
                     units = workspace_bytes(t, s, &c, s->emulate);
        if (units >= f32)
            test_fail_at(t, __FILE__, __LINE__, "the units' workspace is %zu bytes, f32's %zu",
                         units, f32);
        ok = !t->failed;
    }
    cl_context context = clattn_env_context(t->env);
    if (s->emulate) clattn_cache_clear(context), emulate_units(s->emulate);
    int status = ok ? run_forward(t, s, &c) : CLATTN_SUCCESS;
    if (s->emulate) emulate_units(0), clattn_cache_clear(context);
    if (status != CLATTN_SUCCESS)
        test_fail_at(t, __FILE__, __LINE__, "clattn_mha_forward -> %s: %s",
                     clattn_status_name(status), clattn_last_error());
    ok = ok && status == CLATTN_SUCCESS && (got = download(t, &c.t_out)) != NULL;
    ok = ok && matches(t, s, units, "out", got, want, path, n_out);
    if (ok && s->weights) {
        got_w = download(t, &c.t_weights);
        ok = got_w && matches(t, s, units, "weights", got_w, want_w, path_w,
                              s->weights == 1 ? n_w / (size_t)s->H : n_w);
    }
    free(want), free(want_w), free(path), free(path_w), free(got), free(got_w);
    free_case(&c);
}

/* CLBlast's GEMMs are misread by Oclgrind's uninitialized-value checker (harness.h); the
 * oclgrind-mha lane runs these tests without it. */
static bool skip_gemms(test_ctx *t) {
    if (test_under_uninit_checker()) test_skip(t, "CLBlast GEMMs under the uninitialized checker");
    return t->skipped;
}

/* ---- parity with the reference ---- */

static void self_attention_one_head(test_ctx *t) {
    if (skip_gemms(t)) return;
    mha_spec s = self_spec(2, 7, 24, 1);
    s.weights = 1, s.workspace = 1;
    check_case(t, &s);
}

static void self_attention_u8_masks(test_ctx *t) {
    if (skip_gemms(t)) return;
    mha_spec s = self_spec(2, 9, 40, 2);
    s.kpm = s.attn = KEEP_MASK, s.weights = 2;
    s.workspace = 2, s.out_of_order = true; /* a sub-buffer workspace, an out-of-order queue */
    check_case(t, &s);
}

static void self_attention_float_masks_causal(test_ctx *t) {
    if (skip_gemms(t)) return;
    mha_spec s = self_spec(2, 8, 64, 8);
    s.kpm = s.attn = ADD_MASK, s.per_head_attn = true, s.causal = 1, s.weights = 1;
    check_case(t, &s);
}

static void cross_attention_separate_weights(test_ctx *t) {
    if (skip_gemms(t)) return;
    mha_spec s = cross_spec(2, 5, 11, 40, 8);
    s.kdim = 24, s.vdim = 33, s.separate = true, s.in_bias = false, s.out_bias = false;
    s.kpm = ADD_MASK, s.attn = KEEP_MASK, s.per_head_attn = true, s.weights = 2;
    check_case(t, &s);
}

static void cross_attention_shared_key_value(test_ctx *t) {
    if (skip_gemms(t)) return;
    mha_spec s = cross_spec(3, 6, 13, 24, 2);
    s.shared_kv = true, s.kpm = KEEP_MASK, s.attn = ADD_MASK, s.causal = 1;
    check_case(t, &s);
}

static void cross_attention_separate_inputs(test_ctx *t) {
    if (skip_gemms(t)) return;
    mha_spec s = cross_spec(2, 7, 7, 40, 2);
    s.in_bias = false, s.attn = ADD_MASK, s.weights = 1;
    check_case(t, &s);
}

/* Rows with every key hidden: out is out_proj_bias there, the weights 0 (torch 1.13: NaN). */
static void hidden_rows_give_the_bias(test_ctx *t) {
    if (skip_gemms(t)) return;
    mha_spec s = self_spec(2, 6, 24, 2);
    s.kpm = KEEP_MASK, s.hide_batch = true, s.weights = 2;
    check_case(t, &s);
    mha_spec f = self_spec(2, 5, 24, 1);
    f.kpm = f.attn = ADD_MASK, f.hide_batch = true, f.weights = 1;
    check_case(t, &f);
    mha_spec fused = self_spec(2, 6, 24, 2); /* no weights: the fused kernel's empty rows */
    fused.kpm = fused.attn = KEEP_MASK, fused.hide_batch = true;
    check_case(t, &fused);
}

/* f16 and bf16 storage of every tensor, query and out with rows CLBlast cannot take as they
 * are: f32 images in the workspace, or on a GPU whose matrix units the GEMMs take, the 16-bit
 * path (within_twice). */
static void half_storage_and_strided_rows(test_ctx *t) {
    if (skip_gemms(t)) return;
    mha_spec s = self_spec(2, 7, 40, 2);
    s.dt = CLATTN_F16, s.strided = true, s.kpm = KEEP_MASK, s.weights = 1, s.self = false;
    s.shared_kv = false;
    check_case(t, &s);
    mha_spec b = cross_spec(2, 6, 9, 24, 2);
    b.dt = CLATTN_BF16, b.separate = true, b.kdim = 17, b.causal = 1, b.weights = 2;
    check_case(t, &b);
    mha_spec f = self_spec(1, 5, 24, 2);
    f.strided = true, f.self = f.shared_kv = false;
    check_case(t, &f);
}

/* f16 and bf16 storage throughout on the emulated matrix units: the projections stay 16-bit
 * on matmul_mma, the attention takes attention_mma (head dims of whole fragments, no weights),
 * on another vendor's tile attention_units (head dims of whole tiles), or the composed path
 * (weights);
 * against float64, within twice the error of the reference's own 16-bit path. Strided query and out
 * rows (16-bit images), self-attention's one GEMM, causal with a padding mask; cross-attention with
 * separate weights, a key dim of 16-byte rows and a value dim of odd ones, a float mask and
 * averaged weights. */
static void half_storage_on_matrix_units(test_ctx *t) {
    if (clattn__device_max_group(clattn_env_device(t->env)) < 128)
        return test_skip(t, "groups capped below the matrix-unit kernels' 128");
    if (test_under_uninit_checker())
        return test_skip(t, "the emulated units run without --uninitialized");
    mha_spec s = self_spec(2, 20, 64, 2);
    s.dt = CLATTN_F16, s.emulate = CLATTN__TILE_NV, s.strided = true, s.kpm = KEEP_MASK;
    s.causal = 1;
    check_case(t, &s);
    mha_spec b = cross_spec(2, 9, 13, 32, 2);
    b.dt = CLATTN_BF16, b.emulate = CLATTN__TILE_NV, b.separate = true, b.kdim = 24, b.vdim = 17;
    b.attn = ADD_MASK, b.weights = 1;
    if (!t->failed) check_case(t, &b);
    /* Intel's dpas tile (subgroups of 16): the projections and the fused attention
     * (attention_units) on it; the small tile keeps PoCL's builds of the emulation short. */
    mha_spec d = self_spec(2, 20, 64, 2);
    d.dt = CLATTN_F16, d.emulate = CLATTN__TILE_DPAS16, d.kpm = KEEP_MASK, d.causal = 1;
    d.absent = "copy4d"; /* dense rows, and the bias rows matmul_mma's */
    if (t->failed) return;
    CHECK_OK(t, clattn_tuning_override("matmul", "UNIT_M=16,UNIT_N=16"));
    check_case(t, &d);
    clattn_tuning_override("matmul", NULL);
}

/* f32 on the emulated tf32 unit, the call and its queue behind a user event that opens only
 * after the call returned: the projections take matmul_mma's 3xTF32 products, whose probe (built
 * and run with a blocking read) runs when a call is first planned since the probes' answer was
 * cleared, here in clattn_mha_workspace_size (a caller workspace). On the caller's queue its
 * read would wait for the gate, and hang: the probes have their own queue.
 * The biases are matmul_mma's bias rows: no copy fills the outputs with them first
 * (self-attention's dense rows need no images either). */
static void f32_forward_on_the_tf32_unit_behind_a_gate(test_ctx *t) {
    if (test_is_pocl31_basic(t))
        return test_skip(t, "PoCL 3.1 basic deadlocks in clSetUserEventStatus (driver bug)");
    if (clattn__device_max_group(clattn_env_device(t->env)) < 128)
        return test_skip(t, "groups capped below matmul_mma's 128");
    if (test_under_uninit_checker())
        return test_skip(t, "the emulated units run without --uninitialized");
    mha_spec s = self_spec(1, 6, 16, 2);
    s.emulate = CLATTN__TILE_NV, s.gated = true, s.absent = "copy4d", s.workspace = 1;
    check_case(t, &s);
}

/* ---- the GEMMs: CLBlast's bridge and clattn's kernel ---- */

/* One GEMM case: a strided batch of c = a op(b) + bias + beta c, a and b in `in`, c in `out`,
 * with offsets and row strides past the columns (all multiples of 8 elements when `aligned`,
 * which the matrix-unit kernel loads 16 bytes at a time). `matmul`: NULL for CLBlast's bridge
 * (f32), "units:ROW" for clattn__gemm_units_batched, else the GEMM every op calls, with that
 * matmul row (ROW) as an override. `biased` (units only): a bias row in `bias`, every other
 * element of a buffer from element 3 on. `kernel`: the first kernel the GEMM must enqueue, or
 * with a leading '!' a kernel it must not enqueue (NULL: either). `specials` (f32, M > 5, N > 4,
 * K > 7): a of the first matrix holds Inf at (1, 2) and f32's largest but one at (5, 7), op(b)
 * NaN at (3, 4). `wide`: every index as if past 2^31 (the narrow limit 0: matmul_mma's IDX
 * ulong). */
typedef struct gemm_case {
    size_t M, N, K;
    bool trans_b, aligned;
    float beta;
    clattn_dtype in, out;
    const char *matmul;
    bool biased;
    clattn_dtype bias;
    const char *kernel;
    bool specials, wide;
} gemm_case;

/* `n` values of host in dt, as a fresh buffer (NULL, and the test failed, when it failed). */
static cl_mem upload_raw(test_ctx *t, const float *host, size_t n, clattn_dtype dt) {
    const size_t size = clattn_dtype_size(dt);
    void *raw = malloc(n * size);
    cl_mem buffer = raw ? test_buffer(t, n * size) : NULL;
    for (size_t i = 0; raw && i < n; ++i) ref_store(raw, dt, i, host[i]);
    if (buffer && !test_write(t, buffer, raw, n * size)) buffer = NULL;
    free(raw);
    return buffer;
}

/* Runs the case's GEMM, which must leave the call's event alone (the caller's to give). */
static int run_gemm(test_ctx *t, const gemm_case *g, const clattn__matrices *a,
                    const clattn__matrices *b, const clattn__bias_row *bias,
                    const clattn__matrices *c, size_t batch) {
    cl_event untouched = NULL;
    const clattn__call call = {clattn_env_queue(t->env),
                               clattn_env_context(t->env),
                               clattn_env_device(t->env),
                               0,
                               NULL,
                               &untouched};
    if (!g->matmul) {
        const int status =
            clattn__sgemm_batched(&call, g->trans_b, g->M, g->N, g->K, a, b, g->beta, c, batch);
        if (untouched) test_fail_at(t, __FILE__, __LINE__, "CLBlast's GEMM set the call's event");
        return status;
    }
    const bool units = strncmp(g->matmul, "units:", 6) == 0;
    const char *row = units ? g->matmul + 6 : g->matmul;
    int status = *row ? clattn_tuning_override("matmul", row) : CLATTN_SUCCESS;
    clattn__traced_kernel traced[4];
    const uint64_t limit =
        clattn__narrow_index_limit_set(g->wide ? 0 : clattn__narrow_index_limit());
    clattn__trace_kernels(true);
    if (status == CLATTN_SUCCESS && units)
        status = clattn__gemm_units_batched(&call, g->in, g->out, g->trans_b, g->M, g->N, g->K, a,
                                            b, bias, g->beta, c, batch);
    else if (status == CLATTN_SUCCESS)
        status = clattn__gemm_batched(&call, g->trans_b, g->M, g->N, g->K, a, b, g->beta, c, batch);
    clattn__narrow_index_limit_set(limit);
    clattn__trace_kernels(false);
    const size_t kernels = clattn__trace_take(traced, 4);
    clattn_tuning_override("matmul", NULL);
    const bool unwanted = g->kernel && g->kernel[0] == '!';
    bool seen = false; /* the kernel, first (wanted) or anywhere (unwanted) */
    for (size_t i = 0; i < kernels; ++i) {
        const char *want = unwanted ? g->kernel + 1 : g->kernel;
        seen = seen || (want && (i == 0 || unwanted) && strcmp(traced[i].name, want) == 0);
        clReleaseEvent(traced[i].event);
    }
    if (status == CLATTN_SUCCESS && g->kernel && seen == unwanted)
        test_fail_at(t, __FILE__, __LINE__, "%s: the GEMM %s %s", g->matmul,
                     unwanted ? "enqueued" : "did not start with", g->kernel + unwanted);
    if (untouched) {
        test_fail_at(t, __FILE__, __LINE__, "%s: the GEMM set the call's event", g->matmul);
        clReleaseEvent(untouched);
    }
    return status;
}

/* Whether the case runs 3xTF32 products: f32 on matmul_mma. */
static bool split_products(const gemm_case *g) {
    const bool units = g->matmul && strncmp(g->matmul, "units:", 6) == 0;
    return g->in == CLATTN_F32 && (units || (g->kernel && strcmp(g->kernel, "matmul_mma") == 0));
}

/* Runs the case against float64: the products of values exact in `in` are exact in f32, so the
 * f32 sum is within err = 2 (K + 1) 2^-24 sum |terms| of ref, and c within err + u (|ref| +
 * err), u the unit roundoff of a 16-bit `out` (its one rounding; 0 for f32), plus 2^-24 for
 * f16's subnormals. 3xTF32 (cl/mma.cl: x = big + small + e, |e| < 2^-21 |x|, |small| <= 2^-11
 * |x|) drops small_a small_b + (big_a + small_a) e_b + e_a b, under 5.01 2^-22 |a b| a term,
 * and sums 3 K exact tf32 products, whose sizes add up to at most (1 + 2^-9 + 3 2^-22) |a b| a
 * term: err = (2 (3 K + 1) 2^-24 (1 + 2^-8) + 5.01 2^-22) sum |terms|. Elements outside the
 * matrices must keep their values. */
static void check_gemm_case(test_ctx *t, const gemm_case *g) {
    enum { BATCH = 2 };
    const size_t pad = g->aligned ? 8 : 1, M = g->M, N = g->N, K = g->K;
    const size_t lda = (K + 3 + pad - 1) / pad * pad, ldc = (N + 4 + pad - 1) / pad * pad;
    const size_t ldb = ((g->trans_b ? K + 1 : N + 2) + pad - 1) / pad * pad;
    const size_t rows_b = g->trans_b ? N : K;
    const size_t sa = (M * lda + 3 + pad - 1) / pad * pad,
                 sb = (rows_b * ldb + 1 + pad - 1) / pad * pad;
    const size_t sc = M * ldc + 5, oa = g->aligned ? 8 : 5, ob = g->aligned ? 16 : 2, oc = 7;
    const size_t na = oa + BATCH * sa, nb = ob + BATCH * sb, nc = oc + BATCH * sc;
    const size_t nbias = 3 + 2 * N;
    uint64_t rng = g->trans_b ? 11 : 12;
    float *a = values(na, g->in, 1.0f, &rng), *b = values(nb, g->in, 1.0f, &rng),
          *c = values(nc, g->out, 1.0f, &rng), *got = malloc(nc * sizeof(float));
    float *bias = g->biased ? values(nbias, g->bias, 1.0f, &rng) : NULL;
    if (g->specials && a && b) {
        a[oa + lda + 2] = INFINITY, a[oa + 5 * lda + 7] = 0x1.fffffcp127f;
        b[ob + (g->trans_b ? 4 * ldb + 3 : 3 * ldb + 4)] = NAN;
    }
    cl_mem ab = a ? upload_raw(t, a, na, g->in) : NULL, bb = b ? upload_raw(t, b, nb, g->in) : NULL;
    cl_mem cb = c ? upload_raw(t, c, nc, g->out) : NULL;
    cl_mem biasb = bias ? upload_raw(t, bias, nbias, g->bias) : NULL;
    bool ok = a && b && c && got && ab && bb && cb && (!g->biased || biasb);
    const clattn__matrices am = {ab, oa, lda, sa}, bm = {bb, ob, ldb, sb}, cm = {cb, oc, ldc, sc};
    const clattn__bias_row row = {biasb, 3, 2, g->bias};
    const int status =
        ok ? run_gemm(t, g, &am, &bm, g->biased ? &row : NULL, &cm, BATCH) : CLATTN_SUCCESS;
    if (status != CLATTN_SUCCESS)
        test_fail_at(t, __FILE__, __LINE__, "gemm: %s: %s", clattn_status_name(status),
                     clattn_last_error());
    const size_t size = clattn_dtype_size(g->out);
    void *raw = malloc(nc * size);
    ok = ok && status == CLATTN_SUCCESS && raw && test_read(t, cb, raw, nc * size);
    for (size_t at = 0; ok && at < nc; ++at) got[at] = ref_load(raw, g->out, at);
    const double u = g->out == CLATTN_F32 ? 0.0 : roundoff(g->out);
    const double atol = g->out == CLATTN_F16 ? 0x1p-24 : 0.0;
    for (size_t at = 0; ok && at < nc; ++at) {
        const size_t rel = at - oc, batch = rel / sc, r = rel % sc / ldc, col = rel % sc % ldc;
        const bool inside = at >= oc && batch < BATCH && r < M && col < N;
        double want = c[at], scale = fabs(g->beta * c[at]);
        if (inside) {
            want = g->beta * c[at] + (bias ? bias[3 + 2 * col] : 0.0f);
            scale += bias ? fabs(bias[3 + 2 * col]) : 0.0;
            for (size_t e = 0; e < K; ++e) {
                const size_t ib = ob + batch * sb + (g->trans_b ? col * ldb + e : e * ldb + col);
                const double term = (double)a[oa + batch * sa + r * lda + e] * b[ib];
                want += term, scale += fabs(term);
            }
        }
        const double split = 2.0 * (double)(3 * K + 1) * 0x1p-24 * (1.0 + 0x1p-8) + 5.01 * 0x1p-22;
        const double err = (split_products(g) ? split : 2.0 * (double)(K + 1) * 0x1p-24) * scale;
        if (!inside)
            ok = got[at] == c[at];
        else if (isnan(want)) /* f32's answer of a NaN or Inf term, or of an overflow */
            ok = isnan(got[at]);
        else if (fabs(want) > FLT_MAX)
            ok = got[at] == (want > 0 ? INFINITY : -INFINITY);
        else
            ok = fabs(got[at] - want) <= err + u * (fabs(want) + err) + atol;
        if (!ok)
            test_fail_at(t, __FILE__, __LINE__,
                         "%s %s x %s -> %s %zux%zux%zu trans_b %d beta %g: c[%zu] = %.8g, "
                         "expected %.8g",
                         g->matmul ? g->matmul : "CLBlast", g->aligned ? "aligned" : "unaligned",
                         clattn_dtype_name(g->in), clattn_dtype_name(g->out), M, N, K, g->trans_b,
                         (double)g->beta, at, (double)got[at], want);
    }
    cl_mem all[4] = {ab, bb, cb, biasb};
    for (int i = 0; i < 4; ++i)
        if (all[i]) clReleaseMemObject(all[i]);
    free(a), free(b), free(c), free(bias), free(got), free(raw);
}

/* The f32 cases: 13 x 9 x 21, beta 0 with b k-major, beta 1 with b n-major; `kernel` as
 * gemm_case's. */
static void check_gemm(test_ctx *t, bool trans_b, float beta, const char *matmul,
                       const char *kernel) {
    const gemm_case g = {13,         9,          21,     trans_b, false,      beta,
                         CLATTN_F32, CLATTN_F32, matmul, false,   CLATTN_F32, kernel};
    check_gemm_case(t, &g);
}

static void gemm_bridge_matches_host(test_ctx *t) {
    if (skip_gemms(t)) return;
    check_gemm(t, false, 0.0f, NULL, NULL);
    if (!t->failed) check_gemm(t, true, 1.0f, NULL, NULL);
}

/* clattn's kernel with the default tile (one partial row block and panel here) and a small one
 * (several of each, panels split over work-items), both layouts of b, beta 0 and 1. */
/* matmul_tiles reads the panels matmul_pack wrote: scratch another kernel wrote, which
 * Oclgrind's uninitialized-value checker misreads (1000 reports, results right); the
 * oclgrind-mha lane runs it without that checker. */
static void gemm_kernel_matches_host(test_ctx *t) {
    static const char *const rows[] = {"KERNEL=1,UNIT_F32=0",
                                       "KERNEL=1,MR=3,NV=1,VEC=4,PANELS=2,UNIT_F32=0"};
    if (test_under_uninit_checker())
        return test_skip(t, "matmul_tiles reads matmul_pack's panels: misread by that checker");
    for (int i = 0; i < 2 && !t->failed; ++i) {
        check_gemm(t, false, 0.0f, rows[i], "matmul_pack");
        if (!t->failed) check_gemm(t, true, 1.0f, rows[i], "matmul_pack");
    }
}

/* matmul_mma on the emulated units (the hook offers them to every device, and the kernel
 * builds its local-memory emulation), then on the device's own where its probe passed (the
 * instruction): f16 and bf16 inputs into f32, f16 and bf16 outputs, b n-major (MHA's x W^T)
 * and k-major, beta 0 and 1, a bias row of f32 or of the inputs' dtype or none; one 32-deep
 * slice with its tail past k, several slices (fetched ahead and at the slice) and blocks of rows
 * and columns, each warp shape, value-by-value and 16-byte loads. f32 on the tf32 unit (3xTF32):
 * one slice, b n-major, unaligned, with a bias row; several slices fetched at the slice, aligned;
 * then as the GEMM every op calls (its row's UNIT_F32), b k-major, aligned, several slices and
 * blocks; and not with UNIT_F32=0. The first and the third hold NaN, Inf and f32's largest but
 * one, which the split cannot take: their outputs must be f32's. Past the first, the f32 cases
 * take small warp tiles: an emulation's work goes by the blocks' area, and 3xTF32's thrice. The
 * second and the sixth index in ulong (wide): b k-major with beta 1, n-major with the specials,
 * both with a bias row. */
static void gemm_on_matrix_units_matches_host(test_ctx *t) {
    if (clattn__device_max_group(clattn_env_device(t->env)) < 128)
        return test_skip(t, "groups capped below matmul_mma's 128");
    if (test_under_uninit_checker())
        return test_skip(t, "the emulated units run without --uninitialized");
    static const gemm_case cases[] = {
        {13, 9, 21, true, false, 0.0f, CLATTN_F16, CLATTN_F16, "units:", true, CLATTN_F32},
        {13, 9, 21, false, false, 1.0f, CLATTN_BF16, CLATTN_F32, "units:UNIT_N=16", true,
         CLATTN_BF16, .wide = true},
        {70, 40, 70, true, true, 1.0f, CLATTN_F16, CLATTN_F32, "units:UNIT_M=16,UNIT_N=16"},
        {70, 40, 70, true, false, 0.0f, CLATTN_F16, CLATTN_F16, "units:UNIT_AHEAD=0"},
        {70, 150, 40, false, true, 0.0f, CLATTN_BF16, CLATTN_BF16, "units:UNIT_M=32,UNIT_N=64"},
        {13, 9, 21, true, false, 0.0f, CLATTN_F32, CLATTN_F32, "units:", true, CLATTN_F32, NULL,
         true, true},
        {20, 24, 70, true, true, 0.0f, CLATTN_F32, CLATTN_F32,
         "units:UNIT_M=16,UNIT_N=16,UNIT_AHEAD=0"},
        {40, 72, 40, false, true, 1.0f, CLATTN_F32, CLATTN_F32, "UNIT_M=16,UNIT_N=32", false,
         CLATTN_F32, "matmul_mma", true},
        {13, 9, 21, true, false, 1.0f, CLATTN_F32, CLATTN_F32, "UNIT_F32=0", false, CLATTN_F32,
         "!matmul_mma"},
    };
    cl_context context = clattn_env_context(t->env);
    const clattn__call call = {
        clattn_env_queue(t->env), context, clattn_env_device(t->env), 0, NULL, NULL};
    for (int emulated = 1; emulated >= 0 && !t->failed; --emulated) {
        clattn_cache_clear(context); /* the probe's answer goes with the cache */
        clattn__hook_set(CLATTN__HOOK_MATRIX_EMULATION, emulated ? 1 : -1);
        bool takes[3] = {false, false, false};
        const clattn_dtype types[3] = {CLATTN_F16, CLATTN_BF16, CLATTN_F32};
        for (int i = 0; i < 3 && !t->failed; ++i) {
            const int status =
                clattn__gemm_units_available(&call, types[i], 70, 150, 70, 2, &takes[i]);
            if (status != CLATTN_SUCCESS || (emulated && !takes[i]))
                test_fail_at(t, __FILE__, __LINE__, "%s %s units: %s, taken %d",
                             emulated ? "emulated" : "the device's", clattn_dtype_name(types[i]),
                             clattn_status_name(status), takes[i]);
        }
        for (size_t i = 0; i < sizeof cases / sizeof cases[0] && !t->failed; ++i)
            if (takes[cases[i].in == CLATTN_F32 ? 2 : cases[i].in == CLATTN_BF16])
                check_gemm_case(t, &cases[i]);
    }
    clattn__hook_set(CLATTN__HOOK_MATRIX_EMULATION, -1);
    clattn_cache_clear(context);
}

/* matmul_mma on the emulations of the other mechanisms' tiles (AMD's WMMA and MFMA, Intel's dpas
 * in subgroups of 8 and 16), which no GPU of CI's has: their fragment layouts, subgroup widths
 * (groups of 32 to 256) and the kernel's partial fetch rounds (MFMA's 256 work-items outnumber
 * a slice's chunks). The loads of b are the same code for these four, so each takes one case:
 * b n-major, unaligned, f16 with a bias row, or b k-major, aligned, bf16, several blocks. The
 * small tile keeps PoCL's builds of the emulations short. */
static void gemm_on_every_units_layout(test_ctx *t) {
    static const gemm_case n_major = {.M = 13,
                                      .N = 9,
                                      .K = 21,
                                      .trans_b = true,
                                      .in = CLATTN_F16,
                                      .out = CLATTN_F16,
                                      .matmul = "units:UNIT_M=16,UNIT_N=16",
                                      .biased = true,
                                      .bias = CLATTN_F32},
                           k_major = {.M = 70,
                                      .N = 150,
                                      .K = 40,
                                      .aligned = true,
                                      .in = CLATTN_BF16,
                                      .out = CLATTN_BF16,
                                      .matmul = "units:UNIT_M=16,UNIT_N=16"};
    static const struct {
        int unit, subgroup;
        const gemm_case *g;
    } units[] = {{CLATTN__TILE_WMMA, 32, &n_major},
                 {CLATTN__TILE_MFMA, 64, &k_major},
                 {CLATTN__TILE_DPAS8, 8, &k_major},
                 {CLATTN__TILE_DPAS16, 16, &n_major}};
    if (test_under_uninit_checker())
        return test_skip(t, "the emulated units run without --uninitialized");
    cl_context context = clattn_env_context(t->env);
    const clattn__call call = {
        clattn_env_queue(t->env), context, clattn_env_device(t->env), 0, NULL, NULL};
    const size_t max_group = clattn__device_max_group(call.device);
    int ran = 0;
    for (size_t u = 0; u < sizeof units / sizeof units[0] && !t->failed; ++u) {
        if (max_group < 4 * (size_t)units[u].subgroup) continue;
        ++ran;
        clattn_cache_clear(context);
        clattn__hook_set(CLATTN__HOOK_MATRIX_EMULATION, units[u].unit);
        const gemm_case *g = units[u].g;
        bool takes = false;
        const int status = clattn__gemm_units_available(&call, g->in, 70, 150, 70, 2, &takes);
        if (status != CLATTN_SUCCESS || !takes)
            test_fail_at(t, __FILE__, __LINE__, "tile unit %d, %s: %s, taken %d", units[u].unit,
                         clattn_dtype_name(g->in), clattn_status_name(status), takes);
        else
            check_gemm_case(t, g);
        clattn__hook_set(CLATTN__HOOK_MATRIX_EMULATION, -1);
    }
    clattn_cache_clear(context);
    if (!ran) test_skip(t, "groups capped below every tile's 4 subgroups");
}

/* CLBlast's own failures come back as CLATTN_ERR_BLAS with its code in the message. */
static void gemm_bridge_reports_clblast_codes(test_ctx *t) {
    cl_mem buffer = test_buffer(t, 4096);
    const clattn__call call = {clattn_env_queue(t->env),
                               clattn_env_context(t->env),
                               clattn_env_device(t->env),
                               0,
                               NULL,
                               NULL};
    /* ldc 4 < n 8; two matrices, as gemm_bridge_matches_host, whose CLBlast program (one
     * routine) it reuses: CLBlast builds its program before it checks the arguments */
    const clattn__matrices a = {buffer, 0, 8, 64}, c = {buffer, 512, 4, 64};
    int status = buffer ? clattn__sgemm_batched(&call, true, 8, 8, 8, &a, &a, 0.0f, &c, 2) : 0;
    char message[512];
    snprintf(message, sizeof message, "%s", clattn_last_error());
    if (buffer) clReleaseMemObject(buffer);
    CHECK(t, status == CLATTN_ERR_BLAS, "a row stride below the columns gave %s: %s",
          clattn_status_name(status), message);
    CHECK(t, strstr(message, "returned -1014") != NULL, "no CLBlast code in \"%s\"", message);
}

/* ---- invalid arguments: each refused with its status, *event NULL, nothing enqueued ---- */

typedef struct bad_call {
    clattn_tensor query, key, value, out;
    clattn_mha_params p;
    clattn_mha_options o;
} bad_call;

static int call_bad(test_ctx *t, bad_call *b) {
    cl_event event = (cl_event)&event; /* not NULL: the call must clear it */
    int status = clattn_mha_forward(&b->query, &b->key, &b->value, &b->p, &b->out, &b->o,
                                    clattn_env_queue(t->env), 0, NULL, &event);
    return event == NULL ? status : CLATTN_SUCCESS; /* a set event fails the check below */
}

static void invalid_arguments(test_ctx *t) {
    mha_spec s = cross_spec(2, 5, 6, 24, 2);
    s.kpm = KEEP_MASK, s.weights = 1;
    mha_case c;
    memset(&c, 0, sizeof c);
    make_host(&s, &c);
    make_device(t, &s, &c);
    const bad_call good = {c.t_query,
                           c.t_key,
                           c.t_value,
                           c.t_out,
                           {2, &c.t_w[0], NULL, NULL, NULL, &c.t_bias[0], &c.t_w[3], &c.t_bias[1]},
                           {&c.t_kpm, NULL, 0, &c.t_weights, 1, NULL}};
    bad_call b = good;
    int status[12];
    int n = 0;
    b.p.num_heads = 5, status[n++] = call_bad(t, &b), b = good; /* 5 does not divide 24 */
    b.p.q_proj_weight = &c.t_w[3], status[n++] = call_bad(t, &b), b = good;   /* both forms */
    b.key.shape[1] = 1, status[n++] = call_bad(t, &b), b = good;              /* B disagrees */
    b.o.key_padding_mask = &c.t_out, status[n++] = call_bad(t, &b), b = good; /* kpm shape */
    clattn_tensor lengths = c.t_kpm;
    lengths.dtype = CLATTN_I32, lengths.shape[3] = 1;
    b.o.attn_mask = &lengths, status[n++] = call_bad(t, &b), b = good;     /* i32 mask */
    b.o.average_attn_weights = 0, status[n++] = call_bad(t, &b), b = good; /* weights shape */
    b.out = c.t_query, status[n++] = call_bad(t, &b), b = good;            /* out = query */
    cl_mem small = test_buffer(t, 64);
    b.o.workspace = small, status[n++] = call_bad(t, &b), b = good; /* workspace too small */
    b.value.shape[3] = 23, status[n++] = call_bad(t, &b), b = good; /* packed needs vdim = E */
    status[n++] = clattn_mha_forward(&b.query, &b.key, &b.value, NULL, &b.out, &b.o,
                                     clattn_env_queue(t->env), 0, NULL, NULL);
    const int expected[10] = {CLATTN_ERR_INVALID_ARGUMENT,  CLATTN_ERR_INVALID_ARGUMENT,
                              CLATTN_ERR_SHAPE_MISMATCH,    CLATTN_ERR_SHAPE_MISMATCH,
                              CLATTN_ERR_UNSUPPORTED_DTYPE, CLATTN_ERR_SHAPE_MISMATCH,
                              CLATTN_ERR_ALIASING,          CLATTN_ERR_BUFFER_TOO_SMALL,
                              CLATTN_ERR_SHAPE_MISMATCH,    CLATTN_ERR_INVALID_ARGUMENT};
    float *out = download(t, &c.t_out);
    bool untouched = out != NULL;
    for (int64_t i = 0; out && i < s.B * s.Sq * s.E; ++i) untouched = untouched && out[i] == 0.0f;
    free(out);
    if (small) clReleaseMemObject(small);
    free_case(&c);
    for (int i = 0; i < n; ++i)
        CHECK(t, status[i] == expected[i], "bad call %d gave %s, expected %s", i,
              clattn_status_name(status[i]), clattn_status_name(expected[i]));
    CHECK(t, untouched, "a refused call wrote out");
}

/* One forward with the n-th GEMM from now armed to fail: its status, whether it left its event
 * unset, and the scratch buffers still live once the queue is done (against `baseline`). */
static int forward_failing_at(test_ctx *t, const mha_spec *s, int n, bool *event_unset,
                              long *live) {
    mha_case c;
    memset(&c, 0, sizeof c);
    make_host(s, &c);
    make_device(t, s, &c);
    const long baseline = clattn__scratch_live();
    const clattn_mha_params p = {(int)s->H, NULL,         &c.t_w[0], &c.t_w[1],
                                 &c.t_w[2], &c.t_bias[0], &c.t_w[3], &c.t_bias[1]};
    clattn_mha_options o;
    memset(&o, 0, sizeof o);
    o.weights = &c.t_weights, o.average_attn_weights = 1;
    cl_event event = (cl_event)(uintptr_t)1; /* a failing call must set it to NULL */
    clattn__fault_arm(CLATTN__FAULT_GEMM, n);
    int status = t->failed ? -1
                           : clattn_mha_forward(&c.t_query, &c.t_key, &c.t_value, &p, &c.t_out, &o,
                                                clattn_env_queue(t->env), 0, NULL, &event);
    clattn__fault_arm(CLATTN__FAULT_GEMM, 0);
    *event_unset = status == CLATTN_SUCCESS || event == NULL;
    if (status == CLATTN_SUCCESS && event) clReleaseEvent(event);
    clFinish(clattn_env_queue(t->env));
    *live = test_scratch_left(baseline);
    free_case(&c);
    return status;
}

/* Each GEMM of a forward in turn fails (the fault hook, in the device's GEMM), until one
 * past the last: the call says so, sets its event to NULL, leaks no scratch, and the same
 * forward then runs right on the same queue. Cross-attention with separate weights and the
 * averaged weights: three input projections, the composed attention's GEMMs, the output one. */
static void a_failing_gemm_at_any_step_leaks_nothing(test_ctx *t) {
    if (skip_gemms(t)) return;
    mha_spec s = cross_spec(2, 5, 6, 16, 2);
    s.separate = true, s.weights = 1;
    int step = 1;
    for (;; ++step) {
        bool event_unset = false;
        long live = 0;
        int status = forward_failing_at(t, &s, step, &event_unset, &live);
        CHECK(t, !t->failed && step < 64, "setup failed, or no end to the GEMMs");
        CHECK(t, live == 0, "GEMM %d failing: %ld scratch buffers left live", step, live);
        if (status == CLATTN_SUCCESS) break; /* fewer GEMMs than `step`: every one has failed */
        /* CLBlast's own code, or the failed enqueue of clattn's kernel */
        CHECK(t, status == CLATTN_ERR_BLAS || status == CL_OUT_OF_RESOURCES,
              "GEMM %d failing -> %s", step, clattn_status_name(status));
        CHECK(t, event_unset, "GEMM %d failing: the event was left as it was", step);
    }
    CHECK(t, step > 5, "only %d GEMMs failed: the input projections and the output one at least",
          step - 1);
    check_case(t, &s); /* the queue still runs the same forward, right */
}

static const test_case cases[] = {
    {"self_attention_one_head", self_attention_one_head, TAG_SMOKE},
    {"a_failing_gemm_at_any_step_leaks_nothing", a_failing_gemm_at_any_step_leaks_nothing},
    {"self_attention_u8_masks", self_attention_u8_masks},
    {"self_attention_float_masks_causal", self_attention_float_masks_causal},
    {"cross_attention_separate_weights", cross_attention_separate_weights},
    {"cross_attention_shared_key_value", cross_attention_shared_key_value},
    {"cross_attention_separate_inputs", cross_attention_separate_inputs},
    {"hidden_rows_give_the_bias", hidden_rows_give_the_bias, TAG_SMOKE},
    {"half_storage_and_strided_rows", half_storage_and_strided_rows},
    {"half_storage_on_matrix_units", half_storage_on_matrix_units},
    {"gemm_bridge_matches_host", gemm_bridge_matches_host, TAG_SMOKE},
    {"gemm_kernel_matches_host", gemm_kernel_matches_host, TAG_SMOKE},
    {"f32_forward_on_the_tf32_unit_behind_a_gate", f32_forward_on_the_tf32_unit_behind_a_gate},
    {"gemm_on_matrix_units_matches_host", gemm_on_matrix_units_matches_host},
    {"gemm_on_every_units_layout", gemm_on_every_units_layout},
    {"gemm_bridge_reports_clblast_codes", gemm_bridge_reports_clblast_codes, TAG_SMOKE},
    {"invalid_arguments", invalid_arguments, TAG_HOST | TAG_SMOKE},
};
SUITE(mha_suite, "mha", cases);
