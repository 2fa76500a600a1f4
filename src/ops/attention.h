/* What src/ops/attention.c (validation, the fused kernels) shares with src/ops/attention_composed.c
 * (the CLBlast path). Not installed. */
#ifndef CLATTN_ATTENTION_H
#define CLATTN_ATTENTION_H

#include "mask.h"
#include "runtime/launch.h"

/* One validated clattn_attention_ex call. */
typedef struct clattn__attention_args {
    const clattn_tensor *q, *k, *v, *out, *lse, *weights;
    const clattn_mask *mask_desc; /* the caller's, for clattn_softmax */
    float scale;                  /* resolved: never 0 */
    clattn__mask_plan mask;
} clattn__attention_args;

/* The scratch bytes the composed path needs for `a` (0: none). */
size_t clattn__attention_composed_workspace(const clattn__attention_args *a);

/* Enqueues the composed path: CLBlast GEMMs around clattn_softmax. `workspace` holds at least
 * clattn__attention_composed_workspace(a) bytes (NULL when that is 0). */
int clattn__attention_composed(const clattn__attention_args *a, const clattn__call *call,
                               cl_mem workspace);

/* The scratch bytes clattn_attention_ex needs for these views on `device` with the automatic
 * path (composed when `weights` is given, else fused), from the views' shapes, strides and
 * dtypes alone: no validation, and the buffers may be NULL. For a caller that places the
 * views in scratch of its own before it can make them (src/ops/mha.c). */
int clattn__attention_scratch_bytes(const clattn_tensor *q, const clattn_tensor *k,
                                    const clattn_tensor *v, const clattn_tensor *out,
                                    const clattn_tensor *weights, cl_device_id device,
                                    size_t *bytes);

#endif
