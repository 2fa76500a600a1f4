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
 * Build options: MMA_T (f16 | bf16, the inputs' type), MMA_PTX, MMA_ASM, MMA_PROBE (1: the
 * probe kernel; the host prepends this file to the programs that use the primitive),
 * MMA_PROBE_BREAK (the probe's negative tests: 1, one lane's result off by one; 2, an exchange
 * that returns a lane's own value; 3, B's fragments loaded untransposed).
 */
#ifndef CLATTN_MMA_CL
#define CLATTN_MMA_CL

#ifndef CLATTN_COMMON_CL
#include "common.cl"
#endif

#ifndef MMA_T
#define MMA_T f16
#endif
#ifndef MMA_PTX
#define MMA_PTX 0
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
#define MMA_T_IS_BF16 CAT(MMA_IS_BF16_, MMA_T)
#define MMA_PTX_TYPE_f16 "f16"
#define MMA_PTX_TYPE_bf16 "bf16"
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
    for (int i = 0; i < 4; ++i) {
        const int row = g + (i >> 1) * 8, col = 2 * t + (i & 1);
        float acc = c[i];
        for (int k = 0; k < 16; ++k) acc = fma(sa[row * 16 + k], sb[k * 8 + col], acc);
        d[i] = acc;
    }
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

#if MMA_PROBE
/* The probe: one warp multiplies A (16 x 16, row-major 16-bit values) by B (16 x 8, row-major)
 * and adds C (16 x 8 floats) into D. A and B are staged in local memory and loaded as fragments
 * by mma_load_blocks (A's four blocks plain, B's two transposed), so the loads are probed with
 * the product. The host gives values whose products and sums are exact in f32, so a correct unit
 * returns exactly the host's product. Each lane stores the fragment of lane ^ 3 (two exchanges,
 * as the quad reductions make them), so the exchange is probed too. */
__kernel __attribute__((reqd_work_group_size(MMA_WARP, 1, 1))) void
matrix_probe(__global const ushort *a, __global const ushort *b, __global const float *c,
             __global float *d) {
    __local float scratch[MMA_SCRATCH_FLOATS], xs[MMA_EXCHANGE_FLOATS];
    __local uint4 staged[(16 * 16 + 16 * 8) / 8]; /* A then B, rows 16-byte aligned */
    __local ushort *sa = (__local ushort *)staged, *sb = sa + 16 * 16;
    const int lane = (int)get_local_id(0), g = lane / 4, t = lane % 4, u = t ^ 3;
    for (int i = lane; i < 16 * 16; i += MMA_WARP) sa[i] = a[i];
    for (int i = lane; i < 16 * 8; i += MMA_WARP) sb[i] = b[i];
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
#endif /* MMA_PROBE */

#endif /* CLATTN_MMA_CL */
