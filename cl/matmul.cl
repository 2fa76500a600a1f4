/*
 * c = a op(b) + beta c for a batch of row-major f32 matrices (a: m x k, op(b): k x n, c: m x n):
 * clattn's GEMM, a register-tiled micro-kernel for CPUs (the tuning table's matmul row says which
 * devices take it; the others keep CLBlast).
 *
 *   matmul_pack   op(b) as panels of NR = NV * VEC columns, k-major and contiguous:
 *                 packed[((i * panels + p) * k + kk) * NR + col] = op(b_i)[kk][p * NR + col], 0
 *                 past n. A work-item per (matrix, panel, kk); O(k n) against the product's
 *                 O(m n k).
 *   matmul_tiles  a work-item (groups of one) per MR rows and PANELS panels of one matrix; per
 *                 panel it keeps MR x NV vector accumulators in registers, and per kk broadcasts
 *                 a[r][kk] against the NV vectors of the panel's row kk: MR x NV FMAs for NV
 *                 vector loads and MR broadcasts, no horizontal sum. Consecutive work-items take
 *                 consecutive row blocks of the same panels, so the panels stay in cache.
 *
 * Offsets, leading dims and batch strides are in elements (ulong). Build options: MR, NV, VEC
 * (4, 8 or 16), PANELS.
 */
#ifndef CLATTN_COMMON_CL
#include "common.cl"
#endif

#ifndef MR
#define MR 8
#endif
#ifndef NV
#define NV 2
#endif
#ifndef VEC
#define VEC 16
#endif
#ifndef PANELS
#define PANELS 4
#endif
#define NR (NV * VEC)
#define floatV CAT(float, VEC)

/* The loops over the tile's rows and vectors are UNROLLed (common.cl), so that the accumulators
 * live in registers. */

__kernel void matmul_pack(__global const float *b, ulong b_off, ulong ldb, ulong b_stride,
                          int trans_b, __global float *packed, int n, int k, int batch) {
    const int panels = (n + NR - 1) / NR;
    const size_t item = get_global_id(0);
    if (item >= (size_t)batch * panels * k) return;
    const int kk = (int)(item % k), p = (int)(item / k % panels), i = (int)(item / k / panels);
    __global const float *bi = b + b_off + (size_t)i * b_stride;
    float row[NR];
    for (int col = 0; col < NR; ++col) {
        const size_t j = (size_t)p * NR + col;
        row[col] = j >= (size_t)n ? 0.0f : trans_b ? bi[j * ldb + kk] : bi[(size_t)kk * ldb + j];
    }
    for (int v = 0; v < NV; ++v)
        CAT(vstore, VEC)(CAT(vload, VEC)(v, row), 0, packed + item * NR + (size_t)v * VEC);
}

/* Row r of the tile, columns col .. col + VEC - 1 (those below n): acc + beta c, reading c only
 * where beta is not 0 (BLAS's convention: c may then hold anything, NaN included). */
inline void store_lanes(__global float *c, size_t at, int col, int n, float beta, floatV acc) {
    if (col + VEC <= n) {
        if (beta != 0.0f) acc = fma((floatV)beta, CAT(vload, VEC)(0, c + at), acc);
        CAT(vstore, VEC)(acc, 0, c + at);
        return;
    }
    float lanes[VEC];
    CAT(vstore, VEC)(acc, 0, lanes);
    for (int e = 0; e < VEC && col + e < n; ++e)
        c[at + e] = beta != 0.0f ? fma(beta, c[at + e], lanes[e]) : lanes[e];
}

__attribute__((reqd_work_group_size(1, 1, 1))) __kernel void
matmul_tiles(__global const float *a, ulong a_off, ulong lda, ulong a_stride,
             __global const float *packed, __global float *c, ulong c_off, ulong ldc,
             ulong c_stride, int m, int n, int k, float beta, int batch) {
    const int blocks = (m + MR - 1) / MR, panels = (n + NR - 1) / NR;
    const int groups = (panels + PANELS - 1) / PANELS;
    const int item = (int)get_global_id(0);
    if (item >= blocks * groups * batch) return;
    const int r0 = item % blocks * MR, g = item / blocks % groups, i = item / blocks / groups;
    /* rows past m repeat the last one, unstored */
    __global const float *ai = a + a_off + (size_t)i * a_stride;
    size_t rows[MR];
    UNROLL for (int r = 0; r < MR; ++r) rows[r] = (size_t)min(r0 + r, m - 1) * lda;
    const int last = min(panels, (g + 1) * PANELS);
    for (int p = g * PANELS; p < last; ++p) {
        __global const float *bp = packed + ((size_t)i * panels + p) * k * NR;
        floatV acc[MR][NV];
        UNROLL for (int r = 0; r < MR; ++r) UNROLL for (int v = 0; v < NV; ++v) acc[r][v] = 0.0f;
        for (int kk = 0; kk < k; ++kk) {
            floatV bv[NV];
            UNROLL for (int v = 0; v < NV; ++v) bv[v] = CAT(vload, VEC)(kk * NV + v, bp);
            UNROLL for (int r = 0; r < MR; ++r) {
                const floatV ar = (floatV)ai[rows[r] + kk];
                UNROLL for (int v = 0; v < NV; ++v) acc[r][v] = fma(ar, bv[v], acc[r][v]);
            }
        }
        __global float *ci = c + c_off + (size_t)i * c_stride;
        UNROLL for (int r = 0; r < MR; ++r) {
            if (r0 + r >= m) break;
            UNROLL for (int v = 0; v < NV; ++v) {
                const int col = p * NR + v * VEC;
                store_lanes(ci, (size_t)(r0 + r) * ldc + col, col, n, beta, acc[r][v]);
            }
        }
    }
}
