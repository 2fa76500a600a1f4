/* Tests of the multi-head reshape ops (src/ops/heads.c, cl/heads.cl) against the host reference. */
#include "harness.h"
#include "runtime/runtime.h"
#include "runtime/testing.h"
#include "ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const clattn_dtype float_dtypes[3] = {CLATTN_F32, CLATTN_F16, CLATTN_BF16};
/* A permutation that swaps the two inner dims: a transposed view. */
static const int swap_inner[4] = {0, 1, 3, 2};

/* Bytes a buffer needs to hold the view, plus a margin that must stay untouched. */
#define MARGIN 5
static size_t view_bytes(const clattn_tensor *v) {
    uint64_t last = v->offset;
    for (int i = 0; i < 4; ++i) last += (uint64_t)((v->shape[i] - 1) * v->strides[i]);
    return (size_t)(last + 1 + MARGIN) * clattn_dtype_size(v->dtype);
}

/* Random values with the edge cases sprinkled in: signed zeros, infinities, a NaN with a
 * payload, the f16 overflow and rounding boundaries, f16 subnormals, ties. */
static void fill_random(void *host, clattn_dtype dtype, size_t count, uint64_t seed) {
    static const uint32_t special_f32[] = {0x00000000u,
                                           0x80000000u,
                                           0x7f800000u,
                                           0xff800000u,
                                           0x7fc12345u,
                                           0xffa00001u,
                                           0x477fe000u /* 65504 */,
                                           0x477ff000u /* 65520 -> f16 inf */,
                                           0x477fefffu,
                                           0x33800000u /* 2^-24 */,
                                           0x33000000u /* 2^-25, ties to 0 */,
                                           0x33c00000u,
                                           0x3f801000u /* f16 tie */,
                                           0x3f808000u /* bf16 tie, even */,
                                           0x3f818000u /* bf16 tie, odd */,
                                           0x7f7fffffu /* FLT_MAX -> bf16 inf */,
                                           0x00000001u /* f32 subnormal */};
    uint64_t state = seed * 2654435761u + 1;
    size_t size = clattn_dtype_size(dtype);
    for (size_t i = 0; i < count; ++i) {
        uint64_t r = test_rand_u64(&state);
        if (size == 2) { /* every 16-bit pattern is a value worth converting */
            ((uint16_t *)host)[i] = (uint16_t)r;
        } else if (r % 7 == 0) {
            ((uint32_t *)host)[i] = special_f32[(r >> 8) % (sizeof special_f32 / 4)];
        } else {
            ((float *)host)[i] =
                test_rand_uniform(&state, -70000.0f, 70000.0f) / (float)(1u << (r >> 32) % 24);
        }
    }
}

typedef struct device_view {
    clattn_tensor view; /* buffer set */
    void *host;         /* the whole buffer's image */
    size_t bytes;
} device_view;

static bool make_view(test_ctx *t, clattn_tensor view, uint64_t seed, bool sentinel,
                      device_view *out) {
    out->view = view;
    out->bytes = view_bytes(&view);
    out->host = malloc(out->bytes);
    out->view.buffer = test_buffer(t, out->bytes);
    if (!out->host || !out->view.buffer) return false;
    if (sentinel)
        memset(out->host, 0x5a, out->bytes);
    else
        fill_random(out->host, view.dtype, out->bytes / clattn_dtype_size(view.dtype), seed);
    return test_write(t, out->view.buffer, out->host, out->bytes);
}

static void free_view(device_view *v) {
    if (v->view.buffer) clReleaseMemObject(v->view.buffer);
    free(v->host);
    memset(v, 0, sizeof *v);
}

/* Reads `got` back and compares every element of its buffer (margin and gaps included) with
 * `expected`. NaN == NaN is allowed only where the library converts. */
static bool compare_buffer(test_ctx *t, const device_view *got, const void *expected,
                           bool nan_equal, const char *what) {
    void *back = malloc(got->bytes);
    if (!back || !test_read(t, got->view.buffer, back, got->bytes)) {
        free(back);
        return false;
    }
    size_t count = got->bytes / clattn_dtype_size(got->view.dtype);
    for (size_t i = 0; i < count; ++i)
        if (!ref_same_element(back, expected, got->view.dtype, i, nan_equal)) {
            test_fail_at(t, __FILE__, __LINE__,
                         "%s: element %zu of the %s buffer: got %.9g, expected %.9g", what, i,
                         clattn_dtype_name(got->view.dtype), ref_load(back, got->view.dtype, i),
                         ref_load(expected, got->view.dtype, i));
            free(back);
            return false;
        }
    free(back);
    return true;
}

/* Runs clattn_copy(src (+ bias) -> dst) on fresh buffers and checks the whole dst buffer. */
static void check_copy_case(test_ctx *t, clattn_tensor src, const clattn_tensor *bias,
                            clattn_tensor dst, uint64_t seed, const char *what) {
    device_view s = {0}, b = {0}, d = {0};
    bool ok = make_view(t, src, seed, false, &s) && make_view(t, dst, 0, true, &d) &&
              (!bias || make_view(t, *bias, seed + 1, false, &b));
    if (ok) {
        cl_event done = NULL;
        int status = clattn_copy(&s.view, bias ? &b.view : NULL, &d.view, clattn_env_queue(t->env),
                                 0, NULL, &done);
        if (status != CLATTN_SUCCESS) {
            test_fail_at(t, __FILE__, __LINE__, "%s: clattn_copy -> %s: %s", what,
                         clattn_status_name(status), clattn_last_error());
        } else if (!done) {
            test_fail_at(t, __FILE__, __LINE__, "%s: no event returned", what);
        } else {
            clWaitForEvents(1, &done);
            clReleaseEvent(done);
            void *expected = malloc(d.bytes);
            memcpy(expected, d.host, d.bytes);
            ref_copy(s.host, &s.view, bias ? b.host : NULL, bias ? &b.view : NULL, expected,
                     &d.view);
            bool converts = bias || src.dtype != dst.dtype;
            compare_buffer(t, &d, expected, converts, what);
            free(expected);
        }
    }
    free_view(&s);
    free_view(&b);
    free_view(&d);
}

static clattn_tensor dense(clattn_dtype dtype, int64_t d0, int64_t d1, int64_t d2, int64_t d3,
                           size_t offset) {
    clattn_tensor v = clattn_tensor_4d(NULL, dtype, d0, d1, d2, d3);
    v.offset = offset;
    return v;
}

static void copy_same_dtype_is_bit_exact(test_ctx *t) {
    for (int i = 0; i < 3 && !t->failed; ++i) {
        clattn_dtype dt = float_dtypes[i];
        check_copy_case(t, dense(dt, 2, 3, 7, 33, 5), NULL, dense(dt, 2, 3, 7, 33, 3), 10 + i,
                        clattn_dtype_name(dt));
        /* even rows at even offsets: 16-bit elements move in pairs */
        check_copy_case(t, dense(dt, 2, 3, 7, 34, 4), NULL, dense(dt, 2, 3, 7, 34, 2), 15 + i,
                        "pairs");
        /* odd sizes: 1 and 77 miss every vector width */
        check_copy_case(t, dense(dt, 1, 1, 1, 1, 0), NULL, dense(dt, 1, 1, 1, 1, 1), 20 + i, "1");
        check_copy_case(t, dense(dt, 1, 7, 1, 77, 2), NULL, dense(dt, 1, 7, 1, 77, 0), 30 + i,
                        "77");
    }
}

static void copy_converts_every_dtype_pair(test_ctx *t) {
    for (int a = 0; a < 3; ++a)
        for (int b = 0; b < 3 && !t->failed; ++b) {
            if (a == b) continue;
            char what[32];
            snprintf(what, sizeof what, "%s->%s", clattn_dtype_name(float_dtypes[a]),
                     clattn_dtype_name(float_dtypes[b]));
            check_copy_case(t, dense(float_dtypes[a], 1, 3, 33, 37, 1), NULL,
                            dense(float_dtypes[b], 1, 3, 33, 37, 7), 40 + a * 3 + b, what);
        }
}

static void copy_permuted_and_broadcast_views(test_ctx *t) {
    static const int swap_middle[4] = {0, 2, 1, 3};
    static const int reverse[4] = {3, 2, 1, 0};
    /* [B,S,H,D] storage read as [B,H,S,D]: the layout attention users hand over */
    clattn_tensor bshd = dense(CLATTN_F32, 2, 33, 3, 7, 4);
    check_copy_case(t, clattn_tensor_permute(bshd, swap_middle), NULL,
                    dense(CLATTN_F32, 2, 3, 33, 7, 0), 50, "bshd->bhsd");
    /* a full reversal: the innermost dim is strided in the source (the non-vector path) */
    clattn_tensor src = dense(CLATTN_F16, 5, 7, 3, 33, 0);
    check_copy_case(t, clattn_tensor_permute(src, reverse), NULL, dense(CLATTN_F32, 33, 3, 7, 5, 2),
                    51, "reverse");
    /* and a strided destination */
    clattn_tensor dst = dense(CLATTN_BF16, 7, 1, 9, 2, 0);
    check_copy_case(t, dense(CLATTN_F32, 2, 9, 1, 7, 0), NULL, clattn_tensor_permute(dst, reverse),
                    52, "strided dst");
    /* stride-0 broadcast of a row over two dims */
    clattn_tensor row = dense(CLATTN_F32, 1, 1, 1, 33, 3);
    row.shape[0] = 4;
    row.shape[2] = 7;
    row.strides[0] = 0;
    row.strides[2] = 0;
    check_copy_case(t, row, NULL, dense(CLATTN_F16, 4, 1, 7, 33, 0), 53, "broadcast");
}

/* check_copy_case, and that the copy ran `kernel` (the results alone would not tell
 * transpose4d from copy4d). */
static void check_copy_kernel(test_ctx *t, clattn_tensor src, clattn_tensor dst, uint64_t seed,
                              const char *what, const char *kernel) {
    clattn__trace_kernels(true);
    check_copy_case(t, src, NULL, dst, seed, what);
    clattn__trace_kernels(false);
    clattn__traced_kernel ran[1];
    const size_t n = clattn__trace_take(ran, 1);
    if (!t->failed && (n == 0 || strcmp(ran[0].name, kernel) != 0))
        test_fail_at(t, __FILE__, __LINE__, "%s: ran %s, not %s", what, n ? ran[0].name : "nothing",
                     kernel);
    if (n) clReleaseEvent(ran[0].event);
}

/* Whether transpose_tiles' groups of 256 fit here: its largest group under the caps, asked of
 * heads.cl built with its defaults (rusticl's llvmpipe gives it 32 work-items). */
static bool tiles_fit(test_ctx *t) {
    static const char *const name = "transpose_tiles";
    size_t most = 0;
    const int status =
        clattn__kernels_group_limit(clattn_env_context(t->env), clattn_env_device(t->env),
                                    "heads.cl", "-cl-std=CL1.2 -DVEC=4 -DTILES=1", &name, 1, &most);
    if (status != CLATTN_SUCCESS)
        test_fail_at(t, __FILE__, __LINE__, "transpose_tiles alone -> %s: %s",
                     clattn_status_name(status), clattn_last_error());
    return most >= 256;
}

/* The kernel a transposed view of `dtype` takes here: copy4d where the inner dims are under a
 * block (`blocks` false), else transpose_tiles where the copy row (or an override) says TILES=1
 * and its groups fit, else transpose4d. */
static const char *transpose_kernel(test_ctx *t, clattn_dtype dtype, bool blocks) {
    if (!blocks) return "copy4d";
    char params[CLATTN_TUNING_PARAMS_MAX] = "";
    clattn_tuning_lookup(clattn_env_device(t->env), "copy", dtype, params, sizeof params);
    return strstr(params, "TILES=1") && tiles_fit(t) ? "transpose_tiles" : "transpose4d";
}

/* The transposed views of copy_transposed_views: the inner dims 45 x 37, tiles and blocks cut by
 * both edges; 32 x 16 with outer strides that do not merge; 7 rows, under a block at VEC=8 (and
 * the 16 that is capped to it). `pairs`: how many dtype pairs (of 9): the first is raw 16-bit,
 * the first 3 raw and converting. */
static void transposed_cases(test_ctx *t, int pairs, const char *what, uint64_t seed) {
    static const clattn_dtype pair[9][2] = {
        {CLATTN_F16, CLATTN_F16},  {CLATTN_F32, CLATTN_BF16}, {CLATTN_BF16, CLATTN_BF16},
        {CLATTN_F32, CLATTN_F32},  {CLATTN_F32, CLATTN_F16},  {CLATTN_F16, CLATTN_F32},
        {CLATTN_F16, CLATTN_BF16}, {CLATTN_BF16, CLATTN_F32}, {CLATTN_BF16, CLATTN_F16}};
    for (int p = 0; p < pairs && !t->failed; ++p) {
        const clattn_dtype a = pair[p][0], b = pair[p][1];
        char label[64];
        snprintf(label, sizeof label, "%s: transposed %s->%s", what, clattn_dtype_name(a),
                 clattn_dtype_name(b));
        clattn_tensor src = dense(a, 2, 3, 45, 37, 3);
        check_copy_kernel(t, clattn_tensor_permute(src, swap_inner), dense(b, 2, 3, 37, 45, 1),
                          seed + (uint64_t)p, label, transpose_kernel(t, a, true));
    }
    clattn_tensor whole = dense(CLATTN_F32, 3, 1, 32, 16, 0);
    whole.strides[0] = 32 * 16 + 5;
    check_copy_kernel(t, clattn_tensor_permute(whole, swap_inner),
                      dense(CLATTN_F32, 3, 1, 16, 32, 2), seed + 10, what,
                      transpose_kernel(t, CLATTN_F32, true));
    clattn__copy_tuning row;
    CHECK_OK(t, clattn__copy_tuning_get(clattn_env_device(t->env), CLATTN_BF16, &row));
    clattn_tensor narrow = dense(CLATTN_BF16, 1, 1, 40, 7, 0);
    check_copy_kernel(t, clattn_tensor_permute(narrow, swap_inner),
                      dense(CLATTN_BF16, 1, 1, 7, 40, 0), seed + 11, what,
                      transpose_kernel(t, CLATTN_BF16, row.VEC < 8));
}

/* A transposed view (the two inner dims swapped): blocks of VEC x VEC through registers
 * (transpose4d), every dtype pair, and each block width the tuning table can give (16 is capped
 * to 8); inner dims shorter than a block go to copy4d. Then the same views through local-memory
 * tiles (transpose_tiles, TILES=1, the GPU rows'), dtype pairs raw and converting; where groups
 * are capped below its 256 (the small-groups lane), those fall back to transpose4d. */
static void copy_transposed_views(test_ctx *t) {
    /* small shapes (Oclgrind, whose GPU rows take the tiles: 1.3 s a pair there) take 3 pairs */
    transposed_cases(t, test_large_shapes(t) ? 9 : 3, "the row", 140);
    static const char *const widths[] = {"VEC=2,TILES=0", "VEC=4,TILES=0", "VEC=16,TILES=0",
                                         "TILES=1"};
    for (int w = 0; w < 4 && !t->failed; ++w) {
        CHECK_OK(t, clattn_tuning_override("copy", widths[w]));
        /* the tiles' 45 x 37 pairs (tiles cut by both edges) on large shapes only: on small
         * shapes' lanes the rows are the GPU's, which took the tiles above, or groups are capped */
        const int pairs = w < 3 ? 1 : test_large_shapes(t) ? 3 : 0;
        transposed_cases(t, pairs, widths[w], 160 + 20 * (uint64_t)w);
    }
    clattn_tuning_override("copy", NULL);
}

/* The copy kernels loop over grid dims 1 and 2 past 65535 work-groups (a GPU limit; the large
 * shapes' copy_loops_past_65535_work_groups): with the limit lowered to one group (a hook),
 * every lane runs those loops on small tensors, in copy4d (padded rows and heads, so no dims
 * merge), transpose4d and transpose_tiles (forced; two tiles along dim 2). */
static void copy_loops_past_the_grid_limit(test_ctx *t) {
    clattn__hook_set(CLATTN__HOOK_GRID_GROUPS, 1);
    clattn_tensor padded = dense(CLATTN_F32, 2, 3, 40, 24, 0);
    padded.strides[2] = 29, padded.strides[1] = 40 * 29 + 3;
    padded.strides[0] = 3 * padded.strides[1] + 9;
    check_copy_kernel(t, padded, dense(CLATTN_F32, 2, 3, 40, 24, 1), 70, "rows", "copy4d");
    const clattn_tensor src = clattn_tensor_permute(dense(CLATTN_F32, 2, 3, 45, 37, 3), swap_inner);
    const clattn_tensor dst = dense(CLATTN_F32, 2, 3, 37, 45, 1);
    /* groups of 16 blocks: the GPU rows' 256 would hold the 10 rows of blocks in one group */
    CHECK_OK(t, clattn_tuning_override("copy", "VEC=4,TILES=0,GROUP=16"));
    check_copy_kernel(t, src, dst, 71, "blocks", "transpose4d");
    CHECK_OK(t, clattn_tuning_override("copy", "TILES=1"));
    check_copy_kernel(t, src, dst, 72, "tiles", transpose_kernel(t, CLATTN_F32, true));
    clattn_tuning_override("copy", NULL);
    clattn__hook_set(CLATTN__HOOK_GRID_GROUPS, -1);
}

static void copy_adds_a_broadcast_bias(test_ctx *t) {
    clattn_tensor bias = dense(CLATTN_F16, 1, 1, 1, 40, 2);
    bias.shape[1] = 3;
    bias.shape[2] = 9;
    bias.strides[1] = 0;
    bias.strides[2] = 0;
    check_copy_case(t, dense(CLATTN_F32, 1, 3, 9, 40, 0), &bias, dense(CLATTN_BF16, 1, 3, 9, 40, 1),
                    60, "bias over rows");
    /* a bias constant along the innermost dim (stride 0 there): the vector path broadcasts it */
    clattn_tensor column = dense(CLATTN_F32, 2, 5, 1, 1, 0);
    column.shape[3] = 64;
    column.strides[3] = 0;
    check_copy_case(t, dense(CLATTN_BF16, 2, 5, 1, 64, 3), &column,
                    dense(CLATTN_F32, 2, 5, 1, 64, 0), 61, "bias per row");
}

/* Rows that start on multiples of 16 elements: every vector width's aligned path (the kernel's
 * ALIGNED build), for every dtype pair, then rows padded to 64 with a scalar tail of 53 - 48,
 * and with a bias. */
static clattn_tensor padded_rows(clattn_dtype dtype, int64_t width, size_t offset) {
    clattn_tensor v = dense(dtype, 2, 3, 5, width, offset);
    v.strides[2] = 64;
    v.strides[1] = 5 * 64;
    v.strides[0] = 3 * 5 * 64;
    return v;
}

static void copy_aligned_rows_every_dtype_pair(test_ctx *t) {
    for (int a = 0; a < 3; ++a)
        for (int b = 0; b < 3 && !t->failed; ++b) {
            char what[48];
            snprintf(what, sizeof what, "aligned %s->%s", clattn_dtype_name(float_dtypes[a]),
                     clattn_dtype_name(float_dtypes[b]));
            check_copy_case(t, dense(float_dtypes[a], 2, 3, 5, 48, 16), NULL,
                            dense(float_dtypes[b], 2, 3, 5, 48, 32), 90 + a * 3 + b, what);
            check_copy_case(t, padded_rows(float_dtypes[a], 53, 16), NULL,
                            padded_rows(float_dtypes[b], 53, 64), 100 + a * 3 + b, what);
        }
    clattn_tensor bias = dense(CLATTN_F16, 1, 1, 1, 48, 16);
    bias.shape[0] = 2;
    bias.shape[1] = 3;
    bias.shape[2] = 5;
    check_copy_case(t, dense(CLATTN_F32, 2, 3, 5, 48, 16), &bias, dense(CLATTN_F16, 2, 3, 5, 48, 0),
                    110, "aligned, bias");
    /* the GPU rows of 16-bit copies: an 8-element chunk a work-item (CI's GPU lane forces the
     * "*" rows, 4-element chunks) */
    if (t->failed) return;
    CHECK_OK(t, clattn_tuning_override("copy", "VEC=8,RUN=8,GROUP=16"));
    for (int a = 1; a < 3 && !t->failed; ++a) {
        check_copy_case(t, dense(float_dtypes[a], 2, 3, 5, 48, 16), NULL,
                        dense(float_dtypes[a], 2, 3, 5, 48, 32), 120 + a, "aligned, 8 a chunk");
        check_copy_case(t, padded_rows(float_dtypes[a], 53, 16), NULL,
                        padded_rows(float_dtypes[a], 53, 64), 130 + a, "padded, 8 a chunk");
    }
    clattn_tuning_override("copy", NULL);
}

/* Tensors past 2^32 elements index with 64-bit integers; the same path on small tensors. */
static void copy_with_64_bit_indices(test_ctx *t) {
    const uint64_t saved = clattn__narrow_index_limit_set(0);
    static const int swap_middle[4] = {0, 2, 1, 3};
    check_copy_case(t, dense(CLATTN_BF16, 2, 5, 7, 33, 3), NULL, dense(CLATTN_F32, 2, 5, 7, 33, 1),
                    55, "64-bit contiguous");
    check_copy_case(t, clattn_tensor_permute(dense(CLATTN_F32, 2, 7, 5, 9, 0), swap_middle), NULL,
                    dense(CLATTN_F32, 2, 5, 7, 9, 0), 56, "64-bit permuted");
    check_copy_kernel(t, clattn_tensor_permute(dense(CLATTN_BF16, 2, 3, 19, 21, 0), swap_inner),
                      dense(CLATTN_F32, 2, 3, 21, 19, 1), 58, "64-bit transposed",
                      transpose_kernel(t, CLATTN_BF16, true));
    clattn__narrow_index_limit_set(saved);
}

/* 76800 outer rows that do not merge: the launch caps dim 2 at 65535 and the kernel loops;
 * copy4d for 3 x 2 inner dims, transpose4d (or the row's transpose_tiles) for 16 x 16 ones, and
 * transpose_tiles forced. */
static void copy_loops_past_65535_work_groups(test_ctx *t) {
    if (!test_large_shapes(t)) return test_skip(t, "small shapes only (CLATTN_TEST_SMALL)");
    clattn_tensor src = clattn_tensor_permute(dense(CLATTN_F32, 256, 300, 2, 3, 0), swap_inner);
    check_copy_case(t, src, NULL, dense(CLATTN_F32, 256, 300, 3, 2, 0), 57, "76800 rows");
    src = clattn_tensor_permute(dense(CLATTN_F32, 256, 300, 16, 16, 0), swap_inner);
    check_copy_kernel(t, src, dense(CLATTN_F32, 256, 300, 16, 16, 0), 59, "76800 blocks",
                      transpose_kernel(t, CLATTN_F32, true));
    CHECK_OK(t, clattn_tuning_override("copy", "TILES=1"));
    check_copy_kernel(t, src, dense(CLATTN_F32, 256, 300, 16, 16, 0), 61, "76800 tiles",
                      transpose_kernel(t, CLATTN_F32, true));
    clattn_tuning_override("copy", NULL);
}

/* ---- split, merge, qkv ---- */

typedef struct heads_shape {
    int64_t b, s, h, d;
} heads_shape;

static const heads_shape heads_shapes[] = {
    {1, 1, 1, 1}, {1, 7, 3, 7}, {2, 33, 4, 16}, {1, 77, 2, 33}, {3, 7, 8, 40},
};

/* x is a [B,S,H*D] view whose rows are `pad` elements wider than H*D and start at `offset`. */
static clattn_tensor packed_view(clattn_dtype dtype, heads_shape sh, int64_t parts, int64_t pad,
                                 size_t offset) {
    int64_t width = parts * sh.h * sh.d;
    clattn_tensor v = dense(dtype, 1, sh.b, sh.s, width, offset);
    v.strides[2] = width + pad;
    v.strides[1] = sh.s * (width + pad);
    v.strides[0] = sh.b * v.strides[1];
    return v;
}

static uint64_t packed_index(const clattn_tensor *x, int64_t b, int64_t s, int64_t col) {
    return x->offset + (uint64_t)(b * x->strides[1] + s * x->strides[2] + col * x->strides[3]);
}

/* out[b,h,s,d] must equal x[b,s,part*H*D + h*D + d] (+ bias[part*H*D + h*D + d]). */
static bool check_heads_layout(test_ctx *t, const device_view *x, const device_view *bias,
                               const device_view *out, heads_shape sh, int64_t part,
                               const char *what) {
    void *back = malloc(out->bytes);
    if (!back || !test_read(t, out->view.buffer, back, out->bytes)) {
        free(back);
        return false;
    }
    bool ok = true;
    for (int64_t b = 0; b < sh.b && ok; ++b)
        for (int64_t h = 0; h < sh.h && ok; ++h)
            for (int64_t s = 0; s < sh.s && ok; ++s)
                for (int64_t d = 0; d < sh.d && ok; ++d) {
                    int64_t col = part * sh.h * sh.d + h * sh.d + d;
                    uint64_t src = packed_index(&x->view, b, s, col);
                    uint64_t dst = out->view.offset +
                                   (uint64_t)(b * out->view.strides[0] + h * out->view.strides[1] +
                                              s * out->view.strides[2] + d);
                    float want = ref_load(x->host, x->view.dtype, src);
                    if (bias)
                        want += ref_load(bias->host, bias->view.dtype, bias->view.offset + col);
                    uint8_t expected[4];
                    ref_store(expected, out->view.dtype, 0, want);
                    bool same =
                        bias || x->view.dtype != out->view.dtype
                            ? ref_same_element(
                                  expected, (char *)back + dst * clattn_dtype_size(out->view.dtype),
                                  out->view.dtype, 0, true)
                            : memcmp((char *)x->host + src * clattn_dtype_size(x->view.dtype),
                                     (char *)back + dst * clattn_dtype_size(out->view.dtype),
                                     clattn_dtype_size(out->view.dtype)) == 0;
                    if (!same) {
                        test_fail_at(t, __FILE__, __LINE__,
                                     "%s: out[%lld,%lld,%lld,%lld] = %.9g, expected %.9g", what,
                                     (long long)b, (long long)h, (long long)s, (long long)d,
                                     ref_load(back, out->view.dtype, dst), want);
                        ok = false;
                    }
                }
    free(back);
    return ok;
}

static void split_then_merge_is_identity(test_ctx *t) {
    cl_command_queue q = clattn_env_queue(t->env);
    for (size_t i = 0; i < sizeof heads_shapes / sizeof heads_shapes[0] && !t->failed; ++i) {
        heads_shape sh = heads_shapes[i];
        clattn_dtype dt = float_dtypes[i % 3];
        device_view x = {0}, heads = {0}, back = {0};
        clattn_tensor x_view = packed_view(dt, sh, 1, (int64_t)(i % 2) * 3, i);
        clattn_tensor back_view = packed_view(dt, sh, 1, 0, 2);
        if (make_view(t, x_view, 70 + i, false, &x) &&
            make_view(t, dense(dt, sh.b, sh.h, sh.s, sh.d, 1), 0, true, &heads) &&
            make_view(t, back_view, 0, true, &back)) {
            char what[64];
            snprintf(what, sizeof what, "split %s [%lld,%lld,%lld,%lld]", clattn_dtype_name(dt),
                     (long long)sh.b, (long long)sh.s, (long long)sh.h, (long long)sh.d);
            int status = clattn_split_heads(&x.view, (int)sh.h, &heads.view, q, 0, NULL, NULL);
            if (status != CLATTN_SUCCESS)
                test_fail_at(t, __FILE__, __LINE__, "%s -> %s: %s", what,
                             clattn_status_name(status), clattn_last_error());
            else if (check_heads_layout(t, &x, NULL, &heads, sh, 0, what)) {
                status = clattn_merge_heads(&heads.view, &back.view, q, 0, NULL, NULL);
                if (status != CLATTN_SUCCESS)
                    test_fail_at(t, __FILE__, __LINE__, "merge -> %s: %s",
                                 clattn_status_name(status), clattn_last_error());
                else if (test_read(t, back.view.buffer, back.host, back.bytes))
                    check_heads_layout(t, &back, NULL, &heads, sh, 0, "merge");
            }
        }
        free_view(&x);
        free_view(&heads);
        free_view(&back);
    }
}

/* A packed QKV split: x starts x_offset elements into its buffer, its rows x_pad elements
 * apart past their width; output p starts p * out_pad elements into its own buffer, in
 * out_dtype (k in k_dtype). `launches` is how many kernels the split must enqueue: 1 when the
 * three outputs' plans share a layout, 3 when they do not. `wide` indexes in 64 bits. */
typedef struct qkv_case {
    heads_shape sh;
    clattn_dtype x_dtype, out_dtype, k_dtype;
    bool bias, wide;
    int64_t x_pad;
    size_t x_offset, out_pad, launches;
} qkv_case;

static void check_qkv_launches(test_ctx *t, const qkv_case *c, size_t n,
                               const clattn__traced_kernel *ran) {
    if (n != c->launches || strcmp(ran[0].name, "copy4d") != 0)
        test_fail_at(t, __FILE__, __LINE__, "split_qkv ran %zu kernels (first %s), not %zu copy4d",
                     n, n ? ran[0].name : "none", c->launches);
}

/* The elements before the view (its offset) still hold the sentinel make_view wrote: no launch
 * wrote another part's rows there. */
static void check_prefix_untouched(test_ctx *t, const device_view *out, const char *what) {
    const size_t bytes = out->view.offset * clattn_dtype_size(out->view.dtype);
    uint8_t *back = malloc(bytes + 1);
    if (back && test_read(t, out->view.buffer, back, bytes))
        for (size_t i = 0; i < bytes; ++i)
            if (back[i] != 0x5a) {
                test_fail_at(t, __FILE__, __LINE__, "%s: byte %zu before the view was written",
                             what, i);
                break;
            }
    free(back);
}

static void split_qkv_case(test_ctx *t, const qkv_case *c, uint64_t seed) {
    const heads_shape sh = c->sh;
    device_view x = {0}, bias = {0}, out[3];
    memset(out, 0, sizeof out);
    bool ok =
        make_view(t, packed_view(c->x_dtype, sh, 3, c->x_pad, c->x_offset), seed, false, &x) &&
        (!c->bias ||
         make_view(t, dense(CLATTN_F16, 1, 1, 1, 3 * sh.h * sh.d, 1), seed + 1, false, &bias));
    for (int p = 0; p < 3 && ok; ++p)
        ok = make_view(t,
                       dense(p == 1 ? c->k_dtype : c->out_dtype, sh.b, sh.h, sh.s, sh.d,
                             (size_t)p * c->out_pad),
                       0, true, &out[p]);
    if (ok) {
        cl_event done = NULL;
        const uint64_t saved = c->wide ? clattn__narrow_index_limit_set(0) : 0;
        clattn__trace_kernels(true);
        int status =
            clattn_split_qkv(&x.view, c->bias ? &bias.view : NULL, (int)sh.h, &out[0].view,
                             &out[1].view, &out[2].view, clattn_env_queue(t->env), 0, NULL, &done);
        clattn__trace_kernels(false);
        if (c->wide) clattn__narrow_index_limit_set(saved);
        clattn__traced_kernel ran[4];
        const size_t n = clattn__trace_take(ran, 4);
        if (status != CLATTN_SUCCESS || !done) {
            test_fail_at(t, __FILE__, __LINE__, "split_qkv -> %s (event %p): %s",
                         clattn_status_name(status), (void *)done, clattn_last_error());
        } else {
            check_qkv_launches(t, c, n, ran);
            clWaitForEvents(1, &done);
            clReleaseEvent(done);
            static const char *const names[3] = {"q", "k", "v"};
            for (int p = 0; p < 3 && !t->failed; ++p) {
                check_heads_layout(t, &x, c->bias ? &bias : NULL, &out[p], sh, p, names[p]);
                check_prefix_untouched(t, &out[p], names[p]);
            }
        }
        for (size_t i = 0; i < n; ++i) clReleaseEvent(ran[i].event);
    }
    free_view(&x);
    free_view(&bias);
    for (int p = 0; p < 3; ++p) free_view(&out[p]);
}

/* One launch for outputs of one layout at any offsets (odd ones, aligned rows in every output
 * or in q's alone, a dtype conversion, a bias, 64-bit indices); three when the plans differ:
 * raw 16-bit outputs at odd and even offsets, of which only the even ones move in 32-bit pairs,
 * or a k of another dtype. The shapes put either the heads (S > 3H) or the sequence in the
 * plan's dim 2, the one the launch multiplies by the parts. */
static void split_qkv_with_and_without_bias(test_ctx *t) {
    const clattn_dtype f32 = CLATTN_F32, f16 = CLATTN_F16, bf16 = CLATTN_BF16;
    const qkv_case cases[] = {
        /* B,S,H,D      x     q, v  k     bias   wide   x_pad, x_offset, out_pad, launches */
        {{2, 7, 3, 16}, f32, f32, f32, false, false, 2, 3, 1, 1},
        {{2, 9, 2, 16}, f32, f32, f32, false, false, 0, 0, 8, 1},
        {{2, 9, 2, 16}, f32, f32, f32, false, false, 0, 0, 1, 1},
        {{1, 33, 2, 40}, bf16, bf16, bf16, false, false, 2, 3, 1, 1},
        {{1, 33, 2, 40}, bf16, bf16, bf16, false, false, 2, 4, 1, 3},
        {{1, 33, 2, 40}, f16, f16, f16, false, false, 2, 4, 2, 1},
        {{2, 7, 4, 8}, f32, f32, f32, true, false, 2, 3, 5, 1},
        {{1, 77, 1, 7}, f16, f16, f16, true, false, 2, 3, 1, 1},
        {{3, 5, 2, 12}, bf16, f32, f32, false, false, 2, 3, 3, 1},
        {{3, 5, 2, 12}, bf16, f32, f16, false, false, 2, 3, 3, 3},
        {{2, 7, 3, 16}, f16, f32, f32, true, true, 2, 3, 1, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0] && !t->failed; ++i)
        split_qkv_case(t, &cases[i], 80 + 2 * i);
}

/* A copy behind a user event must not run before it: the wait list reaches the enqueue.
 * PoCL 3.1's `basic` device deadlocks inside clSetUserEventStatus when a kernel waits on the
 * user event (a 30-line program without clattn reproduces it), so it cannot run there. */
static void copy_waits_for_its_wait_list(test_ctx *t) {
    if (test_is_pocl31_basic(t))
        return test_skip(t, "PoCL 3.1 basic deadlocks in clSetUserEventStatus (driver bug)");
    device_view s = {0}, d = {0};
    cl_int err;
    cl_event gate = clCreateUserEvent(clattn_env_context(t->env), &err);
    CHECK(t, err == CL_SUCCESS, "clCreateUserEvent: %d", err);
    if (make_view(t, dense(CLATTN_F32, 1, 1, 4, 64, 0), 90, false, &s) &&
        make_view(t, dense(CLATTN_F32, 1, 1, 4, 64, 0), 0, true, &d)) {
        cl_event done = NULL;
        int status = clattn_copy(&s.view, NULL, &d.view, clattn_env_queue(t->env), 1, &gate, &done);
        cl_int state = CL_COMPLETE;
        if (status == CLATTN_SUCCESS)
            clGetEventInfo(done, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof state, &state, NULL);
        clSetUserEventStatus(gate, CL_COMPLETE);
        if (status != CLATTN_SUCCESS)
            test_fail_at(t, __FILE__, __LINE__, "copy -> %s", clattn_status_name(status));
        else if (state == CL_COMPLETE)
            test_fail_at(t, __FILE__, __LINE__, "the copy completed before its wait list");
        if (done) {
            clWaitForEvents(1, &done);
            clReleaseEvent(done);
            memcpy(d.host, s.host, 4 * 64 * sizeof(float)); /* the margin stays the sentinel */
            compare_buffer(t, &d, d.host, false, "after the gate");
        }
    } else {
        clSetUserEventStatus(gate, CL_COMPLETE);
    }
    clReleaseEvent(gate);
    free_view(&s);
    free_view(&d);
}

/* ---- invalid input: a specific status, *event NULL, nothing written ---- */

typedef struct error_fixture {
    device_view src, dst, small;
    cl_event event;
} error_fixture;

static bool error_setup(test_ctx *t, error_fixture *f) {
    memset(f, 0, sizeof *f);
    return make_view(t, dense(CLATTN_F32, 1, 2, 8, 32, 0), 100, false, &f->src) &&
           make_view(t, dense(CLATTN_F32, 1, 2, 8, 32, 0), 0, true, &f->dst);
}

static void error_teardown(error_fixture *f) {
    free_view(&f->src);
    free_view(&f->dst);
}

/* Each crafted bad call: its status, then the event and the untouched destination. */
#define EXPECT_REJECTED(t, f, call, expected)                                                      \
    do {                                                                                           \
        (f)->event = (cl_event)(uintptr_t)0x1;                                                     \
        CHECK_STATUS(t, call, expected);                                                           \
        CHECK(t, (f)->event == NULL, "%s left *event non-NULL", #call);                            \
        CHECK(t, clattn_last_error()[0] != '\0', "%s gave no message", #call);                     \
    } while (0)

static void bad_input_is_rejected_before_enqueue(test_ctx *t) {
    error_fixture f;
    cl_command_queue q = clattn_env_queue(t->env);
    if (!error_setup(t, &f)) return error_teardown(&f);
    clattn_tensor src = f.src.view, dst = f.dst.view, bad;

    /* the buffer one element short: the view reaches one past the end */
    bad = src;
    bad.offset = MARGIN + 1;
    EXPECT_REJECTED(t, &f, clattn_copy(&bad, NULL, &dst, q, 0, NULL, &f.event),
                    CLATTN_ERR_BUFFER_TOO_SMALL);
    /* zero and negative dims */
    bad = src;
    bad.shape[2] = 0;
    EXPECT_REJECTED(t, &f, clattn_copy(&bad, NULL, &dst, q, 0, NULL, &f.event),
                    CLATTN_ERR_INVALID_SHAPE);
    bad = dst;
    bad.shape[0] = -1;
    EXPECT_REJECTED(t, &f, clattn_copy(&src, NULL, &bad, q, 0, NULL, &f.event),
                    CLATTN_ERR_INVALID_SHAPE);
    /* mismatched shapes */
    bad = dst;
    bad.shape[3] = 16;
    EXPECT_REJECTED(t, &f, clattn_copy(&src, NULL, &bad, q, 0, NULL, &f.event),
                    CLATTN_ERR_SHAPE_MISMATCH);
    /* NULL tensors */
    EXPECT_REJECTED(t, &f, clattn_copy(NULL, NULL, &dst, q, 0, NULL, &f.event),
                    CLATTN_ERR_INVALID_ARGUMENT);
    bad = src;
    bad.buffer = NULL;
    EXPECT_REJECTED(t, &f, clattn_copy(&bad, NULL, &dst, q, 0, NULL, &f.event),
                    CLATTN_ERR_NULL_TENSOR);
    /* unsupported dtypes and dtype pairs */
    bad = src;
    bad.dtype = CLATTN_I32;
    EXPECT_REJECTED(t, &f, clattn_copy(&bad, NULL, &dst, q, 0, NULL, &f.event),
                    CLATTN_ERR_UNSUPPORTED_DTYPE);
    bad = dst;
    bad.dtype = CLATTN_U8;
    EXPECT_REJECTED(t, &f, clattn_copy(&src, NULL, &bad, q, 0, NULL, &f.event),
                    CLATTN_ERR_UNSUPPORTED_DTYPE);
    bad = src;
    bad.dtype = (clattn_dtype)42;
    EXPECT_REJECTED(t, &f, clattn_copy(&bad, NULL, &dst, q, 0, NULL, &f.event),
                    CLATTN_ERR_UNSUPPORTED_DTYPE);
    /* strides: negative, and an output that writes one element twice */
    bad = src;
    bad.strides[1] = -1;
    EXPECT_REJECTED(t, &f, clattn_copy(&bad, NULL, &dst, q, 0, NULL, &f.event),
                    CLATTN_ERR_INVALID_STRIDES);
    bad = dst;
    bad.strides[2] = 0;
    EXPECT_REJECTED(t, &f, clattn_copy(&src, NULL, &bad, q, 0, NULL, &f.event),
                    CLATTN_ERR_INVALID_STRIDES);
    bad = dst;
    bad.strides[2] = 16; /* rows of 32 overlapping by half */
    EXPECT_REJECTED(t, &f, clattn_copy(&src, NULL, &bad, q, 0, NULL, &f.event),
                    CLATTN_ERR_INVALID_STRIDES);
    /* an output overlapping its input */
    bad = src;
    bad.offset = 1;
    bad.shape[2] = 7;
    clattn_tensor small_src = src;
    small_src.shape[2] = 7;
    EXPECT_REJECTED(t, &f, clattn_copy(&small_src, NULL, &bad, q, 0, NULL, &f.event),
                    CLATTN_ERR_ALIASING);
    /* inconsistent wait lists and a missing queue */
    EXPECT_REJECTED(t, &f, clattn_copy(&src, NULL, &dst, q, 1, NULL, &f.event),
                    CL_INVALID_EVENT_WAIT_LIST);
    EXPECT_REJECTED(t, &f, clattn_copy(&src, NULL, &dst, NULL, 0, NULL, &f.event),
                    CL_INVALID_COMMAND_QUEUE);
    /* the reshape ops' own arguments */
    clattn_tensor x = dense(CLATTN_F32, 1, 2, 8, 32, 0), heads = dense(CLATTN_F32, 2, 4, 8, 8, 0);
    x.buffer = f.src.view.buffer;
    heads.buffer = f.dst.view.buffer;
    EXPECT_REJECTED(t, &f, clattn_split_heads(&x, 0, &heads, q, 0, NULL, &f.event),
                    CLATTN_ERR_INVALID_ARGUMENT);
    EXPECT_REJECTED(t, &f, clattn_split_heads(&x, 5, &heads, q, 0, NULL, &f.event),
                    CLATTN_ERR_SHAPE_MISMATCH);
    EXPECT_REJECTED(t, &f, clattn_split_heads(&x, 8, &heads, q, 0, NULL, &f.event),
                    CLATTN_ERR_SHAPE_MISMATCH);
    clattn_tensor not_packed = dense(CLATTN_F32, 2, 1, 8, 32, 0);
    not_packed.buffer = x.buffer;
    EXPECT_REJECTED(t, &f, clattn_split_heads(&not_packed, 4, &heads, q, 0, NULL, &f.event),
                    CLATTN_ERR_SHAPE_MISMATCH);
    EXPECT_REJECTED(t, &f, clattn_merge_heads(&heads, NULL, q, 0, NULL, &f.event),
                    CLATTN_ERR_INVALID_ARGUMENT);
    EXPECT_REJECTED(t, &f,
                    clattn_split_qkv(&x, NULL, 4, &heads, &heads, &heads, q, 0, NULL, &f.event),
                    CLATTN_ERR_SHAPE_MISMATCH); /* 32 is not a multiple of 3 x 4 */

    /* nothing above may have written anything */
    clFinish(q);
    compare_buffer(t, &f.dst, f.dst.host, false, "after rejected calls");
    error_teardown(&f);
}

static void outputs_of_split_qkv_must_not_overlap(test_ctx *t) {
    error_fixture f;
    cl_command_queue q = clattn_env_queue(t->env);
    if (!error_setup(t, &f)) return error_teardown(&f);
    clattn_tensor x = dense(CLATTN_F32, 1, 2, 8, 24, 0), out = dense(CLATTN_F32, 2, 2, 8, 4, 0);
    x.buffer = f.src.view.buffer;
    out.buffer = f.dst.view.buffer;
    clattn_tensor other = out;
    other.offset = 128;
    EXPECT_REJECTED(t, &f, clattn_split_qkv(&x, NULL, 2, &out, &other, &out, q, 0, NULL, &f.event),
                    CLATTN_ERR_ALIASING);
    clattn_tensor bias = dense(CLATTN_F32, 1, 1, 1, 12, 0);
    bias.buffer = x.buffer;
    EXPECT_REJECTED(t, &f, clattn_split_qkv(&x, &bias, 2, &out, &other, &out, q, 0, NULL, &f.event),
                    CLATTN_ERR_SHAPE_MISMATCH);
    clFinish(q);
    compare_buffer(t, &f.dst, f.dst.host, false, "after rejected calls");
    error_teardown(&f);
}

static const test_case cases[] = {
    {"copy_same_dtype_is_bit_exact", copy_same_dtype_is_bit_exact},
    {"copy_converts_every_dtype_pair", copy_converts_every_dtype_pair},
    {"copy_permuted_and_broadcast_views", copy_permuted_and_broadcast_views},
    {"copy_transposed_views", copy_transposed_views},
    {"copy_adds_a_broadcast_bias", copy_adds_a_broadcast_bias},
    {"copy_aligned_rows_every_dtype_pair", copy_aligned_rows_every_dtype_pair},
    {"copy_with_64_bit_indices", copy_with_64_bit_indices},
    {"copy_loops_past_65535_work_groups", copy_loops_past_65535_work_groups},
    {"copy_loops_past_the_grid_limit", copy_loops_past_the_grid_limit},
    {"split_then_merge_is_identity", split_then_merge_is_identity},
    {"split_qkv_with_and_without_bias", split_qkv_with_and_without_bias},
    {"copy_waits_for_its_wait_list", copy_waits_for_its_wait_list},
    {"bad_input_is_rejected_before_enqueue", bad_input_is_rejected_before_enqueue, TAG_HOST},
    {"outputs_of_split_qkv_must_not_overlap", outputs_of_split_qkv_must_not_overlap},
};
SUITE_TAGGED(heads_suite, "heads", cases, TAG_SMOKE);
