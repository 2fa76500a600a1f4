/*
 * c = a op(b) + beta c for a batch of row-major matrices (a: m x k, op(b): k x n, c: m x n), in
 * one of two builds, as the host asks (src/ops/gemm.c):
 *
 * MATMUL_MMA 0: f32 storage, clattn's register-tiled micro-kernel for CPUs (the tuning table's
 * matmul row says which devices take it; the others keep CLBlast).
 *   matmul_pack   op(b) as panels of NR = NV * VEC columns, k-major and contiguous:
 *                 packed[((i * panels + p) * k + kk) * NR + col] = op(b_i)[kk][p * NR + col], 0
 *                 past n. A work-item per (matrix, panel, kk); O(k n) against the product's
 *                 O(m n k).
 *   matmul_tiles  a work-item (groups of one) per MR rows and PANELS panels of one matrix; per
 *                 panel it keeps MR x NV vector accumulators in registers, and per kk broadcasts
 *                 a[r][kk] against the NV vectors of the panel's row kk: MR x NV FMAs for NV
 *                 vector loads and MR broadcasts, no horizontal sum. Consecutive work-items take
 *                 consecutive row blocks of the same panels, so the panels stay in cache.
 *   Build options: MR, NV, VEC (4, 8 or 16), PANELS.
 *
 * MATMUL_MMA 1: a and b in MMA_T (f16 or bf16), c in C_T (f32, f16 or bf16), products on
 * cl/mma.cl's subgroup tile (any of its matrix units) with f32 accumulators (matmul_mma below);
 * or MMA_T f32, products on NVIDIA's tf32 unit as three products each (cl/mma.cl's 3xTF32).
 *
 * Offsets, leading dims and batch strides are in elements (ulong).
 */
#ifndef CLATTN_COMMON_CL
#include "common.cl"
#endif

#ifndef MATMUL_MMA
#define MATMUL_MMA 0
#endif

#if !MATMUL_MMA
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
#endif /* !MATMUL_MMA */

#if MATMUL_MMA
#ifndef CLATTN_MMA_CL
#include "mma.cl"
#endif
/* matmul_mma: a work-group of 4 subgroups (cl/mma.cl's subgroup tile: MMA_UNIT) takes a block of
 * MM_BM x MM_BN outputs of one matrix, a subgroup MM_WM x MM_WN of them (the subgroups 2 x 2), as
 * MM_MT x MM_NT tiles of 16 x 16 with f32 accumulators. Per 32-deep slice of k, the group fetches
 * the slice of a (MM_BM rows) and of b into registers (the next slice while it computes this one
 * with MM_AHEAD; 16-byte loads where the host proved the rows ALIGNED and a chunk lies whole
 * inside the matrix, value by value elsewhere; 0 past m, n and k), stages them in local memory
 * as raw 16-bit rows, then each subgroup loads its tiles' fragments (mma_tile_load_a/_b: ldmatrix
 * on NVIDIA's units): b n-major when stored so (TRANS_B: c = a b^T, as MHA's projections x W^T),
 * k-major otherwise. A fragment of a feeds MM_NT products, one of b MM_MT. With MMA_T f32
 * (NVIDIA's warp, MMA_UNIT MMA_NV) the slices hold f32 bits, 16-byte chunks of 4 values, and a
 * step splits each fragment into its tf32 parts once for all the products it feeds (mm_step
 * below). The end adds the bias row (HAS_BIAS: bias[col] in BIAS_T, bias_step elements apart, as
 * torch's addmm adds it) and beta c (c read only where beta is not 0, BLAS's convention) in f32
 * and stores c in C_T, rounded once.
 * Build options: MMA_T, C_T, MM_WM (16 or 32), MM_WN (16, 32 or 64), MM_AHEAD (0 or 1),
 * TRANS_B, ALIGNED, HAS_BIAS, BIAS_T, IDX (uint where every element index is below 2^31, else
 * ulong), and cl/mma.cl's MMA_UNIT and MMA_NATIVE. */
#ifndef MM_WM
#define MM_WM 32
#endif
#ifndef MM_WN
#define MM_WN 32
#endif
#ifndef MM_AHEAD
#define MM_AHEAD 1
#endif
#ifndef TRANS_B
#define TRANS_B 1
#endif
#ifndef ALIGNED
#define ALIGNED 0
#endif
#ifndef C_T
#define C_T f32
#endif
#ifndef HAS_BIAS
#define HAS_BIAS 0
#endif
#ifndef BIAS_T
#define BIAS_T f32
#endif
#define MM_SUBGROUPS 4
#define MM_THREADS (MM_SUBGROUPS * MMA_SG)
#define MM_MT (MM_WM / 16)
#define MM_NT (MM_WN / 16)
#define MM_BM (2 * MM_WM)
#define MM_BN (2 * MM_WN)
#define MM_BK 32
#if MMA_T_IS_F32
#if MMA_UNIT != MMA_NV
#error "f32 products run on NVIDIA's tf32 unit alone"
#endif
#define MM_BITS  uint /* a value's bits in global memory */
#define MM_CHUNK 4    /* values in a 16-byte chunk */
#else
#define MM_BITS  ushort
#define MM_CHUNK 8
#endif
/* The 16-byte chunks of a's and b's slices, and how many each work-item fetches (the last round
 * partial where a group of 4 subgroups of 64 outnumbers them). */
#define MM_ACHUNKS (MM_BM * MM_BK / MM_CHUNK)
#define MM_BCHUNKS (MM_BN * MM_BK / MM_CHUNK)
#define MM_AREGS ((MM_ACHUNKS + MM_THREADS - 1) / MM_THREADS)
#define MM_BREGS ((MM_BCHUNKS + MM_THREADS - 1) / MM_THREADS)
/* Row strides of the local slices in 32-bit words, rows 16-byte aligned. 16-bit values: 4 more
 * than a row's words, so that the eight 16-byte rows of an 8 x 8 block that a fragment load reads
 * fall in distinct banks (a row's words are a multiple of 8 here). f32: a tf32 fragment's lane
 * (g, t) reads row g's word t (a, and b n-major: 4 more, so 4g + t covers the 32 banks) or row
 * t's word g (b k-major: 8 more, 8t + g). */
#if MMA_T_IS_F32
#define MM_WORDS(values) (values)
#define MM_STRIDE(values) ((values) + 4)
#define MM_KSTRIDE(values) ((values) + 8)
#else
#define MM_WORDS(values) ((values) / 2)
#define MM_STRIDE(values) ((values) / 2 + 4)
#define MM_KSTRIDE(values) MM_STRIDE(values)
#endif
#define MM_AS MM_STRIDE(MM_BK)
#if TRANS_B
#define MM_BROWS MM_BN /* b's slice n-major: MM_BN rows of MM_BK values */
#define MM_BS    MM_STRIDE(MM_BK)
#else
#define MM_BROWS MM_BK /* k-major: MM_BK rows of MM_BN values */
#define MM_BS    MM_KSTRIDE(MM_BN)
#endif

/* The MM_CHUNK values of a row from `at` on, whose first `left` lie inside the matrix (0 past
 * them): one 16-byte load where the host proved ALIGNED and all of them lie inside. */
MMA_INLINE uint4 mm_chunk(__global const MM_BITS *p, IDX at, int left) {
#if ALIGNED
    if (left >= MM_CHUNK) return *(__global const uint4 *)(p + at);
#endif
    uint w[4];
#if MMA_T_IS_F32
    UNROLL for (int i = 0; i < 4; ++i) w[i] = i < left ? p[at + i] : 0u;
#else
    UNROLL for (int i = 0; i < 4; ++i)
        w[i] = (2 * i < left ? (uint)p[at + 2 * i] : 0u) |
               (2 * i + 1 < left ? (uint)p[at + 2 * i + 1] : 0u) << 16;
#endif
    return (uint4)(w[0], w[1], w[2], w[3]);
}

/* The work-item's chunks (`count` rounds of `total`) of a slice of `cols` values a row (a
 * multiple of MM_CHUNK) whose first row is row r0 and first value col c0 of a row-major matrix
 * (rows below `rows_in`, values below `cols_in`; ld apart) into regs: chunk lid + i MM_THREADS is
 * regs[i]. */
MMA_INLINE void mm_fetch(__global const MM_BITS *p, IDX ld, int r0, int rows_in, int c0,
                         int cols_in, const int cols, const int total, const int count,
                         uint4 *regs) {
    const int lid = (int)get_local_id(0);
    /* unrolled (count is a constant once inlined), so that regs stay in registers */
    MMA_NATIVE_UNROLL for (int i = 0; i < count; ++i) {
        const int e = lid + i * MM_THREADS, r = e / (cols / MM_CHUNK);
        const int c = e % (cols / MM_CHUNK) * MM_CHUNK;
        if (total % MM_THREADS != 0 && e >= total) break;
        const int left = r0 + r < rows_in ? cols_in - (c0 + c) : 0;
        regs[i] = mm_chunk(p, (IDX)(r0 + r) * ld + (IDX)(c0 + c), left);
    }
}

/* The chunks mm_fetch took into the local slice, rows `stride` words apart. */
MMA_INLINE void mm_put(const uint4 *regs, const int cols, const int total, const int count,
                       __local uint *slice, int stride) {
    const int lid = (int)get_local_id(0);
    MMA_NATIVE_UNROLL for (int i = 0; i < count; ++i) { /* as mm_fetch's */
        const int e = lid + i * MM_THREADS, r = e / (cols / MM_CHUNK);
        const int c = e % (cols / MM_CHUNK) * MM_CHUNK;
        if (total % MM_THREADS != 0 && e >= total) break;
        *(__local uint4 *)(slice + r * stride + MM_WORDS(c)) = regs[i];
    }
}

/* The slices of a and b at depth k0 into ar and br. */
MMA_INLINE void mm_fetch_slices(__global const MM_BITS *a, IDX lda, __global const MM_BITS *b,
                                IDX ldb, int r0, int c0, int m, int n, int k, int k0,
                                uint4 ar[MM_AREGS], uint4 br[MM_BREGS]) {
    mm_fetch(a, lda, r0, m, k0, k, MM_BK, MM_ACHUNKS, MM_AREGS, ar);
#if TRANS_B
    mm_fetch(b, ldb, c0, n, k0, k, MM_BK, MM_BCHUNKS, MM_BREGS, br);
#else
    mm_fetch(b, ldb, k0, k, c0, n, MM_BN, MM_BCHUNKS, MM_BREGS, br);
#endif
}

#if MMA_T_IS_F32
/* The tf32 parts (cl/mma.cl's 3xTF32 split) of the lane's A fragment of the 16 x 8 block of a's
 * slice at row r0 and depth k0 (m16n8k8's layout: rows g, g + 8, depths t, t + 4). */
MMA_INLINE void mm_split_a(uint big[4], uint small[4], const __local uint *as, int r0, int k0) {
    const int lane = (int)get_local_id(0) % MMA_WARP, g = lane / 4, t = lane % 4;
    UNROLL for (int r = 0; r < 4; ++r) {
        const float x = as_float(as[(r0 + g + (r & 1) * 8) * MM_AS + k0 + t + (r >> 1) * 4]);
        mma_tf32_split(x, &big[r], &small[r], 1);
    }
}

/* The same of the B fragment of b's 8 x 8 block at depth k0 and column c0 (depths t, t + 4 of
 * column g), b's slice n-major (TRANS_B) or k-major. */
MMA_INLINE void mm_split_b(uint big[2], uint small[2], const __local uint *bs, int c0, int k0) {
    const int lane = (int)get_local_id(0) % MMA_WARP, g = lane / 4, t = lane % 4;
    UNROLL for (int r = 0; r < 2; ++r) {
        const int k = k0 + t + 4 * r, n = c0 + g;
        const float x = as_float(TRANS_B ? bs[n * MM_BS + k] : bs[k * MM_BS + n]);
        mma_tf32_split(x, &big[r], &small[r], 1);
    }
}

/* acc += the subgroup's products over one 16-deep step `s` of the staged slices (rows from wr of
 * a's slice, columns from wc of b's), two 8-deep halves of 3xTF32 products: a tile's columns
 * 0-7 are floats 0-3 of its accumulators, 8-15 floats 4-7 (mma_c_at's layout for MMA_NV). */
MMA_INLINE void mm_step(const __local uint *as, const __local uint *bs, int wr, int wc, int s,
                        float acc[MM_MT][MM_NT][MMA_CV], __local float *scratch) {
    MMA_NATIVE_UNROLL for (int h = 0; h < 2; ++h) {
        const int k0 = s * 16 + h * 8;
        uint a_big[MM_MT][4], a_small[MM_MT][4];
        MMA_NATIVE_UNROLL for (int mt = 0; mt < MM_MT; ++mt)
            mm_split_a(a_big[mt], a_small[mt], as, wr + mt * 16, k0);
        MMA_NATIVE_UNROLL for (int nb = 0; nb < 2 * MM_NT; ++nb) {
            uint b_big[2], b_small[2];
            mm_split_b(b_big, b_small, bs, wc + nb * 8, k0);
            MMA_NATIVE_UNROLL for (int mt = 0; mt < MM_MT; ++mt) {
                float *d = acc[mt][nb / 2] + nb % 2 * 4;
                mma_m16n8k8x3(d, a_big[mt], a_small[mt], b_big, b_small, d, scratch);
            }
        }
    }
}

/* a[row] . b[col] (b n-major with TRANS_B) in plain f32 FMAs, in order of k: an output whose
 * 3xTF32 sum came out NaN or Inf. The split cannot take NaN, Inf or a value within 2^-12 of
 * f32's largest (its big part rounds to Inf; a product of such parts is NaN or Inf), so such an
 * output is taken again as an FMA GEMM would give it: Inf where that gives Inf, not NaN. */
inline float mm_plain_dot(__global const uint *a, IDX lda, __global const uint *b, IDX ldb,
                          int row, int col, int k) {
    float sum = 0.0f;
    for (int e = 0; e < k; ++e) {
        const IDX at_b = TRANS_B ? (IDX)col * ldb + (IDX)e : (IDX)e * ldb + (IDX)col;
        sum = fma(as_float(a[(IDX)row * lda + (IDX)e]), as_float(b[at_b]), sum);
    }
    return sum;
}
#else
/* acc += the subgroup's products over one 16-deep step `s` of the staged slices; its rows start
 * at row wr of a's slice, its columns at column wc of b's. */
MMA_INLINE void mm_step(const __local ushort *a16, const __local ushort *b16, int wr, int wc,
                        int s, float acc[MM_MT][MM_NT][MMA_CV], __local float *scratch) {
    uint af[MM_MT][MMA_AW];
    MMA_NATIVE_UNROLL for (int mt = 0; mt < MM_MT; ++mt)
        mma_tile_load_a(af[mt], a16 + (wr + mt * 16) * 2 * MM_AS + s * 16, 2 * MM_AS);
    MMA_NATIVE_UNROLL for (int nt = 0; nt < MM_NT; ++nt) {
        uint bf[MMA_BW];
#if TRANS_B
        mma_tile_load_b(bf, b16 + (wc + nt * 16) * 2 * MM_BS + s * 16, 2 * MM_BS, 0);
#else
        mma_tile_load_b(bf, b16 + s * 16 * 2 * MM_BS + wc + nt * 16, 2 * MM_BS, 1);
#endif
        MMA_NATIVE_UNROLL for (int mt = 0; mt < MM_MT; ++mt)
            mma_tile(acc[mt][nt], af[mt], bf, scratch);
    }
}
#endif

__kernel __attribute__((reqd_work_group_size(MM_THREADS, 1, 1))) MMA_SUBGROUP_ATTRIBUTE void
matmul_mma(__global const MM_BITS *a, ulong a_off, ulong lda, ulong a_stride,
           __global const MM_BITS *b, ulong b_off, ulong ldb, ulong b_stride,
           __global CAT(storage_, C_T) * c, ulong c_off, ulong ldc, ulong c_stride, int m, int n,
           int k, float beta, __global const CAT(storage_, BIAS_T) * bias, ulong bias_off,
           ulong bias_step) {
    __local float scratch[MM_SUBGROUPS * MMA_TILE_SCRATCH];
    __local uint4 as4[MM_BM * MM_AS / 4], bs4[MM_BROWS * MM_BS / 4];
    __local uint *as = (__local uint *)as4, *bs = (__local uint *)bs4;
    const int blocks_m = (m + MM_BM - 1) / MM_BM, blocks_n = (n + MM_BN - 1) / MM_BN;
    const int group = (int)get_group_id(0), i = group / (blocks_m * blocks_n);
    const int r0 = group / blocks_n % blocks_m * MM_BM, c0 = group % blocks_n * MM_BN;
    const int lid = (int)get_local_id(0), sub = lid / MMA_SG, lane = lid % MMA_SG;
    const int wr = sub / 2 * MM_WM, wc = sub % 2 * MM_WN;
    /* indices in IDX: uint where the host proved every element's below 2^31 (32-bit products
     * and addresses: Intel's Xe-HPC emulates 64-bit multiplies, and they cost registers) */
    const IDX ald = (IDX)lda, bld = (IDX)ldb;
    __global const MM_BITS *ai = a + (IDX)a_off + (IDX)i * (IDX)a_stride,
                           *bi = b + (IDX)b_off + (IDX)i * (IDX)b_stride;
    float acc[MM_MT][MM_NT][MMA_CV];
    UNROLL for (int mt = 0; mt < MM_MT; ++mt)
        UNROLL for (int nt = 0; nt < MM_NT; ++nt)
            UNROLL for (int f = 0; f < MMA_CV; ++f) acc[mt][nt][f] = 0.0f;
    uint4 ar[MM_AREGS], br[MM_BREGS];
    if (MM_AHEAD && k > 0) mm_fetch_slices(ai, ald, bi, bld, r0, c0, m, n, k, 0, ar, br);
    for (int k0 = 0; k0 < k; k0 += MM_BK) {
        if (!MM_AHEAD) mm_fetch_slices(ai, ald, bi, bld, r0, c0, m, n, k, k0, ar, br);
        barrier(CLK_LOCAL_MEM_FENCE); /* everyone is done with the last slice */
        mm_put(ar, MM_BK, MM_ACHUNKS, MM_AREGS, as, MM_AS);
        mm_put(br, TRANS_B ? MM_BK : MM_BN, MM_BCHUNKS, MM_BREGS, bs, MM_BS);
        barrier(CLK_LOCAL_MEM_FENCE);
        if (MM_AHEAD && k0 + MM_BK < k)
            mm_fetch_slices(ai, ald, bi, bld, r0, c0, m, n, k, k0 + MM_BK, ar, br);
        MMA_NATIVE_UNROLL for (int s = 0; s < MM_BK / 16; ++s)
            mm_step((const __local MM_BITS *)as, (const __local MM_BITS *)bs, wr, wc, s,
                    acc, scratch);
    }
    __global CAT(storage_, C_T) *ci = c + (IDX)c_off + (IDX)i * (IDX)c_stride;
    UNROLL for (int mt = 0; mt < MM_MT; ++mt)
        UNROLL for (int nt = 0; nt < MM_NT; ++nt)
            UNROLL for (int f = 0; f < MMA_CV; ++f) {
                const int at = mma_c_at(lane, f);
                const int row = r0 + wr + mt * 16 + at / 16, col = c0 + wc + nt * 16 + at % 16;
                if (row >= m || col >= n) continue;
                __global CAT(storage_, C_T) *to = ci + (IDX)row * (IDX)ldc + (IDX)col;
                float x = acc[mt][nt][f];
#if MMA_T_IS_F32
                if (!isfinite(x)) x = mm_plain_dot(ai, ald, bi, bld, row, col, k);
#endif
#if HAS_BIAS
                x += CAT(load_, BIAS_T)(bias + (IDX)bias_off + (IDX)col * (IDX)bias_step, 0);
#endif
                if (beta != 0.0f) x = fma(beta, CAT(load_, C_T)(to, 0), x);
                CAT(store_, C_T)(to, 0, x);
            }
}
#endif /* MATMUL_MMA */
