/*
 * Multi-head reshape ops: clattn_copy and the views that make split heads, merge heads and the
 * packed-QKV split out of it. Kernels: cl/heads.cl (copy4d, and transpose4d or, on the copy
 * row's TILES=1, transpose_tiles for transposed views).
 */
#include "heads.h"

#include <stdio.h>
#include <string.h>

/* A copy after its views are simplified: the same element-wise map over at most 4 dims. */
typedef struct copy_plan {
    int64_t n[4];
    int64_t src_stride[4], dst_stride[4], bias_stride[4];
    uint64_t src_off, dst_off, bias_off;
    clattn_dtype src_dtype, dst_dtype; /* the element types the kernel moves */
    const clattn_tensor *src, *dst, *bias;
} copy_plan;

/* True when dim a should be iterated outside dim b. The dim with the smallest destination
 * stride goes innermost (vector stores). The other dims go by their smaller stride, largest
 * outside; on a tie, the dim with the larger other stride goes inside. For split and merge
 * heads that walks the packed [B,S,H*D] tensor in memory order and the [B,H,S,D] one as H
 * sequential streams. Walking S rows at the H*D stride instead (a power of two) ran at half the
 * copy bandwidth on PoCL, whichever of the two tensors was read that way. */
static bool iterate_outside(const clattn_tensor *src, const clattn_tensor *dst, int a, int b,
                            int innermost) {
    if (a == innermost || b == innermost) return b == innermost;
    int64_t min_a = src->strides[a] < dst->strides[a] ? src->strides[a] : dst->strides[a];
    int64_t min_b = src->strides[b] < dst->strides[b] ? src->strides[b] : dst->strides[b];
    if (min_a != min_b) return min_a > min_b;
    int64_t max_a = src->strides[a] + dst->strides[a] - min_a;
    int64_t max_b = src->strides[b] + dst->strides[b] - min_b;
    return max_a < max_b;
}

/* Drops size-1 dims, orders the rest (iterate_outside), and merges neighbours that are
 * contiguous in every tensor. The result is right-aligned in 4 dims: [1, 1, 1, N] for a fully
 * contiguous copy. */
static void plan_copy(const clattn_tensor *src, const clattn_tensor *bias, const clattn_tensor *dst,
                      copy_plan *plan) {
    int dims[4], count = 0, innermost = -1;
    for (int i = 0; i < 4; ++i)
        if (dst->shape[i] > 1) {
            dims[count++] = i;
            if (innermost < 0 || dst->strides[i] <= dst->strides[innermost]) innermost = i;
        }
    for (int a = 1; a < count; ++a) /* insertion sort, outermost first */
        for (int b = a; b > 0 && iterate_outside(src, dst, dims[b], dims[b - 1], innermost); --b) {
            int swap = dims[b];
            dims[b] = dims[b - 1];
            dims[b - 1] = swap;
        }
    int64_t n[4], ss[4], ds[4], bs[4];
    int m = 0;
    for (int i = 0; i < count; ++i) {
        int d = dims[i];
        int64_t b_stride = bias ? bias->strides[d] : 0;
        bool merge = m > 0 && ss[m - 1] == src->strides[d] * dst->shape[d] &&
                     ds[m - 1] == dst->strides[d] * dst->shape[d] &&
                     bs[m - 1] == b_stride * dst->shape[d];
        if (merge) {
            n[m - 1] *= dst->shape[d];
            ss[m - 1] = src->strides[d];
            ds[m - 1] = dst->strides[d];
            bs[m - 1] = b_stride;
        } else {
            n[m] = dst->shape[d];
            ss[m] = src->strides[d];
            ds[m] = dst->strides[d];
            bs[m] = b_stride;
            ++m;
        }
    }
    memset(plan, 0, sizeof *plan);
    for (int i = 0; i < 4; ++i) plan->n[i] = 1;
    for (int i = 0; i < m; ++i) {
        int slot = 4 - m + i;
        plan->n[slot] = n[i];
        plan->src_stride[slot] = ss[i];
        plan->dst_stride[slot] = ds[i];
        plan->bias_stride[slot] = bs[i];
    }
    plan->src_off = src->offset;
    plan->dst_off = dst->offset;
    plan->bias_off = bias ? bias->offset : 0;
    plan->src_dtype = src->dtype;
    plan->dst_dtype = dst->dtype;
    plan->src = src;
    plan->dst = dst;
    plan->bias = bias;
}

/* A raw copy of 16-bit elements whose rows all start on an even element moves them in pairs, as
 * 32-bit words: the same bytes in half the work-item steps (f16 split/merge heads ran at 40-60%
 * of the copy bandwidth element by element). */
static void pair_16bit_elements(copy_plan *plan) {
    bool raw = !plan->bias && plan->src_dtype == plan->dst_dtype;
    if (!raw || clattn_dtype_size(plan->src_dtype) != 2) return;
    if (plan->src_stride[3] != 1 || plan->dst_stride[3] != 1 || plan->n[3] % 2 != 0) return;
    if (plan->src_off % 2 != 0 || plan->dst_off % 2 != 0) return;
    for (int i = 0; i < 3; ++i)
        if (plan->n[i] > 1 && (plan->src_stride[i] % 2 != 0 || plan->dst_stride[i] % 2 != 0))
            return;
    for (int i = 0; i < 3; ++i) {
        plan->src_stride[i] /= 2;
        plan->dst_stride[i] /= 2;
    }
    plan->n[3] /= 2;
    plan->src_off /= 2;
    plan->dst_off /= 2;
    plan->src_dtype = plan->dst_dtype = CLATTN_F32; /* raw_f32 is uint */
}

/* The plan's source (or destination) as a tensor: the element type and layout the kernel sees. */
static clattn_tensor plan_view(const copy_plan *plan, bool dst) {
    clattn_tensor t = dst ? *plan->dst : *plan->src;
    t.dtype = dst ? plan->dst_dtype : plan->src_dtype;
    t.offset = (size_t)(dst ? plan->dst_off : plan->src_off);
    for (int i = 0; i < 4; ++i) {
        t.shape[i] = plan->n[i];
        t.strides[i] = dst ? plan->dst_stride[i] : plan->src_stride[i];
    }
    return t;
}

/* Each run starts a whole number of vectors into its row (run is a multiple of VEC), so the
 * vector accesses are aligned when every row of both tensors starts VEC-aligned. */
static bool plan_is_aligned(const copy_plan *plan, long vec, cl_device_id device) {
    clattn_tensor src = plan_view(plan, false), dst = plan_view(plan, true);
    return clattn__rows_vector_aligned(&src, &dst, vec, device);
}

static const char *dtype_token(clattn_dtype dtype) {
    return clattn_dtype_name(dtype); /* f32, f16, bf16: the tokens cl/common.cl defines */
}

static bool plan_needs_wide_index(const copy_plan *plan) {
    const clattn_tensor *views[3] = {plan->src, plan->dst, plan->bias};
    return clattn__needs_wide_index(views, 3);
}

/* The build options: the plan's, then the tuning parameters that reach the kernel (VEC). */
static void plan_options(const copy_plan *plan, int parts, const clattn__copy_tuning *tuning,
                         bool wide, bool aligned, char *out, size_t capacity) {
    bool raw = !plan->bias && plan->src_dtype == plan->dst_dtype;
    bool contig = plan->src_stride[3] == 1 && plan->dst_stride[3] == 1 &&
                  (!plan->bias || plan->bias_stride[3] <= 1);
    snprintf(out, capacity,
             "-cl-std=CL1.2 -DSRC_T=%s -DDST_T=%s -DCOPY_RAW=%d -DHAS_BIAS=%d -DBIAS_T=%s "
             "-DCONTIG=%d -DALIGNED=%d -DIDX=%s -DPARTS=%d",
             dtype_token(plan->src_dtype), dtype_token(plan->dst_dtype), raw ? 1 : 0,
             plan->bias ? 1 : 0, dtype_token(plan->bias ? plan->bias->dtype : CLATTN_F32),
             contig ? 1 : 0, contig && aligned ? 1 : 0, wide ? "ulong" : "uint", parts);
    clattn__copy_tuning_options(tuning, out, capacity);
}

/* The arguments of a fused QKV split after copy4d's own: parts 1 and 2's destinations, and how
 * far each part starts past the one before in the source and the bias. */
static int set_part_args(cl_kernel kernel, cl_uint arg, const copy_plan plans[3], bool wide) {
    int status = CLATTN_SUCCESS;
    for (int p = 1; p < 3 && status == CLATTN_SUCCESS; ++p) {
        status = clattn__set_buffer_arg(kernel, arg++, plans[p].dst->buffer);
        if (status == CLATTN_SUCCESS)
            status = clattn__set_idx_arg(kernel, arg++, plans[p].dst_off, wide);
    }
    if (status == CLATTN_SUCCESS)
        status = clattn__set_idx_arg(kernel, arg++, plans[1].src_off - plans[0].src_off, wide);
    if (status == CLATTN_SUCCESS)
        status = clattn__set_idx_arg(kernel, arg++, plans[1].bias_off - plans[0].bias_off, wide);
    return status;
}

/* `run` is copy4d's; the transposes (NULL) have none. `parts` plans: 1, or 3 for a fused QKV split
 * (plans_fuse), which only copy4d takes. */
static int set_copy_args(cl_kernel kernel, const copy_plan *plan, int parts, const uint64_t *run,
                         bool wide) {
    int status = CLATTN_SUCCESS;
    cl_uint arg = 0;
    const struct {
        const clattn_tensor *t;
        uint64_t off;
        const int64_t *stride;
    } views[3] = {{plan->src, plan->src_off, plan->src_stride},
                  {plan->dst, plan->dst_off, plan->dst_stride},
                  {plan->bias, plan->bias_off, plan->bias_stride}};
    /* src, dst, the sizes, the run, then the optional bias: the order of copy4d's parameters. */
    for (int v = 0; v < 2 && status == CLATTN_SUCCESS; ++v) {
        status = clattn__set_buffer_arg(kernel, arg++, views[v].t->buffer);
        for (int i = -1; i < 4 && status == CLATTN_SUCCESS; ++i)
            status = clattn__set_idx_arg(kernel, arg++,
                                         i < 0 ? views[v].off : (uint64_t)views[v].stride[i], wide);
    }
    for (int i = 0; i < 4 && status == CLATTN_SUCCESS; ++i)
        status = clattn__set_idx_arg(kernel, arg++, (uint64_t)plan->n[i], wide);
    if (run && status == CLATTN_SUCCESS) status = clattn__set_idx_arg(kernel, arg++, *run, wide);
    if (plan->bias && status == CLATTN_SUCCESS) {
        status = clattn__set_buffer_arg(kernel, arg++, plan->bias->buffer);
        for (int i = -1; i < 4 && status == CLATTN_SUCCESS; ++i)
            status = clattn__set_idx_arg(
                kernel, arg++, i < 0 ? plan->bias_off : (uint64_t)plan->bias_stride[i], wide);
    }
    if (parts == 3 && status == CLATTN_SUCCESS) status = set_part_args(kernel, arg, plan, wide);
    return status;
}

/* The most work-groups a launch takes along grid dims 1 and 2: 65535, a GPU grid limit; the
 * kernels loop past it. A test lowers it (a hook) to run those loops on small tensors. */
static size_t grid_groups_at_most(size_t groups) {
    const int hooked = clattn__hook_value(CLATTN__HOOK_GRID_GROUPS);
    const size_t limit = hooked > 0 ? (size_t)hooked : 65535;
    return groups < limit ? groups : limit;
}

/* Builds `name` with `options` and runs it on a grid of items0 x items1 x (dims 0 and 1 of the
 * plan) work-items, in groups of at most `group`, dims 1 and 2 within grid_groups_at_most. */
static int launch(const copy_plan *plan, int parts, const char *name, const char *options,
                  bool wide, const uint64_t *run, size_t items0, size_t items1, size_t group,
                  const clattn__call *call) {
    cl_kernel kernel = NULL;
    int status =
        clattn__create_kernel(call->context, call->device, "heads.cl", options, name, &kernel);
    if (status != CLATTN_SUCCESS) return status;
    size_t max_group = 1;
    status = set_copy_args(kernel, plan, parts, run, wide);
    if (status == CLATTN_SUCCESS)
        status = clattn__kernel_max_group(kernel, call->device, &max_group);
    if (status == CLATTN_SUCCESS) {
        if (group > max_group) group = max_group;
        size_t local[3] = {clattn__pow2_at_least(items0, group), 1, 1};
        local[1] = clattn__pow2_at_least(items1, group / local[0]);
        const size_t groups1 = grid_groups_at_most((items1 + local[1] - 1) / local[1]);
        const size_t outer = grid_groups_at_most((size_t)(plan->n[0] * plan->n[1]));
        size_t global[3] = {clattn__round_up(items0, local[0]), groups1 * local[1], outer};
        status = clattn__enqueue(call, kernel, 3, global, local);
    }
    clattn__release_kernel(kernel);
    return status;
}

/* transpose4d's block edge (its VEC): the row's VEC, at most 8. A 16 x 16 block holds 256
 * values live: on PoCL it ran at 36% of the copy bandwidth where 8 x 8 ran at 43%, and offline
 * builds for GPUs took 256 VGPRs on gfx90a and spilled 456 registers on pvc. */
static clattn__copy_tuning transpose_block(clattn__copy_tuning params) {
    if (params.VEC > 8) params.VEC = 8;
    return params;
}

/* A transposed view: the destination's unit-stride dim is strided in the source, whose own
 * unit-stride dim is the next one out (plan_copy orders the dims so, unless a broadcast dim of
 * stride 0 comes between them: copy4d takes those). */
static bool plan_is_transposed(const copy_plan *plan) {
    return !plan->bias && plan->dst_stride[3] == 1 && plan->src_stride[3] > 1 &&
           plan->src_stride[2] == 1;
}

/* A transposed view whose two inner dims both span a whole block: transpose4d's. */
static bool plan_is_transpose(const copy_plan *plan, const clattn__copy_tuning *block) {
    return plan_is_transposed(plan) && plan->n[2] >= block->VEC && plan->n[3] >= block->VEC;
}

/* transpose4d (cl/heads.cl): a VEC x VEC block a work-item, the group along dim 3 first, as
 * copy4d's. Square groups (4 x 4 blocks) ran slower on PoCL: 11.4 ms against 10.0 for a
 * 1024 x 1024 f32 transpose of 32 heads, 11.8 against 8.8 in f16. */
static int enqueue_transpose(const copy_plan *plan, const clattn__copy_tuning *block, bool wide,
                             const clattn__call *call) {
    char options[256];
    plan_options(plan, 1, block, wide, false, options, sizeof options);
    size_t vec = (size_t)block->VEC;
    return launch(plan, 1, "transpose4d", options, wide, NULL, ((size_t)plan->n[3] + vec - 1) / vec,
                  ((size_t)plan->n[2] + vec - 1) / vec, (size_t)block->GROUP, call);
}

/* transpose_tiles (cl/heads.cl, whose TILE and TILE_ROWS these are): a group of TILE x
 * TILE_ROWS moves TILE x TILE tiles through local memory. *taken is false, and nothing
 * enqueued, where the kernel's groups cannot hold that many work-items or the local memory (under
 * CLATTN_MAX_LOCAL_MEMORY) a tile: transpose4d, in the same program, takes the copy then. */
enum { TILE = 32, TILE_ROWS = 8 };
static int enqueue_tiles(const copy_plan *plan, const clattn__copy_tuning *block, bool wide,
                         const clattn__call *call, bool *taken) {
    char options[256];
    plan_options(plan, 1, block, wide, false, options, sizeof options);
    cl_kernel kernel = NULL;
    size_t max_group = 0;
    *taken = false;
    int status = clattn__create_kernel(call->context, call->device, "heads.cl", options,
                                       "transpose_tiles", &kernel);
    if (status == CLATTN_SUCCESS)
        status = clattn__kernel_max_group(kernel, call->device, &max_group);
    const cl_ulong tile_bytes = TILE * (TILE + 1) * sizeof(float);
    if (status == CLATTN_SUCCESS && max_group >= TILE * TILE_ROWS &&
        clattn__device_local_bytes(call->device) >= tile_bytes) {
        *taken = true;
        const size_t tiles2 = grid_groups_at_most(((size_t)plan->n[2] + TILE - 1) / TILE);
        const size_t local[3] = {TILE, TILE_ROWS, 1};
        const size_t global[3] = {clattn__round_up((size_t)plan->n[3], TILE), tiles2 * TILE_ROWS,
                                  grid_groups_at_most((size_t)(plan->n[0] * plan->n[1]))};
        status = set_copy_args(kernel, plan, 1, NULL, wide);
        if (status == CLATTN_SUCCESS) status = clattn__enqueue(call, kernel, 3, global, local);
    }
    clattn__release_kernel(kernel);
    return status;
}

/* copy4d (cl/heads.cl): runs of each row a work-item, vector accesses where rows are
 * contiguous; `parts` plans, 1 or a fused QKV split's 3. */
static int enqueue_rows(const copy_plan *plan, int parts, const clattn__copy_tuning *params,
                        bool wide, const clattn__call *call) {
    bool aligned = true;
    for (int p = 0; p < parts; ++p)
        aligned = aligned && plan_is_aligned(&plan[p], params->VEC, call->device);
    char options[256];
    plan_options(plan, parts, params, wide, aligned, options, sizeof options);
    /* a run is a whole number of vectors, so only the last run of a row has a scalar tail */
    size_t run = clattn__round_up((size_t)plan->n[3], (size_t)params->VEC);
    if (run > (size_t)params->RUN) run = clattn__round_up((size_t)params->RUN, (size_t)params->VEC);
    const uint64_t run_arg = run;
    return launch(plan, parts, "copy4d", options, wide, &run_arg,
                  ((size_t)plan->n[3] + run - 1) / run, (size_t)(parts * plan->n[2]),
                  (size_t)params->GROUP, call);
}

/* The copy's plan: its dims simplified, 16-bit elements paired where they can be. */
static void plan_for(const clattn_tensor *src, const clattn_tensor *bias, const clattn_tensor *dst,
                     copy_plan *plan) {
    plan_copy(src, bias, dst, plan);
    pair_16bit_elements(plan);
}

/* Enqueues `parts` plans (1, or 3 that plans_fuse accepted) as one kernel, with the launch shape
 * of the tuning table's copy row for the device (tuning_table.def). */
static int enqueue_plans(const copy_plan *plan, int parts, const clattn__call *call) {
    clattn__copy_tuning params;
    int status = clattn__copy_tuning_get(call->device, plan->src->dtype, &params);
    if (status != CLATTN_SUCCESS) return status;
    bool wide = false;
    for (int p = 0; p < parts; ++p) wide = wide || plan_needs_wide_index(&plan[p]);
    const clattn__copy_tuning block = transpose_block(params);
    /* (inner dims under a block go to copy4d, with or without tiles: most of a tile's group
     * would idle) */
    if (parts == 1 && plan_is_transpose(plan, &block)) {
        bool taken = false;
        if (params.TILES) status = enqueue_tiles(plan, &block, wide, call, &taken);
        return status != CLATTN_SUCCESS || taken ? status
                                                 : enqueue_transpose(plan, &block, wide, call);
    }
    return enqueue_rows(plan, parts, &params, wide, call);
}

int clattn__copy_enqueue(const clattn_tensor *src, const clattn_tensor *bias,
                         const clattn_tensor *dst, const clattn__call *call) {
    copy_plan plan;
    plan_for(src, bias, dst, &plan);
    return enqueue_plans(&plan, 1, call);
}

/* The three plans of a packed QKV split can run as one copy4d: they differ only in where they
 * start (same dtypes, sizes and strides; each part's source and bias equally far past the part
 * before), and they are not transposes (transpose4d takes one view a launch). */
static bool plans_fuse(const copy_plan plans[3]) {
    const copy_plan *a = &plans[0];
    if (plan_is_transposed(a)) return false;
    for (int p = 1; p < 3; ++p) {
        const copy_plan *b = &plans[p];
        bool same = a->src_dtype == b->src_dtype && a->dst_dtype == b->dst_dtype &&
                    a->dst->dtype == b->dst->dtype && (a->bias == NULL) == (b->bias == NULL);
        for (int i = 0; i < 4 && same; ++i)
            same = a->n[i] == b->n[i] && a->src_stride[i] == b->src_stride[i] &&
                   a->dst_stride[i] == b->dst_stride[i] && a->bias_stride[i] == b->bias_stride[i];
        if (!same || b->src_off < b[-1].src_off || b->bias_off < b[-1].bias_off) return false;
    }
    return plans[2].src_off - plans[1].src_off == plans[1].src_off - plans[0].src_off &&
           plans[2].bias_off - plans[1].bias_off == plans[1].bias_off - plans[0].bias_off;
}

/* The checks clattn_copy makes; split/merge/qkv run them on the views they build. */
static int check_copy(const char *src_name, const clattn_tensor *src, const clattn_tensor *bias,
                      const char *dst_name, const clattn_tensor *dst, cl_context context) {
    int status = clattn__check_tensor(src_name, src, context, CLATTN__FLOAT_DTYPES, false);
    if (status == CLATTN_SUCCESS && bias)
        status = clattn__check_tensor("bias", bias, context, CLATTN__FLOAT_DTYPES, false);
    if (status == CLATTN_SUCCESS)
        status = clattn__check_tensor(dst_name, dst, context, CLATTN__FLOAT_DTYPES, true);
    if (status == CLATTN_SUCCESS) status = clattn__check_same_shape(src_name, src, dst_name, dst);
    if (status == CLATTN_SUCCESS && bias)
        status = clattn__check_same_shape("bias", bias, dst_name, dst);
    if (status == CLATTN_SUCCESS) status = clattn__check_no_alias(dst_name, dst, src_name, src);
    if (status == CLATTN_SUCCESS) status = clattn__check_no_alias(dst_name, dst, "bias", bias);
    return status;
}

int clattn_copy(const clattn_tensor *src, const clattn_tensor *bias, const clattn_tensor *dst,
                cl_command_queue queue, cl_uint num_wait, const cl_event *wait_list,
                cl_event *event) {
    clattn__call call;
    int status = clattn__begin_call(&call, queue, num_wait, wait_list, event);
    if (status == CLATTN_SUCCESS) status = check_copy("src", src, bias, "dst", dst, call.context);
    if (status != CLATTN_SUCCESS) return status;
    return clattn__copy_enqueue(src, bias, dst, &call);
}

/* ---- views ---- */

/* A packed [B,S,parts*H*D] tensor: a valid input (or output) whose shape is {1,B,S,E} with E a
 * multiple of parts x num_heads. */
static int check_packed(const char *name, const clattn_tensor *x, int num_heads, int64_t parts,
                        cl_context context, bool is_output) {
    int status = clattn__check_tensor(name, x, context, CLATTN__FLOAT_DTYPES, is_output);
    if (status != CLATTN_SUCCESS) return status;
    if (num_heads <= 0)
        return clattn__fail(CLATTN_ERR_INVALID_ARGUMENT, "num_heads = %d, must be > 0", num_heads);
    if (x->shape[0] != 1)
        return clattn__fail(CLATTN_ERR_SHAPE_MISMATCH,
                            "%s: a [B,S,E] tensor has shape {1,B,S,E}, but shape[0] is %lld", name,
                            (long long)x->shape[0]);
    if (x->shape[3] % (parts * num_heads) != 0)
        return clattn__fail(CLATTN_ERR_SHAPE_MISMATCH,
                            "%s: last dim %lld is not a multiple of %lld x num_heads (%d)", name,
                            (long long)x->shape[3], (long long)parts, num_heads);
    return CLATTN_SUCCESS;
}

/* The [B,H,S,D] view of part `part` (0 for q, 1 for k, 2 for v) of a packed [B,S,parts*H*D]
 * tensor {1,B,S,parts*H*D}: element [b,h,s,d] is x[b, s, part*H*D + h*D + d]. */
static clattn_tensor heads_view(const clattn_tensor *x, int num_heads, int64_t parts,
                                int64_t part) {
    int64_t head_dim = x->shape[3] / parts / num_heads;
    clattn_tensor v = *x;
    v.offset = x->offset + (size_t)(part * num_heads * head_dim * x->strides[3]);
    v.shape[0] = x->shape[1];
    v.shape[1] = num_heads;
    v.shape[2] = x->shape[2];
    v.shape[3] = head_dim;
    v.strides[0] = x->strides[1];
    v.strides[1] = head_dim * x->strides[3];
    v.strides[2] = x->strides[2];
    v.strides[3] = x->strides[3];
    return v;
}

int clattn_split_heads(const clattn_tensor *x, int num_heads, const clattn_tensor *out,
                       cl_command_queue queue, cl_uint num_wait, const cl_event *wait_list,
                       cl_event *event) {
    clattn__call call;
    int status = clattn__begin_call(&call, queue, num_wait, wait_list, event);
    if (status == CLATTN_SUCCESS) status = check_packed("x", x, num_heads, 1, call.context, false);
    if (status != CLATTN_SUCCESS) return status;
    clattn_tensor view = heads_view(x, num_heads, 1, 0);
    status = check_copy("x", &view, NULL, "out", out, call.context);
    if (status != CLATTN_SUCCESS) return status;
    return clattn__copy_enqueue(&view, NULL, out, &call);
}

int clattn_merge_heads(const clattn_tensor *x, const clattn_tensor *out, cl_command_queue queue,
                       cl_uint num_wait, const cl_event *wait_list, cl_event *event) {
    clattn__call call;
    int status = clattn__begin_call(&call, queue, num_wait, wait_list, event);
    if (status == CLATTN_SUCCESS)
        status = clattn__check_tensor("x", x, call.context, CLATTN__FLOAT_DTYPES, false);
    if (status == CLATTN_SUCCESS && x->shape[1] > 0x7fffffff)
        status = clattn__fail(CLATTN_ERR_DEVICE_LIMIT, "x: %lld heads is too many",
                              (long long)x->shape[1]);
    if (status != CLATTN_SUCCESS) return status;
    int num_heads = (int)x->shape[1];
    status = check_packed("out", out, num_heads, 1, call.context, true);
    if (status != CLATTN_SUCCESS) return status;
    clattn_tensor view = heads_view(out, num_heads, 1, 0);
    status = check_copy("x", x, NULL, "out", &view, call.context);
    if (status != CLATTN_SUCCESS) return status;
    return clattn__copy_enqueue(x, NULL, &view, &call);
}

/* The bias of a packed QKV split: shape {1,1,1,3*H*D}, seen as [B,H,S,D] broadcast over B and S
 * for part `part`. */
static clattn_tensor qkv_bias_view(const clattn_tensor *bias, const clattn_tensor *x, int num_heads,
                                   int64_t part) {
    clattn_tensor v = heads_view(bias, num_heads, 3, part);
    v.shape[0] = x->shape[1];
    v.shape[2] = x->shape[2];
    v.strides[0] = 0;
    v.strides[2] = 0;
    return v;
}

static int check_qkv(const clattn_tensor *x, const clattn_tensor *bias, int num_heads,
                     const clattn_tensor *const outs[3], cl_context context) {
    static const char *const names[3] = {"q", "k", "v"};
    int status = check_packed("x", x, num_heads, 3, context, false);
    if (status == CLATTN_SUCCESS && bias) {
        status = check_packed("bias", bias, num_heads, 3, context, false);
        if (status == CLATTN_SUCCESS &&
            (bias->shape[1] != 1 || bias->shape[2] != 1 || bias->shape[3] != x->shape[3]))
            status = clattn__fail(CLATTN_ERR_SHAPE_MISMATCH,
                                  "bias: shape must be {1,1,1,%lld} (one value per packed column)",
                                  (long long)x->shape[3]);
    }
    for (int p = 0; p < 3 && status == CLATTN_SUCCESS; ++p) {
        clattn_tensor src = heads_view(x, num_heads, 3, p);
        clattn_tensor bias_view = bias ? qkv_bias_view(bias, x, num_heads, p) : src;
        status = check_copy("x", &src, bias ? &bias_view : NULL, names[p], outs[p], context);
        for (int o = 0; o < p && status == CLATTN_SUCCESS; ++o)
            status = clattn__check_no_alias(names[p], outs[p], names[o], outs[o]);
    }
    return status;
}

/* The three copies as separate launches; when the caller wants an event, a marker joins
 * theirs. */
static int enqueue_qkv_parts(const copy_plan plans[3], const clattn__call *call) {
    cl_event parts[3] = {NULL, NULL, NULL};
    int status = CLATTN_SUCCESS;
    for (int p = 0; p < 3 && status == CLATTN_SUCCESS; ++p) {
        clattn__call part = *call;
        part.event = call->event ? &parts[p] : NULL;
        status = enqueue_plans(&plans[p], 1, &part);
    }
    if (status == CLATTN_SUCCESS && call->event) {
        cl_int err = clEnqueueMarkerWithWaitList(call->queue, 3, parts, call->event);
        if (err != CL_SUCCESS) {
            *call->event = NULL;
            status = clattn__cl_fail(err, "clEnqueueMarkerWithWaitList");
        }
    }
    for (int p = 0; p < 3; ++p)
        if (parts[p]) clReleaseEvent(parts[p]);
    return status;
}

/* One launch when q, k and v share a layout and dtype (plans_fuse): it reads each packed row
 * once, in memory order. Otherwise three. */
static int enqueue_qkv(const clattn_tensor *x, const clattn_tensor *bias, int num_heads,
                       const clattn_tensor *const outs[3], const clattn__call *call) {
    clattn_tensor src[3], bias_views[3];
    copy_plan plans[3];
    for (int p = 0; p < 3; ++p) {
        src[p] = heads_view(x, num_heads, 3, p);
        if (bias) bias_views[p] = qkv_bias_view(bias, x, num_heads, p);
        plan_for(&src[p], bias ? &bias_views[p] : NULL, outs[p], &plans[p]);
    }
    if (plans_fuse(plans)) return enqueue_plans(plans, 3, call);
    return enqueue_qkv_parts(plans, call);
}

int clattn_split_qkv(const clattn_tensor *x, const clattn_tensor *bias, int num_heads,
                     const clattn_tensor *q, const clattn_tensor *k, const clattn_tensor *v,
                     cl_command_queue queue, cl_uint num_wait, const cl_event *wait_list,
                     cl_event *event) {
    const clattn_tensor *const outs[3] = {q, k, v};
    clattn__call call;
    int status = clattn__begin_call(&call, queue, num_wait, wait_list, event);
    if (status == CLATTN_SUCCESS) status = check_qkv(x, bias, num_heads, outs, call.context);
    if (status != CLATTN_SUCCESS) return status;
    return enqueue_qkv(x, bias, num_heads, outs, &call);
}
