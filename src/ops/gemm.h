/* The GEMMs of MHA's projections and the composed attention path: clattn's own micro-kernel
 * (cl/matmul.cl) on devices whose matmul row asks for it, CLBlast (ops/blas.c) elsewhere. Not
 * installed. */
#ifndef CLATTN_GEMM_H
#define CLATTN_GEMM_H

#include "blas.h"
#include "runtime/runtime.h"

/* For each of `batch` matrices, c = a b + beta c (b transposed when trans_b), as
 * clattn__sgemm_batched has it: enqueued after everything enqueued before it (the caller orders
 * out-of-order queues), no event. On matmul_mma's 3xTF32 products where the matmul row's UNIT_F32
 * asks and the device has NVIDIA's tf32 unit, else on the row's KERNEL. */
int clattn__gemm_batched(const clattn__call *call, bool trans_b, size_t m, size_t n, size_t k,
                         const clattn__matrices *a, const clattn__matrices *b, float beta,
                         const clattn__matrices *c, size_t batch);

/* Reads the device's matmul row (and gives CLBlast its gemm row where CLBlast runs the GEMMs)
 * and, where the row's UNIT_F32 asks, finds whether the device has the tf32 unit (its probe runs
 * at first use, on a queue of its own, and the host waits for it): a caller with GEMMs calls it
 * before its first enqueue, so that a bad override (CLATTN_ERR_INVALID_TUNING) fails before
 * anything is enqueued, and no probe holds the host between its steps. */
int clattn__gemm_prepare(const clattn__call *call);

/* A row of values added to every row of a product: column j's at buffer[offset + j * step], in
 * dtype (elements). */
typedef struct clattn__bias_row {
    cl_mem buffer;
    size_t offset, step;
    clattn_dtype dtype;
} clattn__bias_row;

/* For each of `batch` matrices, c = a op(b) + bias + beta c with a and b in `in` (f16 or bf16;
 * f32 on the tf32 unit's 3xTF32 products) and c in `out` (any float dtype), summed in f32 and
 * rounded once, on cl/matmul.cl's matmul_mma: the matrix-unit instruction where the device's
 * probe passed, else its emulation (the test hook). `bias` may be NULL. Offsets, leading dims and
 * strides in elements; ordered and without event as clattn__gemm_batched. The caller asked
 * clattn__gemm_units_available first. */
int clattn__gemm_units_batched(const clattn__call *call, clattn_dtype in, clattn_dtype out,
                               bool trans_b, size_t m, size_t n, size_t k,
                               const clattn__matrices *a, const clattn__matrices *b,
                               const clattn__bias_row *bias, float beta, const clattn__matrices *c,
                               size_t batch);

/* Whether clattn__gemm_units_batched runs products of `in` on this call's device, of up to m x n
 * outputs, k deep, `batch` matrices: the matmul row's UNITS (UNIT_F32 for f32), a unit for `in`
 * found by clattn_matrix_units (which probes on first use), a group of 4 of its subgroups and the
 * tiles' local memory, and sizes the kernel numbers with int. */
int clattn__gemm_units_available(const clattn__call *call, clattn_dtype in, size_t m, size_t n,
                                 size_t k, size_t batch, bool *takes);

#endif
