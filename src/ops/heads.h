/* The strided copy under every reshape, as other ops run it: MHA and the composed attention
 * path make f32 images of their operands with it. Not installed. */
#ifndef CLATTN_OPS_HEADS_H
#define CLATTN_OPS_HEADS_H

#include "runtime/runtime.h"

/* Enqueues dst = src (+ bias), converting storage dtypes, for views the caller built and
 * checked (same shape, dst apart from src and bias): no checks. Its launch is the copy row of
 * the tuning table for src's dtype; only a bad copy override (CLATTN_ERR_INVALID_TUNING) or a
 * driver failure fails it. */
int clattn__copy_enqueue(const clattn_tensor *src, const clattn_tensor *bias,
                         const clattn_tensor *dst, const clattn__call *call);

#endif
