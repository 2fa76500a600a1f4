/* The row-wise softmax (cl/softmax.cl) and its backward as other ops run them: the composed
 * attention path normalizes its scores with it, and its backward differentiates them. Not
 * installed. */
#ifndef CLATTN_OPS_SOFTMAX_H
#define CLATTN_OPS_SOFTMAX_H

#include "mask.h"

/* One clattn_softmax call. */
typedef struct clattn__softmax_args {
    const clattn_tensor *x, *y, *lse;
    float scale;
    clattn__mask_plan mask;
} clattn__softmax_args;

/* Every check clattn_softmax makes on its arguments; fills a->mask from `mask`. */
int clattn__softmax_check(clattn__softmax_args *a, const clattn_mask *mask, cl_context context);
/* The launch for rows of `dtype` storage on `device`: the tuning table's row, SCRATCH dropped
 * where the device's local memory cannot hold it. Fails only on a bad override
 * (CLATTN_ERR_INVALID_TUNING). */
int clattn__softmax_plan(cl_device_id device, clattn_dtype dtype, clattn__softmax_tuning *plan);
/* Enqueues a checked softmax with its plan; checks nothing. */
int clattn__softmax_enqueue(const clattn__softmax_args *a, const clattn__softmax_tuning *plan,
                            const clattn__call *call);

/* Enqueues clattn_softmax_backward (dz = scale * y * (dy - sum(dy * y))) on checked views; checks
 * nothing. */
int clattn__softmax_backward_enqueue(const clattn_tensor *y, const clattn_tensor *dy, float scale,
                                     const clattn_tensor *dz, const clattn__call *call);

#endif
