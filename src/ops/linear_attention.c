/*
 * Linear attention (cl/linear_attention.cl): validation, the launch for the device, and the
 * four kernels of a call (phi(k), chunk states, their running sums, the outputs), chained by
 * events; or, for a decoding step of few tokens, the one kernel of the recurrent form.
 */
#include "linear_attention.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Head dims are compile-time sizes of the kernels' private arrays. */
#define LINEAR_MAX_HEAD_DIM 256
/* The non-causal form needs only the total state: it cuts the keys into as few chunks (of
 * LINEAR_MIN_CHUNK to LINEAR_MAX_CHUNK keys) as fill the device with the launch's work-items
 * per compute unit. The cap keeps a chunk's values in cache while every work-item of its group
 * reads them: with one chunk per head, PoCL's time per key doubled from S=1024 to S=8192. */
#define LINEAR_MIN_CHUNK 64
#define LINEAR_MAX_CHUNK 256

typedef clattn__linear_args linear_args;
typedef clattn__linear_launch linear_launch;

static int check_dims(const linear_args *a) {
    return clattn__check_attention_shapes(a->q, a->k, a->v, a->out, LINEAR_MAX_HEAD_DIM);
}

/* Linear attention has no scores: of the mask it takes the lengths and causality only. */
int clattn__linear_check_mask_fields(const clattn_mask *m) {
    if (!m) return CLATTN_SUCCESS;
    const char *field = m->window               ? "window"
                        : m->global_stride != 0 ? "global_stride"
                        : m->softcap != 0.0f    ? "softcap"
                        : m->empty_rows_nan     ? "empty_rows_nan"
                        : m->keep               ? "keep"
                        : m->bias               ? "bias"
                        : m->alibi_slopes       ? "alibi_slopes"
                                                : NULL;
    if (!field) return CLATTN_SUCCESS;
    return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT,
                        "mask.%s: linear attention takes only causal, align, key_lengths and "
                        "query_lengths (it forms no scores to mask)",
                        field);
}

int clattn__linear_check_options(const clattn_linear_options *o, linear_args *a) {
    const clattn_linear_options defaults = CLATTN_LINEAR_OPTIONS_DEFAULT;
    if (!o) o = &defaults;
    if (o->feature_map != CLATTN_FEATURE_ELU1 && o->feature_map != CLATTN_FEATURE_RELU &&
        o->feature_map != CLATTN_FEATURE_IDENTITY)
        return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT, "unknown feature map %d",
                            (int)o->feature_map);
    if (!isfinite(o->eps) || o->eps < 0.0f)
        return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT, "eps = %g: must be finite and >= 0",
                            (double)o->eps);
    a->feature_map = o->feature_map;
    a->eps = o->eps;
    a->workspace = o->workspace;
    return CLATTN_SUCCESS;
}

/* Every tensor of the call, the mask's too (after the mask is checked). */
static void list_tensors(const linear_args *a, clattn__tensor_list *list) {
    *list = (clattn__tensor_list){0};
    clattn__tensor_list_add(list, "q", a->q);
    clattn__tensor_list_add(list, "k", a->k);
    clattn__tensor_list_add(list, "v", a->v);
    clattn__tensor_list_add(list, "out", a->out);
    clattn__tensor_list_add(list, "state", a->state);
    clattn__tensor_list_add(list, "z", a->z);
    clattn__mask_list_tensors(&a->mask, list);
}

/* The step's state: f32 S [B,Hkv,D,Dv] and z {1,B,Hkv,D}, apart from each other and the rest. */
static int check_state(const linear_args *a, cl_context context) {
    const int64_t B = a->k->shape[0], H = a->k->shape[1], D = a->k->shape[3], Dv = a->v->shape[3];
    const unsigned f32 = 1u << CLATTN_F32;
    int status = clattn__check_tensor("state", a->state, context, f32, true);
    if (status == CLATTN_SUCCESS) status = clattn__check_tensor("z", a->z, context, f32, true);
    if (status != CLATTN_SUCCESS) return status;
    if (a->q->shape[2] != a->k->shape[2])
        return clattn__fail(CLATTN_ERR_SHAPE_MISMATCH,
                            "a step takes as many new queries as keys: q has %lld, k %lld",
                            (long long)a->q->shape[2], (long long)a->k->shape[2]);
    const int64_t *s = a->state->shape, *z = a->z->shape;
    if (status == CLATTN_SUCCESS && (s[0] != B || s[1] != H || s[2] != D || s[3] != Dv))
        status = clattn__fail(CLATTN_ERR_SHAPE_MISMATCH,
                              "state must be [B,Hkv,D,Dv] = [%lld,%lld,%lld,%lld]", (long long)B,
                              (long long)H, (long long)D, (long long)Dv);
    if (status == CLATTN_SUCCESS && (z[0] != 1 || z[1] != B || z[2] != H || z[3] != D))
        status =
            clattn__fail(CLATTN_ERR_SHAPE_MISMATCH, "z must be {1,B,Hkv,D} = {1,%lld,%lld,%lld}",
                         (long long)B, (long long)H, (long long)D);
    clattn__tensor_list all;
    list_tensors(a, &all);
    if (status == CLATTN_SUCCESS) status = clattn__check_apart("state", a->state, &all);
    if (status == CLATTN_SUCCESS) status = clattn__check_apart("z", a->z, &all);
    return status;
}

static int check_linear(linear_args *a, const clattn_linear_options *options, cl_context context) {
    const char *names[4] = {"q", "k", "v", "out"};
    const clattn_tensor *views[4] = {a->q, a->k, a->v, a->out};
    int status = clattn__linear_check_options(options, a);
    for (int i = 0; i < 4 && status == CLATTN_SUCCESS; ++i)
        status = clattn__check_tensor(names[i], views[i], context, CLATTN__FLOAT_DTYPES, i == 3);
    if (status == CLATTN_SUCCESS) status = check_dims(a);
    if (status == CLATTN_SUCCESS) status = clattn__linear_check_mask_fields(a->mask_desc);
    if (status == CLATTN_SUCCESS) {
        const int64_t scores[4] = {a->q->shape[0], a->q->shape[1], a->q->shape[2], a->k->shape[2]};
        status = clattn__mask_prepare(a->mask_desc, scores, context, &a->mask);
    }
    clattn__tensor_list inputs = {0};
    for (int i = 0; i < 3; ++i) clattn__tensor_list_add(&inputs, names[i], views[i]);
    if (status == CLATTN_SUCCESS) status = clattn__check_apart("out", a->out, &inputs);
    if (status == CLATTN_SUCCESS) status = clattn__mask_check_output(&a->mask, "out", a->out);
    if (status == CLATTN_SUCCESS && a->step) status = check_state(a, context);
    return status;
}

/* The largest power of two up to 8 that divides `d` and keeps `count` * that many vector
 * accumulators of `width` lanes within 16 (at least 1). */
static int register_tile(int64_t d, int64_t width_dims, int lanes) {
    int64_t vectors = (width_dims + lanes - 1) / lanes;
    int tile = 8;
    while (tile > 1 && (d % tile || tile * vectors > 16)) tile /= 2;
    return tile;
}

size_t clattn__linear_state_floats(const linear_args *a, const linear_launch *l) {
    const size_t slot = (size_t)(a->k->shape[3] * (a->v->shape[3] + 1));
    return (size_t)(a->k->shape[0] * a->k->shape[1]) * (size_t)(l->nchunks + 1) * slot;
}

size_t clattn__linear_phik_floats(const linear_args *a) {
    return (size_t)(a->k->shape[0] * a->k->shape[1] * a->k->shape[2] * a->k->shape[3]);
}

static int64_t ceil_div(int64_t n, int64_t m) {
    return (n + m - 1) / m;
}

/* (launch.h's, for the int64 sizes of a launch plan) */
static int64_t round_up(int64_t n, int64_t m) {
    return (int64_t)clattn__round_up((size_t)n, (size_t)m);
}

/* Bytes of local memory of linear_outputs_tiles (cl/linear_attention.cl): a step of state rows
 * and sums, and phi(q) a step at a time (not causal), or whole rows of it with a step of phi(k)
 * rows and the weights and ends (causal); each array rounded up to a lane vector, as a
 * compiler may align the next. linear_states_tiles' are step x (rows + columns). */
static cl_ulong outputs_tile_bytes(const linear_launch *l, int64_t d) {
    const int64_t step = l->t.TILE_STEP, row = d + l->t.LANES, queries = l->block_queries;
    const int64_t arrays[5] = {step * l->block_cols, step,
                               l->causal ? (queries + step) * row : step * queries,
                               l->causal ? queries * (step + 1) : 0, l->causal ? queries : 0};
    int64_t floats = 0;
    for (int i = 0; i < 5; ++i) floats += round_up(arrays[i], l->t.LANES);
    return (cl_ulong)floats * sizeof(float);
}

/* The tiles' blocks and work-item tile for the head dims (resolved under TILES=0 too, so that
 * the two build one program); causal outputs take fewer queries a group where their phi(q)
 * rows do not fit local memory with 64. Where a step does not fit it (with a margin for the
 * compiler's alignment of the arrays), TILES 0 and blocks of one tile, whose arrays fit any
 * device: a kernel's local arrays over the device's size fail the whole program's build on
 * NVIDIA's and AMD's compilers, the row kernels with it. */
static void pick_tiles(linear_launch *l, cl_device_id device, int64_t d, int64_t dv) {
    const cl_ulong local = clattn__device_local_bytes(device), margin = 64;
    const long lanes = l->t.LANES, rows = l->t.TILE_ROWS;
    l->t.TILE_COLS = round_up(l->t.TILE_COLS, lanes);
    l->t.TILE_STEP = round_up(l->t.TILE_STEP, lanes);
    l->block_rows = (int)round_up(d < l->t.BLOCK ? d : l->t.BLOCK, rows);
    l->block_cols = (int)round_up(dv < l->t.BLOCK ? dv : l->t.BLOCK, l->t.TILE_COLS);
    l->block_queries = (int)round_up(l->t.BLOCK, rows);
    while (l->block_queries > rows && outputs_tile_bytes(l, d) + margin > local)
        l->block_queries = (int)round_up(l->block_queries / 2, rows);
    const cl_ulong states =
        (cl_ulong)l->t.TILE_STEP * (cl_ulong)(l->block_rows + l->block_cols) * sizeof(float);
    if (states + margin > local || outputs_tile_bytes(l, d) + margin > local) {
        l->t.TILES = 0;
        l->t.TILE_STEP = lanes;
        l->block_rows = l->block_queries = (int)rows;
        l->block_cols = (int)l->t.TILE_COLS;
    }
    l->map_keys = l->block_rows % lanes == 0;
}

/* The groups of the tiles' kernels: block rows (or queries) over TILE_ROWS by block columns
 * over TILE_COLS. */
static size_t tile_items(const linear_launch *l, int rows) {
    return (size_t)(rows / l->t.TILE_ROWS) * (size_t)(l->block_cols / l->t.TILE_COLS);
}

/* Work-items of the states of one chunk index, over the batch and heads (the tiles' or the row
 * kernel's). */
static int64_t state_items_per_chunk(const linear_args *a, const linear_launch *l, bool tiles) {
    const int64_t heads = a->k->shape[0] * a->k->shape[1];
    const int64_t d = a->k->shape[3], dv = a->v->shape[3];
    if (!tiles) return heads * (d / l->t.ROWS);
    return heads * ceil_div(d, l->block_rows) * ceil_div(dv, l->block_cols) *
           (int64_t)tile_items(l, l->block_rows);
}

/* Work-items of the outputs (likewise). */
static int64_t output_items(const linear_args *a, const linear_launch *l, bool tiles) {
    const int64_t heads = a->q->shape[0] * a->q->shape[1], Sq = a->q->shape[2];
    if (!tiles) return heads * ceil_div(Sq, l->t.BM);
    return heads * ceil_div(Sq, l->block_queries) * ceil_div(a->v->shape[3], l->block_cols) *
           (int64_t)tile_items(l, l->block_queries);
}

/* Chunks: the causal form's fixed size; the non-causal one as few as fill the device (with the
 * row kernel's work-items, whichever kernel runs: the same chunks, so the same bits). */
static void pick_chunks(linear_launch *l, cl_device_id device, const linear_args *a) {
    const int64_t Sk = a->k->shape[2];
    int64_t chunk = l->t.CHUNK;
    if (!l->causal) {
        const cl_uint units = clattn__device_compute_units(device);
        const int64_t per_chunk = state_items_per_chunk(a, l, false);
        int64_t chunks = ceil_div((int64_t)units * (int64_t)l->t.ITEMS, per_chunk);
        const int64_t most = ceil_div(Sk, LINEAR_MIN_CHUNK);
        const int64_t least = ceil_div(Sk, LINEAR_MAX_CHUNK);
        if (chunks > most) chunks = most;
        if (chunks < least) chunks = least;
        chunk = (Sk + chunks - 1) / chunks;
    }
    if (chunk > Sk) chunk = Sk;
    l->chunk = (int)chunk;
    l->nchunks = (int)((Sk + chunk - 1) / chunk);
}

/* A step's recurrent form: at most RECURRENT tokens, a work-item's values and numerators (a
 * lane vector for each token and for each of the group's STEP_HEADS x STEP_TOKENS queries)
 * within 256 private floats, and phi(k) and phi(q) of the tokens in local memory (with room for
 * the compiler's own). */
static bool pick_recurrent(const linear_launch *l, cl_device_id device, const linear_args *a) {
    const int64_t n = a->k->shape[2], heads = a->q->shape[1] / a->k->shape[1];
    const int64_t floats = (n + heads * n) * a->k->shape[3] + heads * n;
    return a->step && n <= l->t.RECURRENT && (n + heads * n) * l->t.LANES <= 256 &&
           (cl_ulong)floats * sizeof(float) + 256 <= clattn__device_local_bytes(device);
}

/* The launch: the tuning table's row for the device (tuning_table.def says what each row is
 * based on), or the row a test forces, with the lanes narrowed to divide the head dims and
 * ROWS, BM 0 resolved to as many as keep 16 vector accumulators. */
int clattn__linear_pick_launch(cl_device_id device, const linear_args *a, linear_launch *l) {
    *l = (linear_launch){.causal = a->mask.causal != 0};
    const int forced = clattn__hook_value(CLATTN__HOOK_LINEAR_LAUNCH);
    const char *row = forced == CLATTN__LINEAR_GPU ? "type:gpu" : "default";
    int status = forced < 0 ? clattn__linear_attention_tuning_get(device, a->q->dtype, &l->t)
                            : clattn__linear_attention_tuning_row(a->q->dtype, row, &l->t);
    if (status != CLATTN_SUCCESS) return status;
    const int64_t d = a->q->shape[3], dv = a->v->shape[3];
    l->t.LANES = clattn__head_lanes((cl_uint)l->t.LANES, d, dv);
    const int lanes = (int)l->t.LANES;
    if (l->t.ROWS == 0 || d % l->t.ROWS) l->t.ROWS = register_tile(d, dv, lanes);
    if (l->t.BM == 0) l->t.BM = register_tile(4, a->gradients ? d + dv : dv, lanes);
    pick_tiles(l, device, d, dv);
    pick_chunks(l, device, a);
    l->recurrent = pick_recurrent(l, device, a);
    const size_t lane_bytes = (size_t)lanes * sizeof(float);
    l->aligned = clattn__rows_vector_aligned(a->q, a->k, lanes, device) &&
                 clattn__rows_vector_aligned(a->v, a->v, lanes, device) &&
                 (!a->state || clattn__rows_vector_aligned(a->state, a->state, lanes, device)) &&
                 clattn__device_base_align_bytes(device) % lane_bytes == 0;
    return CLATTN_SUCCESS;
}

int clattn__linear_check_launch_size(const linear_args *a, const linear_launch *l) {
    const int64_t B = a->q->shape[0], Hkv = a->k->shape[1];
    const int64_t D = a->q->shape[3], Dv = a->v->shape[3];
    const int64_t scan = B * Hkv * D * Dv, features = B * Hkv * a->k->shape[2];
    const bool tiles = l->t.TILES;
    const int64_t counts[6] = {output_items(a, l, false),
                               output_items(a, l, tiles),
                               l->nchunks * state_items_per_chunk(a, l, false),
                               l->nchunks * state_items_per_chunk(a, l, tiles),
                               scan,
                               features};
    int64_t most = 0;
    for (int i = 0; i < 6; ++i) most = counts[i] > most ? counts[i] : most;
    if (most > 0x7fffffff - 1024) /* rounded up to whole groups, the ids stay below 2^31 */
        return clattn__fail(CLATTN_ERR_DEVICE_LIMIT,
                            "the launch needs %lld work-items; at most 2^31 - 1", (long long)most);
    return CLATTN_SUCCESS;
}

/* Everything a call checks and decides before it enqueues: the launch and the scratch bytes. */
static int plan_linear(linear_args *a, const clattn_linear_options *options,
                       const clattn__call *call, linear_launch *l, size_t *bytes) {
    int status = check_linear(a, options, call->context);
    if (status != CLATTN_SUCCESS) return status;
    status = clattn__linear_pick_launch(call->device, a, l);
    if (status != CLATTN_SUCCESS) return status;
    *bytes = l->recurrent ? 0
                          : (clattn__linear_state_floats(a, l) + clattn__linear_phik_floats(a)) *
                                sizeof(float);
    return clattn__linear_check_launch_size(a, l);
}

static bool linear_needs_wide_index(const linear_args *a, const linear_launch *l) {
    const clattn_tensor *views[6] = {a->q, a->k, a->v, a->out, a->state, a->z};
    return clattn__needs_wide_index(views, 6) || clattn__mask_needs_wide_index(&a->mask) ||
           (!l->recurrent && clattn__linear_state_floats(a, l) + clattn__linear_phik_floats(a) >=
                                 (size_t)clattn__narrow_index_limit());
}

void clattn__linear_options(const linear_args *a, const linear_launch *l, bool wide, char *options,
                            size_t size) {
    snprintf(options, size,
             "-cl-std=CL1.2 -DQ_T=%s -DK_T=%s -DV_T=%s -DO_T=%s -DHEAD_DIM=%lld -DVALUE_DIM=%lld "
             "-DFEATURE=%d -DCAUSAL=%d -DHAS_STATE=%d -DIDX=%s",
             clattn_dtype_name(a->q->dtype), clattn_dtype_name(a->k->dtype),
             clattn_dtype_name(a->v->dtype), clattn_dtype_name(a->out->dtype),
             (long long)a->q->shape[3], (long long)a->v->shape[3], (int)a->feature_map, l->causal,
             a->state != NULL, wide ? "ulong" : "uint");
    clattn__linear_attention_tuning_options(&l->t, options, size);
    const size_t used = strlen(options);
    snprintf(options + used, size - used, " -DBR=%d -DBC=%d -DBQ=%d -DMAP_KEYS=%d -DALIGNED=%d",
             l->block_rows, l->block_cols, l->block_queries, l->map_keys, l->aligned);
    clattn__mask_options(&a->mask, options, size);
}

/* One of the four steps' kernels: its name, work-items and group cap, and whether it reads
 * phi(k) from scratch. */
typedef struct linear_step {
    const char *name;
    size_t items, cap;
    bool reads_phik;
} linear_step;

/* The scratch: the states, then phi(k) at an element offset. */
static int set_scratch_args(cl_kernel kernel, cl_uint *arg, const linear_args *a,
                            const linear_launch *l, cl_mem scratch, bool wide) {
    int status = clattn__set_buffer_arg(kernel, (*arg)++, scratch);
    if (status == CLATTN_SUCCESS) status = clattn__set_buffer_arg(kernel, (*arg)++, scratch);
    if (status == CLATTN_SUCCESS)
        status = clattn__set_idx_arg(kernel, (*arg)++, clattn__linear_state_floats(a, l), wide);
    return status;
}

/* linear_features and linear_states: one argument list */
static int set_key_side_args(cl_kernel kernel, const linear_args *a, const linear_launch *l,
                             cl_mem scratch, bool wide) {
    cl_uint arg = 0;
    int status = clattn__set_view_args(kernel, &arg, a->k, 0, wide);
    if (status == CLATTN_SUCCESS) status = clattn__set_view_args(kernel, &arg, a->v, 0, wide);
    if (status == CLATTN_SUCCESS) status = set_scratch_args(kernel, &arg, a, l, scratch, wide);
    const int64_t ints[5] = {a->k->shape[0], a->k->shape[1], a->k->shape[2], l->chunk, l->nchunks};
    if (status == CLATTN_SUCCESS) status = clattn__set_int_args(kernel, &arg, ints, 5);
    if (status == CLATTN_SUCCESS)
        status = clattn__mask_set_args(kernel, &arg, &a->mask, 1.0f, wide);
    return status;
}

static int set_scan_args(cl_kernel kernel, const linear_args *a, const linear_launch *l,
                         cl_mem scratch, bool wide) {
    cl_uint arg = 0;
    const int64_t ints[2] = {a->k->shape[0] * a->k->shape[1], l->nchunks};
    int status = clattn__set_buffer_arg(kernel, arg++, scratch);
    if (status == CLATTN_SUCCESS) status = clattn__set_int_args(kernel, &arg, ints, 2);
    if (status == CLATTN_SUCCESS && a->state)
        status = clattn__set_view_args(kernel, &arg, a->state, 0, wide);
    if (status == CLATTN_SUCCESS && a->state)
        status = clattn__set_view_args(kernel, &arg, a->z, 1, wide);
    const int64_t heads = a->k->shape[1];
    if (status == CLATTN_SUCCESS && a->state)
        status = clattn__set_int_args(kernel, &arg, &heads, 1);
    return status;
}

static int set_outputs_args(cl_kernel kernel, const linear_args *a, const linear_launch *l,
                            cl_mem scratch, bool wide) {
    cl_uint arg = 0;
    const clattn_tensor *views[4] = {a->q, a->k, a->v, a->out};
    int status = clattn__set_views_args(kernel, &arg, views, 4, wide);
    if (status == CLATTN_SUCCESS) status = set_scratch_args(kernel, &arg, a, l, scratch, wide);
    const int64_t ints[7] = {a->q->shape[0], a->q->shape[1], a->k->shape[1], a->q->shape[2],
                             a->k->shape[2], l->chunk,       l->nchunks};
    if (status == CLATTN_SUCCESS) status = clattn__set_int_args(kernel, &arg, ints, 7);
    if (status == CLATTN_SUCCESS) status = clattn__set_float_arg(kernel, arg++, a->eps);
    if (status == CLATTN_SUCCESS)
        status = clattn__mask_set_args(kernel, &arg, &a->mask, 1.0f, wide);
    return status;
}

static int set_step_args(cl_kernel kernel, int step, const linear_args *a, const linear_launch *l,
                         cl_mem scratch, bool wide) {
    switch (step) {
    case 0:
    case 1:
        return set_key_side_args(kernel, a, l, scratch, wide);
    case 2:
        return set_scan_args(kernel, a, l, scratch, wide);
    default:
        return set_outputs_args(kernel, a, l, scratch, wide);
    }
}

/* The row kernels of the four steps, and the tiles' kernels where the launch takes them (a
 * NULL name where it does not). */
static void list_steps(const linear_args *a, const linear_launch *l, linear_step rows[4],
                       linear_step tiles[4]) {
    const int64_t B = a->k->shape[0], Hkv = a->k->shape[1], D = a->k->shape[3];
    const int64_t Sk = a->k->shape[2];
    const size_t group = (size_t)l->t.GROUP;
    /* phi(k) goes to scratch first, in vectors, for the row kernels: the states read it (a
     * scalar feature map per element there cost more than the FMAs it fed), and when causal
     * the products within chunks too */
    rows[0] = (linear_step){"linear_features", (size_t)(B * Hkv * Sk), group, false};
    rows[1] = (linear_step){"linear_states",
                            (size_t)(l->nchunks * state_items_per_chunk(a, l, false)), group, true};
    rows[2] = (linear_step){"linear_scan", (size_t)(B * Hkv * D * (a->v->shape[3] / l->t.LANES)),
                            64, false};
    rows[3] = (linear_step){"linear_outputs", (size_t)output_items(a, l, false), group, l->causal};
    for (int i = 0; i < 4; ++i) tiles[i] = (linear_step){NULL, 0, 0, false};
    if (!l->t.TILES) return;
    tiles[1] = (linear_step){"linear_states_tiles",
                             (size_t)(l->nchunks * state_items_per_chunk(a, l, true)),
                             tile_items(l, l->block_rows), !l->map_keys};
    /* a block's queries fetch and weigh BLOCK queries: a call with fewer (a decoding step)
     * keeps the row kernel */
    if (a->q->shape[2] >= l->block_queries)
        tiles[3] = (linear_step){"linear_outputs_tiles", (size_t)output_items(a, l, true),
                                 tile_items(l, l->block_queries), l->causal && !l->map_keys};
}

/* The tiles' kernel of a step, or (where the launch takes none, or the compiler cannot run its
 * group: registers) the row kernel. */
static int create_step(const clattn__call *call, const char *op_file, const char *options,
                       const linear_step *tiles, const linear_step *rows, cl_kernel *kernel,
                       linear_step *taken) {
    *taken = *rows;
    if (tiles->name) {
        size_t most = 0;
        int status = clattn__create_kernel(call->context, call->device, op_file, options,
                                           tiles->name, kernel);
        if (status == CLATTN_SUCCESS)
            status = clattn__kernel_max_group(*kernel, call->device, &most);
        if (status != CLATTN_SUCCESS || most >= tiles->cap) {
            *taken = *tiles;
            return status;
        }
        clattn__release_kernel(*kernel);
        *kernel = NULL;
    }
    return clattn__create_kernel(call->context, call->device, op_file, options, rows->name, kernel);
}

int clattn__linear_prepare_steps(const linear_args *a, const linear_launch *l,
                                 const clattn__call *call, cl_mem scratch, bool wide,
                                 const char *op_file, const char *options, int count,
                                 bool keep_phik, cl_kernel *kernels, size_t *items, size_t *caps) {
    linear_step rows[4], tiles[4];
    list_steps(a, l, rows, tiles);
    int status = CLATTN_SUCCESS;
    bool phik_read = keep_phik;
    /* phi(k)'s step last: whether it runs depends on the kernels the others take */
    for (int n = 1; n <= count && status == CLATTN_SUCCESS; ++n) {
        const int i = n % count;
        items[i] = caps[i] = 0;
        if (i == 0 && !phik_read) continue;
        linear_step taken;
        status = create_step(call, op_file, options, &tiles[i], &rows[i], &kernels[i], &taken);
        items[i] = taken.items, caps[i] = taken.cap;
        phik_read = phik_read || taken.reads_phik;
        if (status == CLATTN_SUCCESS) status = set_step_args(kernels[i], i, a, l, scratch, wide);
    }
    return status;
}

/* The kernels, each after the one before; the call's event is the last one's. All of them are
 * built and given their arguments before the first is enqueued, so that a build failure or a
 * bad argument enqueues nothing (and a step leaves the caller's state as it was). */
static int enqueue_linear(const linear_args *a, const linear_launch *l, const clattn__call *call,
                          cl_mem scratch) {
    const bool wide = linear_needs_wide_index(a, l);
    char options[1024];
    clattn__linear_options(a, l, wide, options, sizeof options);
    cl_kernel kernels[4] = {NULL, NULL, NULL, NULL};
    size_t items[4], caps[4];
    int status = clattn__linear_prepare_steps(a, l, call, scratch, wide, "linear_attention.cl",
                                              options, 4, false, kernels, items, caps);
    cl_event prev = NULL;
    for (int i = 0; i < 4 && status == CLATTN_SUCCESS; ++i)
        if (kernels[i])
            status = clattn__enqueue_items(call, kernels[i], items[i], caps[i], &prev, i == 3);
    if (prev) clReleaseEvent(prev);
    for (int i = 0; i < 4; ++i) clattn__release_kernel(kernels[i]);
    return status;
}

static int set_recurrence_args(cl_kernel kernel, const linear_args *a, bool wide) {
    cl_uint arg = 0;
    const clattn_tensor *views[5] = {a->q, a->k, a->v, a->out, a->state};
    int status = clattn__set_views_args(kernel, &arg, views, 5, wide);
    if (status == CLATTN_SUCCESS) status = clattn__set_view_args(kernel, &arg, a->z, 1, wide);
    const int64_t heads = a->k->shape[1];
    if (status == CLATTN_SUCCESS) status = clattn__set_int_args(kernel, &arg, &heads, 1);
    if (status == CLATTN_SUCCESS) status = clattn__set_float_arg(kernel, arg++, a->eps);
    if (status == CLATTN_SUCCESS)
        status = clattn__mask_set_args(kernel, &arg, &a->mask, 1.0f, wide);
    return status;
}

/* A step's recurrent form (cl/linear_attention.cl, linear_recurrence): a group per (batch, kv
 * head), its work-items over the value columns' lane vectors, built for the step's tokens and
 * query heads. */
static int enqueue_recurrence(const linear_args *a, const linear_launch *l,
                              const clattn__call *call) {
    const bool wide = linear_needs_wide_index(a, l);
    char options[1024];
    clattn__linear_options(a, l, wide, options, sizeof options);
    const size_t used = strlen(options);
    snprintf(options + used, sizeof options - used, " -DSTEP_TOKENS=%lld -DSTEP_HEADS=%lld",
             (long long)a->k->shape[2], (long long)(a->q->shape[1] / a->k->shape[1]));
    cl_kernel kernel = NULL;
    int status = clattn__create_kernel(call->context, call->device, "linear_attention.cl", options,
                                       "linear_recurrence", &kernel);
    if (status == CLATTN_SUCCESS) status = set_recurrence_args(kernel, a, wide);
    size_t local = 1;
    if (status == CLATTN_SUCCESS) status = clattn__kernel_max_group(kernel, call->device, &local);
    const size_t columns = (size_t)(a->v->shape[3] / l->t.LANES), cap = (size_t)l->t.GROUP;
    local = local < cap ? local : cap;
    local = local < columns ? local : columns;
    const size_t groups = (size_t)(a->k->shape[0] * a->k->shape[1]);
    cl_event prev = NULL;
    if (status == CLATTN_SUCCESS)
        status = clattn__enqueue_link(call, kernel, groups * local, local, &prev, true);
    if (prev) clReleaseEvent(prev);
    clattn__release_kernel(kernel);
    return status;
}

/* The caller's workspace, checked against every tensor of the call, or a fresh one. */
static int get_workspace(const linear_args *a, size_t bytes, cl_context context, cl_mem *workspace,
                         bool *owned) {
    clattn__tensor_list tensors;
    list_tensors(a, &tensors);
    return clattn__get_workspace(a->workspace, bytes, context, &tensors, workspace, owned);
}

static int run_linear(linear_args *a, const clattn_linear_options *options, cl_command_queue queue,
                      cl_uint num_wait, const cl_event *wait_list, cl_event *event) {
    clattn__call call;
    linear_launch launch;
    size_t bytes = 0;
    int status = clattn__begin_call(&call, queue, num_wait, wait_list, event);
    if (status == CLATTN_SUCCESS) status = plan_linear(a, options, &call, &launch, &bytes);
    cl_mem scratch = NULL;
    bool owned = false;
    if (status == CLATTN_SUCCESS) status = get_workspace(a, bytes, call.context, &scratch, &owned);
    if (status == CLATTN_SUCCESS)
        status = launch.recurrent ? enqueue_recurrence(a, &launch, &call)
                                  : enqueue_linear(a, &launch, &call, scratch);
    if (owned && scratch) clReleaseMemObject(scratch);
    return status;
}

int clattn_linear_attention(const clattn_tensor *q, const clattn_tensor *k, const clattn_tensor *v,
                            const clattn_mask *mask, const clattn_tensor *out,
                            const clattn_linear_options *options, cl_command_queue queue,
                            cl_uint num_wait, const cl_event *wait_list, cl_event *event) {
    linear_args a = {.q = q, .k = k, .v = v, .out = out, .mask_desc = mask};
    return run_linear(&a, options, queue, num_wait, wait_list, event);
}

int clattn_linear_attention_step(const clattn_tensor *q, const clattn_tensor *k,
                                 const clattn_tensor *v, const clattn_tensor *lengths,
                                 const clattn_tensor *state, const clattn_tensor *z,
                                 const clattn_tensor *out, const clattn_linear_options *options,
                                 cl_command_queue queue, cl_uint num_wait,
                                 const cl_event *wait_list, cl_event *event) {
    clattn_mask mask;
    memset(&mask, 0, sizeof mask);
    mask.causal = 1;
    mask.key_lengths = mask.query_lengths = lengths;
    linear_args a = {.q = q,
                     .k = k,
                     .v = v,
                     .out = out,
                     .state = state,
                     .z = z,
                     .step = true,
                     .mask_desc = &mask};
    return run_linear(&a, options, queue, num_wait, wait_list, event);
}

int clattn_linear_attention_workspace_size(const clattn_tensor *q, const clattn_tensor *k,
                                           const clattn_tensor *v, const clattn_mask *mask,
                                           const clattn_tensor *out,
                                           const clattn_linear_options *options,
                                           cl_command_queue queue, size_t *bytes) {
    clattn__call call;
    linear_args a = {.q = q, .k = k, .v = v, .out = out, .mask_desc = mask};
    linear_launch launch;
    size_t need = 0;
    int status = clattn__begin_call(&call, queue, 0, NULL, NULL);
    if (status == CLATTN_SUCCESS && !bytes)
        status = clattn__fail(CLATTN_ERR_INVALID_ARGUMENT, "bytes is NULL");
    if (status == CLATTN_SUCCESS) status = plan_linear(&a, options, &call, &launch, &need);
    if (status == CLATTN_SUCCESS) *bytes = need;
    return status;
}
