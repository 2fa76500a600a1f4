/*
 * The device's own ceilings, measured by clattn-bench in the same run as every op:
 *   copy_vec4  streams a buffer into another with 16-byte accesses (bytes read + written / time)
 *   fma_peak   eight independent FMA chains per work-item (2 flops per FMA)
 * Both are written the way PoCL (vectorizing across work-items) and GPUs (one lane per
 * work-item) both run at full speed: no barriers, consecutive work-items, consecutive addresses.
 */
__kernel void copy_vec4(__global const float4 *src, __global float4 *dst) {
    size_t i = get_global_id(0);
    dst[i] = src[i];
}

__kernel void fma_peak(__global float *out, float a, float b, int iterations) {
    float x0 = (float)get_global_id(0) * 1e-9f, x1 = x0 + 1e-3f, x2 = x0 + 2e-3f,
          x3 = x0 + 3e-3f, x4 = x0 + 4e-3f, x5 = x0 + 5e-3f, x6 = x0 + 6e-3f, x7 = x0 + 7e-3f;
    for (int i = 0; i < iterations; ++i) {
        x0 = fma(x0, a, b);
        x1 = fma(x1, a, b);
        x2 = fma(x2, a, b);
        x3 = fma(x3, a, b);
        x4 = fma(x4, a, b);
        x5 = fma(x5, a, b);
        x6 = fma(x6, a, b);
        x7 = fma(x7, a, b);
    }
    /* the store keeps every chain alive */
    out[get_global_id(0)] = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7;
}
