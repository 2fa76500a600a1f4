/*
 * The device's own ceilings, measured by clattn-bench in the same run as every op:
 *   copy_vec4  streams a buffer into another with 16-byte accesses (bytes read + written / time)
 *   fma_peak   eight independent FMA chains of WIDTH lanes per work-item (2 flops per FMA)
 *   nop        one work-item that does nothing: the launch latency (enqueue to finish)
 * Both are written the way PoCL (vectorizing across work-items) and GPUs (one lane per
 * work-item) both run at full speed: no barriers, consecutive work-items, consecutive addresses.
 */
__kernel void nop(__global float *out) {
    (void)out;
}

__kernel void copy_vec4(__global const float4 *src, __global float4 *dst) {
    size_t i = get_global_id(0);
    dst[i] = src[i];
}

/* WIDTH: the device's preferred float vector width (CL_DEVICE_PREFERRED_VECTOR_WIDTH_FLOAT), set
 * by the host. A CPU compiler cannot vectorize across work-items around this kernel's inner loop,
 * so on PoCL the vector type is what reaches the SIMD units; a GPU prefers 1. */
#ifndef WIDTH
#define WIDTH 1
#endif
#if WIDTH == 1
#define floatW float
#else
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define floatW CAT(float, WIDTH)
#endif

__kernel void fma_peak(__global float *out, float a, float b, int iterations) {
    floatW x0 = (floatW)((float)get_global_id(0) * 1e-9f), x1 = x0 + 1e-3f, x2 = x0 + 2e-3f,
           x3 = x0 + 3e-3f, x4 = x0 + 4e-3f, x5 = x0 + 5e-3f, x6 = x0 + 6e-3f, x7 = x0 + 7e-3f;
    const floatW va = (floatW)a, vb = (floatW)b;
    for (int i = 0; i < iterations; ++i) {
        x0 = fma(x0, va, vb);
        x1 = fma(x1, va, vb);
        x2 = fma(x2, va, vb);
        x3 = fma(x3, va, vb);
        x4 = fma(x4, va, vb);
        x5 = fma(x5, va, vb);
        x6 = fma(x6, va, vb);
        x7 = fma(x7, va, vb);
    }
    /* the store keeps every chain alive */
    floatW sum = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7;
#if WIDTH == 1
    out[get_global_id(0)] = sum;
#else
    CAT(vstore, WIDTH)(sum, get_global_id(0), out);
#endif
}

#if MMA_PEAK
/* mma_peak (built after cl/common.cl and cl/mma.cl, with MMA_PTX 1, only where
 * clattn_matrix_units found the f16 unit): eight independent chains of f16 products a warp,
 * 2 * 16 * 8 * 16 = 4096 flops each. The instruction is volatile assembly, so no compiler drops
 * or merges a product; the store keeps every chain alive. */
__kernel __attribute__((reqd_work_group_size(128, 1, 1))) void mma_peak(__global float *out,
                                                                       int iterations) {
    __local float scratch[4 * MMA_SCRATCH_FLOATS];
    const uint lane = get_local_id(0) % 32;
    const uint a[4] = {0x3c003c00u ^ lane, 0x3c003c00u, 0x3c003c00u, 0x3c003c00u};
    const uint b[2] = {0x14001400u, 0x14001400u}; /* 1/1024: the sums stay finite */
    float d[8][4];
    UNROLL for (int c = 0; c < 8; ++c)
        UNROLL for (int f = 0; f < 4; ++f) d[c][f] = 0.0f;
    for (int i = 0; i < iterations; ++i)
        UNROLL for (int c = 0; c < 8; ++c) mma_m16n8k16(d[c], a, b, d[c], scratch);
    float sum = 0.0f;
    UNROLL for (int c = 0; c < 8; ++c)
        UNROLL for (int f = 0; f < 4; ++f) sum += d[c][f];
    out[get_global_id(0)] = sum;
}
#endif
