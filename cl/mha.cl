/*
 * Multi-head attention's own two small steps (src/ops/mha.c); the rest of its work is CLBlast's
 * GEMMs, clattn_copy and the attention kernels.
 *
 * Build options (every one has a default, so this file compiles alone):
 *   OUT_T   storage dtype token of the averaged weights (f32 | f16 | bf16)
 *   IDX     uint or ulong (see common.cl)
 *
 * Both kernels run one work-item per output element over a 1-D grid, with no barriers, so a
 * CPU's work-group loop streams them and a GPU coalesces them alike.
 */
#ifndef CLATTN_COMMON_CL
#include "common.cl"
#endif

#ifndef OUT_T
#define OUT_T f32
#endif

/* The averaged attention weights: out[b,i,j] = (sum_h w[b,h,i,j]) / heads, over dense f32
 * w [B,heads,Sq,Sk] and out {1,B,Sq,Sk} with strides os1, os2, os3. The division comes after
 * the sum, as torch's mean does it. */
__kernel void mha_head_mean(__global const float *w, IDX w_off, int heads, IDX sq, IDX sk,
                            __global CAT(storage_, OUT_T) * out, IDX out_off, IDX os1, IDX os2,
                            IDX os3, IDX total) {
    const IDX e = (IDX)get_global_id(0);
    if (e >= total) return;
    const IDX j = e % sk, bi = e / sk;
    const IDX i = bi % sq, b = bi / sq;
    const IDX plane = sq * sk;
    IDX at = w_off + b * (IDX)heads * plane + i * sk + j;
    float sum = 0.0f;
    for (int h = 0; h < heads; ++h, at += plane) sum += w[at];
    CAT(store_, OUT_T)(out, out_off + b * os1 + i * os2 + j * os3, sum / (float)heads);
}

/* A u8 key padding mask as an additive one: bias[b,j] = keep[b,j] ? 0 : -inf over dense f32
 * bias [B,Sk] (keep {1,1,B,Sk} with strides ks2, ks3), so that it can join a u8 attention mask
 * in one mask description (src/ops/mha.c). */
__kernel void mha_keep_to_bias(__global const uchar *keep, IDX keep_off, IDX ks2, IDX ks3,
                               IDX sk, __global float *bias, IDX bias_off, IDX total) {
    const IDX e = (IDX)get_global_id(0);
    if (e >= total) return;
    const IDX j = e % sk, b = e / sk;
    bias[bias_off + e] = keep[keep_off + b * ks2 + j * ks3] ? 0.0f : -INFINITY;
}
