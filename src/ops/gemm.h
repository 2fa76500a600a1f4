/* The GEMMs of MHA's projections and the composed attention path: clattn's own micro-kernel
 * (cl/matmul.cl) on devices whose matmul row asks for it, CLBlast (ops/blas.c) elsewhere. Not
 * installed. */
#ifndef CLATTN_GEMM_H
#define CLATTN_GEMM_H

#include "blas.h"
#include "runtime/runtime.h"

/* For each of `batch` matrices, c = a b + beta c (b transposed when trans_b), as
 * clattn__sgemm_batched has it: enqueued after everything enqueued before it (the caller orders
 * out-of-order queues), no event. */
int clattn__gemm_batched(const clattn__call *call, bool trans_b, size_t m, size_t n, size_t k,
                         const clattn__matrices *a, const clattn__matrices *b, float beta,
                         const clattn__matrices *c, size_t batch);

/* Reads the device's matmul row (and gives CLBlast its gemm row where CLBlast runs the GEMMs):
 * a caller with several GEMMs calls it before its first enqueue, so that a bad override
 * (CLATTN_ERR_INVALID_TUNING) fails before anything is enqueued. */
int clattn__gemm_prepare(cl_device_id device);

#endif
