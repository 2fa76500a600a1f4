/*
 * The gradients of fused attention (cl/attention_backward.cl): validation, the launch, and the
 * chain of kernels: rows (D_i), pack (K and V in key tiles), keys (dK, dV; and keys_merge where
 * it splits its rows), queries (dQ); on GPUs (BWD_TILES=1) rows, keys_tiles (and keys_merge)
 * and queries_tiles. dbias, when asked, is put together by the keys pass (plan_bias): stored into
 * dbias, or added into replicas between a clear before it and a merge after the rest; a bias
 * one value along the keys gets a merge of nothing, zeros.
 */
#include "attention.h"
#include "softmax.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Head dims are compile-time sizes of the kernels' private arrays, as in the forward. */
#define BACKWARD_MAX_HEAD_DIM 256
#define BACKWARD_SPLIT_MAX    128

typedef struct backward_args {
    const clattn_tensor *q, *k, *v, *out, *dout, *lse; /* inputs */
    const clattn_tensor *dq, *dk, *dv, *dbias;         /* outputs (dbias may be NULL) */
    int path;                                          /* CLATTN_PATH_FUSED or _COMPOSED */
    const clattn_mask *mask_desc;                      /* the caller's */
    float scale;                                       /* after the check: never 0 */
    clattn__mask_plan mask;                            /* after the check */
} backward_args;

/* The launch, from the forward's tuning row (the backward's parameters are in it): LANES keys
 * a tile (narrowed to divide both head dims), BM queries a work-item, GROUP the group size, and
 * the key splits of the queries pass (SPLIT_TARGET, SPLIT_MIN: as the forward splits). The
 * tiles kernels (BWD_TILES) take groups of `group` work-items, `slices` a key or query, `block`
 * rows staged at a time, and vectors of `lanes` along the head dims (LANES, narrowed to divide
 * both slices). */
typedef struct backward_launch {
    long lanes, bm, group;
    bool tiled;
    int slices, block, group_max;   /* the tiles kernels' */
    int splits, chunk;              /* the keys in `splits` chunks of `chunk` (1: unsplit) */
    int row_splits;                 /* the keys pass's runs of row blocks (1: unsplit) */
    int key_tiles;                  /* lanes: the key tiles of a keys work-item (KEY_TILES) */
    int lane_tiles;                 /* lanes: the queries pass's key tiles a step (LANE_TILES) */
    int bias_mode;                  /* cl/attention_backward.cl's DBIAS_MODE */
    int bias_replicas, bias_splits; /* DBIAS_MODE 2: dbias's f32 replicas, of them per row split */
    int order;                      /* the queries tiles' groups' order (cl/mask.cl's unit_place;
                                       the forward's, clattn__attention_order) */
    size_t rows, tiles;             /* B*Hq*Sq query rows; key tiles (tiled: key groups) of one
                                       (batch, kv head) */
    size_t query_blocks;            /* BM rows (tiled: a group's queries) of one (batch, q head) */
    clattn__softmax_tuning softmax; /* the composed path's */
} backward_launch;

static void list_inputs(const backward_args *a, clattn__tensor_list *list) {
    *list = (clattn__tensor_list){0};
    const char *names[6] = {"q", "k", "v", "out", "dout", "lse"};
    const clattn_tensor *views[6] = {a->q, a->k, a->v, a->out, a->dout, a->lse};
    for (int i = 0; i < 6; ++i) clattn__tensor_list_add(list, names[i], views[i]);
}

/* Every tensor of the call, the mask's too (after the mask is checked). */
static void list_tensors(const backward_args *a, clattn__tensor_list *list) {
    list_inputs(a, list);
    clattn__tensor_list_add(list, "dq", a->dq);
    clattn__tensor_list_add(list, "dk", a->dk);
    clattn__tensor_list_add(list, "dv", a->dv);
    clattn__tensor_list_add(list, "dbias", a->dbias);
    clattn__mask_list_tensors(&a->mask, list);
}

static int check_inputs(backward_args *a, cl_context context) {
    const char *names[5] = {"q", "k", "v", "out", "dout"};
    const clattn_tensor *views[5] = {a->q, a->k, a->v, a->out, a->dout};
    int status = CLATTN_SUCCESS;
    for (int i = 0; i < 5 && status == CLATTN_SUCCESS; ++i)
        status = clattn__check_tensor(names[i], views[i], context, CLATTN__FLOAT_DTYPES, false);
    if (status == CLATTN_SUCCESS)
        status = clattn__check_attention_shapes(a->q, a->k, a->v, a->out, BACKWARD_MAX_HEAD_DIM);
    if (status == CLATTN_SUCCESS) status = clattn__check_same_shape("dout", a->dout, "out", a->out);
    if (status != CLATTN_SUCCESS) return status;
    const int64_t *q = a->q->shape, Sk = a->k->shape[2];
    if (q[0] * q[1] * q[2] > 0x7fffffff || a->k->shape[0] * a->k->shape[1] * Sk > 0x7fffffff)
        return clattn__fail(CLATTN_ERR_DEVICE_LIMIT, "B*Hq*Sq or B*Hkv*Sk exceeds INT_MAX");
    /* the lse the forward wrote: 16-bit storage would put its rounding into every gradient */
    status = clattn__check_tensor("lse", a->lse, context, 1u << CLATTN_F32, false);
    const int64_t *l = a->lse ? a->lse->shape : NULL;
    if (status == CLATTN_SUCCESS && (l[0] != 1 || l[1] != q[0] || l[2] != q[1] || l[3] != q[2]))
        status = clattn__fail(CLATTN_ERR_SHAPE_MISMATCH, "lse: shape must be {1,%lld,%lld,%lld}",
                              (long long)q[0], (long long)q[1], (long long)q[2]);
    const int64_t scores[4] = {q[0], q[1], q[2], Sk};
    if (status == CLATTN_SUCCESS)
        status = clattn__mask_prepare(a->mask_desc, scores, context, &a->mask);
    return status;
}

/* dbias: the shape of mask.bias as given (its broadcast dims are summed over). */
static int check_dbias(const backward_args *a, cl_context context) {
    const clattn_tensor *bias = a->mask_desc ? a->mask_desc->bias : NULL;
    if (!bias)
        return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT, "dbias is given but mask.bias is not");
    int status = clattn__check_tensor("dbias", a->dbias, context, CLATTN__FLOAT_DTYPES, true);
    if (status == CLATTN_SUCCESS && memcmp(a->dbias->shape, bias->shape, sizeof bias->shape) != 0)
        status = clattn__fail(CLATTN_ERR_SHAPE_MISMATCH,
                              "dbias: shape must be mask.bias's, [%lld,%lld,%lld,%lld]",
                              (long long)bias->shape[0], (long long)bias->shape[1],
                              (long long)bias->shape[2], (long long)bias->shape[3]);
    return status;
}

/* dq, dk and dv in the shapes of q, k and v, and dbias; each apart from every other tensor. */
static int check_outputs(const backward_args *a, cl_context context) {
    const char *names[3] = {"dq", "dk", "dv"};
    const clattn_tensor *outs[3] = {a->dq, a->dk, a->dv}, *ins[3] = {a->q, a->k, a->v};
    int status = CLATTN_SUCCESS;
    for (int i = 0; i < 3 && status == CLATTN_SUCCESS; ++i) {
        status = clattn__check_tensor(names[i], outs[i], context, CLATTN__FLOAT_DTYPES, true);
        if (status == CLATTN_SUCCESS)
            status = clattn__check_same_shape(names[i], outs[i], names[i] + 1, ins[i]);
    }
    if (status == CLATTN_SUCCESS && a->dbias) status = check_dbias(a, context);
    clattn__tensor_list all;
    list_tensors(a, &all);
    for (int i = 0; i < 3 && status == CLATTN_SUCCESS; ++i)
        status = clattn__check_apart(names[i], outs[i], &all);
    if (status == CLATTN_SUCCESS && a->dbias) status = clattn__check_apart("dbias", a->dbias, &all);
    return status;
}

/* The path: AUTO is the fused one; the composed one has no softcap and no dbias. */
static int check_path(const backward_args *a) {
    if (a->path != CLATTN_PATH_AUTO && a->path != CLATTN_PATH_FUSED &&
        a->path != CLATTN_PATH_COMPOSED)
        return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT, "unknown attention path %d", a->path);
    if (a->path == CLATTN_PATH_COMPOSED && a->dbias)
        return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT,
                            "the composed backward has no dbias: ask for CLATTN_PATH_FUSED");
    if (a->path == CLATTN_PATH_COMPOSED && a->mask.softcap > 0.0f)
        return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT,
                            "the composed backward takes no softcap (clattn_softmax_backward "
                            "differentiates the scaled scores): ask for CLATTN_PATH_FUSED");
    return CLATTN_SUCCESS;
}

static int check_call(backward_args *a, cl_context context) {
    if (!isfinite(a->scale))
        return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT, "scale = %g is not finite",
                            (double)a->scale);
    int status = check_inputs(a, context);
    if (status == CLATTN_SUCCESS) status = check_outputs(a, context);
    if (status == CLATTN_SUCCESS) status = check_path(a);
    if (status == CLATTN_SUCCESS && a->scale == 0.0f)
        a->scale = 1.0f / sqrtf((float)a->q->shape[3]);
    return status;
}

/* The queries pass has a work-item per BM queries (tiled: a group per group / slices queries):
 * with fewer than SPLIT_TARGET of them per compute unit (few queries against many keys), the
 * keys are cut into chunks of at least SPLIT_MIN (whole 32-key tiles; a forced split, whole
 * LANES or `block` tiles) and a merge sums the partial dQ. */
static void pick_splits(backward_launch *l, const clattn__attention_tuning *t, cl_device_id device,
                        const backward_args *a) {
    const int64_t Sk = a->k->shape[2];
    const int64_t items = a->q->shape[0] * a->q->shape[1] * (int64_t)l->query_blocks;
    const int64_t want =
        ((int64_t)clattn__device_compute_units(device) * t->SPLIT_TARGET + items - 1) / items;
    int64_t splits = want < Sk / t->SPLIT_MIN ? want : Sk / t->SPLIT_MIN;
    if (splits > BACKWARD_SPLIT_MAX) splits = BACKWARD_SPLIT_MAX;
    const int forced = clattn__hook_value(CLATTN__HOOK_ATTENTION_SPLITS);
    if (forced > 0) splits = forced;
    l->splits = 1, l->chunk = (int)Sk;
    if (splits < 2) return;
    const int64_t tile = forced > 0 ? (l->tiled ? l->block : l->lanes) : 32;
    int64_t chunk = (Sk + splits - 1) / splits;
    chunk = (chunk + tile - 1) / tile * tile;
    l->chunk = (int)chunk;
    l->splits = (int)((Sk + chunk - 1) / chunk);
}

/* The keys pass's units of one (batch, kv head): a group per key group (tiles kernels), a
 * work-item per key_tiles tiles of keys (lanes kernels). */
static size_t key_spans(const backward_launch *l) {
    return (l->tiles + (size_t)l->key_tiles - 1) / (size_t)l->key_tiles;
}

/* The keys pass has its units (key_spans) per (batch, kv head), each walking the rows of the kv
 * head's query heads: with fewer than SPLIT_TARGET such units per compute unit (few keys against
 * many queries, as in cross-attention to a short text, or many query heads a kv head), the rows are
 * cut into runs of whole blocks (tiles: `block` rows; lanes: BM), at least BWD_SPLIT_MIN
 * (0: SPLIT_MIN) rows each but the last (a forced split: at least one block each), and a merge
 * sums the partial dK and dV. A launch whose dbias has rows that a kv head's query heads share does
 * not split (plan_bias: its replicas would be the bias's size a split). */
static bool bias_rows_shared_by_heads(const backward_args *a) {
    const int64_t *n = a->dbias ? a->dbias->shape : NULL;
    return n && n[3] > 1 && n[2] > 1 && n[1] == 1 && a->q->shape[1] != a->k->shape[1];
}
static void pick_row_splits(backward_launch *l, const clattn__attention_tuning *t,
                            cl_device_id device, const backward_args *a) {
    const int64_t groups = a->k->shape[0] * a->k->shape[1] * (int64_t)key_spans(l);
    const int64_t heads = a->q->shape[1] / a->k->shape[1], Sq = a->q->shape[2];
    const int64_t block = l->tiled ? l->block : l->bm;
    const int64_t runs = heads * ((Sq + block - 1) / block); /* row blocks a group walks */
    const int64_t want =
        ((int64_t)clattn__device_compute_units(device) * t->SPLIT_TARGET + groups - 1) / groups;
    const int64_t most = heads * Sq / (t->BWD_SPLIT_MIN ? t->BWD_SPLIT_MIN : t->SPLIT_MIN);
    int64_t splits = want < most ? want : most;
    if (splits > BACKWARD_SPLIT_MAX) splits = BACKWARD_SPLIT_MAX;
    const int forced = clattn__hook_value(CLATTN__HOOK_ROW_SPLITS);
    if (forced > 0) splits = forced;
    if (splits > runs) splits = runs; /* (SPLIT_MIN may be less than a block) */
    if (bias_rows_shared_by_heads(a)) splits = 1;
    l->row_splits = splits > 1 ? (int)splits : 1;
}

/* How the keys pass puts dbias together (cl/attention_backward.cl, Bias): nothing where there is
 * no dbias or the bias is one value along the keys (its gradient is 0); every pair's dS stored
 * straight into dbias where each element is one pair's (1); else (2) added into f32 replicas of
 * dbias, one per batch the bias is broadcast over, per kv head where it is broadcast over the
 * heads, and per row split unless an element is one (query head, row), so that no two
 * work-items ever write one place. A replica a split is a key row per (batch, head) for a key
 * bias; for a bias with rows shared by the query heads of a kv head it would be the bias's
 * size times up to 128 splits, so pick_row_splits leaves those rows whole. */
static void plan_bias(backward_launch *l, const backward_args *a) {
    l->bias_mode = 0, l->bias_replicas = 0, l->bias_splits = 1;
    const int64_t *n = a->dbias ? a->dbias->shape : NULL, *q = a->q->shape;
    if (!n || n[3] == 1) return;
    const int64_t Hkv = a->k->shape[1];
    if ((n[0] > 1 || q[0] == 1) && (n[1] > 1 || q[1] == 1) && (n[2] > 1 || q[2] == 1)) {
        l->bias_mode = 1;
        return;
    }
    const bool one_row = (n[2] > 1 || q[2] == 1) && (n[1] > 1 || q[1] == Hkv);
    l->bias_mode = 2;
    l->bias_splits = one_row ? 1 : l->row_splits;
    l->bias_replicas = (int)((n[0] == 1 ? q[0] : 1) * (n[1] == 1 ? Hkv : 1)) * l->bias_splits;
}

/* A replica's row: Sk rounded up to the lanes kernels' key tiles. */
static size_t bias_row(const backward_args *a, const backward_launch *l) {
    const size_t keys = l->tiled ? 1 : (size_t)l->lanes, Sk = (size_t)a->k->shape[2];
    return (Sk + keys - 1) / keys * keys;
}

/* The elements of a row of dbias a work-item of its merge sums: 16 as vectors on CPUs (the lanes
 * kernels), one on GPUs, whose neighbouring work-items then write neighbouring elements. */
static int bias_merge_lanes(const backward_launch *l) {
    return l->tiled ? 1 : 16;
}

/* Floats of dbias's replicas (DBIAS_MODE 2). */
static size_t bias_floats(const backward_args *a, const backward_launch *l) {
    if (l->bias_mode != 2) return 0;
    const int64_t *n = a->dbias->shape;
    return (size_t)l->bias_replicas * (size_t)(n[0] * n[1] * n[2]) * bias_row(a, l);
}

/* Floats of scratch: each row's (lse, D_i), K's and V's packed tiles, then the partials: (split
 * keys) the partial dQ of each split, or in the same place (split rows) the partial dK and dV of
 * each, which the keys merge has summed before the queries pass writes its own; then dbias's
 * replicas, which the keys pass fills beside its own partials and the last merge reads. */
static size_t stats_floats(const backward_launch *l) {
    return 2 * l->rows;
}
static size_t partials_at(const backward_args *a, const backward_launch *l) {
    if (l->tiled) return stats_floats(l); /* the tiles kernels read K and V as they are */
    const size_t kv_tiles = (size_t)(a->k->shape[0] * a->k->shape[1]) * l->tiles;
    return stats_floats(l) +
           kv_tiles * (size_t)l->lanes * (size_t)(a->q->shape[3] + a->v->shape[3]);
}
static size_t bias_at(const backward_args *a, const backward_launch *l) {
    const size_t keys = (size_t)(a->k->shape[0] * a->k->shape[1] * a->k->shape[2]);
    const size_t dq = l->splits > 1 ? l->rows * (size_t)l->splits * (size_t)a->q->shape[3] : 0;
    const size_t dkv =
        l->row_splits > 1 ? keys * (size_t)l->row_splits * (size_t)(a->k->shape[3] + a->v->shape[3])
                          : 0;
    return partials_at(a, l) + (dq > dkv ? dq : dkv);
}
static size_t workspace_floats(const backward_args *a, const backward_launch *l) {
    return bias_at(a, l) + bias_floats(a, l);
}

static bool needs_wide_index(const backward_args *a, const backward_launch *l) {
    const clattn_tensor *views[10] = {a->q,   a->k,  a->v,  a->out, a->dout,
                                      a->lse, a->dq, a->dk, a->dv,  a->dbias};
    return clattn__needs_wide_index(views, 10) || clattn__mask_needs_wide_index(&a->mask) ||
           workspace_floats(a, l) >= (size_t)clattn__narrow_index_limit();
}

static void backward_options(const backward_args *a, const backward_launch *l, bool wide,
                             char *options, size_t size) {
    snprintf(options, size,
             "-cl-std=CL1.2 -DQ_T=%s -DK_T=%s -DV_T=%s -DO_T=%s -DDO_T=%s -DDQ_T=%s -DDK_T=%s "
             "-DDV_T=%s -DDB_T=%s -DHAS_DBIAS=%d -DHEAD_DIM=%lld -DVALUE_DIM=%lld -DVEC=%ld "
             "-DBM=%ld -DSPLIT=%d -DIDX=%s -DTILED=%d -DSLICES=%d -DBLK=%d -DGROUP_MAX=%d "
             "-DROW_SPLIT=%d -DDBIAS_MODE=%d -DMERGE_LANES=%d -DKEY_TILES=%d -DLANE_TILES=%d",
             clattn_dtype_name(a->q->dtype), clattn_dtype_name(a->k->dtype),
             clattn_dtype_name(a->v->dtype), clattn_dtype_name(a->out->dtype),
             clattn_dtype_name(a->dout->dtype), clattn_dtype_name(a->dq->dtype),
             clattn_dtype_name(a->dk->dtype), clattn_dtype_name(a->dv->dtype),
             clattn_dtype_name(a->dbias ? a->dbias->dtype : CLATTN_F32), a->dbias != NULL,
             (long long)a->q->shape[3], (long long)a->v->shape[3], l->lanes, l->bm, l->splits > 1,
             wide ? "ulong" : "uint", l->tiled, l->slices, l->block, l->group_max,
             l->row_splits > 1, l->bias_mode, bias_merge_lanes(l), l->key_tiles, l->lane_tiles);
    clattn__mask_options(&a->mask, options, size);
}

/* The tiles kernels' slices: the fewest that divide both head dims and leave a work-item at most
 * BWD_SLICE dims of each, else as many as divide both (their greatest common divisor). */
static int tile_slices(const clattn__attention_tuning *t, int64_t d, int64_t dv) {
    int64_t common = d, rest = dv;
    while (rest) {
        const int64_t r = common % rest;
        common = rest, rest = r;
    }
    const int64_t widest = d > dv ? d : dv;
    for (int64_t slices = 1; slices < common; ++slices)
        if (common % slices == 0 && widest / slices <= t->BWD_SLICE) return (int)slices;
    return (int)common;
}

/* The tiles kernels' local memory: the staged rows, the slices' partial dots, a block's mask
 * rows and stats (a bound on the structs' size), the span. */
static uint64_t tile_local_bytes(const backward_args *a, const backward_launch *l, int block) {
    const uint64_t rows = (uint64_t)block * (uint64_t)(a->q->shape[3] + a->v->shape[3]);
    const uint64_t red = 2 * (uint64_t)block * (uint64_t)l->group_max;
    return 4 * (rows + red) + (uint64_t)block * 96 + 64;
}

/* The widest group both tiles kernels take on the call's device. */
static int tiles_group_limit(const clattn__call *call, const backward_args *a,
                             const backward_launch *l, size_t *most) {
    char options[1024];
    backward_options(a, l, needs_wide_index(a, l), options, sizeof options);
    static const char *const names[2] = {"backward_keys_tiles", "backward_queries_tiles"};
    return clattn__kernels_group_limit(call->context, call->device, "attention_backward.cl",
                                       options, names, 2, most);
}

/* The key groups (tiled) or tiles of one (batch, kv head), the query blocks of one (batch,
 * query head), then the queries pass's key splits, the keys pass's row splits, and how that
 * pass adds up dbias. */
static void plan_blocks(backward_launch *l, const clattn__attention_tuning *t, cl_device_id device,
                        const backward_args *a) {
    const long per_tile = l->tiled ? l->group / l->slices : l->lanes;
    const long per_block = l->tiled ? l->group / l->slices : l->bm;
    l->tiles = (size_t)((a->k->shape[2] + per_tile - 1) / per_tile);
    l->query_blocks = (size_t)((a->q->shape[2] + per_block - 1) / per_block);
    pick_splits(l, t, device, a);
    pick_row_splits(l, t, device, a);
    plan_bias(l, a);
}

/* BWD_TILES: the slices, the block that fits the local memory, and the widest group of whole
 * slices both kernels take, asked of the program the launch builds (its splits, and so its
 * index width, follow the group). Where the local memory holds no block, or the device takes no
 * group of `slices` work-items, the lanes kernels run: *l keeps tiled false. */
static int plan_tiles(const clattn__call *call, const clattn__attention_tuning *t,
                      const backward_args *a, backward_launch *l) {
    backward_launch tiles = *l;
    const int64_t d = a->q->shape[3], dv = a->v->shape[3];
    const size_t device_group = clattn__device_max_group(call->device);
    tiles.tiled = true;
    tiles.slices = tile_slices(t, d, dv);
    tiles.lanes = clattn__head_lanes((cl_uint)t->LANES, d / tiles.slices, dv / tiles.slices);
    const size_t wanted = (size_t)t->BWD_GROUP;
    tiles.group_max = (int)(wanted < device_group ? wanted : device_group);
    if (tiles.group_max < tiles.slices) return CLATTN_SUCCESS;
    tiles.group = tiles.group_max / tiles.slices * tiles.slices;
    const cl_ulong local = clattn__device_local_bytes(call->device);
    tiles.block = (int)t->BWD_BLOCK;
    while (tiles.block > 1 && tile_local_bytes(a, &tiles, tiles.block) > local) tiles.block /= 2;
    if (tile_local_bytes(a, &tiles, tiles.block) > local) return CLATTN_SUCCESS;
    for (;;) {
        plan_blocks(&tiles, t, call->device, a);
        size_t most = 0;
        const int status = tiles_group_limit(call, a, &tiles, &most);
        if (status != CLATTN_SUCCESS) return status;
        if (most >= (size_t)tiles.group) break;
        tiles.group = (long)(most / (size_t)tiles.slices * (size_t)tiles.slices);
        if (tiles.group < tiles.slices) return CLATTN_SUCCESS;
    }
    tiles.order = clattn__attention_order(a->q, a->k, a->v, a->mask.causal, t,
                                          (int64_t)tiles.query_blocks, call->device);
    *l = tiles;
    return CLATTN_SUCCESS;
}

/* The lanes keys pass's key tiles a work-item: BWD_KEY_TILES, but one where dbias is asked (its
 * puts ran slower over two: the bias row's keys pass took 92-124 ms against 82 on PoCL), or
 * the hooked count. */
static int pick_key_tiles(const clattn__attention_tuning *t, const backward_args *a) {
    const int forced = clattn__hook_value(CLATTN__HOOK_KEY_TILES);
    if (forced > 0) return forced;
    return a->dbias ? 1 : (int)t->BWD_KEY_TILES;
}

static int plan_launch(const clattn__call *call, const backward_args *a, backward_launch *l) {
    clattn__attention_tuning t;
    *l = (backward_launch){0};
    int status = clattn__attention_tuning_get(call->device, a->q->dtype, &t);
    if (status != CLATTN_SUCCESS) return status;
    l->bm = t.BM;
    l->key_tiles = l->lane_tiles = 1;
    l->rows = (size_t)(a->q->shape[0] * a->q->shape[1] * a->q->shape[2]);
    if (t.BWD_TILES) status = plan_tiles(call, &t, a, l);
    if (status != CLATTN_SUCCESS || l->tiled) return status;
    l->lanes = clattn__head_lanes((cl_uint)t.LANES, a->q->shape[3], a->v->shape[3]);
    l->group = t.GROUP;
    l->key_tiles = pick_key_tiles(&t, a);
    l->lane_tiles = (int)t.LANE_TILES;
    plan_blocks(l, &t, call->device, a);
    return CLATTN_SUCCESS;
}

/* One kernel of the chain: its arguments set by the caller between create and enqueue. */
typedef struct backward_step {
    const clattn__call *call;
    const char *options;
    const backward_args *a;
    const backward_launch *l;
    cl_mem workspace;
    bool wide;
    cl_event *prev;
} backward_step;

/* The workspace as a kernel's scratch: (with `stats`, the rows' stats at offset 0, then) the
 * buffer and offset `at` (K and V packed, at stats_floats, or the split partials, at
 * partials_at). */
static int set_scratch_args(const backward_step *s, cl_kernel kernel, cl_uint *arg, bool stats,
                            size_t at) {
    int status = CLATTN_SUCCESS;
    if (stats) status = clattn__set_buffer_arg(kernel, (*arg)++, s->workspace);
    if (status == CLATTN_SUCCESS) status = clattn__set_buffer_arg(kernel, (*arg)++, s->workspace);
    if (status == CLATTN_SUCCESS) status = clattn__set_idx_arg(kernel, (*arg)++, at, s->wide);
    return status;
}

/* The views of `kernel`'s leading tensor parameters, in order. */
static int set_views(const backward_step *s, cl_kernel kernel, cl_uint *arg,
                     const clattn_tensor *const *views, int count) {
    return clattn__set_views_args(kernel, arg, views, count, s->wide);
}

static int run_rows(const backward_step *s, cl_kernel kernel) {
    const backward_args *a = s->a;
    const clattn_tensor *views[2] = {a->out, a->dout};
    cl_uint arg = 0;
    int status = set_views(s, kernel, &arg, views, 2);
    if (status == CLATTN_SUCCESS) status = clattn__set_view_args(kernel, &arg, a->lse, 1, s->wide);
    if (status == CLATTN_SUCCESS) status = clattn__set_buffer_arg(kernel, arg++, s->workspace);
    if (status == CLATTN_SUCCESS) status = clattn__set_int_args(kernel, &arg, a->q->shape, 3);
    if (status == CLATTN_SUCCESS)
        status = clattn__enqueue_items(s->call, kernel, s->l->rows, 64, s->prev, false);
    return status;
}

static int run_pack(const backward_step *s, cl_kernel kernel) {
    const backward_args *a = s->a;
    const clattn_tensor *views[2] = {a->k, a->v};
    cl_uint arg = 0;
    int status = set_views(s, kernel, &arg, views, 2);
    if (status == CLATTN_SUCCESS)
        status = set_scratch_args(s, kernel, &arg, false, stats_floats(s->l));
    if (status == CLATTN_SUCCESS) status = clattn__set_int_args(kernel, &arg, a->k->shape, 3);
    if (status == CLATTN_SUCCESS) /* for the key lengths */
        status = clattn__mask_set_args(kernel, &arg, &a->mask, a->scale, s->wide);
    const size_t items = (size_t)(a->k->shape[0] * a->k->shape[1]) * s->l->tiles *
                         (size_t)(a->k->shape[3] + a->v->shape[3]);
    if (status == CLATTN_SUCCESS)
        status = clattn__enqueue_items(s->call, kernel, items, 64, s->prev, false);
    return status;
}

/* The keys and queries passes' B, Hq, Hkv, Sq, Sk, the split partials' buffer and offset, the
 * pass's splits (the queries': the key chunk and the count of key splits; the keys': the count
 * of row splits, arguments so that every count shares a program), the mask. */
static int set_dims_and_mask(const backward_step *s, cl_kernel kernel, cl_uint *arg, bool queries) {
    const backward_args *a = s->a;
    const int64_t dims[5] = {a->q->shape[0], a->q->shape[1], a->k->shape[1], a->q->shape[2],
                             a->k->shape[2]};
    int status = clattn__set_int_args(kernel, arg, dims, 5);
    if (status == CLATTN_SUCCESS)
        status = set_scratch_args(s, kernel, arg, false, partials_at(a, s->l));
    const int64_t key_splits[2] = {s->l->chunk, s->l->splits}, row_splits = s->l->row_splits;
    if (status == CLATTN_SUCCESS)
        status = queries ? clattn__set_int_args(kernel, arg, key_splits, 2)
                         : clattn__set_int_args(kernel, arg, &row_splits, 1);
    if (status == CLATTN_SUCCESS)
        status = clattn__mask_set_args(kernel, arg, &a->mask, a->scale, s->wide);
    return status;
}

/* The keys passes' last arguments where they add up dbias: dbias, its replicas (the workspace
 * at bias_at), its dims and the row splits the replicas keep apart. */
static int set_keys_bias_args(const backward_step *s, cl_kernel kernel, cl_uint *arg) {
    const backward_args *a = s->a;
    if (s->l->bias_mode == 0) return CLATTN_SUCCESS;
    int status = clattn__set_view_args(kernel, arg, a->dbias, 0, s->wide);
    if (status == CLATTN_SUCCESS)
        status = set_scratch_args(s, kernel, arg, false, bias_at(a, s->l));
    if (status == CLATTN_SUCCESS) status = clattn__set_int_args(kernel, arg, a->dbias->shape, 4);
    const int64_t splits = s->l->bias_splits;
    if (status == CLATTN_SUCCESS) status = clattn__set_int_args(kernel, arg, &splits, 1);
    return status;
}

/* Whether dQ's last step ends the chain (not where dbias's replicas are merged after it), and
 * whether that step is the queries pass (no key splits to merge). */
static bool dq_ends_chain(const backward_launch *l) {
    return l->bias_mode != 2;
}
static bool queries_end_chain(const backward_launch *l) {
    return dq_ends_chain(l) && l->splits == 1;
}

/* The lanes keys and queries kernels: four tensors, the scratch, the dims and splits, the mask
 * (and for the keys, dbias's). */
static int run_tiles(const backward_step *s, cl_kernel kernel, const clattn_tensor *const views[4],
                     size_t items, bool last) {
    cl_uint arg = 0;
    const bool queries = views[3] == s->a->dq;
    int status = set_views(s, kernel, &arg, views, 4);
    if (status == CLATTN_SUCCESS)
        status = set_scratch_args(s, kernel, &arg, true, stats_floats(s->l));
    if (status == CLATTN_SUCCESS) status = set_dims_and_mask(s, kernel, &arg, queries);
    if (status == CLATTN_SUCCESS && !queries) status = set_keys_bias_args(s, kernel, &arg);
    if (status == CLATTN_SUCCESS)
        status = clattn__enqueue_items(s->call, kernel, items, (size_t)s->l->group, s->prev, last);
    return status;
}

/* The units of either family's passes (lanes: work-items; tiles: groups): the keys pass's, one
 * per key span (key_spans) of each (batch, kv head) and row split; the queries pass's, one per
 * query block of each (batch, query head) and key split. */
static size_t keys_units(const backward_step *s) {
    const int64_t *k = s->a->k->shape;
    return (size_t)(k[0] * k[1]) * key_spans(s->l) * (size_t)s->l->row_splits;
}
static size_t queries_units(const backward_step *s) {
    const int64_t *q = s->a->q->shape;
    return (size_t)(q[0] * q[1]) * s->l->query_blocks * (size_t)s->l->splits;
}

static int run_keys(const backward_step *s, cl_kernel kernel) {
    const backward_args *a = s->a;
    const clattn_tensor *views[4] = {a->q, a->dout, a->dk, a->dv};
    return run_tiles(s, kernel, views, keys_units(s), false);
}

static int run_queries(const backward_step *s, cl_kernel kernel) {
    const backward_args *a = s->a;
    const clattn_tensor *views[4] = {a->q, a->k, a->dout, a->dq};
    return run_tiles(s, kernel, views, queries_units(s), queries_end_chain(s->l));
}

/* The tiles kernels: six or five tensors, the stats, (the queries': the groups' order,) the
 * dims and splits, the mask (and for the keys, dbias's); groups of exactly `group`, which the
 * plan asked this program to take (the kernels' grid assumes it). */
static int run_tiles_pass(const backward_step *s, cl_kernel kernel, bool queries,
                          const clattn_tensor *const *views, int count, size_t groups) {
    cl_uint arg = 0;
    int status = set_views(s, kernel, &arg, views, count);
    if (status == CLATTN_SUCCESS) status = clattn__set_buffer_arg(kernel, arg++, s->workspace);
    if (status == CLATTN_SUCCESS && queries)
        status = clattn__set_int_arg(kernel, arg++, s->l->order);
    if (status == CLATTN_SUCCESS) status = set_dims_and_mask(s, kernel, &arg, queries);
    if (status == CLATTN_SUCCESS && !queries) status = set_keys_bias_args(s, kernel, &arg);
    const size_t group = (size_t)s->l->group;
    if (status == CLATTN_SUCCESS)
        status = clattn__enqueue_link(s->call, kernel, groups * group, group, s->prev,
                                      queries && queries_end_chain(s->l));
    return status;
}

static int run_keys_tiles(const backward_step *s, cl_kernel kernel) {
    const backward_args *a = s->a;
    const clattn_tensor *views[6] = {a->q, a->k, a->v, a->dout, a->dk, a->dv};
    return run_tiles_pass(s, kernel, false, views, 6, keys_units(s));
}

/* Split rows: a work-item per element of dK and dV sums the partials. */
static int run_keys_merge(const backward_step *s, cl_kernel kernel) {
    const backward_args *a = s->a;
    const clattn_tensor *views[2] = {a->dk, a->dv};
    cl_uint arg = 0;
    int status = set_scratch_args(s, kernel, &arg, false, partials_at(a, s->l));
    if (status == CLATTN_SUCCESS) status = set_views(s, kernel, &arg, views, 2);
    const int64_t dims[4] = {a->k->shape[0], a->k->shape[1], a->k->shape[2], s->l->row_splits};
    if (status == CLATTN_SUCCESS) status = clattn__set_int_args(kernel, &arg, dims, 4);
    const size_t items = (size_t)(dims[0] * dims[1] * dims[2] * (a->k->shape[3] + a->v->shape[3]));
    if (status == CLATTN_SUCCESS)
        status = clattn__enqueue_items(s->call, kernel, items, 64, s->prev, false);
    return status;
}

static int run_queries_tiles(const backward_step *s, cl_kernel kernel) {
    const backward_args *a = s->a;
    const clattn_tensor *views[5] = {a->q, a->k, a->v, a->dout, a->dq};
    return run_tiles_pass(s, kernel, true, views, 5, queries_units(s));
}

/* Split keys: a work-item per element of dQ sums the partials. */
static int run_merge(const backward_step *s, cl_kernel kernel) {
    const backward_args *a = s->a;
    cl_uint arg = 0;
    int status = set_scratch_args(s, kernel, &arg, false, partials_at(a, s->l));
    if (status == CLATTN_SUCCESS) status = clattn__set_view_args(kernel, &arg, a->dq, 0, s->wide);
    const int64_t dims[4] = {a->q->shape[0], a->q->shape[1], a->q->shape[2], s->l->splits};
    if (status == CLATTN_SUCCESS) status = clattn__set_int_args(kernel, &arg, dims, 4);
    if (status == CLATTN_SUCCESS)
        status = clattn__enqueue_items(s->call, kernel, s->l->rows * (size_t)a->q->shape[3], 64,
                                       s->prev, dq_ends_chain(s->l));
    return status;
}

/* DBIAS_MODE 2, before the keys pass: zeros into dbias's replicas. */
static int run_bias_clear(const backward_step *s, cl_kernel kernel) {
    const size_t count = bias_floats(s->a, s->l);
    cl_uint arg = 0;
    int status = set_scratch_args(s, kernel, &arg, false, bias_at(s->a, s->l));
    if (status == CLATTN_SUCCESS) status = clattn__set_idx_arg(kernel, arg++, count, s->wide);
    if (status == CLATTN_SUCCESS)
        status = clattn__enqueue_items(s->call, kernel, count, 256, s->prev, false);
    return status;
}

/* A work-item per bias_merge_lanes elements of a row of dbias: the sum of their replicas
 * (DBIAS_MODE 2: last in the chain), or (with none, `replicas` 0: a bias one value along the
 * keys) zeros. */
static int run_bias_merge(const backward_step *s, cl_kernel kernel, int replicas) {
    const backward_args *a = s->a;
    const int64_t *n = a->dbias->shape;
    const int64_t tail[2] = {replicas, (int64_t)bias_row(a, s->l)};
    cl_uint arg = 0;
    int status = set_scratch_args(s, kernel, &arg, false, bias_at(a, s->l));
    if (status == CLATTN_SUCCESS)
        status = clattn__set_view_args(kernel, &arg, a->dbias, 0, s->wide);
    if (status == CLATTN_SUCCESS) status = clattn__set_int_args(kernel, &arg, n, 4);
    if (status == CLATTN_SUCCESS) status = clattn__set_int_args(kernel, &arg, tail, 2);
    const size_t lanes = (size_t)bias_merge_lanes(s->l);
    const size_t chunks = ((size_t)n[3] + lanes - 1) / lanes;
    if (status == CLATTN_SUCCESS)
        status = clattn__enqueue_items(s->call, kernel, (size_t)(n[0] * n[1] * n[2]) * chunks, 64,
                                       s->prev, replicas > 0);
    return status;
}
static int run_bias_zeros(const backward_step *s, cl_kernel kernel) {
    return run_bias_merge(s, kernel, 0);
}
static int run_bias_sums(const backward_step *s, cl_kernel kernel) {
    return run_bias_merge(s, kernel, s->l->bias_replicas);
}

typedef int (*step_fn)(const backward_step *s, cl_kernel kernel);

static int run_step(const backward_step *s, const char *name, step_fn fn) {
    cl_kernel kernel = NULL;
    int status = clattn__create_kernel(s->call->context, s->call->device, "attention_backward.cl",
                                       s->options, name, &kernel);
    if (status == CLATTN_SUCCESS) status = fn(s, kernel);
    clattn__release_kernel(kernel);
    return status;
}

static int enqueue_backward(const backward_args *a, const backward_launch *l,
                            const clattn__call *call, cl_mem workspace) {
    const bool wide = needs_wide_index(a, l);
    char options[1024];
    backward_options(a, l, wide, options, sizeof options);
    cl_event prev = NULL;
    const backward_step s = {call, options, a, l, workspace, wide, &prev};
    int status = run_step(&s, "backward_rows", run_rows);
    if (status == CLATTN_SUCCESS && a->dbias && l->bias_mode == 0)
        status = run_step(&s, "backward_bias_merge", run_bias_zeros);
    if (status == CLATTN_SUCCESS && l->bias_mode == 2)
        status = run_step(&s, "backward_bias_clear", run_bias_clear);
    if (status == CLATTN_SUCCESS && !l->tiled) status = run_step(&s, "backward_pack", run_pack);
    if (status == CLATTN_SUCCESS)
        status = l->tiled ? run_step(&s, "backward_keys_tiles", run_keys_tiles)
                          : run_step(&s, "backward_keys", run_keys);
    if (status == CLATTN_SUCCESS && l->row_splits > 1)
        status = run_step(&s, "backward_keys_merge", run_keys_merge);
    if (status == CLATTN_SUCCESS)
        status = l->tiled ? run_step(&s, "backward_queries_tiles", run_queries_tiles)
                          : run_step(&s, "backward_queries", run_queries);
    if (status == CLATTN_SUCCESS && l->splits > 1)
        status = run_step(&s, "backward_merge", run_merge);
    if (status == CLATTN_SUCCESS && l->bias_mode == 2)
        status = run_step(&s, "backward_bias_merge", run_bias_sums);
    if (prev) clReleaseEvent(prev);
    return status;
}

static const clattn_tensor *option_dbias(const clattn_attention_backward_options *options) {
    return options ? options->dbias : NULL;
}

static int option_path(const clattn_attention_backward_options *options) {
    return options ? (int)options->path : CLATTN_PATH_AUTO;
}

/* The call as the composed path takes it: the forward's arguments and the gradients. */
static void composed_view(const backward_args *a, clattn__attention_args *fwd,
                          clattn__attention_grads *g) {
    *fwd = (clattn__attention_args){a->q, a->k,         a->v,     NULL,   NULL,
                                    NULL, a->mask_desc, a->scale, a->mask};
    *g = (clattn__attention_grads){fwd, a->dout, a->dq, a->dk, a->dv};
}

/* Every check, then the launch and its scratch bytes. */
static int plan_call(backward_args *a, const clattn__call *call, backward_launch *l,
                     size_t *bytes) {
    int status = check_call(a, call->context);
    if (status != CLATTN_SUCCESS) return status;
    if (a->path == CLATTN_PATH_COMPOSED) {
        clattn__attention_args fwd;
        clattn__attention_grads g;
        composed_view(a, &fwd, &g);
        *bytes = clattn__attention_composed_backward_workspace(&g);
        return clattn__softmax_plan(call->device, CLATTN_F32, &l->softmax);
    }
    status = plan_launch(call, a, l);
    if (status == CLATTN_SUCCESS) *bytes = workspace_floats(a, l) * sizeof(float);
    return status;
}

static int enqueue_call(const backward_args *a, const backward_launch *l, const clattn__call *call,
                        cl_mem workspace) {
    if (a->path != CLATTN_PATH_COMPOSED) return enqueue_backward(a, l, call, workspace);
    clattn__attention_args fwd;
    clattn__attention_grads g;
    composed_view(a, &fwd, &g);
    return clattn__attention_composed_backward(&g, &l->softmax, call, workspace);
}

int clattn_attention_backward(const clattn_tensor *q, const clattn_tensor *k,
                              const clattn_tensor *v, const clattn_tensor *out,
                              const clattn_tensor *dout, const clattn_tensor *lse, float scale,
                              const clattn_mask *mask, const clattn_tensor *dq,
                              const clattn_tensor *dk, const clattn_tensor *dv,
                              const clattn_attention_backward_options *options,
                              cl_command_queue queue, cl_uint num_wait, const cl_event *wait_list,
                              cl_event *event) {
    clattn__call call;
    backward_args a = {
        q,    k,     v,  out, dout, lse, dq, dk, dv, option_dbias(options), option_path(options),
        mask, scale, {0}};
    backward_launch l;
    size_t bytes = 0;
    int status = clattn__begin_call(&call, queue, num_wait, wait_list, event);
    if (status == CLATTN_SUCCESS) status = plan_call(&a, &call, &l, &bytes);
    cl_mem workspace = NULL;
    bool owned = false;
    if (status == CLATTN_SUCCESS) {
        clattn__tensor_list tensors;
        list_tensors(&a, &tensors);
        status = clattn__get_workspace(options ? options->workspace : NULL, bytes, call.context,
                                       &tensors, &workspace, &owned);
    }
    if (status != CLATTN_SUCCESS) return status;
    status = enqueue_call(&a, &l, &call, workspace);
    if (owned) clReleaseMemObject(workspace);
    return status;
}

/* The plan of a call that enqueues nothing: its scratch bytes and launch. */
static int plan_only(backward_args *a, cl_command_queue queue, backward_launch *l, size_t *bytes) {
    clattn__call call;
    int status = clattn__begin_call(&call, queue, 0, NULL, NULL);
    if (status == CLATTN_SUCCESS && !bytes)
        status = clattn__fail(CLATTN_ERR_INVALID_ARGUMENT, "bytes is NULL");
    return status == CLATTN_SUCCESS ? plan_call(a, &call, l, bytes) : status;
}

int clattn_attention_backward_workspace_size(const clattn_tensor *q, const clattn_tensor *k,
                                             const clattn_tensor *v, const clattn_tensor *out,
                                             const clattn_tensor *dout, const clattn_tensor *lse,
                                             const clattn_mask *mask, const clattn_tensor *dq,
                                             const clattn_tensor *dk, const clattn_tensor *dv,
                                             const clattn_attention_backward_options *options,
                                             cl_command_queue queue, size_t *bytes) {
    backward_args a = {
        q,    k,    v,  out, dout, lse, dq, dk, dv, option_dbias(options), option_path(options),
        mask, 1.0f, {0}};
    backward_launch l;
    return plan_only(&a, queue, &l, bytes);
}

int clattn__attention_backward_plan(const clattn_tensor *q, const clattn_tensor *k,
                                    const clattn_tensor *v, const clattn_tensor *out,
                                    const clattn_tensor *dout, const clattn_tensor *lse,
                                    const clattn_mask *mask, const clattn_tensor *dq,
                                    const clattn_tensor *dk, const clattn_tensor *dv,
                                    const clattn_tensor *dbias, cl_command_queue queue,
                                    clattn__backward_plan *plan) {
    backward_args a = {q,    k,    v,  out, dout, lse, dq, dk, dv, dbias, CLATTN_PATH_FUSED,
                       mask, 1.0f, {0}};
    backward_launch l;
    size_t bytes = 0;
    const int status = plan_only(&a, queue, &l, &bytes);
    if (status == CLATTN_SUCCESS)
        *plan = (clattn__backward_plan){l.tiled,     (int)l.group,    l.slices,
                                        l.splits,    l.order,         l.row_splits,
                                        l.bias_mode, l.bias_replicas, l.key_tiles};
    return status;
}
