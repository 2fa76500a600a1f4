/*
 * Tensor parameters and head-dim rows as vectors, shared by the ops that walk [B,H,S,D] rows
 * (cl/attention.cl, cl/linear_attention.cl). The host prepends this file after common.cl and
 * mask.cl (that defines CLATTN_ROWS_CL); an op file compiled alone includes it after its VEC
 * default, since the row macros depend on VEC (the head-dim lanes: 1, 4, 8 or 16).
 */
#ifndef CLATTN_ROWS_CL
#define CLATTN_ROWS_CL

#ifndef CLATTN_COMMON_CL
#include "common.cl"
#endif
#ifndef VEC
#define VEC 1
#endif
/* Storage dtypes of q, k, v and out, and the head dims, as the host passes them. */
#ifndef Q_T
#define Q_T f32
#endif
#ifndef K_T
#define K_T f32
#endif
#ifndef V_T
#define V_T f32
#endif
#ifndef O_T
#define O_T f32
#endif
/* The backward ops' dO and gradients. */
#ifndef DO_T
#define DO_T f32
#endif
#ifndef DQ_T
#define DQ_T f32
#endif
#ifndef DK_T
#define DK_T f32
#endif
#ifndef DV_T
#define DV_T f32
#endif
#ifndef HEAD_DIM
#define HEAD_DIM 64
#endif
#ifndef VALUE_DIM
#define VALUE_DIM HEAD_DIM
#endif

#define TENSOR_PARAMS(T, name)                                                                     \
    __global const CAT(storage_, T) * name, IDX name##_off, IDX name##_s0, IDX name##_s1,          \
        IDX name##_s2, IDX name##_s3

/* An output tensor's parameters (as TENSOR_PARAMS, writable). */
#define OUT_PARAMS(T, name)                                                                        \
    __global CAT(storage_, T) * name, IDX name##_off, IDX name##_s0, IDX name##_s1, IDX name##_s2, \
        IDX name##_s3

/* The element at [b, h, i, d] of a tensor passed with TENSOR_PARAMS. */
#define AT(name, b, h, i, d)                                                                       \
    (name##_off + (IDX)(b)*name##_s0 + (IDX)(h)*name##_s1 + (IDX)(i)*name##_s2 + (IDX)(d)*name##_s3)

/* A row of n (a multiple of VEC) elements from `at` with element stride `stride`, as vectors.
 * The loops are unrolled (a Clang pragma, ignored where unknown): PoCL's LLVM otherwise left
 * them as loops over stack arrays, at a third of the speed in linear attention. */
#if VEC > 1
#define LOAD_ROW(T, p, at, stride, n, out)                                                         \
    do {                                                                                           \
        if ((stride) == 1) {                                                                       \
            _Pragma("unroll") for (int c = 0; c < (n) / VEC; ++c) out[c] =                         \
                CAT(CAT(load, VEC), CAT(_, T))(p, (at) + (IDX)(c * VEC));                          \
        } else {                                                                                   \
            for (int c = 0; c < (n) / VEC; ++c) {                                                  \
                float lanes_[VEC];                                                                 \
                for (int e = 0; e < VEC; ++e)                                                      \
                    lanes_[e] = CAT(load_, T)(p, (at) + (IDX)(c * VEC + e) * (stride));            \
                out[c] = CAT(vload, VEC)(0, lanes_);                                               \
            }                                                                                      \
        }                                                                                          \
    } while (0)
#define LANES(n) ((n) / VEC)
typedef floatV lane_t;

/* VEC elements from `at` with element stride `stride`, as a vector: one vector access for
 * stride 1, an aligned one (common.cl) when the kernel was built with ALIGNED (the host proved
 * every row the kernel loads this way starts VEC-aligned, stride 1), else a gather. */
#ifndef ALIGNED
#define ALIGNED 0
#endif
#define DEFINE_LOAD_LANES(T)                                                                           inline floatV CAT(load_lanes_, T)(__global const CAT(storage_, T) * p, IDX at, IDX stride) {           if (ALIGNED) return CAT(CAT(load_aligned, VEC), CAT(_, T))(p, at);                                 if (stride == 1) return CAT(CAT(load, VEC), CAT(_, T))(p, at);                                     float lanes[VEC];                                                                                  for (int e = 0; e < VEC; ++e) lanes[e] = CAT(load_, T)(p, at + (IDX)e * stride);                   return CAT(vload, VEC)(0, lanes);                                                              }
DEFINE_LOAD_LANES(f32)
DEFINE_LOAD_LANES(f16)
DEFINE_LOAD_LANES(bf16)
#define LOAD_LANES(T, p, at, stride) CAT(load_lanes_, T)(p, at, stride)
#define DOT_FINISH(v) hsum(v)
#else
#define LOAD_ROW(T, p, at, stride, n, out)                                                         \
    _Pragma("unroll") for (int c = 0; c < (n); ++c) out[c] =                                       \
        CAT(load_, T)(p, (at) + (IDX)c * (stride))
#define LANES(n)      (n)
typedef float lane_t;
#define LOAD_LANES(T, p, at, stride) CAT(load_, T)(p, at)
#define DOT_FINISH(v) (v)
#endif

/* Stores lane vector c of output row i: element-wise, any strides and alignment. Expects the
 * output as parameters o, o_off, o_s0..o_s3 (dtype O_T) and b, h in scope. */
#if VEC > 1
#define STORE_LANES(i, c, value)                                                                   \
    for (int e = 0; e < VEC; ++e)                                                                  \
        CAT(store_, O_T)(o, AT(o, b, h, i, (c)*VEC + e), ((float *)&(value))[e]);
#else
#define STORE_LANES(i, c, value) CAT(store_, O_T)(o, AT(o, b, h, i, c), value);
#endif

#endif /* CLATTN_ROWS_CL */
