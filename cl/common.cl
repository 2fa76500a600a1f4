/*
 * Shared helpers for every clattn kernel: storage dtypes and their conversions to and from f32.
 *
 * The host prepends this file to each op file it builds (that defines CLATTN_COMMON_CL, so the
 * op file's #include below is skipped). An offline compiler given `-I cl` includes it instead,
 * which is how every op file compiles alone: `clang -x cl -cl-std=CL1.2 -I cl cl/heads.cl`.
 *
 * Storage dtypes, named by tokens the host passes in -D options:
 *   f32  float          loads and stores as is
 *   f16  half           vload_half / vstore_half: core OpenCL 1.2, no cl_khr_fp16 needed;
 *                       stores round to nearest even (the default rounding mode)
 *   bf16 ushort         the top 16 bits of an f32; stores round to nearest even, NaN stays NaN
 */
#ifndef CLATTN_COMMON_CL
#define CLATTN_COMMON_CL

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)

/* Full unrolling of a loop with a constant trip count (a Clang pragma, ignored where unknown).
 * A private array indexed by such a loop's counter then lives in registers: PoCL's LLVM keeps
 * a variably indexed one on the stack, a load and a store around every FMA of a register tile. */
#define UNROLL _Pragma("unroll")

/* The index type. The host picks uint when every offset of the call fits in 32 bits (cheaper
 * address arithmetic on GPUs), ulong otherwise. */
#ifndef IDX
#define IDX uint
#endif

/* Storage type of each dtype, and the raw-bits type used for bit-exact copies. */
#define storage_f32 float
#define storage_f16 half
#define storage_bf16 ushort
#define size_f32 4
#define size_f16 2
#define size_bf16 2
#define raw_f32 uint
#define raw_f16 ushort
#define raw_bf16 ushort

inline float load_f32(__global const float *p, IDX i) { return p[i]; }
inline float load_f16(__global const half *p, IDX i) { return vload_half(i, p); }
inline float load_bf16(__global const ushort *p, IDX i) { return as_float((uint)p[i] << 16); }

inline void store_f32(__global float *p, IDX i, float v) { p[i] = v; }
inline void store_f16(__global half *p, IDX i, float v) { vstore_half(v, i, p); }

/* Round to nearest even on the 16 dropped bits; a NaN keeps its sign and top payload bits and is
 * made quiet, so it cannot round into an infinity. */
inline ushort bf16_from_f32(float v) {
    uint b = as_uint(v);
    if (isnan(v)) return (ushort)((b >> 16) | 0x40u);
    return (ushort)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}
inline void store_bf16(__global ushort *p, IDX i, float v) { p[i] = bf16_from_f32(v); }

/* Vector loads and stores of width VEC (2, 4, 8 or 16), for the contiguous fast paths. vloadN
 * needs only element alignment, so any offset works. VEC 1 uses the scalar helpers. */
#if defined(VEC) && VEC > 1
#define floatV CAT(float, VEC)
#define uintV CAT(uint, VEC)
#define ushortV CAT(ushort, VEC)

inline floatV CAT(CAT(load, VEC), _f32)(__global const float *p, IDX i) {
    return CAT(vload, VEC)(0, p + i);
}
inline floatV CAT(CAT(load, VEC), _f16)(__global const half *p, IDX i) {
    return CAT(vload_half, VEC)(0, p + i);
}
inline floatV CAT(CAT(load, VEC), _bf16)(__global const ushort *p, IDX i) {
    return CAT(as_float, VEC)(CAT(convert_uint, VEC)(CAT(vload, VEC)(0, p + i)) << 16);
}
inline void CAT(CAT(store, VEC), _f32)(__global float *p, IDX i, floatV v) {
    CAT(vstore, VEC)(v, 0, p + i);
}
/* f32 -> bf16 bits, round to nearest even, NaN kept quiet (as bf16_from_f32). */
inline ushortV CAT(CAT(bits, VEC), _bf16)(floatV v) {
    uintV b = CAT(as_uint, VEC)(v);
    uintV rounded = (b + (uintV)0x7fffu + ((b >> 16) & (uintV)1u)) >> 16;
    uintV quiet_nan = (b >> 16) | (uintV)0x40u;
    return CAT(convert_ushort, VEC)(select(rounded, quiet_nan, isnan(v)));
}

/* f32 -> f16 bits, round to nearest even, without cl_khr_fp16, two ways (an op's tuning picks,
 * HALF_CVT):
 *   1  vstore_halfN into private memory: the device's own conversion in its default rounding
 *      mode, to nearest even on a full profile (the host takes 0 on an embedded one, which may
 *      round toward zero); clang's NVPTX: one cvt.rn.f16.f32 a value, no local memory (the
 *      explicit vstore_halfN_rte is about 80 instructions in libclc); on PoCL (AVX-512,
 *      vcvtps2ph) softmax_rows ran 1.2-1.4x slower than with 0
 *   0  rounding in integer lanes, about fifteen instructions a value; NaN becomes the quiet
 *      NaN 0x7e00 with its sign */
#ifndef HALF_CVT
#define HALF_CVT 0
#endif
inline ushortV CAT(CAT(bits, VEC), _f16)(floatV v) {
#if HALF_CVT
    ushortV half_bits;
    CAT(vstore_half, VEC)(v, 0, (__private half *)&half_bits);
    return half_bits;
#else
    uintV x = CAT(as_uint, VEC)(v);
    uintV sign = (x >> 16) & (uintV)0x8000u;
    uintV a = x & (uintV)0x7fffffffu;
    /* normal halves: rebias the exponent, round the 13 dropped bits (a carry may reach Inf) */
    uintV bits = (a + (uintV)0xfffu + ((a >> 13) & (uintV)1u) - (uintV)0x38000000u) >> 13;
    /* below 2^-14: adding 0.5 makes the f32 adder round at the half subnormal step, 2^-24 */
    uintV sub = CAT(as_uint, VEC)(CAT(as_float, VEC)(a) + (floatV)0.5f) - (uintV)0x3f000000u;
    bits = select(bits, sub, a < (uintV)0x38800000u);
    bits = select(bits, (uintV)0x7c00u, a >= (uintV)0x477ff000u);
    bits = select(bits, (uintV)0x7e00u, a > (uintV)0x7f800000u);
    return CAT(convert_ushort, VEC)(bits | sign);
#endif
}

/* vstore_halfN straight to global memory crashed PoCL 3.1 in the softmax kernel (an 8-wide
 * store of a constant vector): the bits go through bitsN_f16. */
inline void CAT(CAT(store, VEC), _f16)(__global half *p, IDX i, floatV v) {
    CAT(vstore, VEC)(CAT(CAT(bits, VEC), _f16)(v), 0, (__global ushort *)(p + i));
}

inline void CAT(CAT(store, VEC), _bf16)(__global ushort *p, IDX i, floatV v) {
    CAT(vstore, VEC)(CAT(CAT(bits, VEC), _bf16)(v), 0, p + i);
}

/* Aligned vector loads and stores: the same values as the ones above, for an element index i
 * that the host proved to be a multiple of VEC from a buffer base aligned to VEC elements (the
 * kernels build them with ALIGNED). vloadN promises the compiler only element alignment, so
 * NVIDIA's PTX compilers split it into VEC scalar loads (clang's NVPTX backend does); a vector
 * pointer carries the vector's alignment, so one instruction moves 8 or 16 bytes. 16-bit
 * values are loaded as integer vectors and converted in registers (vload_halfN from private
 * memory: the hardware's conversion, no cl_khr_fp16). */
inline floatV CAT(CAT(load_aligned, VEC), _f32)(__global const float *p, IDX i) {
    return *(__global const floatV *)(p + i);
}
inline floatV CAT(CAT(load_aligned, VEC), _f16)(__global const half *p, IDX i) {
    ushortV bits = *(__global const ushortV *)(p + i);
    return CAT(vload_half, VEC)(0, (__private const half *)&bits);
}
inline floatV CAT(CAT(load_aligned, VEC), _bf16)(__global const ushort *p, IDX i) {
    return CAT(as_float, VEC)(CAT(convert_uint, VEC)(*(__global const ushortV *)(p + i)) << 16);
}
inline void CAT(CAT(store_aligned, VEC), _f32)(__global float *p, IDX i, floatV v) {
    *(__global floatV *)(p + i) = v;
}
inline void CAT(CAT(store_aligned, VEC), _f16)(__global half *p, IDX i, floatV v) {
    *(__global ushortV *)(p + i) = CAT(CAT(bits, VEC), _f16)(v);
}
inline void CAT(CAT(store_aligned, VEC), _bf16)(__global ushort *p, IDX i, floatV v) {
    *(__global ushortV *)(p + i) = CAT(CAT(bits, VEC), _bf16)(v);
}

/* Horizontal reductions of a vector, by halves (VEC 2, 4, 8 or 16). */
inline float hsum(floatV v) {
#if VEC == 16
    float8 v8 = v.lo + v.hi;
#elif VEC == 8
    float8 v8 = v;
#endif
#if VEC >= 8
    float4 v4 = v8.lo + v8.hi;
#elif VEC == 4
    float4 v4 = v;
#endif
#if VEC >= 4
    float2 v2 = v4.lo + v4.hi;
#else
    float2 v2 = v;
#endif
    return v2.x + v2.y;
}

inline float hmax(floatV v) {
#if VEC == 16
    float8 v8 = fmax(v.lo, v.hi);
#elif VEC == 8
    float8 v8 = v;
#endif
#if VEC >= 8
    float4 v4 = fmax(v8.lo, v8.hi);
#elif VEC == 4
    float4 v4 = v;
#endif
#if VEC >= 4
    float2 v2 = fmax(v4.lo, v4.hi);
#else
    float2 v2 = v;
#endif
    return fmax(v2.x, v2.y);
}
#endif

#endif /* CLATTN_COMMON_CL */
