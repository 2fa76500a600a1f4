/* Host reference: storage conversions and the reference ops, written from the semantics in the
 * design (not from the kernels), in float64 where an op computes and in f32 where the library
 * promises f32 rounding (a copy with a bias add rounds once in f32). */
#ifndef CLATTN_TEST_REF_H
#define CLATTN_TEST_REF_H

#include "clattn.h"

#include <stdbool.h>
#include <stdint.h>

uint16_t ref_f32_to_f16(float f); /* round to nearest even */
float ref_f16_to_f32(uint16_t h);
uint16_t ref_f32_to_bf16(float f); /* round to nearest even, NaN kept quiet */
float ref_bf16_to_f32(uint16_t h);

/* Element `index` of a host array of `dtype` (f32/f16/bf16), as f32. */
float ref_load(const void *base, clattn_dtype dtype, uint64_t index);
/* Stores v, converted to `dtype`, at element `index`. */
void ref_store(void *base, clattn_dtype dtype, uint64_t index, float v);
/* True when the elements are the same bits, or (when `nan_equal`) both NaN. */
bool ref_same_element(const void *a, const void *b, clattn_dtype dtype, uint64_t index,
                      bool nan_equal);

/* clattn_copy on host images of the buffers: dst[i] = convert(src[i] (+ bias[i])) over dst's
 * shape, with each tensor's own offset and strides (bias may be NULL). */
void ref_copy(const void *src, const clattn_tensor *src_view, const void *bias,
              const clattn_tensor *bias_view, void *dst, const clattn_tensor *dst_view);

#endif
