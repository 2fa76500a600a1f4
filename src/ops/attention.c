/*
 * Fused scaled-dot-product attention (cl/attention.cl). This file validates, picks the launch
 * for the device, and enqueues.
 */
#include "attention.h"
#include "softmax.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Head dims are compile-time sizes of the kernel's private arrays. */
#define CLATTN_MAX_HEAD_DIM 256

/* The launch of the fused kernel: the tuning table's row for the device
 * (src/runtime/tuning_table.def says what each row is based on): the variant for prefill and for
 * decoding (Sq <= KEYS_MAX_QUERIES), head-dim lanes, the group size, the largest key tile (TK,
 * halved until two K/V tiles fit half the local memory), and when to split the keys (fewer than
 * SPLIT_TARGET groups per compute unit: chunks of at least SPLIT_MIN keys; the merge kernel
 * combines them). attention_keys always takes groups of 128 (its KEYS_GROUP) and chunks of at most
 * 1024 keys; attention_blocks runs the table's BM queries per work-item against BN-key tiles. */
#define ATTENTION_KEYS_SIZE  128  /* = KEYS_GROUP in cl/attention.cl */
#define ATTENTION_KEYS_CHUNK 1024 /* = KEYS_CHUNK */
#define KEYS_MAX_QUERIES     8
#define ATTENTION_MMA_WARPS  4 /* attention_mma and attention_units: MMA_WARPS subgroups a group */
#define ATTENTION_MMA_FEWEST 2 /* attention_mma's where 4 do not fit */
#define ATTENTION_SPLIT_MAX  128

typedef clattn__attention_launch attention_launch;

typedef clattn__attention_args attention_args;

static int check_dims(const attention_args *a) {
    const int64_t *q = a->q->shape;
    int status = clattn__check_attention_shapes(a->q, a->k, a->v, a->out, CLATTN_MAX_HEAD_DIM);
    if (status != CLATTN_SUCCESS) return status;
    if (q[0] * q[1] * q[2] > 0x7fffffff)
        return clattn__fail(CLATTN_ERR_DEVICE_LIMIT, "B*Hq*Sq exceeds INT_MAX");
    return CLATTN_SUCCESS;
}

/* Every tensor of the call, the mask's too (after the mask is checked). */
static void list_tensors(const attention_args *a, clattn__tensor_list *list) {
    *list = (clattn__tensor_list){0};
    clattn__tensor_list_add(list, "q", a->q);
    clattn__tensor_list_add(list, "k", a->k);
    clattn__tensor_list_add(list, "v", a->v);
    clattn__tensor_list_add(list, "out", a->out);
    clattn__tensor_list_add(list, "lse", a->lse);
    clattn__tensor_list_add(list, "weights", a->weights);
    clattn__mask_list_tensors(&a->mask, list);
}

/* The optional [B,Hq,Sq,Sk] weights output: its own view, apart from every other tensor. */
static int check_weights(const attention_args *a, const int64_t scores[4], cl_context context) {
    const clattn_tensor *w = a->weights;
    int status = clattn__check_tensor("weights", w, context, CLATTN__FLOAT_DTYPES, true);
    for (int i = 0; i < 4 && status == CLATTN_SUCCESS; ++i)
        if (w->shape[i] != scores[i])
            status = clattn__fail(CLATTN_ERR_SHAPE_MISMATCH,
                                  "weights must be [B,Hq,Sq,Sk] = [%lld,%lld,%lld,%lld]",
                                  (long long)scores[0], (long long)scores[1], (long long)scores[2],
                                  (long long)scores[3]);
    clattn__tensor_list all;
    list_tensors(a, &all);
    if (status == CLATTN_SUCCESS) status = clattn__check_apart("weights", w, &all);
    return status;
}

static int check_attention(attention_args *a, const clattn_mask *mask, cl_context context) {
    const char *names[4] = {"q", "k", "v", "out"};
    const clattn_tensor *views[4] = {a->q, a->k, a->v, a->out};
    int status = CLATTN_SUCCESS;
    for (int i = 0; i < 4 && status == CLATTN_SUCCESS; ++i)
        status = clattn__check_tensor(names[i], views[i], context, CLATTN__FLOAT_DTYPES, i == 3);
    if (status == CLATTN_SUCCESS) status = check_dims(a);
    if (status != CLATTN_SUCCESS) return status; /* the views below need q and k */
    const int64_t scores[4] = {a->q->shape[0], a->q->shape[1], a->q->shape[2], a->k->shape[2]};
    status = clattn__mask_prepare(mask, scores, context, &a->mask);
    clattn__tensor_list inputs = {0};
    for (int i = 0; i < 3; ++i) clattn__tensor_list_add(&inputs, names[i], views[i]);
    if (status == CLATTN_SUCCESS) status = clattn__check_apart("out", a->out, &inputs);
    if (status == CLATTN_SUCCESS) status = clattn__mask_check_output(&a->mask, "out", a->out);
    clattn__tensor_list_add(&inputs, "out", a->out);
    if (status == CLATTN_SUCCESS && a->lse)
        status = clattn__mask_check_lse(&a->mask, a->lse, scores, &inputs, context);
    if (status == CLATTN_SUCCESS && a->weights) status = check_weights(a, scores, context);
    return status;
}

static bool attention_needs_wide_index(const attention_args *a) {
    const clattn_tensor *views[5] = {a->q, a->k, a->v, a->out, a->lse};
    return clattn__needs_wide_index(views, 5) || clattn__mask_needs_wide_index(&a->mask);
}

/* Floats of scratch the split launch's partial results take (0: unsplit). */
static size_t partial_floats(const attention_args *a, const attention_launch *l) {
    if (l->splits <= 1) return 0;
    return (size_t)(a->q->shape[0] * a->q->shape[1] * a->q->shape[2]) * (size_t)l->splits *
           (size_t)(a->v->shape[3] + 2);
}

/* Floats of scratch K packed d-major in tiles of LANES keys takes (the lanes variant; 0 for the
 * others). It follows the partials in the workspace. */
static size_t packed_key_floats(const attention_args *a, const attention_launch *l) {
    if (l->variant != CLATTN__ATTENTION_LANES) return 0;
    return (size_t)(a->k->shape[0] * a->k->shape[1]) *
           clattn__round_up((size_t)a->k->shape[2], (size_t)l->t.LANES) * (size_t)a->k->shape[3];
}

/* The variants that launch a group per query block of a (batch, head), whose order
 * (attention_launch's) the kernel takes. */
static bool groups_by_block(int variant) {
    return variant == CLATTN__ATTENTION_TILES || variant == CLATTN__ATTENTION_MICRO ||
           variant == CLATTN__ATTENTION_MMA || variant == CLATTN__ATTENTION_UNITS;
}

/* Groups a compute unit is taken to run at once, for the least section below: the H200 ran
 * attention_mma's groups 2 to 4 a multiprocessor (its registers and local memory). */
#define LPT_GROUPS_A_UNIT 4

/* The queries a group takes, as planned (tiles' and micro's group may shrink at the launch to
 * what the built kernel allows: an estimate there). */
static int64_t queries_a_group(const attention_launch *l) {
    switch (l->variant) {
    case CLATTN__ATTENTION_KEYS:
        return 1;
    case CLATTN__ATTENTION_TILES:
        return l->t.GROUP;
    case CLATTN__ATTENTION_MICRO:
        return (int64_t)l->rows * l->t.MQ;
    case CLATTN__ATTENTION_MMA:
    case CLATTN__ATTENTION_UNITS:
        return l->t.UNIT_QUERIES * l->warps;
    default:
        return l->t.BM * (int64_t)l->t.GROUP;
    }
}

int clattn__attention_order(const clattn_tensor *q, const clattn_tensor *k, const clattn_tensor *v,
                            bool causal, const clattn__attention_tuning *t, int64_t blocks,
                            cl_device_id device) {
    const uint64_t heads = (uint64_t)(q->shape[0] * q->shape[1]);
    const int forced = clattn__hook_value(CLATTN__HOOK_ATTENTION_ORDER);
    if (forced >= 0) return (int)((uint64_t)forced < heads ? (uint64_t)forced : heads);
    if (!t->LPT || !causal) return 0;
    const uint64_t sharing = (uint64_t)(q->shape[1] / k->shape[1]);
    const uint64_t kv_bytes =
        (uint64_t)k->shape[2] * ((uint64_t)k->shape[3] * clattn_dtype_size(k->dtype) +
                                 (uint64_t)v->shape[3] * clattn_dtype_size(v->dtype));
    const uint64_t cache =
        t->LPT_MB ? (uint64_t)t->LPT_MB << 20 : (uint64_t)clattn__device_cache_bytes(device);
    uint64_t order = cache && kv_bytes ? cache / kv_bytes * sharing : heads;
    const uint64_t wave = (uint64_t)clattn__device_compute_units(device) * LPT_GROUPS_A_UNIT;
    const uint64_t launch_blocks = blocks > 0 ? (uint64_t)blocks : 1;
    if (order * launch_blocks < wave) order = (wave + launch_blocks - 1) / launch_blocks;
    return (int)(order < heads ? order : heads); /* (at least 1) */
}

/* The order of the variants that launch a group per query block; 0 for the others. */
static int block_order(const attention_args *a, const attention_launch *l, cl_device_id device) {
    if (!groups_by_block(l->variant)) return 0;
    const int64_t queries = queries_a_group(l), sq = a->q->shape[2];
    return clattn__attention_order(a->q, a->k, a->v, a->mask.causal, &l->t,
                                   queries ? (sq + queries - 1) / queries : 1, device);
}

static int set_attention_args(cl_kernel kernel, const attention_args *a, bool wide,
                              const attention_launch *l, cl_mem workspace) {
    cl_uint arg = 0;
    const clattn_tensor *views[4] = {a->q, a->k, a->v, a->out};
    int status = clattn__set_views_args(kernel, &arg, views, 4, wide);
    const int64_t dims[5] = {a->q->shape[0], a->q->shape[1], a->k->shape[1], a->q->shape[2],
                             a->k->shape[2]};
    if (status == CLATTN_SUCCESS) status = clattn__set_int_args(kernel, &arg, dims, 5);
    if (status == CLATTN_SUCCESS && groups_by_block(l->variant))
        status = clattn__set_int_arg(kernel, arg++, l->order);
    if (status == CLATTN_SUCCESS && a->lse)
        status = clattn__set_view_args(kernel, &arg, a->lse, 1, wide);
    if (status == CLATTN_SUCCESS && l->splits > 1)
        status = clattn__set_buffer_arg(kernel, arg++, workspace);
    const int64_t splits[2] = {l->chunk, l->splits};
    if (status == CLATTN_SUCCESS && l->splits > 1)
        status = clattn__set_int_args(kernel, &arg, splits, 2);
    if (status == CLATTN_SUCCESS && l->variant == CLATTN__ATTENTION_LANES)
        status = clattn__set_buffer_arg(kernel, arg++, workspace);
    if (status == CLATTN_SUCCESS && l->variant == CLATTN__ATTENTION_LANES)
        status = clattn__set_idx_arg(kernel, arg++, partial_floats(a, l), wide);
    if (status == CLATTN_SUCCESS)
        status = clattn__mask_set_args(kernel, &arg, &a->mask, a->scale, wide);
    return status;
}

/* Splits the keys when the launch has too few groups to fill the device (a few queries against
 * a long KV cache): chunks of at least SPLIT_MIN_CHUNK keys, whole 32-key tiles. */
static void pick_splits(attention_launch *l, cl_device_id device, const attention_args *a) {
    const cl_uint units = clattn__device_compute_units(device);
    const int64_t Sk = a->k->shape[2];
    const int64_t per = queries_a_group(l);
    const int64_t groups = a->q->shape[0] * a->q->shape[1] * ((a->q->shape[2] + per - 1) / per);
    const int64_t want = ((int64_t)units * l->t.SPLIT_TARGET + groups - 1) / groups;
    int64_t splits = want < Sk / l->t.SPLIT_MIN ? want : Sk / l->t.SPLIT_MIN;
    if (splits > ATTENTION_SPLIT_MAX) splits = ATTENTION_SPLIT_MAX;
    const int forced = clattn__hook_value(CLATTN__HOOK_ATTENTION_SPLITS);
    if (forced > 0) splits = forced < Sk ? forced : Sk;
    const int64_t fewest = (Sk + ATTENTION_KEYS_CHUNK - 1) / ATTENTION_KEYS_CHUNK;
    if (l->variant == CLATTN__ATTENTION_KEYS && splits < fewest) splits = fewest;
    l->splits = 1, l->chunk = (int)Sk;
    if (splits < 2) return;
    int64_t chunk = (Sk + splits - 1) / splits;
    if (forced <= 0) chunk = (chunk + 31) / 32 * 32;
    l->chunk = (int)chunk;
    l->splits = (int)((Sk + chunk - 1) / chunk);
}

/* Bytes of local memory attention_micro declares for `rows` rows of work-items: the block's
 * queries, a K and a V tile, the tile's weights and a row's partials (cl/attention.cl). */
static uint64_t micro_local_bytes(const attention_launch *l, int rows, int64_t d, int64_t dv) {
    const uint64_t bq = (uint64_t)rows * (uint64_t)l->t.MQ, tk = (uint64_t)l->t.TK;
    const uint64_t cols = tk / (uint64_t)l->t.MK;
    return 4 * (d * bq + d * tk + tk * dv + tk * bq + cols * bq) + 12;
}

/* attention_micro's grid: TK / MK work-items along the keys (TK halved, MK with it when TK
 * falls below it, until they fit the device's group), as many rows as GROUP allows, then rows
 * and TK halved until the local arrays fit the device's local memory. */
static void fit_micro(attention_launch *l, cl_device_id device, int64_t d, int64_t dv,
                      cl_ulong local_bytes) {
    size_t limit = clattn__device_max_group(device);
    if ((size_t)l->t.GROUP < limit) limit = (size_t)l->t.GROUP;
    if (l->t.MK > l->t.TK) l->t.MK = l->t.TK;
    while ((size_t)(l->t.TK / l->t.MK) > limit && l->t.TK > 1) {
        l->t.TK /= 2;
        if (l->t.MK > l->t.TK) l->t.MK = l->t.TK;
    }
    int rows = (int)(limit / (size_t)(l->t.TK / l->t.MK));
    if (rows < 1) rows = 1;
    while (micro_local_bytes(l, rows, d, dv) > local_bytes && (rows > 1 || l->t.TK > l->t.MK)) {
        if (rows > 1)
            rows /= 2;
        else
            l->t.TK /= 2;
    }
    l->rows = rows;
}

/* cl/attention.cl's MMA_STRIDE: 32-bit words a staged K or V row of n values of `bytes` (2, or 4
 * for f32's 3xTF32, n a multiple of 8) takes. */
static uint64_t mma_stride(int64_t n, size_t bytes) {
    return bytes == 4 ? (uint64_t)n / 8 * 8 + 4 : (uint64_t)(n / 2 + 31) / 32 * 32 + 4;
}

/* Bytes of local memory attention_mma declares (cl/attention.cl) with key tiles of `keys` and
 * `queries` a warp, `buffers` of them (2: UNIT_ASYNC), values of `bytes`, `warps` a group: the
 * padded K and V tiles, the group's q rows, the weights' flags, its emulation's scratch and
 * exchanges (taken as the larger, the emulation's), the span and the flags. */
static uint64_t mma_local_bytes(int64_t d, int64_t dv, int64_t keys, int64_t queries, int buffers,
                                size_t bytes, int warps_a_group) {
    const uint64_t warps = (uint64_t)warps_a_group, n = (uint64_t)keys;
    return (uint64_t)buffers * n * (mma_stride(d, bytes) + mma_stride(dv, bytes)) * 4 +
           warps * (uint64_t)queries * (mma_stride(d, bytes) * 4 + n) +
           warps * (16 * 16 + 16 * 8 + 16 * 4) * 4 + 20;
}

/* Bytes of local memory attention_units declares with key tiles of `keys` on `tile` (native or
 * emulated): K and V tiles and the group's q rows as attention_mma's, then per subgroup its
 * scores, the parts' maxima, its weights, its rows' rescales and sums, the weights' flags and
 * the products' scratch; the span and the flags. */
static uint64_t units_local_bytes(int64_t d, int64_t dv, int64_t keys, const clattn__tile *tile,
                                  bool emulated) {
    const uint64_t n = (uint64_t)keys, sg = (uint64_t)tile->subgroup;
    const uint64_t parts = sg > 16 ? sg / 16 : 1;
    const uint64_t per_subgroup = 16 * (n + 1) * 4 + 16 * parts * 4 + 16 * (n + 8) * 2 +
                                  2 * 16 * 4 + 16 * n +
                                  clattn__tile_scratch_floats(tile, emulated) * 4;
    return n * (mma_stride(d, 2) + mma_stride(dv, 2)) * 4 +
           16 * ATTENTION_MMA_WARPS * mma_stride(d, 2) * 4 + ATTENTION_MMA_WARPS * per_subgroup +
           16;
}

/* The variant runs on cl/mma.cl's products: attention_mma or attention_units. */
static bool on_matrix_tiles(int variant) {
    return variant == CLATTN__ATTENTION_MMA || variant == CLATTN__ATTENTION_UNITS;
}

/* Bytes of local memory the launch's matrix-unit variant declares with key tiles of `keys` and
 * `queries` a warp (attention_units: always 16), its tiles double-buffered or not (async). */
static uint64_t tiles_local_bytes(const attention_args *a, const attention_launch *l, int64_t keys,
                                  int64_t queries, bool async) {
    const int64_t d = a->q->shape[3], dv = a->v->shape[3];
    return l->variant == CLATTN__ATTENTION_MMA
               ? mma_local_bytes(d, dv, keys, queries, async ? 2 : 1,
                                 clattn_dtype_size(a->q->dtype), l->warps)
               : units_local_bytes(d, dv, keys, &l->tile, !l->on_unit);
}

/* attention_mma (`mma`) and attention_units take q, k and v of one 16-bit dtype, attention_mma
 * f32 too (3xTF32), and head dims of whole tiles (along the products' k, 16, 8 for tf32; along
 * their n, mma's 8, units' 16). */
static bool units_dtypes_take(const attention_args *a, bool mma) {
    const clattn_dtype dt = a->q->dtype;
    const bool f32 = dt == CLATTN_F32 && mma;
    return (dt == CLATTN_F16 || dt == CLATTN_BF16 || f32) && a->k->dtype == dt &&
           a->v->dtype == dt && a->q->shape[3] % (f32 ? 8 : 16) == 0 &&
           a->v->shape[3] % (mma ? 8 : 16) == 0;
}

/* The group and local arrays (key tiles of 16) fit the device: attention_mma's warps of 32,
 * attention_units' subgroups of the tile's, l->warps of them. */
static bool units_fit(const attention_args *a, const attention_launch *l, cl_device_id device) {
    const bool mma = l->variant == CLATTN__ATTENTION_MMA;
    const size_t group = (size_t)l->warps * (size_t)(mma ? 32 : l->tile.subgroup);
    return clattn__device_max_group(device) >= group &&
           tiles_local_bytes(a, l, 16, 16, false) <= clattn__device_local_bytes(device);
}

/* Groups of 4 subgroups, or attention_mma's of 2 where the local arrays of 4 do not fit (f32 at
 * D=128 in 48 KiB: the group's q rows take 33 KiB): half the queries a group, the same kernel.
 * Whether either fits. */
static bool fit_warps(const attention_args *a, attention_launch *l, cl_device_id device) {
    l->warps = ATTENTION_MMA_WARPS;
    if (units_fit(a, l, device)) return true;
    if (l->variant != CLATTN__ATTENTION_MMA) return false;
    l->warps = ATTENTION_MMA_FEWEST;
    return units_fit(a, l, device);
}

/* Key tiles of UNIT_KEYS (a multiple of 16) and UNIT_QUERIES a warp (mma: 16 or 32; units: 16),
 * lowered until the local arrays fit (units_fit checked 16 and 16); then double-buffered
 * (UNIT_ASYNC, attention_mma) where two such tiles fit: the tiles' size comes first. */
static void fit_unit_tiles(const attention_args *a, attention_launch *l, cl_ulong local_bytes) {
    l->t.UNIT_KEYS = l->t.UNIT_KEYS / 16 * 16;
    l->t.UNIT_QUERIES = l->variant == CLATTN__ATTENTION_MMA ? l->t.UNIT_QUERIES / 16 * 16 : 16;
    /* a warp's 16 queries before fewer keys: the key tiles are what each barrier amortizes */
    if (tiles_local_bytes(a, l, l->t.UNIT_KEYS, l->t.UNIT_QUERIES, false) > local_bytes)
        l->t.UNIT_QUERIES = 16;
    while (l->t.UNIT_KEYS > 16 &&
           tiles_local_bytes(a, l, l->t.UNIT_KEYS, l->t.UNIT_QUERIES, false) > local_bytes)
        l->t.UNIT_KEYS -= 16;
    l->async = l->variant == CLATTN__ATTENTION_MMA && l->t.UNIT_ASYNC &&
               tiles_local_bytes(a, l, l->t.UNIT_KEYS, l->t.UNIT_QUERIES, true) <= local_bytes;
}

/* Whether the next key tile is fetched into registers during this one: where the head dims
 * exceed UNIT_AHEAD (below, the registers cost a group a multiprocessor on an H100) and the tile
 * takes at most 32 registers a work-item (f32 at D=128 in groups of 2 warps would take 64, on
 * top of a kernel whose clang PTX ptxas already spills). */
static bool fetch_ahead(const attention_args *a, const attention_launch *l) {
    const int64_t dims = a->q->shape[3] + a->v->shape[3];
    const int64_t items = (int64_t)l->warps * l->tile.subgroup;
    const int64_t words = l->t.UNIT_KEYS * dims * (int64_t)clattn_dtype_size(a->q->dtype) / 4;
    return dims > l->t.UNIT_AHEAD && words <= 32 * items;
}

/* attention_mma's keys in chunks of UNIT_SPLIT (whole key tiles), a group each, merged after;
 * none where UNIT_SPLIT is 0 or covers the keys. As pick_splits, only a launch of fewer groups
 * than SPLIT_TARGET a compute unit splits, into at most as many chunks as make up for that
 * (and ATTENTION_SPLIT_MAX): a long prefill fills the device without them, and the partials,
 * B * Hq * Sq * splits * (Dv + 2) floats, stay within about twice that many groups' rows. */
static void mma_splits(const attention_args *a, attention_launch *l, cl_uint units) {
    const int64_t Sk = a->k->shape[2], tile = l->t.UNIT_KEYS;
    l->splits = 1, l->chunk = (int)Sk;
    if (l->variant != CLATTN__ATTENTION_MMA || l->t.UNIT_SPLIT <= 0) return;
    const int64_t block = queries_a_group(l);
    const int64_t groups = a->q->shape[0] * a->q->shape[1] * ((a->q->shape[2] + block - 1) / block);
    int64_t most = ((int64_t)units * l->t.SPLIT_TARGET + groups - 1) / groups;
    if (most > ATTENTION_SPLIT_MAX) most = ATTENTION_SPLIT_MAX;
    if (most < 2) return;
    const int64_t fewest = (Sk + most - 1) / most; /* keys a chunk */
    int64_t chunk = l->t.UNIT_SPLIT > fewest ? l->t.UNIT_SPLIT : fewest;
    chunk = (chunk + tile - 1) / tile * tile;
    if (chunk >= Sk) return;
    l->chunk = (int)chunk;
    l->splits = (int)((Sk + chunk - 1) / chunk);
}

/* The keys and tiles variants read K and V rows as aligned vectors when every row starts
 * LANES-aligned (cl/rows.cl, ALIGNED), attention_mma and attention_units 16 bytes a load when
 * they start 16-byte aligned.
 * The others load K and V element by element (micro: its K tile is transposed in local memory),
 * or pack K first (lanes). */
static bool kv_rows_aligned(const attention_args *a, const attention_launch *l,
                            cl_device_id device) {
    const bool vector_loads =
        l->variant == CLATTN__ATTENTION_KEYS || l->variant == CLATTN__ATTENTION_TILES;
    const int64_t chunk = 16 / (int64_t)clattn_dtype_size(a->k->dtype);
    const int64_t vec = on_matrix_tiles(l->variant) ? chunk : vector_loads ? l->t.LANES : 1;
    return clattn__rows_vector_aligned(a->k, a->v, vec, device);
}

/* attention_mma's and attention_units' build: the matrix-unit instruction where the device's
 * probe passed for the dtype (the launch's on_unit), else its emulation (mma: NVIDIA's warp
 * primitives, MMA_PTX; units: the launch's subgroup tile, MMA_UNIT and MMA_NATIVE); tiles
 * fetched ahead or not (the launch's ahead), or double-buffered (its async). */
static void mma_options(const attention_args *a, const attention_launch *l, char *options,
                        size_t size) {
    size_t used = strlen(options);
    const int native = l->on_unit ? 1 : 0;
    clattn__define_str(options, size, &used, "MMA_T", clattn_dtype_name(a->q->dtype));
    if (l->variant == CLATTN__ATTENTION_MMA) {
        clattn__define_int(options, size, &used, "MMA_PTX", native);
    } else {
        clattn__define_int(options, size, &used, "MMA_UNIT", l->tile.unit);
        clattn__define_int(options, size, &used, "MMA_NATIVE", native);
    }
    clattn__define_int(options, size, &used, "MMA_WARPS", l->warps);
    clattn__define_int(options, size, &used, "MMA_AHEAD", l->ahead && !l->async ? 1 : 0);
    clattn__define_int(options, size, &used, "MMA_ASYNC", l->async ? 1 : 0);
}

static void attention_options(const attention_args *a, const attention_launch *l, bool wide,
                              cl_device_id device, char *options, size_t size) {
    snprintf(options, size, "-cl-std=CL1.2");
    size_t used = strlen(options);
    clattn__define_str(options, size, &used, "Q_T", clattn_dtype_name(a->q->dtype));
    clattn__define_str(options, size, &used, "K_T", clattn_dtype_name(a->k->dtype));
    clattn__define_str(options, size, &used, "V_T", clattn_dtype_name(a->v->dtype));
    clattn__define_str(options, size, &used, "O_T", clattn_dtype_name(a->out->dtype));
    clattn__define_int(options, size, &used, "HAS_LSE", a->lse != NULL);
    clattn__define_str(options, size, &used, "LSE_T",
                       clattn_dtype_name(a->lse ? a->lse->dtype : CLATTN_F32));
    clattn__define_int(options, size, &used, "HEAD_DIM", a->q->shape[3]);
    clattn__define_int(options, size, &used, "VALUE_DIM", a->v->shape[3]);
    clattn__define_str(options, size, &used, "IDX", wide ? "ulong" : "uint");
    clattn__define_int(options, size, &used, "EMPTY_NAN", a->mask.empty_rows_nan);
    clattn__define_int(options, size, &used, "SPLIT", l->splits > 1); /* (the count: an arg) */
    clattn__define_int(options, size, &used, "VARIANT", l->variant);
    clattn__define_int(options, size, &used, "ALIGNED", kv_rows_aligned(a, l, device));
    clattn__attention_tuning_options(&l->t, options, size);
    if (l->variant == CLATTN__ATTENTION_MICRO) {
        used = strlen(options);
        clattn__define_int(options, size, &used, "ROWS", l->rows);
    }
    clattn__mask_options(&a->mask, options, size);
}

/* The kernels, by variant. */
static const char *const attention_kernels[CLATTN__ATTENTION_VARIANTS] = {
    "attention_blocks", "attention_tiles", "attention_keys", "attention_lanes",
    "attention_micro",  "attention_mma",   "attention_units"};

/* The launch indexes with 64 bits: a view past 32 bits, or scratch past them. */
static bool launch_wide(const attention_args *a, const attention_launch *l) {
    return attention_needs_wide_index(a) ||
           partial_floats(a, l) + packed_key_floats(a, l) >= (size_t)clattn__narrow_index_limit();
}

/* The widest group the launch's kernel takes on the call's device. */
static int kernel_group_limit(const clattn__call *call, const attention_args *a,
                              const attention_launch *l, size_t *most) {
    char options[1024];
    attention_options(a, l, launch_wide(a, l), call->device, options, sizeof options);
    if (on_matrix_tiles(l->variant)) mma_options(a, l, options, sizeof options);
    return clattn__kernels_group_limit(call->context, call->device, "attention.cl", options,
                                       &attention_kernels[l->variant], 1, most);
}

/* The matrix-unit variants, for a prefill whose dtype's subgroup tile the device's probes found
 * (UNITS=1; f32, UNIT_F32=1: NVIDIA's tf32 unit): attention_mma on NVIDIA's, attention_units on
 * the others'; or where PREFILL (or the test hook) asks for one (without a tile found: the
 * emulation, of NVIDIA's tile for units). On the instruction where the probe found it (unless the
 * units found are the emulated ones), else on the emulation. A forced variant that cannot take
 * the call leaves it to attention_tiles, an offered one to the row's PREFILL. */
static int pick_units(const clattn__call *call, const attention_args *a, bool prefill,
                      attention_launch *l) {
    const bool asked = on_matrix_tiles(l->variant);
    const bool f32 = a->q->dtype == CLATTN_F32;
    const bool offered = prefill && (f32 ? l->t.UNIT_F32 : l->t.UNITS) &&
                         clattn__hook_value(CLATTN__HOOK_ATTENTION_VARIANT) < 0;
    if (!asked && !offered) return CLATTN_SUCCESS;
    if (!units_dtypes_take(a, true)) {
        if (asked) l->variant = CLATTN__ATTENTION_TILES;
        return CLATTN_SUCCESS;
    }
    clattn__tile found;
    const int status = clattn__matrix_tile(call, a->q->dtype, &found);
    if (status != CLATTN_SUCCESS || (!asked && !found.unit)) return status;
    const int wanted = l->variant; /* PREFILL's, where the units do not take the call */
    if (!asked)
        l->variant =
            found.unit == CLATTN__TILE_NV ? CLATTN__ATTENTION_MMA : CLATTN__ATTENTION_UNITS;
    const bool mma = l->variant == CLATTN__ATTENTION_MMA;
    const bool emulated = clattn__matrix_units_emulated();
    l->tile = found.unit ? found : (clattn__tile){CLATTN__TILE_NV, 32};
    l->on_unit = found.unit && !emulated && (found.unit == CLATTN__TILE_NV || !mma);
    if (!units_dtypes_take(a, mma) || !fit_warps(a, l, call->device)) {
        l->variant = asked ? CLATTN__ATTENTION_TILES : wanted; /* TK was fitted before */
        return status;
    }
    fit_unit_tiles(a, l, clattn__device_local_bytes(call->device));
    l->ahead = fetch_ahead(a, l);
    mma_splits(a, l, clattn__device_compute_units(call->device));
    /* a kernel whose compiler cannot run its group (its registers, or a driver's own limit:
     * rusticl's llvmpipe takes 32 work-items of these) cannot take the call either */
    const int group = l->warps * (mma ? 32 : l->tile.subgroup);
    size_t most = 0;
    int built = kernel_group_limit(call, a, l, &most);
    if (built == CLATTN_SUCCESS && most < (size_t)group)
        l->variant = asked ? CLATTN__ATTENTION_TILES : wanted;
    l->t.GROUP = on_matrix_tiles(l->variant) ? group : l->t.GROUP;
    return built;
}

static int pick_launch(const clattn__call *call, const attention_args *a, attention_launch *l) {
    cl_device_id device = call->device;
    *l = (attention_launch){.splits = 1};
    int status = clattn__attention_tuning_get(device, a->q->dtype, &l->t);
    if (status != CLATTN_SUCCESS) return status;
    const cl_ulong local_bytes = clattn__device_local_bytes(device);
    const int64_t d = a->q->shape[3], dv = a->v->shape[3];
    const bool prefill = a->q->shape[2] > KEYS_MAX_QUERIES;
    l->variant = (int)(prefill ? l->t.PREFILL : l->t.DECODE);
    l->t.LANES = clattn__head_lanes((cl_uint)l->t.LANES, d, dv);
    const int forced = clattn__hook_value(CLATTN__HOOK_ATTENTION_VARIANT);
    if (forced >= 0) l->variant = forced;
    /* lanes needs vectors of at least 4 (hsum, hmax); head dims that allow no more take blocks */
    if (l->variant == CLATTN__ATTENTION_LANES && l->t.LANES < 4)
        l->variant = CLATTN__ATTENTION_BLOCKS;
    if (l->variant == CLATTN__ATTENTION_KEYS) l->t.GROUP = ATTENTION_KEYS_SIZE;
    if (l->variant == CLATTN__ATTENTION_LANES) l->t.GROUP = 1; /* its reqd_work_group_size */
    /* the tiles variant's K and V tiles of TK rows take at most half the local memory */
    while (l->variant != CLATTN__ATTENTION_MICRO && l->t.TK > 1 &&
           (uint64_t)l->t.TK * (uint64_t)(d + dv) * 4 > local_bytes / 2)
        l->t.TK /= 2;
    if (l->variant == CLATTN__ATTENTION_MICRO) fit_micro(l, device, d, dv, local_bytes);
    status = pick_units(call, a, prefill, l);
    if (status != CLATTN_SUCCESS) return status;
    if (!on_matrix_tiles(l->variant)) pick_splits(l, device, a);
    l->order = block_order(a, l, device);
    return CLATTN_SUCCESS;
}

/* Work-items (rounded up to whole groups) the variant launches: blocks and lanes, a work-item
 * per BM queries; tiles, a group per `group` queries of one (batch, head), the kernel reading its
 * group size back; micro, a group per group / (TK / MK) x MQ queries; mma and units, a group per
 * UNIT_QUERIES queries of each of its warps (subgroups); keys, a group per query; each times the
 * key splits. */
static size_t attention_items(const attention_args *a, const attention_launch *l, size_t group) {
    const size_t rows = (size_t)(a->q->shape[0] * a->q->shape[1]), sq = (size_t)a->q->shape[2];
    switch (l->variant) {
    case CLATTN__ATTENTION_KEYS:
        return rows * sq * (size_t)l->splits * group;
    case CLATTN__ATTENTION_TILES:
        return rows * ((sq + group - 1) / group) * (size_t)l->splits * group;
    case CLATTN__ATTENTION_MMA:
    case CLATTN__ATTENTION_UNITS: {
        const size_t block = (size_t)l->t.UNIT_QUERIES * (size_t)l->warps;
        return rows * ((sq + block - 1) / block) * (size_t)l->splits * group;
    }
    case CLATTN__ATTENTION_MICRO: {
        const size_t block = group / (size_t)(l->t.TK / l->t.MK) * (size_t)l->t.MQ;
        return rows * ((sq + block - 1) / block) * (size_t)l->splits * group;
    }
    default:
        return clattn__round_up(
            rows * ((sq + (size_t)l->t.BM - 1) / (size_t)l->t.BM) * (size_t)l->splits, group);
    }
}

/* K packed for the lanes variant, into the workspace after the partials. */
static int enqueue_pack(const attention_args *a, const attention_launch *l,
                        const clattn__call *call, cl_mem workspace, bool wide, const char *options,
                        cl_event *prev) {
    cl_kernel kernel = NULL;
    int status = clattn__create_kernel(call->context, call->device, "attention.cl", options,
                                       "attention_pack_keys", &kernel);
    cl_uint arg = 0;
    if (status == CLATTN_SUCCESS) status = clattn__set_view_args(kernel, &arg, a->k, 0, wide);
    if (status == CLATTN_SUCCESS) status = clattn__set_buffer_arg(kernel, arg++, workspace);
    if (status == CLATTN_SUCCESS)
        status = clattn__set_idx_arg(kernel, arg++, partial_floats(a, l), wide);
    if (status == CLATTN_SUCCESS) status = clattn__set_int_args(kernel, &arg, a->k->shape, 3);
    if (status == CLATTN_SUCCESS) /* for the key lengths */
        status = clattn__mask_set_args(kernel, &arg, &a->mask, a->scale, wide);
    if (status == CLATTN_SUCCESS) /* a work-item per (tile, d): LANES floats each */
        status = clattn__enqueue_items(call, kernel, packed_key_floats(a, l) / (size_t)l->t.LANES,
                                       64, prev, false);
    clattn__release_kernel(kernel);
    return status;
}

/* The merge of a split launch's partials: a work-item per output element, after `*prev`. */
static int enqueue_merge(const attention_args *a, const clattn__call *call, cl_mem part, bool wide,
                         const char *options, int splits, cl_event *prev) {
    cl_kernel kernel = NULL;
    int status = clattn__create_kernel(call->context, call->device, "attention.cl", options,
                                       "attention_merge", &kernel);
    cl_uint arg = 0;
    const int64_t *q = a->q->shape, dims[4] = {q[0], q[1], q[2], splits};
    if (status == CLATTN_SUCCESS) status = clattn__set_buffer_arg(kernel, arg++, part);
    if (status == CLATTN_SUCCESS) status = clattn__set_view_args(kernel, &arg, a->out, 0, wide);
    if (status == CLATTN_SUCCESS) status = clattn__set_int_args(kernel, &arg, dims, 4);
    if (status == CLATTN_SUCCESS && a->lse)
        status = clattn__set_view_args(kernel, &arg, a->lse, 1, wide);
    const size_t elements = (size_t)(q[0] * q[1] * q[2] * a->v->shape[3]);
    if (status == CLATTN_SUCCESS)
        status = clattn__enqueue_items(call, kernel, elements, 64, prev, true);
    clattn__release_kernel(kernel);
    return status;
}

/* attention_micro's group: whole rows of TK / MK work-items, at most the rows its local arrays
 * were built for and what the built kernel allows (0 when not one row fits). */
static size_t micro_group(const attention_launch *l, size_t max_group) {
    const size_t cols = (size_t)(l->t.TK / l->t.MK), built = (size_t)l->rows * cols;
    return (max_group < built ? max_group : built) / cols * cols;
}

/* The fused path with launch `l`: K packed first for the lanes variant, the merge after the
 * kernel when the keys are split. `workspace` holds the partials, then the packed K (NULL when
 * neither is needed). */
static int enqueue_attention(const attention_args *a, const attention_launch *launch,
                             const clattn__call *call, cl_mem workspace) {
    const attention_launch l = *launch;
    const bool wide = launch_wide(a, &l);
    char options[1024];
    attention_options(a, &l, wide, call->device, options, sizeof options);
    const bool on_tiles = on_matrix_tiles(l.variant);
    if (on_tiles) mma_options(a, &l, options, sizeof options);
    cl_kernel kernel = NULL;
    int status = clattn__create_kernel(call->context, call->device, "attention.cl", options,
                                       attention_kernels[l.variant], &kernel);
    size_t max_group = 1;
    if (status == CLATTN_SUCCESS) status = set_attention_args(kernel, a, wide, &l, workspace);
    if (status == CLATTN_SUCCESS)
        status = clattn__kernel_max_group(kernel, call->device, &max_group);
    cl_event prev = NULL;
    if (status == CLATTN_SUCCESS && l.variant == CLATTN__ATTENTION_LANES)
        status = enqueue_pack(a, &l, call, workspace, wide, options, &prev);
    if (status == CLATTN_SUCCESS) {
        size_t local = max_group < (size_t)l.t.GROUP ? max_group : (size_t)l.t.GROUP;
        if (l.variant == CLATTN__ATTENTION_KEYS) /* its reductions want a power of two */
            while (local & (local - 1)) local &= local - 1;
        if (l.variant == CLATTN__ATTENTION_MICRO) /* whole rows, at most the rows built for */
            local = micro_group(&l, max_group);
        if (on_tiles && local < (size_t)l.t.GROUP) local = 0; /* its reqd_work_group_size */
        if (local == 0)
            status = clattn__fail(CLATTN_ERR_DEVICE_LIMIT,
                                  "%s: the kernel's groups of %zu work-items are narrower than "
                                  "the %d it needs",
                                  attention_kernels[l.variant], max_group,
                                  on_tiles ? (int)l.t.GROUP : (int)(l.t.TK / l.t.MK));
        if (status == CLATTN_SUCCESS)
            status = clattn__enqueue_link(call, kernel, attention_items(a, &l, local), local, &prev,
                                          l.splits <= 1);
    }
    if (status == CLATTN_SUCCESS && l.splits > 1)
        status = enqueue_merge(a, call, workspace, wide, options, l.splits, &prev);
    if (prev) clReleaseEvent(prev);
    clattn__release_kernel(kernel);
    return status;
}

/* The path the call takes, or -1 for options that do not fit together. */
static int resolve_path(const clattn_attention_options *options) {
    clattn_attention_path path = options ? options->path : CLATTN_PATH_AUTO;
    bool weights = options && options->weights;
    if (path != CLATTN_PATH_AUTO && path != CLATTN_PATH_FUSED && path != CLATTN_PATH_COMPOSED)
        return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT, "unknown attention path %d", (int)path);
    if (path == CLATTN_PATH_FUSED && weights)
        return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT,
                            "the fused path has no attention weights: ask for CLATTN_PATH_AUTO or "
                            "CLATTN_PATH_COMPOSED");
    return path == CLATTN_PATH_COMPOSED || weights ? CLATTN_PATH_COMPOSED : CLATTN_PATH_FUSED;
}

/* The kernels number work-items (blocks) and groups (tiles, keys) with int: a launch past
 * that, which only a split of keys past 2^30 can reach, is refused before anything runs. */
static int check_launch_size(const attention_args *a, const attention_launch *l) {
    const size_t group = l->variant == CLATTN__ATTENTION_MICRO
                             ? (size_t)l->rows * (size_t)(l->t.TK / l->t.MK)
                             : (size_t)l->t.GROUP;
    size_t items = attention_items(a, l, group);
    size_t numbered =
        l->variant == CLATTN__ATTENTION_BLOCKS || l->variant == CLATTN__ATTENTION_LANES
            ? items
            : items / group;
    if (numbered > 0x7fffffff)
        return clattn__fail(CLATTN_ERR_DEVICE_LIMIT,
                            "the launch needs %zu work-groups or work-items; at most 2^31 - 1",
                            numbered);
    return CLATTN_SUCCESS;
}

int clattn__attention_check(attention_args *a, const clattn_attention_options *options,
                            cl_context context, int *path) {
    *path = resolve_path(options);
    if (*path < 0) return *path;
    int status = CLATTN_SUCCESS;
    if (!isfinite(a->scale))
        status =
            clattn__fail(CLATTN_ERR_INVALID_ARGUMENT, "scale = %g is not finite", (double)a->scale);
    if (status == CLATTN_SUCCESS) status = check_attention(a, a->mask_desc, context);
    if (status == CLATTN_SUCCESS && a->scale == 0.0f)
        a->scale = 1.0f / sqrtf((float)a->q->shape[3]);
    return status;
}

int clattn__attention_plan(const attention_args *a, int path, const clattn__call *call,
                           clattn__attention_schedule *plan) {
    memset(plan, 0, sizeof *plan);
    plan->path = path;
    if (path == CLATTN_PATH_COMPOSED) {
        plan->bytes = clattn__attention_composed_workspace(a);
        return clattn__softmax_plan(call->device, CLATTN_F32, &plan->softmax);
    }
    int status = pick_launch(call, a, &plan->launch);
    if (status != CLATTN_SUCCESS) return status;
    plan->bytes =
        (partial_floats(a, &plan->launch) + packed_key_floats(a, &plan->launch)) * sizeof(float);
    return check_launch_size(a, &plan->launch);
}

int clattn__attention_enqueue(const attention_args *a, const clattn__attention_schedule *plan,
                              const clattn__call *call, cl_mem workspace) {
    return plan->path == CLATTN_PATH_COMPOSED
               ? clattn__attention_composed(a, &plan->softmax, call, workspace)
               : enqueue_attention(a, &plan->launch, call, workspace);
}

/* Every check, then the plan. */
static int plan_call(attention_args *a, const clattn_attention_options *options,
                     const clattn__call *call, clattn__attention_schedule *plan) {
    int path = 0;
    int status = clattn__attention_check(a, options, call->context, &path);
    if (status == CLATTN_SUCCESS) status = clattn__attention_plan(a, path, call, plan);
    return status;
}

/* The caller's workspace, checked against every tensor of the call, or a fresh one. */
static int get_workspace(const attention_args *a, const clattn_attention_options *options,
                         size_t bytes, cl_context context, cl_mem *workspace, bool *owned) {
    clattn__tensor_list tensors;
    list_tensors(a, &tensors);
    return clattn__get_workspace(options ? options->workspace : NULL, bytes, context, &tensors,
                                 workspace, owned);
}

int clattn_attention_ex(const clattn_tensor *q, const clattn_tensor *k, const clattn_tensor *v,
                        float scale, const clattn_mask *mask, const clattn_tensor *out,
                        const clattn_tensor *lse, const clattn_attention_options *options,
                        cl_command_queue queue, cl_uint num_wait, const cl_event *wait_list,
                        cl_event *event) {
    clattn__call call;
    attention_args a = {q, k, v, out, lse, options ? options->weights : NULL, mask, scale, {0}};
    clattn__attention_schedule plan;
    int status = clattn__begin_call(&call, queue, num_wait, wait_list, event);
    if (status == CLATTN_SUCCESS) status = plan_call(&a, options, &call, &plan);
    cl_mem workspace = NULL;
    bool owned = false;
    if (status == CLATTN_SUCCESS)
        status = get_workspace(&a, options, plan.bytes, call.context, &workspace, &owned);
    if (status != CLATTN_SUCCESS) return status;
    status = clattn__attention_enqueue(&a, &plan, &call, workspace);
    if (owned && workspace) clReleaseMemObject(workspace);
    return status;
}

int clattn_attention(const clattn_tensor *q, const clattn_tensor *k, const clattn_tensor *v,
                     float scale, const clattn_mask *mask, const clattn_tensor *out,
                     const clattn_tensor *lse, cl_command_queue queue, cl_uint num_wait,
                     const cl_event *wait_list, cl_event *event) {
    return clattn_attention_ex(q, k, v, scale, mask, out, lse, NULL, queue, num_wait, wait_list,
                               event);
}

int clattn_attention_workspace_size(const clattn_tensor *q, const clattn_tensor *k,
                                    const clattn_tensor *v, const clattn_mask *mask,
                                    const clattn_tensor *out, const clattn_tensor *lse,
                                    const clattn_attention_options *options, cl_command_queue queue,
                                    size_t *bytes) {
    clattn__call call;
    attention_args a = {q, k, v, out, lse, options ? options->weights : NULL, mask, 1.0f, {0}};
    clattn__attention_schedule plan;
    int status = clattn__begin_call(&call, queue, 0, NULL, NULL);
    if (status == CLATTN_SUCCESS && !bytes)
        status = clattn__fail(CLATTN_ERR_INVALID_ARGUMENT, "bytes is NULL");
    if (status == CLATTN_SUCCESS) status = plan_call(&a, options, &call, &plan);
    if (status == CLATTN_SUCCESS) *bytes = plan.bytes;
    return status;
}
