/* The CLBlast bridge: the library's only caller of CLBlast, so that statuses, events and
 * layouts are translated in one place. Not installed. */
#ifndef CLATTN_BLAS_H
#define CLATTN_BLAS_H

#include "runtime/launch.h"

/* A batch of row-major f32 matrices in one buffer: matrix i starts at element
 * offset + i * stride, and rows are ld elements apart. */
typedef struct clattn__matrices {
    cl_mem buffer;
    size_t offset, ld, stride;
} clattn__matrices;

/* For each of `batch` matrices, c = a b + beta c (b transposed when trans_b): a is m x k, b is
 * k x n (n x k stored when trans_b), c is m x n. Enqueues on call->queue after everything enqueued
 * before it (the caller orders out-of-order queues); sets no event. An OpenCL error passes
 * through; CLBlast's own codes become CLATTN_ERR_BLAS with the code in the detail. */
int clattn__sgemm_batched(const clattn__call *call, bool trans_b, size_t m, size_t n, size_t k,
                          const clattn__matrices *a, const clattn__matrices *b, float beta,
                          const clattn__matrices *c, size_t batch);

/* Gives CLBlast the device's gemm row (Xgemm parameters from the tuning table and overrides)
 * if it has one and CLBlast has other parameters; without one CLBlast keeps its own database.
 * clattn__sgemm_batched does this itself; a caller with several enqueues calls it first, so a
 * bad gemm override (CLATTN_ERR_INVALID_TUNING) fails before anything is enqueued. */
int clattn__blas_prepare(cl_device_id device);

/* Whether clattn has given CLBlast parameters for `device` in this process: from then on
 * CLBlast's own database is out of reach (clattn-bench measures it before). */
bool clattn__blas_overridden(cl_device_id device);

/* Clears CLBlast's program cache (clattn_cache_clear(NULL)). */
void clattn__blas_cache_clear(void);

#endif
