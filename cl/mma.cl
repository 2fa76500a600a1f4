/*
 * Warp-level matrix products in the shape of NVIDIA's tensor-core instruction
 * mma.sync.aligned.m16n8k16 (f32 accumulators, f16 or bf16 inputs), in one of two builds:
 *
 *   MMA_PTX 1  the instruction itself, as inline PTX, which only NVIDIA's OpenCL compiler takes.
 *              The host builds it only for a device whose probe (matrix_probe below, run by
 *              src/runtime/matrix_units.c) returned the exact product.
 *   MMA_PTX 0  the same warp-level semantics through local memory, on any device: how kernels
 *              built on mma_m16n8k16 run on PoCL and Oclgrind, so that CI tests their fragment
 *              layouts, and how the probe's own check is tested.
 *
 * A warp is 32 consecutive work-items of a 1-D work-group (lane = local id % 32: NVIDIA's
 * order, which the probe confirms, since a wrong order gives a wrong product). The group is
 * whole warps, and all its work-items call mma_m16n8k16 together (the emulation has barriers).
 *
 * Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16"), g = lane / 4, t = lane % 4; a uint
 * holds two 16-bit values, the lower column (or k) in its low half:
 *   A, 16 x 16 (m x k):  a[0] = A[g][2t, 2t+1]   a[1] = A[g+8][2t, 2t+1]
 *                        a[2] = A[g][2t+8, 2t+9] a[3] = A[g+8][2t+8, 2t+9]
 *   B, 16 x 8 (k x n):   b[0] = B[2t, 2t+1][g]   b[1] = B[2t+8, 2t+9][g]
 *   C, D, 16 x 8 (f32):  c[0], c[1] = C[g][2t, 2t+1]   c[2], c[3] = C[g+8][2t, 2t+1]
 *
 * Build options: MMA_T (f16 | bf16, the inputs' type; f32 for the 3xTF32 products of the tf32
 * unit, below), MMA_PTX, MMA_ASM, MMA_UNIT and MMA_NATIVE (the subgroup tile below), MMA_PROBE (1:
 * the probe kernels, matrix_probe with MMA_UNIT MMA_NV and tile_probe, or with MMA_T f32
 * tf32_probe; the host prepends this file to the programs that use the primitives),
 * MMA_PROBE_BREAK (the probe's negative tests: 1, one lane's result off by one; 2, an exchange
 * that returns a lane's own value; 3, B's fragments loaded untransposed, tf32_probe's small
 * products left out).
 */
#ifndef CLATTN_MMA_CL
#define CLATTN_MMA_CL

#ifndef CLATTN_COMMON_CL
#include "common.cl"
#endif

#ifndef MMA_T
#define MMA_T f16
#endif
/* The mechanisms of the subgroup tile (below); MMA_UNIT picks one, MMA_NATIVE its instruction (1)
 * or the emulation of its layouts (0). */
#define MMA_NV     1
#define MMA_WMMA   2
#define MMA_MFMA   3
#define MMA_DPAS8  4
#define MMA_DPAS16 5
#ifndef MMA_UNIT
#define MMA_UNIT MMA_NV
#endif
#ifndef MMA_NATIVE
#define MMA_NATIVE 0
#endif
#ifndef MMA_PTX
#define MMA_PTX (MMA_NATIVE && MMA_UNIT == MMA_NV)
#endif
#ifndef MMA_PROBE
#define MMA_PROBE 0
#endif
#ifndef MMA_PROBE_BREAK
#define MMA_PROBE_BREAK 0
#endif
/* The inline-assembly keyword: `asm`, as NVIDIA's OpenCL compiler takes it (genefer and other
 * OpenCL programs use it there); clang takes only `__asm__` in OpenCL C (-DMMA_ASM=__asm__ for
 * an offline PTX build). */
#ifndef MMA_ASM
#define MMA_ASM asm
#endif

#define MMA_IS_BF16_f16 0
#define MMA_IS_BF16_bf16 1
#define MMA_IS_BF16_f32 0
#define MMA_T_IS_BF16 CAT(MMA_IS_BF16_, MMA_T)
/* MMA_T f32: f32 values on the tf32 unit, three products each (3xTF32, below) */
#define MMA_IS_F32_f16 0
#define MMA_IS_F32_bf16 0
#define MMA_IS_F32_f32 1
#define MMA_T_IS_F32 CAT(MMA_IS_F32_, MMA_T)
#define MMA_PTX_TYPE_f16 "f16"
#define MMA_PTX_TYPE_bf16 "bf16"
#define MMA_PTX_TYPE_f32 "f32" /* no such m16n8k16: f32 builds use m16n8k8 (ptxas refuses it) */
#define MMA_PTX_TYPE CAT(MMA_PTX_TYPE_, MMA_T)

#define MMA_WARP 32
/* The helpers of kernels built on these products, which pass fragment arrays to each other:
 * always inlined, since a compiler that keeps one as a call passes its arrays through the stack
 * (clang's sm_80 PTX of attention_mma did: a thousand local-memory loads and stores a tile). */
#define MMA_INLINE inline __attribute__((always_inline))
/* Local floats the emulation takes per warp: A and B as floats for a product, 16 rows x 4 lanes
 * for an exchange. The PTX build takes none (the instruction, and shfl.sync for exchanges). */
#if MMA_PTX
#define MMA_SCRATCH_FLOATS 1
#define MMA_EXCHANGE_FLOATS 1
#else
#define MMA_SCRATCH_FLOATS (16 * 16 + 16 * 8)
#define MMA_EXCHANGE_FLOATS (16 * 4)
#endif

/* The 16-bit value in the low (high = 0) or high half of a fragment word, as a float. */
inline float mma_half_value(uint word, int high) {
    ushort bits = (ushort)(high ? word >> 16 : word & 0xffffu);
#if MMA_T_IS_BF16
    return as_float((uint)bits << 16);
#else
    return vload_half(0, (__private const half *)&bits);
#endif
}

/* The emulations' sums: acc + x[k] y[k * y_step] for k < n, in order of k. */
inline float mma_emulated_dot(const __local float *x, const __local float *y, int y_step, int n,
                              float acc) {
    for (int k = 0; k < n; ++k) acc = fma(x[k], y[k * y_step], acc);
    return acc;
}

/* d = a b + c for the warp's fragments (the layouts above). `scratch` holds MMA_SCRATCH_FLOATS
 * per warp of the group. */
inline void mma_m16n8k16(float d[4], const uint a[4], const uint b[2], const float c[4],
                         __local float *scratch) {
#if MMA_PTX
    (void)scratch;
    MMA_ASM volatile("mma.sync.aligned.m16n8k16.row.col.f32." MMA_PTX_TYPE "." MMA_PTX_TYPE
                 ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]),
                   "f"(c[1]), "f"(c[2]), "f"(c[3]));
#else
    const int lid = (int)get_local_id(0), lane = lid % MMA_WARP, g = lane / 4, t = lane % 4;
    __local float *sa = scratch + (lid / MMA_WARP) * MMA_SCRATCH_FLOATS, *sb = sa + 16 * 16;
    for (int r = 0; r < 4; ++r) {
        const int row = g + (r & 1) * 8, col = 2 * t + (r >> 1) * 8;
        sa[row * 16 + col] = mma_half_value(a[r], 0);
        sa[row * 16 + col + 1] = mma_half_value(a[r], 1);
    }
    for (int r = 0; r < 2; ++r) {
        const int k = 2 * t + r * 8;
        sb[k * 8 + g] = mma_half_value(b[r], 0);
        sb[(k + 1) * 8 + g] = mma_half_value(b[r], 1);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int i = 0; i < 4; ++i)
        d[i] = mma_emulated_dot(sa + (g + (i >> 1) * 8) * 16, sb + 2 * t + (i & 1), 8, 16, c[i]);
    barrier(CLK_LOCAL_MEM_FENCE); /* the scratch is free for the next product */
#endif
}

/* Four 8 x 8 blocks of 16-bit values in local memory, loaded as ldmatrix.x4 loads them: block i's
 * row j starts at b[i] + j * stride (16-byte aligned), and the lane (g, t) gets r[i] = block i's
 * [g][2t, 2t + 1] (trans 0: an A fragment's word, or a B fragment's of a matrix stored n-major)
 * or its [2t][g] and [2t + 1][g] (trans 1: a B fragment's word of a matrix stored k-major). The
 * PTX build is the instruction (each lane gives one row's address: lane 8i + j block i's row j);
 * the emulation reads the values one by one. `trans` must be a constant. */
MMA_INLINE void mma_load_blocks(uint r[4], __local const ushort *b0, __local const ushort *b1,
                                __local const ushort *b2, __local const ushort *b3, int stride,
                                const int trans) {
    const int lane = (int)get_local_id(0) % MMA_WARP;
#if MMA_PTX
    __local const ushort *block = lane < 8 ? b0 : lane < 16 ? b1 : lane < 24 ? b2 : b3;
    const uint at = (uint)(size_t)(block + (lane % 8) * stride); /* a shared-window address */
    if (trans)
        MMA_ASM volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                         : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                         : "r"(at)
                         : "memory");
    else
        MMA_ASM volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                         : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                         : "r"(at)
                         : "memory");
#else
    const int g = lane / 4, t = lane % 4;
    __local const ushort *const blocks[4] = {b0, b1, b2, b3};
    for (int i = 0; i < 4; ++i) {
        const __local ushort *x = blocks[i];
        r[i] = trans ? (uint)x[2 * t * stride + g] | (uint)x[(2 * t + 1) * stride + g] << 16
                     : (uint)x[g * stride + 2 * t] | (uint)x[g * stride + 2 * t + 1] << 16;
    }
#endif
}

/* 16 bytes from global to local memory (both 16-byte aligned): the PTX build's cp.async
 * (asynchronous, through no register: the copy lands while the warp computes), the emulation's
 * plain copy. A copy is complete, and visible to the work-item that made it, after
 * mma_copy_commit and mma_copy_wait; to the group after a barrier that follows those. */
MMA_INLINE void mma_copy16(__local uint *dst, __global const void *src) {
#if MMA_PTX
    MMA_ASM volatile("cp.async.cg.shared.global [%0], [%1], 16;"
                     :
                     : "r"((uint)(size_t)dst), "l"((ulong)(size_t)src)
                     : "memory");
#else
    *(__local uint4 *)dst = *(__global const uint4 *)src;
#endif
}

/* The work-item's copies since the last commit form a group; the wait returns once every
 * committed group has landed. */
MMA_INLINE void mma_copy_commit(void) {
#if MMA_PTX
    MMA_ASM volatile("cp.async.commit_group;" ::: "memory");
#endif
}

MMA_INLINE void mma_copy_wait(void) {
#if MMA_PTX
    MMA_ASM volatile("cp.async.wait_group 0;" ::: "memory");
#endif
}

/* The value v of lane (lane ^ mask) of the warp: shfl.sync.bfly, or through `xs`
 * (MMA_EXCHANGE_FLOATS per warp of the group; all work-items of the group call it together). */
inline float mma_lane_xor(float v, int mask, __local float *xs) {
#if MMA_PTX
    (void)xs;
    uint r;
    MMA_ASM volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;"
                     : "=r"(r)
                     : "r"(as_uint(v)), "r"(mask));
    return as_float(r);
#else
    const int lid = (int)get_local_id(0), lane = lid % MMA_WARP;
    __local float *w = xs + (lid / MMA_WARP) * MMA_EXCHANGE_FLOATS;
    w[lane] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    const float r = w[lane ^ mask];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
#endif
}

/* v[0] and v[1] (a fragment's rows g and g + 8) combined across the four lanes of a quad, which
 * hold the rest of those rows: the largest (is_max 1) or the sum. Every lane gets the same
 * bits in both builds: fmax(fmax(v0, v1), fmax(v2, v3)) and (v0 + v1) + (v2 + v3), lane i's own
 * value being vi. */
inline void mma_quad_reduce(float v[2], int is_max, __local float *xs) {
#if MMA_PTX
    for (int r = 0; r < 2; ++r)
        for (int mask = 1; mask <= 2; mask *= 2) {
            const float other = mma_lane_xor(v[r], mask, xs);
            v[r] = is_max ? fmax(v[r], other) : v[r] + other;
        }
#else
    const int lid = (int)get_local_id(0), lane = lid % MMA_WARP, g = lane / 4, t = lane % 4;
    __local float *w = xs + (lid / MMA_WARP) * MMA_EXCHANGE_FLOATS;
    w[g * 4 + t] = v[0];
    w[(g + 8) * 4 + t] = v[1];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int r = 0; r < 2; ++r) {
        const __local float *row = w + (g + 8 * r) * 4;
        v[r] = is_max ? fmax(fmax(row[0], row[1]), fmax(row[2], row[3]))
                      : (row[0] + row[1]) + (row[2] + row[3]);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
#endif
}

/* ---- f32 products on the tf32 unit (3xTF32) -------------------------------------------------
 * mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 multiplies tf32 values (f32's sign and
 * exponent with 10 mantissa bits) exactly and adds in f32. An f32 product takes three of them, as
 * CUTLASS's 3xTF32 (OpMultiplyAddFastF32, which PyTorch's f32 attention runs on these GPUs): each
 * value is split into big, its top 11 significant bits (rounded to nearest, ties away), and small,
 * the next 11 of the rest, and a b = a_small b_big + a_big b_small + a_big b_big. What is dropped,
 * a_small b_small and the bits below small, is at most about 2^-21 of |a b| (f32's own rounding:
 * 2^-24 an operation).
 * Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k8", .tf32), g = lane / 4, t = lane % 4, a
 * uint holding one tf32 value:
 *   A, 16 x 8 (m x k):  a[0] = A[g][t]  a[1] = A[g+8][t]  a[2] = A[g][t+4]  a[3] = A[g+8][t+4]
 *   B, 8 x 8 (k x n):   b[0] = B[t][g]  b[1] = B[t+4][g]
 *   C, D, 16 x 8:       as m16n8k16's. */
#define MMA_TF32_MASK 0xffffe000u /* a tf32 value's bits within an f32 */

/* x as big + small (above), both as tf32 bits; `round` (a constant) 1: big rounded to nearest
 * (for |x| within 2^-12 of f32's largest it rounds to Inf, and a NaN or Inf x gives a NaN small
 * part: products of such parts come out NaN or Inf), 0: truncated (any finite x gives finite
 * parts; small then takes up to 13 bits, of which it keeps 11, and the split drops about 2^-20
 * of |x|). */
inline void mma_tf32_split(float x, uint *big, uint *small, const int round) {
    *big = (as_uint(x) + (round ? 0x1000u : 0u)) & MMA_TF32_MASK;
    *small = as_uint(x - as_float(*big)) & MMA_TF32_MASK;
}

#if MMA_PTX
/* d = a b + c on tf32 fragments (the layouts above). */
inline void mma_m16n8k8_tf32(float d[4], const uint a[4], const uint b[2], const float c[4]) {
    MMA_ASM volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, "
                     "{%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};"
                     : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
                       "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}
#endif

/* d = a b + c in f32 from split fragments: the small products first, so that they meet c before
 * the big one. `scratch` holds MMA_SCRATCH_FLOATS per warp of the group: the emulation's parts of
 * A and B, which it reads as the unit does (their tf32 bits), all three products between one
 * pair of barriers (each barrier splits PoCL's work-item loops: three pairs a product made its
 * attention kernel take minutes to compile). */
MMA_INLINE void mma_m16n8k8x3(float d[4], const uint a_big[4], const uint a_small[4],
                              const uint b_big[2], const uint b_small[2], const float c[4],
                              __local float *scratch) {
#if MMA_PTX
    (void)scratch;
    mma_m16n8k8_tf32(d, a_small, b_big, c);
    mma_m16n8k8_tf32(d, a_big, b_small, d);
    mma_m16n8k8_tf32(d, a_big, b_big, d);
#else
    const int lid = (int)get_local_id(0), lane = lid % MMA_WARP, g = lane / 4, t = lane % 4;
    /* A's big and small parts (16 x 8 each), then B's (8 x 8 each) */
    __local float *sa = scratch + (lid / MMA_WARP) * MMA_SCRATCH_FLOATS, *sb = sa + 2 * 16 * 8;
    for (int r = 0; r < 4; ++r) {
        const int at = (g + (r & 1) * 8) * 8 + t + (r >> 1) * 4;
        sa[at] = as_float(a_big[r] & MMA_TF32_MASK);
        sa[16 * 8 + at] = as_float(a_small[r] & MMA_TF32_MASK);
    }
    for (int r = 0; r < 2; ++r) {
        sb[(t + r * 4) * 8 + g] = as_float(b_big[r] & MMA_TF32_MASK);
        sb[8 * 8 + (t + r * 4) * 8 + g] = as_float(b_small[r] & MMA_TF32_MASK);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int i = 0; i < 4; ++i) {
        const int row = g + (i >> 1) * 8, col = 2 * t + (i & 1);
        float acc = c[i];
        for (int p = 0; p < 3; ++p) /* small big, big small, big big */
            acc = mma_emulated_dot(sa + (p == 0 ? 16 * 8 : 0) + row * 8,
                                   sb + (p == 1 ? 8 * 8 : 0) + col, 8, 8, acc);
        d[i] = acc;
    }
    barrier(CLK_LOCAL_MEM_FENCE); /* the scratch is free for the next product */
#endif
}

/* The loops around products: unrolled for the instruction, so that fragment arrays stay in
 * registers; rolled for the emulation, for its barriers' sake (above). */
#if MMA_PTX
#define MMA_UNROLL UNROLL
#else
#define MMA_UNROLL _Pragma("unroll 1")
#endif
/* The same for kernels on the subgroup tile (below): unrolled for any unit's instruction, rolled
 * for the emulations, whose barriers, unrolled, made PoCL's builds of matmul_mma's and
 * attention_units' emulations take 1.2-1.45 times as long (and PoCL cannot unroll some loops
 * as asked: it warns). */
#if MMA_NATIVE
#define MMA_NATIVE_UNROLL UNROLL
#else
#define MMA_NATIVE_UNROLL _Pragma("unroll 1")
#endif

/* ---- The subgroup tile: D (16 x 16, f32) += A (16 x 16) B (16 x 16) ----------------------------
 * One product shape on every mechanism clattn drives, so that a kernel written on it (matmul_mma)
 * runs on each. MMA_UNIT picks the mechanism:
 *   MMA_NV      NVIDIA mma.sync.m16n8k16 twice (columns 0-7 and 8-15), fragments by ldmatrix;
 *               warps of 32. Native: MMA_PTX.
 *   MMA_WMMA    AMD RDNA3 v_wmma_f32_16x16x16 (__builtin_amdgcn_wmma_*_w32), waves of 32.
 *   MMA_MFMA    AMD CDNA2/3 v_mfma_f32_16x16x16 (__builtin_amdgcn_mfma_*), waves of 64.
 *   MMA_DPAS8   Intel dpas through cl_intel_subgroup_matrix_multiply_accumulate on a device whose
 *               subgroups are 8 wide (Xe-HPG): four 8 x 8 products (M = 8, N = 8).
 *   MMA_DPAS16  the same where subgroups are 16 wide (Xe-HPC, Xe2): two 8 x 16 products.
 * MMA_NATIVE 1 builds the instruction (the host does so only where the mechanism's probe returned
 * the exact product); 0 builds an emulation of the same layouts through local memory, on any
 * device: how CI tests every mechanism's layouts and the kernels written on them.
 *
 * A subgroup is MMA_SG consecutive work-items of a 1-D work-group (lane = local id % MMA_SG, as
 * every one of these devices numbers them; the probe proves it, since another order gives
 * another product), all of which call the tile functions together. A lane holds MMA_AV values of
 * A and MMA_BV of B in uint words (value 2w in word w's low half, 2w + 1 in its high half) and
 * MMA_CV floats of D, at the places mma_a_at, mma_b_at and mma_c_at give. The layouts are the
 * vendors' (PTX ISA "Matrix Fragments for mma.m16n8k16"; AMD's RDNA3 ISA and matrix instruction
 * calculator; the Intel extension's specification), as the probe checks on each device. */
#if MMA_UNIT == MMA_NV
#define MMA_SG 32
#define MMA_AV 8
#define MMA_BV 8
#define MMA_CV 8
#elif MMA_UNIT == MMA_WMMA
#define MMA_SG 32
#define MMA_AV 16 /* lanes 16-31 hold the same A and B as lanes 0-15 */
#define MMA_BV 16
#define MMA_CV 8
#elif MMA_UNIT == MMA_MFMA
#define MMA_SG 64
#define MMA_AV 4
#define MMA_BV 4
#define MMA_CV 4
#elif MMA_UNIT == MMA_DPAS8
#define MMA_SG 8
#define MMA_AV 32
#define MMA_BV 32
#define MMA_CV 32
#elif MMA_UNIT == MMA_DPAS16
#define MMA_SG 16
#define MMA_AV 16
#define MMA_BV 16
#define MMA_CV 16
#else
#error "MMA_UNIT names no mechanism"
#endif
#define MMA_AW (MMA_AV / 2)
#define MMA_BW (MMA_BV / 2)
/* The lanes that hold distinct values of A and B (WMMA's upper half repeats the lower). */
#define MMA_OWNERS (MMA_UNIT == MMA_WMMA ? 16 : MMA_SG)
/* Local floats a subgroup's product takes: the NVIDIA build's (above), or A and B as floats for
 * the emulation of the others; their instructions take none. */
#if MMA_UNIT == MMA_NV
#define MMA_TILE_SCRATCH MMA_SCRATCH_FLOATS
#elif MMA_NATIVE
#define MMA_TILE_SCRATCH 1
#else
#define MMA_TILE_SCRATCH (2 * 16 * 16)
#endif
/* The kernel attribute a native Intel build needs: its subgroup size. */
#if MMA_NATIVE && (MMA_UNIT == MMA_DPAS8 || MMA_UNIT == MMA_DPAS16)
#define MMA_SUBGROUP_ATTRIBUTE __attribute__((intel_reqd_sub_group_size(MMA_SG)))
#else
#define MMA_SUBGROUP_ATTRIBUTE
#endif
#if MMA_NATIVE && (MMA_UNIT == MMA_WMMA || MMA_UNIT == MMA_MFMA)
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
#endif

/* Where the lane's value j of A lies: row * 16 + k. */
inline int mma_a_at(int lane, int j) {
#if MMA_UNIT == MMA_NV
    const int r = j / 2; /* the fragment word of cl/mma.cl's m16n8k16 layout */
    return (lane / 4 + (r & 1) * 8) * 16 + 2 * (lane % 4) + (r >> 1) * 8 + j % 2;
#elif MMA_UNIT == MMA_WMMA
    return lane % 16 * 16 + j;
#elif MMA_UNIT == MMA_MFMA
    return lane % 16 * 16 + lane / 16 * 4 + j;
#elif MMA_UNIT == MMA_DPAS8
    return (j / 16 * 8 + j % 16 / 2) * 16 + 2 * lane + j % 2; /* int8 per 8 rows: k 2l, 2l + 1 */
#else
    return j * 16 + lane; /* short8 per 8 rows: k = lane */
#endif
}

/* Where the lane's value j of B lies: k * 16 + n. */
inline int mma_b_at(int lane, int j) {
#if MMA_UNIT == MMA_NV
    const int r = j % 4 / 2; /* words 0, 1: columns 0-7; words 2, 3: columns 8-15 */
    return (2 * (lane % 4) + r * 8 + j % 2) * 16 + j / 4 * 8 + lane / 4;
#elif MMA_UNIT == MMA_WMMA
    return j * 16 + lane % 16;
#elif MMA_UNIT == MMA_MFMA
    return (lane / 16 * 4 + j) * 16 + lane % 16;
#elif MMA_UNIT == MMA_DPAS8
    return j % 16 * 16 + j / 16 * 8 + lane; /* int8 per 8 columns: k 2i, 2i + 1 in word i */
#else
    return j * 16 + lane;
#endif
}

/* Where the lane's float i of D lies: row * 16 + n. */
inline int mma_c_at(int lane, int i) {
#if MMA_UNIT == MMA_NV
    const int f = i % 4;
    return (lane / 4 + (f >> 1) * 8) * 16 + i / 4 * 8 + 2 * (lane % 4) + (f & 1);
#elif MMA_UNIT == MMA_WMMA
    return (2 * i + lane / 16) * 16 + lane % 16;
#elif MMA_UNIT == MMA_MFMA
    return (lane / 16 * 4 + i) * 16 + lane % 16;
#elif MMA_UNIT == MMA_DPAS8
    return (i / 16 * 8 + i % 8) * 16 + i / 8 % 2 * 8 + lane; /* float8 per (8 rows, 8 columns) */
#else
    return i * 16 + lane;
#endif
}

/* The 16-bit value at tile place `at` (row * 16 + col) of a local matrix, rows `stride` apart. */
#define MMA_TILE_VALUE(p, at, stride) ((uint)(p)[(at) / 16 * (stride) + (at) % 16])

/* A's 16 x 16 tile at p (A[r][k] at p[r * stride + k], rows 16-byte aligned) into the lane's
 * words. */
MMA_INLINE void mma_tile_load_a(uint a[MMA_AW], __local const ushort *p, int stride) {
#if MMA_UNIT == MMA_NV
    mma_load_blocks(a, p, p + 8 * stride, p + 8, p + 8 * stride + 8, stride, 0);
#else
    const int lane = (int)get_local_id(0) % MMA_SG;
    for (int w = 0; w < MMA_AW; ++w) {
        const int at = mma_a_at(lane, 2 * w);
#if MMA_UNIT == MMA_DPAS16
        a[w] = MMA_TILE_VALUE(p, at, stride) | MMA_TILE_VALUE(p, mma_a_at(lane, 2 * w + 1), stride)
                                                   << 16; /* a word is two rows' values */
#else
        a[w] = *(__local const uint *)(p + at / 16 * stride + at % 16); /* k, k + 1 of a row */
#endif
    }
#endif
}

/* B's 16 x 16 tile at p into the lane's words: k-major (B[k][n] at p[k * stride + n]) or n-major
 * (at p[n * stride + k]); `kmajor` must be a constant. */
MMA_INLINE void mma_tile_load_b(uint b[MMA_BW], __local const ushort *p, int stride,
                                const int kmajor) {
#if MMA_UNIT == MMA_NV
    __local const ushort *y = p + 8 * stride;
    if (kmajor)
        mma_load_blocks(b, p, y, p + 8, y + 8, stride, 1);
    else
        mma_load_blocks(b, p, p + 8, y, y + 8, stride, 0);
#else
    const int lane = (int)get_local_id(0) % MMA_SG;
    for (int w = 0; w < MMA_BW; ++w) {
        const int at = mma_b_at(lane, 2 * w), k = at / 16, n = at % 16;
        if (kmajor) /* the word's values k, k + 1 are two rows apart */
            b[w] = (uint)p[k * stride + n] | (uint)p[(k + 1) * stride + n] << 16;
        else
            b[w] = *(__local const uint *)(p + n * stride + k);
    }
#endif
}

#if !MMA_NATIVE && MMA_UNIT != MMA_NV
/* d += a b through local memory, per the layouts above: the owning lanes scatter A and B as
 * floats, then each lane sums its places of D in order of k. */
inline void mma_tile_emulated(float d[MMA_CV], const uint a[MMA_AW], const uint b[MMA_BW],
                              __local float *scratch) {
    const int lid = (int)get_local_id(0), lane = lid % MMA_SG;
    __local float *sa = scratch + lid / MMA_SG * MMA_TILE_SCRATCH, *sb = sa + 16 * 16;
    if (lane < MMA_OWNERS) {
        for (int j = 0; j < MMA_AV; ++j) sa[mma_a_at(lane, j)] = mma_half_value(a[j / 2], j % 2);
        for (int j = 0; j < MMA_BV; ++j) sb[mma_b_at(lane, j)] = mma_half_value(b[j / 2], j % 2);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int i = 0; i < MMA_CV; ++i) {
        const int at = mma_c_at(lane, i);
        d[i] = mma_emulated_dot(sa + at / 16 * 16, sb + at % 16, 16, 16, d[i]);
    }
    barrier(CLK_LOCAL_MEM_FENCE); /* the scratch is free for the next product */
}
#endif

#if MMA_T_IS_BF16
#define MMA_DPAS intel_sub_group_bf16_bf16_matrix_mad_k16
#else
#define MMA_DPAS intel_sub_group_f16_f16_matrix_mad_k16
#endif

/* d += a b for the subgroup's tiles; `scratch` holds MMA_TILE_SCRATCH floats per subgroup of the
 * group. */
MMA_INLINE void mma_tile(float d[MMA_CV], const uint a[MMA_AW], const uint b[MMA_BW],
                         __local float *scratch) {
#if MMA_UNIT == MMA_NV
    mma_m16n8k16(d, a, b, d, scratch);
    mma_m16n8k16(d + 4, a, b + 2, d + 4, scratch);
#elif !MMA_NATIVE
    mma_tile_emulated(d, a, b, scratch);
#elif MMA_UNIT == MMA_WMMA
    (void)scratch;
    const uint8 wa = vload8(0, a), wb = vload8(0, b);
#if MMA_T_IS_BF16
    vstore8(__builtin_amdgcn_wmma_f32_16x16x16_bf16_w32(as_short16(wa), as_short16(wb),
                                                        vload8(0, d)),
            0, d);
#else
    vstore8(__builtin_amdgcn_wmma_f32_16x16x16_f16_w32(as_half16(wa), as_half16(wb),
                                                       vload8(0, d)),
            0, d);
#endif
#elif MMA_UNIT == MMA_MFMA
    (void)scratch;
    const uint2 wa = vload2(0, a), wb = vload2(0, b);
#if MMA_T_IS_BF16
    vstore4(__builtin_amdgcn_mfma_f32_16x16x16bf16_1k(as_short4(wa), as_short4(wb), vload4(0, d),
                                                      0, 0, 0),
            0, d);
#else
    vstore4(__builtin_amdgcn_mfma_f32_16x16x16f16(as_half4(wa), as_half4(wb), vload4(0, d), 0, 0,
                                                  0),
            0, d);
#endif
#elif MMA_UNIT == MMA_DPAS8
    (void)scratch;
    for (int mh = 0; mh < 2; ++mh) {
        const int8 wa = as_int8(vload8(mh, a));
        for (int nh = 0; nh < 2; ++nh)
            vstore8(MMA_DPAS(wa, as_int8(vload8(nh, b)), vload8(mh * 2 + nh, d)), mh * 2 + nh, d);
    }
#else /* MMA_DPAS16 */
    (void)scratch;
    const int8 wb = as_int8(vload8(0, b));
    for (int mh = 0; mh < 2; ++mh)
        vstore8(MMA_DPAS(as_short8(vload4(mh, a)), wb, vload8(mh, d)), mh, d);
#endif
}

#if MMA_PROBE && MMA_UNIT == MMA_NV && !MMA_T_IS_F32
/* The probe: one warp multiplies A (16 x 16, row-major 16-bit values) by B (16 x 8, row-major)
 * and adds C (16 x 8 floats) into D. A and B are staged in local memory by mma_copy16 and
 * loaded as fragments by mma_load_blocks (A's four blocks plain, B's two transposed), so the
 * copies and the loads are probed with the product. The host gives values whose products and
 * sums are exact in f32, so a correct unit returns exactly the host's product. Each lane stores
 * the fragment of lane ^ 3 (two exchanges, as the quad reductions make them), so the exchange is
 * probed too. */
__kernel __attribute__((reqd_work_group_size(MMA_WARP, 1, 1))) void
matrix_probe(__global const ushort *a, __global const ushort *b, __global const float *c,
             __global float *d) {
    __local float scratch[MMA_SCRATCH_FLOATS], xs[MMA_EXCHANGE_FLOATS];
    __local uint4 staged[(16 * 16 + 16 * 8) / 8]; /* A then B, rows 16-byte aligned */
    __local ushort *sa = (__local ushort *)staged, *sb = sa + 16 * 16;
    const int lane = (int)get_local_id(0), g = lane / 4, t = lane % 4, u = t ^ 3;
    /* A's 32 and B's 16 chunks of 16 bytes, a lane each, copied as kernels stage their tiles */
    mma_copy16((__local uint *)staged + 4 * lane, a + 8 * lane);
    if (lane < 16) mma_copy16((__local uint *)staged + 4 * (32 + lane), b + 8 * lane);
    mma_copy_commit();
    mma_copy_wait();
    barrier(CLK_LOCAL_MEM_FENCE);
    uint fa[4], fb[4];
    float fc[4], fd[4];
    mma_load_blocks(fa, sa, sa + 8 * 16, sa + 8, sa + 8 * 16 + 8, 16, 0);
    mma_load_blocks(fb, sb, sb + 8 * 8, sb, sb + 8 * 8, 8, MMA_PROBE_BREAK == 3 ? 0 : 1);
    for (int i = 0; i < 4; ++i) fc[i] = c[(g + (i >> 1) * 8) * 8 + 2 * t + (i & 1)];
    mma_m16n8k16(fd, fa, fb, fc, scratch);
    for (int i = 0; i < 4; ++i) {
        const float mine = fd[i] + (MMA_PROBE_BREAK && lane == 5 && i == 0 ? 1.0f : 0.0f);
        d[(g + (i >> 1) * 8) * 8 + 2 * u + (i & 1)] =
            mma_lane_xor(mma_lane_xor(mine, 1, xs), MMA_PROBE_BREAK == 2 ? 1 : 2, xs);
    }
}
#endif /* MMA_PROBE && MMA_UNIT == MMA_NV && !MMA_T_IS_F32 */

#if MMA_PROBE && MMA_UNIT == MMA_NV && MMA_T_IS_F32
/* The 3xTF32 probe: one warp computes D = A B + C (A 16 x 8, B 8 x 8, C 16 x 8, row-major
 * floats) twice, from a and b (d) and from a2 and b2 (d + 128), by split fragments and
 * mma_m16n8k8x3, each lane storing the fragment of lane ^ 3 as matrix_probe does. The host's A
 * holds integers of up to 16 bits and its B of 2 (B2 and A2 the other way round), so that each
 * product's small parts matter, every product and sum is exact in f32, and a correct unit
 * returns the host's D exactly. MMA_PROBE_BREAK 1: one lane's result off by one; 2: an exchange
 * that returns a lane's own value; 3: the small products left out. */
__kernel __attribute__((reqd_work_group_size(MMA_WARP, 1, 1))) void
tf32_probe(__global const float *a, __global const float *b, __global const float *a2,
           __global const float *b2, __global const float *c, __global float *d) {
    __local float scratch[MMA_SCRATCH_FLOATS], xs[MMA_EXCHANGE_FLOATS];
    const int lane = (int)get_local_id(0), g = lane / 4, t = lane % 4, u = t ^ 3;
    for (int p = 0; p < 2; ++p) {
        __global const float *x = p ? a2 : a, *y = p ? b2 : b;
        uint a_big[4], a_small[4], b_big[2], b_small[2];
        float fc[4], fd[4];
        for (int r = 0; r < 4; ++r)
            mma_tf32_split(x[(g + (r & 1) * 8) * 8 + t + (r >> 1) * 4], &a_big[r], &a_small[r], 1);
        for (int r = 0; r < 2; ++r)
            mma_tf32_split(y[(t + r * 4) * 8 + g], &b_big[r], &b_small[r], 1);
        if (MMA_PROBE_BREAK == 3) /* the small products left out */
            for (int r = 0; r < 4; ++r) a_small[r] = b_small[r % 2] = 0u;
        for (int i = 0; i < 4; ++i) fc[i] = c[(g + (i >> 1) * 8) * 8 + 2 * t + (i & 1)];
        mma_m16n8k8x3(fd, a_big, a_small, b_big, b_small, fc, scratch);
        for (int i = 0; i < 4; ++i) {
            const float mine = fd[i] + (MMA_PROBE_BREAK == 1 && lane == 5 && i == 0 ? 1.0f : 0.0f);
            d[p * 128 + (g + (i >> 1) * 8) * 8 + 2 * u + (i & 1)] =
                mma_lane_xor(mma_lane_xor(mine, 1, xs), MMA_PROBE_BREAK == 2 ? 1 : 2, xs);
        }
    }
}
#endif /* MMA_PROBE && MMA_UNIT == MMA_NV && MMA_T_IS_F32 */

#if MMA_PROBE && !MMA_T_IS_F32
/* The subgroup tile's probe: one subgroup computes D = A B + C (16 x 16 each; A, B row-major
 * 16-bit values, C floats) twice, B loaded k-major (d) and n-major (d + 256, from a transposed
 * copy), each lane storing its places of D. As matrix_probe's, the values make the product exact,
 * so a correct unit returns exactly the host's D in both. MMA_PROBE_BREAK 1: one lane's result
 * off by one; 3: B's k-major fragments loaded n-major. */
__kernel __attribute__((reqd_work_group_size(MMA_SG, 1, 1))) MMA_SUBGROUP_ATTRIBUTE void
tile_probe(__global const ushort *a, __global const ushort *b, __global const float *c,
           __global float *d) {
    __local float scratch[MMA_TILE_SCRATCH];
    __local uint4 staged[3 * 16 * 16 / 8]; /* A, B k-major, B n-major: rows 16-byte aligned */
    __local ushort *sa = (__local ushort *)staged, *sb = sa + 16 * 16, *sbt = sb + 16 * 16;
    const int lane = (int)get_local_id(0);
    for (int i = lane; i < 16 * 16; i += MMA_SG) {
        sa[i] = a[i];
        sb[i] = b[i];
        sbt[i % 16 * 16 + i / 16] = b[i];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    uint fa[MMA_AW], fb[MMA_BW];
    mma_tile_load_a(fa, sa, 16);
    for (int layout = 0; layout < 2; ++layout) {
        if (layout == 0)
            mma_tile_load_b(fb, sb, 16, MMA_PROBE_BREAK == 3 ? 0 : 1);
        else
            mma_tile_load_b(fb, sbt, 16, 0);
        float fd[MMA_CV];
        for (int i = 0; i < MMA_CV; ++i) fd[i] = c[mma_c_at(lane, i)];
        mma_tile(fd, fa, fb, scratch);
        for (int i = 0; i < MMA_CV; ++i)
            d[layout * 256 + mma_c_at(lane, i)] =
                fd[i] + (MMA_PROBE_BREAK == 1 && lane == 5 && i == 0 ? 1.0f : 0.0f);
    }
}
#endif /* MMA_PROBE && !MMA_T_IS_F32 */

#endif /* CLATTN_MMA_CL */
