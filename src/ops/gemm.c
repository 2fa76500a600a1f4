/*
 * The GEMM every op runs (ops/gemm.h): the device's matmul row picks clattn's micro-kernel or
 * CLBlast. The kernel packs b into scratch (matmul_pack), then multiplies (matmul_tiles); the
 * two are chained by an event, so an out-of-order queue runs them in order too. 16-bit storage
 * may take matmul_mma instead (clattn__gemm_units_available): one kernel, a group of 4 subgroups
 * of the device's matrix unit (clattn__matrix_tile) per block of outputs; so may f32, on NVIDIA's
 * tf32 unit (3xTF32), where the matmul row's UNIT_F32 asks and the probes found it.
 */
#include "gemm.h"
#include "runtime/device_facts.h"
#include "runtime/matrix_units.h"

#include <limits.h>
#include <stdio.h>

typedef clattn__matmul_tuning matmul_tuning;

/* The kernel's launch for an m x n product: row blocks of MR, panels of NR = NV * VEC columns,
 * PANELS panels a work-item. */
typedef struct matmul_grid {
    size_t nr, blocks, panels, groups;
} matmul_grid;

static matmul_grid grid_of(const matmul_tuning *t, size_t m, size_t n) {
    matmul_grid g;
    g.nr = (size_t)(t->NV * t->VEC);
    g.blocks = (m + (size_t)t->MR - 1) / (size_t)t->MR;
    g.panels = (n + g.nr - 1) / g.nr;
    g.groups = (g.panels + (size_t)t->PANELS - 1) / (size_t)t->PANELS;
    return g;
}

/* Whether the kernel can take the call: its work-items and sizes are numbered with int. */
static bool kernel_takes(const matmul_grid *g, size_t m, size_t n, size_t k, size_t batch) {
    if (m == 0 || n == 0 || k == 0 || batch == 0) return false;
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX || batch > INT_MAX) return false;
    return g->blocks * g->groups <= INT_MAX / batch && g->panels * k <= INT_MAX / batch;
}

/* A matrix argument as cl/matmul.cl takes it: buffer, then offset, ld and stride as ulong. */
static int set_matrix_args(cl_kernel kernel, cl_uint *arg, const clattn__matrices *m) {
    const cl_ulong offs[3] = {m->offset, m->ld, m->stride};
    int status = clattn__set_buffer_arg(kernel, (*arg)++, m->buffer);
    for (int i = 0; i < 3 && status == CLATTN_SUCCESS; ++i)
        status = clattn__set_ulong_arg(kernel, (*arg)++, offs[i]);
    return status;
}

static int pack_b(const clattn__call *call, const char *options, bool trans_b, size_t n, size_t k,
                  const clattn__matrices *b, size_t batch, cl_mem packed, size_t items,
                  cl_event *done) {
    cl_kernel kernel = NULL;
    int status = clattn__create_kernel(call->context, call->device, "matmul.cl", options,
                                       "matmul_pack", &kernel);
    const int64_t sizes[3] = {(int64_t)n, (int64_t)k, (int64_t)batch};
    cl_uint arg = 0;
    if (status == CLATTN_SUCCESS) status = set_matrix_args(kernel, &arg, b);
    if (status == CLATTN_SUCCESS) status = clattn__set_int_arg(kernel, arg++, trans_b);
    if (status == CLATTN_SUCCESS) status = clattn__set_buffer_arg(kernel, arg++, packed);
    if (status == CLATTN_SUCCESS) status = clattn__set_int_args(kernel, &arg, sizes, 3);
    if (status == CLATTN_SUCCESS)
        status = clattn__enqueue_items(call, kernel, items, 64, done, false);
    clattn__release_kernel(kernel);
    return status;
}

static int multiply(const clattn__call *call, const char *options, const matmul_grid *g, size_t m,
                    size_t n, size_t k, const clattn__matrices *a, cl_mem packed, float beta,
                    const clattn__matrices *c, size_t batch, cl_event *packed_done) {
    cl_kernel kernel = NULL;
    int status = clattn__create_kernel(call->context, call->device, "matmul.cl", options,
                                       "matmul_tiles", &kernel);
    const int64_t sizes[3] = {(int64_t)m, (int64_t)n, (int64_t)k};
    cl_uint arg = 0;
    if (status == CLATTN_SUCCESS) status = set_matrix_args(kernel, &arg, a);
    if (status == CLATTN_SUCCESS) status = clattn__set_buffer_arg(kernel, arg++, packed);
    if (status == CLATTN_SUCCESS) status = set_matrix_args(kernel, &arg, c);
    if (status == CLATTN_SUCCESS) status = clattn__set_int_args(kernel, &arg, sizes, 3);
    if (status == CLATTN_SUCCESS) status = clattn__set_float_arg(kernel, arg++, beta);
    if (status == CLATTN_SUCCESS) status = clattn__set_int_arg(kernel, arg++, (cl_int)batch);
    if (status == CLATTN_SUCCESS) {
        const size_t global = g->blocks * g->groups * batch;
        status = clattn__fault_hit(CLATTN__FAULT_GEMM)
                     ? clattn__cl_fail(CL_OUT_OF_RESOURCES, "clEnqueueNDRangeKernel (matmul_tiles)")
                     : clattn__enqueue_link(call, kernel, global, 1, packed_done, true);
    }
    clattn__release_kernel(kernel);
    return status;
}

/* The micro-kernel: b packed into fresh scratch, then the product (groups of one, its
 * reqd_work_group_size), chained by an event; the call's wait list and event stay unused, as
 * clattn__gemm_batched promises. */
static int matmul_batched(const clattn__call *call, const matmul_tuning *t, const matmul_grid *g,
                          bool trans_b, size_t m, size_t n, size_t k, const clattn__matrices *a,
                          const clattn__matrices *b, float beta, const clattn__matrices *c,
                          size_t batch) {
    char options[256];
    snprintf(options, sizeof options, "-cl-std=CL1.2");
    clattn__matmul_tuning_options(t, options, sizeof options);
    const clattn__call chain = {call->queue, call->context, call->device, 0, NULL, NULL};
    const size_t items = batch * g->panels * k;
    cl_mem packed = NULL;
    cl_event packed_done = NULL;
    int status = clattn__scratch_alloc(call->context, items * g->nr * sizeof(float), &packed);
    if (status == CLATTN_SUCCESS)
        status = pack_b(&chain, options, trans_b, n, k, b, batch, packed, items, &packed_done);
    if (status == CLATTN_SUCCESS)
        status = multiply(&chain, options, g, m, n, k, a, packed, beta, c, batch, &packed_done);
    if (packed_done) clReleaseEvent(packed_done);
    if (packed) clReleaseMemObject(packed);
    return status;
}

int clattn__gemm_prepare(const clattn__call *call) {
    matmul_tuning t;
    int status = clattn__matmul_tuning_get(call->device, CLATTN_F32, &t);
    if (status == CLATTN_SUCCESS && t.KERNEL == 0) status = clattn__blas_prepare(call->device);
    clattn__tile tile; /* the probes' answer, cached for the GEMMs */
    if (status == CLATTN_SUCCESS && t.UNIT_F32)
        status = clattn__matrix_tile(call, CLATTN_F32, &tile);
    return status;
}

/* ---- matmul_mma: 16-bit storage on matrix units, f32 on the tf32 unit ---- */

#define MM_SUBGROUPS 4 /* matmul_mma: a group of 4 subgroups */

/* Bytes of local memory matmul_mma declares (cl/matmul.cl) for values of `size` bytes: the
 * slices of a and b (rows of 32 values and n-major b, or 32 rows of a block's columns, 4 words
 * over each row; f32's k-major b 8) and the products' scratch. */
static cl_ulong mm_local_bytes(const matmul_tuning *t, size_t size, bool trans_b,
                               const clattn__tile *tile, bool emulated) {
    const cl_ulong rows_a = 2 * (cl_ulong)t->UNIT_M, cols_b = 2 * (cl_ulong)t->UNIT_N;
    const cl_ulong per_word = 4 / size, slice_words = 32 / per_word + 4;
    const cl_ulong words_b =
        trans_b ? cols_b * slice_words : 32 * (cols_b / per_word + (size == 4 ? 8 : 4));
    return 4 * (rows_a * slice_words + words_b +
                MM_SUBGROUPS * clattn__tile_scratch_floats(tile, emulated));
}

/* matmul_mma's work-groups for one m x n matrix: blocks of 2 UNIT_M rows by 2 UNIT_N columns. */
static size_t mm_blocks(const matmul_tuning *t, size_t m, size_t n) {
    const size_t bm = 2 * (size_t)t->UNIT_M, bn = 2 * (size_t)t->UNIT_N;
    return ((m + bm - 1) / bm) * ((n + bn - 1) / bn);
}

/* clattn__gemm_units_available under the matmul row `t` already read. */
static int units_take(const clattn__call *call, const matmul_tuning *t, clattn_dtype in, size_t m,
                      size_t n, size_t k, size_t batch, bool *takes) {
    *takes = false;
    const bool f32 = in == CLATTN_F32;
    if (!(f32 ? t->UNIT_F32 : t->UNITS) || (in != CLATTN_F16 && in != CLATTN_BF16 && !f32))
        return CLATTN_SUCCESS;
    const size_t limit = INT_MAX - 256;
    if (m == 0 || n == 0 || k == 0 || batch == 0 || m > limit || n > limit || k > limit ||
        mm_blocks(t, m, n) > limit / batch)
        return CLATTN_SUCCESS;
    clattn__tile tile;
    const int status = clattn__matrix_tile(call, in, &tile);
    if (status != CLATTN_SUCCESS || !tile.unit) return status;
    const bool emulated = clattn__matrix_units_emulated();
    const cl_ulong local = clattn__device_local_bytes(call->device);
    const size_t size = clattn_dtype_size(in);
    *takes = clattn__device_max_group(call->device) >= (size_t)(MM_SUBGROUPS * tile.subgroup) &&
             mm_local_bytes(t, size, true, &tile, emulated) <= local &&
             mm_local_bytes(t, size, false, &tile, emulated) <= local;
    return status;
}

int clattn__gemm_units_available(const clattn__call *call, clattn_dtype in, size_t m, size_t n,
                                 size_t k, size_t batch, bool *takes) {
    matmul_tuning t;
    *takes = false;
    const int status = clattn__matmul_tuning_get(call->device, in, &t);
    return status == CLATTN_SUCCESS ? units_take(call, &t, in, m, n, k, batch, takes) : status;
}

/* Every offset, leading dim and stride of a and b a multiple of 16 bytes of `size`-byte elements:
 * each 16-byte chunk that lies whole in a row is one load (buffers are aligned far beyond that). */
static bool rows_aligned(const clattn__matrices *a, const clattn__matrices *b, size_t size) {
    const size_t all[6] = {a->offset, a->ld, a->stride, b->offset, b->ld, b->stride};
    for (int i = 0; i < 6; ++i)
        if (all[i] % (16 / size) != 0) return false;
    return true;
}

/* One past the last element of x's `batch` matrices of rows x cols (row-major, ld apart). */
static uint64_t matrix_end(const clattn__matrices *x, size_t batch, size_t rows, size_t cols) {
    return (uint64_t)x->offset + (uint64_t)(batch - 1) * x->stride + (uint64_t)(rows - 1) * x->ld +
           cols;
}

/* Whether an element index of a, op(b), c or the bias row reaches the narrow limit (2^31):
 * matmul_mma then indexes in ulong (IDX), else in uint. */
static bool mm_needs_wide_index(bool trans_b, size_t m, size_t n, size_t k,
                                const clattn__matrices *a, const clattn__matrices *b,
                                const clattn__bias_row *bias, const clattn__matrices *c,
                                size_t batch) {
    const uint64_t ends[4] = {matrix_end(a, batch, m, k),
                              trans_b ? matrix_end(b, batch, n, k) : matrix_end(b, batch, k, n),
                              matrix_end(c, batch, m, n),
                              bias ? (uint64_t)bias->offset + (uint64_t)(n - 1) * bias->step + 1
                                   : 0};
    for (int i = 0; i < 4; ++i)
        if (ends[i] > clattn__narrow_index_limit()) return true;
    return false;
}

/* matmul_mma's last arguments: the bias row, or (HAS_BIAS 0) c's buffer in its place, unread. */
static int set_bias_args(cl_kernel kernel, cl_uint *arg, const clattn__bias_row *bias,
                         const clattn__matrices *c) {
    const cl_mem buffer = bias ? bias->buffer : c->buffer;
    const cl_ulong offs[2] = {bias ? bias->offset : 0, bias ? bias->step : 0};
    int status = clattn__set_buffer_arg(kernel, (*arg)++, buffer);
    for (int i = 0; i < 2 && status == CLATTN_SUCCESS; ++i)
        status = clattn__set_ulong_arg(kernel, (*arg)++, offs[i]);
    return status;
}

int clattn__gemm_units_batched(const clattn__call *call, clattn_dtype in, clattn_dtype out,
                               bool trans_b, size_t m, size_t n, size_t k,
                               const clattn__matrices *a, const clattn__matrices *b,
                               const clattn__bias_row *bias, float beta, const clattn__matrices *c,
                               size_t batch) {
    matmul_tuning t;
    clattn__tile tile;
    int status = clattn__matmul_tuning_get(call->device, in, &t);
    if (status == CLATTN_SUCCESS) status = clattn__matrix_tile(call, in, &tile);
    if (status != CLATTN_SUCCESS) return status;
    if (!tile.unit)
        return clattn__fail(CLATTN_ERR_UNSUPPORTED_DTYPE, "matmul_mma: no matrix unit for %s",
                            clattn_dtype_name(in));
    char options[384];
    int used =
        snprintf(options, sizeof options,
                 "-cl-std=CL1.2 -DMATMUL_MMA=1 -DMMA_T=%s -DC_T=%s -DMMA_UNIT=%d "
                 "-DMMA_NATIVE=%d -DTRANS_B=%d -DALIGNED=%d -DHAS_BIAS=%d -DBIAS_T=%s "
                 "-DIDX=%s",
                 clattn_dtype_name(in), clattn_dtype_name(out), tile.unit,
                 clattn__matrix_units_emulated() ? 0 : 1, trans_b ? 1 : 0,
                 rows_aligned(a, b, clattn_dtype_size(in)) ? 1 : 0, bias ? 1 : 0,
                 clattn_dtype_name(bias ? bias->dtype : CLATTN_F32),
                 mm_needs_wide_index(trans_b, m, n, k, a, b, bias, c, batch) ? "ulong" : "uint");
    if (used > 0 && (size_t)used < sizeof options)
        clattn__matmul_tuning_options(&t, options, sizeof options);
    cl_kernel kernel = NULL;
    status = clattn__create_kernel(call->context, call->device, "matmul.cl", options, "matmul_mma",
                                   &kernel);
    const int64_t sizes[3] = {(int64_t)m, (int64_t)n, (int64_t)k};
    cl_uint arg = 0;
    if (status == CLATTN_SUCCESS) status = set_matrix_args(kernel, &arg, a);
    if (status == CLATTN_SUCCESS) status = set_matrix_args(kernel, &arg, b);
    if (status == CLATTN_SUCCESS) status = set_matrix_args(kernel, &arg, c);
    if (status == CLATTN_SUCCESS) status = clattn__set_int_args(kernel, &arg, sizes, 3);
    if (status == CLATTN_SUCCESS) status = clattn__set_float_arg(kernel, arg++, beta);
    if (status == CLATTN_SUCCESS) status = set_bias_args(kernel, &arg, bias, c);
    if (status == CLATTN_SUCCESS) {
        const size_t local = (size_t)(MM_SUBGROUPS * tile.subgroup);
        const size_t global = batch * mm_blocks(&t, m, n) * local;
        const clattn__call step = clattn__step_call(call); /* no event, no wait: the caller's */
        status = clattn__fault_hit(CLATTN__FAULT_GEMM)
                     ? clattn__cl_fail(CL_OUT_OF_RESOURCES, "clEnqueueNDRangeKernel (matmul_mma)")
                     : clattn__enqueue(&step, kernel, 1, &global, &local);
    }
    clattn__release_kernel(kernel);
    return status;
}

int clattn__gemm_batched(const clattn__call *call, bool trans_b, size_t m, size_t n, size_t k,
                         const clattn__matrices *a, const clattn__matrices *b, float beta,
                         const clattn__matrices *c, size_t batch) {
    matmul_tuning t;
    bool units = false;
    int status = clattn__matmul_tuning_get(call->device, CLATTN_F32, &t);
    if (status == CLATTN_SUCCESS) status = units_take(call, &t, CLATTN_F32, m, n, k, batch, &units);
    if (status != CLATTN_SUCCESS) return status;
    if (units)
        return clattn__gemm_units_batched(call, CLATTN_F32, CLATTN_F32, trans_b, m, n, k, a, b,
                                          NULL, beta, c, batch);
    const matmul_grid g = grid_of(&t, m, n);
    if (t.KERNEL == 1 && kernel_takes(&g, m, n, k, batch))
        return matmul_batched(call, &t, &g, trans_b, m, n, k, a, b, beta, c, batch);
    return clattn__sgemm_batched(call, trans_b, m, n, k, a, b, beta, c, batch);
}
